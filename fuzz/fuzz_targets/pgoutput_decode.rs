//! Arbitrary bytes as a run of pgoutput messages (each prefixed by its length, u32
//! big-endian) decoded by one decoder, as a PostgreSQL source reads a peek: every message must
//! decode or give a clear error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dedupwire_replicate::pg::pgoutput::fuzz_decode(data);
});
