//! Byte layout of an sDedup batch (see `crates/replicate/FORMAT.md`).

use dedupwire_engine::compress::Compression;

/// Batch magic: "DWR" and the format version.
pub(super) const MAGIC: [u8; 4] = *b"DWR\x01";
/// Largest raw batch body a decoder accepts.
pub(super) const MAX_BODY: usize = 1 << 30;
/// Largest document a decoder accepts.
pub(super) const MAX_DOC: usize = 256 << 20;

pub(super) const OP_INSERT: u8 = 0;
pub(super) const OP_UPDATE: u8 = 1;
pub(super) const OP_DELETE: u8 = 2;

pub(super) const DOC_NONE: u8 = 0;
pub(super) const DOC_LITERAL: u8 = 1;
pub(super) const DOC_DELTA: u8 = 2;

pub(super) use dedupwire_engine::varint::put as put_varint;

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Wraps a raw body into a batch frame.
pub(super) fn seal(body: &[u8], entries: usize, compression: Compression, out: &mut Vec<u8>) {
    let mut method = compression;
    let mut stored = method.compress(body);
    if stored.len() >= body.len() {
        method = Compression::None;
        stored = body.to_vec();
    }
    out.extend_from_slice(&MAGIC);
    put_varint(out, entries as u64);
    put_varint(out, body.len() as u64);
    put_varint(out, stored.len() as u64);
    out.push(method.tag());
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(body).to_le_bytes());
    out.extend_from_slice(&stored);
}

/// A cursor over untrusted bytes whose every read is checked.
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    pub(super) base: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn err(&self, detail: impl Into<String>) -> crate::Error {
        crate::Error::Corrupt {
            offset: (self.base + self.pos) as u64,
            detail: detail.into(),
        }
    }

    pub(super) fn u8(&mut self) -> Result<u8, crate::Error> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| self.err("truncated"))?;
        self.pos += 1;
        Ok(b)
    }

    pub(super) fn u64_le(&mut self) -> Result<u64, crate::Error> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    pub(super) fn varint(&mut self) -> Result<u64, crate::Error> {
        let at = self.pos;
        dedupwire_engine::varint::get(self.buf, &mut self.pos, "replication batch").map_err(|e| {
            self.pos = at;
            self.err(e.to_string())
        })
    }

    pub(super) fn len(&mut self, limit: usize) -> Result<usize, crate::Error> {
        let v = self.varint()?;
        if v > limit as u64 {
            return Err(self.err(format!("length {v} exceeds {limit}")));
        }
        Ok(v as usize)
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], crate::Error> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.err("truncated"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(super) fn bytes(&mut self, limit: usize) -> Result<&'a [u8], crate::Error> {
        let n = self.len(limit)?;
        self.take(n)
    }

    pub(super) fn string(&mut self) -> Result<String, crate::Error> {
        let b = self.bytes(1 << 16)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err("name is not UTF-8"))
    }
}
