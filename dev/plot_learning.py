"""Plot held-out accuracy per step for the runs dev/learning.sh (FP8 granularities) or
dev/ppo_vs_grpo.sh (algorithms) made.

    python3 dev/plot_learning.py runs runs/learning.png [TITLE]

Reads runs/<name>_s<seed>/metrics.jsonl (name: a granularity, or grpo / ppo); one line per run, a
colour per name. Also prints the final held-out accuracy of each run and the mean per name.
"""
import glob
import json
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

runs_dir, out = sys.argv[1], sys.argv[2]
colors = {"block": "#d62728", "off": "#1f77b4", "row": "#2ca02c", "tensor": "#9467bd", "grpo": "#1f77b4", "ppo": "#d62728"}
labels = {"off": "bf16 (off)", "grpo": "GRPO", "ppo": "PPO"}
title = sys.argv[3] if len(sys.argv) > 3 else "GRPO on the built-in task: FP8 frozen weights vs BF16"
finals = {}
fig, ax = plt.subplots(figsize=(7, 4.2))
for path in sorted(glob.glob(os.path.join(runs_dir, "*_s*", "metrics.jsonl"))):
    name = os.path.basename(os.path.dirname(path))
    gran, seed = name.rsplit("_s", 1)
    pts = [(j["step"], j["eval/accuracy"]) for j in map(json.loads, open(path)) if j.get("eval/accuracy") is not None]
    if not pts:
        continue
    x, y = zip(*pts)
    label = labels.get(gran, f"fp8 {gran}")
    ax.plot(x, y, color=colors.get(gran, "k"), marker="o", ms=3, lw=1.2, alpha=0.85,
            label=label if seed == "1" else None)
    finals.setdefault(gran, []).append(y[-1])
    print(f"{name}: held-out {y[0]:.3f} -> {y[-1]:.3f}")
for g, v in finals.items():
    print(f"{g}: final held-out accuracy mean {sum(v) / len(v):.3f} over {len(v)} seed(s): {', '.join(f'{a:.3f}' for a in v)}")
ax.set_xlabel("step")
ax.set_ylabel("held-out accuracy (greedy)")
ax.set_title(title)
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(out, dpi=110)
print("wrote", out)
