//! The send/serve conversation over a [`DedupStream`]: messages in `crates/sync/FORMAT.md`.
//!
//! 1. The sender sends OFFER: the tree's name, flags (dry run), the files it has not read
//!    (their hashes unknown: it lists a tree without reading it) and its manifest, whole or
//!    as a delta against the manifest it last sent there (from its [`SendCache`]; a receiver
//!    whose tree is another answers RESEND and gets it whole).
//! 2. The receiver asks (QUERY) for the hashes of the unread files it might hold (a file of
//!    its current tree has the same size), which the sender reads to answer (ANSWER); every
//!    other unread file is new to it. So each file is read once: to answer, or to send.
//!    The receiver checks both, reserves the name, compares the manifest to its current tree,
//!    builds what it can locally in staging, and answers PLAN: what changes, which files'
//!    contents it needs (those it finds nowhere in its current tree), in order, and the hash
//!    prefix of its old version of each, where it has one at the same path.
//! 3. The sender sends those contents as DATA messages (pieces of files in order, small files
//!    batched together, big ones split, about `batch_bytes` per message, or 1 MiB and more
//!    as soon as no file is ready to join it), a file as a delta
//!    against its old version when the cache holds that version (zstd with the base as a
//!    reference prefix for big binaries, our codec otherwise; files over
//!    [`WHOLE_MAX`] with ours, segment by segment, see `window`); the receiver writes them
//!    into staging and checks each file's BLAKE3 against the manifest. An unread file is
//!    hashed as it is read, and its hash checked once it is read whole against how it was
//!    listed (inode, size, mtime, ctime: a file changed since is an error).
//!
//! The sender holds a bounded amount whatever the files' sizes: files over [`WHOLE_MAX`]
//! are read in pieces (holes unread), within a read-ahead budget (see `ahead`), and streamed
//! into the channel; the cache keeps them as they are read. A 1 GiB file took 1.39 GB of
//! resident memory to send, 229 MiB since (most of it the channel's store and window).
//! 4. The sender sends COMMIT with the hashes of the unread files it sent; the receiver
//!    checks them against the contents it wrote, swaps the new version in and answers DONE.
//!
//! Either end may send ERROR (text) instead of its next message and stop. Every message
//! travels through the dedup channel, so contents the receiver's chunk store holds (from
//! earlier versions, or from a send that was cut off) cost only their chunk ids: this is what
//! makes an interrupted send resume cheaply, as the store is synced after every session. The
//! exception is a DATA message of deltas only: their bytes are new to the receiver, so they
//! travel compressed without the chunk exchange and neither end keeps them (a cut-off send
//! encodes and sends those deltas again).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupwire_engine::delta::zstd_ref::LDM_FROM;
use dedupwire_engine::delta::{DeltaCodec, Sampled, ZstdRef};

use crate::ahead::{Ahead, Taken};
use dedupwire_wire::{ChannelStats, ChunkStore, DedupStream};

use crate::apply::{Peer, Retired, Source, TreeRoot};
use crate::cache::{SendCache, DELTA_MAX};
use crate::error::{changed_while_sent, io_at, Error, Result};
use crate::manifest::{
    hash_unchanged, hash_zeros, Entry, FileStat, Kind, Manifest, Scan, SparseReader, HASH_THREADS,
};
use crate::plan::{self, Change, Diff};
use crate::window;

/// The session protocol's version (in OFFER).
pub const SESSION_VERSION: u8 = 5;
const OFFER: u8 = b'O';
const QUERY: u8 = b'Q';
const ANSWER: u8 = b'A';
const PLAN: u8 = b'P';
const DATA: u8 = b'D';
const COMMIT: u8 = b'C';
const DONE: u8 = b'K';
const ERROR: u8 = b'E';
const RESEND: u8 = b'R';
/// OFFER's manifest: whole, or a delta against the manifest of the receiver's current tree.
const FORM_FULL: u8 = 0;
const FORM_DELTA: u8 = 1;
/// The longest a sender hashing files for a QUERY goes without sending an ANSWER (its
/// peer's idle timeout is minutes).
const ANSWER_EVERY: Duration = Duration::from_secs(10);
/// The largest manifest a delta may rebuild.
const MANIFEST_MAX: usize = 1 << 30;
const FLAG_DRY_RUN: u8 = 1;
/// DATA piece kinds: a file's next bytes; a part of its delta with more to come, and the
/// last part; the same for a delta made with zstd against the base as a reference prefix.
const PIECE_BYTES: u8 = b'B';
/// A run of zeros of a file: its length (u64) in place of its bytes.
const PIECE_ZEROS: u8 = b'H';
const PIECE_DELTA: u8 = b'd';
const PIECE_DELTA_END: u8 = b'e';
const PIECE_ZDELTA: u8 = b'z';
const PIECE_ZDELTA_END: u8 = b'Z';
/// zstd's level for the deltas of big binaries (see [`Coder::for_file`]): on the binary
/// pair of `dedupwire-bench delta`, level 1 is both faster and smaller than level 3.
const ZSTD_REF_LEVEL: i32 = 1;
/// Bytes looked at to tell a binary: one holding a NUL byte there, as git tells them.
const BINARY_SNIFF: usize = 8000;
/// Bytes of a base's BLAKE3 that name it in PLAN.
const BASE_PREFIX: usize = 8;
/// A delta is sent only when its raw bytes are below this share of the file's.
const DELTA_WORTH: f64 = 0.9;
/// The largest piece of a file in one DATA message.
const MAX_PIECE: usize = 8 << 20;
/// A piece's kind, entry index and length.
const PIECE_HEADER: usize = 9;

/// How a file's delta against its base is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coder {
    /// Our copy/insert codec, whose output compresses further in its DATA batch.
    Sampled,
    /// zstd with the base as a reference prefix (already compressed).
    ZstdRef,
}

impl Coder {
    /// The coder for `data` against `base`: zstd for binaries big enough that it matches
    /// over long distances (below that it misses most of a far base), ours otherwise. On a
    /// rebuilt shared library zstd is faster than ours and smaller than ours compressed
    /// (`dedupwire-bench delta`, the binary pair); on text ours wins, since its deltas
    /// compress further together in their batch.
    fn for_file(base: &[u8], data: &[u8]) -> Coder {
        let head = &data[..data.len().min(BINARY_SNIFF)];
        if base.len() + data.len() > LDM_FROM && head.contains(&0) {
            Coder::ZstdRef
        } else {
            Coder::Sampled
        }
    }

    fn encode(self, base: &[u8], data: &[u8], out: &mut Vec<u8>) {
        match self {
            Coder::Sampled => Sampled::default().encode(base, data, out),
            Coder::ZstdRef => ZstdRef::new(ZSTD_REF_LEVEL).encode(base, data, out),
        }
    }

    fn decode(
        self,
        base: &[u8],
        delta: &[u8],
        limit: usize,
        out: &mut Vec<u8>,
    ) -> dedupwire_engine::Result<()> {
        match self {
            Coder::Sampled => Sampled::default().decode(base, delta, limit, out),
            Coder::ZstdRef => ZstdRef::new(ZSTD_REF_LEVEL).decode(base, delta, limit, out),
        }
    }

    /// The piece kinds of its deltas: every part but the last, the last.
    fn kinds(self) -> (u8, u8) {
        match self {
            Coder::Sampled => (PIECE_DELTA, PIECE_DELTA_END),
            Coder::ZstdRef => (PIECE_ZDELTA, PIECE_ZDELTA_END),
        }
    }

    /// The coder and whether it is the last part, for a delta piece kind.
    fn of_kind(kind: u8) -> Option<(Coder, bool)> {
        match kind {
            PIECE_DELTA => Some((Coder::Sampled, false)),
            PIECE_DELTA_END => Some((Coder::Sampled, true)),
            PIECE_ZDELTA => Some((Coder::ZstdRef, false)),
            PIECE_ZDELTA_END => Some((Coder::ZstdRef, true)),
            _ => None,
        }
    }
}

/// How a send behaves.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Ask what would change; change nothing.
    pub dry_run: bool,
    /// Content bytes per DATA message (the unit the receiver holds in memory).
    pub batch_bytes: usize,
    /// Files up to this size are read whole (a delta against their base made in memory, when
    /// the base is no bigger); bigger ones are streamed in pieces, a delta made segment by
    /// segment against the region of the base around it. At most [`DELTA_MAX`].
    pub whole_file_max: u64,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            dry_run: false,
            batch_bytes: 32 << 20,
            whole_file_max: WHOLE_MAX,
        }
    }
}

/// What a send did (or, dry, would do).
#[derive(Debug, Clone, Default)]
pub struct SendReport {
    /// What changes on the receiver (the path list only for a dry run).
    pub diff: Diff,
    /// Files whose contents travelled (or would).
    pub files_sent: u64,
    /// Their bytes.
    pub bytes_needed: u64,
    /// Bytes read from the source files while sending.
    pub bytes_read: u64,
    /// Bytes read to hash the files the receiver asked about before its plan (it held files
    /// of their sizes).
    pub bytes_hashed: u64,
    /// Files sent as a delta against the version the receiver holds.
    pub files_delta: u64,
    /// Those files' bytes.
    pub bytes_delta_files: u64,
    /// The raw size of their deltas (before the channel's compression).
    pub delta_bytes: u64,
    /// Why the sender's cache could not be used or updated, if it could not (the send itself
    /// does not depend on it).
    pub cache_warning: Option<String>,
    /// The channel's counters.
    pub channel: ChannelStats,
    /// Time from OFFER to DONE.
    pub elapsed: Duration,
}

/// What a receive did.
#[derive(Debug, Clone, Default)]
pub struct ServeReport {
    /// The tree's name.
    pub name: String,
    /// Whether it was a dry run (nothing changed).
    pub dry_run: bool,
    /// What changed.
    pub diff: Diff,
    /// Files written from the sender's bytes.
    pub files_received: u64,
    /// Of those, files rebuilt from a delta against their old version.
    pub files_delta: u64,
    /// Their bytes.
    pub bytes_received: u64,
    /// Whether the name was taken over from a receive whose sender had gone (a send run
    /// again after it was killed).
    pub took_over: bool,
}

fn put_u16(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u16).to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u32).to_le_bytes());
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| {
            Error::Protocol(format!(
                "{} message truncated at byte {}",
                self.what, self.pos
            ))
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<usize> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")) as usize)
    }
    fn u32(&mut self) -> Result<usize> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")) as usize)
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn done(&self) -> bool {
        self.pos == self.buf.len()
    }
}

fn error_message(e: &Error) -> Vec<u8> {
    let mut m = vec![ERROR];
    m.extend_from_slice(e.to_string().as_bytes());
    m
}

/// Turns an ERROR message into [`Error::Remote`], anything else but `want` into a protocol
/// error.
fn expect(msg: &[u8], want: u8, what: &str) -> Result<()> {
    match msg.first() {
        Some(&t) if t == want => Ok(()),
        Some(&ERROR) => Err(Error::Remote(
            String::from_utf8_lossy(&msg[1..]).into_owned(),
        )),
        Some(&t) => Err(Error::Protocol(format!(
            "expected {what}, got a message of type {:?}",
            t as char
        ))),
        None => Err(Error::Protocol(format!(
            "expected {what}, got an empty message"
        ))),
    }
}

/// After the channel failed while sending: the peer's ERROR message if it sent one first.
fn explain<S: Read + Write>(stream: &mut DedupStream<S>, e: dedupwire_wire::Error) -> Error {
    if let Ok(m) = stream.recv() {
        if m.first() == Some(&ERROR) {
            return Error::Remote(String::from_utf8_lossy(&m[1..]).into_owned());
        }
    }
    Error::Channel(e)
}

fn send_msg<S: Read + Write>(stream: &mut DedupStream<S>, m: &[u8]) -> Result<()> {
    stream.send(m).map_err(|e| explain(stream, e))
}

fn recv_msg<S: Read + Write>(stream: &mut DedupStream<S>) -> Result<Vec<u8>> {
    Ok(stream.recv()?)
}

/// Sends the tree at `src` (listed or scanned into `scan`) as `name`; `progress(done,
/// total)` sees the bytes hashed for the receiver's questions, then the content bytes sent,
/// as they go. Returns once the receiver has swapped the new version in; `scan`'s manifest
/// then holds the hash of every file ([`Scan::unread`] is empty), unless it was a dry run.
///
/// Each file is read once: a file [`Scan::unread`] is hashed before the plan only if the
/// receiver holds a file of its size (it may be unchanged, or elsewhere in its tree), else
/// hashed as it is sent, its hash sent with COMMIT.
///
/// With a `cache`, a changed file whose old version (as the receiver names it) the cache
/// holds travels as a delta against it, and every file sent is kept in the cache for next
/// time; the cache failing only costs those savings (see [`SendReport::cache_warning`]).
pub fn send<S: Read + Write>(
    stream: &mut DedupStream<S>,
    src: &Path,
    name: &[u8],
    scan: &mut Scan,
    opts: &SendOptions,
    cache: Option<&SendCache>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SendReport> {
    let started = Instant::now();
    let mut offer = vec![
        OFFER,
        SESSION_VERSION,
        if opts.dry_run { FLAG_DRY_RUN } else { 0 },
    ];
    put_u16(&mut offer, name.len());
    offer.extend_from_slice(name);
    put_u32(&mut offer, scan.unread.len());
    for u in &scan.unread {
        put_u32(&mut offer, u.index);
    }
    let head = offer.len();
    let encoded = scan.manifest.encode();
    match cache.and_then(SendCache::last_manifest) {
        Some(base) => {
            offer.push(FORM_DELTA);
            offer.extend_from_slice(blake3::hash(&base).as_bytes());
            Sampled::default().encode(&base, &encoded, &mut offer);
        }
        None => {
            offer.push(FORM_FULL);
            offer.extend_from_slice(&encoded);
        }
    }
    send_msg(stream, &offer)?;

    let mut plan = recv_msg(stream)?;
    if plan == [RESEND] {
        offer.truncate(head);
        offer.push(FORM_FULL);
        offer.extend_from_slice(&encoded);
        send_msg(stream, &offer)?;
        plan = recv_msg(stream)?;
    }
    drop(offer);
    let mut bytes_hashed = 0;
    if plan.first() == Some(&QUERY) {
        bytes_hashed = answer(stream, src, scan, &plan, progress)?;
        plan = recv_msg(stream)?;
    }
    let manifest = &scan.manifest;
    let (diff, need, bases) = parse_plan(&plan, manifest)?;
    let bytes_needed: u64 = need.iter().map(|&i| manifest.entries[i].size()).sum();
    let mut report = SendReport {
        diff,
        files_sent: need.len() as u64,
        bytes_needed,
        bytes_hashed,
        ..SendReport::default()
    };
    if opts.dry_run {
        report.channel = stream.stats();
        report.elapsed = started.elapsed();
        return Ok(report);
    }

    let mut out = Batcher::new(opts.batch_bytes);
    let mut done = 0u64;
    progress(0, bytes_needed);
    // Reading, hashing and delta encoding run ahead of the channel on up to PRODUCERS
    // threads, file k on thread k % n, within AHEAD_BYTES held (see `ahead`); files sent go
    // into the cache on another thread, off the way to COMMIT and DONE.
    let producers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, PRODUCERS);
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..producers)
        .map(|_| std::sync::mpsc::sync_channel::<Payload>(AHEAD_FILES))
        .unzip();
    let (keep_tx, keep_rx) = std::sync::mpsc::sync_channel::<Kept>(1);
    let ahead = Ahead::new(AHEAD_BYTES, AHEAD_PASS);
    let unread: HashMap<usize, FileStat> = scan.unread.iter().map(|u| (u.index, u.stat)).collect();
    let mut hashed: HashMap<usize, [u8; 32]> = HashMap::new();
    let job = Job {
        src,
        manifest,
        bases: &bases,
        cache,
        whole_max: opts.whole_file_max.min(DELTA_MAX),
        ahead: &ahead,
        unread: &unread,
    };
    std::thread::scope(|scope| -> Result<()> {
        let keeper = scope.spawn(move || {
            let mut warning = None;
            for (hash, data, _taken) in keep_rx {
                if let Some(Err(e)) = cache.map(|c| c.put(&hash, &data)) {
                    warning.get_or_insert_with(|| e.to_string());
                }
            }
            warning
        });
        let handles: Vec<_> = txs
            .into_iter()
            .enumerate()
            .map(|(w, tx)| {
                let keep = cache.is_some().then(|| keep_tx.clone());
                let mine: Vec<(usize, usize)> = need
                    .iter()
                    .copied()
                    .enumerate()
                    .skip(w)
                    .step_by(producers)
                    .collect();
                let job = &job;
                scope.spawn(move || produce(job, &mine, keep, tx))
            })
            .collect();
        drop(keep_tx);
        let mut sent = Ok(());
        let mut files = 0;
        'files: while files < need.len() {
            let rx = &rxs[files % producers];
            ahead.waiting_for(files);
            loop {
                let p = match rx.try_recv() {
                    Ok(p) => p,
                    Err(TryRecvError::Empty) => {
                        // Nothing ready: a batch worth a message goes now, so that the
                        // receiver works while the producers do.
                        if out.len() >= IDLE_FLUSH {
                            if let Err(e) = out.flush(stream) {
                                sent = Err(e);
                                break 'files;
                            }
                        }
                        match rx.recv() {
                            Ok(p) => p,
                            Err(_) => break 'files,
                        }
                    }
                    Err(TryRecvError::Disconnected) => break 'files,
                };
                let (r, end) = match p {
                    Payload::File {
                        index,
                        size,
                        body,
                        delta,
                        ..
                    } => {
                        done += size;
                        let (kind, last) = delta.map_or((PIECE_BYTES, PIECE_BYTES), Coder::kinds);
                        (out.pieces(stream, index, &body, kind, last), true)
                    }
                    Payload::Piece {
                        index, body, last, ..
                    } => {
                        done += body.len() as u64;
                        let r = out.pieces(stream, index, &body, PIECE_BYTES, PIECE_BYTES);
                        (r, last)
                    }
                    Payload::Zeros { index, count, last } => {
                        done += count;
                        (out.zeros(stream, index, count), last)
                    }
                };
                if r.is_err() {
                    sent = r;
                    break 'files;
                }
                progress(done, bytes_needed);
                if end {
                    files += 1;
                    break;
                }
            }
        }
        ahead.close();
        drop(rxs);
        let mut produced = Produced::default();
        let mut failed = None;
        for h in handles {
            match h.join().expect("a producer does not panic") {
                Ok(p) => produced.add(p),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        sent?;
        if let Some(e) = failed {
            return Err(e);
        }
        if files < need.len() {
            return Err(Error::Protocol(format!(
                "{files} of {} files were read for sending",
                need.len()
            )));
        }
        report.bytes_read = produced.bytes_read;
        report.files_delta = produced.files_delta;
        report.bytes_delta_files = produced.bytes_delta_files;
        report.delta_bytes = produced.delta_bytes;
        hashed = produced.hashes;
        let mut commit = vec![COMMIT];
        for i in need.iter().filter(|i| unread.contains_key(i)) {
            let hash = hashed.get(i).ok_or_else(|| {
                Error::Protocol(format!("entry {i} was sent without being hashed"))
            })?;
            commit.extend_from_slice(hash);
        }
        out.flush(stream)?;
        progress(done, bytes_needed);
        send_msg(stream, &commit)?;
        let m = recv_msg(stream)?;
        expect(&m, DONE, "DONE")?;
        report.cache_warning = keeper.join().expect("the keeper does not panic");
        Ok(())
    })?;
    for (&i, h) in &hashed {
        if let Kind::File { hash, .. } = &mut scan.manifest.entries[i].kind {
            *hash = *h;
        }
    }
    scan.unread.retain(|u| !hashed.contains_key(&u.index));
    report.channel = stream.stats();
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Answers the receiver's QUERY: hashes the files it asks about (files of `scan` not read
/// yet), sends their hashes and puts them in the manifest. Returns the bytes read.
fn answer<S: Read + Write>(
    stream: &mut DedupStream<S>,
    src: &Path,
    scan: &mut Scan,
    query: &[u8],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    let mut c = Cursor {
        buf: query,
        pos: 1,
        what: "QUERY",
    };
    let n = c.u32()?;
    let mut asked = Vec::with_capacity(n.min(scan.unread.len()));
    let mut at = 0;
    for _ in 0..n {
        let i = c.u32()?;
        while scan.unread.get(at).is_some_and(|u| u.index < i) {
            at += 1;
        }
        if scan.unread.get(at).is_none_or(|u| u.index != i) {
            return Err(Error::Protocol(format!("QUERY asks for entry {i}")));
        }
        asked.push(scan.unread[at]);
        at += 1;
    }
    if !c.done() {
        return Err(Error::Protocol("bytes after the QUERY".into()));
    }
    let total = asked.iter().map(|u| u.stat.size).sum();
    let read = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    let manifest = &scan.manifest;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, HASH_THREADS)
        .min(asked.len());
    let mut hashes: Vec<Option<[u8; 32]>> = vec![None; asked.len()];
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..threads {
            let tx = tx.clone();
            let (read, next, asked) = (&read, &next, &asked);
            scope.spawn(move || loop {
                let k = next.fetch_add(1, Relaxed);
                let Some(u) = asked.get(k) else { break };
                let path = src.join(manifest.entries[u.index].rel_path());
                let r = hash_unchanged(&path, &u.stat, &mut |n| {
                    read.fetch_add(n, Relaxed);
                });
                if tx.send((k, r)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        // The hashes go in order as they are ready, at least one ANSWER (maybe of none)
        // every ANSWER_EVERY: a long hash does not look like a peer gone.
        let mut sent = 0;
        let mut last = Instant::now();
        while sent < hashes.len() {
            match rx.recv_timeout(ANSWER_EVERY.saturating_sub(last.elapsed())) {
                Ok((k, Ok(h))) => hashes[k] = Some(h),
                Ok((_, Err(e))) => {
                    next.store(asked.len(), Relaxed);
                    return Err(e);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::Protocol("a file asked about was not hashed".into()));
                }
            }
            progress(read.load(Relaxed), total);
            let ready = hashes[sent..].iter().take_while(|h| h.is_some()).count();
            if sent + ready == hashes.len() || last.elapsed() >= ANSWER_EVERY {
                let mut reply = Vec::with_capacity(1 + 32 * ready);
                reply.push(ANSWER);
                for h in hashes[sent..sent + ready].iter().flatten() {
                    reply.extend_from_slice(h);
                }
                send_msg(stream, &reply)?;
                sent += ready;
                last = Instant::now();
            }
        }
        Ok(())
    })?;
    for (u, h) in asked.iter().zip(hashes.into_iter().flatten()) {
        if let Kind::File { hash, .. } = &mut scan.manifest.entries[u.index].kind {
            *hash = h;
        }
    }
    let done: HashSet<usize> = asked.iter().map(|u| u.index).collect();
    scan.unread.retain(|u| !done.contains(&u.index));
    Ok(read.into_inner())
}

/// What the producer hands the channel: a whole file (its contents or its delta), or the
/// next piece of a file too big for either end to hold whole. Each holds its share of the
/// read-ahead budget until dropped.
enum Payload<'a> {
    File {
        index: usize,
        size: u64,
        body: Arc<Vec<u8>>,
        /// How its delta was made, when it travels as one.
        delta: Option<Coder>,
        _taken: Arc<Taken<'a>>,
    },
    Piece {
        index: usize,
        body: Vec<u8>,
        /// Whether it is the file's last piece.
        last: bool,
        _taken: Taken<'a>,
    },
    /// A hole of the file: so many zeros, not read and not sent.
    Zeros {
        index: usize,
        count: u64,
        last: bool,
    },
}

/// What every producer reads from.
#[derive(Clone, Copy)]
struct Job<'a> {
    src: &'a Path,
    manifest: &'a Manifest,
    bases: &'a HashMap<usize, [u8; BASE_PREFIX]>,
    cache: Option<&'a SendCache>,
    /// Files above this are streamed in pieces.
    whole_max: u64,
    ahead: &'a Ahead,
    /// The files whose hash is not known yet, and how they stood when listed.
    unread: &'a HashMap<usize, FileStat>,
}

impl Job<'_> {
    /// The hash of file `i`, read through `f` from `path` and hashed as `got`, if the file
    /// is as it was: the manifest's hash, or for a file not read before, the inode, size and
    /// times it was listed with (then `got` is its hash, noted in `p`).
    fn settle(
        &self,
        i: usize,
        f: &SparseReader,
        path: &Path,
        got: [u8; 32],
        p: &mut Produced,
    ) -> Result<[u8; 32]> {
        match self.unread.get(&i) {
            Some(stat) => {
                if f.stat().map_err(io_at(path))? != *stat {
                    return Err(changed_while_sent(path));
                }
                p.hashes.insert(i, got);
            }
            None => match self.manifest.entries[i].kind {
                Kind::File { hash, .. } if hash == got => {}
                _ => return Err(changed_while_sent(path)),
            },
        }
        Ok(got)
    }

    /// The hash of file `i` if it is known before reading it.
    fn known(&self, i: usize) -> Option<&[u8; 32]> {
        match &self.manifest.entries[i].kind {
            Kind::File { hash, .. } if !self.unread.contains_key(&i) => Some(hash),
            _ => None,
        }
    }
}

/// Files up to this size are read whole by default ([`SendOptions::whole_file_max`]): with
/// a base, a producer holds the file, the base, the delta and the codec's index of the base.
pub const WHOLE_MAX: u64 = 8 << 20;
/// The biggest delta a producer holds for a file encoded segment by segment: a bigger one
/// (a file mostly new) is given up for the file's contents, which the channel deduplicates.
const DELTA_HOLD: usize = 16 << 20;
/// Threads reading and delta-encoding files for the channel, at most.
const PRODUCERS: usize = 2;
/// Bytes of files the producers may hold ahead of the channel.
const AHEAD_BYTES: u64 = 16 << 20;
/// What the file the channel waits for may hold past [`AHEAD_BYTES`]: two pieces.
const AHEAD_PASS: u64 = 2 * MAX_PIECE as u64;
/// Bytes handed to the channel's `Write` at once.
const WRITE_STEP: usize = 1 << 20;
/// A DATA batch at least this long is sent when no file is ready to join it.
const IDLE_FLUSH: usize = 1 << 20;
/// Files each producer may queue ahead of the channel.
const AHEAD_FILES: usize = 64;

impl Produced {
    fn counted_delta(&mut self, size: u64, delta: usize) {
        self.files_delta += 1;
        self.bytes_delta_files += size;
        self.delta_bytes += delta as u64;
    }

    fn add(&mut self, o: Produced) {
        self.bytes_read += o.bytes_read;
        self.files_delta += o.files_delta;
        self.bytes_delta_files += o.bytes_delta_files;
        self.delta_bytes += o.delta_bytes;
        self.hashes.extend(o.hashes);
    }
}

/// A file sent, for the cache: its hash and contents, and their share of the read-ahead budget.
type Kept<'a> = ([u8; 32], Arc<Vec<u8>>, Arc<Taken<'a>>);

/// The producer's counters.
#[derive(Default)]
struct Produced {
    bytes_read: u64,
    files_delta: u64,
    bytes_delta_files: u64,
    delta_bytes: u64,
    /// The hashes of the files not read before, as they were read to be sent.
    hashes: HashMap<usize, [u8; 32]>,
}

/// Reads the files `need` (position in sending order, manifest index) in order, checks them
/// against the manifest, queues them for the cache (`keep`, or kept as they are read),
/// delta-encodes those with a base in the cache and queues them for the channel. Stops early
/// (returning its counters) when the channel side hangs up.
fn produce<'a>(
    job: &Job<'a>,
    need: &[(usize, usize)],
    keep: Option<std::sync::mpsc::SyncSender<Kept<'a>>>,
    tx: std::sync::mpsc::SyncSender<Payload<'a>>,
) -> Result<Produced> {
    let mut p = Produced::default();
    for &(k, i) in need {
        let e = &job.manifest.entries[i];
        let Kind::File { size, .. } = e.kind else {
            unreachable!("checked in parse_plan")
        };
        let path = job.src.join(e.rel_path());
        let prefix = job.bases.get(&i).filter(|_| size <= DELTA_MAX);
        let found = match (job.cache, prefix) {
            (Some(c), Some(prefix)) => c.base_len(prefix).map(|len| (c, prefix, len)),
            _ => None,
        };
        let sent = if size <= job.whole_max {
            let found = found.filter(|&(.., len)| len <= job.whole_max);
            whole(job, (k, i), &path, found, &keep, &tx, &mut p)?
        } else {
            let mut sent = Sent::No;
            if let Some(found) = found {
                sent = windowed(job, (k, i), &path, found, &tx, &mut p)?;
            }
            if sent == Sent::No {
                sent = pieces(job, (k, i), &path, &tx, &mut p)?;
            }
            sent
        };
        if sent == Sent::Stop {
            return Ok(p);
        }
    }
    Ok(p)
}

/// What became of a file: queued for the channel, not sent (try another way), or the
/// channel side is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Yes,
    No,
    Stop,
}

fn open_source(path: &Path) -> Result<SparseReader> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(io_at(path))?;
    Ok(SparseReader::new(f))
}

/// Sends a file read whole, as a delta against `found` (the cache, the base's hash prefix
/// and its length) when that is worth it; the file goes to the cache through `keep`.
fn whole<'a>(
    job: &Job<'a>,
    (k, i): (usize, usize),
    path: &Path,
    found: Option<(&SendCache, &[u8; BASE_PREFIX], u64)>,
    keep: &Option<std::sync::mpsc::SyncSender<Kept<'a>>>,
    tx: &std::sync::mpsc::SyncSender<Payload<'a>>,
    p: &mut Produced,
) -> Result<Sent> {
    let size = job.manifest.entries[i].size();
    // The file, and with a base: the base, the delta and the codec's index of the base.
    let cost = found.map_or(size, |(.., len)| 2 * size + 2 * len);
    let Some(taken) = job.ahead.take(k, cost) else {
        return Ok(Sent::Stop);
    };
    let taken = Arc::new(taken);
    let mut data = vec![0; size as usize];
    let mut f = open_source(path)?;
    read_full(&mut f, path, &mut data, &mut p.bytes_read)?;
    let hash = job.settle(i, &f, path, *blake3::hash(&data).as_bytes(), p)?;
    drop(f);
    let data = Arc::new(data);
    // Into the cache while the delta is encoded, not after: a big file's compression
    // would otherwise be left over when the receiver is done.
    if let Some(keeper) = keep {
        let _ = keeper.send((hash, data.clone(), taken.clone()));
    }
    let base = found.and_then(|(c, prefix, len)| c.base_within(prefix, len));
    let mut delta = Vec::new();
    let mut coder = None;
    if let Some(base) = base {
        let c = Coder::for_file(&base, &data);
        c.encode(&base, &data, &mut delta);
        if (delta.len() as f64) < size as f64 * DELTA_WORTH {
            coder = Some(c);
            p.counted_delta(size, delta.len());
        }
    }
    let body = if coder.is_some() {
        Arc::new(delta)
    } else {
        data
    };
    let sent = tx.send(Payload::File {
        index: i,
        size,
        body,
        delta: coder,
        _taken: taken,
    });
    Ok(if sent.is_ok() { Sent::Yes } else { Sent::Stop })
}

/// Sends a big file as a delta made segment by segment against the region of its base
/// around it ([`crate::window`]), if the delta is worth it and within [`DELTA_HOLD`] (it is
/// held until the file's last byte, to be checked); keeps the file in the cache as it goes.
fn windowed<'a>(
    job: &Job<'a>,
    (k, i): (usize, usize),
    path: &Path,
    (cache, prefix, len): (&SendCache, &[u8; BASE_PREFIX], u64),
    tx: &std::sync::mpsc::SyncSender<Payload<'a>>,
    p: &mut Produced,
) -> Result<Sent> {
    let size = job.manifest.entries[i].size();
    let Some(base) = cache.base_stream(prefix) else {
        return Ok(Sent::No);
    };
    let limit = ((size as f64 * DELTA_WORTH) as usize).min(DELTA_HOLD);
    let Some(taken) = job.ahead.take(k, window::WORKING_BYTES + limit as u64) else {
        return Ok(Sent::Stop);
    };
    let mut f = open_source(path)?;
    let mut kept = cache.writer(job.known(i), size).ok().flatten();
    let mut d = window::WindowedDelta::new(base, len, size, limit);
    let mut h = blake3::Hasher::new();
    let mut segment = vec![0; window::SEGMENT];
    let mut left = size;
    while left > 0 {
        let n = left.min(window::SEGMENT as u64) as usize;
        read_full(&mut f, path, &mut segment[..n], &mut p.bytes_read)?;
        h.update(&segment[..n]);
        if kept
            .as_mut()
            .is_some_and(|w| w.write(&segment[..n]).is_err())
        {
            kept = None;
        }
        left -= n as u64;
        if !d.push(&segment[..n]) {
            return Ok(Sent::No);
        }
    }
    let hash = job.settle(i, &f, path, *h.finalize().as_bytes(), p)?;
    if let Some(w) = kept {
        let _ = w.finish(&hash);
    }
    drop(segment);
    let (delta, base) = d.finish();
    if !base.intact() {
        return Ok(Sent::No);
    }
    p.counted_delta(size, delta.len());
    let sent = tx.send(Payload::File {
        index: i,
        size,
        body: Arc::new(delta),
        delta: Some(Coder::Sampled),
        _taken: Arc::new(taken),
    });
    Ok(if sent.is_ok() { Sent::Yes } else { Sent::Stop })
}

/// Sends a big file's contents in pieces, its holes as runs of zeros, keeping it in the
/// cache as it goes.
fn pieces<'a>(
    job: &Job<'a>,
    (k, i): (usize, usize),
    path: &Path,
    tx: &std::sync::mpsc::SyncSender<Payload<'a>>,
    p: &mut Produced,
) -> Result<Sent> {
    let size = job.manifest.entries[i].size();
    let mut f = open_source(path)?;
    let mut kept = job
        .cache
        .and_then(|c| c.writer(job.known(i), size).ok().flatten());
    let mut h = blake3::Hasher::new();
    let mut left = size;
    while left > 0 {
        let zeros = f.hole(left).map_err(io_at(path))?;
        let mut piece = None;
        if zeros > 0 {
            hash_zeros(&mut h, zeros);
            if kept.as_mut().is_some_and(|w| w.zeros(zeros).is_err()) {
                kept = None;
            }
            left -= zeros;
        } else {
            let run = f
                .data_run(left.min(MAX_PIECE as u64))
                .map_err(io_at(path))?;
            let n = run.max(1).min(left);
            let Some(taken) = job.ahead.take(k, n) else {
                return Ok(Sent::Stop);
            };
            let mut body = vec![0; n as usize];
            read_full(&mut f, path, &mut body, &mut p.bytes_read)?;
            h.update(&body);
            if kept.as_mut().is_some_and(|w| w.write(&body).is_err()) {
                kept = None;
            }
            left -= n;
            piece = Some((body, taken));
        }
        let last = left == 0;
        if last {
            let hash = job.settle(i, &f, path, *h.finalize().as_bytes(), p)?;
            if let Some(w) = kept.take() {
                let _ = w.finish(&hash);
            }
        }
        let payload = match piece {
            Some((body, taken)) => Payload::Piece {
                index: i,
                body,
                last,
                _taken: taken,
            },
            None => Payload::Zeros {
                index: i,
                count: zeros,
                last,
            },
        };
        if tx.send(payload).is_err() {
            return Ok(Sent::Stop);
        }
    }
    Ok(Sent::Yes)
}

/// Fills `buf` from `f`, adding to `disk` what was read from the disk; a file shorter than
/// scanned is an error.
fn read_full(f: &mut SparseReader, path: &Path, buf: &mut [u8], disk: &mut u64) -> Result<()> {
    if !f.read_full(buf, disk).map_err(io_at(path))? {
        return Err(Error::Mismatch(format!(
            "{}: shorter than when it was scanned (changed while being sent)",
            path.display()
        )));
    }
    Ok(())
}

/// DATA messages being filled with pieces, sent when about `limit` bytes long. A message of
/// deltas only is built whole and skips the channel's dedup (its bytes are new to the
/// receiver by construction); one holding contents is streamed through the channel as it
/// fills, from its first contents piece on, so that it is never held whole.
struct Batcher {
    /// The message while it holds only deltas; its first byte only, once it streams.
    batch: Vec<u8>,
    limit: usize,
    /// Bytes of the message streamed so far, once it streams.
    streamed: Option<usize>,
}

impl Batcher {
    fn new(limit: usize) -> Self {
        Batcher {
            batch: vec![DATA],
            limit,
            streamed: None,
        }
    }

    /// The message's length so far.
    fn len(&self) -> usize {
        self.streamed.unwrap_or(self.batch.len())
    }

    /// Content bytes the next piece may carry.
    fn room(&self) -> usize {
        self.limit
            .saturating_sub(self.len() + PIECE_HEADER)
            .max(64 << 10)
    }

    /// Appends `bytes` as pieces of entry `index`: `kind` for each but the last, `last` for
    /// the last; sends the message whenever it is full.
    fn pieces<S: Read + Write>(
        &mut self,
        stream: &mut DedupStream<S>,
        index: usize,
        mut bytes: &[u8],
        kind: u8,
        last: u8,
    ) -> Result<()> {
        if kind == PIECE_BYTES && self.streamed.is_none() {
            stream
                .write_all(&self.batch)
                .map_err(|e| channel_error(stream, e))?;
            self.streamed = Some(self.batch.len());
            self.batch.truncate(1);
        }
        loop {
            let n = bytes.len().min(MAX_PIECE).min(self.room());
            let (head, rest) = bytes.split_at(n);
            let mut header = [0u8; PIECE_HEADER];
            header[0] = if rest.is_empty() { last } else { kind };
            header[1..5].copy_from_slice(&(index as u32).to_le_bytes());
            header[5..].copy_from_slice(&(n as u32).to_le_bytes());
            match &mut self.streamed {
                Some(len) => {
                    // In steps, so that the channel holds little more than a segment.
                    std::iter::once(&header[..])
                        .chain(head.chunks(WRITE_STEP))
                        .try_for_each(|b| stream.write_all(b))
                        .map_err(|e| channel_error(stream, e))?;
                    *len += PIECE_HEADER + n;
                }
                None => {
                    self.batch.extend_from_slice(&header);
                    self.batch.extend_from_slice(head);
                }
            }
            bytes = rest;
            if self.len() + PIECE_HEADER >= self.limit {
                self.flush(stream)?;
            }
            if bytes.is_empty() {
                return Ok(());
            }
        }
    }

    /// Appends a run of `count` zeros of entry `index`; sends the message if it is full.
    fn zeros<S: Read + Write>(
        &mut self,
        stream: &mut DedupStream<S>,
        index: usize,
        count: u64,
    ) -> Result<()> {
        let mut piece = [0u8; PIECE_HEADER + 8];
        piece[0] = PIECE_ZEROS;
        piece[1..5].copy_from_slice(&(index as u32).to_le_bytes());
        piece[5..9].copy_from_slice(&8u32.to_le_bytes());
        piece[9..].copy_from_slice(&count.to_le_bytes());
        match &mut self.streamed {
            Some(len) => {
                stream
                    .write_all(&piece)
                    .map_err(|e| channel_error(stream, e))?;
                *len += piece.len();
            }
            None => self.batch.extend_from_slice(&piece),
        }
        if self.len() + PIECE_HEADER >= self.limit {
            self.flush(stream)?;
        }
        Ok(())
    }

    /// Ends the message (if it has a piece): the channel returns once the receiver has it.
    fn flush<S: Read + Write>(&mut self, stream: &mut DedupStream<S>) -> Result<()> {
        if self.streamed.take().is_some() {
            stream.flush().map_err(|e| channel_error(stream, e))?;
        } else if self.batch.len() > 1 {
            stream
                .send_new(&self.batch)
                .map_err(|e| explain(stream, e))?;
            self.batch.truncate(1);
        }
        Ok(())
    }
}

/// A channel error that came back through `io::Write`, as [`explain`] tells it.
fn channel_error<S: Read + Write>(stream: &mut DedupStream<S>, e: std::io::Error) -> Error {
    use dedupwire_wire::Error as Wire;
    let e = if e.get_ref().is_some_and(|i| i.is::<Wire>()) {
        *e.into_inner()
            .and_then(|i| i.downcast::<Wire>().ok())
            .expect("checked to be a channel error")
    } else {
        Wire::Io(e)
    };
    explain(stream, e)
}

/// The pieces of a DATA message: (kind, entry index, bytes), each checked for a known kind
/// and a length that is neither 0 nor past the message.
pub(crate) fn parse_data(m: &[u8]) -> Result<Vec<(u8, usize, &[u8])>> {
    expect(m, DATA, "DATA")?;
    let mut c = Cursor {
        buf: m,
        pos: 1,
        what: "DATA",
    };
    let mut pieces = Vec::new();
    while !c.done() {
        let kind = c.take(1)?[0];
        if kind != PIECE_BYTES && kind != PIECE_ZEROS && Coder::of_kind(kind).is_none() {
            return Err(Error::Protocol(format!("DATA piece kind {kind:#04x}")));
        }
        let i = c.u32()?;
        let len = c.u32()?;
        let bytes = c.take(len)?;
        if bytes.is_empty() {
            return Err(Error::Protocol("an empty DATA piece".into()));
        }
        if kind == PIECE_ZEROS && (bytes.len() != 8 || bytes == [0; 8]) {
            return Err(Error::Protocol(
                "a DATA run of zeros that is not one count".into(),
            ));
        }
        pieces.push((kind, i, bytes));
    }
    Ok(pieces)
}

type Plan = (Diff, Vec<usize>, HashMap<usize, [u8; BASE_PREFIX]>);

/// Reads PLAN: the diff, the entries to send in order, and the bases the receiver holds.
pub(crate) fn parse_plan(plan: &[u8], manifest: &Manifest) -> Result<Plan> {
    expect(plan, PLAN, "PLAN")?;
    let mut c = Cursor {
        buf: plan,
        pos: 1,
        what: "PLAN",
    };
    let mut diff = Diff {
        files_new: c.u64()?,
        files_changed: c.u64()?,
        files_unchanged: c.u64()?,
        files_deleted: c.u64()?,
        dirs_new: c.u64()?,
        dirs_deleted: c.u64()?,
        changes: Vec::new(),
    };
    let n = c.u32()?;
    let mut need = Vec::with_capacity(n.min(manifest.entries.len()));
    for _ in 0..n {
        let i = c.u32()?;
        let ok = matches!(manifest.entries.get(i), Some(e) if matches!(e.kind, Kind::File { .. }));
        if !ok || need.last().is_some_and(|&l| l >= i) {
            return Err(Error::Protocol(format!("PLAN asks for entry {i}")));
        }
        need.push(i);
    }
    let n = c.u32()?;
    let mut bases = HashMap::with_capacity(n.min(need.len()));
    let mut last = None;
    for _ in 0..n {
        let i = c.u32()?;
        let prefix: [u8; BASE_PREFIX] = c.take(BASE_PREFIX)?.try_into().expect("sized");
        if need.binary_search(&i).is_err() || last.is_some_and(|l| l >= i) {
            return Err(Error::Protocol(format!("PLAN names a base for entry {i}")));
        }
        last = Some(i);
        bases.insert(i, prefix);
    }
    let changes = c.u32()?;
    for _ in 0..changes {
        let sym = c.take(1)?[0];
        let change = match sym {
            b'+' => Change::New,
            b'~' => Change::Changed,
            b'-' => Change::Deleted,
            _ => return Err(Error::Protocol(format!("PLAN change {sym:#04x}"))),
        };
        let len = c.u16()?;
        diff.changes.push((change, c.take(len)?.to_vec()));
    }
    if !c.done() {
        return Err(Error::Protocol("bytes after the PLAN".into()));
    }
    Ok((diff, need, bases))
}

/// Receives one tree into `root` from the sender at the other end of `stream`, then syncs
/// `store` (the channel's chunk store) so that a send cut off now resumes cheaply. Tells the
/// sender why when it fails (unless the channel itself failed).
pub fn serve<S: Read + Write>(
    root: &TreeRoot,
    store: &dyn ChunkStore,
    stream: &mut DedupStream<S>,
) -> Result<ServeReport> {
    serve_on(root, store, stream, None)
}

/// [`serve`] on `peer`'s connection: a later receive of the same name ends this one when
/// `peer` is gone, instead of being refused until this end notices (see
/// [`TreeRoot::lock_as`]).
pub fn serve_on<S: Read + Write>(
    root: &TreeRoot,
    store: &dyn ChunkStore,
    stream: &mut DedupStream<S>,
    peer: Option<Arc<dyn Peer>>,
) -> Result<ServeReport> {
    let mut report = ServeReport::default();
    let r = serve_inner(root, stream, &mut report, peer);
    let synced = store.sync();
    let r = r.and_then(|retired| {
        synced
            .map(|()| retired)
            .map_err(|e| Error::Channel(e.into()))
    });
    if let Err(e) = &r {
        if !matches!(e, Error::Channel(_) | Error::Remote(_)) {
            let _ = stream.send(&error_message(e));
        }
    }
    // The replaced version goes after the sender has its answer and the name is free again.
    if let Some(retired) = r? {
        retired.remove()?;
    }
    Ok(report)
}

fn serve_inner<S: Read + Write>(
    root: &TreeRoot,
    stream: &mut DedupStream<S>,
    report: &mut ServeReport,
    peer: Option<Arc<dyn Peer>>,
) -> Result<Option<Retired>> {
    let offer = recv_msg(stream)?;
    expect(&offer, OFFER, "OFFER")?;
    let mut c = Cursor {
        buf: &offer,
        pos: 1,
        what: "OFFER",
    };
    let version = c.take(1)?[0];
    if version != SESSION_VERSION {
        return Err(Error::Refused(format!(
            "the sender speaks session version {version}; this end speaks {SESSION_VERSION}"
        )));
    }
    let flags = c.take(1)?[0];
    if flags & !FLAG_DRY_RUN != 0 {
        return Err(Error::Protocol(format!("unknown OFFER flags {flags:#04x}")));
    }
    let dry_run = flags & FLAG_DRY_RUN != 0;
    let nlen = c.u16()?;
    let name = c.take(nlen)?.to_vec();
    let count = c.u32()?;
    let mut unread = Vec::with_capacity(count.min(offer.len() / 4));
    for _ in 0..count {
        let i = c.u32()?;
        if unread.last().is_some_and(|&l| l >= i) {
            return Err(Error::Protocol(format!(
                "OFFER lists entry {i} as unread out of order"
            )));
        }
        unread.push(i);
    }
    report.name = String::from_utf8_lossy(&name).into_owned();
    report.dry_run = dry_run;
    let lock = root.lock_as(&name, peer)?;
    report.took_over = lock.took_over();
    let (old, mut verifier) = root.current_checked(&name)?;
    let (head, header) = (c.pos, offer[..c.pos].to_vec());
    let form = c.take(1)?[0];
    let mut new = match form {
        FORM_FULL => Manifest::decode(&offer[c.pos..])?,
        FORM_DELTA => {
            let base_hash = c.take(32)?;
            let base = old.encode();
            if blake3::hash(&base).as_bytes()[..] == *base_hash {
                let mut encoded = Vec::new();
                Sampled::default()
                    .decode(&base, &offer[c.pos..], MANIFEST_MAX, &mut encoded)
                    .map_err(|e| Error::Manifest(format!("its delta: {e}")))?;
                Manifest::decode(&encoded)?
            } else {
                drop(offer);
                stream.send(&[RESEND])?;
                let again = recv_msg(stream)?;
                expect(&again, OFFER, "OFFER")?;
                if again.get(..head) != Some(&header[..]) || again.get(head) != Some(&FORM_FULL) {
                    return Err(Error::Protocol(
                        "the second OFFER is not the first with its whole manifest".into(),
                    ));
                }
                Manifest::decode(&again[head + 1..])?
            }
        }
        _ => return Err(Error::Protocol(format!("OFFER manifest form {form:#04x}"))),
    };
    for &i in &unread {
        match new.entries.get(i).map(|e| &e.kind) {
            Some(&Kind::File { size, hash }) if size > 0 && hash == [0; 32] => {}
            _ => {
                return Err(Error::Protocol(format!(
                    "OFFER lists entry {i} as unread: not a file of at least one byte with \
                     a zero hash"
                )))
            }
        }
    }
    // Unread files that may be here (a file of this tree has their size) are hashed by the
    // sender now; the others are new to this end and hashed as they arrive.
    let sizes: HashSet<u64> = old.entries.iter().map(Entry::size).collect();
    let (asked, unread): (Vec<usize>, Vec<usize>) = unread
        .into_iter()
        .partition(|&i| sizes.contains(&new.entries[i].size()));
    if !asked.is_empty() {
        let mut query = vec![QUERY];
        put_u32(&mut query, asked.len());
        for &i in &asked {
            put_u32(&mut query, i);
        }
        stream.send(&query)?;
        let mut answered = 0;
        while answered < asked.len() {
            let answer = recv_msg(stream)?;
            expect(&answer, ANSWER, "ANSWER")?;
            let n = (answer.len() - 1) / 32;
            if (answer.len() - 1) % 32 != 0 || answered + n > asked.len() {
                return Err(Error::Protocol(format!(
                    "an ANSWER of {} bytes, {answered} of {} files answered before",
                    answer.len(),
                    asked.len()
                )));
            }
            for (&i, h) in asked[answered..].iter().zip(answer[1..].chunks_exact(32)) {
                new.entries[i].kind = Kind::File {
                    size: new.entries[i].size(),
                    hash: h.try_into().expect("32 bytes"),
                };
            }
            answered += n;
        }
    }
    let diff = plan::diff(&old, &new);
    let mut sources = root.resolve(&mut verifier, &old, &new);
    for &i in &unread {
        sources[i] = Source::Sender;
    }
    let mut plan = vec![PLAN];
    for v in [
        diff.files_new,
        diff.files_changed,
        diff.files_unchanged,
        diff.files_deleted,
        diff.dirs_new,
        diff.dirs_deleted,
    ] {
        plan.extend_from_slice(&v.to_le_bytes());
    }
    report.diff = diff;
    let needed: Vec<usize> = sources
        .iter()
        .enumerate()
        .filter(|(_, s)| **s == Source::Sender)
        .map(|(i, _)| i)
        .collect();
    report.files_received = needed.len() as u64;
    report.bytes_received = needed.iter().map(|&i| new.entries[i].size()).sum();
    let put_needed = |plan: &mut Vec<u8>, needed: &[usize]| {
        put_u32(plan, needed.len());
        for &i in needed {
            put_u32(plan, i);
        }
    };
    if dry_run {
        put_needed(&mut plan, &needed);
        put_u32(&mut plan, 0);
        put_u32(&mut plan, report.diff.changes.len());
        for (change, path) in &report.diff.changes {
            plan.push(change.symbol() as u8);
            put_u16(&mut plan, path.len());
            plan.extend_from_slice(path);
        }
        stream.send(&plan)?;
        return Ok(None);
    }
    report.diff.changes.clear();
    // Only files that are on disk as indexed: one edited or removed on this end since is no
    // base, and the sender sends that file whole.
    let mut bases = delta_bases(&old, &new, &needed);
    bases.retain(|_, &mut j| verifier.check(&old, j));
    let mut staging = root.begin(&lock, &old, new, &sources)?;
    staging.unhashed(&unread);
    debug_assert_eq!(staging.needed(), &needed[..]);
    put_needed(&mut plan, staging.needed());
    put_u32(&mut plan, bases.len());
    for (&i, &j) in &bases {
        put_u32(&mut plan, i);
        let Kind::File { hash, .. } = old.entries[j].kind else {
            unreachable!("delta_bases picks files")
        };
        plan.extend_from_slice(&hash[..BASE_PREFIX]);
    }
    put_u32(&mut plan, 0);
    stream.send(&plan)?;
    let mut pending: Option<(usize, Coder, Vec<u8>)> = None;
    loop {
        let m = recv_msg(stream)?;
        match m.first() {
            Some(&DATA) => {
                for (kind, i, bytes) in parse_data(&m)? {
                    if kind == PIECE_BYTES || kind == PIECE_ZEROS {
                        if let Some((p, ..)) = pending {
                            return Err(Error::Protocol(format!(
                                "contents for entry {i} while the delta of entry {p} is incomplete"
                            )));
                        }
                        if kind == PIECE_ZEROS {
                            let n = u64::from_le_bytes(bytes.try_into().expect("checked"));
                            staging.write_zeros(i, n)?;
                        } else {
                            staging.write(i, bytes)?;
                        }
                        continue;
                    }
                    let (coder, end) = Coder::of_kind(kind).expect("parse_data checked the kind");
                    let Some(&j) = bases.get(&i) else {
                        return Err(Error::Protocol(format!(
                            "a delta for entry {i}, which has no base"
                        )));
                    };
                    let size = staging.manifest().entries[i].size();
                    let (p, c, delta) = pending.get_or_insert_with(|| (i, coder, Vec::new()));
                    if *p != i {
                        return Err(Error::Protocol(format!(
                            "a delta for entry {i} while the delta of entry {p} is incomplete"
                        )));
                    }
                    if *c != coder {
                        return Err(Error::Protocol(format!(
                            "the delta of entry {i} changes its form midway"
                        )));
                    }
                    if (delta.len() + bytes.len()) as u64 > size + 64 {
                        return Err(Error::Protocol(format!(
                            "the delta of entry {i} is longer than the file"
                        )));
                    }
                    delta.extend_from_slice(bytes);
                    if end {
                        let (_, _, delta) = pending.take().expect("set above");
                        let base = root.read_base(&name, &old.entries[j])?;
                        let mut file = Vec::with_capacity(size as usize);
                        coder
                            .decode(&base, &delta, size as usize, &mut file)
                            .map_err(|e| Error::Protocol(format!("the delta of entry {i}: {e}")))?;
                        if file.len() as u64 != size {
                            return Err(Error::Mismatch(format!(
                                "{}: the delta rebuilt {} bytes of {size}",
                                staging.manifest().entries[i].display(),
                                file.len()
                            )));
                        }
                        staging.write(i, &file)?;
                        report.files_delta += 1;
                    }
                }
            }
            Some(&COMMIT) => {
                if let Some((p, ..)) = pending {
                    return Err(Error::Protocol(format!(
                        "COMMIT while the delta of entry {p} is incomplete"
                    )));
                }
                if m.len() != 1 + 32 * unread.len() {
                    return Err(Error::Protocol(format!(
                        "a COMMIT of {} bytes for {} files hashed as sent",
                        m.len(),
                        unread.len()
                    )));
                }
                let hashes: Vec<[u8; 32]> = m[1..]
                    .chunks_exact(32)
                    .map(|h| h.try_into().expect("32 bytes"))
                    .collect();
                staging.settle(&hashes)?;
                break;
            }
            _ => expect(&m, COMMIT, "DATA or COMMIT")?,
        }
    }
    let retired = staging.commit()?;
    stream.send(&[DONE])?;
    Ok(Some(retired))
}

/// For each needed file of `new`, the file at the same path in `old` that both ends may
/// hold in memory: the base its delta would be against (new index -> old index).
fn delta_bases(old: &Manifest, new: &Manifest, needed: &[usize]) -> BTreeMap<usize, usize> {
    let by_path: HashMap<&[u8], usize> = old
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.kind, Kind::File { size, .. } if size > 0 && size <= DELTA_MAX))
        .map(|(j, e)| (&e.path[..], j))
        .collect();
    needed
        .iter()
        .filter(|&&i| new.entries[i].size() <= DELTA_MAX)
        .filter_map(|&i| by_path.get(&new.entries[i].path[..]).map(|&j| (i, j)))
        .collect()
}

/// The session's message decoders, for the fuzz targets (not a stable API).
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Decodes a PLAN against `manifest`, as a sender does; the number of needed entries.
    pub fn plan(bytes: &[u8], manifest: &Manifest) -> Result<usize> {
        parse_plan(bytes, manifest).map(|(_, need, _)| need.len())
    }

    /// Decodes a DATA message's pieces, as a receiver does; how many there are.
    pub fn data(bytes: &[u8]) -> Result<usize> {
        parse_data(bytes).map(|p| p.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_binaries_get_zstd_deltas_and_the_rest_ours() {
        let half = LDM_FROM / 2 + 1;
        let mut binary = vec![b'x'; half];
        binary[100] = 0;
        let text = vec![b'x'; half];
        assert_eq!(Coder::for_file(&binary, &binary), Coder::ZstdRef);
        assert_eq!(Coder::for_file(&text, &text), Coder::Sampled);
        assert_eq!(
            Coder::for_file(&binary[..1000], &binary[..1000]),
            Coder::Sampled,
            "too small for zstd to find a far base"
        );
        let mut late_nul = text.clone();
        late_nul[BINARY_SNIFF] = 0;
        assert_eq!(Coder::for_file(&late_nul, &late_nul), Coder::Sampled);
    }

    #[test]
    fn each_coder_rebuilds_its_deltas_and_names_its_pieces() {
        let base: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut file = base.clone();
        file[1000..1010].copy_from_slice(b"0123456789");
        for coder in [Coder::Sampled, Coder::ZstdRef] {
            let mut delta = Vec::new();
            coder.encode(&base, &file, &mut delta);
            let mut out = Vec::new();
            coder.decode(&base, &delta, file.len(), &mut out).unwrap();
            assert_eq!(out, file, "{coder:?}");
            let (part, last) = coder.kinds();
            assert_eq!(Coder::of_kind(part), Some((coder, false)));
            assert_eq!(Coder::of_kind(last), Some((coder, true)));
        }
        assert_eq!(Coder::of_kind(PIECE_BYTES), None);
    }
}
