//! forget and prune on a real repository: what is kept restores bit-exact afterwards, what
//! was forgotten frees space, deltas keep their bases, and prune stays away while a backup runs.

use std::fs;
use std::path::Path;

use dedupwire_repo::backup::{backup, BackupOptions};
use dedupwire_repo::check::check;
use dedupwire_repo::prune::{forget, plan_forget, prune, KeepPolicy};
use dedupwire_repo::restore::restore;
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
    let report = prune(&mut repo, 0.5, false).unwrap();
    assert_eq!(report.bytes_freed, dry.bytes_freed);
    assert!(
        report.packs_deleted + report.packs_repacked > 0,
        "{report:?}"
    );
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

#[test]
fn prune_waits_for_a_running_backup() {
    let t = tempfile::tempdir().unwrap();
    let backend = LocalBackend::create(t.path()).unwrap();
    let mut repo =
        Repository::init(Box::new(backend), b"pw", KdfParams::TEST, Config::default()).unwrap();
    let host = dedupwire_repo::backup::hostname();
    let (name, _) = repo.lock(&host).unwrap();
    let e = prune(&mut repo, 0.5, false).err().unwrap().to_string();
    assert!(e.contains("a backup is running"), "{e}");
    repo.unlock(&name).unwrap();
    prune(&mut repo, 0.5, false).unwrap();
    // A lock left by a process that is gone is stale: prune removes it.
    let (stale, _) = repo.lock("another-host-long-ago").unwrap();
    let _ = stale;
    assert!(
        prune(&mut repo, 0.5, false).is_err(),
        "a fresh lock of another host counts"
    );
    assert_eq!(repo.backend().list(ObjectKind::Lock).unwrap().len(), 1);
}
