//! Why a frame stream failed.

use std::io;

/// Why reading or writing frames failed.
///
/// After any error other than an [`Error::Io`] or [`Error::Timeout`] that happened before the
/// first byte of a frame, the stream is out of step with its peer: the reader or
/// writer refuses further frames and the connection should be dropped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The underlying stream failed (other than by the peer going away).
    #[error("I/O error on the frame stream: {0}")]
    Io(#[source] io::Error),
    /// The bytes are not a valid frame (bad magic, bad checksum, a frame type of 0), or an
    /// encrypted message failed authentication (altered, replayed or reordered on the way).
    #[error("corrupt frame at byte {offset}: {detail}")]
    Corrupt {
        /// Byte offset in the stream of the frame (or field) at fault; for an encrypted
        /// message, its offset in the connection's (encrypted) bytes.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// A frame's length exceeds the configured maximum (detected before allocating).
    #[error("frame at byte {offset} has a {len}-byte payload, more than the limit of {max} bytes")]
    Oversized {
        /// Byte offset of the frame in the stream.
        offset: u64,
        /// The payload length announced (reading) or given (writing).
        len: u64,
        /// The configured maximum payload length.
        max: u32,
    },
    /// The peer closed the connection (end of stream, reset, broken pipe).
    #[error("{}", peer_closed_message(*offset, *mid_frame))]
    PeerClosed {
        /// Bytes read (or written) on this stream when it ended.
        offset: u64,
        /// True when the stream ended inside a frame (a truncated frame).
        mid_frame: bool,
    },
    /// A read timed out (a socket read timeout): the peer sent nothing in time.
    #[error("timed out waiting for the peer at byte {offset}{}", if *mid_frame { " (inside a frame)" } else { "" })]
    Timeout {
        /// Bytes read on this stream when the time ran out.
        offset: u64,
        /// True when the frame had started arriving (the stream is then out of step).
        mid_frame: bool,
    },
    /// The peer does not follow the protocol: a mismatched handshake, an unexpected frame, an
    /// unsupported format version or flag.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The peer sent an error frame: it stopped, and says why.
    #[error("the peer reported an error: {0}")]
    Remote(String),
    /// The secure handshake failed: the peer does not hold the same key (or the handshake was
    /// altered on the way).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The two ends' configurations cannot be agreed on, or one is out of range: names the
    /// element at fault.
    #[error("configuration error: {0}")]
    Config(String),
    /// Data failed its end-to-end check: a chunk or a reconstructed message does not match
    /// the hash the sender gave for it.
    #[error("integrity error: {0}")]
    Integrity(String),
    /// The chunk store failed.
    #[error("chunk store failed: {0}")]
    Store(#[from] crate::store::StoreError),
}

fn peer_closed_message(offset: u64, mid_frame: bool) -> String {
    if mid_frame {
        format!(
            "the stream ended in the middle of a frame at byte {offset} (truncated frame: the peer \
             closed the connection or went away)"
        )
    } else {
        format!("the peer closed the connection (after {offset} bytes, between frames)")
    }
}

impl Error {
    /// True when the peer went away (the connection ended, possibly inside a frame).
    pub fn is_peer_closed(&self) -> bool {
        matches!(self, Error::PeerClosed { .. })
    }

    /// True for a read timeout (`WouldBlock`/`TimedOut` from a socket with a timeout set).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True when the secure handshake failed for want of the same key.
    pub fn is_auth(&self) -> bool {
        matches!(self, Error::Auth(_))
    }

    /// Maps an I/O error at `offset`: the peer going away becomes [`Error::PeerClosed`]. An
    /// error of this crate carried inside the I/O error (from a [`crate::SecureStream`] under
    /// the frames) comes out as itself, at the frame layer's offset when it is about the peer
    /// going away or a timeout.
    pub(crate) fn from_io(e: io::Error, offset: u64, mid_frame: bool) -> Error {
        if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
            let inner = e
                .into_inner()
                .and_then(|inner| inner.downcast::<Error>().ok())
                .expect("checked above");
            return match *inner {
                Error::PeerClosed { mid_frame: m, .. } => Error::PeerClosed {
                    offset,
                    mid_frame: mid_frame || m,
                },
                Error::Timeout { mid_frame: m, .. } => Error::Timeout {
                    offset,
                    mid_frame: mid_frame || m,
                },
                other => other,
            };
        }
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected => Error::PeerClosed { offset, mid_frame },
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                Error::Timeout { offset, mid_frame }
            }
            _ => Error::Io(e),
        }
    }

    /// This error as an I/O error (for `Read`/`Write` impls), recoverable by [`Error::from_io`].
    pub(crate) fn into_io(self) -> io::Error {
        let kind = match &self {
            Error::PeerClosed { .. } => io::ErrorKind::UnexpectedEof,
            Error::Timeout { .. } => io::ErrorKind::TimedOut,
            Error::Io(e) => e.kind(),
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, self)
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
