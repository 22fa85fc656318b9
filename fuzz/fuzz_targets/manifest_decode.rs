//! Arbitrary bytes as a tree manifest (what a `dedupwire serve` decodes from any sender): the
//! decoder must end in a manifest that passes validation, or a clear error, never a panic;
//! a manifest it accepts re-encodes to the same bytes (the encoding is canonical).
//!
//! The first byte chooses the layout: bit 0 appends a valid checksum to the rest (so the
//! fuzzer reaches the entries instead of stopping at the checksum).
#![no_main]

use dedupwire_sync::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let mut bytes = body.to_vec();
    if mode & 1 != 0 {
        let sum = blake3::hash(body);
        bytes.extend_from_slice(&sum.as_bytes()[..8]);
    }
    if let Ok(m) = Manifest::decode(&bytes) {
        m.validate().expect("a decoded manifest is valid");
        assert_eq!(m.encode(), bytes, "the encoding is canonical");
    }
});
