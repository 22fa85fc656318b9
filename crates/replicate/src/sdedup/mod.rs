//! The sDedup encoder and decoder (sDedup §3–§4), independent of any database or transport.
//!
//! Per change: sketch the document (top-K chunk hashes), find candidate sources sharing
//! features, rank them (shared features, +2 when in the source cache, newest on ties), fetch
//! the best from the source cache or the database, delta-encode against it, and compress the
//! whole batch's residuals together. Each delta names its source (collection, id) and the
//! xxh3 hash of the source's content: a receiver whose copy differs reports the entry as
//! missing and asks for it raw (the optimistic protocol of §4.1). The byte layout is in
//! `crates/replicate/FORMAT.md`.

mod cache;
mod decoder;
mod docindex;
mod encoder;
mod format;

pub use self::cache::SourceCache;
pub use self::decoder::{DecodedBatch, Decoder};
pub use self::docindex::IndexMemory;
pub use self::encoder::{EncodeStats, Encoder};

use std::collections::HashMap;

use dedupwire_engine::compress::Compression;
use dedupwire_engine::delta::DeltaSpec;
use dedupwire_engine::similarity::SketchConfig;
use serde::{Deserialize, Serialize};

/// The sDedup settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SdedupConfig {
    /// Sketch: K features from chunks of `chunk_avg` bytes.
    pub sketch: SketchConfig,
    /// Documents kept in the source document cache (sDedup: 2000).
    pub cache_entries: usize,
    /// Documents listed per feature in the feature index (LRU beyond it).
    pub max_per_feature: usize,
    /// Candidates tried, best first, until one can be fetched.
    pub max_candidates: usize,
    /// The delta codec.
    pub delta: DeltaSpec,
    /// Compression of each batch.
    pub compression: Compression,
}

impl Default for SdedupConfig {
    fn default() -> Self {
        SdedupConfig {
            sketch: SketchConfig {
                k: 8,
                chunk_avg: 64,
            },
            cache_entries: 2000,
            max_per_feature: 16,
            max_candidates: 3,
            delta: DeltaSpec::Sampled,
            compression: Compression::Zstd(3),
        }
    }
}

/// Where a side finds a document that is not in its cache: its database, as of what it has
/// processed.
pub trait SourceStore {
    /// The current body of `id` in `collection`, if it exists.
    fn fetch(&mut self, collection: &str, id: &str) -> Option<Vec<u8>>;
    /// Reads that failed so far (each answered as "not found", so the entry went whole), and
    /// the last failure, for the sender's report.
    fn failures(&self) -> (u64, Option<&str>) {
        (0, None)
    }
}

/// A store's failed reads: how many, and the last one ([`SourceStore::failures`]).
#[derive(Debug, Default)]
pub struct FetchFailures {
    count: u64,
    last: Option<String>,
}

impl FetchFailures {
    /// Counts `error` and keeps its message.
    pub fn record(&mut self, error: impl std::fmt::Display) {
        self.count += 1;
        self.last = Some(error.to_string());
    }

    /// How many so far, and the last message.
    pub fn get(&self) -> (u64, Option<&str>) {
        (self.count, self.last.as_deref())
    }
}

/// Current documents in memory: the store of the JSON-lines mode, where each side keeps the
/// state the stream has built so far.
#[derive(Debug, Default)]
pub struct MemoryStore {
    docs: HashMap<(String, String), Vec<u8>>,
}

impl MemoryStore {
    /// Applies a change to the state.
    pub fn apply(&mut self, change: &crate::Change) {
        let key = (change.collection.clone(), change.id.clone());
        match (&change.op, &change.doc) {
            (crate::Op::Delete, _) | (_, None) => {
                self.docs.remove(&key);
            }
            (_, Some(doc)) => {
                self.docs.insert(key, doc.clone());
            }
        }
    }

    /// Documents held.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// True when no document is held.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }
}

impl SourceStore for MemoryStore {
    fn fetch(&mut self, collection: &str, id: &str) -> Option<Vec<u8>> {
        self.docs
            .get(&(collection.to_string(), id.to_string()))
            .cloned()
    }
}

/// The 64-bit key of a document: what the feature index and the cache hold.
pub fn key_hash(collection: &str, id: &str) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(collection.as_bytes());
    h.update(&[0xff]);
    h.update(id.as_bytes());
    h.digest()
}

/// The content hash a delta carries for its source.
pub fn content_hash(doc: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(doc)
}
