//! Oplog entries as document changes: which entries replicate, and what each one says.

use mongodb::bson::{Bson, Document};

use super::{doc_text, id_text, split_ns, ts_to_pos, MongoError, POSITION_COLLECTION};
use super::{POSITION_DATABASE, SYSTEM_DATABASES};
use crate::{Change, Op};

/// What one oplog entry means to the replica.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mapped {
    /// Nothing: a no-op, an index build, another database, the adapter's own positions.
    Skip,
    /// A document change with its full new document (or none, for a delete).
    Change(Change),
    /// An update logged as a diff or partial `$set`: the change carries the document's
    /// current state, read from the source by `_id` (`None` if it is gone by then).
    Fetch {
        /// The entry's position.
        pos: u64,
        /// `db.collection`.
        ns: String,
        /// The document's `_id`.
        id: Bson,
    },
}

/// Commands that change no document and need nothing on the replica.
const HARMLESS_COMMANDS: &[&str] = &[
    "create",
    "createIndexes",
    "dropIndexes",
    "deleteIndexes",
    "collMod",
    "startIndexBuild",
    "commitIndexBuild",
    "abortIndexBuild",
];

/// True when changes to `ns` replicate: not a system database, not the position collection,
/// in `database` when one is given.
pub(crate) fn replicated(ns: &str, database: Option<&str>) -> bool {
    let Some((db, coll)) = split_ns(ns) else {
        return false;
    };
    let ours = db == POSITION_DATABASE && coll == POSITION_COLLECTION;
    !ours && !SYSTEM_DATABASES.contains(&db) && database.is_none_or(|d| d == db)
}

/// An entry, abbreviated for messages.
fn describe(entry: &Document) -> String {
    let text = Bson::Document(entry.clone())
        .into_relaxed_extjson()
        .to_string();
    if text.len() <= 200 {
        return text;
    }
    let mut end = 200;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Maps one oplog entry (restricted to `database` when given) to its position and meaning.
pub(crate) fn map_entry(
    entry: &Document,
    database: Option<&str>,
) -> Result<(u64, Mapped), MongoError> {
    let bad = |pos: Option<u64>, problem: String| MongoError::Entry {
        pos,
        entry: describe(entry),
        problem,
    };
    let pos = match entry.get("ts") {
        Some(Bson::Timestamp(ts)) => ts_to_pos(*ts),
        _ => return Err(bad(None, "no `ts` timestamp".into())),
    };
    let bad = |problem: &str| bad(Some(pos), problem.to_string());
    let op = entry.get_str("op").map_err(|_| bad("no `op` string"))?;
    let ns = entry.get_str("ns").map_err(|_| bad("no `ns` string"))?;
    let o = entry.get_document("o").map_err(|_| bad("no `o` document"));
    match op {
        "n" => return Ok((pos, Mapped::Skip)),
        "c" => {
            let o = o?;
            let command = o.keys().next().map(String::as_str).unwrap_or_default();
            if command == "applyOps" {
                return Err(bad(
                    "multi-document transactions (applyOps) are not supported",
                ));
            }
            let db = ns.split('.').next().unwrap_or_default();
            if !replicated(&format!("{db}.$cmd"), database) || HARMLESS_COMMANDS.contains(&command)
            {
                return Ok((pos, Mapped::Skip));
            }
            return Err(bad(&format!(
                "command {command:?} cannot be replicated as document changes"
            )));
        }
        "i" | "u" | "d" => {}
        other => return Err(bad(&format!("unknown op {other:?}"))),
    }
    if !replicated(ns, database) {
        return Ok((pos, Mapped::Skip));
    }
    let o = o?;
    let change = |op: Op, id: &Bson, doc: Option<&Document>| {
        Mapped::Change(Change {
            pos,
            op,
            collection: ns.to_string(),
            id: id_text(id),
            doc: doc.map(doc_text),
        })
    };
    let mapped = match op {
        "i" => change(
            Op::Insert,
            o.get("_id").ok_or_else(|| bad("no `o._id`"))?,
            Some(o),
        ),
        "d" => change(
            Op::Delete,
            o.get("_id").ok_or_else(|| bad("no `o._id`"))?,
            None,
        ),
        _ => {
            let id = entry
                .get_document("o2")
                .ok()
                .and_then(|o2| o2.get("_id"))
                .ok_or_else(|| bad("an update without `o2._id`"))?;
            match full_document(o, id) {
                Some(doc) => change(Op::Update, id, Some(&doc)),
                None => Mapped::Fetch {
                    pos,
                    ns: ns.to_string(),
                    id: id.clone(),
                },
            }
        }
    };
    Ok((pos, mapped))
}

/// The whole new document when an update's `o` holds it: a replacement (no operator), or
/// `{$v: 1, $set: D}` with `D._id` the document's `_id` (how FerretDB logs every update).
/// `None` for diffs (`$v: 2`) and partial `$set`/`$unset` updates.
fn full_document(o: &Document, id: &Bson) -> Option<Document> {
    if !o.keys().any(|k| k.starts_with('$')) {
        if o.contains_key("_id") {
            return Some(o.clone());
        }
        let mut doc = Document::new();
        doc.insert("_id", id.clone());
        doc.extend(o.clone());
        return Some(doc);
    }
    let version_one = match o.get("$v") {
        None => true,
        Some(Bson::Int32(v)) => *v == 1,
        Some(Bson::Int64(v)) => *v == 1,
        Some(Bson::Double(v)) => *v == 1.0,
        Some(_) => false,
    };
    let only_set = o.keys().all(|k| k == "$v" || k == "$set");
    match o.get("$set") {
        Some(Bson::Document(set)) if version_one && only_set && set.get("_id") == Some(id) => {
            Some(set.clone())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{doc, Timestamp};

    const TS: Timestamp = Timestamp {
        time: 1_700_000_000,
        increment: 3,
    };

    fn pos() -> u64 {
        ts_to_pos(TS)
    }

    fn changed(m: Mapped) -> Change {
        match m {
            Mapped::Change(c) => c,
            other => panic!("not a change: {other:?}"),
        }
    }

    #[test]
    fn inserts_deletes_and_ferretdb_updates() {
        let body = doc! {"_id": "a", "n": 1i64, "text": "hello"};
        let (p, m) = map_entry(
            &doc! {"ts": TS, "op": "i", "ns": "app.docs", "o": body.clone()},
            None,
        )
        .unwrap();
        assert_eq!(p, pos());
        let c = changed(m);
        assert_eq!(
            (c.op, c.collection.as_str(), c.id.as_str()),
            (Op::Insert, "app.docs", "\"a\"")
        );
        assert_eq!(c.doc.as_deref(), Some(doc_text(&body).as_slice()));
        let update = doc! {"ts": TS, "op": "u", "ns": "app.docs", "o2": {"_id": "a"},
        "o": {"$v": 1i32, "$set": body.clone()}};
        let c = changed(map_entry(&update, None).unwrap().1);
        assert_eq!(c.op, Op::Update);
        assert_eq!(c.doc.as_deref(), Some(doc_text(&body).as_slice()));
        let replacement = doc! {"ts": TS, "op": "u", "ns": "app.docs", "o2": {"_id": "a"},
        "o": {"n": 1i64, "text": "hello"}};
        let c = changed(map_entry(&replacement, None).unwrap().1);
        assert_eq!(c.doc.as_deref(), Some(doc_text(&body).as_slice()));
        let delete = doc! {"ts": TS, "op": "d", "ns": "app.docs", "o": {"_id": "a"}};
        let c = changed(map_entry(&delete, None).unwrap().1);
        assert_eq!((c.op, c.doc), (Op::Delete, None));
    }

    #[test]
    fn mongodb_diff_updates_fall_back_to_a_fetch() {
        let diff = doc! {"ts": TS, "op": "u", "ns": "app.docs", "o2": {"_id": 7i32},
        "o": {"$v": 2i32, "diff": {"u": {"n": 2i64}, "stext": {"i": "x"}}}};
        assert_eq!(
            map_entry(&diff, None).unwrap(),
            (
                pos(),
                Mapped::Fetch {
                    pos: pos(),
                    ns: "app.docs".into(),
                    id: Bson::Int32(7)
                }
            )
        );
        let partial = doc! {"ts": TS, "op": "u", "ns": "app.docs", "o2": {"_id": 7i32},
        "o": {"$v": 1i32, "$set": {"n": 2i64}}};
        assert!(matches!(
            map_entry(&partial, None).unwrap().1,
            Mapped::Fetch { .. }
        ));
        let unset = doc! {"ts": TS, "op": "u", "ns": "app.docs", "o2": {"_id": 7i32},
        "o": {"$v": 1i32, "$set": {"_id": 7i32}, "$unset": {"n": true}}};
        assert!(matches!(
            map_entry(&unset, None).unwrap().1,
            Mapped::Fetch { .. }
        ));
    }

    #[test]
    fn skips_what_does_not_replicate() {
        for (op, ns) in [
            ("i", "local.x"),
            ("i", "admin.x"),
            ("i", "config.x"),
            ("i", "dedupwire.positions"),
            ("i", "other.docs"),
            ("n", ""),
        ] {
            let e = doc! {"ts": TS, "op": op, "ns": ns, "o": {"_id": 1i32}};
            assert_eq!(
                map_entry(&e, Some("app")).unwrap().1,
                Mapped::Skip,
                "{op} {ns}"
            );
        }
        let create = doc! {"ts": TS, "op": "c", "ns": "app.$cmd", "o": {"create": "docs"}};
        assert_eq!(map_entry(&create, None).unwrap().1, Mapped::Skip);
    }

    #[test]
    fn malformed_and_unsupported_entries_are_errors_naming_the_entry() {
        for (entry, problem) in [
            (doc! {"op": "i", "ns": "a.b", "o": {"_id": 1i32}}, "no `ts`"),
            (doc! {"ts": TS, "ns": "a.b", "o": {"_id": 1i32}}, "no `op`"),
            (
                doc! {"ts": TS, "op": "i", "ns": "a.b", "o": {"x": 1i32}},
                "no `o._id`",
            ),
            (
                doc! {"ts": TS, "op": "u", "ns": "a.b", "o": {"x": 1i32}},
                "o2._id",
            ),
            (doc! {"ts": TS, "op": "i", "ns": "a.b"}, "no `o`"),
            (
                doc! {"ts": TS, "op": "q", "ns": "a.b", "o": {}},
                "unknown op",
            ),
            (
                doc! {"ts": TS, "op": "c", "ns": "admin.$cmd", "o": {"applyOps": []}},
                "applyOps",
            ),
            (
                doc! {"ts": TS, "op": "c", "ns": "a.$cmd", "o": {"drop": "b"}},
                "\"drop\"",
            ),
        ] {
            let e = map_entry(&entry, None).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(problem), "{text}");
            assert!(text.starts_with("oplog entry {"), "{text}");
        }
    }
}
