#!/usr/bin/env bash
# Sets up and runs the main job on its embedded defaults: builds dedupwire, fetches six
# consecutive Django releases from PyPI (and the shared document streams, if present), and
# analyzes them. Reports land in out/report.{json,html}.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
data=$(bash bench/fetch-data.sh | tail -n 1)
cargo build --release -p dedupwire-cli
mkdir -p out
paths=("$data"/pkgs/django-*)
for f in "$data"/docs/*.jsonl; do [ -e "$f" ] && paths+=("$f"); done
./target/release/dedupwire analyze "${paths[@]}" --json out/report.json --html out/report.html "$@"
echo "reports: out/report.json out/report.html"
