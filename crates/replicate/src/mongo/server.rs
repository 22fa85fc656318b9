//! A private, throwaway FerretDB server (MongoDB protocol, SQLite storage in a temporary
//! directory) with an oplog, on a free loopback port; killed on drop. For the tests and
//! benchmarks that need a real MongoDB-protocol server, and for trying dedupwire out.
//!
//! The binary is FerretDB v1.24.0, built from the Go module proxy by `scripts/ferretdb.sh`
//! into `target/ferretdb/ferretdb` ([`find_binary`]).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mongodb::bson::doc;

/// The oplog's size in bytes (a capped collection).
pub const OPLOG_BYTES: i64 = 1 << 30;

/// The repository's root (where `scripts/ferretdb.sh` is).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The FerretDB binary: `$DEDUPWIRE_FERRETDB`, else `target/ferretdb/ferretdb` in the
/// repository; when that is missing and `build` is set, builds it with `scripts/ferretdb.sh`
/// (Go and the Go module proxy needed; about a minute). One build at a time per process.
pub fn find_binary(build: bool) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("DEDUPWIRE_FERRETDB") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "DEDUPWIRE_FERRETDB={} is not a file",
                path.display()
            ))
        };
    }
    static BUILD: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let root = repo_root();
    let default = root.join("target/ferretdb/ferretdb");
    if default.is_file() {
        return Ok(default);
    }
    let script = root.join("scripts/ferretdb.sh");
    if !build {
        return Err(format!(
            "no FerretDB binary at {}: build it with {} (or set DEDUPWIRE_FERRETDB)",
            default.display(),
            script.display()
        ));
    }
    let out = Command::new("bash")
        .arg(&script)
        .current_dir(&root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if !out.status.success() || !default.is_file() {
        return Err(format!(
            "{} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(default)
}

/// A running FerretDB server with an oplog; killed and deleted on drop.
pub struct FerretServer {
    child: Child,
    binary: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

impl std::fmt::Debug for FerretServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FerretServer")
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl FerretServer {
    /// Starts `binary` on a free loopback port with its data in a temporary directory, waits
    /// up to `timeout` for it to accept connections, and creates the capped `local.oplog.rs`
    /// ([`OPLOG_BYTES`]) so that writes from then on are logged.
    pub fn start(binary: &Path, timeout: Duration) -> Result<FerretServer, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let mut server = Self::spawn(binary)?;
            match server.wait_ready(timeout) {
                Ok(()) => {
                    server.create_oplog()?;
                    return Ok(server);
                }
                Err(e) if e.contains("address already in use") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Starts the process on a port that was free a moment ago.
    fn spawn(binary: &Path) -> Result<FerretServer, String> {
        let dir = tempfile::Builder::new()
            .prefix("dedupwire-ferretdb-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("a free loopback port: {e}"))?;
        let child = Self::run(binary, dir.path(), port)?;
        Ok(FerretServer {
            child,
            binary: binary.to_path_buf(),
            dir,
            port,
        })
    }

    /// The server process on `port` with its data in `dir`, its output appended to the log.
    fn run(binary: &Path, dir: &Path, port: u16) -> Result<Child, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("ferretdb.log"))
            .map_err(|e| format!("server log: {e}"))?;
        Command::new(binary)
            .arg("--handler=sqlite")
            .arg(format!("--sqlite-url=file:{}/", dir.display()))
            .arg(format!("--listen-addr=127.0.0.1:{port}"))
            .arg(format!("--state-dir={}", dir.display()))
            .args(["--telemetry=disable", "--debug-addr=-", "--log-level=warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| format!("server log: {e}"))?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("run {}: {e}", binary.display()))
    }

    /// Kills the server and starts it again on the same port and data, as a crash and a
    /// restart would: its cursors and connections are gone, its documents and oplog stay.
    pub fn restart(&mut self, timeout: Duration) -> Result<(), String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::run(&self.binary, self.dir.path(), self.port)?;
        self.wait_ready(timeout)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferretdb.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let until = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("FerretDB exited ({status}):\n{}", self.log()));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "FerretDB did not accept connections within {timeout:?}:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn create_oplog(&self) -> Result<(), String> {
        self.client()?
            .database("local")
            .run_command(doc! {"create": "oplog.rs", "capped": true, "size": OPLOG_BYTES})
            .run()
            .map(drop)
            .map_err(|e| format!("creating local.oplog.rs: {e}"))
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's temporary directory (SQLite files, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `mongodb://127.0.0.1:PORT/` plus `db` (empty for none).
    pub fn url(&self, db: &str) -> String {
        format!("mongodb://127.0.0.1:{}/{db}", self.port)
    }

    /// A client of this server.
    pub fn client(&self) -> Result<mongodb::sync::Client, String> {
        mongodb::sync::Client::with_uri_str(self.url(""))
            .map_err(|e| format!("connect to FerretDB on port {}: {e}", self.port))
    }
}

impl Drop for FerretServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
