//! The JSON-lines adapter: `replicate encode` / `decode` for any source that can write its
//! changes as lines like `{"op": "update", "_id": "...", ...}` (MongoDB's `"i"/"u"/"d"` and an
//! optional `"ns"` collection are understood too).
//!
//! Each line is one change; the whole line is the document shipped, so decoding gives back
//! every line exactly. A file holds a header, then batches each behind a 4-byte length.

use std::io::{BufRead, Read, Write};

use serde::Serialize;

use crate::sdedup::{Decoder, EncodeStats, Encoder, MemoryStore, SdedupConfig};
use crate::{Change, Error, Op};

/// File magic of an encoded JSON-lines stream.
pub const FILE_MAGIC: [u8; 4] = *b"DWRJ";
/// Largest batch a decoder reads from a file.
const MAX_BATCH: u32 = 1 << 30;

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

/// Totals of one encode run.
#[derive(Debug, Clone, Serialize)]
pub struct EncodeReport {
    /// Encoder counters.
    #[serde(flatten)]
    pub stats: EncodeStats,
    /// Input bytes / output bytes.
    pub ratio: f64,
    /// Source-cache hits / fetches.
    pub cache_hit_ratio: f64,
    /// RAM of the similarity state: feature table, its page cache, the document table's cache.
    pub index_bytes: usize,
    /// RAM of the cuckoo feature table alone: the part that grows with the documents.
    pub feature_table_bytes: usize,
    /// Documents indexed at the end.
    pub documents: usize,
    /// `feature_table_bytes / documents`: what each more document costs in RAM.
    pub index_bytes_per_document: f64,
}

/// Reads lines from `input`, writes the encoded stream to `output`, batching about
/// `batch_bytes` of input per batch; the similarity state lives in `state` (or a temporary
/// directory).
pub fn encode(
    input: impl BufRead,
    mut output: impl Write,
    config: SdedupConfig,
    batch_bytes: usize,
    state: Option<&std::path::Path>,
) -> Result<EncodeReport, Error> {
    let mut enc = Encoder::open(config, state)?;
    let mut store = MemoryStore::default();
    output.write_all(&FILE_MAGIC)?;
    let mut batch = Vec::new();
    let mut batch_len = 0;
    let mut out = Vec::new();
    let mut header_bytes = FILE_MAGIC.len() as u64;
    let mut flush = |batch: &mut Vec<Change>,
                     enc: &mut Encoder,
                     store: &mut MemoryStore,
                     output: &mut dyn Write|
     -> Result<(), Error> {
        out.clear();
        enc.encode_batch(batch, store, &mut out)?;
        for c in batch.iter() {
            store.apply(c);
        }
        output.write_all(&(out.len() as u32).to_le_bytes())?;
        output.write_all(&out)?;
        header_bytes += 4;
        batch.clear();
        Ok(())
    };
    for (n, line) in input.split(b'\n').enumerate() {
        let line = line?;
        let change = parse_line(&line, n as u64 + 1)?;
        batch_len += line.len();
        batch.push(change);
        if batch_len >= batch_bytes {
            flush(&mut batch, &mut enc, &mut store, &mut output)?;
            batch_len = 0;
        }
    }
    if !batch.is_empty() {
        flush(&mut batch, &mut enc, &mut store, &mut output)?;
    }
    output.flush()?;
    let mut stats = enc.stats();
    stats.output_bytes += header_bytes;
    let fetches = stats.cache_hits + stats.cache_misses;
    let documents = enc.documents();
    Ok(EncodeReport {
        ratio: stats.input_bytes as f64 / stats.output_bytes.max(1) as f64,
        cache_hit_ratio: if fetches == 0 {
            0.0
        } else {
            stats.cache_hits as f64 / fetches as f64
        },
        index_bytes: enc.index_bytes(),
        feature_table_bytes: enc.table_bytes(),
        documents,
        index_bytes_per_document: enc.table_bytes() as f64 / documents.max(1) as f64,
        stats,
    })
}

/// Reads an encoded stream from `input` and writes every line back to `output`.
pub fn decode(
    mut input: impl Read,
    mut output: impl Write,
    config: SdedupConfig,
) -> Result<u64, Error> {
    let mut magic = [0u8; 4];
    input.read_exact(&mut magic).map_err(|_| Error::Corrupt {
        offset: 0,
        detail: "too short to be an encoded JSON-lines stream".into(),
    })?;
    if magic != FILE_MAGIC {
        return Err(Error::Corrupt {
            offset: 0,
            detail: "not an encoded JSON-lines stream (wrong magic)".into(),
        });
    }
    let mut dec = Decoder::new(config);
    let mut store = MemoryStore::default();
    let mut offset = 4u64;
    let mut lines = 0u64;
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 4];
        match read_full(&mut input, &mut len)? {
            0 => break,
            4 => {}
            _ => {
                return Err(Error::Corrupt {
                    offset,
                    detail: "truncated batch length".into(),
                })
            }
        }
        let n = u32::from_le_bytes(len);
        if n > MAX_BATCH {
            return Err(Error::Corrupt {
                offset,
                detail: format!("batch of {n} bytes exceeds {MAX_BATCH}"),
            });
        }
        buf.resize(n as usize, 0);
        if read_full(&mut input, &mut buf)? != buf.len() {
            return Err(Error::Corrupt {
                offset: offset + 4,
                detail: "truncated batch".into(),
            });
        }
        let (batch, used) = dec.decode_batch(&buf, offset + 4, &mut store)?;
        if used != buf.len() {
            return Err(Error::Corrupt {
                offset: offset + 4 + used as u64,
                detail: "bytes after the batch".into(),
            });
        }
        if !batch.missing.is_empty() {
            return Err(Error::Corrupt {
                offset: offset + 4,
                detail: format!(
                    "{} entries reference sources this stream never held",
                    batch.missing.len()
                ),
            });
        }
        for c in &batch.changes {
            let doc = c.doc.as_deref().ok_or_else(|| Error::Corrupt {
                offset,
                detail: format!("entry {} has no line", c.pos),
            })?;
            output.write_all(doc)?;
            output.write_all(b"\n")?;
            store.apply(c);
            lines += 1;
        }
        offset += 4 + n as u64;
    }
    output.flush()?;
    Ok(lines)
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
