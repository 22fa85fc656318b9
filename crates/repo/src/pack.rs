//! Packs: blobs grouped into compressed, sealed frames, with a sealed trailer that lists them
//! (so that an index can be rebuilt from the packs alone).
//!
//! ```text
//! pack    = frame* trailer trailer_len:u32le
//! frame   = sealed(zstd(blob bytes, concatenated))
//! trailer = sealed(zstd(JSON PackTrailer))
//! ```

use serde::{Deserialize, Serialize};

use crate::blob::{BlobId, BlobKind};
use crate::crypto::MasterKey;

/// A blob's place in its pack: which frame, and where in the frame's plaintext.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobEntry {
    /// The blob's id.
    pub id: BlobId,
    /// What it holds.
    pub kind: BlobKind,
    /// Its frame (index into the pack's frames).
    pub frame: u32,
    /// Offset in the frame's plaintext.
    pub offset: u32,
    /// Length in the frame's plaintext.
    pub length: u32,
    /// For a delta: the whole chunk it applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BlobId>,
    /// For a whole chunk: its super-features, so that later backups find it as a base.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<u64>,
}

/// A frame's place in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameEntry {
    /// Offset of its sealed bytes in the pack.
    pub offset: u64,
    /// Length of its sealed bytes.
    pub length: u32,
    /// Length of its plaintext (the blobs) once decompressed.
    pub raw_length: u32,
}

/// What a pack holds: its frames and its blobs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackTrailer {
    /// The format version (1).
    pub version: u32,
    /// The frames, in order.
    pub frames: Vec<FrameEntry>,
    /// The blobs, in order.
    pub blobs: Vec<BlobEntry>,
}

/// The pack format's version.
pub const PACK_VERSION: u32 = 1;

/// Builds one pack in memory: blobs are added to the open frame, which is handed to a worker
/// thread to compress and seal when it reaches the frame size, while blobs go on arriving;
/// [`finish`](PackBuilder::finish) waits for the frames and lays them out in order.
pub struct PackBuilder {
    /// Frames being compressed and sealed, in order, with their plaintext lengths.
    sealing: Vec<(std::sync::mpsc::Receiver<Vec<u8>>, u32)>,
    /// Plaintext bytes of the frames handed off.
    handed: usize,
    frame: Vec<u8>,
    trailer: PackTrailer,
    frame_size: usize,
    zstd_level: i32,
}

impl PackBuilder {
    /// An empty pack whose frames hold about `frame_size` bytes of blobs each.
    pub fn new(frame_size: usize, zstd_level: i32) -> PackBuilder {
        PackBuilder {
            sealing: Vec::new(),
            handed: 0,
            frame: Vec::new(),
            trailer: PackTrailer {
                version: PACK_VERSION,
                ..PackTrailer::default()
            },
            frame_size,
            zstd_level,
        }
    }

    /// Adds a blob (`entry`'s frame, offset and length are set here).
    pub fn add(&mut self, key: &MasterKey, mut entry: BlobEntry, bytes: &[u8]) {
        entry.frame = self.sealing.len() as u32;
        entry.offset = self.frame.len() as u32;
        entry.length = bytes.len() as u32;
        self.frame.extend_from_slice(bytes);
        self.trailer.blobs.push(entry);
        if self.frame.len() >= self.frame_size {
            self.seal_frame(key);
        }
    }

    /// Blob bytes so far (before compression).
    pub fn size(&self) -> usize {
        self.handed + self.frame.len()
    }

    /// Whether no blob was added.
    pub fn is_empty(&self) -> bool {
        self.trailer.blobs.is_empty()
    }

    fn seal_frame(&mut self, key: &MasterKey) {
        if self.frame.is_empty() {
            return;
        }
        let frame = std::mem::take(&mut self.frame);
        let raw = frame.len() as u32;
        self.handed += frame.len();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (key, level) = (key.clone(), self.zstd_level);
        rayon::spawn(move || {
            let packed = zstd::bulk::compress(&frame, level).expect("zstd compresses");
            let _ = tx.send(key.seal(&packed));
        });
        self.sealing.push((rx, raw));
    }

    /// The pack's bytes and what it holds.
    pub fn finish(mut self, key: &MasterKey) -> (Vec<u8>, PackTrailer) {
        self.seal_frame(key);
        let mut bytes = Vec::new();
        for (rx, raw_length) in std::mem::take(&mut self.sealing) {
            let sealed = rx.recv().expect("a frame's worker sends it");
            self.trailer.frames.push(FrameEntry {
                offset: bytes.len() as u64,
                length: sealed.len() as u32,
                raw_length,
            });
            bytes.extend_from_slice(&sealed);
        }
        let json = serde_json::to_vec(&self.trailer).expect("serializable");
        let sealed = key.seal(&zstd::bulk::compress(&json, 3).expect("zstd compresses"));
        bytes.extend_from_slice(&sealed);
        bytes.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
        (bytes, self.trailer)
    }
}

/// The most plaintext a frame or trailer may claim (a damaged length must not allocate more).
pub const MAX_FRAME: usize = 256 << 20;

/// Opens one sealed frame: its blobs' bytes.
pub fn open_frame(
    key: &MasterKey,
    sealed: &[u8],
    raw_length: u32,
    what: &str,
) -> Result<Vec<u8>, String> {
    let packed = key.open(sealed, what).map_err(|e| e.to_string())?;
    let limit = (raw_length as usize).min(MAX_FRAME);
    let plain = zstd::bulk::decompress(&packed, limit)
        .map_err(|e| format!("{what}: does not decompress: {e}"))?;
    if plain.len() != raw_length as usize {
        return Err(format!(
            "{what}: decompresses to {} bytes, its index says {raw_length}",
            plain.len()
        ));
    }
    Ok(plain)
}

/// Reads a whole pack's trailer.
pub fn read_trailer(key: &MasterKey, pack: &[u8], what: &str) -> Result<PackTrailer, String> {
    let Some(len_at) = pack.len().checked_sub(4) else {
        return Err(format!("{what}: too short to be a pack"));
    };
    let len = u32::from_le_bytes(pack[len_at..].try_into().expect("4 bytes")) as usize;
    let Some(start) = len_at.checked_sub(len) else {
        return Err(format!("{what}: its trailer length is past its start"));
    };
    let packed = key
        .open(&pack[start..len_at], &format!("{what} trailer"))
        .map_err(|e| e.to_string())?;
    let json = zstd::bulk::decompress(&packed, MAX_FRAME)
        .map_err(|e| format!("{what}: trailer does not decompress: {e}"))?;
    let trailer: PackTrailer = serde_json::from_slice(&json)
        .map_err(|e| format!("{what}: trailer is not readable: {e}"))?;
    if trailer.version != PACK_VERSION {
        return Err(format!(
            "{what}: pack version {} (this dedupwire reads {PACK_VERSION})",
            trailer.version
        ));
    }
    Ok(trailer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of the key-file test vector in `crypto.rs` (password `dedupwire test vector`).
    fn vector_key() -> MasterKey {
        let file = serde_json::json!({
            "version": 1,
            "kdf": {"algorithm": "argon2id", "m_cost": 64, "t_cost": 1, "p_cost": 1,
                    "salt": "101112131415161718191a1b1c1d1e1f"},
            "created": "2026-01-01T00:00:00Z", "host": "vector-host", "user": "vector-user",
            "data": "606162636465666768696a6b6c6d6e6f7071727374757677356bb684421e69f62be63a9338cc30961923a00a274258e5974fa7c8ff9dfca0264aa26af3b60cd65a2e319f781af8597f36757c7e2bd18316816ae10ade1dbc8c4458f88605fab33684c343ca2f54b2"
        });
        MasterKey::unwrap(file.to_string().as_bytes(), b"dedupwire test vector").unwrap()
    }

    fn entry(n: u8, kind: BlobKind) -> BlobEntry {
        BlobEntry {
            id: BlobId([n; 32]),
            kind,
            frame: 0,
            offset: 0,
            length: 0,
            base: (kind == BlobKind::Delta).then_some(BlobId([1; 32])),
            features: if kind == BlobKind::Data {
                vec![7, 8, 9]
            } else {
                Vec::new()
            },
        }
    }

    /// A pack of two blobs sealed with the vector key (format version 1), frozen.
    const PACK_VECTOR: &str = "03cae53bd329cbcda94ec94df3b61876869851d8a98476c1d02c9fddf10df0352e19907a4379045cbd3db2a8\
                               5e3b9cf2798412dddddf3d0e45fc7a77c58f8ee243336493b786615cbd92df5f4ea9316dfaf098cabd7fde76\
                               ddef9e514a2628d84ecf32aad030e959845ca4ae44d335ae794cdc372236df5f0cd85615c747f55ab7424d77\
                               b7ac345539f8a4a2f05e85f9ef851e62560447db4d95cc8ec5e29ac28bc120df311025ad20a179d49e7d239a\
                               54e4f33ee29154d35e4d7e4176c32029dc7d97aaeb445891bd5d1c2c1a3943c1fd779c5b9969fd9c9fc32f2c\
                               8bf12f30df8374ee458dd575dec6d2104e3749f4befc2793045d3b0aea775bbb977a770412dbba000000";

    #[test]
    fn the_frozen_pack_still_reads() {
        let key = vector_key();
        let pack = hex::decode(PACK_VECTOR.replace(char::is_whitespace, "")).unwrap();
        let t = read_trailer(&key, &pack, "vector").unwrap();
        assert_eq!(t.version, 1);
        assert_eq!(t.frames.len(), 1);
        assert_eq!(t.blobs.len(), 2);
        assert_eq!(
            (t.blobs[0].kind, t.blobs[1].kind),
            (BlobKind::Data, BlobKind::Delta)
        );
        assert_eq!(t.blobs[0].features, [7, 8, 9]);
        assert_eq!(t.blobs[1].base, Some(BlobId([1; 32])));
        let f = t.frames[0];
        let plain = open_frame(
            &key,
            &pack[f.offset as usize..(f.offset + u64::from(f.length)) as usize],
            f.raw_length,
            "vector frame",
        )
        .unwrap();
        assert_eq!(plain, b"whole chunk bytes\x00delta");
    }

    #[test]
    fn a_pack_round_trips_and_damage_is_an_error() {
        let key = MasterKey::generate();
        let mut b = PackBuilder::new(1000, 3);
        let blobs: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        for (i, blob) in blobs.iter().enumerate() {
            b.add(&key, entry(i as u8, BlobKind::Data), blob);
        }
        let (pack, trailer) = b.finish(&key);
        assert_eq!(read_trailer(&key, &pack, "p").unwrap(), trailer);
        assert!(trailer.frames.len() > 3);
        for (e, blob) in trailer.blobs.iter().zip(&blobs) {
            let f = trailer.frames[e.frame as usize];
            let sealed = &pack[f.offset as usize..(f.offset + u64::from(f.length)) as usize];
            let plain = open_frame(&key, sealed, f.raw_length, "f").unwrap();
            assert_eq!(
                &plain[e.offset as usize..(e.offset + e.length) as usize],
                &blob[..]
            );
        }
        for at in (0..pack.len()).step_by(7) {
            let mut bad = pack.clone();
            bad[at] ^= 1;
            let trailer_ok = read_trailer(&key, &bad, "p").is_ok_and(|t| t == trailer);
            let frames_ok = trailer.frames.iter().all(|f| {
                let s = &bad[f.offset as usize..(f.offset + u64::from(f.length)) as usize];
                open_frame(&key, s, f.raw_length, "f").is_ok()
            });
            assert!(
                !(trailer_ok && frames_ok),
                "a flipped byte at {at} went unnoticed"
            );
        }
        assert!(read_trailer(&key, &pack[..3], "p").is_err());
        assert!(open_frame(&key, b"short", 10, "f").is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_are_an_error_not_a_panic(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            raw in 0u32..1_000_000,
        ) {
            let key = MasterKey::generate();
            let _ = read_trailer(&key, &data, "p");
            let _ = open_frame(&key, &data, raw, "f");
        }
    }
}
