//! Whole-stream and fixed-size chunkers.

use super::{config_error, Chunker};
use crate::Result;

/// The whole input is one chunk.
#[derive(Debug, Clone, Copy, Default)]
pub struct Whole;

impl Chunker for Whole {
    fn cut(&self, data: &[u8]) -> usize {
        data.len()
    }
    fn max_len(&self) -> usize {
        usize::MAX
    }
}

/// Chunks of exactly `size` bytes (the last may be shorter).
#[derive(Debug, Clone, Copy)]
pub struct Fixed {
    size: usize,
}

impl Fixed {
    /// A fixed-size chunker; `size` must be at least 1.
    pub fn new(size: usize) -> Result<Self> {
        if size == 0 {
            return Err(config_error("fixed chunk size must be at least 1 byte"));
        }
        Ok(Fixed { size })
    }
}

impl Chunker for Fixed {
    fn cut(&self, data: &[u8]) -> usize {
        data.len().min(self.size)
    }
    fn max_len(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::chunks;

    #[test]
    fn fixed_splits_evenly_with_short_tail() {
        let data = vec![7u8; 10];
        let c = Fixed::new(4).unwrap();
        let lens: Vec<usize> = chunks(&c, &data).map(<[u8]>::len).collect();
        assert_eq!(lens, [4, 4, 2]);
        assert!(Fixed::new(0).is_err());
    }

    #[test]
    fn whole_is_one_chunk() {
        let data = vec![1u8; 100];
        assert_eq!(chunks(&Whole, &data).count(), 1);
        assert_eq!(chunks(&Whole, &[]).count(), 0);
    }
}
