//! [`MongoSource`]: document changes from a tailable cursor on `local.oplog.rs`.

use std::collections::VecDeque;
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::sync::{Client, ClientSession};

use super::oplog::{map_entry, Mapped};
use super::{
    command_err, connect, doc_text, id_text, pos_to_ts, server_refused, MongoError, RETRY_PAUSE,
};
use crate::{Change, ChangeSource, Op};

const OPLOG_DATABASE: &str = "local";
const OPLOG_COLLECTION: &str = "oplog.rs";

/// Failed `getMore`s in a row, each followed by reopening the cursor, that a read survives;
/// reopens the server refused count too.
const GET_MORE_RETRIES: u32 = 3;

/// How a [`MongoSource`] is set up.
#[derive(Debug, Clone)]
pub struct MongoSourceConfig {
    /// Replicate only this database (`None`: the database the URL names, else every database
    /// but `local`, `admin` and `config`).
    pub database: Option<String>,
    /// How long `poll` waits for a new oplog entry when there is none (the `getMore`'s
    /// `maxTimeMS` on the await-data cursor).
    pub idle_wait: Duration,
    /// Oplog entries per `getMore` at most.
    pub batch_size: u32,
}

impl Default for MongoSourceConfig {
    fn default() -> Self {
        MongoSourceConfig {
            database: None,
            idle_wait: Duration::from_millis(100),
            batch_size: 1000,
        }
    }
}

/// Document changes read from a server's oplog with a tailable, await-data cursor.
///
/// The oplog cannot be advanced by a reader, so the source keeps what it has read but not yet
/// had acknowledged in memory: `poll` returns those first, oldest first, then reads on. `ack`
/// forgets them; acknowledging a position beyond what was read (the replica's position after a
/// restart) moves the cursor to `{ts: {$gt: Timestamp(pos)}}`. A source with no acknowledged
/// position starts at the oldest entry in the oplog (the oplog holds the changes since it was
/// created, or since the server's retention dropped older ones: a replica of documents older
/// than that needs an initial copy first).
///
/// Updates the oplog records as diffs are returned with the document's current state, read
/// by `_id` (an update of a document that is gone by then becomes a delete); later entries
/// bring the same state again, which the sink applies idempotently.
pub struct MongoSource {
    client: Client,
    session: ClientSession,
    config: MongoSourceConfig,
    /// The open cursor's id.
    cursor: Option<i64>,
    /// The position of the last entry read (skipped entries included).
    read: Option<u64>,
    /// Changes read, not yet acknowledged, in order.
    pending: VecDeque<Change>,
}

impl std::fmt::Debug for MongoSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoSource")
            .field("config", &self.config)
            .field("read", &self.read)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl MongoSource {
    /// Connects (`url`: `mongodb://host:port/[db]`) and checks that the server keeps an
    /// oplog.
    pub fn connect(url: &str, mut config: MongoSourceConfig) -> Result<Self, MongoError> {
        let (client, url_db) = connect(url)?;
        if config.database.is_none() {
            config.database = url_db;
        }
        let names = client
            .database(OPLOG_DATABASE)
            .list_collection_names()
            .filter(doc! {"name": OPLOG_COLLECTION})
            .run()
            .map_err(command_err("listing the oplog collection"))?;
        if names.is_empty() {
            return Err(MongoError::Setup(format!(
                "the server keeps no oplog ({OPLOG_DATABASE}.{OPLOG_COLLECTION}): run MongoDB as \
                 a replica set; on FerretDB create the capped collection \
                 {OPLOG_DATABASE}.{OPLOG_COLLECTION} first"
            )));
        }
        let session = client
            .start_session()
            .run()
            .map_err(command_err("starting a session"))?;
        Ok(MongoSource {
            client,
            session,
            config,
            cursor: None,
            read: None,
            pending: VecDeque::new(),
        })
    }

    fn command(&mut self, command: Document, context: &str) -> Result<Document, MongoError> {
        self.client
            .database(OPLOG_DATABASE)
            .run_command(command)
            .session(&mut self.session)
            .run()
            .map_err(command_err(context))
    }

    /// Opens the cursor after the last read position; returns its first batch.
    fn open(&mut self, batch_size: u32) -> Result<Vec<Bson>, MongoError> {
        let filter = match self.read {
            Some(pos) => {
                self.check_retained(pos)?;
                doc! {"ts": {"$gt": pos_to_ts(pos)}}
            }
            None => doc! {},
        };
        let reply = self.command(
            doc! {
                "find": OPLOG_COLLECTION, "filter": filter, "tailable": true, "awaitData": true,
                "batchSize": i64::from(batch_size),
            },
            "opening a tailable cursor on the oplog",
        )?;
        self.take_batch(reply, "firstBatch")
    }

    /// Fails when the oplog no longer holds the entry at `pos` (entries after it may be lost).
    fn check_retained(&mut self, pos: u64) -> Result<(), MongoError> {
        let reply = self.command(
            doc! {"find": OPLOG_COLLECTION, "filter": {}, "limit": 1i64, "singleBatch": true,
            "projection": {"ts": 1i32}},
            "reading the oldest oplog entry",
        )?;
        let oldest = reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_array("firstBatch").ok())
            .and_then(|b| b.first())
            .and_then(Bson::as_document)
            .and_then(|d| d.get_timestamp("ts").ok());
        match oldest {
            Some(ts) if super::ts_to_pos(ts) > pos => Err(MongoError::Setup(format!(
                "the oplog has rolled past position {pos} (its oldest entry is {}): changes \
                 after it may be lost; resynchronize the replica",
                super::ts_to_pos(ts)
            ))),
            _ => Ok(()),
        }
    }

    /// The cursor's documents in `reply` (`firstBatch` or `nextBatch`); forgets a dead cursor.
    fn take_batch(&mut self, mut reply: Document, field: &str) -> Result<Vec<Bson>, MongoError> {
        let bad = |problem: &str| MongoError::Reply(format!("a cursor reply {problem}"));
        let cursor = reply
            .get_document_mut("cursor")
            .map_err(|_| bad("without `cursor`"))?;
        let id = match cursor.get("id") {
            Some(Bson::Int64(id)) => *id,
            Some(Bson::Int32(id)) => i64::from(*id),
            _ => return Err(bad("without a cursor id")),
        };
        self.cursor = (id != 0).then_some(id);
        match cursor.remove(field) {
            Some(Bson::Array(batch)) => Ok(batch),
            _ => Err(bad(&format!("without `{field}`"))),
        }
    }

    /// The next batch of the open cursor, waiting up to `wait` for one. A failed `getMore`
    /// forgets the cursor, so the next read reopens it (not killing it first: a server that is
    /// gone would hold up the reopen's error by a server-selection timeout more).
    fn get_more(
        &mut self,
        id: i64,
        batch_size: u32,
        wait: Duration,
    ) -> Result<Vec<Bson>, MongoError> {
        let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX).max(1);
        let reply = self.command(
            doc! {"getMore": id, "collection": OPLOG_COLLECTION,
            "batchSize": i64::from(batch_size), "maxTimeMS": wait_ms},
            "reading the oplog",
        );
        match reply {
            Ok(reply) => self.take_batch(reply, "nextBatch"),
            Err(e) => {
                self.cursor = None;
                Err(e)
            }
        }
    }

    /// Reads until `want` changes are pending or the oplog has nothing new. A cursor that
    /// dies under it (a restarted server, a `getMore` the server interrupted when its wait ran
    /// out, as FerretDB does) is reopened after the last entry read, which loses and repeats
    /// nothing. A reopen the server refused is tried again after a pause: FerretDB on a
    /// loaded machine interrupted the query for the oldest entry ("InternalError …
    /// interrupted"), and that ended a live replication. Only [`GET_MORE_RETRIES`] failures
    /// in a row fail, or a reopen the server did not answer (it is gone: trying again would
    /// wait out the driver's server selection once more).
    fn read_more(&mut self, want: usize) -> Result<(), MongoError> {
        let mut failures = 0;
        while self.pending.len() < want {
            let room = (want - self.pending.len()).clamp(1, self.config.batch_size.max(1) as usize);
            let batch = match self.cursor {
                None => match self.open(room as u32) {
                    Ok(batch) => batch,
                    Err(e) if failures < GET_MORE_RETRIES && server_refused(&e) => {
                        failures += 1;
                        std::thread::sleep(RETRY_PAUSE * failures);
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                Some(id) => {
                    let wait = if self.pending.is_empty() {
                        self.config.idle_wait
                    } else {
                        Duration::from_millis(1)
                    };
                    match self.get_more(id, room as u32, wait) {
                        Ok(batch) => batch,
                        Err(e) if failures >= GET_MORE_RETRIES => return Err(e),
                        Err(_) => {
                            failures += 1;
                            continue;
                        }
                    }
                }
            };
            failures = 0;
            if batch.is_empty() {
                return Ok(());
            }
            for entry in batch {
                if let Err(e) = self.take_entry(entry) {
                    // The rest of the batch is read again, from the last entry taken.
                    self.kill_cursor();
                    return Err(e);
                }
            }
            if self.cursor.is_none() {
                return Ok(());
            }
        }
        Ok(())
    }

    fn take_entry(&mut self, entry: Bson) -> Result<(), MongoError> {
        let Bson::Document(entry) = entry else {
            return Err(MongoError::Entry {
                pos: None,
                entry: format!("{entry}"),
                problem: "not a document".into(),
            });
        };
        let (pos, mapped) = map_entry(&entry, self.config.database.as_deref())?;
        if let Some(read) = self.read.filter(|&r| pos <= r) {
            return Err(MongoError::Entry {
                pos: Some(pos),
                entry: format!("at position {pos}"),
                problem: format!(
                    "comes after position {read} in the oplog: positions must increase"
                ),
            });
        }
        let change = match mapped {
            Mapped::Skip => None,
            Mapped::Change(c) => Some(c),
            Mapped::Fetch { pos, ns, id } => Some(self.current(pos, ns, id)?),
        };
        self.pending.extend(change);
        self.read = Some(pos);
        Ok(())
    }

    /// The change that sets document `id` of `ns` to its current state.
    fn current(&mut self, pos: u64, ns: String, id: Bson) -> Result<Change, MongoError> {
        let (db, coll) = super::split_ns(&ns).unwrap_or_default();
        let doc = self
            .client
            .database(db)
            .collection::<Document>(coll)
            .find_one(doc! {"_id": id.clone()})
            .run()
            .map_err(command_err(format!(
                "reading the current {ns} document {id}"
            )))?;
        Ok(Change {
            pos,
            op: if doc.is_some() {
                Op::Update
            } else {
                Op::Delete
            },
            collection: ns,
            id: id_text(&id),
            doc: doc.as_ref().map(doc_text),
        })
    }
}

impl ChangeSource for MongoSource {
    type Error = MongoError;

    fn poll(&mut self, max: usize) -> Result<Vec<Change>, MongoError> {
        self.read_more(max)?;
        Ok(self.pending.iter().take(max).cloned().collect())
    }

    fn ack(&mut self, pos: u64) -> Result<(), MongoError> {
        while self.pending.front().is_some_and(|c| c.pos <= pos) {
            self.pending.pop_front();
        }
        if self.read.is_none_or(|r| r < pos) {
            self.kill_cursor();
            self.read = Some(pos);
        }
        Ok(())
    }
}

impl MongoSource {
    fn kill_cursor(&mut self) {
        if let Some(id) = self.cursor.take() {
            let _ = self.command(
                doc! {"killCursors": OPLOG_COLLECTION, "cursors": [id]},
                "closing the oplog cursor",
            );
        }
    }
}

impl Drop for MongoSource {
    fn drop(&mut self) {
        self.kill_cursor();
    }
}
