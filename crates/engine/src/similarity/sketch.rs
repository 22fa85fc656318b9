//! sDedup sketches: the top-K chunk hashes of a document (sDedup §3.1).
//!
//! The document is cut into small FastCDC chunks (average `chunk_avg`, min `chunk_avg / 4`,
//! max `chunk_avg * 4`), each chunk is hashed with [`feature_hash`] (xxh3), and the `k` largest
//! *distinct* hashes, largest first, are the features. A revision shares most of its chunks, so
//! most of its top-K, with the previous version; the top-K of unrelated documents are disjoint.
//! A document shorter than one chunk is one chunk, so it has one feature; an empty document has
//! none.

use serde::{Deserialize, Serialize};

use crate::chunk::{config_error, Chunker, FastCdc};
use crate::fingerprint::feature_hash;
use crate::Result;

/// How sketches are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SketchConfig {
    /// Number of features kept per document (sDedup: 8).
    pub k: usize,
    /// Average CDC chunk size used only to compute the sketch (sDedup: 64 B – 1 KiB).
    pub chunk_avg: usize,
}

impl Default for SketchConfig {
    fn default() -> Self {
        // chunk_avg = 64 found the previous version of more updates than 128, 256 and 512 on
        // the document streams we measured (tests/similarity_quality.rs), most clearly on small
        // documents, and costs little speed: the sketch keeps K features whatever the chunk size.
        SketchConfig {
            k: 8,
            chunk_avg: 64,
        }
    }
}

/// The most features a sketch may keep.
pub const MAX_SKETCH_K: usize = 64;

impl SketchConfig {
    /// Checks `1 <= k <= MAX_SKETCH_K` and that FastCDC accepts `chunk_avg` (a power of two, ≥ 64).
    pub fn validate(&self) -> Result<()> {
        if self.k == 0 || self.k > MAX_SKETCH_K {
            return Err(config_error(format!(
                "sketch k must be in 1..={MAX_SKETCH_K}, got {}",
                self.k
            )));
        }
        self.chunker().map(|_| ())
    }

    /// The chunker the sketch uses: FastCDC with min = avg/4, max = avg*4.
    pub fn chunker(&self) -> Result<FastCdc> {
        let avg = self.chunk_avg;
        FastCdc::new(avg / 4, avg, avg.saturating_mul(4))
    }

    /// The sketch of `data`: up to `k` distinct features, largest first.
    ///
    /// # Panics
    /// If the configuration is invalid (see [`SketchConfig::validate`]).
    pub fn sketch(&self, data: &[u8]) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.k);
        self.sketch_into(data, &mut out);
        out
    }

    /// Like [`SketchConfig::sketch`], replacing the contents of `out` (no allocation once it has room).
    ///
    /// # Panics
    /// If the configuration is invalid (see [`SketchConfig::validate`]).
    pub fn sketch_into(&self, data: &[u8], out: &mut Vec<u64>) {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
        let cdc = self.chunker().expect("validated");
        let mut top = TopK::new(self.k);
        let mut rest = data;
        while !rest.is_empty() {
            let n = cdc.cut(rest);
            let (chunk, tail) = rest.split_at(n);
            top.offer(feature_hash(chunk));
            rest = tail;
        }
        out.clear();
        out.extend_from_slice(top.as_slice());
    }
}

/// The `k` largest distinct values seen, largest first, in a fixed array.
struct TopK {
    vals: [u64; MAX_SKETCH_K],
    len: usize,
    k: usize,
}

impl TopK {
    fn new(k: usize) -> Self {
        debug_assert!((1..=MAX_SKETCH_K).contains(&k));
        TopK {
            vals: [0; MAX_SKETCH_K],
            len: 0,
            k,
        }
    }

    #[inline]
    fn offer(&mut self, h: u64) {
        // Fast path once full: most hashes are below the current K-th largest.
        if self.len == self.k && h <= self.vals[self.len - 1] {
            return;
        }
        let vals = &mut self.vals[..self.len];
        // First position holding a value <= h (values are descending).
        let pos = vals.iter().position(|&v| v <= h).unwrap_or(self.len);
        if pos < self.len && vals[pos] == h {
            return;
        }
        let end = if self.len == self.k {
            self.len - 1
        } else {
            self.len += 1;
            self.len - 1
        };
        self.vals.copy_within(pos..end, pos + 1);
        self.vals[pos] = h;
    }

    fn as_slice(&self) -> &[u64] {
        &self.vals[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_keeps_largest_distinct_descending() {
        let mut t = TopK::new(3);
        for v in [5u64, 1, 9, 9, 3, 7, 5, 2, 9, 8] {
            t.offer(v);
        }
        assert_eq!(t.as_slice(), &[9, 8, 7]);
        let mut t = TopK::new(4);
        for v in [2u64, 2, 1] {
            t.offer(v);
        }
        assert_eq!(t.as_slice(), &[2, 1]);
        let mut t = TopK::new(1);
        for v in [0u64, 3, 3, 1, u64::MAX] {
            t.offer(v);
        }
        assert_eq!(t.as_slice(), &[u64::MAX]);
    }

    #[test]
    fn top_k_matches_sort_dedup() {
        let mut s = 12345u64;
        for k in [1usize, 2, 8, 16, 64] {
            let mut all = Vec::new();
            let mut t = TopK::new(k);
            for _ in 0..500 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = (s >> 33) % 300; // many repeats
                all.push(v);
                t.offer(v);
            }
            all.sort_unstable_by(|a, b| b.cmp(a));
            all.dedup();
            all.truncate(k);
            assert_eq!(t.as_slice(), &all[..]);
        }
    }

    #[test]
    fn validates_config() {
        assert!(SketchConfig::default().validate().is_ok());
        assert!(SketchConfig {
            k: 0,
            chunk_avg: 256
        }
        .validate()
        .is_err());
        assert!(SketchConfig {
            k: MAX_SKETCH_K + 1,
            chunk_avg: 256
        }
        .validate()
        .is_err());
        assert!(SketchConfig { k: 8, chunk_avg: 1 }.validate().is_err());
    }

    /// Deterministic pseudo-text: `len` bytes of words from a small vocabulary.
    fn text(len: usize, seed: u64) -> Vec<u8> {
        const WORDS: [&str; 16] = [
            "the", "replica", "document", "chunk", "of", "sketch", "feature", "and", "source",
            "delta", "index", "a", "to", "is", "update", "oplog",
        ];
        let mut s = seed;
        let mut out = Vec::with_capacity(len + 16);
        while out.len() < len {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            out.extend_from_slice(WORDS[(s >> 59) as usize % 16].as_bytes());
            out.push(if (s >> 20).is_multiple_of(11) {
                b'\n'
            } else {
                b' '
            });
        }
        out.truncate(len);
        out
    }

    fn shared(a: &[u64], b: &[u64]) -> usize {
        a.iter().filter(|x| b.contains(x)).count()
    }

    #[test]
    fn modified_copy_shares_most_unrelated_none() {
        let c = SketchConfig::default();
        let mut total = 0;
        for seed in 0..10u64 {
            let base = text(16 << 10, seed);
            let mut edited = base.clone();
            edited.splice(2000..2000, *b"an inserted sentence about replication. ");
            edited.drain(9000..9100);
            edited[14000] = b'#';
            let (a, b) = (c.sketch(&base), c.sketch(&edited));
            assert_eq!(a.len(), 8);
            let n = shared(&a, &b);
            // CDC resynchronizes after an edit within a few chunks, rarely many more.
            assert!(n >= 2, "seed {seed}: {n}/8 shared");
            total += n;
            assert_eq!(shared(&a, &c.sketch(&text(16 << 10, seed + 100))), 0);
        }
        assert!(total >= 50, "{total}/80 shared");
    }

    #[test]
    fn sketch_is_sorted_distinct_and_bounded() {
        for chunk_avg in [64, 256, 1024] {
            for k in [1, 8, 20] {
                let c = SketchConfig { k, chunk_avg };
                let s = c.sketch(&text(50_000, k as u64));
                assert_eq!(s.len(), k);
                assert!(s.windows(2).all(|w| w[0] > w[1]));
            }
        }
        // Repeated content: few distinct chunks, so fewer features than k.
        let s = SketchConfig::default().sketch(&[7u8; 100_000]);
        assert!(!s.is_empty() && s.len() < 8, "{}", s.len());
    }

    /// Frozen vectors: a change that moves these (chunker, hash, selection) changes every sketch.
    #[test]
    fn golden_vectors() {
        let c = SketchConfig {
            k: 8,
            chunk_avg: 256,
        };
        let c64 = |k| SketchConfig { k, chunk_avg: 64 };
        let got = [
            c.sketch(b"dedupwire"),
            c.sketch(&text(4096, 1)),
            c64(4).sketch(&text(4096, 2)),
            c64(8).sketch(&text(1000, 3)),
        ];
        let want: [Vec<u64>; 4] = [
            vec![0x9d9c2d5e04ad23b1],
            vec![
                0xfdaf4b066e2b8102,
                0xfd664b00efab8439,
                0xf4f63d8210d8e657,
                0xf02682b36a42e84c,
                0xe95634b44ae2e164,
                0xd72c1e406797b110,
                0xd1dee19dfb762300,
                0xa72f23a477834100,
            ],
            vec![
                0xfe18a0a10764780d,
                0xfa0b653d8a51b335,
                0xf6c115d0ac2df89f,
                0xf6aa9add8b2a1308,
            ],
            vec![
                0xc8ea5b176a17c0ea,
                0xbb5aa2e463f1f26f,
                0xaa32ce59f603a55a,
                0x9ed5046d10ae88c7,
                0x976c16a729dc3d50,
                0x84a786f607c034ff,
                0x6a6f0f4042af567a,
                0x3bf121328bd4dbf8,
            ],
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn small_and_empty_documents() {
        let c = SketchConfig::default();
        assert!(c.sketch(b"").is_empty());
        let s = c.sketch(b"{\"a\": 1}");
        assert_eq!(s, vec![feature_hash(b"{\"a\": 1}")]);
    }
}
