#!/usr/bin/env bash
# dev/readme_check.sh: the README's commands that run on a CPU in a few minutes, run, and what they
# print compared with what the README shows, so that a drift fails here (CI runs it after make).
#
#   bash dev/readme_check.sh          (from anywhere, after make; about 3 minutes of CPU time)
#
# 1. Every README block of the form (indented four spaces)
#        $ COMMAND
#        the lines it prints on stdout
#    is run in order, in a fresh directory holding links to the programs (so out/ starts empty, as
#    on a fresh clone; HOME a fresh directory too, so the warm-up cache does), and its stdout
#    compared with the lines below it. A first line "..." stands
#    for any lines before the rest: the output must end with the lines after it. These blocks are
#    the default runs (./train_grpo, ./train_dpo: their held-out accuracy lines, the same on every
#    run of one build on one kind of CPU) and the ./generate lines that try their results.
# 2. Every --option the README names is one that some program's --help lists (or a launcher's:
#    torchrun's and srun's, bench_grpo's --save), so that no renamed or removed option lingers.
# Timings are not checked: each names its machine and date in the README instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
readme="$root/README.md"
progs="train_grpo train_sft train_dpo generate export"
for p in $progs; do
  [ -x "$root/$p" ] || { echo "readme_check: $root/$p is missing: run make first"; exit 1; }
done
work=$(mktemp -d /tmp/fp8grpo_readme.XXXXXX)
trap 'rm -rf "$work"' EXIT
for p in $progs; do ln -s "$root/$p" "$work/$p"; done
# a home of its own: the built-in warm-up's cache (~/.cache/fp8-grpo) starts empty, as on a fresh
# machine, and nothing is written to the user's
mkdir "$work/home"
pass=0
fail=0

# one block: the command ($1) and the README's lines (file $2); the command runs in $work
run_block() {
  local cmd=$1 want=$2 got="$work/.got" n
  echo "readme_check: \$ $cmd"
  if ! (cd "$work" && env -u XDG_CACHE_HOME HOME="$work/home" bash -c "$cmd") > "$got" 2> "$work/.err"; then
    echo "FAILED: '$cmd' exited non-zero:"; tail -n 5 "$work/.err"; fail=$((fail + 1)); return
  fi
  if [ "$(head -n 1 "$want")" = "..." ]; then  # the output's end
    sed -i 1d "$want"
    n=$(wc -l < "$want")
    tail -n "$n" "$got" > "$got.tail" && mv "$got.tail" "$got"
  fi
  if diff -u --label "README.md" --label "printed" "$want" "$got"; then pass=$((pass + 1)); else
    echo "FAILED: '$cmd' prints other lines than the README shows (above: - the README, + the program)"; fail=$((fail + 1))
  fi
}

# 1. the $ blocks, in the README's order
cmd=""
while IFS= read -r line || [ -n "$line" ]; do
  if [[ "$line" == "    \$ "* ]]; then
    [ -n "$cmd" ] && run_block "$cmd" "$work/.want"
    cmd=${line#    \$ }
    : > "$work/.want"
  elif [ -n "$cmd" ] && [[ "$line" == "    "* ]]; then
    printf '%s\n' "${line#    }" >> "$work/.want"
  elif [ -n "$cmd" ]; then
    run_block "$cmd" "$work/.want"
    cmd=""
  fi
done < "$readme"
[ -n "$cmd" ] && run_block "$cmd" "$work/.want"

# 2. the options the README names
known="help no_python ntasks_per_node gpus_per_task save"  # --help itself; torchrun's, srun's, bench_grpo's
listed=$(for p in $progs; do "$root/$p" --help 2>&1; done | grep -oE -- '--[a-z][a-z0-9_-]*' | tr - _ | sort -u)
for o in $(grep -oE -- '--[a-z][a-z0-9_-]*' "$readme" | sed 's/^--//' | tr - _ | sort -u); do
  if grep -qx -- "__$o" <<< "$listed" || [[ " $known " == *" $o "* ]]; then pass=$((pass + 1)); else
    echo "FAILED: the README names --$o, which no program's --help lists"; fail=$((fail + 1))
  fi
done

echo "readme_check: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
