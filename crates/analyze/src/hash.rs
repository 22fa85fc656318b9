//! xxh3, the analysis' chunk ids: from `twox-hash`, which picks AVX2 at run time where
//! `xxhash-rust` (the rest of the workspace's) is built for the baseline x86-64's SSE2. The
//! same function, 1.8× faster on 8 KiB chunks in the cache on this project's machine
//! (`dedupwire-bench chunking`); ids are hashed from every byte several times over (chunk
//! sizes, segments).

use std::hash::Hasher as _;

/// xxh3-64 of `data`.
#[inline]
pub fn xxh3_64(data: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(data)
}

/// xxh3-64 of `data` with `seed`.
#[inline]
pub fn xxh3_64_with_seed(data: &[u8], seed: u64) -> u64 {
    twox_hash::XxHash3_64::oneshot_with_seed(seed, data)
}

/// xxh3-128 of `data`.
#[inline]
pub fn xxh3_128(data: &[u8]) -> u128 {
    twox_hash::XxHash3_128::oneshot(data)
}

/// xxh3-64 of data given in pieces: what [`xxh3_64`] gives on their concatenation.
#[derive(Default, Clone)]
pub struct Xxh3(twox_hash::XxHash3_64);

impl std::fmt::Debug for Xxh3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xxh3").finish_non_exhaustive()
    }
}

impl Xxh3 {
    /// Adds `data` after what was given so far.
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        self.0.write(data);
    }

    /// The hash of what was given so far.
    pub fn digest(&self) -> u64 {
        self.0.finish()
    }

    /// Forgets what was given.
    pub fn reset(&mut self) {
        *self = Xxh3::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_the_xxh3_of_the_rest_of_the_workspace() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for len in [0, 1, 17, 240, 241, 1024, 8192, 100_000] {
            let d = &data[..len];
            assert_eq!(xxh3_64(d), xxhash_rust::xxh3::xxh3_64(d));
            assert_eq!(xxh3_128(d), xxhash_rust::xxh3::xxh3_128(d));
            assert_eq!(
                xxh3_64_with_seed(d, 42),
                xxhash_rust::xxh3::xxh3_64_with_seed(d, 42)
            );
            let mut s = Xxh3::default();
            s.update(b"dropped");
            s.reset();
            d.chunks(333).for_each(|c| s.update(c));
            assert_eq!(s.digest(), xxh3_64(d));
        }
    }
}
