//! How far a send's producer threads may read and encode ahead of the channel: a budget of
//! bytes held, which the file the channel is waiting for may exceed only by a little (its
//! next piece, or the whole of it when it holds nothing yet). One slow file (a big binary
//! being delta-encoded) then no longer idles the other producers, what they hold stays
//! bounded, and a file of any size streams through a bounded number of pieces.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

/// The shared budget: producers take from it; what they took comes back when its
/// [`Taken`] is dropped (by the channel side once sent, by the cache once kept).
pub(crate) struct Ahead {
    state: Mutex<State>,
    freed: Condvar,
    max: u64,
    /// What the awaited file may hold past the budget.
    pass: u64,
}

struct State {
    held: u64,
    /// Bytes held per file (position in sending order).
    by_file: HashMap<usize, u64>,
    /// Position (in sending order) of the file the channel waits for.
    next: usize,
    closed: bool,
}

/// Bytes taken from an [`Ahead`] for the file at one position, given back when dropped.
pub(crate) struct Taken<'a> {
    ahead: &'a Ahead,
    k: usize,
    bytes: u64,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.ahead.give(self.k, self.bytes);
    }
}

impl Ahead {
    /// A budget of `max` bytes, which the awaited file may exceed by `pass`.
    pub(crate) fn new(max: u64, pass: u64) -> Self {
        Ahead {
            state: Mutex::new(State {
                held: 0,
                by_file: HashMap::new(),
                next: 0,
                closed: false,
            }),
            freed: Condvar::new(),
            max,
            pass,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever a panicking holder did (plain counters).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `bytes` for the file at position `k`, waiting while they do not fit. The file the
    /// channel waits for passes when it holds nothing yet, or when what it holds stays within
    /// `pass`: what it holds reaches the channel without waiting for anything else, so it
    /// always comes back. `None` once closed: the channel side is gone.
    pub(crate) fn take(&self, k: usize, bytes: u64) -> Option<Taken<'_>> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return None;
            }
            let own = s.by_file.get(&k).copied().unwrap_or(0);
            let passes = k == s.next && (own == 0 || own + bytes <= self.pass);
            if passes || s.held + bytes <= self.max {
                break;
            }
            s = self.freed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.held += bytes;
        *s.by_file.entry(k).or_default() += bytes;
        Some(Taken {
            ahead: self,
            k,
            bytes,
        })
    }

    fn give(&self, k: usize, bytes: u64) {
        let mut s = self.lock();
        s.held = s.held.saturating_sub(bytes);
        if let Some(own) = s.by_file.get_mut(&k) {
            *own = own.saturating_sub(bytes);
            if *own == 0 {
                s.by_file.remove(&k);
            }
        }
        self.freed.notify_all();
    }

    /// The channel now waits for the file at position `k`.
    pub(crate) fn waiting_for(&self, k: usize) {
        self.lock().next = k;
        self.freed.notify_all();
    }

    /// Wakes every producer and fails their next [`Ahead::take`].
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.freed.notify_all();
    }

    #[cfg(test)]
    fn held(&self) -> u64 {
        self.lock().held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn the_awaited_file_passes_a_full_budget_and_others_wait() {
        let a = Ahead::new(100, 10);
        let one = a.take(1, 80).unwrap();
        // File 2 does not fit; file 0, the one awaited, does.
        let zero = a.take(0, 80).unwrap();
        let passed = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _two = a.take(2, 80).unwrap();
                passed.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!passed.load(Ordering::SeqCst), "took past the budget");
            drop(one);
            drop(zero);
        });
        assert!(passed.load(Ordering::SeqCst));
        assert_eq!(a.held(), 0);
    }

    #[test]
    fn the_awaited_file_holds_little_more_than_the_budget() {
        let a = Ahead::new(100, 30);
        let others = a.take(1, 100).unwrap();
        let first = a.take(0, 20).unwrap();
        let second = a.take(0, 10).unwrap();
        let passed = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _third = a.take(0, 10).unwrap();
                passed.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!passed.load(Ordering::SeqCst), "held past its allowance");
            drop(first);
        });
        assert!(passed.load(Ordering::SeqCst));
        drop((others, second));
        assert_eq!(a.held(), 0);
    }

    #[test]
    fn waiting_for_a_file_lets_it_through_and_close_wakes_everyone() {
        let a = Ahead::new(10, 0);
        let _zero = a.take(0, 10).unwrap();
        std::thread::scope(|s| {
            let third = s.spawn(|| a.take(3, 10).is_some());
            let second = s.spawn(|| a.take(1, 10).is_some());
            std::thread::sleep(Duration::from_millis(20));
            a.waiting_for(1);
            assert!(second.join().unwrap());
            a.close();
            assert!(!third.join().unwrap());
        });
    }
}
