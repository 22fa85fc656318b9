//! `dedupwire analyze` end to end: the binary on real files, its JSON shape, its errors.

mod common;

use std::path::Path;
use std::process::Command;

fn dedupwire() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dedupwire"))
}

/// Fails the test with the run's stderr unless it succeeded.
fn assert_succeeded(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write_tree(dir: &Path, version: u32) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let mut text = String::new();
    for i in 0..3000 {
        text.push_str(&format!(
            "fn item_{i}() -> u32 {{ {} }}\n",
            i * 7 + if i == 1500 { version } else { 0 }
        ));
    }
    std::fs::write(dir.join("src/lib.rs"), &text).unwrap();
    std::fs::write(dir.join("README"), format!("release {version}\n")).unwrap();
    let noise: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("blob.bin"), noise).unwrap();
}

#[test]
fn analyzes_two_releases_and_writes_stable_json_and_html() {
    let tmp = tempdir();
    write_tree(&tmp.join("v1"), 1);
    write_tree(&tmp.join("v2"), 2);
    let docs = tmp.join("docs.jsonl");
    let mut lines = String::new();
    for rev in 0..20 {
        lines.push_str(&format!(
            "{{\"op\":\"update\",\"_id\":\"a\",\"body\":\"{}\"}}\n",
            "word ".repeat(200) + &rev.to_string()
        ));
    }
    std::fs::write(&docs, lines).unwrap();
    let json = tmp.join("r.json");
    let html = tmp.join("r.html");
    let out = dedupwire()
        .args(["analyze", "--json"])
        .arg(&json)
        .arg("--html")
        .arg(&html)
        .arg(tmp.join("v1"))
        .arg(tmp.join("v2"))
        .arg(&docs)
        .output()
        .unwrap();
    assert_succeeded(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("recommended for 100.0 Mbit/s"), "{text}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for key in ["input_bytes", "items", "methods", "recommendation"] {
        assert!(r.get(key).is_some(), "missing {key}");
    }
    assert_eq!(r["items"], 3 + 3 + 20);
    let methods = r["methods"].as_array().unwrap();
    for m in methods {
        for key in [
            "name",
            "family",
            "scope",
            "params",
            "output_bytes",
            "ratio",
            "index_bytes",
            "mb_per_s",
        ] {
            assert!(m.get(key).is_some(), "method lacks {key}: {m}");
        }
    }
    let find = |name: &str, scope: &str| {
        methods
            .iter()
            .find(|m| m["name"] == name && m["scope"] == scope)
            .unwrap_or_else(|| panic!("no {name} {scope}"))["ratio"]
            .as_f64()
            .unwrap()
    };
    // The second release repeats the first: pooling finds it, each release alone does not.
    assert!(find("exact-cdc-4KiB", "global") > 1.8 * find("exact-cdc-4KiB", "local"));
    // 256 B chunks are measured because a document stream is present.
    find("exact-cdc-256B", "global");
    // Revisions of one document: similarity + delta beats exact dedup.
    assert!(find("similarity", "global") > find("exact-cdc-4KiB", "global"));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.matches("<svg").count() >= 3);
}

#[test]
fn an_empty_input_is_a_report_with_a_warning() {
    let tmp = tempdir();
    std::fs::create_dir_all(tmp.join("empty")).unwrap();
    std::fs::write(tmp.join("empty/nothing"), b"").unwrap();
    std::fs::write(tmp.join("empty/void"), b"").unwrap();
    let json = tmp.join("r.json");
    let out = dedupwire()
        .args(["analyze", "-q", "--json"])
        .arg(&json)
        .arg(tmp.join("empty"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: the input's 2 items are all empty"),
        "{stderr}"
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["input_bytes"], 0);
    assert_eq!(r["warnings"].as_array().map(Vec::len), Some(1), "{r}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let tmp = tempdir();
    let cases: [(&[&str], &str); 10] = [
        (
            &["analyze", "/no/such/path"],
            "/no/such/path: No such file or directory",
        ),
        (
            &["analyze", "--methods", "bogus", "."],
            "unknown method \"bogus\"",
        ),
        (&["analyze", "--methods", "cdc-3KiB", "."], "power of two"),
        (&["analyze", "--link", "fast", "."], "--link \"fast\""),
        (
            &["analyze", "--sample", "0", "."],
            "--sample must be at least 1",
        ),
        (
            &["analyze", "--window", "0", "."],
            "--window must be more than 0",
        ),
        (&["analyze", "--window", "lots", "."], "--window \"lots\""),
        (&["analyze", "--memory", "lots", "."], "--memory \"lots\""),
        (&["analyze", "--memory", "0", "."], "--memory \"0\""),
        (
            &["analyze", "--memory", "600MiB", "."],
            "leaves nothing for exact dedup's indexes",
        ),
    ];
    for (args, want) in cases {
        let out = dedupwire().current_dir(&tmp).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_damaged_document_stream_is_named_with_its_cause_and_writes_no_report() {
    let tmp = tempdir();
    let mut lines = String::new();
    for i in 0..20_000 {
        lines.push_str(&format!(
            "{{\"_id\":{i},\"body\":\"{}\"}}\n",
            "x".repeat(i % 300)
        ));
    }
    // With a checksum, as the `zstd` tool writes by default: a flipped byte is then caught
    // even where it still decodes.
    let mut encoder = zstd::Encoder::new(Vec::new(), 3).unwrap();
    encoder.include_checksum(true).unwrap();
    std::io::Write::write_all(&mut encoder, lines.as_bytes()).unwrap();
    let good = encoder.finish().unwrap();
    let mut corrupt = good.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0xff;
    let cases: [(&str, Vec<u8>, &str); 3] = [
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            "the file is truncated",
        ),
        ("corrupt", corrupt, "is damaged"),
        (
            "plain",
            lines.clone().into_bytes(),
            "is not zstd-compressed",
        ),
    ];
    for (name, bytes, want) in cases {
        let path = tmp.join(format!("{name}.jsonl.zst"));
        std::fs::write(&path, bytes).unwrap();
        let json = tmp.join(format!("{name}.json"));
        let out = dedupwire()
            .args(["analyze", "-q", "--json"])
            .arg(&json)
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        assert!(
            err.contains(&format!("{name}.jsonl.zst: ")),
            "{name}: {err}"
        );
        assert!(err.contains(want), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!json.exists(), "{name}: a report was written");
    }
    let path = tmp.join("good.jsonl.zst");
    std::fs::write(&path, good).unwrap();
    let out = dedupwire()
        .args(["analyze", "-q", "--methods", "zstd"])
        .arg(&path)
        .output()
        .unwrap();
    assert_succeeded(&out);
}

/// `dedupwire` run as a user without root's right to read everything: as `nobody` when the
/// tests run as root (as CI does), else as the user running them.
fn dedupwire_unprivileged() -> Command {
    let uid = Command::new("id").arg("-u").output().unwrap().stdout;
    if String::from_utf8_lossy(&uid).trim() == "0" {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_dedupwire"));
        c
    } else {
        dedupwire()
    }
}

#[test]
fn files_and_directories_the_user_may_not_read_are_left_out_with_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempdir();
    let tree = tmp.join("tree");
    write_tree(&tree, 1);
    // Readable by the user the test runs as, whatever the umask.
    for dir in [&tmp, &tree, &tree.join("src")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for f in ["src/lib.rs", "README", "blob.bin"] {
        std::fs::set_permissions(tree.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::write(tree.join("secret"), b"root only").unwrap();
    std::fs::set_permissions(tree.join("secret"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::create_dir_all(tree.join("closed")).unwrap();
    std::fs::write(tree.join("closed/inside"), b"unseen").unwrap();
    std::fs::set_permissions(tree.join("closed"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = tmp.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let json = out.join("r.json");
    let run = dedupwire_unprivileged()
        .args(["analyze", "-q", "--methods", "zstd,cdc-4KiB", "--json"])
        .arg(&json)
        .arg(&tree)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let secret = format!("{} could not be read (", tree.join("secret").display());
    let closed = format!("{} could not be listed (", tree.join("closed").display());
    assert!(stderr.contains(&secret), "{stderr}");
    assert!(stderr.contains(&closed), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let warnings = r["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    // The three readable files, every byte of them.
    let readable: u64 = ["src/lib.rs", "README", "blob.bin"]
        .iter()
        .map(|f| std::fs::metadata(tree.join(f)).unwrap().len())
        .sum();
    assert_eq!(r["input_bytes"].as_u64(), Some(readable), "{r}");
    assert_eq!(r["items"].as_u64(), Some(3), "{r}");

    // A PATH named on the command line is what the user asked for: refusing it is an error.
    let named = dedupwire_unprivileged()
        .args(["analyze", "-q"])
        .arg(tree.join("secret"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&named.stderr);
    assert!(!named.status.success(), "{stderr}");
    assert!(stderr.contains("secret: Permission denied"), "{stderr}");
    std::fs::set_permissions(tree.join("closed"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `dedupwire analyze` of zstd and 4 KiB chunks over what the test writes to its stdin, with
/// `extra` options and the report to `json`; every stream piped.
fn analyze_stdin(extra: &[&str], json: &Path) -> std::process::Child {
    dedupwire()
        .args(["analyze", "--methods", "zstd,cdc-4KiB", "--json"])
        .arg(json)
        .args(extra)
        .arg("/dev/stdin")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_pipe_of_unknown_size_is_analyzed_and_the_user_told_what_is_not_sized_for_it() {
    let tmp = tempdir();
    let json = tmp.join("r.json");
    let run = |extra: &[&str]| {
        let mut child = analyze_stdin(&[&["-q"], extra].concat(), &json);
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &data).unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(r["input_bytes"], 3_000_000, "read to its end");
        stderr
    };
    let warned = run(&[]);
    assert!(
        warned.contains("the size of /dev/stdin is not known before it is read"),
        "{warned}"
    );
    let chosen = run(&["--sample-chunks", "1"]);
    assert!(!chosen.contains("warning"), "{chosen}");
}

#[test]
fn a_slow_input_is_reported_as_what_set_the_pace() {
    let tmp = tempdir();
    let json = tmp.join("r.json");
    let mut child = analyze_stdin(&[], &json);
    let mut stdin = child.stdin.take().unwrap();
    for k in 0..6u32 {
        std::thread::sleep(std::time::Duration::from_millis(250));
        let piece: Vec<u8> = (0..1u32 << 20).map(|i| ((i ^ k) % 251) as u8).collect();
        std::io::Write::write_all(&mut stdin, &piece).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_succeeded(&out);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let (input, methods) = (
        r["waited_on_input_s"].as_f64().unwrap(),
        r["waited_on_methods_s"].as_f64().unwrap(),
    );
    assert!(input >= 1.0 && methods < input, "{input} {methods}");
    assert!(r["cpu_s"].as_f64().unwrap() > 0.0 && r["cores"].as_u64().unwrap() >= 1);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines().nth(1).unwrap().starts_with("input-bound"),
        "{text}"
    );
}

#[test]
fn a_report_that_could_not_be_written_fails_the_run_before_it_reads_anything() {
    let tmp = tempdir();
    // A FIFO nobody writes: reading it would wait forever, so only a check made before
    // reading lets the run end.
    let fifo = tmp.join("never-written");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let mut child = dedupwire()
        .args(["analyze", "-q", "--json"])
        .arg(tmp.join("no/such/dir/r.json"))
        .arg(&fifo)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("the run went on to read its input");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no/such/dir/r.json: No such file or directory"),
        "{err}"
    );
    assert!(
        !err.contains(".dedupwire-"),
        "names the temporary file: {err}"
    );
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "dedupwire-cli-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn chunk_sampling_estimates_within_its_stated_error() {
    let tmp = tempdir();
    for v in 1..=4 {
        write_tree(&tmp.join(format!("v{v}")), v);
    }
    let run = |sample: &str| -> serde_json::Value {
        let json = tmp.join(format!("s{sample}.json"));
        let out = dedupwire()
            .args([
                "analyze",
                "-q",
                "--methods",
                "cdc-1KiB",
                "--sample-chunks",
                sample,
                "--json",
            ])
            .arg(&json)
            .args((1..=4).map(|v| tmp.join(format!("v{v}"))))
            .output()
            .unwrap();
        assert_succeeded(&out);
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
    };
    let (exact, sampled) = (run("1"), run("4"));
    for scope in ["local", "global"] {
        let pick = |r: &serde_json::Value| {
            r["methods"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == "exact-cdc-1KiB" && m["scope"] == scope)
                .unwrap()
                .clone()
        };
        let (e, s) = (pick(&exact), pick(&sampled));
        let (eb, sb) = (
            e["output_bytes"].as_f64().unwrap(),
            s["output_bytes"].as_f64().unwrap(),
        );
        let rel = s["rel_error"].as_f64().unwrap();
        assert!(rel > 0.0, "a sampled estimate states its error");
        assert!(
            (sb / eb - 1.0).abs() <= 4.0 * rel + 0.02,
            "{scope}: exact {eb}, sampled {sb} ± {rel}"
        );
    }
}

#[test]
fn a_memory_budget_too_small_for_every_chunk_samples_them_and_says_so() {
    let tmp = tempdir();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..8 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(tmp.join("noise.bin"), &noise).unwrap();
    // A 1 MiB window and 640 MiB of buffers leave the indexes 1.75 MiB: 8 MB of unique
    // chunks at every size would take about 2 MB.
    let run = |extra: &[&str]| {
        let json = tmp.join("m.json");
        let out = dedupwire()
            .args(["analyze", "-q", "--window", "1MiB", "--memory", "643MiB"])
            .args(extra)
            .arg("--json")
            .arg(&json)
            .arg(tmp.join("noise.bin"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let cdc = r["methods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "exact-cdc-1KiB")
            .unwrap()["rel_error"]
            .as_f64()
            .unwrap();
        (err, r, cdc)
    };
    let (err, r, rel) = run(&[]);
    assert!(err.contains("indexed 1 chunk in 2"), "{err}");
    assert!(r["warnings"][0]
        .as_str()
        .unwrap()
        .contains("--sample-chunks 1"));
    assert!(r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap().contains("indexed 1 chunk in 2")));
    assert!(rel > 0.0, "sampled lines state their error");
    let (err, r, rel) = run(&["--sample-chunks", "1"]);
    assert!(!err.contains("chunk in"), "{err}");
    assert_eq!(r.get("warnings"), None, "{r}");
    assert_eq!(rel, 0.0, "asked for every chunk");
}

#[test]
fn a_full_disk_leaves_no_partial_report() {
    let tmp = tempdir();
    write_tree(&tmp.join("v1"), 1);
    let out = tmp.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let _mount = common::Tmpfs::mount(&out, "64k");
    std::fs::write(out.join("r.html"), "the previous report").unwrap();
    let run = dedupwire()
        .args(["analyze", "-q", "--json"])
        .arg(out.join("r.json"))
        .arg("--html")
        .arg(out.join("r.html"))
        .arg(tmp.join("v1"))
        .output()
        .unwrap();
    common::assert_disk_full(&run);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("writing"), "{stderr}");
    assert!(
        !stderr.contains(".dedupwire-"),
        "names a temporary file: {stderr}"
    );
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["r.html", "r.json"], "a temporary file is left");
    let html = std::fs::read(out.join("r.html")).unwrap();
    assert!(
        html == b"the previous report",
        "the previous HTML report was replaced by {} bytes",
        html.len()
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("r.json")).unwrap()).unwrap();
    assert!(json["methods"].as_array().is_some_and(|m| !m.is_empty()));
}
