//! The set of chunk ids an exact scope has seen, and in which image each was seen last.
//!
//! Open addressing with linear probing in one array of ids, indexed by the id's top bits after
//! a multiply (ids sampled by `id % N == 0` have biased low bits). Its point is
//! [`IdSet::prefetch`]: a runner knows a batch's ids before it inserts them, and with the
//! slot of an id a few places ahead already on its way to the cache, the table's cache misses
//! (most of an insert's cost once the table outgrows the cache) overlap. Each slot also holds
//! the last image its id was seen in, so one probe answers for the global scope (new ever?)
//! and the local one (new in this image?): two tables cost two cache misses per chunk. The
//! table doubles when three quarters full: four 16-byte slots share a cache line, so the
//! longer probes stay in the line the prefetch brought, and the peak memory of the five
//! Debian images' analysis was 200 MB lower than when doubling at half full.

/// Stands for the id 0 in the table, where 0 marks an empty slot.
const EMPTY: u64 = 0;

/// An id and the last image it was seen in.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    id: u64,
    image: u64,
}

/// `n` empty slots. Written, not `calloc`ed: a zeroed allocation maps the shared zero page,
/// and the first insert into each page then copies it and flushes every core's TLB (5% of the
/// analysis' CPU on disk images). Tables of a few MB and up ask for huge pages, which also
/// spare the random inserts most of their TLB misses.
fn table(n: usize) -> Vec<Slot> {
    let mut v: Vec<Slot> = Vec::with_capacity(n);
    crate::huge::advise(v.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<Slot>());
    v.resize(n, Slot::default());
    v
}

/// A set of 64-bit ids, each with the last image it was added in.
#[derive(Debug, Clone)]
pub struct IdSet {
    slots: Vec<Slot>,
    /// 64 minus log2 of the slot count.
    shift: u32,
    len: usize,
    /// The image id 0 was added in last, if it was.
    zero: Option<u64>,
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
            zero: None,
        }
    }

    #[inline(always)]
    fn home(&self, id: u64) -> usize {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
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
        self.insert_in(id, 0).0
    }

    /// Adds `id` as seen in `image`: whether it was not there yet, and whether it was not
    /// there from `image` (new, or last seen in another image).
    #[inline]
    pub fn insert_in(&mut self, id: u64, image: u64) -> (bool, bool) {
        if id == EMPTY {
            let before = self.zero.replace(image);
            self.len += before.is_none() as usize;
            return (before.is_none(), before != Some(image));
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(id);
        loop {
            let s = &mut self.slots[i];
            if s.id == id {
                let here = std::mem::replace(&mut s.image, image) == image;
                return (false, !here);
            }
            if s.id == EMPTY {
                *s = Slot { id, image };
                self.len += 1;
                if self.len * 4 > self.slots.len() * 3 {
                    self.grow();
                }
                return (true, true);
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(self, IdSet::with_slots_log2(bits));
        self.zero = old.zero;
        self.len = old.zero.is_some() as usize;
        for s in old.slots.into_iter().filter(|s| s.id != EMPTY) {
            self.insert_in(s.id, s.image);
        }
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
            assert_eq!(set.len, model.len());
        }
        assert!(!set.insert(0));
    }

    #[test]
    fn tells_ids_new_in_an_image_from_ids_new_ever() {
        let mut set = IdSet::default();
        let mut last_seen = std::collections::HashMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..100_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let image = i / 20_000;
            // Ids repeat within and across images, zero among them.
            let id = if i % 7 == 0 { 0 } else { x % 30_000 };
            let before = last_seen.insert(id, image);
            let want = (before.is_none(), before != Some(image));
            set.prefetch(id);
            assert_eq!(set.insert_in(id, image), want, "{id} in image {image}");
            assert_eq!(set.len, last_seen.len());
        }
    }
}
