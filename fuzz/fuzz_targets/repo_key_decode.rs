//! Arbitrary bytes as a backup repository's key file and as a sealed object: unwrapping and
//! opening must end in a key, plaintext or a clear error, never a panic, and a hostile key file
//! must be refused before its KDF parameters make argon2id allocate or run for long.
//!
//! The first byte chooses what the rest is: 0 a whole key file; 1 the `data` of the test
//! vector's key file (so that the fuzzer reaches the unwrapping itself); 2 the vector's argon2id
//! parameters (three little-endian u32s: m_cost, t_cost, p_cost; those that are valid but cost
//! more than a test's are skipped); anything else a sealed object opened with the vector's key
//! (only the sealed test vector may open).
#![no_main]

use std::sync::OnceLock;

use dedupwire_repo::crypto::{CryptoError, KdfParams};
use dedupwire_repo::MasterKey;
use libfuzzer_sys::fuzz_target;

const PASSWORD: &[u8] = b"dedupwire test vector";
const KEY_FILE: &str = r#"{
  "version": 1,
  "kdf": {
    "algorithm": "argon2id",
    "m_cost": 64,
    "t_cost": 1,
    "p_cost": 1,
    "salt": "101112131415161718191a1b1c1d1e1f"
  },
  "created": "2026-01-01T00:00:00Z",
  "host": "vector-host",
  "user": "vector-user",
  "data": "606162636465666768696a6b6c6d6e6f7071727374757677356bb684421e69f62be63a9338cc30961923a00a274258e5974fa7c8ff9dfca0264aa26af3b60cd65a2e319f781af8597f36757c7e2bd18316816ae10ade1dbc8c4458f88605fab33684c343ca2f54b2"
}
"#;

const SEALED: &str = "404142434445464748494a4b4c4d4e4f5051525354555657\
                      b05c6105a0971064ead4f5dbdff316fbe6d5dfbd332d36e9\
                      1e118b206a704ce28878e75ed299a5d5def3f03b45c46ff0";

fn vector_key() -> &'static MasterKey {
    static KEY: OnceLock<MasterKey> = OnceLock::new();
    KEY.get_or_init(|| MasterKey::unwrap(KEY_FILE.as_bytes(), PASSWORD).expect("the test vector"))
}

fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut json: serde_json::Value = serde_json::from_str(KEY_FILE).expect("the test vector");
    edit(&mut json);
    serde_json::to_vec(&json).expect("serializable")
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let key = vector_key();
    match mode {
        0 => {
            let _ = MasterKey::unwrap(body, b"pw");
            let _ = MasterKey::unwrap(body, PASSWORD);
        }
        1 => {
            let file = edited(|j| j["data"] = hex::encode(body).into());
            match MasterKey::unwrap(&file, PASSWORD) {
                Ok(k) => assert_eq!(k.id_key(), key.id_key(), "only the vector's data opens"),
                Err(CryptoError::WrongPassword | CryptoError::BadKeyFile(_)) => {}
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        2 => {
            let word = |i: usize| {
                let mut w = [0u8; 4];
                for (j, b) in w.iter_mut().enumerate() {
                    *b = body.get(4 * i + j).copied().unwrap_or(0);
                }
                u32::from_le_bytes(w)
            };
            let params = KdfParams {
                m_cost: word(0),
                t_cost: word(1),
                p_cost: word(2),
            };
            if params.validate().is_ok() && (params.m_cost > 1024 || params.t_cost > 2) {
                return;
            }
            let file = edited(|j| {
                j["kdf"]["m_cost"] = params.m_cost.into();
                j["kdf"]["t_cost"] = params.t_cost.into();
                j["kdf"]["p_cost"] = params.p_cost.into();
            });
            match MasterKey::unwrap(&file, PASSWORD) {
                Ok(k) => {
                    assert_eq!(params, KdfParams::TEST);
                    assert_eq!(k.id_key(), key.id_key());
                }
                Err(CryptoError::BadKeyFile(_)) => assert!(params.validate().is_err()),
                Err(CryptoError::WrongPassword) => assert!(params != KdfParams::TEST),
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        _ => {
            if let Ok(plain) = key.open(body, "fuzzed") {
                assert_eq!(hex::encode(body), SEALED, "a forgery opened");
                assert_eq!(plain, b"dedupwire repository test vector");
            }
            let sealed = key.seal(body);
            assert_eq!(key.open(&sealed, "resealed").expect("own seal"), body);
        }
    }
});
