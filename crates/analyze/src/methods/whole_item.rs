//! Whole-item dedup: one id per item, without holding huge items in memory.

use std::sync::Arc;

use dedupwire_engine::compress::Compression;

use crate::input::{Batch, Piece};
use crate::memo::Memo;

use super::exact::SizeState;
use super::residual::{Bound, Residual};

/// Seeds the ids of items no other file has the size of (see [`WholeItem`]).
const UNIQUE_SIZE_SEED: u64 = 0x756e_6971_7565_5f73;

/// Items buffered whole until they end; larger ones stream (see [`WholeItem`]).
const WHOLE_BUFFER: usize = if cfg!(test) { 1 << 20 } else { 64 << 20 };

/// Whole-item chunking without holding huge items in memory: an item is buffered up to
/// [`WHOLE_BUFFER`]; past that it is hashed as it streams and its compression estimated on
/// its own, to be counted only if the item turns out to be new. That estimate cuts the item
/// where input batches start and samples the input batches every stream samples, so an
/// input batch the item fills is the very batch compression alone compresses, and the memo
/// compresses it once (a tar image is one item: cut at its own 4 MiB, it was compressed
/// apart, 0.3 CPU-s on the five Debian images, and estimated from other batches). An item
/// whose size no other file has is new without being hashed (as duplicate finders such as
/// `fdupes` do), which spares hashing most bytes of inputs made of large files.
pub(super) struct WholeItem {
    hasher: crate::hash::Xxh3,
    /// Items ended so far.
    items: u64,
    /// Stream position after the bytes pushed so far.
    pub(super) pos: u64,
    /// Bytes of the current item so far.
    len: u64,
    /// The input batch being pushed, its stream position and its length.
    seq: u64,
    batch_at: u64,
    batch_len: u64,
    /// While the current item is buffered, the input batches its bytes lie in: where each
    /// starts in the item (the first at the item's start), its number, and its length if
    /// it starts there too.
    starts: Vec<Bound>,
    /// The current item's pieces so far while it is buffered (all its `len` bytes): held in
    /// their batches, not copied (copying them was 1.3% of the CPU of the Debian trees'
    /// analysis, whose equal files span batches in every snapshot).
    parts: Vec<(Arc<Batch>, std::ops::Range<usize>)>,
    big: Option<Residual>,
    /// The current item is new for sure (no other file has its size): its bytes go straight
    /// to the scopes' streams as they come, neither buffered nor estimated apart.
    direct: bool,
    every: u64,
    on_top: Compression,
    memo: Memo,
}

impl WholeItem {
    /// A whole-item chunker whose big items sample one input batch in `every` and compress
    /// with `on_top`, sharing `memo`.
    pub(super) fn new(every: u64, on_top: Compression, memo: Memo) -> Self {
        WholeItem {
            hasher: crate::hash::Xxh3::default(),
            items: 0,
            pos: 0,
            len: 0,
            seq: 0,
            batch_at: 0,
            batch_len: 0,
            starts: Vec::new(),
            parts: Vec::new(),
            big: None,
            direct: false,
            every,
            on_top,
            memo,
        }
    }

    /// The id of the item `piece` ends: of its bytes, which are `whole` if it came in one
    /// piece and were hashed as they came otherwise.
    pub(super) fn id(&self, piece: Piece, whole: &[u8]) -> u64 {
        if piece.size_unique {
            // No other file has its size, so no other item equals it: any id of its own will
            // do, and the item's bytes need no hashing.
            crate::hash::xxh3_64_with_seed(&self.items.to_le_bytes(), UNIQUE_SIZE_SEED)
        } else if self.len == 0 {
            crate::hash::xxh3_64(whole)
        } else {
            self.hasher.digest()
        }
    }

    /// Stream position of the first byte not yet given to the scopes' streams.
    pub(super) fn pending_start(&self) -> u64 {
        if self.direct {
            self.pos
        } else {
            self.pos - self.len
        }
    }

    /// Says that input batch `seq`, `len` bytes, starts here.
    pub(super) fn begin_batch(&mut self, seq: u64, len: u64) {
        self.seq = seq;
        self.batch_at = self.pos;
        self.batch_len = len;
        if self.len > 0 && !self.direct {
            match &mut self.big {
                Some(big) => big.begin_input(self.pos, seq, len),
                None => self.starts.push(Bound {
                    at: self.pos,
                    seq,
                    len: Some(len),
                }),
            }
        }
    }

    /// Adds `piece` of `batch`.
    pub(super) fn push(&mut self, batch: &Arc<Batch>, piece: Piece, size: &mut SizeState) {
        let data = batch.bytes(&piece);
        if self.len == 0 && piece.item_end && data.len() <= WHOLE_BUFFER {
            // A whole item in one piece (most files of a tree): added from the batch, neither
            // copied nor hashed in pieces.
            self.items += 1;
            let id = self.id(piece, data);
            size.add(id, self.pos, data);
            self.pos += data.len() as u64;
            return;
        }
        if self.len == 0 {
            self.direct = piece.size_unique && size.local.sample == 1;
        }
        if self.direct {
            // (Buffering each tar image's first 64 MiB and estimating the rest apart was 1.5%
            // of the analysis' CPU on the five Debian images.)
            size.emit_new(self.pos, data);
            self.len += data.len() as u64;
            self.pos += data.len() as u64;
            if piece.item_end {
                self.items += 1;
                let id = self.id(piece, &[]);
                size.add_with(id, self.len, |_| {});
                self.len = 0;
                self.direct = false;
            }
            return;
        }
        if self.len == 0 {
            let len = (self.pos == self.batch_at).then_some(self.batch_len);
            let (at, seq) = (self.pos, self.seq);
            self.starts.push(Bound { at, seq, len });
        }
        if !piece.size_unique {
            self.hasher.update(data);
        }
        let at = self.pos;
        self.len += data.len() as u64;
        self.pos += data.len() as u64;
        match &mut self.big {
            Some(big) => big.push_at(at, data),
            None if self.len > WHOLE_BUFFER as u64 => {
                let mut big = Residual::new(self.every, self.on_top, &self.memo);
                self.starts.iter().for_each(|&b| big.begin_bound(b));
                self.starts.clear();
                push_parts(&mut big, self.pos - self.len, &self.parts);
                big.push_at(at, data);
                self.parts.clear();
                self.big = Some(big);
            }
            None => self.parts.push((Arc::clone(batch), piece.start..piece.end)),
        }
        if !piece.item_end {
            return;
        }
        self.items += 1;
        let id = self.id(piece, &[]);
        match self.big.take() {
            Some(mut big) => {
                big.flush();
                let alone = big.pairs.is_empty().then(|| big.estimate());
                size.add_streamed(id, self.len, &big, alone);
            }
            None => {
                let at = self.pos - self.len;
                let parts = &self.parts;
                size.add_with(id, self.len, |scope| {
                    push_parts(&mut scope.residual, at, parts)
                });
            }
        }
        self.hasher.reset();
        self.len = 0;
        self.starts.clear();
        self.parts.clear();
    }
}

/// Adds the bytes of `parts`, one after the other from stream position `at`, to `residual`.
pub(super) fn push_parts(
    residual: &mut Residual,
    at: u64,
    parts: &[(Arc<Batch>, std::ops::Range<usize>)],
) {
    let mut pos = at;
    for (batch, range) in parts {
        residual.push_at(pos, &batch.data[range.clone()]);
        pos += range.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{test_batches, BATCH_BYTES};
    use crate::methods::exact::ExactRunner;
    use crate::methods::tests::{nibbles, noise, opts, run};
    use crate::methods::{runners, Measured, MethodSpec, Runner, RunnerOptions, ALONE, REF_BYTES};
    use dedupwire_engine::chunk::ChunkerSpec;
    use dedupwire_engine::compress::Compressor;

    #[test]
    fn a_whole_item_in_one_piece_equals_one_cut_across_batches() {
        let (a, b) = (noise(700_000, 5), noise(200_000, 6));
        let filler = noise(500_000, 7);
        // The second copy of `a` spans the first batch's end (1 MiB), then the first does.
        for items in [
            vec![a.clone(), b.clone(), a.clone()],
            vec![filler.clone(), a.clone(), a.clone()],
        ] {
            let m = run(ChunkerSpec::Whole, &items);
            let unique = (items[0].len() + items[1].len()) as u64;
            assert_eq!(m[0].output_bytes, unique + 3 * REF_BYTES);
        }
    }

    #[test]
    fn whole_items_larger_than_the_buffer_stream_and_still_dedup() {
        let (a, b) = (noise(3 << 20, 1), noise(3 << 20, 2));
        let text: Vec<u8> = b"a compressible line of text\n"
            .repeat(100_000)
            .into_iter()
            .collect();
        let items = [a.clone(), text.clone(), a, b, text];
        let m = run(ChunkerSpec::Whole, &items);
        let plain = &m[0];
        let zstd = &m[1];
        assert_eq!(plain.scope, "local");
        assert_eq!(plain.output_bytes, (6 << 20) + 2_800_000 + 5 * REF_BYTES);
        assert!(
            zstd.output_bytes > 6 << 20 && zstd.output_bytes < (6 << 20) + 200_000,
            "{}",
            zstd.output_bytes
        );
    }

    #[test]
    fn items_no_other_file_has_the_size_of_count_as_new_without_hashing() {
        let (a, b, c) = (noise(3 << 20, 1), noise(5000, 2), noise(7000, 3));
        let items = [a.clone(), b.clone(), a, c, b];
        let whole = |unique: &dyn Fn(usize) -> bool| {
            let mut runner = ExactRunner::new(&[ChunkerSpec::Whole], &opts(), ALONE).unwrap();
            let mut item = 0;
            for mut batch in test_batches(&items, 1 << 20) {
                for p in &mut batch.pieces {
                    p.size_unique = unique(item);
                    item += p.item_end as usize;
                }
                runner.feed(&Arc::new(batch));
            }
            Box::new(runner).finish()[0].output_bytes
        };
        let hashed = whole(&|_| false);
        assert_eq!(hashed, (3 << 20) + 5000 + 7000 + 5 * REF_BYTES);
        // Only `c` has a size of its own: skipping its hash changes nothing.
        assert_eq!(whole(&|i| i == 3), hashed);
        // The flag is trusted: equal items falsely flagged are not compared.
        assert_eq!(whole(&|i| i == 1 || i == 4), hashed + 5000);
    }

    #[test]
    fn items_new_for_their_size_stream_straight_to_the_scopes_with_the_same_outcome() {
        // Larger than the buffer and not, starting mid-batch, crossing batches: given to the
        // scopes as they come, they compress as the buffered ones did.
        let text: Vec<u8> = b"a compressible line of text\n".repeat(100_000);
        let items = [
            noise(300_000, 1),
            noise(3 << 20, 2),
            text,
            nibbles(1_500_000, 3),
            noise(900_000, 4),
        ];
        let whole = |unique: bool| {
            let mut runner = ExactRunner::new(&[ChunkerSpec::Whole], &opts(), ALONE).unwrap();
            for mut batch in test_batches(&items, 1 << 20) {
                batch.pieces.iter_mut().for_each(|p| p.size_unique = unique);
                runner.feed(&Arc::new(batch));
            }
            let m = Box::new(runner).finish();
            (m[0].output_bytes, m[1].output_bytes)
        };
        let all: usize = items.iter().map(Vec::len).sum();
        let (buffered, direct) = (whole(false), whole(true));
        assert_eq!(buffered.0, all as u64 + 5 * REF_BYTES);
        assert_eq!(direct.0, buffered.0);
        // Everything is new, so the stream is the input, one frame per input batch, as the
        // pipeline would send it (the buffered items were cut apart from their neighbours).
        let mut z = Compressor::new(Compression::Zstd(3));
        let frames: usize = test_batches(&items, 1 << 20)
            .iter()
            .map(|b| z.compress(&b.data).len())
            .sum();
        assert_eq!(direct.1, frames as u64 + 5 * REF_BYTES);
        assert!(
            buffered.1.abs_diff(direct.1) * 100 < direct.1,
            "{buffered:?} {direct:?}"
        );
    }

    #[test]
    fn an_item_too_large_to_buffer_samples_the_input_batches_compression_alone_does() {
        // A short item, then one of nine batches: it starts inside the first batch and fills
        // the others, so those are the bytes compression alone compresses there.
        let big = nibbles(9 * BATCH_BYTES, 11);
        let items = [noise(100_000, 5), big];
        let run = |compress_every| {
            let opts = RunnerOptions {
                compress_every,
                ..opts()
            };
            let mut all = runners(
                &[
                    MethodSpec::Compress(Compression::Zstd(3)),
                    MethodSpec::Exact(ChunkerSpec::Whole),
                ],
                &opts,
            )
            .unwrap();
            for batch in test_batches(&items, BATCH_BYTES) {
                let batch = Arc::new(batch);
                all.iter_mut().for_each(|r| r.feed(&batch));
            }
            let m: Vec<Measured> = all.into_iter().flat_map(|r| r.finish()).collect();
            assert_eq!(m[3].name, "exact-whole+zstd");
            (m[3].output_bytes, opts.memo)
        };
        let (exact, _) = run(1);
        let (sampled, memo) = run(3);
        // Batches 1, 4 and 7 are sampled: compression alone's and the item's are the same
        // bytes there, compressed once. The short item's batch is estimated from the large
        // item's samples, which joined its stream, not compressed alone at the end.
        let mut zstd3: Vec<usize> = memo
            .entries()
            .into_iter()
            .filter(|&(m, _)| m == Compression::Zstd(3))
            .map(|(_, len)| len)
            .collect();
        zstd3.sort();
        assert_eq!(zstd3, [BATCH_BYTES; 3]);
        let dev = (sampled as f64 - exact as f64).abs() / exact as f64;
        assert!(dev < 0.01, "{sampled} against {exact}");
    }
}
