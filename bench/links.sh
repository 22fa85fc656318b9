#!/usr/bin/env bash
# The shaped-link benchmark (issue 3): consecutive releases moved between two network
# namespaces over shaped links, dedupwire beside its peers in the same run.
#
#   bench/links.sh                        every link and workload (as root; about 20 minutes)
#   LINKS="0 30" WORKLOADS="npm" bench/links.sh
#
# Links (LINKS, Mbit/s; 0 = unshaped): namespaces dw-snd and dw-rcv, 10.77.0.1 and 10.77.0.2.
#   unshaped ("loopback-like"): one veth pair straight between them, no qdisc.
#   shaped: dw-snd -veth- dw-wan -veth- dw-rcv. This kernel has tc's tbf but not netem, so the
#     WAN delay is `dedupwire-bench wan-delay` in dw-wan, a relay that forwards every frame
#     after DELAY_MS (default 20 ms each way, 40 ms round trip); tbf on each of dw-wan's
#     egresses shapes both directions to the rate (burst 32 KB, queue of 100 ms at the rate,
#     tail drop).
# Workloads (WORKLOADS), unpacked release trees from bench/fetch-data.sh (LINKS=1):
#   django  PyPI sdists 4.2.1-4.2.6       npm     typescript 5.4.2-5.4.5 (npm pack)
#   crates  tokio 1.39.0-1.40.0 (.crate)  binary  pyarrow 14.0.1 -> 14.0.2 manylinux wheels
# Transfer i moves release i while the receiver holds release i-1 (first release placed on
# the receiver beforehand, outside the measurement). Peers, per transfer:
#   tar|nc        tar --sort=name | nc, plain TCP, extracted by the receiver
#   tar|zstd      the same through zstd -3 / zstd -d
#   rsync -z      rsync -az --no-whole-file --delete onto release i-1's tree (rsync daemon)
#   dedupwire-*   the channel (`dedupwire-bench channel-send/-recv`), the tar as one message
#                 on a new connection per release, plain frames (no encryption), per mode in
#                 MODES (default: adaptive dedup); the receiver's chunk Environment holds every
#                 release it received before, the sender's (`--env`) every release it sent
#                 and what it learnt of them (delta bases for the next, and the adaptive mode's
#                 measurements, its prior for the next connection); tar streams through
#                 the channel's io::Write on the sender and io::Read on the receiver, into
#                 tar -x, as through nc
#   dedupwire send  `dedupwire send SRC HOST:PORT:tree` onto `dedupwire serve`, release i-1's
#                 tree already there (sent before the measurement, which also fills the
#                 sender's cache of what it sent), encrypted with a fresh key
# Bytes: the sender's veth counters (tx + rx bytes of dw-snd's interface: both directions,
# Ethernet/IP/TCP headers and retransmissions included, offload packets counted as the kernel
# handed them to the veth). Seconds: wall time from starting the sender until the receiver
# has finished (extracted; receiving files in tmpfs). Slow links take fewer transfers (MAX_11, MAX_3
# transfers per series at 11 and 3 Mbit/s, default 2 and 1) and only SLOW_WORKLOADS at
# 3 Mbit/s (default: crates npm). PEERS picks the peers run (default: nc zstd rsync channel
# cli; a subset is for development, its ratios need rsync and zstd in it). Tables on stdout,
# JSON in target/bench-out/links.json (LINKS_JSON names another file there).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
[ "$(id -u)" = 0 ] || { echo "links.sh needs root (ip netns, tc)" >&2; exit 1; }
LINKS=${LINKS:-"0 30 11 3"}
WORKLOADS=${WORKLOADS:-"django npm crates binary"}
SLOW_WORKLOADS=${SLOW_WORKLOADS:-"crates npm"}
MODES=${MODES:-"adaptive dedup"}
PEERS=${PEERS:-"nc zstd rsync channel cli"}
peer() { [[ " $PEERS " == *" $1 "* ]]; }
DELAY_MS=${DELAY_MS:-20}
MAX_11=${MAX_11:-2}
MAX_3=${MAX_3:-1}
bench=$root/${BENCH:-target/release/dedupwire-bench}
dw=$root/${DEDUPWIRE:-target/release/dedupwire}
data=$root/${DATA:-target/bench-data}
out=$root/target/bench-out
mkdir -p "$out"
for t in nc rsync zstd; do
  command -v $t >/dev/null || { apt-get update -qq && apt-get install -y -qq netcat-openbsd rsync zstd >/dev/null; }
done
[ -x "$bench" ] || cargo build --release -q -p dedupwire-bench
# The receiving side's files (extracted trees, rsync's tree, environments) live in tmpfs so
# that every peer's time is link and CPU, not this shared machine's disk.
work=$(mktemp -d "${TMPDIR_LINKS:-/dev/shm}/dw-links.XXXX")
results=$work/results.jsonl
SND=10.77.0.1 RCV=10.77.0.2
pids=()
teardown() {
  local p ns
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pids=()
  for ns in dw-snd dw-rcv dw-wan; do ip netns del $ns 2>/dev/null || true; done
}
trap 'teardown; rm -rf "$work"' EXIT
in_snd() { ip netns exec dw-snd "$@"; }
in_rcv() { ip netns exec dw-rcv "$@"; }

# link MBIT: the two namespaces, joined directly (0) or through the shaped WAN.
link() {
  teardown
  local ns
  for ns in dw-snd dw-rcv; do
    ip netns add $ns
    ip -n $ns link set lo up
    ip netns exec $ns sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  done
  if [ "$1" = 0 ]; then
    ip link add s0 netns dw-snd type veth peer name r0 netns dw-rcv
  else
    ip netns add dw-wan
    ip netns exec dw-wan sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip link add s0 netns dw-snd type veth peer name w0 netns dw-wan
    ip link add r0 netns dw-rcv type veth peer name w1 netns dw-wan
    for i in w0 w1; do
      ip -n dw-wan link set $i promisc on up
      # Queue limit: 100 ms at the rate (tbf's latency), tail drop.
      ip netns exec dw-wan tc qdisc add dev $i root tbf rate "${1}mbit" burst 32kb latency 100ms
    done
    ip netns exec dw-wan "$bench" wan-delay --a w0 --b w1 --delay-ms "$DELAY_MS" &
    pids+=($!)
  fi
  ip -n dw-snd addr add $SND/24 dev s0 && ip -n dw-snd link set s0 up
  ip -n dw-rcv addr add $RCV/24 dev r0 && ip -n dw-rcv link set r0 up
  # Wait until a TCP connection gets through (ARP, the relay).
  ip netns exec dw-rcv nc -k -l $RCV 6999 </dev/null >/dev/null & local probe=$!
  for _ in $(seq 50); do
    if in_snd nc -z -w 1 $RCV 6999 2>/dev/null; then kill $probe; wait $probe 2>/dev/null || true; return 0; fi
    sleep 0.2
  done
  echo "link $1: no route between the namespaces" >&2; exit 1
}

wire() { in_snd sh -c 'echo $(( $(cat /sys/class/net/s0/statistics/tx_bytes) + $(cat /sys/class/net/s0/statistics/rx_bytes) ))'; }
wait_port() { for _ in $(seq 100); do in_rcv ss -ltnH "sport = :$1" | grep -q . && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
now() { date +%s.%N; }

# record LINK WORKLOAD RELEASE PEER BYTES T0 T1 INPUT_BYTES [SENDER_JSON]
record() {
  python3 -c '
import json, sys
a = sys.argv[1:]
r = {"link_mbps": int(a[0]), "workload": a[1], "release": a[2], "peer": a[3], "wire_bytes": int(a[4]),
     "seconds": round(float(a[6]) - float(a[5]), 3), "input_bytes": int(a[7])}
if len(a) > 8:
    r["sender"] = json.load(open(a[8]))
print(json.dumps(r))' "$@" >> "$results"
  printf '  %-8s %-16s %10.3f MB %8.2f s\n' "$3" "$4" "$(echo "$5 / 1000000" | bc -l)" "$(echo "$7 - $6" | bc -l)"
}

# run LINK WORKLOAD: every peer over the series, transfer by transfer.
run() {
  local mbit=$1 wl=$2 dir releases=()
  case $wl in
    django) dir=$data/pkgs; releases=("$dir"/django-*) ;;
    npm) dir=$data/links/npm-typescript ;;
    crates) dir=$data/links/crates-tokio ;;
    binary) dir=$data/links/wheel-pyarrow ;;
  esac
  [ ${#releases[@]} -gt 0 ] || mapfile -t releases < <(ls -d "$dir"/*/ | sed 's:/$::' | sort -V)
  local n=${#releases[@]} max
  max=$n
  [ "$mbit" = 11 ] && max=$((MAX_11 + 1))
  [ "$mbit" = 3 ] && max=$((MAX_3 + 1))
  [ "$max" -lt "$n" ] && n=$max
  echo "# link $([ "$mbit" = 0 ] && echo unshaped || echo "$mbit Mbit/s"), $wl: $(basename "${releases[0]}") then $((n - 1)) transfers"
  local port=7000 r=$work/rcv
  local s=$work/snd
  rm -rf "$r" "$s"; mkdir -p "$r/rsync" "$r/env" "$r/root" "$s/env"
  # The receiver holds the first release: rsync's tree, each channel mode's environment
  # (sent over dw-rcv's own loopback in dedup mode, so that every chunk of it is kept
  # whatever the mode measured; an adaptive send over loopback would keep few; the sender's
  # environment for that mode keeps what it sent), and the dedupwire CLI's copy.
  cp -a "${releases[0]}" "$r/rsync/tree"
  printf 'port = 8730\naddress = %s\nuid = 0\ngid = 0\nuse chroot = false\npid file = %s/rsyncd.pid\n[dst]\npath = %s/rsync\nread only = false\n' \
    "$RCV" "$r" "$r" > "$r/rsyncd.conf"
  ip netns exec dw-rcv rsync --daemon --config="$r/rsyncd.conf" --no-detach & pids+=($!)
  for m in $MODES; do
    in_rcv "$bench" channel-recv --listen "127.0.0.1:$port" --env "$r/env/$m" --mode dedup --ready "$r/ready" &
    local p=$!
    until [ -e "$r/ready" ]; do sleep 0.05; done; rm -f "$r/ready"
    tar --sort=name -cf - -C "${releases[0]}" . | in_rcv "$bench" channel-send --connect "127.0.0.1:$port" --mode dedup --env "$s/env/$m" --json /dev/null -
    wait $p
  done
  local cli=0
  # --- dedupwire send/serve (the CLI): a peer row once the binary has these subcommands ---
  if peer cli && [ -x "$dw" ] && "$dw" serve --help >/dev/null 2>&1; then
    cli=1
    # Encrypted, as the CLI is by default (a fresh key for the run); the sender's cache of
    # what it sent (delta bases) in the run's own directory, filled by release 0's send.
    export XDG_CACHE_HOME=$work/send-cache
    [ -s "$work/cli.key" ] || "$dw" key generate "$work/cli.key" >/dev/null
    ip netns exec dw-rcv "$dw" serve --listen "$RCV:7100" --root "$r/root" --key-file "$work/cli.key" & pids+=($!)
    wait_port 7100
    in_rcv "$dw" send "${releases[0]}" "$RCV:7100:tree" --key-file "$work/cli.key" >/dev/null
  fi
  wait_port 8730
  local i
  for ((i = 1; i < n; i++)); do
    local src=${releases[$i]} rel size b0 t0 p
    rel=$(basename "$src")
    size=$(tar --sort=name -cf - -C "$src" . | wc -c)
    # tar | nc
    if peer nc; then
      rm -rf "$r/x"; mkdir -p "$r/x"
      in_rcv sh -c "nc -l $RCV $port </dev/null | tar -xf - -C '$r/x'" & p=$!
      wait_port $port; b0=$(wire); t0=$(now)
      in_snd sh -c "tar --sort=name -cf - -C '$src' . | nc -N $RCV $port"; wait $p
      record "$mbit" "$wl" "$rel" "tar|nc" $(($(wire) - b0)) "$t0" "$(now)" "$size"
    fi
    # tar | zstd -3
    if peer zstd; then
      rm -rf "$r/x"; mkdir -p "$r/x"
      in_rcv sh -c "nc -l $RCV $port </dev/null | zstd -q -d | tar -xf - -C '$r/x'" & p=$!
      wait_port $port; b0=$(wire); t0=$(now)
      in_snd sh -c "tar --sort=name -cf - -C '$src' . | zstd -q -3 | nc -N $RCV $port"; wait $p
      record "$mbit" "$wl" "$rel" "tar|zstd" $(($(wire) - b0)) "$t0" "$(now)" "$size"
    fi
    # rsync -z onto release i-1
    if peer rsync; then
      b0=$(wire); t0=$(now)
      in_snd rsync -az --no-whole-file --delete "$src/" "rsync://$RCV:8730/dst/tree/"
      record "$mbit" "$wl" "$rel" "rsync -z" $(($(wire) - b0)) "$t0" "$(now)" "$size"
    fi
    # the dedup channel, each mode with its own environment
    for m in $MODES; do
      peer channel || break
      rm -rf "$r/x"; mkdir -p "$r/x"
      in_rcv sh -c "'$bench' channel-recv --listen $RCV:$port --env '$r/env/$m' --mode $m --ready '$r/ready' --stream | tar -xf - -C '$r/x'" &
      p=$!
      until [ -e "$r/ready" ]; do sleep 0.05; done; rm -f "$r/ready"
      b0=$(wire); t0=$(now)
      in_snd sh -c "tar --sort=name -cf - -C '$src' . | '$bench' channel-send --connect $RCV:$port --mode $m --env '$s/env/$m' --json '$r/send.json' -"
      wait $p
      record "$mbit" "$wl" "$rel" "dedupwire-$m" $(($(wire) - b0)) "$t0" "$(now)" "$size" "$r/send.json"
    done
    # --- dedupwire send/serve (the CLI), enabled above when present ---
    if [ $cli = 1 ]; then
      b0=$(wire); t0=$(now)
      in_snd "$dw" send "$src" "$RCV:7100:tree" --key-file "$work/cli.key" --json "$r/cli.json" >/dev/null
      record "$mbit" "$wl" "$rel" "dedupwire send" $(($(wire) - b0)) "$t0" "$(now)" "$size" "$r/cli.json"
    fi
  done
}

for l in $LINKS; do
  link "$l"
  for wl in $WORKLOADS; do
    if [ "$l" = 3 ] && ! [[ " $SLOW_WORKLOADS " == *" $wl "* ]]; then continue; fi
    run "$l" "$wl"
    teardown; link "$l"
  done
done
teardown

python3 - "$results" "$out/${LINKS_JSON:-links.json}" "$DELAY_MS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
series = {}
for r in rows:
    series.setdefault((r["link_mbps"], r["workload"]), {}).setdefault(r["peer"], []).append(r)
out = {"delay_ms_each_way": float(sys.argv[3]),
       "bytes": "sender veth tx+rx bytes (both directions, headers included)",
       "seconds": "wall, sender start to receiver done", "transfers": rows, "series": []}
for (mbit, wl), peers in sorted(series.items(), key=lambda k: (k[0][0] == 0, -k[0][0], k[0][1])):
    tot = {p: (sum(r["wire_bytes"] for r in rs), sum(r["seconds"] for r in rs)) for p, rs in peers.items()}
    n = len(next(iter(peers.values())))
    inp = sum(r["input_bytes"] for r in next(iter(peers.values())))
    link = "unshaped (loopback-like veth)" if mbit == 0 else f"{mbit} Mbit/s, {sys.argv[3]} ms each way"
    print(f"\n## {wl}, {link}: {n} transfer(s), {inp / 1e6:.1f} MB of tar")
    print(f"| peer | MB on the wire | s | bytes / rsync -z | bytes / tar\\|zstd | time / rsync -z | time / tar\\|zstd |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rb, rs = tot.get("rsync -z", (0, 0)); zb, zs = tot.get("tar|zstd", (0, 0))
    ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
    for p, (b, s) in tot.items():
        print(f"| {p.replace('|', chr(92) + '|')} | {b / 1e6:.3f} | {s:.2f} | {ratio(b, rb)} | {ratio(b, zb)} | {ratio(s, rs)} | {ratio(s, zs)} |")
    out["series"].append({"link_mbps": mbit, "workload": wl, "transfers": n, "input_bytes": inp,
                          "peers": {p: {"wire_bytes": b, "seconds": s} for p, (b, s) in tot.items()}})
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(f"\n(JSON: {sys.argv[2]})")
PY
