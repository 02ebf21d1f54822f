#!/bin/bash
# tests/test_layering.sh — the house's shape: core/'s stage folders run one way (base -> compile ->
# data -> runtime -> app), in includes and in calls, with no circle between files; kernels/ and
# arena/ include nothing from core/; the executor runs the final call list and reads no graph
# (tests/tools/check_layering.py); and no library file is over 1,000 lines, no test source over
# 1,500, no library function over 150 (tests/tools/check_sizes.py).
cd "$(dirname "$0")/.." || exit 1
rc=0
python3 tests/tools/check_layering.py "${TT_BUILD:-build}" || rc=1
python3 tests/tools/check_sizes.py || rc=1
exit $rc
