#!/bin/bash
# tests/cli/test_install.sh — what `ninja install` does (configure.py --install BUILD, PREFIX and
# DESTDIR from the environment) into a temporary DESTDIR: the binary, libtinytrain.so with its
# versioned soname, libtinytrain.a, tinytrain.h and tinytrain.pc; then examples/embed built
# against the installed copy with `pkg-config --cflags --libs tinytrain`, and run.
cd "$(dirname "$0")/../.." || exit 1
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
# a CUDA build: the installed binary opens the installed CUDA backend (lib/libtinytrain_cuda.so)
if [ -f "$B/libtinytrain_cuda.so" ]; then
  [ -f "$R/lib/libtinytrain_cuda.so" ] || fail install "lib/libtinytrain_cuda.so missing"
  "$R/bin/tinytrain" --version | grep -q "cuda (CUDA runtime" || fail install "the installed binary does not load its CUDA backend: $("$R/bin/tinytrain" --version)"
fi
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

# ---- issue 25: installing for a program of one's own works as written ----
# a prefix the dynamic linker does not search: tinytrain.pc carries an rpath, so the program
# runs as built (no LD_LIBRARY_PATH); a system prefix gets none, and ldconfig is run for it
grep -q '^Libs: -L${libdir} -Wl,-rpath,${libdir} -ltinytrain$' "$R/lib/pkgconfig/tinytrain.pc" ||
  fail install_rpath "tinytrain.pc's Libs: $(grep '^Libs:' "$R/lib/pkgconfig/tinytrain.pc")"
P=$TMP/prefix
PREFIX=$P python3 configure.py --install "$B" >"$TMP/log2" 2>&1 || fail install_rpath "PREFIX=$P: $(cat "$TMP/log2")"
grep -q "ldconfig" "$TMP/log2" && fail install_rpath "ldconfig run for PREFIX=$P: $(cat "$TMP/log2")"
# shellcheck disable=SC2046
${CC:-cc} -O1 -o "$TMP/embed_rpath" examples/embed/embed.c $(PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --cflags --libs tinytrain) \
  >"$TMP/cc" 2>&1 || fail install_rpath "cc against PREFIX=$P: $(cat "$TMP/cc")"
env -u LD_LIBRARY_PATH ldd "$TMP/embed_rpath" | grep -q "libtinytrain.so.0 => $P/lib" ||
  fail install_rpath "the program does not find $P/lib/libtinytrain.so.0 by itself: $(ldd "$TMP/embed_rpath" | grep tinytrain)"
python3 - <<'PY' || fail install_rpath "which installs run ldconfig, which .pc files carry an rpath"
import importlib.util
spec = importlib.util.spec_from_file_location("configure", "configure.py")
c = importlib.util.module_from_spec(spec); spec.loader.exec_module(c)
assert c.install_system("/usr/local", "") and c.install_system("/usr", "") and c.install_system("/usr/local/", "")
assert not c.install_system("/usr/local", "/tmp/pkg") and not c.install_system("/opt/tt", "")
assert "rpath" not in c.pc_text("/usr", "0", "-lm") and "rpath" in c.pc_text("/opt/tt", "0", "-lm")
PY
echo "PASS install_rpath"
# pkg-config --static: libtinytrain.a with everything it needs (Libs.private complete)
# shellcheck disable=SC2046
${CC:-cc} -O1 -o "$TMP/embed_static" examples/embed/embed.c $(PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --cflags tinytrain) \
  -Wl,-Bstatic -ltinytrain -Wl,-Bdynamic $(PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --static --libs tinytrain) \
  >"$TMP/cc" 2>&1 || fail install_static "cc with pkg-config --static: $(cat "$TMP/cc")"
nm "$TMP/embed_static" | grep -q " T tt_net_train_step$" || fail install_static "tt_net_train_step is not in the program"
OUT=$("$TMP/embed_static" "$TMP/w2.safetensors" 2>&1) || fail install_static "the statically linked example: $OUT"
echo "PASS install_static"
# the documented commands leave nothing untracked in the tree
for d in docs/api.md docs/build.md README.md; do
  if grep -nE '^(cc|gcc|nvcc) ' "$d" | grep -v -- ' -o /' | grep -v -- ' -c .* -o /'; then fail install_docs "$d: a compile line without -o /tmp/...: writes into the tree"; fi
  if grep -nE 'DESTDIR=[^/$ ]' "$d"; then fail install_docs "$d: a DESTDIR inside the tree"; fi
  if grep -nE -- '-I\.\.\.|\(as above\)' "$d"; then fail install_docs "$d: a placeholder in a command"; fi
done
echo "PASS install_docs"
