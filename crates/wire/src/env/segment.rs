//! One segment file: its header, its records, and the scan that finds the valid records in it
//! at open. The byte layout is in `crates/wire/FORMAT.md` ("Environment segments").

use std::fs::File;
use std::io;
use std::path::Path;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::store::{ChunkId, StoreError};

/// The first 8 bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"DWENVSEG";
/// The segment format this build writes: version 2 may hold recipe records.
pub const VERSION: u32 = 2;
/// The oldest segment format this build reads (version 1 never holds recipes).
pub const MIN_VERSION: u32 = 1;
/// Bit 31 of a record's length field: the record is a recipe (see [`encode_recipe`]).
pub const RECIPE_BIT: u32 = 1 << 31;
/// Bytes of a recipe's data before its part ids: the length of the chunk it makes.
pub const RECIPE_HEAD: usize = 4;
/// Bytes of the segment header.
pub const HEADER_LEN: u64 = 32;
/// Bytes of a record before its data: id, length, data checksum, header checksum.
pub const RECORD_HEAD: usize = 48;
/// No segment file is larger: offsets fit a `u32` and a scan reads a segment whole.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// The file name of segment `no`: eight hex digits, so names sort by age.
pub fn file_name(no: u32) -> String {
    format!("{no:08x}.seg")
}

/// The segment number a file name stands for, if it names a segment.
pub fn parse_name(name: &str) -> Option<u32> {
    parse_numbered(name, ".seg")
}

/// The segment number in `name` if it is eight hex digits and then `suffix` (segments, their
/// hints).
pub fn parse_numbered(name: &str, suffix: &str) -> Option<u32> {
    let hex = name.strip_suffix(suffix)?;
    if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

/// The header of segment `no`.
pub fn encode_header(no: u32) -> [u8; HEADER_LEN as usize] {
    encode_header_version(no, VERSION)
}

/// The header of segment `no` in format `version` (tests write older segments with it).
pub fn encode_header_version(no: u32, version: u32) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12..16].copy_from_slice(&no.to_le_bytes());
    let sum = xxh3_64(&h[0..24]);
    h[24..32].copy_from_slice(&sum.to_le_bytes());
    h
}

/// The segment number and format version in a header, or why the file at `path` is not a
/// segment we can read.
pub fn decode_header(h: &[u8], path: &Path) -> Result<(u32, u32), StoreError> {
    let path = path.display();
    if h.len() < HEADER_LEN as usize || h[0..8] != MAGIC {
        return Err(StoreError::Corrupt(format!(
            "{path} is not a dedupwire environment segment (bad magic)"
        )));
    }
    let version = u32_at(h, 8);
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(StoreError::Refused(format!(
            "{path} has segment format version {version}; this dedupwire reads versions \
             {MIN_VERSION} to {VERSION}"
        )));
    }
    if xxh3_64(&h[0..24]) != u64_at(h, 24) {
        return Err(StoreError::Corrupt(format!(
            "{path}: segment header checksum mismatch"
        )));
    }
    Ok((u32_at(h, 12), version))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// The checksum seed of the record at `off` in segment `no`: a valid record copied to any other
/// place (inside a chunk's data, or another segment) does not verify there.
fn seed(no: u32, off: u64) -> u64 {
    (u64::from(no) << 32) ^ off
}

/// Appends the record of `id` → `data` at offset `off` of segment `no` to `out`; `data_sum` is
/// `xxh3_64(data)`; `recipe` marks `data` as a recipe ([`encode_recipe`]), not the chunk.
pub fn encode_record(
    out: &mut Vec<u8>,
    no: u32,
    off: u64,
    id: &ChunkId,
    data: &[u8],
    sum: u64,
    recipe: bool,
) {
    debug_assert!((data.len() as u64) < u64::from(RECIPE_BIT));
    let start = out.len();
    out.extend_from_slice(&id.0);
    let flag = if recipe { RECIPE_BIT } else { 0 };
    out.extend_from_slice(&(data.len() as u32 | flag).to_le_bytes());
    out.extend_from_slice(&sum.to_le_bytes());
    let head_sum = xxh3_64_with_seed(&out[start..start + 44], seed(no, off)) as u32;
    out.extend_from_slice(&head_sum.to_le_bytes());
    out.extend_from_slice(data);
}

/// A record header that verified: the chunk's id, its data length and data checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The chunk's identity.
    pub id: ChunkId,
    /// Bytes of data after the header.
    pub len: u32,
    /// xxh3-64 of the data.
    pub sum: u64,
    /// Whether the data is a recipe.
    pub recipe: bool,
}

/// The record header in `b` (at least [`RECORD_HEAD`] bytes) at `off` of segment `no`, if its
/// checksum verifies.
pub fn decode_head(b: &[u8], no: u32, off: u64) -> Option<Head> {
    if b.len() < RECORD_HEAD {
        return None;
    }
    if xxh3_64_with_seed(&b[..44], seed(no, off)) as u32 != u32_at(b, 44) {
        return None;
    }
    let mut id = [0u8; 32];
    id.copy_from_slice(&b[..32]);
    let len = u32_at(b, 32);
    Some(Head {
        id: ChunkId(id),
        len: len & !RECIPE_BIT,
        sum: u64_at(b, 36),
        recipe: len & RECIPE_BIT != 0,
    })
}

/// Why the record `b` (header and data) read back from `off` of segment `no` is not the chunk
/// `id` of `len` bytes (or its recipe, if `recipe`).
pub fn verify_record(
    b: &[u8],
    no: u32,
    off: u64,
    id: &ChunkId,
    len: u32,
    recipe: bool,
) -> Result<(), String> {
    let head = decode_head(b, no, off).ok_or("record header checksum mismatch")?;
    if head.id != *id || head.len != len || head.recipe != recipe {
        return Err(format!(
            "record holds chunk {:?} of {} bytes, the index expected {id:?} of {len} bytes",
            head.id, head.len
        ));
    }
    if xxh3_64(&b[RECORD_HEAD..]) != head.sum {
        return Err("record data checksum mismatch".into());
    }
    Ok(())
}

/// The length of the complete, valid record at `pos` of `buf` (segment `no`), if there is one.
fn valid_record(buf: &[u8], no: u32, pos: usize) -> Option<(Head, usize)> {
    let head = decode_head(&buf[pos..], no, pos as u64)?;
    let end = pos
        .checked_add(RECORD_HEAD)?
        .checked_add(head.len as usize)?;
    if end > buf.len() || xxh3_64(&buf[pos + RECORD_HEAD..end]) != head.sum {
        return None;
    }
    Some((head, end - pos))
}

/// A record found by [`scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The chunk's identity.
    pub id: ChunkId,
    /// Offset of the record in the segment.
    pub off: u32,
    /// Bytes of data.
    pub len: u32,
    /// Whether the data is a recipe.
    pub recipe: bool,
}

/// What [`scan`] found in one segment.
#[derive(Debug, Default)]
pub struct Scan {
    /// The valid records, in file order.
    pub records: Vec<Found>,
    /// Where the last valid record ends: everything after it is a torn tail.
    pub end: u64,
    /// Damaged stretches between valid records that were skipped (each counts once, however
    /// many records it held).
    pub skipped_records: u64,
    /// Bytes in those stretches.
    pub skipped_bytes: u64,
}

/// Finds the valid records of segment `no` whose whole file (header included) is `buf`.
///
/// A record is valid when its header checksum (seeded with its position) and its data checksum
/// verify. After an invalid byte the scan looks, byte by byte, for the next valid record: the
/// stretch in between is skipped and counted. Invalid bytes with no valid record after them are
/// a torn tail: [`Scan::end`] stops before them.
pub fn scan(buf: &[u8], no: u32) -> Scan {
    let mut out = Scan {
        end: HEADER_LEN.min(buf.len() as u64),
        ..Scan::default()
    };
    let mut pos = out.end as usize;
    let mut bad_from: Option<usize> = None;
    while pos + RECORD_HEAD <= buf.len() {
        match valid_record(buf, no, pos) {
            Some((head, len)) => {
                if let Some(from) = bad_from.take() {
                    out.skipped_records += 1;
                    out.skipped_bytes += (pos - from) as u64;
                }
                out.records.push(Found {
                    id: head.id,
                    off: pos as u32,
                    len: head.len,
                    recipe: head.recipe,
                });
                pos += len;
                out.end = pos as u64;
            }
            None => {
                bad_from.get_or_insert(pos);
                pos += 1;
            }
        }
    }
    out
}

/// A recipe's data: the chunk made by joining `parts` (chunks held whole) is `len` bytes long.
pub fn encode_recipe(len: u32, parts: &[ChunkId]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECIPE_HEAD + 32 * parts.len());
    out.extend_from_slice(&len.to_le_bytes());
    for p in parts {
        out.extend_from_slice(&p.0);
    }
    out
}

/// The length and parts a recipe's data names, if it is well formed (at least one part).
pub fn decode_recipe(data: &[u8]) -> Option<(u32, Vec<ChunkId>)> {
    let ids = data.get(RECIPE_HEAD..)?;
    if ids.is_empty() || ids.len() % 32 != 0 {
        return None;
    }
    let parts = ids
        .chunks_exact(32)
        .map(|c| ChunkId(c.try_into().expect("32 bytes")))
        .collect();
    Some((u32_at(data, 0), parts))
}

#[cfg(unix)]
/// Reads exactly `buf.len()` bytes at `off` without moving a shared cursor.
pub fn read_exact_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, off)
}

#[cfg(unix)]
/// Writes all of `buf` at `off` without moving a shared cursor.
pub fn write_all_at(file: &File, buf: &[u8], off: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, off)
}

#[cfg(windows)]
/// Reads exactly `buf.len()` bytes at `off` (positional reads on Windows).
pub fn read_exact_at(file: &File, mut buf: &mut [u8], mut off: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, off) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(windows)]
/// Writes all of `buf` at `off` (positional writes on Windows).
pub fn write_all_at(file: &File, mut buf: &[u8], mut off: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_write(file, buf, off) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes a file creation or removal in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(no: u32, chunks: &[(&[u8; 32], &[u8])]) -> Vec<u8> {
        let mut b = encode_header(no).to_vec();
        for (id, data) in chunks {
            let off = b.len() as u64;
            encode_record(&mut b, no, off, &ChunkId(**id), data, xxh3_64(data), false);
        }
        b
    }

    #[test]
    fn names_sort_and_parse() {
        assert_eq!(file_name(0x1a), "0000001a.seg");
        assert_eq!(parse_name("0000001a.seg"), Some(0x1a));
        for bad in [
            "1a.seg",
            "+000001a.seg",
            "0000001a.se",
            "LOCK",
            "0000001g.seg",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn header_round_trip_and_errors() {
        let p = Path::new("x.seg");
        assert_eq!(decode_header(&encode_header(7), p).unwrap(), (7, VERSION));
        assert_eq!(
            decode_header(&encode_header_version(7, 1), p).unwrap(),
            (7, 1),
            "older segments are read"
        );
        let mut h = encode_header(7);
        h[0] ^= 1;
        assert!(matches!(decode_header(&h, p), Err(StoreError::Corrupt(m)) if m.contains("x.seg")));
        let mut h = encode_header(7);
        h[8] = 9;
        assert!(
            matches!(decode_header(&h, p), Err(StoreError::Refused(m)) if m.contains("version 9"))
        );
        let mut h = encode_header(7);
        h[20] ^= 1;
        assert!(matches!(decode_header(&h, p), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn scan_finds_skips_and_stops() {
        let b = segment(
            3,
            &[(&[1; 32], b"one"), (&[2; 32], b"two!"), (&[3; 32], b"")],
        );
        let s = scan(&b, 3);
        assert_eq!(s.records.len(), 3);
        assert_eq!((s.end, s.skipped_records), (b.len() as u64, 0));
        assert_eq!(s.records[1].off as usize, 32 + RECORD_HEAD + 3);

        assert!(
            scan(&b, 4).records.is_empty(),
            "the seed binds records to their segment"
        );

        let mut d = b.clone();
        d[32 + RECORD_HEAD + 1] ^= 0x40;
        let s = scan(&d, 3);
        assert_eq!(s.records.len(), 2);
        assert_eq!(
            (s.skipped_records, s.skipped_bytes),
            (1, RECORD_HEAD as u64 + 3)
        );
        assert_eq!(s.end, b.len() as u64);

        for cut in 33..b.len() {
            let s = scan(&b[..cut], 3);
            assert!(s.end <= cut as u64);
            assert_eq!(
                s.skipped_records, 0,
                "a torn tail is not damage (cut {cut})"
            );
        }
    }

    #[test]
    fn recipes_are_records_with_a_flag_and_round_trip() {
        let parts = [ChunkId([4; 32]), ChunkId([5; 32])];
        let data = encode_recipe(300, &parts);
        assert_eq!(decode_recipe(&data), Some((300, parts.to_vec())));
        assert_eq!(decode_recipe(&data[..4]), None, "no part");
        assert_eq!(decode_recipe(&data[..40]), None, "a part cut short");
        let mut b = segment(3, &[(&[1; 32], b"one")]);
        let off = b.len() as u64;
        encode_record(
            &mut b,
            3,
            off,
            &ChunkId([2; 32]),
            &data,
            xxh3_64(&data),
            true,
        );
        let s = scan(&b, 3);
        assert_eq!(s.records.len(), 2);
        assert!(!s.records[0].recipe && s.records[1].recipe);
        assert_eq!(s.records[1].len as usize, data.len());
        let rec = &b[off as usize..];
        assert_eq!(
            verify_record(rec, 3, off, &ChunkId([2; 32]), data.len() as u32, true),
            Ok(())
        );
        assert!(verify_record(rec, 3, off, &ChunkId([2; 32]), data.len() as u32, false).is_err());
    }

    #[test]
    fn a_segment_inside_a_chunk_is_not_read_as_records() {
        let inner = segment(5, &[(&[9; 32], b"inner")]);
        let outer = segment(5, &[(&[1; 32], &inner)]);
        let s = scan(&outer, 5);
        assert_eq!(s.records.len(), 1);
        assert_eq!(s.records[0].id, ChunkId([1; 32]));
        let mut d = outer.clone();
        d[40] ^= 1;
        let s = scan(&d, 5);
        assert!(
            s.records.is_empty(),
            "no record inside the damaged one verifies"
        );
    }
}
