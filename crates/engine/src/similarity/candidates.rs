//! In-memory candidate lookup and sDedup's source scoring (sDedup §3.2).
//!
//! [`CandidateIndex`] maps each feature to the insertion sequence numbers (`seq`) of the items
//! that have it, newest last, at most `max_per_feature` of them (sDedup's upper bound per feature,
//! oldest evicted first). A side table maps each item's *current* `seq` to its id, so that an
//! item inserted again (a document updated) replaces its previous version: entries of the old
//! version are dropped from the features the new version shares and ignored (stale) elsewhere,
//! so an id is counted once. An item whose entries were all evicted is forgotten.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// An item sharing at least one feature with the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<Id> {
    /// The candidate's id.
    pub id: Id,
    /// How many of the query's features it shares.
    pub shared: u32,
    /// Insertion sequence number: larger is newer.
    pub seq: u64,
}

/// Hasher for `u64` keys that are hashes or counters: one multiply (Fibonacci hashing).
///
/// Features cannot pass through unchanged: a sketch keeps the *largest* hashes, whose top bits,
/// which the table uses as tags, are nearly all ones. Sequence numbers are consecutive.
#[derive(Default, Clone, Copy)]
struct MulHasher(u64);

impl Hasher for MulHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(23) ^ u64::from_le_bytes(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

type MulBuild = BuildHasherDefault<MulHasher>;

/// The items (by `seq`) having one feature, oldest first.
#[derive(Debug, Clone)]
enum Slot {
    /// The common case: a feature only one item has.
    One(u64),
    /// Two or more items, at most `max_per_feature`.
    Many(Vec<u64>),
}

impl Slot {
    fn as_slice(&self) -> &[u64] {
        match self {
            Slot::One(s) => std::slice::from_ref(s),
            Slot::Many(v) => v,
        }
    }
}

/// A live item: its id and how many feature entries still point at it.
#[derive(Debug, Clone, Copy)]
struct Live<Id> {
    id: Id,
    refs: u32,
}

/// Feature → items that have it, newest last, at most `max_per_feature` per feature.
#[derive(Debug, Clone)]
pub struct CandidateIndex<Id> {
    max_per_feature: usize,
    next_seq: u64,
    /// feature → seqs, oldest first.
    features: HashMap<u64, Slot, MulBuild>,
    /// Heap bytes held by `Slot::Many` vectors.
    slot_heap: usize,
    /// Current seq → item (stale seqs are absent).
    live: HashMap<u64, Live<Id>, MulBuild>,
    /// Item → its current seq.
    current: HashMap<Id, u64, MulBuild>,
}

/// Drops one entry's reference to `seq`; forgets the item when none is left.
fn release<Id: Copy + Eq + Hash>(
    live: &mut HashMap<u64, Live<Id>, MulBuild>,
    current: &mut HashMap<Id, u64, MulBuild>,
    seq: u64,
) {
    if let Some(item) = live.get_mut(&seq) {
        item.refs -= 1;
        if item.refs == 0 {
            let id = item.id;
            live.remove(&seq);
            current.remove(&id);
        }
    }
}

impl<Id: Copy + Eq + Hash> CandidateIndex<Id> {
    /// An empty index keeping at most `max_per_feature` items per feature (oldest evicted).
    ///
    /// A bound of 0 is taken as 1.
    pub fn new(max_per_feature: usize) -> Self {
        CandidateIndex {
            max_per_feature: max_per_feature.max(1),
            next_seq: 0,
            features: HashMap::default(),
            slot_heap: 0,
            live: HashMap::default(),
            current: HashMap::default(),
        }
    }

    /// The bound on items per feature.
    pub fn max_per_feature(&self) -> usize {
        self.max_per_feature
    }

    /// Number of items that can still be found (inserted, not removed, not wholly evicted).
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// True when no item can be found.
    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    /// Number of distinct features indexed (including ones only stale entries hold).
    pub fn feature_count(&self) -> usize {
        self.features.len()
    }

    /// Records that `id` has `features`, replacing what an earlier insert of `id` recorded.
    ///
    /// Duplicate features count once. The insert gets the next `seq`.
    pub fn insert(&mut self, id: Id, features: &[u64]) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let previous = self.current.remove(&id);
        if let Some(p) = previous {
            self.live.remove(&p);
        }
        let max = self.max_per_feature;
        let mut refs = 0u32;
        for (i, &f) in features.iter().enumerate() {
            if is_repeat(features, i) {
                continue;
            }
            refs += 1;
            let slot = match self.features.entry(f) {
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Slot::One(seq));
                    continue;
                }
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            };
            match slot {
                Slot::One(s) => {
                    let old = *s;
                    if Some(old) == previous || max == 1 {
                        *s = seq;
                        if Some(old) != previous {
                            release(&mut self.live, &mut self.current, old);
                        }
                    } else {
                        let mut v = Vec::with_capacity(max.min(4));
                        self.slot_heap += v.capacity() * 8;
                        v.push(old);
                        v.push(seq);
                        *slot = Slot::Many(v);
                    }
                }
                Slot::Many(v) => {
                    if let Some(p) = previous {
                        if let Some(pos) = v.iter().position(|&s| s == p) {
                            v.remove(pos);
                        }
                    }
                    if v.len() >= max {
                        let evicted = v.remove(0);
                        release(&mut self.live, &mut self.current, evicted);
                    }
                    if v.len() == v.capacity() {
                        let before = v.capacity();
                        v.reserve_exact((2 * before).min(max) - before);
                        self.slot_heap += (v.capacity() - before) * 8;
                    }
                    v.push(seq);
                }
            }
        }
        if refs > 0 {
            self.live.insert(seq, Live { id, refs });
            self.current.insert(id, seq);
        }
    }

    /// Forgets `id` (a deleted document): it is no longer returned by lookups.
    pub fn remove(&mut self, id: &Id) {
        if let Some(seq) = self.current.remove(id) {
            self.live.remove(&seq);
        }
    }

    /// Items sharing at least one of `features`, each once, with its shared count.
    ///
    /// Duplicate query features count once. Candidates come newest first.
    pub fn lookup(&self, features: &[u64]) -> Vec<Candidate<Id>> {
        let mut hits: Vec<u64> = Vec::new();
        for (i, f) in features.iter().enumerate() {
            if is_repeat(features, i) {
                continue;
            }
            if let Some(slot) = self.features.get(f) {
                hits.extend_from_slice(slot.as_slice());
            }
        }
        // Newest first; each seq appears at most once per feature, so a run's length is the count.
        hits.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        for run in hits.chunk_by(|a, b| a == b) {
            if let Some(item) = self.live.get(&run[0]) {
                out.push(Candidate {
                    id: item.id,
                    shared: run.len() as u32,
                    seq: run[0],
                });
            }
        }
        out
    }

    /// Bytes of RAM the index holds: table slots (entry + control byte) and per-feature lists.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.features.capacity() * (std::mem::size_of::<(u64, Slot)>() + 1)
            + self.slot_heap
            + self.live.capacity() * (std::mem::size_of::<(u64, Live<Id>)>() + 1)
            + self.current.capacity() * (std::mem::size_of::<(Id, u64)>() + 1)
    }
}

/// True when `features[i]` already occurred before index `i`.
#[inline]
fn is_repeat(features: &[u64], i: usize) -> bool {
    // Sketches are short (K = 8..32): a scan beats hashing.
    features[..i].contains(&features[i])
}

/// Picks a source as sDedup does: most shared features, +2 if `is_cached`, ties to the newest.
pub fn select_source<Id: Copy>(
    candidates: &[Candidate<Id>],
    is_cached: impl Fn(&Id) -> bool,
) -> Option<Id> {
    candidates
        .iter()
        .max_by_key(|c| {
            let bonus = if is_cached(&c.id) { CACHE_REWARD } else { 0 };
            (u64::from(c.shared) + bonus, c.seq)
        })
        .map(|c| c.id)
}

/// The score reward for a candidate already in the source cache (sDedup: 2).
pub const CACHE_REWARD: u64 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: u32, shared: u32, seq: u64) -> Candidate<u32> {
        Candidate { id, shared, seq }
    }

    #[test]
    fn finds_shared_features_with_counts() {
        let mut idx = CandidateIndex::new(8);
        idx.insert(1u32, &[10, 20, 30]);
        idx.insert(2, &[20, 30, 40]);
        idx.insert(3, &[50]);
        let got = idx.lookup(&[20, 30, 40, 99]);
        assert_eq!(got, vec![cand(2, 3, 1), cand(1, 2, 0)]);
        assert!(idx.lookup(&[99]).is_empty());
        assert!(idx.lookup(&[]).is_empty());
        assert_eq!(idx.lookup(&[50, 50]), vec![cand(3, 1, 2)]);
        assert_eq!(idx.len(), 3);
    }

    #[test]
    fn duplicate_features_count_once() {
        let mut idx = CandidateIndex::new(8);
        idx.insert(1u32, &[7, 7, 7, 8]);
        assert_eq!(idx.lookup(&[7, 8, 7]), vec![cand(1, 2, 0)]);
    }

    #[test]
    fn reinserted_id_counts_once_with_its_new_features() {
        let mut idx = CandidateIndex::new(4);
        idx.insert(1u32, &[1, 2, 3]);
        idx.insert(2, &[3]);
        idx.insert(1, &[2, 3, 4]);
        idx.insert(1, &[3, 4, 5]);
        // Feature 1 and 2 only hold stale versions of id 1.
        assert!(idx.lookup(&[1]).is_empty());
        assert!(idx.lookup(&[2]).is_empty());
        assert_eq!(
            idx.lookup(&[1, 2, 3, 4, 5]),
            vec![cand(1, 3, 3), cand(2, 1, 1)]
        );
        // Re-inserting never pushes other items out of a shared feature.
        for _ in 0..10 {
            idx.insert(1, &[3]);
        }
        assert_eq!(idx.lookup(&[3]), vec![cand(1, 1, 13), cand(2, 1, 1)]);
        assert_eq!(idx.len(), 2);
    }

    #[test]
    fn evicts_oldest_beyond_bound() {
        let mut idx = CandidateIndex::new(3);
        for id in 0..10u32 {
            idx.insert(id, &[42, 1000 + u64::from(id)]);
        }
        let got = idx.lookup(&[42]);
        assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), vec![9, 8, 7]);
        // Evicted from one feature, still found by its other one.
        assert_eq!(idx.lookup(&[1000]), vec![cand(0, 1, 0)]);
        assert_eq!(idx.lookup(&[42, 1000]).len(), 4);
        // The items evicted from 42 but still holding another feature stay findable.
        assert_eq!(idx.len(), 10);
    }

    #[test]
    fn wholly_evicted_items_are_forgotten() {
        let mut idx = CandidateIndex::new(1);
        idx.insert(1u32, &[5]);
        idx.insert(2, &[5]);
        assert_eq!(idx.lookup(&[5]), vec![cand(2, 1, 1)]);
        assert_eq!(idx.len(), 1);
        let mut idx = CandidateIndex::new(2);
        for id in 0..1000u32 {
            idx.insert(id, &[1, 2, 3]);
        }
        assert_eq!(idx.len(), 2);
    }

    #[test]
    fn remove_forgets() {
        let mut idx = CandidateIndex::new(4);
        idx.insert(1u32, &[5, 6]);
        idx.insert(2, &[5]);
        idx.remove(&1);
        assert_eq!(idx.lookup(&[5, 6]), vec![cand(2, 1, 1)]);
        idx.insert(1, &[6]);
        assert_eq!(idx.lookup(&[5, 6]), vec![cand(1, 1, 2), cand(2, 1, 1)]);
        idx.insert(3, &[]);
        assert_eq!(idx.len(), 2);
    }

    #[test]
    fn memory_grows_with_content() {
        let mut idx = CandidateIndex::new(8);
        let empty = idx.memory_bytes();
        for id in 0..1000u64 {
            let f: Vec<u64> = (0..8).map(|i| id * 8 + i).collect();
            idx.insert(id, &f);
        }
        let full = idx.memory_bytes();
        // At least key + seq per feature entry plus the id tables.
        assert!(full - empty >= 8000 * 16, "{full}");
        assert!(full - empty <= 8000 * 100, "{full}");
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn scoring_and_tie_breaking() {
        assert_eq!(select_source::<u32>(&[], |_| true), None);
        let c = [cand(1, 3, 5), cand(2, 2, 9), cand(3, 3, 7)];
        // Tie on 3 shared: newest (seq 7) wins.
        assert_eq!(select_source(&c, |_| false), Some(3));
        // Cached reward: 2 + 2 = 4 beats 3.
        assert_eq!(select_source(&c, |id| *id == 2), Some(2));
        // Cached 1 vs uncached 3 at 3 shared: 5 > 3.
        assert_eq!(select_source(&c, |id| *id == 1), Some(1));
        // Everything cached: back to shared, then newest.
        assert_eq!(select_source(&c, |_| true), Some(3));
        // Reward of exactly 2: 1 shared + cached ties 3 shared uncached; newer wins.
        let d = [cand(1, 3, 1), cand(2, 1, 2)];
        assert_eq!(select_source(&d, |id| *id == 2), Some(2));
        let d = [cand(1, 3, 2), cand(2, 1, 1)];
        assert_eq!(select_source(&d, |id| *id == 2), Some(1));
    }
}
