#!/usr/bin/env bash
# dev/before_after.sh: a change's speed against the tree before it, in one command on one GPU. A change
# that should not move speed (a refactor) shows here that it did not; one that should, by how much.
#   bash dev/before_after.sh OLD_TREE [ROUNDS]
# OLD_TREE: a source tree of the earlier version (e.g. `git archive REV | tar -x -C .old`; its test
# fixtures are not needed). Both trees are built for sm_90a (GPU_ARCH to change it), then each
# measurement runs on the old tree's programs and this tree's in turn, ROUNDS times (default 2: old, new,
# new, old, ...), so that a drift of the GPU's clocks falls on both alike:
#   bench_rollout --model 0.6b / 8b --fp8 block --batch 64      the decode step (tokens/s)
#   bench_train --model 0.6b --fp8 block --batch 8 --seq 1024   the LoRA training step (tokens/s)
#   ./train_grpo --max_steps 30 (the default run, its warm-up cached first, each tree's own cache): wall s
# Prints one table: each measurement's median a tree, and new / old.
set -uo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bash dev/before_after.sh OLD_TREE [ROUNDS]}
rounds=${2:-2}
[ -f "$old/Makefile" ] || { echo "before_after: $old has no Makefile: give the earlier version's source tree"; exit 2; }
old=$(cd "$old" && pwd)
arch=${GPU_ARCH:-90a}
deps=()
[ -n "${DEPS_PREFIX:-}" ] && deps=("DEPS_PREFIX=$DEPS_PREFIX")
out=$(mktemp -d /tmp/before_after.XXXXXX)
for t in "$old" "$PWD"; do
    (cd "$t" && make GPU_ARCH=$arch "${deps[@]}" -j"$(nproc)" all bench-rollout bench-train >"$out/build.log" 2>&1) ||
        { echo "before_after: the build in $t failed (the end of its log: $out/build.log)"; tail -5 "$out/build.log"; exit 1; }
done
# one measurement on tree $1: prints one number
measure() {
    local t=$1 what=$2
    case "$what" in
    rollout-0.6b | rollout-8b)
        (cd "$t" && ./build/bench_rollout --model "${what#rollout-}" --fp8 block --batch 64 2>/dev/null) |
            awk -F'|' '$2 ~ /block/ && $3+0 == 64 { gsub(/ /, "", $5); print $5; exit }' ;;
    train-0.6b)
        (cd "$t" && ./build/bench_train --model 0.6b --fp8 block --batch 8 --seq 1024 2>/dev/null) |
            awk -F'|' '$2 ~ /block/ { gsub(/ /, "", $5); print $5; exit }' ;;
    default-run)
        local dir=$out/run.$RANDOM
        local s e
        s=$(date +%s%N)
        (cd "$t" && XDG_CACHE_HOME=$out/cache.$(basename "$t") ./train_grpo --max_steps 30 --output_dir "$dir" >/dev/null 2>&1)
        e=$(date +%s%N)
        awk -v d=$((e - s)) 'BEGIN { printf "%.2f\n", d / 1e9 }' ;;
    esac
}
whats="rollout-0.6b rollout-8b train-0.6b default-run"
# the default run's warm-up, cached once a tree, outside the timing
for t in "$old" "$PWD"; do
    (cd "$t" && XDG_CACHE_HOME=$out/cache.$(basename "$t") ./train_grpo --max_steps 1 --output_dir "$out/warm.$(basename "$t")" >/dev/null 2>&1)
done
for w in $whats; do
    for r in $(seq 1 "$rounds"); do
        if [ $((r % 2)) = 1 ]; then order="$old $PWD"; else order="$PWD $old"; fi
        for t in $order; do
            tag=new; [ "$t" = "$old" ] && tag=old
            v=$(measure "$t" "$w")
            echo "$w $tag ${v:-nan}" >>"$out/results"
        done
    done
done
echo "before/after on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1): $rounds rounds, medians"
echo "| measurement | unit | old | new | new / old |"
echo "| --- | --- | --- | --- | --- |"
for w in $whats; do
    unit="tokens/s"; [ "$w" = default-run ] && unit="s (30 steps)"
    o=$(awk -v w="$w" '$1 == w && $2 == "old" { print $3 }' "$out/results" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
    n=$(awk -v w="$w" '$1 == w && $2 == "new" { print $3 }' "$out/results" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
    printf "| %s | %s | %s | %s | %s |\n" "$w" "$unit" "$o" "$n" "$(awk -v o="$o" -v n="$n" 'BEGIN { if (o > 0) printf "%.3f", n / o; else print "-" }')"
done
echo "(each run's numbers: $out/results)"
