//! The C recipe the header and the README give, followed to the letter: `scripts/install-capi.sh
//! PREFIX`, then the documented `cc` line through pkg-config, then the program run without
//! LD_LIBRARY_PATH (the rpath in `dedupwire.pc` must find the shared library).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The line a C user types, as the README and the header's top comment give it.
const BUILD_LINE: &str = "cc app.c $(pkg-config --cflags --libs dedupwire) -o app";

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the deps directory");
    deps.parent().expect("the profile directory").to_path_buf()
}

fn run(what: &str, c: &mut Command) -> String {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

fn documented_in(path: &Path) {
    let text = std::fs::read_to_string(path).expect("readable");
    assert!(
        text.contains(BUILD_LINE),
        "{} does not give the build line {BUILD_LINE:?}",
        path.display()
    );
}

#[test]
fn the_documented_pkg_config_line_builds_a_program_that_runs() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let repo = crate_dir.join("../..");
    documented_in(&repo.join("README.md"));
    documented_in(&crate_dir.join("include/dedupwire.h"));

    let work = tempfile::tempdir().unwrap();
    let prefix = work.path().join("prefix");
    // A target directory of its own, in the dev profile, shared with the C example's test:
    // this test run holds the main one's lock.
    run(
        "scripts/install-capi.sh",
        Command::new("bash")
            .arg(repo.join("scripts/install-capi.sh"))
            .arg(&prefix)
            .env("CARGO_TARGET_DIR", target_dir().join("capi-example"))
            .env("CARGO_PROFILE", "dev"),
    );
    let pc = prefix.join("lib/pkgconfig");
    assert!(pc.join("dedupwire.pc").exists());
    std::fs::copy(
        crate_dir.join("examples/c/echo.c"),
        work.path().join("app.c"),
    )
    .unwrap();
    run(
        BUILD_LINE,
        Command::new("sh")
            .args(["-c", BUILD_LINE])
            .current_dir(work.path())
            .env("PKG_CONFIG_PATH", &pc),
    );

    let app = work.path().join("app");
    let linked = run(
        "ldd",
        Command::new("ldd").arg(&app).env_remove("LD_LIBRARY_PATH"),
    );
    let lib = prefix.join("lib/libdedupwire_capi.so");
    assert!(
        linked.contains(&format!("libdedupwire_capi.so => {}", lib.display())),
        "app does not load {}:\n{linked}",
        lib.display()
    );
    let stores = work.path().join("stores");
    std::fs::create_dir(&stores).unwrap();
    let out = run(
        "app",
        Command::new(&app)
            .arg(&stores)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("DEDUPWIRE_KEY"),
    );
    assert!(out.contains("echo: ok"), "{out}");
}
