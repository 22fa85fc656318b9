//! `forget` and `prune`: dropping snapshots by a keep policy, then the blobs no snapshot needs,
//! while backups keep running.
//!
//! **Mark**: every tree and chunk a snapshot names is live, and so is the base of every live
//! delta. **Sweep**, in two phases: a pack with nothing live is not deleted but *marked* (its
//! blobs stay readable and are offered to no backup); a pack whose live share is below
//! `repack_below` has its live blobs copied into new packs and is marked too. A later prune
//! deletes a marked pack once its mark is older than `keep_delete` and every running backup
//! works from an index that already had the mark; if a snapshot uses it again, it is
//! unmarked. Prune writes new packs (each with its index file), then one index file of the
//! next generation for every pack it read, marks included, then deletes the index files it
//! read (never ones written since), then the packs it deletes: a prune killed at any moment
//! loses nothing. `crates/repo/FORMAT.md` ("Prune and running backups") has the argument.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use crate::backend::ObjectKind;
use crate::blob::{BlobId, BlobKind};
use crate::index::{IndexFile, PackRecord, PendingPack, INDEX_VERSION};
use crate::repository::{
    generation_name, name_generation, now_ns, LockInfo, RepoError, Repository, Result,
};
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

/// How a prune runs.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Packs with a smaller live share are rewritten (0.0: never repack).
    pub repack_below: f64,
    /// A marked pack is deleted only once marked this long ago. Zero: a second pass in the
    /// same run deletes what the first marked, unless a running backup may use it.
    pub keep_delete: Duration,
    /// Count only.
    pub dry_run: bool,
}

/// The default of `keep_delete`.
pub const KEEP_DELETE: Duration = Duration::from_secs(3600);

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            repack_below: 0.5,
            keep_delete: KEEP_DELETE,
            dry_run: false,
        }
    }
}

/// What a prune did (or, dry, would do).
#[derive(Debug, Clone, Default)]
pub struct PruneReport {
    /// Blobs some snapshot needs.
    pub blobs_live: u64,
    /// Blobs no snapshot needs.
    pub blobs_unused: u64,
    /// Marked packs deleted.
    pub packs_deleted: u64,
    /// Packs whose live blobs were copied into new packs (then marked).
    pub packs_repacked: u64,
    /// Packs in no index (left by an interrupted backup or prune, or being written), marked.
    pub packs_unindexed: u64,
    /// Packs newly marked for deletion (the repacked and unindexed ones included).
    pub packs_marked: u64,
    /// Marked packs a snapshot uses again: unmarked.
    pub packs_recovered: u64,
    /// Packs left marked, to be deleted by a later prune.
    pub packs_pending: u64,
    /// Bytes of packs deleted.
    pub bytes_freed: u64,
    /// Bytes of new packs written.
    pub bytes_written: u64,
}

/// Every blob the snapshots need: their trees, chunks and the bases of their deltas.
pub fn live_blobs(repo: &Repository) -> Result<HashSet<BlobId>> {
    live_blobs_of(repo, &repo.snapshots()?)
}

/// Every blob `snapshots` need (the index must have been read after they were listed).
fn live_blobs_of(repo: &Repository, snapshots: &[(String, Snapshot)]) -> Result<HashSet<BlobId>> {
    let mut live = HashSet::new();
    let mut trees: Vec<BlobId> = snapshots.iter().map(|(_, s)| s.tree).collect();
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
        if repo.index().get(id).is_none() {
            return Err(RepoError::MissingBlob(*id));
        }
    }
    Ok(live)
}

/// Removes what no snapshot needs, with no grace period: marks, then deletes in a second
/// pass what no running backup may use. `repack_below`: packs with a smaller live share are
/// rewritten (0.0: never repack). `dry_run`: count only.
pub fn prune(repo: &mut Repository, repack_below: f64, dry_run: bool) -> Result<PruneReport> {
    prune_with(
        repo,
        &PruneOptions {
            repack_below,
            keep_delete: Duration::ZERO,
            dry_run,
        },
    )
}

/// Removes what no snapshot needs (see the module's documentation). Backups may run
/// meanwhile; another prune may not (it is refused).
pub fn prune_with(repo: &mut Repository, opts: &PruneOptions) -> Result<PruneReport> {
    let host = crate::backup::hostname();
    let own = if opts.dry_run {
        None
    } else {
        Some(prune_lock(repo, &host)?)
    };
    let result = (|| {
        let mut report = pass(repo, opts, own.as_deref(), &host)?;
        if opts.keep_delete.is_zero() && !opts.dry_run && report.packs_marked > 0 {
            let second = pass(repo, opts, own.as_deref(), &host)?;
            report.packs_deleted += second.packs_deleted;
            report.packs_marked += second.packs_marked;
            report.packs_recovered += second.packs_recovered;
            report.packs_pending = second.packs_pending;
            report.bytes_freed += second.bytes_freed;
            report.bytes_written += second.bytes_written;
        }
        Ok(report)
    })();
    if let Some(name) = own {
        let _ = repo.backend().delete(ObjectKind::Lock, &name);
    }
    result
}

/// Takes the prune lock: refused while another prune holds a live one.
fn prune_lock(repo: &Repository, host: &str) -> Result<String> {
    let info = LockInfo {
        host: host.to_string(),
        pid: std::process::id(),
        time_ns: now_ns(),
        index_gen: Some(repo.index_generation()),
        prune: true,
    };
    let name = repo.write_lock(&info)?;
    for (other, lock) in repo.locks()? {
        if other != name && lock.prune && lock.live(host) {
            let _ = repo.backend().delete(ObjectKind::Lock, &name);
            return Err(RepoError::Invalid(format!(
                "another prune is running (host {}, process {}, since {}); run this one when \
                 it has finished",
                lock.host,
                lock.pid,
                crate::time::rfc3339(lock.time_ns.div_euclid(1_000_000_000))
            )));
        }
    }
    Ok(name)
}

/// What becomes of a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Keep,
    Repack,
    Mark,
    Wait,
    Delete,
}

/// One prune pass: marks, unmarks, repacks, deletes what is due, writes the next generation.
fn pass(
    repo: &mut Repository,
    opts: &PruneOptions,
    own: Option<&str>,
    host: &str,
) -> Result<PruneReport> {
    // The oldest index generation a running backup works from. Locks are listed before the
    // snapshots: a backup not seen running here has stored its snapshot (listed below), or
    // had not taken its lock, and then it reads a newer index (`Repository::lock`).
    let mut oldest = u64::MAX;
    for (name, lock) in repo.locks()? {
        if Some(name.as_str()) == own {
            continue;
        }
        if lock.live(host) {
            if !lock.prune {
                oldest = oldest.min(lock.index_gen.unwrap_or(0));
            }
        } else if !opts.dry_run {
            repo.backend().delete(ObjectKind::Lock, &name)?;
        }
    }
    // The snapshots, then the index: a snapshot is stored after the index files it needs.
    let snapshots = repo.snapshots()?;
    let listed: HashSet<String> = repo
        .backend()
        .list(ObjectKind::Index)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    if listed != repo.index_files().iter().cloned().collect() {
        repo.load_index()?;
    }
    let live = live_blobs_of(repo, &snapshots)?;

    let mut records: HashMap<String, PackRecord> = HashMap::new();
    for name in repo.index_files().to_vec() {
        for p in repo.read_index_file(&name)?.packs {
            records.entry(p.name.clone()).or_insert(p);
        }
    }

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
    let now = now_ns();
    let generation = repo.index_generation() + 1;
    let grace = i64::try_from(opts.keep_delete.as_nanos()).unwrap_or(i64::MAX);
    let due = |p: &PendingPack| now.saturating_sub(p.marked_ns) >= grace && oldest >= p.generation;
    let pending = repo.pending_packs().clone();
    let mut fates: BTreeMap<String, (Fate, u64, Option<u32>)> = BTreeMap::new();
    for (no, (name, size)) in repo.index().packs().enumerate() {
        let no = no as u32;
        let (live_bytes, all_bytes) = per_pack.get(&no).copied().unwrap_or((0, 0));
        let fate = match pending.get(name) {
            Some(_) if live_bytes > 0 => {
                report.packs_recovered += 1;
                Fate::Keep
            }
            Some(p) if due(p) => Fate::Delete,
            Some(_) => Fate::Wait,
            None if live_bytes == 0 => Fate::Mark,
            None if (live_bytes as f64) < opts.repack_below * all_bytes as f64 => Fate::Repack,
            None => Fate::Keep,
        };
        fates.insert(name.to_string(), (fate, size, Some(no)));
    }
    for (name, size) in repo.backend().list(ObjectKind::Pack)? {
        if fates.contains_key(&name) {
            continue;
        }
        let fate = match pending.get(&name) {
            Some(p) if due(p) => Fate::Delete,
            Some(_) => Fate::Wait,
            None => {
                report.packs_unindexed += 1;
                Fate::Mark
            }
        };
        fates.insert(name, (fate, size, None));
    }

    // A pack that stays keeps the bases of its deltas, live or not, so that every pack in
    // the index can be read whole (`check --read-data`).
    loop {
        let mut spared = Vec::new();
        for (name, (fate, _, _)) in &fates {
            if *fate == Fate::Delete {
                continue;
            }
            let Some(record) = records.get(name) else {
                continue;
            };
            for b in &record.contents.blobs {
                let Some(base) = b.base.and_then(|base| repo.index().get(&base)) else {
                    continue;
                };
                let base_pack = repo.index().pack(base.pack).0;
                if fates.get(base_pack).is_some_and(|f| f.0 == Fate::Delete) {
                    spared.push(base_pack.to_string());
                }
            }
        }
        if spared.is_empty() {
            break;
        }
        for name in spared {
            if let Some(f) = fates.get_mut(&name) {
                f.0 = Fate::Wait;
            }
        }
    }
    for (fate, size, _) in fates.values() {
        match fate {
            Fate::Delete => {
                report.packs_deleted += 1;
                report.bytes_freed += size;
            }
            Fate::Repack => {
                report.packs_repacked += 1;
                report.packs_marked += 1;
            }
            Fate::Mark => report.packs_marked += 1,
            Fate::Wait => report.packs_pending += 1,
            Fate::Keep => {}
        }
    }
    report.packs_pending += report.packs_marked;
    if opts.dry_run {
        return Ok(report);
    }

    // 1. Live blobs of the packs to repack, into new packs (each stored with its index file).
    let repack: HashSet<u32> = fates
        .values()
        .filter(|f| f.0 == Fate::Repack)
        .filter_map(|f| f.2)
        .collect();
    let mut to_copy: Vec<(BlobId, crate::index::Location)> = repo
        .index()
        .blobs()
        .filter(|(id, loc)| repack.contains(&loc.pack) && live.contains(*id))
        .map(|(id, loc)| (*id, *loc))
        .collect();
    to_copy.sort_by_key(|(_, l)| (l.pack, l.frame.offset, l.offset));
    let mut features: HashMap<BlobId, Vec<u64>> = HashMap::new();
    for no in &repack {
        if let Some(r) = records.get(repo.index().pack(*no).0) {
            for b in &r.contents.blobs {
                if b.kind == BlobKind::Data && !b.features.is_empty() {
                    features.insert(b.id, b.features.clone());
                }
            }
        }
    }
    let mut builder = repo.pack_builder();
    for (id, loc) in to_copy {
        let bytes = repo.raw_blob(&loc)?;
        let f = features.get(&id).cloned().unwrap_or_default();
        repo.add_blob(&mut builder, id, loc.kind, &bytes, loc.base, f);
        if builder.size() >= repo.config().pack_size {
            let b = std::mem::replace(&mut builder, repo.pack_builder());
            if let Some((_, added)) = repo.store_pack(b)? {
                report.bytes_written += added;
            }
        }
    }
    if let Some((_, added)) = repo.store_pack(builder)? {
        report.bytes_written += added;
    }

    // 2. The next generation: one index file for every pack read and not deleted, with the
    //    marks; then the index files read (not those written since) go, then the packs.
    let mut file = IndexFile {
        version: INDEX_VERSION,
        generation,
        ..IndexFile::default()
    };
    for (name, (fate, _, _)) in &fates {
        let mark = match fate {
            Fate::Delete => continue,
            Fate::Keep => None,
            Fate::Wait => pending.get(name).cloned(),
            Fate::Mark | Fate::Repack => Some(PendingPack {
                name: name.clone(),
                marked_ns: now,
                generation,
            }),
        };
        if let Some(r) = records.remove(name) {
            file.packs.push(r);
        }
        file.pending.extend(mark);
    }
    let json = serde_json::to_vec(&file).expect("serializable");
    let sealed = repo
        .key()
        .seal(&zstd::bulk::compress(&json, 3).expect("zstd compresses"));
    repo.backend()
        .put_new(ObjectKind::Index, &generation_name(generation), &sealed)?;
    let mut old: Vec<&String> = repo.index_files().iter().collect();
    old.sort_by_key(|n| (name_generation(n), n.as_str()));
    for name in old {
        repo.backend().delete(ObjectKind::Index, name)?;
    }
    for (name, (fate, _, _)) in &fates {
        if *fate == Fate::Delete {
            repo.backend().delete(ObjectKind::Pack, name)?;
        }
    }
    repo.load_index()?;
    Ok(report)
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
    fn frozen_index_file_vector() {
        let file = IndexFile {
            version: INDEX_VERSION,
            packs: Vec::new(),
            generation: 3,
            pending: vec![PendingPack {
                name: "ab".to_string(),
                marked_ns: 5,
                generation: 2,
            }],
        };
        let json = r#"{"version":1,"packs":[],"generation":3,"pending":[{"name":"ab","marked_ns":5,"generation":2}]}"#;
        assert_eq!(serde_json::to_string(&file).unwrap(), json);
        assert_eq!(serde_json::from_str::<IndexFile>(json).unwrap(), file);
        let backup = r#"{"version":1,"packs":[]}"#;
        let old: IndexFile = serde_json::from_str(backup).unwrap();
        assert_eq!((old.generation, old.pending.len()), (0, 0));
        assert_eq!(serde_json::to_string(&old).unwrap(), backup);
    }

    #[test]
    fn frozen_lock_vector() {
        let lock = LockInfo {
            host: "vm".to_string(),
            pid: 7,
            time_ns: 9,
            index_gen: Some(3),
            prune: true,
        };
        let json = r#"{"host":"vm","pid":7,"time_ns":9,"index_gen":3,"prune":true}"#;
        assert_eq!(serde_json::to_string(&lock).unwrap(), json);
        assert_eq!(serde_json::from_str::<LockInfo>(json).unwrap(), lock);
        let old: LockInfo = serde_json::from_str(r#"{"host":"vm","pid":7,"time_ns":9}"#).unwrap();
        assert_eq!((old.index_gen, old.prune), (None, false));
        assert_eq!(name_generation(&generation_name(12)), 12);
        assert_eq!(name_generation(&"0a".repeat(16)), 0);
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
