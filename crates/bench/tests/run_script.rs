//! `bench/run.sh` refuses a bad round count before it builds, installs or reads anything.

use std::process::Command;

#[test]
fn a_round_count_that_is_not_a_whole_number_is_refused_with_its_reason() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/run.sh");
    for bad in ["0", "x", "2.5", "-1", "05"] {
        let out = Command::new("bash")
            .arg(script)
            .arg("analyze-images")
            .env("ROUNDS", bad)
            .output()
            .expect("bash runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "ROUNDS={bad:?}: {err}");
        assert!(
            err.contains("ROUNDS must be a whole number of rounds"),
            "ROUNDS={bad:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "ROUNDS={bad:?} ran something");
    }
}
