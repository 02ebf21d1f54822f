#!/bin/bash
# tests/gpu/test_measure.sh — what the lease measures with runs without a GPU (issue 41 items 1 and 8):
#   - tests/bench/resnet50_vs_torch.py --self-check: its medians and spreads, tinytrain's rate from
#     metrics.jsonl with the warm-up left out, nvidia-smi's CSV, the fair cap's arithmetic, and its
#     recipe (synthetic_size, log_every) read by this build's `tinytrain plan`;
#   - its --dry-run: both sides over the same steps, three processes each, the fair PyTorch cap,
#     and what it skipped here said in words, exit 0;
#   - a synthetic set sized by [data] synthetic_size trains past the default 1024 images inside one
#     epoch (the step count the benchmark relies on), and the CPU run's metrics give the rate;
#   - tests/gpu/memprobe.py without a GPU says so and exits 0;
#   - tests/gpu/acceptance.sh --bundle (the lease suite) without a GPU says so, names the lease's
#     steps, runs the benchmark's self-check, and exits 0 (tests/cli/test_bundle.sh checks the
#     prerequisites part).
# Checks the scripts, not numbers. Prints PASS/FAIL/SKIP lines; exits 1 if anything failed.
. "$(dirname "$0")/../tt_test.sh" measure
need_tt measure_tinytrain

# ---- the benchmark's own checks ----
if python3 tests/bench/resnet50_vs_torch.py --self-check >"$TMP/check" 2>&1 && grep -q "self-check: 0 failed" "$TMP/check" &&
   grep -q "^ok   tinytrain plan reads the recipe" "$TMP/check"; then
  pass measure_bench_self_check
else
  fail measure_bench_self_check "$(grep -v '^ok' "$TMP/check" | tail -n 8 | tr '\n' '|')"
fi

python3 tests/bench/resnet50_vs_torch.py --dry-run --fair --batch 256 --steps 24 --warmup 4 --out "$TMP/dry.md" >"$TMP/dry" 2>&1
rc=$?
d=$TMP/dry
if [ $rc = 0 ] && [ "$(grep -c -- '--max-steps 28 ' "$d")" = 4 ] && [ "$(grep -c '"steps": 24, "warmup": 4' "$d")" = 3 ] &&
   grep -q '^- tt-fp16, 3 x: ' "$d" && grep -q '^- tt-fp16-nhwc-graph, 3 x: TINYTRAIN_LAYOUT=nhwc TINYTRAIN_CUDA_CONV_API=graph ' "$d" &&
   grep -q '"fair": true' "$d" && grep -q 'synthetic_size = 7424 images' "$d" &&
   grep -q '^skipped here: ' "$d" && cmp -s "$d" "$TMP/dry.md"; then
  pass measure_bench_dry_run
else
  fail measure_bench_dry_run "exit $rc: $(tr '\n' '|' <"$d" | cut -c1-900)"
fi

# ---- synthetic_size: more steps than 1024 images hold, in one epoch ----
{
  tiny_recipe_head | sed 's/^format = synthetic$/format = synthetic\nsynthetic_size = 3000/; s/^epochs = 1000$/epochs = 1\nlog_every = 50/'
  printf '[flatten]\n[linear]\nout = 10\n'
} >"$TMP/syn.recipe"
if $TT train --device cpu --out "$TMP/run" "$TMP/syn.recipe" >"$TMP/syn.log" 2>&1; then
  steps=$(python3 -c 'import json,sys; print(max([json.loads(l).get("step", 0) for l in open(sys.argv[1]) if "\"train\"" in l] or [0]))' "$TMP/run/metrics.jsonl")
  # 3000 images at batch 12: 250 steps in the epoch (the default set held 85)
  if [ "$steps" = 250 ]; then pass measure_synthetic_size_epoch
  else fail measure_synthetic_size_epoch "last logged step $steps, want 250 (3000 images / batch 12)"; fi
else
  fail measure_synthetic_size_epoch "$(tail -n 5 "$TMP/syn.log" | tr '\n' '|')"
fi

# ---- the memory probe and the lease without a GPU ----
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  skip measure_no_gpu "this machine has a GPU"
  exit $FAILED
fi
out=$(timeout 60 python3 tests/gpu/memprobe.py --no-torch 2>&1)
rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "nothing measured"; then pass measure_memprobe_no_gpu
else fail measure_memprobe_no_gpu "exit $rc: $out"; fi

: >"$TMP/empty.tar.xz"
OUT=$TMP/out timeout 120 bash tests/gpu/acceptance.sh --bundle "$TMP/empty.tar.xz" >"$TMP/acc" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "suite lease, deadline 490 s" "$TMP/acc" && grep -q "no GPU here" "$TMP/acc" &&
   grep -q "memprobe, test_cuda, r50, profile, ncu, torchprof, fair4g" "$TMP/acc" && grep -q "self-check: 0 failed" "$TMP/acc" &&
   [ -f "$TMP/out/gpu-acceptance.md" ] && grep -q "no GPU" "$TMP/out/summary.txt"; then
  pass measure_lease_no_gpu
else
  fail measure_lease_no_gpu "exit $rc: $(tail -n 8 "$TMP/acc" | tr '\n' '|')"
fi
# the lease's caps fit its deadline: the steps' caps (lease.sh's header) sum to at most 490 s less the unpacking
caps=$(sed -n 's/^#   [1-7]\. .* \([0-9][0-9]*\) s$/\1/p; s/^#                .* \([0-9][0-9]*\) s$/\1/p' tests/gpu/lease.sh | awk '{s += $1} END {print s}')
code=$(grep -o 'cap [0-9]*\|step_test_cuda [0-9]*' tests/gpu/lease.sh | grep -o '[0-9]*' | awk '{s += $1} END {print s}')
# ncu's cap is per layout (two runs)
code=$((code + 35))
if [ -n "$caps" ] && [ "$caps" = "$code" ] && [ "$code" -le 480 ]; then pass "measure_lease_caps ($code s of 490)"
else fail measure_lease_caps "the header's caps sum to ${caps:-?} s, the code's to $code s (want equal, at most 480)"; fi
exit $FAILED
