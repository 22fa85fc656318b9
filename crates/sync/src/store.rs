//! The sender's chunk store: in memory, bounded, oldest chunks dropped first.
//!
//! A sending channel keeps every chunk it sends as a possible delta base for later chunks;
//! an unbounded [`MemoryStore`](dedupwire_wire::MemoryStore) would grow with the tree. The
//! channel copes with a base that is gone (it sends the chunk literally instead).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use dedupwire_wire::{ChunkId, ChunkStore, StoreError};

/// A FIFO-bounded chunk store in memory.
#[derive(Debug)]
pub struct BoundedStore {
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    chunks: HashMap<ChunkId, Vec<u8>>,
    order: VecDeque<ChunkId>,
    bytes: usize,
}

impl BoundedStore {
    /// A store holding at most about `max_bytes` of chunk data.
    pub fn new(max_bytes: usize) -> BoundedStore {
        BoundedStore {
            max_bytes,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ChunkStore for BoundedStore {
    fn contains(&self, id: &ChunkId) -> Result<bool, StoreError> {
        Ok(self.lock().chunks.contains_key(id))
    }

    fn get(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().chunks.get(id).cloned())
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.max_bytes as u64)
    }

    fn put(&self, id: &ChunkId, data: &[u8]) -> Result<(), StoreError> {
        let mut s = self.lock();
        if s.chunks.contains_key(id) {
            return Ok(());
        }
        s.chunks.insert(*id, data.to_vec());
        s.order.push_back(*id);
        s.bytes += data.len();
        while s.bytes > self.max_bytes {
            let Some(old) = s.order.pop_front() else {
                break;
            };
            if let Some(d) = s.chunks.remove(&old) {
                s.bytes -= d.len();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_chunks_leave_first() {
        let s = BoundedStore::new(10);
        for i in 0..5u8 {
            s.put(&ChunkId([i; 32]), &[i; 4]).unwrap();
        }
        assert!(!s.contains(&ChunkId([0; 32])).unwrap());
        assert!(!s.contains(&ChunkId([2; 32])).unwrap());
        assert_eq!(s.get(&ChunkId([4; 32])).unwrap(), Some(vec![4; 4]));
        assert_eq!(s.get(&ChunkId([3; 32])).unwrap(), Some(vec![3; 4]));
    }
}
