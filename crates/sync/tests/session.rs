//! The send/serve session in one process over a socket pair: a good tree arrives whole; a
//! hostile sender (paths escaping the root, a bad tree name) gets a clear error and the
//! receiving root is left as it was.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use dedupwire_sync::cache::DEFAULT_MAX_BYTES;
use dedupwire_sync::manifest::{self, Entry, Kind, Manifest};
use dedupwire_sync::session::SESSION_VERSION;
use dedupwire_sync::{send, serve, Error, SendCache, SendOptions, ServeReport, TreeRoot};
use dedupwire_wire::{ChannelConfig, DedupStream, MemoryStore, Role};

/// Runs one session: `send` of `manifest` from `src` as `name` against `serve` into `root`.
fn session(
    root: &Path,
    src: &Path,
    name: &[u8],
    manifest: &Manifest,
    cache: Option<&SendCache>,
) -> (
    Result<dedupwire_sync::SendReport, Error>,
    Result<ServeReport, Error>,
) {
    session_with(root, src, name, manifest, cache, &SendOptions::default())
}

/// [`session`] with send options.
fn session_with(
    root: &Path,
    src: &Path,
    name: &[u8],
    manifest: &Manifest,
    cache: Option<&SendCache>,
    opts: &SendOptions,
) -> (
    Result<dedupwire_sync::SendReport, Error>,
    Result<ServeReport, Error>,
) {
    let mut scan = manifest::Scan {
        manifest: manifest.clone(),
        ..Default::default()
    };
    session_scan(root, src, name, &mut scan, cache, opts)
}

/// [`session_with`] of a tree as listed (or scanned): files not read yet are hashed as the
/// session goes, into `scan`.
fn session_scan(
    root: &Path,
    src: &Path,
    name: &[u8],
    scan: &mut manifest::Scan,
    cache: Option<&SendCache>,
    opts: &SendOptions,
) -> (
    Result<dedupwire_sync::SendReport, Error>,
    Result<ServeReport, Error>,
) {
    let (a, b) = UnixStream::pair().unwrap();
    let root = root.to_path_buf();
    let server = std::thread::spawn(move || {
        let store = Arc::new(MemoryStore::new());
        let mut s =
            DedupStream::new(b, store.clone(), ChannelConfig::default(), Role::Accept).unwrap();
        let trees = TreeRoot::open(&root).unwrap();
        serve(&trees, &*store, &mut s)
    });
    let mut c = DedupStream::new(
        a,
        Arc::new(MemoryStore::new()),
        ChannelConfig::default(),
        Role::Connect,
    )
    .unwrap();
    let sent = send(&mut c, src, name, scan, opts, cache, &mut |_, _| {});
    drop(c);
    (sent, server.join().unwrap())
}

fn listing(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Bytes allocated to `path` on disk.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn a_sparse_file_arrives_sparse_and_stays_sparse_when_copied_on_the_receiver() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let image = src.join("disk.img");
    let f = fs::File::create(&image).unwrap();
    f.set_len(64 << 20).unwrap();
    {
        use std::os::unix::fs::FileExt;
        f.write_all_at(&noise(1, 100_000), 10 << 20).unwrap();
        f.write_all_at(b"end", (64 << 20) - 3).unwrap();
    }
    assert!(allocated(&image) < 1 << 20, "this filesystem makes holes");
    let root = t.path().join("root");
    let m = manifest::scan(&src, &mut |_| {}).unwrap().manifest;
    let (sent, served) = session(&root, &src, b"vm", &m, None);
    sent.unwrap();
    served.unwrap();
    let arrived_sparse = |path: &Path| {
        assert_eq!(fs::read(path).unwrap(), fs::read(&image).unwrap());
        let bytes = allocated(path);
        assert!(
            bytes < 1 << 20,
            "{}: {bytes} bytes allocated",
            path.display()
        );
    };
    arrived_sparse(&root.join("vm/disk.img"));
    // A copy of the image under a new name is made on the receiver from the one it holds.
    fs::copy(&image, src.join("renamed.img")).unwrap();
    let m = manifest::scan(&src, &mut |_| {}).unwrap().manifest;
    let (sent, served) = session(&root, &src, b"vm", &m, None);
    assert_eq!(
        sent.unwrap().files_sent,
        0,
        "the copy comes from the receiver's own tree"
    );
    served.unwrap();
    arrived_sparse(&root.join("vm/renamed.img"));
}

#[test]
fn a_tree_arrives_whole() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("d/empty")).unwrap();
    fs::write(src.join("d/f"), vec![7u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("f", src.join("d/l")).unwrap();
    let m = manifest::scan(&src, &mut |_| {}).unwrap().manifest;
    let root = t.path().join("root");
    let (sent, served) = session(&root, &src, b"copy", &m, None);
    let sent = sent.unwrap();
    assert_eq!(sent.files_sent, 1);
    assert_eq!(served.unwrap().diff.files_new, 2);
    let got = manifest::scan(&root.join("copy"), &mut |_| {})
        .unwrap()
        .manifest;
    assert_eq!(got, m);
}

fn hostile(path: &str) -> Manifest {
    Manifest {
        root_mode: 0o755,
        root_mtime_ns: 0,
        entries: vec![Entry {
            path: path.as_bytes().to_vec(),
            kind: Kind::File {
                size: 4,
                hash: *blake3::hash(b"evil").as_bytes(),
            },
            mode: 0o644,
            mtime_ns: 0,
        }],
    }
}

#[test]
fn a_hostile_manifest_is_refused_and_nothing_changes() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let root = t.path().join("root");
    for path in ["../../escape", "/etc/evil", "a/../../b", "./x"] {
        let (sent, served) = session(&root, &src, b"t", &hostile(path), None);
        assert!(
            matches!(served, Err(Error::Manifest(_))),
            "{path}: {served:?}"
        );
        let e = sent.unwrap_err().to_string();
        assert!(e.contains("malformed manifest"), "{path}: {e}");
        assert_eq!(listing(&root), [".dedupwire"], "{path}");
        assert!(!t.path().join("escape").exists());
    }
    for name in ["..", "a/b", ".dedupwire", ""] {
        let (sent, served) = session(&root, &src, name.as_bytes(), &hostile("ok"), None);
        assert!(
            matches!(served, Err(Error::Refused(_))),
            "{name}: {served:?}"
        );
        assert!(
            sent.unwrap_err().to_string().contains("tree name"),
            "{name}"
        );
        assert_eq!(listing(&root), [".dedupwire"], "{name}");
    }
}

/// Deterministic bytes that do not compress.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A 2 MB file with a few bytes changed in four places.
fn edited(old: &[u8]) -> Vec<u8> {
    let mut new = old.to_vec();
    for at in [1000, 500_000, 1_200_000, 1_999_000] {
        new[at..at + 40].copy_from_slice(&noise(at as u64, 40));
    }
    new
}

/// Sends `src` as "t" into `root` with the sender's cache in `cache_dir`, recording the tree
/// in the cache after a good send as `dedupwire send` does; returns the manifest sent too.
fn send_cached(
    root: &Path,
    src: &Path,
    cache_dir: &Path,
    opts: &SendOptions,
) -> (
    Manifest,
    Result<dedupwire_sync::SendReport, Error>,
    Result<ServeReport, Error>,
) {
    let mut scan = manifest::list(src).unwrap();
    let cache = SendCache::open(cache_dir, "peer:1:t", DEFAULT_MAX_BYTES).unwrap();
    let (sent, served) = session_scan(root, src, b"t", &mut scan, Some(&cache), opts);
    if sent.is_ok() {
        assert!(scan.unread.is_empty());
        cache.finish(&scan.manifest).unwrap();
    }
    (scan.manifest, sent, served)
}

fn tree_of(dir: &Path) -> Manifest {
    manifest::scan(dir, &mut |_| {}).unwrap().manifest
}

#[test]
fn a_changed_file_travels_as_a_delta_against_the_cached_old_version() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    // A big binary (zstd with the base as a reference prefix) and a text (our codec).
    let old = noise(1, 5_000_000);
    let text: Vec<u8> = noise(3, 2_000_000).iter().map(|b| b'a' + b % 26).collect();
    fs::write(src.join("big"), &old).unwrap();
    fs::write(src.join("text"), &text).unwrap();
    fs::write(src.join("small"), b"unchanged").unwrap();
    let (root, cache) = (t.path().join("root"), t.path().join("cache"));
    let opts = SendOptions::default();
    let (_, sent, _) = send_cached(&root, &src, &cache, &opts);
    assert_eq!(sent.unwrap().files_delta, 0, "nothing to delta against yet");

    fs::write(src.join("big"), edited(&old)).unwrap();
    let new_text: Vec<u8> = edited(&noise(3, 2_000_000))
        .iter()
        .map(|b| b'a' + b % 26)
        .collect();
    fs::write(src.join("text"), new_text).unwrap();
    let (m, sent, served) = send_cached(&root, &src, &cache, &opts);
    let (sent, served) = (sent.unwrap(), served.unwrap());
    assert_eq!((sent.files_delta, served.files_delta), (2, 2));
    assert!(
        sent.delta_bytes < 16_000,
        "{} delta bytes",
        sent.delta_bytes
    );
    assert!(
        sent.channel.socket_bytes_sent < 30_000,
        "{} bytes sent",
        sent.channel.socket_bytes_sent
    );
    assert_eq!(tree_of(&root.join("t")), m);
}

#[test]
fn a_base_changed_on_the_receiver_is_not_used_and_the_file_travels_whole() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let old = noise(2, 2_000_000);
    fs::write(src.join("big"), &old).unwrap();
    let (root, cache) = (t.path().join("root"), t.path().join("cache"));
    let opts = SendOptions::default();
    send_cached(&root, &src, &cache, &opts).1.unwrap();

    // Damaged in place on the receiver, same size and modification time: the manifest it
    // keeps still names the old contents, which the sender's delta is against.
    let there = root.join("t/big");
    let md = fs::metadata(&there).unwrap();
    let mut damaged = old.clone();
    damaged[10] ^= 0xff;
    fs::write(&there, &damaged).unwrap();
    let f = fs::File::options().write(true).open(&there).unwrap();
    f.set_modified(md.modified().unwrap()).unwrap();
    drop(f);

    fs::write(src.join("big"), edited(&old)).unwrap();
    let (m, sent, served) = send_cached(&root, &src, &cache, &opts);
    let (sent, served) = (sent.unwrap(), served.unwrap());
    assert_eq!(
        (sent.files_delta, served.files_delta),
        (0, 0),
        "no delta against it"
    );
    assert_eq!(tree_of(&root.join("t")), m);
    assert_eq!(fs::read(&there).unwrap(), edited(&old));
}

#[test]
fn a_receiver_without_the_cached_tree_gets_the_whole_manifest() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), noise(3, 100_000)).unwrap();
    let cache = t.path().join("cache");
    let opts = SendOptions::default();
    send_cached(&t.path().join("one"), &src, &cache, &opts)
        .1
        .unwrap();

    // Another receiver behind the same address: its tree is not the one the cache recorded,
    // so it asks for the whole manifest and the send still completes.
    fs::write(src.join("g"), b"more").unwrap();
    let other = t.path().join("other");
    let (m, sent, served) = send_cached(&other, &src, &cache, &opts);
    assert_eq!(sent.unwrap().diff.files_new, 2);
    assert_eq!(served.unwrap().files_received, 2);
    assert_eq!(tree_of(&other.join("t")), m);
}

/// Plays a hostile sender by hand (FORMAT.md): OFFER with the whole manifest of `src`, then
/// `data` as one DATA message, then COMMIT; returns the receiver's result.
fn hostile_data(root: &Path, src: &Path, data: Vec<u8>) -> Result<ServeReport, Error> {
    let m = manifest::scan(src, &mut |_| {}).unwrap().manifest;
    let (a, b) = UnixStream::pair().unwrap();
    let root = root.to_path_buf();
    let server = std::thread::spawn(move || {
        let store = Arc::new(MemoryStore::new());
        let mut s =
            DedupStream::new(b, store.clone(), ChannelConfig::default(), Role::Accept).unwrap();
        serve(&TreeRoot::open(&root).unwrap(), &*store, &mut s)
    });
    let mut c = DedupStream::new(
        a,
        Arc::new(MemoryStore::new()),
        ChannelConfig::default(),
        Role::Connect,
    )
    .unwrap();
    let mut offer = vec![b'O', SESSION_VERSION, 0, 1, 0, b't', 0, 0, 0, 0, 0];
    offer.extend_from_slice(&m.encode());
    c.send(&offer).unwrap();
    let plan = c.recv().unwrap();
    assert_eq!(plan[0], b'P', "{:?}", String::from_utf8_lossy(&plan));
    let mut msg = vec![b'D'];
    msg.extend_from_slice(&data);
    let _ = c.send(&msg);
    let _ = c.send(b"C");
    drop(c);
    server.join().unwrap()
}

fn piece(kind: u8, index: u32, bytes: &[u8]) -> Vec<u8> {
    let mut p = vec![kind];
    p.extend_from_slice(&index.to_le_bytes());
    p.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    p.extend_from_slice(bytes);
    p
}

#[test]
fn malformed_data_pieces_are_errors_and_the_tree_stays() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let old = noise(4, 50_000);
    fs::write(src.join("a"), &old).unwrap();
    let root = t.path().join("root");
    let m = manifest::scan(&src, &mut |_| {}).unwrap().manifest;
    session(&root, &src, b"t", &m, None).0.unwrap();
    // Entry 0 is "a" (the root is not an entry); the new version changes it.
    fs::write(src.join("a"), noise(5, 60_000)).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("DATA piece kind", piece(b'x', 0, b"abc")),
        ("no base", [piece(b'd', 0, b"ab")].concat()),
        ("longer than the file", piece(b'e', 0, &vec![0; 60_100])),
        ("the delta of entry 0", piece(b'e', 0, &[0xff; 40])),
        ("the delta of entry 0", piece(b'Z', 0, &[0xff; 40])),
        (
            "changes its form midway",
            [piece(b'd', 0, b"ab"), piece(b'Z', 0, b"cd")].concat(),
        ),
        ("incomplete", piece(b'z', 0, &[1, 2, 3])),
        ("not the next file needed", piece(b'B', 7, b"abc")),
        ("incomplete", piece(b'd', 0, &[1, 2, 3])),
        ("truncated", piece(b'B', 0, b"abc")[..8].to_vec()),
        (
            "match the manifest's hash",
            piece(b'B', 0, &vec![0; 60_000]),
        ),
        ("not one count", piece(b'H', 0, &[1, 2, 3])),
        ("not one count", piece(b'H', 0, &0u64.to_le_bytes())),
        ("more bytes than", piece(b'H', 0, &60_001u64.to_le_bytes())),
        ("more bytes than", piece(b'H', 0, &u64::MAX.to_le_bytes())),
        (
            "match the manifest's hash",
            piece(b'H', 0, &60_000u64.to_le_bytes()),
        ),
        (
            "while the delta of entry 0",
            [piece(b'd', 0, b"ab"), piece(b'H', 0, &5u64.to_le_bytes())].concat(),
        ),
    ];
    for (want, data) in cases {
        // "no base": a tree without the old file at that path.
        let r = if want == "no base" {
            hostile_data(&t.path().join("empty-root"), &src, data)
        } else {
            hostile_data(&root, &src, data)
        };
        let e = r.unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
        assert_eq!(fs::read(root.join("t/a")).unwrap(), old, "{want}");
    }
}

#[test]
fn files_streamed_in_pieces_arrive_whole_between_delta_files() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    for (k, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        fs::write(src.join(name), noise(10 + k as u64, 2_000_000)).unwrap();
    }
    let (root, cache) = (t.path().join("root"), t.path().join("cache"));
    send_cached(&root, &src, &cache, &SendOptions::default())
        .1
        .unwrap();

    // "a", "b" and "d" go whole, as deltas; "c" and "e" in pieces over small DATA messages;
    // the files alternate between the producer threads.
    for name in ["a", "b", "d"] {
        let old = fs::read(src.join(name)).unwrap();
        fs::write(src.join(name), edited(&old)).unwrap();
    }
    fs::write(src.join("c"), noise(20, 2_500_000)).unwrap();
    fs::write(src.join("e"), noise(21, 2_200_000)).unwrap();
    fs::write(src.join("f"), noise(22, 100)).unwrap();
    let opts = SendOptions {
        whole_file_max: 2_100_000,
        batch_bytes: 300_000,
        ..SendOptions::default()
    };
    let (m, sent, served) = send_cached(&root, &src, &cache, &opts);
    let (sent, served) = (sent.unwrap(), served.unwrap());
    assert_eq!(sent.files_sent, 6);
    assert_eq!((sent.files_delta, served.files_delta), (3, 3));
    assert_eq!(tree_of(&root.join("t")), m);
}

#[test]
fn files_are_read_once_whether_new_unchanged_moved_or_changed() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a"), noise(1, 300_000)).unwrap();
    let b = noise(2, 2_000_000);
    fs::write(src.join("b"), &b).unwrap();
    // Over the 8 MiB read whole: streamed in pieces.
    fs::write(src.join("c"), noise(3, 10_000_000)).unwrap();
    fs::write(src.join("d/f"), noise(4, 5_000)).unwrap();
    fs::write(src.join("e"), b"").unwrap();
    let root = t.path().join("root");
    let opts = SendOptions::default();
    let mut scan = manifest::list(&src).unwrap();
    assert_eq!(scan.unread.len(), 4, "all but the empty file");
    let (sent, served) = session_scan(&root, &src, b"t", &mut scan, None, &opts);
    let (sent, _) = (sent.unwrap(), served.unwrap());
    assert_eq!((sent.bytes_hashed, sent.bytes_read), (0, 12_305_000));
    assert!(scan.unread.is_empty());
    assert_eq!(scan.manifest, tree_of(&src));
    assert_eq!(tree_of(&root.join("t")), scan.manifest);

    // The receiver asks for the hashes of the files of sizes it holds: "a" moved, "b" edited
    // in place, "c" and "d/f" unchanged; "g" is of no size it holds, read only to be sent.
    fs::rename(src.join("a"), src.join("a2")).unwrap();
    fs::write(src.join("b"), edited(&b)).unwrap();
    fs::write(src.join("g"), noise(5, 12_345)).unwrap();
    let mut scan = manifest::list(&src).unwrap();
    let (sent, served) = session_scan(&root, &src, b"t", &mut scan, None, &opts);
    let (sent, served) = (sent.unwrap(), served.unwrap());
    assert_eq!(sent.bytes_hashed, 12_305_000);
    assert_eq!(sent.bytes_read, 2_012_345, "b again, g once");
    assert_eq!((sent.files_sent, served.files_received), (2, 2));
    assert_eq!(tree_of(&root.join("t")), tree_of(&src));
    assert_eq!(scan.manifest, tree_of(&src));
}

#[test]
fn a_file_changed_after_it_was_listed_is_an_error_and_the_tree_stays() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let root = t.path().join("root");
    let opts = SendOptions::default();
    type Change = (&'static str, usize, fn(&Path));
    let changes: [Change; 3] = [
        ("small", 100_000, |p| {
            fs::write(p, noise(9, 100_000)).unwrap()
        }),
        ("big", 10_000_000, |p| {
            use std::io::Write;
            fs::OpenOptions::new()
                .append(true)
                .open(p)
                .unwrap()
                .write_all(b"more")
                .unwrap()
        }),
        ("shrunk", 10_000_000, |p| {
            fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(5_000_000)
                .unwrap()
        }),
    ];
    for (name, len, change) in changes {
        let path = src.join(name);
        fs::write(&path, noise(8, len)).unwrap();
        let mut scan = manifest::list(&src).unwrap();
        // Past the file system's timestamp granularity.
        std::thread::sleep(std::time::Duration::from_millis(50));
        change(&path);
        let (sent, served) = session_scan(&root, &src, b"t", &mut scan, None, &opts);
        let e = sent.unwrap_err().to_string();
        assert!(e.contains("changed while being sent"), "{name}: {e}");
        assert!(served.is_err(), "{name}");
        assert_eq!(listing(&root), [".dedupwire"], "{name}");
        fs::remove_file(&path).unwrap();
    }
}

/// Plays a sender by hand: OFFER of `src`'s manifest with its entry 0 as unread (`unread`,
/// its hash zeroed), DATA of entry 0's contents, then COMMIT followed by `commit`.
fn unread_then_commit(
    root: &Path,
    src: &Path,
    unread: u32,
    commit: &[u8],
) -> Result<ServeReport, Error> {
    let mut m = manifest::scan(src, &mut |_| {}).unwrap().manifest;
    let contents = fs::read(src.join(m.entries[0].rel_path())).unwrap();
    if let Kind::File { hash, .. } = &mut m.entries[unread as usize].kind {
        *hash = [0; 32];
    }
    let (a, b) = UnixStream::pair().unwrap();
    let root = root.to_path_buf();
    let server = std::thread::spawn(move || {
        let store = Arc::new(MemoryStore::new());
        let mut s =
            DedupStream::new(b, store.clone(), ChannelConfig::default(), Role::Accept).unwrap();
        serve(&TreeRoot::open(&root).unwrap(), &*store, &mut s)
    });
    let mut c = DedupStream::new(
        a,
        Arc::new(MemoryStore::new()),
        ChannelConfig::default(),
        Role::Connect,
    )
    .unwrap();
    let mut offer = vec![b'O', SESSION_VERSION, 0, 1, 0, b't', 1, 0, 0, 0];
    offer.extend_from_slice(&unread.to_le_bytes());
    offer.push(0);
    offer.extend_from_slice(&m.encode());
    c.send(&offer).unwrap();
    if let Ok(plan) = c.recv() {
        if plan[0] == b'P' {
            let _ = c.send(&[b"D".as_slice(), &piece(b'B', 0, &contents)].concat());
            let _ = c.send(&[b"C".as_slice(), commit].concat());
            let _ = c.recv();
        }
    }
    drop(c);
    server.join().unwrap()
}

#[test]
fn a_file_hashed_as_sent_is_checked_against_the_hash_at_commit() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("z")).unwrap();
    let contents = noise(6, 70_000);
    fs::write(src.join("a"), &contents).unwrap();
    let root = t.path().join("root");
    let right = *blake3::hash(&contents).as_bytes();
    let cases: [(&str, u32, &[u8]); 4] = [
        ("do not match the sender's hash", 0, &[7; 32]),
        ("a COMMIT of 1 bytes", 0, &[]),
        ("a COMMIT of 65 bytes", 0, &[right, right].concat()),
        ("entry 1 as unread", 1, &right),
    ];
    for (want, unread, commit) in cases {
        let e = unread_then_commit(&root, &src, unread, commit)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{want}: {e}");
        assert_eq!(listing(&root), [".dedupwire"], "{want}");
    }
    unread_then_commit(&root, &src, 0, &right).unwrap();
    assert_eq!(fs::read(root.join("t/a")).unwrap(), contents);
    assert_eq!(tree_of(&root.join("t")), tree_of(&src));
}
