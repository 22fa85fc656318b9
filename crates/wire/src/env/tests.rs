use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use tempfile::TempDir;

use super::*;
use crate::store::MAX_NOTE_BYTES;

fn id(n: u64) -> ChunkId {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..16].copy_from_slice(&xxh3_64(&n.to_le_bytes()).to_le_bytes());
    ChunkId(b)
}

fn data(n: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (n as usize * 31 + i * 7) as u8).collect()
}

fn small() -> EnvConfig {
    EnvConfig {
        max_bytes: 64 << 10,
        segment_bytes: 16 << 10,
        second_chance: false,
    }
}

fn seg_path(dir: &Path, no: u32) -> PathBuf {
    dir.join(segment::file_name(no))
}

fn flip(path: &Path, at: u64) {
    let mut b = fs::read(path).unwrap();
    b[at as usize] ^= 0x20;
    fs::write(path, b).unwrap();
}

#[test]
fn put_get_contains_round_trip() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), EnvConfig::default()).unwrap();
    env.put(&id(1), b"alpha").unwrap();
    env.put(&id(1), b"ignored: already held").unwrap();
    env.put(&id(2), b"").unwrap();
    assert_eq!(env.get(&id(1)).unwrap().as_deref(), Some(&b"alpha"[..]));
    assert_eq!(env.get(&id(2)).unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(env.get(&id(3)).unwrap(), None);
    assert!(env.contains(&id(1)).unwrap());
    assert_eq!(
        env.contains_many(&[id(1), id(3), id(2)]).unwrap(),
        vec![true, false, true]
    );
    let s = env.stats();
    assert_eq!((s.chunks, s.chunk_bytes, s.segments), (2, 5, 1));
    assert_eq!((s.hits, s.misses), (5, 2));
    assert_eq!(s.bytes, HEADER_LEN + 2 * RECORD_HEAD as u64 + 5);
    assert!(s.index_bytes > 0);
}

#[test]
fn reopen_keeps_chunks() {
    let dir = TempDir::new().unwrap();
    {
        let env = Environment::open(dir.path(), small()).unwrap();
        for n in 0..20 {
            env.put(&id(n), &data(n, 1000)).unwrap();
        }
        env.sync().unwrap();
    }
    let env = Environment::open(dir.path(), small()).unwrap();
    let s = env.stats();
    assert_eq!(
        (s.chunks, s.segments, s.torn_bytes, s.skipped_records),
        (20, 2, 0, 0)
    );
    for n in 0..20 {
        assert_eq!(env.get(&id(n)).unwrap(), Some(data(n, 1000)), "chunk {n}");
    }
    env.put(&id(99), b"after reopen").unwrap();
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(
        env.get(&id(99)).unwrap().as_deref(),
        Some(&b"after reopen"[..])
    );
}

#[test]
fn eviction_keeps_bytes_bounded_and_evicts_oldest() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    for n in 0..400 {
        env.put(&id(n), &data(n, 1000)).unwrap();
        let s = env.stats();
        assert!(s.bytes <= 64 << 10, "after {n}: {} bytes", s.bytes);
    }
    let s = env.stats();
    assert!(s.evictions > 0 && s.evicted_chunks > 0);
    assert!(
        !env.contains(&id(0)).unwrap(),
        "the oldest chunk left first"
    );
    assert!(env.contains(&id(399)).unwrap(), "the newest stays");
    let held: Vec<u64> = (0..400)
        .filter(|&n| env.contains(&id(n)).unwrap())
        .collect();
    let first = held[0];
    assert_eq!(held, (first..400).collect::<Vec<_>>(), "a suffix survives");
    assert_eq!(s.evicted_chunks + s.chunks, 400);
    let on_disk: u64 = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_str().unwrap().ends_with(".seg"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(on_disk, s.bytes);
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.stats().chunks, s.chunks);
}

#[test]
fn second_chance_keeps_used_chunks() {
    let dir = TempDir::new().unwrap();
    let cfg = EnvConfig {
        second_chance: true,
        ..small()
    };
    let env = Environment::open(dir.path(), cfg).unwrap();
    for n in 0..400 {
        env.put(&id(n), &data(n, 1000)).unwrap();
        if n % 10 == 0 {
            assert_eq!(env.get(&id(0)).unwrap(), Some(data(0, 1000)), "after {n}");
        }
        assert!(env.stats().bytes <= 64 << 10);
    }
    let s = env.stats();
    assert!(s.rescued_chunks > 0);
    assert!(env.contains(&id(0)).unwrap(), "a chunk in use survives");
    assert!(!env.contains(&id(1)).unwrap(), "an unused one does not");
}

#[test]
fn oversized_chunk_and_bad_config_are_refused() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    let big = vec![0u8; small().max_chunk_bytes() as usize + 1];
    assert!(matches!(env.put(&id(1), &big), Err(StoreError::Refused(_))));
    env.put(&id(1), &big[1..]).unwrap();
    assert_eq!(env.get(&id(1)).unwrap().unwrap().len(), big.len() - 1);
    let bad = EnvConfig {
        max_bytes: 20 << 10,
        ..small()
    };
    let other = TempDir::new().unwrap();
    assert!(matches!(
        Environment::open(other.path(), bad),
        Err(StoreError::Refused(_))
    ));
}

#[test]
fn concurrent_streams_put_and_get() {
    let dir = TempDir::new().unwrap();
    let cfg = EnvConfig {
        max_bytes: 64 << 20,
        segment_bytes: 256 << 10,
        second_chance: true,
    };
    let env = Arc::new(Environment::open(dir.path(), cfg).unwrap());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let env = env.clone();
            std::thread::spawn(move || {
                for i in 0..300u64 {
                    let n = (t * 300 + i) % 1000;
                    let want = data(n, 200 + (n as usize % 50) * 40);
                    env.put(&id(n), &want).unwrap();
                    assert_eq!(env.get(&id(n)).unwrap().as_ref(), Some(&want));
                    let other = (n * 7) % 1000;
                    if let Some(got) = env.get(&id(other)).unwrap() {
                        assert_eq!(got, data(other, 200 + (other as usize % 50) * 40));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = env.stats();
    assert_eq!(s.chunks, 1000, "every id 0..1000 was put, nothing evicted");
    drop(env);
    let env = Environment::open(dir.path(), EnvConfig::default()).unwrap();
    assert_eq!(env.stats().chunks, 1000);
    for n in 0..1000 {
        assert_eq!(
            env.get(&id(n)).unwrap(),
            Some(data(n, 200 + (n as usize % 50) * 40))
        );
    }
}

#[test]
fn concurrent_puts_with_eviction_stay_consistent() {
    let dir = TempDir::new().unwrap();
    let env = Arc::new(
        Environment::open(
            dir.path(),
            EnvConfig {
                second_chance: true,
                ..small()
            },
        )
        .unwrap(),
    );
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let env = env.clone();
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    let n = t * 1000 + i;
                    env.put(&id(n), &data(n, 700)).unwrap();
                    for back in [1, 5, 50] {
                        if let Some(got) = env.get(&id(n.saturating_sub(back))).unwrap() {
                            assert_eq!(got, data(n.saturating_sub(back), 700));
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = env.stats();
    assert!(s.bytes <= 64 << 10 && s.evictions > 0);
    assert_eq!(s.corrupt_dropped, 0);
}

#[test]
fn torn_tail_is_cut_at_reopen() {
    let dir = TempDir::new().unwrap();
    {
        let env = Environment::open(dir.path(), small()).unwrap();
        for n in 0..5 {
            env.put(&id(n), &data(n, 500)).unwrap();
        }
    }
    let path = seg_path(dir.path(), 1);
    let full = fs::metadata(&path).unwrap().len();
    let cut = full - 200;
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    let s = env.stats();
    let rec = (RECORD_HEAD + 500) as u64;
    assert_eq!(s.chunks, 4);
    assert_eq!(s.torn_bytes, cut - (full - rec));
    assert_eq!(s.skipped_records, 0);
    assert_eq!(fs::metadata(&path).unwrap().len(), full - rec);
    assert_eq!(env.get(&id(4)).unwrap(), None);
    env.put(&id(4), &data(4, 500)).unwrap();
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.stats().torn_bytes, 0);
    assert_eq!(env.get(&id(4)).unwrap(), Some(data(4, 500)));
}

#[test]
fn zero_filled_tail_and_torn_segment_creation_are_recovered() {
    let dir = TempDir::new().unwrap();
    {
        let env = Environment::open(dir.path(), small()).unwrap();
        env.put(&id(1), b"kept").unwrap();
    }
    let path = seg_path(dir.path(), 1);
    let mut b = fs::read(&path).unwrap();
    b.extend_from_slice(&[0u8; 300]);
    fs::write(&path, &b).unwrap();
    fs::write(seg_path(dir.path(), 2), &segment::encode_header(2)[..10]).unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    let s = env.stats();
    assert_eq!((s.chunks, s.segments, s.torn_bytes), (1, 1, 310));
    assert!(!seg_path(dir.path(), 2).exists());
    assert_eq!(env.get(&id(1)).unwrap().as_deref(), Some(&b"kept"[..]));
}

#[test]
fn flipped_byte_is_corrupt_on_get_and_skipped_at_open() {
    let dir = TempDir::new().unwrap();
    let rec = (RECORD_HEAD + 300) as u64;
    {
        let env = Environment::open(dir.path(), small()).unwrap();
        for n in 0..4 {
            env.put(&id(n), &data(n, 300)).unwrap();
        }
        flip(
            &seg_path(dir.path(), 1),
            HEADER_LEN + rec + RECORD_HEAD as u64 + 17,
        );
        match env.get(&id(1)) {
            Err(StoreError::Corrupt(m)) => {
                assert!(
                    m.contains("00000001.seg") && m.contains("data checksum"),
                    "{m}"
                )
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(env.get(&id(1)).unwrap(), None, "dropped from the index");
        assert_eq!(env.stats().corrupt_dropped, 1);
        assert_eq!(env.get(&id(2)).unwrap(), Some(data(2, 300)));
    }
    let env = Environment::open(dir.path(), small()).unwrap();
    let s = env.stats();
    assert_eq!((s.chunks, s.skipped_records, s.skipped_bytes), (3, 1, rec));
    assert_eq!(s.torn_bytes, 0);
    assert_eq!(env.get(&id(1)).unwrap(), None);
    for n in [0, 2, 3] {
        assert_eq!(env.get(&id(n)).unwrap(), Some(data(n, 300)));
    }
}

#[test]
fn flipped_record_header_is_corrupt_not_wrong_bytes() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    env.put(&id(1), &data(1, 100)).unwrap();
    env.put(&id(2), &data(2, 100)).unwrap();
    flip(&seg_path(dir.path(), 1), HEADER_LEN + 33);
    assert!(matches!(env.get(&id(1)), Err(StoreError::Corrupt(m)) if m.contains("header")));
    assert_eq!(env.get(&id(2)).unwrap(), Some(data(2, 100)));
}

#[test]
fn bad_magic_and_unknown_version_name_the_file() {
    let dir = TempDir::new().unwrap();
    {
        let env = Environment::open(dir.path(), small()).unwrap();
        env.put(&id(1), b"x").unwrap();
    }
    let path = seg_path(dir.path(), 1);
    flip(&path, 2);
    match Environment::open(dir.path(), small()) {
        Err(StoreError::Corrupt(m)) => assert!(m.contains("00000001.seg") && m.contains("magic")),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    flip(&path, 2);
    let mut b = fs::read(&path).unwrap();
    b[8..12].copy_from_slice(&3u32.to_le_bytes());
    fs::write(&path, &b).unwrap();
    match Environment::open(dir.path(), small()) {
        Err(StoreError::Refused(m)) => {
            assert!(m.contains("00000001.seg") && m.contains("version 3"), "{m}")
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    b[8..12].copy_from_slice(&segment::VERSION.to_le_bytes());
    b[13] ^= 1;
    fs::write(&path, &b).unwrap();
    assert!(
        matches!(Environment::open(dir.path(), small()), Err(StoreError::Corrupt(m)) if m.contains("00000001.seg"))
    );
}

fn hint_path(dir: &Path, no: u32) -> PathBuf {
    dir.join(hint::file_name(no))
}

/// Every chunk `0..n` (of 1000 bytes) the environment in `dir` holds, by reading it back.
fn held(env: &Environment, n: u64) -> Vec<u64> {
    (0..n)
        .filter(|&i| env.get(&id(i)).ok().flatten() == Some(data(i, 1000)))
        .collect()
}

fn hinted_config() -> EnvConfig {
    EnvConfig {
        max_bytes: 1 << 20,
        segment_bytes: 16 << 10,
        second_chance: false,
    }
}

#[test]
fn sealed_segments_open_from_their_hints_with_the_same_chunks() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    for i in 0..100 {
        env.put(&id(i), &data(i, 1000)).unwrap();
    }
    let segments = env.stats().segments;
    assert!(segments >= 6, "{segments}");
    for no in 1..segments as u32 {
        assert!(hint_path(dir.path(), no).exists(), "segment {no} sealed");
    }
    let active = segments as u32;
    assert!(
        !hint_path(dir.path(), active).exists(),
        "the active one is not"
    );
    drop(env);
    assert!(hint_path(dir.path(), active).exists(), "until it is closed");
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    assert_eq!(env.stats().hinted_segments, segments);
    assert_eq!(held(&env, 100), (0..100).collect::<Vec<_>>());
    let before = env.stats();
    drop(env);

    // An environment without hints (an older build's) scans, and writes them for next time.
    for no in 1..=active {
        fs::remove_file(hint_path(dir.path(), no)).unwrap();
    }
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    let scanned = env.stats();
    assert_eq!(scanned.hinted_segments, 0);
    assert_eq!(
        (scanned.chunks, scanned.chunk_bytes, scanned.bytes),
        (before.chunks, before.chunk_bytes, before.bytes)
    );
    drop(env);
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    assert_eq!(env.stats().hinted_segments, segments);
    assert_eq!(held(&env, 100), (0..100).collect::<Vec<_>>());
}

#[test]
fn the_newest_segments_hint_holds_only_for_the_length_it_was_written_at() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    for i in 0..3 {
        env.put(&id(i), &data(i, 1000)).unwrap();
    }
    drop(env);
    let first = fs::read(hint_path(dir.path(), 1)).unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.stats().hinted_segments, 1);
    for i in 3..5 {
        env.put(&id(i), &data(i, 1000)).unwrap();
    }
    drop(env);
    // As if the process had died after its appends, before closing: the hint is older.
    fs::write(hint_path(dir.path(), 1), &first).unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.stats().hinted_segments, 0, "scanned");
    assert_eq!(held(&env, 5), (0..5).collect::<Vec<_>>());
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(
        env.stats().hinted_segments,
        1,
        "and hinted again once closed"
    );
    assert_eq!(held(&env, 5), (0..5).collect::<Vec<_>>());
}

#[test]
fn a_damaged_or_outdated_hint_is_not_trusted() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    for i in 0..100 {
        env.put(&id(i), &data(i, 1000)).unwrap();
    }
    let segments = env.stats().segments;
    drop(env);
    flip(&hint_path(dir.path(), 1), 30);
    let seg2 = seg_path(dir.path(), 2);
    let len = fs::metadata(&seg2).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&seg2)
        .unwrap()
        .set_len(len - 500)
        .unwrap();
    fs::write(hint_path(dir.path(), 0x99), b"an orphan").unwrap();
    let cut_short = hint_path(dir.path(), 1).with_extension("hint.tmp");
    fs::write(&cut_short, b"a hint cut short").unwrap();
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    let s = env.stats();
    assert_eq!(s.hinted_segments, segments - 2, "segments 1 and 2 scanned");
    assert_eq!(s.torn_bytes, RECORD_HEAD as u64 + 1000 - 500);
    let all = held(&env, 100);
    assert_eq!(all.len(), 99, "only the cut record is gone: {all:?}");
    assert!(
        !hint_path(dir.path(), 0x99).exists(),
        "orphan hints are removed"
    );
    assert!(!cut_short.exists(), "and hints a crash cut short");
}

#[test]
fn a_record_found_damaged_sends_its_segment_back_to_a_scan() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    for i in 0..100 {
        env.put(&id(i), &data(i, 1000)).unwrap();
    }
    drop(env);
    // The first record of segment 1 is chunk 0; damage its data.
    flip(
        &seg_path(dir.path(), 1),
        HEADER_LEN + RECORD_HEAD as u64 + 10,
    );
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    assert!(matches!(env.get(&id(0)), Err(StoreError::Corrupt(_))));
    assert!(!hint_path(dir.path(), 1).exists());
    drop(env);
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    assert!(!env.contains(&id(0)).unwrap(), "the scan left it out");
    assert_eq!(env.stats().skipped_records, 1);
    assert_eq!(held(&env, 100), (1..100).collect::<Vec<_>>());
}

#[test]
fn second_open_is_refused() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    match Environment::open(dir.path(), small()) {
        Err(StoreError::Refused(m)) => assert!(m.contains("in use by another process"), "{m}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    drop(env);
    Environment::open(dir.path(), small()).unwrap();
}

#[test]
fn full_disk_leaves_the_store_consistent() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    env.put(&id(1), &data(1, 500)).unwrap();
    let before = env.stats();
    env.writer().space_left = Some(200);
    match env.put(&id(2), &data(2, 500)) {
        Err(StoreError::Io(e)) => {
            assert_eq!(e.kind(), io::ErrorKind::StorageFull);
            let m = e.to_string();
            assert!(m.contains("disk is full") && m.contains("removed"), "{m}");
        }
        other => panic!("expected Io, got {other:?}"),
    }
    assert_eq!(env.stats().bytes, before.bytes);
    assert_eq!(
        fs::metadata(seg_path(dir.path(), 1)).unwrap().len(),
        before.bytes
    );
    assert_eq!(env.get(&id(2)).unwrap(), None);
    env.writer().space_left = None;
    env.put(&id(3), &data(3, 500)).unwrap();
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    let s = env.stats();
    assert_eq!((s.chunks, s.torn_bytes, s.skipped_records), (2, 0, 0));
    assert_eq!(env.get(&id(3)).unwrap(), Some(data(3, 500)));
}

#[test]
fn full_disk_on_the_first_record_of_a_segment() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    let mut n = 0;
    while env.stats().segments == 1 {
        env.put(&id(n), &data(n, 1000)).unwrap();
        n += 1;
    }
    env.writer().space_left = Some(0);
    assert!(matches!(
        env.put(&id(1000), &data(1000, 1000)),
        Err(StoreError::Io(_))
    ));
    env.writer().space_left = None;
    env.put(&id(1000), &data(1000, 1000)).unwrap();
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.stats().chunks, n + 1);
    assert_eq!(env.stats().torn_bytes, 0);
}

fn sketch(n: u64, after: Option<u64>, features: usize) -> Sketch {
    Sketch {
        id: id(n),
        after: after.map(id),
        features: (0..features as u64)
            .map(|f| xxh3_64(&[n as u8, f as u8]))
            .collect(),
    }
}

fn sketch_path(dir: &Path) -> PathBuf {
    dir.join(sketch::FILE_NAME)
}

fn sketch_file_len(dir: &Path) -> u64 {
    fs::metadata(sketch_path(dir)).unwrap().len()
}

/// Where each record of the sketch file starts, and where the last one ends.
fn sketch_offsets(dir: &Path) -> Vec<u64> {
    let b = fs::read(sketch_path(dir)).unwrap();
    let s = sketch::scan(&b);
    let mut offs: Vec<u64> = s.records.iter().map(|r| r.off as u64).collect();
    offs.push(s.end);
    offs
}

#[test]
fn sketches_survive_reopen() {
    let dir = TempDir::new().unwrap();
    let kept: Vec<Sketch> = (0..5)
        .map(|n| sketch(n, n.checked_sub(1), n as usize * 7))
        .collect();
    {
        let env = Environment::open(dir.path(), small()).unwrap();
        assert_eq!(env.recall().unwrap(), vec![]);
        for n in 0..5 {
            env.put(&id(n), &data(n, 100)).unwrap();
        }
        env.remember(&kept[..2]).unwrap();
        env.remember(&[]).unwrap();
        env.remember(&kept[2..]).unwrap();
        env.sync().unwrap();
        assert_eq!(env.recall().unwrap(), kept);
        assert_eq!(env.stats().sketch_bytes, sketch_file_len(dir.path()));
    }
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.recall().unwrap(), kept);
    let s = env.stats();
    assert_eq!((s.sketch_cut_bytes, s.sketches_set_aside), (0, false));
    assert_eq!(s.sketch_compactions, 0);
    assert_eq!(
        env.recall_newest(2).unwrap(),
        kept[3..],
        "only the newest past the limit"
    );
}

#[test]
fn a_sketch_remembered_again_counts_once_at_its_newest_place() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    for n in 0..3 {
        env.put(&id(n), b"x").unwrap();
    }
    let (a, b, c) = (sketch(0, None, 2), sketch(1, None, 2), sketch(2, None, 2));
    let b_elsewhere = sketch(1, Some(2), 2);
    env.remember(&[a.clone(), b.clone(), c.clone()]).unwrap();
    env.remember(&[a.clone(), b_elsewhere.clone()]).unwrap();
    assert_eq!(env.recall().unwrap(), vec![b, c, a, b_elsewhere]);
}

#[test]
fn recall_drops_evicted_chunks() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    let early: Vec<Sketch> = (0..5).map(|n| sketch(n, None, 3)).collect();
    let late: Vec<Sketch> = (395..400).map(|n| sketch(n, Some(n - 1), 3)).collect();
    for n in 0..400 {
        env.put(&id(n), &data(n, 1000)).unwrap();
        if n == 4 {
            env.remember(&early).unwrap();
        }
    }
    env.remember(&late).unwrap();
    assert!(env.stats().evicted_chunks > 0 && !env.contains(&id(4)).unwrap());
    assert_eq!(env.recall().unwrap(), late);
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.recall().unwrap(), late);
}

#[test]
fn torn_sketch_tail_is_cut_at_open() {
    let dir = TempDir::new().unwrap();
    let all: Vec<Sketch> = (0..5).map(|n| sketch(n, None, 4)).collect();
    {
        let env = Environment::open(dir.path(), small()).unwrap();
        for n in 0..6 {
            env.put(&id(n), b"x").unwrap();
        }
        env.remember(&all).unwrap();
    }
    let offs = sketch_offsets(dir.path());
    let cut = offs[4] + 10;
    fs::OpenOptions::new()
        .write(true)
        .open(sketch_path(dir.path()))
        .unwrap()
        .set_len(cut)
        .unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    let s = env.stats();
    assert_eq!((s.sketch_cut_bytes, s.torn_bytes, s.chunks), (10, 0, 6));
    assert_eq!(sketch_file_len(dir.path()), offs[4]);
    assert_eq!(env.recall().unwrap(), all[..4]);
    let more = sketch(5, Some(4), 1);
    env.remember(std::slice::from_ref(&more)).unwrap();
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.stats().sketch_cut_bytes, 0);
    let mut want = all[..4].to_vec();
    want.push(more);
    assert_eq!(env.recall().unwrap(), want);
}

#[test]
fn damaged_sketch_record_cuts_the_file_back_to_it() {
    let dir = TempDir::new().unwrap();
    let all: Vec<Sketch> = (0..5).map(|n| sketch(n, Some(n + 1), 4)).collect();
    {
        let env = Environment::open(dir.path(), small()).unwrap();
        for n in 0..6 {
            env.put(&id(n), b"x").unwrap();
        }
        env.remember(&all).unwrap();
    }
    let offs = sketch_offsets(dir.path());
    flip(&sketch_path(dir.path()), offs[2] + 40);
    let env = Environment::open(dir.path(), small()).unwrap();
    let s = env.stats();
    assert_eq!(s.sketch_cut_bytes, offs[5] - offs[2]);
    assert_eq!((s.chunks, s.skipped_records), (6, 0));
    assert_eq!(env.recall().unwrap(), all[..2]);
    env.remember(&all[4..]).unwrap();
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.stats().sketch_cut_bytes, 0);
    assert_eq!(
        env.recall().unwrap(),
        vec![all[0].clone(), all[1].clone(), all[4].clone()]
    );
}

#[test]
fn unreadable_sketch_file_is_set_aside() {
    for damage in ["magic", "version", "checksum", "short"] {
        let dir = TempDir::new().unwrap();
        {
            let env = Environment::open(dir.path(), small()).unwrap();
            env.put(&id(1), b"kept").unwrap();
            env.remember(&[sketch(1, None, 2)]).unwrap();
        }
        let path = sketch_path(dir.path());
        let mut b = fs::read(&path).unwrap();
        match damage {
            "magic" => b[0] ^= 1,
            "version" => b[8..12].copy_from_slice(&2u32.to_le_bytes()),
            "checksum" => b[17] ^= 1,
            _ => b.truncate(5),
        }
        fs::write(&path, &b).unwrap();
        let env = Environment::open(dir.path(), small()).unwrap();
        assert!(env.stats().sketches_set_aside, "{damage}");
        assert_eq!(fs::read(dir.path().join(sketch::BAD_NAME)).unwrap(), b);
        assert_eq!(sketch_file_len(dir.path()), sketch::HEADER_LEN);
        assert_eq!(env.recall().unwrap(), vec![], "{damage}");
        assert_eq!(env.get(&id(1)).unwrap().as_deref(), Some(&b"kept"[..]));
        env.remember(&[sketch(1, None, 3)]).unwrap();
        drop(env);
        let env = Environment::open(dir.path(), small()).unwrap();
        assert!(!env.stats().sketches_set_aside);
        assert_eq!(env.recall().unwrap(), vec![sketch(1, None, 3)]);
    }
}

#[test]
fn compaction_at_open_keeps_live_records_in_order() {
    let dir = TempDir::new().unwrap();
    let cfg = EnvConfig {
        max_bytes: 1 << 30,
        ..small()
    };
    let mut live = Vec::new();
    {
        let env = Environment::open(dir.path(), cfg.clone()).unwrap();
        for n in 0..100 {
            env.put(&id(n), b"x").unwrap();
        }
        for round in 0..40u64 {
            let dead: Vec<Sketch> = (0..100)
                .map(|i| sketch(1000 + round * 100 + i, None, 32))
                .collect();
            env.remember(&dead).unwrap();
            let s = sketch(round, Some(round + 1), 5);
            env.remember(std::slice::from_ref(&s)).unwrap();
            live.push(s);
        }
        assert!(env.stats().sketch_bytes > COMPACT_AT_OPEN);
        assert_eq!(env.recall().unwrap(), live);
    }
    let env = Environment::open(dir.path(), cfg.clone()).unwrap();
    let s = env.stats();
    assert_eq!(s.sketch_compactions, 1);
    let mut one = Vec::new();
    sketch::encode_record(&mut one, &live[0]);
    assert_eq!(s.sketch_bytes, sketch::HEADER_LEN + 40 * one.len() as u64);
    assert_eq!(sketch_file_len(dir.path()), s.sketch_bytes);
    assert!(!dir.path().join(sketch::TMP_NAME).exists());
    assert_eq!(env.recall().unwrap(), live);
    env.remember(&[sketch(99, None, 1)]).unwrap();
    live.push(sketch(99, None, 1));
    drop(env);
    let env = Environment::open(dir.path(), cfg).unwrap();
    assert_eq!(env.stats().sketch_compactions, 0);
    assert_eq!(env.recall().unwrap(), live);
}

#[test]
fn remember_compacts_when_the_file_outgrows_its_bound() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    let bound = small().max_bytes / 32;
    for n in 0..10 {
        env.put(&id(n), b"x").unwrap();
    }
    let mut all = Vec::new();
    for i in 0..200 {
        let s = sketch(i % 10, Some(i), 2);
        env.remember(std::slice::from_ref(&s)).unwrap();
        all.push(s);
        let bytes = env.stats().sketch_bytes;
        assert!(bytes <= bound + 200, "after {i}: {bytes} bytes");
        assert_eq!(sketch_file_len(dir.path()), bytes);
    }
    assert!(env.stats().sketch_compactions > 5);
    let got = env.recall().unwrap();
    assert!(got.len() >= 10, "{} kept", got.len());
    assert_eq!(got, all[all.len() - got.len()..], "the newest, in order");
}

#[test]
fn full_disk_during_remember_leaves_the_sketch_file_as_it_was() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    for n in 0..4 {
        env.put(&id(n), b"x").unwrap();
    }
    let first = sketch(0, None, 3);
    env.remember(std::slice::from_ref(&first)).unwrap();
    let before = sketch_file_len(dir.path());
    env.writer().space_left = Some(50);
    match env.remember(&[sketch(1, None, 3), sketch(2, None, 3)]) {
        Err(StoreError::Io(e)) => {
            assert_eq!(e.kind(), io::ErrorKind::StorageFull);
            let m = e.to_string();
            assert!(
                m.contains("sketches") && m.contains("disk is full") && m.contains("removed"),
                "{m}"
            );
        }
        other => panic!("expected Io, got {other:?}"),
    }
    assert_eq!(sketch_file_len(dir.path()), before);
    assert_eq!(env.stats().sketch_bytes, before);
    assert_eq!(env.recall().unwrap(), vec![first.clone()]);
    env.writer().space_left = None;
    let next = sketch(3, Some(0), 1);
    env.remember(std::slice::from_ref(&next)).unwrap();
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.stats().sketch_cut_bytes, 0);
    assert_eq!(env.recall().unwrap(), vec![first, next]);
}

#[test]
fn remember_refuses_too_many_features() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    env.put(&id(1), b"x").unwrap();
    let before = sketch_file_len(dir.path());
    let max = sketch(1, None, crate::store::MAX_SKETCH_FEATURES);
    let over = sketch(1, None, crate::store::MAX_SKETCH_FEATURES + 1);
    match env.remember(&[max.clone(), over]) {
        Err(StoreError::Refused(m)) => assert!(m.contains("33 features"), "{m}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_eq!(
        sketch_file_len(dir.path()),
        before,
        "nothing of the batch written"
    );
    env.remember(std::slice::from_ref(&max)).unwrap();
    assert_eq!(env.recall().unwrap(), vec![max]);
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u16),
    Get(u8),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), 0u16..3000).prop_map(|(k, l)| Op::Put(k, l)),
        4 => any::<u8>().prop_map(Op::Get),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn matches_a_hashmap_model(ops in prop::collection::vec(op(), 1..120)) {
        let dir = TempDir::new().unwrap();
        let cfg = EnvConfig { max_bytes: 64 << 20, segment_bytes: 32 << 10, second_chance: true };
        let mut env = Environment::open(dir.path(), cfg.clone()).unwrap();
        let mut model: HashMap<u8, Vec<u8>> = HashMap::new();
        for op in ops {
            match op {
                Op::Put(k, len) => {
                    let d = data(u64::from(k) ^ u64::from(len), len as usize);
                    env.put(&id(u64::from(k)), &d).unwrap();
                    model.entry(k).or_insert(d);
                }
                Op::Get(k) => {
                    prop_assert_eq!(env.get(&id(u64::from(k))).unwrap(), model.get(&k).cloned());
                }
                Op::Reopen => {
                    drop(env);
                    env = Environment::open(dir.path(), cfg.clone()).unwrap();
                }
            }
        }
        prop_assert_eq!(env.stats().chunks, model.len() as u64);
        for (k, d) in &model {
            prop_assert_eq!(env.get(&id(u64::from(*k))).unwrap(), Some(d.clone()));
        }
    }

    #[test]
    fn arbitrary_sketch_file_bytes_never_stop_open(body in prop::collection::vec(any::<u8>(), 0..600), header in any::<bool>()) {
        let dir = TempDir::new().unwrap();
        let mut b = if header { sketch::encode_header().to_vec() } else { Vec::new() };
        b.extend_from_slice(&body);
        fs::write(sketch_path(dir.path()), &b).unwrap();
        let env = Environment::open(dir.path(), small()).unwrap();
        prop_assert_eq!(env.recall().unwrap(), vec![]);
        env.put(&id(1), b"x").unwrap();
        let s = sketch(1, Some(2), 3);
        env.remember(std::slice::from_ref(&s)).unwrap();
        drop(env);
        let env = Environment::open(dir.path(), small()).unwrap();
        prop_assert_eq!(env.recall().unwrap(), vec![s]);
    }

    #[test]
    fn arbitrary_segment_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..600), header in any::<bool>()) {
        let dir = TempDir::new().unwrap();
        let mut b = if header { segment::encode_header(1).to_vec() } else { Vec::new() };
        b.extend_from_slice(&body);
        fs::write(seg_path(dir.path(), 1), &b).unwrap();
        if let Ok(env) = Environment::open(dir.path(), small()) {
            let _ = env.get(&id(0));
            env.put(&id(1), b"still usable").unwrap();
            prop_assert_eq!(env.get(&id(1)).unwrap(), Some(b"still usable".to_vec()));
        }
    }
}

fn joined(ns: &[u64], len: usize) -> Vec<u8> {
    ns.iter().flat_map(|&n| data(n, len)).collect()
}

#[test]
fn a_recipe_keeps_a_chunk_as_its_parts_and_reads_back_whole() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    for n in 1..=3 {
        env.put(&id(n), &data(n, 1000)).unwrap();
    }
    let parts = [id(1), id(2), id(3)];
    let before = env.stats().chunk_bytes;
    assert!(env.put_recipe(&id(9), 3000, &parts).unwrap());
    assert_eq!(
        env.stats().chunk_bytes - before,
        4 + 3 * 32,
        "ids, not bytes"
    );
    assert!(env.contains(&id(9)).unwrap());
    assert_eq!(
        env.contains_many(&[id(9), id(8)]).unwrap(),
        vec![true, false]
    );
    assert_eq!(env.get(&id(9)).unwrap(), Some(joined(&[1, 2, 3], 1000)));
    assert!(
        env.put_recipe(&id(9), 3000, &parts).unwrap(),
        "held already"
    );
    assert!(
        !env.put_recipe(&id(7), 2999, &parts).unwrap(),
        "lengths must add up"
    );
    assert!(
        !env.put_recipe(&id(7), 4000, &[id(1), id(2), id(3), id(4)])
            .unwrap(),
        "a part not held"
    );
    env.put(&id(4), &data(4, 1000)).unwrap();
    assert!(
        env.put_recipe(&id(8), 4000, &[id(9), id(4)]).unwrap(),
        "a recipe part stands for its parts"
    );
    assert_eq!(env.get(&id(8)).unwrap(), Some(joined(&[1, 2, 3, 4], 1000)));
    assert!(!env.put_recipe(&id(7), 0, &[]).unwrap());
    drop(env);

    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    assert_eq!(env.stats().hinted_segments, 1);
    assert_eq!(env.get(&id(9)).unwrap(), Some(joined(&[1, 2, 3], 1000)));
    drop(env);
    fs::remove_file(hint_path(dir.path(), 1)).unwrap();
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    assert_eq!(env.stats().hinted_segments, 0, "scanned");
    assert_eq!(env.get(&id(9)).unwrap(), Some(joined(&[1, 2, 3], 1000)));
}

/// An environment where chunk 9 was kept as a recipe of chunks 1 and 2, whose segment was
/// then evicted.
fn with_a_recipe_that_lost_its_parts(dir: &TempDir) -> Environment {
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    env.put(&id(1), &data(1, 1000)).unwrap();
    env.put(&id(2), &data(2, 1000)).unwrap();
    let mut n = 100;
    while env.stats().segments < 2 {
        env.put(&id(n), &data(n, 1000)).unwrap();
        n += 1;
    }
    assert!(env.put_recipe(&id(9), 2000, &[id(1), id(2)]).unwrap());
    while env.stats().evictions == 0 {
        env.put(&id(n), &data(n, 1000)).unwrap();
        n += 1;
    }
    env
}

#[test]
fn a_recipe_that_lost_a_part_is_not_held_and_gives_way_to_the_bytes() {
    let dir = TempDir::new().unwrap();
    let env = with_a_recipe_that_lost_its_parts(&dir);
    assert_eq!(env.get(&id(1)).unwrap(), None, "the parts' segment went");
    assert!(
        !env.put_recipe(&id(9), 2000, &[id(1), id(2)]).unwrap(),
        "parts gone"
    );
    assert!(!env.contains(&id(9)).unwrap());
    assert_eq!(env.get(&id(9)).unwrap(), None);
    env.put(&id(9), &joined(&[1, 2], 1000)).unwrap();
    assert_eq!(env.get(&id(9)).unwrap(), Some(joined(&[1, 2], 1000)));
}

#[test]
fn a_recipe_that_lost_a_part_gives_way_to_a_new_recipe() {
    let dir = TempDir::new().unwrap();
    let env = with_a_recipe_that_lost_its_parts(&dir);
    // The parts arrive again: the dead recipe must not pass for held.
    env.put(&id(3), &data(1, 1000)).unwrap();
    env.put(&id(4), &data(2, 1000)).unwrap();
    assert!(env.put_recipe(&id(9), 2000, &[id(3), id(4)]).unwrap());
    assert_eq!(env.get(&id(9)).unwrap(), Some(joined(&[1, 2], 1000)));
}

#[test]
fn second_chance_keeps_a_used_recipe_with_its_parts() {
    let dir = TempDir::new().unwrap();
    let config = EnvConfig {
        second_chance: true,
        ..hinted_config()
    };
    let env = Environment::open(dir.path(), config.clone()).unwrap();
    env.put(&id(1), &data(1, 1000)).unwrap();
    env.put(&id(2), &data(2, 1000)).unwrap();
    assert!(env.put_recipe(&id(9), 2000, &[id(1), id(2)]).unwrap());
    assert!(env.contains(&id(9)).unwrap(), "used: recipe and parts");
    let mut n = 100;
    while env.stats().evictions == 0 {
        env.put(&id(n), &data(n, 1000)).unwrap();
        n += 1;
    }
    assert!(env.stats().rescued_chunks >= 3);
    assert_eq!(env.get(&id(9)).unwrap(), Some(joined(&[1, 2], 1000)));
    drop(env);
    let env = Environment::open(dir.path(), config).unwrap();
    assert_eq!(env.get(&id(9)).unwrap(), Some(joined(&[1, 2], 1000)));
}

#[test]
fn recipes_start_a_new_segment_after_one_of_the_older_format() {
    let dir = TempDir::new().unwrap();
    let mut b = segment::encode_header_version(1, 1).to_vec();
    for n in 1..=2 {
        let (off, d) = (b.len() as u64, data(n, 1000));
        segment::encode_record(&mut b, 1, off, &id(n), &d, xxh3_64(&d), false);
    }
    fs::write(seg_path(dir.path(), 1), &b).unwrap();
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    assert_eq!(
        env.get(&id(2)).unwrap(),
        Some(data(2, 1000)),
        "version 1 is read"
    );
    assert!(env.put_recipe(&id(9), 2000, &[id(1), id(2)]).unwrap());
    assert_eq!(env.stats().segments, 2);
    assert_eq!(
        fs::read(seg_path(dir.path(), 1)).unwrap(),
        b,
        "left as it was"
    );
    drop(env);
    let env = Environment::open(dir.path(), hinted_config()).unwrap();
    assert_eq!(env.get(&id(9)).unwrap(), Some(joined(&[1, 2], 1000)));
}

#[test]
fn notes_survive_reopen_and_a_damaged_one_reads_as_none() {
    let dir = TempDir::new().unwrap();
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(env.note("adaptive-lan").unwrap(), None);
    env.keep_note("adaptive-lan", b"first").unwrap();
    env.keep_note("adaptive-lan", b"second").unwrap();
    env.keep_note("adaptive-wan", b"far").unwrap();
    assert!(matches!(
        env.keep_note("../escape", b"x"),
        Err(StoreError::Refused(_))
    ));
    assert!(matches!(
        env.keep_note("big", &vec![0; MAX_NOTE_BYTES + 1]),
        Err(StoreError::Refused(_))
    ));
    drop(env);
    let env = Environment::open(dir.path(), small()).unwrap();
    assert_eq!(
        env.note("adaptive-lan").unwrap().as_deref(),
        Some(&b"second"[..])
    );
    assert_eq!(
        env.note("adaptive-wan").unwrap().as_deref(),
        Some(&b"far"[..])
    );
    let path = dir.path().join(note::file_name("adaptive-lan"));
    flip(&path, 22);
    assert_eq!(env.note("adaptive-lan").unwrap(), None, "damaged");
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
    assert_eq!(env.note("adaptive-lan").unwrap(), None, "not a note");
    env.keep_note("adaptive-lan", b"again").unwrap();
    assert_eq!(
        env.note("adaptive-lan").unwrap().as_deref(),
        Some(&b"again"[..])
    );
    assert_eq!(env.stats().chunks, 0, "notes are not chunks");
}
