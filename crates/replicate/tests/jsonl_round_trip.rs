//! JSON-lines replication gives back every line exactly, beats the oracle, and rejects damage.

use std::io::Cursor;

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_change_stream_round_trips(input in doc_lines(), batch in 1usize..5000) {
        let (_, _, dec) = round_trip(&input, batch);
        prop_assert_eq!(dec, input);
    }

    #[test]
    fn damage_is_an_error_never_a_wrong_line(input in doc_lines(), at: usize, xor in 1u8..=255) {
        let mut enc = Vec::new();
        jsonl::encode(Cursor::new(&input), &mut enc, SdedupConfig::default(), 2000, None).unwrap();
        let i = at % enc.len();
        enc[i] ^= xor;
        let mut dec = Vec::new();
        if jsonl::decode(Cursor::new(&enc), &mut dec, SdedupConfig::default()).is_ok() {
            prop_assert_eq!(dec, input);
        }
    }
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
