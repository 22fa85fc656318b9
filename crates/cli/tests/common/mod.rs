//! Helpers shared by the CLI's integration tests.
// Each test file compiles this module and uses some of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Lines};
use std::os::unix::fs::MetadataExt;
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

/// `len` pseudo-random bytes from `seed` (xorshift): incompressible test data.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Path -> (mode, mtime, contents or link target) under `root`.
pub fn tree(root: &Path) -> BTreeMap<PathBuf, (u32, i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let mtime = md.mtime() * 1_000_000_000 + md.mtime_nsec();
            let body = if md.is_dir() {
                stack.push(p.clone());
                Vec::new()
            } else if md.file_type().is_symlink() {
                fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                fs::read(&p).unwrap()
            };
            let mode = if md.file_type().is_symlink() {
                0
            } else {
                md.mode() & 0o7777
            };
            out.insert(
                p.strip_prefix(root).unwrap().to_path_buf(),
                (mode, mtime, body),
            );
        }
    }
    out
}
