//! The channel's messages and their byte layout (`dedupwire-channel` versions 1 and 2; version
//! 2 adds DATA entries that are zstd deltas against one or two chunks).
//!
//! ```text
//! sender     REQUEST 0x20  a segment's chunk ids at one level
//!            DATA    0x22  the chunks the receiver lacks: literal or delta, compressed
//!            PLAIN   0x23  a whole segment, compressed, no dedup (adaptive fallback)
//!            RAW     0x25  one chunk whole, the answer to NEED
//! receiver   HAVE    0x21  a bitmap: which ids of a REQUEST the receiver holds
//!            NEED    0x24  chunks it cannot rebuild after all (evicted, or a lost delta base)
//!            ACK     0x26  a segment is rebuilt and stored; for a message's last segment,
//!                          the whole message matched its hash
//! ```
//!
//! Both ends send and receive, so each end writes both columns. The layouts are in
//! `crates/wire/FORMAT.md`; the decoder takes untrusted bytes and checks every length
//! against what is left and against the caller's limits before allocating.

use dedupwire_engine::varint;

use crate::error::{Error, Result};
use crate::frame::FrameType;
use crate::store::ChunkId;

/// A segment's chunk ids at one level.
pub const REQUEST: FrameType = FrameType(0x20);
/// Which ids of a request the receiver holds.
pub const HAVE: FrameType = FrameType(0x21);
/// Missing chunks, literal or delta, compressed.
pub const DATA: FrameType = FrameType(0x22);
/// A whole segment compressed, without dedup.
pub const PLAIN: FrameType = FrameType(0x23);
/// Chunks the receiver asks for whole.
pub const NEED: FrameType = FrameType(0x24);
/// One chunk whole.
pub const RAW: FrameType = FrameType(0x25);
/// A segment (or a whole message) is rebuilt and verified.
pub const ACK: FrameType = FrameType(0x26);

/// Segment flag: the message ends with this segment; its length and hash follow.
pub const FLAG_LAST: u8 = 1;
/// PLAIN flag: the sender indexed this segment's chunks; the receiver should keep them.
pub const FLAG_KEEP: u8 = 2;

/// Raw bytes of entries a sender gathers into one DATA frame before compressing it; a body
/// may exceed it by one entry.
pub const DATA_FRAME: usize = 4 << 20;

/// The protocol name in the hello.
pub const PROTOCOL: &str = "dedupwire-channel";
/// The newest protocol version this build speaks.
pub const VERSION: u16 = 2;
/// The oldest protocol version this build speaks: a version-1 peer gets no zstd deltas.
pub const MIN_VERSION: u16 = 1;
/// The first version with zstd deltas ([`Entry::ZDelta`]).
pub const ZDELTA_VERSION: u16 = 2;
/// The most chunks a zstd delta's source joins.
pub const MAX_ZDELTA_BASES: usize = 2;

/// Where a message ends: its total length and BLAKE3 hash, carried by its last segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageEnd {
    /// The message's length in bytes.
    pub len: u64,
    /// BLAKE3-256 of the whole message.
    pub hash: [u8; 32],
}

/// One entry of a DATA body: how one missing chunk travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The chunk's bytes.
    Literal(Vec<u8>),
    /// A delta (engine `Sampled` format) against a chunk the receiver holds.
    Delta {
        /// The base chunk's id.
        base: ChunkId,
        /// The delta bytes.
        delta: Vec<u8>,
    },
    /// A delta (engine `ZstdRef` format: zstd with the source as its prefix) against the
    /// concatenation of chunks the receiver holds, in order (version 2): on binaries, whose
    /// changes are many small ones, it is smaller than a copy/insert delta compressed.
    ZDelta {
        /// The base chunks' ids, 1 to [`MAX_ZDELTA_BASES`].
        bases: Vec<ChunkId>,
        /// The delta bytes.
        delta: Vec<u8>,
    },
}

/// A channel message (one frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A segment's chunks at `level`: (length, id) in stream order. At level 0 they cover the
    /// segment; at a deeper level they replace, in order, the chunks the receiver lacked.
    Request {
        /// Segment number, consecutive per direction from 0.
        seg: u64,
        /// Chunking level, 0 = coarsest.
        level: u8,
        /// Set at level 0 of a message's last segment.
        end: Option<MessageEnd>,
        /// The chunks.
        chunks: Vec<(u32, ChunkId)>,
    },
    /// One bit per chunk of the request, set when the receiver holds it.
    Have {
        /// Segment number.
        seg: u64,
        /// The level answered.
        level: u8,
        /// The bits.
        bits: Vec<bool>,
    },
    /// Compressed entries for the next missing chunks of a segment, in order.
    Data {
        /// Segment number.
        seg: u64,
        /// Compression method tag (engine `Compression::tag`).
        method: u8,
        /// Length of the body once decompressed.
        raw_len: u32,
        /// The compressed body (see [`encode_entries`]).
        body: Vec<u8>,
    },
    /// A whole segment, compressed.
    Plain {
        /// Segment number.
        seg: u64,
        /// Set on a message's last segment.
        end: Option<MessageEnd>,
        /// The sender indexed the segment's chunks: the receiver keeps them for later dedup.
        keep: bool,
        /// Compression method tag.
        method: u8,
        /// The segment's length.
        raw_len: u32,
        /// The compressed bytes.
        body: Vec<u8>,
    },
    /// Chunks to send whole: (level, index in that level's request).
    Need {
        /// Segment number.
        seg: u64,
        /// The chunks.
        wants: Vec<(u8, u32)>,
    },
    /// One chunk whole.
    Raw {
        /// Segment number.
        seg: u64,
        /// Its level.
        level: u8,
        /// Its index in that level's request.
        index: u32,
        /// Its bytes.
        bytes: Vec<u8>,
    },
    /// Segment `seg` is complete (and, for a last segment, its message verified).
    Ack {
        /// Segment number.
        seg: u64,
        /// Microseconds the receiver spent working since its previous ACK: lets the sender
        /// tell a slow receiver from a slow link.
        busy_us: u32,
    },
}

/// What a decoder accepts: sizes agreed in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of an id on the wire (1..=32).
    pub id_len: usize,
    /// The largest segment (and so chunk, and decompressed body).
    pub max_segment: usize,
}

impl Message {
    /// The frame type that carries this message.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Message::Request { .. } => REQUEST,
            Message::Have { .. } => HAVE,
            Message::Data { .. } => DATA,
            Message::Plain { .. } => PLAIN,
            Message::Need { .. } => NEED,
            Message::Raw { .. } => RAW,
            Message::Ack { .. } => ACK,
        }
    }

    /// Appends the payload to `out`; ids are cut to `id_len` bytes.
    pub fn encode(&self, id_len: usize, out: &mut Vec<u8>) {
        match self {
            Message::Request {
                seg,
                level,
                end,
                chunks,
            } => {
                out.extend_from_slice(&seg.to_le_bytes());
                out.push(*level);
                put_flags(out, end, false);
                varint::put(out, chunks.len() as u64);
                for (len, id) in chunks {
                    varint::put(out, u64::from(*len));
                    out.extend_from_slice(&id.0[..id_len]);
                }
            }
            Message::Have { seg, level, bits } => {
                out.extend_from_slice(&seg.to_le_bytes());
                out.push(*level);
                varint::put(out, bits.len() as u64);
                for byte in bits.chunks(8) {
                    out.push(
                        byte.iter()
                            .enumerate()
                            .fold(0u8, |b, (i, &set)| b | (u8::from(set) << i)),
                    );
                }
            }
            Message::Data {
                seg,
                method,
                raw_len,
                body,
            } => {
                out.extend_from_slice(&seg.to_le_bytes());
                out.push(*method);
                varint::put(out, u64::from(*raw_len));
                out.extend_from_slice(body);
            }
            Message::Plain {
                seg,
                end,
                keep,
                method,
                raw_len,
                body,
            } => {
                out.extend_from_slice(&seg.to_le_bytes());
                put_flags(out, end, *keep);
                out.push(*method);
                varint::put(out, u64::from(*raw_len));
                out.extend_from_slice(body);
            }
            Message::Need { seg, wants } => {
                out.extend_from_slice(&seg.to_le_bytes());
                varint::put(out, wants.len() as u64);
                for (level, index) in wants {
                    out.push(*level);
                    varint::put(out, u64::from(*index));
                }
            }
            Message::Raw {
                seg,
                level,
                index,
                bytes,
            } => {
                out.extend_from_slice(&seg.to_le_bytes());
                out.push(*level);
                varint::put(out, u64::from(*index));
                out.extend_from_slice(bytes);
            }
            Message::Ack { seg, busy_us } => {
                out.extend_from_slice(&seg.to_le_bytes());
                out.extend_from_slice(&busy_us.to_le_bytes());
            }
        }
    }

    /// Parses the payload of a frame of type `kind`; `Ok(None)` when `kind` is not a channel
    /// message.
    pub fn decode(kind: FrameType, payload: &[u8], limits: &Limits) -> Result<Option<Message>> {
        let mut r = Reader::new(payload, kind);
        let id_len = limits.id_len.clamp(1, 32);
        let max = limits.max_segment;
        let m = match kind {
            REQUEST => {
                let seg = r.u64()?;
                let level = r.u8()?;
                let (end, _) = r.flags(0)?;
                let count = r.count(1 + id_len)?;
                let mut chunks = Vec::with_capacity(count);
                for _ in 0..count {
                    let len = r.len(max)?;
                    if len == 0 {
                        return Err(r.bad("a chunk of length 0"));
                    }
                    let mut id = [0u8; 32];
                    id[..id_len].copy_from_slice(r.take(id_len)?);
                    chunks.push((len as u32, ChunkId(id)));
                }
                Message::Request {
                    seg,
                    level,
                    end,
                    chunks,
                }
            }
            HAVE => {
                let seg = r.u64()?;
                let level = r.u8()?;
                let remaining = r.remaining();
                let count = r.len(remaining.saturating_mul(8))?;
                let bytes = r.take(count.div_ceil(8))?;
                let bits: Vec<bool> = (0..count)
                    .map(|i| bytes[i / 8] >> (i % 8) & 1 == 1)
                    .collect();
                if count % 8 != 0 && bytes[count / 8] >> (count % 8) != 0 {
                    return Err(r.bad("bits set past the end of the bitmap"));
                }
                Message::Have { seg, level, bits }
            }
            DATA => {
                let seg = r.u64()?;
                let method = r.u8()?;
                let raw_len = r.len(max.saturating_add(DATA_FRAME + 64))? as u32;
                Message::Data {
                    seg,
                    method,
                    raw_len,
                    body: r.rest().to_vec(),
                }
            }
            PLAIN => {
                let seg = r.u64()?;
                let (end, keep) = r.flags(FLAG_KEEP)?;
                let method = r.u8()?;
                let raw_len = r.len(max)? as u32;
                Message::Plain {
                    seg,
                    end,
                    keep,
                    method,
                    raw_len,
                    body: r.rest().to_vec(),
                }
            }
            NEED => {
                let seg = r.u64()?;
                let count = r.count(2)?;
                let mut wants = Vec::with_capacity(count);
                for _ in 0..count {
                    let level = r.u8()?;
                    let index = r.len(u32::MAX as usize)? as u32;
                    wants.push((level, index));
                }
                Message::Need { seg, wants }
            }
            RAW => {
                let seg = r.u64()?;
                let level = r.u8()?;
                let index = r.len(u32::MAX as usize)? as u32;
                let bytes = r.rest();
                if bytes.len() > max {
                    return Err(r.bad("a chunk longer than a segment"));
                }
                Message::Raw {
                    seg,
                    level,
                    index,
                    bytes: bytes.to_vec(),
                }
            }
            ACK => Message::Ack {
                seg: r.u64()?,
                busy_us: u32::from_le_bytes(r.take(4)?.try_into().expect("4 bytes")),
            },
            _ => return Ok(None),
        };
        if r.remaining() != 0 {
            return Err(r.bad("trailing bytes"));
        }
        Ok(Some(m))
    }
}

fn put_flags(out: &mut Vec<u8>, end: &Option<MessageEnd>, keep: bool) {
    out.push(if end.is_some() { FLAG_LAST } else { 0 } | if keep { FLAG_KEEP } else { 0 });
    if let Some(e) = end {
        out.extend_from_slice(&e.len.to_le_bytes());
        out.extend_from_slice(&e.hash);
    }
}

/// Appends the DATA body for `entries` (before compression).
///
/// ```text
/// entry = 0x00 len:varint bytes            a literal chunk
///       | 0x01 base:id_len bytes len:varint delta   a delta against chunk `base`
///       | 0x02 n:u8 n*(base:id_len bytes) len:varint delta
///                                           a zstd delta against the n bases joined
///                                           (version 2; 1 <= n <= MAX_ZDELTA_BASES)
/// ```
pub fn encode_entries<'a>(
    entries: impl IntoIterator<Item = EntryRef<'a>>,
    id_len: usize,
    out: &mut Vec<u8>,
) {
    for e in entries {
        e.encode(id_len, out);
    }
}

/// A borrowed [`Entry`], for encoding without copying chunk bytes.
#[derive(Debug, Clone, Copy)]
pub enum EntryRef<'a> {
    /// The chunk's bytes.
    Literal(&'a [u8]),
    /// A delta against `base`.
    Delta(&'a ChunkId, &'a [u8]),
    /// A zstd delta against `bases` joined.
    ZDelta(&'a [ChunkId], &'a [u8]),
}

impl EntryRef<'_> {
    /// Appends this entry's encoding to a DATA body.
    pub fn encode(&self, id_len: usize, out: &mut Vec<u8>) {
        match self {
            EntryRef::Literal(b) => {
                out.push(0);
                varint::put(out, b.len() as u64);
                out.extend_from_slice(b);
            }
            EntryRef::Delta(base, d) => {
                out.push(1);
                out.extend_from_slice(&base.0[..id_len]);
                varint::put(out, d.len() as u64);
                out.extend_from_slice(d);
            }
            EntryRef::ZDelta(bases, d) => {
                out.push(2);
                out.push(bases.len() as u8);
                for b in *bases {
                    out.extend_from_slice(&b.0[..id_len]);
                }
                varint::put(out, d.len() as u64);
                out.extend_from_slice(d);
            }
        }
    }
}

/// Parses a decompressed DATA body into its entries.
pub fn decode_entries(body: &[u8], limits: &Limits) -> Result<Vec<Entry>> {
    let id_len = limits.id_len.clamp(1, 32);
    let mut r = Reader::new(body, DATA);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        match r.u8()? {
            0 => {
                let len = r.len(limits.max_segment)?;
                out.push(Entry::Literal(r.take(len)?.to_vec()));
            }
            1 => {
                let mut id = [0u8; 32];
                id[..id_len].copy_from_slice(r.take(id_len)?);
                let len = r.len(limits.max_segment)?;
                out.push(Entry::Delta {
                    base: ChunkId(id),
                    delta: r.take(len)?.to_vec(),
                });
            }
            2 => {
                let n = r.u8()? as usize;
                if !(1..=MAX_ZDELTA_BASES).contains(&n) {
                    return Err(r.bad(&format!(
                        "a zstd delta names {n} bases; 1..={MAX_ZDELTA_BASES} are possible"
                    )));
                }
                let mut bases = Vec::with_capacity(n);
                for _ in 0..n {
                    let mut id = [0u8; 32];
                    id[..id_len].copy_from_slice(r.take(id_len)?);
                    bases.push(ChunkId(id));
                }
                let len = r.len(limits.max_segment)?;
                out.push(Entry::ZDelta {
                    bases,
                    delta: r.take(len)?.to_vec(),
                });
            }
            k => return Err(r.bad(&format!("unknown data entry kind {k}"))),
        }
    }
    Ok(out)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    kind: FrameType,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], kind: FrameType) -> Self {
        Reader {
            bytes,
            pos: 0,
            kind,
        }
    }

    fn bad(&self, what: &str) -> Error {
        Error::Protocol(format!(
            "malformed channel message (frame type 0x{:02x}) at byte {}: {what}",
            self.kind.0, self.pos
        ))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.bad(&format!("{n} bytes wanted, {} left", self.remaining())));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn rest(&mut self) -> &'a [u8] {
        let s = &self.bytes[self.pos..];
        self.pos = self.bytes.len();
        s
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn len(&mut self, limit: usize) -> Result<usize> {
        let at = self.pos;
        varint::get_len(self.bytes, &mut self.pos, limit, "channel message").map_err(|e| {
            self.pos = at;
            self.bad(&e.to_string())
        })
    }

    /// A count of items each at least `min_item` bytes long: bounded by what is left.
    fn count(&mut self, min_item: usize) -> Result<usize> {
        let limit = self.remaining() / min_item.max(1);
        self.len(limit)
    }

    /// The segment flags (besides [`FLAG_LAST`], only those in `allowed`) and the end.
    fn flags(&mut self, allowed: u8) -> Result<(Option<MessageEnd>, bool)> {
        let f = self.u8()?;
        if f & !(FLAG_LAST | allowed) != 0 {
            return Err(self.bad(&format!("unknown segment flags 0x{f:02x}")));
        }
        let end = if f & FLAG_LAST != 0 {
            let len = self.u64()?;
            let hash = self.take(32)?.try_into().expect("32 bytes");
            Some(MessageEnd { len, hash })
        } else {
            None
        };
        Ok((end, f & FLAG_KEEP != 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits {
        id_len: 32,
        max_segment: 1 << 20,
    };

    fn id(b: u8) -> ChunkId {
        ChunkId([b; 32])
    }

    fn arb_id() -> impl Strategy<Value = ChunkId> {
        any::<[u8; 32]>().prop_map(ChunkId)
    }

    fn arb_end() -> impl Strategy<Value = Option<MessageEnd>> {
        proptest::option::of(
            (any::<u64>(), any::<[u8; 32]>()).prop_map(|(len, hash)| MessageEnd { len, hash }),
        )
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (
                any::<u64>(),
                any::<u8>(),
                arb_end(),
                proptest::collection::vec((1u32..1 << 20, arb_id()), 0..20)
            )
                .prop_map(|(seg, level, end, chunks)| Message::Request {
                    seg,
                    level,
                    end,
                    chunks
                }),
            (
                any::<u64>(),
                any::<u8>(),
                proptest::collection::vec(any::<bool>(), 0..70)
            )
                .prop_map(|(seg, level, bits)| Message::Have { seg, level, bits }),
            (
                any::<u64>(),
                any::<u8>(),
                0u32..1 << 20,
                proptest::collection::vec(any::<u8>(), 0..50)
            )
                .prop_map(|(seg, method, raw_len, body)| Message::Data {
                    seg,
                    method,
                    raw_len,
                    body
                }),
            (
                any::<u64>(),
                arb_end(),
                any::<bool>(),
                any::<u8>(),
                0u32..1 << 20,
                proptest::collection::vec(any::<u8>(), 0..50)
            )
                .prop_map(|(seg, end, keep, method, raw_len, body)| Message::Plain {
                    seg,
                    end,
                    keep,
                    method,
                    raw_len,
                    body
                }),
            (
                any::<u64>(),
                proptest::collection::vec((any::<u8>(), any::<u32>()), 0..20)
            )
                .prop_map(|(seg, wants)| Message::Need { seg, wants }),
            (
                any::<u64>(),
                any::<u8>(),
                any::<u32>(),
                proptest::collection::vec(any::<u8>(), 0..50)
            )
                .prop_map(|(seg, level, index, bytes)| Message::Raw {
                    seg,
                    level,
                    index,
                    bytes
                }),
            (any::<u64>(), any::<u32>()).prop_map(|(seg, busy_us)| Message::Ack { seg, busy_us }),
        ]
    }

    proptest! {
        #[test]
        fn messages_round_trip(m in arb_message()) {
            let mut buf = Vec::new();
            m.encode(32, &mut buf);
            let back = Message::decode(m.frame_type(), &buf, &LIMITS).unwrap().unwrap();
            prop_assert_eq!(back, m.clone());
            for cut in 0..buf.len() {
                let r = Message::decode(m.frame_type(), &buf[..cut], &LIMITS);
                // A cut Data/Plain/Raw body still parses (its body is "the rest"), but never
                // to the same message.
                if let Ok(Some(x)) = r { prop_assert_ne!(x, m.clone()); }
            }
        }

        #[test]
        fn garbage_never_panics(kind in 0x20u8..0x28, bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Message::decode(FrameType(kind), &bytes, &LIMITS);
            let _ = decode_entries(&bytes, &LIMITS);
        }

        #[test]
        fn entries_round_trip(lits in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8)) {
            let mut buf = Vec::new();
            let base = id(7);
            let pair = [id(8), id(9)];
            for (i, l) in lits.iter().enumerate() {
                let e = match i % 4 {
                    0 => EntryRef::Literal(l),
                    1 => EntryRef::Delta(&base, l),
                    2 => EntryRef::ZDelta(&pair[..1], l),
                    _ => EntryRef::ZDelta(&pair, l),
                };
                e.encode(16, &mut buf);
            }
            let limits = Limits { id_len: 16, max_segment: 1 << 20 };
            let back = decode_entries(&buf, &limits).unwrap();
            prop_assert_eq!(back.len(), lits.len());
            let short = |c: &ChunkId| {
                let mut b = [0u8; 32];
                b[..16].copy_from_slice(&c.0[..16]);
                ChunkId(b)
            };
            for (i, (e, l)) in back.iter().zip(&lits).enumerate() {
                let want = match i % 4 {
                    0 => Entry::Literal(l.clone()),
                    1 => Entry::Delta { base: short(&base), delta: l.clone() },
                    2 => Entry::ZDelta { bases: vec![short(&pair[0])], delta: l.clone() },
                    _ => Entry::ZDelta { bases: pair.iter().map(short).collect(), delta: l.clone() },
                };
                prop_assert_eq!(e, &want);
            }
        }
    }

    #[test]
    fn short_ids_travel_short() {
        let m = Message::Request {
            seg: 1,
            level: 0,
            end: None,
            chunks: vec![(
                5,
                ChunkId({
                    let mut a = [0u8; 32];
                    a[..16].fill(9);
                    a
                }),
            )],
        };
        let mut buf = Vec::new();
        m.encode(16, &mut buf);
        assert_eq!(buf.len(), 8 + 1 + 1 + 1 + 1 + 16);
        let limits = Limits {
            id_len: 16,
            max_segment: 1 << 20,
        };
        assert_eq!(Message::decode(REQUEST, &buf, &limits).unwrap().unwrap(), m);
    }

    #[test]
    fn a_zstd_delta_names_one_or_two_bases() {
        let limits = Limits {
            id_len: 16,
            max_segment: 1 << 20,
        };
        for n in [0u8, 3, 255] {
            let mut body = vec![2, n];
            body.extend_from_slice(&[7; 16 * 3]);
            body.push(0);
            let e = decode_entries(&body, &limits).unwrap_err().to_string();
            assert!(e.contains("bases"), "{n}: {e}");
        }
        let mut body = Vec::new();
        EntryRef::ZDelta(&[id(1), id(2)], b"xyz").encode(16, &mut body);
        assert_eq!(body.len(), 1 + 1 + 2 * 16 + 1 + 3);
        assert!(
            decode_entries(&body[..body.len() - 1], &limits).is_err(),
            "cut short"
        );
    }

    #[test]
    fn lying_counts_are_refused_before_allocating() {
        let mut buf = 0u64.to_le_bytes().to_vec();
        buf.push(0);
        buf.push(0);
        varint::put(&mut buf, u64::MAX >> 1);
        let e = Message::decode(REQUEST, &buf, &LIMITS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exceeds limit"), "{e}");
        let mut have = 0u64.to_le_bytes().to_vec();
        have.push(0);
        varint::put(&mut have, 9);
        have.extend_from_slice(&[0xff, 0x03]);
        assert!(
            Message::decode(HAVE, &have, &LIMITS).is_err(),
            "bit past the end"
        );
        assert_eq!(
            Message::decode(FrameType(0x10), b"", &LIMITS).unwrap(),
            None
        );
        let _ = id(0);
    }
}
