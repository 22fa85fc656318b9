//! Trees: one directory's entries, stored as a blob of JSON.

use serde::{Deserialize, Serialize};

use crate::blob::BlobId;

/// A directory listing, entries sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    /// The entries.
    pub nodes: Vec<Node>,
}

/// One entry of a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// The name, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The name's bytes in hex, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_hex: Option<String>,
    /// What it is, with what that kind needs.
    #[serde(flatten)]
    pub kind: NodeKind,
    /// Permission bits (and set-id, sticky).
    pub mode: u32,
    /// Modification time, nanoseconds since 1970.
    pub mtime_ns: i64,
    /// Owner and group ids.
    #[serde(default)]
    pub uid: u32,
    /// Group id.
    #[serde(default)]
    pub gid: u32,
}

/// A node's kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NodeKind {
    /// A regular file: its size and the ids of its chunks in order.
    File {
        /// Size in bytes.
        size: u64,
        /// Chunk ids.
        content: Vec<BlobId>,
    },
    /// A directory: its tree blob.
    Dir {
        /// The subtree's id.
        subtree: BlobId,
    },
    /// A symbolic link.
    Symlink {
        /// The target, when it is UTF-8.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
        /// The target's bytes in hex, when it is not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target_hex: Option<String>,
    },
}

/// Text, or hex when the bytes are not UTF-8: `(text, hex)`.
pub fn text_or_hex(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (Some(s.to_string()), None),
        Err(_) => (None, Some(hex::encode(bytes))),
    }
}

/// The bytes [`text_or_hex`] stored.
pub fn bytes_of(text: &Option<String>, hex_form: &Option<String>) -> Option<Vec<u8>> {
    match (text, hex_form) {
        (Some(s), None) => Some(s.as_bytes().to_vec()),
        (None, Some(h)) => hex::decode(h).ok(),
        _ => None,
    }
}

impl Node {
    /// The name's bytes (None for a node that names itself neither way: damaged).
    pub fn name_bytes(&self) -> Option<Vec<u8>> {
        bytes_of(&self.name, &self.name_hex)
    }
}
