# tests/gpu/lease.sh — the lease's steps (issue 41 item 8), sourced by tests/gpu/acceptance.sh
# (--suite lease, the default with --bundle) once the binaries are found; it uses that script's
# helpers (say, block, result, cap, run, want, step) and variables (R, TT, TC, ENV, WORK, LOGS,
# NCU). One call of about 8 minutes (deadline 490 s), in the issue's order, each step with its
# own cap, the report and logs published to $OUT after each:
#   1. memprobe  the CUDA context, the stack limit and what lowering it frees, PyTorch's context
#                (tests/gpu/memprobe.py)                                                         25 s
#                then tinytrain's reserve (plan --json), TINYTRAIN_CUDA_STACK=0 and 1         10 s
#   2. test_cuda HEAD's kernels on the device, every op against the CPU backend                  70 s
#   3. r50       ResNet-50 fp16, batch 256, 24 timed steps after 4, NCHW, NHWC through cuDNN's
#                graph API (TINYTRAIN_CUDA_CONV_API=graph: refused per shape if it offers no
#                engine) and through the legacy API, and PyTorch AMP + channels_last +
#                cudnn.benchmark over the same steps (one process each:
#                tests/bench/resnet50_vs_torch.py), TINYTRAIN_CUDA_CONV_LOG=1 in their logs      155 s
#   4. profile   TINYTRAIN_PROFILE=1 over 8 steps of the NCHW run: the table's top rows          40 s
#   5. ncu       Nsight Compute over one step of each layout (TINYTRAIN_CUDA_PROFILE_STEP=2,
#                --profile-from-start off, its first 60 kernels, SpeedOfLight): the top ten      70 s
#   6. torchprof PyTorch's profiler over 3 steps of its best setting: the kernel table          40 s
#   7. fair4g    the largest batch in 4 GiB, whole process on both sides (PyTorch's allocator
#                capped at 4 GiB less its measured context: --fair)                              70 s
# Sum 480 s, with the unpacking about 490: the deadline cuts the last step's cap if needed.

lease_r50_recipe() { # lease_r50_recipe FILE WARMUP STEPS: the benchmark's recipe (synthetic_size set)
  python3 - "$1" "$2" "$3" <<'EOF'
import sys
sys.path.insert(0, "tests/bench")
import resnet50_vs_torch as b
b.resnet50_recipe(sys.argv[1], 256, int(sys.argv[2]), int(sys.argv[3]))
EOF
}

# ---- 1. memory probe ----
step "1. memory probe: the CUDA context, its stack limit, PyTorch's context"
if ! want 1; then result memprobe SKIP 0 "not in --steps $STEPS"; else
t=$(elapsed); c=$(cap 25)
run "$c" "$LOGS/1-memprobe.log" "${ENV[@]}" python3 tests/gpu/memprobe.py --json "$WORK/memprobe.json"
rc=$?
block "$LOGS/1-memprobe.log" 20
if [ $rc = 124 ] || [ $rc = 137 ]; then result memprobe TIMEOUT $(($(elapsed) - t)) "over ${c} s"
elif [ $rc = 0 ] && grep -q "^used_with_context_mib" "$LOGS/1-memprobe.log"; then
  result memprobe PASS $(($(elapsed) - t)) "$(grep -E '^(context_mib|stack_default_bytes|torch_context_mib)|gave back' "$LOGS/1-memprobe.log" | tr -s ' ' | tr '\n' ';')"
else result memprobe FAIL $(($(elapsed) - t)) "exit $rc: $(tail -n 3 "$LOGS/1-memprobe.log" | tr '\n' ' ' | cut -c1-300)"; fi
# tinytrain's own reserve with the stack limit it sets (TINYTRAIN_CUDA_STACK=1, the default) and
# with the driver's default (0): `plan` on the GPU creates the backend and measures the reserve
t=$(elapsed); c=$(cap 10)
for k in 0 1; do
  [ "$c" -ge 2 ] && TINYTRAIN_CUDA_STACK=$k run "$((c / 2))" "$LOGS/1-stack-$k.log" "${TT[@]}" plan --device cuda --json "$WORK/lenet.recipe"
done
reserve_mib() { # the reserve of the plan --json in log $1 (after run's command line; stderr may precede it)
  python3 -c 'import json, sys; t = open(sys.argv[1]).read(); print(json.JSONDecoder().raw_decode(t[t.index("{"):])[0]["reserve_bytes"] >> 20)' "$1" 2>/dev/null
}
s0=$(reserve_mib "$LOGS/1-stack-0.log")
s1=$(reserve_mib "$LOGS/1-stack-1.log")
if [ -n "$s0" ] && [ -n "$s1" ]; then
  result stacklimit PASS $(($(elapsed) - t)) "tinytrain's measured reserve: ${s0} MiB with the driver's stack limit (TINYTRAIN_CUDA_STACK=0), ${s1} MiB with its own: $((s0 - s1)) MiB given back"
else result stacklimit FAIL $(($(elapsed) - t)) "plan --json: $(tail -n 2 "$LOGS/1-stack-1.log" | tr '\n' ' ' | cut -c1-300)"; fi
fi

# ---- 2. test_cuda ----
step "2. test_cuda (every op, fp32/fp16 steps against the CPU)"
if ! want 2; then result test_cuda SKIP 0 "not in --steps $STEPS"; else step_test_cuda 70; fi

# ---- 3. ResNet-50 fp16 b256, 24 steps, both layouts, and PyTorch's best over the same steps ----
step "3. ResNet-50 fp16 batch 256, 24 timed steps: NCHW, NHWC (legacy API), PyTorch AMP best"
if ! want 3; then result r50 SKIP 0 "not in --steps $STEPS"; else
t=$(elapsed); c=$(cap 155)
if [ "$c" = 0 ]; then result r50 TIMEOUT 0 "no time left to start"; else
  TINYTRAIN_CUDA_CONV_LOG=1 run "$c" "$LOGS/3-r50.log" "${ENV[@]}" python3 tests/bench/resnet50_vs_torch.py --batch 256 \
    --steps 24 --warmup 4 --repeats 1 --configs tt-fp16,tt-fp16-nhwc-graph,tt-fp16-nhwc,torch-amp-best --skip-max-batch \
    --timeout $((c / 3)) --keep-logs "$LOGS/3-r50" --out "$WORK/r50.md"
  rc=$?
  say "command: \`TINYTRAIN_CUDA_CONV_LOG=1 python3 tests/bench/resnet50_vs_torch.py --batch 256 --steps 24 --warmup 4 --repeats 1 --configs tt-fp16,tt-fp16-nhwc-graph,tt-fp16-nhwc,torch-amp-best --skip-max-batch\` (exit $rc; one process each: a median of 3 takes three times as long)"
  if [ -f "$WORK/r50.md" ]; then cat "$WORK/r50.md" >>"$REPORT"; else block "$LOGS/3-r50.log" 15; fi
  nconv=$(cat "$LOGS"/3-r50/*tt-fp16.log 2>/dev/null | grep -c '^TINYTRAIN_CUDA_CONV_LOG')
  say "convolution lines (TINYTRAIN_CUDA_CONV_LOG, NCHW run): $nconv; logs/3-r50/ holds them"
  if [ $rc = 124 ] || [ $rc = 137 ]; then result r50 TIMEOUT $(($(elapsed) - t)) "over ${c} s"
  elif [ $rc = 0 ] && grep -q "^| tinytrain fp16 (NCHW) | [0-9]" "$WORK/r50.md" 2>/dev/null; then
    result r50 PASS $(($(elapsed) - t)) "$(grep -E '^\| (tinytrain|PyTorch)' "$WORK/r50.md" | cut -d'|' -f2,3 | tr -s ' ' | tr '\n' ';')"
  else result r50 FAIL $(($(elapsed) - t)) "exit $rc; see logs/3-r50.log"; fi
fi
fi

# ---- 4. TINYTRAIN_PROFILE over the NCHW run ----
step "4. TINYTRAIN_PROFILE=1: ResNet-50 fp16 b256 NCHW, 8 steps (event pairs, read at each step's end)"
if ! want 4; then result profile SKIP 0 "not in --steps $STEPS"; else
t=$(elapsed); c=$(cap 40)
if [ "$c" = 0 ]; then result profile TIMEOUT 0 "no time left to start"; else
  lease_r50_recipe "$WORK/r50p.recipe" 4 4
  TINYTRAIN_PROFILE=1 run "$c" "$LOGS/4-profile.log" "${TT[@]}" train --device cuda --precision fp16 --recompute none \
    --tf32 off --micro-batch 256 --max-steps 8 --out "$WORK/r50p" "$WORK/r50p.recipe"
  rc=$?
  sed -n '/^TINYTRAIN_PROFILE:/,$p' "$LOGS/4-profile.log" | head -n 32 >"$WORK/profile-top"
  block "$WORK/profile-top" 32
  if [ $rc = 124 ] || [ $rc = 137 ]; then result profile TIMEOUT $(($(elapsed) - t)) "over ${c} s"
  elif [ $rc = 0 ] && [ -s "$WORK/profile-top" ]; then result profile PASS $(($(elapsed) - t)) "$(head -n 1 "$WORK/profile-top")"
  else result profile FAIL $(($(elapsed) - t)) "exit $rc, no table: $(tail -n 2 "$LOGS/4-profile.log" | tr '\n' ' ')"; fi
fi
fi

# ---- 5. ncu over one step of each layout ----
step "5. ncu: one training step of each layout (TINYTRAIN_CUDA_PROFILE_STEP=2, --profile-from-start off)"
if ! want 5; then result ncu SKIP 0 "not in --steps $STEPS"
elif [ -z "$NCU" ]; then result ncu SKIP 0 "ncu not installed"
else
t=$(elapsed); res=PASS why=""
lease_r50_recipe "$WORK/r50n.recipe" 1 1
for lay in nchw nhwc; do
  c=$(cap 35)
  [ "$c" = 0 ] && { res=TIMEOUT; why="$why $lay: no time left;"; continue; }
  TINYTRAIN_LAYOUT=$lay TINYTRAIN_CUDA_PROFILE_STEP=2 run "$c" "$LOGS/5-ncu-$lay.csv" "${ENV[@]}" "$NCU" --csv \
    --profile-from-start off --clock-control none --launch-count 60 --section SpeedOfLight \
    "$R/$([ -n "$BUNDLE" ] && echo bin/)tinytrain" train --device cuda --precision fp16 --recompute none --tf32 off \
    --micro-batch 256 --max-steps 2 --out "$WORK/ncu_$lay" "$WORK/r50n.recipe"
  rc=$?
  python3 - "$LOGS/5-ncu-$lay.csv" >"$LOGS/5-ncu-$lay-top.md" 2>&1 <<'EOF'
import csv, sys, collections
rows = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
t = collections.defaultdict(lambda: {"n": 0, "ns": 0.0, "sm": [], "mem": []})
for r in csv.DictReader(rows):
    k = t[r.get("Kernel Name", "?")[:80]]
    name, unit, v = r.get("Metric Name", ""), r.get("Metric Unit", ""), r.get("Metric Value", "0").replace(",", "")
    try: v = float(v)
    except ValueError: continue
    if name == "Duration":
        k["n"] += 1; k["ns"] += v * {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1)
    elif name == "Compute (SM) Throughput": k["sm"].append(v)
    elif name == "Memory Throughput" and unit == "%": k["mem"].append(v)
avg = lambda xs: sum(xs) / len(xs) if xs else float("nan")
print("| kernel | launches | total us | SM % | memory % |\n|---|---|---|---|---|")
for name, k in sorted(t.items(), key=lambda kv: -kv[1]["ns"])[:10]:
    print("| %s | %d | %.1f | %.1f | %.1f |" % (name, k["n"], k["ns"] / 1e3, avg(k["sm"]), avg(k["mem"])))
print("kernels profiled: %d" % sum(k["n"] for k in t.values()))
EOF
  n=$(grep -o 'kernels profiled: [0-9]*' "$LOGS/5-ncu-$lay-top.md" | grep -o '[0-9]*$')
  say "$lay: \`TINYTRAIN_LAYOUT=$lay TINYTRAIN_CUDA_PROFILE_STEP=2 ncu --csv --profile-from-start off --clock-control none --launch-count 60 --section SpeedOfLight tinytrain train --precision fp16 --micro-batch 256 --max-steps 2\` (exit $rc)"
  cat "$LOGS/5-ncu-$lay-top.md" >>"$REPORT"
  if [ $rc = 124 ] || [ $rc = 137 ]; then res=TIMEOUT; why="$why $lay: over ${c} s;"
  elif [ $rc != 0 ] || [ "${n:-0}" = 0 ]; then [ $res = PASS ] && res=FAIL; why="$why $lay: exit $rc, ${n:-0} kernels;"
  else why="$why $lay: ${n} kernels;"; fi
  publish
done
result ncu $res $(($(elapsed) - t)) "${why# }"
fi

# ---- 6. PyTorch's profiler over its best setting ----
step "6. PyTorch's profiler: AMP + channels_last + cudnn.benchmark, batch 256, 3 steps"
if ! want 6; then result torchprof SKIP 0 "not in --steps $STEPS"
elif ! "${ENV[@]}" python3 -c 'import torch' 2>/dev/null; then result torchprof SKIP 0 "no PyTorch in this python3"; else
t=$(elapsed); c=$(cap 40)
if [ "$c" = 0 ]; then result torchprof TIMEOUT 0 "no time left to start"; else
  run "$c" "$LOGS/6-torchprof.log" "${ENV[@]}" python3 tests/bench/resnet50_vs_torch.py --configs '' --skip-max-batch \
    --torch-profile --batch 256 --steps 3 --warmup 3 --timeout $((c - 5)) --keep-logs "$LOGS/6-torchprof"
  rc=$?
  tbl=$(ls "$LOGS"/6-torchprof/*torch.log 2>/dev/null | head -n 1)
  if [ -n "$tbl" ]; then grep -v '^RESULT' "$tbl" | tail -n 36 >"$WORK/torchprof-top"; block "$WORK/torchprof-top" 36; fi
  if [ $rc = 124 ] || [ $rc = 137 ]; then result torchprof TIMEOUT $(($(elapsed) - t)) "over ${c} s"
  elif [ $rc = 0 ] && [ -n "$tbl" ] && grep -q "Self CUDA\|Self Device\|CUDA total" "$tbl"; then result torchprof PASS $(($(elapsed) - t)) "kernel table in the report"
  else result torchprof FAIL $(($(elapsed) - t)) "exit $rc: $(tail -n 3 "$LOGS/6-torchprof.log" | tr '\n' ' ' | cut -c1-200)"; fi
fi
fi

# ---- 7. the fair 4 GiB comparison ----
step "7. largest ResNet-50 batch in 4 GiB, whole process on both sides (--fair)"
if ! want 7; then result fair4g SKIP 0 "not in --steps $STEPS"; else
t=$(elapsed); c=$(cap 70)
if [ "$c" = 0 ]; then result fair4g TIMEOUT 0 "no time left to start"; else
  run "$c" "$LOGS/7-fair4g.log" "${ENV[@]}" python3 tests/bench/resnet50_vs_torch.py --only-max-batch --fair --configs '' \
    --vram 4G --timeout $((c / 2)) --keep-logs "$LOGS/7-fair4g" --out "$WORK/fair4g.md"
  rc=$?
  say "command: \`python3 tests/bench/resnet50_vs_torch.py --only-max-batch --fair --vram 4G\` (exit $rc)"
  if [ -f "$WORK/fair4g.md" ]; then sed -n '/^## largest/,$p' "$WORK/fair4g.md" >>"$REPORT"; else block "$LOGS/7-fair4g.log" 15; fi
  if [ $rc = 124 ] || [ $rc = 137 ]; then result fair4g TIMEOUT $(($(elapsed) - t)) "over ${c} s"
  elif [ $rc = 0 ] && grep -q "^| PyTorch (allocator capped" "$WORK/fair4g.md" 2>/dev/null; then
    result fair4g PASS $(($(elapsed) - t)) "numbers in the report (a benchmark: not judged)"
  else result fair4g FAIL $(($(elapsed) - t)) "exit $rc; see logs/7-fair4g.log"; fi
fi
fi
