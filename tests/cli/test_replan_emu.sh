#!/bin/bash
# tests/cli/test_replan_emu.sh — the re-plan after the warm-up (docs/plan.md#re-planning-after-the-warm-up)
# end to end on the emulated GPU (build/tinytrain_emu, which `ninja test` builds outside a
# sanitizer build; SKIP without it). TT_EMU_LIBRARY_BYTES sets what the emulated cuBLAS takes at its first
# GEMM (the libraries' lazy load the warm-up measures). An MLP (no convolution: no workspace the
# budget would widen, so the arena of a micro-batch is one figure) at a --vram 256 KiB under what
# micro-batch 512 (the effective batch) needs with the fixed 128 MiB margin plans 256 x 2;
#   replan_small     libraries 8 MiB: re-planned to 512 x 1, and the reserve less the margin, the
#                    arena and the measured bytes stay under --vram;
#   replan_large     libraries 100 MiB (+ 32 MiB slack over the margin): not re-planned, 256 x 2;
#   replan_off       TINYTRAIN_REPLAN=0 with 8 MiB: 256 x 2, and the line says the knob kept it;
#   replan_resume    a re-planned run stopped after 2 steps and resumed to 4 re-plans to 512 x 1
#                    again (its run directory keeps the micro-batch) and ends with the weights of
#                    the 4-step run not interrupted, byte for byte;
#   replan_resume_keeps  the same resume measuring 100 MiB of libraries keeps micro-batch 512
#                    (with the optimizer state offloaded), the same weights.
. "$(dirname "$0")/../tt_test.sh" replan_emu
EMU=${TT_EMU:-build/tinytrain_emu}
if [ ! -x "$EMU" ]; then
  skip replan_emu "$EMU not built (ninja build/tinytrain_emu)"
  exit 0
fi
# batch 512 of 8x8 images through two 256-wide layers: the activations outweigh the weights, so a
# smaller micro-batch plans a smaller arena despite the gradient accumulators it adds
{ tiny_recipe_head | sed -e '/^\[conv c1\]$/,$d' -e 's/^batch = 12$/batch = 512/'; printf '[flatten]\n'
  for i in 1 2; do printf '[linear fc%d]\nout = 256\n[relu]\n' $i; done; printf '[linear fc]\nout = 10\n'; } >"$TMP/r.recipe"
R="$TMP/r.recipe"
# the reserve the emulated device measures (the fixed margin in it) and micro-batch 12's arena
read -r RES AF < <("$EMU" plan --vram 4G --recompute none --precision fp32 --micro-batch 512 --json "$R" 2>"$TMP/err" |
  python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["reserve_bytes"], d["arena_bytes"])')
if [ -z "$AF" ]; then
  fail replan_emu "plan: $(head -c 400 "$TMP/err")"
  exit 1
fi
# 256 KiB under: more than the staged batch's 34 KiB that a budget-bound plan gives back first
TIGHT=$(( (RES + AF) / 1024 - 256 ))K
mb_of() { sed -n 's/^  policy   micro-batch \([0-9]*\) x \([0-9]*\) .*/\1x\2/p' "$1" | tail -n 1; }
train() { local log=$1; shift; timeout 600 "$EMU" train --threads 1 --recompute none --precision fp32 --vram "$TIGHT" "$@" >"$log" 2>&1; }
if ! "$EMU" plan --vram "$TIGHT" --recompute none --precision fp32 --json "$R" 2>"$TMP/err" |
  python3 -c 'import json, sys; d = json.load(sys.stdin); assert d["micro_batch"] == 256, d["micro_batch"]'; then
  fail replan_emu "--vram $TIGHT does not plan micro-batch 256: the test's budget is wrong: $(head -c 300 "$TMP/err")"
  exit 1
fi

if TT_EMU_LIBRARY_BYTES=8M train "$TMP/small.log" --max-steps 2 --out "$TMP/s" "$R" && [ "$(mb_of "$TMP/small.log")" = 512x1 ] &&
  grep -q "^  replan   re-planned: cuDNN/cuBLAS took 8 MiB after the warm-up; library margin 128 MiB -> 48 MiB (+32 MiB slack): micro-batch 256 x 2 -> 512 x 1" "$TMP/small.log" &&
  python3 - "$TMP/small.log" "$TIGHT" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
arena = float(re.search(r"^  memory   arena ([0-9.]+) MiB", t, re.M).group(1))
res, margin, lib = map(float, re.search(r"reserve ([0-9.]+) MiB \(measured, with ([0-9.]+) MiB kept for cuDNN/cuBLAS, which took ([0-9.]+) MiB\)", t).groups())
vram = int(sys.argv[2][:-1]) / 1024.0
total = res - margin + arena + lib
assert margin == 48 and lib == 8, (margin, lib)
assert total < vram, "process %.1f MiB over --vram %.1f MiB" % (total, vram)
PY
then
  pass replan_small
else
  fail replan_small "not re-planned to 512 x 1 within --vram $TIGHT: $(grep -E '^  (policy|memory|replan)|reserve|rror' "$TMP/small.log" | head -c 800)"
fi

if TT_EMU_LIBRARY_BYTES=100M train "$TMP/large.log" --max-steps 1 --out "$TMP/l" "$R" && [ "$(mb_of "$TMP/large.log")" = 256x2 ] &&
  grep -q "^  replan   not re-planned: cuDNN/cuBLAS took 100 MiB after the warm-up" "$TMP/large.log"; then
  pass replan_large
else
  fail replan_large "re-planned or failed with 100 MiB of libraries: $(grep -E '^  (policy|replan)|rror' "$TMP/large.log" | head -c 600)"
fi

if TINYTRAIN_REPLAN=0 TT_EMU_LIBRARY_BYTES=8M train "$TMP/off.log" --max-steps 1 --out "$TMP/o" "$R" && [ "$(mb_of "$TMP/off.log")" = 256x2 ] &&
  grep -q "^  replan   not re-planned (TINYTRAIN_REPLAN=0)" "$TMP/off.log"; then
  pass replan_off
else
  fail replan_off "TINYTRAIN_REPLAN=0 did not keep 256 x 2: $(grep -E '^  (policy|replan)|rror' "$TMP/off.log" | head -c 600)"
fi

# the 2-step run above, resumed to 4, against 4 steps at once: with the libraries as before and
# --host-mem 0 (the fixed margin has no room for the kept micro-batch 512 without offload: the
# first plan is made without it and the re-plan asks for it again), and a copy with 100 MiB of
# libraries (no re-plan; the kept micro-batch fits with the optimizer state offloaded)
cp -r "$TMP/s" "$TMP/s2"
if TT_EMU_LIBRARY_BYTES=8M train "$TMP/full.log" --max-steps 4 --out "$TMP/f" "$R" &&
  TT_EMU_LIBRARY_BYTES=8M timeout 600 "$EMU" train --threads 1 --host-mem 0 --resume "$TMP/s" --max-steps 4 >"$TMP/resume.log" 2>&1 &&
  [ "$(mb_of "$TMP/resume.log")" = 512x1 ] && grep -q "^  replan   re-planned: .* micro-batch 256 x 2 -> 512 x 1" "$TMP/resume.log" &&
  cmp -s "$TMP/f/weights.safetensors" "$TMP/s/weights.safetensors"; then
  pass replan_resume
else
  fail replan_resume "the resumed re-planned run is not the 4-step run: $(grep -E '^  (policy|replan)|rror|resumed' "$TMP/resume.log" | head -c 800)"
fi
if TT_EMU_LIBRARY_BYTES=100M timeout 600 "$EMU" train --threads 1 --resume "$TMP/s2" --max-steps 4 >"$TMP/resume2.log" 2>&1 &&
  [ "$(mb_of "$TMP/resume2.log")" = 512x1 ] && cmp -s "$TMP/f/weights.safetensors" "$TMP/s2/weights.safetensors"; then
  pass replan_resume_keeps
else
  fail replan_resume_keeps "a resume measuring 100 MiB did not keep micro-batch 512: $(grep -E '^  (policy|replan)|rror|resumed' "$TMP/resume2.log" | head -c 800)"
fi
exit $FAILED
