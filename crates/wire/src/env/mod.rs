//! The `Environment`: the persistent [`ChunkStore`] of the dedup channel, one directory on disk
//! shared by every stream of a process (TurboSockets §III-B: "an Environment provides all its
//! TurboSocket members with access to the same chunk database").
//!
//! # Layout
//!
//! The directory holds append-only **segment files** (`0000002a.seg`, numbered in creation
//! order, at most [`EnvConfig::segment_bytes`] each), a `sketches` file (see
//! [Sketches](#sketches-a-senders-memory-kept-as-hints)), `note-KEY` files (small values a
//! channel keeps for its next connection, [`ChunkStore::keep_note`]: what the adaptive mode
//! measured) and a `LOCK` file. A segment is a
//! versioned header and then records `[id][len][xxh3 of data][header checksum][data]`; the
//! header checksum is seeded with the record's segment and offset, so a record is valid only
//! where it was written (a segment stored as a chunk's data, or bytes shifted by damage, never
//! verify). The byte layout is in `crates/wire/FORMAT.md`.
//!
//! In memory, a hash map from the 32-byte chunk id to (segment, offset, length): 44 bytes per
//! entry plus a control byte and the table's slack ([`EnvStats::index_bytes`]), 45–90 bytes per
//! chunk (about 11 MB per GB of 8 KiB chunks at worst). Nothing else is cached: a `get` is one
//! positional read, and the OS page cache does the rest.
//!
//! # Hints: the index without reading every segment
//!
//! A full segment gets a hint file listing its records (`hint.rs`), and so does the newest
//! one when the environment is closed, so the index is rebuilt at open from the hints (a
//! segment appended to after its hint, by a process that died, is scanned). Scanning every
//! segment cost a sequential read of the store, about 2.1 GB per second from the page cache
//! (`dedupwire-bench env --mib 512 --chunk-kib 16`: 0.25 s to open 512 MB, and a 4 GiB
//! environment read whole by every process that opens it); from hints the same open runs at
//! 53 GB/s of environment. The segments stay the one source of truth: a hint is trusted
//! only whole and for the exact segment length it was written for, records are verified
//! when read, and a record found damaged removes its segment's hint so that the next open
//! scans that segment and leaves the record out. A damaged record in a sealed segment is
//! therefore found at its first `get`, not at open.
//!
//! # Recipes: a chunk kept as its parts
//!
//! A chunk whose parts are all held can be kept as a **recipe** record, the list of their ids
//! ([`ChunkStore::put_recipe`]): the channel's receiver keeps each coarse chunk that arrived as
//! fine chunks this way, so every byte is stored once rather than once per chunking level
//! (Django 4.2.1's tar then 4.2.2 in dedup mode: 98.7 then 184.4 MB of environment before,
//! 49.5 then 86.3 MB with recipes). `contains` and `get` check that the parts are still held
//! and mark them used; a recipe that lost a part is dropped and counts as not held.
//!
//! # Recovery: never trust a half-state
//!
//! - A **torn tail** (a crash or a full disk in the middle of an append) is invalid bytes with
//!   no valid record after them: open cuts the segment back to its last valid record.
//! - A **damaged record** with valid records after it is skipped and counted
//!   ([`EnvStats::skipped_records`], [`EnvStats::skipped_bytes`]); a chunk store may lose
//!   chunks, the channel asks for them again.
//! - A record found damaged by `get` is dropped from the index and reported as
//!   [`StoreError::Corrupt`], never returned as wrong bytes.
//! - A **damaged segment header** is an error naming the file (the store cannot know what the
//!   file is), an unknown format version is `Refused`; a newest segment shorter than a header
//!   is a torn creation and is removed.
//! - A write that fails (a full disk: `ENOSPC`) cuts the segment back to where the record
//!   started and returns [`StoreError::Io`] saying so; if even that fails, the next put starts
//!   a new segment and the stray bytes are a torn tail at the next open.
//!
//! Each segment but the newest is fsynced when the next one is started, and the directory is
//! fsynced when a segment is created or removed; [`ChunkStore::sync`] fsyncs the newest.
//!
//! # Eviction: FIFO by segment, with a second chance
//!
//! When the segments add up to more than [`EnvConfig::max_bytes`], the oldest segment is
//! deleted whole. Before that, each of its chunks that was looked up (`contains` or `get`)
//! since it was written is copied to the newest segment (CLOCK's second chance: one bit per
//! chunk, cleared by the copy), so chunks that keep being used survive, and a chunk nobody
//! asked for leaves with its segment. Finding a segment's chunks is one pass over the index
//! per evicted segment (a few milliseconds per million chunks), which costs no memory per
//! chunk. [`EnvConfig::second_chance`] turns the copying off (pure FIFO).
//!
//! # Sketches: a sender's memory, kept as hints
//!
//! [`ChunkStore::remember`] appends [`Sketch`]es to the `sketches` file (a versioned header,
//! then records each with its own xxh3 checksum) and [`ChunkStore::recall`] reads it back,
//! keeping the sketches of chunks the index still holds, so a sender that reopens its
//! environment finds delta bases among what earlier connections sent. Sketches are hints:
//! they are not fsynced on append (only by `sync`), and damage loses some of them, never the
//! environment. At open a torn tail or a damaged record cuts the file back to the last valid
//! record before it ([`EnvStats::sketch_cut_bytes`]), and a file whose header this build
//! cannot read is renamed `sketches.bad` and a fresh one started. Records of evicted chunks
//! (and older copies of a sketch remembered again) are dead: open rewrites the file without
//! them when they are most of a file over 1 MiB, and `remember` does so when the file
//! outgrows a 32nd of [`EnvConfig::max_bytes`], keeping the newest live records that fit in
//! half of that, so the file's growth stays bounded.
//!
//! # Concurrency
//!
//! Lookups take a shared lock on the index only, and read records after releasing it; puts
//! are serialized by a writer lock and take the index lock exclusively only to publish a
//! written record. A segment evicted while a `get` reads it stays readable through the open
//! file. `remember` appends under the writer lock; `recall` takes it only to learn how far the
//! sketch file's records go, then reads without it (a compaction meanwhile replaces the file,
//! and the open one stays readable). Another process (or another `Environment::open` of the
//! same directory in this process) is refused by an exclusive lock on `LOCK`.
//!
//! ```
//! use dedupwire_wire::{ChunkId, ChunkStore, EnvConfig, Environment};
//! # let dir = tempfile::tempdir().unwrap();
//! let env = Environment::open(dir.path(), EnvConfig::default())?;
//! let id = ChunkId([7; 32]);
//! env.put(&id, b"chunk bytes")?;
//! env.sync()?;
//! assert_eq!(env.get(&id)?.as_deref(), Some(&b"chunk bytes"[..]));
//! assert_eq!(env.stats().chunks, 1);
//! # Ok::<(), dedupwire_wire::StoreError>(())
//! ```

mod hint;
mod index;
mod lock;
mod note;
mod segment;
mod sketch;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use xxhash_rust::xxh3::xxh3_64;

use crate::store::{
    check_note, check_note_key, check_sketches, ChunkId, ChunkStore, Sketch, StoreError,
};
use index::{Index, Loc};
use segment::{HEADER_LEN, MAX_SEGMENT_BYTES, RECORD_HEAD};

/// The most sketches [`Environment`]'s `recall` returns (the newest), about 100 MB of them.
pub const RECALL_MAX: usize = 1 << 20;

/// A sketch file at least this large is compacted at open when most of it is dead records.
const COMPACT_AT_OPEN: u64 = 1 << 20;

/// How an [`Environment`] sizes its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvConfig {
    /// Bound on the bytes of all segment files; past it the oldest segments are evicted.
    /// At least twice `segment_bytes`.
    pub max_bytes: u64,
    /// Size at which a segment is closed and a new one started (the unit of eviction); also
    /// bounds the largest chunk. Between 4 KiB and 1 GiB.
    pub segment_bytes: u64,
    /// Copy chunks looked up since they were written out of a segment before evicting it
    /// (second chance), instead of evicting strictly oldest first.
    pub second_chance: bool,
}

impl Default for EnvConfig {
    fn default() -> EnvConfig {
        EnvConfig {
            max_bytes: 4 << 30,
            segment_bytes: 64 << 20,
            second_chance: true,
        }
    }
}

impl EnvConfig {
    /// The largest chunk a segment of this size can hold.
    pub fn max_chunk_bytes(&self) -> u64 {
        self.segment_bytes
            .saturating_sub(HEADER_LEN + RECORD_HEAD as u64)
    }

    fn validate(&self) -> Result<(), StoreError> {
        if !(4096..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes) {
            return Err(StoreError::Refused(format!(
                "segment_bytes {} is outside 4 KiB ..= 1 GiB",
                self.segment_bytes
            )));
        }
        if self.max_bytes / 2 < self.segment_bytes {
            return Err(StoreError::Refused(format!(
                "max_bytes {} must hold at least two segments of {} bytes",
                self.max_bytes, self.segment_bytes
            )));
        }
        Ok(())
    }
}

/// What an [`Environment`] holds and has done since it was opened, for monitoring and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnvStats {
    /// Chunks held.
    pub chunks: u64,
    /// Data bytes of the chunks held.
    pub chunk_bytes: u64,
    /// Bytes of all segment files (headers, records, and records no longer indexed).
    pub bytes: u64,
    /// Segment files.
    pub segments: u64,
    /// Segments evicted to stay within `max_bytes`.
    pub evictions: u64,
    /// Chunks that left with evicted segments.
    pub evicted_chunks: u64,
    /// Chunks copied out of an evicted segment because they had been used (second chance).
    pub rescued_chunks: u64,
    /// Lookups (`contains`, `get`) that found the chunk.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Estimated RAM of the in-memory index.
    pub index_bytes: u64,
    /// Records found damaged by `get` and dropped.
    pub corrupt_dropped: u64,
    /// Segments whose records were read from their hint at open, not scanned.
    pub hinted_segments: u64,
    /// Bytes of torn tails cut off at open (and torn segment files removed).
    pub torn_bytes: u64,
    /// Damaged stretches skipped at open (each at least one record).
    pub skipped_records: u64,
    /// Bytes of those stretches.
    pub skipped_bytes: u64,
    /// Bytes of the sketch file.
    pub sketch_bytes: u64,
    /// Bytes of the sketch file cut off at open: a torn tail, or a damaged record and
    /// everything after it.
    pub sketch_cut_bytes: u64,
    /// Whether a sketch file this build cannot read was set aside (`sketches.bad`) at open.
    pub sketches_set_aside: bool,
    /// Rewrites of the sketch file without its dead records, at open and by `remember`.
    pub sketch_compactions: u64,
}

/// One segment file, open for reading (and, for the newest, appending).
#[derive(Debug)]
struct Segment {
    no: u32,
    /// Its format version: recipes go only into segments of version 2 and up.
    version: u32,
    path: PathBuf,
    file: File,
}

#[derive(Debug)]
struct SegEntry {
    seg: Arc<Segment>,
    bytes: u64,
}

/// What lookups share: the index and the segment table.
#[derive(Debug, Default)]
struct State {
    index: Index,
    segments: BTreeMap<u32, SegEntry>,
    bytes: u64,
}

/// The sketch file, appended to under the writer lock.
#[derive(Debug)]
struct SketchLog {
    /// Shared with `recall`, which reads it without the writer lock.
    file: Arc<File>,
    /// Where its valid records end (and the next one is written).
    len: u64,
}

/// Test hook: writes fail with "no space" after this many more bytes.
#[cfg(test)]
type SpaceLeft = Option<u64>;
#[cfg(not(test))]
type SpaceLeft = ();

/// The appending side, one at a time.
#[derive(Debug)]
struct Writer {
    active: Arc<Segment>,
    len: u64,
    /// A failed write could not be cut back: start a new segment before the next record.
    broken: bool,
    buf: Vec<u8>,
    sketches: SketchLog,
    space_left: SpaceLeft,
    /// The active segment's records, in file order: its hint once it is full.
    records: Vec<segment::Found>,
    /// Whether `records` holds every record of the active segment (not so when it was an
    /// older segment, opened from its hint, after a torn newest one was removed).
    hintable: bool,
    /// The active segment's length its hint file was written for (0: it has none).
    hinted_len: u64,
}

#[derive(Debug, Default)]
struct Counters {
    evictions: AtomicU64,
    evicted_chunks: AtomicU64,
    rescued_chunks: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt_dropped: AtomicU64,
    sketch_bytes: AtomicU64,
    sketch_compactions: AtomicU64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Recovery {
    hinted_segments: u64,
    torn_bytes: u64,
    skipped_records: u64,
    skipped_bytes: u64,
    sketch_cut_bytes: u64,
    sketches_set_aside: bool,
}

/// A persistent, size-bounded chunk store in a directory, shared by many streams and threads
/// (use it as `Arc<Environment>`); see the [module documentation](self) for its design.
#[derive(Debug)]
pub struct Environment {
    dir: PathBuf,
    config: EnvConfig,
    writer: Mutex<Writer>,
    state: RwLock<State>,
    counters: Counters,
    recovery: Recovery,
    _lock: lock::DirLock,
}

fn io_context(e: io::Error, what: impl std::fmt::Display) -> StoreError {
    StoreError::Io(io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// Writes all of `buf` at `off` of `file`.
#[cfg(not(test))]
fn write_at(_: &mut SpaceLeft, file: &File, buf: &[u8], off: u64) -> io::Result<()> {
    segment::write_all_at(file, buf, off)
}

/// Writes all of `buf` at `off` of `file`, or as much of it as `space_left` allows and then
/// fails like a full disk.
#[cfg(test)]
fn write_at(space_left: &mut SpaceLeft, file: &File, buf: &[u8], off: u64) -> io::Result<()> {
    match *space_left {
        Some(left) if (buf.len() as u64) > left => {
            segment::write_all_at(file, &buf[..left as usize], off)?;
            *space_left = Some(0);
            Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "No space left on device (injected)",
            ))
        }
        Some(left) => {
            *space_left = Some(left - buf.len() as u64);
            segment::write_all_at(file, buf, off)
        }
        None => segment::write_all_at(file, buf, off),
    }
}

/// Writes all of `buf` at `off` of `file`, the end of its valid data; if that fails, cuts the
/// file back to `off` and returns an error saying what was being written (`what`), with
/// whether the cut worked (if not, the stray bytes are a torn tail at the next open).
fn write_or_cut(
    space_left: &mut SpaceLeft,
    file: &File,
    buf: &[u8],
    off: u64,
    what: std::fmt::Arguments<'_>,
) -> Result<(), (StoreError, bool)> {
    let Err(e) = write_at(space_left, file, buf, off) else {
        return Ok(());
    };
    let cut = file.set_len(off).is_ok();
    let full = if e.kind() == io::ErrorKind::StorageFull {
        " because the disk is full (free space or lower max_bytes)"
    } else {
        ""
    };
    let tail = if cut {
        "; the partial write was removed"
    } else {
        "; the partial write will be cut off at the next open"
    };
    Err((io_context(e, format!("{what} failed{full}{tail}")), cut))
}

impl Environment {
    /// Opens (creating if needed) the environment in `dir`: takes its lock, verifies every
    /// segment and the sketch file, cuts off torn tails and rebuilds the index.
    pub fn open(dir: impl AsRef<Path>, config: EnvConfig) -> Result<Environment, StoreError> {
        config.validate()?;
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir)
            .map_err(|e| io_context(e, format!("cannot create environment {}", dir.display())))?;
        let lock = lock::DirLock::acquire(&dir)?;
        let (mut state, mut recovery, newest) = load(&dir)?;
        let (sketches, sketch_bytes) = open_sketches(&dir, &mut recovery)?;
        let (active, (records, hintable, hinted_len)) = match state.segments.last_key_value() {
            Some((&no, e)) => (
                (e.seg.clone(), e.bytes),
                match newest {
                    Some(n) if n.no == no => (n.records, true, n.hinted_len),
                    _ => (Vec::new(), false, 0),
                },
            ),
            None => {
                let seg = create_segment(&dir, 1)?;
                state.bytes += HEADER_LEN;
                state.segments.insert(
                    1,
                    SegEntry {
                        seg: seg.clone(),
                        bytes: HEADER_LEN,
                    },
                );
                ((seg, HEADER_LEN), (Vec::new(), true, 0))
            }
        };
        let env = Environment {
            dir,
            config,
            writer: Mutex::new(Writer {
                active: active.0,
                len: active.1,
                broken: false,
                buf: Vec::new(),
                sketches,
                space_left: SpaceLeft::default(),
                records,
                hintable,
                hinted_len,
            }),
            state: RwLock::new(state),
            counters: Counters::default(),
            recovery,
            _lock: lock,
        };
        let mut w = env.writer();
        env.counters
            .sketch_bytes
            .store(w.sketches.len, Ordering::Relaxed);
        env.evict(&mut w)?;
        if w.sketches.len >= COMPACT_AT_OPEN {
            // From the bytes open_sketches read and checked, not a second read of the file.
            let live: u64 = env
                .live_records(&sketch_bytes)
                .iter()
                .map(|r| r.len as u64)
                .sum();
            let dead = w.sketches.len - sketch::HEADER_LEN - live;
            if dead * 2 > w.sketches.len {
                // Compacting is optional: a failure (a full disk) leaves the file as it was,
                // and `remember` compacts it once it outgrows its bound.
                let _ = env.compact_sketches(&mut w, false);
            }
        }
        drop(sketch_bytes);
        drop(w);
        Ok(env)
    }

    /// The directory it lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &EnvConfig {
        &self.config
    }

    /// What it holds and has done (a consistent snapshot of the index, counters read after).
    pub fn stats(&self) -> EnvStats {
        let st = self.read();
        let c = &self.counters;
        EnvStats {
            chunks: st.index.len() as u64,
            chunk_bytes: st.index.data_bytes(),
            bytes: st.bytes,
            segments: st.segments.len() as u64,
            evictions: c.evictions.load(Ordering::Relaxed),
            evicted_chunks: c.evicted_chunks.load(Ordering::Relaxed),
            rescued_chunks: c.rescued_chunks.load(Ordering::Relaxed),
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            index_bytes: st.index.memory_bytes() as u64,
            corrupt_dropped: c.corrupt_dropped.load(Ordering::Relaxed),
            hinted_segments: self.recovery.hinted_segments,
            torn_bytes: self.recovery.torn_bytes,
            skipped_records: self.recovery.skipped_records,
            skipped_bytes: self.recovery.skipped_bytes,
            sketch_bytes: c.sketch_bytes.load(Ordering::Relaxed),
            sketch_cut_bytes: self.recovery.sketch_cut_bytes,
            sketches_set_aside: self.recovery.sketches_set_aside,
            sketch_compactions: c.sketch_compactions.load(Ordering::Relaxed),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, hit: bool) {
        let c = if hit {
            &self.counters.hits
        } else {
            &self.counters.misses
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads and verifies the record of `id` at `off` of `seg`; the inner error says why the
    /// record is damaged.
    fn read_record(
        seg: &Segment,
        id: &ChunkId,
        off: u32,
        len: u32,
        recipe: bool,
    ) -> Result<Result<Vec<u8>, String>, StoreError> {
        let mut buf = vec![0u8; RECORD_HEAD + len as usize];
        match segment::read_exact_at(&seg.file, &mut buf, u64::from(off)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Ok(Err("the segment ends inside the record".into()))
            }
            Err(e) => {
                return Err(io_context(
                    e,
                    format!("cannot read {} at offset {off}", seg.path.display()),
                ))
            }
        }
        if let Err(why) = segment::verify_record(&buf, seg.no, u64::from(off), id, len, recipe) {
            return Ok(Err(why));
        }
        buf.drain(..RECORD_HEAD);
        Ok(Ok(buf))
    }

    /// Appends the record `id` → `data` (a recipe if `recipe`) to the newest segment (starting
    /// a new one if it is full, or too old a format for a recipe) and publishes it in the index.
    fn append(
        &self,
        w: &mut Writer,
        id: &ChunkId,
        data: &[u8],
        sum: u64,
        recipe: bool,
    ) -> Result<(), StoreError> {
        let rec = (RECORD_HEAD + data.len()) as u64;
        let full = w.len + rec > self.config.segment_bytes && w.len > HEADER_LEN;
        if w.broken || full || (recipe && w.active.version < 2) {
            self.rotate(w)?;
        }
        let off = w.len;
        let mut buf = std::mem::take(&mut w.buf);
        buf.clear();
        segment::encode_record(&mut buf, w.active.no, off, id, data, sum, recipe);
        let written = write_or_cut(
            &mut w.space_left,
            &w.active.file,
            &buf,
            off,
            format_args!(
                "environment {}: writing a chunk to {}",
                self.dir.display(),
                w.active.path.display()
            ),
        );
        w.buf = buf;
        if let Err((e, cut)) = written {
            w.broken = !cut;
            return Err(e);
        }
        w.len += rec;
        w.records.push(segment::Found {
            id: *id,
            off: off as u32,
            len: data.len() as u32,
            recipe,
        });
        let mut st = self.write();
        let loc = Loc::new(w.active.no, off as u32, data.len() as u32, recipe);
        st.index.insert(*id, loc);
        st.bytes += rec;
        if let Some(e) = st.segments.get_mut(&w.active.no) {
            e.bytes = w.len;
        }
        Ok(())
    }

    /// Makes the newest segment durable and starts the next one.
    fn rotate(&self, w: &mut Writer) -> Result<(), StoreError> {
        w.active
            .file
            .sync_data()
            .map_err(|e| io_context(e, format!("cannot fsync {}", w.active.path.display())))?;
        let no = w.active.no.checked_add(1).ok_or_else(|| {
            StoreError::Refused(format!(
                "environment {} has used up its segment numbers",
                self.dir.display()
            ))
        })?;
        if w.hintable && !w.broken {
            write_hint(&self.dir, w.active.no, w.len, &w.records);
        }
        let seg = create_segment(&self.dir, no)?;
        w.records.clear();
        w.hintable = true;
        w.hinted_len = 0;
        let mut st = self.write();
        st.bytes += HEADER_LEN;
        st.segments.insert(
            no,
            SegEntry {
                seg: seg.clone(),
                bytes: HEADER_LEN,
            },
        );
        drop(st);
        w.active = seg;
        w.len = HEADER_LEN;
        w.broken = false;
        Ok(())
    }

    /// Deletes oldest segments while the files exceed `max_bytes`, copying their used chunks
    /// forward first when `second_chance` is on.
    fn evict(&self, w: &mut Writer) -> Result<(), StoreError> {
        loop {
            let mut st = self.write();
            if st.bytes <= self.config.max_bytes {
                return Ok(());
            }
            let Some((&no, _)) = st.segments.first_key_value() else {
                return Ok(());
            };
            if no == w.active.no {
                return Ok(());
            }
            let victim = st.segments.remove(&no).expect("first key exists");
            st.bytes -= victim.bytes;
            let gone = st.index.drain_segment(no);
            drop(st);
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            let mut left = gone.len() as u64;
            if self.config.second_chance {
                for e in gone.iter().filter(|e| e.used) {
                    let read = Self::read_record(&victim.seg, &e.id, e.off, e.len, e.recipe);
                    let Ok(Ok(data)) = read else {
                        continue;
                    };
                    if self
                        .append(w, &e.id, &data, xxh3_64(&data), e.recipe)
                        .is_err()
                    {
                        break;
                    }
                    left -= 1;
                    self.counters.rescued_chunks.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.counters
                .evicted_chunks
                .fetch_add(left, Ordering::Relaxed);
            let _ = fs::remove_file(self.dir.join(hint::file_name(no)));
            fs::remove_file(&victim.seg.path)
                .and_then(|()| segment::sync_dir(&self.dir))
                .map_err(|e| {
                    io_context(
                        e,
                        format!(
                            "cannot remove evicted segment {}",
                            victim.seg.path.display()
                        ),
                    )
                })?;
        }
    }

    /// The bound on the sketch file past which `remember` compacts it.
    fn sketch_limit(&self) -> u64 {
        (self.config.max_bytes / 32).min(sketch::MAX_FILE_BYTES / 2)
    }

    /// The first `len` bytes of the sketch file and, oldest first, its records that `recall`
    /// returns (see [`Environment::live_records`]).
    fn live_sketches(
        &self,
        file: &File,
        len: u64,
    ) -> Result<(Vec<u8>, Vec<sketch::Found>), StoreError> {
        let mut buf = vec![0u8; len as usize];
        segment::read_exact_at(file, &mut buf, 0).map_err(|e| {
            io_context(
                e,
                format!("cannot read {}", self.dir.join(sketch::FILE_NAME).display()),
            )
        })?;
        let live = self.live_records(&buf);
        Ok((buf, live))
    }

    /// The records of sketch file bytes `buf` that `recall` returns, oldest first: those of
    /// chunks still held, less those repeated by an identical later record.
    fn live_records(&self, buf: &[u8]) -> Vec<sketch::Found> {
        let scan = sketch::scan(buf);
        let mut seen = HashSet::with_capacity_and_hasher(
            scan.records.len(),
            std::hash::BuildHasherDefault::<RecordSumHasher>::default(),
        );
        let mut live: Vec<sketch::Found> = scan
            .records
            .iter()
            .rev()
            .filter(|r| seen.insert(r.bytes(buf)))
            .copied()
            .collect();
        drop(seen);
        let st = self.read();
        // Senders keep their chunks whole; a recipe's parts may be gone.
        live.retain(|r| {
            let id = sketch::record_id(r.bytes(buf));
            st.index.get(&id).is_some_and(|l| !l.recipe())
        });
        drop(st);
        live.reverse();
        live
    }

    /// [`ChunkStore::recall`], at most `max` sketches.
    fn recall_newest(&self, max: usize) -> Result<Vec<Sketch>, StoreError> {
        let (file, len) = {
            let w = self.writer();
            (w.sketches.file.clone(), w.sketches.len)
        };
        let (buf, live) = self.live_sketches(&file, len)?;
        Ok(live[live.len().saturating_sub(max)..]
            .iter()
            .filter_map(|r| sketch::decode_record(r.bytes(&buf)).map(|(s, _)| s))
            .collect())
    }

    /// Rewrites the sketch file with only its live records (the newest of them that fit in
    /// half its bound) through `sketches.tmp` and a rename; when `if_sparse`, only if dead
    /// records make up more than half of it.
    fn compact_sketches(&self, w: &mut Writer, if_sparse: bool) -> Result<(), StoreError> {
        let (buf, live) = self.live_sketches(&w.sketches.file, w.sketches.len)?;
        let live_bytes: u64 = live.iter().map(|r| r.len as u64).sum();
        let dead = w.sketches.len - sketch::HEADER_LEN - live_bytes;
        if if_sparse && dead * 2 <= w.sketches.len {
            return Ok(());
        }
        let keep = self.sketch_limit() / 2;
        let mut kept = 0u64;
        let first = live
            .iter()
            .rev()
            .take_while(|r| {
                kept += r.len as u64;
                kept <= keep
            })
            .count();
        let mut out = sketch::encode_header().to_vec();
        for r in &live[live.len() - first..] {
            out.extend_from_slice(r.bytes(&buf));
        }
        w.sketches = new_sketch_file(&self.dir, &out)?;
        self.counters
            .sketch_bytes
            .store(w.sketches.len, Ordering::Relaxed);
        self.counters
            .sketch_compactions
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Forgets `id` after its record at `off` of `seg` failed verification.
    fn drop_damaged(&self, id: &ChunkId, seg: &Segment, off: u32, why: &str) -> StoreError {
        // The next open scans the segment again, and leaves the damaged record out.
        let _ = fs::remove_file(self.dir.join(hint::file_name(seg.no)));
        if self.write().index.remove_at(id, seg.no, off) {
            self.counters
                .corrupt_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
        let mut w = self.writer();
        if w.active.no == seg.no {
            // Its record list holds the damaged record: no hint from it.
            w.hintable = false;
        }
        drop(w);
        StoreError::Corrupt(format!(
            "chunk {id:?} in {} at offset {off}: {why}; it was dropped from the environment",
            seg.path.display()
        ))
    }
}

/// Creates (or truncates) `path` holding `content`, fsynced, for reading and writing.
fn write_new_file(path: &Path, content: &[u8]) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    segment::write_all_at(&file, content, 0)?;
    file.sync_all()?;
    Ok(file)
}

/// What a failed file creation says of a full disk.
fn full_disk_note(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::StorageFull {
        " (the disk is full)"
    } else {
        ""
    }
}

/// Creates segment `no` in `dir` holding only its header, durably (file and directory).
fn create_segment(dir: &Path, no: u32) -> Result<Arc<Segment>, StoreError> {
    let path = dir.join(segment::file_name(no));
    let made = write_new_file(&path, &segment::encode_header(no))
        .and_then(|file| segment::sync_dir(dir).map(|()| file));
    match made {
        Ok(file) => Ok(Arc::new(Segment {
            no,
            version: segment::VERSION,
            path,
            file,
        })),
        Err(e) => {
            let _ = fs::remove_file(&path);
            let full = full_disk_note(&e);
            Err(io_context(
                e,
                format!("cannot create segment {}{full}", path.display()),
            ))
        }
    }
}

/// Writes `content` as the sketch file of `dir`, durably and whole or not at all: to
/// `sketches.tmp`, fsynced, then renamed over `sketches`.
fn new_sketch_file(dir: &Path, content: &[u8]) -> Result<SketchLog, StoreError> {
    let tmp = dir.join(sketch::TMP_NAME);
    let made = write_replacing(&tmp, &dir.join(sketch::FILE_NAME), content).and_then(|file| {
        segment::sync_dir(dir)?;
        Ok(file)
    });
    match made {
        Ok(file) => Ok(SketchLog {
            file: Arc::new(file),
            len: content.len() as u64,
        }),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            let full = full_disk_note(&e);
            Err(io_context(
                e,
                format!(
                    "cannot write the sketch file {}{full}",
                    dir.join(sketch::FILE_NAME).display()
                ),
            ))
        }
    }
}

/// Opens the sketch file of `dir`, creating it if missing: cuts it back to its last valid
/// record, and sets aside (as `sketches.bad`) a file this build cannot read, starting afresh.
/// Opens the sketch file (see FORMAT.md, "Opening"); returns it and its checked bytes.
fn open_sketches(dir: &Path, rec: &mut Recovery) -> Result<(SketchLog, Vec<u8>), StoreError> {
    let path = dir.join(sketch::FILE_NAME);
    let tmp = dir.join(sketch::TMP_NAME);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_context(e, format!("cannot remove {}", tmp.display()))),
    }
    let file = match OpenOptions::new().read(true).write(true).open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let header = sketch::encode_header().to_vec();
            return Ok((new_sketch_file(dir, &header)?, header));
        }
        Err(e) => return Err(io_context(e, format!("cannot open {}", path.display()))),
    };
    let len = file
        .metadata()
        .map_err(|e| io_context(e, format!("cannot stat {}", path.display())))?
        .len();
    let mut buf = Vec::new();
    if len <= sketch::MAX_FILE_BYTES {
        buf.resize(len as usize, 0);
        segment::read_exact_at(&file, &mut buf, 0)
            .map_err(|e| io_context(e, format!("cannot read {}", path.display())))?;
    }
    if len > sketch::MAX_FILE_BYTES || sketch::check_header(&buf).is_err() {
        drop(file);
        let bad = dir.join(sketch::BAD_NAME);
        fs::rename(&path, &bad)
            .and_then(|()| segment::sync_dir(dir))
            .map_err(|e| {
                io_context(
                    e,
                    format!(
                        "cannot set aside the unreadable sketch file {} as {}",
                        path.display(),
                        bad.display()
                    ),
                )
            })?;
        rec.sketches_set_aside = true;
        let header = sketch::encode_header().to_vec();
        return Ok((new_sketch_file(dir, &header)?, header));
    }
    let end = sketch::scan(&buf).end;
    if end < len {
        file.set_len(end)
            .and_then(|()| file.sync_all())
            .map_err(|e| {
                io_context(
                    e,
                    format!("cannot cut the damaged tail of {}", path.display()),
                )
            })?;
        rec.sketch_cut_bytes = len - end;
    }
    buf.truncate(end as usize);
    Ok((
        SketchLog {
            file: Arc::new(file),
            len: end,
        },
        buf,
    ))
}

/// Hashes a sketch record by its last 8 bytes, its `record_sum` (a checksum of the rest):
/// records compared whole are thus hashed without reading them whole.
#[derive(Default)]
struct RecordSumHasher(u64);

impl std::hash::Hasher for RecordSumHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let tail = &bytes[bytes.len().saturating_sub(8)..];
        let mut b = [0u8; 8];
        b[..tail.len()].copy_from_slice(tail);
        self.0 ^= u64::from_le_bytes(b);
    }
    fn write_usize(&mut self, n: usize) {
        self.0 ^= (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Reads every segment in `dir`: the index, the segment table, and what recovery did.
/// The newest segment as open found it: its number, its records, and the length its hint
/// was written for if they came from its hint (0 if they came from a scan).
struct Newest {
    no: u32,
    records: Vec<segment::Found>,
    hinted_len: u64,
}

/// Loads the index of every segment in `dir` (from its hint where one holds, else by scanning
/// it), cutting torn tails; also returns the newest segment's records.
fn load(dir: &Path) -> Result<(State, Recovery, Option<Newest>), StoreError> {
    let listing = || format!("cannot list environment {}", dir.display());
    let mut found = Vec::new();
    let mut hints = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_context(e, listing()))? {
        let entry = entry.map_err(|e| io_context(e, listing()))?;
        let name = entry.file_name();
        if let Some(no) = name.to_str().and_then(segment::parse_name) {
            found.push((no, entry.path()));
        } else if let Some(no) = name.to_str().and_then(hint::parse_name) {
            hints.push(no);
        } else if name
            .to_str()
            .and_then(|n| n.strip_suffix(".tmp"))
            .and_then(hint::parse_name)
            .is_some()
        {
            // A hint whose writing a crash cut short.
            let _ = fs::remove_file(entry.path());
        }
    }
    found.sort();
    let mut state = State::default();
    let mut rec = Recovery::default();
    let mut buf = Vec::new();
    let newest = found.last().map(|(no, _)| *no);
    let mut newest_records = None;
    for (no, path) in found {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_context(e, format!("cannot open {}", path.display())))?;
        let len = file
            .metadata()
            .map_err(|e| io_context(e, format!("cannot stat {}", path.display())))?
            .len();
        if len > MAX_SEGMENT_BYTES {
            return Err(StoreError::Corrupt(format!(
                "{} has {len} bytes, more than any segment ({MAX_SEGMENT_BYTES})",
                path.display()
            )));
        }
        if len < HEADER_LEN {
            if Some(no) != newest {
                return Err(StoreError::Corrupt(format!(
                    "{} has {len} bytes, too few for a segment header",
                    path.display()
                )));
            }
            drop(file);
            fs::remove_file(&path)
                .and_then(|()| segment::sync_dir(dir))
                .map_err(|e| io_context(e, format!("cannot remove {}", path.display())))?;
            rec.torn_bytes += len;
            continue;
        }
        buf.clear();
        buf.resize(HEADER_LEN as usize, 0);
        segment::read_exact_at(&file, &mut buf, 0)
            .map_err(|e| io_context(e, format!("cannot read {}", path.display())))?;
        let (header_no, version) = segment::decode_header(&buf, &path)?;
        if header_no != no {
            return Err(StoreError::Corrupt(format!(
                "{} holds segment {header_no:08x}, not the one its name says",
                path.display()
            )));
        }
        let hinted = fs::read(dir.join(hint::file_name(no)))
            .ok()
            .and_then(|b| hint::decode(&b, no, len));
        let mut hinted_len = 0;
        let (records, end) = match hinted {
            Some(records) => {
                rec.hinted_segments += 1;
                hinted_len = len;
                (records, len)
            }
            None => {
                buf.resize(len as usize, 0);
                segment::read_exact_at(&file, &mut buf, 0)
                    .map_err(|e| io_context(e, format!("cannot read {}", path.display())))?;
                let scan = segment::scan(&buf, no);
                if scan.end < len {
                    file.set_len(scan.end)
                        .and_then(|()| file.sync_all())
                        .map_err(|e| {
                            io_context(e, format!("cannot cut the torn tail of {}", path.display()))
                        })?;
                    rec.torn_bytes += len - scan.end;
                }
                rec.skipped_records += scan.skipped_records;
                rec.skipped_bytes += scan.skipped_bytes;
                if Some(no) != newest {
                    write_hint(dir, no, scan.end, &scan.records);
                }
                (scan.records, scan.end)
            }
        };
        for r in &records {
            state
                .index
                .insert(r.id, Loc::new(no, r.off, r.len, r.recipe));
        }
        if Some(no) == newest {
            newest_records = Some(Newest {
                no,
                records,
                hinted_len,
            });
        }
        state.bytes += end;
        state.segments.insert(
            no,
            SegEntry {
                seg: Arc::new(Segment {
                    no,
                    version,
                    path,
                    file,
                }),
                bytes: end,
            },
        );
    }
    for no in hints {
        if !state.segments.contains_key(&no) {
            let _ = fs::remove_file(dir.join(hint::file_name(no)));
        }
    }
    Ok((state, rec, newest_records))
}

/// Writes segment `no`'s hint (the segment is `seg_len` bytes long and holds `records`), whole
/// or not at all: to a temporary file, fsynced, then renamed. A hint only saves time at open,
/// so failing to write one is not an error.
fn write_hint(dir: &Path, no: u32, seg_len: u64, records: &[segment::Found]) {
    let path = dir.join(hint::file_name(no));
    let tmp = path.with_extension("hint.tmp");
    if write_replacing(&tmp, &path, &hint::encode(no, seg_len, records)).is_err() {
        let _ = fs::remove_file(&tmp);
    }
}

/// Writes `content` to `tmp` (see [`write_new_file`]) and renames it over `path`: `path` then
/// holds either its old content or the whole new one.
fn write_replacing(tmp: &Path, path: &Path, content: &[u8]) -> io::Result<File> {
    let file = write_new_file(tmp, content)?;
    fs::rename(tmp, path)?;
    Ok(file)
}

/// Closing writes the newest segment's hint (after making the segment durable), so the next
/// open reads no segment at all unless something was appended since.
impl Drop for Environment {
    fn drop(&mut self) {
        let w = match self.writer.get_mut() {
            Ok(w) => w,
            Err(poisoned) => poisoned.into_inner(),
        };
        let stale = w.hintable && !w.broken && w.len > HEADER_LEN && w.len != w.hinted_len;
        if stale && w.active.file.sync_data().is_ok() {
            write_hint(&self.dir, w.active.no, w.len, &w.records);
        }
    }
}

/// Where a record is, as the index says: its segment, offset, data length, and whether it is
/// a recipe.
type Located = (Arc<Segment>, u32, u32, bool);

impl Environment {
    /// Where `id`'s record is, marking it used.
    fn locate(&self, id: &ChunkId) -> Option<Located> {
        let st = self.read();
        let loc = st.index.get(id)?;
        loc.mark_used();
        let seg = st.segments.get(&loc.seg)?.seg.clone();
        Some((seg, loc.off, loc.len(), loc.recipe()))
    }

    /// The data of the record `at` of `id`, verified; a damaged record is dropped and
    /// reported as [`StoreError::Corrupt`].
    fn record_data(&self, id: &ChunkId, at: &Located) -> Result<Vec<u8>, StoreError> {
        let (seg, off, len, recipe) = at;
        match Self::read_record(seg, id, *off, *len, *recipe)? {
            Ok(data) => Ok(data),
            Err(why) => Err(self.drop_damaged(id, seg, *off, &why)),
        }
    }

    /// The length and parts of the recipe `at` of `id`, if every part is still held whole
    /// (they are marked used, so that eviction keeps them); a recipe that lost a part is
    /// dropped from the index, one whose parts do not add up to its length is damaged.
    fn recipe_parts(
        &self,
        id: &ChunkId,
        at: &Located,
    ) -> Result<Option<(u32, Vec<ChunkId>)>, StoreError> {
        let data = self.record_data(id, at)?;
        let Some((len, parts)) = segment::decode_recipe(&data) else {
            return Err(self.drop_damaged(id, &at.0, at.1, "a recipe that names no parts"));
        };
        let st = self.read();
        let mut sum = 0u64;
        let whole = parts.iter().all(|p| {
            st.index.get(p).is_some_and(|l| {
                l.mark_used();
                sum += u64::from(l.len());
                !l.recipe()
            })
        });
        drop(st);
        if !whole {
            self.write().index.remove_at(id, at.0.no, at.1);
            return Ok(None);
        }
        if sum != u64::from(len) {
            let why = format!("its recipe's parts make {sum} bytes, not the {len} it names");
            return Err(self.drop_damaged(id, &at.0, at.1, &why));
        }
        Ok(Some((len, parts)))
    }

    /// Whether `id` can be read: held whole, or as a recipe whose parts are all held. A
    /// damaged recipe counts as not held (and is dropped).
    fn holds(&self, id: &ChunkId) -> Result<bool, StoreError> {
        match self.locate(id) {
            None => Ok(false),
            Some((_, _, _, false)) => Ok(true),
            Some(at) => match self.recipe_parts(id, &at) {
                Ok(parts) => Ok(parts.is_some()),
                Err(StoreError::Corrupt(_)) => Ok(false),
                Err(e) => Err(e),
            },
        }
    }

    /// The bytes of `id`, held whole or as a recipe (uncounted: see [`ChunkStore::get`]).
    fn read_chunk(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(at) = self.locate(id) else {
            return Ok(None);
        };
        if !at.3 {
            return self.record_data(id, &at).map(Some);
        }
        let Some((len, parts)) = self.recipe_parts(id, &at)? else {
            return Ok(None);
        };
        // `len` is what the parts held add up to.
        let mut out = Vec::with_capacity(len as usize);
        for p in &parts {
            match self.locate(p) {
                Some(part) if !part.3 => out.extend_from_slice(&self.record_data(p, &part)?),
                _ => {
                    // A part evicted since the recipe was checked.
                    self.write().index.remove_at(id, at.0.no, at.1);
                    return Ok(None);
                }
            }
        }
        Ok(Some(out))
    }

    /// Whether `id` is held whole (not as a recipe).
    fn holds_whole(&self, id: &ChunkId) -> bool {
        self.read().index.get(id).is_some_and(|l| !l.recipe())
    }
}

/// The most parts a recipe names.
const MAX_RECIPE_PARTS: usize = 1 << 16;

impl ChunkStore for Environment {
    fn contains(&self, id: &ChunkId) -> Result<bool, StoreError> {
        let hit = self.holds(id)?;
        self.count(hit);
        Ok(hit)
    }

    fn get(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, StoreError> {
        let found = self.read_chunk(id)?;
        self.count(found.is_some());
        Ok(found)
    }

    /// Keeps the recipe in the newest segment, if every part is held (a part kept as a recipe
    /// is replaced by its own parts, so every recipe names whole chunks) and their lengths add
    /// up to `len`. A recipe outlives its parts only as a dead record: `contains` and `get`
    /// check the parts and drop it.
    fn put_recipe(&self, id: &ChunkId, len: u64, parts: &[ChunkId]) -> Result<bool, StoreError> {
        if parts.is_empty() || len > self.config.max_chunk_bytes() {
            return Ok(false);
        }
        // A recipe that lost a part does not count: `holds` drops it, and a new one replaces it.
        if self.holds(id)? {
            return Ok(true);
        }
        let mut flat = Vec::with_capacity(parts.len());
        for p in parts {
            match self.locate(p) {
                None => return Ok(false),
                Some((_, _, _, false)) => flat.push(*p),
                Some(at) => match self.recipe_parts(p, &at) {
                    Ok(Some((_, inner))) => flat.extend(inner),
                    Ok(None) | Err(StoreError::Corrupt(_)) => return Ok(false),
                    Err(e) => return Err(e),
                },
            }
            if flat.len() > MAX_RECIPE_PARTS {
                return Ok(false);
            }
        }
        if (segment::RECIPE_HEAD + 32 * flat.len()) as u64 > self.config.max_chunk_bytes() {
            return Ok(false);
        }
        let mut w = self.writer();
        {
            let st = self.read();
            if st.index.contains(id) {
                return Ok(true);
            }
            let mut sum = 0u64;
            for p in &flat {
                match st.index.get(p) {
                    Some(l) if !l.recipe() => {
                        l.mark_used();
                        sum += u64::from(l.len());
                    }
                    _ => return Ok(false),
                }
            }
            if sum != len {
                return Ok(false);
            }
        }
        let data = segment::encode_recipe(len as u32, &flat);
        self.append(&mut w, id, &data, xxh3_64(&data), true)?;
        self.evict(&mut w)?;
        Ok(true)
    }

    fn put(&self, id: &ChunkId, data: &[u8]) -> Result<(), StoreError> {
        if data.len() as u64 > self.config.max_chunk_bytes() {
            return Err(StoreError::Refused(format!(
                "a chunk of {} bytes is larger than environment {} takes ({} bytes, set by segment_bytes)",
                data.len(),
                self.dir.display(),
                self.config.max_chunk_bytes()
            )));
        }
        // A recipe of `id` gives way to its bytes (it may have lost a part).
        if self.holds_whole(id) {
            return Ok(());
        }
        let sum = xxh3_64(data);
        let mut w = self.writer();
        if self.holds_whole(id) {
            return Ok(());
        }
        self.append(&mut w, id, data, sum, false)?;
        self.evict(&mut w)
    }

    fn contains_many(&self, ids: &[ChunkId]) -> Result<Vec<bool>, StoreError> {
        let st = self.read();
        let mut recipes = Vec::new();
        let mut out: Vec<bool> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                st.index.get(id).is_some_and(|l| {
                    l.mark_used();
                    if l.recipe() {
                        recipes.push(i);
                    }
                    true
                })
            })
            .collect();
        drop(st);
        for i in recipes {
            out[i] = self.holds(&ids[i])?;
        }
        let hits = out.iter().filter(|&&h| h).count() as u64;
        self.counters.hits.fetch_add(hits, Ordering::Relaxed);
        self.counters
            .misses
            .fetch_add(out.len() as u64 - hits, Ordering::Relaxed);
        Ok(out)
    }

    fn sync(&self) -> Result<(), StoreError> {
        let w = self.writer();
        w.active
            .file
            .sync_data()
            .map_err(|e| io_context(e, format!("cannot fsync {}", w.active.path.display())))?;
        w.sketches.file.sync_data().map_err(|e| {
            io_context(
                e,
                format!(
                    "cannot fsync {}",
                    self.dir.join(sketch::FILE_NAME).display()
                ),
            )
        })
    }

    /// Appends the sketches to the sketch file (not fsynced: they are hints), compacting it
    /// first when it has outgrown a 32nd of `max_bytes`.
    fn remember(&self, sketches: &[Sketch]) -> Result<(), StoreError> {
        check_sketches(sketches)?;
        if sketches.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for s in sketches {
            sketch::encode_record(&mut buf, s);
        }
        let mut w = self.writer();
        if w.sketches.len > self.sketch_limit() {
            self.compact_sketches(&mut w, false)?;
        }
        let path = self.dir.join(sketch::FILE_NAME);
        let off = w.sketches.len;
        if off + buf.len() as u64 > sketch::MAX_FILE_BYTES {
            return Err(StoreError::Refused(format!(
                "{} sketches take {} bytes, more than the sketch file {} holds ({} bytes)",
                sketches.len(),
                buf.len(),
                path.display(),
                sketch::MAX_FILE_BYTES
            )));
        }
        let w = &mut *w;
        write_or_cut(
            &mut w.space_left,
            &w.sketches.file,
            &buf,
            off,
            format_args!(
                "environment {}: writing sketches to {}",
                self.dir.display(),
                path.display()
            ),
        )
        .map_err(|(e, _)| e)?;
        w.sketches.len += buf.len() as u64;
        self.counters
            .sketch_bytes
            .store(w.sketches.len, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the sketch file and returns its records of chunks still held, oldest first (a
    /// sketch remembered again counts once, at its newest place); at most [`RECALL_MAX`], the
    /// newest.
    fn recall(&self) -> Result<Vec<Sketch>, StoreError> {
        self.recall_newest(RECALL_MAX)
    }

    /// Writes `note-KEY.tmp` and renames it over `note-KEY` (under the writer lock, so two
    /// streams never share the temporary file). Not fsynced: a note torn by a crash fails
    /// its checksum and reads as none.
    fn keep_note(&self, key: &str, note: &[u8]) -> Result<(), StoreError> {
        check_note(key, note)?;
        let path = self.dir.join(note::file_name(key));
        let tmp = path.with_extension("tmp");
        let _w = self.writer();
        fs::write(&tmp, note::encode(note))
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io_context(e, format!("cannot write {}", path.display()))
            })
    }

    /// Reads `note-KEY`; a missing file or one that does not verify is no note.
    fn note(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_note_key(key)?;
        let path = self.dir.join(note::file_name(key));
        let mut b = Vec::new();
        let read = File::open(&path)
            .and_then(|f| io::Read::take(f, note::MAX_FILE_BYTES + 1).read_to_end(&mut b));
        match read {
            Ok(_) => Ok(note::decode(&b).map(<[u8]>::to_vec)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_context(e, format!("cannot read {}", path.display()))),
        }
    }
}
