//! Super-features per chunk (Finesse / Odess; Neptune §II-A).
//!
//! A chunk gets `features` features, each the maximum of some hash over the chunk's rolling
//! Gear hashes; a small edit leaves most maxima in place. Features are grouped into
//! super-features (xxh3 of the group, seeded with the group's index), and chunks sharing a
//! super-feature are near-duplicates with high probability.
//!
//! - **Odess**: a Gear hash rolls over the chunk; positions where `hash & ODESS_SAMPLE_MASK == 0`
//!   (one in 128 on average) are sampled; feature `i` is the maximum of `M[i] * hash + A[i]`
//!   (wrapping, `M[i]` odd) over the sampled positions; super-feature `j` groups features
//!   `j*p .. (j+1)*p` (`p = per_super_feature`), as in Odess.
//! - **Finesse**: the chunk is split into `features` equal sub-chunks (sub-chunk `i` is
//!   `[i*n/F, (i+1)*n/F)`); feature `i` is the maximum Gear hash at the positions of sub-chunk `i`
//!   (the hash rolls over the whole chunk, so it sees up to 64 bytes before each position).
//!   The features form `p` groups of `F/p` consecutive features; each group is sorted, and
//!   super-feature `j` groups the rank-`j` feature of every group, as Finesse does.
//!
//! Short chunks, deterministically: an Odess chunk where no position is sampled (a 128-byte
//! chunk about one time in three, a 512-byte chunk one in fifty) samples *every* position
//! instead; a Finesse sub-chunk with no position (chunks shorter than `features` bytes) has
//! feature 0; an empty chunk has all features 0. The Gear table (not the chunker's, so that
//! sampling is independent of chunk boundaries), the transforms and the sampling mask are
//! frozen (golden vectors in the tests): changing them changes every stored super-feature.

use serde::{Deserialize, Serialize};

use crate::chunk::config_error;
use crate::Result;

/// How the per-chunk features are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuperFeatureMethod {
    /// Finesse: split the chunk into sub-blocks, take each one's max rolling hash, group by rank.
    Finesse,
    /// Odess: content-defined sampling of the Gear hash, max of linear transforms.
    Odess,
}

/// How super-features are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuperFeatureConfig {
    /// The sampling method.
    pub method: SuperFeatureMethod,
    /// Features per chunk (e.g. 12).
    pub features: usize,
    /// Features grouped into one super-feature (e.g. 4, giving 3 super-features).
    pub per_super_feature: usize,
}

impl Default for SuperFeatureConfig {
    fn default() -> Self {
        SuperFeatureConfig {
            method: SuperFeatureMethod::Odess,
            features: 12,
            per_super_feature: 4,
        }
    }
}

/// The most features per chunk a [`SuperFeatureConfig`] accepts.
pub const MAX_FEATURES: usize = 32;

/// Odess sampling mask: a position is sampled when `gear & ODESS_SAMPLE_MASK == 0` (7 bits: 1/128).
///
/// The bits are spread over the upper half of the hash, which depends on the last ~60 bytes,
/// rather than the low bits, which depend on the last few bytes only.
pub const ODESS_SAMPLE_MASK: u64 =
    (1 << 22) | (1 << 28) | (1 << 34) | (1 << 40) | (1 << 46) | (1 << 52) | (1 << 58);

/// One step of splitmix64: the next state and its output.
const fn splitmix64(state: u64) -> (u64, u64) {
    let state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (state, z ^ (z >> 31))
}

/// `N` pseudo-random words from `seed`, optionally forced odd.
const fn table<const N: usize>(seed: u64, odd: bool) -> [u64; N] {
    let mut out = [0u64; N];
    let mut state = seed;
    let mut i = 0;
    while i < N {
        let (s, v) = splitmix64(state);
        state = s;
        out[i] = if odd { v | 1 } else { v };
        i += 1;
    }
    out
}

/// The Gear table of the feature hashes (frozen: splitmix64 seeded with ASCII `dedupgea`).
const GEAR: [u64; 256] = table(0x6465_6475_7067_6561, false);
/// Odess multipliers `M[i]` (odd, frozen: seed `odess_mu`).
const ODESS_MUL: [u64; MAX_FEATURES] = table(0x6f64_6573_735f_6d75, true);
/// Odess addends `A[i]` (frozen: seed `odess_ad`).
const ODESS_ADD: [u64; MAX_FEATURES] = table(0x6f64_6573_735f_6164, false);

impl SuperFeatureConfig {
    /// Checks `1 <= per_super_feature <= features <= MAX_FEATURES` and divisibility.
    pub fn validate(&self) -> Result<()> {
        if self.features == 0 || self.features > MAX_FEATURES {
            return Err(config_error(format!(
                "super-feature features must be in 1..={MAX_FEATURES}, got {}",
                self.features
            )));
        }
        if self.per_super_feature == 0 || !self.features.is_multiple_of(self.per_super_feature) {
            return Err(config_error(format!(
                "features ({}) must be a positive multiple of per_super_feature ({})",
                self.features, self.per_super_feature
            )));
        }
        Ok(())
    }

    /// How many super-features each chunk gets: `features / per_super_feature`.
    pub fn super_feature_count(&self) -> usize {
        self.features / self.per_super_feature.max(1)
    }

    /// The super-features of `chunk`: `features / per_super_feature` values.
    ///
    /// # Panics
    /// If the configuration is invalid (see [`SuperFeatureConfig::validate`]).
    pub fn super_features(&self, chunk: &[u8]) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.super_feature_count());
        self.super_features_into(chunk, &mut out);
        out
    }

    /// Like [`SuperFeatureConfig::super_features`], into `out` (cleared first; no allocation).
    ///
    /// # Panics
    /// If the configuration is invalid (see [`SuperFeatureConfig::validate`]).
    pub fn super_features_into(&self, chunk: &[u8], out: &mut Vec<u64>) {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
        let f = self.features;
        let mut features = [0u64; MAX_FEATURES];
        out.clear();
        match self.method {
            SuperFeatureMethod::Odess => {
                odess_features(chunk, &mut features[..f]);
                group_consecutive(&features[..f], self.per_super_feature, out);
            }
            SuperFeatureMethod::Finesse => {
                finesse_features(chunk, &mut features[..f]);
                group_by_rank(&mut features[..f], self.per_super_feature, out);
            }
        }
    }

    /// Odess super-features from Gear hashes the caller sampled over a chunk, for a caller
    /// that already rolls a Gear hash over every byte to cut chunks (an analysis): the maxima
    /// of the same transforms, grouped the same way, without rolling over the chunk again.
    /// They are comparable only with super-features from the same hash and sampling. False,
    /// with `out` empty, when no hash was given or the method is not Odess: the caller then
    /// takes [`SuperFeatureConfig::super_features_into`].
    ///
    /// # Panics
    /// If the configuration is invalid (see [`SuperFeatureConfig::validate`]).
    pub fn odess_from_samples(
        &self,
        hashes: impl IntoIterator<Item = u64>,
        out: &mut Vec<u64>,
    ) -> bool {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
        out.clear();
        if self.method != SuperFeatureMethod::Odess {
            return false;
        }
        let f = self.features;
        let mut features = [0u64; MAX_FEATURES];
        let sampled = max_of_transforms(hashes.into_iter(), f, &mut features);
        if sampled {
            group_consecutive(&features[..f], self.per_super_feature, out);
        }
        sampled
    }

    /// The raw features of `chunk` before grouping (for tests and analysis).
    ///
    /// # Panics
    /// If the configuration is invalid (see [`SuperFeatureConfig::validate`]).
    pub fn raw_features(&self, chunk: &[u8]) -> Vec<u64> {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
        let mut features = vec![0u64; self.features];
        match self.method {
            SuperFeatureMethod::Odess => odess_features(chunk, &mut features),
            SuperFeatureMethod::Finesse => finesse_features(chunk, &mut features),
        }
        features
    }
}

/// Odess: max of the linear transforms over content-sampled Gear positions.
fn odess_features(chunk: &[u8], features: &mut [u64]) {
    let mut maxima = [0u64; MAX_FEATURES];
    let mut samples = Samples::new(features.len(), &mut maxima);
    let sampled = if chunk.len() >= ODESS_TWO_LANES_FROM {
        odess_two_lanes(chunk, &mut samples)
    } else {
        odess_sampled(chunk, 0, &mut samples)
    };
    if !sampled {
        // Too short (or unlucky) to be sampled: every position counts.
        let mut h = 0u64;
        for &b in chunk {
            h = (h << 1).wrapping_add(GEAR[b as usize]);
            samples.push(h);
        }
    }
    samples.flush();
    features.copy_from_slice(&maxima[..features.len()]);
}

/// Sampled Gear hashes on their way to [`max_of_transforms`], which takes them in bulk (with
/// AVX-512 a sample costs three vector operations of each kind, against a dozen emulated
/// multiplies and maxima one at a time).
struct Samples<'a> {
    held: [u64; SAMPLES_HELD],
    n: usize,
    features: usize,
    maxima: &'a mut [u64; MAX_FEATURES],
}

/// Samples a [`Samples`] holds before taking them: an 8 KiB chunk has about 64.
const SAMPLES_HELD: usize = 64;

impl<'a> Samples<'a> {
    fn new(features: usize, maxima: &'a mut [u64; MAX_FEATURES]) -> Self {
        Samples {
            held: [0; SAMPLES_HELD],
            n: 0,
            features,
            maxima,
        }
    }

    #[inline]
    fn push(&mut self, h: u64) {
        self.held[self.n] = h;
        self.n += 1;
        if self.n == SAMPLES_HELD {
            self.flush();
        }
    }

    /// Raises the maxima by the samples held.
    fn flush(&mut self) {
        max_of_transforms(
            self.held[..self.n].iter().copied(),
            self.features,
            self.maxima,
        );
        self.n = 0;
    }
}

/// Chunks at least this long are scanned as two lanes by [`odess_two_lanes`].
const ODESS_TWO_LANES_FROM: usize = 256;

/// Rolls the Gear hash over `bytes` from `hash`, taking the transforms' maxima at the sampled
/// positions; returns whether any position was sampled.
fn odess_sampled(bytes: &[u8], hash: u64, samples: &mut Samples) -> bool {
    odess_roll(bytes, hash, samples).1
}

/// [`odess_sampled`], also returning the hash after `bytes`.
#[inline]
fn odess_roll(bytes: &[u8], mut hash: u64, samples: &mut Samples) -> (u64, bool) {
    let mut sampled = false;
    for &b in bytes {
        hash = (hash << 1).wrapping_add(GEAR[b as usize]);
        if hash & ODESS_SAMPLE_MASK == 0 {
            sampled = true;
            samples.push(hash);
        }
    }
    (hash, sampled)
}

/// [`GEAR`] shifted left by 3, 2, 1 and 0 bits: one addition per byte on the hash's
/// dependency chain instead of a shift and an addition (see [`crate::chunk::shifted4`]).
static GEAR4: [[u64; 256]; 4] = crate::chunk::shifted4(&GEAR);

/// Four Gear steps from `h` over `q`: the hash after them, and whether any of the four
/// positions is sampled (the partial sums of [`GEAR4`] tested against the mask shifted alike;
/// its top bit is 58, so the shifts lose none of its bits). One test and branch per byte, the
/// branch almost never taken.
#[inline(always)]
fn odess_step4(h: u64, q: &[u8]) -> (u64, bool) {
    const M: u64 = ODESS_SAMPLE_MASK;
    let g = &GEAR4;
    let x = (h << 4).wrapping_add(g[0][q[0] as usize]);
    if x & (M << 3) == 0 {
        return (0, true);
    }
    let x = x.wrapping_add(g[1][q[1] as usize]);
    if x & (M << 2) == 0 {
        return (0, true);
    }
    let x = x.wrapping_add(g[2][q[2] as usize]);
    if x & (M << 1) == 0 {
        return (0, true);
    }
    let x = x.wrapping_add(g[3][q[3] as usize]);
    (x, x & M == 0)
}

/// A lane's four bytes `q` from hash `h` one at a time, taking every sampled position; the
/// hash after them.
#[cold]
#[inline(never)]
fn odess_replay4(h: u64, q: &[u8], samples: &mut Samples) -> u64 {
    odess_roll(q, h, samples).0
}

/// [`odess_sampled`] over the whole chunk as two interleaved lanes (its halves), four bytes
/// per step, so the CPU overlaps the two hash chains. The hash shifts one bit per byte, so
/// after 64 bytes it no longer depends on where it started: the second lane starts from zero
/// 64 bytes before its half and samples exactly the positions one sequential scan would, and
/// maxima do not depend on the order they are taken in. A lane's step with a sampled position
/// is replayed byte by byte.
fn odess_two_lanes(chunk: &[u8], samples: &mut Samples) -> bool {
    const WARM_UP: usize = 64;
    let mid = chunk.len() / 2;
    debug_assert!(mid >= WARM_UP);
    let (a, b) = chunk.split_at(mid);
    let mut hb = a[mid - WARM_UP..]
        .iter()
        .fold(0u64, |h, &x| (h << 1).wrapping_add(GEAR[x as usize]));
    let mut ha = 0u64;
    let mut sampled = false;
    let quads = mid / 4;
    for (qa, qb) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        ha = match odess_step4(ha, qa) {
            (x, false) => x,
            (_, true) => {
                sampled = true;
                odess_replay4(ha, qa, samples)
            }
        };
        hb = match odess_step4(hb, qb) {
            (x, false) => x,
            (_, true) => {
                sampled = true;
                odess_replay4(hb, qb, samples)
            }
        };
    }
    sampled |= odess_sampled(&a[4 * quads..], ha, samples);
    odess_sampled(&b[4 * quads..], hb, samples) | sampled
}

/// Features `..f` of `features` raised to the maxima of the transforms of `hashes` (those
/// past `f` may change too); whether there was any hash. With AVX-512 (DQ, VL) and at most
/// [`WIDE_FEATURES`] features, the features stay in three vector registers and a hash costs
/// three multiplies, adds and maxima: the baseline's SSE2 has neither a 64-bit multiply nor
/// an unsigned 64-bit maximum, and emulates both.
fn max_of_transforms(
    hashes: impl Iterator<Item = u64>,
    f: usize,
    features: &mut [u64; MAX_FEATURES],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if f <= WIDE_FEATURES && wide::available() {
        // SAFETY: the CPU has the features `wide::max_of_transforms` is built for.
        return unsafe { wide::max_of_transforms(hashes, features) };
    }
    let mut sampled = false;
    for h in hashes {
        sampled = true;
        transform_max(h, &mut features[..f]);
    }
    sampled
}

/// Features the vector path keeps in registers (three of four 64-bit lanes).
const WIDE_FEATURES: usize = 12;

#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    use super::{MAX_FEATURES, ODESS_ADD, ODESS_MUL, WIDE_FEATURES};

    /// Whether this CPU runs [`max_of_transforms`] (std caches what the CPU answered).
    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
    }

    /// [`super::max_of_transforms`] for the first [`WIDE_FEATURES`] features, 256 bits at a
    /// time (the 512-bit multiply can lower a core's clock).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, DQ and VL ([`available`]).
    #[target_feature(enable = "avx512f,avx512dq,avx512vl")]
    pub(super) unsafe fn max_of_transforms(
        hashes: impl Iterator<Item = u64>,
        features: &mut [u64; MAX_FEATURES],
    ) -> bool {
        const _: () = assert!(WIDE_FEATURES == 12 && MAX_FEATURES >= WIDE_FEATURES);
        let lanes = |a: &[u64]| {
            let a: &[u64; 4] = a.try_into().expect("four lanes");
            // SAFETY: reads four u64 from a reference to four.
            unsafe { _mm256_loadu_si256(a.as_ptr().cast()) }
        };
        let mul = [0, 4, 8].map(|k| lanes(&ODESS_MUL[k..k + 4]));
        let add = [0, 4, 8].map(|k| lanes(&ODESS_ADD[k..k + 4]));
        let mut max = [0, 4, 8].map(|k| lanes(&features[k..k + 4]));
        let mut sampled = false;
        for h in hashes {
            sampled = true;
            let h = _mm256_set1_epi64x(h as i64);
            for k in 0..3 {
                let t = _mm256_add_epi64(_mm256_mullo_epi64(h, mul[k]), add[k]);
                max[k] = _mm256_max_epu64(max[k], t);
            }
        }
        for (k, m) in max.into_iter().enumerate() {
            let out: &mut [u64; 4] = (&mut features[4 * k..4 * k + 4])
                .try_into()
                .expect("four lanes");
            // SAFETY: writes four u64 into a reference to four.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), m) };
        }
        sampled
    }
}

#[inline]
fn transform_max(h: u64, features: &mut [u64]) {
    for (i, f) in features.iter_mut().enumerate() {
        let t = h.wrapping_mul(ODESS_MUL[i]).wrapping_add(ODESS_ADD[i]);
        *f = (*f).max(t);
    }
}

/// Finesse: the max Gear hash of each of `features.len()` equal sub-chunks.
fn finesse_features(chunk: &[u8], features: &mut [u64]) {
    let n = chunk.len();
    let count = features.len();
    let mut h = 0u64;
    let mut start = 0;
    for (i, feature) in features.iter_mut().enumerate() {
        let end = n * (i + 1) / count;
        let sub = &chunk[start..end];
        let pairs = sub.chunks_exact(2);
        let tail = pairs.remainder();
        let mut max = 0u64;
        // Two bytes per step: one `max` on the loop-carried chain per two positions.
        for p in pairs {
            let a = GEAR[p[0] as usize];
            let b = GEAR[p[1] as usize];
            let h1 = (h << 1).wrapping_add(a);
            h = (h << 2).wrapping_add((a << 1).wrapping_add(b));
            max = max.max(h1.max(h));
        }
        for &b in tail {
            h = (h << 1).wrapping_add(GEAR[b as usize]);
            max = max.max(h);
        }
        *feature = max;
        start = end;
    }
}

/// xxh3 of `group`'s little-endian bytes, seeded with the group's index.
#[inline]
fn hash_group(group: impl Iterator<Item = u64>, index: usize) -> u64 {
    let mut bytes = [0u8; MAX_FEATURES * 8];
    let mut len = 0;
    for v in group {
        bytes[len..len + 8].copy_from_slice(&v.to_le_bytes());
        len += 8;
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(&bytes[..len], index as u64)
}

/// Odess grouping: super-feature `j` hashes features `j*p .. (j+1)*p`.
fn group_consecutive(features: &[u64], per: usize, out: &mut Vec<u64>) {
    for (j, group) in features.chunks_exact(per).enumerate() {
        out.push(hash_group(group.iter().copied(), j));
    }
}

/// Finesse grouping: `per` groups of `F/per` consecutive features, each sorted;
/// super-feature `j` hashes the rank-`j` feature of every group.
fn group_by_rank(features: &mut [u64], per: usize, out: &mut Vec<u64>) {
    let sfs = features.len() / per;
    for group in features.chunks_exact_mut(sfs) {
        group.sort_unstable();
    }
    let features = &*features;
    for j in 0..sfs {
        out.push(hash_group((0..per).map(|g| features[g * sfs + j]), j));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random bytes.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                let (n, v) = splitmix64(s);
                s = n;
                v as u8
            })
            .collect()
    }

    fn cfg(method: SuperFeatureMethod) -> SuperFeatureConfig {
        SuperFeatureConfig {
            method,
            ..SuperFeatureConfig::default()
        }
    }

    fn shared(a: &[u64], b: &[u64]) -> usize {
        a.iter().zip(b).filter(|(x, y)| x == y).count()
    }

    #[test]
    fn the_vector_maxima_are_the_scalar_ones() {
        let hashes: Vec<u64> = noise(8 * 1000, 9)
            .chunks(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        for f in 1..=MAX_FEATURES {
            for n in [0, 1, 2, 37, 1000] {
                let mut scalar = [0u64; MAX_FEATURES];
                hashes[..n]
                    .iter()
                    .for_each(|&h| transform_max(h, &mut scalar[..f]));
                let mut any = [0u64; MAX_FEATURES];
                assert_eq!(
                    max_of_transforms(hashes[..n].iter().copied(), f, &mut any),
                    n > 0
                );
                assert_eq!(any[..f], scalar[..f], "{f} features, {n} hashes");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if wide::available() {
            let mut wide = [0u64; MAX_FEATURES];
            let mut scalar = [0u64; MAX_FEATURES];
            hashes
                .iter()
                .for_each(|&h| transform_max(h, &mut scalar[..WIDE_FEATURES]));
            // SAFETY: checked just above.
            assert!(unsafe { wide::max_of_transforms(hashes.iter().copied(), &mut wide) });
            assert_eq!(wide, scalar);
        }
    }

    #[test]
    fn frozen_tables() {
        assert_eq!(GEAR[0], 0x77192f085cb6c296);
        assert_eq!(GEAR[255], 0x76c504f4e148dd5a);
        assert_eq!(ODESS_MUL[0], 0xb22382e63b517d55);
        assert_eq!(ODESS_ADD[MAX_FEATURES - 1], 0x7321b8b8900305cd);
        assert!(ODESS_MUL.iter().all(|m| m & 1 == 1));
        assert_eq!(ODESS_SAMPLE_MASK.count_ones(), 7);
    }

    #[test]
    fn validates_config() {
        assert!(SuperFeatureConfig::default().validate().is_ok());
        let bad = |features, per| SuperFeatureConfig {
            method: SuperFeatureMethod::Odess,
            features,
            per_super_feature: per,
        };
        assert!(bad(12, 5).validate().is_err());
        assert!(bad(0, 1).validate().is_err());
        assert!(bad(12, 0).validate().is_err());
        assert!(bad(MAX_FEATURES + 1, 1).validate().is_err());
        assert!(bad(MAX_FEATURES, MAX_FEATURES).validate().is_ok());
        assert_eq!(bad(12, 3).super_feature_count(), 4);
    }

    #[test]
    #[should_panic(expected = "multiple")]
    fn invalid_config_panics() {
        SuperFeatureConfig {
            method: SuperFeatureMethod::Finesse,
            features: 12,
            per_super_feature: 5,
        }
        .super_features(b"abc");
    }

    #[test]
    fn counts_and_determinism() {
        for method in [SuperFeatureMethod::Odess, SuperFeatureMethod::Finesse] {
            let c = cfg(method);
            for len in [0usize, 1, 5, 11, 12, 13, 100, 127, 128, 129, 1000, 8192] {
                let data = noise(len, len as u64);
                let a = c.super_features(&data);
                assert_eq!(a.len(), 3, "{method:?} {len}");
                assert_eq!(a, c.super_features(&data));
            }
        }
    }

    #[test]
    fn short_chunks_are_not_all_alike() {
        for method in [SuperFeatureMethod::Odess, SuperFeatureMethod::Finesse] {
            let c = cfg(method);
            let a = c.super_features(b"a short chunk of text");
            let b = c.super_features(b"another short chunk!!");
            assert_eq!(shared(&a, &b), 0, "{method:?}");
        }
    }

    #[test]
    fn near_duplicates_share_unrelated_do_not() {
        for method in [SuperFeatureMethod::Odess, SuperFeatureMethod::Finesse] {
            let c = cfg(method);
            let mut total = 0;
            for seed in 0..20u64 {
                let base = noise(8192, seed);
                let mut edited = base.clone();
                // A few in-place byte edits.
                edited[1000] ^= 0x55;
                edited[5000] ^= 0x55;
                let a = c.super_features(&base);
                let b = c.super_features(&edited);
                total += shared(&a, &b);
                let other = c.super_features(&noise(8192, seed + 1000));
                assert_eq!(shared(&a, &other), 0, "{method:?}");
            }
            // Most super-features survive two byte edits.
            assert!(total >= 30, "{method:?}: {total}/60 shared");
        }
    }

    #[test]
    fn odess_survives_insertions() {
        let c = cfg(SuperFeatureMethod::Odess);
        let mut total = 0;
        for seed in 0..20u64 {
            let base = noise(8192, seed);
            let mut edited = base.clone();
            edited.splice(3000..3000, *b"inserted");
            total += shared(&c.super_features(&base), &c.super_features(&edited));
        }
        assert!(total >= 30, "{total}/60 shared");
    }

    /// All prefix Gear hashes of `chunk`, computed one byte at a time.
    fn gear_hashes(chunk: &[u8]) -> Vec<u64> {
        let mut h = 0u64;
        chunk
            .iter()
            .map(|&b| {
                h = (h << 1).wrapping_add(GEAR[b as usize]);
                h
            })
            .collect()
    }

    #[test]
    fn features_match_naive_definitions() {
        for len in [0usize, 1, 7, 12, 13, 25, 100, 1000, 4097] {
            let data = noise(len, 7 + len as u64);
            let hs = gear_hashes(&data);
            // Finesse: max over each equal sub-chunk.
            let fin = cfg(SuperFeatureMethod::Finesse).raw_features(&data);
            for (i, &f) in fin.iter().enumerate() {
                let (a, b) = (len * i / 12, len * (i + 1) / 12);
                assert_eq!(f, hs[a..b].iter().copied().max().unwrap_or(0), "{len} {i}");
            }
            // Odess: max of transforms over sampled positions, or all when none is sampled.
            let sampled: Vec<u64> = hs
                .iter()
                .copied()
                .filter(|h| h & ODESS_SAMPLE_MASK == 0)
                .collect();
            let positions = if sampled.is_empty() { hs } else { sampled };
            let ode = cfg(SuperFeatureMethod::Odess).raw_features(&data);
            for (i, &f) in ode.iter().enumerate() {
                let want = positions
                    .iter()
                    .map(|h| h.wrapping_mul(ODESS_MUL[i]).wrapping_add(ODESS_ADD[i]))
                    .max()
                    .unwrap_or(0);
                assert_eq!(f, want, "{len} {i}");
            }
            let sf = cfg(SuperFeatureMethod::Odess).super_features(&data);
            assert_eq!(sf[1], hash_group(ode[4..8].iter().copied(), 1));
        }
    }

    #[test]
    fn two_lanes_sample_what_one_scan_does() {
        let one_way = |data: &[u8], two: bool| {
            let mut maxima = [0u64; MAX_FEATURES];
            let mut samples = Samples::new(12, &mut maxima);
            let any = if two {
                odess_two_lanes(data, &mut samples)
            } else {
                odess_sampled(data, 0, &mut samples)
            };
            samples.flush();
            (any, maxima)
        };
        let lens = (ODESS_TWO_LANES_FROM..ODESS_TWO_LANES_FROM + 300).chain([4096, 8191, 65_537]);
        for len in lens {
            let data = noise(len, 11 + len as u64);
            assert_eq!(one_way(&data, false), one_way(&data, true), "{len}");
        }
        let zeros = vec![0u8; 1000];
        assert_eq!(one_way(&zeros, false), one_way(&zeros, true));
    }

    /// Frozen vectors: a change that moves these changes every stored super-feature.
    #[test]
    fn features_from_samples_are_those_of_the_same_sampled_positions() {
        let c = cfg(SuperFeatureMethod::Odess);
        let chunk = noise(8192, 3);
        let sampled: Vec<u64> = gear_hashes(&chunk)
            .into_iter()
            .filter(|h| h & ODESS_SAMPLE_MASK == 0)
            .collect();
        assert!(!sampled.is_empty());
        let mut out = vec![7];
        assert!(c.odess_from_samples(sampled.iter().rev().copied(), &mut out));
        assert_eq!(out, c.super_features(&chunk));
        assert!(!c.odess_from_samples([], &mut out));
        assert!(out.is_empty());
        let finesse = cfg(SuperFeatureMethod::Finesse);
        assert!(!finesse.odess_from_samples(sampled, &mut out));
    }

    #[test]
    fn golden_vectors() {
        let text = b"The quick brown fox jumps over the lazy dog. ".repeat(100);
        let inputs: [&[u8]; 4] = [b"", b"dedupwire", &noise(4096, 42), &text];
        let mut got = Vec::new();
        for method in [SuperFeatureMethod::Odess, SuperFeatureMethod::Finesse] {
            for input in inputs {
                got.push(cfg(method).super_features(input));
            }
        }
        let want: Vec<Vec<u64>> = vec![
            // Odess: empty, "dedupwire", 4 KiB noise, repeated text.
            vec![0xa057271c9071c99d, 0x4938b7eb4d3e837f, 0xa86aae291c71c760],
            vec![0xe28b5a3b5c9f4997, 0xb99b01fdd50bb005, 0xba8232f58dd70e26],
            vec![0xb90bf2cc75ab0e06, 0x3c93077c2d0ba73d, 0xcec660b2bd94692b],
            vec![0xd6895904b7de16a5, 0x34442d41209b23aa, 0x5788c02684cb73f9],
            // Finesse: the same inputs.
            vec![0xa057271c9071c99d, 0x4938b7eb4d3e837f, 0xa86aae291c71c760],
            vec![0xfaa9dd34fa8e976c, 0xb74399306adf2132, 0x25a713f567c8db5e],
            vec![0xfa8d31203b14b9a6, 0x770c1f112a0a4949, 0x43479f6a1f5169e8],
            vec![0x82e801270cd584f2, 0x20ac3e6cd6b34c53, 0x70a7cb68e849c94d],
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn finesse_groups_by_rank() {
        let mut f: Vec<u64> = (0..12).rev().collect();
        let mut out = Vec::new();
        group_by_rank(&mut f, 4, &mut out);
        // Groups of 3 sorted: [9,10,11] [6,7,8] [3,4,5] [0,1,2]; SF0 = (9,6,3,0).
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], hash_group([9u64, 6, 3, 0].into_iter(), 0));
        assert_eq!(out[2], hash_group([11u64, 8, 5, 2].into_iter(), 2));
    }
}
