//! `restore`: a snapshot (or part of it) into a directory, bit-exact.
//!
//! Contents, modes, mtimes, symlinks and empty directories are restored; owners too when
//! running as root (otherwise the restored files are the restorer's, and the result says so).
//! A file whose blobs are missing or damaged is not left half-written: it is removed, named in
//! the result, and the rest is restored.

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
        on_file,
    };
    fs::create_dir_all(target).map_err(|e| io(target, e))?;
    for node in &root.nodes {
        let Some(name) = node.name.as_deref() else {
            r.report
                .errors
                .push("a root entry without a name".to_string());
            continue;
        };
        let rel = relative(Path::new(name))?;
        r.node(node, &target.join(&rel), Path::new(name))?;
    }
    Ok(r.report)
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
    on_file: &'a mut dyn FnMut(&RestoreReport),
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
                self.finish(node, dest, false)?;
                self.report.dirs += 1;
            }
            NodeKind::File { content, size } => {
                if let Some(parent) = dest.parent() {
                    fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
                }
                match self.file(dest, content, *size) {
                    Ok(()) => {
                        self.finish(node, dest, false)?;
                        self.report.files += 1;
                        self.report.bytes += size;
                    }
                    Err(why) => {
                        let _ = fs::remove_file(dest);
                        self.report
                            .errors
                            .push(format!("{}: not restored: {why}", path.display()));
                    }
                }
                (self.on_file)(&self.report);
            }
            NodeKind::Symlink { target, target_hex } => {
                let Some(t) = bytes_of(target, target_hex) else {
                    self.report
                        .errors
                        .push(format!("{}: a symlink without a target", path.display()));
                    return Ok(());
                };
                let _ = fs::remove_file(dest);
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&t), dest)
                    .map_err(|e| io(dest, e))?;
                self.finish(node, dest, true)?;
                self.report.symlinks += 1;
            }
        }
        Ok(())
    }

    fn file(&mut self, dest: &Path, content: &[crate::BlobId], size: u64) -> Result<(), String> {
        let _ = fs::remove_file(dest);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dest)
            .map_err(|e| e.to_string())?;
        let mut written = 0u64;
        for id in content {
            let bytes = self.repo.read_blob(id).map_err(|e| e.to_string())?;
            f.write_all(&bytes).map_err(|e| e.to_string())?;
            written += bytes.len() as u64;
        }
        if written != size {
            return Err(format!(
                "its chunks make {written} bytes, the snapshot says {size}"
            ));
        }
        f.sync_data().map_err(|e| e.to_string())
    }

    /// Owner, mode and mtime, in that order (a chown clears set-id bits).
    fn finish(&mut self, node: &Node, dest: &Path, symlink: bool) -> Result<()> {
        if !self.report.owners_skipped {
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
}
