//! Running a batch's independent jobs on every core.

use std::sync::{Mutex, OnceLock};

/// Threads that run the jobs at most: enough for every size of both exact runners and
/// similarity's parts at once, as when each job had a thread of its own.
const POOL_THREADS: usize = 8;

/// The pool's threads: one per core up to [`POOL_THREADS`]. More threads than cores gain
/// nothing, and rayon's idle threads spin (`sched_yield`) before they sleep: eight on two
/// cores made 125 000 such calls per run on the disk images, two 31 000.
fn pool_threads() -> usize {
    cores().clamp(2, POOL_THREADS)
}

/// The cores this process may use, asked once: the standard library reads the cgroup's CPU
/// quota from three files at each call (2 400 opens per run on the disk images when each batch
/// asked).
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The threads every [`run_all`] shares, started once: starting a thread per job (eight per
/// batch on disk images, 6 400 in all) cost a stack mapped, faulted in and unmapped each.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(pool_threads())
            .thread_name(|i| format!("dedupwire-job-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Runs every job and returns their results in order: the first on this thread, the others
/// on the shared pool's threads. Without a pool (no thread could be started) every job runs
/// on this thread, so a system out of threads slows the analysis down instead of stopping it.
pub fn run_all<R: Send>(jobs: Vec<impl FnOnce() -> R + Send>) -> Vec<R> {
    let slots: Vec<Mutex<Option<_>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let results: Vec<Mutex<Option<R>>> = slots.iter().map(|_| Mutex::new(None)).collect();
    let run = |k: usize| {
        let job = slots[k].lock().expect("no panics while held").take();
        if let Some(job) = job {
            let r = job();
            *results[k].lock().expect("no panics while held") = Some(r);
        }
    };
    match pool() {
        Some(pool) => pool.in_place_scope(|scope| {
            let run = &run;
            for k in 1..slots.len() {
                scope.spawn(move |_| run(k));
            }
            if !slots.is_empty() {
                run(0);
            }
        }),
        None => (0..slots.len()).for_each(run),
    }
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .expect("no panics while held")
                .expect("every job ran: a panic would have ended the scope")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order() {
        let jobs: Vec<_> = (0..9u64).map(|k| move || k * k).collect();
        assert_eq!(run_all(jobs), (0..9u64).map(|k| k * k).collect::<Vec<_>>());
        assert!(run_all(Vec::<fn() -> u8>::new()).is_empty());
    }

    #[test]
    fn jobs_run_at_once_on_the_pool() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::{Duration, Instant};
        // As many jobs as the pool's threads and the caller: each waits (up to ten seconds)
        // for all to have started, and they all see every one only if they run concurrently.
        let n = pool_threads() + 1;
        let started = AtomicUsize::new(0);
        let jobs: Vec<_> = (0..n)
            .map(|_| {
                let started = &started;
                move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    let t0 = Instant::now();
                    while started.load(Ordering::SeqCst) < n
                        && t0.elapsed() < Duration::from_secs(10)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    started.load(Ordering::SeqCst)
                }
            })
            .collect();
        assert_eq!(run_all(jobs), vec![n; n]);
    }
}
