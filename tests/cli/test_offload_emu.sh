#!/bin/bash
# tests/cli/test_offload_emu.sh — planned host offload of the optimizer state end to end, on the
# emulated GPU (build/tinytrain_emu, which `ninja test` builds outside a sanitizer build;
# SKIP without it). A net whose Adam moments are most of its memory trains 4 steps at a --vram where
# only the plan with the moments in pinned host memory fits, and 4 steps with them on the device
# (--host-mem 0, a larger --vram, the same policy): weights.safetensors and state.safetensors are
# byte for byte the same. Then each run resumes in the other form for 2 more steps: the same again.
. "$(dirname "$0")/../tt_test.sh" offload_emu
EMU=${TT_EMU:-build/tinytrain_emu}
if [ ! -x "$EMU" ]; then
  skip offload_emu_train "$EMU not built (ninja build/tinytrain_emu)"
  exit 0
fi
# no convolution: nothing whose workspace the budget's slack would widen (gpu.md), so the plan's
# arena is the same at every --vram that fits it
{ tiny_recipe_head | sed '/^\[conv c1\]$/,/^\[flatten\]$/d'; printf '[flatten]\n'
  for i in 1 2 3 4; do printf '[linear fc%d]\nout = 512\n[relu]\n' $i; done; printf '[linear fc]\nout = 10\n'; } >"$TMP/r.recipe"
R="$TMP/r.recipe"
# the reserve the emulated device measures, and the arena without offload (no budget: the fastest plan)
read -r RES DEV < <("$EMU" plan --vram 4G --host-mem 0 --json "$R" 2>"$TMP/err" |
  python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["reserve_bytes"], d["arena_bytes"])')
if [ -z "$DEV" ]; then
  fail offload_emu_train "plan: $(head -c 400 "$TMP/err")"
  exit 1
fi
TIGHT=$(( (RES + DEV - (1 << 20)) / 1024 ))K # 1 MiB under the arena plan: some of the 6.5 MiB of moments must go
WIDE=$(( (RES + DEV + (1 << 20)) / 1024 ))K
ok=1
if "$EMU" plan --vram "$TIGHT" --host-mem 0 "$R" >/dev/null 2>&1; then
  fail offload_emu_train "--vram $TIGHT fits without offload: the test's budget is wrong"; ok=0
fi
"$EMU" plan --vram "$TIGHT" --host-mem 1G --json "$R" >"$TMP/p.json" 2>"$TMP/err" &&
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["offload"]["optimizer_state"] and d["offload_bytes"] > 4 << 20, d["offload"]' "$TMP/p.json" ||
  { fail offload_emu_train "--vram $TIGHT --host-mem 1G does not offload: $(head -c 400 "$TMP/err")"; ok=0; }
# TINYTRAIN_REPLAN=0: the plan made with the fixed library margin, which the budgets above are
# measured against (the re-plan after the warm-up would take the emulated libraries' 0 bytes and
# keep the moments on the device: docs/plan.md#re-planning-after-the-warm-up)
train() { TINYTRAIN_REPLAN=0 timeout 600 "$EMU" train --threads 1 "$@" >>"$TMP/log" 2>&1; }
if [ $ok = 1 ]; then
  if train --vram "$TIGHT" --host-mem 1G --max-steps 4 --out "$TMP/a" "$R" && grep -q "^  offload  optimizer state in pinned host memory" "$TMP/log" &&
    train --vram "$WIDE" --host-mem 0 --max-steps 4 --out "$TMP/b" "$R" &&
    cmp -s "$TMP/a/weights.safetensors" "$TMP/b/weights.safetensors" && cmp -s "$TMP/a/state.safetensors" "$TMP/b/state.safetensors"; then
    pass offload_emu_train
  else
    fail offload_emu_train "4 steps offloaded and not differ or failed: $(tail -c 600 "$TMP/log")"; ok=0
  fi
fi
if [ $ok = 1 ]; then
  if train --resume "$TMP/a" --vram "$WIDE" --host-mem 0 --max-steps 6 && train --resume "$TMP/b" --vram "$TIGHT" --host-mem 1G --max-steps 6 &&
    cmp -s "$TMP/a/weights.safetensors" "$TMP/b/weights.safetensors" && cmp -s "$TMP/a/state.safetensors" "$TMP/b/state.safetensors"; then
    pass offload_emu_resume
  else
    fail offload_emu_resume "resumed across offload and not, the runs differ or failed: $(tail -c 600 "$TMP/log")"
  fi
fi
exit $FAILED
