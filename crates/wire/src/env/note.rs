//! Note files: small opaque values a channel keeps between connections (what the adaptive
//! mode measured), one file per key, each replaced whole. The byte layout is in
//! `crates/wire/FORMAT.md` ("Environment notes").
//!
//! A note is advisory: one that does not verify (torn by a crash, damaged, of another
//! format version) reads as no note and is replaced by the next one kept.

use xxhash_rust::xxh3::xxh3_64;

use crate::store::MAX_NOTE_BYTES;

/// The first 8 bytes of every note file.
pub const MAGIC: [u8; 8] = *b"DWENVNOT";
/// The note format this build writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the note: magic, version, note length, checksum.
const HEAD: usize = 8 + 1 + 4 + 8;
/// The largest note file: a longer one is not read past this.
pub const MAX_FILE_BYTES: u64 = (HEAD + MAX_NOTE_BYTES) as u64;

/// The file name of the note kept under `key` (a key [`crate::store::check_note_key`] accepts).
pub fn file_name(key: &str) -> String {
    format!("note-{key}")
}

/// The file holding `note`.
pub fn encode(note: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEAD + note.len());
    b.extend_from_slice(&MAGIC);
    b.push(VERSION);
    b.extend_from_slice(&(note.len() as u32).to_le_bytes());
    b.extend_from_slice(&checksum(note).to_le_bytes());
    b.extend_from_slice(note);
    b
}

/// The note a file holds, if it verifies whole.
pub fn decode(b: &[u8]) -> Option<&[u8]> {
    if b.len() < HEAD || b[..8] != MAGIC || b[8] != VERSION {
        return None;
    }
    let len = u32::from_le_bytes(b[9..13].try_into().ok()?) as usize;
    let sum = u64::from_le_bytes(b[13..21].try_into().ok()?);
    let note = &b[HEAD..];
    (len == note.len() && len <= MAX_NOTE_BYTES && checksum(note) == sum).then_some(note)
}

fn checksum(note: &[u8]) -> u64 {
    let mut b = Vec::with_capacity(4 + note.len());
    b.extend_from_slice(&(note.len() as u32).to_le_bytes());
    b.extend_from_slice(note);
    xxh3_64(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn notes_round_trip(note in proptest::collection::vec(any::<u8>(), 0..MAX_NOTE_BYTES)) {
            let file = encode(&note);
            prop_assert_eq!(decode(&file), Some(&note[..]));
        }

        #[test]
        fn any_damage_reads_as_no_note(
            note in proptest::collection::vec(any::<u8>(), 0..64),
            at in any::<usize>(),
            bit in 0u8..8,
        ) {
            let mut b = encode(&note);
            let at = at % b.len();
            b[at] ^= 1 << bit;
            prop_assert_eq!(decode(&b), None);
            let whole = encode(&note);
            prop_assert_eq!(decode(&whole[..whole.len() - 1]), None);
        }
    }
}
