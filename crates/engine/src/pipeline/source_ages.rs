//! How far back the encoder reached for its sources, and what each reach saved: from this, about
//! how much a smaller window would at most have lost, without encoding again.
//!
//! A window takes in every unit but references, so a smaller one, which turns some references
//! into literals, takes in at most every unit encoded. A source less than its size back in
//! bytes *encoded* (references included) is then still held there, and a unit whose best
//! source is held makes the same choice (the best of a set is the best of any subset holding
//! it); a unit whose source is not held finds another or none, losing at most what it saved.
//! Summing the savings of sources older than the smaller window thus estimates its output from
//! above. (Not a strict bound: a source that the smaller window itself had referenced rather
//! than taken in is held only as its older copy. A property test checks the estimate against
//! encoding again; on the Debian images it erred high at every window.)

/// Buckets of source age: bucket `k` holds ages in `(2^(k-1), 2^k]` bytes (bucket 0, age 1).
const BUCKETS: usize = 65;

/// Bytes saved by references and deltas, by the age of their source in powers of two: the
/// bytes encoded since the source's start (every unit, references too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceAges {
    saved: [u64; BUCKETS],
}

impl Default for SourceAges {
    fn default() -> Self {
        SourceAges {
            saved: [0; BUCKETS],
        }
    }
}

/// The bucket of `age`: the least `k` with `age <= 2^k`.
fn bucket(age: u64) -> usize {
    (u64::BITS - age.saturating_sub(1).leading_zeros()) as usize
}

impl SourceAges {
    /// Records `saved` bytes owed to a source `age` bytes encoded back.
    pub fn record(&mut self, age: u64, saved: u64) {
        self.saved[bucket(age)] += saved;
    }

    /// Bytes saved by sources more than `window` bytes encoded back, which a window of that
    /// size would have dropped had it taken in every unit since: every bucket that reaches past
    /// `window` counts whole, so this errs high.
    pub fn saved_beyond(&self, window: u64) -> u64 {
        self.saved[bucket(window.saturating_add(1))..].iter().sum()
    }

    /// Bytes saved in all, at any age.
    pub fn saved(&self) -> u64 {
        self.saved.iter().sum()
    }

    /// Adds `other`'s savings to these.
    pub fn add(&mut self, other: &SourceAges) {
        for (a, b) in self.saved.iter_mut().zip(&other.saved) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_closed_above() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(2), 1);
        assert_eq!(bucket(3), 2);
        assert_eq!(bucket(4), 2);
        assert_eq!(bucket(5), 3);
        assert_eq!(bucket(1 << 30), 30);
        assert_eq!(bucket((1 << 30) + 1), 31);
        assert_eq!(bucket(u64::MAX), 64);
    }

    #[test]
    fn a_window_loses_at_most_what_sources_older_than_it_saved() {
        let mut a = SourceAges::default();
        a.record(1 << 20, 100);
        a.record(3 << 20, 10);
        a.record(1 << 30, 1);
        assert_eq!(a.saved(), 111);
        assert_eq!(a.saved_beyond(1 << 30), 0);
        assert_eq!(a.saved_beyond(4 << 20), 1);
        // 3 MiB shares the (2 MiB, 4 MiB] bucket: counted as lost from 2 MiB on.
        assert_eq!(a.saved_beyond(3 << 20), 11);
        assert_eq!(a.saved_beyond(2 << 20), 11);
        assert_eq!(a.saved_beyond(1 << 20), 11);
        assert_eq!(a.saved_beyond((1 << 20) - 1), 111);
        assert_eq!(a.saved_beyond(0), 111);
        let mut b = SourceAges::default();
        b.record(5, 7);
        b.add(&a);
        assert_eq!(b.saved(), 118);
        assert_eq!(b.saved_beyond(4), 118);
        assert_eq!(b.saved_beyond(8), 111);
    }
}
