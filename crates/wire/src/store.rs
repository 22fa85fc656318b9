//! The contract between the dedup channel and where chunks are kept: a [`ChunkStore`] maps a
//! chunk's identity to its bytes. The persistent implementation is the `Environment`;
//! [`MemoryStore`] serves tests and short-lived streams.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::{Mutex, RwLock};

/// A chunk's identity: the output of the stream's identifier (BLAKE3-256, or xxh3-128 padded
/// with zeros to 32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

/// Hashes only the first 8 bytes: they are already uniform (a hash's output), so tables keyed
/// by ids take them as they are ([`IdMap`]) instead of hashing 32 bytes again.
impl std::hash::Hash for ChunkId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from_le_bytes(
            self.0[..8].try_into().expect("8 of 32 bytes"),
        ));
    }
}

/// A hash map keyed by chunk ids, which are their own hash (see [`ChunkId`]'s `Hash`).
pub type IdMap<V> = HashMap<ChunkId, V, dedupwire_engine::exact_index::PassThrough>;

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

/// What a sender learnt about one chunk it holds, kept so that a later stream finds delta
/// bases among the chunks earlier ones sent: its similarity features, and the chunk just
/// before it in the stream (versions of a file change in place, so the chunk that followed
/// an old neighbour is a likely base).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sketch {
    /// The chunk.
    pub id: ChunkId,
    /// The chunk before it in its stream, when known.
    pub after: Option<ChunkId>,
    /// Its super-features (empty when it was too short to be delta-encoded); at most
    /// [`MAX_SKETCH_FEATURES`].
    pub features: Vec<u64>,
}

/// The most features a [`Sketch`] carries.
pub const MAX_SKETCH_FEATURES: usize = 32;

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
    /// damage as [`StoreError::Corrupt`] rather than returning wrong bytes, and then drops the
    /// chunk (the channel asks its peer for it again and `put`s the good copy).
    fn get(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, StoreError>;
    /// Keeps `data` under `id` (the caller has verified that `id` names `data`); storing an id
    /// already held is a cheap no-op.
    fn put(&self, id: &ChunkId, data: &[u8]) -> Result<(), StoreError>;
    /// Keeps `id` (a chunk of `len` bytes) as the chunks `parts` joined, all held whole, so
    /// that its bytes are not stored twice; false if the store did not (this default never
    /// does, nor does a store that lacks a part), and the caller then `put`s it whole.
    fn put_recipe(&self, id: &ChunkId, len: u64, parts: &[ChunkId]) -> Result<bool, StoreError> {
        let _ = (id, len, parts);
        Ok(false)
    }
    /// [`contains`](ChunkStore::contains) for many ids at once: one answer per id, in order.
    fn contains_many(&self, ids: &[ChunkId]) -> Result<Vec<bool>, StoreError> {
        ids.iter().map(|id| self.contains(id)).collect()
    }
    /// Makes everything `put` so far durable (survives a crash).
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// The most chunk bytes the store keeps, when it is small enough that a sender should
    /// index no more than that many bytes of chunks as delta bases (it could not read older
    /// ones back; an index of everything sent grew by 230 MB per GiB). `None` (this default):
    /// index everything.
    fn capacity(&self) -> Option<u64> {
        None
    }
    /// Keeps what a sender learnt about chunks it holds, for later streams: hints, which a
    /// store may drop (this default keeps none) or lose to damage without harm. A sketch with
    /// more than [`MAX_SKETCH_FEATURES`] features is refused.
    fn remember(&self, sketches: &[Sketch]) -> Result<(), StoreError> {
        check_sketches(sketches)
    }
    /// The sketches kept by [`remember`](ChunkStore::remember), oldest first, of chunks the
    /// store still holds.
    fn recall(&self) -> Result<Vec<Sketch>, StoreError> {
        Ok(Vec::new())
    }
    /// Keeps `note` (at most [`MAX_NOTE_BYTES`]) under `key` (see [`check_note_key`]) for
    /// later streams, replacing the one before: what a channel measured that the next
    /// connection starts from. Advisory, like sketches: this default keeps none.
    fn keep_note(&self, key: &str, note: &[u8]) -> Result<(), StoreError> {
        check_note(key, note)
    }
    /// The note last kept under `key`; `None` if there is none or it was damaged.
    fn note(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_note_key(key)?;
        Ok(None)
    }
}

/// The largest note a store keeps.
pub const MAX_NOTE_BYTES: usize = 4096;

/// Refuses a note key other than 1 to 32 of `a-z`, `0-9` and `-` (it names a file).
pub fn check_note_key(key: &str) -> Result<(), StoreError> {
    let ok = (1..=32).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Refused(format!(
            "note key {key:?}: 1 to 32 of a-z, 0-9 and -"
        )))
    }
}

/// Refuses a note a store cannot keep.
/// `store.get(id)`, with a chunk the store found damaged taken as one it lacks: the channel
/// then asks the peer for it again (NEED/RAW, or no delta against it), so one bad chunk costs
/// one chunk's bytes, not the whole message. A store drops what it reports damaged.
pub(crate) fn get_intact(
    store: &dyn ChunkStore,
    id: &ChunkId,
) -> Result<Option<Vec<u8>>, StoreError> {
    match store.get(id) {
        Err(StoreError::Corrupt(_)) => Ok(None),
        other => other,
    }
}

pub(crate) fn check_note(key: &str, note: &[u8]) -> Result<(), StoreError> {
    check_note_key(key)?;
    if note.len() > MAX_NOTE_BYTES {
        return Err(StoreError::Refused(format!(
            "a note of {} bytes; at most {MAX_NOTE_BYTES} are kept",
            note.len()
        )));
    }
    Ok(())
}

/// Refuses sketches a store cannot keep.
pub(crate) fn check_sketches(sketches: &[Sketch]) -> Result<(), StoreError> {
    match sketches
        .iter()
        .find(|s| s.features.len() > MAX_SKETCH_FEATURES)
    {
        Some(s) => Err(StoreError::Refused(format!(
            "a sketch of chunk {:?} has {} features; at most {MAX_SKETCH_FEATURES} are kept",
            s.id,
            s.features.len()
        ))),
        None => Ok(()),
    }
}

/// A chunk store in memory, unbounded: for tests and one-off transfers.
#[derive(Debug, Default)]
pub struct MemoryStore {
    chunks: RwLock<IdMap<Vec<u8>>>,
    sketches: Mutex<Vec<Sketch>>,
    notes: Mutex<HashMap<String, Vec<u8>>>,
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

    fn remember(&self, sketches: &[Sketch]) -> Result<(), StoreError> {
        check_sketches(sketches)?;
        self.sketches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(sketches);
        Ok(())
    }

    fn recall(&self) -> Result<Vec<Sketch>, StoreError> {
        let chunks = self.chunks.read().unwrap_or_else(|e| e.into_inner());
        Ok(self
            .sketches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| chunks.contains_key(&s.id))
            .cloned()
            .collect())
    }

    fn keep_note(&self, key: &str, note: &[u8]) -> Result<(), StoreError> {
        check_note(key, note)?;
        self.notes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned(), note.to_vec());
        Ok(())
    }

    fn note(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_note_key(key)?;
        Ok(self
            .notes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned())
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

    #[test]
    fn memory_store_recalls_sketches_of_chunks_it_holds() {
        let store = MemoryStore::new();
        let a = ChunkId([1; 32]);
        let b = ChunkId([2; 32]);
        store.put(&a, b"alpha").unwrap();
        let kept = Sketch {
            id: a,
            after: Some(b),
            features: vec![1, 2, 3],
        };
        let gone = Sketch {
            id: b,
            after: None,
            features: vec![],
        };
        store.remember(&[kept.clone(), gone]).unwrap();
        assert_eq!(store.recall().unwrap(), vec![kept]);
        let big = Sketch {
            id: a,
            after: None,
            features: vec![0; MAX_SKETCH_FEATURES + 1],
        };
        assert!(matches!(
            store.remember(&[big]),
            Err(StoreError::Refused(_))
        ));
    }
}
