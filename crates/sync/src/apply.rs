//! The receiving end's trees: `ROOT/NAME` is replaced by a new version all at once, or not at
//! all.
//!
//! A new version is built in a **staging** directory (`ROOT/.dedupwire/staging/<n>/`):
//! directories and symlinks first, then each file — hard-linked from the current tree when
//! its contents and metadata are unchanged (and that inode is not linked already), copied
//! locally when its contents exist anywhere in the current tree, written from the sender's
//! bytes otherwise. Written files leave their aligned all-zero blocks as holes, and local
//! copies go data extent by data extent, so sparse files stay sparse. Each written file is
//! checked against its BLAKE3 hash and gets its mode and mtime after its contents;
//! directories get theirs deepest first, after their contents; then one `syncfs` makes it all
//! durable. Then one `renameat2(RENAME_EXCHANGE)` swaps the staging
//! directory with `ROOT/NAME` (a `RENAME_NOREPLACE` rename when NAME is new), and the old
//! version, now at the staging path, is removed. Anything that fails before the swap leaves
//! `ROOT/NAME` as it was; leftovers of a crash are removed at the next [`TreeRoot::open`].
//!
//! Nothing is ever written through a symlink: the manifest guarantees that every parent of
//! an entry is a directory entry before it, staging is a fresh directory this end creates
//! entry by entry, and files are created with `O_CREAT | O_EXCL | O_NOFOLLOW`.
//!
//! The manifest of each committed tree is cached in `ROOT/.dedupwire/trees/NAME` with the
//! tree's inode, so the next send compares against it without reading the tree. The cache
//! file's mtime is the tree's *epoch*: it is set once the replaced version is removed, when
//! the tree last matched the manifest. A file is reused (hard-linked, copied, or read as a
//! delta base) only when its size and mtime still match the manifest and its inode has not
//! changed since the epoch (its ctime, which no user can set back, is older), and is hashed
//! again otherwise; a file that fails that check, or is gone, is asked of the sender. So a
//! tree edited by hand on this end, even with its sizes and mtimes put back, is sent right
//! again. A cache for another inode (the tree was replaced by hand) is ignored and the tree is
//! scanned. Owners are not preserved: the receiver owns what it writes, and reads back a file
//! it wrote without read permission (mode 000) by granting itself read for the open.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rustix::fs::{AtFlags, OFlags, RenameFlags, Timespec, Timestamps, CWD, UTIME_OMIT};

use crate::error::{io_at, Error, Result};
use crate::manifest::{self, check_name, mtime_ns, Entry, Kind, Manifest};
use crate::parallel;

/// The directory under ROOT this end keeps its state in (never a tree name).
pub const STATE_DIR: &str = ".dedupwire";
const CACHE_MAGIC: &[u8; 4] = b"DWTC";

/// Checks that `name` may name a tree: one normal path component, not [`STATE_DIR`].
pub fn check_tree_name(name: &[u8]) -> Result<()> {
    check_name(name).map_err(|why| {
        Error::Refused(format!(
            "tree name {:?}: {why}; it must be one path component",
            String::from_utf8_lossy(name)
        ))
    })?;
    if name == STATE_DIR.as_bytes() {
        return Err(Error::Refused(format!(
            "tree name {STATE_DIR:?} is reserved for the receiver's state"
        )));
    }
    Ok(())
}

/// The connection a receive runs on, as the name lock sees it: a second receive of a busy
/// name asks whether the holder's peer is gone (a killed sender whose connection this end has
/// not finished reading), and then ends that connection instead of refusing.
pub trait Peer: Send + Sync {
    /// Whether the peer has hung up, though this end may not have read that far yet.
    fn gone(&self) -> bool;
    /// Ends the connection: its receive fails at its next read or write.
    fn abort(&self);
}

/// Who holds a busy name: the connection of its receive, when the caller said.
type Holder = Option<Arc<dyn Peer>>;

/// How long a receive waits for a name whose holder's peer is gone to be freed.
const TAKEOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The receiving directory: the trees in it, its staging area, the cached manifests, and
/// which names are being received now (with their connections, when known).
pub struct TreeRoot {
    root: PathBuf,
    state: PathBuf,
    busy: Mutex<HashMap<Vec<u8>, Holder>>,
    freed: Condvar,
    seq: AtomicU64,
}

impl std::fmt::Debug for TreeRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeRoot")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// Holds a tree name for one receive; dropping it frees the name.
#[derive(Debug)]
pub struct NameLock<'a> {
    root: &'a TreeRoot,
    name: Vec<u8>,
    took_over: bool,
}

impl NameLock<'_> {
    /// Whether the name was taken from a receive whose sender had gone (a resumed send).
    pub fn took_over(&self) -> bool {
        self.took_over
    }
}

impl Drop for NameLock<'_> {
    fn drop(&mut self) {
        self.root
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.name);
        self.root.freed.notify_all();
    }
}

/// Threads copying local files into staging, at most.
const COPY_THREADS: usize = 4;
/// Copies below which one more thread is not worth starting.
const COPIES_PER_THREAD: usize = 64;

/// Where each file of a new version comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Not a file, or an empty one: nothing to fetch.
    Nothing,
    /// The current tree's file at this old-manifest index has the contents.
    Local(usize),
    /// The sender must send the contents.
    Sender,
}

fn timespec(ns: i64) -> Timespec {
    Timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000) as _,
    }
}

fn times(mtime_ns: i64) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: timespec(mtime_ns),
    }
}

fn set_mtime_at(path: &Path, mtime_ns: i64) -> Result<()> {
    rustix::fs::utimensat(CWD, path, &times(mtime_ns), AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| io_at(path)(e.into()))
}

fn set_file_meta(f: &File, path: &Path, mode: u32, mtime_ns: i64) -> Result<()> {
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io_at(path))?;
    rustix::fs::futimens(f, &times(mtime_ns)).map_err(|e| io_at(path)(e.into()))
}

fn create_new(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(io_at(path))
}

fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io_at(path))
}

/// Removes a tree even where its directories are read-only (never following a symlink).
pub fn remove_tree(path: &Path) -> Result<()> {
    let md = match fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_at(path)(e)),
    };
    if !md.is_dir() {
        return fs::remove_file(path).map_err(io_at(path));
    }
    if md.mode() & 0o700 != 0o700 {
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o700));
    }
    for d in fs::read_dir(path).map_err(io_at(path))? {
        let d = d.map_err(io_at(path))?;
        remove_tree(&d.path())?;
    }
    fs::remove_dir(path).map_err(io_at(path))
}

impl TreeRoot {
    /// Opens (creating if needed) the receiving directory `root` and removes what an
    /// interrupted receive left behind. One process per root: the caller holds a lock (the
    /// chunk environment's, kept under [`TreeRoot::env_dir`]).
    pub fn open(root: &Path) -> Result<TreeRoot> {
        let state = root.join(STATE_DIR);
        for d in ["staging", "trees", "trees.new"] {
            let p = state.join(d);
            fs::create_dir_all(&p).map_err(io_at(&p))?;
        }
        let t = TreeRoot {
            root: root.to_path_buf(),
            state,
            busy: Mutex::default(),
            freed: Condvar::new(),
            seq: AtomicU64::new(0),
        };
        Ok(t)
    }

    /// Removes leftovers of interrupted receives: staging directories (a new version not
    /// swapped in, or an old one not yet removed) and finishes a cache update cut short.
    /// Call once at start-up, while holding the root's lock.
    pub fn clean(&self) -> Result<()> {
        let staging = self.state.join("staging");
        for d in fs::read_dir(&staging).map_err(io_at(&staging))? {
            remove_tree(&d.map_err(io_at(&staging))?.path())?;
        }
        let new = self.state.join("trees.new");
        for d in fs::read_dir(&new).map_err(io_at(&new))? {
            let d = d.map_err(io_at(&new))?;
            let name = d.file_name();
            let cache = d.path();
            if self.cache_matches(&cache, name.as_bytes()) {
                let dst = self.state.join("trees").join(&name);
                fs::rename(&cache, &dst).map_err(io_at(&cache))?;
            } else {
                fs::remove_file(&cache).map_err(io_at(&cache))?;
            }
        }
        Ok(())
    }

    /// Where the chunk environment lives: `ROOT/.dedupwire/env`.
    pub fn env_dir(&self) -> PathBuf {
        self.state.join("env")
    }

    /// The tree called `name`'s path.
    pub fn tree_path(&self, name: &[u8]) -> PathBuf {
        self.root.join(std::ffi::OsStr::from_bytes(name))
    }

    /// Reserves `name` for one receive; a second receive of the same name at once is refused.
    pub fn lock(&self, name: &[u8]) -> Result<NameLock<'_>> {
        self.lock_as(name, None)
    }

    /// [`lock`](TreeRoot::lock) for a receive on `peer`'s connection. When the name is busy
    /// and its holder's peer is gone, the holder's connection is ended and this waits (up to
    /// 30 s) for it to let go: a send run again right after a killed one goes ahead at once.
    pub fn lock_as(&self, name: &[u8], peer: Option<Arc<dyn Peer>>) -> Result<NameLock<'_>> {
        check_tree_name(name)?;
        let deadline = std::time::Instant::now() + TAKEOVER_WAIT;
        let mut took_over = false;
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let Some(holder) = busy.get(name) else {
                busy.insert(name.to_vec(), peer);
                return Ok(NameLock {
                    root: self,
                    name: name.to_vec(),
                    took_over,
                });
            };
            let shown = String::from_utf8_lossy(name);
            match holder {
                Some(h) if h.gone() => {
                    h.abort();
                    took_over = true;
                }
                _ => {
                    return Err(Error::Refused(format!(
                        "tree {shown:?} is being received from another connection right now; \
                         try again when that send has finished"
                    )))
                }
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(Error::Refused(format!(
                    "tree {shown:?} is still held by a receive whose sender has gone; try again \
                     in a minute"
                )));
            }
            busy = self
                .freed
                .wait_timeout(busy, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn tree_id(&self, name: &[u8]) -> Option<(u64, u64)> {
        let md = fs::symlink_metadata(self.tree_path(name)).ok()?;
        md.is_dir().then(|| (md.dev(), md.ino()))
    }

    fn read_cache(&self, path: &Path, name: &[u8]) -> Option<Manifest> {
        let bytes = fs::read(path).ok()?;
        let (head, body) = bytes.split_at_checked(20)?;
        if &head[..4] != CACHE_MAGIC {
            return None;
        }
        let dev = u64::from_le_bytes(head[4..12].try_into().ok()?);
        let ino = u64::from_le_bytes(head[12..20].try_into().ok()?);
        if self.tree_id(name)? != (dev, ino) {
            return None;
        }
        Manifest::decode(body).ok()
    }

    fn cache_matches(&self, path: &Path, name: &[u8]) -> bool {
        self.read_cache(path, name).is_some()
    }

    /// The manifest of the current tree `name`: cached, or scanned (hashing every file) when
    /// there is no valid cache; empty when there is no such directory.
    pub fn current(&self, name: &[u8]) -> Result<Manifest> {
        Ok(self.current_checked(name)?.0)
    }

    /// [`current`](TreeRoot::current), with the [`Verifier`] that checks its files before
    /// they are reused.
    pub fn current_checked(&self, name: &[u8]) -> Result<(Manifest, Verifier)> {
        let n = std::ffi::OsStr::from_bytes(name);
        let verifier = |epoch| Verifier {
            tree: self.tree_path(name),
            epoch,
            seen: HashMap::new(),
        };
        for dir in ["trees.new", "trees"] {
            let path = self.state.join(dir).join(n);
            if let Some(m) = self.read_cache(&path, name) {
                // No epoch readable: every file is hashed before it is reused.
                let epoch = fs::metadata(&path).map_or(i64::MIN, |md| mtime_ns(&md));
                return Ok((m, verifier(Some(epoch))));
            }
        }
        if self.tree_id(name).is_none() {
            return Ok((Manifest::default(), verifier(None)));
        }
        let m = manifest::scan(&self.tree_path(name), &mut |_| {})?.manifest;
        Ok((m, verifier(None)))
    }

    /// The contents of the current tree's file `entry` (of its manifest), checked against
    /// the entry's size and hash: the base a delta from the sender is applied to.
    pub fn read_base(&self, name: &[u8], entry: &Entry) -> Result<Vec<u8>> {
        let Kind::File { size, hash } = entry.kind else {
            return Err(Error::Protocol(format!(
                "{} is not a file",
                entry.display()
            )));
        };
        let path = self.tree_path(name).join(entry.rel_path());
        let mut f = open_readable(&path).map_err(io_at(&path))?;
        let mut bytes = Vec::with_capacity(size as usize);
        (&mut f)
            .take(size + 1)
            .read_to_end(&mut bytes)
            .map_err(io_at(&path))?;
        if bytes.len() as u64 != size || *blake3::hash(&bytes).as_bytes() != hash {
            return Err(Error::Mismatch(format!(
                "{}: changed on this end during the send, so the delta the sender made against \
                 it cannot be applied; run the send again (it will send the file whole)",
                path.display()
            )));
        }
        Ok(bytes)
    }

    /// Where each entry of `new` comes from, given the current tree `old` that `verifier`
    /// checks: files whose contents are somewhere in the current tree, and pass the check, are
    /// taken from there.
    pub fn resolve(&self, verifier: &mut Verifier, old: &Manifest, new: &Manifest) -> Vec<Source> {
        let mut by_hash: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
        for (i, e) in old.entries.iter().enumerate() {
            if let Kind::File { hash, size } = e.kind {
                if size > 0 {
                    by_hash.entry(hash).or_default().push(i);
                }
            }
        }
        new.entries
            .iter()
            .map(|e| match e.kind {
                Kind::File { size, hash } if size > 0 => by_hash
                    .get(&hash)
                    .and_then(|c| c.iter().copied().find(|&i| verifier.check(old, i)))
                    .map_or(Source::Sender, Source::Local),
                _ => Source::Nothing,
            })
            .collect()
    }

    /// Builds everything of `new` that does not come from the sender in a fresh staging
    /// directory; the sender's files are then written with [`Staging::write`].
    pub fn begin<'a>(
        &'a self,
        lock: &NameLock<'a>,
        old: &Manifest,
        new: Manifest,
        sources: &[Source],
    ) -> Result<Staging<'a>> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let dir = self
            .state
            .join("staging")
            .join(format!("{}-{n}", std::process::id()));
        fs::create_dir(&dir).map_err(io_at(&dir))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(io_at(&dir))?;
        let mut st = Staging {
            root: self,
            name: lock.name.clone(),
            dir,
            manifest: new,
            needed: Vec::new(),
            unhashed: HashSet::new(),
            next: 0,
            writer: None,
            committed: false,
        };
        let tree = self.tree_path(&lock.name);
        let mut linked: HashSet<u64> = HashSet::new();
        let mut copies: Vec<(PathBuf, PathBuf, usize)> = Vec::new();
        for (i, e) in st.manifest.entries.iter().enumerate() {
            let path = st.dir.join(e.rel_path());
            match &e.kind {
                Kind::Dir => {
                    fs::create_dir(&path).map_err(io_at(&path))?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o700))
                        .map_err(io_at(&path))?;
                }
                Kind::Symlink { target } => {
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &path)
                        .map_err(io_at(&path))?;
                    set_mtime_at(&path, e.mtime_ns)?;
                }
                Kind::File { .. } => match sources[i] {
                    Source::Nothing => {
                        let f = create_new(&path)?;
                        set_file_meta(&f, &path, e.mode, e.mtime_ns)?;
                    }
                    Source::Local(j) => {
                        let from = tree.join(old.entries[j].rel_path());
                        let md = fs::symlink_metadata(&from).map_err(io_at(&from))?;
                        if md.mode() & manifest::MODE_MASK == e.mode
                            && mtime_ns(&md) == e.mtime_ns
                            && md.is_file()
                            && linked.insert(md.ino())
                        {
                            fs::hard_link(&from, &path).map_err(io_at(&path))?;
                        } else {
                            copies.push((from, path, i));
                        }
                    }
                    Source::Sender => st.needed.push(i),
                },
            }
        }
        copy_all(&copies, &st.manifest)?;
        Ok(st)
    }
}

/// Checks files of a current tree against its manifest before they are reused, each at most
/// once per receive.
#[derive(Debug)]
pub struct Verifier {
    tree: PathBuf,
    /// When the tree last matched its cached manifest (see the module doc); `None` for a
    /// manifest just scanned from the tree.
    epoch: Option<i64>,
    seen: HashMap<usize, bool>,
}

impl Verifier {
    /// Whether file `i` of `old` is on disk as the manifest says: same size, and same mtime
    /// with its inode unchanged since the epoch, or else the same BLAKE3.
    pub fn check(&mut self, old: &Manifest, i: usize) -> bool {
        let tree = &self.tree;
        let epoch = self.epoch;
        *self.seen.entry(i).or_insert_with(|| {
            let e = &old.entries[i];
            let Kind::File { size, hash } = e.kind else {
                return false;
            };
            let path = tree.join(e.rel_path());
            let Ok(md) = fs::symlink_metadata(&path) else {
                return false;
            };
            if !md.is_file() || md.len() != size {
                return false;
            }
            let ctime = md
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(md.ctime_nsec());
            if mtime_ns(&md) == e.mtime_ns && epoch.is_none_or(|t| ctime < t) {
                return true;
            }
            let Ok(mut f) = open_readable(&path) else {
                return false;
            };
            let mut h = blake3::Hasher::new();
            if h.update_reader(&mut f).is_err() {
                return false;
            }
            h.count() == size && *h.finalize().as_bytes() == hash
        })
    }
}

/// Opens a file of a current tree for reading, without following a symlink. A file this end
/// wrote with no read permission for its owner (the sender's mode 000, say) is opened by
/// granting the owner read for the moment of the open: a receiver not running as root could
/// otherwise never reuse it.
fn open_readable(path: &Path) -> io::Result<File> {
    let plain = OpenOptions::new()
        .read(true)
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(path);
    let denied = match plain {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => e,
        other => return other,
    };
    let handle = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let st = rustix::fs::fstat(&handle).map_err(io::Error::from)?;
    let mode = st.st_mode & 0o7777;
    let regular =
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
    if !regular || st.st_uid != rustix::process::geteuid().as_raw() || mode & 0o400 != 0 {
        return Err(denied);
    }
    // The O_PATH descriptor names this very inode, whatever happens to `path` meanwhile.
    let by_fd = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&handle)
    ));
    fs::set_permissions(&by_fd, fs::Permissions::from_mode(mode | 0o400))?;
    let opened = File::open(&by_fd);
    let restored = fs::set_permissions(&by_fd, fs::Permissions::from_mode(mode));
    let file = opened?;
    restored?;
    Ok(file)
}

/// Runs the copies `(from, to, new entry)` on a few threads: a release that only touched
/// mtimes copies every file, and on many small files the system calls, not the bytes, cost.
fn copy_all(copies: &[(PathBuf, PathBuf, usize)], manifest: &Manifest) -> Result<()> {
    parallel::for_each(
        copies.len(),
        COPY_THREADS,
        COPIES_PER_THREAD,
        |k| {
            let (from, to, i) = &copies[k];
            copy_file(from, to, &manifest.entries[*i])
        },
        &mut || {},
    )
    .map(drop)
}

/// Copies a current file (checked by [`TreeRoot::resolve`]) into staging with new metadata:
/// `copy_file_range` in the kernel (a reflink where the filesystem can), data extent by data
/// extent so that the copy keeps the file's holes.
fn copy_file(from: &Path, to: &Path, e: &Entry) -> Result<()> {
    let src = open_readable(from).map_err(io_at(from))?;
    let dst = create_new(to)?;
    let size = e.size();
    let changed = || Error::Mismatch(format!("{}: changed while being copied", from.display()));
    if src.metadata().map_err(io_at(from))?.len() != size {
        return Err(changed());
    }
    let mut at = 0u64;
    while at < size {
        let Some(data) = seek_data(&src, at).map_err(io_at(from))? else {
            break;
        };
        let end = seek_hole(&src, data).map_err(io_at(from))?.min(size);
        if !copy_range(&src, &dst, data, end).map_err(io_at(to))? {
            return Err(changed());
        }
        at = end;
    }
    dst.set_len(size).map_err(io_at(to))?;
    set_file_meta(&dst, to, e.mode, e.mtime_ns)
}

/// Copies bytes `pos..end` of `src` to the same place in `dst`: with `copy_file_range`, or by
/// reading and writing where the kernel cannot (another filesystem, an old kernel). Returns
/// false if `src` ended early.
fn copy_range(src: &File, dst: &File, mut pos: u64, end: u64) -> io::Result<bool> {
    use rustix::io::Errno;
    use std::os::unix::fs::FileExt;
    while pos < end {
        let (mut off_in, mut off_out) = (pos, pos);
        let len = usize::try_from(end - pos).unwrap_or(usize::MAX);
        match rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len) {
            Ok(0) => return Ok(false),
            Ok(n) => pos += n as u64,
            Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                let mut buf = vec![0u8; (1 << 20).min(end - pos) as usize];
                while pos < end {
                    let want = buf.len().min((end - pos) as usize);
                    let n = src.read_at(&mut buf[..want], pos)?;
                    if n == 0 {
                        return Ok(false);
                    }
                    dst.write_all_at(&buf[..n], pos)?;
                    pos += n as u64;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// The start of the first data at or after `at`, or `None` when only a hole follows.
fn seek_data(f: &File, at: u64) -> io::Result<Option<u64>> {
    match rustix::fs::seek(f, rustix::fs::SeekFrom::Data(at)) {
        Ok(p) => Ok(Some(p)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The start of the first hole at or after `at` (the end of the file counts as one).
fn seek_hole(f: &File, at: u64) -> io::Result<u64> {
    rustix::fs::seek(f, rustix::fs::SeekFrom::Hole(at)).map_err(Into::into)
}

struct FileWriter {
    index: usize,
    path: PathBuf,
    file: SparseWriter,
    hasher: blake3::Hasher,
    written: u64,
}

/// Holes are made of whole blocks of this size, aligned in the file.
const HOLE_BLOCK: usize = 4096;

/// Writes a new file front to back, leaving its aligned all-zero blocks unwritten: a sparse
/// file (a VM image, a database's preallocated file) arrives as sparse as it left, not with
/// every hole filled in. Writes are gathered to whole blocks, so how the sender's pieces fall
/// does not matter.
struct SparseWriter {
    file: File,
    /// Bytes handed to the file so far (a multiple of [`HOLE_BLOCK`] until `finish`).
    flushed: u64,
    /// The start of the next block, until it is whole.
    partial: Vec<u8>,
}

impl SparseWriter {
    fn new(file: File) -> Self {
        SparseWriter {
            file,
            flushed: 0,
            partial: Vec::with_capacity(HOLE_BLOCK),
        }
    }

    fn write(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        if !self.partial.is_empty() {
            let take = (HOLE_BLOCK - self.partial.len()).min(bytes.len());
            self.partial.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.partial.len() < HOLE_BLOCK {
                return Ok(());
            }
            put_blocks(&self.file, self.flushed, &self.partial)?;
            self.flushed += HOLE_BLOCK as u64;
            self.partial.clear();
        }
        let whole = bytes.len() / HOLE_BLOCK * HOLE_BLOCK;
        put_blocks(&self.file, self.flushed, &bytes[..whole])?;
        self.flushed += whole as u64;
        self.partial.extend_from_slice(&bytes[whole..]);
        Ok(())
    }

    /// Writes `n` zeros: whole blocks of them are left as a hole.
    fn zeros(&mut self, mut n: u64) -> io::Result<()> {
        if !self.partial.is_empty() {
            let take = ((HOLE_BLOCK - self.partial.len()) as u64).min(n) as usize;
            self.partial.resize(self.partial.len() + take, 0);
            n -= take as u64;
            if self.partial.len() < HOLE_BLOCK {
                return Ok(());
            }
            put_blocks(&self.file, self.flushed, &self.partial)?;
            self.flushed += HOLE_BLOCK as u64;
            self.partial.clear();
        }
        let whole = n / HOLE_BLOCK as u64 * HOLE_BLOCK as u64;
        self.flushed += whole;
        self.partial.resize((n - whole) as usize, 0);
        Ok(())
    }

    /// Writes the last partial block and gives the file its full `size` (a trailing hole
    /// included).
    fn finish(&mut self, size: u64) -> io::Result<()> {
        put_blocks(&self.file, self.flushed, &self.partial)?;
        self.flushed += self.partial.len() as u64;
        self.partial.clear();
        debug_assert_eq!(self.flushed, size);
        self.file.set_len(size)
    }
}

/// Writes `bytes` at `at` (a block boundary) block by block: each run of blocks holding a
/// non-zero byte with one call, all-zero blocks not at all.
fn put_blocks(file: &File, at: u64, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let zero = bytes
        .chunks(HOLE_BLOCK)
        .map(|b| b.iter().all(|&x| x == 0))
        .chain(std::iter::once(true));
    let mut run = None;
    for (k, zero) in zero.enumerate() {
        match (zero, run) {
            (false, None) => run = Some(k * HOLE_BLOCK),
            (true, Some(from)) => {
                let to = (k * HOLE_BLOCK).min(bytes.len());
                file.write_all_at(&bytes[from..to], at + from as u64)?;
                run = None;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The version a commit replaced, in staging: removed by [`Retired::remove`], or else at the
/// next start-up ([`TreeRoot::clean`]). Removing it can wait until the sender has its answer.
#[derive(Debug)]
#[must_use = "the replaced version stays on disk until removed"]
pub struct Retired {
    dir: Option<PathBuf>,
    /// The new tree's cached manifest, whose mtime becomes the tree's epoch.
    cache: PathBuf,
}

impl Retired {
    /// Removes the replaced version, then sets the new tree's epoch (removing it touched the
    /// inodes the two versions share). Not called, every reused file is hashed once at the
    /// next receive.
    pub fn remove(self) -> Result<()> {
        if let Some(dir) = &self.dir {
            remove_tree(dir)?;
        }
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        };
        let omit = Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        };
        rustix::fs::utimensat(
            CWD,
            &self.cache,
            &Timestamps {
                last_access: omit,
                last_modification: now,
            },
            AtFlags::empty(),
        )
        .map_err(|e| io_at(&self.cache)(e.into()))
    }
}

/// A new version of a tree being built; dropped before [`Staging::commit`], it is removed and
/// the current tree stays as it was.
pub struct Staging<'a> {
    root: &'a TreeRoot,
    name: Vec<u8>,
    dir: PathBuf,
    manifest: Manifest,
    needed: Vec<usize>,
    /// Needed files whose hash the sender gives at the end ([`Staging::settle`]).
    unhashed: HashSet<usize>,
    next: usize,
    writer: Option<FileWriter>,
    committed: bool,
}

impl std::fmt::Debug for Staging<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("dir", &self.dir)
            .field("needed", &self.needed.len())
            .field("next", &self.next)
            .finish()
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.writer = None;
            let _ = remove_tree(&self.dir);
        }
    }
}

impl Staging<'_> {
    /// The manifest indexes of the files whose contents the sender must send, in the order
    /// it must send them.
    pub fn needed(&self) -> &[usize] {
        &self.needed
    }

    /// The new version's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Marks needed files whose hash the manifest does not hold yet: each takes the hash of
    /// the contents written, to be checked against the sender's by [`Staging::settle`].
    pub fn unhashed(&mut self, entries: &[usize]) {
        self.unhashed.extend(entries);
    }

    /// Checks the hashes of the [unhashed](Staging::unhashed) files, in manifest order,
    /// against the contents written, once every needed file is complete.
    pub fn settle(&mut self, hashes: &[[u8; 32]]) -> Result<()> {
        self.check_complete()?;
        let mut unhashed: Vec<usize> = self.unhashed.iter().copied().collect();
        unhashed.sort_unstable();
        if unhashed.len() != hashes.len() {
            return Err(Error::Protocol(format!(
                "{} hashes for {} files hashed as sent",
                hashes.len(),
                unhashed.len()
            )));
        }
        for (&i, h) in unhashed.iter().zip(hashes) {
            let e = &self.manifest.entries[i];
            if !matches!(e.kind, Kind::File { hash, .. } if hash == *h) {
                return Err(Error::Mismatch(format!(
                    "{}: the contents received do not match the sender's hash",
                    e.display()
                )));
            }
        }
        self.unhashed.clear();
        Ok(())
    }

    fn check_complete(&self) -> Result<()> {
        if self.writer.is_some() || self.next != self.needed.len() {
            return Err(Error::Protocol(format!(
                "commit with {} of {} needed files complete",
                self.next - usize::from(self.writer.is_some()),
                self.needed.len()
            )));
        }
        Ok(())
    }

    /// The next bytes of entry `index`: the file the sender is on, or the next needed one.
    pub fn write(&mut self, index: usize, bytes: &[u8]) -> Result<()> {
        self.put(index, Some(bytes), bytes.len() as u64)
    }

    /// The next `n` bytes of entry `index` are zeros (a hole of the sender's file): hashed,
    /// not written.
    pub fn write_zeros(&mut self, index: usize, n: u64) -> Result<()> {
        self.put(index, None, n)
    }

    /// [`Staging::write`] of `len` bytes: `bytes`, or zeros.
    fn put(&mut self, index: usize, bytes: Option<&[u8]>, len: u64) -> Result<()> {
        if self.writer.as_ref().map(|w| w.index) != Some(index) {
            if self.writer.is_some() {
                return Err(Error::Protocol(format!(
                    "contents for entry {index} while entry {} is incomplete",
                    self.writer.as_ref().map_or(0, |w| w.index)
                )));
            }
            if self.needed.get(self.next) != Some(&index) {
                return Err(Error::Protocol(format!(
                    "contents for entry {index}, which is not the next file needed"
                )));
            }
            self.next += 1;
            let path = self.dir.join(self.manifest.entries[index].rel_path());
            let file = create_new(&path)?;
            self.writer = Some(FileWriter {
                index,
                path,
                file: SparseWriter::new(file),
                hasher: blake3::Hasher::new(),
                written: 0,
            });
        }
        let e = &mut self.manifest.entries[index];
        let Kind::File { size, hash } = e.kind else {
            unreachable!("only files are needed")
        };
        let w = self.writer.as_mut().expect("opened above");
        if w.written.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::Protocol(format!(
                "more bytes than the {size} of {}",
                e.display()
            )));
        }
        match bytes {
            Some(bytes) => {
                w.file.write(bytes).map_err(io_at(&w.path))?;
                w.hasher.update(bytes);
            }
            None => {
                w.file.zeros(len).map_err(io_at(&w.path))?;
                crate::manifest::hash_zeros(&mut w.hasher, len);
            }
        }
        w.written += len;
        if w.written == size {
            let mut w = self.writer.take().expect("present");
            w.file.finish(size).map_err(io_at(&w.path))?;
            let got = *w.hasher.finalize().as_bytes();
            if self.unhashed.contains(&index) {
                e.kind = Kind::File { size, hash: got };
            } else if got != hash {
                return Err(Error::Mismatch(format!(
                    "{}: the contents received do not match the manifest's hash",
                    e.display()
                )));
            }
            set_file_meta(&w.file.file, &w.path, e.mode, e.mtime_ns)?;
        }
        Ok(())
    }

    /// Finishes the new version (directory metadata, fsync) and swaps it in atomically,
    /// once every file is written and [settled](Staging::settle); the old one is left to
    /// [`Retired::remove`].
    pub fn commit(mut self) -> Result<Retired> {
        self.check_complete()?;
        if !self.unhashed.is_empty() {
            return Err(Error::Protocol(format!(
                "commit with {} files not checked against the sender's hash",
                self.unhashed.len()
            )));
        }
        for e in self.manifest.entries.iter().rev() {
            if e.kind == Kind::Dir {
                let path = self.dir.join(e.rel_path());
                fs::set_permissions(&path, fs::Permissions::from_mode(e.mode))
                    .map_err(io_at(&path))?;
                set_mtime_at(&path, e.mtime_ns)?;
            }
        }
        fs::set_permissions(
            &self.dir,
            fs::Permissions::from_mode(self.manifest.root_mode),
        )
        .map_err(io_at(&self.dir))?;
        set_mtime_at(&self.dir, self.manifest.root_mtime_ns)?;
        // One syncfs makes every file and directory of the new version durable: far cheaper
        // than an fsync per file on trees of many small files.
        let d = File::open(&self.dir).map_err(io_at(&self.dir))?;
        rustix::fs::syncfs(&d).map_err(|e| io_at(&self.dir)(e.into()))?;
        drop(d);

        // The cache for the new tree, keyed by its inode, before the swap: after a crash the
        // one matching the tree in place is the right one.
        let md = fs::symlink_metadata(&self.dir).map_err(io_at(&self.dir))?;
        let mut cache = CACHE_MAGIC.to_vec();
        cache.extend_from_slice(&md.dev().to_le_bytes());
        cache.extend_from_slice(&md.ino().to_le_bytes());
        cache.extend_from_slice(&self.manifest.encode());
        let name = std::ffi::OsStr::from_bytes(&self.name);
        let new_cache = self.root.state.join("trees.new").join(name);
        let mut f = File::create(&new_cache).map_err(io_at(&new_cache))?;
        f.write_all(&cache)
            .and_then(|_| f.sync_all())
            .map_err(io_at(&new_cache))?;
        drop(f);

        let target = self.root.tree_path(&self.name);
        let exists = fs::symlink_metadata(&target).is_ok();
        let flags = if exists {
            RenameFlags::EXCHANGE
        } else {
            RenameFlags::NOREPLACE
        };
        if let Err(e) = rustix::fs::renameat_with(CWD, &self.dir, CWD, &target, flags) {
            let _ = fs::remove_file(&new_cache);
            return Err(io_at(&target)(e.into()));
        }
        self.committed = true;
        sync_dir(&self.root.root)?;
        let cache_path = self.root.state.join("trees").join(name);
        fs::rename(&new_cache, &cache_path).map_err(io_at(&cache_path))?;
        sync_dir(&self.root.state.join("trees"))?;
        // The old version is now at the staging path.
        Ok(Retired {
            dir: exists.then(|| self.dir.clone()),
            cache: cache_path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 512-byte blocks allocated to `path`.
    fn blocks(path: &Path) -> u64 {
        fs::metadata(path).unwrap().blocks()
    }

    #[test]
    fn zero_blocks_become_holes_however_the_pieces_fall() {
        let t = tempfile::tempdir().unwrap();
        let mut data = vec![0u8; 1 << 20];
        data[5000..5100].fill(1);
        data[700_000..700_001].fill(2);
        data.extend_from_slice(&[3; 10]);
        data.extend_from_slice(&[0; 9000]);
        for piece in [1usize, 777, 4096, 65_536, 1 << 21] {
            let path = t.path().join(format!("f{piece}"));
            let mut w = SparseWriter::new(create_new(&path).unwrap());
            for p in data.chunks(piece) {
                w.write(p).unwrap();
            }
            w.finish(data.len() as u64).unwrap();
            assert_eq!(fs::read(&path).unwrap(), data, "pieces of {piece}");
            // Three blocks of 4 KiB hold data; a filesystem may round up, but not to a MiB.
            assert!(
                blocks(&path) * 512 < 64 << 10,
                "pieces of {piece}: {} blocks",
                blocks(&path)
            );
        }
    }

    fn write_tree(dir: &Path, files: &[(&str, &[u8])]) {
        fs::create_dir_all(dir).unwrap();
        for (p, c) in files {
            let path = dir.join(p);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, c).unwrap();
        }
    }

    fn receive(root: &TreeRoot, name: &[u8], src: &Path) -> usize {
        let new = manifest::scan(src, &mut |_| {}).unwrap().manifest;
        let lock = root.lock(name).unwrap();
        let (old, mut verifier) = root.current_checked(name).unwrap();
        let sources = root.resolve(&mut verifier, &old, &new);
        let mut st = root.begin(&lock, &old, new.clone(), &sources).unwrap();
        let needed = st.needed().to_vec();
        for &i in &needed {
            let data = fs::read(src.join(new.entries[i].rel_path())).unwrap();
            for piece in data.chunks(3) {
                st.write(i, piece).unwrap();
            }
        }
        st.commit().unwrap().remove().unwrap();
        needed.len()
    }

    #[test]
    fn a_tree_is_received_then_updated_with_only_new_contents_fetched() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        write_tree(&src, &[("a", b"alpha"), ("d/b", b"beta"), ("d/e", b"")]);
        let root = TreeRoot::open(&t.path().join("root")).unwrap();
        assert_eq!(receive(&root, b"t", &src), 2);
        let got = manifest::scan(&root.tree_path(b"t"), &mut |_| {}).unwrap();
        let want = manifest::scan(&src, &mut |_| {}).unwrap();
        assert_eq!(got.manifest, want.manifest);

        fs::rename(src.join("d/b"), src.join("moved")).unwrap();
        fs::write(src.join("a"), b"alpha2").unwrap();
        assert_eq!(receive(&root, b"t", &src), 1, "only `a` travels");
        let got = manifest::scan(&root.tree_path(b"t"), &mut |_| {}).unwrap();
        let want = manifest::scan(&src, &mut |_| {}).unwrap();
        assert_eq!(got.manifest, want.manifest);
        assert_eq!(fs::read_dir(root.state.join("staging")).unwrap().count(), 0);
    }

    #[test]
    fn a_failed_receive_leaves_the_tree_alone() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        write_tree(&src, &[("a", b"alpha")]);
        let root = TreeRoot::open(&t.path().join("root")).unwrap();
        receive(&root, b"t", &src);
        let before = manifest::scan(&root.tree_path(b"t"), &mut |_| {}).unwrap();
        fs::write(src.join("a"), b"other").unwrap();
        let new = manifest::scan(&src, &mut |_| {}).unwrap().manifest;
        let lock = root.lock(b"t").unwrap();
        assert!(root.lock(b"t").is_err(), "one receive per name at a time");
        let (old, mut verifier) = root.current_checked(b"t").unwrap();
        let sources = root.resolve(&mut verifier, &old, &new);
        let mut st = root.begin(&lock, &old, new, &sources).unwrap();
        let i = st.needed()[0];
        assert!(matches!(st.write(i, b"wrong"), Err(Error::Mismatch(_))));
        drop(st);
        let after = manifest::scan(&root.tree_path(b"t"), &mut |_| {}).unwrap();
        assert_eq!(before.manifest, after.manifest);
        assert_eq!(fs::read_dir(root.state.join("staging")).unwrap().count(), 0);
    }

    #[test]
    fn tree_names_must_be_one_component() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/a", b".dedupwire", b"a\0"] {
            assert!(check_tree_name(bad).is_err(), "{bad:?}");
        }
        check_tree_name(b"django-4.2").unwrap();
    }
}
