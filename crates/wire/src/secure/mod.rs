//! The secure transport: every dedupwire connection authenticated and encrypted with one key
//! both ends share, so that a peer without the key gets nothing and learns nothing.
//!
//! [`SecureStream`] wraps any `Read + Write` and is itself `Read + Write`, so frames
//! ([`crate::Framed`]) run over it unchanged. It speaks the Noise protocol
//! `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s` (via the `snow` crate): a fresh X25519 exchange per
//! connection (forward secrecy) mixed with the shared [`Key`] as the pre-shared key, then
//! ChaCha20-Poly1305 messages whose nonces count up, so an altered, replayed, reordered or
//! dropped message fails authentication. Why Noise and not TLS 1.3: rustls has no external
//! pre-shared-key mode, and certificates would be a second thing to distribute; with Noise the
//! one shared key is the whole setup.
//!
//! On the wire (`crates/wire/FORMAT.md` has the details):
//!
//! ```text
//! client → server   "DWS" 1   len:u16 LE  handshake message 1  (-> psk, e)
//! server → client   "DWS" 1   len:u16 LE  handshake message 2  (<- e, ee)   (len 0: refused)
//! then both ways    len:u16 LE  ciphertext (≤ 65535 bytes: ≤ 65519 bytes of data + 16-byte tag)
//! ```
//!
//! The four-byte preamble is sent in the clear and bound into the handshake (the Noise
//! prologue), so a plaintext dedupwire peer or a stranger is told what is wrong instead of
//! failing obscurely: "the peer speaks plaintext dedupwire", "not a dedupwire peer". A peer with
//! another key is refused: [`crate::Error::Auth`] on both ends.
//!
//! Passphrases ([`Key::from_token`]) can be guessed offline by whoever records a handshake, at
//! the speed of BLAKE3: prefer a generated key ([`Key::generate`]).
//!
//! ```
//! use dedupwire_wire::{FrameType, Framed, Key, SecureStream};
//! use std::os::unix::net::UnixStream;
//! let key = Key::from_token("a shared passphrase, long enough");
//! let (a, b) = UnixStream::pair().unwrap();
//! let server_key = key.clone();
//! let server = std::thread::spawn(move || {
//!     let mut link = Framed::new(SecureStream::server(b, &server_key).unwrap());
//!     link.read_frame().unwrap().payload
//! });
//! let mut link = Framed::new(SecureStream::client(a, &key).unwrap());
//! link.write_frame(FrameType(0x10), b"secret").unwrap();
//! assert_eq!(server.join().unwrap(), b"secret");
//! ```

mod key;
mod stream;
#[cfg(test)]
mod tests;

pub use key::{Key, KeyError, MIN_TOKEN_LEN, TOKEN_CONTEXT};
pub use stream::SecureStream;

/// The four bytes each end of a secure connection sends first: magic `"DWS"` and the secure
/// transport version, 1.
pub const PREAMBLE: [u8; 4] = *b"DWS\x01";
/// The Noise protocol spoken.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// The largest encrypted message, its tag included (Noise's limit).
pub const MAX_MESSAGE: usize = 65535;
/// The most data one message carries.
pub const MAX_PLAINTEXT: usize = MAX_MESSAGE - TAG_LEN;

const TAG_LEN: usize = 16;
const LEN_BYTES: usize = 2;

/// What a secure end reports about a plaintext dedupwire peer.
pub(crate) const PLAINTEXT_PEER: &str =
    "the peer speaks plaintext dedupwire; start both ends with the same key (--key-file or \
     DEDUPWIRE_KEY), or both with --insecure-plaintext";
/// What a plaintext end reports about a secure peer (from the frame reader).
pub(crate) const SECURE_PEER: &str =
    "the peer speaks encrypted dedupwire; start both ends with the same key (--key-file or \
     DEDUPWIRE_KEY), or both with --insecure-plaintext";
/// What a secure server tells a plaintext client, in a plaintext error frame.
pub(crate) const REQUIRES_SECURE: &str =
    "this end accepts encrypted connections only; start both ends with the same key \
     (--key-file or DEDUPWIRE_KEY), or both with --insecure-plaintext";
