//! Frozen vectors for the `Sampled` delta format and its default encoder: the exact bytes
//! must never change silently. A deliberate change of the format or of the default encoder
//! parameters needs new vectors (regenerate with `DEDUPWIRE_WRITE_VECTORS=1 cargo test -p
//! dedupwire-engine --test delta_vectors`, review the diff, and say why in the commit); old
//! deltas must still decode, so a format change also needs a new `DeltaSpec`.

use std::path::PathBuf;

use dedupwire_engine::delta::{DeltaCodec, Sampled};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

fn check_vector(name: &str) {
    let read = |ext: &str| {
        let p = dir().join(format!("{name}.{ext}"));
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let (source, target) = (read("source"), read("target"));
    let mut delta = Vec::new();
    Sampled::default().encode(&source, &target, &mut delta);
    let path = dir().join(format!("{name}.delta"));
    if std::env::var_os("DEDUPWIRE_WRITE_VECTORS").is_some() {
        std::fs::write(&path, &delta).unwrap();
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        delta == expected,
        "{name}: the encoder's output drifted from the frozen vector ({} bytes, expected {})",
        delta.len(),
        expected.len()
    );
    let mut out = Vec::new();
    Sampled::default()
        .decode(&source, &expected, target.len(), &mut out)
        .unwrap();
    assert!(
        out == target,
        "{name}: frozen delta decodes to something else"
    );
}

#[test]
fn document_revision() {
    check_vector("delta_sampled_doc");
}

#[test]
fn binary_with_repeats() {
    check_vector("delta_sampled_bin");
}

#[test]
fn small_inline_vectors() {
    let enc = |s: &[u8], t: &[u8]| {
        let mut d = Vec::new();
        Sampled::default().encode(s, t, &mut d);
        d
    };
    assert_eq!(enc(b"", b""), [0]);
    assert_eq!(enc(b"anything", b""), [0]);
    // Shorter than the window: all inserted.
    assert_eq!(enc(b"", b"abc"), [3, 3, b'a', b'b', b'c']);
    let s = b"The quick brown fox jumps over the lazy dog.";
    // Identical: one copy of 44 bytes at 0.
    assert_eq!(enc(s, s), [44, 0, 44, 0]);
    // Changed word: the 10 equal bytes in front are shorter than the window and cannot be
    // reached by backward extension across "brown"/"red": insert 13, copy 29 at +15.
    let t = b"The quick red fox jumps over the lazy dog.";
    let mut expected = vec![42, 13];
    expected.extend_from_slice(b"The quick red");
    expected.extend_from_slice(&[29, 30]);
    assert_eq!(enc(s, t), expected);
}
