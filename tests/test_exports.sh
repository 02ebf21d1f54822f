#!/bin/bash
# tests/test_exports.sh — the library's public surface. libtinytrain.so exports exactly what
# core/tinytrain.h declares (TT_API; the library is built with -fvisibility=hidden), and every
# global name of libtinytrain.a carries the tt_ prefix, so a program linking either meets no
# name of ours outside it. Needs the built libraries: TT_BUILD names the build directory (the
# test runner sets it; default build). Prints PASS/FAIL/SKIP lines; exits 1 if anything failed.
. "$(dirname "$0")/tt_test.sh" exports
B=${TT_BUILD:-build}

command -v nm >/dev/null || { skip exports "no nm (binutils)"; exit 0; }
command -v c++filt >/dev/null || { skip exports "no c++filt (binutils)"; exit 0; }

# The public functions: each TT_API declaration names one, on the line TT_API starts.
sed -n 's/^TT_API .*[ *]\(tt_[A-Za-z0-9_]*\)(.*/\1/p' core/tinytrain.h | sort -u >"$TMP/public"
[ -s "$TMP/public" ] || { fail exports_header "no TT_API declaration found in core/tinytrain.h"; exit 1; }

# ---- the shared library: its dynamic symbols are the header's functions, no more, no fewer ----
SO=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["so"])' "$B/install.json" 2>/dev/null)
SO=${SO:+$B/$SO}
if [ -z "$SO" ] || [ ! -f "$SO" ]; then
  fail exports_so "no shared library in $B (ninja -f $B/build.ninja $B/libtinytrain.so.*; TT_BUILD=$B)"
else
  # defined dynamic symbols (nm -D prints "ADDRESS TYPE NAME"); symbol versions (@@) dropped
  nm -D --defined-only "$SO" | awk 'NF >= 3 {sub(/@.*/, "", $3); print $3}' | sort -u >"$TMP/exported"
  extra=$(comm -23 "$TMP/exported" "$TMP/public")
  missing=$(comm -13 "$TMP/exported" "$TMP/public")
  n=$(wc -l <"$TMP/exported")
  if [ -n "$extra" ]; then
    fail exports_so "$SO exports $(echo "$extra" | wc -l) names that core/tinytrain.h does not declare (TT_API):" \
      "$(echo "$extra" | head -20 | tr '\n' ' ')"
  elif [ -n "$missing" ]; then
    fail exports_so "$SO does not export these TT_API functions of core/tinytrain.h: $(echo "$missing" | tr '\n' ' ')"
  else
    pass "exports_so ($n symbols, the TT_API functions of core/tinytrain.h)"
  fi
fi

# ---- the static library: every global defined name carries tt_ ----
A=$B/libtinytrain.a
if [ ! -f "$A" ]; then
  fail exports_static "no $A (ninja -f $B/build.ninja $A)"
else
  # "ADDRESS TYPE NAME" lines (member headers and blank lines dropped); C++ names from the CUDA
  # objects demangled, then the function's name alone (before its parameter list, after any
  # namespace) must carry the prefix like a C name.
  nm -g --defined-only "$A" | awk 'NF >= 3 {print $3}' | sort -u >"$TMP/globals"
  bad=$(c++filt <"$TMP/globals" | paste "$TMP/globals" - | while IFS=$'\t' read -r raw name; do
    # Compiler artefacts, not our names: nvcc's host stub of a kernel (__device_stub__<mangled
    # kernel>; a static kernel's is local), and the DWARF reference to the C++ personality routine
    # (DW.ref.__gxx_personality_v0) that g++ emits, hidden and COMDAT, in each object with
    # exception tables.
    case $raw in __device_stub__* | _Z*__device_stub__* | DW.ref.*) continue ;; esac
    # AddressSanitizer's ODR indicator of a global variable (__odr_asan.NAME, the sanitizer build):
    # the variable's own name must carry the prefix
    case $raw in __odr_asan.*) name=${raw#__odr_asan.} ;; esac
    base=${name%%(*}
    base=${base##*::}
    case $base in tt_*) ;; *) echo "$name" ;; esac
  done)
  n=$(wc -l <"$TMP/globals")
  if [ -n "$bad" ]; then
    fail exports_static "$A has $(echo "$bad" | wc -l) global names without the tt_ prefix (make them static or" \
      "name them tt_...): $(echo "$bad" | head -20 | tr '\n' ';')"
  else
    pass "exports_static ($n global names, each tt_)"
  fi
fi
exit $FAILED
