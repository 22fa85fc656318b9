//! PostgreSQL adapter: a document table's changes read by logical decoding ([`PgSource`]) and
//! applied to a second PostgreSQL database exactly once ([`PgSink`]).
//!
//! # Documents
//!
//! A document table has a column `id` that is its primary key (any type; it travels as its text
//! form) and a column `body` (`jsonb`, `json` or `text`; it travels as PostgreSQL prints it, so
//! a `jsonb` body arrives in PostgreSQL's canonical form). Other columns may exist and are not
//! replicated. A change's `collection` is the table's name, schema-qualified (`schema.table`)
//! when the schema is not `public`.
//!
//! # Server requirements (source)
//!
//! `wal_level = logical`, a free replication slot (`max_replication_slots`), and a role with the
//! `REPLICATION` attribute (or a superuser) that owns the document tables when
//! [`PgSourceConfig::replica_identity_full`] is on (the default). Changes are decoded with
//! pgoutput, the output plugin built into PostgreSQL, from a publication the source creates
//! before the slot when missing ([`PgSourceConfig::publication`]; `FOR ALL TABLES` needs a
//! superuser). The [wal2json](https://github.com/eulerto/wal2json) plugin is an option
//! ([`Plugin::Wal2Json`]) where the server has it and its `output_plugin_libraries` lists it.
//! With [`PgSourceConfig::initial_copy`] (the default), the role also creates and writes the
//! table [`COPY_TABLE`] in `public`, where a new slot's copy is remembered until acknowledged.
//!
//! # Positions
//!
//! A change's `pos` is its own WAL position (LSN) whenever that is greater than the previous
//! change's `pos`; when concurrent transactions interleaved in the WAL (a transaction that
//! committed later wrote earlier), the change gets the previous `pos` + 1 instead. Numbering is
//! a pure function of the WAL from a *restart point*: the end of a commit after which the
//! numbering is back on the WAL (the next position must be at or after that commit's end). The
//! slot is only ever advanced to such a restart point, and only once every change numbered
//! before it has been acknowledged, so a reopened source numbers every change it returns exactly
//! as before and the sink's `pos <= stored` test skips exactly what it already applied. See
//! [`PgSource`] for the details.

mod copy;
mod doc_store;
#[doc(hidden)]
pub mod pgoutput;
mod record;
pub mod server;
mod sink;
mod source;
mod wal2json;

pub use copy::COPY_TABLE;
pub use doc_store::PgDocStore;
pub use sink::{BodyType, PgSink, PgSinkConfig, POSITION_TABLE};
pub use source::{PgSource, PgSourceConfig, Plugin, Tables, LEDGER_TABLE};

use postgres::{Client, Config, GenericClient, NoTls};

/// Why a PostgreSQL source or sink failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// The connection string could not be parsed.
    #[error("invalid PostgreSQL connection string: {0}")]
    ConnectionString(#[source] postgres::Error),
    /// The server could not be reached or refused the login.
    #[error("cannot connect to PostgreSQL at {target}: {source}")]
    Connect {
        /// Host, port, database and user (never the password).
        target: String,
        /// The driver's error.
        #[source]
        source: postgres::Error,
    },
    /// A statement failed.
    #[error("PostgreSQL {context}: {source}")]
    Query {
        /// What was being done.
        context: String,
        /// The driver's error (its text includes the server's message).
        #[source]
        source: postgres::Error,
    },
    /// The server is not set up for logical decoding (wal_level, plugin, publication, slot).
    #[error("PostgreSQL setup: {0}")]
    Setup(String),
    /// A table is not a document table (missing, no `id`/`body`, `id` not the primary key).
    #[error("table {table}: {problem}")]
    Table {
        /// The table (schema-qualified).
        table: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A change that this adapter cannot turn into a document change (TRUNCATE, an update
    /// without its body, malformed plugin output).
    #[error("change at LSN {lsn}: {problem}")]
    Unsupported {
        /// The change's position, when it has one: acknowledging it skips the change.
        pos: Option<u64>,
        /// The WAL position of the change, `X/Y` as PostgreSQL prints it.
        lsn: String,
        /// What is wrong.
        problem: String,
    },
    /// A change handed to the sink is not valid (no document, not UTF-8, positions not
    /// increasing).
    #[error("invalid change at pos {pos}: {problem}")]
    InvalidChange {
        /// The change's position.
        pos: u64,
        /// What is wrong.
        problem: String,
    },
}

/// Shorthand for a failed statement.
pub(crate) fn query_err(context: impl Into<String>) -> impl FnOnce(postgres::Error) -> PgError {
    let context = context.into();
    move |source| PgError::Query { context, source }
}

/// Connects to `conn` (a `key=value` string or a `postgresql://` URL) without TLS.
pub(crate) fn connect(conn: &str, application_name: &str) -> Result<Client, PgError> {
    let mut config: Config = conn.parse().map_err(PgError::ConnectionString)?;
    if config.get_application_name().is_none() {
        config.application_name(application_name);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(std::time::Duration::from_secs(10));
    }
    config.connect(NoTls).map_err(|source| PgError::Connect {
        target: describe(&config),
        source,
    })
}

/// `host:port/dbname as user`, for messages (no password).
fn describe(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            postgres::config::Host::Tcp(name) => name.clone(),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let host = if hosts.is_empty() {
        "localhost".to_string()
    } else {
        hosts.join(",")
    };
    let ports: Vec<String> = config.get_ports().iter().map(|p| p.to_string()).collect();
    let port = if ports.is_empty() {
        "5432".to_string()
    } else {
        ports.join(",")
    };
    let user = config.get_user().unwrap_or("(default user)");
    let db = config.get_dbname().unwrap_or(user);
    format!("{host}:{port}/{db} as {user}")
}

/// Parses an LSN as PostgreSQL prints it (`16/B374D848`).
pub(crate) fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u32::from_str_radix(hi, 16).ok()?;
    let lo = u32::from_str_radix(lo, 16).ok()?;
    Some((u64::from(hi) << 32) | u64::from(lo))
}

/// Prints an LSN the way PostgreSQL does.
pub(crate) fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// Quotes an SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A table's schema and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct TableName {
    pub schema: String,
    pub table: String,
}

impl TableName {
    /// `table` is `name` or `schema.name` (split at the first dot).
    pub fn parse(table: &str) -> TableName {
        match table.split_once('.') {
            Some((schema, name)) if !schema.is_empty() && !name.is_empty() => TableName {
                schema: schema.to_string(),
                table: name.to_string(),
            },
            _ => TableName {
                schema: "public".to_string(),
                table: table.to_string(),
            },
        }
    }

    /// The change's `collection`: the bare name in `public`, else `schema.table`.
    pub fn collection(&self) -> String {
        if self.schema == "public" {
            self.table.clone()
        } else {
            format!("{}.{}", self.schema, self.table)
        }
    }

    /// `"schema"."table"`, quoted for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

/// What a document table looks like in the catalog.
#[derive(Debug, Clone)]
pub(crate) struct TableInfo {
    /// `format_type` of `id` (safe to splice into SQL as a cast target).
    pub id_type: String,
    /// `format_type` of `body`.
    pub body_type: String,
    /// `pg_class.relreplident`: `d`efault, `f`ull, `n`othing, `i`ndex.
    pub replident: char,
}

/// Looks a table up and checks that it is a document table: `Ok(None)` if it does not exist,
/// `Err(Table)` if it exists but lacks `id`/`body` or `id` is not its primary key.
pub(crate) fn inspect_table(
    client: &mut impl GenericClient,
    name: &TableName,
) -> Result<Option<TableInfo>, PgError> {
    let row = client
        .query_opt(
            "SELECT c.relreplident::text,
                    (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                      WHERE a.attrelid = c.oid AND a.attname = 'id' AND a.attnum > 0 AND NOT a.attisdropped),
                    (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                      WHERE a.attrelid = c.oid AND a.attname = 'body' AND a.attnum > 0 AND NOT a.attisdropped),
                    EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a
                              ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                             WHERE i.indrelid = c.oid AND i.indisprimary AND i.indnatts = 1
                               AND a.attname = 'id')
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'r'",
            &[&name.schema, &name.table],
        )
        .map_err(query_err(format!("looking up table {name}")))?;
    let Some(row) = row else { return Ok(None) };
    let replident: String = row.get(0);
    let id_type: Option<String> = row.get(1);
    let body_type: Option<String> = row.get(2);
    let id_is_pk: bool = row.get(3);
    let problem = |p: &str| PgError::Table {
        table: name.to_string(),
        problem: p.to_string(),
    };
    let Some(id_type) = id_type else {
        return Err(problem(
            "has no column `id` (a document table needs columns `id` and `body`)",
        ));
    };
    let Some(body_type) = body_type else {
        return Err(problem(
            "has no column `body` (a document table needs columns `id` and `body`)",
        ));
    };
    if !id_is_pk {
        return Err(problem(
            "column `id` is not its primary key (a document table needs `id` as its primary key)",
        ));
    }
    Ok(Some(TableInfo {
        id_type,
        body_type,
        replident: replident.chars().next().unwrap_or('d'),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_round_trip() {
        for lsn in [0u64, 1, 0x1_0000_0000, 0x16_B374_D848, u64::MAX] {
            assert_eq!(parse_lsn(&format_lsn(lsn)), Some(lsn));
        }
        assert_eq!(parse_lsn("0/1928D38"), Some(0x1928D38));
        assert_eq!(parse_lsn("garbage"), None);
    }

    #[test]
    fn table_names() {
        let t = TableName::parse("docs");
        assert_eq!(
            (t.schema.as_str(), t.table.as_str(), t.collection()),
            ("public", "docs", "docs".to_string())
        );
        let t = TableName::parse("app.docs");
        assert_eq!(t.collection(), "app.docs");
        assert_eq!(
            TableName::parse("we\"ird").quoted(),
            "\"public\".\"we\"\"ird\""
        );
    }
}
