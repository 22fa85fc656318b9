//! The encode/decode pipeline: a sequence of items in, a self-contained encoded stream out.
//!
//! Each item is cut into units by the configured chunker (`Whole` makes the item one unit,
//! as sDedup does for documents; CDC makes units of chunks, as Neptune does for files). Each
//! unit becomes one of:
//! - a **reference** to an identical earlier unit (exact index on BLAKE3 fingerprints);
//! - a **delta** against a similar earlier unit (sketch or super-feature candidates), when
//!   the delta is smaller than the unit;
//! - a **literal**.
//!
//! Units are gathered into **frames** (one per batch of items); a frame's instructions and
//! payload bytes are compressed together, because small items compress badly alone. Both sides
//! keep the same **window** of recent units (FIFO by bytes), so references never point at
//! something the decoder has dropped, and memory stays bounded on long streams.
//! The format is specified in `docs/format.md`.

mod decoder;
mod delta_share;
mod encoder;
mod format;
mod smaller_windows;
mod window;

pub use self::decoder::Decoder;
pub use self::encoder::{EncodeStats, Encoder, Prepared, PreparedUnits, UnitPrep};
pub use self::smaller_windows::{SmallerWindows, SMALLER};
pub use self::window::{SharedBytes, UnitStore};

use serde::{Deserialize, Serialize};

use crate::chunk::ChunkerSpec;
use crate::compress::Compression;
use crate::delta::DeltaSpec;
use crate::similarity::{SketchConfig, SuperFeatureConfig};
use crate::Result;

/// How the pipeline looks for a delta source for a unit that is not an exact duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Similarity {
    /// Exact deduplication only.
    None,
    /// sDedup sketches (best for whole documents).
    Sketch(SketchConfig),
    /// Super-features (best for chunks of files and images).
    SuperFeatures(SuperFeatureConfig),
}

/// Everything the encoder needs to know; the decoder learns what it needs from the stream.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PipelineConfig {
    /// How items are cut into units.
    pub chunker: ChunkerSpec,
    /// How delta sources are found.
    pub similarity: Similarity,
    /// The delta codec.
    pub delta: DeltaSpec,
    /// Compression of each frame's instructions and payload.
    pub compression: Compression,
    /// Bytes of recent units both sides keep for references and delta sources.
    pub window_bytes: u64,
    /// Most units kept per feature in the candidate index (sDedup's per-feature bound).
    pub max_per_feature: usize,
    /// Units this recent count as "cached" for sDedup's source scoring reward.
    pub cache_units: u64,
}

impl PipelineConfig {
    /// sDedup for document streams: whole documents, sketches, our delta, zstd per batch.
    pub fn documents() -> Self {
        PipelineConfig {
            chunker: ChunkerSpec::Whole,
            similarity: Similarity::Sketch(SketchConfig::default()),
            delta: DeltaSpec::Sampled,
            compression: Compression::Zstd(3),
            window_bytes: 1 << 30,
            max_per_feature: 64,
            cache_units: 2000,
        }
    }

    /// Neptune for files: 8 KiB CDC chunks, exact dedup, super-feature deltas, zstd per batch.
    pub fn files() -> Self {
        PipelineConfig {
            chunker: ChunkerSpec::cdc(8 << 10),
            similarity: Similarity::SuperFeatures(SuperFeatureConfig::default()),
            ..Self::documents()
        }
    }

    /// Exact deduplication only, with the given chunker.
    pub fn exact(chunker: ChunkerSpec) -> Self {
        PipelineConfig {
            chunker,
            similarity: Similarity::None,
            ..Self::documents()
        }
    }
}

/// Encodes `items` with `config` in frames of about `frame_bytes` input bytes each.
pub fn encode_all<'a>(
    config: PipelineConfig,
    items: impl IntoIterator<Item = &'a [u8]>,
    frame_bytes: usize,
) -> Result<Vec<u8>> {
    let mut enc = Encoder::new(config)?;
    let mut out = Vec::new();
    enc.write_header(&mut out);
    let mut batch: Vec<&[u8]> = Vec::new();
    let mut batch_len = 0;
    for item in items {
        batch_len += item.len();
        batch.push(item);
        if batch_len >= frame_bytes {
            enc.encode_frame(&batch, &mut out);
            batch.clear();
            batch_len = 0;
        }
    }
    if !batch.is_empty() {
        enc.encode_frame(&batch, &mut out);
    }
    Ok(out)
}

/// Decodes a whole stream made by [`encode_all`] (or an [`Encoder`]) back into its items.
pub fn decode_all(stream: &[u8]) -> Result<Vec<Vec<u8>>> {
    let (mut dec, mut pos) = Decoder::from_header(stream)?;
    let mut items = Vec::new();
    while pos < stream.len() {
        pos += dec.decode_frame(&stream[pos..], pos, &mut items)?;
    }
    Ok(items)
}
