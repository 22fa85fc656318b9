//! `dedupwire replicate encode|decode` on JSON lines: a complete stream decodes to the exact
//! lines; a stream cut short (even to 4 bytes), cut at a batch boundary, with a batch
//! repeated, or in the old format exits non-zero saying what is wrong, from a file (writing
//! nothing) and from a pipe; `encode --stats` prints one human line, `--json` every figure.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn dedupwire() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dedupwire"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `dedupwire args…` with `input` on stdin through a pipe.
fn piped(args: &[&str], input: &[u8]) -> Output {
    let mut child = dedupwire()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        // A decoder that stops early closes the pipe: a failed write is its business.
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// Runs `dedupwire args…` with stdin redirected from a file holding `input`.
fn from_file(args: &[&str], input: &[u8]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stream.bin");
    std::fs::write(&path, input).unwrap();
    dedupwire()
        .args(args)
        .stdin(std::fs::File::open(&path).unwrap())
        .output()
        .unwrap()
}

/// `n` change lines about four documents, similar enough to be sent as deltas.
fn lines(n: usize, body_repeat: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let op = if i < 4 { "insert" } else { "update" };
            let body = format!("{} {i}", "a shared paragraph of text ".repeat(body_repeat));
            let line = serde_json::json!({"op": op, "_id": format!("doc{}", i % 4), "body": body});
            format!("{line}\n").into_bytes()
        })
        .collect()
}

fn encode(input: &[u8], batch: &str) -> Vec<u8> {
    let out = piped(&["replicate", "encode", "--batch", batch], input);
    assert!(out.status.success(), "{}", stderr(&out));
    out.stdout
}

/// The byte ranges of the batch frames of a version-2 file (crates/replicate/FORMAT.md).
fn batch_frames(enc: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut at = 8;
    let mut frames = Vec::new();
    while enc[at] == b'B' {
        let len = u32::from_le_bytes(enc[at + 9..at + 13].try_into().unwrap()) as usize;
        frames.push(at..at + 13 + len);
        at += 13 + len;
    }
    assert_eq!(enc[at], b'E');
    frames
}

#[test]
fn decode_refuses_anything_but_a_complete_stream() {
    let input = lines(40, 20);
    let enc = encode(&input, "2KiB");
    let frames = batch_frames(&enc);
    assert!(frames.len() >= 4, "{} batches", frames.len());

    for out in [
        piped(&["replicate", "decode"], &enc),
        from_file(&["replicate", "decode"], &enc),
    ] {
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(out.stdout, input);
    }

    let mut duplicated = enc[..frames[1].end].to_vec();
    duplicated.extend_from_slice(&enc[frames[1].clone()]);
    duplicated.extend_from_slice(&enc[frames[1].end..]);
    let mut version_1 = b"DWRJ".to_vec();
    for f in &frames {
        version_1.extend_from_slice(&enc[f.start + 9..f.end]);
    }
    let cases: [(&str, Vec<u8>, String); 5] = [
        (
            "cut to 4 bytes",
            enc[..4].to_vec(),
            "stream ends inside its 8-byte header: truncated (at byte 4)".into(),
        ),
        (
            "cut after batch 3",
            enc[..frames[2].end].to_vec(),
            format!(
                "stream ends after batch 3 without its end marker: truncated (at byte {})",
                frames[2].end
            ),
        ),
        (
            "batch 2 twice",
            duplicated,
            "batch 2 again, after batch 2: a batch duplicated or out of order".into(),
        ),
        (
            "two streams end to end",
            [enc.clone(), enc.clone()].concat(),
            "bytes after the end marker".into(),
        ),
        (
            "version 1",
            version_1,
            "unsupported replication stream: version 1".into(),
        ),
    ];
    for (what, bytes, want) in cases {
        let out = from_file(&["replicate", "decode"], &bytes);
        assert!(!out.status.success(), "{what}: exit 0");
        assert!(stderr(&out).contains(&want), "{what}: {}", stderr(&out));
        assert!(
            out.stdout.is_empty(),
            "{what}: a file's frames are checked first"
        );
        let out = piped(&["replicate", "decode"], &bytes);
        assert!(!out.status.success(), "{what}, piped: exit 0");
        assert!(
            stderr(&out).contains(&want),
            "{what}, piped: {}",
            stderr(&out)
        );
        assert!(out.stdout.len() < input.len(), "{what}, piped");
    }
}

#[test]
fn decode_from_a_pipe_says_when_lines_went_out_before_the_error() {
    let input = lines(160, 600);
    let enc = encode(&input, "256KiB");
    let frames = batch_frames(&enc);
    assert!(frames.len() >= 3, "{} batches", frames.len());
    let cut = &enc[..frames[frames.len() - 2].end];
    let out = piped(&["replicate", "decode"], cut);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "stream ends after batch {} without its end marker: truncated",
            frames.len() - 1
        )) && err.contains("of lines that reached stdout before it are not the whole stream"),
        "{err}"
    );
    assert!(!out.stdout.is_empty() && out.stdout.len() < input.len());
    assert!(input.starts_with(&out.stdout));
}

#[test]
fn encode_stats_is_one_human_line_and_json_on_request() {
    let input = lines(30, 20);
    let out = piped(&["replicate", "encode", "--stats"], &input);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let line = err.trim_end();
    assert!(!line.contains('\n') && !line.contains('{'), "{err}");
    let human = |n: usize| match n {
        0..1024 => format!("{n} B"),
        _ => format!("{:.1} KiB", n as f64 / 1024.0),
    };
    let (bytes_in, bytes_out) = (human(input.len()), human(out.stdout.len()));
    assert!(
        line.starts_with(&format!(
            "dedupwire: encoded 30 entries in 1 batch: {bytes_in} -> {bytes_out} ("
        )) && line.contains("x); ")
            && line.contains(" deltas, ")
            && line.contains(" literal")
            && line.contains(", 0 fallbacks; ")
            && line.ends_with(" s"),
        "{line}"
    );

    for args in [
        &["replicate", "encode", "--stats", "--json"][..],
        &["replicate", "encode", "--json"],
    ] {
        let out = piped(args, &input);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value =
            serde_json::from_slice(&out.stderr).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
        let n = |k: &str| {
            v[k].as_f64()
                .unwrap_or_else(|| panic!("no number {k:?} in {v}"))
        };
        for field in [
            "entries",
            "input_bytes",
            "output_bytes",
            "batches",
            "deltas",
            "literals",
            "fallbacks",
            "cache_hits",
            "cache_misses",
            "cache_hit_ratio",
            "ratio",
            "elapsed_s",
            "index_bytes",
            "feature_table_bytes",
            "feature_cache_bytes",
            "document_cache_bytes",
            "documents",
            "index_bytes_per_document",
        ] {
            n(field);
        }
        assert_eq!(v.as_object().unwrap().len(), 18, "a field not checked: {v}");
        assert_eq!(n("entries"), 30.0);
        assert_eq!(n("input_bytes"), input.len() as f64);
        assert_eq!(n("output_bytes"), out.stdout.len() as f64);
        assert_eq!(n("deltas") + n("literals"), 30.0);
        assert_eq!(n("documents"), 4.0);
        assert_eq!(
            n("index_bytes"),
            n("feature_table_bytes") + n("feature_cache_bytes") + n("document_cache_bytes")
        );
        assert_eq!(n("index_bytes_per_document"), n("index_bytes") / 4.0);
        assert!(n("index_bytes") < (1 << 20) as f64, "{v}");
    }
}
