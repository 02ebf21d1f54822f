#!/bin/bash
# tests/cli/test_walkthrough.sh — docs/walkthrough.md works as written: its ```sh blocks, in order, run
# with `bash -e` in a fresh directory with tinytrain on PATH; then what each step should have left
# is checked (the trained run, its predictions, the packed set, the fine-tuned run).
# Run from the repository root: bash tests/cli/test_walkthrough.sh
. "$(dirname "$0")/../tt_test.sh" walkthrough
need_tt walkthrough_binary
command -v python3 >/dev/null || { echo "SKIP walkthrough: python3 not found (the walkthrough makes its images with it)"; exit 0; }
mkdir "$TMP/bin" "$TMP/tmp"
ln -s "$(realpath "$TT")" "$TMP/bin/tinytrain"
awk '/^```sh$/ {on = 1; next} /^```$/ {on = 0} on' docs/walkthrough.md >"$TMP/walk.sh"
echo 'pwd >"$WALK_WHERE"' >>"$TMP/walk.sh"
[ "$(grep -c tinytrain "$TMP/walk.sh")" -ge 6 ] || { fail walkthrough_extract "too few commands found: $(cat "$TMP/walk.sh")"; exit 1; }
# TMPDIR: the walkthrough's `mktemp -d` directory lies under $TMP and goes with it
if ! (cd "$TMP" && PATH="$TMP/bin:$PATH" TMPDIR="$TMP/tmp" WALK_WHERE="$TMP/where" bash -e walk.sh) >"$TMP/log" 2>&1; then
  fail walkthrough_runs "a command failed: $(tail -n 8 "$TMP/log")"
  exit 1
fi
pass walkthrough_runs
W=$(cat "$TMP/where")
ok=1
for f in weights.safetensors state.safetensors metrics.jsonl recipe.txt; do
  [ -f "$W/runs/shapes/$f" ] || { fail walkthrough_results "runs/shapes/$f missing"; ok=0; }
done
acc=$(sed -n 's/^accuracy \([0-9.]*\) .*/\1/p' "$TMP/log" | head -n 1)
python3 -c "import sys; sys.exit(0 if float('${acc:-0}') >= 0.9 else 1)" ||
  { fail walkthrough_results "eval accuracy '${acc}' under 0.9: $(grep -n accuracy "$TMP/log")"; ok=0; }
grep -q "red" "$TMP/log" && grep -q "0.ppm" "$TMP/log" || { fail walkthrough_results "predict named no class"; ok=0; }
ls "$W"/data/*.npy >/dev/null 2>&1 || { fail walkthrough_results "pack wrote no .npy: $(ls "$W/data")"; ok=0; }
[ -f "$W/runs/red/weights.safetensors" ] || { fail walkthrough_results "the fine-tuned run wrote no weights"; ok=0; }
grep -q "frozen .*(freeze = true)" "$TMP/log" || { fail walkthrough_results "the fine-tuning run does not mention the frozen layer"; ok=0; }
[ $ok = 1 ] && pass walkthrough_results
exit $FAILED
