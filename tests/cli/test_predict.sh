#!/bin/bash
# tests/cli/test_predict.sh — `tinytrain predict`: on a small folder data set of PGM images written
# here, predict's top-1 classes over the test folders agree with `eval`'s accuracy; class names
# come from the weights' metadata "classes" when present (numbers otherwise); --json parses;
# --top; a file that is not an image is an error naming it, and skipped with a warning inside
# a folder. Run from the repository root: bash tests/cli/test_predict.sh
. "$(dirname "$0")/../tt_test.sh" predict
# three classes of 8x8 grey images: a bright top half, left half or diagonal, with noise
python3 - "$TMP" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(5)
def img(k):
    px = bytearray()
    for y in range(8):
        for x in range(8):
            on = (y < 4, x < 4, abs(x - y) <= 1)[k]
            px.append(max(0, min(255, (150 if on else 100) + rng.randint(-120, 120))))
    return b"P5 8 8 255\n" + bytes(px)
for split, n in (("train", 40), ("test", 15)):
    for k, name in enumerate(("bar", "left", "diag")):
        d = os.path.join(root, split, name)
        os.makedirs(d)
        for i in range(n):
            open(os.path.join(d, "%03d.pgm" % i), "wb").write(img(k))
open(os.path.join(root, "test", "left", "notes.txt"), "w").write("not an image\n")
PY
cat >"$TMP/p.recipe" <<EOF2
[net]
input = 1x8x8
classes = 3
[train]
batch = 20
epochs = 1
optimizer = sgd
lr = 0.02
momentum = 0.9
seed = 1
[data]
format = folder
train = $TMP/train
test = $TMP/test
mean = 0.5
std = 0.25
[conv c1]
filters = 4
size = 3
activation = relu
[maxpool p1]
size = 2
[flatten]
[linear fc]
out = 3
EOF2

if ! "$TT" --device cpu --threads 1 --out "$TMP/run" "$TMP/p.recipe" >"$TMP/train.out" 2>&1; then
  fail predict_matches_eval "training failed: $(tail -3 "$TMP/train.out")"; exit 1
fi
W=$TMP/run/weights.safetensors
EVAL=$("$TT" eval --device cpu --threads 1 --weights "$W" "$TMP/p.recipe" 2>/dev/null)
ACC=$(echo "$EVAL" | sed -n 's/^accuracy \([0-9.]*\) .*/\1/p')
"$TT" predict --device cpu --threads 1 --weights "$W" --top 2 --json "$TMP/p.recipe" "$TMP/test/bar" "$TMP/test/diag" \
  "$TMP/test/left" >"$TMP/pred.json" 2>"$TMP/pred.err"
RC=$?
# the folders' classes are their sorted names: bar 0, diag 1, left 2
CHECK=$(python3 - "$TMP/pred.json" "$ACC" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
want = {"bar": 0, "diag": 1, "left": 2}
n = right = 0
for p in d:
    cls = want[p["file"].split("/")[-2]]
    assert len(p["top"]) == 2 and p["top"][0]["probability"] >= p["top"][1]["probability"], p
    n += 1
    right += p["top"][0]["class"] == cls
acc = float(sys.argv[2])
assert n == 45, "%d predictions, want 45" % n
assert abs(right / n - acc) < 1e-3, "predict: %d/%d right, eval's accuracy %s" % (right, n, acc)
assert acc > 0.5, "eval's accuracy %s: did it train?" % acc
print("ok %d/%d" % (right, n))
PY
)
if [ $RC != 0 ]; then fail predict_matches_eval "predict exited $RC: $(cat "$TMP/pred.err")"
elif [ "${CHECK%% *}" != ok ]; then fail predict_matches_eval "$CHECK"
elif ! grep -q "notes.txt.*skipped" "$TMP/pred.err"; then fail predict_matches_eval "no warning for notes.txt: $(cat "$TMP/pred.err")"
else pass predict_matches_eval; echo "# predict: $CHECK, eval: $EVAL"; fi

# class names: the weights' metadata "classes" (a JSON array; training wrote the folder names
# there), else numbers (the same weights with the key taken out)
python3 - "$W" "$TMP/unnamed.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
assert json.loads(h["__metadata__"]["classes"]) == ["bar", "diag", "left"], h["__metadata__"]
del h["__metadata__"]["classes"]
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
OUT=$("$TT" predict --device cpu --threads 1 --weights "$W" --top=1 "$TMP/p.recipe" "$TMP/test/diag/000.pgm" 2>&1)
OUT0=$("$TT" predict --device cpu --threads 1 --weights "$TMP/unnamed.safetensors" --top=1 "$TMP/p.recipe" "$TMP/test/diag/000.pgm" 2>&1)
if ! echo "$OUT" | grep -qE "^$TMP/test/diag/000.pgm: (bar|diag|left) [0-9.]+%$"; then fail predict_names "with names: $OUT"
elif ! echo "$OUT0" | grep -qE "^$TMP/test/diag/000.pgm: [0-2] [0-9.]+%$"; then fail predict_names "without names: $OUT0"
else pass predict_names; fi

"$TT" predict --device cpu --threads 1 --weights "$W" "$TMP/p.recipe" "$TMP/test/left/notes.txt" >"$TMP/o" 2>"$TMP/e"
RC=$?
if [ $RC != 1 ] || ! grep -q "notes.txt" "$TMP/e"; then fail predict_bad_image "exit $RC, want 1 naming the file: $(cat "$TMP/e")"
else pass predict_bad_image; fi

# issue 40: a folder of class folders is named as such, with a subfolder to give instead
"$TT" predict --device cpu --threads 1 --weights "$W" "$TMP/p.recipe" "$TMP/test" >"$TMP/o" 2>"$TMP/e"
RC=$?
if [ $RC != 1 ] || ! grep -q "test holds folders, not image files" "$TMP/e" || ! grep -q "give the subfolders, e.g. $TMP/test/" "$TMP/e"; then
  fail predict_class_folders "exit $RC: $(cat "$TMP/e")"
else pass predict_class_folders; fi

# issue 40: a newline in a file name does not split the text report's line (\x0a in its place)
nl="$TMP/new
line.pgm"
cp "$TMP/test/diag/000.pgm" "$nl"
OUT=$("$TT" predict --device cpu --threads 1 --weights "$W" --top=1 "$TMP/p.recipe" "$nl" 2>&1)
if [ "$(echo "$OUT" | wc -l)" != 1 ] || ! echo "$OUT" | grep -qF "$TMP/new\x0aline.pgm: "; then
  fail predict_name_escaped "the report: $OUT"
else pass predict_name_escaped; fi
exit $FAILED
