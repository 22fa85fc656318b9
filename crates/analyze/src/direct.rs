//! Reading large files that are not in the page cache straight from the disk (`O_DIRECT`).
//!
//! The analysis reads every byte once, so the page cache only costs: a cold buffered read makes
//! the kernel allocate a page-cache page per 4 KiB, have the disk fill it and copy it out. On
//! the five Debian images (3.3 GB) that was 6 s of system CPU, a quarter of the analysis on two
//! cores. A direct read has the disk fill our own aligned buffer instead (one copy from there
//! into the batch), and leaves the user's page cache as it was.
//!
//! Files mostly in the page cache already (just written, or analyzed a moment ago) are read
//! through it, as are small files, and any file whose filesystem refuses `O_DIRECT` (tmpfs).

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Files at least this large are read directly when mostly uncached.
pub const DIRECT_MIN: u64 = 16 << 20;

/// Alignment of direct reads (offset, length, buffer): the usual logical block size or more.
pub const ALIGN: usize = 4096;

/// Bytes per direct read.
const CHUNK: usize = 4 << 20;

/// An open input file, read through the page cache or around it.
pub enum Source {
    /// Through the page cache.
    Buffered(File),
    /// Around it.
    Direct(Direct),
    /// Read already, by a [`crate::prefetch::Prefetcher`].
    Fetched(crate::prefetch::Fetched),
}

impl Source {
    /// Opens `path`, directly if it is large and mostly not in the page cache.
    pub fn open(path: &Path) -> io::Result<Source> {
        let file = File::open(path)?;
        let len = stream_len(&file, &file.metadata()?);
        if len >= DIRECT_MIN && cached_fraction(&file, len) < 0.5 && set_direct(&file, true).is_ok()
        {
            return Ok(Source::Direct(Direct::new(file)));
        }
        Ok(Source::Buffered(file))
    }

    /// Appends up to `want` bytes to `out` and returns how many; fewer only at the end.
    ///
    /// Neither way zero-fills `out`'s spare capacity first, as std does for a `Read` that
    /// cannot write into uninitialized memory (all but its own types, on stable Rust): a
    /// `File` reads straight into it, and so does a direct read where `out` ends at an aligned
    /// address (a [`crate::input::BatchBuf`]); otherwise it copies from the aligned buffer.
    pub fn read_up_to(&mut self, want: usize, out: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Source::Buffered(f) => file_up_to(f, want, out),
            Source::Direct(d) => d.read_up_to(want, out),
            Source::Fetched(f) => Ok(f.read_up_to(want, out)),
        }
    }
}

/// The bytes `file` (with metadata `meta`) holds: its length, or for a block device (a disk
/// or a VM's volume, whose metadata says 0) its size, found by seeking to its end. So a
/// device gets the progress bar, sampling, memory bound and direct reads its size calls for.
pub fn stream_len(file: &File, meta: &std::fs::Metadata) -> u64 {
    if crate::input::is_block_device(meta) {
        use std::io::{Seek, SeekFrom};
        let mut f = file;
        let len = f.seek(SeekFrom::End(0)).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(0));
        return len;
    }
    meta.len()
}

/// `take` + `read_to_end` on a `File`: into `out`'s spare capacity, without zero-filling it.
fn file_up_to(f: &mut File, want: usize, out: &mut Vec<u8>) -> io::Result<usize> {
    let before = out.len();
    loop {
        match f
            .take((want - (out.len() - before)) as u64)
            .read_to_end(out)
        {
            Ok(_) => return Ok(out.len() - before),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A file read with `O_DIRECT`, in aligned chunks through an aligned buffer.
pub struct Direct {
    file: File,
    /// `CHUNK + ALIGN` bytes; the chunk buffer starts at `skew`, the first aligned byte.
    buf: Vec<u8>,
    skew: usize,
    /// Bytes of the chunk buffer filled and handed out.
    filled: usize,
    taken: usize,
    /// File offset of the next read.
    offset: u64,
    /// Whether `O_DIRECT` is still on: it goes off for the rest of the file after a short read
    /// that left the offset unaligned, or when the filesystem refuses a direct read.
    direct: bool,
}

impl Direct {
    /// Reads `file`, on which `O_DIRECT` is set.
    fn new(file: File) -> Direct {
        let buf = vec![0u8; CHUNK + ALIGN];
        let skew = buf.as_ptr().align_offset(ALIGN);
        Direct {
            file,
            buf,
            skew,
            filled: 0,
            taken: 0,
            offset: 0,
            direct: true,
        }
    }

    /// Goes on through the page cache (the file's position stays where it is).
    fn stop_direct(&mut self) -> io::Result<()> {
        self.direct = false;
        set_direct(&self.file, false)
    }

    /// Refills the chunk buffer; `Ok(0)` at the end of the file.
    fn refill(&mut self) -> io::Result<usize> {
        if self.direct && !self.offset.is_multiple_of(ALIGN as u64) {
            self.stop_direct()?;
        }
        let n = loop {
            let chunk = &mut self.buf[self.skew..self.skew + CHUNK];
            match self.file.read(chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A filesystem that took O_DIRECT but refuses its reads.
                Err(e) if e.kind() == io::ErrorKind::InvalidInput && self.direct => {
                    self.stop_direct()?;
                }
                r => break r?,
            }
        };
        self.filled = n;
        self.taken = 0;
        self.offset += n as u64;
        Ok(n)
    }

    /// Reads the whole aligned blocks of up to `want` bytes (at most a chunk) straight into
    /// `out`'s spare capacity, when `out` ends at an aligned address and the file offset is
    /// aligned; `None` where the chunk buffer must be used instead, `Some(0)` at the end of
    /// the file.
    #[cfg(target_os = "linux")]
    fn read_straight(&mut self, want: usize, out: &mut Vec<u8>) -> io::Result<Option<usize>> {
        use std::os::fd::AsRawFd;
        let len = want.min(CHUNK) / ALIGN * ALIGN;
        if !self.direct || len == 0 || !self.offset.is_multiple_of(ALIGN as u64) {
            return Ok(None);
        }
        out.reserve(len);
        let end = out.as_ptr() as usize + out.len();
        if !end.is_multiple_of(ALIGN) {
            return Ok(None);
        }
        let n = loop {
            // SAFETY: the kernel writes at most `len` bytes into `out`'s spare capacity,
            // which `reserve` made at least `len` long; nothing reads them before `set_len`.
            let r = unsafe {
                libc::read(
                    self.file.as_raw_fd(),
                    out.as_mut_ptr().add(out.len()).cast(),
                    len,
                )
            };
            if let Ok(n) = usize::try_from(r) {
                break n;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                // A filesystem that took O_DIRECT but refuses its reads.
                io::ErrorKind::InvalidInput => {
                    self.stop_direct()?;
                    return Ok(None);
                }
                _ => return Err(e),
            }
        };
        // SAFETY: the read initialized these `n <= len` bytes.
        unsafe { out.set_len(out.len() + n) };
        self.offset += n as u64;
        Ok(Some(n))
    }

    #[cfg(not(target_os = "linux"))]
    fn read_straight(&mut self, _: usize, _: &mut Vec<u8>) -> io::Result<Option<usize>> {
        Ok(None)
    }

    /// Appends up to `want` bytes to `out` and returns how many; fewer only at the end.
    fn read_up_to(&mut self, want: usize, out: &mut Vec<u8>) -> io::Result<usize> {
        let mut got = 0;
        while got < want {
            if self.taken == self.filled {
                match self.read_straight(want - got, out)? {
                    Some(0) => break,
                    Some(n) => {
                        got += n;
                        continue;
                    }
                    None => {}
                }
                if self.refill()? == 0 {
                    break;
                }
            }
            let n = (self.filled - self.taken).min(want - got);
            let at = self.skew + self.taken;
            out.extend_from_slice(&self.buf[at..at + n]);
            self.taken += n;
            got += n;
        }
        Ok(got)
    }
}

/// Turns `O_DIRECT` on or off for `file`; an error where the OS or filesystem cannot.
#[cfg(target_os = "linux")]
pub(crate) fn set_direct(file: &File, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own only change its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    let want = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, want) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn set_direct(_: &File, on: bool) -> io::Result<()> {
    if on {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    } else {
        Ok(())
    }
}

/// The fraction of `file`'s first `len` bytes' pages in the page cache: one `cachestat` call
/// where the kernel has it (Linux 6.5), else `mincore` over a mapping of the file; 1.0 where
/// that cannot be told, so the file is read through the cache.
#[cfg(target_os = "linux")]
pub(crate) fn cached_fraction(file: &File, len: u64) -> f64 {
    use std::os::fd::AsRawFd;
    if let Some(pages) = cachestat(file, len) {
        return pages as f64 / len.div_ceil(4096).max(1) as f64;
    }
    let Ok(len) = usize::try_from(len) else {
        return 1.0;
    };
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let pages = len.div_ceil(page);
    let mut resident = vec![0u8; pages];
    // SAFETY: a read-only mapping of the whole file, never dereferenced: mincore only
    // reports which of its pages are resident, into a vector of one byte per page, and the
    // mapping is removed before returning.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        if addr == libc::MAP_FAILED {
            return 1.0;
        }
        let ok = libc::mincore(addr, len, resident.as_mut_ptr()) == 0;
        libc::munmap(addr, len);
        if !ok {
            return 1.0;
        }
    }
    resident.iter().filter(|&&r| r & 1 != 0).count() as f64 / pages as f64
}

/// Pages of `file`'s first `len` bytes in the page cache (`cachestat`); `None` where the
/// kernel lacks the call or the file cannot be asked (a FIFO).
#[cfg(target_os = "linux")]
fn cachestat(file: &File, len: u64) -> Option<u64> {
    use std::os::fd::AsRawFd;
    /// `cachestat`'s number on every architecture with the common system call table.
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off: 0, len };
    let mut stat = Stat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both live `repr(C)` values of the
    // layout the kernel's ABI fixes; it changes nothing else.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0u32,
        )
    };
    (r == 0).then_some(stat.nr_cache)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn cached_fraction(_: &File, _: u64) -> f64 {
    1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file under `target/`, on the repository's filesystem (which supports `O_DIRECT`
    /// unless it is tmpfs), removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn scratch(name: &str, data: &[u8]) -> Scratch {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/direct-tests");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}-{}", std::process::id()));
        std::fs::write(&path, data).unwrap();
        Scratch(path)
    }

    /// `path` read directly, or `None` where its filesystem refuses `O_DIRECT`.
    fn direct(path: &Path) -> Option<Direct> {
        let file = File::open(path).unwrap();
        set_direct(&file, true).ok()?;
        Some(Direct::new(file))
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8)
            .collect()
    }

    #[test]
    fn direct_reads_return_the_file_in_pieces_of_any_size() {
        for len in [0, 1, 4095, 4096, CHUNK, CHUNK + 4096, 2 * CHUNK + 12_345] {
            let want = data(len);
            let file = scratch(&format!("pieces-{len}"), &want);
            let Some(mut d) = direct(&file.0) else {
                eprintln!("O_DIRECT unsupported here; only buffered reads are tested");
                return;
            };
            let mut got = Vec::new();
            loop {
                let ask = (got.len() % 7919) * 131 + 1;
                let n = d.read_up_to(ask, &mut got).unwrap();
                if n < ask {
                    break;
                }
            }
            assert!(got == want, "{len} bytes read back differ");
        }
    }

    #[test]
    fn reads_into_an_aligned_buffer_go_straight_there_and_the_rest_through_the_chunk_buffer() {
        let len = 2 * CHUNK + 12_345;
        let want = data(len);
        let file = scratch("straight", &want);
        let Some(mut d) = direct(&file.0) else {
            return;
        };
        let mut batches = Vec::new();
        loop {
            let mut batch = crate::input::BatchBuf::with_capacity(CHUNK);
            let n = d.read_up_to(CHUNK, batch.appender()).unwrap();
            if batches.is_empty() {
                assert_eq!(d.filled, 0, "the first batch bypassed the chunk buffer");
            }
            batches.push(batch);
            if n < CHUNK {
                break;
            }
        }
        let got: Vec<u8> = batches.iter().flat_map(|b| b.iter().copied()).collect();
        assert!(got == want);
        // An unaligned place in the buffer: through the chunk buffer, the same bytes.
        let Some(mut d) = direct(&file.0) else {
            return;
        };
        let mut batch = crate::input::BatchBuf::with_capacity(len + 1);
        batch.appender().push(b'x');
        assert_eq!(d.read_up_to(len, batch.appender()).unwrap(), len);
        assert!(d.filled > 0);
        assert!(batch[1..] == want[..]);
    }

    #[test]
    fn a_short_read_in_the_middle_goes_on_through_the_page_cache() {
        let want = data(3 * CHUNK);
        let file = scratch("short", &want);
        let Some(mut d) = direct(&file.0) else {
            return;
        };
        let mut got = Vec::new();
        assert_eq!(d.read_up_to(100, &mut got).unwrap(), 100);
        // As if the first read had stopped 100 bytes into the file.
        std::io::Seek::seek(&mut d.file, std::io::SeekFrom::Start(100)).unwrap();
        (d.filled, d.offset) = (100, 100);
        d.read_up_to(usize::MAX, &mut got).unwrap();
        assert!(!d.direct, "O_DIRECT is off after the unaligned offset");
        assert!(got == want);
    }

    #[test]
    fn a_large_file_out_of_the_page_cache_is_read_directly() {
        let want = data(DIRECT_MIN as usize + 777);
        let file = scratch("evicted", &want);
        let f = File::open(&file.0).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice on a descriptor we own; it only drops clean cached pages.
        #[cfg(target_os = "linux")]
        unsafe {
            use std::os::fd::AsRawFd;
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
        if cached_fraction(&f, want.len() as u64) > 0.5 || direct(&file.0).is_none() {
            eprintln!("cannot evict the file or no O_DIRECT here; the direct path is not tested");
            return;
        }
        let mut src = Source::open(&file.0).unwrap();
        assert!(matches!(src, Source::Direct(_)));
        let mut got = Vec::new();
        src.read_up_to(usize::MAX, &mut got).unwrap();
        assert!(got == want);
    }

    #[test]
    fn a_missing_file_is_an_error_naming_what_went_wrong() {
        let gone = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/direct-tests/none");
        let err = Source::open(&gone).err().expect("no such file");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn cached_files_and_small_files_are_read_through_the_page_cache() {
        let small = scratch("small", &data(4096));
        assert!(matches!(
            Source::open(&small.0).unwrap(),
            Source::Buffered(_)
        ));
        // Just written: in the page cache.
        let large = scratch("large", &data(DIRECT_MIN as usize));
        let f = File::open(&large.0).unwrap();
        assert!(cached_fraction(&f, DIRECT_MIN) > 0.9);
        assert!(matches!(
            Source::open(&large.0).unwrap(),
            Source::Buffered(_)
        ));
    }
}
