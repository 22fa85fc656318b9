//! Our xdelta-style codec (pending).

use super::DeltaCodec;
use crate::Result;

/// Sampled source index, forward/backward match extension, copy/insert instructions.
#[derive(Debug, Clone, Default)]
pub struct Sampled {}

impl DeltaCodec for Sampled {
    fn encode(&self, source: &[u8], target: &[u8], out: &mut Vec<u8>) {
        let _ = (source, target, out);
        todo!()
    }
    fn decode(&self, source: &[u8], delta: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<()> {
        let _ = (source, delta, limit, out);
        todo!()
    }
}
