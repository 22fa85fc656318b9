//! The receiver side: sDedup batches in, changes out (or the positions it must ask for raw).

use std::collections::HashMap;

use dedupwire_engine::compress::Compression;
use dedupwire_engine::delta::DeltaCodec;

use super::format::*;
use super::{content_hash, key_hash, SdedupConfig, SourceCache, SourceStore};
use crate::{Change, Error, Op};

/// A decoded batch.
#[derive(Debug, Default)]
pub struct DecodedBatch {
    /// The changes in order; those listed in `missing` have `doc: None` until resolved.
    pub changes: Vec<Change>,
    /// Positions whose delta source this side does not hold in the version the sender used:
    /// ask the sender for them raw before applying the batch.
    pub missing: Vec<u64>,
}

/// Decodes batches, keeping a source cache that mirrors the sender's.
pub struct Decoder {
    cache: SourceCache,
    codec: Box<dyn DeltaCodec>,
}

impl Decoder {
    /// A decoder for a stream encoded with `config` (only its cache size and codec matter).
    pub fn new(config: SdedupConfig) -> Self {
        Decoder {
            cache: SourceCache::new(config.cache_entries),
            codec: config.delta.build(),
        }
    }

    /// Decodes the batch at the start of `buf` (at `offset` in the stream, for errors);
    /// returns it and the bytes consumed. Sources come from the cache, then from documents
    /// earlier in the same batch, then from `store`.
    pub fn decode_batch(
        &mut self,
        buf: &[u8],
        offset: u64,
        store: &mut dyn SourceStore,
    ) -> Result<(DecodedBatch, usize), Error> {
        let (body, n_entries, used) = open(buf, offset)?;
        let mut r = Reader {
            buf: &body,
            pos: 0,
            base: 0,
        };
        let mut batch = DecodedBatch::default();
        let mut pending: HashMap<(String, String), Option<Vec<u8>>> = HashMap::new();
        for _ in 0..n_entries {
            let pos = r.varint()?;
            let op = match r.u8()? {
                OP_INSERT => Op::Insert,
                OP_UPDATE => Op::Update,
                OP_DELETE => Op::Delete,
                t => return Err(r.err(format!("unknown operation {t}"))),
            };
            let collection = r.string()?;
            let id = r.string()?;
            let key = key_hash(&collection, &id);
            let mut replaced = None;
            let doc = match r.u8()? {
                DOC_NONE => None,
                DOC_LITERAL => Some(r.bytes(MAX_DOC)?.to_vec()),
                DOC_DELTA => {
                    let src_coll = r.string()?;
                    let src_id = r.string()?;
                    let src_hash = r.u64_le()?;
                    let len = r.len(MAX_DOC)?;
                    let delta = r.bytes(MAX_DOC)?;
                    let src_key = key_hash(&src_coll, &src_id);
                    let cached = self
                        .cache
                        .lookup(src_key)
                        .filter(|d| content_hash(d) == src_hash)
                        .map(<[u8]>::to_vec);
                    if cached.is_some() {
                        replaced = Some(src_key);
                    }
                    let source =
                        cached.or_else(|| match pending.get(&(src_coll.clone(), src_id.clone())) {
                            Some(latest) => latest.clone().filter(|d| content_hash(d) == src_hash),
                            None => store
                                .fetch(&src_coll, &src_id)
                                .filter(|d| content_hash(d) == src_hash),
                        });
                    match source {
                        Some(src) => {
                            let mut doc = Vec::with_capacity(len.min(1 << 20));
                            self.codec.decode(&src, delta, len, &mut doc).map_err(|e| {
                                Error::Corrupt {
                                    offset: offset + r.pos as u64,
                                    detail: e.to_string(),
                                }
                            })?;
                            if doc.len() != len {
                                return Err(r.err(format!(
                                    "delta rebuilt {} bytes, expected {len}",
                                    doc.len()
                                )));
                            }
                            Some(doc)
                        }
                        None => {
                            batch.missing.push(pos);
                            None
                        }
                    }
                }
                t => return Err(r.err(format!("unknown document encoding {t}"))),
            };
            let deleted = op == Op::Delete;
            match (&doc, deleted) {
                (_, true) => self.cache.remove(key),
                (Some(d), false) => self.cache.put(key, d, replaced),
                (None, false) => {}
            }
            if deleted || doc.is_some() {
                let visible = if deleted { None } else { doc.clone() };
                pending.insert((collection.clone(), id.clone()), visible);
            }
            batch.changes.push(Change {
                pos,
                op,
                collection,
                id,
                doc,
            });
        }
        if r.pos != body.len() {
            return Err(r.err("bytes left after the last entry"));
        }
        Ok((batch, used))
    }

    /// Fills in entries that arrived raw (the answer to `missing`), updating the cache.
    pub fn resolve(&mut self, batch: &mut DecodedBatch, raw: Vec<Change>) -> Result<(), Error> {
        for r in raw {
            let Some(slot) = batch.changes.iter_mut().find(|c| c.pos == r.pos) else {
                return Err(Error::Protocol(format!(
                    "raw entry at position {} was not asked for",
                    r.pos
                )));
            };
            if slot.collection != r.collection || slot.id != r.id {
                return Err(Error::Protocol(format!(
                    "raw entry at position {} names another document",
                    r.pos
                )));
            }
            if let Some(d) = &r.doc {
                self.cache.put(key_hash(&r.collection, &r.id), d, None);
            }
            slot.doc = r.doc;
            batch.missing.retain(|&p| p != r.pos);
        }
        Ok(())
    }

    /// (hits, misses) of the source cache.
    pub fn cache_hits(&self) -> (u64, u64) {
        self.cache.hit_counts()
    }
}

/// Checks a batch frame and returns its body, entry count and the bytes it occupies.
fn open(buf: &[u8], offset: u64) -> Result<(Vec<u8>, usize, usize), Error> {
    let mut r = Reader {
        buf,
        pos: 0,
        base: offset as usize,
    };
    let magic = r.take(4)?;
    if magic[..3] != MAGIC[..3] {
        return Err(r.err("not a dedupwire replication batch"));
    }
    if magic[3] != MAGIC[3] {
        return Err(r.err(format!(
            "batch format version {} is not supported (this build reads {})",
            magic[3], MAGIC[3]
        )));
    }
    let n = r.len(MAX_BODY)?;
    let raw_len = r.len(MAX_BODY)?;
    let stored_len = r.len(MAX_BODY)?;
    let method = r.u8()?;
    let checksum = r.u64_le()?;
    let stored = r.take(stored_len)?;
    let body =
        Compression::decompress(method, stored, raw_len).map_err(|e| r.err(e.to_string()))?;
    if xxhash_rust::xxh3::xxh3_64(&body) != checksum {
        return Err(r.err("batch checksum mismatch"));
    }
    Ok((body, n, r.pos))
}
