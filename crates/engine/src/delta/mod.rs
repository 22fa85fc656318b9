//! Delta encoding: a target expressed as copies from one source plus inserted bytes.
//!
//! Two codecs behind one trait, chosen by [`DeltaSpec`]:
//! - [`Sampled`]: ours, xdelta-style (sampled source index, forward/backward match extension,
//!   copy/insert instructions);
//! - [`ZstdRef`]: zstd with the source as a reference prefix (`--patch-from`).
//!
//! Decoders take untrusted bytes: a malformed delta (out-of-range copy, truncation, output
//! over the caller's limit) is an [`crate::Error::Corrupt`], never a panic.
//! (Owned by the delta work: implementation pending.)

mod sampled;
mod zstd_ref;

pub use self::sampled::Sampled;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
