//! A private, throwaway S3 server (versitygw over a temporary directory) on a free loopback
//! port, with one bucket; killed and deleted on drop. For the tests and benchmarks of
//! [`crate::s3::S3Backend`], and for trying it out.
//!
//! The binary is versitygw v1.8.0, built from the Go module proxy by `scripts/versitygw.sh`
//! into `target/versitygw/versitygw` ([`find_binary`]).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The access key id of the server's root account.
pub const ACCESS_KEY_ID: &str = "dedupwire-test";
/// The secret key of the server's root account.
pub const SECRET_ACCESS_KEY: &str = "dedupwire-test-secret";
/// The bucket every server starts with.
pub const BUCKET: &str = "backups";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The versitygw binary: `$DEDUPWIRE_VERSITYGW`, else `target/versitygw/versitygw` in the
/// repository; when that is missing and `build` is set, builds it with
/// `scripts/versitygw.sh` (Go and the Go module proxy needed; 1.5-5 minutes on 2 cores). One
/// build at a time per process.
pub fn find_binary(build: bool) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("DEDUPWIRE_VERSITYGW") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "DEDUPWIRE_VERSITYGW={} is not a file",
                path.display()
            ))
        };
    }
    static BUILD: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let root = repo_root();
    let default = root.join("target/versitygw/versitygw");
    if default.is_file() {
        return Ok(default);
    }
    let script = root.join("scripts/versitygw.sh");
    if !build {
        return Err(format!(
            "no versitygw binary at {}: build it with `bash {}` (or set DEDUPWIRE_VERSITYGW)",
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
            "no versitygw binary: `bash {}` failed ({}): {}\nrun it by hand (it needs Go) or \
             set DEDUPWIRE_VERSITYGW",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(default)
}

/// A running versitygw with one bucket ([`BUCKET`]); killed and deleted on drop.
pub struct S3Server {
    child: Option<Child>,
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl std::fmt::Debug for S3Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Server")
            .field("port", &self.port)
            .field("dir", &self.dir)
            .finish()
    }
}

impl S3Server {
    /// Starts `binary` on a free loopback port over a new temporary directory holding the
    /// bucket, and waits up to `timeout` for it to accept connections.
    pub fn start(binary: &Path, timeout: Duration) -> Result<S3Server, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| format!("a free loopback port: {e}"))?;
            let dir = temp_dir()?;
            std::fs::create_dir_all(dir.join("root").join(BUCKET))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            let mut server = S3Server {
                child: None,
                binary: binary.to_path_buf(),
                dir,
                port,
            };
            server.run()?;
            match server.wait_ready(timeout) {
                Ok(()) => return Ok(server),
                Err(e) if e.contains("address already in use") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    fn run(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("versitygw.log"))
            .map_err(|e| format!("server log: {e}"))?;
        let child = Command::new(&self.binary)
            .env("ROOT_ACCESS_KEY_ID", ACCESS_KEY_ID)
            .env("ROOT_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
            .arg("--port")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--quiet")
            .arg("posix")
            .arg(self.dir.join("root"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| format!("server log: {e}"))?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("run {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("versitygw exited ({status}):\n{}", self.log()));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "versitygw did not accept connections within {timeout:?}:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the server (as a crash would); its objects stay.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again (after [`S3Server::kill`], or killing it first) on the same
    /// port and objects.
    pub fn restart(&mut self, timeout: Duration) -> Result<(), String> {
        self.kill();
        self.run()?;
        self.wait_ready(timeout)
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("versitygw.log")).unwrap_or_default()
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A repository location in the bucket: `s3:http://127.0.0.1:PORT/backups/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3:{}/{BUCKET}/{prefix}", self.endpoint())
    }

    /// The bucket's directory: objects are files under it, by key.
    pub fn bucket_dir(&self) -> PathBuf {
        self.dir.join("root").join(BUCKET)
    }

    /// The variables that give a client this server's credentials.
    pub fn env(&self) -> [(&'static str, &'static str); 3] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn temp_dir() -> Result<PathBuf, String> {
    let mut salt = [0u8; 8];
    getrandom::fill(&mut salt).map_err(|e| format!("random: {e}"))?;
    let dir = std::env::temp_dir().join(format!(
        "dedupwire-versitygw-{}-{}",
        std::process::id(),
        hex::encode(salt)
    ));
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}
