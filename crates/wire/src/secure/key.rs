//! The shared key both ends of a secure connection hold.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The context string of the passphrase derivation ([`Key::from_token`]); changing it changes
/// every key derived from a passphrase.
pub const TOKEN_CONTEXT: &str = "dedupwire 2026-11 channel key";

/// The shortest passphrase [`Key::from_text`] accepts: passphrases can be guessed offline from a
/// recorded handshake, so short ones are refused.
pub const MIN_TOKEN_LEN: usize = 16;

/// A 32-byte key shared by both ends of a connection (the Noise pre-shared key). Its `Debug`
/// shows only its [`id`](Key::id), never the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

/// Why a key could not be made or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key file could not be read.
    #[error("cannot read key file {}: {source}", path.display())]
    Io {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The key file could not be created or written.
    #[error("cannot write key file {}: {source}", path.display())]
    Write {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The key file or text holds nothing but white space.
    #[error("{0} is empty: put a key from `dedupwire key generate` (or a long passphrase) in it")]
    Empty(String),
    /// A passphrase shorter than [`MIN_TOKEN_LEN`].
    #[error(
        "{what} holds a passphrase of {len} characters; use at least {MIN_TOKEN_LEN} (it can be \
         guessed offline otherwise), or a key from `dedupwire key generate`"
    )]
    TooShort {
        /// Where the passphrase came from.
        what: String,
        /// Its length in characters.
        len: usize,
    },
    /// Text that should be 64 hexadecimal digits is not.
    #[error("not a key: expected 64 hexadecimal digits")]
    BadHex,
    /// The operating system's random source failed.
    #[error("cannot generate a key: the system random source failed: {0}")]
    Random(String),
}

impl Key {
    /// The key made of these bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// The key derived from a passphrase or token (BLAKE3 key derivation, context
    /// [`TOKEN_CONTEXT`]), so both ends can be set up with a human-chosen secret.
    pub fn from_token(token: &str) -> Key {
        Key(blake3::derive_key(TOKEN_CONTEXT, token.as_bytes()))
    }

    /// A fresh random key from the operating system's random source.
    pub fn generate() -> Result<Key, KeyError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Key(bytes))
    }

    /// The key as 64 lowercase hexadecimal digits (what a key file holds).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The key written as 64 hexadecimal digits.
    pub fn from_hex(text: &str) -> Result<Key, KeyError> {
        let text = text.as_bytes();
        if text.len() != 64 {
            return Err(KeyError::BadHex);
        }
        let mut bytes = [0u8; 32];
        for (b, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
            *b = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
        }
        Ok(Key(bytes))
    }

    /// The key a key file or `DEDUPWIRE_KEY` holds, `what` naming it in errors: 64 hexadecimal
    /// digits are the key itself, any other text (of at least [`MIN_TOKEN_LEN`] characters) a
    /// passphrase for [`Key::from_token`]. Surrounding white space is ignored, so both sources
    /// give the same key for the same text.
    pub fn from_text(text: &str, what: &str) -> Result<Key, KeyError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(KeyError::Empty(what.to_string()));
        }
        if let Ok(key) = Key::from_hex(text) {
            return Ok(key);
        }
        let len = text.chars().count();
        if len < MIN_TOKEN_LEN {
            return Err(KeyError::TooShort {
                what: what.to_string(),
                len,
            });
        }
        Ok(Key::from_token(text))
    }

    /// The key in the file at `path` (see [`Key::from_text`]). Keep the file readable by its
    /// owner only: whoever reads it can join the connection.
    pub fn load(path: &Path) -> Result<Key, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Key::from_text(&text, &format!("key file {}", path.display()))
    }

    /// Writes the key to a new file at `path` (64 hexadecimal digits and a newline, what
    /// [`Key::load`] reads), readable and writable by its owner only on Unix (mode 0600). An
    /// existing file is left alone: overwriting a key would cut off the peers that hold it.
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        let failed = |source| KeyError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path).map_err(failed)?;
        file.write_all(format!("{}\n", self.to_hex()).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(failed)
    }

    /// A short public name of the key (8 hex digits of a one-way hash): equal on both ends when
    /// they hold the same key, and safe to print.
    pub fn id(&self) -> String {
        let h = blake3::derive_key("dedupwire 2026-11 key id", &self.0);
        h[..4].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The key's bytes (the Noise pre-shared key).
    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn hex_digit(c: u8) -> Result<u8, KeyError> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(KeyError::BadHex),
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(id {})", self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_debug_hides_the_key() {
        let key = Key::generate().unwrap();
        let hex = key.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(Key::from_hex(&hex).unwrap(), key);
        assert_eq!(Key::from_hex(&hex.to_uppercase()).unwrap(), key);
        let debug = format!("{key:?}");
        assert!(!debug.contains(&hex[..8]), "{debug}");
        assert_eq!(debug, format!("Key(id {})", key.id()));
        assert_ne!(Key::generate().unwrap(), key);
        assert!(Key::from_hex(&hex[..63]).is_err());
        assert!(Key::from_hex(&format!("{}g", &hex[..63])).is_err());
    }

    #[test]
    fn token_derivation_is_frozen() {
        let key = Key::from_token("correct horse battery staple");
        assert_eq!(
            key,
            Key::from_bytes(blake3::derive_key(
                "dedupwire 2026-11 channel key",
                b"correct horse battery staple"
            ))
        );
        assert_ne!(key, Key::from_token("correct horse battery stapler"));
    }

    #[test]
    fn text_is_hex_or_a_long_passphrase() {
        let key = Key::generate().unwrap();
        let from_file = Key::from_text(&format!("  {}\n", key.to_hex()), "f").unwrap();
        assert_eq!(from_file, key);
        let phrase = "a passphrase long enough";
        assert_eq!(
            Key::from_text(&format!("{phrase}\n"), "f").unwrap(),
            Key::from_token(phrase)
        );
        let e = Key::from_text("short", "DEDUPWIRE_KEY").unwrap_err();
        assert!(matches!(e, KeyError::TooShort { len: 5, .. }), "{e}");
        assert!(e.to_string().contains("DEDUPWIRE_KEY"), "{e}");
        let e = Key::from_text(" \n", "key file k").unwrap_err();
        assert!(e.to_string().contains("key file k is empty"), "{e}");
    }

    #[test]
    fn load_reports_missing_and_empty_files() {
        let dir = std::env::temp_dir().join(format!("dedupwire-key-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing");
        let e = Key::load(&missing).unwrap_err();
        assert!(
            e.to_string().contains("cannot read key file") && e.to_string().contains("missing"),
            "{e}"
        );
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        assert!(matches!(Key::load(&empty), Err(KeyError::Empty(_))));
        let good = dir.join("good");
        let key = Key::generate().unwrap();
        key.save(&good).unwrap();
        assert_eq!(
            std::fs::read_to_string(&good).unwrap(),
            format!("{}\n", key.to_hex())
        );
        assert_eq!(Key::load(&good).unwrap(), key);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&good).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let e = Key::generate().unwrap().save(&good).unwrap_err();
        assert!(e.to_string().starts_with("cannot write key file"), "{e}");
        assert_eq!(Key::load(&good).unwrap(), key, "not overwritten");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
