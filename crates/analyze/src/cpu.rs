//! Per-thread CPU time, so each method is charged for its own work only.

/// CPU seconds this thread has used so far.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_THREAD_CPUTIME_ID is supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Runs `f` and adds the CPU seconds it used to `acc`.
pub fn charge<T>(acc: &mut f64, f: impl FnOnce() -> T) -> T {
    let t0 = thread_cpu_seconds();
    let out = f();
    *acc += thread_cpu_seconds() - t0;
    out
}
