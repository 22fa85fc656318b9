//! [`AsyncDedupStream`]: the channel for tokio (feature `tokio`).
//!
//! The channel is blocking by design (one thread drives both halves of an end), so the async
//! face runs a [`DedupStream`] on a dedicated thread of its own and talks to it over channels:
//! each call is a command, answered when the thread has done it. Nothing blocks the runtime's
//! threads, and the channel behaves exactly as the blocking one, errors included.
//!
//! Calls run one at a time, in the order issued. `recv` (and `AsyncRead`) is cancel-safe: a
//! `recv` whose future is dropped keeps waiting on the thread, and the message it gets is the
//! one the next `recv` or read returns; calls issued meanwhile wait behind it. A `send` whose
//! future is dropped still completes on the thread, its result unseen.
//!
//! Dropping an `AsyncDedupStream` ends its thread: at once when idle; for a stream from
//! [`AsyncDedupStream::connect`] or over a [`Transport`] also when an operation still waits
//! for the peer, by shutting the socket down (the peer sees the connection end, as when a
//! blocking stream is dropped). Over another stream (made with [`AsyncDedupStream::new`]) such
//! an operation ends when the peer answers or goes away.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use dedupwire_wire::{AsyncDedupStream, ChannelConfig, DedupListener, Key, MemoryStore, Security};
//! let key = Security::Key(Key::from_token("a passphrase both ends share"));
//! let listener = DedupListener::bind("127.0.0.1:0", key.clone(), Arc::new(MemoryStore::new()),
//!     ChannelConfig::default()).unwrap();
//! let addr = listener.local_addr().unwrap();
//! std::thread::spawn(move || {
//!     let mut s = listener.accept().unwrap();
//!     let m = s.recv().unwrap();
//!     s.send(&m).unwrap();
//! });
//! let mut s = AsyncDedupStream::connect(addr, key, Arc::new(MemoryStore::new()),
//!     ChannelConfig::default()).await.unwrap();
//! s.send(b"hello, async channel".to_vec()).await.unwrap();
//! assert_eq!(s.recv().await.unwrap(), b"hello, async channel");
//! # });
//! ```

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, oneshot};

use super::config::ChannelConfig;
use super::stats::ChannelStats;
use super::stream::{to_io, DedupStream};
use super::transport::{Security, Transport};
use crate::error::{Error, Result};
use crate::store::ChunkStore;

/// Bytes gathered through `AsyncWrite` before they go to the thread (which sends the
/// segments they fill); the next write waits until the thread has taken them.
const WRITE_BATCH: usize = 4 << 20;

type Reply<T> = oneshot::Sender<Result<T>>;

enum Command {
    Send(Vec<u8>, Reply<()>),
    Recv(Reply<Vec<u8>>),
    /// Bytes of the message gathered through `AsyncWrite`.
    Write(Vec<u8>, Reply<()>),
    /// The last bytes of that message, and its end.
    Flush(Vec<u8>, Reply<()>),
    Stats(oneshot::Sender<ChannelStats>),
    Close(Vec<u8>, Reply<()>),
}

/// A [`DedupStream`] for async code: `send`, `recv` and `close` as futures, and tokio's
/// `AsyncRead` (received messages back to back, end of stream when the peer closes) and
/// `AsyncWrite` (bytes written are gathered into one message, sent by `flush`; `shutdown`
/// ends it and closes the channel, which has no half-close).
pub struct AsyncDedupStream {
    commands: mpsc::UnboundedSender<Command>,
    config: ChannelConfig,
    peer: Option<SocketAddr>,
    encrypted: bool,
    /// Cuts the connection under an operation still waiting when this is dropped.
    shutdown: Option<Box<dyn FnOnce() + Send + Sync>>,
    /// A `recv` (or read) handed to the thread and not yet taken.
    recv: Option<oneshot::Receiver<Result<Vec<u8>>>>,
    /// Received bytes not yet read: `rbuf[rpos..]`.
    rbuf: Vec<u8>,
    rpos: usize,
    eof: bool,
    /// Bytes written and not yet handed to the thread.
    wbuf: Vec<u8>,
    /// Whether a message is open (bytes written since the last flush).
    writing: bool,
    /// A `Write` or `Flush` handed to the thread and not yet answered, and whether a flush.
    write: Option<(oneshot::Receiver<Result<()>>, bool)>,
    closed: bool,
}

impl std::fmt::Debug for AsyncDedupStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncDedupStream")
            .field("config", &self.config.describe())
            .field("peer", &self.peer)
            .field("encrypted", &self.encrypted)
            .finish_non_exhaustive()
    }
}

fn stopped() -> Error {
    Error::Io(io::Error::other(
        "the dedup stream's thread has stopped (it panicked)",
    ))
}

fn closed() -> Error {
    Error::Protocol("the stream is closed".into())
}

impl AsyncDedupStream {
    /// Runs `stream` on a thread of its own.
    pub fn new<S: Read + Write + Send + 'static>(stream: DedupStream<S>) -> AsyncDedupStream {
        AsyncDedupStream::start(stream, None, None, false)
    }

    /// [`DedupStream::connect`] without blocking the caller: connects on the stream's own
    /// thread.
    pub async fn connect(
        addr: impl ToSocketAddrs + Send + 'static,
        security: Security,
        store: Arc<dyn ChunkStore>,
        config: ChannelConfig,
    ) -> Result<AsyncDedupStream> {
        let (tx, rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("dedupwire-connect".into())
            .spawn(move || {
                let _ = tx.send(DedupStream::connect(addr, security, store, config));
            })
            .map_err(Error::Io)?;
        Ok(AsyncDedupStream::from(rx.await.map_err(|_| stopped())??))
    }

    fn start<S: Read + Write + Send + 'static>(
        stream: DedupStream<S>,
        shutdown: Option<Box<dyn FnOnce() + Send + Sync>>,
        peer: Option<SocketAddr>,
        encrypted: bool,
    ) -> AsyncDedupStream {
        let config = stream.config().clone();
        let (commands, rx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("dedupwire-stream".into())
            .spawn(move || serve(stream, rx))
            .expect("cannot start the dedup stream's thread");
        AsyncDedupStream {
            commands,
            config,
            peer,
            encrypted,
            shutdown,
            recv: None,
            rbuf: Vec::new(),
            rpos: 0,
            eof: false,
            wbuf: Vec::new(),
            writing: false,
            write: None,
            closed: false,
        }
    }

    /// The configuration both ends agreed on.
    pub fn config(&self) -> &ChannelConfig {
        &self.config
    }

    /// The peer's address, for a stream over TCP.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Whether the connection is encrypted (false for a stream made with [`Self::new`]: its
    /// stream is not known).
    pub fn is_encrypted(&self) -> bool {
        self.encrypted
    }

    fn command<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<oneshot::Receiver<Result<T>>> {
        if self.closed {
            return Err(closed());
        }
        let (tx, rx) = oneshot::channel();
        self.commands.send(make(tx)).map_err(|_| stopped())?;
        Ok(rx)
    }

    /// Sends `msg` as one message; resolves once the peer has rebuilt and verified it.
    pub async fn send(&mut self, msg: Vec<u8>) -> Result<()> {
        if self.writing {
            return Err(Error::Protocol(
                "a message written through AsyncWrite is still open: flush it before send".into(),
            ));
        }
        self.command(|r| Command::Send(msg, r))?
            .await
            .map_err(|_| stopped())?
    }

    /// The next message from the peer, verified end to end (cancel-safe). A peer that closed
    /// between messages is [`Error::PeerClosed`] with `mid_frame: false`.
    pub async fn recv(&mut self) -> Result<Vec<u8>> {
        if self.rpos < self.rbuf.len() {
            return Err(Error::Protocol(
                "part of a message read through AsyncRead is still unread".into(),
            ));
        }
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<Vec<u8>>> {
        if self.recv.is_none() {
            self.recv = Some(self.command(Command::Recv)?);
        }
        let rx = self.recv.as_mut().expect("set above");
        let got = ready!(Pin::new(rx).poll(cx));
        self.recv = None;
        Poll::Ready(got.map_err(|_| stopped())?)
    }

    /// What this end has moved so far (once the operations issued before it are done).
    pub async fn stats(&self) -> Result<ChannelStats> {
        let (tx, rx) = oneshot::channel();
        if self.closed {
            return Err(closed());
        }
        self.commands
            .send(Command::Stats(tx))
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())
    }

    /// Ends a message written through `AsyncWrite` if one is open, finishes what is in
    /// flight, says goodbye and drops the connection; the thread ends.
    pub async fn close(mut self) -> Result<()> {
        if let Some((rx, _)) = self.write.take() {
            rx.await.map_err(|_| stopped())??;
        }
        let rest = std::mem::take(&mut self.wbuf);
        let rx = self.command(|r| Command::Close(rest, r))?;
        self.closed = true;
        let r = rx.await.map_err(|_| stopped())?;
        self.shutdown = None; // the thread has ended: nothing to cut
        r
    }

    /// Waits for the `Write`/`Flush` handed to the thread, if any.
    fn poll_written(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some((rx, _)) = self.write.as_mut() {
            let got = ready!(Pin::new(rx).poll(cx));
            self.write = None;
            got.map_err(|_| to_io(stopped()))?.map_err(to_io)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl From<DedupStream<Transport>> for AsyncDedupStream {
    /// Runs a TCP channel on a thread of its own; dropping the result shuts the socket down
    /// under an operation still waiting for the peer.
    fn from(stream: DedupStream<Transport>) -> AsyncDedupStream {
        let tcp = stream.get_ref().tcp();
        let peer = tcp.peer_addr().ok();
        let shutdown = tcp.try_clone().ok().map(|tcp| {
            Box::new(move || {
                let _ = tcp.shutdown(Shutdown::Both);
            }) as Box<dyn FnOnce() + Send + Sync>
        });
        let encrypted = stream.get_ref().is_encrypted();
        AsyncDedupStream::start(stream, shutdown, peer, encrypted)
    }
}

impl Drop for AsyncDedupStream {
    /// Cuts the connection unless closed in order, so that the thread ends even when an
    /// operation waits for the peer; dropping `commands` ends an idle thread.
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            shutdown();
        }
    }
}

fn serve<S: Read + Write>(mut stream: DedupStream<S>, mut rx: mpsc::UnboundedReceiver<Command>) {
    while let Some(command) = rx.blocking_recv() {
        match command {
            Command::Send(msg, reply) => {
                let _ = reply.send(stream.send(&msg));
            }
            Command::Recv(reply) => {
                let _ = reply.send(stream.recv());
            }
            Command::Write(bytes, reply) => {
                let _ = reply.send(stream.gather(&bytes));
            }
            Command::Flush(bytes, reply) => {
                let r = stream.gather(&bytes).and_then(|()| stream.flush_message());
                let _ = reply.send(r);
            }
            Command::Stats(reply) => {
                let _ = reply.send(stream.stats());
            }
            Command::Close(bytes, reply) => {
                let r = stream.gather(&bytes).and_then(|()| stream.close());
                let _ = reply.send(r);
                return;
            }
        }
    }
}

impl AsyncRead for AsyncDedupStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.rpos == this.rbuf.len() && !this.eof {
            match ready!(this.poll_recv(cx)) {
                Ok(m) => (this.rbuf, this.rpos) = (m, 0),
                Err(Error::PeerClosed {
                    mid_frame: false, ..
                }) => this.eof = true,
                Err(e) => return Poll::Ready(Err(to_io(e))),
            }
        }
        let n = buf.remaining().min(this.rbuf.len() - this.rpos);
        buf.put_slice(&this.rbuf[this.rpos..this.rpos + n]);
        this.rpos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for AsyncDedupStream {
    /// Adds to the open message; a full batch goes to the thread, which sends the segments it
    /// fills while the caller writes on.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(to_io(closed())));
        }
        ready!(this.poll_written(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        this.wbuf.extend_from_slice(buf);
        this.writing = true;
        if this.wbuf.len() >= WRITE_BATCH {
            let batch = std::mem::take(&mut this.wbuf);
            let rx = this.command(|r| Command::Write(batch, r)).map_err(to_io)?;
            this.write = Some((rx, false));
        }
        Poll::Ready(Ok(buf.len()))
    }

    /// Ends the message written since the last flush; ready once the peer has verified it.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let flushing = matches!(this.write, Some((_, true)));
            ready!(this.poll_written(cx))?;
            if flushing || !this.writing {
                return Poll::Ready(Ok(()));
            }
            let rest = std::mem::take(&mut this.wbuf);
            let rx = this.command(|r| Command::Flush(rest, r)).map_err(to_io)?;
            this.write = Some((rx, true));
            this.writing = false;
        }
    }

    /// Ends the open message, says goodbye and closes the channel (both directions).
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closed {
            ready!(Pin::new(&mut *this).poll_flush(cx))?;
            let rx = this
                .command(|r| Command::Close(Vec::new(), r))
                .map_err(to_io)?;
            this.write = Some((rx, true));
            this.closed = true;
        }
        ready!(this.poll_written(cx))?;
        this.shutdown = None; // the thread has ended: nothing to cut
        Poll::Ready(Ok(()))
    }
}
