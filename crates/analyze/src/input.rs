//! Reading the inputs once: each PATH is an image, cut into batches of items.
//!
//! A file tree's items are its regular files (in path order); a `.jsonl` or `.jsonl.zst`
//! document stream's items are its lines (one write each). Batches never mix images, and a
//! reader thread fills the next batch while the methods work on the current one.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::OnceLock;

use crate::direct::Source;
use crate::multi_cut::GearScan;
use crate::prefetch::Prefetcher;
use crate::AnalyzeError;

/// Bytes per batch handed to the methods.
pub const BATCH_BYTES: usize = 4 << 20;

/// What kind of items an image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    /// Files of a tree (or one file): byte streams.
    File,
    /// Documents of a JSON-lines write stream.
    Document,
}

/// One input PATH.
#[derive(Debug, Clone)]
pub struct Image {
    /// The path as given.
    pub path: PathBuf,
    /// Files (or the one stream) it holds, in reading order.
    pub files: Vec<PathBuf>,
    /// Sum of the files' sizes on disk (compressed size for `.zst`).
    pub disk_bytes: u64,
    /// Each file's size when listed.
    pub sizes: Vec<u64>,
    /// Items' kind.
    pub kind: ItemKind,
    /// Directories of the tree whose entries could not be read.
    pub unlisted: Vec<Changed>,
    /// Whether its size is known before it is read (not a pipe or a character device).
    pub sized: bool,
}

/// A contiguous part of an item inside a batch's buffer.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    /// Start offset in [`Batch::data`].
    pub start: usize,
    /// End offset in [`Batch::data`].
    pub end: usize,
    /// True when this piece ends its item.
    pub item_end: bool,
    /// True when no other file of the input had this item's size when listed: the item is
    /// then new to whole-item dedup, which need not hash it.
    pub size_unique: bool,
}

/// A file of a tree the analysis could not take as listed: it changed while the analysis
/// ran (which then covers the bytes it read), or it could not be read or listed at all (which
/// the analysis leaves out). Each gets a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The file (or directory).
    pub path: PathBuf,
    /// Its length when the input was listed (0 for a directory).
    pub listed: u64,
    /// What happened to it.
    pub what: Change,
}

/// What happened to a [`Changed`] file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Read, with this many bytes: it grew or shrank since it was listed.
    Read(u64),
    /// Removed before it could be opened.
    Removed,
    /// Opening it was refused (the error says why): the user may not read it.
    Unreadable(String),
    /// A directory whose entries could not be read (the error says why).
    Unlisted(String),
}

/// A batch of item pieces from one image.
#[derive(Debug)]
pub struct Batch {
    /// Index of the image in the input list.
    pub image: usize,
    /// Kind of the items.
    pub kind: ItemKind,
    /// Number of the batch in the whole input, from 0: every compressed stream samples the
    /// same batches.
    pub seq: u64,
    /// The bytes.
    pub data: BatchBuf,
    /// The pieces, in order.
    pub pieces: Vec<Piece>,
    /// Its Gear cut candidates, found by the first runner that needs them
    /// ([`crate::multi_cut::gear_scan`]).
    pub gear: OnceLock<GearScan>,
    /// Files that end in this batch and changed while they were read.
    pub changed: Vec<Changed>,
}

/// A batch's bytes, starting at a page boundary so that a file read around the page cache
/// goes straight into them (see [`crate::direct`]): reading the five Debian images that way
/// spared a copy of every byte.
pub struct BatchBuf {
    /// `skew` bytes of padding, then the batch's bytes.
    buf: Vec<u8>,
    skew: usize,
}

impl BatchBuf {
    /// An empty buffer with room for `cap` bytes from an aligned start.
    pub fn with_capacity(cap: usize) -> BatchBuf {
        let align = crate::direct::ALIGN;
        let mut buf: Vec<u8> = Vec::with_capacity(cap + align);
        let skew = buf.as_ptr().align_offset(align).min(align);
        buf.resize(skew, 0);
        BatchBuf { buf, skew }
    }

    /// The buffer bytes are appended to: its contents past the padding are the batch's bytes.
    pub fn appender(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Keeps the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(self.skew + len);
    }
}

impl std::ops::Deref for BatchBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.skew..]
    }
}

impl std::fmt::Debug for BatchBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchBuf")
            .field("len", &self.len())
            .finish()
    }
}

impl AsRef<[u8]> for Batch {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Batch {
    /// The bytes of `piece`.
    pub fn bytes(&self, piece: &Piece) -> &[u8] {
        &self.data[piece.start..piece.end]
    }
}

fn is_document_stream(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".jsonl") || name.ends_with(".jsonl.zst")
}

/// Lists the images: stats every PATH and walks directories (symlinks are not followed).
pub fn scan(paths: &[PathBuf]) -> Result<Vec<Image>, AnalyzeError> {
    let mut images = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| AnalyzeError::io(path, e))?;
        let device = is_block_device(&meta);
        let mut files = Vec::new();
        let mut sizes = Vec::new();
        let mut unlisted = Vec::new();
        if meta.is_dir() {
            (files, sizes, unlisted) = list_files(path)?;
        } else {
            // Only a block device is opened here: opening a FIFO would wait for its writer.
            let len = match device {
                true => File::open(path).map_or(0, |f| crate::direct::stream_len(&f, &meta)),
                false => meta.len(),
            };
            sizes.push(len);
            files.push(path.clone());
        }
        let kind = if files.len() == 1 && is_document_stream(&files[0]) {
            ItemKind::Document
        } else {
            ItemKind::File
        };
        images.push(Image {
            path: path.clone(),
            files,
            disk_bytes: sizes.iter().sum(),
            sizes,
            kind,
            unlisted,
            sized: meta.is_dir() || meta.is_file() || device,
        });
    }
    Ok(images)
}

/// Whether `meta` is a block device's (a disk, a VM's volume).
pub(crate) fn is_block_device(meta: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    return std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type());
    #[cfg(not(unix))]
    false
}

/// Directories [`list_files`] reads at once: on a cold cache each directory and inode read
/// waits on the disk, and the 76 590 files of the benchmark's five trees were listed in
/// 0.8 s by eight `find`s against 1.4 s by one.
const LIST_THREADS: usize = 8;

/// The regular files under `dir` (symbolic links not followed), each directory's entries in
/// name order and its subdirectories' files in place, with their sizes; directories are read
/// by [`LIST_THREADS`] threads. Directories below `dir` the user may not read (or removed
/// while listed) are left out and returned, as `du` and `tar` go on past them.
fn list_files(dir: &Path) -> Result<Listed, AnalyzeError> {
    let walk = jwalk::WalkDirGeneric::<((), u64)>::new(dir)
        .sort(true)
        .skip_hidden(false)
        .follow_links(false)
        .parallelism(jwalk::Parallelism::RayonNewPool(LIST_THREADS))
        .process_read_dir(|_, _, _, children| {
            for entry in children.iter_mut().flatten() {
                if entry.file_type.is_file() {
                    entry.client_state = entry.metadata().map_or(0, |m| m.len());
                }
            }
        });
    let (mut files, mut sizes, mut unlisted) = (Vec::new(), Vec::new(), Vec::new());
    for entry in walk {
        let mut entry = entry.map_err(|e| {
            let p = e.path().unwrap_or(dir).to_path_buf();
            AnalyzeError::io(&p, e.into())
        })?;
        if let Some(e) = entry.read_children_error.take() {
            // jwalk goes on past a directory it could not read, and says so only here. One
            // the user may not read, or one removed since its parent was read (a live tree's
            // temporary directory), is left out; a failing disk is an error.
            use std::io::ErrorKind::{NotFound, PermissionDenied};
            let io = match e.io_error() {
                Some(_) => e.into_io_error().expect("an I/O error"),
                None => e.into(),
            };
            if entry.depth == 0 || !matches!(io.kind(), PermissionDenied | NotFound) {
                return Err(AnalyzeError::io(&entry.path(), io));
            }
            unlisted.push(Changed {
                path: entry.path(),
                listed: 0,
                what: Change::Unlisted(io.to_string()),
            });
        }
        if entry.file_type.is_file() {
            sizes.push(entry.client_state);
            files.push(entry.path());
        }
    }
    Ok((files, sizes, unlisted))
}

/// A tree's files, their sizes, and the directories that could not be listed.
type Listed = (Vec<PathBuf>, Vec<u64>, Vec<Changed>);

/// Starts a reader thread that sends the images' batches in order; an error ends the stream.
pub fn read_batches(images: Vec<Image>) -> Receiver<Result<Batch, AnalyzeError>> {
    let (tx, rx) = sync_channel(2);
    std::thread::spawn(move || {
        let mut same_size: HashMap<u64, u32> = HashMap::new();
        for image in images.iter().filter(|i| i.kind == ItemKind::File) {
            for &size in &image.sizes {
                *same_size.entry(size).or_default() += 1;
            }
        }
        let files = images
            .iter()
            .filter(|i| i.kind == ItemKind::File)
            .flat_map(|i| i.files.iter().cloned().zip(i.sizes.iter().copied()))
            .collect();
        let prefetch = Prefetcher::start(files);
        let mut opened = 0;
        let mut seq = 0;
        let mut send = |mut b: Batch| {
            b.seq = seq;
            seq += 1;
            tx.send(Ok(b)).is_ok()
        };
        for (i, image) in images.iter().enumerate() {
            let result = match image.kind {
                ItemKind::File => {
                    let first = opened;
                    opened += image.files.len();
                    read_files(i, image, &same_size, (&prefetch, first), &mut send)
                }
                ItemKind::Document => read_documents(i, image, &mut send),
            };
            if let Err(e) = result {
                let _ = tx.send(Err(e));
                return;
            }
        }
    });
    rx
}

fn new_batch(image: usize, kind: ItemKind) -> Batch {
    Batch {
        image,
        kind,
        seq: 0,
        data: BatchBuf::with_capacity(BATCH_BYTES),
        pieces: Vec::new(),
        gear: OnceLock::new(),
        changed: Vec::new(),
    }
}

/// Reads `image`'s files into batches, taking those `prefetch` read ahead from it; the
/// image's first file is its file number `first`.
fn read_files(
    index: usize,
    image: &Image,
    same_size: &HashMap<u64, u32>,
    (prefetch, first): (&Prefetcher, usize),
    send: &mut dyn FnMut(Batch) -> bool,
) -> Result<(), AnalyzeError> {
    let mut batch = new_batch(index, ItemKind::File);
    batch.changed.extend(image.unlisted.iter().cloned());
    let in_tree = image.files.first() != Some(&image.path);
    for (k, (path, size)) in image.files.iter().zip(&image.sizes).enumerate() {
        let size_unique = same_size.get(size) == Some(&1);
        let mut file = match prefetch.take(first + k) {
            Some(fetched) => Source::Fetched(fetched),
            None => match Source::open(path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Removed since it was listed, as temporary files of a live tree are.
                    batch.changed.push(Changed {
                        path: path.clone(),
                        listed: *size,
                        what: Change::Removed,
                    });
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && in_tree => {
                    // One file of a tree the user may not read (`/etc/shadow` in `/etc`) is
                    // left out, as `du` and `tar` do, rather than failing the whole run; a
                    // PATH given by name is not.
                    batch.changed.push(Changed {
                        path: path.clone(),
                        listed: *size,
                        what: Change::Unreadable(e.to_string()),
                    });
                    continue;
                }
                Err(e) => return Err(AnalyzeError::io(path, e)),
            },
        };
        let mut read = 0u64;
        loop {
            let start = batch.data.len();
            let want = BATCH_BYTES - start;
            let n = file
                .read_up_to(want, batch.data.appender())
                .map_err(|e| AnalyzeError::io(path, e))?;
            read += n as u64;
            let item_end = n < want;
            if n > 0 || item_end {
                batch.pieces.push(Piece {
                    start,
                    end: start + n,
                    item_end,
                    size_unique,
                });
            }
            // Pipes and devices have no length to compare with: only regular files changed.
            let regular = || std::fs::metadata(path).map_or(true, |m| m.is_file());
            if item_end && read != *size && regular() {
                batch.changed.push(Changed {
                    path: path.clone(),
                    listed: *size,
                    what: Change::Read(read),
                });
            }
            if batch.data.len() >= BATCH_BYTES {
                let full = std::mem::replace(&mut batch, new_batch(index, ItemKind::File));
                if !send(full) {
                    return Ok(());
                }
            }
            if item_end {
                break;
            }
        }
        if let Source::Fetched(fetched) = file {
            prefetch.recycle(fetched);
        }
    }
    if !batch.pieces.is_empty() {
        send(batch);
    }
    Ok(())
}

fn read_documents(
    index: usize,
    image: &Image,
    send: &mut dyn FnMut(Batch) -> bool,
) -> Result<(), AnalyzeError> {
    let path = &image.files[0];
    let file = File::open(path).map_err(|e| AnalyzeError::io(path, e))?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "zst") {
        let decoder = zstd::Decoder::new(file).map_err(|e| AnalyzeError::io(path, e))?;
        Box::new(Explained(decoder))
    } else {
        Box::new(file)
    };
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let mut batch = new_batch(index, ItemKind::Document);
    loop {
        let start = batch.data.len();
        let n = reader
            .read_until(b'\n', batch.data.appender())
            .map_err(|e| AnalyzeError::io(path, e))?;
        if n == 0 {
            break;
        }
        let mut end = batch.data.len();
        if batch.data[end - 1] == b'\n' {
            end -= 1;
            batch.data.truncate(end);
        }
        batch.pieces.push(Piece {
            start,
            end,
            item_end: true,
            size_unique: false,
        });
        if batch.data.len() >= BATCH_BYTES {
            let full = std::mem::replace(&mut batch, new_batch(index, ItemKind::Document));
            if !send(full) {
                return Ok(());
            }
        }
    }
    if !batch.pieces.is_empty() {
        send(batch);
    }
    Ok(())
}

/// A zstd stream whose errors say what is wrong with the file: zstd's own messages
/// ("Unknown frame descriptor", "incomplete frame") name no cause a user can act on.
struct Explained<R>(R);

impl<R: Read> Read for Explained<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf).map_err(explain_zstd)
    }
}

/// `e`, from decoding a `.zst` file, with what it means; errors of the file's own reads
/// (they carry an OS error code) are left as they are.
fn explain_zstd(e: std::io::Error) -> std::io::Error {
    use std::io::ErrorKind;
    if e.raw_os_error().is_some() || e.kind() == ErrorKind::Interrupted {
        return e;
    }
    let what = if e.kind() == ErrorKind::UnexpectedEof {
        "the zstd stream ends in the middle of a frame: the file is truncated, or still being written"
    } else if e.to_string().contains("Unknown frame descriptor") {
        "the file is not zstd-compressed, though its name ends in .zst"
    } else {
        "the file is damaged: its zstd stream does not decode"
    };
    std::io::Error::new(e.kind(), format!("{what} ({e})"))
}

/// Splits `items` into batches of `batch` bytes (the last one shorter), splitting items across
/// batches the way the readers do.
#[cfg(test)]
pub(crate) fn test_batches(items: &[Vec<u8>], batch: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut cur = new_batch(0, ItemKind::File);
    for item in items {
        let mut rest = &item[..];
        loop {
            let take = rest.len().min(batch - cur.data.len());
            let start = cur.data.len();
            cur.data.appender().extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            cur.pieces.push(Piece {
                start,
                end: start + take,
                item_end: rest.is_empty(),
                size_unique: false,
            });
            if cur.data.len() >= batch {
                out.push(std::mem::replace(&mut cur, new_batch(0, ItemKind::File)));
            }
            if rest.is_empty() {
                break;
            }
        }
    }
    if !cur.pieces.is_empty() {
        out.push(cur);
    }
    for (seq, b) in out.iter_mut().enumerate() {
        b.seq = seq as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new directory `name` under the repository's `target/`: on the repository's
    /// filesystem, where the tests that read around the page cache want their files.
    fn scratch_dir(name: &str) -> PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/input-tests")
            .join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A loop device over a file, detached when dropped.
    struct Loop(String);

    impl Loop {
        /// `file` as a block device, if this runs as root where loop devices exist (as CI does).
        fn attach(file: &Path) -> Option<Loop> {
            let out = std::process::Command::new("losetup")
                .args(["-f", "--show"])
                .arg(file)
                .output()
                .ok()?;
            let dev = String::from_utf8(out.stdout).ok()?.trim().to_string();
            (out.status.success() && !dev.is_empty()).then_some(Loop(dev))
        }
    }

    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &self.0])
                .status();
        }
    }

    #[test]
    fn a_block_device_is_listed_and_read_with_its_size() {
        let dir = scratch_dir("device");
        let file = dir.join("disk.img");
        // Large enough to be read around the page cache, and not a whole number of pages.
        let len = crate::direct::DIRECT_MIN as usize + 5 * 512;
        let bytes: Vec<u8> = (0..len as u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&file, &bytes).unwrap();
        let Some(dev) = Loop::attach(&file) else {
            std::fs::remove_dir_all(&dir).unwrap();
            eprintln!("skipped: no loop device (needs root and losetup)");
            return;
        };
        let source = crate::direct::Source::open(Path::new(&dev.0)).unwrap();
        assert!(
            matches!(source, crate::direct::Source::Direct(_)),
            "a device is read as large as it is"
        );
        let images = scan(&[PathBuf::from(&dev.0)]).unwrap();
        assert_eq!(images[0].sizes, [len as u64], "its metadata says 0");
        assert_eq!(images[0].disk_bytes, len as u64);
        let read: Vec<u8> = read_batches(images)
            .into_iter()
            .flat_map(|b| b.unwrap().data.to_vec())
            .collect();
        drop(dev);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(read == bytes, "read {} bytes of {len}", read.len());
    }

    #[test]
    fn files_that_changed_or_went_since_listed_are_reported_with_the_bytes_read() {
        let root = std::env::temp_dir().join(format!("dedupwire-changed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        // Two of them span batches.
        let files = [
            ("gone", 10),
            ("grows", 5 << 20),
            ("same", 100),
            ("shrinks", 9 << 20),
        ];
        for (name, len) in files {
            std::fs::write(root.join(name), vec![b'x'; len]).unwrap();
        }
        let images = scan(std::slice::from_ref(&root)).unwrap();
        std::fs::remove_file(root.join("gone")).unwrap();
        std::fs::write(root.join("grows"), vec![b'y'; (5 << 20) + 7]).unwrap();
        std::fs::write(root.join("shrinks"), vec![b'z'; 3]).unwrap();
        let mut changed = Vec::new();
        let mut bytes = 0;
        for b in read_batches(images) {
            let b = b.unwrap();
            bytes += b.data.len() as u64;
            changed.extend(b.changed);
        }
        std::fs::remove_dir_all(&root).unwrap();
        changed.sort_by(|a, b| a.path.cmp(&b.path));
        let want = [
            ("gone", 10, Change::Removed),
            ("grows", 5 << 20, Change::Read((5 << 20) + 7)),
            ("shrinks", 9 << 20, Change::Read(3)),
        ];
        let want: Vec<Changed> = want
            .iter()
            .map(|(name, listed, what)| Changed {
                path: root.join(name),
                listed: *listed,
                what: what.clone(),
            })
            .collect();
        assert_eq!(changed, want);
        assert_eq!(bytes, (5 << 20) + 7 + 100 + 3);
    }

    #[test]
    fn pieces_say_whether_another_file_of_any_image_has_their_size() {
        let root = std::env::temp_dir().join(format!("dedupwire-sizes-{}", std::process::id()));
        let tree = root.join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        for (name, len) in [("a", 3), ("b", 3), ("c", 5), ("f", 9)] {
            std::fs::write(tree.join(name), vec![b'x'; len]).unwrap();
        }
        std::fs::write(root.join("d"), [b'y'; 5]).unwrap();
        let images = scan(&[tree, root.join("d")]).unwrap();
        let flags: Vec<(usize, bool)> = read_batches(images)
            .into_iter()
            .flat_map(|b| {
                let b = b.unwrap();
                b.pieces
                    .iter()
                    .map(|p| (p.end - p.start, p.size_unique))
                    .collect::<Vec<_>>()
            })
            .collect();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            flags,
            [(3, false), (3, false), (5, false), (9, true), (5, false)]
        );
    }

    #[test]
    fn a_tree_lists_its_regular_files_depth_first_in_name_order() {
        let root = std::env::temp_dir().join(format!("dedupwire-list-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in ["b/d", "b/c", "a", ".hidden"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        for (name, len) in [
            ("z", 1),
            ("b/d/x", 2),
            ("b/c/y", 3),
            ("b/a", 4),
            ("a/f", 5),
            (".hidden/h", 6),
            (".dot", 7),
            ("B", 8),
        ] {
            std::fs::write(root.join(name), vec![0u8; len]).unwrap();
        }
        std::os::unix::fs::symlink(root.join("z"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("b"), root.join("linked-dir")).unwrap();
        let (files, sizes, unlisted) = list_files(&root).unwrap();
        assert!(unlisted.is_empty());
        let names: Vec<String> = files
            .iter()
            .map(|f| f.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            names,
            [
                ".dot",
                ".hidden/h",
                "B",
                "a/f",
                "b/a",
                "b/c/y",
                "b/d/x",
                "z"
            ],
            "hidden files count, links do not"
        );
        assert_eq!(sizes, [7, 6, 8, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn a_tree_that_cannot_be_listed_is_an_error_naming_it() {
        let missing = std::env::temp_dir().join(format!("dedupwire-none-{}", std::process::id()));
        let failure = list_files(&missing).expect_err("no such tree").to_string();
        assert!(failure.contains("dedupwire-none-"), "{failure}");
        assert!(failure.contains("No such file"), "{failure}");
    }

    #[cfg(unix)]
    #[test]
    fn a_pipe_is_read_to_its_end_and_has_no_length_to_have_changed_from() {
        let dir = std::env::temp_dir().join(format!("dedupwire-pipe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("stream");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let images = scan(std::slice::from_ref(&fifo)).unwrap();
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::write(fifo, vec![7u8; 6 << 20]).unwrap())
        };
        let (mut bytes, mut changed) = (0, Vec::new());
        for b in read_batches(images) {
            let b = b.unwrap();
            bytes += b.data.len();
            changed.extend(b.changed);
        }
        writer.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(bytes, 6 << 20);
        assert_eq!(changed, []);
    }

    #[test]
    fn a_file_gone_since_it_was_listed_is_named_while_workers_read_ahead() {
        // On the repository's filesystem (the workers read ahead around the page cache there).
        let root = scratch_dir("gone");
        for i in 0..40 {
            std::fs::write(root.join(format!("f{i:02}")), vec![i as u8; 10_000]).unwrap();
        }
        let images = scan(std::slice::from_ref(&root)).unwrap();
        std::fs::remove_file(root.join("f30")).unwrap();
        let (mut changed, mut items) = (Vec::new(), 0);
        for b in read_batches(images) {
            let b = b.unwrap();
            items += b.pieces.iter().filter(|p| p.item_end).count();
            changed.extend(b.changed);
        }
        std::fs::remove_dir_all(&root).unwrap();
        let gone = Changed {
            path: root.join("f30"),
            listed: 10_000,
            what: Change::Removed,
        };
        assert_eq!(changed, [gone]);
        assert_eq!(items, 39);
    }
}
