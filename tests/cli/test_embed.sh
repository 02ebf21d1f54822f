#!/bin/bash
# tests/cli/test_embed.sh — examples/embed/embed.c, built by ninja against the amalgamation
# (BUILD/amalg/tinytrain.c compiled with cc alone), trains on the batches it makes and predicts
# new images (it exits 1 unless it got more than 25 of 32 right), saving and reloading its
# weights; and the example stays short.
cd "$(dirname "$0")/../.." || exit 1
B=${TT_BUILD:-build}
E=$B/examples/embed
if [ ! -x "$E" ]; then echo "FAIL embed_amalgamation: $E not built (ninja $E)"; exit 1; fi
if ! grep -q "^#define TT_HAVE_CUDA 1" "$B/amalg/tinytrain.c" || ! grep -q "cuda_backend.cu" "$B/amalg/tinytrain.c"; then
  echo "FAIL embed_amalgamation: $B/amalg/tinytrain.c lacks the CUDA backend behind #ifdef"; exit 1
fi
TMP=$(mktemp -d /tmp/tt_test_embed_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
OUT=$("$E" "$TMP/w.safetensors" 2>&1)
RC=$?
if [ $RC != 0 ]; then echo "FAIL embed_amalgamation: exit $RC: $OUT"; exit 1; fi
if [ ! -s "$TMP/w.safetensors" ]; then echo "FAIL embed_amalgamation: it wrote no weights to the path given"; exit 1; fi
if ! echo "$OUT" | grep -q "predicted [0-9]* of 32"; then echo "FAIL embed_amalgamation: no prediction line: $OUT"; exit 1; fi
echo "PASS embed_amalgamation"
echo "$OUT" | sed 's/^/# /'
N=$(wc -l <examples/embed/embed.c)
if [ "$N" -ge 100 ]; then echo "FAIL embed_short: examples/embed/embed.c has $N lines (the issue asks under 100)"; exit 1; fi
echo "PASS embed_short"
