//! Where a repository's objects live: a [`Backend`] shaped like an object store.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// The longest object name.
pub const MAX_NAME_LEN: usize = 128;

/// How old a temp file left by an interrupted write must be before [`LocalBackend::open`]
/// removes it.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

const TEMP_PREFIX: &str = ".tmp-";
const SUBDIRS: [&str; 5] = ["keys", "data", "index", "snapshots", "locks"];

/// The kinds of objects, each under its own prefix (`config`, `keys/`, `data/`, `index/`,
/// `snapshots/`, `locks/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// The repository's config (one object, named `config`).
    Config,
    /// Key files.
    Key,
    /// Packs.
    Pack,
    /// Index files.
    Index,
    /// Snapshots.
    Snapshot,
    /// Locks.
    Lock,
}

impl ObjectKind {
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            ObjectKind::Config => "",
            ObjectKind::Key => "keys",
            ObjectKind::Pack => "data",
            ObjectKind::Index => "index",
            ObjectKind::Snapshot => "snapshots",
            ObjectKind::Lock => "locks",
        }
    }
}

/// Why a backend operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The object does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// An I/O error, with the object it concerned.
    #[error("{what}: {source}")]
    Io {
        /// The object or directory.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A name that is not a valid object name (the name, then the kind's prefix).
    #[error(
        "invalid object name {0:?} under {1:?}: names are 1 to 128 characters of 0-9 a-z _ - \
         (packs at least 2), and `config` is the config's only name"
    )]
    BadName(String, &'static str),
    /// [`LocalBackend::open`] of a directory without a repository.
    #[error("no repository at {}: `dedupwire repo init` makes one", .0.display())]
    NoRepository(PathBuf),
    /// [`LocalBackend::create`] where a repository already is.
    #[error("{} already holds a repository", .0.display())]
    AlreadyExists(PathBuf),
    /// [`LocalBackend::create`] in a directory that holds other things.
    #[error(
        "{} is not empty: a new repository goes in a new or empty directory",
        .0.display()
    )]
    NotEmpty(PathBuf),
    /// A remote store's error (the object or location, then what went wrong).
    #[error("{what}: {message}")]
    Remote {
        /// The object or location.
        what: String,
        /// What went wrong, for a user.
        message: String,
    },
    /// [`LocalBackend::create`] where an interrupted `init` left keys but no config.
    #[error(
        "{} holds an unfinished repository (keys but no config, from an interrupted init): \
         remove it and init again",
        .0.display()
    )]
    Unfinished(PathBuf),
}

/// An object store: list, whole and ranged reads, create-once writes, deletes. No rename, no
/// append, and a listing may lag behind writes (as on S3).
pub trait Backend: Send + Sync {
    /// The names and sizes of the objects of `kind`, in no particular order.
    fn list(&self, kind: ObjectKind) -> Result<Vec<(String, u64)>, BackendError>;
    /// A whole object.
    fn get(&self, kind: ObjectKind, name: &str) -> Result<Vec<u8>, BackendError>;
    /// `len` bytes of an object from `offset` (fewer only past its end).
    fn get_range(
        &self,
        kind: ObjectKind,
        name: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, BackendError>;
    /// Writes an object whole, durably, if no object of that name exists; returns false (and
    /// writes nothing) if one does.
    fn put_new(&self, kind: ObjectKind, name: &str, bytes: &[u8]) -> Result<bool, BackendError>;
    /// Deletes an object (no error if it is already gone).
    fn delete(&self, kind: ObjectKind, name: &str) -> Result<(), BackendError>;
    /// The requests made and bytes moved so far, for a store that bills them (`None` here).
    fn stats(&self) -> Option<BackendStats> {
        None
    }
}

/// Requests made and bytes moved for one kind of request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpStats {
    /// Requests that got an answer (retries and multipart parts each count).
    pub requests: u64,
    /// Request body bytes.
    pub bytes_sent: u64,
    /// Response body bytes.
    pub bytes_received: u64,
}

/// What a remote backend asked of its store, per kind of request, as a bill counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BackendStats {
    /// Listings (`GET ?list-type=2`), one per page of up to 1000 objects.
    pub list: OpStats,
    /// Reads: `GET` of an object or a range of it, and `HEAD`.
    pub get: OpStats,
    /// Writes: `PUT`, and a multipart upload's start, parts and completion.
    pub put: OpStats,
    /// `DELETE`s.
    pub delete: OpStats,
}

impl std::fmt::Display for BackendStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ops = [
            ("list", &self.list),
            ("get", &self.get),
            ("put", &self.put),
            ("delete", &self.delete),
        ];
        for (i, (name, op)) in ops.into_iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "{name} {} request{}, {} sent, {} received",
                op.requests,
                if op.requests == 1 { "" } else { "s" },
                human_bytes(op.bytes_sent),
                human_bytes(op.bytes_received)
            )?;
        }
        Ok(())
    }
}

fn human_bytes(n: u64) -> String {
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "B";
    for u in ["KiB", "MiB", "GiB", "TiB"] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// Opens the repository at `location`: `s3:…` (see [`crate::s3`]) or a local directory.
pub fn open_location(location: &Path) -> Result<Box<dyn Backend>, BackendError> {
    #[cfg(feature = "s3")]
    if let Some(url) = location.to_str().filter(|l| crate::s3::S3Url::is_s3(l)) {
        return Ok(Box::new(crate::s3::S3Backend::open(url)?));
    }
    Ok(Box::new(LocalBackend::open(location)?))
}

/// Prepares `location` (`s3:…` or a local directory) for a new repository.
pub fn create_location(location: &Path) -> Result<Box<dyn Backend>, BackendError> {
    #[cfg(feature = "s3")]
    if let Some(url) = location.to_str().filter(|l| crate::s3::S3Url::is_s3(l)) {
        return Ok(Box::new(crate::s3::S3Backend::create(url)?));
    }
    Ok(Box::new(LocalBackend::create(location)?))
}

/// A repository in a local directory.
#[derive(Debug)]
pub struct LocalBackend {
    root: PathBuf,
}

impl LocalBackend {
    /// Creates the directory layout under `root` (which must not hold a repository yet).
    pub fn create(root: &std::path::Path) -> Result<LocalBackend, BackendError> {
        match fs::symlink_metadata(root.join("config")) {
            Ok(_) => return Err(BackendError::AlreadyExists(root.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(root.join("config"), e)),
        }
        match fs::symlink_metadata(root) {
            Ok(_) => check_empty_layout(root)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(root, e)),
        }
        fs::create_dir_all(root).map_err(|e| io_error(root, e))?;
        for sub in SUBDIRS {
            make_dir(&root.join(sub))?;
        }
        let data = root.join("data");
        for i in 0..=255u8 {
            make_dir(&data.join(format!("{i:02x}")))?;
        }
        sync_dir(&data)?;
        sync_dir(root)?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(LocalBackend {
            root: root.to_path_buf(),
        })
    }

    /// Opens the repository directory `root`.
    pub fn open(root: &std::path::Path) -> Result<LocalBackend, BackendError> {
        let config = root.join("config");
        match fs::metadata(&config) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(BackendError::NoRepository(root.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(BackendError::NoRepository(root.to_path_buf()))
            }
            Err(e) => return Err(io_error(config, e)),
        }
        for sub in SUBDIRS {
            let dir = root.join(sub);
            match fs::metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(io_error(
                        dir,
                        io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
                    ))
                }
                Err(e) => return Err(io_error(dir, e)),
            }
        }
        let backend = LocalBackend {
            root: root.to_path_buf(),
        };
        backend.remove_stale_temps();
        Ok(backend)
    }

    /// The repository's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir_of(&self, kind: ObjectKind, name: &str) -> PathBuf {
        match kind {
            ObjectKind::Config => self.root.clone(),
            ObjectKind::Pack => self.root.join("data").join(&name[..2]),
            _ => self.root.join(kind.prefix()),
        }
    }

    fn path_of(&self, kind: ObjectKind, name: &str) -> Result<PathBuf, BackendError> {
        check_name(kind, name)?;
        Ok(self.dir_of(kind, name).join(name))
    }

    fn kind_dirs(&self, kind: ObjectKind) -> Vec<PathBuf> {
        match kind {
            ObjectKind::Pack => {
                let data = self.root.join("data");
                (0..=255u8).map(|i| data.join(format!("{i:02x}"))).collect()
            }
            _ => vec![self.dir_of(kind, "")],
        }
    }

    fn remove_stale_temps(&self) {
        let kinds = [
            ObjectKind::Config,
            ObjectKind::Key,
            ObjectKind::Pack,
            ObjectKind::Index,
            ObjectKind::Snapshot,
            ObjectKind::Lock,
        ];
        let now = SystemTime::now();
        for dir in kinds.into_iter().flat_map(|k| self.kind_dirs(k)) {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let stale = entry.file_name().to_str().is_some_and(is_temp)
                    && entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > STALE_TEMP_AGE);
                if stale {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
    }
}

impl Backend for LocalBackend {
    fn list(&self, kind: ObjectKind) -> Result<Vec<(String, u64)>, BackendError> {
        if kind == ObjectKind::Config {
            let path = self.root.join("config");
            return match fs::metadata(&path) {
                Ok(m) if m.is_file() => Ok(vec![("config".to_string(), m.len())]),
                Ok(_) => Ok(Vec::new()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(io_error(path, e)),
            };
        }
        let mut out = Vec::new();
        for dir in self.kind_dirs(kind) {
            let entries = fs::read_dir(&dir).map_err(|e| io_error(&dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| io_error(&dir, e))?;
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                if check_name(kind, &name).is_err() || self.dir_of(kind, &name) != dir {
                    continue;
                }
                match fs::metadata(entry.path()) {
                    Ok(m) if m.is_file() => out.push((name, m.len())),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_error(entry.path(), e)),
                }
            }
        }
        Ok(out)
    }

    fn get(&self, kind: ObjectKind, name: &str) -> Result<Vec<u8>, BackendError> {
        let path = self.path_of(kind, name)?;
        fs::read(&path).map_err(|e| not_found_or_io(kind, name, path, e))
    }

    fn get_range(
        &self,
        kind: ObjectKind,
        name: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, BackendError> {
        let path = self.path_of(kind, name)?;
        let file = File::open(&path).map_err(|e| not_found_or_io(kind, name, &path, e))?;
        let size = file.metadata().map_err(|e| io_error(&path, e))?.len();
        let want = len.min(size.saturating_sub(offset));
        let want = usize::try_from(want).map_err(|_| {
            io_error(
                &path,
                io::Error::new(io::ErrorKind::OutOfMemory, "range too large"),
            )
        })?;
        let mut buf = vec![0u8; want];
        let mut filled = 0;
        while filled < want {
            match read_at(&file, &mut buf[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(&path, e)),
            }
        }
        buf.truncate(filled);
        Ok(buf)
    }

    fn put_new(&self, kind: ObjectKind, name: &str, bytes: &[u8]) -> Result<bool, BackendError> {
        let path = self.path_of(kind, name)?;
        if fs::symlink_metadata(&path).is_ok() {
            return Ok(false);
        }
        let dir = self.dir_of(kind, name);
        let temp = dir.join(temp_name());
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .and_then(|mut f| {
                f.write_all(bytes)?;
                f.sync_all()
            });
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(io_error(&path, e));
        }
        let created = match fs::hard_link(&temp, &path) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => {
                let _ = fs::remove_file(&temp);
                return Err(io_error(&path, e));
            }
        };
        let _ = fs::remove_file(&temp);
        sync_dir(&dir)?;
        Ok(created)
    }

    fn delete(&self, kind: ObjectKind, name: &str) -> Result<(), BackendError> {
        let path = self.path_of(kind, name)?;
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir_of(kind, name)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(path, e)),
        }
    }
}

pub(crate) fn check_name(kind: ObjectKind, name: &str) -> Result<(), BackendError> {
    let ok = match kind {
        ObjectKind::Config => name == "config",
        _ => {
            let min = if kind == ObjectKind::Pack { 2 } else { 1 };
            (min..=MAX_NAME_LEN).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'z' | b'_' | b'-'))
                && name != "config"
        }
    };
    if ok {
        Ok(())
    } else {
        Err(BackendError::BadName(name.to_string(), kind.prefix()))
    }
}

fn is_temp(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut salt = [0u8; 8];
    if getrandom::fill(&mut salt).is_err() {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        salt = (nanos as u64).to_le_bytes();
    }
    format!(
        "{TEMP_PREFIX}{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        hex::encode(salt)
    )
}

fn check_empty_layout(root: &Path) -> Result<(), BackendError> {
    let not_empty = || BackendError::NotEmpty(root.to_path_buf());
    let entries = fs::read_dir(root).map_err(|e| io_error(root, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error(root, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(not_empty());
        };
        if is_temp(name) {
            continue;
        }
        if !SUBDIRS.contains(&name) || !entry.path().is_dir() {
            return Err(not_empty());
        }
        if !holds_no_objects(&entry.path(), name == "data")? {
            return Err(if name == "keys" {
                BackendError::Unfinished(root.to_path_buf())
            } else {
                not_empty()
            });
        }
    }
    Ok(())
}

fn holds_no_objects(dir: &Path, fan_out: bool) -> Result<bool, BackendError> {
    for entry in fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let name = entry.file_name();
        let name = name.to_str().unwrap_or("");
        if is_temp(name) {
            continue;
        }
        let fan = fan_out
            && name.len() == 2
            && name
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            && entry.path().is_dir();
        if !fan || !holds_no_objects(&entry.path(), false)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn make_dir(dir: &Path) -> Result<(), BackendError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(io_error(dir, e)),
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), BackendError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, e))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), BackendError> {
    Ok(())
}

fn io_error(path: impl AsRef<Path>, source: io::Error) -> BackendError {
    BackendError::Io {
        what: path.as_ref().display().to_string(),
        source,
    }
}

fn not_found_or_io(
    kind: ObjectKind,
    name: &str,
    path: impl AsRef<Path>,
    e: io::Error,
) -> BackendError {
    if e.kind() == io::ErrorKind::NotFound {
        match kind {
            ObjectKind::Config => BackendError::NotFound("config".to_string()),
            _ => BackendError::NotFound(format!("{}/{name}", kind.prefix())),
        }
    } else {
        io_error(path, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ObjectKind; 5] = [
        ObjectKind::Key,
        ObjectKind::Pack,
        ObjectKind::Index,
        ObjectKind::Snapshot,
        ObjectKind::Lock,
    ];

    fn new_repo() -> (tempfile::TempDir, LocalBackend) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        let backend = LocalBackend::create(&root).unwrap();
        backend
            .put_new(ObjectKind::Config, "config", b"cfg")
            .unwrap();
        (dir, backend)
    }

    fn sorted(mut v: Vec<(String, u64)>) -> Vec<(String, u64)> {
        v.sort();
        v
    }

    #[test]
    fn create_makes_the_layout() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a/b/repo");
        LocalBackend::create(&root).unwrap();
        for sub in SUBDIRS {
            assert!(root.join(sub).is_dir(), "{sub}");
        }
        assert!(root.join("data/00").is_dir());
        assert!(root.join("data/ff").is_dir());
        assert_eq!(fs::read_dir(root.join("data")).unwrap().count(), 256);
        assert!(!root.join("config").exists());
    }

    #[test]
    fn create_in_an_empty_directory_and_again_before_config() {
        let dir = tempfile::tempdir().unwrap();
        LocalBackend::create(dir.path()).unwrap();
        LocalBackend::create(dir.path()).unwrap();
    }

    #[test]
    fn create_refuses_a_repository() {
        let (_dir, backend) = new_repo();
        let err = LocalBackend::create(backend.root()).unwrap_err();
        assert!(matches!(err, BackendError::AlreadyExists(_)), "{err}");
        assert!(err.to_string().contains("already holds a repository"));
    }

    #[test]
    fn create_refuses_a_non_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("photo.jpg"), b"x").unwrap();
        let err = LocalBackend::create(dir.path()).unwrap_err();
        assert!(matches!(err, BackendError::NotEmpty(_)), "{err}");
        assert!(err.to_string().contains("not empty"));

        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::create(dir.path()).unwrap();
        backend.put_new(ObjectKind::Pack, "abcd", b"pack").unwrap();
        let err = LocalBackend::create(dir.path()).unwrap_err();
        assert!(matches!(err, BackendError::NotEmpty(_)), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::create(dir.path()).unwrap();
        backend.put_new(ObjectKind::Key, "k1", b"key").unwrap();
        let err = LocalBackend::create(dir.path()).unwrap_err();
        assert!(matches!(err, BackendError::Unfinished(_)), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        assert!(LocalBackend::create(&file).is_err());
    }

    #[test]
    fn open_without_a_repository() {
        let dir = tempfile::tempdir().unwrap();
        let err = LocalBackend::open(dir.path()).unwrap_err();
        assert!(matches!(err, BackendError::NoRepository(_)));
        let text = err.to_string();
        assert!(text.contains("no repository at"), "{text}");
        assert!(text.contains("`dedupwire repo init` makes one"), "{text}");
        let err = LocalBackend::open(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, BackendError::NoRepository(_)));

        LocalBackend::create(dir.path()).unwrap();
        let err = LocalBackend::open(dir.path()).unwrap_err();
        assert!(matches!(err, BackendError::NoRepository(_)));
    }

    #[test]
    fn open_a_repository() {
        let (_dir, backend) = new_repo();
        let opened = LocalBackend::open(backend.root()).unwrap();
        assert_eq!(opened.get(ObjectKind::Config, "config").unwrap(), b"cfg");
        assert_eq!(
            opened.list(ObjectKind::Config).unwrap(),
            vec![("config".to_string(), 3)]
        );
        fs::remove_dir(backend.root().join("locks")).unwrap();
        let err = LocalBackend::open(backend.root()).unwrap_err();
        assert!(err.to_string().contains("locks"), "{err}");
    }

    #[test]
    fn put_new_creates_once() {
        let (_dir, backend) = new_repo();
        for kind in KINDS {
            assert!(backend.put_new(kind, "ab12", b"first").unwrap());
            assert!(!backend.put_new(kind, "ab12", b"second!").unwrap());
            assert_eq!(backend.get(kind, "ab12").unwrap(), b"first");
        }
        assert!(!backend.put_new(ObjectKind::Config, "config", b"x").unwrap());
        assert_eq!(backend.get(ObjectKind::Config, "config").unwrap(), b"cfg");
        assert_eq!(
            fs::read(backend.root().join("data/ab/ab12")).unwrap(),
            b"first"
        );
        assert_eq!(
            fs::read(backend.root().join("keys/ab12")).unwrap(),
            b"first"
        );
    }

    #[test]
    fn put_new_loses_a_race_without_touching_the_winner() {
        let (_dir, backend) = new_repo();
        let backend = std::sync::Arc::new(backend);
        let threads: Vec<_> = (0..8u8)
            .map(|i| {
                let backend = backend.clone();
                std::thread::spawn(move || {
                    let bytes = vec![i; 10_000];
                    (
                        i,
                        backend.put_new(ObjectKind::Index, "race", &bytes).unwrap(),
                    )
                })
            })
            .collect();
        let results: Vec<(u8, bool)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let winners: Vec<u8> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
        assert_eq!(winners.len(), 1);
        assert_eq!(
            backend.get(ObjectKind::Index, "race").unwrap(),
            vec![winners[0]; 10_000]
        );
        assert_eq!(
            fs::read_dir(backend.root().join("index")).unwrap().count(),
            1
        );
    }

    #[test]
    fn list_get_get_range_delete() {
        let (_dir, backend) = new_repo();
        for kind in KINDS {
            assert!(backend.list(kind).unwrap().is_empty());
            backend.put_new(kind, "00aa", b"").unwrap();
            backend.put_new(kind, "ff-1", b"hello world").unwrap();
            backend.put_new(kind, "ff_2", &[7u8; 3000]).unwrap();
            assert_eq!(
                sorted(backend.list(kind).unwrap()),
                vec![
                    ("00aa".to_string(), 0),
                    ("ff-1".to_string(), 11),
                    ("ff_2".to_string(), 3000)
                ]
            );
            assert_eq!(backend.get(kind, "00aa").unwrap(), b"");
            assert_eq!(backend.get_range(kind, "ff-1", 6, 5).unwrap(), b"world");
            assert_eq!(backend.get_range(kind, "ff-1", 0, 0).unwrap(), b"");
            assert_eq!(backend.get_range(kind, "ff-1", 6, 100).unwrap(), b"world");
            assert_eq!(backend.get_range(kind, "ff-1", 11, 1).unwrap(), b"");
            assert_eq!(backend.get_range(kind, "ff-1", 500, 1).unwrap(), b"");
            assert_eq!(
                backend.get_range(kind, "ff-1", 0, u64::MAX).unwrap(),
                b"hello world"
            );
            assert_eq!(
                backend.get_range(kind, "ff_2", 1000, 1500).unwrap(),
                vec![7u8; 1500]
            );
            backend.delete(kind, "ff-1").unwrap();
            backend.delete(kind, "ff-1").unwrap();
            backend.delete(kind, "never-was").unwrap();
            assert_eq!(
                sorted(backend.list(kind).unwrap()),
                vec![("00aa".to_string(), 0), ("ff_2".to_string(), 3000)]
            );
            for result in [
                backend.get(kind, "ff-1").map(drop),
                backend.get_range(kind, "ff-1", 0, 1).map(drop),
            ] {
                match result {
                    Err(BackendError::NotFound(what)) => {
                        assert_eq!(what, format!("{}/ff-1", kind.prefix()))
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert!(backend.put_new(kind, "ff-1", b"again").unwrap());
        }
        assert_eq!(backend.list(ObjectKind::Pack).unwrap().len(), 3);
        assert!(backend.root().join("data/00/00aa").is_file());
        assert!(backend.root().join("data/ff/ff_2").is_file());
    }

    #[test]
    fn config_object() {
        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::create(dir.path()).unwrap();
        assert!(backend.list(ObjectKind::Config).unwrap().is_empty());
        assert!(matches!(
            backend.get(ObjectKind::Config, "config"),
            Err(BackendError::NotFound(w)) if w == "config"
        ));
        assert!(backend.put_new(ObjectKind::Config, "config", b"c").unwrap());
        assert_eq!(fs::read(dir.path().join("config")).unwrap(), b"c");
        LocalBackend::open(dir.path()).unwrap();
    }

    #[test]
    fn bad_names_are_rejected() {
        let (_dir, backend) = new_repo();
        let long = "a".repeat(MAX_NAME_LEN + 1);
        let bad = [
            "",
            ".",
            "..",
            "../config",
            "a/b",
            "/etc",
            "ABC",
            "a.b",
            ".tmp-1",
            "a b",
            "é",
            "a\0",
            "config",
            long.as_str(),
        ];
        for kind in KINDS {
            for name in bad {
                let results = [
                    backend.get(kind, name).map(drop),
                    backend.get_range(kind, name, 0, 1).map(drop),
                    backend.put_new(kind, name, b"x").map(drop),
                    backend.delete(kind, name),
                ];
                for r in results {
                    assert!(
                        matches!(r, Err(BackendError::BadName(..))),
                        "{kind:?} {name:?}: {r:?}"
                    );
                }
            }
        }
        assert!(matches!(
            backend.put_new(ObjectKind::Pack, "a", b"x"),
            Err(BackendError::BadName(..))
        ));
        assert!(backend.put_new(ObjectKind::Key, "a", b"x").unwrap());
        assert!(backend
            .put_new(ObjectKind::Key, &"z".repeat(MAX_NAME_LEN), b"x")
            .unwrap());
        assert!(matches!(
            backend.get(ObjectKind::Config, "other"),
            Err(BackendError::BadName(..))
        ));
        assert_eq!(backend.get(ObjectKind::Config, "config").unwrap(), b"cfg");
        assert!(!backend.root().join("x").exists());
    }

    #[test]
    fn temp_files_are_invisible_and_stale_ones_removed() {
        let (_dir, backend) = new_repo();
        let root = backend.root().to_path_buf();
        backend.put_new(ObjectKind::Index, "real", b"r").unwrap();
        backend.put_new(ObjectKind::Pack, "abff", b"p").unwrap();
        let fresh = root.join("index/.tmp-fresh");
        let stale = root.join("index/.tmp-stale");
        let stale_pack = root.join("data/ab/.tmp-stale");
        let stale_root = root.join(".tmp-stale");
        for path in [&fresh, &stale, &stale_pack, &stale_root] {
            fs::write(path, b"partial").unwrap();
        }
        fs::write(root.join("data/ab/cdef"), b"misplaced").unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        for path in [&stale, &stale_pack, &stale_root] {
            File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        assert_eq!(
            backend.list(ObjectKind::Index).unwrap(),
            vec![("real".to_string(), 1)]
        );
        assert_eq!(
            backend.list(ObjectKind::Pack).unwrap(),
            vec![("abff".to_string(), 1)]
        );
        LocalBackend::open(&root).unwrap();
        assert!(fresh.exists());
        assert!(!stale.exists());
        assert!(!stale_pack.exists());
        assert!(!stale_root.exists());
        assert_eq!(backend.get(ObjectKind::Index, "real").unwrap(), b"r");
    }

    #[test]
    fn put_new_leaves_no_temp_files() {
        let (_dir, backend) = new_repo();
        for i in 0..20 {
            backend
                .put_new(ObjectKind::Snapshot, &format!("s{i}"), &[i as u8; 100])
                .unwrap();
        }
        backend.put_new(ObjectKind::Snapshot, "s0", b"dup").unwrap();
        for entry in fs::read_dir(backend.root().join("snapshots")).unwrap() {
            let name = entry.unwrap().file_name();
            assert!(!is_temp(name.to_str().unwrap()), "{name:?}");
        }
    }

    #[test]
    fn a_failed_write_is_an_io_error_naming_the_object() {
        let (_dir, backend) = new_repo();
        let index = backend.root().join("index");
        fs::remove_dir(&index).unwrap();
        fs::write(&index, b"not a directory").unwrap();
        let err = backend
            .put_new(ObjectKind::Index, "victim", b"bytes")
            .unwrap_err();
        assert!(matches!(&err, BackendError::Io { what, .. } if what.ends_with("index/victim")));
    }
}
