//! Jobs over a list of items on a few threads, for the file system work of a send or a
//! receive (hashing a tree, copying files into staging): on trees of many small files the
//! system calls, not the bytes, cost, and they overlap across threads.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use crate::error::Result;

/// Runs `work(k)` for every `k < count` on up to `max_threads` threads (the calling thread
/// among them; one more thread per `per_thread` items), calling `after_each` on the calling
/// thread after each of its items. Returns each item's result by index, or the error of
/// the first item (by index) that failed, which stops the rest.
pub(crate) fn for_each<T: Send>(
    count: usize,
    max_threads: usize,
    per_thread: usize,
    work: impl Fn(usize) -> Result<T> + Sync,
    after_each: &mut dyn FnMut(),
) -> Result<Vec<T>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, max_threads.max(1))
        .min(count.div_ceil(per_thread.max(1)).max(1));
    let next = AtomicUsize::new(0);
    let failed = Mutex::new(None);
    let run = |after_each: &mut dyn FnMut()| {
        let mut done = Vec::new();
        loop {
            let k = next.fetch_add(1, Relaxed);
            if k >= count {
                return done;
            }
            match work(k) {
                Ok(v) => done.push((k, v)),
                Err(e) => {
                    let mut f = failed.lock().unwrap_or_else(|e| e.into_inner());
                    if f.as_ref().is_none_or(|(j, _)| k < *j) {
                        *f = Some((k, e));
                    }
                    next.store(count, Relaxed);
                }
            }
            after_each();
        }
    };
    let mut done = Vec::with_capacity(count);
    std::thread::scope(|scope| {
        let others: Vec<_> = (1..threads)
            .map(|_| scope.spawn(|| run(&mut || {})))
            .collect();
        done.extend(run(after_each));
        for o in others {
            done.extend(o.join().expect("a job does not panic"));
        }
    });
    if let Some((_, e)) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    done.sort_unstable_by_key(|(k, _)| *k);
    Ok(done.into_iter().map(|(_, v)| v).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn every_item_runs_once_and_results_come_in_order() {
        let mut calls = 0;
        let got = for_each(1000, 4, 1, |k| Ok(k * 2), &mut || calls += 1).unwrap();
        assert_eq!(got, (0..1000).map(|k| k * 2).collect::<Vec<_>>());
        assert!(calls <= 1000);
    }

    #[test]
    fn the_first_failing_item_is_the_error() {
        let r = for_each(
            500,
            4,
            1,
            |k| match k {
                100 | 300 => Err(Error::Mismatch(format!("item {k}"))),
                _ => Ok(()),
            },
            &mut || {},
        );
        let e = r.unwrap_err().to_string();
        assert!(e == "item 100" || e == "item 300", "{e}");
        let r = for_each(
            3,
            1,
            1,
            |k| {
                if k == 0 {
                    Err(Error::Mismatch("first".into()))
                } else {
                    Ok(())
                }
            },
            &mut || {},
        );
        assert_eq!(r.unwrap_err().to_string(), "first");
    }
}
