#!/usr/bin/env bash
# Builds benchmark data from the package registries (never from anywhere else), once:
#   $DATA/pkgs/django-<version>/...   consecutive Django releases' source trees (PyPI sdists)
#   $DATA/docs/*.jsonl                 the shared document revision streams, decompressed
# DATA defaults to target/bench-data. Re-running skips what is already there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
DATA=${DATA:-$here/target/bench-data}
SHARED=${SHARED:-$here/../shared}
VERSIONS=${DJANGO_VERSIONS:-"4.2.1 4.2.2 4.2.3 4.2.4 4.2.5 4.2.6"}
mkdir -p "$DATA/pkgs" "$DATA/docs" "$DATA/sdists"
for v in $VERSIONS; do
  dest="$DATA/pkgs/django-$v"
  [ -d "$dest" ] && continue
  pip download --quiet --no-deps --no-binary :all: -d "$DATA/sdists" "django==$v" >/dev/null
  tmp=$(mktemp -d "$DATA/pkgs/.tmp.XXXX")
  tar -xzf "$DATA/sdists/"[Dd]jango-"$v".tar.gz -C "$tmp"
  mv "$tmp"/*/ "$dest" && rmdir "$tmp"
done
for f in "$SHARED"/data/*.jsonl.zst; do
  out="$DATA/docs/$(basename "$f" .zst)"
  [ -s "$out" ] || zstd -q -d -f "$f" -o "$out"
done
echo "$DATA"
