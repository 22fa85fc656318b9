//! A C ABI for dedupwire's dedup channel: opaque handles, stable status codes and a
//! thread-local error message, declared in the generated header `include/dedupwire.h`.
//!
//! Every function returns a status (`DW_OK` or a `DW_ERR_*` code, numbers that never change)
//! and, when it fails, leaves a message for [`dw_last_error`]. Nothing unwinds across the
//! boundary: a panic inside becomes `DW_ERR_PANIC`. Null pointers and addresses that are not
//! UTF-8 are refused with a status, never dereferenced.
//!
//! Channels use the default configuration (`ChannelConfig::default()`), the mode excepted,
//! which the connecting end may choose (`dw_connect_mode`). They are encrypted and
//! authenticated with a key both ends share (`dw_listen`, `dw_connect`: Noise over TCP, as
//! `Security::Key`); plaintext TCP takes the explicitly named `dw_listen_plaintext` and
//! `dw_connect_plaintext` on both ends.
//!
//! The header is written by `build.rs` with cbindgen into the build directory; the committed
//! copy is checked against it by a test, and refreshed with
//! `DEDUPWIRE_BLESS=1 cargo build -p dedupwire-capi`.
#![deny(missing_docs)]
#![allow(non_camel_case_types)]
#![allow(
    clippy::not_unsafe_ptr_arg_deref,
    reason = "C callers cannot see `unsafe`; each function checks for null and states its \
              pointer contract in the header, and Rust callers use the wire crate instead"
)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::net::{SocketAddr, ToSocketAddrs};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use dedupwire_wire::{
    ChannelConfig, DedupListener, DedupStream, EnvConfig, Environment, Key, Mode, Security,
    Transport,
};

/// The call succeeded.
pub const DW_OK: c_int = 0;
/// A pointer argument that must not be null was null.
pub const DW_ERR_NULL: c_int = 1;
/// A string argument was not valid UTF-8.
pub const DW_ERR_UTF8: c_int = 2;
/// An address could not be parsed or resolved.
pub const DW_ERR_ADDRESS: c_int = 3;
/// The operating system refused an operation (socket, file, timeout).
pub const DW_ERR_IO: c_int = 4;
/// The peer closed the connection.
pub const DW_ERR_CLOSED: c_int = 5;
/// The peer sent something malformed, oversized or that failed a check.
pub const DW_ERR_PROTOCOL: c_int = 6;
/// The peer reported an error of its own.
pub const DW_ERR_REMOTE: c_int = 7;
/// A configuration was invalid or refused by the peer.
pub const DW_ERR_CONFIG: c_int = 8;
/// The environment (chunk store) failed or refused an operation.
pub const DW_ERR_STORE: c_int = 9;
/// A caller's buffer was too small.
pub const DW_ERR_BUFFER: c_int = 10;
/// Authentication with the peer failed.
pub const DW_ERR_AUTH: c_int = 11;
/// A bug: the library panicked (the handle involved should be freed, not used again).
pub const DW_ERR_PANIC: c_int = 12;
/// A key string was empty, too short for a passphrase, or otherwise unusable.
pub const DW_ERR_KEY: c_int = 13;

/// Channel mode: measure dedup and plain on the connection and use the faster (the default).
pub const DW_MODE_ADAPTIVE: c_int = 0;
/// Channel mode: always deduplicate (fewest bytes on the link).
pub const DW_MODE_DEDUP: c_int = 1;
/// Channel mode: never deduplicate, send compressed bytes only.
pub const DW_MODE_PLAIN: c_int = 2;

/// A persistent chunk store in a directory, shared by the listeners and streams made with it.
pub struct dw_env {
    env: Arc<Environment>,
}

/// A TCP listener accepting dedup channels.
pub struct dw_listener {
    listener: DedupListener,
}

/// One dedup channel: a connection that sends messages and receives them.
pub struct dw_stream {
    stream: DedupStream<Transport>,
}

/// What a stream has moved so far, both directions.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dw_stats {
    /// Messages sent.
    pub messages_sent: u64,
    /// Messages received.
    pub messages_received: u64,
    /// Bytes of the messages sent.
    pub message_bytes_sent: u64,
    /// Bytes of the messages received.
    pub message_bytes_received: u64,
    /// Bytes written to the socket, frames and handshake included.
    pub socket_bytes_sent: u64,
    /// Bytes read from the socket, frames and handshake included.
    pub socket_bytes_received: u64,
    /// Chunks sent as a reference only: the receiver held them.
    pub chunks_hit: u64,
    /// Message bytes those chunks stand for.
    pub bytes_hit: u64,
    /// Chunks sent as a delta against a similar chunk the receiver held.
    pub chunks_delta: u64,
    /// Message bytes those chunks stand for.
    pub bytes_delta: u64,
    /// Chunks sent whole (compressed).
    pub chunks_literal: u64,
    /// Message bytes those chunks stand for.
    pub bytes_literal: u64,
    /// Segments sent plain (compressed, no dedup).
    pub segments_plain: u64,
    /// Message bytes sent in plain segments.
    pub bytes_plain: u64,
    /// Segments sent with dedup.
    pub segments_dedup: u64,
    /// Request/have exchanges (one per segment and level).
    pub round_trips: u64,
}

impl From<&dedupwire_wire::ChannelStats> for dw_stats {
    fn from(s: &dedupwire_wire::ChannelStats) -> dw_stats {
        dw_stats {
            messages_sent: s.messages_sent,
            messages_received: s.messages_received,
            message_bytes_sent: s.message_bytes_sent,
            message_bytes_received: s.message_bytes_received,
            socket_bytes_sent: s.socket_bytes_sent,
            socket_bytes_received: s.socket_bytes_received,
            chunks_hit: s.chunks_hit,
            bytes_hit: s.bytes_hit,
            chunks_delta: s.chunks_delta,
            bytes_delta: s.bytes_delta,
            chunks_literal: s.chunks_literal,
            bytes_literal: s.bytes_literal,
            segments_plain: s.segments_plain,
            bytes_plain: s.bytes_plain,
            segments_dedup: s.segments_dedup,
            round_trips: s.round_trips,
        }
    }
}

struct Failure {
    code: c_int,
    message: String,
}

impl Failure {
    fn new(code: c_int, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<dedupwire_wire::Error> for Failure {
    fn from(e: dedupwire_wire::Error) -> Failure {
        use dedupwire_wire::Error as E;
        let code = match &e {
            E::Io(_) | E::Timeout { .. } => DW_ERR_IO,
            E::PeerClosed { .. } => DW_ERR_CLOSED,
            E::Remote(_) => DW_ERR_REMOTE,
            E::Auth(_) => DW_ERR_AUTH,
            E::Config(_) => DW_ERR_CONFIG,
            E::Store(_) => DW_ERR_STORE,
            _ => DW_ERR_PROTOCOL,
        };
        Failure::new(code, e.to_string())
    }
}

/// The security of a keyed call: the key in `text`, which must be there.
fn keyed(text: *const c_char, plaintext: &str) -> Result<Security, Failure> {
    if text.is_null() {
        return Err(Failure::new(
            DW_ERR_NULL,
            format!(
                "key is null: give both ends the same key (64 hexadecimal digits or a \
                 passphrase of 16+ characters), or use {plaintext} on both ends for an \
                 unencrypted channel"
            ),
        ));
    }
    let text = string(text, "key")?;
    let key =
        Key::from_text(text, "the key").map_err(|e| Failure::new(DW_ERR_KEY, e.to_string()))?;
    Ok(Security::Key(key))
}

fn mode(mode: c_int) -> Result<Mode, Failure> {
    match mode {
        DW_MODE_ADAPTIVE => Ok(Mode::Adaptive),
        DW_MODE_DEDUP => Ok(Mode::Dedup),
        DW_MODE_PLAIN => Ok(Mode::Plain),
        m => Err(Failure::new(DW_ERR_CONFIG, format!("unknown mode {m}"))),
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = text);
}

fn guard(f: impl FnOnce() -> Result<(), Failure>) -> c_int {
    let failure = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return DW_OK,
        Ok(Err(f)) => f,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Failure::new(DW_ERR_PANIC, format!("dedupwire panicked: {what}"))
        }
    };
    set_last_error(&failure.message);
    failure.code
}

fn non_null<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: the caller promises a non-null `p` points to a live, unaliased T (header contract).
    unsafe { p.as_mut() }.ok_or_else(|| Failure::new(DW_ERR_NULL, format!("{what} is null")))
}

fn string<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::new(DW_ERR_NULL, format!("{what} is null")));
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string (header contract).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|e| Failure::new(DW_ERR_UTF8, format!("{what} is not UTF-8: {e}")))
}

fn resolve(addr: &str) -> Result<Vec<SocketAddr>, Failure> {
    let bad = |why: String| Failure::new(DW_ERR_ADDRESS, format!("address {addr:?}: {why}"));
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(bad("resolves to no address".into()));
    }
    Ok(addrs)
}

fn give<T>(out: *mut *mut T, value: T) -> Result<(), Failure> {
    let slot = non_null(out, "out")?;
    *slot = Box::into_raw(Box::new(value));
    Ok(())
}

/// The message of the last call on this thread that failed, as UTF-8; empty if none has.
/// Owned by the library: valid until the next `dw_` call on this thread, never freed by the
/// caller.
#[no_mangle]
pub extern "C" fn dw_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// Opens (creating if needed) the chunk store in directory `dir`, bounded to `max_bytes` of
/// segment files (0 for the default, 4 GiB; at least 128 MiB otherwise). On success `*out`
/// owns a handle to free with `dw_env_free`; listeners and streams made with it keep the store
/// open after that. One process opens a directory once.
#[no_mangle]
pub extern "C" fn dw_env_open(dir: *const c_char, max_bytes: u64, out: *mut *mut dw_env) -> c_int {
    guard(|| {
        let dir = string(dir, "dir")?;
        non_null(out, "out")?;
        let mut config = EnvConfig::default();
        if max_bytes != 0 {
            config.max_bytes = max_bytes;
        }
        let env = Environment::open(dir, config)
            .map_err(|e| Failure::new(DW_ERR_STORE, format!("environment {dir}: {e}")))?;
        give(out, dw_env { env: Arc::new(env) })
    })
}

/// Frees an environment handle (null is ignored).
#[no_mangle]
pub extern "C" fn dw_env_free(env: *mut dw_env) {
    guard(|| {
        if !env.is_null() {
            // SAFETY: a non-null handle came from `dw_env_open` and is freed once (header contract).
            drop(unsafe { Box::from_raw(env) });
        }
        Ok(())
    });
}

/// Listens on `addr` ("host:port"; port 0 picks a free one) for encrypted, authenticated
/// channels: peers must connect with `dw_connect` (or `dw_connect_mode`) and the same key
/// `key_text` (64 hexadecimal digits, or a passphrase of at least 16 characters; the caller
/// keeps the string). A null key is `DW_ERR_NULL`, an unusable one `DW_ERR_KEY`. Accepted
/// streams keep their chunks in `env`. On success `*out` owns a handle to free with
/// `dw_listener_free`.
#[no_mangle]
pub extern "C" fn dw_listen(
    addr: *const c_char,
    env: *mut dw_env,
    key_text: *const c_char,
    out: *mut *mut dw_listener,
) -> c_int {
    guard(|| {
        let security = keyed(key_text, "dw_listen_plaintext")?;
        listen(addr, env, security, out)
    })
}

/// `dw_listen` for INSECURE plaintext channels: everything in the clear and unauthenticated,
/// for trusted networks only; peers must connect with `dw_connect_plaintext`.
#[no_mangle]
pub extern "C" fn dw_listen_plaintext(
    addr: *const c_char,
    env: *mut dw_env,
    out: *mut *mut dw_listener,
) -> c_int {
    guard(|| listen(addr, env, Security::InsecurePlaintext, out))
}

fn listen(
    addr: *const c_char,
    env: *mut dw_env,
    security: Security,
    out: *mut *mut dw_listener,
) -> Result<(), Failure> {
    let addr = string(addr, "addr")?;
    let env = non_null(env, "env")?;
    non_null(out, "out")?;
    let addrs = resolve(addr)?;
    let listener = DedupListener::bind(
        &addrs[..],
        security,
        env.env.clone(),
        ChannelConfig::default(),
    )?;
    give(out, dw_listener { listener })
}

/// Writes the address the listener is bound to ("ip:port", NUL-terminated) into `buf` of
/// `len` bytes; `DW_ERR_BUFFER` if it does not fit.
#[no_mangle]
pub extern "C" fn dw_listener_local_addr(
    listener: *mut dw_listener,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard(|| {
        let listener = non_null(listener, "listener")?;
        if buf.is_null() {
            return Err(Failure::new(DW_ERR_NULL, "buf is null"));
        }
        let text = listener.listener.local_addr()?.to_string();
        if text.len() >= len {
            return Err(Failure::new(
                DW_ERR_BUFFER,
                format!(
                    "the address {text} needs {} bytes, the buffer has {len}",
                    text.len() + 1
                ),
            ));
        }
        // SAFETY: `buf` is non-null and the caller promises `len` writable bytes; we write
        // `text.len() + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            *buf.add(text.len()) = 0;
        }
        Ok(())
    })
}

/// Waits for the next connection and does the handshakes (secure, then channel). On success
/// `*out` owns a stream to end with `dw_close`. A peer with another key is `DW_ERR_AUTH`, a
/// plaintext peer of a keyed listener (or the reverse) `DW_ERR_PROTOCOL`; the listener goes
/// on accepting.
#[no_mangle]
pub extern "C" fn dw_accept(listener: *mut dw_listener, out: *mut *mut dw_stream) -> c_int {
    guard(|| {
        let listener = non_null(listener, "listener")?;
        non_null(out, "out")?;
        let stream = listener.listener.accept()?;
        give(out, dw_stream { stream })
    })
}

/// Frees a listener handle and closes its socket (null is ignored).
#[no_mangle]
pub extern "C" fn dw_listener_free(listener: *mut dw_listener) {
    guard(|| {
        if !listener.is_null() {
            // SAFETY: a non-null handle came from `dw_listen` and is freed once (header contract).
            drop(unsafe { Box::from_raw(listener) });
        }
        Ok(())
    });
}

/// Connects to a `dw_listen` listener at `addr` ("host:port") holding the same key
/// `key_text` (64 hexadecimal digits, or a passphrase of at least 16 characters; the caller
/// keeps the string) and does the handshakes, in the adaptive mode; received chunks are kept
/// in `env`. A null key is `DW_ERR_NULL`, an unusable one `DW_ERR_KEY`, a listener with
/// another key `DW_ERR_AUTH`. On success `*out` owns a stream to end with `dw_close`.
#[no_mangle]
pub extern "C" fn dw_connect(
    addr: *const c_char,
    env: *mut dw_env,
    key_text: *const c_char,
    out: *mut *mut dw_stream,
) -> c_int {
    dw_connect_mode(addr, env, key_text, DW_MODE_ADAPTIVE, out)
}

/// `dw_connect` with a `DW_MODE_*` mode, which the listening end adopts for both directions.
#[no_mangle]
pub extern "C" fn dw_connect_mode(
    addr: *const c_char,
    env: *mut dw_env,
    key_text: *const c_char,
    mode_code: c_int,
    out: *mut *mut dw_stream,
) -> c_int {
    guard(|| {
        let security = keyed(key_text, "dw_connect_plaintext")?;
        connect(addr, env, security, mode_code, out)
    })
}

/// `dw_connect_mode` for an INSECURE plaintext channel to a `dw_listen_plaintext` listener:
/// everything in the clear and unauthenticated, for trusted networks only.
#[no_mangle]
pub extern "C" fn dw_connect_plaintext(
    addr: *const c_char,
    env: *mut dw_env,
    mode_code: c_int,
    out: *mut *mut dw_stream,
) -> c_int {
    guard(|| connect(addr, env, Security::InsecurePlaintext, mode_code, out))
}

fn connect(
    addr: *const c_char,
    env: *mut dw_env,
    security: Security,
    mode_code: c_int,
    out: *mut *mut dw_stream,
) -> Result<(), Failure> {
    let addr = string(addr, "addr")?;
    let env = non_null(env, "env")?;
    non_null(out, "out")?;
    let config = ChannelConfig {
        mode: mode(mode_code)?,
        ..ChannelConfig::default()
    };
    let addrs = resolve(addr)?;
    let stream = DedupStream::connect(&addrs[..], security, env.env.clone(), config)?;
    give(out, dw_stream { stream })
}

/// Sends the `len` bytes at `data` as one message (`data` may be null when `len` is 0);
/// returns once the peer has rebuilt and verified it. The caller keeps ownership of `data`.
#[no_mangle]
pub extern "C" fn dw_send(stream: *mut dw_stream, data: *const u8, len: usize) -> c_int {
    guard(|| {
        let stream = non_null(stream, "stream")?;
        let msg: &[u8] = if len == 0 {
            &[]
        } else if data.is_null() {
            return Err(Failure::new(DW_ERR_NULL, "data is null"));
        } else {
            // SAFETY: non-null, and the caller promises `len` readable bytes (header contract).
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        Ok(stream.stream.send(msg)?)
    })
}

/// Receives the next message, verified: on success `*data` and `*len` hold it (`*data` is
/// null for an empty message), owned by the caller and freed with `dw_buf_free(*data, *len)`.
#[no_mangle]
pub extern "C" fn dw_recv(stream: *mut dw_stream, data: *mut *mut u8, len: *mut usize) -> c_int {
    guard(|| {
        let stream = non_null(stream, "stream")?;
        let data = non_null(data, "data")?;
        let len = non_null(len, "len")?;
        let msg = stream.stream.recv()?;
        *len = msg.len();
        *data = if msg.is_empty() {
            std::ptr::null_mut()
        } else {
            Box::into_raw(msg.into_boxed_slice()).cast::<u8>()
        };
        Ok(())
    })
}

/// Frees a message returned by `dw_recv`, given its pointer and length (null is ignored).
#[no_mangle]
pub extern "C" fn dw_buf_free(data: *mut u8, len: usize) {
    guard(|| {
        if !data.is_null() {
            // SAFETY: a non-null `data` with its `len` came from `dw_recv` and is freed once.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(data, len)) });
        }
        Ok(())
    });
}

/// Copies the stream's counters into `*out`.
#[no_mangle]
pub extern "C" fn dw_stream_stats(stream: *mut dw_stream, out: *mut dw_stats) -> c_int {
    guard(|| {
        let stream = non_null(stream, "stream")?;
        let out = non_null(out, "out")?;
        *out = dw_stats::from(&stream.stream.stats());
        Ok(())
    })
}

/// Finishes what is in flight, says goodbye and frees the stream, also when closing fails
/// (the handle is invalid afterwards either way).
#[no_mangle]
pub extern "C" fn dw_close(stream: *mut dw_stream) -> c_int {
    guard(|| {
        if stream.is_null() {
            return Err(Failure::new(DW_ERR_NULL, "stream is null"));
        }
        // SAFETY: a non-null handle came from `dw_accept`/`dw_connect` and is closed once.
        let stream = unsafe { Box::from_raw(stream) };
        Ok(stream.stream.close()?)
    })
}

#[cfg(test)]
mod tests;
