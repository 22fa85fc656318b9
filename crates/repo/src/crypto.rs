//! The repository's keys: a random master key, objects sealed with it, keyed blob ids, and key
//! files that wrap it with a password.

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

/// Bytes of the random nonce in front of every sealed object.
pub const NONCE_LEN: usize = 24;
/// Bytes of the authentication tag at the end of every sealed object.
pub const TAG_LEN: usize = 16;
/// The key file version this code writes and reads.
pub const KEY_FILE_VERSION: u64 = 1;

const SALT_LEN: usize = 16;
const WRAPPED_LEN: usize = NONCE_LEN + 64 + TAG_LEN;
const MAX_M_COST: u32 = 4 * 1024 * 1024;
const MAX_T_COST: u32 = 100;
const MAX_P_COST: u32 = 64;

/// Why a key or a sealed object could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// No key file opens with this password.
    #[error("wrong password (no key of this repository opens with it)")]
    WrongPassword,
    /// A sealed object failed authentication: damaged or not of this repository.
    #[error("{0}: damaged or not of this repository (authentication failed)")]
    Damaged(String),
    /// A key file that cannot be read.
    #[error("key file: {0}")]
    BadKeyFile(String),
}

/// argon2id cost parameters of a key file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KdfParams {
    /// Memory in KiB.
    pub m_cost: u32,
    /// Iterations.
    pub t_cost: u32,
    /// Lanes.
    pub p_cost: u32,
}

impl KdfParams {
    /// What new key files use: 64 MiB, 3 iterations, 1 lane (RFC 9106's second recommendation).
    pub const DEFAULT: KdfParams = KdfParams {
        m_cost: 65536,
        t_cost: 3,
        p_cost: 1,
    };

    /// Cheap parameters for tests only (64 KiB, 1 iteration, 1 lane).
    pub const TEST: KdfParams = KdfParams {
        m_cost: 64,
        t_cost: 1,
        p_cost: 1,
    };

    /// Whether key files may use these parameters: argon2's lower bounds (t_cost and p_cost at
    /// least 1, m_cost at least 8 × p_cost) and dedupwire's upper bounds (m_cost at most 4 GiB,
    /// t_cost at most 100, p_cost at most 64), so a hostile key file cannot exhaust memory.
    pub fn validate(&self) -> Result<(), CryptoError> {
        let KdfParams {
            m_cost,
            t_cost,
            p_cost,
        } = *self;
        if m_cost > MAX_M_COST || t_cost > MAX_T_COST || p_cost > MAX_P_COST {
            return Err(CryptoError::BadKeyFile(format!(
                "argon2id parameters m_cost={m_cost} KiB, t_cost={t_cost}, p_cost={p_cost} are \
                 beyond what dedupwire accepts (m_cost <= {MAX_M_COST} KiB, t_cost <= \
                 {MAX_T_COST}, p_cost <= {MAX_P_COST})"
            )));
        }
        if t_cost < 1 || p_cost < 1 || m_cost < 8 * p_cost {
            return Err(CryptoError::BadKeyFile(format!(
                "argon2id parameters m_cost={m_cost} KiB, t_cost={t_cost}, p_cost={p_cost} are \
                 invalid (t_cost and p_cost at least 1, m_cost at least 8 x p_cost)"
            )));
        }
        Ok(())
    }

    fn derive(&self, password: &[u8], salt: &[u8]) -> Result<[u8; 32], CryptoError> {
        self.validate()?;
        let params = argon2::Params::new(self.m_cost, self.t_cost, self.p_cost, Some(32))
            .map_err(|e| CryptoError::BadKeyFile(format!("argon2id parameters: {e}")))?;
        let kdf = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = [0u8; 32];
        kdf.hash_password_into(password, salt, &mut out)
            .map_err(|e| CryptoError::BadKeyFile(format!("argon2id: {e}")))?;
        Ok(out)
    }
}

/// What a key file says about itself, readable without the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// When it was made (RFC 3339, UTC).
    pub created: String,
    /// The host it was made on.
    pub host: String,
    /// The user who made it.
    pub user: String,
    /// Its argon2id parameters.
    pub kdf: KdfParams,
}

impl KeyInfo {
    /// The description in a key file (checked as [`MasterKey::unwrap`] checks it).
    pub fn read(key_file: &[u8]) -> Result<KeyInfo, CryptoError> {
        Ok(parse_key_file(key_file)?.info)
    }
}

/// A repository's secret: the key objects are sealed with and the key of blob ids.
#[derive(Clone)]
pub struct MasterKey {
    encrypt: [u8; 32],
    id: [u8; 32],
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl Drop for MasterKey {
    fn drop(&mut self) {
        wipe(&mut self.encrypt);
        wipe(&mut self.id);
    }
}

impl MasterKey {
    /// A new random key. Panics if the operating system's random source fails.
    pub fn generate() -> MasterKey {
        MasterKey {
            encrypt: random(),
            id: random(),
        }
    }

    /// The id key, for keyed BLAKE3 blob ids.
    pub fn id_key(&self) -> [u8; 32] {
        self.id
    }

    /// Seals `plain`: nonce (24 bytes) ‖ ciphertext ‖ tag (16 bytes).
    pub fn seal(&self, plain: &[u8]) -> Vec<u8> {
        seal_with(&self.encrypt, &random(), plain)
    }

    /// Opens what [`seal`](MasterKey::seal) made; `what` names it in the error.
    pub fn open(&self, sealed: &[u8], what: &str) -> Result<Vec<u8>, CryptoError> {
        open_with(&self.encrypt, sealed).ok_or_else(|| CryptoError::Damaged(what.to_string()))
    }

    /// A key file wrapping this key with `password` (argon2id with `params`, fresh salt).
    /// Panics if `params` fail [`KdfParams::validate`].
    pub fn wrap(&self, password: &[u8], params: KdfParams) -> Vec<u8> {
        if let Err(e) = params.validate() {
            panic!("MasterKey::wrap: {e}");
        }
        let file = self.key_file(password, params, random(), random());
        let mut out = serde_json::to_vec_pretty(&file).expect("a key file serializes");
        out.push(b'\n');
        out
    }

    fn key_file(
        &self,
        password: &[u8],
        params: KdfParams,
        salt: [u8; SALT_LEN],
        nonce: [u8; NONCE_LEN],
    ) -> KeyFile {
        let mut wrapping = params
            .derive(password, &salt)
            .expect("validated argon2id parameters");
        let mut both = [0u8; 64];
        both[..32].copy_from_slice(&self.encrypt);
        both[32..].copy_from_slice(&self.id);
        let data = seal_with(&wrapping, &nonce, &both);
        wipe(&mut both);
        wipe(&mut wrapping);
        KeyFile {
            version: KEY_FILE_VERSION,
            kdf: KdfSection {
                algorithm: "argon2id".to_string(),
                m_cost: params.m_cost,
                t_cost: params.t_cost,
                p_cost: params.p_cost,
                salt: hex::encode(salt),
            },
            created: crate::time::rfc3339_at(std::time::SystemTime::now()),
            host: crate::backup::hostname(),
            user: std::env::var("USER").unwrap_or_default(),
            data: hex::encode(data),
        }
    }

    /// The key a key file wraps, if `password` opens it.
    pub fn unwrap(key_file: &[u8], password: &[u8]) -> Result<MasterKey, CryptoError> {
        let parsed = parse_key_file(key_file)?;
        let mut wrapping = parsed.info.kdf.derive(password, &parsed.salt)?;
        let opened = open_with(&wrapping, &parsed.data);
        wipe(&mut wrapping);
        let mut both = opened.ok_or(CryptoError::WrongPassword)?;
        if both.len() != 64 {
            wipe(&mut both);
            return Err(CryptoError::BadKeyFile(
                "the wrapped key is not 64 bytes".to_string(),
            ));
        }
        let mut key = MasterKey {
            encrypt: [0; 32],
            id: [0; 32],
        };
        key.encrypt.copy_from_slice(&both[..32]);
        key.id.copy_from_slice(&both[32..]);
        wipe(&mut both);
        Ok(key)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct KeyFile {
    version: u64,
    kdf: KdfSection,
    created: String,
    host: String,
    user: String,
    data: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct KdfSection {
    algorithm: String,
    m_cost: u32,
    t_cost: u32,
    p_cost: u32,
    salt: String,
}

struct ParsedKeyFile {
    info: KeyInfo,
    salt: Vec<u8>,
    data: Vec<u8>,
}

fn parse_key_file(bytes: &[u8]) -> Result<ParsedKeyFile, CryptoError> {
    let bad = |why: String| CryptoError::BadKeyFile(why);
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| bad(format!("not a dedupwire key file (not JSON: {e})")))?;
    let Some(version) = value.get("version") else {
        return Err(bad(
            "not a dedupwire key file (no \"version\" field)".to_string()
        ));
    };
    if version.as_u64() != Some(KEY_FILE_VERSION) {
        return Err(bad(format!(
            "version {version} is not supported (this dedupwire reads version {KEY_FILE_VERSION})"
        )));
    }
    let file: KeyFile =
        serde_json::from_value(value).map_err(|e| bad(format!("malformed (version 1): {e}")))?;
    if file.kdf.algorithm != "argon2id" {
        return Err(bad(format!(
            "key derivation {:?} is not supported (only \"argon2id\")",
            file.kdf.algorithm
        )));
    }
    let kdf = KdfParams {
        m_cost: file.kdf.m_cost,
        t_cost: file.kdf.t_cost,
        p_cost: file.kdf.p_cost,
    };
    kdf.validate()?;
    let salt = hex::decode(&file.kdf.salt)
        .ok()
        .filter(|s| s.len() == SALT_LEN)
        .ok_or_else(|| bad(format!("the salt is not {SALT_LEN} bytes of hex")))?;
    let data = hex::decode(&file.data)
        .ok()
        .filter(|d| d.len() == WRAPPED_LEN)
        .ok_or_else(|| bad(format!("data is not {WRAPPED_LEN} bytes of hex")))?;
    Ok(ParsedKeyFile {
        info: KeyInfo {
            created: file.created,
            host: file.host,
            user: file.user,
            kdf,
        },
        salt,
        data,
    })
}

fn seal_with(key: &[u8; 32], nonce: &[u8; NONCE_LEN], plain: &[u8]) -> Vec<u8> {
    let cipher = XChaCha20Poly1305::new(key.into());
    let sealed = cipher
        .encrypt(XNonce::from_slice(nonce), plain)
        .expect("XChaCha20-Poly1305 seals any length this process can hold");
    let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
    out.extend_from_slice(nonce);
    out.extend_from_slice(&sealed);
    out
}

fn open_with(key: &[u8; 32], sealed: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < NONCE_LEN + TAG_LEN {
        return None;
    }
    let (nonce, rest) = sealed.split_at(NONCE_LEN);
    let cipher = XChaCha20Poly1305::new(key.into());
    cipher.decrypt(XNonce::from_slice(nonce), rest).ok()
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    if let Err(e) = getrandom::fill(&mut bytes) {
        panic!("the operating system's random source failed: {e}");
    }
    bytes
}

fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: `b` is a valid, aligned, exclusive reference to a byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fixed_key() -> MasterKey {
        let mut key = MasterKey {
            encrypt: [0; 32],
            id: [0; 32],
        };
        for (i, b) in key.encrypt.iter_mut().enumerate() {
            *b = i as u8;
        }
        key.id = [0x42; 32];
        key
    }

    fn fixed_nonce() -> [u8; NONCE_LEN] {
        let mut nonce = [0u8; NONCE_LEN];
        for (i, b) in nonce.iter_mut().enumerate() {
            *b = 0x40 + i as u8;
        }
        nonce
    }

    const VECTOR_PLAIN: &[u8] = b"dedupwire repository test vector";
    const VECTOR_SEALED: &str = "404142434445464748494a4b4c4d4e4f5051525354555657\
                                 b05c6105a0971064ead4f5dbdff316fbe6d5dfbd332d36e9\
                                 1e118b206a704ce28878e75ed299a5d5def3f03b45c46ff0";
    const VECTOR_PASSWORD: &[u8] = b"dedupwire test vector";
    const VECTOR_KEY_FILE: &str = r#"{
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

    #[test]
    fn frozen_test_vector() {
        let key = fixed_key();
        let sealed = seal_with(&key.encrypt, &fixed_nonce(), VECTOR_PLAIN);
        assert_eq!(hex::encode(&sealed), VECTOR_SEALED);
        let vector = hex::decode(VECTOR_SEALED).unwrap();
        assert_eq!(key.open(&vector, "vector").unwrap(), VECTOR_PLAIN);
    }

    #[test]
    fn frozen_key_file_vector() {
        let key = fixed_key();
        let mut salt = [0u8; SALT_LEN];
        for (i, b) in salt.iter_mut().enumerate() {
            *b = 0x10 + i as u8;
        }
        let mut nonce = [0u8; NONCE_LEN];
        for (i, b) in nonce.iter_mut().enumerate() {
            *b = 0x60 + i as u8;
        }
        let mut file = key.key_file(VECTOR_PASSWORD, KdfParams::TEST, salt, nonce);
        file.created = "2026-01-01T00:00:00Z".to_string();
        file.host = "vector-host".to_string();
        file.user = "vector-user".to_string();
        let mut text = serde_json::to_string_pretty(&file).unwrap();
        text.push('\n');
        assert_eq!(text, VECTOR_KEY_FILE);
        let back = MasterKey::unwrap(VECTOR_KEY_FILE.as_bytes(), VECTOR_PASSWORD).unwrap();
        assert_eq!(back.encrypt, key.encrypt);
        assert_eq!(back.id_key(), [0x42; 32]);
        let info = KeyInfo::read(VECTOR_KEY_FILE.as_bytes()).unwrap();
        assert_eq!(info.host, "vector-host");
        assert_eq!(info.user, "vector-user");
        assert_eq!(info.created, "2026-01-01T00:00:00Z");
    }

    #[test]
    fn seal_open_round_trip() {
        let key = MasterKey::generate();
        for len in [0usize, 1, 15, 16, 17, 63, 64, 1000, 70_000] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let sealed = key.seal(&plain);
            assert_eq!(sealed.len(), NONCE_LEN + len + TAG_LEN);
            assert_eq!(key.open(&sealed, "obj").unwrap(), plain);
        }
        let a = key.seal(b"same");
        let b = key.seal(b"same");
        assert_ne!(a, b, "a fresh nonce every time");
    }

    #[test]
    fn generated_keys_differ() {
        let a = MasterKey::generate();
        let b = MasterKey::generate();
        assert_ne!(a.encrypt, b.encrypt);
        assert_ne!(a.encrypt, a.id);
        assert_ne!(a.id_key(), b.id_key());
    }

    #[test]
    fn another_key_does_not_open() {
        let sealed = MasterKey::generate().seal(b"secret");
        let err = MasterKey::generate().open(&sealed, "pack abc").unwrap_err();
        assert!(matches!(&err, CryptoError::Damaged(w) if w == "pack abc"));
        assert!(err.to_string().contains("pack abc"));
    }

    #[test]
    fn every_flipped_bit_is_damaged() {
        let key = fixed_key();
        let sealed = key.seal(b"twenty bytes of text");
        for i in 0..sealed.len() {
            for bit in 0..8 {
                let mut bad = sealed.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    matches!(key.open(&bad, "x"), Err(CryptoError::Damaged(_))),
                    "byte {i} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn truncations_are_damaged() {
        let key = fixed_key();
        let sealed = key.seal(b"some plaintext");
        for len in 0..sealed.len() {
            assert!(matches!(
                key.open(&sealed[..len], "x"),
                Err(CryptoError::Damaged(_))
            ));
        }
        let mut longer = sealed.clone();
        longer.push(0);
        assert!(matches!(
            key.open(&longer, "x"),
            Err(CryptoError::Damaged(_))
        ));
        let empty = key.seal(b"");
        assert_eq!(empty.len(), 40);
        assert_eq!(key.open(&empty, "x").unwrap(), b"");
    }

    #[test]
    fn wrap_unwrap_round_trip() {
        let key = MasterKey::generate();
        let file = key.wrap(b"correct horse", KdfParams::TEST);
        let back = MasterKey::unwrap(&file, b"correct horse").unwrap();
        assert_eq!(back.encrypt, key.encrypt);
        assert_eq!(back.id, key.id);
        let info = KeyInfo::read(&file).unwrap();
        assert_eq!(info.kdf, KdfParams::TEST);
        assert_eq!(info.created.len(), 20);
        let json: serde_json::Value = serde_json::from_slice(&file).unwrap();
        assert_eq!(json["version"], 1);
        assert_eq!(json["kdf"]["algorithm"], "argon2id");
        assert_eq!(json["kdf"]["salt"].as_str().unwrap().len(), 32);
        assert_eq!(json["data"].as_str().unwrap().len(), 2 * WRAPPED_LEN);
        let again = key.wrap(b"correct horse", KdfParams::TEST);
        assert_ne!(
            json["kdf"]["salt"],
            serde_json::from_slice::<serde_json::Value>(&again).unwrap()["kdf"]["salt"]
        );
    }

    #[test]
    fn wrong_password() {
        let file = MasterKey::generate().wrap(b"right", KdfParams::TEST);
        assert!(matches!(
            MasterKey::unwrap(&file, b"wrong"),
            Err(CryptoError::WrongPassword)
        ));
        assert!(matches!(
            MasterKey::unwrap(&file, b""),
            Err(CryptoError::WrongPassword)
        ));
    }

    fn edited(file: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let mut json: serde_json::Value = serde_json::from_slice(file).unwrap();
        edit(&mut json);
        serde_json::to_vec(&json).unwrap()
    }

    fn bad_key_file(file: &[u8]) -> String {
        match MasterKey::unwrap(file, b"pw") {
            Err(CryptoError::BadKeyFile(why)) => why,
            other => panic!("expected BadKeyFile, got {other:?}"),
        }
    }

    #[test]
    fn malformed_key_files() {
        let file = MasterKey::generate().wrap(b"pw", KdfParams::TEST);
        assert!(bad_key_file(b"").contains("not JSON"));
        assert!(bad_key_file(b"\x00\xffgarbage").contains("not JSON"));
        assert!(bad_key_file(b"[1,2,3]").contains("no \"version\""));
        assert!(bad_key_file(b"{}").contains("no \"version\""));
        let v2 = edited(&file, |j| j["version"] = 2.into());
        assert!(bad_key_file(&v2).contains("version 2 is not supported"));
        let vs = edited(&file, |j| j["version"] = "1".into());
        assert!(bad_key_file(&vs).contains("not supported"));
        let scrypt = edited(&file, |j| j["kdf"]["algorithm"] = "scrypt".into());
        assert!(bad_key_file(&scrypt).contains("\"scrypt\" is not supported"));
        let no_data = edited(&file, |j| {
            j.as_object_mut().unwrap().remove("data");
        });
        assert!(bad_key_file(&no_data).contains("malformed"));
        let short_salt = edited(&file, |j| j["kdf"]["salt"] = "00112233".into());
        assert!(bad_key_file(&short_salt).contains("salt"));
        let bad_hex = edited(&file, |j| j["data"] = "zz".into());
        assert!(bad_key_file(&bad_hex).contains("data"));
        let short_data = edited(&file, |j| j["data"] = hex::encode([0u8; 40]).into());
        assert!(bad_key_file(&short_data).contains("data"));
    }

    #[test]
    fn absurd_kdf_parameters_are_refused_before_the_kdf() {
        let file = MasterKey::generate().wrap(b"pw", KdfParams::TEST);
        for (field, value) in [
            ("m_cost", 100 * 1024 * 1024u32),
            ("m_cost", MAX_M_COST + 1),
            ("m_cost", u32::MAX),
            ("t_cost", 101),
            ("t_cost", u32::MAX),
            ("p_cost", 65),
            ("t_cost", 0),
            ("p_cost", 0),
            ("m_cost", 7),
        ] {
            let huge = edited(&file, |j| j["kdf"][field] = value.into());
            let why = bad_key_file(&huge);
            assert!(
                why.contains("argon2id parameters"),
                "{field}={value}: {why}"
            );
        }
        let negative = edited(&file, |j| j["kdf"]["m_cost"] = (-1).into());
        assert!(bad_key_file(&negative).contains("malformed"));
    }

    #[test]
    fn kdf_params_bounds() {
        KdfParams::DEFAULT.validate().unwrap();
        KdfParams::TEST.validate().unwrap();
        KdfParams {
            m_cost: MAX_M_COST,
            t_cost: MAX_T_COST,
            p_cost: MAX_P_COST,
        }
        .validate()
        .unwrap();
    }

    #[test]
    #[should_panic(expected = "argon2id parameters")]
    fn wrap_refuses_parameters_unwrap_would_refuse() {
        let params = KdfParams {
            m_cost: MAX_M_COST + 1,
            t_cost: 1,
            p_cost: 1,
        };
        MasterKey::generate().wrap(b"pw", params);
    }

    proptest! {
        #[test]
        fn open_of_arbitrary_bytes_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..200)
        ) {
            prop_assert!(matches!(fixed_key().open(&bytes, "x"), Err(CryptoError::Damaged(_))));
        }

        #[test]
        fn unwrap_of_arbitrary_bytes_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..200)
        ) {
            prop_assert!(MasterKey::unwrap(&bytes, b"pw").is_err());
        }
    }
}
