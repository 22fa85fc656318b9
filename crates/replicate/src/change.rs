//! The change stream's vocabulary, shared by every adapter.

use serde::{Deserialize, Serialize};

/// What a change does to its document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A new document.
    Insert,
    /// A new full version of an existing document.
    Update,
    /// The document is gone.
    Delete,
}

/// One change from a database's change stream: the unit that is encoded, shipped and applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Position in the source's stream (an LSN, an oplog timestamp, a line number): strictly
    /// increasing, what the receiver acknowledges and a restarted sender resumes after.
    pub pos: u64,
    /// Insert, update or delete.
    pub op: Op,
    /// The table or collection.
    pub collection: String,
    /// The document's key within its collection.
    pub id: String,
    /// The full new document (JSON text) for inserts and updates; `None` for deletes.
    pub doc: Option<Vec<u8>>,
}

/// Where changes come from: a database's change stream that advances only when acknowledged.
pub trait ChangeSource {
    /// The error type of this source.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Up to `max` changes after the last acknowledged position, oldest first; empty when
    /// there is nothing new (the call may wait briefly for changes). A source may leave out
    /// changes it has already returned since the last [`rewind`](ChangeSource::rewind) (they
    /// are in flight), so that it does not read them again; the caller filters repeats.
    fn poll(&mut self, max: usize) -> Result<Vec<Change>, Self::Error>;
    /// The receiver has durably applied everything up to `pos`: the source may forget it.
    fn ack(&mut self, pos: u64) -> Result<(), Self::Error>;
    /// A new session starts: forget what was returned but not acknowledged, so the next
    /// `poll` starts again right after the last acknowledged position.
    fn rewind(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
    /// A new session starts with a replica that has applied everything up to `applied`
    /// (`None`: nothing): rewind, then acknowledge that. A source that can tell the replica
    /// has lost changes it no longer holds refuses here.
    fn resume(&mut self, applied: Option<u64>) -> Result<(), Self::Error> {
        self.rewind()?;
        match applied {
            Some(pos) => self.ack(pos),
            None => Ok(()),
        }
    }
}

/// Where changes go: a replica that applies a batch and records its position atomically.
pub trait ChangeSink {
    /// The error type of this sink.
    type Error: std::error::Error + Send + Sync + 'static;
    /// The position of the last applied change, if any: where replication resumes.
    fn applied_position(&mut self) -> Result<Option<u64>, Self::Error>;
    /// Applies `changes` in order and records the last one's position, all or nothing.
    /// Changes at or before the recorded position are skipped (exactly-once on replay).
    fn apply(&mut self, changes: &[Change]) -> Result<(), Self::Error>;
    /// The current document `id` of `collection`, used as a delta source on a cache miss.
    fn get(&mut self, collection: &str, id: &str) -> Result<Option<Vec<u8>>, Self::Error>;
}
