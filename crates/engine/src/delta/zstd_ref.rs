//! zstd reference-prefix codec (pending).

use super::DeltaCodec;
use crate::Result;

/// zstd with the source as a reference prefix.
#[derive(Debug, Clone)]
pub struct ZstdRef {
    level: i32,
}

impl ZstdRef {
    /// A codec compressing at `level`.
    pub fn new(level: i32) -> Self {
        ZstdRef { level }
    }
}

impl DeltaCodec for ZstdRef {
    fn encode(&self, source: &[u8], target: &[u8], out: &mut Vec<u8>) {
        let _ = (source, target, out, self.level);
        todo!()
    }
    fn decode(&self, source: &[u8], delta: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<()> {
        let _ = (source, delta, limit, out);
        todo!()
    }
}
