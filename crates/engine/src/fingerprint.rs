//! Fingerprints: BLAKE3 for chunk identity, xxh3 for similarity features.
//!
//! Identity must resist collisions (a wrong match silently corrupts data), so it uses BLAKE3,
//! keyed per repository or channel where chunk hashes could reveal content. Features only
//! steer the search for a delta source, so they use the fastest good hash, xxh3.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A 32-byte BLAKE3 chunk fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The first 8 bytes as a little-endian integer: a well-mixed key for hash tables.
    pub fn prefix_u64(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().expect("8 bytes"))
    }
}

impl std::hash::Hash for Fingerprint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.prefix_u64());
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Computes chunk fingerprints: plain or keyed BLAKE3, or xxh3 for estimates.
#[derive(Clone, Default)]
pub struct Fingerprinter {
    kind: Kind,
}

#[derive(Clone, Default)]
enum Kind {
    #[default]
    Plain,
    Keyed([u8; 32]),
    Estimate,
}

impl Fingerprinter {
    /// Plain BLAKE3: fingerprints comparable across every user.
    pub fn new() -> Self {
        Fingerprinter { kind: Kind::Plain }
    }

    /// Keyed BLAKE3: fingerprints meaningful only to holders of `key`.
    pub fn keyed(key: [u8; 32]) -> Self {
        Fingerprinter {
            kind: Kind::Keyed(key),
        }
    }

    /// xxh3-128 ([`fast_id`]) in the first 16 bytes, zeros after: for estimates, never for
    /// data that is stored or sent (it does not resist deliberate collisions).
    pub fn estimate() -> Self {
        Fingerprinter {
            kind: Kind::Estimate,
        }
    }

    /// The fingerprint of `data`.
    pub fn fingerprint(&self, data: &[u8]) -> Fingerprint {
        let hash = match &self.kind {
            Kind::Plain => blake3::hash(data),
            Kind::Keyed(k) => blake3::keyed_hash(k, data),
            Kind::Estimate => {
                let mut fp = [0u8; 32];
                fp[..16].copy_from_slice(&fast_id(data).to_le_bytes());
                return Fingerprint(fp);
            }
        };
        Fingerprint(*hash.as_bytes())
    }
}

impl fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Plain => "blake3",
            Kind::Keyed(_) => "blake3-keyed",
            Kind::Estimate => "xxh3-128",
        };
        f.debug_struct("Fingerprinter")
            .field("kind", &kind)
            .finish()
    }
}

/// The 64-bit xxh3 hash of `data`: for features and sketches, not identity. From
/// `twox-hash`, which picks AVX2 at run time (`xxhash-rust` is built for SSE2).
#[inline]
pub fn feature_hash(data: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(data)
}

/// The 128-bit xxh3 hash of `data`: a fast identity for estimates where an adversary is absent.
#[inline]
pub fn fast_id(data: &[u8]) -> u128 {
    twox_hash::XxHash3_128::oneshot(data)
}

/// Bytes ahead of a chunk that [`prefetch_ahead`] asks for.
pub const PREFETCH_DISTANCE: usize = 4 << 10;

/// Asks the CPU to start loading the `chunk.len()` bytes [`PREFETCH_DISTANCE`] past the start
/// of `chunk`: where the next chunks lie when a pass hashes a buffer's chunks one after
/// another. Bytes read around the caches (direct I/O) come from memory on the first pass,
/// and the hardware's prefetcher stops at every 4 KiB page: xxh3 over the 1 KiB chunks of
/// 512 MiB ran at 7.3 GB/s, and at 10.2 with this (`dedupwire-bench chunking`, this project's
/// VM). A hint only: the range may lie past the buffer (prefetches never fault) and nothing
/// is read.
#[inline(always)]
pub fn prefetch_ahead(chunk: &[u8]) {
    for off in (0..chunk.len()).step_by(64) {
        crate::hint::prefetch(chunk, PREFETCH_DISTANCE + off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frozen vectors: a change that moves these breaks every stored fingerprint.
    #[test]
    fn golden_vectors() {
        let fp = Fingerprinter::new().fingerprint(b"dedupwire");
        assert_eq!(fp.to_string(), blake3::hash(b"dedupwire").to_hex().as_str());
        assert_eq!(
            Fingerprinter::new().fingerprint(b"").to_string(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(feature_hash(b""), 0x2d06800538d394c2);
        let keyed = Fingerprinter::keyed([7; 32]).fingerprint(b"dedupwire");
        assert_ne!(keyed, fp);
    }

    #[test]
    fn prefetching_past_the_end_of_a_buffer_is_harmless() {
        let data = vec![7u8; 3000];
        for chunk in [&data[..], &data[2999..], &data[3000..]] {
            prefetch_ahead(chunk);
        }
        assert_eq!(fast_id(&data), fast_id(&[7u8; 3000]));
    }

    #[test]
    fn fast_hashes_are_xxh3() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i ^ i >> 5) as u8).collect();
        for len in [0, 3, 16, 100, 240, 241, 1000, 8192, 20_000] {
            let d = &data[..len];
            assert_eq!(feature_hash(d), xxhash_rust::xxh3::xxh3_64(d), "{len}");
            assert_eq!(fast_id(d), xxhash_rust::xxh3::xxh3_128(d), "{len}");
        }
    }
}
