#!/usr/bin/env python3
"""dev/plot_dp_sft.py DIR [OUT.svg]: the two SFT runs of `dev/multi_gpu_check.sh sft` (DIR/sft-1.jsonl: one
GPU, 2 micro-batches of 8 a step; DIR/sft-2.jsonl: two GPUs, 8 each): their loss curves on one axis and
their relative difference per step below (default output dev/dp_sft_curves.svg). The same global batch in the
same order: one GPU adds the two micro-batches' gradients, two GPUs add their ranks' in the reduce-scatter,
the same fp32 sums; FP8 delayed scaling takes the max of both halves' amaxes either way."""
import json, os, sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "dp_sft_curves.svg")
runs = {}
for name in ("sft-1", "sft-2"):
    rows = [json.loads(l) for l in open(os.path.join(d, name + ".jsonl")) if l.strip()]
    runs[name] = [(r["step"], r["loss"]) for r in rows if "loss" in r]
a, b = runs["sft-1"], runs["sft-2"]
rel = [abs(x[1] - y[1]) / abs(x[1]) for x, y in zip(a, b)]
print("steps %d; max relative difference %.3g (bf16's resolution: 2^-8 = %.3g)" % (len(rel), max(rel), 2.0 ** -8))
fig, ax = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
ax[0].plot([s for s, _ in a], [l for _, l in a], label="1 GPU (2 x 8 accumulated)", lw=2.5, alpha=0.6)
ax[0].plot([s for s, _ in b], [l for _, l in b], label="2 GPUs (8 each)", lw=1, ls="--")
ax[0].set_yscale("log")
ax[0].set_ylabel("loss")
ax[0].set_title("SFT of every weight, FP8 delayed scaling, 16 examples a step")
ax[0].legend()
ax[1].plot([s for s, _ in a], rel, color="k", lw=1)
ax[1].axhline(2.0 ** -8, color="r", lw=0.8, ls=":", label="bf16 resolution 2^-8")
ax[1].set_ylabel("|1 GPU - 2 GPUs| / loss")
ax[1].set_xlabel("step")
ax[1].set_ylim(-0.0005, 0.006)
ax[1].legend(loc="upper right")
fig.tight_layout()
fig.savefig(out)
print("wrote", out)
