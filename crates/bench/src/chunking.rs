//! Chunking and hashing throughput: our FastCDC against the `fastcdc` crate (`v2020`) on the
//! same buffer in the same run, beside memory bandwidth (`memcpy`), `cat FILE > /dev/null`,
//! BLAKE3, xxh3 (also on 8 KiB chunks in the cache, from `xxhash-rust` and `twox-hash`, and
//! on 1 KiB chunks from memory, with and without the engine's prefetch), and the
//! super-features of 8 KiB chunks (Odess, the default).
//!
//! Input: `--input FILE`, or `--pkgs` (every file under `target/bench-data/pkgs`, made by
//! `bench/fetch-data.sh`, concatenated in path order), else `--size-mib` MiB of deterministic
//! pseudo-random bytes. Every measurement is one single-threaded pass over the whole buffer;
//! the runs are interleaved (each run measures everything once) and the median of `--runs`
//! is reported in GB/s (10^9 bytes per second). `--cpu-time` times the thread's CPU time
//! instead of the wall clock, which keeps other processes on a shared machine out of the
//! numbers (it cannot keep out a busy SMT sibling). The ratio column divides by the crate at
//! the same average size with the same normalization level (2) as ours; rows that are not
//! chunkers divide by the crate at 8 KiB.

use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use dedupwire_engine::chunk::{chunks, size_label, FastCdc};
use dedupwire_engine::similarity::SuperFeatureConfig;
use fastcdc::v2020::{FastCDC, Normalization};
use serde_json::json;

/// Options of the chunking benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Size of the pseudo-random input in MiB (without --input or --pkgs).
    #[arg(long, default_value_t = 512)]
    size_mib: usize,
    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Chunk this file instead of pseudo-random bytes.
    #[arg(long, conflicts_with = "pkgs")]
    input: Option<PathBuf>,
    /// Chunk the concatenated files of the package trees under --pkgs-dir (real data).
    #[arg(long)]
    pkgs: bool,
    /// Directory of release trees for --pkgs (`bench/fetch-data.sh` makes it).
    #[arg(long, default_value = "target/bench-data/pkgs")]
    pkgs_dir: PathBuf,
    /// Time by the thread's CPU time instead of the wall clock (`cat` stays wall time).
    #[arg(long)]
    cpu_time: bool,
    /// Skip the `cat FILE > /dev/null` measurement.
    #[arg(long)]
    no_cat: bool,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One chunker configuration: (min, avg, max).
type Sizes = (usize, usize, usize);

const CDC_8K: Sizes = (2048, 8192, 65536);
const CDC_1K: Sizes = (256, 1024, 4096);
const CDC_64K: Sizes = (16384, 65536, 262_144);

/// What one row measures.
enum Work {
    Ours(FastCdc),
    Crate(Sizes, Normalization),
    Memcpy,
    Cat,
    Blake3,
    Xxh3_64,
    Xxh3_128,
    /// xxh3-64 of 8 KiB chunks of the input's first MiB, again and again (as the analysis
    /// hashes chunks the Gear scan just read): from `twox-hash` if true, else `xxhash-rust`.
    Xxh3InCache(bool),
    /// xxh3-64 (`twox-hash`) of every 1 KiB chunk of the whole buffer, out of the caches as
    /// the analysis' first pass over a batch read around them; with
    /// `dedupwire_engine::fingerprint::prefetch_ahead` before each chunk if true.
    Xxh3Chunks(bool),
    /// Super-features of every chunk of the given cuts (chunk lengths).
    Features(Vec<usize>),
}

struct Row {
    name: String,
    work: Work,
    /// The row the ratio column divides by (index into the rows).
    baseline: usize,
    /// Seconds per run.
    secs: Vec<f64>,
    /// Chunks found (chunkers only).
    chunks: Option<usize>,
}

/// Runs the chunking benchmark and prints its table.
pub fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    let (label, data) = load_input(args)?;
    ensure!(!data.is_empty(), "the input is empty");
    println!(
        "chunking: {label}, {:.1} MiB, median of {} runs, {} time, single thread",
        data.len() as f64 / (1 << 20) as f64,
        args.runs,
        if args.cpu_time { "thread CPU" } else { "wall" }
    );

    // `cat` reads a file: the given one, else the buffer written to a temporary file.
    let mut temp: Option<TempFile> = None;
    let cat_path: Option<PathBuf> = if args.no_cat {
        None
    } else if let Some(p) = &args.input {
        Some(p.clone())
    } else {
        let t = TempFile::write(&data)?;
        let p = t.0.clone();
        temp = Some(t);
        Some(p)
    };

    let mut rows = build_rows(cat_path.is_some(), &data)?;
    let mut dst = vec![0u8; data.len()]; // memcpy target, written once so that it is mapped
    dst.fill(1);
    for _ in 0..args.runs {
        for row in rows.iter_mut() {
            let (secs, n) = measure(&row.work, &data, &mut dst, cat_path.as_deref(), args)?;
            row.secs.push(secs);
            if let Some(n) = n {
                if let Some(c) = row.chunks {
                    ensure!(c == n, "{}: chunk count changed between runs", row.name);
                }
                row.chunks = Some(n);
            }
        }
    }
    drop(temp);

    let gbps: Vec<f64> = rows
        .iter()
        .map(|r| data.len() as f64 / median(&r.secs) / 1e9)
        .collect();
    println!(
        "\n{:<44} {:>8} {:>10} {:>10} {:>10}",
        "name", "GB/s", "x fastcdc", "chunks", "mean size"
    );
    let mut results = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let ratio = gbps[i] / gbps[row.baseline];
        let (chunks_s, mean_s) = match row.chunks {
            Some(n) => (n.to_string(), format!("{}", data.len() / n.max(1))),
            None => (String::new(), String::new()),
        };
        println!(
            "{:<44} {:>8.2} {:>10.2} {:>10} {:>10}",
            row.name, gbps[i], ratio, chunks_s, mean_s
        );
        results.push(json!({
            "name": row.name,
            "gb_per_s": gbps[i],
            "ratio_vs_fastcdc": ratio,
            "baseline": rows[row.baseline].name,
            "chunks": row.chunks,
            "mean_chunk": row.chunks.map(|n| data.len() / n.max(1)),
            "runs_s": row.secs,
        }));
    }

    // Ours and the crate (same sizes, same normalization) must find similar numbers of chunks.
    let mut checks = Vec::new();
    for row in &rows {
        if let Work::Ours(_) = row.work {
            let base = &rows[row.baseline];
            let (a, b) = (row.chunks.unwrap_or(0), base.chunks.unwrap_or(0));
            let rel = a as f64 / b.max(1) as f64;
            println!(
                "check: {} finds {a} chunks, {} finds {b} ({:+.1}%)",
                row.name,
                base.name,
                (rel - 1.0) * 100.0
            );
            checks.push(
                json!({"ours": row.name, "crate": base.name, "ours_chunks": a, "crate_chunks": b}),
            );
            ensure!(
                (0.8..=1.25).contains(&rel),
                "{} and {} disagree on the number of chunks",
                row.name,
                base.name
            );
        }
    }

    if let Some(path) = &args.json {
        let doc = json!({
            "benchmark": "chunking",
            "input": label,
            "bytes": data.len(),
            "runs": args.runs,
            "timing": if args.cpu_time { "thread_cpu" } else { "wall" },
            "results": results,
            "checks": checks,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| path.display().to_string())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn build_rows(with_cat: bool, data: &[u8]) -> Result<Vec<Row>> {
    let mut rows: Vec<Row> = Vec::new();
    let row = |name: String, work: Work, baseline: usize| Row {
        name,
        work,
        baseline,
        secs: Vec::new(),
        chunks: None,
    };
    let crate_8k = 1; // index of the crate row at 8 KiB, nc2 (pushed right below)
    for (k, sizes) in [CDC_8K, CDC_1K, CDC_64K].into_iter().enumerate() {
        let (min, avg, max) = sizes;
        let tag = format!(
            "{} ({}/{})",
            size_label(avg),
            size_label(min),
            size_label(max)
        );
        // Ours first, then the crate row it is compared with.
        let base = rows.len() + 1;
        let ours = FastCdc::new(min, avg, max)?;
        rows.push(row(
            format!("dedupwire FastCdc {tag}"),
            Work::Ours(ours),
            base,
        ));
        rows.push(row(
            format!("fastcdc crate v2020 nc2 {tag}"),
            Work::Crate(sizes, Normalization::Level2),
            base,
        ));
        if k == 0 {
            rows.push(row(
                format!("fastcdc crate v2020 nc1 {tag}"),
                Work::Crate(sizes, Normalization::Level1),
                base,
            ));
        }
    }
    rows.push(row("memcpy".into(), Work::Memcpy, crate_8k));
    if with_cat {
        rows.push(row("cat FILE > /dev/null".into(), Work::Cat, crate_8k));
    }
    rows.push(row("blake3::hash".into(), Work::Blake3, crate_8k));
    rows.push(row("xxh3-64".into(), Work::Xxh3_64, crate_8k));
    rows.push(row("xxh3-128".into(), Work::Xxh3_128, crate_8k));
    let in_cache = rows.len();
    rows.push(row(
        "xxh3-64, 8 KiB chunks in cache, xxhash-rust".into(),
        Work::Xxh3InCache(false),
        in_cache,
    ));
    rows.push(row(
        "xxh3-64, 8 KiB chunks in cache, twox-hash".into(),
        Work::Xxh3InCache(true),
        in_cache,
    ));
    let from_memory = rows.len();
    rows.push(row(
        "xxh3-64, 1 KiB chunks from memory".into(),
        Work::Xxh3Chunks(false),
        from_memory,
    ));
    rows.push(row(
        "xxh3-64, 1 KiB chunks from memory, prefetched".into(),
        Work::Xxh3Chunks(true),
        from_memory,
    ));
    let (min, avg, max) = CDC_8K;
    let cuts = chunks(&FastCdc::new(min, avg, max)?, data)
        .map(|c| c.len())
        .collect();
    rows.push(row(
        "super-features (Odess) of 8 KiB chunks".into(),
        Work::Features(cuts),
        crate_8k,
    ));
    Ok(rows)
}

/// One timed pass: seconds, and the chunk count for chunkers.
fn measure(
    work: &Work,
    data: &[u8],
    dst: &mut [u8],
    cat_path: Option<&Path>,
    args: &Args,
) -> Result<(f64, Option<usize>)> {
    let clock = Clock::start(args.cpu_time);
    let chunks_found = match work {
        Work::Ours(c) => Some(chunks(c, black_box(data)).count()),
        Work::Crate((min, avg, max), level) => {
            Some(FastCDC::with_level(black_box(data), *min, *avg, *max, *level).count())
        }
        Work::Memcpy => {
            dst.copy_from_slice(black_box(data));
            black_box(&dst);
            None
        }
        Work::Cat => {
            let path = cat_path.context("no file for cat")?;
            let t = Instant::now();
            let status = Command::new("cat")
                .arg(path)
                .stdout(Stdio::null())
                .status()
                .context("spawning cat")?;
            ensure!(status.success(), "cat failed: {status}");
            return Ok((t.elapsed().as_secs_f64(), None));
        }
        Work::Blake3 => {
            black_box(blake3::hash(black_box(data)));
            None
        }
        Work::Xxh3_64 => {
            black_box(xxhash_rust::xxh3::xxh3_64(black_box(data)));
            None
        }
        Work::Xxh3_128 => {
            black_box(xxhash_rust::xxh3::xxh3_128(black_box(data)));
            None
        }
        Work::Xxh3InCache(twox) => {
            let window = &data[..data.len().min(1 << 20)];
            let mut acc = 0u64;
            for _ in 0..data.len() / window.len().max(1) {
                for c in window.chunks(8 << 10) {
                    acc ^= if *twox {
                        twox_hash::XxHash3_64::oneshot(black_box(c))
                    } else {
                        xxhash_rust::xxh3::xxh3_64(black_box(c))
                    };
                }
            }
            black_box(acc);
            None
        }
        Work::Xxh3Chunks(prefetch) => {
            let mut acc = 0u64;
            for c in data.chunks(1 << 10) {
                if *prefetch {
                    dedupwire_engine::fingerprint::prefetch_ahead(c);
                }
                acc ^= twox_hash::XxHash3_64::oneshot(black_box(c));
            }
            black_box(acc);
            None
        }
        Work::Features(cuts) => {
            let config = SuperFeatureConfig::default();
            let mut out = Vec::new();
            let mut at = 0;
            for &len in cuts {
                config.super_features_into(black_box(&data[at..at + len]), &mut out);
                black_box(&out);
                at += len;
            }
            None
        }
    };
    Ok((clock.secs(), chunks_found))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Wall clock, or the calling thread's CPU time.
enum Clock {
    Wall(Instant),
    Cpu(f64),
}

impl Clock {
    fn start(cpu: bool) -> Clock {
        match thread_cpu_secs() {
            Some(t) if cpu => Clock::Cpu(t),
            _ => Clock::Wall(Instant::now()),
        }
    }

    fn secs(&self) -> f64 {
        match self {
            Clock::Wall(t) => t.elapsed().as_secs_f64(),
            Clock::Cpu(t0) => thread_cpu_secs().unwrap_or(*t0) - t0,
        }
    }
}

/// CPU seconds the calling thread has used (None where the platform cannot tell).
#[cfg(unix)]
pub(crate) fn thread_cpu_secs() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// CPU seconds the calling thread has used (None where the platform cannot tell).
#[cfg(not(unix))]
pub(crate) fn thread_cpu_secs() -> Option<f64> {
    None
}

fn load_input(args: &Args) -> Result<(String, Vec<u8>)> {
    if let Some(path) = &args.input {
        let data = std::fs::read(path).with_context(|| path.display().to_string())?;
        return Ok((format!("file {}", path.display()), data));
    }
    if args.pkgs {
        if !args.pkgs_dir.is_dir() {
            bail!(
                "{} does not exist: run bench/fetch-data.sh first",
                args.pkgs_dir.display()
            );
        }
        let mut files = Vec::new();
        collect_files(&args.pkgs_dir, &mut files)?;
        files.sort();
        let mut data = Vec::new();
        for f in &files {
            data.extend_from_slice(&std::fs::read(f).with_context(|| f.display().to_string())?);
        }
        let label = format!(
            "{} files under {} concatenated",
            files.len(),
            args.pkgs_dir.display()
        );
        return Ok((label, data));
    }
    Ok((
        format!("{} MiB pseudo-random (xorshift64*)", args.size_mib),
        pseudo_random(args.size_mib << 20, 0x5eed_cafe_f00d_d00d),
    ))
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let entry = entry?;
        let ty = entry.file_type()?;
        if ty.is_dir() {
            collect_files(&entry.path(), out)?;
        } else if ty.is_file() {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// Deterministic incompressible bytes (xorshift64*).
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A temporary file holding the input for `cat`, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn write(data: &[u8]) -> Result<TempFile> {
        let path = std::env::temp_dir().join(format!(
            "dedupwire-bench-chunking-{}.bin",
            std::process::id()
        ));
        let mut f = File::create(&path).with_context(|| path.display().to_string())?;
        f.write_all(data)?;
        f.sync_all()?;
        Ok(TempFile(path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
