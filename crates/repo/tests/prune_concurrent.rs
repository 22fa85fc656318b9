//! Two backups and a prune at once, with random timing, many rounds: the backups run on
//! changing trees whose contents recur (so they deduplicate against blobs a prune has just
//! found unused), the prune forgets old snapshots and deletes with no grace period. Then
//! `check --read-data` is clean and every remaining snapshot restores bit-exact against the
//! tree recorded when it was taken. `DEDUPWIRE_STRESS_SECONDS` (default 20) and
//! `DEDUPWIRE_STRESS_SEED` change the run.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedupwire_repo::backup::{backup, BackupOptions};
use dedupwire_repo::check::check;
use dedupwire_repo::prune::{forget, plan_forget, prune_with, KeepPolicy, PruneOptions};
use dedupwire_repo::restore::restore;
use dedupwire_repo::{Config, KdfParams, LocalBackend, Repository};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&r.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// One of a small pool of contents (so that contents come back after being forgotten), some
/// of them a few bytes away from another (so that they are stored as deltas).
fn content(rng: &mut Rng) -> Vec<u8> {
    let seed = rng.below(24);
    let mut bytes = noise(seed, 40_000 + (seed as usize % 5) * 20_000);
    if rng.below(3) == 0 {
        let len = bytes.len();
        for k in 0..4 {
            bytes[(k * 9_973 + rng.below(50) as usize) % len] ^= 0x5a;
        }
    }
    bytes
}

type Files = Vec<(String, Vec<u8>)>;

fn files_of(dir: &Path) -> Files {
    let mut out: Files = fs::read_dir(dir)
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

fn open(dir: &Path) -> Repository {
    Repository::open(Box::new(LocalBackend::open(dir).unwrap()), b"pw").unwrap()
}

fn sleep_ms(rng: &mut Rng, max: u64) {
    std::thread::sleep(Duration::from_millis(rng.below(max + 1)));
}

#[test]
fn two_backups_and_a_prune_at_once_lose_nothing() {
    let seconds: u64 = std::env::var("DEDUPWIRE_STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("DEDUPWIRE_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (DEDUPWIRE_STRESS_SEED), {seconds} s");
    let t = tempfile::tempdir().unwrap();
    let repo_dir = t.path().join("repo");
    let config = Config {
        pack_size: 4 << 20,
        ..Config::default()
    };
    Repository::init(
        Box::new(LocalBackend::create(&repo_dir).unwrap()),
        b"pw",
        KdfParams::TEST,
        config,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let taken: Arc<Mutex<HashMap<String, (PathBuf, Files)>>> = Arc::default();

    let backups: Vec<_> = ["a", "b"]
        .into_iter()
        .enumerate()
        .map(|(n, host)| {
            let (repo_dir, taken) = (repo_dir.clone(), taken.clone());
            let src = t.path().join(format!("src-{host}"));
            std::thread::spawn(move || {
                let mut rng = Rng(seed.wrapping_add(n as u64 + 1) | 1);
                fs::create_dir_all(&src).unwrap();
                let opts = BackupOptions {
                    paths: vec![src.clone()],
                    host: Some(host.to_string()),
                    ..BackupOptions::default()
                };
                let mut repo = open(&repo_dir);
                let mut rounds = 0;
                while Instant::now() < deadline {
                    for f in 0..6 {
                        if rounds == 0 || rng.below(3) == 0 {
                            fs::write(src.join(format!("f{f}")), content(&mut rng)).unwrap();
                        }
                    }
                    let want = files_of(&src);
                    if rng.below(2) == 0 {
                        repo = open(&repo_dir);
                    }
                    let r = backup(&mut repo, &opts, &mut |_| {})
                        .unwrap_or_else(|e| panic!("backup {host}, round {rounds}: {e}"));
                    taken.lock().unwrap().insert(r.id, (src.clone(), want));
                    rounds += 1;
                    sleep_ms(&mut rng, 30);
                }
                rounds
            })
        })
        .collect();

    let pruner = {
        let repo_dir = repo_dir.clone();
        std::thread::spawn(move || {
            let mut rng = Rng(seed.wrapping_add(7) | 1);
            let (mut runs, mut deleted, mut recovered) = (0, 0, 0);
            while Instant::now() < deadline {
                sleep_ms(&mut rng, 60);
                let mut repo = open(&repo_dir);
                let all = repo.snapshots().unwrap();
                let policy = KeepPolicy {
                    last: 1 + rng.below(2) as usize,
                    ..KeepPolicy::default()
                };
                let (_, gone) = plan_forget(&all, &policy);
                forget(&repo, &gone).unwrap();
                let opts = PruneOptions {
                    repack_below: [0.0, 0.5, 1.0][rng.below(3) as usize],
                    keep_delete: Duration::ZERO,
                    dry_run: false,
                };
                let r =
                    prune_with(&mut repo, &opts).unwrap_or_else(|e| panic!("prune {runs}: {e}"));
                deleted += r.packs_deleted;
                recovered += r.packs_recovered;
                runs += 1;
            }
            (runs, deleted, recovered)
        })
    };

    let rounds: Vec<u64> = backups.into_iter().map(|b| b.join().unwrap()).collect();
    let (runs, deleted, recovered) = pruner.join().unwrap();
    eprintln!(
        "backups {rounds:?}, prunes {runs}: {deleted} packs deleted, {recovered} unmarked \
         (used again by a running backup)"
    );
    assert!(runs > 0 && deleted > 0, "the prune never deleted anything");

    let verify = |repo: &Repository, what: &str| {
        let c = check(repo, 1.0).unwrap();
        assert!(c.errors.is_empty(), "{what}: {:?}", c.errors);
        let taken = taken.lock().unwrap();
        let snapshots = repo.snapshots().unwrap();
        assert!(
            snapshots.len() >= 2,
            "{what}: {} snapshots",
            snapshots.len()
        );
        for (id, snap) in snapshots {
            let (src, want) = &taken[&id];
            let out = t.path().join(format!("out-{}", &id[..12]));
            let rep = restore(repo, &snap.tree, &out, &[], &mut |_| {}).unwrap();
            assert!(rep.errors.is_empty(), "{what}: {id}: {:?}", rep.errors);
            let got = files_of(&out.join(src.strip_prefix("/").unwrap()));
            assert!(
                &got == want,
                "{what}: snapshot {id} does not restore exactly"
            );
            fs::remove_dir_all(&out).unwrap();
        }
    };
    verify(&open(&repo_dir), "after the race");
    let mut repo = open(&repo_dir);
    let opts = PruneOptions {
        keep_delete: Duration::ZERO,
        ..PruneOptions::default()
    };
    prune_with(&mut repo, &opts).unwrap();
    verify(&open(&repo_dir), "after a last prune");
}
