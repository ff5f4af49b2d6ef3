#!/usr/bin/env bash
# dev/ppo_vs_grpo.sh: PPO against GRPO on the built-in task (the tiny model, arithmetic, the carry-error
# warm-up), each at train_grpo's built-in defaults (64 completions a step as 8 prompts x 8, 150 steps,
# learning rate 5e-4, FP8 block weights; PPO's options TRL's PPOConfig defaults), for the seeds SEEDS
# (default "1 2 3"). A seed's warm-up is made by its GRPO run and copied to its PPO run; the runs go one
# after another, so that their step times are the machine's. Writes OUTDIR/<algo>_s<seed>/ (+ .log),
# prints each run's held-out accuracy and mean step time, and with matplotlib plots the held-out
# accuracy per step into OUTDIR/ppo_vs_grpo.png (dev/plot_learning.py).
#   bash dev/ppo_vs_grpo.sh [OUTDIR] [extra train_grpo options...]
set -euo pipefail
out=${1:-runs_ppo}; shift || true
mkdir -p "$out"
TRAIN=${TRAIN:-./train_grpo}
for s in ${SEEDS:-1 2 3}; do
  for a in grpo ppo; do
    d="$out/${a}_s$s"
    mkdir -p "$d"
    # (PPO's run loads the warm-up GRPO's made, from the cache: ~/.cache/fp8-grpo)
    t0=$(date +%s.%N)
    "$TRAIN" --algo "$a" --seed "$s" --output_dir "$d" --quiet "$@" > "$d.log" 2>&1 || { echo "$a seed $s failed:"; tail -3 "$d.log"; continue; }
    t1=$(date +%s.%N)
    steps=$(python3 -c "import json,sys; t=[j['step_time'] for j in map(json.loads, open(sys.argv[1])) if 'step_time' in j]; print(f'{len(t)} steps, mean step {sum(t)/len(t):.3f} s')" "$d/metrics.jsonl")
    echo "$a seed $s: $(grep 'held-out accuracy:' "$d.log") ($steps; run $(python3 -c "print(f'{$t1 - $t0:.0f}')") s)"
  done
done
python3 dev/plot_learning.py "$out" "$out/ppo_vs_grpo.png" "PPO against GRPO on the built-in task (FP8 block, 3 seeds)" ||
  echo "(no plot: matplotlib missing?)"
