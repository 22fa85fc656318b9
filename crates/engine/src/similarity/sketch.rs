//! sDedup sketches: the top-K chunk hashes of a document (sDedup §3.1).
//! (Owned by the similarity work: implementation pending.)

use serde::{Deserialize, Serialize};

/// How sketches are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SketchConfig {
    /// Number of features kept per document (sDedup: 8).
    pub k: usize,
    /// Average CDC chunk size used only to compute the sketch (sDedup: 64 B – 1 KiB).
    pub chunk_avg: usize,
}

impl Default for SketchConfig {
    fn default() -> Self {
        SketchConfig {
            k: 8,
            chunk_avg: 256,
        }
    }
}

impl SketchConfig {
    /// The sketch of `data`: up to `k` distinct features, largest first.
    pub fn sketch(&self, data: &[u8]) -> Vec<u64> {
        let _ = data;
        todo!()
    }
}
