//! wal2json format-version 2 records and the numbering of their changes.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The plugin options every peek uses (before an optional `add-tables`).
pub(crate) const OPTIONS: [&str; 10] = [
    "format-version",
    "2",
    "include-transaction",
    "true",
    "include-xids",
    "true",
    "include-lsn",
    "true",
    "include-types",
    "false",
];

/// One column value as wal2json prints it, turned back into PostgreSQL's text output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// SQL NULL.
    Null,
    /// The type's text output (strings are unescaped; numbers and booleans verbatim).
    Text(String),
}

/// One decoded record (one row of `pg_logical_slot_peek_changes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// A transaction starts; its transaction id when wal2json printed it.
    Begin(Option<u32>),
    /// A row change (`I`, `U`, `D`) or a `T`runcate.
    Change(RowChange),
    /// A transaction ends; the row's LSN is the end of its commit record.
    Commit,
    /// Anything else (`M` logical messages): takes no position.
    Other,
}

/// A row change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowChange {
    /// `I`, `U`, `D` or `T`.
    pub action: char,
    pub schema: String,
    pub table: String,
    /// The new row (inserts, updates; unchanged TOASTed columns are missing).
    pub columns: Vec<(String, Value)>,
    /// The old key (updates, deletes), or the whole old row with REPLICA IDENTITY FULL.
    pub identity: Vec<(String, Value)>,
}

impl RowChange {
    /// The named column of the new row.
    pub fn new_value(&self, name: &str) -> Option<&Value> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The named column of the old row (identity).
    pub fn old_value(&self, name: &str) -> Option<&Value> {
        self.identity
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// Whether this is an update that changed `id` (it becomes a delete of the old key and an
    /// insert of the new one, so it takes two positions). Depends on the record alone.
    pub fn moves_key(&self) -> bool {
        self.action == 'U'
            && matches!(
                (self.old_value("id"), self.new_value("id")),
                (Some(old), Some(new)) if old != new
            )
    }

    /// How many positions the record takes.
    pub fn width(&self) -> u64 {
        if self.moves_key() {
            2
        } else {
            1
        }
    }
}

#[derive(Deserialize)]
struct RawRecord<'a> {
    action: String,
    #[serde(default)]
    xid: Option<u32>,
    #[serde(default)]
    schema: Option<String>,
    #[serde(default)]
    table: Option<String>,
    #[serde(default, borrow)]
    columns: Option<Vec<RawColumn<'a>>>,
    #[serde(default, borrow)]
    identity: Option<Vec<RawColumn<'a>>>,
}

#[derive(Deserialize)]
struct RawColumn<'a> {
    name: String,
    #[serde(borrow)]
    value: &'a RawValue,
}

fn value(raw: &RawValue) -> Result<Value, String> {
    let text = raw.get();
    if text == "null" {
        Ok(Value::Null)
    } else if text.starts_with('"') {
        serde_json::from_str::<String>(text)
            .map(Value::Text)
            .map_err(|e| format!("bad string value: {e}"))
    } else {
        // Numbers and booleans are printed verbatim from the type's output function.
        Ok(Value::Text(text.to_string()))
    }
}

fn columns(raw: Option<Vec<RawColumn<'_>>>) -> Result<Vec<(String, Value)>, String> {
    raw.unwrap_or_default()
        .into_iter()
        .map(|c| Ok((c.name, value(c.value)?)))
        .collect()
}

/// Parses one wal2json v2 record.
pub(crate) fn parse(data: &str) -> Result<Record, String> {
    let raw: RawRecord<'_> =
        serde_json::from_str(data).map_err(|e| format!("not a wal2json v2 record ({e})"))?;
    match raw.action.as_str() {
        "B" => Ok(Record::Begin(raw.xid)),
        "C" => Ok(Record::Commit),
        "I" | "U" | "D" | "T" => {
            let action = raw.action.chars().next().unwrap_or('?');
            let (Some(schema), Some(table)) = (raw.schema, raw.table) else {
                return Err(format!("{action} record without schema/table"));
            };
            Ok(Record::Change(RowChange {
                action,
                schema,
                table,
                columns: columns(raw.columns)?,
                identity: columns(raw.identity)?,
            }))
        }
        _ => Ok(Record::Other),
    }
}

/// Positions for the changes of a run of records decoded from a restart point.
///
/// `next` is the smallest position the next change may take. A change record at LSN `l`
/// taking `w` positions gets `p = max(l, next)` (and `p + 1` when `w = 2`); `next` becomes
/// `p + w`. At a commit whose end is `e`: if `next <= e`, every position handed out so far is
/// below `e` and every later record starts at or after `e`, so `next` is set to `e` and `e` is
/// a restart point: starting the numbering there (with `next = e`) gives the same positions as
/// this run. If `next > e` (interleaved transactions pushed the numbering past the commit), the
/// commit is not a restart point.
#[derive(Debug, Clone)]
pub(crate) struct Numbering {
    next: u64,
}

impl Numbering {
    /// Numbering from a restart point (the slot's `confirmed_flush_lsn`).
    pub fn new(restart: u64) -> Numbering {
        Numbering { next: restart }
    }

    /// The first of `width` positions of a change record at `lsn`.
    pub fn change(&mut self, lsn: u64, width: u64) -> u64 {
        let p = lsn.max(self.next);
        self.next = p.saturating_add(width);
        p
    }

    /// A commit ending at `end`: whether it is a restart point.
    pub fn commit(&mut self, end: u64) -> bool {
        if self.next <= end {
            self.next = end;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_records() {
        assert_eq!(
            parse(r#"{"action":"B","lsn":"0/1"}"#).unwrap(),
            Record::Begin(None)
        );
        assert_eq!(
            parse(r#"{"action":"B","xid":741,"lsn":"0/1"}"#).unwrap(),
            Record::Begin(Some(741))
        );
        assert_eq!(parse(r#"{"action":"C"}"#).unwrap(), Record::Commit);
        assert_eq!(
            parse(r#"{"action":"M","prefix":"p","content":"x"}"#).unwrap(),
            Record::Other
        );
        let r = parse(
            r#"{"action":"U","lsn":"0/1929340","schema":"public","table":"docs","columns":[{"name":"id","value":"c"},{"name":"body","value":"{\"z\": null}"},{"name":"n","value":12.50},{"name":"x","value":null}],"identity":[{"name":"id","value":"a"}]}"#,
        )
        .unwrap();
        let Record::Change(c) = r else {
            panic!("not a change")
        };
        assert_eq!(c.action, 'U');
        assert_eq!(
            c.new_value("body"),
            Some(&Value::Text("{\"z\": null}".into()))
        );
        assert_eq!(c.new_value("n"), Some(&Value::Text("12.50".into())));
        assert_eq!(c.new_value("x"), Some(&Value::Null));
        assert!(c.moves_key());
        assert_eq!(c.width(), 2);
        assert!(parse("{").is_err());
        assert!(parse(r#"{"action":"I"}"#).is_err());
    }

    #[test]
    fn numbering_follows_the_wal_and_stays_increasing() {
        // Sequential transactions: positions are the changes' LSNs.
        let mut n = Numbering::new(100);
        assert_eq!(n.change(100, 1), 100);
        assert_eq!(n.change(180, 1), 180);
        assert!(n.commit(260));
        assert_eq!(n.change(260, 1), 260);
        assert!(n.commit(400));
        // Interleaved: this transaction wrote at 120..140 but committed after 400.
        assert_eq!(n.change(120, 1), 400);
        assert_eq!(n.change(130, 2), 401);
        assert_eq!(n.change(140, 1), 403);
        assert!(n.commit(450));
        // Interleaved with many changes: the numbering passes the commit's end.
        let mut n = Numbering::new(1000);
        let ps: Vec<u64> = (0..50).map(|i| n.change(500 + i * 10, 1)).collect();
        assert!(ps.windows(2).all(|w| w[0] < w[1]));
        assert!(!n.commit(1040));
        assert_eq!(n.change(1040, 1), 1050);
        assert!(n.commit(2000));
    }

    #[test]
    fn restarting_at_a_restart_point_numbers_the_same() {
        // Records: (lsn, Some(width)) for a change, (end, None) for a commit.
        let wal: Vec<(u64, Option<u64>)> = vec![
            (10, Some(1)),
            (20, Some(2)),
            (60, None),
            (15, Some(1)),
            (16, Some(1)),
            (62, None),
            (62, Some(1)),
            (90, None),
            (70, Some(1)),
            (120, None),
        ];
        let run = |from: usize, start: u64| {
            let mut n = Numbering::new(start);
            let mut out = Vec::new();
            let mut restarts = Vec::new();
            for (i, (lsn, w)) in wal.iter().enumerate().skip(from) {
                match w {
                    Some(w) => out.push((i, n.change(*lsn, *w))),
                    None => {
                        if n.commit(*lsn) {
                            restarts.push((i + 1, *lsn));
                        }
                    }
                }
            }
            (out, restarts)
        };
        let (all, restarts) = run(0, 0);
        assert!(all.windows(2).all(|w| w[0].1 < w[1].1));
        for (from, lsn) in restarts {
            let (tail, _) = run(from, lsn);
            assert_eq!(
                &all[all.len() - tail.len()..],
                &tail[..],
                "restart at {lsn}"
            );
        }
    }
}
