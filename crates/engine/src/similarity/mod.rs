//! Similarity: finding a delta source for data that is not an exact duplicate.
//!
//! Two families, both needed:
//! - [`SketchConfig`]: sDedup's sketch, the K largest hashes of a document's small chunks,
//!   for whole documents (a revision shares most of its chunks with the previous one);
//! - [`SuperFeatureConfig`]: Finesse/Odess super-features per chunk, for near-duplicate chunks
//!   inside files and images (Neptune).
//!
//! Both produce `u64` features; [`CandidateIndex`] finds items that share features with a
//! new one, and [`select_source`] ranks them as sDedup does.

mod candidates;
mod sketch;
mod superfeature;

pub use self::candidates::{select_source, Candidate, CandidateIndex, CACHE_REWARD};
pub use self::sketch::{SketchConfig, MAX_SKETCH_K};
pub use self::superfeature::{
    SuperFeatureConfig, SuperFeatureMethod, MAX_FEATURES, ODESS_SAMPLE_MASK,
};
