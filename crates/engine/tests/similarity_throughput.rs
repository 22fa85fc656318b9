//! Throughput of sketches and super-features on one core (numbers only, no assertion).
//!
//! `cargo test --release -p dedupwire-engine --test similarity_throughput -- --ignored --nocapture`

use std::hint::black_box;
use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use dedupwire_engine::similarity::{SketchConfig, SuperFeatureConfig, SuperFeatureMethod};

/// About 64 MiB of text: the RFC stream's decompressed JSON if present, else pseudo-random words.
fn corpus() -> (Vec<u8>, &'static str) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/rfcs.jsonl.zst");
    let limit = 64 << 20;
    if let Ok(file) = std::fs::File::open(path) {
        let mut out = Vec::new();
        zstd::stream::read::Decoder::new(file)
            .expect("zstd")
            .take(limit as u64)
            .read_to_end(&mut out)
            .expect("read");
        return (out, "rfcs.jsonl");
    }
    let words = [
        &b"the "[..],
        b"chunk ",
        b"feature ",
        b"delta ",
        b"source ",
        b"index\n",
    ];
    let mut s = 1u64;
    let mut out = Vec::with_capacity(limit);
    while out.len() < limit {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.extend_from_slice(words[(s >> 60) as usize % words.len()]);
    }
    (out, "synthetic words")
}

/// CPU seconds used by this thread (Linux `CLOCK_THREAD_CPUTIME_ID`), else wall-clock seconds.
fn thread_cpu_secs() -> f64 {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
        if unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.sec as f64 + ts.nsec as f64 * 1e-9;
        }
    }
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// MB per CPU second of `run` over `bytes`, best of three runs (the machine may be shared,
/// so CPU time rather than wall time measures one core).
fn mb_per_s(bytes: usize, mut run: impl FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let t = thread_cpu_secs();
            run();
            bytes as f64 / 1e6 / (thread_cpu_secs() - t)
        })
        .fold(0.0, f64::max)
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn similarity_throughput() {
    let (data, what) = corpus();
    println!("corpus: {what}, {:.1} MB", data.len() as f64 / 1e6);

    // Sketches over 16 KiB documents (the RFC stream's average size is ~18 KiB).
    for chunk_avg in [64, 128, 256, 512] {
        let cfg = SketchConfig { k: 8, chunk_avg };
        let mut out = Vec::new();
        let speed = mb_per_s(data.len(), || {
            for doc in data.chunks(16 << 10) {
                cfg.sketch_into(doc, &mut out);
                black_box(&out);
            }
        });
        println!("sketch K=8 chunk_avg={chunk_avg:>3}: {speed:>7.0} MB/s");
    }

    // Super-features over 4 KiB and 8 KiB chunks (backup-sized).
    for method in [SuperFeatureMethod::Odess, SuperFeatureMethod::Finesse] {
        for chunk in [4096usize, 8192] {
            let cfg = SuperFeatureConfig {
                method,
                ..SuperFeatureConfig::default()
            };
            let mut out = Vec::new();
            let speed = mb_per_s(data.len(), || {
                for c in data.chunks(chunk) {
                    cfg.super_features_into(c, &mut out);
                    black_box(&out);
                }
            });
            println!("super-features {method:?} 12→3, {chunk} B chunks: {speed:>7.0} MB/s");
        }
    }
}
