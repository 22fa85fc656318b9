//! Live replication between two FerretDB servers (MongoDB protocol) over loopback TCP: the
//! source's oplog tailed by `MongoSource`, a replica applying batches exactly once through
//! `MongoSink`. Each test starts its own servers (`mongo::server`); the FerretDB binary is
//! built by `scripts/ferretdb.sh` when missing. Without Go, a test prints SKIP and passes,
//! except under CI (`CI` set), where it fails.

mod support;

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dedupwire_replicate::live::{
    LiveError, ReceiveSummary, Receiver, SendSummary, Sender, SenderConfig,
};
use dedupwire_replicate::mongo::server::{find_binary, FerretServer};
use dedupwire_replicate::mongo::{
    doc_text, MongoDocStore, MongoError, MongoSink, MongoSource, MongoSourceConfig,
};
use dedupwire_replicate::{Change, ChangeSink, ChangeSource, Op};
use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::sync::Client;
use support::{DocWrite, Faulty};

const STREAM: &str = "live";
const DB: &str = "app";
const COLL: &str = "docs";

/// A FerretDB server with an oplog, or `None` (after printing SKIP) when it cannot be built
/// and CI is not set.
fn start() -> Option<FerretServer> {
    let binary = match find_binary(true) {
        Ok(b) => b,
        Err(msg) => {
            assert!(std::env::var_os("CI").is_none(), "{msg}");
            eprintln!("SKIP: {msg}");
            return None;
        }
    };
    Some(FerretServer::start(&binary, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}")))
}

fn client(server: &FerretServer) -> Client {
    server.client().unwrap()
}

/// A revision line as a BSON document with some typed fields that relaxed JSON would lose.
fn revision(w: &DocWrite, i: usize) -> Document {
    let json: serde_json::Value = serde_json::from_slice(&w.doc).unwrap();
    let Bson::Document(mut d) = Bson::try_from(json).unwrap() else {
        panic!("a revision is an object")
    };
    d.remove("op");
    d.insert("rev", i as i64);
    d.insert("score", i as f64 / 4.0);
    d.insert("at", DateTime::from_millis(1_600_000_000_000 + i as i64));
    d
}

/// Applies `writes` to `app.docs` on the source, one command each.
fn apply_writes(client: &Client, writes: &[(usize, DocWrite)]) {
    let coll = client.database(DB).collection::<Document>(COLL);
    for (i, w) in writes {
        let id = doc! {"_id": &w.id};
        match w.op {
            Op::Delete => {
                coll.delete_one(id).run().unwrap();
            }
            Op::Insert => {
                coll.insert_one(revision(w, *i)).run().unwrap();
            }
            Op::Update => {
                coll.replace_one(id, revision(w, *i))
                    .upsert(true)
                    .run()
                    .unwrap();
            }
        }
    }
}

/// The first `n` revision writes, numbered, with inserts of existing ids and deletes of
/// missing ones dropped (the stream is a prefix of a longer history).
fn workload(n: usize, max_doc: usize) -> Option<Vec<(usize, DocWrite)>> {
    let writes = support::rfcs_writes(n)?;
    let mut live = std::collections::HashSet::new();
    Some(
        writes
            .into_iter()
            .filter(|w| w.doc.len() < max_doc)
            .filter(|w| match w.op {
                Op::Insert => live.insert(w.id.clone()),
                Op::Delete => live.remove(&w.id),
                Op::Update => {
                    live.insert(w.id.clone());
                    true
                }
            })
            .enumerate()
            .collect(),
    )
}

/// Every document of `app.docs` as exact BSON bytes, by `_id`.
fn contents(client: &Client) -> Vec<Vec<u8>> {
    let coll = client.database(DB).collection::<Document>(COLL);
    let mut docs: Vec<Vec<u8>> = coll
        .find(doc! {})
        .run()
        .unwrap()
        .map(|d| mongodb::bson::to_vec(&d.unwrap()).unwrap())
        .collect();
    docs.sort();
    docs
}

fn assert_same_contents(src: &FerretServer, rep: &FerretServer) {
    let (a, b) = (contents(&client(src)), contents(&client(rep)));
    assert!(!a.is_empty(), "the source has documents");
    assert_eq!(a.len(), b.len(), "document counts differ");
    for (x, y) in a.iter().zip(&b) {
        assert!(x == y, "a document differs");
    }
}

fn source_config() -> MongoSourceConfig {
    MongoSourceConfig {
        database: Some(DB.into()),
        idle_wait: Duration::from_millis(20),
        ..MongoSourceConfig::default()
    }
}

/// The replica, recording every change it applies and every change it skips as already
/// applied.
struct Recording {
    sink: MongoSink,
    log: Log,
}

impl ChangeSink for Recording {
    type Error = MongoError;

    fn applied_position(&mut self) -> Result<Option<u64>, MongoError> {
        self.sink.applied_position()
    }

    fn apply(&mut self, changes: &[Change]) -> Result<(), MongoError> {
        let before = self.sink.applied_position()?;
        self.sink.apply(changes)?;
        let (fresh, old): (Vec<&Change>, Vec<&Change>) = changes
            .iter()
            .partition(|c| before.is_none_or(|b| c.pos > b));
        self.log
            .applied
            .lock()
            .unwrap()
            .extend(fresh.into_iter().cloned());
        *self.log.skipped.lock().unwrap() += old.len();
        Ok(())
    }

    fn get(&mut self, collection: &str, id: &str) -> Result<Option<Vec<u8>>, MongoError> {
        self.sink.get(collection, id)
    }
}

#[derive(Clone, Default)]
struct Log {
    applied: Arc<Mutex<Vec<Change>>>,
    skipped: Arc<Mutex<usize>>,
}

struct Outcome {
    sender: (Result<(), LiveError>, SendSummary),
    receiver: (Result<(), LiveError>, ReceiveSummary),
}

/// One connection between a fresh sender (source, store, encoder) and a fresh receiver
/// (replica client, decoder), each behind a stream that fails after its budget.
fn run_session(
    listener: &TcpListener,
    src_url: &str,
    rep_url: &str,
    config: SenderConfig,
    budgets: (Option<u64>, Option<u64>),
    log: &Log,
) -> (thread::JoinHandle<Outcome>, Arc<AtomicBool>) {
    let stop = Arc::new(AtomicBool::new(false));
    let config = SenderConfig {
        stop: Some(stop.clone()),
        ..config
    };
    let addr = listener.local_addr().unwrap();
    let listener = listener.try_clone().unwrap();
    let (src_url, rep_url, log) = (src_url.to_string(), rep_url.to_string(), log.clone());
    let handle = thread::spawn(move || {
        let receiver = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream.set_nodelay(true).unwrap();
            let mut r = Receiver::default();
            let result = r.run(Faulty::new(stream, budgets.1), |stream| {
                Ok(Recording {
                    sink: MongoSink::connect(&rep_url, stream)?,
                    log,
                })
            });
            (result, r.summary().clone())
        });
        let mut source = MongoSource::connect(&src_url, source_config()).unwrap();
        let mut store = MongoDocStore::connect(&src_url).unwrap();
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        let mut s = Sender::new(config);
        let result = s.run(Faulty::new(stream, budgets.0), &mut source, &mut store);
        let sender = (result, s.summary().clone());
        Outcome {
            sender,
            receiver: receiver.join().unwrap(),
        }
    });
    (handle, stop)
}

fn sender_config() -> SenderConfig {
    SenderConfig {
        stream: STREAM.into(),
        idle_sleep: Duration::from_millis(20),
        keepalive: Duration::from_millis(500),
        ..SenderConfig::default()
    }
}

fn drain(listener: &TcpListener, src: &FerretServer, rep: &FerretServer, log: &Log) -> Outcome {
    let config = SenderConfig {
        until_drained: true,
        ..sender_config()
    };
    let (h, _) = run_session(
        listener,
        &src.url(""),
        &rep.url(""),
        config,
        (None, None),
        log,
    );
    let o = h.join().unwrap();
    if let Err(e) = &o.sender.0 {
        panic!("sender: {e}");
    }
    if let Err(e) = &o.receiver.0 {
        panic!("receiver: {e}");
    }
    o
}

/// Bytes of the source's oplog entries for `app.docs` (what oplog shipping would move).
fn oplog_bytes(server: &FerretServer) -> u64 {
    client(server)
        .database("local")
        .collection::<Document>("oplog.rs")
        .find(doc! {"ns": format!("{DB}.{COLL}")})
        .run()
        .unwrap()
        .map(|d| mongodb::bson::to_vec(&d.unwrap()).unwrap().len() as u64)
        .sum()
}

#[test]
fn replicates_a_document_workload_end_to_end() {
    let Some(writes) = workload(1500, usize::MAX) else {
        return;
    };
    let Some(src) = start() else { return };
    let rep = start().unwrap();
    let t = Instant::now();
    apply_writes(&client(&src), &writes);
    let doc_bytes: usize = writes.iter().map(|(_, w)| w.doc.len()).sum();
    eprintln!(
        "{} writes, {doc_bytes} document bytes written in {:.1?}",
        writes.len(),
        t.elapsed()
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let log = Log::default();
    let t = Instant::now();
    let o = drain(&listener, &src, &rep, &log);
    let (s, r) = (&o.sender.1, &o.receiver.1);
    let wire = s.wire_bytes_sent + s.wire_bytes_received;
    let oplog = oplog_bytes(&src);
    eprintln!(
        "replicated {} changes in {} batches in {:.1?}: {} raw bytes (documents + ids), {oplog} \
         oplog bytes, {wire} bytes on the wire ({} sent, {} back), {:.1}x raw, {:.1}x oplog; \
         {} deltas, {} literals, {} entries raw",
        s.changes,
        s.batches,
        t.elapsed(),
        s.raw_bytes,
        s.wire_bytes_sent,
        s.wire_bytes_received,
        s.raw_bytes as f64 / wire as f64,
        oplog as f64 / wire as f64,
        s.encode.deltas,
        s.encode.literals,
        r.fallbacks,
    );
    eprintln!("sender: {}", serde_json::to_string(s).unwrap());
    assert_same_contents(&src, &rep);
    assert_eq!(s.changes, r.changes);
    assert_eq!(s.changes as usize, writes.len(), "every write is a change");
    assert_eq!(log.applied.lock().unwrap().len() as u64, s.changes);
    assert_eq!(*log.skipped.lock().unwrap(), 0);
    assert!(
        s.raw_bytes as f64 / wire as f64 > 5.0,
        "revisions of documents replicate compactly"
    );
    // Once drained, a new session has nothing to send.
    let o = drain(&listener, &src, &rep, &log);
    assert_eq!(o.sender.1.changes, 0);
}

#[test]
fn kills_at_random_points_lose_and_duplicate_nothing() {
    let Some(writes) = workload(2000, 12_000) else {
        return;
    };
    let writes: Vec<(usize, DocWrite)> = writes.into_iter().take(400).collect();
    let Some(src) = start() else { return };
    let rep = start().unwrap();
    let (src_url, rep_url) = (src.url(""), rep.url(""));
    let seed = support::seed();
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let done = done.clone();
        let client = client(&src);
        let mut seed = seed;
        thread::spawn(move || {
            let mut i = 0;
            while i < writes.len() {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                let end = (i + 1 + (seed >> 60) as usize % 4).min(writes.len());
                apply_writes(&client, &writes[i..end]);
                i = end;
                thread::sleep(Duration::from_millis(5));
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let log = Log::default();
    let (mut round, mut failed_ends, mut resumed) = (0, 0, 0);
    let mut killed = [0usize; 2];
    while !done.load(Ordering::SeqCst) || round < 10 {
        round += 1;
        assert!(round < 100, "the writer does not finish");
        // The first rounds kill within the first batch, which certainly comes while the
        // writer runs; later ones anywhere from mid-handshake to several batches in (each
        // session starts with empty caches, so its first batch is mostly literals).
        let limit = if round <= 6 { 5_000 } else { 150_000 };
        let budget = 200 + next(limit);
        let budgets = match round % 3 {
            0 => (Some(budget), None),
            1 => (None, Some(budget)),
            _ => (Some(budget), Some(200 + next(limit))),
        };
        let config = SenderConfig {
            window: 1 + next(4) as usize,
            batch_bytes: 16 << 10 << next(5),
            ..sender_config()
        };
        let (h, stop) = run_session(&listener, &src_url, &rep_url, config, budgets, &log);
        let until = Instant::now() + Duration::from_millis(300 + next(500));
        while Instant::now() < until && !h.is_finished() {
            thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
        let o = h.join().unwrap();
        resumed += usize::from(o.receiver.1.resumed_after.is_some());
        for (side, result) in [("sender", &o.sender.0), ("receiver", &o.receiver.0)] {
            if let Err(e) = result {
                failed_ends += 1;
                if support::is_injected(e) {
                    killed[usize::from(side == "receiver")] += 1;
                }
                assert!(
                    support::is_injected(e) || e.is_peer_closed(),
                    "round {round}: the {side} failed with neither the injected fault nor \
                     PeerClosed: {e}"
                );
            }
        }
    }
    writer.join().unwrap();
    let before_drain = log.applied.lock().unwrap().len();
    let o = drain(&listener, &src, &rep, &log);
    eprintln!(
        "{round} rounds, {failed_ends} ends failed ({} senders and {} receivers killed), \
         {resumed} sessions resumed, {before_drain} changes applied; the final session sent {}",
        killed[0], killed[1], o.sender.1.changes
    );
    assert!(failed_ends >= 3, "faults happened: {failed_ends}");
    assert!(
        killed[0] > 0 && killed[1] > 0,
        "both ends were killed: {killed:?}"
    );
    assert!(before_drain > 0, "changes were applied between the faults");
    assert_same_contents(&src, &rep);
    // Exactly once: the replica applied the source's change stream, each change once, in order.
    let mut audit = MongoSource::connect(&src_url, source_config()).unwrap();
    let expected = audit.poll(1 << 20).unwrap();
    let applied = log.applied.lock().unwrap();
    assert_eq!(
        applied.len(),
        expected.len(),
        "changes applied vs in the oplog"
    );
    for (a, e) in applied.iter().zip(&expected) {
        assert_eq!(a, e, "change at position {} differs", e.pos);
    }
    assert_eq!(*log.skipped.lock().unwrap(), 0, "nothing was sent twice");
}

/// A sink that died between a batch's writes and its position replays the batch on restart
/// and ends in the same state (every write is a full-state write).
#[test]
fn a_replay_after_a_crash_before_the_position_converges() {
    let Some(writes) = workload(300, 12_000) else {
        return;
    };
    let Some(src) = start() else { return };
    let rep = start().unwrap();
    apply_writes(&client(&src), &writes);
    let mut source = MongoSource::connect(&src.url(""), source_config()).unwrap();
    let changes = source.poll(1 << 20).unwrap();
    assert_eq!(changes.len(), writes.len());
    let mut sink = MongoSink::connect(&rep.url(""), STREAM).unwrap();
    let half = changes.len() / 2;
    sink.apply(&changes[..half]).unwrap();
    let recorded = sink.applied_position().unwrap();
    sink.apply(&changes[half..]).unwrap();
    // The crash: the second batch's writes landed, its position did not.
    client(&rep)
        .database("dedupwire")
        .collection::<Document>("positions")
        .replace_one(
            doc! {"_id": STREAM},
            doc! {"_id": STREAM, "pos": recorded.unwrap() as i64},
        )
        .run()
        .unwrap();
    let mut sink = MongoSink::connect(&rep.url(""), STREAM).unwrap();
    assert_eq!(sink.applied_position().unwrap(), recorded);
    sink.apply(&changes[half..]).unwrap();
    assert_eq!(
        sink.applied_position().unwrap(),
        changes.last().map(|c| c.pos)
    );
    assert_same_contents(&src, &rep);
    // Replaying everything again changes nothing.
    sink.apply(&changes).unwrap();
    assert_same_contents(&src, &rep);
    // The replica prints each document exactly as the source did (same content hashes).
    for c in changes.iter().rev().take(20) {
        let mut store = MongoDocStore::connect(&src.url("")).unwrap();
        let ours =
            dedupwire_replicate::sdedup::SourceStore::fetch(&mut store, &c.collection, &c.id);
        assert_eq!(sink.get(&c.collection, &c.id).unwrap(), ours);
    }
    let first = client(&src)
        .database(DB)
        .collection::<Document>(COLL)
        .find_one(doc! {})
        .run()
        .unwrap()
        .unwrap();
    assert!(doc_text(&first).starts_with(b"{\"_id\":"));
}

/// A batch rewriting many existing documents applies (FerretDB v1 holds a connection per
/// update statement until its command ends; the sink keeps its commands small enough).
#[test]
fn a_batch_rewriting_many_documents_applies() {
    let Some(rep) = start() else { return };
    let mut sink = MongoSink::connect(&rep.url(""), STREAM).unwrap();
    let batch = |first_pos: u64, op: Op, rev: i64| -> Vec<Change> {
        (0..250i64)
            .map(|i| {
                let d = doc! {"_id": i, "rev": rev, "text": format!("document {i}")};
                Change {
                    pos: first_pos + i as u64,
                    op,
                    collection: format!("{DB}.{COLL}"),
                    id: dedupwire_replicate::mongo::id_text(&Bson::Int64(i)),
                    doc: Some(doc_text(&d)),
                }
            })
            .collect()
    };
    sink.apply(&batch(1, Op::Insert, 1)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let rewrite = batch(1000, Op::Update, 2);
    let url = rep.url("");
    thread::spawn(move || {
        let mut sink = MongoSink::connect(&url, STREAM).unwrap();
        tx.send(sink.apply(&rewrite).map_err(|e| e.to_string()))
            .unwrap();
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the batch of updates completes")
        .unwrap();
    let coll = client(&rep).database(DB).collection::<Document>(COLL);
    assert_eq!(coll.count_documents(doc! {"rev": 2i64}).run().unwrap(), 250);
}

#[test]
fn a_batch_the_server_keeps_refusing_fails_with_its_message_after_the_tries() {
    let Some(rep) = start() else { return };
    let mut sink = MongoSink::connect(&rep.url(""), STREAM).unwrap();
    let d = doc! {"_id": 1i64, "text": "never written"};
    // A database name FerretDB refuses: every try gets the same answer.
    let refused = vec![Change {
        pos: 7,
        op: Op::Insert,
        collection: format!("no$such.{COLL}"),
        id: dedupwire_replicate::mongo::id_text(&Bson::Int64(1)),
        doc: Some(doc_text(&d)),
    }];
    let t = Instant::now();
    let e = sink.apply(&refused).unwrap_err();
    assert!(matches!(e, MongoError::Command { .. }), "{e:?}");
    assert!(e.to_string().contains("no$such"), "{e}");
    // Tried three times, 100 and 200 ms apart.
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(sink.applied_position().unwrap(), None);
}

#[test]
fn a_source_whose_server_restarts_mid_tail_reopens_its_cursor_and_loses_nothing() {
    let Some(mut src) = start() else { return };
    // A new client each time: a restart leaves the old one's connections dead.
    let insert = |src: &FerretServer, from: i64, to: i64| {
        let coll = client(src).database(DB).collection::<Document>(COLL);
        for i in from..to {
            coll.insert_one(doc! {"_id": i, "text": format!("document {i}")})
                .run()
                .unwrap();
        }
    };
    insert(&src, 0, 40);
    let config = MongoSourceConfig {
        batch_size: 8,
        ..source_config()
    };
    let mut source = MongoSource::connect(&src.url(""), config).unwrap();
    // Thirty entries in batches of eight (a find, then getMores) leave the cursor open on the
    // server; then the server goes.
    let first = source.poll(30).unwrap();
    assert_eq!(first.len(), 30);
    source.ack(first.last().unwrap().pos).unwrap();
    src.restart(Duration::from_secs(60)).unwrap();
    // FerretDB numbers its oplog entries within a second from zero again after a restart
    // (MongoDB carries on from its last entry): a second on, its positions increase again.
    thread::sleep(Duration::from_millis(1100));
    insert(&src, 40, 60);
    let mut rest = Vec::new();
    let until = Instant::now() + Duration::from_secs(60);
    while rest.len() < 30 && Instant::now() < until {
        let polled = source
            .poll(30)
            .expect("a dead cursor is reopened, not an error");
        if let Some(last) = polled.last() {
            source.ack(last.pos).unwrap();
        }
        rest.extend(polled);
    }
    let ids: Vec<String> = first.iter().chain(&rest).map(|c| c.id.clone()).collect();
    let expected: Vec<String> = (0..60i64)
        .map(|i| dedupwire_replicate::mongo::id_text(&Bson::Int64(i)))
        .collect();
    assert_eq!(ids, expected, "every insert once, in order");
}
