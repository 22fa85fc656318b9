//! Similarity + delta through the real pipeline encoder, one thread per scope.

use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use dedupwire_engine::chunk::{size_label, ChunkerSpec};
use dedupwire_engine::compress::Compression;
use dedupwire_engine::fingerprint::Fingerprinter;
use dedupwire_engine::pipeline::{
    Encoder, PipelineConfig, Prepared, PreparedUnits, SharedBytes, Similarity, UnitPrep, UnitStore,
    SMALLER,
};
use dedupwire_engine::similarity::SuperFeatureConfig;

use crate::cpu::charge;
use crate::id_set::IdSet;
use crate::input::{Batch, ItemKind};
use crate::memo::Memo;
use crate::multi_cut::{cdc_lens, cdc_level, gear_scan, GearScan, ODESS_LEVEL};
use crate::AnalyzeError;

use super::residual::Residual;
use super::{short, Measured, Runner, RunnerOptions, QUEUE_BATCHES};

/// sDedup sketches for documents, Neptune super-features for files, through the real pipeline.
pub(super) struct SimilarityRunner {
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
    /// The level the batches' Gear scans are asked for (see [`super::exact::ExactRunner`]'s).
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
    pub(super) fn start(per_image: bool, opts: &RunnerOptions, store: &Arc<UnitStore>) -> Self {
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

    pub(super) fn send(&self, job: SimJob) {
        self.tx
            .send(job)
            .expect("a similarity scope thread runs until its sender is dropped");
    }

    pub(super) fn join(self) -> ScopeResult {
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
    pub(super) fn new(
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
    pub(super) fn feed(
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
    pub(super) fn add(self, o: SimTotals, index: fn(u64, u64) -> u64) -> SimTotals {
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
    pub(super) fn of(&self, unit: &[u8], out: &mut Vec<u64>) -> bool {
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
    pub(super) fn new(opts: &RunnerOptions, gear_level: u32) -> Result<Self, AnalyzeError> {
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
    pub(super) fn files_chunker() -> ChunkerSpec {
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
    use crate::methods::tests::{feed_images, noise, opts};
    use crate::methods::ALONE;

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
}
