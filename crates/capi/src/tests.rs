use std::ffi::CStr;
use std::ptr::{null, null_mut};

use super::*;

fn last_error() -> String {
    // SAFETY: `dw_last_error` returns a valid NUL-terminated string until the next call.
    unsafe { CStr::from_ptr(dw_last_error()) }
        .to_str()
        .unwrap()
        .to_owned()
}

const KEY: &CStr = c"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn open_env(dir: &tempfile::TempDir) -> *mut dw_env {
    let path = CString::new(dir.path().to_str().unwrap()).unwrap();
    let mut env = null_mut();
    assert_eq!(
        dw_env_open(path.as_ptr(), 0, &mut env),
        DW_OK,
        "{}",
        last_error()
    );
    assert!(!env.is_null());
    env
}

#[test]
fn null_arguments_are_refused_with_their_name() {
    let mut env = null_mut();
    assert_eq!(dw_env_open(null(), 0, &mut env), DW_ERR_NULL);
    assert_eq!(last_error(), "dir is null");
    assert!(env.is_null());

    let addr = c"127.0.0.1:0";
    let mut listener = null_mut();
    assert_eq!(
        dw_listen(addr.as_ptr(), null_mut(), KEY.as_ptr(), &mut listener),
        DW_ERR_NULL
    );
    assert_eq!(last_error(), "env is null");

    let mut stream = null_mut();
    assert_eq!(dw_accept(null_mut(), &mut stream), DW_ERR_NULL);
    assert_eq!(last_error(), "listener is null");
    assert_eq!(dw_send(null_mut(), null(), 0), DW_ERR_NULL);
    assert_eq!(last_error(), "stream is null");
    let (mut data, mut len) = (null_mut(), 0);
    assert_eq!(dw_recv(null_mut(), &mut data, &mut len), DW_ERR_NULL);
    assert_eq!(dw_close(null_mut()), DW_ERR_NULL);
    assert_eq!(dw_stream_stats(null_mut(), null_mut()), DW_ERR_NULL);
    let mut buf = [0 as c_char; 8];
    assert_eq!(
        dw_listener_local_addr(null_mut(), buf.as_mut_ptr(), buf.len()),
        DW_ERR_NULL
    );
    dw_env_free(null_mut());
    dw_listener_free(null_mut());
    dw_buf_free(null_mut(), 0);
}

#[test]
fn invalid_utf8_is_refused() {
    let bad = [0xffu8, 0xfe, b':', b'1', 0];
    let mut env = null_mut();
    assert_eq!(dw_env_open(bad.as_ptr().cast(), 0, &mut env), DW_ERR_UTF8);
    assert!(
        last_error().starts_with("dir is not UTF-8"),
        "{}",
        last_error()
    );
}

#[test]
fn bad_addresses_and_small_buffers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let env = open_env(&dir);
    let mut listener = null_mut();
    assert_eq!(
        dw_listen(c"no port here".as_ptr(), env, KEY.as_ptr(), &mut listener),
        DW_ERR_ADDRESS
    );
    assert!(
        last_error().starts_with("address \"no port here\""),
        "{}",
        last_error()
    );
    let mut stream = null_mut();
    assert_eq!(
        dw_connect(c"127.0.0.1:99999".as_ptr(), env, KEY.as_ptr(), &mut stream),
        DW_ERR_ADDRESS
    );
    assert!(stream.is_null());

    assert_eq!(
        dw_listen(c"127.0.0.1:0".as_ptr(), env, KEY.as_ptr(), &mut listener),
        DW_OK
    );
    let mut small = [0 as c_char; 4];
    assert_eq!(
        dw_listener_local_addr(listener, small.as_mut_ptr(), small.len()),
        DW_ERR_BUFFER
    );
    assert!(
        last_error().contains("the buffer has 4"),
        "{}",
        last_error()
    );
    let mut buf = [0 as c_char; 64];
    assert_eq!(
        dw_listener_local_addr(listener, buf.as_mut_ptr(), buf.len()),
        DW_OK
    );
    // SAFETY: the call wrote a NUL-terminated string into `buf`.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert!(text.starts_with("127.0.0.1:"), "{text}");
    dw_listener_free(listener);
    dw_env_free(env);
}

#[test]
fn an_environment_opened_twice_is_a_store_error() {
    let dir = tempfile::tempdir().unwrap();
    let env = open_env(&dir);
    let path = CString::new(dir.path().to_str().unwrap()).unwrap();
    let mut again = null_mut();
    assert_eq!(dw_env_open(path.as_ptr(), 0, &mut again), DW_ERR_STORE);
    assert!(last_error().starts_with("environment "), "{}", last_error());
    dw_env_free(env);
}

#[test]
fn messages_round_trip_and_the_second_is_deduplicated() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (server_env, client_env) = (open_env(&a), open_env(&b));
    let mut listener = null_mut();
    assert_eq!(
        dw_listen(
            c"127.0.0.1:0".as_ptr(),
            server_env,
            KEY.as_ptr(),
            &mut listener
        ),
        DW_OK
    );
    let mut buf = [0 as c_char; 64];
    assert_eq!(
        dw_listener_local_addr(listener, buf.as_mut_ptr(), buf.len()),
        DW_OK
    );
    // SAFETY: the call wrote a NUL-terminated string into `buf`.
    let addr = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_owned();
    let listener_addr = listener as usize;
    let server = std::thread::spawn(move || {
        let mut s = null_mut();
        assert_eq!(dw_accept(listener_addr as *mut dw_listener, &mut s), DW_OK);
        let mut got = Vec::new();
        for _ in 0..2 {
            let (mut data, mut len) = (null_mut(), 0usize);
            assert_eq!(dw_recv(s, &mut data, &mut len), DW_OK, "{}", last_error());
            // SAFETY: `dw_recv` returned `len` bytes at `data`.
            got.push(unsafe { std::slice::from_raw_parts(data, len) }.to_vec());
            dw_buf_free(data, len);
        }
        let (mut data, mut len) = (null_mut(), 7usize);
        assert_eq!(dw_recv(s, &mut data, &mut len), DW_OK);
        assert!(data.is_null());
        assert_eq!(len, 0);
        let mut stats = dw_stats::default();
        assert_eq!(dw_stream_stats(s, &mut stats), DW_OK);
        assert_eq!(stats.messages_received, 3);
        assert_eq!(dw_close(s), DW_OK);
        got
    });
    let msg: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut c = null_mut();
    assert_eq!(
        dw_connect_mode(
            addr.as_ptr(),
            client_env,
            KEY.as_ptr(),
            DW_MODE_DEDUP,
            &mut c
        ),
        DW_OK,
        "{}",
        last_error()
    );
    dw_env_free(client_env);
    assert_eq!(
        dw_send(c, msg.as_ptr(), msg.len()),
        DW_OK,
        "{}",
        last_error()
    );
    assert_eq!(dw_send(c, msg.as_ptr(), msg.len()), DW_OK);
    assert_eq!(dw_send(c, null(), 0), DW_OK);
    let mut stats = dw_stats::default();
    assert_eq!(dw_stream_stats(c, &mut stats), DW_OK);
    assert_eq!(stats.messages_sent, 3);
    assert_eq!(stats.message_bytes_sent, 2 * msg.len() as u64);
    assert_eq!(stats.bytes_hit, msg.len() as u64, "{stats:?}");
    assert!(
        stats.socket_bytes_sent < msg.len() as u64 * 11 / 10,
        "{stats:?}"
    );
    assert_eq!(dw_close(c), DW_OK);
    assert_eq!(server.join().unwrap(), vec![msg.clone(), msg]);
    dw_listener_free(listener);
    dw_env_free(server_env);
}

#[test]
fn keys_are_checked_before_anything_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let env = open_env(&dir);
    let mut listener = null_mut();
    let addr = c"127.0.0.1:0".as_ptr();
    assert_eq!(dw_listen(addr, env, null(), &mut listener), DW_ERR_NULL);
    assert!(
        last_error().starts_with("key is null") && last_error().contains("dw_listen_plaintext"),
        "{}",
        last_error()
    );
    let mut stream = null_mut();
    assert_eq!(dw_connect(addr, env, null(), &mut stream), DW_ERR_NULL);
    assert!(
        last_error().contains("dw_connect_plaintext"),
        "{}",
        last_error()
    );
    assert_eq!(
        dw_listen(addr, env, c"short".as_ptr(), &mut listener),
        DW_ERR_KEY
    );
    assert!(
        last_error().contains("passphrase of 5 characters"),
        "{}",
        last_error()
    );
    assert!(listener.is_null());
    let key = c"a passphrase long enough".as_ptr();
    assert_eq!(
        dw_connect_mode(addr, env, key, 9, &mut stream),
        DW_ERR_CONFIG
    );
    assert!(stream.is_null());
    dw_env_free(env);
}

/// A round trip between a listener and a client each with its key, `None` for plaintext: the
/// client's status and the server's.
fn keyed_exchange(
    server_key: Option<&'static CStr>,
    client_key: Option<&'static CStr>,
) -> (c_int, c_int) {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (server_env, client_env) = (open_env(&a), open_env(&b));
    let mut listener = null_mut();
    let at = c"127.0.0.1:0".as_ptr();
    let status = match server_key {
        Some(key) => dw_listen(at, server_env, key.as_ptr(), &mut listener),
        None => dw_listen_plaintext(at, server_env, &mut listener),
    };
    assert_eq!(status, DW_OK);
    dw_env_free(server_env);
    let mut buf = [0 as c_char; 64];
    assert_eq!(
        dw_listener_local_addr(listener, buf.as_mut_ptr(), buf.len()),
        DW_OK
    );
    // SAFETY: the call wrote a NUL-terminated string into `buf`.
    let addr = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_owned();
    let listener_addr = listener as usize;
    let server = std::thread::spawn(move || {
        let mut s = null_mut();
        let status = dw_accept(listener_addr as *mut dw_listener, &mut s);
        if status != DW_OK {
            return status;
        }
        let (mut data, mut len) = (null_mut(), 0usize);
        assert_eq!(dw_recv(s, &mut data, &mut len), DW_OK, "{}", last_error());
        assert_eq!(dw_send(s, data, len), DW_OK);
        dw_buf_free(data, len);
        dw_close(s)
    });
    let mut c = null_mut();
    let status = match client_key {
        Some(key) => dw_connect(addr.as_ptr(), client_env, key.as_ptr(), &mut c),
        None => dw_connect_plaintext(addr.as_ptr(), client_env, DW_MODE_ADAPTIVE, &mut c),
    };
    let client_error = last_error();
    dw_env_free(client_env);
    if status == DW_OK {
        assert_eq!(dw_send(c, b"secret".as_ptr(), 6), DW_OK);
        let (mut data, mut len) = (null_mut(), 0usize);
        assert_eq!(dw_recv(c, &mut data, &mut len), DW_OK);
        // SAFETY: `dw_recv` returned `len` bytes at `data`.
        assert_eq!(unsafe { std::slice::from_raw_parts(data, len) }, b"secret");
        dw_buf_free(data, len);
        assert_eq!(dw_close(c), DW_OK);
    }
    let served = server.join().unwrap();
    dw_listener_free(listener);
    if status != DW_OK {
        assert!(!client_error.is_empty());
    }
    (status, served)
}

#[test]
fn keyed_channels_round_trip_and_refuse_another_key() {
    assert_eq!(keyed_exchange(Some(KEY), Some(KEY)), (DW_OK, DW_OK));
    let (client, server) = keyed_exchange(Some(KEY), Some(c"another passphrase entirely"));
    assert_eq!(
        (client, server),
        (DW_ERR_AUTH, DW_ERR_AUTH),
        "{}",
        last_error()
    );
}

#[test]
fn plaintext_takes_both_ends_saying_so() {
    assert_eq!(keyed_exchange(None, None), (DW_OK, DW_OK));
    // A plaintext client of a keyed listener is told so by it; the listener refuses it.
    assert_eq!(
        keyed_exchange(Some(KEY), None),
        (DW_ERR_REMOTE, DW_ERR_PROTOCOL)
    );
    assert_eq!(
        keyed_exchange(None, Some(KEY)),
        (DW_ERR_PROTOCOL, DW_ERR_PROTOCOL)
    );
}
