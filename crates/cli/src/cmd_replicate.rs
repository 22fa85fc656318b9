//! `dedupwire replicate encode|decode|send|receive`: sDedup over JSON-lines change streams,
//! and live replication of PostgreSQL document tables or a MongoDB oplog over TCP,
//! authenticated and encrypted with a shared key unless both ends say `--insecure-plaintext`.

use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};

use anyhow::{bail, Context, Result};
use dedupwire_analyze::report::human_bytes;
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
        /// Print one line to stderr at the end: entries, bytes in and out, ratio, deltas,
        /// literals, fallbacks and seconds.
        #[arg(long)]
        stats: bool,
        /// Print the statistics to stderr as JSON instead (every field, index memory too;
        /// docs/replicate.md describes them); implies --stats.
        #[arg(long)]
        json: bool,
        /// Input bytes per batch (e.g. 4MiB).
        #[arg(long, default_value = "4MiB")]
        batch: String,
    },
    /// Decode an sDedup stream (stdin) back into the exact JSON lines (stdout).
    ///
    /// Exits non-zero, saying why, on anything but a complete stream: cut short, a batch
    /// repeated, missing or out of order, damaged, or an older format version. When stdin is
    /// a file its frames are checked first, so a cut or shuffled file writes nothing.
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
        /// PostgreSQL: the output plugin a new slot decodes with (an existing slot keeps its
        /// own). pgoutput is built into the server; wal2json needs the extension and a server
        /// whose output_plugin_libraries lists it.
        #[arg(long, value_enum, default_value = "pgoutput")]
        plugin: PluginArg,
        /// PostgreSQL, pgoutput: the publication to read (default: named like the slot, and
        /// created if missing, FOR ALL TABLES or FOR TABLE the --tables).
        #[arg(long)]
        publication: Option<String>,
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
        Cmd::Encode { stats, json, batch } => {
            let batch = dedupwire_analyze::parse_size(&batch)
                .with_context(|| format!("--batch {batch:?}: use a size like 4MiB"))?;
            let report = jsonl::encode(
                BufReader::with_capacity(1 << 20, std::io::stdin().lock()),
                BufWriter::with_capacity(1 << 20, std::io::stdout().lock()),
                config,
                batch,
                None,
            )?;
            if json {
                eprintln!("{}", serde_json::to_string_pretty(&report)?);
            } else if stats {
                eprintln!("{}", encode_line(&report));
            }
        }
        Cmd::Decode => decode(config)?,
        Cmd::Send {
            from,
            to,
            slot,
            tables,
            plugin,
            publication,
            batch_bytes,
            window,
            until_drained,
            state,
            stats,
            key,
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
                plugin: plugin.into(),
                publication,
                stats,
                key,
                config: SenderConfig {
                    sdedup: config,
                    stream: slot,
                    batch_bytes: batch_bytes.max(1),
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

/// The `encode --stats` line: what went in and out, how, and how long it took.
fn encode_line(r: &jsonl::EncodeReport) -> String {
    let s = &r.stats;
    let count = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    format!(
        "dedupwire: encoded {} in {}: {} -> {} ({:.1}x); {}, {}, {}; {:.2} s",
        count(s.entries, "entry", "entries"),
        count(r.batches, "batch", "batches"),
        human_bytes(s.input_bytes),
        human_bytes(s.output_bytes),
        r.ratio,
        count(s.deltas, "delta", "deltas"),
        count(s.literals, "literal", "literals"),
        count(s.fallbacks, "fallback", "fallbacks"),
        r.elapsed_s
    )
}

/// `replicate decode`: stdin to stdout, failing on anything but a complete stream. A file on
/// stdin has its frames checked before any line is written; from a pipe the lines go out as
/// decoded and an error says how much of them reached stdout.
fn decode(config: SdedupConfig) -> Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, Counted::new(std::io::stdout().lock()));
    let result = match stdin_file() {
        Some(mut file) => {
            let start = file.stream_position()?;
            jsonl::check_frames(BufReader::new(&file)).context("decoding stdin")?;
            file.seek(SeekFrom::Start(start))?;
            jsonl::decode(BufReader::with_capacity(1 << 20, &file), &mut out, config)
        }
        None => jsonl::decode(
            BufReader::with_capacity(1 << 20, std::io::stdin().lock()),
            &mut out,
            config,
        ),
    };
    match result {
        Ok(_) => {
            out.flush()?;
            Ok(())
        }
        Err(e) => {
            let (counted, _) = out.into_parts();
            Err(match counted.bytes {
                0 => anyhow::anyhow!("decoding stdin: {e}"),
                n => anyhow::anyhow!(
                    "decoding stdin: {e}; the {} of lines that reached stdout before it are \
                     not the whole stream",
                    human_bytes(n)
                ),
            })
        }
    }
}

/// Stdin as a file, when it is one: its frames can be checked before decoding.
#[cfg(unix)]
fn stdin_file() -> Option<std::fs::File> {
    use std::os::fd::AsFd;
    let fd = std::io::stdin().as_fd().try_clone_to_owned().ok()?;
    let file = std::fs::File::from(fd);
    file.metadata().ok()?.is_file().then_some(file)
}

/// Stdin as a file, when it is one (only known on Unix).
#[cfg(not(unix))]
fn stdin_file() -> Option<std::fs::File> {
    None
}

/// A writer that counts the bytes it passed on.
struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W> Counted<W> {
    fn new(inner: W) -> Self {
        Counted { inner, bytes: 0 }
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

struct SendOptions {
    from: String,
    to: String,
    tables: Vec<String>,
    plugin: Plugin,
    publication: Option<String>,
    stats: bool,
    key: Option<Key>,
    config: SenderConfig,
}

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
            plugin: o.plugin,
            publication: o.publication.clone(),
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
            Some(key) => format!(" (encrypted, key id {})", key.id()),
            None => " (INSECURE: plaintext, unauthenticated)".to_string(),
        }
    );
    loop {
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
        Database::Postgres => receiver.run(stream, |stream| {
            PgSink::connect(into, PgSinkConfig::with_stream(stream))
        }),
        Database::Mongo => receiver.run(stream, |stream| MongoSink::connect(into, stream)),
    }
}
