# tests/tt_test.sh — the prelude every shell test sources, the shell side of tests/tt_test.h:
#   . "$(dirname "$0")/../tt_test.sh" NAME    (tests/<stage>/test_NAME.sh; tests/test_*.sh: /tt_test.sh)
# It goes to the repository root (the tests name every path from there), sets
#   TT      the binary under test (TT=build-x/tinytrain picks another; default ./tinytrain),
#   FAILED  0 until fail() runs: the script ends with `exit $FAILED`,
#   TMP     a fresh /tmp/tt_test_NAME_XXXXXX, removed on exit (a script that must do more on
#           exit sets its own trap, which removes $TMP too),
# and defines the PASS / FAIL / SKIP lines that tests/run_tests.py counts:
#   pass NAME, fail NAME WHY..., skip NAME WHY, need_tt NAME (FAIL NAME and exit 1 unless $TT is built),
# tiny_recipe_head and syn_recipe, small synthetic recipes several CLI tests train, and
# stop_at_step, which signals a background run once it has logged a step.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
TT=${TT:-./tinytrain}
FAILED=0
TMP=$(mktemp -d "/tmp/tt_test_${1:?tt_test.sh: the test name}_XXXXXX")
trap 'rm -rf "$TMP"' EXIT
pass() { echo "PASS $1"; }
fail() { local n=$1; shift; echo "FAIL $n: $*"; FAILED=1; }
skip() { echo "SKIP $1: $2"; }
need_tt() { [ -x "$TT" ] || { fail "$1" "$TT not built (run ninja)"; exit 1; }; }
# The [net] ... [flatten] of a recipe that trains in milliseconds on the CPU: 1x8x8 synthetic
# images of 10 classes, batch 12, adam at 0.01, seed 7, one 4-filter 3x3 conv; the caller appends
# the [linear] layers.
tiny_recipe_head() {
  cat <<'EOR'
[net]
input = 1x8x8
classes = 10
[train]
batch = 12
optimizer = adam
lr = 0.01
epochs = 1000
seed = 7
[data]
format = synthetic
[conv c1]
filters = 4
size = 3
[relu]
[flatten]
EOR
}
# stop_at_step SIG PID METRICS STEP PAUSE: waits (600 polls PAUSE seconds apart) until the run PID
# has logged "step": STEP in its METRICS file or ended, sends it SIG, and returns its exit status.
stop_at_step() {
  local _
  for _ in $(seq 1 600); do
    grep -q "\"step\": $4," "$3" 2>/dev/null && break
    kill -0 "$2" 2>/dev/null || break
    sleep "$5"
  done
  kill -"$1" "$2" 2>/dev/null
  wait "$2"
}
# syn_recipe N [LINE...]: a recipe of 1x8x8 synthetic images of 10 classes, batch 16 for 200
# epochs (the [train] section extended by the LINEs), through N 4-filter 3x3 convolutions to a
# 10-way linear layer.
syn_recipe() {
  local n=$1 i
  shift
  printf '[net]\ninput = 1x8x8\nclasses = 10\n[train]\nbatch = 16\nepochs = 200\n'
  for i in "$@"; do echo "$i"; done
  printf '[data]\nformat = synthetic\n'
  for ((i = 0; i < n; i++)); do printf '[conv]\nfilters = 4\nsize = 3\n'; done
  printf '[flatten]\n[linear fc]\nout = 10\n'
}
