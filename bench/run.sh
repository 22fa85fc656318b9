#!/usr/bin/env bash
# Every benchmark, ours and the peers side by side in one run; tables on stdout, JSON in
# target/bench-results/. The machine is shared and noisy: each figure is a median of runs.
#   bench/run.sh                 all benchmarks
#   bench/run.sh chunking delta  some of them (chunking, delta, reduction, analyze,
#                                analyze-images, analyze-trees, replicate, env, secure,
#                                channel, links, send, backup)
#   bench/run.sh backup          dedupwire backup/restore beside restic 0.19.1 and borg 1.4.5
#                                (not in the default set: ~30 min; see bench/backup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
which=("$@")
[[ "${ROUNDS:-5}" =~ ^[1-9][0-9]*$ ]] || { echo "bench: ROUNDS must be a whole number of rounds, 1 or more (got '${ROUNDS}')" >&2; exit 2; }
[ ${#which[@]} -gt 0 ] || which=(chunking delta reduction analyze analyze-images analyze-trees replicate env secure channel links send)
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
    # The binary pair (pyarrow wheels) comes with the shaped-link data.
    delta) LINKS=1 bash bench/fetch-data.sh >/dev/null; "$bench" delta --data "$data" --json "$out/delta.json" ;;
    reduction) "$bench" reduction --pkgs "$data/pkgs" --json "$out/reduction.json" ;;
    # The channel's Environment (persistent chunk store): 256 MiB of 8 KiB chunks put, reopened
    # (verifying scan), read back and looked up, in a fresh directory under target/.
    env) "$bench" env --mib 256 --chunk-kib 8 --json "$out/env.json" ;;
    # Live PostgreSQL replication (needs postgresql-15): dedupwire vs
    # PostgreSQL's own logical replication, bytes on the wire, on the shared document streams
    # (dedupwire encrypted with a fresh key, as `dedupwire replicate` is by default).
    replicate) "$bench" replicate --docs ../shared/data --json "$out/replicate.json" ;;
    # The encrypted transport (Noise, ChaCha20-Poly1305) beside plain frames, GB/s of frame
    # payload over loopback TCP and an in-memory pipe.
    secure) "$bench" secure --json "$out/secure.json" ;;
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
    links)
      # Shaped links (issue 3): releases moved between two network namespaces over tc-shaped
      # veths (unshaped, 30, 11, 3 Mbit/s, 20 ms each way), dedupwire beside tar | nc,
      # tar | zstd and rsync -z; bytes on the wire both ways and wall time. Needs root.
      # Tables on stdout, JSON in target/bench-out/links.json. See bench/links.sh.
      LINKS=1 bash bench/fetch-data.sh >/dev/null
      bash bench/links.sh
      # A slow LAN: 100 Mbit/s with no added delay, where the adaptive mode must see that the
      # link, not the CPU, bounds plain sending (target/bench-out/links-lan100.json).
      DELAY_MS=0 LINKS=100 WORKLOADS="django binary" PEERS="zstd rsync channel" \
        LINKS_JSON=links-lan100.json bash bench/links.sh
      ;;
    backup)
      # `dedupwire backup` / `restore` beside restic 0.19.1 (built from the Go module proxy,
      # bench/restic.sh) and borg 1.4.5 (PyPI, bench/borg.sh), in one run: release series,
      # nightly pg_dumps, a 3.5 GB tree; bytes added per snapshot beside the zstd --patch-from
      # oracle, wall / CPU / peak RSS of every backup and restore, and the issue's goals as
      # ratios. Tables on stdout, JSON in target/bench/backup-<date>.json. Knobs: bench/backup.sh.
      # 32 min on the shared 2-core machine (17 of them timed work, the rest the oracle).
      BENCH_CMD="${BENCH_CMD:-bench/run.sh $*}" bash bench/backup.sh
      ;;
    # `dedupwire send` of one 1 GiB and one 4 GiB file (generated, incompressible with some
    # repetition) over loopback: the sender's peak RSS in MiB and the wall time in seconds.
    send) bash bench/send.sh ;;
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
    analyze-images)
      # A few GB of real data: five Debian snapshots (debootstrap, bench/make-images.sh).
      # Five rounds (ROUNDS=n for more), each: drop the page cache, read the images (disk
      # speed), drop it again, analyze them with the defaults. Medians, and the median of each
      # round's own ratio (both runs of a round see the same host: on a shared VM the disk
      # and the CPU drift by 30% between minutes); ratio > 1 means the analysis kept up with
      # the disk. ACCURACY=1 also compares with an unsampled run (about ten minutes).
      bash bench/make-images.sh
      imgs=(target/bench-data/images/img-*.tar)
      drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: reads may be warm)" >&2; }
      rounds=()
      for r in $(seq "${ROUNDS:-5}"); do
        drop; c0=$(date +%s.%N); cat "${imgs[@]}" > /dev/null; c1=$(date +%s.%N)
        d0=$(date +%s.%N)
        for i in "${imgs[@]}"; do dd if="$i" of=/dev/null bs=4M iflag=direct status=none; done
        d1=$(date +%s.%N)
        drop; t0=$(date +%s.%N)
        ./target/release/dedupwire analyze "${imgs[@]}" --json "$out/analyze-images.json" \
          --html "$out/analyze-images.html" -q
        t1=$(date +%s.%N)
        rounds+=("$c0,$c1,$t0,$t1,$d0,$d1")
      done
      # One more cold run held to one core: how the analysis scales with cores, and so how
      # many it needs to keep up with the disk.
      one=""
      if command -v taskset > /dev/null; then
        cpu0=$(taskset -pc $$ | sed 's/.*: //; s/[-,].*//')
        drop; o0=$(date +%s.%N)
        taskset -c "$cpu0" ./target/release/dedupwire analyze "${imgs[@]}" \
          --json "$out/analyze-images-1core.json" -q
        o1=$(date +%s.%N)
        one="$o0,$o1"
      fi
      if [ "${ACCURACY:-0}" = 1 ]; then
        ./target/release/dedupwire analyze "${imgs[@]}" --sample 1 --json "$out/analyze-images-full.json" -q
      fi
      ONE="$one" python3 - "$out" "${rounds[@]}" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
r = json.load(open(f"{out}/analyze-images.json"))
mb = r['input_bytes'] / 1e6
reads, runs, direct = [], [], []
for t in sys.argv[2:]:
    c0, c1, t0, t1, d0, d1 = map(float, t.split(','))
    reads.append(mb / (c1 - c0)); runs.append(mb / (t1 - t0)); direct.append(mb / (d1 - d0))
disk, ana, dev = statistics.median(reads), statistics.median(runs), statistics.median(direct)
print(f"analyze-images: {mb:.0f} MB in {len(r['images'])} images, {len(r['methods'])} method lines")
print(f"  cold read (cat):  {disk:.0f} MB/s median of {reads and [round(x) for x in reads]}")
print(f"  dedupwire analyze: {ana:.0f} MB/s median of {[round(x) for x in runs]}  = {ana / disk:.2f} x disk speed")
# The device around the page cache, as the analysis reads it: where the VM's host caches the
# disk, this is faster than `cat`, whose page-cache work is CPU of its own.
print(f"  device read around the cache (dd iflag=direct bs=4M): {dev:.0f} MB/s median of "
      f"{[round(x) for x in direct]}  (analysis {ana / dev:.2f} x)")
print(f"  the last round's pace: {r['cpu_s'] / (r['elapsed_s'] * r['cores']):.0%} of {r['cores']} cores busy; "
      f"the methods waited {r['waited_on_input_s']:.1f} s for input, reading {r['waited_on_methods_s']:.1f} s for them")
ratios = [a / c for a, c in zip(runs, reads)]
print(f"  each round's ratio: median {statistics.median(ratios):.2f} of {[round(x, 2) for x in ratios]}")
if os.environ.get("ONE"):
    o0, o1 = map(float, os.environ["ONE"].split(','))
    solo = mb / (o1 - o0)
    same = [m['output_bytes'] for m in json.load(open(f"{out}/analyze-images-1core.json"))['methods']] \
        == [m['output_bytes'] for m in r['methods']]
    cores = len(os.sched_getaffinity(0))
    # At the scaling measured, the cores the analysis needs to read as fast as the cold cat.
    print(f"  on one core: {solo:.0f} MB/s ({'same' if same else 'DIFFERENT'} output); {cores} cores ran "
          f"{ana / solo:.2f} x as fast; keeping up with the cold cat takes {disk / solo:.2f} cores' worth")
errs = sorted(m['rel_error'] for m in r['methods'] if m['rel_error'] > 0)
if errs:
    print(f"  stated relative error of sampled lines: median {statistics.median(errs):.3f}, max {max(errs):.3f}")
full = f"{out}/analyze-images-full.json"
if os.path.exists(full):
    f = {(m['name'], m['scope']): m['output_bytes'] for m in json.load(open(full))['methods']}
    devs = [abs(m['output_bytes'] - f[(m['name'], m['scope'])]) / f[(m['name'], m['scope'])]
            for m in r['methods'] if (m['name'], m['scope']) in f and m['rel_error'] > 0]
    print(f"  vs unsampled: median |deviation| {statistics.median(devs):.3f}, max {max(devs):.3f}")
PY
      ;;
    analyze-trees)
      # The same five snapshots as directory trees (unpacked from the images once, without
      # their device nodes): about 100 000 files, most of them small. Three rounds, each: drop
      # the page cache and read every file in order (`tar -cf - | cat`, what a sequential
      # reader such as a backup gets), drop it and read them with 8 readers at once (what the
      # disk gives in parallel), drop it and analyze them with the defaults. Medians.
      bash bench/make-images.sh
      trees=target/bench-data/trees
      for t in target/bench-data/images/img-*.tar; do
        d="$trees/$(basename "$t" .tar)"
        if [ ! -d "$d" ]; then
          rm -rf "$d.part" && mkdir -p "$d.part"
          tar -xf "$t" -C "$d.part" --numeric-owner --exclude='./dev/*'
          mv "$d.part" "$d"
        fi
      done
      dirs=("$trees"/img-*)
      drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: reads may be warm)" >&2; }
      now() { date +%s.%N; }
      rounds=()
      for r in 1 2 3; do
        drop; a0=$(now); tar -cf - "${dirs[@]}" | cat > /dev/null; a1=$(now)
        drop; b0=$(now); find "${dirs[@]}" -type f -print0 | xargs -0 -P 8 -n 64 cat > /dev/null; b1=$(now)
        drop; t0=$(now)
        ./target/release/dedupwire analyze "${dirs[@]}" --json "$out/analyze-trees.json" -q
        t1=$(now)
        rounds+=("$a0,$a1,$b0,$b1,$t0,$t1")
      done
      python3 - "$out" "${rounds[@]}" <<'PY'
import json, statistics, sys
r = json.load(open(f"{sys.argv[1]}/analyze-trees.json"))
mb = r['input_bytes'] / 1e6
seq, par, ana = [], [], []
for t in sys.argv[2:]:
    a0, a1, b0, b1, t0, t1 = map(float, t.split(','))
    seq.append(mb / (a1 - a0)); par.append(mb / (b1 - b0)); ana.append(mb / (t1 - t0))
s, p, a = (statistics.median(x) for x in (seq, par, ana))
print(f"analyze-trees: {mb:.0f} MB in {r['items']} files, {len(r['images'])} trees, {len(r['methods'])} method lines")
print(f"  cold read, in order (tar | cat): {s:.0f} MB/s median of {[round(x) for x in seq]}")
print(f"  cold read, 8 at once (xargs -P 8 cat): {p:.0f} MB/s median of {[round(x) for x in par]}")
print(f"  dedupwire analyze: {a:.0f} MB/s median of {[round(x) for x in ana]}  = {a / s:.2f} x in-order read, {a / p:.2f} x parallel read")
print(f"  the last round's pace: {r['cpu_s'] / (r['elapsed_s'] * r['cores']):.0%} of {r['cores']} cores busy; "
      f"the methods waited {r['waited_on_input_s']:.1f} s for input, reading {r['waited_on_methods_s']:.1f} s for them")
PY
      ;;
    *) echo "unknown benchmark $b" >&2; exit 2 ;;
  esac
done
