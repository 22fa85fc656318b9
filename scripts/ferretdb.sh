#!/usr/bin/env bash
# Builds FerretDB v1.24.0 (the MongoDB-protocol server the replicate tests run against) from the
# Go module proxy into a cache; does nothing when the binary is already there. Prints its path.
# `go install …@v1.24.0` is refused for this module, so: download the module, copy it somewhere
# writable, stamp the version file its build expects, and build ./cmd/ferretdb.
# Usage: scripts/ferretdb.sh [OUTPUT]   (relative to the repository; default
#   target/ferretdb/ferretdb). A few minutes with Go's caches cold (3.3 min measured on a busy
#   2-core machine), seconds with them warm.
set -euo pipefail
cd "$(dirname "$0")/.."
version=v1.24.0
out=${1:-target/ferretdb/ferretdb}
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$go" ] || { echo "ferretdb.sh: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
dir=$(cd "$(dirname "$out")" && pwd)
work=$(mktemp -d "$dir/build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
module=$(cd "$work" && GOFLAGS=-mod=mod "$go" mod download -json "github.com/FerretDB/FerretDB@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$module" ] || { echo "ferretdb.sh: go mod download gave no module directory" >&2; exit 1; }
cp -r "$module" "$work/src"
chmod -R u+w "$work/src"
echo "$version" > "$work/src/build/version/version.txt"
(cd "$work/src" && "$go" build -o "$work/ferretdb" ./cmd/ferretdb) >&2
mv "$work/ferretdb" "$dir/$(basename "$out")"
echo "$dir/$(basename "$out")"
