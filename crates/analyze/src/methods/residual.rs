//! What a method keeps, compressed: the residual stream, its sampled batches and proxies.

use std::collections::VecDeque;

use dedupwire_engine::compress::{Compression, Compressor};

use crate::input::BATCH_BYTES;
use crate::memo::{Memo, SliceSizes};

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
/// [`super::whole_item::WholeItem`].)
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
pub(super) struct Residual {
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
    /// Stream position after the bytes the `push_*` methods that take whole batches added.
    written: u64,
    every: u64,
    /// Summed proxy estimates of all batches.
    proxy_sum: f64,
    /// (proxy estimate, real output) of the sampled batches.
    pub(super) pairs: Vec<(f64, f64)>,
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
    pub(super) publishes: bool,
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
pub(super) struct Bound {
    pub(super) at: u64,
    pub(super) seq: u64,
    pub(super) len: Option<u64>,
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
    pub(super) fn new(every: u64, method: Compression, memo: &Memo) -> Self {
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
    pub(super) fn publishing(mut self) -> Self {
        self.memo.expect_reference(self.compressor.method());
        self.publishes = true;
        self
    }

    /// This stream estimating two in three of its dense sampled batches from the reference,
    /// when there is one (see [`DENSE_EVERY`]).
    pub(super) fn with_two_phase(mut self) -> Self {
        self.two_phase = true;
        self
    }

    /// A copy of this stream's state (with its own compressor: no state is kept between
    /// batches).
    pub(super) fn fork(&self) -> Residual {
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
    pub(super) fn cpu(&self) -> f64 {
        self.cpu_sampled + self.cpu_proxy + self.extra.2
    }

    /// The current batch's number: its input batch's (0 before the first).
    pub(super) fn number(&self) -> u64 {
        self.seq.unwrap_or(0)
    }

    /// Whether the current batch will be compressed: the middle one of each run of `every`.
    pub(super) fn sampling(&self) -> bool {
        self.number() % self.every == self.every / 2
    }

    /// Adds `data`, at stream position `at`, to the current batch.
    pub(super) fn take(&mut self, at: u64, data: &[u8]) {
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
    pub(super) fn note_input(&mut self, seq: u64, data: &[u8]) {
        if self.every > 1 {
            let cpu = &mut self.cpu_proxy;
            self.memo.note_slices(seq, cpu, || slice_sizes(data));
        }
    }

    /// Says that input batch `seq` starts at stream position `at`: bytes before `at` belong to
    /// the batch before it.
    #[cfg(test)]
    pub(super) fn begin(&mut self, at: u64, seq: u64) {
        self.begin_bound(Bound { at, seq, len: None });
    }

    /// Says where an input batch starts, as [`Residual::begin_input`] does (or `begin`, in tests).
    pub(super) fn begin_bound(&mut self, bound: Bound) {
        self.bounds.push_back(bound);
    }

    /// Says where an input batch starts, for a stream whose bytes are the input's own, each at
    /// the input's position (what an exact method kept, or all of it), from `at` on, where
    /// input batch `seq` starts: it is `len` bytes. A batch that kept them all is the input's,
    /// and its proxy comes from the input's slices (see [`Residual::note_input`]).
    pub(super) fn begin_input(&mut self, at: u64, seq: u64, len: u64) {
        let len = Some(len);
        self.begin_bound(Bound { at, seq, len });
    }

    /// Adds the bytes at stream position `at`, splitting them where input batches start.
    /// Positions only grow; what lies between added bytes was removed by the method.
    pub(super) fn push_at(&mut self, at: u64, mut data: &[u8]) {
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
    pub(super) fn settle(&mut self, at: u64) {
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
    pub(super) fn push_input_batch(&mut self, data: &[u8], seq: u64) {
        self.note_input(seq, data);
        self.begin_input(self.written, seq, data.len() as u64);
        self.push_parts(&[data]);
    }

    /// Adds the frame that input batch `seq`, `input`, encoded to: `parts`, one after the
    /// other, those that lie in `input` its literal runs. The frame's proxy is then mostly the
    /// input's (see [`Residual::note_input`]): only its other bytes are compressed for it.
    pub(super) fn push_frame(&mut self, parts: &[&[u8]], input: &[u8], seq: u64) {
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

    pub(super) fn push_parts(&mut self, parts: &[&[u8]]) {
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
    pub(super) fn flush(&mut self) {
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
    pub(super) fn merge(&mut self, other: &Residual) {
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
    pub(super) fn absorb(&mut self, est: (u64, f64, f64), rel: f64) {
        let (bytes, cpu) = (est.0 as f64, est.2);
        self.extra.0 += bytes;
        self.extra.1 += (rel * bytes).powi(2);
        self.extra.2 += cpu;
    }

    /// Estimated compressed bytes, its relative standard error, and the CPU seconds that
    /// compressing everything would take.
    pub(super) fn estimate(&mut self) -> (u64, f64, f64) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::tests::{nibbles, noise};

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
}
