//! Encoding a target against a source and decoding it must give back the target, for both
//! codecs and any encoder parameters; one byte less of limit must fail.
//!
//! Input: `[source_len: u16 LE][params: u8][source][target]`.
#![no_main]

use dedupwire_engine::delta::{DeltaCodec, Sampled, ZstdRef, WINDOWS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let src_len = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 3);
    let p = data[2];
    let (source, target) = data[3..].split_at(src_len);
    let tuned = Sampled::with_params(WINDOWS[p as usize % WINDOWS.len()], 1 + (p as usize >> 3))
        .expect("valid parameters");
    let zstd = ZstdRef::new(if p & 1 == 0 { 1 } else { 3 });
    let codecs: [&dyn DeltaCodec; 3] = [&Sampled::default(), &tuned, &zstd];
    for codec in codecs {
        let mut delta = Vec::new();
        codec.encode(source, target, &mut delta);
        let mut out = Vec::new();
        codec
            .decode(source, &delta, target.len(), &mut out)
            .expect("decoding our own delta");
        assert!(out == target, "round trip changed the target");
        if !target.is_empty() {
            assert!(codec
                .decode(source, &delta, target.len() - 1, &mut Vec::new())
                .is_err());
        }
    }
});
