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
