//! RAM per feature: the cuckoo table costs 6 bytes per bucket, so about 6 / load bytes per
//! feature; growth by 1.25× at a load of 0.95 keeps it at or below 8 once the table has filled.

use dedupwire_index::{Config, FeatureIndex, BUCKET_BYTES};

#[test]
fn ram_per_feature_stays_at_or_below_eight_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        initial_features: 1024,
        ..Config::default()
    };
    let mut ix = FeatureIndex::open(dir.path(), cfg).unwrap();
    let (mut worst, mut best, mut max_load) = (0f64, f64::MAX, 0f64);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for r in 0..25_000u64 {
        let mut sketch = [0u64; 8];
        for f in &mut sketch {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *f = x;
        }
        ix.insert(r, &sketch).unwrap();
        let s = ix.stats();
        if s.features >= 2048 {
            worst = worst.max(s.bytes_per_feature);
            best = best.min(s.bytes_per_feature);
            max_load = max_load.max(s.load_factor);
        }
    }
    let s = ix.stats();
    assert_eq!(s.features, 200_000);
    assert_eq!(s.table_bytes, s.slots * 8 * BUCKET_BYTES as u64);
    // memory_bytes counts exactly the table plus the page cache and buffers.
    assert_eq!(ix.memory_bytes() as u64, s.table_bytes + s.cache_bytes);
    eprintln!(
        "bytes/feature: worst {worst:.2} best {best:.2} (max load {max_load:.3}), now {:.2}; {} grows",
        s.bytes_per_feature, s.grows
    );
    assert!(worst <= 8.0, "worst {worst}");
    assert!(best <= 6.4, "at a filled table: {best}");
    assert!(max_load > 0.94);
}
