//! The receiving half of a channel end: answers requests from its chunk store, rebuilds each
//! segment from held chunks, literals, deltas and re-sent chunks, checks every chunk's id and
//! the whole message's hash, and keeps the new chunks.
//!
//! Everything here comes from the peer and is checked before use: segment numbers and levels
//! must follow the protocol's order, refinements must cover exactly the chunks they replace,
//! lengths must match, and a message may not outgrow `max_message`.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupwire_engine::compress::Compression;
use dedupwire_engine::delta::{DeltaCodec, Sampled, ZstdRef};

use super::config::ChannelConfig;
use super::link::Link;
use super::parallel;
use super::protocol::{decode_entries, Entry, Message, MessageEnd};
use super::sender::ZDELTA_LEVEL;
use super::spare::Spare;
use super::stats::ChannelStats;
use crate::error::{Error, Result};
use crate::store::{get_intact, ChunkId, ChunkStore};

#[derive(Debug, Clone, Copy)]
struct InPiece {
    off: usize,
    len: usize,
    id: ChunkId,
}

/// A message arriving. Each segment is rebuilt in its own buffer; once it and every segment
/// before it are complete, its bytes are hashed and wait in `ready`, so a reader can take a
/// long message as it arrives instead of holding all of it.
#[derive(Debug)]
struct InMsg {
    len: u64,
    open: usize,
    last: Option<(u64, MessageEnd)>,
    finished: BTreeMap<u64, Vec<u8>>,
    next_out: u64,
    /// Segments in order not yet taken, once the message is streamed.
    ready: VecDeque<Vec<u8>>,
    /// The segments in order so far, joined, until the message is streamed.
    joined: Vec<u8>,
    streamed: bool,
    hasher: blake3::Hasher,
    /// The last segment's busy time, kept until every segment is done and it is acknowledged.
    last_busy: Duration,
}

impl InMsg {
    fn new(first_seg: u64) -> InMsg {
        InMsg {
            len: 0,
            open: 0,
            last: None,
            finished: BTreeMap::new(),
            next_out: first_seg,
            ready: VecDeque::new(),
            joined: Vec::new(),
            streamed: false,
            hasher: blake3::Hasher::new(),
            last_busy: Duration::ZERO,
        }
    }

    /// Takes segment `seg`'s bytes, complete, and moves every segment now in order to
    /// `ready` when the message is streamed, else joins it to the rest (its buffer then goes
    /// to `spare`).
    fn finish(&mut self, seg: u64, bytes: Vec<u8>, spare: &mut Spare) {
        self.finished.insert(seg, bytes);
        while let Some(b) = self.finished.remove(&self.next_out) {
            self.hasher.update(&b);
            self.next_out += 1;
            if self.streamed {
                self.ready.push_back(b);
            } else if self.joined.is_empty() {
                self.joined = b;
            } else {
                self.joined.extend_from_slice(&b);
                spare.give(b);
            }
        }
    }
}

/// What a completed message leaves for the reader.
#[derive(Debug)]
pub(crate) enum Arrived {
    /// A whole message, verified.
    Message(Vec<u8>),
    /// A further segment's bytes of a message whose first bytes were taken with
    /// [`Receiver::take_ready`].
    Rest(Vec<u8>),
}

#[derive(Debug)]
struct InSeg {
    buf: Vec<u8>,
    levels: Vec<Vec<InPiece>>,
    missing: Vec<u32>,
    data_pos: usize,
    pending: usize,
    needs: HashSet<(u8, u32)>,
    refined: Vec<(u8, u32)>,
    /// Time spent on its frames before the current one.
    busy: Duration,
}

/// A compressed body as it arrived: method tag, length once decompressed, bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Packed<'a> {
    pub(crate) method: u8,
    pub(crate) raw_len: u32,
    pub(crate) body: &'a [u8],
}

/// The receiving half.
pub(crate) struct Receiver {
    cfg: ChannelConfig,
    store: Arc<dyn ChunkStore>,
    next_seg: u64,
    msg: Option<InMsg>,
    segs: BTreeMap<u64, InSeg>,
    pub(crate) done: VecDeque<Arrived>,
    /// When the frame being handled arrived: its time so far counts towards its segment's
    /// busy time, reported in the segment's ACK.
    pub(crate) frame_started: Option<Instant>,
    codec: Sampled,
    /// Buffers of segments the application is done with, for the next segments.
    spare: Spare,
}

fn protocol(msg: String) -> Error {
    Error::Protocol(msg)
}

impl Receiver {
    pub(crate) fn new(cfg: ChannelConfig, store: Arc<dyn ChunkStore>) -> Receiver {
        Receiver {
            spare: Spare::new(cfg.segment_size),
            cfg,
            store,
            next_seg: 0,
            msg: None,
            segs: BTreeMap::new(),
            done: VecDeque::new(),
            frame_started: None,
            codec: Sampled::default(),
        }
    }

    /// Takes back a segment's buffer the application has read, for a later segment.
    pub(crate) fn recycle(&mut self, buf: Vec<u8>) {
        self.spare.give(buf);
    }

    /// Whether a message has started arriving and is not complete yet.
    pub(crate) fn mid_message(&self) -> bool {
        self.msg.is_some()
    }

    /// Starts segment `seg` of `len` bytes: checks its place in the message and returns its
    /// buffer.
    fn open_segment(&mut self, seg: u64, len: u64, end: Option<MessageEnd>) -> Result<Vec<u8>> {
        if seg != self.next_seg {
            return Err(protocol(format!(
                "segment {seg} arrived where segment {} was due",
                self.next_seg
            )));
        }
        if len > self.cfg.segment_size as u64 {
            return Err(protocol(format!(
                "segment {seg} has {len} bytes, more than the agreed {}",
                self.cfg.segment_size
            )));
        }
        self.next_seg += 1;
        let msg = self.msg.get_or_insert_with(|| InMsg::new(seg));
        if let Some((last, _)) = msg.last {
            return Err(protocol(format!(
                "segment {seg} follows segment {last}, which ended the message"
            )));
        }
        let new_len = msg.len + len;
        if new_len > self.cfg.max_message {
            return Err(protocol(format!(
                "the message grows past this end's limit of {} bytes",
                self.cfg.max_message
            )));
        }
        if let Some(e) = end {
            if e.len != new_len {
                return Err(protocol(format!(
                    "the message's last segment says it has {} bytes, its segments add up to \
                     {new_len}",
                    e.len
                )));
            }
            msg.last = Some((seg, e));
        }
        msg.len = new_len;
        msg.open += 1;
        let mut buf = self.spare.take();
        buf.resize(len as usize, 0);
        Ok(buf)
    }

    /// The next bytes of the message under way that are complete, in order, ahead of the
    /// rest, for reading a message as a stream; the message's hash is checked when it ends,
    /// and a mismatch is then an error where the reader reaches it.
    pub(crate) fn take_ready(&mut self) -> Option<Vec<u8>> {
        let msg = self.msg.as_mut()?;
        if !msg.joined.is_empty() {
            msg.streamed = true;
            return Some(std::mem::take(&mut msg.joined));
        }
        let part = msg.ready.pop_front()?;
        msg.streamed = true;
        Some(part)
    }

    /// Whether the message under way was partly taken with [`Self::take_ready`].
    pub(crate) fn streaming(&self) -> bool {
        self.msg.as_ref().is_some_and(|m| m.streamed)
    }

    /// A request: open or refine the segment, answer what the store holds, fetch those chunks.
    pub(crate) fn on_request<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
        level: u8,
        end: Option<MessageEnd>,
        chunks: &[(u32, ChunkId)],
    ) -> Result<()> {
        let l = level as usize;
        if l >= self.cfg.levels.len() {
            return Err(protocol(format!(
                "request for level {level}; the agreed configuration has {} levels",
                self.cfg.levels.len()
            )));
        }
        let pieces: Vec<InPiece>;
        if level == 0 {
            let total: u64 = chunks.iter().map(|c| u64::from(c.0)).sum();
            let buf = self.open_segment(seg, total, end)?;
            let mut off = 0;
            pieces = chunks
                .iter()
                .map(|&(len, id)| {
                    let p = InPiece {
                        off,
                        len: len as usize,
                        id,
                    };
                    off += len as usize;
                    p
                })
                .collect();
            self.segs.insert(
                seg,
                InSeg {
                    buf,
                    levels: Vec::new(),
                    missing: Vec::new(),
                    data_pos: 0,
                    pending: 0,
                    needs: HashSet::new(),
                    refined: Vec::new(),
                    busy: Duration::ZERO,
                },
            );
        } else {
            let s = self.segs.get_mut(&seg).ok_or_else(|| {
                protocol(format!("level {level} request for unknown segment {seg}"))
            })?;
            if end.is_some() || s.levels.len() != l || s.data_pos > 0 || s.missing.is_empty() {
                return Err(protocol(format!(
                    "level {level} request for segment {seg} out of order"
                )));
            }
            let parents = &s.levels[l - 1];
            let mut out = Vec::with_capacity(chunks.len());
            let mut next = chunks.iter();
            for &i in &s.missing {
                let p = parents[i as usize];
                let mut covered = 0;
                while covered < p.len {
                    let &(len, id) = next.next().ok_or_else(|| {
                        protocol(format!(
                            "level {level} of segment {seg} does not cover the chunks it refines"
                        ))
                    })?;
                    let len = len as usize;
                    if len > p.len - covered {
                        return Err(protocol(format!(
                            "level {level} of segment {seg} crosses a chunk boundary of level {}",
                            level - 1
                        )));
                    }
                    out.push(InPiece {
                        off: p.off + covered,
                        len,
                        id,
                    });
                    covered += len;
                }
            }
            if next.next().is_some() {
                return Err(protocol(format!(
                    "level {level} of segment {seg} has more chunks than it refines"
                )));
            }
            s.pending -= s.missing.len();
            let refined = s.missing.iter().map(|&i| (level - 1, i));
            s.refined.extend(refined);
            pieces = out;
        }
        let ids: Vec<ChunkId> = pieces.iter().map(|p| p.id).collect();
        let bits = self.store.contains_many(&ids)?;
        if bits.len() != ids.len() {
            return Err(Error::Store(crate::store::StoreError::Refused(format!(
                "contains_many answered {} times for {} ids",
                bits.len(),
                ids.len()
            ))));
        }
        link.send(&Message::Have {
            seg,
            level,
            bits: bits.clone(),
        })?;
        let s = self.segs.get_mut(&seg).expect("opened above");
        s.missing = (0..pieces.len() as u32)
            .filter(|&i| !bits[i as usize])
            .collect();
        s.pending += pieces.len();
        let mut wants = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            if !bits[i] {
                continue;
            }
            match get_intact(&*self.store, &p.id)? {
                Some(b) if b.len() == p.len => {
                    s.buf[p.off..p.off + p.len].copy_from_slice(&b);
                    s.pending -= 1;
                }
                _ => wants.push((level, i as u32)),
            }
        }
        s.levels.push(pieces);
        self.need(link, stats, seg, wants)?;
        self.check_complete(link, stats, seg)
    }

    fn need<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
        wants: Vec<(u8, u32)>,
    ) -> Result<()> {
        if wants.is_empty() {
            return Ok(());
        }
        let s = self.segs.get_mut(&seg).expect("caller checked");
        s.needs.extend(wants.iter().copied());
        stats.chunks_needed += wants.len() as u64;
        link.send(&Message::Need { seg, wants })
    }

    fn decompress(packed: Packed<'_>, what: &str) -> Result<Vec<u8>> {
        Compression::decompress(packed.method, packed.body, packed.raw_len as usize)
            .map_err(|e| protocol(format!("{what}: {e}")))
    }

    /// Checks `bytes` against piece `(level, index)` of `seg`, places them and keeps them.
    fn fill(&mut self, seg: u64, level: u8, index: u32, bytes: &[u8]) -> Result<()> {
        let s = self.segs.get_mut(&seg).expect("caller checked");
        let p = s.levels[level as usize][index as usize];
        if bytes.len() != p.len {
            return Err(protocol(format!(
                "chunk {index} of level {level} of segment {seg} arrived with {} bytes, {} were \
                 announced",
                bytes.len(),
                p.len
            )));
        }
        if self.cfg.identifier.identify(bytes) != p.id {
            return Err(Error::Integrity(format!(
                "chunk {index} of level {level} of segment {seg} does not match its id {:?}",
                p.id
            )));
        }
        s.buf[p.off..p.off + p.len].copy_from_slice(bytes);
        s.pending -= 1;
        self.store.put(&p.id, bytes)?;
        Ok(())
    }

    /// Missing chunks, literal or delta.
    pub(crate) fn on_data<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
        packed: Packed<'_>,
    ) -> Result<()> {
        if !self.segs.contains_key(&seg) {
            return Err(protocol(format!("DATA for unknown segment {seg}")));
        }
        let body = Self::decompress(packed, "DATA body")?;
        let entries = decode_entries(&body, &link.limits)?;
        let mut wants = Vec::new();
        for e in entries {
            let s = self.segs.get_mut(&seg).expect("checked above");
            let level = (s.levels.len() - 1) as u8;
            let Some(&index) = s.missing.get(s.data_pos) else {
                return Err(protocol(format!(
                    "DATA for segment {seg} has more entries than chunks are missing"
                )));
            };
            s.data_pos += 1;
            let len = s.levels[level as usize][index as usize].len;
            let (bases, delta, zstd) = match e {
                Entry::Literal(b) => {
                    self.fill(seg, level, index, &b)?;
                    continue;
                }
                Entry::Delta { base, delta } => (vec![base], delta, false),
                Entry::ZDelta { bases, delta } => (bases, delta, true),
            };
            let Some(src) = self.joined(&bases)? else {
                wants.push((level, index));
                continue;
            };
            let mut out = Vec::with_capacity(len);
            let decoded = if zstd {
                ZstdRef::new(ZDELTA_LEVEL).decode(&src, &delta, len, &mut out)
            } else {
                self.codec.decode(&src, &delta, len, &mut out)
            };
            decoded.map_err(|e| protocol(format!("delta for segment {seg}: {e}")))?;
            self.fill(seg, level, index, &out)?;
        }
        self.need(link, stats, seg, wants)?;
        self.check_complete(link, stats, seg)
    }

    /// The bytes of `bases` joined in order, or `None` when the store lacks one of them.
    fn joined(&self, bases: &[ChunkId]) -> Result<Option<Vec<u8>>> {
        let mut src = Vec::new();
        for b in bases {
            match get_intact(&*self.store, b)? {
                Some(bytes) if bases.len() == 1 => return Ok(Some(bytes)),
                Some(bytes) => src.extend_from_slice(&bytes),
                None => return Ok(None),
            }
        }
        Ok(Some(src))
    }

    /// A chunk sent whole after a NEED.
    pub(crate) fn on_raw<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
        level: u8,
        index: u32,
        bytes: &[u8],
    ) -> Result<()> {
        let asked = self
            .segs
            .get_mut(&seg)
            .is_some_and(|s| s.needs.remove(&(level, index)));
        if !asked {
            return Err(protocol(format!(
                "RAW chunk {index} of level {level} of segment {seg}, which was not asked for"
            )));
        }
        self.fill(seg, level, index, bytes)?;
        self.check_complete(link, stats, seg)
    }

    /// A whole segment, compressed: placed, acknowledged, and then, when the sender indexed
    /// it too, its chunks kept for later messages (after the ACK, so that keeping them does
    /// not count against plain sending).
    pub(crate) fn on_plain<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
        (end, keep): (Option<MessageEnd>, bool),
        packed: Packed<'_>,
    ) -> Result<()> {
        if packed.raw_len as usize > self.cfg.segment_size {
            return Err(protocol(format!(
                "plain segment {seg} has {} bytes, more than the agreed segment size",
                packed.raw_len
            )));
        }
        let data = Self::decompress(packed, "PLAIN segment")?;
        self.open_segment(seg, data.len() as u64, end)?;
        let kept = keep.then(|| data.clone());
        self.segs.insert(
            seg,
            InSeg {
                buf: data,
                levels: Vec::new(),
                missing: Vec::new(),
                data_pos: 0,
                pending: 0,
                needs: HashSet::new(),
                refined: Vec::new(),
                busy: Duration::ZERO,
            },
        );
        self.check_complete(link, stats, seg)?;
        if let Some(data) = kept {
            self.keep_chunks(&data)?;
        }
        Ok(())
    }

    /// Cuts `data` at every level and keeps each chunk, as a dedup segment would have left them:
    /// the finest level whole, each coarser chunk as a recipe of the chunks it was cut into.
    fn keep_chunks(&self, data: &[u8]) -> Result<()> {
        let mut levels: Vec<Vec<(usize, usize, ChunkId)>> = Vec::new();
        let mut spans = vec![(0usize, data.len())];
        let mut lens = Vec::new();
        for chunker in &self.cfg.levels {
            let mut next = Vec::new();
            for &(off, len) in &spans {
                lens.clear();
                chunker.cut(&data[off..off + len], &mut lens);
                let mut o = off;
                for &l in &lens {
                    next.push((o, l, self.cfg.identifier.identify(&data[o..o + l])));
                    o += l;
                }
            }
            spans = next.iter().map(|&(o, l, _)| (o, l)).collect();
            levels.push(next);
        }
        let Some(finest) = levels.last() else {
            return Ok(());
        };
        for &(o, l, id) in finest {
            self.store.put(&id, &data[o..o + l])?;
        }
        for pair in levels.windows(2).rev() {
            let (coarse, fine) = (&pair[0], &pair[1]);
            for &(o, l, id) in coarse {
                let parts = parts_of(fine, o, l, |p| (p.0, p.2));
                self.keep_refined(&id, &data[o..o + l], &parts)?;
            }
        }
        Ok(())
    }

    /// Keeps a chunk whose parts at the next level are kept already: as their recipe where the
    /// store takes one, else whole.
    fn keep_refined(&self, id: &ChunkId, bytes: &[u8], parts: &[ChunkId]) -> Result<()> {
        if !self.store.put_recipe(id, bytes.len() as u64, parts)? {
            self.store.put(id, bytes)?;
        }
        Ok(())
    }

    /// Adds `spent` on a frame of segment `seg` to its busy time, unless it is done (its
    /// ACK then counted the frame).
    pub(crate) fn charge(&mut self, seg: u64, spent: Duration) {
        if let Some(s) = self.segs.get_mut(&seg) {
            s.busy += spent;
        }
    }

    /// A busy time as an ACK reports it, in microseconds.
    fn micros(busy: Duration) -> u32 {
        busy.as_micros().min(u128::from(u32::MAX)) as u32
    }

    fn check_complete<S: Read + Write>(
        &mut self,
        link: &mut Link<S>,
        stats: &mut ChannelStats,
        seg: u64,
    ) -> Result<()> {
        let complete = self
            .segs
            .get(&seg)
            .is_some_and(|s| s.pending == 0 && s.needs.is_empty() && s.data_pos == s.missing.len());
        if !complete {
            return Ok(());
        }
        let s = self.segs.remove(&seg).expect("checked");
        let (ident, buf) = (&self.cfg.identifier, &s.buf);
        let refined_bytes = s
            .refined
            .iter()
            .map(|&(level, index)| s.levels[level as usize][index as usize].len)
            .sum();
        let ids = parallel::map(&s.refined, refined_bytes, |&(level, index)| {
            let p = s.levels[level as usize][index as usize];
            ident.identify(&buf[p.off..p.off + p.len])
        });
        // Finest first: a chunk's recipe may then name the recipes of its refined parts.
        for (&(level, index), id) in s.refined.iter().zip(ids).rev() {
            let p = s.levels[level as usize][index as usize];
            let bytes = &s.buf[p.off..p.off + p.len];
            if id != p.id {
                return Err(Error::Integrity(format!(
                    "chunk {index} of level {level} of segment {seg} does not match its id {:?} \
                     once rebuilt from its parts",
                    p.id
                )));
            }
            let parts = s
                .levels
                .get(level as usize + 1)
                .map(|next| parts_of(next, p.off, p.len, |q| (q.off, q.id)))
                .unwrap_or_default();
            self.keep_refined(&p.id, bytes, &parts)?;
        }
        let busy = s.busy + self.frame_started.map_or(Duration::ZERO, |t| t.elapsed());
        let msg = self.msg.as_mut().expect("a segment belongs to a message");
        msg.finish(seg, s.buf, &mut self.spare);
        msg.open -= 1;
        let last = msg.last.map(|(l, _)| l);
        if last != Some(seg) {
            link.send(&Message::Ack {
                seg,
                busy_us: Self::micros(busy),
            })?;
        } else {
            msg.last_busy = busy;
        }
        if let (Some((last, end)), 0) = (msg.last, msg.open) {
            let msg = self.msg.take().expect("checked");
            if msg.hasher.finalize().as_bytes() != &end.hash {
                return Err(Error::Integrity(format!(
                    "the reconstructed message ({} bytes) does not match its hash",
                    msg.len
                )));
            }
            link.send(&Message::Ack {
                seg: last,
                busy_us: Self::micros(msg.last_busy),
            })?;
            stats.messages_received += 1;
            stats.message_bytes_received += msg.len;
            if msg.streamed {
                self.done.extend(msg.ready.into_iter().map(Arrived::Rest));
            } else {
                let mut bytes = msg.joined;
                bytes.shrink_to_fit();
                self.done.push_back(Arrived::Message(bytes));
            }
        }
        Ok(())
    }
}

/// The ids of the chunks of `next` (sorted by offset; `key` gives a chunk's offset and id) that
/// lie in the `len` bytes at `off`.
fn parts_of<T>(
    next: &[T],
    off: usize,
    len: usize,
    key: impl Fn(&T) -> (usize, ChunkId),
) -> Vec<ChunkId> {
    let from = next.partition_point(|q| key(q).0 < off);
    next[from..]
        .iter()
        .map(&key)
        .take_while(|&(o, _)| o < off + len)
        .map(|(_, id)| id)
        .collect()
}
