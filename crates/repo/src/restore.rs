//! `restore`: a snapshot (or part of it) into a directory, bit-exact.
//!
//! Contents, modes, mtimes, symlinks and empty directories are restored; owners too when
//! running as root (otherwise the restored files are the restorer's, and the result says so).
//! A file whose blobs are missing or damaged is not left half-written: it is removed, named in
//! the result, and the rest is restored.
//!
//! The trees are walked first (directories and symlinks made on the way), then files are
//! written by rayon's workers in batches, then directories get their modes and mtimes,
//! deepest first. Files are not fsynced one by one (nor by restic or borg): a restore cut off
//! is run again.

use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Timespec, Timestamps, CWD, UTIME_OMIT};

use crate::repository::{RepoError, Repository, Result};
use crate::tree::{bytes_of, Node, NodeKind};

/// What a restore did.
#[derive(Debug, Clone, Default)]
pub struct RestoreReport {
    /// Files restored.
    pub files: u64,
    /// Directories restored.
    pub dirs: u64,
    /// Symlinks restored.
    pub symlinks: u64,
    /// Bytes of file contents written.
    pub bytes: u64,
    /// What could not be restored, and why.
    pub errors: Vec<String>,
    /// Whether owners were left as the restorer's (not running as root).
    pub owners_skipped: bool,
}

/// Restores the snapshot whose root tree is `tree` into `target`: each backed-up path `/a/b`
/// becomes `target/a/b`. With `include`, only those paths (as backed up, or below them) and
/// the directories leading to them.
pub fn restore(
    repo: &Repository,
    tree: &crate::BlobId,
    target: &Path,
    include: &[PathBuf],
    on_file: &mut dyn FnMut(&RestoreReport),
) -> Result<RestoreReport> {
    let root = repo.read_tree(tree)?;
    let mut r = Restorer {
        repo,
        report: RestoreReport {
            owners_skipped: !rustix::process::geteuid().is_root(),
            ..RestoreReport::default()
        },
        include,
        files: Vec::new(),
        dirs: Vec::new(),
    };
    fs::create_dir_all(target).map_err(|e| io(target, e))?;
    for node in &root.nodes {
        let Some(name) = node.name.as_deref() else {
            r.report
                .errors
                .push("a root entry without a name".to_string());
            continue;
        };
        let dest = target.join(relative(Path::new(name))?);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        r.node(node, &dest, Path::new(name))?;
    }
    let files = std::mem::take(&mut r.files);
    for batch in files.chunks(FILES_PER_BATCH) {
        use rayon::prelude::*;
        let done: Vec<Result<(), String>> = batch
            .par_iter()
            .map(|job| {
                let r2 = Restorer::file(repo, &job.dest, &job.content, job.size);
                r2.and_then(|()| {
                    finish(&job.node, &job.dest, false, r.report.owners_skipped)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for (job, result) in batch.iter().zip(done) {
            match result {
                Ok(()) => {
                    r.report.files += 1;
                    r.report.bytes += job.size;
                }
                Err(why) => {
                    let _ = fs::remove_file(&job.dest);
                    r.report
                        .errors
                        .push(format!("{}: not restored: {why}", job.path.display()));
                }
            }
        }
        on_file(&r.report);
    }
    for (node, dest) in std::mem::take(&mut r.dirs) {
        finish(&node, &dest, false, r.report.owners_skipped)?;
        r.report.dirs += 1;
    }
    Ok(r.report)
}

/// Files handed to the workers at once (progress is reported between batches).
const FILES_PER_BATCH: usize = 256;

/// A file to write.
struct FileJob {
    node: Node,
    dest: PathBuf,
    path: PathBuf,
    content: Vec<crate::BlobId>,
    size: u64,
}

/// A backed-up path made relative (`/a/b` -> `a/b`), refusing `..`.
fn relative(path: &Path) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir => {}
            _ => {
                return Err(RepoError::Damaged(format!(
                    "the snapshot names {} (with ..)",
                    path.display()
                )))
            }
        }
    }
    Ok(out)
}

fn io(path: &Path, e: std::io::Error) -> RepoError {
    RepoError::Invalid(format!("{}: {e}", path.display()))
}

struct Restorer<'a> {
    repo: &'a Repository,
    report: RestoreReport,
    include: &'a [PathBuf],
    /// Files to write, in the snapshot's order.
    files: Vec<FileJob>,
    /// Directories to finish, children before parents.
    dirs: Vec<(Node, PathBuf)>,
}

impl Restorer<'_> {
    /// Whether `path` (as backed up) is to be restored: under an included path, or a
    /// directory leading to one.
    fn wanted(&self, path: &Path, is_dir: bool) -> (bool, bool) {
        if self.include.is_empty() {
            return (true, true);
        }
        let whole = self.include.iter().any(|i| path.starts_with(i));
        let leads = is_dir && self.include.iter().any(|i| i.starts_with(path));
        (whole || leads, whole)
    }

    fn node(&mut self, node: &Node, dest: &Path, path: &Path) -> Result<()> {
        let is_dir = matches!(node.kind, NodeKind::Dir { .. });
        let (wanted, whole) = self.wanted(path, is_dir);
        if !wanted {
            return Ok(());
        }
        match &node.kind {
            NodeKind::Dir { subtree } => {
                let tree = self.repo.read_tree(subtree)?;
                fs::create_dir_all(dest).map_err(|e| io(dest, e))?;
                fs::set_permissions(dest, fs::Permissions::from_mode(0o700))
                    .map_err(|e| io(dest, e))?;
                let saved = self.include;
                let empty: &[PathBuf] = &[];
                if whole {
                    self.include = empty;
                }
                for child in &tree.nodes {
                    let Some(name) = child.name_bytes() else {
                        self.report
                            .errors
                            .push(format!("{}: an entry without a name", path.display()));
                        continue;
                    };
                    let name = std::ffi::OsStr::from_bytes(&name);
                    if name.is_empty()
                        || name == "."
                        || name == ".."
                        || name.as_bytes().contains(&b'/')
                    {
                        return Err(RepoError::Damaged(format!(
                            "{}: an entry named {name:?}",
                            path.display()
                        )));
                    }
                    self.node(child, &dest.join(name), &path.join(name))?;
                }
                self.include = saved;
                self.dirs.push((node.clone(), dest.to_path_buf()));
            }
            NodeKind::File { content, size } => {
                self.files.push(FileJob {
                    node: node.clone(),
                    dest: dest.to_path_buf(),
                    path: path.to_path_buf(),
                    content: content.clone(),
                    size: *size,
                });
            }
            NodeKind::Symlink { target, target_hex } => {
                let Some(t) = bytes_of(target, target_hex) else {
                    self.report
                        .errors
                        .push(format!("{}: a symlink without a target", path.display()));
                    return Ok(());
                };
                let target = std::ffi::OsStr::from_bytes(&t);
                replacing(dest, || std::os::unix::fs::symlink(target, dest))
                    .map_err(|e| io(dest, e))?;
                finish(node, dest, true, self.report.owners_skipped)?;
                self.report.symlinks += 1;
            }
        }
        Ok(())
    }

    fn file(
        repo: &Repository,
        dest: &Path,
        content: &[crate::BlobId],
        size: u64,
    ) -> Result<(), String> {
        let mut f = replacing(dest, || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dest)
        })
        .map_err(|e| e.to_string())?;
        let mut written = 0u64;
        for id in content {
            let bytes = repo.read_blob(id).map_err(|e| e.to_string())?;
            f.write_all(&bytes).map_err(|e| e.to_string())?;
            written += bytes.len() as u64;
        }
        if written != size {
            return Err(format!(
                "its chunks make {written} bytes, the snapshot says {size}"
            ));
        }
        Ok(())
    }
}

/// Runs `create`; where something is in the way, removes it (a file or symlink, never a
/// directory) and runs `create` once more.
fn replacing<T>(dest: &Path, create: impl Fn() -> std::io::Result<T>) -> std::io::Result<T> {
    match create() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            fs::remove_file(dest)?;
            create()
        }
        r => r,
    }
}

/// Owner, mode and mtime, in that order (a chown clears set-id bits).
fn finish(node: &Node, dest: &Path, symlink: bool, owners_skipped: bool) -> Result<()> {
    if !owners_skipped {
        let _ = std::os::unix::fs::lchown(dest, Some(node.uid), Some(node.gid));
    }
    if !symlink {
        fs::set_permissions(dest, fs::Permissions::from_mode(node.mode))
            .map_err(|e| io(dest, e))?;
    }
    let t = Timespec {
        tv_sec: node.mtime_ns.div_euclid(1_000_000_000),
        tv_nsec: node.mtime_ns.rem_euclid(1_000_000_000),
    };
    let omit = Timespec {
        tv_sec: 0,
        tv_nsec: UTIME_OMIT,
    };
    rustix::fs::utimensat(
        CWD,
        dest,
        &Timestamps {
            last_access: omit,
            last_modification: t,
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| io(dest, e.into()))
}
