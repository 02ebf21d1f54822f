#!/bin/bash
# tests/cli/test_finetune.sh — docs/finetune.md works as written: its ```sh blocks, in order, run with
# `bash -e` in a fresh directory with tinytrain on PATH and TINYTRAIN at this checkout, except
# the blocks whose first line is `# needs ...` (PyTorch and the network, or the card); then what
# the steps should have printed and left is checked: the ViT-L/16 plan at --vram 4G on the
# gtx1650 fits with its optimizer state offloaded and names the frozen layers, the figures the
# page quotes are the plan's, what freezing saves is counted with the state as held (plan
# --json), and the CPU rehearsal pretrained, fine-tuned from that checkpoint, resumed, evaluated
# and predicted.
# Run from the repository root: bash tests/cli/test_finetune.sh
. "$(dirname "$0")/../tt_test.sh" finetune
need_tt finetune_binary
command -v python3 >/dev/null || { skip finetune "python3 not found (the page makes its images with it)"; exit 0; }
mkdir "$TMP/bin" "$TMP/tmp"
ln -s "$(realpath "$TT")" "$TMP/bin/tinytrain"
# the ```sh blocks, less those that say on their first line what they need that a test has not
awk '/^```sh$/ {on = 1; first = 1; next} /^```$/ {on = 0} on && first {first = 0; if (/^# needs/) {on = 0; skipped++; next}}
     on; END {print skipped + 0 >"/dev/stderr"}' docs/finetune.md >"$TMP/ft.sh" 2>"$TMP/skipped"
echo 'pwd >"$FT_WHERE"' >>"$TMP/ft.sh"
nskip=$(cat "$TMP/skipped")
if [ "$nskip" -lt 3 ] || [ "$(grep -c '^tinytrain' "$TMP/ft.sh")" -lt 8 ]; then
  fail finetune_extract "want at least 3 blocks marked '# needs' (weights, train, resume) and 8 tinytrain commands run; $nskip marked: $(cat "$TMP/ft.sh")"
  exit 1
fi
grep -q '^tinytrain plan --gpu gtx1650 --vram 4G ' "$TMP/ft.sh" || { fail finetune_extract "no ViT-L/16 plan command runs"; exit 1; }
ROOT=$PWD
if ! (cd "$TMP" && PATH="$TMP/bin:$PATH" TMPDIR="$TMP/tmp" TINYTRAIN="$ROOT" FT_WHERE="$TMP/where" bash -e ft.sh) >"$TMP/log" 2>&1; then
  fail finetune_runs "a command failed: $(tail -n 8 "$TMP/log")"
  exit 1
fi
pass finetune_runs
W=$(cat "$TMP/where")
ok=1
# the ViT-L/16 plan: it fits the 4 GB card with the optimizer state on the host, and names what is frozen
grep -q "^  offload     optimizer state in pinned host memory" "$TMP/log" || { fail finetune_plan "no offload line in the ViT-L/16 plan"; ok=0; }
grep -q "^  frozen      .*(freeze = true)" "$TMP/log" && grep -q "layers conv_proj, encoder.layers.encoder_layer_0.ln_1" "$TMP/log" ||
  { fail finetune_plan "the plan does not name the frozen layers: $(grep -n -A2 frozen "$TMP/log" | head -n 6)"; ok=0; }
# every figure the page quotes in a `plan says:` block is a line the plan printed
awk '/^```text$/ {on = 1; next} /^```$/ {on = 0} on' docs/finetune.md >"$TMP/quoted"
[ -s "$TMP/quoted" ] || { fail finetune_figures "the page quotes no plan output"; ok=0; }
while IFS= read -r line; do
  [ -z "$line" ] || grep -qxF -- "$line" "$TMP/log" || { fail finetune_figures "quoted but not printed: '$line'"; ok=0; }
done <"$TMP/quoted"
# what freezing saves, as plan --json counts it: the frozen weights' fp32 gradients and their optimizer
# state as held (int8 here: the state the frozen recipe no longer plans), not fp32 state
V=$(dirname "$W")
for r in mine mine-frozen; do
  "$TT" plan --gpu gtx1650 --vram 4G --host-mem 2G --json "$V/$r.recipe" >"$TMP/$r.json" 2>"$TMP/err" || { fail finetune_plan "plan --json $r.recipe: $(cat "$TMP/err")"; ok=0; }
done
why=$(python3 - "$TMP/mine.json" "$TMP/mine-frozen.json" 2>&1 <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
if b["frozen_params"] + b["params"] != a["params"] or not b["frozen_params"]:
    sys.exit("frozen %d + trained %d != %d parameters" % (b["frozen_params"], b["params"], a["params"]))
want = 4 * b["frozen_params"] + a["optimizer_state_bytes"] - b["optimizer_state_bytes"]
if b["frozen_saved_bytes"] != want:
    sys.exit("frozen_saved_bytes %d, want %d (fp32 gradients + the int8 state not planned)" % (b["frozen_saved_bytes"], want))
PY
)
[ -z "$why" ] || { fail finetune_plan "$why"; ok=0; }
[ $ok = 1 ] && pass finetune_plan
# the rehearsal: a checkpoint, the fine-tuned run from it, resumed to the end, evaluated and predicted
ok=1
for f in runs/upstream/weights.safetensors runs/mine/weights.safetensors runs/mine/state.safetensors; do
  [ -f "$W/$f" ] || { fail finetune_rehearsal "$f missing"; ok=0; }
done
grep -qi "initiali[sz]ed.*heads.head" "$TMP/log" || { fail finetune_rehearsal "the run from the checkpoint does not say the head starts fresh"; ok=0; }
grep -q "resum" "$TMP/log" || { fail finetune_rehearsal "nothing says the run resumed"; ok=0; }
acc=$(sed -n 's/^accuracy \([0-9.]*\) .*/\1/p' "$TMP/log" | tail -n 1)
python3 -c "import sys; sys.exit(0 if float('${acc:-0}') >= 0.8 else 1)" ||
  { fail finetune_rehearsal "eval accuracy '${acc}' under 0.8: $(grep -n accuracy "$TMP/log")"; ok=0; }
grep -q "0.ppm: \(warm\|cool\)" "$TMP/log" || { fail finetune_rehearsal "predict named no class"; ok=0; }
[ $ok = 1 ] && pass finetune_rehearsal
exit $FAILED
