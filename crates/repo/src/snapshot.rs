//! Snapshots: one backup run, named by a random id.

use serde::{Deserialize, Serialize};

use crate::blob::BlobId;

/// A snapshot: when, of what, the root tree, and what the backup added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The format version (1).
    pub version: u32,
    /// When the backup started, nanoseconds since 1970 (UTC).
    pub time_ns: i64,
    /// The host that made it.
    pub host: String,
    /// The user that made it.
    pub user: String,
    /// The paths backed up, as given (made absolute).
    pub paths: Vec<String>,
    /// Tags given with `--tag`.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The root tree: one node per path, named by the path.
    pub tree: BlobId,
    /// The snapshot whose files were taken as unchanged when their metadata matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What the backup did.
    pub summary: Summary,
}

/// What a backup did, in counts and bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Files not in the parent snapshot.
    pub files_new: u64,
    /// Files in the parent whose metadata changed (read again).
    pub files_changed: u64,
    /// Files taken as unchanged from the parent (size, mtime, inode and ctime matched; not read).
    pub files_unchanged: u64,
    /// Directories.
    pub dirs: u64,
    /// Bytes of file contents in the snapshot.
    pub bytes_total: u64,
    /// Bytes read from files.
    pub bytes_read: u64,
    /// Chunks already in the repository (or earlier in this backup).
    pub chunks_duplicate: u64,
    /// Their bytes.
    pub bytes_duplicate: u64,
    /// Chunks stored as deltas against similar whole chunks.
    pub chunks_delta: u64,
    /// The bytes those chunks hold.
    pub bytes_delta_chunks: u64,
    /// The deltas' bytes (before compression).
    pub bytes_delta: u64,
    /// Chunks stored whole.
    pub chunks_whole: u64,
    /// Their bytes.
    pub bytes_whole: u64,
    /// Bytes of packs and index files added to the repository (compressed, encrypted).
    pub bytes_added: u64,
    /// Files or directories that could not be read (named in warnings).
    pub errors: u64,
}

/// The snapshot format's version.
pub const SNAPSHOT_VERSION: u32 = 1;
