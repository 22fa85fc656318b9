//! Errors of the feature index.

use std::path::PathBuf;

/// Result alias for feature index operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a feature index operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file operation failed.
    #[error("I/O error ({op}) on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done ("read", "write", "fsync", …).
        op: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Bytes on disk that were once made durable are damaged; the index will not trust them.
    #[error("corrupt feature index file {path} at byte {offset}: {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte offset of the damaged entry or header.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A configuration value is out of its allowed range.
    #[error("invalid feature index configuration: {0}")]
    Config(String),
    /// The log reached the 32 GiB its 32-bit pointers can address, even after compaction.
    #[error("feature index log {path} is full (32 GiB of live entries)")]
    LogFull {
        /// The log file.
        path: PathBuf,
    },
}

impl Error {
    /// Wraps an I/O error with the path and operation it came from.
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            op,
            source,
        }
    }

    /// Builds a [`Error::Corrupt`].
    pub(crate) fn corrupt(
        path: impl Into<PathBuf>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Error {
        Error::Corrupt {
            path: path.into(),
            offset,
            reason: reason.into(),
        }
    }
}
