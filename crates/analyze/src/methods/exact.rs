//! Exact dedup: every chunk size of one chunker from one scan, local and global scope.

use std::collections::VecDeque;
use std::sync::Arc;

use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_engine::compress::Compression;

use crate::cpu::charge;
use crate::id_set::IdSet;
use crate::input::Batch;
use crate::memo::Memo;
use crate::multi_cut::{gear_scan, Cursor, MultiCut, Scanned};
use crate::AnalyzeError;

use super::residual::Residual;
use super::whole_item::WholeItem;
use super::{short, Measured, Runner, RunnerOptions, INDEX_ENTRY_BYTES, REF_BYTES};

/// One scope of an exact method: what its chunks new to it add up to. With `sample` > 1 only
/// chunks whose id is 0 modulo `sample` are indexed: every copy of a sampled chunk is sampled
/// too (same id), so the duplicate status of each sampled chunk is exact and unique bytes
/// scale by `sample`. Which chunks are new comes from the [`SizeState`]'s index.
pub(super) struct ExactScope {
    pub(super) sample: u64,
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
    pub(super) residual: Residual,
}

impl ExactScope {
    /// A scope whose residual, unless it holds whole items (which join it as streams of
    /// their own), may lean on the reference (see [`Residual::with_two_phase`]).
    pub(super) fn new(
        every: u64,
        on_top: Compression,
        sample: u64,
        memo: &Memo,
        whole: bool,
    ) -> Self {
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
    pub(super) fn fork(&self) -> ExactScope {
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

/// One chunk size of an exact runner: its scopes and the CPU spent on it alone.
pub(super) struct SizeState {
    spec: ChunkerSpec,
    pub(super) local: ExactScope,
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
    pub(super) fn begin_input(&mut self, at: u64, seq: u64, data: &[u8]) {
        let len = data.len() as u64;
        self.local.residual.note_input(seq, data);
        self.local.residual.begin_input(at, seq, len);
        if let Some(g) = self.global.as_mut() {
            g.residual.note_input(seq, data);
            g.residual.begin_input(at, seq, len);
        }
    }

    /// Says that every chunk before stream position `at` is added (see [`Residual::settle`]).
    pub(super) fn settle(&mut self, at: u64) {
        self.local.residual.settle(at);
        if let Some(g) = self.global.as_mut() {
            g.residual.settle(at);
        }
    }

    /// Adds the chunk `id` at stream position `at` to both scopes.
    pub(super) fn add(&mut self, id: u64, at: u64, chunk: &[u8]) {
        self.add_with(id, chunk.len() as u64, |scope| {
            scope.residual.push_at(at, chunk)
        });
    }

    /// Gives bytes of an item new to both scopes (see [`WholeItem::direct`]) to their
    /// streams, at stream position `at`; the item is counted when it ends.
    pub(super) fn emit_new(&mut self, at: u64, data: &[u8]) {
        self.local.residual.push_at(at, data);
        if let Some(g) = self.global.as_mut() {
            g.residual.push_at(at, data);
        }
    }

    /// Adds an item too large to buffer, `len` bytes: its own stream, flushed (merged into a
    /// scope's stream where the item is new to it), or that stream's estimate where it reached
    /// no sampled batch.
    pub(super) fn add_streamed(
        &mut self,
        id: u64,
        len: u64,
        big: &Residual,
        alone: Option<(u64, f64, f64)>,
    ) {
        self.add_with(id, len, |scope| match alone {
            Some(est) => scope.residual.absorb(est, est.1),
            None => scope.residual.merge(big),
        });
    }

    /// Counts a chunk in both scopes and, if it is sampled, probes the index once: `emit`
    /// then gives its bytes to each scope it is new to. With sampling, one sampled chunk in
    /// [`TIMED_EVERY`] is timed, and each scope charged the probe and its own emission, to
    /// be scaled up to all chunks.
    pub(super) fn add_with(&mut self, id: u64, len: u64, mut emit: impl FnMut(&mut ExactScope)) {
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
pub(super) struct ExactRunner {
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
    pub(super) fn new(
        specs: &[ChunkerSpec],
        opts: &RunnerOptions,
        gear_level: u32,
    ) -> Result<Self, AnalyzeError> {
        let cutter = match specs {
            [ChunkerSpec::Whole] => Cutter::Whole(Box::new(WholeItem::new(
                opts.compress_every,
                opts.on_top,
                opts.memo.clone(),
            ))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::test_batches;
    use crate::methods::tests::{feed_images, noise, opts, run, run_with};
    use crate::methods::ALONE;

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
