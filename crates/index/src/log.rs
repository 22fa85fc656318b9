//! The append-only metadata log: 64 KiB pages of checksummed (feature, record ids) entries,
//! an in-RAM tail page, an LRU cache of full pages, and crash recovery.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::cache::PageCache;
use crate::error::{Error, Result};
use crate::format::{
    decode_entry, encode_entry, encode_pad, entry_len, Entry, LogHeader, ALIGN, HEADER_LEN,
    MAX_LOG_BYTES, PAGE_SIZE,
};

const PAGE: usize = PAGE_SIZE as usize;

/// One entry seen while scanning the log at open.
#[derive(Debug, Clone, Copy)]
pub struct ScanEntry {
    /// The full feature.
    pub feature: u64,
    /// Pointer (offset / 8) of the entry.
    pub ptr: u32,
    /// Bytes of the entry.
    pub len: u16,
    /// Whether the entry deletes the feature.
    pub delete: bool,
}

/// What recovery cut off the end of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    /// The log file.
    pub path: PathBuf,
    /// Offset of the first invalid entry: the log now ends here.
    pub offset: u64,
    /// Bytes that were discarded.
    pub discarded: u64,
    /// Why the entry at `offset` was invalid.
    pub reason: String,
}

/// The log file with its tail buffer and page cache.
pub struct Log {
    path: PathBuf,
    file: File,
    generation: u64,
    /// Logical end of the log, including bytes still in the tail buffer.
    end: u64,
    /// Bytes written to the file.
    flushed: u64,
    /// Bytes made durable by the last fsync.
    synced: u64,
    /// Offset of the page the tail buffer holds.
    tail_start: u64,
    /// Bytes `[tail_start, end)`.
    tail: Vec<u8>,
    cache: PageCache,
    /// Scratch page for bulk reads that bypass the cache.
    scratch: Vec<u8>,
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, off)
}

#[cfg(unix)]
fn write_all_at(file: &File, buf: &[u8], off: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, off)
}

#[cfg(not(unix))]
fn read_exact_at(mut file: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    file.seek(SeekFrom::Start(off))?;
    file.read_exact(buf)
}

#[cfg(not(unix))]
fn write_all_at(mut file: &File, buf: &[u8], off: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    file.seek(SeekFrom::Start(off))?;
    file.write_all(buf)
}

/// Makes a rename or file creation in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(dir, "fsync directory", e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

impl Log {
    /// Creates (or truncates) a log file at `path` holding only a header, and makes it durable.
    pub fn create(path: &Path, generation: u64, cache_pages: usize) -> Result<Log> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| Error::io(path, "create", e))?;
        let header = LogHeader { generation }.encode();
        write_all_at(&file, &header, 0).map_err(|e| Error::io(path, "write", e))?;
        file.sync_all().map_err(|e| Error::io(path, "fsync", e))?;
        let mut tail = Vec::with_capacity(PAGE);
        tail.extend_from_slice(&header);
        Ok(Log {
            path: path.to_path_buf(),
            file,
            generation,
            end: HEADER_LEN,
            flushed: HEADER_LEN,
            synced: HEADER_LEN,
            tail_start: 0,
            tail,
            cache: PageCache::new(cache_pages),
            scratch: Vec::new(),
        })
    }

    /// Opens an existing log, scanning and validating every entry.
    ///
    /// Entries at offsets `>= replay_from` are pushed to `out`. `durable` is a length the caller
    /// knows was made durable (from a checkpoint); damage below it is corruption, not a torn
    /// write. A torn tail (invalid entries that no later entry proves durable) is truncated.
    pub fn open(
        path: &Path,
        cache_pages: usize,
        generation_check: impl FnOnce(u64) -> (u64, u64),
        out: &mut Vec<ScanEntry>,
    ) -> Result<(Log, Option<Truncation>)> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, "open", e))?;
        let file_len = file
            .metadata()
            .map_err(|e| Error::io(path, "stat", e))?
            .len();
        let mut head = [0u8; HEADER_LEN as usize];
        let n = (file_len.min(HEADER_LEN)) as usize;
        read_exact_at(&file, &mut head[..n], 0).map_err(|e| Error::io(path, "read", e))?;
        let header = LogHeader::decode(&head[..n]).map_err(|r| Error::corrupt(path, 0, r))?;
        let (durable, replay_from) = generation_check(header.generation);

        let mut buf = vec![0u8; PAGE];
        let mut loaded: Option<(u64, usize)> = None; // (page number, valid bytes)
        let mut pos = HEADER_LEN;
        let mut bad: Option<(u64, &'static str)> = None;
        while pos < file_len {
            let pno = pos / PAGE_SIZE;
            let page_len = match loaded {
                Some((p, len)) if p == pno => len,
                _ => {
                    let start = pno * PAGE_SIZE;
                    let len = (file_len - start).min(PAGE_SIZE) as usize;
                    read_exact_at(&file, &mut buf[..len], start)
                        .map_err(|e| Error::io(path, "read", e))?;
                    loaded = Some((pno, len));
                    len
                }
            };
            let in_page = (pos % PAGE_SIZE) as usize;
            match decode_entry(&buf[in_page..page_len], pos) {
                Ok(Entry::Pad { len }) => {
                    if pos + len as u64 > file_len {
                        bad = Some((pos, "truncated padding"));
                        break;
                    }
                    pos += len as u64;
                }
                Ok(Entry::Feature {
                    len, feature, ids, ..
                }) => {
                    if pos >= replay_from {
                        out.push(ScanEntry {
                            feature,
                            ptr: (pos / ALIGN) as u32,
                            len: len as u16,
                            delete: ids.is_empty(),
                        });
                    }
                    pos += len as u64;
                }
                Err(reason) => {
                    bad = Some((pos, reason));
                    break;
                }
            }
        }

        let mut truncation = None;
        let end = match bad {
            None => {
                if pos < durable {
                    return Err(Error::corrupt(
                        path,
                        pos,
                        format!("log ends at byte {pos} but its checkpoint shows {durable} bytes were made durable"),
                    ));
                }
                pos
            }
            Some((x, reason)) => {
                let proof = later_durable_hint(&file, path, x, file_len, &mut buf)?;
                if x < durable || proof > x {
                    let proof = proof.max(durable);
                    return Err(Error::corrupt(
                        path,
                        x,
                        format!("{reason}; the log was made durable up to byte {proof}, so this is damage, not a torn write"),
                    ));
                }
                file.set_len(x)
                    .map_err(|e| Error::io(path, "truncate", e))?;
                truncation = Some(Truncation {
                    path: path.to_path_buf(),
                    offset: x,
                    discarded: file_len - x,
                    reason: reason.to_string(),
                });
                x
            }
        };
        file.sync_all().map_err(|e| Error::io(path, "fsync", e))?;
        let tail_start = end - end % PAGE_SIZE;
        let mut tail = vec![0u8; (end - tail_start) as usize];
        read_exact_at(&file, &mut tail, tail_start).map_err(|e| Error::io(path, "read", e))?;
        tail.reserve_exact(PAGE - tail.len());
        Ok((
            Log {
                path: path.to_path_buf(),
                file,
                generation: header.generation,
                end,
                flushed: end,
                synced: end,
                tail_start,
                tail,
                cache: PageCache::new(cache_pages),
                scratch: Vec::new(),
            },
            truncation,
        ))
    }

    /// Records that the file was renamed to `path`.
    pub fn set_path(&mut self, path: PathBuf) {
        self.path = path;
    }

    /// The generation in the header.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Logical length of the log in bytes (including unflushed bytes).
    pub fn len(&self) -> u64 {
        self.end
    }

    /// The page cache.
    pub fn cache(&self) -> &PageCache {
        &self.cache
    }

    /// Bytes of RAM held by the page cache, the tail page and scratch buffers.
    pub fn memory_bytes(&self) -> usize {
        self.cache.memory_bytes() + self.tail.capacity() + self.scratch.capacity()
    }

    /// Appends an entry for `feature` (a deletion when `ids` is empty); returns its pointer.
    pub fn append(&mut self, feature: u64, ids: &[u64]) -> Result<u32> {
        let len = entry_len(ids.len()) as u64;
        let left = PAGE_SIZE - self.end % PAGE_SIZE;
        let start = if left < len {
            self.end + left
        } else {
            self.end
        };
        if start + len > MAX_LOG_BYTES {
            return Err(Error::LogFull {
                path: self.path.clone(),
            });
        }
        if left < len {
            encode_pad(&mut self.tail, self.end, left as usize);
            self.end += left;
            self.complete_page()?;
        }
        let off = self.end;
        let synced_units = (self.synced / ALIGN).min(u64::from(u32::MAX)) as u32;
        encode_entry(&mut self.tail, off, synced_units, feature, ids);
        self.end += len;
        if self.end.is_multiple_of(PAGE_SIZE) {
            self.complete_page()?;
        }
        Ok((off / ALIGN) as u32)
    }

    /// Writes the full tail page and moves it into the cache.
    fn complete_page(&mut self) -> Result<()> {
        debug_assert_eq!(self.tail.len(), PAGE);
        self.flush()?;
        let full = std::mem::replace(&mut self.tail, Vec::with_capacity(PAGE));
        self.cache
            .insert(self.tail_start / PAGE_SIZE, full.into_boxed_slice());
        self.tail_start = self.end;
        Ok(())
    }

    /// Writes buffered bytes to the file (no fsync).
    pub fn flush(&mut self) -> Result<()> {
        if self.flushed < self.end {
            let from = (self.flushed - self.tail_start) as usize;
            write_all_at(&self.file, &self.tail[from..], self.flushed)
                .map_err(|e| Error::io(&self.path, "write", e))?;
            self.flushed = self.end;
        }
        Ok(())
    }

    /// Flushes and fsyncs: everything appended so far survives a crash.
    pub fn sync(&mut self) -> Result<()> {
        self.flush()?;
        if self.synced < self.end {
            self.file
                .sync_data()
                .map_err(|e| Error::io(&self.path, "fsync", e))?;
            self.synced = self.end;
        }
        Ok(())
    }

    /// The feature entry at `ptr`, read through the page cache and validated.
    pub fn entry(&mut self, ptr: u32) -> Result<Entry<'_>> {
        let off = u64::from(ptr) * ALIGN;
        if off < HEADER_LEN || off >= self.end {
            return Err(Error::corrupt(
                &self.path,
                off,
                format!("pointer outside the log (length {})", self.end),
            ));
        }
        let data: &[u8] = if off >= self.tail_start {
            &self.tail[(off - self.tail_start) as usize..]
        } else {
            let pno = off / PAGE_SIZE;
            if self.cache.get(pno).is_none() {
                let mut page = self.cache.spare(PAGE);
                read_exact_at(&self.file, &mut page, pno * PAGE_SIZE)
                    .map_err(|e| Error::io(&self.path, "read", e))?;
                self.cache.insert(pno, page);
            }
            let page = self.cache.peek(pno).expect("page was just cached");
            &page[(off % PAGE_SIZE) as usize..]
        };
        match decode_entry(data, off) {
            Ok(e @ Entry::Feature { .. }) => Ok(e),
            Ok(Entry::Pad { .. }) => Err(Error::corrupt(&self.path, off, "pointer to padding")),
            Err(reason) => Err(Error::corrupt(&self.path, off, reason)),
        }
    }

    /// Visits the entries at `ptrs` (sorted ascending) in order, reading pages sequentially
    /// without disturbing the page cache; `f(index, feature, ids)`.
    pub fn for_each_at(
        &mut self,
        ptrs: &[u32],
        mut f: impl FnMut(usize, u64, &mut dyn Iterator<Item = u64>) -> Result<()>,
    ) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(PAGE, 0);
        let mut loaded = u64::MAX;
        let result = (|| {
            for (i, &ptr) in ptrs.iter().enumerate() {
                let off = u64::from(ptr) * ALIGN;
                if off < HEADER_LEN || off >= self.end {
                    return Err(Error::corrupt(&self.path, off, "pointer outside the log"));
                }
                let data: &[u8] = if off >= self.tail_start {
                    &self.tail[(off - self.tail_start) as usize..]
                } else {
                    let pno = off / PAGE_SIZE;
                    if pno != loaded {
                        read_exact_at(&self.file, &mut scratch, pno * PAGE_SIZE)
                            .map_err(|e| Error::io(&self.path, "read", e))?;
                        loaded = pno;
                    }
                    &scratch[(off % PAGE_SIZE) as usize..]
                };
                match decode_entry(data, off) {
                    Ok(e @ Entry::Feature { feature, .. }) => f(i, feature, &mut e.ids())?,
                    Ok(Entry::Pad { .. }) => {
                        return Err(Error::corrupt(&self.path, off, "pointer to padding"))
                    }
                    Err(reason) => return Err(Error::corrupt(&self.path, off, reason)),
                }
            }
            Ok(())
        })();
        self.scratch = scratch;
        result
    }
}

/// The largest durable hint (in bytes) of any valid entry after offset `x`: proof that bytes
/// before it had been made durable when that entry was written.
fn later_durable_hint(
    file: &File,
    path: &Path,
    x: u64,
    file_len: u64,
    buf: &mut [u8],
) -> Result<u64> {
    let mut best = 0u64;
    let mut loaded = u64::MAX;
    let mut page_len = 0usize;
    let mut pos = x + ALIGN;
    while pos < file_len {
        let pno = pos / PAGE_SIZE;
        if pno != loaded {
            let start = pno * PAGE_SIZE;
            page_len = (file_len - start).min(PAGE_SIZE) as usize;
            read_exact_at(file, &mut buf[..page_len], start)
                .map_err(|e| Error::io(path, "read", e))?;
            loaded = pno;
        }
        let in_page = (pos % PAGE_SIZE) as usize;
        match decode_entry(&buf[in_page..page_len], pos) {
            Ok(Entry::Feature {
                len, synced_units, ..
            }) => {
                best = best.max(u64::from(synced_units) * ALIGN);
                pos += len as u64;
            }
            Ok(Entry::Pad { len }) => pos += len as u64,
            Err(_) => pos += ALIGN,
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &Path) -> Result<(Log, Option<Truncation>, Vec<ScanEntry>)> {
        let mut out = Vec::new();
        let (log, t) = Log::open(path, 4, |_| (0, 0), &mut out)?;
        Ok((log, t, out))
    }

    #[test]
    fn append_spans_pages_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = Log::create(&path, 3, 2).unwrap();
        let ids: Vec<u64> = (0..100).collect();
        let mut ptrs = Vec::new();
        for f in 0..4000u64 {
            ptrs.push(log.append(f, &ids[..(f % 9) as usize + 1]).unwrap());
        }
        assert!(log.len() > 3 * PAGE_SIZE);
        for (f, &p) in ptrs.iter().enumerate() {
            let e = log.entry(p).unwrap();
            match e {
                Entry::Feature { feature, .. } => assert_eq!(feature, f as u64),
                Entry::Pad { .. } => panic!(),
            }
            assert_eq!(e.ids().count(), f % 9 + 1);
        }
        log.sync().unwrap();
        let len = log.len();
        drop(log);
        let (mut log, t, out) = open(&path).unwrap();
        assert!(t.is_none());
        assert_eq!(log.len(), len);
        assert_eq!(log.generation(), 3);
        assert_eq!(out.len(), 4000);
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, e)| e.feature == i as u64 && e.ptr == ptrs[i]));
        let mut seen = Vec::new();
        log.for_each_at(&ptrs, |i, f, ids| {
            seen.push((i, f, ids.count()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), 4000);
        assert!(seen
            .iter()
            .all(|&(i, f, n)| f == i as u64 && n == i % 9 + 1));
        // Appending after reopen continues the tail page.
        let p = log.append(77, &[1]).unwrap();
        assert_eq!(u64::from(p) * 8, len);
    }

    #[test]
    fn torn_tail_is_truncated_and_damage_before_a_sync_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = Log::create(&path, 1, 2).unwrap();
        let a = log.append(1, &[10]).unwrap();
        log.sync().unwrap();
        let b = log.append(2, &[20]).unwrap();
        log.flush().unwrap();
        drop(log);
        // Damage in the last, never-synced entry: a torn write.
        let mut bytes = std::fs::read(&path).unwrap();
        let boff = u64::from(b) as usize * 8;
        bytes[boff + 9] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (log, t, out) = open(&path).unwrap();
        let t = t.expect("truncated");
        assert_eq!(t.offset, boff as u64);
        assert_eq!(out.len(), 1);
        assert_eq!(log.len(), boff as u64);
        drop(log);

        // Now damage the first entry while a later entry proves it was synced.
        let mut log = open(&path).unwrap().0;
        log.append(3, &[30]).unwrap();
        log.flush().unwrap();
        drop(log);
        let mut bytes = std::fs::read(&path).unwrap();
        let aoff = u64::from(a) as usize * 8;
        bytes[aoff + 16] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        match open(&path) {
            Err(Error::Corrupt { offset, .. }) => assert_eq!(offset, aoff as u64),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("damage was not detected"),
        }
    }

    #[test]
    fn bad_header_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, b"not a log at all, not a log at all").unwrap();
        assert!(matches!(open(&path), Err(Error::Corrupt { offset: 0, .. })));
    }
}
