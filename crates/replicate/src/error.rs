//! Errors of the replication layer.

/// Why replication stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Encoded bytes are malformed.
    #[error("corrupt replication stream at byte {offset}: {detail}")]
    Corrupt {
        /// Byte offset in the stream.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// Encoded bytes stop before the stream's end: it was cut short.
    #[error("{detail}: truncated (at byte {offset})")]
    Truncated {
        /// Byte offset where the bytes ran out.
        offset: u64,
        /// What was being read.
        detail: String,
    },
    /// Encoded bytes in a format version this build does not read.
    #[error("unsupported replication stream: {0}")]
    Unsupported(String),
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An input line or document is not what the adapter expects.
    #[error("bad input at {at}: {detail}")]
    Input {
        /// Where (e.g. "line 12").
        at: String,
        /// What is wrong.
        detail: String,
    },
    /// The sender's similarity state (feature index, document table) failed.
    #[error("replication state: {0}")]
    State(String),
    /// Reading or writing failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}
