//! Arbitrary bytes as an encoded JSON-lines replication stream and as one sDedup batch:
//! decoding must end in lines or a clear error, never a panic.
#![no_main]

use dedupwire_replicate::jsonl;
use dedupwire_replicate::sdedup::{Decoder, MemoryStore, SdedupConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut framed = b"DWRJ".to_vec();
    framed.extend_from_slice(&(data.len() as u32).to_le_bytes());
    framed.extend_from_slice(data);
    let _ = jsonl::decode(&framed[..], std::io::sink(), SdedupConfig::default());
    let mut dec = Decoder::new(SdedupConfig::default());
    let _ = dec.decode_batch(data, 0, &mut MemoryStore::default());
});
