#!/usr/bin/env bash
# Builds a series of Debian system images (tar snapshots of a root file system that grows
# package by package, like successive VM snapshots) for the large-input analysis benchmark.
# Needs root and debootstrap; everything comes from Debian's package mirror.
#
#   bash bench/make-images.sh            # -> target/bench-data/images/img-{1..5}.tar (~3 GB)
#   IMAGES=DIR bash bench/make-images.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${IMAGES:-target/bench-data/images}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$out"
root="$out/rootfs"

# Each step adds packages to the previous image; the tar of the tree after a step is one image.
steps=(
  ""
  "python3 python3-venv"
  "build-essential"
  "golang-go"
  "clang git"
)

if [ -f "$out/img-${#steps[@]}.tar" ]; then
  echo "images already in $out"
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  echo "make-images: debootstrap is missing (apt-get install debootstrap)" >&2
  exit 1
fi
rm -rf "$root"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$out/debootstrap.log" 2>&1 || {
  echo "make-images: debootstrap failed, see $out/debootstrap.log" >&2
  exit 1
}
n=0
for pkgs in "${steps[@]}"; do
  n=$((n + 1))
  if [ -n "$pkgs" ]; then
    # shellcheck disable=SC2086
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs \
      >>"$out/apt.log" 2>&1 || {
      echo "make-images: installing '$pkgs' failed, see $out/apt.log" >&2
      exit 1
    }
    chroot "$root" apt-get clean
  fi
  tar -C "$root" --numeric-owner -cf "$out/img-$n.tar.part" .
  mv "$out/img-$n.tar.part" "$out/img-$n.tar"
  echo "img-$n.tar: $(du -h "$out/img-$n.tar" | cut -f1) (+ ${pkgs:-minbase})"
done
rm -rf "$root"
