#!/bin/bash
# tests/cli/test_offload_emu.sh — planned host offload end to end, on the emulated GPU
# (build/tinytrain_emu, which `ninja test` builds outside a sanitizer build; SKIP without it).
# Level 1, the optimizer state: a net whose Adam moments are most of its memory trains 4 steps at a
# --vram where only the plan with the moments in pinned host memory fits, and 4 steps with them on
# the device (--host-mem 0, a larger --vram, the same policy): weights.safetensors and
# state.safetensors are byte for byte the same. Then each run resumes in the other form for 2 more
# steps: the same again. Level 2, the fp32 masters too: an fp16 net at a --vram where the search
# holds its masters on the host (plan --json's offload.master_weights), 2 steps and 2 more resumed
# across the forms, the same comparisons.
. "$(dirname "$0")/../tt_test.sh" offload_emu
EMU=${TT_EMU:-build/tinytrain_emu}
if [ ! -x "$EMU" ]; then
  skip offload_emu_train "$EMU not built (ninja build/tinytrain_emu)"
  exit 0
fi
# no convolution: nothing whose workspace the budget's slack would widen (gpu.md), so the plan's
# arena is the same at every --vram that fits it. lin_recipe N WIDTH FILE: N WIDTH-wide linear layers
lin_recipe() {
  { tiny_recipe_head | sed '/^\[conv c1\]$/,/^\[flatten\]$/d'; printf '[flatten]\n'
    for i in $(seq 1 "$1"); do printf '[linear fc%d]\nout = %d\n[relu]\n' "$i" "$2"; done; printf '[linear fc]\nout = 10\n'; } >"$3"
}
# TINYTRAIN_REPLAN=0: the plan made with the fixed library margin, which the budgets below are
# measured against (the re-plan after the warm-up would take the emulated libraries' 0 bytes and
# keep the moments on the device: docs/plan.md#re-planning-after-the-warm-up)
train() { TINYTRAIN_REPLAN=0 timeout 600 "$EMU" train --threads 1 "$@" >>"$TMP/log" 2>&1; }
same_files() { cmp -s "$1/weights.safetensors" "$2/weights.safetensors" && cmp -s "$1/state.safetensors" "$2/state.safetensors"; }
# both_forms NAME RECIPE STEPS MORE HEADER OFF ON: trains RECIPE STEPS steps with the options OFF (the
# offloaded form, whose run header must have the line HEADER) and with ON (everything on the
# device): the same files (NAME_train); then each run resumes in the other form to STEPS + MORE
# steps: the same again (NAME_resume). OFF and ON are split into words.
both_forms() {
  local n=$1 r=$2 a=$TMP/$1.a b=$TMP/$1.b
  # shellcheck disable=SC2086
  if train $6 --max-steps "$3" --out "$a" "$r" && grep -q "^$5" "$TMP/log" && train $7 --max-steps "$3" --out "$b" "$r" && same_files "$a" "$b"; then
    pass "${n}_train"
  else
    fail "${n}_train" "$3 steps offloaded and not differ or failed: $(tail -c 600 "$TMP/log")"; return
  fi
  # shellcheck disable=SC2086
  if train --resume "$a" $7 --max-steps $(($3 + $4)) && train --resume "$b" $6 --max-steps $(($3 + $4)) && same_files "$a" "$b"; then
    pass "${n}_resume"
  else
    fail "${n}_resume" "resumed across offload and not, the runs differ or failed: $(tail -c 600 "$TMP/log")"
  fi
}

# level 1: four 512-wide layers, fp32, 6.5 MiB of Adam moments
R="$TMP/r.recipe"
lin_recipe 4 512 "$R"
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
[ $ok = 1 ] && both_forms offload_emu "$R" 4 2 "  offload  optimizer state in pinned host memory" \
  "--vram $TIGHT --host-mem 1G" "--vram $WIDE --host-mem 0"

# level 2 (docs/plan.md#planned-host-offload, masters too): four 256-wide layers in fp16, 0.83 MiB
# of fp32 masters; the search holds them on the host only where the state alone does not fit, in
# a band about 0.5 MiB wide under the level-1 plan's arena. The budget: the middle of the band,
# found from the arena without offload down in 128 KiB steps (a plan is about 20 ms)
R2="$TMP/r2.recipe"
lin_recipe 4 256 "$R2"
: >"$TMP/log"
read -r TIGHT2 WIDE2 < <(python3 - "$EMU" "$R2" 2>"$TMP/err" <<'PY'
import json, subprocess, sys
emu, r = sys.argv[1], sys.argv[2]
def plan(vram, host):
    p = subprocess.run([emu, "plan", "--precision", "fp16", "--vram", vram, "--host-mem", host, "--json", r], capture_output=True, text=True)
    return json.loads(p.stdout) if p.returncode == 0 else None
d = plan("4G", "0")
res, dev = d["reserve_bytes"], d["arena_bytes"]
band = []
for k in range(1, 128):
    v = "%dK" % ((res + dev - (k << 17)) // 1024)
    d = plan(v, "1G")
    if d is None or (band and not d["offload"]["master_weights"]): break
    if d["offload"]["master_weights"]: band.append(v)
print(band[len(band) // 2] if band else "none", "%dK" % ((res + dev + (1 << 20)) // 1024))
PY
)
if [ -z "$TIGHT2" ] || [ "$TIGHT2" = none ]; then
  fail moffload_emu_train "no --vram under the arena plan holds the masters on the host: $(head -c 400 "$TMP/err")"
elif "$EMU" plan --precision fp16 --vram "$TIGHT2" --host-mem 0 "$R2" >/dev/null 2>&1; then
  fail moffload_emu_train "--vram $TIGHT2 fits without offload: the test's budget is wrong"
elif ! "$EMU" plan --precision fp16 --vram "$TIGHT2" --host-mem 1G --json "$R2" >"$TMP/p2.json" 2>"$TMP/err" ||
  ! python3 -c 'import json, sys; o = json.load(open(sys.argv[1]))["offload"]; assert o["master_weights"] == 10 and o["optimizer_state"], o' "$TMP/p2.json" 2>>"$TMP/err"; then
  fail moffload_emu_train "--vram $TIGHT2 --host-mem 1G: not the 10 masters and the state on the host: $(tail -c 400 "$TMP/err")"
else
  both_forms moffload_emu "$R2" 2 2 "  offload  fp32 master weights in pinned host memory: 0.8 MiB in 10 buffers" \
    "--precision fp16 --vram $TIGHT2 --host-mem 1G" "--precision fp16 --vram $WIDE2 --host-mem 0"
  # the header's state line counts the state alone (Adam's m and v of 216,586 weights: 1.65 MiB),
  # not the whole pinned region (2.5 MiB with the masters)
  if grep -q "^  offload  optimizer state in pinned host memory: 1.7 MiB" "$TMP/log"; then pass moffload_emu_header
  else fail moffload_emu_header "$(grep -m1 "^  offload  optimizer state" "$TMP/log")"; fi
fi
exit $FAILED
