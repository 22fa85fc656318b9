#!/usr/bin/env bash
# Runs every check a commit must pass: formatting, lints, all tests, a bounded fuzz run.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo build -p dedupwire-capi (the C example links its static library)"
cargo build -p dedupwire-capi
echo "== cargo test"
cargo test --workspace 2>&1 | tee target/test-output.txt
if [ -x fuzz/run.sh ] && [ "${FUZZ_SECONDS:-20}" != 0 ]; then
  echo "== fuzz (${FUZZ_SECONDS:-20} s per target)"
  bash fuzz/run.sh "${FUZZ_SECONDS:-20}"
fi
passed=$(grep -Eo '[0-9]+ passed' target/test-output.txt | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' target/test-output.txt | awk '{s+=$1} END {print s+0}')
echo "all checks: $passed passed, $failed failed"
