//! [`DedupStream`] and [`DedupListener`]: the channel's public face, a message socket.
//!
//! One thread drives both halves of an end: while `send` waits for answers it also serves
//! the peer's own messages (answers its requests, rebuilds its segments), and `recv` answers
//! the peer's questions until a whole message has arrived and been verified. So both ends may
//! send and receive on one connection. The restriction: both ends sending bulk at the same
//! moment can stall once both sockets' buffers are full of data frames neither end is
//! reading (each end writes a data frame of about 4 MiB before reading again); use one
//! connection per direction for heavy traffic both ways at once.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::ChannelConfig;
use super::link::Link;
use super::protocol::{Limits, Message, MIN_VERSION, PROTOCOL, VERSION, ZDELTA_VERSION};
use super::receiver::{Arrived, Packed, Receiver};
use super::sender::Sender;
use super::stats::ChannelStats;
use super::transport::{ReadReady, Security, Transport, HANDSHAKE_TIMEOUT};
use crate::error::{Error, Result};
use crate::frame::{FrameType, Framed};
use crate::handshake::Hello;
use crate::store::ChunkStore;

/// Which side of the handshake an end plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Proposes its configuration.
    Connect,
    /// Accepts the peer's proposal or refuses it.
    Accept,
}

/// A deduplicating message channel over a byte stream: `send` a message, `recv` one.
///
/// `send` returns once the peer has rebuilt the message and checked it against its hash;
/// `recv` returns the next message, verified. `Write` gathers bytes into one message, sent in
/// segments as they fill and ended by `flush`; `Read` reads received messages back to back,
/// each as it arrives.
pub struct DedupStream<S: Read + Write> {
    link: Link<S>,
    sender: Sender,
    receiver: Receiver,
    stats: ChannelStats,
    config: ChannelConfig,
    broken: Option<String>,
    wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    rpos: usize,
    /// Whether frames from the peer are waiting to be read (see
    /// [`DedupStream::look_between_calls`]); over a stream that cannot tell, never.
    waiting: fn(&S) -> bool,
    /// Bytes gathered or handed out since frames were last looked for.
    since_look: usize,
}

/// Bytes an application writes or reads between two looks for frames the peer has sent.
const LOOK_EVERY: usize = 256 << 10;
/// Frames served at one look, at most, before the application has its turn again.
const SERVE_AT_ONCE: usize = 64;

impl<S: Read + Write> std::fmt::Debug for DedupStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupStream")
            .field("config", &self.config.describe())
            .field("stats", &self.stats())
            .finish()
    }
}

impl DedupStream<Transport> {
    /// Connects to a [`DedupListener`] at `addr`, secured as `security` says (the listener
    /// must say the same), and agrees on `config`. A listener with another key, or a
    /// plaintext one when this end has a key (or the reverse), is refused during the secure
    /// handshake: [`Error::Auth`] for another key, [`Error::Protocol`] or [`Error::Remote`]
    /// naming the mismatch otherwise; no channel frame is exchanged.
    pub fn connect(
        addr: impl ToSocketAddrs,
        security: Security,
        store: Arc<dyn ChunkStore>,
        config: ChannelConfig,
    ) -> Result<Self> {
        config.validate()?;
        let tcp = TcpStream::connect(addr).map_err(Error::Io)?;
        tcp.set_nodelay(true).map_err(Error::Io)?;
        tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(Error::Io)?;
        let mut stream = DedupStream::new(security.client(tcp)?, store, config, Role::Connect)?;
        stream.look_between_calls();
        stream
            .get_ref()
            .tcp()
            .set_read_timeout(None)
            .map_err(Error::Io)?;
        Ok(stream)
    }
}

impl<S: Read + Write + ReadReady> DedupStream<S> {
    /// Lets the channel look, between the application's reads and writes (`Read`, `Write`),
    /// for frames the peer has sent, and serve them at once: otherwise it serves
    /// them only when it has to wait for one, and a round trip also waits for the
    /// application (for its next input, or until it took the last output). `connect` and
    /// `accept` do this; a channel made by [`DedupStream::new`] over a stream that can tell
    /// ([`ReadReady`]) should too.
    pub fn look_between_calls(&mut self) {
        self.waiting = S::read_ready;
    }
}

impl<S: Read + Write> DedupStream<S> {
    /// A channel over `stream` (a socket, a TLS or Noise stream), after the handshake.
    pub fn new(
        stream: S,
        store: Arc<dyn ChunkStore>,
        config: ChannelConfig,
        role: Role,
    ) -> Result<Self> {
        config.validate()?;
        let mut framed = Framed::new(stream);
        let hello = Hello::new(PROTOCOL, MIN_VERSION..=VERSION);
        let mut rtt = None;
        let version;
        let agreed = match role {
            Role::Connect => {
                let ours = config.encode();
                let asked = Instant::now();
                framed.send_hello(&hello.clone().with_data(ours.clone()))?;
                let answer = framed.recv_hello(&hello)?;
                rtt = Some(asked.elapsed());
                version = answer.version;
                if answer.peer.data != ours {
                    let e = Error::Config(
                        "the listening end answered with another configuration than the one \
                         proposed"
                            .into(),
                    );
                    let _ = framed.send_error(&e.to_string());
                    return Err(e);
                }
                config
            }
            Role::Accept => {
                let proposal = framed.recv_hello(&hello).inspect_err(|e| {
                    if matches!(e, Error::Protocol(m) if m == crate::secure::SECURE_PEER) {
                        // Its opening bytes tell a secure client this end speaks plaintext.
                        let _ = framed.send_error(&e.to_string());
                    }
                })?;
                version = proposal.version;
                match config.accept(&proposal.peer.data) {
                    Ok(agreed) => {
                        framed.send_hello(&hello.with_data(agreed.encode()))?;
                        agreed
                    }
                    Err(e) => {
                        let _ = framed.send_error(&format!(
                            "the listening end refuses the proposed configuration: {e}"
                        ));
                        return Err(e);
                    }
                }
            }
        };
        let limits = Limits {
            id_len: agreed.identifier.id_len(),
            max_segment: agreed.segment_size,
        };
        let mut sender = Sender::new(agreed.clone(), store.clone());
        sender.zdelta = version >= ZDELTA_VERSION;
        if let Some(rtt) = rtt {
            sender.adaptive.round_trip(rtt);
        }
        Ok(DedupStream {
            link: Link::new(framed, limits),
            sender,
            receiver: Receiver::new(agreed.clone(), store),
            stats: ChannelStats::default(),
            config: agreed,
            broken: None,
            wbuf: Vec::new(),
            rbuf: Vec::new(),
            rpos: 0,
            waiting: |_| false,
            since_look: 0,
        })
    }

    /// The configuration both ends agreed on.
    pub fn config(&self) -> &ChannelConfig {
        &self.config
    }

    /// What this end has moved so far.
    pub fn stats(&self) -> ChannelStats {
        let mut s = self.stats.clone();
        s.socket_bytes_sent = self.link.framed.bytes_written();
        s.socket_bytes_received = self.link.framed.bytes_read();
        s
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &S {
        self.link.framed.get_ref()
    }

    /// Sends `msg` as one message; returns once the peer has rebuilt and verified it.
    pub fn send(&mut self, msg: &[u8]) -> Result<()> {
        let t = Instant::now();
        self.check()?;
        if !self.wbuf.is_empty() || self.sender.open() {
            return Err(Error::Protocol(
                "a message written through io::Write is still open: flush it before send".into(),
            ));
        }
        let r = self.push(msg, true).and_then(|_| self.settle());
        self.stats.send_time += t.elapsed();
        r?;
        self.stats.messages_sent += 1;
        self.stats.message_bytes_sent += msg.len() as u64;
        Ok(())
    }

    /// Sends `msg` as one message of bytes the peer cannot hold (a delta, fresh data):
    /// compressed, without asking which of its chunks the peer holds (no round trips) and
    /// without either end keeping them. Returns once the peer has rebuilt and verified it.
    pub fn send_new(&mut self, msg: &[u8]) -> Result<()> {
        self.sender.new_bytes = true;
        let r = self.send(msg);
        self.sender.new_bytes = false;
        r
    }

    /// The next message from the peer, verified end to end. A peer that closed between
    /// messages is [`Error::PeerClosed`] with `mid_frame: false`.
    pub fn recv(&mut self) -> Result<Vec<u8>> {
        let t = Instant::now();
        let r = (|| loop {
            if matches!(self.receiver.done.front(), Some(Arrived::Rest(_)))
                || (self.receiver.done.is_empty() && self.receiver.streaming())
            {
                return Err(Error::Protocol(
                    "the message under way was partly read through io::Read: read it there".into(),
                ));
            }
            if let Some(Arrived::Message(m)) = self.receiver.done.pop_front() {
                return Ok(m);
            }
            self.pump()?;
        })();
        self.stats.recv_time += t.elapsed();
        r
    }

    /// Finishes what is in flight, keeps what the adaptive mode measured in the store for the
    /// next connection, says goodbye and drops the connection.
    pub fn close(mut self) -> Result<()> {
        self.flush_message()?;
        self.settle()?;
        self.sender.keep_prior();
        self.link.close()
    }

    /// Sends segments from `data`: every full segment, and the rest too when `last`.
    fn push(&mut self, data: &[u8], last: bool) -> Result<usize> {
        let mut pos = 0;
        loop {
            let rest = &data[pos..];
            if !last && rest.len() < self.sender.next_cap() {
                return Ok(pos);
            }
            let spent = self.spent();
            while self.sender.needs_room() {
                self.pump()?;
            }
            pos += self
                .sender
                .emit(&mut self.link, &mut self.stats, rest, last)
                .map_err(|e| self.broke(e))?;
            self.account(spent);
            if last && pos == data.len() {
                return Ok(pos);
            }
        }
    }

    /// Serves the peer until every segment sent has been acknowledged.
    fn settle(&mut self) -> Result<()> {
        let t = Instant::now();
        while !self.sender.idle() {
            self.pump()?;
        }
        // Waiting for the last answers and acknowledgements is every message's latency (round
        // trips, the receiver's last segment), not a sign of a slow link: only a full window
        // (in `push`) and blocked writes are.
        self.sender.adaptive.account(t.elapsed(), Duration::ZERO);
        Ok(())
    }

    /// Where the clock and the link's read and write waits stand, to [`Self::account`] for
    /// the time since.
    fn spent(&self) -> (Instant, Duration) {
        (Instant::now(), self.link.read_time + self.link.write_time)
    }

    /// Tells the adaptive mode how much of the sender's time since `spent` went to waiting
    /// for the other end.
    fn account(&mut self, (t, waits): (Instant, Duration)) {
        let down = (self.link.read_time + self.link.write_time).saturating_sub(waits);
        self.sender.adaptive.account(t.elapsed(), down);
    }

    fn check(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::Protocol(format!(
                "the channel stopped after an earlier error: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn broke(&mut self, e: Error) -> Error {
        self.broken = Some(e.to_string());
        self.link.fail(e)
    }

    /// Serves the frames the peer has sent already (answers to this end's requests, its
    /// acknowledgements, its own requests) without waiting for more. Called between an
    /// application's reads and writes, so that a round trip does not also wait for the
    /// application: Django's tar streamed in dedup mode through `Write` and `Read`, each end
    /// serving frames only when it had to wait for one, left each request 20-60 ms
    /// unanswered while the sender read its input and the receiver wrote its output.
    ///
    /// It serves them while `expecting` (this end awaits answers, or the rest of a message):
    /// a frame read past that could be the peer's goodbye, which is the application's to see
    /// at its next call.
    fn serve_waiting(&mut self, expecting: fn(&Self) -> bool) -> Result<()> {
        self.since_look = 0;
        for _ in 0..SERVE_AT_ONCE {
            if !expecting(self) || !(self.waiting)(self.link.framed.get_ref()) {
                break;
            }
            self.pump()?;
        }
        Ok(())
    }

    /// Reads one frame and acts on it.
    fn pump(&mut self) -> Result<()> {
        self.check()?;
        self.pump_one().map_err(|e| self.broke(e))
    }

    /// Whether a message is under way in either direction: the peer leaving now cuts it off.
    fn unfinished(&self) -> bool {
        self.receiver.mid_message() || !self.sender.idle()
    }

    fn pump_one(&mut self) -> Result<()> {
        // The connection ending between frames is an orderly end only between messages, as
        // for a goodbye: a reader through `Read` took it for the end of the stream and missed
        // the rest of the message.
        let frame = self.link.read().map_err(|e| match e {
            Error::PeerClosed { offset, mid_frame } => Error::PeerClosed {
                offset,
                mid_frame: mid_frame || self.unfinished(),
            },
            e => e,
        })?;
        match frame.kind {
            FrameType::CLOSE => {
                return Err(Error::PeerClosed {
                    offset: self.link.framed.bytes_read(),
                    mid_frame: self.unfinished(),
                })
            }
            FrameType::PING => {
                return self
                    .link
                    .framed
                    .write_frame(FrameType::PONG, &frame.payload)
            }
            FrameType::PONG => return Ok(()),
            _ => {}
        }
        let Some(m) = Message::decode(frame.kind, &frame.payload, &self.link.limits)? else {
            return Err(Error::Protocol(format!(
                "unexpected frame of type {} on a channel",
                frame.kind
            )));
        };
        let (link, stats) = (&mut self.link, &mut self.stats);
        let started = Instant::now();
        let for_receiver = match m {
            Message::Request { seg, .. }
            | Message::Data { seg, .. }
            | Message::Plain { seg, .. }
            | Message::Raw { seg, .. } => Some(seg),
            _ => None,
        };
        self.receiver.frame_started = for_receiver.map(|_| started);
        let r = match m {
            Message::Request {
                seg,
                level,
                end,
                chunks,
            } => self
                .receiver
                .on_request(link, stats, seg, level, end, &chunks),
            Message::Data {
                seg,
                method,
                raw_len,
                body,
            } => self.receiver.on_data(
                link,
                stats,
                seg,
                Packed {
                    method,
                    raw_len,
                    body: &body,
                },
            ),
            Message::Plain {
                seg,
                end,
                keep,
                method,
                raw_len,
                body,
            } => self.receiver.on_plain(
                link,
                stats,
                seg,
                (end, keep),
                Packed {
                    method,
                    raw_len,
                    body: &body,
                },
            ),
            Message::Raw {
                seg,
                level,
                index,
                bytes,
            } => self.receiver.on_raw(link, stats, seg, level, index, &bytes),
            Message::Have { seg, level, bits } => {
                self.sender.on_have(link, stats, seg, level, &bits)
            }
            Message::Need { seg, wants } => self.sender.on_need(link, stats, seg, &wants),
            Message::Ack { seg, busy_us } => self.sender.on_ack(stats, seg, busy_us),
        };
        if let Some(seg) = for_receiver {
            self.receiver.charge(seg, started.elapsed());
            self.receiver.frame_started = None;
        }
        r
    }

    /// Adds `buf` to the message gathered through `Write`, sending the segments it fills.
    pub(crate) fn gather(&mut self, buf: &[u8]) -> Result<()> {
        self.check()?;
        self.wbuf.extend_from_slice(buf);
        self.stats.message_bytes_sent += buf.len() as u64;
        self.since_look += buf.len();
        if self.since_look >= LOOK_EVERY && !self.sender.idle() {
            let (t, spent) = (Instant::now(), self.spent());
            let r = self.serve_waiting(|s| !s.sender.idle());
            self.account(spent);
            self.stats.send_time += t.elapsed();
            r?;
        }
        if self.wbuf.len() >= self.sender.next_cap() {
            let pending = std::mem::take(&mut self.wbuf);
            let t = Instant::now();
            let r = self.push(&pending, false);
            self.stats.send_time += t.elapsed();
            let used = r?;
            self.wbuf = pending;
            self.wbuf.drain(..used);
        }
        Ok(())
    }

    /// Ends the message gathered through `Write`, if one is open.
    pub(crate) fn flush_message(&mut self) -> Result<()> {
        if self.wbuf.is_empty() && !self.sender.open() {
            return Ok(());
        }
        let t = Instant::now();
        let buf = std::mem::take(&mut self.wbuf);
        let r = self.push(&buf, true).and_then(|_| self.settle());
        self.stats.send_time += t.elapsed();
        r?;
        self.stats.messages_sent += 1;
        Ok(())
    }
}

pub(crate) fn to_io(e: Error) -> io::Error {
    match e {
        Error::Io(e) => e,
        Error::PeerClosed { .. } => io::Error::new(io::ErrorKind::BrokenPipe, e),
        e => io::Error::other(e),
    }
}

impl<S: Read + Write> Write for DedupStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.gather(buf).map_err(to_io)?;
        Ok(buf.len())
    }

    /// Ends the message: what was written since the last flush is one message.
    fn flush(&mut self) -> io::Result<()> {
        self.flush_message().map_err(to_io)
    }
}

impl<S: Read + Write> Read for DedupStream<S> {
    /// Reads received messages back to back, each segment as soon as it and those before it
    /// are rebuilt (every chunk checked against its id), so a long message streams; a message
    /// that does not match its hash at its end is an error there. End of stream when the peer
    /// has closed between messages.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.rpos == self.rbuf.len() {
            let next = match self.receiver.done.pop_front() {
                Some(Arrived::Message(m) | Arrived::Rest(m)) => Some(m),
                None => self.receiver.take_ready(),
            };
            if let Some(m) = next {
                let read = std::mem::replace(&mut self.rbuf, m);
                self.receiver.recycle(read);
                self.rpos = 0;
                continue;
            }
            let t = Instant::now();
            let r = self.pump();
            self.stats.recv_time += t.elapsed();
            match r {
                Ok(()) => {}
                Err(Error::PeerClosed {
                    mid_frame: false, ..
                }) => return Ok(0),
                Err(e) => return Err(to_io(e)),
            }
        }
        let n = buf.len().min(self.rbuf.len() - self.rpos);
        buf[..n].copy_from_slice(&self.rbuf[self.rpos..self.rpos + n]);
        self.rpos += n;
        self.since_look += n;
        if self.since_look >= LOOK_EVERY && self.receiver.mid_message() {
            let t = Instant::now();
            // An error here is kept (the channel is broken) and reported once the bytes
            // already rebuilt have been read.
            let _ = self.serve_waiting(|s| s.receiver.mid_message());
            self.stats.recv_time += t.elapsed();
        }
        Ok(n)
    }
}

/// Accepts dedup channels on a TCP port, all sharing one chunk store and secured alike.
pub struct DedupListener {
    listener: TcpListener,
    security: Security,
    store: Arc<dyn ChunkStore>,
    config: ChannelConfig,
}

impl std::fmt::Debug for DedupListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupListener")
            .field("listener", &self.listener)
            .field("security", &self.security)
            .field("config", &self.config.describe())
            .finish()
    }
}

impl DedupListener {
    /// Listens on `addr`; accepted channels are secured as `security` says (peers must
    /// connect with the same), use `store` and agree on `config`.
    pub fn bind(
        addr: impl ToSocketAddrs,
        security: Security,
        store: Arc<dyn ChunkStore>,
        config: ChannelConfig,
    ) -> Result<DedupListener> {
        config.validate()?;
        Ok(DedupListener {
            listener: TcpListener::bind(addr).map_err(Error::Io)?,
            security,
            store,
            config,
        })
    }

    /// How accepted connections are secured.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// The address it listens on (to learn the port after binding port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(Error::Io)
    }

    /// The next connection, after the handshakes (secure, then channel). A peer refused by
    /// either is an error here (and there): [`Error::Auth`] for a peer with another key; keep
    /// accepting after it.
    pub fn accept(&self) -> Result<DedupStream<Transport>> {
        let (tcp, _) = self.listener.accept().map_err(Error::Io)?;
        tcp.set_nodelay(true).map_err(Error::Io)?;
        tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(Error::Io)?;
        let mut stream = DedupStream::new(
            self.security.server(tcp)?,
            self.store.clone(),
            self.config.clone(),
            Role::Accept,
        )?;
        stream.look_between_calls();
        stream
            .get_ref()
            .tcp()
            .set_read_timeout(None)
            .map_err(Error::Io)?;
        Ok(stream)
    }
}
