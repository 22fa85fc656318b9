//! Arbitrary bytes as an environment's segment files and sketch file: opening must end in an
//! environment or a clear error, never a panic; every chunk it indexes must come back intact
//! or as `Corrupt`, every sketch it recalls must be of a chunk it holds, and the environment
//! must stay usable (put, get, remember, reopen, recall).
//!
//! The first byte chooses the layout: bit 0 puts a valid header before the bytes (so the
//! fuzzer reaches the records), bit 1 splits them into two segments, bit 2 also writes them
//! as the sketch file, bit 3 also makes them (in 40-byte records) the hint of segment 1 with
//! a valid checksum, so that the fuzzer reaches hints that point anywhere; bit 4 makes the
//! headers version 2, whose segments may hold recipes (chunks kept as lists of other chunks);
//! bit 5 also writes them as the note `adaptive-lan` (with bit 0, behind a valid note header),
//! read back as a note and as the channel's adaptive prior.
#![no_main]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use dedupwire_wire::channel::Prior;
use dedupwire_wire::{ChunkId, ChunkStore, EnvConfig, Environment, Sketch, StoreError};
use libfuzzer_sys::fuzz_target;

fn header(no: u32, version: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(32);
    h.extend_from_slice(b"DWENVSEG");
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&no.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&h);
    h.extend_from_slice(&sum.to_le_bytes());
    h
}

fn sketch_header() -> Vec<u8> {
    let mut h = Vec::with_capacity(24);
    h.extend_from_slice(b"DWSKETCH");
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
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
        let version = if mode & 16 != 0 { 2 } else { 1 };
        let mut file = if mode & 1 != 0 { header(no, version) } else { Vec::new() };
        file.extend_from_slice(part);
        std::fs::write(dir.join(format!("{no:08x}.seg")), file).expect("write segment");
    }
    if mode & 8 != 0 {
        let seg_len = std::fs::metadata(dir.join("00000001.seg")).map_or(0, |m| m.len());
        let records: Vec<&[u8]> = body.chunks_exact(40).collect();
        let mut hint = b"DWENVHNT".to_vec();
        hint.push(1);
        hint.extend_from_slice(&1u32.to_le_bytes());
        hint.extend_from_slice(&seg_len.to_le_bytes());
        hint.extend_from_slice(&(records.len() as u32).to_le_bytes());
        for r in records {
            hint.extend_from_slice(r);
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&hint);
        hint.extend_from_slice(&sum.to_le_bytes());
        std::fs::write(dir.join("00000001.hint"), hint).expect("write hint");
    }
    if mode & 4 != 0 {
        let mut file = if mode & 1 != 0 { sketch_header() } else { Vec::new() };
        file.extend_from_slice(body);
        std::fs::write(dir.join("sketches"), file).expect("write sketch file");
    }
    if mode & 32 != 0 {
        let mut file = Vec::new();
        if mode & 1 != 0 {
            let mut summed = (body.len() as u32).to_le_bytes().to_vec();
            summed.extend_from_slice(body);
            file.extend_from_slice(b"DWENVNOT");
            file.push(1);
            file.extend_from_slice(&(body.len() as u32).to_le_bytes());
            file.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&summed).to_le_bytes());
        }
        file.extend_from_slice(body);
        std::fs::write(dir.join("note-adaptive-lan"), file).expect("write note");
    }
    if let Ok(env) = Environment::open(&dir, config()) {
        if let Some(note) = env.note("adaptive-lan").expect("a note reads or is none") {
            assert!(note.len() <= 4096);
            if let Some(prior) = Prior::decode(&note) {
                assert_eq!(Prior::decode(&prior.encode()), Some(prior));
            }
        }
        env.keep_note("adaptive-lan", body.get(..4096).unwrap_or(body)).expect("keep a note");
        // Every record's id is 32 bytes of the input: asking for every window asks for every
        // indexed chunk.
        for w in body.windows(32) {
            let id = ChunkId(w.try_into().expect("32 bytes"));
            match env.get(&id) {
                // A recipe (4 + 32 bytes per part) may name a part many times.
                Ok(Some(chunk)) => assert!(chunk.len() <= body.len() * (body.len() / 32 + 1)),
                Ok(None) | Err(StoreError::Corrupt(_)) => {}
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        for s in env.recall().expect("recall after open") {
            assert!(s.features.len() <= 32);
            assert!(env.contains(&s.id).expect("contains"), "recalled a chunk not held");
        }
        let id = ChunkId([0xA5; 32]);
        env.put(&id, b"still usable").expect("put after open");
        assert_eq!(env.get(&id).expect("get").as_deref(), Some(&b"still usable"[..]));
        let sketch = Sketch {
            id,
            after: Some(ChunkId([0x5A; 32])),
            features: vec![1, 2, 3],
        };
        env.remember(std::slice::from_ref(&sketch)).expect("remember after open");
        drop(env);
        let env = Environment::open(&dir, config()).expect("reopen after a successful open");
        assert_eq!(env.get(&id).expect("get").as_deref(), Some(&b"still usable"[..]));
        let recalled = env.recall().expect("recall after reopen");
        assert_eq!(recalled.last(), Some(&sketch), "the sketch remembered last comes back last");
        let kept = env.note("adaptive-lan").expect("note after reopen");
        assert_eq!(kept.as_deref(), Some(body.get(..4096).unwrap_or(body)));
    }
    let _ = std::fs::remove_dir_all(&dir);
});
