//! Frames: the unit everything on a dedupwire connection travels in.
//!
//! ```text
//! frame   = magic "DW"  version:u8 (1)  type:u8  flags:u8 (0)  length:u32 LE
//!           payload (length bytes)
//!           checksum:u64 LE   xxh3-64 of the 9 header bytes and the payload
//! ```
//!
//! See `crates/wire/FORMAT.md` for the rules.

use std::io::{self, Read, Write};

use xxhash_rust::xxh3::Xxh3;

use crate::error::{Error, Result};

/// The two bytes every frame starts with.
pub const MAGIC: [u8; 2] = *b"DW";
/// The frame format version this build reads and writes.
pub const VERSION: u8 = 1;
/// Bytes before the payload: magic, version, type, flags, length.
pub const HEADER_LEN: usize = 9;
/// Bytes after the payload: the checksum.
pub const TRAILER_LEN: usize = 8;
/// Bytes a frame adds to its payload.
pub const OVERHEAD: usize = HEADER_LEN + TRAILER_LEN;
/// The default largest payload accepted: 64 MiB.
pub const DEFAULT_MAX_PAYLOAD: u32 = 64 << 20;

/// What a frame carries. Types below [`FrameType::FIRST_APPLICATION`] are the wire layer's own
/// (control frames); the protocol on top numbers its messages from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameType(pub u8);

impl FrameType {
    /// The handshake: magic "DWIR", protocol name and versions (see [`crate::Hello`]).
    pub const HELLO: FrameType = FrameType(0x01);
    /// A fatal error: UTF-8 text saying why the sender stops. Nothing follows it.
    pub const ERROR: FrameType = FrameType(0x02);
    /// An orderly goodbye: the sender is done and will close the connection.
    pub const CLOSE: FrameType = FrameType(0x03);
    /// Keepalive request; the peer answers with [`FrameType::PONG`] (same payload).
    pub const PING: FrameType = FrameType(0x04);
    /// Keepalive answer.
    pub const PONG: FrameType = FrameType(0x05);
    /// The first type free for the protocol carried on top (0x10..=0xFF).
    pub const FIRST_APPLICATION: u8 = 0x10;

    /// True for the wire layer's own types (0x01..=0x0F).
    pub fn is_control(self) -> bool {
        self.0 < Self::FIRST_APPLICATION
    }

    fn name(self) -> Option<&'static str> {
        Some(match self {
            FrameType::HELLO => "hello",
            FrameType::ERROR => "error",
            FrameType::CLOSE => "close",
            FrameType::PING => "ping",
            FrameType::PONG => "pong",
            _ => return None,
        })
    }
}

impl std::fmt::Display for FrameType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} (0x{:02x})", self.0),
            None => write!(f, "0x{:02x}", self.0),
        }
    }
}

/// Settings of a frame reader or writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FrameConfig {
    /// The largest payload read or written; a longer frame is [`Error::Oversized`], reported
    /// from its header before anything is allocated.
    pub max_payload: u32,
}

impl Default for FrameConfig {
    fn default() -> Self {
        FrameConfig {
            max_payload: DEFAULT_MAX_PAYLOAD,
        }
    }
}

impl FrameConfig {
    /// The defaults with `max_payload` as the payload limit.
    pub fn with_max_payload(max_payload: u32) -> Self {
        FrameConfig { max_payload }
    }
}

/// A frame read from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its type.
    pub kind: FrameType,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its byte offset in the stream (for error messages).
    pub offset: u64,
}

impl Frame {
    /// The frame itself, or [`Error::Remote`] with the peer's message when it is an
    /// [`FrameType::ERROR`] frame.
    pub fn into_checked(self) -> Result<Frame> {
        if self.kind == FrameType::ERROR {
            return Err(Error::Remote(
                String::from_utf8_lossy(&self.payload).into_owned(),
            ));
        }
        Ok(self)
    }
}

/// Where a frame read into a caller's buffer was: its type, offset and payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// Its type.
    pub kind: FrameType,
    /// Its byte offset in the stream.
    pub offset: u64,
    /// Its payload length.
    pub len: u32,
}

/// Appends the frame of `kind` carrying `payload` to `out` (no length check: see
/// [`FrameWriter::write_frame`]). `kind` must not be 0.
pub fn encode_frame(kind: FrameType, payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(kind.0 != 0, "frame type 0 is invalid");
    debug_assert!(payload.len() <= u32::MAX as usize);
    let start = out.len();
    out.reserve(OVERHEAD + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind.0);
    out.push(0); // flags: none defined in version 1
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    let checksum = xxhash_rust::xxh3::xxh3_64(&out[start..]);
    out.extend_from_slice(&checksum.to_le_bytes());
}

/// The reading half's state, shared by [`FrameReader`] and [`Framed`].
#[derive(Debug)]
struct ReadState {
    config: FrameConfig,
    offset: u64,
    frames: u64,
    broken: bool,
}

impl ReadState {
    fn new(config: FrameConfig) -> Self {
        ReadState {
            config,
            offset: 0,
            frames: 0,
            broken: false,
        }
    }

    fn read_into<R: Read>(&mut self, r: &mut R, payload: &mut Vec<u8>) -> Result<FrameHead> {
        if self.broken {
            return Err(Error::Protocol(
                "the frame stream is out of step after an earlier error; reconnect".into(),
            ));
        }
        // Everything below that returns early leaves the stream mid-frame: mark it broken
        // first and clear the mark on success.
        let start = self.offset;
        let mut header = [0u8; HEADER_LEN];
        let mut got = 0;
        while got < HEADER_LEN {
            match r.read(&mut header[got..]) {
                Ok(0) => {
                    self.broken = true;
                    return Err(Error::PeerClosed {
                        offset: start + got as u64,
                        mid_frame: got > 0,
                    });
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let e = Error::from_io(e, start + got as u64, got > 0);
                    // A timeout or another plain I/O error before the first byte keeps the
                    // stream in step: the caller may try again.
                    self.broken = got > 0 || !matches!(e, Error::Io(_) | Error::Timeout { .. });
                    return Err(e);
                }
            }
        }
        self.broken = true;
        if header[..2] != MAGIC {
            return Err(Error::Corrupt {
                offset: start,
                detail: format!(
                    "bad magic {:02x} {:02x} (expected \"DW\"): not a dedupwire frame stream, or \
                     out of step",
                    header[0], header[1]
                ),
            });
        }
        if header[..3] == crate::secure::PREAMBLE[..3] {
            return Err(Error::Protocol(crate::secure::SECURE_PEER.into()));
        }
        if header[2] != VERSION {
            return Err(Error::Protocol(format!(
                "the peer writes frame format version {} and this build reads version {VERSION}",
                header[2]
            )));
        }
        let len = u32::from_le_bytes(header[5..9].try_into().expect("4 bytes"));
        if len > self.config.max_payload {
            return Err(Error::Oversized {
                offset: start,
                len: u64::from(len),
                max: self.config.max_payload,
            });
        }
        payload.clear();
        // Grow with what actually arrives, so a lying length costs nothing up front.
        payload.reserve((len as usize).min(1 << 20));
        let body_at = start + HEADER_LEN as u64;
        let n = r
            .by_ref()
            .take(u64::from(len))
            .read_to_end(payload)
            .map_err(|e| Error::from_io(e, body_at + payload.len() as u64, true))?;
        if n < len as usize {
            return Err(Error::PeerClosed {
                offset: body_at + n as u64,
                mid_frame: true,
            });
        }
        let mut trailer = [0u8; TRAILER_LEN];
        let trailer_at = body_at + u64::from(len);
        let mut got = 0;
        while got < TRAILER_LEN {
            match r.read(&mut trailer[got..]) {
                Ok(0) => {
                    return Err(Error::PeerClosed {
                        offset: trailer_at + got as u64,
                        mid_frame: true,
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::from_io(e, trailer_at + got as u64, true)),
            }
        }
        let mut h = Xxh3::new();
        h.update(&header);
        h.update(payload);
        if h.digest() != u64::from_le_bytes(trailer) {
            return Err(Error::Corrupt {
                offset: start,
                detail: format!(
                    "checksum mismatch on a frame of {len} bytes (the header or payload was damaged)"
                ),
            });
        }
        let kind = FrameType(header[3]);
        if kind.0 == 0 {
            return Err(Error::Corrupt {
                offset: start,
                detail: "frame type 0 is not valid".into(),
            });
        }
        if header[4] != 0 {
            return Err(Error::Protocol(format!(
                "frame at byte {start} has flags 0x{:02x}, which format version {VERSION} does \
                 not define",
                header[4]
            )));
        }
        self.broken = false;
        self.offset = trailer_at + TRAILER_LEN as u64;
        self.frames += 1;
        Ok(FrameHead {
            kind,
            offset: start,
            len,
        })
    }

    fn read<R: Read>(&mut self, r: &mut R) -> Result<Frame> {
        let mut payload = Vec::new();
        let head = self.read_into(r, &mut payload)?;
        Ok(Frame {
            kind: head.kind,
            payload,
            offset: head.offset,
        })
    }
}

/// The writing half's state, shared by [`FrameWriter`] and [`Framed`].
#[derive(Debug)]
struct WriteState {
    config: FrameConfig,
    offset: u64,
    frames: u64,
    broken: bool,
    buf: Vec<u8>,
}

impl WriteState {
    fn new(config: FrameConfig) -> Self {
        WriteState {
            config,
            offset: 0,
            frames: 0,
            broken: false,
            buf: Vec::new(),
        }
    }

    fn write<W: Write>(&mut self, w: &mut W, kind: FrameType, payload: &[u8]) -> Result<()> {
        if self.broken {
            return Err(Error::Protocol(
                "the frame stream is out of step after an earlier write error; reconnect".into(),
            ));
        }
        if kind.0 == 0 {
            return Err(Error::Protocol("frame type 0 is not valid".into()));
        }
        if payload.len() > self.config.max_payload as usize {
            return Err(Error::Oversized {
                offset: self.offset,
                len: payload.len() as u64,
                max: self.config.max_payload,
            });
        }
        self.buf.clear();
        encode_frame(kind, payload, &mut self.buf);
        let result = w.write_all(&self.buf).and_then(|()| w.flush());
        if self.buf.capacity() > 4 << 20 {
            self.buf = Vec::new(); // do not keep a big batch's buffer around
        }
        if let Err(e) = result {
            self.broken = true;
            return Err(Error::from_io(e, self.offset, false));
        }
        self.offset += (OVERHEAD + payload.len()) as u64;
        self.frames += 1;
        Ok(())
    }
}

/// Reads frames from a byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    state: ReadState,
}

impl<R: Read> FrameReader<R> {
    /// A reader with the default settings.
    pub fn new(inner: R) -> Self {
        Self::with_config(inner, FrameConfig::default())
    }

    /// A reader with `config`.
    pub fn with_config(inner: R, config: FrameConfig) -> Self {
        FrameReader {
            inner,
            state: ReadState::new(config),
        }
    }

    /// The next frame. At the end of the stream between frames: [`Error::PeerClosed`] with
    /// `mid_frame: false`; inside a frame: `mid_frame: true`.
    pub fn read_frame(&mut self) -> Result<Frame> {
        self.state.read(&mut self.inner)
    }

    /// The next frame, its payload in `payload` (cleared first; reuses its allocation).
    pub fn read_frame_into(&mut self, payload: &mut Vec<u8>) -> Result<FrameHead> {
        self.state.read_into(&mut self.inner, payload)
    }

    /// Bytes of whole frames read so far.
    pub fn bytes_read(&self) -> u64 {
        self.state.offset
    }

    /// Frames read so far.
    pub fn frames_read(&self) -> u64 {
        self.state.frames
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The underlying stream (reading from it directly puts the reader out of step).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The underlying stream.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Writes frames to a byte stream, one `write_all` and `flush` per frame.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    state: WriteState,
}

impl<W: Write> FrameWriter<W> {
    /// A writer with the default settings.
    pub fn new(inner: W) -> Self {
        Self::with_config(inner, FrameConfig::default())
    }

    /// A writer with `config`.
    pub fn with_config(inner: W, config: FrameConfig) -> Self {
        FrameWriter {
            inner,
            state: WriteState::new(config),
        }
    }

    /// Writes and flushes one frame. A payload over the limit is [`Error::Oversized`] and
    /// nothing is written.
    pub fn write_frame(&mut self, kind: FrameType, payload: &[u8]) -> Result<()> {
        self.state.write(&mut self.inner, kind, payload)
    }

    /// Bytes of frames written so far.
    pub fn bytes_written(&self) -> u64 {
        self.state.offset
    }

    /// Frames written so far.
    pub fn frames_written(&self) -> u64 {
        self.state.frames
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The underlying stream (writing to it directly puts the writer out of step).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The underlying stream.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// Both directions of one connection: frames in and out of a `Read + Write` stream (a
/// `TcpStream`, a TLS stream, a pipe pair).
///
/// To read and write from different threads, split the stream (e.g. `TcpStream::try_clone`)
/// and use a [`FrameReader`] and a [`FrameWriter`].
#[derive(Debug)]
pub struct Framed<S> {
    stream: S,
    reader: ReadState,
    writer: WriteState,
}

impl<S: Read + Write> Framed<S> {
    /// A framed stream with the default settings.
    pub fn new(stream: S) -> Self {
        Self::with_config(stream, FrameConfig::default())
    }

    /// A framed stream with `config` in both directions.
    pub fn with_config(stream: S, config: FrameConfig) -> Self {
        Framed {
            stream,
            reader: ReadState::new(config),
            writer: WriteState::new(config),
        }
    }

    /// The next frame (see [`FrameReader::read_frame`]).
    pub fn read_frame(&mut self) -> Result<Frame> {
        self.reader.read(&mut self.stream)
    }

    /// The next frame, its payload in `payload` (see [`FrameReader::read_frame_into`]).
    pub fn read_frame_into(&mut self, payload: &mut Vec<u8>) -> Result<FrameHead> {
        self.reader.read_into(&mut self.stream, payload)
    }

    /// Writes and flushes one frame (see [`FrameWriter::write_frame`]).
    pub fn write_frame(&mut self, kind: FrameType, payload: &[u8]) -> Result<()> {
        self.writer.write(&mut self.stream, kind, payload)
    }

    /// Tells the peer why this side stops (an [`FrameType::ERROR`] frame). Messages longer
    /// than 64 KiB are cut.
    pub fn send_error(&mut self, message: &str) -> Result<()> {
        let mut end = message.len().min(64 << 10);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        self.write_frame(FrameType::ERROR, &message.as_bytes()[..end])
    }

    /// Bytes of whole frames read so far.
    pub fn bytes_read(&self) -> u64 {
        self.reader.offset
    }

    /// Bytes of frames written so far.
    pub fn bytes_written(&self) -> u64 {
        self.writer.offset
    }

    /// Frames read so far.
    pub fn frames_read(&self) -> u64 {
        self.reader.frames
    }

    /// Frames written so far.
    pub fn frames_written(&self) -> u64 {
        self.writer.frames
    }

    /// The settings.
    pub fn config(&self) -> FrameConfig {
        self.reader.config
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The underlying stream (reading or writing it directly puts the framing out of step).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The underlying stream.
    pub fn into_inner(self) -> S {
        self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn encoded(frames: &[(u8, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, p) in frames {
            encode_frame(FrameType(*k), p, &mut out);
        }
        out
    }

    #[test]
    fn layout_is_as_documented() {
        let bytes = encoded(&[(0x10, b"abc")]);
        assert_eq!(bytes.len(), OVERHEAD + 3);
        assert_eq!(&bytes[..9], b"DW\x01\x10\x00\x03\x00\x00\x00");
        assert_eq!(&bytes[9..12], b"abc");
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes[..12]);
        assert_eq!(&bytes[12..], &sum.to_le_bytes());
    }

    #[test]
    fn round_trip_and_counters() {
        let mut w = FrameWriter::new(Vec::new());
        w.write_frame(FrameType(0x10), b"hello").unwrap();
        w.write_frame(FrameType::PING, b"").unwrap();
        assert_eq!(w.frames_written(), 2);
        assert_eq!(w.bytes_written(), (2 * OVERHEAD + 5) as u64);
        let bytes = w.into_inner();
        let mut r = FrameReader::new(Cursor::new(&bytes));
        let f = r.read_frame().unwrap();
        assert_eq!(
            (f.kind, f.payload.as_slice(), f.offset),
            (FrameType(0x10), &b"hello"[..], 0)
        );
        let f = r.read_frame().unwrap();
        assert_eq!(
            (f.kind, f.payload.len(), f.offset),
            (FrameType::PING, 0, (OVERHEAD + 5) as u64)
        );
        let e = r.read_frame().unwrap_err();
        assert!(
            matches!(
                e,
                Error::PeerClosed {
                    mid_frame: false,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(r.bytes_read(), bytes.len() as u64);
    }

    #[test]
    fn oversized_is_refused_before_allocating() {
        // A header announcing 4 GiB - 1, and no payload at all.
        let mut bytes = b"DW\x01\x10\x00".to_vec();
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut r =
            FrameReader::with_config(Cursor::new(bytes), FrameConfig::with_max_payload(1024));
        let e = r.read_frame().unwrap_err();
        assert!(
            matches!(e, Error::Oversized { len, max: 1024, offset: 0 } if len == u64::from(u32::MAX)),
            "{e}"
        );
        let mut w = FrameWriter::with_config(Vec::new(), FrameConfig::with_max_payload(4));
        assert!(matches!(
            w.write_frame(FrameType(0x10), b"12345"),
            Err(Error::Oversized { .. })
        ));
        assert!(w.get_ref().is_empty(), "nothing written");
        w.write_frame(FrameType(0x10), b"1234").unwrap();
    }

    #[test]
    fn damage_is_detected() {
        let good = encoded(&[(0x11, b"payload bytes")]);
        let read = |bytes: &[u8]| FrameReader::new(Cursor::new(bytes.to_vec())).read_frame();
        let mut bad = good.clone();
        bad[12] ^= 0x20;
        let e = read(&bad).unwrap_err();
        assert!(
            matches!(&e, Error::Corrupt { offset: 0, detail } if detail.contains("checksum")),
            "{e}"
        );
        let mut bad = good.clone();
        bad[0] = b'X';
        let e = read(&bad).unwrap_err();
        assert!(e.to_string().contains("bad magic"), "{e}");
        let mut bad = good.clone();
        bad[2] = 7;
        let e = read(&bad).unwrap_err();
        assert!(
            matches!(&e, Error::Protocol(m) if m.contains("version 7")),
            "{e}"
        );
        for cut in [1, 8, 9, 15, good.len() - 1] {
            let e = read(&good[..cut]).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::PeerClosed {
                        mid_frame: true,
                        ..
                    }
                ),
                "cut {cut}: {e}"
            );
            assert!(e.to_string().contains("truncated"), "{e}");
        }
        // Type 0 and unknown flags, with a valid checksum.
        let mut bad = good.clone();
        bad[3] = 0;
        reseal(&mut bad);
        assert!(matches!(read(&bad), Err(Error::Corrupt { .. })));
        let mut bad = good.clone();
        bad[4] = 1;
        reseal(&mut bad);
        assert!(matches!(read(&bad), Err(Error::Protocol(m)) if m.contains("flags 0x01")));
    }

    fn reseal(frame: &mut [u8]) {
        let n = frame.len() - TRAILER_LEN;
        let sum = xxhash_rust::xxh3::xxh3_64(&frame[..n]);
        frame[n..].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn a_broken_reader_stays_broken() {
        let mut bytes = encoded(&[(0x10, b"a")]);
        bytes[10] ^= 1;
        bytes.extend(encoded(&[(0x10, b"b")]));
        let mut r = FrameReader::new(Cursor::new(bytes));
        assert!(matches!(r.read_frame(), Err(Error::Corrupt { .. })));
        assert!(matches!(r.read_frame(), Err(Error::Protocol(m)) if m.contains("out of step")));
    }

    /// A reader that times out once before each frame, then delivers one byte per call.
    struct Flaky {
        data: Vec<u8>,
        pos: usize,
        timed_out: bool,
    }

    impl Read for Flaky {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.pos < self.data.len() && !self.timed_out {
                self.timed_out = true;
                return Err(io::Error::new(io::ErrorKind::WouldBlock, "timeout"));
            }
            if self.pos == self.data.len() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.data[self.pos];
            self.pos += 1;
            Ok(1)
        }
    }

    #[test]
    fn a_timeout_between_frames_is_retryable() {
        let data = encoded(&[(0x10, b"one"), (0x12, b"two")]);
        let mut r = FrameReader::new(Flaky {
            data,
            pos: 0,
            timed_out: false,
        });
        let e = r.read_frame().unwrap_err();
        assert!(e.is_timeout(), "{e}");
        assert_eq!(r.read_frame().unwrap().payload, b"one");
        r.get_mut().timed_out = false;
        assert!(r.read_frame().unwrap_err().is_timeout());
        assert_eq!(r.read_frame().unwrap().payload, b"two");
    }

    #[test]
    fn error_frames_become_remote_errors() {
        let mut f = Framed::new(Cursor::new(Vec::new()));
        f.send_error("disk full").unwrap();
        f.get_mut().set_position(0);
        let e = f.read_frame().unwrap().into_checked().unwrap_err();
        assert_eq!(e.to_string(), "the peer reported an error: disk full");
    }
}
