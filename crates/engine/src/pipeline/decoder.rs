//! The pipeline decoder: untrusted bytes in, items out or a clear error.

use xxhash_rust::xxh3::Xxh3;

use super::format::*;
use super::window::{Unit, Window};
use crate::compress::Compression;
use crate::delta::{DeltaCodec, DeltaSpec};
use crate::varint;
use crate::{Error, Result};

/// Rebuilds items from a stream, frame by frame, mirroring the encoder's window.
pub struct Decoder {
    delta: Box<dyn DeltaCodec>,
    window: Window,
    poisoned: bool,
}

impl Decoder {
    /// Reads the stream header; returns the decoder and the header's length in bytes.
    pub fn from_header(stream: &[u8]) -> Result<(Self, usize)> {
        if stream.len() < MAGIC.len() + 1 || stream[..3] != MAGIC[..3] {
            return Err(Error::corrupt(
                "stream header",
                0,
                "not a dedupwire pipeline stream",
            ));
        }
        if stream[3] != MAGIC[3] {
            return Err(Error::corrupt(
                "stream header",
                3,
                format!(
                    "format version {} is not supported (this build reads {})",
                    stream[3], MAGIC[3]
                ),
            ));
        }
        let delta = match stream[4] {
            DELTA_SAMPLED => DeltaSpec::Sampled,
            DELTA_ZSTD_REF => DeltaSpec::ZstdRef { level: 3 },
            t => {
                return Err(Error::corrupt(
                    "stream header",
                    4,
                    format!("unknown delta codec {t}"),
                ))
            }
        };
        let mut pos = 5;
        let window = varint::get(stream, &mut pos, "stream header")?;
        if window > MAX_WINDOW {
            return Err(Error::corrupt(
                "stream header",
                5,
                format!("window of {window} bytes exceeds {MAX_WINDOW}"),
            ));
        }
        let dec = Decoder {
            delta: delta.build(),
            window: Window::new(window),
            poisoned: false,
        };
        Ok((dec, pos))
    }

    /// Decodes the frame at the start of `buf` (found at `offset` in the stream, for errors),
    /// appends its items to `items` and returns the bytes consumed.
    ///
    /// After an error the decoder's window may be half-updated, so it refuses further frames.
    pub fn decode_frame(
        &mut self,
        buf: &[u8],
        offset: usize,
        items: &mut Vec<Vec<u8>>,
    ) -> Result<usize> {
        if self.poisoned {
            return Err(Error::corrupt(
                "frame",
                offset,
                "decoder stopped at an earlier error",
            ));
        }
        let first_new = items.len();
        let result = self.decode_frame_inner(buf, offset, items);
        if result.is_err() {
            self.poisoned = true;
            items.truncate(first_new);
        }
        result
    }

    fn decode_frame_inner(
        &mut self,
        buf: &[u8],
        offset: usize,
        items: &mut Vec<Vec<u8>>,
    ) -> Result<usize> {
        let corrupt = |at: usize, detail: String| Error::corrupt("frame", offset + at, detail);
        if buf.first() != Some(&FRAME) {
            return Err(corrupt(0, "missing frame marker".into()));
        }
        let mut pos = 1;
        let raw_len = varint::get_len(buf, &mut pos, MAX_FRAME_RAW, "frame")?;
        let stored_len = varint::get_len(buf, &mut pos, MAX_FRAME_RAW, "frame")?;
        let header_end = pos + 1 + 8;
        if buf.len() < header_end + stored_len {
            return Err(corrupt(
                pos,
                format!(
                    "truncated: frame needs {} bytes, {} remain",
                    header_end + stored_len,
                    buf.len()
                ),
            ));
        }
        let tag = buf[pos];
        let hash = u64::from_le_bytes(buf[pos + 1..header_end].try_into().expect("8 bytes"));
        let body = Compression::decompress(tag, &buf[header_end..header_end + stored_len], raw_len)
            .map_err(|e| corrupt(header_end, e.to_string()))?;
        let mut content = Xxh3::new();
        self.decode_body(&body, offset + header_end, items, &mut content)?;
        if content.digest() != hash {
            return Err(corrupt(
                pos + 1,
                "content hash mismatch: the rebuilt items differ from what was sent".into(),
            ));
        }
        Ok(header_end + stored_len)
    }

    fn decode_body(
        &mut self,
        body: &[u8],
        offset: usize,
        items: &mut Vec<Vec<u8>>,
        content: &mut Xxh3,
    ) -> Result<()> {
        let corrupt = |at: usize, detail: String| Error::corrupt("frame body", offset + at, detail);
        let mut pos = 0;
        let ops_len = varint::get_len(body, &mut pos, body.len(), "frame body")?;
        let ops_end = pos
            .checked_add(ops_len)
            .filter(|&e| e <= body.len())
            .ok_or_else(|| corrupt(pos, "instruction length past the body".into()))?;
        let ops = &body[..ops_end];
        let mut pay = ops_end;
        let n_items = varint::get_len(ops, &mut pos, ops_len, "frame body")?;
        for _ in 0..n_items {
            let n_units = varint::get_len(ops, &mut pos, ops_len, "frame body")?;
            let mut item = Vec::new();
            for _ in 0..n_units {
                let op_at = pos;
                let Some(&op) = ops.get(pos) else {
                    return Err(corrupt(pos, "truncated instructions".into()));
                };
                pos += 1;
                let next = self.window.next_id();
                let unit = match op {
                    OP_LITERAL => {
                        let len = varint::get_len(ops, &mut pos, MAX_UNIT, "frame body")?;
                        let bytes = body
                            .get(pay..pay + len)
                            .ok_or_else(|| corrupt(op_at, "literal past the payload".into()))?;
                        pay += len;
                        bytes.to_vec()
                    }
                    OP_REF => {
                        let id = self.back_ref(ops, &mut pos, next, op_at, offset)?;
                        item.extend_from_slice(self.window.get(id).expect("checked by back_ref"));
                        continue;
                    }
                    OP_DELTA => {
                        let id = self.back_ref(ops, &mut pos, next, op_at, offset)?;
                        let dlen = varint::get_len(ops, &mut pos, MAX_UNIT, "frame body")?;
                        let ulen = varint::get_len(ops, &mut pos, MAX_UNIT, "frame body")?;
                        let delta = body
                            .get(pay..pay + dlen)
                            .ok_or_else(|| corrupt(op_at, "delta past the payload".into()))?;
                        pay += dlen;
                        let mut unit = Vec::with_capacity(ulen.min(1 << 20));
                        let source = self.window.get(id).expect("checked by back_ref");
                        self.delta.decode(source, delta, ulen, &mut unit)?;
                        if unit.len() != ulen {
                            return Err(corrupt(
                                op_at,
                                format!("delta rebuilt {} bytes, expected {ulen}", unit.len()),
                            ));
                        }
                        unit
                    }
                    t => return Err(corrupt(op_at, format!("unknown unit operation {t}"))),
                };
                item.extend_from_slice(&unit);
                self.window.push(Unit::Owned(unit));
            }
            content.update(&item);
            items.push(item);
        }
        if pos != ops_end || pay != body.len() {
            return Err(corrupt(pos, "trailing bytes after the last item".into()));
        }
        Ok(())
    }

    fn back_ref(
        &self,
        ops: &[u8],
        pos: &mut usize,
        next: u64,
        op_at: usize,
        offset: usize,
    ) -> Result<u64> {
        let dist = varint::get(ops, pos, "frame body")?;
        let id = next.checked_sub(dist).filter(|_| dist > 0);
        match id {
            Some(id) if self.window.get(id).is_some() => Ok(id),
            _ => Err(Error::corrupt(
                "frame body",
                offset + op_at,
                format!("reference {dist} units back is outside the window"),
            )),
        }
    }
}
