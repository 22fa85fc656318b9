//! The contract between the dedup channel and where chunks are kept: a [`ChunkStore`] maps a
//! chunk's identity to its bytes. The persistent implementation is the `Environment`;
//! [`MemoryStore`] serves tests and short-lived streams.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::RwLock;

/// A chunk's identity: the output of the stream's identifier (BLAKE3-256, or xxh3-128 padded
/// with zeros to 32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

/// Why a chunk store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Reading or writing the store's files failed (a full disk shows up here).
    #[error("chunk store I/O error: {0}")]
    Io(#[from] io::Error),
    /// The store's files are damaged: what is wrong, and where.
    #[error("chunk store is corrupt: {0}")]
    Corrupt(String),
    /// The store is used in a way it cannot serve (a chunk larger than the store's limit, a
    /// store locked by another process).
    #[error("chunk store: {0}")]
    Refused(String),
}

/// Where a dedup channel keeps the chunks it has sent or received, shared by every stream of
/// one process (hence `&self` and `Send + Sync`).
///
/// A store may evict chunks at any time to stay within its size limit: `contains` answering
/// `true` does not promise a later `get` finds the chunk, and the channel's protocol copes
/// with that (it asks for the chunk again).
pub trait ChunkStore: Send + Sync {
    /// Whether the store holds `id` now.
    fn contains(&self, id: &ChunkId) -> Result<bool, StoreError>;
    /// The chunk's bytes, if held; the store checks them against its own checksum and reports
    /// damage as [`StoreError::Corrupt`] rather than returning wrong bytes.
    fn get(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, StoreError>;
    /// Keeps `data` under `id` (the caller has verified that `id` names `data`); storing an id
    /// already held is a cheap no-op.
    fn put(&self, id: &ChunkId, data: &[u8]) -> Result<(), StoreError>;
    /// [`contains`](ChunkStore::contains) for many ids at once: one answer per id, in order.
    fn contains_many(&self, ids: &[ChunkId]) -> Result<Vec<bool>, StoreError> {
        ids.iter().map(|id| self.contains(id)).collect()
    }
    /// Makes everything `put` so far durable (survives a crash).
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A chunk store in memory, unbounded: for tests and one-off transfers.
#[derive(Debug, Default)]
pub struct MemoryStore {
    chunks: RwLock<HashMap<ChunkId, Vec<u8>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// How many chunks it holds.
    pub fn len(&self) -> usize {
        self.chunks.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether it holds no chunk.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ChunkStore for MemoryStore {
    fn contains(&self, id: &ChunkId) -> Result<bool, StoreError> {
        Ok(self
            .chunks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(id))
    }

    fn get(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .chunks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned())
    }

    fn put(&self, id: &ChunkId, data: &[u8]) -> Result<(), StoreError> {
        self.chunks
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(*id)
            .or_insert_with(|| data.to_vec());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_store_keeps_and_answers() {
        let store = MemoryStore::new();
        let a = ChunkId([1; 32]);
        let b = ChunkId([2; 32]);
        store.put(&a, b"alpha").unwrap();
        store.put(&a, b"ignored: already held").unwrap();
        assert_eq!(store.get(&a).unwrap().as_deref(), Some(&b"alpha"[..]));
        assert_eq!(store.get(&b).unwrap(), None);
        assert_eq!(store.contains_many(&[a, b]).unwrap(), vec![true, false]);
        assert_eq!(store.len(), 1);
    }
}
