#!/bin/bash
# tests/compile/test_moffload_plan.sh — offload level 2 in the search (core/compile/policy.c
# policy_offload, docs/plan.md#planned-host-offload): a net of seventeen linear layers planned in
# fp16 for a T4 at 32 MiB over the reserve, where the plan with the optimizer state on the host
# needs about 35 MiB, keeps the fp32 masters on the host too (plan --json's offload.master_weights,
# the text's `fp32 master weights` line); at 40 MiB over the reserve, where the state alone does,
# it keeps the masters on the device; with --host-mem 0 the 32 MiB budget is refused.
. "$(dirname "$0")/../tt_test.sh" moffload_plan
need_tt moffload_plan
{ printf '[net]\ninput = 1x16x16\nclasses = 10\n[train]\nbatch = 8\noptimizer = adam\nlr = 0.01\n[flatten]\n'
  for i in $(seq 1 16); do printf '[linear fc%d]\nout = 512\n[relu]\n' "$i"; done; printf '[linear fc]\nout = 10\n'; } >"$TMP/r.recipe"
R="$TMP/r.recipe"
plan() { "$TT" plan --gpu t4 --precision fp16 "$@" "$R"; }
RES=$(plan --host-mem 0 --json 2>"$TMP/err" | python3 -c 'import json, sys; print(json.load(sys.stdin)["reserve_bytes"])')
if [ -z "$RES" ]; then
  fail moffload_plan_level2 "plan: $(head -c 400 "$TMP/err")"
  exit 1
fi
V32=$(( (RES + (32 << 20)) / 1024 ))K
V40=$(( (RES + (40 << 20)) / 1024 ))K
# masters: how many 16-bit-copied trainable weights the plan holds on the host, and their bytes
masters='import json, sys; d = json.load(open(sys.argv[1])); o = d["offload"]; print(o["master_weights"], o["master_bytes"], int(o["optimizer_state"]), d["arena_bytes"] + d["reserve_bytes"] <= int(sys.argv[2]))'
if plan --vram "$V32" --host-mem 1G --json >"$TMP/p32.json" 2>"$TMP/err" && plan --vram "$V32" --host-mem 1G >"$TMP/p32.txt" 2>>"$TMP/err"; then
  read -r n bytes st under < <(python3 -c "$masters" "$TMP/p32.json" $(( ${V32%K} * 1024 )))
  # 17 weights and 17 biases, fp32: 256 x 512 + 15 x 512 x 512 + 512 x 10 weights, 16 x 512 + 10 biases
  if [ "$n" = 34 ] && [ "$bytes" = $(( ((256 + 15 * 512) * 512 + 5120 + 8192 + 10) * 4 )) ] && [ "$st" = 1 ] && [ "$under" = True ] &&
    grep -q "^  offload     fp32 master weights in pinned host memory: 15.55 MiB in 34 buffers" "$TMP/p32.txt"; then
    pass moffload_plan_level2
  else
    fail moffload_plan_level2 "--vram $V32: masters $n ($bytes bytes), state offloaded $st, under the budget $under; $(grep offload "$TMP/p32.txt")"
  fi
else
  fail moffload_plan_level2 "--vram $V32 --host-mem 1G refused: $(head -c 400 "$TMP/err")"
fi
if plan --vram "$V40" --host-mem 1G --json >"$TMP/p40.json" 2>"$TMP/err"; then
  read -r n bytes st under < <(python3 -c "$masters" "$TMP/p40.json" $(( ${V40%K} * 1024 )))
  if [ "$n" = 0 ] && [ "$st" = 1 ]; then pass moffload_plan_state_only
  else fail moffload_plan_state_only "--vram $V40: masters $n, state offloaded $st (want the state only)"; fi
else
  fail moffload_plan_state_only "--vram $V40 --host-mem 1G refused: $(head -c 400 "$TMP/err")"
fi
if plan --vram "$V32" --host-mem 0 >/dev/null 2>&1; then fail moffload_plan_no_host "--vram $V32 --host-mem 0 planned: want a refusal"
else pass moffload_plan_no_host; fi
exit $FAILED
