//! Round trips of both delta codecs on arbitrary pairs and on targets derived from their
//! sources by random edits; arbitrary bytes as deltas never panic.

use dedupwire_engine::delta::{DeltaCodec, DeltaSpec, Sampled, ZstdRef, WINDOWS};
use proptest::prelude::*;

fn codecs() -> Vec<(String, Box<dyn DeltaCodec>)> {
    let mut v: Vec<(String, Box<dyn DeltaCodec>)> = vec![
        ("sampled".into(), DeltaSpec::Sampled.build()),
        ("zstd-ref 3".into(), DeltaSpec::ZstdRef { level: 3 }.build()),
        ("zstd-ref 19".into(), Box::new(ZstdRef::new(19))),
        ("zstd-ref -5".into(), Box::new(ZstdRef::new(-5))),
    ];
    for w in WINDOWS {
        for stride in [1, 5, 32] {
            v.push((
                format!("sampled w{w} s{stride}"),
                Box::new(Sampled::with_params(w, stride).unwrap()),
            ));
        }
    }
    v
}

fn check(source: &[u8], target: &[u8]) -> Result<(), TestCaseError> {
    for (name, c) in codecs() {
        let mut d = b"prefix".to_vec();
        c.encode(source, target, &mut d);
        let d = &d[6..];
        let mut out = b"out".to_vec();
        c.decode(source, d, target.len(), &mut out)
            .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
        prop_assert_eq!(&out[3..], target, "{}", name);
        if !target.is_empty() {
            // The caller's limit binds: one byte less must fail, and leave `out` as it was.
            let mut out = b"out".to_vec();
            prop_assert!(
                c.decode(source, d, target.len() - 1, &mut out).is_err(),
                "{}",
                name
            );
            prop_assert_eq!(&out[..], b"out", "{}", name);
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Replace(usize, Vec<u8>),
    Move(usize, usize, usize),
    Duplicate(usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let bytes = prop::collection::vec(any::<u8>(), 1..40);
    prop_oneof![
        (any::<usize>(), bytes.clone()).prop_map(|(a, b)| Edit::Insert(a, b)),
        (any::<usize>(), 1usize..60).prop_map(|(a, n)| Edit::Delete(a, n)),
        (any::<usize>(), bytes).prop_map(|(a, b)| Edit::Replace(a, b)),
        (any::<usize>(), 1usize..300, any::<usize>()).prop_map(|(a, n, b)| Edit::Move(a, n, b)),
        (any::<usize>(), 1usize..300, any::<usize>())
            .prop_map(|(a, n, b)| Edit::Duplicate(a, n, b)),
    ]
}

fn apply(mut t: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let at = |a: usize, t: &Vec<u8>| if t.is_empty() { 0 } else { a % (t.len() + 1) };
        match e {
            Edit::Insert(a, b) => {
                let a = at(*a, &t);
                t.splice(a..a, b.iter().copied());
            }
            Edit::Delete(a, n) => {
                let a = at(*a, &t);
                let e = (a + n).min(t.len());
                t.drain(a..e);
            }
            Edit::Replace(a, b) => {
                let a = at(*a, &t);
                let e = (a + b.len()).min(t.len());
                t.splice(a..e, b.iter().copied());
            }
            Edit::Move(a, n, b) => {
                let a = at(*a, &t);
                let e = (a + n).min(t.len());
                let piece: Vec<u8> = t.drain(a..e).collect();
                let b = at(*b, &t);
                t.splice(b..b, piece);
            }
            Edit::Duplicate(a, n, b) => {
                let a = at(*a, &t);
                let e = (a + n).min(t.len());
                let piece = t[a..e].to_vec();
                let b = at(*b, &t);
                t.splice(b..b, piece);
            }
        }
    }
    t
}

/// Sources with structure: runs of a small alphabet, random bytes, and repeated blocks.
fn source() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..3000),
        prop::collection::vec(prop::sample::select(b"ab \n{}".to_vec()), 0..3000),
        (prop::collection::vec(any::<u8>(), 1..200), 1usize..20).prop_map(|(b, k)| b.repeat(k)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn arbitrary_pairs(s in prop::collection::vec(any::<u8>(), 0..600),
                       t in prop::collection::vec(any::<u8>(), 0..600)) {
        check(&s, &t)?;
    }

    #[test]
    fn edited_targets(s in source(), edits in prop::collection::vec(edit(), 0..12)) {
        let t = apply(s.clone(), &edits);
        check(&s, &t)?;
    }

    #[test]
    fn arbitrary_deltas_never_panic(s in prop::collection::vec(any::<u8>(), 0..300),
                                    d in prop::collection::vec(any::<u8>(), 0..300),
                                    limit in 0usize..100_000) {
        for (_, c) in codecs().into_iter().take(2) {
            let mut out = b"keep".to_vec();
            if c.decode(&s, &d, limit, &mut out).is_err() {
                prop_assert_eq!(&out[..], b"keep");
            } else {
                prop_assert!(out.len() - 4 <= limit);
            }
        }
    }
}

#[test]
fn large_similar_pair() {
    // 1 MiB of pseudo-random text with scattered edits: long copies, exact round trip, and a
    // delta far smaller than the target.
    let mut x = 0x1234_5678u32;
    let words: Vec<&[u8]> = vec![
        b"delta ",
        b"source ",
        b"target ",
        b"copy ",
        b"insert\n",
        b"zstd ",
    ];
    let mut s = Vec::new();
    while s.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        s.extend_from_slice(words[(x % 6) as usize]);
        s.extend_from_slice(&x.to_le_bytes()[..(x >> 30) as usize]);
    }
    let mut t = s.clone();
    for k in 0..50 {
        let at = (k * 20_011) % t.len();
        t.splice(at..at + 3, *b"EDITED");
    }
    for (name, c) in codecs().into_iter().take(2) {
        let mut d = Vec::new();
        c.encode(&s, &t, &mut d);
        assert!(d.len() < 2000, "{name}: {} bytes", d.len());
        let mut out = Vec::new();
        c.decode(&s, &d, t.len(), &mut out).unwrap();
        assert!(out == t, "{name}");
    }
}
