//! Builds `examples/c/echo.c` with the system C compiler against the static library, runs it,
//! and checks what it reports.

use std::path::PathBuf;
use std::process::Command;

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the deps directory");
    deps.parent().expect("the profile directory").to_path_buf()
}

/// When the newest Rust source under `dir` (the workspace's crates) was last changed.
fn newest_source(dir: &std::path::Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "rs" || x == "toml") {
                if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                    newest = newest.max(t);
                }
            }
        }
    }
    newest
}

fn stat(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        .parse()
        .expect("a number")
}

#[test]
fn the_c_echo_example_round_trips_and_deduplicates() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut lib = target_dir().join("libdedupwire_capi.a");
    let built_at = std::fs::metadata(&lib).and_then(|m| m.modified()).ok();
    if built_at.is_none_or(|t| t < newest_source(&crate_dir.join(".."))) {
        // `cargo test` builds only the rlib, and one left by an earlier build may be older
        // than the code (one from before `dw_connect` took a key crashed the example): build
        // it in a directory of its own (the test run holds the main target directory's lock).
        let own = target_dir().join("capi-example");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "dedupwire-capi", "--target-dir"])
            .arg(&own)
            .status()
            .expect("cargo");
        assert!(status.success(), "building the static library failed");
        lib = own.join("debug").join("libdedupwire_capi.a");
    }
    assert!(lib.exists(), "{} is missing", lib.display());
    let work = tempfile::tempdir().unwrap();
    let exe = work.path().join("echo");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/c/echo.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        built.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );

    let ran = Command::new(&exe)
        .arg(work.path())
        .env_remove("DEDUPWIRE_KEY") // its built-in passphrase
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "echo failed ({}):\n{stdout}\n{}",
        ran.status,
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(stdout.contains("echo: ok"), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("stats: "))
        .unwrap_or_else(|| panic!("no stats line in {stdout:?}"));
    let message = 1 << 20;
    assert_eq!(stat(line, "messages_sent"), 2);
    assert_eq!(stat(line, "message_bytes_sent"), 2 * message);
    assert_eq!(stat(line, "bytes_hit"), message, "{line}");
    assert!(
        stat(line, "socket_bytes_sent") < message * 11 / 10,
        "{line}"
    );
    assert!(
        stat(line, "socket_bytes_received") < message * 11 / 10,
        "{line}"
    );
}
