//! The set of chunk ids an exact scope has seen, and in which image each was seen last.
//!
//! Open addressing with linear probing in one array of ids, indexed by the id's top bits after
//! a multiply (ids sampled by `id % N == 0` have biased low bits). Its point is
//! [`IdSet::prefetch`]: a runner knows a batch's ids before it inserts them, and with the
//! slot of an id a few places ahead already on its way to the cache, the table's cache misses
//! (most of an insert's cost once the table outgrows the cache) overlap. Each slot also holds
//! the last image its id was seen in, so one probe answers for the global scope (new ever?)
//! and the local one (new in this image?): two tables cost two cache misses per chunk. It
//! also counts the images each id was seen in, which is all the variance of a sampled local
//! scope needs (it kept a map of its own per sampled id, as large as this table). The
//! table doubles when three quarters full: four 16-byte slots share a cache line, so the
//! longer probes stay in the line the prefetch brought, and the peak memory of the five
//! Debian images' analysis was 200 MB lower than when doubling at half full.

/// Stands for the id 0 in the table, where 0 marks an empty slot.
const EMPTY: u64 = 0;

/// An id, the last image it was seen in and how many images it was seen in.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    id: u64,
    image: u32,
    images: u32,
}

/// What adding an id found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Added {
    /// It was not there yet.
    pub new_ever: bool,
    /// It was not there from this image (new, or last seen in another image).
    pub new_here: bool,
    /// Images it had been seen in before this one.
    pub images_before: u32,
}

/// `n` empty slots. Written, not `calloc`ed: a zeroed allocation maps the shared zero page,
/// and the first insert into each page then copies it and flushes every core's TLB (5% of the
/// analysis' CPU on disk images). Tables of a few MB and up ask for huge pages, which also
/// spare the random inserts most of their TLB misses.
fn table(n: usize) -> Vec<Slot> {
    let mut v: Vec<Slot> = Vec::with_capacity(n);
    crate::pages::advise_huge(v.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<Slot>());
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
    /// The slot of id 0, which marks empty slots in the table.
    zero: Option<Slot>,
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
        self.insert_in(id, 0).new_ever
    }

    /// Adds `id` as seen in `image` (images are numbered from 0 and come in order).
    #[inline]
    pub fn insert_in(&mut self, id: u64, image: u32) -> Added {
        if id == EMPTY {
            let slot = self.zero.get_or_insert(Slot {
                id,
                image,
                images: 0,
            });
            let added = Self::seen(slot, image, slot.images == 0);
            self.len += added.new_ever as usize;
            return added;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(id);
        loop {
            let s = &mut self.slots[i];
            if s.id == id {
                return Self::seen(s, image, false);
            }
            if s.id == EMPTY {
                *s = Slot {
                    id,
                    image,
                    images: 1,
                };
                self.len += 1;
                if self.len * 4 > self.slots.len() * 3 {
                    self.grow();
                }
                return Added {
                    new_ever: true,
                    new_here: true,
                    images_before: 0,
                };
            }
            i = (i + 1) & mask;
        }
    }

    /// Records that the id of slot `s` (new if `new_ever`, with no image counted yet) was
    /// seen in `image`.
    #[inline(always)]
    fn seen(s: &mut Slot, image: u32, new_ever: bool) -> Added {
        let new_here = new_ever || s.image != image;
        let images_before = s.images;
        s.image = image;
        s.images += new_here as u32;
        Added {
            new_ever,
            new_here,
            images_before,
        }
    }

    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(self, IdSet::with_slots_log2(bits));
        self.zero = old.zero;
        self.len = old.zero.is_some() as usize;
        for s in old.slots.into_iter().filter(|s| s.id != EMPTY) {
            self.place(s);
        }
    }

    /// Puts `slot` (an id not in the table) into the table, which has room for it.
    fn place(&mut self, slot: Slot) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(slot.id);
        while self.slots[i].id != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = slot;
        self.len += 1;
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
    fn tells_ids_new_in_an_image_from_ids_new_ever_and_counts_their_images() {
        let mut set = IdSet::default();
        let mut last_seen = std::collections::HashMap::new();
        let mut images = std::collections::HashMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..100_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let image = i / 20_000;
            // Ids repeat within and across images, zero among them.
            let id = if i % 7 == 0 { 0 } else { x % 30_000 };
            let before = last_seen.insert(id, image);
            let new_here = before != Some(image);
            let seen_in = images.entry(id).or_insert(0u32);
            let want = Added {
                new_ever: before.is_none(),
                new_here,
                images_before: *seen_in,
            };
            *seen_in += new_here as u32;
            set.prefetch(id);
            assert_eq!(set.insert_in(id, image), want, "{id} in image {image}");
            assert_eq!(set.len, last_seen.len());
        }
    }
}
