//! Channel: a series of inputs (consecutive releases) sent over loopback TCP through the dedup
//! channel, beside the same inputs as plain zstd-3 over a socket (`tar | zstd | nc`).
//!
//! Each input is one message, in order, on one connection per method, so later inputs can
//! dedup against earlier ones. Per input and cumulatively: bytes on the socket (frames,
//! handshake and the receiver's answers included) and input MB/s (wall time of `send`, which
//! returns once the receiver has verified the message). `--link-mbps` paces the sender's
//! writes to a link of that speed with a 4 MiB queue, to see the shaped-link case (only
//! the sending direction is paced; its latency is loopback's).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_wire::channel::Role;
use dedupwire_wire::{ChannelConfig, DedupStream, MemoryStore, Mode};

/// Options of the channel benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Input files, or directories whose files are taken in name order; each file is one
    /// message. Without inputs: generated releases (random text with small edits).
    inputs: Vec<PathBuf>,
    /// Channel modes to run (dedup, adaptive, plain).
    #[arg(long, value_delimiter = ',', default_value = "dedup,adaptive")]
    modes: Vec<String>,
    /// Chunking levels as CDC average sizes in bytes, coarsest first (default: the channel's).
    #[arg(long, value_delimiter = ',')]
    levels: Vec<usize>,
    /// Cap the sender's writes at this many megabits per second (default: unshaped).
    #[arg(long)]
    link_mbps: Option<f64>,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn load(args: &Args) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    for p in &args.inputs {
        if p.is_dir() {
            let mut in_dir: Vec<PathBuf> = std::fs::read_dir(p)?
                .map(|e| e.map(|e| e.path()))
                .collect::<std::io::Result<_>>()?;
            in_dir.retain(|f| f.is_file());
            in_dir.sort();
            files.extend(in_dir);
        } else {
            files.push(p.clone());
        }
    }
    if files.is_empty() {
        return Ok(generated());
    }
    files
        .iter()
        .map(|f| {
            let name = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            Ok((
                name,
                std::fs::read(f).with_context(|| f.display().to_string())?,
            ))
        })
        .collect()
}

/// Six "releases" of 32 MB of text-like data, each with 1% of its bytes rewritten.
fn generated() -> Vec<(String, Vec<u8>)> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let words: Vec<String> = (0..4096).map(|i| format!("w{:x} ", i * 7919)).collect();
    let mut base = Vec::with_capacity(32 << 20);
    while base.len() < 32 << 20 {
        base.extend_from_slice(words[(next() % 4096) as usize].as_bytes());
    }
    let mut out = Vec::new();
    for v in 1..=6 {
        for _ in 0..64 {
            let at = (next() as usize) % (base.len() - 6000);
            for b in &mut base[at..at + 5000] {
                *b = b'a' + (next() % 26) as u8;
            }
        }
        out.push((format!("generated-{v}"), base.clone()));
    }
    out
}

/// A stream whose writes are paced to `bytes_per_sec`, like a link with a `LINK_BUFFER`-byte
/// queue: a write returns at once while the queue has room and blocks while it is full.
/// [`Paced::drain`] waits until everything written has gone through.
struct Paced<S> {
    inner: S,
    bytes_per_sec: Option<f64>,
    start: Instant,
    written: std::cell::Cell<u64>,
}

/// Bytes a paced link queues before writes block (a socket buffer's worth).
const LINK_BUFFER: f64 = 4.0 * 1024.0 * 1024.0;

impl<S> Paced<S> {
    fn new(inner: S, link_mbps: Option<f64>) -> Self {
        Paced {
            inner,
            bytes_per_sec: link_mbps.map(|m| m * 1e6 / 8.0),
            start: Instant::now(),
            written: std::cell::Cell::new(0),
        }
    }

    /// Sleeps until the link has carried `written - queue` bytes.
    fn wait(&self, queue: f64) {
        if let Some(rate) = self.bytes_per_sec {
            let due = ((self.written.get() as f64 - queue) / rate).max(0.0);
            if let Some(wait) = Duration::from_secs_f64(due).checked_sub(self.start.elapsed()) {
                thread::sleep(wait);
            }
        }
    }

    /// Waits until everything written has crossed the link.
    fn drain(&self) {
        self.wait(0.0);
    }
}

impl<S: Read> Read for Paced<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<S: Write> Write for Paced<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(&buf[..buf.len().min(64 << 10)])?;
        self.written.set(self.written.get() + n as u64);
        self.wait(LINK_BUFFER);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Per input: bytes on the socket and seconds.
type Row = Vec<(u64, f64)>;

fn run_channel(inputs: &[(String, Vec<u8>)], mode: Mode, args: &Args) -> Result<Row> {
    let link = args.link_mbps;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut config = if args.levels.is_empty() {
        ChannelConfig::default()
    } else {
        let specs: Vec<ChunkerSpec> = args.levels.iter().map(|&a| ChunkerSpec::cdc(a)).collect();
        ChannelConfig::with_levels(&specs)?
    };
    config.mode = mode;
    let server_config = config.clone();
    let expect: Vec<usize> = inputs.iter().map(|i| i.1.len()).collect();
    let server = thread::spawn(move || -> Result<()> {
        let (s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let store = Arc::new(MemoryStore::new());
        let mut ch = DedupStream::new(s, store, server_config, Role::Accept)?;
        for want in expect {
            let got = ch.recv()?;
            if got.len() != want {
                bail!("received {} bytes, {want} were sent", got.len());
            }
        }
        Ok(())
    });
    let s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut ch = DedupStream::new(
        Paced::new(s, link),
        Arc::new(MemoryStore::new()),
        config,
        Role::Connect,
    )?;
    let mut row = Vec::new();
    let mut before = ch.stats();
    for (_, data) in inputs {
        let t = Instant::now();
        ch.send(data)?;
        ch.get_ref().drain();
        let secs = t.elapsed().as_secs_f64();
        let now = ch.stats();
        let bytes = (now.socket_bytes_sent + now.socket_bytes_received)
            - (before.socket_bytes_sent + before.socket_bytes_received);
        row.push((bytes, secs));
        before = now;
    }
    let st = ch.stats();
    eprintln!(
        "  {mode:?}: {} dedup / {} plain segments, {} hit / {} delta / {} literal chunks, {:.1}% \
         redundant, {} round trips",
        st.segments_dedup,
        st.segments_plain,
        st.chunks_hit,
        st.chunks_delta,
        st.chunks_literal,
        st.redundancy() * 100.0,
        st.round_trips
    );
    ch.close()?;
    server.join().expect("server thread")?;
    Ok(row)
}

/// Each input as one zstd-3 stream over its own TCP connection, decompressed by the receiver.
fn run_zstd(inputs: &[(String, Vec<u8>)], link: Option<f64>) -> Result<Row> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let n = inputs.len();
    let server = thread::spawn(move || -> Result<()> {
        for _ in 0..n {
            let (mut s, _) = listener.accept()?;
            let mut d = zstd::Decoder::new(&mut s)?;
            std::io::copy(&mut d, &mut std::io::sink())?;
            drop(d);
            s.write_all(b"k")?;
        }
        Ok(())
    });
    let mut row = Vec::new();
    for (_, data) in inputs {
        let t = Instant::now();
        let s = TcpStream::connect(addr)?;
        let mut paced = Paced::new(s.try_clone()?, link);
        let mut e = zstd::Encoder::new(&mut paced, 3)?;
        e.write_all(data)?;
        e.finish()?;
        paced.drain();
        let sent = paced.written.get();
        s.shutdown(std::net::Shutdown::Write)?;
        let mut ack = [0u8; 1];
        (&s).read_exact(&mut ack)?;
        row.push((sent, t.elapsed().as_secs_f64()));
    }
    server.join().expect("server thread")?;
    Ok(row)
}

/// Runs the benchmark and prints one table.
pub fn run(args: &Args) -> Result<()> {
    let inputs = load(args)?;
    let total: u64 = inputs.iter().map(|i| i.1.len() as u64).sum();
    eprintln!(
        "channel: {} inputs, {:.1} MB, levels {:?}, link {}",
        inputs.len(),
        total as f64 / 1e6,
        args.levels,
        args.link_mbps
            .map_or("unshaped loopback".into(), |m| format!("{m} Mbit/s"))
    );
    let mut methods: Vec<(String, Row)> =
        vec![("zstd-3".into(), run_zstd(&inputs, args.link_mbps)?)];
    for m in &args.modes {
        let mode = match m.as_str() {
            "dedup" => Mode::Dedup,
            "adaptive" => Mode::Adaptive,
            "plain" => Mode::Plain,
            other => bail!("unknown mode {other:?} (dedup, adaptive, plain)"),
        };
        methods.push((format!("channel-{m}"), run_channel(&inputs, mode, args)?));
    }
    print!("{:<24} {:>9}", "input", "MB");
    for (name, _) in &methods {
        print!(" {:>22}", format!("{name} MB (MB/s)"));
    }
    println!();
    let mut cum = vec![(0u64, 0f64); methods.len()];
    for (i, (name, data)) in inputs.iter().enumerate() {
        print!("{:<24} {:>9.2}", name, data.len() as f64 / 1e6);
        for (k, (_, row)) in methods.iter().enumerate() {
            let (b, s) = row[i];
            cum[k].0 += b;
            cum[k].1 += s;
            print!(
                " {:>22}",
                format!("{:.3} ({:.0})", b as f64 / 1e6, data.len() as f64 / 1e6 / s)
            );
        }
        println!();
    }
    print!("{:<24} {:>9.2}", "total", total as f64 / 1e6);
    for (b, s) in &cum {
        print!(
            " {:>22}",
            format!("{:.3} ({:.0})", *b as f64 / 1e6, total as f64 / 1e6 / s)
        );
    }
    println!();
    if let Some(path) = &args.json {
        let j = serde_json::json!({
            "inputs": inputs.iter().map(|i| serde_json::json!({"name": i.0, "bytes": i.1.len()})).collect::<Vec<_>>(),
            "link_mbps": args.link_mbps,
            "methods": methods.iter().map(|(name, row)| serde_json::json!({
                "name": name,
                "socket_bytes": row.iter().map(|r| r.0).collect::<Vec<_>>(),
                "seconds": row.iter().map(|r| r.1).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(())
}
