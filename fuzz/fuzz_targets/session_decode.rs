//! Arbitrary bytes as the send/serve session's PLAN (what a sender decodes from any server)
//! and DATA (what a server decodes from any sender): a clear error or a result that keeps
//! the format's rules, never a panic.
//!
//! The first byte chooses the message: even, a PLAN against a fixed manifest of three files
//! and a directory; odd, a DATA message.
#![no_main]

use dedupwire_sync::session::fuzzing;
use dedupwire_sync::{Entry, Kind, Manifest};
use libfuzzer_sys::fuzz_target;

fn manifest() -> Manifest {
    let file = |p: &str| Entry {
        path: p.as_bytes().to_vec(),
        kind: Kind::File {
            size: 10,
            hash: [1; 32],
        },
        mode: 0o644,
        mtime_ns: 0,
    };
    let mut d = file("d");
    d.kind = Kind::Dir;
    Manifest {
        entries: vec![file("a"), file("b"), d, file("d/c")],
        ..Manifest::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    if which & 1 == 0 {
        let m = manifest();
        if let Ok(n) = fuzzing::plan(body, &m) {
            assert!(n <= 3, "only files are needed, each once");
        }
    } else if let Ok(n) = fuzzing::data(body) {
        assert!(n <= body.len() / 10, "every piece has a header and a byte");
    }
});
