//! The adaptive mode: per segment, dedup or plain, whichever moves message bytes faster on
//! this connection.
//!
//! Per way, decayed sums (each decays by `KEEP`, 0.75, per segment acknowledged either way, so
//! a probe after a long streak the other way counts almost alone) of message bytes, the
//! sender's CPU time (chunking, hashing, similarity, deltas, compression; a dedup segment also
//! pays its round trips: the shortest request-to-answer time, per level asked, divided by the
//! window), the receiver's busy time (reported with each acknowledgement) and the wire bytes
//! its frames took. Segments are pipelined, so a way's pace is set by the slowest of the two
//! ends' work and its wire bytes over the link's rate; a LAN away, both ends' work adds up. The
//! link's rate is the delivery rate of the last acknowledged segments (wire bytes per second of
//! acknowledgements), which socket buffers cannot hide the way they hide blocked writes; it
//! counts only while the sender has spent a good share of its time waiting for the other end
//! and the receiver reports having been idle through it (otherwise the acknowledgements follow
//! the sender's own pace, or the receiver's); its rate when it last limited is kept and prices
//! plain while dedup segments leave the link idle. Until both ways have a sample and the link's
//! rate is known, segments alternate, dedup first. A LAN away (by the handshake's round trip)
//! they are samples, an eighth of a segment, so that measuring the slower way costs little.
//! Further away dedup segments go whole and plain samples are dry: the segment goes whole with
//! dedup, and the sender compresses a thirty-second of it (and decompresses that, for the
//! receiver's share) only to time it, its wire bytes left to the link's rate as dedup's
//! deliveries show it (on a slow link a plain sample sent cost what dedup saves: typescript's
//! 32 MB tar took 0.2 MB of plain samples against 0.04 MB for the whole message with dedup).
//! Probes are samples too: an eighth of a segment for dedup, dry for plain further than a LAN
//! away.
//!
//! After that dedup is used unless plain is [`PLAIN_MARGIN`] times faster (a LAN away, just
//! faster), and the other way is probed every [`PROBE_EVERY`] segments, so a change in link
//! speed or redundancy is noticed; the interval doubles (to [`PROBE_EVERY_MAX`]) while probes
//! confirm the choice, except that dedup is probed every other segment while plain is chosen
//! on a link-bound connection, where a probe is nearly free. Where plain wins on dry samples
//! alone, its segments are short samples until one is acknowledged: their wire time rested on
//! a link's rate that dedup's few bytes may never have tested.
//!
//! Plain segments' zstd level adapts too: it steps down towards zstd's fast levels while the
//! sender hardly waits for the other end and its own work is most of the time (its CPU is the
//! bottleneck), and back up when it mostly waits, for the other end or for the application's
//! bytes (a faster level would then only cost bytes).
//!
//! A connection does not start from nothing: when it closes, the sender keeps what it
//! measured in its store as a [`Prior`] (per message byte, each way's costs; the link's rate
//! as it limited; the plain level) if it sent plain segments (not only dry samples), one for
//! peers a LAN away and one for the others, and
//! the next connection as far away starts from it: no sampling of both ways first, the way
//! the prior favours from the first segment, a probe of the other way at the second (the
//! prior may be another data's or another peer's), then probes as usual. The connection's
//! own first measurement of a way replaces the prior's. (Each of the links bench's transfers
//! is a new connection: unshaped, tokio's releases each sampled plain before dedup's few
//! bytes were known to win, and Django's chose dedup for whole segments before plain's first
//! measurement came back.)
//!
//! A plain segment teaches the sender nothing about what the receiver holds, so a dedup probe
//! after a plain streak would find no delta bases and look worse than it is. While the link
//! bounds plain sending (and until the link's rate is known), the sender indexes plain
//! segments' chunks as a dedup segment would, which then costs no time, and flags them KEEP
//! so that the receiver keeps their chunks too; otherwise neither end spends anything beyond
//! compression on a plain segment.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use dedupwire_engine::compress::Compression;

use super::config::Mode;

/// One segment in this many is sent the other way, to keep its estimate fresh; each probe
/// that leaves the choice as it was doubles the interval, up to [`PROBE_EVERY_MAX`], and a
/// change of choice brings it back (a probe costs: a dedup segment on a fast link, or a plain
/// one on a slow link, runs several times slower than the way chosen).
pub const PROBE_EVERY: u64 = 8;
/// The longest interval between probes, in segments.
pub const PROBE_EVERY_MAX: u64 = 64;
/// The interval between dedup probes while plain is chosen and the link bounds it: a dedup
/// segment then costs CPU time the link's draining hides, and saves the link all it finds.
const LINK_BOUND_PROBE_EVERY: u64 = 2;
/// Plain is chosen only when it is this much faster than dedup: a dedup segment also leaves
/// its chunks indexed on both ends for later messages, which a plain one does not (the
/// receiver keeps its chunks, but the sender learns nothing to find delta bases in it). A
/// LAN away there is no margin: bytes saved later are worth little time on a fast link (and
/// where the LAN is slow, its rate limits plain and dedup wins on bytes anyway); over loopback
/// the Django tar took 0.63 s with it, 0.44 s without, as long as `tar | zstd`.
pub const PLAIN_MARGIN: f64 = 1.5;
/// Plain segments count as link-bound when the link's rate limits (see [`LINK_LIMITS`]) and
/// their wire bytes take it this many times longer than their CPU time: then indexing them
/// (about the CPU time of compressing them) hides behind the link's draining.
const LINK_BOUND: f64 = 1.5;
/// Waits longer than the receiver's reported busy time over this are taken as the link's
/// doing, not the receiver's.
const RECEIVER_BOUND: f64 = 0.8;
/// The link's delivery rate limits the estimates only when the sender spent more than this
/// share of its time waiting for the other end, and the receiver was not what it waited for.
const LINK_LIMITS: f64 = 0.25;
/// A round trip under this (the handshake's, or a request's) says the peer is on a LAN, where
/// plain sending is likely the faster way: the first segment is then a sample too.
const LAN_ROUND_TRIP: Duration = Duration::from_millis(1);
/// How much of the past each new sample keeps in the decayed sums.
const KEEP: f64 = 0.75;
/// The faster zstd levels plain segments step down to, in order, when the sender's CPU and
/// not the link bounds them (zstd's own `--adapt` does the same): on a fast link, bytes
/// saved by a strong level cost more time to make than they take to send.
const FAST_LEVELS: [i32; 4] = [1, -1, -3, -7];
/// Plain segments step to a faster level when the sender spends less than this share of its
/// time waiting for the other end (the link waits for the compressor)...
const CPU_BOUND: f64 = 0.2;
/// ...and back to a stronger one above this share (the compressor waits for the link); in
/// between the level stays, so it does not swing segment by segment.
const WRITE_BOUND: f64 = 0.5;
/// Plain segments step to a faster level only while the sender's own work takes more than
/// this share of the wall time (not waiting for the application's bytes nor the other end)...
const SENDER_BUSY: f64 = 0.5;
/// ...and back to a stronger one below this share: the application, not the compressor,
/// sets the pace (a tar piped in over loopback on 2 cores: zstd -7 cost 45% more bytes than
/// -3 in the same time).
const SENDER_IDLE: f64 = 0.25;

/// How one segment travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    Dedup,
    Plain,
}

/// What one acknowledged segment cost the sender.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cost {
    /// Message bytes it carried.
    pub(crate) bytes: usize,
    /// Sender time spent on it, blocked writes excluded.
    pub(crate) cpu: Duration,
    /// Bytes of frames it put on the socket.
    pub(crate) wire: u64,
    /// Request/answer exchanges it took.
    pub(crate) round_trips: u32,
}

/// Decayed sums of what one way's segments cost.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    bytes: f64,
    /// CPU seconds plus the round trips' share of waiting.
    secs: f64,
    wire: f64,
    /// Seconds the receiver reported busy with them.
    recv: f64,
}

impl Sums {
    fn add(&mut self, bytes: usize, secs: Duration, wire: u64, recv: Duration) {
        self.bytes += bytes as f64;
        self.secs += secs.as_secs_f64().max(1e-6);
        self.wire += wire as f64;
        self.recv += recv.as_secs_f64();
    }

    fn decay(&mut self) {
        self.bytes *= KEEP;
        self.secs *= KEEP;
        self.wire *= KEEP;
        self.recv *= KEEP;
    }

    /// Message bytes per second: the sender's work, the receiver's and the link's draining
    /// of the wire bytes overlap (segments are pipelined), so the slowest sets the pace;
    /// but a peer a LAN away (or on this host) likely shares the sender's CPUs or is as
    /// loaded, so there both ends' work adds up (a dedup segment's receiver reads its hits
    /// and delta bases back and stores what is new: over loopback, as much system time as
    /// the sender's dedup work).
    fn rate(&self, link: f64, lan: bool) -> f64 {
        let work = if lan {
            self.secs + self.recv
        } else {
            self.secs.max(self.recv)
        };
        self.bytes / work.max(self.wire / link).max(1e-9)
    }
}

/// Acknowledgements kept to estimate the link's delivery rate.
const DELIVERIES: usize = 8;

#[derive(Debug)]
pub(crate) struct Adaptive {
    mode: Mode,
    dedup: Option<Sums>,
    plain: Option<Sums>,
    segments: u64,
    /// The current interval between probes, segments since the last one, and the way last
    /// chosen as the best.
    probe_every: u64,
    since_probe: u64,
    best: Option<Way>,
    rtt: Option<Duration>,
    /// When recent segments were acknowledged and their wire bytes: the rate at which the
    /// link (and the receiver behind it) takes bytes, which socket buffers hide from writes.
    deliveries: VecDeque<(Instant, u64)>,
    /// Decayed seconds of the sender's time within `send`, and of those spent waiting for
    /// the other end: blocked in writes, or reading while the window was full.
    total: f64,
    down: f64,
    /// Decayed seconds between sends: waiting for the application's bytes.
    input: f64,
    /// When the sender last left `send`.
    left: Option<Instant>,
    /// Decayed seconds the receiver reported busy with what it was sent.
    receiver: f64,
    /// The zstd levels plain segments may use, the configured one first; empty when the
    /// level does not adapt (another method, or a mode other than adaptive).
    ladder: Vec<i32>,
    /// The current level's place in `ladder`.
    rung: usize,
    /// The way last chosen is a sample: the first segments, or a probe of the way not chosen.
    sample: bool,
    /// The segment last chosen goes with dedup but also samples plain, dry.
    dry: bool,
    /// A plain segment has been acknowledged (plain's estimate is not only dry samples).
    plain_sent: bool,
    /// The link's rate as the prior had it (infinite: it did not limit), until measured.
    prior_link: Option<f64>,
    /// The link's delivery rate when it last limited sending: what plain segments would be
    /// sent at while dedup's few bytes leave the link idle. Without it, a LAN away at 100
    /// Mbit/s, plain priced at its CPU time alone looked faster than dedup, was sent, filled
    /// the link, lost, and was chosen again once dedup segments had stopped waiting (Django's
    /// releases: 20 MB on the wire against dedup mode's 2.5, and 1.6 times its time). A plain
    /// probe that did not wait for the link says nothing against it (a sample fits in the
    /// socket buffers); deliveries faster than it, waiting or not, raise it. The prior's link
    /// starts it.
    capacity: Option<f64>,
    /// Started from a prior, and the other way not probed yet.
    primed: bool,
    /// Each way's sums (dedup, plain) are still the prior's.
    from_prior: [bool; 2],
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
            deliveries: VecDeque::with_capacity(DELIVERIES + 1),
            total: 0.0,
            down: 0.0,
            input: 0.0,
            left: None,
            receiver: 0.0,
            ladder,
            rung: 0,
            sample: false,
            dry: false,
            plain_sent: false,
            prior_link: None,
            capacity: None,
            primed: false,
            from_prior: [false; 2],
        }
    }

    /// Starts from what an earlier connection measured, if nothing was measured yet; the
    /// connection's first measurement of a way replaces the prior's.
    pub(crate) fn prime(&mut self, prior: &Prior) {
        if self.mode != Mode::Adaptive || self.dedup.is_some() || self.plain.is_some() {
            return;
        }
        let sums = |p: PerByte| {
            // Any weight: only the ratios count until a measurement replaces them.
            let b = 1e6;
            Sums {
                bytes: b,
                secs: p.secs * b,
                wire: p.wire * b,
                recv: p.recv * b,
            }
        };
        self.dedup = Some(sums(prior.dedup));
        self.plain = Some(sums(prior.plain));
        self.prior_link = Some(prior.link.unwrap_or(f64::INFINITY));
        self.capacity = prior.link;
        self.rung = usize::from(prior.rung).min(self.ladder.len().saturating_sub(1));
        self.primed = true;
        self.from_prior = [true; 2];
    }

    /// What this connection measured, for the next one: once both ways and the link are
    /// known, and plain segments were sent (a plain estimate from dry samples alone rests on
    /// the link's rate as dedup's few bytes showed it: carried over, it made the next
    /// connection send Django's tars plain at 30 Mbit/s, 2.1 MB where dedup sends 0.5).
    pub(crate) fn prior(&self) -> Option<Prior> {
        let per_byte = |s: Sums| PerByte {
            secs: s.secs / s.bytes,
            wire: s.wire / s.bytes,
            recv: s.recv / s.bytes,
        };
        let (d, p) = (self.dedup?, self.plain?);
        let link = self.link()?;
        let sent = self.plain_sent && self.mode == Mode::Adaptive;
        (sent && d.bytes > 0.0 && p.bytes > 0.0).then(|| Prior {
            dedup: per_byte(d),
            plain: per_byte(p),
            link: link.is_finite().then_some(link),
            rung: u8::try_from(self.rung).unwrap_or(u8::MAX),
        })
    }

    /// The store key of the prior for this connection's distance, once the round trip is
    /// known.
    pub(crate) fn prior_key(&self) -> Option<&'static str> {
        self.rtt?;
        Some(if self.lan() {
            "adaptive-lan"
        } else {
            "adaptive-wan"
        })
    }

    /// The link's rate as it limits the estimates (infinite where it does not; see
    /// [`Adaptive::limiting`]), measured or else the prior's; `None` while unknown.
    fn link(&self) -> Option<f64> {
        self.link_rate()
            .map(|l| self.limiting(l))
            .or(self.prior_link)
    }

    /// The rate (wire bytes per second) at which the link limits the channel: infinite where
    /// the sender's pace, not the link, limits it; `None` while unknown.
    pub(crate) fn link_limit(&self) -> Option<f64> {
        self.link()
    }

    /// The zstd level for the next plain segment, when it adapts.
    pub(crate) fn plain_level(&self) -> Option<i32> {
        self.ladder.get(self.rung).copied()
    }

    /// Bytes per second the link has been taking, once enough segments were acknowledged.
    fn link_rate(&self) -> Option<f64> {
        let (first, last) = (self.deliveries.front()?, self.deliveries.back()?);
        let span = last.0.duration_since(first.0).as_secs_f64();
        if self.deliveries.len() < 3 {
            return None;
        }
        let bytes: u64 = self.deliveries.iter().skip(1).map(|d| d.1).sum();
        Some(bytes as f64 / span.max(1e-6))
    }

    /// `link` where the sender has been waiting for the other end; elsewhere the rate at
    /// which segments were acknowledged is the sender's own pace (which, for dedup segments,
    /// puts few bytes on the wire), not a limit, and the link's rate when it last limited
    /// applies ([`Adaptive::capacity`]), or none.
    fn limiting(&self, link: f64) -> f64 {
        if self.waits_for_link() {
            link
        } else {
            self.capacity.unwrap_or(f64::INFINITY)
        }
    }

    /// Whether the sender has been waiting for the other end, and not for the receiver's work.
    fn waits_for_link(&self) -> bool {
        self.down_share() > LINK_LIMITS && self.receiver < RECEIVER_BOUND * self.down
    }

    /// Whether the link's rate is still unknown (plain segments are then kept regardless).
    pub(crate) fn warming_up(&self) -> bool {
        self.link().is_none()
    }

    /// The share of the sender's time spent waiting for the other end.
    fn down_share(&self) -> f64 {
        self.down / self.total.max(1e-9)
    }

    /// How the next segment travels: a plain sample a WAN away goes with dedup, dry.
    ///
    /// Until a plain segment has been sent, plain's wire time is what the link's rate as
    /// dedup's deliveries show it makes of its dry samples' bytes: the first plain segments
    /// sent are short samples, so that a link that dedup's few bytes never filled costs little
    /// to find out about.
    pub(crate) fn choose(&mut self) -> Way {
        let way = self.pick();
        self.dry = false;
        if way == Way::Plain && self.mode == Mode::Adaptive && !self.lan() {
            if self.sample {
                self.dry = true;
                self.sample = false;
                return Way::Dedup;
            }
            self.sample = !self.plain_sent;
        }
        way
    }

    /// Whether the segment last chosen samples plain dry: see [`Adaptive::estimate_plain`].
    pub(crate) fn dry_plain(&self) -> bool {
        self.dry
    }

    fn pick(&mut self) -> Way {
        self.segments += 1;
        match self.mode {
            Mode::Dedup => Way::Dedup,
            Mode::Plain => Way::Plain,
            Mode::Adaptive => match (self.dedup, self.plain, self.link()) {
                (Some(d), Some(p), Some(link)) => {
                    let lan = self.lan();
                    let margin = if lan { 1.0 } else { PLAIN_MARGIN };
                    let best = if p.rate(link, lan) > d.rate(link, lan) * margin {
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
                    let every = if best == Way::Plain && self.link_bound() {
                        LINK_BOUND_PROBE_EVERY
                    } else {
                        self.probe_every
                    };
                    // A connection primed by a prior probes the other way at its second
                    // segment: the prior may be another data's or another peer's.
                    let early = self.primed && self.since_probe == 2;
                    self.sample = self.since_probe >= every || early;
                    self.primed &= !self.sample;
                    if self.sample {
                        self.since_probe = 0;
                        self.probe_every = (self.probe_every * 2).min(PROBE_EVERY_MAX);
                        other
                    } else {
                        best
                    }
                }
                _ => {
                    // A LAN away every segment samples. Further away dedup segments go
                    // whole: dedup cannot lose many bytes on a slow link, and plain is
                    // sampled dry there, so they carry the message (a short one costs
                    // its round trips: typescript's tar at 30 Mbit/s took six segments
                    // and 0.53 s instead of four and 0.44 s).
                    let way = if self.segments % 2 == 1 {
                        Way::Dedup
                    } else {
                        Way::Plain
                    };
                    self.sample = self.lan() || way == Way::Plain;
                    way
                }
            },
        }
    }

    /// Whether the peer is a LAN away (or on this host), by the shortest round trip seen.
    pub(crate) fn lan(&self) -> bool {
        self.rtt.is_some_and(|rtt| rtt < LAN_ROUND_TRIP)
    }

    /// Whether the way last chosen samples the channel (while both ways and the link are
    /// measured, or a probe): such a segment is short, so sampling the slower way costs little.
    pub(crate) fn sampling(&self) -> bool {
        self.sample
    }

    /// The sender spent `total` inside `send`, `down` of it waiting for the other end.
    pub(crate) fn account(&mut self, total: Duration, down: Duration) {
        let now = Instant::now();
        if let Some(left) = self.left {
            self.input += now
                .saturating_duration_since(left)
                .saturating_sub(total)
                .as_secs_f64();
        }
        self.left = Some(now);
        self.total += total.as_secs_f64();
        self.down += down.as_secs_f64().min(total.as_secs_f64());
    }

    /// Whether to index plain segments: the link, not the sender's CPU nor the receiver,
    /// bounds plain sending, so indexing costs no time (the link drains while it runs).
    ///
    /// Until the link's rate is known, plain segments are kept too: on a slow link, what the
    /// first segments carried is then a base for the rest; on a fast one, that costs the CPU
    /// of a few segments.
    pub(crate) fn link_bound(&self) -> bool {
        let Some(link) = self.link() else {
            return self.mode == Mode::Adaptive;
        };
        self.mode == Mode::Adaptive
            && self
                .plain
                .is_some_and(|p| p.wire / link > LINK_BOUND * p.secs)
    }

    /// A request was answered `rtt` after it was sent.
    pub(crate) fn round_trip(&mut self, rtt: Duration) {
        self.rtt = Some(self.rtt.map_or(rtt, |r| r.min(rtt)));
    }

    /// A segment sent `way` was acknowledged, having cost `cost` with `window` segments in
    /// flight, and the receiver reported `receiver` busy time with the acknowledgement.
    pub(crate) fn observe(&mut self, way: Way, cost: Cost, window: usize, receiver: Duration) {
        self.deliveries.push_back((Instant::now(), cost.wire));
        if self.deliveries.len() > DELIVERIES {
            self.deliveries.pop_front();
        }
        let waits = self.rtt.unwrap_or_default() * cost.round_trips / window.max(1) as u32;
        for sums in self.dedup.iter_mut().chain(self.plain.iter_mut()) {
            sums.decay();
        }
        self.total *= KEEP;
        self.down *= KEEP;
        self.input *= KEEP;
        self.receiver = self.receiver * KEEP + receiver.as_secs_f64();
        let slot = match way {
            Way::Dedup => &mut self.dedup,
            Way::Plain => &mut self.plain,
        };
        if std::mem::take(&mut self.from_prior[way as usize]) {
            *slot = None;
        }
        let sums = slot.get_or_insert_with(Sums::default);
        sums.add(cost.bytes, cost.cpu + waits, cost.wire, receiver);
        if let Some(rate) = self.link_rate() {
            if self.waits_for_link() {
                self.capacity = Some(rate);
            } else if let Some(c) = &mut self.capacity {
                *c = c.max(rate);
            }
        }
        if way == Way::Plain {
            self.plain_sent = true;
            let share = self.down_share();
            let busy = (self.total - self.down) / (self.total + self.input).max(1e-9);
            if share < CPU_BOUND && busy > SENDER_BUSY && self.rung + 1 < self.ladder.len() {
                self.rung += 1;
            } else if (share > WRITE_BOUND || busy < SENDER_IDLE) && self.rung > 0 {
                self.rung -= 1;
            }
        }
    }

    /// A dry plain sample: compressing `cost.bytes` of a segment took `cost.cpu` and would
    /// have put `cost.wire` bytes on the socket, and decompressing them took `unpack` here,
    /// standing for the receiver's work. It counts as a plain segment acknowledged, except
    /// that the link's rate and the zstd level learn nothing from it.
    pub(crate) fn estimate_plain(&mut self, cost: Cost, unpack: Duration) {
        if std::mem::take(&mut self.from_prior[Way::Plain as usize]) {
            self.plain = None;
        }
        let sums = self.plain.get_or_insert_with(Sums::default);
        sums.decay();
        sums.add(cost.bytes, cost.cpu, cost.wire, unpack);
    }

    /// The current estimates (dedup, plain), message bytes per second; 0 when not yet known.
    pub(crate) fn rates(&self) -> (f64, f64) {
        let link = self.link().unwrap_or(f64::INFINITY);
        let lan = self.lan();
        (
            self.dedup.map_or(0.0, |s| s.rate(link, lan)),
            self.plain.map_or(0.0, |s| s.rate(link, lan)),
        )
    }
}

/// One way's costs per message byte: sender seconds, wire bytes, receiver seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerByte {
    secs: f64,
    wire: f64,
    recv: f64,
}

/// What a connection's adaptive mode measured, kept in the sender's store (a note) for the
/// next connection as far away. The layout is in `crates/wire/FORMAT.md` ("Adaptive prior").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prior {
    dedup: PerByte,
    plain: PerByte,
    /// Bytes per second the link limited sending to; `None`: it did not limit.
    link: Option<f64>,
    /// The plain zstd level's place on the ladder.
    rung: u8,
}

/// The prior format this build writes and reads.
const PRIOR_VERSION: u8 = 1;
/// Bytes of an encoded prior: version, flags, rung, seven f64.
const PRIOR_LEN: usize = 3 + 7 * 8;
/// Flags bit 0: the link limited (its rate follows).
const PRIOR_LIMITED: u8 = 1;

impl Prior {
    /// The note that keeps it.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(PRIOR_LEN);
        b.push(PRIOR_VERSION);
        b.push(if self.link.is_some() {
            PRIOR_LIMITED
        } else {
            0
        });
        b.push(self.rung);
        for p in [self.dedup, self.plain] {
            for v in [p.secs, p.wire, p.recv] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b.extend_from_slice(&self.link.unwrap_or(0.0).to_le_bytes());
        b
    }

    /// The prior a note holds: `None` unless it is one this build writes, every figure finite
    /// and not negative (each way's seconds above zero, the link's rate too if it limited).
    pub fn decode(b: &[u8]) -> Option<Prior> {
        if b.len() != PRIOR_LEN || b[0] != PRIOR_VERSION || b[1] & !PRIOR_LIMITED != 0 {
            return None;
        }
        let f: Vec<f64> = b[3..]
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if f.iter().any(|v| !v.is_finite() || *v < 0.0) || f[0] <= 0.0 || f[3] <= 0.0 {
            return None;
        }
        let limited = b[1] & PRIOR_LIMITED != 0;
        if limited != (f[6] > 0.0) {
            return None;
        }
        let way = |i: usize| PerByte {
            secs: f[i],
            wire: f[i + 1],
            recv: f[i + 2],
        };
        Some(Prior {
            dedup: way(0),
            plain: way(3),
            link: limited.then_some(f[6]),
            rung: b[2],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::sleep;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn cost(bytes: usize, cpu: Duration, wire: u64, round_trips: u32) -> Cost {
        Cost {
            bytes,
            cpu,
            wire,
            round_trips,
        }
    }

    /// Acknowledges a segment sent `way` after `gap` of wall time.
    fn ack(a: &mut Adaptive, way: Way, c: Cost, gap: Duration) {
        sleep(gap);
        a.observe(way, c, 4, Duration::ZERO);
    }

    #[test]
    fn picks_the_faster_way_and_probes_the_other() {
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        assert_eq!(a.choose(), Way::Dedup);
        a.round_trip(ms(400));
        ack(&mut a, Way::Dedup, cost(1_000, ms(100), 100, 2), ms(0));
        assert_eq!(a.choose(), Way::Dedup);
        assert!(a.dry_plain(), "a WAN away, plain is sampled dry");
        for _ in 0..2 {
            ack(&mut a, Way::Plain, cost(1_000, ms(100), 500, 0), ms(2));
        }
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
        a.observe(
            Way::Dedup,
            cost(1_000_000, ms(1), 1_000, 0),
            4,
            Duration::ZERO,
        );
        assert_eq!(a.choose(), Way::Dedup, "a probe that wins flips the choice");
        a.observe(
            Way::Plain,
            cost(100_000_000, ms(1), 1_000, 0),
            4,
            Duration::ZERO,
        );
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
    fn the_first_segments_and_probes_are_samples() {
        let first_picks = |a: &mut Adaptive| -> Vec<(Way, bool, bool)> {
            (0..4)
                .map(|_| (a.choose(), a.sampling(), a.dry_plain()))
                .collect()
        };
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        a.round_trip(ms(40));
        assert_eq!(
            first_picks(&mut a),
            [
                (Way::Dedup, false, false),
                (Way::Dedup, false, true),
                (Way::Dedup, false, false),
                (Way::Dedup, false, true)
            ],
            "a WAN away, dedup segments go whole and plain is sampled dry"
        );
        let mut lan = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        lan.round_trip(Duration::from_micros(100));
        assert_eq!(
            first_picks(&mut lan),
            [
                (Way::Dedup, true, false),
                (Way::Plain, true, false),
                (Way::Dedup, true, false),
                (Way::Plain, true, false)
            ],
            "a LAN away, both ways are sampled for real"
        );
        for _ in 0..3 {
            a.account(ms(100), ms(1));
            a.observe(Way::Dedup, cost(1_000, ms(100), 100, 2), 4, Duration::ZERO);
            a.observe(Way::Plain, cost(1_000, ms(1), 500, 0), 4, Duration::ZERO);
        }
        let picks: Vec<(Way, bool)> = (0..PROBE_EVERY)
            .map(|_| (a.choose(), a.sampling()))
            .collect();
        assert!(
            picks
                .iter()
                .all(|&(way, sample)| sample == (way == Way::Dedup)),
            "only probes of the way not chosen are samples: {picks:?}"
        );
        assert!(picks.iter().any(|&(_, sample)| sample), "{picks:?}");
        let mut fixed = Adaptive::new(Mode::Dedup, Compression::Zstd(3));
        fixed.choose();
        assert!(!fixed.sampling(), "a fixed mode never samples");
    }

    #[test]
    fn a_slow_link_favours_the_way_with_fewer_wire_bytes() {
        // Plain costs less CPU, but its bytes take the link 20x longer than dedup's: the
        // delivery rate (acknowledged wire bytes over time), not the writes (which a socket
        // buffer absorbs), shows it.
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        for i in 0..6 {
            let way = a.choose();
            let c = match way {
                Way::Dedup => cost(8 << 20, ms(60), 50_000, 2),
                Way::Plain => cost(8 << 20, ms(20), 1_000_000, 0),
            };
            a.account(ms(50), ms(40));
            ack(&mut a, way, c, ms(if way == Way::Plain { 40 } else { 2 }));
            assert!(i < 5 || a.link_rate().is_some());
        }
        let ways: Vec<Way> = (0..8).map(|_| a.choose()).collect();
        assert!(
            ways.iter().filter(|w| **w == Way::Dedup).count() >= 7,
            "{ways:?}"
        );
        a.account(Duration::from_secs(10), ms(10));
        let limit = a.limiting(1.0);
        assert!(
            limit > 1.0,
            "a sender that hardly waits is not limited by its own pace"
        );
        assert_eq!(
            Some(limit),
            a.capacity,
            "but by the link's rate when it last limited"
        );
    }

    #[test]
    fn a_lan_away_a_slow_link_keeps_dedup_once_plain_has_filled_it() {
        // 100 Mbit/s a LAN away, scaled down: a plain segment's 160 KB take the link 16 ms,
        // against its 2 ms of CPU; dedup's 10 KB leave the link idle behind its 4 ms. Dedup
        // segments never wait for the link, so while they go, the delivery rate is their own
        // pace and no limit: plain must still be priced at the rate the link showed when
        // plain filled it, or it is chosen again whenever dedup has stopped waiting.
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        a.round_trip(Duration::from_micros(200));
        let mut ways = Vec::new();
        for _ in 0..60 {
            let way = a.choose();
            let part: u32 = if a.sampling() { 8 } else { 1 };
            let bytes = 1_000_000 / part as usize;
            let (c, took, down) = match way {
                Way::Dedup => (cost(bytes, ms(4) / part, 10_000, 1), 4, 0),
                Way::Plain => (
                    cost(bytes, ms(2) / part, 160_000 / u64::from(part), 0),
                    16,
                    14,
                ),
            };
            let (took, down) = (ms(took) / part, ms(down) / part);
            a.account(took, down);
            ack(&mut a, way, c, took);
            ways.push(way);
        }
        let plain = ways[20..].iter().filter(|w| **w == Way::Plain).count();
        assert!(plain <= 6, "plain beyond its probes: {ways:?}");
    }

    #[test]
    fn the_receivers_work_counts_and_adds_up_a_lan_away() {
        let choice = |rtt: Duration, dedup_receiver: u64| {
            let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
            a.round_trip(rtt);
            for _ in 0..3 {
                sleep(ms(1));
                let d = cost(1 << 20, ms(40), 1_000, 0);
                a.observe(Way::Dedup, d, 4, ms(dedup_receiver));
                sleep(ms(1));
                a.observe(Way::Plain, cost(1 << 20, ms(40), 1_000, 0), 4, ms(10));
            }
            a.choose()
        };
        let lan = Duration::from_micros(200);
        assert_eq!(
            choice(lan, 50),
            Way::Plain,
            "a LAN away, dedup's 90 ms against plain's 50"
        );
        assert_eq!(
            choice(ms(40), 50),
            Way::Dedup,
            "apart, the slower end sets the pace: 50 ms against 40, within the margin"
        );
        assert_eq!(
            choice(lan, 20),
            Way::Plain,
            "a LAN away, no margin for dedup: 60 ms against 50"
        );
        assert_eq!(choice(ms(40), 80), Way::Plain, "80 ms against 40");
    }

    #[test]
    fn dry_plain_samples_count_and_plain_starts_short_where_they_won() {
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        a.round_trip(ms(40));
        a.choose();
        // Dedup is slow here (CPU-bound, 8 MB/s) and plain's dry samples are fast: plain wins
        // on them alone, before any plain segment is sent.
        for _ in 0..3 {
            sleep(ms(1));
            a.observe(Way::Dedup, cost(1 << 20, ms(120), 1_000, 2), 4, ms(5));
            a.estimate_plain(cost(256 << 10, ms(2), 60_000, 0), ms(1));
        }
        assert!(a.link_rate().is_some());
        let (dedup, plain) = a.rates();
        assert!(plain > 10.0 * dedup, "{dedup} {plain}");
        assert_eq!(a.choose(), Way::Plain);
        assert!(
            a.sampling(),
            "the first plain segments sent are short samples"
        );
        assert!(!a.dry_plain());
        a.observe(Way::Plain, cost(256 << 10, ms(2), 60_000, 0), 4, ms(1));
        assert_eq!(a.choose(), Way::Plain);
        assert!(!a.sampling(), "once one is acknowledged, they go whole");
        let levels = a.ladder.clone();
        let mut b = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        for _ in 0..6 {
            b.account(ms(100), ms(1));
            b.estimate_plain(cost(8 << 20, ms(20), 1_000_000, 0), ms(1));
        }
        assert_eq!(
            b.plain_level(),
            Some(levels[0]),
            "dry samples move no level"
        );
        assert!(b.link_rate().is_none(), "nor the link's rate");
    }

    #[test]
    fn the_plain_level_follows_what_bounds_the_sender() {
        let plain = cost(8 << 20, ms(20), 1_000_000, 0);
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        assert_eq!(a.plain_level(), Some(3));
        let mut seen = Vec::new();
        for _ in 0..6 {
            a.account(ms(100), ms(1));
            a.observe(Way::Plain, plain, 4, Duration::ZERO);
            seen.push(a.plain_level().unwrap());
        }
        assert_eq!(
            seen,
            [1, -1, -3, -7, -7, -7],
            "CPU-bound: faster and faster"
        );
        for _ in 0..8 {
            a.account(ms(100), ms(90));
            ack(&mut a, Way::Plain, plain, ms(40));
        }
        assert_eq!(
            a.plain_level(),
            Some(3),
            "link-bound: back to the configured level"
        );
        assert!(a.link_bound(), "and plain segments are kept");
        let mut mid = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        for _ in 0..4 {
            mid.account(ms(100), ms(35));
            mid.observe(Way::Plain, plain, 4, Duration::ZERO);
        }
        assert_eq!(mid.plain_level(), Some(3), "in between, the level stays");
        let mut fed = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        for _ in 0..6 {
            fed.account(ms(100), ms(1));
            fed.observe(Way::Plain, plain, 4, Duration::ZERO);
        }
        assert_eq!(fed.plain_level(), Some(-7));
        for _ in 0..16 {
            sleep(ms(30));
            fed.account(ms(5), ms(1));
            fed.observe(Way::Plain, plain, 4, Duration::ZERO);
        }
        assert_eq!(
            fed.plain_level(),
            Some(3),
            "a sender waiting for its application's bytes is not CPU-bound"
        );
        let mut b = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        assert!(
            b.link_bound(),
            "plain segments are kept until the link is known"
        );
        for _ in 0..3 {
            b.account(ms(100), ms(90));
            ack(&mut b, Way::Plain, plain, ms(2));
            b.observe(Way::Plain, plain, 4, ms(80));
        }
        assert!(
            !b.link_bound(),
            "a busy receiver, not the link, held the writes"
        );
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

    fn lan_adaptive() -> Adaptive {
        let mut a = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        a.round_trip(Duration::from_micros(100));
        a
    }

    #[test]
    fn a_prior_skips_sampling_and_yields_to_what_the_connection_measures() {
        let mut first = lan_adaptive();
        assert_eq!(first.prior(), None, "nothing measured yet");
        // Plain three times as fast as dedup, the link not limiting.
        for _ in 0..6 {
            for (way, cpu) in [(Way::Dedup, ms(30)), (Way::Plain, ms(10))] {
                first.observe(way, cost(1 << 20, cpu, 1000, 0), 4, Duration::ZERO);
            }
        }
        let prior = first.prior().expect("both ways and the link measured");
        assert_eq!(prior.link, None);
        assert_eq!(first.prior_key(), Some("adaptive-lan"));

        let mut next = lan_adaptive();
        next.prime(&prior);
        assert!(!next.warming_up());
        assert_eq!(
            next.choose(),
            Way::Plain,
            "the prior's way first, no sampling"
        );
        assert_eq!(
            next.choose(),
            Way::Dedup,
            "the other way probed at the second segment"
        );
        let ways: Vec<Way> = (0..8).map(|_| next.choose()).collect();
        assert_eq!(ways, [Way::Plain; 8], "then probes as usual");
        // This connection finds dedup ten times as fast: its first sample replaces the prior.
        next.observe(Way::Dedup, cost(1 << 20, ms(1), 1000, 0), 4, ms(0));
        assert_eq!(next.choose(), Way::Dedup);

        let bound = Prior {
            dedup: PerByte {
                secs: 1e-6,
                wire: 0.5,
                recv: 0.0,
            },
            plain: PerByte {
                secs: 1e-8,
                wire: 0.5,
                recv: 0.0,
            },
            link: Some(1e6),
            ..prior
        };
        let mut limited = lan_adaptive();
        limited.prime(&bound);
        assert!(limited.link_bound());
        let ways: Vec<Way> = (0..2).map(|_| limited.choose()).collect();
        assert_eq!(
            ways,
            [Way::Plain, Way::Dedup],
            "link-bound, as the prior says"
        );

        let mut measured = lan_adaptive();
        measured.observe(Way::Dedup, cost(1 << 20, ms(1), 10, 0), 4, ms(0));
        measured.prime(&prior);
        assert_eq!(measured.plain.map(|p| p.bytes), None, "a prior only starts");
        let mut wan = Adaptive::new(Mode::Adaptive, Compression::Zstd(3));
        assert_eq!(wan.prior_key(), None, "distance unknown");
        wan.round_trip(ms(40));
        assert_eq!(wan.prior_key(), Some("adaptive-wan"));
        for _ in 0..4 {
            wan.observe(Way::Dedup, cost(1 << 20, ms(10), 1000, 2), 4, ms(0));
            wan.estimate_plain(cost(1 << 20, ms(2), 500_000, 0), ms(1));
        }
        assert!(wan.link().is_some());
        assert_eq!(wan.prior(), None, "plain only sampled dry: no prior");
    }

    fn arb_prior() -> impl Strategy<Value = Prior> {
        let f = || 1e-12f64..1e3;
        let way = move || {
            (f(), 0.0f64..10.0, 0.0f64..1.0).prop_map(|(secs, wire, recv)| PerByte {
                secs,
                wire,
                recv,
            })
        };
        (
            way(),
            way(),
            proptest::option::of(1.0f64..1e12),
            any::<u8>(),
        )
            .prop_map(|(dedup, plain, link, rung)| Prior {
                dedup,
                plain,
                link,
                rung,
            })
    }

    use proptest::prelude::*;

    proptest! {
        #[test]
        fn priors_round_trip(p in arb_prior()) {
            prop_assert_eq!(Prior::decode(&p.encode()), Some(p));
        }

        #[test]
        fn a_damaged_prior_is_none_or_sane(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Some(p) = Prior::decode(&b) {
                prop_assert!(p.dedup.secs > 0.0 && p.plain.secs > 0.0);
                prop_assert!(p.link.is_none_or(|l| l > 0.0 && l.is_finite()));
                prop_assert_eq!(Prior::decode(&p.encode()), Some(p));
            }
        }
    }
}
