//! Replicate: dedupwire's live PostgreSQL → PostgreSQL replication beside PostgreSQL's own
//! logical replication, on the same change stream, bytes on the wire counted exactly.
//!
//! One throwaway PostgreSQL server (`wal_level=logical`, 127.0.0.1 TCP). Per workload (the
//! shared document revision streams), each JSON line is applied to `docs(id text primary key,
//! body text)` as an insert (upsert), update (upsert) or delete, ~10 rows per transaction, the
//! body being **the whole JSON line** (the same items as the `reduction` benchmark).
//!
//! * **PostgreSQL native**: `CREATE PUBLICATION` on `src_native`, `CREATE SUBSCRIPTION` in
//!   `dst_native` (default pgoutput settings: `binary = false`, `streaming = off`) whose
//!   connection goes through a byte-counting TCP proxy run here, so every byte of the
//!   replication connections (both directions, slot creation and the initial table sync of the
//!   empty table included) is counted. The subscription is ready before the load starts.
//! * **dedupwire**: a pgoutput slot on `src`, `live::Sender` → `live::Receiver` over a real
//!   127.0.0.1 socket (counted both directions) into `dst_dedup`, encrypted with a fresh key as
//!   the CLI does by default (`SecureStream`: the handshake and 18 bytes per message of up to
//!   64 KiB are counted), running while the workload is loaded and stopping once drained;
//!   `dst_dedup` is then compared with `src` row by row.
//! * The two sources get identical statements, so they carry the same change stream; the
//!   tables keep the default replica identity (the primary key) for both, so neither ships old
//!   row images (dedupwire's `replica_identity_full` is turned off for fairness).
//! * Offline, from the JSON lines: the documents (insert/update bodies) raw, zstd -3 per 4 MiB
//!   batch, exact CDC +zstd, and the oracle (delta vs the previous version of the same id).
//! * Primary load throughput with no consumer, with the dedupwire sender streaming
//!   concurrently, and with the native subscription attached. The first two, and the
//!   sender's and receiver's MB/s per core and lag, are medians of `--reps` interleaved runs
//!   (no consumer, sender, no consumer, sender, ...), printed with their range.
//! * The same stream on the MongoDB protocol (FerretDB): dedupwire's bytes beside the oplog's
//!   ([`mongo`]; `--skip-mongo` leaves it out).

mod mongo;

use std::io::{BufRead, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_engine::compress::Compression;
use dedupwire_engine::delta::DeltaSpec;
use dedupwire_engine::pipeline::{decode_all, encode_all, PipelineConfig};
use dedupwire_replicate::live::{
    PgDocStore, ReceiveSummary, Receiver, SendSummary, Sender, SenderConfig,
};
use dedupwire_replicate::pg::server;
use dedupwire_replicate::pg::{PgError, PgSink, PgSinkConfig, PgSource, PgSourceConfig, Tables};
use dedupwire_replicate::{Change, ChangeSource, Op};
use dedupwire_wire::{Key, SecureStream};
use postgres::{Client, NoTls};

/// Options of the replicate benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Directory of the `*.jsonl.zst` document streams.
    #[arg(long, default_value = "../shared/data")]
    docs: PathBuf,
    /// Workloads to run (file stems in --docs).
    #[arg(long, value_delimiter = ',', default_value = "gitignore,rfcs")]
    workloads: Vec<String>,
    /// Use only the first N lines of rfcs (default: all).
    #[arg(long)]
    rfcs_lines: Option<usize>,
    /// Rows per source transaction.
    #[arg(long, default_value_t = 10)]
    rows_per_tx: usize,
    /// Runs of the load with no consumer and with the dedupwire sender, interleaved; the
    /// rates are their medians (the native subscription runs once).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Upper bound on every wait (replication catching up, server start), in seconds.
    #[arg(long, default_value_t = 240)]
    timeout: u64,
    /// PostgreSQL server binaries (default: $PG_BINDIR, /usr/lib/postgresql/15/bin, newest).
    #[arg(long)]
    pg_bindir: Option<PathBuf>,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Leave out the MongoDB (FerretDB) rows.
    #[arg(long)]
    skip_mongo: bool,
    /// Only the MongoDB (FerretDB) rows.
    #[arg(long, conflicts_with = "skip_mongo")]
    only_mongo: bool,
}

// ---------------------------------------------------------------------------------------------
// Workload

struct Write1 {
    op: Op,
    id: String,
    /// The whole JSON line: the stored body.
    line: String,
}

fn load_writes(path: &Path, limit: Option<usize>) -> Result<Vec<Write1>> {
    let file = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let reader = std::io::BufReader::new(zstd::Decoder::new(file)?);
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        if limit.is_some_and(|n| i >= n) {
            break;
        }
        let line = line?;
        let c = dedupwire_replicate::jsonl::parse_line(line.as_bytes(), i as u64 + 1)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        out.push(Write1 {
            op: c.op,
            id: c.id,
            line,
        });
    }
    Ok(out)
}

/// Applies `writes` to `docs`, `per_tx` per transaction; returns the wall time.
fn apply_writes(client: &mut Client, writes: &[Write1], per_tx: usize) -> Result<Duration> {
    let upsert = client.prepare(
        "INSERT INTO docs VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body",
    )?;
    let delete = client.prepare("DELETE FROM docs WHERE id = $1")?;
    let t0 = Instant::now();
    for chunk in writes.chunks(per_tx.max(1)) {
        let mut tx = client.transaction()?;
        for w in chunk {
            match w.op {
                Op::Delete => tx.execute(&delete, &[&w.id])?,
                Op::Insert | Op::Update => tx.execute(&upsert, &[&w.id, &w.line])?,
            };
        }
        tx.commit()?;
    }
    Ok(t0.elapsed())
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL server

/// The library's throwaway server, with the benchmark's bounded connections and databases.
struct PgServer(server::PgServer);

fn find_bindir(explicit: Option<&Path>) -> Result<PathBuf> {
    server::find_bindir(explicit).map_err(|e| anyhow::anyhow!("{e} (or pass --pg-bindir)"))
}

impl PgServer {
    fn start(bindir: PathBuf, timeout: Duration) -> Result<PgServer> {
        let settings = [
            ("synchronous_commit", "off"),
            ("shared_buffers", "256MB"),
            ("max_wal_size", "4GB"),
        ];
        server::PgServer::start(bindir, &settings, timeout)
            .map(PgServer)
            .map_err(|e| anyhow::anyhow!(e))
    }

    fn port(&self) -> u16 {
        self.0.port()
    }

    /// Connection string of database `db` on `port` (the server's, or a proxy's).
    fn conninfo(port: u16, db: &str) -> String {
        server::PgServer::conninfo(port, db)
    }

    fn url(&self, db: &str) -> String {
        // Every statement bounded (the slot peeks and the checksum queries included).
        format!(
            "{} connect_timeout=10 options='-c statement_timeout=300000'",
            self.0.url(db)
        )
    }

    fn client(&self, db: &str) -> Result<Client> {
        Client::connect(&self.url(db), NoTls).with_context(|| format!("connect to {db}"))
    }

    /// Drops and creates database `name`, with an empty `docs` table when `docs`.
    fn fresh_database(&self, name: &str, docs: bool) -> Result<()> {
        let mut c = self.client("postgres")?;
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .with_context(|| format!("drop database {name}"))?;
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .with_context(|| format!("create database {name}"))?;
        if docs {
            self.client(name)?
                .batch_execute("CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL)")?;
        }
        Ok(())
    }

    fn drop_database(&self, name: &str) -> Result<()> {
        let mut c = self.client("postgres")?;
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Byte counting: a stream wrapper and a TCP proxy

/// Bytes in each direction, shared.
#[derive(Clone, Default)]
struct Counters {
    /// Client → server (for the sender: written).
    up: Arc<AtomicU64>,
    /// Server → client (for the sender: read).
    down: Arc<AtomicU64>,
}

impl Counters {
    fn total(&self) -> u64 {
        self.up.load(Ordering::SeqCst) + self.down.load(Ordering::SeqCst)
    }
}

/// A stream counting what goes through it.
struct Counted<S> {
    inner: S,
    counters: Counters,
}

impl<S: Read> Read for Counted<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counters.down.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl<S: Write> Write for Counted<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.counters.up.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A TCP proxy on 127.0.0.1 forwarding to `target`, counting every byte of every connection.
struct Proxy {
    port: u16,
    counters: Counters,
    connections: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
}

fn pump(mut from: TcpStream, mut to: TcpStream, counter: Arc<AtomicU64>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                counter.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Proxy {
    fn start(target_port: u16) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let counters = Counters::default();
        let connections = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, n, s) = (counters.clone(), connections.clone(), stop.clone());
        let accept = thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)) else {
                            continue;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        n.fetch_add(1, Ordering::SeqCst);
                        let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone())
                        else {
                            continue;
                        };
                        let up = c.up.clone();
                        let down = c.down.clone();
                        thread::spawn(move || pump(client, server, up));
                        thread::spawn(move || pump(server2, client2, down));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(Proxy {
            port,
            counters,
            connections,
            stop,
            accept: Some(accept),
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        // Forwarding threads end when their connections close (the server stops last).
    }
}

// ---------------------------------------------------------------------------------------------
// dedupwire live run

/// The PostgreSQL source, which while the load runs waits for changes instead of reporting
/// "drained" (so one `until_drained` session streams the whole load as it happens).
struct WhileLoading {
    inner: PgSource,
    loading_done: Arc<AtomicBool>,
    deadline: Instant,
}

impl ChangeSource for WhileLoading {
    type Error = PgError;

    fn poll(&mut self, max: usize) -> Result<Vec<Change>, PgError> {
        loop {
            let done = self.loading_done.load(Ordering::SeqCst);
            let changes = self.inner.poll(max)?;
            if !changes.is_empty() || done {
                return Ok(changes);
            }
            if Instant::now() > self.deadline {
                return Err(PgError::Setup(
                    "benchmark timeout: the load did not finish".into(),
                ));
            }
        }
    }

    fn ack(&mut self, pos: u64) -> Result<(), PgError> {
        self.inner.ack(pos)
    }
}

/// CPU seconds of the calling thread.
pub(crate) fn thread_cpu() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_THREAD, &mut ru) != 0 {
            return f64::NAN;
        }
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    }
}

struct DedupRun {
    load: Duration,
    wire: u64,
    send: SendSummary,
    recv: ReceiveSummary,
    sender_cpu: f64,
    receiver_cpu: f64,
    /// From the load's start to the replica holding everything.
    total: Duration,
    rows_checked: usize,
}

const SLOT: &str = "dedupwire_bench";

fn run_dedupwire(pg: &PgServer, writes: &[Write1], args: &Args) -> Result<DedupRun> {
    let timeout = Duration::from_secs(args.timeout);
    pg.fresh_database("src", true)?;
    pg.fresh_database("dst_dedup", false)?;
    let src_url = pg.url("src");
    let dst_url = pg.url("dst_dedup");
    let source = PgSource::connect(
        &src_url,
        PgSourceConfig {
            tables: Tables::Only(vec!["docs".into()]),
            replica_identity_full: false,
            idle_wait: Duration::from_millis(50),
            ..PgSourceConfig::with_slot(SLOT)
        },
    )?;
    let mut store = PgDocStore::connect(&src_url)?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let counters = Counters::default();
    let loading_done = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + timeout;
    let key = Key::generate()?;
    let receiver_key = key.clone();

    let receiver = thread::spawn(move || -> Result<(ReceiveSummary, f64)> {
        // Bounded: the sender may fail before it connects.
        listener.set_nonblocking(true)?;
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        bail!("receiver: no sender connected within {timeout:?}");
                    }
                    thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e.into()),
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        let cpu0 = thread_cpu();
        let stream =
            SecureStream::server(stream, &receiver_key).map_err(|e| anyhow!("receiver: {e}"))?;
        let mut r = Receiver::default();
        let res = r.run(stream, |stream| {
            PgSink::connect(&dst_url, PgSinkConfig::with_stream(stream))
        });
        let cpu = thread_cpu() - cpu0;
        res.map_err(|e| anyhow!("receiver: {e}"))?;
        Ok((r.summary().clone(), cpu))
    });
    let (c, done) = (counters.clone(), loading_done.clone());
    let sender = thread::spawn(move || -> Result<(SendSummary, f64)> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        let mut source = WhileLoading {
            inner: source,
            loading_done: done,
            deadline,
        };
        let cpu0 = thread_cpu();
        let mut s = Sender::new(SenderConfig {
            stream: SLOT.into(),
            until_drained: true,
            idle_sleep: Duration::from_millis(20),
            ..SenderConfig::default()
        });
        let link = SecureStream::client(
            Counted {
                inner: stream,
                counters: c,
            },
            &key,
        )
        .map_err(|e| anyhow!("sender: {e}"))?;
        let res = s.run(link, &mut source, &mut store);
        let cpu = thread_cpu() - cpu0;
        res.map_err(|e| anyhow!("sender: {e}"))?;
        let _ = source.inner.drop_slot();
        Ok((s.summary().clone(), cpu))
    });

    let mut client = pg.client("src")?;
    let t0 = Instant::now();
    let load = apply_writes(&mut client, writes, args.rows_per_tx);
    loading_done.store(true, Ordering::SeqCst);
    let load = load?;
    let (send, sender_cpu) = sender
        .join()
        .map_err(|_| anyhow!("sender thread panicked"))??;
    let (recv, receiver_cpu) = receiver
        .join()
        .map_err(|_| anyhow!("receiver thread panicked"))??;
    let total = t0.elapsed();
    let wire = counters.total();

    // Row by row.
    let a = all_rows(&mut client)?;
    let b = all_rows(&mut pg.client("dst_dedup")?)?;
    if a != b {
        let diff = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        bail!(
            "dst_dedup differs from src ({} vs {} rows; first difference at row {diff})",
            b.len(),
            a.len()
        );
    }
    // Drop the slot if the sender could not.
    let _ = client.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
        &[&SLOT],
    );
    Ok(DedupRun {
        load,
        wire,
        send,
        recv,
        sender_cpu,
        receiver_cpu,
        total,
        rows_checked: a.len(),
    })
}

fn all_rows(client: &mut Client) -> Result<Vec<(String, String)>> {
    Ok(client
        .query("SELECT id, body FROM docs ORDER BY id", &[])?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL native logical replication run

struct NativeRun {
    load: Duration,
    /// Bytes through the proxy from CREATE SUBSCRIPTION to dst_native matching the source.
    wire: u64,
    up: u64,
    down: u64,
    /// Of which before the load (slot, initial sync of the empty table).
    setup: u64,
    connections: u64,
    /// From the load's start to the replica matching.
    total: Duration,
    checksum: (i64, String),
}

fn checksum(client: &mut Client) -> Result<(i64, String)> {
    let r = client.query_one(
        "SELECT count(*), coalesce(md5(string_agg(md5(id) || md5(body), '' ORDER BY id)), '') FROM docs",
        &[],
    )?;
    Ok((r.get(0), r.get(1)))
}

fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn run_native(pg: &PgServer, proxy: &Proxy, writes: &[Write1], args: &Args) -> Result<NativeRun> {
    let timeout = Duration::from_secs(args.timeout);
    pg.fresh_database("src_native", true)?;
    pg.fresh_database("dst_native", true)?;
    let mut src = pg.client("src_native")?;
    let mut dst = pg.client("dst_native")?;
    // A subscription to the same cluster cannot create its slot itself (CREATE SUBSCRIPTION
    // would wait for its own transaction): create it first, as PostgreSQL's manual says.
    src.batch_execute("CREATE PUBLICATION bench_pub FOR TABLE docs")?;
    src.batch_execute("SELECT pg_create_logical_replication_slot('bench_native', 'pgoutput')")?;
    let before = proxy.counters.total();
    let (up0, down0) = (
        proxy.counters.up.load(Ordering::SeqCst),
        proxy.counters.down.load(Ordering::SeqCst),
    );
    let conns0 = proxy.connections.load(Ordering::SeqCst);
    dst.batch_execute(&format!(
        "CREATE SUBSCRIPTION bench_sub CONNECTION '{}' PUBLICATION bench_pub \
         WITH (create_slot = false, slot_name = 'bench_native')",
        PgServer::conninfo(proxy.port, "src_native")
    ))?;
    // Ready when the (empty) table's initial sync is done.
    wait_for(timeout, "the subscription's initial table sync", || {
        let r = dst.query_one(
            "SELECT count(*) FILTER (WHERE srsubstate <> 'r'), count(*) FROM pg_subscription_rel",
            &[],
        )?;
        let (pending, all): (i64, i64) = (r.get(0), r.get(1));
        Ok((all > 0 && pending == 0).then_some(()))
    })?;
    let setup = proxy.counters.total() - before;

    let t0 = Instant::now();
    let load = apply_writes(&mut src, writes, args.rows_per_tx)?;
    let want = checksum(&mut src)?;
    wait_for(timeout, "dst_native to match src_native", || {
        let n: i64 = dst.query_one("SELECT count(*) FROM docs", &[])?.get(0);
        if n != want.0 {
            return Ok(None);
        }
        Ok((checksum(&mut dst)? == want).then_some(()))
    })?;
    let total = t0.elapsed();
    let up = proxy.counters.up.load(Ordering::SeqCst) - up0;
    let down = proxy.counters.down.load(Ordering::SeqCst) - down0;
    let connections = proxy.connections.load(Ordering::SeqCst) - conns0;
    // Dropping the subscription drops its slot (through the proxy, no longer counted).
    dst.batch_execute("DROP SUBSCRIPTION bench_sub")?;
    Ok(NativeRun {
        load,
        wire: up + down,
        up,
        down,
        setup,
        connections,
        total,
        checksum: want,
    })
}

// ---------------------------------------------------------------------------------------------
// Offline reduction of the same change stream

struct Row {
    method: String,
    bytes: u64,
}

fn offline_rows(writes: &[Write1]) -> Result<(u64, Vec<Row>)> {
    let docs: Vec<&[u8]> = writes
        .iter()
        .filter(|w| w.op != Op::Delete)
        .map(|w| w.line.as_bytes())
        .collect();
    let raw: u64 = docs.iter().map(|d| d.len() as u64).sum();
    let mut rows = vec![Row {
        method: "raw documents (insert/update bodies)".into(),
        bytes: raw,
    }];
    // zstd -3 per 4 MiB batch.
    let mut zst = 0u64;
    let mut batch = Vec::new();
    for d in &docs {
        batch.extend_from_slice(d);
        if batch.len() >= 4 << 20 {
            zst += Compression::Zstd(3).compress(&batch).len() as u64;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        zst += Compression::Zstd(3).compress(&batch).len() as u64;
    }
    rows.push(Row {
        method: "zstd-3 per 4 MiB batch".into(),
        bytes: zst,
    });
    for avg in [4096, 1024, 256] {
        let config = PipelineConfig {
            compression: Compression::Zstd(3),
            ..PipelineConfig::exact(ChunkerSpec::cdc(avg))
        };
        let stream = encode_all(config, docs.iter().copied(), 4 << 20)?;
        let back = decode_all(&stream)?;
        if back.len() != docs.len() || back.iter().zip(&docs).any(|(a, b)| a != b) {
            bail!("exact cdc-{avg}: decoded items differ from the input");
        }
        rows.push(Row {
            method: format!(
                "exact cdc-{} +zstd",
                dedupwire_engine::chunk::size_label(avg)
            ),
            bytes: stream.len() as u64,
        });
    }
    // Oracle: each document against the previous version of the same id (none after a
    // delete), each result compressed alone; the smaller of that and the document alone.
    let codec = DeltaSpec::Sampled.build();
    let mut prev: std::collections::HashMap<&str, &[u8]> = Default::default();
    let mut oracle = 0u64;
    let mut delta = Vec::new();
    for w in writes {
        if w.op == Op::Delete {
            prev.remove(w.id.as_str());
            continue;
        }
        let doc = w.line.as_bytes();
        let alone = Compression::Zstd(3).compress(doc).len() as u64;
        oracle += match prev.get(w.id.as_str()) {
            Some(p) => {
                delta.clear();
                codec.encode(p, doc, &mut delta);
                (Compression::Zstd(3).compress(&delta).len() as u64).min(alone)
            }
            None => alone,
        };
        prev.insert(&w.id, doc);
    }
    rows.push(Row {
        method: "oracle: delta vs previous version +zstd".into(),
        bytes: oracle,
    });
    Ok((raw, rows))
}

// ---------------------------------------------------------------------------------------------

fn mb_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}

/// Median, minimum and maximum.
#[derive(Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.into_iter().collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return Spread {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }

    /// `median (min–max)` with `decimals`.
    fn show(&self, decimals: usize) -> String {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            self.median,
            self.min,
            self.max,
            d = decimals
        )
    }

    fn json(&self, runs: &[f64]) -> serde_json::Value {
        serde_json::json!({"median": self.median, "min": self.min, "max": self.max, "runs": runs})
    }
}

fn run_workload(
    pg: &PgServer,
    proxy: &Proxy,
    name: &str,
    writes: &[Write1],
    args: &Args,
) -> Result<serde_json::Value> {
    let count = |op: Op| writes.iter().filter(|w| w.op == op).count();
    let (raw, mut rows) = offline_rows(writes)?;
    let n = writes.len() as f64;

    // No replication consumer and the dedupwire sender, interleaved (the machine drifts);
    // the native subscription once.
    let baseline = || -> Result<Duration> {
        pg.fresh_database("load_base", true)?;
        let t = apply_writes(&mut pg.client("load_base")?, writes, args.rows_per_tx)?;
        pg.drop_database("load_base")?;
        Ok(t)
    };
    let native = run_native(pg, proxy, writes, args)?;
    let mut bases = Vec::new();
    let mut dedups = Vec::new();
    for rep in 0..args.reps.max(1) {
        bases.push(baseline()?);
        let dedup = run_dedupwire(pg, writes, args)?;
        // Same workload, same final contents.
        let dedup_sum = checksum(&mut pg.client("src")?)?;
        if dedup_sum != native.checksum {
            bail!("src and src_native differ after the same workload");
        }
        eprintln!(
            "{name} run {}: load {:.1} s with no consumer, {:.1} s with the sender; sender {:.0} MB/s per core; caught up {:.1} s after the load",
            rep + 1,
            bases[rep].as_secs_f64(),
            dedup.load.as_secs_f64(),
            mb_s(dedup.send.raw_bytes, dedup.sender_cpu),
            dedup.total.saturating_sub(dedup.load).as_secs_f64()
        );
        dedups.push(dedup);
    }
    for db in ["src", "dst_dedup", "src_native", "dst_native"] {
        pg.drop_database(db)?;
    }
    let rate = |d: Duration| n / d.as_secs_f64().max(1e-9);
    let base_rates: Vec<f64> = bases.iter().map(|d| rate(*d)).collect();
    let dedup_rates: Vec<f64> = dedups.iter().map(|d| rate(d.load)).collect();
    let ratios: Vec<f64> = base_rates
        .iter()
        .zip(&dedup_rates)
        .map(|(b, d)| d / b)
        .collect();
    let sender_mbs: Vec<f64> = dedups
        .iter()
        .map(|d| mb_s(d.send.raw_bytes, d.sender_cpu))
        .collect();
    let receiver_mbs: Vec<f64> = dedups
        .iter()
        .map(|d| mb_s(d.send.raw_bytes, d.receiver_cpu))
        .collect();
    let lags: Vec<f64> = dedups
        .iter()
        .map(|d| d.total.saturating_sub(d.load).as_secs_f64())
        .collect();
    let catch_ups: Vec<f64> = dedups.iter().map(|d| d.total.as_secs_f64()).collect();
    let wires: Vec<f64> = dedups.iter().map(|d| d.wire as f64).collect();
    let base_s = Spread::of(base_rates.iter().copied());
    let dedup_s = Spread::of(dedup_rates.iter().copied());
    let ratio_s = Spread::of(ratios.iter().copied());
    let sender_s = Spread::of(sender_mbs.iter().copied());
    let receiver_s = Spread::of(receiver_mbs.iter().copied());
    let lag_s = Spread::of(lags.iter().copied());
    let wire_s = Spread::of(wires.iter().copied());
    // The run whose wire bytes are the median stands for the others in the tables.
    let dedup = dedups
        .iter()
        .min_by(|a, b| {
            (a.wire as f64 - wire_s.median)
                .abs()
                .total_cmp(&(b.wire as f64 - wire_s.median).abs())
        })
        .expect("at least one run");

    rows.push(Row {
        method: "PostgreSQL logical replication (pgoutput)".into(),
        bytes: native.wire,
    });
    rows.push(Row {
        method: "dedupwire live (sDedup, zstd-3)".into(),
        bytes: dedup.wire,
    });

    println!(
        "\n## {name} — {} changes ({} insert, {} update, {} delete), {:.1} MB of documents, \
         {} rows per transaction",
        writes.len(),
        count(Op::Insert),
        count(Op::Update),
        count(Op::Delete),
        raw as f64 / 1e6,
        args.rows_per_tx
    );
    println!(
        "{:<44} {:>12} {:>9} {:>11}",
        "method", "bytes", "vs raw", "vs native"
    );
    for r in &rows {
        println!(
            "{:<44} {:>12} {:>8.2}x {:>10.2}x",
            r.method,
            r.bytes,
            raw as f64 / r.bytes.max(1) as f64,
            native.wire as f64 / r.bytes.max(1) as f64,
        );
    }
    let s = &dedup.send;
    let r = &dedup.recv;
    let enc_hits =
        s.encode.cache_hits as f64 / (s.encode.cache_hits + s.encode.cache_misses).max(1) as f64;
    let dec_hits = r.cache_hits.0 as f64 / (r.cache_hits.0 + r.cache_hits.1).max(1) as f64;
    let factor = native.wire as f64 / dedup.wire.max(1) as f64;
    println!(
        "native: {} B up + {} B down over {} connections ({} B setup before the load); \
         caught up {:.1} s after the load started",
        native.up,
        native.down,
        native.connections,
        native.setup,
        native.total.as_secs_f64()
    );
    println!(
        "dedupwire: {} B on the socket, encrypted (frames inside: {} sent + {} received), {} \
         changes in {} batches, {} deltas / {} literals; replica verified row by row ({} rows); \
         caught up {:.1} s after the load started",
        dedup.wire,
        s.wire_bytes_sent,
        s.wire_bytes_received,
        s.changes,
        s.batches,
        s.encode.deltas,
        s.encode.literals,
        dedup.rows_checked,
        dedup.total.as_secs_f64()
    );
    println!(
        "dedupwire CPU (of the raw change bytes; median (min–max) of {} runs): sender thread {} MB/s \
         per core (encoding + reading the plugin's output), receiver thread {} MB/s per core \
         (decoding + sending to the replica; server-side work of both not included); wire bytes {}",
        dedups.len(),
        sender_s.show(0),
        receiver_s.show(0),
        wire_s.show(0),
    );
    println!(
        "lag behind the primary (replica complete after the load's last commit): dedupwire {} s \
         (median (min–max) of {} runs), native subscription {:.1} s (one run)",
        lag_s.show(1),
        dedups.len(),
        native.total.saturating_sub(native.load).as_secs_f64()
    );
    println!(
        "dedupwire source cache: sender {:.1}% hits ({} / {}), receiver {:.1}% hits ({} / {}); \
         fallbacks (raw re-sends): sender {} entries in {} requests, receiver {}",
        enc_hits * 100.0,
        s.encode.cache_hits,
        s.encode.cache_hits + s.encode.cache_misses,
        dec_hits * 100.0,
        r.cache_hits.0,
        r.cache_hits.0 + r.cache_hits.1,
        s.raw_entries,
        s.raw_requests,
        r.fallbacks
    );
    println!(
        "primary load, rows/s, median (min–max) of {} interleaved runs: {} with no consumer, {} \
         with the dedupwire sender streaming ({}x of no consumer, run by run); {:.0} with the \
         native subscription (one run, {:.2}x the median with no consumer)",
        dedups.len(),
        base_s.show(0),
        dedup_s.show(0),
        ratio_s.show(2),
        rate(native.load),
        rate(native.load) / base_s.median
    );
    println!(
        "goal ≥10x fewer bytes than PostgreSQL logical replication: {:.1}x — {}",
        factor,
        if factor >= 10.0 { "MET" } else { "NOT MET" }
    );
    Ok(serde_json::json!({
        "workload": name,
        "changes": writes.len(),
        "inserts": count(Op::Insert),
        "updates": count(Op::Update),
        "deletes": count(Op::Delete),
        "rows_per_tx": args.rows_per_tx,
        "raw_document_bytes": raw,
        "rows": rows.iter().map(|r| serde_json::json!({
            "method": r.method, "bytes": r.bytes,
            "ratio_vs_raw": raw as f64 / r.bytes.max(1) as f64,
            "ratio_vs_native": native.wire as f64 / r.bytes.max(1) as f64,
        })).collect::<Vec<_>>(),
        "native": {
            "bytes": native.wire, "up": native.up, "down": native.down,
            "setup_bytes": native.setup, "connections": native.connections,
            "catch_up_s": native.total.as_secs_f64(),
        },
        "dedupwire": {
            "bytes": dedup.wire, "send": s, "receive": r,
            "runs": dedups.len(),
            "bytes_all": wire_s.json(&wires),
            "sender_cpu_s": dedup.sender_cpu, "receiver_cpu_s": dedup.receiver_cpu,
            "sender_mb_s_per_core": sender_s.json(&sender_mbs),
            "receiver_mb_s_per_core": receiver_s.json(&receiver_mbs),
            "sender_cache_hit_ratio": enc_hits, "receiver_cache_hit_ratio": dec_hits,
            "rows_verified": dedup.rows_checked,
            "catch_up_s": Spread::of(catch_ups.iter().copied()).json(&catch_ups),
            "lag_after_load_s": lag_s.json(&lags),
        },
        "native_lag_after_load_s": native.total.saturating_sub(native.load).as_secs_f64(),
        "load_rows_per_s": {
            "no_consumer": base_s.json(&base_rates),
            "dedupwire_sender": dedup_s.json(&dedup_rates),
            "dedupwire_ratio": ratio_s.json(&ratios),
            "native_subscription": rate(native.load),
            "native_ratio": rate(native.load) / base_s.median,
        },
        "fewer_bytes_than_native": factor,
        "goal_10x_met": factor >= 10.0,
    }))
}

/// Runs the replicate benchmark and prints one table per workload.
pub fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let mut workloads = Vec::new();
    for name in &args.workloads {
        let path = args.docs.join(format!("{name}.jsonl.zst"));
        let limit = if name == "rfcs" {
            args.rfcs_lines
        } else {
            None
        };
        workloads.push((name.clone(), load_writes(&path, limit)?));
    }
    let timeout = Duration::from_secs(args.timeout);
    let mut results = Vec::new();
    if !args.only_mongo {
        results.extend(run_postgres(&workloads, args)?);
    }
    if !args.skip_mongo {
        for (name, writes) in &workloads {
            results.push(mongo::run(name, writes, timeout)?);
        }
    }
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)?;
    }
    Ok(())
}

fn run_postgres(
    workloads: &[(String, Vec<Write1>)],
    args: &Args,
) -> Result<Vec<serde_json::Value>> {
    let bindir = find_bindir(args.pg_bindir.as_deref())?;
    let pg = PgServer::start(bindir, Duration::from_secs(args.timeout))?;
    let proxy = Proxy::start(pg.port())?;
    println!(
        "replicate: live PostgreSQL 127.0.0.1 replication, bytes on the wire (both directions); \
         body = whole JSON line; 'vs raw' / 'vs native' = that many times fewer bytes"
    );
    let mut results = Vec::new();
    for (name, writes) in workloads {
        results.push(run_workload(&pg, &proxy, name, writes, args)?);
    }
    drop(proxy);
    drop(pg);
    Ok(results)
}
