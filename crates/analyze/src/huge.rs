//! Transparent huge pages for large tables and buffers, where the kernel offers them on request
//! (`/sys/kernel/mm/transparent_hugepage/enabled` set to `madvise`, the usual default).

/// Bytes in a huge page on x86-64 and most arm64 kernels.
const HUGE: usize = 2 << 20;

/// Asks for huge pages over the 2 MiB-aligned part of `len` bytes at `ptr`, before they are
/// first written; a hint only, so a refusal changes nothing.
pub fn advise(ptr: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside an allocation the caller owns; MADV_HUGEPAGE
            // changes no contents and no mapping's validity.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}
