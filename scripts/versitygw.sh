#!/usr/bin/env bash
# Builds versitygw v1.8.0 (the S3 server the S3 backend's tests and benchmarks run against) from
# the Go module proxy into a cache; does nothing when the binary is already there. Prints its
# path. Like scripts/ferretdb.sh: download the module, copy it somewhere writable, build
# ./cmd/versitygw.
# Usage: scripts/versitygw.sh [OUTPUT]   (relative to the repository; default
#   target/versitygw/versitygw). About 5 minutes on 2 cores with Go's caches cold, seconds
#   with them warm.
set -euo pipefail
cd "$(dirname "$0")/.."
version=v1.8.0
out=${1:-target/versitygw/versitygw}
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$go" ] || { echo "versitygw.sh: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
dir=$(cd "$(dirname "$out")" && pwd)
work=$(mktemp -d "$dir/build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
module=$(cd "$work" && GOFLAGS=-mod=mod "$go" mod download -json "github.com/versity/versitygw@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$module" ] || { echo "versitygw.sh: go mod download gave no module directory" >&2; exit 1; }
cp -r "$module" "$work/src"
chmod -R u+w "$work/src"
(cd "$work/src" && "$go" build -o "$work/versitygw" ./cmd/versitygw) >&2
mv "$work/versitygw" "$dir/$(basename "$out")"
echo "$dir/$(basename "$out")"
