//! Live replication over real loopback TCP between an in-memory source and an in-memory
//! replica (no database needed): the protocol, kills at random byte offsets, a diverged
//! replica, and damaged or foreign frames.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dedupwire_replicate::live::{
    LiveError, ReceiveSummary, Receiver, ReceiverConfig, SendSummary, Sender, SenderConfig,
};
use dedupwire_replicate::protocol::{self, Hello, Message, Role};
use dedupwire_replicate::sdedup::{SdedupConfig, SourceStore};
use dedupwire_replicate::{Change, ChangeSink, ChangeSource, Op};
use dedupwire_wire::{Error as WireError, FrameType, Framed};
use support::Faulty;

type Key = (String, String);

/// The source database: its change log (positions increase with gaps) and current state.
#[derive(Default)]
struct World {
    log: Vec<Change>,
    current: BTreeMap<Key, Vec<u8>>,
    released: Option<u64>,
    next: u64,
}

type Shared<T> = Arc<Mutex<T>>;

fn write(world: &Shared<World>, op: Op, id: &str, doc: Option<Vec<u8>>) -> u64 {
    let mut w = world.lock().unwrap();
    w.next += 1 + w.next % 7;
    let pos = w.next;
    let key = ("docs".to_string(), id.to_string());
    match op {
        Op::Delete => w.current.remove(&key),
        _ => w.current.insert(key, doc.clone().expect("a document")),
    };
    w.log.push(Change {
        pos,
        op,
        collection: "docs".into(),
        id: id.into(),
        doc: if op == Op::Delete { None } else { doc },
    });
    pos
}

/// A change stream over the world's log that keeps everything after what was acknowledged.
struct MemSource {
    world: Shared<World>,
    acked: Option<u64>,
}

impl MemSource {
    fn open(world: &Shared<World>) -> Self {
        let acked = world.lock().unwrap().released;
        MemSource {
            world: world.clone(),
            acked,
        }
    }
}

impl ChangeSource for MemSource {
    type Error = Infallible;

    fn poll(&mut self, max: usize) -> Result<Vec<Change>, Infallible> {
        let w = self.world.lock().unwrap();
        Ok(w.log
            .iter()
            .filter(|c| self.acked.is_none_or(|a| c.pos > a))
            .take(max)
            .cloned()
            .collect())
    }

    fn ack(&mut self, pos: u64) -> Result<(), Infallible> {
        let mut w = self.world.lock().unwrap();
        self.acked = Some(self.acked.map_or(pos, |a| a.max(pos)));
        w.released = self.acked.max(w.released);
        Ok(())
    }
}

/// The source database's current documents (what `PgDocStore` reads).
struct MemStore(Shared<World>);

impl SourceStore for MemStore {
    fn fetch(&mut self, collection: &str, id: &str) -> Option<Vec<u8>> {
        let w = self.0.lock().unwrap();
        w.current
            .get(&(collection.to_string(), id.to_string()))
            .cloned()
    }
}

/// The replica: documents, applied position, every change applied (and any skipped).
#[derive(Default)]
struct Replica {
    docs: BTreeMap<Key, Vec<u8>>,
    applied: Option<u64>,
    log: Vec<Change>,
    skipped: usize,
}

#[derive(Clone)]
struct MemSink(Shared<Replica>);

impl ChangeSink for MemSink {
    type Error = Infallible;

    fn applied_position(&mut self) -> Result<Option<u64>, Infallible> {
        Ok(self.0.lock().unwrap().applied)
    }

    fn apply(&mut self, changes: &[Change]) -> Result<(), Infallible> {
        let mut r = self.0.lock().unwrap();
        for c in changes {
            if r.applied.is_some_and(|a| c.pos <= a) {
                r.skipped += 1;
                continue;
            }
            let key = (c.collection.clone(), c.id.clone());
            match c.op {
                Op::Delete => r.docs.remove(&key),
                _ => r.docs.insert(key, c.doc.clone().expect("a document")),
            };
            r.applied = Some(c.pos);
            r.log.push(c.clone());
        }
        Ok(())
    }

    fn get(&mut self, collection: &str, id: &str) -> Result<Option<Vec<u8>>, Infallible> {
        let r = self.0.lock().unwrap();
        Ok(r.docs
            .get(&(collection.to_string(), id.to_string()))
            .cloned())
    }
}

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn text(&mut self, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| {
                if i % 9 == 8 {
                    b' '
                } else {
                    b'a' + self.below(26) as u8
                }
            })
            .collect()
    }
}

fn config() -> SenderConfig {
    SenderConfig {
        stream: "mem".into(),
        batch_bytes: 48 << 10,
        idle_sleep: Duration::from_millis(5),
        keepalive: Duration::from_millis(100),
        ..SenderConfig::default()
    }
}

struct Session {
    sender: (Result<(), LiveError>, SendSummary),
    receiver: (Result<(), LiveError>, ReceiveSummary),
}

/// One connection: a receiver thread (accepting on `listener`) and a sender thread, each
/// behind a stream that fails after its budget; `stop_after` raises the sender's stop flag.
fn session(
    listener: &TcpListener,
    world: &Shared<World>,
    replica: &Shared<Replica>,
    config: SenderConfig,
    budgets: (Option<u64>, Option<u64>),
    stop_after: Option<Duration>,
) -> Session {
    let addr = listener.local_addr().unwrap();
    let listener = listener.try_clone().unwrap();
    let sink = MemSink(replica.clone());
    let receiver = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_nodelay(true).unwrap();
        let mut r = Receiver::new(ReceiverConfig::default());
        let result = r.run(Faulty::new(stream, budgets.1), |_| Ok(sink));
        (result, r.summary().clone())
    });
    let stop = config
        .stop
        .clone()
        .unwrap_or_else(|| Arc::new(AtomicBool::new(false)));
    let config = SenderConfig {
        stop: Some(stop.clone()),
        ..config
    };
    let world2 = world.clone();
    let sender = thread::spawn(move || {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        let mut source = MemSource::open(&world2);
        let mut store = MemStore(world2.clone());
        let mut s = Sender::new(config);
        let result = s.run(Faulty::new(stream, budgets.0), &mut source, &mut store);
        (result, s.summary().clone())
    });
    if let Some(after) = stop_after {
        let until = Instant::now() + after;
        while Instant::now() < until && !sender.is_finished() {
            thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::SeqCst);
    }
    Session {
        sender: sender.join().unwrap(),
        receiver: receiver.join().unwrap(),
    }
}

fn assert_same(world: &Shared<World>, replica: &Shared<Replica>) {
    let w = world.lock().unwrap();
    let r = replica.lock().unwrap();
    assert_eq!(r.docs.len(), w.current.len(), "document counts differ");
    for (k, v) in &w.current {
        assert!(r.docs.get(k) == Some(v), "document {k:?} differs");
    }
    // Exactly once, in order: the replica applied the source's log, no more, no less.
    assert_eq!(r.log.len(), w.log.len(), "changes applied");
    for (a, b) in r.log.iter().zip(&w.log) {
        assert_eq!(a, b, "change at {} differs", b.pos);
    }
    assert_eq!(r.skipped, 0, "nothing was sent twice");
}

/// Writes revisions of `docs` documents: inserts, updates with small edits, some deletes.
fn workload(world: &Shared<World>, rng: &mut Rng, writes: usize, docs: u64) {
    for _ in 0..writes {
        let id = format!("doc{}", rng.below(docs));
        let key = ("docs".to_string(), id.clone());
        let old = world.lock().unwrap().current.get(&key).cloned();
        match old {
            Some(_) if rng.below(12) == 0 => {
                write(world, Op::Delete, &id, None);
            }
            Some(mut doc) => {
                let at = rng.below(doc.len() as u64) as usize;
                let n = 1 + rng.below(40) as usize;
                let edit = rng.text(n);
                doc.splice(at..at, edit);
                write(world, Op::Update, &id, Some(doc));
            }
            None => {
                let len = 500 + rng.below(4000) as usize;
                write(world, Op::Insert, &id, Some(rng.text(len)));
            }
        }
    }
}

#[test]
fn replicates_a_stream_exactly_and_compactly() {
    let mut rng = Rng(support::seed());
    let world = Shared::default();
    let replica = Shared::default();
    workload(&world, &mut rng, 1500, 60);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = session(
        &listener,
        &world,
        &replica,
        SenderConfig {
            until_drained: true,
            ..config()
        },
        (None, None),
        None,
    );
    s.sender.0.unwrap();
    s.receiver.0.unwrap();
    assert_same(&world, &replica);
    let (sent, got) = (&s.sender.1, &s.receiver.1);
    eprintln!("sender: {}", serde_json::to_string(sent).unwrap());
    eprintln!("receiver: {}", serde_json::to_string(got).unwrap());
    assert_eq!(sent.changes, 1500);
    assert_eq!(got.changes, 1500);
    assert!(sent.batches > 5, "several batches: {}", sent.batches);
    assert_eq!(sent.acked, world.lock().unwrap().log.last().map(|c| c.pos));
    assert_eq!(sent.wire_bytes_sent, got.wire_bytes_received);
    assert_eq!(sent.wire_bytes_received, got.wire_bytes_sent);
    assert!(
        sent.ratio > 5.0,
        "updates are small edits: ratio {}",
        sent.ratio
    );
    // The store is read when the cache misses (after a restart, say); here it never does.
    assert_eq!(got.fallbacks, 0);

    // A second connection finds nothing new and says so.
    let s = session(
        &listener,
        &world,
        &replica,
        SenderConfig {
            until_drained: true,
            ..config()
        },
        (None, None),
        None,
    );
    s.sender.0.unwrap();
    s.receiver.0.unwrap();
    assert_eq!(s.sender.1.batches, 0);
    assert_eq!(
        s.sender.1.resumed_after,
        s.sender.1.acked.or(s.sender.1.resumed_after)
    );
}

#[test]
fn survives_kills_at_random_points() {
    let mut rng = Rng(support::seed());
    let world: Shared<World> = Shared::default();
    let replica = Shared::default();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let world = world.clone();
        let done = done.clone();
        let mut rng = Rng(rng.next() | 1);
        thread::spawn(move || {
            for _ in 0..300 {
                workload(&world, &mut rng, 5, 40);
                thread::sleep(Duration::from_millis(2));
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let mut faults = 0;
    let mut round = 0;
    while !done.load(Ordering::SeqCst) || round < 40 {
        round += 1;
        // Budgets small enough that a round's traffic reaches them even on a loaded machine
        // (each batch is at least 4 KiB), so most rounds end in an injected fault.
        let budget = 200 + rng.below(24_000);
        let budgets = match rng.below(3) {
            0 => (Some(budget), None),
            1 => (None, Some(budget)),
            _ => (Some(budget), Some(200 + rng.below(24_000))),
        };
        let config = SenderConfig {
            window: 1 + rng.below(4) as usize,
            batch_bytes: 4096 + rng.below(64 << 10) as usize,
            ..config()
        };
        let s = session(
            &listener,
            &world,
            &replica,
            config,
            budgets,
            Some(Duration::from_millis(150)),
        );
        for (side, result) in [("sender", &s.sender.0), ("receiver", &s.receiver.0)] {
            if let Err(e) = result {
                faults += 1;
                assert!(
                    support::is_injected(e) || e.is_peer_closed(),
                    "round {round}: the {side} failed with neither the injected fault nor \
                     PeerClosed: {e}"
                );
            }
        }
        if round > 200 {
            panic!("the writer does not finish");
        }
    }
    writer.join().unwrap();
    // Drain without faults.
    let s = session(
        &listener,
        &world,
        &replica,
        SenderConfig {
            until_drained: true,
            ..config()
        },
        (None, None),
        None,
    );
    s.sender.0.unwrap();
    s.receiver.0.unwrap();
    eprintln!(
        "{round} rounds, {faults} failed ends, {} changes",
        world.lock().unwrap().log.len()
    );
    assert!(faults >= 10, "the faults happened: {faults}");
    assert_same(&world, &replica);
}

#[test]
fn a_diverged_replica_gets_raw_entries() {
    let mut rng = Rng(support::seed());
    let world: Shared<World> = Shared::default();
    let replica: Shared<Replica> = Shared::default();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = rng.text(3000);
    let c = rng.text(3000);
    write(&world, Op::Insert, "a", Some(a.clone()));
    write(&world, Op::Insert, "c", Some(c.clone()));
    for i in 0..3 {
        write(
            &world,
            Op::Insert,
            &format!("filler{i}"),
            Some(rng.text(3000)),
        );
    }
    let config = SenderConfig {
        sdedup: SdedupConfig {
            cache_entries: 2,
            ..SdedupConfig::default()
        },
        window: 1,
        ..config()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let config = SenderConfig {
        stop: Some(stop.clone()),
        ..config
    };
    let wait_for = |pos: u64| {
        let until = Instant::now() + Duration::from_secs(20);
        while replica.lock().unwrap().applied < Some(pos) {
            assert!(Instant::now() < until, "replication stalled");
            thread::sleep(Duration::from_millis(5));
        }
    };
    thread::scope(|scope| {
        let s = scope.spawn(|| session(&listener, &world, &replica, config, (None, None), None));
        let last = world.lock().unwrap().next;
        wait_for(last);
        // Someone edits the replica: "a" no longer has the content the sender assumes.
        let key = |id: &str| ("docs".to_string(), id.to_string());
        replica
            .lock()
            .unwrap()
            .docs
            .insert(key("a"), b"edited on the replica".to_vec());
        // "b" is a near copy of "a", "d" of "c": both are sent as deltas against documents
        // that left the caches, so the receiver reads its replica and checks the hash.
        let mut b = a.clone();
        b.extend_from_slice(b" and b");
        let mut d = c.clone();
        d.extend_from_slice(b" and d");
        write(&world, Op::Insert, "b", Some(b.clone()));
        let last = write(&world, Op::Insert, "d", Some(d.clone()));
        wait_for(last);
        {
            let r = replica.lock().unwrap();
            assert_eq!(r.docs[&key("b")], b, "b arrived raw, as the source has it");
            assert_eq!(r.docs[&key("d")], d, "d was rebuilt from the replica's c");
        }
        // The stream goes on; a later write of "a" repairs it.
        let mut a2 = a.clone();
        a2.extend_from_slice(b" revised");
        let last = write(&world, Op::Update, "a", Some(a2));
        wait_for(last);
        stop.store(true, Ordering::SeqCst);
        let s = s.join().unwrap();
        s.sender.0.unwrap();
        s.receiver.0.unwrap();
        assert_eq!(s.receiver.1.fallbacks, 1, "only b fell back");
        assert_eq!(s.sender.1.raw_entries, 1);
        assert!(s.sender.1.encode.deltas >= 2, "{:?}", s.sender.1.encode);
    });
    assert_same(&world, &replica);
}

/// A receiver on `listener` with an empty replica; returns its result.
fn receiver_thread(listener: &TcpListener) -> thread::JoinHandle<Result<(), LiveError>> {
    let listener = listener.try_clone().unwrap();
    thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let replica: Shared<Replica> = Shared::default();
        Receiver::default().run(stream, |_| Ok(MemSink(replica)))
    })
}

fn sender_hello() -> dedupwire_wire::Hello {
    Hello {
        role: Role::Sender,
        stream: "s".into(),
        resume: None,
        config: Some(SdedupConfig::default()),
    }
    .to_wire()
}

#[test]
fn damaged_or_foreign_frames_are_clear_errors() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();

    // Not dedupwire at all.
    let r = receiver_thread(&listener);
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
        .unwrap();
    let e = r.join().unwrap().unwrap_err();
    assert!(
        e.to_string().contains("not a dedupwire frame stream"),
        "{e}"
    );
    drop(c);

    // A newer protocol version: both ends refuse, with the versions in the message.
    let r = receiver_thread(&listener);
    let mut c = Framed::new(TcpStream::connect(addr).unwrap());
    let mut newer = sender_hello();
    newer.min_version = 2;
    newer.max_version = 3;
    let e = c.handshake(&newer).unwrap_err();
    assert!(
        matches!(&e, WireError::Remote(m) if m.contains("version mismatch") && m.contains("versions 2..=3")),
        "{e}"
    );
    let e = r.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("version mismatch"), "{e}");

    // Two receivers.
    let r = receiver_thread(&listener);
    let mut c = Framed::new(TcpStream::connect(addr).unwrap());
    let mut hello = sender_hello();
    hello.data = Hello {
        role: Role::Receiver,
        stream: "s".into(),
        resume: None,
        config: None,
    }
    .encode();
    c.send_hello(&hello).unwrap();
    let e = r.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("the peer is a receiver"), "{e}");
    let e = c.read_frame().unwrap().into_checked().unwrap_err();
    assert!(e.to_string().contains("the peer is a receiver"), "{e}");

    // After a good handshake: a frame damaged in transit.
    let handshaken = |listener: &TcpListener| {
        let r = receiver_thread(listener);
        let mut c = Framed::new(TcpStream::connect(addr).unwrap());
        let agreed = c.handshake(&sender_hello()).unwrap();
        assert_eq!(agreed.version, protocol::VERSION);
        (r, c)
    };
    let (r, mut c) = handshaken(&listener);
    let mut frame = Vec::new();
    dedupwire_wire::encode_frame(protocol::BATCH, b"DWR\x01 not really a batch", &mut frame);
    frame[12] ^= 0x04;
    c.get_mut().write_all(&frame).unwrap();
    let e = r.join().unwrap().unwrap_err();
    assert!(
        matches!(&e, LiveError::Wire(WireError::Corrupt { detail, .. }) if detail.contains("checksum")),
        "{e}"
    );
    let e = c.read_frame().unwrap().into_checked().unwrap_err();
    assert!(
        e.to_string().contains("checksum mismatch"),
        "the sender is told: {e}"
    );

    // A well-framed batch that is not an sDedup batch.
    let (r, mut c) = handshaken(&listener);
    c.write_frame(protocol::BATCH, b"DWR\x01 not really a batch")
        .unwrap();
    let e = r.join().unwrap().unwrap_err();
    assert!(matches!(e, LiveError::Decode(_)), "{e}");
    let e = c.read_frame().unwrap().into_checked().unwrap_err();
    assert!(e.to_string().contains("receiver: batch: corrupt"), "{e}");

    // A frame cut short by the sender's death.
    let (r, mut c) = handshaken(&listener);
    let mut frame = Vec::new();
    dedupwire_wire::encode_frame(protocol::BATCH, &[0u8; 1000], &mut frame);
    c.get_mut().write_all(&frame[..500]).unwrap();
    drop(c);
    let e = r.join().unwrap().unwrap_err();
    assert!(e.is_peer_closed(), "{e:?}");
    assert!(e.to_string().contains("truncated frame"), "{e}");

    // An unknown message type, and an ack the receiver never expects.
    let (r, mut c) = handshaken(&listener);
    c.write_frame(FrameType(0x7e), b"?").unwrap();
    let e = r.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("unknown message type 0x7e"), "{e}");
    let (r, mut c) = handshaken(&listener);
    Message::Ack(5).send(&mut c).unwrap();
    let e = r.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("unexpected ack"), "{e}");
}

#[test]
fn an_idle_sender_notices_a_receiver_that_went_away() {
    let world: Shared<World> = Shared::default();
    write(&world, Op::Insert, "x", Some(b"{}".to_vec()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let replica: Shared<Replica> = Shared::default();
    let (tx, rx) = std::sync::mpsc::channel();
    let receiver = {
        let replica = replica.clone();
        thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            tx.send(stream.try_clone().unwrap()).unwrap();
            Receiver::default().run(stream, |_| Ok(MemSink(replica)))
        })
    };
    let sender = thread::spawn(move || {
        let stream = TcpStream::connect(addr).unwrap();
        let mut source = MemSource::open(&world);
        let mut store = MemStore(world.clone());
        let mut s = Sender::new(config());
        s.run(stream, &mut source, &mut store)
    });
    let until = Instant::now() + Duration::from_secs(10);
    while replica.lock().unwrap().applied.is_none() {
        assert!(Instant::now() < until, "the batch is applied");
        thread::sleep(Duration::from_millis(5));
    }
    // The receiver's process dies while the sender is idle.
    thread::sleep(Duration::from_millis(30));
    let killed = Instant::now();
    rx.recv()
        .unwrap()
        .shutdown(std::net::Shutdown::Both)
        .unwrap();
    let e = receiver.join().unwrap().unwrap_err();
    assert!(e.is_peer_closed(), "{e:?}");
    let e = sender.join().unwrap().unwrap_err();
    assert!(e.is_peer_closed(), "{e:?}");
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "noticed by the keepalive"
    );
}
