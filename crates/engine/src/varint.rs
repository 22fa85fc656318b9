//! LEB128 unsigned varints: the integer encoding of every engine format.

use crate::{Error, Result};

/// Appends `v` as an LEB128 varint.
pub fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes [`put`] writes for `v`.
pub fn len(v: u64) -> usize {
    (u64::BITS - (v | 1).leading_zeros()).div_ceil(7) as usize
}

/// Reads a varint at `*pos`, advancing it; `what` names the structure for errors.
pub fn get(buf: &[u8], pos: &mut usize, what: &'static str) -> Result<u64> {
    let start = *pos;
    let mut v: u64 = 0;
    let mut shift = 0u32;
    loop {
        let Some(&b) = buf.get(*pos) else {
            return Err(Error::corrupt(what, start, "truncated varint"));
        };
        *pos += 1;
        if shift == 63 && b > 1 {
            return Err(Error::corrupt(what, start, "varint overflows 64 bits"));
        }
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
        shift += 7;
        if shift > 63 {
            return Err(Error::corrupt(what, start, "varint longer than 10 bytes"));
        }
    }
}

/// Reads a varint that must fit in `usize` and be at most `limit`.
pub fn get_len(buf: &[u8], pos: &mut usize, limit: usize, what: &'static str) -> Result<usize> {
    let start = *pos;
    let v = get(buf, pos, what)?;
    if v > limit as u64 {
        return Err(Error::corrupt(
            what,
            start,
            format!("length {v} exceeds limit {limit}"),
        ));
    }
    Ok(v as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn len_is_what_put_writes() {
        for v in [0, 1, 127, 128, 16383, 16384, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put(&mut out, v);
            assert_eq!(len(v), out.len(), "{v}");
        }
    }

    proptest! {
        #[test]
        fn round_trip(v: u64) {
            let mut b = Vec::new();
            put(&mut b, v);
            let mut p = 0;
            prop_assert_eq!(get(&b, &mut p, "t").unwrap(), v);
            prop_assert_eq!(p, b.len());
        }
    }

    #[test]
    fn rejects_truncated_and_overlong() {
        assert!(get(&[0x80], &mut 0, "t").is_err());
        assert!(get(&[0xff; 11], &mut 0, "t").is_err());
        assert!(get(
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
            &mut 0,
            "t"
        )
        .is_err());
    }
}
