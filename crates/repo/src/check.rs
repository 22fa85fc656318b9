//! `check`: is every snapshot restorable? The index against the packs, every tree and every
//! blob a snapshot names; with `read_data`, every byte of the packs (or a share of them).

use std::collections::HashSet;

use crate::backend::ObjectKind;
use crate::blob::{BlobId, BlobKind};
use crate::pack::{open_frame, read_trailer};
use crate::repository::{decode_delta, RepoError, Repository};
use crate::tree::NodeKind;

/// What `check` found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Snapshots checked.
    pub snapshots: u64,
    /// Packs in the index.
    pub packs: u64,
    /// Packs read whole.
    pub packs_read: u64,
    /// Blobs referenced by snapshots.
    pub blobs: u64,
    /// Every problem, each naming what is damaged or missing.
    pub errors: Vec<String>,
    /// Packs not in any index (left by a backup cut off between a pack and its index file):
    /// harmless, reclaimed by prune.
    pub unindexed_packs: u64,
}

/// Checks `repo`; `read_data`: the share of packs (0.0-1.0) to read and verify whole.
pub fn check(repo: &Repository, read_data: f64) -> crate::repository::Result<CheckReport> {
    let mut r = CheckReport::default();
    let stored: std::collections::HashMap<String, u64> =
        repo.backend().list(ObjectKind::Pack)?.into_iter().collect();
    let mut indexed = HashSet::new();
    for (name, size) in repo.index().packs() {
        r.packs += 1;
        indexed.insert(name.to_string());
        match stored.get(name) {
            None => r
                .errors
                .push(format!("pack {name} is in the index but missing")),
            Some(&s) if s != size => r.errors.push(format!(
                "pack {name} is {s} bytes, its index says {size} (truncated?)"
            )),
            Some(_) => {}
        }
    }
    r.unindexed_packs = stored.keys().filter(|n| !indexed.contains(*n)).count() as u64;

    let mut seen: HashSet<BlobId> = HashSet::new();
    let mut trees = Vec::new();
    match repo.snapshots() {
        Ok(all) => {
            for (id, s) in all {
                r.snapshots += 1;
                trees.push((id, s.tree));
            }
        }
        Err(e) => r.errors.push(e.to_string()),
    }
    while let Some((snap, tree_id)) = trees.pop() {
        if !seen.insert(tree_id) {
            continue;
        }
        let tree = match repo.read_tree(&tree_id) {
            Ok(t) => t,
            Err(e) => {
                r.errors
                    .push(format!("snapshot {}: {e}", &snap[..snap.len().min(8)]));
                continue;
            }
        };
        for node in tree.nodes {
            match node.kind {
                NodeKind::Dir { subtree } => trees.push((snap.clone(), subtree)),
                NodeKind::File { content, .. } => {
                    for id in content {
                        if !seen.insert(id) {
                            continue;
                        }
                        r.blobs += 1;
                        match repo.index().get(&id) {
                            None => r.errors.push(format!(
                                "snapshot {}: blob {id} is missing",
                                &snap[..snap.len().min(8)]
                            )),
                            Some(loc) if loc.kind == BlobKind::Delta => {
                                let base = loc.base.and_then(|b| repo.index().get(&b));
                                if !base.is_some_and(|b| b.kind == BlobKind::Data) {
                                    r.errors.push(format!(
                                        "blob {id}: its delta base is missing or not whole"
                                    ));
                                }
                            }
                            Some(_) => {}
                        }
                    }
                }
                NodeKind::Symlink { .. } => {}
            }
        }
    }

    if read_data > 0.0 {
        for (name, _) in repo.index().packs() {
            let pick = u64::from_str_radix(&name[..name.len().min(8)], 16).unwrap_or(0);
            if read_data < 1.0 && (pick as f64) >= read_data * u32::MAX as f64 {
                continue;
            }
            r.packs_read += 1;
            read_pack(repo, name, &seen, &mut r.errors);
        }
    }
    Ok(r)
}

/// Reads one pack whole: its name is its hash, its trailer and frames open, and every blob
/// matches its id. A delta no snapshot uses (`used`) whose base prune has already removed is
/// garbage the next repack drops, not damage.
fn read_pack(repo: &Repository, name: &str, used: &HashSet<BlobId>, errors: &mut Vec<String>) {
    let bytes = match repo.backend().get(ObjectKind::Pack, name) {
        Ok(b) => b,
        Err(e) => {
            errors.push(format!("pack {name}: {e}"));
            return;
        }
    };
    if blake3::hash(&bytes).to_hex().as_str() != name {
        errors.push(format!(
            "pack {name}: its bytes do not match its name (damaged)"
        ));
    }
    let what = format!("pack {name}");
    let trailer = match read_trailer(repo.key(), &bytes, &what) {
        Ok(t) => t,
        Err(e) => {
            errors.push(e);
            return;
        }
    };
    let mut frames = Vec::new();
    for f in &trailer.frames {
        let sealed = bytes.get(f.offset as usize..f.offset as usize + f.length as usize);
        let opened = sealed
            .ok_or_else(|| format!("{what}: a frame past its end"))
            .and_then(|s| {
                open_frame(
                    repo.key(),
                    s,
                    f.raw_length,
                    &format!("{what}, frame at {}", f.offset),
                )
            });
        match opened {
            Ok(p) => frames.push(Some(p)),
            Err(e) => {
                errors.push(e);
                frames.push(None);
            }
        }
    }
    for b in &trailer.blobs {
        let Some(Some(frame)) = frames.get(b.frame as usize) else {
            continue;
        };
        let Some(bytes) = frame.get(b.offset as usize..b.offset as usize + b.length as usize)
        else {
            errors.push(format!("{what}: blob {} past its frame", b.id));
            continue;
        };
        let rebuilt = match b.kind.base_kind() {
            None => Ok(bytes.to_vec()),
            Some(_) => match b.base.map(|base| repo.read_blob(&base)) {
                Some(Ok(base)) => decode_delta(&base, bytes, repo.delta_limit(b.kind)),
                Some(Err(RepoError::MissingBlob(_))) if !used.contains(&b.id) => continue,
                Some(Err(e)) => Err(format!("its base: {e}")),
                None => Err("no base".to_string()),
            },
        };
        match rebuilt {
            Ok(data) if repo.id_of(&data) == b.id => {}
            Ok(_) => errors.push(format!(
                "{what}: blob {} does not match its id (damaged)",
                b.id
            )),
            Err(e) => errors.push(format!("{what}: blob {}: {e}", b.id)),
        }
    }
}
