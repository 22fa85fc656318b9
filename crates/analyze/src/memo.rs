//! Compressed sizes shared between streams.
//!
//! Several compressed streams often hold the very same batch: every stream has one batch per
//! input batch, and an exact method that removed nothing from an input batch (a large chunk
//! size may find no duplicate in a whole image) holds its bytes unchanged, as compression
//! alone does. Every stream samples the same input batches, so such streams ask for the same
//! compressions. The memo answers the second request with the first one's size and CPU time,
//! so every method is still charged what it would pay alone.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use dedupwire_engine::compress::{Compression, Compressor};

use crate::cpu::charge;

/// Entries kept at most (about 40 MB); past that, new sizes are measured but not kept.
const MAX_ENTRIES: usize = 1 << 20;

type Key = (Compression, usize, u128);

/// Compressed lengths and their CPU seconds, by method and content, shared by all runners.
#[derive(Clone, Default)]
pub struct Memo(Arc<Mutex<HashMap<Key, (usize, f64)>>>);

impl fmt::Debug for Memo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.lock().map_or(0, |m| m.len());
        f.debug_struct("Memo").field("entries", &n).finish()
    }
}

impl Memo {
    /// Compressions remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().expect("no panics while held").len()
    }

    /// Compresses `data` with `c` (into `scratch`) unless it was compressed before, adds the
    /// CPU seconds the compression took to `cpu`, and returns the compressed length.
    pub fn compress(
        &self,
        c: &mut Compressor,
        data: &[u8],
        scratch: &mut Vec<u8>,
        cpu: &mut f64,
    ) -> usize {
        let key = (c.method(), data.len(), xxhash_rust::xxh3::xxh3_128(data));
        if let Some(&(len, secs)) = self.0.lock().expect("no panics while held").get(&key) {
            *cpu += secs;
            return len;
        }
        let mut secs = 0.0;
        let len = charge(&mut secs, || c.compress_reusing(data, scratch));
        *cpu += secs;
        let mut map = self.0.lock().expect("no panics while held");
        if map.len() < MAX_ENTRIES {
            map.insert(key, (len, secs));
        }
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_bytes_are_compressed_once_and_charged_each_time() {
        let memo = Memo::default();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut c = Compressor::new(Compression::Zstd(3));
        let mut scratch = Vec::new();
        let (mut first, mut second) = (0.0, 0.0);
        let a = memo.compress(&mut c, &data, &mut scratch, &mut first);
        let b = memo.compress(&mut c, &data, &mut scratch, &mut second);
        assert_eq!(a, b);
        assert_eq!(a, Compression::Zstd(3).compress(&data).len());
        assert_eq!(first, second);
        let mut lz4 = Compressor::new(Compression::Lz4);
        let l = memo.compress(&mut lz4, &data, &mut scratch, &mut 0.0);
        assert_eq!(l, Compression::Lz4.compress(&data).len());
        let mut other = data.clone();
        other[5] ^= 1;
        memo.compress(&mut c, &other, &mut scratch, &mut 0.0);
        assert_eq!(memo.0.lock().unwrap().len(), 3);
    }
}
