//! Sketch quality on a real revision stream: does sDedup's source selection find the previous
//! version of an updated document?
//!
//! Replays `shared/data/rfcs.jsonl.zst` (the history of the Rust RFCs repository as a document
//! write stream): every write's sketch goes into a [`CandidateIndex`] (id = `_id`, replaced on
//! update, removed on delete), and for each update of a live document the selected source must
//! be that document. The default test replays a prefix (fast in debug builds); the ignored one
//! replays the whole stream, and `gitignore.jsonl.zst` too
//! (`cargo test --release --test similarity_quality -- --ignored --nocapture`).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::Instant;

use dedupwire_engine::similarity::{
    select_source, CandidateIndex, SketchConfig, SuperFeatureConfig, SuperFeatureMethod,
};
use serde::Deserialize;

/// Items per feature kept by the index in these replays.
const MAX_PER_FEATURE: usize = 64;

#[derive(Deserialize)]
struct Line {
    op: String,
    #[serde(rename = "_id")]
    id: String,
    #[serde(default)]
    body: String,
}

enum Op {
    Write,
    Delete,
}

struct Write {
    op: Op,
    id: u32,
    body: String,
}

fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data")
        .join(name)
}

/// The writes of stream `name`, up to the one holding the `max_updates`-th update (all if `None`).
fn load(name: &str, max_updates: Option<usize>) -> Option<Vec<Write>> {
    let path = data_path(name);
    let Ok(file) = std::fs::File::open(&path) else {
        println!(
            "NOTICE: {} is absent: similarity quality test skipped",
            path.display()
        );
        return None;
    };
    let reader = BufReader::new(zstd::stream::read::Decoder::new(file).expect("zstd stream"));
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut writes = Vec::new();
    let mut updates = 0;
    for line in reader.lines() {
        let line: Line = serde_json::from_str(&line.expect("read line")).expect("json line");
        let next = ids.len() as u32;
        let id = *ids.entry(line.id).or_insert(next);
        let op = if line.op == "delete" {
            Op::Delete
        } else {
            Op::Write
        };
        if line.op == "update" {
            updates += 1;
        }
        writes.push(Write {
            op,
            id,
            body: line.body,
        });
        if max_updates.is_some_and(|m| updates >= m) {
            break;
        }
    }
    Some(writes)
}

#[derive(Debug, Default)]
struct Stats {
    /// Updates of a live document.
    updates: usize,
    /// Updates whose selected source is the document's previous version.
    matched: usize,
    /// Updates with no candidate at all.
    no_candidate: usize,
    /// Bytes sketched.
    bytes: usize,
    /// Index memory at the end.
    index_bytes: usize,
}

impl Stats {
    fn rate(&self) -> f64 {
        self.matched as f64 / self.updates.max(1) as f64
    }
}

/// Replays `writes`, selecting a source for every update of a live document.
fn replay(writes: &[Write], cfg: SketchConfig) -> Stats {
    let mut index = CandidateIndex::new(MAX_PER_FEATURE);
    let mut live: HashSet<u32> = HashSet::new();
    let mut stats = Stats::default();
    let mut sketch = Vec::new();
    for w in writes {
        match w.op {
            Op::Delete => {
                index.remove(&w.id);
                live.remove(&w.id);
            }
            Op::Write => {
                cfg.sketch_into(w.body.as_bytes(), &mut sketch);
                stats.bytes += w.body.len();
                if live.contains(&w.id) {
                    stats.updates += 1;
                    let candidates = index.lookup(&sketch);
                    if candidates.is_empty() {
                        stats.no_candidate += 1;
                    }
                    if select_source(&candidates, |_| false) == Some(w.id) {
                        stats.matched += 1;
                    }
                }
                index.insert(w.id, &sketch);
                live.insert(w.id);
            }
        }
    }
    stats.index_bytes = index.memory_bytes();
    stats
}

/// Replays with K = 8 at chunk_avg 64…512, prints a table, returns the default's rate.
fn measure(name: &str, writes: &[Write]) -> f64 {
    let default = SketchConfig::default();
    let mut default_rate = 0.0;
    for chunk_avg in [64, 128, 256, 512] {
        let cfg = SketchConfig { k: 8, chunk_avg };
        let t = Instant::now();
        let s = replay(writes, cfg);
        println!(
            "{name} K=8 chunk_avg={chunk_avg:>3}: {}/{} updates found their previous version \
             ({:.2}%), {} without candidate; {:.1} MB sketched in {:.2?}; index {} KiB",
            s.matched,
            s.updates,
            100.0 * s.rate(),
            s.no_candidate,
            s.bytes as f64 / 1e6,
            t.elapsed(),
            s.index_bytes / 1024,
        );
        if cfg == default {
            default_rate = s.rate();
        }
    }
    default_rate
}

/// Super-features with each whole document as one chunk: the share of updates whose version
/// shares at least one super-feature with the previous version, and the share of consecutive
/// writes of *different* documents that do (false positives). Returns Odess's rates.
fn measure_super_features(name: &str, writes: &[Write]) -> (f64, f64) {
    let mut odess = (0.0, 0.0);
    for method in [SuperFeatureMethod::Odess, SuperFeatureMethod::Finesse] {
        let cfg = SuperFeatureConfig {
            method,
            ..SuperFeatureConfig::default()
        };
        let t = Instant::now();
        let mut previous: HashMap<u32, Vec<u64>> = HashMap::new();
        let (mut updates, mut found, mut pairs, mut false_pos) = (0usize, 0usize, 0usize, 0usize);
        let mut last: Option<(u32, Vec<u64>)> = None;
        for w in writes {
            if let Op::Delete = w.op {
                previous.remove(&w.id);
                continue;
            }
            let sf = cfg.super_features(w.body.as_bytes());
            let shares = |other: &[u64]| sf.iter().zip(other).any(|(a, b)| a == b);
            if let Some(p) = previous.get(&w.id) {
                updates += 1;
                found += usize::from(shares(p));
            }
            if let Some((id, other)) = &last {
                if *id != w.id {
                    pairs += 1;
                    false_pos += usize::from(shares(other));
                }
            }
            previous.insert(w.id, sf.clone());
            last = Some((w.id, sf));
        }
        let rate = found as f64 / updates.max(1) as f64;
        let fp = false_pos as f64 / pairs.max(1) as f64;
        println!(
            "{name} super-features {method:?} 12→3 (whole document as a chunk): {found}/{updates} \
             updates share one with the previous version ({:.2}%); {false_pos}/{pairs} \
             different documents do ({:.2}%); {:.2?}",
            100.0 * rate,
            100.0 * fp,
            t.elapsed()
        );
        if method == SuperFeatureMethod::Odess {
            odess = (rate, fp);
        }
    }
    odess
}

#[test]
fn rfcs_updates_find_their_previous_version() {
    let t = Instant::now();
    let Some(writes) = load("rfcs.jsonl.zst", Some(1000)) else {
        return;
    };
    println!("loaded {} writes in {:.2?}", writes.len(), t.elapsed());
    let rate = measure("rfcs[..1000 updates]", &writes);
    assert!(rate >= 0.90, "default sketch match rate {rate:.3} < 0.90");
    let (found, false_pos) = measure_super_features("rfcs[..1000 updates]", &writes);
    assert!(found >= 0.5, "odess found {found:.3}");
    assert!(false_pos <= 0.05, "odess false positives {false_pos:.3}");
}

#[test]
#[ignore = "whole stream: run with --release -- --ignored --nocapture"]
fn full_stream_match_rates() {
    for name in ["rfcs.jsonl.zst", "gitignore.jsonl.zst"] {
        let Some(writes) = load(name, None) else {
            continue;
        };
        let label = name.trim_end_matches(".jsonl.zst");
        let rate = measure(label, &writes);
        measure_super_features(label, &writes);
        if name.starts_with("rfcs") {
            assert!(rate >= 0.90, "default sketch match rate {rate:.3} < 0.90");
        }
    }
}
