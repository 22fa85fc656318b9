//! `dedupwire serve --listen ADDR --root DIR`: receives trees from `dedupwire send` into DIR,
//! one thread per connection, each tree swapped in atomically (`dedupwire_sync::apply`),
//! with a persistent chunk environment in `DIR/.dedupwire/env` so that later versions and
//! interrupted sends cost only what the environment lacks.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use dedupwire_analyze::report::human_bytes;
use dedupwire_sync::{serve_on, Peer, TreeRoot};
use dedupwire_wire::{ChannelConfig, ChunkStore, DedupStream, EnvConfig, Environment, Key, Role};

use crate::transport::{self, KeyArgs};

/// How long either end waits for the other before giving up on a connection.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest message a receiver accepts (a manifest of millions of files fits).
const MAX_MESSAGE: u64 = 1 << 30;
/// How long a connection may take to authenticate and agree on the channel: a peer that has
/// not by then (a stranger holding a connection open) is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections handled at once; more are closed as they come, so that strangers opening
/// connections cannot take a thread each without bound.
const MAX_CONNECTIONS: usize = 64;
/// How long a failed connection waits for its peer to read the error and hang up: a sender
/// busy writing (a slow, loaded machine) reads it between its writes.
const LINGER: Duration = Duration::from_secs(20);
/// The smallest chunk environment: it must hold a few of the largest chunks a sender makes
/// (1 MiB) in each of its segments (half the environment).
const MIN_ENV_BYTES: u64 = 16 << 20;

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
    if max_bytes < MIN_ENV_BYTES {
        bail!(
            "--env-size {}: the chunk environment needs at least {} (it keeps chunks of up \
             to 1 MiB in segments of half its size); use 16MiB or more",
            args.env_size,
            human_bytes(MIN_ENV_BYTES)
        );
    }
    create_root(&args.root)?;
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
    let live = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, peer) = listener.accept().context("accepting a connection")?;
        if live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            live.fetch_sub(1, Ordering::SeqCst);
            eprintln!(
                "dedupwire serve: {peer}: refused: already {MAX_CONNECTIONS} connections at once"
            );
            drop(stream);
            continue;
        }
        let (root, env, key, live) = (root.clone(), env.clone(), key.clone(), live.clone());
        let handle = move || {
            let r = session(stream, &root, env, key.as_ref());
            live.fetch_sub(1, Ordering::SeqCst);
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

/// Creates the root directory if missing, but only its last component: a mistyped path
/// (`/srv/bakcups/site`) fails instead of growing a new tree of directories.
fn create_root(root: &std::path::Path) -> Result<()> {
    if root.is_dir() {
        return Ok(());
    }
    let parent = match root.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if !parent.is_dir() {
        bail!(
            "--root {}: {} is not an existing directory (serve creates the root itself, not \
             its parents)",
            root.display(),
            parent.display()
        );
    }
    std::fs::create_dir(root).with_context(|| format!("creating {}", root.display()))
}

/// A connection's socket, for the name lock: gone when the sender hung up, even while this
/// end still has its earlier bytes to read.
struct TcpPeer(TcpStream);

impl Peer for TcpPeer {
    fn gone(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(&self.0, PollFlags::RDHUP)];
        match poll(&mut fds, Some(&rustix::event::Timespec::default())) {
            Ok(_) => fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
            Err(_) => true,
        }
    }

    fn abort(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
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
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
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
    let until = std::time::Instant::now() + LINGER;
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
    let raw = stream.try_clone()?;
    let peer: Arc<dyn Peer> = Arc::new(TcpPeer(stream.try_clone()?));
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
    raw.set_read_timeout(Some(PEER_TIMEOUT))?;
    raw.set_write_timeout(Some(PEER_TIMEOUT))?;
    let r = serve_on(root, &*env, &mut channel, Some(peer))?;
    let s = channel.stats();
    let d = &r.diff;
    Ok(format!(
        "{}{}{:?}: {} new, {} changed, {} unchanged, {} deleted; {} files ({}) from the \
         sender, {} on the wire in, {} out",
        if r.took_over {
            "resumed after its sender had gone: "
        } else {
            ""
        },
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
