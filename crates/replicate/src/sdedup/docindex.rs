//! The sender's similarity state, on disk and bounded in RAM: sketch features → document
//! versions through the cuckoo feature index (`dedupwire-index`, ~6–8 bytes of RAM per
//! feature), and version → document key in a redb table, so a restarted sender keeps finding
//! sources and RAM does not grow with the number of documents.
//!
//! Every insert or update gets a new version number (newer is larger, which is how the
//! feature index breaks ties); the key table keeps only each document's latest version, so
//! feature entries of older versions and of deleted documents resolve to nothing and are
//! skipped until the index's per-feature LRU drops them.

use std::path::Path;

use dedupwire_index::{Config as IndexConfig, FeatureIndex};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use crate::Error;

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
const LATEST: TableDefinition<u64, u64> = TableDefinition::new("latest");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Bytes redb may cache in RAM.
const DB_CACHE_BYTES: usize = 8 << 20;

fn state_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::State(format!("{what}: {e}"))
}

/// Persistent feature index plus version → key table.
pub struct DocIndex {
    features: FeatureIndex,
    db: Database,
    txn: Option<WriteTransaction>,
    next_rec: u64,
    documents: u64,
    _tmp: Option<tempfile::TempDir>,
}

/// RAM of the similarity state, by part, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexMemory {
    /// The cuckoo feature table's arrays (6 bytes a bucket; 4 096 features' worth at least).
    pub feature_table: usize,
    /// The feature index's page cache, tail page and scratch buffers.
    pub feature_cache: usize,
    /// What redb's cache holds of the document table (read cache and write buffer).
    pub document_cache: usize,
}

/// A candidate source: its key, name and version.
#[derive(Debug, Clone)]
pub struct Found {
    /// The document's key hash.
    pub key: u64,
    /// Its collection.
    pub collection: String,
    /// Its id.
    pub id: String,
    /// Its version number (larger is newer).
    pub version: u64,
}

impl DocIndex {
    /// Opens (or creates) the state in `dir`; `None` keeps it in a temporary directory that
    /// is removed with the index.
    pub fn open(dir: Option<&Path>, max_per_feature: usize) -> Result<Self, Error> {
        let (tmp, dir) = match dir {
            Some(d) => (None, d.to_path_buf()),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("dedupwire-sdedup-")
                    .tempdir()
                    .map_err(|e| state_err("creating a temporary state directory", e))?;
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| state_err(&format!("creating {}", dir.display()), e))?;
        let features = FeatureIndex::open(
            dir.join("features"),
            IndexConfig {
                max_per_feature: max_per_feature.max(1),
                initial_features: 4096,
                ..IndexConfig::default()
            },
        )
        .map_err(|e| state_err(&format!("feature index in {}", dir.display()), e))?;
        let path = dir.join("documents.redb");
        let db = Database::builder()
            .set_cache_size(DB_CACHE_BYTES)
            .create(&path)
            .map_err(|e| state_err(&format!("opening {}", path.display()), e))?;
        let (mut next_rec, mut documents) = (1, 0);
        {
            let r = db.begin_read().map_err(|e| state_err("reading state", e))?;
            if let Ok(meta) = r.open_table(META) {
                let get = |k| meta.get(k).ok().flatten().map(|v| v.value());
                next_rec = get("next_version").unwrap_or(1);
                documents = get("documents").unwrap_or(0);
            }
        }
        Ok(DocIndex {
            features,
            db,
            txn: None,
            next_rec,
            documents,
            _tmp: tmp,
        })
    }

    fn txn(&mut self) -> Result<&mut WriteTransaction, Error> {
        if self.txn.is_none() {
            let t = self
                .db
                .begin_write()
                .map_err(|e| state_err("starting a state transaction", e))?;
            self.txn = Some(t);
        }
        Ok(self.txn.as_mut().expect("just set"))
    }

    /// Candidate sources for `sketch`, best first: shared features, +`reward` when
    /// `is_cached(key)`, newest on ties; at most `limit`.
    pub fn candidates(
        &mut self,
        sketch: &[u64],
        limit: usize,
        reward: u32,
        is_cached: impl Fn(u64) -> bool,
    ) -> Result<Vec<Found>, Error> {
        if sketch.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let hits = self
            .features
            .lookup(sketch)
            .map_err(|e| state_err("feature index lookup", e))?;
        let txn = self.txn()?;
        let records = txn
            .open_table(RECORDS)
            .map_err(|e| state_err("records table", e))?;
        let mut found: Vec<(u32, Found)> = Vec::new();
        let mut best = 0u32;
        for (rec, shared) in hits {
            if shared + reward < best {
                break;
            }
            let Some(name) = records
                .get(rec)
                .map_err(|e| state_err("records table", e))?
            else {
                continue;
            };
            let name = name.value();
            let Some(sep) = name.iter().position(|&b| b == 0xff) else {
                continue;
            };
            let collection = String::from_utf8_lossy(&name[..sep]).into_owned();
            let id = String::from_utf8_lossy(&name[sep + 1..]).into_owned();
            let key = super::key_hash(&collection, &id);
            let score = shared + if is_cached(key) { reward } else { 0 };
            best = best.max(score);
            found.push((
                score,
                Found {
                    key,
                    collection,
                    id,
                    version: rec,
                },
            ));
        }
        found.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.version.cmp(&a.1.version)));
        Ok(found.into_iter().take(limit).map(|(_, f)| f).collect())
    }

    /// Records a new version of (`collection`, `id`) with `sketch`.
    pub fn upsert(
        &mut self,
        key: u64,
        collection: &str,
        id: &str,
        sketch: &[u64],
    ) -> Result<(), Error> {
        let rec = self.next_rec;
        self.next_rec += 1;
        let mut name = Vec::with_capacity(collection.len() + 1 + id.len());
        name.extend_from_slice(collection.as_bytes());
        name.push(0xff);
        name.extend_from_slice(id.as_bytes());
        let txn = self.txn()?;
        let old = {
            let mut latest = txn
                .open_table(LATEST)
                .map_err(|e| state_err("latest table", e))?;
            let old = latest
                .insert(key, rec)
                .map_err(|e| state_err("latest table", e))?
                .map(|v| v.value());
            old
        };
        {
            let mut records = txn
                .open_table(RECORDS)
                .map_err(|e| state_err("records table", e))?;
            if let Some(old) = old {
                records
                    .remove(old)
                    .map_err(|e| state_err("records table", e))?;
            }
            records
                .insert(rec, name.as_slice())
                .map_err(|e| state_err("records table", e))?;
        }
        if old.is_none() {
            self.documents += 1;
        }
        self.features
            .insert(rec, sketch)
            .map_err(|e| state_err("feature index insert", e))
    }

    /// Forgets a deleted document.
    pub fn delete(&mut self, key: u64) -> Result<(), Error> {
        let txn = self.txn()?;
        let old = {
            let mut latest = txn
                .open_table(LATEST)
                .map_err(|e| state_err("latest table", e))?;
            let old = latest
                .remove(key)
                .map_err(|e| state_err("latest table", e))?
                .map(|v| v.value());
            old
        };
        if let Some(old) = old {
            {
                let mut records = txn
                    .open_table(RECORDS)
                    .map_err(|e| state_err("records table", e))?;
                records
                    .remove(old)
                    .map_err(|e| state_err("records table", e))?;
            }
            self.documents -= 1;
        }
        Ok(())
    }

    /// Makes the batch's changes durable.
    pub fn commit(&mut self) -> Result<(), Error> {
        let (next, docs) = (self.next_rec, self.documents);
        let txn = self.txn()?;
        {
            let mut meta = txn
                .open_table(META)
                .map_err(|e| state_err("meta table", e))?;
            meta.insert("next_version", next)
                .map_err(|e| state_err("meta table", e))?;
            meta.insert("documents", docs)
                .map_err(|e| state_err("meta table", e))?;
        }
        let txn = self.txn.take().expect("opened above");
        txn.commit().map_err(|e| state_err("committing state", e))?;
        self.features
            .flush()
            .map_err(|e| state_err("feature index flush", e))
    }

    /// RAM held now, by part. redb's cache counts what it holds, not its `DB_CACHE_BYTES`
    /// bound, which a small stream never fills.
    pub fn memory(&self) -> IndexMemory {
        let feature_cache = self.features.stats().cache_bytes as usize;
        IndexMemory {
            feature_table: self.features.memory_bytes().saturating_sub(feature_cache),
            feature_cache,
            document_cache: self.db.cache_stats().used_bytes(),
        }
    }

    /// Documents currently indexed.
    pub fn documents(&self) -> u64 {
        self.documents
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_survives_a_restart_and_forgets_deleted_and_old_versions() {
        let dir = tempfile::tempdir().unwrap();
        let k = |id: &str| super::super::key_hash("c", id);
        {
            let mut idx = DocIndex::open(Some(dir.path()), 8).unwrap();
            idx.upsert(k("a"), "c", "a", &[1, 2, 3]).unwrap();
            idx.upsert(k("b"), "c", "b", &[3, 4]).unwrap();
            idx.upsert(k("a"), "c", "a", &[1, 2, 9]).unwrap();
            idx.upsert(k("gone"), "c", "gone", &[1, 2, 3]).unwrap();
            idx.delete(k("gone")).unwrap();
            idx.commit().unwrap();
            assert_eq!(idx.documents(), 2);
        }
        let mut idx = DocIndex::open(Some(dir.path()), 8).unwrap();
        assert_eq!(idx.documents(), 2);
        let found = idx.candidates(&[1, 2, 3], 5, 2, |_| false).unwrap();
        let ids: Vec<&str> = found.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(
            ids,
            ["a", "b"],
            "newest version of a once, then b; deleted doc gone"
        );
        let cached_b = idx.candidates(&[3], 5, 2, |key| key == k("b")).unwrap();
        assert_eq!(
            cached_b[0].id, "b",
            "the cache reward decides between equal matches"
        );
    }
}
