//! A private, throwaway PostgreSQL server: `initdb` into a temporary directory, `pg_ctl start`
//! on a free loopback port with logical decoding on, `pg_ctl stop -m immediate` on drop. For
//! the tests and benchmarks that need a real database, and for trying dedupwire out.
//!
//! PostgreSQL refuses to run as root: as root, the server runs as the `postgres` user (or
//! `nobody`), which is given the temporary directory.

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The Debian package that provides the server (its built-in pgoutput plugin is all a source
/// needs; `postgresql-15-wal2json` adds the optional wal2json plugin).
pub const PACKAGES: &str = "postgresql-15";

/// A running server; stopped and deleted on drop.
pub struct PgServer {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
}

/// Finds server binaries: `explicit`, else `$PG_BINDIR`, else
/// `/usr/lib/postgresql/15/bin`, else the newest `/usr/lib/postgresql/*/bin`; or says what is
/// missing and how to install it.
pub fn find_bindir(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = explicit.map(Path::to_path_buf).into_iter().collect();
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
        return Ok(bin);
    }
    Err(format!(
        "PostgreSQL server binaries are needed ({}): install them with \
         `apt-get install -y {PACKAGES}` (or set PG_BINDIR)",
        missing.join("; ")
    ))
}

fn run_as_ids() -> Result<Option<(u32, u32)>, String> {
    let euid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    if euid != 0 {
        return Ok(None);
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
            return Ok(Some((uid, gid)));
        }
    }
    Err("running as root, and neither user postgres nor nobody exists to run PostgreSQL".into())
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
    /// Creates and starts a server (`wal_level=logical`, durability off: it is throwaway),
    /// with `settings` as extra `-c name=value` options that override the defaults; waits up to
    /// `timeout` for it to accept connections.
    pub fn start(
        bindir: PathBuf,
        settings: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<PgServer, String> {
        let run_as = run_as_ids()?;
        let dir = tempfile::Builder::new()
            .prefix("dedupwire-pg-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("chown the server directory: {e}"))?;
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
            .map_err(|e| format!("run initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!("initdb failed: {}", describe(&out)));
        }
        let mut last = String::new();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| format!("a free loopback port: {e}"))?;
            let mut options = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
                 -c full_page_writes=off -c wal_level=logical -c max_replication_slots=20 \
                 -c max_wal_senders=20 -c max_connections=60 -c max_worker_processes=16 \
                 -c max_logical_replication_workers=8",
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
                .args([
                    "-w",
                    "-t",
                    &timeout.as_secs().max(10).to_string(),
                    "-o",
                    &options,
                    "start",
                ])
                .output()
                .map_err(|e| format!("run pg_ctl start: {e}"))?;
            if out.status.success() {
                server.port = port;
                return Ok(server);
            }
            let log = std::fs::read_to_string(server.log_file()).unwrap_or_default();
            last = format!("{}\nserver log:\n{log}", describe(&out));
            if !log.contains("could not bind") && !log.contains("already in use") {
                break;
            }
        }
        Err(format!("could not start PostgreSQL: {last}"))
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

    /// A connection string for database `db` on `port` (the server's, or a proxy's) as the
    /// superuser `postgres`.
    pub fn conninfo(port: u16, db: &str) -> String {
        format!("host=127.0.0.1 port={port} user=postgres dbname={db}")
    }

    /// A connection string for database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        Self::conninfo(self.port, db)
    }

    /// A client of database `db`.
    pub fn client(&self, db: &str) -> Result<postgres::Client, postgres::Error> {
        postgres::Client::connect(&self.url(db), postgres::NoTls)
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
