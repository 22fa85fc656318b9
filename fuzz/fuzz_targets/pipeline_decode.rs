//! Arbitrary bytes as a pipeline stream: decoding must never panic, only fail with an error.
//! Half the inputs get a valid header first so the fuzzer reaches the frame decoder.
#![no_main]

use dedupwire_engine::pipeline::decode_all;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_all(data);
    let mut framed = b"DWP\x01\x00\x80\x80\x04".to_vec();
    framed.extend_from_slice(data);
    let _ = decode_all(&framed);
});
