//! `dedupwire repo init`, `backup`, `restore`, `repo snapshots|ls|check|stats` as a user runs
//! them: the real binary on real directories. A backup killed at random moments leaves a
//! repository that checks clean, and the next backup reuses what it stored; two backups into
//! one repository at once both land.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;

use common::{noise, tree};

fn dedupwire(repo: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dedupwire"));
    c.env("DEDUPWIRE_REPO", repo)
        .env("XDG_CACHE_HOME", repo.with_extension("cache"))
        .env("DEDUPWIRE_PASSWORD", "a test password")
        .env("DEDUPWIRE_TEST_KDF", "1");
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

fn run(repo: &Path, args: &[&str]) -> Output {
    ok(dedupwire(repo).args(args).output().unwrap())
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dedupwire-backup-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn restored(target: &Path, src: &Path) -> PathBuf {
    target.join(src.strip_prefix("/").unwrap())
}

/// What the README tells a new user to do: init, back up, change, back up, list, restore
/// each snapshot bit-exact, check.
#[test]
fn a_new_user_backs_up_twice_and_restores_each_version() {
    let dir = tempdir("user");
    let (src, repo) = (dir.join("src"), dir.join("repo"));
    fs::create_dir_all(src.join("docs/empty")).unwrap();
    fs::write(src.join("docs/report.txt"), "a report\n".repeat(20_000)).unwrap();
    fs::write(src.join("photo.raw"), noise(1, 500_000)).unwrap();
    fs::write(src.join("script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(src.join("script.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("docs/report.txt", src.join("latest-report")).unwrap();

    let init = json(&run(&repo, &["repo", "init", "--json"]));
    assert_eq!(init["id"].as_str().map(str::len), Some(32));
    let first = json(&run(
        &repo,
        &["backup", src.to_str().unwrap(), "--tag", "first", "--json"],
    ));
    let v1 = tree(&src);
    let mut text = "a report\n".repeat(20_000);
    text.insert_str(50_000, "an edit in the middle\n");
    fs::write(src.join("docs/report.txt"), text).unwrap();
    fs::remove_file(src.join("script.sh")).unwrap();
    let second = json(&run(&repo, &["backup", src.to_str().unwrap(), "--json"]));
    assert_eq!(second["files_changed"], 1, "{second}");
    assert_eq!(second["files_unchanged"], 1, "{second}");
    assert!(
        second["bytes_added"].as_u64().unwrap() < 8_000,
        "an edit of one file added {second}"
    );
    let v2 = tree(&src);

    let list = json(&run(&repo, &["repo", "snapshots", "--json"]));
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            first["snapshot_id"].as_str().unwrap(),
            second["snapshot_id"].as_str().unwrap()
        ]
    );
    assert_eq!(list[0]["tags"][0], "first");
    assert_eq!(list[0]["paths"][0], src.to_str().unwrap());
    for (spec, want) in [(&ids[0][..8], &v1), ("latest", &v2)] {
        let target = dir.join(format!("restore-{spec}"));
        run(
            &repo,
            &["restore", spec, "--target", target.to_str().unwrap()],
        );
        assert_eq!(&tree(&restored(&target, &src)), want, "snapshot {spec}");
    }
    let only = dir.join("only-docs");
    let docs = src.join("docs");
    run(
        &repo,
        &[
            "restore",
            "latest",
            "--target",
            only.to_str().unwrap(),
            "--include",
            docs.to_str().unwrap(),
        ],
    );
    assert!(restored(&only, &src).join("docs/report.txt").exists());
    assert!(!restored(&only, &src).join("photo.raw").exists());
    let ls = String::from_utf8(run(&repo, &["repo", "ls", "latest"]).stdout).unwrap();
    assert!(
        ls.contains("docs/report.txt") && ls.contains("latest-report"),
        "{ls}"
    );
    let check = json(&run(&repo, &["repo", "check", "--read-data", "--json"]));
    assert_eq!(check["errors"].as_array().map(Vec::len), Some(0), "{check}");
    let stats = json(&run(&repo, &["repo", "stats", "--json"]));
    assert_eq!(stats["snapshots"], 2);

    let wrong = dedupwire(&repo)
        .env("DEDUPWIRE_PASSWORD", "not it")
        .args(["repo", "snapshots"])
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("wrong password"));
    let _ = fs::remove_dir_all(&dir);
}

/// kill -9 of a backup at random moments: the repository checks clean every time (packs of
/// the killed run that made it into no index are reported as harmless), and the backup that
/// finishes stores less than the whole tree, having reused the killed runs' packs.
#[test]
fn a_killed_backup_leaves_a_valid_repository_and_the_next_reuses_its_packs() {
    let dir = tempdir("kill");
    let (src, repo) = (dir.join("src"), dir.join("repo"));
    fs::create_dir_all(&src).unwrap();
    for i in 0..12 {
        fs::write(src.join(format!("{i}.bin")), noise(100 + i, 6 << 20)).unwrap();
    }
    let total = 12 * (6u64 << 20);
    // How long a whole backup takes here, so that the kills land inside one.
    let scratch = dir.join("scratch");
    run(&scratch, &["repo", "init"]);
    let started = std::time::Instant::now();
    run(&scratch, &["backup", src.to_str().unwrap(), "--quiet"]);
    let whole = started.elapsed();
    run(&repo, &["repo", "init"]);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    eprintln!("seed {seed}, a whole backup takes {whole:?}");
    let mut stored_packs = 0;
    for round in 0..4u64 {
        let mut child = dedupwire(&repo)
            .args(["backup", src.to_str().unwrap(), "--quiet", "--force-read"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let share = 0.05 + (seed.wrapping_mul(round * 2 + 7) % 850) as f64 / 1000.0;
        std::thread::sleep(whole.mul_f64(share));
        let _ = child.kill();
        child.wait().unwrap();
        let check = json(&run(&repo, &["repo", "check", "--read-data", "--json"]));
        assert_eq!(
            check["errors"].as_array().map(Vec::len),
            Some(0),
            "after a kill: {check}"
        );
        stored_packs = check["packs"].as_u64().unwrap();
    }
    let last = json(&run(
        &repo,
        &["backup", src.to_str().unwrap(), "--json", "--force-read"],
    ));
    if stored_packs > 0 {
        assert!(
            last["bytes_added"].as_u64().unwrap() < total,
            "the finishing backup stored everything again: {last}"
        );
        assert!(last["chunks_duplicate"].as_u64().unwrap() > 0, "{last}");
    }
    let target = dir.join("out");
    run(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(tree(&restored(&target, &src)), tree(&src));
    let _ = fs::remove_dir_all(&dir);
}

/// forget, then prune killed at random moments: after every kill the repository checks clean
/// and the kept snapshot restores exactly; a prune run to the end frees the forgotten data.
#[test]
fn a_killed_prune_loses_nothing_and_a_finished_one_frees_space() {
    let dir = tempdir("prune-kill");
    let (src, repo) = (dir.join("src"), dir.join("repo"));
    fs::create_dir_all(&src).unwrap();
    run(&repo, &["repo", "init"]);
    for v in 0..3u64 {
        fs::write(src.join("big"), noise(200 + v, 12 << 20)).unwrap();
        fs::write(src.join("steady"), noise(7, 4 << 20)).unwrap();
        run(&repo, &["backup", src.to_str().unwrap(), "--quiet"]);
    }
    let forgot = json(&run(
        &repo,
        &["repo", "forget", "--keep-last", "1", "--json"],
    ));
    assert_eq!(
        forgot["forget"].as_array().map(Vec::len),
        Some(2),
        "{forgot}"
    );
    let size = |p: &Path| -> u64 {
        let out = Command::new("du").args(["-sb"]).arg(p).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let before = size(&repo);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    eprintln!("seed {seed}");
    for round in 0..4u64 {
        let mut child = dedupwire(&repo)
            .args(["repo", "prune", "--repack-below", "1"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(
            20 + seed.wrapping_mul(round + 3) % 700,
        ));
        let _ = child.kill();
        child.wait().unwrap();
        let check = json(&run(&repo, &["repo", "check", "--read-data", "--json"]));
        assert_eq!(
            check["errors"].as_array().map(Vec::len),
            Some(0),
            "round {round}: {check}"
        );
        let target = dir.join(format!("out-{round}"));
        run(
            &repo,
            &["restore", "latest", "--target", target.to_str().unwrap()],
        );
        assert_eq!(tree(&restored(&target, &src)), tree(&src), "round {round}");
        let _ = fs::remove_dir_all(&target);
    }
    // Every partly used pack rewritten: what is left is the kept snapshot's data.
    run(
        &repo,
        &[
            "repo",
            "prune",
            "--repack-below",
            "1",
            "--keep-delete",
            "0s",
        ],
    );
    let check = json(&run(&repo, &["repo", "check", "--read-data", "--json"]));
    assert_eq!(check["errors"].as_array().map(Vec::len), Some(0), "{check}");
    assert_eq!(check["unindexed_packs"], 0, "{check}");
    let after = size(&repo);
    assert!(after < before / 2, "prune left {after} of {before} bytes");
    let _ = fs::remove_dir_all(&dir);
}

/// Passwords: a second key opens the repository; the key in use cannot be removed; passwd
/// replaces the current one, after which the old password is refused.
#[test]
fn keys_are_added_listed_removed_and_changed() {
    let dir = tempdir("keys");
    let repo = dir.join("repo");
    run(&repo, &["repo", "init"]);
    let with = |pw: &str, args: &[&str]| {
        dedupwire(&repo)
            .env("DEDUPWIRE_PASSWORD", pw)
            .args(args)
            .output()
            .unwrap()
    };
    ok(dedupwire(&repo)
        .env("DEDUPWIRE_NEW_PASSWORD", "second password")
        .args(["repo", "key", "add"])
        .output()
        .unwrap());
    let keys = json(&ok(with(
        "second password",
        &["repo", "key", "list", "--json"],
    )));
    let keys = keys.as_array().unwrap();
    assert_eq!(keys.len(), 2);
    let current: Vec<&str> = keys
        .iter()
        .filter(|k| k["current"] == true)
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    assert_eq!(current.len(), 1);
    let refused = with("second password", &["repo", "key", "remove", current[0]]);
    assert!(!refused.status.success());
    let first = keys.iter().find(|k| k["current"] == false).unwrap()["id"]
        .as_str()
        .unwrap();
    ok(with(
        "second password",
        &["repo", "key", "remove", &first[..8]],
    ));
    assert!(!with("a test password", &["repo", "snapshots"])
        .status
        .success());
    ok(dedupwire(&repo)
        .env("DEDUPWIRE_PASSWORD", "second password")
        .env("DEDUPWIRE_NEW_PASSWORD", "third password")
        .args(["repo", "key", "passwd"])
        .output()
        .unwrap());
    assert!(!with("second password", &["repo", "snapshots"])
        .status
        .success());
    ok(with("third password", &["repo", "snapshots"]));
    let _ = fs::remove_dir_all(&dir);
}

/// diff names what was added, removed, modified and only touched between two snapshots.
#[test]
fn diff_names_each_change() {
    let dir = tempdir("diff");
    let (src, repo) = (dir.join("src"), dir.join("repo"));
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("same"), b"same").unwrap();
    fs::write(src.join("edited"), b"v1").unwrap();
    fs::write(src.join("gone"), b"bye").unwrap();
    fs::write(src.join("touched"), b"t").unwrap();
    run(&repo, &["repo", "init"]);
    let a = json(&run(&repo, &["backup", src.to_str().unwrap(), "--json"]));
    fs::write(src.join("edited"), b"v2").unwrap();
    fs::remove_file(src.join("gone")).unwrap();
    fs::write(src.join("sub/new"), b"new").unwrap();
    fs::set_permissions(src.join("touched"), fs::Permissions::from_mode(0o600)).unwrap();
    let b = json(&run(&repo, &["backup", src.to_str().unwrap(), "--json"]));
    let out = run(
        &repo,
        &[
            "repo",
            "diff",
            a["snapshot_id"].as_str().unwrap(),
            b["snapshot_id"].as_str().unwrap(),
        ],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let root = src.to_str().unwrap();
    for line in [
        format!("M {root}/edited"),
        format!("- {root}/gone"),
        format!("+ {root}/sub/new"),
        format!("U {root}/touched"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
    }
    assert!(!text.contains("/same"), "{text}");
    let _ = fs::remove_dir_all(&dir);
}

/// Two backups into one repository at the same moment both land and both restore.
#[test]
fn two_backups_at_once_both_land() {
    let dir = tempdir("two");
    let repo = dir.join("repo");
    let (a, b) = (dir.join("a"), dir.join("b"));
    for (d, seed) in [(&a, 1), (&b, 2)] {
        fs::create_dir_all(d).unwrap();
        for i in 0..4 {
            fs::write(d.join(format!("{i}")), noise(seed * 10 + i, 3 << 20)).unwrap();
        }
        fs::write(d.join("shared"), noise(99, 2 << 20)).unwrap();
    }
    run(&repo, &["repo", "init"]);
    let spawn = |p: &Path| {
        dedupwire(&repo)
            .args(["backup", p.to_str().unwrap(), "--json"])
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (ca, cb) = (spawn(&a), spawn(&b));
    ok(ca.wait_with_output().unwrap());
    ok(cb.wait_with_output().unwrap());
    let check = json(&run(&repo, &["repo", "check", "--read-data", "--json"]));
    assert_eq!(check["errors"].as_array().map(Vec::len), Some(0), "{check}");
    assert_eq!(check["snapshots"], 2);
    for d in [&a, &b] {
        let list = json(&run(&repo, &["repo", "snapshots", "--json"]));
        let id = list
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["paths"][0] == d.to_str().unwrap())
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let target = dir.join(format!("out-{}", &id[..8]));
        run(
            &repo,
            &["restore", &id, "--target", target.to_str().unwrap()],
        );
        assert_eq!(tree(&restored(&target, d)), tree(d));
    }
    let _ = fs::remove_dir_all(&dir);
}

/// What cannot be read is named, the rest is backed up, and the exit status says so. As root
/// (which reads everything) the backup runs as `nobody`.
#[test]
fn unreadable_files_are_named_and_the_rest_backed_up() {
    let dir = tempdir("unreadable");
    let (src, repo) = (dir.join("src"), dir.join("repo"));
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("fine"), b"fine").unwrap();
    fs::write(src.join("secret"), b"secret").unwrap();
    fs::set_permissions(src.join("secret"), fs::Permissions::from_mode(0o000)).unwrap();
    let as_nobody = common::is_root();
    let user = |c: &mut Command| {
        if as_nobody {
            std::os::unix::process::CommandExt::uid(c, 65534);
            std::os::unix::process::CommandExt::gid(c, 65534);
        }
    };
    if as_nobody {
        fs::create_dir_all(&repo).unwrap();
        std::os::unix::fs::chown(&repo, Some(65534), Some(65534)).unwrap();
    }
    let mut init = dedupwire(&repo);
    init.args(["repo", "init"]);
    user(&mut init);
    ok(init.output().unwrap());
    let mut backup = dedupwire(&repo);
    backup.args(["backup", src.to_str().unwrap()]);
    user(&mut backup);
    let out = backup.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("secret") && err.contains("Permission denied"),
        "{err}"
    );
    assert!(err.contains("1 paths could not be read"), "{err}");
    let ls = String::from_utf8(run(&repo, &["repo", "ls", "latest"]).stdout).unwrap();
    assert!(ls.contains("fine") && !ls.contains("secret"), "{ls}");
    let _ = fs::remove_dir_all(&dir);
}

/// A disk that fills up during a backup: a clear error, no temporary file left behind, a
/// repository that checks clean; with room again the next backup lands and restores exactly.
#[test]
fn a_full_disk_during_backup_is_a_clear_error_and_the_repository_stays_valid() {
    let dir = tempdir("fulldisk");
    let (src, repo) = (dir.join("src"), dir.join("repo"));
    fs::create_dir_all(&src).unwrap();
    for i in 0..4 {
        fs::write(src.join(format!("part-{i}")), noise(40 + i, 2 << 20)).unwrap();
    }
    fs::create_dir_all(&repo).unwrap();
    let _mount = common::Tmpfs::mount(&repo, "3m");
    run(&repo, &["repo", "init"]);
    let out = dedupwire(&repo)
        .args(["backup", src.to_str().unwrap()])
        .output()
        .unwrap();
    common::assert_disk_full(&out);
    let mut leftovers = Vec::new();
    let mut stack = vec![repo.clone()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().contains("tmp") {
                leftovers.push(e.path());
            }
        }
    }
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    run(&repo, &["repo", "check", "--read-data"]);
    let snaps = json(&run(&repo, &["repo", "snapshots", "--json"]));
    assert_eq!(snaps.as_array().unwrap().len(), 0);

    let status = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&repo)
        .status()
        .unwrap();
    assert!(status.success());
    run(&repo, &["backup", src.to_str().unwrap()]);
    run(&repo, &["repo", "check", "--read-data"]);
    let target = dir.join("target");
    run(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(tree(&restored(&target, &src)), tree(&src));
    drop(_mount);
    let _ = fs::remove_dir_all(&dir);
}

/// Files that vanish or shrink while a backup reads the tree: named as warnings, the backup
/// still lands, and the snapshot holds exactly what was read (every restored file is a prefix
/// of what it was, and restores without error).
#[test]
fn vanishing_and_shrinking_files_leave_a_snapshot_of_what_was_read() {
    let dir = tempdir("vanishing");
    let (src, repo) = (dir.join("src"), dir.join("repo"));
    fs::create_dir_all(&src).unwrap();
    let content = |i: u64| noise(i, 20_000 + (i as usize % 7) * 9_000);
    let count = 1500u64;
    for i in 0..count {
        fs::write(src.join(format!("f{i:05}")), content(i)).unwrap();
    }
    run(&repo, &["repo", "init"]);
    let child = dedupwire(&repo)
        .args(["backup", "--json", src.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for i in (0..count).rev().step_by(3) {
        let p = src.join(format!("f{i:05}"));
        if i % 2 == 0 {
            let _ = fs::remove_file(&p);
        } else if let Ok(f) = fs::File::options().write(true).open(&p) {
            let _ = f.set_len(5_000);
        }
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        out.status.success() || err.contains("could not be read"),
        "{err}"
    );
    for line in err.lines().filter(|l| l.contains("warning")) {
        assert!(
            line.contains("vanished")
                || line.contains("changed while being read")
                || line.contains("No such file"),
            "{line}"
        );
    }
    run(&repo, &["repo", "check", "--read-data"]);
    let target = dir.join("target");
    run(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    let back = restored(&target, &src);
    let mut files = 0;
    for e in fs::read_dir(&back).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let i: u64 = name[1..].parse().unwrap();
        let got = fs::read(e.path()).unwrap();
        let was = content(i);
        assert!(
            got.len() == was.len() || got.len() == 5_000,
            "{name}: {} bytes",
            got.len()
        );
        assert_eq!(got[..], was[..got.len()], "{name}");
        files += 1;
    }
    let summary = json(&out);
    let taken = summary["files_new"].as_u64().unwrap();
    assert_eq!(files, taken, "{summary}");
    let _ = fs::remove_dir_all(&dir);
}

/// `repo init --chunk-size` sets the repository's average chunk size; sizes it cannot use are
/// refused with a message saying what it takes.
#[test]
fn the_chunk_size_is_chosen_at_init() {
    let dir = tempdir("chunksize");
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("data"), noise(5, 2 << 20)).unwrap();
    let mut chunks = Vec::new();
    for size in ["4KiB", "32KiB"] {
        let repo = dir.join(size);
        run(&repo, &["repo", "init", "--chunk-size", size]);
        let out = run(&repo, &["backup", "--json", src.to_str().unwrap()]);
        chunks.push(json(&out)["chunks_whole"].as_u64().unwrap());
    }
    assert!(chunks[0] > 4 * chunks[1], "{chunks:?}");
    for bad in ["3KiB", "2MiB", "lots"] {
        let out = dedupwire(&dir.join(format!("bad-{bad}")))
            .args(["repo", "init", "--chunk-size", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--chunk-size"),
            "{err}"
        );
    }
    let _ = fs::remove_dir_all(&dir);
}
