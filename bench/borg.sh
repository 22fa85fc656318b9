#!/usr/bin/env bash
# Installs borgbackup 1.4.5 (a peer of `dedupwire backup`) from PyPI into a venv under
# target/, building it against Debian's lz4 / zstd / xxhash / acl headers; does nothing when it
# is already there. Prints the path of its `borg`. If the PyPI build fails, falls back to
# Debian's borgbackup (1.2.4) and says so on stderr.
# Usage: bench/borg.sh [VENV]   (default target/borg-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${BORG_VERSION:-1.4.5}
venv=${1:-target/borg-venv}
if [ -x "$venv/bin/borg" ] && "$venv/bin/borg" --version 2>/dev/null | grep -qF "$version"; then
  echo "$(cd "$venv" && pwd)/bin/borg"
  exit 0
fi
need=()
for p in liblz4-dev libzstd-dev libxxhash-dev libacl1-dev pkg-config; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  { apt-get update -qq && apt-get install -y -qq "${need[@]}"; } >/dev/null 2>&1 ||
    echo "borg.sh: could not install ${need[*]} with apt" >&2
fi
rm -rf "$venv"
python3 -m venv "$venv"
if "$venv/bin/pip" install -q "borgbackup==$version" >&2; then
  echo "$(cd "$venv" && pwd)/bin/borg"
  exit 0
fi
echo "borg.sh: pip install borgbackup==$version failed; using Debian's borgbackup instead" >&2
command -v borg >/dev/null || { apt-get update -qq && apt-get install -y -qq borgbackup >/dev/null; }
command -v borg
