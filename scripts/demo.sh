#!/usr/bin/env bash
# Sets up and runs the main job on its embedded defaults: builds dedupwire, fetches six
# consecutive Django releases from PyPI (and the shared document streams, if present), and
# analyzes them. Reports land in out/report.{json,html}. Each step says what it does, about
# how long it takes, and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
command -v pip >/dev/null || { echo "pip not found: install Python's pip first (it fetches the data)" >&2; exit 1; }

step_started=$SECONDS
step() { # step N TEXT: announces a step
  step_started=$SECONDS
  printf '\ndemo: step %s/3: %s\n' "$1" "$2" >&2
}
took() {
  local s=$((SECONDS - step_started))
  printf 'demo: done in %dm %02ds\n' $((s / 60)) $((s % 60)) >&2
}

step 1 "fetching six Django releases from PyPI into ${DATA:-target/bench-data} (~10 MB each; 3 to 4 minutes the first time, most of it pip preparing each package; nothing once they are there)"
data=$(bash bench/fetch-data.sh | tail -n 1)
took

step 2 "building dedupwire in release mode (5 to 10 minutes on 2 cores the first time, seconds after)"
cargo build --release -p dedupwire-cli
took

mkdir -p out
paths=("$data"/pkgs/django-*)
for f in "$data"/docs/*.jsonl; do [ -e "$f" ] && paths+=("$f"); done
size=$(find "${paths[@]}" -type f -printf '%s\n' | awk '{ n += $1 } END { printf "%.0f MiB", n / 1048576 }')
step 3 "analyzing ${#paths[@]} inputs ($size) with every method (under a minute on 2 cores)"
"${CARGO_TARGET_DIR:-target}/release/dedupwire" analyze "${paths[@]}" --json out/report.json --html out/report.html "$@"
took
echo "reports: out/report.json out/report.html"
