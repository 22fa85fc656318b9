//! Chunking over any `Read`, with the same boundaries as over one slice.
//! (Owned by the chunking work: implementation pending.)

use std::io::Read;

use super::Chunker;
use crate::Result;

/// Yields owned chunks from a reader, buffering at most `max_len` plus one read block.
pub struct StreamChunker<'c, R> {
    chunker: &'c dyn Chunker,
    reader: R,
}

impl<'c, R: Read> StreamChunker<'c, R> {
    /// Chunks `reader` with `chunker`.
    pub fn new(chunker: &'c dyn Chunker, reader: R) -> Self {
        StreamChunker { chunker, reader }
    }

    /// The next chunk, or `None` at the end of the stream.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>> {
        let _ = (&self.chunker, &mut self.reader);
        todo!()
    }
}
