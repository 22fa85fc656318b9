//! Secure: what the encrypted transport costs. Frames go through `Framed` from one thread to
//! another, plain and inside a `SecureStream` (Noise, ChaCha20-Poly1305), over a loopback TCP
//! connection and over an in-memory pipe (no kernel: the cipher and the copies alone).
//!
//! Each measurement moves `--mib` MiB of frame payload (pseudo-random bytes) after the
//! handshake; the median of `--runs` runs is reported in GB/s (10^9 payload bytes per second of
//! wall time, writer and reader on two threads), and per CPU second of the writing and of the
//! reading thread (steadier on a shared machine: the cost of sealing and of opening). The
//! ratio column divides the wall-time figure by the plain run of the same medium and frame
//! size.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use anyhow::{anyhow, Result};
use dedupwire_wire::{FrameType, Framed, Key, SecureStream};
use serde_json::json;

use crate::replicate::thread_cpu;

/// Options of the secure transport benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Payload MiB moved per run.
    #[arg(long, default_value_t = 256)]
    mib: u64,
    /// Frame payload sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "16384,1048576")]
    frames: Vec<usize>,
    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

trait Conn: Read + Write + Send {}

impl<T: Read + Write + Send> Conn for T {}

type Pair = (Box<dyn Conn>, Box<dyn Conn>);

/// One end of an in-memory duplex pipe: each `write` is one message to the other end.
struct Pipe {
    tx: mpsc::SyncSender<Vec<u8>>,
    rx: mpsc::Receiver<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.cur.len() {
            match self.rx.recv() {
                Ok(v) => (self.cur, self.pos) = (v, 0),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tx
            .send(buf.to_vec())
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn pipe_pair() -> (Pipe, Pipe) {
    let (tx_a, rx_b) = mpsc::sync_channel(64);
    let (tx_b, rx_a) = mpsc::sync_channel(64);
    let end = |tx, rx| Pipe {
        tx,
        rx,
        cur: Vec::new(),
        pos: 0,
    };
    (end(tx_a, rx_a), end(tx_b, rx_b))
}

fn tcp_pair() -> Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server))
}

/// Both ends wrapped in a secure stream (the handshake runs on two threads).
fn secured<S: Read + Write + Send + 'static>(client: S, server: S, key: &Key) -> Result<Pair> {
    let server_key = key.clone();
    let server = thread::spawn(move || SecureStream::server(server, &server_key));
    let client = SecureStream::client(client, key)?;
    let server = server
        .join()
        .map_err(|_| anyhow!("handshake thread panicked"))??;
    Ok((Box::new(client), Box::new(server)))
}

fn make_pair(medium: &str, secure: bool, key: &Key) -> Result<Pair> {
    match (medium, secure) {
        ("tcp", false) => {
            let (c, s) = tcp_pair()?;
            Ok((Box::new(c), Box::new(s)))
        }
        ("tcp", true) => {
            let (c, s) = tcp_pair()?;
            secured(c, s, key)
        }
        (_, false) => {
            let (c, s) = pipe_pair();
            Ok((Box::new(c), Box::new(s)))
        }
        (_, true) => {
            let (c, s) = pipe_pair();
            secured(c, s, key)
        }
    }
}

/// Seconds of one transfer: wall time, the writer's and the reader's CPU time.
struct Times {
    wall: f64,
    writer_cpu: f64,
    reader_cpu: f64,
}

/// Moves `total` payload bytes in frames of `payload.len()` from client to server.
fn transfer((client, server): Pair, payload: &[u8], total: u64) -> Result<Times> {
    let frames = total.div_ceil(payload.len() as u64);
    let payload = payload.to_vec();
    let t0 = Instant::now();
    let writer = thread::spawn(move || -> Result<f64> {
        let cpu0 = thread_cpu();
        let mut link = Framed::new(client);
        for _ in 0..frames {
            link.write_frame(FrameType(0x10), &payload)?;
        }
        Ok(thread_cpu() - cpu0)
    });
    let cpu0 = thread_cpu();
    let mut link = Framed::new(server);
    let mut buf = Vec::new();
    for _ in 0..frames {
        link.read_frame_into(&mut buf)?;
    }
    let reader_cpu = thread_cpu() - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    let writer_cpu = writer
        .join()
        .map_err(|_| anyhow!("writer thread panicked"))??;
    Ok(Times {
        wall,
        writer_cpu,
        reader_cpu,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the benchmark and prints a table (and JSON with `--json`).
pub fn run(args: &Args) -> Result<()> {
    let key = Key::generate()?;
    let total = args.mib << 20;
    let mut results = Vec::new();
    println!(
        "{:<8} {:>10} {:<8} {:>8} {:>8} {:>14} {:>14}",
        "medium", "frame", "mode", "GB/s", "ratio", "writer GB/cpu-s", "reader GB/cpu-s"
    );
    for &frame in &args.frames {
        let payload: Vec<u8> = (0..frame as u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect();
        for medium in ["tcp", "memory"] {
            let mut plain_gbps = 0.0;
            for secure in [false, true] {
                let runs = (0..args.runs.max(1))
                    .map(|_| transfer(make_pair(medium, secure, &key)?, &payload, total))
                    .collect::<Result<Vec<Times>>>()?;
                let rate = |secs: Vec<f64>| total as f64 / median(secs) / 1e9;
                let gbps = rate(runs.iter().map(|t| t.wall).collect());
                let writer = rate(runs.iter().map(|t| t.writer_cpu).collect());
                let reader = rate(runs.iter().map(|t| t.reader_cpu).collect());
                if !secure {
                    plain_gbps = gbps;
                }
                let mode = if secure { "secure" } else { "plain" };
                println!(
                    "{medium:<8} {frame:>10} {mode:<8} {gbps:>8.2} {:>8.2} {writer:>14.2} \
                     {reader:>14.2}",
                    gbps / plain_gbps
                );
                results.push(json!({
                    "medium": medium, "frame_bytes": frame, "mode": mode,
                    "gb_per_s": gbps, "ratio_to_plain": gbps / plain_gbps,
                    "writer_gb_per_cpu_s": writer, "reader_gb_per_cpu_s": reader,
                }));
            }
        }
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "benchmark": "secure",
            "payload_mib_per_run": args.mib,
            "runs": args.runs,
            "noise": dedupwire_wire::secure::NOISE_PARAMS,
            "results": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")?;
    }
    Ok(())
}
