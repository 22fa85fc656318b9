//! The window of recent units both sides keep, evicted oldest-first by bytes.

use std::collections::VecDeque;

/// Units numbered from 0 in arrival order; those still held are `first..next`.
#[derive(Debug, Default)]
pub(super) struct Window {
    units: VecDeque<Vec<u8>>,
    first: u64,
    bytes: u64,
    limit: u64,
}

impl Window {
    pub(super) fn new(limit: u64) -> Self {
        Window {
            limit,
            ..Default::default()
        }
    }

    /// The id the next pushed unit gets.
    pub(super) fn next_id(&self) -> u64 {
        self.first + self.units.len() as u64
    }

    /// The unit `id`, if still held.
    pub(super) fn get(&self, id: u64) -> Option<&[u8]> {
        let i = id.checked_sub(self.first)?;
        self.units.get(usize::try_from(i).ok()?).map(Vec::as_slice)
    }

    /// Appends a unit, then evicts the oldest until the window fits its limit (keeping the newest).
    pub(super) fn push(&mut self, unit: Vec<u8>) -> u64 {
        let id = self.next_id();
        self.bytes += unit.len() as u64;
        self.units.push_back(unit);
        while self.bytes > self.limit && self.units.len() > 1 {
            let old = self.units.pop_front().expect("non-empty");
            self.bytes -= old.len() as u64;
            self.first += 1;
        }
        id
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}
