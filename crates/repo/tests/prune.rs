//! forget and prune on a real repository: what is kept restores bit-exact afterwards, what
//! was forgotten frees space, deltas keep their bases, and a prune beside a running backup
//! deletes nothing the backup may still use.

use std::fs;
use std::path::Path;

use dedupwire_repo::backup::{backup, BackupOptions};
use dedupwire_repo::check::check;
use dedupwire_repo::prune::{forget, plan_forget, prune, prune_with, KeepPolicy, PruneOptions};
use dedupwire_repo::repository::{now_ns, LockInfo};
use dedupwire_repo::restore::restore;
use dedupwire_repo::tree::NodeKind;
use dedupwire_repo::{Config, KdfParams, LocalBackend, ObjectKind, Repository};

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn repo_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let md = e.metadata().unwrap();
            if md.is_dir() {
                stack.push(e.path());
            } else {
                total += md.len();
            }
        }
    }
    total
}

#[test]
fn forget_then_prune_frees_space_and_what_is_kept_restores_exactly() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_dir) = (t.path().join("src"), t.path().join("repo"));
    fs::create_dir_all(&src).unwrap();
    let backend = LocalBackend::create(&repo_dir).unwrap();
    let config = Config {
        pack_size: 4 << 20,
        ..Config::default()
    };
    let mut repo = Repository::init(Box::new(backend), b"pw", KdfParams::TEST, config).unwrap();
    let opts = BackupOptions {
        paths: vec![src.clone()],
        ..BackupOptions::default()
    };
    let base = noise(7, 3 << 19);
    let mut versions = Vec::new();
    for v in 0..5u64 {
        // A big file that is new each time (its packs become unused once forgotten), and one
        // that changes a little (deltas against the first version's chunks).
        fs::write(src.join("big"), noise(100 + v, 5 << 19)).unwrap();
        let mut edited = base.clone();
        let len = edited.len();
        for k in 0..20 {
            edited[(k * 150_000 + v as usize * 13) % len] ^= 0x5a;
        }
        fs::write(src.join("edited"), &edited).unwrap();
        let r = backup(&mut repo, &opts, &mut |_| {}).unwrap();
        versions.push((r.id, noise(100 + v, 5 << 19), edited));
    }
    let before = repo_bytes(&repo_dir);
    let all = repo.snapshots().unwrap();
    let (keep, gone) = plan_forget(
        &all,
        &KeepPolicy {
            last: 2,
            ..KeepPolicy::default()
        },
    );
    assert_eq!(gone.len(), 3);
    forget(&repo, &gone).unwrap();
    let forgotten = repo_bytes(&repo_dir);
    let dry = prune(&mut repo, 0.5, true).unwrap();
    assert_eq!(
        repo_bytes(&repo_dir),
        forgotten,
        "a dry run changes nothing"
    );
    assert!(dry.packs_marked > 0 && dry.packs_deleted == 0, "{dry:?}");
    let report = prune(&mut repo, 0.5, false).unwrap();
    assert_eq!(report.packs_marked, dry.packs_marked, "{report:?}");
    assert_eq!(report.packs_deleted, report.packs_marked, "{report:?}");
    assert!(report.packs_repacked > 0, "{report:?}");
    let after = repo_bytes(&repo_dir);
    assert!(
        after < before * 2 / 3,
        "{before} -> {after} bytes: {report:?}"
    );

    let repo = Repository::open(Box::new(LocalBackend::open(&repo_dir).unwrap()), b"pw").unwrap();
    let r = check(&repo, 1.0).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.unindexed_packs, 0);
    for (id, big, edited) in &versions {
        let found = repo.find_snapshot(id);
        if !keep.contains(id) {
            assert!(found.is_err(), "forgotten {id} is still there");
            continue;
        }
        let (_, snap) = found.unwrap();
        let out = t.path().join(format!("out-{}", &id[..8]));
        let rep = restore(&repo, &snap.tree, &out, &[], &mut |_| {}).unwrap();
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        let dir = out.join(src.strip_prefix("/").unwrap());
        assert_eq!(&fs::read(dir.join("big")).unwrap(), big);
        assert_eq!(&fs::read(dir.join("edited")).unwrap(), edited);
    }
}

fn tree_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// A backup that read the index before a prune marked packs keeps deduplicating against them:
/// while it runs (its lock names the older index) they are not deleted, and once its
/// snapshot names them they are unmarked. A backup that reads the index after the mark is not
/// offered them. Prunes exclude each other.
#[test]
fn prune_runs_beside_a_running_backup_and_deletes_nothing_it_still_uses() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_dir) = (t.path().join("src"), t.path().join("repo"));
    fs::create_dir_all(&src).unwrap();
    let backend = LocalBackend::create(&repo_dir).unwrap();
    let mut repo =
        Repository::init(Box::new(backend), b"pw", KdfParams::TEST, Config::default()).unwrap();
    let open =
        || Repository::open(Box::new(LocalBackend::open(&repo_dir).unwrap()), b"pw").unwrap();
    let opts = BackupOptions {
        paths: vec![src.clone()],
        ..BackupOptions::default()
    };
    let (a, b) = (noise(1, 1 << 20), noise(2, 1 << 20));
    fs::write(src.join("f"), &a).unwrap();
    let first = backup(&mut repo, &opts, &mut |_| {}).unwrap();
    fs::write(src.join("f"), &b).unwrap();
    let second = backup(&mut repo, &opts, &mut |_| {}).unwrap();
    forget(&repo, std::slice::from_ref(&first.id)).unwrap();
    let packs = |r: &Repository| -> std::collections::HashSet<String> {
        let listed = r.backend().list(ObjectKind::Pack).unwrap();
        listed.into_iter().map(|(n, _)| n).collect()
    };

    // A backup under way: it read the index (A's pack unmarked) and holds its lock.
    let mut running = open();
    let host = dedupwire_repo::backup::hostname();
    let (held, _) = running.lock(&host).unwrap();
    let before = packs(&repo);
    let r = prune(&mut repo, 0.5, false).unwrap();
    assert!(r.packs_marked >= 1 && r.packs_deleted == 0, "{r:?}");
    assert!(
        packs(&repo).is_superset(&before),
        "a pack the running backup may use was deleted: {r:?}"
    );

    // A backup that starts now is not offered the marked blobs (they stay readable).
    let fresh = open();
    let NodeKind::Dir { subtree } = repo.read_tree(&first.snapshot.tree).unwrap().nodes[0].kind
    else {
        panic!("a directory");
    };
    let NodeKind::File { content, .. } = &repo.read_tree(&subtree).unwrap().nodes[0].kind else {
        panic!("a file");
    };
    for id in content {
        assert!(!fresh.index().contains(id) && fresh.index().get(id).is_some());
        assert!(running.index().contains(id));
    }

    // The running backup deduplicates A against the marked pack.
    fs::write(src.join("f"), &a).unwrap();
    let third = backup(&mut running, &opts, &mut |_| {}).unwrap();
    assert!(third.snapshot.summary.chunks_duplicate > 0);
    assert_eq!(third.snapshot.summary.chunks_whole, 0);
    let r = prune(&mut repo, 0.5, false).unwrap();
    assert!(r.packs_recovered >= 1 && r.packs_deleted == 0, "{r:?}");
    running.unlock(&held).unwrap();
    let r = prune(&mut repo, 0.5, false).unwrap();
    assert_eq!(r.packs_recovered, 0, "{r:?}");

    // Another prune running: refused; a lock of a process that is gone: removed.
    let lock = |pid: u32, prune: bool| LockInfo {
        host: host.clone(),
        pid,
        time_ns: now_ns(),
        index_gen: Some(0),
        prune,
    };
    let other_prune = repo.write_lock(&lock(std::process::id(), true)).unwrap();
    let e = prune(&mut repo, 0.5, false).err().unwrap().to_string();
    assert!(e.contains("another prune is running"), "{e}");
    repo.backend()
        .delete(ObjectKind::Lock, &other_prune)
        .unwrap();
    repo.write_lock(&lock(u32::MAX, false)).unwrap();
    prune(&mut repo, 0.5, false).unwrap();
    assert!(repo.backend().list(ObjectKind::Lock).unwrap().is_empty());

    let repo = open();
    let c = check(&repo, 1.0).unwrap();
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    for (id, want) in [(&second.id, &b), (&third.id, &a)] {
        let (_, snap) = repo.find_snapshot(id).unwrap();
        let out = t.path().join(format!("out-{}", &id[..8]));
        let rep = restore(&repo, &snap.tree, &out, &[], &mut |_| {}).unwrap();
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        let got = tree_of(&out.join(src.strip_prefix("/").unwrap()));
        assert_eq!(got, vec![("f".to_string(), want.clone())]);
    }
}

/// With a grace period, a marked pack waits; prune_with deletes it once the mark is old enough.
#[test]
fn marked_packs_wait_for_the_grace_period() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_dir) = (t.path().join("src"), t.path().join("repo"));
    fs::create_dir_all(&src).unwrap();
    let backend = LocalBackend::create(&repo_dir).unwrap();
    let mut repo =
        Repository::init(Box::new(backend), b"pw", KdfParams::TEST, Config::default()).unwrap();
    let opts = BackupOptions {
        paths: vec![src.clone()],
        ..BackupOptions::default()
    };
    fs::write(src.join("f"), noise(3, 300_000)).unwrap();
    let first = backup(&mut repo, &opts, &mut |_| {}).unwrap();
    fs::write(src.join("f"), noise(4, 300_000)).unwrap();
    backup(&mut repo, &opts, &mut |_| {}).unwrap();
    forget(&repo, &[first.id]).unwrap();
    let hour = PruneOptions::default();
    let r = prune_with(&mut repo, &hour).unwrap();
    let marked = r.packs_marked;
    assert!(marked >= 1 && r.packs_deleted == 0, "{r:?}");
    let r = prune_with(&mut repo, &hour).unwrap();
    assert!(r.packs_pending == marked && r.packs_deleted == 0, "{r:?}");
    let now = PruneOptions {
        keep_delete: std::time::Duration::ZERO,
        ..PruneOptions::default()
    };
    let r = prune_with(&mut repo, &now).unwrap();
    assert!(r.packs_deleted == marked && r.packs_pending == 0, "{r:?}");
    let c = check(&repo, 1.0).unwrap();
    assert!(c.errors.is_empty() && c.unindexed_packs == 0, "{c:?}");
}
