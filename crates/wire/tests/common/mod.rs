//! Helpers the channel's test binaries share: test data and configurations.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use dedupwire_wire::{ChannelConfig, Key, Security};

/// Pseudo-random bytes (xorshift from `seed`): nothing for dedup or zstd to find.
pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Text-like bytes: words from a small vocabulary, so zstd and CDC both have something to do.
pub fn structured(n: usize, seed: u64) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "def ", "return ", "self", ".value", " = ", "(x)", "\n    ", "import ", "django", "model",
        ":\n", "# note ",
    ];
    let r = random(n, seed);
    let mut out = Vec::with_capacity(n + 16);
    let mut i = 0;
    while out.len() < n {
        out.extend_from_slice(WORDS[r[i % r.len()] as usize % WORDS.len()].as_bytes());
        if r[(i * 7) % r.len()] < 8 {
            out.extend_from_slice(format!("{i}").as_bytes());
        }
        i += 1;
    }
    out.truncate(n);
    out
}

/// `c` with 256 KiB segments, so a few MiB make many segments.
pub fn small_segments(mut c: ChannelConfig) -> ChannelConfig {
    c.segment_size = 256 << 10;
    c
}

/// The key both ends of the encrypted tests share.
pub fn keyed() -> Security {
    Security::Key(Key::from_token("the channel tests' shared passphrase"))
}
