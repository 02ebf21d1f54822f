#!/usr/bin/env bash
# tests/fuzz/run.sh [RUNS] [TARGET...] — builds the libFuzzer targets (`ninja fuzz-build`:
# clang, ASan + UBSan, in build-fuzz/) and runs each for RUNS inputs (default: each target's
# own count below) over its committed seed corpus tests/fuzz/corpus/<TARGET>/. TARGETs:
# recipe, safetensors, checkpoint, image, npy, npy_set (default: all six).
#
# Any crash, leak, sanitizer report, input over the time or memory limit, or a target that
# will not start, fails the run (exit 1); the input that did it is kept in
# build-fuzz/artifacts/ (replay: build-fuzz/fuzz_TARGET FILE). New inputs the fuzzer finds go
# to build-fuzz/corpus/TARGET/ (the committed seeds are only read); FUZZ_SEED=N changes the
# random seed (default 1: each run starts the same way, though the inputs drift between runs;
# a red CI is replayed from the input kept in build-fuzz/artifacts/).
# FUZZ_MAX_SECONDS (default 90) caps each target's time: libFuzzer's inputs are not the same from
# run to run (fuzz_image took 4 s to 10 minutes for its 150,000 as the corpus filled with images
# near its pixel limit), and CI has 40 minutes in all; a target stopped by the cap says so.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

# about 40 s each on one core of the 2-core CI machine (see docs/testing.md); image, npy: about 20 s and 7 s;
# npy_set (three files written and mapped per input, about 350 a second): about 15 s
declare -A DEFAULT_RUNS=([recipe]=1200000 [safetensors]=2500000 [checkpoint]=600000 [image]=150000 [npy]=3000000
                         [npy_set]=5000)
RUNS=${1:-}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(recipe safetensors checkpoint image npy npy_set)
if [ -n "$RUNS" ] && ! [[ "$RUNS" =~ ^[0-9]+$ ]]; then
  echo "usage: tests/fuzz/run.sh [RUNS] [recipe|safetensors|checkpoint|image|npy|npy_set ...]" >&2
  exit 2
fi
if ! [[ "${FUZZ_MAX_SECONDS:-90}" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: FUZZ_MAX_SECONDS='${FUZZ_MAX_SECONDS}': expected a whole number of seconds above 0; unset it for 90" >&2
  exit 2
fi
for t in "${TARGETS[@]}"; do
  if [ -z "${DEFAULT_RUNS[$t]:-}" ]; then
    echo "fuzz: unknown target '$t' (recipe, safetensors, checkpoint, image, npy, npy_set)" >&2
    exit 2
  fi
done

if [ -z "${TT_FUZZ_BUILT:-}" ]; then # set by `ninja fuzz`, which built them already
  [ -f build.ninja ] || ./configure.py >/dev/null || exit 1
  ninja fuzz-build || exit 1
fi

mkdir -p build-fuzz/artifacts
# FUZZ_JOBS=N runs up to N targets at once (each is one single-threaded process with its own
# seed, corpus and log, so the inputs are the same as one after the other; CI sets it to the
# core count). The PASS/FAIL lines come in the targets' order either way.
JOBS=${FUZZ_JOBS:-1}
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: FUZZ_JOBS must be a positive number, not '$JOBS'" >&2
  exit 2
fi
# One target: its line goes to build-fuzz/fuzz_TARGET.result (PASS or FAIL, as printed below).
run_one() {
  local t=$1 n work log start rc secs stats done_runs
  n=${RUNS:-${DEFAULT_RUNS[$t]}}
  work=build-fuzz/corpus/$t
  rm -rf "$work"
  mkdir -p "$work"
  log=build-fuzz/fuzz_$t.log
  start=$(date +%s)
  # -max_len: the largest seed is ~6 KiB; -timeout: one input taking 10 s is a hang;
  # -error_exitcode: any finding, including a leak at exit, is exit 77
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    build-fuzz/fuzz_"$t" -runs="$n" -max_total_time="${FUZZ_MAX_SECONDS:-90}" -seed="${FUZZ_SEED:-1}" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -error_exitcode=77 -timeout_exitcode=77 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/artifacts/"$t"- "$work" tests/fuzz/corpus/"$t" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  stats=$(grep -E "^#[0-9]+.*DONE" "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    { echo "FAIL fuzz_$t: exit $rc after ${secs}s; last lines of $log:"; tail -40 "$log" | sed 's/^/    /'; } \
      >build-fuzz/fuzz_"$t".result
  else
    done_runs=$(echo "$stats" | sed -n 's/^#\([0-9]*\).*/\1/p')
    if [ -n "$done_runs" ] && [ "$done_runs" -lt "$n" ]; then n="$done_runs of $n runs (stopped by the time cap, FUZZ_MAX_SECONDS)"; else n="$n runs"; fi
    echo "PASS fuzz_$t: $n in ${secs}s, no finding (${stats#*DONE   })" >build-fuzz/fuzz_"$t".result
  fi
}
running=0
for t in "${TARGETS[@]}"; do
  rm -f build-fuzz/fuzz_"$t".result
  if [ "$JOBS" -le 1 ]; then
    run_one "$t"
    cat build-fuzz/fuzz_"$t".result
  else
    if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
    run_one "$t" &
    running=$((running + 1))
  fi
done
wait
failed=0
for t in "${TARGETS[@]}"; do
  [ "$JOBS" -le 1 ] || cat build-fuzz/fuzz_"$t".result 2>/dev/null || echo "FAIL fuzz_$t: no result (the job died)"
  grep -q '^PASS ' build-fuzz/fuzz_"$t".result 2>/dev/null || failed=1
done
exit $failed
