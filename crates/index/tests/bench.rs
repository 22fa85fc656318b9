//! Throughput and RAM for 1M features. Run in release mode:
//! `cargo test --release -p dedupwire-index --test bench -- --ignored --nocapture`

use std::time::Instant;

use dedupwire_index::{Config, FeatureIndex};

fn rand(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn run(cache_pages: usize) {
    const RECORDS: u64 = 125_000; // × 8 features = 1M features
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        cache_pages,
        ..Config::default()
    };
    let mut ix = FeatureIndex::open(dir.path(), cfg.clone()).unwrap();
    let mut x = 0x1234_5678u64;
    let sketches: Vec<[u64; 8]> = (0..RECORDS)
        .map(|_| {
            let mut s = [0u64; 8];
            s.iter_mut().for_each(|f| *f = rand(&mut x));
            s
        })
        .collect();

    let t = Instant::now();
    for (r, s) in sketches.iter().enumerate() {
        ix.insert(r as u64, s).unwrap();
    }
    ix.sync().unwrap();
    let insert_s = t.elapsed().as_secs_f64();
    let s = ix.stats();
    println!(
        "cache {cache_pages} pages: insert {} features: {:.0} features/s ({} grows); RAM {:.2} B/feature \
         (load {:.3}), memory_bytes {:.1} MiB, log {:.1} MiB",
        s.features,
        s.features as f64 / insert_s,
        s.grows,
        s.bytes_per_feature,
        s.load_factor,
        ix.memory_bytes() as f64 / (1 << 20) as f64,
        s.log_bytes as f64 / (1 << 20) as f64,
    );

    // Lookups of present features, in random order.
    let mut order: Vec<usize> = (0..RECORDS as usize).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rand(&mut x) % (i as u64 + 1)) as usize);
    }
    let (h0, m0) = (ix.stats().cache_hits, ix.stats().cache_misses);
    let t = Instant::now();
    let mut found = 0usize;
    for &i in &order {
        for &f in &sketches[i] {
            found += ix.get(f).unwrap().len();
        }
    }
    let hit_s = t.elapsed().as_secs_f64();
    assert_eq!(found, 1_000_000);
    let s = ix.stats();
    let (h, m) = (s.cache_hits - h0, s.cache_misses - m0);
    println!(
        "  lookups (present): {:.0} features/s, page cache hit ratio {:.3}",
        1e6 / hit_s,
        h as f64 / (h + m) as f64
    );

    // Lookups of absent features (no log read unless a 16-bit signature collides).
    let t = Instant::now();
    let mut none = 0usize;
    for _ in 0..1_000_000 {
        none += ix.get(rand(&mut x)).unwrap().len();
    }
    assert_eq!(none, 0);
    println!(
        "  lookups (absent): {:.0} features/s",
        1e6 / t.elapsed().as_secs_f64()
    );

    // Sketch lookups (8 features, candidates scored), like sDedup's source selection.
    let t = Instant::now();
    for &i in order.iter().take(100_000) {
        let c = ix.lookup(&sketches[i]).unwrap();
        assert_eq!(c[0], (i as u64, 8));
    }
    println!(
        "  sketch lookups: {:.0} sketches/s",
        1e5 / t.elapsed().as_secs_f64()
    );

    // Reopen: full scan of the log vs checkpoint.
    drop(ix);
    let t = Instant::now();
    let ix = FeatureIndex::open(dir.path(), cfg.clone()).unwrap();
    let scan_s = t.elapsed().as_secs_f64();
    ix.close().unwrap();
    let t = Instant::now();
    let ix = FeatureIndex::open(dir.path(), cfg).unwrap();
    assert!(ix.recovery().checkpoint_used);
    println!(
        "  reopen: scan {:.0} ms, from checkpoint {:.0} ms",
        scan_s * 1e3,
        t.elapsed().as_secs_f64() * 1e3
    );
}

#[test]
#[ignore = "benchmark: run in release mode with --ignored --nocapture"]
fn bench_one_million_features() {
    run(128);
    run(1024);
}
