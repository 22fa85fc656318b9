//! Spreads a segment's pure per-chunk work (cutting, chunk ids, super-features) over the
//! machine's cores.
//!
//! Everything else a sender does is ordered (index lookups, delta bases, frames), so it stays
//! on the channel's thread; these steps depend only on a chunk's bytes and were a third of a
//! dedup sender's time on Django's tar. Work is split into contiguous parts, one per core, the
//! first on the calling thread; a part must carry [`MIN_PART`] bytes, so small segments never
//! pay for a thread.

use std::num::NonZeroUsize;
use std::sync::OnceLock;

/// Bytes of input below which a part is not worth a thread of its own (spawning one costs
/// tens of microseconds; hashing and cutting 1 MiB, about a millisecond).
pub(crate) const MIN_PART: usize = 1 << 20;

/// Threads worth using: the cores this process may run on.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map(NonZeroUsize::get)
            .unwrap_or(1)
    })
}

/// `f` applied to every item of `items` (whose work is about `bytes` bytes of input in all),
/// in order, each part of the items on its own thread.
pub(crate) fn map<I, T, F>(items: &[I], bytes: usize, f: F) -> Vec<T>
where
    I: Sync,
    T: Send,
    F: Fn(&I) -> T + Sync,
{
    map_parts(items, bytes, |part| part.iter().map(&f).collect())
}

/// Like [`map`], where each item yields any number of results (concatenated in order).
pub(crate) fn flat_map<I, T, F>(items: &[I], bytes: usize, f: F) -> Vec<T>
where
    I: Sync,
    T: Send,
    F: Fn(&I, &mut Vec<T>) + Sync,
{
    map_parts(items, bytes, |part| {
        let mut out = Vec::new();
        for item in part {
            f(item, &mut out);
        }
        out
    })
}

fn map_parts<I, T, F>(items: &[I], bytes: usize, f: F) -> Vec<T>
where
    I: Sync,
    T: Send,
    F: Fn(&[I]) -> Vec<T> + Sync,
{
    let parts = cores().min(bytes / MIN_PART).min(items.len()).max(1);
    if parts == 1 {
        return f(items);
    }
    let per = items.len().div_ceil(parts);
    let mut chunks = items.chunks(per);
    let first = chunks.next().unwrap_or(&[]);
    std::thread::scope(|scope| {
        let others: Vec<_> = chunks.map(|c| scope.spawn(|| f(c))).collect();
        let mut out = f(first);
        for h in others {
            match h.join() {
                Ok(mut v) => out.append(&mut v),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_however_the_work_is_split() {
        let items: Vec<u32> = (0..1000).collect();
        for bytes in [0, MIN_PART, 3 * MIN_PART, 64 * MIN_PART] {
            assert_eq!(
                map(&items, bytes, |x| x * 2),
                (0..1000).map(|x| x * 2).collect::<Vec<_>>()
            );
            let flat = flat_map(&items, bytes, |&x, out| out.extend([x, x]));
            assert_eq!(flat, (0..1000).flat_map(|x| [x, x]).collect::<Vec<_>>());
        }
        assert!(map(&[] as &[u32], 64 * MIN_PART, |x| *x).is_empty());
        assert_eq!(map(&[7u32], 64 * MIN_PART, |x| *x), vec![7]);
    }
}
