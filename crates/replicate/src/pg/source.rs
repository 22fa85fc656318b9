//! [`PgSource`]: a document table's changes from a logical replication slot (pgoutput, or
//! wal2json where the server allows it).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use postgres::Client;

use super::copy::{Snapshot, COPY_TABLE};
use super::record::{Numbering, Record, RowChange, Value};
use super::{
    connect, format_lsn, inspect_table, parse_lsn, query_err, PgError, TableInfo, TableName,
};
use super::{pgoutput, wal2json};
use crate::{Change, ChangeSource, Op};

/// Which tables a [`PgSource`] replicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Tables {
    /// Every plain table that has a column `body` and a column `id` that is its primary key,
    /// including tables created after the source was opened (looked up when their first
    /// change is seen).
    #[default]
    All,
    /// These tables (`name` for `public.name`, or `schema.name`), checked when the source
    /// opens: each must exist and have `id` (its primary key) and `body`. Only their changes
    /// are decoded (the publication lists them; wal2json `add-tables`).
    Only(Vec<String>),
}

/// The output plugin a new slot decodes with (an existing slot keeps the one it was made with).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Plugin {
    /// `pgoutput`, built into PostgreSQL and allowed by every server: changes of the tables in
    /// a publication.
    #[default]
    PgOutput,
    /// The `wal2json` extension, where the server has it and its `output_plugin_libraries`
    /// lists it.
    Wal2Json,
}

impl Plugin {
    /// The plugin's name in `pg_replication_slots`.
    pub fn name(self) -> &'static str {
        match self {
            Plugin::PgOutput => "pgoutput",
            Plugin::Wal2Json => "wal2json",
        }
    }

    fn from_name(name: &str) -> Option<Plugin> {
        match name {
            "pgoutput" => Some(Plugin::PgOutput),
            "wal2json" => Some(Plugin::Wal2Json),
            _ => None,
        }
    }
}

/// How a [`PgSource`] is set up.
#[derive(Debug, Clone)]
pub struct PgSourceConfig {
    /// The logical replication slot (created with [`PgSourceConfig::plugin`] if missing). One
    /// slot per replica; only the source advances it.
    pub slot: String,
    /// The plugin a slot this source creates decodes with.
    pub plugin: Plugin,
    /// The publication a pgoutput slot reads (`None`: named like the slot). Created if missing,
    /// before the slot: `FOR ALL TABLES` for [`Tables::All`] (needs a superuser), else
    /// `FOR TABLE` the listed tables. An existing publication is used as it is.
    pub publication: Option<String>,
    /// Which tables to replicate.
    pub tables: Tables,
    /// Set `REPLICA IDENTITY FULL` on every replicated table that does not have it (needs the
    /// table's owner). Without it an update that leaves a large (TOASTed) body unchanged, e.g.
    /// one that changes another column or only the key, carries no body and `poll` fails.
    pub replica_identity_full: bool,
    /// Skip `TRUNCATE`s of replicated tables instead of failing on them (a truncate names no
    /// documents, so the replica would keep the rows).
    pub skip_truncate: bool,
    /// How long `poll` waits for a change when there is none (once, then returns empty).
    pub idle_wait: Duration,
    /// When this source creates the slot, first return the rows the tables already hold, as
    /// inserts positioned before the stream (see [`PgSource`], *Initial copy*).
    pub initial_copy: bool,
}

impl Default for PgSourceConfig {
    fn default() -> Self {
        PgSourceConfig {
            slot: "dedupwire".to_string(),
            plugin: Plugin::PgOutput,
            publication: None,
            tables: Tables::All,
            replica_identity_full: true,
            skip_truncate: false,
            idle_wait: Duration::from_millis(100),
            initial_copy: true,
        }
    }
}

impl PgSourceConfig {
    /// The defaults with slot `slot`.
    pub fn with_slot(slot: impl Into<String>) -> Self {
        PgSourceConfig {
            slot: slot.into(),
            ..Self::default()
        }
    }
}

/// A restart point seen in the last decoded window: the slot may move to `lsn` once every
/// change numbered before it (the last of which is `covered`) is acknowledged.
#[derive(Debug, Clone, Copy)]
struct Restart {
    covered: Option<u64>,
    lsn: u64,
}

/// One row of a peek: its LSN and the plugin's output.
type Row = (u64, Vec<u8>);

/// A change, or why the record at `pos` cannot be one.
type Item = Result<Change, (u64, PgError)>;

/// Rows per `FETCH` of the initial copy.
const COPY_FETCH: usize = 1000;

/// Where the initial copy stands in this source.
enum CopyPhase {
    /// No copy to make (none was asked for, or it is acknowledged).
    Idle,
    /// A copy is owed to the replica: it starts (again) at the next `poll`.
    Pending,
    /// Copying in a repeatable-read transaction on its own connection: the tables left (the
    /// first with an open cursor when `open`) and the next position (set at the first `poll`,
    /// from the replica's position).
    Running {
        client: Box<Client>,
        tables: VecDeque<TableName>,
        open: bool,
        next: Option<u64>,
    },
    /// Every row was returned; the copy is done once `last` is acknowledged. After a rewind
    /// (`rewound`), the next `poll` starts it again unless an `ack` completed it first.
    Sent { last: u64, rewound: bool },
}

/// About how many bytes of plugin output one peek reads: polls are served from them, so the
/// changes in flight (re-read by every peek, which starts at the slot) are a small part of it.
const PEEK_BYTES: usize = 64 << 20;

/// Changes of document tables read from a logical replication slot with the pgoutput plugin
/// (or wal2json, see [`Plugin`]).
///
/// `poll` *peeks* (`pg_logical_slot_peek_binary_changes`), so nothing is consumed: the slot
/// keeps every change until `ack`, and a source reopened after a crash (or [`rewind`]) returns
/// the unacknowledged changes again, with the same positions. A peek reads a large window
/// (about 64 MB of plugin output) that later polls are served from; a change once returned is not
/// returned again until `rewind`, so the batches in flight are not shipped twice.
///
/// [`rewind`]: ChangeSource::rewind
///
/// **Initial copy.** When the source creates the slot (and [`PgSourceConfig::initial_copy`] is
/// on), it owes the replica the rows the tables already hold: the first `poll`s return every
/// row of every document table as an insert, read in one repeatable-read snapshot taken after
/// the slot was created, at positions from just after the replica's position (1 for an empty
/// replica) up to below the slot's start, so they come before every change of the stream. A
/// transaction that committed after the slot's start but before the snapshot is in both; the
/// stream leaves out every transaction the snapshot sees (by transaction id, wal2json
/// and pgoutput both carry it), so each change reaches the replica once, through the copy or the stream.
/// The debt and that first snapshot are kept in the source table `dedupwire_copy` (see
/// [`COPY_TABLE`]) until the copy is acknowledged whole. A copy cut off by a restart starts
/// again from the beginning in a new snapshot, at positions after the replica's: rows copied
/// twice are upserts of the same key, and the stream, still filtered by the first snapshot,
/// holds every change after it, so the replica converges on the source exactly (while it
/// catches up to the new snapshot, a row may show a newer version and then older ones).
///
/// **Positions.** A change's `pos` is its own LSN when that is greater than the previous
/// change's `pos`, else the previous `pos` + 1: changes come in commit order, and a transaction
/// that committed later may have written earlier than one before it (interleaved
/// transactions), so raw LSNs would go backwards. An update that changes `id` becomes a delete
/// of the old key at `pos` and an insert of the new one at `pos + 1`. The end of a commit after
/// which numbering is back on the WAL (the next `pos` is at least that LSN: always so unless
/// interleaving pushed positions past it) is a *restart point*; numbering from it gives the same
/// positions as numbering from any earlier restart point. The slot's `confirmed_flush_lsn` only
/// ever moves to restart points.
///
/// **Acknowledging.** `ack(pos)` moves the slot to the last restart point all of whose changes
/// are at or before `pos` (a transaction is only released whole; acknowledging part of one
/// keeps it in the slot, and `poll` then skips its acknowledged changes). Transactions with no
/// change to a replicated table are released as soon as everything before them is.
///
/// After a restart, call `ack(sink.applied_position())` before the first `poll` to skip what
/// the replica already has (or let the sink skip it: it ignores positions at or before its
/// own). Do not advance or consume the slot by other means while a replica depends on it.
pub struct PgSource {
    client: Client,
    /// The connection string, for the copy's own connection.
    conn: String,
    config: PgSourceConfig,
    /// The initial copy's state.
    copy: CopyPhase,
    /// Transactions the first copy holds, left out of the stream; and the WAL position
    /// after which none of them can be.
    filter: Option<(Snapshot, u64)>,
    /// The slot's plugin (read from the slot once it exists).
    plugin: Plugin,
    /// wal2json `add-tables` for [`Tables::Only`].
    add_tables: Option<String>,
    /// Document tables by name; `None` = seen, not a document table (forgotten every poll).
    tables: HashMap<TableName, Option<TableInfo>>,
    /// Highest acknowledged position.
    acked: Option<u64>,
    /// Highest position returned since the last rewind.
    handed: Option<u64>,
    /// Decoded changes of the last peek not returned yet.
    buffer: VecDeque<Item>,
    /// Whether the last peek reached the end of the WAL.
    exhausted: bool,
    /// Mean size of a plugin output row in the last peek, to size the next one.
    row_bytes: usize,
    /// The slot's `confirmed_flush_lsn` as last read or set.
    confirmed: u64,
    /// Restart points of the last decoded window, in order.
    restarts: Vec<Restart>,
    /// What [`LEDGER_TABLE`] says this slot released last: the acknowledged position and
    /// the slot's position after it.
    ledger: Option<(u64, u64)>,
}

/// The table in the source database that remembers, per slot, the highest position released
/// (acknowledged by a replica and dropped from the slot) and where that left the slot. A
/// replica behind that position, or a slot moved by something else, has lost changes the slot
/// no longer holds: the source refuses to go on rather than leave a silent gap.
pub const LEDGER_TABLE: &str = "dedupwire_released";

impl std::fmt::Debug for PgSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSource")
            .field("config", &self.config)
            .field("acked", &self.acked)
            .field("confirmed", &format_lsn(self.confirmed))
            .finish_non_exhaustive()
    }
}

impl PgSource {
    /// Connects (`conn`: `host=... port=... dbname=... user=...` or a `postgresql://` URL),
    /// checks `wal_level`, checks the tables (and sets `REPLICA IDENTITY FULL` if configured),
    /// and creates the publication and the slot if they do not exist. Creating a slot waits for
    /// transactions running at that moment to finish.
    pub fn connect(conn: &str, config: PgSourceConfig) -> Result<Self, PgError> {
        let mut client = connect(conn, "dedupwire-source")?;
        let wal_level: String = client
            .query_one("SHOW wal_level", &[])
            .map_err(query_err("reading wal_level"))?
            .get(0);
        if wal_level != "logical" {
            return Err(PgError::Setup(format!(
                "wal_level is '{wal_level}', logical decoding needs wal_level = logical \
                 (set it in postgresql.conf or with ALTER SYSTEM, then restart the server)"
            )));
        }
        let mut source = PgSource {
            client,
            conn: conn.to_string(),
            copy: CopyPhase::Idle,
            filter: None,
            plugin: config.plugin,
            add_tables: None,
            tables: HashMap::new(),
            acked: None,
            handed: None,
            buffer: VecDeque::new(),
            exhausted: true,
            row_bytes: 1024,
            confirmed: 0,
            restarts: Vec::new(),
            ledger: None,
            config,
        };
        source.setup_tables()?;
        // Before the slot exists, so that its own transaction is not in the stream.
        source.read_ledger()?;
        let created = source.ensure_slot()?;
        source.confirmed = source.read_confirmed()?;
        source.check_ledger(created)?;
        source.load_copy()?;
        // The copy's snapshot right away, so that the stream, not the copy, carries what is
        // written from now on.
        if created && source.copy_pending() {
            source.start_copy()?;
        }
        Ok(source)
    }

    /// The slot's name.
    pub fn slot(&self) -> &str {
        &self.config.slot
    }

    /// The collections this source replicates so far (for [`Tables::All`], those seen).
    pub fn collections(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .tables
            .iter()
            .filter(|(_, info)| info.is_some())
            .map(|(name, _)| name.collection())
            .collect();
        names.sort();
        names
    }

    /// The slot's `confirmed_flush_lsn`: everything before it is released.
    pub fn confirmed_flush_lsn(&mut self) -> Result<u64, PgError> {
        self.confirmed = self.read_confirmed()?;
        Ok(self.confirmed)
    }

    /// Drops the replication slot (the server then stops keeping WAL for it), and the
    /// publication named like it that the source made. Replication from this slot cannot
    /// resume afterwards.
    pub fn drop_slot(mut self) -> Result<(), PgError> {
        let slot = self.config.slot.clone();
        self.client
            .execute("SELECT pg_drop_replication_slot($1::text::name)", &[&slot])
            .map_err(query_err(format!("dropping replication slot {slot}")))?;
        if self.plugin == Plugin::PgOutput && self.config.publication.is_none() {
            self.client
                .batch_execute(&format!(
                    "DROP PUBLICATION IF EXISTS {}",
                    quote_ident(&slot)
                ))
                .map_err(query_err(format!("dropping publication {slot}")))?;
        }
        self.forget_copy()
    }

    /// Whether the initial copy is still owed or unacknowledged.
    pub fn copy_pending(&self) -> bool {
        !matches!(self.copy, CopyPhase::Idle)
    }

    /// Reads this slot's copy record: whether a copy is owed, and its filter.
    fn load_copy(&mut self) -> Result<(), PgError> {
        self.copy = CopyPhase::Idle;
        self.filter = None;
        let row = self.client.query_opt(
            &format!(
                "SELECT c.snapshot, c.snapshot_lsn::text, c.pending FROM {COPY_TABLE} c
                      WHERE to_regclass('public.{COPY_TABLE}') IS NOT NULL AND c.slot = $1"
            ),
            &[&self.config.slot],
        );
        let row = match row {
            Ok(row) => row,
            // No such table: no copy was ever asked for in this database.
            Err(e) if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) => None,
            Err(e) => return Err(query_err(format!("reading {COPY_TABLE}"))(e)),
        };
        let Some(row) = row else { return Ok(()) };
        let snapshot: Option<String> = row.get(0);
        let lsn: Option<String> = row.get(1);
        let pending: bool = row.get(2);
        if let (Some(s), Some(l)) = (snapshot, lsn) {
            let snap = Snapshot::parse(&s).ok_or_else(|| {
                PgError::Setup(format!("{COPY_TABLE}: unreadable snapshot {s:?}"))
            })?;
            let lsn = parse_lsn(&l)
                .ok_or_else(|| PgError::Setup(format!("{COPY_TABLE}: unreadable LSN {l:?}")))?;
            self.filter = Some((snap, lsn));
        }
        if pending {
            self.copy = CopyPhase::Pending;
        }
        Ok(())
    }

    /// Records that a copy is owed for a slot about to be created (before it exists, so a
    /// crash in between leaves a debt, never a slot without one).
    fn owe_copy(&mut self) -> Result<(), PgError> {
        self.client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {COPY_TABLE} (slot text PRIMARY KEY, snapshot text, \
                 snapshot_lsn pg_lsn, pending boolean NOT NULL)"
            ))
            .map_err(query_err(format!(
                "creating {COPY_TABLE} (the initial copy's record)"
            )))?;
        self.client
            .execute(
                &format!(
                    "INSERT INTO {COPY_TABLE} VALUES ($1, NULL, NULL, true) ON CONFLICT (slot) DO UPDATE \
                     SET snapshot = NULL, snapshot_lsn = NULL, pending = true"
                ),
                &[&self.config.slot],
            )
            .map_err(query_err(format!("writing {COPY_TABLE}")))?;
        self.filter = None;
        self.copy = CopyPhase::Pending;
        Ok(())
    }

    /// Deletes this slot's copy record.
    fn forget_copy(&mut self) -> Result<(), PgError> {
        let result = self.client.execute(
            &format!("DELETE FROM {COPY_TABLE} WHERE slot = $1"),
            &[&self.config.slot],
        );
        match result {
            Ok(_) => {}
            Err(e) if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) => {}
            Err(e) => return Err(query_err(format!("updating {COPY_TABLE}"))(e)),
        }
        self.filter = None;
        Ok(())
    }

    /// The copy is acknowledged whole: clear the debt (the filter stays until the slot has
    /// passed the snapshot).
    fn copy_done(&mut self) -> Result<(), PgError> {
        self.copy = CopyPhase::Idle;
        self.client
            .execute(
                &format!("UPDATE {COPY_TABLE} SET pending = false WHERE slot = $1"),
                &[&self.config.slot],
            )
            .map_err(query_err(format!("updating {COPY_TABLE}")))?;
        self.retire_filter()
    }

    /// Drops the filter and the record once nothing the snapshot sees can come again.
    fn retire_filter(&mut self) -> Result<(), PgError> {
        match (&self.copy, &self.filter) {
            (CopyPhase::Idle, Some((_, lsn))) if self.confirmed > *lsn => self.forget_copy(),
            _ => Ok(()),
        }
    }

    /// Starts (or restarts) the copy: a snapshot on a connection of its own, recorded as the
    /// stream's filter if it is the first.
    fn start_copy(&mut self) -> Result<(), PgError> {
        // Another source on this slot may have started a copy since this one was opened.
        self.load_copy()?;
        self.confirmed = self.read_confirmed()?;
        if matches!(self.copy, CopyPhase::Idle) {
            return Ok(());
        }
        let mut client = connect(&self.conn, "dedupwire-copy")?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .map_err(query_err("starting the copy's transaction"))?;
        let row = client
            .query_one(
                "SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text",
                &[],
            )
            .map_err(query_err("taking the copy's snapshot"))?;
        if self.filter.is_none() {
            let text: String = row.get(0);
            let lsn_text: String = row.get(1);
            let snapshot = Snapshot::parse(&text)
                .ok_or_else(|| PgError::Setup(format!("unreadable snapshot {text:?}")))?;
            let lsn = parse_lsn(&lsn_text)
                .ok_or_else(|| PgError::Setup(format!("unreadable LSN {lsn_text:?}")))?;
            self.client
                .execute(
                    &format!(
                        "UPDATE {COPY_TABLE} SET snapshot = $2, snapshot_lsn = $3::text::pg_lsn \
                         WHERE slot = $1 AND snapshot IS NULL"
                    ),
                    &[&self.config.slot, &text, &lsn_text],
                )
                .map_err(query_err(format!("writing {COPY_TABLE}")))?;
            self.filter = Some((snapshot, lsn));
            // Decoded before the filter existed.
            self.buffer.clear();
        }
        let mut tables: Vec<TableName> = self
            .tables
            .iter()
            .filter(|(_, info)| info.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        tables.sort();
        self.copy = CopyPhase::Running {
            client: Box::new(client),
            tables: tables.into(),
            open: false,
            next: None,
        };
        Ok(())
    }

    /// Up to `max` rows of the running copy as inserts; empty once it is all returned.
    fn copy_rows(&mut self, max: usize) -> Result<Vec<Change>, PgError> {
        let stream_start = self.confirmed;
        if let CopyPhase::Running {
            next: next @ None, ..
        } = &mut self.copy
        {
            if self
                .acked
                .is_some_and(|a| a.saturating_add(1) >= stream_start)
            {
                // The replica is past the slot's start: it is not one that needs a copy.
                self.copy_done()?;
                return Ok(Vec::new());
            }
            *next = Some(self.acked.map_or(1, |a| a + 1));
        }
        let mut out = Vec::new();
        let CopyPhase::Running {
            client,
            tables,
            open,
            next: Some(next),
        } = &mut self.copy
        else {
            return Ok(out);
        };
        while out.len() < max {
            let Some(name) = tables.front() else { break };
            if !*open {
                client
                    .batch_execute(&format!(
                        "DECLARE dedupwire_copy NO SCROLL CURSOR FOR SELECT id::text, body::text FROM {}",
                        name.quoted()
                    ))
                    .map_err(query_err(format!("copying {name}")))?;
                *open = true;
            }
            let want = (max - out.len()).min(COPY_FETCH);
            let rows = client
                .query(&format!("FETCH {want} FROM dedupwire_copy"), &[])
                .map_err(query_err(format!("copying {name}")))?;
            let collection = name.collection();
            for row in &rows {
                if *next >= stream_start {
                    return Err(PgError::Setup(format!(
                        "the initial copy has more rows than there are positions before the slot's                          start ({}); copy the tables yourself and set initial_copy off",
                        format_lsn(stream_start)
                    )));
                }
                let id: Option<String> = row.get(0);
                let body: Option<String> = row.get(1);
                out.push(Change {
                    pos: *next,
                    op: Op::Insert,
                    collection: collection.clone(),
                    id: id.unwrap_or_default(),
                    doc: Some(body.unwrap_or_else(|| "null".to_string()).into_bytes()),
                });
                *next += 1;
            }
            if rows.len() < want {
                client
                    .batch_execute("CLOSE dedupwire_copy")
                    .map_err(query_err(format!("copying {name}")))?;
                *open = false;
                tables.pop_front();
            }
        }
        if tables.is_empty() {
            let _ = client.batch_execute("COMMIT");
            let last = next.saturating_sub(1);
            if self.acked.map_or(last >= 1, |a| a < last) {
                self.copy = CopyPhase::Sent {
                    last,
                    rewound: false,
                };
            } else {
                self.copy_done()?;
            }
        }
        if let Some(c) = out.last() {
            self.handed = Some(c.pos);
        }
        Ok(out)
    }

    fn setup_tables(&mut self) -> Result<(), PgError> {
        let names: Vec<TableName> = match &self.config.tables {
            Tables::Only(list) => {
                if list.is_empty() {
                    return Err(PgError::Setup("the table list is empty".to_string()));
                }
                let names: Vec<TableName> = list.iter().map(|t| TableName::parse(t)).collect();
                for name in &names {
                    let info =
                        inspect_table(&mut self.client, name)?.ok_or_else(|| PgError::Table {
                            table: name.to_string(),
                            problem: "does not exist (or is not a plain table) in this database"
                                .to_string(),
                        })?;
                    self.tables.insert(name.clone(), Some(info));
                }
                let spec: Vec<String> = names
                    .iter()
                    .map(|n| {
                        format!(
                            "{}.{}",
                            escape_add_tables(&n.schema),
                            escape_add_tables(&n.table)
                        )
                    })
                    .collect();
                self.add_tables = Some(spec.join(","));
                names
            }
            Tables::All => {
                let rows = self
                    .client
                    .query(
                        "SELECT n.nspname::text, c.relname::text
                           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE c.relkind = 'r'
                            AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'
                            AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                                          AND a.attname = 'body' AND a.attnum > 0 AND NOT a.attisdropped)
                          ORDER BY 1, 2",
                        &[],
                    )
                    .map_err(query_err("listing document tables"))?;
                let mut names = Vec::new();
                for row in rows {
                    let name = TableName {
                        schema: row.get(0),
                        table: row.get(1),
                    };
                    // Tables with a `body` but no `id` primary key are not document tables.
                    if let Ok(Some(info)) = inspect_table(&mut self.client, &name) {
                        self.tables.insert(name.clone(), Some(info));
                        names.push(name);
                    }
                }
                names
            }
        };
        for name in names {
            self.ensure_identity(&name)?;
        }
        Ok(())
    }

    /// Sets REPLICA IDENTITY FULL on a document table if configured and missing.
    fn ensure_identity(&mut self, name: &TableName) -> Result<(), PgError> {
        let Some(Some(info)) = self.tables.get(name) else {
            return Ok(());
        };
        if !self.config.replica_identity_full || info.replident == 'f' {
            return Ok(());
        }
        self.client
            .batch_execute(&format!("ALTER TABLE {} REPLICA IDENTITY FULL", name.quoted()))
            .map_err(|e| PgError::Table {
                table: name.to_string(),
                problem: format!(
                    "cannot set REPLICA IDENTITY FULL (needed so that an update that leaves a large body \
                     unchanged still carries it; connect as the table's owner, or set it yourself, or turn \
                     replica_identity_full off): {e}"
                ),
            })?;
        if let Some(Some(info)) = self.tables.get_mut(name) {
            info.replident = 'f';
        }
        Ok(())
    }

    /// Checks the slot, or creates it (its publication first); says whether it did.
    fn ensure_slot(&mut self) -> Result<bool, PgError> {
        let slot = self.config.slot.clone();
        let row = self
            .client
            .query_opt(
                "SELECT plugin::text, slot_type, database::text, current_database()::text
                   FROM pg_replication_slots WHERE slot_name = $1::text::name",
                &[&slot],
            )
            .map_err(query_err("reading pg_replication_slots"))?;
        if let Some(row) = row {
            let plugin: Option<String> = row.get(0);
            let kind: String = row.get(1);
            let database: Option<String> = row.get(2);
            let current: String = row.get(3);
            let known = plugin.as_deref().and_then(Plugin::from_name);
            let Some(known) = known.filter(|_| kind == "logical") else {
                return Err(PgError::Setup(format!(
                    "replication slot {slot} exists but is a {kind} slot with plugin {}; it must be a \
                     logical slot with plugin pgoutput or wal2json (choose another slot name)",
                    plugin.as_deref().unwrap_or("(none)")
                )));
            };
            if database.as_deref() != Some(current.as_str()) {
                return Err(PgError::Setup(format!(
                    "replication slot {slot} belongs to database {}, not {current} (choose another slot name)",
                    database.as_deref().unwrap_or("(none)")
                )));
            }
            self.plugin = known;
            if known == Plugin::PgOutput {
                self.ensure_publication()?;
            }
            return Ok(false);
        }
        self.plugin = self.config.plugin;
        // Before the slot: pgoutput cannot decode WAL written before its publication existed.
        if self.plugin == Plugin::PgOutput {
            self.ensure_publication()?;
        }
        if self.config.initial_copy {
            self.owe_copy()?;
        }
        let plugin = self.plugin.name();
        self.client
            .execute(
                "SELECT pg_create_logical_replication_slot($1::text::name, $2::text::name)",
                &[&slot, &plugin],
            )
            .map_err(|e| {
                let text = e.to_string();
                let db_text = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
                if db_text.contains("may not be used as an output plugin") {
                    PgError::Setup(format!(
                        "the server refuses the {plugin} output plugin: its setting \
                         output_plugin_libraries does not list it ({db_text}). Use the default \
                         plugin, pgoutput, or add {plugin} to output_plugin_libraries in \
                         postgresql.conf and reload the server"
                    ))
                } else if plugin == "wal2json" && (text.contains("could not access file") || text.contains("No such file")) {
                    PgError::Setup(format!(
                        "the wal2json output plugin is not installed on the server \
                         (Debian/Ubuntu: apt-get install postgresql-15-wal2json, matching the server's version; \
                         or use the default plugin, pgoutput): {text}"
                    ))
                } else {
                    PgError::Query {
                        context: format!("creating logical replication slot {slot} (needs the REPLICATION attribute and a free slot)"),
                        source: e,
                    }
                }
            })?;
        Ok(true)
    }

    /// The publication a pgoutput slot reads.
    fn publication(&self) -> &str {
        self.config
            .publication
            .as_deref()
            .unwrap_or(&self.config.slot)
    }

    /// Checks that an existing publication publishes every replicated table: one named like
    /// the slot (this source's own) gains the listed tables it lacks; any other is refused,
    /// since the missing tables' changes would never be decoded.
    fn check_publication(&mut self, name: &str) -> Result<(), PgError> {
        let all: bool = self
            .client
            .query_one(
                "SELECT puballtables FROM pg_publication WHERE pubname = $1::text::name",
                &[&name],
            )
            .map_err(query_err("reading pg_publication"))?
            .get(0);
        if all {
            return Ok(());
        }
        let Tables::Only(list) = &self.config.tables else {
            return Err(PgError::Setup(format!(
                "publication {name} exists but is not FOR ALL TABLES, so the document tables it \
                 leaves out would never be replicated: list the tables to replicate, or drop the \
                 publication (the source then creates it), or name another one"
            )));
        };
        let mut missing = Vec::new();
        for table in list {
            let t = TableName::parse(table);
            let found = self
                .client
                .query_opt(
                    "SELECT 1 FROM pg_publication_tables WHERE pubname = $1::text::name \
                     AND schemaname = $2::text::name AND tablename = $3::text::name",
                    &[&name, &t.schema, &t.table],
                )
                .map_err(query_err("reading pg_publication_tables"))?
                .is_some();
            if !found {
                missing.push(t);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = missing.iter().map(TableName::quoted).collect();
        if self.config.publication.is_some() {
            return Err(PgError::Setup(format!(
                "publication {name} does not publish {}: add them (ALTER PUBLICATION {} ADD TABLE {}) \
                 or name another publication",
                names.join(", "),
                quote_ident(name),
                names.join(", ")
            )));
        }
        self.client
            .batch_execute(&format!(
                "ALTER PUBLICATION {} ADD TABLE {}",
                quote_ident(name),
                names.join(", ")
            ))
            .map_err(query_err(format!("adding tables to publication {name}")))
    }

    /// Creates the publication if it does not exist.
    fn ensure_publication(&mut self) -> Result<(), PgError> {
        let name = self.publication().to_string();
        let exists = self
            .client
            .query_opt(
                "SELECT 1 FROM pg_publication WHERE pubname = $1::text::name",
                &[&name],
            )
            .map_err(query_err("reading pg_publication"))?
            .is_some();
        if exists {
            return self.check_publication(&name);
        }
        let (what, hint) = match &self.config.tables {
            Tables::All => (
                "FOR ALL TABLES".to_string(),
                "FOR ALL TABLES needs a superuser; or create the publication yourself, \
                 FOR TABLE the document tables, and name it with the source's publication option"
                    .to_string(),
            ),
            Tables::Only(list) => {
                let names: Vec<String> =
                    list.iter().map(|t| TableName::parse(t).quoted()).collect();
                (
                    format!("FOR TABLE {}", names.join(", ")),
                    "FOR TABLE needs the tables' owner and the CREATE privilege on the database"
                        .to_string(),
                )
            }
        };
        let sql = format!("CREATE PUBLICATION {} {what}", quote_ident(&name));
        match self.client.batch_execute(&sql) {
            Ok(()) => Ok(()),
            // Another source created it meanwhile.
            Err(e) if e.code() == Some(&postgres::error::SqlState::DUPLICATE_OBJECT) => Ok(()),
            Err(e) => Err(PgError::Query {
                context: format!("creating publication {name} ({hint})"),
                source: e,
            }),
        }
    }

    fn read_confirmed(&mut self) -> Result<u64, PgError> {
        let slot = self.config.slot.clone();
        let row = self
            .client
            .query_opt(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1::text::name",
                &[&slot],
            )
            .map_err(query_err("reading the slot's confirmed_flush_lsn"))?;
        let Some(row) = row else {
            return Err(PgError::Setup(format!(
                "replication slot {slot} does not exist (any more)"
            )));
        };
        let text: Option<String> = row.get(0);
        text.as_deref().and_then(parse_lsn).ok_or_else(|| {
            PgError::Setup(format!(
                "replication slot {slot} has no confirmed_flush_lsn"
            ))
        })
    }

    /// Peeks up to about `limit` rows (whole transactions) from the slot's restart point;
    /// returns the restart point and the rows (LSN, the plugin's output). Retries if the slot
    /// moved meanwhile.
    fn peek(&mut self, limit: usize) -> Result<(u64, Vec<Row>), PgError> {
        let slot = self.config.slot.clone();
        let (sql, options) = match self.plugin {
            Plugin::PgOutput => {
                let mut options: Vec<String> =
                    pgoutput::OPTIONS.iter().map(|s| s.to_string()).collect();
                options.push("publication_names".to_string());
                options.push(quote_ident(self.publication()));
                (
                    "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1::text::name, NULL, $2::int4, VARIADIC $3::text[])",
                    options,
                )
            }
            Plugin::Wal2Json => {
                let mut options: Vec<String> =
                    wal2json::OPTIONS.iter().map(|s| s.to_string()).collect();
                if let Some(add) = &self.add_tables {
                    options.push("add-tables".to_string());
                    options.push(add.clone());
                }
                (
                    "SELECT lsn::text, convert_to(data, 'UTF8') FROM pg_logical_slot_peek_changes($1::text::name, NULL, $2::int4, VARIADIC $3::text[])",
                    options,
                )
            }
        };
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        loop {
            let start = self.read_confirmed()?;
            let rows = self
                .client
                .query(sql, &[&slot, &limit, &options])
                .map_err(query_err(format!("peeking changes from slot {slot}")))?;
            if self.read_confirmed()? != start {
                continue;
            }
            self.confirmed = start;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let lsn_text: String = row.get(0);
                let lsn = parse_lsn(&lsn_text).ok_or_else(|| PgError::Unsupported {
                    pos: None,
                    lsn: lsn_text.clone(),
                    problem: "unreadable LSN".to_string(),
                })?;
                out.push((lsn, row.get(1)));
            }
            return Ok((start, out));
        }
    }

    /// The records of one row of plugin output.
    fn records(
        &self,
        decoder: &mut pgoutput::Decoder,
        data: &[u8],
        out: &mut Vec<Record>,
    ) -> Result<(), String> {
        out.clear();
        match self.plugin {
            Plugin::PgOutput => decoder.decode(data, out),
            Plugin::Wal2Json => {
                let text = std::str::from_utf8(data)
                    .map_err(|_| "wal2json output is not UTF-8".to_string())?;
                out.push(wal2json::parse(text)?);
                Ok(())
            }
        }
    }

    /// Whether `name` is a replicated document table (looked up once per poll for unknown
    /// tables in [`Tables::All`] mode).
    fn is_document_table(&mut self, name: &TableName) -> Result<bool, PgError> {
        if let Some(entry) = self.tables.get(name) {
            return Ok(entry.is_some());
        }
        if matches!(self.config.tables, Tables::Only(_)) {
            return Ok(false);
        }
        let info = match inspect_table(&mut self.client, name) {
            Ok(info) => info,
            // It has changed since: not (or no longer) a document table.
            Err(PgError::Table { .. }) => None,
            Err(e) => return Err(e),
        };
        let found = info.is_some();
        self.tables.insert(name.clone(), info);
        if found {
            self.ensure_identity(name)?;
        }
        Ok(found)
    }

    /// Numbers the rows from restart point `start`, turns document-table records into items,
    /// and records the window's restart points.
    fn decode(&mut self, start: u64, rows: &[Row]) -> Result<Vec<Item>, PgError> {
        let mut numbering = Numbering::new(start);
        let mut items = Vec::new();
        let mut covered: Option<u64> = None;
        let mut restarts = Vec::new();
        let mut xid: Option<u32> = None;
        let mut decoder = pgoutput::Decoder::new();
        let mut records = Vec::new();
        for (lsn, data) in rows {
            self.records(&mut decoder, data, &mut records)
                .map_err(|problem| PgError::Unsupported {
                    pos: None,
                    lsn: format_lsn(*lsn),
                    problem,
                })?;
            for record in records.drain(..) {
                match record {
                    Record::Begin(x) => xid = x,
                    Record::Other => {}
                    Record::Commit => {
                        if numbering.commit(*lsn) {
                            restarts.push(Restart { covered, lsn: *lsn });
                        }
                    }
                    Record::Change(change) => {
                        let width = change.width();
                        let pos = numbering.change(*lsn, width);
                        // In the initial copy already.
                        if let (Some((snapshot, _)), Some(x)) = (&self.filter, xid) {
                            if snapshot.sees(x) {
                                continue;
                            }
                        }
                        let name = TableName {
                            schema: change.schema.clone(),
                            table: change.table.clone(),
                        };
                        if !self.is_document_table(&name)? {
                            continue;
                        }
                        match self.to_changes(&name, &change, pos) {
                            // A skipped truncate: nothing to acknowledge.
                            Ok(changes) if changes.is_empty() => {}
                            Ok(changes) => {
                                covered = changes.last().map(|c| c.pos);
                                items.extend(changes.into_iter().map(Ok));
                            }
                            Err(problem) => {
                                covered = Some(pos + width - 1);
                                items.push(Err((
                                    pos,
                                    PgError::Unsupported {
                                        pos: Some(pos),
                                        lsn: format_lsn(*lsn),
                                        problem: format!("table {name}: {problem}"),
                                    },
                                )));
                            }
                        }
                    }
                }
            }
        }
        self.restarts = restarts;
        Ok(items)
    }

    /// The document changes of one record at `pos` (none for a skipped truncate).
    fn to_changes(
        &self,
        name: &TableName,
        change: &RowChange,
        pos: u64,
    ) -> Result<Vec<Change>, String> {
        let collection = name.collection();
        let make = |pos: u64, op: Op, id: String, doc: Option<Vec<u8>>| Change {
            pos,
            op,
            collection: collection.clone(),
            id,
            doc,
        };
        let key = |v: Option<&Value>, which: &str| match v {
            Some(Value::Text(s)) => Ok(s.clone()),
            Some(Value::Null) => Err(format!("the {which} key `id` is NULL")),
            None => Err(format!(
                "the change carries no {which} key `id` (is the table's REPLICA IDENTITY NOTHING?)"
            )),
        };
        // SQL NULL bodies travel as the JSON document `null`.
        let doc = |v: &Value| match v {
            Value::Text(s) => s.clone().into_bytes(),
            Value::Null => b"null".to_vec(),
        };
        match change.action {
            'I' => {
                let id = key(change.new_value("id"), "new")?;
                let body = change
                    .new_value("body")
                    .ok_or("the insert carries no `body`")?;
                Ok(vec![make(pos, Op::Insert, id, Some(doc(body)))])
            }
            'U' => {
                let id = key(change.new_value("id").or(change.old_value("id")), "new")?;
                // An unchanged TOASTed body is left out of the new row; with REPLICA IDENTITY
                // FULL the old row has it (and it is unchanged).
                let body = change.new_value("body").or(change.old_value("body")).ok_or(
                    "the update carries no `body` (the body is large, unchanged, and the table's \
                     REPLICA IDENTITY is not FULL: set it with ALTER TABLE ... REPLICA IDENTITY FULL, \
                     then advance the slot past this change)",
                )?;
                if change.moves_key() {
                    let old = key(change.old_value("id"), "old")?;
                    Ok(vec![
                        make(pos, Op::Delete, old, None),
                        make(pos + 1, Op::Insert, id, Some(doc(body))),
                    ])
                } else {
                    Ok(vec![make(pos, Op::Update, id, Some(doc(body)))])
                }
            }
            'D' => {
                let id = key(change.old_value("id"), "old")?;
                Ok(vec![make(pos, Op::Delete, id, None)])
            }
            'T' if self.config.skip_truncate => Ok(Vec::new()),
            'T' => Err(format!(
                "TRUNCATE cannot be replicated document by document (the replica keeps its rows); \
                 truncate the replica's table too and advance the slot past this change with \
                 pg_replication_slot_advance('{}', ...), or set skip_truncate",
                self.config.slot
            )),
            other => Err(format!("unknown change action {other:?}")),
        }
    }

    /// Moves the slot to the last restart point whose changes are all acknowledged.
    /// Reads this slot's row of [`LEDGER_TABLE`] (creating the table if needed).
    fn read_ledger(&mut self) -> Result<(), PgError> {
        let slot = self.config.slot.clone();
        self.client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (slot text PRIMARY KEY, \
                 released bigint NOT NULL, confirmed pg_lsn NOT NULL)"
            ))
            .map_err(query_err(format!("creating {LEDGER_TABLE}")))?;
        let row = self
            .client
            .query_opt(
                &format!("SELECT released, confirmed::text FROM {LEDGER_TABLE} WHERE slot = $1"),
                &[&slot],
            )
            .map_err(query_err(format!("reading {LEDGER_TABLE}")))?;
        self.ledger = match row {
            None => None,
            Some(row) => {
                let released: i64 = row.get(0);
                let confirmed: String = row.get(1);
                let confirmed = parse_lsn(&confirmed).ok_or_else(|| {
                    PgError::Setup(format!("{LEDGER_TABLE}: unreadable LSN {confirmed:?}"))
                })?;
                Some((released as u64, confirmed))
            }
        };
        Ok(())
    }

    /// Forgets the ledger of a slot that was just created (an older slot of the same name
    /// released nothing of this one), and refuses a slot that was advanced past what
    /// dedupwire released.
    fn check_ledger(&mut self, created: bool) -> Result<(), PgError> {
        let slot = self.config.slot.clone();
        if created {
            if self.ledger.take().is_some() {
                self.client
                    .execute(
                        &format!("DELETE FROM {LEDGER_TABLE} WHERE slot = $1"),
                        &[&slot],
                    )
                    .map_err(query_err(format!("clearing {LEDGER_TABLE}")))?;
            }
            return Ok(());
        }
        match self.ledger {
            Some((_, confirmed)) if self.confirmed > confirmed => Err(PgError::Setup(format!(
                "replication slot {slot} was advanced outside dedupwire (to {}, past the {} \
                 dedupwire released): the changes in between never reached the replica; drop \
                 the slot and start again with an empty replica (a new slot copies the tables)",
                format_lsn(self.confirmed),
                format_lsn(confirmed)
            ))),
            _ => Ok(()),
        }
    }

    /// Refuses a replica at `resume` (`None`: empty) that is behind what this slot released.
    fn check_resume(&self, resume: Option<u64>) -> Result<(), PgError> {
        let Some((released, _)) = self.ledger else {
            return Ok(());
        };
        if resume.is_some_and(|r| r >= released) {
            return Ok(());
        }
        let slot = &self.config.slot;
        Err(PgError::Setup(match resume {
            None => format!(
                "the replica is empty, but slot {slot} already released changes up to position \
                 {released} to a replica: they are gone from the slot; drop the slot (a new slot \
                 copies the tables) or point the receiver at the replica it was feeding"
            ),
            Some(r) => format!(
                "the replica is at position {r}, behind position {released} that slot {slot} \
                 already released (a replica restored from an older backup?): the changes in \
                 between are gone from the slot; drop the slot and re-seed the replica"
            ),
        }))
    }

    fn release(&mut self) -> Result<(), PgError> {
        let acked = self.acked;
        let target = self
            .restarts
            .iter()
            .filter(|r| match r.covered {
                None => true,
                Some(c) => acked.is_some_and(|a| c <= a),
            })
            .map(|r| r.lsn)
            .max();
        let Some(target) = target else { return Ok(()) };
        if target <= self.confirmed {
            return Ok(());
        }
        let slot = self.config.slot.clone();
        let lsn = format_lsn(target);
        // The ledger first: a crash before the advance leaves a ledger ahead of the slot,
        // which is harmless; the other order could lose the record of a release.
        if let Some(released) = acked.or(self.ledger.map(|l| l.0)) {
            self.client
                .execute(
                    &format!(
                        "INSERT INTO {LEDGER_TABLE} VALUES ($1, $2, $3::text::pg_lsn) \
                         ON CONFLICT (slot) DO UPDATE SET released = GREATEST({LEDGER_TABLE}.released, \
                         EXCLUDED.released), confirmed = EXCLUDED.confirmed"
                    ),
                    &[&slot, &(released as i64), &lsn],
                )
                .map_err(query_err(format!("writing {LEDGER_TABLE}")))?;
            self.ledger = Some((released, target));
        }
        self.client
            .execute(
                "SELECT pg_replication_slot_advance($1::text::name, $2::text::pg_lsn)",
                &[&slot, &lsn],
            )
            .map_err(query_err(format!("advancing slot {slot} to {lsn}")))?;
        self.confirmed = target;
        self.restarts.retain(|r| r.lsn > target);
        self.retire_filter()
    }

    /// Whether `pos` was acknowledged or already returned.
    fn seen(&self, pos: u64) -> bool {
        self.acked.is_some_and(|a| pos <= a) || self.handed.is_some_and(|h| pos <= h)
    }

    /// Up to `max` changes from the buffer, refilled by one peek when it has nothing new.
    fn poll_once(&mut self, max: usize) -> Result<Vec<Change>, PgError> {
        if matches!(
            self.copy,
            CopyPhase::Pending | CopyPhase::Sent { rewound: true, .. }
        ) {
            self.start_copy()?;
        }
        if matches!(self.copy, CopyPhase::Running { .. }) {
            let rows = self.copy_rows(max)?;
            if !rows.is_empty() {
                return Ok(rows);
            }
        }
        let mut out = Vec::new();
        let mut limit = 0usize;
        loop {
            while let Some(item) = self.buffer.pop_front() {
                let pos = match &item {
                    Ok(c) => c.pos,
                    Err((pos, _)) => *pos,
                };
                if self.seen(pos) {
                    continue;
                }
                match item {
                    Ok(change) => {
                        self.handed = Some(pos);
                        out.push(change);
                        if out.len() == max {
                            return Ok(out);
                        }
                    }
                    // Deliver what comes before a bad change; fail when it is next (and again
                    // on every poll until it is acknowledged: the next peek finds it again).
                    Err((_, e)) if out.is_empty() => {
                        self.buffer.clear();
                        return Err(e);
                    }
                    Err(item) => {
                        self.buffer.push_front(Err(item));
                        return Ok(out);
                    }
                }
            }
            if !out.is_empty() || (limit > 0 && self.exhausted) {
                return Ok(out);
            }
            // Nothing new in the buffer: peek again, twice as far when the last window held
            // only changes already returned.
            limit = if limit == 0 {
                (PEEK_BYTES / self.row_bytes.max(1)).max(max.saturating_mul(3).saturating_add(64))
            } else {
                limit.saturating_mul(2)
            };
            // Tables that were not document tables may have become ones.
            self.tables.retain(|_, info| info.is_some());
            let (start, rows) = self.peek(limit)?;
            self.exhausted = rows.len() < limit || limit >= i32::MAX as usize;
            if !rows.is_empty() {
                let bytes: usize = rows.iter().map(|(_, d)| d.len()).sum();
                self.row_bytes = (bytes / rows.len()).max(1);
            }
            let items = self.decode(start, &rows)?;
            self.release()?;
            self.buffer = items.into();
        }
    }
}

impl ChangeSource for PgSource {
    type Error = PgError;

    /// Up to `max` changes after the last acknowledged position and the last one returned, in
    /// commit order. Waits [`PgSourceConfig::idle_wait`] once when there are none. Consumes
    /// nothing: without an `ack`, a reopened or rewound source returns the same changes.
    fn poll(&mut self, max: usize) -> Result<Vec<Change>, PgError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let out = self.poll_once(max)?;
        if !out.is_empty() || self.config.idle_wait.is_zero() {
            return Ok(out);
        }
        std::thread::sleep(self.config.idle_wait);
        self.poll_once(max)
    }

    /// Records that everything up to `pos` is applied and moves the slot as far as whole
    /// transactions allow.
    fn ack(&mut self, pos: u64) -> Result<(), PgError> {
        self.acked = Some(self.acked.map_or(pos, |a| a.max(pos)));
        if let CopyPhase::Sent { last, .. } = self.copy {
            if pos >= last {
                self.copy_done()?;
            }
        }
        self.release()
    }

    /// Forgets what was returned and not acknowledged: the next `poll` returns it again.
    fn rewind(&mut self) -> Result<(), PgError> {
        // A copy not acknowledged whole starts again, unless the next ack completes it.
        match self.copy {
            CopyPhase::Running { .. } => self.copy = CopyPhase::Pending,
            CopyPhase::Sent { last, .. } => {
                self.copy = CopyPhase::Sent {
                    last,
                    rewound: true,
                }
            }
            _ => {}
        }
        self.handed = None;
        self.buffer.clear();
        self.exhausted = true;
        Ok(())
    }

    /// A new session: besides rewinding, a copy this source had under way is read back from
    /// its record, since another source on the slot may have started it again since (at other
    /// positions) or finished it: completing this source's older attempt because the
    /// replica's position passed its last row lost the rows of the newer one.
    fn resume(&mut self, applied: Option<u64>) -> Result<(), PgError> {
        self.check_resume(applied)?;
        self.rewind()?;
        if !matches!(self.copy, CopyPhase::Idle) {
            self.load_copy()?;
        }
        match applied {
            Some(pos) => self.ack(pos),
            None => Ok(()),
        }
    }
}

/// Quotes an SQL identifier (`"` doubled), as publication names are read.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Escapes a name for wal2json's `add-tables` (`.`, `,`, `*`, space, quote, backslash).
fn escape_add_tables(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for ch in name.chars() {
        if matches!(ch, '.' | ',' | '*' | ' ' | '\'' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{escape_add_tables, quote_ident};

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("dedupwire"), "\"dedupwire\"");
        assert_eq!(quote_ident("a\"B,c"), "\"a\"\"B,c\"");
    }

    #[test]
    fn add_tables_escaping() {
        assert_eq!(escape_add_tables("docs"), "docs");
        assert_eq!(escape_add_tables("a.b,c*d e'f"), "a\\.b\\,c\\*d\\ e\\'f");
    }
}
