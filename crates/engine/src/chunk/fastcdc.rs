//! FastCDC-2020: Gear rolling hash, normalized chunking, two bytes per step.
//! (Owned by the chunking work: implementation pending.)

use super::Chunker;
use crate::Result;

/// FastCDC-2020 content-defined chunker with normalized chunking.
#[derive(Debug, Clone)]
pub struct FastCdc {
    min: usize,
    avg: usize,
    max: usize,
}

impl FastCdc {
    /// A chunker with the given sizes: `MIN_AVG_SIZE <= avg <= MAX_AVG_SIZE`, `min <= avg <= max`.
    pub fn new(min: usize, avg: usize, max: usize) -> Result<Self> {
        let _ = (min, avg, max);
        todo!()
    }
}

impl Chunker for FastCdc {
    fn cut(&self, data: &[u8]) -> usize {
        let _ = (data, self.min, self.avg);
        todo!()
    }
    fn max_len(&self) -> usize {
        self.max
    }
}
