//! The dedup channel as two separate processes, for the shaped-link benchmark
//! (`bench/links.sh`), where sender and receiver live in different network namespaces.
//!
//! `channel-recv` listens, accepts `--connections` connections one after the other and
//! receives every message on each, keeping chunks in a persistent [`Environment`] (`--env`),
//! so a series sent in several runs dedups against everything received before, as a real
//! receiver that already holds the previous release does; with `--stream` it writes what
//! arrives to standard output as it arrives. `channel-send` connects and sends each input as
//! one message (`-` is standard input, streamed through `io::Write` as it is read), then
//! writes its socket counts and channel statistics as JSON; with `--env` it keeps what it
//! sent (and its sketches) in an Environment of its own, as a real sender does. Both ends use
//! plain frames (no encryption): the benchmark is about bytes and link time, and encryption
//! costs about 1 CPU-second per GB.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use dedupwire_wire::channel::Role;
use dedupwire_wire::{
    ChannelConfig, ChunkStore, DedupStream, EnvConfig, Environment, MemoryStore, Mode,
};
use serde_json::json;

/// Options of the receiving end.
#[derive(clap::Args)]
pub struct RecvArgs {
    /// Address to listen on (IP:PORT).
    #[arg(long)]
    listen: String,
    /// The receiver's persistent chunk environment (a directory, created if needed).
    #[arg(long)]
    env: PathBuf,
    /// Channel mode (dedup, adaptive, plain); both ends must agree.
    #[arg(long, default_value = "adaptive")]
    mode: String,
    /// Connections to serve, one after the other, before exiting.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Write each received message to DIR/msg-<n> (default: verify it and drop it).
    #[arg(long, conflicts_with = "stream")]
    out: Option<PathBuf>,
    /// Write what arrives to standard output as it arrives (`io::Read`), messages back to back.
    #[arg(long)]
    stream: bool,
    /// Create this file once listening (for scripts waiting for the port).
    #[arg(long)]
    ready: Option<PathBuf>,
}

/// Options of the sending end.
#[derive(clap::Args)]
pub struct SendArgs {
    /// Address of a `channel-recv` (IP:PORT).
    #[arg(long)]
    connect: String,
    /// Files to send, each one message; `-` is standard input.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Channel mode (dedup, adaptive, plain); both ends must agree.
    #[arg(long, default_value = "adaptive")]
    mode: String,
    /// Write socket bytes, seconds and channel statistics as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The sender's persistent chunk Environment (what earlier runs sent: delta bases for
    /// this one); without it, a store in memory that starts empty.
    #[arg(long)]
    env: Option<PathBuf>,
}

fn config(mode: &str) -> Result<ChannelConfig> {
    let mode = match mode {
        "dedup" => Mode::Dedup,
        "adaptive" => Mode::Adaptive,
        "plain" => Mode::Plain,
        other => bail!("unknown mode {other:?} (dedup, adaptive, plain)"),
    };
    Ok(ChannelConfig {
        mode,
        ..ChannelConfig::default()
    })
}

/// Receives until `--connections` peers have sent everything and closed.
pub fn recv(args: &RecvArgs) -> Result<()> {
    let config = config(&args.mode)?;
    let env = Arc::new(
        Environment::open(&args.env, EnvConfig::default())
            .with_context(|| format!("environment {}", args.env.display()))?,
    );
    let listener =
        TcpListener::bind(&args.listen).with_context(|| format!("listen on {}", args.listen))?;
    if let Some(r) = &args.ready {
        std::fs::write(r, b"")?;
    }
    let mut n = 0usize;
    for _ in 0..args.connections {
        let (s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let store: Arc<dyn ChunkStore> = env.clone();
        let mut ch = DedupStream::new(s, store, config.clone(), Role::Accept)?;
        ch.look_between_calls();
        if args.stream {
            let mut out = File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
            copy_big(&mut ch, &mut out)?;
            continue;
        }
        loop {
            match ch.recv() {
                Ok(m) => {
                    if let Some(dir) = &args.out {
                        std::fs::write(dir.join(format!("msg-{n}")), &m)?;
                    }
                    n += 1;
                }
                Err(e) if e.is_peer_closed() => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    env.sync()?;
    Ok(())
}

/// Bytes moved per read and write between standard I/O and the channel: `io::copy`'s 8 KiB,
/// through standard output's line buffering, made 12 000 `write` calls for a 49 MB tar (about
/// 0.1 s of system time) where `nc` and `zstd` make a few hundred.
const STDIO_BUF: usize = 1 << 20;

/// Copies `from` to `to` until its end in [`STDIO_BUF`] pieces; returns the bytes copied.
fn copy_big(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<u64> {
    let mut buf = vec![0u8; STDIO_BUF];
    let mut n = 0u64;
    loop {
        let got = match from.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..got])?;
        n += got as u64;
    }
}

/// Sends every input as one message and reports what crossed the socket.
pub fn send(args: &SendArgs) -> Result<()> {
    let config = config(&args.mode)?;
    let t0 = Instant::now();
    let s = TcpStream::connect(&args.connect)
        .with_context(|| format!("connect to {}", args.connect))?;
    s.set_nodelay(true)?;
    let env = match &args.env {
        Some(dir) => Some(Arc::new(
            Environment::open(dir, EnvConfig::default())
                .with_context(|| format!("environment {}", dir.display()))?,
        )),
        None => None,
    };
    let store: Arc<dyn ChunkStore> = match &env {
        Some(env) => env.clone(),
        None => Arc::new(MemoryStore::new()),
    };
    let mut ch = DedupStream::new(s, store, config, Role::Connect)?;
    ch.look_between_calls();
    let mut messages = Vec::new();
    for p in &args.inputs {
        let t = Instant::now();
        let bytes = if p.as_os_str() == "-" {
            let mut input = File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
            let n = copy_big(&mut input, &mut ch)?;
            ch.flush()?;
            n as usize
        } else {
            let data = std::fs::read(p).with_context(|| p.display().to_string())?;
            ch.send(&data)?;
            data.len()
        };
        messages
            .push(json!({"input": p, "bytes": bytes, "send_seconds": t.elapsed().as_secs_f64()}));
    }
    let st = ch.stats();
    ch.close()?;
    if let Some(env) = &env {
        env.sync()?;
    }
    let j = json!({
        "mode": args.mode,
        "messages": messages,
        "socket_bytes_sent": st.socket_bytes_sent,
        "socket_bytes_received": st.socket_bytes_received,
        "seconds": t0.elapsed().as_secs_f64(),
        "segments_dedup": st.segments_dedup,
        "segments_plain": st.segments_plain,
        "chunks_hit": st.chunks_hit,
        "chunks_delta": st.chunks_delta,
        "chunks_zdelta": st.chunks_zdelta,
        "chunks_literal": st.chunks_literal,
        "round_trips": st.round_trips,
        "segments_kept": st.segments_kept,
        "plain_estimates": st.plain_estimates,
        "bytes_plain": st.bytes_plain,
        "dedup_rate": st.dedup_rate,
        "plain_rate": st.plain_rate,
        "plain_level": st.plain_level,
    });
    match &args.json {
        Some(path) => std::fs::write(path, serde_json::to_string_pretty(&j)?)?,
        None => println!("{j}"),
    }
    Ok(())
}
