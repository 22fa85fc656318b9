//! Reading the files of a tree ahead of the reader, several at once.
//!
//! The reader takes the files one after another, so on a cold cache each small file cost a
//! disk round trip during which nothing else was read: a tree of 108 000 files (5.2 GB) took
//! longer to read than to analyze. Worker threads now run ahead of it: each takes the next
//! file, and if it is not in the page cache reads it whole around the cache (`O_DIRECT`, as
//! [`crate::direct`] reads large files) into a buffer the reader then copies from. So many
//! reads are in flight at once, and the kernel does not fill and copy out a page-cache page
//! for every 4 KiB (eight readers of this project's Debian trees, 3.3 GB, took 4.5 CPU-seconds
//! through the cache and 2.9 around it, each copying what it read once more). A file in the
//! cache ([`crate::direct::cached_fraction`]), or on a filesystem that refuses `O_DIRECT`, is
//! only asked for
//! (`POSIX_FADV_WILLNEED`) and read by the reader as before.
//!
//! On Linux the workers are one thread with its reads in flight in an io_uring ([`ring`]):
//! each blocking read had cost a context switch and a wake-up, and eight threads reading the
//! Debian trees' 76 418 files under 16 MiB took 0.99–1.15 CPU-seconds of system time where
//! one ring took 0.49–0.62 (a scratch C program, cold cache, inodes cached as after the
//! listing; four runs each). Where the kernel offers no ring, [`WORKERS`] threads read as before.
//!
//! The workers stay at most [`AHEAD_BYTES`] and [`AHEAD_FILES`] ahead of the reader, and leave
//! alone the files large enough for the reader's own direct reads
//! ([`crate::direct::DIRECT_MIN`]), which are read in large requests anyway. A file a worker
//! could not read (gone, unreadable, grown since it was listed) is left to the reader, which
//! then reports what is wrong with it.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::direct::{cached_fraction, ALIGN, DIRECT_MIN};

/// Bytes of files taken by the workers and not yet by the reader, at most.
const AHEAD_BYTES: u64 = 16 << 20;

/// Files taken by the workers and not yet reached by the reader, at most.
const AHEAD_FILES: usize = 4096;

/// Threads reading ahead: enough reads in flight for a virtual disk (eight `cat`s read the
/// Debian trees at 573 MB/s, one `tar` at 207). Eight rather than four: the trees' cold
/// analysis 12.40 → 11.41 s, I/O wait 51–78 → 22–32 hundredths of a second (three pairs),
/// `/usr/lib` + `/usr/share` 22.7 and 18.3 → 16.1 and 16.4 s; sixteen were no faster.
const WORKERS: usize = 8;

/// Buffer capacity kept for reuse, at most (fresh memory costs a page fault per 4 KiB).
const POOL_BYTES: usize = 16 << 20;

/// Reads in flight in the ring at most.
#[cfg(target_os = "linux")]
const RING_READS: usize = 64;

/// How the files are read ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// One thread keeping its reads in flight in an io_uring, where the kernel offers one.
    Ring,
    /// [`WORKERS`] threads, each waiting in its own read (asked for by tests; otherwise what
    /// the ring falls back to).
    #[cfg_attr(not(test), allow(dead_code))]
    Threads,
}

/// Worker threads reading the files the reader will want next.
pub struct Prefetcher {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

struct Shared {
    /// Path and listed size of every file, in the reader's order.
    files: Vec<(PathBuf, u64)>,
    /// At most this many bytes and files ahead.
    ahead: (u64, usize),
    state: Mutex<State>,
    /// A fetch ended (the reader may wait for it).
    fetched: Condvar,
    /// The reader moved on, or all should stop (workers may wait for room).
    moved: Condvar,
}

#[derive(Default)]
struct State {
    /// The file the reader is at.
    reached: usize,
    /// The next file a worker takes.
    next: usize,
    /// Listed bytes of the files workers took and the reader did not yet.
    held: u64,
    /// The files workers took and the reader did not yet.
    slots: HashMap<usize, Slot>,
    /// Buffers for the workers to reuse, and their summed capacity.
    pool: Vec<Vec<u8>>,
    pooled: usize,
    /// `O_DIRECT` was refused: files are only asked for.
    no_direct: bool,
    /// The reader is done (or gave up): workers return.
    stop: bool,
    /// Workers waiting for room, and whether the reader waits for a file: who to wake.
    workers_waiting: usize,
    reader_waiting: bool,
}

enum Slot {
    Fetching,
    /// Read, with its listed size.
    Ready(Fetched, u64),
}

/// A file read ahead: its bytes in an aligned buffer, handed out by
/// [`Fetched::read_up_to`].
pub struct Fetched {
    /// `skew` zero bytes (so the file's bytes start aligned), then the file's bytes.
    buf: Vec<u8>,
    skew: usize,
    /// Bytes handed out so far.
    taken: usize,
}

impl Fetched {
    /// Appends up to `want` bytes to `out` and returns how many; fewer only at the end.
    pub fn read_up_to(&mut self, want: usize, out: &mut Vec<u8>) -> usize {
        let rest = &self.buf[self.skew + self.taken..];
        let n = rest.len().min(want);
        out.extend_from_slice(&rest[..n]);
        self.taken += n;
        n
    }
}

impl Prefetcher {
    /// Starts reading `files` (path and size, in the order the reader takes them) ahead.
    pub fn start(files: Vec<(PathBuf, u64)>) -> Prefetcher {
        Prefetcher::start_with(files, AHEAD_BYTES, AHEAD_FILES, Backend::Ring)
    }

    /// [`Prefetcher::start`], at most `bytes` and `count` files ahead, read by `backend`
    /// (threads where the kernel offers no ring).
    fn start_with(
        files: Vec<(PathBuf, u64)>,
        bytes: u64,
        count: usize,
        backend: Backend,
    ) -> Prefetcher {
        let shared = Arc::new(Shared {
            files,
            ahead: (bytes, count),
            state: Mutex::new(State::default()),
            fetched: Condvar::new(),
            moved: Condvar::new(),
        });
        let any = shared.files.iter().any(|&(_, size)| wanted(size));
        let mut workers = Vec::new();
        if cfg!(target_os = "linux") && any {
            #[cfg(target_os = "linux")]
            if let Some(ring) = (backend == Backend::Ring).then(ring::Ring::new).flatten() {
                let shared = Arc::clone(&shared);
                workers.push(std::thread::spawn(move || ring.work(&shared)));
            }
            if workers.is_empty() {
                workers = (0..WORKERS)
                    .map(|_| {
                        let shared = Arc::clone(&shared);
                        std::thread::spawn(move || work(&shared))
                    })
                    .collect();
            }
        }
        let _ = backend;
        Prefetcher { shared, workers }
    }

    /// Says that the reader is at file number `n` (from 0) now, and hands it the file's
    /// bytes if a worker read them; `None` if the reader is to read the file itself.
    pub fn take(&self, n: usize) -> Option<Fetched> {
        let sh = &self.shared;
        let mut st = lock(&sh.state);
        st.reached = n;
        loop {
            match st.slots.remove(&n) {
                Some(Slot::Fetching) => {
                    st.slots.insert(n, Slot::Fetching);
                    st.reader_waiting = true;
                    st = sh.fetched.wait(st).expect("no panics while held");
                    st.reader_waiting = false;
                }
                Some(Slot::Ready(f, size)) => {
                    st.held -= size;
                    wake_workers(sh, &st);
                    return Some(f);
                }
                None => {
                    wake_workers(sh, &st);
                    return None;
                }
            }
        }
    }

    /// Gives back a file's buffer for the workers to reuse.
    pub fn recycle(&self, f: Fetched) {
        recycle(&mut lock(&self.shared.state), f.buf);
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.moved.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().expect("no panics while held")
}

/// Wakes the workers waiting for room once the reader has used half the window, so that they
/// take many files per wake-up rather than one each.
fn wake_workers(sh: &Shared, st: &State) {
    let ahead = st.next.saturating_sub(st.reached);
    if st.workers_waiting > 0 && st.held <= sh.ahead.0 / 2 && ahead <= sh.ahead.1 / 2 {
        sh.moved.notify_all();
    }
}

fn recycle(st: &mut State, buf: Vec<u8>) {
    if st.pooled + buf.capacity() <= POOL_BYTES {
        st.pooled += buf.capacity();
        st.pool.push(buf);
    }
}

/// Whether a file of `size` bytes is read ahead.
fn wanted(size: u64) -> bool {
    size > 0 && size < DIRECT_MIN
}

/// What a worker is to do next.
enum Next {
    /// Read file `n`, listed with this many bytes, into the buffer, directly unless `false`.
    File(usize, u64, Vec<u8>, bool),
    /// Wait: the files taken and not yet reached fill the window.
    Full,
    /// Nothing: every file is taken, or the reader stopped.
    Done,
}

/// The next file for a worker, taken: past the reader's, and one the reader does not read
/// itself.
fn next_file(sh: &Shared, st: &mut State) -> Next {
    loop {
        if st.stop || st.next >= sh.files.len() {
            return Next::Done;
        }
        if st.next <= st.reached {
            // The reader is there already.
            st.next = st.reached + 1;
            continue;
        }
        let n = st.next;
        let size = sh.files[n].1;
        if !wanted(size) {
            st.next += 1;
            continue;
        }
        let full = st.held > 0 && st.held + size > sh.ahead.0;
        if full || n - st.reached > sh.ahead.1 {
            return Next::Full;
        }
        st.next += 1;
        st.held += size;
        st.slots.insert(n, Slot::Fetching);
        let buf = st.pool.pop().unwrap_or_default();
        st.pooled -= buf.capacity();
        return Next::File(n, size, buf, !st.no_direct);
    }
}

/// Waits until the reader makes room (or stops).
fn wait_for_room<'a>(sh: &'a Shared, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    st.workers_waiting += 1;
    st = sh.moved.wait(st).expect("no panics while held");
    st.workers_waiting -= 1;
    st
}

/// A worker: takes the next file within reach of the reader, reads it, until all are taken
/// or the reader stops.
fn work(sh: &Shared) {
    let mut st = lock(&sh.state);
    loop {
        match next_file(sh, &mut st) {
            Next::Done => return,
            Next::Full => st = wait_for_room(sh, st),
            Next::File(n, size, buf, direct) => {
                drop(st);
                let got = fetch(&sh.files[n].0, size, buf, direct);
                st = lock(&sh.state);
                publish(sh, &mut st, n, size, got);
            }
        }
    }
}

/// Hands what became of file `n` (listed with `size` bytes) to the reader.
fn publish(sh: &Shared, st: &mut State, n: usize, size: u64, got: Fetch) {
    match got {
        Fetch::Read(f) => {
            st.slots.insert(n, Slot::Ready(f, size));
        }
        Fetch::Left(buf, refused) => {
            st.no_direct |= refused;
            st.slots.remove(&n);
            st.held -= size;
            recycle(st, buf);
        }
    }
    // Only the file the reader waits for wakes it: waking it for every file read ahead
    // cost the trees' analysis 31 000 wake-ups and as many waits again.
    if st.reader_waiting && st.reached == n {
        sh.fetched.notify_one();
    }
}

/// What a worker did with a file.
enum Fetch {
    Read(Fetched),
    /// Left to the reader (its buffer back), and whether `O_DIRECT` was refused.
    Left(Vec<u8>, bool),
}

/// Reads the file at `path`, listed with `size` bytes, into `buf` around the page cache if
/// it is not cached and `direct` reads are still tried; otherwise asks for its pages.
fn fetch(path: &std::path::Path, size: u64, buf: Vec<u8>, direct: bool) -> Fetch {
    let file = match open_uncached(path, size, direct) {
        Ok(file) => file,
        Err(refused) => return Fetch::Left(buf, refused),
    };
    match read_direct(&file, size, buf) {
        Ok(f) => Fetch::Read(f),
        Err((buf, refused)) => Fetch::Left(buf, refused),
    }
}

/// The file at `path` (listed with `size` bytes) opened for a direct read, if `direct` reads
/// are still tried and it is not mostly cached. Otherwise its pages are asked for (where it
/// opens) and it is left to the reader: the error says whether `O_DIRECT` was refused.
fn open_uncached(path: &std::path::Path, size: u64, direct: bool) -> Result<File, bool> {
    let mut refused = false;
    if direct {
        match open_direct(path) {
            Ok(file) if cached_fraction(&file, size) < 0.5 => return Ok(file),
            Ok(file) => {
                will_need(&file, size);
                return Err(false);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => refused = true,
            Err(_) => return Err(false),
        }
    }
    if let Ok(file) = open(path) {
        will_need(&file, size);
    }
    Err(refused)
}

/// Opens `path` for direct reads without waiting, as [`open`] does (`EINVAL` where the
/// filesystem or the system has no direct reads).
fn open_direct(path: &std::path::Path) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        let mut options = std::fs::OpenOptions::new();
        options.read(true);
        std::os::unix::fs::OpenOptionsExt::custom_flags(
            &mut options,
            libc::O_NONBLOCK | libc::O_DIRECT,
        );
        options.open(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }
}

/// Opens `path` for reading without waiting (a file replaced by a FIFO since it was listed
/// is then left to the reader, as it was before anything read ahead).
fn open(path: &std::path::Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    options.open(path)
}

/// Reads all of `file` (opened with `O_DIRECT`, listed with `size` bytes) into `buf`; gives
/// the buffer back, and whether the filesystem refused the read, where it grew past what was
/// listed or a read failed.
fn read_direct(file: &File, size: u64, buf: Vec<u8>) -> Result<Fetched, (Vec<u8>, bool)> {
    let (mut buf, skew, cap) = direct_buffer(size, buf);
    let mut len = 0;
    loop {
        if len == cap {
            return Err((buf, false));
        }
        match read_at_end(file, &mut buf, cap - len) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if n % ALIGN != 0 {
                    // A short read that ends unaligned ends the file.
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let refused = e.kind() == io::ErrorKind::InvalidInput;
                return Err((buf, refused));
            }
        }
    }
    Ok(Fetched {
        buf,
        skew,
        taken: 0,
    })
}

/// `buf` made ready for a direct read of a file listed with `size` bytes: `skew` zero bytes,
/// so that what follows is aligned, then room for `cap` bytes, one aligned block more than
/// listed so that a file of the listed size ends in one read. Returns it, `skew` and `cap`.
fn direct_buffer(size: u64, mut buf: Vec<u8>) -> (Vec<u8>, usize, usize) {
    let cap = (size as usize).next_multiple_of(ALIGN) + ALIGN;
    if buf.capacity() > 2 * (cap + ALIGN) {
        // A large file's buffer would hold a small one's bytes: the window counts listed bytes.
        buf = Vec::new();
    }
    buf.clear();
    buf.reserve(cap + ALIGN);
    let skew = buf.as_ptr().align_offset(ALIGN);
    buf.resize(skew, 0);
    (buf, skew, cap)
}

/// One `read` of up to `n` bytes into `buf`'s spare capacity (which holds at least `n`).
#[cfg(target_os = "linux")]
fn read_at_end(file: &File, buf: &mut Vec<u8>, n: usize) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    debug_assert!(buf.capacity() - buf.len() >= n);
    // SAFETY: the kernel writes at most `n` bytes into the spare capacity, which holds `n`;
    // nothing reads them before `set_len` covers the ones it wrote.
    let r = unsafe { libc::read(file.as_raw_fd(), buf.as_mut_ptr().add(buf.len()).cast(), n) };
    let n = usize::try_from(r).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: the read initialized these `n` bytes.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

#[cfg(not(target_os = "linux"))]
fn read_at_end(_: &File, _: &mut Vec<u8>, _: usize) -> io::Result<usize> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
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
impl Prefetcher {
    /// The files read ahead and not yet taken, in order.
    fn ready(&self) -> Vec<usize> {
        let st = lock(&self.shared.state);
        let mut r: Vec<usize> = st
            .slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Ready(..)))
            .map(|(&n, _)| n)
            .collect();
        r.sort_unstable();
        r
    }

    /// Waits until a worker took file `n` (or five seconds pass).
    fn wait_taken(&self, n: usize) {
        let t0 = std::time::Instant::now();
        while !lock(&self.shared.state).slots.contains_key(&n) && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Waits until `want` files are read ahead (or five seconds pass), then a little longer
    /// for any others; the files read ahead.
    fn settle(&self, want: usize) -> Vec<usize> {
        let t0 = std::time::Instant::now();
        while self.ready().len() < want && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        self.ready()
    }
}

/// One thread reading ahead with its reads in flight in an io_uring: it opens each file and
/// checks its pages in the cache as a worker does, then queues its read and goes on to the
/// next file instead of waiting; completions are handed to the reader as they come.
#[cfg(target_os = "linux")]
mod ring {
    use super::*;
    use io_uring::{opcode, types, IoUring};
    use std::os::fd::AsRawFd;

    /// A file whose read is in flight: the kernel writes into `buf` until its completion.
    struct Flight {
        n: usize,
        size: u64,
        file: File,
        buf: Vec<u8>,
        skew: usize,
        cap: usize,
    }

    /// The reads in flight, by the slot their completion names. Dropped with reads still in
    /// flight (a panic), it leaks their buffers rather than free memory the kernel may
    /// still write into.
    struct Flights(Vec<Option<Flight>>);

    impl Drop for Flights {
        fn drop(&mut self) {
            for f in self.0.iter_mut().filter_map(Option::take) {
                std::mem::forget(f.buf);
            }
        }
    }

    /// An io_uring and the reads it can carry.
    pub(super) struct Ring {
        ring: IoUring,
    }

    impl Ring {
        /// A ring, where the kernel offers one that reads (Linux 5.6 on, and not turned off).
        pub(super) fn new() -> Option<Ring> {
            let ring = IoUring::new(2 * RING_READS as u32).ok()?;
            let mut probe = io_uring::Probe::new();
            ring.submitter().register_probe(&mut probe).ok()?;
            probe
                .is_supported(opcode::Read::CODE)
                .then_some(Ring { ring })
        }

        /// Takes the files within reach of the reader, as [`work`] does, with up to
        /// [`RING_READS`] reads in flight; returns once all are taken or the reader stopped,
        /// and no read is in flight.
        pub(super) fn work(mut self, sh: &Shared) {
            let mut flights = Flights((0..RING_READS).map(|_| None).collect());
            let mut free: Vec<usize> = (0..RING_READS).rev().collect();
            loop {
                let mut st = lock(&sh.state);
                while !free.is_empty() {
                    let (n, size, buf, direct) = match next_file(sh, &mut st) {
                        Next::Done => break,
                        // Completions make room: collect them first.
                        Next::Full if free.len() < RING_READS => break,
                        Next::Full => {
                            st = wait_for_room(sh, st);
                            continue;
                        }
                        Next::File(n, size, buf, direct) => (n, size, buf, direct),
                    };
                    drop(st);
                    match begin(&sh.files[n].0, n, size, buf, direct) {
                        Ok(mut flight) => {
                            let k = free.pop().expect("a free slot was checked");
                            let at = flight.buf.as_mut_ptr().wrapping_add(flight.skew);
                            let fd = types::Fd(flight.file.as_raw_fd());
                            let read = opcode::Read::new(fd, at, flight.cap as u32)
                                .build()
                                .user_data(k as u64);
                            flights.0[k] = Some(flight);
                            // SAFETY: the read writes at most `cap` bytes at `at`, inside the
                            // buffer's spare capacity; the buffer and the file stay in
                            // `flights` until its completion is collected, and this thread
                            // returns only once every read's completion is.
                            while unsafe { self.ring.submission().push(&read) }.is_err() {
                                let _ = self.ring.submit();
                            }
                        }
                        Err(left) => publish(sh, &mut lock(&sh.state), n, size, left),
                    }
                    st = lock(&sh.state);
                }
                let idle = free.len() == RING_READS;
                if idle && (st.stop || st.next >= sh.files.len()) {
                    return;
                }
                drop(st);
                if let Err(e) = self.ring.submit_and_wait(1) {
                    if e.kind() != io::ErrorKind::Interrupted {
                        // (EBUSY: completions to collect first; nothing else is expected.)
                        std::thread::yield_now();
                    }
                }
                let done: Vec<(u64, i32)> = self
                    .ring
                    .completion()
                    .map(|c| (c.user_data(), c.result()))
                    .collect();
                for (k, res) in done {
                    let k = k as usize;
                    let flight = flights.0[k].take().expect("one completion per read");
                    free.push(k);
                    let (n, size) = (flight.n, flight.size);
                    publish(sh, &mut lock(&sh.state), n, size, end(flight, res));
                }
            }
        }
    }

    /// Opens file `n` at `path` (listed with `size` bytes) for a direct read into `buf`, or
    /// leaves it to the reader as [`fetch`] does.
    fn begin(
        path: &std::path::Path,
        n: usize,
        size: u64,
        buf: Vec<u8>,
        direct: bool,
    ) -> Result<Flight, Fetch> {
        let file = match open_uncached(path, size, direct) {
            Ok(file) => file,
            Err(refused) => return Err(Fetch::Left(buf, refused)),
        };
        let (buf, skew, cap) = direct_buffer(size, buf);
        Ok(Flight {
            n,
            size,
            file,
            buf,
            skew,
            cap,
        })
    }

    /// What a read that completed with `res` (bytes, or minus an errno) made of its file: as
    /// [`read_direct`], a file that filled the buffer grew since it was listed, and one that
    /// ended on a block boundary short of its listed size may not have ended: the reader
    /// reads both itself.
    fn end(flight: Flight, res: i32) -> Fetch {
        let Flight {
            file,
            mut buf,
            skew,
            cap,
            size,
            ..
        } = flight;
        drop(file);
        let Ok(got) = usize::try_from(res) else {
            return Fetch::Left(buf, res == -libc::EINVAL);
        };
        if got >= cap || (got % ALIGN == 0 && got as u64 != size) {
            return Fetch::Left(buf, false);
        }
        // SAFETY: the read wrote `got` bytes right after the `skew` bytes, inside the
        // capacity `direct_buffer` reserved.
        unsafe { buf.set_len(skew + got) };
        Fetch::Read(Fetched {
            buf,
            skew,
            taken: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const LEN: usize = 20_000;

    /// Runs `test` with the ring (where the kernel offers one) and with the threads.
    fn both(test: fn(Backend)) {
        test(Backend::Ring);
        test(Backend::Threads);
    }

    #[test]
    fn one_thread_reads_ahead_where_the_kernel_offers_a_ring() {
        let files = vec![(PathBuf::from("/nonexistent"), 1)];
        let threads = |b| {
            Prefetcher::start_with(files.clone(), 1 << 20, 8, b)
                .workers
                .len()
        };
        #[cfg(target_os = "linux")]
        let ring = ring::Ring::new().is_some();
        #[cfg(not(target_os = "linux"))]
        let ring = false;
        if !ring {
            eprintln!("no io_uring here: the ring is not tested");
        }
        let expect = |b| match (cfg!(target_os = "linux"), ring && b == Backend::Ring) {
            (false, _) => 0,
            (true, true) => 1,
            (true, false) => WORKERS,
        };
        assert_eq!(threads(Backend::Ring), expect(Backend::Ring));
        assert_eq!(threads(Backend::Threads), expect(Backend::Threads));
    }

    fn content(i: usize) -> Vec<u8> {
        (0..LEN + i).map(|k| (k * 7 + i * 13) as u8).collect()
    }

    /// Files `f0`, `f1`, … of `content(i)` in a fresh directory under `target/`, synced and
    /// dropped from the page cache; `None` where the filesystem keeps them cached (tmpfs).
    fn evicted_files(name: &str, n: usize) -> Option<(PathBuf, Vec<(PathBuf, u64)>)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/prefetch-tests")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = Vec::new();
        for i in 0..n {
            let path = dir.join(format!("f{i}"));
            std::fs::write(&path, content(i)).unwrap();
            let f = File::open(&path).unwrap();
            f.sync_all().unwrap();
            #[cfg(target_os = "linux")]
            // SAFETY: advice on a descriptor we own; it only drops clean cached pages.
            unsafe {
                use std::os::fd::AsRawFd;
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
            if cached_fraction(&f, (LEN + i) as u64) > 0.0 {
                eprintln!(
                    "cannot drop files from the page cache here; reading ahead is not tested"
                );
                let _ = std::fs::remove_dir_all(&dir);
                return None;
            }
            files.push((path, (LEN + i) as u64));
        }
        Some((dir, files))
    }

    fn taken(p: &Prefetcher, n: usize) -> Option<Vec<u8>> {
        let mut f = p.take(n)?;
        let mut out = Vec::new();
        while f.read_up_to(777, &mut out) > 0 {}
        p.recycle(f);
        Some(out)
    }

    #[test]
    fn the_files_just_ahead_of_the_reader_are_read_around_the_cache_and_no_more() {
        both(the_files_just_ahead_of_the_reader_are_read_around_the_cache_and_no_more_by);
    }

    fn the_files_just_ahead_of_the_reader_are_read_around_the_cache_and_no_more_by(
        backend: Backend,
    ) {
        let Some((dir, files)) = evicted_files(&format!("count-{backend:?}"), 8) else {
            return;
        };
        let p = Prefetcher::start_with(files.clone(), u64::MAX, 3, backend);
        assert_eq!(p.settle(3), [1, 2, 3], "the three files after the reader's");
        assert_eq!(taken(&p, 0), None, "the reader's own file is its to read");
        for (i, (path, _)) in files.iter().enumerate().skip(1) {
            // A file no worker took yet is the reader's to read: wait until one did.
            p.wait_taken(i);
            assert_eq!(taken(&p, i).as_deref(), Some(&content(i)[..]), "file {i}");
            let f = File::open(path).unwrap();
            assert_eq!(
                cached_fraction(&f, LEN as u64),
                0.0,
                "file {i} was read around the cache"
            );
        }
        drop(p);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_reader_waits_for_a_file_being_read_and_moves_the_window_on() {
        both(the_reader_waits_for_a_file_being_read_and_moves_the_window_on_by);
    }

    fn the_reader_waits_for_a_file_being_read_and_moves_the_window_on_by(backend: Backend) {
        let Some((dir, files)) = evicted_files(&format!("window-{backend:?}"), 6) else {
            return;
        };
        // File 2 is listed as large enough for the reader's own direct reads: left to it,
        // and it takes no room in the window.
        let mut listed = files.clone();
        listed[2].1 = DIRECT_MIN;
        let p = Prefetcher::start_with(listed, 2 * LEN as u64 + 10, usize::MAX, backend);
        assert_eq!(p.settle(2), [1, 3], "two files' bytes ahead at most");
        assert_eq!(taken(&p, 1).as_deref(), Some(&content(1)[..]));
        assert_eq!(taken(&p, 2), None);
        // The reader waits for files being read.
        for i in 3..6 {
            p.wait_taken(i);
            assert_eq!(taken(&p, i).as_deref(), Some(&content(i)[..]), "file {i}");
        }
        drop(p);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn cached_grown_and_vanished_files_are_left_to_the_reader() {
        both(cached_grown_and_vanished_files_are_left_to_the_reader_by);
    }

    fn cached_grown_and_vanished_files_are_left_to_the_reader_by(backend: Backend) {
        let Some((dir, mut files)) = evicted_files(&format!("left-{backend:?}"), 5) else {
            return;
        };
        // File 1 is read (cached) before, file 2 grew after it was listed, file 3 is gone.
        std::fs::read(&files[1].0).unwrap();
        files[2].1 = 100;
        std::fs::remove_file(&files[3].0).unwrap();
        let p = Prefetcher::start_with(files.clone(), u64::MAX, usize::MAX, backend);
        assert_eq!(p.settle(1), [4]);
        for i in 0..4 {
            assert_eq!(taken(&p, i), None, "file {i}");
        }
        assert_eq!(taken(&p, 4).as_deref(), Some(&content(4)[..]));
        drop(p);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_reader_that_stops_early_stops_the_workers() {
        both(a_reader_that_stops_early_stops_the_workers_by);
    }

    fn a_reader_that_stops_early_stops_the_workers_by(backend: Backend) {
        let Some((dir, files)) = evicted_files(&format!("stop-{backend:?}"), 4) else {
            return;
        };
        let p = Prefetcher::start_with(files, u64::MAX, 1, backend);
        assert_eq!(p.settle(1), [1]);
        // The workers wait for room; dropping the prefetcher must not hang.
        drop(p);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
