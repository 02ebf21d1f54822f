#!/bin/bash
# tests/bench/dist_cpu.sh — multi-process training on the CPU: 2 ranks x 1 thread (mpirun)
# against 1 rank x 2 threads, on the fashion ResNet (examples/fashion_mnist/resnet.recipe),
# the same global batch and the same micro-batch (half the batch) in both. Prints images/s of
# each (rank 0's metrics.jsonl: the global rate, mean over the logged intervals after the
# first), the share of the training time rank 0 spent in the gradient all-reduce (waiting for
# the other rank included), and the bytes all-reduced per optimizer step.
#
#   tests/bench/dist_cpu.sh [STEPS]      (default 40 optimizer steps; a run on an idle machine)
#
# Fashion-MNIST from $TT_FASHION_DIR or /usr/share/datasets/fashion-mnist; without it a
# synthetic set of the same shape (said in the output). Needs ./tinytrain built with MPI.
cd "$(dirname "$0")/../.." || exit 1
TT=${TT:-./tinytrain}
STEPS=${1:-40}
LOG=$((STEPS / 4 > 0 ? STEPS / 4 : 1))
TMP=$(mktemp -d /tmp/tt_bench_dist_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$TMP"' EXIT
command -v mpirun >/dev/null || { echo "dist_cpu: mpirun not found (openmpi-bin; ./configure.py --deps)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1

DATA=${TT_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
python3 - examples/fashion_mnist/resnet.recipe "$TMP/resnet.recipe" "$DATA" "$LOG" <<'EOF'
import os, re, sys
src, dst, data, log = sys.argv[1:5]
t = open(src).read()
if not os.path.exists(os.path.join(data, "train-images-idx3-ubyte.gz")):
    print("data: Fashion-MNIST not found in %s: a synthetic set of the same shape" % data)
    t = re.sub(r"(?s)\[data\].*?(?=\n\[)", "[data]\nformat = synthetic\nmean = 0.2860\nstd = 0.3530\n", t, count=1)
else:
    t = t.replace("/usr/share/datasets/fashion-mnist", data)
    print("data: Fashion-MNIST from %s" % data)
t = re.sub(r"(?m)^log_every\s*=.*\n", "", t)
t = re.sub(r"(?m)^\[train\]\s*$", "[train]\nlog_every = %s" % log, t, count=1)
open(dst, "w").write(t)
EOF
BATCH=$(sed -n 's/^batch *= *\([0-9]*\).*/\1/p' "$TMP/resnet.recipe" | head -n 1)
MB=$((BATCH / 2))
echo "fashion ResNet: global batch $BATCH, micro-batch $MB, $STEPS optimizer steps, logged every $LOG"

# mean images/s of the logged intervals after the first (the first holds the start-up)
rate() {
  python3 - "$1/metrics.jsonl" <<'EOF'
import json, sys
r = [json.loads(l)["images_per_s"] for l in open(sys.argv[1]) if '"train"' in l]
r = r[1:] or r
print("%.1f" % (sum(r) / len(r)) if r else "nan")
EOF
}

"$TT" --device cpu --threads 2 --micro-batch "$MB" --max-steps "$STEPS" --checkpoint-every 0 --out "$TMP/one" \
  "$TMP/resnet.recipe" >"$TMP/one.out" 2>&1 || { tail -3 "$TMP/one.out"; exit 1; }
mpirun -np 2 --bind-to core "$TT" --device cpu --threads 1 --micro-batch "$MB" --max-steps "$STEPS" --checkpoint-every 0 \
  --out "$TMP/two" "$TMP/resnet.recipe" >"$TMP/two.out" 2>&1 || { tail -5 "$TMP/two.out"; exit 1; }
echo "1 rank  x 2 threads: $(rate "$TMP/one") images/s ($(grep -m1 'policy' "$TMP/one.out" | sed 's/^ *//'))"
echo "2 ranks x 1 thread : $(rate "$TMP/two") images/s ($(grep -m1 'policy' "$TMP/two.out" | sed 's/^ *//') per rank)"
grep '^dist:' "$TMP/two.out" || { echo "dist_cpu: no 'dist:' line from rank 0"; exit 1; }
