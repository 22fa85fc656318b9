//! The handshake: each end names the protocol it speaks and the versions it can use; both
//! agree on the highest version they share or refuse the peer with a clear error.
//!
//! ```text
//! hello frame (type 0x01) payload =
//!     "DWIR"  hello_format:u8 (1)
//!     name_len:u8  protocol name (UTF-8, 1..=255 bytes)
//!     min_version:u16 LE  max_version:u16 LE
//!     data (the rest): the protocol's own opening message
//! ```

use std::io::{Read, Write};
use std::ops::RangeInclusive;

use crate::error::{Error, Result};
use crate::frame::{FrameType, Framed};

/// The four bytes a hello payload starts with.
pub const HELLO_MAGIC: [u8; 4] = *b"DWIR";
/// The layout version of the hello payload.
pub const HELLO_FORMAT: u8 = 1;

/// One end's opening message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The protocol spoken on top of the frames (e.g. `"dedupwire-replicate"`).
    pub protocol: String,
    /// The lowest protocol version this end can use.
    pub min_version: u16,
    /// The highest protocol version this end can use.
    pub max_version: u16,
    /// The protocol's own opening data (roles, settings, resume positions).
    pub data: Vec<u8>,
}

/// What a handshake settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    /// The protocol version both ends use: the highest they share.
    pub version: u16,
    /// The peer's hello.
    pub peer: Hello,
}

impl Hello {
    /// A hello for `protocol` speaking `versions`, with no data.
    ///
    /// # Panics
    /// When the name is empty or longer than 255 bytes, or the range is empty.
    pub fn new(protocol: impl Into<String>, versions: RangeInclusive<u16>) -> Hello {
        let protocol = protocol.into();
        assert!(
            !protocol.is_empty() && protocol.len() <= 255,
            "a protocol name has 1..=255 bytes"
        );
        assert!(
            versions.start() <= versions.end(),
            "empty protocol version range"
        );
        Hello {
            protocol,
            min_version: *versions.start(),
            max_version: *versions.end(),
            data: Vec::new(),
        }
    }

    /// The same hello carrying `data`.
    pub fn with_data(mut self, data: Vec<u8>) -> Hello {
        self.data = data;
        self
    }

    /// The payload of the hello frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 1 + 1 + self.protocol.len() + 4 + self.data.len());
        out.extend_from_slice(&HELLO_MAGIC);
        out.push(HELLO_FORMAT);
        let name = &self.protocol.as_bytes()[..self.protocol.len().min(255)];
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&self.min_version.to_le_bytes());
        out.extend_from_slice(&self.max_version.to_le_bytes());
        out.extend_from_slice(&self.data);
        out
    }

    /// Parses a hello frame's payload.
    pub fn decode(payload: &[u8]) -> Result<Hello> {
        let bad = |what: &str| Error::Protocol(format!("malformed handshake: {what}"));
        if payload.len() < 4 || payload[..4] != HELLO_MAGIC {
            return Err(Error::Protocol(
                "the peer's handshake does not start with \"DWIR\": it is not a dedupwire endpoint"
                    .into(),
            ));
        }
        let format = *payload.get(4).ok_or_else(|| bad("no format byte"))?;
        if format != HELLO_FORMAT {
            return Err(Error::Protocol(format!(
                "the peer's handshake has layout version {format}; this build reads {HELLO_FORMAT}"
            )));
        }
        let name_len = *payload.get(5).ok_or_else(|| bad("no protocol name"))? as usize;
        let name = payload
            .get(6..6 + name_len)
            .ok_or_else(|| bad("protocol name cut short"))?;
        let protocol = std::str::from_utf8(name)
            .map_err(|_| bad("protocol name is not UTF-8"))?
            .to_string();
        let v = payload
            .get(6 + name_len..10 + name_len)
            .ok_or_else(|| bad("versions cut short"))?;
        let min_version = u16::from_le_bytes([v[0], v[1]]);
        let max_version = u16::from_le_bytes([v[2], v[3]]);
        if protocol.is_empty() || min_version > max_version {
            return Err(bad("empty protocol name or version range"));
        }
        Ok(Hello {
            protocol,
            min_version,
            max_version,
            data: payload[10 + name_len..].to_vec(),
        })
    }

    /// The version this end and `peer` agree on, or why they cannot talk.
    pub fn agree(&self, peer: &Hello) -> Result<u16> {
        if peer.protocol != self.protocol {
            return Err(Error::Protocol(format!(
                "the peer speaks protocol {:?}, this end speaks {:?}",
                peer.protocol, self.protocol
            )));
        }
        let low = self.min_version.max(peer.min_version);
        let high = self.max_version.min(peer.max_version);
        if low > high {
            return Err(Error::Protocol(format!(
                "protocol version mismatch: the peer speaks {} {}, this end speaks {} {} \
                 (upgrade the older end)",
                peer.protocol,
                range_text(peer.min_version, peer.max_version),
                self.protocol,
                range_text(self.min_version, self.max_version)
            )));
        }
        Ok(high)
    }
}

fn range_text(min: u16, max: u16) -> String {
    if min == max {
        format!("version {min}")
    } else {
        format!("versions {min}..={max}")
    }
}

impl<S: Read + Write> Framed<S> {
    /// Sends this end's hello.
    pub fn send_hello(&mut self, hello: &Hello) -> Result<()> {
        self.write_frame(FrameType::HELLO, &hello.encode())
    }

    /// Reads the peer's hello and checks it against `ours` (protocol name, a shared version).
    /// On a mismatch the peer is told why in an error frame, and the error is returned; an
    /// error frame from the peer is [`Error::Remote`].
    pub fn recv_hello(&mut self, ours: &Hello) -> Result<Agreement> {
        let frame = self.read_frame()?.into_checked()?;
        if frame.kind != FrameType::HELLO {
            let e = Error::Protocol(format!(
                "expected the peer's handshake, got a frame of type {}",
                frame.kind
            ));
            let _ = self.send_error(&e.to_string());
            return Err(e);
        }
        let agreed = Hello::decode(&frame.payload).and_then(|peer| {
            let version = ours.agree(&peer)?;
            Ok(Agreement { version, peer })
        });
        if let Err(e) = &agreed {
            // Tell the peer in its own terms (its "peer" is this end).
            let _ = self.send_error(&format!(
                "handshake refused by the other end, which speaks {} {}: {e}",
                ours.protocol,
                range_text(ours.min_version, ours.max_version)
            ));
        }
        agreed
    }

    /// Sends `ours`, then reads and checks the peer's hello: the symmetric handshake, where
    /// neither end needs to see the other's hello before sending its own.
    pub fn handshake(&mut self, ours: &Hello) -> Result<Agreement> {
        self.send_hello(ours)?;
        self.recv_hello(ours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode() {
        let h = Hello::new("dedupwire-replicate", 1..=3).with_data(b"xyz".to_vec());
        let bytes = h.encode();
        assert_eq!(&bytes[..5], b"DWIR\x01");
        assert_eq!(Hello::decode(&bytes).unwrap(), h);
        for cut in 0..bytes.len() - 3 {
            assert!(Hello::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn agreement() {
        let a = Hello::new("p", 1..=3);
        assert_eq!(a.agree(&Hello::new("p", 2..=5)).unwrap(), 3);
        assert_eq!(a.agree(&Hello::new("p", 1..=1)).unwrap(), 1);
        let e = a.agree(&Hello::new("p", 4..=4)).unwrap_err().to_string();
        assert!(
            e.contains("version mismatch")
                && e.contains("version 4")
                && e.contains("versions 1..=3"),
            "{e}"
        );
        let e = a.agree(&Hello::new("q", 1..=3)).unwrap_err().to_string();
        assert!(e.contains("\"q\""), "{e}");
    }

    #[test]
    fn not_dedupwire() {
        let e = Hello::decode(b"HTTP/1.1 200 OK").unwrap_err().to_string();
        assert!(e.contains("not a dedupwire endpoint"), "{e}");
    }
}
