//! What windows a half, a quarter, an eighth and a sixteenth as large would have lost, counted
//! alongside the encoder's own window in the same pass, so a user can size a receiver's memory
//! without encoding again.
//!
//! Each smaller window is followed as the bytes it would have taken in: every literal and delta
//! (a window takes those in whatever their source), and every reference whose source it no
//! longer held (which it would have sent as a literal). A reference or delta whose source lies
//! within a smaller window makes the same choice there, as the best candidate of a set is the
//! best of any subset that holds it; one whose source does not finds another source or none, so
//! that window loses at most what it saved. The estimate errs high: a smaller window would also
//! reference the copies it took in itself, which lie nearer than the sources counted here.

use std::collections::VecDeque;

/// How many smaller windows are followed: a half, a quarter, an eighth and a sixteenth.
pub const SMALLER: usize = 4;

/// The smaller windows of one encoder, and what each would have lost.
#[derive(Debug, Clone)]
pub struct SmallerWindows {
    limits: [u64; SMALLER],
    /// Bytes each smaller window would have taken in so far.
    taken: [u64; SMALLER],
    /// Where each unit of the encoder's window starts in what each smaller window took in; the
    /// front is unit `first`.
    starts: VecDeque<[u64; SMALLER]>,
    first: u64,
    lost: [u64; SMALLER],
}

impl SmallerWindows {
    /// The smaller windows of a window of `window` bytes.
    pub(super) fn new(window: u64) -> Self {
        SmallerWindows {
            limits: std::array::from_fn(|k| window >> (k + 1)),
            taken: [0; SMALLER],
            starts: VecDeque::new(),
            first: 0,
            lost: [0; SMALLER],
        }
    }

    /// The encoder's window took in unit `id` of `len` bytes, as every smaller one does.
    pub(super) fn take_in(&mut self, id: u64, len: usize) {
        debug_assert_eq!(id, self.first + self.starts.len() as u64);
        self.starts.push_back(self.taken);
        for t in &mut self.taken {
            *t += len as u64;
        }
    }

    /// The encoder's window holds units from `first` on.
    pub(super) fn hold_from(&mut self, first: u64) {
        while self.first < first && self.starts.pop_front().is_some() {
            self.first += 1;
        }
    }

    /// A unit of `len` bytes referenced held unit `id`, saving `saved` bytes: a smaller window
    /// that no longer held `id` takes the unit in as a literal.
    pub(super) fn referenced(&mut self, id: u64, len: usize, saved: u64) {
        let beyond = self.beyond(id);
        for k in (0..SMALLER).filter(|&k| beyond[k]) {
            self.lost[k] += saved;
            self.taken[k] += len as u64;
        }
    }

    /// A unit was sent as a delta against held unit `id`, saving `saved` bytes (every window
    /// takes the unit in either way).
    pub(super) fn delta(&mut self, id: u64, saved: u64) {
        let beyond = self.beyond(id);
        for k in (0..SMALLER).filter(|&k| beyond[k]) {
            self.lost[k] += saved;
        }
    }

    /// Which smaller windows no longer hold unit `id`.
    fn beyond(&self, id: u64) -> [bool; SMALLER] {
        let start = id
            .checked_sub(self.first)
            .and_then(|i| self.starts.get(usize::try_from(i).ok()?));
        std::array::from_fn(|k| start.is_some_and(|s| self.taken[k] - s[k] > self.limits[k]))
    }

    /// Each smaller window's size and the bytes it would have lost (at most, about).
    pub fn lost(&self) -> [(u64, u64); SMALLER] {
        std::array::from_fn(|k| (self.limits[k], self.lost[k]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_too_old_for_a_smaller_window_is_lost_and_taken_in_there() {
        let mut w = SmallerWindows::new(64);
        let windows: Vec<u64> = w.lost().iter().map(|l| l.0).collect();
        assert_eq!(windows, [32, 16, 8, 4]);
        w.take_in(0, 10);
        w.take_in(1, 10);
        // Unit 0 is 20 bytes back: held by the 32-byte window only.
        w.referenced(0, 10, 9);
        assert_eq!(w.lost(), [(32, 0), (16, 9), (8, 9), (4, 9)]);
        // The smaller windows took the reference in as a literal, so unit 1 is now 20 bytes
        // back for them, 10 for the 32-byte window.
        w.delta(1, 5);
        assert_eq!(w.lost(), [(32, 0), (16, 14), (8, 14), (4, 14)]);
        w.take_in(2, 4);
        w.hold_from(1);
        w.referenced(0, 10, 9);
        assert_eq!(
            w.lost(),
            [(32, 0), (16, 14), (8, 14), (4, 14)],
            "unit 0 is gone"
        );
        w.referenced(2, 4, 3);
        assert_eq!(
            w.lost(),
            [(32, 0), (16, 14), (8, 14), (4, 14)],
            "4 bytes back"
        );
    }
}
