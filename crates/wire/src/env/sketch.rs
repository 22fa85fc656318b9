//! The sketch file: its header, its records (one [`Sketch`] each), and the scan that finds
//! where its valid records end. The byte layout is in `crates/wire/FORMAT.md` ("Environment
//! sketches").

use xxhash_rust::xxh3::xxh3_64;

use crate::store::{ChunkId, Sketch, MAX_SKETCH_FEATURES};

/// The sketch file's name in an environment directory.
pub const FILE_NAME: &str = "sketches";
/// Where a new sketch file is written before it is renamed to [`FILE_NAME`].
pub const TMP_NAME: &str = "sketches.tmp";
/// Where a sketch file this build cannot read is moved, so that a fresh one can start.
pub const BAD_NAME: &str = "sketches.bad";
/// The first 8 bytes of a sketch file.
pub const MAGIC: [u8; 8] = *b"DWSKETCH";
/// The sketch file format this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the header.
pub const HEADER_LEN: u64 = 24;
/// No sketch file is read if larger: open, recall and compaction read it whole.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Flags bit 0: the record holds the chunk before this one.
const HAS_AFTER: u8 = 1;

/// The header of a sketch file.
pub fn encode_header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    let sum = xxh3_64(&h[0..16]);
    h[16..24].copy_from_slice(&sum.to_le_bytes());
    h
}

/// Why `h` (the start of a file) is not a sketch file header this build reads, if it is not.
pub fn check_header(h: &[u8]) -> Result<(), String> {
    if h.len() < HEADER_LEN as usize {
        return Err(format!(
            "{} bytes, too few for a header ({HEADER_LEN})",
            h.len()
        ));
    }
    if h[0..8] != MAGIC {
        return Err("bad magic".into());
    }
    let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if version != VERSION {
        return Err(format!(
            "sketch format version {version}; this dedupwire reads version {VERSION}"
        ));
    }
    if xxh3_64(&h[0..16]) != u64_at(h, 16) {
        return Err("header checksum mismatch".into());
    }
    Ok(())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Appends the record of `s` (at most [`MAX_SKETCH_FEATURES`] features) to `out`.
pub fn encode_record(out: &mut Vec<u8>, s: &Sketch) {
    debug_assert!(s.features.len() <= MAX_SKETCH_FEATURES);
    let start = out.len();
    out.extend_from_slice(&s.id.0);
    match &s.after {
        Some(after) => {
            out.push(HAS_AFTER);
            out.extend_from_slice(&after.0);
        }
        None => out.push(0),
    }
    out.push(s.features.len() as u8);
    for f in &s.features {
        out.extend_from_slice(&f.to_le_bytes());
    }
    let sum = xxh3_64(&out[start..]);
    out.extend_from_slice(&sum.to_le_bytes());
}

/// The length of the complete, valid record at the start of `b`, if there is one.
pub fn record_len(b: &[u8]) -> Option<usize> {
    let flags = *b.get(32)?;
    if flags & !HAS_AFTER != 0 {
        return None;
    }
    let at = if flags & HAS_AFTER != 0 { 65 } else { 33 };
    let n = usize::from(*b.get(at)?);
    if n > MAX_SKETCH_FEATURES {
        return None;
    }
    let end = at + 1 + 8 * n;
    if b.len() < end + 8 || xxh3_64(&b[..end]) != u64_at(b, end) {
        return None;
    }
    Some(end + 8)
}

/// The chunk a record (at least 32 bytes) is about.
pub fn record_id(rec: &[u8]) -> ChunkId {
    let mut id = [0u8; 32];
    id.copy_from_slice(&rec[..32]);
    ChunkId(id)
}

/// The sketch in the valid record at the start of `b`, and the record's length.
pub fn decode_record(b: &[u8]) -> Option<(Sketch, usize)> {
    let len = record_len(b)?;
    let after = (b[32] & HAS_AFTER != 0).then(|| record_id(&b[33..]));
    let at = if after.is_some() { 65 } else { 33 };
    let features = b[at + 1..len - 8]
        .chunks_exact(8)
        .map(|f| u64_at(f, 0))
        .collect();
    Some((
        Sketch {
            id: record_id(b),
            after,
            features,
        },
        len,
    ))
}

/// A record found by [`scan`]: its bytes are `buf[off..off + len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Offset of the record in the file.
    pub off: usize,
    /// Bytes of the record, checksum included.
    pub len: usize,
}

impl Found {
    /// The record's bytes in `buf`, the file it was found in.
    pub fn bytes<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.off..self.off + self.len]
    }
}

/// What [`scan`] found in a sketch file.
#[derive(Debug, Default)]
pub struct Scan {
    /// The valid records, in file order (oldest first).
    pub records: Vec<Found>,
    /// Where the last valid record ends: everything after it is cut off.
    pub end: u64,
}

/// Finds the valid records of the sketch file whose whole content (header included, already
/// checked) is `buf`.
///
/// Records are read one after another from the header on; the first one that is incomplete or
/// does not verify ends the scan, whether it is a torn tail or damage: sketches are hints, and
/// what follows damage is not worth the risk of reading shifted bytes as records.
pub fn scan(buf: &[u8]) -> Scan {
    let mut pos = (HEADER_LEN as usize).min(buf.len());
    let mut records = Vec::new();
    while let Some(len) = record_len(&buf[pos..]) {
        records.push(Found { off: pos, len });
        pos += len;
    }
    Scan {
        records,
        end: pos as u64,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sketch(n: u8, after: Option<u8>, features: usize) -> Sketch {
        Sketch {
            id: ChunkId([n; 32]),
            after: after.map(|a| ChunkId([a; 32])),
            features: (0..features as u64)
                .map(|f| f.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(n))
                .collect(),
        }
    }

    fn file(sketches: &[Sketch]) -> Vec<u8> {
        let mut b = encode_header().to_vec();
        for s in sketches {
            encode_record(&mut b, s);
        }
        b
    }

    #[test]
    fn header_round_trip_and_errors() {
        assert_eq!(check_header(&encode_header()), Ok(()));
        assert!(check_header(&encode_header()[..23])
            .unwrap_err()
            .contains("too few"));
        let mut h = encode_header();
        h[1] ^= 1;
        assert!(check_header(&h).unwrap_err().contains("magic"));
        let mut h = encode_header();
        h[8] = 2;
        assert!(check_header(&h).unwrap_err().contains("version 2"));
        let mut h = encode_header();
        h[13] ^= 1;
        assert!(check_header(&h).unwrap_err().contains("checksum"));
    }

    #[test]
    fn record_sizes() {
        let mut b = Vec::new();
        encode_record(&mut b, &sketch(1, None, 0));
        assert_eq!(b.len(), 42);
        b.clear();
        encode_record(&mut b, &sketch(1, Some(2), MAX_SKETCH_FEATURES));
        assert_eq!(b.len(), 32 + 1 + 32 + 1 + 8 * MAX_SKETCH_FEATURES + 8);
    }

    #[test]
    fn scan_stops_at_the_first_damage() {
        let all = [
            sketch(1, None, 3),
            sketch(2, Some(1), 4),
            sketch(3, None, 0),
        ];
        let b = file(&all);
        let s = scan(&b);
        assert_eq!(s.records.len(), 3);
        assert_eq!(s.end, b.len() as u64);
        let second = s.records[1];
        for at in second.off..second.off + second.len {
            let mut d = b.clone();
            d[at] ^= 0x10;
            let s = scan(&d);
            assert_eq!(s.records.len(), 1, "flipped byte {at}");
            assert_eq!(s.end, second.off as u64);
        }
        let mut d = b.clone();
        d[second.off + 32] = 0x81;
        assert_eq!(scan(&d).records.len(), 1, "unknown flags");
        assert_eq!(scan(&b[..10]).end, 10, "no header, no records");
    }

    fn arb_sketch() -> impl Strategy<Value = Sketch> {
        (
            any::<[u8; 32]>(),
            proptest::option::of(any::<[u8; 32]>()),
            prop::collection::vec(any::<u64>(), 0..=MAX_SKETCH_FEATURES),
        )
            .prop_map(|(id, after, features)| Sketch {
                id: ChunkId(id),
                after: after.map(ChunkId),
                features,
            })
    }

    proptest! {
        #[test]
        fn records_round_trip_and_tails_are_cut(
            sketches in prop::collection::vec(arb_sketch(), 0..20),
            cut in any::<prop::sample::Index>(),
        ) {
            let b = file(&sketches);
            let s = scan(&b);
            prop_assert_eq!(s.end, b.len() as u64);
            prop_assert_eq!(s.records.len(), sketches.len());
            for (found, want) in s.records.iter().zip(&sketches) {
                let (got, len) = decode_record(found.bytes(&b)).expect("valid record");
                prop_assert_eq!(len, found.len);
                prop_assert_eq!(record_id(found.bytes(&b)), want.id);
                prop_assert_eq!(&got, want);
            }
            let cut = HEADER_LEN as usize + cut.index(b.len() - HEADER_LEN as usize + 1);
            let t = scan(&b[..cut]);
            let whole = s.records.iter().take_while(|r| r.off + r.len <= cut).count();
            prop_assert_eq!(t.records.len(), whole);
            prop_assert_eq!(&t.records[..], &s.records[..whole]);
            prop_assert!(t.end <= cut as u64);
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..400)) {
            let mut b = encode_header().to_vec();
            b.extend_from_slice(&body);
            let s = scan(&b);
            prop_assert!(s.end as usize <= b.len());
            for r in &s.records {
                prop_assert!(decode_record(r.bytes(&b)).is_some());
            }
        }
    }
}
