#!/usr/bin/env bash
# Runs every check a commit must pass: formatting, lints, all tests (Rust, then the Python
# package's pytest suite in a venv under target/), a bounded fuzz run.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
# Features off by default, linted and tested on their own: dedupwire-wire's tokio adapter.
cargo clippy -p dedupwire-wire --features tokio --all-targets -- -D warnings
echo "== cargo build -p dedupwire-capi (the C example links its static library)"
cargo build -p dedupwire-capi
echo "== versitygw (the S3 server of the S3 backend's tests; built once, then cached)"
bash scripts/versitygw.sh
echo "== cargo test"
cargo test --workspace 2>&1 | tee target/test-output.txt
echo "== cargo test -p dedupwire-wire --features tokio (AsyncDedupStream: its test and doc example)"
cargo test -p dedupwire-wire --features tokio --test channel_async 2>&1 | tee -a target/test-output.txt
cargo test -p dedupwire-wire --features tokio --doc asynchronous 2>&1 | tee -a target/test-output.txt
echo "== python package (maturin develop, pytest, stubtest)"
if command -v python3 >/dev/null; then
  [ -x target/pyenv/bin/python ] || python3 -m venv target/pyenv
  target/pyenv/bin/pip install -q --disable-pip-version-check maturin pytest mypy
  VIRTUAL_ENV="$PWD/target/pyenv" PATH="$PWD/target/pyenv/bin:$PATH" \
    maturin develop -m python/Cargo.toml
  target/pyenv/bin/python -m pytest python/tests -q -p no:cacheprovider 2>&1 | tee target/pytest-output.txt
  (cd target && pyenv/bin/python -m mypy.stubtest dedupwire)
else
  echo "python3 is missing: SKIPPING the Python package's tests (python/tests)"
  : >target/pytest-output.txt
fi
if [ -x fuzz/run.sh ] && [ "${FUZZ_SECONDS:-20}" != 0 ]; then
  echo "== fuzz (${FUZZ_SECONDS:-20} s per target)"
  bash fuzz/run.sh "${FUZZ_SECONDS:-20}"
fi
passed=$(grep -Eo '[0-9]+ passed' -h target/test-output.txt target/pytest-output.txt | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' -h target/test-output.txt target/pytest-output.txt | awk '{s+=$1} END {print s+0}')
echo "all checks: $passed passed, $failed failed"
