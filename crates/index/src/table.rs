//! The in-RAM cuckoo hash table of sDedup §4.2: 16 hash functions, 8 buckets per slot, each
//! bucket a 2-byte signature and a 4-byte pointer (6 bytes of RAM per bucket).
//!
//! The table does not hold the features themselves: a signature match is confirmed by the caller
//! (which reads the pointed-to log entry and compares the full feature). Keys are placed along a
//! fixed probe chain `h_0, h_1, …, h_15` into the first slot with a free bucket, so a lookup can
//! stop at the first slot of its chain that still has an *empty* bucket. Removed keys leave
//! tombstones (free for insertion, but not "empty"), which keeps that rule valid; tombstones are
//! cleared when the table is rebuilt.

use xxhash_rust::xxh3::xxh3_128_with_seed;

/// Number of hash functions (candidate slots per key).
pub const HASHES: usize = 16;
/// Number of buckets per slot.
pub const BUCKETS: usize = 8;
/// Pointer value of a bucket that has never been used.
pub const EMPTY: u32 = 0;
/// Pointer value of a bucket whose key was removed.
pub const TOMB: u32 = 1;
/// Seed of the table hash; part of the checkpoint format (change `CKPT_VERSION` with it).
const HASH_SEED: u64 = 0x6465_6475_7077_6972; // "dedupwir"

/// Bytes of RAM per bucket (2-byte signature + 4-byte pointer).
pub const BUCKET_BYTES: usize = 6;

/// The probe chain of one key, derived from one 128-bit xxh3 hash by double hashing.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    a: u64,
    b: u64,
}

impl Probe {
    /// The probe chain of `feature`.
    #[inline]
    pub fn new(feature: u64) -> Probe {
        let h = xxh3_128_with_seed(&feature.to_le_bytes(), HASH_SEED);
        Probe {
            a: h as u64,
            b: ((h >> 64) as u64) | 1,
        }
    }

    /// Slot and signature of hash function `i` in a table of `slots` slots.
    #[inline]
    pub fn at(&self, i: usize, slots: usize) -> (usize, u16) {
        let g = self.a.wrapping_add((i as u64).wrapping_mul(self.b));
        let g = g ^ (g >> 29); // mix so that the low (signature) bits depend on the high ones too
        let slot = ((u128::from(g) * slots as u128) >> 64) as usize;
        (slot, g as u16)
    }
}

/// Result of [`Table::find`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Find {
    /// The key is in this bucket.
    Found(usize),
    /// The key is absent; `free` is where it should go (bucket, signature), if the chain has room.
    Absent {
        /// First free bucket along the key's chain and the signature to store there.
        free: Option<(usize, u16)>,
    },
}

/// The cuckoo table.
#[derive(Debug, Clone)]
pub struct Table {
    slots: usize,
    sigs: Vec<u16>,
    ptrs: Vec<u32>,
    occupied: usize,
    tombs: usize,
    rng: u64,
    max_kicks: u32,
    /// Full features per bucket, kept only while bulk-building (so displacement needs no I/O).
    shadow: Option<Vec<u64>>,
}

impl Table {
    /// An empty table of `slots` slots (at least 1).
    pub fn new(slots: usize, max_kicks: u32) -> Table {
        let slots = slots.max(1);
        Table {
            slots,
            sigs: vec![0; slots * BUCKETS],
            ptrs: vec![EMPTY; slots * BUCKETS],
            occupied: 0,
            tombs: 0,
            rng: 0x9e37_79b9_7f4a_7c15 ^ slots as u64,
            max_kicks,
            shadow: None,
        }
    }

    /// A table rebuilt from its raw arrays (a checkpoint); `None` if the arrays are inconsistent.
    pub fn from_raw(sigs: Vec<u16>, ptrs: Vec<u32>, max_kicks: u32) -> Option<Table> {
        if sigs.len() != ptrs.len() || ptrs.is_empty() || !ptrs.len().is_multiple_of(BUCKETS) {
            return None;
        }
        let occupied = ptrs.iter().filter(|&&p| p > TOMB).count();
        let tombs = ptrs.iter().filter(|&&p| p == TOMB).count();
        let slots = ptrs.len() / BUCKETS;
        Some(Table {
            slots,
            sigs,
            ptrs,
            occupied,
            tombs,
            rng: 0x9e37_79b9_7f4a_7c15 ^ slots as u64,
            max_kicks,
            shadow: None,
        })
    }

    /// Slots needed to hold `keys` keys at load factor `load`.
    pub fn slots_for(keys: usize, load: f64) -> usize {
        ((keys as f64 / (BUCKETS as f64 * load)).ceil() as usize).max(1)
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Number of buckets (slots × 8).
    pub fn buckets(&self) -> usize {
        self.ptrs.len()
    }

    /// Number of buckets holding a key.
    pub fn len(&self) -> usize {
        self.occupied
    }

    /// Number of tombstones.
    pub fn tombstones(&self) -> usize {
        self.tombs
    }

    /// Fraction of buckets holding a key.
    pub fn load(&self) -> f64 {
        self.occupied as f64 / self.buckets() as f64
    }

    /// Bytes of RAM held by the signature and pointer arrays.
    pub fn memory_bytes(&self) -> usize {
        self.sigs.capacity() * 2 + self.ptrs.capacity() * 4
    }

    /// The signature array (for checkpoints).
    pub fn sigs(&self) -> &[u16] {
        &self.sigs
    }

    /// The pointer array (for checkpoints and compaction).
    pub fn ptrs(&self) -> &[u32] {
        &self.ptrs
    }

    /// Pointer stored in bucket `b`.
    #[cfg(test)]
    pub fn ptr(&self, b: usize) -> u32 {
        self.ptrs[b]
    }

    /// Replaces the pointer of an occupied bucket (the key is unchanged).
    pub fn set_ptr(&mut self, b: usize, ptr: u32) {
        debug_assert!(self.ptrs[b] > TOMB && ptr > TOMB);
        self.ptrs[b] = ptr;
    }

    /// Turns an occupied bucket into a tombstone.
    pub fn remove(&mut self, b: usize) {
        debug_assert!(self.ptrs[b] > TOMB);
        self.ptrs[b] = TOMB;
        self.sigs[b] = 0;
        self.occupied -= 1;
        self.tombs += 1;
    }

    /// Looks `feature` up; `is_match(ptr)` confirms a signature match against the full feature.
    pub fn find<E>(
        &self,
        feature: u64,
        mut is_match: impl FnMut(u32) -> Result<bool, E>,
    ) -> Result<Find, E> {
        let probe = Probe::new(feature);
        let mut free = None;
        for i in 0..HASHES {
            let (slot, sig) = probe.at(i, self.slots);
            let base = slot * BUCKETS;
            let mut has_empty = false;
            for b in base..base + BUCKETS {
                let p = self.ptrs[b];
                if p <= TOMB {
                    has_empty |= p == EMPTY;
                    if free.is_none() {
                        free = Some((b, sig));
                    }
                } else if self.sigs[b] == sig && is_match(p)? {
                    return Ok(Find::Found(b));
                }
            }
            if has_empty {
                break;
            }
        }
        Ok(Find::Absent { free })
    }

    /// Stores a key known to be absent into a free bucket found by [`Table::find`].
    pub fn place(&mut self, b: usize, sig: u16, ptr: u32, feature: u64) {
        debug_assert!(self.ptrs[b] <= TOMB && ptr > TOMB);
        if self.ptrs[b] == TOMB {
            self.tombs -= 1;
        }
        self.sigs[b] = sig;
        self.ptrs[b] = ptr;
        self.occupied += 1;
        if let Some(shadow) = &mut self.shadow {
            shadow[b] = feature;
        }
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Inserts a key known to be absent, displacing others (random walk) when its chain is full.
    ///
    /// `feature_of(ptr)` returns the full feature of a displaced key (read from the log) unless
    /// the table is bulk-building. Returns `Some((feature, ptr))` of a key left without a bucket
    /// after the maximum number of displacements: the caller must grow the table.
    pub fn insert<E>(
        &mut self,
        feature: u64,
        ptr: u32,
        mut feature_of: impl FnMut(u32) -> Result<u64, E>,
    ) -> Result<Option<(u64, u32)>, E> {
        let (mut cur_f, mut cur_p) = (feature, ptr);
        let mut kicks = 0u32;
        loop {
            let probe = Probe::new(cur_f);
            for i in 0..HASHES {
                let (slot, sig) = probe.at(i, self.slots);
                let base = slot * BUCKETS;
                for b in base..base + BUCKETS {
                    if self.ptrs[b] <= TOMB {
                        self.place(b, sig, cur_p, cur_f);
                        return Ok(None);
                    }
                }
            }
            if kicks >= self.max_kicks {
                return Ok(Some((cur_f, cur_p)));
            }
            kicks += 1;
            // Every bucket of the chain is taken: evict a random one and re-insert its key.
            let r = self.next_rand();
            let i = (r % HASHES as u64) as usize;
            let j = ((r >> 8) % BUCKETS as u64) as usize;
            let (slot, sig) = probe.at(i, self.slots);
            let b = slot * BUCKETS + j;
            let victim_p = self.ptrs[b];
            let victim_f = match &self.shadow {
                Some(shadow) => shadow[b],
                None => feature_of(victim_p)?,
            };
            self.sigs[b] = sig;
            self.ptrs[b] = cur_p;
            if let Some(shadow) = &mut self.shadow {
                shadow[b] = cur_f;
            }
            cur_f = victim_f;
            cur_p = victim_p;
        }
    }

    /// Builds a table of at least `slots` slots holding all `keys` (feature, ptr), each feature
    /// once; grows by `growth` until every key fits.
    pub fn build(keys: &[(u64, u32)], slots: usize, growth: f64, max_kicks: u32) -> Table {
        let mut slots = slots.max(Table::slots_for(keys.len(), 0.98));
        loop {
            let mut t = Table::new(slots, max_kicks);
            t.shadow = Some(vec![0; t.buckets()]);
            let mut ok = true;
            for &(f, p) in keys {
                let r: Result<_, std::convert::Infallible> = t.insert(f, p, |_| unreachable!());
                if matches!(r, Ok(Some(_))) {
                    ok = false;
                    break;
                }
            }
            if ok {
                t.shadow = None;
                return t;
            }
            slots = ((slots as f64 * growth).ceil() as usize).max(slots + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::convert::Infallible;

    /// A table plus an in-memory "log" mapping pointers to features.
    struct Harness {
        t: Table,
        log: Vec<u64>, // ptr - 2 -> feature
    }

    impl Harness {
        fn new(slots: usize) -> Harness {
            Harness {
                t: Table::new(slots, 500),
                log: Vec::new(),
            }
        }
        fn feature(&self, p: u32) -> u64 {
            self.log[(p - 2) as usize]
        }
        fn get(&self, f: u64) -> Option<usize> {
            let log = &self.log;
            match self
                .t
                .find::<Infallible>(f, |p| Ok(log[(p - 2) as usize] == f))
                .unwrap()
            {
                Find::Found(b) => Some(b),
                Find::Absent { .. } => None,
            }
        }
        /// Inserts; returns false when the table is full.
        fn put(&mut self, f: u64) -> bool {
            let log = &self.log;
            let r = self
                .t
                .find::<Infallible>(f, |p| Ok(log[(p - 2) as usize] == f))
                .unwrap();
            self.log.push(f);
            let p = self.log.len() as u32 + 1;
            match r {
                Find::Found(b) => {
                    self.t.set_ptr(b, p);
                    true
                }
                Find::Absent {
                    free: Some((b, sig)),
                } => {
                    self.t.place(b, sig, p, f);
                    true
                }
                Find::Absent { free: None } => {
                    let log = &self.log;
                    let r = self
                        .t
                        .insert::<Infallible>(f, p, |q| Ok(log[(q - 2) as usize]))
                        .unwrap();
                    r.is_none()
                }
            }
        }
    }

    #[test]
    fn insert_find_update_remove() {
        let mut h = Harness::new(64);
        for f in 0..400u64 {
            assert!(h.put(f * 7919));
        }
        for f in 0..400u64 {
            let b = h.get(f * 7919).expect("present");
            assert_eq!(h.feature(h.t.ptr(b)), f * 7919);
        }
        assert_eq!(h.get(1), None);
        // Update keeps one bucket per key.
        assert!(h.put(7919));
        assert_eq!(h.t.len(), 400);
        let b = h.get(7919).unwrap();
        h.t.remove(b);
        assert_eq!(h.get(7919), None);
        assert_eq!(h.t.tombstones(), 1);
        for f in 0..400u64 {
            assert_eq!(h.get(f * 7919).is_some(), f != 1, "key {f}");
        }
    }

    #[test]
    fn fills_to_high_load_with_displacement() {
        let slots = 1024;
        let mut h = Harness::new(slots);
        let mut n = 0u64;
        while h.put(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            n += 1;
        }
        let load = h.t.len() as f64 / h.t.buckets() as f64;
        assert!(load > 0.97, "load at first failure {load}");
        // Everything placed is still found (one displaced key was left homeless).
        let mut found = 0;
        for i in 0..=n {
            if h.get(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).is_some() {
                found += 1;
            }
        }
        assert_eq!(found, h.t.len() as u64);
    }

    #[test]
    fn build_holds_every_key() {
        let keys: Vec<(u64, u32)> = (0..5000u64).map(|i| (i * 31 + 5, i as u32 + 2)).collect();
        let t = Table::build(&keys, 1, 1.25, 500);
        assert!(t.load() > 0.5);
        let by_ptr: HashMap<u32, u64> = keys.iter().map(|&(f, p)| (p, f)).collect();
        for &(f, p) in &keys {
            let r = t.find::<Infallible>(f, |q| Ok(by_ptr[&q] == f)).unwrap();
            match r {
                Find::Found(b) => assert_eq!(t.ptr(b), p),
                Find::Absent { .. } => panic!("lost key {f}"),
            }
        }
    }

    #[test]
    fn probe_spreads_over_all_slots() {
        let slots = 97;
        let mut seen = vec![0u32; slots];
        for f in 0..10_000u64 {
            let p = Probe::new(f);
            for i in 0..HASHES {
                seen[p.at(i, slots).0] += 1;
            }
        }
        let min = *seen.iter().min().unwrap();
        let max = *seen.iter().max().unwrap();
        assert!(min > 1400 && max < 1900, "min {min} max {max}");
    }
}
