#!/usr/bin/env bash
# Installs the C library of the dedup channel under PREFIX (default /usr/local), so that a C
# program builds with one line:
#   PREFIX/include/dedupwire.h
#   PREFIX/lib/libdedupwire_capi.so and libdedupwire_capi.a
#   PREFIX/lib/pkgconfig/dedupwire.pc   (-I, -L, -ldedupwire_capi and an rpath to PREFIX/lib)
# then (the export only where pkg-config does not already search PREFIX/lib/pkgconfig):
#   export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
#   cc app.c $(pkg-config --cflags --libs dedupwire) -o app
# The library is libdedupwire_capi (-ldedupwire_capi, not -ldedupwire); the rpath lets `app`
# find it at run time without LD_LIBRARY_PATH. Statically instead:
#   cc app.c -I PREFIX/include PREFIX/lib/libdedupwire_capi.a -lpthread -ldl -lm -o app
# Builds with `cargo build --profile $CARGO_PROFILE -p dedupwire-capi` (release by default;
# CARGO_TARGET_DIR is respected).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-/usr/local}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
profile=${CARGO_PROFILE:-release}
case "$profile" in dev | test) out=debug ;; *) out=$profile ;; esac
target=${CARGO_TARGET_DIR:-$here/target}
case "$target" in /*) ;; *) target=$here/$target ;; esac
echo "install-capi: building dedupwire-capi ($profile profile; a first release build takes a few minutes)" >&2
(cd "$here" && "${CARGO:-cargo}" build --quiet --profile "$profile" -p dedupwire-capi)
built=$target/$out
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/Cargo.toml" | head -n 1)

install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 "$here/crates/capi/include/dedupwire.h" "$prefix/include/"
install -m 755 "$built/libdedupwire_capi.so" "$prefix/lib/"
install -m 644 "$built/libdedupwire_capi.a" "$prefix/lib/"
cat >"$prefix/lib/pkgconfig/dedupwire.pc" <<EOF
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: dedupwire
Description: dedupwire's dedup channel from C: a message socket that sends only what the peer lacks
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ldedupwire_capi
Libs.private: -lpthread -ldl -lm
EOF
echo "install-capi: installed dedupwire.h, libdedupwire_capi.{so,a} and dedupwire.pc under $prefix" >&2
echo "install-capi: build a program with
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  cc app.c \$(pkg-config --cflags --libs dedupwire) -o app" >&2
