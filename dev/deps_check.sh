#!/usr/bin/env bash
# dev/deps_check.sh: the product's files depend on each other one way. It builds the graph of the
# product's files (everything but dev/ and test/) from two kinds of edge:
#   - includes: file A has #include "B"                                  A -> B
#   - calls:    a symbol defined in file B's object is used by file A's    A -> B
#               (nm --defined-only and nm -u on the CPU build's objects in build/; each object's
#               file is its compile unit's name in the debug information). The CUDA files have no
#               object in that build: their edges are their includes.
# and fails, naming the files, if
#   1. any cycle exists (tsort finds it), or
#   2. an edge goes up the layers, each file's layer being (from the top)
#        programs   the *.c at the root with a main
#        train      train/
#        model-io   what makes the model's inputs from the outside and sits on the model: reading and
#                   writing checkpoints (io/model_load.c), the command line (io/options.c: GRPO's
#                   options, --device's backend), GRPO's sums over ranks (dist/data_parallel.c)
#        model      the other *.c at the root: model.c, model_alloc.c, lora.c, rollout.c, grpo.c,
#                   ppo.c, dpo.c (and their headers)
#        io         the rest of io/ and dist/: file formats (safetensors, the plot), the ranks
#        text       text/, tasks/, tokenizer.c (and tokenizer.h)
#        backends   cpu/, cuda/, fp8.cu
#        core       core/, and the FP8 formats every layer reads: fp8.h and their reference
#                   cpu/fp8_cpu.c (codes, scales, quantization; core's conversions decode E4M3)
#      (a file may use its own layer and those below it). It prints the layers it found.
#
#   bash dev/deps_check.sh          (from anywhere, after make; a second or two)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD:-build}
[ -f "$build/model.o" ] || { echo "deps_check: $root/$build/model.o is missing: run make first"; exit 1; }
work=$(mktemp -d /tmp/fp8grpo_deps.XXXXXX)
trap 'rm -rf "$work"' EXIT

git ls-files '*.c' '*.cu' '*.h' '*.cuh' | grep -v '^dev/\|^test/' | sort > "$work/files"

layer_of() {  # file -> layer number (8 top .. 1 bottom)
  case "$1" in
    core/* | fp8.h | cpu/fp8_cpu.c) echo 1 ;;
    cpu/* | cuda/* | fp8.cu) echo 2 ;;
    text/* | tasks/* | tokenizer.c | tokenizer.h) echo 3 ;;
    io/model_load.c | io/options.[ch] | dist/data_parallel.[ch]) echo 6 ;;
    io/* | dist/*) echo 4 ;;
    train/*) echo 7 ;;
    */*) echo 0 ;;  # a directory this script does not know: said below
    *.c) if grep -q '^int main(' "$1"; then echo 8; else echo 5; fi ;;
    *) echo 5 ;;
  esac
}
names=(unknown core backends text io model model-io train programs)

# the include edges: "A B" for #include "B" in A (B relative to the root, or to A's directory)
while read -r f; do
  d=$(dirname "$f")
  { grep -o '^#include "[^"]*"' "$f" || true; } | sed 's/^#include "\(.*\)"$/\1/' | while read -r inc; do
    if [ -f "$inc" ]; then echo "$f $inc"; elif [ -f "$d/$inc" ]; then echo "$f $(realpath --relative-to=. "$d/$inc")"; fi
  done
done < "$work/files" > "$work/inc"

# the call edges from the objects: who defines each symbol, who uses it
: > "$work/defs"
: > "$work/uses"
for o in "$build"/*.o; do
  src=$(readelf --debug-dump=info "$o" 2>/dev/null | sed -n '/DW_AT_name/{s/.*: //;p;q}' || true)
  grep -qx -- "$src" "$work/files" || continue  # (not a product file)
  nm --defined-only -g "$o" | awk -v f="$src" 'NF == 3 {print $3, f}' >> "$work/defs"
  nm -u "$o" | awk -v f="$src" '{print $NF, f}' >> "$work/uses"
done
sort -u "$work/defs" -o "$work/defs"
sort -u "$work/uses" -o "$work/uses"
join "$work/uses" "$work/defs" | awk '$2 != $3 {print $2, $3}' | sort -u > "$work/calls"

sort -u "$work/inc" "$work/calls" > "$work/edges"
fail=0

# 1. cycles
if ! tsort "$work/edges" > /dev/null 2> "$work/loops"; then
  echo "deps_check: FAILED: the product's files depend on each other in a cycle; each cycle's files (tsort's):"
  sed 's/^.*input contains a loop:$/  a cycle:/; s/^tsort: /    /' "$work/loops"
  fail=1
fi

# 2. the layers
while read -r f; do echo "$f $(layer_of "$f")"; done < "$work/files" > "$work/layers"
while read -r f l; do
  [ "$l" = 0 ] && { echo "deps_check: FAILED: $f is in a directory this script has no layer for: add it to layer_of"; fail=1; }
done < "$work/layers"
awk 'NR == FNR {layer[$1] = $2; next} layer[$2] > layer[$1] {print $1, layer[$1], $2, layer[$2]}' \
  "$work/layers" "$work/edges" > "$work/up"
while read -r a la b lb; do
  how=$(grep -qx "$a $b" "$work/inc" && echo "includes" || echo "calls")
  sym=""
  if [ "$how" = calls ]; then
    sym=$(join <(awk -v a="$a" '$2 == a {print $1}' "$work/uses") <(awk -v b="$b" '$2 == b {print $1}' "$work/defs") | head -3 | tr '\n' ' ')
    sym=" (${sym% })"
  fi
  echo "deps_check: FAILED: $a (${names[$la]}) $how $b (${names[$lb]})$sym: a layer below may not use one above"
  fail=1
done < "$work/up"

echo "deps_check: the layers, top to bottom (a file uses its own layer and those below):"
for l in 8 7 6 5 4 3 2 1; do
  printf '  %-9s' "${names[$l]}"
  awk -v l="$l" '$2 == l {print $1}' "$work/layers" | grep -v '\.h$\|\.cuh$' | tr '\n' ' '
  echo
done
echo "deps_check: $(wc -l < "$work/files") files, $(wc -l < "$work/inc") include edges, $(wc -l < "$work/calls") call edges"
if [ "$fail" = 0 ]; then echo "deps_check: no cycle, every edge goes down the layers"; fi
exit "$fail"
