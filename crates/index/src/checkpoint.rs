//! The table checkpoint: the cuckoo table's raw arrays as of a durable log length, so that a
//! reopen loads them and replays only the log written after it instead of scanning everything.
//!
//! Written with write-temp, fsync, rename, fsync-directory; a damaged or stale checkpoint is
//! ignored (the log is the source of truth), never trusted.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};
use crate::format::{ALIGN, CKPT_MAGIC, CKPT_VERSION, HEADER_LEN};
use crate::log::sync_dir;
use crate::table::{BUCKETS, HASHES, TOMB};

/// Bytes before the arrays.
const FIXED: usize = 56;

/// A decoded checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Generation of the log this checkpoint belongs to.
    pub generation: u64,
    /// Log length (durable) the table reflects.
    pub log_len: u64,
    /// Bytes of live entries in the log.
    pub live_bytes: u64,
    /// Total record ids in live entries.
    pub refs: u64,
    /// Bucket signatures.
    pub sigs: Vec<u16>,
    /// Bucket pointers.
    pub ptrs: Vec<u32>,
}

/// Serialises a checkpoint of the given arrays.
pub fn encode(
    generation: u64,
    log_len: u64,
    live_bytes: u64,
    refs: u64,
    sigs: &[u16],
    ptrs: &[u32],
) -> Vec<u8> {
    let mut b = Vec::with_capacity(FIXED + sigs.len() * 6 + 8);
    b.extend_from_slice(&CKPT_MAGIC);
    b.extend_from_slice(&CKPT_VERSION.to_le_bytes());
    b.extend_from_slice(&(HASHES as u16).to_le_bytes());
    b.extend_from_slice(&(BUCKETS as u16).to_le_bytes());
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(&log_len.to_le_bytes());
    b.extend_from_slice(&live_bytes.to_le_bytes());
    b.extend_from_slice(&refs.to_le_bytes());
    b.extend_from_slice(&(ptrs.len() as u64).to_le_bytes());
    debug_assert_eq!(b.len(), FIXED);
    for s in sigs {
        b.extend_from_slice(&s.to_le_bytes());
    }
    for p in ptrs {
        b.extend_from_slice(&p.to_le_bytes());
    }
    let sum = xxh3_64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Parses and validates a checkpoint; the error is why it cannot be used.
pub fn decode(b: &[u8]) -> std::result::Result<Checkpoint, String> {
    if b.len() < FIXED + 8 || b[0..8] != CKPT_MAGIC {
        return Err("not a checkpoint file".into());
    }
    let (body, sum) = b.split_at(b.len() - 8);
    if xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err("checkpoint checksum mismatch".into());
    }
    let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let hashes = u16::from_le_bytes([b[12], b[13]]);
    let buckets = u16::from_le_bytes([b[14], b[15]]);
    if version != CKPT_VERSION || usize::from(hashes) != HASHES || usize::from(buckets) != BUCKETS {
        return Err(format!(
            "checkpoint version {version} ({hashes} hashes, {buckets} buckets) is not ours"
        ));
    }
    let n = u64_at(b, 48);
    if n == 0
        || !n.is_multiple_of(BUCKETS as u64)
        || n.checked_mul(6).map(|x| x + FIXED as u64 + 8) != Some(b.len() as u64)
    {
        return Err("checkpoint size does not match its bucket count".into());
    }
    let n = n as usize;
    let log_len = u64_at(b, 24);
    let sigs: Vec<u16> = b[FIXED..FIXED + 2 * n]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let ptrs: Vec<u32> = b[FIXED + 2 * n..FIXED + 6 * n]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    if let Some(p) = ptrs.iter().find(|&&p| {
        p > TOMB && (u64::from(p) * ALIGN < HEADER_LEN || u64::from(p) * ALIGN >= log_len)
    }) {
        return Err(format!(
            "checkpoint points at {} beyond its log length {log_len}",
            u64::from(*p) * ALIGN
        ));
    }
    Ok(Checkpoint {
        generation: u64_at(b, 16),
        log_len,
        live_bytes: u64_at(b, 32),
        refs: u64_at(b, 40),
        sigs,
        ptrs,
    })
}

/// Reads the checkpoint at `path`: `Ok(None)` if there is none, `Err(reason)` if unusable.
pub fn read(path: &Path) -> std::result::Result<Option<Checkpoint>, String> {
    match std::fs::read(path) {
        Ok(b) => decode(&b).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Writes `bytes` to `path` atomically and durably (temp file, fsync, rename, fsync dir).
pub fn write_atomic(dir: &Path, tmp: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(tmp).map_err(|e| Error::io(tmp, "create", e))?;
    f.write_all(bytes).map_err(|e| Error::io(tmp, "write", e))?;
    f.sync_all().map_err(|e| Error::io(tmp, "fsync", e))?;
    drop(f);
    std::fs::rename(tmp, path).map_err(|e| Error::io(path, "rename", e))?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let sigs = vec![1u16, 2, 3, 4, 5, 6, 7, 8];
        let ptrs = vec![0u32, 1, 4, 5, 0, 0, 9, 0];
        let b = encode(3, 100, 50, 7, &sigs, &ptrs);
        let c = decode(&b).unwrap();
        assert_eq!(
            (c.generation, c.log_len, c.live_bytes, c.refs),
            (3, 100, 50, 7)
        );
        assert_eq!((c.sigs, c.ptrs), (sigs.clone(), ptrs.clone()));
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(decode(&d).is_err(), "flip at {i}");
        }
        assert!(decode(&b[..b.len() - 1]).is_err());
        // A pointer past the log length is refused even with a valid checksum.
        let bad = encode(3, 72, 50, 7, &sigs, &ptrs);
        assert!(decode(&bad).is_err());
    }
}
