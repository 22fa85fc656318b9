#!/usr/bin/env bash
# Builds restic v0.19.1 (a peer of `dedupwire backup`) from the Go module proxy into a cache;
# does nothing when the binary is already there. Prints its path. Same recipe as
# scripts/ferretdb.sh: `go install …@v0.19.1` is refused, so download the module, copy it
# somewhere writable and build ./cmd/restic (~70 s on 2 cores with Go's caches cold).
# Usage: bench/restic.sh [OUTPUT]   (relative to the repository; default target/restic/restic)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${RESTIC_VERSION:-v0.19.1}
out=${1:-target/restic/restic}
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$go" ] || { echo "restic.sh: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
dir=$(cd "$(dirname "$out")" && pwd)
work=$(mktemp -d "$dir/build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
module=$(cd "$work" && GOFLAGS=-mod=mod "$go" mod download -json "github.com/restic/restic@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$module" ] || { echo "restic.sh: go mod download gave no module directory" >&2; exit 1; }
cp -r "$module" "$work/src"
chmod -R u+w "$work/src"
(cd "$work/src" && "$go" build -o "$work/restic" ./cmd/restic) >&2
mv "$work/restic" "$dir/$(basename "$out")"
echo "$dir/$(basename "$out")"
