//! Chunking over any `Read`, with the same boundaries as over one slice.
//!
//! A [`Chunker::cut`] depends only on the first `max_len` bytes of its input, so the stream
//! chunker keeps at least `max_len` bytes buffered (or everything up to the end of the
//! stream) before each cut, and finds exactly the chunks [`chunks`](super::chunks) finds over
//! the whole stream in one slice.

use std::io::{ErrorKind, Read};

use super::Chunker;
use crate::Result;

/// Smallest amount the buffer holds beyond `max_len`, so that refills are large reads and
/// compaction (moving the unconsumed tail to the front) copies little per byte read.
const MIN_SLACK: usize = 64 << 10;
/// Largest slack: beyond this, bigger reads buy nothing.
const MAX_SLACK: usize = 4 << 20;

/// Yields chunks from a reader, buffering at most `max_len` plus one read block.
///
/// The buffer is allocated once (growing geometrically up to `max_len` plus a read block as
/// the stream turns out to need it) and reused: consumed bytes are dropped by moving the
/// unconsumed tail to the front when the buffer end is reached. A whole-stream chunker
/// (`max_len == usize::MAX`) reads the entire stream into memory.
pub struct StreamChunker<'c, R> {
    chunker: &'c dyn Chunker,
    reader: R,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    start: usize,
    /// End of the bytes read into `buf`.
    end: usize,
    /// Largest buffer this chunker needs: `max_len` plus the slack.
    cap: usize,
    /// The reader has returned end of stream.
    eof: bool,
    /// Stream offset of `buf[start]`.
    offset: u64,
}

impl<'c, R: Read> StreamChunker<'c, R> {
    /// Chunks `reader` with `chunker`.
    pub fn new(chunker: &'c dyn Chunker, reader: R) -> Self {
        let max = chunker.max_len();
        let slack = max.clamp(MIN_SLACK, MAX_SLACK);
        StreamChunker {
            chunker,
            reader,
            buf: Vec::new(),
            start: 0,
            end: 0,
            cap: max.saturating_add(slack),
            eof: false,
            offset: 0,
        }
    }

    /// Stream offset where the next chunk starts: the total length of the chunks returned.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The reader, e.g. to recover it after the last chunk.
    pub fn into_inner(self) -> R {
        self.reader
    }

    /// The next chunk, or `None` at the end of the stream.
    ///
    /// A read error is returned as [`Error::Io`](crate::Error::Io) (reads interrupted by a
    /// signal are retried); calling again after an error retries the read.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>> {
        self.fill(self.chunker.max_len())?;
        if self.start == self.end {
            return Ok(None);
        }
        let avail = &self.buf[self.start..self.end];
        let n = self.chunker.cut(avail);
        assert!(
            n >= 1 && n <= avail.len(),
            "chunker cut {n} bytes of {}",
            avail.len()
        );
        let chunk = &self.buf[self.start..self.start + n];
        self.start += n;
        self.offset += n as u64;
        Ok(Some(chunk))
    }

    /// Reads until at least `want` bytes are buffered or the stream ends.
    fn fill(&mut self, want: usize) -> Result<()> {
        while self.end - self.start < want && !self.eof {
            if self.end == self.buf.len() {
                self.make_room();
            }
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    assert!(
                        n <= self.buf.len() - self.end,
                        "reader claimed too many bytes"
                    );
                    self.end += n;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Frees space at the end of the buffer: drops consumed bytes, else grows.
    fn make_room(&mut self) {
        if self.start > 0 {
            // Fewer than `max_len` unconsumed bytes remain (else we would not be reading),
            // so this moves at most `max_len` bytes per `slack` bytes read.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        } else {
            // Full of unconsumed bytes, fewer than `max_len`: grow towards `cap`.
            let len = self.buf.len();
            let new_len = len
                .saturating_mul(2)
                .clamp(MIN_SLACK, self.cap.max(len + 1));
            self.buf.resize(new_len, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{self, Cursor};

    use proptest::prelude::*;

    use super::*;
    use crate::chunk::{chunks, ChunkerSpec, FastCdc, Fixed, Whole};
    use crate::Error;

    /// A reader that hands out the data in pieces of scripted sizes, with interruptions.
    struct Jerky<'a> {
        data: &'a [u8],
        sizes: Vec<usize>,
        step: usize,
    }

    impl Read for Jerky<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let slot = self.step % self.sizes.len();
            let s = self.sizes[slot];
            self.step += 1;
            if s == 0 {
                // Interrupted once; the slot then reads a byte at a time.
                self.sizes[slot] = 1;
                return Err(io::Error::new(ErrorKind::Interrupted, "signal"));
            }
            let n = s.min(out.len()).min(self.data.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn stream_lens(chunker: &dyn Chunker, reader: impl Read) -> Result<Vec<usize>> {
        let mut s = StreamChunker::new(chunker, reader);
        let mut lens = Vec::new();
        let mut total = 0u64;
        while let Some(c) = s.next_chunk()? {
            lens.push(c.len());
            total += c.len() as u64;
            assert_eq!(s.offset(), total);
        }
        assert_eq!(s.next_chunk()?, None);
        Ok(lens)
    }

    fn slice_lens(chunker: &dyn Chunker, data: &[u8]) -> Vec<usize> {
        chunks(chunker, data).map(<[u8]>::len).collect()
    }

    fn data(len: usize, seed: u64, low_entropy: bool) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if low_entropy {
                    (x % 3) as u8
                } else {
                    x as u8
                }
            })
            .collect()
    }

    #[test]
    fn whole_stream_reads_everything() {
        let d = data(300_000, 1, false);
        let r = Jerky {
            data: &d,
            sizes: vec![7, 0, 70_000, 1],
            step: 0,
        };
        let mut s = StreamChunker::new(&Whole, r);
        assert_eq!(s.next_chunk().unwrap(), Some(&d[..]));
        assert_eq!(s.next_chunk().unwrap(), None);
        let mut e = StreamChunker::new(&Whole, Cursor::new(Vec::new()));
        assert_eq!(e.next_chunk().unwrap(), None);
    }

    #[test]
    fn chunks_equal_slice_chunks_with_one_byte_reads() {
        let d = data(50_000, 2, false);
        let c = FastCdc::new(16, 256, 1024).unwrap();
        let r = Jerky {
            data: &d,
            sizes: vec![1],
            step: 0,
        };
        assert_eq!(stream_lens(&c, r).unwrap(), slice_lens(&c, &d));
    }

    #[test]
    fn buffer_is_reused_not_regrown() {
        let d = data(4 << 20, 3, false);
        let c = FastCdc::new(2048, 8192, 65536).unwrap();
        let mut s = StreamChunker::new(&c, Cursor::new(&d[..]));
        let mut n = 0;
        while let Some(ch) = s.next_chunk().unwrap() {
            n += ch.len();
        }
        assert_eq!(n, d.len());
        assert!(
            s.buf.len() <= 65536 + MIN_SLACK,
            "buffer grew to {}",
            s.buf.len()
        );
    }

    #[test]
    fn read_errors_propagate_as_io() {
        struct Failing(usize);
        impl Read for Failing {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::other("disk on fire"));
                }
                let n = self.0.min(out.len());
                out[..n].fill(1);
                self.0 -= n;
                Ok(n)
            }
        }
        let c = Fixed::new(100).unwrap();
        let mut s = StreamChunker::new(&c, Failing(250));
        assert_eq!(s.next_chunk().unwrap().map(<[u8]>::len), Some(100));
        assert_eq!(s.next_chunk().unwrap().map(<[u8]>::len), Some(100));
        match s.next_chunk() {
            Err(Error::Io(e)) => assert_eq!(e.to_string(), "disk on fire"),
            other => panic!("expected an I/O error, got {other:?}"),
        }
    }

    fn spec_strategy() -> impl Strategy<Value = ChunkerSpec> {
        prop_oneof![
            4 => (6u32..14, 0.0f64..1.0, 0usize..8).prop_map(|(bits, minf, maxm)| {
                let avg = 1usize << bits;
                let min = ((avg as f64 * minf) as usize).max(1);
                ChunkerSpec::Cdc { min, avg, max: avg + maxm * avg / 2 }
            }),
            1 => (1usize..5000).prop_map(|size| ChunkerSpec::Fixed { size }),
            1 => Just(ChunkerSpec::Whole),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn stream_chunks_equal_slice_chunks(
            spec in spec_strategy(),
            len in 0usize..200_000,
            seed: u64,
            low_entropy: bool,
            sizes in prop::collection::vec(
                prop_oneof![Just(0usize), 1usize..64, 1usize..100_000], 1..12),
        ) {
            let chunker = spec.build().unwrap();
            let d = data(len, seed, low_entropy);
            let r = Jerky { data: &d, sizes, step: 0 };
            prop_assert_eq!(stream_lens(chunker.as_ref(), r).unwrap(), slice_lens(chunker.as_ref(), &d));
        }
    }
}
