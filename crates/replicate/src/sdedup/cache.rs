//! The source document cache (sDedup §4.3): recent documents by key, LRU, bounded by entries.
//!
//! When a cached document serves as a delta source, its entry is replaced by the new target,
//! because the newer version predicts future versions better. Sender and receiver apply the
//! same rule to the same stream, so their caches hold the same documents.

use std::collections::{BTreeMap, HashMap};

/// Key hash → document, evicting the least recently used beyond `capacity` entries.
#[derive(Debug)]
pub struct SourceCache {
    capacity: usize,
    tick: u64,
    docs: HashMap<u64, (u64, Vec<u8>)>,
    by_age: BTreeMap<u64, u64>,
    bytes: usize,
    hits: u64,
    misses: u64,
}

impl SourceCache {
    /// An empty cache of at most `capacity` documents (at least one).
    pub fn new(capacity: usize) -> Self {
        SourceCache {
            capacity: capacity.max(1),
            tick: 0,
            docs: HashMap::new(),
            by_age: BTreeMap::new(),
            bytes: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// True when `key` is cached (no effect on recency: used for scoring).
    pub fn contains(&self, key: u64) -> bool {
        self.docs.contains_key(&key)
    }

    /// The cached document for `key`, counting a hit or a miss.
    pub fn lookup(&mut self, key: u64) -> Option<&[u8]> {
        match self.docs.get(&key) {
            Some((_, d)) => {
                self.hits += 1;
                Some(d.as_slice())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Records `doc` as the newest version of `key`; when it was delta-encoded against a
    /// cached `source` of another key, that entry gives way to it.
    pub fn put(&mut self, key: u64, doc: &[u8], replaced_source: Option<u64>) {
        if let Some(src) = replaced_source.filter(|&s| s != key) {
            self.remove(src);
        }
        self.remove(key);
        self.tick += 1;
        self.bytes += doc.len();
        self.docs.insert(key, (self.tick, doc.to_vec()));
        self.by_age.insert(self.tick, key);
        while self.docs.len() > self.capacity {
            let (_, old) = self.by_age.pop_first().expect("non-empty");
            if let Some((_, d)) = self.docs.remove(&old) {
                self.bytes -= d.len();
            }
        }
    }

    /// Forgets `key` (a deleted document).
    pub fn remove(&mut self, key: u64) {
        if let Some((t, d)) = self.docs.remove(&key) {
            self.by_age.remove(&t);
            self.bytes -= d.len();
        }
    }

    /// (hits, misses) of [`SourceCache::lookup`] so far.
    pub fn hit_counts(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Bytes of documents held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_replaces_its_source_and_lru_evicts() {
        let mut c = SourceCache::new(2);
        c.put(1, b"a", None);
        c.put(2, b"b", None);
        c.put(3, b"c", Some(1));
        assert!(!c.contains(1) && c.contains(2) && c.contains(3));
        c.put(4, b"d", None);
        assert!(!c.contains(2), "oldest evicted");
        assert_eq!(c.lookup(3), Some(&b"c"[..]));
        assert_eq!(c.lookup(9), None);
        assert_eq!(c.hit_counts(), (1, 1));
        assert_eq!(c.bytes(), 2);
    }
}
