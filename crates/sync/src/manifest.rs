//! The manifest: what a tree is, entry by entry — every path, its kind (file, directory,
//! symlink), permission bits, modification time in nanoseconds, and for a file its size and
//! the BLAKE3 hash of its contents.
//!
//! [`scan`] builds one from a directory without following symlinks (a symlink is recorded
//! with its target text); devices, fifos and sockets are skipped and reported. [`list`] does
//! the same without reading a file: a sender hashes each file when it first reads it. The encoding
//! ([`Manifest::encode`], byte layout in `crates/sync/FORMAT.md`) is versioned and
//! checksummed, and [`Manifest::decode`] rejects anything malformed or hostile with an error:
//! a receiver builds files from these paths, so a path must be relative, normalized (no
//! empty, `.` or `..` component), unique, and come after its parent directory, which must be
//! an entry of kind directory. Entries are in component-wise path order (a directory's
//! entries sorted by name bytes, each directory followed by its contents), so equal trees
//! encode to equal bytes.

use std::cmp::Ordering;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::error::{io_at, Error, Result};
use crate::parallel;

/// The manifest encoding's magic bytes.
pub const MAGIC: &[u8; 4] = b"DWMF";
/// The manifest encoding's version.
pub const VERSION: u8 = 1;
/// The longest path (bytes) an entry may have.
pub const MAX_PATH: usize = 4096;
/// The longest path component (bytes).
pub const MAX_NAME: usize = 255;
/// The longest symlink target (bytes).
pub const MAX_TARGET: usize = 4095;
/// Permission bits kept: rwx for all, and the sticky bit. Set-user-ID and set-group-ID are
/// not preserved (the receiver owns the files it writes).
pub const MODE_MASK: u32 = 0o1777;

const HEADER_LEN: usize = 4 + 1 + 4 + 8 + 8;
const CHECKSUM_LEN: usize = 8;
/// The fewest bytes an entry can take (a directory with a 1-byte name).
const MIN_ENTRY: usize = 1 + 2 + 1 + 4 + 8;

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A regular file: its size and the BLAKE3 hash of its contents.
    File {
        /// Bytes.
        size: u64,
        /// BLAKE3-256 of the contents.
        hash: [u8; 32],
    },
    /// A directory.
    Dir,
    /// A symbolic link: its target, as text, never followed.
    Symlink {
        /// The target bytes (non-empty, no NUL).
        target: Vec<u8>,
    },
}

/// One path of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the tree's root, components separated by `/`.
    pub path: Vec<u8>,
    /// File, directory or symlink.
    pub kind: Kind,
    /// Permission bits ([`MODE_MASK`]); 0o777 for a symlink (Linux has no symlink modes).
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

impl Entry {
    /// The path as a relative filesystem path.
    pub fn rel_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.path))
    }

    /// The path for messages (non-UTF-8 bytes replaced).
    pub fn display(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }

    /// The file's size, 0 for other kinds.
    pub fn size(&self) -> u64 {
        match self.kind {
            Kind::File { size, .. } => size,
            _ => 0,
        }
    }
}

/// A whole tree: the root directory's own metadata and every entry under it, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    /// The root directory's permission bits.
    pub root_mode: u32,
    /// The root directory's modification time (ns).
    pub root_mtime_ns: i64,
    /// The entries, parents before children, in component-wise path order.
    pub entries: Vec<Entry>,
}

/// Compares two paths component by component (the manifest's order).
pub fn cmp_paths(a: &[u8], b: &[u8]) -> Ordering {
    a.split(|&c| c == b'/').cmp(b.split(|&c| c == b'/'))
}

fn parent(path: &[u8]) -> Option<&[u8]> {
    path.iter().rposition(|&c| c == b'/').map(|i| &path[..i])
}

/// Checks that `name` can be one path component: non-empty, not `.` or `..`, no `/` or NUL,
/// at most [`MAX_NAME`] bytes.
pub fn check_name(name: &[u8]) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("an empty path component".into());
    }
    if name == b"." || name == b".." {
        return Err(format!(
            "a {:?} path component",
            String::from_utf8_lossy(name)
        ));
    }
    if name.len() > MAX_NAME {
        return Err(format!("a path component of {} bytes", name.len()));
    }
    if let Some(c) = name.iter().find(|&&c| c == b'/' || c == 0) {
        return Err(format!("a path component containing byte {c:#04x}"));
    }
    Ok(())
}

impl Manifest {
    /// The total bytes of its files.
    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(Entry::size).sum()
    }

    /// Checks every rule a receiver relies on (see the module documentation).
    pub fn validate(&self) -> Result<()> {
        let bad = |i: usize, e: &Entry, why: String| {
            Error::Manifest(format!("entry {i} ({:?}): {why}", e.display()))
        };
        if self.root_mode & !MODE_MASK != 0 {
            return Err(Error::Manifest(format!(
                "root mode {:o} has bits outside {MODE_MASK:o}",
                self.root_mode
            )));
        }
        let mut dirs: HashSet<&[u8]> = HashSet::new();
        let mut prev: Option<&[u8]> = None;
        for (i, e) in self.entries.iter().enumerate() {
            if e.path.len() > MAX_PATH {
                return Err(bad(i, e, format!("a path of {} bytes", e.path.len())));
            }
            for c in e.path.split(|&c| c == b'/') {
                check_name(c).map_err(|w| bad(i, e, w))?;
            }
            if let Some(p) = prev {
                if cmp_paths(p, &e.path) != Ordering::Less {
                    return Err(bad(
                        i,
                        e,
                        "out of order or duplicate (paths must be sorted, each once)".into(),
                    ));
                }
            }
            if let Some(parent) = parent(&e.path) {
                if !dirs.contains(parent) {
                    return Err(bad(
                        i,
                        e,
                        "its parent is not a directory listed before it".into(),
                    ));
                }
            }
            if e.mode & !MODE_MASK != 0 {
                return Err(bad(
                    i,
                    e,
                    format!("mode {:o} has bits outside {MODE_MASK:o}", e.mode),
                ));
            }
            match &e.kind {
                Kind::Dir => {
                    dirs.insert(&e.path);
                }
                Kind::Symlink { target } => {
                    if target.is_empty() || target.len() > MAX_TARGET || target.contains(&0) {
                        return Err(bad(
                            i,
                            e,
                            "a symlink target that is empty, too long or holds NUL".into(),
                        ));
                    }
                }
                Kind::File { .. } => {}
            }
            prev = Some(&e.path);
        }
        Ok(())
    }

    /// The versioned, checksummed encoding (`crates/sync/FORMAT.md`).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.entries.len() * 64 + CHECKSUM_LEN);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.root_mode.to_le_bytes());
        out.extend_from_slice(&self.root_mtime_ns.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            let tag = match e.kind {
                Kind::File { .. } => 1u8,
                Kind::Dir => 2,
                Kind::Symlink { .. } => 3,
            };
            out.push(tag);
            out.extend_from_slice(&(e.path.len() as u16).to_le_bytes());
            out.extend_from_slice(&e.path);
            out.extend_from_slice(&e.mode.to_le_bytes());
            out.extend_from_slice(&e.mtime_ns.to_le_bytes());
            match &e.kind {
                Kind::File { size, hash } => {
                    out.extend_from_slice(&size.to_le_bytes());
                    out.extend_from_slice(hash);
                }
                Kind::Dir => {}
                Kind::Symlink { target } => {
                    out.extend_from_slice(&(target.len() as u16).to_le_bytes());
                    out.extend_from_slice(target);
                }
            }
        }
        let sum = blake3::hash(&out);
        out.extend_from_slice(&sum.as_bytes()[..CHECKSUM_LEN]);
        out
    }

    /// Parses and [validates](Manifest::validate) an encoding; anything else is
    /// [`Error::Manifest`] saying what is wrong and where, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Manifest> {
        let err = |why: String| Error::Manifest(why);
        if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
            return Err(err(format!("{} bytes is too short", bytes.len())));
        }
        let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
        if &body[..4] != MAGIC {
            return Err(err("not a manifest (bad magic)".into()));
        }
        if body[4] != VERSION {
            return Err(err(format!(
                "version {} (this end reads {VERSION})",
                body[4]
            )));
        }
        if &blake3::hash(body).as_bytes()[..CHECKSUM_LEN] != sum {
            return Err(err("checksum mismatch (damaged)".into()));
        }
        let mut r = Reader { buf: body, pos: 5 };
        let root_mode = r.u32()?;
        let root_mtime_ns = r.i64()?;
        let count = r.u64()?;
        if count > ((body.len() - HEADER_LEN) / MIN_ENTRY) as u64 {
            return Err(err(format!(
                "{count} entries cannot fit in {} bytes",
                body.len()
            )));
        }
        let mut entries = Vec::with_capacity(count as usize);
        for i in 0..count {
            let at = r.pos;
            let tag = r.u8()?;
            let plen = r.u16()? as usize;
            let path = r.take(plen)?.to_vec();
            let mode = r.u32()?;
            let mtime_ns = r.i64()?;
            let kind = match tag {
                1 => {
                    let size = r.u64()?;
                    let hash = r.take(32)?.try_into().expect("32 bytes");
                    Kind::File { size, hash }
                }
                2 => Kind::Dir,
                3 => {
                    let tlen = r.u16()? as usize;
                    Kind::Symlink {
                        target: r.take(tlen)?.to_vec(),
                    }
                }
                t => return Err(err(format!("entry {i} at byte {at}: unknown kind {t}"))),
            };
            entries.push(Entry {
                path,
                kind,
                mode,
                mtime_ns,
            });
        }
        if r.pos != body.len() {
            return Err(err(format!(
                "{} bytes after the last entry",
                body.len() - r.pos
            )));
        }
        let m = Manifest {
            root_mode,
            root_mtime_ns,
            entries,
        };
        m.validate()?;
        Ok(m)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(Error::Manifest(format!(
                "truncated: {n} bytes wanted at byte {}",
                self.pos
            )));
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

/// A scanned tree and what the scan could not take.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// The tree.
    pub manifest: Manifest,
    /// Devices, fifos and sockets left out.
    pub skipped: Vec<PathBuf>,
    /// Bytes read to hash the files.
    pub bytes_read: u64,
    /// The files not read yet ([`list`]), in manifest order: their hash in the manifest is
    /// all zeros until they are.
    pub unread: Vec<Unread>,
}

/// How a file stood when it was listed: what tells that it changed since, short of reading
/// it (a write changes its mtime and ctime, a replacement its inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileStat {
    /// The device holding it.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time (ns).
    pub mtime_ns: i64,
    /// Its status change time (ns).
    pub ctime_ns: i64,
}

impl FileStat {
    /// The stat of `md`.
    pub fn of(md: &fs::Metadata) -> FileStat {
        FileStat {
            dev: md.dev(),
            ino: md.ino(),
            size: md.len(),
            mtime_ns: mtime_ns(md),
            ctime_ns: md
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(md.ctime_nsec()),
        }
    }
}

/// A listed file whose contents were not read: its manifest entry and how it stood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unread {
    /// Its index in the manifest.
    pub index: usize,
    /// Its stat when listed.
    pub stat: FileStat,
}

/// A scanned entry's mtime in nanoseconds, refused when it does not fit (before 1677 or after
/// 2262): a manifest carries mtimes exactly or not at all.
fn exact_mtime_ns(md: &fs::Metadata, path: &Path) -> Result<i64> {
    md.mtime()
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(md.mtime_nsec()))
        .ok_or_else(|| {
            Error::Refused(format!(
                "{}: its modification time ({} s since 1970) is outside the years 1677-2262, \
                 which a manifest cannot carry exactly; set it (touch -d) and send again",
                path.display(),
                md.mtime()
            ))
        })
}

/// The modification time of `md` in nanoseconds.
pub fn mtime_ns(md: &fs::Metadata) -> i64 {
    md.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(md.mtime_nsec())
}

/// BLAKE3 of the file at `path`, read without following a symlink, if it is still as
/// `stat` says (same inode, size and times after the read; else the file changed since it was
/// listed, an [`Error::Mismatch`]); `on_read` sees the bytes read from the disk.
pub fn hash_unchanged(
    path: &Path,
    stat: &FileStat,
    on_read: &mut dyn FnMut(u64),
) -> Result<[u8; 32]> {
    let f = open_nofollow(path)?;
    let mut r = SparseReader::new(f);
    let (hash, n) = READ_BUF.with(|b| match b.try_borrow_mut() {
        Ok(mut buf) => hash_into(&mut r, path, on_read, &mut buf),
        Err(_) => hash_into(&mut r, path, on_read, &mut vec![0; 1 << 20]),
    })?;
    if n != stat.size || r.stat().map_err(io_at(path))? != *stat {
        return Err(crate::error::changed_while_sent(path));
    }
    Ok(hash)
}

fn open_nofollow(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(io_at(path))
}

/// BLAKE3 of a file's contents and its length, read without following a symlink; `on_read`
/// sees the length of every block read from the disk (a hole is hashed as zeros unread).
pub fn hash_file(path: &Path, on_read: &mut dyn FnMut(u64)) -> Result<([u8; 32], u64)> {
    let f = open_nofollow(path)?;
    let mut r = SparseReader::new(f);
    READ_BUF.with(|b| match b.try_borrow_mut() {
        Ok(mut buf) => hash_into(&mut r, path, on_read, &mut buf),
        Err(_) => hash_into(&mut r, path, on_read, &mut vec![0; 1 << 20]),
    })
}

thread_local! {
    /// Each thread's read buffer: allocating (and faulting in) a fresh one per file costs more
    /// than hashing a small file.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; 1 << 20]);
}

fn hash_into(
    r: &mut SparseReader,
    path: &Path,
    on_read: &mut dyn FnMut(u64),
    buf: &mut [u8],
) -> Result<([u8; 32], u64)> {
    let mut h = blake3::Hasher::new();
    let mut n = 0u64;
    loop {
        let (k, from_disk) = r.read(buf).map_err(io_at(path))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
        if from_disk {
            on_read(k as u64);
        }
    }
    Ok((*h.finalize().as_bytes(), n))
}

/// Adds `n` zero bytes to `h`.
pub(crate) fn hash_zeros(h: &mut blake3::Hasher, mut n: u64) {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        h.update(&ZEROS[..k]);
        n -= k as u64;
    }
}

/// A regular file read from start to end, whose holes (as `SEEK_DATA` / `SEEK_HOLE` find
/// them) come out as zeros without being read: a sparse file of many gigabytes with little
/// data in it costs its data's reads, not its size's.
pub(crate) struct SparseReader {
    f: File,
    pos: u64,
    /// Where the region `pos` is in ends (`u64::MAX`: read until the end of the file).
    end: u64,
    hole: bool,
    /// Whether the file system answers `SEEK_DATA` (else the file is read whole).
    seeks: bool,
}

impl SparseReader {
    /// Reads `f` from its start.
    pub(crate) fn new(f: File) -> Self {
        SparseReader {
            f,
            pos: 0,
            end: 0,
            hole: false,
            seeks: true,
        }
    }

    /// Finds the region at `pos`: a hole up to the next data, or data up to the next hole.
    fn region(&mut self) -> std::io::Result<()> {
        use rustix::fs::{seek, SeekFrom};
        use rustix::io::Errno;
        (self.hole, self.end) = (false, u64::MAX);
        if !self.seeks {
            return Ok(());
        }
        match seek(&self.f, SeekFrom::Data(self.pos)) {
            Ok(data) if data > self.pos => (self.hole, self.end) = (true, data),
            Ok(_) => match seek(&self.f, SeekFrom::Hole(self.pos)) {
                Ok(hole) if hole > self.pos => self.end = hole,
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            },
            // No data at or past `pos`: a hole to the end (data appended since is then read).
            Err(Errno::NXIO) => {
                let len = self.f.metadata()?.len();
                if len > self.pos {
                    (self.hole, self.end) = (true, len);
                }
            }
            Err(Errno::INVAL | Errno::OPNOTSUPP) => self.seeks = false,
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Fills the start of `buf` with the next bytes: how many (0 at the end of the file), and
    /// whether they were read from the disk (false for zeros of a hole).
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, bool)> {
        use std::os::unix::fs::FileExt;
        if buf.is_empty() {
            return Ok((0, false));
        }
        if self.pos >= self.end {
            self.region()?;
        }
        let want = (self.end - self.pos).min(buf.len() as u64) as usize;
        if self.hole {
            buf[..want].fill(0);
            self.pos += want as u64;
            return Ok((want, false));
        }
        loop {
            match self.f.read_at(&mut buf[..want], self.pos) {
                Ok(k) => {
                    self.pos += k as u64;
                    return Ok((k, true));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Skips the hole at the current position, at most `max` bytes of it: how many (0 when
    /// the position is in data).
    pub(crate) fn hole(&mut self, max: u64) -> std::io::Result<u64> {
        if self.pos >= self.end {
            self.region()?;
        }
        if !self.hole {
            return Ok(0);
        }
        let n = (self.end - self.pos).min(max);
        self.pos += n;
        Ok(n)
    }

    /// Bytes of data from the current position to the next hole, at most `max`.
    pub(crate) fn data_run(&mut self, max: u64) -> std::io::Result<u64> {
        if self.pos >= self.end {
            self.region()?;
        }
        Ok(if self.hole {
            0
        } else {
            (self.end - self.pos).min(max)
        })
    }

    /// The open file's stat now.
    pub(crate) fn stat(&self) -> std::io::Result<FileStat> {
        Ok(FileStat::of(&self.f.metadata()?))
    }

    /// Fills `buf` whole; false if the file ended first (then `buf` holds what there was).
    /// Adds to `disk` the bytes read from the disk.
    pub(crate) fn read_full(&mut self, buf: &mut [u8], disk: &mut u64) -> std::io::Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            let (k, from_disk) = self.read(&mut buf[got..])?;
            if k == 0 {
                return Ok(false);
            }
            if from_disk {
                *disk += k as u64;
            }
            got += k;
        }
        Ok(true)
    }
}

/// Walks the directory `root` without following symlinks and hashes every file.
/// `on_read` sees the bytes read as they are (for a progress display).
pub fn scan(root: &Path, on_read: &mut dyn FnMut(u64)) -> Result<Scan> {
    let mut scan = list(root)?;
    let files: Vec<(usize, PathBuf)> = scan
        .unread
        .drain(..)
        .map(|u| {
            (
                u.index,
                root.join(scan.manifest.entries[u.index].rel_path()),
            )
        })
        .collect();
    scan.bytes_read = hash_all(&mut scan.manifest, &files, on_read)?;
    Ok(scan)
}

/// Walks the directory `root` without following symlinks, reading no file: every file but
/// an empty one is [`Scan::unread`], its hash left to whoever reads it.
pub fn list(root: &Path) -> Result<Scan> {
    let md = fs::metadata(root).map_err(io_at(root))?;
    if !md.is_dir() {
        return Err(Error::Refused(format!(
            "{} is not a directory",
            root.display()
        )));
    }
    let mut scan = Scan {
        manifest: Manifest {
            root_mode: md.mode() & MODE_MASK,
            root_mtime_ns: exact_mtime_ns(&md, root)?,
            entries: Vec::new(),
        },
        ..Scan::default()
    };
    walk(root, &[], &mut scan)?;
    scan.manifest.validate()?;
    Ok(scan)
}

/// Threads hashing a scan's files, at most.
pub(crate) const HASH_THREADS: usize = 4;

/// Hashes the files `(entry index, path)` into their entries on a few threads (on trees of
/// many small files the opens and reads, not BLAKE3, cost); returns the bytes read. The
/// first file (in tree order) that cannot be read is the error.
fn hash_all(
    manifest: &mut Manifest,
    files: &[(usize, PathBuf)],
    on_read: &mut dyn FnMut(u64),
) -> Result<u64> {
    let read = AtomicU64::new(0);
    let mut reported = 0;
    let hashed = parallel::for_each(
        files.len(),
        HASH_THREADS,
        1,
        |k| {
            hash_file(&files[k].1, &mut |n| {
                read.fetch_add(n, Relaxed);
            })
        },
        &mut || {
            let now = read.load(Relaxed);
            on_read(now - reported);
            reported = now;
        },
    )?;
    let total = read.load(Relaxed);
    on_read(total - reported);
    for ((i, _), (hash, size)) in files.iter().zip(hashed) {
        manifest.entries[*i].kind = Kind::File { size, hash };
    }
    Ok(total)
}

/// Lists `dir` into `scan` in tree order; files but empty ones get their hash later
/// ([`Scan::unread`]).
fn walk(dir: &Path, rel: &[u8], scan: &mut Scan) -> Result<()> {
    let mut names = Vec::new();
    for d in fs::read_dir(dir).map_err(io_at(dir))? {
        names.push(d.map_err(io_at(dir))?.file_name());
    }
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        let path = dir.join(&name);
        let mut rp = rel.to_vec();
        if !rp.is_empty() {
            rp.push(b'/');
        }
        rp.extend_from_slice(name.as_bytes());
        let md = fs::symlink_metadata(&path).map_err(io_at(&path))?;
        let ft = md.file_type();
        let (kind, mode) = if ft.is_dir() {
            (Kind::Dir, md.mode() & MODE_MASK)
        } else if ft.is_file() {
            let mut hash = [0; 32];
            if md.len() == 0 {
                hash = *blake3::hash(b"").as_bytes();
            } else {
                scan.unread.push(Unread {
                    index: scan.manifest.entries.len(),
                    stat: FileStat::of(&md),
                });
            }
            let kind = Kind::File {
                size: md.len(),
                hash,
            };
            (kind, md.mode() & MODE_MASK)
        } else if ft.is_symlink() {
            let target = fs::read_link(&path).map_err(io_at(&path))?;
            (
                Kind::Symlink {
                    target: target.into_os_string().into_vec(),
                },
                0o777,
            )
        } else {
            scan.skipped.push(path);
            continue;
        };
        let is_dir = kind == Kind::Dir;
        scan.manifest.entries.push(Entry {
            path: rp.clone(),
            kind,
            mode,
            mtime_ns: exact_mtime_ns(&md, &path)?,
        });
        if is_dir {
            walk(&path, &rp, scan)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file(path: &str) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind: Kind::File {
                size: 3,
                hash: [1; 32],
            },
            mode: 0o644,
            mtime_ns: 5,
        }
    }

    fn dir(path: &str) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind: Kind::Dir,
            mode: 0o755,
            mtime_ns: -7,
        }
    }

    fn manifest(entries: Vec<Entry>) -> Manifest {
        Manifest {
            root_mode: 0o755,
            root_mtime_ns: 1,
            entries,
        }
    }

    #[test]
    fn a_good_manifest_round_trips() {
        let m = manifest(vec![
            dir("a"),
            file("a/b"),
            Entry {
                path: b"a/link".to_vec(),
                kind: Kind::Symlink {
                    target: b"../../etc/passwd".to_vec(),
                },
                mode: 0o777,
                mtime_ns: 0,
            },
            file("a.txt"),
        ]);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    fn rejected(entries: Vec<Entry>, what: &str) {
        let m = manifest(entries);
        let e = Manifest::decode(&m.encode()).unwrap_err().to_string();
        assert!(e.contains(what), "{e:?} should mention {what:?}");
        assert!(m.validate().is_err());
    }

    #[test]
    fn hostile_paths_are_rejected() {
        rejected(vec![file("/etc/passwd")], "empty path component");
        rejected(vec![file("../x")], "\"..\" path component");
        rejected(vec![dir("a"), file("a/../../x")], "\"..\" path component");
        rejected(vec![file("./x")], "\".\" path component");
        rejected(vec![dir("a"), file("a//b")], "empty path component");
        rejected(vec![file("a/")], "empty path component");
        rejected(vec![file("")], "empty path component");
        rejected(vec![file("a\0b")], "0x00");
        rejected(vec![file("x"), file("x")], "duplicate");
        rejected(vec![file("b"), file("a")], "out of order");
        rejected(vec![file("a/b")], "parent");
        // A file (or a symlink) is never a parent: nothing is written through it.
        rejected(vec![file("a"), file("a/b")], "parent");
        rejected(
            vec![
                Entry {
                    path: b"l".to_vec(),
                    kind: Kind::Symlink {
                        target: b"/".to_vec(),
                    },
                    mode: 0o777,
                    mtime_ns: 0,
                },
                file("l/x"),
            ],
            "parent",
        );
        let mut suid = file("s");
        suid.mode = 0o4755;
        rejected(vec![suid], "mode");
        rejected(vec![file(&"n".repeat(256))], "256 bytes");
        rejected(
            vec![Entry {
                path: b"l".to_vec(),
                kind: Kind::Symlink { target: vec![] },
                mode: 0o777,
                mtime_ns: 0,
            }],
            "symlink target",
        );
    }

    #[test]
    fn damage_is_an_error() {
        let m = manifest(vec![dir("a"), file("a/b")]);
        let bytes = m.encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(Manifest::decode(&b).is_err(), "flip at {i}");
        }
        for n in 0..bytes.len() {
            assert!(Manifest::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
    }

    #[test]
    fn scan_records_kinds_and_skips_special_files() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("d")).unwrap();
        fs::create_dir(t.path().join("empty")).unwrap();
        fs::write(t.path().join("d/f"), b"hello").unwrap();
        std::os::unix::fs::symlink("nowhere", t.path().join("l")).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(t.path().join("sock")).unwrap();
        let s = scan(t.path(), &mut |_| {}).unwrap();
        assert_eq!(s.skipped, [t.path().join("sock")]);
        let paths: Vec<_> = s.manifest.entries.iter().map(Entry::display).collect();
        assert_eq!(paths, ["d", "d/f", "empty", "l"]);
        assert_eq!(
            s.manifest.entries[1].kind,
            Kind::File {
                size: 5,
                hash: *blake3::hash(b"hello").as_bytes()
            }
        );
        assert_eq!(
            s.manifest.entries[3].kind,
            Kind::Symlink {
                target: b"nowhere".to_vec()
            }
        );
        assert_eq!(s.bytes_read, 5);
    }

    #[test]
    fn holes_read_as_zeros_without_reading_them() {
        use std::os::unix::fs::FileExt;
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("sparse");
        let f = File::create(&path).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[7; 5000], 10 << 20).unwrap();
        f.write_all_at(b"end", (64 << 20) - 3).unwrap();
        drop(f);
        let mut want = vec![0u8; 64 << 20];
        want[10 << 20..(10 << 20) + 5000].fill(7);
        want[(64 << 20) - 3..].copy_from_slice(b"end");
        let mut disk = 0;
        let (hash, len) = hash_file(&path, &mut |n| disk += n).unwrap();
        assert_eq!((hash, len), (*blake3::hash(&want).as_bytes(), 64 << 20));
        assert!(disk < 1 << 20, "{disk} bytes read from the disk");
        let mut r = SparseReader::new(File::open(&path).unwrap());
        let mut got = vec![1u8; 64 << 20];
        let mut disk = 0;
        assert!(r.read_full(&mut got, &mut disk).unwrap());
        assert!(
            got == want && disk < 1 << 20,
            "{disk} bytes read from the disk"
        );
        assert!(
            !r.read_full(&mut [0; 1], &mut disk).unwrap(),
            "then the end"
        );
    }

    /// Random trees: sorted unique names per directory, nested a few levels.
    fn arb_manifest() -> impl Strategy<Value = Manifest> {
        let name = proptest::collection::vec(
            prop_oneof![Just(b'a'), Just(b'.'), Just(b'z'), Just(0xffu8), Just(b'-')],
            1..5,
        )
        .prop_filter("not . or ..", |n| n != b"." && n != b"..");
        let leaf = (
            0u8..3,
            any::<u64>(),
            any::<[u8; 32]>(),
            0u32..=MODE_MASK,
            any::<i64>(),
        );
        (
            proptest::collection::vec((proptest::collection::vec(name, 1..4), leaf), 0..30),
            0u32..=MODE_MASK,
            any::<i64>(),
        )
            .prop_map(|(items, root_mode, root_mtime_ns)| {
                let mut entries: Vec<Entry> = Vec::new();
                let mut dirs: HashSet<Vec<u8>> = HashSet::new();
                let mut all: HashSet<Vec<u8>> = HashSet::new();
                for (comps, (kind, size, hash, mode, mtime_ns)) in items {
                    let mut path = Vec::new();
                    for (i, c) in comps.iter().enumerate() {
                        if i > 0 {
                            path.push(b'/');
                        }
                        path.extend_from_slice(c);
                        let last = i + 1 == comps.len();
                        if all.contains(&path) {
                            if !dirs.contains(&path) {
                                break;
                            }
                            continue;
                        }
                        let k = if !last {
                            Kind::Dir
                        } else {
                            match kind {
                                0 => Kind::Dir,
                                1 => Kind::File { size, hash },
                                _ => Kind::Symlink {
                                    target: hash.iter().map(|&b| b | 1).collect(),
                                },
                            }
                        };
                        if k == Kind::Dir {
                            dirs.insert(path.clone());
                        }
                        all.insert(path.clone());
                        entries.push(Entry {
                            path: path.clone(),
                            kind: k,
                            mode,
                            mtime_ns,
                        });
                    }
                }
                entries.sort_by(|a, b| cmp_paths(&a.path, &b.path));
                Manifest {
                    root_mode,
                    root_mtime_ns,
                    entries,
                }
            })
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(m in arb_manifest()) {
            m.validate().unwrap();
            prop_assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Manifest::decode(&bytes);
        }
    }
}
