//! Helpers shared by the CLI's integration tests.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStderr};

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
