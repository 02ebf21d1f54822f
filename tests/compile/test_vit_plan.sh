#!/bin/bash
# tests/compile/test_vit_plan.sh — `tinytrain plan` accepts the Vision Transformer recipes (issue 24):
# examples/imagenet/vit_b16.recipe (torchvision's vit_b_16) and deit_tiny.recipe (DeiT-Tiny) plan
# under --vram 4G with the parameter counts of the originals (86,567,656 and 5,717,416; ViT-L/16's
# vit_l16.recipe 304,326,632, and on a 4 GB GTX 1650 with its 8-bit optimizer state), and
# `plan --max-batch` finds a micro-batch for ViT-B/16 at 224x224 in 4 GiB (what
# tests/bench/vit_vs_torch.py compares with PyTorch's); the PyTorch fixtures' recipes plan too.
# Run from the repository root: bash tests/compile/test_vit_plan.sh. Prints PASS/FAIL lines.
. "$(dirname "$0")/../tt_test.sh" vit_plan
need_tt vit_plan_binary

# plan_params NAME RECIPE PARAMS: plan --json --vram 4G succeeds with PARAMS parameters (0: any)
plan_params() {
  "$TT" plan --device cpu --json --vram 4G "$2" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc != 0 ]; then
    fail "$1" "plan --json --vram 4G $2: exit $rc: $(head -c 600 "$TMP/err")"
    return
  fi
  local got
  if ! got=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["micro_batch"] >= 1 and d["arena_bytes"] <= d["budget_bytes"], d
print(d["params"], d["micro_batch"], d["accum_steps"], d["precision"])' "$TMP/out" 2>&1); then
    fail "$1" "$2: plan --json output: $(echo "$got" | tail -n 1)"
    return
  fi
  set -- "$1" "$2" "$3" $got
  if [ "$3" != 0 ] && [ "$4" != "$3" ]; then
    fail "$1" "$2: $4 parameters, the original has $3"
    return
  fi
  echo "# $2: $4 parameters; 4 GiB on the CPU: micro-batch $5 x $6 accumulation steps, $7"
  pass "$1"
}

plan_params vit_plan_vit_b16 examples/imagenet/vit_b16.recipe 86567656
plan_params vit_plan_deit_tiny examples/imagenet/deit_tiny.recipe 5717416
plan_params vit_plan_vit_l16 examples/imagenet/vit_l16.recipe 304326632
plan_params vit_plan_fixture_small tests/fixtures/vit_small.recipe 0
plan_params vit_plan_fixture_torchvision tests/fixtures/vit_tv.recipe 0

# the largest ViT-B/16 micro-batch in 4 GiB, fp32, without and with recompute
if "$TT" plan --device cpu --max-batch --json --vram 4G examples/imagenet/vit_b16.recipe >"$TMP/mb" 2>"$TMP/err"; then
  if got=$(python3 -c '
import json, sys
rows = {(r["precision"], r["recompute"]): r["micro_batch"] for r in json.load(open(sys.argv[1]))["max_batch"]}
none, auto = rows[("fp32", "none")], rows[("fp32", "auto")]
assert none >= 1 and auto >= none, rows
print(none, auto)' "$TMP/mb" 2>&1); then
    set -- $got
    echo "# vit_b16.recipe, 4 GiB on the CPU, fp32: largest micro-batch $1 keeping every activation, $2 with recompute"
    pass vit_plan_vit_b16_max_batch
  else
    fail vit_plan_vit_b16_max_batch "plan --max-batch --json: $(echo "$got" | tail -n 1)"
  fi
else
  fail vit_plan_vit_b16_max_batch "plan --max-batch --vram 4G: $(head -c 600 "$TMP/err")"
fi
# ViT-L/16 on a 4 GB GTX 1650 (issue 42): its recipe's 8-bit AdamW moments fit where fp32 ones
# (2.27 GiB of moments beside 1.13 GiB of weights and of gradients) are refused with the reason,
# both on the device alone (--host-mem 0: no planned host offload)
if "$TT" plan --gpu gtx1650 --host-mem 0 --json examples/imagenet/vit_l16.recipe >"$TMP/l16" 2>"$TMP/err" &&
  got=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["micro_batch"] >= 1 and d["arena_bytes"] <= d["budget_bytes"], d
assert d["optimizer_state_bytes"] * 3 < 2 * 304326632 * 4, d["optimizer_state_bytes"]  # int8: under 0.33 of fp32 moments
print(d["micro_batch"], d["optimizer_state_bytes"])' "$TMP/l16" 2>&1); then
  sed 's/^optimizer_state = int8$/optimizer_state = fp32/' examples/imagenet/vit_l16.recipe >"$TMP/l16_fp32.recipe"
  if "$TT" plan --gpu gtx1650 --host-mem 0 "$TMP/l16_fp32.recipe" >"$TMP/out" 2>"$TMP/err"; then
    fail vit_plan_vit_l16_gtx1650 "fp32 moments fit 4 GB: $(head -c 300 "$TMP/out")"
  elif ! grep -q "does not fit.*optimizer" "$TMP/err"; then
    fail vit_plan_vit_l16_gtx1650 "fp32 moments refused without the reason: $(head -c 300 "$TMP/err")"
  elif ! grep -q "the smallest plan (micro-batch [0-9]*[^)]*, fp32)" "$TMP/err" ||
    ! sz=$(sed -n 's/.*the smallest --vram that fits is \([0-9.]*\) \?\([MG]\)i\?B.*/\1\2/p' "$TMP/err") ||
    [ -z "$sz" ] || ! "$TT" plan --gpu gtx1650 --host-mem 0 --vram "$sz" --json "$TMP/l16_fp32.recipe" >"$TMP/l16s" 2>>"$TMP/err" ||
    ! python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["precision"] == "fp32", d["precision"]' "$TMP/l16s"; then
    # the smallest plan is fp32 here (fp16 adds 0.6 GiB of weight copies): the refusal names the
    # plan it measured, and the plan at its suggested --vram is that one
    fail vit_plan_vit_l16_gtx1650 "the refusal's smallest plan is not the fp32 one that fits at its --vram ($sz): $(head -c 600 "$TMP/err")"
  else
    echo "# vit_l16.recipe on a GTX 1650 4 GB: int8 moments fit (micro-batch, state bytes: $got); fp32 moments refused"
    pass vit_plan_vit_l16_gtx1650
  fi
else
  fail vit_plan_vit_l16_gtx1650 "plan --gpu gtx1650: $(head -c 600 "$TMP/err") $got"
fi
# Planned host offload (issue 42 item 2): with 4 GiB of pinned host memory the int8 moments go to
# the host and the plan takes a larger micro-batch than on the device alone (fp16: its weight
# copies fit beside the weights and gradients once the moments are gone), and the fp32 moments fit
# too, all of them on the host; `plan` says so on its offload line
if "$TT" plan --gpu gtx1650 --host-mem 4G --json examples/imagenet/vit_l16.recipe >"$TMP/l16o" 2>"$TMP/err" &&
  "$TT" plan --gpu gtx1650 --host-mem 4G --json "$TMP/l16_fp32.recipe" >"$TMP/l16o32" 2>>"$TMP/err" &&
  "$TT" plan --gpu gtx1650 --host-mem 4G examples/imagenet/vit_l16.recipe >"$TMP/l16otxt" 2>>"$TMP/err" &&
  got=$(python3 -c '
import json, sys
dev, off, f32 = (json.load(open(f)) for f in sys.argv[1:4])
assert dev["offload_bytes"] == 0 and not dev["offload"]["optimizer_state"], dev["offload"]
assert off["offload"]["optimizer_state"] and off["offload_bytes"] >= off["optimizer_state_bytes"] > 0, off["offload"]
assert off["micro_batch"] > dev["micro_batch"] and off["arena_bytes"] <= off["budget_bytes"], (off["micro_batch"], dev["micro_batch"])
assert off["predicted_step_ms"] < dev["predicted_step_ms"], (off["predicted_step_ms"], dev["predicted_step_ms"])
assert f32["offload_bytes"] >= 2 * 304326632 * 4 and f32["offload"]["buffers"] == 592, f32["offload"]
print(dev["micro_batch"], off["micro_batch"], off["precision"], off["offload_bytes"])' "$TMP/l16" "$TMP/l16o" "$TMP/l16o32" 2>&1) &&
  grep -q "^  offload     optimizer state in pinned host memory" "$TMP/l16otxt"; then
  echo "# vit_l16.recipe on a GTX 1650 4 GB with --host-mem 4G: micro-batch on the device alone, offloaded, precision, offloaded bytes: $got"
  pass vit_plan_vit_l16_offload
else
  fail vit_plan_vit_l16_offload "plan --gpu gtx1650 --host-mem 4G: $(head -c 600 "$TMP/err") $got"
fi
exit $FAILED
