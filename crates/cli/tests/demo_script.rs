//! `scripts/demo.sh` says what each step does, about how long it takes and how long it took,
//! and shows pip's download output instead of minutes of silence. Run with stand-ins for
//! `pip`, `cargo` and the built binary (on PATH and in CARGO_TARGET_DIR), so that it checks
//! the script's talk, not the network or a release build.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn script(path: &Path, body: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, format!("#!/usr/bin/env bash\nset -eu\n{body}")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn the_demo_says_what_it_does_and_shows_the_download() {
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("bin");
    let calls = work.path().join("pip-calls");
    // pip download --no-deps --no-binary :all: -d DIR django==V: an sdist of one file, with
    // what a real pip prints on the way.
    script(
        &bin.join("pip"),
        &format!(
            r#"echo "$@" >> {calls}
while [ "$1" != "-d" ]; do shift; done
dir=$2; v=${{3#django==}}
echo "  Downloading Django-$v.tar.gz (10.4 MB)"
tmp=$(mktemp -d); mkdir "$tmp/Django-$v"; echo "$v" > "$tmp/Django-$v/VERSION"
tar -czf "$dir/Django-$v.tar.gz" -C "$tmp" "Django-$v"
"#,
            calls = calls.display()
        ),
    );
    script(
        &bin.join("cargo"),
        "echo '    Finished `release` profile' >&2\n",
    );
    let target = work.path().join("target");
    script(
        &target.join("release/dedupwire"),
        "echo \"analyzed $# arguments\"\n",
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let demo = || {
        Command::new("bash")
            .arg(repo.join("scripts/demo.sh"))
            .env(
                "PATH",
                format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
            )
            .env("CARGO_TARGET_DIR", &target)
            .env("DATA", work.path().join("data"))
            .env("SHARED", work.path().join("no-shared"))
            .env("DJANGO_VERSIONS", "4.2.1 4.2.2")
            .output()
            .unwrap()
    };
    let out = demo();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    let mut rest = &stderr[..];
    for said in [
        "demo: step 1/3: fetching six Django releases",
        "minutes the first time",
        "fetch-data: django 4.2.1 (1/2): downloading",
        "Downloading Django-4.2.1.tar.gz (10.4 MB)",
        "fetch-data: django 4.2.1 (1/2): fetched in",
        "fetch-data: django 4.2.2 (2/2): downloading",
        "Downloading Django-4.2.2.tar.gz",
        "demo: done in 0m",
        "demo: step 2/3: building dedupwire",
        "minutes on 2 cores the first time",
        "Finished `release` profile",
        "demo: done in",
        "demo: step 3/3: analyzing 2 inputs (0 MiB) with every method (under a minute",
        "demo: done in",
    ] {
        let at = rest
            .find(said)
            .unwrap_or_else(|| panic!("{said:?} missing or out of order in:\n{stderr}"));
        rest = &rest[at + said.len()..];
    }
    assert!(stdout.contains("analyzed"), "{stdout}");
    let calls = fs::read_to_string(&calls).unwrap();
    assert!(!calls.contains("--quiet"), "pip was silenced: {calls}");

    // A second run finds the data there and says so.
    let again = demo();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(
        stderr.contains("fetch-data: django 4.2.2 (2/2): already in"),
        "{stderr}"
    );
}
