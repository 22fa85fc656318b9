//! The sender side: changes in, sDedup batches out.

use std::collections::HashMap;

use dedupwire_engine::delta::DeltaCodec;
use dedupwire_engine::similarity::{select_source, CandidateIndex};
use serde::Serialize;

use super::format::*;
use super::{content_hash, key_hash, SdedupConfig, SourceCache, SourceStore};
use crate::{Change, Op};

/// What the encoder has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EncodeStats {
    /// Changes encoded.
    pub entries: u64,
    /// Bytes of their documents (and names).
    pub input_bytes: u64,
    /// Bytes of the batches written.
    pub output_bytes: u64,
    /// Documents sent as deltas.
    pub deltas: u64,
    /// Documents sent whole.
    pub literals: u64,
    /// Source fetches served by the source cache.
    pub cache_hits: u64,
    /// Source fetches that went to the database.
    pub cache_misses: u64,
    /// Entries re-sent raw because a receiver's source differed.
    pub fallbacks: u64,
}

/// The state as of the change being encoded: earlier changes of the batch, then the store.
struct BatchOverlay<'a> {
    changes: &'a [Change],
    latest: HashMap<u64, usize>,
    store: &'a mut dyn SourceStore,
}

impl SourceStore for BatchOverlay<'_> {
    fn fetch(&mut self, collection: &str, id: &str) -> Option<Vec<u8>> {
        match self.latest.get(&key_hash(collection, id)) {
            Some(&i) => match self.changes[i].op {
                Op::Delete => None,
                _ => self.changes[i].doc.clone(),
            },
            None => self.store.fetch(collection, id),
        }
    }
}

/// Encodes changes into batches, keeping the feature index and source cache between them.
pub struct Encoder {
    config: SdedupConfig,
    index: CandidateIndex<u64>,
    keys: HashMap<u64, (String, String)>,
    cache: SourceCache,
    codec: Box<dyn DeltaCodec>,
    stats: EncodeStats,
    features: Vec<u64>,
    delta: Vec<u8>,
    body: Vec<u8>,
}

impl Encoder {
    /// An encoder with empty state (a restarted sender rebuilds it from the stream it sends).
    pub fn new(config: SdedupConfig) -> Self {
        Encoder {
            index: CandidateIndex::new(config.max_per_feature),
            keys: HashMap::new(),
            cache: SourceCache::new(config.cache_entries),
            codec: config.delta.build(),
            stats: EncodeStats::default(),
            features: Vec::new(),
            delta: Vec::new(),
            body: Vec::new(),
            config,
        }
    }

    /// Encodes `changes` (oldest first) as one batch appended to `out`.
    pub fn encode_batch(
        &mut self,
        changes: &[Change],
        store: &mut dyn SourceStore,
        out: &mut Vec<u8>,
    ) {
        self.body.clear();
        let mut overlay = BatchOverlay {
            changes,
            latest: HashMap::new(),
            store,
        };
        for (i, c) in changes.iter().enumerate() {
            self.encode_change(c, &mut overlay);
            overlay.latest.insert(key_hash(&c.collection, &c.id), i);
        }
        let start = out.len();
        seal(&self.body, changes.len(), self.config.compression, out);
        self.stats.output_bytes += (out.len() - start) as u64;
    }

    /// Encodes `changes` with every document whole: the answer to a receiver's request for
    /// raw entries.
    pub fn encode_raw(&mut self, changes: &[Change], out: &mut Vec<u8>) {
        self.body.clear();
        for c in changes {
            self.put_head(c);
            match &c.doc {
                Some(doc) => {
                    self.body.push(DOC_LITERAL);
                    put_bytes(&mut self.body, doc);
                }
                None => self.body.push(DOC_NONE),
            }
        }
        self.stats.fallbacks += changes.len() as u64;
        let start = out.len();
        seal(&self.body, changes.len(), self.config.compression, out);
        self.stats.output_bytes += (out.len() - start) as u64;
    }

    fn put_head(&mut self, c: &Change) {
        put_varint(&mut self.body, c.pos);
        self.body.push(match c.op {
            Op::Insert => OP_INSERT,
            Op::Update => OP_UPDATE,
            Op::Delete => OP_DELETE,
        });
        put_bytes(&mut self.body, c.collection.as_bytes());
        put_bytes(&mut self.body, c.id.as_bytes());
    }

    fn encode_change(&mut self, c: &Change, store: &mut dyn SourceStore) {
        self.stats.entries += 1;
        self.stats.input_bytes +=
            (c.collection.len() + c.id.len() + c.doc.as_ref().map_or(0, Vec::len)) as u64;
        self.put_head(c);
        let key = key_hash(&c.collection, &c.id);
        let Some(doc) = &c.doc else {
            self.body.push(DOC_NONE);
            self.forget(key);
            return;
        };
        if c.op == Op::Delete {
            // A delete that carries its document (JSON-lines mode) sends it as it is.
            self.body.push(DOC_LITERAL);
            put_bytes(&mut self.body, doc);
            self.forget(key);
            return;
        }
        self.config.sketch.sketch_into(doc, &mut self.features);
        let source = self.find_source(doc, store);
        match &source {
            Some((src_key, src_doc, _)) => {
                let (coll, id) = self
                    .keys
                    .get(src_key)
                    .expect("sources come from the key table")
                    .clone();
                self.body.push(DOC_DELTA);
                put_bytes(&mut self.body, coll.as_bytes());
                put_bytes(&mut self.body, id.as_bytes());
                self.body
                    .extend_from_slice(&content_hash(src_doc).to_le_bytes());
                put_varint(&mut self.body, doc.len() as u64);
                put_bytes(&mut self.body, &self.delta);
                self.stats.deltas += 1;
            }
            None => {
                self.body.push(DOC_LITERAL);
                put_bytes(&mut self.body, doc);
                self.stats.literals += 1;
            }
        }
        let replaced = source.as_ref().filter(|s| s.2).map(|s| s.0);
        self.cache.put(key, doc, replaced);
        self.keys
            .entry(key)
            .or_insert_with(|| (c.collection.clone(), c.id.clone()));
        if !self.features.is_empty() {
            let features = std::mem::take(&mut self.features);
            self.index.insert(key, &features);
            self.features = features;
        }
    }

    /// The best source whose delta is smaller than the document: (key, source, was cached).
    /// Leaves the delta in `self.delta`.
    fn find_source(
        &mut self,
        doc: &[u8],
        store: &mut dyn SourceStore,
    ) -> Option<(u64, Vec<u8>, bool)> {
        if self.features.is_empty() {
            return None;
        }
        let mut candidates = self.index.lookup(&self.features);
        for _ in 0..self.config.max_candidates {
            let cache = &self.cache;
            let best = select_source(&candidates, |k| cache.contains(*k))?;
            candidates.retain(|c| c.id != best);
            let (src, cached) = match self.cache.lookup(best) {
                Some(d) => (d.to_vec(), true),
                None => {
                    let Some((coll, id)) = self.keys.get(&best) else {
                        continue;
                    };
                    match store.fetch(coll, id) {
                        Some(d) => (d, false),
                        None => continue,
                    }
                }
            };
            self.delta.clear();
            self.codec.encode(&src, doc, &mut self.delta);
            if self.delta.len() < doc.len() {
                return Some((best, src, cached));
            }
        }
        None
    }

    fn forget(&mut self, key: u64) {
        self.cache.remove(key);
        self.index.remove(&key);
        self.keys.remove(&key);
    }

    /// What the encoder has done so far.
    pub fn stats(&self) -> EncodeStats {
        let (cache_hits, cache_misses) = self.cache.hit_counts();
        EncodeStats {
            cache_hits,
            cache_misses,
            ..self.stats
        }
    }

    /// RAM held by the feature index and the key table (the source cache excluded, as in
    /// sDedup's accounting).
    pub fn index_bytes(&self) -> usize {
        let keys: usize = self
            .keys
            .values()
            .map(|(c, i)| c.capacity() + i.capacity() + 2 * std::mem::size_of::<String>() + 8 + 1)
            .sum();
        self.index.memory_bytes() + keys
    }

    /// Documents the feature index knows.
    pub fn documents(&self) -> usize {
        self.keys.len()
    }

    /// Bytes of documents in the source cache.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }
}
