//! Asking the kernel to read the files of a tree ahead of the reader.
//!
//! The reader takes the files one after another, so on a cold cache each small file costs a
//! disk round trip during which nothing else is read: a tree of 108 000 files (5.2 GB) took
//! longer to read than to analyze. A thread running ahead of it opens the next files and
//! asks for their pages (`POSIX_FADV_WILLNEED`), so many reads are in flight at once and the
//! reader finds the pages cached. It stays at most [`AHEAD_BYTES`] and [`AHEAD_FILES`] ahead,
//! and leaves alone the files large enough to be read around the page cache
//! ([`crate::direct::DIRECT_MIN`]), which are read in large requests anyway.

use std::fs::File;
#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::direct::DIRECT_MIN;

/// Bytes of files asked for and not yet reached by the reader, at most.
const AHEAD_BYTES: u64 = 64 << 20;

/// Files asked for and not yet reached by the reader, at most.
const AHEAD_FILES: usize = 4096;

/// How long the thread waits before looking again when it is far enough ahead.
const PAUSE: Duration = Duration::from_millis(1);

/// A thread that asks for the pages of the files the reader will want next.
pub struct Prefetcher {
    /// How many of the files the reader has opened.
    reached: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts asking for `files` (path and size, in the order the reader takes them).
    pub fn start(files: Vec<(PathBuf, u64)>) -> Prefetcher {
        Prefetcher::start_with(files, AHEAD_BYTES, AHEAD_FILES)
    }

    /// [`Prefetcher::start`], at most `bytes` and `count` files ahead.
    fn start_with(files: Vec<(PathBuf, u64)>, bytes: u64, count: usize) -> Prefetcher {
        let reached = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let handle = cfg!(target_os = "linux").then(|| {
            let (reached, stop) = (Arc::clone(&reached), Arc::clone(&stop));
            std::thread::spawn(move || run(&files, (bytes, count), &reached, &stop))
        });
        Prefetcher {
            reached,
            stop,
            handle,
        }
    }

    /// Says that the reader opens file number `n` (from 0) now.
    pub fn reach(&self, n: usize) {
        self.reached.store(n, Ordering::Relaxed);
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Whether a file of `size` bytes is asked for.
fn wanted(size: u64) -> bool {
    size > 0 && size < DIRECT_MIN
}

/// Asks for `files` in order, at most `ahead` (bytes, files) beyond the one `reached` says the
/// reader is at, until `stop`.
fn run(files: &[(PathBuf, u64)], ahead: (u64, usize), reached: &AtomicUsize, stop: &AtomicBool) {
    // Bytes of the wanted files before each file.
    let mut before = Vec::with_capacity(files.len() + 1);
    let mut sum = 0;
    for &(_, size) in files {
        before.push(sum);
        sum += if wanted(size) { size } else { 0 };
    }
    before.push(sum);
    let mut next = 0;
    while next < files.len() && !stop.load(Ordering::Relaxed) {
        let r = reached.load(Ordering::Relaxed);
        if next <= r {
            // The reader is there already (its own read asks for the pages).
            next = r + 1;
            continue;
        }
        let beyond = before[next + 1] - before[r + 1];
        if beyond > ahead.0 || next - r > ahead.1 {
            std::thread::sleep(PAUSE);
            continue;
        }
        let (path, size) = &files[next];
        if wanted(*size) {
            if let Ok(file) = File::open(path) {
                will_need(&file, *size);
            }
        }
        next += 1;
    }
}

/// Bytes asked for at once: the kernel reads at most its readahead window (or the device's
/// largest request) per request, often less than a file.
const PIECE: u64 = 2 << 20;

/// Asks the kernel to start reading the first `len` bytes of `file` into the page cache.
#[cfg(target_os = "linux")]
fn will_need(file: &File, len: u64) {
    use std::os::fd::AsRawFd;
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        // SAFETY: advice on a descriptor we own; it changes no memory of ours, and a refusal
        // (or a file that shrank) only leaves the reader to read the pages itself. Both
        // values are below `DIRECT_MIN`, so they fit an `off_t`.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                at as libc::off_t,
                n as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
        at += n;
    }
}

#[cfg(not(target_os = "linux"))]
fn will_need(_: &File, _: u64) {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::direct::cached_fraction;
    use std::time::Instant;

    const LEN: usize = 64 << 10;

    /// `n` files of [`LEN`] bytes under `target/`, written, synced and dropped from the page
    /// cache; `None` where the filesystem keeps them cached anyway (tmpfs).
    fn evicted_files(name: &str, n: usize) -> Option<(PathBuf, Vec<(PathBuf, u64)>)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/prefetch-tests")
            .join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = Vec::new();
        for i in 0..n {
            let path = dir.join(format!("f{i}"));
            std::fs::write(&path, vec![i as u8; LEN]).unwrap();
            let f = File::open(&path).unwrap();
            f.sync_all().unwrap();
            #[cfg(target_os = "linux")]
            // SAFETY: advice on a descriptor we own; it only drops clean cached pages.
            unsafe {
                use std::os::fd::AsRawFd;
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
            if cached(&path) > 0.0 {
                eprintln!("cannot drop files from the page cache here; prefetching is not tested");
                let _ = std::fs::remove_dir_all(&dir);
                return None;
            }
            files.push((path, LEN as u64));
        }
        Some((dir, files))
    }

    fn cached(path: &Path) -> f64 {
        cached_fraction(&File::open(path).unwrap(), LEN as u64)
    }

    /// Waits until files `want` are all cached (or five seconds pass); whether they were.
    fn wait_cached(files: &[(PathBuf, u64)], want: std::ops::Range<usize>) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if files[want.clone()].iter().all(|(p, _)| cached(p) == 1.0) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    fn uncached(files: &[(PathBuf, u64)], which: std::ops::Range<usize>) -> bool {
        files[which].iter().all(|(p, _)| cached(p) == 0.0)
    }

    #[test]
    fn the_files_just_ahead_of_the_reader_are_read_and_no_more() {
        let Some((dir, files)) = evicted_files("count", 8) else {
            return;
        };
        let p = Prefetcher::start_with(files.clone(), u64::MAX, 3);
        assert!(
            wait_cached(&files, 1..4),
            "the three files after the reader's"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            uncached(&files, 0..1),
            "the reader's own file is its to read"
        );
        assert!(uncached(&files, 4..8), "nothing beyond three files ahead");
        p.reach(4);
        assert!(
            wait_cached(&files, 5..8),
            "the files after the reader's new one"
        );
        drop(p);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_prefetcher_stays_within_its_bytes_ahead_and_skips_large_files() {
        let Some((dir, mut files)) = evicted_files("bytes", 6) else {
            return;
        };
        // File 2 is listed as too large to ask for: it takes no room in the window.
        files[2].1 = DIRECT_MIN;
        let p = Prefetcher::start_with(files.clone(), 2 * LEN as u64, usize::MAX);
        assert!(wait_cached(&files, 3..4));
        assert!(wait_cached(&files, 1..2));
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            uncached(&files, 2..3),
            "a file read around the cache is not asked for"
        );
        assert!(uncached(&files, 4..6), "two files' bytes ahead at most");
        drop(p);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
