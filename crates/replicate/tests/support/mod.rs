//! Throwaway PostgreSQL servers for the tests: `initdb` into a temporary directory, `pg_ctl
//! start` on a free loopback port, `pg_ctl stop -m immediate` on drop.
//!
//! The server binaries are taken from `$PG_BINDIR`, else `/usr/lib/postgresql/15/bin` (Debian's
//! `postgresql-15`), else the newest `/usr/lib/postgresql/*/bin`; the wal2json plugin must be in
//! the `lib` directory beside it (`postgresql-15-wal2json`). When they are missing a test prints
//! a SKIP notice and passes, except under CI (`CI` set), where it fails.
//!
//! PostgreSQL refuses to run as root: as root, the server runs as the `postgres` user (or
//! `nobody`), which gets the temporary directory.
#![allow(dead_code)]

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What CI must install for these tests.
pub const PACKAGES: &str = "postgresql-15 postgresql-15-wal2json";

/// A running server; stopped and deleted on drop.
pub struct PgServer {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    /// uid and gid to run the server as (when the tests run as root).
    run_as: Option<(u32, u32)>,
    port: u16,
}

/// Finds the server binaries and wal2json, or says what is missing.
fn find_bindir() -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        candidates.push(PathBuf::from(dir));
    }
    candidates.push(PathBuf::from("/usr/lib/postgresql/15/bin"));
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev().map(|(_, p)| p));
    }
    let mut missing = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for bin in candidates {
        if !seen.insert(bin.clone()) {
            continue;
        }
        let has = |name: &str| bin.join(name).is_file();
        if !(has("postgres") && has("initdb") && has("pg_ctl")) {
            missing.push(format!("no PostgreSQL server in {}", bin.display()));
            continue;
        }
        let lib = bin.parent().map(|p| p.join("lib")).unwrap_or_default();
        if !lib.join("wal2json.so").is_file() {
            missing.push(format!("no wal2json.so in {}", lib.display()));
            continue;
        }
        return Ok(bin);
    }
    Err(missing.join("; "))
}

/// Starts a server with `wal_level=logical`, or returns `None` (after printing SKIP) when
/// PostgreSQL is not installed and CI is not set. Panics under CI when it is missing.
pub fn start() -> Option<PgServer> {
    start_with(&[("wal_level", "logical")])
}

/// Like [`start`], with these `-c name=value` settings.
pub fn start_with(settings: &[(&str, &str)]) -> Option<PgServer> {
    let bindir = match find_bindir() {
        Ok(b) => b,
        Err(why) => {
            let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
            let msg = format!(
                "PostgreSQL server binaries with wal2json are needed ({why}): \
                 install them with `apt-get install -y {PACKAGES}` (or set PG_BINDIR)"
            );
            if ci {
                panic!("{msg}");
            }
            eprintln!("SKIP: {msg}");
            return None;
        }
    };
    Some(PgServer::start(bindir, settings))
}

fn run_as_ids() -> Option<(u32, u32)> {
    let euid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    if euid != 0 {
        return None;
    }
    for user in ["postgres", "nobody"] {
        let id = |flag: &str| -> Option<u32> {
            let out = Command::new("id").arg(flag).arg(user).output().ok()?;
            if !out.status.success() {
                return None;
            }
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        if let (Some(uid), Some(gid)) = (id("-u"), id("-g")) {
            return Some((uid, gid));
        }
    }
    panic!(
        "running as root, and neither user postgres nor nobody exists to run the PostgreSQL server"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl PgServer {
    fn start(bindir: PathBuf, settings: &[(&str, &str)]) -> PgServer {
        let run_as = run_as_ids();
        let dir = tempfile::Builder::new()
            .prefix("dedupwire-pg-")
            .tempdir()
            .expect("temporary directory");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .expect("chown the server directory");
        }
        let mut server = PgServer {
            dir,
            bindir,
            run_as,
            port: 0,
        };
        let out = server
            .command("initdb")
            .arg("-D")
            .arg(server.data_dir())
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ])
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb failed: {}", describe(&out));
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut options = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off \
                 -c max_replication_slots=10 -c max_connections=40",
                server.dir.path().display()
            );
            for (name, value) in settings {
                options.push_str(&format!(" -c {name}={value}"));
            }
            let out = server
                .command("pg_ctl")
                .arg("-D")
                .arg(server.data_dir())
                .arg("-l")
                .arg(server.log_file())
                .args(["-w", "-t", "60", "-o", &options, "start"])
                .output()
                .expect("run pg_ctl start");
            if out.status.success() {
                server.port = port;
                return server;
            }
            let log = std::fs::read_to_string(server.log_file()).unwrap_or_default();
            last = format!("{}\nserver log:\n{log}", describe(&out));
            if !log.contains("could not bind") && !log.contains("already in use") {
                break;
            }
        }
        panic!("could not start PostgreSQL: {last}");
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// A server program, run as the server's user.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(program));
        cmd.current_dir(self.dir.path())
            .env("LC_ALL", "C")
            .env_remove("PGDATA")
            .env_remove("PGPORT")
            .env_remove("PGHOST");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket directory (also the server's temporary directory).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A connection string for database `db` as the superuser `postgres`.
    pub fn url(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    /// A client of database `db`.
    pub fn client(&self, db: &str) -> postgres::Client {
        postgres::Client::connect(&self.url(db), postgres::NoTls)
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

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.port == 0 {
            return;
        }
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .output();
    }
}

// ---- Helpers of the live replication tests (tests/live_*.rs) ----

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
