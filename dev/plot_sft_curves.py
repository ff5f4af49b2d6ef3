#!/usr/bin/env python3
"""dev/plot_sft_curves.py DIR: the runs of dev/sft_fp8_curves.sh (DIR/<recipe>[-<tag>]-<seed>.jsonl): a table of
the final training loss (the mean of the last 50 steps' losses) per recipe, mean and spread over the
seeds, relative to BF16, and paired (each seed's FP8 run against its BF16 run: the same batches in the same
order, so the data's noise cancels); the same for the held-out loss where the runs have it (EVAL=1); and the curves (the loss, smoothed over 10 steps) in SVG (default
dev/sft_fp8_curves.svg; a second argument names another)."""
import glob, json, os, statistics, sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sft_curves"
runs, inrun = {}, {}
for p in sorted(glob.glob(os.path.join(d, "*-*.jsonl"))):
    recipe, seed = os.path.basename(p)[:-6].rsplit("-", 1)
    rows = [json.loads(l) for l in open(p) if l.strip()]
    runs.setdefault(recipe, {})[seed] = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    ev = [r["eval_loss"] for r in rows if "eval_loss" in r]
    if ev: inrun.setdefault(recipe, {})[seed] = ev[-1]  # the run's own last held-out loss (train_sft --eval_data)
final = {rc: [statistics.mean(l for _, l in v[-50:]) for v in s.values()] for rc, s in runs.items()}
base = statistics.mean(final["off"])
fin = {rc: {seed: statistics.mean(l for _, l in v[-50:]) for seed, v in s.items()} for rc, s in runs.items()}
print("| recipe | seeds | final loss, mean | spread (max - min) | vs BF16 (means) | paired: per seed vs its BF16 run |")
print("| --- | --- | --- | --- | --- | --- |")
order = ["off", "delayed", "block", "current"]
for rc in order + sorted(r for r in final if r not in order):  # then tagged runs (sft_fp8_curves.sh's TAG)
    if rc in final:
        f = final[rc]
        pair = [(fin[rc][sd] / fin["off"][sd] - 1) * 100 for sd in sorted(fin[rc]) if sd in fin["off"]]
        ps = ", ".join(f"{x:+.2f}%" for x in pair) if rc != "off" else ""
        print(f"| {'BF16' if rc == 'off' else 'FP8 ' + rc} | {len(f)} | {statistics.mean(f):.4f} | {max(f) - min(f):.4f} | "
              f"{(statistics.mean(f) / base - 1) * 100:+.2f}% | {ps} |")
# the held-out loss of each run's last checkpoint in bf16 by transformers (sft_fp8_curves.sh's EVAL=1:
# DIR/<recipe>[-<tag>]-<seed>.heldout.json, dev/eval_heldout.py's line): what the weights learned, measured
# the same way for every recipe
held = {}
for p in sorted(glob.glob(os.path.join(d, "*-*.heldout.json"))):
    recipe, seed = os.path.basename(p)[:-len(".heldout.json")].rsplit("-", 1)
    held.setdefault(recipe, {})[seed] = json.loads(open(p).read())["loss"]
if "off" in held:
    hb = statistics.mean(held["off"].values())
    print()
    print("| recipe | seeds | held-out loss (bf16, transformers), mean | spread | vs BF16 (means) | paired: per seed vs its BF16 run "
          "| the run's own held-out loss (its products), mean | vs BF16 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    ib = statistics.mean(inrun["off"].values()) if "off" in inrun else None
    for rc in order + sorted(r for r in held if r not in order):
        if rc in held:
            h = list(held[rc].values())
            pair = [(held[rc][sd] / held["off"][sd] - 1) * 100 for sd in sorted(held[rc]) if sd in held["off"]]
            ps = ", ".join(f"{x:+.2f}%" for x in pair) if rc != "off" else ""
            own = statistics.mean(inrun[rc].values()) if rc in inrun else None
            os_ = f"{own:.4f} | {(own / ib - 1) * 100:+.2f}%" if own is not None and ib else " | "
            print(f"| {'BF16' if rc == 'off' else 'FP8 ' + rc} | {len(h)} | {statistics.mean(h):.4f} | {max(h) - min(h):.4f} | "
                  f"{(statistics.mean(h) / hb - 1) * 100:+.2f}% | {ps} | {os_} |")
fig, ax = plt.subplots(figsize=(8, 4.5))
colors = {"off": "black", "delayed": "tab:blue", "block": "tab:orange", "current": "tab:green", "delayed-bf16moments": "tab:purple",
          "delayed-head": "tab:red", "delayed-head-bf16moments": "tab:brown"}
for rc, s in runs.items():
    for i, (seed, v) in enumerate(sorted(s.items())):
        st = [x for x, _ in v]
        lo = [statistics.mean(l for _, l in v[max(0, k - 9):k + 1]) for k in range(len(v))]
        ax.plot(st, lo, color=colors.get(rc, "gray"), lw=1, alpha=0.8, label=("BF16" if rc == "off" else "FP8 " + rc) if i == 0 else None)
ax.set_yscale("log")
ax.set_xlabel("optimizer step")
ax.set_ylabel("training loss (completion tokens, 10-step mean)")
ax.set_title(f"SFT of a Llama-3.2-1B-shaped model ({os.path.basename(os.path.abspath(d))}): BF16 vs FP8, {len(final['off'])} seeds each")
ax.legend()
fig.tight_layout()
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft_fp8_curves.svg")
fig.savefig(out)
print("plot:", out)
