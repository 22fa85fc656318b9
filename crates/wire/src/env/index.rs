//! The in-memory index: chunk id → where its record lives, with a "recently used" bit per
//! chunk for second-chance eviction.

use std::mem::size_of;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::store::{ChunkId, IdMap};

const USED: u32 = 1 << 31;
/// The record is a recipe (data lengths stay below 2³⁰: segments are at most 1 GiB).
const RECIPE: u32 = 1 << 30;

/// Where a chunk's record is: segment number, offset, data length and the used bit.
#[derive(Debug)]
pub struct Loc {
    /// The segment holding the record.
    pub seg: u32,
    /// Offset of the record in the segment.
    pub off: u32,
    /// Data length in the low 30 bits; bit 30 says the record is a recipe, the top bit that
    /// the chunk was looked up since it was written (set under a shared lock, hence atomic).
    len_used: AtomicU32,
}

impl Loc {
    /// A record of `len` bytes of data (below 2³⁰) at `off` of segment `seg`, not yet used;
    /// `recipe` if the data is a recipe, not the chunk.
    pub fn new(seg: u32, off: u32, len: u32, recipe: bool) -> Loc {
        debug_assert!(len < RECIPE);
        let flag = if recipe { RECIPE } else { 0 };
        Loc {
            seg,
            off,
            len_used: AtomicU32::new((len & !(USED | RECIPE)) | flag),
        }
    }

    /// Bytes of data in the record.
    pub fn len(&self) -> u32 {
        self.len_used.load(Ordering::Relaxed) & !(USED | RECIPE)
    }

    /// Whether the record is a recipe.
    pub fn recipe(&self) -> bool {
        self.len_used.load(Ordering::Relaxed) & RECIPE != 0
    }

    /// Records that the chunk was looked up.
    pub fn mark_used(&self) {
        self.len_used.fetch_or(USED, Ordering::Relaxed);
    }

    /// Whether the chunk was looked up since it was written.
    pub fn used(&self) -> bool {
        self.len_used.load(Ordering::Relaxed) & USED != 0
    }
}

/// A chunk taken out of the index because its segment is evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// The chunk.
    pub id: ChunkId,
    /// Offset of its record in the evicted segment.
    pub off: u32,
    /// Bytes of data.
    pub len: u32,
    /// Whether it was looked up since it was written.
    pub used: bool,
    /// Whether the record is a recipe.
    pub recipe: bool,
}

/// The index proper, with the total data bytes of the chunks it holds.
#[derive(Debug, Default)]
pub struct Index {
    map: IdMap<Loc>,
    data_bytes: u64,
}

impl Index {
    /// Where `id` is, if held.
    pub fn get(&self, id: &ChunkId) -> Option<&Loc> {
        self.map.get(id)
    }

    /// Whether `id` is held.
    pub fn contains(&self, id: &ChunkId) -> bool {
        self.map.contains_key(id)
    }

    /// Points `id` at `loc`, replacing an older record of it.
    pub fn insert(&mut self, id: ChunkId, loc: Loc) {
        self.data_bytes += u64::from(loc.len());
        if let Some(old) = self.map.insert(id, loc) {
            self.data_bytes -= u64::from(old.len());
        }
    }

    /// Forgets `id` if it still points at `off` of segment `seg`; whether it did.
    pub fn remove_at(&mut self, id: &ChunkId, seg: u32, off: u32) -> bool {
        match self.map.get(id) {
            Some(loc) if loc.seg == seg && loc.off == off => {
                self.data_bytes -= u64::from(loc.len());
                self.map.remove(id);
                true
            }
            _ => false,
        }
    }

    /// Takes every chunk of segment `seg` out of the index (one pass over the whole index).
    pub fn drain_segment(&mut self, seg: u32) -> Vec<Evicted> {
        let mut out = Vec::new();
        self.map.retain(|id, loc| {
            if loc.seg != seg {
                return true;
            }
            out.push(Evicted {
                id: *id,
                off: loc.off,
                len: loc.len(),
                used: loc.used(),
                recipe: loc.recipe(),
            });
            false
        });
        self.data_bytes -= out.iter().map(|e| u64::from(e.len)).sum::<u64>();
        out
    }

    /// How many chunks it holds.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Data bytes of the chunks it holds.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// RAM held by the table: its buckets (key, value and one control byte each) at the
    /// current capacity, estimated from the standard library's SwissTable layout.
    pub fn memory_bytes(&self) -> usize {
        let cap = self.map.capacity();
        if cap == 0 {
            return 0;
        }
        let buckets = if cap < 8 {
            (cap + 1).next_power_of_two()
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        buckets * (size_of::<(ChunkId, Loc)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_replace_drain_and_account() {
        let mut ix = Index::default();
        ix.insert(ChunkId([1; 32]), Loc::new(1, 32, 10, false));
        ix.insert(ChunkId([2; 32]), Loc::new(1, 90, 20, true));
        ix.insert(ChunkId([3; 32]), Loc::new(2, 32, 30, false));
        ix.insert(ChunkId([1; 32]), Loc::new(2, 110, 10, false));
        assert_eq!((ix.len(), ix.data_bytes()), (3, 60));
        ix.get(&ChunkId([2; 32])).unwrap().mark_used();
        let gone = ix.drain_segment(1);
        assert_eq!(
            gone,
            vec![Evicted {
                id: ChunkId([2; 32]),
                off: 90,
                len: 20,
                used: true,
                recipe: true
            }]
        );
        assert_eq!((ix.len(), ix.data_bytes()), (2, 40));
        assert!(!ix.remove_at(&ChunkId([1; 32]), 1, 32), "stale location");
        assert!(ix.remove_at(&ChunkId([1; 32]), 2, 110));
        assert_eq!((ix.len(), ix.data_bytes()), (1, 30));
        assert_eq!(size_of::<(ChunkId, Loc)>(), 44);
        assert!(ix.memory_bytes() >= 45);
    }
}
