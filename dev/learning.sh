#!/usr/bin/env bash
# dev/learning.sh: FP8 learns like BF16? The default task (built-in tiny model,
# arithmetic, carry-error warm-up) trained by GRPO with the frozen weights in FP8
# block, row, tensor and unquantized (bf16 on the GPU), 3 seeds for block and off.
# Each seed's warm-up is made once and shared by its runs. Writes runs/<gran>_s<seed>/
# and, with matplotlib, learning.png (held-out accuracy per step, all runs).
#   bash dev/learning.sh [OUTDIR] [extra train_grpo options...]
# EXTRA="row tensor" (the default) names the granularities run once (seed 1) besides block and off;
# EXTRA="" runs block and off alone. SEEDS (default "1 2 3") names the seeds of block and off.
set -euo pipefail
out=${1:-runs}; shift || true
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-5}
TRAIN=${TRAIN:-./train_grpo}  # the program (a prebuilt one may be named here)
run() {  # gran seed [options]
  local g=$1 s=$2 d="$out/$1_s$2"
  shift 2
  # (the runs of one seed share its warm-up through the cache, ~/.cache/fp8-grpo: made by the first)
  "$TRAIN" --load_in_fp8 "$g" --seed "$s" --output_dir "$d" --quiet "$@" > "$d.log" 2>&1 || { echo "run $g seed $s failed:"; tail -3 "$d.log"; }
  grep "held-out accuracy:" "$d.log" | sed "s/^/$g seed $s: /" || true
}
for s in ${SEEDS:-1 2 3}; do (mkdir -p "$out/block_s$s"; run block $s "$@"; run off $s "$@") & done
wait
for g in ${EXTRA-row tensor}; do (run "$g" 1 "$@") & done
wait
python3 dev/plot_learning.py "$out" "$out/learning.png" || echo "(no plot: matplotlib missing?)"
