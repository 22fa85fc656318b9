//! The methods compared, each a runner fed every batch once.
//!
//! A runner measures its own scopes: **local** (each image deduplicated alone, its index
//! dropped between images) and **global** (all images pooled). Exact dedup counts duplicates
//! with xxh3-64 ids (an estimate needs no cryptographic identity, and a false duplicate among
//! a billion chunks has odds of 1 in 37; a fixed chunk larger than the smallest fixed size
//! takes as id the xxh3-64 of its blocks' ids, so every byte is hashed once) and adds the
//! measured cost of BLAKE3 at that chunk size, so its reported speed is what a real deployment
//! pays. Compressed streams share a memo of compressed sizes (`memo.rs`).

use std::collections::VecDeque;
use std::fmt;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use dedupwire_engine::chunk::{size_label, ChunkerSpec};
use dedupwire_engine::compress::{Compression, Compressor};
use dedupwire_engine::fingerprint::Fingerprinter;
use dedupwire_engine::pipeline::{
    Encoder, PipelineConfig, Prepared, PreparedUnits, SharedBytes, Similarity, UnitPrep, UnitStore,
    SMALLER,
};
use dedupwire_engine::similarity::SuperFeatureConfig;
use serde::Serialize;

use crate::cpu::charge;
use crate::id_set::IdSet;
use crate::input::{Batch, ItemKind, Piece, BATCH_BYTES};
use crate::memo::{Memo, SliceSizes};
use crate::multi_cut::{
    cdc_lens, cdc_level, gear_scan, Cursor, GearScan, MultiCut, Scanned, ODESS_LEVEL,
};
use crate::AnalyzeError;

/// Bytes a chunk reference costs in a recipe or on the wire (tag + chunk number + length).
pub const REF_BYTES: u64 = 6;

/// Bytes one exact-index entry needs in a real deployment: BLAKE3 key, location, table slack.
pub const INDEX_ENTRY_BYTES: u64 = 46;

/// Input batches a method's thread (and each similarity scope's) may lag behind the reader.
/// Work per batch comes in bursts that differ by method, so with room for only four the
/// slowest method of the moment stopped the reader and left a core idle: on the five Debian
/// images, 16 halved the idle and iowait time (134 → 63 ticks, medians of six interleaved
/// cold runs) for 80 MB more at the peak.
pub const QUEUE_BATCHES: usize = 16;

/// A method the user can ask for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MethodSpec {
    /// Compression alone, per batch.
    Compress(Compression),
    /// Exact chunk dedup with this chunker (with and without compression on top).
    Exact(ChunkerSpec),
    /// Similarity + delta: sketches for documents, super-features for files.
    Similarity,
}

impl fmt::Display for MethodSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MethodSpec::Compress(c) => write!(f, "{c}"),
            MethodSpec::Exact(c) => write!(f, "{}", c.label()),
            MethodSpec::Similarity => f.write_str("similarity"),
        }
    }
}

/// Default exact-dedup chunk sizes: 1 KiB … 128 KiB.
pub const DEFAULT_SIZES: [usize; 8] = [
    1 << 10,
    2 << 10,
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
];

/// Exact-dedup chunk sizes of the quick sweep (`all-quick`, the default on large inputs):
/// the same 1 KiB … 128 KiB range in steps of 4.
pub const QUICK_SIZES: [usize; 5] = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 128 << 10];

/// Parses a `--methods` list: families (`compress`, `fixed`, `cdc`, `whole`, `similarity`,
/// `all`, `all-quick`) or single methods (`zstd`, `zstd-19`, `lz4`, `cdc-4KiB`,
/// `fixed-64KiB`, `cdc-256B`).
pub fn parse_methods(list: &str, documents: bool) -> Result<Vec<MethodSpec>, AnalyzeError> {
    if list.split(',').any(|t| t.trim() == "all-quick") {
        let rest: Vec<&str> = list
            .split(',')
            .filter(|t| t.trim() != "all-quick")
            .collect();
        let mut sizes: Vec<String> = QUICK_SIZES
            .iter()
            .flat_map(|&s| {
                let l = size_label(s);
                [format!("fixed-{l}"), format!("cdc-{l}")]
            })
            .collect();
        if documents {
            sizes.extend(["fixed-256B".to_string(), "cdc-256B".to_string()]);
        }
        let list = format!(
            "compress,whole,similarity,{},{}",
            sizes.join(","),
            rest.join(",")
        );
        return parse_methods(&list, documents);
    }
    let mut sizes: Vec<usize> = DEFAULT_SIZES.to_vec();
    if documents {
        sizes.insert(0, 256);
    }
    let mut out = Vec::new();
    for token in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match token {
            "all" => {
                out.extend(parse_methods(
                    "compress,whole,fixed,cdc,similarity",
                    documents,
                )?);
            }
            "compress" => out.extend([
                MethodSpec::Compress(Compression::Zstd(3)),
                MethodSpec::Compress(Compression::Lz4),
            ]),
            "whole" => out.push(MethodSpec::Exact(ChunkerSpec::Whole)),
            "fixed" => out.extend(
                sizes
                    .iter()
                    .map(|&size| MethodSpec::Exact(ChunkerSpec::Fixed { size })),
            ),
            "cdc" => out.extend(
                sizes
                    .iter()
                    .map(|&s| MethodSpec::Exact(ChunkerSpec::cdc(s))),
            ),
            "similarity" | "sim" => out.push(MethodSpec::Similarity),
            t => out.push(parse_one(t)?),
        }
    }
    let mut seen = Vec::new();
    out.retain(|m| {
        let new = !seen.contains(m);
        seen.push(*m);
        new
    });
    if out.is_empty() {
        return Err(AnalyzeError::Usage("--methods names no method".into()));
    }
    Ok(out)
}

fn parse_one(t: &str) -> Result<MethodSpec, AnalyzeError> {
    if let Ok(c) = t.parse::<Compression>() {
        return Ok(MethodSpec::Compress(c));
    }
    let bad = || {
        AnalyzeError::Usage(format!(
        "unknown method {t:?}: use compress, whole, fixed, cdc, similarity, all, zstd[-LEVEL], lz4, fixed-SIZE or cdc-SIZE (SIZE like 256B, 4KiB, 1MiB)"
    ))
    };
    let (family, size) = t.split_once('-').ok_or_else(bad)?;
    let size = parse_size(size).ok_or_else(bad)?;
    let spec = match family {
        "fixed" => ChunkerSpec::Fixed { size },
        "cdc" => ChunkerSpec::cdc(size),
        _ => return Err(bad()),
    };
    spec.build()
        .map_err(|e| AnalyzeError::Usage(format!("{t}: {e}")))?;
    Ok(MethodSpec::Exact(spec))
}

/// Parses `256B`, `4KiB`, `4K`, `1MiB`, `1M` or a plain number of bytes.
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: usize = num.parse().ok()?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// One line of the report, before ratios are derived.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Method name, e.g. `exact-cdc-4KiB+zstd`.
    pub name: String,
    /// Family for charts, e.g. `exact-cdc+zstd`.
    pub family: String,
    /// `local` or `global`.
    pub scope: &'static str,
    /// Parameters.
    pub params: serde_json::Value,
    /// Bytes the method would send or store.
    pub output_bytes: u64,
    /// RAM its index needs.
    pub index_bytes: u64,
    /// CPU seconds spent on the input.
    pub cpu_seconds: f64,
    /// Relative standard error of `output_bytes` when part of it was sampled (0 if exact).
    pub rel_error: f64,
}

/// A method being measured.
pub trait Runner: Send {
    /// Processes one batch.
    fn feed(&mut self, batch: &Arc<Batch>);
    /// The results for both scopes.
    fn finish(self: Box<Self>) -> Vec<Measured>;
}

/// A Gear level above every size's: a runner given it scans at its own level.
const ALONE: u32 = u32::MAX;

/// Builds the runners for `specs`: one per compression or similarity method, one for all
/// fixed sizes and one for all CDC sizes (each cut in a single pass), one for whole items.
pub fn runners(
    specs: &[MethodSpec],
    opts: &RunnerOptions,
) -> Result<Vec<Box<dyn Runner>>, AnalyzeError> {
    let mut out: Vec<Box<dyn Runner>> = Vec::new();
    let (mut fixed, mut cdc) = (Vec::new(), Vec::new());
    // Sizes by content and similarity's chunks of files share each batch's Gear scan.
    let gear_level = specs
        .iter()
        .filter_map(|s| match *s {
            MethodSpec::Exact(c) => cdc_level(c),
            MethodSpec::Similarity => {
                cdc_level(SimilarityRunner::files_chunker()).map(|l| l.min(ODESS_LEVEL))
            }
            MethodSpec::Compress(_) => None,
        })
        .min()
        .unwrap_or(ALONE);
    for spec in specs {
        match *spec {
            MethodSpec::Compress(c) => out.push(Box::new(CompressRunner::new(
                c,
                opts.on_top,
                opts.compress_every,
                &opts.memo,
            ))),
            MethodSpec::Similarity => out.push(Box::new(SimilarityRunner::new(opts, gear_level)?)),
            MethodSpec::Exact(c @ ChunkerSpec::Whole) => {
                out.push(Box::new(ExactRunner::new(&[c], opts, gear_level)?))
            }
            MethodSpec::Exact(c @ ChunkerSpec::Fixed { .. }) => fixed.push(c),
            MethodSpec::Exact(c @ ChunkerSpec::Cdc { .. }) => cdc.push(c),
        }
    }
    for group in [fixed, cdc] {
        if !group.is_empty() {
            out.push(Box::new(ExactRunner::new(&group, opts, gear_level)?));
        }
    }
    Ok(out)
}

/// Settings shared by the runners.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Compression applied on top of dedup (`+zstd` lines).
    pub on_top: Compression,
    /// Compress one residual batch in this many (1 = all) and extrapolate the rest.
    pub compress_every: u64,
    /// True when there are several images, so global differs from local.
    pub several_images: bool,
    /// True when items are documents (each write one item, often millions) rather than files.
    pub documents: bool,
    /// Window of the similarity encoders, in bytes.
    pub window_bytes: u64,
    /// Index only chunks whose id is 0 modulo this (1: every chunk) and scale up.
    pub chunk_sample: u64,
    /// BLAKE3 CPU seconds per byte, by chunk size, measured on this machine.
    pub blake3_s_per_byte: fn(usize) -> f64,
    /// CPU seconds per byte of the engine's super-features of files' units, measured on this
    /// machine: similarity takes them from the batch's Gear scan instead (see
    /// [`ODESS_LEVEL`]) and charges a deployment's cost.
    pub features_s_per_byte: fn() -> f64,
    /// CPU seconds per byte of a frame's content hash (xxh3 over its items), measured on this
    /// machine: the similarity encoders skip the hash, which only a decoder needs, and charge
    /// this instead.
    pub frame_hash_s_per_byte: f64,
    /// Compressed sizes shared by all streams.
    pub memo: Memo,
}

/// Compression alone, per 4 MiB batch; on large inputs one batch in `every` after the first
/// few, extrapolated like a residual stream.
struct CompressRunner {
    method: Compression,
    stream: Residual,
}

impl CompressRunner {
    /// Compression alone with `method`; the reference of the other streams if they compress
    /// with it too (`on_top`).
    fn new(method: Compression, on_top: Compression, every: u64, memo: &Memo) -> Self {
        let stream = Residual::new(every, method, memo);
        CompressRunner {
            method,
            stream: match method == on_top {
                true => stream.publishing(),
                false => stream,
            },
        }
    }
}

impl Runner for CompressRunner {
    fn feed(&mut self, batch: &Arc<Batch>) {
        self.stream.push_input_batch(&batch.data, batch.seq);
        if self.stream.publishes {
            // Published now, not when the next batch comes: streams wait for it.
            self.stream.flush();
        }
    }

    fn finish(mut self: Box<Self>) -> Vec<Measured> {
        let (out, rel, cpu) = self.stream.estimate();
        ["local", "global"]
            .into_iter()
            .map(|scope| Measured {
                name: self.method.to_string(),
                family: "compress".into(),
                scope,
                params: serde_json::json!({ "compression": self.method.to_string(), "batch_bytes": BATCH_BYTES }),
                output_bytes: out,
                index_bytes: 0,
                cpu_seconds: cpu,
                rel_error: rel,
            })
            .collect()
    }
}

/// A stream that may (see [`Residual::with_two_phase`]) compresses one of its dense sampled
/// batches in this many, the rest estimated from the reference's. Offline, on every batch of
/// every stream of the five Debian images compressed and logged, for all 50 starts of the
/// sampling: rms error 4.96% instead of 4.63% (trees 5.97% instead of 5.45%), the largest the
/// same, for about half the level-3 bytes; compressing every stream's sampled batches less
/// often for the same saving erred 6.5% (6.1%).
const DENSE_EVERY: u64 = 3;

/// Whether a stream's batch of `raw` bytes kept at least half of an input batch: the batches
/// the two-phase estimate may leave to the reference.
fn dense(raw: u64) -> bool {
    raw >= (BATCH_BYTES / 2) as u64
}

/// Slices of every unsampled batch compressed as a proxy for the whole batch.
const PROXY_SLICES: usize = 32;
/// Bytes per proxy slice: 32 × 2 KiB = 1/64 of a batch. (Eight 4 KiB slices, half the bytes,
/// estimated the five Debian images' zstd stream with 5.3% rms error instead of 4.0%, over
/// every start of the sampling; more, smaller slices of the same bytes tracked better too.)
const PROXY_SLICE: usize = 2 << 10;
/// The zstd level the input's proxy slices are compressed at, for every stream (see
/// [`Residual`]).
const SLICE_LEVEL: i32 = 1;

/// The parts of the `len` bytes at offset `at` of a batch that fall in its proxy slices: each
/// slice's number and the part's range within the batch.
fn slice_parts(at: usize, len: usize) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> {
    let stride = BATCH_BYTES / PROXY_SLICES;
    let to = at + len;
    (at / stride..)
        .take_while(move |k| k * stride < to)
        .map(move |k| (k, (k * stride).max(at)..(k * stride + PROXY_SLICE).min(to)))
        .filter(|(_, r)| !r.is_empty())
}

/// Appends to `out` the parts of `data`, which starts at offset `at` of its batch, that fall in
/// the batch's proxy slices.
fn proxy_slices(at: usize, data: &[u8], out: &mut Vec<u8>) {
    for (_, r) in slice_parts(at, data.len()) {
        out.extend_from_slice(&data[r.start - at..r.end - at]);
    }
}

/// The length of each proxy slice of a batch of `len` bytes (0 past its end).
fn slice_lens(len: usize) -> impl Iterator<Item = usize> {
    let stride = BATCH_BYTES / PROXY_SLICES;
    (0..PROXY_SLICES).map(move |k| PROXY_SLICE.min(len.saturating_sub(k * stride)))
}

/// Adds to `kept` the bytes of each proxy slice that `len` bytes at offset `at` of their
/// batch cover; returns how many that is in all.
fn count_slices(at: usize, len: usize, kept: &mut [u32; PROXY_SLICES]) -> usize {
    let mut all = 0;
    for (k, r) in slice_parts(at, len).take_while(|&(k, _)| k < PROXY_SLICES) {
        kept[k] += r.len() as u32;
        all += r.len();
    }
    all
}

/// What each proxy slice of the input batch `data` adds to their compression: the slices
/// compressed as one zstd frame at [`SLICE_LEVEL`] (as a stream's proxy is), flushed after
/// each slice so that each has blocks of its own.
fn slice_sizes(data: &[u8]) -> SliceSizes {
    use zstd::zstd_safe::{zstd_sys::ZSTD_EndDirective, CCtx, CParameter, InBuffer, OutBuffer};
    thread_local! {
        static SLICER: std::cell::RefCell<(Option<CCtx<'static>>, Vec<u8>)> =
            const { std::cell::RefCell::new((None, Vec::new())) };
    }
    let stride = BATCH_BYTES / PROXY_SLICES;
    let total: usize = slice_lens(data.len()).sum();
    let slices = slice_lens(data.len())
        .enumerate()
        .map(|(k, len)| match len {
            0 => &[][..],
            _ => &data[k * stride..k * stride + len],
        });
    SLICER.with_borrow_mut(|(cctx, out)| {
        let cctx = cctx.get_or_insert_with(CCtx::create);
        let ok = "a compression context takes its parameters and the output has room";
        cctx.reset(zstd::zstd_safe::ResetDirective::SessionOnly)
            .expect(ok);
        cctx.set_parameter(CParameter::CompressionLevel(SLICE_LEVEL))
            .expect(ok);
        cctx.set_pledged_src_size(Some(total as u64)).expect(ok);
        out.clear();
        // Past the compress bound: each flushed slice may add a block header.
        out.reserve(zstd::zstd_safe::compress_bound(total) + 8 * PROXY_SLICES);
        let (mut done, mut last) = (0, 0);
        slices
            .map(|slice| {
                done += slice.len();
                let end = match done == total {
                    true => ZSTD_EndDirective::ZSTD_e_end,
                    false => ZSTD_EndDirective::ZSTD_e_flush,
                };
                if slice.is_empty() {
                    return 0;
                }
                let mut input = InBuffer::around(slice);
                let mut output = OutBuffer::around_pos(out, last);
                while cctx
                    .compress_stream2(&mut output, &mut input, end)
                    .expect(ok)
                    > 0
                {}
                let pos = output.pos();
                let size = (pos - last) as u32;
                last = pos;
                size
            })
            .collect()
    })
}

/// Compresses a stream in batches: one in `every` (the middle one of each run of `every`), and
/// estimates the rest with a **ratio estimator**: every batch also has a cheap proxy (32
/// slices of 2 KiB spread over it, compressed together at a fast level, 1/64 of a 4 MiB
/// batch), and the unsampled batches' output is their proxy times the sampled batches' ratio
/// of output to proxy. Data whose compressibility swings from batch to batch
/// (binaries, text, zeros in a disk image) then costs little accuracy. Bytes of unsampled
/// batches are never copied except for the proxy slices.
///
/// The slices lie at fixed places of the **input** batch: a stream's proxy is what it kept
/// of the input there (its own batch's slices if that is under one slice). A method that
/// removed chunks only between the slices then has the input's very proxy. (On the five
/// Debian images this brought the sampled lines closer to an unsampled run than slices of
/// each stream's own batch: rms 2.5% instead of 2.8%, max 3.9% instead of 7.5%; on the trees
/// 5.3% and 8.8% instead of 5.8% and 9.2%.)
///
/// A stream of the input's own bytes at the input's positions (what an exact method kept,
/// or compression alone) does not compress its proxy at all: the input's slices are
/// compressed once per input batch for all streams, as one zstd frame at [`SLICE_LEVEL`]
/// flushed after each slice ([`slice_sizes`]), and a stream's proxy is each slice's part of
/// that, times the share of the slice it kept, for the bytes it kept there. Its proxy had
/// been those bytes compressed, one compression per stream and batch wherever a stream
/// removed any of them: 3 941 of them (178 MB, 0.5 CPU-s) on the five Debian images. Over
/// seven starts of the sampling, the 28 sampled lines' rms deviation from an unsampled run
/// was 4.40% instead of 4.47% there (trees 4.50% instead of 4.77%), the stated error 3.14%
/// instead of 3.35% (4.26% instead of 4.04%), and lz4's line, whose proxies had been lz4,
/// erred 1.33% instead of 1.72% (1.77% instead of 2.82%). Similarity's frames are not the
/// input's bytes: their streams compress the slices of their own batches.
///
/// A method's stream has **one batch per input batch**: what the method emits for those 4 MiB
/// of input (its unique chunks' bytes there, or its frame), as the pipeline compresses one
/// frame per batch of items. Which batches are sampled then depends only on the input batch's
/// number, so every stream samples the same input, and a stream that removed nothing from a
/// batch holds the input's very bytes there: the [`Memo`] compresses them once for all such
/// streams. (An item too large to buffer gets a stream of its own, cut the same way: see
/// [`WholeItem`].)
///
/// A stream too short to reach a sampled batch keeps its first batch's bytes and compresses
/// them at the end, so it still has one sample (and states ±50%).
///
/// (Compressing every stream's first 16 MiB in full, as done before, cost a sixth of the
/// compression and did not make the estimates closer: 4.0% against 4.1% rms error over every
/// start of the sampling on the Debian images' zstd stream; the first batches of an image are
/// atypical, so they are no good samples either: 5.3%.)
///
/// (One proxy shared by all streams, the first 4 KiB of every 64 KiB of input compressed
/// alone, was tried: it saved a few percent of the CPU (within the noise of a loaded machine)
/// and estimated worse, 7.4% standard error on zstd alone instead of 6.4% on four Debian
/// images, with one exact-dedup line 2.2 errors off.)
struct Residual {
    compressor: Compressor,
    /// Compresses the proxies ([`proxy_method`]).
    proxy_compressor: Compressor,
    buf: Vec<u8>,
    /// The proxy slices of the input's batch: the bytes this stream kept where the input's
    /// slices lie (see [`Residual::flush`]).
    proxy: Vec<u8>,
    /// The proxy slices of this stream's own batch, for a batch that kept too little of the
    /// input's slices (gathered only while it has).
    own_proxy: Vec<u8>,
    /// Stream position where the current batch starts.
    start: u64,
    /// Raw bytes in the current batch.
    cur: usize,
    /// With batches that follow the input: the current batch's input batch number, and where
    /// later input batches start (stream position, number) that bytes may still come before.
    seq: Option<u64>,
    bounds: VecDeque<Bound>,
    /// The current input batch's length, if this stream holds input bytes where the input
    /// has them (see [`Residual::begin_input`]): when it kept all of them, its batch is the
    /// input's, known to the memo by number rather than by a hash of its bytes.
    input_len: Option<u64>,
    /// Stream position after the bytes [`Residual::push_batch`] added.
    written: u64,
    every: u64,
    /// Summed proxy estimates of all batches.
    proxy_sum: f64,
    /// (proxy estimate, real output) of the sampled batches.
    pairs: Vec<(f64, f64)>,
    /// Batches that held anything.
    filled: u64,
    /// The first batch's bytes and proxy estimate while no batch has been sampled (filled
    /// while `filled` is 0).
    first: Vec<u8>,
    first_proxy: f64,
    cpu_sampled: f64,
    cpu_proxy: f64,
    /// Estimates absorbed from other streams: bytes, variance, CPU seconds.
    extra: (f64, f64, f64),
    memo: Memo,
    /// This stream compresses the input as it is, and publishes its sampled batches as the
    /// reference of the others (see [`Memo::expect_reference`]).
    publishes: bool,
    /// This stream may leave dense sampled batches to the two-phase estimate.
    two_phase: bool,
    /// `(input batch number, raw bytes)` of each sampled pair this stream compressed itself.
    pair_info: Vec<(u64, u64)>,
    /// Dense sampled batches left to the two-phase estimate: number, proxy estimate, raw bytes.
    skipped: Vec<(u64, f64, u64)>,
    /// With a batch of input bytes at the input's positions, the bytes it kept of each of
    /// the input's proxy slices (instead of the bytes themselves in `proxy`).
    kept: [u32; PROXY_SLICES],
    kept_total: usize,
    /// Batches are frames whose literal runs are the input's bytes ([`Residual::push_frame`]):
    /// those runs count what they hold of the input's proxy slices, and `proxy` gathers the
    /// slices of the frame's other bytes (its header, ops and deltas) as a stream of their own.
    frames: bool,
    /// While a frame's literal run is added: its offset in the input batch.
    run_at: Option<usize>,
    /// Bytes of the current frame that are not the input's.
    other: usize,
}

/// Where an input batch starts in a stream, and its length if the stream holds input bytes at
/// the input's positions.
#[derive(Debug, Clone, Copy)]
struct Bound {
    at: u64,
    seq: u64,
    len: Option<u64>,
}

/// The compressor of the proxies a stream compresses itself (those not made of the input's
/// slices, see [`Residual`]): zstd's fastest regular level for zstd streams (the
/// ratio estimator only needs a proxy that tracks the batch, and level 1 tracked level 3's
/// batches as closely as level 3 itself on five Debian images, for two thirds of its CPU;
/// lz4 and zstd's negative levels tracked worse), the stream's own otherwise.
fn proxy_method(m: Compression) -> Compression {
    match m {
        Compression::Zstd(l) if l > 1 => Compression::Zstd(1),
        m => m,
    }
}

impl Residual {
    fn new(every: u64, method: Compression, memo: &Memo) -> Self {
        Residual {
            compressor: Compressor::new(method),
            proxy_compressor: Compressor::new(proxy_method(method)),
            buf: Vec::new(),
            proxy: Vec::new(),
            own_proxy: Vec::new(),
            start: 0,
            cur: 0,
            seq: None,
            bounds: VecDeque::new(),
            input_len: None,
            written: 0,
            every: every.max(1),
            proxy_sum: 0.0,
            pairs: Vec::new(),
            filled: 0,
            first: Vec::new(),
            first_proxy: 0.0,
            cpu_sampled: 0.0,
            cpu_proxy: 0.0,
            extra: (0.0, 0.0, 0.0),
            memo: memo.clone(),
            publishes: false,
            two_phase: false,
            pair_info: Vec::new(),
            skipped: Vec::new(),
            kept: [0; PROXY_SLICES],
            kept_total: 0,
            frames: false,
            run_at: None,
            other: 0,
        }
    }

    /// This stream as the reference: it compresses the input as it is, with the method of
    /// the others' `+` lines, and publishes its sampled batches for them.
    fn publishing(mut self) -> Self {
        self.memo.expect_reference(self.compressor.method());
        self.publishes = true;
        self
    }

    /// This stream estimating two in three of its dense sampled batches from the reference,
    /// when there is one (see [`DENSE_EVERY`]).
    fn with_two_phase(mut self) -> Self {
        self.two_phase = true;
        self
    }

    /// A copy of this stream's state (with its own compressor: no state is kept between
    /// batches).
    fn fork(&self) -> Residual {
        Residual {
            compressor: Compressor::new(self.compressor.method()),
            proxy_compressor: Compressor::new(self.proxy_compressor.method()),
            buf: self.buf.clone(),
            proxy: self.proxy.clone(),
            own_proxy: self.own_proxy.clone(),
            start: self.start,
            cur: self.cur,
            seq: self.seq,
            bounds: self.bounds.clone(),
            input_len: self.input_len,
            written: self.written,
            every: self.every,
            proxy_sum: self.proxy_sum,
            pairs: self.pairs.clone(),
            filled: self.filled,
            first: self.first.clone(),
            first_proxy: self.first_proxy,
            cpu_sampled: self.cpu_sampled,
            cpu_proxy: self.cpu_proxy,
            extra: self.extra,
            memo: self.memo.clone(),
            publishes: false,
            two_phase: self.two_phase,
            pair_info: self.pair_info.clone(),
            skipped: self.skipped.clone(),
            kept: self.kept,
            kept_total: self.kept_total,
            frames: self.frames,
            run_at: self.run_at,
            other: self.other,
        }
    }

    /// CPU spent so far (on the sampled and proxy compression).
    fn cpu(&self) -> f64 {
        self.cpu_sampled + self.cpu_proxy + self.extra.2
    }

    /// The current batch's number: its input batch's (0 before the first).
    fn number(&self) -> u64 {
        self.seq.unwrap_or(0)
    }

    /// Whether the current batch will be compressed: the middle one of each run of `every`.
    fn sampling(&self) -> bool {
        self.number() % self.every == self.every / 2
    }

    /// Adds `data`, at stream position `at`, to the current batch.
    fn take(&mut self, at: u64, data: &[u8]) {
        if self.sampling() {
            self.buf.extend_from_slice(data);
        } else {
            // Only a batch that ends with under a slice of the input's proxy uses its own, and
            // the input's only grows: past a slice of it, the own slices are not needed.
            if self.input_slice_bytes() < PROXY_SLICE {
                proxy_slices(self.cur, data, &mut self.own_proxy);
            }
            if self.filled == 0 {
                self.first.extend_from_slice(data);
            }
        }
        let at = (at - self.start) as usize;
        match (self.counts_slices(), self.frames, self.run_at) {
            (true, ..) => self.kept_total += count_slices(at, data.len(), &mut self.kept),
            (false, true, Some(run)) => {
                self.kept_total += count_slices(run, data.len(), &mut self.kept);
                self.run_at = Some(run + data.len());
            }
            (false, true, None) => {
                proxy_slices(self.other, data, &mut self.proxy);
                self.other += data.len();
            }
            (false, false, _) => proxy_slices(at, data, &mut self.proxy),
        }
        self.cur += data.len();
    }

    /// Whether the current batch counts what it kept of the input's proxy slices rather
    /// than gathering those bytes: its bytes lie at the input's positions, and it has
    /// proxies at all.
    fn counts_slices(&self) -> bool {
        self.input_len.is_some() && self.every > 1 && !self.frames
    }

    /// Bytes the current batch kept of the input's proxy slices.
    fn input_slice_bytes(&self) -> usize {
        match self.counts_slices() || self.frames {
            true => self.kept_total,
            false => self.proxy.len(),
        }
    }

    /// Makes sure the memo knows what the proxy slices of input batch `seq`, `data`, compress
    /// to ([`slice_sizes`]), for a stream that holds input bytes.
    fn note_input(&mut self, seq: u64, data: &[u8]) {
        if self.every > 1 {
            let cpu = &mut self.cpu_proxy;
            self.memo.note_slices(seq, cpu, || slice_sizes(data));
        }
    }

    /// Says that input batch `seq` starts at stream position `at`: bytes before `at` belong to
    /// the batch before it.
    #[cfg(test)]
    fn begin(&mut self, at: u64, seq: u64) {
        self.begin_bound(Bound { at, seq, len: None });
    }

    /// Says where an input batch starts, as [`Residual::begin`] or [`Residual::begin_input`].
    fn begin_bound(&mut self, bound: Bound) {
        self.bounds.push_back(bound);
    }

    /// [`Residual::begin`] for a stream whose bytes are the input's own, each at the input's
    /// position (what an exact method kept, or all of it), from `at` on, where input batch
    /// `seq` starts: it is `len` bytes. A batch that kept them all is the input's, and its
    /// proxy comes from the input's slices (see [`Residual::note_input`]).
    fn begin_input(&mut self, at: u64, seq: u64, len: u64) {
        let len = Some(len);
        self.begin_bound(Bound { at, seq, len });
    }

    /// Adds the bytes at stream position `at`, splitting them where input batches start.
    /// Positions only grow; what lies between added bytes was removed by the method.
    fn push_at(&mut self, at: u64, mut data: &[u8]) {
        let end = at + data.len() as u64;
        let mut p = at;
        while let Some(&bound) = self.bounds.front() {
            let b = bound.at;
            if b >= end {
                break;
            }
            if b > p {
                let (before, after) = data.split_at((b - p) as usize);
                self.take(p, before);
                data = after;
                p = b;
            }
            self.next_batch(bound);
        }
        self.take(p, data);
    }

    /// Says that nothing more will come before stream position `at`: the batches that end
    /// there or before are complete.
    fn settle(&mut self, at: u64) {
        while let Some(&bound) = self.bounds.front() {
            if bound.at > at {
                break;
            }
            self.next_batch(bound);
        }
    }

    /// Adds all of input batch `seq`'s output, `data`.
    #[cfg(test)]
    fn push_batch(&mut self, data: &[u8], seq: u64) {
        self.begin(self.written, seq);
        self.push_parts(&[data]);
    }

    /// Adds all of input batch `seq`, `data`, as it is.
    fn push_input_batch(&mut self, data: &[u8], seq: u64) {
        self.note_input(seq, data);
        self.begin_input(self.written, seq, data.len() as u64);
        self.push_parts(&[data]);
    }

    /// Adds the frame that input batch `seq`, `input`, encoded to: `parts`, one after the
    /// other, those that lie in `input` its literal runs. The frame's proxy is then mostly the
    /// input's (see [`Residual::note_input`]): only its other bytes are compressed for it.
    fn push_frame(&mut self, parts: &[&[u8]], input: &[u8], seq: u64) {
        self.note_input(seq, input);
        self.frames = self.every > 1;
        let len = Some(input.len() as u64);
        self.begin_bound(Bound {
            at: self.written,
            seq,
            len,
        });
        let within = input.as_ptr_range();
        for part in parts {
            let run = part.as_ptr_range();
            let inside = !part.is_empty() && within.start <= run.start && run.end <= within.end;
            self.run_at = inside.then(|| run.start as usize - within.start as usize);
            self.push_at(self.written, part);
            self.written += part.len() as u64;
        }
        self.run_at = None;
        self.settle(self.written);
    }

    fn push_parts(&mut self, parts: &[&[u8]]) {
        for part in parts {
            self.push_at(self.written, part);
            self.written += part.len() as u64;
        }
        self.settle(self.written);
    }

    /// Ends the current batch; the next is the input batch `bound` starts.
    fn next_batch(&mut self, bound: Bound) {
        self.bounds.pop_front();
        self.flush();
        self.seq = Some(bound.seq);
        self.start = bound.at;
        self.input_len = bound.len;
    }

    /// Compresses (or estimates) the current batch, if it holds anything.
    fn flush(&mut self) {
        if self.cur == 0 {
            return;
        }
        let raw = self.cur as u64;
        let sampled = self.sampling();
        let input = (self.input_len == Some(raw) && !self.frames).then_some(self.number());
        let kept = self.input_slice_bytes();
        let slices = match (self.counts_slices() || self.frames) && kept >= PROXY_SLICE {
            true => {
                let sizes = self.memo.slices(self.number());
                debug_assert!(sizes.is_some(), "streams of input bytes note the input");
                sizes
            }
            false => None,
        };
        let proxy = if let Some(sizes) = slices {
            // Each slice's share of the input's proxy, for the share of it kept.
            let lens = slice_lens(self.input_len.unwrap_or(0) as usize);
            let out: f64 = (sizes.iter().zip(&self.kept).zip(lens))
                .filter(|&(_, len)| len > 0)
                .map(|((&c, &k), len)| f64::from(c) * f64::from(k) / len as f64)
                .sum();
            let runs = (raw - self.other as u64) as f64;
            let other = match self.other {
                0 => 0.0,
                n => {
                    let p = &self.proxy;
                    let out =
                        (self.memo).compress(&mut self.proxy_compressor, p, &mut self.cpu_proxy);
                    out as f64 / p.len().max(1) as f64 * n as f64
                }
            };
            out / kept as f64 * runs + other
        } else if self.every > 1 {
            let p = if kept >= PROXY_SLICE && !self.counts_slices() && !self.frames {
                &self.proxy
            } else {
                if sampled {
                    proxy_slices(0, &self.buf, &mut self.own_proxy);
                }
                &self.own_proxy
            };
            let out = (self.memo).compress(&mut self.proxy_compressor, p, &mut self.cpu_proxy);
            out as f64 / p.len().max(1) as f64 * raw as f64
        } else {
            0.0
        };
        self.proxy_sum += proxy;
        if sampled && self.leaves_to_reference(raw) {
            self.skipped.push((self.number(), proxy, raw));
            self.first = Vec::new();
        } else if sampled {
            let (c, buf) = (&mut self.compressor, &self.buf);
            let out = self
                .memo
                .compress_input(c, buf, input, &mut self.cpu_sampled) as u64;
            self.pairs.push((proxy, out as f64));
            self.pair_info.push((self.number(), raw));
            if self.publishes {
                let method = self.compressor.method();
                self.memo
                    .publish_reference(method, self.number(), proxy, out as f64);
            }
            self.first = Vec::new();
        } else if self.filled == 0 {
            self.first_proxy = proxy;
        }
        self.filled += 1;
        self.cur = 0;
        self.buf.clear();
        self.proxy.clear();
        self.own_proxy.clear();
        self.kept = [0; PROXY_SLICES];
        self.kept_total = 0;
        self.other = 0;
    }

    /// Whether the current sampled batch, `raw` bytes, is left to the two-phase estimate: a
    /// dense one (at least half an input batch) of a stream that may, with a reference to
    /// lean on, two sampled batches of its own already, and not the one in [`DENSE_EVERY`] it
    /// compresses.
    fn leaves_to_reference(&self, raw: u64) -> bool {
        self.two_phase
            && self.every > 1
            && dense(raw)
            && self.pairs.len() >= 2
            && !(self.number() / self.every).is_multiple_of(DENSE_EVERY)
            && self.memo.has_reference(self.compressor.method())
    }

    /// Adds the batches of `other`, flushed (an item too large to buffer, estimated on its
    /// own until it proved new): its proxies and sampled pairs join this stream's, so one
    /// ratio estimator covers both (each item alone often had a single sampled batch, and
    /// stated ±50% for it).
    fn merge(&mut self, other: &Residual) {
        debug_assert!(other.cur == 0, "merged streams are flushed");
        self.proxy_sum += other.proxy_sum;
        self.pairs.extend_from_slice(&other.pairs);
        self.filled += other.filled;
        self.cpu_sampled += other.cpu_sampled;
        self.cpu_proxy += other.cpu_proxy;
        self.extra.0 += other.extra.0;
        self.extra.1 += other.extra.1;
        self.extra.2 += other.extra.2;
    }

    /// Adds another stream's estimate (an item too large to buffer, compressed on its own).
    fn absorb(&mut self, est: (u64, f64, f64), rel: f64) {
        let (bytes, cpu) = (est.0 as f64, est.2);
        self.extra.0 += bytes;
        self.extra.1 += (rel * bytes).powi(2);
        self.extra.2 += cpu;
    }

    /// Estimated compressed bytes, its relative standard error, and the CPU seconds that
    /// compressing everything would take.
    fn estimate(&mut self) -> (u64, f64, f64) {
        self.flush();
        if self.pairs.is_empty() && !self.first.is_empty() {
            let (c, first) = (&mut self.compressor, &self.first);
            let out = self.memo.compress(c, first, &mut self.cpu_sampled);
            self.pairs.push((self.first_proxy, out as f64));
            self.first = Vec::new();
        }
        let (xb, xvar, xcpu) = self.extra;
        let n = self.pairs.len() as f64;
        let big_n = self.filled as f64;
        let two_phase = match self.skipped.is_empty() {
            true => None,
            false => self.two_phase_estimate(),
        };
        let (own, own_var, own_cpu) = if let Some(found) = two_phase {
            found
        } else if n == big_n {
            let y: f64 = self.pairs.iter().map(|p| p.1).sum();
            (y, 0.0, self.cpu_sampled)
        } else {
            let (sx, sy) = self
                .pairs
                .iter()
                .fold((0.0, 0.0), |(a, b), p| (a + p.0, b + p.1));
            let r = sy / sx.max(1.0);
            let own = r * self.proxy_sum;
            let var = ratio_variance(&self.pairs, big_n, self.proxy_sum)
                // One sample cannot show its own spread: assume the worst plausible, ±50%.
                .unwrap_or((0.5 * own).powi(2));
            let scale = big_n / n.max(1.0);
            (own, var, self.cpu_sampled * scale)
        };
        let est = own + xb;
        (
            est.round() as u64,
            (own_var + xvar).sqrt() / est.max(1.0),
            own_cpu + xcpu,
        )
    }
}

/// One sampled batch of a stream in the two-phase estimate.
struct SampledBatch {
    /// This stream's proxy estimate and, if it compressed the batch, its output.
    p: f64,
    y: f64,
    /// The reference's proxy estimate and output.
    p0: f64,
    y0: f64,
    /// At least half an input batch.
    dense: bool,
    compressed: bool,
    raw: u64,
}

impl Residual {
    /// The two-phase estimate of a stream that left dense sampled batches to the reference:
    /// bytes, variance and CPU seconds, or `None` if the reference lacks one of its batches.
    ///
    /// Every sampled batch `s` has this stream's proxy estimate `p(s)` and the reference's
    /// `(p0(s), y0(s))`; the compressed ones have this stream's output `y(s)` too. The
    /// reference's ratio over all of them, `Σy0 / Σp0`, is scaled by this stream's ratio to
    /// it over the compressed ones, `(Σw·y / Σw·p) / (Σw·y0 / Σw·p0)`, where a dense batch
    /// weighs (dense batches) / (dense batches compressed) and a sparse one 1; the estimate
    /// is that times the stream's summed proxy estimates. The variance is the jackknife's,
    /// leaving out one sampled batch from both phases at a time.
    fn two_phase_estimate(&self) -> Option<(f64, f64, f64)> {
        let seqs: Vec<u64> = (self.pair_info.iter().map(|p| p.0))
            .chain(self.skipped.iter().map(|s| s.0))
            .collect();
        let reference = self.memo.reference_pairs(self.compressor.method(), &seqs);
        let mut all = Vec::with_capacity(self.pairs.len() + self.skipped.len());
        for (&(p, y), &(seq, raw)) in self.pairs.iter().zip(&self.pair_info) {
            let &(p0, y0) = reference.get(&seq)?;
            all.push(SampledBatch {
                p,
                y,
                p0,
                y0,
                dense: dense(raw),
                compressed: true,
                raw,
            });
        }
        for &(seq, p, raw) in &self.skipped {
            let &(p0, y0) = reference.get(&seq)?;
            all.push(SampledBatch {
                p,
                y: 0.0,
                p0,
                y0,
                dense: true,
                compressed: false,
                raw,
            });
        }
        if self.pairs.len() != self.pair_info.len() || all.len() < 3 {
            return None;
        }
        let estimate = |leave: Option<usize>| -> Option<f64> {
            let kept = || {
                all.iter()
                    .enumerate()
                    .filter(move |&(k, _)| Some(k) != leave)
                    .map(|(_, b)| b)
            };
            let dense_all = kept().filter(|b| b.dense).count() as f64;
            let dense_done = kept().filter(|b| b.dense && b.compressed).count() as f64;
            let w_dense = if dense_all > 0.0 {
                (dense_done > 0.0).then(|| dense_all / dense_done)?
            } else {
                1.0
            };
            let (sp0, sy0) = kept().fold((0.0, 0.0), |(a, c), b| (a + b.p0, c + b.y0));
            let (mut p, mut y, mut p0, mut y0) = (0.0, 0.0, 0.0, 0.0);
            for b in kept().filter(|b| b.compressed) {
                let w = if b.dense { w_dense } else { 1.0 };
                (p, y, p0, y0) = (p + w * b.p, y + w * b.y, p0 + w * b.p0, y0 + w * b.y0);
            }
            if sp0 <= 0.0 || p <= 0.0 || p0 <= 0.0 || y0 <= 0.0 {
                return None;
            }
            Some(self.proxy_sum * (sy0 / sp0) * ((y / p) / (y0 / p0)))
        };
        let est = estimate(None)?;
        let n = all.len() as f64;
        let left_out: Vec<f64> = (0..all.len())
            .map(|k| estimate(Some(k)))
            .collect::<Option<_>>()?;
        let mean = left_out.iter().sum::<f64>() / n;
        let spread: f64 = left_out.iter().map(|e| (e - mean).powi(2)).sum();
        let finite = (1.0 - n / (self.filled as f64)).max(0.0);
        let var = finite * (n - 1.0) / n * spread;
        let raw_done: u64 = all.iter().filter(|b| b.compressed).map(|b| b.raw).sum();
        let raw_all: u64 = all.iter().map(|b| b.raw).sum();
        let cpu =
            self.cpu_sampled / raw_done.max(1) as f64 * raw_all as f64 * (self.filled as f64 / n);
        Some((est, var, cpu))
    }
}

impl Drop for Residual {
    fn drop(&mut self) {
        if self.publishes {
            // Also when its runner panicked: no stream waits for a reference forever.
            self.memo.end_reference(self.compressor.method());
        }
    }
}

/// The jackknife variance of the ratio estimate `Σy / Σx × proxy_sum` from the sampled
/// `(proxy, output)` pairs out of `big_n` batches; `None` below two pairs with a proxy each.
/// (The textbook linearized variance, `Σ(y - r·x)² / (n-1)`, understated the error of the
/// 11 to 16 batches sampled: over every start of the sampling on the five Debian trees'
/// streams, errors were 1.9 of its standard errors rms and within two of them 92% of the
/// time; the jackknife's, 1.3 and 94.5%.)
fn ratio_variance(pairs: &[(f64, f64)], big_n: f64, proxy_sum: f64) -> Option<f64> {
    let n = pairs.len() as f64;
    let (sx, sy) = pairs
        .iter()
        .fold((0.0, 0.0), |(a, b), p| (a + p.0, b + p.1));
    if n < 2.0 || pairs.iter().any(|p| sx - p.0 <= 0.0) {
        return None;
    }
    let left_out = pairs.iter().map(|p| (sy - p.1) / (sx - p.0));
    let mean = left_out.clone().sum::<f64>() / n;
    let spread: f64 = left_out.map(|r| (r - mean).powi(2)).sum();
    let finite = (1.0 - n / big_n).max(0.0);
    Some(finite * (n - 1.0) / n * spread * proxy_sum * proxy_sum)
}

/// One scope of an exact method: what its chunks new to it add up to. With `sample` > 1 only
/// chunks whose id is 0 modulo `sample` are indexed: every copy of a sampled chunk is sampled
/// too (same id), so the duplicate status of each sampled chunk is exact and unique bytes
/// scale by `sample`. Which chunks are new comes from the [`SizeState`]'s index.
struct ExactScope {
    sample: u64,
    unique_bytes: u64,
    /// The sum over sampled chunk ids of the square of the bytes each contributed to
    /// `unique_bytes` (more than its size when the same chunk is new to the local scope in
    /// several images): an id's inclusion is one coin flip, so the variance sums these.
    contrib_sq: f64,
    chunks: u64,
    /// Ids this scope's index holds: for the local scope those of the current image.
    entries: usize,
    peak_entries: usize,
    /// Estimated CPU of the sampled chunks' index work (probe and emission, without the
    /// compression it triggers), to scale up to all chunks.
    index_cpu: f64,
    residual: Residual,
}

impl ExactScope {
    /// A scope whose residual, unless it holds whole items (which join it as streams of
    /// their own), may lean on the reference (see [`Residual::with_two_phase`]).
    fn new(every: u64, on_top: Compression, sample: u64, memo: &Memo, whole: bool) -> Self {
        let residual = Residual::new(every, on_top, memo);
        ExactScope {
            sample: sample.max(1),
            unique_bytes: 0,
            contrib_sq: 0.0,
            chunks: 0,
            entries: 0,
            peak_entries: 0,
            index_cpu: 0.0,
            residual: match whole {
                true => residual,
                false => residual.with_two_phase(),
            },
        }
    }

    /// Counts a sampled chunk of `len` bytes as new to this scope, which had counted it
    /// `before` times (in as many earlier images): its contribution grows from `before * len`
    /// to `(before + 1) * len`.
    fn count_new(&mut self, len: u64, before: u32) {
        self.entries += 1;
        self.unique_bytes += len;
        let len = len as f64;
        self.contrib_sq += len * len * (2 * before + 1) as f64;
    }

    /// Extra CPU all chunks would have cost beyond the sampled ones (index work only; the
    /// residual's compression is extrapolated by its own estimate).
    fn unsampled_cpu(&self) -> f64 {
        self.index_cpu * (self.sample - 1) as f64
    }

    /// Adds a timed sampled chunk's index work: `seconds` in all, less the compression
    /// this scope's residual did meanwhile (it had done `compressed_before` until then).
    fn charge_index(&mut self, seconds: f64, compressed_before: f64) {
        let compressed = self.residual.cpu() - compressed_before;
        self.index_cpu += (seconds - compressed).max(0.0) * TIMED_EVERY as f64;
    }

    /// Starts the next image: a local scope's index starts empty again.
    fn next_image(&mut self) {
        self.peak_entries = self.peak_entries.max(self.entries);
        self.entries = 0;
    }

    /// A copy of this scope, for the global scope at the end of the first image: until then
    /// both scopes saw the same chunks, so they are the same, and the work is done once.
    fn fork(&self) -> ExactScope {
        ExactScope {
            sample: self.sample,
            unique_bytes: self.unique_bytes,
            contrib_sq: self.contrib_sq,
            chunks: self.chunks,
            entries: self.entries,
            peak_entries: self.peak_entries,
            index_cpu: self.index_cpu,
            residual: self.residual.fork(),
        }
    }
}

/// Under chunk sampling, one sampled chunk in this many has its index work timed: a CPU
/// clock read is a system call, dearer than the probe, and timing every sampled chunk cost
/// 1.8 s of system time on 3.3 GB at `--sample-chunks 8`.
const TIMED_EVERY: u64 = 16;

/// How an exact runner cuts: all its sizes from one pass, or one whole-item chunker.
enum Cutter {
    Multi(Box<MultiCut>),
    Whole(Box<WholeItem>),
}

/// Seeds the ids of items no other file has the size of (see [`WholeItem`]).
const UNIQUE_SIZE_SEED: u64 = 0x756e_6971_7565_5f73;

/// Items buffered whole until they end; larger ones stream (see [`WholeItem`]).
const WHOLE_BUFFER: usize = if cfg!(test) { 1 << 20 } else { 64 << 20 };

/// Whole-item chunking without holding huge items in memory: an item is buffered up to
/// [`WHOLE_BUFFER`]; past that it is hashed as it streams and its compression estimated on
/// its own, to be counted only if the item turns out to be new. That estimate cuts the item
/// where input batches start and samples the input batches every stream samples, so an
/// input batch the item fills is the very batch compression alone compresses, and the memo
/// compresses it once (a tar image is one item: cut at its own 4 MiB, it was compressed
/// apart, 0.3 CPU-s on the five Debian images, and estimated from other batches). An item
/// whose size no other file has is new without being hashed (as duplicate finders such as `fdupes` do), which
/// spares hashing most bytes of inputs made of large files.
struct WholeItem {
    hasher: crate::hash::Xxh3,
    /// Items ended so far.
    items: u64,
    /// Stream position after the bytes pushed so far.
    pos: u64,
    /// Bytes of the current item so far.
    len: u64,
    /// The input batch being pushed, its stream position and its length.
    seq: u64,
    batch_at: u64,
    batch_len: u64,
    /// While the current item is buffered, the input batches its bytes lie in: where each
    /// starts in the item (the first at the item's start), its number, and its length if
    /// it starts there too.
    starts: Vec<Bound>,
    /// The current item's pieces so far while it is buffered (all its `len` bytes): held in
    /// their batches, not copied (copying them was 1.3% of the CPU of the Debian trees'
    /// analysis, whose equal files span batches in every snapshot).
    parts: Vec<(Arc<Batch>, std::ops::Range<usize>)>,
    big: Option<Residual>,
    /// The current item is new for sure (no other file has its size): its bytes go straight
    /// to the scopes' streams as they come, neither buffered nor estimated apart.
    direct: bool,
    every: u64,
    on_top: Compression,
    memo: Memo,
}

impl WholeItem {
    /// The id of the item `piece` ends: of its bytes, which are `whole` if it came in one
    /// piece and were hashed as they came otherwise.
    fn id(&self, piece: Piece, whole: &[u8]) -> u64 {
        if piece.size_unique {
            // No other file has its size, so no other item equals it: any id of its own will
            // do, and the item's bytes need no hashing.
            crate::hash::xxh3_64_with_seed(&self.items.to_le_bytes(), UNIQUE_SIZE_SEED)
        } else if self.len == 0 {
            crate::hash::xxh3_64(whole)
        } else {
            self.hasher.digest()
        }
    }

    /// Stream position of the first byte not yet given to the scopes' streams.
    fn pending_start(&self) -> u64 {
        if self.direct {
            self.pos
        } else {
            self.pos - self.len
        }
    }

    /// Says that input batch `seq`, `len` bytes, starts here.
    fn begin_batch(&mut self, seq: u64, len: u64) {
        self.seq = seq;
        self.batch_at = self.pos;
        self.batch_len = len;
        if self.len > 0 && !self.direct {
            match &mut self.big {
                Some(big) => big.begin_input(self.pos, seq, len),
                None => self.starts.push(Bound {
                    at: self.pos,
                    seq,
                    len: Some(len),
                }),
            }
        }
    }

    /// Adds `piece` of `batch`.
    fn push(&mut self, batch: &Arc<Batch>, piece: Piece, size: &mut SizeState) {
        let data = batch.bytes(&piece);
        if self.len == 0 && piece.item_end && data.len() <= WHOLE_BUFFER {
            // A whole item in one piece (most files of a tree): added from the batch, neither
            // copied nor hashed in pieces.
            self.items += 1;
            let id = self.id(piece, data);
            size.add(id, self.pos, data);
            self.pos += data.len() as u64;
            return;
        }
        if self.len == 0 {
            self.direct = piece.size_unique && size.local.sample == 1;
        }
        if self.direct {
            // (Buffering each tar image's first 64 MiB and estimating the rest apart was 1.5%
            // of the analysis' CPU on the five Debian images.)
            size.emit_new(self.pos, data);
            self.len += data.len() as u64;
            self.pos += data.len() as u64;
            if piece.item_end {
                self.items += 1;
                let id = self.id(piece, &[]);
                size.add_with(id, self.len, |_| {});
                self.len = 0;
                self.direct = false;
            }
            return;
        }
        if self.len == 0 {
            let len = (self.pos == self.batch_at).then_some(self.batch_len);
            let (at, seq) = (self.pos, self.seq);
            self.starts.push(Bound { at, seq, len });
        }
        if !piece.size_unique {
            self.hasher.update(data);
        }
        let at = self.pos;
        self.len += data.len() as u64;
        self.pos += data.len() as u64;
        match &mut self.big {
            Some(big) => big.push_at(at, data),
            None if self.len > WHOLE_BUFFER as u64 => {
                let mut big = Residual::new(self.every, self.on_top, &self.memo);
                self.starts.iter().for_each(|&b| big.begin_bound(b));
                self.starts.clear();
                push_parts(&mut big, self.pos - self.len, &self.parts);
                big.push_at(at, data);
                self.parts.clear();
                self.big = Some(big);
            }
            None => self.parts.push((Arc::clone(batch), piece.start..piece.end)),
        }
        if !piece.item_end {
            return;
        }
        self.items += 1;
        let id = self.id(piece, &[]);
        match self.big.take() {
            Some(mut big) => {
                big.flush();
                let alone = big.pairs.is_empty().then(|| big.estimate());
                size.add_streamed(id, self.len, &big, alone);
            }
            None => {
                let at = self.pos - self.len;
                let parts = &self.parts;
                size.add_with(id, self.len, |scope| {
                    push_parts(&mut scope.residual, at, parts)
                });
            }
        }
        self.hasher.reset();
        self.len = 0;
        self.starts.clear();
        self.parts.clear();
    }
}

/// Adds the bytes of `parts`, one after the other from stream position `at`, to `residual`.
fn push_parts(residual: &mut Residual, at: u64, parts: &[(Arc<Batch>, std::ops::Range<usize>)]) {
    let mut pos = at;
    for (batch, range) in parts {
        residual.push_at(pos, &batch.data[range.clone()]);
        pos += range.len() as u64;
    }
}

/// One chunk size of an exact runner: its scopes and the CPU spent on it alone.
struct SizeState {
    spec: ChunkerSpec,
    local: ExactScope,
    global: Option<ExactScope>,
    /// The sampled chunk ids seen, each with the last image it was seen in: one probe tells
    /// both scopes whether a chunk is new to them.
    index: IdSet,
    /// The image being added.
    image: u32,
    /// Sampled chunks added so far, to time one in [`TIMED_EVERY`].
    sampled: u64,
    cpu: f64,
    /// This size's chunks in the current batch: stream start, end, id.
    spans: Vec<(u64, u64, u64)>,
}

impl SizeState {
    /// Says that input batch `seq`, `len` bytes, starts at stream position `at`, and that the
    /// chunks are cut from the input where it has them (see [`Residual::begin_input`]).
    fn begin_input(&mut self, at: u64, seq: u64, data: &[u8]) {
        let len = data.len() as u64;
        self.local.residual.note_input(seq, data);
        self.local.residual.begin_input(at, seq, len);
        if let Some(g) = self.global.as_mut() {
            g.residual.note_input(seq, data);
            g.residual.begin_input(at, seq, len);
        }
    }

    /// Says that every chunk before stream position `at` is added (see [`Residual::settle`]).
    fn settle(&mut self, at: u64) {
        self.local.residual.settle(at);
        if let Some(g) = self.global.as_mut() {
            g.residual.settle(at);
        }
    }

    /// Adds the chunk `id` at stream position `at` to both scopes.
    fn add(&mut self, id: u64, at: u64, chunk: &[u8]) {
        self.add_with(id, chunk.len() as u64, |scope| {
            scope.residual.push_at(at, chunk)
        });
    }

    /// Gives bytes of an item new to both scopes (see [`WholeItem::direct`]) to their
    /// streams, at stream position `at`; the item is counted when it ends.
    fn emit_new(&mut self, at: u64, data: &[u8]) {
        self.local.residual.push_at(at, data);
        if let Some(g) = self.global.as_mut() {
            g.residual.push_at(at, data);
        }
    }

    /// Adds an item too large to buffer, `len` bytes: its own stream, flushed (merged into a
    /// scope's stream where the item is new to it), or that stream's estimate where it reached
    /// no sampled batch.
    fn add_streamed(&mut self, id: u64, len: u64, big: &Residual, alone: Option<(u64, f64, f64)>) {
        self.add_with(id, len, |scope| match alone {
            Some(est) => scope.residual.absorb(est, est.1),
            None => scope.residual.merge(big),
        });
    }

    /// Counts a chunk in both scopes and, if it is sampled, probes the index once: `emit`
    /// then gives its bytes to each scope it is new to. With sampling, one sampled chunk in
    /// [`TIMED_EVERY`] is timed, and each scope charged the probe and its own emission, to
    /// be scaled up to all chunks.
    fn add_with(&mut self, id: u64, len: u64, mut emit: impl FnMut(&mut ExactScope)) {
        self.local.chunks += 1;
        if let Some(g) = self.global.as_mut() {
            g.chunks += 1;
        }
        let sample = self.local.sample;
        if sample > 1 && !id.is_multiple_of(sample) {
            return;
        }
        let timed = sample > 1 && self.sampled.is_multiple_of(TIMED_EVERY);
        self.sampled += 1;
        let clock = || {
            if timed {
                crate::cpu::thread_cpu_seconds()
            } else {
                0.0
            }
        };
        let compressed_before = timed.then(|| {
            (
                self.local.residual.cpu(),
                self.global.as_ref().map_or(0.0, |g| g.residual.cpu()),
            )
        });
        let t0 = clock();
        let added = self.index.insert_in(id, self.image);
        let t1 = clock();
        if added.new_here {
            self.local.count_new(len, added.images_before);
            emit(&mut self.local);
        }
        let t2 = clock();
        if let Some((local, _)) = compressed_before {
            self.local.charge_index(t2 - t0, local);
        }
        if let Some(g) = self.global.as_mut() {
            if added.new_ever {
                g.count_new(len, 0);
                emit(g);
            }
            if let Some((_, global)) = compressed_before {
                g.charge_index((t1 - t0) + (clock() - t2), global);
            }
        }
    }

    /// Starts image `image`: the global scope forks from the local one after the first image
    /// (if `several_images`), and the local scope starts empty.
    fn next_image(&mut self, image: u32, several_images: bool) {
        if several_images && self.global.is_none() {
            self.global = Some(self.local.fork());
        }
        self.local.next_image();
        self.image = image;
    }
}

/// Exact dedup at one or more chunk sizes of one family, cut in one pass.
struct ExactRunner {
    cutter: Cutter,
    sizes: Vec<SizeState>,
    opts: RunnerOptions,
    image: Option<usize>,
    /// CPU shared by all sizes (the Gear pass), split evenly at the end.
    shared_cpu: f64,
    /// The level the batches' Gear scans are asked for: the lowest any runner needs.
    gear_level: u32,
    input_bytes: u64,
    /// With fixed sizes that are all multiples of the smallest: its index and size, and its
    /// recent chunks (stream start, id), from which the larger sizes' ids are made.
    blocks: Option<(usize, u64, Blocks)>,
}

impl ExactRunner {
    fn new(
        specs: &[ChunkerSpec],
        opts: &RunnerOptions,
        gear_level: u32,
    ) -> Result<Self, AnalyzeError> {
        let cutter = match specs {
            [ChunkerSpec::Whole] => Cutter::Whole(Box::new(WholeItem {
                hasher: crate::hash::Xxh3::default(),
                items: 0,
                pos: 0,
                len: 0,
                seq: 0,
                batch_at: 0,
                batch_len: 0,
                starts: Vec::new(),
                parts: Vec::new(),
                big: None,
                direct: false,
                every: opts.compress_every,
                on_top: opts.on_top,
                memo: opts.memo.clone(),
            })),
            _ => Cutter::Multi(Box::new(MultiCut::new(specs).map_err(AnalyzeError::Usage)?)),
        };
        // Whole files are few and index one entry each: sampling them saves little memory and
        // leaves a handful to scale up (on the five tar images, 197% off at 78% stated), so
        // only whole documents, as numerous as chunks, are sampled.
        let sample = match cutter {
            Cutter::Whole(_) if !opts.documents => 1,
            _ => opts.chunk_sample,
        };
        let whole = matches!(cutter, Cutter::Whole(_));
        let scope = || ExactScope::new(opts.compress_every, opts.on_top, sample, &opts.memo, whole);
        Ok(ExactRunner {
            cutter,
            sizes: specs
                .iter()
                .map(|&spec| SizeState {
                    spec,
                    local: scope(),
                    // Forked from the local scope when the first image ends.
                    global: None,
                    index: IdSet::default(),
                    image: 0,
                    sampled: 0,
                    cpu: 0.0,
                    spans: Vec::new(),
                })
                .collect(),
            opts: opts.clone(),
            image: None,
            shared_cpu: 0.0,
            gear_level,
            input_bytes: 0,
            blocks: block_size(specs).map(|(i, s)| (i, s, VecDeque::new())),
        })
    }
}

/// Recent chunks of the smallest fixed size: stream start and id.
type Blocks = VecDeque<(u64, u64)>;

/// Chunks looked up ahead of the one being added, so their index slots are in the cache.
const PREFETCH_AHEAD: usize = 8;

/// For two or more fixed sizes that are all multiples of the smallest: the smallest's index
/// and size. Fixed chunks start at their item's start, so a full chunk of a larger size is a
/// run of whole chunks of the smallest, and its id can be made from theirs: each byte is
/// hashed once, not once per size.
fn block_size(specs: &[ChunkerSpec]) -> Option<(usize, u64)> {
    let sizes: Vec<usize> = specs
        .iter()
        .map(|s| match s {
            ChunkerSpec::Fixed { size } => Some(*size),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let (i, &min) = sizes.iter().enumerate().min_by_key(|&(_, s)| *s)?;
    (sizes.len() > 1 && min > 0 && sizes.iter().all(|s| s % min == 0)).then_some((i, min as u64))
}

/// The id of the full fixed chunk at stream position `start` made of `n` blocks, from the
/// blocks' ids: xxh3-64 of the ids in order.
fn id_from_blocks(blocks: &Blocks, start: u64, n: usize, buf: &mut Vec<u8>) -> u64 {
    let first = blocks.partition_point(|&(s, _)| s < start);
    debug_assert_eq!(blocks.get(first).map(|b| b.0), Some(start));
    buf.clear();
    for &(_, id) in blocks.range(first..first + n) {
        buf.extend_from_slice(&id.to_le_bytes());
    }
    crate::hash::xxh3_64(buf)
}

/// Adds the chunks of size `i` (at `cursor`) that `scanned` decides in `data`: first all their
/// ids, then each chunk while the index slots of those a few places ahead are fetched. With
/// `blocks` (the ids of the smallest fixed size's recent chunks and that size), full chunks
/// take their id from them. The thread's CPU time is added to the size's.
fn add_chunks(
    scanned: &Scanned,
    i: usize,
    cursor: &mut Cursor,
    (data, seq): (&[u8], u64),
    size: &mut SizeState,
    blocks: Option<(&Blocks, u64)>,
) {
    let t0 = crate::cpu::thread_cpu_seconds();
    size.begin_input(scanned.batch_start(), seq, data);
    let mut spans = std::mem::take(&mut size.spans);
    spans.clear();
    let full = match size.spec {
        ChunkerSpec::Fixed { size } => size as u64,
        _ => 0,
    };
    let mut buf = Vec::new();
    scanned.cut(i, cursor, data, |start, end, c| {
        let id = match blocks {
            Some((blocks, b)) if end - start == full => {
                id_from_blocks(blocks, start, (full / b) as usize, &mut buf)
            }
            _ => scanned.id(i, (start, end), c, &mut buf),
        };
        spans.push((start, end, id))
    });
    for k in 0..spans.len() {
        if let Some(&(_, _, ahead)) = spans.get(k + PREFETCH_AHEAD) {
            size.index.prefetch(ahead);
        }
        let (start, end, id) = spans[k];
        let chunk = scanned.bytes(cursor.joined(), data, start, end);
        size.add(id, start, chunk);
    }
    size.spans = spans;
    size.settle(cursor.pending_start());
    size.cpu += crate::cpu::thread_cpu_seconds() - t0;
}

fn scope_result(
    spec: ChunkerSpec,
    on_top: Compression,
    scope: &mut ExactScope,
    name: &'static str,
    cpu: f64,
    chunk_cost: f64,
) -> Vec<Measured> {
    let (z_sampled, z_rel, z_cpu_sampled) = scope.residual.estimate();
    let s = scope.sample;
    let unique = scope.unique_bytes * s;
    let z_bytes = z_sampled * s;
    let z_cpu = z_cpu_sampled * s as f64;
    // Horvitz-Thompson variance of the unique-bytes estimate: Σ x² (1-p)/p² over samples.
    let contrib_sq = scope.contrib_sq;
    let sampling_se = (contrib_sq * (s * (s - 1)) as f64).sqrt();
    let sampling_rel = sampling_se / unique.max(1) as f64;
    let rel = (z_rel.powi(2) + sampling_rel.powi(2)).sqrt();
    let refs = scope.chunks * REF_BYTES;
    let peak = scope.peak_entries.max(scope.entries) as u64 * s;
    let cpu = cpu + scope.unsampled_cpu();
    let family = match spec {
        ChunkerSpec::Whole => "exact-whole",
        ChunkerSpec::Fixed { .. } => "exact-fixed",
        ChunkerSpec::Cdc { .. } => "exact-cdc",
    };
    let label = format!("exact-{}", spec.label());
    let params = serde_json::json!({ "chunker": spec });
    let mut z_params = serde_json::json!({ "chunker": spec, "compression": on_top.to_string() });
    if s > 1 {
        // Sampled chunks compress without their neighbours, so the line overstates.
        z_params["upper_bound"] = true.into();
    }
    let base_cpu = cpu + chunk_cost;
    vec![
        Measured {
            name: label.clone(),
            family: family.into(),
            scope: name,
            params: params.clone(),
            output_bytes: unique + refs,
            index_bytes: peak * INDEX_ENTRY_BYTES,
            cpu_seconds: base_cpu,
            rel_error: sampling_se / (unique + refs).max(1) as f64,
        },
        Measured {
            name: format!("{label}+{}", short(on_top)),
            family: format!("{family}+{}", short(on_top)),
            scope: name,
            params: z_params,
            output_bytes: z_bytes + refs,
            index_bytes: peak * INDEX_ENTRY_BYTES,
            cpu_seconds: base_cpu + z_cpu,
            rel_error: rel * z_bytes as f64 / (z_bytes + refs).max(1) as f64,
        },
    ]
}

fn short(c: Compression) -> &'static str {
    match c {
        Compression::None => "none",
        Compression::Zstd(_) => "zstd",
        Compression::Lz4 => "lz4",
    }
}

impl Runner for ExactRunner {
    fn feed(&mut self, batch: &Arc<Batch>) {
        if self.image.is_some_and(|i| i != batch.image) {
            for size in &mut self.sizes {
                // Images are the command's PATHs: far fewer than 2^32.
                size.next_image(batch.image as u32, self.opts.several_images);
            }
        }
        self.image = Some(batch.image);
        self.input_bytes += batch.data.len() as u64;
        match &mut self.cutter {
            Cutter::Whole(whole) => {
                let size = &mut self.sizes[0];
                let mut cpu = 0.0;
                charge(&mut cpu, || {
                    let len = batch.data.len() as u64;
                    size.begin_input(whole.pos, batch.seq, &batch.data);
                    whole.begin_batch(batch.seq, len);
                    for piece in &batch.pieces {
                        whole.push(batch, *piece, size);
                    }
                    size.settle(whole.pending_start());
                });
                size.cpu += cpu;
            }
            Cutter::Multi(mc) => {
                let gear = mc
                    .min_level()
                    .map(|l| gear_scan(batch, self.gear_level.min(l)));
                self.shared_cpu += gear.as_ref().map_or(0.0, |g| g.cpu);
                charge(&mut self.shared_cpu, || mc.scan(batch, gear.as_deref()));
                let data = (&batch.data[..], batch.seq);
                let (scanned, cursors) = mc.split();
                let base = self.blocks.as_ref().map(|b| b.0);
                if let Some((b, _, blocks)) = &mut self.blocks {
                    let size = &mut self.sizes[*b];
                    add_chunks(&scanned, *b, &mut cursors[*b], data, size, None);
                    blocks.extend(size.spans.iter().map(|&(s, _, id)| (s, id)));
                }
                let blocks = self.blocks.as_ref().map(|(_, s, blocks)| (blocks, *s));
                // Each size cuts, hashes, indexes and compresses on its own: on their own
                // threads, the sizes use every core.
                let scanned = &scanned;
                let jobs: Vec<_> = self
                    .sizes
                    .iter_mut()
                    .zip(cursors.iter_mut())
                    .enumerate()
                    .filter(|&(i, _)| Some(i) != base)
                    .map(|(i, (size, cursor))| {
                        move || add_chunks(scanned, i, cursor, data, size, blocks)
                    })
                    .collect();
                crate::parallel::run_all(jobs);
                if let Some((_, _, blocks)) = &mut self.blocks {
                    let keep_from = mc.pending_start();
                    let drop = blocks.partition_point(|&(s, _)| s < keep_from);
                    blocks.drain(..drop);
                }
                charge(&mut self.shared_cpu, || mc.end_batch(&batch.data));
            }
        }
    }

    fn finish(self: Box<Self>) -> Vec<Measured> {
        let shared = self.shared_cpu / self.sizes.len().max(1) as f64;
        let on_top = self.opts.on_top;
        let mut out = Vec::new();
        for mut size in self.sizes {
            let avg = match size.spec {
                ChunkerSpec::Whole => 1 << 20,
                ChunkerSpec::Fixed { size } => size,
                ChunkerSpec::Cdc { avg, .. } => avg,
            };
            let chunk_cost = (self.opts.blake3_s_per_byte)(avg) * self.input_bytes as f64;
            // Residual batches compressed while cutting were charged to `cpu` too; the +zstd
            // lines add the (extrapolated) compression cost themselves.
            let fed_residual_cpu =
                size.local.residual.cpu() + size.global.as_ref().map_or(0.0, |g| g.residual.cpu());
            let cpu = (size.cpu + shared - fed_residual_cpu).max(0.0);
            let local = scope_result(size.spec, on_top, &mut size.local, "local", cpu, chunk_cost);
            match size.global.as_mut() {
                Some(g) => {
                    out.extend(local);
                    out.extend(scope_result(
                        size.spec, on_top, g, "global", cpu, chunk_cost,
                    ));
                }
                None => {
                    let global: Vec<Measured> = local
                        .iter()
                        .cloned()
                        .map(|m| Measured {
                            scope: "global",
                            ..m
                        })
                        .collect();
                    out.extend(local);
                    out.extend(global);
                }
            }
        }
        out
    }
}

/// sDedup sketches for documents, Neptune super-features for files, through the real pipeline.
struct SimilarityRunner {
    opts: RunnerOptions,
    image: Option<usize>,
    /// With one image, its only scope, encoded on this thread.
    local: [Option<SimScope>; 2],
    local_done: [SimTotals; 2],
    /// With several images, each scope encodes on a thread of its own, from the batches and
    /// the cuts, fingerprints and features this one prepared for both: the three share the
    /// work, where one thread preparing and encoding the local scope held the others up.
    /// The first image only the global scope encodes: from empty windows, the local one
    /// would encode it alike (as exact dedup's global scope forks from the local one).
    scopes: Option<[ScopeThread; 2]>,
    /// Per item kind, an encoder that only prepares batches for the scope threads.
    prep: [Option<Encoder>; 2],
    /// The image of the first batch, which only the global scope thread encodes.
    first_image: Option<usize>,
    input_bytes: u64,
    /// The level the batches' Gear scans are asked for (see [`ExactRunner`]'s).
    gear_level: u32,
}

/// A batch for a scope thread: its kind slot, configuration, the batch, its preparation and
/// that preparation's CPU seconds.
type SimJob = (usize, PipelineConfig, Arc<Batch>, Arc<Prepared>, f64);

/// One similarity scope encoding on its own thread; the thread returns what it measured.
struct ScopeThread {
    tx: SyncSender<SimJob>,
    handle: JoinHandle<ScopeResult>,
}

/// What a scope thread measured: its totals and, for the global scope, its totals at the
/// end of the first image, which are the local scope's there (the two saw the same data
/// from empty windows, so they encode it alike: the local thread skips that image).
struct ScopeResult {
    done: [SimTotals; 2],
    first_image: [SimTotals; 2],
}

impl ScopeThread {
    /// A thread for the local scope (`per_image`: a new window for each image) or the global
    /// one, its windows' units held in the shared `store`.
    fn start(per_image: bool, opts: &RunnerOptions, store: &Arc<UnitStore>) -> Self {
        let (tx, rx) = sync_channel::<SimJob>(QUEUE_BATCHES);
        let (every, on_top) = (opts.compress_every, opts.on_top);
        let (memo, store) = (opts.memo.clone(), Arc::clone(store));
        let handle = std::thread::spawn(move || {
            let mut scopes: [Option<SimScope>; 2] = [None, None];
            let mut done = [SimTotals::default(); 2];
            let mut first_image = None;
            let mut image = None;
            for (slot, config, batch, prepared, prepare_cpu) in rx {
                if image.is_some_and(|i| i != batch.image) {
                    if per_image {
                        retire(&mut scopes, &mut done);
                    } else if first_image.is_none() {
                        first_image = Some(scopes.each_ref().map(SimScope::totals_so_far));
                    }
                }
                image = Some(batch.image);
                let items: Vec<&[u8]> = batch.pieces.iter().map(|p| batch.bytes(p)).collect();
                let owner: SharedBytes = batch.clone();
                scopes[slot]
                    .get_or_insert_with(|| {
                        SimScope::new(config, every, on_top, &memo, Some(&store))
                    })
                    .feed((&owner, batch.seq), &items, &prepared, prepare_cpu);
            }
            let first_image =
                first_image.unwrap_or_else(|| scopes.each_ref().map(SimScope::totals_so_far));
            retire(&mut scopes, &mut done);
            ScopeResult { done, first_image }
        });
        ScopeThread { tx, handle }
    }

    fn send(&self, job: SimJob) {
        self.tx
            .send(job)
            .expect("a similarity scope thread runs until its sender is dropped");
    }

    fn join(self) -> ScopeResult {
        drop(self.tx);
        self.handle
            .join()
            .expect("a similarity scope thread does not panic")
    }
}

/// Adds what `scopes` measured to `done` and drops them. Images are analyzed one after
/// another: index memory is the largest, not the sum.
fn retire(scopes: &mut [Option<SimScope>; 2], done: &mut [SimTotals; 2]) {
    for (scope, done) in scopes.iter_mut().zip(done) {
        if let Some(mut s) = scope.take() {
            *done = done.add(s.totals(), u64::max);
        }
    }
}

/// One scope of the similarity method: the real pipeline without compression, its frames
/// then compressed (sampled on large inputs) like a residual stream.
struct SimScope {
    encoder: Encoder,
    residual: Residual,
    /// A frame's header, its other parts staying in the encoder.
    head: Vec<u8>,
    cpu: f64,
    peak_index: u64,
    /// Every unit id seen, however old.
    seen: IdSet,
    /// Bytes of units seen before: those the window did not reference (`ref_bytes` is the
    /// rest) were copies of data it had already dropped.
    repeated_bytes: u64,
}

impl SimScope {
    fn new(
        config: PipelineConfig,
        every: u64,
        on_top: Compression,
        memo: &Memo,
        store: Option<&Arc<UnitStore>>,
    ) -> Self {
        let mut encoder = sim_encoder(config).with_smaller_windows();
        if let Some(store) = store {
            encoder = encoder.with_unit_store(Arc::clone(store));
        }
        SimScope {
            encoder,
            residual: Residual::new(every, on_top, memo).with_two_phase(),
            head: Vec::new(),
            cpu: 0.0,
            peak_index: 0,
            seen: IdSet::default(),
            repeated_bytes: 0,
        }
    }

    /// Encodes `items`, which lie in `batch` (input batch number `seq`), with their
    /// `prepared` cuts, fingerprints and features into one frame; its cost `prepare_cpu` is
    /// charged to this scope too, as a deployment would pay it. The encoder's window keeps
    /// parts of `batch` rather than copies.
    fn feed(
        &mut self,
        (batch, seq): (&SharedBytes, u64),
        items: &[&[u8]],
        prepared: &Prepared,
        prepare_cpu: f64,
    ) {
        self.cpu += prepare_cpu;
        for (fp, len) in prepared.unit_fingerprints() {
            if !self.seen.insert(fp.prefix_u64()) {
                self.repeated_bytes += u64::from(len);
            }
        }
        let t0 = crate::cpu::thread_cpu_seconds();
        let parts = self
            .encoder
            .encode_prepared_parts(batch, items, prepared, &mut self.head);
        self.cpu += crate::cpu::thread_cpu_seconds() - t0;
        self.residual.push_frame(&parts, (**batch).as_ref(), seq);
        self.peak_index = self.peak_index.max(self.encoder.index_bytes());
    }

    /// Raw bytes, compressed bytes (estimated), their relative error, index bytes, CPU
    /// without compression, and CPU of compressing everything.
    fn totals(&mut self) -> SimTotals {
        let estimate = self.residual.estimate();
        self.totals_with(estimate)
    }

    /// [`SimScope::totals`] of what was fed so far, the scope going on unchanged; nothing
    /// for no scope.
    fn totals_so_far(scope: &Option<SimScope>) -> SimTotals {
        scope.as_ref().map_or_else(SimTotals::default, |s| {
            s.totals_with(s.residual.fork().estimate())
        })
    }

    /// The totals, given the residual stream's estimate.
    fn totals_with(&self, (z, rel, zcpu): (u64, f64, f64)) -> SimTotals {
        let s = self.encoder.stats();
        SimTotals {
            raw: s.raw_bytes,
            z,
            z_var: (rel * z as f64).powi(2),
            index: self.peak_index,
            cpu: self.cpu,
            z_cpu: zcpu,
            beyond_window: self.repeated_bytes.saturating_sub(s.ref_bytes),
            smaller: self
                .encoder
                .smaller_windows()
                .map(|s| s.lost())
                .unwrap_or_default(),
        }
    }
}

/// An encoder as the similarity scopes use it: without compression (their frames are
/// compressed as a residual stream), xxh3 ids, no content hash.
fn sim_encoder(config: PipelineConfig) -> Encoder {
    let config = PipelineConfig {
        compression: Compression::None,
        ..config
    };
    Encoder::new(config)
        .expect("built-in configurations are valid")
        .with_fingerprinter(Fingerprinter::estimate())
        .without_content_hash()
}

/// What a similarity scope measured (summed over item kinds and images).
#[derive(Debug, Clone, Copy, Default)]
struct SimTotals {
    raw: u64,
    z: u64,
    z_var: f64,
    index: u64,
    cpu: f64,
    z_cpu: f64,
    /// Bytes of units that copied data older than the window.
    beyond_window: u64,
    /// Smaller windows and what each would have lost.
    smaller: [(u64, u64); SMALLER],
}

impl SimTotals {
    fn add(self, o: SimTotals, index: fn(u64, u64) -> u64) -> SimTotals {
        SimTotals {
            smaller: std::array::from_fn(|k| {
                let (a, b) = (self.smaller[k], o.smaller[k]);
                (a.0.max(b.0), a.1 + b.1)
            }),
            raw: self.raw + o.raw,
            z: self.z + o.z,
            z_var: self.z_var + o.z_var,
            index: index(self.index, o.index),
            cpu: self.cpu + o.cpu,
            z_cpu: self.z_cpu + o.z_cpu,
            beyond_window: self.beyond_window + o.beyond_window,
        }
    }
}

/// Windows of a half, a quarter, an eighth and a sixteenth of the window, each with about the
/// most it would write: `raw` plus what it would have lost (see
/// `dedupwire_engine::pipeline::SmallerWindows`).
fn smaller_windows(raw: u64, smaller: &[(u64, u64); SMALLER]) -> serde_json::Value {
    smaller
        .iter()
        .filter(|&&(w, _)| w > 0)
        .map(|&(w, lost)| {
            serde_json::json!({
                "window_bytes": w,
                "output_bytes_at_most": raw + lost,
            })
        })
        .collect()
}

fn kind_slot(kind: ItemKind) -> usize {
    match kind {
        ItemKind::Document => 0,
        ItemKind::File => 1,
    }
}

/// Bytes of units each thread of [`prepare_units`] takes at least.
const UNITS_PER_THREAD: usize = if cfg!(test) { 16 << 10 } else { 1 << 20 };

/// Odess features of a batch's units from its Gear scan (see [`ODESS_LEVEL`]).
#[derive(Clone, Copy)]
struct ScanFeatures<'a> {
    gear: &'a GearScan,
    /// The batch's bytes, which the units are slices of.
    data: &'a [u8],
    config: SuperFeatureConfig,
}

impl ScanFeatures<'_> {
    /// The super-features of `unit` into `out`; false if no position in it was sampled.
    fn of(&self, unit: &[u8], out: &mut Vec<u64>) -> bool {
        let from = (unit.as_ptr() as usize).wrapping_sub(self.data.as_ptr() as usize);
        assert!(
            from <= self.data.len() && unit.len() <= self.data.len() - from,
            "units are slices of their batch"
        );
        let samples = self.gear.samples(from, from + unit.len(), ODESS_LEVEL);
        self.config.odess_from_samples(samples, out)
    }
}

/// Fingerprints and features of `units`, in consecutive parts of at least
/// [`UNITS_PER_THREAD`] bytes on their own threads (one part per core at most), with each
/// part's CPU seconds. Features come from `scan` where it has them.
fn prepare_units(
    prep: &UnitPrep,
    units: &[&[u8]],
    scan: Option<ScanFeatures<'_>>,
) -> Vec<(PreparedUnits, f64)> {
    let total: usize = units.iter().map(|u| u.len()).sum();
    let parts = (total / UNITS_PER_THREAD).clamp(1, crate::parallel::cores());
    let mut bounds = vec![0];
    let mut acc = 0;
    for (k, u) in units.iter().enumerate() {
        acc += u.len();
        if acc * parts >= total * bounds.len() && bounds.len() < parts {
            bounds.push(k + 1);
        }
    }
    bounds.push(units.len());
    bounds.dedup();
    if bounds.len() == 1 {
        // No units: one empty part, so the preparation still says it has features.
        bounds.push(0);
    }
    let jobs: Vec<_> = bounds
        .windows(2)
        .map(|w| {
            let part = &units[w[0]..w[1]];
            move || {
                let mut done = PreparedUnits::default();
                let mut cpu = 0.0;
                charge(&mut cpu, || match scan {
                    Some(scan) => {
                        prep.prepare_with(part.iter().copied(), &mut done, |_, u, out| {
                            scan.of(u, out)
                        })
                    }
                    None => prep.prepare(part.iter().copied(), &mut done),
                });
                (done, cpu)
            }
        })
        .collect();
    crate::parallel::run_all(jobs)
}

impl SimilarityRunner {
    fn new(opts: &RunnerOptions, gear_level: u32) -> Result<Self, AnalyzeError> {
        let scopes = opts.several_images.then(|| {
            let store = Arc::new(UnitStore::with_populate(crate::pages::populate));
            [true, false].map(|per_image| ScopeThread::start(per_image, opts, &store))
        });
        Ok(SimilarityRunner {
            opts: opts.clone(),
            image: None,
            local: [None, None],
            local_done: [SimTotals::default(); 2],
            scopes,
            prep: [None, None],
            first_image: None,
            input_bytes: 0,
            gear_level,
        })
    }

    /// How files are cut into units.
    fn files_chunker() -> ChunkerSpec {
        PipelineConfig::files().chunker
    }

    fn config(&self, kind: ItemKind) -> PipelineConfig {
        let base = match kind {
            ItemKind::Document => PipelineConfig::documents(),
            ItemKind::File => PipelineConfig::files(),
        };
        PipelineConfig {
            compression: self.opts.on_top,
            window_bytes: self.opts.window_bytes,
            ..base
        }
    }
}

impl Runner for SimilarityRunner {
    fn feed(&mut self, batch: &Arc<Batch>) {
        if self.image.is_some_and(|i| i != batch.image) {
            retire(&mut self.local, &mut self.local_done);
        }
        self.image = Some(batch.image);
        self.input_bytes += batch.data.len() as u64;
        let slot = kind_slot(batch.kind);
        let items: Vec<&[u8]> = batch.pieces.iter().map(|p| batch.bytes(p)).collect();
        let config = self.config(batch.kind);
        // The ids are xxh3 (an estimate needs no collision resistance); a deployment's BLAKE3
        // is charged at its measured cost for units of this size instead.
        let unit_bytes = match config.chunker {
            ChunkerSpec::Whole => batch.data.len() / items.len().max(1),
            ChunkerSpec::Fixed { size } => size,
            ChunkerSpec::Cdc { avg, .. } => avg,
        };
        let unit_bytes = unit_bytes.clamp(64, 1 << 20).next_power_of_two();
        let mut prepare_cpu = ((self.opts.blake3_s_per_byte)(unit_bytes)
            + self.opts.frame_hash_s_per_byte)
            * batch.data.len() as f64;
        // Units by content are cut from the batch's Gear scan, which exact dedup shares, and
        // their super-features sampled from it; a deployment's features are charged instead.
        let gear = cdc_level(config.chunker)
            .map(|l| gear_scan(batch, self.gear_level.min(l).min(ODESS_LEVEL)));
        prepare_cpu += gear.as_ref().map_or(0.0, |g| g.cpu);
        let scan = match (&gear, config.similarity) {
            (Some(gear), Similarity::SuperFeatures(config)) => {
                prepare_cpu += (self.opts.features_s_per_byte)() * batch.data.len() as f64;
                Some(ScanFeatures {
                    gear,
                    data: &batch.data,
                    config,
                })
            }
            _ => None,
        };
        let cut = |i: usize, _: &[u8], lens: &mut Vec<u32>| {
            let gear: &GearScan = gear.as_ref().expect("units by content");
            cdc_lens(gear, &batch.pieces[i], config.chunker, lens)
        };
        let (every, on_top) = (self.opts.compress_every, self.opts.on_top);
        let mut prepared = Prepared::default();
        let prep = match &self.scopes {
            Some(_) => self.prep[slot].get_or_insert_with(|| sim_encoder(config)),
            None => {
                let local = self.local[slot].get_or_insert_with(|| {
                    SimScope::new(config, every, on_top, &self.opts.memo, None)
                });
                if gear.is_none() {
                    // One scope, whole items: the encoder computes features only for the
                    // items it does not find whole.
                    charge(&mut prepare_cpu, || {
                        local.encoder.prepare_fingerprints(&items, &mut prepared)
                    });
                    let owner: SharedBytes = batch.clone();
                    local.feed((&owner, batch.seq), &items, &prepared, prepare_cpu);
                    return;
                }
                &mut local.encoder
            }
        };
        charge(&mut prepare_cpu, || match gear {
            Some(_) => prep.prepare_cuts_with(&items, &mut prepared, cut),
            None => prep.prepare_cuts(&items, &mut prepared),
        });
        let units = prepared.units(&items);
        for (done, cpu) in prepare_units(&prep.unit_prep(), &units, scan) {
            prepared.append_units(&done);
            prepare_cpu += cpu;
        }
        let Some(scopes) = &self.scopes else {
            let local = self.local[slot].as_mut().expect("made above");
            let owner: SharedBytes = batch.clone();
            local.feed((&owner, batch.seq), &items, &prepared, prepare_cpu);
            return;
        };
        let prepared = Arc::new(prepared);
        let first_image = *self.first_image.get_or_insert(batch.image);
        let [local, global] = scopes;
        let job = || {
            let (batch, prepared) = (Arc::clone(batch), Arc::clone(&prepared));
            (slot, config, batch, prepared, prepare_cpu)
        };
        if batch.image != first_image {
            local.send(job());
        }
        global.send(job());
    }

    fn finish(mut self: Box<Self>) -> Vec<Measured> {
        retire(&mut self.local, &mut self.local_done);
        let (local, global) = match self.scopes.take() {
            Some([local, global]) => {
                let (local, global) = (local.join(), global.join());
                let with_first =
                    std::array::from_fn(|k| global.first_image[k].add(local.done[k], u64::max));
                (with_first, global.done)
            }
            None => (self.local_done, self.local_done),
        };
        let sum = |t: &[SimTotals; 2]| t[0].add(t[1], |a, b| a + b);
        let on_top = short(self.opts.on_top);
        let params = serde_json::json!({
            "documents": { "chunker": "whole", "similarity": "sketch", "k": 8, "delta": "sampled" },
            "files": { "chunker": format!("cdc-{}", size_label(8 << 10)), "similarity": "super-features", "delta": "sampled" },
            "window_bytes": self.opts.window_bytes,
        });
        let mut out = Vec::new();
        for (scope, t) in [("local", sum(&local)), ("global", sum(&global))] {
            let mut params = params.clone();
            params["beyond_window_bytes"] = t.beyond_window.into();
            let mut plain = params.clone();
            plain["smaller_windows"] = smaller_windows(t.raw, &t.smaller);
            out.push(Measured {
                name: "similarity".into(),
                family: "similarity".into(),
                scope,
                params: plain,
                output_bytes: t.raw,
                index_bytes: t.index,
                cpu_seconds: t.cpu,
                rel_error: 0.0,
            });
            out.push(Measured {
                name: format!("similarity+{on_top}"),
                family: format!("similarity+{on_top}"),
                scope,
                params: params.clone(),
                output_bytes: t.z,
                index_bytes: t.index,
                cpu_seconds: t.cpu + t.z_cpu,
                rel_error: t.z_var.sqrt() / t.z.max(1) as f64,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::test_batches;

    #[test]
    fn slices_are_counted_where_proxy_slices_takes_their_bytes() {
        // The slice estimate weighs what a stream kept of each slice by the slice's length:
        // counting, gathering and the lengths must agree, wherever the kept bytes lie.
        let stride = BATCH_BYTES / PROXY_SLICES;
        let data = vec![7u8; BATCH_BYTES + stride];
        let lens = [
            0,
            1,
            PROXY_SLICE - 1,
            PROXY_SLICE,
            PROXY_SLICE + 1,
            stride - 1,
            stride,
        ];
        let lens = lens
            .into_iter()
            .chain([stride + 1, 5 * stride + 17, BATCH_BYTES - 1]);
        for len in lens.chain([BATCH_BYTES]) {
            let mut out = Vec::new();
            proxy_slices(0, &data[..len], &mut out);
            let whole: Vec<u32> = slice_lens(len).map(|l| l as u32).collect();
            assert_eq!(whole.iter().sum::<u32>() as usize, out.len(), "{len} bytes");
            for (at, part) in [(0, len), (len / 3, len / 2), (stride - 5, 10.min(len))] {
                let part = part.min(len.saturating_sub(at));
                let mut kept = [0u32; PROXY_SLICES];
                let counted = count_slices(at, part, &mut kept);
                out.clear();
                proxy_slices(at, &data[at..at + part], &mut out);
                assert_eq!(counted, out.len(), "{len} bytes, {part} at {at}");
                assert_eq!(kept.iter().sum::<u32>() as usize, counted);
                assert!(kept.iter().zip(&whole).all(|(k, w)| k <= w));
            }
        }
    }

    #[test]
    fn slice_sizes_add_up_to_the_proxy_compressed_at_once() {
        let data = nibbles(BATCH_BYTES, 3);
        let sizes = slice_sizes(&data);
        assert_eq!(sizes.len(), PROXY_SLICES);
        assert!(sizes.iter().all(|&s| s > 0), "{sizes:?}");
        let mut proxy = Vec::new();
        proxy_slices(0, &data, &mut proxy);
        let at_once = Compression::Zstd(SLICE_LEVEL).compress(&proxy).len() as f64;
        let sum = f64::from(sizes.iter().sum::<u32>());
        // Each slice ends a block: a header and its own tables each.
        assert!(sum >= at_once && sum < 1.2 * at_once, "{sum} {at_once}");
        // A short batch has no slices past its end, and the same bytes give the same sizes.
        let short = slice_sizes(&data[..3 * BATCH_BYTES / PROXY_SLICES + 100]);
        assert!(short[..4].iter().all(|&s| s > 0), "{short:?}");
        assert!(short[4..].iter().all(|&s| s == 0), "{short:?}");
        assert_eq!(slice_sizes(&data), sizes);
    }

    #[test]
    fn ratio_variance_is_the_jackknife_of_the_left_out_ratios() {
        // Left-out ratios 5/3, 1 and 2: mean 14/9, squared spread 42/81; half the batches
        // sampled; (n-1)/n = 2/3; proxy total 10.
        let v = ratio_variance(&[(1.0, 1.0), (1.0, 3.0), (2.0, 2.0)], 6.0, 10.0).unwrap();
        assert!(
            (v - 0.5 * 2.0 / 3.0 * 42.0 / 81.0 * 100.0).abs() < 1e-9,
            "{v}"
        );
        let proportional = [(1.0, 2.0), (3.0, 6.0), (0.5, 1.0)];
        assert_eq!(ratio_variance(&proportional, 9.0, 10.0), Some(0.0));
        assert_eq!(
            ratio_variance(&[(1.0, 1.0), (1.0, 3.0)], 2.0, 10.0),
            Some(0.0)
        );
        assert_eq!(ratio_variance(&[(1.0, 1.0)], 9.0, 10.0), None);
        assert_eq!(ratio_variance(&[(1.0, 1.0), (0.0, 3.0)], 9.0, 10.0), None);
    }

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Compressible (one of 16 byte values each) and never repeating: zstd halves it and no
    /// chunk of it is a duplicate.
    fn nibbles(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 60) as u8
            })
            .collect()
    }

    fn opts() -> RunnerOptions {
        RunnerOptions {
            on_top: Compression::Zstd(3),
            compress_every: 1,
            several_images: false,
            documents: false,
            window_bytes: 1 << 30,
            chunk_sample: 1,
            blake3_s_per_byte: |_| 0.0,
            features_s_per_byte: || 0.0,
            frame_hash_s_per_byte: 0.0,
            memo: Memo::default(),
        }
    }

    #[test]
    fn units_of_files_take_their_features_from_the_gear_scan() {
        let items = vec![noise(200_000, 21), noise(30_000, 22)];
        let b = test_batches(&items, 1 << 20).remove(0);
        let config = PipelineConfig::files();
        let Similarity::SuperFeatures(sf) = config.similarity else {
            panic!("files use super-features");
        };
        let gear = gear_scan(&b, ODESS_LEVEL);
        let mut enc = Encoder::new(config).unwrap();
        let pieces: Vec<&[u8]> = b.pieces.iter().map(|p| b.bytes(p)).collect();
        let mut cuts = Prepared::default();
        enc.prepare_cuts_with(&pieces, &mut cuts, |i, _, lens| {
            cdc_lens(&gear, &b.pieces[i], config.chunker, lens)
        });
        let units = cuts.units(&pieces);
        assert!(units.len() > 20);
        // Odess over the Gear hash the scan rolls (from zero at each piece), sampled at
        // `ODESS_LEVEL`: that many hash bits zero from bit 60 down.
        let table = dedupwire_engine::chunk::FastCdc::gear_table();
        let mut want = PreparedUnits::default();
        let mut unit_at = 0;
        enc.unit_prep()
            .prepare_with(units.iter().copied(), &mut want, |_, unit, out| {
                let piece = b
                    .pieces
                    .iter()
                    .find(|p| p.start <= unit_at && unit_at < p.end);
                let piece = piece.expect("units lie in pieces");
                let mut h = 0u64;
                let mut samples = Vec::new();
                for (k, &x) in b.bytes(piece).iter().enumerate() {
                    h = (h << 1).wrapping_add(table[x as usize]);
                    let at = piece.start + k;
                    if (unit_at..unit_at + unit.len()).contains(&at)
                        && (h << 3).leading_zeros() >= ODESS_LEVEL
                    {
                        samples.push(h);
                    }
                }
                unit_at += unit.len();
                sf.odess_from_samples(samples, out)
            });
        let scan = ScanFeatures {
            gear: &gear,
            data: &b.data,
            config: sf,
        };
        let with = |parts: &[&PreparedUnits]| {
            let mut p = cuts.clone();
            parts.iter().for_each(|u| p.append_units(u));
            format!("{p:?}")
        };
        let got = prepare_units(&enc.unit_prep(), &units, Some(scan));
        assert!(
            got.len() > 1 || crate::parallel::cores() == 1,
            "in parts, on their own threads"
        );
        let got = with(&got.iter().map(|(u, _)| u).collect::<Vec<_>>());
        assert_eq!(got, with(&[&want]));
        let mut engine = PreparedUnits::default();
        enc.unit_prep().prepare(units.iter().copied(), &mut engine);
        assert_ne!(got, with(&[&engine]));
    }

    #[test]
    fn similarity_of_files_charges_a_deployments_features() {
        let images = [vec![noise(1 << 20, 31)], vec![noise(1 << 20, 32)]];
        let cpu = |features_s_per_byte: fn() -> f64| {
            let opts = RunnerOptions {
                several_images: true,
                features_s_per_byte,
                ..opts()
            };
            let mut runner = SimilarityRunner::new(&opts, ALONE).unwrap();
            feed_images(&mut runner, &images);
            let m = Box::new(runner).finish();
            let line = m
                .iter()
                .find(|m| m.name == "similarity" && m.scope == "global");
            line.unwrap().cpu_seconds
        };
        // 2 MiB at a microsecond a byte: two seconds more.
        let extra = cpu(|| 1e-6) - cpu(|| 0.0);
        assert!((1.9..2.3).contains(&extra), "{extra}");
    }

    #[test]
    fn units_prepared_in_parts_encode_as_one_preparation_does() {
        let mut base = noise(300_000, 9);
        base.extend_from_within(..100_000);
        let items: Vec<&[u8]> = vec![&base[..123_457], &base[123_457..], &[]];
        let config = PipelineConfig::files();
        let mut whole = Prepared::default();
        Encoder::new(config).unwrap().prepare(&items, &mut whole);
        let mut enc = Encoder::new(config).unwrap();
        let mut parts = Prepared::default();
        enc.prepare_cuts(&items, &mut parts);
        let units = parts.units(&items);
        let done = prepare_units(&enc.unit_prep(), &units, None);
        assert!(done.len() > 1 || crate::parallel::cores() == 1);
        for (d, _) in &done {
            parts.append_units(d);
        }
        let encode = |p: &Prepared| {
            let mut out = Vec::new();
            let mut e = Encoder::new(config).unwrap();
            e.encode_prepared(&items, p, &mut out);
            (out, e.stats())
        };
        let (a, b) = (encode(&whole), encode(&parts));
        assert_eq!(a, b);
        assert!(a.1.deltas + a.1.refs > 0, "{:?}", a.1);
    }

    fn run(spec: ChunkerSpec, items: &[Vec<u8>]) -> Vec<Measured> {
        run_with(spec, items, &opts())
    }

    fn run_with(spec: ChunkerSpec, items: &[Vec<u8>], opts: &RunnerOptions) -> Vec<Measured> {
        let mut runner = ExactRunner::new(&[spec], opts, ALONE).unwrap();
        for batch in test_batches(items, 1 << 20) {
            runner.feed(&Arc::new(batch));
        }
        Box::new(runner).finish()
    }

    #[test]
    fn a_whole_item_in_one_piece_equals_one_cut_across_batches() {
        let (a, b) = (noise(700_000, 5), noise(200_000, 6));
        let filler = noise(500_000, 7);
        // The second copy of `a` spans the first batch's end (1 MiB), then the first does.
        for items in [
            vec![a.clone(), b.clone(), a.clone()],
            vec![filler.clone(), a.clone(), a.clone()],
        ] {
            let m = run(ChunkerSpec::Whole, &items);
            let unique = (items[0].len() + items[1].len()) as u64;
            assert_eq!(m[0].output_bytes, unique + 3 * REF_BYTES);
        }
    }

    #[test]
    fn a_sampled_chunk_new_in_several_images_adds_the_square_of_all_it_contributed() {
        let mut scope = ExactScope::new(1, Compression::Zstd(3), 4, &Memo::default(), false);
        for before in 0..3 {
            scope.count_new(100, before);
        }
        scope.count_new(50, 0);
        assert_eq!(scope.unique_bytes, 350);
        assert_eq!(scope.contrib_sq, 300f64.powi(2) + 50f64.powi(2));
    }

    #[test]
    fn chunk_sampling_leaves_whole_files_exact_and_samples_documents() {
        let items: Vec<Vec<u8>> = (0..6u64).map(|i| noise(40_000, i % 4 * 2 + 1)).collect();
        let sampled = RunnerOptions {
            chunk_sample: 8,
            ..opts()
        };
        let plain = run(ChunkerSpec::Whole, &items);
        let with = run_with(ChunkerSpec::Whole, &items, &sampled);
        assert_eq!(with[1].params.get("upper_bound"), None);
        assert_eq!(plain[0].output_bytes, 4 * 40_000 + 6 * REF_BYTES);
        let out = |m: &[Measured]| {
            m.iter()
                .map(|l| (l.output_bytes, l.rel_error))
                .collect::<Vec<_>>()
        };
        assert_eq!(out(&with), out(&plain));
        let cdc = ChunkerSpec::Cdc {
            min: 1024,
            avg: 4096,
            max: 16384,
        };
        let with = run_with(cdc, &items, &sampled);
        assert_eq!(with[1].params["upper_bound"], true, "{}", with[1].name);
        assert_eq!(with[0].params.get("upper_bound"), None);
        assert!(
            with[0].rel_error > 0.0,
            "chunks by content are still sampled"
        );
        let documents = RunnerOptions {
            documents: true,
            ..sampled
        };
        let docs: Vec<Vec<u8>> = (0..400u64).map(|i| noise(300, i * 2 + 1)).collect();
        let with = run_with(ChunkerSpec::Whole, &docs, &documents);
        assert!(with[0].rel_error > 0.0, "whole documents are sampled");
    }

    #[test]
    fn whole_items_larger_than_the_buffer_stream_and_still_dedup() {
        let (a, b) = (noise(3 << 20, 1), noise(3 << 20, 2));
        let text: Vec<u8> = b"a compressible line of text\n"
            .repeat(100_000)
            .into_iter()
            .collect();
        let items = [a.clone(), text.clone(), a, b, text];
        let m = run(ChunkerSpec::Whole, &items);
        let plain = &m[0];
        let zstd = &m[1];
        assert_eq!(plain.scope, "local");
        assert_eq!(plain.output_bytes, (6 << 20) + 2_800_000 + 5 * REF_BYTES);
        assert!(
            zstd.output_bytes > 6 << 20 && zstd.output_bytes < (6 << 20) + 200_000,
            "{}",
            zstd.output_bytes
        );
    }

    #[test]
    fn items_no_other_file_has_the_size_of_count_as_new_without_hashing() {
        let (a, b, c) = (noise(3 << 20, 1), noise(5000, 2), noise(7000, 3));
        let items = [a.clone(), b.clone(), a, c, b];
        let whole = |unique: &dyn Fn(usize) -> bool| {
            let mut runner = ExactRunner::new(&[ChunkerSpec::Whole], &opts(), ALONE).unwrap();
            let mut item = 0;
            for mut batch in test_batches(&items, 1 << 20) {
                for p in &mut batch.pieces {
                    p.size_unique = unique(item);
                    item += p.item_end as usize;
                }
                runner.feed(&Arc::new(batch));
            }
            Box::new(runner).finish()[0].output_bytes
        };
        let hashed = whole(&|_| false);
        assert_eq!(hashed, (3 << 20) + 5000 + 7000 + 5 * REF_BYTES);
        // Only `c` has a size of its own: skipping its hash changes nothing.
        assert_eq!(whole(&|i| i == 3), hashed);
        // The flag is trusted: equal items falsely flagged are not compared.
        assert_eq!(whole(&|i| i == 1 || i == 4), hashed + 5000);
    }

    #[test]
    fn items_new_for_their_size_stream_straight_to_the_scopes_with_the_same_outcome() {
        // Larger than the buffer and not, starting mid-batch, crossing batches: given to the
        // scopes as they come, they compress as the buffered ones did.
        let text: Vec<u8> = b"a compressible line of text\n".repeat(100_000);
        let items = [
            noise(300_000, 1),
            noise(3 << 20, 2),
            text,
            nibbles(1_500_000, 3),
            noise(900_000, 4),
        ];
        let whole = |unique: bool| {
            let mut runner = ExactRunner::new(&[ChunkerSpec::Whole], &opts(), ALONE).unwrap();
            for mut batch in test_batches(&items, 1 << 20) {
                batch.pieces.iter_mut().for_each(|p| p.size_unique = unique);
                runner.feed(&Arc::new(batch));
            }
            let m = Box::new(runner).finish();
            (m[0].output_bytes, m[1].output_bytes)
        };
        let all: usize = items.iter().map(Vec::len).sum();
        let (buffered, direct) = (whole(false), whole(true));
        assert_eq!(buffered.0, all as u64 + 5 * REF_BYTES);
        assert_eq!(direct.0, buffered.0);
        // Everything is new, so the stream is the input, one frame per input batch, as the
        // pipeline would send it (the buffered items were cut apart from their neighbours).
        let mut z = Compressor::new(Compression::Zstd(3));
        let frames: usize = test_batches(&items, 1 << 20)
            .iter()
            .map(|b| z.compress(&b.data).len())
            .sum();
        assert_eq!(direct.1, frames as u64 + 5 * REF_BYTES);
        assert!(
            buffered.1.abs_diff(direct.1) * 100 < direct.1,
            "{buffered:?} {direct:?}"
        );
    }

    #[test]
    fn sampled_compression_is_close_to_full_and_says_how_close() {
        // Batches alternate unpredictably between noise, text and zeros, as in a disk image.
        let mut data = Vec::new();
        for i in 0..96u64 {
            let kind = (i * 7 + i / 5) % 3;
            data.extend(match kind {
                0 => noise(BATCH_BYTES, i + 1),
                1 => format!("line {i} of some log text, fairly repetitive\n")
                    .into_bytes()
                    .repeat(BATCH_BYTES / 40 + 1)[..BATCH_BYTES]
                    .to_vec(),
                _ => vec![0; BATCH_BYTES],
            });
        }
        let estimate = |every| {
            let mut r = Residual::new(every, Compression::Zstd(3), &Memo::default());
            for seq in 0..(data.len() / BATCH_BYTES) as u64 {
                r.begin(seq * BATCH_BYTES as u64, seq);
            }
            for (i, piece) in data.chunks(1_000_003).enumerate() {
                r.push_at((i * 1_000_003) as u64, piece);
            }
            r.estimate()
        };
        let (full, full_err, _) = estimate(1);
        assert_eq!(full_err, 0.0);
        let (est, rel, _) = estimate(6);
        let dev = (est as f64 - full as f64).abs() / full as f64;
        assert!(rel > 0.0 && rel < 0.1, "stated error {rel}");
        assert!(dev < 3.0 * rel + 0.005, "off by {dev}, stated {rel}");
    }

    #[test]
    fn a_stream_follows_the_input_batches_across_chunks_that_span_them() {
        let data = noise(12_000, 3);
        // Input batches start at 0, 3 000 and 8 000; chunks (start, end, kept) span them.
        let chunks: [(usize, usize, bool); 3] = [
            (0, 2_500, true),
            (2_500, 3_500, true),
            (3_500, 4_000, false),
        ];
        let chunks = [&chunks[..], &[(4_000, 9_000, true), (9_000, 12_000, true)]].concat();
        let mut r = Residual::new(1, Compression::Zstd(3), &Memo::default());
        r.begin(0, 0);
        r.begin(3_000, 1);
        for &(s, e, kept) in &chunks[..2] {
            assert!(kept);
            r.push_at(s as u64, &data[s..e]);
        }
        r.settle(3_500);
        r.begin(8_000, 2);
        for &(s, e, kept) in &chunks[2..] {
            if kept {
                r.push_at(s as u64, &data[s..e]);
            }
        }
        let (out, rel, _) = r.estimate();
        let want: Vec<Vec<u8>> = vec![
            data[..3_000].to_vec(),
            [&data[3_000..3_500], &data[4_000..8_000]].concat(),
            data[8_000..].to_vec(),
        ];
        let z = |b: &[u8]| Compression::Zstd(3).compress(b).len() as u64;
        assert_eq!(out, want.iter().map(|b| z(b)).sum::<u64>());
        assert_eq!((r.filled, rel), (3, 0.0));
    }

    /// Input batches whose compressibility varies, and a method's output for each: all but
    /// its last eighth (dense, and unlike the input's batch, so no compression is shared).
    fn varied_batches(n: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let input: Vec<Vec<u8>> = (0..n)
            .map(|k| {
                let noisy = BATCH_BYTES / 8 * (k % 5);
                [
                    nibbles(BATCH_BYTES - noisy, k as u64),
                    noise(noisy, k as u64 + 1),
                ]
                .concat()
            })
            .collect();
        let kept = input
            .iter()
            .map(|b| b[..BATCH_BYTES / 8 * 7].to_vec())
            .collect();
        (input, kept)
    }

    #[test]
    fn dense_sampled_batches_lean_on_the_reference() {
        let memo = Memo::default();
        let (input, kept) = varied_batches(12);
        let mut reference = Residual::new(2, Compression::Zstd(3), &memo).publishing();
        let mut stream = Residual::new(2, Compression::Zstd(3), &memo).with_two_phase();
        for (seq, (i, k)) in input.iter().zip(&kept).enumerate() {
            reference.push_batch(i, seq as u64);
            stream.push_batch(k, seq as u64);
        }
        reference.estimate();
        drop(reference);
        let (out, rel, cpu) = stream.estimate();
        // Sampled batches 1, 3, …, 11: the first two compressed, then one in three.
        let numbers = |v: &[(u64, u64)]| v.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(numbers(&stream.pair_info), [1, 3, 7]);
        assert_eq!(
            stream.skipped.iter().map(|s| s.0).collect::<Vec<_>>(),
            [5, 9, 11]
        );
        let z = |b: &[u8]| Compression::Zstd(3).compress(b).len() as f64;
        let truth: f64 = kept.iter().map(|b| z(b)).sum();
        let dev = (out as f64 / truth - 1.0).abs();
        assert!(dev < 0.02, "{out} against {truth}: {dev}");
        assert!(rel > 0.0 && dev < 3.0 * rel, "{dev} against a stated {rel}");
        assert!(cpu > 0.0);
    }

    #[test]
    fn without_a_reference_or_sampling_every_batch_is_compressed() {
        let (_, kept) = varied_batches(12);
        let mut alone = Residual::new(2, Compression::Zstd(3), &Memo::default()).with_two_phase();
        let memo = Memo::default();
        let _reference = Residual::new(1, Compression::Zstd(3), &memo).publishing();
        let mut unsampled = Residual::new(1, Compression::Zstd(3), &memo).with_two_phase();
        for (seq, k) in kept.iter().enumerate() {
            alone.push_batch(k, seq as u64);
            unsampled.push_batch(k, seq as u64);
        }
        alone.flush();
        unsampled.flush();
        assert_eq!((alone.pair_info.len(), alone.skipped.len()), (6, 0));
        assert_eq!(
            (unsampled.pair_info.len(), unsampled.skipped.len()),
            (12, 0)
        );
    }

    #[test]
    fn a_stream_that_reaches_no_sampled_batch_samples_its_first() {
        let batches = [noise(100_000, 1), vec![7; 100_000], noise(50_000, 2)];
        let mut r = Residual::new(50, Compression::Zstd(3), &Memo::default());
        for (seq, b) in batches.iter().enumerate() {
            r.push_batch(b, 100 + seq as u64);
        }
        let (out, rel, cpu) = r.estimate();
        let truth: usize = batches
            .iter()
            .map(|b| Compression::Zstd(3).compress(b).len())
            .sum();
        assert_eq!(rel, 0.5);
        assert!(cpu > 0.0);
        let dev = (out as f64 - truth as f64).abs() / truth as f64;
        assert!(dev < 0.5, "{out} against {truth}");
    }

    #[test]
    fn a_method_that_removes_nothing_from_a_batch_shares_its_compression() {
        // Compressible, never repeating: 128 KiB chunks are unique, except one copy in the
        // third batch (not sampled) of one in the first.
        let mut data = nibbles(15 * BATCH_BYTES, 7);
        data.copy_within(..(128 << 10), 2 * BATCH_BYTES);
        let items = [data];
        let opts = RunnerOptions {
            compress_every: 3,
            ..opts()
        };
        let feed = |runners: &mut Vec<Box<dyn Runner>>| {
            for batch in test_batches(&items, BATCH_BYTES) {
                let batch = Arc::new(batch);
                runners.iter_mut().for_each(|r| r.feed(&batch));
            }
            runners
                .drain(..)
                .flat_map(|r| r.finish())
                .collect::<Vec<_>>()
        };
        let zstd = MethodSpec::Compress(Compression::Zstd(3));
        let exact = MethodSpec::Exact(ChunkerSpec::Fixed { size: 128 << 10 });
        let alone = feed(&mut runners(&[zstd], &opts).unwrap());
        let entries = opts.memo.len();
        let opts = RunnerOptions {
            memo: Memo::default(),
            ..opts
        };
        let both = feed(&mut runners(&[zstd, exact], &opts).unwrap());
        // No batch is compressed twice, and no proxy at all: the third batch, which lost a
        // chunk, is not sampled, and its proxy is made of the input's slices.
        assert_eq!(opts.memo.len(), entries);
        // Every request was of an input batch held whole, matched by its number: nothing was
        // hashed.
        assert_eq!(opts.memo.hashed(), 0);
        let (z, e) = (&both[0], &both[3]);
        assert_eq!(
            (z.output_bytes, z.rel_error),
            (alone[0].output_bytes, alone[0].rel_error)
        );
        assert_eq!(e.name, "exact-fixed-128KiB+zstd");
        let refs = 15 * 32 * REF_BYTES;
        let saved = (z.output_bytes + refs) as f64 - e.output_bytes as f64;
        assert!(saved > 40_000.0 && saved < 80_000.0, "{saved}");
        assert!(e.rel_error > 0.0 && (e.rel_error - z.rel_error).abs() < 0.01 * z.rel_error);
    }

    #[test]
    fn a_stream_of_input_bytes_takes_its_proxy_from_the_slices_it_kept() {
        let data = nibbles(BATCH_BYTES, 9);
        let memo = Memo::default();
        let stride = BATCH_BYTES / PROXY_SLICES;
        // The proxy estimate per byte of an unsampled batch that kept `keep` of the input.
        let proxy_of = |keep: &[(usize, usize)]| {
            let mut r = Residual::new(3, Compression::Zstd(3), &memo);
            r.note_input(0, &data);
            r.begin_input(0, 0, data.len() as u64);
            for &(from, to) in keep {
                r.push_at(from as u64, &data[from..to]);
            }
            r.flush();
            let raw: usize = keep.iter().map(|(from, to)| to - from).sum();
            r.proxy_sum / raw as f64
        };
        let all = proxy_of(&[(0, BATCH_BYTES)]);
        let sizes = memo.slices(0).expect("noted");
        let ratio = |from: usize| {
            let out: u32 = sizes[from..].iter().sum();
            f64::from(out) / ((PROXY_SLICES - from) * PROXY_SLICE) as f64
        };
        assert!((all - ratio(0)).abs() < 1e-12, "{all}");
        // Bytes removed between two slices leave the ratio as it is.
        let between = proxy_of(&[(0, stride / 2), (stride / 2 + 1000, BATCH_BYTES)]);
        assert!((between - all).abs() < 1e-12, "{between} {all}");
        // A slice removed whole leaves the others' ratio.
        let without_first = proxy_of(&[(stride, BATCH_BYTES)]);
        assert!((without_first - ratio(1)).abs() < 1e-12, "{without_first}");
        // Half of a slice counts half of its size.
        let half = proxy_of(&[(PROXY_SLICE / 2, BATCH_BYTES)]);
        let out = f64::from(sizes[0]) / 2.0 + f64::from(sizes[1..].iter().sum::<u32>());
        let want = out / (PROXY_SLICES * PROXY_SLICE - PROXY_SLICE / 2) as f64;
        assert!((half - want).abs() < 1e-12, "{half} {want}");
        // None of it went through the memo's compressions.
        assert_eq!((memo.len(), memo.hashed()), (0, 0));
    }

    #[test]
    fn a_frame_takes_its_literal_runs_proxy_from_the_input_and_compresses_the_rest() {
        let data = nibbles(BATCH_BYTES, 9);
        let other = noise(300_000, 4);
        let memo = Memo::default();
        // The proxy estimate of an unsampled frame: a header, then two literal runs of the
        // input batch with other bytes (a delta) between them.
        let stride = BATCH_BYTES / PROXY_SLICES;
        let (a, b) = (&data[..stride * 8], &data[stride * 12..]);
        let mut r = Residual::new(3, Compression::Zstd(3), &memo);
        r.push_frame(&[&other[..40], a, &other[40..], b], &data, 0);
        r.flush();
        let sizes = memo.slices(0).expect("noted");
        let runs: u32 = sizes[..8].iter().chain(&sizes[12..]).sum();
        let kept = ((PROXY_SLICES - 4) * PROXY_SLICE) as f64;
        let from_input = f64::from(runs) / kept * (a.len() + b.len()) as f64;
        // The other bytes' slices (as a stream of their own) are all that was compressed.
        let mut own = Vec::new();
        proxy_slices(0, &other, &mut own);
        let out = Compression::Zstd(SLICE_LEVEL).compress(&own).len() as f64;
        let from_other = out / own.len() as f64 * other.len() as f64;
        let want = from_input + from_other;
        assert!(
            (r.proxy_sum - want).abs() < 1e-6 * want,
            "{} {want}",
            r.proxy_sum
        );
        assert_eq!(memo.len(), 1, "one compression: the other bytes' slices");
        // A frame of literal runs alone compresses nothing, and one that kept too little of
        // the input's slices compresses its own, as other streams do.
        let memo = Memo::default();
        let mut r = Residual::new(3, Compression::Zstd(3), &memo);
        r.push_frame(&[a, b], &data, 0);
        r.push_frame(&[&other[..1000], &data[100..200]], &data, 2);
        r.flush();
        assert_eq!(memo.len(), 1, "the second frame's own proxy");
        assert!(r.proxy_sum > 0.0);
        // Other bytes that lie just before the input in memory are not literal runs.
        let joined = [&other[..], &data[..]].concat();
        let (before, input) = joined.split_at(other.len());
        let memo = Memo::default();
        let mut r = Residual::new(3, Compression::Zstd(3), &memo);
        r.push_frame(&[before, input], input, 0);
        r.flush();
        let mut alone = Residual::new(3, Compression::Zstd(3), &memo);
        alone.push_frame(&[&other[..], &data[..]], &data, 0);
        alone.flush();
        assert!((r.proxy_sum - alone.proxy_sum).abs() < 1e-6 * r.proxy_sum);
    }

    #[test]
    fn an_item_too_large_to_buffer_samples_the_input_batches_compression_alone_does() {
        // A short item, then one of nine batches: it starts inside the first batch and fills
        // the others, so those are the bytes compression alone compresses there.
        let big = nibbles(9 * BATCH_BYTES, 11);
        let items = [noise(100_000, 5), big];
        let run = |compress_every| {
            let opts = RunnerOptions {
                compress_every,
                ..opts()
            };
            let mut all = runners(
                &[
                    MethodSpec::Compress(Compression::Zstd(3)),
                    MethodSpec::Exact(ChunkerSpec::Whole),
                ],
                &opts,
            )
            .unwrap();
            for batch in test_batches(&items, BATCH_BYTES) {
                let batch = Arc::new(batch);
                all.iter_mut().for_each(|r| r.feed(&batch));
            }
            let m: Vec<Measured> = all.into_iter().flat_map(|r| r.finish()).collect();
            assert_eq!(m[3].name, "exact-whole+zstd");
            (m[3].output_bytes, opts.memo)
        };
        let (exact, _) = run(1);
        let (sampled, memo) = run(3);
        // Batches 1, 4 and 7 are sampled: compression alone's and the item's are the same
        // bytes there, compressed once. The short item's batch is estimated from the large
        // item's samples, which joined its stream, not compressed alone at the end.
        let mut zstd3: Vec<usize> = memo
            .entries()
            .into_iter()
            .filter(|&(m, _)| m == Compression::Zstd(3))
            .map(|(_, len)| len)
            .collect();
        zstd3.sort();
        assert_eq!(zstd3, [BATCH_BYTES; 3]);
        let dev = (sampled as f64 - exact as f64).abs() / exact as f64;
        assert!(dev < 0.01, "{sampled} against {exact}");
    }

    /// Feeds `images` (each a list of items) to `runner` in 1 MiB batches, numbered across
    /// images.
    fn feed_images(runner: &mut dyn Runner, images: &[Vec<Vec<u8>>]) {
        let mut seq = 0;
        for (i, items) in images.iter().enumerate() {
            for mut batch in test_batches(items, 1 << 20) {
                (batch.image, batch.seq) = (i, seq);
                seq += 1;
                runner.feed(&Arc::new(batch));
            }
        }
    }

    #[test]
    fn global_scope_forks_from_local_after_the_first_image() {
        let (a, b) = (noise(2 << 20, 5), noise(2 << 20, 6));
        let images = [vec![a.clone()], vec![a.clone(), b.clone()], vec![b.clone()]];
        let opts = RunnerOptions {
            several_images: true,
            ..opts()
        };
        let mut runner = ExactRunner::new(&[ChunkerSpec::cdc(4096)], &opts, ALONE).unwrap();
        feed_images(&mut runner, &images);
        let m = Box::new(runner).finish();
        let raw = |scope: &str| {
            m.iter()
                .find(|l| l.scope == scope && !l.name.ends_with("zstd"))
                .unwrap()
                .output_bytes as f64
        };
        let mib = (1 << 20) as f64;
        // Local: each image alone (2 + 4 + 2 MiB unique); global: a and b once.
        assert!(
            (raw("local") / mib - 8.0).abs() < 0.05,
            "{}",
            raw("local") / mib
        );
        assert!(
            (raw("global") / mib - 4.0).abs() < 0.05,
            "{}",
            raw("global") / mib
        );
    }

    #[test]
    fn one_image_alone_also_counts_copies_its_window_had_dropped() {
        let (a, b) = (noise(3 << 20, 13), noise(3 << 20, 14));
        let opts = RunnerOptions {
            window_bytes: 2 << 20,
            ..opts()
        };
        let mut runner = SimilarityRunner::new(&opts, ALONE).unwrap();
        feed_images(&mut runner, &[vec![a.clone(), b, a]]);
        let m = Box::new(runner).finish();
        let beyond = m[0].params["beyond_window_bytes"].as_u64().unwrap();
        assert!(beyond > 5 << 19 && beyond <= 3 << 20, "{beyond}");
    }

    /// The similarity lines of `images` (several) with a window of `window_bytes`.
    fn similarity_of(images: &[Vec<Vec<u8>>], window_bytes: u64) -> Vec<Measured> {
        let opts = RunnerOptions {
            several_images: true,
            window_bytes,
            ..opts()
        };
        let mut runner = SimilarityRunner::new(&opts, ALONE).unwrap();
        feed_images(&mut runner, images);
        Box::new(runner).finish()
    }

    #[test]
    fn the_local_similarity_scope_is_each_image_analyzed_alone() {
        // The local thread skips the first image and takes the global scope's totals there.
        let (a, b) = (noise(3 << 20, 41), noise(2 << 20, 42));
        let mut a2 = a.clone();
        a2[1 << 20] ^= 1;
        let images = [vec![a.clone(), a2], vec![b.clone(), a, b]];
        let alone = |image: &[Vec<u8>]| {
            let mut runner = SimilarityRunner::new(&opts(), ALONE).unwrap();
            feed_images(&mut runner, std::slice::from_ref(&image.to_vec()));
            Box::new(runner).finish()
        };
        let (first, second) = (alone(&images[0]), alone(&images[1]));
        let both = similarity_of(&images, 1 << 30);
        for name in ["similarity", "similarity+zstd"] {
            let line = |m: &[Measured], scope: &str| {
                let l = m.iter().find(|l| l.scope == scope && l.name == name);
                let l = l.unwrap().clone();
                (l.output_bytes, l.index_bytes)
            };
            let (one, two) = (line(&first, "local"), line(&second, "local"));
            assert_eq!(
                line(&both, "local"),
                (one.0 + two.0, one.1.max(two.1)),
                "{name}"
            );
            assert!(line(&both, "global").0 < one.0 + two.0, "{name}");
        }
    }

    #[test]
    fn similarity_counts_the_copies_of_data_its_window_had_dropped() {
        // Image 0 is a; image 1 is b then a again: with a window smaller than b, a's
        // second copy finds nothing in the global window, though it is a copy.
        let (a, b) = (noise(3 << 20, 11), noise(3 << 20, 12));
        let images = [vec![a.clone()], vec![b, a]];
        let run = |window_bytes: u64| {
            let m = similarity_of(&images, window_bytes);
            let line = |scope: &str| {
                m.iter()
                    .find(|l| l.scope == scope && l.name == "similarity")
                    .unwrap()
                    .clone()
            };
            let beyond = |scope: &str| line(scope).params["beyond_window_bytes"].as_u64();
            (
                beyond("local"),
                beyond("global"),
                line("global").output_bytes,
            )
        };
        let mib = 1u64 << 20;
        let (local, global, small_out) = run(2 * mib);
        assert_eq!(local, Some(0), "no image repeats itself");
        let global = global.unwrap();
        assert!(global > 5 * mib / 2 && global <= 3 * mib, "{global}");
        let (_, global_big, big_out) = run(1 << 30);
        assert_eq!(global_big, Some(0));
        assert!(small_out >= big_out + 5 * mib / 2, "{small_out} {big_out}");
    }

    #[test]
    fn the_output_estimated_for_smaller_windows_is_at_least_what_they_write() {
        let (a, b) = (noise(3 << 20, 21), noise(3 << 20, 22));
        let mut a2 = a.clone();
        a2[1 << 20] ^= 1;
        let images = [vec![a.clone(), b.clone()], vec![b, a2, a]];
        let run = |window_bytes: u64| similarity_of(&images, window_bytes);
        let big = run(16 << 20);
        for scope in ["local", "global"] {
            let line = big
                .iter()
                .find(|l| l.scope == scope && l.name == "similarity")
                .unwrap();
            let smaller = line.params["smaller_windows"].as_array().unwrap();
            assert_eq!(smaller.len(), 4);
            for w in smaller {
                let window = w["window_bytes"].as_u64().unwrap();
                let at_most = w["output_bytes_at_most"].as_u64().unwrap();
                let real = run(window)
                    .into_iter()
                    .find(|l| l.scope == scope && l.name == "similarity")
                    .unwrap()
                    .output_bytes;
                assert!(at_most >= real, "{scope} {window}: {at_most} < {real}");
                assert!(at_most >= line.output_bytes, "{scope} {window}");
                // At most the input as literals (15 MiB) and the frames' ops.
                assert!(
                    at_most <= (15 << 20) + (64 << 10),
                    "{scope} {window}: {at_most}"
                );
            }
        }
    }

    #[test]
    fn fixed_sizes_made_from_blocks_count_what_each_size_alone_does() {
        let a = noise(3 << 20, 8);
        let mut b = a.clone();
        b[1 << 20] ^= 1;
        // Items of odd lengths, repeated at offsets that are not multiples of the sizes.
        let items = [
            a[..700_001].to_vec(),
            a.clone(),
            b,
            a[5..].to_vec(),
            a[..5].to_vec(),
        ];
        let specs = [4096, 1024, 16384, 65536].map(|size| ChunkerSpec::Fixed { size });
        let run_with = |specs: &[ChunkerSpec]| {
            let mut runner = ExactRunner::new(specs, &opts(), ALONE).unwrap();
            assert_eq!(runner.blocks.is_some(), specs.len() > 1);
            for batch in test_batches(&items, 1_000_000) {
                runner.feed(&Arc::new(batch));
            }
            Box::new(runner).finish()
        };
        let together = run_with(&specs);
        for spec in specs {
            let alone = run_with(&[spec]);
            let name = format!("exact-{}", spec.label());
            let pick = |m: &[Measured]| {
                m.iter()
                    .filter(|l| l.name.starts_with(&name))
                    .map(|l| (l.name.clone(), l.output_bytes))
                    .collect::<Vec<_>>()
            };
            assert_eq!(pick(&together), pick(&alone), "{name}");
        }
    }

    #[test]
    fn multi_size_runner_reports_each_size_in_both_scopes() {
        let data = noise(4 << 20, 3);
        let items = [data.clone(), data];
        let mut runner = ExactRunner::new(
            &[ChunkerSpec::cdc(4096), ChunkerSpec::Fixed { size: 8192 }],
            &opts(),
            ALONE,
        )
        .unwrap();
        for batch in test_batches(&items, 1 << 20) {
            runner.feed(&Arc::new(batch));
        }
        let m = Box::new(runner).finish();
        assert_eq!(m.len(), 8);
        for line in m.iter().filter(|l| !l.name.ends_with("zstd")) {
            let ratio = (8 << 20) as f64 / line.output_bytes as f64;
            assert!(ratio > 1.95 && ratio < 2.0, "{}: {ratio}", line.name);
        }
    }
}
