//! The channel's persistent chunk store (`Environment`): put N MiB of fixed-size chunks
//! (then `sync`), reopen (the index rebuilt from the segments' hints, the newest one's
//! written at close), get every chunk back, and look ids up in batches (`contains_many`, half
//! of them unknown); reports MB/s (10^6 bytes per second of chunk data), lookups per second
//! and the index's RAM per chunk.
//!
//! Chunks are pseudo-random (incompressible) with BLAKE3 ids computed before the clock starts.
//! The store lives in a fresh directory under `--dir` per run; gets and the reopen mostly hit
//! the OS page cache (the data was just written), so they measure the store's own cost, not
//! the disk's. Each figure is the median of `--runs` runs, by the wall clock and per second of
//! the thread's CPU time (which keeps other processes on a shared machine out of it; for put it
//! leaves out waiting for the disk).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use dedupwire_wire::{ChunkId, ChunkStore, EnvConfig, Environment};
use serde_json::json;

use crate::chunking::thread_cpu_secs;

/// Options of the environment benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// MiB of chunk data to put.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Chunk size in KiB.
    #[arg(long, default_value_t = 8)]
    chunk_kib: usize,
    /// Timed runs (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Directory to create the environments in (a fresh subdirectory per run).
    #[arg(long, default_value = "target")]
    dir: PathBuf,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Wall and thread-CPU seconds of one phase.
#[derive(Clone, Copy)]
struct Secs {
    wall: f64,
    cpu: f64,
}

struct Timer(Instant, Option<f64>);

impl Timer {
    fn start() -> Timer {
        Timer(Instant::now(), thread_cpu_secs())
    }

    fn stop(self) -> Secs {
        let wall = self.0.elapsed().as_secs_f64();
        let cpu = match (self.1, thread_cpu_secs()) {
            (Some(a), Some(b)) => b - a,
            _ => wall,
        };
        Secs { wall, cpu }
    }
}

/// One measured phase: its name, which timing of a run it reads, how much it did, the unit.
type Phase = (&'static str, fn(&Run) -> Secs, f64, &'static str);

struct Run {
    put: Secs,
    reopen: Secs,
    get: Secs,
    lookup: Secs,
    index_bytes: u64,
    chunks: u64,
}

fn chunks(args: &Args) -> Vec<(ChunkId, Vec<u8>)> {
    let size = args.chunk_kib * 1024;
    let n = args.mib * 1024 * 1024 / size;
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            let data: Vec<u8> = (0..size / 8)
                .flat_map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s.to_le_bytes()
                })
                .collect();
            (ChunkId(*blake3::hash(&data).as_bytes()), data)
        })
        .collect()
}

fn one_run(args: &Args, set: &[(ChunkId, Vec<u8>)]) -> Result<Run> {
    let parent = tempfile::Builder::new()
        .prefix("dedupwire-env-bench")
        .tempdir_in(&args.dir)
        .with_context(|| format!("cannot create a directory in {}", args.dir.display()))?;
    let dir = parent.path().join("env");
    let bytes: usize = set.iter().map(|(_, d)| d.len()).sum();
    let config = EnvConfig {
        max_bytes: (bytes as u64 * 2).max(256 << 20),
        ..EnvConfig::default()
    };

    let env = Environment::open(&dir, config.clone())?;
    let t = Timer::start();
    for (id, data) in set {
        env.put(id, data)?;
    }
    env.sync()?;
    let put = t.stop();
    drop(env);

    let t = Timer::start();
    let env = Environment::open(&dir, config)?;
    let reopen = t.stop();
    let stats = env.stats();
    ensure!(
        stats.chunks == set.len() as u64,
        "the reopened store lost chunks"
    );

    let t = Timer::start();
    let mut got = 0usize;
    for (id, _) in set {
        got += env.get(id)?.map_or(0, |d| black_box(d).len());
    }
    let get = t.stop();
    ensure!(got == bytes, "gets returned {got} of {bytes} bytes");

    let ids: Vec<ChunkId> = set
        .iter()
        .flat_map(|(id, _)| {
            let mut miss = id.0;
            miss[31] ^= 0xff;
            [*id, ChunkId(miss)]
        })
        .collect();
    let t = Timer::start();
    let mut hits = 0usize;
    for batch in ids.chunks(1024) {
        hits += env.contains_many(batch)?.iter().filter(|&&h| h).count();
    }
    let lookup = t.stop();
    ensure!(
        hits == set.len(),
        "lookups found {hits} of {} chunks",
        set.len()
    );

    Ok(Run {
        put,
        reopen,
        get,
        lookup,
        index_bytes: stats.index_bytes,
        chunks: stats.chunks,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the environment benchmark.
pub fn run(args: &Args) -> Result<()> {
    ensure!(
        args.runs > 0 && args.mib > 0 && args.chunk_kib > 0,
        "nothing to measure"
    );
    let set = chunks(args);
    let bytes: usize = set.iter().map(|(_, d)| d.len()).sum();
    let runs: Vec<Run> = (0..args.runs)
        .map(|_| one_run(args, &set))
        .collect::<Result<_>>()?;
    let mb = bytes as f64 / 1e6;
    let lookups = 2.0 * set.len() as f64;
    let per_chunk = runs[0].index_bytes as f64 / runs[0].chunks.max(1) as f64;
    let phases: [Phase; 4] = [
        ("put + sync", |r| r.put, mb, "MB/s"),
        ("reopen (from hints)", |r| r.reopen, mb, "MB/s"),
        ("get", |r| r.get, mb, "MB/s"),
        (
            "contains_many (half miss)",
            |r| r.lookup,
            lookups / 1e6,
            "M lookups/s",
        ),
    ];
    println!(
        "environment: {} chunks of {} KiB ({mb:.0} MB), median of {} runs",
        set.len(),
        args.chunk_kib,
        args.runs
    );
    println!("  {:<26} {:>10} {:>12}  unit", "phase", "wall", "per CPU s");
    let mut results = Vec::new();
    for (name, phase, amount, unit) in phases {
        let wall = amount / median(runs.iter().map(|r| phase(r).wall).collect());
        let cpu = amount / median(runs.iter().map(|r| phase(r).cpu).collect());
        println!("  {name:<26} {wall:>10.2} {cpu:>12.2}  {unit}");
        results.push(json!({
            "phase": name,
            "unit": unit,
            "wall": wall,
            "per_cpu_s": cpu,
            "runs": runs.iter().map(|r| json!({"wall_s": phase(r).wall, "cpu_s": phase(r).cpu})).collect::<Vec<_>>(),
        }));
    }
    println!("  index: {per_chunk:.1} bytes of RAM per chunk");
    if let Some(path) = &args.json {
        let doc = json!({
            "benchmark": "env",
            "chunks": set.len(),
            "chunk_bytes": args.chunk_kib * 1024,
            "bytes": bytes,
            "runs": args.runs,
            "index_bytes_per_chunk": per_chunk,
            "results": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| path.display().to_string())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
