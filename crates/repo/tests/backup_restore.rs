//! Backup and restore through a real repository in a temporary directory: every version
//! restores bit-exact (contents, modes, mtimes, symlinks, empty directories), similar data is
//! stored as deltas, and damage is found and named, never restored as wrong bytes.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use dedupwire_repo::backup::{backup, BackupOptions};
use dedupwire_repo::check::check;
use dedupwire_repo::prune::{forget, prune};
use dedupwire_repo::restore::restore;
use dedupwire_repo::{
    BlobKind, Config, KdfParams, LocalBackend, ObjectKind, RepoError, Repository,
};

const PASSWORD: &[u8] = b"correct horse";

fn init(dir: &Path) -> Repository {
    let backend = LocalBackend::create(dir).unwrap();
    Repository::init(
        Box::new(backend),
        PASSWORD,
        KdfParams::TEST,
        Config::default(),
    )
    .unwrap()
}

fn open(dir: &Path) -> Result<Repository, RepoError> {
    Repository::open(Box::new(LocalBackend::open(dir).unwrap()), PASSWORD)
}

/// Pseudo-random bytes (xorshift), different for each seed.
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

/// A "database dump": rows of text, `changed` of them rewritten for version `v`.
fn dump(rows: usize, v: u64, changed: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..rows {
        let rev = if i % (rows / changed.max(1)).max(1) == 0 {
            v
        } else {
            0
        };
        out.extend_from_slice(
            format!(
                "INSERT INTO docs VALUES ({i}, 'user{i}@example.org', {rev}, '{}');\n",
                i * 7919 % 100_003
            )
            .as_bytes(),
        );
    }
    out
}

/// Path -> (kind, mode, mtime, contents or target) of a tree, for comparing.
fn snapshot_of(root: &Path) -> BTreeMap<PathBuf, (String, u32, i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let mtime = md.mtime() * 1_000_000_000 + md.mtime_nsec();
            let entry = if md.is_dir() {
                stack.push(p.clone());
                ("dir".to_string(), md.mode() & 0o7777, mtime, Vec::new())
            } else if md.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                (
                    "link".to_string(),
                    0,
                    mtime,
                    t.into_os_string().into_encoded_bytes(),
                )
            } else {
                (
                    "file".to_string(),
                    md.mode() & 0o7777,
                    mtime,
                    fs::read(&p).unwrap(),
                )
            };
            out.insert(rel, entry);
        }
    }
    out
}

fn options(path: &Path) -> BackupOptions {
    BackupOptions {
        paths: vec![path.to_path_buf()],
        files_cache: Some(path.parent().unwrap().join("files-cache")),
        ..BackupOptions::default()
    }
}

/// A file is taken unchanged only when the files cache says it is the very file backed up:
/// contents changed behind a restored mtime, or a file replaced by another of the same size
/// and mtime, are read again; so is everything when the cache is gone.
#[test]
fn only_the_very_file_backed_up_is_taken_unchanged() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_dir) = (t.path().join("src"), t.path().join("repo"));
    fs::create_dir_all(&src).unwrap();
    for name in ["a", "b", "c"] {
        fs::write(src.join(name), noise(name.len() as u64 + 7, 50_000)).unwrap();
    }
    let mut repo = init(&repo_dir);
    let first = backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
    let again = backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
    assert_eq!(again.snapshot.summary.files_unchanged, 3);
    assert_eq!(again.snapshot.summary.bytes_read, 0);
    assert_eq!(again.snapshot.tree, first.snapshot.tree);

    let mtime = fs::metadata(src.join("a")).unwrap().modified().unwrap();
    let mut edited = fs::read(src.join("a")).unwrap();
    edited[100] ^= 1;
    fs::write(src.join("a"), &edited).unwrap();
    fs::File::options()
        .write(true)
        .open(src.join("a"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let replaced = src.join("b.new");
    fs::write(&replaced, noise(99, 50_000)).unwrap();
    let b_mtime = fs::metadata(src.join("b")).unwrap().modified().unwrap();
    fs::File::options()
        .write(true)
        .open(&replaced)
        .unwrap()
        .set_modified(b_mtime)
        .unwrap();
    fs::rename(&replaced, src.join("b")).unwrap();
    let third = backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
    assert_eq!(
        third.snapshot.summary.files_unchanged, 1,
        "{:?}",
        third.snapshot.summary
    );
    assert_eq!(third.snapshot.summary.files_changed, 2);

    fs::remove_dir_all(t.path().join("files-cache")).unwrap();
    let fourth = backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
    assert_eq!(fourth.snapshot.summary.files_unchanged, 0);
    assert_eq!(fourth.snapshot.tree, third.snapshot.tree);
    let fifth = backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
    assert_eq!(fifth.snapshot.summary.files_unchanged, 3);

    let out = t.path().join("out");
    let (_, snap) = repo.find_snapshot(&third.id).unwrap();
    restore(&repo, &snap.tree, &out, &[], &mut |_| {}).unwrap();
    let restored = out.join(src.strip_prefix("/").unwrap());
    assert_eq!(snapshot_of(&restored), snapshot_of(&src));
}

#[test]
fn every_version_restores_exactly_and_similar_data_is_stored_as_deltas() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_dir) = (t.path().join("src"), t.path().join("repo"));
    fs::create_dir_all(src.join("empty/nested")).unwrap();
    fs::create_dir_all(src.join("db")).unwrap();
    fs::write(src.join("random.bin"), noise(1, 700_000)).unwrap();
    fs::write(src.join("db/dump.sql"), dump(20_000, 1, 200)).unwrap();
    fs::write(src.join("private"), b"mode 600").unwrap();
    fs::set_permissions(src.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(src.join("empty-file"), b"").unwrap();
    std::os::unix::fs::symlink("db/dump.sql", src.join("link")).unwrap();
    let mut repo = init(&repo_dir);

    let mut versions = Vec::new();
    let first = backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
    versions.push((first.id.clone(), snapshot_of(&src)));
    let mut added = Vec::new();
    for v in 2..=4 {
        fs::write(src.join("db/dump.sql"), dump(20_000, v, 200)).unwrap();
        let r = backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
        assert_eq!(
            r.snapshot.summary.files_unchanged, 3,
            "{:?}",
            r.snapshot.summary
        );
        assert_eq!(r.snapshot.summary.files_changed, 1);
        assert!(
            r.snapshot.summary.chunks_delta > 0,
            "{:?}",
            r.snapshot.summary
        );
        added.push(r.snapshot.summary.bytes_added);
        versions.push((r.id.clone(), snapshot_of(&src)));
    }
    let dump_size = dump(20_000, 1, 200).len() as u64;
    for a in &added {
        assert!(
            *a < dump_size / 20,
            "a changed dump added {a} bytes of {dump_size}"
        );
    }

    let repo = open(&repo_dir).unwrap();
    for (id, want) in &versions {
        let (_, snap) = repo.find_snapshot(id).unwrap();
        let out = t.path().join(format!("out-{}", &id[..8]));
        let report = restore(&repo, &snap.tree, &out, &[], &mut |_| {}).unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        let restored = out.join(src.strip_prefix("/").unwrap());
        assert_eq!(&snapshot_of(&restored), want, "snapshot {id}");
    }
    let r = check(&repo, 1.0).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.snapshots, 4);
}

#[test]
fn a_wrong_password_learns_nothing_and_says_so() {
    let t = tempfile::tempdir().unwrap();
    init(&t.path().join("repo"));
    let e = Repository::open(
        Box::new(LocalBackend::open(&t.path().join("repo")).unwrap()),
        b"wrong",
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("wrong password"), "{e}");
}

/// Flips one byte of the largest object of `kind` (for packs a data pack, not a pack of
/// listings) at `at` (from its end if negative).
fn flip(repo_dir: &Path, kind: ObjectKind, at: i64) -> String {
    let backend = LocalBackend::open(repo_dir).unwrap();
    let mut all = backend.list(kind).unwrap();
    all.sort();
    let (name, size) = all.into_iter().max_by_key(|(_, size)| *size).unwrap();
    let dir = match kind {
        ObjectKind::Pack => repo_dir.join("data").join(&name[..2]),
        ObjectKind::Index => repo_dir.join("index"),
        ObjectKind::Snapshot => repo_dir.join("snapshots"),
        ObjectKind::Key => repo_dir.join("keys"),
        _ => unreachable!(),
    };
    let path = dir.join(&name);
    let mut bytes = fs::read(&path).unwrap();
    let i = if at < 0 { size as i64 + at } else { at } as usize;
    bytes[i] ^= 0x10;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&path, bytes).unwrap();
    name
}

use dedupwire_repo::Backend;

#[test]
fn damage_is_found_named_and_never_restored_as_wrong_bytes() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_dir) = (t.path().join("src"), t.path().join("repo"));
    fs::create_dir_all(&src).unwrap();
    for i in 0..6 {
        fs::write(src.join(format!("f{i}")), noise(10 + i, 400_000)).unwrap();
    }
    let mut repo = init(&repo_dir);
    backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
    drop(repo);

    // A flipped byte in the middle of the pack: check finds it; restore names the files whose
    // frame (about 1 MiB of blobs) it damaged and restores the others exactly.
    let pack = flip(&repo_dir, ObjectKind::Pack, 1_000_000);
    let repo = open(&repo_dir).unwrap();
    let r = check(&repo, 1.0).unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains(&pack[..16])),
        "{:?}",
        r.errors
    );
    let (_, snap) = repo.find_snapshot("latest").unwrap();
    let out = t.path().join("out");
    let report = restore(&repo, &snap.tree, &out, &[], &mut |_| {}).unwrap();
    assert!(!report.errors.is_empty() && report.files >= 1, "{report:?}");
    assert_eq!(report.files + report.errors.len() as u64, 6, "{report:?}");
    let restored = out.join(src.strip_prefix("/").unwrap());
    for i in 0..6 {
        let p = restored.join(format!("f{i}"));
        if p.exists() {
            assert_eq!(
                fs::read(&p).unwrap(),
                noise(10 + i, 400_000),
                "f{i} restored wrong"
            );
        } else {
            let name = format!("f{i}: not restored");
            assert!(
                report.errors.iter().any(|e| e.contains(&name)),
                "{:?}",
                report.errors
            );
        }
    }
    drop(repo);

    // A flipped byte in an index, a snapshot, a key: clear errors naming the object.
    let index = flip(&repo_dir, ObjectKind::Index, -20);
    let e = open(&repo_dir).err().unwrap().to_string();
    assert!(e.contains(&index) && e.contains("damaged"), "{e}");
    flip(&repo_dir, ObjectKind::Index, -20);
    let snapshot = flip(&repo_dir, ObjectKind::Snapshot, -5);
    let e = open(&repo_dir)
        .unwrap()
        .snapshots()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains(&snapshot[..8]) && e.contains("damaged"), "{e}");
    flip(&repo_dir, ObjectKind::Snapshot, -5);
    flip(&repo_dir, ObjectKind::Key, 30);
    assert!(open(&repo_dir).is_err());
}

#[test]
fn a_truncated_or_missing_pack_is_found_by_check() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_dir) = (t.path().join("src"), t.path().join("repo"));
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), noise(3, 300_000)).unwrap();
    let mut repo = init(&repo_dir);
    backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
    let (name, size) = repo.backend().list(ObjectKind::Pack).unwrap()[0].clone();
    let path = repo_dir.join("data").join(&name[..2]).join(&name);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(size / 2).unwrap();
    let r = check(&repo, 0.0).unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains("truncated")),
        "{:?}",
        r.errors
    );
    fs::remove_file(&path).unwrap();
    let r = check(&repo, 0.0).unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains("missing")),
        "{:?}",
        r.errors
    );
}

/// A directory whose listing changes a little from one backup to the next is stored as a
/// delta against its last whole listing; every version restores exactly, check reads it all
/// back, and forgetting the snapshot that holds the whole listing keeps it alive for the rest.
#[test]
fn trees_that_change_a_little_are_stored_as_deltas() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_dir) = (t.path().join("src"), t.path().join("repo"));
    fs::create_dir_all(&src).unwrap();
    for i in 0..300 {
        fs::write(src.join(format!("file-{i:04}")), format!("file {i}")).unwrap();
    }
    let mut repo = init(&repo_dir);
    let mut versions = Vec::new();
    for v in 0..4 {
        fs::write(
            src.join(format!("file-{:04}", v * 7)),
            format!("version {v}"),
        )
        .unwrap();
        let r = backup(&mut repo, &options(&src), &mut |_| {}).unwrap();
        versions.push((r.id, snapshot_of(&src)));
    }
    let tree_deltas = repo
        .index()
        .blobs()
        .filter(|(_, l)| l.kind == BlobKind::TreeDelta)
        .count();
    assert!(tree_deltas >= 3, "{tree_deltas} tree deltas");
    let r = check(&repo, 1.0).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);

    forget(&repo, &[versions[0].0.clone()]).unwrap();
    prune(&mut repo, 1.0, false).unwrap();
    let repo = open(&repo_dir).unwrap();
    for (id, want) in &versions[1..] {
        let (_, snap) = repo.find_snapshot(id).unwrap();
        let out = t.path().join(format!("out-{}", &id[..8]));
        let report = restore(&repo, &snap.tree, &out, &[], &mut |_| {}).unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(
            &snapshot_of(&out.join(src.strip_prefix("/").unwrap())),
            want
        );
    }
    let r = check(&repo, 1.0).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}
