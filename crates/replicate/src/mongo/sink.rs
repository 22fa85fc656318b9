//! [`MongoSink`]: a replica server that applies changes as full-state writes, then records the
//! position.

use std::collections::HashMap;

use mongodb::bson::{doc, Bson, Document};
use mongodb::sync::{Client, Collection, Database};

use super::{
    command_err, connect, doc_text, parse_doc, parse_id, server_refused, split_ns, MongoError,
    RETRY_PAUSE,
};
use crate::{Change, ChangeSink, Op};

/// The database of the position collection on the replica.
pub const POSITION_DATABASE: &str = "dedupwire";
/// The position collection: `{_id: stream, pos: Int64}`, one document per stream.
pub const POSITION_COLLECTION: &str = "positions";

/// Statements per `update`/`delete` command at most: FerretDB v1 keeps one SQLite connection
/// per update statement until the command ends, from a pool of 100, so a command of 100
/// updates of existing documents never completes.
const MAX_STATEMENTS: usize = 50;
/// Document bytes per command at most (well under the 16 MiB message limit).
const MAX_COMMAND_BYTES: usize = 8 << 20;

/// Applies changes to a replica over the MongoDB protocol: each document's final state in a
/// batch as a replace-with-upsert by `_id` (or a delete by `_id`), into the change's
/// `db.collection`, then the batch's last position into `dedupwire.positions`.
///
/// Not atomic (FerretDB v1 has no multi-document transactions), but idempotent: see the
/// [module](super) doc for why a replay after a crash converges exactly. Positions are `u64`,
/// stored as the same 64 bits in an Int64.
pub struct MongoSink {
    client: Client,
    stream: String,
    positions: Collection<Document>,
}

impl std::fmt::Debug for MongoSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoSink")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

/// A document's `_id` and final state in a batch (`None`: deleted).
type Final<'a> = (&'a Bson, Option<&'a Document>);

/// A change's target and final state, checked.
struct Write {
    db: String,
    coll: String,
    id: Bson,
    doc: Option<Document>,
}

/// Checks a batch before it touches the replica: positions increase, names, ids and documents
/// parse, each document's `_id` is the change's.
fn validate(changes: &[Change]) -> Result<Vec<Write>, MongoError> {
    let mut last: Option<u64> = None;
    let mut writes = Vec::with_capacity(changes.len());
    for c in changes {
        let bad = |problem: String| MongoError::InvalidChange {
            pos: c.pos,
            problem,
        };
        if let Some(l) = last.filter(|&l| c.pos <= l) {
            return Err(bad(format!(
                "positions must increase within a batch (after {l})"
            )));
        }
        last = Some(c.pos);
        let (db, coll) = split_ns(&c.collection).ok_or_else(|| {
            bad(format!(
                "collection {:?} is not a namespace `db.collection`",
                c.collection
            ))
        })?;
        if db == POSITION_DATABASE && coll == POSITION_COLLECTION {
            return Err(bad(format!(
                "collection {:?} would overwrite the positions",
                c.collection
            )));
        }
        let id = parse_id(&c.id).map_err(&bad)?;
        let doc = match (c.op, &c.doc) {
            (Op::Delete, _) => None,
            (op, None) => return Err(bad(format!("{op:?} of {} has no document", c.id))),
            (_, Some(text)) => {
                let doc = parse_doc(text).map_err(&bad)?;
                if doc.get("_id") != Some(&id) {
                    return Err(bad(format!("the document's _id is not {}", c.id)));
                }
                Some(doc)
            }
        };
        writes.push(Write {
            db: db.to_string(),
            coll: coll.to_string(),
            id,
            doc,
        });
    }
    Ok(writes)
}

/// Tries of a batch the server refused (see [`MongoSink`]'s `apply`).
const APPLY_TRIES: u32 = 3;

impl MongoSink {
    /// Connects to the replica (`url`: `mongodb://host:port/`); `stream` keys its position.
    pub fn connect(url: &str, stream: &str) -> Result<Self, MongoError> {
        let (client, _) = connect(url)?;
        let positions = client
            .database(POSITION_DATABASE)
            .collection(POSITION_COLLECTION);
        Ok(MongoSink {
            client,
            stream: stream.to_string(),
            positions,
        })
    }

    /// Runs a write command and checks its per-statement errors.
    fn write(db: &Database, command: Document, context: &str) -> Result<(), MongoError> {
        let reply = db
            .run_command(command)
            .run()
            .map_err(command_err(context))?;
        let failed = |what: &Bson| MongoError::Rejected {
            context: context.to_string(),
            detail: what.clone().into_relaxed_extjson().to_string(),
        };
        match (reply.get("writeErrors"), reply.get("writeConcernError")) {
            (Some(Bson::Array(errors)), _) if !errors.is_empty() => {
                Err(failed(&Bson::Array(errors.clone())))
            }
            (_, Some(error)) => Err(failed(error)),
            _ => Ok(()),
        }
    }

    /// [`ChangeSink::apply`], once.
    fn apply_once(&mut self, changes: &[Change]) -> Result<(), MongoError> {
        let writes = validate(changes)?;
        let stored = self.applied_position()?;
        let fresh: Vec<(&Change, &Write)> = changes
            .iter()
            .zip(&writes)
            .filter(|(c, _)| stored.is_none_or(|s| c.pos > s))
            .collect();
        let Some(last) = fresh.last().map(|(c, _)| c.pos) else {
            return Ok(());
        };
        let mut order: Vec<(&str, &str)> = Vec::new();
        let mut finals: HashMap<(&str, &str), HashMap<&str, Final>> = HashMap::new();
        for (c, w) in &fresh {
            let key = (w.db.as_str(), w.coll.as_str());
            finals
                .entry(key)
                .or_insert_with(|| {
                    order.push(key);
                    HashMap::new()
                })
                .insert(c.id.as_str(), (&w.id, w.doc.as_ref()));
        }
        for key in order {
            let docs: Vec<Final> = finals[&key].values().copied().collect();
            self.apply_collection(key.0, key.1, &docs)?;
        }
        self.positions
            .replace_one(
                doc! {"_id": &self.stream},
                doc! {"_id": &self.stream, "pos": last as i64},
            )
            .upsert(true)
            .run()
            .map_err(command_err("recording the applied position"))?;
        Ok(())
    }

    /// Upserts and deletes the final states of one collection, a few commands' worth at a time.
    fn apply_collection(&self, db: &str, coll: &str, finals: &[Final]) -> Result<(), MongoError> {
        let database = self.client.database(db);
        let mut updates: Vec<Document> = Vec::new();
        let mut deletes: Vec<Document> = Vec::new();
        let mut bytes = 0usize;
        let flush = |updates: &mut Vec<Document>, deletes: &mut Vec<Document>| {
            if !updates.is_empty() {
                Self::write(
                    &database,
                    doc! {"update": coll, "updates": std::mem::take(updates), "ordered": true},
                    &format!("upserting into {db}.{coll}"),
                )?;
            }
            if !deletes.is_empty() {
                Self::write(
                    &database,
                    doc! {"delete": coll, "deletes": std::mem::take(deletes), "ordered": true},
                    &format!("deleting from {db}.{coll}"),
                )?;
            }
            Ok::<(), MongoError>(())
        };
        for (id, doc) in finals {
            match doc {
                Some(doc) => {
                    bytes += doc_text(doc).len();
                    updates.push(
                        doc! {"q": {"_id": (*id).clone()}, "u": (*doc).clone(), "upsert": true},
                    );
                }
                None => deletes.push(doc! {"q": {"_id": (*id).clone()}, "limit": 1i32}),
            }
            if bytes >= MAX_COMMAND_BYTES || updates.len() + deletes.len() >= MAX_STATEMENTS {
                flush(&mut updates, &mut deletes)?;
                bytes = 0;
            }
        }
        flush(&mut updates, &mut deletes)
    }
}

impl ChangeSink for MongoSink {
    type Error = MongoError;

    fn applied_position(&mut self) -> Result<Option<u64>, MongoError> {
        let found = self
            .positions
            .find_one(doc! {"_id": &self.stream})
            .run()
            .map_err(command_err("reading the applied position"))?;
        let Some(found) = found else { return Ok(None) };
        match found.get("pos") {
            Some(Bson::Int64(pos)) => Ok(Some(*pos as u64)),
            _ => Err(MongoError::Reply(format!(
                "{POSITION_DATABASE}.{POSITION_COLLECTION} {:?} has no Int64 `pos`",
                self.stream
            ))),
        }
    }

    /// Skips changes at or before the recorded position, writes the final state of every
    /// document the rest touch (distinct documents, so their order does not matter), then
    /// records the last position. A batch the server refused is applied again after a pause,
    /// up to [`APPLY_TRIES`] times: writing final states and then the position makes a second
    /// apply of the same batch harmless.
    fn apply(&mut self, changes: &[Change]) -> Result<(), MongoError> {
        let mut tries = 1;
        loop {
            match self.apply_once(changes) {
                Err(e) if tries < APPLY_TRIES && server_refused(&e) => {
                    std::thread::sleep(RETRY_PAUSE * tries);
                    tries += 1;
                }
                done => return done,
            }
        }
    }

    fn get(&mut self, collection: &str, id: &str) -> Result<Option<Vec<u8>>, MongoError> {
        let (Some((db, coll)), Ok(id)) = (split_ns(collection), parse_id(id)) else {
            return Ok(None);
        };
        let doc = self
            .client
            .database(db)
            .collection::<Document>(coll)
            .find_one(doc! {"_id": id})
            .run()
            .map_err(command_err(format!("reading {collection}")))?;
        Ok(doc.as_ref().map(doc_text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(pos: u64, op: Op, id: &str, doc: Option<&str>) -> Change {
        Change {
            pos,
            op,
            collection: "app.docs".into(),
            id: id.into(),
            doc: doc.map(|d| d.as_bytes().to_vec()),
        }
    }

    #[test]
    fn validation() {
        let ok = validate(&[
            change(
                1,
                Op::Insert,
                "\"a\"",
                Some(r#"{"_id":"a","n":{"$numberInt":"1"}}"#),
            ),
            change(2, Op::Delete, "\"a\"", None),
        ])
        .unwrap();
        assert_eq!((ok[0].db.as_str(), ok[0].coll.as_str()), ("app", "docs"));
        for (changes, problem) in [
            (
                vec![
                    change(2, Op::Delete, "\"a\"", None),
                    change(2, Op::Delete, "\"a\"", None),
                ],
                "increase",
            ),
            (vec![change(1, Op::Update, "\"a\"", None)], "no document"),
            (vec![change(1, Op::Insert, "\"a\"", Some("{"))], "not JSON"),
            (vec![change(1, Op::Insert, "a", Some("{}"))], "id \"a\""),
            (
                vec![change(1, Op::Insert, "\"a\"", Some(r#"{"_id":"b"}"#))],
                "_id is not",
            ),
            (
                vec![change(1, Op::Insert, "\"a\"", Some("[1]"))],
                "not a document",
            ),
        ] {
            let e = validate(&changes).err().expect(problem).to_string();
            assert!(e.contains(problem), "{e}");
        }
        let mut c = change(1, Op::Delete, "\"a\"", None);
        c.collection = "nodot".into();
        assert!(validate(&[c.clone()]).is_err());
        c.collection = format!("{POSITION_DATABASE}.{POSITION_COLLECTION}");
        assert!(validate(&[c]).is_err());
    }
}
