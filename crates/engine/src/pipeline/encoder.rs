//! The pipeline encoder.

use serde::Serialize;
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

use super::format::*;
use super::smaller_windows::SmallerWindows;
use super::window::{SharedBytes, Unit, UnitStore, Window};
use super::{PipelineConfig, Similarity};
use crate::chunk::{chunks, Chunker};
use crate::compress::{Compression, Compressor};
use crate::delta::{DeltaCodec, DeltaSpec};
use crate::exact_index::ExactIndex;
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::similarity::{select_source, CandidateIndex};
use crate::varint;
use crate::Result;

/// What the encoder did, unit by unit and byte by byte.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EncodeStats {
    /// Items encoded.
    pub items: u64,
    /// Bytes of all items.
    pub input_bytes: u64,
    /// Units the items were cut into.
    pub units: u64,
    /// Units sent as references to identical earlier units.
    pub refs: u64,
    /// Bytes covered by references.
    pub ref_bytes: u64,
    /// Units sent as deltas.
    pub deltas: u64,
    /// Bytes of the units sent as deltas.
    pub delta_input_bytes: u64,
    /// Bytes of the deltas themselves (before frame compression).
    pub delta_bytes: u64,
    /// Units sent as literals.
    pub literals: u64,
    /// Bytes of literal units.
    pub literal_bytes: u64,
    /// Frames written.
    pub frames: u64,
    /// Bytes of frame bodies before compression.
    pub raw_bytes: u64,
    /// Bytes written, header included.
    pub output_bytes: u64,
}

/// Turns batches of items into frames of a self-contained stream.
pub struct Encoder {
    config: PipelineConfig,
    chunker: Box<dyn Chunker>,
    delta: Box<dyn DeltaCodec>,
    fingerprinter: Fingerprinter,
    window: Window,
    exact: ExactIndex<Fingerprint, u64>,
    candidates: CandidateIndex<u64>,
    stats: EncodeStats,
    /// Followed only when asked for ([`Encoder::with_smaller_windows`]).
    smaller: Option<SmallerWindows>,
    compressor: Compressor,
    ops: Vec<u8>,
    payload: Vec<u8>,
    /// While encoding for [`Encoder::encode_prepared_parts`]: literal units stay in the items
    /// and the payload is the list of these pieces, in order.
    gather: bool,
    pieces: Vec<Piece>,
    /// Bytes of literal units left in the items while gathering.
    gathered: usize,
    body: Vec<u8>,
    scratch: Vec<u8>,
    prepared: Prepared,
    /// Whether frames carry their content's xxh3 (see [`Encoder::without_content_hash`]).
    content_hash: bool,
    /// Where the window's units are kept when other encoders share them.
    store: Option<Arc<UnitStore>>,
}

/// A run of the payload when literal units are not copied: bytes of an item, or of `payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Item {
        item: usize,
        start: usize,
        end: usize,
    },
    Own {
        start: usize,
        end: usize,
    },
}

impl Piece {
    /// Joins `next` onto `self` when it continues the same bytes.
    fn extend(&mut self, next: Piece) -> bool {
        match (self, next) {
            (
                Piece::Item { item, end, .. },
                Piece::Item {
                    item: i,
                    start,
                    end: e,
                },
            ) if *item == i && *end == start => {
                *end = e;
                true
            }
            (Piece::Own { end, .. }, Piece::Own { start, end: e }) if *end == start => {
                *end = e;
                true
            }
            _ => false,
        }
    }
}

/// Cuts, fingerprints and similarity features of a batch of items: see [`Encoder::prepare`].
#[derive(Debug, Default, Clone)]
pub struct Prepared {
    counts: Vec<u32>,
    lens: Vec<u32>,
    fps: Vec<Fingerprint>,
    /// End offsets in `feats` of each unit's features (when `with_features`).
    offs: Vec<u32>,
    feats: Vec<u64>,
    with_features: bool,
    /// xxh3 of the items one after the other: the frame's content hash.
    content: u64,
}

impl Prepared {
    fn clear(&mut self) {
        self.counts.clear();
        self.lens.clear();
        self.fps.clear();
        self.offs.clear();
        self.feats.clear();
        self.with_features = false;
        self.content = 0;
    }

    fn features(&self, unit: usize) -> Option<&[u64]> {
        if !self.with_features {
            return None;
        }
        let start = if unit == 0 { 0 } else { self.offs[unit - 1] } as usize;
        Some(&self.feats[start..self.offs[unit] as usize])
    }

    /// The units these cuts make of `items`, in order.
    pub fn units<'a>(&self, items: &[&'a [u8]]) -> Vec<&'a [u8]> {
        let mut out = Vec::with_capacity(self.lens.len());
        let mut lens = self.lens.iter();
        for (item, &count) in items.iter().zip(&self.counts) {
            let mut at = 0;
            for &len in lens.by_ref().take(count as usize) {
                out.push(&item[at..at + len as usize]);
                at += len as usize;
            }
        }
        out
    }

    /// Each unit's fingerprint and length, in order, for the units whose fingerprints are here.
    pub fn unit_fingerprints(&self) -> impl Iterator<Item = (&Fingerprint, u32)> + '_ {
        self.fps.iter().zip(self.lens.iter().copied())
    }

    /// Appends the fingerprints and features of the units that follow those already here.
    pub fn append_units(&mut self, units: &PreparedUnits) {
        let base = self.feats.len() as u32;
        self.fps.extend_from_slice(&units.fps);
        self.offs.extend(units.offs.iter().map(|&o| base + o));
        self.feats.extend_from_slice(&units.feats);
        self.with_features = true;
    }

    /// Whether these cuts add up to `items`.
    fn describes(&self, items: &[&[u8]]) -> bool {
        if self.counts.len() != items.len() {
            return false;
        }
        let mut u = 0;
        for (item, &count) in items.iter().zip(&self.counts) {
            let end = u + count as usize;
            let Some(lens) = self.lens.get(u..end) else {
                return false;
            };
            if lens.iter().map(|&l| l as u64).sum::<u64>() != item.len() as u64 {
                return false;
            }
            u = end;
        }
        u == self.lens.len() && self.fps.len() == u && (!self.with_features || self.offs.len() == u)
    }
}

/// Fingerprints and similarity features of units, computed apart from any encoder (see
/// [`Encoder::unit_prep`]): an analysis shares a batch's units between threads.
#[derive(Clone)]
pub struct UnitPrep {
    fingerprinter: Fingerprinter,
    similarity: Similarity,
}

impl UnitPrep {
    /// Appends the fingerprint and features of each of `units` to `out`.
    pub fn prepare<'a>(&self, units: impl IntoIterator<Item = &'a [u8]>, out: &mut PreparedUnits) {
        self.prepare_with(units, out, |_, _, _| false);
    }

    /// [`UnitPrep::prepare`], taking each unit's features from `features` (given the unit's
    /// index among `units`, its bytes and where to put them) where it returns true: a caller
    /// that sampled the units' Gear hashes already (see
    /// [`SuperFeatureConfig::odess_from_samples`]).
    ///
    /// [`SuperFeatureConfig::odess_from_samples`]: crate::similarity::SuperFeatureConfig::odess_from_samples
    pub fn prepare_with<'a>(
        &self,
        units: impl IntoIterator<Item = &'a [u8]>,
        out: &mut PreparedUnits,
        mut features: impl FnMut(usize, &[u8], &mut Vec<u64>) -> bool,
    ) {
        let mut feats = Vec::new();
        for (k, unit) in units.into_iter().enumerate() {
            crate::fingerprint::prefetch_ahead(unit);
            out.fps.push(self.fingerprinter.fingerprint(unit));
            if features(k, unit, &mut feats) {
                out.feats.extend_from_slice(&feats);
            } else {
                out.feats
                    .extend_from_slice(&features_of(self.similarity, unit));
            }
            out.offs.push(out.feats.len() as u32);
        }
    }
}

/// What [`UnitPrep::prepare`] computed for a run of consecutive units.
#[derive(Debug, Default, Clone)]
pub struct PreparedUnits {
    fps: Vec<Fingerprint>,
    /// End offsets in `feats` of each unit's features.
    offs: Vec<u32>,
    feats: Vec<u64>,
}

/// Bytes a unit of `len` bytes encoded in `spent` bytes (ops and payload) saved against a
/// literal.
fn literal_saving(len: usize, spent: usize) -> u64 {
    (1 + varint::len(len as u64) + len).saturating_sub(spent) as u64
}

/// The cuts of `items` (from `cut`) and their content hash (the items' bytes if
/// `content_hash`, else their unit lengths) into `p`.
fn cuts_into(
    content_hash: bool,
    items: &[&[u8]],
    p: &mut Prepared,
    mut cut: impl FnMut(usize, &[u8], &mut Vec<u32>),
) {
    p.clear();
    let mut content = Xxh3::new();
    for (i, item) in items.iter().enumerate() {
        if content_hash {
            content.update(item);
        }
        let before = p.lens.len();
        cut(i, item, &mut p.lens);
        p.counts.push((p.lens.len() - before) as u32);
    }
    if !content_hash {
        // As random as the real hash, so the frames compress the same.
        p.lens.iter().for_each(|l| content.update(&l.to_le_bytes()));
    }
    p.content = content.digest();
}

/// The similarity features of `unit` under `similarity`.
fn features_of(similarity: Similarity, unit: &[u8]) -> Vec<u64> {
    match similarity {
        Similarity::None => Vec::new(),
        Similarity::Sketch(c) => c.sketch(unit),
        Similarity::SuperFeatures(c) => c.super_features(unit),
    }
}

/// Appends a frame's header: its body's length, the length stored (compressed or not), the
/// compression and the content hash.
fn put_frame_header(
    out: &mut Vec<u8>,
    body_len: usize,
    stored_len: usize,
    method: Compression,
    content_hash: u64,
) {
    out.push(FRAME);
    varint::put(out, body_len as u64);
    varint::put(out, stored_len as u64);
    out.push(method.tag());
    out.extend_from_slice(&content_hash.to_le_bytes());
}

impl Encoder {
    /// An encoder for `config`; fails on an invalid chunker configuration.
    pub fn new(config: PipelineConfig) -> Result<Self> {
        Ok(Encoder {
            chunker: config.chunker.build()?,
            delta: config.delta.build(),
            fingerprinter: Fingerprinter::new(),
            window: Window::new(config.window_bytes),
            exact: ExactIndex::new(),
            candidates: CandidateIndex::new(config.max_per_feature),
            stats: EncodeStats::default(),
            compressor: Compressor::new(config.compression),
            ops: Vec::new(),
            smaller: None,
            payload: Vec::new(),
            gather: false,
            pieces: Vec::new(),
            gathered: 0,
            body: Vec::new(),
            scratch: Vec::new(),
            prepared: Prepared::default(),
            content_hash: true,
            store: None,
            config,
        })
    }

    /// This encoder with `fingerprinter` for its exact index ([`Fingerprinter::estimate`] in
    /// an analysis that only measures); the stream does not depend on which one it is.
    pub fn with_fingerprinter(mut self, fingerprinter: Fingerprinter) -> Self {
        self.fingerprinter = fingerprinter;
        self
    }

    /// This encoder hashing its frames' unit lengths instead of their content: for an analysis
    /// that only measures the stream (its frames are the same size and as random) and charges
    /// the content hash's cost itself. Such a stream does not decode.
    pub fn without_content_hash(mut self) -> Self {
        self.content_hash = false;
        self
    }

    /// This encoder keeping its window's units in `store`, shared with the other encoders given
    /// it, instead of in the buffers its items lie in: an analysis running several scopes
    /// over the same data holds each unit once. The stream is the same. Encoders sharing a
    /// store must share a fingerprinter: it matches units by fingerprint and length.
    pub fn with_unit_store(mut self, store: Arc<UnitStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// This encoder also following what windows a half, a quarter, an eighth and a sixteenth as
    /// large would have lost (32 bytes per window unit): for an analysis sizing a receiver's
    /// memory. The stream is the same.
    pub fn with_smaller_windows(mut self) -> Self {
        self.smaller = Some(SmallerWindows::new(self.config.window_bytes));
        self
    }

    /// Appends the stream header (magic, delta codec, window size) to `out`.
    pub fn write_header(&mut self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.push(match self.config.delta {
            DeltaSpec::Sampled => DELTA_SAMPLED,
            DeltaSpec::ZstdRef { .. } => DELTA_ZSTD_REF,
        });
        varint::put(out, self.config.window_bytes);
        self.stats.output_bytes += (out.len() - start) as u64;
    }

    /// Encodes one batch of items as one frame appended to `out`.
    pub fn encode_frame(&mut self, items: &[&[u8]], out: &mut Vec<u8>) {
        let mut prepared = std::mem::take(&mut self.prepared);
        self.prepare_into(items, false, &mut prepared);
        self.encode_prepared(items, &prepared, out);
        self.prepared = prepared;
    }

    /// The content-only work of encoding `items` (cuts, fingerprints, similarity features),
    /// for [`Encoder::encode_prepared`] on this or any encoder with the same configuration:
    /// several encoders fed the same items (an analysis comparing scopes) then do it once.
    pub fn prepare(&mut self, items: &[&[u8]], prepared: &mut Prepared) {
        self.prepare_into(items, true, prepared);
    }

    /// The serial part of [`Encoder::prepare`]: the cuts and the content hash. Complete it with
    /// [`UnitPrep::prepare`] over [`Prepared::units`] (in parts, on any threads) and
    /// [`Prepared::append_units`] in order.
    pub fn prepare_cuts(&mut self, items: &[&[u8]], p: &mut Prepared) {
        let chunker = self.chunker.as_ref();
        cuts_into(self.content_hash, items, p, |_, item, lens| {
            lens.extend(chunks(chunker, item).map(|u| u.len() as u32))
        });
    }

    /// [`Encoder::prepare_cuts`] with cuts the caller chose: `cut(i, item, lens)` appends the
    /// lengths of item `i`'s units, which add up to the item. An analysis that found cut
    /// candidates for other chunkers replays them here instead of scanning the bytes again;
    /// the stream decodes the same whatever the cuts. Cuts that do not add up to the items
    /// are not trusted: encoding them cuts the items with its own chunker.
    pub fn prepare_cuts_with(
        &mut self,
        items: &[&[u8]],
        p: &mut Prepared,
        cut: impl FnMut(usize, &[u8], &mut Vec<u32>),
    ) {
        cuts_into(self.content_hash, items, p, cut);
    }

    /// The cuts and fingerprints of `items` without features: an encoder given them computes a
    /// unit's features only where it does not find the unit whole.
    pub fn prepare_fingerprints(&mut self, items: &[&[u8]], p: &mut Prepared) {
        self.prepare_into(items, false, p);
    }

    /// [`Encoder::prepare_fingerprints`] with the cuts of [`Encoder::prepare_cuts_with`].
    pub fn prepare_fingerprints_with(
        &mut self,
        items: &[&[u8]],
        p: &mut Prepared,
        cut: impl FnMut(usize, &[u8], &mut Vec<u32>),
    ) {
        self.prepare_cuts_with(items, p, cut);
        self.fingerprint_units(items, p);
    }

    /// The per-unit part of [`Encoder::prepare`], which needs no encoder state.
    pub fn unit_prep(&self) -> UnitPrep {
        UnitPrep {
            fingerprinter: self.fingerprinter.clone(),
            similarity: self.config.similarity,
        }
    }

    fn prepare_into(&mut self, items: &[&[u8]], features: bool, p: &mut Prepared) {
        self.prepare_cuts(items, p);
        if features {
            let mut done = PreparedUnits::default();
            self.unit_prep().prepare(p.units(items), &mut done);
            p.append_units(&done);
        } else {
            self.fingerprint_units(items, p);
        }
    }

    fn fingerprint_units(&self, items: &[&[u8]], p: &mut Prepared) {
        let fp = &self.fingerprinter;
        let units = p.units(items);
        p.fps.extend(units.iter().map(|u| fp.fingerprint(u)));
    }

    /// Encodes `items` as one frame appended to `out`, with the work of [`Encoder::prepare`]
    /// (redone here if `prepared` does not describe `items`).
    pub fn encode_prepared(&mut self, items: &[&[u8]], prepared: &Prepared, out: &mut Vec<u8>) {
        let content_hash = self.encode_in(items, prepared, None);
        self.write_frame(content_hash, out);
    }

    /// [`Encoder::encode_prepared`] for items that lie in `owner`: the window keeps them as
    /// parts of `owner` instead of copies, so encoders fed the same buffers share them. The
    /// stream is the same, except that zstd deltas may differ: zstd matches differently when
    /// the reference lies right before the target in memory.
    pub fn encode_prepared_from(
        &mut self,
        owner: &SharedBytes,
        items: &[&[u8]],
        prepared: &Prepared,
        out: &mut Vec<u8>,
    ) {
        let content_hash = self.encode_in(items, prepared, Some(owner));
        self.write_frame(content_hash, out);
    }

    /// [`Encoder::encode_prepared_from`] that hands the frame over in parts (header, ops, then
    /// the payload's runs, literal units straight from `items`) instead of copying them into
    /// one buffer, when the encoder does not compress: for an analysis that reads each frame
    /// once. `head` holds the header (or the whole frame, compressed).
    pub fn encode_prepared_parts<'a>(
        &'a mut self,
        owner: &SharedBytes,
        items: &[&'a [u8]],
        prepared: &Prepared,
        head: &'a mut Vec<u8>,
    ) -> Vec<&'a [u8]> {
        self.gather = self.config.compression == Compression::None;
        let content_hash = self.encode_in(items, prepared, Some(owner));
        head.clear();
        if !self.gather {
            self.write_frame(content_hash, head);
            return vec![head];
        }
        self.gather = false;
        let body_len = self.put_body_header(content_hash, head);
        self.stats.frames += 1;
        self.stats.raw_bytes += body_len as u64;
        self.stats.output_bytes += (head.len() + self.ops.len() + self.payload_len()) as u64;
        let mut parts: Vec<&'a [u8]> = Vec::with_capacity(2 + self.pieces.len());
        parts.push(head);
        parts.push(&self.ops);
        parts.extend(self.pieces.iter().map(|&p| match p {
            Piece::Item { item, start, end } => &items[item][start..end],
            Piece::Own { start, end } => &self.payload[start..end],
        }));
        parts
    }

    /// Bytes of the payload, gathered literal units included.
    fn payload_len(&self) -> usize {
        self.payload.len() + self.gathered
    }

    /// Appends `piece` to the gathered payload, joined onto the last piece when it continues it.
    fn push_piece(&mut self, piece: Piece) {
        if !self
            .pieces
            .last_mut()
            .is_some_and(|last| last.extend(piece))
        {
            self.pieces.push(piece);
        }
    }

    /// Encodes `items` into `ops` and `payload`; returns the frame's content hash.
    fn encode_in(
        &mut self,
        items: &[&[u8]],
        prepared: &Prepared,
        owner: Option<&SharedBytes>,
    ) -> u64 {
        if !prepared.describes(items) {
            let mut fresh = Prepared::default();
            self.prepare_into(items, false, &mut fresh);
            return self.encode_in(items, &fresh, owner);
        }
        let first_new = self.window.next_id();
        self.ops.clear();
        self.payload.clear();
        self.pieces.clear();
        self.gathered = 0;
        varint::put(&mut self.ops, items.len() as u64);
        let mut u = 0;
        for (i, (item, &count)) in items.iter().zip(&prepared.counts).enumerate() {
            varint::put(&mut self.ops, count as u64);
            let mut at = 0;
            for _ in 0..count {
                let len = prepared.lens[u] as usize;
                let unit = &item[at..at + len];
                let own = self.payload.len();
                let literal = self.encode_unit(unit, prepared.fps[u], prepared.features(u), owner);
                if self.gather {
                    if literal {
                        self.push_piece(Piece::Item {
                            item: i,
                            start: at,
                            end: at + len,
                        });
                    } else if self.payload.len() > own {
                        self.push_piece(Piece::Own {
                            start: own,
                            end: self.payload.len(),
                        });
                    }
                }
                at += len;
                u += 1;
            }
            self.stats.items += 1;
            self.stats.input_bytes += item.len() as u64;
        }
        if let Some(owner) = owner {
            self.window.own_if_sparse(first_new, owner);
        }
        prepared.content
    }

    /// Appends the header of an uncompressed frame and the body's first part (the length of
    /// `ops`) to `out`; returns the body's length.
    fn put_body_header(&self, content_hash: u64, out: &mut Vec<u8>) -> usize {
        let mut ops_len = Vec::with_capacity(10);
        varint::put(&mut ops_len, self.ops.len() as u64);
        let body_len = ops_len.len() + self.ops.len() + self.payload_len();
        put_frame_header(out, body_len, body_len, Compression::None, content_hash);
        out.extend_from_slice(&ops_len);
        body_len
    }

    /// Appends the frame of the encoded `ops` and `payload`. Uncompressed, they go straight
    /// into `out`, without first being joined into one body.
    fn write_frame(&mut self, content_hash: u64, out: &mut Vec<u8>) {
        let mut ops_len = Vec::with_capacity(10);
        varint::put(&mut ops_len, self.ops.len() as u64);
        let body_len = ops_len.len() + self.ops.len() + self.payload.len();
        let start = out.len();
        let compressed = match self.config.compression {
            Compression::None => None,
            method => {
                self.body.clear();
                self.body.extend_from_slice(&ops_len);
                self.body.extend_from_slice(&self.ops);
                self.body.extend_from_slice(&self.payload);
                let c = self.compressor.compress(&self.body);
                (c.len() < body_len).then_some((method, c))
            }
        };
        match compressed {
            Some((method, c)) => {
                put_frame_header(out, body_len, c.len(), method, content_hash);
                out.extend_from_slice(&c);
            }
            None => {
                put_frame_header(out, body_len, body_len, Compression::None, content_hash);
                out.reserve(body_len);
                out.extend_from_slice(&ops_len);
                out.extend_from_slice(&self.ops);
                out.extend_from_slice(&self.payload);
            }
        }
        self.stats.frames += 1;
        self.stats.raw_bytes += body_len as u64;
        self.stats.output_bytes += (out.len() - start) as u64;
    }

    /// Encodes one unit as a reference, a delta or a literal; true for a literal.
    fn encode_unit(
        &mut self,
        unit: &[u8],
        fp: Fingerprint,
        features: Option<&[u64]>,
        owner: Option<&SharedBytes>,
    ) -> bool {
        self.stats.units += 1;
        let next = self.window.next_id();
        if let Some(&id) = self.exact.get(&fp) {
            if self
                .window
                .get(id)
                .is_some_and(|held| held.len() == unit.len())
            {
                let ops = self.ops.len();
                self.ops.push(OP_REF);
                varint::put(&mut self.ops, next - id);
                if let Some(smaller) = &mut self.smaller {
                    let saved = literal_saving(unit.len(), self.ops.len() - ops);
                    smaller.referenced(id, unit.len(), saved);
                }
                self.stats.refs += 1;
                self.stats.ref_bytes += unit.len() as u64;
                return false;
            }
        }
        let computed;
        let features = match features {
            Some(f) => f,
            None => {
                computed = features_of(self.config.similarity, unit);
                &computed[..]
            }
        };
        let literal = !self.try_delta(unit, &fp, features, next);
        if literal {
            self.ops.push(OP_LITERAL);
            varint::put(&mut self.ops, unit.len() as u64);
            if self.gather {
                self.gathered += unit.len();
            } else {
                self.payload.extend_from_slice(unit);
            }
            self.stats.literals += 1;
            self.stats.literal_bytes += unit.len() as u64;
        }
        let held = match &self.store {
            Some(store) => store.hold(unit, &fp),
            None => Unit::of(unit, owner),
        };
        let id = self.window.push(held);
        if let Some(smaller) = &mut self.smaller {
            smaller.take_in(id, unit.len());
            smaller.hold_from(self.window.first_id());
        }
        self.exact.insert(fp, id);
        if !features.is_empty() {
            self.candidates.insert(id, features);
        }
        literal
    }

    /// Emits a delta op when a held similar unit gives a delta smaller than the unit.
    fn try_delta(&mut self, unit: &[u8], fp: &Fingerprint, features: &[u64], next: u64) -> bool {
        if features.is_empty() {
            return false;
        }
        let mut found = self.candidates.lookup(features);
        found.retain(|c| self.window.get(c.id).is_some());
        let cache_from = next.saturating_sub(self.config.cache_units);
        let Some(id) = select_source(&found, |&id| id >= cache_from) else {
            return false;
        };
        let source = self.window.get(id).expect("filtered to held units");
        self.scratch.clear();
        let codec = self.config.delta;
        match self.store.as_deref().map(UnitStore::deltas) {
            Some(shared) if shared.take(source, fp, codec, &mut self.scratch) => {}
            Some(shared) => {
                self.delta.encode(source, unit, &mut self.scratch);
                shared.offer(source, fp, codec, &self.scratch);
            }
            None => self.delta.encode(source, unit, &mut self.scratch),
        }
        if self.scratch.len() >= unit.len() {
            return false;
        }
        let ops = self.ops.len();
        self.ops.push(OP_DELTA);
        varint::put(&mut self.ops, next - id);
        varint::put(&mut self.ops, self.scratch.len() as u64);
        varint::put(&mut self.ops, unit.len() as u64);
        self.payload.extend_from_slice(&self.scratch);
        if let Some(smaller) = &mut self.smaller {
            let saved = literal_saving(unit.len(), self.ops.len() - ops + self.scratch.len());
            smaller.delta(id, saved);
        }
        self.stats.deltas += 1;
        self.stats.delta_input_bytes += unit.len() as u64;
        self.stats.delta_bytes += self.scratch.len() as u64;
        true
    }

    /// What the encoder has done so far.
    pub fn stats(&self) -> EncodeStats {
        self.stats
    }

    /// What windows a half … a sixteenth as large would have lost (see [`SmallerWindows`]),
    /// if followed.
    pub fn smaller_windows(&self) -> Option<&SmallerWindows> {
        self.smaller.as_ref()
    }

    /// Bytes of RAM held: the window, the exact index and the candidate index.
    pub fn memory_bytes(&self) -> u64 {
        self.window.bytes() + (self.exact.memory_bytes() + self.candidates.memory_bytes()) as u64
    }

    /// Bytes of RAM held by the indexes alone (what a deployment with an external store pays).
    pub fn index_bytes(&self) -> u64 {
        (self.exact.memory_bytes() + self.candidates.memory_bytes()) as u64
    }
}
