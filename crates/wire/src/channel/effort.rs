//! Whether an optional squeeze of the sender's (zstd deltas) pays on this link.
//!
//! A zstd delta is tried on top of the copy/insert delta; on changed tar members it saves a
//! few percent of the bytes for about a tenth more of the sender's time. Where the link sets
//! the pace (the sender waits for it), that time is hidden under the link's and the bytes
//! are worth having; where the sender sets the pace (over loopback, on a fast LAN), the bytes
//! cost no time and the squeeze only slows the channel down. The gate keeps the squeeze on
//! while the link limits the channel or its rate is unknown, and as long as it saves
//! anything (decayed, so that it follows the data); otherwise one candidate in
//! [`PROBE_EVERY`] is still tried, so the gate sees when the data or the link changes.

/// Attempts measured before the gate may close.
const LEARN: u32 = 16;
/// While closed, one candidate in this many is still tried.
const PROBE_EVERY: u32 = 32;
/// Weight each attempt's figures keep per later attempt.
const KEEP: f64 = 0.97;

/// What one optional squeeze has been saving.
#[derive(Debug, Default)]
pub(crate) struct Effort {
    /// Decayed bytes saved.
    saved: f64,
    attempts: u32,
    skipped: u32,
}

impl Effort {
    /// Whether to try the squeeze on the next candidate, given the rate (bytes per second) at
    /// which the link limits the channel: `None` while unknown, infinite where the link does
    /// not limit it (the sender's pace does).
    pub(crate) fn pays(&mut self, link: Option<f64>) -> bool {
        let open = self.attempts < LEARN || (link.is_none_or(f64::is_finite) && self.saved >= 1.0);
        if open {
            self.skipped = 0;
            return true;
        }
        self.skipped += 1;
        if self.skipped >= PROBE_EVERY {
            self.skipped = 0;
            return true;
        }
        false
    }

    /// An attempt saved `saved` bytes (0 when its result was not used).
    pub(crate) fn record(&mut self, saved: usize) {
        self.saved = self.saved * KEEP + saved as f64;
        self.attempts = self.attempts.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `n` candidates where each attempt saves `saved` bytes; returns how many were
    /// attempted.
    fn run(e: &mut Effort, link: Option<f64>, n: u32, saved: usize) -> u32 {
        let mut tried = 0;
        for _ in 0..n {
            if e.pays(link) {
                tried += 1;
                e.record(saved);
            }
        }
        tried
    }

    #[test]
    fn the_squeeze_stays_on_while_the_link_sets_the_pace_or_is_not_known_yet() {
        let mut slow = Effort::default();
        assert_eq!(run(&mut slow, Some(3e6 / 8.0), 500, 1000), 500);
        let mut fast = Effort::default();
        assert_eq!(run(&mut fast, Some(1e9), 500, 1000), 500);
        let mut unknown = Effort::default();
        assert_eq!(run(&mut unknown, None, 500, 1000), 500);
    }

    #[test]
    fn where_the_sender_sets_the_pace_it_is_probed_only_and_comes_back_when_the_link_limits() {
        let mut e = Effort::default();
        let tried = run(&mut e, Some(f64::INFINITY), 640, 1000);
        assert_eq!(tried, LEARN + (640 - LEARN) / PROBE_EVERY);
        assert_eq!(run(&mut e, Some(1e6), 100, 1000), 100);
    }

    #[test]
    fn a_squeeze_that_saves_nothing_closes_even_on_a_slow_link() {
        let mut e = Effort::default();
        let tried = run(&mut e, Some(1e5), 640, 0);
        assert_eq!(tried, LEARN + (640 - LEARN) / PROBE_EVERY);
        // Once it saves again, the next probe reopens it.
        let tried = run(&mut e, Some(1e5), 100, 1000);
        assert!(tried > 60, "{tried} tried once it saves");
    }
}
