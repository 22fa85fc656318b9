//! Every kind of malformed delta is an `Error::Corrupt` naming where decoding stopped, and
//! leaves the caller's output as it was.

use dedupwire_engine::delta::{DeltaCodec, Sampled, ZstdRef};
use dedupwire_engine::Error;

const SOURCE: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// Decodes with `Sampled` and returns the corrupt error's offset and detail.
fn sampled_err(delta: &[u8], limit: usize) -> (usize, String) {
    corrupt(&Sampled::default(), SOURCE, delta, limit)
}

fn corrupt(c: &dyn DeltaCodec, source: &[u8], delta: &[u8], limit: usize) -> (usize, String) {
    let mut out = b"untouched".to_vec();
    let err = c.decode(source, delta, limit, &mut out).unwrap_err();
    assert_eq!(out, b"untouched", "output changed on error");
    match err {
        Error::Corrupt { offset, detail, .. } => (offset, detail),
        e => panic!("not a corrupt error: {e}"),
    }
}

fn sampled_ok(delta: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Sampled::default()
        .decode(SOURCE, delta, 1000, &mut out)
        .unwrap();
    out
}

#[test]
fn sampled_well_formed_baseline() {
    // Target of 6: insert "AB", then copy 4 bytes at 0 + 10 (zigzag 20): "abcd".
    assert_eq!(sampled_ok(&[6, 2, b'A', b'B', 4, 20]), b"ABabcd");
    // Copies chain: the second offset is relative to where the first ended (14): -14 -> 0.
    assert_eq!(sampled_ok(&[6, 0, 4, 20, 0, 2, 27]), b"abcd01");
    assert_eq!(sampled_ok(&[0]), b"");
}

#[test]
fn sampled_empty_and_truncated_header() {
    assert_eq!(sampled_err(&[], 10).0, 0);
    assert!(sampled_err(&[0x80], 10).1.contains("truncated"));
}

#[test]
fn sampled_header_over_limit() {
    let (off, detail) = sampled_err(&[6, 6, b'a', b'b', b'c', b'd', b'e', b'f'], 5);
    assert_eq!(off, 0);
    assert!(detail.contains("limit"), "{detail}");
}

#[test]
fn sampled_header_more_than_delta_can_produce() {
    // 2^62 claimed with an unbounded limit: rejected before any allocation.
    let mut d = vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40];
    d.extend_from_slice(&[0, 4, 20]);
    let (_, detail) = sampled_err(&d, usize::MAX);
    assert!(detail.contains("more than this delta"), "{detail}");
}

#[test]
fn sampled_truncated_insert() {
    let (off, detail) = sampled_err(&[6, 6, b'a', b'b'], 10);
    assert_eq!(off, 1);
    assert!(detail.contains("truncated"), "{detail}");
}

#[test]
fn sampled_truncated_copy() {
    // Missing the copy's offset, then missing the copy entirely.
    assert!(sampled_err(&[6, 2, b'A', b'B', 4], 10)
        .1
        .contains("truncated"));
    assert!(sampled_err(&[6, 2, b'A', b'B'], 10).1.contains("truncated"));
}

#[test]
fn sampled_out_of_range_copies() {
    // Past the end of the source (36 bytes): offset 34, length 4.
    let (off, detail) = sampled_err(&[4, 0, 4, 68], 10);
    assert_eq!(off, 2);
    assert!(detail.contains("outside"), "{detail}");
    // Negative offset: -1 from 0.
    assert!(sampled_err(&[4, 0, 4, 1], 10).1.contains("outside"));
    // Huge offset delta (i64 extremes) must not overflow.
    let mut d = vec![4, 0, 4];
    d.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert!(sampled_err(&d, 10).1.contains("outside"));
    let mut d = vec![4, 0, 4];
    d.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert!(sampled_err(&d, 10).1.contains("outside"));
    // Any copy from an empty source.
    let (_, detail) = corrupt(&Sampled::default(), b"", &[1, 0, 1, 0], 10);
    assert!(detail.contains("outside"), "{detail}");
}

#[test]
fn sampled_zero_length_copy() {
    assert!(sampled_err(&[4, 0, 0, 0], 10).1.contains("zero"));
}

#[test]
fn sampled_output_longer_than_header() {
    // An insert or a copy running past the stated target length.
    assert!(sampled_err(&[2, 3, b'a', b'b', b'c'], 10)
        .1
        .contains("limit"));
    assert!(sampled_err(&[2, 0, 3, 0], 10).1.contains("limit"));
}

#[test]
fn sampled_output_shorter_than_header() {
    // The delta ends before the stated length is produced.
    assert!(sampled_err(&[8, 2, b'a', b'b'], 10).1.contains("truncated"));
    assert!(sampled_err(&[8, 0, 4, 20], 10).1.contains("truncated"));
}

#[test]
fn sampled_trailing_garbage() {
    let (off, detail) = sampled_err(&[2, 2, b'a', b'b', 0], 10);
    assert_eq!(off, 4);
    assert!(detail.contains("trailing"), "{detail}");
    assert!(sampled_err(&[0, 0], 10).1.contains("trailing"));
}

fn zstd_delta(source: &[u8], target: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    ZstdRef::new(3).encode(source, target, &mut d);
    d
}

const TARGET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz, again: 0123456789abcdefghij";

#[test]
fn zstd_header_over_limit() {
    let d = zstd_delta(SOURCE, TARGET);
    let (_, detail) = corrupt(&ZstdRef::new(3), SOURCE, &d, TARGET.len() - 1);
    assert!(detail.contains("limit"), "{detail}");
}

#[test]
fn zstd_header_disagrees_with_frame() {
    let d = zstd_delta(SOURCE, TARGET);
    assert_eq!(d[0] as usize, TARGET.len());
    for len in [TARGET.len() - 1, TARGET.len() + 1] {
        let mut bad = d.clone();
        bad[0] = len as u8;
        corrupt(&ZstdRef::new(3), SOURCE, &bad, 1000);
    }
    // A length no frame this small can produce, with an unbounded limit.
    let mut bad = vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40];
    bad.extend_from_slice(&d[1..]);
    let (_, detail) = corrupt(&ZstdRef::new(3), SOURCE, &bad, usize::MAX);
    assert!(detail.contains("more than this frame"), "{detail}");
}

#[test]
fn zstd_truncated_and_garbage() {
    let d = zstd_delta(SOURCE, TARGET);
    for cut in 1..d.len() {
        corrupt(&ZstdRef::new(3), SOURCE, &d[..cut], 1000);
    }
    corrupt(&ZstdRef::new(3), SOURCE, &[], 1000);
    corrupt(&ZstdRef::new(3), SOURCE, &[5, 1, 2, 3, 4, 5, 6, 7, 8], 1000);
}

#[test]
fn zstd_trailing_garbage() {
    let mut d = zstd_delta(SOURCE, TARGET);
    d.push(0);
    let (_, detail) = corrupt(&ZstdRef::new(3), SOURCE, &d, 1000);
    assert!(detail.contains("trailing"), "{detail}");
    // A second frame is trailing garbage too.
    let mut d = zstd_delta(SOURCE, TARGET);
    let second = zstd_delta(SOURCE, TARGET);
    d.extend_from_slice(&second[1..]);
    corrupt(&ZstdRef::new(3), SOURCE, &d, 1000);
    // An empty target has no frame.
    corrupt(&ZstdRef::new(3), SOURCE, &[0, 1], 1000);
}

#[test]
fn zstd_wrong_source_is_an_error_or_wrong_bytes_never_a_panic() {
    let d = zstd_delta(SOURCE, TARGET);
    let mut out = Vec::new();
    match ZstdRef::new(3).decode(b"", &d, 1000, &mut out) {
        Ok(()) => assert_ne!(out, TARGET),
        Err(Error::Corrupt { .. }) => assert!(out.is_empty()),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn zstd_corrupted_bytes_never_panic() {
    let d = zstd_delta(SOURCE, TARGET);
    for i in 0..d.len() {
        for bit in 0..8 {
            let mut bad = d.clone();
            bad[i] ^= 1 << bit;
            let mut out = Vec::new();
            let _ = ZstdRef::new(3).decode(SOURCE, &bad, 1000, &mut out);
            assert!(out.len() <= 1000);
        }
    }
}
