//! `dedupwire replicate`: sDedup for document databases.
//!
//! A sender tails a database's change stream ([`ChangeSource`]), encodes each change against a
//! similar document both sides hold (sketch features, feature index, source document cache,
//! delta), and ships batches with positions; a receiver decodes them and applies them to the
//! replica ([`ChangeSink`]) together with the position, so a restart resumes without loss or
//! duplication. Adapters: PostgreSQL logical decoding ([`pg`]), the MongoDB oplog
//! ([`mongo`]), JSON lines.
#![deny(missing_docs)]

pub mod change;
mod error;
pub mod jsonl;
pub mod live;
#[cfg(feature = "mongodb")]
pub mod mongo;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod protocol;
pub mod sdedup;

pub use change::{Change, ChangeSink, ChangeSource, Op};
pub use error::Error;
