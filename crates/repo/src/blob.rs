//! Blobs: what a pack holds, named by the keyed BLAKE3 of the bytes they stand for.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A blob's id: keyed BLAKE3 of its contents (for a delta blob, of the chunk it rebuilds), so
/// that ids reveal nothing about contents to whoever lacks the repository's key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobId(pub [u8; 32]);

impl BlobId {
    /// The id as 64 hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<BlobId> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(BlobId(out))
    }
}

impl fmt::Debug for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &self.to_hex()[..16])
    }
}

impl fmt::Display for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for BlobId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for BlobId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<BlobId, D::Error> {
        let s = String::deserialize(d)?;
        BlobId::from_hex(&s).ok_or_else(|| serde::de::Error::custom("a blob id is 64 hex digits"))
    }
}

/// What a blob holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlobKind {
    /// A whole chunk of file contents.
    Data,
    /// A chunk as a delta against a whole chunk (its base): at most two blobs rebuild it.
    Delta,
    /// A directory listing (JSON).
    Tree,
    /// A directory listing as a delta against a whole listing (its base, a `Tree` blob), as
    /// the next version of a directory mostly repeats the last.
    TreeDelta,
}

impl BlobKind {
    /// The kind a delta blob's base must have (`None` for a blob stored whole).
    pub fn base_kind(self) -> Option<BlobKind> {
        match self {
            BlobKind::Data | BlobKind::Tree => None,
            BlobKind::Delta => Some(BlobKind::Data),
            BlobKind::TreeDelta => Some(BlobKind::Tree),
        }
    }
}
