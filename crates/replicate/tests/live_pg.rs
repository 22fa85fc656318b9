//! Live replication between two PostgreSQL databases over loopback TCP: a source table tailed
//! through a logical replication slot, a replica applying batches exactly once. One server per
//! test (see `support`), the source and the replica as two of its databases.

mod support;

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dedupwire_replicate::live::{
    LiveError, PgDocStore, ReceiveSummary, Receiver, SendSummary, Sender, SenderConfig,
};
use dedupwire_replicate::pg::{PgError, PgSink, PgSinkConfig, PgSource, PgSourceConfig, Tables};
use dedupwire_replicate::sdedup::SdedupConfig;
use dedupwire_replicate::{Change, ChangeSink, ChangeSource, Op};
use postgres::Client;
use support::{DocWrite, Faulty, PgServer};

const SLOT: &str = "live";

fn source_config(slot: &str) -> PgSourceConfig {
    PgSourceConfig {
        tables: Tables::Only(vec!["docs".to_string()]),
        idle_wait: Duration::ZERO,
        initial_copy: false,
        ..PgSourceConfig::with_slot(slot)
    }
}

/// Two databases: `src` with an empty `docs(id text primary key, body text)` and `replica`.
fn setup(pg: &PgServer) -> (String, String) {
    let src = pg.create_database("src");
    let rep = pg.create_database("replica");
    pg.client("src")
        .batch_execute("CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL)")
        .unwrap();
    (src, rep)
}

/// Applies `writes` to the source, `per_tx` per transaction.
fn apply_writes(client: &mut Client, writes: &[DocWrite], per_tx: usize) {
    for chunk in writes.chunks(per_tx.max(1)) {
        let mut tx = client.transaction().unwrap();
        for w in chunk {
            let body = std::str::from_utf8(&w.doc).unwrap();
            match w.op {
                Op::Delete => tx
                    .execute("DELETE FROM docs WHERE id = $1", &[&w.id])
                    .unwrap(),
                _ => tx
                    .execute(
                        "INSERT INTO docs VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body",
                        &[&w.id, &body],
                    )
                    .unwrap(),
            };
        }
        tx.commit().unwrap();
    }
}

fn rows(client: &mut Client) -> BTreeMap<String, String> {
    client
        .query("SELECT id, body FROM docs", &[])
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn assert_same_rows(pg: &PgServer) {
    let a = rows(&mut pg.client("src"));
    let b = rows(&mut pg.client("replica"));
    assert_eq!(a.len(), b.len(), "row counts differ");
    for (id, body) in &a {
        assert!(b.get(id) == Some(body), "row {id} differs");
    }
}

/// The replica, recording every change it applies and every change it skips as already
/// applied.
struct Recording {
    sink: PgSink,
    log: Arc<Mutex<Vec<Change>>>,
    skipped: Arc<Mutex<usize>>,
}

impl ChangeSink for Recording {
    type Error = PgError;

    fn applied_position(&mut self) -> Result<Option<u64>, PgError> {
        self.sink.applied_position()
    }

    fn apply(&mut self, changes: &[Change]) -> Result<(), PgError> {
        let before = self.sink.applied_position()?;
        self.sink.apply(changes)?;
        let (fresh, old): (Vec<&Change>, Vec<&Change>) = changes
            .iter()
            .partition(|c| before.is_none_or(|b| c.pos > b));
        self.log.lock().unwrap().extend(fresh.into_iter().cloned());
        *self.skipped.lock().unwrap() += old.len();
        Ok(())
    }

    fn get(&mut self, collection: &str, id: &str) -> Result<Option<Vec<u8>>, PgError> {
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

/// One connection between a fresh sender process (source, store, encoder) and a fresh receiver
/// process (replica connection, decoder), each behind a stream that fails after its budget.
fn run_session(
    listener: &TcpListener,
    src_url: &str,
    rep_url: &str,
    config: SenderConfig,
    budgets: (Option<u64>, Option<u64>),
    log: &Log,
) -> (thread::JoinHandle<Outcome>, Arc<AtomicBool>) {
    let source = SourceOf::Fresh(source_config(&config.stream));
    run_session_with(listener, src_url, rep_url, config, budgets, log, source)
}

/// The sender's source in a session.
#[derive(Clone)]
enum SourceOf {
    /// Opened for the session with this configuration (a sender process that starts).
    Fresh(PgSourceConfig),
    /// Kept across sessions (a sender process that reconnects).
    Kept(Arc<Mutex<PgSource>>),
}

/// [`run_session`] with the sender's source given.
fn run_session_with(
    listener: &TcpListener,
    src_url: &str,
    rep_url: &str,
    config: SenderConfig,
    budgets: (Option<u64>, Option<u64>),
    log: &Log,
    source: SourceOf,
) -> (thread::JoinHandle<Outcome>, Arc<AtomicBool>) {
    let stop = config
        .stop
        .clone()
        .unwrap_or_else(|| Arc::new(AtomicBool::new(false)));
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
                    sink: PgSink::connect(&rep_url, PgSinkConfig::with_stream(stream))?,
                    log: log.applied,
                    skipped: log.skipped,
                })
            });
            (result, r.summary().clone())
        });
        let shared = match source {
            SourceOf::Kept(s) => s,
            SourceOf::Fresh(c) => Arc::new(Mutex::new(PgSource::connect(&src_url, c).unwrap())),
        };
        let mut source = shared.lock().unwrap();
        let mut store = PgDocStore::connect(&src_url).unwrap();
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        let mut s = Sender::new(config);
        let result = s.run(Faulty::new(stream, budgets.0), &mut *source, &mut store);
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
        stream: SLOT.into(),
        idle_sleep: Duration::from_millis(20),
        keepalive: Duration::from_millis(500),
        ..SenderConfig::default()
    }
}

fn drain(listener: &TcpListener, pg: &PgServer, log: &Log) -> Outcome {
    drain_with(listener, pg, log, SourceOf::Fresh(source_config(SLOT)))
}

fn drain_with(listener: &TcpListener, pg: &PgServer, log: &Log, source: SourceOf) -> Outcome {
    let config = SenderConfig {
        until_drained: true,
        ..sender_config()
    };
    let (h, _) = run_session_with(
        listener,
        &pg.url("src"),
        &pg.url("replica"),
        config,
        (None, None),
        log,
        source,
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

#[test]
fn replicates_a_document_workload_end_to_end() {
    let Some(pg) = support::start() else { return };
    let Some(writes) = support::rfcs_writes(1500) else {
        return;
    };
    let (src_url, _) = setup(&pg);
    drop(PgSource::connect(&src_url, source_config(SLOT)).unwrap()); // the slot
    let mut src = pg.client("src");
    let t = Instant::now();
    apply_writes(&mut src, &writes, 10);
    let doc_bytes: usize = writes.iter().map(|w| w.doc.len()).sum();
    eprintln!(
        "{} writes, {} document bytes written in {:.1?}",
        writes.len(),
        doc_bytes,
        t.elapsed()
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let log = Log::default();
    let t = Instant::now();
    let o = drain(&listener, &pg, &log);
    let (s, r) = (&o.sender.1, &o.receiver.1);
    let wire = s.wire_bytes_sent + s.wire_bytes_received;
    eprintln!(
        "replicated {} changes in {} batches in {:.1?}: {} raw bytes (documents + ids), {} bytes \
         on the wire ({} sent, {} back), {:.1}x; {} deltas, {} literals, {} entries raw",
        s.changes,
        s.batches,
        t.elapsed(),
        s.raw_bytes,
        wire,
        s.wire_bytes_sent,
        s.wire_bytes_received,
        s.raw_bytes as f64 / wire as f64,
        s.encode.deltas,
        s.encode.literals,
        r.fallbacks,
    );
    eprintln!("sender: {}", serde_json::to_string(s).unwrap());
    eprintln!("receiver: {}", serde_json::to_string(r).unwrap());
    assert_same_rows(&pg);
    assert_eq!(s.changes, r.changes);
    assert_eq!(log.applied.lock().unwrap().len() as u64, s.changes);
    assert_eq!(*log.skipped.lock().unwrap(), 0);
    assert!(s.changes >= 1400, "every write is a change: {}", s.changes);
    assert!(
        s.raw_bytes as f64 / wire as f64 > 5.0,
        "revisions of documents replicate compactly"
    );
}

#[test]
fn kills_at_random_points_lose_and_duplicate_nothing() {
    kills_at_random_points(false);
}

/// A sender process that keeps its source across reconnections: the source returns each
/// change once per session (batches in flight are not read again), and must hand the
/// unacknowledged ones out again after a kill.
#[test]
fn kills_with_batches_in_flight_and_a_kept_source_lose_and_duplicate_nothing() {
    kills_at_random_points(true);
}

fn kills_at_random_points(keep_source: bool) {
    let Some(pg) = support::start() else { return };
    let Some(writes) = support::rfcs_writes(2000) else {
        return;
    };
    // Smaller documents keep the debug build quick: the later RFCs are long.
    let writes: Vec<DocWrite> = writes
        .into_iter()
        .filter(|w| w.doc.len() < 12_000)
        .take(500)
        .collect();
    let (src_url, rep_url) = setup(&pg);
    // An audit slot sees every change too, with the same positions.
    let mut audit = PgSource::connect(&src_url, source_config("audit")).unwrap();
    drop(PgSource::connect(&src_url, source_config(SLOT)).unwrap());
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
        let mut client = pg.client("src");
        let mut seed = seed;
        thread::spawn(move || {
            let mut i = 0;
            while i < writes.len() {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                let n = 1 + (seed >> 60) as usize % 4;
                let end = (i + n).min(writes.len());
                apply_writes(&mut client, &writes[i..end], n);
                i = end;
                thread::sleep(Duration::from_millis(5));
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let log = Log::default();
    let kept = keep_source.then(|| {
        SourceOf::Kept(Arc::new(Mutex::new(
            PgSource::connect(&src_url, source_config(SLOT)).unwrap(),
        )))
    });
    let mut round = 0;
    let mut killed_in_flight = 0;
    let mut failed_ends = 0;
    let mut resumed = 0;
    while !done.load(Ordering::SeqCst) || round < 10 {
        round += 1;
        assert!(round < 100, "the writer does not finish");
        // Small enough that a round's traffic reaches it even on a loaded machine.
        let budget = 200 + next(30_000);
        let budgets = match next(3) {
            0 => (Some(budget), None),
            1 => (None, Some(budget)),
            _ => (Some(budget), Some(200 + next(30_000))),
        };
        let config = SenderConfig {
            window: 1 + next(4) as usize,
            batch_bytes: 16 << 10 << next(5),
            ..sender_config()
        };
        let (h, stop) = run_session_with(
            &listener,
            &src_url,
            &rep_url,
            config,
            budgets,
            &log,
            kept.clone()
                .unwrap_or_else(|| SourceOf::Fresh(source_config(SLOT))),
        );
        let until = Instant::now() + Duration::from_millis(300 + next(500));
        while Instant::now() < until && !h.is_finished() {
            thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
        let o = h.join().unwrap();
        resumed += usize::from(o.receiver.1.resumed_after.is_some());
        killed_in_flight +=
            usize::from(o.sender.0.is_err() && o.sender.1.acked_batches < o.sender.1.batches);
        for (side, result) in [("sender", &o.sender.0), ("receiver", &o.receiver.0)] {
            if let Err(e) = result {
                failed_ends += 1;
                assert!(
                    support::is_injected(e) || e.is_peer_closed(),
                    "round {round}: the {side} failed with neither the injected fault nor \
                     PeerClosed: {e}"
                );
            }
        }
    }
    writer.join().unwrap();
    let o = drain(&listener, &pg, &log);
    eprintln!(
        "{round} rounds, {failed_ends} ends killed or cut off, {resumed} sessions resumed; the \
         final session sent {} changes",
        o.sender.1.changes
    );
    eprintln!("{killed_in_flight} senders stopped with batches in flight");
    assert!(failed_ends >= 3, "faults happened: {failed_ends}");
    assert!(
        killed_in_flight >= 1,
        "a sender died with batches in flight"
    );
    assert_same_rows(&pg);
    // Exactly once: the replica applied the source's change stream, each change once, in order.
    let expected = audit.poll(1 << 20).unwrap();
    eprintln!("{} changes in the source's stream", expected.len());
    let applied = log.applied.lock().unwrap();
    assert_eq!(
        applied.len(),
        expected.len(),
        "changes applied vs in the source"
    );
    for (a, e) in applied.iter().zip(&expected) {
        assert_eq!(a, e, "change at position {} differs", e.pos);
    }
    assert_eq!(*log.skipped.lock().unwrap(), 0, "nothing was sent twice");
}

#[test]
fn a_diverged_replica_row_falls_back_to_raw() {
    let Some(pg) = support::start() else { return };
    let (src_url, rep_url) = setup(&pg);
    drop(PgSource::connect(&src_url, source_config(SLOT)).unwrap());
    let mut src = pg.client("src");
    let mut rep = pg.client("replica");
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut text = |len: usize| -> String {
        (0..len)
            .map(|i| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                if i % 9 == 8 {
                    ' '
                } else {
                    (b'a' + (seed % 26) as u8) as char
                }
            })
            .collect()
    };
    let doc = |t: &str| format!("{{\"text\": \"{t}\"}}");
    let (a, c) = (doc(&text(3000)), doc(&text(3000)));
    let put = |client: &mut Client, id: &str, body: &str| {
        client
            .execute(
                "INSERT INTO docs VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body",
                &[&id, &body],
            )
            .unwrap();
    };
    put(&mut src, "a", &a);
    put(&mut src, "c", &c);
    for i in 0..3 {
        put(&mut src, &format!("filler{i}"), &doc(&text(3000)));
    }
    let config = SenderConfig {
        // Tiny caches: "a" and "c" leave them, so their near copies are decoded against the
        // replica's rows.
        sdedup: SdedupConfig {
            cache_entries: 2,
            ..SdedupConfig::default()
        },
        window: 1,
        ..sender_config()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let (h, stop) = run_session(
        &listener,
        &src_url,
        &rep_url,
        config,
        (None, None),
        &Log::default(),
    );
    let wait_for = |rep: &mut Client, id: &str, body: &str| {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let row = rep
                .query_opt("SELECT body FROM docs WHERE id = $1", &[&id])
                .ok()
                .flatten()
                .map(|r| r.get::<_, String>(0));
            if row.as_deref() == Some(body) {
                return;
            }
            assert!(Instant::now() < until, "{id} did not arrive");
            thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(&mut rep, "filler2", &rows(&mut src)["filler2"]);
    // Someone edits the replica's "a".
    rep.execute(
        "UPDATE docs SET body = '{\"edited\": \"on the replica\"}' WHERE id = 'a'",
        &[],
    )
    .unwrap();
    let b = a.replace("\"}", " and b\"}");
    let d = c.replace("\"}", " and d\"}");
    put(&mut src, "b", &b);
    put(&mut src, "d", &d);
    wait_for(&mut rep, "d", &d);
    wait_for(&mut rep, "b", &b);
    // The stream goes on, and the next write of "a" repairs the replica.
    let a2 = a.replace("\"}", " revised\"}");
    put(&mut src, "a", &a2);
    put(&mut src, "e", &doc("after"));
    wait_for(&mut rep, "e", &doc("after"));
    stop.store(true, Ordering::SeqCst);
    let o = h.join().unwrap();
    o.sender.0.unwrap();
    o.receiver.0.unwrap();
    let (s, r) = (&o.sender.1, &o.receiver.1);
    eprintln!("sender: {}", serde_json::to_string(s).unwrap());
    eprintln!("receiver: {}", serde_json::to_string(r).unwrap());
    assert_eq!(
        r.fallbacks, 1,
        "only b fell back (d was rebuilt from the replica's c)"
    );
    assert_eq!(s.raw_entries, 1);
    assert!(s.encode.deltas >= 2, "{:?}", s.encode);
    assert_same_rows(&pg);
}

/// A receiver whose replica cannot be written tells the sender, which stops with that error.
#[test]
fn replica_errors_reach_the_sender() {
    let Some(pg) = support::start() else { return };
    let (src_url, rep_url) = setup(&pg);
    drop(PgSource::connect(&src_url, source_config(SLOT)).unwrap());
    pg.client("replica")
        .batch_execute("CREATE TABLE docs (id text PRIMARY KEY, payload text)")
        .unwrap();
    pg.client("src")
        .execute("INSERT INTO docs VALUES ('x', '{}')", &[])
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = SenderConfig {
        until_drained: true,
        ..sender_config()
    };
    let (h, _) = run_session(
        &listener,
        &src_url,
        &rep_url,
        config,
        (None, None),
        &Log::default(),
    );
    let o = h.join().unwrap();
    let r = o.receiver.0.unwrap_err();
    assert!(r.to_string().contains("no column `body`"), "{r}");
    let s = o.sender.0.unwrap_err();
    assert!(s.is_remote(), "{s:?}");
    assert!(
        s.to_string()
            .contains("receiver: replica: table public.docs"),
        "{s}"
    );
    // Nothing was acknowledged: the source still holds the change.
    let mut source = PgSource::connect(&src_url, source_config(SLOT)).unwrap();
    assert_eq!(source.poll(10).unwrap().len(), 1);
}

fn copy_config(slot: &str) -> PgSourceConfig {
    PgSourceConfig {
        initial_copy: true,
        ..source_config(slot)
    }
}

/// Positions of the initial copy are small numbers; the stream's are WAL positions (a fresh
/// cluster's WAL starts above 16 MiB).
const COPY_POSITIONS: u64 = 1 << 24;

fn copy_pending(client: &mut Client) -> Option<bool> {
    client
        .query_opt(
            "SELECT pending FROM dedupwire_copy WHERE slot = $1",
            &[&SLOT],
        )
        .unwrap()
        .map(|r| r.get(0))
}

/// Applies `writes` from a thread, a few per transaction with pauses, so that they happen
/// while the sender copies and streams.
fn concurrent_writer(pg: &PgServer, writes: Vec<DocWrite>) -> thread::JoinHandle<()> {
    let mut client = pg.client("src");
    thread::spawn(move || {
        for chunk in writes.chunks(4) {
            apply_writes(&mut client, chunk, 4);
            thread::sleep(Duration::from_millis(3));
        }
    })
}

fn small_rfcs(n: usize) -> Option<Vec<DocWrite>> {
    Some(
        support::rfcs_writes(n * 3)?
            .into_iter()
            .filter(|w| w.doc.len() < 12_000)
            .take(n)
            .collect(),
    )
}

/// Rows written before the slot exists reach an empty replica through the initial copy, and
/// writes during and after it through the stream: the replica equals the source row by row,
/// the copy's positions come first and nothing is applied twice.
#[test]
fn initial_copy_then_stream_equals_the_source() {
    let Some(pg) = support::start() else { return };
    let Some(writes) = small_rfcs(700) else {
        return;
    };
    let (src_url, rep_url) = setup(&pg);
    let mut src = pg.client("src");
    apply_writes(&mut src, &writes[..350], 10);
    let before = rows(&mut src).len();
    let writer = concurrent_writer(&pg, writes[350..].to_vec());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let log = Log::default();
    let config = SenderConfig {
        batch_bytes: 64 << 10,
        ..sender_config()
    };
    let (h, stop) = run_session_with(
        &listener,
        &src_url,
        &rep_url,
        config,
        (None, None),
        &log,
        SourceOf::Fresh(copy_config(SLOT)),
    );
    writer.join().unwrap();
    let mut rep = pg.client("replica");
    let until = Instant::now() + Duration::from_secs(120);
    while rows(&mut rep) != rows(&mut src) {
        assert!(Instant::now() < until, "the replica does not catch up");
        assert!(!h.is_finished(), "the session ended early");
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let o = h.join().unwrap();
    o.sender.0.unwrap();
    o.receiver.0.unwrap();
    assert_same_rows(&pg);
    let applied = log.applied.lock().unwrap();
    let copied: Vec<u64> = applied
        .iter()
        .map(|c| c.pos)
        .take_while(|p| *p < COPY_POSITIONS)
        .collect();
    eprintln!(
        "{before} rows before the slot, {} copied, {} changes streamed",
        copied.len(),
        applied.len() - copied.len()
    );
    assert!(copied.len() >= before, "every row written before is copied");
    assert_eq!(copied, (1..=copied.len() as u64).collect::<Vec<_>>());
    assert!(applied[copied.len()..]
        .iter()
        .all(|c| c.pos >= COPY_POSITIONS));
    assert!(
        applied.len() > copied.len(),
        "writes during the copy stream"
    );
    assert_eq!(*log.skipped.lock().unwrap(), 0, "nothing was sent twice");
    assert_ne!(
        copy_pending(&mut src),
        Some(true),
        "the copy is acknowledged"
    );
}

/// Senders killed while the initial copy is running (processes that restart, and one that
/// reconnects with the same source): the copy starts again in a new snapshot after what the
/// replica has, and the replica still ends equal to the source.
#[test]
fn a_kill_during_the_initial_copy_starts_it_again() {
    kill_during_the_initial_copy(support::seed());
}

/// The seed that found a kept source completing its own older copy attempt after a fresh
/// source had started the copy again (57 of 215 rows lost).
#[test]
fn a_kept_source_does_not_complete_a_copy_another_source_restarted() {
    kill_during_the_initial_copy(1795348949001322423);
}

fn kill_during_the_initial_copy(seed: u64) {
    let Some(pg) = support::start() else { return };
    let Some(writes) = small_rfcs(900) else {
        return;
    };
    let (src_url, rep_url) = setup(&pg);
    let mut src = pg.client("src");
    apply_writes(&mut src, &writes[..600], 10);
    let kept = SourceOf::Kept(Arc::new(Mutex::new(
        PgSource::connect(&src_url, copy_config(SLOT)).unwrap(),
    )));
    let writer = concurrent_writer(&pg, writes[600..].to_vec());
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let log = Log::default();
    let mut killed_copying = 0;
    for round in 0..8 {
        let config = SenderConfig {
            window: 1 + next(3) as usize,
            batch_bytes: 16 << 10,
            ..sender_config()
        };
        let source = if round % 2 == 1 {
            kept.clone()
        } else {
            SourceOf::Fresh(copy_config(SLOT))
        };
        let budgets = (Some(20_000 + next(200_000)), None);
        let (h, stop) =
            run_session_with(&listener, &src_url, &rep_url, config, budgets, &log, source);
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until && !h.is_finished() {
            thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
        let o = h.join().unwrap();
        if let Err(e) = &o.sender.0 {
            assert!(
                support::is_injected(e) || e.is_peer_closed(),
                "round {round}: {e}"
            );
            let applied = o.receiver.1.applied.or(o.receiver.1.resumed_after);
            if applied.is_none_or(|p| p < COPY_POSITIONS) && o.sender.1.batches > 0 {
                killed_copying += 1;
            }
        }
    }
    writer.join().unwrap();
    let o = drain_with(&listener, &pg, &log, SourceOf::Fresh(copy_config(SLOT)));
    let copied = log
        .applied
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.pos < COPY_POSITIONS)
        .count();
    eprintln!(
        "{killed_copying} senders killed while copying; {copied} copy rows applied in all; the \
         final session sent {} changes",
        o.sender.1.changes
    );
    assert!(killed_copying >= 1, "a sender died during the copy");
    assert_same_rows(&pg);
    assert_eq!(*log.skipped.lock().unwrap(), 0, "nothing was sent twice");
    assert_ne!(
        copy_pending(&mut src),
        Some(true),
        "the copy is acknowledged"
    );
}
