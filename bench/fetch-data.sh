#!/usr/bin/env bash
# Builds benchmark data from the package registries (never from anywhere else), once:
#   $DATA/pkgs/django-<version>/...   consecutive Django releases' source trees (PyPI sdists)
#   $DATA/docs/*.jsonl                 the shared document revision streams, decompressed
#   $DATA/links/<series>/<version>/... the shaped-link benchmark's series (bench/links.sh), unpacked:
#       npm-typescript  npm tarballs (`npm pack`), crates-tokio  crates.io .crate files,
#       wheel-pyarrow   a large binary pair, two manylinux wheels of pyarrow (PyPI)
# DATA defaults to target/bench-data. Re-running skips what is already there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
DATA=${DATA:-$here/target/bench-data}
SHARED=${SHARED:-$here/../shared}
VERSIONS=${DJANGO_VERSIONS:-"4.2.1 4.2.2 4.2.3 4.2.4 4.2.5 4.2.6"}
mkdir -p "$DATA/pkgs" "$DATA/docs" "$DATA/sdists"
# Progress goes to stderr (stdout's last line is DATA, for callers): each release is ~10 MB,
# then pip spends ~30 s preparing the sdist's metadata (it installs setuptools to do so).
total=$(wc -w <<<"$VERSIONS")
n=0
for v in $VERSIONS; do
  n=$((n + 1))
  dest="$DATA/pkgs/django-$v"
  if [ -d "$dest" ]; then
    echo "fetch-data: django $v ($n/$total): already in $dest" >&2
    continue
  fi
  echo "fetch-data: django $v ($n/$total): downloading its source release from PyPI (~10 MB, then ~30 s of pip preparing it)" >&2
  started=$SECONDS
  pip download --no-deps --no-binary :all: -d "$DATA/sdists" "django==$v" >&2
  echo "fetch-data: django $v ($n/$total): fetched in $((SECONDS - started)) s" >&2
  tmp=$(mktemp -d "$DATA/pkgs/.tmp.XXXX")
  tar -xzf "$DATA/sdists/"[Dd]jango-"$v".tar.gz -C "$tmp"
  mv "$tmp"/*/ "$dest" && rmdir "$tmp"
done
for f in "$SHARED"/data/*.jsonl.zst; do
  [ -e "$f" ] || continue # no shared document streams here (a checkout without ../shared)
  out="$DATA/docs/$(basename "$f" .zst)"
  [ -s "$out" ] || zstd -q -d -f "$f" -o "$out"
done
# The shaped-link series (bench/links.sh), only when asked for: LINKS=1.
unpack() { # unpack ARCHIVE DEST: a tar(.gz) or zip, its single top directory stripped if it has one
  local tmp; tmp=$(mktemp -d "$(dirname "$2")/.tmp.XXXX")
  case "$1" in
    *.whl|*.zip) python3 -m zipfile -e "$1" "$tmp" ;;
    *) tar -xzf "$1" -C "$tmp" ;;
  esac
  if [ "$(ls -A "$tmp" | wc -l)" = 1 ] && [ -d "$tmp/$(ls -A "$tmp")" ]; then
    mv "$tmp/$(ls -A "$tmp")" "$2" && rmdir "$tmp"
  else
    mv "$tmp" "$2"
  fi
}
if [ "${LINKS:-0}" = 1 ]; then
  L=$DATA/links; mkdir -p "$L/archives"
  for v in ${NPM_VERSIONS:-5.4.2 5.4.3 5.4.4 5.4.5}; do
    dest=$L/npm-typescript/$v; [ -d "$dest" ] && continue; mkdir -p "$L/npm-typescript"
    (cd "$L/archives" && npm pack --silent "typescript@$v" >/dev/null 2>&1)
    unpack "$L/archives/typescript-$v.tgz" "$dest"
  done
  for v in ${CRATE_VERSIONS:-1.39.0 1.39.1 1.39.2 1.39.3 1.40.0}; do
    dest=$L/crates-tokio/$v; [ -d "$dest" ] && continue; mkdir -p "$L/crates-tokio"
    f=$L/archives/tokio-$v.crate
    [ -s "$f" ] || curl -sSfL -o "$f" "https://static.crates.io/crates/tokio/tokio-$v.crate"
    unpack "$f" "$dest"
  done
  for v in ${WHEEL_VERSIONS:-14.0.1 14.0.2}; do
    dest=$L/wheel-pyarrow/$v; [ -d "$dest" ] && continue; mkdir -p "$L/wheel-pyarrow"
    pip download --quiet --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
      --python-version 3.11 -d "$L/archives" "pyarrow==$v" >/dev/null
    unpack "$(ls "$L"/archives/pyarrow-"$v"-*.whl)" "$dest"
  done
fi
echo "$DATA"
