//! What a send changes: the old manifest of a tree against the new one, path by path.
//!
//! Directories are counted apart from files; symlinks count as files. Which files need their
//! contents sent is decided by the receiver ([`apply`](crate::apply)), which may find a
//! file's contents elsewhere in its current tree (a renamed or copied file travels as
//! nothing).

use std::cmp::Ordering;

use crate::manifest::{cmp_paths, Entry, Kind, Manifest};

/// How a path changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Not in the old tree.
    New,
    /// In both, different (contents, kind, mode or mtime).
    Changed,
    /// Only in the old tree: deleted.
    Deleted,
}

impl Change {
    /// One character: `+`, `~` or `-`.
    pub fn symbol(self) -> char {
        match self {
            Change::New => '+',
            Change::Changed => '~',
            Change::Deleted => '-',
        }
    }
}

/// Counts of what a send changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Files and symlinks not in the old tree.
    pub files_new: u64,
    /// Files and symlinks in both trees that differ.
    pub files_changed: u64,
    /// Files and symlinks identical in both trees.
    pub files_unchanged: u64,
    /// Files and symlinks only in the old tree.
    pub files_deleted: u64,
    /// Directories created.
    pub dirs_new: u64,
    /// Directories removed.
    pub dirs_deleted: u64,
    /// Every path that changes (directories included), in path order.
    pub changes: Vec<(Change, Vec<u8>)>,
}

fn is_dir(e: &Entry) -> bool {
    e.kind == Kind::Dir
}

/// Compares `old` (the receiver's current tree, empty if there is none) to `new`.
pub fn diff(old: &Manifest, new: &Manifest) -> Diff {
    let mut d = Diff::default();
    let (mut i, mut j) = (0, 0);
    let (a, b) = (&old.entries, &new.entries);
    let gone = |d: &mut Diff, e: &Entry| {
        if is_dir(e) {
            d.dirs_deleted += 1;
        } else {
            d.files_deleted += 1;
        }
        d.changes.push((Change::Deleted, e.path.clone()));
    };
    let added = |d: &mut Diff, e: &Entry| {
        if is_dir(e) {
            d.dirs_new += 1;
        } else {
            d.files_new += 1;
        }
        d.changes.push((Change::New, e.path.clone()));
    };
    while i < a.len() || j < b.len() {
        let ord = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) => cmp_paths(&x.path, &y.path),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match ord {
            Ordering::Less => {
                gone(&mut d, &a[i]);
                i += 1;
            }
            Ordering::Greater => {
                added(&mut d, &b[j]);
                j += 1;
            }
            Ordering::Equal => {
                let (x, y) = (&a[i], &b[j]);
                if is_dir(x) != is_dir(y) {
                    gone(&mut d, x);
                    added(&mut d, y);
                } else if x != y {
                    if !is_dir(y) {
                        d.files_changed += 1;
                    }
                    d.changes.push((Change::Changed, y.path.clone()));
                } else if !is_dir(y) {
                    d.files_unchanged += 1;
                }
                i += 1;
                j += 1;
            }
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(path: &str, kind: Kind, mtime_ns: i64) -> Entry {
        Entry {
            path: path.into(),
            kind,
            mode: 0o644,
            mtime_ns,
        }
    }

    fn f(path: &str, h: u8, mtime_ns: i64) -> Entry {
        e(
            path,
            Kind::File {
                size: 1,
                hash: [h; 32],
            },
            mtime_ns,
        )
    }

    #[test]
    fn counts_each_kind_of_change() {
        let old = Manifest {
            entries: vec![
                e("d", Kind::Dir, 0),
                f("d/a", 1, 0),
                f("d/b", 2, 0),
                f("gone", 3, 0),
            ],
            ..Manifest::default()
        };
        let new = Manifest {
            entries: vec![
                e("d", Kind::Dir, 9),
                f("d/a", 1, 0),
                f("d/b", 2, 1),
                e("n", Kind::Dir, 0),
                f("n/x", 4, 0),
            ],
            ..Manifest::default()
        };
        let d = diff(&old, &new);
        assert_eq!(
            (
                d.files_new,
                d.files_changed,
                d.files_unchanged,
                d.files_deleted
            ),
            (1, 1, 1, 1)
        );
        assert_eq!((d.dirs_new, d.dirs_deleted), (1, 0));
        let syms: String = d.changes.iter().map(|c| c.0.symbol()).collect();
        assert_eq!(syms, "~~-++");
    }
}
