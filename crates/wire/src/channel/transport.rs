//! How [`DedupStream::connect`](super::DedupStream::connect) and
//! [`DedupListener::bind`](super::DedupListener::bind) secure their TCP connections:
//! [`Security`] says how, [`Transport`] is the stream that results.
//!
//! Encryption is the default and plaintext an explicit choice: there is no `Default` for
//! [`Security`], and the plaintext variant says what it is. Both ends must choose alike; a peer
//! without the key, or a plaintext peer of a secure end, is refused during the secure
//! handshake, before any channel frame, with a clear error on both ends.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::Result;
use crate::secure::{Key, SecureStream};

/// The longest wait for the peer's side of the handshakes (secure, then channel) in
/// `connect` and `accept`: a peer that connects and says nothing holds an accept loop only
/// this long. The socket has no read timeout once the channel is open.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How a channel's TCP connection is secured. Both ends must choose alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Security {
    /// Authenticated and encrypted with a key both ends hold ([`SecureStream`]: Noise
    /// `NNpsk0`, ChaCha20-Poly1305). A peer with another key, or none, gets nothing.
    Key(Key),
    /// Everything in the clear and unauthenticated: anyone on the path reads and alters it,
    /// and anyone who reaches the port can feed chunks into the store. Only for trusted
    /// networks or tests.
    InsecurePlaintext,
}

impl From<Key> for Security {
    fn from(key: Key) -> Security {
        Security::Key(key)
    }
}

impl Security {
    /// True unless [`Security::InsecurePlaintext`].
    pub fn is_encrypted(&self) -> bool {
        matches!(self, Security::Key(_))
    }

    /// The connecting end's transport over `tcp`, after the secure handshake if keyed.
    pub fn client(&self, tcp: TcpStream) -> Result<Transport> {
        Ok(match self {
            Security::Key(key) => Transport::Secure(SecureStream::client(tcp, key)?),
            Security::InsecurePlaintext => Transport::Plain(tcp),
        })
    }

    /// The accepting end's transport over `tcp`, after the secure handshake if keyed.
    pub fn server(&self, tcp: TcpStream) -> Result<Transport> {
        Ok(match self {
            Security::Key(key) => Transport::Secure(SecureStream::server(tcp, key)?),
            Security::InsecurePlaintext => Transport::Plain(tcp),
        })
    }
}

/// The byte stream under a channel made by `connect`/`accept`: TCP, encrypted or (when asked
/// for) not.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per connection; boxing the secure stream would only add an indirection"
)]
pub enum Transport {
    /// Plaintext TCP ([`Security::InsecurePlaintext`]).
    Plain(TcpStream),
    /// TCP with the secure transport ([`Security::Key`]).
    Secure(SecureStream<TcpStream>),
}

impl Transport {
    /// The TCP socket underneath (for its addresses, timeouts, or to shut it down from
    /// another thread through `try_clone`). Reading or writing it directly breaks the channel.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Secure(s) => s.get_ref(),
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    /// Whether the connection is encrypted and authenticated.
    pub fn is_encrypted(&self) -> bool {
        matches!(self, Transport::Secure(_))
    }
}

/// A byte stream that can tell whether a read would return without waiting (bytes, the end
/// of the stream, or an error to report), so that a channel over it serves the frames its
/// peer has sent between the application's reads and writes (see
/// [`DedupStream::look_between_calls`](super::DedupStream::look_between_calls)).
pub trait ReadReady {
    /// Whether a read would return without waiting.
    fn read_ready(&self) -> bool;
}

impl ReadReady for TcpStream {
    fn read_ready(&self) -> bool {
        if self.set_nonblocking(true).is_err() {
            return false;
        }
        let r = self.peek(&mut [0u8; 1]);
        if self.set_nonblocking(false).is_err() {
            return true;
        }
        !matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

impl ReadReady for Transport {
    fn read_ready(&self) -> bool {
        match self {
            Transport::Plain(s) => s.read_ready(),
            Transport::Secure(s) => s.has_buffered() || s.get_ref().read_ready(),
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Secure(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Secure(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Secure(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Instant;

    /// Waits up to a second for `s` to be ready.
    fn becomes_ready(s: &TcpStream) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(1) {
            if s.read_ready() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn a_socket_is_ready_with_bytes_or_at_its_end_and_stays_blocking() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        assert!(!b.read_ready(), "nothing sent yet");
        a.write_all(b"hi").unwrap();
        assert!(becomes_ready(&b));
        let mut got = [0u8; 2];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        assert!(!b.read_ready(), "everything read");
        // Still blocking: a read waits for its timeout instead of failing at once.
        b.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let t = Instant::now();
        assert!(b.read(&mut got).is_err());
        assert!(
            t.elapsed() >= Duration::from_millis(40),
            "{:?}",
            t.elapsed()
        );
        drop(a);
        assert!(becomes_ready(&b), "the end of the stream is ready");
        assert_eq!(b.read(&mut got).unwrap(), 0);
    }
}
