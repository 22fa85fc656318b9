//! The dedupwire engine: the pure, I/O-free pieces every front door is built from.
//!
//! Data flows one way: **bytes → chunks → fingerprints → (known? reference : similar? delta :
//! literal) → compressed frame**, and back through the exact inverse. Each stage is its own
//! module so that the channel, replication, backup and analysis front doors compose the same
//! parts instead of re-implementing them:
//!
//! - [`chunk`]: whole-stream, fixed-size and FastCDC-2020 content-defined chunkers, over slices
//!   and over any [`std::io::Read`] with identical boundaries;
//! - [`fingerprint`]: BLAKE3 (optionally keyed) chunk identity and xxh3 feature hashes;
//! - [`similarity`]: sDedup top-K sketches, Finesse/Odess super-features and an in-memory
//!   candidate lookup with sDedup's source scoring;
//! - [`delta`]: our sampled-index copy/insert codec and a zstd reference-prefix codec;
//! - [`compress`]: zstd and lz4 over residual bytes, per batch;
//! - [`exact_index`]: the in-memory fingerprint → location index;
//! - [`pipeline`]: a self-contained encoded form for a sequence of items, and its decoder.
//!
//! The words used throughout (chunk, fingerprint, feature, super-feature, source, delta,
//! frame) are defined in `docs/glossary.md`.
#![deny(missing_docs)]

pub mod chunk;
pub mod compress;
pub mod delta;
mod error;
pub mod exact_index;
pub mod fingerprint;
mod hint;
pub mod pipeline;
pub mod similarity;
pub mod varint;

pub use error::{Error, Result};
