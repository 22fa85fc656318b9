//! The files cache: what a backup needs to take a file as unchanged without reading it, kept
//! on the backing-up machine rather than in the repository.
//!
//! A tree records each file's size and mtime. Whether a file is the very one backed up before
//! also takes its inode and ctime, which change whenever a file is replaced or its contents,
//! owner or mode are touched. Those are local facts: stored in trees they would make every
//! tree of a re-extracted or copied tree new, so they live here instead, one cache file per
//! snapshot, keyed by a keyed hash of each path (the cache names no path). A missing or
//! damaged cache costs one full read, never a wrong snapshot. The layout is in FORMAT.md.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The first bytes of a files cache.
pub const MAGIC: &[u8; 4] = b"DWFC";
/// The layout version written.
pub const VERSION: u8 = 1;
const ENTRY: usize = 32;

/// The default directory of files caches: `$XDG_CACHE_HOME/dedupwire/backup`, else
/// `$HOME/.cache/dedupwire/backup`; `None` when neither is set.
pub fn default_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("dedupwire").join("backup"))
}

/// What the cache knows of one file: its inode and ctime when it was backed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Inode number.
    pub inode: u64,
    /// Status change time, nanoseconds since 1970.
    pub ctime_ns: i64,
}

/// The files cache of one snapshot: path keys (sorted) with their stamps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilesCache {
    /// The snapshot it describes.
    pub snapshot: String,
    entries: Vec<([u8; 16], Stamp)>,
}

impl FilesCache {
    /// An empty cache for `snapshot`.
    pub fn new(snapshot: &str) -> FilesCache {
        FilesCache {
            snapshot: snapshot.to_string(),
            entries: Vec::new(),
        }
    }

    /// Records a file (call [`FilesCache::seal`] before lookups).
    pub fn push(&mut self, key: [u8; 16], stamp: Stamp) {
        self.entries.push((key, stamp));
    }

    /// Sorts the entries for lookups; of repeated keys the last pushed stays.
    pub fn seal(&mut self) {
        self.entries.reverse();
        self.entries.sort_by_key(|e| e.0);
        self.entries.dedup_by(|later, earlier| later.0 == earlier.0);
    }

    /// The stamp recorded for a path key.
    pub fn get(&self, key: &[u8; 16]) -> Option<Stamp> {
        self.entries
            .binary_search_by(|(k, _)| k.cmp(key))
            .ok()
            .map(|i| self.entries[i].1)
    }

    /// Files recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no file is recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The cache's bytes (entries must be sealed).
    pub fn encode(&self) -> Vec<u8> {
        let id = self.snapshot.as_bytes();
        let mut out = Vec::with_capacity(16 + id.len() + self.entries.len() * ENTRY + 32);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(id.len().min(255) as u8);
        out.extend_from_slice(&id[..id.len().min(255)]);
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for (key, stamp) in &self.entries {
            out.extend_from_slice(key);
            out.extend_from_slice(&stamp.inode.to_le_bytes());
            out.extend_from_slice(&stamp.ctime_ns.to_le_bytes());
        }
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    /// Parses a cache's bytes, refusing anything damaged, truncated or unsorted.
    pub fn decode(bytes: &[u8]) -> Result<FilesCache, String> {
        if bytes.len() < 4 + 1 + 1 + 8 + 32 {
            return Err("too short".to_string());
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err("checksum mismatch".to_string());
        }
        if &body[..4] != MAGIC {
            return Err("not a files cache".to_string());
        }
        if body[4] != VERSION {
            return Err(format!(
                "layout version {} (this build reads {VERSION})",
                body[4]
            ));
        }
        let id_len = usize::from(body[5]);
        let rest = &body[6..];
        if rest.len() < id_len + 8 {
            return Err("truncated header".to_string());
        }
        let snapshot = std::str::from_utf8(&rest[..id_len])
            .map_err(|_| "snapshot id is not text".to_string())?
            .to_string();
        let count = u64::from_le_bytes(rest[id_len..id_len + 8].try_into().expect("8 bytes"));
        let records = &rest[id_len + 8..];
        if count.checked_mul(ENTRY as u64) != Some(records.len() as u64) {
            return Err(format!(
                "{count} entries announced, {} bytes of entries",
                records.len()
            ));
        }
        let mut entries = Vec::with_capacity(count as usize);
        for r in records.chunks_exact(ENTRY) {
            let key: [u8; 16] = r[..16].try_into().expect("16 bytes");
            if entries.last().is_some_and(|(k, _)| *k >= key) {
                return Err("entries out of order".to_string());
            }
            let stamp = Stamp {
                inode: u64::from_le_bytes(r[16..24].try_into().expect("8 bytes")),
                ctime_ns: i64::from_le_bytes(r[24..32].try_into().expect("8 bytes")),
            };
            entries.push((key, stamp));
        }
        Ok(FilesCache { snapshot, entries })
    }

    /// The cache of `snapshot` in `dir`, if there is a sound one.
    pub fn load(dir: &Path, snapshot: &str) -> Option<FilesCache> {
        let bytes = fs::read(dir.join(file_name(snapshot)?)).ok()?;
        FilesCache::decode(&bytes)
            .ok()
            .filter(|c| c.snapshot == snapshot)
    }

    /// Writes the cache into `dir` whole (temporary file, fsync, rename).
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        let name = file_name(&self.snapshot).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a snapshot id")
        })?;
        fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let r = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&self.encode())?;
            f.sync_all()?;
            fs::rename(&tmp, dir.join(name))
        })();
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r
    }

    /// Removes the cache of `snapshot` from `dir` (no error if absent).
    pub fn remove(dir: &Path, snapshot: &str) {
        if let Some(name) = file_name(snapshot) {
            let _ = fs::remove_file(dir.join(name));
        }
    }
}

/// A snapshot id as a file name: hex digits only.
fn file_name(snapshot: &str) -> Option<&str> {
    (!snapshot.is_empty()
        && snapshot.len() <= 128
        && snapshot.bytes().all(|b| b.is_ascii_hexdigit()))
    .then_some(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stamp(i: u64) -> Stamp {
        Stamp {
            inode: i,
            ctime_ns: -(i as i64) * 7,
        }
    }

    #[test]
    fn frozen_vector() {
        let mut c = FilesCache::new("ab01");
        c.push([2; 16], stamp(5));
        c.push([1; 16], stamp(258));
        c.seal();
        let bytes = c.encode();
        assert_eq!(
            hex::encode(&bytes[..bytes.len() - 32]),
            "44574643010461623031020000000000000001010101010101010101010101010101\
             0201000000000000f2f8ffffffffffff0202020202020202020202020202020205000000\
             00000000ddffffffffffffff"
        );
        assert_eq!(FilesCache::decode(&bytes).unwrap(), c);
    }

    #[test]
    fn the_last_stamp_of_a_key_wins() {
        let mut c = FilesCache::new("00");
        c.push([1; 16], stamp(1));
        c.push([1; 16], stamp(2));
        c.seal();
        assert_eq!(c.get(&[1; 16]), Some(stamp(2)));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn damage_is_refused() {
        let mut c = FilesCache::new("0f");
        c.push([3; 16], stamp(3));
        c.seal();
        let bytes = c.encode();
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            assert!(FilesCache::decode(&b).is_err(), "flip at {at}");
        }
        for len in 0..bytes.len() {
            assert!(FilesCache::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
    }

    #[test]
    fn save_load_and_remove() {
        let dir = std::env::temp_dir().join(format!("dw-files-cache-{}", std::process::id()));
        let mut c = FilesCache::new("beef");
        c.push([9; 16], stamp(9));
        c.seal();
        c.save(&dir).unwrap();
        assert_eq!(FilesCache::load(&dir, "beef"), Some(c));
        assert_eq!(FilesCache::load(&dir, "bee"), None);
        FilesCache::remove(&dir, "beef");
        assert_eq!(FilesCache::load(&dir, "beef"), None);
        assert!(FilesCache::new("../x").save(&dir).is_err());
        let _ = fs::remove_dir_all(&dir);
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(
            id in "[0-9a-f]{0,64}",
            entries in proptest::collection::vec((any::<[u8; 16]>(), any::<u64>(), any::<i64>()), 0..50),
        ) {
            let mut c = FilesCache::new(&id);
            for (k, inode, ctime_ns) in &entries {
                c.push(*k, Stamp { inode: *inode, ctime_ns: *ctime_ns });
            }
            c.seal();
            let back = FilesCache::decode(&c.encode()).unwrap();
            prop_assert_eq!(&back, &c);
            for (k, _, _) in &entries {
                prop_assert_eq!(back.get(k), c.get(k));
                prop_assert!(back.get(k).is_some());
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = FilesCache::decode(&bytes);
        }
    }
}
