//! Arbitrary bytes as an encoded JSON-lines replication stream (read whole and by its frames
//! alone), as the one batch of a well-formed stream, and as one sDedup batch: decoding must
//! end in lines or a clear error, never a panic.
#![no_main]

use std::io::Cursor;

use dedupwire_replicate::jsonl;
use dedupwire_replicate::sdedup::{Decoder, MemoryStore, SdedupConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = jsonl::decode(data, std::io::sink(), SdedupConfig::default());
    let _ = jsonl::check_frames(Cursor::new(data));

    let mut dec = Decoder::new(SdedupConfig::default());
    let entries = dec
        .decode_batch(data, 0, &mut MemoryStore::default())
        .map_or(0, |(batch, _)| batch.changes.len() as u64);

    // The layout of crates/replicate/FORMAT.md, version 2: header, batch 1, end marker.
    let mut file = jsonl::FILE_MAGIC.to_vec();
    file.extend_from_slice(&jsonl::FILE_VERSION.to_le_bytes());
    file.push(b'B');
    file.extend_from_slice(&1u64.to_le_bytes());
    file.extend_from_slice(&(data.len() as u32).to_le_bytes());
    file.extend_from_slice(data);
    file.push(b'E');
    file.extend_from_slice(&1u64.to_le_bytes());
    file.extend_from_slice(&entries.to_le_bytes());
    let checksum = xxhash_rust::xxh3::xxh3_64(&file);
    file.extend_from_slice(&checksum.to_le_bytes());
    let _ = jsonl::check_frames(Cursor::new(&file));
    let _ = jsonl::decode(&file[..], std::io::sink(), SdedupConfig::default());
});
