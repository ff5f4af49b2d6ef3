#!/bin/bash
# dev/reward_overhead.sh: what a reward program costs a step of the default run. The default command
# (built-in model and task, on whatever device ./train_grpo picks) three times from one warm-up: with the
# built-in rewards, with the same rewards as a C program (test/reward_prog.c builtin), and with
# README's Python example (format + exact answer); for each, the mean time/reward and step_time of
# metrics.jsonl's steps and the reward's share of the step.
#   make build/reward_prog && bash dev/reward_overhead.sh [OUT_DIR] [more ./train_grpo options]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/reward_overhead}
shift || true
rm -rf "$out" && mkdir -p "$out"
[ -x build/reward_prog ] || { echo "build/reward_prog missing: make build/reward_prog"; exit 1; }
python3 - "$out/my_reward.py" <<'EOF'  # README's example, as README shows it
import re, sys
text = open("README.md").read()
open(sys.argv[1], "w").write(re.search(r"```python\n(.*?)```", text, re.S).group(1))
EOF
run() {  # name, then options (the warm-up: the shared cache's, made by the first run when missing)
    local name=$1; shift
    ./train_grpo --quiet --output_dir "$out/$name" "$@" > "$out/$name.log" 2>&1
}
run builtin "$@"
run c_program --reward_cmd "$PWD/build/reward_prog builtin" --reward_names correctness+format --reward_weights 1,0.2 "$@"
run python --reward_cmd "python3 $out/my_reward.py" --reward_names format+exact --reward_weights 0.2,1 "$@"
printf "%-10s %8s %12s %12s %8s\n" rewards steps "reward ms" "step ms" share
for name in builtin c_program python; do
    python3 - "$out/$name/metrics.jsonl" "$name" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"time/reward"' in l]
r = sum(x["time/reward"] for x in rows) / len(rows)
s = sum(x["step_time"] for x in rows) / len(rows)
print(f"{sys.argv[2]:<10} {len(rows):>8} {1e3 * r:>12.2f} {1e3 * s:>12.1f} {100 * r / s:>7.2f}%")
EOF
done
echo "(machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); device: $(grep -m1 -o 'backend: .*' "$out/builtin.log" || echo see the logs))"
