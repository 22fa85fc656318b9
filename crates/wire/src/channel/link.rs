//! The framed connection under a channel: encodes messages into frames and counts the bytes.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use super::protocol::{Limits, Message};
use crate::error::{Error, Result};
use crate::frame::{Frame, FrameType, Framed};

/// One end's framed connection and what both its halves need to encode and decode messages.
#[derive(Debug)]
pub(crate) struct Link<S> {
    pub(crate) framed: Framed<S>,
    pub(crate) limits: Limits,
    /// Time spent writing frames: blocked on a full socket, this is the link's time.
    pub(crate) write_time: Duration,
    /// Time spent waiting for and reading frames.
    pub(crate) read_time: Duration,
    buf: Vec<u8>,
}

impl<S: Read + Write> Link<S> {
    pub(crate) fn new(framed: Framed<S>, limits: Limits) -> Self {
        Link {
            framed,
            limits,
            write_time: Duration::ZERO,
            read_time: Duration::ZERO,
            buf: Vec::new(),
        }
    }

    /// Writes `m` as one frame.
    pub(crate) fn send(&mut self, m: &Message) -> Result<()> {
        self.buf.clear();
        m.encode(self.limits.id_len, &mut self.buf);
        let t = Instant::now();
        let r = self.framed.write_frame(m.frame_type(), &self.buf);
        self.write_time += t.elapsed();
        if self.buf.capacity() > 4 << 20 {
            self.buf = Vec::new();
        }
        r
    }

    /// Reads the next frame; an ERROR frame is [`Error::Remote`].
    pub(crate) fn read(&mut self) -> Result<Frame> {
        let t = Instant::now();
        let r = self.framed.read_frame();
        self.read_time += t.elapsed();
        r?.into_checked()
    }

    /// Bytes of frames written so far.
    pub(crate) fn bytes_written(&self) -> u64 {
        self.framed.bytes_written()
    }

    /// Tells the peer why this end stops (best effort) and returns `e`.
    pub(crate) fn fail(&mut self, e: Error) -> Error {
        if !matches!(
            e,
            Error::Remote(_) | Error::PeerClosed { .. } | Error::Io(_)
        ) {
            let _ = self.framed.send_error(&e.to_string());
        }
        e
    }

    /// Writes an orderly goodbye.
    pub(crate) fn close(&mut self) -> Result<()> {
        self.framed.write_frame(FrameType::CLOSE, &[])
    }
}
