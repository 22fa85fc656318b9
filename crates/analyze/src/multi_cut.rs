//! Many chunkings of one stream from one pass: every CDC size from a single Gear hash, and
//! fixed sizes, cut batch by batch with chunks that may span batches.
//!
//! Running one FastCDC chunker per size rolls the Gear hash over every byte once per size.
//! Here the hash is rolled once per item and every position is given a **level**: how many of
//! the hash bits 60, 59, 58, … are zero. Masks are nested (the mask of `b` bits is the top `b`
//! of those), so "the `b`-bit mask matches here" is "level ≥ `b`", and positions whose level
//! reaches the loosest mask of any size are kept as candidates. Each size then replays
//! normalized chunking (FastCDC-2020, level 2) over the candidates alone: after `min`, the first
//! candidate with level ≥ log2(avg) + 2 before `avg`, else ≥ log2(avg) − 2 up to `max`.
//!
//! The cuts follow the same rule and statistics as the engine's chunker but not the same
//! positions (the engine spreads its mask bits and restarts its hash at each chunk's `min`):
//! analysis measures how well a chunk size deduplicates, which does not depend on that.
//!
//! The candidates are found once per batch for every runner ([`gear_scan`]): the similarity
//! method cuts its 8 KiB units of files from them too ([`cdc_lens`]), by the same rule,
//! where it used to roll the engine's chunker over every byte again (7% of the analysis'
//! CPU on disk images), and takes their Odess features from its hashes at the candidates of
//! [`ODESS_LEVEL`], where the engine rolled its own Gear hash over every byte once more (12%).
//!
//! Chunk ids of the larger CDC sizes are made from **segment** ids, so each byte is hashed
//! about once rather than once per size: segments end at item ends and at candidates of level
//! at least [`SEG_LEVEL`] (about 1 KiB apart) with no other such candidate in the [`MIN_GAP`]
//! bytes before them (so a repetitive run whose every few bytes are candidates makes one long
//! segment, not many tiny ones), and each is hashed once. A chunk's id is xxh3 of: the hash of
//! its bytes up to its first segment end at least [`HEAD`] bytes in, the ids of the whole
//! segments after that, and the hash of what is left. Past `HEAD` bytes whether a position ends
//! a segment depends only on the chunk's own bytes, so the id is a function of the chunk's
//! content: equal chunks get equal ids wherever they lie.

use std::borrow::Cow;

use dedupwire_engine::chunk::{ChunkerSpec, FastCdc};
use dedupwire_engine::fingerprint::prefetch_ahead;

use crate::cpu::charge;
use crate::input::{Batch, Piece};

/// How one size cuts.
#[derive(Debug, Clone, Copy)]
enum Cut {
    Fixed(u64),
    Cdc {
        min: u64,
        avg: u64,
        max: u64,
        bits_s: u32,
        bits_l: u32,
    },
}

impl Cut {
    /// How `spec` cuts; `None` for whole items.
    fn of(spec: ChunkerSpec) -> Option<Cut> {
        match spec {
            ChunkerSpec::Fixed { size } if size > 0 => Some(Cut::Fixed(size as u64)),
            ChunkerSpec::Cdc { min, avg, max } => {
                let bits = avg.trailing_zeros();
                Some(Cut::Cdc {
                    min: min as u64,
                    avg: avg as u64,
                    max: max as u64,
                    bits_s: bits + 2,
                    bits_l: bits.saturating_sub(2).max(1),
                })
            }
            _ => None,
        }
    }
}

/// The lowest level a size by content cuts at (its mask past the average), if `spec` is one:
/// the [`gear_scan`] level it needs.
pub fn cdc_level(spec: ChunkerSpec) -> Option<u32> {
    match Cut::of(spec)? {
        Cut::Cdc { bits_l, .. } => Some(bits_l),
        Cut::Fixed(_) => None,
    }
}

/// Highest hash bit of the nested masks (the engine's masks stay below bit 61 too).
const TOP_BIT: u32 = 60;

/// Segments end at candidates of at least this level (or the loosest CDC mask's, if higher).
const SEG_LEVEL: u32 = 10;

/// Bytes a segment-ending candidate is clear of other candidates of its level before it.
const MIN_GAP: u64 = 64;

/// Bytes into a chunk before its first segment end counts: a candidate's level depends on the
/// 61 bytes before it, so whether one ends a segment depends on the `MIN_GAP + 61` bytes
/// before it, which past this lie inside the chunk.
const HEAD: u64 = 2 * MIN_GAP;

/// Bytes after which the Gear hash no longer depends on where it started: it shifts one bit
/// per byte.
const WARM_UP: usize = 64;

/// The level of a Gear hash: zero bits from bit [`TOP_BIT`] down.
#[inline(always)]
fn level(h: u64) -> u32 {
    (h << (63 - TOP_BIT)).leading_zeros()
}

/// The Gear level at which similarity samples the Odess features of its units of files: one
/// position in 256, the level the smallest size by content (1 KiB) scans at anyway. Its units
/// are cut from the batch's [`GearScan`], whose hashes at these candidates give their features
/// without rolling over the bytes again. (At Odess' one in 128 the scan recorded twice the
/// candidates, for similarity lines within 0.1% of these on the Debian images and trees.)
pub const ODESS_LEVEL: u32 = 8;

/// A batch's Gear candidates, found once for every runner that cuts by content.
#[derive(Debug, Clone, Default)]
pub struct GearScan {
    /// Every position of at least this level is a candidate.
    level: u32,
    /// Candidate cuts `end << 8 | level`, `end` an offset in the batch (exclusive), sorted,
    /// and the Gear hash there. The hash starts from zero at each piece.
    cands: Hashed,
    /// CPU seconds the scan took: each runner using it is charged them, as if alone.
    pub cpu: f64,
}

impl GearScan {
    fn of(batch: &Batch, level: u32) -> GearScan {
        let (mut cands, mut lane2, mut cpu) = (Hashed::default(), Hashed::default(), 0.0);
        charge(&mut cpu, || {
            for piece in &batch.pieces {
                let at = piece.start as u64;
                scan_gear(batch.bytes(piece), 0, at, level, &mut cands, &mut lane2);
            }
        });
        GearScan { level, cands, cpu }
    }

    /// The indexes of the candidates ending in `(from, to]` (batch offsets).
    fn range(&self, from: usize, to: usize) -> std::ops::Range<usize> {
        let cands = &self.cands.cands;
        let (from, to) = ((from as u64) << 8 | 0xff, (to as u64) << 8 | 0xff);
        let a = cands.partition_point(|&c| c <= from);
        a..a + cands[a..].partition_point(|&c| c <= to)
    }

    /// The candidates ending in `(from, to]` (batch offsets).
    fn within(&self, from: usize, to: usize) -> &[u64] {
        &self.cands.cands[self.range(from, to)]
    }

    /// The Gear hashes at the positions of `level` or more in batch offsets `from..to`: the
    /// Odess samples of the unit there (see [`ODESS_LEVEL`]).
    pub fn samples(&self, from: usize, to: usize, level: u32) -> impl Iterator<Item = u64> + '_ {
        assert!(self.level <= level, "the Gear scan misses samples");
        let r = self.range(from, to);
        self.cands.cands[r.clone()]
            .iter()
            .zip(&self.cands.hashes[r])
            .filter(move |&(&c, _)| (c & 0xff) as u32 >= level)
            .map(|(_, &h)| h)
    }
}

/// Where a Gear scan records its candidates, `end << 8 | level`.
trait Sink {
    fn record(&mut self, cand: u64, hash: u64);
    /// Appends `other`'s candidates (a second lane) and empties it.
    fn take_lane(&mut self, other: &mut Self);
}

impl Sink for Vec<u64> {
    #[inline(always)]
    fn record(&mut self, cand: u64, _: u64) {
        self.push(cand);
    }

    fn take_lane(&mut self, other: &mut Self) {
        self.append(other);
    }
}

/// Candidates with the hash at each.
#[derive(Debug, Clone, Default)]
struct Hashed {
    cands: Vec<u64>,
    hashes: Vec<u64>,
}

impl Sink for Hashed {
    #[inline(always)]
    fn record(&mut self, cand: u64, hash: u64) {
        self.cands.push(cand);
        self.hashes.push(hash);
    }

    fn take_lane(&mut self, other: &mut Self) {
        self.cands.append(&mut other.cands);
        self.hashes.append(&mut other.hashes);
    }
}

/// The Gear candidates of `batch` of at least `level`. The first runner to ask scans the
/// batch and the others wait for it: exact dedup's sizes by content and similarity's chunks
/// come from one pass over the bytes instead of two. A runner asking for a lower level than
/// the first gets a scan of its own.
pub fn gear_scan(batch: &Batch, level: u32) -> Cow<'_, GearScan> {
    let scan = batch.gear.get_or_init(|| GearScan::of(batch, level));
    if scan.level <= level {
        Cow::Borrowed(scan)
    } else {
        Cow::Owned(GearScan::of(batch, level))
    }
}

/// The content-defined cuts of `piece` for `spec` (a CDC size) from the batch's `gear`
/// candidates, as unit lengths appended to `lens`: normalized chunking replayed over them as
/// [`Scanned::cut`] does, restarting at the piece (the engine's chunker cuts each piece of an
/// item alone too). Same rule and statistics as the engine's chunker, not the same positions.
pub fn cdc_lens(gear: &GearScan, piece: &Piece, spec: ChunkerSpec, lens: &mut Vec<u32>) {
    let Some(Cut::Cdc {
        min,
        avg,
        max,
        bits_s,
        bits_l,
    }) = Cut::of(spec)
    else {
        panic!("{} is not a size by content", spec.label());
    };
    assert!(gear.level <= bits_l, "the Gear scan misses candidates");
    let cands = gear.within(piece.start, piece.end);
    let (mut start, end) = (piece.start as u64, piece.end as u64);
    let mut ci = 0;
    while start < end {
        let limit = (start + max).min(end);
        let cut = cdc_end(cands, &mut ci, start, limit, (min, avg, bits_s, bits_l));
        lens.push((cut - start) as u32);
        start = cut;
    }
}

/// Where a chunk by content from `start` ends under normalized chunking: at the first of
/// `cands` (from index `*ci` on, left at it) at least `min` in whose level meets the tight
/// mask (`bits_s`) before `avg` and the loose one (`bits_l`) after, else at `limit` (its
/// `max`, or sooner where its item ends).
fn cdc_end(
    cands: &[u64],
    ci: &mut usize,
    start: u64,
    limit: u64,
    (min, avg, bits_s, bits_l): (u64, u64, u32, u32),
) -> u64 {
    *ci = skip_before(cands, *ci, start + min);
    while let Some(&c) = cands.get(*ci) {
        let (e, lv) = (c >> 8, (c & 0xff) as u32);
        if e >= limit {
            break;
        }
        if lv >= if e - start < avg { bits_s } else { bits_l } {
            return e;
        }
        *ci += 1;
    }
    limit
}

/// Cuts a stream of batches with several chunkers at once.
pub struct MultiCut {
    cuts: Vec<Cut>,
    /// Candidates need at least this level (the loosest CDC mask); `None` without CDC sizes.
    min_level: Option<u32>,
    /// Gear hash of the current item so far.
    hash: u64,
    /// Stream position of the next byte to scan.
    scanned: u64,
    /// Stream position where the current batch starts.
    batch_base: u64,
    /// Bytes before `batch_base` that a pending chunk still needs, from `carry_base` on.
    carry: Vec<u8>,
    carry_base: u64,
    /// Candidate cut positions (ends, exclusive) with their level, `end << 8 | level`, sorted.
    cands: Vec<u64>,
    /// Item ends (exclusive stream positions), sorted: forced cuts.
    ends: Vec<u64>,
    /// Per size: where its pending chunk starts, and its scratch.
    cursors: Vec<Cursor>,
    /// The level segments end at, when some size takes its ids from them.
    seg_level: Option<u32>,
    /// Per size: whether its ids are made from segments.
    from_segs: Vec<bool>,
    /// Segments (end, xxh3 of their bytes), sorted; each starts where the one before ends.
    segs: Vec<(u64, u64)>,
    /// Stream position where the open segment starts.
    seg_from: u64,
    /// The last candidate of the segments' level, ending a segment or not.
    seg_cand: Option<u64>,
    /// The open segment's bytes from batches before the current one, hashed as they came:
    /// a segment may be as long as an item (a run with no candidates), so it is never kept.
    seg_open: crate::hash::Xxh3,
    /// The largest chunk of a size with segments: no chunk holds a longer segment whole, so
    /// longer ones are not hashed at all.
    seg_max: u64,
}

impl MultiCut {
    /// A cutter for `specs` (fixed and CDC; whole-item chunking is not supported here).
    pub fn new(specs: &[ChunkerSpec]) -> Result<MultiCut, String> {
        let cuts = specs
            .iter()
            .map(|&s| {
                if let ChunkerSpec::Cdc { min, avg, max } = s {
                    FastCdc::new(min, avg, max).map_err(|e| e.to_string())?;
                }
                Cut::of(s).ok_or_else(|| format!("{} cannot be cut by MultiCut", s.label()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let min_level = cuts
            .iter()
            .filter_map(|c| match c {
                Cut::Cdc { bits_l, .. } => Some(*bits_l),
                Cut::Fixed(_) => None,
            })
            .min();
        let seg_level = min_level.map(|l| l.max(SEG_LEVEL));
        let from_segs: Vec<bool> = cuts
            .iter()
            .map(|c| match (c, seg_level) {
                (Cut::Cdc { avg, .. }, Some(l)) => *avg >= 1 << (l + 2),
                _ => false,
            })
            .collect();
        let seg_max = cuts
            .iter()
            .zip(&from_segs)
            .filter(|&(_, &f)| f)
            .map(|(c, _)| match c {
                Cut::Cdc { max, .. } => *max,
                Cut::Fixed(size) => *size,
            })
            .max()
            .unwrap_or(0);
        Ok(MultiCut {
            cursors: vec![Cursor::default(); cuts.len()],
            seg_level: seg_level.filter(|_| from_segs.contains(&true)),
            from_segs,
            segs: Vec::new(),
            seg_from: 0,
            seg_cand: None,
            seg_open: crate::hash::Xxh3::default(),
            seg_max,
            cuts,
            min_level,
            hash: 0,
            scanned: 0,
            batch_base: 0,
            carry: Vec::new(),
            carry_base: 0,
            cands: Vec::new(),
            ends: Vec::new(),
        })
    }

    /// The level candidates need (the loosest mask of its sizes by content), if it has any.
    pub fn min_level(&self) -> Option<u32> {
        self.min_level
    }

    /// Scans the next batch: records its candidate cuts and item ends. Cut every size
    /// ([`MultiCut::split`], then [`Scanned::cut`]) and call [`end_batch`] before the next one.
    ///
    /// [`end_batch`]: MultiCut::end_batch
    ///
    /// `gear` is the batch's [`gear_scan`] at [`MultiCut::min_level`] or below, which sizes
    /// by content need: it restarts the hash at each piece, so only the first 64 bytes of a
    /// piece that continues an item are scanned again here, from the hash carried over.
    pub fn scan(&mut self, batch: &Batch, gear: Option<&GearScan>) {
        self.batch_base = self.scanned;
        let (new_cands, new_ends) = (self.cands.len(), self.ends.len());
        for (k, piece) in batch.pieces.iter().enumerate() {
            let bytes = batch.bytes(piece);
            if let Some(min_level) = self.min_level {
                let gear = gear.expect("sizes by content need the batch's Gear scan");
                assert!(gear.level <= min_level, "the Gear scan misses candidates");
                // Only the first piece may continue an item; the others start from zero.
                let carried = if k == 0 { self.hash } else { 0 };
                let head = if carried == 0 {
                    0
                } else {
                    bytes.len().min(WARM_UP)
                };
                scan_seq(
                    &bytes[..head],
                    carried,
                    self.scanned,
                    min_level,
                    &mut self.cands,
                );
                let shift = self.batch_base << 8;
                self.cands.extend(
                    gear.within(piece.start + head, piece.end)
                        .iter()
                        .filter(|&&c| (c & 0xff) as u32 >= min_level)
                        .map(|&c| c + shift),
                );
                let tail = &bytes[bytes.len().saturating_sub(WARM_UP)..];
                let from = if tail.len() < WARM_UP { carried } else { 0 };
                let gear_table = FastCdc::gear_table();
                self.hash = tail
                    .iter()
                    .fold(from, |h, &b| (h << 1).wrapping_add(gear_table[b as usize]));
            }
            self.scanned += bytes.len() as u64;
            if piece.item_end {
                self.ends.push(self.scanned);
                self.hash = 0;
            }
        }
        if let Some(level) = self.seg_level {
            self.hash_segments(&batch.data, level, new_cands, new_ends);
        }
    }

    /// Hashes the segments that end in the batch just scanned (`data`): at its candidates from
    /// index `cands` on with at least `level`, and at its item ends from index `ends` on.
    fn hash_segments(&mut self, data: &[u8], level: u32, cands: usize, ends: usize) {
        let last = &mut self.seg_cand;
        let mut points = self.cands[cands..]
            .iter()
            .filter(|&&c| (c & 0xff) as u32 >= level)
            .map(|&c| c >> 8)
            .filter(|&c| {
                let clear = last.is_none_or(|l| c - l >= MIN_GAP);
                *last = Some(c);
                clear
            })
            .peekable();
        let mut item_ends = self.ends[ends..].iter().copied().peekable();
        loop {
            let p = match (points.peek(), item_ends.peek()) {
                (Some(&c), Some(&e)) if c < e => points.next(),
                (Some(&c), Some(&e)) if c > e => item_ends.next(),
                (Some(_), Some(_)) => {
                    item_ends.next();
                    points.next()
                }
                (Some(_), None) => points.next(),
                (None, _) => item_ends.next(),
            };
            let Some(p) = p else { break };
            if p <= self.seg_from {
                continue;
            }
            let base = self.batch_base;
            let id = if p - self.seg_from > self.seg_max {
                // Never part of a chunk's id (see `seg_max`).
                self.seg_open.reset();
                0
            } else if self.seg_from >= base {
                let seg = &data[(self.seg_from - base) as usize..(p - base) as usize];
                prefetch_ahead(seg);
                crate::hash::xxh3_64(seg)
            } else {
                self.seg_open.update(&data[..(p - base) as usize]);
                let id = self.seg_open.digest();
                self.seg_open.reset();
                id
            };
            self.segs.push((p, id));
            self.seg_from = p;
        }
        if self.scanned - self.seg_from <= self.seg_max {
            let rest = self.seg_from.max(self.batch_base) - self.batch_base;
            self.seg_open.update(&data[rest as usize..]);
        }
    }

    /// Emits every chunk of size `i` that the data scanned so far decides: its stream
    /// positions (start, end) and bytes.
    #[cfg(test)]
    pub fn cut(&mut self, i: usize, data: &[u8], f: impl FnMut(u64, u64, &[u8])) {
        let (scanned, cursors) = self.split();
        scanned.cut(i, &mut cursors[i], data, f);
    }

    /// The scanned batch, which every size cuts on its own, and the sizes' cursors: sizes can
    /// then be cut in parallel.
    pub fn split(&mut self) -> (Scanned<'_>, &mut [Cursor]) {
        let scanned = Scanned {
            cuts: &self.cuts,
            from_segs: &self.from_segs,
            segs: &self.segs,
            cands: &self.cands,
            ends: &self.ends,
            carry: &self.carry,
            carry_base: self.carry_base,
            batch_base: self.batch_base,
            scanned: self.scanned,
        };
        (scanned, &mut self.cursors)
    }

    /// The stream position where the earliest pending chunk of any size starts.
    pub fn pending_start(&self) -> u64 {
        self.cursors
            .iter()
            .map(|c| c.start)
            .min()
            .unwrap_or(self.scanned)
    }

    /// Keeps what pending chunks need from `data` (the batch just cut) and forgets the rest.
    pub fn end_batch(&mut self, data: &[u8]) {
        let keep_from = self.pending_start();
        if keep_from >= self.batch_base {
            self.carry.clear();
            self.carry
                .extend_from_slice(&data[(keep_from - self.batch_base) as usize..]);
        } else {
            let drop = (keep_from - self.carry_base) as usize;
            self.carry.drain(..drop);
            self.carry.extend_from_slice(data);
        }
        self.carry_base = keep_from;
        let c = self.cands.partition_point(|&c| (c >> 8) <= keep_from);
        self.cands.drain(..c);
        let e = self.ends.partition_point(|&e| e <= keep_from);
        self.ends.drain(..e);
        // The segment ending where the pending chunks start stays: it tells them that their
        // head is one whole segment (see `Scanned::id`).
        let g = self.segs.partition_point(|&(end, _)| end < keep_from);
        self.segs.drain(..g);
    }
}

/// One size's place in the stream: where its pending chunk starts, and scratch for chunks
/// that span the carry and the batch.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    start: u64,
    joined: Vec<u8>,
}

impl Cursor {
    /// Stream position where this size's pending chunk starts: everything before is cut.
    pub fn pending_start(&self) -> u64 {
        self.start
    }

    /// Scratch for [`Scanned::bytes`].
    pub fn joined(&mut self) -> &mut Vec<u8> {
        &mut self.joined
    }
}

/// The batch [`MultiCut::scan`] scanned, with the candidates and carry every size cuts from.
pub struct Scanned<'a> {
    cuts: &'a [Cut],
    from_segs: &'a [bool],
    segs: &'a [(u64, u64)],
    cands: &'a [u64],
    ends: &'a [u64],
    carry: &'a [u8],
    carry_base: u64,
    batch_base: u64,
    scanned: u64,
}

impl Scanned<'_> {
    /// Stream position where the batch starts.
    pub fn batch_start(&self) -> u64 {
        self.batch_base
    }

    /// Emits every chunk of size `i` (whose cursor is `cursor`) that the data scanned so far
    /// decides: its stream positions (start, end) and bytes.
    pub fn cut(
        &self,
        i: usize,
        cursor: &mut Cursor,
        data: &[u8],
        mut f: impl FnMut(u64, u64, &[u8]),
    ) {
        let cut = self.cuts[i];
        let mut start = cursor.start;
        let mut ci = self.cands.partition_point(|&c| (c >> 8) <= start);
        let mut ei = self.ends.partition_point(|&e| e <= start);
        loop {
            let item_end = self.ends.get(ei).copied();
            let end = match cut {
                Cut::Fixed(size) => start + size,
                Cut::Cdc {
                    min,
                    avg,
                    max,
                    bits_s,
                    bits_l,
                } => {
                    let limit = item_end.map_or(start + max, |ie| ie.min(start + max));
                    cdc_end(
                        self.cands,
                        &mut ci,
                        start,
                        limit,
                        (min, avg, bits_s, bits_l),
                    )
                }
            };
            let end = item_end.map_or(end, |ie| end.min(ie));
            if end > self.scanned {
                break;
            }
            if end > start {
                f(start, end, self.bytes(&mut cursor.joined, data, start, end));
            }
            if item_end == Some(end) {
                ei += 1;
            }
            start = end;
            while self.cands.get(ci).is_some_and(|&c| (c >> 8) <= start) {
                ci += 1;
            }
        }
        cursor.start = start;
    }

    /// The id of the chunk `chunk` that size `i` cut from stream position `start` to `end`:
    /// xxh3 of its bytes, or for sizes with segments, made from them (see the module doc),
    /// with `buf` as scratch.
    pub fn id(&self, i: usize, (start, end): (u64, u64), chunk: &[u8], buf: &mut Vec<u8>) -> u64 {
        use crate::hash::xxh3_64;
        if !self.from_segs[i] {
            prefetch_ahead(chunk);
            return xxh3_64(chunk);
        }
        let first = self.segs.partition_point(|&(e, _)| e < start + HEAD);
        let Some(&(head_end, _)) = self.segs.get(first).filter(|&&(e, _)| e < end) else {
            return xxh3_64(chunk);
        };
        buf.clear();
        // A chunk that starts where a segment ends (most do: a chunk by content ends at a
        // candidate of the segments' level) with no other segment end in its head has that
        // one segment, already hashed, as its head.
        let head_id = match first.checked_sub(1).map(|k| self.segs[k]) {
            Some((e, _)) if e == start && self.segs[first].1 != 0 => self.segs[first].1,
            _ => xxh3_64(&chunk[..(head_end - start) as usize]),
        };
        buf.extend_from_slice(&head_id.to_le_bytes());
        let mut covered = head_end;
        for &(e, id) in self.segs[first + 1..]
            .iter()
            .take_while(|&&(e, _)| e <= end)
        {
            buf.extend_from_slice(&id.to_le_bytes());
            covered = e;
        }
        if covered < end {
            let tail = &chunk[(covered - start) as usize..];
            buf.extend_from_slice(&xxh3_64(tail).to_le_bytes());
        }
        xxh3_64(buf)
    }

    /// The bytes from stream position `start` to `end` of a chunk [`Scanned::cut`] emitted for
    /// `data`, the batch being cut (joined in `joined` if it spans the carry).
    pub fn bytes<'b>(
        &'b self,
        joined: &'b mut Vec<u8>,
        data: &'b [u8],
        start: u64,
        end: u64,
    ) -> &'b [u8] {
        let base = self.batch_base;
        if start >= base {
            &data[(start - base) as usize..(end - base) as usize]
        } else {
            joined.clear();
            joined.extend_from_slice(&self.carry[(start - self.carry_base) as usize..]);
            joined.extend_from_slice(&data[..(end.max(base) - base) as usize]);
            joined
        }
    }
}

/// The first index from `ci` on whose candidate ends at or after `target` (galloping, then a
/// binary search: large chunk sizes skip thousands of candidates, small ones one or two).
fn skip_before(cands: &[u64], mut ci: usize, target: u64) -> usize {
    let mut step = 1;
    while ci + step < cands.len() && (cands[ci + step] >> 8) < target {
        ci += step;
        step *= 2;
    }
    let hi = (ci + step).min(cands.len());
    ci + cands[ci.min(hi)..hi].partition_point(|&c| (c >> 8) < target)
}

/// Rolls the Gear hash over `bytes` (stream position `at` onward) from `hash`, recording the
/// cut after each byte whose level is at least `min_level`; returns the hash after the last.
///
/// Long inputs are scanned as two interleaved lanes (halves), so the CPU overlaps the two
/// dependency chains. The second lane starts from a zero hash 64 bytes before its half: the
/// hash shifts one bit per byte, so after 64 bytes it no longer depends on where it started,
/// and both lanes record exactly what one sequential scan would.
#[inline(never)]
fn scan_gear<S: Sink>(
    bytes: &[u8],
    hash: u64,
    at: u64,
    min_level: u32,
    out: &mut S,
    lane2: &mut S,
) -> u64 {
    if bytes.len() < 4096 {
        return scan_seq(bytes, hash, at, min_level, out);
    }
    let gear = FastCdc::gear_table();
    let test = LevelTest::new(min_level);
    let mid = (bytes.len() / 2) & !3;
    let (a, b) = bytes.split_at(mid);
    let mut hb = a[mid - WARM_UP..]
        .iter()
        .fold(0u64, |h, &x| (h << 1).wrapping_add(gear[x as usize]));
    let mut ha = hash;
    // The masks as values, not behind a reference, and the scan a function of its own (not
    // inlined into `GearScan::of`): either way the loop ran short of registers and rebuilt
    // the masks at every step (the scan's share of the analysis' CPU: 15.4% -> 13.3%).
    let (masks, limit) = (test.masks, test.limit);
    let (b_at, mut pos) = (at + mid as u64, at);
    // The loop was bound by its loads, two a byte (the byte and its table entry) on two load
    // ports. The second lane takes its four bytes out of one word instead, on the arithmetic
    // ports: `--methods cdc-4KiB` on the Debian images, user 2.10-2.23 -> 1.94-2.00 s (eight
    // interleaved cold pairs). Both lanes on words ran no faster than neither, and eight-byte
    // words ran short of registers.
    for (qa, qb) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        let wb = u32::from_le_bytes(qb.try_into().expect("four bytes"));
        ha = step4(ha, qa, pos, masks, limit, out);
        hb = step4w(hb, wb, qb, pos + mid as u64, masks, limit, lane2);
        pos += 4;
    }
    out.take_lane(lane2);
    scan_seq(&b[mid..], hb, b_at + mid as u64, min_level, out)
}

/// "Level at least `min_level`" as a test of the hash's bits: the `min_level` bits from
/// [`TOP_BIT`] down are zero. `masks[k]` is that mask shifted left by `3 - k` bits, to test
/// the partial sums of [`FastCdc::gear4_table`] (its top bit is 60, so nothing is lost).
struct LevelTest {
    /// `(h << (63 - TOP_BIT)) < limit` is the same test on a plain hash.
    limit: u64,
    masks: [u64; 4],
}

impl LevelTest {
    fn new(min_level: u32) -> LevelTest {
        let mask = ((1u64 << min_level) - 1) << (TOP_BIT + 1 - min_level);
        LevelTest {
            limit: 1u64 << (64 - min_level),
            masks: [mask << 3, mask << 2, mask << 1, mask],
        }
    }
}

/// Four Gear steps from `hash` over `q` (positions `pos`…`pos + 3`), recording candidates:
/// one addition, test and branch per byte (see [`FastCdc::gear4_table`]), `masks` and
/// `limit` those of a [`LevelTest`]; a step with a candidate is replayed byte by byte.
#[inline(always)]
fn step4<S: Sink>(hash: u64, q: &[u8], pos: u64, masks: [u64; 4], limit: u64, out: &mut S) -> u64 {
    step4_of(hash, |k| q[k], q, pos, masks, limit, out)
}

/// [`step4`] over the four bytes of `w` (little-endian), which are those of `q`, taken out of
/// the word instead of loaded one by one.
#[inline(always)]
fn step4w<S: Sink>(
    hash: u64,
    w: u32,
    q: &[u8],
    pos: u64,
    masks: [u64; 4],
    limit: u64,
    out: &mut S,
) -> u64 {
    step4_of(hash, |k| (w >> (8 * k)) as u8, q, pos, masks, limit, out)
}

/// [`step4`] with byte `k` of `q` given by `byte(k)`.
#[inline(always)]
fn step4_of<S: Sink>(
    hash: u64,
    byte: impl Fn(usize) -> u8,
    q: &[u8],
    pos: u64,
    masks: [u64; 4],
    limit: u64,
    out: &mut S,
) -> u64 {
    let (g, m) = (FastCdc::gear4_table(), masks);
    let mut x = hash << 4;
    for k in 0..4 {
        x = x.wrapping_add(g[k][byte(k) as usize]);
        if x & m[k] == 0 {
            return replay4(hash, q, pos, limit, out);
        }
    }
    x
}

/// [`step4`] one byte at a time (over four bytes, or fewer at the end), recording every
/// candidate; the hash after them.
#[cold]
#[inline(never)]
fn replay4<S: Sink>(mut hash: u64, q: &[u8], pos: u64, limit: u64, out: &mut S) -> u64 {
    let gear = FastCdc::gear_table();
    for (k, &b) in q.iter().enumerate() {
        hash = (hash << 1).wrapping_add(gear[b as usize]);
        if (hash << (63 - TOP_BIT)) < limit {
            out.record(
                (pos + k as u64 + 1) << 8 | level(hash).min(255) as u64,
                hash,
            );
        }
    }
    hash
}

/// [`scan_gear`] one byte after the other.
fn scan_seq<S: Sink>(bytes: &[u8], mut hash: u64, at: u64, min_level: u32, out: &mut S) -> u64 {
    let test = LevelTest::new(min_level);
    let mut quads = bytes.chunks_exact(4);
    let mut pos = at;
    for q in &mut quads {
        hash = step4(hash, q, pos, test.masks, test.limit, out);
        pos += 4;
    }
    replay4(hash, quads.remainder(), pos, test.limit, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::test_batches as batches;

    fn data(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32)
            .map(|i| ((i ^ seed).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    /// Scans `b` the way the exact runner does, from the batch's shared Gear scan.
    fn scan(mc: &mut MultiCut, b: &Batch) {
        let gear = mc.min_level().map(|l| gear_scan(b, l));
        mc.scan(b, gear.as_deref());
    }

    fn cut_all(specs: &[ChunkerSpec], items: &[Vec<u8>], batch: usize) -> Vec<Vec<Vec<u8>>> {
        let mut mc = MultiCut::new(specs).unwrap();
        let mut out = vec![Vec::new(); specs.len()];
        for b in batches(items, batch) {
            scan(&mut mc, &b);
            for (i, o) in out.iter_mut().enumerate() {
                mc.cut(i, &b.data, |_, _, c| o.push(c.to_vec()));
            }
            mc.end_batch(&b.data);
        }
        out
    }

    #[test]
    fn chunks_reassemble_items_and_do_not_depend_on_batching() {
        let items = vec![data(300_000, 1), Vec::new(), data(5, 2), data(1_000_000, 3)];
        let specs = [
            ChunkerSpec::cdc(1024),
            ChunkerSpec::cdc(16 << 10),
            ChunkerSpec::Fixed { size: 4096 },
        ];
        let reference = cut_all(&specs, &items, 1 << 30);
        // Batches shorter than the hash's warm-up too: items continue across many of them.
        for batch in [1000, 65_536, 333_333, 63, 64, 65, 10] {
            assert_eq!(cut_all(&specs, &items, batch), reference, "batch {batch}");
        }
        let all: Vec<u8> = items.concat();
        for (i, chunks) in reference.iter().enumerate() {
            assert_eq!(chunks.concat(), all, "size {i}");
        }
    }

    #[test]
    fn sizes_respect_bounds_and_average() {
        let items = vec![data(8 << 20, 9)];
        for avg in [1024usize, 8192, 65_536] {
            let chunks = &cut_all(&[ChunkerSpec::cdc(avg)], &items, 4 << 20)[0];
            let (last, body) = chunks.split_last().unwrap();
            assert!(last.len() <= avg * 4);
            for c in body {
                assert!(c.len() >= avg / 4 && c.len() <= avg * 4, "{}", c.len());
            }
            let mean = (8 << 20) as f64 / chunks.len() as f64;
            assert!(
                mean > avg as f64 * 0.7 && mean < avg as f64 * 1.5,
                "avg {avg}: mean {mean}"
            );
        }
    }

    #[test]
    fn cuts_are_content_defined() {
        let base = data(2 << 20, 5);
        let mut shifted = data(777, 6);
        shifted.extend_from_slice(&base);
        let a = &cut_all(&[ChunkerSpec::cdc(4096)], &[base], 1 << 20)[0];
        let b = &cut_all(&[ChunkerSpec::cdc(4096)], &[shifted], 1 << 20)[0];
        let set: std::collections::HashSet<_> = a.iter().collect();
        let shared = b.iter().filter(|c| set.contains(c)).count();
        assert!(shared * 10 > a.len() * 9, "{shared} of {}", a.len());
    }

    #[test]
    fn two_lanes_find_what_one_does() {
        let mut bytes = data(1 << 20, 11);
        bytes[300_000..400_000].fill(0);
        for (len, hash) in [(4095, 0), (4096, 7), (100_001, u64::MAX), (1 << 20, 12345)] {
            for min_level in [8, 11] {
                let (mut one, mut two, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
                let h1 = scan_seq(&bytes[..len], hash, 99, min_level, &mut one);
                let h2 = scan_gear(&bytes[..len], hash, 99, min_level, &mut two, &mut scratch);
                assert_eq!((h1, &one), (h2, &two), "len {len}");
                assert!(one.len() >= len >> (min_level + 2), "{}", one.len());
            }
        }
    }

    #[test]
    fn the_scan_records_every_position_of_high_enough_level() {
        let mut bytes = data(200_003, 5);
        bytes[50_000..60_000].fill(0);
        let gear = FastCdc::gear_table();
        for min_level in [1, 6, 8, 11, 20] {
            let (mut h, mut naive) = (3u64, Vec::new());
            for (i, &b) in bytes.iter().enumerate() {
                h = (h << 1).wrapping_add(gear[b as usize]);
                if level(h) >= min_level {
                    naive.push((7 + i as u64 + 1) << 8 | level(h).min(255) as u64);
                }
            }
            let (mut out, mut scratch) = (Vec::new(), Vec::new());
            let end = scan_gear(&bytes, 3, 7, min_level, &mut out, &mut scratch);
            assert_eq!((end, &out), (h, &naive), "min_level {min_level}");
        }
    }

    /// A chunk's id from its bytes alone, as the module doc defines it for `level`.
    fn content_id(chunk: &[u8], level: u32) -> u64 {
        use crate::hash::xxh3_64;
        let gear = FastCdc::gear_table();
        let mut h = 0u64;
        let (mut ends, mut last) = (Vec::new(), None);
        for (k, &b) in chunk.iter().enumerate() {
            h = (h << 1).wrapping_add(gear[b as usize]);
            let p = k as u64 + 1;
            if self::level(h) >= level {
                let clear = last.is_none_or(|l| p - l >= MIN_GAP);
                if clear && p >= HEAD && p < chunk.len() as u64 {
                    ends.push(p as usize);
                }
                last = Some(p);
            }
        }
        let Some(&first) = ends.first() else {
            return xxh3_64(chunk);
        };
        let mut parts = vec![xxh3_64(&chunk[..first])];
        for w in ends.windows(2) {
            parts.push(xxh3_64(&chunk[w[0]..w[1]]));
        }
        parts.push(xxh3_64(&chunk[*ends.last().unwrap()..]));
        let bytes: Vec<u8> = parts.iter().flat_map(|p| p.to_le_bytes()).collect();
        xxh3_64(&bytes)
    }

    /// A two-byte pattern whose run has a candidate of level [`SEG_LEVEL`] every two bytes.
    fn dense_pattern() -> [u8; 2] {
        let gear = FastCdc::gear_table();
        (0..=u16::MAX)
            .map(u16::to_le_bytes)
            .find(|p| {
                let mut h = 0u64;
                for _ in 0..64 {
                    h = (h << 1).wrapping_add(gear[p[0] as usize]);
                    h = (h << 1).wrapping_add(gear[p[1] as usize]);
                }
                level(h) >= SEG_LEVEL
            })
            .expect("about one pattern in 500 qualifies")
    }

    #[test]
    fn ids_made_from_segments_depend_only_on_the_chunk() {
        let mut base = data(3 << 20, 21);
        // A long run with no candidates makes one long segment, hashed as it streams.
        base[1_000_000..1_900_000].fill(7);
        // A run whose every other byte is a candidate makes one segment, not 50 000.
        let dense = dense_pattern();
        for (k, b) in base[2_000_000..2_100_000].iter_mut().enumerate() {
            *b = dense[k % 2];
        }
        let mut shifted = data(1234, 22);
        shifted.extend_from_slice(&base);
        let items = vec![base, data(100, 23), Vec::new(), shifted, data(70_000, 24)];
        let specs = [
            ChunkerSpec::cdc(1024),
            ChunkerSpec::cdc(4096),
            ChunkerSpec::cdc(64 << 10),
            ChunkerSpec::Fixed { size: 8192 },
        ];
        let mut seen = vec![std::collections::HashMap::new(); specs.len()];
        for batch in [4 << 20, 100_000, 1000] {
            let mut mc = MultiCut::new(&specs).unwrap();
            assert_eq!(mc.from_segs, [false, true, true, false]);
            for b in batches(&items, batch) {
                scan(&mut mc, &b);
                let (scanned, cursors) = mc.split();
                for (i, cursor) in cursors.iter_mut().enumerate() {
                    let mut buf = Vec::new();
                    let mut got = Vec::new();
                    scanned.cut(i, cursor, &b.data, |s, e, c| {
                        got.push((scanned.id(i, (s, e), c, &mut buf), c.to_vec()));
                    });
                    for (id, c) in got {
                        let want = match specs[i] {
                            ChunkerSpec::Cdc { avg, .. } if avg >= 4096 => {
                                content_id(&c, SEG_LEVEL)
                            }
                            _ => crate::hash::xxh3_64(&c),
                        };
                        assert_eq!(id, want, "size {i}, batch {batch}, {} bytes", c.len());
                        assert_eq!(*seen[i].entry(id).or_insert_with(|| c.clone()), c);
                    }
                }
                mc.end_batch(&b.data);
                assert!(mc.segs.len() < 5000, "{}", mc.segs.len());
                assert!(mc.carry.len() <= 4 * (64 << 10), "{}", mc.carry.len());
            }
        }
        // The shifted copy shares most of its 64 KiB chunks with the original, by id.
        let each_copy = (3 << 20) / (64 << 10);
        assert!(seen[2].len() < each_copy * 12 / 10, "{}", seen[2].len());
    }

    #[test]
    fn similarity_units_follow_the_rule_of_the_sizes_by_content() {
        let mut big = data(3 << 20, 31);
        big[1 << 20..(1 << 20) + 100_000].fill(7);
        let items = vec![
            big,
            data(10_000, 32),
            Vec::new(),
            data(300, 33),
            data(40_000, 34),
        ];
        let spec = ChunkerSpec::cdc(8192);
        for batch in [1 << 30, 1 << 20, 5000] {
            // The shared scan is at exact dedup's lowest level; similarity takes its own.
            let level = cdc_level(ChunkerSpec::cdc(1024)).unwrap();
            assert!(level < cdc_level(spec).unwrap());
            let mut units = Vec::new();
            for b in batches(&items, batch) {
                let gear = gear_scan(&b, level);
                for piece in &b.pieces {
                    let mut lens = Vec::new();
                    cdc_lens(&gear, piece, spec, &mut lens);
                    assert_eq!(lens.iter().sum::<u32>() as usize, piece.end - piece.start);
                    let mut at = piece.start;
                    for (k, &len) in lens.iter().enumerate() {
                        assert!(len as usize <= 8 * 8192, "{len}");
                        if k + 1 < lens.len() {
                            assert!(len as usize >= 2048, "{len}");
                        }
                        units.push(b.data[at..at + len as usize].to_vec());
                        at += len as usize;
                    }
                }
            }
            if batch == 1 << 30 {
                // One batch, items whole: the very cuts exact dedup's 8 KiB size makes.
                assert_eq!(units, cut_all(&[spec], &items, batch)[0]);
                let mean = (3 << 20) as f64 / units.len() as f64;
                assert!(mean > 6000.0 && mean < 12_000.0, "{mean}");
            } else {
                assert_eq!(units.concat(), items.concat());
            }
        }
    }

    #[test]
    fn a_runner_asking_for_a_lower_level_scans_on_its_own() {
        let items = vec![data(100_000, 41)];
        let b = batches(&items, 1 << 20).remove(0);
        let high = gear_scan(&b, 11).into_owned();
        let low = gear_scan(&b, 8);
        assert!(matches!(low, Cow::Owned(_)));
        assert!(matches!(gear_scan(&b, 11), Cow::Borrowed(_)));
        let filtered: Vec<u64> = low
            .cands
            .cands
            .iter()
            .copied()
            .filter(|&c| c & 0xff >= 11)
            .collect();
        assert_eq!(filtered, high.cands.cands);
        assert!(low.cands.cands.len() > 4 * high.cands.cands.len());
    }

    #[test]
    fn samples_are_the_gear_hashes_at_the_positions_of_their_level() {
        let items = vec![data(60_000, 7), data(9000, 8)];
        let b = batches(&items, 1 << 20).remove(0);
        let scan = gear_scan(&b, ODESS_LEVEL);
        let gear = FastCdc::gear_table();
        for piece in &b.pieces {
            let (from, to) = (piece.start + 1000, piece.end - 500);
            for level in [ODESS_LEVEL, ODESS_LEVEL + 1] {
                let mut h = 0u64;
                let mut want = Vec::new();
                for (k, &x) in b.bytes(piece).iter().enumerate() {
                    h = (h << 1).wrapping_add(gear[x as usize]);
                    let at = piece.start + k;
                    if (from..to).contains(&at) && super::level(h) >= level {
                        want.push(h);
                    }
                }
                assert!(want.len() > 10, "{}", want.len());
                let got: Vec<u64> = scan.samples(from, to, level).collect();
                assert_eq!(got, want, "level {level}");
            }
        }
    }

    #[test]
    fn fixed_restarts_at_each_item() {
        let items = vec![data(5000, 1), data(5000, 2)];
        let chunks = &cut_all(&[ChunkerSpec::Fixed { size: 4096 }], &items, 3000)[0];
        let lens: Vec<usize> = chunks.iter().map(Vec::len).collect();
        assert_eq!(lens, [4096, 904, 4096, 904]);
    }
}
