//! `dedupwire replicate encode|decode|send|receive`: sDedup over JSON-lines change streams,
//! and live replication of PostgreSQL document tables or a MongoDB oplog over TCP,
//! authenticated and encrypted with a shared key unless both ends say `--insecure-plaintext`.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};

use anyhow::{bail, Context, Result};
use dedupwire_replicate::jsonl;
use dedupwire_replicate::live::{
    LiveError, PgDocStore, Receiver, ReceiverConfig, Sender, SenderConfig,
};
use dedupwire_replicate::mongo::{MongoDocStore, MongoSink, MongoSource, MongoSourceConfig};
use dedupwire_replicate::pg::{PgSink, PgSinkConfig, PgSource, PgSourceConfig, Plugin, Tables};
use dedupwire_replicate::sdedup::{SdedupConfig, SourceStore};
use dedupwire_replicate::ChangeSource;
use dedupwire_wire::Key;

use crate::transport::{self, KeyArgs};

/// How long either end waits for the other before giving up on the connection. An idle
/// sender pings every few seconds, so only a peer that is gone (or a network that dropped the
/// connection silently) gets near it.
const PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Options of `dedupwire replicate`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Encode a JSON-lines change stream (stdin) into an sDedup stream (stdout).
    Encode {
        /// Print bytes in/out, ratio, cache hit ratio, fallbacks and index memory to stderr.
        #[arg(long)]
        stats: bool,
        /// Input bytes per batch (e.g. 4MiB).
        #[arg(long, default_value = "4MiB")]
        batch: String,
    },
    /// Decode an sDedup stream (stdin) back into the exact JSON lines (stdout).
    Decode,
    /// Tail a PostgreSQL database's document tables (logical decoding with pgoutput) or a
    /// MongoDB server's oplog and ship the changes to a `replicate receive`, delta-encoded
    /// against similar documents.
    ///
    /// Resumes after the receiver's applied position; the slot only releases what the
    /// receiver has applied. Exits non-zero when the connection or the source fails.
    Send {
        /// The source database (`postgres://user@host/db`, `host=... dbname=...`, or
        /// `mongodb://host:port/[db]` to tail its oplog, one database or all).
        #[arg(long)]
        from: String,
        /// The receiver's address (HOST:PORT).
        #[arg(long)]
        to: String,
        /// The logical replication slot (created if missing); the receiver keys its position
        /// by it.
        #[arg(long, default_value = "dedupwire")]
        slot: String,
        /// Replicate only these tables (comma-separated, `name` or `schema.name`); default:
        /// every table with an `id` primary key and a `body` column.
        #[arg(long, value_delimiter = ',')]
        tables: Vec<String>,
        /// Document bytes per batch (e.g. 4MiB).
        #[arg(long, default_value = "4MiB")]
        batch_bytes: String,
        /// Batches sent ahead of the receiver's acknowledgements.
        #[arg(long, default_value_t = 4)]
        window: usize,
        /// Stop (successfully) once the source has nothing more and the receiver has applied
        /// everything.
        #[arg(long)]
        until_drained: bool,
        /// PostgreSQL: the output plugin a new slot decodes with (an existing slot keeps its
        /// own). pgoutput is built into the server; wal2json needs the extension and a server
        /// whose output_plugin_libraries lists it.
        #[arg(long, value_enum, default_value = "pgoutput")]
        plugin: PluginArg,
        /// PostgreSQL, pgoutput: the publication to read (default: named like the slot, and
        /// created if missing, FOR ALL TABLES or FOR TABLE the --tables).
        #[arg(long)]
        publication: Option<String>,
        /// Keep the similarity state (feature index, document table) in DIR across restarts
        /// [default: a temporary directory, rebuilt from the stream after a restart].
        #[arg(long, value_name = "DIR")]
        state: Option<std::path::PathBuf>,
        /// Print bytes on the wire against raw document bytes, batches, deltas and fallbacks
        /// to stderr at the end (JSON).
        #[arg(long)]
        stats: bool,
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Accept senders on ADDR and apply their change streams to a PostgreSQL replica (each
    /// batch in one transaction with its position) or a MongoDB one (idempotent full-document
    /// writes, then the position): exactly once across restarts.
    Receive {
        /// The address to listen on (e.g. 0.0.0.0:7400).
        #[arg(long)]
        listen: String,
        /// The replica database (`postgres://user@host/db`, `host=... dbname=...`, or
        /// `mongodb://host:port/`).
        #[arg(long)]
        into: String,
        /// Handle one connection, then exit (non-zero if it failed).
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        key: KeyArgs,
    },
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<()> {
    let config = SdedupConfig::default();
    match args.cmd {
        Cmd::Encode { stats, batch } => {
            let batch = dedupwire_analyze::parse_size(&batch)
                .with_context(|| format!("--batch {batch:?}: use a size like 4MiB"))?;
            let report = jsonl::encode(
                BufReader::with_capacity(1 << 20, std::io::stdin().lock()),
                BufWriter::with_capacity(1 << 20, std::io::stdout().lock()),
                config,
                batch,
                None,
            )?;
            if stats {
                eprintln!("{}", serde_json::to_string_pretty(&report)?);
            }
        }
        Cmd::Decode => {
            jsonl::decode(
                BufReader::with_capacity(1 << 20, std::io::stdin().lock()),
                BufWriter::with_capacity(1 << 20, std::io::stdout().lock()),
                config,
            )?;
        }
        Cmd::Send {
            from,
            to,
            slot,
            tables,
            batch_bytes,
            window,
            until_drained,
            state,
            stats,
            key,
            plugin,
            publication,
        } => {
            let key = key.key()?;
            let batch_bytes = dedupwire_analyze::parse_size(&batch_bytes)
                .with_context(|| format!("--batch-bytes {batch_bytes:?}: use a size like 4MiB"))?;
            if window == 0 {
                bail!("--window must be at least 1");
            }
            send(SendOptions {
                from,
                to,
                tables,
                stats,
                key,
                config: SenderConfig {
                    sdedup: config,
                    stream: slot,
                    batch_bytes: batch_bytes.max(1),
                plugin: plugin.into(),
                publication,
                    window,
                    until_drained,
                    state_dir: state,
                    ..SenderConfig::default()
                },
            })?;
        }
        Cmd::Receive {
            listen,
            into,
            once,
            key,
        } => receive(&listen, &into, once, key.key()?)?,
    }
    Ok(())
}

struct SendOptions {
    from: String,
    to: String,
    tables: Vec<String>,
    stats: bool,
    key: Option<Key>,
    config: SenderConfig,
}

/// The kind of database a connection string names, by its URL scheme.
#[derive(Clone, Copy)]
enum Database {
    Postgres,
    Mongo,
}

fn database_of(url: &str, flag: &str) -> Result<Database> {
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") | None => Ok(Database::Postgres),
        Some("mongodb") => Ok(Database::Mongo),
        Some(other) => bail!(
            "{flag}: unknown database scheme {other:?}: use postgres://, postgresql://, \
             host=... dbname=... (PostgreSQL) or mongodb:// (MongoDB)"
        ),
    }
}

fn send(o: SendOptions) -> Result<()> {
    match database_of(&o.from, "--from")? {
        Database::Postgres => {
            let (mut source, mut store) = open_pg_source(&o)?;
            send_from(o, &mut source, &mut store)
        }
        Database::Mongo => {
            let (mut source, mut store) = open_mongo_source(&o)?;
            send_from(o, &mut source, &mut store)
        }
    }
}

fn open_mongo_source(o: &SendOptions) -> Result<(MongoSource, MongoDocStore)> {
    if !o.tables.is_empty() {
        bail!("--tables is for PostgreSQL sources: name the MongoDB database in the URL");
    }
    let source = MongoSource::connect(&o.from, MongoSourceConfig::default())
        .context("opening the source")?;
    let store = MongoDocStore::connect(&o.from).context("opening the source")?;
    Ok((source, store))
}

fn open_pg_source(o: &SendOptions) -> Result<(PgSource, PgDocStore)> {
    let tables = if o.tables.is_empty() {
        Tables::All
    } else {
        Tables::Only(o.tables.clone())
    };
    let source = PgSource::connect(
        &o.from,
        PgSourceConfig {
            tables,
            // The sender sleeps between empty polls itself.
            idle_wait: std::time::Duration::ZERO,
            ..PgSourceConfig::with_slot(o.config.stream.clone())
        },
    )
    .context("opening the source")?;
    let store = PgDocStore::connect(&o.from).context("opening the source")?;
    Ok((source, store))
}

fn send_from<Src, St>(o: SendOptions, source: &mut Src, store: &mut St) -> Result<()>
where
    Src: ChangeSource,
    St: SourceStore,
{
    let stream = TcpStream::connect(&o.to)
        .with_context(|| format!("cannot connect to the receiver at {}", o.to))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    let link = transport::client(stream, o.key.as_ref())
        .with_context(|| format!("replication to {} stopped", o.to))?;
    let mut sender = Sender::new(o.config);
    let result = sender.run(link, source, store);
    if o.stats {
        eprintln!("{}", serde_json::to_string_pretty(sender.summary())?);
    }
    let (failed, last) = store.failures();
    if failed > 0 {
        eprintln!(
            "dedupwire: warning: {failed} source reads failed (those documents were sent whole); last: {}",
            last.unwrap_or("?")
        );
    }
    result.with_context(|| format!("replication to {} stopped", o.to))
}

fn receive(listen: &str, into: &str, once: bool, key: Option<Key>) -> Result<()> {
    let database = database_of(into, "--into")?;
    let listener =
        TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    eprintln!(
        "dedupwire: receiving on {}{}, applying to the replica",
        listener.local_addr()?,
        match &key {
    plugin: Plugin,
    publication: Option<String>,
            Some(key) => format!(" (encrypted, key id {})", key.id()),
            None => " (INSECURE: plaintext, unauthenticated)".to_string(),
        }
    );
    loop {
/// `--plugin`: a PostgreSQL output plugin.
#[derive(Clone, Copy, clap::ValueEnum)]
enum PluginArg {
    /// Built into PostgreSQL, allowed by every server.
    Pgoutput,
    /// The wal2json extension.
    Wal2json,
}

impl From<PluginArg> for Plugin {
    fn from(p: PluginArg) -> Plugin {
        match p {
            PluginArg::Pgoutput => Plugin::PgOutput,
            PluginArg::Wal2json => Plugin::Wal2Json,
        }
    }
}

        let (stream, peer) = listener.accept().context("accepting a connection")?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(PEER_TIMEOUT))?;
        let link = match transport::server(stream, key.as_ref()) {
            Ok(link) => link,
            Err(e) => {
                eprintln!("dedupwire: {peer} refused: {e:#}");
                if once {
                    return Err(e.context(format!("the session with {peer} failed")));
                }
                continue;
            }
        };
        let mut receiver = Receiver::new(ReceiverConfig::default());
        let result = apply_to(&mut receiver, link, into, database);
        let s = receiver.summary();
        let who = if s.stream.is_empty() {
            peer.to_string()
        } else {
            format!("{peer} (stream {:?})", s.stream)
        };
        let applied = s
            .applied
            .or(s.resumed_after)
            .map_or("none".to_string(), |p| p.to_string());
        match &result {
            Ok(()) => eprintln!(
                "dedupwire: {who} done: {} changes in {} batches applied, {} entries asked for \
                 raw; position {applied}",
                s.changes, s.batches, s.fallbacks
            ),
            Err(e) => eprintln!(
                "dedupwire: {who} stopped after {} changes in {} batches (position \
                 {applied}): {e}",
                s.changes, s.batches
            ),
        }
        if once {
            return result.with_context(|| format!("the session with {peer} failed"));
        }
    }
}

/// One receiver session applying to the replica at `into`.
fn apply_to<S: Read + Write>(
    receiver: &mut Receiver,
    stream: S,
    into: &str,
    database: Database,
) -> Result<(), LiveError> {
    match database {
            plugin: o.plugin,
            publication: o.publication.clone(),
        Database::Postgres => receiver.run(stream, |stream| {
            PgSink::connect(into, PgSinkConfig::with_stream(stream))
        }),
        Database::Mongo => receiver.run(stream, |stream| MongoSink::connect(into, stream)),
    }
}
