//! The index against a simple in-memory model, over random operation sequences that include
//! close/reopen (with and without a checkpoint), compaction and table growth.

use std::collections::{HashMap, VecDeque};

use dedupwire_index::{Config, FeatureIndex};
use proptest::prelude::*;

/// The reference: feature → records newest first, at most `max` per feature.
struct Model {
    max: usize,
    lists: HashMap<u64, VecDeque<u64>>,
}

impl Model {
    fn insert(&mut self, record: u64, features: &[u64]) {
        let mut seen = Vec::new();
        for &f in features {
            if seen.contains(&f) {
                continue;
            }
            seen.push(f);
            let l = self.lists.entry(f).or_default();
            l.retain(|&x| x != record);
            l.push_front(record);
            l.truncate(self.max);
        }
    }

    fn remove(&mut self, record: u64, features: &[u64]) {
        for f in features {
            if let Some(l) = self.lists.get_mut(f) {
                l.retain(|&x| x != record);
                if l.is_empty() {
                    self.lists.remove(f);
                }
            }
        }
    }

    fn get(&self, f: u64) -> Vec<u64> {
        self.lists
            .get(&f)
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default()
    }

    fn lookup(&self, features: &[u64]) -> Vec<(u64, u32)> {
        let mut counts: HashMap<u64, u32> = HashMap::new();
        let mut seen = Vec::new();
        for &f in features {
            if seen.contains(&f) {
                continue;
            }
            seen.push(f);
            for r in self.get(f) {
                *counts.entry(r).or_default() += 1;
            }
        }
        let mut out: Vec<(u64, u32)> = counts.into_iter().collect();
        out.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        out
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u64, Vec<u64>),
    Remove(u64, Vec<u64>),
    Lookup(Vec<u64>),
    Sync,
    Compact,
    /// Close (with or without a checkpoint) and reopen.
    Close(bool),
    /// Drop without closing (no checkpoint; an older one may remain) and reopen.
    Drop,
}

fn feature() -> impl Strategy<Value = u64> {
    // Mostly a small domain (so that lists fill up and get evicted), sometimes anything.
    prop_oneof![4 => 0u64..48, 1 => any::<u64>()]
}

fn op() -> impl Strategy<Value = Op> {
    let sketch = || prop::collection::vec(feature(), 0..10);
    prop_oneof![
        20 => (0u64..60, sketch()).prop_map(|(r, f)| Op::Insert(r, f)),
        4 => (0u64..60, sketch()).prop_map(|(r, f)| Op::Remove(r, f)),
        6 => sketch().prop_map(Op::Lookup),
        1 => Just(Op::Sync),
        1 => Just(Op::Compact),
        1 => any::<bool>().prop_map(Op::Close),
        1 => Just(Op::Drop),
    ]
}

fn config(max: usize) -> Config {
    Config {
        max_per_feature: max,
        cache_pages: 1,
        initial_features: 4, // tiny: the table grows many times
        compact_min_bytes: 0,
        compact_dead_ratio: 0.6,
        ..Config::default()
    }
}

fn check_all(index: &mut FeatureIndex, model: &Model, known: &[u64]) {
    for &f in known {
        assert_eq!(index.get(f).unwrap(), model.get(f), "feature {f}");
    }
    let stats = index.stats();
    assert_eq!(stats.features, model.lists.len() as u64);
    assert_eq!(
        stats.references,
        model.lists.values().map(|l| l.len() as u64).sum::<u64>()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_model(max in 1usize..6, ops in prop::collection::vec(op(), 1..250)) {
        let dir = tempfile::tempdir().unwrap();
        let mut index = Some(FeatureIndex::open(dir.path(), config(max)).unwrap());
        let mut model = Model { max, lists: HashMap::new() };
        let mut known: Vec<u64> = (0..48).collect();
        for op in &ops {
            let ix = index.as_mut().unwrap();
            match op {
                Op::Insert(r, f) => {
                    ix.insert(*r, f).unwrap();
                    model.insert(*r, f);
                    known.extend(f.iter().filter(|&&x| x >= 48));
                }
                Op::Remove(r, f) => {
                    ix.remove(*r, f).unwrap();
                    model.remove(*r, f);
                }
                Op::Lookup(f) => {
                    prop_assert_eq!(ix.lookup(f).unwrap(), model.lookup(f));
                }
                Op::Sync => ix.sync().unwrap(),
                Op::Compact => ix.compact().unwrap(),
                Op::Close(ckpt) => {
                    let mut ix = index.take().unwrap();
                    if !*ckpt {
                        ix.sync().unwrap();
                        drop(ix);
                    } else {
                        ix.close().unwrap();
                    }
                    let mut ix = FeatureIndex::open(dir.path(), config(max)).unwrap();
                    prop_assert!(ix.recovery().truncation.is_none());
                    check_all(&mut ix, &model, &known);
                    index = Some(ix);
                }
                Op::Drop => {
                    drop(index.take());
                    let mut ix = FeatureIndex::open(dir.path(), config(max)).unwrap();
                    prop_assert!(ix.recovery().truncation.is_none(), "{}", ix.recovery());
                    check_all(&mut ix, &model, &known);
                    index = Some(ix);
                }
            }
        }
        let ix = index.as_mut().unwrap();
        check_all(ix, &model, &known);
        let probe: Vec<u64> = (0..48).step_by(5).collect();
        prop_assert_eq!(ix.lookup(&probe).unwrap(), model.lookup(&probe));
        index.take().unwrap().close().unwrap();
        let mut ix = FeatureIndex::open(dir.path(), config(max)).unwrap();
        prop_assert!(ix.recovery().checkpoint_used);
        check_all(&mut ix, &model, &known);
    }
}

#[test]
fn lowering_the_bound_on_reopen_truncates_lists() {
    let dir = tempfile::tempdir().unwrap();
    let mut ix = FeatureIndex::open(dir.path(), config(5)).unwrap();
    for r in 0..5 {
        ix.insert(r, &[7]).unwrap();
    }
    ix.close().unwrap();
    let mut ix = FeatureIndex::open(dir.path(), config(2)).unwrap();
    assert_eq!(ix.get(7).unwrap(), vec![4, 3]);
    assert_eq!(ix.lookup(&[7]).unwrap(), vec![(4, 1), (3, 1)]);
    ix.insert(9, &[7]).unwrap();
    assert_eq!(ix.get(7).unwrap(), vec![9, 4]);
}

#[test]
fn many_features_across_pages_grow_and_compact() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        max_per_feature: 4,
        cache_pages: 2,
        initial_features: 16,
        compact_min_bytes: 1 << 16,
        ..Config::default()
    };
    let mut ix = FeatureIndex::open(dir.path(), cfg.clone()).unwrap();
    let mut model = Model {
        max: 4,
        lists: HashMap::new(),
    };
    let mut x = 0x1234_5678_9abc_def0u64;
    for r in 0..20_000u64 {
        let mut sketch = Vec::new();
        for _ in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            sketch.push(x % 30_000);
        }
        ix.insert(r, &sketch).unwrap();
        model.insert(r, &sketch);
    }
    let s = ix.stats();
    assert!(s.grows > 5, "{s:?}");
    assert!(s.compactions > 0, "{s:?}");
    assert!(s.log_bytes > 4 * dedupwire_index::PAGE_SIZE, "{s:?}");
    let known: Vec<u64> = (0..30_000).collect();
    check_all(&mut ix, &model, &known);
    drop(ix);
    let mut ix = FeatureIndex::open(dir.path(), cfg).unwrap();
    check_all(&mut ix, &model, &known);
}
