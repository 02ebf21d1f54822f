#!/bin/bash
# tests/data/test_data_cli.sh — image data through the command line: a folder data set streamed into a
# short run, the class names in both checkpoint files' metadata, a test folder with a class the
# training set lacks (error naming it), a resume against renamed classes (error), a list label
# >= [net] classes (error naming file:line), a corrupt image skipped by name, the loader's
# host memory in `plan`, and `tinytrain pack` (a recipe's folders, then a run on format = npy, and
# that run's images file truncated under it: an error naming it). The images are copies of the committed tests/fixtures/images/ files.
# Run from the repository root: bash tests/data/test_data_cli.sh
. "$(dirname "$0")/../tt_test.sh" data_cli
run() {
  "$TT" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
  ERR=$(cat "$TMP/err")
}
# meta FILE KEY: a safetensors file's metadata value
meta() {
  python3 -c 'import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
print(json.loads(b[8:8 + n])["__metadata__"].get(sys.argv[2], ""))' "$1" "$2"
}

FX=tests/fixtures/images
for split in train val; do
  for c in apple banana cherry; do
    mkdir -p "$TMP/data/$split/$c"
    for i in 0 1 2 3 4 5; do cp $FX/good.jpg "$TMP/data/$split/$c/$i.jpg"; cp $FX/good.png "$TMP/data/$split/$c/p$i.png"; done
  done
done
cp $FX/truncated.jpg "$TMP/data/train/banana/cut.jpg"
cat >"$TMP/r.recipe" <<'R'
[net]
input = 3x12x12
classes = 3
[train]
batch = 4
epochs = 1
lr = 0.01
[data]
format = folder
train = data/train
test = data/val
hflip = true
max_failed = 0.05
[conv c1]
filters = 4
size = 3
activation = relu
[flatten]
[linear out]
out = 3
R

run --out "$TMP/run" --max-steps 100 "$TMP/r.recipe"
w=$(meta "$TMP/run/weights.safetensors" classes 2>/dev/null)
s=$(meta "$TMP/run/state.safetensors" classes 2>/dev/null)
if [ $RC != 0 ]; then fail data_cli_folder_run "exit $RC: $ERR"
elif [ "$w" != '["apple", "banana", "cherry"]' ] || [ "$s" != "$w" ]; then fail data_cli_folder_run "classes metadata: '$w' / '$s'"
elif ! grep -q "banana/cut.jpg: skipped (truncated JPEG" "$TMP/err"; then fail data_cli_folder_run "no warning for the cut JPEG: $ERR"
elif ! grep -q "data: 1 training and 0 test images failed to decode while streaming" "$TMP/out"; then
  fail data_cli_folder_run "the summary does not count the cut JPEG: $(tail -5 "$TMP/out")"
else pass data_cli_folder_run; fi

mkdir -p "$TMP/data/val/durian" && cp $FX/good.jpg "$TMP/data/val/durian/"
run --out "$TMP/run2" --max-steps 2 "$TMP/r.recipe"
if [ $RC = 1 ] && grep -q "data/val/durian: a test class the training set .*data/train does not have" "$TMP/err"; then
  pass data_cli_extra_test_class
else fail data_cli_extra_test_class "exit $RC: $ERR"; fi
run eval --weights "$TMP/run/weights.safetensors" "$TMP/r.recipe"
if [ $RC = 1 ] && grep -q "durian: a test class the training set of .*weights.safetensors does not have" "$TMP/err"; then
  pass data_cli_eval_by_name
else fail data_cli_eval_by_name "exit $RC: $ERR"; fi
rm -r "$TMP/data/val/durian"

# resumed on a training set whose classes differ
mv "$TMP/data/train/banana" "$TMP/data/train/blueberry"
mv "$TMP/data/val/banana" "$TMP/data/val/blueberry"
run --out "$TMP/run3" --resume "$TMP/run" "$TMP/r.recipe"
if [ $RC = 1 ] && grep -q "class 1 is 'banana' there but 'blueberry' in this run's training set" "$TMP/err"; then
  pass data_cli_resume_classes
else fail data_cli_resume_classes "exit $RC: $ERR"; fi
mv "$TMP/data/train/blueberry" "$TMP/data/train/banana"
mv "$TMP/data/val/blueberry" "$TMP/data/val/banana"

# a list file with a label past [net] classes
printf 'data/train/apple/0.jpg 0\ndata/train/apple/1.jpg 3\n' >"$TMP/train.list"
sed -e 's/^format = folder/format = list/' -e 's#^train = data/train#train = train.list#' -e '/^test = /d' \
  "$TMP/r.recipe" >"$TMP/l.recipe"
run --out "$TMP/run4" --max-steps 1 "$TMP/l.recipe"
if [ $RC = 1 ] && grep -q "train.list:2: label 3 is not below \[net\] classes = 3" "$TMP/err"; then
  pass data_cli_list_label
else fail data_cli_list_label "exit $RC: $ERR"; fi

# almost every image fails: the run stops, naming the first few, not every one (max_failed)
mkdir -p "$TMP/bad/x" "$TMP/bad/y"
for i in $(seq 1 40); do cp $FX/truncated.jpg "$TMP/bad/x/$i.jpg"; done
cp $FX/good.jpg "$TMP/bad/y/0.jpg"
sed -e 's#^train = data/train#train = bad#' -e '/^test = /d' -e 's/^max_failed = .*/max_failed = 0.5/' -e 's/^classes = 3/classes = 2/' \
  -e 's/^out = 3/out = 2/' "$TMP/r.recipe" >"$TMP/b.recipe"
run --out "$TMP/run6" --max-steps 100 "$TMP/b.recipe"
nskip=$(grep -c ": skipped (" "$TMP/err")
if [ $RC = 1 ] && [ "$nskip" = 5 ] && grep -q "bad: more images fail to decode; counted, not listed" "$TMP/err" &&
   grep -q "bad: 21 of its 41 images failed to decode, over max_failed = 0.5 of the set" "$TMP/err"; then
  pass data_cli_max_failed
else fail data_cli_max_failed "exit $RC, $nskip skip lines: $(tail -3 "$TMP/err")"; fi

# pack has the same rule: the recipe's max_failed (21 of 41 over 0.5), the default 0.01 for pack SOURCE PREFIX;
# the first 5 failures named, then counted, and nothing written
run pack "$TMP/b.recipe"
nskip=$(grep -c ": skipped (" "$TMP/err")
run pack "$TMP/bad" "$TMP/bp"
if [ $RC = 1 ] && [ "$nskip" = 5 ] && grep -q "bad: 1 of its 41 images failed to decode, over max_failed = 0.01" "$TMP/err" &&
   ! ls "$TMP" | grep -q "images.npy\|\.pack-"; then
  pass data_cli_pack_max_failed
else fail data_cli_pack_max_failed "exit $RC, $nskip skip lines: $(tail -3 "$TMP/err") $(ls "$TMP")"; fi
"$TT" pack "$TMP/b.recipe" 2>&1 | grep -q "bad: 21 of its 41 images failed to decode, over max_failed = 0.5 of the set" ||
  fail data_cli_pack_max_failed "pack RECIPE: no error for 21 of 41 over 0.5"

run plan "$TMP/r.recipe"
out=$(cat "$TMP/out")
run plan --json "$TMP/r.recipe"
if echo "$out" | grep -q "loader      host .* MiB: 2 threads, a ring of 4 batches of 4 images of 432 bytes" &&
   echo "$out" | grep -q "at worst 2 threads x 1419.8 MiB" &&
   grep -q '"loader": {"host_bytes": [0-9]*, "threads": 2, "streaming": true}' "$TMP/out" &&
   python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
w, p = j["loader_worst_decode_bytes"], j["loader_worst_decode_bytes_per_thread"]
assert w == 2 * p and abs(p / 1048576 - 1419.8) < 0.06, (w, p)' "$TMP/out"; then
  pass data_cli_plan_loader
else fail data_cli_plan_loader "$out"; fi
# pack the recipe's folders, then train from the .npy files (numpy's format)
run pack "$TMP/r.recipe"
# the [data] section pack prints is whole (issue 40): the recipe's other settings come with it
if [ $RC = 0 ] && grep -qx "format = npy" "$TMP/out" && grep -qx "hflip = true" "$TMP/out" &&
   grep -qx "max_failed = 0.05" "$TMP/out" && ! grep -qx "format = folder" "$TMP/out"; then pass data_cli_pack_whole_section
else fail data_cli_pack_whole_section "exit $RC: $(tail -8 "$TMP/out")"; fi
if [ $RC != 0 ] || [ ! -f "$TMP/data/train-images.npy" ] || [ ! -f "$TMP/data/val-labels.npy" ] || [ ! -f "$TMP/data/val-set.json" ] ||
   [ "$(cat "$TMP/data/train-classes.json")" != '["apple", "banana", "cherry"]' ] || ls -A "$TMP/data/" | grep -q "\.tmp\|\.pack-"; then
  fail data_cli_pack "exit $RC: $ERR $(ls "$TMP/data")"
else
  sed -e 's/^format = folder/format = npy/' -e 's#^train = data/train#train = data/train-images.npy\ntrain_labels = data/train-labels.npy#' \
    -e 's#^test = data/val#test = data/val-images.npy\ntest_labels = data/val-labels.npy#' "$TMP/r.recipe" >"$TMP/n.recipe"
  run --out "$TMP/run5" --max-steps 3 "$TMP/n.recipe"
  w=$(meta "$TMP/run5/weights.safetensors" classes 2>/dev/null)
  if [ $RC = 0 ] && [ "$w" = '["apple", "banana", "cherry"]' ]; then pass data_cli_pack; else fail data_cli_pack "npy run: exit $RC, classes '$w': $ERR"; fi
  # the images file truncated while a run reads it: an error naming the file, not SIGBUS
  for f in images.npy labels.npy classes.json set.json; do cp "$TMP/data/train-$f" "$TMP/data/s-$f"; done
  sed -e 's/^epochs = 1/epochs = 100000/' -e 's#data/train-#data/s-#' "$TMP/n.recipe" >"$TMP/s.recipe"
  "$TT" --out "$TMP/run8" "$TMP/s.recipe" >"$TMP/out8" 2>"$TMP/err8" &
  pid=$!
  for i in $(seq 1 300); do [ -s "$TMP/run8/metrics.jsonl" ] && break; sleep 0.1; done
  truncate -s 1000 "$TMP/data/s-images.npy"
  wait $pid
  RC=$?
  if [ $RC = 1 ] && grep -q "s-images.npy: the file shrank to 1000 bytes while this run read it" "$TMP/err8"; then
    pass data_cli_npy_shrinks
  else fail data_cli_npy_shrinks "exit $RC (135 is SIGBUS): $(tail -2 "$TMP/err8")"; fi
fi
run pack --size 5x7 --channels 1 "$TMP/data/val" "$TMP/small"
hdr=$(head -c 128 "$TMP/small-images.npy" | tr -d '\000-\011\013-\037\200-\377')
if [ $RC = 0 ] && echo "$hdr" | grep -q "'shape': (36, 5, 7, 1)" &&
   [ "$(stat -c %s "$TMP/small-images.npy")" = $((128 + 36 * 35)) ]; then pass data_cli_pack_size
else fail data_cli_pack_size "exit $RC: $ERR / $hdr"; fi
run pack --size 0 a b
if [ $RC = 2 ]; then pass data_cli_pack_usage; else fail data_cli_pack_usage "exit $RC"; fi
# a PREFIX that is a directory packs into it as DIR/<SOURCE's base name>; a device is refused;
# an interrupted pack's leftovers are removed by the next one; nothing temporary stays
mkdir -p "$TMP/pk/.val.pack-AbC123" && touch "$TMP/pk/.val.pack-AbC123/val-images.npy" "$TMP/pk/val-labels.npy.tmp"
run pack --size 4 "$TMP/data/val/" "$TMP/pk"
if [ $RC = 0 ] && [ -f "$TMP/pk/val-images.npy" ] && [ -f "$TMP/pk/val-labels.npy" ] &&
   [ -z "$(ls -A "$TMP/pk" | grep -v '^val-\(images\|labels\|classes\|set\)\.\(npy\|json\)$')" ] &&
   grep -q "pk/.val.pack-AbC123: removed, left behind by an interrupted pack" "$TMP/err"; then pass data_cli_pack_into_dir
else fail data_cli_pack_into_dir "exit $RC: $ERR / $(ls -A "$TMP/pk")"; fi
before=$(ls /dev | wc -l)
run pack --size 4 "$TMP/data/val" /dev/null
if [ $RC = 1 ] && echo "$ERR" | grep -q "/dev/null: is a character device" && [ ! -e /dev/null-images.npy ] &&
   [ "$(ls /dev | wc -l)" = "$before" ]; then pass data_cli_pack_device_prefix
else fail data_cli_pack_device_prefix "exit $RC: $ERR"; rm -f /dev/null-images.npy /dev/null-labels.npy /dev/null-classes.json /dev/null-set.json; fi
# issue 40: a class folder named in Latin-1 is refused by name (its name would make the weights'
# JSON metadata invalid); an empty class folder is warned about; any file name makes valid JSON
mkdir -p "$TMP/enc/$(printf 'caf\351')" "$TMP/enc/ok" "$TMP/enc/nothing"
cp "$TMP/data/val/"*/* "$TMP/enc/ok/" 2>/dev/null
sed "s#^train = data/train#train = $TMP/enc#; /^test = /d" "$TMP/r.recipe" >"$TMP/enc.recipe"
run pack "$TMP/enc.recipe"
if [ $RC = 1 ] && grep -q "class folder 'caf.xe9' is not named in UTF-8" "$TMP/err"; then pass data_cli_class_not_utf8
else fail data_cli_class_not_utf8 "exit $RC: $ERR"; fi
rmdir "$TMP/enc/$(printf 'caf\351')"
run pack "$TMP/enc.recipe"
if grep -q "enc/nothing: warning: the class folder is empty" "$TMP/err"; then pass data_cli_empty_class_warned
else fail data_cli_empty_class_warned "exit $RC: $ERR"; fi
f="$TMP/$(printf 'l\351gume').recipe"
cp "$TMP/r.recipe" "$f"
ok=1
for target in "$f" "$f.missing"; do # a plan, and a refusal naming the file
  "$TT" plan --json "$target" >"$TMP/j" 2>/dev/null
  python3 -c 'import json, sys; json.load(open(sys.argv[1], encoding="utf-8"))' "$TMP/j" 2>/dev/null ||
    { fail data_cli_json_any_name "plan --json of a Latin-1 name is no JSON: $(head -c 200 "$TMP/j" | od -c | head -3)"; ok=0; }
done
[ $ok = 1 ] && pass data_cli_json_any_name
exit $FAILED
