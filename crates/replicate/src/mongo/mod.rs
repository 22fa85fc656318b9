//! MongoDB adapter: a server's oplog (`local.oplog.rs`) tailed as a change stream
//! ([`MongoSource`]) and applied to a second server over the MongoDB protocol exactly once
//! ([`MongoSink`]). Tested against FerretDB v1.24 (SQLite backend, see [`server`]); it uses only
//! standard MongoDB commands, so it works against MongoDB itself.
//!
//! # Text forms
//!
//! A change's `collection` is the namespace `db.collection` (the sink writes into the same
//! database and collection, splitting at the first dot). Its `id` is the document's `_id` as
//! *canonical* Extended JSON (`"abc"`, `{"$oid":"…"}`, `{"$numberInt":"5"}`), so an `_id` of any
//! BSON type travels as text and parses back to the same value. Its `doc` is the whole document
//! as canonical Extended JSON v2, fields in BSON order, no whitespace: canonical because relaxed
//! JSON would turn an Int64 into a number the sink might read back as an Int32 or a Double.
//! Both ends print documents with the same function ([`doc_text`]), so the same BSON gives the
//! same bytes on the source and on the replica: the content hashes the sDedup decoder checks
//! on its delta sources match.
//!
//! # Positions
//!
//! A change's `pos` is its oplog entry's `ts` (a BSON Timestamp `(t, i)`) as `(t << 32) | i`:
//! strictly increasing in oplog order. The oplog cannot be advanced by a consumer, so the
//! source keeps "resume after `pos`" in memory and tails `{ts: {$gt: Timestamp(pos)}}`; after a
//! restart the *replica's* applied position (the receiver reports it in the handshake, the
//! sender acknowledges the source up to it) says where to resume.
//!
//! # Exactly once
//!
//! FerretDB v1 has no multi-document transactions, so the sink cannot write a batch and its
//! position atomically. Every applied operation is instead a full-state operation: an insert
//! or update replaces the whole document by `_id` with upsert, a delete deletes by `_id`.
//! Applying a suffix of a change stream to a state that already reflects a prefix of it
//! therefore converges to the same state as applying the stream once. The sink writes a
//! batch's operations in order, then its last position (`dedupwire.positions`, keyed by stream
//! name); a crash in between leaves the old position, and the replay of the batch re-writes the
//! same final states. Changes at or before the recorded position are skipped.
//!
//! # Server requirements
//!
//! MongoDB keeps an oplog only as a replica set member: run the source as a replica set (a
//! single-node `--replSet rs0` after `rs.initiate()` will do) and connect with
//! `?directConnection=true` or the set name. The oplog must keep every change the replica has
//! not applied yet (size it for the longest outage); the source fails when it has rolled past
//! the resume position. On FerretDB v1, create the capped collection `local.oplog.rs` before
//! the writes to replicate ([`server::FerretServer`] does); it records inserts (full document),
//! updates (`$set` of the whole new document) and deletes. Updates MongoDB logs as diffs
//! (`$v: 2`) or partial `$set`s are replicated as the document's current state, read from the
//! source by `_id`. Multi-document transactions (`applyOps`), collection drops and renames are
//! not supported: the source fails on them, naming the entry. TLS is available (`?tls=true`,
//! rustls); `mongodb+srv://` URLs are not (no DNS resolver is built in).

mod doc_store;
mod oplog;
pub mod server;
mod sink;
mod source;

pub use doc_store::MongoDocStore;
pub use sink::{MongoSink, POSITION_COLLECTION, POSITION_DATABASE};
pub use source::{MongoSource, MongoSourceConfig};

use mongodb::bson::{Bson, Document, Timestamp};
use mongodb::sync::Client;

/// Databases whose changes never replicate (the server's own).
pub(crate) const SYSTEM_DATABASES: &[&str] = &["local", "admin", "config"];

/// Why a MongoDB source or sink failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MongoError {
    /// The connection string could not be parsed or the client not built.
    #[error("invalid MongoDB connection string {url:?}: {source}")]
    ConnectionString {
        /// The URL, without its password.
        url: String,
        /// The driver's error.
        #[source]
        source: mongodb::error::Error,
    },
    /// A command failed (includes the server's message).
    #[error("MongoDB {context}: {source}")]
    Command {
        /// What was being done.
        context: String,
        /// The driver's error.
        #[source]
        source: mongodb::error::Error,
    },
    /// The server is not set up for tailing (no oplog, oplog rolled past the position).
    #[error("MongoDB setup: {0}")]
    Setup(String),
    /// The server refused some of a write command's statements.
    #[error("MongoDB {context} was refused: {detail}")]
    Rejected {
        /// What was being done.
        context: String,
        /// The server's write errors, as JSON.
        detail: String,
    },
    /// A server's reply lacks what the command promises (a cursor without an id, a batch).
    #[error("unexpected MongoDB reply: {0}")]
    Reply(String),
    /// An oplog entry this adapter cannot turn into a document change.
    #[error("oplog entry {entry}: {problem}")]
    Entry {
        /// The entry's position, when it has one: acknowledging it skips the entry.
        pos: Option<u64>,
        /// The entry, abbreviated.
        entry: String,
        /// What is wrong.
        problem: String,
    },
    /// A change handed to the sink is not valid (no document, bad text, positions not
    /// increasing).
    #[error("invalid change at pos {pos}: {problem}")]
    InvalidChange {
        /// The change's position.
        pos: u64,
        /// What is wrong.
        problem: String,
    },
}

/// Whether `e` is the server's answer to a command: it is up, and may answer a second try
/// (FerretDB on a loaded machine interrupts queries: "InternalError … interrupted").
pub(crate) fn server_refused(e: &MongoError) -> bool {
    matches!(e, MongoError::Command { source, .. }
        if matches!(*source.kind, mongodb::error::ErrorKind::Command(_)))
}

/// The pause before the n-th try of a command the server refused: n times this.
pub(crate) const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Shorthand for a failed command.
pub(crate) fn command_err(
    context: impl Into<String>,
) -> impl FnOnce(mongodb::error::Error) -> MongoError {
    let context = context.into();
    move |source| MongoError::Command { context, source }
}

/// A client for `url` (`mongodb://host:port/[db]`) and the database the URL names, if any.
pub(crate) fn connect(url: &str) -> Result<(Client, Option<String>), MongoError> {
    let bad = |source| MongoError::ConnectionString {
        url: redact(url),
        source,
    };
    let options = mongodb::options::ClientOptions::parse(url)
        .run()
        .map_err(bad)?;
    let db = options.default_database.clone();
    let client = Client::with_options(options).map_err(bad)?;
    Ok((client, db))
}

/// `url` without the password of its user info.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = &url[scheme + 3..at];
            let user = user.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// An oplog timestamp as a position: `(t << 32) | i`.
pub fn ts_to_pos(ts: Timestamp) -> u64 {
    (u64::from(ts.time) << 32) | u64::from(ts.increment)
}

/// A position as the oplog timestamp it came from.
pub fn pos_to_ts(pos: u64) -> Timestamp {
    Timestamp {
        time: (pos >> 32) as u32,
        increment: pos as u32,
    }
}

/// A document as the bytes that travel: canonical Extended JSON, compact, fields in order.
pub fn doc_text(doc: &Document) -> Vec<u8> {
    Bson::Document(doc.clone())
        .into_canonical_extjson()
        .to_string()
        .into_bytes()
}

/// An `_id` as a change's `id`: its canonical Extended JSON.
pub fn id_text(id: &Bson) -> String {
    id.clone().into_canonical_extjson().to_string()
}

/// Parses a change's `id` back into the `_id` value.
pub fn parse_id(text: &str) -> Result<Bson, String> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("id {text:?} is not JSON: {e}"))?;
    Bson::try_from(json).map_err(|e| format!("id {text:?} is not Extended JSON: {e}"))
}

/// Parses a change's document text back into BSON.
pub fn parse_doc(text: &[u8]) -> Result<Document, String> {
    let json: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format!("document is not JSON: {e}"))?;
    match Bson::try_from(json) {
        Ok(Bson::Document(d)) => Ok(d),
        Ok(other) => Err(format!(
            "document is a {:?}, not a document",
            other.element_type()
        )),
        Err(e) => Err(format!("document is not Extended JSON: {e}")),
    }
}

/// Splits a namespace `db.collection` at its first dot.
pub(crate) fn split_ns(ns: &str) -> Option<(&str, &str)> {
    ns.split_once('.')
        .filter(|(db, coll)| !db.is_empty() && !coll.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{doc, oid::ObjectId, DateTime};
    use mongodb::error::{CommandError, Error, ErrorKind};

    fn command_failed(code: i32, name: &str) -> MongoError {
        let reply: CommandError = mongodb::bson::from_document(
            doc! {"code": code, "codeName": name, "errmsg": "interrupted (9)"},
        )
        .unwrap();
        command_err("reading the oldest oplog entry")(Error::from(ErrorKind::Command(reply)))
    }

    #[test]
    fn only_a_command_the_server_refused_is_tried_again() {
        assert!(server_refused(&command_failed(1, "InternalError")));
        assert!(server_refused(&command_failed(50, "MaxTimeMSExpired")));
        let gone = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(!server_refused(&command_err(
            "opening a tailable cursor on the oplog"
        )(Error::from(ErrorKind::Io(
            std::sync::Arc::new(gone)
        )))));
        assert!(!server_refused(&MongoError::Setup(
            "the oplog has rolled past position 7".into()
        )));
        assert!(!server_refused(&MongoError::Reply(
            "a cursor reply without `cursor`".into()
        )));
    }

    #[test]
    fn documents_round_trip_exactly() {
        let d = doc! {
            "_id": ObjectId::parse_str("65a1b2c3d4e5f60718293a4b").unwrap(),
            "z": 1i32, "a": 2i64, "f": 2.0f64, "neg0": -0.0f64,
            "when": DateTime::from_millis(1_700_000_000_123),
            "s": "tab\t\"quote\" é", "nested": { "b": [1i32, "x", Bson::Null] },
            "ts": Timestamp { time: 5, increment: 7 },
        };
        let text = doc_text(&d);
        assert_eq!(parse_doc(&text).unwrap(), d);
        assert_eq!(doc_text(&parse_doc(&text).unwrap()), text);
        assert!(text.starts_with(b"{\"_id\":{\"$oid\""), "{text:?}");
    }

    #[test]
    fn ids_round_trip() {
        for id in [
            Bson::String("abc".into()),
            Bson::Int32(5),
            Bson::Int64(5),
            Bson::Double(5.0),
            Bson::ObjectId(ObjectId::new()),
            Bson::Document(doc! {"k": 1i32, "j": "x"}),
        ] {
            assert_eq!(parse_id(&id_text(&id)).unwrap(), id);
        }
        assert_eq!(id_text(&Bson::String("a".into())), "\"a\"");
        assert!(parse_id("{not json").is_err());
    }

    #[test]
    fn positions_and_names() {
        let ts = Timestamp {
            time: 1_700_000_000,
            increment: 42,
        };
        assert_eq!(pos_to_ts(ts_to_pos(ts)), ts);
        assert!(
            ts_to_pos(ts)
                < ts_to_pos(Timestamp {
                    increment: 43,
                    ..ts
                })
        );
        assert_eq!(split_ns("db.a.b"), Some(("db", "a.b")));
        assert_eq!(split_ns("nodot"), None);
        assert_eq!(
            redact("mongodb://u:secret@h:1/db"),
            "mongodb://u:***@h:1/db"
        );
    }
}
