#!/usr/bin/env bash
# tests/fuzz/make_corpus.sh — rewrites the committed seed corpora of the fuzz targets,
# tests/fuzz/corpus/<target>/, from the repository: real recipes (examples/, tests/fixtures/,
# the malformed ones of tests/recipes_bad/), real checkpoints that ./tinytrain writes for
# tests/fuzz/tiny.recipe (the fuzz_checkpoint model), and a few damaged copies of them.
# Needs a built ./tinytrain and python3. Run from anywhere; commit what changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=tests/fuzz/corpus
TMP=$(mktemp -d /tmp/tt_fuzz_corpus_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
[ -x ./tinytrain ] || { echo "make_corpus.sh: build ./tinytrain first (ninja)" >&2; exit 1; }
# corpus/image/ is kept: tests/fixtures/images/, a few small images and the fuzzer's findings
rm -rf "$C/recipe" "$C/safetensors" "$C/checkpoint"
mkdir -p "$C/recipe" "$C/safetensors" "$C/checkpoint"

# images: a seed for every format variant the decoders claim (tests/fuzz/make_image_seeds.c)
${CC:-cc} -O1 -I. tests/fuzz/make_image_seeds.c -lz -lturbojpeg -o "$TMP/make_image_seeds"
"$TMP/make_image_seeds" "$C/image"

# recipes: every example and fixture, the malformed set, the fuzz model
for f in examples/*/*.recipe tests/fixtures/*.recipe tests/recipes_bad/*.recipe tests/fuzz/tiny.recipe; do
  name=$(echo "$f" | tr '/' '_')
  cp "$f" "$C/recipe/$name"
done

# checkpoints written by the tool: after one step, and after three (resumed), for the fuzz model
./tinytrain --out "$TMP/run" --max-steps 1 tests/fuzz/tiny.recipe >/dev/null
cp "$TMP/run/weights.safetensors" "$C/checkpoint/weights_step1.safetensors"
cp "$TMP/run/state.safetensors" "$C/checkpoint/state_step1.safetensors"
./tinytrain --resume "$TMP/run" --max-steps 3 tests/fuzz/tiny.recipe >/dev/null
cp "$TMP/run/state.safetensors" "$C/checkpoint/state_step3.safetensors"

# damaged copies, and the same files for the plain safetensors reader
python3 - "$C" <<'PY'
import json, os, struct, sys
c = sys.argv[1]
state = open(os.path.join(c, "checkpoint/state_step1.safetensors"), "rb").read()
weights = open(os.path.join(c, "checkpoint/weights_step1.safetensors"), "rb").read()
n = struct.unpack("<Q", state[:8])[0]
header = json.loads(state[8:8 + n])
data = state[8 + n:]

def pack(h, d):
    text = json.dumps(h, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + d

def put(target, name, blob):
    with open(os.path.join(c, target, name), "wb") as f:
        f.write(blob)

bad = {}
bad["truncated_data.safetensors"] = state[:-5]
bad["truncated_header.safetensors"] = state[:8 + n // 2]
bad["header_length_huge.safetensors"] = struct.pack("<Q", 1 << 40) + state[8:]
h = json.loads(json.dumps(header)); h["__metadata__"]["step"] = "three"
bad["step_not_integer.safetensors"] = pack(h, data)
h = json.loads(json.dumps(header)); del h["__metadata__"]["seed"]
bad["no_seed.safetensors"] = pack(h, data)
h = json.loads(json.dumps(header)); h["__metadata__"].update({"k%d" % i: str(i) for i in range(40)})
bad["many_metadata_keys.safetensors"] = pack(h, data)
h = json.loads(json.dumps(header)); k = [x for x in h if x != "__metadata__"][0]; h[k]["shape"] = [1, 2, 3]
bad["shape_mismatch.safetensors"] = pack(h, data)
h = json.loads(json.dumps(header)); k = [x for x in h if x != "__metadata__"][0]; h[k]["dtype"] = "F16"
bad["dtype_mismatch.safetensors"] = pack(h, data)
h = {k: v for k, v in header.items() if not k.endswith(".opt_v")}
bad["missing_tensors.safetensors"] = pack(h, data)
for name, blob in bad.items():
    put("checkpoint", name, blob)
# the reader alone: the real files, the damaged ones, and JSON corner cases
put("safetensors", "weights_step1.safetensors", weights)
put("safetensors", "state_step1.safetensors", state)
for name, blob in bad.items():
    put("safetensors", name, blob)
def raw(text, d=b""):
    text = text.encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + d
put("safetensors", "empty_object.safetensors", raw("{}"))
put("safetensors", "escapes.safetensors",
    raw('{"__metadata__":{"u":"\\u00e9\\ud83d\\ude00\\/\\n"},"a\\tb":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}}',
        b"\x01\x02\x03\x04"))
put("safetensors", "overlap.safetensors",
    raw('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}',
        bytes(6)))
put("safetensors", "deep_nesting.safetensors", raw('{"a":' + "[" * 70 + "]" * 70 + "}"))
# CI's fuzz found a dim whose magnitude passes int64 negated past INT64_MIN (undefined behaviour)
put("safetensors", "number_past_int64.safetensors",
    raw('{"a":{"dtype":"U8","shape":[-9223372036854775808,-21111111111111111111000000000001465587645,4],'
        '"data_offsets":[0,4]}}', bytes(4)))
put("safetensors", "scalar_and_empty.safetensors",
    raw('{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]}}',
        bytes(8)))

# npy_set (tests/fuzz/fuzz_npy_set.c): [images length, labels length: u16 LE][classes | 8 if JSON]
# images .npy, labels .npy, classes JSON
os.makedirs(os.path.join(c, "npy_set"), exist_ok=True)
def npy(descr, shape, body):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    d = d.encode() + b" " * (117 - len(d)) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d + body
def setseed(name, images, labels, flags, js=b""):
    put("npy_set", name, struct.pack("<HHB", len(images), len(labels), flags) + images + labels + js)
im = npy("|u1", "(3, 2, 2, 1)", bytes(range(12)))
setseed("good_names.bin", im, npy("<i4", "(3,)", struct.pack("<3i", 0, 1, 2)), 8 | 3, b'["a", "b", "c"]')
setseed("few_names.bin", im, npy("<i4", "(3,)", struct.pack("<3i", 0, 1, 2)), 8, b'["a", "b"]')
setseed("dup_names.bin", im, npy("<i8", "(3,)", struct.pack("<3q", 0, 1, 1)), 8 | 3, b'["a", "b", "a"]')
setseed("no_names.bin", im, npy("|u1", "(3,)", bytes([0, 1, 1])), 2)
setseed("short_images.bin", im[:-3], npy("<i4", "(3,)", struct.pack("<3i", 0, 1, 2)), 3)
setseed("rgb_u2_labels.bin", npy("|u1", "(2, 2, 2, 3)", bytes(24)), npy("<u2", "(2,)", struct.pack("<2H", 0, 4)), 8 | 5,
        b'["x", "y", "z", "w", "v"]')
PY
echo "make_corpus.sh: $(ls "$C/recipe" | wc -l) recipes, $(ls "$C/safetensors" | wc -l) safetensors, $(ls "$C/checkpoint" | wc -l) checkpoints in $C ($(du -sk "$C" | cut -f1) KiB)"
