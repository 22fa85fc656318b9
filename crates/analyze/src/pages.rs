//! Page hints for large tables and buffers: transparent huge pages where the kernel offers
//! them on request (`/sys/kernel/mm/transparent_hugepage/enabled` set to `madvise`, the usual
//! default), and mapping a buffer's pages in at once instead of one fault at a time.

/// Bytes in a huge page on x86-64 and most arm64 kernels.
const HUGE: usize = 2 << 20;

/// Bytes in a base page; a smaller page size only leaves some pages to fault in.
const PAGE: usize = 4 << 10;

/// Asks for huge pages over the 2 MiB-aligned part of `len` bytes at `ptr`, before they are
/// first written; a hint only, so a refusal changes nothing.
pub fn advise_huge(ptr: *mut u8, len: usize) {
    advise(ptr, len, HUGE, Advice::Huge);
}

/// Maps in the pages wholly inside the `len` bytes at `ptr` (an allocation the caller owns)
/// with one system call (Linux 5.14 on), where a fault per page would cost the kernel
/// several times as much; a hint only, so a refusal (an older kernel) leaves the pages to
/// fault in as they are first written. It changes no byte.
pub fn populate(ptr: *mut u8, len: usize) {
    advise(ptr, len, PAGE, Advice::Populate);
}

enum Advice {
    Huge,
    Populate,
}

fn advise(ptr: *mut u8, len: usize, unit: usize, advice: Advice) {
    #[cfg(target_os = "linux")]
    {
        let start = (ptr as usize).next_multiple_of(unit);
        let end = (ptr as usize + len) / unit * unit;
        let advice = match advice {
            Advice::Huge => libc::MADV_HUGEPAGE,
            Advice::Populate => libc::MADV_POPULATE_WRITE,
        };
        if end > start {
            // SAFETY: the range lies inside an allocation the caller owns; neither advice
            // changes its contents (populating writes no byte) nor any mapping's validity.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, advice);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len, unit, advice);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populating_keeps_the_bytes() {
        let mut buf: Vec<u8> = (0..3 * PAGE + 100).map(|i| (i * 7) as u8).collect();
        let before = buf.clone();
        populate(buf[50..].as_mut_ptr(), buf.len() - 50);
        assert_eq!(buf, before);
    }
}
