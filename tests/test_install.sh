#!/bin/bash
# tests/test_install.sh — what `ninja install` does (configure.py --install BUILD, PREFIX and
# DESTDIR from the environment) into a temporary DESTDIR: the binary, libtinytrain.so with its
# versioned soname, libtinytrain.a, tinytrain.h and tinytrain.pc; then examples/embed built
# against the installed copy with `pkg-config --cflags --libs tinytrain`, and run.
cd "$(dirname "$0")/.." || exit 1
B=${TT_BUILD:-build}
TMP=$(mktemp -d /tmp/tt_test_install_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL $1: $2"; exit 1; }
command -v pkg-config >/dev/null || { echo "SKIP install_pkg_config: no pkg-config (apt-get install pkg-config)"; exit 0; }
if ! PREFIX=/opt/tt DESTDIR=$TMP python3 configure.py --install "$B" >"$TMP/log" 2>&1; then
  fail install "configure.py --install $B: $(cat "$TMP/log")"
fi
R=$TMP/opt/tt
for f in bin/tinytrain lib/libtinytrain.a include/tinytrain.h lib/pkgconfig/tinytrain.pc lib/libtinytrain.so; do
  [ -e "$R/$f" ] || fail install "$R/$f missing: $(find "$TMP" | head -20)"
done
SONAME=$(readelf -d "$R/lib/libtinytrain.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$SONAME" = libtinytrain.so.0 ] || fail install "soname '$SONAME', want libtinytrain.so.0"
[ "$(readlink "$R/lib/libtinytrain.so.0")" = "$(readlink "$R/lib/libtinytrain.so")" ] || fail install "symlinks differ"
nm "$R/lib/libtinytrain.a" 2>/dev/null | grep -q " T tt_net_train_step$" || fail install "libtinytrain.a lacks tt_net_train_step"
"$R/bin/tinytrain" --version | grep -q "^tinytrain [0-9]" || fail install "the installed binary does not run"
grep -q "^prefix=/opt/tt$" "$R/lib/pkgconfig/tinytrain.pc" || fail install "tinytrain.pc's prefix is not PREFIX (DESTDIR leaked in?)"
echo "PASS install"
FLAGS=$(PKG_CONFIG_PATH=$R/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$TMP pkg-config --cflags --libs tinytrain) ||
  fail install_pkg_config "pkg-config --cflags --libs tinytrain failed"
# shellcheck disable=SC2086
if ! ${CC:-cc} -O1 -o "$TMP/embed" examples/embed/embed.c $FLAGS >"$TMP/cc" 2>&1; then
  fail install_pkg_config "cc examples/embed/embed.c $FLAGS: $(cat "$TMP/cc")"
fi
OUT=$(LD_LIBRARY_PATH=$R/lib "$TMP/embed" "$TMP/w.safetensors" 2>&1) || fail install_pkg_config "the example against the installed library: $OUT"
LD_LIBRARY_PATH=$R/lib ldd "$TMP/embed" | grep -q "libtinytrain.so.0 => $R/lib" ||
  fail install_pkg_config "the example is not linked to the installed libtinytrain.so.0: $(ldd "$TMP/embed")"
echo "PASS install_pkg_config"
