#!/usr/bin/env python3
"""Make test/fixtures/qwen3_moe_fp8: a Qwen3 MoE checkpoint in the published FP8 layout.

Qwen3-30B-A3B-FP8 (and the other block-FP8 checkpoints vLLM and transformers' FineGrainedFP8
load) hold each projection as F8_E4M3 codes `weight` and an F32 `weight_scale_inv` of one scale per
128 x 128 block (the value is code * scale), every expert's gate_proj / up_proj / down_proj its own;
the router (`mlp.gate`), the norms, the embeddings and the LM head stay in higher precision
(`quantization_config.modules_to_not_convert`). This script writes that layout from the
bfloat16 fixture test/fixtures/qwen3_moe16 (make it first: dev/make_fixtures.py qwen3_moe16):

  config.json        qwen3_moe16's, with quantization_config {quant_method fp8, weight_block_size
                     [128, 128], ...}
  model.safetensors  each projection (attention, the dense layer's MLP, every expert) as E4M3
                     codes (weight / scale).to(float8_e4m3fn), scale = amax / 448 of its block in
                     fp32; the rest as qwen3_moe16 has it
  tokens.npy         int32 (2, 24)      qwen3_moe16's
  logits.npy         float32 (2, 24, V) transformers' fp32 logits of the same model with each
                     projection replaced by its dequantized codes (code * scale): what the C loader
                     must compute after reading the codes and scales as they are

Run from the repository root: python3 dev/make_moe_fp8_fixture.py  (CPU is enough).
"""
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3MoeForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures")
SRC, DST = os.path.join(ROOT, "qwen3_moe16"), os.path.join(ROOT, "qwen3_moe_fp8")
BLOCK, E4M3_MAX = 128, 448.0
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_blocks(w):
    """w (rows, cols) fp32 -> E4M3 codes (rows, cols), scales (ceil(rows/128), ceil(cols/128)) fp32."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    scale = torch.ones(br, bc, dtype=torch.float32)
    codes = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = blk.abs().max()
            s = amax / E4M3_MAX if amax > 0 else torch.tensor(1.0)
            scale[i, j] = s
            codes[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (blk / s).to(torch.float8_e4m3fn)
    return codes, scale


def dequantize(codes, scale):
    rows, cols = codes.shape
    s = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return codes.float() * s


def main():
    torch.manual_seed(0)
    shutil.rmtree(DST, ignore_errors=True)
    os.makedirs(DST)
    state = load_file(os.path.join(SRC, "model.safetensors"))
    out, deq, quantized = {}, {}, 0
    for name, t in state.items():
        if name.endswith(".weight") and name.split(".")[-2] in PROJ:
            codes, scale = quantize_blocks(t.float())
            out[name], out[name + "_scale_inv"] = codes, scale
            deq[name] = dequantize(codes, scale)
            quantized += 1
        else:
            out[name] = t
    save_file(out, os.path.join(DST, "model.safetensors"), metadata={"format": "pt"})

    cfg = json.load(open(os.path.join(SRC, "config.json")))
    not_converted = ["lm_head"] + [f"model.layers.{l}.mlp.gate" for l in range(cfg["num_hidden_layers"])]
    cfg["quantization_config"] = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                                      weight_block_size=[BLOCK, BLOCK], modules_to_not_convert=not_converted)
    json.dump(cfg, open(os.path.join(DST, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(SRC, "tokens.npy"), os.path.join(DST, "tokens.npy"))

    # the reference: qwen3_moe16 in fp32 with the dequantized projections in place
    model = Qwen3MoeForCausalLM.from_pretrained(SRC, dtype=torch.float32, attn_implementation="eager").eval()
    sd = model.state_dict()
    with torch.no_grad():
        for name, w in deq.items():
            if name in sd:
                sd[name].copy_(w)
            else:  # transformers 5.x holds a layer's experts as 3D tensors (gate_up_proj, down_proj)
                layer, e, proj = name.split(".")[2], int(name.split(".")[5]), name.split(".")[6]
                pre = f"model.layers.{layer}.mlp.experts."
                F = w.shape[0] if proj != "down_proj" else w.shape[1]
                if proj == "gate_proj":
                    sd[pre + "gate_up_proj"][e, :F].copy_(w)
                elif proj == "up_proj":
                    sd[pre + "gate_up_proj"][e, F:].copy_(w)
                else:
                    sd[pre + "down_proj"][e].copy_(w)
    tokens = np.load(os.path.join(DST, "tokens.npy"))
    with torch.no_grad():
        logits = np.stack([model(torch.tensor(r, dtype=torch.long)[None]).logits[0].float().numpy() for r in tokens])
        ref = np.load(os.path.join(SRC, "logits.npy"))
    np.save(os.path.join(DST, "logits.npy"), logits.astype(np.float32))
    rel = np.linalg.norm(logits - ref) / np.linalg.norm(ref)
    print(f"qwen3_moe_fp8: {quantized} projections as E4M3 + weight_scale_inv; logits of the dequantized model "
          f"{rel:.3e} (relative L2) from the bf16 ones")
    assert 1e-3 < rel < 0.2, "the FP8 codes should change the logits by about the FP8 error"


if __name__ == "__main__":
    main()
