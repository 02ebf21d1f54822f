#!/bin/bash
# tests/runtime/test_dist.sh — multi-process training on the CPU (mpirun; core/runtime/dist.c):
#   dist_equal2     mpirun -np 2 equals one process with two accumulation steps of the same
#                   micro-batch: weights and optimizer state bit for bit after 6 optimizer steps
#   dist_buckets    the same with the gradients in many small buckets (TINYTRAIN_DIST_BUCKET),
#                   each all-reduced while backward still runs
#   dist_equal3     -np 3 against one process with three accumulation steps: within 1e-5
#                   (the sum of three gradients is added in another order)
#   dist_resume     a 2-rank checkpoint resumed on 1 and on 3 ranks continues the same run
#                   (same data order): within 1e-5 of the 2-rank run that was not interrupted
#   dist_fp16       fp16 from a loss scale of 2^24: the same steps skipped on overflow on 2 ranks
#                   as in one process, and the same state bit for bit
#   dist_bn         with batch norm: all but the running statistics bit for bit (these are
#                   rank 0's, from half the micro-batches)
#   dist_eval       eval on 3 ranks (sharded, sums over the ranks) prints what one process does;
#                   a 2-rank epoch's evaluation is that of rank 0's weights and statistics
#   dist_plan       plan --ranks N plans one rank's share and says so; a batch that does not
#                   divide among the ranks is refused
#   dist_fail       a rank that fails (rank 0 refusing --out) ends the job with a line naming it
#   dist_agree      ranks started with another --max-steps (mpirun's MPMD ':') end at once, every
#                   rank failing with a line naming the rank and the field
#   dist_watchdog   a rank stopped (SIGSTOP) mid-run: within TINYTRAIN_DIST_TIMEOUT seconds the
#                   waiting rank names the collective and the rank, and the job ends
#   dist_watchdog3  the same on 3 ranks with rank 2 stopped: a waiting rank names rank 2 (not
#                   "one of the other 2")
#   dist_kill       a rank killed mid-run ends the job within seconds, mpirun's message names
#                   the rank, and the last checkpoint loads (eval) and resumes
# fp32, one thread per rank, the default CPU backend (oneDNN; bit-exact here: each rank computes
# its micro-batch's gradient exactly as the accumulating process does, and a sum of two floats
# does not depend on the order). The recipe has dropout: a rank's micro-step draws the masks of
# the global micro-step whose batch it trains, so dropout does not break the equality. Skipped, with a message, where mpirun is missing
# or the binary was built without MPI. Run from the repository root: bash tests/runtime/test_dist.sh
. "$(dirname "$0")/../tt_test.sh" dist
if ! command -v mpirun >/dev/null 2>&1; then
  skip dist "mpirun not found (Debian: openmpi-bin libopenmpi-dev; ./configure.py --deps)"
  exit 0
fi
# root in CI containers; more ranks than cores; shared memory between the local ranks (no
# network probing, no ptrace-based single copy, which containers forbid)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
# a sanitizer build: what MPI's own libraries keep until exit is not ours (tests/lsan_mpi.supp);
# the suppressions match only with whole stacks (the slow unwinder) and with MPI's plugins
# still loaded at exit (no dlclose), so that their frames have names
export LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$PWD/tests/lsan_mpi.supp
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0
export OMPI_MCA_mca_base_component_disable_dlclose=1
CMP="python3 tests/tools/st_compare.py"

# mp N ARGS...: tinytrain on N ranks (N = 0: without mpirun); RC, ERR
mp() {
  local n=$1
  shift
  if [ "$n" = 0 ]; then
    timeout 120 "$TT" "$@" >"$TMP/out" 2>"$TMP/err"
  elif [ "$1" = -x ]; then # mp N -x VAR ARGS: VAR passed to the ranks
    timeout 120 mpirun -np "$n" -x "$2" "$TT" "${@:3}" >"$TMP/out" 2>"$TMP/err"
  else
    timeout 120 mpirun -np "$n" "$TT" "$@" >"$TMP/out" 2>"$TMP/err"
  fi
  RC=$?
  ERR=$(tail -5 "$TMP/err")
}

{
  tiny_recipe_head
  cat <<EOF
[linear fc1]
out = 16
[relu]
[dropout]
p = 0.25
[linear fc]
out = 10
EOF
} >"$TMP/tiny.recipe"
R="$TMP/tiny.recipe"
O="--device cpu --threads 1"

mp 2 $O --micro-batch 1 --max-steps 1 --out "$TMP/probe" "$R"
if [ "$RC" != 0 ] && grep -q "built without MPI" "$TMP/err"; then
  skip dist "$TT was built without MPI (configure found no mpicc)"
  exit 0
fi

# ---- equivalence: 2 ranks = 1 process x 2 accumulation steps; 3 ranks within 1e-5 ----
mp 0 $O --micro-batch 6 --max-steps 6 --out "$TMP/one2" "$R"
[ "$RC" = 0 ] || fail dist_equal2 "one process: exit $RC: $ERR"
mp 2 $O --micro-batch 6 --max-steps 6 --out "$TMP/two" "$R"
if [ "$RC" != 0 ]; then
  fail dist_equal2 "mpirun -np 2: exit $RC: $ERR"
elif ! grep -q "micro-batch 6 x 1 accumulation" "$TMP/out"; then
  fail dist_equal2 "each rank should run micro-batch 6 x 1 accumulation: $(head -4 "$TMP/out")"
elif ! m=$($CMP "$TMP/one2/weights.safetensors" "$TMP/two/weights.safetensors") ||
     ! m2=$($CMP "$TMP/one2/state.safetensors" "$TMP/two/state.safetensors"); then
  fail dist_equal2 "weights or optimizer state not bit for bit: $m $m2"
else
  pass dist_equal2
fi

# the same with the gradients in many small buckets, each all-reduced while backward goes on
# (a bucket started before backward finished writing it would break the equality)
n=$(TINYTRAIN_DIST_BUCKET=256 "$TT" plan --device cpu --ranks 2 --micro-batch 6 "$R" | sed -n 's/.* in \([0-9]*\) buckets$/\1/p')
TINYTRAIN_DIST_BUCKET=256 mp 2 -x TINYTRAIN_DIST_BUCKET $O --micro-batch 6 --max-steps 6 --out "$TMP/twob" "$R"
if [ "$RC" != 0 ]; then
  fail dist_buckets "mpirun -np 2: exit $RC: $ERR"
elif ! [ "${n:-0}" -ge 3 ] 2>/dev/null; then
  fail dist_buckets "plan should say the gradients go in 3 or more buckets of 256 bytes: '$n'"
elif ! m=$($CMP "$TMP/one2/state.safetensors" "$TMP/twob/state.safetensors"); then
  fail dist_buckets "$n buckets: not bit for bit: $m"
else
  pass dist_buckets
fi

mp 0 $O --micro-batch 4 --max-steps 6 --out "$TMP/one3" "$R"
[ "$RC" = 0 ] || fail dist_equal3 "one process: exit $RC: $ERR"
mp 3 $O --micro-batch 4 --max-steps 6 --out "$TMP/three" "$R"
if [ "$RC" != 0 ]; then
  fail dist_equal3 "mpirun -np 3: exit $RC: $ERR"
elif ! m=$($CMP --tol 1e-5 "$TMP/one3/state.safetensors" "$TMP/three/state.safetensors"); then
  fail dist_equal3 "$m"
else
  pass dist_equal3
fi

# ---- resume a 2-rank checkpoint on 1 and on 3 ranks: the same run as 2 ranks throughout ----
ok=1
mp 2 $O --micro-batch 2 --max-steps 10 --out "$TMP/ref" "$R"
[ "$RC" = 0 ] || { fail dist_resume "2 ranks, 10 steps: exit $RC: $ERR"; ok=0; }
for n in 0 3; do
  [ $ok = 1 ] || break
  rm -rf "$TMP/part"
  mp 2 $O --micro-batch 2 --max-steps 4 --out "$TMP/part" "$R"
  [ "$RC" = 0 ] || { fail dist_resume "2 ranks, 4 steps: exit $RC: $ERR"; ok=0; break; }
  mp $n $O --micro-batch 2 --max-steps 10 --resume "$TMP/part" "$R"
  [ "$RC" = 0 ] || { fail dist_resume "resumed on ${n/0/1} ranks: exit $RC: $ERR"; ok=0; break; }
  if ! m=$($CMP --tol 1e-5 "$TMP/ref/state.safetensors" "$TMP/part/state.safetensors"); then
    fail dist_resume "resumed on ${n/0/1} ranks: not the run that went on on 2 ranks: $m"; ok=0
  fi
done
[ $ok = 1 ] && pass dist_resume

# ---- fp16: the overflow decision is global (one skipped step everywhere) ----
# a checkpoint whose loss scale is set to 2^24 overflows for several steps, while the scale
# comes down: 2 ranks must skip exactly the steps one process with 2 accumulation steps skips
mp 0 $O --precision fp16 --micro-batch 6 --max-steps 2 --out "$TMP/h0" "$R"
python3 - "$TMP/h0/state.safetensors" <<'PYEOF'
import json, struct, sys
d = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", d[:8])[0]
h = json.loads(d[8:8 + n])
h["__metadata__"]["loss_scale"] = "16777216"
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(t)) + t + d[8 + n:])
PYEOF
cp -r "$TMP/h0" "$TMP/h1" && cp -r "$TMP/h0" "$TMP/h2"
mp 0 $O --precision fp16 --micro-batch 6 --max-steps 30 --resume "$TMP/h1" "$R"
s1=$(grep -o "fp16: [0-9]* optimizer steps skipped" "$TMP/out")
mp 2 $O --precision fp16 --micro-batch 6 --max-steps 30 --resume "$TMP/h2" "$R"
s2=$(grep -o "fp16: [0-9]* optimizer steps skipped" "$TMP/out")
if [ "$RC" != 0 ]; then
  fail dist_fp16 "mpirun -np 2: exit $RC: $ERR"
elif [ -z "$s1" ] || [ "$s1" != "$s2" ]; then
  fail dist_fp16 "one process: '$s1', 2 ranks: '$s2' (want the same steps skipped, some)"
elif ! m=$($CMP "$TMP/h1/state.safetensors" "$TMP/h2/state.safetensors"); then
  fail dist_fp16 "not bit for bit after the skipped steps: $m"
else
  pass dist_fp16
fi

# ---- batch norm: per-rank statistics, rank 0's running statistics; sharded evaluation ----
sed 's/^\[relu\]$/[bn]\n[relu]/; s/^\[train\]$/[train]\neval_batch = 32/' "$R" >"$TMP/bn.recipe"
mp 0 $O --micro-batch 6 --max-steps 6 --out "$TMP/bn1" "$TMP/bn.recipe"
[ "$RC" = 0 ] || fail dist_bn "one process: exit $RC: $ERR"
mp 2 $O --micro-batch 6 --max-steps 6 --out "$TMP/bn2" "$TMP/bn.recipe"
if [ "$RC" != 0 ]; then
  fail dist_bn "mpirun -np 2: exit $RC: $ERR"
elif ! grep -q "running_mean" <(python3 -c "import json,struct,sys; d=open(sys.argv[1],'rb').read(); print(d[8:8+struct.unpack('<Q',d[:8])[0]].decode())" "$TMP/bn2/weights.safetensors"); then
  fail dist_bn "the recipe has no batch-norm running statistics"
elif ! m=$($CMP --skip running_ "$TMP/bn1/state.safetensors" "$TMP/bn2/state.safetensors"); then
  fail dist_bn "weights and optimizer state (running statistics left out) not bit for bit: $m"
elif $CMP "$TMP/bn1/weights.safetensors" "$TMP/bn2/weights.safetensors" >/dev/null; then
  fail dist_bn "the running statistics equal one process's: rank 0 saw only half the micro-batches"
else
  pass dist_bn
fi
# evaluation sharded over the ranks and summed: the one-process figures
"$TT" eval --device cpu --threads 1 --weights "$TMP/bn2/weights.safetensors" "$TMP/bn.recipe" >"$TMP/e1" 2>&1
mp 3 eval --device cpu --threads 1 --weights "$TMP/bn2/weights.safetensors" "$TMP/bn.recipe"
cp "$TMP/out" "$TMP/e3"
rc3=$RC
# the evaluation at the end of an epoch of 2 ranks used rank 0's running statistics (broadcast):
# its accuracy is that of the saved weights
mp 2 $O --micro-batch 6 --epochs 1 --out "$TMP/bnep" "$TMP/bn.recipe"
rc2=$RC
"$TT" eval --device cpu --threads 1 --weights "$TMP/bnep/weights.safetensors" "$TMP/bn.recipe" >"$TMP/e2" 2>&1
same=$(python3 -c "
import json, re, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '\"eval\"' in l]
m = re.search(r'accuracy ([0-9.]+) ', open(sys.argv[2]).read())
print(1 if ev and m and abs(ev[-1]['accuracy'] - float(m.group(1))) < 1e-4 else 0)" "$TMP/bnep/metrics.jsonl" "$TMP/e2" 2>&1)
if [ "$rc2" != 0 ]; then
  fail dist_eval "mpirun -np 2, one epoch: exit $rc2"
elif [ "$same" != 1 ]; then
  fail dist_eval "the 2-rank evaluation ($(grep eval "$TMP/bnep/metrics.jsonl" | tail -1)) is not that of rank 0's weights and statistics ($(cat "$TMP/e2")): $same"
elif [ "$rc3" != 0 ]; then
  fail dist_eval "mpirun -np 3 eval: exit $rc3"
elif ! grep -q "on 256 test images" "$TMP/e1" || [ "$(cat "$TMP/e3")" != "$(cat "$TMP/e1")" ]; then
  fail dist_eval "3 ranks printed '$(cat "$TMP/e3")', one process '$(cat "$TMP/e1")'"
else
  pass dist_eval
fi

# ---- plan --ranks ----
ok=1
"$TT" plan --device cpu --ranks 3 --micro-batch 2 "$R" >"$TMP/plan" 2>&1 || { fail dist_plan "plan --ranks 3 failed: $(tail -2 "$TMP/plan")"; ok=0; }
if [ $ok = 1 ] && ! grep -q "micro-batch 2 x 2 accumulation steps = effective batch 4" "$TMP/plan"; then
  fail dist_plan "plan --ranks 3 of batch 12 should plan 2 x 2 per rank: $(grep policy "$TMP/plan")"; ok=0
fi
if [ $ok = 1 ] && ! grep -q "planned per rank for --ranks 3.*global batch 4 x 3 ranks = 12" "$TMP/plan"; then
  fail dist_plan "plan --ranks 3 does not say it plans per rank: $(grep -A1 ranks "$TMP/plan")"; ok=0
fi
if [ $ok = 1 ] && ! "$TT" plan --device cpu --ranks 3 --json "$R" | grep -q '"ranks": 3, "global_batch": 12'; then
  fail dist_plan "plan --json lacks ranks and global_batch"; ok=0
fi
if [ $ok = 1 ]; then
  "$TT" plan --device cpu --ranks 5 "$R" >"$TMP/plan" 2>&1
  rc=$?
  if [ $rc != 1 ] || ! grep -q "batch 12 does not divide among 5 ranks" "$TMP/plan"; then
    fail dist_plan "batch 12 on 5 ranks: exit $rc, want 1 and a message: $(tail -1 "$TMP/plan")"; ok=0
  fi
fi
if [ $ok = 1 ]; then
  "$TT" --ranks 2 "$R" >"$TMP/plan" 2>&1
  rc=$?
  if [ $rc != 2 ] || ! grep -q "an option of plan" "$TMP/plan"; then
    fail dist_plan "train --ranks: exit $rc, want 2 and a usage line: $(tail -1 "$TMP/plan")"; ok=0
  fi
fi
[ $ok = 1 ] && pass dist_plan

# ---- a rank that fails: its one-line reason names it, MPI_Abort ends the others ----
# --out holding an earlier run is refused by rank 0 only (the others never write), while rank 1
# goes on to its first collective
t0=$(date +%s)
mp 2 $O --max-steps 3 --out "$TMP/two" "$R"
took=$(($(date +%s) - t0))
if [ "$RC" = 0 ] || [ "$RC" = 124 ]; then
  fail dist_fail "mpirun exited $RC with rank 0 failing (want a failure before the timeout)"
elif ! grep -q "^tinytrain: rank 0 of 2: .*holds an earlier run" "$TMP/err"; then
  fail dist_fail "no 'tinytrain: rank 0 of 2: ...' line: $ERR"
elif [ "$took" -gt 15 ]; then
  fail dist_fail "the job took ${took}s to end after rank 0 failed"
else
  pass dist_fail
fi

# ---- the ranks agree on what must be the same, at the start ----
t0=$(date +%s)
timeout 120 mpirun -np 1 "$TT" $O --max-steps 3 --out "$TMP/agree" "$R" : -np 1 "$TT" $O --max-steps 4 --out "$TMP/agree" "$R" \
  >"$TMP/out" 2>"$TMP/err"
RC=$?
took=$(($(date +%s) - t0))
if [ "$RC" = 0 ] || [ "$RC" = 124 ]; then
  fail dist_agree "ranks with --max-steps 3 and 4: mpirun exited $RC (want a failure before the timeout)"
elif ! grep -q "^tinytrain: rank 1 of 2: --max-steps is 4 but 3 on rank 0" "$TMP/err"; then
  fail dist_agree "no line naming rank 1 and --max-steps: $(tail -3 "$TMP/err")"
elif [ "$took" -gt 15 ]; then
  fail dist_agree "took ${took}s"
else
  pass dist_agree
fi

# rank1_pid [N]: the pid of rank 1 (or N) of the mpirun job $MP (found by its OMPI_COMM_WORLD_RANK), or nothing
rank1_pid() {
  local p
  for p in $(pgrep -P "$MP" -d ' ' ; pgrep -f "$TT" -d ' '); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=${1:-1}\$"; then echo "$p"; return; fi
  done
}

# ---- no collective waits forever: a stopped rank is named within the timeout ----
# watchdog_case NAME NP RANK WHO: NP ranks with a 2 s timeout, rank RANK stopped (SIGSTOP) once
# training has started; the job must fail within 15 s with a line from a waiting rank (WHO: a
# grep pattern of its number) naming RANK and the timeout
watchdog_case() {
  local name=$1 np=$2 rank=$3 who=$4 victim t0 rc took
  rm -rf "$TMP/$name"
  TINYTRAIN_DIST_TIMEOUT=2 timeout 120 mpirun -np "$np" -x TINYTRAIN_DIST_TIMEOUT "$TT" $O --micro-batch 2 \
    --out "$TMP/$name" "$R" >"$TMP/wout" 2>"$TMP/werr" &
  MP=$!
  for i in $(seq 300); do [ -f "$TMP/$name/metrics.jsonl" ] && break; sleep 0.1; done
  sleep 0.5
  victim=$(rank1_pid "$rank")
  if [ -z "$victim" ]; then
    kill "$MP" 2>/dev/null
    wait "$MP"
    fail "$name" "rank $rank's process not found: $(tail -3 "$TMP/werr")"
    return
  fi
  t0=$(date +%s)
  kill -STOP "$victim"
  wait "$MP"
  rc=$?
  took=$(($(date +%s) - t0))
  kill -KILL "$victim" 2>/dev/null
  if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
    fail "$name" "mpirun exited $rc with rank $rank stopped (want a failure before the timeout)"
  # the line may name a busy rank beside the stopped one ("for ranks 0, 2"): on loaded cores a
  # waiting rank's heartbeat can be late too; the stopped rank must be among those named
  elif ! grep -Eq "rank $who of $np: .* has waited [0-9]+ s for ranks? ([0-9]+, )*$rank, which stopped answering.*TINYTRAIN_DIST_TIMEOUT=2" "$TMP/werr"; then
    fail "$name" "no line naming rank $rank and the timeout: $(grep -h "waited" "$TMP/werr" | head -3; tail -2 "$TMP/werr")"
  elif [ "$took" -gt 15 ]; then
    fail "$name" "the job took ${took}s to end with a 2 s timeout"
  else
    pass "$name"
  fi
}
watchdog_case dist_watchdog 2 1 0
# 3 ranks, rank 2 stopped: the waiting ranks name it (from its arrivals and heartbeats)
watchdog_case dist_watchdog3 3 2 "[01]"

# ---- a rank killed mid-run ----
rm -rf "$TMP/kill"
timeout 120 mpirun -np 2 "$TT" $O --micro-batch 2 --checkpoint-every 1 --out "$TMP/kill" "$R" >"$TMP/kout" 2>"$TMP/kerr" &
MP=$!
for i in $(seq 300); do [ -f "$TMP/kill/state.safetensors" ] && break; sleep 0.1; done
sleep 0.5
victim=$(rank1_pid)
if [ -z "$victim" ]; then
  kill "$MP" 2>/dev/null
  wait "$MP"
  fail dist_kill "rank 1's process not found (did the run end before it was killed?): $(tail -3 "$TMP/kerr")"
else
  t0=$(date +%s)
  kill -9 "$victim"
  wait "$MP"
  rc=$?
  took=$(($(date +%s) - t0))
  if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
    fail dist_kill "mpirun exited $rc after rank 1 was killed (want a failure before the timeout)"
  elif [ "$took" -gt 15 ]; then
    fail dist_kill "the job took ${took}s to end after rank 1 died"
  elif ! grep -q "rank 1" "$TMP/kerr"; then
    fail dist_kill "no message names rank 1: $(tail -4 "$TMP/kerr")"
  elif ! "$TT" eval --device cpu --weights "$TMP/kill/weights.safetensors" "$R" >"$TMP/eout" 2>&1; then
    fail dist_kill "the last checkpoint does not load: $(tail -1 "$TMP/eout")"
  else
    step=$(python3 -c "import json,struct,sys; d=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',d[:8])[0]; print(json.loads(d[8:8+n])['__metadata__']['step'])" "$TMP/kill/state.safetensors" 2>/dev/null)
    mp 0 $O --micro-batch 2 --max-steps $((${step:-0} + 1)) --resume "$TMP/kill" "$R"
    if [ -z "$step" ] || [ "$RC" != 0 ]; then
      fail dist_kill "resuming the last checkpoint (step '$step') failed: exit $RC: $ERR"
    else
      pass dist_kill
    fi
  fi
fi
exit $FAILED
