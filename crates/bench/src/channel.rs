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
use std::sync::{Arc, Condvar, Mutex};
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

/// A link of `bytes_per_sec` in front of a TCP stream, as a shaped router would be: writes
/// queue up to [`LINK_BUFFER`] bytes (a write blocks while the queue is full) and a pump thread
/// hands them to the socket at the link's rate, so the receiver gets the bytes, and the sender
/// its acknowledgements, at the link's pace. Reads come straight from the socket. Without a
/// rate, writes go straight through. [`Paced::drain`] waits until everything written has gone
/// through.
///
/// (It used to write at once and then make the writer wait: the receiver had every byte at
/// loopback speed, so the channel's adaptive mode, which times the link by its
/// acknowledgements, saw no link at all and sent plain segments at "100 Mbit/s".)
struct Paced {
    stream: TcpStream,
    link: Option<Link>,
    written: std::cell::Cell<u64>,
}

/// The queue and the pump of a [`Paced`] stream.
struct Link {
    tx: Option<std::sync::mpsc::SyncSender<Vec<u8>>>,
    queue: Arc<(Mutex<Queue>, Condvar)>,
    pump: Option<thread::JoinHandle<()>>,
}

/// Bytes waiting for the link, and why the pump stopped, if it did.
#[derive(Default)]
struct Queue {
    bytes: u64,
    failed: Option<std::io::ErrorKind>,
}

/// Bytes a paced link queues before writes block (a socket buffer's worth).
const LINK_BUFFER: u64 = 4 << 20;

impl Paced {
    fn new(stream: TcpStream, link_mbps: Option<f64>) -> Result<Self> {
        let link = match link_mbps {
            None => None,
            Some(mbps) => {
                let rate = mbps * 1e6 / 8.0;
                let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(1024);
                let queue = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
                let (mut out, q) = (stream.try_clone()?, Arc::clone(&queue));
                let pump = thread::spawn(move || {
                    let mut free = Instant::now();
                    for chunk in rx {
                        free = free.max(Instant::now())
                            + Duration::from_secs_f64(chunk.len() as f64 / rate);
                        thread::sleep(free.saturating_duration_since(Instant::now()));
                        let result = out.write_all(&chunk);
                        let mut queue = q.0.lock().expect("no panics while held");
                        queue.bytes -= chunk.len() as u64;
                        if let Err(e) = result {
                            queue.failed = Some(e.kind());
                        }
                        q.1.notify_all();
                        if queue.failed.is_some() {
                            return;
                        }
                    }
                });
                Some(Link {
                    tx: Some(tx),
                    queue,
                    pump: Some(pump),
                })
            }
        };
        Ok(Paced {
            stream,
            link,
            written: std::cell::Cell::new(0),
        })
    }

    /// Waits until everything written has crossed the link.
    fn drain(&self) {
        if let Some(link) = &self.link {
            let (lock, cv) = &*link.queue;
            let mut queue = lock.lock().expect("no panics while held");
            while queue.bytes > 0 && queue.failed.is_none() {
                queue = cv.wait(queue).expect("no panics while held");
            }
        }
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        if let Some(link) = &mut self.link {
            link.tx.take();
            if let Some(pump) = link.pump.take() {
                let _ = pump.join();
            }
        }
    }
}

impl Read for Paced {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for Paced {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(link) = &self.link else {
            let n = self.stream.write(buf)?;
            self.written.set(self.written.get() + n as u64);
            return Ok(n);
        };
        let n = buf.len().min(64 << 10);
        {
            let (lock, cv) = &*link.queue;
            let mut queue = lock.lock().expect("no panics while held");
            while queue.bytes > 0 && queue.bytes + n as u64 > LINK_BUFFER && queue.failed.is_none()
            {
                queue = cv.wait(queue).expect("no panics while held");
            }
            if let Some(kind) = queue.failed {
                return Err(std::io::Error::new(kind, "the paced link's socket failed"));
            }
            queue.bytes += n as u64;
        }
        let tx = link
            .tx
            .as_ref()
            .expect("the pump's sender lives until drop");
        tx.send(buf[..n].to_vec())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the pump stopped"))?;
        self.written.set(self.written.get() + n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.link {
            None => self.stream.flush(),
            Some(_) => Ok(()),
        }
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
        Paced::new(s, link)?,
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
        let mut paced = Paced::new(s.try_clone()?, link)?;
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
