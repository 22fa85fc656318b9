#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time:  fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
#   fuzz/run.sh 30                 # every target, 30 s each (the default is 60)
#   fuzz/run.sh 300 delta_decode   # one target
# Needs cargo-fuzz (installed from crates.io on first use). cargo fuzz passes nightly-only
# flags (-Zsanitizer=address); on a stable toolchain RUSTC_BOOTSTRAP=1 lets them through, so
# no nightly toolchain is needed. The seeds in fuzz/corpus/<target>/ are only read; what the
# fuzzer finds goes to fuzz/target/corpus/<target>/ and crashes to fuzz/artifacts/<target>/.
# Exits non-zero if any target crashed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
secs=${1:-60}
shift || true
cd "$here"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz from crates.io" >&2
  cargo install cargo-fuzz --locked || exit 1
fi
export RUSTC_BOOTSTRAP=1
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
failed=()
for t in "${targets[@]}"; do
  work="$here/target/corpus/$t"
  mkdir -p "$work" "$here/corpus/$t"
  echo "== $t: ${secs}s" >&2
  if ! cargo fuzz run "$t" "$work" "$here/corpus/$t" -- \
      -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1; then
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "crashed: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzzed ${targets[*]}: no crash" >&2
