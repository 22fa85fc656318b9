//! The adaptive mode: per segment, dedup or plain, whichever has delivered message bytes faster
//! on this connection.
//!
//! The model is measured, not predicted: each acknowledged segment yields a goodput sample,
//! its message bytes over the time since the previous acknowledgement (or its own start, if
//! later), which folds in everything dedup costs (chunking, hashing, round trips, deltas) and
//! everything it saves (bytes on a slow link), at the redundancy this connection actually
//! sees. Per way, bytes and seconds are summed with a decay of `KEEP` (0.75) per sample and the
//! estimate is their ratio (segments acknowledged in a burst would skew an average of rates). Until both ways have a sample, segments
//! alternate between them, dedup first; after that the faster way is used and the other is probed every
//! [`PROBE_EVERY`] segments, so a change in link speed or in redundancy is noticed.

use std::time::Instant;

use super::config::Mode;

/// One segment in this many is sent the other way, to keep its estimate fresh.
pub const PROBE_EVERY: u64 = 8;
/// How much of the past each new sample keeps in the decayed sums.
const KEEP: f64 = 0.75;

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
    last_ack: Option<Instant>,
}

impl Adaptive {
    pub(crate) fn new(mode: Mode) -> Self {
        Adaptive {
            mode,
            dedup: None,
            plain: None,
            segments: 0,
            last_ack: None,
        }
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
                    let best = if d >= p { Way::Dedup } else { Way::Plain };
                    let other = if best == Way::Dedup {
                        Way::Plain
                    } else {
                        Way::Dedup
                    };
                    if self.segments % PROBE_EVERY == 0 {
                        other
                    } else {
                        best
                    }
                }
            },
        }
    }

    /// A segment of `bytes` message bytes sent `way`, started at `started`, is acknowledged now.
    pub(crate) fn observe(&mut self, way: Way, bytes: usize, started: Instant, now: Instant) {
        let from = match self.last_ack {
            Some(t) if t > started => t,
            _ => started,
        };
        self.last_ack = Some(now);
        let secs = now.duration_since(from).as_secs_f64().max(1e-6);
        let slot = match way {
            Way::Dedup => &mut self.dedup,
            Way::Plain => &mut self.plain,
        };
        let (b, t) = slot.unwrap_or((0.0, 0.0));
        *slot = Some((b * KEEP + bytes as f64, t * KEEP + secs));
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
        let mut a = Adaptive::new(Mode::Adaptive);
        let t0 = Instant::now();
        assert_eq!(a.choose(), Way::Dedup);
        a.observe(Way::Dedup, 1_000, t0, t0 + Duration::from_secs(1));
        assert_eq!(a.choose(), Way::Plain);
        a.observe(Way::Plain, 1_000, t0, t0 + Duration::from_millis(1100));
        let ways: Vec<Way> = (0..16).map(|_| a.choose()).collect();
        assert!(
            ways.iter().filter(|w| **w == Way::Plain).count() >= 14,
            "{ways:?}"
        );
        assert!(ways.contains(&Way::Dedup), "probes dedup: {ways:?}");
        assert_eq!(Adaptive::new(Mode::Plain).choose(), Way::Plain);
    }
}
