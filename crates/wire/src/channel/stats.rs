//! Counters a channel keeps: what its messages cost on the socket and how each chunk travelled.

use std::time::Duration;

/// What a [`DedupStream`](super::DedupStream) has moved so far, both directions.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ChannelStats {
    /// Messages sent (completed `send`s).
    pub messages_sent: u64,
    /// Messages received (returned by `recv`).
    pub messages_received: u64,
    /// Bytes of the messages sent.
    pub message_bytes_sent: u64,
    /// Bytes of the messages received.
    pub message_bytes_received: u64,
    /// Bytes written to the socket, frames and handshake included.
    pub socket_bytes_sent: u64,
    /// Bytes read from the socket, frames and handshake included.
    pub socket_bytes_received: u64,
    /// Chunks sent as a reference only: the receiver held them.
    pub chunks_hit: u64,
    /// Message bytes those chunks stand for.
    pub bytes_hit: u64,
    /// Chunks sent as a delta against a similar chunk the receiver held.
    pub chunks_delta: u64,
    /// Message bytes those chunks stand for.
    pub bytes_delta: u64,
    /// Of those chunks, the ones sent as a zstd delta (binaries; protocol version 2).
    pub chunks_zdelta: u64,
    /// Chunks sent whole (compressed).
    pub chunks_literal: u64,
    /// Message bytes those chunks stand for.
    pub bytes_literal: u64,
    /// Segments sent plain (compressed, no dedup).
    pub segments_plain: u64,
    /// Message bytes sent in plain segments.
    pub bytes_plain: u64,
    /// Plain segments whose chunks both ends indexed (KEEP), the link being the bottleneck.
    pub segments_kept: u64,
    /// Segments sent with dedup.
    pub segments_dedup: u64,
    /// Plain samples the adaptive mode measured without sending them (a WAN away): the
    /// start of a dedup segment compressed and decompressed here only to time it.
    pub plain_estimates: u64,
    /// Request/have exchanges (one per segment and level).
    pub round_trips: u64,
    /// Chunks this end asked for again (evicted after being claimed, or a lost delta base).
    pub chunks_needed: u64,
    /// Chunks this end sent again because the peer asked.
    pub chunks_resent: u64,
    /// Time spent inside `send` (and the writer's flushes).
    pub send_time: Duration,
    /// Time spent inside `recv`.
    pub recv_time: Duration,
    /// The adaptive mode's latest estimate of dedup speed, message bytes per second of sender time.
    pub dedup_rate: f64,
    /// The adaptive mode's latest estimate of plain speed, message bytes per second of sender time.
    pub plain_rate: f64,
    /// The zstd level the adaptive mode last compressed a plain segment with (`None` when
    /// the level is fixed): below the configured one when the sender's CPU, not the link,
    /// bounds plain sending.
    pub plain_level: Option<i32>,
}

impl ChannelStats {
    /// The share of message bytes sent that did not travel as themselves (hits and deltas).
    pub fn redundancy(&self) -> f64 {
        let all = self.bytes_hit + self.bytes_delta + self.bytes_literal + self.bytes_plain;
        if all == 0 {
            0.0
        } else {
            (self.bytes_hit + self.bytes_delta) as f64 / all as f64
        }
    }
}
