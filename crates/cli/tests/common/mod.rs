//! Helpers shared by the CLI's integration tests.
// Each test file compiles this module and uses some of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output};

/// The address a listening `dedupwire` command announced on its first stderr line, and the
/// rest of its stderr (keep reading it, or the child may block on a full pipe).
pub fn listening_address(child: &mut Child) -> (String, Lines<BufReader<ChildStderr>>) {
    let mut lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let first = lines
        .next()
        .expect("a first line")
        .expect("readable stderr");
    let addr = first
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .trim_end_matches(',')
        .to_string();
    (addr, lines)
}

/// Whether this process runs as root (its effective uid, as the kernel reports it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// A small tmpfs mounted for a full-disk test (needs root), unmounted when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it) on the directory `at`; fails
    /// saying so when not root.
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        assert!(
            is_root(),
            "this test fills a small tmpfs it mounts, and needs to run as root"
        );
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs failed");
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Asserts that `out` is a failure whose error says the disk is full.
pub fn assert_disk_full(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
