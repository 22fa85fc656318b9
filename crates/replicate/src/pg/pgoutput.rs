//! pgoutput (protocol version 1) messages, read into [`Record`]s.
//!
//! pgoutput is the output plugin built into PostgreSQL, the one every server allows (the 2026
//! security releases added `output_plugin_libraries`, which refuses others by default). Its
//! messages are those of the logical replication protocol ("Logical Replication Message
//! Formats" in PostgreSQL's documentation); `pg_logical_slot_peek_binary_changes` returns one per
//! row. All integers are big-endian; a String is NUL-terminated.
//!
//! A relation's name and columns come in a Relation message (`R`) before its first change in
//! each decoding session (every peek is one), so a [`Decoder`] lives for one peek.

use std::collections::HashMap;

use super::record::{Record, RowChange, Value};

/// The plugin options every peek passes before `publication_names`.
pub(crate) const OPTIONS: [&str; 2] = ["proto_version", "1"];

/// A relation as its Relation message described it.
#[derive(Debug, Clone)]
struct Relation {
    schema: String,
    table: String,
    /// Column names with whether each is part of the replica identity key.
    columns: Vec<(String, bool)>,
}

/// Decodes the messages of one peek, in order.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    relations: HashMap<u32, Relation>,
}

/// Which tuple of an update or delete a tuple is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tuple {
    /// The new row.
    New,
    /// The old row's key columns only (`K`); the other columns are sent as NULLs.
    Key,
    /// The whole old row (`O`, REPLICA IDENTITY FULL).
    Old,
}

impl Decoder {
    /// A decoder that knows no relations yet.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Decodes one message into `out` (a truncate gives one record per table; relation, type,
    /// origin and logical messages give [`Record::Other`]).
    pub fn decode(&mut self, data: &[u8], out: &mut Vec<Record>) -> Result<(), String> {
        let mut r = Reader { data, at: 0 };
        let kind = r.u8()?;
        match kind {
            b'B' => {
                let _final_lsn = r.u64()?;
                let _commit_time = r.u64()?;
                let xid = r.u32()?;
                out.push(Record::Begin(Some(xid)));
            }
            b'C' => {
                let _flags = r.u8()?;
                let _commit_lsn = r.u64()?;
                let _end_lsn = r.u64()?;
                let _commit_time = r.u64()?;
                out.push(Record::Commit);
            }
            b'R' => {
                let id = r.u32()?;
                let schema = r.string()?;
                let table = r.string()?;
                let _identity = r.u8()?;
                let n = r.u16()?;
                let mut columns = Vec::with_capacity(usize::from(n).min(r.remaining()));
                for _ in 0..n {
                    let flags = r.u8()?;
                    let name = r.string()?;
                    let _type = r.u32()?;
                    let _typmod = r.u32()?;
                    columns.push((name, flags & 1 == 1));
                }
                let schema = if schema.is_empty() {
                    "pg_catalog".to_string()
                } else {
                    schema
                };
                self.relations.insert(
                    id,
                    Relation {
                        schema,
                        table,
                        columns,
                    },
                );
                out.push(Record::Other);
            }
            b'Y' => {
                let _oid = r.u32()?;
                let _schema = r.string()?;
                let _name = r.string()?;
                out.push(Record::Other);
            }
            b'O' => {
                let _lsn = r.u64()?;
                let _name = r.string()?;
                out.push(Record::Other);
            }
            b'M' => {
                let _flags = r.u8()?;
                let _lsn = r.u64()?;
                let _prefix = r.string()?;
                let len = r.u32()? as usize;
                r.take(len)?;
                out.push(Record::Other);
            }
            b'I' => {
                let rel = self.relation(r.u32()?)?;
                r.expect(b'N', "insert")?;
                let columns = tuple(&mut r, rel, Tuple::New)?;
                out.push(change('I', rel, columns, Vec::new()));
            }
            b'U' => {
                let rel = self.relation(r.u32()?)?;
                let mut identity = Vec::new();
                let mut tag = r.u8()?;
                if tag == b'K' || tag == b'O' {
                    let which = if tag == b'K' { Tuple::Key } else { Tuple::Old };
                    identity = tuple(&mut r, rel, which)?;
                    tag = r.u8()?;
                }
                if tag != b'N' {
                    return Err(format!(
                        "update: expected a new tuple ('N'), found byte {tag:#04x}"
                    ));
                }
                let columns = tuple(&mut r, rel, Tuple::New)?;
                out.push(change('U', rel, columns, identity));
            }
            b'D' => {
                let rel = self.relation(r.u32()?)?;
                let which = match r.u8()? {
                    b'K' => Tuple::Key,
                    b'O' => Tuple::Old,
                    other => {
                        return Err(format!(
                            "delete: expected an old tuple ('K' or 'O'), found byte {other:#04x}"
                        ))
                    }
                };
                let identity = tuple(&mut r, rel, which)?;
                out.push(change('D', rel, Vec::new(), identity));
            }
            b'T' => {
                let n = r.u32()?;
                let _options = r.u8()?;
                for _ in 0..n {
                    let rel = self.relation(r.u32()?)?;
                    out.push(change('T', rel, Vec::new(), Vec::new()));
                }
            }
            other => {
                return Err(format!(
                    "unknown pgoutput message type {:?} ({other:#04x})",
                    char::from(other)
                ))
            }
        }
        if r.remaining() != 0 {
            return Err(format!(
                "pgoutput message {:?} has {} bytes past its end",
                char::from(kind),
                r.remaining()
            ));
        }
        Ok(())
    }

    fn relation(&self, id: u32) -> Result<&Relation, String> {
        self.relations
            .get(&id)
            .ok_or_else(|| format!("a change of relation {id} before its Relation message"))
    }
}

fn change(
    action: char,
    rel: &Relation,
    columns: Vec<(String, Value)>,
    identity: Vec<(String, Value)>,
) -> Record {
    Record::Change(RowChange {
        action,
        schema: rel.schema.clone(),
        table: rel.table.clone(),
        columns,
        identity,
    })
}

/// Reads a TupleData. Unchanged TOASTed values (`u`) are left out, as are the non-key columns
/// of a key tuple, so that a missing column means "not carried" and never a NULL.
fn tuple(r: &mut Reader<'_>, rel: &Relation, which: Tuple) -> Result<Vec<(String, Value)>, String> {
    let n = usize::from(r.u16()?);
    if n != rel.columns.len() {
        return Err(format!(
            "a tuple of {}.{} has {n} columns, its Relation message {}",
            rel.schema,
            rel.table,
            rel.columns.len()
        ));
    }
    let mut out = Vec::with_capacity(n);
    for (name, key) in &rel.columns {
        let value = match r.u8()? {
            b'n' => Some(Value::Null),
            b'u' => None,
            b't' => {
                let len = r.u32()? as usize;
                let bytes = r.take(len)?;
                let text = std::str::from_utf8(bytes).map_err(|_| {
                    format!(
                        "column {name} of {}.{} is not UTF-8 (the database's encoding must be UTF8)",
                        rel.schema, rel.table
                    )
                })?;
                Some(Value::Text(text.to_string()))
            }
            b'b' => return Err("binary column values were not asked for".to_string()),
            other => return Err(format!("unknown tuple column kind {other:#04x}")),
        };
        if which == Tuple::Key && !key {
            continue;
        }
        if let Some(value) = value {
            out.push((name.clone(), value));
        }
    }
    Ok(out)
}

/// A cursor over one message that fails, never panics, past its end.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.data.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "pgoutput message cut short: {n} bytes wanted at offset {}, {} left",
                self.at,
                self.remaining()
            ));
        }
        let out = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn expect(&mut self, tag: u8, what: &str) -> Result<(), String> {
        match self.u8()? {
            t if t == tag => Ok(()),
            t => Err(format!(
                "{what}: expected {:?}, found byte {t:#04x}",
                char::from(tag)
            )),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        let rest = &self.data[self.at..];
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or("pgoutput message cut short inside a string")?;
        let s = std::str::from_utf8(&rest[..end])
            .map_err(|_| "a name in a pgoutput message is not UTF-8".to_string())?
            .to_string();
        self.at += end + 1;
        Ok(s)
    }
}

/// Fuzzing entry: decodes a sequence of length-prefixed (u32, big-endian) messages with one
/// decoder and never panics.
#[doc(hidden)]
pub fn fuzz_decode(data: &[u8]) -> usize {
    let mut decoder = Decoder::new();
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        rest = &rest[4..];
        let msg = &rest[..len.min(rest.len())];
        rest = &rest[msg.len()..];
        let _ = decoder.decode(msg, &mut out);
    }
    out.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Message builders in the protocol's layout.
    fn relation(id: u32, schema: &str, table: &str, cols: &[(&str, bool)]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        for s in [schema, table] {
            m.extend(s.as_bytes());
            m.push(0);
        }
        m.push(b'f');
        m.extend((cols.len() as u16).to_be_bytes());
        for (name, key) in cols {
            m.push(u8::from(*key));
            m.extend(name.as_bytes());
            m.push(0);
            m.extend(25u32.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    fn tuple_data(values: &[Option<&str>]) -> Vec<u8> {
        let mut m = (values.len() as u16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => m.push(b'n'),
                Some("\u{0}toast") => m.push(b'u'),
                Some(s) => {
                    m.push(b't');
                    m.extend((s.len() as u32).to_be_bytes());
                    m.extend(s.as_bytes());
                }
            }
        }
        m
    }

    fn decode_all(msgs: &[Vec<u8>]) -> Result<Vec<Record>, String> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        for m in msgs {
            d.decode(m, &mut out)?;
        }
        Ok(out)
    }

    fn text(s: &str) -> Value {
        Value::Text(s.to_string())
    }

    #[test]
    fn decodes_a_transaction() {
        let mut begin = vec![b'B'];
        begin.extend(0x1_0000_0000u64.to_be_bytes());
        begin.extend(7u64.to_be_bytes());
        begin.extend(741u32.to_be_bytes());
        let rel = relation(16384, "public", "docs", &[("id", true), ("body", false)]);
        let mut insert = vec![b'I'];
        insert.extend(16384u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(tuple_data(&[Some("a"), Some("{\"x\": 1}")]));
        // An update that moves the key, with the old row whole and the body unchanged.
        let mut update = vec![b'U'];
        update.extend(16384u32.to_be_bytes());
        update.push(b'O');
        update.extend(tuple_data(&[Some("a"), Some("{\"x\": 1}")]));
        update.push(b'N');
        update.extend(tuple_data(&[Some("c"), Some("\u{0}toast")]));
        let mut delete = vec![b'D'];
        delete.extend(16384u32.to_be_bytes());
        delete.push(b'K');
        delete.extend(tuple_data(&[Some("c"), None]));
        let mut commit = vec![b'C', 0];
        commit.extend([0u8; 24]);
        let records = decode_all(&[begin, rel, insert, update, delete, commit]).expect("decodes");
        assert_eq!(records[0], Record::Begin(Some(741)));
        assert_eq!(records[1], Record::Other);
        let Record::Change(ins) = &records[2] else {
            panic!("not a change")
        };
        assert_eq!(
            (ins.action, ins.schema.as_str(), ins.table.as_str()),
            ('I', "public", "docs")
        );
        assert_eq!(ins.new_value("body"), Some(&text("{\"x\": 1}")));
        let Record::Change(upd) = &records[3] else {
            panic!("not a change")
        };
        assert_eq!(
            upd.new_value("body"),
            None,
            "an unchanged TOASTed value is not carried"
        );
        assert_eq!(upd.old_value("body"), Some(&text("{\"x\": 1}")));
        assert!(upd.moves_key());
        let Record::Change(del) = &records[4] else {
            panic!("not a change")
        };
        assert_eq!(del.old_value("id"), Some(&text("c")));
        assert_eq!(
            del.old_value("body"),
            None,
            "a key tuple's other columns are not NULLs"
        );
        assert_eq!(records[5], Record::Commit);
    }

    #[test]
    fn truncate_names_each_table() {
        let a = relation(1, "public", "a", &[("id", true)]);
        let b = relation(2, "s", "b", &[("id", true)]);
        let mut t = vec![b'T'];
        t.extend(2u32.to_be_bytes());
        t.push(0);
        t.extend(1u32.to_be_bytes());
        t.extend(2u32.to_be_bytes());
        let records = decode_all(&[a, b, t]).expect("decodes");
        let names: Vec<_> = records[2..]
            .iter()
            .map(|r| match r {
                Record::Change(c) => (c.action, c.schema.clone(), c.table.clone()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            names,
            [
                ('T', "public".into(), "a".into()),
                ('T', "s".into(), "b".into())
            ]
        );
    }

    #[test]
    fn refuses_malformed_messages() {
        let rel = relation(5, "public", "docs", &[("id", true), ("body", false)]);
        let mut insert = vec![b'I'];
        insert.extend(5u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(tuple_data(&[Some("a"), Some("b")]));
        // Unknown relation.
        assert!(decode_all(&[insert.clone()])
            .unwrap_err()
            .contains("before its Relation"));
        // Every strict prefix fails, and so does a trailing byte.
        for cut in 0..insert.len() {
            assert!(
                decode_all(&[rel.clone(), insert[..cut].to_vec()]).is_err(),
                "cut {cut}"
            );
        }
        let mut long = insert.clone();
        long.push(0);
        assert!(decode_all(&[rel.clone(), long])
            .unwrap_err()
            .contains("past its end"));
        // A tuple whose column count disagrees with the relation.
        let mut wrong = vec![b'I'];
        wrong.extend(5u32.to_be_bytes());
        wrong.push(b'N');
        wrong.extend(tuple_data(&[Some("a")]));
        assert!(decode_all(&[rel.clone(), wrong])
            .unwrap_err()
            .contains("columns"));
        assert!(decode_all(&[vec![b'Z']]).unwrap_err().contains("unknown"));
        // A length far past the message is an error, not an allocation.
        let mut huge = vec![b'I'];
        huge.extend(5u32.to_be_bytes());
        huge.push(b'N');
        huge.extend(2u16.to_be_bytes());
        huge.push(b't');
        huge.extend(u32::MAX.to_be_bytes());
        assert!(decode_all(&[rel, huge]).unwrap_err().contains("cut short"));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            fuzz_decode(&data);
        }
    }
}
