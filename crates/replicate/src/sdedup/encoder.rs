//! The sender side: changes in, sDedup batches out.

use std::collections::HashMap;

use dedupwire_engine::delta::DeltaCodec;
use dedupwire_engine::similarity::CACHE_REWARD;
use serde::Serialize;

use super::docindex::{DocIndex, IndexMemory};
use super::format::*;
use super::{content_hash, key_hash, SdedupConfig, SourceCache, SourceStore};
use crate::{Change, Error, Op};

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

/// A chosen delta source.
struct Source {
    key: u64,
    collection: String,
    id: String,
    doc: Vec<u8>,
    cached: bool,
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
    index: DocIndex,
    cache: SourceCache,
    codec: Box<dyn DeltaCodec>,
    stats: EncodeStats,
    features: Vec<u64>,
    delta: Vec<u8>,
    body: Vec<u8>,
}

impl Encoder {
    /// An encoder whose similarity state lives in a temporary directory.
    pub fn new(config: SdedupConfig) -> Result<Self, Error> {
        Self::open(config, None)
    }

    /// An encoder whose similarity state persists in `state` (created if missing), so a
    /// restarted sender keeps finding sources; `None` uses a temporary directory.
    pub fn open(config: SdedupConfig, state: Option<&std::path::Path>) -> Result<Self, Error> {
        Ok(Encoder {
            index: DocIndex::open(state, config.max_per_feature)?,
            cache: SourceCache::new(config.cache_entries),
            codec: config.delta.build(),
            stats: EncodeStats::default(),
            features: Vec::new(),
            delta: Vec::new(),
            body: Vec::new(),
            config,
        })
    }

    /// Encodes `changes` (oldest first) as one batch appended to `out`.
    pub fn encode_batch(
        &mut self,
        changes: &[Change],
        store: &mut dyn SourceStore,
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        self.body.clear();
        let mut overlay = BatchOverlay {
            changes,
            latest: HashMap::new(),
            store,
        };
        for (i, c) in changes.iter().enumerate() {
            self.encode_change(c, &mut overlay)?;
            overlay.latest.insert(key_hash(&c.collection, &c.id), i);
        }
        self.index.commit()?;
        let start = out.len();
        seal(&self.body, changes.len(), self.config.compression, out);
        self.stats.output_bytes += (out.len() - start) as u64;
        Ok(())
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

    fn encode_change(&mut self, c: &Change, store: &mut dyn SourceStore) -> Result<(), Error> {
        self.stats.entries += 1;
        self.stats.input_bytes +=
            (c.collection.len() + c.id.len() + c.doc.as_ref().map_or(0, Vec::len)) as u64;
        self.put_head(c);
        let key = key_hash(&c.collection, &c.id);
        let Some(doc) = &c.doc else {
            self.body.push(DOC_NONE);
            return self.forget(key);
        };
        if c.op == Op::Delete {
            // A delete that carries its document (JSON-lines mode) sends it as it is.
            self.body.push(DOC_LITERAL);
            put_bytes(&mut self.body, doc);
            self.stats.literals += 1;
            return self.forget(key);
        }
        self.config.sketch.sketch_into(doc, &mut self.features);
        let source = self.find_source(doc, store)?;
        match &source {
            Some(src) => {
                self.body.push(DOC_DELTA);
                put_bytes(&mut self.body, src.collection.as_bytes());
                put_bytes(&mut self.body, src.id.as_bytes());
                self.body
                    .extend_from_slice(&content_hash(&src.doc).to_le_bytes());
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
        let replaced = source.as_ref().filter(|s| s.cached).map(|s| s.key);
        self.cache.put(key, doc, replaced);
        if !self.features.is_empty() {
            self.index
                .upsert(key, &c.collection, &c.id, &self.features)?;
        }
        Ok(())
    }

    /// The best source whose delta is smaller than the document; leaves the delta in
    /// `self.delta`.
    fn find_source(
        &mut self,
        doc: &[u8],
        store: &mut dyn SourceStore,
    ) -> Result<Option<Source>, Error> {
        if self.features.is_empty() {
            return Ok(None);
        }
        let cache = &self.cache;
        let found = self.index.candidates(
            &self.features,
            self.config.max_candidates,
            CACHE_REWARD as u32,
            |k| cache.contains(k),
        )?;
        for f in found {
            let (src, cached) = match self.cache.lookup(f.key) {
                Some(d) => (d.to_vec(), true),
                None => match store.fetch(&f.collection, &f.id) {
                    Some(d) => (d, false),
                    None => continue,
                },
            };
            self.delta.clear();
            self.codec.encode(&src, doc, &mut self.delta);
            if self.delta.len() < doc.len() {
                return Ok(Some(Source {
                    key: f.key,
                    collection: f.collection,
                    id: f.id,
                    doc: src,
                    cached,
                }));
            }
        }
        Ok(None)
    }

    fn forget(&mut self, key: u64) -> Result<(), Error> {
        self.cache.remove(key);
        self.index.delete(key)
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

    /// RAM the similarity state holds now, by part; the source cache is excluded, as in
    /// sDedup's accounting.
    pub fn memory(&self) -> IndexMemory {
        self.index.memory()
    }

    /// Documents the feature index knows.
    pub fn documents(&self) -> usize {
        self.index.documents() as usize
    }

    /// Bytes of documents in the source cache.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }
}
