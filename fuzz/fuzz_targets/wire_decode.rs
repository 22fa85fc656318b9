//! Arbitrary bytes as a stream of wire frames, and as a hello payload: reading must end in
//! frames or a clear error, never a panic, and never a frame over the configured maximum.
#![no_main]

use dedupwire_wire::{FrameConfig, FrameReader, Hello};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut reader = FrameReader::with_config(data, FrameConfig::with_max_payload(4096));
    for _ in 0..64 {
        match reader.read_frame() {
            Ok(frame) => assert!(frame.payload.len() <= 4096),
            Err(_) => break,
        }
    }
    let _ = Hello::decode(data);
});
