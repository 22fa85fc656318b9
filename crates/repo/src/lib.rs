//! The backup repository of `dedupwire backup`: content-addressed blobs (whole chunks, deltas
//! against whole chunks, trees) in encrypted packs, immutable index files, snapshots, a config
//! and password-wrapped keys, all stored through a [`Backend`] shaped like an object store.
//! The layout is in `crates/repo/FORMAT.md`.
//!
//! - [`backend`]: where objects live (a local directory, or an S3 bucket with [`s3`]): list,
//!   ranged get, put-if-absent, delete; no rename, no append.
//! - [`crypto`]: the master key, sealing and opening objects (XChaCha20-Poly1305), keyed blob
//!   ids (BLAKE3), key files (argon2id);
//! - [`blob`], [`pack`], [`index`], [`tree`], [`snapshot`]: what is stored;
//! - [`repository`]: a repository opened with its password, reading and writing all that;
//! - [`files_cache`]: what a backup keeps locally to skip unchanged files;
//! - [`backup`], [`restore`], [`check`], [`prune`], [`diff`]: the operations.
#![deny(missing_docs)]

pub mod backend;
pub mod backup;
pub mod blob;
pub mod check;
pub mod crypto;
pub mod diff;
pub mod files_cache;
pub mod index;
pub mod pack;
pub mod prune;
pub mod repository;
pub mod restore;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(feature = "s3")]
pub mod s3server;
pub mod snapshot;
pub mod time;
pub mod tree;

pub use backend::{
    create_location, open_location, Backend, BackendError, BackendStats, LocalBackend, ObjectKind,
    OpStats,
};
pub use blob::{BlobId, BlobKind};
pub use crypto::{CryptoError, KdfParams, KeyInfo, MasterKey};
pub use repository::{Config, RepoError, Repository};
#[cfg(feature = "s3")]
pub use s3::{S3Backend, S3Options, S3Url};
pub use snapshot::{Snapshot, Summary};
