//! The errors of tree transfers: I/O with the path it concerns, a malformed manifest, a
//! protocol violation, a refusal (bad name, busy name), the peer's own error, or the channel's.

use std::io;
use std::path::{Path, PathBuf};

/// Why a send or a receive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing `path` failed (a full disk shows up here).
    #[error("{}: {err}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// What the system said.
        err: io::Error,
    },
    /// A manifest is malformed or breaks a rule (what, and at which entry).
    #[error("malformed manifest: {0}")]
    Manifest(String),
    /// The peer broke the session protocol.
    #[error("session protocol error: {0}")]
    Protocol(String),
    /// The request cannot be served (a bad tree name, a name already being received, a
    /// source that is not a directory).
    #[error("{0}")]
    Refused(String),
    /// A file's contents do not match its manifest entry (changed while being sent, or
    /// damaged).
    #[error("{0}")]
    Mismatch(String),
    /// The peer stopped with this error.
    #[error("the other end reports: {0}")]
    Remote(String),
    /// The dedup channel failed.
    #[error(transparent)]
    Channel(#[from] dedupwire_wire::Error),
}

/// A `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error for a source file that is no longer as it was listed or hashed.
pub(crate) fn changed_while_sent(path: &Path) -> Error {
    Error::Mismatch(format!(
        "{}: changed while being sent; run the send again",
        path.display()
    ))
}

/// Wraps an `io::Error` with the path it concerns.
pub(crate) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |err| Error::Io {
        path: path.to_path_buf(),
        err,
    }
}
