//! How far a send's producer threads may read and encode ahead of the channel: a budget of
//! bytes held, which the file the channel is waiting for always passes. One slow file (a
//! big binary being delta-encoded) then no longer idles the other producers, and what they
//! hold stays bounded.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The shared budget: producers take from it, the channel side gives back.
pub(crate) struct Ahead {
    state: Mutex<State>,
    freed: Condvar,
    max: u64,
}

struct State {
    held: u64,
    /// Position (in sending order) of the file the channel waits for.
    next: usize,
    closed: bool,
}

impl Ahead {
    /// A budget of `max` bytes.
    pub(crate) fn new(max: u64) -> Self {
        Ahead {
            state: Mutex::new(State {
                held: 0,
                next: 0,
                closed: false,
            }),
            freed: Condvar::new(),
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever a panicking holder did (plain counters).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `bytes` for the file at position `k`, waiting while they do not fit unless it
    /// is the file the channel waits for. False once closed: the channel side is gone.
    pub(crate) fn take(&self, k: usize, bytes: u64) -> bool {
        let mut s = self.lock();
        while !s.closed && k != s.next && s.held + bytes > self.max {
            s = self.freed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.held += bytes;
        !s.closed
    }

    /// Gives back `bytes` the channel side has sent.
    pub(crate) fn give(&self, bytes: u64) {
        let mut s = self.lock();
        s.held = s.held.saturating_sub(bytes);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn the_awaited_file_passes_a_full_budget_and_others_wait() {
        let a = Ahead::new(100);
        assert!(a.take(1, 80));
        // File 2 does not fit; file 0, the one awaited, does.
        assert!(a.take(0, 80));
        let passed = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(a.take(2, 80));
                passed.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!passed.load(Ordering::SeqCst), "took past the budget");
            a.give(80);
            a.give(80);
        });
        assert!(passed.load(Ordering::SeqCst));
    }

    #[test]
    fn waiting_for_a_file_lets_it_through_and_close_wakes_everyone() {
        let a = Ahead::new(10);
        assert!(a.take(0, 10));
        std::thread::scope(|s| {
            let third = s.spawn(|| a.take(3, 10));
            let second = s.spawn(|| a.take(1, 10));
            std::thread::sleep(Duration::from_millis(20));
            a.waiting_for(1);
            assert!(second.join().unwrap());
            a.close();
            assert!(!third.join().unwrap());
        });
    }
}
