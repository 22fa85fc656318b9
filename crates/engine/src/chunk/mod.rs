//! Chunkers: split bytes into chunks, the unit of exact deduplication.
//!
//! Every chunker answers one question, [`Chunker::cut`]: how long is the first chunk of this
//! buffer? A cut depends only on the bytes in `[0, max_len)` of the buffer, so the
//! [`StreamChunker`] over any `Read` finds exactly the boundaries that [`chunks`] finds over
//! the same bytes in one slice.

mod fastcdc;
mod fixed;
mod stream;

pub(crate) use self::fastcdc::shifted4;
pub use self::fastcdc::FastCdc;
pub use self::fixed::{Fixed, Whole};
pub use self::stream::StreamChunker;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Smallest average chunk size a content-defined chunker accepts.
pub const MIN_AVG_SIZE: usize = 64;
/// Largest average chunk size a content-defined chunker accepts.
pub const MAX_AVG_SIZE: usize = 8 << 20;

/// Splits a byte buffer into chunks, one cut at a time.
pub trait Chunker: Send + Sync {
    /// Length of the first chunk of `data`: in `1..=data.len()` for non-empty `data`.
    ///
    /// `data` must hold at least [`Chunker::max_len`] bytes unless it is the end of the
    /// stream; the answer then depends only on those first `max_len` bytes.
    fn cut(&self, data: &[u8]) -> usize;
    /// The longest chunk this chunker emits (`usize::MAX` for whole-stream).
    fn max_len(&self) -> usize;
}

/// A chunker's configuration: what a handshake or a report names and a user chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ChunkerSpec {
    /// The whole stream (or item) is one chunk.
    Whole,
    /// Fixed-size chunks of `size` bytes.
    Fixed {
        /// Chunk size in bytes.
        size: usize,
    },
    /// FastCDC-2020 content-defined chunks.
    Cdc {
        /// Minimum chunk size in bytes.
        min: usize,
        /// Target average chunk size in bytes (a power of two).
        avg: usize,
        /// Maximum chunk size in bytes.
        max: usize,
    },
}

impl ChunkerSpec {
    /// FastCDC with the customary min = avg/4 and max = avg*4.
    pub fn cdc(avg: usize) -> Self {
        ChunkerSpec::Cdc {
            min: avg / 4,
            avg,
            max: avg * 4,
        }
    }

    /// Checks the parameters and builds the chunker.
    pub fn build(&self) -> Result<Box<dyn Chunker>> {
        Ok(match *self {
            ChunkerSpec::Whole => Box::new(Whole),
            ChunkerSpec::Fixed { size } => Box::new(Fixed::new(size)?),
            ChunkerSpec::Cdc { min, avg, max } => Box::new(FastCdc::new(min, avg, max)?),
        })
    }

    /// A short label for reports, e.g. `cdc-8KiB`, `fixed-4KiB`, `whole`.
    pub fn label(&self) -> String {
        match *self {
            ChunkerSpec::Whole => "whole".into(),
            ChunkerSpec::Fixed { size } => format!("fixed-{}", size_label(size)),
            ChunkerSpec::Cdc { avg, .. } => format!("cdc-{}", size_label(avg)),
        }
    }
}

/// Formats a byte size as `256B`, `4KiB`, `2MiB` when it divides evenly.
pub fn size_label(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n}B")
    }
}

/// Iterates over the chunks of `data` as sub-slices.
pub fn chunks<'a>(chunker: &'a dyn Chunker, data: &'a [u8]) -> Chunks<'a> {
    Chunks { chunker, data }
}

/// Iterator returned by [`chunks`].
pub struct Chunks<'a> {
    chunker: &'a dyn Chunker,
    data: &'a [u8],
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.data.is_empty() {
            return None;
        }
        let n = self.chunker.cut(self.data);
        debug_assert!(n >= 1 && n <= self.data.len());
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        Some(head)
    }
}

pub(crate) fn config_error(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}
