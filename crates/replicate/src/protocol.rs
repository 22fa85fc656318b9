//! The live replication protocol: the messages a sender and a receiver exchange, on top of
//! [`dedupwire_wire`] frames.
//!
//! ```text
//! handshake   both ends send a wire hello for protocol "dedupwire-replicate" (version 1)
//!             whose data is a [`Hello`]; the sender sends first, the receiver answers
//!             with its applied position.
//! sender      BATCH (0x10)      an sDedup batch (crates/replicate/FORMAT.md)
//!             RAW_BATCH (0x12)  the answer to NEED_RAW: the asked entries whole
//!             CLOSE (wire 0x03) done: everything sent is acknowledged; the sender leaves
//! receiver    NEED_RAW (0x11)   positions of the oldest unacknowledged batch whose delta
//!                               sources it does not hold; it waits for RAW_BATCH
//!             ACK (0x13)        the oldest unacknowledged batch is applied, up to `pos`
//! either      ERROR (wire 0x02) why this end stops; PING/PONG (wire 0x04/0x05) keepalive
//! ```
//!
//! Payload layouts (varints are unsigned LEB128):
//!
//! ```text
//! hello data  role:u8 (1 sender, 2 receiver)
//!             stream: len:varint UTF-8 bytes     the replication stream (the source's slot)
//!             resume: 0x00 | 0x01 pos:u64 LE     receiver: its applied position
//!             config: len:varint JSON bytes      sender: its SdedupConfig (len 0: none)
//!             (bytes after these are ignored: room for additions within version 1)
//! NEED_RAW    count:varint first:varint (gap:varint){count-1}   positions, increasing
//! ACK         pos:u64 LE
//! PING/PONG   any bytes (PONG echoes PING's)
//! ```

use std::io::{Read, Write};

use dedupwire_wire::{Error as WireError, Frame, FrameConfig, FrameType, Framed};

use crate::sdedup::SdedupConfig;

/// The protocol name in the wire handshake.
pub const PROTOCOL: &str = "dedupwire-replicate";
/// The protocol version this build speaks.
pub const VERSION: u16 = 1;
/// The largest frame payload either end accepts (an sDedup batch is at most 1 GiB).
pub const MAX_FRAME: u32 = 1 << 30;

/// Frame type of [`Message::Batch`].
pub const BATCH: FrameType = FrameType(0x10);
/// Frame type of [`Message::NeedRaw`].
pub const NEED_RAW: FrameType = FrameType(0x11);
/// Frame type of [`Message::RawBatch`].
pub const RAW_BATCH: FrameType = FrameType(0x12);
/// Frame type of [`Message::Ack`].
pub const ACK: FrameType = FrameType(0x13);

/// The frame settings of a replication connection.
pub fn frame_config() -> FrameConfig {
    FrameConfig::with_max_payload(MAX_FRAME)
}

/// Which end of a replication connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Tails a change source and sends batches.
    Sender,
    /// Applies batches to a replica.
    Receiver,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Sender => "sender",
            Role::Receiver => "receiver",
        })
    }
}

/// The protocol's opening message, carried in the wire hello's data.
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    /// Who speaks.
    pub role: Role,
    /// The replication stream: the source's slot, the key of the replica's position.
    pub stream: String,
    /// Receiver: the position of the last change its replica applied; the sender resumes
    /// after it.
    pub resume: Option<u64>,
    /// Sender: the sDedup settings its batches are encoded with (the receiver's decoder must
    /// use the same cache size and delta codec).
    pub config: Option<SdedupConfig>,
}

impl Hello {
    /// The wire hello carrying this message.
    pub fn to_wire(&self) -> dedupwire_wire::Hello {
        wire_hello().with_data(self.encode())
    }

    /// The data bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(match self.role {
            Role::Sender => 1,
            Role::Receiver => 2,
        });
        put_varint(&mut out, self.stream.len() as u64);
        out.extend_from_slice(self.stream.as_bytes());
        match self.resume {
            None => out.push(0),
            Some(pos) => {
                out.push(1);
                out.extend_from_slice(&pos.to_le_bytes());
            }
        }
        let config = self
            .config
            .map(|c| serde_json::to_vec(&c).expect("the config serializes"))
            .unwrap_or_default();
        put_varint(&mut out, config.len() as u64);
        out.extend_from_slice(&config);
        out
    }

    /// Parses the data bytes.
    pub fn decode(data: &[u8]) -> Result<Hello, WireError> {
        let mut r = Cursor { buf: data, pos: 0 };
        let role = match r.u8("role")? {
            1 => Role::Sender,
            2 => Role::Receiver,
            other => return Err(malformed(format!("hello: unknown role {other}"))),
        };
        let stream = std::str::from_utf8(r.bytes("stream")?)
            .map_err(|_| malformed("hello: stream name is not UTF-8"))?
            .to_string();
        let resume = match r.u8("resume")? {
            0 => None,
            1 => Some(u64::from_le_bytes(
                r.take(8, "resume")?.try_into().expect("8 bytes"),
            )),
            other => return Err(malformed(format!("hello: bad resume tag {other}"))),
        };
        let config = match r.bytes("config")? {
            [] => None,
            json => Some(
                serde_json::from_slice(json)
                    .map_err(|e| malformed(format!("hello: unreadable sDedup settings: {e}")))?,
            ),
        };
        Ok(Hello {
            role,
            stream,
            resume,
            config,
        })
    }
}

/// The wire hello of this protocol, without data: what a peer's hello is checked against.
pub fn wire_hello() -> dedupwire_wire::Hello {
    dedupwire_wire::Hello::new(PROTOCOL, VERSION..=VERSION)
}

/// One message after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// An sDedup batch of changes (sender → receiver).
    Batch(Vec<u8>),
    /// Positions of the oldest unacknowledged batch to send again whole (receiver → sender).
    NeedRaw(Vec<u64>),
    /// The entries asked for, as an sDedup batch of whole documents (sender → receiver).
    RawBatch(Vec<u8>),
    /// The oldest unacknowledged batch is applied; its last position (receiver → sender).
    Ack(u64),
    /// Keepalive request.
    Ping(Vec<u8>),
    /// Keepalive answer (echoes the ping).
    Pong(Vec<u8>),
    /// The sender is done: everything it sent is acknowledged.
    Done,
    /// Why the other end stops.
    Error(String),
}

impl Message {
    /// The frame type this message travels in.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Message::Batch(_) => BATCH,
            Message::NeedRaw(_) => NEED_RAW,
            Message::RawBatch(_) => RAW_BATCH,
            Message::Ack(_) => ACK,
            Message::Ping(_) => FrameType::PING,
            Message::Pong(_) => FrameType::PONG,
            Message::Done => FrameType::CLOSE,
            Message::Error(_) => FrameType::ERROR,
        }
    }

    /// A short name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Batch(_) => "batch",
            Message::NeedRaw(_) => "raw request",
            Message::RawBatch(_) => "raw batch",
            Message::Ack(_) => "ack",
            Message::Ping(_) => "ping",
            Message::Pong(_) => "pong",
            Message::Done => "done",
            Message::Error(_) => "error",
        }
    }

    /// Writes the message as one frame.
    pub fn send<S: Read + Write>(&self, link: &mut Framed<S>) -> Result<(), WireError> {
        let kind = self.frame_type();
        match self {
            Message::Batch(b) | Message::RawBatch(b) | Message::Ping(b) | Message::Pong(b) => {
                link.write_frame(kind, b)
            }
            Message::NeedRaw(positions) => {
                let mut out = Vec::with_capacity(2 + positions.len() * 3);
                put_varint(&mut out, positions.len() as u64);
                let mut prev = 0;
                for (i, &p) in positions.iter().enumerate() {
                    put_varint(&mut out, if i == 0 { p } else { p - prev });
                    prev = p;
                }
                link.write_frame(kind, &out)
            }
            Message::Ack(pos) => link.write_frame(kind, &pos.to_le_bytes()),
            Message::Done => link.write_frame(kind, &[]),
            Message::Error(text) => link.send_error(text),
        }
    }

    /// Reads the next message.
    pub fn recv<S: Read + Write>(link: &mut Framed<S>) -> Result<(Message, u64), WireError> {
        let frame = link.read_frame()?;
        let offset = frame.offset;
        Ok((Message::from_frame(frame)?, offset))
    }

    /// Interprets a frame.
    pub fn from_frame(frame: Frame) -> Result<Message, WireError> {
        let Frame { kind, payload, .. } = frame;
        Ok(match kind {
            BATCH => Message::Batch(payload),
            RAW_BATCH => Message::RawBatch(payload),
            FrameType::PING => Message::Ping(payload),
            FrameType::PONG => Message::Pong(payload),
            FrameType::CLOSE => Message::Done,
            FrameType::ERROR => Message::Error(String::from_utf8_lossy(&payload).into_owned()),
            ACK => {
                let bytes: [u8; 8] = payload
                    .as_slice()
                    .try_into()
                    .map_err(|_| malformed(format!("ack of {} bytes", payload.len())))?;
                Message::Ack(u64::from_le_bytes(bytes))
            }
            NEED_RAW => {
                let mut r = Cursor {
                    buf: &payload,
                    pos: 0,
                };
                let n = r.varint("raw request")?;
                if n == 0 || n > payload.len() as u64 {
                    return Err(malformed(format!("raw request for {n} entries")));
                }
                let mut positions = Vec::with_capacity(n as usize);
                let mut prev: u64 = 0;
                for i in 0..n {
                    let v = r.varint("raw request")?;
                    let p = if i == 0 {
                        v
                    } else if v == 0 {
                        return Err(malformed("raw request positions do not increase"));
                    } else {
                        prev.checked_add(v)
                            .ok_or_else(|| malformed("raw request position overflows"))?
                    };
                    positions.push(p);
                    prev = p;
                }
                if r.pos != payload.len() {
                    return Err(malformed("bytes after the raw request"));
                }
                Message::NeedRaw(positions)
            }
            FrameType::HELLO => return Err(WireError::Protocol("a second handshake".into())),
            other => {
                return Err(WireError::Protocol(format!(
                    "unknown message type {other} (is the peer a newer version?)"
                )))
            }
        })
    }
}

fn malformed(what: impl std::fmt::Display) -> WireError {
    WireError::Protocol(format!("malformed message: {what}"))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| malformed(format!("{what} cut short")))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }

    fn varint(&mut self, what: &str) -> Result<u64, WireError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8(what)?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if shift == 63 && b > 1 {
                    break;
                }
                return Ok(v);
            }
        }
        Err(malformed(format!("{what}: varint too long")))
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], WireError> {
        let n = self.varint(what)?;
        let n = usize::try_from(n).map_err(|_| malformed(format!("{what} too long")))?;
        self.take(n, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(m: &Message) -> Message {
        let mut link = Framed::new(std::io::Cursor::new(Vec::new()));
        m.send(&mut link).unwrap();
        link.get_mut().set_position(0);
        Message::recv(&mut link).unwrap().0
    }

    #[test]
    fn messages_round_trip() {
        for m in [
            Message::Batch(b"DWR\x01...".to_vec()),
            Message::NeedRaw(vec![5]),
            Message::NeedRaw(vec![0, 1, 1000, u64::MAX]),
            Message::RawBatch(vec![1, 2, 3]),
            Message::Ack(0x16_B374_D848),
            Message::Ping(b"7".to_vec()),
            Message::Pong(vec![]),
            Message::Done,
            Message::Error("replica: disk full".into()),
        ] {
            assert_eq!(through(&m), m);
        }
    }

    #[test]
    fn hello_round_trip() {
        for h in [
            Hello {
                role: Role::Sender,
                stream: "slot".into(),
                resume: None,
                config: Some(SdedupConfig::default()),
            },
            Hello {
                role: Role::Receiver,
                stream: "ß".into(),
                resume: Some(u64::MAX),
                config: None,
            },
        ] {
            let bytes = h.encode();
            assert_eq!(Hello::decode(&bytes).unwrap(), h);
            for cut in 0..bytes.len() {
                assert!(Hello::decode(&bytes[..cut]).is_err(), "cut {cut}");
            }
        }
    }

    #[test]
    fn malformed_messages_are_errors() {
        let bad = |kind: FrameType, payload: &[u8]| {
            Message::from_frame(Frame {
                kind,
                payload: payload.to_vec(),
                offset: 0,
            })
            .unwrap_err()
            .to_string()
        };
        assert!(bad(ACK, b"1234567").contains("ack of 7 bytes"));
        assert!(bad(NEED_RAW, &[2, 5, 0]).contains("do not increase"));
        assert!(bad(NEED_RAW, &[0]).contains("0 entries"));
        assert!(bad(NEED_RAW, &[1, 5, 9]).contains("bytes after"));
        assert!(bad(FrameType(0x7f), b"").contains("unknown message type"));
    }
}
