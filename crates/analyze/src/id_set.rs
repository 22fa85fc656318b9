//! The set of chunk ids an exact scope has seen.
//!
//! Open addressing with linear probing in one array of ids, indexed by the id's top bits after
//! a multiply (ids sampled by `id % N == 0` have biased low bits). Its point is
//! [`IdSet::prefetch`]: a runner knows a batch's ids before it inserts them, and with the
//! slot of an id a few places ahead already on its way to the cache, the table's cache misses
//! (most of an insert's cost once the table outgrows the cache) overlap.

/// Stands for the id 0 in the table, where 0 marks an empty slot.
const EMPTY: u64 = 0;

/// `n` empty slots. Written, not `calloc`ed: a zeroed allocation maps the shared zero page,
/// and the first insert into each page then copies it and flushes every core's TLB (5% of the
/// analysis' CPU on disk images). Tables of a few MB and up ask for huge pages, which also
/// spare the random inserts most of their TLB misses.
fn table(n: usize) -> Vec<u64> {
    let mut v: Vec<u64> = Vec::with_capacity(n);
    crate::huge::advise(v.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<u64>());
    v.resize(n, EMPTY);
    v
}

/// A set of 64-bit ids.
#[derive(Debug, Clone)]
pub struct IdSet {
    slots: Vec<u64>,
    /// 64 minus log2 of the slot count.
    shift: u32,
    len: usize,
    has_zero: bool,
}

impl Default for IdSet {
    fn default() -> Self {
        IdSet::with_slots_log2(10)
    }
}

impl IdSet {
    fn with_slots_log2(bits: u32) -> Self {
        IdSet {
            slots: table(1 << bits),
            shift: 64 - bits,
            len: 0,
            has_zero: false,
        }
    }

    #[inline(always)]
    fn home(&self, id: u64) -> usize {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Ids in the set.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Asks the CPU to start loading the slot `id` would take or be found in.
    #[inline(always)]
    pub fn prefetch(&self, id: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.slots.as_ptr().wrapping_add(self.home(id));
            // SAFETY: a prefetch never faults nor changes memory; `p` lies inside `slots`.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    p.cast::<i8>(),
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = id;
    }

    /// Adds `id`; true if it was not there yet.
    #[inline]
    pub fn insert(&mut self, id: u64) -> bool {
        if id == EMPTY {
            let new = !self.has_zero;
            self.has_zero = true;
            self.len += new as usize;
            return new;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(id);
        loop {
            let s = self.slots[i];
            if s == id {
                return false;
            }
            if s == EMPTY {
                self.slots[i] = id;
                self.len += 1;
                if self.len * 2 > self.slots.len() {
                    self.grow();
                }
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(self, IdSet::with_slots_log2(bits));
        self.has_zero = old.has_zero;
        self.len = old.has_zero as usize;
        for id in old.slots.into_iter().filter(|&s| s != EMPTY) {
            self.insert(id);
        }
    }

    /// Empties the set, keeping its table.
    pub fn clear(&mut self) {
        self.slots.fill(EMPTY);
        self.len = 0;
        self.has_zero = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn behaves_like_a_hash_set() {
        let mut set = IdSet::default();
        let mut model = HashSet::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Repeats, zero, and ids whose low bits are all zero (sampled ids).
            let id = match i % 5 {
                0 => x % 1000,
                1 => x << 20,
                _ => x,
            };
            set.prefetch(id);
            assert_eq!(set.insert(id), model.insert(id), "{id}");
            assert_eq!(set.len(), model.len());
        }
        assert!(!set.insert(0));
        let copy = set.clone();
        set.clear();
        assert_eq!(set.len(), 0);
        assert!(set.insert(5) && set.insert(0));
        assert_eq!(copy.len(), model.len());
    }
}
