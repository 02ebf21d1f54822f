#!/bin/bash
# tests/cli/test_progress.sh — what a person sees of a training run (docs/cli.md#progress), through the
# command line on a tiny synthetic recipe:
#   - plain mode (output to a file): a 3-step run prints a loss line, then the summary (test
#     accuracy, time and img/s, peak memory with the arena and the peak RSS, the run directory);
#   - in-place mode (a terminal, from `script`; SKIP without it): the progress line is redrawn with
#     carriage returns and ends with a newline before the summary;
#   - SIGINT inside the first epoch: exit 130, and chart.svg exists with the learning-rate series.
# Run from the repository root: bash tests/cli/test_progress.sh (TT=build-x/tinytrain to pick a binary).
. "$(dirname "$0")/../tt_test.sh" progress
case $TT in /*) ;; *) TT="$PWD/$TT" ;; esac
need_tt progress_binary

syn_recipe 1 >"$TMP/syn.recipe"

# summary_ok FILE NAME: the closing lines are there
summary_ok() {
  grep -q "^test accuracy: " "$1" && grep -q "^time: .* img/s" "$1" &&
    grep -q "^peak memory: arena [0-9.]* MiB.*peak RSS [0-9.]* MiB" "$1" && grep -q "^run directory: " "$1"
}

# ---- plain lines: a 3-step run (log_every 100) prints a loss line, then the summary ----
"$TT" --device cpu --threads 1 --max-steps 3 --out "$TMP/plain" "$TMP/syn.recipe" >"$TMP/plain.out" 2>"$TMP/plain.err"
rc=$?
if [ $rc != 0 ]; then fail progress_plain "exit $rc: $(cat "$TMP/plain.err")"
elif ! grep -q "^epoch 1/200  step 3/[0-9]*  loss [0-9.]*  .*img/s.*ETA" "$TMP/plain.out"; then
  fail progress_plain "no loss line for step 3: $(cat "$TMP/plain.out")"
elif grep -q $'\r' "$TMP/plain.out"; then fail progress_plain "carriage returns in a file"
elif ! summary_ok "$TMP/plain.out"; then fail progress_plain "summary lines missing: $(cat "$TMP/plain.out")"
elif ! grep -q '"event": "train", "epoch": 1, "step": 3,' "$TMP/plain/metrics.jsonl"; then
  fail progress_plain "metrics.jsonl has no train line for step 3"
else pass progress_plain
fi

# ---- in place on a terminal: carriage returns, and a newline before the summary ----
if ! command -v script >/dev/null; then
  skip progress_in_place "script (util-linux) not installed"
else
  script -q -e -c "'$TT' --device cpu --threads 1 --max-steps 40 --out '$TMP/tty' '$TMP/syn.recipe'" /dev/null \
    >"$TMP/tty.out" 2>&1 </dev/null
  rc=$?
  tr -d '\r' <"$TMP/tty.out" >"$TMP/tty.lines" # script's terminal turns \n into \r\n
  if [ $rc != 0 ]; then fail progress_in_place "exit $rc: $(tail -3 "$TMP/tty.out")"
  elif ! grep -q $'\r\033\\[Kepoch 1/200 \\[[#-]*\\] [0-9]*/[0-9]*  loss' "$TMP/tty.out"; then
    fail progress_in_place "no in-place progress line (\\r, erase, epoch, bar): $(head -c 600 "$TMP/tty.out" | od -c | head)"
  elif ! grep -q "^test accuracy: " "$TMP/tty.lines" || ! summary_ok "$TMP/tty.lines"; then
    fail progress_in_place "the summary does not start a line of its own: $(cat -v "$TMP/tty.out" | tail -5)"
  else pass progress_in_place
  fi
fi

# ---- the in-place line's loss moves between logged intervals (issue 40: it stayed at the last
# logged value for up to log_every steps): a redraw after step 1 shows the running mean ----
sed -e 's/^input = 1x8x8/input = 3x64x64/' -e 's/^filters = 4/filters = 32/' "$TMP/syn.recipe" >"$TMP/run.recipe"
if command -v script >/dev/null; then
  script -q -e -c "'$TT' --device cpu --threads 1 --max-steps 60 --out '$TMP/ttyrun' '$TMP/run.recipe'" /dev/null \
    >"$TMP/ttyrun.out" 2>&1 </dev/null
  first=$(tr '\r' '\n' <"$TMP/ttyrun.out" | sed -n 's/.*\] 1\/[0-9]*  loss \([0-9.]*\).*/\1/p' | head -1)
  mid=$(tr '\r' '\n' <"$TMP/ttyrun.out" | sed -n 's/.*\] \([0-9]*\)\/[0-9]*  loss \([0-9.]*\).*/\1 \2/p' |
    awk '$1 > 1 && $1 < 60 { print $2 }')
  if [ -z "$first" ] || [ -z "$mid" ]; then skip progress_running_loss "no redraw between steps 1 and 60 (too fast a machine)"
  elif ! echo "$mid" | grep -qvx "$first"; then fail progress_running_loss "every redraw shows step 1's loss $first: $mid"
  else pass progress_running_loss
  fi
fi

# ---- SIGINT in the first epoch: exit 130 and chart.svg with the per-step loss and the lr ----
# (job control on: a background job of a script would start with SIGINT ignored, and keep it so)
# a heavier model, so that an epoch (64 steps) lasts longer than the wait for its first step
sed -e 's/^input = 1x8x8/input = 3x64x64/' -e 's/^filters = 4/filters = 32/' "$TMP/syn.recipe" >"$TMP/slow.recipe"
set -m
"$TT" --device cpu --threads 1 --out "$TMP/sig" "$TMP/slow.recipe" >"$TMP/sig.out" 2>"$TMP/sig.err" &
pid=$!
set +m
stop_at_step INT $pid "$TMP/sig/metrics.jsonl" 1 0.02
rc=$?
if [ "$rc" != 130 ]; then fail progress_sigint_chart "exit $rc, want 130: $(cat "$TMP/sig.err")"
elif grep -q '"event": "eval"' "$TMP/sig/metrics.jsonl"; then skip progress_sigint_chart "the first epoch ended before SIGINT"
elif [ ! -f "$TMP/sig/chart.svg" ]; then fail progress_sigint_chart "no chart.svg after SIGINT in the first epoch"
elif ! grep -q 'data-series="lr"' "$TMP/sig/chart.svg" || ! grep -q 'data-series="step_loss"' "$TMP/sig/chart.svg"; then
  fail progress_sigint_chart "chart.svg lacks the lr or per-step loss series"
elif command -v python3 >/dev/null && ! python3 -c "import xml.dom.minidom as m,sys; m.parse(sys.argv[1])" "$TMP/sig/chart.svg"; then
  fail progress_sigint_chart "chart.svg is not well-formed XML"
elif ! summary_ok "$TMP/sig.out"; then fail progress_sigint_chart "no summary after SIGINT: $(cat "$TMP/sig.out")"
else pass progress_sigint_chart
fi
exit $FAILED
