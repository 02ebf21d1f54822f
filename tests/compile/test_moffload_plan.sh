#!/bin/bash
# tests/compile/test_moffload_plan.sh — offload level 2 in the search (core/compile/policy.c
# policy_offload, docs/plan.md#planned-host-offload): a net of seventeen linear layers planned in
# fp16 for a T4 at 32 MiB over the reserve, where the plan with the optimizer state on the host
# needs about 35 MiB, keeps the fp32 masters on the host too (plan --json's offload.master_weights,
# the text's `fp32 master weights` line); at 40 MiB over the reserve, where the state alone does,
# it keeps the masters on the device; with --host-mem 0 the 32 MiB budget is refused. plan --svg
# (docs/plan.md#a-picture-of-the-plan) draws the 32 MiB plan's masters as their own labelled part
# of the pinned host lane and names the device's 16-bit copies as theirs; the 40 MiB plan's lane
# (the state only) has neither.
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
if plan --vram "$V32" --host-mem 1G --json --svg "$TMP/p32.svg" >"$TMP/p32.json" 2>"$TMP/err" && plan --vram "$V32" --host-mem 1G >"$TMP/p32.txt" 2>>"$TMP/err"; then
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
if plan --vram "$V40" --host-mem 1G --json --svg "$TMP/p40.svg" >"$TMP/p40.json" 2>"$TMP/err"; then
  read -r n bytes st under < <(python3 -c "$masters" "$TMP/p40.json" $(( ${V40%K} * 1024 )))
  if [ "$n" = 0 ] && [ "$st" = 1 ]; then pass moffload_plan_state_only
  else fail moffload_plan_state_only "--vram $V40: masters $n, state offloaded $st (want the state only)"; fi
else
  fail moffload_plan_state_only "--vram $V40 --host-mem 1G refused: $(head -c 400 "$TMP/err")"
fi
# the pictures: SVG JSON WANT-MASTERS (1: the 32 MiB plan, 0: the 40 MiB one)
svg_masters='
import json, sys, xml.dom.minidom as m
root, plan, want = m.parse(sys.argv[1]).documentElement, json.load(open(sys.argv[2])), sys.argv[3] == "1"
o = plan["offload"]
lanes = [g for g in root.getElementsByTagName("g") if g.getAttribute("class") == "host-lane"]
if len(lanes) != 1 or int(lanes[0].getAttribute("data-host-bytes")) != plan["offload_bytes"]:
    sys.exit("want one host lane of offload_bytes %d" % plan["offload_bytes"])
text = lambda t: "".join(c.data if c.nodeType == c.TEXT_NODE else text(c) for c in t.childNodes)
labels = [t for t in root.getElementsByTagName("text") if t.getAttribute("class") == "host-masters"]
legend = [text(t) for t in root.getElementsByTagName("text")]
copies = [p for p in root.getElementsByTagName("polygon") if p.getAttribute("data-class") == "3"]  # PC_COPIES
if not want:
    if labels or lanes[0].getAttribute("data-master-bytes") or "16-bit copies of host masters" in legend or "16-bit weight copies" not in legend:
        sys.exit("a plan without host masters labels some, or does not name its copies plainly")
    sys.exit(0)
mb = o["master_bytes"]
if int(lanes[0].getAttribute("data-master-bytes") or -1) != mb: sys.exit("lane data-master-bytes %r, --json master_bytes %d" % (lanes[0].getAttribute("data-master-bytes"), mb))
if len(labels) != 1 or "%.1f MiB" % (mb / 1048576) not in text(labels[0]) or "masters" not in text(labels[0]):
    sys.exit("the masters part is not labelled with its %.1f MiB: %r" % (mb / 1048576, [text(t) for t in labels]))
part = [r for r in lanes[0].getElementsByTagName("rect") if r.getAttribute("class") == "host-bytes" and r.getAttribute("data-class") == labels[0].getAttribute("data-class")]
if len(part) != 1 or not mb <= int(part[0].getAttribute("data-bytes")) < mb + 34 * 4096:
    sys.exit("no part of the lane holds the %d master bytes (aligned)" % mb)
if not copies or "16-bit copies of host masters" not in legend or "fp32 master weights (pinned host)" not in legend:
    sys.exit("the device side draws no 16-bit copies, or the legend does not name them and the masters")
if not any("102 buffers" in t for t in legend): sys.exit("the lane key does not count 68 state buffers and 34 masters")
'
why=$(python3 -c "$svg_masters" "$TMP/p32.svg" "$TMP/p32.json" 1 2>&1) && why=$(python3 -c "$svg_masters" "$TMP/p40.svg" "$TMP/p40.json" 0 2>&1)
if [ -n "$why" ]; then fail moffload_plan_svg "$why"; else pass moffload_plan_svg; fi
if plan --vram "$V32" --host-mem 0 >/dev/null 2>&1; then fail moffload_plan_no_host "--vram $V32 --host-mem 0 planned: want a refusal"
else pass moffload_plan_no_host; fi
exit $FAILED
