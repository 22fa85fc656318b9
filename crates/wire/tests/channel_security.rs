//! The channel's TCP constructors are encrypted unless told otherwise: a keyed round trip hides
//! the bytes on the wire, and a peer with another key, or a plaintext peer of an encrypted end
//! (or the reverse), is refused on both ends before any channel frame.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

use dedupwire_wire::{
    ChannelConfig, DedupListener, DedupStream, Error, Key, MemoryStore, Mode, Security,
};

mod common;

use common::random;

fn key(phrase: &str) -> Security {
    Security::Key(Key::from_token(phrase))
}

/// Forwards one connection to `target`, recording what the client sends.
fn recording_proxy(target: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let server = TcpStream::connect(target).unwrap();
        let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let upstream = thread::spawn(move || {
            let mut buf = [0u8; 16 << 10];
            loop {
                match c_read.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = s_write.shutdown(std::net::Shutdown::Write);
        });
        let (mut s_read, mut c_write) = (server, client);
        let _ = std::io::copy(&mut s_read, &mut c_write);
        let _ = c_write.shutdown(std::net::Shutdown::Write);
        upstream.join().unwrap();
    });
    (addr, seen)
}

/// Sends `msg` through a recording proxy, secured as `security` says; what the client sent.
fn send_recorded(security: Security, msg: &[u8]) -> Vec<u8> {
    let config = ChannelConfig {
        mode: Mode::Dedup,
        ..ChannelConfig::default()
    };
    let listener = DedupListener::bind(
        "127.0.0.1:0",
        security.clone(),
        Arc::new(MemoryStore::new()),
        config.clone(),
    )
    .unwrap();
    let (proxy, seen) = recording_proxy(listener.local_addr().unwrap());
    let server = thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        let got = s.recv().unwrap();
        s.send(b"thanks").unwrap();
        (got, s.get_ref().is_encrypted())
    });
    let encrypted = security.is_encrypted();
    let mut c =
        DedupStream::connect(proxy, security, Arc::new(MemoryStore::new()), config).unwrap();
    assert_eq!(c.get_ref().is_encrypted(), encrypted);
    c.send(msg).unwrap();
    assert_eq!(c.recv().unwrap(), b"thanks");
    c.close().unwrap();
    let (got, server_encrypted) = server.join().unwrap();
    assert_eq!(got, msg);
    assert_eq!(server_encrypted, encrypted);
    let seen = seen.lock().unwrap().clone();
    seen
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn an_encrypted_channel_round_trips_and_hides_the_bytes() {
    let msg = random(200_000, 1);
    let probe = &msg[100_000..100_064];
    let sealed = send_recorded(key("a passphrase both ends share"), &msg);
    assert!(
        sealed.len() > msg.len(),
        "{} bytes on the wire",
        sealed.len()
    );
    assert!(sealed.starts_with(b"DWS\x01"));
    assert!(!contains(&sealed, probe), "message bytes on the wire");
    // The same check sees them when the channel is plaintext, so it is not vacuous.
    let clear = send_recorded(Security::InsecurePlaintext, &msg);
    assert!(contains(&clear, probe));
}

/// A listener secured as `server`, a client as `client`: both ends' errors, and whether the
/// listener's store received nothing.
fn refused(server: Security, client: Security) -> (Error, Error, bool) {
    let store = Arc::new(MemoryStore::new());
    let listener = DedupListener::bind(
        "127.0.0.1:0",
        server,
        store.clone(),
        ChannelConfig::default(),
    )
    .unwrap();
    let addr = listener.local_addr().unwrap();
    let h = thread::spawn(move || {
        let e = listener.accept().unwrap_err();
        (e, listener)
    });
    let e = DedupStream::connect(
        addr,
        client,
        Arc::new(MemoryStore::new()),
        ChannelConfig::default(),
    )
    .unwrap_err();
    let (server_err, listener) = h.join().unwrap();
    let got_nothing = store.is_empty();
    // The listener keeps accepting: a peer with the right key still gets in.
    let security = listener.security().clone();
    let h = thread::spawn(move || listener.accept().unwrap().recv().unwrap());
    let mut c = DedupStream::connect(
        addr,
        security,
        Arc::new(MemoryStore::new()),
        ChannelConfig::default(),
    )
    .unwrap();
    c.send(b"after a refusal").unwrap();
    assert_eq!(h.join().unwrap(), b"after a refusal");
    let _ = c.close();
    (e, server_err, got_nothing)
}

#[test]
fn a_peer_with_another_key_is_refused_on_both_ends() {
    let (client, server, got_nothing) = refused(
        key("the server's passphrase"),
        key("the client's passphrase"),
    );
    assert!(got_nothing);
    for e in [&client, &server] {
        assert!(e.is_auth(), "{e:?}");
        assert!(e.to_string().contains("does not hold the same key"), "{e}");
    }
}

#[test]
fn a_plaintext_client_of_an_encrypted_listener_is_refused_on_both_ends() {
    let (client, server, got_nothing) =
        refused(key("the server's passphrase"), Security::InsecurePlaintext);
    assert!(got_nothing);
    assert!(
        matches!(&client, Error::Remote(m) if m.contains("accepts encrypted connections only")),
        "{client:?}"
    );
    assert!(
        matches!(&server, Error::Protocol(m) if m.starts_with("the peer speaks plaintext dedupwire")),
        "{server:?}"
    );
}

#[test]
fn an_encrypted_client_of_a_plaintext_listener_is_refused_on_both_ends() {
    let (client, server, got_nothing) =
        refused(Security::InsecurePlaintext, key("the client's passphrase"));
    assert!(got_nothing);
    assert!(
        matches!(&client, Error::Protocol(m) if m.starts_with("the peer speaks plaintext dedupwire")),
        "{client:?}"
    );
    assert!(
        matches!(&server, Error::Protocol(m) if m.starts_with("the peer speaks encrypted dedupwire")),
        "{server:?}"
    );
}
