#!/bin/bash
# tests/compile/test_plan_device.sh — `plan` answers for what `train` runs here: for every example recipe
# (its [data] made synthetic) `plan --vram 4G` and the start of `train --vram 4G` print the same
# policy line, on the same device; `plan --device cuda --gpu t4` plans for a T4 (fp16, the T4's
# reserve and memory) on any machine. Run from the repository root: bash tests/compile/test_plan_device.sh
. "$(dirname "$0")/../tt_test.sh" plan_device
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
need_tt plan_device_binary

# ---- the policy line of plan = the policy line train prints at its start ----
ok=1
n=0
while IFS= read -r r; do
  n=$((n + 1))
  name=$(basename "$r" .recipe)
  # the recipe without its [data] section, then synthetic data (nothing to read)
  awk '/^\[/{skip = ($0 == "[data]")} !skip' "$r" >"$TMP/$name.recipe"
  printf '[data]\nformat = synthetic\n' >>"$TMP/$name.recipe"
  if ! "$TT" plan --vram 4G "$TMP/$name.recipe" >"$TMP/plan.out" 2>"$TMP/plan.err"; then
    fail plan_train_policy "$r: plan failed: $(cat "$TMP/plan.err")"; ok=0; continue
  fi
  want=$(sed -n 's/^  policy  *//p' "$TMP/plan.out")
  # train prints the policy before its first step: read it, then stop the run (a large network's
  # first step on the CPU takes minutes). Emptied first: the background job opens it only when it
  # is scheduled, and under load the loop below could otherwise read the previous recipe's lines.
  : >"$TMP/train.out"
  "$TT" --vram 4G --max-steps 1 --out "$TMP/run-$name" "$TMP/$name.recipe" >"$TMP/train.out" 2>"$TMP/train.err" &
  PID=$!
  for _ in $(seq 1 600); do
    grep -q '^  policy' "$TMP/train.out" && break
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=
  got=$(sed -n 's/^  policy  *//p' "$TMP/train.out")
  if [ -z "$want" ] || [ "$want" != "$got" ]; then
    fail plan_train_policy "$r: plan says '$want', train says '$got' $(head -c 300 "$TMP/train.err")"; ok=0; continue
  fi
  # the same device: plan's first line names what train runs on
  dev=$(sed -n '1s/^tinytrain [^:]*: .* on \([a-z]*\)$/\1/p' "$TMP/train.out")
  first=$(head -n 1 "$TMP/plan.out")
  case "$dev" in
    cpu) echo "$first" | grep -q " on the CPU" || { fail plan_train_policy "$r: train runs on the CPU, plan says: $first"; ok=0; continue; } ;;
    cuda) echo "$first" | grep -q " on the GPU here" || { fail plan_train_policy "$r: train runs on a GPU, plan says: $first"; ok=0; continue; } ;;
    *) fail plan_train_policy "$r: train's first line names no device: $(head -n 1 "$TMP/train.out")"; ok=0; continue ;;
  esac
  echo "# $r: $dev: $got"
done < <(find examples -name '*.recipe' | sort)
[ $n -gt 0 ] || { fail plan_train_policy "no examples/**/*.recipe"; ok=0; }
[ $ok = 1 ] && pass plan_train_policy

# ---- plan --device cuda --gpu t4: a T4 planned for on any machine ----
if ! "$TT" plan --device cuda --gpu t4 --json examples/imagenet/resnet50.recipe >"$TMP/t4.json" 2>"$TMP/t4.err"; then
  fail plan_gpu_t4 "exit $?: $(cat "$TMP/t4.err")"
elif ! python3 - "$TMP/t4.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["precision"] == "fp16", "precision %r" % d["precision"]
assert d["target"] == "cuda" and "T4" in d["planned_for"], "planned for %r" % d["planned_for"]
assert d["reserve_bytes"] == 600 << 20 and not d["reserve_measured"], "reserve %r" % d["reserve_bytes"]
assert d["vram_bytes"] == 15 << 30, "vram %r (the T4's memory when no --vram is given)" % d["vram_bytes"]
PY
then fail plan_gpu_t4 "$(head -c 400 "$TMP/t4.json")"
else
  "$TT" plan --device cuda --gpu t4 --vram 8G examples/fashion_mnist/lenet.recipe >"$TMP/t4.out" 2>&1
  if ! head -n 1 "$TMP/t4.out" | grep -q "on NVIDIA T4 16 GB"; then fail plan_gpu_t4 "first line: $(head -n 1 "$TMP/t4.out")"
  elif "$TT" plan --gpu k80 examples/fashion_mnist/lenet.recipe 2>"$TMP/k80.err"; then fail plan_gpu_t4 "--gpu k80 accepted"
  elif ! grep -q "known: t4, gtx1650" "$TMP/k80.err"; then fail plan_gpu_t4 "--gpu k80: $(cat "$TMP/k80.err")"
  else pass plan_gpu_t4
  fi
fi
# ---- TF32: the plan's tf32 line and JSON field per card, recipe key and --tf32 ----
L=examples/fashion_mnist/lenet.recipe
sed 's/^\[train\]$/[train]\ntf32 = off/' "$L" >"$TMP/lenet_notf32.recipe"
"$TT" plan --gpu a100 --precision fp32 "$L" >"$TMP/a100.out" 2>&1
"$TT" plan --gpu a100 --precision fp32 --tf32 off "$L" >"$TMP/a100off.out" 2>&1
"$TT" plan --gpu a100 --precision fp32 "$TMP/lenet_notf32.recipe" >"$TMP/a100rec.out" 2>&1
"$TT" plan --gpu a100 --precision fp32 --tf32 on "$TMP/lenet_notf32.recipe" >"$TMP/a100recon.out" 2>&1
"$TT" plan --gpu a100 --precision bf16 "$L" >"$TMP/a100bf.out" 2>&1
"$TT" plan --gpu t4 --precision fp32 "$L" >"$TMP/t4tf.out" 2>&1
"$TT" plan --device cpu "$L" >"$TMP/cputf.out" 2>&1
"$TT" plan --gpu a100 --precision fp32 --json "$L" >"$TMP/a100.json" 2>&1
"$TT" plan --device cpu --json "$L" >"$TMP/cpu.json" 2>&1
if ! grep -q "^  tf32        on (\[train\] tf32 = on, the default): fp32 convolutions and GEMMs on TF32" "$TMP/a100.out"; then
  fail plan_tf32 "a100: $(grep tf32 "$TMP/a100.out")"
elif ! grep -q "^  tf32        off (--tf32 off)" "$TMP/a100off.out"; then fail plan_tf32 "a100 --tf32 off: $(grep tf32 "$TMP/a100off.out")"
elif ! grep -q "^  tf32        off (\[train\] tf32 = off)" "$TMP/a100rec.out"; then fail plan_tf32 "tf32 = off: $(grep tf32 "$TMP/a100rec.out")"
elif ! grep -q "^  tf32        on (--tf32 on)" "$TMP/a100recon.out"; then
  fail plan_tf32 "--tf32 on over tf32 = off: $(grep tf32 "$TMP/a100recon.out")"
elif ! grep -q "unused by this plan" "$TMP/a100bf.out"; then fail plan_tf32 "a100 bf16: $(grep tf32 "$TMP/a100bf.out")"
elif ! grep -q "^  tf32        asked .* but not used: compute capability 7.5" "$TMP/t4tf.out"; then fail plan_tf32 "t4: $(grep tf32 "$TMP/t4tf.out")"
elif grep -q "tf32" "$TMP/cputf.out"; then fail plan_tf32 "the CPU plan has a tf32 line"
elif ! python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); c=json.load(open(sys.argv[2])); assert a["tf32"] is True and c["tf32"] is None and c["conv_workspace_cap_bytes"] is None, (a["tf32"], c["tf32"])' "$TMP/a100.json" "$TMP/cpu.json"; then
  fail plan_tf32 "JSON tf32 fields"
elif "$TT" plan --tf32 maybe "$L" >/dev/null 2>"$TMP/tfbad.err"; [ $? -ne 2 ]; then fail plan_tf32 "--tf32 maybe: not exit 2"
else pass plan_tf32
fi
# ---- the activations' layout planned for a CUDA card (backend.h's layouts_16bit): NCHW by default
# (cuda_backend.cu: measured faster on an H100); under TINYTRAIN_LAYOUT=nhwc, NHWC between
# convolutions for bf16 and fp16 and still NCHW for fp32 ----
TINYTRAIN_LAYOUT=nhwc "$TT" plan --gpu t4 --precision fp16 "$L" >"$TMP/t4h.out" 2>&1
TINYTRAIN_LAYOUT=nhwc "$TT" plan --gpu a100 --precision bf16 "$L" >"$TMP/a100nhwc.out" 2>&1
TINYTRAIN_LAYOUT=nhwc "$TT" plan --gpu a100 --precision fp32 "$L" >"$TMP/a100nhwc32.out" 2>&1
if ! grep -q "^  layout      NCHW for every activation (the backend's choice" "$TMP/a100bf.out"; then
  fail plan_cuda_layout "a100 bf16, default: $(grep -A1 '^  layout' "$TMP/a100bf.out")"
elif ! grep -q "^  layout      NHWC (channels-last) for [1-9]" "$TMP/a100nhwc.out"; then
  fail plan_cuda_layout "a100 bf16, TINYTRAIN_LAYOUT=nhwc: $(grep -A1 '^  layout' "$TMP/a100nhwc.out")"
elif ! grep -q "^  layout      NHWC (channels-last) for [1-9]" "$TMP/t4h.out"; then fail plan_cuda_layout "t4 fp16: $(grep -A1 '^  layout' "$TMP/t4h.out")"
elif ! grep -q "^  layout      NCHW for every activation (fp32: this backend takes NHWC for fp16/bf16 activations only)" "$TMP/a100nhwc32.out"; then
  fail plan_cuda_layout "a100 fp32, TINYTRAIN_LAYOUT=nhwc: $(grep '^  layout' "$TMP/a100nhwc32.out")"
elif ! grep -q "^  layout      NCHW for every activation" "$TMP/a100.out"; then
  fail plan_cuda_layout "a100 fp32: $(grep '^  layout' "$TMP/a100.out")"
else pass plan_cuda_layout
fi
exit $FAILED
