#!/bin/bash
# tests/cli/test_bench_cpu.sh — tests/bench/cpu_vs_torch.py still runs end to end against this build
# (no PyTorch needed: without one it measures tinytrain alone): --quick on the small CNN prints
# the peak FLOP rates of build/bench/bench_peak, a tinytrain fp32 row with images/s and its share
# of the fp32 peak, bf16 either measured or reported unavailable with a reason, and bench_step
# runs with the OpenMP wait setting that `tinytrain --version` reports; --shared prints a row idle,
# beside a competing load and their ratio. It checks the script, not the numbers. Run from the repository root: bash tests/cli/test_bench_cpu.sh
. "$(dirname "$0")/../tt_test.sh" bench_cpu
B=${TT_BUILD:-build}
for f in "$B/bench/bench_step" "$B/bench/bench_peak"; do
  [ -x "$f" ] || { fail bench_cpu_binaries "$f not built (ninja bench)"; exit 1; }
done

if ! python3 tests/bench/cpu_vs_torch.py --build "$B" --quick --nets small_cnn --python /nonexistent/python \
    --peak-size 256 --peak-seconds 0.05 >"$TMP/out" 2>&1; then
  fail bench_cpu_runs "cpu_vs_torch.py --quick exited with an error: $(tail -c 1500 "$TMP/out")"
  exit 1
fi
out=$TMP/out
if ! grep -Eq "^  peak fp32: best [0-9.]+ GFLOP/s" "$out"; then fail bench_cpu_peak "no fp32 peak: $(grep -i peak "$out")"
elif ! grep -Eq "^  peak bf16: (best [0-9.]+ GFLOP/s|unavailable \(.+\))" "$out"; then fail bench_cpu_peak "no bf16 line"
else pass bench_cpu_peak
fi
# the table row: runner, images/s, step ms, peak RSS, GFLOP/s, share of the peak
if grep -Eq "^  tinytrain fp32 +[0-9.]+ +[0-9.]+ +[0-9]+ MiB +[0-9.]+ +[0-9.]+%" "$out"; then pass bench_cpu_row
else fail bench_cpu_row "no tinytrain fp32 row with a share of the peak: $(grep -A8 'GFLOP per image' "$out")"
fi
if grep -Eq "^  tinytrain bf16 +([0-9.]+ |unavailable: .{10,})" "$out"; then pass bench_cpu_bf16
else fail bench_cpu_bf16 "tinytrain bf16 neither measured nor explained: $(grep 'tinytrain bf16' "$out")"
fi
# the default build links ./tinytrain at the top, another --builddir inside it
TT=$B/tinytrain; [ -x "$TT" ] || TT=./tinytrain
want=$("$TT" --version | sed -n 's/.*GOMP_SPINCOUNT=\([^ ]*\) .*/\1/p')
if [ -z "$want" ]; then fail bench_cpu_waits "$TT --version names no GOMP_SPINCOUNT setting"
elif [ "$want" = unset ] || grep -q "bench_step runs with .*GOMP_SPINCOUNT=$want" "$out"; then pass bench_cpu_waits
else fail bench_cpu_waits "tinytrain runs with GOMP_SPINCOUNT=$want, bench_step did not: $(grep 'bench_step runs' "$out")"
fi

# --shared in its shortest form: the load alone, then tinytrain fp32 idle and beside one load
# process (one run, two steps), its row with images/s idle, shared, their ratio, what the load kept
# and the load average; PyTorch (eager only, to stay short) and the degradation table against
# it only when TT_BENCH_PYTHON names a Python with torch (CI has none; it adds seconds)
PYS=(--python /nonexistent/python)
[ -n "$TT_BENCH_PYTHON" ] && PYS=(--python "$TT_BENCH_PYTHON" --shared-modes eager)
if ! python3 tests/bench/cpu_vs_torch.py --build "$B" --quick --skip-speed --no-peak --shared --nets small_cnn \
    --tt-modes fp32 --no-wait-variants --load-procs 1 --load-settle 0.1 --load-alone 0.3 "${PYS[@]}" \
    >"$TMP/shared" 2>&1; then
  fail bench_cpu_shared "cpu_vs_torch.py --shared exited with an error: $(tail -c 1500 "$TMP/shared")"
else
  sh=$TMP/shared
  if ! grep -Eq "^   the load alone: [0-9]+ products/s per process, [0-9.]+ of a core each" "$sh"; then
    fail bench_cpu_shared "no rate of the load alone: $(head -c 1500 "$sh")"
  # runner, idle /s, shared /s, shared/idle, load kept, load average
  elif ! grep -Eq "^  tinytrain fp32 +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+ +[0-9.]+$" "$sh"; then
    fail bench_cpu_shared "no tinytrain fp32 row idle/shared/ratio/load kept/load average: $(tail -c 1500 "$sh")"
  elif grep -Eq "^pytorch: .*: torch [0-9]" "$sh" && ! grep -Eq "^  tinytrain fp32 +[0-9.]+x$" "$sh"; then
    fail bench_cpu_shared "PyTorch found but no degradation ratio against it: $(tail -c 1500 "$sh")"
  else pass bench_cpu_shared
  fi
fi

# tests/bench/memory_tradeoff --no-time: the plan side of the trade-off curve (it prints and never
# fails, so check that it planned: a "none" row and budget rows with arena sizes)
python3 tests/bench/memory_tradeoff --build "$B" --no-time --points 2 --micro-batch 4 \
  examples/fashion_mnist/resnet.recipe >"$TMP/trade" 2>&1
if grep -Eq "^  none +[0-9]+M +[0-9]+M +0 " "$TMP/trade" && [ "$(grep -Ec "^  [0-9]+M +[0-9]+M +[0-9]+M" "$TMP/trade")" -ge 1 ]; then
  pass bench_memory_tradeoff
else fail bench_memory_tradeoff "no trade-off rows: $(head -c 1500 "$TMP/trade")"
fi
exit $FAILED
