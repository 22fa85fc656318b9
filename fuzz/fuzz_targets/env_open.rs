//! Arbitrary bytes as an environment's segment files: opening must end in an environment or a
//! clear error, never a panic; every chunk it indexes must come back intact or as `Corrupt`,
//! and the environment must stay usable (put, get, reopen).
//!
//! The first byte chooses the layout: bit 0 puts a valid segment header before the bytes (so
//! the fuzzer reaches the records), bit 1 splits them into two segments.
#![no_main]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use dedupwire_wire::{ChunkId, ChunkStore, EnvConfig, Environment, StoreError};
use libfuzzer_sys::fuzz_target;

fn header(no: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(32);
    h.extend_from_slice(b"DWENVSEG");
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&no.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&h);
    h.extend_from_slice(&sum.to_le_bytes());
    h
}

fn scratch_dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "dedupwire-env-fuzz-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn config() -> EnvConfig {
    EnvConfig {
        max_bytes: 1 << 20,
        segment_bytes: 64 << 10,
        second_chance: true,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let dir = scratch_dir();
    let parts: Vec<&[u8]> = if mode & 2 != 0 {
        let mid = body.len() / 2;
        vec![&body[..mid], &body[mid..]]
    } else {
        vec![body]
    };
    for (i, part) in parts.iter().enumerate() {
        let no = i as u32 + 1;
        let mut file = if mode & 1 != 0 { header(no) } else { Vec::new() };
        file.extend_from_slice(part);
        std::fs::write(dir.join(format!("{no:08x}.seg")), file).expect("write segment");
    }
    if let Ok(env) = Environment::open(&dir, config()) {
        // Every record's id is 32 bytes of the input: asking for every window asks for every
        // indexed chunk.
        for w in body.windows(32) {
            let id = ChunkId(w.try_into().expect("32 bytes"));
            match env.get(&id) {
                Ok(Some(chunk)) => assert!(chunk.len() <= body.len()),
                Ok(None) | Err(StoreError::Corrupt(_)) => {}
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        let id = ChunkId([0xA5; 32]);
        env.put(&id, b"still usable").expect("put after open");
        assert_eq!(env.get(&id).expect("get").as_deref(), Some(&b"still usable"[..]));
        drop(env);
        let env = Environment::open(&dir, config()).expect("reopen after a successful open");
        assert_eq!(env.get(&id).expect("get").as_deref(), Some(&b"still usable"[..]));
    }
    let _ = std::fs::remove_dir_all(&dir);
});
