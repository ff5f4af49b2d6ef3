#!/usr/bin/env python3
"""Fixtures for the FP8 training recipe's delayed scaling (fp8_recipe.c), from an independent NumPy
reimplementation of Transformer Engine's DelayedScaling semantics (transformer_engine/common/recipe/
delayed_scaling.cu, amax_and_scale_update):

  - amax_history has amax_history_len rows; row 0 collects the current step's amax;
  - after the step the history rolls: new[i] = old[i + 1] for 1 <= i < len - 1, new[len - 1] = old[0],
    new[0] = 0 (len 1: new[0] = 0);
  - the amax for the new scale: "max" is the max over old[0..len-1] (NaN ignored, as fmaxf does),
    "most_recent" is old[0];
  - scale = fp8_max * 2^-margin / amax in float32 when that amax is finite and > 0, else the previous
    scale; scale_inv = 1 / scale in float32. TE's scale multiplies x before the cast (q = fp8(x * scale));
    scale_inv is the dequantization scale (the project's FP8Tensor.scale).
  - one deviation, documented in fp8_recipe.h: where fp8_max * 2^-margin / amax overflows float32 (an
    amax below ~1e-36), the scale is FLT_MAX as in TE's current scaling; no case here reaches it.

Writes test/fixtures/recipe/cases.txt (name len algo margin fmt) and, per case, <name>.npy:
float32 (steps, 3): the amax recorded at the step, then the scale and scale_inv in force at the NEXT step.
    python3 dev/make_recipe_fixtures.py
"""
import os
import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "test", "fixtures", "recipe")
FP8_MAX = {"e4m3": np.float32(448.0), "e5m2": np.float32(57344.0)}


def amax_sequence(n, seed):
    """Positive amaxes with a drift, spikes x1000, zeros, dips, one inf and one NaN."""
    r = np.random.default_rng(seed)
    a = np.exp(r.normal(0.0, 1.0, n) + np.linspace(0, 3, n)).astype(np.float32)
    for i in r.choice(n, 6, replace=False):
        a[i] *= np.float32(1000.0)
    for i in r.choice(n, 8, replace=False):
        a[i] = np.float32(0.0)
    for i in r.choice(n, 4, replace=False):
        a[i] *= np.float32(1e-3)
    a[n // 3] = np.float32(np.inf)
    a[2 * n // 3] = np.float32(np.nan)
    return a


def delayed(amaxes, length, algo, margin, fmt):
    hist = np.zeros(length, np.float32)
    scale = np.float32(1.0)
    scaled_max = np.float32(FP8_MAX[fmt] * np.float32(2.0) ** np.float32(-margin))
    out = np.zeros((len(amaxes), 3), np.float32)
    for t, a in enumerate(amaxes):
        hist[0] = a  # the step's amax (one tensor a step here)
        last = hist[0]
        if algo == "max":
            am = np.float32(0.0)
            for v in hist:
                am = np.fmax(am, v)
        else:
            am = last
        new = np.zeros(length, np.float32)
        if length > 1:
            new[1:length - 1] = hist[2:length]
            new[length - 1] = last
        hist = new
        if np.isfinite(am) and am > 0:
            scale = np.float32(scaled_max / am)
        out[t] = (a, scale, np.float32(np.float32(1.0) / scale))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = [("len1_recent_e4m3", 1, "most_recent", 0, "e4m3"), ("len16_max_e4m3", 16, "max", 0, "e4m3"),
             ("len16_recent_e5m2", 16, "most_recent", 0, "e5m2"), ("len1024_max_m1_e5m2", 1024, "max", 1, "e5m2"),
             ("len7_max_m2_e4m3", 7, "max", 2, "e4m3")]
    lines = []
    for k, (name, length, algo, margin, fmt) in enumerate(cases):
        a = amax_sequence(400, 100 + k)
        np.save(os.path.join(OUT, name + ".npy"), delayed(a, length, algo, margin, fmt))
        lines.append(f"{name} {length} {algo} {margin} {fmt}")
    with open(os.path.join(OUT, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", len(cases), "cases to", OUT)


if __name__ == "__main__":
    main()
