//! Items cut from the input go through every pipeline configuration and must come back exact.
//!
//! Input: `[config selector: u8][frame size selector: u8][items separated by 0xFF 0x00]`.
#![no_main]

use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_engine::compress::Compression;
use dedupwire_engine::pipeline::{decode_all, encode_all, PipelineConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let config = match data[0] % 4 {
        0 => PipelineConfig::documents(),
        1 => PipelineConfig {
            chunker: ChunkerSpec::Cdc { min: 16, avg: 64, max: 256 },
            ..PipelineConfig::files()
        },
        2 => PipelineConfig {
            compression: Compression::Lz4,
            window_bytes: 512,
            ..PipelineConfig::documents()
        },
        _ => PipelineConfig::exact(ChunkerSpec::Fixed { size: 32 }),
    };
    let frame = 1 + usize::from(data[1]) * 16;
    let items: Vec<&[u8]> = data[2..].split(|&b| b == 0xFF).collect();
    let stream = encode_all(config, items.iter().copied(), frame).expect("built-in configs are valid");
    let back = decode_all(&stream).expect("our own stream decodes");
    assert_eq!(back.len(), items.len());
    for (a, b) in back.iter().zip(&items) {
        assert_eq!(a.as_slice(), *b);
    }
});
