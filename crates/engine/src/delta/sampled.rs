//! Our xdelta-style codec (sDedup §3.3): a sampled source index, a hash of the window at
//! every target offset, matches verified and extended forward and backward, and a compact
//! stream of copy/insert sequences.
//!
//! # Format
//!
//! All integers are LEB128 unsigned varints.
//!
//! ```text
//! delta    := target_len sequence*
//! sequence := insert_len insert_bytes[insert_len] ( copy_len copy_delta )?
//! ```
//!
//! The decoder reads sequences until it has produced `target_len` bytes: each starts with
//! `insert_len` literal bytes (possibly none), and, unless the target is then complete, a copy
//! of `copy_len >= 1` bytes from the source. The copy's source offset is stored relative to
//! where the previous copy ended (0 at the start), zigzag-encoded (`copy_delta = zigzag(offset
//! - previous_end)`), so that copies walking through the source in order cost one byte each.
//! Nothing may follow the last sequence. An empty target is the single byte `0`.
//!
//! # Encoder
//!
//! The source is indexed at every `stride`-th offset (and its last window) by a hash of the
//! `window` bytes there, in a table of about four slots per entry, first occurrence kept.
//! Sources shorter than `stride * MIN_SAMPLES` get a finer interval, since sampling only
//! loses little while the interval is much smaller than the source (sDedup §3.3); sources
//! past 2^22 entries a coarser one, so the table stays within 32 MiB. The target is hashed at
//! every offset. Candidates at each offset are the index's hit and two continuations of the
//! previous copy (same diagonal: a substitution; same source offset: an insertion); each is
//! verified, extended backward into the pending insert bytes and forward as far as source and
//! target agree, and the one reaching furthest wins. The next few offsets are probed too (a
//! whole interval after a match shorter than 256 bytes): a hit on a common window elsewhere in
//! the source (tar headers, lines that differ in a digit) must not hide the real
//! continuation, so a later match reaching at least two windows further takes over, the head
//! of the first kept as a copy of its own. A common run of at least `window + stride - 1`
//! bytes is thus found whole, unless the slots of its sampled windows went to others (about
//! one in eight). A tail shorter than a window that ends like the source is copied too.
//!
//! A big source's table misses the caches on every lookup, and so does the source where an
//! entry points. Each entry therefore holds a tag of its window's hash beside the offset, so
//! that a target window landing on another window's slot (most of them) is turned away
//! without reading the source, and the slots of the next offsets are prefetched, all at once
//! after a jump over a match. Neither changes a byte of output; on a rebuilt 61 MB shared
//! library (pyarrow's `libarrow.so`, `dedupwire-bench delta`, set `binary`) the encoder went
//! from 78 to 194 MB/s (two runs back to back).
//!
//! Defaults, from `dedupwire-bench delta --sweep` (windows 8..32 x strides 8..64 on document
//! revisions, changed package files and a release tarball): a 16-byte window gives the
//! smallest *batch-compressed* deltas (8-byte windows save raw bytes with many short copies,
//! which then recompress worse: +14% on the RFC stream, +28% on the tarball), and a 16-byte
//! stride instead of sDedup's 32 makes raw deltas 1-8% smaller (0.4-3% once compressed) for
//! an encoder up to 30% slower, still at 0.9-3 GB/s.

use std::cell::RefCell;

use super::DeltaCodec;
use crate::{varint, Error, Result};

/// The default hashed window, in bytes.
pub const DEFAULT_WINDOW: usize = 16;
/// The default source sampling interval, in bytes (sDedup uses 32; see the module docs).
pub const DEFAULT_STRIDE: usize = 16;

/// Sources shorter than `stride * MIN_SAMPLES` are indexed at a finer interval.
pub const MIN_SAMPLES: usize = 128;

/// The index table has at most 2^MAX_TABLE_BITS slots of 4 bytes (32 MiB).
const MAX_TABLE_BITS: u32 = 23;
/// Tables up to this many slots (1 MiB) are kept for the thread's next call.
const KEEP_TABLE_SLOTS: usize = 1 << 18;

/// Sampled source index, forward/backward match extension, copy/insert instructions.
///
/// `Sampled::default()` uses [`DEFAULT_WINDOW`] and [`DEFAULT_STRIDE`]; other parameters
/// change only which matches the encoder finds, never the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampled {
    window: usize,
    stride: usize,
}

impl Default for Sampled {
    fn default() -> Self {
        Sampled {
            window: DEFAULT_WINDOW,
            stride: DEFAULT_STRIDE,
        }
    }
}

/// Windows the encoder supports (each has its own monomorphized hash).
pub const WINDOWS: [usize; 5] = [8, 12, 16, 24, 32];

impl Sampled {
    /// A codec hashing `window` bytes (one of [`WINDOWS`]) at every `stride`-th source offset
    /// (1..=1024).
    pub fn with_params(window: usize, stride: usize) -> Result<Self> {
        if !WINDOWS.contains(&window) {
            return Err(Error::Config(format!(
                "delta window {window} is not one of {WINDOWS:?}"
            )));
        }
        if !(1..=1024).contains(&stride) {
            return Err(Error::Config(format!(
                "delta stride {stride} is not in 1..=1024"
            )));
        }
        Ok(Sampled { window, stride })
    }

    /// The hashed window, in bytes.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The source sampling interval, in bytes.
    pub fn stride(&self) -> usize {
        self.stride
    }
}

thread_local! {
    /// The source index's hash table, reused across calls on one thread.
    static TABLE: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

impl DeltaCodec for Sampled {
    fn encode(&self, source: &[u8], target: &[u8], out: &mut Vec<u8>) {
        TABLE.with(|t| {
            // Re-entrance cannot happen (encode calls nothing that encodes), but stay total.
            let mut owned = Vec::new();
            let mut guard = t.try_borrow_mut();
            let table = match guard.as_deref_mut() {
                Ok(table) => table,
                Err(_) => &mut owned,
            };
            match self.window {
                8 => encode_w::<8>(source, target, self.stride, table, out),
                12 => encode_w::<12>(source, target, self.stride, table, out),
                24 => encode_w::<24>(source, target, self.stride, table, out),
                32 => encode_w::<32>(source, target, self.stride, table, out),
                _ => encode_w::<16>(source, target, self.stride, table, out),
            }
            // Keep a small table for the next call; give a large one back.
            if table.capacity() > KEEP_TABLE_SLOTS {
                *table = Vec::new();
            }
        })
    }

    fn decode(&self, source: &[u8], delta: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<()> {
        let start = out.len();
        let res = decode(source, delta, limit, out);
        if res.is_err() {
            out.truncate(start);
        }
        res
    }
}

#[inline(always)]
fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

const K1: u64 = 0x9E37_79B9_7F4A_7C15;
const K2: u64 = 0xC2B2_AE3D_27D4_EB4F;

/// Hash of `b[at..at + W]` (W >= 8); [`Index`] takes a window's slot and tag from it.
#[inline(always)]
fn hash_w<const W: usize>(b: &[u8], at: usize) -> u64 {
    let w = &b[at..at + W];
    let mut h = read_u64(w, 0).wrapping_mul(K1);
    let mut off = 8;
    while off < W {
        // The last word may overlap the previous one (W = 12): still exactly the window.
        let o = off.min(W - 8);
        h = (h ^ read_u64(w, o)).rotate_left(23).wrapping_mul(K2);
        off += 8;
    }
    h
}

/// Target offsets ahead of the probe whose table slot is prefetched: a table for a big
/// source (up to 32 MiB) misses the caches on nearly every lookup.
const PREFETCH: usize = 16;

/// Length of the common prefix of `a` and `b`.
#[inline]
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    while i + 8 <= n {
        let x = read_u64(a, i) ^ read_u64(b, i);
        if x != 0 {
            return i + (x.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Length of the common suffix of `a` and `b`.
#[inline]
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut k = 0;
    while k + 8 <= n {
        let x = read_u64(a, n - k - 8) ^ read_u64(b, n - k - 8);
        if x != 0 {
            return k + (x.leading_zeros() / 8) as usize;
        }
        k += 8;
    }
    while k < n && a[n - k - 1] == b[n - k - 1] {
        k += 1;
    }
    k
}

#[inline]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Bits of a table entry holding the sampled offset's number (`offset / stride + 1`, or
/// [`LAST`] for the source's last window); the bits above hold the window's tag.
const ENTRY_BITS: u32 = MAX_TABLE_BITS;
/// The entry number of the source's last window (which is off the stride).
const LAST: u32 = (1 << ENTRY_BITS) - 1;

/// How a window's hash maps into the table: a slot (its top bits) and a tag (the bits below),
/// kept in the entry beside the offset. A lookup whose tag differs is known to miss without
/// reading the source: on a big source both the table and the source miss the caches, and
/// most slots a target window lands on hold some other window.
#[derive(Clone, Copy)]
struct Index {
    /// The slot is the hash's top `64 - shift` bits.
    shift: u32,
    /// The sampling interval.
    stride: usize,
    /// Offset of the source's last window.
    last: usize,
}

impl Index {
    #[inline(always)]
    fn slot(&self, h: u64) -> usize {
        (h >> self.shift) as usize
    }

    #[inline(always)]
    fn tag(&self, h: u64) -> u32 {
        ((h >> (self.shift - (32 - ENTRY_BITS))) as u32) << ENTRY_BITS
    }

    /// The table entry for source offset `p`, a window hashing to `h`.
    #[inline(always)]
    fn entry(&self, p: usize, h: u64) -> u32 {
        let n = if p == self.last && !p.is_multiple_of(self.stride) {
            LAST
        } else {
            (p / self.stride + 1) as u32
        };
        n | self.tag(h)
    }

    /// The sampled source offset plus one whose window may equal a window hashing to `h`
    /// (0: none).
    #[inline(always)]
    fn lookup(&self, table: &[u32], h: u64) -> usize {
        let e = table[self.slot(h)];
        if e == 0 || e & !LAST != self.tag(h) {
            return 0;
        }
        match e & LAST {
            LAST => self.last + 1,
            n => (n as usize - 1) * self.stride + 1,
        }
    }
}

/// Builds the sampled index of `source` into `table`.
fn build_index<const W: usize>(source: &[u8], stride: usize, table: &mut Vec<u32>) -> Index {
    // Sources past 4 GiB are indexed only in their first 4 GiB (the rest is still reachable
    // by forward extension).
    let indexable = source.len().min(u32::MAX as usize - 1);
    // Small sources get a finer interval, so that each has at least about MIN_SAMPLES
    // entries: sampling loses little only while the interval is much smaller than the source.
    // Huge ones get a coarser one, so that the table stays within 2^MAX_TABLE_BITS slots and
    // still covers the whole source (and entry numbers fit their bits).
    let mut stride = stride.min(indexable / MIN_SAMPLES).max(1);
    if indexable >= W {
        stride = stride.max((indexable - W) / (1 << (MAX_TABLE_BITS - 1)) + 1);
    }
    let entries = if indexable >= W {
        (indexable - W) / stride + 1
    } else {
        0
    };
    // About four slots per entry (two at the cap), at least 128.
    let bits = (entries.max(32) * 4)
        .next_power_of_two()
        .trailing_zeros()
        .min(MAX_TABLE_BITS);
    let slots = 1usize << bits;
    table.clear();
    table.resize(slots, 0);
    let index = Index {
        shift: 64 - bits,
        stride,
        last: indexable.saturating_sub(W),
    };
    if entries == 0 {
        return index;
    }
    let insert = |table: &mut [u32], p: usize| {
        let h = hash_w::<W>(source, p);
        let slot = &mut table[index.slot(h)];
        if *slot == 0 {
            *slot = index.entry(p, h);
        }
    };
    let mut p = 0;
    while p + W <= indexable {
        let ahead = p + PREFETCH * stride;
        if ahead + W <= indexable {
            crate::hint::prefetch(table, index.slot(hash_w::<W>(source, ahead)));
        }
        insert(table, p);
        p += stride;
    }
    // The last window too, so that a source's tail is found like its head.
    insert(table, index.last);
    index
}

/// Appends a sequence: `insert`, then a copy of `len` bytes at source `s0`.
#[inline]
fn emit(out: &mut Vec<u8>, insert: &[u8], s0: usize, len: usize, last_end: &mut usize) {
    put_insert(out, insert);
    varint::put(out, len as u64);
    varint::put(out, zigzag(s0 as i64 - *last_end as i64));
    *last_end = s0 + len;
}

/// Appends one sequence's insert part.
#[inline]
fn put_insert(out: &mut Vec<u8>, bytes: &[u8]) {
    varint::put(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Positions probed after a match for a better one (lazy matching).
const LAZY: usize = 4;
/// Matches shorter than this get a whole sampling interval of lazy probes.
const SHORT: usize = 256;

/// A verified match: `len` bytes at source `s0` equal to target `t0`.
#[derive(Clone, Copy)]
struct Match {
    len: usize,
    s0: usize,
    t0: usize,
}

/// The longest match through target offset `i` among the index's candidate and the
/// continuations of the previous copy (ending at source `last_end`), extended backward no
/// further than `pending`; candidates on `skip`'s diagonal are known already.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn probe<const W: usize>(
    source: &[u8],
    target: &[u8],
    table: &[u32],
    index: &Index,
    i: usize,
    pending: usize,
    last_end: usize,
    skip: Option<&Match>,
) -> Option<Match> {
    let win = &target[i..i + W];
    let hashed = index.lookup(table, hash_w::<W>(target, i));
    // Candidates: the index's, and the continuations of the previous copy after a
    // substitution (same diagonal) or an insertion (the source resumes where it ended).
    let cands = [
        hashed.wrapping_sub(1),
        last_end + (i - pending),
        if i > pending { last_end } else { usize::MAX },
    ];
    let mut best: Option<Match> = None;
    for (k, &s) in cands.iter().enumerate() {
        if s.checked_add(W).is_none_or(|e| e > source.len())
            || cands[..k].contains(&s)
            || skip.is_some_and(|m| m.s0.wrapping_sub(m.t0) == s.wrapping_sub(i))
            || source[s..s + W] != *win
        {
            continue;
        }
        // Extend backward into the pending insert bytes, then forward.
        let back = common_suffix(&source[..s], &target[pending..i]);
        let fwd = common_prefix(&source[s + W..], &target[i + W..]);
        let len = back + W + fwd;
        let end = i + W + fwd;
        if best.is_none_or(|b| (end, len) > (b.t0 + b.len, b.len)) {
            best = Some(Match {
                len,
                s0: s - back,
                t0: i - back,
            });
        }
    }
    best
}

fn encode_w<const W: usize>(
    source: &[u8],
    target: &[u8],
    stride: usize,
    table: &mut Vec<u32>,
    out: &mut Vec<u8>,
) {
    varint::put(out, target.len() as u64);
    if target.is_empty() {
        return;
    }
    if source.len() < W || target.len() < W {
        put_insert(out, target);
        return;
    }
    let index = build_index::<W>(source, stride, table);
    let stride = index.stride;
    let table = &table[..];
    let mut pending = 0; // start of the bytes not yet emitted
    let mut last_end = 0usize; // source end of the previous copy
    let mut i = 0;
    let end = target.len() - W; // last offset with a full window
    let mut prefetched = 0; // offsets below this had their slot prefetched
    while i <= end {
        // After a jump over a match, the slots of the next offsets all at once: the misses
        // overlap instead of following each other.
        prefetched = prefetched.max(i);
        while prefetched <= end.min(i + PREFETCH) {
            crate::hint::prefetch(table, index.slot(hash_w::<W>(target, prefetched)));
            prefetched += 1;
        }
        let Some(mut best) = probe::<W>(source, target, table, &index, i, pending, last_end, None)
        else {
            i += 1;
            continue;
        };
        // Lazy matching: a match found a little later may reach further (a hit on a common
        // window elsewhere in the source can hide the real continuation). A short match may
        // be a repeat on the wrong diagonal (lines that differ in a digit): look a whole
        // interval ahead, where the index has a sampled offset of any longer match.
        let mut ahead = i + if best.len < SHORT {
            stride.max(LAZY)
        } else {
            LAZY
        };
        let mut j = i + 1;
        while j <= end && j <= ahead && j < best.t0 + best.len {
            let found = probe::<W>(
                source,
                target,
                table,
                &index,
                j,
                pending,
                last_end,
                Some(&best),
            );
            j += 1;
            let Some(m) = found else { continue };
            let (m_end, b_end) = (m.t0 + m.len, best.t0 + best.len);
            if m.t0 <= best.t0 {
                // Covers all that `best` does.
                if m_end > b_end {
                    best = m;
                }
                continue;
            }
            // Starts later: worth it only if it reaches far enough further to pay for the
            // head of `best`, which is emitted as a copy of its own.
            if m_end < b_end + 2 * W {
                continue;
            }
            emit(
                out,
                &target[pending..best.t0],
                best.s0,
                m.t0 - best.t0,
                &mut last_end,
            );
            pending = m.t0;
            best = m;
            ahead = j - 1
                + if best.len < SHORT {
                    stride.max(LAZY)
                } else {
                    LAZY
                };
        }
        emit(
            out,
            &target[pending..best.t0],
            best.s0,
            best.len,
            &mut last_end,
        );
        i = best.t0 + best.len;
        pending = i;
    }
    if pending < target.len() {
        // The tail may still end like the source ("}\n", "</html>"), in fewer bytes than
        // a window: copy that if it is longer than the copy costs.
        let tail = &target[pending..];
        let k = common_suffix(source, tail);
        let d = zigzag((source.len() - k) as i64 - last_end as i64);
        if k >= 4 && k > 1 + varint_len(d) {
            put_insert(out, &tail[..tail.len() - k]);
            varint::put(out, k as u64);
            varint::put(out, d);
        } else {
            put_insert(out, tail);
        }
    }
}

/// Bytes of `v` as a varint.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn decode(source: &[u8], delta: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<()> {
    const WHAT: &str = "delta";
    let mut pos = 0;
    let target_len = varint::get_len(delta, &mut pos, limit, WHAT)?;
    // Bound the reservation by what this delta could possibly produce (every two bytes a
    // copy of the whole source, plus its literal bytes), so a lying header with a generous
    // `limit` cannot make us allocate more than the delta can fill.
    let most = (delta.len() as u128) + (delta.len() as u128 / 2) * (source.len() as u128);
    if target_len as u128 > most {
        return Err(Error::corrupt(
            WHAT,
            0,
            format!("target length {target_len} is more than this delta can produce"),
        ));
    }
    out.try_reserve(target_len)
        .map_err(|e| Error::corrupt(WHAT, 0, format!("cannot reserve {target_len} bytes: {e}")))?;
    let mut left = target_len;
    let mut last_end = 0usize;
    while left > 0 {
        let at = pos;
        let ins = varint::get_len(delta, &mut pos, left, WHAT)?;
        let Some(bytes) = delta.get(pos..pos + ins) else {
            return Err(Error::corrupt(
                WHAT,
                at,
                format!("insert of {ins} bytes truncated"),
            ));
        };
        out.extend_from_slice(bytes);
        pos += ins;
        left -= ins;
        if left == 0 {
            break;
        }
        let at = pos;
        let len = varint::get_len(delta, &mut pos, left, WHAT)?;
        if len == 0 {
            return Err(Error::corrupt(WHAT, at, "copy of zero bytes"));
        }
        let d = unzigzag(varint::get(delta, &mut pos, WHAT)?);
        let off = (last_end as i64)
            .checked_add(d)
            .filter(|&o| o >= 0)
            .map(|o| o as u64);
        let range = off.and_then(|o| {
            let o = usize::try_from(o).ok()?;
            let e = o.checked_add(len)?;
            (e <= source.len()).then_some(o..e)
        });
        let Some(range) = range else {
            return Err(Error::corrupt(
                WHAT,
                at,
                format!(
                    "copy of {len} bytes at {last_end}{d:+} is outside the {}-byte source",
                    source.len()
                ),
            ));
        };
        last_end = range.end;
        out.extend_from_slice(&source[range]);
        left -= len;
    }
    if pos != delta.len() {
        return Err(Error::corrupt(
            WHAT,
            pos,
            format!("{} bytes of trailing garbage", delta.len() - pos),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(c: &Sampled, s: &[u8], t: &[u8]) -> Vec<u8> {
        let mut d = Vec::new();
        c.encode(s, t, &mut d);
        let mut back = vec![7u8];
        c.decode(s, &d, t.len(), &mut back).unwrap();
        assert_eq!(&back[1..], t);
        d
    }

    #[test]
    fn helpers() {
        assert_eq!(common_prefix(b"abcdefghijkXm", b"abcdefghijkYm"), 11);
        assert_eq!(common_suffix(b"Xbcdefghijklm", b"Ybcdefghijklm"), 12);
        assert_eq!(common_suffix(b"", b"abc"), 0);
        for v in [0i64, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn all_windows_round_trip() {
        let s: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut t = s.clone();
        t.splice(100..110, *b"hello");
        t.splice(3000..3000, *b"inserted here!");
        for w in WINDOWS {
            for stride in [1, 7, 32] {
                let c = Sampled::with_params(w, stride).unwrap();
                let d = round(&c, &s, &t);
                assert!(
                    d.len() < 60,
                    "window {w} stride {stride}: {} bytes",
                    d.len()
                );
            }
        }
        assert!(Sampled::with_params(10, 32).is_err());
        assert!(Sampled::with_params(16, 0).is_err());
    }

    #[test]
    fn index_interval_adapts_to_source_size() {
        let mut table = Vec::new();
        // Small: at least MIN_SAMPLES entries.
        assert_eq!(
            build_index::<16>(&[1; 1000], 16, &mut table).stride,
            1000 / MIN_SAMPLES
        );
        assert_eq!(build_index::<16>(&[1; 100], 16, &mut table).stride, 1);
        assert_eq!(build_index::<16>(&[1; 1 << 20], 16, &mut table).stride, 16);
        // Huge: at most 2^22 entries in a table of 2^23 slots.
        let stride = build_index::<16>(&vec![1; 5 << 20], 1, &mut table).stride;
        assert_eq!(stride, 2);
        assert_eq!(table.len(), 1 << MAX_TABLE_BITS);
    }

    #[test]
    fn entries_find_their_windows_and_turn_others_away() {
        let mut x = 1u64;
        let mut noise = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        };
        let source = noise((3 << 20) + 5);
        let mut table = Vec::new();
        let index = build_index::<16>(&source, 16, &mut table);
        let sampled: Vec<usize> = (0..=index.last).step_by(16).chain([index.last]).collect();
        let (mut found, mut wrong) = (0, 0);
        for &p in &sampled {
            match index.lookup(&table, hash_w::<16>(&source, p)) {
                0 => {}
                q if q - 1 == p => found += 1,
                // Another window in the slot whose tag happens to agree (1 in 512).
                _ => wrong += 1,
            }
        }
        assert!(
            found * 10 > sampled.len() * 8,
            "{found} of {}",
            sampled.len()
        );
        assert!(
            wrong * 200 < sampled.len(),
            "{wrong} lookups point elsewhere"
        );
        assert_eq!(
            index.lookup(&table, hash_w::<16>(&source, index.last)),
            index.last + 1
        );
        // Windows the source lacks: the tag turns nearly all away.
        let other = noise(1 << 20);
        let passed = (0..other.len() - 16)
            .filter(|&p| index.lookup(&table, hash_w::<16>(&other, p)) != 0)
            .count();
        assert!(passed * 100 < other.len(), "{passed} false candidates");
    }

    #[test]
    fn small_and_empty() {
        let c = Sampled::default();
        assert_eq!(round(&c, b"", b""), [0]);
        assert_eq!(round(&c, b"abc", b""), [0]);
        assert_eq!(round(&c, b"", b"abc"), [3, 3, b'a', b'b', b'c']);
        round(&c, b"short", b"a target longer than the window size");
        round(&c, b"a source longer than the window size", b"short");
    }
}
