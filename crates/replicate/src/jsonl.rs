//! The JSON-lines adapter: `replicate encode` / `decode` for any source that can write its
//! changes as lines like `{"op": "update", "_id": "...", ...}` (MongoDB's `"i"/"u"/"d"` and an
//! optional `"ns"` collection are understood too).
//!
//! Each line is one change; the whole line is the document shipped, so decoding gives back
//! every line exactly. A file (version 2, `crates/replicate/FORMAT.md`) holds a header, then
//! numbered batch frames, then an end marker with the counts and a checksum of the whole file,
//! so a decoder tells a complete stream from a cut, duplicated or reordered one.

use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::time::Instant;

use serde::Serialize;
use xxhash_rust::xxh3::Xxh3Default;

use crate::sdedup::{Decoder, EncodeStats, Encoder, MemoryStore, SdedupConfig};
use crate::{Change, Error, Op};

/// File magic of an encoded JSON-lines stream.
pub const FILE_MAGIC: [u8; 4] = *b"DWRJ";
/// The file format version this build writes and the only one it reads.
pub const FILE_VERSION: u32 = 2;
/// Bytes of the file header: the magic and the version.
const HEADER_LEN: usize = 8;
/// Tag of a batch frame: `seq:u64 len:u32` follow, then the batch.
const TAG_BATCH: u8 = b'B';
/// Tag of the end marker: `batches:u64 entries:u64 checksum:u64` follow.
const TAG_END: u8 = b'E';
/// Bytes of a batch frame before its batch: tag, sequence number, length.
const BATCH_HEAD_LEN: usize = 1 + 8 + 4;
/// Bytes of the end marker: tag, batch count, entry count, checksum.
const END_LEN: usize = 1 + 8 + 8 + 8;
/// Largest batch a decoder reads from a file.
const MAX_BATCH: u32 = 1 << 30;
/// A version-1 file's first batch: its length stood where the version is now, then this.
const V1_BATCH_MAGIC: [u8; 4] = *b"DWR\x01";

/// Parses one line into a change at position `pos`.
pub fn parse_line(line: &[u8], pos: u64) -> Result<Change, Error> {
    let bad = |detail: &str| Error::Input {
        at: format!("line {pos}"),
        detail: detail.to_string(),
    };
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| bad(&format!("not JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| bad("not a JSON object"))?;
    let op = match obj.get("op").and_then(|o| o.as_str()) {
        Some("insert" | "i") => Op::Insert,
        Some("update" | "u") => Op::Update,
        Some("delete" | "d") => Op::Delete,
        Some(other) => {
            return Err(bad(&format!(
                "unknown op {other:?} (use insert, update or delete)"
            )))
        }
        None => return Err(bad("no \"op\" field")),
    };
    let id = match obj.get("_id") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) if !other.is_null() => other.to_string(),
        _ => return Err(bad("no \"_id\" field")),
    };
    let collection = obj
        .get("ns")
        .and_then(|n| n.as_str())
        .unwrap_or("")
        .to_string();
    Ok(Change {
        pos,
        op,
        collection,
        id,
        doc: Some(line.to_vec()),
    })
}

/// Totals of one encode run (`replicate encode --stats --json`; every field is described in
/// `docs/replicate.md`).
#[derive(Debug, Clone, Serialize)]
pub struct EncodeReport {
    /// Encoder counters; here `input_bytes` is the bytes read (lines and their newlines) and
    /// `output_bytes` the bytes written (the whole file).
    #[serde(flatten)]
    pub stats: EncodeStats,
    /// Batch frames written.
    pub batches: u64,
    /// `input_bytes / output_bytes`.
    pub ratio: f64,
    /// Source-cache hits / fetches.
    pub cache_hit_ratio: f64,
    /// Wall-clock seconds of the run.
    pub elapsed_s: f64,
    /// RAM the similarity state held at the end: the three parts below, summed.
    pub index_bytes: usize,
    /// Of it, the cuckoo feature table.
    pub feature_table_bytes: usize,
    /// Of it, the feature index's page cache and log buffers.
    pub feature_cache_bytes: usize,
    /// Of it, the document table's cache (in use, not its bound).
    pub document_cache_bytes: usize,
    /// Documents indexed at the end.
    pub documents: usize,
    /// `index_bytes / documents`, 0 without documents.
    pub index_bytes_per_document: f64,
}

/// The file being written: every byte goes through the checksum the end marker carries.
struct FileOut<W: Write> {
    out: W,
    hash: Xxh3Default,
    bytes: u64,
}

impl<W: Write> FileOut<W> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.out.write_all(bytes)?;
        self.hash.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }
}

/// Reads lines from `input`, writes the encoded stream to `output`, batching about
/// `batch_bytes` of input per batch; the similarity state lives in `state` (or a temporary
/// directory).
pub fn encode(
    mut input: impl BufRead,
    output: impl Write,
    config: SdedupConfig,
    batch_bytes: usize,
    state: Option<&std::path::Path>,
) -> Result<EncodeReport, Error> {
    let started = Instant::now();
    let mut enc = Encoder::open(config, state)?;
    let mut store = MemoryStore::default();
    let mut file = FileOut {
        out: output,
        hash: Xxh3Default::new(),
        bytes: 0,
    };
    file.put(&FILE_MAGIC)?;
    file.put(&FILE_VERSION.to_le_bytes())?;
    let mut batch = Vec::new();
    let mut batch_len = 0;
    let mut out = Vec::new();
    let mut batches = 0u64;
    let mut read_bytes = 0u64;
    let mut flush = |batch: &mut Vec<Change>,
                     enc: &mut Encoder,
                     store: &mut MemoryStore,
                     file: &mut FileOut<_>|
     -> Result<(), Error> {
        out.clear();
        enc.encode_batch(batch, store, &mut out)?;
        for c in batch.iter() {
            store.apply(c);
        }
        let len = u32::try_from(out.len())
            .ok()
            .filter(|&n| n <= MAX_BATCH)
            .ok_or_else(|| Error::Input {
                at: format!("batch {}", batches + 1),
                detail: format!(
                    "{} bytes encoded, over the {MAX_BATCH} a batch may hold",
                    out.len()
                ),
            })?;
        batches += 1;
        file.put(&[TAG_BATCH])?;
        file.put(&batches.to_le_bytes())?;
        file.put(&len.to_le_bytes())?;
        file.put(&out)?;
        batch.clear();
        Ok(())
    };
    let mut line = Vec::new();
    let mut n = 0u64;
    loop {
        line.clear();
        let got = input.read_until(b'\n', &mut line)?;
        if got == 0 {
            break;
        }
        read_bytes += got as u64;
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        n += 1;
        let change = parse_line(&line, n)?;
        batch_len += line.len();
        batch.push(change);
        if batch_len >= batch_bytes {
            flush(&mut batch, &mut enc, &mut store, &mut file)?;
            batch_len = 0;
        }
    }
    if !batch.is_empty() {
        flush(&mut batch, &mut enc, &mut store, &mut file)?;
    }
    file.put(&[TAG_END])?;
    file.put(&batches.to_le_bytes())?;
    file.put(&n.to_le_bytes())?;
    let checksum = file.hash.digest();
    file.put(&checksum.to_le_bytes())?;
    file.out.flush()?;
    let mut stats = enc.stats();
    stats.input_bytes = read_bytes;
    stats.output_bytes = file.bytes;
    let fetches = stats.cache_hits + stats.cache_misses;
    let documents = enc.documents();
    let memory = enc.memory();
    let index_bytes = memory.feature_table + memory.feature_cache + memory.document_cache;
    Ok(EncodeReport {
        batches,
        ratio: stats.input_bytes as f64 / stats.output_bytes.max(1) as f64,
        cache_hit_ratio: if fetches == 0 {
            0.0
        } else {
            stats.cache_hits as f64 / fetches as f64
        },
        elapsed_s: started.elapsed().as_secs_f64(),
        index_bytes,
        feature_table_bytes: memory.feature_table,
        feature_cache_bytes: memory.feature_cache,
        document_cache_bytes: memory.document_cache,
        documents,
        index_bytes_per_document: if documents == 0 {
            0.0
        } else {
            index_bytes as f64 / documents as f64
        },
        stats,
    })
}

/// Reads an encoded stream from `input` and writes every line back to `output`; returns the
/// number of lines. Lines go out batch by batch as they are decoded, so on an error (a stream
/// cut short, a batch repeated, damage) `output` may hold the lines of the batches before it:
/// they are not the whole stream. [`check_frames`] finds a cut or shuffled file before any
/// line is written.
pub fn decode(
    input: impl Read,
    mut output: impl Write,
    config: SdedupConfig,
) -> Result<u64, Error> {
    let mut frames = Frames::open(input)?;
    let mut dec = Decoder::new(config);
    let mut store = MemoryStore::default();
    let mut lines = 0u64;
    let mut buf = Vec::new();
    loop {
        match frames.next()? {
            Frame::Batch { seq, len, at } => {
                frames.read_body(seq, len, &mut buf)?;
                let offset = at + BATCH_HEAD_LEN as u64;
                let (batch, used) = dec.decode_batch(&buf, offset, &mut store)?;
                if used != buf.len() {
                    return Err(Error::Corrupt {
                        offset: offset + used as u64,
                        detail: format!("bytes after batch {seq} inside its frame"),
                    });
                }
                if !batch.missing.is_empty() {
                    return Err(Error::Corrupt {
                        offset,
                        detail: format!(
                            "{} entries of batch {seq} reference sources this stream never held",
                            batch.missing.len()
                        ),
                    });
                }
                for c in &batch.changes {
                    if c.pos != lines + 1 {
                        return Err(Error::Corrupt {
                            offset,
                            detail: format!(
                                "batch {seq} holds line {} where line {} belongs",
                                c.pos,
                                lines + 1
                            ),
                        });
                    }
                    let doc = c.doc.as_deref().ok_or_else(|| Error::Corrupt {
                        offset,
                        detail: format!("entry {} has no line", c.pos),
                    })?;
                    output.write_all(doc)?;
                    output.write_all(b"\n")?;
                    store.apply(c);
                    lines += 1;
                }
            }
            Frame::End { entries, at } => {
                if entries != lines {
                    return Err(Error::Corrupt {
                        offset: at,
                        detail: format!(
                            "the end marker counts {entries} lines, the batches held {lines}{}",
                            if entries > lines {
                                ": lines missing"
                            } else {
                                ""
                            }
                        ),
                    });
                }
                output.flush()?;
                return Ok(lines);
            }
        }
    }
}

/// Checks a seekable stream's frames without decoding them: the header and version, batch
/// numbers in order, each batch whole, the end marker and nothing after it; returns the
/// number of batches. Reads only the frame heads, seeking over the batches, and leaves
/// `input` anywhere: seek it back before [`decode`]. The checksum and the batches' contents
/// are checked by [`decode`] only.
pub fn check_frames(input: impl Read + Seek) -> Result<u64, Error> {
    let mut frames = Frames::open(input)?;
    loop {
        match frames.next()? {
            Frame::Batch { seq, len, .. } => frames.skip_body(seq, len)?,
            Frame::End { .. } => return Ok(frames.batches),
        }
    }
}

/// One frame of a file, its head read and checked.
enum Frame {
    /// Batch `seq`, `len` bytes, its frame starting at byte `at`.
    Batch { seq: u64, len: u32, at: u64 },
    /// The end marker at byte `at`, checked against the batches seen and the checksum;
    /// `entries` is for the caller to compare with the lines it decoded.
    End { entries: u64, at: u64 },
}

/// Reads a file's frames in order and refuses anything but the next batch or the end marker.
struct Frames<R> {
    input: R,
    hash: Xxh3Default,
    /// Every byte so far went through `hash` (none was skipped).
    hashed: bool,
    offset: u64,
    batches: u64,
}

impl<R: Read> Frames<R> {
    /// Reads and checks the header.
    fn open(input: R) -> Result<Self, Error> {
        let mut frames = Frames {
            input,
            hash: Xxh3Default::new(),
            hashed: true,
            offset: 0,
            batches: 0,
        };
        let mut head = [0u8; HEADER_LEN];
        let n = frames.fill(&mut head)?;
        let magic = n.min(FILE_MAGIC.len());
        if head[..magic] != FILE_MAGIC[..magic] {
            return Err(Error::Corrupt {
                offset: 0,
                detail: "not an encoded JSON-lines stream (wrong magic)".into(),
            });
        }
        if n < HEADER_LEN {
            return Err(Error::Truncated {
                offset: n as u64,
                detail: format!("stream ends inside its {HEADER_LEN}-byte header"),
            });
        }
        let version = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        if version != FILE_VERSION {
            let mut next = [0u8; 4];
            let v1 = frames.fill(&mut next)? == next.len() && next == V1_BATCH_MAGIC;
            return Err(Error::Unsupported(if v1 {
                format!(
                    "version 1, which has no batch numbers or end marker to tell a complete \
                     stream from a cut one; this build reads version {FILE_VERSION} only: \
                     encode the lines again with it"
                )
            } else {
                format!("version {version}; this build reads version {FILE_VERSION} only")
            }));
        }
        Ok(frames)
    }

    /// Fills `buf` unless the input ends first; returns the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        let n = read_full(&mut self.input, buf)?;
        self.hash.update(&buf[..n]);
        self.offset += n as u64;
        Ok(n)
    }

    /// Where the stream ended after the last whole batch.
    fn after_last(&self) -> String {
        match self.batches {
            0 => "its header".to_string(),
            n => format!("batch {n}"),
        }
    }

    /// Reads the next frame's head (the whole end marker, and checks that nothing follows it).
    fn next(&mut self) -> Result<Frame, Error> {
        let at = self.offset;
        let mut tag = [0u8; 1];
        if self.fill(&mut tag)? == 0 {
            return Err(Error::Truncated {
                offset: at,
                detail: format!(
                    "stream ends after {} without its end marker",
                    self.after_last()
                ),
            });
        }
        match tag[0] {
            TAG_BATCH => {
                let mut head = [0u8; BATCH_HEAD_LEN - 1];
                if self.fill(&mut head)? < head.len() {
                    return Err(Error::Truncated {
                        offset: self.offset,
                        detail: format!(
                            "stream ends inside the frame head of the batch after {}",
                            self.after_last()
                        ),
                    });
                }
                let seq = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
                let len = u32::from_le_bytes(head[8..].try_into().expect("4 bytes"));
                let want = self.batches + 1;
                if seq != want {
                    let detail = if seq == 0 {
                        "a batch numbered 0 (batches count from 1)".to_string()
                    } else if seq < want {
                        format!(
                            "batch {seq} again, after batch {}: a batch duplicated or out of \
                             order",
                            self.batches
                        )
                    } else {
                        format!(
                            "batch {seq} where batch {want} belongs: batches missing or out of order"
                        )
                    };
                    return Err(Error::Corrupt { offset: at, detail });
                }
                if len == 0 || len > MAX_BATCH {
                    return Err(Error::Corrupt {
                        offset: at + 9,
                        detail: format!("batch {seq} of {len} bytes (1 to {MAX_BATCH} allowed)"),
                    });
                }
                Ok(Frame::Batch { seq, len, at })
            }
            TAG_END => {
                let mut end = [0u8; END_LEN - 1];
                let counted = 16;
                if self.fill(&mut end[..counted])? < counted {
                    return Err(Error::Truncated {
                        offset: self.offset,
                        detail: format!(
                            "stream ends inside its end marker, after {}",
                            self.after_last()
                        ),
                    });
                }
                let digest = self.hash.digest();
                if self.fill(&mut end[counted..])? < END_LEN - 1 - counted {
                    return Err(Error::Truncated {
                        offset: self.offset,
                        detail: format!(
                            "stream ends inside its end marker, after {}",
                            self.after_last()
                        ),
                    });
                }
                let field = |i: usize| u64::from_le_bytes(end[i..i + 8].try_into().expect("8"));
                let (batches, entries, checksum) = (field(0), field(8), field(16));
                if batches != self.batches {
                    return Err(Error::Corrupt {
                        offset: at + 1,
                        detail: format!(
                            "the end marker counts {batches} batches, the stream holds {}{}",
                            self.batches,
                            if batches > self.batches {
                                ": batches missing"
                            } else {
                                ""
                            }
                        ),
                    });
                }
                if self.hashed && checksum != digest {
                    return Err(Error::Corrupt {
                        offset: at + 17,
                        detail: "the stream's checksum does not match its bytes: damaged".into(),
                    });
                }
                let mut more = [0u8; 1];
                if self.fill(&mut more)? != 0 {
                    return Err(Error::Corrupt {
                        offset: at + END_LEN as u64,
                        detail: "bytes after the end marker".into(),
                    });
                }
                Ok(Frame::End { entries, at })
            }
            t => Err(Error::Corrupt {
                offset: at,
                detail: format!(
                    "frame tag 0x{t:02x} after {}: neither a batch (0x42) nor the end marker \
                     (0x45)",
                    self.after_last()
                ),
            }),
        }
    }

    /// Reads batch `seq`'s `len` bytes into `buf`, which grows only as bytes come: a cut
    /// stream whose last frame claims a large batch costs what it holds, not the claim.
    fn read_body(&mut self, seq: u64, len: u32, buf: &mut Vec<u8>) -> Result<(), Error> {
        buf.clear();
        let got = (&mut self.input).take(u64::from(len)).read_to_end(buf)?;
        self.hash.update(buf);
        self.offset += got as u64;
        if got < len as usize {
            return Err(Error::Truncated {
                offset: self.offset,
                detail: format!("stream ends inside batch {seq} ({got} of its {len} bytes)"),
            });
        }
        self.batches = seq;
        Ok(())
    }
}

impl<R: Read + Seek> Frames<R> {
    /// Seeks over batch `seq`'s `len` bytes.
    fn skip_body(&mut self, seq: u64, len: u32) -> Result<(), Error> {
        let here = self.input.stream_position()?;
        let end = self.input.seek(SeekFrom::End(0))?;
        let left = end.saturating_sub(here);
        if left < u64::from(len) {
            return Err(Error::Truncated {
                offset: self.offset + left,
                detail: format!("stream ends inside batch {seq} ({left} of its {len} bytes)"),
            });
        }
        self.input.seek(SeekFrom::Start(here + u64::from(len)))?;
        self.offset += u64::from(len);
        self.hashed = false;
        self.batches = seq;
        Ok(())
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
