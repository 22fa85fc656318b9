//! CPU time: per thread, so each method is charged for its own work only; for the whole process; and the machine's busy share.

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

/// The whole machine's idle and total CPU time so far, in clock ticks, from `/proc/stat`
/// (idle and iowait count as idle; `None` where it cannot be read).
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    // Guest time is already counted in user time.
    let total = ticks.iter().take(8).sum();
    Some((idle, total))
}

/// The share of the machine's CPU time busy between two [`machine_ticks`] readings, with
/// whatever work (`None` if either is missing or no time passed).
pub fn machine_busy(from: Option<(u64, u64)>, to: Option<(u64, u64)>) -> Option<f64> {
    let ((idle0, total0), (idle1, total1)) = (from?, to?);
    let total = total1.checked_sub(total0).filter(|&t| t > 0)?;
    let idle = idle1.saturating_sub(idle0).min(total);
    Some(1.0 - idle as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_is_busy_between_readings_by_what_was_not_idle() {
        assert_eq!(
            machine_busy(Some((100, 1000)), Some((130, 1200))),
            Some(0.85)
        );
        assert_eq!(machine_busy(Some((100, 1000)), Some((100, 1000))), None);
        assert_eq!(machine_busy(None, Some((100, 1000))), None);
        #[cfg(target_os = "linux")]
        {
            let (idle, total) = machine_ticks().expect("/proc/stat on Linux");
            assert!(idle <= total && total > 0);
        }
    }
}
