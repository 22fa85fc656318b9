//! Chunking pieces of items as they arrive, with the same cuts as chunking each whole item.

use dedupwire_engine::chunk::Chunker;

/// Carries an item's unchunked tail from one piece to the next.
pub struct PushChunker {
    chunker: Box<dyn Chunker>,
    carry: Vec<u8>,
}

impl PushChunker {
    /// Wraps `chunker`.
    pub fn new(chunker: Box<dyn Chunker>) -> Self {
        PushChunker {
            chunker,
            carry: Vec::new(),
        }
    }

    /// Feeds the next piece of the current item; calls `f` for every chunk completed.
    pub fn push(&mut self, data: &[u8], item_end: bool, f: &mut impl FnMut(&[u8])) {
        let max = self.chunker.max_len();
        if self.carry.is_empty() {
            let rest = cut_all(self.chunker.as_ref(), data, item_end, max, f);
            self.carry.extend_from_slice(rest);
        } else {
            self.carry.extend_from_slice(data);
            let carry = std::mem::take(&mut self.carry);
            let rest = cut_all(self.chunker.as_ref(), &carry, item_end, max, f);
            self.carry.extend_from_slice(rest);
        }
    }
}

fn cut_all<'a>(
    chunker: &dyn Chunker,
    mut data: &'a [u8],
    item_end: bool,
    max: usize,
    f: &mut impl FnMut(&[u8]),
) -> &'a [u8] {
    while !data.is_empty() && (item_end || data.len() >= max) {
        let n = chunker.cut(data);
        f(&data[..n]);
        data = &data[n..];
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use dedupwire_engine::chunk::{chunks, ChunkerSpec};

    #[test]
    fn pieces_cut_like_the_whole_item() {
        let data: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for spec in [ChunkerSpec::Fixed { size: 1000 }, ChunkerSpec::cdc(1024)] {
            let whole: Vec<Vec<u8>> = chunks(spec.build().unwrap().as_ref(), &data)
                .map(<[u8]>::to_vec)
                .collect();
            let mut pc = PushChunker::new(spec.build().unwrap());
            let mut got = Vec::new();
            let mut at = 0;
            for step in [1usize, 7000, 33, 90_000, 5].iter().cycle() {
                let end = (at + step).min(data.len());
                pc.push(&data[at..end], end == data.len(), &mut |c| {
                    got.push(c.to_vec())
                });
                at = end;
                if at == data.len() {
                    break;
                }
            }
            assert_eq!(got, whole, "{spec:?}");
        }
    }
}
