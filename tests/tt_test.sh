# tests/tt_test.sh — the prelude every shell test sources, the shell side of tests/tt_test.h:
#   . "$(dirname "$0")/../tt_test.sh" NAME    (tests/<stage>/test_NAME.sh; tests/test_*.sh: /tt_test.sh)
# It goes to the repository root (the tests name every path from there), sets
#   TT      the binary under test (TT=build-x/tinytrain picks another; default ./tinytrain),
#   FAILED  0 until fail() runs: the script ends with `exit $FAILED`,
#   TMP     a fresh /tmp/tt_test_NAME_XXXXXX, removed on exit (a script that must do more on
#           exit sets its own trap, which removes $TMP too),
# and defines the PASS / FAIL / SKIP lines that tests/run_tests.py counts:
#   pass NAME, fail NAME WHY..., skip NAME WHY, need_tt NAME (FAIL NAME and exit 1 unless $TT is built).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
TT=${TT:-./tinytrain}
FAILED=0
TMP=$(mktemp -d "/tmp/tt_test_${1:?tt_test.sh: the test name}_XXXXXX")
trap 'rm -rf "$TMP"' EXIT
pass() { echo "PASS $1"; }
fail() { local n=$1; shift; echo "FAIL $n: $*"; FAILED=1; }
skip() { echo "SKIP $1: $2"; }
need_tt() { [ -x "$TT" ] || { fail "$1" "$TT not built (run ninja)"; exit 1; }; }
