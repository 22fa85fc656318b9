//! zstd with the source as a reference prefix (the equivalent of `zstd --patch-from`).
//!
//! # Format
//!
//! ```text
//! delta := target_len (varint) frame?
//! ```
//!
//! `frame` is one zstd frame (content size stored, no checksum, no dictionary id) compressed
//! with `source` referenced as a prefix; it is absent for an empty target. The window covers
//! source and target (`window_log = ceil(log2(source + target))`, at least 10, at most 31),
//! and long-distance matching is on when that is more than [`LDM_FROM`] bytes, as
//! `--patch-from` does. The decoder bounds its output by the stored length, which must be
//! within the caller's `limit`, and accepts exactly one frame.
//!
//! Contexts are kept per thread and reused: creating one and sizing its tables on every call
//! would cost as much as compressing a small document.

use std::cell::RefCell;

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, DParameter, ResetDirective};

use super::DeltaCodec;
use crate::{varint, Error, Result};

/// Source + target size above which long-distance matching is turned on.
pub const LDM_FROM: usize = 8 << 20;

/// zstd with the source as a reference prefix.
#[derive(Debug, Clone)]
pub struct ZstdRef {
    level: i32,
}

impl ZstdRef {
    /// A codec compressing at `level` (clamped to zstd's range when used).
    pub fn new(level: i32) -> Self {
        ZstdRef { level }
    }

    /// The zstd level.
    pub fn level(&self) -> i32 {
        self.level
    }
}

thread_local! {
    static CCTX: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn zerr(code: usize) -> String {
    zstd_safe::get_error_name(code).to_string()
}

/// `ceil(log2(n))` clamped to zstd's window range.
fn window_log(n: usize) -> u32 {
    let bits = usize::BITS - n.saturating_sub(1).leading_zeros();
    let max = if cfg!(target_pointer_width = "32") {
        30
    } else {
        31
    };
    bits.clamp(10, max)
}

type Res<T> = std::result::Result<T, String>;

/// Takes this thread's context out of `slot` (a new one the first time, or while a call is
/// still using it).
fn take<T>(slot: &'static std::thread::LocalKey<RefCell<Option<T>>>) -> Option<T> {
    slot.with(|c| c.try_borrow_mut().ok().and_then(|mut c| c.take()))
}

fn put_back<T>(slot: &'static std::thread::LocalKey<RefCell<Option<T>>>, ctx: T) {
    slot.with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            *c = Some(ctx);
        }
    });
}

fn compress_with<'a>(
    ctx: &mut CCtx<'a>,
    level: i32,
    source: &'a [u8],
    target: &[u8],
    scratch: &mut Vec<u8>,
) -> Res<()> {
    let total = source.len().saturating_add(target.len());
    ctx.set_parameter(CParameter::CompressionLevel(level))
        .map_err(zerr)?;
    ctx.set_parameter(CParameter::WindowLog(window_log(total)))
        .map_err(zerr)?;
    ctx.set_parameter(CParameter::EnableLongDistanceMatching(total > LDM_FROM))
        .map_err(zerr)?;
    ctx.set_parameter(CParameter::ContentSizeFlag(true))
        .map_err(zerr)?;
    ctx.set_parameter(CParameter::ChecksumFlag(false))
        .map_err(zerr)?;
    ctx.set_parameter(CParameter::DictIdFlag(false))
        .map_err(zerr)?;
    ctx.ref_prefix(source).map_err(zerr)?;
    scratch.clear();
    scratch.reserve(zstd_safe::compress_bound(target.len()));
    ctx.compress2(scratch, target).map_err(zerr)?;
    Ok(())
}

fn compress(level: i32, source: &[u8], target: &[u8], out: &mut Vec<u8>) -> Res<()> {
    let level = level.clamp(zstd_safe::min_c_level(), zstd_safe::max_c_level());
    let mut ctx: CCtx<'_> = match take(&CCTX) {
        Some(c) => c,
        None => CCtx::try_create().ok_or("cannot create a zstd context")?,
    };
    let res = SCRATCH.with(|s| {
        let mut owned = Vec::new();
        let mut guard = s.try_borrow_mut();
        let scratch = match guard.as_deref_mut() {
            Ok(s) => s,
            Err(_) => &mut owned,
        };
        let res = compress_with(&mut ctx, level, source, target, scratch);
        if res.is_ok() {
            out.extend_from_slice(scratch);
        }
        res
    });
    // Resetting the parameters drops the reference to `source` (zstd clears the prefix);
    // only then may the context outlive this call.
    if ctx.reset(ResetDirective::SessionAndParameters).is_ok() {
        // SAFETY: `CCtx<'a>` only ties `'a` to referenced prefixes and dictionaries; the reset
        // above removed the only one (`source`), so the context borrows nothing any more and
        // extending its lifetime parameter is sound. The type is otherwise identical.
        let ctx = unsafe { std::mem::transmute::<CCtx<'_>, CCtx<'static>>(ctx) };
        put_back(&CCTX, ctx);
    }
    res
}

fn decompress_with<'a>(
    ctx: &mut DCtx<'a>,
    source: &'a [u8],
    frame: &[u8],
    dst: &mut [u8],
) -> Res<usize> {
    // One-shot decoding writes straight into `dst`, so a large window costs no memory.
    ctx.set_parameter(DParameter::WindowLogMax(31))
        .map_err(zerr)?;
    ctx.ref_prefix(source).map_err(zerr)?;
    ctx.decompress(dst, frame).map_err(zerr)
}

fn decompress(source: &[u8], frame: &[u8], len: usize, out: &mut Vec<u8>) -> Res<()> {
    let mut ctx: DCtx<'_> = match take(&DCTX) {
        Some(c) => c,
        None => DCtx::try_create().ok_or("cannot create a zstd context")?,
    };
    let start = out.len();
    out.resize(start + len, 0);
    let res = decompress_with(&mut ctx, source, frame, &mut out[start..]);
    if ctx.reset(ResetDirective::SessionAndParameters).is_ok() {
        // SAFETY: as in `compress`: the reset dropped the prefix, the only borrow.
        let ctx = unsafe { std::mem::transmute::<DCtx<'_>, DCtx<'static>>(ctx) };
        put_back(&DCTX, ctx);
    }
    match res {
        Ok(n) if n == len => Ok(()),
        Ok(n) => Err(format!("frame holds {n} bytes, header says {len}")),
        Err(e) => Err(e),
    }
}

impl DeltaCodec for ZstdRef {
    fn encode(&self, source: &[u8], target: &[u8], out: &mut Vec<u8>) {
        varint::put(out, target.len() as u64);
        if target.is_empty() {
            return;
        }
        let start = out.len();
        if let Err(e) = compress(self.level, source, target, out) {
            // Only allocation failure inside zstd gets here: the parameters are all valid.
            out.truncate(start);
            panic!("zstd reference-prefix compression failed: {e}");
        }
    }

    fn decode(&self, source: &[u8], delta: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<()> {
        const WHAT: &str = "zstd delta";
        let mut pos = 0;
        let len = varint::get_len(delta, &mut pos, limit, WHAT)?;
        let frame = &delta[pos..];
        if len == 0 {
            if !frame.is_empty() {
                return Err(Error::corrupt(
                    WHAT,
                    pos,
                    "trailing bytes after an empty target",
                ));
            }
            return Ok(());
        }
        // One frame, exactly.
        match zstd_safe::find_frame_compressed_size(frame) {
            Ok(n) if n == frame.len() => {}
            Ok(n) => {
                return Err(Error::corrupt(
                    WHAT,
                    pos + n,
                    format!("{} bytes of trailing garbage", frame.len() - n),
                ))
            }
            Err(code) => return Err(Error::corrupt(WHAT, pos, zerr(code))),
        }
        // A zstd block holds at most 128 KiB and costs at least 3 bytes: bound the output by
        // what the frame could produce before reserving it.
        let most = (frame.len() as u128 / 3 + 1) * (128 << 10);
        if len as u128 > most {
            return Err(Error::corrupt(
                WHAT,
                0,
                format!("target length {len} is more than this frame can produce"),
            ));
        }
        let start = out.len();
        out.try_reserve(len)
            .map_err(|e| Error::corrupt(WHAT, 0, format!("cannot reserve {len} bytes: {e}")))?;
        decompress(source, frame, len, out).map_err(|e| {
            out.truncate(start);
            Error::corrupt(WHAT, pos, e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_logs() {
        assert_eq!(window_log(0), 10);
        assert_eq!(window_log(1024), 10);
        assert_eq!(window_log(1025), 11);
        assert_eq!(window_log(1 << 20), 20);
        assert_eq!(window_log(usize::MAX), 31);
    }

    #[test]
    fn round_trip_reuses_contexts() {
        let c = ZstdRef::new(3);
        let s: Vec<u8> = (0..20_000u32).map(|i| (i * 31 % 253) as u8).collect();
        for k in 0..3 {
            let mut t = s.clone();
            t[1000 + k] ^= 1;
            let mut d = Vec::new();
            c.encode(&s, &t, &mut d);
            assert!(d.len() < 100, "{}", d.len());
            let mut back = b"x".to_vec();
            c.decode(&s, &d, t.len(), &mut back).unwrap();
            assert_eq!(&back[1..], &t[..]);
        }
    }
}
