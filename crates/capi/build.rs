//! Generates `dedupwire.h` with cbindgen into `OUT_DIR`, and into `include/` when
//! `DEDUPWIRE_BLESS=1` (the committed header is checked against `OUT_DIR` by a test).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=DEDUPWIRE_BLESS");
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("dedupwire.h");
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen cannot generate the header");
    bindings.write_to_file(&out);
    if std::env::var_os("DEDUPWIRE_BLESS").is_some_and(|v| v == "1") {
        bindings.write_to_file(dir.join("include/dedupwire.h"));
    }
}
