//! The index: which pack and frame hold each blob, and the super-features of whole chunks.
//!
//! Index files are immutable: a backup writes one for each pack it stores, after the pack, so
//! that a backup cut off at any point leaves every stored pack findable. In memory, all index
//! files make one [`Index`].

use std::collections::HashMap;

use dedupwire_engine::similarity::CandidateIndex;
use serde::{Deserialize, Serialize};

use crate::blob::{BlobId, BlobKind};
use crate::pack::{FrameEntry, PackTrailer};

/// One index file: packs with what they hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexFile {
    /// The format version (1).
    pub version: u32,
    /// The packs it describes.
    pub packs: Vec<PackRecord>,
    /// Written by a prune: its generation, one more than the highest it read (0: a backup's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
    /// Written by a prune: packs marked for deletion, readable but offered to no backup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingPack>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A pack a prune marked for deletion: a later prune deletes it or, if used again, keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingPack {
    /// The pack's name.
    pub name: String,
    /// When it was marked, ns since 1970.
    pub marked_ns: i64,
    /// The generation of the index file that marked it.
    pub generation: u64,
}

/// A pack in an index file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackRecord {
    /// The pack's name (hex BLAKE3 of its bytes).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its frames and blobs, as its trailer says.
    pub contents: PackTrailer,
}

/// The index format's version.
pub const INDEX_VERSION: u32 = 1;

/// Where a blob is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Its pack (into [`Index::packs`]).
    pub pack: u32,
    /// Its frame.
    pub frame: FrameEntry,
    /// Offset in the frame's plaintext.
    pub offset: u32,
    /// Length.
    pub length: u32,
    /// What it holds.
    pub kind: BlobKind,
    /// For a delta, its base.
    pub base: Option<BlobId>,
}

/// Super-features kept per feature at most (the oldest whole chunks leave first).
const MAX_PER_FEATURE: usize = 8;

/// Every blob of a repository and the super-features of its whole chunks.
pub struct Index {
    packs: Vec<(String, u64)>,
    /// Per pack: marked for deletion (its blobs are read, never offered for dedup).
    pending: Vec<bool>,
    pack_numbers: HashMap<String, u32>,
    blobs: HashMap<BlobId, Location>,
    features: CandidateIndex<BlobId>,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            packs: Vec::new(),
            pending: Vec::new(),
            pack_numbers: HashMap::new(),
            blobs: HashMap::new(),
            features: CandidateIndex::new(MAX_PER_FEATURE),
        }
    }
}

impl Index {
    /// Adds what a pack holds (a pack listed by two index files, as after an interrupted
    /// prune, is added once). A blob already indexed keeps its first place unless this copy
    /// is whole and that one a delta (a delta's base must resolve to a whole copy), or both
    /// are alike and that one is in a pack marked for deletion.
    pub fn add_pack(&mut self, name: &str, size: u64, contents: &PackTrailer) {
        self.insert_pack(name, size, contents, false);
    }

    /// Adds a pack marked for deletion: its blobs can be read, but [`Index::contains`] and
    /// [`Index::similar`] do not offer them (add such packs after all others).
    pub fn add_pending_pack(&mut self, name: &str, size: u64, contents: &PackTrailer) {
        self.insert_pack(name, size, contents, true);
    }

    fn insert_pack(&mut self, name: &str, size: u64, contents: &PackTrailer, pending: bool) {
        if self.pack_numbers.contains_key(name) {
            return;
        }
        let no = self.packs.len() as u32;
        self.packs.push((name.to_string(), size));
        self.pending.push(pending);
        self.pack_numbers.insert(name.to_string(), no);
        for b in &contents.blobs {
            let Some(frame) = contents.frames.get(b.frame as usize) else {
                continue;
            };
            let whole = b.kind.base_kind().is_none();
            if let Some(l) = self.blobs.get(&b.id) {
                let was_whole = l.kind.base_kind().is_none();
                let better = (whole && !was_whole)
                    || (whole == was_whole && self.pending[l.pack as usize] && !pending);
                if !better {
                    continue;
                }
            }
            self.blobs.insert(
                b.id,
                Location {
                    pack: no,
                    frame: *frame,
                    offset: b.offset,
                    length: b.length,
                    kind: b.kind,
                    base: b.base,
                },
            );
            if !pending && b.kind == BlobKind::Data && !b.features.is_empty() {
                self.features.insert(b.id, &b.features);
            }
        }
    }

    /// Adds an index file's packs.
    pub fn add_file(&mut self, file: &IndexFile) {
        for p in &file.packs {
            self.add_pack(&p.name, p.size, &p.contents);
        }
    }

    /// Where `id` is.
    pub fn get(&self, id: &BlobId) -> Option<&Location> {
        self.blobs.get(id)
    }

    /// Whether the repository holds `id` in a pack not marked for deletion (what a backup may
    /// reference).
    pub fn contains(&self, id: &BlobId) -> bool {
        self.blobs
            .get(id)
            .is_some_and(|l| !self.pending[l.pack as usize])
    }

    /// Whether pack `no` is marked for deletion.
    pub fn is_pending(&self, no: u32) -> bool {
        self.pending[no as usize]
    }

    /// The name and size of pack `no`.
    pub fn pack(&self, no: u32) -> (&str, u64) {
        let (name, size) = &self.packs[no as usize];
        (name, *size)
    }

    /// Every pack's name and size.
    pub fn packs(&self) -> impl Iterator<Item = (&str, u64)> {
        self.packs.iter().map(|(n, s)| (n.as_str(), *s))
    }

    /// Every blob.
    pub fn blobs(&self) -> impl Iterator<Item = (&BlobId, &Location)> {
        self.blobs.iter()
    }

    /// Up to `k` whole chunks sharing super-features with `features`, most shared first.
    pub fn similar(&self, features: &[u64], k: usize) -> Vec<BlobId> {
        let mut found = self.features.lookup(features);
        found.sort_by(|a, b| b.shared.cmp(&a.shared).then(b.seq.cmp(&a.seq)));
        found.into_iter().take(k).map(|c| c.id).collect()
    }

    /// Makes a whole chunk stored in this backup findable as a base at once.
    pub fn add_features(&mut self, id: BlobId, features: &[u64]) {
        self.features.insert(id, features);
    }

    /// Blobs indexed.
    pub fn len(&self) -> usize {
        self.blobs.len()
    }

    /// Whether no blob is indexed.
    pub fn is_empty(&self) -> bool {
        self.blobs.is_empty()
    }

    /// Bytes the in-memory index takes, roughly.
    pub fn memory_bytes(&self) -> usize {
        self.blobs.capacity() * (std::mem::size_of::<(BlobId, Location)>() + 8)
            + self.features.memory_bytes()
            + self.packs.iter().map(|(n, _)| n.len() + 32).sum::<usize>()
    }
}
