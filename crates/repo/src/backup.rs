//! `backup`: a tree into a snapshot, through Neptune's filtration.
//!
//! Each file is cut into FastCDC chunks. A chunk whose keyed BLAKE3 id the repository holds
//! is a duplicate (nothing stored). Otherwise its super-features find up to `top_k` whole
//! chunks that share some (Neptune's top-k candidates); the chunk is delta-encoded against each
//! and the smallest delta kept when it is below `delta_worth` of the chunk. A delta's base is
//! always a whole chunk, so any chunk is rebuilt from at most two blobs (shortcut chains). A
//! chunk stored whole becomes a base for what follows. Blobs go into compressed frames in
//! packs; each pack is stored with its index file before the next begins, and the snapshot
//! last, so a backup cut off at any point leaves a valid repository whose packs the next
//! backup reuses.
//!
//! A file whose size and mtime match the parent snapshot's, and whose inode and ctime match
//! the files cache this machine kept of that snapshot, is not read again.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use dedupwire_engine::chunk::{ChunkerSpec, StreamChunker};

use crate::blob::{BlobId, BlobKind};
use crate::files_cache::{FilesCache, Stamp};
use crate::pack::PackBuilder;
use crate::repository::{encode_delta, RepoError, Repository, Result};
use crate::snapshot::{Snapshot, Summary, SNAPSHOT_VERSION};
use crate::tree::{text_or_hex, Node, NodeKind, Tree};

/// What to back up and how.
#[derive(Debug, Clone, Default)]
pub struct BackupOptions {
    /// Paths to back up (files or directories).
    pub paths: Vec<PathBuf>,
    /// Tags for the snapshot.
    pub tags: Vec<String>,
    /// Glob patterns of paths to leave out (matched against the whole path and the name).
    pub excludes: Vec<String>,
    /// Read every file, even those the parent snapshot has unchanged.
    pub force_read: bool,
    /// The snapshot to compare with (default: the latest of the same host and paths).
    pub parent: Option<String>,
    /// The host recorded (default: this machine's name).
    pub host: Option<String>,
    /// Where this repository's files caches live (`None`: no cache, every file is read).
    pub files_cache: Option<PathBuf>,
}

/// Where a backup is, for progress displays.
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    /// Files done.
    pub files: u64,
    /// Bytes of file contents done (read, or taken unchanged).
    pub bytes: u64,
}

/// A finished backup.
#[derive(Debug, Clone)]
pub struct BackupResult {
    /// The snapshot's id.
    pub id: String,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// Paths that could not be read, with why (left out of the snapshot).
    pub warnings: Vec<String>,
    /// Why the files cache could not be written, if it could not (the snapshot is sound; the
    /// next backup reads every file).
    pub cache_warning: Option<String>,
}

struct Backup<'r, 'p> {
    repo: &'r mut Repository,
    builder: PackBuilder,
    /// Tree blobs, packed apart from file data so that reading a snapshot's trees opens few
    /// frames (an unchanged backup reads them all).
    trees: PackBuilder,
    /// Whole chunks in `builder`, readable as delta bases before the pack is stored.
    pending: HashMap<BlobId, Vec<u8>>,
    /// Every blob id in `builder`.
    pending_ids: HashSet<BlobId>,
    chunker: Box<dyn dedupwire_engine::chunk::Chunker>,
    excludes: globset::GlobSet,
    force_read: bool,
    summary: Summary,
    warnings: Vec<String>,
    progress: Progress,
    on_progress: &'p mut dyn FnMut(Progress),
    delta: Vec<u8>,
    best: Vec<u8>,
    config: crate::repository::Config,
    /// The lock object that keeps prune from deleting what this backup may use (held until
    /// the snapshot is stored), and when it was last refreshed.
    lock: Option<(String, i64)>,
    /// The parent snapshot's files cache.
    old_stamps: Option<FilesCache>,
    /// This snapshot's files cache, filled as files are taken.
    stamps: FilesCache,
}

impl Drop for Backup<'_, '_> {
    fn drop(&mut self) {
        self.release_lock();
    }
}

/// Backs up `opts.paths` into a new snapshot.
pub fn backup(
    repo: &mut Repository,
    opts: &BackupOptions,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<BackupResult> {
    if opts.paths.is_empty() {
        return Err(RepoError::Invalid("no path to back up".to_string()));
    }
    let mut globs = globset::GlobSetBuilder::new();
    for pattern in &opts.excludes {
        let glob = globset::Glob::new(pattern)
            .map_err(|e| RepoError::Invalid(format!("--exclude {pattern:?}: {e}")))?;
        globs.add(glob);
    }
    let excludes = globs
        .build()
        .map_err(|e| RepoError::Invalid(format!("--exclude: {e}")))?;
    let mut paths = Vec::new();
    for p in &opts.paths {
        let abs = std::path::absolute(p)
            .map_err(|e| RepoError::Invalid(format!("{}: {e}", p.display())))?;
        fs::symlink_metadata(&abs)
            .map_err(|e| RepoError::Invalid(format!("{}: {e}", abs.display())))?;
        paths.push(abs);
    }
    paths.sort();
    paths.dedup();
    let host = opts.host.clone().unwrap_or_else(hostname);
    let path_texts: Vec<String> = paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let parent = match &opts.parent {
        Some(spec) => Some(repo.find_snapshot(spec)?),
        None => repo
            .snapshots()?
            .into_iter()
            .rev()
            .find(|(_, s)| s.host == host && s.paths == path_texts),
    };
    // Read before the lock is taken: a prune may have just rewritten it elsewhere. Without
    // it, every file is read.
    let parent_tree = match &parent {
        Some((_, s)) => repo.read_tree(&s.tree).ok(),
        None => None,
    };
    let c = repo.config().chunker;
    let chunker = ChunkerSpec::Cdc {
        min: c.min,
        avg: c.avg,
        max: c.max,
    }
    .build()
    .map_err(|e| RepoError::Invalid(format!("chunker: {e}")))?;
    let time_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let old_stamps = match (&opts.files_cache, &parent) {
        (Some(dir), Some((id, _))) if !opts.force_read => FilesCache::load(dir, id),
        _ => None,
    };
    let lock = repo.lock(&host)?;
    let builder = repo.pack_builder();
    let trees = repo.pack_builder();
    let repo_config = repo.config().clone();
    let mut b = Backup {
        repo,
        builder,
        trees,
        pending: HashMap::new(),
        pending_ids: HashSet::new(),
        chunker,
        excludes,
        force_read: opts.force_read,
        summary: Summary::default(),
        warnings: Vec::new(),
        progress: Progress::default(),
        on_progress,
        delta: Vec::new(),
        best: Vec::new(),
        config: repo_config,
        lock: Some(lock),
        old_stamps,
        stamps: FilesCache::default(),
    };
    let mut root = Tree::default();
    for (path, text) in paths.iter().zip(&path_texts) {
        let md = fs::symlink_metadata(path)
            .map_err(|e| RepoError::Invalid(format!("{}: {e}", path.display())))?;
        let old = parent_tree
            .as_ref()
            .and_then(|t| t.nodes.iter().find(|n| n.name.as_deref() == Some(text)));
        if let Some(mut node) = b.node(path, &md, old)? {
            node.name = Some(text.clone());
            node.name_hex = None;
            root.nodes.push(node);
        }
    }
    let tree = b.store_tree(&root, parent.as_ref().map(|(_, s)| s.tree))?;
    b.flush()?;
    let snapshot = Snapshot {
        version: SNAPSHOT_VERSION,
        time_ns,
        host,
        user: std::env::var("USER").unwrap_or_default(),
        paths: path_texts,
        tags: opts.tags.clone(),
        tree,
        parent: parent.map(|(id, _)| id),
        summary: b.summary.clone(),
    };
    let warnings = std::mem::take(&mut b.warnings);
    let mut stamps = std::mem::take(&mut b.stamps);
    let id = b.repo.save_snapshot(&snapshot)?;
    let mut cache_warning = None;
    if let Some(dir) = &opts.files_cache {
        stamps.snapshot = id.clone();
        stamps.seal();
        match stamps.save(dir) {
            Ok(()) => {
                if let Some(parent) = &snapshot.parent {
                    FilesCache::remove(dir, parent);
                }
            }
            Err(e) => {
                cache_warning = Some(format!(
                    "the files cache could not be written to {}: {e}",
                    dir.display()
                ))
            }
        }
    }
    Ok(BackupResult {
        id,
        snapshot,
        warnings,
        cache_warning,
    })
}

/// Chunk bytes whose ids and super-features are computed at once, in parallel.
const BATCH_BYTES: usize = 4 << 20;

/// This machine's name.
pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

fn mtime_ns(md: &fs::Metadata) -> i64 {
    md.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(md.mtime_nsec())
}

fn stamp(md: &fs::Metadata) -> Stamp {
    Stamp {
        inode: md.ino(),
        ctime_ns: md
            .ctime()
            .saturating_mul(1_000_000_000)
            .saturating_add(md.ctime_nsec()),
    }
}

impl Backup<'_, '_> {
    fn warn(&mut self, path: &Path, what: impl std::fmt::Display) {
        self.summary.errors += 1;
        self.warnings.push(format!("{}: {what}", path.display()));
    }

    /// The node of `path`, or `None` when it is left out (excluded, unreadable, a device).
    fn node(&mut self, path: &Path, md: &fs::Metadata, old: Option<&Node>) -> Result<Option<Node>> {
        if !self.excludes.is_empty()
            && (self.excludes.is_match(path)
                || path.file_name().is_some_and(|n| self.excludes.is_match(n)))
        {
            return Ok(None);
        }
        let (name, name_hex) = text_or_hex(path.file_name().map_or(b"", |n| n.as_bytes()));
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            self.summary.dirs += 1;
            let old_tree = match old.map(|n| &n.kind) {
                Some(NodeKind::Dir { subtree }) if !self.force_read => {
                    self.repo.read_tree(subtree).ok()
                }
                _ => None,
            };
            let Some(tree) = self.dir(path, old_tree.as_ref())? else {
                return Ok(None);
            };
            let old_id = match old.map(|n| &n.kind) {
                Some(NodeKind::Dir { subtree }) => Some(*subtree),
                _ => None,
            };
            NodeKind::Dir {
                subtree: self.store_tree(&tree, old_id)?,
            }
        } else if ft.is_file() {
            let key = self.path_key(path);
            let same_file = self
                .old_stamps
                .as_ref()
                .is_some_and(|c| c.get(&key) == Some(stamp(md)));
            let unchanged = match old {
                Some(o) if !self.force_read && same_file && o.mtime_ns == mtime_ns(md) => {
                    match &o.kind {
                        NodeKind::File { size, content }
                            if *size == md.len() && content.iter().all(|id| self.known(id)) =>
                        {
                            Some(content.clone())
                        }
                        _ => None,
                    }
                }
                _ => None,
            };
            let was_file = matches!(old.map(|o| &o.kind), Some(NodeKind::File { .. }));
            let (content, size) = match unchanged {
                Some(c) => {
                    self.summary.files_unchanged += 1;
                    self.progress.bytes += md.len();
                    (c, md.len())
                }
                None => match self.file(path) {
                    Ok((c, read)) => {
                        if was_file {
                            self.summary.files_changed += 1;
                        } else {
                            self.summary.files_new += 1;
                        }
                        if read != md.len() {
                            self.warnings.push(format!(
                                "{}: changed while being read ({} before, {read} bytes read); \
                                 the snapshot holds what was read",
                                path.display(),
                                md.len()
                            ));
                        }
                        (c, read)
                    }
                    Err(FileError::Read(e)) => {
                        self.warn(path, format!("not backed up: {e}"));
                        return Ok(None);
                    }
                    Err(FileError::Repo(e)) => return Err(e),
                },
            };
            self.stamps.push(key, stamp(md));
            self.summary.bytes_total += size;
            self.progress.files += 1;
            (self.on_progress)(self.progress);
            NodeKind::File { size, content }
        } else if ft.is_symlink() {
            let target = match fs::read_link(path) {
                Ok(t) => t,
                Err(e) => {
                    self.warn(path, format!("not backed up: {e}"));
                    return Ok(None);
                }
            };
            let (target, target_hex) = text_or_hex(target.as_os_str().as_bytes());
            NodeKind::Symlink { target, target_hex }
        } else {
            self.warn(path, "not backed up: not a file, directory or symlink");
            return Ok(None);
        };
        Ok(Some(Node {
            name,
            name_hex,
            kind,
            mode: md.mode() & 0o7777,
            mtime_ns: mtime_ns(md),
            uid: md.uid(),
            gid: md.gid(),
        }))
    }

    /// A path's key in the files cache: its keyed hash, so the cache names no path.
    fn path_key(&self, path: &Path) -> [u8; 16] {
        let id = self.repo.id_of(path.as_os_str().as_bytes());
        id.0[..16].try_into().expect("16 bytes")
    }

    /// Whether a blob is stored (in the repository or in the pack being built).
    fn known(&self, id: &BlobId) -> bool {
        self.pending_ids.contains(id) || self.repo.index().contains(id)
    }

    fn dir(&mut self, path: &Path, old: Option<&Tree>) -> Result<Option<Tree>> {
        let entries = match fs::read_dir(path) {
            Ok(e) => e,
            Err(e) => {
                self.warn(path, format!("not backed up: {e}"));
                return Ok(None);
            }
        };
        let mut names: Vec<std::ffi::OsString> = Vec::new();
        for e in entries {
            match e {
                Ok(e) => names.push(e.file_name()),
                Err(e) => self.warn(path, format!("an entry could not be listed: {e}")),
            }
        }
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let old_names: Vec<(Vec<u8>, usize)> = old.map_or_else(Vec::new, |t| {
            let mut v: Vec<(Vec<u8>, usize)> = t
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| Some((n.name_bytes()?, i)))
                .collect();
            v.sort();
            v
        });
        let mut tree = Tree::default();
        for name in names {
            let child = path.join(&name);
            let md = match fs::symlink_metadata(&child) {
                Ok(md) => md,
                Err(e) => {
                    self.warn(&child, format!("not backed up (vanished?): {e}"));
                    continue;
                }
            };
            let old_node = old.and_then(|t| {
                let at = old_names
                    .binary_search_by(|(n, _)| n.as_slice().cmp(name.as_bytes()))
                    .ok()?;
                t.nodes.get(old_names[at].1)
            });
            if let Some(node) = self.node(&child, &md, old_node)? {
                tree.nodes.push(node);
            }
        }
        Ok(Some(tree))
    }

    /// Reads and stores one file's chunks; returns their ids and the bytes read.
    fn file(&mut self, path: &Path) -> Result<(Vec<BlobId>, u64), FileError> {
        let f = fs::File::open(path).map_err(FileError::Read)?;
        let chunker =
            std::mem::replace(&mut self.chunker, Box::new(dedupwire_engine::chunk::Whole));
        let r = self.chunks(&*chunker, f);
        self.chunker = chunker;
        r
    }

    fn chunks(
        &mut self,
        chunker: &dyn dedupwire_engine::chunk::Chunker,
        f: fs::File,
    ) -> Result<(Vec<BlobId>, u64), FileError> {
        let mut stream = StreamChunker::new(chunker, f);
        let mut ids = Vec::new();
        let mut read = 0u64;
        let mut batch: Vec<Vec<u8>> = Vec::new();
        loop {
            batch.clear();
            let mut bytes = 0;
            let mut end = false;
            while bytes < BATCH_BYTES {
                match stream.next_chunk() {
                    Ok(Some(c)) => {
                        bytes += c.len();
                        batch.push(c.to_vec());
                    }
                    Ok(None) => {
                        end = true;
                        break;
                    }
                    Err(e) => return Err(FileError::Read(std::io::Error::other(e.to_string()))),
                }
            }
            for (chunk, (id, features)) in batch.iter().zip(self.prepare(&batch)) {
                read += chunk.len() as u64;
                self.summary.bytes_read += chunk.len() as u64;
                self.progress.bytes += chunk.len() as u64;
                ids.push(
                    self.store_chunk(chunk, id, features)
                        .map_err(FileError::Repo)?,
                );
                if ids.len() % 64 == 0 {
                    (self.on_progress)(self.progress);
                }
            }
            if end {
                return Ok((ids, read));
            }
        }
    }

    /// The ids of a batch of chunks, with the super-features of those the repository lacks,
    /// computed on rayon's workers.
    fn prepare(&self, batch: &[Vec<u8>]) -> Vec<(BlobId, Option<Vec<u64>>)> {
        use rayon::prelude::*;
        let repo = &*self.repo;
        let sf = &self.config.super_features;
        let one = |c: &Vec<u8>| {
            let id = repo.id_of(c);
            let features = (!repo.index().contains(&id)).then(|| sf.super_features(c));
            (id, features)
        };
        if batch.len() > 1 {
            batch.par_iter().map(one).collect()
        } else {
            batch.iter().map(one).collect()
        }
    }

    /// Stores one chunk: nothing if known, else a delta against a similar whole chunk where
    /// that pays, else whole.
    fn store_chunk(
        &mut self,
        chunk: &[u8],
        id: BlobId,
        features: Option<Vec<u64>>,
    ) -> Result<BlobId> {
        if self.known(&id) {
            self.summary.chunks_duplicate += 1;
            self.summary.bytes_duplicate += chunk.len() as u64;
            return Ok(id);
        }
        let config = &self.config;
        let features = features.unwrap_or_else(|| config.super_features.super_features(chunk));
        let limit = (chunk.len() as f64 * config.delta_worth) as usize;
        let mut base_used = None;
        for base_id in self.repo.index().similar(&features, config.top_k) {
            let stored;
            let base: &[u8] = match self.pending.get(&base_id) {
                Some(b) => b,
                None => match self.repo.read_blob(&base_id) {
                    Ok(b) => {
                        stored = b;
                        &stored
                    }
                    // A base that cannot be read is no base; check reports the damage.
                    Err(RepoError::Damaged(_) | RepoError::MissingBlob(_)) => continue,
                    Err(e) => return Err(e),
                },
            };
            encode_delta(base, chunk, &mut self.delta);
            if self.delta.len() < limit
                && (base_used.is_none() || self.delta.len() < self.best.len())
            {
                std::mem::swap(&mut self.delta, &mut self.best);
                base_used = Some(base_id);
            }
        }
        match base_used {
            Some(base) => {
                self.summary.chunks_delta += 1;
                self.summary.bytes_delta_chunks += chunk.len() as u64;
                self.summary.bytes_delta += self.best.len() as u64;
                let delta = std::mem::take(&mut self.best);
                self.repo.add_blob(
                    &mut self.builder,
                    id,
                    BlobKind::Delta,
                    &delta,
                    Some(base),
                    Vec::new(),
                );
                self.best = delta;
            }
            None => {
                self.summary.chunks_whole += 1;
                self.summary.bytes_whole += chunk.len() as u64;
                self.repo.add_blob(
                    &mut self.builder,
                    id,
                    BlobKind::Data,
                    chunk,
                    None,
                    features.clone(),
                );
                self.repo.index_mut().add_features(id, &features);
                self.pending.insert(id, chunk.to_vec());
            }
        }
        self.pending_ids.insert(id);
        if self.builder.size() >= self.config.pack_size {
            self.flush()?;
        }
        Ok(id)
    }

    /// Stores a tree unless known: as a delta against the whole tree behind `old` (the same
    /// directory in the parent snapshot) where that pays, else whole.
    fn store_tree(&mut self, tree: &Tree, old: Option<BlobId>) -> Result<BlobId> {
        let json = serde_json::to_vec(tree).expect("serializable");
        let id = self.repo.id_of(&json);
        if self.known(&id) {
            return Ok(id);
        }
        let base = old
            .and_then(|old| {
                let loc = self.repo.index().get(&old)?;
                match loc.kind {
                    BlobKind::Tree => Some(old),
                    BlobKind::TreeDelta => loc.base,
                    _ => None,
                }
            })
            .filter(|b| self.repo.index().contains(b));
        let delta = match base.map(|b| (b, self.repo.read_blob(&b))) {
            Some((b, Ok(bytes))) => {
                encode_delta(&bytes, &json, &mut self.delta);
                ((self.delta.len() as f64) < json.len() as f64 * self.config.delta_worth)
                    .then_some(b)
            }
            Some((_, Err(RepoError::Damaged(_) | RepoError::MissingBlob(_)))) | None => None,
            Some((_, Err(e))) => return Err(e),
        };
        match delta {
            Some(base) => self.repo.add_blob(
                &mut self.trees,
                id,
                BlobKind::TreeDelta,
                &self.delta,
                Some(base),
                Vec::new(),
            ),
            None => {
                self.repo
                    .add_blob(&mut self.trees, id, BlobKind::Tree, &json, None, Vec::new())
            }
        }
        self.pending_ids.insert(id);
        if self.trees.size() >= self.config.pack_size {
            self.flush()?;
        }
        Ok(id)
    }

    fn release_lock(&mut self) {
        if let Some((name, _)) = self.lock.take() {
            let _ = self.repo.unlock(&name);
        }
    }

    /// Stores the packs being built (data, then trees; each with its index file), refreshing
    /// the lock now and then.
    fn flush(&mut self) -> Result<()> {
        if let Some((old, at)) = &self.lock {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            if now - at > crate::repository::LOCK_REFRESH_NS {
                let old = old.clone();
                self.lock = Some(self.repo.lock(&hostname())?);
                let _ = self.repo.unlock(&old);
            }
        }
        for trees in [false, true] {
            let next = self.repo.pack_builder();
            let builder = if trees {
                std::mem::replace(&mut self.trees, next)
            } else {
                std::mem::replace(&mut self.builder, next)
            };
            if let Some((_, added)) = self.repo.store_pack(builder)? {
                self.summary.bytes_added += added;
            }
        }
        self.pending.clear();
        self.pending_ids.clear();
        Ok(())
    }
}

enum FileError {
    Read(std::io::Error),
    Repo(RepoError),
}
