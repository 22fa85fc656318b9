//! Hints to the CPU's caches, for the passes whose next reads are known before the hardware
//! can guess them.

/// Asks the CPU to fetch the cache line holding `data[at]`; `at` may be out of bounds.
#[inline(always)]
pub(crate) fn prefetch<T>(data: &[T], at: usize) {
    let p = data.as_ptr().wrapping_add(at);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no visible effect, whatever
    // the address (the pointer is never dereferenced).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
