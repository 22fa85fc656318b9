use std::io::{self, Cursor, Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::{Error, FrameType, Framed, Hello, Result};

/// Sees every `write` call of the client (one per handshake or transport message) and sends
/// what the hook makes of it: the man in the middle.
type Hook = Box<dyn FnMut(usize, &[u8]) -> Vec<u8> + Send>;

struct Mitm {
    inner: UnixStream,
    calls: usize,
    hook: Hook,
    /// (call, at): send that call's bytes up to `at`, pause, then the rest.
    pause: Option<(usize, usize)>,
}

impl std::fmt::Debug for Mitm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mitm({} writes)", self.calls)
    }
}

impl Read for Mitm {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Write for Mitm {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let out = (self.hook)(self.calls, buf);
        match self.pause {
            Some((call, at)) if call == self.calls => {
                self.inner.write_all(&out[..at])?;
                thread::sleep(Duration::from_millis(150));
                self.inner.write_all(&out[at..])?;
            }
            _ => self.inner.write_all(&out)?,
        }
        self.calls += 1;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn pass() -> Hook {
    Box::new(|_, b| b.to_vec())
}

type Opened = (Result<SecureStream<Mitm>>, Result<SecureStream<UnixStream>>);

/// A client with `client_key` (its writes through `hook`) and a server with `server_key`.
fn open(client_key: &Key, server_key: &Key, hook: Hook) -> Opened {
    let (a, b) = UnixStream::pair().unwrap();
    let server_key = server_key.clone();
    let server = thread::spawn(move || SecureStream::server(b, &server_key));
    let client = SecureStream::client(
        Mitm {
            inner: a,
            calls: 0,
            hook,
            pause: None,
        },
        client_key,
    );
    (client, server.join().unwrap())
}

fn key() -> Key {
    Key::from_token("the test suite's shared passphrase")
}

/// An in-memory peer: reads come from `input`, writes go to `output`.
#[derive(Debug)]
struct Duplex {
    input: Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Read for Duplex {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Duplex {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn duplex(input: &[u8]) -> Duplex {
    Duplex {
        input: Cursor::new(input.to_vec()),
        output: Vec::new(),
    }
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) >> 3) as u8)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn round_trip_with_any_write_and_read_sizes(
        writes in prop::collection::vec((0usize..150_000, any::<bool>()), 0..10),
        read_size in 1usize..100_000,
    ) {
        let (client, server) = open(&key(), &key(), pass());
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        let chunks: Vec<(Vec<u8>, bool)> = writes
            .iter()
            .enumerate()
            .map(|(i, &(len, flush))| (pattern(len, i), flush))
            .collect();
        let expected: Vec<u8> = chunks.iter().flat_map(|(c, _)| c.clone()).collect();
        let writer = thread::spawn(move || {
            for (chunk, flush) in &chunks {
                client.write_all(chunk).unwrap();
                if *flush {
                    client.flush().unwrap();
                }
            }
            client.flush().unwrap();
        });
        let mut got = Vec::new();
        let mut buf = vec![0u8; read_size];
        loop {
            match server.read(&mut buf).unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        writer.join().unwrap();
        prop_assert_eq!(got.len(), expected.len());
        prop_assert!(got == expected);
    }
}

#[test]
fn frames_run_over_it_unchanged() {
    let (client, server) = open(&key(), &key(), pass());
    let big = pattern(3 << 20, 7);
    let expected = big.clone();
    let reader = thread::spawn(move || {
        let mut link = Framed::new(server.unwrap());
        let agreed = link.handshake(&Hello::new("p", 1..=1)).unwrap();
        assert_eq!(agreed.version, 1);
        let f = link.read_frame().unwrap();
        assert_eq!(f.payload, expected);
        link.write_frame(FrameType(0x11), b"ack").unwrap();
        let e = link.read_frame().unwrap_err();
        assert!(
            matches!(
                e,
                Error::PeerClosed {
                    mid_frame: false,
                    ..
                }
            ),
            "{e}"
        );
    });
    let mut link = Framed::new(client.unwrap());
    link.handshake(&Hello::new("p", 1..=1)).unwrap();
    link.write_frame(FrameType(0x10), &big).unwrap();
    assert_eq!(link.read_frame().unwrap().payload, b"ack");
    drop(link);
    reader.join().unwrap();
}

#[test]
fn the_handshake_is_laid_out_as_documented() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let (client, server) = open(
        &key(),
        &key(),
        Box::new(move |_, b| {
            log.lock().unwrap().push(b.to_vec());
            b.to_vec()
        }),
    );
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    let first = seen.lock().unwrap()[0].clone();
    assert_eq!(
        &first[..6],
        b"DWS\x01\x30\x00",
        "preamble, then a 48-byte message"
    );
    assert_eq!(first.len(), 4 + 2 + 48);
    assert_eq!(server.bytes_read(), 54);
    assert_eq!(client.bytes_read(), 54, "the server's preamble and message");
    for _ in 0..1000 {
        client.write_all(b"0123456789").unwrap();
    }
    client.flush().unwrap();
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "small writes make one message"
    );
    assert_eq!(client.bytes_written(), 54 + 2 + 10_000 + 16);
    let message = seen.lock().unwrap()[1].clone();
    assert_eq!(&message[..2], &(10_016u16).to_le_bytes());
    assert!(!message.windows(10).any(|w| w == b"0123456789"));
    let mut got = vec![0u8; 10_000];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got[..10], b"0123456789");
}

#[test]
fn a_wrong_key_fails_on_both_ends_with_auth() {
    let (client, server) = open(
        &key(),
        &Key::from_token("another passphrase, also long"),
        pass(),
    );
    let client = client.unwrap_err();
    let server = server.unwrap_err();
    for e in [&client, &server] {
        assert!(e.is_auth(), "{e:?}");
        assert!(
            e.to_string().starts_with("authentication failed: the peer")
                && e.to_string().contains("does not hold the same key"),
            "{e}"
        );
    }
}

#[test]
fn a_plaintext_client_is_told_a_key_is_needed() {
    let (a, b) = UnixStream::pair().unwrap();
    let server = thread::spawn(move || SecureStream::server(b, &key()).map(|_| ()));
    let e = Framed::new(a)
        .handshake(&Hello::new("p", 1..=1))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("encrypted connections only") && m.contains("--insecure-plaintext")),
        "{e}"
    );
    let e = server.join().unwrap().unwrap_err();
    assert!(
        matches!(&e, Error::Protocol(m) if m.starts_with("the peer speaks plaintext dedupwire; start both ends with the same key")),
        "{e}"
    );
}

#[test]
fn a_plaintext_server_is_recognised() {
    let (a, b) = UnixStream::pair().unwrap();
    let server = thread::spawn(move || {
        let mut link = Framed::new(b);
        let e = link.recv_hello(&Hello::new("p", 1..=1)).unwrap_err();
        let _ = link.send_error(&e.to_string());
        e
    });
    let e = SecureStream::client(a, &key()).unwrap_err();
    assert!(
        matches!(&e, Error::Protocol(m) if m.starts_with("the peer speaks plaintext dedupwire")),
        "{e}"
    );
    let e = server.join().unwrap();
    assert!(
        matches!(&e, Error::Protocol(m) if m.starts_with("the peer speaks encrypted dedupwire")),
        "{e}"
    );
}

#[test]
fn a_stranger_or_another_version_is_refused() {
    let mut io = duplex(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let e = SecureStream::server(&mut io, &key()).unwrap_err();
    assert!(
        matches!(&e, Error::Protocol(m) if m.starts_with("not a dedupwire peer: it opened with \"GET \"")),
        "{e}"
    );
    assert!(io.output.is_empty(), "a stranger gets nothing");
    let mut io = duplex(b"DWS\x02 and more");
    let e = SecureStream::server(&mut io, &key()).unwrap_err();
    assert!(e.to_string().contains("secure transport version 2"), "{e}");
    assert_eq!(io.output, b"DWS\x01\x00\x00");
    let mut io = duplex(b"DW");
    let e = SecureStream::server(&mut io, &key()).unwrap_err();
    assert!(e.is_peer_closed(), "{e}");
    let mut io = duplex(&[&b"DWS\x01\x30\x00"[..], &[0x55; 48]].concat());
    let e = SecureStream::server(&mut io, &key()).unwrap_err();
    assert!(e.is_auth(), "{e}");
}

/// Client messages after the handshake (`calls` ≥ 1) as the server reads them.
fn server_reads_after(hook: Hook, messages: &[&[u8]]) -> (Vec<u8>, Error) {
    let (client, server) = open(&key(), &key(), hook);
    let (mut client, server) = (client.unwrap(), server.unwrap());
    for m in messages {
        client.write_all(m).unwrap();
        client.flush().unwrap();
    }
    drop(client);
    let mut server = server;
    let mut got = Vec::new();
    let e = server.read_to_end(&mut got).unwrap_err();
    (got, Error::from_io(e, 0, false))
}

#[test]
fn a_flipped_ciphertext_byte_fails() {
    for at in [0usize, 2, 7, 20] {
        let (got, e) = server_reads_after(
            Box::new(move |call, b| {
                let mut b = b.to_vec();
                if call == 2 {
                    b[at] ^= 0x01;
                }
                b
            }),
            &[b"first message", b"second message"],
        );
        assert_eq!(got, b"first message", "flip at {at}");
        match &e {
            Error::Corrupt { detail, .. } if at >= 2 => {
                assert!(
                    detail.contains("message 2") && detail.contains("failed authentication"),
                    "{e}"
                )
            }
            Error::Corrupt { .. } | Error::PeerClosed { .. } => {}
            _ => panic!("flip at {at}: {e}"),
        }
    }
}

#[test]
fn replayed_and_reordered_messages_fail() {
    let mut kept = Vec::new();
    let (got, e) = server_reads_after(
        Box::new(move |call, b| match call {
            1 => {
                kept = b.to_vec();
                b.to_vec()
            }
            2 => kept.clone(),
            _ => b.to_vec(),
        }),
        &[b"one", b"two"],
    );
    assert_eq!(got, b"one");
    assert!(
        matches!(&e, Error::Corrupt { detail, .. } if detail.contains("replayed")),
        "{e}"
    );
    let mut held = Vec::new();
    let (got, e) = server_reads_after(
        Box::new(move |call, b| match call {
            1 => {
                held = b.to_vec();
                Vec::new()
            }
            2 => [b, &held[..]].concat(),
            _ => b.to_vec(),
        }),
        &[b"one", b"two"],
    );
    assert!(got.is_empty());
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}

#[test]
fn a_truncated_stream_is_peer_closed_mid_frame() {
    for cut in [1usize, 2, 10] {
        let (client, server) = open(
            &key(),
            &key(),
            Box::new(move |call, b| {
                if call == 1 {
                    b[..cut].to_vec()
                } else {
                    b.to_vec()
                }
            }),
        );
        let mut link = Framed::new(client.unwrap());
        link.write_frame(FrameType(0x10), b"a frame cut short")
            .unwrap();
        drop(link);
        let e = Framed::new(server.unwrap()).read_frame().unwrap_err();
        assert!(
            matches!(
                e,
                Error::PeerClosed {
                    mid_frame: true,
                    offset: 0
                }
            ),
            "cut {cut}: {e}"
        );
    }
    // A frame spread over two messages, the second never sent.
    let (client, server) = open(
        &key(),
        &key(),
        Box::new(|call, b| if call == 2 { Vec::new() } else { b.to_vec() }),
    );
    let mut link = Framed::new(client.unwrap());
    link.write_frame(FrameType(0x10), &pattern(MAX_PLAINTEXT + 100, 1))
        .unwrap();
    drop(link);
    let e = Framed::new(server.unwrap()).read_frame().unwrap_err();
    assert!(
        e.is_peer_closed() && e.to_string().contains("truncated"),
        "{e}"
    );
}

#[test]
fn read_timeouts_surface_as_timeout_and_can_be_retried() {
    let (client, server) = open(&key(), &key(), pass());
    let (mut client, server) = (client.unwrap(), server.unwrap());
    server
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(30)))
        .unwrap();
    let mut server = Framed::new(server);
    let e = server.read_frame().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Timeout {
                mid_frame: false,
                ..
            }
        ),
        "{e}"
    );
    // The next message arrives in two parts with a pause longer than the timeout between.
    client.get_mut().pause = Some((1, 5));
    let writer = thread::spawn(move || {
        let mut link = Framed::new(client);
        link.write_frame(FrameType(0x10), b"late but whole")
            .unwrap();
        link
    });
    let mut timeouts = 0;
    let frame = loop {
        match server.read_frame() {
            Ok(f) => break f,
            Err(e) if e.is_timeout() => timeouts += 1,
            Err(e) => panic!("{e}"),
        }
        assert!(timeouts < 500);
    };
    assert_eq!(frame.payload, b"late but whole");
    let _link = writer.join().unwrap();
}
