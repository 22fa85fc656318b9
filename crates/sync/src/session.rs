//! The send/serve conversation over a [`DedupStream`]: messages in `crates/sync/FORMAT.md`.
//!
//! 1. The sender sends OFFER: the tree's name, flags (dry run) and its manifest.
//! 2. The receiver checks both, reserves the name, compares the manifest to its current tree,
//!    builds what it can locally in staging, and answers PLAN: what changes, and which files'
//!    contents it needs (those it finds nowhere in its current tree), in order.
//! 3. The sender sends those contents as DATA messages (pieces of files in order, small files
//!    batched together, big ones split, about `batch_bytes` per message); the receiver writes
//!    them into staging and checks each file's BLAKE3 against the manifest.
//! 4. The sender sends COMMIT; the receiver swaps the new version in and answers DONE.
//!
//! Either end may send ERROR (text) instead of its next message and stop. Every message
//! travels through the dedup channel, so contents the receiver's chunk store holds (from
//! earlier versions, or from a send that was cut off) cost only their chunk ids: this is what
//! makes an interrupted send resume cheaply, as the store is synced after every session.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use dedupwire_wire::{ChannelStats, ChunkStore, DedupStream};

use crate::apply::{Source, TreeRoot};
use crate::error::{io_at, Error, Result};
use crate::manifest::{Kind, Manifest};
use crate::plan::{self, Change, Diff};

/// The session protocol's version (in OFFER).
pub const SESSION_VERSION: u8 = 1;
const OFFER: u8 = b'O';
const PLAN: u8 = b'P';
const DATA: u8 = b'D';
const COMMIT: u8 = b'C';
const DONE: u8 = b'K';
const ERROR: u8 = b'E';
const FLAG_DRY_RUN: u8 = 1;
/// The largest piece of a file in one DATA message.
const MAX_PIECE: usize = 8 << 20;

/// How a send behaves.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Ask what would change; change nothing.
    pub dry_run: bool,
    /// Content bytes per DATA message (the unit the receiver holds in memory).
    pub batch_bytes: usize,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            dry_run: false,
            batch_bytes: 32 << 20,
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
    /// Their bytes.
    pub bytes_received: u64,
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

/// Sends the tree at `src` (scanned into `manifest`) as `name`; `progress(done, total)` sees
/// content bytes as they go. Returns once the receiver has swapped the new version in.
pub fn send<S: Read + Write>(
    stream: &mut DedupStream<S>,
    src: &Path,
    name: &[u8],
    manifest: &Manifest,
    opts: &SendOptions,
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
    offer.extend_from_slice(&manifest.encode());
    send_msg(stream, &offer)?;

    let plan = recv_msg(stream)?;
    expect(&plan, PLAN, "PLAN")?;
    let mut c = Cursor {
        buf: &plan,
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
    let bytes_needed: u64 = need.iter().map(|&i| manifest.entries[i].size()).sum();
    let mut report = SendReport {
        diff,
        files_sent: need.len() as u64,
        bytes_needed,
        ..SendReport::default()
    };
    if opts.dry_run {
        report.channel = stream.stats();
        report.elapsed = started.elapsed();
        return Ok(report);
    }

    let mut batch = vec![DATA];
    let mut done = 0u64;
    progress(0, bytes_needed);
    for &i in &need {
        let e = &manifest.entries[i];
        let Kind::File { size, hash } = e.kind else {
            unreachable!("checked above")
        };
        let path = src.join(e.rel_path());
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .map_err(io_at(&path))?;
        let mut h = blake3::Hasher::new();
        let mut left = size;
        while left > 0 {
            let room = opts
                .batch_bytes
                .saturating_sub(batch.len() + 8)
                .max(64 << 10);
            let want = left.min(MAX_PIECE as u64).min(room as u64) as usize;
            let start = batch.len();
            put_u32(&mut batch, i);
            put_u32(&mut batch, want);
            batch.resize(start + 8 + want, 0);
            let buf = &mut batch[start + 8..];
            let mut got = 0;
            while got < want {
                match f.read(&mut buf[got..]) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_at(&path)(e)),
                }
            }
            if got < want {
                return Err(Error::Mismatch(format!(
                    "{}: shorter than when it was scanned (changed while being sent)",
                    path.display()
                )));
            }
            h.update(buf);
            left -= want as u64;
            done += want as u64;
            report.bytes_read += want as u64;
            if batch.len() + 8 >= opts.batch_bytes {
                send_msg(stream, &batch)?;
                batch.truncate(1);
                progress(done, bytes_needed);
            }
        }
        if *h.finalize().as_bytes() != hash {
            return Err(Error::Mismatch(format!(
                "{}: changed while being sent; run the send again",
                path.display()
            )));
        }
    }
    if batch.len() > 1 {
        send_msg(stream, &batch)?;
    }
    progress(done, bytes_needed);
    send_msg(stream, &[COMMIT])?;
    let m = recv_msg(stream)?;
    expect(&m, DONE, "DONE")?;
    report.channel = stream.stats();
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Receives one tree into `root` from the sender at the other end of `stream`, then syncs
/// `store` (the channel's chunk store) so that a send cut off now resumes cheaply. Tells the
/// sender why when it fails (unless the channel itself failed).
pub fn serve<S: Read + Write>(
    root: &TreeRoot,
    store: &dyn ChunkStore,
    stream: &mut DedupStream<S>,
) -> Result<ServeReport> {
    let mut report = ServeReport::default();
    let r = serve_inner(root, stream, &mut report);
    let synced = store.sync();
    let r = r.and_then(|()| synced.map_err(|e| Error::Channel(e.into())));
    if let Err(e) = &r {
        if !matches!(e, Error::Channel(_) | Error::Remote(_)) {
            let _ = stream.send(&error_message(e));
        }
    }
    r.map(|()| report)
}

fn serve_inner<S: Read + Write>(
    root: &TreeRoot,
    stream: &mut DedupStream<S>,
    report: &mut ServeReport,
) -> Result<()> {
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
    report.name = String::from_utf8_lossy(&name).into_owned();
    report.dry_run = dry_run;
    let lock = root.lock(&name)?;
    let new = Manifest::decode(&offer[c.pos..])?;
    drop(offer);
    let old = root.current(&name)?;
    let diff = plan::diff(&old, &new);
    let sources = root.resolve(&name, &old, &new);
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
        put_u32(&mut plan, report.diff.changes.len());
        for (change, path) in &report.diff.changes {
            plan.push(change.symbol() as u8);
            put_u16(&mut plan, path.len());
            plan.extend_from_slice(path);
        }
        stream.send(&plan)?;
        return Ok(());
    }
    report.diff.changes.clear();
    let mut staging = root.begin(&lock, &old, new, &sources)?;
    debug_assert_eq!(staging.needed(), &needed[..]);
    put_needed(&mut plan, staging.needed());
    put_u32(&mut plan, 0);
    stream.send(&plan)?;
    loop {
        let m = recv_msg(stream)?;
        match m.first() {
            Some(&DATA) => {
                let mut c = Cursor {
                    buf: &m,
                    pos: 1,
                    what: "DATA",
                };
                while !c.done() {
                    let i = c.u32()?;
                    let len = c.u32()?;
                    let bytes = c.take(len)?;
                    if bytes.is_empty() {
                        return Err(Error::Protocol("an empty DATA piece".into()));
                    }
                    staging.write(i, bytes)?;
                }
            }
            Some(&COMMIT) if m.len() == 1 => break,
            _ => expect(&m, COMMIT, "DATA or COMMIT")?,
        }
    }
    staging.commit()?;
    stream.send(&[DONE])?;
    Ok(())
}
