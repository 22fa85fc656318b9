//! Arbitrary bytes as a compressed block of any method and claimed length: never a panic, and
//! a success returns exactly the claimed length.
//!
//! Input: `[method tag: u8][claimed length: u16 LE][block]`.
#![no_main]

use dedupwire_engine::compress::Compression;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let len = usize::from(u16::from_le_bytes([data[1], data[2]]));
    if let Ok(out) = Compression::decompress(data[0] % 4, &data[3..], len) {
        assert_eq!(out.len(), len);
    }
});
