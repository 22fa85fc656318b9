//! `forget` and `prune`: dropping snapshots by a keep policy, then the blobs no snapshot needs.
//!
//! **Mark**: every tree and chunk a snapshot names is live, and so is the base of every live
//! delta (a base lives while a delta needs it). **Sweep**: a pack with no live blob is
//! deleted; a pack whose live share is below `repack_below` has its live blobs copied into new
//! packs, then goes too. The order keeps the repository valid at every step, so a prune killed
//! at any moment loses nothing: new packs and their index first, then one index file for every
//! pack kept, then the old index files, then the unused packs (a pack in no index is harmless
//! and goes at the next prune).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::backend::ObjectKind;
use crate::blob::{BlobId, BlobKind};
use crate::index::{IndexFile, INDEX_VERSION};
use crate::repository::{random_name, RepoError, Repository, Result};
use crate::snapshot::Snapshot;
use crate::tree::NodeKind;

/// Which snapshots to keep, per group of the same host and paths.
#[derive(Debug, Clone, Default)]
pub struct KeepPolicy {
    /// The newest N.
    pub last: usize,
    /// The newest of each of the last N days that have one.
    pub daily: usize,
    /// The newest of each of the last N weeks (ISO weeks starting Monday).
    pub weekly: usize,
    /// The newest of each of the last N months.
    pub monthly: usize,
}

impl KeepPolicy {
    /// Whether the policy keeps anything at all (an empty policy would forget everything).
    pub fn is_empty(&self) -> bool {
        self.last + self.daily + self.weekly + self.monthly == 0
    }
}

/// Snapshots of one host and set of paths: a keep policy applies to each group apart.
type Group = (String, Vec<String>);

/// The snapshots `policy` keeps and those it forgets, by id, each group newest first.
pub fn plan_forget(
    snapshots: &[(String, Snapshot)],
    policy: &KeepPolicy,
) -> (Vec<String>, Vec<String>) {
    let mut groups: BTreeMap<Group, Vec<&(String, Snapshot)>> = BTreeMap::new();
    for s in snapshots {
        groups
            .entry((s.1.host.clone(), s.1.paths.clone()))
            .or_default()
            .push(s);
    }
    let (mut keep, mut forget) = (Vec::new(), Vec::new());
    for (_, mut group) in groups {
        group.sort_by_key(|s| std::cmp::Reverse(s.1.time_ns));
        let mut kept: HashSet<&str> = HashSet::new();
        for (id, _) in group.iter().take(policy.last) {
            kept.insert(id);
        }
        let day = |s: &Snapshot| s.time_ns.div_euclid(86_400 * 1_000_000_000);
        // Day 0 (1970-01-01) was a Thursday: shift by 3 so weeks start on Monday.
        let week = |s: &Snapshot| (day(s) + 3).div_euclid(7);
        let month = |s: &Snapshot| {
            let (y, m, _) = crate::time::civil(day(s));
            y * 12 + i64::from(m)
        };
        for (n, bucket) in [
            (policy.daily, &day as &dyn Fn(&Snapshot) -> i64),
            (policy.weekly, &week),
            (policy.monthly, &month),
        ] {
            let mut seen = HashSet::new();
            for (id, s) in &group {
                if seen.len() >= n {
                    break;
                }
                if seen.insert(bucket(s)) {
                    kept.insert(id);
                }
            }
        }
        for (id, _) in group {
            if kept.contains(id.as_str()) {
                keep.push(id.clone());
            } else {
                forget.push(id.clone());
            }
        }
    }
    (keep, forget)
}

/// Deletes snapshots (their packs stay until a prune).
pub fn forget(repo: &Repository, ids: &[String]) -> Result<()> {
    for id in ids {
        repo.backend().delete(ObjectKind::Snapshot, id)?;
    }
    Ok(())
}

/// What a prune did (or, dry, would do).
#[derive(Debug, Clone, Default)]
pub struct PruneReport {
    /// Blobs some snapshot needs.
    pub blobs_live: u64,
    /// Blobs no snapshot needs.
    pub blobs_unused: u64,
    /// Packs deleted whole (nothing live in them).
    pub packs_deleted: u64,
    /// Packs whose live blobs were copied into new packs, then deleted.
    pub packs_repacked: u64,
    /// Packs in no index (left by an interrupted backup or prune), deleted.
    pub packs_unindexed: u64,
    /// Bytes of packs deleted.
    pub bytes_freed: u64,
    /// Bytes of new packs written.
    pub bytes_written: u64,
}

/// Every blob the snapshots need: their trees, chunks and the bases of their deltas.
pub fn live_blobs(repo: &Repository) -> Result<HashSet<BlobId>> {
    let mut live = HashSet::new();
    let mut trees: Vec<BlobId> = repo.snapshots()?.into_iter().map(|(_, s)| s.tree).collect();
    while let Some(id) = trees.pop() {
        if !live.insert(id) {
            continue;
        }
        for node in repo.read_tree(&id)?.nodes {
            match node.kind {
                NodeKind::Dir { subtree } => trees.push(subtree),
                NodeKind::File { content, .. } => live.extend(content),
                NodeKind::Symlink { .. } => {}
            }
        }
    }
    let bases: Vec<BlobId> = live
        .iter()
        .filter_map(|id| repo.index().get(id).and_then(|l| l.base))
        .collect();
    live.extend(bases);
    for id in &live {
        if !repo.index().contains(id) {
            return Err(RepoError::MissingBlob(*id));
        }
    }
    Ok(live)
}

/// Removes what no snapshot needs. `repack_below`: packs with a smaller live share are
/// rewritten (0.0: never repack). `dry_run`: count only.
pub fn prune(repo: &mut Repository, repack_below: f64, dry_run: bool) -> Result<PruneReport> {
    let host = crate::backup::hostname();
    for (name, lock) in repo.locks()? {
        if lock.live(&host) {
            return Err(RepoError::Invalid(format!(
                "a backup is running (host {}, process {}, since {}): prune would delete what \
                 it is storing; run prune when it has finished",
                lock.host,
                lock.pid,
                crate::time::rfc3339(lock.time_ns.div_euclid(1_000_000_000))
            )));
        }
        if !dry_run {
            repo.backend().delete(ObjectKind::Lock, &name)?;
        }
    }
    let live = live_blobs(repo)?;
    let mut report = PruneReport::default();
    let mut per_pack: HashMap<u32, (u64, u64)> = HashMap::new();
    for (id, loc) in repo.index().blobs() {
        let e = per_pack.entry(loc.pack).or_default();
        e.1 += u64::from(loc.length);
        if live.contains(id) {
            report.blobs_live += 1;
            e.0 += u64::from(loc.length);
        } else {
            report.blobs_unused += 1;
        }
    }
    let packs: Vec<(u32, String, u64)> = repo
        .index()
        .packs()
        .enumerate()
        .map(|(no, (name, size))| (no as u32, name.to_string(), size))
        .collect();
    let mut delete: Vec<(String, u64)> = Vec::new();
    let mut repack: HashSet<u32> = HashSet::new();
    let mut keep: Vec<u32> = Vec::new();
    for (no, name, size) in &packs {
        let (live_bytes, all_bytes) = per_pack.get(no).copied().unwrap_or((0, 0));
        if live_bytes == 0 {
            report.packs_deleted += 1;
            delete.push((name.clone(), *size));
        } else if (live_bytes as f64) < repack_below * all_bytes as f64 {
            report.packs_repacked += 1;
            repack.insert(*no);
            delete.push((name.clone(), *size));
        } else {
            keep.push(*no);
        }
    }
    let indexed: HashSet<&str> = packs.iter().map(|(_, n, _)| n.as_str()).collect();
    let stored = repo.backend().list(ObjectKind::Pack)?;
    for (name, size) in &stored {
        if !indexed.contains(name.as_str()) {
            report.packs_unindexed += 1;
            delete.push((name.clone(), *size));
        }
    }
    report.bytes_freed = delete.iter().map(|(_, s)| s).sum();
    if dry_run {
        return Ok(report);
    }

    // 1. Live blobs of the packs to repack, into new packs (each stored with its index file).
    let mut to_copy: Vec<(BlobId, crate::index::Location)> = repo
        .index()
        .blobs()
        .filter(|(id, loc)| repack.contains(&loc.pack) && live.contains(*id))
        .map(|(id, loc)| (*id, *loc))
        .collect();
    to_copy.sort_by_key(|(_, l)| (l.pack, l.frame.offset, l.offset));
    let features = feature_map(repo, &repack)?;
    let mut builder = repo.pack_builder();
    let mut kept_names: HashSet<String> = keep
        .iter()
        .map(|no| repo.index().pack(*no).0.to_string())
        .collect();
    for (id, loc) in to_copy {
        let bytes = repo.raw_blob(&loc)?;
        let f = features.get(&id).cloned().unwrap_or_default();
        repo.add_blob(&mut builder, id, loc.kind, &bytes, loc.base, f);
        if builder.size() >= repo.config().pack_size {
            let b = std::mem::replace(&mut builder, repo.pack_builder());
            if let Some((name, added)) = repo.store_pack(b)? {
                report.bytes_written += added;
                kept_names.insert(name);
            }
        }
    }
    if let Some((name, added)) = repo.store_pack(builder)? {
        report.bytes_written += added;
        kept_names.insert(name);
    }

    // 2. One index file for every pack kept (the new ones included), then every other index
    //    file goes: the packs to delete are then in no index.
    let indexes = repo.backend().list(ObjectKind::Index)?;
    let mut file = IndexFile {
        version: INDEX_VERSION,
        packs: Vec::new(),
    };
    let mut listed: HashSet<String> = HashSet::new();
    for (name, _) in &indexes {
        for p in repo.read_index_file(name)?.packs {
            if kept_names.contains(&p.name) && listed.insert(p.name.clone()) {
                file.packs.push(p);
            }
        }
    }
    if listed.len() != kept_names.len() {
        return Err(RepoError::Damaged(format!(
            "prune: {} packs to keep are in no index file; nothing was deleted",
            kept_names.len() - listed.len()
        )));
    }
    let json = serde_json::to_vec(&file).expect("serializable");
    let sealed = repo
        .key()
        .seal(&zstd::bulk::compress(&json, 3).expect("zstd compresses"));
    repo.backend()
        .put_new(ObjectKind::Index, &random_name(), &sealed)?;
    for (name, _) in &indexes {
        repo.backend().delete(ObjectKind::Index, name)?;
    }

    // 3. The packs nothing indexes any more.
    for (name, _) in &delete {
        repo.backend().delete(ObjectKind::Pack, name)?;
    }
    repo.load_index()?;
    Ok(report)
}

/// The super-features of the whole chunks in packs about to be repacked, from the index
/// files (which hold them), so that the copies stay findable as delta bases.
fn feature_map(repo: &Repository, packs: &HashSet<u32>) -> Result<HashMap<BlobId, Vec<u64>>> {
    let names: HashSet<&str> = packs.iter().map(|&no| repo.index().pack(no).0).collect();
    let mut out = HashMap::new();
    for (index, _) in repo.backend().list(ObjectKind::Index)? {
        for p in repo.read_index_file(&index)?.packs {
            if !names.contains(p.name.as_str()) {
                continue;
            }
            for b in p.contents.blobs {
                if b.kind == BlobKind::Data && !b.features.is_empty() {
                    out.insert(b.id, b.features);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Summary, SNAPSHOT_VERSION};

    const DAY: i64 = 86_400 * 1_000_000_000;

    fn snap(id: &str, day: i64, host: &str) -> (String, Snapshot) {
        (
            id.to_string(),
            Snapshot {
                version: SNAPSHOT_VERSION,
                time_ns: day * DAY + 3_600_000_000_000,
                host: host.to_string(),
                user: String::new(),
                paths: vec!["/data".to_string()],
                tags: Vec::new(),
                tree: BlobId([0; 32]),
                parent: None,
                summary: Summary::default(),
            },
        )
    }

    fn keep_of(snaps: &[(String, Snapshot)], policy: KeepPolicy) -> Vec<String> {
        let (mut keep, forget) = plan_forget(snaps, &policy);
        assert_eq!(keep.len() + forget.len(), snaps.len());
        keep.sort();
        keep
    }

    #[test]
    fn keep_policies_pick_the_newest_per_period_and_group() {
        // Two a day on days 20000..20013 (2024-10-04 is day 20000, a Friday), host a; one on
        // day 20013 on host b.
        let mut snaps: Vec<(String, Snapshot)> = (0..14)
            .flat_map(|d| {
                [
                    snap(&format!("a{d:02}m"), 20_000 + d, "a"),
                    snap(&format!("a{d:02}n"), 20_000 + d, "a"),
                ]
            })
            .collect();
        for (i, s) in snaps.iter_mut().enumerate() {
            s.1.time_ns += i as i64;
        }
        snaps.push(snap("b13", 20_013, "b"));
        let last = KeepPolicy {
            last: 3,
            ..KeepPolicy::default()
        };
        assert_eq!(keep_of(&snaps, last), ["a12n", "a13m", "a13n", "b13"]);
        let daily = KeepPolicy {
            daily: 2,
            ..KeepPolicy::default()
        };
        assert_eq!(keep_of(&snaps, daily), ["a12n", "a13n", "b13"]);
        // Weeks start on Monday: day 20003 is a Monday.
        let weekly = KeepPolicy {
            weekly: 3,
            ..KeepPolicy::default()
        };
        assert_eq!(keep_of(&snaps, weekly), ["a02n", "a09n", "a13n", "b13"]);
        let monthly = KeepPolicy {
            monthly: 2,
            ..KeepPolicy::default()
        };
        assert_eq!(keep_of(&snaps, monthly), ["a13n", "b13"]);
        assert!(KeepPolicy::default().is_empty());
    }
}
