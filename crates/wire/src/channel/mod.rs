//! The dedup channel (TurboSockets): a message socket that sends only what the peer lacks.
//!
//! Per message, the sender cuts it into segments; per segment it sends the chunk ids of the
//! coarsest level (REQUEST), the receiver answers with a bitmap of those its chunk store holds
//! (HAVE), chunks it lacks are cut again at the next level and asked about again, and what is
//! still missing at the last level travels as a delta against a similar chunk the receiver
//! holds, or literally, compressed (DATA). The receiver checks every chunk against its id and
//! the whole message against its BLAKE3 hash before `recv` returns it, and keeps the new
//! chunks in its store, which every stream of the process shares ([`ChunkStore`]).
//! Segments are pipelined, `window` at a time; in the adaptive mode a segment goes plain
//! (compressed only) when that has been faster on this connection.
//!
//! [`DedupStream::connect`] and [`DedupListener::bind`] run over TCP, encrypted and
//! authenticated with a shared [`Key`](crate::Key) ([`Security::Key`]); plaintext takes an
//! explicit [`Security::InsecurePlaintext`] on both ends. [`DedupStream::new`] runs a channel
//! over any other byte stream.
//!
//! ```
//! use std::sync::Arc;
//! use dedupwire_wire::{ChannelConfig, DedupListener, DedupStream, Key, MemoryStore, Security};
//! let key = Key::generate().unwrap(); // or Key::load(path), shared by both ends
//! let listener = DedupListener::bind("127.0.0.1:0", Security::Key(key.clone()),
//!     Arc::new(MemoryStore::new()), ChannelConfig::default()).unwrap();
//! let addr = listener.local_addr().unwrap();
//! let server = std::thread::spawn(move || {
//!     let mut s = listener.accept().unwrap();
//!     let m = s.recv().unwrap();
//!     s.send(&m).unwrap();
//! });
//! let mut c = DedupStream::connect(addr, Security::Key(key),
//!     Arc::new(MemoryStore::new()), ChannelConfig::default()).unwrap();
//! assert!(c.get_ref().is_encrypted());
//! c.send(b"hello, channel").unwrap();
//! assert_eq!(c.recv().unwrap(), b"hello, channel");
//! server.join().unwrap();
//! ```
//!
//! [`ChunkStore`]: crate::ChunkStore

mod adaptive;
#[cfg(feature = "tokio")]
mod asynchronous;
pub mod config;
mod effort;
mod link;
mod parallel;
pub mod protocol;
mod receiver;
mod sender;
mod spare;
mod stats;
mod stream;
mod transport;

pub use self::adaptive::{Prior, PLAIN_MARGIN, PROBE_EVERY, PROBE_EVERY_MAX};
#[cfg(feature = "tokio")]
pub use self::asynchronous::AsyncDedupStream;
pub use self::config::{
    Blake3Id, ChannelConfig, Chunker, EngineChunker, Identifier, Mode, Registry, Xxh3Id,
};
pub use self::stats::ChannelStats;
pub use self::stream::{DedupListener, DedupStream, Role};
pub use self::transport::{ReadReady, Security, Transport, HANDSHAKE_TIMEOUT};
