//! Delta encoding: a target expressed as copies from one source plus inserted bytes.
//!
//! Two codecs behind one trait, chosen by [`DeltaSpec`]:
//! - [`Sampled`]: ours, xdelta-style (sampled source index, forward/backward match extension,
//!   copy/insert instructions);
//! - [`ZstdRef`]: zstd with the source as a reference prefix (`--patch-from`).
//!
//! Decoders take untrusted bytes: a malformed delta (out-of-range copy, truncation, trailing
//! bytes, output over the caller's limit) is an [`crate::Error::Corrupt`], never a panic, and
//! nothing is allocated from an untrusted length beyond the caller's `limit`. Both formats
//! start with the target length (a varint); the modules document the rest.
//!
//! Which to use ([`DeltaSpec::Sampled`] is the default): [`Sampled`] wherever deltas are then
//! compressed in batches (documents, chunks, files in a pack). Its copy/insert stream keeps
//! inserted bytes in the clear, so the batch compressor still finds what they share, while
//! [`ZstdRef`]'s output is already entropy-coded and barely shrinks: batch-compressed with
//! zstd -3, document revision deltas come out 1.3-1.6x smaller than with [`ZstdRef`] level 3
//! (1.1-1.5x than level 19). It also encodes 1.3-1.8x faster than level 3 (0.9-3 GB/s) and
//! decodes 1.8-3.7x faster (8-50 GB/s: copies are `memcpy`). [`ZstdRef`] makes deltas
//! 1.05-2x smaller per item, so it is the choice for a delta stored alone without further
//! compression; level 19 is slow (4-25 MB/s). Numbers and the command that measures them:
//! `dedupwire-bench delta`.

pub mod sampled;
pub mod zstd_ref;

pub use self::sampled::{Sampled, WINDOWS};
pub use self::zstd_ref::ZstdRef;

use serde::{Deserialize, Serialize};

use crate::Result;

/// Encodes a target against a source and decodes it back.
pub trait DeltaCodec: Send + Sync {
    /// Appends the delta of `target` against `source` to `out`.
    fn encode(&self, source: &[u8], target: &[u8], out: &mut Vec<u8>);
    /// Appends the target rebuilt from `source` and `delta` to `out`; fails if the delta is
    /// malformed or would produce more than `limit` bytes.
    fn decode(&self, source: &[u8], delta: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<()>;
}

/// A delta codec's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeltaSpec {
    /// Our sampled-index copy/insert codec.
    Sampled,
    /// zstd with the source as reference prefix, at `level`.
    ZstdRef {
        /// zstd level.
        level: i32,
    },
}

impl DeltaSpec {
    /// Builds the codec.
    pub fn build(&self) -> Box<dyn DeltaCodec> {
        match *self {
            DeltaSpec::Sampled => Box::new(Sampled::default()),
            DeltaSpec::ZstdRef { level } => Box::new(ZstdRef::new(level)),
        }
    }
}
