//! `dedupwire repo init`, `backup`, `restore`, `repo check|forget|prune|key` on an S3
//! repository (`s3:http://HOST:PORT/BUCKET/PREFIX`), as a user runs them, against a real S3
//! server (versitygw) that each test starts on a free port (`dedupwire_repo::s3server`). The
//! versitygw binary is built by `scripts/versitygw.sh` when missing; without it (no Go) the
//! tests fail and say so.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{noise, tree};

use dedupwire_repo::s3server::{find_binary, S3Server};

fn server() -> S3Server {
    let binary = find_binary(true).unwrap_or_else(|e| {
        panic!("the S3 tests need versitygw: run `bash scripts/versitygw.sh` (needs Go): {e}")
    });
    S3Server::start(&binary, Duration::from_secs(30)).unwrap()
}

/// The binary with the repository in `DEDUPWIRE_REPO` and the server's credentials.
fn dedupwire(server: &S3Server, url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dedupwire"));
    c.env("DEDUPWIRE_REPO", url)
        .env("DEDUPWIRE_PASSWORD", "an s3 test password")
        .env("DEDUPWIRE_TEST_KDF", "1")
        .env("DEDUPWIRE_S3_RETRY_SECONDS", "2")
        .envs(server.env());
    c
}

fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "failed: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

fn run(server: &S3Server, url: &str, args: &[&str]) -> Output {
    ok(dedupwire(server, url).args(args).output().unwrap())
}

/// A command that must fail: its stderr, checked for a panic.
fn fails(mut cmd: Command) -> String {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "succeeded: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.starts_with("dedupwire: error: "), "{err}");
    err
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dedupwire-s3-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn restored(target: &Path, src: &Path) -> PathBuf {
    target.join(src.strip_prefix("/").unwrap())
}

fn files_under(dir: &Path) -> usize {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .count(),
        Err(_) => 0,
    }
}

/// The README's path on an S3 repository: init, back up, change, back up, restore each
/// snapshot bit-exact, check every byte, keys, forget and prune; objects laid out as in a
/// local repository; requests counted.
#[test]
fn init_backup_twice_restore_check_prune_on_s3() {
    let server = server();
    let url = server.url("team/repo");
    let dir = tempdir("user");
    let src = dir.join("src");
    fs::create_dir_all(src.join("docs/empty")).unwrap();
    fs::write(src.join("docs/report.txt"), "a report\n".repeat(20_000)).unwrap();
    fs::write(src.join("video.raw"), noise(1, 20 << 20)).unwrap();
    fs::write(src.join("script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(src.join("script.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("docs/report.txt", src.join("latest-report")).unwrap();

    let init = json(&run(&server, &url, &["repo", "init", "--json"]));
    assert_eq!(init["id"].as_str().map(str::len), Some(32));
    let bucket = server.bucket_dir().join("team/repo");
    assert!(bucket.join("config").is_file());
    assert_eq!(files_under(&bucket.join("keys")), 1);
    let again = fails({
        let mut c = dedupwire(&server, &url);
        c.args(["repo", "init"]);
        c
    });
    assert!(again.contains("already holds a repository"), "{again}");

    let first = json(&run(
        &server,
        &url,
        &["backup", src.to_str().unwrap(), "--tag", "first", "--json"],
    ));
    let v1 = tree(&src);
    assert!(first["bytes_added"].as_u64().unwrap() > 20 << 20, "{first}");
    let packs: Vec<_> = fs::read_dir(bucket.join("data"))
        .unwrap()
        .flatten()
        .flat_map(|fan| fs::read_dir(fan.path()).unwrap().flatten())
        .collect();
    assert!(packs.len() >= 2, "{} packs", packs.len());
    for p in &packs {
        let name = p.file_name().into_string().unwrap();
        assert_eq!(
            p.path().parent().unwrap().file_name().unwrap().to_str(),
            Some(&name[..2])
        );
    }

    let mut text = "a report\n".repeat(20_000);
    text.insert_str(50_000, "an edit in the middle\n");
    fs::write(src.join("docs/report.txt"), text).unwrap();
    fs::remove_file(src.join("script.sh")).unwrap();
    let second = dedupwire(&server, &url)
        .args(["backup", src.to_str().unwrap(), "--json", "--request-stats"])
        .output()
        .unwrap();
    let stats = String::from_utf8_lossy(&ok(second.clone()).stderr).to_string();
    let second = json(&second);
    assert_eq!(second["files_changed"], 1, "{second}");
    assert!(
        second["bytes_added"].as_u64().unwrap() < 200_000,
        "an edit of one small file added {second}"
    );
    assert!(
        stats.contains(&format!("requests to {url}: list ")),
        "{stats}"
    );
    assert!(stats.contains("put "), "{stats}");
    let v2 = tree(&src);

    let list = json(&run(&server, &url, &["repo", "snapshots", "--json"]));
    assert_eq!(list.as_array().map(Vec::len), Some(2), "{list}");
    let first_id = first["snapshot_id"].as_str().unwrap();
    for (spec, want) in [(&first_id[..8], &v1), ("latest", &v2)] {
        let target = dir.join(format!("restore-{spec}"));
        run(
            &server,
            &url,
            &["restore", spec, "--target", target.to_str().unwrap()],
        );
        assert_eq!(&tree(&restored(&target, &src)), want, "snapshot {spec}");
        let _ = fs::remove_dir_all(&target);
    }
    let check = json(&run(
        &server,
        &url,
        &["repo", "check", "--read-data", "--json"],
    ));
    assert_eq!(check["errors"].as_array().map(Vec::len), Some(0), "{check}");

    let added = dedupwire(&server, &url)
        .env("DEDUPWIRE_NEW_PASSWORD", "second password")
        .args(["repo", "key", "add"])
        .output()
        .unwrap();
    ok(added);
    let keys = json(&run(&server, &url, &["repo", "key", "list", "--json"]));
    assert_eq!(keys.as_array().map(Vec::len), Some(2), "{keys}");

    fs::write(src.join("video.raw"), noise(2, 20 << 20)).unwrap();
    run(&server, &url, &["backup", src.to_str().unwrap(), "--quiet"]);
    let forgot = json(&run(
        &server,
        &url,
        &[
            "repo",
            "forget",
            "--keep-last",
            "1",
            "--prune",
            "--keep-delete",
            "0s",
            "--json",
        ],
    ));
    assert_eq!(
        forgot["forget"].as_array().map(Vec::len),
        Some(2),
        "{forgot}"
    );
    let check = json(&run(
        &server,
        &url,
        &["repo", "check", "--read-data", "--json"],
    ));
    assert_eq!(check["errors"].as_array().map(Vec::len), Some(0), "{check}");
    assert_eq!(check["snapshots"], 1, "{check}");
    let target = dir.join("restore-pruned");
    run(
        &server,
        &url,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(tree(&restored(&target, &src)), tree(&src));
    let stored: u64 = walk_size(&server.bucket_dir().join("team/repo/data"));
    assert!(stored < 30 << 20, "prune left {stored} bytes of packs");
    let _ = fs::remove_dir_all(&dir);
}

fn walk_size(dir: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(dir).unwrap().flatten() {
        let md = e.metadata().unwrap();
        total += if md.is_dir() {
            walk_size(&e.path())
        } else {
            md.len()
        };
    }
    total
}

/// The server dies while a backup uploads: the backup fails within seconds, naming the server;
/// once it is back, the repository checks clean and the next backup stores only what the
/// first did not.
#[test]
fn a_server_killed_mid_backup_is_a_clear_error_and_the_next_backup_reuses_what_was_stored() {
    let mut server = server();
    let url = server.url("killed");
    let dir = tempdir("kill");
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    for i in 0..10 {
        fs::write(src.join(format!("{i}.bin")), noise(100 + i, 8 << 20)).unwrap();
    }
    let total = 10 * (8u64 << 20);
    run(&server, &url, &["repo", "init"]);
    let index = server.bucket_dir().join("killed/index");
    let mut child = dedupwire(&server, &url)
        .args(["backup", src.to_str().unwrap(), "--quiet"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(120);
    while files_under(&index) == 0 {
        assert!(Instant::now() < until, "no pack stored in 2 minutes");
        assert!(child.try_wait().unwrap().is_none(), "the backup ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.kill();
    let killed = Instant::now();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the backup went on: {err}");
    assert!(
        killed.elapsed() < Duration::from_secs(60),
        "{:?}",
        killed.elapsed()
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(&format!(
            "cannot connect to the S3 server at {}",
            server.endpoint()
        )),
        "{err}"
    );

    let down = fails({
        let mut c = dedupwire(&server, &url);
        c.args(["repo", "snapshots"]);
        c
    });
    assert!(down.contains("(is it running?)"), "{down}");

    server.restart(Duration::from_secs(30)).unwrap();
    let check = json(&run(
        &server,
        &url,
        &["repo", "check", "--read-data", "--json"],
    ));
    assert_eq!(check["errors"].as_array().map(Vec::len), Some(0), "{check}");
    assert!(check["packs"].as_u64().unwrap() >= 1, "{check}");
    let last = json(&run(
        &server,
        &url,
        &["backup", src.to_str().unwrap(), "--json"],
    ));
    assert!(
        last["bytes_added"].as_u64().unwrap() < total - (8 << 20),
        "the backup after the restart stored everything again: {last}"
    );
    assert!(last["chunks_duplicate"].as_u64().unwrap() > 0, "{last}");
    let target = dir.join("out");
    run(
        &server,
        &url,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(tree(&restored(&target, &src)), tree(&src));
    let _ = fs::remove_dir_all(&dir);
}

/// A wrong secret key, an unknown bucket, a server that is not there and missing credentials
/// each get one line that says so, for every command.
#[test]
fn wrong_credentials_a_missing_bucket_or_server_are_clear_errors() {
    let server = server();
    let url = server.url("r");
    run(&server, &url, &["repo", "init"]);
    for args in [
        &["repo", "snapshots"][..],
        &["backup", "/etc/hostname"],
        &["repo", "init"],
    ] {
        let err = fails({
            let mut c = dedupwire(&server, &url);
            c.env("AWS_SECRET_ACCESS_KEY", "not the secret").args(args);
            c
        });
        assert!(err.contains("the secret key does not match"), "{err}");
        assert!(err.contains("AWS_SECRET_ACCESS_KEY"), "{err}");
        assert!(err.contains(&url), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let err = fails({
        let mut c = dedupwire(&server, &url.replace("/backups/", "/missing/"));
        c.args(["repo", "check"]);
        c
    });
    assert!(
        err.contains("the bucket missing does not exist at http://127.0.0.1:"),
        "{err}"
    );
    let err = fails({
        let mut c = dedupwire(&server, &url);
        c.env_remove("AWS_ACCESS_KEY_ID").args(["repo", "stats"]);
        c
    });
    assert!(
        err.contains("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        "{err}"
    );
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("s3:http://{}/backups/r", free.local_addr().unwrap());
    drop(free);
    let err = fails({
        let mut c = dedupwire(&server, &nowhere);
        c.args(["restore", "latest", "--target", "/tmp/never"]);
        c
    });
    assert!(err.contains("cannot connect to the S3 server at"), "{err}");
    let err = fails({
        let mut c = dedupwire(&server, &server.url("nothing-here"));
        c.args(["repo", "snapshots"]);
        c
    });
    assert!(err.contains("`dedupwire repo init` makes one"), "{err}");
}
