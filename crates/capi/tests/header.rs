//! The committed `include/dedupwire.h` is what `build.rs` generates from the sources.

#[test]
fn committed_header_matches_the_generated_one() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/dedupwire.h"));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/dedupwire.h");
    let committed = std::fs::read_to_string(path).expect("the committed header");
    assert!(
        committed == generated,
        "{path} is stale; regenerate it with `DEDUPWIRE_BLESS=1 cargo build -p dedupwire-capi`"
    );
}
