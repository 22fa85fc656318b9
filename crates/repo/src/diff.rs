//! `diff`: what changed between two snapshots, path by path. Subtrees with the same id are
//! equal and not read.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::blob::BlobId;
use crate::repository::{Repository, Result};
use crate::tree::{Node, NodeKind};

/// How a path differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Only in the second snapshot.
    Added,
    /// Only in the first.
    Removed,
    /// In both, with other contents (or another kind of entry).
    Modified,
    /// Same contents, other mode or mtime.
    Metadata,
}

impl Change {
    /// One character, as `diff` prints it: `+`, `-`, `M`, `U`.
    pub fn symbol(self) -> char {
        match self {
            Change::Added => '+',
            Change::Removed => '-',
            Change::Modified => 'M',
            Change::Metadata => 'U',
        }
    }
}

/// The changes from the tree `a` to the tree `b`, in path order.
pub fn diff(repo: &Repository, a: &BlobId, b: &BlobId) -> Result<Vec<(Change, PathBuf)>> {
    let mut out = Vec::new();
    diff_trees(repo, Some(*a), Some(*b), Path::new(""), &mut out)?;
    Ok(out)
}

fn by_name(repo: &Repository, id: Option<BlobId>) -> Result<BTreeMap<Vec<u8>, Node>> {
    let Some(id) = id else {
        return Ok(BTreeMap::new());
    };
    Ok(repo
        .read_tree(&id)?
        .nodes
        .into_iter()
        .filter_map(|n| n.name_bytes().map(|k| (k, n)))
        .collect())
}

fn subtree(n: Option<&Node>) -> Option<BlobId> {
    match n.map(|n| &n.kind) {
        Some(NodeKind::Dir { subtree }) => Some(*subtree),
        _ => None,
    }
}

fn diff_trees(
    repo: &Repository,
    a: Option<BlobId>,
    b: Option<BlobId>,
    at: &Path,
    out: &mut Vec<(Change, PathBuf)>,
) -> Result<()> {
    if a == b {
        return Ok(());
    }
    let (left, right) = (by_name(repo, a)?, by_name(repo, b)?);
    let mut names: Vec<&Vec<u8>> = left.keys().chain(right.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let path = at.join(std::ffi::OsStr::from_bytes(name));
        let (l, r) = (left.get(name), right.get(name));
        let change = match (l, r) {
            (None, Some(_)) => Some(Change::Added),
            (Some(_), None) => Some(Change::Removed),
            (Some(l), Some(r)) => {
                let same_kind = std::mem::discriminant(&l.kind) == std::mem::discriminant(&r.kind);
                match (&l.kind, &r.kind) {
                    (NodeKind::Dir { .. }, NodeKind::Dir { .. }) => {
                        (l.mode != r.mode || l.mtime_ns != r.mtime_ns).then_some(Change::Metadata)
                    }
                    _ if !same_kind || l.kind != r.kind => Some(Change::Modified),
                    _ if l.mode != r.mode || l.mtime_ns != r.mtime_ns => Some(Change::Metadata),
                    _ => None,
                }
            }
            (None, None) => None,
        };
        if let Some(c) = change {
            out.push((c, path.clone()));
        }
        if subtree(l).is_some() || subtree(r).is_some() {
            diff_trees(repo, subtree(l), subtree(r), &path, out)?;
        }
    }
    Ok(())
}
