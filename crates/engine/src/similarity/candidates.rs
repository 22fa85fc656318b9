//! In-memory candidate lookup and sDedup's source scoring (sDedup §3.2).
//! (Owned by the similarity work: implementation pending.)

use std::hash::Hash;

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

/// Feature → items that have it, newest last, at most `max_per_feature` per feature.
#[derive(Debug, Clone)]
pub struct CandidateIndex<Id> {
    max_per_feature: usize,
    _ids: Vec<Id>,
}

impl<Id: Copy + Eq + Hash> CandidateIndex<Id> {
    /// An empty index keeping at most `max_per_feature` items per feature (oldest evicted).
    pub fn new(max_per_feature: usize) -> Self {
        CandidateIndex {
            max_per_feature,
            _ids: Vec::new(),
        }
    }

    /// Records that `id` has `features`.
    pub fn insert(&mut self, id: Id, features: &[u64]) {
        let _ = (id, features, self.max_per_feature);
        todo!()
    }

    /// Items sharing at least one of `features`, each once, with its shared count.
    pub fn lookup(&self, features: &[u64]) -> Vec<Candidate<Id>> {
        let _ = features;
        todo!()
    }

    /// Bytes of RAM the index holds.
    pub fn memory_bytes(&self) -> usize {
        todo!()
    }
}

/// Picks a source as sDedup does: most shared features, +2 if `is_cached`, ties to the newest.
pub fn select_source<Id: Copy>(
    candidates: &[Candidate<Id>],
    is_cached: impl Fn(&Id) -> bool,
) -> Option<Id> {
    let _ = (candidates, is_cached);
    todo!()
}
