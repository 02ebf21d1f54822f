#!/bin/bash
# tests/cli/test_runs.sh — the run directory and what a run loads, from the command line
# (core/app/train.c, core/runtime/checkpoint.c, core/runtime/finetune.c):
#   runs_empty_root   --out '' and --resume '' or / are refused (not the root directory)
#   runs_lock         a second run on the --out of a run in progress is refused, naming its pid
#   runs_state_first  a checkpoint whose weights write fails leaves the state: --resume continues;
#                     a directory holding only metrics.jsonl (killed before its first checkpoint)
#                     is reused by --out
#   runs_resume_keys  --resume with another [train] seed or optimizer is refused naming both values
#   runs_init_nan     --init with NaN weights is refused naming the tensor
#   runs_init_dtype   --init with F64 weights says the dtype, not "no name matches"
#   runs_neg_moment   a state file with a negative Adam second moment is refused naming the tensor
#   runs_frozen       a recipe with every layer frozen warns at the start
# Run from the repository root: bash tests/cli/test_runs.sh; prints PASS/FAIL lines, exits 1 on a failure.
. "$(dirname "$0")/../tt_test.sh" runs
# run ARGS...: RC, ERR (stderr), OUT
run() {
  timeout 120 "$TT" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
  OUT=$(cat "$TMP/out")
  ERR=$(cat "$TMP/err")
}
O="--device cpu --threads 1"

{ tiny_recipe_head; printf '[linear fc]\nout = 10\n'; } >"$TMP/r.recipe"
R="$TMP/r.recipe"

# st_edit.py MODE IN OUT: nan (first value of c1.weight), f64 (every tensor), negv (first .opt_v value)
cat >"$TMP/st_edit.py" <<'EOP'
import json, struct, sys
mode, src, dst = sys.argv[1:4]
d = open(src, "rb").read()
n = struct.unpack("<Q", d[:8])[0]
h = json.loads(d[8:8 + n])
body = bytearray(d[8 + n:])
if mode == "f64":
    out, off = bytearray(), 0
    for k, t in h.items():
        if k == "__metadata__":
            continue
        a, b = t["data_offsets"]
        vals = struct.unpack("<%df" % ((b - a) // 4), body[a:b])
        t["dtype"], t["data_offsets"] = "F64", [len(out), len(out) + 8 * len(vals)]
        out += struct.pack("<%dd" % len(vals), *vals)
    body = out
else:
    name = "c1.weight" if mode == "nan" else next(k for k in h if k.endswith(".opt_v"))
    a = h[name]["data_offsets"][0]
    body[a:a + 4] = struct.pack("<f", float("nan") if mode == "nan" else -1.0)
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(dst, "wb").write(struct.pack("<Q", len(t)) + t + bytes(body))
EOP
ED="python3 $TMP/st_edit.py"

run $O --max-steps 2 --out "$TMP/base" "$R"
if [ "$RC" != 0 ]; then
  fail runs_base "a 2-step run failed: exit $RC: $ERR"
  exit 1
fi

# ---- --out '' / --resume '' / --resume / ----
# (a tinytrain with the bug writes into /: what it wrote there is removed again)
before=$(cd / && ls -A state.safetensors weights.safetensors metrics.jsonl chart.svg .lock 2>/dev/null | tr '\n' ' ')
ok=1
for args in "--out|" "--resume|" "--resume|/" "--out|//"; do
  opt=${args%%|*} val=${args#*|}
  run $O --max-steps 1 "$opt" "$val" "$R"
  want=1
  [ "$args" = "--out|" ] && want=2 # an empty --out is bad usage (issue 40), checked before anything runs
  if [ "$RC" != $want ] || ! grep -q -- "$opt.*\(empty\|root directory\)" "$TMP/err"; then
    fail runs_empty_root "$opt '$val': exit $RC, want $want and a message naming it: $ERR"; ok=0
  fi
done
for f in state.safetensors weights.safetensors metrics.jsonl chart.svg .lock; do
  if [ -e "/$f" ] && ! echo " $before " | grep -q " $f "; then
    fail runs_empty_root "a run wrote /$f (removed)"; ok=0
    rm -f "/$f"
  fi
done
[ $ok = 1 ] && pass runs_empty_root

# ---- two runs on one --out ----
"$TT" $O --out "$TMP/lk" "$R" >"$TMP/lk.out" 2>"$TMP/lk.err" &
P=$!
for i in $(seq 100); do [ -f "$TMP/lk/metrics.jsonl" ] && break; sleep 0.1; done
for args in "--out" "--resume"; do
  run $O --max-steps 1 $args "$TMP/lk" "$R"
  if [ "$RC" != 1 ] || ! grep -q "another run is using this directory (process $P holds" "$TMP/err"; then
    fail runs_lock "second run with $args on a running run's directory: exit $RC, want 1 naming process $P: $ERR"; ok=0
  fi
done
kill -TERM $P
wait $P
[ $ok = 1 ] && pass runs_lock

# ---- the state first; a directory without a state is not a run to refuse ----
mkdir -p "$TMP/sf/weights.safetensors.tmp/x"
run $O --max-steps 2 --out "$TMP/sf" "$R"
rc1=$RC
rm -rf "$TMP/sf/weights.safetensors.tmp"
if [ "$rc1" = 0 ]; then
  fail runs_state_first "the weights could not be written, yet the run succeeded"
elif [ ! -f "$TMP/sf/state.safetensors" ]; then
  fail runs_state_first "a checkpoint that failed on the weights left no state.safetensors: $(ls "$TMP/sf")"
elif run $O --max-steps 3 --resume "$TMP/sf" "$R" && [ "$RC" != 0 ]; then
  fail runs_state_first "--resume of a directory with a state and no weights: exit $RC: $ERR"
else
  mkdir "$TMP/mo" && cp "$TMP/base/metrics.jsonl" "$TMP/mo/"
  run $O --max-steps 1 --out "$TMP/mo" "$R"
  if [ "$RC" != 0 ] || [ ! -f "$TMP/mo/state.safetensors" ]; then
    fail runs_state_first "--out on a directory with metrics.jsonl and no state: exit $RC: $ERR"
  elif ! grep -q "stopped before its first checkpoint" "$TMP/out"; then
    fail runs_state_first "reusing it is not said: $OUT"
  else
    pass runs_state_first
  fi
fi

# ---- --resume with another seed or optimizer ----
ok=1
cp -r "$TMP/base" "$TMP/rk"
sed 's/^seed = 7$/seed = 8/' "$R" >"$TMP/seed.recipe"
run $O --max-steps 3 --resume "$TMP/rk" "$TMP/seed.recipe"
if [ "$RC" != 1 ] || ! grep -q "seed = 7 but .* seed = 8" "$TMP/err"; then
  fail runs_resume_keys "another seed: exit $RC, want 1 naming seed 7 and 8: $ERR"; ok=0
fi
sed 's/^optimizer = adam$/optimizer = adamw/' "$R" >"$TMP/opt.recipe"
run $O --max-steps 3 --resume "$TMP/rk" "$TMP/opt.recipe"
if [ "$RC" != 1 ] || ! grep -q "optimizer = adam but .* optimizer = adamw" "$TMP/err"; then
  fail runs_resume_keys "another optimizer: exit $RC, want 1 naming adam and adamw: $ERR"; ok=0
fi
run $O --max-steps 3 --resume "$TMP/rk" "$R"
[ "$RC" = 0 ] || { fail runs_resume_keys "the same recipe no longer resumes: exit $RC: $ERR"; ok=0; }
[ $ok = 1 ] && pass runs_resume_keys

# ---- what --init and --resume load ----
# refused NAME PATTERN WANT ARGS...: passes NAME when `tinytrain ARGS` exits 1 with PATTERN (grep) in stderr
refused() {
  local name=$1 pat=$2 want=$3
  shift 3
  run "$@"
  if [ "$RC" != 1 ] || ! grep -q "$pat" "$TMP/err"; then
    fail "$name" "exit $RC, want 1 $want: $ERR"
  else
    pass "$name"
  fi
}
$ED nan "$TMP/base/weights.safetensors" "$TMP/nan.safetensors"
refused runs_init_nan "tensor 'c1.weight' holds 1 NaN or infinite" "naming c1.weight" \
  $O --max-steps 1 --init "$TMP/nan.safetensors" --out "$TMP/in" "$R"
$ED f64 "$TMP/base/weights.safetensors" "$TMP/f64.safetensors"
refused runs_init_dtype "dtype F64" "saying the dtype F64" $O --max-steps 1 --init "$TMP/f64.safetensors" --out "$TMP/i64" "$R"
cp -r "$TMP/base" "$TMP/nv"
$ED negv "$TMP/base/state.safetensors" "$TMP/nv/state.safetensors"
refused runs_neg_moment "tensor '.*\.opt_v' (Adam's second moment.*negative" "naming the .opt_v tensor" \
  $O --max-steps 3 --resume "$TMP/nv" "$R"

# ---- every layer frozen ----
sed 's/^size = 3$/size = 3\nfreeze = true/; s/^out = 10$/out = 10\nfreeze = true/' "$R" >"$TMP/frozen.recipe"
run $O --max-steps 1 --out "$TMP/fz" "$TMP/frozen.recipe"
if ! grep -q "warning: every layer is frozen" "$TMP/err"; then
  fail runs_frozen "no warning (exit $RC): $ERR"
elif run $O --max-steps 1 --out "$TMP/nf" "$R" && grep -q "frozen" "$TMP/err"; then
  fail runs_frozen "a recipe with trainable layers warns too: $ERR"
else
  pass runs_frozen
fi
exit $FAILED
