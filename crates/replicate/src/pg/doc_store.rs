//! The sender's source store on PostgreSQL: current documents by (collection, id).

use std::time::{Duration, Instant};

use crate::sdedup::{FetchFailures, SourceStore};

/// A source database's documents, read by (collection, id) on a connection of its own: the
/// sender's [`SourceStore`] for [`crate::pg::PgSource`].
///
/// It reads the *current* body, which may be newer than the change being encoded; the content
/// hash in each delta makes a receiver that holds another version ask for the entry raw, so
/// this costs bytes, never correctness. Errors count as "not found" (the entry is then sent
/// whole); the connection is reopened at most once a second.
pub struct PgDocStore {
    conn: String,
    client: Option<postgres::Client>,
    tables: std::collections::HashMap<String, Option<(crate::pg::TableName, String)>>,
    retry_at: Instant,
    failures: FetchFailures,
}

impl std::fmt::Debug for PgDocStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDocStore")
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl PgDocStore {
    /// Connects to the source database (`conn` as for [`crate::pg::PgSource::connect`]).
    pub fn connect(conn: &str) -> Result<Self, crate::pg::PgError> {
        let client = crate::pg::connect(conn, "dedupwire-sender-store")?;
        Ok(PgDocStore {
            conn: conn.to_string(),
            client: Some(client),
            tables: std::collections::HashMap::new(),
            retry_at: Instant::now(),
            failures: FetchFailures::default(),
        })
    }

    fn try_fetch(
        &mut self,
        collection: &str,
        id: &str,
    ) -> Result<Option<Vec<u8>>, crate::pg::PgError> {
        if self.client.is_none() {
            if Instant::now() < self.retry_at {
                return Ok(None);
            }
            self.retry_at = Instant::now() + Duration::from_secs(1);
            self.client = Some(crate::pg::connect(&self.conn, "dedupwire-sender-store")?);
        }
        let client = self.client.as_mut().expect("connected");
        let table = match self.tables.get(collection) {
            Some(t) => t.clone(),
            None => {
                let name = crate::pg::TableName::parse(collection);
                let info = crate::pg::inspect_table(client, &name)
                    .ok()
                    .flatten()
                    .map(|info| (name, info.id_type));
                self.tables.insert(collection.to_string(), info.clone());
                info
            }
        };
        let Some((name, id_type)) = table else {
            return Ok(None);
        };
        // SQL NULL bodies travel as the JSON document `null` (as `PgSource` sends them).
        let row = client
            .query_opt(
                &format!(
                    "SELECT coalesce(body::text, 'null') FROM {} WHERE id = $1::text::{id_type}",
                    name.quoted()
                ),
                &[&id],
            )
            .map_err(crate::pg::query_err(format!("reading {name}")))?;
        Ok(row.map(|r| r.get::<_, String>(0).into_bytes()))
    }
}

impl SourceStore for PgDocStore {
    fn failures(&self) -> (u64, Option<&str>) {
        self.failures.get()
    }

    fn fetch(&mut self, collection: &str, id: &str) -> Option<Vec<u8>> {
        match self.try_fetch(collection, id) {
            Ok(doc) => doc,
            Err(e) => {
                self.failures.record(e);
                // Forget the table too: it may have changed.
                self.tables.remove(collection);
                if self.client.as_ref().is_some_and(|c| c.is_closed()) {
                    self.client = None;
                }
                None
            }
        }
    }
}
