//! `dedupwire analyze`: how much each dedup method would save on your data, and what it costs.
//!
//! The big-data characterization study as a tool. Every input PATH is an **image** (a file, a
//! directory tree, or a `.jsonl[.zst]` document stream whose lines are items). One pass reads
//! every byte once and feeds it to every method at the same time: compression alone, exact
//! dedup with whole, fixed and CDC chunks at 1 KiB…128 KiB (256 B too for documents), and
//! similarity + delta, each with and without compression on top, each in **local** scope (each
//! image alone) and **global** scope (all pooled). Each method is charged the CPU time it used,
//! so the report can say which method moves the data fastest over a given link.

#![deny(missing_docs)]

mod cpu;
mod direct;
mod hash;
pub mod html;
mod id_set;
pub mod input;
mod memo;
pub mod memory;
pub mod methods;
mod multi_cut;
mod pages;
mod parallel;
mod prefetch;
pub mod recommend;
pub mod report;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use dedupwire_engine::compress::Compression;

pub use crate::methods::{parse_methods, parse_size, MethodSpec};
pub use crate::recommend::parse_link;
pub use crate::report::Report;

/// Why an analysis could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnalyzeError {
    /// Reading an input failed.
    #[error("{path}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The options do not make sense.
    #[error("{0}")]
    Usage(String),
}

impl AnalyzeError {
    pub(crate) fn io(path: &Path, error: std::io::Error) -> Self {
        AnalyzeError::Io {
            path: path.to_path_buf(),
            error,
        }
    }
}

/// What to analyze and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The methods to measure (`None`: `all` up to [`FULL_SWEEP_UP_TO`], else `all-quick`).
    pub methods: Option<String>,
    /// Compression used on top of dedup.
    pub on_top: Compression,
    /// Link speed in bits per second the recommendation is made for.
    pub link_bits_per_s: f64,
    /// Compressed streams (compression alone, or on top of dedup) compress what they emit for
    /// one input batch in this many and extrapolate (1: compress everything; `None`:
    /// [`auto_compress_every`]).
    pub compress_every: Option<u64>,
    /// Exact dedup indexes one chunk in this many, chosen by content (1: every chunk; `None`:
    /// as few as keep its indexes within `memory_bytes`, see [`memory`]).
    pub chunk_sample: Option<u64>,
    /// The memory the analysis may take, for the automatic chunk sample (`None`:
    /// [`memory::default_budget`], half of this machine's).
    pub memory_bytes: Option<u64>,
    /// Bytes of recent data the similarity method may use as delta sources.
    pub window_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            methods: None,
            on_top: Compression::Zstd(3),
            link_bits_per_s: 100e6,
            compress_every: None,
            chunk_sample: None,
            memory_bytes: None,
            window_bytes: 1 << 30,
        }
    }
}

/// Inputs up to this size get every chunk size by default (`all`); larger ones the quick
/// sweep (`all-quick`, five sizes over the same range), so a few GB analyze at disk speed.
pub const FULL_SWEEP_UP_TO: u64 = 1 << 30;

/// Inputs up to this size are compressed in full by every method (no sampling by default).
pub const EXACT_UP_TO: u64 = 512 << 20;

/// Batches each compressed stream samples by default on larger inputs: with the proxy ratio
/// estimator, a standard error of a few percent on disk images (4% rms on five Debian
/// snapshots' zstd stream, over every start of the sampling).
pub const SAMPLED_BATCHES: u64 = 16;

/// The default `compress_every` for `bytes` of input: 1 (everything) up to
/// [`EXACT_UP_TO`], then about [`SAMPLED_BATCHES`] batches per stream whatever the size, so
/// compression costs about the same on 1 GB as on 100 GB.
pub fn auto_compress_every(bytes: u64) -> u64 {
    if bytes <= EXACT_UP_TO {
        1
    } else {
        (bytes / input::BATCH_BYTES as u64)
            .div_ceil(SAMPLED_BATCHES)
            .max(1)
    }
}

/// The `compress_every` a run over `disk_total` bytes uses: the caller's, or
/// [`auto_compress_every`] of the whole input. Chunk sampling leaves it alone: compression
/// alone and similarity still emit every byte, and sampled +zstd lines are upper bounds anyway.
fn compress_every(opts: &Options, disk_total: u64) -> u64 {
    opts.compress_every
        .unwrap_or_else(|| auto_compress_every(disk_total))
        .clamp(1, 1 << 20)
}

/// Runs the analysis; `progress` is called with the bytes read so far.
pub fn analyze(
    paths: &[PathBuf],
    opts: &Options,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Report, AnalyzeError> {
    if paths.is_empty() {
        return Err(AnalyzeError::Usage(
            "give at least one PATH to analyze".into(),
        ));
    }
    let started = Instant::now();
    let (cpu_started, ticks_started) = (cpu::process_cpu_seconds(), cpu::machine_ticks());
    keep_buffers_in_heap();
    let images = input::scan(paths)?;
    let documents = images.iter().any(|i| i.kind == input::ItemKind::Document);
    let disk_total: u64 = images.iter().map(|i| i.disk_bytes).sum();
    let methods = match opts.methods.as_deref() {
        Some(list) => list,
        None if disk_total > FULL_SWEEP_UP_TO => "all-quick",
        None => "all",
    };
    let specs = parse_methods(methods, documents)?;
    let (chunk_sample, memory_warnings) = chunk_sample(opts, &specs, &images)?;
    let compress_every = compress_every(opts, disk_total);
    let ropts = methods::RunnerOptions {
        on_top: opts.on_top,
        compress_every,
        chunk_sample,
        several_images: images.len() > 1,
        documents,
        window_bytes: opts.window_bytes,
        blake3_s_per_byte,
        features_s_per_byte,
        frame_hash_s_per_byte: xxh3_stream_s_per_byte(),
        memo: Default::default(),
    };
    let runners = methods::runners(&specs, &ropts)?;
    // Each method runs on its own thread behind a queue, so a slow method never makes the
    // fast ones wait at a per-batch barrier; batches are shared, not copied.
    let workers: Vec<_> = runners
        .into_iter()
        .map(|mut runner| {
            let (tx, rx) =
                std::sync::mpsc::sync_channel::<Arc<input::Batch>>(methods::QUEUE_BATCHES);
            let handle = std::thread::spawn(move || {
                for batch in rx {
                    runner.feed(&batch);
                }
                runner.finish()
            });
            (tx, handle)
        })
        .collect();
    let mut image_stats: Vec<report::ImageStats> = images
        .iter()
        .map(|i| report::ImageStats {
            path: i.path.display().to_string(),
            kind: match i.kind {
                input::ItemKind::File => "files".into(),
                input::ItemKind::Document => "documents".into(),
            },
            files: i.files.len() as u64,
            input_bytes: 0,
            items: 0,
        })
        .collect();
    let rx = input::read_batches(images);
    let mut done = 0u64;
    let mut changed = Vec::new();
    let mut waits = report::Waits::default();
    loop {
        let t = Instant::now();
        let Ok(batch) = rx.recv() else { break };
        waits.input += t.elapsed().as_secs_f64();
        let mut batch = batch?;
        changed.append(&mut batch.changed);
        let st = &mut image_stats[batch.image];
        st.input_bytes += batch.data.len() as u64;
        st.items += batch.pieces.iter().filter(|p| p.item_end).count() as u64;
        done += batch.data.len() as u64;
        let batch = Arc::new(batch);
        let t = Instant::now();
        for (tx, _) in &workers {
            tx.send(Arc::clone(&batch))
                .map_err(|_| AnalyzeError::Usage("a method worker stopped unexpectedly".into()))?;
        }
        waits.methods += t.elapsed().as_secs_f64();
        progress(done, disk_total);
    }
    let mut measured: Vec<methods::Measured> = Vec::new();
    // Every queue ends before any method is waited for: a method's estimate may wait for
    // another's (the reference of the two-phase estimate).
    let (senders, handles): (Vec<_>, Vec<_>) = workers.into_iter().unzip();
    drop(senders);
    let t = Instant::now();
    for handle in handles {
        let out = handle
            .join()
            .map_err(|_| AnalyzeError::Usage("a method worker panicked".into()))?;
        measured.extend(out);
    }
    waits.methods += t.elapsed().as_secs_f64();
    let mut report = report::build(
        image_stats,
        measured,
        opts,
        compress_every,
        chunk_sample,
        methods == "all-quick",
        started.elapsed().as_secs_f64(),
    );
    report.set_pace(
        cpu::process_cpu_seconds() - cpu_started,
        parallel::cores(),
        cpu::machine_busy(ticks_started, cpu::machine_ticks()),
        waits,
    );
    report.warnings = report::warnings(&changed, report.input_bytes, report.items);
    report.warnings.extend(memory_warnings);
    Ok(report)
}

/// The chunk sample of a run over `images`: the caller's, or the smallest that keeps exact
/// dedup's indexes within the memory budget (see [`memory`]), with warnings for the user when
/// memory decided it or an input's size could not be known in advance.
fn chunk_sample(
    opts: &Options,
    specs: &[methods::MethodSpec],
    images: &[input::Image],
) -> Result<(u64, Vec<String>), AnalyzeError> {
    let mut said = Vec::new();
    if let Some(n) = opts.chunk_sample {
        return Ok((n.clamp(1, 1 << 20), said));
    }
    said.extend(images.iter().filter(|i| !i.sized).map(|i| {
        format!(
            "the size of {} is not known before it is read (a pipe or a character device), so neither exact dedup's indexes (--memory) nor compression's sampling (--sample) are sized for it; for a stream of many GB, give --sample-chunks N and --sample N",
            i.path.display()
        )
    }));
    let budget = opts.memory_bytes.unwrap_or_else(memory::default_budget);
    let whose = match opts.memory_bytes {
        Some(_) => "--memory",
        None => "half of this machine's; --memory sets it",
    };
    let entries = memory::index_entries_bound(specs, images);
    let (n, room) = match memory::index_room(opts.window_bytes, budget) {
        Some(room) => (memory::chunk_sample_within(entries, room), room),
        None if opts.memory_bytes.is_some() => {
            return Err(memory::no_room(opts.window_bytes, budget))
        }
        None => {
            said.push(format!(
                "this machine has little memory for the analysis ({} MiB, {whose}): the similarity window alone takes {} MiB; if the analysis runs out of memory, give a smaller --window",
                budget >> 20,
                opts.window_bytes >> 20
            ));
            let room = budget / 4;
            (memory::chunk_sample_within(entries, room), room)
        }
    };
    if n > 1 {
        said.push(format!(
            "exact dedup's indexes could take up to {} MiB on this input (if no chunk repeated), more than the {} MiB the memory budget ({} MiB, {whose}) leaves them beside the similarity window and buffers, so exact dedup indexed 1 chunk in {n} and states the error; --sample-chunks 1 indexes every chunk",
            entries.saturating_mul(memory::PEAK_BYTES_PER_ENTRY) >> 20,
            room >> 20,
            budget >> 20
        ));
    }
    Ok((n, said))
}

/// Batches (4 MiB), compression outputs and encoder frames are allocated and freed thousands
/// of times per GB. glibc serves blocks that large with `mmap` (or trims them back to the
/// system once freed), so each new one faults its pages in and zeroes them again: a tenth of
/// the analysis' CPU on disk images. Keeping them in the heap reuses the same pages.
fn keep_buffers_in_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before the analysis' threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// Bytes each hash rate is measured over.
const CALIBRATION_BYTES: usize = 4 << 20;

/// Incompressible-looking bytes to measure hash rates on, made once.
fn calibration_data() -> &'static [u8] {
    static DATA: OnceLock<Vec<u8>> = OnceLock::new();
    DATA.get_or_init(|| {
        (0..CALIBRATION_BYTES as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect()
    })
}

/// The least thread CPU seconds per byte of [`calibration_data`] that `hash` took over
/// three runs.
fn s_per_byte(mut hash: impl FnMut(&[u8]) -> u8) -> f64 {
    let buf = calibration_data();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = cpu::thread_cpu_seconds();
        std::hint::black_box(hash(buf));
        best = best.min(cpu::thread_cpu_seconds() - t0);
    }
    best / buf.len() as f64
}

/// BLAKE3 CPU seconds per byte when hashing chunks of `chunk` bytes, measured once per size.
fn blake3_s_per_byte(chunk: usize) -> f64 {
    static CACHE: OnceLock<Mutex<HashMap<usize, f64>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().expect("no panics while held").get(&chunk) {
        return *v;
    }
    let size = chunk.clamp(64, CALIBRATION_BYTES);
    let v = s_per_byte(|buf| {
        buf.chunks(size)
            .fold(0, |acc, c| acc ^ blake3::hash(c).as_bytes()[0])
    });
    cache.lock().expect("no panics while held").insert(chunk, v);
    v
}

/// CPU seconds per byte of the engine's super-features of files' units (8 KiB chunks),
/// measured once.
fn features_s_per_byte() -> f64 {
    static CACHE: OnceLock<f64> = OnceLock::new();
    *CACHE.get_or_init(|| {
        let files = dedupwire_engine::pipeline::PipelineConfig::files();
        let dedupwire_engine::pipeline::Similarity::SuperFeatures(config) = files.similarity else {
            return 0.0;
        };
        let dedupwire_engine::chunk::ChunkerSpec::Cdc { avg, .. } = files.chunker else {
            return 0.0;
        };
        let mut out = Vec::new();
        s_per_byte(|buf| {
            buf.chunks(avg).fold(0, |acc, c| {
                config.super_features_into(c, &mut out);
                acc ^ out[0] as u8
            })
        })
    })
}

/// CPU seconds per byte of xxh3 fed a 4 MiB batch in 64 KiB pieces, as a frame's content
/// hash is fed its items.
fn xxh3_stream_s_per_byte() -> f64 {
    s_per_byte(|buf| {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        buf.chunks(64 << 10).for_each(|c| h.update(c));
        h.digest() as u8
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sampling_keeps_the_compressed_batches_of_the_whole_input() {
        let disk = 3_331_731_456;
        let opts = |chunk_sample| Options {
            chunk_sample: Some(chunk_sample),
            ..Options::default()
        };
        assert_eq!(compress_every(&opts(1), disk), 50);
        assert_eq!(compress_every(&opts(8), disk), 50);
        let given = Options {
            compress_every: Some(3),
            ..opts(8)
        };
        assert_eq!(compress_every(&given, disk), 3);
    }
}
