//! `dedupwire replicate send|receive` and `dedupwire key` end to end: the binaries over
//! loopback TCP between two databases of a throwaway PostgreSQL server, encrypted with a
//! shared key; a sender without the same key (or without any) is refused and the replica
//! gets nothing. Skips (passes with a SKIP notice) when PostgreSQL is not installed, except
//! under CI.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use dedupwire_replicate::pg::server::{find_bindir, PgServer};

const SLOT: &str = "dedupwire_cli_test";

fn dedupwire() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dedupwire"));
    c.env_remove("DEDUPWIRE_KEY");
    c
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "dedupwire-replicate-cli-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn generate_key(path: &Path) {
    let out = dedupwire()
        .args(["key", "generate"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn start_pg() -> Option<PgServer> {
    let bindir = match find_bindir(None) {
        Ok(b) => b,
        Err(msg) => {
            if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
                panic!("{msg}");
            }
            eprintln!("SKIP: {msg}");
            return None;
        }
    };
    let pg =
        PgServer::start(bindir, &[], Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    let mut admin = pg.client("postgres").unwrap();
    for db in ["src", "dst"] {
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .unwrap();
    }
    let mut src = pg.client("src").unwrap();
    for sql in [
        "CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL)".to_string(),
        format!("CREATE PUBLICATION {SLOT} FOR ALL TABLES"),
        format!("SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')"),
        "INSERT INTO docs SELECT 'doc' || i, repeat('secret document body ', 20) || i \
         FROM generate_series(1, 50) AS i"
            .to_string(),
    ] {
        src.batch_execute(&sql).unwrap();
    }
    Some(pg)
}

/// A running `replicate receive`: its address, and its stderr lines as they come.
struct Receiving {
    child: Child,
    addr: String,
    lines: mpsc::Receiver<String>,
}

impl Receiving {
    fn start(pg: &PgServer, key_args: &[&str]) -> Receiving {
        let mut child = dedupwire()
            .args(["replicate", "receive", "--listen", "127.0.0.1:0", "--into"])
            .arg(pg.url("dst"))
            .args(key_args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = lines.recv_timeout(Duration::from_secs(60)).unwrap();
        let addr = first
            .strip_prefix("dedupwire: receiving on ")
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .trim_end_matches(',')
            .to_string();
        Receiving { child, addr, lines }
    }

    /// The next stderr line (within a minute).
    fn next_line(&self) -> String {
        self.lines.recv_timeout(Duration::from_secs(60)).unwrap()
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn send(pg: &PgServer, to: &str, key_args: &[&str], env_key: Option<&str>) -> Output {
    let mut c = dedupwire();
    c.args([
        "replicate",
        "send",
        "--slot",
        SLOT,
        "--until-drained",
        "--from",
    ])
    .arg(pg.url("src"))
    .args(["--to", to])
    .args(key_args);
    if let Some(k) = env_key {
        c.env("DEDUPWIRE_KEY", k);
    }
    c.output().unwrap()
}

/// Tables of the replica database.
fn replica_tables(pg: &PgServer) -> Vec<String> {
    pg.client("dst")
        .unwrap()
        .query(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn only_a_sender_with_the_same_key_gets_through() {
    let Some(pg) = start_pg() else { return };
    let dir = tempdir();
    let (ours, theirs) = (dir.join("ours.key"), dir.join("theirs.key"));
    generate_key(&ours);
    generate_key(&theirs);
    let ours_arg = ours.to_str().unwrap();
    let receiver = Receiving::start(&pg, &["--key-file", ours_arg]);

    let out = send(
        &pg,
        &receiver.addr,
        &["--key-file", theirs.to_str().unwrap()],
        None,
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("secure handshake failed: authentication failed: the peer refused the handshake: it does not hold the same key"),
        "{err}"
    );
    let line = receiver.next_line();
    assert!(
        line.contains("refused: secure handshake failed: authentication failed: the peer does not hold the same key"),
        "{line}"
    );
    assert!(replica_tables(&pg).is_empty(), "the replica got nothing");

    let out = send(&pg, &receiver.addr, &["--insecure-plaintext"], None);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("this end accepts encrypted connections only") && err.contains("--key-file"),
        "{err}"
    );
    let line = receiver.next_line();
    assert!(
        line.contains("the peer speaks plaintext dedupwire"),
        "{line}"
    );
    assert!(replica_tables(&pg).is_empty(), "the replica got nothing");

    // The same key, from the environment this time: the file's text means the same key there.
    let hex = std::fs::read_to_string(&ours).unwrap();
    let out = send(&pg, &receiver.addr, &[], Some(hex.trim()));
    assert!(out.status.success(), "{}", stderr(&out));
    let line = receiver.next_line();
    assert!(line.contains("done: 50 changes"), "{line}");
    let n: i64 = pg
        .client("dst")
        .unwrap()
        .query_one(
            "SELECT count(*) FROM docs WHERE body LIKE 'secret document body%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 50);
    drop(receiver);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plaintext_both_ends_still_works_when_asked_for() {
    let Some(pg) = start_pg() else { return };
    let receiver = Receiving::start(&pg, &["--insecure-plaintext"]);
    let out = send(&pg, &receiver.addr, &[], None);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no key for the connection"),
        "{}",
        stderr(&out)
    );
    let out = send(&pg, &receiver.addr, &["--insecure-plaintext"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(receiver.next_line().contains("done: 50 changes"));
}

#[test]
fn without_a_key_send_and_receive_say_how_to_make_one() {
    for args in [
        &[
            "replicate",
            "send",
            "--from",
            "postgres://nowhere/db",
            "--to",
            "127.0.0.1:9",
        ][..],
        &[
            "replicate",
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--into",
            "postgres://nowhere/db",
        ],
    ] {
        let out = dedupwire().args(args).output().unwrap();
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(
            err.contains("dedupwire key generate KEYFILE")
                && err.contains("--key-file KEYFILE")
                && err.contains("DEDUPWIRE_KEY")
                && err.contains("--insecure-plaintext"),
            "{err}"
        );
    }
}

#[test]
fn key_generate_writes_a_private_file_once() {
    let dir = tempdir();
    let path = dir.join("k");
    generate_key(&path);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.trim().len(), 64);
    assert!(text.trim().bytes().all(|b| b.is_ascii_hexdigit()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let out = dedupwire()
        .args(["key", "generate"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "an existing key file is left alone");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    let id = |args: &[&str], env: Option<&str>| {
        let mut c = dedupwire();
        c.args(args);
        if let Some(e) = env {
            c.env("DEDUPWIRE_KEY", e);
        }
        String::from_utf8(c.output().unwrap().stdout).unwrap()
    };
    let from_file = id(&["key", "id", path.to_str().unwrap()], None);
    assert_eq!(from_file.trim().len(), 8);
    assert_eq!(id(&["key", "id"], Some(&text)), from_file);
    let printed = dedupwire().args(["key", "generate"]).output().unwrap();
    assert_eq!(String::from_utf8(printed.stdout).unwrap().trim().len(), 64);
    std::fs::remove_dir_all(&dir).unwrap();
}
