//! The `--key-file` / `--insecure-plaintext` options of the commands that open connections,
//! and the secure (or, when asked for, plaintext) stream they put on a TCP connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use dedupwire_wire::{Key, SecureStream};

/// The environment variable holding the shared key (or passphrase) when `--key-file` is absent.
pub const KEY_ENV: &str = "DEDUPWIRE_KEY";

/// The longest wait for the peer's side of the secure handshake: a peer that connects and says
/// nothing holds a serial receiver only this long, not the whole session timeout.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection the replication runs over: secure or plaintext.
pub trait Conn: Read + Write {}

impl<T: Read + Write> Conn for T {}

/// How a connection is secured.
#[derive(clap::Args, Debug, Clone)]
pub struct KeyArgs {
    /// The key shared by both ends: a file holding 64 hexadecimal digits (from `dedupwire key
    /// generate`) or a passphrase of 16+ characters [default: $DEDUPWIRE_KEY, same format].
    #[arg(long, value_name = "PATH")]
    key_file: Option<PathBuf>,
    /// Send everything in the clear, unauthenticated: both ends must say so.
    #[arg(long, conflicts_with = "key_file")]
    insecure_plaintext: bool,
}

impl KeyArgs {
    /// The key to use, `None` for an explicitly plaintext connection, or why there is none.
    pub fn key(&self) -> Result<Option<Key>> {
        let env = std::env::var(KEY_ENV).ok();
        if self.insecure_plaintext {
            if env.is_some() {
                bail!("--insecure-plaintext while {KEY_ENV} is set: unset one of them");
            }
            return Ok(None);
        }
        if let Some(path) = &self.key_file {
            return Ok(Some(Key::load(path)?));
        }
        match env {
            Some(text) => Ok(Some(Key::from_text(&text, KEY_ENV)?)),
            None => bail!(
                "no key for the connection: create one with `dedupwire key generate KEYFILE`, \
                 copy KEYFILE to both ends and pass `--key-file KEYFILE` to both (or set \
                 {KEY_ENV} to the same key or passphrase on both); `--insecure-plaintext` on \
                 both ends sends everything unencrypted instead"
            ),
        }
    }
}

/// The connecting end's stream over `stream`: the secure handshake when there is a key.
pub fn client(stream: TcpStream, key: Option<&Key>) -> Result<Box<dyn Conn>> {
    secure(stream, key, SecureStream::client)
}

/// The accepting end's stream over `stream`: the secure handshake when there is a key.
pub fn server(stream: TcpStream, key: Option<&Key>) -> Result<Box<dyn Conn>> {
    secure(stream, key, SecureStream::server)
}

/// Runs `handshake` under [`HANDSHAKE_TIMEOUT`], then restores the stream's read timeout.
fn secure(
    stream: TcpStream,
    key: Option<&Key>,
    handshake: fn(TcpStream, &Key) -> dedupwire_wire::Result<SecureStream<TcpStream>>,
) -> Result<Box<dyn Conn>> {
    let Some(key) = key else {
        return Ok(Box::new(stream));
    };
    let timeout = stream.read_timeout()?;
    stream.set_read_timeout(Some(
        timeout.map_or(HANDSHAKE_TIMEOUT, |t| t.min(HANDSHAKE_TIMEOUT)),
    ))?;
    let link = handshake(stream, key).context("secure handshake failed")?;
    link.get_ref().set_read_timeout(timeout)?;
    Ok(Box::new(link))
}
