//! How much memory an analysis may take, and the chunk sampling that keeps it there.
//!
//! Exact dedup's indexes grow with the unique chunks seen: on data with no duplicates, about
//! 140 MB per GB of input at the five chunk sizes of the quick sweep. A terabyte would need
//! 140 GB and be killed by the kernel hours in, with nothing to show. So before reading, the
//! analysis bounds its indexes' memory as if no chunk repeated and, when that bound does not
//! fit the budget, indexes one chunk in N (the `--sample-chunks` sampling, chosen by content)
//! with N just large enough.
//! The similarity window and the buffers take the rest of the budget, whatever the input.

use std::path::Path;

use dedupwire_engine::chunk::ChunkerSpec;

use crate::input::{Image, ItemKind};
use crate::methods::MethodSpec;
use crate::AnalyzeError;

/// Bytes an exact-index entry can take at its peak: a 16-byte slot in a table at most three
/// quarters full, which doubles into a new table while the old one is still held.
pub const PEAK_BYTES_PER_ENTRY: u64 = 64;

/// Memory taken whatever the input: batches in flight, each compressed stream's buffers and
/// compressors, the memo and the threads. (Two files of 2 GB of random bytes with a 64 MiB
/// window peaked at 665 MB with one chunk in 16 indexed, 834 MB with one in 3 and 1 146 MB
/// with all: the indexes took about 140 MB per GB, under the 167 MB bound of
/// [`index_entries_bound`] at [`PEAK_BYTES_PER_ENTRY`].)
pub const FIXED_BYTES: u64 = 640 << 20;

/// The window's memory beyond its units' bytes (slabs left part full, the candidate index),
/// as the window's size divided by this: a quarter.
const WINDOW_OVERHEAD_DIV: u64 = 4;

/// Indexed documents are assumed at least this long, for the bound on whole documents.
const MIN_DOCUMENT_BYTES: u64 = 256;

/// A `.zst` stream whose frame does not state its size is assumed to expand this much.
const ZST_EXPANSION: u64 = 4;

/// The default budget: half the memory of this machine, or of the control group the process
/// runs in if that is smaller (a container's limit).
pub fn default_budget() -> u64 {
    let phys = physical_memory().unwrap_or(8 << 30);
    let limit = cgroup_limit().unwrap_or(u64::MAX);
    phys.min(limit) / 2
}

#[cfg(unix)]
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let (pages, page) = (u64::try_from(pages).ok()?, u64::try_from(page).ok()?);
    pages.checked_mul(page).filter(|&b| b > 0)
}

#[cfg(not(unix))]
fn physical_memory() -> Option<u64> {
    None
}

/// The cgroup v2 memory limit of this process, if it has one.
fn cgroup_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let path = Path::new("/sys/fs/cgroup")
        .join(rel.trim_start_matches('/'))
        .join("memory.max");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Bytes the items of `image` hold once read: its size on disk, or for a compressed document
/// stream (the one kind read decompressed) the size its first frame states, else
/// [`ZST_EXPANSION`] times its size on disk.
fn item_bytes(image: &Image) -> u64 {
    let zst = |p: &Path| p.extension().is_some_and(|e| e == "zst");
    image
        .files
        .iter()
        .zip(&image.sizes)
        .map(|(path, &size)| {
            if image.kind == ItemKind::Document && zst(path) {
                frame_content_size(path).unwrap_or(size.saturating_mul(ZST_EXPANSION))
            } else {
                size
            }
        })
        .sum()
}

/// The content size the zstd frame at the start of `path` states, if it does.
fn frame_content_size(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut head = [0u8; 18];
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(&mut head).ok()?;
    zstd::zstd_safe::get_frame_content_size(&head[..n])
        .ok()
        .flatten()
}

/// The most entries exact dedup's indexes can hold at once for `specs` over `images`: every
/// chunk unique. Each size has one table for both scopes; whole files count one entry each,
/// and whole documents one per [`MIN_DOCUMENT_BYTES`].
pub fn index_entries_bound(specs: &[MethodSpec], images: &[Image]) -> u64 {
    let (mut files, mut bytes, mut doc_bytes) = (0, 0, 0);
    for image in images {
        let b = item_bytes(image);
        files += image.files.len() as u64;
        bytes += b;
        if image.kind == ItemKind::Document {
            doc_bytes += b;
        }
    }
    specs
        .iter()
        .map(|s| match s {
            MethodSpec::Exact(ChunkerSpec::Fixed { size }) => bytes / (*size as u64).max(1),
            MethodSpec::Exact(ChunkerSpec::Cdc { avg, .. }) => bytes / (*avg as u64).max(1),
            MethodSpec::Exact(_) => files + doc_bytes / MIN_DOCUMENT_BYTES,
            _ => 0,
        })
        .sum()
}

/// What a `budget` of bytes leaves exact dedup's indexes beside a similarity window of
/// `window` bytes and [`FIXED_BYTES`]: `None` if under a MiB.
pub fn index_room(window: u64, budget: u64) -> Option<u64> {
    budget
        .checked_sub(fixed_bytes(window))
        .filter(|&r| r >= 1 << 20)
}

/// Memory the analysis takes besides the indexes, with a window of `window` bytes.
fn fixed_bytes(window: u64) -> u64 {
    FIXED_BYTES + window + window / WINDOW_OVERHEAD_DIV
}

/// The error for a `budget` that [`index_room`] leaves nothing of.
pub fn no_room(window: u64, budget: u64) -> AnalyzeError {
    AnalyzeError::Usage(format!(
        "a memory budget of {} MiB leaves nothing for exact dedup's indexes: the similarity window ({} MiB) and the buffers take about {} MiB; give more with --memory or a smaller --window",
        budget >> 20,
        window >> 20,
        fixed_bytes(window) >> 20
    ))
}

/// The chunk sample that keeps `entries` index entries within `room` bytes.
pub fn chunk_sample_within(entries: u64, room: u64) -> u64 {
    let need = entries.saturating_mul(PEAK_BYTES_PER_ENTRY);
    need.div_ceil(room.max(1)).clamp(1, 1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn image(bytes: u64, files: usize) -> Image {
        Image {
            path: PathBuf::from("img"),
            files: (0..files).map(|i| PathBuf::from(format!("f{i}"))).collect(),
            disk_bytes: bytes,
            sizes: vec![bytes / files as u64; files],
            kind: ItemKind::File,
            unlisted: Vec::new(),
            sized: true,
        }
    }

    fn quick() -> Vec<MethodSpec> {
        crate::methods::parse_methods("all-quick", false).unwrap()
    }

    #[test]
    fn the_bound_counts_every_chunk_of_every_size_as_unique() {
        let images = [image(1 << 30, 4), image(1 << 30, 6)];
        let per_byte: f64 = [1u64, 4, 16, 64, 128]
            .iter()
            .map(|k| 2.0 / (k * 1024) as f64)
            .sum();
        let want = (2u64 << 30) as f64 * per_byte + 10.0;
        let got = index_entries_bound(&quick(), &images) as f64;
        assert!((got - want).abs() <= 10.0, "{got} vs {want}");
    }

    #[test]
    fn compressed_document_streams_count_what_they_expand_to_and_files_what_they_hold() {
        let dir = std::env::temp_dir().join(format!("dedupwire-memory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lines = "{\"op\":\"insert\"}\n".repeat(10_000);
        let zst = dir.join("docs.jsonl.zst");
        let of = |kind, frame: Vec<u8>| {
            std::fs::write(&zst, &frame).unwrap();
            let disk = frame.len() as u64;
            let bytes = item_bytes(&Image {
                path: zst.clone(),
                files: vec![zst.clone()],
                disk_bytes: disk,
                sizes: vec![disk],
                kind,
                unlisted: Vec::new(),
                sized: true,
            });
            (bytes, disk)
        };
        let sized = zstd::bulk::compress(lines.as_bytes(), 3).unwrap();
        assert_eq!(of(ItemKind::Document, sized.clone()).0, lines.len() as u64);
        let (bytes, disk) = of(ItemKind::File, sized);
        assert_eq!(bytes, disk, "a file in a tree is read as it is");
        // A streamed frame does not state its size.
        let streamed = zstd::encode_all(lines.as_bytes(), 3).unwrap();
        let (bytes, disk) = of(ItemKind::Document, streamed);
        assert_eq!(bytes, disk * ZST_EXPANSION);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_few_gb_fit_and_a_terabyte_is_sampled_into_the_budget() {
        let budget = 12 << 30;
        let window = 1 << 30;
        let room = index_room(window, budget).unwrap();
        assert_eq!(room, budget - FIXED_BYTES - window - window / 4);
        let few = index_entries_bound(&quick(), &[image(3_331_731_456, 5)]);
        assert_eq!(chunk_sample_within(few, room), 1);
        let tb = index_entries_bound(&quick(), &[image(1 << 40, 1000)]);
        let n = chunk_sample_within(tb, room);
        assert!(n > 1);
        assert!(tb * PEAK_BYTES_PER_ENTRY / n <= room, "1 in {n} fits");
        assert!(
            tb * PEAK_BYTES_PER_ENTRY / (n - 1) > room,
            "1 in {} would fit too",
            n - 1
        );
    }

    #[test]
    fn a_budget_the_window_fills_is_refused_with_what_to_change() {
        assert_eq!(index_room(1 << 30, 1 << 30), None);
        let msg = no_room(1 << 30, 1 << 30).to_string();
        assert!(
            msg.contains("--memory") && msg.contains("--window"),
            "{msg}"
        );
    }

    #[test]
    fn the_default_budget_is_half_of_what_the_process_may_use() {
        let b = default_budget();
        let phys = physical_memory().unwrap();
        assert!(b > 0 && b <= phys / 2, "{b} of {phys}");
    }
}
