//! An LRU cache of immutable 64 KiB log pages, in front of the log file.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for page numbers (small integers): one multiply.
#[derive(Default, Clone, Copy)]
pub struct PageHasher(u64);

impl Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

struct Slot {
    page: u64,
    tick: u64,
    data: Box<[u8]>,
}

/// LRU cache of whole pages, keyed by page number; pages are never modified once cached.
pub struct PageCache {
    capacity: usize,
    map: HashMap<u64, usize, BuildHasherDefault<PageHasher>>,
    slots: Vec<Slot>,
    tick: u64,
    hits: u64,
    misses: u64,
}

impl PageCache {
    /// A cache of at most `capacity` (at least 1) pages.
    pub fn new(capacity: usize) -> PageCache {
        PageCache {
            capacity: capacity.max(1),
            map: HashMap::default(),
            slots: Vec::new(),
            tick: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// The cached page, counting a hit or a miss.
    pub fn get(&mut self, page: u64) -> Option<&[u8]> {
        self.tick += 1;
        match self.map.get(&page) {
            Some(&i) => {
                self.hits += 1;
                let s = &mut self.slots[i];
                s.tick = self.tick;
                Some(&s.data)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// The cached page without counting a hit or refreshing its age.
    pub fn peek(&self, page: u64) -> Option<&[u8]> {
        self.map.get(&page).map(|&i| &*self.slots[i].data)
    }

    /// Takes a buffer to fill with a page: a recycled one when the cache is full.
    pub fn spare(&mut self, len: usize) -> Box<[u8]> {
        if self.slots.len() >= self.capacity {
            // Evict the least recently used page (linear: the cache holds ~100 pages and this
            // runs once per disk read).
            let (i, _) = self
                .slots
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.tick)
                .expect("cache is not empty");
            let s = self.slots.swap_remove(i);
            self.map.remove(&s.page);
            if i < self.slots.len() {
                self.map.insert(self.slots[i].page, i);
            }
            if s.data.len() == len {
                return s.data;
            }
        }
        vec![0u8; len].into_boxed_slice()
    }

    /// Caches `data` as page `page` (replacing an older copy) and returns it.
    pub fn insert(&mut self, page: u64, data: Box<[u8]>) -> &[u8] {
        self.tick += 1;
        if let Some(&i) = self.map.get(&page) {
            self.slots[i] = Slot {
                page,
                tick: self.tick,
                data,
            };
            return &self.slots[i].data;
        }
        if self.slots.len() >= self.capacity {
            drop(self.spare(0));
        }
        self.slots.push(Slot {
            page,
            tick: self.tick,
            data,
        });
        let i = self.slots.len() - 1;
        self.map.insert(page, i);
        &self.slots[i].data
    }

    /// Bytes of RAM held by cached pages.
    pub fn memory_bytes(&self) -> usize {
        self.slots.iter().map(|s| s.data.len()).sum()
    }

    /// Number of cached pages.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// (hits, misses) since the cache was created.
    pub fn counters(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> Box<[u8]> {
        vec![b; 4].into_boxed_slice()
    }

    #[test]
    fn evicts_least_recently_used() {
        let mut c = PageCache::new(2);
        c.insert(1, page(1));
        c.insert(2, page(2));
        assert_eq!(c.get(1).unwrap()[0], 1); // 2 is now the LRU page
        c.insert(3, page(3));
        assert!(c.get(2).is_none());
        assert_eq!(c.get(1).unwrap()[0], 1);
        assert_eq!(c.get(3).unwrap()[0], 3);
        assert_eq!(c.len(), 2);
        assert_eq!(c.counters(), (3, 1));
    }

    #[test]
    fn spare_recycles_the_evicted_buffer() {
        let mut c = PageCache::new(1);
        c.insert(1, page(7));
        let b = c.spare(4);
        assert_eq!(b.len(), 4);
        assert_eq!(c.len(), 0);
        assert!(c.get(1).is_none());
        c.insert(2, b);
        c.insert(2, page(9));
        assert_eq!(c.get(2).unwrap()[0], 9);
        assert_eq!(c.memory_bytes(), 4);
    }
}
