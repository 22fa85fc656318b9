//! The methods compared, each a runner fed every batch once.
//!
//! A runner measures its own scopes: **local** (each image deduplicated alone, its index
//! dropped between images) and **global** (all images pooled). Exact dedup counts duplicates
//! with xxh3-64 ids (an estimate needs no cryptographic identity, and a false duplicate among
//! a billion chunks has odds of 1 in 37; a fixed chunk larger than the smallest fixed size
//! takes as id the xxh3-64 of its blocks' ids, so every byte is hashed once) and adds the
//! measured cost of BLAKE3 at that chunk size, so its reported speed is what a real deployment
//! pays. Compressed streams share a memo of compressed sizes (`memo.rs`).
//!
//! Each family has its module: `compress_only` (the baseline), `exact` (fixed and
//! content-defined chunks, every size from one scan), `whole_item` (one id per item),
//! `similarity` (features, the pipeline encoder, one thread per scope), and `residual`, the
//! compressed stream of what a method keeps that all of them share. This module parses the
//! method list and starts the runners.

mod compress_only;
mod exact;
mod residual;
mod similarity;
mod whole_item;

use std::fmt;
use std::sync::Arc;

use dedupwire_engine::chunk::{size_label, ChunkerSpec};
use dedupwire_engine::compress::Compression;
use serde::Serialize;

use crate::input::Batch;
use crate::memo::Memo;
use crate::multi_cut::{cdc_level, ODESS_LEVEL};
use crate::AnalyzeError;

use compress_only::CompressRunner;
use exact::ExactRunner;
use similarity::SimilarityRunner;

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

/// The name a method line gives its compression on top (`exact-cdc-4KiB+zstd`).
fn short(c: Compression) -> &'static str {
    match c {
        Compression::None => "none",
        Compression::Zstd(_) => "zstd",
        Compression::Lz4 => "lz4",
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::input::{test_batches, BATCH_BYTES};

    pub(super) fn noise(n: usize, seed: u64) -> Vec<u8> {
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
    pub(super) fn nibbles(n: usize, seed: u64) -> Vec<u8> {
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

    pub(super) fn opts() -> RunnerOptions {
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

    pub(super) fn run(spec: ChunkerSpec, items: &[Vec<u8>]) -> Vec<Measured> {
        run_with(spec, items, &opts())
    }

    pub(super) fn run_with(
        spec: ChunkerSpec,
        items: &[Vec<u8>],
        opts: &RunnerOptions,
    ) -> Vec<Measured> {
        let mut runner = ExactRunner::new(&[spec], opts, ALONE).unwrap();
        for batch in test_batches(items, 1 << 20) {
            runner.feed(&Arc::new(batch));
        }
        Box::new(runner).finish()
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

    /// Feeds `images` (each a list of items) to `runner` in 1 MiB batches, numbered across
    /// images.
    pub(super) fn feed_images(runner: &mut dyn Runner, images: &[Vec<Vec<u8>>]) {
        let mut seq = 0;
        for (i, items) in images.iter().enumerate() {
            for mut batch in test_batches(items, 1 << 20) {
                (batch.image, batch.seq) = (i, seq);
                seq += 1;
                runner.feed(&Arc::new(batch));
            }
        }
    }
}
