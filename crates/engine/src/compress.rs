//! Compression of residual bytes (literals and delta instructions), per batch.
//!
//! Small items compress badly alone, so callers gather a batch (the pipeline, a frame, a pack)
//! and compress it once. zstd is the default; lz4 is for links where the CPU is the bottleneck.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A compression method and level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "level", rename_all = "snake_case")]
pub enum Compression {
    /// Bytes are stored as they are.
    None,
    /// zstd at the given level (1..=22, negative for the fast levels).
    Zstd(i32),
    /// lz4 block format (frame-less; the length is stored by the caller's format).
    Lz4,
}

impl Compression {
    /// The one-byte tag a format stores to name this method.
    pub fn tag(&self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zstd(_) => 1,
            Compression::Lz4 => 2,
        }
    }

    /// Compresses `data` and appends the result to `out`.
    pub fn compress_into(&self, data: &[u8], out: &mut Vec<u8>) {
        match *self {
            Compression::None => out.extend_from_slice(data),
            Compression::Zstd(level) => out.extend_from_slice(&zstd_once(level, data)),
            Compression::Lz4 => out.extend_from_slice(&lz4_flex::block::compress(data)),
        }
    }

    /// Compresses `data` into a new buffer.
    pub fn compress(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.compress_into(data, &mut out);
        out
    }

    /// Decompresses a buffer made by [`Compression::compress`] with method tag `tag`, whose
    /// original length is exactly `len` (stored by the caller's format, bounded by it).
    pub fn decompress(tag: u8, data: &[u8], len: usize) -> Result<Vec<u8>> {
        let out = match tag {
            0 => data.to_vec(),
            1 => zstd::bulk::decompress(data, len)
                .map_err(|e| Error::corrupt("zstd block", 0, e.to_string()))?,
            2 => lz4_flex::block::decompress(data, len)
                .map_err(|e| Error::corrupt("lz4 block", 0, e.to_string()))?,
            t => {
                return Err(Error::corrupt(
                    "compressed block",
                    0,
                    format!("unknown method tag {t}"),
                ))
            }
        };
        if out.len() != len {
            return Err(Error::corrupt(
                "compressed block",
                0,
                format!("decompressed to {} bytes, expected {len}", out.len()),
            ));
        }
        Ok(out)
    }
}

thread_local! {
    /// This thread's zstd context for one-shot calls ([`Compression::compress`]): building
    /// one and zeroing its tables per call was a tenth of a send of many small files.
    static ZSTD: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
}

/// `data` as one zstd frame at `level`, with this thread's context.
fn zstd_once(level: i32, data: &[u8]) -> Vec<u8> {
    const CHECKED: &str = "levels are checked when parsed";
    ZSTD.with(|slot| match slot.try_borrow_mut() {
        Ok(mut slot) => {
            let z = match slot.as_mut() {
                Some(z) => {
                    z.set_compression_level(level).expect(CHECKED);
                    z
                }
                None => slot.insert(zstd::bulk::Compressor::new(level).expect(CHECKED)),
            };
            z.compress(data).expect("a Vec output grows as needed")
        }
        // Only reachable from within a compression on this thread, which never compresses.
        Err(_) => zstd::bulk::compress(data, level).expect(CHECKED),
    })
}

/// A compressor that keeps its zstd context between calls: for per-batch compression in a
/// loop, where building a context (and zeroing its tables) each time would cost more than a
/// small batch's compression.
pub struct Compressor {
    method: Compression,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

impl Compressor {
    /// A compressor for `method`.
    pub fn new(method: Compression) -> Self {
        let zstd = match method {
            Compression::Zstd(level) => {
                Some(zstd::bulk::Compressor::new(level).expect("levels are checked when parsed"))
            }
            _ => None,
        };
        Compressor { method, zstd }
    }

    /// The method this compressor applies.
    pub fn method(&self) -> Compression {
        self.method
    }

    /// Switches a zstd compressor to `level` (the decoder needs no level, so a stream may
    /// change it between batches); other methods have no level and ignore it.
    pub fn set_zstd_level(&mut self, level: i32) {
        if let Some(z) = &mut self.zstd {
            if self.method != Compression::Zstd(level) {
                z.set_compression_level(level)
                    .expect("zstd accepts every level from its minimum to 22");
                self.method = Compression::Zstd(level);
            }
        }
    }

    /// Compresses `data` into `out` (cleared first, its allocation reused) and returns the
    /// compressed length: for callers that compress many batches and keep only the sizes.
    pub fn compress_reusing(&mut self, data: &[u8], out: &mut Vec<u8>) -> usize {
        out.clear();
        match &mut self.zstd {
            Some(z) => {
                out.reserve(zstd::zstd_safe::compress_bound(data.len()));
                z.compress_to_buffer(data, out)
                    .expect("the buffer holds the compress bound")
            }
            None => {
                self.method.compress_into(data, out);
                out.len()
            }
        }
    }

    /// Compresses `data` into a new buffer, as [`Compression::compress`] would.
    pub fn compress(&mut self, data: &[u8]) -> Vec<u8> {
        match &mut self.zstd {
            Some(z) => z.compress(data).expect("a Vec output grows as needed"),
            None => self.method.compress(data),
        }
    }
}

impl fmt::Debug for Compressor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compressor")
            .field("method", &self.method)
            .finish()
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd(l) => write!(f, "zstd-{l}"),
            Compression::Lz4 => f.write_str("lz4"),
        }
    }
}

impl FromStr for Compression {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(3)),
            _ => s
                .strip_prefix("zstd-")
                .and_then(|l| l.parse().ok())
                .filter(|l| (-7..=22).contains(l))
                .map(Compression::Zstd)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "unknown compression {s:?}: use none, lz4, zstd or zstd-LEVEL (-7..=22)"
                    ))
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_shot_calls_at_changing_levels_match_a_fresh_context() {
        let data: Vec<u8> = (0..200_000u32)
            .map(|i| (i * 7 % 253) as u8 ^ (i >> 9) as u8)
            .collect();
        for level in [19, 1, -5, 3, 19] {
            let fresh = zstd::bulk::compress(&data, level).unwrap();
            assert_eq!(
                Compression::Zstd(level).compress(&data),
                fresh,
                "level {level}"
            );
        }
    }

    proptest! {
        #[test]
        fn round_trip(data in proptest::collection::vec(any::<u8>(), 0..5000), which in 0..3u8) {
            let c = [Compression::None, Compression::Zstd(3), Compression::Lz4][which as usize];
            let z = c.compress(&data);
            prop_assert_eq!(Compression::decompress(c.tag(), &z, data.len()).unwrap(), data);
        }
    }

    #[test]
    fn rejects_corrupt_and_wrong_length() {
        let data = b"hello hello hello hello hello".repeat(10);
        for c in [Compression::Zstd(3), Compression::Lz4] {
            let z = c.compress(&data);
            assert!(Compression::decompress(c.tag(), &z, data.len() - 1).is_err());
            assert!(Compression::decompress(c.tag(), &z[..z.len() / 2], data.len()).is_err());
        }
        assert!(Compression::decompress(9, b"", 0).is_err());
    }

    #[test]
    fn reused_compressor_matches_one_shot() {
        let data = b"abcabcabc some text some text".repeat(100);
        for m in [Compression::None, Compression::Zstd(3), Compression::Lz4] {
            let mut c = Compressor::new(m);
            for _ in 0..3 {
                let z = c.compress(&data);
                assert_eq!(
                    Compression::decompress(m.tag(), &z, data.len()).unwrap(),
                    data
                );
            }
        }
    }

    #[test]
    fn a_level_change_keeps_the_stream_decodable() {
        let data = b"level after level, the same decoder reads it all. ".repeat(2000);
        let mut c = Compressor::new(Compression::Zstd(3));
        let mut sizes = Vec::new();
        for level in [3, -7, 1, 19] {
            c.set_zstd_level(level);
            assert_eq!(c.method(), Compression::Zstd(level));
            let z = c.compress(&data);
            sizes.push(z.len());
            assert_eq!(Compression::decompress(1, &z, data.len()).unwrap(), data);
        }
        assert!(sizes[1] > sizes[3], "-7 packs less than 19: {sizes:?}");
        let mut l = Compressor::new(Compression::Lz4);
        l.set_zstd_level(1);
        assert_eq!(l.method(), Compression::Lz4);
    }

    #[test]
    fn parses_names() {
        assert_eq!(
            "zstd-19".parse::<Compression>().unwrap(),
            Compression::Zstd(19)
        );
        assert_eq!("lz4".parse::<Compression>().unwrap(), Compression::Lz4);
        assert!("zstd-99".parse::<Compression>().is_err());
    }
}
