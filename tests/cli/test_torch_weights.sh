#!/bin/bash
# tests/cli/test_torch_weights.sh — weights.safetensors means the same thing to PyTorch as to tinytrain:
# trains a tiny CNN (batch norm, dropout, mean/std normalisation) on Fashion-MNIST for a few
# hundred steps, evaluates the weights with `tinytrain eval`, evaluates the same file with an
# independent PyTorch implementation of the net (tests/torch_ref/check_weights.py) and checks
# the two test accuracies agree within 0.1 percentage points.
# SKIP when the Fashion-MNIST files (Debian dataset-fashion-mnist) or PyTorch (python3-torch)
# are absent. FMNIST_DIR overrides the data directory, TT_TEST_DEVICE the device (cpu).
cd "$(dirname "$0")/../.." || exit 1
NAME=torch_weights
TT=${TT:-./tinytrain}
DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
DEVICE=${TT_TEST_DEVICE:-cpu}
STEPS=150
PY=/usr/bin/python3

for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  if [ ! -f "$DIR/$f" ]; then
    echo "SKIP $NAME: Fashion-MNIST not found ($DIR/$f; apt-get install dataset-fashion-mnist)"
    exit 0
  fi
done
if [ ! -x "$TT" ]; then
  echo "FAIL $NAME: $TT not built (run ninja)"
  exit 1
fi

TMP=$(mktemp -d /tmp/tt_test_torch_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
RECIPE=$TMP/tiny_fmnist.recipe
# keep in step with TinyCNN in tests/torch_ref/check_weights.py
cat >"$RECIPE" <<EOF
[net]
input = 1x28x28
classes = 10
[train]
batch = 64
epochs = 1
optimizer = sgd
lr = 0.05
momentum = 0.9
nesterov = true
weight_decay = 5e-4
schedule = constant
warmup_epochs = 0.05
seed = 3
log_every = 50
[data]
format = idx
train = $DIR/train-images-idx3-ubyte.gz
train_labels = $DIR/train-labels-idx1-ubyte.gz
test = $DIR/t10k-images-idx3-ubyte.gz
test_labels = $DIR/t10k-labels-idx1-ubyte.gz
mean = 0.2860
std = 0.3530
[conv conv1]
filters = 8
size = 5
bias = false
[bn bn1]
activation = relu
[maxpool pool1]
size = 2
[conv conv2]
filters = 16
size = 3
[bn bn2]
activation = relu
[maxpool pool2]
size = 2
[flatten]
[linear fc1]
out = 64
activation = relu
[dropout]
p = 0.2
[linear fc2]
out = 10
EOF

t0=$(date +%s.%N)
if ! "$TT" --device "$DEVICE" --max-steps $STEPS --out "$TMP/run" "$RECIPE" >"$TMP/train.log" 2>&1; then
  echo "FAIL $NAME: training failed: $(tail -n 3 "$TMP/train.log" | tr '\n' ' ')"
  exit 1
fi
t1=$(date +%s.%N)
if ! "$TT" eval --device "$DEVICE" --weights "$TMP/run/weights.safetensors" "$RECIPE" >"$TMP/eval.log" 2>&1; then
  echo "FAIL $NAME: tinytrain eval failed: $(tail -n 3 "$TMP/eval.log" | tr '\n' ' ')"
  exit 1
fi
t2=$(date +%s.%N)
# "accuracy 0.8123 (81.23%) loss 0.5123 on 10000 test images"
TT_ACC=$(sed -n 's/^accuracy \([0-9.]*\) .*/\1/p' "$TMP/eval.log" | tail -n 1)
if [ -z "$TT_ACC" ]; then
  echo "FAIL $NAME: no accuracy in the output of tinytrain eval: $(cat "$TMP/eval.log")"
  exit 1
fi
echo "# tinytrain ($STEPS steps on $DEVICE, $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s; eval $(awk "BEGIN{printf \"%.1f\", $t2 - $t1}") s): $(grep '^accuracy' "$TMP/eval.log")"

if [ ! -x "$PY" ] || ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "SKIP $NAME: PyTorch is not installed for $PY (apt-get install python3-torch); tinytrain accuracy $TT_ACC"
  exit 0
fi
if ! TORCH_OUT=$("$PY" tests/torch_ref/check_weights.py "$RECIPE" "$TMP/run/weights.safetensors" 2>&1); then
  echo "FAIL $NAME: check_weights.py: $(echo "$TORCH_OUT" | tail -n 1)"
  exit 1
fi
echo "# $TORCH_OUT"
TORCH_ACC=$(echo "$TORCH_OUT" | sed -n 's/^torch accuracy \([0-9.]*\) .*/\1/p')
if [ -z "$TORCH_ACC" ]; then
  echo "FAIL $NAME: no accuracy from check_weights.py: $TORCH_OUT"
  exit 1
fi
# the net must have learnt something, or agreement means little
if "$PY" -c "import sys; t, p = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(t - p) <= 0.001 and p > 0.5 else 1)" \
  "$TT_ACC" "$TORCH_ACC"; then
  echo "# tinytrain accuracy $TT_ACC vs PyTorch $TORCH_ACC"
  echo "PASS $NAME"
else
  echo "FAIL $NAME: tinytrain accuracy $TT_ACC vs PyTorch $TORCH_ACC (want within 0.001 and above 0.5)"
  exit 1
fi
