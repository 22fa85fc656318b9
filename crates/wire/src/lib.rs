//! dedupwire's wire layer: versioned, checksummed frames over any byte stream, and the
//! handshake that makes two ends agree on a protocol version or refuse each other clearly.
//!
//! Everything a dedupwire connection carries travels in [frames](frame): a 9-byte header
//! (magic `"DW"`, format version, frame type, flags, payload length), the payload, and an
//! xxh3-64 checksum of both. Lengths are bounded by a configurable maximum, checked before
//! anything is allocated; damage, truncation and a peer that goes away are distinct, typed
//! [errors](Error). Frame types below 0x10 belong to this layer (hello, error, close,
//! ping/pong); the protocol on top (replication batches, channel requests) numbers its own
//! from 0x10.
//!
//! The layer is blocking and works over any `Read + Write` ([`Framed`]) or over split halves
//! ([`FrameReader`], [`FrameWriter`]). Connections are encrypted and authenticated with a
//! shared [`Key`] by wrapping the stream in a [`SecureStream`] (Noise, see [`secure`]) before
//! framing it; the dedup channel's TCP constructors ([`DedupStream::connect`],
//! [`DedupListener::bind`]) do so unless told [`Security::InsecurePlaintext`]. The byte layout
//! is in `crates/wire/FORMAT.md`. Feature `tokio`: `AsyncDedupStream`, the channel for async
//! code.
//!
//! ```
//! use dedupwire_wire::{FrameType, Framed, Hello};
//! # use std::io::Cursor;
//! let mut link = Framed::new(Cursor::new(Vec::new()));
//! let hello = Hello::new("example", 1..=2);
//! link.send_hello(&hello).unwrap();
//! link.write_frame(FrameType(0x10), b"payload").unwrap();
//! link.get_mut().set_position(0); // read back what was written
//! let agreed = link.recv_hello(&hello).unwrap();
//! assert_eq!(agreed.version, 2);
//! assert_eq!(link.read_frame().unwrap().payload, b"payload");
//! ```
#![deny(missing_docs)]

pub mod channel;
pub mod env;
mod error;
pub mod frame;
mod handshake;
pub mod secure;
pub mod store;

#[cfg(feature = "tokio")]
pub use channel::AsyncDedupStream;
pub use channel::{
    ChannelConfig, ChannelStats, Chunker, DedupListener, DedupStream, Identifier, Mode, ReadReady,
    Registry, Role, Security, Transport,
};
pub use env::{EnvConfig, EnvStats, Environment};
pub use error::{Error, Result};
pub use frame::{
    encode_frame, Frame, FrameConfig, FrameHead, FrameReader, FrameType, FrameWriter, Framed,
};
pub use handshake::{Agreement, Hello, HELLO_FORMAT, HELLO_MAGIC};
pub use secure::{Key, KeyError, SecureStream};
pub use store::{ChunkId, ChunkStore, IdMap, MemoryStore, Sketch, StoreError, MAX_SKETCH_FEATURES};
