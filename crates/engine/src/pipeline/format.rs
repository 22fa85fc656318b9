//! Byte layout constants of the pipeline stream (see `docs/format.md`).

/// Stream magic: "DWP" then the format version.
pub(super) const MAGIC: [u8; 4] = *b"DWP\x01";
/// Frame marker byte.
pub(super) const FRAME: u8 = b'F';
/// Largest raw (uncompressed) frame body a decoder accepts.
pub(super) const MAX_FRAME_RAW: usize = 1 << 30;
/// Largest unit a decoder accepts.
pub(super) const MAX_UNIT: usize = 1 << 30;
/// Largest window a decoder accepts (it allocates up to this much).
pub(super) const MAX_WINDOW: u64 = 64 << 30;

/// Unit operation tags.
pub(super) const OP_LITERAL: u8 = 0;
pub(super) const OP_REF: u8 = 1;
pub(super) const OP_DELTA: u8 = 2;

/// Delta codec tags in the header.
pub(super) const DELTA_SAMPLED: u8 = 0;
pub(super) const DELTA_ZSTD_REF: u8 = 1;
