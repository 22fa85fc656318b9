//! [`PgSink`]: a replica PostgreSQL database that applies changes and records its position in
//! the same transaction.

use std::collections::HashMap;

use postgres::{Client, GenericClient};

use super::{connect, inspect_table, query_err, PgError, TableInfo, TableName};
use crate::{Change, ChangeSink, Op};

/// The name of the position table in the replica database.
pub const POSITION_TABLE: &str = "dedupwire_position";

/// The type of `body` in tables the sink creates (existing tables keep theirs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BodyType {
    /// `text`: the document's bytes are kept exactly (whitespace, key order, duplicate keys),
    /// so `get` returns exactly what was applied, as the sDedup decoder needs for its delta
    /// sources. A `jsonb` source compares equal on `body::text`.
    #[default]
    Text,
    /// `jsonb`: queryable, but PostgreSQL normalizes the document (key order, whitespace,
    /// duplicate keys); exact only for documents already in PostgreSQL's canonical form, such
    /// as those a `jsonb` source table sends. Documents must be valid JSON.
    Jsonb,
}

impl BodyType {
    fn sql(self) -> &'static str {
        match self {
            BodyType::Text => "text",
            BodyType::Jsonb => "jsonb",
        }
    }
}

/// How a [`PgSink`] is set up.
#[derive(Debug, Clone)]
pub struct PgSinkConfig {
    /// The key of this replication stream in `dedupwire_position` (use the source's slot
    /// name; several streams can share a replica database).
    pub stream: String,
    /// The `body` type of tables the sink creates.
    pub body_type: BodyType,
    /// The table for changes whose collection is empty (e.g. JSON lines without `ns`).
    pub default_table: String,
}

impl Default for PgSinkConfig {
    fn default() -> Self {
        PgSinkConfig {
            stream: "dedupwire".to_string(),
            body_type: BodyType::Text,
            default_table: "documents".to_string(),
        }
    }
}

impl PgSinkConfig {
    /// The defaults with stream key `stream`.
    pub fn with_stream(stream: impl Into<String>) -> Self {
        PgSinkConfig {
            stream: stream.into(),
            ..Self::default()
        }
    }
}

/// Applies changes to document tables of a replica database, one transaction per batch, with
/// the position recorded in `dedupwire_position(slot text primary key, pos bigint)` in the
/// same transaction.
///
/// A collection `name` is the table `public.name`, `schema.name` is `schema.name` (split at the
/// first dot); missing schemas and tables are created as `(id text primary key, body text)` (or
/// `jsonb`, see [`BodyType`]). An existing table is used if it has `id` as its primary key and a
/// `body` column, whatever their types (values are cast from text).
///
/// Positions are `u64`, stored in the `bigint` column as the same 64 bits (positions past
/// `i64::MAX` read as negative in SQL, and back as the right `u64`).
pub struct PgSink {
    client: Client,
    config: PgSinkConfig,
    /// Tables known to exist, by collection.
    tables: HashMap<String, (TableName, TableInfo)>,
}

impl std::fmt::Debug for PgSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSink")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PgSink {
    /// Connects to the replica database and creates the position table if missing.
    pub fn connect(conn: &str, config: PgSinkConfig) -> Result<Self, PgError> {
        let mut client = connect(conn, "dedupwire-sink")?;
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {POSITION_TABLE} (slot text PRIMARY KEY, pos bigint NOT NULL)"
            ))
            .map_err(query_err(format!("creating {POSITION_TABLE}")))?;
        Ok(PgSink {
            client,
            config,
            tables: HashMap::new(),
        })
    }

    /// Creates the table of `collection` if missing and checks it; returns its name.
    pub fn ensure_collection(&mut self, collection: &str) -> Result<String, PgError> {
        let mut tx = self
            .client
            .transaction()
            .map_err(query_err("starting a transaction"))?;
        let (name, info) = resolve(&mut tx, &self.config, &self.tables, collection, true)?
            .expect("created tables exist");
        tx.commit().map_err(query_err("committing"))?;
        self.tables
            .insert(collection.to_string(), (name.clone(), info));
        Ok(name.to_string())
    }

    fn table_name(config: &PgSinkConfig, collection: &str) -> Result<TableName, String> {
        let name = if collection.is_empty() {
            TableName::parse(&config.default_table)
        } else {
            TableName::parse(collection)
        };
        if name.schema == "public" && name.table == POSITION_TABLE {
            return Err(format!(
                "collection {collection:?} would overwrite the position table"
            ));
        }
        Ok(name)
    }
}

/// The table of `collection`: from the cache, the catalog, or (if `create`) newly created.
fn resolve(
    client: &mut impl GenericClient,
    config: &PgSinkConfig,
    cache: &HashMap<String, (TableName, TableInfo)>,
    collection: &str,
    create: bool,
) -> Result<Option<(TableName, TableInfo)>, PgError> {
    if let Some(found) = cache.get(collection) {
        return Ok(Some(found.clone()));
    }
    let name = PgSink::table_name(config, collection).map_err(|problem| PgError::Table {
        table: collection.to_string(),
        problem,
    })?;
    if let Some(info) = inspect_table(client, &name)? {
        return Ok(Some((name, info)));
    }
    if !create {
        return Ok(None);
    }
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {table} (id text PRIMARY KEY, body {body} NOT NULL)",
            schema = super::quote_ident(&name.schema),
            table = name.quoted(),
            body = config.body_type.sql(),
        ))
        .map_err(query_err(format!("creating table {name}")))?;
    let info = inspect_table(client, &name)?.ok_or_else(|| PgError::Table {
        table: name.to_string(),
        problem: "was created but cannot be found".to_string(),
    })?;
    Ok(Some((name, info)))
}

/// Checks a batch before it touches the database: positions increase, documents are text.
fn validate(changes: &[Change]) -> Result<(), PgError> {
    let mut last: Option<u64> = None;
    for c in changes {
        let bad = |problem: String| PgError::InvalidChange {
            pos: c.pos,
            problem,
        };
        if last.is_some_and(|l| c.pos <= l) {
            return Err(bad(format!(
                "positions must increase within a batch (after {})",
                last.unwrap_or_default()
            )));
        }
        last = Some(c.pos);
        match (c.op, &c.doc) {
            (Op::Delete, _) => {}
            (_, None) => {
                return Err(bad(format!(
                    "{:?} of {}/{} has no document",
                    c.op, c.collection, c.id
                )))
            }
            (_, Some(doc)) => {
                let text = std::str::from_utf8(doc)
                    .map_err(|e| bad(format!("document is not UTF-8: {e}")))?;
                if text.contains('\0') {
                    return Err(bad(
                        "document contains a NUL character (PostgreSQL text cannot)".to_string(),
                    ));
                }
            }
        }
        if c.id.contains('\0') {
            return Err(bad("id contains a NUL character".to_string()));
        }
    }
    Ok(())
}

impl ChangeSink for PgSink {
    type Error = PgError;

    fn applied_position(&mut self) -> Result<Option<u64>, PgError> {
        let row = self
            .client
            .query_opt(
                &format!("SELECT pos FROM {POSITION_TABLE} WHERE slot = $1"),
                &[&self.config.stream],
            )
            .map_err(query_err("reading the applied position"))?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    /// One transaction: skips changes at or before the stored position, applies the final
    /// state of every document the rest touch (upsert or delete), stores the last position,
    /// commits. Creates missing tables in the same transaction.
    fn apply(&mut self, changes: &[Change]) -> Result<(), PgError> {
        validate(changes)?;
        let mut tx = self
            .client
            .transaction()
            .map_err(query_err("starting a transaction"))?;
        let stored: Option<u64> = tx
            .query_opt(
                &format!("SELECT pos FROM {POSITION_TABLE} WHERE slot = $1 FOR UPDATE"),
                &[&self.config.stream],
            )
            .map_err(query_err("reading the applied position"))?
            .map(|r| r.get::<_, i64>(0) as u64);
        let fresh: Vec<&Change> = changes
            .iter()
            .filter(|c| stored.is_none_or(|s| c.pos > s))
            .collect();
        let Some(last) = fresh.last().map(|c| c.pos) else {
            return Ok(()); // everything was applied before; the transaction rolls back
        };
        // The batch is applied atomically, so only each document's final state matters.
        let mut order: Vec<&str> = Vec::new();
        let mut finals: HashMap<&str, HashMap<&str, Option<&str>>> = HashMap::new();
        for c in &fresh {
            let docs = finals.entry(c.collection.as_str()).or_insert_with(|| {
                order.push(c.collection.as_str());
                HashMap::new()
            });
            let doc = match c.op {
                Op::Delete => None,
                // Checked by `validate`.
                _ => c.doc.as_deref().and_then(|d| std::str::from_utf8(d).ok()),
            };
            docs.insert(c.id.as_str(), doc);
        }
        let mut created = Vec::new();
        for collection in order {
            let (name, info) = resolve(&mut tx, &self.config, &self.tables, collection, true)?
                .expect("created tables exist");
            let docs = &finals[collection];
            let mut deletes: Vec<&str> = Vec::new();
            let mut ids: Vec<&str> = Vec::new();
            let mut bodies: Vec<&str> = Vec::new();
            for (id, doc) in docs {
                match doc {
                    None => deletes.push(id),
                    Some(body) => {
                        ids.push(id);
                        bodies.push(body);
                    }
                }
            }
            let table = name.quoted();
            if !deletes.is_empty() {
                tx.execute(
                    &format!(
                        "DELETE FROM {table} WHERE id = ANY($1::text[]::{}[])",
                        info.id_type
                    ),
                    &[&deletes],
                )
                .map_err(query_err(format!("deleting from {name}")))?;
            }
            if !ids.is_empty() {
                tx.execute(
                    &format!(
                        "INSERT INTO {table} (id, body)
                         SELECT u.i::{id_type}, u.b::{body_type} FROM unnest($1::text[], $2::text[]) AS u(i, b)
                         ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body",
                        id_type = info.id_type,
                        body_type = info.body_type,
                    ),
                    &[&ids, &bodies],
                )
                .map_err(query_err(format!("upserting into {name}")))?;
            }
            created.push((collection.to_string(), (name, info)));
        }
        tx.execute(
            &format!(
                "INSERT INTO {POSITION_TABLE} (slot, pos) VALUES ($1, $2)
                 ON CONFLICT (slot) DO UPDATE SET pos = EXCLUDED.pos"
            ),
            &[&self.config.stream, &(last as i64)],
        )
        .map_err(query_err("recording the applied position"))?;
        tx.commit().map_err(query_err("committing the batch"))?;
        self.tables.extend(created);
        Ok(())
    }

    fn get(&mut self, collection: &str, id: &str) -> Result<Option<Vec<u8>>, PgError> {
        let Some((name, info)) = resolve(
            &mut self.client,
            &self.config,
            &self.tables,
            collection,
            false,
        )?
        else {
            return Ok(None);
        };
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT body::text FROM {} WHERE id = $1::text::{}",
                    name.quoted(),
                    info.id_type
                ),
                &[&id],
            )
            .map_err(query_err(format!("reading {name}")))?;
        self.tables.insert(collection.to_string(), (name, info));
        Ok(row
            .and_then(|r| r.get::<_, Option<String>>(0))
            .map(String::into_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(pos: u64, op: Op, doc: Option<&[u8]>) -> Change {
        Change {
            pos,
            op,
            collection: "docs".into(),
            id: "a".into(),
            doc: doc.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn validation() {
        assert!(validate(&[
            change(1, Op::Insert, Some(b"{}")),
            change(2, Op::Delete, None)
        ])
        .is_ok());
        let e = validate(&[
            change(2, Op::Insert, Some(b"{}")),
            change(2, Op::Delete, None),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("increase"), "{e}");
        assert!(validate(&[change(1, Op::Update, None)]).is_err());
        assert!(validate(&[change(1, Op::Insert, Some(b"\xff"))]).is_err());
        assert!(validate(&[change(1, Op::Insert, Some(b"a\0b"))]).is_err());
    }

    #[test]
    fn names() {
        let config = PgSinkConfig::default();
        assert_eq!(
            PgSink::table_name(&config, "").unwrap().to_string(),
            "public.documents"
        );
        assert_eq!(
            PgSink::table_name(&config, "s.t").unwrap().to_string(),
            "s.t"
        );
        assert!(PgSink::table_name(&config, POSITION_TABLE).is_err());
    }
}
