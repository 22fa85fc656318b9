//! The dedup channel end to end over loopback TCP: round trips, bytes saved, the delta and
//! multi-level paths, both directions, refusals, damage, vanishing peers and forgetful stores
//! (the adaptive mode has its own binary: `adaptive.rs`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_wire::channel::protocol::{self, EntryRef, Message, MessageEnd};
use dedupwire_wire::channel::Xxh3Id;
use dedupwire_wire::{
    ChannelConfig, ChannelStats, ChunkId, ChunkStore, DedupListener, DedupStream, EnvConfig,
    Environment, Error, FrameType, Framed, Hello, MemoryStore, Mode, Security, StoreError,
    Transport,
};

mod common;

use common::{keyed, random, small_segments, structured};

fn dedup_config() -> ChannelConfig {
    let mut c = small_segments(ChannelConfig::default());
    c.mode = Mode::Dedup;
    c
}

/// Runs `server` on the accepted end in a thread and `client` on the connecting end, over
/// encrypted TCP (the default).
fn pair<T: Send + 'static, U>(
    server_config: ChannelConfig,
    client_config: ChannelConfig,
    server_store: Arc<dyn ChunkStore>,
    server: impl FnOnce(DedupStream<Transport>) -> T + Send + 'static,
    client: impl FnOnce(DedupStream<Transport>) -> U,
) -> (T, U) {
    pair_with(
        keyed(),
        server_config,
        client_config,
        server_store,
        server,
        client,
    )
}

/// [`pair`] secured as `security` says.
fn pair_with<T: Send + 'static, U>(
    security: Security,
    server_config: ChannelConfig,
    client_config: ChannelConfig,
    server_store: Arc<dyn ChunkStore>,
    server: impl FnOnce(DedupStream<Transport>) -> T + Send + 'static,
    client: impl FnOnce(DedupStream<Transport>) -> U,
) -> (T, U) {
    let listener =
        DedupListener::bind("127.0.0.1:0", security.clone(), server_store, server_config).unwrap();
    let addr = listener.local_addr().unwrap();
    let h = thread::spawn(move || server(listener.accept().unwrap()));
    let encrypted = security.is_encrypted();
    let c =
        DedupStream::connect(addr, security, Arc::new(MemoryStore::new()), client_config).unwrap();
    assert_eq!(c.get_ref().is_encrypted(), encrypted);
    let u = client(c);
    (h.join().unwrap(), u)
}

/// Sends `messages` one by one; the server checks each and reports its stats.
fn send_all(config: ChannelConfig, messages: Vec<Vec<u8>>) -> Vec<ChannelStats> {
    let expect = messages.clone();
    let (_, stats) = pair(
        config.clone(),
        config,
        Arc::new(MemoryStore::new()),
        move |mut s| {
            for m in &expect {
                assert_eq!(&s.recv().unwrap(), m);
            }
        },
        |mut c| {
            let mut all = Vec::new();
            let mut before = c.stats();
            for m in &messages {
                c.send(m).unwrap();
                let now = c.stats();
                let mut d = now.clone();
                d.socket_bytes_sent -= before.socket_bytes_sent;
                d.chunks_delta -= before.chunks_delta;
                d.chunks_zdelta -= before.chunks_zdelta;
                d.chunks_hit -= before.chunks_hit;
                d.chunks_literal -= before.chunks_literal;
                d.bytes_literal -= before.bytes_literal;
                d.bytes_delta -= before.bytes_delta;
                d.bytes_hit -= before.bytes_hit;
                all.push(d);
                before = now;
            }
            c.close().unwrap();
            all
        },
    );
    stats
}

#[test]
fn round_trips_random_and_structured_messages() {
    let messages = vec![
        Vec::new(),
        b"x".to_vec(),
        random(300_000, 1),
        structured(700_000, 2),
        random(1 << 20, 3),
        Vec::new(),
    ];
    for mode in [Mode::Dedup, Mode::Plain, Mode::Adaptive] {
        let mut c = small_segments(ChannelConfig::default());
        c.mode = mode;
        let stats = send_all(c, messages.clone());
        assert_eq!(stats.len(), messages.len());
    }
}

#[test]
fn a_small_message_skips_the_round_trips_and_is_still_kept() {
    let store = Arc::new(MemoryStore::new());
    let small = structured(3_000, 7);
    let (_, stats) = pair(
        dedup_config(),
        dedup_config(),
        store.clone(),
        |mut s| {
            s.recv().unwrap();
        },
        move |mut c| {
            c.send(&small).unwrap();
            let stats = c.stats();
            c.close().unwrap();
            stats
        },
    );
    assert_eq!((stats.round_trips, stats.segments_plain), (0, 1));
    assert!(!store.is_empty(), "the receiver kept its chunks");
}

#[test]
fn new_bytes_skip_the_round_trips_and_are_not_kept() {
    let store = Arc::new(MemoryStore::new());
    let big = structured(3 << 20, 8);
    let expect = big.clone();
    let (got, stats) = pair(
        dedup_config(),
        dedup_config(),
        store.clone(),
        |mut s| s.recv().unwrap(),
        move |mut c| {
            c.send_new(&big).unwrap();
            let stats = c.stats();
            c.close().unwrap();
            stats
        },
    );
    assert!(got == expect, "the message arrived changed");
    assert_eq!(stats.round_trips, 0, "{stats:?}");
    assert!(stats.segments_plain > 1, "{stats:?}");
    assert!(
        stats.socket_bytes_sent < expect.len() as u64 / 2,
        "not compressed: {stats:?}"
    );
    assert!(store.is_empty(), "the receiver kept new bytes");
}

#[test]
fn a_similar_second_message_moves_far_fewer_bytes() {
    let n = 10 << 20;
    let first = random(n, 10);
    let mut second = first.clone();
    let r = random(64, 11);
    for (k, &rk) in r.iter().take(50).enumerate() {
        let at = k * (n / 50) + rk as usize * 400;
        second[at..at + 10_000].copy_from_slice(&random(10_000, 100 + k as u64));
    }
    let c = ChannelConfig {
        mode: Mode::Dedup,
        ..Default::default()
    };
    let stats = send_all(c, vec![first, second]);
    assert!(stats[0].socket_bytes_sent > n as u64, "{:?}", stats[0]);
    let ratio = stats[1].socket_bytes_sent as f64 / n as f64;
    assert!(
        ratio < 0.10,
        "second message cost {:.1}% of its size: {:?}",
        ratio * 100.0,
        stats[1]
    );
    assert!(stats[1].bytes_hit > (n as u64) * 7 / 10, "{:?}", stats[1]);
}

#[test]
fn a_slightly_changed_chunk_travels_as_a_delta() {
    let first = random(1 << 20, 20);
    let mut second = first.clone();
    for k in 0..64 {
        second[k * 16_000 + 999] ^= 0x55;
    }
    let stats = send_all(dedup_config(), vec![first, second]);
    assert!(stats[1].chunks_delta >= 32, "{:?}", stats[1]);
    assert!(
        stats[1].socket_bytes_sent < (1 << 20) / 10,
        "{:?}",
        stats[1].socket_bytes_sent
    );
}

/// Bytes shaped like a shared library: code-like random runs between runs of zeros.
fn binary(n: usize, seed: u64) -> Vec<u8> {
    let mut b = random(n, seed);
    for (i, x) in b.iter_mut().enumerate() {
        if i % 4096 < 1024 {
            *x = 0;
        }
    }
    b
}

/// `b` relinked: two bytes of every 128 (an address) moved by the same amount.
fn relinked(b: &[u8]) -> Vec<u8> {
    let mut out = b.to_vec();
    for at in (1100..out.len() - 2).step_by(128) {
        let v = u16::from_le_bytes([out[at], out[at + 1]]).wrapping_add(0x40);
        out[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    out
}

#[test]
fn a_relinked_binary_travels_as_zstd_deltas_even_to_a_forgetful_receiver() {
    let first = binary(2 << 20, 90);
    let second = relinked(&first);
    let stats = send_all(dedup_config(), vec![first.clone(), second.clone()]);
    assert!(stats[1].chunks_zdelta > 0, "{:?}", stats[1]);
    assert!(
        stats[1].socket_bytes_sent < (2 << 20) / 5,
        "{:?}",
        stats[1].socket_bytes_sent
    );

    let (server_stats, client_stats) = send_two_to_a_forgetful_receiver(first, second, usize::MAX);
    assert!(client_stats.chunks_zdelta > 0, "{client_stats:?}");
    assert!(server_stats.chunks_needed > 0, "{server_stats:?}");
    assert_eq!(client_stats.chunks_resent, server_stats.chunks_needed);
}

#[test]
fn the_fine_level_finds_redundancy_inside_coarse_chunks() {
    let first = random(2 << 20, 30);
    let mut second = first.clone();
    for k in 0..32 {
        second[k * 65_536 + 7] ^= 1;
    }
    let levels = [ChunkerSpec::cdc(64 << 10), ChunkerSpec::cdc(4 << 10)];
    let base = ChannelConfig {
        mode: Mode::Dedup,
        segment_size: 256 << 10,
        ..ChannelConfig::with_levels(&levels).unwrap()
    };
    let mut coarse_only = base.clone();
    coarse_only.delta = false;
    coarse_only.levels.truncate(1);
    let mut two_levels = base;
    two_levels.delta = false;
    let one = send_all(coarse_only, vec![first.clone(), second.clone()]);
    let two = send_all(two_levels, vec![first, second]);
    assert!(
        two[1].socket_bytes_sent * 4 < one[1].socket_bytes_sent,
        "two levels {} bytes, coarse only {}",
        two[1].socket_bytes_sent,
        one[1].socket_bytes_sent
    );
    assert!(two[1].bytes_hit > (2 << 20) * 8 / 10, "{:?}", two[1]);
}

#[test]
fn both_ends_send_and_receive() {
    let a = structured(200_000, 40);
    let b = random(150_000, 41);
    let (a2, b2) = (a.clone(), b.clone());
    let (got_by_server, got_by_client) = pair(
        dedup_config(),
        dedup_config(),
        Arc::new(MemoryStore::new()),
        move |mut s| {
            s.send(&b2).unwrap();
            let first = s.recv().unwrap();
            let echo = s.recv().unwrap();
            s.send(&echo).unwrap();
            (first, s.stats())
        },
        move |mut c| {
            c.send(&a2).unwrap();
            let first = c.recv().unwrap();
            c.send(&first).unwrap();
            let echoed = c.recv().unwrap();
            assert_eq!(echoed, first);
            let st = c.stats();
            c.close().unwrap();
            (first, st)
        },
    );
    assert_eq!(got_by_server.0, a);
    assert_eq!(got_by_client.0, b);
    assert_eq!(got_by_client.1.messages_received, 2);
    assert_eq!(got_by_server.1.messages_received, 2);
    assert!(
        got_by_server.1.chunks_hit > 0,
        "the echo dedups against what the server received: {:?}",
        got_by_server.1
    );
}

#[test]
fn a_configuration_mismatch_is_a_clear_error_on_both_ends() {
    let server = ChannelConfig::default();
    let client = ChannelConfig {
        identifier: Arc::new(Xxh3Id),
        ..Default::default()
    };
    let listener =
        DedupListener::bind("127.0.0.1:0", keyed(), Arc::new(MemoryStore::new()), server).unwrap();
    let addr = listener.local_addr().unwrap();
    let h = thread::spawn(move || listener.accept().unwrap_err());
    let e = DedupStream::connect(addr, keyed(), Arc::new(MemoryStore::new()), client).unwrap_err();
    let server_err = h.join().unwrap();
    assert!(matches!(server_err, Error::Config(_)), "{server_err}");
    assert!(
        server_err.to_string().contains("identifier mismatch"),
        "{server_err}"
    );
    assert!(matches!(e, Error::Remote(_)), "{e}");
    assert!(
        e.to_string().contains("identifier mismatch") && e.to_string().contains("xxh3-128"),
        "{e}"
    );
}

/// A connecting end speaking raw frames, after a real handshake (over plaintext TCP).
fn raw_client(config: &ChannelConfig) -> (Framed<TcpStream>, thread::JoinHandle<Error>) {
    let listener = DedupListener::bind(
        "127.0.0.1:0",
        Security::InsecurePlaintext,
        Arc::new(MemoryStore::new()),
        config.clone(),
    )
    .unwrap();
    let addr = listener.local_addr().unwrap();
    let h = thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        loop {
            if let Err(e) = s.recv() {
                return e;
            }
        }
    });
    let mut f = Framed::new(TcpStream::connect(addr).unwrap());
    let hello = Hello::new(protocol::PROTOCOL, 1..=1);
    f.send_hello(&hello.clone().with_data(config.encode()))
        .unwrap();
    f.recv_hello(&hello).unwrap();
    (f, h)
}

fn frame(m: &Message) -> (FrameType, Vec<u8>) {
    let mut b = Vec::new();
    m.encode(32, &mut b);
    (m.frame_type(), b)
}

#[test]
fn garbage_and_truncated_frames_are_errors_not_panics() {
    let config = dedup_config();
    let cases: Vec<Vec<(FrameType, Vec<u8>)>> = vec![
        vec![(protocol::REQUEST, vec![1, 2, 3])],
        vec![(protocol::DATA, vec![0; 9])],
        vec![(protocol::HAVE, vec![0xff; 40])],
        vec![(FrameType(0x7f), b"what".to_vec())],
        vec![frame(&Message::Request {
            seg: 5,
            level: 0,
            end: None,
            chunks: vec![],
        })],
        vec![frame(&Message::Raw {
            seg: 0,
            level: 0,
            index: 0,
            bytes: vec![1],
        })],
        vec![
            frame(&Message::Request {
                seg: 0,
                level: 0,
                end: None,
                chunks: vec![(4, ChunkId([3; 32]))],
            }),
            frame(&Message::Data {
                seg: 0,
                method: 0,
                raw_len: 6,
                body: {
                    let mut b = Vec::new();
                    EntryRef::Literal(b"abcd").encode(32, &mut b);
                    b
                },
            }),
        ],
    ];
    for frames in cases {
        let (mut f, h) = raw_client(&config);
        for (kind, payload) in &frames {
            let _ = f.write_frame(*kind, payload);
        }
        let e = h.join().unwrap();
        assert!(
            matches!(e, Error::Protocol(_) | Error::Integrity(_)),
            "{frames:?}: {e}"
        );
    }
    let (mut f, h) = raw_client(&config);
    f.get_mut()
        .write_all(b"this is not a frame stream")
        .unwrap();
    let e = h.join().unwrap();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}

#[test]
fn a_wrong_message_hash_is_an_integrity_error() {
    let config = dedup_config();
    let (mut f, h) = raw_client(&config);
    let chunk = b"0123456789".to_vec();
    let id = ChunkId(*blake3::hash(&chunk).as_bytes());
    let (k, p) = frame(&Message::Request {
        seg: 0,
        level: 0,
        end: Some(MessageEnd {
            len: 10,
            hash: [7; 32],
        }),
        chunks: vec![(10, id)],
    });
    f.write_frame(k, &p).unwrap();
    let mut body = Vec::new();
    EntryRef::Literal(&chunk).encode(32, &mut body);
    let (k, p) = frame(&Message::Data {
        seg: 0,
        method: 0,
        raw_len: body.len() as u32,
        body,
    });
    f.write_frame(k, &p).unwrap();
    let e = h.join().unwrap();
    assert!(
        matches!(&e, Error::Integrity(m) if m.contains("does not match its hash")),
        "{e}"
    );
}

#[test]
fn a_zstd_delta_that_does_not_decode_is_a_protocol_error() {
    let config = dedup_config();
    let (mut f, h) = raw_client(&config);
    let base = b"0123456789".to_vec();
    let base_id = ChunkId(*blake3::hash(&base).as_bytes());
    let message = |seg: u64, chunk: &[u8], entry: EntryRef<'_>| {
        let mut body = Vec::new();
        entry.encode(32, &mut body);
        [
            frame(&Message::Request {
                seg,
                level: 0,
                end: Some(MessageEnd {
                    len: chunk.len() as u64,
                    hash: *blake3::hash(chunk).as_bytes(),
                }),
                chunks: vec![(chunk.len() as u32, ChunkId(*blake3::hash(chunk).as_bytes()))],
            }),
            frame(&Message::Data {
                seg,
                method: 0,
                raw_len: body.len() as u32,
                body,
            }),
        ]
    };
    let frames = message(0, &base, EntryRef::Literal(&base))
        .into_iter()
        .chain(message(
            1,
            b"0123456780",
            EntryRef::ZDelta(&[base_id], b"\x0anot a zstd frame"),
        ));
    for (k, p) in frames {
        f.write_frame(k, &p).unwrap();
    }
    let e = h.join().unwrap();
    assert!(
        matches!(&e, Error::Protocol(m) if m.contains("delta for segment 1")),
        "{e}"
    );
}

#[test]
fn a_peer_vanishing_mid_message_is_peer_closed() {
    let config = dedup_config();
    let (mut f, h) = raw_client(&config);
    let (k, p) = frame(&Message::Request {
        seg: 0,
        level: 0,
        end: None,
        chunks: vec![(100, ChunkId([1; 32]))],
    });
    f.write_frame(k, &p).unwrap();
    let _ = f.read_frame().unwrap();
    drop(f);
    let e = h.join().unwrap();
    assert!(e.is_peer_closed(), "{e}");
}

/// A store in memory that, for its next `forget` gets, has lost the chunks it claims, and
/// counts how often its sketches are read back.
#[derive(Default)]
struct Watched {
    inner: MemoryStore,
    forget: AtomicUsize,
    recalls: AtomicUsize,
}

impl ChunkStore for Watched {
    fn contains(&self, id: &ChunkId) -> Result<bool, StoreError> {
        self.inner.contains(id)
    }
    fn get(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, StoreError> {
        let left = self.forget.load(Ordering::SeqCst);
        if left > 0 {
            self.forget.store(left - 1, Ordering::SeqCst);
            return Ok(None);
        }
        self.inner.get(id)
    }
    fn put(&self, id: &ChunkId, data: &[u8]) -> Result<(), StoreError> {
        self.inner.put(id, data)
    }
    fn remember(&self, sketches: &[dedupwire_wire::Sketch]) -> Result<(), StoreError> {
        self.inner.remember(sketches)
    }
    fn recall(&self) -> Result<Vec<dedupwire_wire::Sketch>, StoreError> {
        self.recalls.fetch_add(1, Ordering::SeqCst);
        self.inner.recall()
    }
}

/// Sends `m1` then `m2` in dedup mode to a receiver whose store, once `m1` has arrived, has
/// lost the next `forget` chunks it reads; returns (receiver, sender) stats.
fn send_two_to_a_forgetful_receiver(
    m1: Vec<u8>,
    m2: Vec<u8>,
    forget: usize,
) -> (ChannelStats, ChannelStats) {
    let store = Arc::new(Watched::default());
    let server_store = store.clone();
    let (e1, e2) = (m1.clone(), m2.clone());
    pair(
        dedup_config(),
        dedup_config(),
        store,
        move |mut s| {
            assert_eq!(s.recv().unwrap(), e1);
            server_store.forget.store(forget, Ordering::SeqCst);
            assert_eq!(s.recv().unwrap(), e2);
            s.stats()
        },
        |mut c| {
            c.send(&m1).unwrap();
            c.send(&m2).unwrap();
            let st = c.stats();
            c.close().unwrap();
            st
        },
    )
}

#[test]
fn chunks_the_receiver_lost_after_claiming_them_are_sent_again() {
    let m1 = random(600_000, 50);
    let mut m2 = m1.clone();
    m2[300_000] ^= 1;
    let (server_stats, client_stats) = send_two_to_a_forgetful_receiver(m1, m2, 1_000);
    assert!(server_stats.chunks_needed > 0, "{server_stats:?}");
    assert_eq!(client_stats.chunks_resent, server_stats.chunks_needed);
}

/// Sends `message` on a new connection from an end keeping `client_store` to one keeping
/// `server_store`; returns the sender's stats.
fn send_on_new_connection(
    client_store: Arc<dyn ChunkStore>,
    server_store: Arc<dyn ChunkStore>,
    message: Vec<u8>,
) -> ChannelStats {
    send_all_on_new_connection(client_store, server_store, vec![message])
}

/// [`send_on_new_connection`] for several messages, one after the other.
fn send_all_on_new_connection(
    client_store: Arc<dyn ChunkStore>,
    server_store: Arc<dyn ChunkStore>,
    messages: Vec<Vec<u8>>,
) -> ChannelStats {
    let listener =
        DedupListener::bind("127.0.0.1:0", keyed(), server_store, dedup_config()).unwrap();
    let addr = listener.local_addr().unwrap();
    let expect = messages.clone();
    let h = thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        for m in expect {
            assert_eq!(s.recv().unwrap(), m);
        }
    });
    let mut c = DedupStream::connect(addr, keyed(), client_store, dedup_config()).unwrap();
    for m in &messages {
        c.send(m).unwrap();
    }
    let st = c.stats();
    c.close().unwrap();
    h.join().unwrap();
    st
}

/// `message` with one byte in every 6000 changed: every chunk differs a little.
fn edited_every_6000(message: &[u8]) -> Vec<u8> {
    let mut edited = message.to_vec();
    for k in 0..edited.len() / 6000 {
        edited[k * 6000 + 77] ^= 0x5A;
    }
    edited
}

#[test]
fn a_small_message_does_not_read_back_every_sketch_and_a_later_one_still_finds_its_bases() {
    let first = random(3 << 20, 61);
    let second = edited_every_6000(&first);
    let sender = Arc::new(Watched::default());
    let receiver: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    send_on_new_connection(sender.clone(), receiver.clone(), first);
    let before = sender.recalls.load(Ordering::SeqCst);
    // Its cost would grow with everything the store remembers, on every connection.
    send_on_new_connection(sender.clone(), receiver.clone(), structured(3_000, 62));
    assert_eq!(sender.recalls.load(Ordering::SeqCst), before);
    let st = send_all_on_new_connection(
        sender.clone(),
        receiver,
        vec![structured(3_000, 63), second],
    );
    assert!(sender.recalls.load(Ordering::SeqCst) > before);
    assert!(
        st.chunks_delta > 32 && st.chunks_literal < 8,
        "bases from the first connection: {st:?}"
    );
}

#[test]
fn a_new_connection_finds_delta_bases_in_what_earlier_ones_sent() {
    let first = random(3 << 20, 60);
    let second = edited_every_6000(&first);
    let receiver: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let sender: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    send_on_new_connection(sender.clone(), receiver.clone(), first.clone());
    assert!(
        !sender.recall().unwrap().is_empty(),
        "the sender kept sketches"
    );

    let other: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    send_on_new_connection(Arc::new(MemoryStore::new()), other.clone(), first);
    let forgetful = send_on_new_connection(Arc::new(MemoryStore::new()), other, second.clone());
    let remembering = send_on_new_connection(sender.clone(), receiver, second.clone());
    assert!(
        remembering.chunks_delta > 32 && remembering.chunks_literal < 8,
        "{remembering:?}"
    );
    assert!(
        remembering.socket_bytes_sent * 5 < forgetful.socket_bytes_sent,
        "with memory {remembering:?}, without {forgetful:?}"
    );

    // A receiver that never saw the first message asks for the bases it lacks, and soon the
    // sender stops offering recalled bases to it.
    let stranger = send_on_new_connection(sender, Arc::new(MemoryStore::new()), second);
    assert!(
        stranger.chunks_resent > 0
            && stranger.chunks_resent * 2 < stranger.chunks_delta + stranger.chunks_literal,
        "{stranger:?}"
    );
}

#[test]
fn a_receivers_environment_keeps_each_byte_once_across_levels() {
    let dir = tempfile::TempDir::new().unwrap();
    let env = Arc::new(Environment::open(dir.path(), EnvConfig::default()).unwrap());
    let store: Arc<dyn ChunkStore> = env.clone();
    let first = structured(4 << 20, 70);
    let mut second = first.clone();
    for k in 0..second.len() / 100_000 {
        second[k * 100_000 + 123] ^= 0x21;
    }
    let fresh = || -> Arc<dyn ChunkStore> { Arc::new(MemoryStore::new()) };
    send_on_new_connection(fresh(), store.clone(), first.clone());
    let kept = env.stats().chunk_bytes;
    // Every coarse chunk was refined: its bytes are its fine chunks', kept once.
    assert!(
        kept < first.len() as u64 * 21 / 20,
        "{kept} bytes kept for a {} byte message",
        first.len()
    );
    send_on_new_connection(fresh(), store.clone(), second.clone());
    let grew = env.stats().chunk_bytes - kept;
    assert!(
        grew < second.len() as u64 / 2,
        "{grew} more bytes kept for 41 edits"
    );
    let again = send_on_new_connection(fresh(), store, second);
    assert!(
        again.chunks_hit > 0 && again.chunks_delta + again.chunks_literal == 0,
        "coarse chunks kept as recipes are held: {again:?}"
    );
}

/// A chunk whose stored bytes went bad costs its own bytes again, not the message: the
/// receiver asks for it (NEED), keeps the good copy, and the message arrives whole.
#[test]
fn a_damaged_chunk_in_the_receivers_environment_is_asked_for_again() {
    let dir = tempfile::TempDir::new().unwrap();
    let env = Arc::new(Environment::open(dir.path(), EnvConfig::default()).unwrap());
    let store: Arc<dyn ChunkStore> = env.clone();
    let message = structured(2 << 20, 71);
    let fresh = || -> Arc<dyn ChunkStore> { Arc::new(MemoryStore::new()) };
    send_on_new_connection(fresh(), store.clone(), message.clone());
    let mut damaged = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "seg") {
            let mut bytes = std::fs::read(&path).unwrap();
            for at in (4096..bytes.len()).step_by(65_536) {
                bytes[at] ^= 0x20;
                damaged += 1;
            }
            std::fs::write(&path, bytes).unwrap();
        }
    }
    assert!(damaged >= 8, "{damaged} bytes flipped");
    let again = send_on_new_connection(fresh(), store.clone(), message.clone());
    assert!(again.chunks_resent > 0, "{again:?}");
    assert!(env.stats().corrupt_dropped > 0);
    // The good copies were kept: a third send finds every chunk.
    let third = send_on_new_connection(fresh(), store, message);
    assert_eq!(third.chunks_resent, 0, "{third:?}");
}

#[test]
fn a_senders_environment_keeps_no_coarse_copy_of_what_it_sent_fine() {
    let dir = tempfile::TempDir::new().unwrap();
    let env = Arc::new(Environment::open(dir.path(), EnvConfig::default()).unwrap());
    let sender: Arc<dyn ChunkStore> = env.clone();
    let receiver: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let message = structured(4 << 20, 71);
    send_on_new_connection(sender.clone(), receiver.clone(), message.clone());
    let kept = env.stats().chunk_bytes;
    let again = send_on_new_connection(sender, receiver, message);
    assert!(again.chunks_hit > 0, "{again:?}");
    let grew = env.stats().chunk_bytes - kept;
    assert!(
        grew < kept / 20,
        "{grew} more bytes kept for a message sent before"
    );
}

#[test]
fn io_write_and_read_carry_messages() {
    let data = structured(600_000, 70);
    let expect = data.clone();
    let (got, _) = pair(
        dedup_config(),
        dedup_config(),
        Arc::new(MemoryStore::new()),
        |mut s| {
            let mut all = Vec::new();
            s.read_to_end(&mut all).unwrap();
            all
        },
        move |mut c| {
            for piece in data.chunks(10_000) {
                c.write_all(piece).unwrap();
            }
            c.flush().unwrap();
            c.write_all(b"tail").unwrap();
            c.close().unwrap();
        },
    );
    let mut want = expect;
    want.extend_from_slice(b"tail");
    assert_eq!(got, want);
}

#[test]
fn io_read_streams_a_message_before_it_ends() {
    let mut config = small_segments(ChannelConfig::default());
    config.mode = Mode::Plain;
    let seg = config.segment_size;
    let data = structured(3 * seg + 1000, 71);
    let (expect, head_len) = (data.clone(), 3 * seg);
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (got, _) = pair(
        config.clone(),
        config,
        Arc::new(MemoryStore::new()),
        move |mut s| {
            let mut head = vec![0; head_len];
            s.read_exact(&mut head).unwrap();
            go.send(()).unwrap();
            let e = s.recv().unwrap_err();
            assert!(e.to_string().contains("io::Read"), "{e}");
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            head.extend_from_slice(&rest);
            head
        },
        move |mut c| {
            c.write_all(&data[..head_len]).unwrap();
            wait.recv_timeout(std::time::Duration::from_secs(20))
                .expect("the reader got the head before the message ended");
            c.write_all(&data[head_len..]).unwrap();
            c.flush().unwrap();
            c.close().unwrap();
        },
    );
    assert_eq!(
        got, expect,
        "the head arrived while the message was still open"
    );
}

/// A writer that keeps writing (without filling the window) serves the receiver's answers
/// between its writes, so the head of its first segment is rebuilt and read while the
/// message is open; before, the answers waited for a full window or the end of the message.
#[test]
fn a_writer_serves_the_answers_to_its_requests_between_its_writes() {
    let config = ChannelConfig {
        mode: Mode::Dedup,
        segment_size: 4 << 20,
        ..ChannelConfig::default()
    };
    let seg = config.segment_size;
    let data = structured(3 * seg, 72);
    let expect = data.clone();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (got, written) = pair(
        config.clone(),
        config,
        Arc::new(MemoryStore::new()),
        move |mut s| {
            // Half a segment: a segment's last chunk waits for the bytes that follow it.
            let mut head = vec![0; seg / 2];
            s.read_exact(&mut head).unwrap();
            go.send(()).unwrap();
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            head.extend_from_slice(&rest);
            head
        },
        move |mut c| {
            let step = 256 << 10;
            let mut pos = 0;
            let mut written_when_read = None;
            while pos < data.len() {
                let end = (pos + step).min(data.len());
                c.write_all(&data[pos..end]).unwrap();
                pos = end;
                if written_when_read.is_none() {
                    // Time for the receiver to answer what was sent so far.
                    thread::sleep(Duration::from_millis(20));
                    if wait.try_recv().is_ok() {
                        written_when_read = Some(pos);
                    }
                }
            }
            c.flush().unwrap();
            c.close().unwrap();
            written_when_read
        },
    );
    assert_eq!(got, expect);
    let written = written.expect("the first segment was read before the message ended");
    assert!(
        written < 2 * seg,
        "the first segment was read only after {written} bytes were written, with the window \
         (four segments) far from full"
    );
}

/// A peer that vanishes in the middle of a message read through `Read` is an error there,
/// not the end of the stream, however the reader's looks for waiting frames meet it.
#[test]
fn a_writer_vanishing_mid_message_is_an_error_for_the_reader() {
    let config = dedup_config();
    let seg = config.segment_size;
    let data = structured(3 * seg, 73);
    let sent = data.clone();
    let (got, _) = pair(
        config.clone(),
        config,
        Arc::new(MemoryStore::new()),
        move |mut s| {
            let mut got = Vec::new();
            let e = s.read_to_end(&mut got).unwrap_err();
            (got, e.to_string())
        },
        move |mut c| {
            for piece in sent.chunks(64 << 10) {
                c.write_all(piece).unwrap();
                thread::sleep(Duration::from_millis(5));
            }
            drop(c);
        },
    );
    let (prefix, e) = got;
    assert!(e.contains("closed"), "{e}");
    assert!(prefix.len() < data.len() && data.starts_with(&prefix));
}

#[test]
fn channel_levels_can_be_set_from_engine_specs() {
    let mut c = ChannelConfig::with_levels(&[ChunkerSpec::Whole, ChunkerSpec::cdc(1024)]).unwrap();
    c.segment_size = 64 << 10;
    c.mode = Mode::Dedup;
    let m = structured(200_000, 80);
    let stats = send_all(c, vec![m.clone(), m]);
    assert!(stats[1].socket_bytes_sent < 2_000, "{:?}", stats[1]);
}
