#!/bin/bash
# tests/compile/test_plan_svg.sh — `tinytrain plan --svg FILE` (docs/plan.md#a-picture-of-the-plan): the file
# is well-formed SVG whose data-peak-bytes equals `plan --json`'s peak_live_bytes, for a plan
# without recompute and one with it (recompute segments shaded, the no-recompute alternative
# drawn); rendered to PNG by rsvg-convert (librsvg2-bin; SKIP without it), the picture is not one
# colour. --svg is plan's only, and not with --max-batch. Run from the repository root:
#   bash tests/compile/test_plan_svg.sh   (TT=build-x/tinytrain to pick a binary)
. "$(dirname "$0")/../tt_test.sh" plan_svg
need_tt plan_svg_binary
if ! command -v python3 >/dev/null; then skip plan_svg "python3 not found"; exit 0; fi

# the peak of a picture against plan --json, and its well-formedness
check() { # NAME SVG JSON [want-recompute]
  python3 - "$2" "$3" "$4" <<'PY'
import json, sys, xml.dom.minidom as m
svg, js, want_rc = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
root = m.parse(svg).documentElement
plan = json.load(open(js))
peak = int(root.getAttribute("data-peak-bytes"))
if peak != plan["peak_live_bytes"]:
    sys.exit("data-peak-bytes %d != peak_live_bytes %d" % (peak, plan["peak_live_bytes"]))
if int(root.getAttribute("data-budget-bytes")) != plan["budget_bytes"]:
    sys.exit("data-budget-bytes differs from budget_bytes")
rects = [r for r in root.getElementsByTagName("rect") if r.getAttribute("class") == "recompute"]
alts = [p for p in root.getElementsByTagName("polyline") if p.getAttribute("class") == "alternative"]
if want_rc and (not rects or not alts):
    sys.exit("a plan with recompute: %d shaded segments, %d alternative lines" % (len(rects), len(alts)))
if not want_rc and rects:
    sys.exit("a plan without recompute shades %d segments" % len(rects))
if not root.getElementsByTagName("polygon") or not [t for t in root.getElementsByTagName("text") if t.getAttribute("class") == "peak-buffer"]:
    sys.exit("no stacked classes or no buffers labelled at the peak")
PY
}

# one-colour check of a PNG (8-bit RGB/RGBA, any filter), with python3's zlib only
png_colours() {
  python3 - "$1" <<'PY'
import struct, sys, zlib
d = open(sys.argv[1], "rb").read()
assert d[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
i, idat, w = 8, b"", 0
while i < len(d):
    n, t = struct.unpack(">I4s", d[i:i + 8])
    c = d[i + 8:i + 8 + n]
    if t == b"IHDR": w, h, depth, ctype = struct.unpack(">IIBB", c[:10])
    if t == b"IDAT": idat += c
    i += 12 + n
bpp = {2: 3, 6: 4, 0: 1, 4: 2}[ctype]
raw, stride, prev, colours = zlib.decompress(idat), w * bpp, bytearray(w * bpp), set()
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = line
    for x in range(0, stride, bpp * 7): colours.add(bytes(line[x:x + bpp]))
print(len(colours))
PY
}

n=0
for spec in "plain:examples/fashion_mnist/lenet.recipe:--vram 4G:0" "recompute:examples/imagenet/resnet50.recipe:--vram 4G --recompute all --precision fp16:1"; do
  IFS=: read -r name recipe opts want <<<"$spec"
  n=$((n + 1))
  "$TT" plan $opts --svg "$TMP/$name.svg" "$recipe" >"$TMP/$name.txt" 2>"$TMP/err"
  rc=$?
  "$TT" plan $opts --json "$recipe" >"$TMP/$name.json" 2>>"$TMP/err"
  if [ $rc != 0 ]; then fail "plan_svg_$name" "exit $rc: $(cat "$TMP/err")"; continue; fi
  if ! grep -qF "picture of the plan: $TMP/$name.svg" "$TMP/$name.txt"; then fail "plan_svg_$name" "the report does not name the picture"; continue; fi
  why=$(check "$name" "$TMP/$name.svg" "$TMP/$name.json" "$want" 2>&1)
  if [ -n "$why" ]; then fail "plan_svg_$name" "$why"; continue; fi
  pass "plan_svg_$name"
  if ! command -v rsvg-convert >/dev/null; then skip "plan_svg_png_$name" "rsvg-convert not installed (apt-get install librsvg2-bin)"; continue; fi
  if ! rsvg-convert -o "$TMP/$name.png" "$TMP/$name.svg" 2>"$TMP/err"; then fail "plan_svg_png_$name" "rsvg-convert: $(cat "$TMP/err")"; continue; fi
  k=$(png_colours "$TMP/$name.png" 2>&1)
  if ! [ "$k" -gt 8 ] 2>/dev/null; then fail "plan_svg_png_$name" "the PNG has $k colours"; else pass "plan_svg_png_$name"; fi
done

# an offloaded plan (docs/plan.md#planned-host-offload): the host lane beside the arena holds the
# pinned bytes --json calls offload_bytes, and the legend says so; the plain plan above has no lane
"$TT" plan --gpu gtx1650 --vram 4G examples/imagenet/vit_l16.recipe --svg "$TMP/off.svg" >/dev/null 2>"$TMP/err" &&
  "$TT" plan --gpu gtx1650 --vram 4G examples/imagenet/vit_l16.recipe --json >"$TMP/off.json" 2>>"$TMP/err"
rc=$?
why=$([ $rc = 0 ] || echo "exit $rc: $(cat "$TMP/err")")
[ -n "$why" ] || why=$(python3 - "$TMP/off.svg" "$TMP/off.json" "$TMP/plain.svg" 2>&1 <<'PY'
import json, sys, xml.dom.minidom as m
root, plan = m.parse(sys.argv[1]).documentElement, json.load(open(sys.argv[2]))
off = plan["offload_bytes"]
if not off: sys.exit("the ViT-L/16 plan at --vram 4G offloads nothing: no lane to check")
lanes = [g for g in root.getElementsByTagName("g") if g.getAttribute("class") == "host-lane"]
if len(lanes) != 1: sys.exit("%d host lanes, want 1" % len(lanes))
if int(lanes[0].getAttribute("data-host-bytes")) != off or int(root.getAttribute("data-host-bytes")) != off:
    sys.exit("host lane %s bytes, root %s, --json offload_bytes %d" % (lanes[0].getAttribute("data-host-bytes"), root.getAttribute("data-host-bytes"), off))
bars = [r for r in lanes[0].getElementsByTagName("rect") if r.getAttribute("class") == "host-bytes"]
if sum(int(r.getAttribute("data-bytes")) for r in bars) != off: sys.exit("the lane's bars do not add up to offload_bytes")
if int(lanes[0].getAttribute("data-host-budget-bytes")) < off: sys.exit("host budget under the offloaded bytes")
legend = [t for t in root.getElementsByTagName("text") if t.getAttribute("class") == "host-legend"]
if not legend or "pinned host" not in legend[0].firstChild.data: sys.exit("the legend does not name the host lane")
plain = m.parse(sys.argv[3]).documentElement
if plain.getAttribute("data-host-bytes") or plain.getAttribute("width") != "1100" or [g for g in plain.getElementsByTagName("g") if g.getAttribute("class") == "host-lane"]:
    sys.exit("a plan without offload draws a host lane or another width")
PY
)
if [ -n "$why" ]; then fail plan_svg_host_lane "$why"; else pass plan_svg_host_lane; fi

# --json keeps stdout one JSON object; --svg belongs to plan, and not with --max-batch
"$TT" plan --vram 4G --json --svg "$TMP/j.svg" examples/fashion_mnist/lenet.recipe >"$TMP/j.json" 2>"$TMP/err"
if ! python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$TMP/j.json" 2>/dev/null || [ ! -s "$TMP/j.svg" ]; then
  fail plan_svg_json "plan --json --svg: stdout is not one JSON object, or no SVG"
else pass plan_svg_json
fi
"$TT" --svg "$TMP/x.svg" examples/fashion_mnist/lenet.recipe >/dev/null 2>"$TMP/err"; rc1=$?
"$TT" plan --max-batch --vram 4G --svg "$TMP/x.svg" examples/fashion_mnist/lenet.recipe >/dev/null 2>>"$TMP/err"; rc2=$?
if [ $rc1 != 2 ] || [ $rc2 != 2 ] || [ -e "$TMP/x.svg" ]; then fail plan_svg_usage "train --svg: $rc1, plan --max-batch --svg: $rc2 (want 2 and 2): $(cat "$TMP/err")"
else pass plan_svg_usage
fi
exit $FAILED
