//! sDedup's feature index (§4.2): maps the 64-bit sketch features of documents to the records
//! (documents) that have them, with little RAM per feature.
//!
//! Two levels, as in the paper:
//!
//! - in RAM, a cuckoo hash table with 16 hash functions and 8 buckets per slot; a bucket is a
//!   2-byte signature of the feature and a 4-byte pointer, about 6 bytes per feature;
//! - on disk, an append-only metadata log of 64 KiB pages holding the real entries
//!   (feature, record ids newest first), read through an LRU page cache. A signature match is
//!   confirmed by reading the entry and comparing the full feature, so a 16-bit signature
//!   collision never returns a wrong answer.
//!
//! Each feature keeps at most `max_per_feature` records; inserting a record makes it the newest
//! and evicts the least recently inserted. The log is compacted when it holds too much dead data,
//! survives crashes (a torn tail is cut off, damage to durable bytes is an
//! [`Error::Corrupt`]), and the table is rebuilt on open from the log or loaded from a
//! checkpoint. The on-disk format is described in `FORMAT.md`.
//!
//! ```
//! use dedupwire_index::{Config, FeatureIndex};
//! # let dir = tempfile::tempdir().unwrap();
//! let mut index = FeatureIndex::open(dir.path(), Config::default())?;
//! index.insert(1, &[10, 20, 30])?;
//! index.insert(2, &[20, 30, 40])?;
//! assert_eq!(index.lookup(&[20, 30, 50])?, vec![(2, 2), (1, 2)]);
//! index.close()?;
//! # Ok::<(), dedupwire_index::Error>(())
//! ```
#![deny(missing_docs)]

mod cache;
mod checkpoint;
mod error;
mod format;
mod index;
mod log;
mod table;

pub use error::{Error, Result};
pub use format::{MAX_IDS_PER_ENTRY, PAGE_SIZE};
pub use index::{Config, FeatureIndex, Recovery, Stats, CHECKPOINT_FILE, LOG_FILE};
pub use log::Truncation;
pub use table::{BUCKETS, BUCKET_BYTES, HASHES};
