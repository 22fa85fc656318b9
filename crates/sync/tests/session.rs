//! The send/serve session in one process over a socket pair: a good tree arrives whole; a
//! hostile sender (paths escaping the root, a bad tree name) gets a clear error and the
//! receiving root is left as it was.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use dedupwire_sync::manifest::{self, Entry, Kind, Manifest};
use dedupwire_sync::{send, serve, Error, SendOptions, ServeReport, TreeRoot};
use dedupwire_wire::{ChannelConfig, DedupStream, MemoryStore, Role};

/// Runs one session: `send` of `manifest` from `src` as `name` against `serve` into `root`.
fn session(
    root: &Path,
    src: &Path,
    name: &[u8],
    manifest: &Manifest,
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
    let sent = send(
        &mut c,
        src,
        name,
        manifest,
        &SendOptions::default(),
        &mut |_, _| {},
    );
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

#[test]
fn a_tree_arrives_whole() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("d/empty")).unwrap();
    fs::write(src.join("d/f"), vec![7u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("f", src.join("d/l")).unwrap();
    let m = manifest::scan(&src, &mut |_| {}).unwrap().manifest;
    let root = t.path().join("root");
    let (sent, served) = session(&root, &src, b"copy", &m);
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
        let (sent, served) = session(&root, &src, b"t", &hostile(path));
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
        let (sent, served) = session(&root, &src, name.as_bytes(), &hostile("ok"));
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
