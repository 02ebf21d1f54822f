#!/bin/bash
# tests/runtime/test_omp_wait.sh — how long tinytrain's OpenMP threads busy-wait (core/app/main.c,
# main_omp_waits): with neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT set, libgomp itself (not just
# the environment) runs with GOMP_SPINCOUNT=10000 on a busy machine (TINYTRAIN_OMP_SPIN=short
# forces it, long keeps libgomp's 300000, auto follows the load average) (and --version names oneDNN's threading
# runtime: OpenMP means its threads are libgomp's too); a user's OMP_WAIT_POLICY (active, passive) or
# GOMP_SPINCOUNT is what libgomp runs with, unchanged; the arguments survive the program running
# itself again. libgomp's own report (OMP_DISPLAY_ENV=verbose, printed by the runtime when it
# starts) is the evidence: the last report is the process that runs.
# Run from the repository root: bash tests/runtime/test_omp_wait.sh
. "$(dirname "$0")/../tt_test.sh" omp_wait
need_tt omp_wait_binary

# the spin count libgomp runs with in the process that stays: its last OMP_DISPLAY_ENV report
spins() { # env assignments... -- tinytrain arguments...
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "${envs[@]}" OMP_DISPLAY_ENV=verbose "$TT" "$@" >"$TMP/out" 2>"$TMP/err"
  echo "rc=$? $(sed -n "s/^ *GOMP_SPINCOUNT = '\([^']*\)'.*/\1/p" "$TMP/err" | tail -1)"
}

if ! grep -q "OPENMP DISPLAY ENVIRONMENT" <(env OMP_DISPLAY_ENV=verbose "$TT" --version 2>&1); then
  echo "SKIP omp_wait: this build's OpenMP runtime does not report OMP_DISPLAY_ENV (not libgomp)"
  exit 0
fi

# oneDNN's threads are the ones the setting reaches only when oneDNN runs on OpenMP (Debian's
# does): --version names its threading runtime, from the library loaded
rt=$("$TT" --version 2>/dev/null | sed -n 's/.*cpu (oneDNN [^)]*, \([A-Za-z ]*\) threads).*/\1/p')
case "$rt" in
  OpenMP) pass omp_wait_onednn_runtime ;;
  TBB|"thread pool"|sequential) echo "NOTE oneDNN runs on $rt: OMP_WAIT_POLICY/GOMP_SPINCOUNT reach only tinytrain's own loops"
    pass omp_wait_onednn_runtime ;;
  *) fail omp_wait_onednn_runtime "--version names no oneDNN threading runtime: $("$TT" --version | head -2)" ;;
esac

got=$(spins TINYTRAIN_OMP_SPIN=short -- --version)
if [ "$got" != "rc=0 10000" ]; then fail omp_wait_default "TINYTRAIN_OMP_SPIN=short: want libgomp at 10000 spins, got '$got'"
elif ! grep -q "GOMP_SPINCOUNT=10000 " "$TMP/out"; then fail omp_wait_default "--version does not say so: $(cat "$TMP/out")"
else pass omp_wait_default
fi

got=$(spins TINYTRAIN_OMP_SPIN=long -- --version)
if [ "$got" != "rc=0 300000" ]; then fail omp_wait_long "TINYTRAIN_OMP_SPIN=long: want libgomp's 300000 spins, got '$got'"
else pass omp_wait_long
fi

# auto (the default): 10000 spins when the 1-minute load average is 0.5 or more when the run
# starts, libgomp's own otherwise; skipped when the load crosses 0.5 while the run starts
busy() { awk '{ print ($1 >= 0.5) ? 1 : 0 }' /proc/loadavg 2>/dev/null || echo 1; }
b0=$(busy); got=$(spins X=1 -- --version); b1=$(busy)
if [ "$b0" != "$b1" ]; then echo "SKIP omp_wait_auto: the load average crossed 0.5 during the run"
elif [ "$b0" = 1 ] && [ "$got" != "rc=0 10000" ]; then fail omp_wait_auto "busy machine ($(cat /proc/loadavg)): want 10000 spins, got '$got'"
elif [ "$b0" = 0 ] && [ "$got" != "rc=0 300000" ]; then fail omp_wait_auto "idle machine ($(cat /proc/loadavg)): want 300000 spins, got '$got'"
else pass "omp_wait_auto (busy=$b0)"
fi

got=$(spins OMP_WAIT_POLICY=active -- --version)
if [ "$got" != "rc=0 30000000000" ]; then fail omp_wait_user_active "OMP_WAIT_POLICY=active: want libgomp's 30000000000, got '$got'"
else pass omp_wait_user_active
fi

got=$(spins OMP_WAIT_POLICY=passive -- --version)
if [ "$got" != "rc=0 0" ]; then fail omp_wait_user_passive "OMP_WAIT_POLICY=passive: want 0 spins, got '$got'"
else pass omp_wait_user_passive
fi

got=$(spins GOMP_SPINCOUNT=12345 -- --version)
if [ "$got" != "rc=0 12345" ]; then fail omp_wait_user_spincount "GOMP_SPINCOUNT=12345: got '$got'"
else pass omp_wait_user_spincount
fi

# issue 40: an empty GOMP_SPINCOUNT is the user's too (no run again with 10000), and tinytrain
# started through the dynamic loader runs tinytrain, not the loader again
got=$(spins TINYTRAIN_OMP_SPIN=short GOMP_SPINCOUNT= -- --version)
if [ "$got" = "rc=0 10000" ]; then fail omp_wait_user_empty "GOMP_SPINCOUNT= (empty): ran again with 10000 spins"
else pass omp_wait_user_empty
fi
LDSO=$(ldd "$TT" 2>/dev/null | awk '$1 ~ /^\/.*ld-linux/ { print $1; exit }')
if [ -z "$LDSO" ] || [ ! -x "$LDSO" ]; then echo "SKIP omp_wait_ldso: no dynamic loader found in ldd's list"
elif ! env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$LDSO" "$TT" --version 2>&1 | head -1 | grep -q "^tinytrain "; then
  fail omp_wait_ldso "'$LDSO $TT --version' did not print tinytrain's version: $(env -u GOMP_SPINCOUNT "$LDSO" "$TT" --version 2>&1 | head -2)"
else pass omp_wait_ldso
fi

# the arguments (and the command) reach the process that runs: a plan at a pinned micro-batch
awk '/^\[/{skip = ($0 == "[data]")} !skip' examples/fashion_mnist/lenet.recipe >"$TMP/lenet.recipe"
printf '[data]\nformat = synthetic\n' >>"$TMP/lenet.recipe"
got=$(spins TINYTRAIN_OMP_SPIN=short -- plan --device cpu --vram 1G --micro-batch 32 --threads 1 "$TMP/lenet.recipe")
if [ "$got" != "rc=0 10000" ]; then fail omp_wait_args "plan: want rc=0 at 10000 spins, got '$got': $(head -c 600 "$TMP/err")"
elif ! grep -q "micro-batch 32" "$TMP/out"; then fail omp_wait_args "plan lost --micro-batch 32: $(head -c 600 "$TMP/out")"
else pass omp_wait_args
fi
exit $FAILED
