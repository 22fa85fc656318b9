use thiserror::Error;

/// Result alias for engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an engine operation failed: corrupt input is told apart from bad configuration.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// Encoded bytes are malformed; `what` names the structure, `offset` the byte where decoding stopped.
    #[error("corrupt {what} at byte {offset}: {detail}")]
    Corrupt {
        /// The structure being decoded (e.g. "delta", "frame", "zstd block").
        what: &'static str,
        /// Byte offset into the encoded input where the problem was found.
        offset: usize,
        /// A human-readable explanation.
        detail: String,
    },
    /// A configuration value is out of its allowed range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Reading input failed (only the streaming helpers do I/O, through a caller's `Read`).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Builds a [`Error::Corrupt`] error.
    pub fn corrupt(what: &'static str, offset: usize, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            what,
            offset,
            detail: detail.into(),
        }
    }
}
