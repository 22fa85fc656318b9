//! Arbitrary bytes as the backup repository's stored forms: a pack (its trailer, then each
//! frame it names), a sealed frame, a delta blob against a fixed base, and the JSON of an index
//! file, a tree and a snapshot. Each must decode or give a clear error, never a panic, and a
//! damaged length must not make it allocate more than the format's bounds.
#![no_main]

use std::sync::OnceLock;

use dedupwire_repo::index::IndexFile;
use dedupwire_repo::pack::{open_frame, read_trailer};
use dedupwire_repo::repository::decode_delta;
use dedupwire_repo::tree::Tree;
use dedupwire_repo::{MasterKey, Snapshot};
use libfuzzer_sys::fuzz_target;

const KEY_FILE: &str = r#"{"version":1,"kdf":{"algorithm":"argon2id","m_cost":64,"t_cost":1,"p_cost":1,"salt":"101112131415161718191a1b1c1d1e1f"},"created":"2026-01-01T00:00:00Z","host":"vector-host","user":"vector-user","data":"606162636465666768696a6b6c6d6e6f7071727374757677356bb684421e69f62be63a9338cc30961923a00a274258e5974fa7c8ff9dfca0264aa26af3b60cd65a2e319f781af8597f36757c7e2bd18316816ae10ade1dbc8c4458f88605fab33684c343ca2f54b2"}"#;

fn key() -> &'static MasterKey {
    static KEY: OnceLock<MasterKey> = OnceLock::new();
    KEY.get_or_init(|| {
        MasterKey::unwrap(KEY_FILE.as_bytes(), b"dedupwire test vector").expect("the vector")
    })
}

fuzz_target!(|data: &[u8]| {
    let key = key();
    if let Ok(t) = read_trailer(key, data, "fuzz") {
        for f in &t.frames {
            let start = usize::try_from(f.offset).unwrap_or(usize::MAX);
            if let Some(sealed) = data.get(start..start.saturating_add(f.length as usize)) {
                let _ = open_frame(key, sealed, f.raw_length, "fuzz frame");
            }
        }
    }
    let raw = data.first().map_or(0, |&b| u32::from(b) << 10);
    let _ = open_frame(key, data, raw, "fuzz frame");
    let _ = decode_delta(b"a fixed base chunk, for deltas to copy from", data, 1 << 16);
    let _ = serde_json::from_slice::<IndexFile>(data);
    let _ = serde_json::from_slice::<Tree>(data);
    let _ = serde_json::from_slice::<Snapshot>(data);
});
