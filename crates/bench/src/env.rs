//! The channel's persistent chunk store (`Environment`): put N MiB of fixed-size chunks
//! (then `sync`), reopen (the verifying scan that rebuilds the index), get every chunk back,
//! and look ids up in batches (`contains_many`, half of them unknown); reports MB/s (10^6
//! bytes per second of chunk data), lookups per second and the index's RAM per chunk.
//!
//! Chunks are pseudo-random (incompressible) with BLAKE3 ids computed before the clock starts.
//! The store lives in a fresh directory under `--dir` per run; gets and the reopen mostly hit
//! the OS page cache (the data was just written), so they measure the store's own cost, not
//! the disk's. Each figure is the median of `--runs` runs.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use dedupwire_wire::{ChunkId, ChunkStore, EnvConfig, Environment};
use serde_json::json;

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

struct Run {
    put: f64,
    reopen: f64,
    get: f64,
    lookup: f64,
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
    let t = Instant::now();
    for (id, data) in set {
        env.put(id, data)?;
    }
    env.sync()?;
    let put = t.elapsed().as_secs_f64();
    drop(env);

    let t = Instant::now();
    let env = Environment::open(&dir, config)?;
    let reopen = t.elapsed().as_secs_f64();
    let stats = env.stats();
    ensure!(
        stats.chunks == set.len() as u64,
        "the reopened store lost chunks"
    );

    let t = Instant::now();
    let mut got = 0usize;
    for (id, _) in set {
        got += env.get(id)?.map_or(0, |d| black_box(d).len());
    }
    let get = t.elapsed().as_secs_f64();
    ensure!(got == bytes, "gets returned {got} of {bytes} bytes");

    let ids: Vec<ChunkId> = set
        .iter()
        .flat_map(|(id, _)| {
            let mut miss = id.0;
            miss[31] ^= 0xff;
            [*id, ChunkId(miss)]
        })
        .collect();
    let t = Instant::now();
    let mut hits = 0usize;
    for batch in ids.chunks(1024) {
        hits += env.contains_many(batch)?.iter().filter(|&&h| h).count();
    }
    let lookup = t.elapsed().as_secs_f64();
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
    let pick = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let put = mb / pick(|r| r.put);
    let reopen = mb / pick(|r| r.reopen);
    let get = mb / pick(|r| r.get);
    let lookups = 2.0 * set.len() as f64 / pick(|r| r.lookup);
    let per_chunk = runs[0].index_bytes as f64 / runs[0].chunks.max(1) as f64;
    println!(
        "environment: {} chunks of {} KiB ({mb:.0} MB), median of {} runs",
        set.len(),
        args.chunk_kib,
        args.runs
    );
    println!("  put + sync           {put:>10.0} MB/s");
    println!("  reopen (verify scan) {reopen:>10.0} MB/s");
    println!("  get                  {get:>10.0} MB/s");
    println!(
        "  contains_many        {:>10.2} M lookups/s (half misses)",
        lookups / 1e6
    );
    println!("  index                {per_chunk:>10.1} bytes of RAM per chunk");
    if let Some(path) = &args.json {
        let doc = json!({
            "benchmark": "env",
            "chunks": set.len(),
            "chunk_bytes": args.chunk_kib * 1024,
            "bytes": bytes,
            "runs": args.runs,
            "put_mb_per_s": put,
            "reopen_mb_per_s": reopen,
            "get_mb_per_s": get,
            "lookups_per_s": lookups,
            "index_bytes_per_chunk": per_chunk,
            "runs_s": runs.iter().map(|r| json!({"put": r.put, "reopen": r.reopen, "get": r.get, "lookup": r.lookup})).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| path.display().to_string())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
