#!/usr/bin/env bash
# tests/gpu/acceptance.sh — the CUDA backend's acceptance run on a real GPU: one command, one
# report file (Markdown), under 9 minutes on an H100.
#
#   tests/gpu/acceptance.sh [--no-build] [REPORT]
#
# REPORT defaults to $OUT/gpu-acceptance.md when $OUT is set (the lent device machine), else
# build/gpu-acceptance.md. Steps, each with its own section and PASS/FAIL/SKIP line:
#   1. build for the device (./configure.py --cuda-arch native && ninja), unless --no-build;
#   2. build/tests/test_cuda on the GPU: every op CUDA against CPU, a CUDA step against the CPU
#      step (fp32, fp16), no allocation after setup, the device peak against the plan;
#   3. compute-sanitizer memcheck and racecheck on a short training run (LeNet, 2 steps);
#   4. the fashion ResNet (examples/fashion_mnist/resnet.recipe) for one epoch with --vram 4G
#      --device cuda while sampling the process's device memory (nvidia-smi
#      --query-compute-apps), against `plan --json` for the same recipe and budget: the peak must
#      stay under --vram, plan and train must choose the same arena;
#   4b. mpirun -np 2 through NCCL against one process with 2 accumulation steps (LeNet);
#   5. tests/bench/resnet50_vs_torch.py (numbers only).
# Fashion-MNIST: $TT_FASHION_DIR, else /usr/share/datasets/fashion-mnist, else
# build/data/fashion-mnist (a copy carried to the device machine); with none, a synthetic set
# of the same shape, and the report says so. Exit status: 0 when every check passed or was
# skipped for a stated reason, 1 otherwise. Without a GPU: says so, checks its prerequisites,
# exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BUILD=1
if [ "${1:-}" = "--no-build" ]; then BUILD=0; shift; fi
if [ -n "${1:-}" ]; then REPORT=$1; elif [ -n "${OUT:-}" ]; then REPORT=$OUT/gpu-acceptance.md; else REPORT=build/gpu-acceptance.md; fi
mkdir -p "$(dirname "$REPORT")" build
WORK=$(mktemp -d /tmp/tt_accept.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
T0=$(date +%s)
FAILS=0

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
block() { { echo '```'; tail -n "${2:-40}" "$1"; echo '```'; } >>"$REPORT"; }
result() { # result PASS|FAIL|SKIP name why
  say "**$1** $2${3:+: $3}"
  [ "$1" = FAIL ] && FAILS=$((FAILS + 1))
  return 0
}
elapsed() { echo $(($(date +%s) - T0)); }

: >"$REPORT"
say "# tinytrain GPU acceptance — $(date -u '+%Y-%m-%d %H:%M UTC')"
say ""
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"

# ---- prerequisites (checked with or without a GPU) ----
missing=()
for t in python3 ninja; do command -v "$t" >/dev/null || missing+=("$t"); done
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
[ -n "$NVCC" ] || missing+=("nvcc (the CUDA toolkit)")
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1 || true)
[ -n "$CS" ] || say "note: compute-sanitizer not found; step 3 will be skipped"
FASHION=""
for d in "${TT_FASHION_DIR:-}" /usr/share/datasets/fashion-mnist build/data/fashion-mnist; do
  if [ -n "$d" ] && [ -f "$d/train-images-idx3-ubyte.gz" ] && [ -f "$d/t10k-labels-idx1-ubyte.gz" ]; then FASHION=$(cd "$d" && pwd); break; fi
done
SMI=$(command -v nvidia-smi || true)
GPU=""
[ -n "$SMI" ] && GPU=$("$SMI" --query-gpu=name,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
if [ -z "$GPU" ]; then
  say ""
  say "no GPU here (${SMI:+nvidia-smi lists none}${SMI:-nvidia-smi not found}): nothing to accept."
  if [ ${#missing[@]} -gt 0 ]; then say "prerequisites missing: ${missing[*]}"; else say "prerequisites present: python3, ninja, nvcc ($NVCC)${CS:+, compute-sanitizer}"; fi
  say "Fashion-MNIST: ${FASHION:-not found (the run would use a synthetic set of the same shape)}"
  python3 tests/bench/resnet50_vs_torch.py >"$WORK/bench" 2>&1
  say "tests/bench/resnet50_vs_torch.py without a GPU: $(tail -n 1 "$WORK/bench")"
  say "report: $REPORT"
  exit 0
fi
say "GPU: $GPU; driver $("$SMI" --query-gpu=driver_version --format=csv,noheader | head -n 1)"
if [ ${#missing[@]} -gt 0 ]; then
  result FAIL prerequisites "missing ${missing[*]}"
  exit 1
fi

# ---- 1. build for the device ----
say ""
say "## 1. build"
if [ $BUILD = 1 ]; then
  if ./configure.py --cuda-arch native >"$WORK/build" 2>&1 && ninja tinytrain build/tests/test_cuda >>"$WORK/build" 2>&1; then
    result PASS build "$(grep 'CUDA arch' "$WORK/build" | head -n 1) ($(elapsed) s)"
  else
    block "$WORK/build"
    result FAIL build "configure or ninja failed"
    exit 1
  fi
else
  [ -x tinytrain ] && [ -x build/tests/test_cuda ] || { result FAIL build "--no-build but ./tinytrain or build/tests/test_cuda is missing"; exit 1; }
  result SKIP build "--no-build: using the binaries present"
fi
say "$(./tinytrain --version 2>&1 | tr '\n' ' ')"

# ---- 2. test_cuda ----
say ""
say "## 2. test_cuda on the GPU"
timeout 300 build/tests/test_cuda >"$WORK/tc" 2>&1
rc=$?
block "$WORK/tc" 60
np=$(grep -c '^PASS' "$WORK/tc"); nf=$(grep -c '^FAIL' "$WORK/tc"); ns=$(grep -c '^SKIP' "$WORK/tc")
if [ $rc = 0 ] && [ "$nf" = 0 ] && [ "$np" -gt 0 ]; then result PASS test_cuda "$np passed, $ns skipped"
else result FAIL test_cuda "exit $rc, $np passed, $nf failed, $ns skipped"; fi

# Recipes: the fashion ones on the real data, else a synthetic set of the same shape
recipe_for() { # recipe_for SRC DST
  if [ -n "$FASHION" ]; then
    sed "s#/usr/share/datasets/fashion-mnist#$FASHION#g" "$1" >"$2"
  else
    python3 - "$1" "$2" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
t = re.sub(r"(?s)\[data\].*?(?=\n\[)", "[data]\nformat = synthetic\nmean = 0.2860\nstd = 0.3530\n", t, count=1)
open(sys.argv[2], "w").write(t)
EOF
  fi
}
[ -n "$FASHION" ] || say "note: Fashion-MNIST not found (TT_FASHION_DIR, /usr/share/datasets/fashion-mnist, build/data/fashion-mnist): steps 3-4 train on a synthetic set of the same shape (1024 images)"
recipe_for examples/fashion_mnist/lenet.recipe "$WORK/lenet.recipe"
recipe_for examples/fashion_mnist/resnet.recipe "$WORK/resnet.recipe"

# ---- 3. compute-sanitizer ----
say ""
say "## 3. compute-sanitizer (LeNet, 2 steps, --vram 4G)"
if [ -z "$CS" ]; then
  result SKIP compute-sanitizer "not installed"
else
  for tool in memcheck racecheck; do
    timeout 240 "$CS" --tool "$tool" --error-exitcode 99 --print-limit 20 ./tinytrain --device cuda --vram 4G --max-steps 2 \
      --out "$WORK/cs_$tool" "$WORK/lenet.recipe" >"$WORK/cs" 2>&1
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$WORK/cs" | tail -n 1)
    if [ $rc = 0 ]; then result PASS "compute-sanitizer $tool" "${summary:-clean}"
    else block "$WORK/cs" 30; result FAIL "compute-sanitizer $tool" "exit $rc; ${summary:-see above}"; fi
  done
fi

# ---- 4. fashion ResNet, one epoch, --vram 4G: device memory against the plan ----
say ""
say "## 4. fashion ResNet, one epoch, --vram 4G --device cuda"
./tinytrain plan --json --vram 4G --device cuda "$WORK/resnet.recipe" >"$WORK/plan.json" 2>"$WORK/plan.err"
if [ $? != 0 ]; then
  block "$WORK/plan.err"
  result FAIL "plan" "tinytrain plan failed"
else
  ./tinytrain --device cuda --vram 4G --epochs 1 --out "$WORK/resnet_run" "$WORK/resnet.recipe" >"$WORK/train" 2>&1 &
  pid=$!
  (sleep 300; kill $pid 2>/dev/null) &
  watchdog=$!
  peak=0
  while kill -0 $pid 2>/dev/null; do
    m=$("$SMI" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | awk -F', *' -v p=$pid '$1 == p {print $2}')
    [ -n "$m" ] && [ "$m" -gt "$peak" ] 2>/dev/null && peak=$m
    sleep 0.2
  done
  wait $pid
  rc=$?
  kill $watchdog 2>/dev/null
  block "$WORK/train" 25
  python3 - "$WORK/plan.json" "$WORK/train" "$peak" "$rc" >"$WORK/cmp" 2>&1 <<'EOF'
import json, re, sys
plan = json.load(open(sys.argv[1]))
train = open(sys.argv[2]).read()
peak, rc = float(sys.argv[3]), int(sys.argv[4])
mib = 1048576.0
arena_plan, lb_plan = plan["arena_bytes"] / mib, plan["peak_live_bytes"] / mib
# the training summary: "policy micro-batch M x A accumulation steps = effective batch B; fp32|fp16 autocast ..." (plan's words) and
# "memory arena X MiB (lower bound Y MiB)": X also holds the evaluation program's transient
# region, so plan and train are compared on the training program's lower bound and policy
m = re.search(r"memory\s+arena ([0-9.]+) MiB \(lower bound ([0-9.]+) MiB\)", train)
arena_train, lb_train = (float(m.group(1)), float(m.group(2))) if m else (float("nan"), float("nan"))
pm = re.search(r"policy\s+micro-batch (\d+) x (\d+) accumulation steps = effective batch \d+; (fp32|fp16)", train)
same_policy = bool(pm) and (int(pm.group(1)), int(pm.group(2)), pm.group(3)) == (
    plan["micro_batch"], plan["accum_steps"], plan["precision"])
vram = plan["vram_bytes"] / mib
print("plan: micro-batch %d x %d, %s, arena %.1f MiB, reserve %.1f MiB (measured: %s), budget %.1f MiB, device free %s"
      % (plan["micro_batch"], plan["accum_steps"], plan["precision"], arena_plan, plan["reserve_bytes"] / mib,
         plan["reserve_measured"], plan["budget_bytes"] / mib,
         "%.1f MiB" % (plan["device_free_bytes"] / mib) if plan["device_free_bytes"] is not None else "unknown"))
print("train: exit %d, %s; arena %.1f MiB (with the evaluation region), lower bound %.1f MiB (plan %.1f MiB); "
      "peak device memory of the process (NVML) %.0f MiB of --vram %.0f MiB"
      % (rc, pm.group(0) if pm else "no policy line", arena_train, lb_train, lb_plan, peak, vram))
print("peak - arena = %.0f MiB (context, kernels, library handles and what cuDNN/cuBLAS loaded), planned reserve %.0f MiB"
      % (peak - arena_train, plan["reserve_bytes"] / mib))
ok = rc == 0 and peak > 0 and peak <= vram and same_policy and abs(lb_train - lb_plan) < 0.05
print("VERDICT", "PASS" if ok else "FAIL",
      "" if ok else "(train failed)" if rc else "(no memory sample)" if peak <= 0 else
      "(peak over --vram)" if peak > vram else "(plan and train chose different policies or programs)")
EOF
  cat "$WORK/cmp" >>"$REPORT"
  v=$(grep '^VERDICT' "$WORK/cmp")
  if echo "$v" | grep -q PASS; then result PASS "resnet 4G" "peak ${peak} MiB under --vram 4G; plan and train agree"
  else result FAIL "resnet 4G" "${v#VERDICT FAIL }"; fi
fi

# ---- 4b. two processes through NCCL (core/runtime/dist.c, kernels/cuda/cuda_nccl.cu) ----
# mpirun -np 2 against one process with two accumulation steps of the same micro-batch (LeNet,
# fp32, 20 steps): the weights must agree within 1e-3, batch-norm running statistics left out
# (each rank keeps its own between broadcasts; cuDNN's algorithms need not be
# deterministic). Each rank takes the GPU of its local rank modulo the GPUs it sees; NCCL
# refuses two ranks on one GPU ("Duplicate GPU detected"), which is then reported as a SKIP.
say ""
say "## 4b. NCCL: mpirun -np 2 against one process with 2 accumulation steps (LeNet, 20 steps)"
if ! command -v mpirun >/dev/null; then
  result SKIP nccl "mpirun not found (openmpi-bin)"
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  ./tinytrain --device cuda --vram 4G --precision fp32 --micro-batch 64 --max-steps 20 --out "$WORK/nccl1" \
    "$WORK/lenet.recipe" >"$WORK/nccl" 2>&1
  rc1=$?
  timeout 240 mpirun -np 2 -x NCCL_DEBUG=WARN ./tinytrain --device cuda --vram 4G --precision fp32 --micro-batch 64 --max-steps 20 \
    --out "$WORK/nccl2" "$WORK/lenet.recipe" >>"$WORK/nccl" 2>&1
  rc2=$?
  block "$WORK/nccl" 20
  if grep -q "Duplicate GPU" "$WORK/nccl" || { [ "$("$SMI" -L | grep -c '^GPU')" -lt 2 ] && grep -qi "invalid usage" "$WORK/nccl"; }; then
    result SKIP nccl "NCCL refuses two ranks on one GPU: needs a machine with 2 GPUs"
  elif [ $rc1 != 0 ] || [ $rc2 != 0 ]; then
    result FAIL nccl "one process exit $rc1, mpirun -np 2 exit $rc2"
  elif m=$(python3 tests/tools/st_compare.py --tol 1e-3 --skip running_ "$WORK/nccl1/weights.safetensors" "$WORK/nccl2/weights.safetensors"); then
    result PASS nccl "$m"
  else
    result FAIL nccl "$m"
  fi
fi

# ---- 5. ResNet-50 against PyTorch ----
say ""
say "## 5. ResNet-50 224x224 against PyTorch ($(elapsed) s so far)"
timeout 240 python3 tests/bench/resnet50_vs_torch.py --out "$WORK/r50.md" >"$WORK/r50" 2>&1
rc=$?
if [ -f "$WORK/r50.md" ]; then cat "$WORK/r50.md" >>"$REPORT"; else block "$WORK/r50" 30; fi
if [ $rc = 0 ]; then result PASS "resnet50 bench" "numbers above (a benchmark: it does not judge them)"
else result FAIL "resnet50 bench" "exit $rc"; fi

say ""
say "$FAILS failed; $(elapsed) s in all. Report: $REPORT"
[ $FAILS = 0 ]
