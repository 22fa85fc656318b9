//! `dedupwire serve --listen ADDR --root DIR`: receives trees from `dedupwire send` into DIR,
//! one thread per connection, each tree swapped in atomically (`dedupwire_sync::apply`),
//! with a persistent chunk environment in `DIR/.dedupwire/env` so that later versions and
//! interrupted sends cost only what the environment lacks.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use dedupwire_analyze::report::human_bytes;
use dedupwire_sync::{serve, TreeRoot};
use dedupwire_wire::{ChannelConfig, ChunkStore, DedupStream, EnvConfig, Environment, Key, Role};

use crate::transport::{self, KeyArgs};

/// How long either end waits for the other before giving up on a connection.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest message a receiver accepts (a manifest of millions of files fits).
const MAX_MESSAGE: u64 = 1 << 30;

/// Options of `dedupwire serve`.
#[derive(clap::Args)]
pub struct Args {
    /// The address to listen on (e.g. 0.0.0.0:7300; port 0 picks one, printed at start).
    #[arg(long)]
    listen: String,
    /// The directory trees are received into: `dedupwire send SRC HOST:PORT:NAME` makes
    /// ROOT/NAME a copy of SRC.
    #[arg(long)]
    root: PathBuf,
    /// Bound on the chunk environment in ROOT/.dedupwire/env (oldest chunks evicted past it).
    #[arg(long, default_value = "4GiB", value_name = "SIZE")]
    env_size: String,
    /// Handle one connection, then exit (non-zero if it failed).
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    key: KeyArgs,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<()> {
    let key = args.key.key()?;
    let max_bytes = dedupwire_analyze::parse_size(&args.env_size)
        .with_context(|| format!("--env-size {:?}: use a size like 4GiB", args.env_size))?
        as u64;
    std::fs::create_dir_all(&args.root)
        .with_context(|| format!("creating {}", args.root.display()))?;
    let root = Arc::new(TreeRoot::open(&args.root)?);
    let env_config = EnvConfig {
        max_bytes,
        segment_bytes: (max_bytes / 2).clamp(4096, 64 << 20),
        ..EnvConfig::default()
    };
    let env = Arc::new(
        Environment::open(root.env_dir(), env_config)
            .with_context(|| format!("opening the chunk environment of {}", args.root.display()))?,
    );
    // The environment's lock is ours: no other `serve` works in this root.
    root.clean()?;
    let listener =
        TcpListener::bind(&args.listen).with_context(|| format!("listening on {}", args.listen))?;
    eprintln!(
        "dedupwire serve: listening on {}, receiving into {}",
        listener.local_addr()?,
        args.root.display()
    );
    loop {
        let (stream, peer) = listener.accept().context("accepting a connection")?;
        let (root, env, key) = (root.clone(), env.clone(), key.clone());
        let handle = move || {
            let r = session(stream, &root, env, key.as_ref());
            match &r {
                Ok(line) => eprintln!("dedupwire serve: {peer}: {line}"),
                Err(e) => eprintln!("dedupwire serve: {peer}: error: {e:#}"),
            }
            r.map(|_| ())
        };
        if args.once {
            return handle();
        }
        std::thread::spawn(handle);
    }
}

/// One connection: the secure handshake, the channel's, then one tree.
fn session(
    stream: TcpStream,
    root: &TreeRoot,
    env: Arc<Environment>,
    key: Option<&Key>,
) -> Result<String> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    let raw = stream.try_clone()?;
    let r = receive(stream, root, env, key);
    if r.is_err() {
        linger(&raw);
    }
    r
}

/// After a failure: lets the peer read why (the channel's ERROR frame or our ERROR message)
/// before the socket closes. Closing with the peer's bytes unread would reset the connection
/// and the peer could lose the explanation; so say we are done writing and read what it
/// still sends, briefly.
fn linger(raw: &TcpStream) {
    let _ = raw.shutdown(std::net::Shutdown::Write);
    let _ = raw.set_read_timeout(Some(Duration::from_millis(500)));
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; 64 << 10];
    while std::time::Instant::now() < until {
        match std::io::Read::read(&mut &*raw, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

fn receive(
    stream: TcpStream,
    root: &TreeRoot,
    env: Arc<Environment>,
    key: Option<&Key>,
) -> Result<String> {
    let conn = transport::server(stream, key)?;
    let store: Arc<dyn ChunkStore> = env.clone();
    // A sender's messages are a manifest and ~32 MiB batches: refuse anything much larger
    // before buffering it.
    let config = ChannelConfig {
        max_message: MAX_MESSAGE,
        ..ChannelConfig::default()
    };
    let mut channel =
        DedupStream::new(conn, store, config, Role::Accept).context("channel handshake failed")?;
    let r = serve(root, &*env, &mut channel)?;
    let s = channel.stats();
    let d = &r.diff;
    Ok(format!(
        "{}{:?}: {} new, {} changed, {} unchanged, {} deleted; {} files ({}) from the \
         sender, {} on the wire in, {} out",
        if r.dry_run { "dry run of " } else { "" },
        r.name,
        d.files_new,
        d.files_changed,
        d.files_unchanged,
        d.files_deleted,
        r.files_received,
        human_bytes(r.bytes_received),
        human_bytes(s.socket_bytes_received),
        human_bytes(s.socket_bytes_sent)
    ))
}
