//! A repository opened with its password: config, index, blob reads and writes, snapshots.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use dedupwire_engine::delta::{DeltaCodec, Sampled};
use dedupwire_engine::fingerprint::Fingerprinter;
use dedupwire_engine::similarity::SuperFeatureConfig;
use serde::{Deserialize, Serialize};

use crate::backend::{Backend, BackendError, ObjectKind};
use crate::blob::{BlobId, BlobKind};
use crate::crypto::{CryptoError, KdfParams, MasterKey};
use crate::index::{Index, IndexFile, Location, PackRecord, PendingPack, INDEX_VERSION};
use crate::pack::{open_frame, BlobEntry, FrameEntry, PackBuilder};
use crate::snapshot::{Snapshot, SNAPSHOT_VERSION};

/// Why a repository operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    /// The storage failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A key or an object could not be opened.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    /// An object is damaged or inconsistent: what, and where.
    #[error("{0}")]
    Damaged(String),
    /// A blob the repository should hold is missing from its index.
    #[error("blob {0} is not in the repository's index")]
    MissingBlob(BlobId),
    /// The request cannot be served (no such snapshot, an ambiguous prefix, ...).
    #[error("{0}")]
    Invalid(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = RepoError> = std::result::Result<T, E>;

/// A repository's parameters, fixed at `init`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// The format version (1).
    pub version: u32,
    /// A random id, hex.
    pub id: String,
    /// FastCDC sizes of file chunks.
    pub chunker: ChunkerParams,
    /// How super-features of whole chunks are computed.
    pub super_features: SuperFeatureConfig,
    /// Candidate bases tried per new chunk (Neptune's top-k).
    pub top_k: usize,
    /// A delta is kept only when it is below this share of its chunk.
    pub delta_worth: f64,
    /// Target pack size in bytes.
    pub pack_size: usize,
    /// Blob bytes per compressed frame.
    pub frame_size: usize,
    /// zstd level of frames.
    pub zstd_level: i32,
}

/// FastCDC chunk sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerParams {
    /// Smallest chunk.
    pub min: usize,
    /// Average.
    pub avg: usize,
    /// Largest.
    pub max: usize,
}

/// The repository format's version.
pub const REPO_VERSION: u32 = 1;

impl Default for Config {
    fn default() -> Self {
        Config {
            version: REPO_VERSION,
            id: String::new(),
            chunker: ChunkerParams {
                min: 2 << 10,
                avg: 8 << 10,
                max: 64 << 10,
            },
            super_features: SuperFeatureConfig::default(),
            top_k: 4,
            delta_worth: 0.5,
            pack_size: 16 << 20,
            frame_size: 1 << 20,
            zstd_level: 3,
        }
    }
}

impl Config {
    /// Checks the parameters a repository's config may carry.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(RepoError::Damaged(format!("config: {why}")));
        if self.version != REPO_VERSION {
            return bad(format!(
                "repository version {} (this dedupwire reads {REPO_VERSION})",
                self.version
            ));
        }
        let c = self.chunker;
        if !(64 <= c.min && c.min <= c.avg && c.avg <= c.max && c.max <= 16 << 20) {
            return bad(format!("chunker sizes {c:?}"));
        }
        if !(4 << 20..=64 << 20).contains(&self.pack_size) {
            return bad(format!("pack size {} is outside 4-64 MiB", self.pack_size));
        }
        if !(64 << 10..=16 << 20).contains(&self.frame_size) || !(1..=16).contains(&self.top_k) {
            return bad("frame size or top_k out of range".to_string());
        }
        self.super_features
            .validate()
            .map_err(|e| RepoError::Damaged(format!("config: {e}")))
    }
}

/// Decompressed frames kept for reads, at most this many bytes.
const FRAME_CACHE_BYTES: usize = 64 << 20;

/// A frame cache: (pack, frame offset) -> plaintext, least recently used out first.
#[derive(Default)]
struct FrameCache {
    frames: HashMap<(u32, u64), std::sync::Arc<Vec<u8>>>,
    order: VecDeque<(u32, u64)>,
    bytes: usize,
}

/// An open repository.
pub struct Repository {
    backend: Box<dyn Backend>,
    key: MasterKey,
    /// The key file that opened it (or that `init` wrote).
    key_name: String,
    config: Config,
    ids: Fingerprinter,
    index: Index,
    /// The index files `index` was read from.
    index_files: Vec<String>,
    /// The highest generation among them.
    index_gen: u64,
    /// Packs they mark for deletion.
    pending: HashMap<String, PendingPack>,
    /// Locks this process holds, and the index generation they record.
    held_locks: HashSet<String>,
    lock_gen: u64,
    /// Locks released while another is held (a refresh): deleted at the next refresh, so that
    /// a listing made during a refresh still finds a lock untouched throughout.
    retired_locks: Vec<String>,
    cache: Mutex<FrameCache>,
}

/// A key file's name: 32 hex digits of its BLAKE3.
fn key_file_name(file: &[u8]) -> String {
    hex::encode(&blake3::hash(file).as_bytes()[..16])
}

/// A random id of 32 hex digits.
pub fn random_name() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS has randomness");
    hex::encode(b)
}

impl Repository {
    /// Makes a new repository in `backend` (which must be empty), its master key wrapped by
    /// `password`.
    pub fn init(
        backend: Box<dyn Backend>,
        password: &[u8],
        kdf: KdfParams,
        mut config: Config,
    ) -> Result<Repository> {
        config.id = random_name();
        config.validate()?;
        let key = MasterKey::generate();
        let key_file = key.wrap(password, kdf);
        let name = key_file_name(&key_file);
        backend.put_new(ObjectKind::Key, &name, &key_file)?;
        let sealed = key.seal(&serde_json::to_vec(&config).expect("serializable"));
        if !backend.put_new(ObjectKind::Config, "config", &sealed)? {
            return Err(RepoError::Invalid(
                "a repository already exists there".to_string(),
            ));
        }
        let mut repo = Repository::with(backend, key, config);
        repo.key_name = name;
        Ok(repo)
    }

    /// Opens a repository: finds a key that `password` opens, reads the config and the index.
    pub fn open(backend: Box<dyn Backend>, password: &[u8]) -> Result<Repository> {
        let mut keys = backend.list(ObjectKind::Key)?;
        keys.sort();
        if keys.is_empty() {
            return Err(RepoError::Damaged(
                "the repository has no key files".to_string(),
            ));
        }
        let mut key = None;
        for (name, _) in &keys {
            let file = backend.get(ObjectKind::Key, name)?;
            match MasterKey::unwrap(&file, password) {
                Ok(k) => {
                    key = Some((k, name.clone()));
                    break;
                }
                Err(CryptoError::WrongPassword) => {}
                Err(e) => return Err(RepoError::Damaged(format!("key {name}: {e}"))),
            }
        }
        let (key, key_name) = key.ok_or(CryptoError::WrongPassword)?;
        let sealed = backend.get(ObjectKind::Config, "config")?;
        let config: Config = serde_json::from_slice(&key.open(&sealed, "config")?)
            .map_err(|e| RepoError::Damaged(format!("config: {e}")))?;
        config.validate()?;
        let mut repo = Repository::with(backend, key, config);
        repo.key_name = key_name;
        repo.load_index()?;
        Ok(repo)
    }

    fn with(backend: Box<dyn Backend>, key: MasterKey, config: Config) -> Repository {
        let ids = Fingerprinter::keyed(key.id_key());
        Repository {
            backend,
            key,
            key_name: String::new(),
            config,
            ids,
            index: Index::default(),
            index_files: Vec::new(),
            index_gen: 0,
            pending: HashMap::new(),
            held_locks: HashSet::new(),
            lock_gen: 0,
            retired_locks: Vec::new(),
            cache: Mutex::default(),
        }
    }

    /// Reads every index file into memory. Packs a prune marked for deletion are added last
    /// and flagged, so that a blob also held elsewhere is read from there and a blob held only
    /// by them is read but never offered to a backup.
    pub fn load_index(&mut self) -> Result<()> {
        // An index file listed, then gone, was folded by a prune into a newer one: list again.
        let mut tries = 0;
        loop {
            match self.try_load_index() {
                Err(RepoError::Backend(BackendError::NotFound(_))) if tries < 10 => tries += 1,
                r => return r,
            }
        }
    }

    fn try_load_index(&mut self) -> Result<()> {
        let mut names: Vec<String> = self
            .backend
            .list(ObjectKind::Index)?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        names.sort_by_key(|n| (std::cmp::Reverse(name_generation(n)), n.clone()));
        // Marks are only in prunes' files (usually one, the newest): those are read first, so
        // the marks are known before any pack is added; the others one at a time.
        let prunes = names.iter().take_while(|n| name_generation(n) > 0).count();
        let mut first: Vec<IndexFile> = Vec::new();
        let mut pending: HashMap<String, PendingPack> = HashMap::new();
        let mut generation = 0;
        for name in &names[..prunes] {
            let file = self.read_index_file(name)?;
            generation = generation.max(file.generation);
            for p in &file.pending {
                let e = pending.entry(p.name.clone()).or_insert_with(|| p.clone());
                e.marked_ns = e.marked_ns.max(p.marked_ns);
                e.generation = e.generation.max(p.generation);
            }
            first.push(file);
        }
        let mut index = Index::default();
        let mut marked: Vec<PackRecord> = Vec::new();
        let mut add = |index: &mut Index, file: IndexFile| {
            for p in file.packs {
                if pending.contains_key(&p.name) {
                    marked.push(p);
                } else {
                    index.add_pack(&p.name, p.size, &p.contents);
                }
            }
        };
        for file in first {
            add(&mut index, file);
        }
        for name in &names[prunes..] {
            let file = self.read_index_file(name)?;
            add(&mut index, file);
        }
        for p in &marked {
            index.add_pending_pack(&p.name, p.size, &p.contents);
        }
        self.index = index;
        // The frame cache is keyed by pack numbers, which the new index assigns afresh.
        self.cache = Mutex::default();
        self.index_files = names;
        self.index_gen = generation;
        self.pending = pending;
        Ok(())
    }

    /// The index files the index was read from, as listed then.
    pub fn index_files(&self) -> &[String] {
        &self.index_files
    }

    /// The highest generation of those index files (0 before any prune).
    pub fn index_generation(&self) -> u64 {
        self.index_gen
    }

    /// Packs the index files mark for deletion, by name (a pack marked by several: the latest
    /// mark).
    pub fn pending_packs(&self) -> &HashMap<String, PendingPack> {
        &self.pending
    }

    /// One index file.
    pub fn read_index_file(&self, name: &str) -> Result<IndexFile> {
        let sealed = self.backend.get(ObjectKind::Index, name)?;
        let what = format!("index file {name}");
        let packed = self.key.open(&sealed, &what)?;
        let json = zstd::bulk::decompress(&packed, crate::pack::MAX_FRAME)
            .map_err(|e| RepoError::Damaged(format!("{what}: does not decompress: {e}")))?;
        let file: IndexFile = serde_json::from_slice(&json)
            .map_err(|e| RepoError::Damaged(format!("{what}: {e}")))?;
        if file.version != INDEX_VERSION {
            return Err(RepoError::Damaged(format!(
                "{what}: version {} (this dedupwire reads {INDEX_VERSION})",
                file.version
            )));
        }
        Ok(file)
    }

    /// The storage.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// The master key.
    pub fn key(&self) -> &MasterKey {
        &self.key
    }

    /// The name of the key file that opened this repository.
    pub fn key_name(&self) -> &str {
        &self.key_name
    }

    /// Every key file: name and description (a damaged one is an error naming it).
    pub fn keys(&self) -> Result<Vec<(String, crate::crypto::KeyInfo)>> {
        let mut out = Vec::new();
        for (name, _) in self.backend.list(ObjectKind::Key)? {
            let file = self.backend.get(ObjectKind::Key, &name)?;
            let info = crate::crypto::KeyInfo::read(&file)
                .map_err(|e| RepoError::Damaged(format!("key {name}: {e}")))?;
            out.push((name, info));
        }
        out.sort_by(|a, b| a.1.created.cmp(&b.1.created).then(a.0.cmp(&b.0)));
        Ok(out)
    }

    /// Adds a key file wrapping this repository's master key with `password`; returns its name.
    pub fn add_key(&self, password: &[u8], kdf: KdfParams) -> Result<String> {
        let file = self.key.wrap(password, kdf);
        let name = key_file_name(&file);
        self.backend.put_new(ObjectKind::Key, &name, &file)?;
        Ok(name)
    }

    /// Removes a key file (not the one in use: the repository could become unopenable).
    pub fn remove_key(&self, name: &str) -> Result<()> {
        if name == self.key_name {
            return Err(RepoError::Invalid(
                "that is the key this command opened the repository with; remove it with \
                 another password (or use `repo key passwd` to replace it)"
                    .to_string(),
            ));
        }
        if !self.keys()?.iter().any(|(n, _)| n == name) {
            return Err(RepoError::Invalid(format!("no key {name}")));
        }
        Ok(self.backend.delete(ObjectKind::Key, name)?)
    }

    /// The parameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The index, to add to.
    pub fn index_mut(&mut self) -> &mut Index {
        &mut self.index
    }

    /// The id of `bytes` in this repository (keyed BLAKE3).
    pub fn id_of(&self, bytes: &[u8]) -> BlobId {
        BlobId(self.ids.fingerprint(bytes).0)
    }

    /// The plaintext of a frame, from the cache or the pack.
    fn frame(&self, pack: u32, frame: &FrameEntry) -> Result<std::sync::Arc<Vec<u8>>> {
        let k = (pack, frame.offset);
        if let Some(f) = self.cache.lock().expect("not poisoned").frames.get(&k) {
            return Ok(f.clone());
        }
        let (name, _) = self.index.pack(pack);
        let sealed = self.backend.get_range(
            ObjectKind::Pack,
            name,
            frame.offset,
            u64::from(frame.length),
        )?;
        if sealed.len() != frame.length as usize {
            return Err(RepoError::Damaged(format!(
                "pack {name}: ends before its frame at {}",
                frame.offset
            )));
        }
        let what = format!("pack {name}, frame at {}", frame.offset);
        let plain = std::sync::Arc::new(
            open_frame(&self.key, &sealed, frame.raw_length, &what).map_err(RepoError::Damaged)?,
        );
        let mut c = self.cache.lock().expect("not poisoned");
        if let Some(f) = c.frames.get(&k) {
            return Ok(f.clone());
        }
        c.bytes += plain.len();
        c.frames.insert(k, plain.clone());
        c.order.push_back(k);
        while c.bytes > FRAME_CACHE_BYTES {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            if let Some(f) = c.frames.remove(&old) {
                c.bytes -= f.len();
            }
        }
        Ok(plain)
    }

    /// A blob's stored bytes (a delta blob's delta, not its chunk).
    pub fn raw_blob(&self, loc: &Location) -> Result<Vec<u8>> {
        let frame = self.frame(loc.pack, &loc.frame)?;
        let (start, end) = (
            loc.offset as usize,
            loc.offset as usize + loc.length as usize,
        );
        frame.get(start..end).map(<[u8]>::to_vec).ok_or_else(|| {
            RepoError::Damaged(format!(
                "pack {}: a blob past its frame's end",
                self.index.pack(loc.pack).0
            ))
        })
    }

    /// A blob's contents: a data or tree blob as stored, a delta applied to its base; checked
    /// against its id.
    pub fn read_blob(&self, id: &BlobId) -> Result<Vec<u8>> {
        let loc = *self.index.get(id).ok_or(RepoError::MissingBlob(*id))?;
        let bytes = match loc.kind.base_kind() {
            None => self.raw_blob(&loc)?,
            Some(want) => {
                let base_id = loc
                    .base
                    .ok_or_else(|| RepoError::Damaged(format!("delta blob {id} names no base")))?;
                let base_loc = *self
                    .index
                    .get(&base_id)
                    .ok_or(RepoError::MissingBlob(base_id))?;
                if base_loc.kind != want {
                    return Err(RepoError::Damaged(format!(
                        "delta blob {id}: its base {base_id} is not a whole {}",
                        if want == BlobKind::Tree {
                            "tree"
                        } else {
                            "chunk"
                        }
                    )));
                }
                let base = self.raw_blob(&base_loc)?;
                let delta = self.raw_blob(&loc)?;
                decode_delta(&base, &delta, self.delta_limit(loc.kind))
                    .map_err(|e| RepoError::Damaged(format!("delta blob {id}: {e}")))?
            }
        };
        if self.id_of(&bytes) != *id {
            return Err(RepoError::Damaged(format!(
                "blob {id} does not match its id (damaged in pack {})",
                self.index.pack(loc.pack).0
            )));
        }
        Ok(bytes)
    }

    /// The most bytes a delta blob of `kind` may rebuild: a chunk's maximum, or for a tree
    /// [`TREE_LIMIT`].
    pub fn delta_limit(&self, kind: BlobKind) -> usize {
        match kind {
            BlobKind::TreeDelta => TREE_LIMIT,
            _ => self.config.chunker.max,
        }
    }

    /// Stores a pack, then an index file for it (so that a backup cut off later leaves the
    /// pack findable); returns the pack's name and the bytes added (`None` for no blobs).
    pub fn store_pack(&mut self, builder: PackBuilder) -> Result<Option<(String, u64)>> {
        if builder.is_empty() {
            return Ok(None);
        }
        let (bytes, contents) = builder.finish(&self.key);
        let name = blake3::hash(&bytes).to_hex().to_string();
        self.backend.put_new(ObjectKind::Pack, &name, &bytes)?;
        let file = IndexFile {
            version: INDEX_VERSION,
            packs: vec![PackRecord {
                name: name.clone(),
                size: bytes.len() as u64,
                contents: contents.clone(),
            }],
            ..IndexFile::default()
        };
        let json = serde_json::to_vec(&file).expect("serializable");
        let sealed = self
            .key
            .seal(&zstd::bulk::compress(&json, 3).expect("zstd compresses"));
        self.backend
            .put_new(ObjectKind::Index, &random_name(), &sealed)?;
        self.index.add_pack(&name, bytes.len() as u64, &contents);
        Ok(Some((name, (bytes.len() + sealed.len()) as u64)))
    }

    /// A new pack builder with this repository's frame size and level.
    pub fn pack_builder(&self) -> PackBuilder {
        PackBuilder::new(self.config.frame_size, self.config.zstd_level)
    }

    /// Adds a blob to `builder`.
    pub fn add_blob(
        &self,
        builder: &mut PackBuilder,
        id: BlobId,
        kind: BlobKind,
        bytes: &[u8],
        base: Option<BlobId>,
        features: Vec<u64>,
    ) {
        let entry = BlobEntry {
            id,
            kind,
            frame: 0,
            offset: 0,
            length: 0,
            base,
            features,
        };
        builder.add(&self.key, entry, bytes);
    }

    /// Saves a snapshot; returns its id.
    pub fn save_snapshot(&self, snapshot: &Snapshot) -> Result<String> {
        let id = random_name() + &random_name();
        let sealed = self
            .key
            .seal(&serde_json::to_vec(snapshot).expect("serializable"));
        self.backend.put_new(ObjectKind::Snapshot, &id, &sealed)?;
        Ok(id)
    }

    /// Every snapshot, oldest first, with its id (one forgotten while listed is left out). A
    /// damaged one is an error naming it.
    pub fn snapshots(&self) -> Result<Vec<(String, Snapshot)>> {
        let mut out = Vec::new();
        for (name, _) in self.backend.list(ObjectKind::Snapshot)? {
            match self.snapshot(&name) {
                Ok(s) => out.push((name.clone(), s)),
                Err(RepoError::Backend(BackendError::NotFound(_))) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.1.time_ns.cmp(&b.1.time_ns).then(a.0.cmp(&b.0)));
        Ok(out)
    }

    /// One snapshot by its full id.
    pub fn snapshot(&self, id: &str) -> Result<Snapshot> {
        let sealed = self.backend.get(ObjectKind::Snapshot, id)?;
        let what = format!("snapshot {}", &id[..id.len().min(8)]);
        let s: Snapshot = serde_json::from_slice(&self.key.open(&sealed, &what)?)
            .map_err(|e| RepoError::Damaged(format!("{what}: {e}")))?;
        if s.version != SNAPSHOT_VERSION {
            return Err(RepoError::Damaged(format!(
                "{what}: version {} (this dedupwire reads {SNAPSHOT_VERSION})",
                s.version
            )));
        }
        Ok(s)
    }

    /// The snapshot `spec` names: `latest`, a full id or a unique prefix of one.
    pub fn find_snapshot(&self, spec: &str) -> Result<(String, Snapshot)> {
        let all = self.backend.list(ObjectKind::Snapshot)?;
        if spec == "latest" {
            return self
                .snapshots()?
                .pop()
                .ok_or_else(|| RepoError::Invalid("the repository has no snapshots".into()));
        }
        let matches: Vec<&String> = all
            .iter()
            .map(|(n, _)| n)
            .filter(|n| n.starts_with(spec))
            .collect();
        match matches.as_slice() {
            [one] => Ok(((*one).clone(), self.snapshot(one)?)),
            [] => Err(RepoError::Invalid(format!("no snapshot {spec:?}"))),
            _ => Err(RepoError::Invalid(format!(
                "{spec:?} names {} snapshots: give more of the id",
                matches.len()
            ))),
        }
    }

    /// A tree blob.
    pub fn read_tree(&self, id: &BlobId) -> Result<crate::tree::Tree> {
        let bytes = self.read_blob(id)?;
        serde_json::from_slice(&bytes).map_err(|e| RepoError::Damaged(format!("tree {id}: {e}")))
    }
}

/// Who holds a lock: a backup (or a prune) running on a host, as a sealed JSON lock object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The host.
    pub host: String,
    /// The process.
    pub pid: u32,
    /// When it was taken or last refreshed, ns since 1970.
    pub time_ns: i64,
    /// The generation of the index the holder works from (`None`, from older writers: 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_gen: Option<u64>,
    /// Held by a prune (prunes exclude each other; backups never wait).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prune: bool,
}

/// A backup refreshes its lock this often; a lock older than [`LOCK_STALE_NS`] is stale.
pub const LOCK_REFRESH_NS: i64 = 5 * 60 * 1_000_000_000;
/// A lock not refreshed for this long belongs to a backup that is gone.
pub const LOCK_STALE_NS: i64 = 30 * 60 * 1_000_000_000;

/// Now, ns since 1970.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The name of an index file a prune writes: its generation, then a random id.
pub fn generation_name(generation: u64) -> String {
    format!("g{generation:016}-{}", random_name())
}

/// The generation in an index file's name (0 for a backup's).
pub fn name_generation(name: &str) -> u64 {
    name.strip_prefix('g')
        .and_then(|r| r.split('-').next())
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

impl LockInfo {
    /// Whether the backup holding it may still be running: its process is alive (same
    /// host), or it was refreshed recently (another host).
    pub fn live(&self, this_host: &str) -> bool {
        if self.host == this_host {
            std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
        } else {
            now_ns() - self.time_ns < LOCK_STALE_NS
        }
    }
}

impl Repository {
    /// Takes a backup lock (a new lock object) and returns its name and time. The lock
    /// records the generation of the index the backup works from: a prune deletes no pack
    /// marked in a later generation while the lock is live. On a backup's first lock, if a
    /// prune wrote an index file since the index was read, the index is read again (the lock
    /// keeps the older generation: it only makes prune more careful).
    pub fn lock(&mut self, host: &str) -> Result<(String, i64)> {
        let first = self.held_locks.is_empty();
        if first {
            self.lock_gen = self.index_gen;
        }
        let info = LockInfo {
            host: host.to_string(),
            pid: std::process::id(),
            time_ns: now_ns(),
            index_gen: Some(self.lock_gen),
            prune: false,
        };
        let name = self.write_lock(&info)?;
        self.held_locks.insert(name.clone());
        for old in std::mem::take(&mut self.retired_locks) {
            self.backend.delete(ObjectKind::Lock, &old)?;
        }
        if first {
            let newest = self
                .backend
                .list(ObjectKind::Index)?
                .iter()
                .map(|(n, _)| name_generation(n))
                .max()
                .unwrap_or(0);
            if newest > self.index_gen {
                self.load_index()?;
                self.lock_gen = self.index_gen;
            }
        }
        Ok((name, info.time_ns))
    }

    /// Stores a lock object; returns its name.
    pub fn write_lock(&self, info: &LockInfo) -> Result<String> {
        let name = random_name();
        let sealed = self
            .key
            .seal(&serde_json::to_vec(info).expect("serializable"));
        self.backend.put_new(ObjectKind::Lock, &name, &sealed)?;
        Ok(name)
    }

    /// Releases a lock: at once if it was the last one held, else (a refresh) at the next
    /// [`Repository::lock`] or with the last.
    pub fn unlock(&mut self, name: &str) -> Result<()> {
        self.held_locks.remove(name);
        if !self.held_locks.is_empty() {
            self.retired_locks.push(name.to_string());
            return Ok(());
        }
        for old in std::mem::take(&mut self.retired_locks) {
            self.backend.delete(ObjectKind::Lock, &old)?;
        }
        Ok(self.backend.delete(ObjectKind::Lock, name)?)
    }

    /// Every lock, with its holder (unreadable ones are left out).
    pub fn locks(&self) -> Result<Vec<(String, LockInfo)>> {
        let mut out = Vec::new();
        for (name, _) in self.backend.list(ObjectKind::Lock)? {
            let Ok(sealed) = self.backend.get(ObjectKind::Lock, &name) else {
                continue;
            };
            if let Some(info) = self
                .key
                .open(&sealed, "lock")
                .ok()
                .and_then(|b| serde_json::from_slice::<LockInfo>(&b).ok())
            {
                out.push((name, info));
            }
        }
        Ok(out)
    }
}

/// Tag of a delta blob made with the engine's sampled codec.
pub const DELTA_SAMPLED: u8 = 0;

/// The largest tree a tree delta may rebuild (a directory of about a million entries).
pub const TREE_LIMIT: usize = 256 << 20;

/// A delta blob's bytes: its codec tag, then the delta.
pub fn encode_delta(base: &[u8], chunk: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.push(DELTA_SAMPLED);
    Sampled::default().encode(base, chunk, out);
}

/// The chunk a delta blob rebuilds from its base.
pub fn decode_delta(base: &[u8], delta: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    match delta.split_first() {
        Some((&DELTA_SAMPLED, d)) => {
            let mut out = Vec::new();
            Sampled::default()
                .decode(base, d, limit, &mut out)
                .map_err(|e| e.to_string())?;
            Ok(out)
        }
        Some((tag, _)) => Err(format!("unknown delta codec {tag}")),
        None => Err("an empty delta".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LocalBackend;

    /// Threads that miss the same frame at once each open it; it must be kept, and counted,
    /// once, or the cache's count drifts above what it holds until it keeps nothing.
    #[test]
    fn a_frame_opened_by_several_threads_at_once_is_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::create(&dir.path().join("repo")).unwrap();
        let mut repo =
            Repository::init(Box::new(backend), b"pw", KdfParams::TEST, Config::default()).unwrap();
        let mut builder = repo.pack_builder();
        let mut ids = Vec::new();
        for i in 0..200u32 {
            let data: Vec<u8> = (0..20_000u32).map(|j| (j * 7 + i * 13) as u8).collect();
            let id = repo.id_of(&data);
            repo.add_blob(&mut builder, id, BlobKind::Data, &data, None, Vec::new());
            ids.push(id);
        }
        repo.store_pack(builder).unwrap();
        for _ in 0..20 {
            repo.cache.lock().unwrap().frames.clear();
            repo.cache.lock().unwrap().order.clear();
            repo.cache.lock().unwrap().bytes = 0;
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for id in &ids {
                            repo.read_blob(id).unwrap();
                        }
                    });
                }
            });
            let c = repo.cache.lock().unwrap();
            let held: usize = c.frames.values().map(|f| f.len()).sum();
            assert_eq!(c.bytes, held);
            assert_eq!(c.order.len(), c.frames.len());
        }
    }
}
