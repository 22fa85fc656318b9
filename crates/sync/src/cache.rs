//! The sender's cache of what it sent: file contents by BLAKE3, so that a changed file
//! travels as a delta against the version the receiver holds (which the receiver names by
//! hash in its PLAN), and, per destination, the hashes of the tree last sent there (what the
//! cache keeps).
//!
//! ```text
//! DIR/lock                 flock: shared while a send uses the cache, exclusive to sweep
//! DIR/objects/ab/<hex>     a zstd frame of one file's contents, named by their BLAKE3
//!                          (written as DIR/objects/.tmp-*, renamed when complete)
//! DIR/dests/<hex>          "DWSC" 2 manifest: the tree last sent to one destination (named
//!                          by BLAKE3 of HOST:PORT:NAME, first 16 bytes), the base of the
//!                          next OFFER's manifest delta
//! ```
//!
//! Nothing here is trusted: an object is used only if it decompresses (within the size
//! limit) to bytes with the hash it is named by, so a torn or damaged object is just a
//! miss (and removed). Objects are written to a temporary name and renamed, so a reader never
//! sees a half-written one under its final name. After a send completes, its destination's
//! record is replaced and objects no destination names are removed, then the least recently
//! used until the objects fit the cache's bound, unless another send holds the cache (then a
//! later send sweeps). A send stops keeping files once it has written the bound's worth.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use dedupwire_engine::compress::Compression;
use rustix::fs::{flock, FlockOperation};

use crate::error::{io_at, Error, Result};
use crate::manifest::{Kind, Manifest, SparseReader};

/// Files larger than this are neither cached nor delta-encoded (both ends hold a file of up
/// to this size, its base and the delta in memory).
pub const DELTA_MAX: u64 = 128 << 20;
/// The zstd level objects are stored at (fast: the cache is written on every send).
const LEVEL: i32 = 1;
const DEST_MAGIC: &[u8; 4] = b"DWSC";
const DEST_VERSION: u8 = 2;

static SEQ: AtomicU64 = AtomicU64::new(0);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The default cache directory: `$XDG_CACHE_HOME/dedupwire/send`, else
/// `$HOME/.cache/dedupwire/send`; `None` when neither is set.
pub fn default_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("dedupwire").join("send"))
}

/// The default bound on a cache's objects, in bytes (`--cache-size`).
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;

/// An open sender cache, bound to one destination.
#[derive(Debug)]
pub struct SendCache {
    dir: PathBuf,
    dest: String,
    lock: File,
    max_bytes: u64,
    /// Object bytes this send may still write (it stops keeping files past the bound).
    budget: AtomicU64,
}

impl SendCache {
    /// Opens (creating it) the cache at `dir` for the destination `dest` (`HOST:PORT:NAME`),
    /// holding it shared until dropped; its objects are kept under `max_bytes` (the least
    /// recently used leave first).
    pub fn open(dir: &Path, dest: &str, max_bytes: u64) -> Result<SendCache> {
        for sub in ["objects", "dests"] {
            let d = dir.join(sub);
            fs::create_dir_all(&d).map_err(io_at(&d))?;
        }
        let path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_at(&path))?;
        flock(&lock, FlockOperation::LockShared).map_err(|e| io_at(&path)(e.into()))?;
        Ok(SendCache {
            dir: dir.to_path_buf(),
            dest: dest.to_string(),
            lock,
            max_bytes,
            budget: AtomicU64::new(max_bytes),
        })
    }

    fn object_path(&self, hash: &[u8; 32]) -> PathBuf {
        self.dir
            .join("objects")
            .join(hex(&hash[..1]))
            .join(hex(hash))
    }

    fn dest_path(&self) -> PathBuf {
        let id = blake3::hash(self.dest.as_bytes());
        self.dir.join("dests").join(hex(&id.as_bytes()[..16]))
    }

    /// The contents of the cached file whose hash starts with `prefix`, checked against the
    /// full hash; `None` when there is none (a damaged one is removed).
    pub fn base(&self, prefix: &[u8]) -> Option<Vec<u8>> {
        self.base_within(prefix, DELTA_MAX)
    }

    /// [`SendCache::base`] for a base of at most `limit` bytes (as its frame says): a bigger
    /// one is `None`, and stays.
    pub(crate) fn base_within(&self, prefix: &[u8], limit: u64) -> Option<Vec<u8>> {
        let (path, name, len) = self.find(prefix)?;
        if len > limit {
            return None;
        }
        match read_object(&path, &name) {
            Some(bytes) => {
                touch(&path);
                Some(bytes)
            }
            None => {
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// The length of the cached file whose hash starts with `prefix`, as its object's frame
    /// says (not yet checked against its name).
    pub(crate) fn base_len(&self, prefix: &[u8]) -> Option<u64> {
        self.find(prefix).map(|(_, _, len)| len)
    }

    /// The object whose name starts with the hex of `prefix`: its path, name and the length of
    /// its contents as its frame header says (an object whose header says none is removed).
    fn find(&self, prefix: &[u8]) -> Option<(PathBuf, String, u64)> {
        let sub = self.dir.join("objects").join(hex(&prefix[..1]));
        let want = hex(prefix);
        for entry in fs::read_dir(&sub).ok()?.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.len() != 64 || !name.starts_with(&want) {
                continue;
            }
            let path = entry.path();
            let mut head = [0u8; 18];
            let n = File::open(&path)
                .and_then(|mut f| f.read(&mut head))
                .unwrap_or(0);
            match zstd::zstd_safe::get_frame_content_size(&head[..n]) {
                Ok(Some(len)) if len <= DELTA_MAX => return Some((path, name.to_string(), len)),
                _ => {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        None
    }

    /// The cached file whose hash starts with `prefix`, to be read in order without holding
    /// it whole; whether it was intact is known at its end ([`BaseStream::intact`]).
    pub(crate) fn base_stream(&self, prefix: &[u8]) -> Option<BaseStream> {
        let (path, name, len) = self.find(prefix)?;
        let dec = File::open(&path)
            .and_then(zstd::stream::read::Decoder::new)
            .ok()?;
        touch(&path);
        Some(BaseStream {
            dec,
            hasher: blake3::Hasher::new(),
            len,
            got: 0,
            path,
            name,
        })
    }

    /// A writer keeping a file of `size` bytes as it is read, so that a big file is kept
    /// without being held whole (named by its BLAKE3 at [`ObjectWriter::finish`]); `None`
    /// when the cache has it already (by `hash`, when known), does not keep files that big,
    /// or this send has spent its bound.
    pub(crate) fn writer(
        &self,
        hash: Option<&[u8; 32]>,
        size: u64,
    ) -> Result<Option<ObjectWriter<'_>>> {
        if size == 0
            || size > DELTA_MAX
            || hash.is_some_and(|h| self.object_path(h).exists())
            || self.budget.load(Ordering::Relaxed) < size / 2
        {
            return Ok(None);
        }
        let dir = self.dir.join("objects");
        let tmp = temp_name(&dir);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_at(&tmp))?;
        let mut w = ObjectWriter {
            cache: self,
            enc: None,
            tmp,
            size,
            written: 0,
        };
        let mut enc = zstd::stream::write::Encoder::new(file, LEVEL).map_err(io_at(&w.tmp))?;
        enc.set_pledged_src_size(Some(size))
            .and_then(|()| enc.include_contentsize(true))
            .map_err(io_at(&w.tmp))?;
        w.enc = Some(enc);
        Ok(Some(w))
    }

    /// Keeps `bytes` (whose BLAKE3 is `hash`) unless the cache has them already.
    pub fn put(&self, hash: &[u8; 32], bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 > DELTA_MAX {
            return Ok(());
        }
        let path = self.object_path(hash);
        if path.exists() {
            return Ok(());
        }
        let dir = path.parent().expect("objects/ab/name");
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let packed = Compression::Zstd(LEVEL).compress(bytes);
        let n = packed.len() as u64;
        let fits = self
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(n))
            .is_ok();
        if !fits {
            return Ok(());
        }
        write_new(dir, &path, &packed)
    }

    /// Keeps the files of `manifest` (read from `src`) that the cache lacks, so that the
    /// next send finds a base for any of them: after a send whose unchanged files were never
    /// sent through this cache (it was cleared, or another machine sent the tree). Files are
    /// streamed into their objects, never held whole. A file that no longer matches its hash
    /// is skipped, and it stops once this send has nearly spent the cache's bound. Returns
    /// how many files it added.
    pub fn fill(&self, src: &Path, manifest: &Manifest) -> Result<u64> {
        let mut added = 0;
        let mut buf = vec![0; 1 << 20];
        for e in &manifest.entries {
            let Kind::File { size, hash } = e.kind else {
                continue;
            };
            if size == 0 || size > DELTA_MAX || self.object_path(&hash).exists() {
                continue;
            }
            if self.budget.load(Ordering::Relaxed) < size / 2 {
                break;
            }
            let path = src.join(e.rel_path());
            let Ok(f) = OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(&path)
            else {
                continue;
            };
            let Some(mut w) = self.writer(Some(&hash), size)? else {
                continue;
            };
            let mut r = SparseReader::new(f);
            let mut h = blake3::Hasher::new();
            let mut n = 0u64;
            while let Ok((k, _)) = r.read(&mut buf) {
                if k == 0 || n + k as u64 > size {
                    n += k as u64;
                    break;
                }
                h.update(&buf[..k]);
                w.write(&buf[..k])?;
                n += k as u64;
            }
            if n == size && *h.finalize().as_bytes() == hash {
                w.finish(&hash)?;
                added += 1;
            }
        }
        Ok(added)
    }

    /// The encoded manifest of the tree last sent to this destination (the base of the next
    /// OFFER's manifest delta), if the record is sound.
    pub fn last_manifest(&self) -> Option<Vec<u8>> {
        let rec = fs::read(self.dest_path()).ok()?;
        parse_dest(&rec).map(|_| rec[DEST_MAGIC.len() + 1..].to_vec())
    }

    /// Records `manifest` as the tree the destination now holds, then removes the objects no
    /// destination names (unless another send is using the cache).
    pub fn finish(self, manifest: &Manifest) -> Result<()> {
        let mut rec = DEST_MAGIC.to_vec();
        rec.push(DEST_VERSION);
        rec.extend_from_slice(&manifest.encode());
        let path = self.dest_path();
        write_new(path.parent().expect("dests/"), &path, &rec)?;
        if flock(&self.lock, FlockOperation::NonBlockingLockExclusive).is_ok() {
            self.sweep()?;
        }
        Ok(())
    }

    /// Removes objects no destination record names, and temporary files of cut-off writes.
    fn sweep(&self) -> Result<()> {
        let mut keep: HashSet<String> = HashSet::new();
        let dests = self.dir.join("dests");
        for entry in fs::read_dir(&dests).map_err(io_at(&dests))?.flatten() {
            let path = entry.path();
            if is_temp(&path) {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Ok(rec) = fs::read(&path) else { continue };
            match parse_dest(&rec) {
                Some(hashes) => keep.extend(hashes.iter().map(|h| hex(h))),
                None => {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        let objects = self.dir.join("objects");
        let mut kept = Vec::new();
        let mut total = 0u64;
        for sub in fs::read_dir(&objects).map_err(io_at(&objects))?.flatten() {
            if is_temp(&sub.path()) {
                let _ = fs::remove_file(sub.path());
                continue;
            }
            let Ok(files) = fs::read_dir(sub.path()) else {
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name();
                let named = name.to_str().is_some_and(|n| keep.contains(n));
                match f.metadata() {
                    Ok(md) if named => {
                        total += md.len();
                        kept.push((md.modified().ok(), md.len(), f.path()));
                    }
                    _ => {
                        let _ = fs::remove_file(f.path());
                    }
                }
            }
        }
        kept.sort();
        for (_, len, path) in kept {
            if total <= self.max_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
        Ok(())
    }
}

fn is_temp(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(".tmp-"))
}

/// The hashes of the cacheable files of a destination record's manifest, if it is sound.
fn parse_dest(rec: &[u8]) -> Option<Vec<[u8; 32]>> {
    let body = rec.strip_prefix(DEST_MAGIC.as_slice())?;
    let (&version, body) = body.split_first()?;
    if version != DEST_VERSION {
        return None;
    }
    let m = Manifest::decode(body).ok()?;
    Some(
        m.entries
            .iter()
            .filter_map(|e| match e.kind {
                Kind::File { hash, size } if size > 0 && size <= DELTA_MAX => Some(hash),
                _ => None,
            })
            .collect(),
    )
}

/// A new temporary name in `dir`.
fn temp_name(dir: &Path) -> PathBuf {
    dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Marks an object recently used: the last to be evicted.
fn touch(path: &Path) {
    let _ = File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
}

/// A file being kept as it is read ([`SendCache::writer`]): compressed into a temporary
/// file, renamed into place by [`ObjectWriter::finish`], removed if dropped before.
pub(crate) struct ObjectWriter<'a> {
    cache: &'a SendCache,
    enc: Option<zstd::stream::write::Encoder<'static, File>>,
    tmp: PathBuf,
    size: u64,
    written: u64,
}

impl ObjectWriter<'_> {
    /// The file's next bytes.
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let enc = self.enc.as_mut().expect("open until finished");
        self.written += bytes.len() as u64;
        enc.write_all(bytes).map_err(io_at(&self.tmp))
    }

    /// The file's next `n` bytes, all zeros.
    pub(crate) fn zeros(&mut self, mut n: u64) -> Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while n > 0 {
            let k = n.min(ZEROS.len() as u64) as usize;
            self.write(&ZEROS[..k])?;
            n -= k as u64;
        }
        Ok(())
    }

    /// Puts the object in place as `hash` once all its bytes were written (and checked
    /// against their hash by the caller), if it fits what this send may still write.
    pub(crate) fn finish(mut self, hash: &[u8; 32]) -> Result<()> {
        let enc = self.enc.take().expect("open until finished");
        let path = self.cache.object_path(hash);
        if self.written != self.size || path.exists() {
            return Ok(());
        }
        let dir = path.parent().expect("objects/ab/name");
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let file = enc.finish().map_err(io_at(&self.tmp))?;
        let n = file.metadata().map_err(io_at(&self.tmp))?.len();
        let fits = self
            .cache
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(n))
            .is_ok();
        if fits {
            fs::rename(&self.tmp, &path).map_err(io_at(&path))?;
        }
        Ok(())
    }
}

impl Drop for ObjectWriter<'_> {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.tmp);
    }
}

/// A cached file read in order ([`SendCache::base_stream`]).
pub(crate) struct BaseStream {
    dec: zstd::stream::read::Decoder<'static, std::io::BufReader<File>>,
    hasher: blake3::Hasher,
    len: u64,
    got: u64,
    path: PathBuf,
    name: String,
}

impl BaseStream {
    /// Appends the next `n` bytes of the contents to `buf` (fewer at their end); false if
    /// the object could not be read that far (it is damaged).
    pub(crate) fn read_into(&mut self, buf: &mut Vec<u8>, n: usize) -> bool {
        let n = n.min((self.len - self.got) as usize);
        let start = buf.len();
        buf.resize(start + n, 0);
        if self.dec.read_exact(&mut buf[start..]).is_err() {
            buf.truncate(start);
            return false;
        }
        self.hasher.update(&buf[start..]);
        self.got += n as u64;
        true
    }

    /// Reads the rest and tells whether the contents were exactly those the object is named
    /// by; a damaged object is removed.
    pub(crate) fn intact(mut self) -> bool {
        let mut buf = Vec::new();
        while self.got < self.len {
            buf.clear();
            if !self.read_into(&mut buf, 1 << 20) {
                break;
            }
        }
        let mut extra = [0u8; 1];
        let ok = self.got == self.len
            && matches!(self.dec.read(&mut extra), Ok(0))
            && hex(self.hasher.finalize().as_bytes()) == self.name;
        if !ok {
            let _ = fs::remove_file(&self.path);
        }
        ok
    }
}

/// Writes `bytes` to a temporary file in `dir`, then renames it to `path`.
fn write_new(dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_name(dir);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes));
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::Io {
            path: path.to_path_buf(),
            err: e,
        });
    }
    Ok(())
}

/// The contents of an object if it decompresses to bytes whose BLAKE3 is its name.
fn read_object(path: &Path, name: &str) -> Option<Vec<u8>> {
    let f = File::open(path).ok()?;
    let mut out = Vec::new();
    zstd::stream::Decoder::new(f)
        .ok()?
        .take(DELTA_MAX + 1)
        .read_to_end(&mut out)
        .ok()?;
    (out.len() as u64 <= DELTA_MAX && hex(blake3::hash(&out).as_bytes()) == name).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Entry;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dw-cache-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn file_entry(path: &str, bytes: &[u8]) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind: Kind::File {
                size: bytes.len() as u64,
                hash: *blake3::hash(bytes).as_bytes(),
            },
            mode: 0o644,
            mtime_ns: 0,
        }
    }

    #[test]
    fn a_put_object_is_found_by_its_hash_prefix() {
        let dir = tmp("put");
        let c = SendCache::open(&dir, "h:1:t", DEFAULT_MAX_BYTES).unwrap();
        let bytes = b"some contents".repeat(100);
        let hash = *blake3::hash(&bytes).as_bytes();
        c.put(&hash, &bytes).unwrap();
        assert_eq!(c.base(&hash[..8]).as_deref(), Some(&bytes[..]));
        let mut other = hash;
        other[7] ^= 1;
        assert_eq!(c.base(&other[..8]), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_object_is_a_miss_and_is_removed() {
        let dir = tmp("damaged");
        let c = SendCache::open(&dir, "h:1:t", DEFAULT_MAX_BYTES).unwrap();
        let bytes = b"contents to damage".repeat(50);
        let hash = *blake3::hash(&bytes).as_bytes();
        c.put(&hash, &bytes).unwrap();
        let path = c.object_path(&hash);
        fs::write(&path, zstd::bulk::compress(b"other bytes", 1).unwrap()).unwrap();
        assert_eq!(c.base(&hash[..8]), None);
        assert!(!path.exists());
        c.put(&hash, &bytes).unwrap();
        fs::write(&path, b"not zstd at all").unwrap();
        assert_eq!(c.base(&hash[..8]), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finishing_keeps_what_a_destination_holds_and_sweeps_the_rest() {
        let dir = tmp("sweep");
        let (a, b, c_) = (b"aaaa".repeat(9), b"bbbb".repeat(9), b"cccc".repeat(9));
        let h = |x: &[u8]| *blake3::hash(x).as_bytes();
        let one = SendCache::open(&dir, "h:1:one", DEFAULT_MAX_BYTES).unwrap();
        for x in [&a, &b, &c_] {
            one.put(&h(x), x).unwrap();
        }
        let m = |files: &[(&str, &[u8])]| Manifest {
            entries: files.iter().map(|(p, x)| file_entry(p, x)).collect(),
            ..Manifest::default()
        };
        one.finish(&m(&[("x", &a), ("y", &b)])).unwrap();
        let two = SendCache::open(&dir, "h:1:two", DEFAULT_MAX_BYTES).unwrap();
        assert!(two.base(&h(&a)[..8]).is_some());
        assert!(two.base(&h(&c_)[..8]).is_none(), "no destination holds c");
        two.put(&h(&c_), &c_).unwrap();
        two.finish(&m(&[("z", &c_)])).unwrap();
        let three = SendCache::open(&dir, "h:1:one", DEFAULT_MAX_BYTES).unwrap();
        three.finish(&m(&[("x", &a)])).unwrap();
        let again = SendCache::open(&dir, "h:1:one", DEFAULT_MAX_BYTES).unwrap();
        assert!(again.base(&h(&a)[..8]).is_some());
        assert!(
            again.base(&h(&b)[..8]).is_none(),
            "b left every destination"
        );
        assert!(again.base(&h(&c_)[..8]).is_some(), "two still holds c");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn filling_adds_the_files_the_cache_lacks() {
        let dir = tmp("fill");
        let src = dir.join("src");
        fs::create_dir_all(&src).unwrap();
        let (a, b) = (b"first file".repeat(30), b"second file".repeat(30));
        fs::write(src.join("a"), &a).unwrap();
        fs::write(src.join("b"), &b).unwrap();
        let m = Manifest {
            entries: vec![
                file_entry("a", &a),
                file_entry("b", &b),
                file_entry("gone", b"x"),
            ],
            ..Manifest::default()
        };
        let c = SendCache::open(&dir.join("cache"), "h:1:t", DEFAULT_MAX_BYTES).unwrap();
        let ha = *blake3::hash(&a).as_bytes();
        c.put(&ha, &a).unwrap();
        fs::write(src.join("b"), b"changed since the scan").unwrap();
        assert_eq!(
            c.fill(&src, &m).unwrap(),
            0,
            "a is there, b changed, gone is gone"
        );
        fs::write(src.join("b"), &b).unwrap();
        assert_eq!(c.fill(&src, &m).unwrap(), 1);
        assert!(c.base(&blake3::hash(&b).as_bytes()[..8]).is_some());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_busy_cache_is_not_swept() {
        let dir = tmp("busy");
        let x = b"xxxx".repeat(9);
        let hx = *blake3::hash(&x).as_bytes();
        let other = SendCache::open(&dir, "h:1:other", DEFAULT_MAX_BYTES).unwrap();
        let one = SendCache::open(&dir, "h:1:one", DEFAULT_MAX_BYTES).unwrap();
        other.put(&hx, &x).unwrap();
        one.finish(&Manifest::default()).unwrap();
        assert!(other.base(&hx[..8]).is_some(), "put while another send ran");
        drop(other);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_destination_records_are_rejected() {
        assert!(parse_dest(b"").is_none());
        assert!(parse_dest(b"DWSC\x02").is_none());
        let m = Manifest {
            entries: vec![file_entry("a", b"abc"), file_entry("e", b"")],
            ..Manifest::default()
        };
        let mut r = b"DWSC\x02".to_vec();
        r.extend_from_slice(&m.encode());
        assert_eq!(
            parse_dest(&r).unwrap().len(),
            1,
            "empty files are not cached"
        );
        r[4] = 1;
        assert!(parse_dest(&r).is_none());
        r[4] = 2;
        let last = r.len() - 1;
        r[last] ^= 1;
        assert!(parse_dest(&r).is_none());
    }

    #[test]
    fn the_least_recently_used_objects_leave_past_the_bound() {
        let dir = tmp("bound");
        let h = |x: &[u8]| *blake3::hash(x).as_bytes();
        let pause = || std::thread::sleep(std::time::Duration::from_millis(20));
        let files: Vec<Vec<u8>> = (0..4u8).map(|i| noise_bytes(i, 20_000)).collect();
        let c = SendCache::open(&dir, "h:1:t", 70_000).unwrap();
        for f in &files {
            c.put(&h(f), f).unwrap();
            pause();
        }
        assert!(
            c.base(&h(&files[3])[..8]).is_none(),
            "past this send's budget"
        );
        assert!(c.base(&h(&files[0])[..8]).is_some());
        let m = Manifest {
            entries: (0..4)
                .map(|i| file_entry(&format!("f{i}"), &files[i]))
                .collect(),
            ..Manifest::default()
        };
        drop(c);
        SendCache::open(&dir, "h:1:t", 50_000)
            .unwrap()
            .finish(&m)
            .unwrap();
        let c = SendCache::open(&dir, "h:1:t", 50_000).unwrap();
        let held: Vec<bool> = files.iter().map(|f| c.base(&h(f)[..8]).is_some()).collect();
        assert_eq!(
            held,
            [true, false, true, false],
            "file 1 was the least recently used"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    fn noise_bytes(seed: u8, len: usize) -> Vec<u8> {
        let mut x = u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }
}
