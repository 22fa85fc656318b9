//! Running a batch's independent jobs on every core.

use std::sync::Mutex;

/// Runs every job and returns their results in order: the first on this thread, each other
/// on a scoped thread of its own. A job whose thread cannot be started runs on this thread,
/// so a system out of threads slows the analysis down instead of stopping it.
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
    std::thread::scope(|scope| {
        let run = &run;
        for k in 1..slots.len() {
            if std::thread::Builder::new()
                .spawn_scoped(scope, move || run(k))
                .is_err()
            {
                run(k);
            }
        }
        if !slots.is_empty() {
            run(0);
        }
    });
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
}
