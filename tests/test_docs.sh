#!/bin/bash
# tests/test_docs.sh — the documentation is true to the command line and its links resolve.
#
# Commands: every line of a fenced code block (```) in README.md and docs/*.md that invokes
# tinytrain — `./tinytrain ...`, `tinytrain ...`, `build/.../tinytrain ...`, after `&&` or `;`,
# after VAR=value assignments, or under `mpirun -np N` (also mpiexec, time, env, sudo) — is
# checked three ways, with ${TT:-./tinytrain}:
#   1. its arguments followed by --help exit 0 and print the usage of the command the line means.
#      core/main.c parses every option with getopt_long before it looks at the operands, and
#      answers --help when getopt_long reaches it, so an unknown option (--vramm), a bad value
#      (--vram 4X, --epochs N) or an option of another command (--ranks outside plan) exits 2
#      first. getopt_long accepts unambiguous abbreviations (--vra), so those pass.
#   2. its operands (what no option consumes) are as many as the command takes: one RECIPE for
#      train, plan and eval; RECIPE and images for predict; RECIPE, or SOURCE PREFIX, for pack.
#      --help stops before operands are read, so this catches a mistyped command (`evl` is taken
#      for a recipe) and a value given to an option that takes none.
#   3. the same arguments, without --help, with the recipe (or pack's SOURCE) replaced by a file
#      that does not exist, run in an empty directory: they must not exit 2 (bad usage), which
#      main() decides before it opens the recipe (--max-batch without --vram, eval without
#      --weights, --json outside plan and predict, ...); it then fails to open the recipe (1).
#   A `.recipe` path on the line must exist (but in docs/walkthrough.md and docs/finetune.md, which write
#   their recipes and whose commands tests/cli/test_walkthrough.sh and test_finetune.sh run). Placeholders such as RECIPE, DIR or FILE are fine
#   as operands or as values of options that take any string; SIZE or N as the value of --vram
#   or --epochs are not (main.c checks values while parsing). Usage synopses are skipped: a line
#   with `[`-bracketed optional syntax or `|` alternatives (`tinytrain [train] [--vram SIZE] ...`)
#   is not a command. Indented (unfenced) code lines that invoke tinytrain are a failure: fence
#   them so that they are checked.
# Links: every relative link `[text](target)` outside code blocks resolves to an existing file or
# directory inside the repository; `target#anchor` and `#anchor` must name a heading of the
# target (GitHub's anchors: lower case, punctuation dropped, spaces to hyphens).
# A self-check first makes sure a mistyped command and a link out of the repository are caught.
# Run from the repository root: bash tests/test_docs.sh   (TT=build-x/tinytrain to pick a binary)
# Prints PASS/FAIL/SKIP lines; exits 1 if anything failed.
. "$(dirname "$0")/tt_test.sh" docs
ROOT=$(pwd -P)

DOCS=(README.md docs/*.md)

# Options of core/main.c that take no value (no_argument in main_options); every other long
# option takes one, as the next word or after '='.
NOARG=" --help -h --version --json --max-batch --calls "

# words_of TEXT: splits TEXT into the array W (shell words, quotes around a word removed).
words_of() {
  local w
  W=()
  read -ra raw <<<"$1"
  for w in "${raw[@]}"; do
    w=${w#\"}; w=${w%\"}; w=${w#\'}; w=${w%\'}
    W+=("$w")
  done
}

# tt_args SEGMENT: when SEGMENT (one command, no && or ;) invokes tinytrain, sets A to its
# arguments and returns 0; returns 1 otherwise.
tt_args() {
  words_of "$1"
  local i=0 n=${#W[@]}
  while [ $i -lt $n ] && [[ ${W[$i]} =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do i=$((i + 1)); done
  [ $i -lt $n ] || return 1
  case "${W[$i]##*/}" in
    mpirun | mpiexec | time | env | sudo | nohup)
      while [ $i -lt $n ] && [ "${W[$i]##*/}" != tinytrain ]; do i=$((i + 1)); done
      [ $i -lt $n ] || return 1 ;;
    tinytrain) ;;
    *) return 1 ;;
  esac
  A=("${W[@]:$((i + 1))}")
  return 0
}

# check_cmd SEGMENT: checks one tinytrain command (the arguments in A, from tt_args). Returns 0,
# or 1 with the reason in WHY.
check_cmd() {
  local cmd=train explicit=0 help=0 k a
  [ ${#A[@]} -gt 0 ] && case "${A[0]}" in train | plan | eval | predict | pack) cmd=${A[0]}; explicit=1 ;; esac
  # 1. --help
  "$TT" "${A[@]}" --help >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc != 0 ]; then
    WHY="'tinytrain ${A[*]} --help' exited $rc: $(head -n 1 "$TMP/err")"
    return 1
  fi
  local want="usage: tinytrain $cmd"
  [ $cmd = train ] && want="usage: tinytrain [train]"
  local ops=() pos=()
  for ((k = explicit; k < ${#A[@]}; k++)); do
    a=${A[$k]}
    if [ "$a" = -- ]; then
      for ((k = k + 1; k < ${#A[@]}; k++)); do ops+=("${A[$k]}"); pos+=($k); done
      break
    fi
    case "$a" in
      --help | -h | --version) help=1 ;;
      --*=*) ;;
      -?*) [[ $NOARG == *" $a "* ]] || k=$((k + 1)) ;;
      *) ops+=("$a"); pos+=($k) ;;
    esac
  done
  if [ $help = 0 ] && ! grep -qF -- "$want" "$TMP/out"; then
    WHY="'tinytrain ${A[*]} --help' did not print '$want' (the usage of $cmd)"
    return 1
  fi
  [ $help = 1 ] && return 0
  # 2. the operands
  local n=${#ops[@]} ok=1
  case $cmd in
    train | plan | eval) [ $n = 1 ] || ok=0 ;;
    predict) [ $n -ge 2 ] || ok=0 ;;
    pack) [ $n = 1 ] || [ $n = 2 ] || ok=0 ;;
  esac
  if [ $ok = 0 ]; then
    WHY="'tinytrain ${A[*]}': $cmd takes $([ $cmd = predict ] && echo 'RECIPE and images' || ([ $cmd = pack ] && echo 'RECIPE or SOURCE PREFIX' || echo 'one RECIPE')), found $n operand(s)${ops:+: ${ops[*]}}$([ $explicit = 0 ] && [ $n -gt 1 ] && echo ' (a mistyped command?)')"
    return 1
  fi
  for a in "${ops[@]}"; do
    # docs/walkthrough.md and docs/finetune.md write their recipes first; tests/cli/test_walkthrough.sh
    # and test_finetune.sh run their commands
    if [[ $a == *.recipe ]] && [ ! -f "$a" ] && [ "$DOC" != docs/walkthrough.md ] && [ "$DOC" != docs/finetune.md ]; then
      WHY="'tinytrain ${A[*]}': no recipe $a"
      return 1
    fi
  done
  # 3. main()'s checks after parsing, with the recipe (pack: SOURCE) missing
  local B=("${A[@]}")
  B[${pos[0]}]=$TMP/missing/none.recipe
  rm -rf "$TMP/run" && mkdir "$TMP/run"
  (cd "$TMP/run" && exec "$TT_ABS" "${B[@]}") >"$TMP/out" 2>"$TMP/err" </dev/null
  rc=$?
  if [ $rc = 2 ]; then
    WHY="'tinytrain ${A[*]}' is bad usage: $(head -n 1 "$TMP/err")"
    return 1
  fi
  return 0
}

# doc_lines FILE: "LINE<TAB>TEXT" for each line of a fenced block (continuations joined), and
# "LINE<TAB>@indented TEXT" for indented code lines outside fences.
doc_lines() {
  awk '
    /^[ \t]*```/ { fence = !fence; prev_blank = 0; next }
    fence {
      if (cont != "") { cont = cont " " $0 } else { cont = $0; start = NR }
      if (cont ~ /\\$/) { sub(/\\$/, "", cont); next }
      printf "%d\t%s\n", start, cont; cont = ""; next
    }
    /^    [^ *-]/ && (prev_blank || prev_code) { printf "%d\t@indented %s\n", NR, $0; prev_code = 1; prev_blank = 0; next }
    { prev_code = 0; prev_blank = ($0 ~ /^[ \t]*$/) }
  ' "$1"
}

need_tt docs_binary
TT_ABS=$(cd "$(dirname "$TT")" && pwd -P)/$(basename "$TT")

# check_link FILE TARGET: returns 0, or 1 with the reason in WHY.
slugs() { # the anchors of FILE's headings
  awk '/^[ \t]*```/ { fence = !fence; next } !fence && /^#+ / { sub(/^#+ +/, ""); print }' "$1" |
    tr 'A-Z' 'a-z' | sed 's/[^a-z0-9 _-]//g; s/ /-/g'
}
check_link() {
  local file=$1 target=$2 path anchor dest
  path=${target%%#*}
  anchor=""
  [[ $target == *#* ]] && anchor=${target#*#}
  if [ -z "$path" ]; then dest=$file; else dest=$(dirname "$file")/$path; fi
  if [ ! -e "$dest" ]; then WHY="$file: link ($target): no such file"; return 1; fi
  local real
  real=$(cd "$(dirname "$dest")" && pwd -P)/$(basename "$dest")
  if [[ $real != "$ROOT"/* && $real != "$ROOT" ]]; then WHY="$file: link ($target) leaves the repository"; return 1; fi
  if [ -n "$anchor" ] && [[ $dest == *.md ]] && ! slugs "$dest" | grep -qxF -- "$anchor"; then
    WHY="$file: link ($target): no heading with the anchor #$anchor in $path"
    return 1
  fi
  return 0
}

# ---- self-check: the checks catch what they are for ----
ok=1
L=examples/fashion_mnist/lenet.recipe
tt_args "./tinytrain --vram 4G $L" && check_cmd || { fail docs_selfcheck "a correct command fails: $WHY"; ok=0; }
for bad in "./tinytrain --vramm 4G $L" "./tinytrain evl --weights w.safetensors $L" \
  "mpirun -np 2 ./tinytrain --vram 4G --ranks 2 $L" "./tinytrain plan --max-batch $L" \
  "./tinytrain eval $L" "./tinytrain --epochs N $L" "./tinytrain --vram 4G examples/none.recipe"; do
  if ! tt_args "$bad"; then fail docs_selfcheck "'$bad' is not recognised as a tinytrain command"; ok=0
  elif check_cmd; then fail docs_selfcheck "'$bad' passes the check"; ok=0
  fi
done
tt_args "ninja tinytrain build/bench/bench_loader" && { fail docs_selfcheck "'ninja tinytrain' taken for a tinytrain command"; ok=0; }
check_link README.md "../shared/DESIGN.md" && { fail docs_selfcheck "a link to ../shared/DESIGN.md passes"; ok=0; }
check_link docs/cli.md "no-such-page.md" && { fail docs_selfcheck "a link to a missing file passes"; ok=0; }
check_link README.md "../$(basename "$ROOT")/LICENSE" || { fail docs_selfcheck "a link inside the repository fails: $WHY"; ok=0; }
echo x >"$TMP/outside.md"
check_link README.md "$(realpath --relative-to=. "$TMP/outside.md")" && { fail docs_selfcheck "a link out of the repository passes"; ok=0; }
check_link docs/cli.md "recipes.md#no-such-heading" && { fail docs_selfcheck "a link to a missing anchor passes"; ok=0; }
[ $ok = 1 ] && pass docs_selfcheck

# ---- the commands in the docs ----
ncmd=0 nskip=0 ok=1
for f in "${DOCS[@]}"; do
  while IFS=$'\t' read -r line text; do
    indented=0
    if [[ $text == "@indented "* ]]; then indented=1; text=${text#@indented }; fi
    text=$(sed 's/^[ \t]*#.*//; s/[ \t]#.*//' <<<"$text")
    # one command per segment between && and ;
    segs=$(sed 's/&&/\n/g; s/;/\n/g' <<<"$text")
    while IFS= read -r seg; do
      tt_args "$seg" || continue
      if [ $indented = 1 ]; then fail docs_commands "$f:$line: an indented code line runs tinytrain; fence it (\`\`\`) so that it is checked"; ok=0; continue; fi
      if [[ $seg == *"["* || $seg == *"|"* ]]; then nskip=$((nskip + 1)); continue; fi
      ncmd=$((ncmd + 1))
      DOC=$f check_cmd || { fail docs_commands "$f:$line: $WHY"; ok=0; }
    done <<<"$segs"
  done < <(doc_lines "$f")
done
if [ $ncmd = 0 ]; then fail docs_commands "no tinytrain command found in ${DOCS[*]}"
elif [ $ok = 1 ]; then pass "docs_commands ($ncmd commands parse at --help level; $nskip usage synopsis lines skipped)"
fi

# ---- the links ----
nlink=0 ok=1
for f in "${DOCS[@]}"; do
  # outside fenced blocks and inline code; [text](target) with a relative target
  while IFS= read -r t; do
    case "$t" in http://* | https://* | mailto:*) continue ;; esac
    nlink=$((nlink + 1))
    check_link "$f" "$t" || { fail docs_links "$WHY"; ok=0; }
  done < <(awk '/^[ \t]*```/ { fence = !fence; next } !fence' "$f" | sed 's/`[^`]*`//g' |
    grep -o '\]([^)]*)' | sed 's/^](//; s/)$//; s/ .*//')
done
[ $ok = 1 ] && pass "docs_links ($nlink relative links resolve)"

# ---- the knobs: core/base/knobs.c's table and docs/cli.md's "Environment knobs" table name the
# same TINYTRAIN_* variables, and no other library file reads the environment for one ----
code=$(grep -o '{"TINYTRAIN_[A-Z0-9_]*"' core/base/knobs.c | tr -d '{"' | sort -u)
doc=$(awk '/^## Environment knobs/ { on = 1; next } /^## / { on = 0 } on' docs/cli.md |
  grep -o '^| `TINYTRAIN_[A-Z0-9_]*`' | tr -d '|` ' | sort -u)
readers=$(grep -rl 'TINYTRAIN_' core kernels arena --include=*.c --include=*.cu --include=*.h | xargs grep -l 'getenv\|environ' |
  xargs grep -l 'getenv("TINYTRAIN_\|"TINYTRAIN_", 10' 2>/dev/null | sort -u)
if [ -z "$code" ]; then fail docs_knobs "no knob found in core/base/knobs.c"
elif [ "$code" != "$doc" ]; then
  fail docs_knobs "core/base/knobs.c and docs/cli.md's knob table differ: $(diff <(echo "$code") <(echo "$doc") | grep '^[<>]' | tr '\n' ' ')"
elif [ "$readers" != "core/base/knobs.c" ]; then fail docs_knobs "the environment's knobs are read outside core/base/knobs.c: $readers"
else pass "docs_knobs ($(echo "$code" | wc -l) knobs in the code and in docs/cli.md, one reader)"
fi

# ---- the README's package list is configure.py's (issue 40: libpng-dev and librsvg2-bin were missing) ----
missing=$(python3 - <<'PY'
import re
s = open("configure.py").read()
i = s.index("DEB_PACKAGES = ["); j = s.index("]\n", i)
readme = open("README.md").read()
print(" ".join(p for p in re.findall(r'"([a-z0-9.+-]+)"', s[i:j]) if p not in readme))
PY
)
if [ -n "$missing" ]; then fail docs_packages "README.md does not name configure.py's packages: $missing"
else pass docs_packages
fi

exit $FAILED
