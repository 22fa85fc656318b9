//! CPU time: per thread, so each method is charged for its own work only, and for the whole process.

/// CPU seconds this thread has used so far.
pub fn thread_cpu_seconds() -> f64 {
    clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Runs `f` and adds the CPU seconds it used to `acc`.
pub fn charge<T>(acc: &mut f64, f: impl FnOnce() -> T) -> T {
    let t0 = thread_cpu_seconds();
    let out = f();
    *acc += thread_cpu_seconds() - t0;
    out
}

/// CPU seconds this process has used so far, all its threads together.
pub fn process_cpu_seconds() -> f64 {
    clock_seconds(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Seconds on the CPU-time `clock` (0 where it cannot be read).
fn clock_seconds(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; an unsupported clock returns an error.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
