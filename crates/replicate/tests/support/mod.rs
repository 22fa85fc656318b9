//! Throwaway PostgreSQL servers for the tests (`dedupwire_replicate::pg::server`). When the
//! binaries are missing a test prints a SKIP notice and passes, except under CI (`CI` set),
//! where it fails.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use dedupwire_replicate::pg::server;

/// A running server (the library's), with the tests' panicking conveniences.
pub struct PgServer(server::PgServer);

/// Starts a server with `wal_level=logical`, or returns `None` (after printing SKIP) when
/// PostgreSQL is not installed and CI is not set. Panics under CI when it is missing.
pub fn start() -> Option<PgServer> {
    start_with(&[])
}

/// Like [`start`], with these `-c name=value` settings.
pub fn start_with(settings: &[(&str, &str)]) -> Option<PgServer> {
    let bindir = match server::find_bindir(None) {
        Ok(b) => b,
        Err(msg) => {
            if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
                panic!("{msg}");
            }
            eprintln!("SKIP: {msg}");
            return None;
        }
    };
    let s = server::PgServer::start(bindir, settings, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    Some(PgServer(s))
}

impl PgServer {
    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.0.port()
    }

    /// The socket directory (also the server's temporary directory).
    pub fn dir(&self) -> &std::path::Path {
        self.0.dir()
    }

    /// A connection string for database `db` as the superuser `postgres`.
    pub fn url(&self, db: &str) -> String {
        self.0.url(db)
    }

    /// A client of database `db`.
    pub fn client(&self, db: &str) -> postgres::Client {
        self.0
            .client(db)
            .unwrap_or_else(|e| panic!("connect to {db}: {e}"))
    }

    /// Creates database `name` and returns its connection string.
    pub fn create_database(&self, name: &str) -> String {
        self.client("postgres")
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        self.url(name)
    }
}

// ---- Helpers of the live replication tests (tests/live_*.rs) ----

/// The random seed of a kill test: `$LIVE_SEED` to replay a failure, else the clock (printed).
pub fn seed() -> u64 {
    let seed = std::env::var("LIVE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("LIVE_SEED={seed}");
    seed
}

/// A stream that fails every read and write once `budget` bytes have gone through it (both
/// directions counted): a process killed in the middle of a conversation.
pub struct Faulty<S> {
    inner: S,
    budget: Option<u64>,
    used: u64,
}

/// The error a [`Faulty`] stream injects.
pub const INJECTED: &str = "injected fault";

impl<S> Faulty<S> {
    /// Passes `budget` bytes (all when `None`), then fails.
    pub fn new(inner: S, budget: Option<u64>) -> Self {
        Faulty {
            inner,
            budget,
            used: 0,
        }
    }

    /// How many more bytes may pass.
    fn room(&self, want: usize) -> std::io::Result<usize> {
        match self.budget {
            None => Ok(want),
            Some(b) if self.used >= b => Err(std::io::Error::other(INJECTED)),
            Some(b) => Ok(want.min((b - self.used) as usize)),
        }
    }
}

impl<S: std::io::Read> std::io::Read for Faulty<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.room(buf.len())?;
        let got = self.inner.read(&mut buf[..n])?;
        self.used += got as u64;
        Ok(got)
    }
}

impl<S: std::io::Write> std::io::Write for Faulty<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.room(buf.len())?;
        let put = self.inner.write(&buf[..n])?;
        self.used += put as u64;
        Ok(put)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// True when `e` is the error a [`Faulty`] stream injected.
pub fn is_injected(e: &dyn std::error::Error) -> bool {
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = cur {
        if err.to_string().contains(INJECTED) {
            return true;
        }
        cur = err.source();
    }
    false
}

/// One write of a document revision stream (`{"op","_id",...}` lines).
#[derive(Debug, Clone)]
pub struct DocWrite {
    /// insert, update or delete.
    pub op: dedupwire_replicate::Op,
    /// The document's `_id`.
    pub id: String,
    /// The whole line: the document stored.
    pub doc: Vec<u8>,
}

/// The first `n` lines of `../shared/data/rfcs.jsonl.zst` as writes, or `None` (after
/// printing SKIP) when the file is missing and CI is not set.
pub fn rfcs_writes(n: usize) -> Option<Vec<DocWrite>> {
    use std::io::BufRead;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/rfcs.jsonl.zst");
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{} is needed: {e}",
                path.display()
            );
            eprintln!("SKIP: {} not found: {e}", path.display());
            return None;
        }
    };
    let reader = std::io::BufReader::new(zstd::Decoder::new(file).expect("zstd stream"));
    let mut out = Vec::with_capacity(n);
    for (i, line) in reader.split(b'\n').take(n).enumerate() {
        let line = line.expect("read rfcs.jsonl.zst");
        let c = dedupwire_replicate::jsonl::parse_line(&line, i as u64 + 1).expect("a change line");
        out.push(DocWrite {
            op: c.op,
            id: c.id,
            doc: line,
        });
    }
    Some(out)
}
