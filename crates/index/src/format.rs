//! The on-disk byte layout of the metadata log and the checkpoint (see `FORMAT.md`).
//!
//! Everything is little-endian. Log entries are 8-byte aligned, never cross a 64 KiB page
//! boundary, and carry an xxh3 checksum seeded with their own file offset, so that a copy of a
//! valid entry at another position is not valid.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Size of one log page in bytes (64 KiB, as in sDedup).
pub const PAGE_SIZE: u64 = 65_536;
/// Log entries are aligned to this many bytes; pointers count in these units.
pub const ALIGN: u64 = 8;
/// Magic bytes at the start of the log file.
pub const LOG_MAGIC: [u8; 8] = *b"DWFXLOG\x01";
/// Magic bytes at the start of the checkpoint file.
pub const CKPT_MAGIC: [u8; 8] = *b"DWFXCKP\x01";
/// Version of the log format.
pub const LOG_VERSION: u32 = 1;
/// Version of the checkpoint format (includes the hash function layout of the table).
pub const CKPT_VERSION: u32 = 1;
/// Size of the log file header; the first entry starts here.
pub const HEADER_LEN: u64 = 32;
/// Size of an entry header (len, kind, reserved, synced, feature) before the record ids.
pub const ENTRY_FIXED: usize = 16;
/// Size of the checksum trailer of an entry.
pub const ENTRY_TRAILER: usize = 8;
/// Smallest feature entry (a deletion: no ids).
pub const ENTRY_MIN: usize = ENTRY_FIXED + ENTRY_TRAILER;
/// Largest number of record ids one entry may hold (keeps every entry well inside a page).
pub const MAX_IDS_PER_ENTRY: usize = 4096;
/// Largest log the 32-bit pointers can address: 2^32 units of 8 bytes (32 GiB).
pub const MAX_LOG_BYTES: u64 = (u32::MAX as u64 + 1) * ALIGN;

/// Entry kind: the current record list of a feature (newest first, at least one id).
pub const KIND_FEATURE: u8 = 1;
/// Entry kind: the feature has no records any more.
pub const KIND_DELETE: u8 = 2;
/// Entry kind: padding to the end of the page.
pub const KIND_PAD: u8 = 3;

/// The header of the log file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHeader {
    /// Incremented by every compaction; ties a checkpoint to one log file.
    pub generation: u64,
}

impl LogHeader {
    /// Serialises the header to its 32 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut b = [0u8; HEADER_LEN as usize];
        b[0..8].copy_from_slice(&LOG_MAGIC);
        b[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        let sum = xxh3_64_with_seed(&b[0..24], 0);
        b[24..32].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses and checks a header; the error is a human-readable reason.
    pub fn decode(b: &[u8]) -> Result<LogHeader, String> {
        if b.len() < HEADER_LEN as usize {
            return Err(format!(
                "file is {} bytes, shorter than its header",
                b.len()
            ));
        }
        if b[0..8] != LOG_MAGIC {
            return Err("bad magic: not a dedupwire feature log".into());
        }
        let sum = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
        if sum != xxh3_64_with_seed(&b[0..24], 0) {
            return Err("header checksum mismatch".into());
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if version != LOG_VERSION {
            return Err(format!("unsupported log version {version}"));
        }
        let page = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
        if u64::from(page) != PAGE_SIZE {
            return Err(format!("unsupported page size {page}"));
        }
        Ok(LogHeader {
            generation: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }
}

/// Bytes of a feature (or deletion) entry holding `ids` record ids.
pub fn entry_len(ids: usize) -> usize {
    ENTRY_MIN + ids * 8
}

/// Appends a feature entry (or a deletion when `ids` is empty) that will live at `offset`.
pub fn encode_entry(out: &mut Vec<u8>, offset: u64, synced_units: u32, feature: u64, ids: &[u64]) {
    let start = out.len();
    let len = entry_len(ids.len());
    let kind = if ids.is_empty() {
        KIND_DELETE
    } else {
        KIND_FEATURE
    };
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.push(kind);
    out.push(0);
    out.extend_from_slice(&synced_units.to_le_bytes());
    out.extend_from_slice(&feature.to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    let sum = xxh3_64_with_seed(&out[start..], offset);
    out.extend_from_slice(&sum.to_le_bytes());
}

/// Appends a padding entry of `len` bytes (to the end of the page) that will live at `offset`.
pub fn encode_pad(out: &mut Vec<u8>, offset: u64, len: usize) {
    let start = out.len();
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.push(KIND_PAD);
    out.push(0);
    let check = xxh3_64_with_seed(&out[start..start + 4], offset) as u32;
    out.extend_from_slice(&check.to_le_bytes());
    out.resize(start + len, 0);
}

/// A decoded log entry, borrowing its ids from the page bytes.
#[derive(Debug, Clone, Copy)]
pub enum Entry<'a> {
    /// A feature's record list, or a deletion when `ids` is empty.
    Feature {
        /// Total bytes of the entry.
        len: usize,
        /// Durable hint: the log length (in 8-byte units) made durable before this entry.
        synced_units: u32,
        /// The full 64-bit feature.
        feature: u64,
        /// Raw little-endian record ids, newest first.
        ids: &'a [u8],
    },
    /// Padding to the end of the page.
    Pad {
        /// Total bytes of the padding.
        len: usize,
    },
}

impl Entry<'_> {
    /// Total bytes of the entry.
    pub fn len(&self) -> usize {
        match *self {
            Entry::Feature { len, .. } | Entry::Pad { len } => len,
        }
    }

    /// Iterates the record ids of a feature entry (empty for padding).
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        let raw: &[u8] = match self {
            Entry::Feature { ids, .. } => ids,
            Entry::Pad { .. } => &[],
        };
        raw.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
    }
}

/// Decodes the entry at the start of `b`, which lives at file offset `offset`; `b` must end at
/// or before the end of the entry's page. Returns a reason when the bytes are not a valid entry.
pub fn decode_entry(b: &[u8], offset: u64) -> Result<Entry<'_>, &'static str> {
    if b.len() < 8 {
        return Err("truncated entry header");
    }
    let len = usize::from(u16::from_le_bytes([b[0], b[1]]));
    let page_left = (PAGE_SIZE - offset % PAGE_SIZE) as usize;
    if len < 8 || len % ALIGN as usize != 0 || len > page_left {
        return Err("bad entry length");
    }
    let kind = b[2];
    if b[3] != 0 {
        return Err("bad reserved byte");
    }
    match kind {
        KIND_PAD => {
            if len != page_left {
                return Err("padding does not end at the page boundary");
            }
            let check = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
            if check != xxh3_64_with_seed(&b[0..4], offset) as u32 {
                return Err("padding checksum mismatch");
            }
            Ok(Entry::Pad { len })
        }
        KIND_FEATURE | KIND_DELETE => {
            if len < ENTRY_MIN {
                return Err("bad entry length");
            }
            if b.len() < len {
                return Err("truncated entry");
            }
            let n = (len - ENTRY_MIN) / 8;
            if (kind == KIND_DELETE) != (n == 0) || n > MAX_IDS_PER_ENTRY {
                return Err("bad entry kind or id count");
            }
            let sum = u64::from_le_bytes(b[len - 8..len].try_into().expect("8 bytes"));
            if sum != xxh3_64_with_seed(&b[..len - 8], offset) {
                return Err("entry checksum mismatch");
            }
            Ok(Entry::Feature {
                len,
                synced_units: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
                feature: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
                ids: &b[ENTRY_FIXED..len - 8],
            })
        }
        _ => Err("unknown entry kind"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejects_damage() {
        let h = LogHeader { generation: 7 };
        let mut b = h.encode();
        assert_eq!(LogHeader::decode(&b), Ok(h));
        b[17] ^= 1;
        assert!(LogHeader::decode(&b).is_err());
        assert!(LogHeader::decode(&b[..10]).is_err());
    }

    #[test]
    fn entry_round_trip() {
        let mut out = Vec::new();
        encode_entry(&mut out, 4096, 12, 0xdead_beef, &[3, 2, 1]);
        assert_eq!(out.len(), entry_len(3));
        match decode_entry(&out, 4096).unwrap() {
            Entry::Feature {
                len,
                synced_units,
                feature,
                ..
            } => {
                assert_eq!((len, synced_units, feature), (out.len(), 12, 0xdead_beef));
            }
            Entry::Pad { .. } => panic!("expected a feature entry"),
        }
        let e = decode_entry(&out, 4096).unwrap();
        assert_eq!(e.ids().collect::<Vec<_>>(), vec![3, 2, 1]);
        // The checksum is seeded with the offset: the same bytes elsewhere are not valid.
        assert!(decode_entry(&out, 4104).is_err());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let mut out = Vec::new();
        encode_entry(&mut out, 64, 1, 42, &[9, 8]);
        for i in 0..out.len() * 8 {
            let mut b = out.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(
                decode_entry(&b, 64).is_err(),
                "flip of bit {i} went unnoticed"
            );
        }
    }

    #[test]
    fn pad_must_reach_page_end() {
        let off = PAGE_SIZE - 16;
        let mut out = Vec::new();
        encode_pad(&mut out, off, 16);
        assert!(matches!(
            decode_entry(&out, off),
            Ok(Entry::Pad { len: 16 })
        ));
        assert!(decode_entry(&out, off - 8).is_err());
        let zeros = [0u8; 32];
        assert!(decode_entry(&zeros, 64).is_err());
    }
}
