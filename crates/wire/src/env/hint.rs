//! A sealed segment's hint file: the list of its records, written once the segment is full, so
//! that opening the environment reads a few bytes per chunk instead of every segment whole
//! (a 512 MB environment took 0.25 s to open by scanning). The byte layout is in
//! `crates/wire/FORMAT.md` ("Environment hints").
//!
//! A hint is trusted only whole: its checksum verifies, it names its segment, and the
//! segment's length is the one it was written for; otherwise the segment is scanned as
//! before. Chunk data is still checked against its checksum on every read.

use xxhash_rust::xxh3::xxh3_64;

use super::segment::{Found, HEADER_LEN, RECIPE_BIT, RECORD_HEAD};
use crate::store::ChunkId;

/// The first 8 bytes of every hint file.
pub const MAGIC: [u8; 8] = *b"DWENVHNT";
/// The hint format this build writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the records: magic, version, segment number, segment length, record count.
const HEAD: usize = 8 + 1 + 4 + 8 + 4;
/// Bytes per record: id, offset, data length.
const ENTRY: usize = 32 + 4 + 4;

/// The file name of segment `no`'s hint.
pub fn file_name(no: u32) -> String {
    format!("{no:08x}.hint")
}

/// The segment number a file name stands for, if it names a hint.
pub fn parse_name(name: &str) -> Option<u32> {
    super::segment::parse_numbered(name, ".hint")
}

/// The hint of segment `no`, `seg_len` bytes long, holding `records` in file order.
pub fn encode(no: u32, seg_len: u64, records: &[Found]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + records.len() * ENTRY + 8);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&no.to_le_bytes());
    out.extend_from_slice(&seg_len.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        out.extend_from_slice(&r.id.0);
        out.extend_from_slice(&r.off.to_le_bytes());
        let flag = if r.recipe { RECIPE_BIT } else { 0 };
        out.extend_from_slice(&(r.len | flag).to_le_bytes());
    }
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The records of segment `no`, `seg_len` bytes long, if `b` is a whole, valid hint for it:
/// every record lies inside the segment, after the one before it.
pub fn decode(b: &[u8], no: u32, seg_len: u64) -> Option<Vec<Found>> {
    if b.len() < HEAD + 8 || b[..8] != MAGIC || b[8] != VERSION {
        return None;
    }
    let (body, sum) = b.split_at(b.len() - 8);
    if xxh3_64(body).to_le_bytes() != sum {
        return None;
    }
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
    let len_at = u64::from_le_bytes(body[13..21].try_into().expect("8 bytes"));
    let count = u32_at(21) as usize;
    if u32_at(9) != no || len_at != seg_len || body.len() != HEAD + count.checked_mul(ENTRY)? {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    let mut next = HEADER_LEN;
    for e in body[HEAD..].chunks_exact(ENTRY) {
        let mut id = [0u8; 32];
        id.copy_from_slice(&e[..32]);
        let off = u32::from_le_bytes(e[32..36].try_into().expect("4 bytes"));
        let raw = u32::from_le_bytes(e[36..40].try_into().expect("4 bytes"));
        let len = raw & !RECIPE_BIT;
        let end = u64::from(off) + RECORD_HEAD as u64 + u64::from(len);
        if u64::from(off) < next || end > seg_len {
            return None;
        }
        next = end;
        out.push(Found {
            id: ChunkId(id),
            off,
            len,
            recipe: raw & RECIPE_BIT != 0,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn found(n: usize) -> Vec<Found> {
        let mut off = HEADER_LEN as u32;
        (0..n)
            .map(|i| {
                let len = 100 + i as u32;
                let f = Found {
                    id: ChunkId([i as u8; 32]),
                    off,
                    len,
                    recipe: i % 3 == 1,
                };
                off += RECORD_HEAD as u32 + len;
                f
            })
            .collect()
    }

    fn seg_len(r: &[Found]) -> u64 {
        r.last().map_or(HEADER_LEN, |f| {
            u64::from(f.off) + RECORD_HEAD as u64 + u64::from(f.len)
        })
    }

    proptest! {
        #[test]
        fn hints_round_trip_and_any_damage_is_refused(n in 0usize..40, at in any::<usize>(), bit in 0u8..8) {
            let r = found(n);
            let len = seg_len(&r);
            let b = encode(7, len, &r);
            prop_assert_eq!(decode(&b, 7, len), Some(r));
            prop_assert_eq!(decode(&b, 8, len), None, "another segment's");
            prop_assert_eq!(decode(&b, 7, len + 1), None, "a segment that grew");
            let mut bad = b.clone();
            bad[at % b.len()] ^= 1 << bit;
            prop_assert_eq!(decode(&bad, 7, len), None);
            for cut in 0..b.len() {
                prop_assert_eq!(decode(&b[..cut], 7, len), None);
            }
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300), len in any::<u64>()) {
            let _ = decode(&b, 1, len);
        }
    }

    #[test]
    fn records_outside_the_segment_or_overlapping_are_refused() {
        let r = found(3);
        let len = seg_len(&r);
        assert!(decode(&encode(1, len - 1, &r), 1, len - 1).is_none());
        let mut overlap = r.clone();
        overlap[1].off -= 1;
        assert!(decode(&encode(1, len, &overlap), 1, len).is_none());
    }
}
