#!/usr/bin/env bash
# `dedupwire send` of one big file to a `dedupwire serve` on loopback (encrypted, a fresh
# receiving root and sender's cache each time): the sender's peak resident memory (GNU time's
# maximum RSS) and wall time, for each size in SIZES_GIB (default "1 4"). The file: 1 MiB
# blocks, three in four fresh pseudo-random bytes and one in four a copy of one of the last 64
# fresh ones (incompressible, some repetition), generated once into target/bench-data/send/.
# Run by bench/run.sh send (after it builds the release binary); JSON in
# target/bench-results/send.json.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v /usr/bin/time >/dev/null || { apt-get update -qq && apt-get install -y -qq time >/dev/null; }
bin=./target/release/dedupwire
data=target/bench-data/send
out=target/bench-results
mkdir -p "$data" "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/dedupwire-bench-send.XXXX")
trap 'rm -rf "$work"' EXIT
"$bin" key generate "$work/key" >/dev/null 2>&1
rows=()
for gib in ${SIZES_GIB:-1 4}; do
  src=$data/$gib-gib
  if [ ! -s "$src/big" ]; then
    rm -rf "$src" && mkdir -p "$src"
    python3 - "$src/big" "$gib" <<'PY'
import random, sys
rng = random.Random(int(sys.argv[2]))
kept = []
with open(sys.argv[1] + ".part", "wb") as f:
    for _ in range(int(sys.argv[2]) << 10):
        if kept and rng.random() < 0.25:
            f.write(rng.choice(kept))
            continue
        b = rng.randbytes(1 << 20)
        kept.append(b)
        del kept[:-64]
        f.write(b)
PY
    mv "$src/big.part" "$src/big"
  fi
  root=$work/root-$gib
  rm -rf "$root" "$work/cache" && mkdir -p "$root"
  "$bin" serve --listen 127.0.0.1:0 --root "$root" --key-file "$work/key" --once 2> "$work/serve.err" &
  serve=$!
  for _ in $(seq 100); do grep -q 127.0.0.1: "$work/serve.err" && break; sleep 0.1; done
  addr=$(grep -o '127.0.0.1:[0-9]*' "$work/serve.err" | head -n 1)
  XDG_CACHE_HOME=$work/cache /usr/bin/time -f '%M %e' -o "$work/time" \
    "$bin" send "$src" "$addr:big" --key-file "$work/key" -q --json "$work/send.json"
  wait "$serve"
  cmp -s "$src/big" "$root/big/big" || { echo "bench send: the copy of $gib GiB differs" >&2; exit 1; }
  rows+=("$gib $(cat "$work/time") $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["bytes_read"], j["socket_bytes_sent"])' "$work/send.json")")
done
python3 - "$out/send.json" "${rows[@]}" <<'PY'
import json, sys
rows = []
print(f"{'file':>8} {'peak RSS':>10} {'wall':>8} {'rate':>10} {'read':>9} {'wire out':>10}")
for r in sys.argv[2:]:
    gib, kib, wall, read, wire = r.split()
    gib, kib, wall, read, wire = int(gib), int(kib), float(wall), int(read), int(wire)
    rows.append({"file_gib": gib, "peak_rss_mib": kib / 1024, "wall_s": wall,
                 "bytes_read": read, "socket_bytes_sent": wire})
    print(f"{gib:>4} GiB {kib / 1024:>6.0f} MiB {wall:>6.1f} s {gib * 1024 / wall:>5.0f} MiB/s"
          f" {read / 2**30:>5.2f} GiB {wire / 2**20:>6.0f} MiB")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
PY
