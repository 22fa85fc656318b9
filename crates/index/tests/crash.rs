//! Crash safety: truncated and damaged logs must open to a valid prefix or fail with a clear
//! `Error::Corrupt`, never panic and never answer wrongly.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use dedupwire_index::{Config, Error, FeatureIndex, CHECKPOINT_FILE, LOG_FILE};

const FEATURES: u64 = 300;
const MAX: usize = 6;

fn config() -> Config {
    Config {
        max_per_feature: MAX,
        cache_pages: 2,
        initial_features: 64,
        compact_min_bytes: u64::MAX, // keep the log as written
        checkpoint_on_close: false,
        ..Config::default()
    }
}

/// A recorded history: step i inserted `ops[i]` and the flushed log then ended at `ends[i]`.
struct History {
    ops: Vec<(u64, u64)>,
    ends: Vec<u64>,
    /// Log length made durable by the last `sync` before the final inserts.
    synced: u64,
}

impl History {
    /// The model state after the longest prefix of steps whose log ends at or before `len`.
    fn state_at(&self, len: u64) -> HashMap<u64, VecDeque<u64>> {
        let mut m: HashMap<u64, VecDeque<u64>> = HashMap::new();
        for (i, &(r, f)) in self.ops.iter().enumerate() {
            if self.ends[i] > len {
                break;
            }
            let l = m.entry(f).or_default();
            l.retain(|&x| x != r);
            l.push_front(r);
            l.truncate(MAX);
        }
        m
    }
}

fn rand(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Builds an index of single-feature inserts (one log entry each), syncing every `sync_every`.
fn build(dir: &Path, steps: usize, sync_every: usize) -> History {
    let mut ix = FeatureIndex::open(dir, config()).unwrap();
    let mut x = 0x0bad_cafe_u64;
    let mut h = History {
        ops: Vec::new(),
        ends: Vec::new(),
        synced: 0,
    };
    for i in 0..steps {
        let r = i as u64;
        let f = rand(&mut x) % FEATURES;
        ix.insert(r, &[f]).unwrap();
        if sync_every > 0 && i % sync_every == 0 && i + 20 < steps {
            ix.sync().unwrap();
            h.synced = ix.stats().log_bytes;
        } else {
            ix.flush().unwrap();
        }
        h.ops.push((r, f));
        h.ends.push(ix.stats().log_bytes);
    }
    drop(ix);
    h
}

fn copy_to(src: &Path, bytes: &[u8]) -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    std::fs::write(dst.path().join(LOG_FILE), bytes).unwrap();
    if let Ok(c) = std::fs::read(src.join(CHECKPOINT_FILE)) {
        std::fs::write(dst.path().join(CHECKPOINT_FILE), c).unwrap();
    }
    dst
}

/// Asserts the reopened index answers exactly like `expected` (and stays usable).
fn assert_state(ix: &mut FeatureIndex, expected: &HashMap<u64, VecDeque<u64>>, what: &str) {
    for f in 0..FEATURES {
        let want: Vec<u64> = expected
            .get(&f)
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default();
        assert_eq!(ix.get(f).unwrap(), want, "{what}: feature {f}");
    }
    assert_eq!(ix.stats().features, expected.len() as u64, "{what}");
}

#[test]
fn truncation_at_any_offset_opens_the_valid_prefix() {
    let src = tempfile::tempdir().unwrap();
    let h = build(src.path(), 2500, 0);
    let log = std::fs::read(src.path().join(LOG_FILE)).unwrap();
    assert!(log.len() as u64 > 2 * dedupwire_index::PAGE_SIZE);
    let mut cuts: Vec<u64> = vec![0, 1, 31, 32, 33, log.len() as u64];
    for &e in h.ends.iter().step_by(97) {
        cuts.extend([e - 1, e, e + 1]);
    }
    let mut x = 42u64;
    for _ in 0..150 {
        cuts.push(rand(&mut x) % log.len() as u64);
    }
    for cut in cuts {
        let cut = cut.min(log.len() as u64);
        let dst = copy_to(src.path(), &log[..cut as usize]);
        match FeatureIndex::open(dst.path(), config()) {
            Ok(mut ix) => {
                assert!(cut >= 32, "a log without its header opened (cut {cut})");
                let len = ix.stats().log_bytes;
                assert!(len <= cut, "log grew: {len} > {cut}");
                if len < cut {
                    let t = ix
                        .recovery()
                        .truncation
                        .clone()
                        .expect("truncation reported");
                    assert_eq!((t.offset, t.discarded), (len, cut - len));
                }
                // The index ends exactly on a step boundary (or padding after one).
                let expected = h.state_at(len);
                assert_state(&mut ix, &expected, &format!("cut {cut}"));
                // … and is usable: insert, reopen, find it.
                ix.insert(1 << 40, &[5]).unwrap();
                drop(ix);
                let mut ix = FeatureIndex::open(dst.path(), config()).unwrap();
                assert!(ix.recovery().truncation.is_none());
                assert_eq!(ix.get(5).unwrap()[0], 1 << 40);
            }
            Err(Error::Corrupt { offset, .. }) => {
                assert!(cut < 32, "cut {cut} gave Corrupt at {offset}");
                assert_eq!(offset, 0);
            }
            Err(e) => panic!("cut {cut}: unexpected error {e}"),
        }
    }
}

#[test]
fn flipped_bytes_are_an_error_or_a_truncation_never_wrong_answers() {
    let src = tempfile::tempdir().unwrap();
    let h = build(src.path(), 2500, 10);
    let log = std::fs::read(src.path().join(LOG_FILE)).unwrap();
    let full = log.len() as u64;
    let mut x = 7u64;
    let (mut corrupt, mut truncated, mut unchanged) = (0, 0, 0);
    for round in 0..400 {
        let at = if round < 20 {
            round as u64 // the header
        } else {
            32 + rand(&mut x) % (full - 32)
        };
        let mask = (rand(&mut x) % 255 + 1) as u8;
        let mut bytes = log.clone();
        bytes[at as usize] ^= mask;
        let dst = copy_to(src.path(), &bytes);
        match FeatureIndex::open(dst.path(), config()) {
            Ok(mut ix) => {
                assert!(at >= 32, "damaged header at {at} went unnoticed");
                let len = ix.stats().log_bytes;
                if len < full {
                    // Only bytes never proven durable may be cut off as a torn write.
                    assert!(
                        at >= h.synced,
                        "flip at {at} (synced {}) truncated to {len}",
                        h.synced
                    );
                    assert!(len <= at);
                    truncated += 1;
                } else {
                    unchanged += 1; // the flip hit unchecked padding
                }
                let expected = h.state_at(len);
                assert_state(&mut ix, &expected, &format!("flip at {at}"));
            }
            Err(Error::Corrupt {
                path,
                offset,
                reason,
            }) => {
                assert!(offset <= at, "corruption at {at} reported at {offset}");
                assert!(path.ends_with(LOG_FILE));
                assert!(!reason.is_empty());
                corrupt += 1;
            }
            Err(e) => panic!("flip at {at}: unexpected error {e}"),
        }
    }
    eprintln!("corrupt {corrupt} truncated {truncated} unchanged {unchanged}");
    assert!(
        corrupt > 300,
        "corrupt {corrupt} truncated {truncated} unchanged {unchanged}"
    );
    assert!(truncated > 0 || unchanged > 0);
}

#[test]
fn checkpoint_proves_durability_and_a_bad_checkpoint_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        checkpoint_on_close: true,
        ..config()
    };
    let mut ix = FeatureIndex::open(dir.path(), cfg.clone()).unwrap();
    for r in 0..1000u64 {
        ix.insert(r, &[r % 50, 1000 + r % 7]).unwrap();
    }
    ix.close().unwrap();
    let ckpt_len = std::fs::metadata(dir.path().join(LOG_FILE)).unwrap().len();
    // More inserts after the checkpoint, then a crash (no close).
    let mut ix = FeatureIndex::open(dir.path(), cfg.clone()).unwrap();
    assert!(ix.recovery().checkpoint_used);
    for r in 1000..1100u64 {
        ix.insert(r, &[r % 50]).unwrap();
    }
    drop(ix);
    let log = std::fs::read(dir.path().join(LOG_FILE)).unwrap();

    // Cutting into the post-checkpoint part is a torn tail: checkpoint + replay of the rest.
    let cut = ckpt_len + (log.len() as u64 - ckpt_len) / 2 / 8 * 8 + 3; // never an entry boundary
    let d = copy_to(dir.path(), &log[..cut as usize]);
    let mut ix = FeatureIndex::open(d.path(), cfg.clone()).unwrap();
    assert!(ix.recovery().checkpoint_used);
    assert!(ix.recovery().truncation.is_some());
    assert!(ix.get(0).unwrap().len() == MAX);
    drop(ix);

    // Cutting below the checkpoint's length loses durable data: an error.
    let d = copy_to(dir.path(), &log[..(ckpt_len - 100) as usize]);
    match FeatureIndex::open(d.path(), cfg.clone()) {
        Err(Error::Corrupt { .. }) => {}
        other => panic!("expected Corrupt, got {other:?}"),
    }

    // A damaged checkpoint is ignored and the log rebuilt; answers are unchanged.
    let mut want = Vec::new();
    let mut ix = FeatureIndex::open(dir.path(), cfg.clone()).unwrap();
    for f in 0..60 {
        want.push(ix.get(f).unwrap());
    }
    ix.close().unwrap();
    let ck = dir.path().join(CHECKPOINT_FILE);
    let mut c = std::fs::read(&ck).unwrap();
    let mid = c.len() / 2;
    c[mid] ^= 0x40;
    std::fs::write(&ck, c).unwrap();
    let mut ix = FeatureIndex::open(dir.path(), cfg).unwrap();
    assert!(!ix.recovery().checkpoint_used);
    assert!(ix.recovery().checkpoint_ignored.is_some());
    for f in 0..60 {
        assert_eq!(ix.get(f).unwrap(), want[f as usize]);
    }
}

#[test]
fn leftovers_of_an_interrupted_compaction_are_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = FeatureIndex::open(dir.path(), config()).unwrap();
    ix.insert(1, &[1, 2, 3]).unwrap();
    ix.close().unwrap();
    std::fs::write(dir.path().join("features.log.compact"), b"half a log").unwrap();
    let mut ix = FeatureIndex::open(dir.path(), config()).unwrap();
    assert_eq!(ix.lookup(&[1, 2, 3]).unwrap(), vec![(1, 3)]);
    assert!(!dir.path().join("features.log.compact").exists());
}

#[test]
fn damage_found_while_running_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        cache_pages: 1,
        ..config()
    };
    let mut ix = FeatureIndex::open(dir.path(), cfg).unwrap();
    for r in 0..10_000u64 {
        ix.insert(r, &[r]).unwrap();
    }
    ix.sync().unwrap();
    assert!(ix.stats().log_bytes > 3 * dedupwire_index::PAGE_SIZE);
    // Damage feature 0's entry (first page) behind the index's back.
    let path = dir.path().join(LOG_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[32 + 8] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    ix.get(9999).unwrap(); // the last pages are in RAM
    match ix.lookup(&[0]) {
        Err(Error::Corrupt { offset, .. }) => assert_eq!(offset, 32),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
