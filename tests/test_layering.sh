#!/bin/bash
# tests/test_layering.sh — core/'s stage folders run one way (base -> compile -> data -> runtime
# -> app), in includes and in calls, with no circle between files; kernels/ and arena/ include
# nothing from core/. See tests/tools/check_layering.py.
cd "$(dirname "$0")/.." || exit 1
python3 tests/tools/check_layering.py "${TT_BUILD:-build}"
