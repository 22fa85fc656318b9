//! The in-memory exact index: fingerprint → where the chunk already is.
//!
//! Channels and analysis keep it in RAM; repositories will use a compact on-disk index with the
//! same interface. [`ExactIndex::memory_bytes`] reports what it costs, the first thing users of
//! backup tools complain about.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for keys that are already uniformly distributed (fingerprint prefixes).
#[derive(Default, Clone, Copy)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
    fn write_u128(&mut self, v: u128) {
        self.0 ^= v as u64 ^ (v >> 64) as u64;
    }
}

/// `BuildHasher` for [`PassThroughHasher`].
pub type PassThrough = BuildHasherDefault<PassThroughHasher>;

/// Maps chunk identities `K` (fingerprints or fast ids) to caller-defined locations `V`.
#[derive(Debug, Clone)]
pub struct ExactIndex<K, V> {
    map: HashMap<K, V, PassThrough>,
}

impl<K: std::hash::Hash + Eq, V> Default for ExactIndex<K, V> {
    fn default() -> Self {
        ExactIndex {
            map: HashMap::default(),
        }
    }
}

impl<K: std::hash::Hash + Eq, V> ExactIndex<K, V> {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The location of `key`, if it was inserted.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }

    /// Records `key` at `value` unless already present; returns the existing location if any.
    pub fn insert_if_absent(&mut self, key: K, value: V) -> Option<&V> {
        use std::collections::hash_map::Entry;
        match self.map.entry(key) {
            Entry::Occupied(e) => Some(e.into_mut()),
            Entry::Vacant(e) => {
                e.insert(value);
                None
            }
        }
    }

    /// Records `key` at `value`, replacing any earlier location; returns the earlier one.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.map.insert(key, value)
    }

    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing was inserted.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes of RAM the table holds (capacity × entry size, plus one control byte per slot).
    pub fn memory_bytes(&self) -> usize {
        self.map.capacity() * (std::mem::size_of::<(K, V)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprinter;

    #[test]
    fn finds_what_was_inserted_once() {
        let fp = Fingerprinter::new();
        let mut idx = ExactIndex::new();
        assert!(idx.insert_if_absent(fp.fingerprint(b"a"), 1u32).is_none());
        assert_eq!(idx.insert_if_absent(fp.fingerprint(b"a"), 2), Some(&1));
        assert_eq!(idx.get(&fp.fingerprint(b"a")), Some(&1));
        assert!(idx.get(&fp.fingerprint(b"b")).is_none());
        assert_eq!(idx.len(), 1);
        assert!(idx.memory_bytes() >= 36);
    }
}
