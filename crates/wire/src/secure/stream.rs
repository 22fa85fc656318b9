//! [`SecureStream`]: the preamble, the Noise handshake, then length-prefixed encrypted messages.

use std::fmt;
use std::io::{self, Read, Write};

use snow::{HandshakeState, TransportState};

use super::key::Key;
use super::{
    LEN_BYTES, MAX_MESSAGE, MAX_PLAINTEXT, NOISE_PARAMS, PLAINTEXT_PEER, PREAMBLE, REQUIRES_SECURE,
    TAG_LEN,
};
use crate::error::{Error, Result};
use crate::frame::{encode_frame, FrameType, MAGIC};

const WRONG_KEY: &str = "the peer does not hold the same key";
const REFUSED: &str = "the peer refused the handshake: it does not hold the same key";

/// An encrypted, authenticated byte stream over `S`, keyed by a shared [`Key`]: bytes written
/// are buffered into messages of up to [`MAX_PLAINTEXT`] bytes, sent on [`flush`](Write::flush)
/// or when a message is full; reads return the bytes of whole, authenticated messages.
///
/// Errors come out as `io::Error`s; the frame layer over it turns them back into the crate's
/// [`Error`]: a peer gone mid-message is [`Error::PeerClosed`] (`mid_frame: true`), an altered,
/// replayed or reordered message [`Error::Corrupt`]. A read timeout of the underlying socket
/// passes through unchanged and can be retried: nothing read so far is lost.
pub struct SecureStream<S> {
    inner: S,
    noise: TransportState,
    /// Ciphertext read ahead: `rbuf[rstart..rend]`, room for two whole messages.
    rbuf: Box<[u8]>,
    rstart: usize,
    rend: usize,
    /// Decrypted bytes not yet returned: `plain[plain_pos..]`.
    plain: Vec<u8>,
    plain_pos: usize,
    /// Connection bytes consumed up to `rstart` (handshake included).
    read_offset: u64,
    messages_read: u64,
    read_broken: bool,
    /// Plaintext not yet sealed into a message.
    pending: Vec<u8>,
    /// The message being sent: length and ciphertext.
    sealed: Box<[u8]>,
    write_offset: u64,
    messages_written: u64,
    write_broken: bool,
}

impl<S: fmt::Debug> fmt::Debug for SecureStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecureStream")
            .field("inner", &self.inner)
            .field("bytes_read", &self.read_offset)
            .field("bytes_written", &self.write_offset)
            .field("messages_read", &self.messages_read)
            .field("messages_written", &self.messages_written)
            .finish_non_exhaustive()
    }
}

impl<S: Read + Write> SecureStream<S> {
    /// Opens the connecting end: sends the preamble and the first handshake message, checks the
    /// peer's answer. A peer with another key is [`Error::Auth`]; a plaintext or foreign peer
    /// [`Error::Protocol`] saying so.
    pub fn client(mut stream: S, key: &Key) -> Result<SecureStream<S>> {
        let mut io = HandshakeIo::new(&mut stream);
        let mut noise = handshake_state(key, &prologue(&PREAMBLE, &PREAMBLE), true)?;
        let mut first = PREAMBLE.to_vec();
        append_message(&mut noise, &mut first)?;
        io.send(&first)?;
        let mut opening = [0u8; 4];
        io.recv(&mut opening)?;
        opening_error(opening).map_or(Ok(()), Err)?;
        let reply = io.recv_message()?;
        if reply.is_empty() {
            return Err(Error::Auth(REFUSED.into()));
        }
        let mut payload = vec![0u8; MAX_MESSAGE];
        noise
            .read_message(&reply, &mut payload)
            .map_err(|_| Error::Auth(WRONG_KEY.into()))?;
        let (read, written) = (io.read, io.written);
        SecureStream::start(stream, noise, read, written)
    }

    /// Opens the accepting end: reads the peer's preamble and first handshake message and
    /// answers. A peer with another key is refused ([`Error::Auth`] here, and there); a
    /// plaintext dedupwire peer is told in a plaintext error frame that a key is needed.
    pub fn server(mut stream: S, key: &Key) -> Result<SecureStream<S>> {
        let mut io = HandshakeIo::new(&mut stream);
        let mut opening = [0u8; 4];
        io.recv(&mut opening)?;
        if let Some(e) = opening_error(opening) {
            if is_plaintext(opening) {
                let mut frame = Vec::new();
                encode_frame(FrameType::ERROR, REQUIRES_SECURE.as_bytes(), &mut frame);
                let _ = io.send(&frame);
            } else if opening[..3] == PREAMBLE[..3] {
                let _ = io.send(&refusal());
            }
            return Err(e);
        }
        let mut noise = handshake_state(key, &prologue(&opening, &PREAMBLE), false)?;
        let first = io.recv_message()?;
        let mut payload = vec![0u8; MAX_MESSAGE];
        if noise.read_message(&first, &mut payload).is_err() {
            let _ = io.send(&refusal());
            return Err(Error::Auth(WRONG_KEY.into()));
        }
        let mut reply = PREAMBLE.to_vec();
        append_message(&mut noise, &mut reply)?;
        io.send(&reply)?;
        let (read, written) = (io.read, io.written);
        SecureStream::start(stream, noise, read, written)
    }

    fn start(inner: S, noise: HandshakeState, read: u64, written: u64) -> Result<Self> {
        let noise = noise.into_transport_mode().map_err(noise_failure)?;
        Ok(SecureStream {
            inner,
            noise,
            rbuf: vec![0u8; 2 * (LEN_BYTES + MAX_MESSAGE)].into_boxed_slice(),
            rstart: 0,
            rend: 0,
            plain: Vec::with_capacity(MAX_PLAINTEXT),
            plain_pos: 0,
            read_offset: read,
            messages_read: 0,
            read_broken: false,
            pending: Vec::with_capacity(MAX_PLAINTEXT),
            sealed: vec![0u8; LEN_BYTES + MAX_MESSAGE].into_boxed_slice(),
            write_offset: written,
            messages_written: 0,
            write_broken: false,
        })
    }

    /// Bytes read from the underlying stream and consumed (handshake included).
    pub fn bytes_read(&self) -> u64 {
        self.read_offset
    }

    /// Bytes written to the underlying stream (handshake included; buffered bytes not yet).
    pub fn bytes_written(&self) -> u64 {
        self.write_offset
    }

    /// Whether bytes read from the underlying stream are waiting here, decrypted or not.
    pub(crate) fn has_buffered(&self) -> bool {
        self.plain_pos < self.plain.len() || self.rstart < self.rend
    }

    /// The underlying stream (e.g. to set socket timeouts).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The underlying stream (reading or writing it directly breaks the secure stream).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The underlying stream; bytes written but not flushed are dropped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Makes `rbuf[rstart..]` hold a whole message; its (start, length) of ciphertext, or
    /// `None` at the end of the stream between messages.
    fn fill_message(&mut self) -> io::Result<Option<(usize, usize)>> {
        loop {
            let avail = self.rend - self.rstart;
            if avail >= LEN_BYTES {
                let at = self.rstart;
                let len = usize::from(u16::from_le_bytes([self.rbuf[at], self.rbuf[at + 1]]));
                if avail >= LEN_BYTES + len {
                    return Ok(Some((at + LEN_BYTES, len)));
                }
            }
            if avail == 0 {
                (self.rstart, self.rend) = (0, 0);
            } else if self.rend == self.rbuf.len() {
                self.rbuf.copy_within(self.rstart..self.rend, 0);
                (self.rstart, self.rend) = (0, avail);
            }
            match self.inner.read(&mut self.rbuf[self.rend..]) {
                Ok(0) if avail == 0 => return Ok(None),
                Ok(0) => {
                    return Err(Error::PeerClosed {
                        offset: self.read_offset + avail as u64,
                        mid_frame: true,
                    }
                    .into_io())
                }
                Ok(n) => self.rend += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Decrypts the next message into `out` when it fits there, else into `self.plain`;
    /// returns the bytes put in `out`, `None` at the end of the stream.
    fn read_message(&mut self, out: &mut [u8]) -> io::Result<Option<usize>> {
        let (at, len) = match self.fill_message() {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(None),
            Err(e) => {
                if !matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) {
                    self.read_broken = true;
                }
                return Err(e);
            }
        };
        let offset = self.read_offset;
        let number = self.messages_read + 1;
        if len < TAG_LEN {
            self.read_broken = true;
            return Err(Error::Corrupt {
                offset,
                detail: format!(
                    "encrypted message {number} has {len} bytes, fewer than its {TAG_LEN}-byte tag"
                ),
            }
            .into_io());
        }
        let ciphertext = &self.rbuf[at..at + len];
        let direct = out.len() >= len - TAG_LEN;
        let opened = if direct {
            self.noise.read_message(ciphertext, out)
        } else {
            self.plain.resize(len - TAG_LEN, 0);
            self.plain_pos = 0;
            self.noise.read_message(ciphertext, &mut self.plain)
        };
        let n = match opened {
            Ok(n) => n,
            Err(_) => {
                self.read_broken = true;
                self.plain.clear();
                return Err(Error::Corrupt {
                    offset,
                    detail: format!(
                        "encrypted message {number} ({len} bytes) failed authentication: it was \
                         altered, replayed or reordered on the way"
                    ),
                }
                .into_io());
            }
        };
        self.rstart = at + len;
        self.read_offset += (LEN_BYTES + len) as u64;
        self.messages_read += 1;
        Ok(Some(if direct { n } else { 0 }))
    }

    fn seal_and_send(&mut self, direct: Option<&[u8]>) -> io::Result<()> {
        let plain = direct.unwrap_or(&self.pending);
        let sealed = self
            .noise
            .write_message(plain, &mut self.sealed[LEN_BYTES..]);
        self.pending.clear();
        let n = sealed.map_err(|e| {
            self.write_broken = true;
            io::Error::other(format!("cannot encrypt a message: {e}"))
        })?;
        self.sealed[..LEN_BYTES].copy_from_slice(&(n as u16).to_le_bytes());
        if let Err(e) = self.inner.write_all(&self.sealed[..LEN_BYTES + n]) {
            self.write_broken = true;
            return Err(e);
        }
        self.write_offset += (LEN_BYTES + n) as u64;
        self.messages_written += 1;
        Ok(())
    }

    fn check_write(&self) -> io::Result<()> {
        if self.write_broken {
            return Err(Error::Protocol(
                "the secure stream is out of step after an earlier write error; reconnect".into(),
            )
            .into_io());
        }
        Ok(())
    }
}

impl<S: Read + Write> Read for SecureStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.plain_pos < self.plain.len() {
                let n = buf.len().min(self.plain.len() - self.plain_pos);
                buf[..n].copy_from_slice(&self.plain[self.plain_pos..self.plain_pos + n]);
                self.plain_pos += n;
                return Ok(n);
            }
            if self.read_broken {
                return Err(Error::Protocol(
                    "the secure stream is out of step after an earlier error; reconnect".into(),
                )
                .into_io());
            }
            match self.read_message(buf)? {
                None => return Ok(0),
                Some(n) if n > 0 => return Ok(n),
                Some(_) => {}
            }
        }
    }
}

impl<S: Read + Write> Write for SecureStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check_write()?;
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pending.is_empty() && buf.len() >= MAX_PLAINTEXT {
            self.seal_and_send(Some(&buf[..MAX_PLAINTEXT]))?;
            return Ok(MAX_PLAINTEXT);
        }
        if self.pending.len() == MAX_PLAINTEXT {
            self.seal_and_send(None)?;
        }
        let n = buf.len().min(MAX_PLAINTEXT - self.pending.len());
        self.pending.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.check_write()?;
        if !self.pending.is_empty() {
            self.seal_and_send(None)?;
        }
        self.inner.flush()
    }
}

/// The handshake's reads and writes, counting bytes for error offsets.
struct HandshakeIo<'a, S> {
    stream: &'a mut S,
    read: u64,
    written: u64,
}

impl<'a, S: Read + Write> HandshakeIo<'a, S> {
    fn new(stream: &'a mut S) -> Self {
        HandshakeIo {
            stream,
            read: 0,
            written: 0,
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream
            .write_all(bytes)
            .and_then(|()| self.stream.flush())
            .map_err(|e| Error::from_io(e, self.written, self.written > 0))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let offset = self.read + got as u64;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(Error::PeerClosed {
                        offset,
                        mid_frame: offset > 0,
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::from_io(e, offset, offset > 0)),
            }
        }
        self.read += buf.len() as u64;
        Ok(())
    }

    fn recv_message(&mut self) -> Result<Vec<u8>> {
        let mut len = [0u8; LEN_BYTES];
        self.recv(&mut len)?;
        let mut message = vec![0u8; usize::from(u16::from_le_bytes(len))];
        self.recv(&mut message)?;
        Ok(message)
    }
}

/// The Noise prologue: both preambles, so altering either fails the handshake.
fn prologue(client: &[u8; 4], server: &[u8; 4]) -> [u8; 8] {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(client);
    p[4..].copy_from_slice(server);
    p
}

fn handshake_state(key: &Key, prologue: &[u8], initiator: bool) -> Result<HandshakeState> {
    let params = NOISE_PARAMS.parse().map_err(noise_failure)?;
    let builder = snow::Builder::new(params)
        .prologue(prologue)
        .map_err(noise_failure)?
        .psk(0, key.bytes())
        .map_err(noise_failure)?;
    if initiator {
        builder.build_initiator()
    } else {
        builder.build_responder()
    }
    .map_err(noise_failure)
}

/// Appends the next handshake message (empty payload) with its length to `out`.
fn append_message(noise: &mut HandshakeState, out: &mut Vec<u8>) -> Result<()> {
    let mut message = [0u8; 128];
    let n = noise
        .write_message(&[], &mut message)
        .map_err(noise_failure)?;
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&message[..n]);
    Ok(())
}

fn noise_failure(e: snow::Error) -> Error {
    Error::Io(io::Error::other(format!("Noise handshake failure: {e}")))
}

/// The server's preamble followed by an empty message: "refused".
fn refusal() -> Vec<u8> {
    let mut out = PREAMBLE.to_vec();
    out.extend_from_slice(&[0, 0]);
    out
}

fn is_plaintext(opening: [u8; 4]) -> bool {
    opening[..2] == MAGIC && opening[2] != PREAMBLE[2]
}

/// Why the peer's first four bytes are not this build's preamble, if they are not.
fn opening_error(opening: [u8; 4]) -> Option<Error> {
    if opening == PREAMBLE {
        return None;
    }
    Some(Error::Protocol(if opening[..3] == PREAMBLE[..3] {
        format!(
            "the peer speaks secure transport version {}, this build speaks version {}: upgrade \
             the older end",
            opening[3], PREAMBLE[3]
        )
    } else if is_plaintext(opening) {
        PLAINTEXT_PEER.into()
    } else {
        format!(
            "not a dedupwire peer: it opened with {:?} instead of {:?}",
            String::from_utf8_lossy(&opening),
            String::from_utf8_lossy(&PREAMBLE)
        )
    }))
}
