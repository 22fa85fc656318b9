#!/usr/bin/env bash
# Every benchmark, ours and the peers side by side in one run; tables on stdout, JSON in
# target/bench-results/. The machine is shared and noisy: each figure is a median of runs.
#   bench/run.sh                 all benchmarks
#   bench/run.sh chunking delta  some of them (chunking, delta, reduction, analyze, replicate, channel)
set -euo pipefail
cd "$(dirname "$0")/.."
which=("$@")
[ ${#which[@]} -gt 0 ] || which=(chunking delta reduction analyze replicate channel)
command -v xdelta3 >/dev/null || { apt-get update -qq && apt-get install -y -qq xdelta3 >/dev/null; }
data=$(bash bench/fetch-data.sh | tail -n 1)
cargo build --release -q -p dedupwire-bench -p dedupwire-cli
out=target/bench-results
mkdir -p "$out"
bench=./target/release/dedupwire-bench
for b in "${which[@]}"; do
  echo "# $b"
  case "$b" in
    chunking) "$bench" chunking --json "$out/chunking.json" ;;
    delta) "$bench" delta --data "$data" --json "$out/delta.json" ;;
    reduction) "$bench" reduction --pkgs "$data/pkgs" --json "$out/reduction.json" ;;
    # Live PostgreSQL replication (needs postgresql-15 + postgresql-15-wal2json): dedupwire vs
    # PostgreSQL's own logical replication, bytes on the wire, on the shared document streams.
    replicate) "$bench" replicate --docs ../shared/data --json "$out/replicate.json" ;;
    channel)
      # Consecutive Django sdists (unpacked to .tar) through the dedup channel over loopback,
      # beside zstd-3 over a plain socket; unshaped, then a 100 Mbit/s link. Then what rsync -z
      # moves for the same releases, as tars and as unpacked trees (its best case).
      command -v rsync >/dev/null || { apt-get update -qq && apt-get install -y -qq rsync >/dev/null; }
      mkdir -p "$data/tars"
      for f in "$data"/sdists/Django-*.tar.gz; do
        t="$data/tars/$(basename "$f" .gz)"
        [ -s "$t" ] || gzip -dc "$f" > "$t"
      done
      "$bench" channel "$data/tars" --modes dedup,adaptive,plain --json "$out/channel.json"
      "$bench" channel "$data/tars" --modes dedup,adaptive --link-mbps 100 --json "$out/channel-100mbit.json"
      echo "rsync -z, tars:"; bash bench/rsync-releases.sh tar "$data"/tars/Django-*.tar
      echo "rsync -z, unpacked trees:"; bash bench/rsync-releases.sh tree "$data"/pkgs/django-*
      ;;
    analyze)
      # End-to-end analysis speed (every method, both scopes) beside reading the same files:
      # exact (the default at this size), then with residual compression sampled 1 batch in 4.
      c0=$(date +%s.%N)
      tar -cf - "$data"/pkgs/django-* "$data"/docs/*.jsonl 2>/dev/null | cat > /dev/null
      c1=$(date +%s.%N)
      for opts in "" "--sample 4"; do
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086
        ./target/release/dedupwire analyze "$data"/pkgs/django-* "$data"/docs/*.jsonl $opts \
          --json "$out/analyze.json" --html "$out/analyze.html" -q
        t1=$(date +%s.%N)
        python3 - "$out/analyze.json" "$c0" "$c1" "$t0" "$t1" "${opts:-exact}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); c0, c1, t0, t1 = map(float, sys.argv[2:6])
mb = r['input_bytes'] / 1e6
print(f"analyze ({sys.argv[6]}): {mb:.0f} MB, {len(r['methods'])} method lines, {t1 - t0:.1f} s wall = {mb / (t1 - t0):.0f} MB/s;"
      f" reading the same files (tar | cat): {mb / (c1 - c0):.0f} MB/s")
PY
      done
      ;;
    *) echo "unknown benchmark $b" >&2; exit 2 ;;
  esac
done
