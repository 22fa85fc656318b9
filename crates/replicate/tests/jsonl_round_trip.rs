//! JSON-lines replication gives back every line exactly, beats the oracle, and rejects damage,
//! streams cut short, and batches repeated, dropped or reordered; the file layout is frozen.

use std::io::Cursor;
use std::ops::Range;

use dedupwire_replicate::jsonl;
use dedupwire_replicate::sdedup::SdedupConfig;
use proptest::prelude::*;

fn round_trip(input: &[u8], batch: usize) -> (Vec<u8>, jsonl::EncodeReport, Vec<u8>) {
    let mut enc = Vec::new();
    let report = jsonl::encode(
        Cursor::new(input),
        &mut enc,
        SdedupConfig::default(),
        batch,
        None,
    )
    .unwrap();
    let mut dec = Vec::new();
    jsonl::decode(Cursor::new(&enc), &mut dec, SdedupConfig::default()).unwrap();
    (enc, report, dec)
}

fn shared(name: &str) -> Option<Vec<u8>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data")
        .join(name);
    let f = std::fs::File::open(&path).ok()?;
    Some(zstd::decode_all(f).unwrap())
}

#[test]
fn shared_streams_round_trip_exactly_and_compress() {
    for name in ["gitignore.jsonl.zst", "rfcs.jsonl.zst"] {
        let Some(data) = shared(name) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "{name} missing from ../shared/data"
            );
            eprintln!("SKIP: {name} not found");
            continue;
        };
        let (enc, report, dec) = round_trip(&data, 4 << 20);
        assert_eq!(dec, data, "{name}: decoded stream differs");
        eprintln!(
            "{name}: {} -> {} bytes, {:.1}x, cache hits {:.2}",
            data.len(),
            enc.len(),
            report.ratio,
            report.cache_hit_ratio
        );
        assert!(report.ratio > 15.0, "{name}: ratio {:.1}", report.ratio);
        assert_eq!(report.stats.fallbacks, 0);
    }
}

fn doc_lines() -> impl Strategy<Value = Vec<u8>> {
    let line = (
        0u8..3,
        0u8..6,
        proptest::collection::vec(any::<u8>(), 0..300),
        0usize..300,
    );
    proptest::collection::vec(line, 0..40).prop_map(|lines| {
        let mut bodies: Vec<String> = vec!["seed text ".repeat(30); 6];
        let mut out = Vec::new();
        for (op, id, noise, at) in lines {
            let body = &mut bodies[usize::from(id)];
            let text: String = noise.iter().map(|b| char::from(b'a' + b % 26)).collect();
            let at = at.min(body.len());
            body.insert_str(at, &text);
            let op = ["insert", "update", "delete"][usize::from(op)];
            let v = serde_json::json!({"op": op, "_id": format!("doc{id}"), "body": body});
            out.extend_from_slice(v.to_string().as_bytes());
            out.push(b'\n');
        }
        out
    })
}

fn encode(input: &[u8], batch: usize) -> Vec<u8> {
    let mut enc = Vec::new();
    jsonl::encode(
        Cursor::new(input),
        &mut enc,
        SdedupConfig::default(),
        batch,
        None,
    )
    .unwrap();
    enc
}

fn decode(enc: &[u8]) -> Result<Vec<u8>, String> {
    let mut dec = Vec::new();
    jsonl::decode(Cursor::new(enc), &mut dec, SdedupConfig::default())
        .map(|_| dec)
        .map_err(|e| e.to_string())
}

/// Splits a version-2 file by the layout of FORMAT.md: the header, each batch frame, the end
/// marker (which must be the last 25 bytes).
fn frames(enc: &[u8]) -> (Range<usize>, Vec<Range<usize>>, Range<usize>) {
    assert_eq!(&enc[..8], b"DWRJ\x02\0\0\0");
    let mut at = 8;
    let mut batches = Vec::new();
    while enc[at] == b'B' {
        let seq = u64::from_le_bytes(enc[at + 1..at + 9].try_into().unwrap());
        assert_eq!(seq, batches.len() as u64 + 1);
        let len = u32::from_le_bytes(enc[at + 9..at + 13].try_into().unwrap()) as usize;
        batches.push(at..at + 13 + len);
        at += 13 + len;
    }
    assert_eq!(enc[at], b'E');
    assert_eq!(enc.len(), at + 25);
    (0..8, batches, at..enc.len())
}

/// `enc` with its batch frames replaced by `order` (indexes into them) and the end marker
/// rebuilt for them, counts and checksum right: only the order of the batches is wrong.
fn rebuild(enc: &[u8], order: &[usize]) -> Vec<u8> {
    let (head, batches, end) = frames(enc);
    let mut out = enc[head].to_vec();
    for &i in order {
        out.extend_from_slice(&enc[batches[i].clone()]);
    }
    out.push(b'E');
    out.extend_from_slice(&(order.len() as u64).to_le_bytes());
    out.extend_from_slice(&enc[end.start + 9..end.start + 17]);
    let checksum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_change_stream_round_trips(input in doc_lines(), batch in 1usize..5000) {
        let (enc, report, dec) = round_trip(&input, batch);
        prop_assert_eq!(&dec, &input);
        prop_assert_eq!(report.stats.output_bytes, enc.len() as u64);
        prop_assert_eq!(report.stats.input_bytes, input.len() as u64);
        prop_assert_eq!(report.batches, frames(&enc).1.len() as u64);
        prop_assert_eq!(jsonl::check_frames(Cursor::new(&enc)).unwrap(), report.batches);
    }

    #[test]
    fn damage_is_always_an_error(input in doc_lines(), at: usize, xor in 1u8..=255) {
        let mut enc = encode(&input, 2000);
        let i = at % enc.len();
        enc[i] ^= xor;
        prop_assert!(decode(&enc).is_err(), "byte {} ^ {:#x} went unnoticed", i, xor);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_strict_prefix_is_rejected(
        input in doc_lines().prop_filter("short", |l| l.len() < 6000),
        batch in 200usize..3000,
    ) {
        let enc = encode(&input, batch);
        for len in 0..enc.len() {
            let cut = &enc[..len];
            let err = decode(cut).expect_err("a strict prefix decoded");
            prop_assert!(err.contains("truncated"), "{} bytes of {}: {}", len, enc.len(), err);
            prop_assert!(jsonl::check_frames(Cursor::new(cut)).is_err());
        }
    }

    #[test]
    fn every_duplicated_dropped_or_swapped_batch_is_rejected(
        input in doc_lines(),
        batch in 200usize..3000,
    ) {
        let enc = encode(&input, batch);
        let n = frames(&enc).1.len();
        let mut changed = Vec::new();
        for i in 0..n {
            let mut order: Vec<usize> = (0..n).collect();
            order.insert(i, i);
            changed.push(order);
            let mut order: Vec<usize> = (0..n).collect();
            order.remove(i);
            changed.push(order);
            if i + 1 < n {
                let mut order: Vec<usize> = (0..n).collect();
                order.swap(i, i + 1);
                changed.push(order);
            }
        }
        prop_assert_eq!(decode(&rebuild(&enc, &(0..n).collect::<Vec<_>>())), Ok(input.clone()));
        for order in changed {
            let bad = rebuild(&enc, &order);
            let err = decode(&bad).expect_err("a shuffled stream decoded");
            prop_assert!(
                err.contains("out of order") || err.contains("missing"),
                "{:?}: {}",
                order,
                err
            );
            // Frames alone tell every change but the last batch dropped under an end
            // marker rebuilt to count the rest: only its line count (decode) tells that.
            if order.iter().enumerate().any(|(k, &i)| k != i) {
                prop_assert!(jsonl::check_frames(Cursor::new(&bad)).is_err(), "{:?}", order);
            }
        }
    }
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// Two lines, each in its own batch (`--batch 1`); too small to compress or delta.
const TWO_LINES: &[u8] =
    b"{\"op\":\"insert\",\"_id\":\"a\",\"v\":1}\n{\"op\":\"delete\",\"_id\":\"a\"}\n";

/// [`TWO_LINES`] encoded: the layout of FORMAT.md, version 2, frozen.
const TWO_LINES_V2: &str = concat!(
    "4457524a02000000",           // "DWRJ", version 2
    "42010000000000000036000000", // batch 1, 54 bytes:
    "44575201012626",             // "DWR" 1, 1 entry, 38 raw, 38 stored
    "0041f7c75a5003e727",         // not compressed, xxh3-64 of the body
    "010000016101",               // line 1, insert, collection "", id "a", literal
    "1f7b226f70223a22696e73657274222c225f6964223a2261222c2276223a317d",
    "42020000000000000030000000", // batch 2, 48 bytes:
    "44575201012020000a65a5af8757a934",
    "020200016101", // line 2, delete, "", "a", literal
    "197b226f70223a2264656c657465222c225f6964223a2261227d",
    "45", // end: 2 batches, 2 lines, xxh3-64 of every byte before it
    "0200000000000000",
    "0200000000000000",
    "850fbf8865b32671",
);

/// No lines at all: the header and the end marker.
const EMPTY_V2: &str = "4457524a020000004500000000000000000000000000000000b95e19fdaa08868a";

#[test]
fn the_file_layout_is_frozen() {
    let two = unhex(TWO_LINES_V2);
    assert_eq!(encode(TWO_LINES, 1), two);
    assert_eq!(decode(&two).unwrap(), TWO_LINES);
    let checksum = xxhash_rust::xxh3::xxh3_64(&two[..two.len() - 8]);
    assert_eq!(two[two.len() - 8..], checksum.to_le_bytes());
    let empty = unhex(EMPTY_V2);
    assert_eq!(encode(b"", 1), empty);
    assert_eq!(decode(&empty).unwrap(), b"");
    assert_eq!(jsonl::check_frames(Cursor::new(&two)).unwrap(), 2);
}

#[test]
fn a_version_1_stream_is_refused_by_name() {
    // Version 1: "DWRJ", then each batch behind its length as a u32, nothing else.
    let two = unhex(TWO_LINES_V2);
    let (_, batches, _) = frames(&two);
    let mut v1 = b"DWRJ".to_vec();
    for b in batches {
        v1.extend_from_slice(&two[b.start + 9..b.start + 13]);
        v1.extend_from_slice(&two[b.start + 13..b.end]);
    }
    let err = decode(&v1).unwrap_err();
    assert!(
        err.contains("unsupported replication stream: version 1")
            && err.contains("reads version 2 only"),
        "{err}"
    );
    let mut v9 = unhex(EMPTY_V2);
    v9[4] = 9;
    let err = decode(&v9).unwrap_err();
    assert!(
        err.contains("version 9; this build reads version 2 only"),
        "{err}"
    );
}

#[test]
fn what_is_wrong_is_said() {
    let input: Vec<u8> = (0..30)
        .flat_map(|i| {
            let line = serde_json::json!({"op": "update", "_id": format!("d{}", i % 4),
                "body": format!("{} {i}", "some text ".repeat(40))});
            format!("{line}\n").into_bytes()
        })
        .collect();
    let enc = encode(&input, 1000);
    let (_, batches, end) = frames(&enc);
    assert!(batches.len() >= 4, "{} batches", batches.len());
    let cases: Vec<(Vec<u8>, String)> = vec![
        (
            enc[..4].to_vec(),
            "stream ends inside its 8-byte header: truncated (at byte 4)".into(),
        ),
        (
            enc[..8].to_vec(),
            "stream ends after its header without its end marker: truncated".into(),
        ),
        (
            enc[..batches[2].end].to_vec(),
            format!(
                "stream ends after batch 3 without its end marker: truncated (at byte {})",
                batches[2].end
            ),
        ),
        (
            enc[..batches[1].start + 5].to_vec(),
            "stream ends inside the frame head of the batch after batch 1".into(),
        ),
        (
            enc[..batches[1].end - 1].to_vec(),
            "stream ends inside batch 2".into(),
        ),
        (
            enc[..end.start + 20].to_vec(),
            "stream ends inside its end marker, after batch".into(),
        ),
        (
            rebuild(&enc, &[0, 1, 1, 2]),
            "batch 2 again, after batch 2: a batch duplicated or out of order".into(),
        ),
        (
            rebuild(&enc, &[0, 2]),
            "batch 3 where batch 2 belongs: batches missing or out of order".into(),
        ),
        (
            [enc.clone(), enc.clone()].concat(),
            "bytes after the end marker".into(),
        ),
        (
            [&enc[..end.start + 1], &[7][..], &enc[end.start + 2..]].concat(),
            "the end marker counts 7 batches".into(),
        ),
        (
            [&enc[..end.start + 9], &[0][..], &enc[end.start + 10..]].concat(),
            "checksum does not match".into(),
        ),
    ];
    for (bytes, want) in cases {
        let err = decode(&bytes).unwrap_err();
        assert!(err.contains(&want), "want {want:?}, got {err:?}");
    }
}

#[test]
fn stats_add_up() {
    let input: Vec<u8> = (0..10)
        .flat_map(|i| {
            let line = serde_json::json!({"op": if i < 9 { "insert" } else { "delete" },
                "_id": format!("d{}", i.min(8)), "body": format!("{} {i}", "shared text ".repeat(50))});
            format!("{line}\n").into_bytes()
        })
        .collect();
    let (enc, r, _) = round_trip(&input, 1 << 20);
    assert_eq!(r.stats.entries, 10);
    assert_eq!(r.stats.input_bytes, input.len() as u64);
    assert_eq!(r.stats.output_bytes, enc.len() as u64);
    assert_eq!(r.stats.deltas + r.stats.literals, r.stats.entries);
    assert_eq!(r.batches, 1);
    assert_eq!(
        r.index_bytes,
        r.feature_table_bytes + r.feature_cache_bytes + r.document_cache_bytes
    );
    assert_eq!(r.documents, 8);
    assert_eq!(r.index_bytes_per_document, r.index_bytes as f64 / 8.0);
    // The document table's cache is counted as held, not at its 8 MiB bound.
    assert!(
        r.index_bytes < 1 << 20,
        "{} bytes for 8 documents",
        r.index_bytes
    );
    assert!(r.elapsed_s > 0.0);
}

#[test]
fn bad_lines_are_clear_errors() {
    let cases: [(&[u8], &str); 4] = [
        (b"not json\n", "line 1: not JSON"),
        (
            b"{\"op\":\"insert\",\"_id\":\"a\"}\n[1]\n",
            "line 2: not a JSON object",
        ),
        (
            b"{\"op\":\"upsert\",\"_id\":\"a\"}\n",
            "unknown op \"upsert\"",
        ),
        (b"{\"op\":\"insert\"}\n", "no \"_id\" field"),
    ];
    for (input, want) in cases {
        let err = jsonl::encode(
            Cursor::new(input),
            Vec::new(),
            SdedupConfig::default(),
            100,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(want), "{err}");
    }
    let err = jsonl::decode(
        Cursor::new(b"PK\x03\x04"),
        Vec::new(),
        SdedupConfig::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("wrong magic"), "{err}");
}
