//! Arbitrary bytes as a delta against an arbitrary source, for both codecs: decoding must
//! never panic, only fail with an error, and never produce more than the limit.
//!
//! Input: `[source_len: u16 LE][limit selector: u8][source][delta]`.
#![no_main]

use dedupwire_engine::delta::{DeltaCodec, Sampled, ZstdRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let src_len = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 3);
    let limit = match data[2] % 4 {
        0 => 0,
        1 => 256,
        2 => 1 << 20,
        _ => usize::MAX,
    };
    let (source, delta) = data[3..].split_at(src_len);
    let codecs: [&dyn DeltaCodec; 2] = [&Sampled::default(), &ZstdRef::new(3)];
    for codec in codecs {
        let mut out = b"prefix".to_vec();
        match codec.decode(source, delta, limit, &mut out) {
            Ok(()) => assert!(out.len() - 6 <= limit),
            Err(_) => assert_eq!(out, b"prefix"),
        }
    }
});
