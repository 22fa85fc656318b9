//! Live replication over a connection: a [`Sender`] tails a [`ChangeSource`] and ships sDedup
//! batches; a [`Receiver`] decodes them and applies them to a [`ChangeSink`]. The messages are
//! in [`crate::protocol`].
//!
//! **Optimistic protocol (sDedup §4.1).** The sender encodes each change against a similar
//! document it assumes the replica holds, naming the source and its content hash. The receiver
//! looks the source up in its cache (which mirrors the sender's), among the batch's earlier
//! entries, then in its replica; when none has the named content it asks for those entries
//! raw (`NEED_RAW`), and applies the batch only once every entry is whole.
//!
//! **Exactly once.** The receiver applies each batch in one transaction together with its last
//! position, then acknowledges it; the sender acknowledges the source only then, so the source
//! keeps every change not yet applied. A connection starts with the receiver's applied
//! position: the sender acknowledges the source up to there and sends only what follows. Either
//! end can die at any moment; the other gets [`LiveError::is_peer_closed`] and the next
//! connection resumes where the replica is, losing nothing and applying nothing twice (the
//! sink also skips positions at or before its own).
//!
//! **Pipelining.** Up to [`SenderConfig::window`] batches are in flight. The receiver handles
//! them in order, one `NEED_RAW` at a time, always about the oldest unacknowledged batch.
//!
//! Encoder and decoder state (feature index, source caches) lives for one connection: both ends
//! start empty, so their caches keep mirroring each other.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupwire_wire::{Error as WireError, Framed};
use serde::Serialize;

use crate::protocol::{frame_config, wire_hello, Hello, Message, Role};
use crate::sdedup::{Decoder, EncodeStats, Encoder, MemoryStore, SdedupConfig, SourceStore};
use crate::{Change, ChangeSink, ChangeSource};

/// Why a replication session stopped.
///
/// The message of each variant includes its cause's (so no `source()` is exposed: chained
/// error reports would repeat it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiveError {
    /// The connection failed: the peer went away, sent damaged frames, broke the protocol or
    /// reported its own error ([`WireError::Remote`]).
    #[error("connection: {0}")]
    Wire(WireError),
    /// The change source failed.
    #[error("source: {0}")]
    Source(Box<dyn std::error::Error + Send + Sync>),
    /// The replica failed.
    #[error("replica: {0}")]
    Sink(Box<dyn std::error::Error + Send + Sync>),
    /// A batch could not be decoded.
    #[error("batch: {0}")]
    Decode(crate::Error),
    /// The peer sent something that makes no sense at this point.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The sender's similarity state could not be opened or updated.
    #[error("{0}")]
    State(crate::Error),
}

impl From<WireError> for LiveError {
    fn from(e: WireError) -> Self {
        LiveError::Wire(e)
    }
}

impl From<crate::Error> for LiveError {
    fn from(e: crate::Error) -> Self {
        LiveError::Decode(e)
    }
}

impl LiveError {
    /// True when the peer went away (connection closed or reset, possibly mid-frame).
    pub fn is_peer_closed(&self) -> bool {
        matches!(self, LiveError::Wire(e) if e.is_peer_closed())
    }

    /// True when the peer stopped and said why (an error frame).
    pub fn is_remote(&self) -> bool {
        matches!(self, LiveError::Wire(WireError::Remote(_)))
    }

    /// Whether telling the peer about this error makes sense (the link still works and the
    /// peer does not know already).
    fn worth_telling(&self) -> bool {
        !matches!(
            self,
            LiveError::Wire(WireError::PeerClosed { .. } | WireError::Remote(_) | WireError::Io(_))
        )
    }
}

fn source_err<E: std::error::Error + Send + Sync + 'static>(e: E) -> LiveError {
    LiveError::Source(Box::new(e))
}

fn sink_err<E: std::error::Error + Send + Sync + 'static>(e: E) -> LiveError {
    LiveError::Sink(Box::new(e))
}

fn unexpected(m: &Message, while_: &str) -> LiveError {
    match m {
        Message::Error(text) => LiveError::Wire(WireError::Remote(text.clone())),
        _ => LiveError::Protocol(format!("unexpected {} {while_}", m.name())),
    }
}

/// Sender settings.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// How batches are encoded (the receiver learns it in the handshake).
    pub sdedup: SdedupConfig,
    /// The stream's name: the source's slot, the key of the replica's position.
    pub stream: String,
    /// Documents per batch, in bytes (a batch holds at least one change).
    pub batch_bytes: usize,
    /// Changes per batch at most.
    pub max_batch_changes: usize,
    /// Batches in flight (sent, not yet acknowledged) at most.
    pub window: usize,
    /// Sleep when the source has nothing new and nothing is in flight.
    pub idle_sleep: Duration,
    /// When idle this long, ping the receiver (a dead receiver is noticed).
    pub keepalive: Duration,
    /// Where the sender keeps its similarity state across restarts (`None`: a temporary
    /// directory, rebuilt from the stream after a restart).
    pub state_dir: Option<std::path::PathBuf>,
    /// Stop (successfully) once the source has nothing more and everything is acknowledged.
    pub until_drained: bool,
    /// When set, send nothing new, wait for the batches in flight, and stop successfully.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            sdedup: SdedupConfig::default(),
            stream: "dedupwire".to_string(),
            batch_bytes: 4 << 20,
            max_batch_changes: 10_000,
            window: 4,
            idle_sleep: Duration::from_millis(100),
            keepalive: Duration::from_secs(5),
            state_dir: None,
            until_drained: false,
            stop: None,
        }
    }
}

/// What a sender session did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SendSummary {
    /// The stream's name.
    pub stream: String,
    /// The receiver's applied position at the start.
    pub resumed_after: Option<u64>,
    /// Batches sent.
    pub batches: u64,
    /// Changes sent.
    pub changes: u64,
    /// Bytes of their documents, ids and collection names: what plain replication would ship.
    pub raw_bytes: u64,
    /// Raw requests answered.
    pub raw_requests: u64,
    /// Entries re-sent whole.
    pub raw_entries: u64,
    /// Batches acknowledged.
    pub acked_batches: u64,
    /// The last acknowledged position.
    pub acked: Option<u64>,
    /// Bytes written to the connection (frames, handshake included).
    pub wire_bytes_sent: u64,
    /// Bytes read from it.
    pub wire_bytes_received: u64,
    /// `raw_bytes / (wire_bytes_sent + wire_bytes_received)`.
    pub ratio: f64,
    /// The encoder's counters.
    pub encode: EncodeStats,
}

/// The sending end: one [`run`](Sender::run) per connection.
#[derive(Debug)]
pub struct Sender {
    config: SenderConfig,
    summary: SendSummary,
    /// Changes per poll, adapted to the documents' size.
    poll_changes: usize,
}

impl Sender {
    /// A sender with `config`.
    pub fn new(config: SenderConfig) -> Self {
        Sender {
            summary: SendSummary::default(),
            poll_changes: 64.min(config.max_batch_changes.max(1)),
            config,
        }
    }

    /// What the last (or current) session did.
    pub fn summary(&self) -> &SendSummary {
        &self.summary
    }

    /// Runs one session over `stream` (connected to a receiver): handshake, then batches from
    /// `source`, encoded with delta sources fetched from `store` on cache misses (the source
    /// database's current documents). Returns `Ok` when stopped by the configuration
    /// ([`SenderConfig::until_drained`], [`SenderConfig::stop`]); an error otherwise, after
    /// telling the receiver why when the link still works.
    pub fn run<S, Src>(
        &mut self,
        stream: S,
        source: &mut Src,
        store: &mut dyn SourceStore,
    ) -> Result<(), LiveError>
    where
        S: Read + Write,
        Src: ChangeSource,
    {
        self.summary = SendSummary {
            stream: self.config.stream.clone(),
            ..SendSummary::default()
        };
        let mut link = Framed::with_config(stream, frame_config());
        let mut encoder = Encoder::open(self.config.sdedup, self.config.state_dir.as_deref())
            .map_err(LiveError::State)?;
        let result = self.session(&mut link, &mut encoder, source, store);
        if let Err(e) = &result {
            if e.worth_telling() {
                let _ = Message::Error(format!("sender: {e}")).send(&mut link);
            }
        }
        let s = &mut self.summary;
        s.wire_bytes_sent = link.bytes_written();
        s.wire_bytes_received = link.bytes_read();
        s.encode = encoder.stats();
        s.ratio = s.raw_bytes as f64 / (s.wire_bytes_sent + s.wire_bytes_received).max(1) as f64;
        result
    }

    fn stopping(&self) -> bool {
        self.config
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::SeqCst))
    }

    fn session<S: Read + Write, Src: ChangeSource>(
        &mut self,
        link: &mut Framed<S>,
        encoder: &mut Encoder,
        source: &mut Src,
        store: &mut dyn SourceStore,
    ) -> Result<(), LiveError> {
        let ours = Hello {
            role: Role::Sender,
            stream: self.config.stream.clone(),
            resume: None,
            config: Some(self.config.sdedup),
        };
        let agreed = link.handshake(&ours.to_wire())?;
        let peer = Hello::decode(&agreed.peer.data)?;
        if peer.role != Role::Receiver {
            return Err(LiveError::Protocol(format!(
                "the peer is a {}: connect a sender to a receiver",
                peer.role
            )));
        }
        if peer.stream != self.config.stream {
            return Err(LiveError::Protocol(format!(
                "the receiver answered for stream {:?}, not {:?}",
                peer.stream, self.config.stream
            )));
        }
        // Everything up to the replica's position is applied: release it, send what follows.
        source.resume(peer.resume).map_err(source_err)?;
        self.summary.resumed_after = peer.resume;
        let window = self.config.window.max(1);
        let mut last_polled = peer.resume;
        let mut pending: VecDeque<Change> = VecDeque::new();
        let mut in_flight: VecDeque<Vec<Change>> = VecDeque::new();
        let mut out = Vec::new();
        let mut last_io = Instant::now();
        let mut ping_seq = 0u64;
        loop {
            let stopping = self.stopping();
            // Fill the window.
            let mut drained = false;
            while !stopping && in_flight.len() < window {
                if pending.is_empty() {
                    // A source may return everything after its acknowledged position, the
                    // batches in flight included: ask for those plus enough to fill the window.
                    let flying: usize = in_flight.iter().map(Vec::len).sum();
                    let want = flying + (window - in_flight.len()) * self.poll_changes;
                    let polled = source.poll(want).map_err(source_err)?;
                    pending.extend(
                        polled
                            .into_iter()
                            .filter(|c| last_polled.is_none_or(|l| c.pos > l)),
                    );
                    match pending.back() {
                        Some(c) => last_polled = Some(c.pos),
                        None => {
                            drained = true;
                            break;
                        }
                    }
                }
                let batch = self.take_batch(&mut pending);
                out.clear();
                encoder
                    .encode_batch(&batch, store, &mut out)
                    .map_err(LiveError::State)?;
                Message::Batch(std::mem::take(&mut out)).send(link)?;
                self.summary.batches += 1;
                self.summary.changes += batch.len() as u64;
                self.summary.raw_bytes += batch.iter().map(change_bytes).sum::<u64>();
                in_flight.push_back(batch);
                last_io = Instant::now();
            }
            if in_flight.is_empty() {
                if stopping || (drained && self.config.until_drained) {
                    Message::Done.send(link)?;
                    return Ok(());
                }
                if last_io.elapsed() >= self.config.keepalive {
                    ping_seq += 1;
                    let token = ping_seq.to_le_bytes().to_vec();
                    Message::Ping(token.clone()).send(link)?;
                    match Message::recv(link)?.0 {
                        Message::Pong(t) if t == token => {}
                        m => return Err(unexpected(&m, "while waiting for a pong")),
                    }
                    last_io = Instant::now();
                }
                std::thread::sleep(self.config.idle_sleep);
                continue;
            }
            // The window is full, the source is drained or we are stopping: wait for the
            // receiver.
            let (msg, _) = Message::recv(link)?;
            last_io = Instant::now();
            let oldest = in_flight.front().expect("a batch in flight");
            match msg {
                Message::Ack(pos) => {
                    let expected = oldest.last().expect("batches are not empty").pos;
                    if pos != expected {
                        return Err(LiveError::Protocol(format!(
                            "ack of position {pos}, but the oldest batch in flight ends at {expected}"
                        )));
                    }
                    source.ack(pos).map_err(source_err)?;
                    in_flight.pop_front();
                    self.summary.acked_batches += 1;
                    self.summary.acked = Some(pos);
                }
                Message::NeedRaw(positions) => {
                    let mut raw = Vec::with_capacity(positions.len());
                    for p in &positions {
                        match oldest.iter().find(|c| c.pos == *p) {
                            Some(c) => raw.push(c.clone()),
                            None => {
                                return Err(LiveError::Protocol(format!(
                                "raw request for position {p}, which is not in the oldest batch \
                                     in flight"
                            )))
                            }
                        }
                    }
                    let mut buf = Vec::new();
                    encoder.encode_raw(&raw, &mut buf);
                    Message::RawBatch(buf).send(link)?;
                    self.summary.raw_requests += 1;
                    self.summary.raw_entries += raw.len() as u64;
                }
                Message::Ping(token) => Message::Pong(token).send(link)?,
                m => return Err(unexpected(&m, "while waiting for acks")),
            }
        }
    }

    /// The next batch from `pending`: about `batch_bytes` of documents, at least one change.
    fn take_batch(&mut self, pending: &mut VecDeque<Change>) -> Vec<Change> {
        let mut batch = Vec::new();
        let mut bytes = 0u64;
        while let Some(c) = pending.front() {
            let size = change_bytes(c);
            if !batch.is_empty()
                && (bytes + size > self.config.batch_bytes as u64
                    || batch.len() >= self.config.max_batch_changes)
            {
                break;
            }
            bytes += size;
            batch.push(pending.pop_front().expect("non-empty"));
        }
        // Poll about a batch's worth of changes next time.
        let avg = (bytes / batch.len() as u64).max(1);
        self.poll_changes = ((self.config.batch_bytes as u64 / avg) as usize)
            .clamp(1, self.config.max_batch_changes.max(1));
        batch
    }
}

fn change_bytes(c: &Change) -> u64 {
    (c.collection.len() + c.id.len() + c.doc.as_ref().map_or(0, Vec::len)) as u64
}

/// Receiver settings.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// Batches the receiver holds undecoded while it waits for a raw answer (the sender's
    /// window bounds them; more is a protocol error).
    pub max_queued_batches: usize,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            max_queued_batches: 256,
        }
    }
}

/// What a receiver session did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReceiveSummary {
    /// The stream's name, from the sender.
    pub stream: String,
    /// The replica's applied position at the start.
    pub resumed_after: Option<u64>,
    /// Batches applied.
    pub batches: u64,
    /// Changes in them.
    pub changes: u64,
    /// Raw requests sent.
    pub raw_requests: u64,
    /// Entries whose delta source the replica did not hold (asked for raw).
    pub fallbacks: u64,
    /// The last applied position.
    pub applied: Option<u64>,
    /// Bytes read from the connection.
    pub wire_bytes_received: u64,
    /// Bytes written to it.
    pub wire_bytes_sent: u64,
    /// The decoder's source-cache (hits, misses).
    pub cache_hits: (u64, u64),
}

/// The receiving end: one [`run`](Receiver::run) per connection.
#[derive(Debug, Default)]
pub struct Receiver {
    config: ReceiverConfig,
    summary: ReceiveSummary,
}

/// The replica as the decoder's source store (sink errors are kept and reported).
struct SinkStore<'a, K: ChangeSink> {
    sink: &'a mut K,
    error: Option<K::Error>,
}

impl<K: ChangeSink> SourceStore for SinkStore<'_, K> {
    fn fetch(&mut self, collection: &str, id: &str) -> Option<Vec<u8>> {
        if self.error.is_some() {
            return None;
        }
        match self.sink.get(collection, id) {
            Ok(doc) => doc,
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }
}

impl Receiver {
    /// A receiver with `config`.
    pub fn new(config: ReceiverConfig) -> Self {
        Receiver {
            config,
            summary: ReceiveSummary::default(),
        }
    }

    /// What the last (or current) session did.
    pub fn summary(&self) -> &ReceiveSummary {
        &self.summary
    }

    /// Runs one session over `stream` (accepted from a sender): reads the sender's hello, opens
    /// the replica for its stream with `open_sink`, answers with the replica's applied
    /// position, then decodes, applies and acknowledges batches until the sender is done
    /// (`Ok`) or something fails (after telling the sender why when the link still works).
    pub fn run<S, K, F>(&mut self, stream: S, open_sink: F) -> Result<(), LiveError>
    where
        S: Read + Write,
        K: ChangeSink,
        F: FnOnce(&str) -> Result<K, K::Error>,
    {
        self.summary = ReceiveSummary::default();
        let mut link = Framed::with_config(stream, frame_config());
        let mut decoder = None;
        let result = self.session(&mut link, open_sink, &mut decoder);
        if let Err(e) = &result {
            if e.worth_telling() {
                let _ = Message::Error(format!("receiver: {e}")).send(&mut link);
            }
        }
        self.summary.wire_bytes_received = link.bytes_read();
        self.summary.wire_bytes_sent = link.bytes_written();
        if let Some(d) = &decoder {
            self.summary.cache_hits = Decoder::cache_hits(d);
        }
        result
    }

    fn session<S, K, F>(
        &mut self,
        link: &mut Framed<S>,
        open_sink: F,
        decoder_slot: &mut Option<Decoder>,
    ) -> Result<(), LiveError>
    where
        S: Read + Write,
        K: ChangeSink,
        F: FnOnce(&str) -> Result<K, K::Error>,
    {
        let agreed = link.recv_hello(&wire_hello())?;
        let peer = Hello::decode(&agreed.peer.data)?;
        if peer.role != Role::Sender {
            return Err(LiveError::Protocol(format!(
                "the peer is a {}: connect a sender to a receiver",
                peer.role
            )));
        }
        self.summary.stream = peer.stream.clone();
        let mut sink = open_sink(&peer.stream).map_err(sink_err)?;
        let resume = sink.applied_position().map_err(sink_err)?;
        self.summary.resumed_after = resume;
        let ours = Hello {
            role: Role::Receiver,
            stream: peer.stream.clone(),
            resume,
            config: None,
        };
        link.send_hello(&ours.to_wire())?;
        let config = peer.config.unwrap_or_default();
        let decoder = decoder_slot.insert(Decoder::new(config));
        // Raw answers hold whole documents: a separate decoder, so they do not disturb the
        // cache that mirrors the sender's.
        let mut raw_decoder = Decoder::new(SdedupConfig {
            cache_entries: 1,
            ..config
        });
        let mut queued: VecDeque<(Vec<u8>, u64)> = VecDeque::new();
        loop {
            let (bytes, offset) = match queued.pop_front() {
                Some(b) => b,
                None => match Message::recv(link)? {
                    (Message::Batch(b), offset) => (b, offset),
                    (Message::Done, _) => return Ok(()),
                    (Message::Ping(t), _) => {
                        Message::Pong(t).send(link)?;
                        continue;
                    }
                    (m, _) => return Err(unexpected(&m, "while waiting for a batch")),
                },
            };
            let (mut batch, used) = {
                let mut store = SinkStore {
                    sink: &mut sink,
                    error: None,
                };
                let decoded = decoder.decode_batch(&bytes, offset, &mut store);
                if let Some(e) = store.error {
                    return Err(sink_err(e));
                }
                decoded?
            };
            if used != bytes.len() {
                return Err(LiveError::Protocol(format!(
                    "{} bytes after the batch at byte {offset}",
                    bytes.len() - used
                )));
            }
            let Some(last) = batch.changes.last().map(|c| c.pos) else {
                return Err(LiveError::Protocol(format!("empty batch at byte {offset}")));
            };
            if !batch.missing.is_empty() {
                self.summary.raw_requests += 1;
                self.summary.fallbacks += batch.missing.len() as u64;
                Message::NeedRaw(batch.missing.clone()).send(link)?;
                let (raw, raw_offset) = loop {
                    match Message::recv(link)? {
                        (Message::RawBatch(b), offset) => break (b, offset),
                        (Message::Batch(b), offset) => {
                            if queued.len() >= self.config.max_queued_batches {
                                return Err(LiveError::Protocol(format!(
                                    "more than {} batches in flight",
                                    self.config.max_queued_batches
                                )));
                            }
                            queued.push_back((b, offset));
                        }
                        (Message::Ping(t), _) => Message::Pong(t).send(link)?,
                        (m, _) => return Err(unexpected(&m, "while waiting for a raw batch")),
                    }
                };
                let (whole, used) =
                    raw_decoder.decode_batch(&raw, raw_offset, &mut MemoryStore::default())?;
                if used != raw.len() || !whole.missing.is_empty() {
                    return Err(LiveError::Protocol(format!(
                        "the raw batch at byte {raw_offset} is not a batch of whole documents"
                    )));
                }
                decoder.resolve(&mut batch, whole.changes)?;
                if !batch.missing.is_empty() {
                    return Err(LiveError::Protocol(format!(
                        "the raw batch left positions {:?} unanswered",
                        batch.missing
                    )));
                }
            }
            sink.apply(&batch.changes).map_err(sink_err)?;
            Message::Ack(last).send(link)?;
            self.summary.batches += 1;
            self.summary.changes += batch.changes.len() as u64;
            self.summary.applied = Some(last);
        }
    }
}

#[cfg(feature = "postgres")]
pub use crate::pg::PgDocStore;
