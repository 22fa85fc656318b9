//! The sending half of a channel end: cuts messages into segments, asks the receiver which
//! chunks it holds level by level, and sends the rest as deltas or literals.
//!
//! A changed chunk's delta base is the most similar chunk by super-features, or else the
//! chunk that followed, last time, the base (or hit) of the chunk before it: versions of a
//! file change in place, so the old neighbour is the likeliest base (super-features miss a
//! chunk with edits spread over it).
//!
//! A segment's bytes stay here until the receiver acknowledges it, so that a chunk it asks
//! for again (NEED) can always be answered; `window` bounds how many segments that is.
//!
//! What the sender learns (each chunk's features, the chunk before it) is also kept in its
//! store as [`Sketch`]es and recalled by the next connection's sender, before its first
//! dedup segment: a release sent yesterday is a delta base today, as on one long connection
//! (Django 4.2.2's tar after 4.2.1's on a new connection: 6.5 MB on the socket without that
//! memory, 0.6 MB on one connection). A base the receiver no longer holds costs a NEED.
//!
//! A changed chunk holding a NUL byte (a binary, or a tar header) is also tried as a zstd
//! delta against its base and the chunk that followed the base last time (protocol version
//! 2): a rebuilt shared library differs from its old version in many small places, which a
//! copy/insert delta pays for in short copies and literals, and an edit that moved the chunk's
//! boundaries finds the rest of its bytes in the base's successor. It is sent when it is
//! smaller than what the DATA frame's compression is expected to make of the copy/insert
//! delta or the literal, unless the base is in the same frame (the frame's compression sees
//! it then). pyarrow 14.0.2's tar after 14.0.1's, on one connection: 9.1 MB instead of
//! 11.9 (Django 4.2.2's after 4.2.1's: 0.58 MB instead of 0.62).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupwire_engine::compress::{Compression, Compressor};
use dedupwire_engine::delta::{DeltaCodec, Sampled, ZstdRef};
use dedupwire_engine::similarity::{select_source, Candidate, CandidateIndex, SuperFeatureConfig};

use super::adaptive::{Adaptive, Cost, Prior, Way};
use super::config::{ChannelConfig, Mode};
use super::effort::Effort;
use super::link::Link;
use super::parallel;
use super::protocol::{EntryRef, Message, MessageEnd, DATA_FRAME};
use super::spare::Spare;
use super::stats::ChannelStats;
use crate::error::{Error, Result};
use crate::store::{get_intact, ChunkId, ChunkStore, IdMap, Sketch};

/// Chunks shorter than this are always sent literally: a delta would not pay for its base id.
const MIN_DELTA_LEN: usize = 256;
/// A delta must save at least this share of a chunk's raw bytes when residual bytes do not
/// compress (any saving is then real), and half of them when they compress well: a delta's
/// copy instructions barely compress, so against a chunk that zstd shrinks it must be much
/// smaller raw to be smaller on the wire. In between, the share is the DATA frames' observed
/// compressed/raw ratio.
const DELTA_MIN_SAVING: f64 = 0.125;
/// Odess features per super-feature (of 12): with each feature its own key, a chunk with most
/// of its bytes rewritten still finds its old version (ranked by features shared), where the
/// engine's default three quadruples rarely do: 8.2% instead of 15.4% of a 10 MB message with
/// 5% rewritten in 10 KB blocks (`a_similar_second_message_moves_far_fewer_bytes`).
const FEATURES_PER_SF: usize = 1;
/// Successor entries kept (about 100 bytes each) before the map starts over.
const MAX_SUCCESSORS: usize = 1 << 22;
/// Chunks a receiver may ask for again (NEED) on one connection before the sender stops
/// trusting what it recalled: such a receiver is not the one earlier connections sent to (or
/// it evicted what they sent), and every delta against a recalled base would cost a round
/// trip and the chunk sent whole.
const STRANGER_NEEDS: usize = 16;
/// Items kept per super-feature in the similarity index.
const PER_FEATURE: usize = 4;
/// A whole message shorter than this travels plain (compressed), kept by both ends unless
/// the mode is plain: asking which of its chunks the receiver holds would cost a round trip
/// per level to save at most this many bytes (a small control message on a 40 ms link would
/// wait 120 ms to save under 4 KiB).
pub(crate) const SMALL_MESSAGE: usize = 4096;
/// Segments that sample a way (the adaptive mode's first segments, while it measures both
/// ways and the link, and its probes of the way not chosen) carry this share of a segment
/// when they sample dedup, so that measuring it on a fast link costs an eighth of a segment's
/// CPU...
const SAMPLE_SHARE_DEDUP: usize = 8;
/// ...and this share when they sample plain, whose wire bytes cost most on a slow link (a LAN
/// away, plain samples are as long as dedup ones: a short one's fixed costs made zstd -1 look
/// half as fast as it is, and dedup won over loopback where it was 1.4 times slower).
const SAMPLE_SHARE_PLAIN: usize = 32;
/// ...but no less than this many bytes, so a sample still spans several chunks.
const SAMPLE_MIN: usize = 64 << 10;
/// Plain segments in the adaptive mode carry this share of a segment unless the link bounds
/// them: on a fast link a message then streams through the compressor, the socket and the
/// receiver's decompression in short steps (Django's 49 MB tar over loopback waited for 16 MiB
/// before its first segment left, and for a whole 8 MiB one at the end), for 1.4% more
/// compressed bytes than 8 MiB segments at zstd -3; where the link bounds them, segments
/// stay whole and compress best.
const PLAIN_SHARE_FAST: usize = 4;

/// zstd's level for zstd deltas (see [`EntryRef::ZDelta`]).
pub(crate) const ZDELTA_LEVEL: i32 = 3;

/// A zstd delta is sent only when it is below this share of what the DATA frame's
/// compression is expected to make of the copy/insert delta or the literal: that expectation
/// is an average, and a frame compresses a chunk better when similar ones share it.
const ZDELTA_MARGIN: f64 = 0.9;

/// A zstd delta is tried only where the DATA frame's compression is expected to leave at
/// least this many bytes of the copy/insert delta or the literal: a chunk whose delta is
/// shorter barely ever has a smaller zstd delta (Django 4.2.2's and pyarrow 14.0.2's tars
/// after their predecessors, every candidate tried: 10 of 2 367 such attempts smaller,
/// against 2 826 of 4 085 above it), and at 40-80 µs an attempt they took 62 of the 102 ms
/// Django's tar spent on zstd deltas.
const ZDELTA_MIN_GAIN: f64 = 300.0;

/// A plain segment's bytes on the socket beside its compressed body: the frame's header and
/// trailer, the segment number, flags, method and length.
const PLAIN_HEADER: usize = crate::frame::OVERHEAD + 15;

#[derive(Debug, Clone, Copy)]
struct Piece {
    off: usize,
    len: usize,
    id: ChunkId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Await {
    Have(u8),
    Ack,
}

#[derive(Debug)]
struct OutSeg {
    data: Vec<u8>,
    levels: Vec<Vec<Piece>>,
    way: Way,
    /// When the latest request was sent.
    asked: Instant,
    /// Time the sender spent on this segment (CPU and socket writes).
    busy: Duration,
    /// Time spent blocked writing its frames.
    writes: Duration,
    /// Bytes of frames written for it.
    wire: u64,
    awaiting: Await,
    /// Whether the adaptive mode learns from its cost (a small message's says little).
    sampled: bool,
}

/// The sending half.
pub(crate) struct Sender {
    cfg: ChannelConfig,
    store: Arc<dyn ChunkStore>,
    next_seg: u64,
    inflight: BTreeMap<u64, OutSeg>,
    hasher: blake3::Hasher,
    msg_len: u64,
    open: bool,
    sf: SuperFeatureConfig,
    index: CandidateIndex<ChunkId>,
    /// For each chunk sent or found held, the chunk that followed it: where to look for the
    /// base of a changed chunk next to one whose base (or itself) is known (locality).
    successor: IdMap<ChunkId>,
    /// Compressed/raw size of recent DATA frames (a moving average).
    ratio: f64,
    compressor: Compressor,
    /// Plain segments' compressor, whose zstd level the adaptive mode moves.
    plain_compressor: Compressor,
    codec: Sampled,
    pub(crate) adaptive: Adaptive,
    /// The message being sent is new to the peer: plain, kept by neither end.
    pub(crate) new_bytes: bool,
    /// Whether the store's sketches were loaded into `index` and `successor` (on first need,
    /// so an end that only receives never reads them).
    recalled: bool,
    /// What was learnt since the store was last told.
    learnt: Vec<Sketch>,
    /// Chunks asked for again on this connection.
    needs: usize,
    /// How the next segment travels, chosen before its bytes are all gathered so that they
    /// wait only for as many as it takes.
    planned: Option<Plan>,
    /// Whether the peer takes zstd deltas (protocol version 2).
    pub(crate) zdelta: bool,
    /// Whether zstd deltas pay on this link (see [`Effort`]).
    zeffort: Effort,
    /// Whether the adaptive mode was offered the store's prior (at the first segment).
    primed: bool,
    /// Buffers of acknowledged segments, for the next segments' bytes.
    spare: Spare,
    /// The DATA frame being gathered, kept between segments (a fresh one faulted its pages
    /// in again).
    body: Vec<u8>,
    /// Message bytes whose chunks `index` and `successor` learnt since they last started
    /// over: past half the store's [`capacity`](ChunkStore::capacity) they become `older`
    /// and start over, so that what is indexed stays about what the store can give back.
    indexed: u64,
    /// The generation of `index` and `successor` before, still looked up.
    older: Option<Box<(CandidateIndex<ChunkId>, IdMap<ChunkId>)>>,
}

/// How one segment travels.
#[derive(Debug, Clone, Copy)]
struct Plan {
    way: Way,
    /// It samples its way: it is short (see [`Sender::cap`]).
    sample: bool,
    /// It goes with dedup and samples plain dry (see `Adaptive::estimate_plain`).
    dry: bool,
}

impl Sender {
    pub(crate) fn new(cfg: ChannelConfig, store: Arc<dyn ChunkStore>) -> Sender {
        Sender {
            spare: Spare::new(cfg.segment_size),
            compressor: Compressor::new(cfg.compression),
            plain_compressor: Compressor::new(cfg.compression),
            adaptive: Adaptive::new(cfg.mode, cfg.compression),
            cfg,
            store,
            next_seg: 0,
            inflight: BTreeMap::new(),
            hasher: blake3::Hasher::new(),
            msg_len: 0,
            open: false,
            sf: SuperFeatureConfig {
                per_super_feature: FEATURES_PER_SF,
                ..SuperFeatureConfig::default()
            },
            index: CandidateIndex::new(PER_FEATURE),
            successor: IdMap::default(),
            ratio: 0.5,
            codec: Sampled::default(),
            new_bytes: false,
            planned: None,
            zdelta: false,
            zeffort: Effort::default(),
            recalled: false,
            learnt: Vec::new(),
            needs: 0,
            primed: false,
            body: Vec::new(),
            indexed: 0,
            older: None,
        }
    }

    /// Starts the adaptive mode from the prior an earlier connection as far away kept in the
    /// store, if there is one (a note that cannot be read is none: it is only a head start).
    fn prime(&mut self) {
        if std::mem::replace(&mut self.primed, true) || self.cfg.mode != Mode::Adaptive {
            return;
        }
        let Some(key) = self.adaptive.prior_key() else {
            return;
        };
        if let Some(prior) = self
            .store
            .note(key)
            .ok()
            .flatten()
            .and_then(|n| Prior::decode(&n))
        {
            self.adaptive.prime(&prior);
        }
    }

    /// Keeps what the adaptive mode measured on this connection for the next one (best
    /// effort, as the prior is only a head start).
    pub(crate) fn keep_prior(&self) {
        if let (Some(key), Some(prior)) = (self.adaptive.prior_key(), self.adaptive.prior()) {
            let _ = self.store.keep_note(key, &prior.encode());
        }
    }

    /// Loads what the store remembers into `index` and `successor`, once (oldest first, so
    /// the newest wins; this connection's notes are in the store already).
    fn recall(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.recalled, true) {
            return Ok(());
        }
        for sk in self.store.recall()? {
            if !sk.features.is_empty() {
                self.index.insert(sk.id, &sk.features);
            }
            if let Some(before) = sk.after {
                self.successor.insert(before, sk.id);
            }
        }
        Ok(())
    }

    /// Notes that `id` follows `before` (and has `features`, unless empty), here and, where
    /// it is news, for the store.
    fn note(&mut self, id: ChunkId, before: Option<ChunkId>, features: &[u64]) {
        let mut after = None;
        if let Some(b) = before {
            if self.successor.insert(b, id) != Some(id) {
                after = Some(b);
            }
        }
        if !features.is_empty() {
            self.index.insert(id, features);
        }
        if after.is_some() || !features.is_empty() {
            self.learnt.push(Sketch {
                id,
                after,
                features: features.to_vec(),
            });
        }
    }

    /// The chunk that followed `id` last time, in either generation.
    fn successor_of(&self, id: &ChunkId) -> Option<ChunkId> {
        self.successor.get(id).copied().or_else(|| {
            let (_, older) = self.older.as_deref()?;
            older.get(id).copied()
        })
    }

    /// Hands what was learnt to the store.
    fn tell_store(&mut self) -> Result<()> {
        if !self.learnt.is_empty() {
            self.store.remember(&self.learnt)?;
            self.learnt.clear();
        }
        Ok(())
    }

    /// How the next segment travels, chosen once until it is sent.
    fn plan(&mut self) -> Plan {
        if self.planned.is_none() {
            self.prime();
        }
        let adaptive = &mut self.adaptive;
        *self.planned.get_or_insert_with(|| Plan {
            way: adaptive.choose(),
            sample: adaptive.sampling(),
            dry: adaptive.dry_plain(),
        })
    }

    /// The most message bytes the next segment takes: the bytes to gather before sending it
    /// unless the message ends first.
    pub(crate) fn next_cap(&mut self) -> usize {
        let plan = self.plan();
        self.cap(plan.way, plan.sample)
    }

    fn cap(&self, way: Way, sample: bool) -> usize {
        let size = self.cfg.segment_size;
        let share = match (way, sample) {
            (Way::Dedup, true) => SAMPLE_SHARE_DEDUP,
            (Way::Plain, true) if !self.adaptive.lan() => SAMPLE_SHARE_PLAIN,
            (Way::Plain, true) => SAMPLE_SHARE_DEDUP,
            (Way::Plain, false)
                if self.cfg.mode == Mode::Adaptive && !self.adaptive.link_bound() =>
            {
                PLAIN_SHARE_FAST
            }
            _ => return size,
        };
        (size / share).max(SAMPLE_MIN).min(size)
    }

    /// Whether the window is full: the next segment must wait for acknowledgements.
    ///
    /// At most half the window may wait for a HAVE, so that answers are read (and data sent)
    /// while later segments are still being cut.
    pub(crate) fn needs_room(&self) -> bool {
        let waiting_have = self
            .inflight
            .values()
            .filter(|s| matches!(s.awaiting, Await::Have(_)))
            .count();
        self.inflight.len() >= self.cfg.window || waiting_have >= (self.cfg.window / 2).max(1)
    }

    /// Whether every segment sent has been acknowledged.
    pub(crate) fn idle(&self) -> bool {
        self.inflight.is_empty()
    }

    /// Whether a message has segments out but no end yet.
    pub(crate) fn open(&self) -> bool {
        self.open
    }

    /// Sends the next segment from the start of `data` (at most a segment's worth, less for a
    /// sample of a way); returns the bytes it took. `last` says `data` ends the message: the
    /// segment that takes all of it ends the message. Otherwise a content-defined tail is
    /// left for the next segment.
    pub(crate) fn emit<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        data: &[u8],
        last: bool,
    ) -> Result<usize> {
        let started = Instant::now();
        let (writes0, wire0) = (link.write_time, link.bytes_written());
        // Time spent on this segment that is not what sending it its way costs.
        let mut aside = Duration::ZERO;
        let small = last && !self.open && data.len() < SMALL_MESSAGE;
        let Plan { way, sample, dry } = if small || self.new_bytes {
            Plan {
                way: Way::Plain,
                sample: false,
                dry: false,
            }
        } else {
            let plan = self.plan();
            self.planned = None;
            plan
        };
        let cap = self.cap(way, sample);
        let last = last && data.len() <= cap;
        let data = &data[..data.len().min(cap)];
        let mut lens = Vec::new();
        let mut take = data.len();
        if way == Way::Dedup {
            self.cfg.levels[0].cut(data, &mut lens);
            if !last && lens.len() > 1 {
                take -= lens.pop().unwrap_or(0);
            }
        }
        let mut bytes = self.spare.take();
        bytes.extend_from_slice(&data[..take]);
        self.hasher.update(&bytes);
        self.msg_len += take as u64;
        self.open = !last;
        let end = last.then(|| {
            let e = MessageEnd {
                len: self.msg_len,
                hash: *self.hasher.finalize().as_bytes(),
            };
            self.hasher.reset();
            self.msg_len = 0;
            e
        });
        let seg = self.next_seg;
        self.next_seg += 1;
        let (levels, awaiting) = match way {
            Way::Plain => {
                stats.plain_level = self.set_plain_level().or(stats.plain_level);
                let body = self.plain_compressor.compress(&bytes);
                let keep = if self.new_bytes {
                    false
                } else if small {
                    self.cfg.mode != Mode::Plain
                } else {
                    self.adaptive.link_bound()
                };
                link.send(&Message::Plain {
                    seg,
                    end,
                    keep,
                    method: self.cfg.compression.tag(),
                    raw_len: bytes.len() as u32,
                    body,
                })?;
                if keep {
                    let t = Instant::now();
                    self.learn(&bytes)?;
                    if self.adaptive.warming_up() {
                        aside = t.elapsed();
                    }
                    stats.segments_kept += 1;
                }
                stats.segments_plain += 1;
                stats.bytes_plain += bytes.len() as u64;
                (Vec::new(), Await::Ack)
            }
            Way::Dedup => {
                if dry {
                    let t = Instant::now();
                    self.sample_plain_dry(stats, &bytes);
                    aside = t.elapsed();
                }
                let mut spans = Vec::with_capacity(lens.len());
                let mut off = 0;
                for len in lens {
                    spans.push((off, len));
                    off += len;
                }
                let ident = &self.cfg.identifier;
                let pieces = parallel::map(&spans, bytes.len(), |&(off, len)| Piece {
                    off,
                    len,
                    id: ident.identify(&bytes[off..off + len]),
                });
                link.send(&Message::Request {
                    seg,
                    level: 0,
                    end,
                    chunks: pieces.iter().map(|p| (p.len as u32, p.id)).collect(),
                })?;
                stats.segments_dedup += 1;
                stats.round_trips += 1;
                (vec![pieces], Await::Have(0))
            }
        };
        self.inflight.insert(
            seg,
            OutSeg {
                data: bytes,
                levels,
                way,
                asked: Instant::now(),
                // Indexing a plain segment kept only because the link is not known yet is
                // a bet on later segments, not what sending plain costs; a dry plain sample
                // is not what sending dedup costs.
                busy: started.elapsed().saturating_sub(aside),
                writes: link.write_time - writes0,
                wire: link.bytes_written() - wire0,
                awaiting,
                sampled: !small && !self.new_bytes,
            },
        );
        Ok(take)
    }

    /// Moves the plain compressor to the adaptive mode's current level, if it adapts, and
    /// returns that level.
    fn set_plain_level(&mut self) -> Option<i32> {
        let level = self.adaptive.plain_level()?;
        self.plain_compressor.set_zstd_level(level);
        Some(level)
    }

    /// Times compressing the start of a dedup segment's `bytes` as a plain sample would be,
    /// and decompressing it (the receiver's share), without sending it.
    fn sample_plain_dry(&mut self, stats: &mut ChannelStats, bytes: &[u8]) {
        let n = self.cap(Way::Plain, true).min(bytes.len());
        self.set_plain_level();
        let t = Instant::now();
        let body = self.plain_compressor.compress(&bytes[..n]);
        let cpu = t.elapsed();
        let t = Instant::now();
        let unpacked = Compression::decompress(self.cfg.compression.tag(), &body, n);
        let unpack = t.elapsed();
        if unpacked.is_err() {
            return;
        }
        self.adaptive.estimate_plain(
            Cost {
                bytes: n,
                cpu,
                wire: (body.len() + PLAIN_HEADER) as u64,
                round_trips: 0,
            },
            unpack,
        );
        stats.plain_estimates += 1;
    }

    /// Indexes a plain segment's chunks as if they had been sent with dedup (the receiver
    /// keeps them), so that later segments find hits and delta bases in it.
    ///
    /// It does not read back what the store remembers: reading back a large store on every
    /// connection cost tens of milliseconds a message of a few bytes does not need. What it
    /// notes is told to the store before it returns, so a later [`Sender::recall`] reads it
    /// back after the older sketches, and the newest still wins.
    fn learn(&mut self, data: &[u8]) -> Result<()> {
        let mut spans = vec![(0usize, data.len())];
        let mut lens = Vec::new();
        for chunker in &self.cfg.levels {
            let mut next = Vec::new();
            for &(off, len) in &spans {
                lens.clear();
                chunker.cut(&data[off..off + len], &mut lens);
                let mut o = off;
                for &l in &lens {
                    next.push((o, l));
                    o += l;
                }
            }
            spans = next;
        }
        let mut prev = None;
        let mut sfs = Vec::new();
        for (off, len) in spans {
            let chunk = &data[off..off + len];
            let id = self.cfg.identifier.identify(chunk);
            sfs.clear();
            if self.cfg.delta && len >= MIN_DELTA_LEN {
                self.sf.super_features_into(chunk, &mut sfs);
            }
            self.note(id, prev.replace(id), &sfs);
            self.store.put(&id, chunk)?;
        }
        self.tell_store()
    }

    /// The receiver's answer to a request: refine what it lacks at the next level, or send it.
    pub(crate) fn on_have<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
        level: u8,
        bits: &[bool],
    ) -> Result<()> {
        let started = Instant::now();
        let (writes0, wire0) = (link.write_time, link.bytes_written());
        let mut s = self.inflight.remove(&seg).ok_or_else(|| {
            Error::Protocol(format!(
                "HAVE for segment {seg}, which is not waiting for one"
            ))
        })?;
        self.adaptive.round_trip(started.duration_since(s.asked));
        if s.awaiting != Await::Have(level) || bits.len() != s.levels[level as usize].len() {
            return Err(Error::Protocol(format!(
                "HAVE for segment {seg} level {level} with {} bits does not answer the request \
                 sent",
                bits.len()
            )));
        }
        let l = level as usize;
        let finest = l + 1 == self.cfg.levels.len();
        let mut missing = Vec::new();
        for (i, (p, &held)) in s.levels[l].iter().zip(bits).enumerate() {
            if held {
                stats.chunks_hit += 1;
                stats.bytes_hit += p.len as u64;
                // A coarser hit's bytes are mostly fine chunks this store holds already (sent
                // before, when that chunk was refined): kept whole they took the space twice
                // (tokio's series: 12.5 MB of environment against 8.5 MB), and no delta used
                // them (the same bytes on the wire for Django, tokio and pyarrow).
                if finest {
                    self.store.put(&p.id, &s.data[p.off..p.off + p.len])?;
                }
            } else {
                missing.push(i);
            }
        }
        if !missing.is_empty() && l + 1 < self.cfg.levels.len() {
            let (chunker, ident, data) = (&self.cfg.levels[l + 1], &self.cfg.identifier, &s.data);
            let parents: Vec<Piece> = missing.iter().map(|&i| s.levels[l][i]).collect();
            let bytes = parents.iter().map(|p| p.len).sum();
            let next = parallel::flat_map(&parents, bytes, |p, next| {
                let mut lens = Vec::new();
                chunker.cut(&data[p.off..p.off + p.len], &mut lens);
                let mut off = p.off;
                for len in lens {
                    let id = ident.identify(&data[off..off + len]);
                    next.push(Piece { off, len, id });
                    off += len;
                }
            });
            link.send(&Message::Request {
                seg,
                level: level + 1,
                end: None,
                chunks: next.iter().map(|p| (p.len as u32, p.id)).collect(),
            })?;
            stats.round_trips += 1;
            s.levels.push(next);
            s.awaiting = Await::Have(level + 1);
            s.asked = Instant::now();
        } else {
            self.send_data(link, stats, seg, &s.data, &s.levels[l], &missing)?;
            self.indexed += s.data.len() as u64;
            if self.store.capacity().is_some_and(|c| self.indexed > c / 2) {
                let index = std::mem::replace(&mut self.index, CandidateIndex::new(PER_FEATURE));
                let successor = std::mem::take(&mut self.successor);
                self.older = Some(Box::new((index, successor)));
                self.indexed = 0;
            }
            if self.successor.len() > MAX_SUCCESSORS {
                self.successor.clear();
            }
            s.awaiting = Await::Ack;
        }
        s.busy += started.elapsed();
        s.writes += link.write_time - writes0;
        s.wire += link.bytes_written() - wire0;
        self.inflight.insert(seg, s);
        Ok(())
    }

    fn send_data<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
        data: &[u8],
        pieces: &[Piece],
        missing: &[usize],
    ) -> Result<()> {
        self.recall()?;
        let id_len = self.cfg.identifier.id_len();
        let mut body = std::mem::take(&mut self.body);
        body.clear();
        let (sf, delta_on) = (&self.sf, self.cfg.delta);
        let bytes = missing.iter().map(|&i| pieces[i].len).sum();
        let features = parallel::map(missing, bytes, |&i| {
            let p = pieces[i];
            let mut sfs = Vec::new();
            if delta_on && p.len >= MIN_DELTA_LEN {
                sf.super_features_into(&data[p.off..p.off + p.len], &mut sfs);
            }
            sfs
        });
        let mut features = features.iter();
        let mut delta = Vec::new();
        let mut zdelta = Vec::new();
        // Bytes of zstd deltas in `body`, which its compression leaves as they are.
        let mut zbytes = 0;
        // Chunks in `body`: a base among them is in the frame's compression window already.
        let mut batch = std::collections::HashSet::new();
        let mut missing = missing.iter().copied().peekable();
        let mut anchor: Option<ChunkId> = None;
        let mut prev: Option<ChunkId> = None;
        for (i, p) in pieces.iter().enumerate() {
            let before = prev.replace(p.id);
            if missing.next_if_eq(&i).is_none() {
                self.note(p.id, before, &[]);
                anchor = Some(p.id);
                continue;
            }
            let chunk = &data[p.off..p.off + p.len];
            let mut base_used = None;
            let mut zbases: Vec<ChunkId> = Vec::new();
            let sfs = features.next().map_or(&[][..], Vec::as_slice);
            if !sfs.is_empty() {
                let mut found = self.index.lookup(sfs);
                if let Some((older, _)) = self.older.as_deref() {
                    // Ranked below the newer generation's on a tie.
                    found.extend(
                        older
                            .lookup(sfs)
                            .into_iter()
                            .map(|c| Candidate { seq: 0, ..c }),
                    );
                }
                found.retain(|c| c.id != p.id);
                let similar = select_source(&found, |_| false);
                let next_to_anchor = anchor
                    .and_then(|a| self.successor_of(&a))
                    .filter(|n| *n != p.id);
                let keep = self.ratio.clamp(0.5, 1.0 - DELTA_MIN_SAVING);
                let limit = ((p.len as f64 * keep) as usize).saturating_sub(id_len);
                // A zstd delta's base is the first candidate; its bytes, once read, serve both.
                let zbase = similar.or(next_to_anchor);
                let mut zsrc = None;
                for base in [similar, next_to_anchor.filter(|n| Some(*n) != similar)]
                    .into_iter()
                    .flatten()
                {
                    let Some(src) = get_intact(&*self.store, &base)? else {
                        continue;
                    };
                    delta.clear();
                    self.codec.encode(&src, chunk, &mut delta);
                    let found = delta.len() < limit;
                    if found {
                        base_used = Some(base);
                    }
                    if Some(base) == zbase {
                        zsrc = Some(src);
                    }
                    if found {
                        break;
                    }
                }
                let other = if base_used.is_some() {
                    delta.len()
                } else {
                    p.len
                };
                // What the DATA frame's compression is expected to make of the delta (or the
                // literal): zstd deltas are compressed already.
                let other = other as f64 * self.ratio;
                if let (Some(zbase), Some(src)) = (
                    zbase.filter(|b| {
                        self.zdelta
                            && other >= ZDELTA_MIN_GAIN
                            && chunk.contains(&0)
                            && !batch.contains(b)
                            && self.zeffort.pays(self.adaptive.link_limit())
                    }),
                    zsrc,
                ) {
                    self.zdelta_against(zbase, src, p.id, chunk, &mut zbases, &mut zdelta)?;
                    let size = zdelta.len() + zbases.len() * id_len;
                    let used = size < (other * ZDELTA_MARGIN) as usize;
                    self.zeffort
                        .record(if used { other as usize - size } else { 0 });
                    if used {
                        base_used = Some(zbase);
                        std::mem::swap(&mut delta, &mut zdelta);
                    } else {
                        zbases.clear();
                    }
                }
            }
            self.note(p.id, before, sfs);
            match base_used {
                Some(_) if !zbases.is_empty() => {
                    EntryRef::ZDelta(&zbases, &delta).encode(id_len, &mut body);
                    zbytes += delta.len();
                    stats.chunks_delta += 1;
                    stats.chunks_zdelta += 1;
                    stats.bytes_delta += p.len as u64;
                }
                Some(base) => {
                    EntryRef::Delta(&base, &delta).encode(id_len, &mut body);
                    stats.chunks_delta += 1;
                    stats.bytes_delta += p.len as u64;
                }
                None => {
                    EntryRef::Literal(chunk).encode(id_len, &mut body);
                    stats.chunks_literal += 1;
                    stats.bytes_literal += p.len as u64;
                }
            }
            batch.insert(p.id);
            anchor = base_used;
            self.store.put(&p.id, chunk)?;
            if body.len() >= DATA_FRAME {
                self.flush_data(link, seg, &mut body, std::mem::take(&mut zbytes))?;
                batch.clear();
            }
        }
        if !body.is_empty() {
            self.flush_data(link, seg, &mut body, zbytes)?;
        }
        self.body = body;
        self.tell_store()
    }

    /// A zstd delta of `chunk` (id `id`) against `base` (whose bytes are `src`) and, where
    /// the store holds it, the chunk that followed `base` last time (an edit that moved the
    /// chunk's boundaries finds the rest of its bytes there); `bases` gets what it was made
    /// against.
    fn zdelta_against(
        &self,
        base: ChunkId,
        mut src: Vec<u8>,
        id: ChunkId,
        chunk: &[u8],
        bases: &mut Vec<ChunkId>,
        delta: &mut Vec<u8>,
    ) -> Result<()> {
        bases.clear();
        bases.push(base);
        if let Some(next) = self.successor_of(&base) {
            if next != id && next != base {
                if let Some(more) = get_intact(&*self.store, &next)? {
                    src.extend_from_slice(&more);
                    bases.push(next);
                }
            }
        }
        delta.clear();
        ZstdRef::new(ZDELTA_LEVEL).encode(&src, chunk, delta);
        Ok(())
    }

    fn flush_data<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        seg: u64,
        body: &mut Vec<u8>,
        zbytes: usize,
    ) -> Result<()> {
        let compressed = self.compressor.compress(body);
        if body.len() > zbytes {
            let r = compressed.len().saturating_sub(zbytes) as f64 / (body.len() - zbytes) as f64;
            self.ratio = 0.5 * self.ratio + 0.5 * r;
        }
        link.send(&Message::Data {
            seg,
            method: self.cfg.compression.tag(),
            raw_len: body.len() as u32,
            body: compressed,
        })?;
        body.clear();
        Ok(())
    }

    /// The receiver asks for chunks whole.
    pub(crate) fn on_need<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
        wants: &[(u8, u32)],
    ) -> Result<()> {
        let s = self.inflight.get(&seg).ok_or_else(|| {
            Error::Protocol(format!("NEED for segment {seg}, which is not in flight"))
        })?;
        let before = self.needs;
        self.needs += wants.len();
        if before < STRANGER_NEEDS && self.needs >= STRANGER_NEEDS {
            self.index = CandidateIndex::new(PER_FEATURE);
            self.successor.clear();
            self.older = None;
        }
        for &(level, index) in wants {
            let p = s
                .levels
                .get(level as usize)
                .and_then(|l| l.get(index as usize))
                .ok_or_else(|| {
                    Error::Protocol(format!(
                        "NEED for chunk {index} of level {level} of segment {seg}, which was \
                         never requested"
                    ))
                })?;
            link.send(&Message::Raw {
                seg,
                level,
                index,
                bytes: s.data[p.off..p.off + p.len].to_vec(),
            })?;
            stats.chunks_resent += 1;
        }
        Ok(())
    }

    /// The receiver has rebuilt segment `seg`.
    pub(crate) fn on_ack(
        &mut self,
        stats: &mut ChannelStats,
        seg: u64,
        busy_us: u32,
    ) -> Result<()> {
        let s = self.inflight.remove(&seg).ok_or_else(|| {
            Error::Protocol(format!("ACK for segment {seg}, which is not in flight"))
        })?;
        if s.awaiting != Await::Ack {
            return Err(Error::Protocol(format!(
                "ACK for segment {seg} before its data was sent"
            )));
        }
        let bytes = s.data.len();
        self.spare.give(s.data);
        if !s.sampled {
            return Ok(());
        }
        self.adaptive.observe(
            s.way,
            Cost {
                bytes,
                cpu: s.busy.saturating_sub(s.writes),
                wire: s.wire,
                round_trips: s.levels.len() as u32,
            },
            self.cfg.window,
            Duration::from_micros(u64::from(busy_us)),
        );
        (stats.dedup_rate, stats.plain_rate) = self.adaptive.rates();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn plain(cpu: Duration, wire: u64) -> Cost {
        Cost {
            bytes: 8 << 20,
            cpu,
            wire,
            round_trips: 0,
        }
    }

    #[test]
    fn plain_segments_are_short_only_where_the_link_does_not_bound_them() {
        let cfg = ChannelConfig::default();
        let size = cfg.segment_size;
        let fresh = || Sender::new(cfg.clone(), Arc::new(MemoryStore::new()));

        let mut fast = fresh();
        assert_eq!(
            fast.cap(Way::Plain, false),
            size,
            "while the link is unknown"
        );
        assert_eq!(fast.cap(Way::Dedup, true), size / SAMPLE_SHARE_DEDUP);
        assert_eq!(fast.cap(Way::Plain, true), size / SAMPLE_SHARE_PLAIN);
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(2));
            fast.adaptive.observe(
                Way::Plain,
                plain(Duration::from_millis(20), 1 << 20),
                4,
                Duration::ZERO,
            );
        }
        assert_eq!(fast.cap(Way::Plain, false), size / PLAIN_SHARE_FAST);
        assert_eq!(fast.cap(Way::Dedup, false), size);

        let mut slow = fresh();
        for _ in 0..4 {
            slow.adaptive
                .account(Duration::from_millis(100), Duration::from_millis(90));
            std::thread::sleep(Duration::from_millis(20));
            slow.adaptive.observe(
                Way::Plain,
                plain(Duration::from_millis(1), 4 << 20),
                4,
                Duration::ZERO,
            );
        }
        assert_eq!(
            slow.cap(Way::Plain, false),
            size,
            "the link bounds plain segments"
        );

        let mut fixed = Sender::new(
            ChannelConfig {
                mode: Mode::Plain,
                ..cfg.clone()
            },
            Arc::new(MemoryStore::new()),
        );
        assert_eq!(
            fixed.next_cap(),
            size,
            "the plain mode keeps whole segments"
        );
    }
}
