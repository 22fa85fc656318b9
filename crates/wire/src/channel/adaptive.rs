//! The adaptive mode: per segment, dedup or plain, whichever costs the sender less time per
//! message byte on this connection.
//!
//! The cost of a segment is the time the sender spends on it: CPU (chunking, hashing,
//! similarity, deltas, compression) and socket writes, which block for as long as the link
//! (or the receiver) takes to drain them, so a slow link shows up as write time and a fast one
//! does not. A dedup segment also pays its round trips: the shortest request-to-answer time
//! seen, per level asked, divided by the window (segments in flight overlap their waits).
//! Waiting for acknowledgements is not counted: it is the other end's work, or the link's,
//! already charged through the writes. Per way, bytes and seconds are summed, every sum decaying
//! by `KEEP` (0.75) per segment acknowledged (either way), and the estimate is their ratio:
//! a probe after a long streak the other way counts almost alone. Until both ways have a sample,
//! segments alternate, dedup first; after that dedup is used unless plain is
//! [`PLAIN_MARGIN`] times faster, and the other way is probed every [`PROBE_EVERY`] segments,
//! so a change in link speed or redundancy is noticed.
//!
//! A plain segment teaches the sender nothing about what the receiver holds, so a dedup probe
//! after a plain streak would find no delta bases and look worse than it is. When plain
//! segments spend most of their time blocked in writes and the receiver reports (in its ACKs)
//! having been busy for much less than that (so the link is the bottleneck), the
//! sender indexes their chunks as a dedup segment would, which then costs no time, and flags
//! them KEEP so that the receiver keeps their chunks too; otherwise neither end spends
//! anything beyond compression on a plain segment.

use std::time::Duration;

use dedupwire_engine::compress::Compression;

use super::config::Mode;

/// One segment in this many is sent the other way, to keep its estimate fresh; each probe
/// that leaves the choice as it was doubles the interval, up to [`PROBE_EVERY_MAX`], and a
/// change of choice brings it back (a probe costs: a dedup segment on a fast link, or a plain
/// one on a slow link, runs several times slower than the way chosen).
pub const PROBE_EVERY: u64 = 8;
/// The longest interval between probes, in segments.
pub const PROBE_EVERY_MAX: u64 = 64;
/// Plain is chosen only when it is this much faster than dedup: a dedup segment also leaves
/// its chunks indexed on both ends for later messages, which a plain one does not (the
/// receiver keeps its chunks, but the sender learns nothing to find delta bases in it).
pub const PLAIN_MARGIN: f64 = 1.5;
/// Plain segments count as link-bound when this share of their time is spent blocked in
/// writes. A receiver slower than the sender blocks writes too, and keeping chunks would slow
/// it further, hence well above half.
const LINK_BOUND: f64 = 0.75;
/// Writes blocked for less than this multiple of the receiver's reported busy time are taken
/// as the link's doing, not the receiver's.
const RECEIVER_BOUND: f64 = 0.5;
/// How much of the past each new sample keeps in the decayed sums.
const KEEP: f64 = 0.75;
/// The faster zstd levels plain segments step down to, in order, when the sender's CPU and
/// not the link bounds them (zstd's own `--adapt` does the same): on a fast link, bytes
/// saved by a strong level cost more time to make than they take to send.
const FAST_LEVELS: [i32; 4] = [1, -1, -3, -7];
/// Plain segments step to a faster level when less than this share of their time was spent
/// blocked in writes (the link waited for the compressor)...
const CPU_BOUND: f64 = 0.2;
/// ...and back to a stronger one when more than this share was (the compressor waited for
/// the link); in between the level stays, so it does not swing segment by segment.
const WRITE_BOUND: f64 = 0.5;

/// How one segment travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    Dedup,
    Plain,
}

#[derive(Debug)]
pub(crate) struct Adaptive {
    mode: Mode,
    /// Decayed sums of (message bytes, seconds) per way.
    dedup: Option<(f64, f64)>,
    plain: Option<(f64, f64)>,
    segments: u64,
    /// The current interval between probes, segments since the last one, and the way last
    /// chosen as the best.
    probe_every: u64,
    since_probe: u64,
    best: Option<Way>,
    rtt: Option<Duration>,
    /// Share of a plain segment's time spent blocked in socket writes (a moving average).
    write_share: f64,
    /// The receiver's busy time over the sender's blocked writes, for plain segments (a
    /// moving average): near or above 1, the receiver, not the link, blocks the writes.
    receiver_share: f64,
    /// The zstd levels plain segments may use, the configured one first; empty when the
    /// level does not adapt (another method, or a mode other than adaptive).
    ladder: Vec<i32>,
    /// The current level's place in `ladder`.
    rung: usize,
}

impl Adaptive {
    pub(crate) fn new(mode: Mode, compression: Compression) -> Self {
        let ladder = match (mode, compression) {
            (Mode::Adaptive, Compression::Zstd(top)) => std::iter::once(top)
                .chain(FAST_LEVELS.into_iter().filter(|&l| l < top))
                .collect(),
            _ => Vec::new(),
        };
        Adaptive {
            mode,
            dedup: None,
            plain: None,
            segments: 0,
            probe_every: PROBE_EVERY,
            since_probe: 0,
            best: None,
            rtt: None,
            write_share: 0.0,
            receiver_share: 0.0,
            ladder,
            rung: 0,
        }
    }

    /// The zstd level for the next plain segment, when it adapts.
    pub(crate) fn plain_level(&self) -> Option<i32> {
        self.ladder.get(self.rung).copied()
    }

    /// How the next segment travels.
    pub(crate) fn choose(&mut self) -> Way {
        self.segments += 1;
        match self.mode {
            Mode::Dedup => Way::Dedup,
            Mode::Plain => Way::Plain,
            Mode::Adaptive => match (rate(self.dedup), rate(self.plain)) {
                (None, _) | (_, None) if self.segments % 2 == 1 => Way::Dedup,
                (None, _) | (_, None) => Way::Plain,
                (Some(d), Some(p)) => {
                    let best = if p > d * PLAIN_MARGIN {
                        Way::Plain
                    } else {
                        Way::Dedup
                    };
                    let other = if best == Way::Dedup {
                        Way::Plain
                    } else {
                        Way::Dedup
                    };
                    if self.best != Some(best) {
                        self.best = Some(best);
                        self.probe_every = PROBE_EVERY;
                        self.since_probe = 0;
                    }
                    self.since_probe += 1;
                    if self.since_probe >= self.probe_every {
                        self.since_probe = 0;
                        self.probe_every = (self.probe_every * 2).min(PROBE_EVERY_MAX);
                        other
                    } else {
                        best
                    }
                }
            },
        }
    }

    /// A plain segment spent `writes` of its `busy` time writing to the socket, and the
    /// receiver reported `receiver` busy time with its acknowledgement.
    pub(crate) fn plain_sample(&mut self, writes: Duration, busy: Duration, receiver: Duration) {
        let share = writes.as_secs_f64() / busy.as_secs_f64().max(1e-9);
        self.write_share = 0.5 * self.write_share + 0.5 * share.min(1.0);
        let rshare = receiver.as_secs_f64() / writes.as_secs_f64().max(1e-9);
        self.receiver_share = 0.5 * self.receiver_share + 0.5 * rshare.min(10.0);
        if self.write_share < CPU_BOUND && self.rung + 1 < self.ladder.len() {
            self.rung += 1;
        } else if self.write_share > WRITE_BOUND && self.rung > 0 {
            self.rung -= 1;
        }
    }

    /// Whether to index plain segments: the link, not the sender's CPU nor the receiver,
    /// bounds plain sending, so indexing costs no time (the link drains while it runs).
    pub(crate) fn link_bound(&self) -> bool {
        self.mode == Mode::Adaptive
            && self.write_share > LINK_BOUND
            && self.receiver_share < RECEIVER_BOUND
    }

    /// A request was answered `rtt` after it was sent.
    pub(crate) fn round_trip(&mut self, rtt: Duration) {
        self.rtt = Some(self.rtt.map_or(rtt, |r| r.min(rtt)));
    }

    /// A segment of `bytes` message bytes sent `way` cost the sender `busy`, and took
    /// `round_trips` request/answer exchanges with `window` segments in flight.
    pub(crate) fn observe(
        &mut self,
        way: Way,
        bytes: usize,
        busy: Duration,
        round_trips: u32,
        window: usize,
    ) {
        let waits = self.rtt.unwrap_or_default() * round_trips / window.max(1) as u32;
        let secs = (busy + waits).as_secs_f64().max(1e-6);
        for (b, t) in self.dedup.iter_mut().chain(self.plain.iter_mut()) {
            *b *= KEEP;
            *t *= KEEP;
        }
        let slot = match way {
            Way::Dedup => &mut self.dedup,
            Way::Plain => &mut self.plain,
        };
        let (b, t) = slot.unwrap_or((0.0, 0.0));
        *slot = Some((b + bytes as f64, t + secs));
    }

    /// The current estimates (dedup, plain), bytes per second; 0 when not yet measured.
    pub(crate) fn rates(&self) -> (f64, f64) {
        (
            rate(self.dedup).unwrap_or(0.0),
            rate(self.plain).unwrap_or(0.0),
        )
    }
}

fn rate(sums: Option<(f64, f64)>) -> Option<f64> {
    sums.map(|(b, t)| b / t.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn picks_the_faster_way_and_probes_the_other() {
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        assert_eq!(a.choose(), Way::Dedup);
        a.round_trip(Duration::from_millis(400));
        a.observe(Way::Dedup, 1_000, Duration::from_millis(100), 2, 1);
        assert_eq!(a.choose(), Way::Plain);
        a.observe(Way::Plain, 1_000, Duration::from_millis(100), 0, 1);
        let ways: Vec<Way> = (0..16).map(|_| a.choose()).collect();
        assert!(
            ways.iter().filter(|w| **w == Way::Plain).count() >= 14,
            "{ways:?}"
        );
        assert!(ways.contains(&Way::Dedup), "probes dedup: {ways:?}");
        let mut probes = Vec::new();
        for _ in 0..400 {
            if a.choose() == Way::Dedup {
                probes.push(a.segments as usize);
            }
        }
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.windows(2).all(|g| g[1] >= g[0])
                && gaps.last() == Some(&(PROBE_EVERY_MAX as usize)),
            "probes back off while they confirm the choice: {gaps:?}"
        );
        a.observe(Way::Dedup, 1_000_000, Duration::from_millis(1), 0, 1);
        assert_eq!(a.choose(), Way::Dedup, "a probe that wins flips the choice");
        a.observe(Way::Plain, 10_000_000, Duration::from_millis(1), 0, 1);
        let back: Vec<Way> = (0..(PROBE_EVERY as usize)).map(|_| a.choose()).collect();
        assert!(
            back.contains(&Way::Dedup),
            "and probing starts over: {back:?}"
        );
        assert_eq!(
            Adaptive::new(Mode::Plain, Compression::Zstd(3)).choose(),
            Way::Plain
        );
    }

    #[test]
    fn the_plain_level_follows_what_bounds_the_sender() {
        let ms = Duration::from_millis;
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        assert_eq!(a.plain_level(), Some(3));
        let mut seen = Vec::new();
        for _ in 0..6 {
            a.plain_sample(ms(1), ms(100), ms(1));
            seen.push(a.plain_level().unwrap());
        }
        assert_eq!(
            seen,
            [1, -1, -3, -7, -7, -7],
            "CPU-bound: faster and faster"
        );
        for _ in 0..6 {
            a.plain_sample(ms(90), ms(100), ms(1));
        }
        assert_eq!(
            a.plain_level(),
            Some(3),
            "link-bound: back to the configured level"
        );
        a.plain_sample(ms(35), ms(100), ms(1));
        assert_eq!(a.plain_level(), Some(3), "in between it stays");
        assert_eq!(
            Adaptive::new(Mode::Plain, Compression::Zstd(3)).plain_level(),
            None
        );
        assert_eq!(
            Adaptive::new(Mode::Adaptive, Compression::Lz4).plain_level(),
            None
        );
        let low = Adaptive::new(Mode::Adaptive, Compression::Zstd(-2));
        assert_eq!(low.ladder, [-2, -3, -7]);
    }
}
