#!/bin/bash
# tests/cli/test_cli.sh — the tinytrain command line: help and version, bad usage (exit 2, one line),
# recipe errors (exit 1, PATH:LINE:), `plan --json` on every example, --vram fits and refusals,
# --device cuda on a CPU-only build, missing data files, the run directory of a recipe run
# twice, SIGTERM (exit 143, checkpoint, --resume), TINYTRAIN_PROFILE. Run from the repository root:
#   bash tests/cli/test_cli.sh
# Prints PASS/FAIL/SKIP lines; exits 1 if anything failed.
. "$(dirname "$0")/../tt_test.sh" cli
need_tt cli_binary

# run NAME ARGS...: runs tinytrain, sets RC, OUT (stdout) and ERR (stderr)
run() {
  "$TT" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
  OUT=$(cat "$TMP/out")
  ERR=$(cat "$TMP/err")
}

# ---- help and version ----
ok=1
for args in "--help" "-h" "plan --help" "eval --help" "train --help"; do
  run $args
  if [ "$RC" != 0 ]; then fail cli_help "'tinytrain $args' exited $RC"; ok=0; break; fi
  if ! grep -q "^usage: tinytrain" "$TMP/out"; then fail cli_help "'tinytrain $args' printed no usage line on stdout"; ok=0; break; fi
done
run plan --help
if [ $ok = 1 ] && ! grep -q "usage: tinytrain plan" "$TMP/out"; then fail cli_help "plan --help is not the plan usage"; ok=0; fi
run eval --help
if [ $ok = 1 ] && ! grep -q "usage: tinytrain eval --weights" "$TMP/out"; then fail cli_help "eval --help is not the eval usage"; ok=0; fi
[ $ok = 1 ] && pass cli_help

run --version
VERSION_OUT=$OUT
if [ "$RC" != 0 ]; then
  fail cli_version "exit $RC"
elif ! echo "$OUT" | grep -q "^tinytrain [0-9]"; then
  fail cli_version "no 'tinytrain X.Y.Z' line: $OUT"
elif ! echo "$OUT" | grep -qi "backends:.*cpu"; then
  fail cli_version "does not list the backends (cpu at least): $OUT"
else
  pass cli_version
fi

# ---- bad usage: exit 2, one line on stderr, nothing on stdout ----
# expect_usage NAME WANT_IN_MESSAGE ARGS...
ok=1
expect_usage() {
  local what=$1 want=$2
  shift 2
  run "$@"
  local lines
  lines=$(wc -l <"$TMP/err")
  if [ "$RC" != 2 ]; then fail cli_bad_usage "'tinytrain $*' ($what) exited $RC, want 2"; ok=0
  elif [ "$lines" != 1 ]; then fail cli_bad_usage "'tinytrain $*' ($what) printed $lines lines on stderr: $ERR"; ok=0
  elif [ -n "$OUT" ]; then fail cli_bad_usage "'tinytrain $*' ($what) printed on stdout: $OUT"; ok=0
  elif ! grep -qF -- "$want" "$TMP/err"; then fail cli_bad_usage "'tinytrain $*' ($what): message lacks '$want': $ERR"; ok=0
  fi
}
L=examples/fashion_mnist/lenet.recipe
expect_usage "unknown option" "unknown option: --bogus" --bogus 1 $L
expect_usage "unknown option" "(tinytrain --help)" --bogus 1 $L
expect_usage "unknown plan option" "(tinytrain plan --help)" plan --bogus 1 $L
expect_usage "unknown eval option" "(tinytrain eval --help)" eval --bogus 1 $L
expect_usage "bad size" "4X" --vram 4X $L
expect_usage "bad size in plan" "4X" plan --vram 4X $L
expect_usage "negative size" "-1G" plan --vram -1G $L
expect_usage "missing recipe" "no recipe" --vram 4G
expect_usage "missing recipe in plan" "no recipe" plan
expect_usage "missing value" "--vram" plan $L --vram
expect_usage "two recipes" "more than one recipe" plan $L $L
# issue 25: mistakes answered with the fix
expect_usage "mistyped command" "unknown command 'evall' — did you mean eval?" evall --weights "$TMP/w.safetensors" $L
expect_usage "mistyped command" "unknown command 'trian' — did you mean train?" trian $L
expect_usage "mistyped command" "unknown command 'plna' — did you mean plan?" plna $L
expect_usage "unknown command" "unknown command 'frobnicate'; the commands are train, plan, eval, predict and pack" frobnicate
expect_usage "--out empty" "--out takes a directory, not an empty name" --out '' $L
expect_usage "--vram without a unit" "--vram 4: 4 bytes? did you mean 4G" plan --vram 4 $L
expect_usage "bad device" "--device" --device tpu $L
expect_usage "bad epochs" "--epochs" --epochs 0 $L
expect_usage "bad precision" "--precision" plan --precision fp8 $L
expect_usage "eval without weights" "--weights" eval $L
expect_usage "bad checkpoint interval" "--checkpoint-every" --checkpoint-every 10x $L
expect_usage "max-batch without a budget" "--max-batch needs a budget: give --vram SIZE" plan --max-batch $L
expect_usage "max-batch outside plan" "--max-batch is an option of plan" eval --max-batch --weights "$TMP/none.safetensors" $L
expect_usage "flag with a value" "this option takes no value: --json=1" plan --json=1 $L
expect_usage "init and resume" "--init starts a new run from weights, --resume continues one" --init w --resume d $L
expect_usage "init outside train" "--init is an option of train" eval --weights w --init w $L
expect_usage "predict without images" "predict needs image files or folders" predict --weights w $L
expect_usage "top outside predict" "--top is an option of predict" eval --weights w --top 3 $L
[ $ok = 1 ] && pass cli_bad_usage

# plan --max-batch: nine rows (fp32, fp16, bf16 x none, auto, all); --precision and --recompute
# none|all narrow it to theirs, with the same answers as the full table's rows
run plan --max-batch --json --vram 1G --device cuda $L
full=$OUT rc1=$RC
run plan --max-batch --json --vram 1G --device cuda --precision fp16 --recompute none $L
narrow=$OUT rc2=$RC
if ! python3 - "$full" "$narrow" "$rc1" "$rc2" <<'EOF2'
import json, sys
full, narrow, rc1, rc2 = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if rc1 != "0" or rc2 != "0":
    sys.exit("exit %s / %s" % (rc1, rc2))
f = {(r["precision"], r["recompute"]): r["micro_batch"] for r in json.loads(full)["max_batch"]}
n = json.loads(narrow)["max_batch"]
if len(f) != 9:
    sys.exit("the full table has %d rows, not 9" % len(f))
if [(r["precision"], r["recompute"]) for r in n] != [("fp16", "none")]:
    sys.exit("--precision fp16 --recompute none gave rows %s" % [(r["precision"], r["recompute"]) for r in n])
if n[0]["micro_batch"] != f[("fp16", "none")] or n[0]["micro_batch"] <= 0:
    sys.exit("narrowed fp16/none micro-batch %d, the full table's %d" % (n[0]["micro_batch"], f[("fp16", "none")]))
EOF2
then fail cli_max_batch_narrowed "see above"; else pass cli_max_batch_narrowed; fi

# ---- weight gradients: transient without accumulation in one process (the plan lists them after
# the persistent total, and no accumulators), accumulators under --ranks 2 (the all-reduce sums
# them as one region): the same bytes either way. On the fashion ResNet, whose peak is early in
# backward: on LeNet the two forms pack within 0.3% of each other, and which one the planner keeps
# (the smaller) changed with the CPU (oneDNN's workspaces, --precision auto's choice) ----
RN=examples/fashion_mnist/resnet.recipe
run plan --device cpu $RN
P1="$OUT"; R1=$RC
run plan --device cpu --ranks 2 $RN
P2="$OUT"; R2=$RC
g1=$(echo "$P1" | awk '/gradients \(fp32\), transient/ {print $4}')
a2=$(echo "$P2" | awk '/gradient accumulators \(fp32\)/ {print $4}')
if [ "$R1" != 0 ] || [ "$R2" != 0 ]; then
  fail cli_plan_transient_grads "plan exited $R1 / $R2"
elif [ -z "$g1" ] || [ "$g1" = 0 ] || echo "$P1" | grep -q "gradient accumulators"; then
  fail cli_plan_transient_grads "one process: $(echo "$P1" | grep -i gradient | tr '\n' '|')"
elif [ "$a2" != "$g1" ] || echo "$P2" | grep -q "gradients (fp32), transient"; then
  fail cli_plan_transient_grads "--ranks 2: accumulators '$a2' bytes, want $g1: $(echo "$P2" | grep -i gradient | tr '\n' '|')"
else
  pass cli_plan_transient_grads
fi

# ---- issue 21 item 16: a size is digits[.digits][K|M|G|T[iB|B]], nothing else; an option the
# command does not use is refused, not ignored ----
ok=1
for v in 0x10G " 4G" "4G " 1.8e19 1e3 18446744073709551616 16777216T; do
  expect_usage "--vram '$v'" "--vram takes a size" plan --vram "$v" $L
done
[ $ok = 1 ] && pass cli_vram_strict
ok=1
expect_usage "eval --epochs" "--epochs is not an option of eval" eval --weights w --epochs 3 $L
expect_usage "plan --resume" "--resume is not an option of plan" plan --resume "$TMP/d" $L
expect_usage "pack --vram" "--vram is not an option of pack" pack --vram 4G "$TMP/src" "$TMP/pre"
expect_usage "predict --out" "--out is not an option of predict" predict --weights w --out "$TMP/d" $L x.png
expect_usage "eval --max-steps" "--max-steps is not an option of eval" eval --weights w --max-steps 3 $L
expect_usage "plan --checkpoint-every" "--checkpoint-every is not an option of plan" plan --checkpoint-every 10m $L
expect_usage "train --weights" "--weights is not an option of train" --weights w $L
expect_usage "pack --threads" "--threads is not an option of pack" pack --threads 2 "$TMP/src" "$TMP/pre"
[ $ok = 1 ] && pass cli_unused_options

# ---- getopt_long: --opt=VALUE as --opt VALUE, options after the recipe ----
strip_ms() { sed 's/"plan_ms": [0-9.e+-]*//; s/"predicted_step_ms": [0-9.e+-]*//'; }
run plan --vram 4G --json $L
A=$(echo "$OUT" | strip_ms)
run plan $L --vram=4G --json
OUT=$(echo "$OUT" | strip_ms)
if [ "$RC" != 0 ]; then fail cli_opt_equals "plan $L --vram=4G --json exited $RC: $ERR"
elif [ "$OUT" != "$A" ]; then fail cli_opt_equals "--vram=4G after the recipe planned otherwise than --vram 4G before it"
elif ! echo "$OUT" | grep -q '"budget_bytes"'; then fail cli_opt_equals "no plan: $OUT"
else pass cli_opt_equals; fi
ok=1
for c in "" plan eval predict; do
  run $c --help
  for o in --vram --device --threads --init --top; do
    { [ "$c" = eval ] || [ "$c" = predict ]; } && [ $o = --vram ] && continue
    { [ "$c" != "" ] && [ $o = --init ]; } || { [ "$c" != predict ] && [ $o = --top ]; } && continue
    if ! grep -qF -- "  $o" "$TMP/out"; then fail cli_help_options "'tinytrain $c --help' does not list $o"; ok=0; fi
  done
done
[ $ok = 1 ] && pass cli_help_options

# ---- bad recipes: exit 1 (no crash), PATH:LINE: ----
ok=1
n=0
for f in tests/recipes_bad/*.recipe; do
  n=$((n + 1))
  line=$(head -n 1 "$f" | sed -n 's/^# expect-line: *\([0-9]*\).*/\1/p')
  want=$(sed -n '2s/^# expect: //p' "$f")
  run plan "$f"
  if [ "$RC" -ge 128 ]; then fail cli_bad_recipes "$f: crashed (exit $RC)"; ok=0; continue; fi
  if [ "$RC" != 1 ]; then fail cli_bad_recipes "$f: exit $RC, want 1: $ERR"; ok=0; continue; fi
  if ! grep -qF -- "$f" "$TMP/err"; then fail cli_bad_recipes "$f: message does not name the file: $ERR"; ok=0; continue; fi
  if [ -n "$line" ] && ! grep -qF -- "$f:$line:" "$TMP/err"; then
    fail cli_bad_recipes "$f: message does not point at line $line: $ERR"; ok=0; continue
  fi
  if [ -n "$want" ] && ! grep -qF -- "$want" "$TMP/err"; then
    fail cli_bad_recipes "$f: message lacks '$want': $ERR"; ok=0; continue
  fi
done
[ $n -gt 0 ] || { fail cli_bad_recipes "no tests/recipes_bad/*.recipe"; ok=0; }
[ $ok = 1 ] && pass cli_bad_recipes

# ---- plan --json on every example ----
CHECK_PLAN='
import json, sys
d = json.load(sys.stdin)
assert isinstance(d, dict), "not a JSON object"
need = ["arena_bytes", "peak_live_bytes", "micro_batch", "accum_steps", "precision", "breakdown", "recompute",
        "inplace_ops", "predicted_step_ms", "reserve_bytes", "budget_bytes"]
miss = [k for k in need if k not in d]
assert not miss, "missing keys %s" % miss
miss = [k for k in ["params", "grads", "optimizer", "activations", "workspace"] if k not in d["breakdown"]]
assert not miss, "breakdown lacks %s" % miss
assert d["micro_batch"] >= 1 and d["accum_steps"] >= 1, "micro_batch %r accum_steps %r" % (d["micro_batch"], d["accum_steps"])
assert d["precision"] in ("fp32", "fp16", "bf16"), "precision %r" % d["precision"]
assert isinstance(d["recompute"], list), "recompute is not a list"
assert 0 < d["peak_live_bytes"] <= d["arena_bytes"], "peak_live %r arena %r" % (d["peak_live_bytes"], d["arena_bytes"])
# device free memory: null where no GPU was asked (the plan estimates), else the budget fits in it
assert "device_free_bytes" in d and "budget_clamped" in d, "no device_free_bytes / budget_clamped"
if d.get("reserve_measured"):
    assert isinstance(d["device_free_bytes"], int), "measured reserve but device_free_bytes %r" % d["device_free_bytes"]
    assert d["budget_bytes"] <= d["device_free_bytes"], "budget %r > device free %r" % (d["budget_bytes"], d["device_free_bytes"])
else:
    assert d["device_free_bytes"] is None, "no GPU asked but device_free_bytes %r" % d["device_free_bytes"]
b = sum(d["breakdown"].values())
assert b == d["peak_live_bytes"], "breakdown sums to %d, not peak_live_bytes %d" % (b, d["peak_live_bytes"])
nip = d["saved"]["no_inplace_arena_bytes"]
assert d["arena_bytes"] <= nip, "in-place ops make the arena %d, larger than %d without" % (d["arena_bytes"], nip)
r = d["arena_bytes"] / d["peak_live_bytes"]
assert r <= 1.05, "arena/peak_live = %.4f > 1.05" % r
print("ratio %.4f  plan_ms %s  micro_batch %d x %d %s" % (r, d.get("plan_ms"), d["micro_batch"], d["accum_steps"], d["precision"]))
'
if ! python3 -c 'import json' 2>/dev/null; then
  skip cli_plan_json "python3 not found"
else
  ok=1
  n=0
  while IFS= read -r r; do
    n=$((n + 1))
    run plan --json "$r"
    if [ "$RC" != 0 ]; then fail cli_plan_json "$r: exit $RC: $ERR"; ok=0; continue; fi
    if ! res=$(python3 -c "$CHECK_PLAN" <"$TMP/out" 2>&1); then
      fail cli_plan_json "$r: $(echo "$res" | tail -n 1)"; ok=0; continue
    fi
    echo "# plan --json $r: $res"
  done < <(find examples -name '*.recipe' | sort)
  [ $n -gt 0 ] || { fail cli_plan_json "no examples/**/*.recipe"; ok=0; }
  [ $ok = 1 ] && pass cli_plan_json
fi

# ---- --vram: fits, and a refusal that says what would fit ----
run plan --vram 4G examples/imagenet/resnet50.recipe
if [ "$RC" != 0 ]; then fail cli_plan_fits_4g "resnet50 in 4G: exit $RC: $ERR"
elif ! head -n 1 "$TMP/out" | grep -q " on the CPU (no NVIDIA GPU found\| on the GPU here"; then
  fail cli_plan_fits_4g "the plan's first line does not say it planned for what train runs here: $(head -n 1 "$TMP/out")"
elif ! grep -q " on the CPU\|the device has [0-9.]* MiB free" "$TMP/out"; then
  fail cli_plan_fits_4g "the plan does not say what the GPU has free"
else pass cli_plan_fits_4g; fi
run plan --vram 700M examples/imagenet/vgg16.recipe
if [ "$RC" = 0 ]; then
  fail cli_plan_refuses "vgg16 planned into --vram 700M"
elif [ "$RC" -ge 128 ]; then
  fail cli_plan_refuses "vgg16 --vram 700M crashed (exit $RC)"
elif ! echo "$ERR" | grep -q "smallest --vram that fits is [0-9.]* *[KMGT]i\?B"; then
  fail cli_plan_refuses "the refusal does not give the smallest --vram that fits: $ERR"
else
  # the suggested size must itself fit
  sz=$(echo "$ERR" | sed -n 's/.*smallest --vram that fits is \([0-9.]*\) *\([KMGT]\)i\?B.*/\1\2/p')
  run plan --vram "$sz" examples/imagenet/vgg16.recipe
  if [ "$RC" = 0 ]; then pass cli_plan_refuses; else fail cli_plan_refuses "the suggested --vram $sz does not fit: $ERR"; fi
fi

# ---- the smallest --vram a refusal names is the smallest, to the MiB: it fits, and 1 MiB less does
# not (below 1 GiB it was rounded in hundredths of a GiB, then converted: 11 MiB for a net that fits
# in 6) ----
run plan --vram 5M examples/fashion_mnist/resnet.recipe
sz=$(echo "$ERR" | sed -n 's/.*smallest --vram that fits is \([0-9]*\) MiB.*/\1/p')
if [ "$RC" != 1 ] || [ -z "$sz" ]; then
  fail cli_plan_smallest_vram "--vram 5M: exit $RC: $ERR"
else
  run plan --vram "${sz}M" examples/fashion_mnist/resnet.recipe
  rc_fit=$RC
  run plan --vram "$((sz - 1))M" examples/fashion_mnist/resnet.recipe
  if [ "$rc_fit" = 0 ] && [ "$RC" = 1 ]; then pass cli_plan_smallest_vram
  else fail cli_plan_smallest_vram "suggested ${sz}M: exit $rc_fit; $((sz - 1))M: exit $RC"; fi
fi

# ---- issue 25: a budget at or below the reserve still names the smallest --vram, in the unit typed;
# a refusal under plan --json is a JSON object on stdout ----
run plan --device cuda --vram 512M $L
if [ "$RC" != 1 ] || ! echo "$ERR" | grep -q "not more than the .* reserved .*the smallest --vram that fits is [0-9]* MiB"; then
  fail cli_plan_reserve "--vram 512M under the reserve: exit $RC: $ERR"
else
  sz=$(echo "$ERR" | sed -n 's/.*smallest --vram that fits is \([0-9]*\) MiB.*/\1M/p')
  run plan --device cuda --vram "$sz" $L
  if [ "$RC" = 0 ]; then pass cli_plan_reserve; else fail cli_plan_reserve "the suggested --vram $sz does not fit: $ERR"; fi
fi
run plan --json --vram 700M examples/imagenet/vgg16.recipe
if [ "$RC" != 1 ] || ! python3 -c 'import json,sys; d=json.load(sys.stdin); assert "smallest --vram" in d["error"]' <"$TMP/out" 2>/dev/null; then
  fail cli_plan_json_refusal "exit $RC, stdout: $OUT"
else pass cli_plan_json_refusal; fi

# ---- sizes past 64 bits: 200 layers of 2^31 values at the recipe's batch of 2^24 ----
# Without a budget the plan is refused (it wrapped to a small arena); under --vram the search
# goes on to smaller micro-batches and refuses with the smallest --vram that fits.
printf '[net]\ninput = 1x46340x46340\nclasses = 10\n[train]\nbatch = 16777216\n[block r]\n[relu]\n[end]\n[r rr]\nrepeat = 200\n[gap]\n[linear]\nout = 10\n' >"$TMP/huge.recipe"
run plan "$TMP/huge.recipe"
if [ "$RC" != 1 ] || ! echo "$ERR" | grep -qE "$TMP/huge.recipe: the [0-9]+ buffers of the plan at micro-batch 16777216 add up to more than 2\^64 bytes"; then
  fail cli_plan_overflow "no budget: exit $RC: $ERR"
else
  run plan --vram 4G "$TMP/huge.recipe"
  if [ "$RC" != 1 ] || ! echo "$ERR" | grep -q "does not fit.*smallest --vram that fits is"; then
    fail cli_plan_overflow "--vram 4G: exit $RC: $ERR"
  else
    pass cli_plan_overflow
  fi
fi

# ---- issue 25: start-up maps no CUDA library unless a GPU is used (core/runtime/cuda_load.c) ----
ok=1
for args in "--help" "plan --help" "plan --device cpu $L" "plan --vram 1G $L"; do
  [ "$args" = "plan --vram 1G $L" ] && ls /dev/nvidia* >/dev/null 2>&1 && continue # auto means the GPU here
  # shellcheck disable=SC2086
  maps=$(LD_DEBUG=libs "$TT" $args 2>&1 >/dev/null | grep -oE "lib(cudart|cudnn|cublas|cublasLt|nccl)[^ ]*\.so[^ ]*" | sort -u | tr '\n' ' ')
  if [ -n "$maps" ]; then fail cli_startup "'tinytrain $args' loads $maps"; ok=0; fi
done
[ $ok = 1 ] && pass cli_startup

# ---- the program finds the CUDA backend it was built with: the default build's ./tinytrain the
# library in build/, another --builddir's the one beside it (core/runtime/cuda_load.c) ----
d=$(dirname "$TT")
if [ -f "$d/libtinytrain_cuda.so" ] || [ -f "$d/build/libtinytrain_cuda.so" ]; then
  v=$(env -u TT_CUDA_LIBRARY "$TT" --version 2>&1)
  if echo "$v" | grep -q "cuda (CUDA runtime"; then pass cli_finds_cuda_backend
  else fail cli_finds_cuda_backend "$TT --version: $(echo "$v" | grep -o 'cuda (.*')"
  fi
else
  skip cli_finds_cuda_backend "no libtinytrain_cuda.so beside $TT or in $d/build (a CPU-only build)"
fi

# ---- --device cuda on a CPU-only build ----
if echo "$VERSION_OUT" | grep -qi "cuda" && ! echo "$VERSION_OUT" | grep -qi "without cuda"; then
  if ls /dev/nvidia* >/dev/null 2>&1; then
    skip cli_device_cuda "this build has CUDA and this machine a GPU"
  else # issue 25: no GPU at all is said so, not "driver version is insufficient"
    run --device cuda --max-steps 1 --out "$TMP/cuda" examples/fashion_mnist/lenet.recipe
    if [ "$RC" != 1 ] || ! grep -q "no NVIDIA GPU found" "$TMP/err" || grep -qi "insufficient" "$TMP/err"; then
      fail cli_device_cuda "--device cuda without a GPU: exit $RC: $ERR"
    else pass cli_device_cuda; fi
  fi
else
  run --device cuda --max-steps 1 --out "$TMP/cuda" examples/fashion_mnist/lenet.recipe
  if [ "$RC" = 0 ]; then fail cli_device_cuda "--device cuda succeeded on a CPU-only build"
  elif [ "$RC" -ge 128 ]; then fail cli_device_cuda "crashed (exit $RC)"
  elif [ "$(wc -l <"$TMP/err")" != 1 ]; then fail cli_device_cuda "not a one-line reason: $ERR"
  elif ! grep -qi "cuda" "$TMP/err"; then fail cli_device_cuda "the reason does not mention CUDA: $ERR"
  else pass cli_device_cuda
  fi
fi

# ---- a [data] path that does not exist ----
cat >"$TMP/missing_data.recipe" <<EOF
[net]
input = 1x8x8
classes = 10
[train]
batch = 8
[data]
format = idx
train = $TMP/no-such-images-idx3-ubyte.gz
train_labels = $TMP/no-such-labels-idx1-ubyte.gz
[flatten]
[linear fc]
out = 10
EOF
run --device cpu --threads 1 --out "$TMP/run_missing" "$TMP/missing_data.recipe"
if [ "$RC" != 1 ]; then
  fail cli_missing_data "exit $RC, want 1: $ERR"
elif ! grep -qF "$TMP/no-such-images-idx3-ubyte.gz" "$TMP/err"; then
  fail cli_missing_data "the message does not name the missing file: $ERR"
else
  pass cli_missing_data
fi

# ---- the example recipe of docs/recipes.md (no test split) trains, saying once that it will not evaluate ----
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  skip cli_readme_recipe "no Fashion-MNIST in /usr/share/datasets (apt-get install dataset-fashion-mnist)"
else
  python3 -c '
import re, sys
m = re.search(r"```ini\n(# A small CNN for Fashion-MNIST.*?)```", open("docs/recipes.md").read(), re.S)
sys.stdout.write(m.group(1) if m else "")' >"$TMP/readme.recipe"
  run --device cpu --threads 1 --max-steps 2 --out "$TMP/readme" "$TMP/readme.recipe"
  if [ ! -s "$TMP/readme.recipe" ]; then fail cli_readme_recipe "no '# A small CNN for Fashion-MNIST' recipe in docs/recipes.md"
  elif [ "$RC" != 0 ]; then fail cli_readme_recipe "exit $RC: $ERR"
  elif [ "$(grep -c "no test split" "$TMP/out")" != 1 ]; then fail cli_readme_recipe "does not say once that it will not evaluate: $OUT"
  else pass cli_readme_recipe
  fi
fi

# ---- a recipe run again gets its own directory; --out over an earlier run is refused ----
TTA="$(cd "$(dirname "$TT")" && pwd -P)/$(basename "$TT")" # absolute: the runs below cd elsewhere
syn_recipe 2 "log_every = 1" >"$TMP/syn.recipe"
mkdir -p "$TMP/cwd"
ok=1
for k in 1 2; do
  (cd "$TMP/cwd" && "$TTA" --device cpu --threads 1 --max-steps 2 "$TMP/syn.recipe" >"$TMP/out" 2>"$TMP/err")
  rc=$?
  if [ "$rc" != 0 ]; then fail cli_run_dir "run $k of the same recipe: exit $rc: $(cat "$TMP/err")"; ok=0; break; fi
  [ $k = 1 ] && first=$(md5sum <"$TMP/cwd/runs/syn/state.safetensors")
done
if [ $ok = 1 ]; then
  if [ ! -f "$TMP/cwd/runs/syn-2/state.safetensors" ]; then
    fail cli_run_dir "the second run did not write runs/syn-2: $(ls "$TMP/cwd/runs")"
  elif [ "$(md5sum <"$TMP/cwd/runs/syn/state.safetensors")" != "$first" ]; then
    fail cli_run_dir "the second run changed runs/syn/state.safetensors"
  elif ! grep -q "runs/syn-2" "$TMP/out"; then
    fail cli_run_dir "the second run does not say it writes to runs/syn-2: $(cat "$TMP/out")"
  else
    run --device cpu --threads 1 --max-steps 2 --out "$TMP/cwd/runs/syn" "$TMP/syn.recipe"
    if [ "$RC" != 1 ]; then fail cli_run_dir "--out over an earlier run: exit $RC, want 1"
    elif ! grep -qF -- "--resume $TMP/cwd/runs/syn" "$TMP/err"; then fail cli_run_dir "the refusal does not say --resume: $ERR"
    elif [ "$(md5sum <"$TMP/cwd/runs/syn/state.safetensors")" != "$first" ]; then fail cli_run_dir "the refused run changed the earlier one"
    else pass cli_run_dir
    fi
  fi
fi

# ---- SIGTERM: a checkpoint at the next step, exit 143, and --resume continues ----
"$TT" --device cpu --threads 1 --out "$TMP/sig" "$TMP/syn.recipe" >"$TMP/sig.out" 2>"$TMP/sig.err" &
pid=$!
stop_at_step TERM $pid "$TMP/sig/metrics.jsonl" 3 0.05
rc=$?
if [ "$rc" != 143 ]; then
  fail cli_sigterm "exit $rc, want 143: $(cat "$TMP/sig.err")"
elif ! grep -qF -- "continue with: tinytrain --resume $TMP/sig" "$TMP/sig.err"; then
  fail cli_sigterm "stderr does not say how to continue: $(cat "$TMP/sig.err")"
elif [ ! -f "$TMP/sig/state.safetensors" ]; then
  fail cli_sigterm "no checkpoint in $TMP/sig"
else
  # the hint is runnable as printed (issue 25): `tinytrain --resume DIR`, the recipe from DIR/recipe.txt
  hint=$(sed -n 's/.*continue with: tinytrain \(--resume [^ ]*\)$/\1/p' "$TMP/sig.err")
  run --device cpu --threads 1 $hint --max-steps 300
  if [ -z "$hint" ]; then fail cli_sigterm "no runnable hint: $(cat "$TMP/sig.err")"
  elif [ "$RC" != 0 ]; then fail cli_sigterm "'tinytrain $hint' after SIGTERM: exit $RC: $ERR"
  elif ! echo "$OUT" | grep -q "resumed from $TMP/sig/state.safetensors at step [1-9]"; then fail cli_sigterm "no 'resumed from' line: $OUT"
  else pass cli_sigterm
  fi
fi

# ---- SIGHUP and SIGPIPE are stop requests too (issue 40): a checkpoint, exit 129 and 141 ----
"$TT" --device cpu --threads 1 --max-steps 5000 --out "$TMP/hup" "$TMP/syn.recipe" >"$TMP/hup.out" 2>"$TMP/hup.err" &
pid=$!
stop_at_step HUP $pid "$TMP/hup/metrics.jsonl" 3 0.05
rc=$?
if [ "$rc" != 129 ] || ! grep -q "stopped by SIGHUP" "$TMP/hup.err" || [ ! -f "$TMP/hup/state.safetensors" ]; then
  fail cli_sighup "exit $rc (want 129), checkpoint $(ls "$TMP/hup" 2>&1 | tr '\n' ' '): $(tail -c 300 "$TMP/hup.err")"
else pass cli_sighup; fi
# stdout into a reader that goes away after one byte: the next progress line meets a dead pipe
"$TT" --device cpu --threads 1 --max-steps 5000 --out "$TMP/pipe" "$TMP/syn.recipe" 2>"$TMP/pipe.err" | head -c 1 >/dev/null
rc=${PIPESTATUS[0]}
if [ "$rc" != 141 ] || ! grep -q "stopped by SIGPIPE" "$TMP/pipe.err" || [ ! -f "$TMP/pipe/state.safetensors" ]; then
  fail cli_sigpipe "exit $rc (want 141), checkpoint $(ls "$TMP/pipe" 2>&1 | tr '\n' ' '): $(tail -c 300 "$TMP/pipe.err")"
else pass cli_sigpipe; fi

# ---- a burst of stop signals never crashes a run (issue 40: Ctrl-C aborted with "free(): invalid
# pointer" in oneDNN's linear layer). oneDNN's AVX2 f32 GEMM runs with the stack pointer inside a
# heap workspace; a handler run on that thread wrote its signal frame over the heap. main.c routes
# the stop signals to a thread of their own. SIGPIPE keeps its handler (no SA_RESETHAND), so
# every signal of the burst is handled; before the fix about half these runs aborted (exit 134).
printf '[net]\ninput = 3x32x32\nclasses = 10\n[train]\nbatch = 128\nepochs = 200\n[data]\nformat = synthetic\n[flatten]\n[linear fc1]\nout = 1024\n[relu]\n[linear fc]\nout = 10\n' >"$TMP/gemm.recipe"
bad=""
for i in 1 2 3 4 5 6 7 8 9 10; do
  ONEDNN_MAX_CPU_ISA=AVX2 "$TT" --device cpu --threads 1 --max-steps 5000 --out "$TMP/burst$i" "$TMP/gemm.recipe" >/dev/null 2>"$TMP/burst.err" &
  pid=$!
  for _ in $(seq 1 600); do grep -q '"step": 1,' "$TMP/burst$i/metrics.jsonl" 2>/dev/null && break; sleep 0.02; done
  for _ in $(seq 1 3000); do kill -PIPE $pid 2>/dev/null || break; done
  wait $pid
  rc=$?
  [ $rc != 141 ] && bad="$bad run $i: exit $rc ($(tail -c 200 "$TMP/burst.err"));"
  rm -rf "$TMP/burst$i"
done
if [ -n "$bad" ]; then fail cli_signal_burst "$bad"; else pass cli_signal_burst; fi

# ---- --resume DIR alone keeps the options that shaped the plan (issue 40: a run started at
# --vram 100M resumed with a larger arena); another --threads is said to end bit for bit ----
run --device cpu --threads 1 --micro-batch 4 --max-steps 2 --out "$TMP/keep" "$TMP/syn.recipe"
p1=$(echo "$OUT" | grep -o "micro-batch [0-9]* x [0-9]*")
run --resume "$TMP/keep" --max-steps 4
p2=$(echo "$OUT" | grep -o "micro-batch [0-9]* x [0-9]*")
run --resume "$TMP/keep" --threads 2 --max-steps 6
if [ "$p1" != "micro-batch 4 x 4" ] || [ "$p2" != "$p1" ]; then fail cli_resume_keeps_options "first '$p1', resumed '$p2'"
elif [ "$RC" != 0 ] || ! echo "$ERR" | grep -q "the resumed run is not bit for bit"; then
  fail cli_resume_keeps_options "--threads 2 on resume: exit $RC, $ERR"
else pass cli_resume_keeps_options; fi

# ---- issue 25: resuming told what it needs: the run directory, more epochs, what changed ----
ok=1
expect_usage "--resume a state file" "--resume takes the run directory, not a file: --resume $TMP/sig" --resume "$TMP/sig/state.safetensors"
expect_usage "--weights a run directory" "did you mean --weights $TMP/sig/weights.safetensors?" eval --weights "$TMP/sig" "$TMP/syn.recipe"
expect_usage "--init a run directory" "did you mean --init $TMP/sig/weights.safetensors?" --init "$TMP/sig" "$TMP/syn.recipe"
[ $ok = 1 ] && pass cli_resume_usage
run --device cpu --threads 1 --out "$TMP/done" --epochs 1 "$TMP/syn.recipe"
if [ "$RC" != 0 ]; then fail cli_resume_complete "one epoch: exit $RC: $ERR"
else
  run --device cpu --threads 1 --resume "$TMP/done" --epochs 1
  if [ "$RC" != 0 ] || ! echo "$OUT" | grep -qF "the run is complete (1 epochs" || ! echo "$OUT" | grep -qF -- "--resume $TMP/done --epochs 2"; then
    fail cli_resume_complete "exit $RC: $OUT $ERR"
  else pass cli_resume_complete; fi
  sed 's/^\[train\]$/[train]\nlr = 0.0123/' "$TMP/syn.recipe" >"$TMP/edited.recipe"
  run --device cpu --threads 1 --resume "$TMP/done" --epochs 2 --max-steps 1000000 "$TMP/edited.recipe"
  if [ "$RC" != 0 ] || ! echo "$ERR" | grep -q "epochs changed since the run started: 1 before, 2 now" ||
     ! echo "$ERR" | grep -q "lr changed since the run started: 0.01 before, 0.0123 now"; then
    fail cli_resume_changed "exit $RC: $ERR"
  else pass cli_resume_changed; fi
fi

# ---- --threads beyond the cores: lowered to the cores, with a warning (1000000 crashed OpenMP) ----
cat >"$TMP/synthetic.recipe" <<EOF
[net]
input = 1x16x16
classes = 10
[train]
batch = 8
[data]
format = synthetic
[conv c1]
filters = 8
size = 3
[relu]
[flatten]
[linear fc]
out = 10
EOF
run --device cpu --threads 1000000 --max-steps 1 --out "$TMP/run_threads" "$TMP/synthetic.recipe"
if [ "$RC" != 0 ]; then
  fail cli_threads_bounded "--threads 1000000: exit $RC: $(echo "$ERR" | tail -n 3)"
elif ! grep -q "threads 1000000 is more than the [0-9]* cores this process can use; using [0-9]*" "$TMP/err"; then
  fail cli_threads_bounded "no warning that --threads was lowered: $ERR"
else
  pass cli_threads_bounded
fi

# ---- TINYTRAIN_PROFILE=1 on the CPU: the per-step table on stderr, the layers' forward and backward in it ----
TINYTRAIN_PROFILE=1 "$TT" --device cpu --max-steps 2 --out "$TMP/run_profile" "$TMP/synthetic.recipe" >"$TMP/out" 2>"$TMP/err"
RC=$?
if [ "$RC" != 0 ]; then
  fail cli_profile_cpu "exit $RC: $(tail -n 3 "$TMP/err")"
elif ! grep -q "^TINYTRAIN_PROFILE: [0-9]* Program steps on " "$TMP/err" ||
     ! grep -Eq "^train +forward +c1 " "$TMP/err" || ! grep -Eq "^train +backward +fc " "$TMP/err"; then
  fail cli_profile_cpu "no profile table with c1's forward and fc's backward: $(head -c 600 "$TMP/err")"
else
  pass cli_profile_cpu
fi

# ---- the run's lock file is never followed through a link (issue 40): a link planted as DIR/.lock
# is refused, naming it, and its target keeps its bytes ----
mkdir -p "$TMP/lockrun"
printf 'precious\n' >"$TMP/precious"
ln -s "$TMP/precious" "$TMP/lockrun/.lock"
"$TT" --device cpu --max-steps 1 --out "$TMP/lockrun" "$TMP/synthetic.recipe" >"$TMP/out" 2>"$TMP/err"
RC=$?
if [ "$RC" = 0 ] || ! grep -q "lock.*symbolic link" "$TMP/err" || [ "$(cat "$TMP/precious")" != precious ]; then
  fail cli_lock_no_follow "exit $RC, target now '$(head -c 40 "$TMP/precious")': $(head -c 300 "$TMP/err")"
else
  pass cli_lock_no_follow
fi

# ---- plan --svg writes no file it should not (issue 40): not the recipe it plans, not an existing
# file that is no SVG, not an empty name; an earlier picture is replaced ----
cp $L "$TMP/self.recipe"
printf 'keep me\n' >"$TMP/notes.txt"
ok=1
for args in "--svg $TMP/self.recipe $TMP/self.recipe" "--svg $TMP/notes.txt $L"; do
  # shellcheck disable=SC2086
  "$TT" plan $args >"$TMP/out" 2>"$TMP/err"
  RC=$?
  if [ "$RC" != 2 ] || [ -s "$TMP/out" ]; then fail cli_svg_target "'plan $args': exit $RC, stdout $(wc -c <"$TMP/out") bytes"; ok=0; fi
done
"$TT" plan --svg '' $L >"$TMP/out" 2>"$TMP/err"
RC=$?
[ "$RC" = 2 ] || { fail cli_svg_target "'plan --svg \'\'': exit $RC"; ok=0; }
cmp -s $L "$TMP/self.recipe" || { fail cli_svg_target "the recipe was overwritten"; ok=0; }
[ "$(cat "$TMP/notes.txt")" = "keep me" ] || { fail cli_svg_target "notes.txt was overwritten"; ok=0; }
"$TT" plan --svg "$TMP/p.svg" $L >/dev/null 2>&1 && "$TT" plan --svg "$TMP/p.svg" $L >/dev/null 2>&1 ||
  { fail cli_svg_target "an earlier picture was not replaced"; ok=0; }
[ $ok = 1 ] && pass cli_svg_target

# ---- [train] compress_saved not applied is said (issue 40): a plan that fits with the exact tensors ----
sed 's/^\[train\]/[train]\ncompress_saved = int8/' examples/fashion_mnist/resnet.recipe >"$TMP/compress.recipe"
run plan --vram 4G "$TMP/compress.recipe"
if [ "$RC" != 0 ] || ! echo "$OUT" | grep -q "compressed  none: \[train\] compress_saved = int8 applies only where"; then
  fail cli_compress_not_applied "exit $RC: $(echo "$OUT" | grep -A1 compressed)"
else pass cli_compress_not_applied; fi

# ---- --precision fp16 on the CPU says it is slower there (issue 40), in train and in plan ----
run --device cpu --threads 1 --precision fp16 --max-steps 1 --out "$TMP/fp16cpu" "$TMP/syn.recipe"
t=$OUT
run plan --device cpu --precision fp16 "$TMP/syn.recipe"
if ! echo "$t" | grep -q "fp16 on the CPU converts every op through fp32: slower than fp32" ||
   ! echo "$OUT" | grep -q "precision .*fp16, as asked.*slower than fp32"; then
  fail cli_fp16_cpu_said "train: $(echo "$t" | grep -A1 note), plan: $(echo "$OUT" | grep precision)"
else pass cli_fp16_cpu_said; fi

# ---- --precision auto on the CPU takes bf16 only where it is the faster precision (issue 40): AMX,
# or AVX512_BF16 on a CPU that is not Intel's; an Intel CPU with AVX512_BF16 and no AMX stays fp32
# (its bf16 kernels ran at half the fp32 rate). The expectation follows the rule from oneDNN's ISA
# as --version prints it and the CPU's vendor; the second pass holds AMX away where there is one.
vendor=$(awk -F': ' '/^vendor_id/ {print $2; exit}' /proc/cpuinfo)
for hold in "" AVX512_CORE_BF16; do
  hrun() { if [ -n "$hold" ]; then ONEDNN_MAX_CPU_ISA=$hold run "$@"; else run "$@"; fi; }
  hrun --version
  isa=$(echo "$OUT" | sed -n 's/.*cpu: oneDNN [0-9.]*, \([a-z0-9_]*\).*/\1/p' | head -1)
  hrun plan --device cpu examples/fashion_mnist/lenet.recipe
  line=$(echo "$OUT" | grep '^  precision')
  case "$isa" in
    *amx*) want="bf16 (auto: this CPU" ;;
    avx512_core_bf16) if [ "$vendor" = GenuineIntel ]; then want="fp32 (auto: this CPU computes bf16 natively, but slower than fp32"
                      else want="bf16 (auto: this CPU"; fi ;;
    *) want="fp32 (auto: this CPU has no native bf16" ;;
  esac
  if [ "$RC" != 0 ] || [ -z "$isa" ] || ! echo "$line" | grep -qF "precision   $want"; then
    fail "cli_auto_precision_cpu${hold:+_held}" "ISA '$isa', vendor $vendor: wanted '$want', got: $line (exit $RC)"
  else pass "cli_auto_precision_cpu${hold:+_held}"; fi
done

# ---- a recipe.txt that is a FIFO or a directory is named as such, not as missing, and does not hang ----
mkdir -p "$TMP/fifo"
cp "$TMP/keep/state.safetensors" "$TMP/fifo/" 2>/dev/null
mkfifo "$TMP/fifo/recipe.txt"
timeout 20 "$TT" --resume "$TMP/fifo" >"$TMP/out" 2>"$TMP/err"
RC=$?
if [ "$RC" != 1 ] || ! grep -q "recipe.txt: not a regular file (a named pipe" "$TMP/err"; then
  fail cli_resume_recipe_fifo "exit $RC: $(head -c 300 "$TMP/err")"
else pass cli_resume_recipe_fifo; fi

# ---- plan names the frozen layers (issue 40: it counted their parameters only) ----
awk '{print} /^\[conv/ && !done {print "freeze = true"; done = 1}' "$TMP/syn.recipe" >"$TMP/frozen.recipe"
run plan --device cpu "$TMP/frozen.recipe"
if [ "$RC" != 0 ] || ! echo "$OUT" | grep -A1 "^  frozen" | grep -q "layers "; then
  fail cli_plan_frozen_names "exit $RC: $(echo "$OUT" | grep -A1 frozen)"
else pass cli_plan_frozen_names; fi

# ---- a diverging run (issue 40): never a checkpoint that is not finite, the last good one kept,
# in every precision; fp16 that keeps overflowing ends with a message ----
sed 's/^log_every = 1$/log_every = 100\nlr = 1e30/' "$TMP/syn.recipe" >"$TMP/diverge.recipe"
finite_ckpt() { # every F32 value of a safetensors file is finite
  python3 -c 'import json, math, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
for k, t in h.items():
    if k == "__metadata__": continue
    s, e = t["data_offsets"]
    v = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    assert all(math.isfinite(x) for x in v), k' "$1"
}
ok=1
for p in fp32 bf16; do
  run --device cpu --threads 1 --precision $p --max-steps 40 --checkpoint-every 1 --out "$TMP/div_$p" "$TMP/diverge.recipe"
  if [ "$RC" != 1 ] || ! echo "$ERR" | grep -q "the run diverged"; then
    fail cli_diverge_keeps_good "$p: exit $RC, $(echo "$ERR" | tail -1)"; ok=0
  elif [ -f "$TMP/div_$p/state.safetensors" ] && ! { finite_ckpt "$TMP/div_$p/state.safetensors" && finite_ckpt "$TMP/div_$p/weights.safetensors"; }; then
    fail cli_diverge_keeps_good "$p: a checkpoint with non-finite values was written"; ok=0
  fi
done
run --device cpu --threads 1 --precision fp16 --max-steps 200 --out "$TMP/div_fp16" "$TMP/diverge.recipe"
if [ "$RC" != 1 ] || ! echo "$ERR" | grep -Eq "fp16 steps in a row overflowed|the run diverged|training loss became"; then
  fail cli_diverge_keeps_good "fp16: exit $RC, $(echo "$ERR" | tail -1)"; ok=0
fi
[ $ok = 1 ] && pass cli_diverge_keeps_good

# ---- plan shows the final call list with its fusions (issue 39): the CUDA plan of the fashion
# ResNet fuses its 7 batch norm + ReLU pairs both ways and (issue 41) its 6 residual ends' batch
# norm + add + ReLU, 6 forward and 6 backward (each backward one takes the ReLU's call and the add's
# two accumulates; layer3.0's stayed apart until the ReLU's saved y was kept to the batch norm's
# step, lower_passes.c), TINYTRAIN_FUSE=0 none, and says the knob ----
R=examples/fashion_mnist/resnet.recipe
"$TT" plan --gpu t4 --calls $R >"$TMP/calls" 2>&1
"$TT" plan --gpu t4 --json $R >"$TMP/j1" 2>&1
TINYTRAIN_FUSE=0 "$TT" plan --gpu t4 --json $R >"$TMP/j0" 2>&1
if [ "$(grep -c ' bn_fwd_train_relu ' "$TMP/calls")" != 7 ] || [ "$(grep -c ' bn_bwd_relu ' "$TMP/calls")" != 7 ] ||
   [ "$(grep -c ' bn_fwd_train_add_relu ' "$TMP/calls")" != 6 ] || [ "$(grep -c ' bn_bwd_add_relu ' "$TMP/calls")" != 6 ] ||
   [ "$(grep -c 'fused into call' "$TMP/calls")" != 44 ] ||
   ! python3 -c 'import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["calls"]["fused"] == 26 and b["calls"]["fused"] == 0, (a["calls"]["fused"], b["calls"]["fused"])
assert sum(c["call"] == "bn_fwd_train_relu" for c in a["calls"]["list"]) == 7
assert sum(c["call"] == "bn_bwd_add_relu" for c in a["calls"]["list"]) == 6
assert a["knobs"] == {} and b["knobs"] == {"TINYTRAIN_FUSE": "0"}, (a["knobs"], b["knobs"])' "$TMP/j1" "$TMP/j0"; then
  fail cli_plan_calls "$(head -3 "$TMP/calls"; grep -c relu "$TMP/calls")"
else pass cli_plan_calls; fi

# ---- the CPU backend runs each batch norm and the ReLU after it as one call both ways
# (bn_fwd_train_relu, bn_bwd_relu; issue 40): the fashion ResNet's plan fuses its 7 pairs, and 2
# steps on synthetic data train the same bits with TINYTRAIN_FUSE=0 (the pairs apart), in fp32
# and bf16 ----
ok=1
"$TT" plan --device cpu --calls $R >"$TMP/calls" 2>&1
if [ "$(grep -c ' bn_bwd_relu ' "$TMP/calls")" != 7 ] || [ "$(grep -c ' bn_fwd_train_relu ' "$TMP/calls")" != 7 ]; then
  fail cli_cpu_bn_relu_fused "the CPU plan has $(grep -c ' bn_fwd_train_relu ' "$TMP/calls") bn_fwd_train_relu and $(grep -c ' bn_bwd_relu ' "$TMP/calls") bn_bwd_relu calls, want 7 each"; ok=0
fi
sed '/^\[data\]/,/^\[/{/^\[data\]/!{/^\[/!d}}' $R | sed 's/^\[data\]/[data]\nformat = synthetic/' >"$TMP/rn_syn.recipe"
for p in fp32 bf16; do
  [ $ok = 1 ] || break
  for f in 1 0; do
    rm -rf "$TMP/fuse_$f"
    TINYTRAIN_FUSE=$f "$TT" --device cpu --threads 2 --precision $p --max-steps 2 --out "$TMP/fuse_$f" "$TMP/rn_syn.recipe" \
      >"$TMP/out" 2>"$TMP/err" || { fail cli_cpu_bn_relu_fused "$p FUSE=$f: $(tail -1 "$TMP/err")"; ok=0; break; }
  done
  if [ $ok = 1 ] && ! cmp -s "$TMP/fuse_1/state.safetensors" "$TMP/fuse_0/state.safetensors"; then
    fail cli_cpu_bn_relu_fused "$p: the fused run's state differs from TINYTRAIN_FUSE=0's"; ok=0
  fi
done
[ $ok = 1 ] && pass cli_cpu_bn_relu_fused

# ---- plan says which ISA the CPU runs on (issue 40): ONEDNN_MAX_CPU_ISA=AVX2 holds oneDNN there,
# TINYTRAIN_CPU_ISA=avx2 oneDNN and our own loops (line and --json) ----
ONEDNN_MAX_CPU_ISA=AVX2 "$TT" plan --device cpu $L >"$TMP/out" 2>"$TMP/err"
RC=$?
if [ "$RC" != 0 ] || ! grep -Eq "^  cpu +oneDNN [0-9.]+, avx2; own loops [a-z0-9]+ " "$TMP/out"; then
  fail cli_plan_cpu_isa "exit $RC: $(grep '^  cpu' "$TMP/out")"
else pass cli_plan_cpu_isa; fi
TINYTRAIN_CPU_ISA=avx2 "$TT" plan --device cpu $L >"$TMP/out" 2>"$TMP/err"
RC=$?
TINYTRAIN_CPU_ISA=avx2 "$TT" plan --device cpu --json $L >"$TMP/j" 2>>"$TMP/err"
if [ "$RC" != 0 ] || ! grep -Eq "^  cpu +oneDNN [0-9.]+, avx2; own loops avx2 \(TINYTRAIN_CPU_ISA holds both\)" "$TMP/out" ||
   ! python3 -c 'import json, re, sys
j = json.load(open(sys.argv[1]))
assert re.fullmatch(r"oneDNN [0-9.]+, avx2; own loops avx2", j["cpu_backend"]), j["cpu_backend"]
assert j["knobs"] == {"TINYTRAIN_CPU_ISA": "avx2"}, j["knobs"]' "$TMP/j"; then
  fail cli_plan_cpu_isa_knob "exit $RC: $(grep '^  cpu' "$TMP/out"; head -c 300 "$TMP/err")"
else pass cli_plan_cpu_isa_knob; fi

# ---- plan counts the convolution calls our Winograd runs (cpu_conv_wg.c): the fashion ResNet's 10
# 3x3 stride-1 convolutions between 24, 48 and 96 channels (not the 1-channel stem, not the two
# stride-2 ones), 3 directions each, where oneDNN has no AVX-512 (held with ONEDNN_MAX_CPU_ISA=AVX2,
# or natively on an AVX2 CPU); none under TINYTRAIN_CONV_WINOGRAD=off, nor natively where oneDNN
# runs AVX-512 (its ISA in cpu_backend, before our loops' level: the whole suite may run under
# ONEDNN_MAX_CPU_ISA=AVX2); the text line says it ----
if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then skip cli_plan_winograd "no AVX2 and FMA here"
else
  ok=1
  ONEDNN_MAX_CPU_ISA=AVX2 "$TT" plan --device cpu --json $R >"$TMP/wj1" 2>"$TMP/err" || ok=0
  ONEDNN_MAX_CPU_ISA=AVX2 TINYTRAIN_CONV_WINOGRAD=off "$TT" plan --device cpu --json $R >"$TMP/wj0" 2>>"$TMP/err" || ok=0
  "$TT" plan --device cpu --json $R >"$TMP/wjn" 2>>"$TMP/err" || ok=0
  ONEDNN_MAX_CPU_ISA=AVX2 "$TT" plan --device cpu $R >"$TMP/wt" 2>>"$TMP/err" || ok=0
  if [ $ok = 0 ] || ! grep -Eq "30 of [0-9]+ convolution calls per micro-step by tinytrain's Winograd" "$TMP/wt" || ! python3 -c 'import json, sys
a, b, c = (json.load(open(f)) for f in sys.argv[1:4])
assert a["cpu_winograd_calls"] == 30 and b["cpu_winograd_calls"] == 0, (a["cpu_winograd_calls"], b["cpu_winograd_calls"])
native = 0 if "avx512" in c["cpu_backend"].split(";")[0] else 30  # the ISA of oneDNN, not of our loops
assert c["cpu_winograd_calls"] == native, (c["cpu_backend"], c["cpu_winograd_calls"])' "$TMP/wj1" "$TMP/wj0" "$TMP/wjn"; then
    fail cli_plan_winograd "$(grep -A1 '^  cpu' "$TMP/wt"; head -c 300 "$TMP/err")"
  else pass cli_plan_winograd; fi
fi

# ---- --version names the ISA of oneDNN and of our own loops (issue 40): the CPU's by default (as
# /proc/cpuinfo has it), AVX2 for both under TINYTRAIN_CPU_ISA=avx2; a malformed value is refused ----
run --version
own=baseline
grep -qw avx2 /proc/cpuinfo && own=avx2
grep -qw avx512f /proc/cpuinfo && own=avx512f
if [ "$RC" != 0 ] || ! grep -Eq "^cpu: oneDNN [0-9.]+, [a-z0-9_]+; own loops $own$" "$TMP/out"; then
  fail cli_version_cpu_isa "exit $RC, expected own loops $own: $(grep '^cpu' "$TMP/out")"
else
  TINYTRAIN_CPU_ISA=avx2 "$TT" --version >"$TMP/out" 2>"$TMP/err"
  RC=$?
  TINYTRAIN_CPU_ISA=avx3 "$TT" --version >"$TMP/out3" 2>"$TMP/err3"
  RC3=$?
  if [ "$own" != baseline ] && { [ "$RC" != 0 ] || ! grep -Eq "^cpu: oneDNN [0-9.]+, avx2; own loops avx2$" "$TMP/out"; }; then
    fail cli_version_cpu_isa "TINYTRAIN_CPU_ISA=avx2: exit $RC: $(grep '^cpu' "$TMP/out")"
  elif [ "$RC3" != 2 ] || ! grep -q "TINYTRAIN_CPU_ISA='avx3': expected one of native|avx2|baseline" "$TMP/err3"; then
    fail cli_version_cpu_isa "TINYTRAIN_CPU_ISA=avx3: exit $RC3, $(head -c 300 "$TMP/err3")"
  else pass cli_version_cpu_isa; fi
fi

# ---- a CPU-vs-reference comparison with our loops and oneDNN held to AVX2, as CI's rerun does
# (the cpu_isa test checks the hold took: both at AVX2; the winner cases: 3 NCHW, 4 NHWC) ----
BT=${TT_BUILD:-build}/tests
if [ ! -x "$BT/test_cpu_vs_ref" ]; then skip cli_cpu_isa_avx2_run "$BT/test_cpu_vs_ref not built"
else
  TINYTRAIN_CPU_ISA=avx2 "$BT/test_cpu_vs_ref" --only cpu_isa --only misc_bitwise --only pool_idx >"$TMP/out" 2>&1
  RC=$?
  if [ "$RC" != 0 ] || grep -q '^FAIL' "$TMP/out" || ! grep -q '^PASS cpu_vs_ref:cpu_isa_held$' "$TMP/out" ||
     ! grep -q '^PASS cpu_vs_ref:cast_dropout_gap_normalize_check_masks_bitwise_fp32_bf16$' "$TMP/out" ||
     [ "$(grep -c '^PASS cpu_vs_ref:pool_argmax_bwd_idx' "$TMP/out")" != 7 ] ||
     { [ "$own" != baseline ] && ! grep -q "own loops avx2" "$TMP/out"; }; then
    fail cli_cpu_isa_avx2_run "exit $RC: $(grep -E '^(FAIL|  TINYTRAIN)' "$TMP/out" | head -5)"
  else pass cli_cpu_isa_avx2_run; fi
fi

# ---- output that cannot be written is a failure (issue 40): plan, plan --json and --version into a
# full disk exit 1 with the reason, not 0 with nothing written ----
ok=1
for args in "--version" "plan $L" "plan --json $L"; do
  # shellcheck disable=SC2086
  "$TT" $args >/dev/full 2>"$TMP/err"
  RC=$?
  if [ "$RC" != 1 ] || ! grep -q "could not write the output to standard output" "$TMP/err"; then
    fail cli_stdout_full "'tinytrain $args > /dev/full': exit $RC, $(head -c 300 "$TMP/err")"; ok=0
  fi
done
[ $ok = 1 ] && pass cli_stdout_full

# ---- [train] optimizer_state (issue 42): plan's opt state line; a run with int8 state resumed under
# bf16 converts its state and says so ----
printf '[net]\ninput = 1x8x8\nclasses = 10\n[train]\nbatch = 8\nepochs = 1\noptimizer = adamw\nlr = 0.001\noptimizer_state = int8\n[data]\nformat = synthetic\n[conv c1]\nfilters = 8\nsize = 3\n[relu]\n[flatten]\n[linear fc1]\nout = 96\n[relu]\n[linear fc]\nout = 10\n' >"$TMP/ostate.recipe"
run plan --device cpu "$TMP/ostate.recipe"
if [ "$RC" != 0 ] || ! echo "$OUT" | grep -q "^  opt state   .*optimizer_state = int8" ||
   ! echo "$OUT" | grep -q "0 bf16, 2 int8 (an fp32 scale per 2048 values), 10 fp32"; then
  fail cli_optimizer_state "plan: exit $RC: $(echo "$OUT" | grep -A1 'opt state') $ERR"
else
  run train --device cpu --threads 1 --max-steps 2 --out "$TMP/run_ostate" "$TMP/ostate.recipe"
  sed -i 's/optimizer_state = int8/optimizer_state = bf16/' "$TMP/run_ostate/recipe.txt"
  rc1=$RC
  run train --device cpu --threads 1 --max-steps 3 --resume "$TMP/run_ostate"
  if [ "$rc1" != 0 ] || [ "$RC" != 0 ] || ! echo "$ERR$OUT" | grep -q "optimizer state converted for 2 tensors (saved as int8, held as bf16"; then
    fail cli_optimizer_state "train exit $rc1, resume exit $RC: $(echo "$ERR" | head -3)"
  else pass cli_optimizer_state; fi
fi

exit $FAILED
