#!/usr/bin/env bash
# Bytes `rsync -z` moves over loopback (through an rsync daemon) for consecutive releases,
# each synced onto the previous one:  bench/rsync-releases.sh tar FILE...  |  tree DIR...
# Prints one line per release: name, bytes sent + received (rsync --stats).
set -euo pipefail
kind=$1; shift
work=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
mkdir -p "$work/dst"
printf 'port = %s\nuid = 0\ngid = 0\nuse chroot = false\npid file = %s/pid\n[dst]\npath = %s/dst\nread only = false\n' \
  "$port" "$work" "$work" > "$work/rsyncd.conf"
rsync --daemon --config="$work/rsyncd.conf" --no-detach &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; rm -rf "$work"' EXIT
sleep 0.5
total=0
for src in "$@"; do
  if [ "$kind" = tar ]; then
    out=$(rsync -z --no-whole-file --stats "$src" "rsync://127.0.0.1:$port/dst/release.tar")
  else
    out=$(rsync -rz --no-whole-file --delete --stats "$src/" "rsync://127.0.0.1:$port/dst/tree/")
  fi
  sent=$(echo "$out" | sed -n 's/^Total bytes sent: \([0-9,]*\).*/\1/p' | tr -d ,)
  recv=$(echo "$out" | sed -n 's/^Total bytes received: \([0-9,]*\).*/\1/p' | tr -d ,)
  total=$((total + sent + recv))
  printf '%-24s %12d\n' "$(basename "$src")" $((sent + recv))
done
printf '%-24s %12d\n' total "$total"
