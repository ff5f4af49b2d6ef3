#!/usr/bin/env python3
"""Make the FP8 fixtures test/test_fp8.c checks the C codecs and quantizers against.

PyTorch is the independent truth. This writes, under test/fixtures/fp8/:

  bf16_e4m3.npy         uint8 (65536,)  x.to(torch.float8_e4m3fn) codes for every BF16 bit
                                        pattern x (index = the 16 bits)
  bf16_e4m3_finite.npy  bool  (65536,)  whether PyTorch's result is a finite value
  bf16_e5m2.npy, bf16_e5m2_finite.npy   the same for torch.float8_e5m2
  decode_e4m3.npy       float32 (256,)  PyTorch's value of each code (.float()); same for e5m2
  quant_x.npy           float32 (200, 300) random input with outliers, spanning many
                                        binades and values beyond the FP8 range
  quant_<case>_q.npy    uint8 (200, 300) codes
  quant_<case>_s.npy    float32 scales, row-major in the PLAIN (unpadded) layout:
                                        tensor (1,), row (200,), w128 (2, 3), a128 (200, 3)
  quant_<case>_deq.npy  float32 (200, 300) decode(q) * scale
  cases: tensor, row, w128 (128x128 weight tiles), a128 (1x128 activation groups),
  w128_pow2 (power-of-two scales), row_e5m2 (E5M2).

The quantizer rule (fp8.h): per group amax in fp32, scale = amax / FP8_MAX (1 if
amax == 0), pow2: rounded up to a power of two; q = (x / scale).to(float8).
Only PyTorch tensor ops are used here, none of the C code's logic.

Run from the repository root: python3 dev/make_fp8_table.py  (CPU is enough).
"""
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures", "fp8")
FMT = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def codes_for_all_bf16():
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)  # wraps to the 16-bit patterns
    x = bits.view(torch.bfloat16).float()
    for name, (dt, _) in FMT.items():
        q = x.to(dt)
        np.save(os.path.join(OUT, f"bf16_{name}.npy"), q.view(torch.uint8).numpy())
        np.save(os.path.join(OUT, f"bf16_{name}_finite.npy"), torch.isfinite(q.float()).numpy())
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        np.save(os.path.join(OUT, f"decode_{name}.npy"), codes.view(dt).float().numpy())


def scale_rule(amax, fmax, pow2):
    s = amax / fmax
    s = torch.where(amax > 0, s, torch.ones_like(s))
    if pow2:
        m, e = torch.frexp(s)  # s = m * 2^e, m in [0.5, 1)
        s = torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))
    return s


def quantize(x, gran, fmt, pow2):
    """x (R, C) float32 -> (codes (R, C) uint8, plain scales, dequantized (R, C))."""
    dt, fmax = FMT[fmt]
    R, C = x.shape
    if gran == "tensor":
        s = scale_rule(x.abs().max().reshape(1), fmax, pow2)
        full = s.expand(R, C)
    elif gran == "row":
        s = scale_rule(x.abs().amax(dim=1), fmax, pow2)
        full = s[:, None].expand(R, C)
    else:  # blocks of bh x 128, edge blocks partial: pad with zeros (they do not change amax)
        bh = 128 if gran == "w128" else 1
        RB, CB = -(-R // bh), -(-C // 128)
        xp = torch.zeros(RB * bh, CB * 128)
        xp[:R, :C] = x
        amax = xp.abs().reshape(RB, bh, CB, 128).amax(dim=(1, 3))
        s = scale_rule(amax, fmax, pow2)
        full = s.repeat_interleave(bh, 0).repeat_interleave(128, 1)[:R, :C]
    q = (x / full).to(dt)
    deq = q.float() * full
    return q.view(torch.uint8), s.contiguous(), deq


def quant_cases():
    g = torch.Generator().manual_seed(1234)
    R, C = 200, 300
    # log-normal magnitudes over ~12 binades, random signs, a few rows and blocks
    # blown up beyond the FP8 range (scales must bring them back)
    mag = torch.exp(torch.randn(R, C, generator=g) * 2.0)
    sign = torch.where(torch.rand(R, C, generator=g) < 0.5, -1.0, 1.0)
    x = (mag * sign).float()
    x[7] *= 1e4
    x[130:140, 10:20] *= 1e6
    x[150, 290] = 3e7
    np.save(os.path.join(OUT, "quant_x.npy"), x.numpy())
    cases = {"tensor": ("tensor", "e4m3", False), "row": ("row", "e4m3", False),
             "w128": ("w128", "e4m3", False), "a128": ("a128", "e4m3", False),
             "w128_pow2": ("w128", "e4m3", True), "row_e5m2": ("row", "e5m2", False)}
    for name, (gran, fmt, pow2) in cases.items():
        q, s, deq = quantize(x, gran, fmt, pow2)
        np.save(os.path.join(OUT, f"quant_{name}_q.npy"), q.numpy())
        np.save(os.path.join(OUT, f"quant_{name}_s.npy"), s.numpy().astype(np.float32))
        np.save(os.path.join(OUT, f"quant_{name}_deq.npy"), deq.numpy().astype(np.float32))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    codes_for_all_bf16()
    quant_cases()
    print("wrote", sorted(os.listdir(OUT)), "with torch", torch.__version__)
