//! The S3 backend against a real S3 server (versitygw, started by each test on a free port,
//! `dedupwire_repo::s3server`): the backend contract as `LocalBackend` keeps it, create-once
//! writes, multipart uploads, request counts, and the errors a user meets (wrong secret, no
//! bucket, server down or killed mid-write). The versitygw binary is built by
//! `scripts/versitygw.sh` when missing; without it (no Go) the tests fail and say so.

use std::sync::Arc;
use std::time::Duration;

use dedupwire_repo::s3server::{find_binary, S3Server, ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use dedupwire_repo::{
    Backend, BackendError, Config, KdfParams, ObjectKind, Repository, S3Backend, S3Options,
};

const KINDS: [ObjectKind; 5] = [
    ObjectKind::Key,
    ObjectKind::Pack,
    ObjectKind::Index,
    ObjectKind::Snapshot,
    ObjectKind::Lock,
];

fn server() -> S3Server {
    let binary = find_binary(true).unwrap_or_else(|e| {
        panic!("the S3 tests need versitygw: run `bash scripts/versitygw.sh` (needs Go): {e}")
    });
    S3Server::start(&binary, Duration::from_secs(30)).unwrap()
}

fn options() -> S3Options {
    let mut o = S3Options::new(ACCESS_KEY_ID, SECRET_ACCESS_KEY);
    o.retry_timeout = Duration::from_secs(2);
    o.first_backoff = Duration::from_millis(50);
    o.multipart_threshold = 6 << 20;
    o.part_size = 5 << 20;
    o
}

/// A backend on an empty prefix, prepared as `init` would, with a config object.
fn new_repo(server: &S3Server, prefix: &str) -> S3Backend {
    let backend = S3Backend::create_with(&server.url(prefix), options()).unwrap();
    assert!(backend
        .put_new(ObjectKind::Config, "config", b"cfg")
        .unwrap());
    backend
}

fn sorted(mut v: Vec<(String, u64)>) -> Vec<(String, u64)> {
    v.sort();
    v
}

#[test]
fn list_get_get_range_delete_as_the_local_backend_does() {
    let server = server();
    let backend = new_repo(&server, "repo");
    for kind in KINDS {
        assert!(backend.list(kind).unwrap().is_empty());
        backend.put_new(kind, "00aa", b"").unwrap();
        backend.put_new(kind, "ff-1", b"hello world").unwrap();
        backend.put_new(kind, "ff_2", &[7u8; 3000]).unwrap();
        assert_eq!(
            sorted(backend.list(kind).unwrap()),
            vec![
                ("00aa".to_string(), 0),
                ("ff-1".to_string(), 11),
                ("ff_2".to_string(), 3000)
            ]
        );
        assert_eq!(backend.get(kind, "00aa").unwrap(), b"");
        assert_eq!(backend.get_range(kind, "00aa", 0, 10).unwrap(), b"");
        assert_eq!(backend.get_range(kind, "ff-1", 6, 5).unwrap(), b"world");
        assert_eq!(backend.get_range(kind, "ff-1", 0, 0).unwrap(), b"");
        assert_eq!(backend.get_range(kind, "ff-1", 6, 100).unwrap(), b"world");
        assert_eq!(backend.get_range(kind, "ff-1", 11, 1).unwrap(), b"");
        assert_eq!(backend.get_range(kind, "ff-1", 500, 1).unwrap(), b"");
        assert_eq!(
            backend.get_range(kind, "ff-1", 0, u64::MAX).unwrap(),
            b"hello world"
        );
        assert_eq!(
            backend.get_range(kind, "ff_2", 1000, 1500).unwrap(),
            vec![7u8; 1500]
        );
        backend.delete(kind, "ff-1").unwrap();
        backend.delete(kind, "ff-1").unwrap();
        backend.delete(kind, "never-was").unwrap();
        assert_eq!(
            sorted(backend.list(kind).unwrap()),
            vec![("00aa".to_string(), 0), ("ff_2".to_string(), 3000)]
        );
        for result in [
            backend.get(kind, "ff-1").map(drop),
            backend.get_range(kind, "ff-1", 0, 1).map(drop),
            backend.get_range(kind, "ff-1", 0, 0).map(drop),
        ] {
            match result {
                Err(BackendError::NotFound(what)) => {
                    assert_eq!(what, format!("{}/ff-1", kind_dir(kind)))
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(backend.put_new(kind, "ff-1", b"again").unwrap());
    }
    assert_eq!(
        backend.list(ObjectKind::Config).unwrap(),
        vec![("config".to_string(), 3)]
    );
    let bucket = server.bucket_dir();
    assert!(bucket.join("repo/config").is_file());
    assert!(bucket.join("repo/data/00/00aa").is_file());
    assert!(bucket.join("repo/data/ff/ff_2").is_file());
    assert!(bucket.join("repo/keys/ff_2").is_file());
    assert!(bucket.join("repo/snapshots/ff-1").is_file());
    assert!(matches!(
        backend.get(ObjectKind::Key, "a.b"),
        Err(BackendError::BadName(..))
    ));
    assert!(matches!(
        backend.put_new(ObjectKind::Pack, "a", b"x"),
        Err(BackendError::BadName(..))
    ));
}

fn kind_dir(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Config => "",
        ObjectKind::Key => "keys",
        ObjectKind::Pack => "data",
        ObjectKind::Index => "index",
        ObjectKind::Snapshot => "snapshots",
        ObjectKind::Lock => "locks",
    }
}

#[test]
fn put_new_creates_once_small_and_multipart() {
    let server = server();
    let backend = new_repo(&server, "once");
    assert!(!backend
        .put_new(ObjectKind::Config, "config", b"other")
        .unwrap());
    assert_eq!(backend.get(ObjectKind::Config, "config").unwrap(), b"cfg");
    assert!(backend
        .put_new(ObjectKind::Index, "ab12", b"first")
        .unwrap());
    assert!(!backend
        .put_new(ObjectKind::Index, "ab12", b"first")
        .unwrap());
    assert!(!backend
        .put_new(ObjectKind::Index, "ab12", b"second!")
        .unwrap());
    assert_eq!(backend.get(ObjectKind::Index, "ab12").unwrap(), b"first");

    let big: Vec<u8> = (0..13 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
    let before = backend.stats().unwrap();
    assert!(backend.put_new(ObjectKind::Pack, "beef", &big).unwrap());
    let after = backend.stats().unwrap();
    assert_eq!(backend.get(ObjectKind::Pack, "beef").unwrap(), big);
    assert_eq!(
        backend
            .get_range(ObjectKind::Pack, "beef", (12 << 20) + 5, 100)
            .unwrap(),
        big[(12 << 20) + 5..(12 << 20) + 105]
    );
    // A HEAD, then the upload's start, 3 parts of at most 5 MiB and its completion.
    assert_eq!(after.get.requests - before.get.requests, 1);
    assert_eq!(after.put.requests - before.put.requests, 5);
    let sent = after.put.bytes_sent - before.put.bytes_sent;
    assert!(
        (big.len() as u64..big.len() as u64 + 4096).contains(&sent),
        "{sent}"
    );
    assert!(!backend.put_new(ObjectKind::Pack, "beef", &big).unwrap());
    assert_eq!(backend.stats().unwrap().put.requests, after.put.requests);
    assert_eq!(
        backend.list(ObjectKind::Pack).unwrap(),
        vec![("beef".to_string(), big.len() as u64)]
    );
}

#[test]
fn put_new_loses_a_race_without_touching_the_winner() {
    let server = server();
    let backend = Arc::new(new_repo(&server, "race"));
    let threads: Vec<_> = (0..8u8)
        .map(|i| {
            let backend = backend.clone();
            std::thread::spawn(move || {
                let bytes = vec![i; 10_000];
                (
                    i,
                    backend.put_new(ObjectKind::Index, "race", &bytes).unwrap(),
                )
            })
        })
        .collect();
    let results: Vec<(u8, bool)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let winners: Vec<u8> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert_eq!(
        backend.get(ObjectKind::Index, "race").unwrap(),
        vec![winners[0]; 10_000]
    );
}

#[test]
fn requests_and_bytes_are_counted_per_operation() {
    let server = server();
    let backend = new_repo(&server, "count");
    let start = backend.stats().unwrap();
    // create: a LIST, the create-once probe (two PUTs, a DELETE); then the config's PUT.
    assert_eq!(start.list.requests, 1);
    assert_eq!(start.put.requests, 3);
    assert_eq!(start.put.bytes_sent, 5);
    assert_eq!(start.delete.requests, 1);
    for i in 0..3 {
        backend
            .put_new(ObjectKind::Snapshot, &format!("s{i}"), &[1u8; 1000])
            .unwrap();
    }
    assert_eq!(backend.list(ObjectKind::Snapshot).unwrap().len(), 3);
    assert_eq!(backend.get(ObjectKind::Snapshot, "s0").unwrap().len(), 1000);
    assert_eq!(
        backend
            .get_range(ObjectKind::Snapshot, "s1", 10, 100)
            .unwrap()
            .len(),
        100
    );
    backend.delete(ObjectKind::Snapshot, "s2").unwrap();
    let s = backend.stats().unwrap();
    assert_eq!(s.put.requests - start.put.requests, 3);
    assert_eq!(s.put.bytes_sent - start.put.bytes_sent, 3000);
    assert_eq!(s.list.requests - start.list.requests, 1);
    assert!(s.list.bytes_received > 0);
    assert_eq!(s.get.requests - start.get.requests, 2);
    assert_eq!(s.get.bytes_received - start.get.bytes_received, 1100);
    assert_eq!(s.delete.requests, 2);
    let text = s.to_string();
    assert!(text.contains("put 6 requests"), "{text}");
}

#[test]
fn open_and_create_check_what_is_there() {
    let server = server();
    let url = server.url("checked");
    match S3Backend::open_with(&url, options()) {
        Err(e @ BackendError::NoRepository(_)) => {
            assert!(e.to_string().contains(&url), "{e}");
            assert!(e.to_string().contains("repo init"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let backend = S3Backend::create_with(&url, options()).unwrap();
    backend.put_new(ObjectKind::Key, "k1", b"key").unwrap();
    assert!(matches!(
        S3Backend::create_with(&url, options()),
        Err(BackendError::Unfinished(_))
    ));
    backend.put_new(ObjectKind::Config, "config", b"c").unwrap();
    assert!(matches!(
        S3Backend::create_with(&url, options()),
        Err(BackendError::AlreadyExists(_))
    ));
    S3Backend::open_with(&url, options()).unwrap();
    S3Backend::open_with(&format!("{url}/"), options()).unwrap();

    let other = S3Backend::create_with(&server.url("other"), options()).unwrap();
    other.put_new(ObjectKind::Index, "x1", b"i").unwrap();
    assert!(matches!(
        S3Backend::create_with(&server.url("other"), options()),
        Err(BackendError::NotEmpty(_))
    ));
    S3Backend::create_with(&server.url("other/deeper"), options()).unwrap();
    S3Backend::create_with(&server.url("check"), options()).unwrap();
}

#[test]
fn errors_say_what_is_wrong() {
    let server = server();
    new_repo(&server, "r");
    let url = server.url("r");

    let mut wrong = options();
    wrong.secret_access_key = "not the secret".to_string();
    for result in [
        S3Backend::open_with(&url, wrong.clone()).map(drop),
        S3Backend::create_with(&server.url("new"), wrong.clone()).map(drop),
    ] {
        let text = result.unwrap_err().to_string();
        assert!(text.contains("secret key does not match"), "{text}");
        assert!(text.contains("AWS_SECRET_ACCESS_KEY"), "{text}");
        assert!(text.contains(&server.endpoint()), "{text}");
    }
    let mut unknown = options();
    unknown.access_key_id = "nobody".to_string();
    let text = S3Backend::open_with(&url, unknown).unwrap_err().to_string();
    assert!(text.contains("AWS_ACCESS_KEY_ID (nobody)"), "{text}");

    let missing = url.replace("/backups/", "/no-such-bucket/");
    for result in [
        S3Backend::open_with(&missing, options()).map(drop),
        S3Backend::create_with(&missing, options()).map(drop),
    ] {
        let text = result.unwrap_err().to_string();
        assert!(
            text.contains("the bucket no-such-bucket does not exist"),
            "{text}"
        );
    }

    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = down.local_addr().unwrap().port();
    drop(down);
    let nowhere = format!("s3:http://127.0.0.1:{port}/backups/r");
    let started = std::time::Instant::now();
    let text = S3Backend::open_with(&nowhere, options())
        .unwrap_err()
        .to_string();
    assert!(
        text.contains(&format!(
            "cannot connect to the S3 server at http://127.0.0.1:{port}"
        )),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let text = S3Backend::open_with("s3:http://127.0.0.1:1", options())
        .unwrap_err()
        .to_string();
    assert!(text.contains("no bucket"), "{text}");
}

#[test]
fn a_killed_server_is_an_error_and_a_restarted_one_serves_what_was_stored() {
    let mut server = server();
    let backend = new_repo(&server, "killed");
    backend
        .put_new(ObjectKind::Snapshot, "before", b"stored")
        .unwrap();
    server.kill();
    let started = std::time::Instant::now();
    let err = backend
        .put_new(ObjectKind::Snapshot, "during", b"lost")
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("snapshots/during"), "{text}");
    assert!(
        text.contains("cannot connect to the S3 server at http://127.0.0.1:"),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let text = backend.list(ObjectKind::Pack).unwrap_err().to_string();
    assert!(text.contains("cannot connect"), "{text}");
    server.restart(Duration::from_secs(30)).unwrap();
    assert_eq!(
        backend.get(ObjectKind::Snapshot, "before").unwrap(),
        b"stored"
    );
    assert!(backend
        .put_new(ObjectKind::Snapshot, "during", b"now")
        .unwrap());
}

#[test]
fn a_repository_lives_in_the_bucket() {
    let server = server();
    let url = server.url("whole/repo");
    let backend = S3Backend::create_with(&url, options()).unwrap();
    let repo =
        Repository::init(Box::new(backend), b"pw", KdfParams::TEST, Config::default()).unwrap();
    let id = repo.config().id.clone();
    drop(repo);
    let repo = Repository::open(
        Box::new(S3Backend::open_with(&url, options()).unwrap()),
        b"pw",
    )
    .unwrap();
    assert_eq!(repo.config().id, id);
    assert!(repo.snapshots().unwrap().is_empty());
    let stats = repo.backend().stats().unwrap();
    assert!(stats.get.requests >= 2, "{stats}");
    assert!(server.bucket_dir().join("whole/repo/config").is_file());
    assert!(Repository::open(
        Box::new(S3Backend::open_with(&url, options()).unwrap()),
        b"wrong"
    )
    .is_err());
}
