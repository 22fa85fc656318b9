//! [`FeatureIndex`]: the cuckoo table, the metadata log and the checkpoint put together.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::format::{
    entry_len, Entry, ENTRY_MIN, HEADER_LEN, MAX_IDS_PER_ENTRY, MAX_LOG_BYTES, PAGE_SIZE,
};
use crate::log::{sync_dir, Log, ScanEntry, Truncation};
use crate::table::{Find, Table, BUCKET_BYTES, TOMB};

/// Name of the metadata log inside the index directory.
pub const LOG_FILE: &str = "features.log";
/// Name of the table checkpoint inside the index directory.
pub const CHECKPOINT_FILE: &str = "table.ckpt";
const LOG_NEW: &str = "features.log.new";
const LOG_COMPACT: &str = "features.log.compact";
const CHECKPOINT_TMP: &str = "table.ckpt.tmp";

/// Tuning of a [`FeatureIndex`]; `Config::default()` follows sDedup.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Upper bound of records kept per feature (newest first, least recently inserted evicted).
    pub max_per_feature: usize,
    /// Pages (64 KiB each) in the LRU page cache; sDedup uses 128 (8 MiB).
    pub cache_pages: usize,
    /// Features the table is sized for when created (it grows beyond as needed).
    pub initial_features: usize,
    /// Load factor (occupied buckets / buckets) above which the table grows.
    pub max_load: f64,
    /// Factor by which the number of slots grows (> 1).
    pub growth: f64,
    /// Displacements one insertion may make before the table grows.
    pub max_kicks: u32,
    /// Compact when dead bytes exceed this fraction of the log …
    pub compact_dead_ratio: f64,
    /// … and the log is at least this many bytes.
    pub compact_min_bytes: u64,
    /// Write a table checkpoint in [`FeatureIndex::close`], so the next open need not scan.
    pub checkpoint_on_close: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_per_feature: 8,
            cache_pages: 128,
            initial_features: 1 << 16,
            max_load: 0.95,
            growth: 1.25,
            max_kicks: 500,
            compact_dead_ratio: 0.5,
            compact_min_bytes: 8 << 20,
            checkpoint_on_close: true,
        }
    }
}

impl Config {
    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.max_per_feature == 0 || self.max_per_feature > MAX_IDS_PER_ENTRY {
            return bad(format!(
                "max_per_feature must be in 1..={MAX_IDS_PER_ENTRY}, not {}",
                self.max_per_feature
            ));
        }
        if self.cache_pages == 0 {
            return bad("cache_pages must be at least 1".into());
        }
        if !(self.max_load > 0.1 && self.max_load <= 0.995) {
            return bad(format!(
                "max_load must be in (0.1, 0.995], not {}",
                self.max_load
            ));
        }
        if !(self.growth > 1.01 && self.growth <= 16.0) {
            return bad(format!("growth must be in (1.01, 16], not {}", self.growth));
        }
        if !(self.compact_dead_ratio > 0.0 && self.compact_dead_ratio < 1.0) {
            return bad(format!(
                "compact_dead_ratio must be in (0, 1), not {}",
                self.compact_dead_ratio
            ));
        }
        Ok(())
    }
}

/// Counters and sizes of a [`FeatureIndex`].
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Features with at least one record.
    pub features: u64,
    /// (feature, record) pairs: the sum of the list lengths.
    pub references: u64,
    /// Slots of the cuckoo table (8 buckets each).
    pub slots: u64,
    /// Occupied buckets / buckets.
    pub load_factor: f64,
    /// Buckets freed by removals and not yet reclaimed by a rebuild.
    pub tombstones: u64,
    /// RAM of the cuckoo table (6 bytes per bucket).
    pub table_bytes: u64,
    /// `table_bytes / features`: the RAM cost of one feature, page cache excluded.
    pub bytes_per_feature: f64,
    /// RAM of the page cache and tail page.
    pub cache_bytes: u64,
    /// Pages currently in the page cache.
    pub cache_pages: u64,
    /// Page cache hits.
    pub cache_hits: u64,
    /// Page cache misses (page reads from the file).
    pub cache_misses: u64,
    /// `hits / (hits + misses)`, 0 when there was no access.
    pub cache_hit_ratio: f64,
    /// Length of the log in bytes.
    pub log_bytes: u64,
    /// Bytes of the log in entries still referenced by the table.
    pub live_bytes: u64,
    /// Bytes of superseded entries, deletions and padding.
    pub dead_bytes: u64,
    /// Times the table grew (rehash).
    pub grows: u64,
    /// Times the log was compacted.
    pub compactions: u64,
}

/// What [`FeatureIndex::open`] did to get a consistent index back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// A torn tail that was cut off the log (crash in the middle of a write).
    pub truncation: Option<Truncation>,
    /// Whether the table was loaded from a checkpoint (else rebuilt from the whole log).
    pub checkpoint_used: bool,
    /// Why an existing checkpoint was not used.
    pub checkpoint_ignored: Option<String>,
    /// Log entries read to rebuild or update the table.
    pub replayed_entries: u64,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.checkpoint_used {
            write!(
                f,
                "table loaded from checkpoint, {} log entries replayed",
                self.replayed_entries
            )?;
        } else {
            write!(
                f,
                "table rebuilt from {} log entries",
                self.replayed_entries
            )?;
        }
        if let Some(why) = &self.checkpoint_ignored {
            write!(f, "; checkpoint ignored: {why}")?;
        }
        if let Some(t) = &self.truncation {
            write!(
                f,
                "; torn tail of {} truncated at byte {} ({} bytes discarded): {}",
                t.path.display(),
                t.offset,
                t.discarded,
                t.reason
            )?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Op {
    Insert(u64),
    Remove(u64),
}

/// sDedup's feature index: maps 64-bit sketch features to the records that have them.
///
/// Record ids are `u64`s chosen by the caller (e.g. a document's position in the oplog); larger
/// ids are taken to be newer when [`FeatureIndex::lookup`] breaks ties. Per feature the index
/// keeps at most `max_per_feature` records, newest (most recently inserted) first.
///
/// Durability: [`insert`](Self::insert) buffers; [`flush`](Self::flush) hands the bytes to the
/// OS (survives a process crash); [`sync`](Self::sync) fsyncs (survives a power loss). One
/// insert of K features writes K log entries; a crash can keep a prefix of them. One process
/// may open a directory at a time.
pub struct FeatureIndex {
    dir: PathBuf,
    config: Config,
    log: Log,
    table: Table,
    live_bytes: u64,
    refs: u64,
    grows: u64,
    compactions: u64,
    recovery: Recovery,
    /// Scratch: the ids of the entry last matched by `find`.
    ids: Vec<u64>,
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, "remove", e)),
    }
}

/// The features in their first-seen order, each once.
fn distinct(features: &[u64]) -> Vec<u64> {
    if features.len() <= 32 {
        let mut out = Vec::with_capacity(features.len());
        for &f in features {
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    } else {
        let mut out = features.to_vec();
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl FeatureIndex {
    /// Opens the index in `dir` (created if missing), recovering from a crash if needed.
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<FeatureIndex> {
        config.validate()?;
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "create directory", e))?;
        for stale in [LOG_NEW, LOG_COMPACT, CHECKPOINT_TMP] {
            remove_if_exists(&dir.join(stale))?;
        }
        let log_path = dir.join(LOG_FILE);
        let ckpt_path = dir.join(CHECKPOINT_FILE);
        let exists = log_path
            .try_exists()
            .map_err(|e| Error::io(&log_path, "stat", e))?;
        if !exists {
            remove_if_exists(&ckpt_path)?;
            let mut log = Log::create(&dir.join(LOG_NEW), 0, config.cache_pages)?;
            std::fs::rename(dir.join(LOG_NEW), &log_path)
                .map_err(|e| Error::io(&log_path, "rename", e))?;
            sync_dir(&dir)?;
            log.set_path(log_path);
            let table = Table::new(
                Table::slots_for(config.initial_features, config.max_load),
                config.max_kicks,
            );
            return Ok(FeatureIndex {
                dir,
                config,
                log,
                table,
                live_bytes: 0,
                refs: 0,
                grows: 0,
                compactions: 0,
                recovery: Recovery::default(),
                ids: Vec::new(),
            });
        }

        let mut recovery = Recovery::default();
        // (generation, durable log length, live bytes, references, table) of a usable checkpoint.
        let mut ckpt = match checkpoint::read(&ckpt_path) {
            Ok(Some(c)) => {
                let meta = (c.generation, c.log_len, c.live_bytes, c.refs);
                match Table::from_raw(c.sigs, c.ptrs, config.max_kicks) {
                    Some(t) => Some((meta, t)),
                    None => {
                        recovery.checkpoint_ignored = Some("inconsistent table arrays".into());
                        None
                    }
                }
            }
            Ok(None) => None,
            Err(why) => {
                recovery.checkpoint_ignored = Some(why);
                None
            }
        };
        let mut scanned: Vec<ScanEntry> = Vec::new();
        let mut ckpt_generation = None;
        let (log, truncation) = Log::open(
            &log_path,
            config.cache_pages,
            |generation| match &ckpt {
                Some(((g, log_len, ..), _)) if *g == generation => {
                    ckpt_generation = Some(generation);
                    (*log_len, *log_len)
                }
                _ => (0, HEADER_LEN),
            },
            &mut scanned,
        )?;
        recovery.truncation = truncation;
        recovery.replayed_entries = scanned.len() as u64;
        if ckpt_generation.is_none() {
            if let Some(((g, ..), _)) = ckpt.take() {
                recovery.checkpoint_ignored = Some(format!(
                    "checkpoint is for log generation {g}, the log is generation {}",
                    log.generation()
                ));
            }
        }

        let mut index = FeatureIndex {
            dir,
            table: Table::new(1, config.max_kicks),
            config,
            log,
            live_bytes: 0,
            refs: 0,
            grows: 0,
            compactions: 0,
            recovery: Recovery::default(),
            ids: Vec::new(),
        };
        match ckpt {
            Some(((_, _, live, refs), table)) => {
                recovery.checkpoint_used = true;
                index.table = table;
                index.live_bytes = live;
                index.refs = refs;
                for e in &scanned {
                    index.replay(e)?;
                }
            }
            None => index.rebuild(scanned),
        }
        index.recovery = recovery;
        Ok(index)
    }

    /// Rebuilds the table from every entry of the log (last entry per feature wins).
    fn rebuild(&mut self, mut scanned: Vec<ScanEntry>) {
        scanned.sort_unstable_by_key(|e| (e.feature, e.ptr));
        let mut keys = Vec::new();
        let (mut live, mut refs) = (0u64, 0u64);
        for (i, e) in scanned.iter().enumerate() {
            let last = scanned.get(i + 1).is_none_or(|n| n.feature != e.feature);
            if last && !e.delete {
                keys.push((e.feature, e.ptr));
                live += u64::from(e.len);
                refs += ((usize::from(e.len) - ENTRY_MIN) / 8) as u64;
            }
        }
        drop(scanned);
        let slots = Table::slots_for(keys.len(), self.config.max_load / self.config.growth).max(
            Table::slots_for(self.config.initial_features, self.config.max_load),
        );
        self.table = Table::build(&keys, slots, self.config.growth, self.config.max_kicks);
        self.live_bytes = live;
        self.refs = refs;
    }

    /// Applies one log entry written after the checkpoint.
    fn replay(&mut self, e: &ScanEntry) -> Result<()> {
        let n = ((usize::from(e.len) - ENTRY_MIN) / 8) as u64;
        match self.find(e.feature)? {
            (Find::Found(b), old_len) => {
                let old_n = self.ids.len() as u64;
                if e.delete {
                    self.table.remove(b);
                    self.live_bytes -= old_len;
                } else {
                    self.table.set_ptr(b, e.ptr);
                    self.live_bytes = self.live_bytes - old_len + u64::from(e.len);
                }
                self.refs = self.refs - old_n + n;
            }
            (Find::Absent { free }, _) => {
                if !e.delete {
                    self.place(e.feature, e.ptr, free)?;
                    self.live_bytes += u64::from(e.len);
                    self.refs += n;
                }
            }
        }
        Ok(())
    }

    /// Looks a feature up; on a match its ids are left in `self.ids` and its length returned.
    fn find(&mut self, feature: u64) -> Result<(Find, u64)> {
        let log = &mut self.log;
        let ids = &mut self.ids;
        let mut len = 0u64;
        let r = self.table.find(feature, |p| {
            let e = log.entry(p)?;
            match e {
                Entry::Feature { feature: f, .. } if f == feature => {
                    ids.clear();
                    ids.extend(e.ids());
                    len = e.len() as u64;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })?;
        Ok((r, len))
    }

    /// Puts an absent feature into the table, displacing or growing as needed.
    fn place(&mut self, feature: u64, ptr: u32, free: Option<(usize, u16)>) -> Result<()> {
        match free {
            Some((b, sig)) => self.table.place(b, sig, ptr, feature),
            None => {
                let log = &mut self.log;
                let homeless = self.table.insert(feature, ptr, |p| match log.entry(p)? {
                    Entry::Feature { feature, .. } => Ok(feature),
                    Entry::Pad { .. } => unreachable!("log.entry never returns padding"),
                })?;
                if let Some(h) = homeless {
                    return self.grow(Some(h));
                }
            }
        }
        if self.table.load() > self.config.max_load {
            self.grow(None)?;
        }
        Ok(())
    }

    /// Live pointers of the table, sorted (log order).
    fn live_ptrs(&self) -> Vec<u32> {
        let mut live: Vec<u32> = self
            .table
            .ptrs()
            .iter()
            .copied()
            .filter(|&p| p > TOMB)
            .collect();
        live.sort_unstable();
        live
    }

    /// Rehashes into a larger table; `extra` is a key that found no bucket.
    fn grow(&mut self, extra: Option<(u64, u32)>) -> Result<()> {
        let live = self.live_ptrs();
        let mut keys = Vec::with_capacity(live.len() + 1);
        self.log.for_each_at(&live, |i, feature, _| {
            keys.push((feature, live[i]));
            Ok(())
        })?;
        keys.extend(extra);
        let slots = ((self.table.slots() as f64 * self.config.growth).ceil() as usize).max(
            Table::slots_for(keys.len(), self.config.max_load / self.config.growth),
        );
        self.table = Table::build(&keys, slots, self.config.growth, self.config.max_kicks);
        self.grows += 1;
        Ok(())
    }

    fn dead_bytes(&self) -> u64 {
        self.log.len() - HEADER_LEN - self.live_bytes
    }

    /// Compacts when the log holds too much dead data or nears the 32 GiB pointer limit.
    fn maybe_compact(&mut self) -> Result<()> {
        let len = self.log.len();
        let dead = self.dead_bytes();
        let near_full = len + 2 * PAGE_SIZE > MAX_LOG_BYTES && dead > 2 * PAGE_SIZE;
        if near_full
            || (len >= self.config.compact_min_bytes
                && dead as f64 > self.config.compact_dead_ratio * len as f64)
        {
            self.compact()?;
        }
        Ok(())
    }

    /// Rewrites the live entries into a new log file, atomically replacing the old one.
    pub fn compact(&mut self) -> Result<()> {
        self.log.flush()?;
        let live = self.live_ptrs();
        let tmp = self.dir.join(LOG_COMPACT);
        let mut fresh = Log::create(&tmp, self.log.generation() + 1, self.config.cache_pages)?;
        let mut keys = Vec::with_capacity(live.len());
        let mut ids = Vec::new();
        let mut live_bytes = 0u64;
        let copied = self.log.for_each_at(&live, |_, feature, it| {
            ids.clear();
            ids.extend(it);
            keys.push((feature, fresh.append(feature, &ids)?));
            live_bytes += entry_len(ids.len()) as u64;
            Ok(())
        });
        let done = copied.and_then(|()| fresh.sync()).and_then(|()| {
            let path = self.dir.join(LOG_FILE);
            std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, "rename", e))?;
            fresh.set_path(path);
            sync_dir(&self.dir)
        });
        if let Err(e) = done {
            drop(fresh);
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        // The checkpoint, if any, describes the old generation.
        remove_if_exists(&self.dir.join(CHECKPOINT_FILE))?;
        self.log = fresh;
        self.table = Table::build(
            &keys,
            self.table.slots(),
            self.config.growth,
            self.config.max_kicks,
        );
        self.live_bytes = live_bytes;
        self.compactions += 1;
        Ok(())
    }

    fn update(&mut self, feature: u64, op: Op) -> Result<()> {
        self.maybe_compact()?;
        let max = self.config.max_per_feature;
        match self.find(feature)? {
            (Find::Found(b), old_len) => {
                let old_n = self.ids.len();
                match op {
                    Op::Insert(r) => {
                        if self.ids.first() == Some(&r) && old_n <= max {
                            return Ok(());
                        }
                        self.ids.retain(|&x| x != r);
                        self.ids.insert(0, r);
                        self.ids.truncate(max);
                    }
                    Op::Remove(r) => {
                        if !self.ids.contains(&r) {
                            return Ok(());
                        }
                        self.ids.retain(|&x| x != r);
                    }
                }
                let ptr = self.log.append(feature, &self.ids)?;
                if self.ids.is_empty() {
                    self.table.remove(b);
                    self.live_bytes -= old_len;
                } else {
                    self.table.set_ptr(b, ptr);
                    self.live_bytes = self.live_bytes - old_len + entry_len(self.ids.len()) as u64;
                }
                self.refs = self.refs - old_n as u64 + self.ids.len() as u64;
            }
            (Find::Absent { free }, _) => {
                if let Op::Insert(r) = op {
                    let ptr = self.log.append(feature, &[r])?;
                    self.place(feature, ptr, free)?;
                    self.live_bytes += entry_len(1) as u64;
                    self.refs += 1;
                }
            }
        }
        Ok(())
    }

    /// Records that `record` has each of `features` (duplicates count once); it becomes the
    /// newest record of each, evicting the least recently inserted beyond `max_per_feature`.
    pub fn insert(&mut self, record: u64, features: &[u64]) -> Result<()> {
        for f in distinct(features) {
            self.update(f, Op::Insert(record))?;
        }
        Ok(())
    }

    /// Removes `record` from the lists of `features` (the sketch it was inserted with).
    pub fn remove(&mut self, record: u64, features: &[u64]) -> Result<()> {
        for &f in features {
            self.update(f, Op::Remove(record))?;
        }
        Ok(())
    }

    /// The records that have `feature`, newest first.
    pub fn get(&mut self, feature: u64) -> Result<Vec<u64>> {
        Ok(match self.find(feature)? {
            (Find::Found(_), _) => {
                let mut ids = self.ids.clone();
                ids.truncate(self.config.max_per_feature);
                ids
            }
            (Find::Absent { .. }, _) => Vec::new(),
        })
    }

    /// Candidate records sharing at least one of `features` (a sketch; duplicates count once),
    /// with the number shared, best first: most shared, then the newest (largest) id.
    pub fn lookup(&mut self, features: &[u64]) -> Result<Vec<(u64, u32)>> {
        let mut all: Vec<u64> = Vec::new();
        for f in distinct(features) {
            if let (Find::Found(_), _) = self.find(f)? {
                let n = self.ids.len().min(self.config.max_per_feature);
                all.extend_from_slice(&self.ids[..n]);
            }
        }
        all.sort_unstable();
        let mut out: Vec<(u64, u32)> = Vec::new();
        for id in all {
            match out.last_mut() {
                Some((last, n)) if *last == id => *n += 1,
                _ => out.push((id, 1)),
            }
        }
        out.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        Ok(out)
    }

    /// Hands buffered log bytes to the OS (survives a process crash, not a power loss).
    pub fn flush(&mut self) -> Result<()> {
        self.log.flush()
    }

    /// Flushes and fsyncs the log: everything inserted so far survives a power loss.
    pub fn sync(&mut self) -> Result<()> {
        self.log.sync()
    }

    /// Syncs, then writes a checkpoint of the table so the next open need not scan the log.
    pub fn checkpoint(&mut self) -> Result<()> {
        self.log.sync()?;
        let bytes = checkpoint::encode(
            self.log.generation(),
            self.log.len(),
            self.live_bytes,
            self.refs,
            self.table.sigs(),
            self.table.ptrs(),
        );
        checkpoint::write_atomic(
            &self.dir,
            &self.dir.join(CHECKPOINT_TMP),
            &self.dir.join(CHECKPOINT_FILE),
            &bytes,
        )
    }

    /// Syncs (and checkpoints when configured) and closes the index.
    pub fn close(mut self) -> Result<()> {
        if self.config.checkpoint_on_close {
            self.checkpoint()
        } else {
            self.sync()
        }
    }

    /// What opening the index had to do (torn tail truncated, checkpoint used or ignored).
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The index directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes of RAM held: the cuckoo table, the page cache and the log's buffers.
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes() + self.log.memory_bytes()
    }

    /// Counters and sizes.
    pub fn stats(&self) -> Stats {
        let (hits, misses) = self.log.cache().counters();
        let features = self.table.len() as u64;
        let table_bytes = (self.table.buckets() * BUCKET_BYTES) as u64;
        Stats {
            features,
            references: self.refs,
            slots: self.table.slots() as u64,
            load_factor: self.table.load(),
            tombstones: self.table.tombstones() as u64,
            table_bytes,
            bytes_per_feature: if features == 0 {
                0.0
            } else {
                table_bytes as f64 / features as f64
            },
            cache_bytes: self.log.memory_bytes() as u64,
            cache_pages: self.log.cache().len() as u64,
            cache_hits: hits,
            cache_misses: misses,
            cache_hit_ratio: if hits + misses == 0 {
                0.0
            } else {
                hits as f64 / (hits + misses) as f64
            },
            log_bytes: self.log.len(),
            live_bytes: self.live_bytes,
            dead_bytes: self.dead_bytes(),
            grows: self.grows,
            compactions: self.compactions,
        }
    }
}

impl Drop for FeatureIndex {
    fn drop(&mut self) {
        // Best effort: a process exit keeps what was inserted; errors surface on the next open.
        let _ = self.log.flush();
    }
}

impl fmt::Debug for FeatureIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FeatureIndex")
            .field("dir", &self.dir)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Probe;

    #[test]
    fn rejects_bad_config() {
        let dir = tempfile::tempdir().unwrap();
        for cfg in [
            Config {
                max_per_feature: 0,
                ..Config::default()
            },
            Config {
                cache_pages: 0,
                ..Config::default()
            },
            Config {
                max_load: 1.0,
                ..Config::default()
            },
            Config {
                growth: 1.0,
                ..Config::default()
            },
        ] {
            assert!(matches!(
                FeatureIndex::open(dir.path(), cfg),
                Err(Error::Config(_))
            ));
        }
    }

    #[test]
    fn signature_collisions_are_resolved_by_the_full_feature() {
        // Two features with the same slot and the same 16-bit signature in a one-slot table.
        let mut seen: std::collections::HashMap<u16, u64> = std::collections::HashMap::new();
        let (a, b) = (0u64..)
            .find_map(|f| {
                let sig = Probe::new(f).at(0, 1).1;
                seen.insert(sig, f).map(|g| (g, f))
            })
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            initial_features: 1,
            ..Config::default()
        };
        let mut ix = FeatureIndex::open(dir.path(), cfg).unwrap();
        assert_eq!(ix.stats().slots, 1);
        ix.insert(1, &[a]).unwrap();
        assert_eq!(ix.get(b).unwrap(), Vec::<u64>::new());
        ix.insert(2, &[b]).unwrap();
        ix.insert(3, &[a]).unwrap();
        assert_eq!(ix.get(a).unwrap(), vec![3, 1]);
        assert_eq!(ix.get(b).unwrap(), vec![2]);
        assert_eq!(ix.lookup(&[a, b]).unwrap(), vec![(3, 1), (2, 1), (1, 1)]);
        ix.remove(2, &[b]).unwrap();
        assert_eq!(ix.get(b).unwrap(), Vec::<u64>::new());
        assert_eq!(ix.get(a).unwrap(), vec![3, 1]);
    }

    #[test]
    fn reinserting_moves_a_record_to_the_front_and_the_bound_evicts_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            max_per_feature: 3,
            ..Config::default()
        };
        let mut ix = FeatureIndex::open(dir.path(), cfg).unwrap();
        for r in [1, 2, 3] {
            ix.insert(r, &[9]).unwrap();
        }
        let len = ix.stats().log_bytes;
        ix.insert(3, &[9, 9]).unwrap(); // already the newest: nothing written
        assert_eq!(ix.stats().log_bytes, len);
        ix.insert(1, &[9]).unwrap();
        assert_eq!(ix.get(9).unwrap(), vec![1, 3, 2]);
        ix.insert(4, &[9]).unwrap();
        assert_eq!(ix.get(9).unwrap(), vec![4, 1, 3]);
        let s = ix.stats();
        assert_eq!((s.features, s.references), (1, 3));
        assert!(s.dead_bytes > 0 && s.live_bytes == entry_len(3) as u64);
    }

    #[test]
    fn recovery_report_reads_well() {
        let r = Recovery {
            truncation: Some(Truncation {
                path: "x/features.log".into(),
                offset: 96,
                discarded: 13,
                reason: "entry checksum mismatch".into(),
            }),
            checkpoint_used: false,
            checkpoint_ignored: None,
            replayed_entries: 2,
        };
        assert_eq!(
            r.to_string(),
            "table rebuilt from 2 log entries; torn tail of x/features.log truncated at byte 96 \
             (13 bytes discarded): entry checksum mismatch"
        );
    }
}
