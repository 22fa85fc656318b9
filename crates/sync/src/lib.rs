//! `dedupwire send` / `dedupwire serve`: make a directory on a receiver an exact copy of a
//! local tree, over the dedup channel, so that only contents the receiver lacks travel.
//!
//! The pieces, in the order a send uses them:
//!
//! - [`manifest`]: what a tree is (paths, kinds, modes, mtimes, sizes, BLAKE3 of contents),
//!   its versioned, checksummed encoding, and the validation a receiver relies on;
//! - [`plan`]: the old tree against the new, path by path;
//! - [`apply`]: the receiver's side — a staging tree built from local copies and received
//!   contents, each file checked against its hash, swapped in with one atomic rename, so
//!   `ROOT/NAME` is always either the old version or the new one;
//! - [`session`]: the conversation over a [`DedupStream`](dedupwire_wire::DedupStream);
//! - [`cache`]: the sender's cache of what it sent, so that a changed file travels as a
//!   delta against the version the receiver holds;
//! - [`BoundedStore`]: the sender's chunk store.
//!
//! What is preserved: file contents, permission bits (without set-user-ID / set-group-ID),
//! modification times in nanoseconds, symlinks (their target text, never followed), empty
//! directories; what the source no longer has is deleted. Not preserved: owners and groups,
//! access times, extended attributes and ACLs, hard links within the source (each path is
//! sent and written as its own file). Devices, fifos and sockets are skipped (reported by
//! [`manifest::scan`] and [`manifest::list`]). Formats: `crates/sync/FORMAT.md`.
#![deny(missing_docs)]

mod ahead;
pub mod apply;
pub mod cache;
mod error;
pub mod manifest;
mod parallel;
pub mod plan;
pub mod session;
mod store;
mod window;

pub use apply::{Peer, TreeRoot};
pub use cache::SendCache;
pub use error::{Error, Result};
pub use manifest::{Entry, Kind, Manifest};
pub use session::{send, serve, serve_on, SendOptions, SendReport, ServeReport};
pub use store::BoundedStore;
