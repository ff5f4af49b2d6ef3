#!/usr/bin/env python3
"""Make test/fixtures/peft/qwen3_moe_experts_lora: a PEFT LoRA adapter on Qwen3 MoE's experts, and check
what PEFT computes for it against the per-expert formula written out here.

transformers 5.x holds a sparse layer's experts as two 3-D parameters (Qwen3MoeExperts), fused on load
from the checkpoint's per-expert mlp.experts.N.{gate,up,down}_proj.weight:
  mlp.experts.gate_up_proj (E, 2F, C)   rows [0, F) expert e's gate_proj, rows [F, 2F) its up_proj
  mlp.experts.down_proj    (E, C, F)
PEFT reaches them only through LoraConfig.target_parameters (its ParamWrapper). For a parameter (E, out, in)
it keeps lora_A (E r, in) and lora_B (out, r E), and expert e's delta weight is
  delta_e[o, i] = alpha / r * sum_k lora_B[o, k E + e] * lora_A[e r + k, i]
(A's rows expert-major, B's columns rank-major: PEFT's reshape(E, r, in) and reshape(out, r, E)). Both
parameters of one module are wrapped one inside the other, in the module's parameter order, so the saved keys
are (gate_up_proj the inner one):
  base_model.model.model.layers.L.mlp.experts.base_layer.lora_{A,B}.weight   gate_up_proj
  base_model.model.model.layers.L.mlp.experts.lora_{A,B}.weight              down_proj
(a single targeted parameter gets the second, unnested names), and adapter_config.json lists
target_parameters. The dense layers among the sparse ones (mlp_only_layers) have no such parameter.

This script attaches r=4, alpha=8 LoRA to test/fixtures/qwen3_moe's attention (target_modules q, k, v, o)
and experts (target_parameters mlp.experts.gate_up_proj, mlp.experts.down_proj), gives every A and B seeded
random values (PEFT starts B at zero, which would test nothing), saves it with save_pretrained, writes the
fp32 logits of the fixture's token rows with the adapter applied to
test/fixtures/peft/qwen3_moe_experts_lora_logits.npy (B, T, V), and asserts that PeftModel.from_pretrained
and the formula above (the deltas added to a plain transformers model's weights) both give those logits.

    python3 dev/make_moe_expert_lora_fixture.py   # from the repository root (transformers 5.25, peft 0.21.2)

It also checks the other direction, an adapter lora_save_peft wrote (e.g. the fixture loaded and saved again):

    python3 dev/make_moe_expert_lora_fixture.py --check DIR
"""
import argparse
import os
import warnings

import numpy as np
import torch

BASE = "test/fixtures/qwen3_moe"
OUT = "test/fixtures/peft/qwen3_moe_experts_lora"
LOGITS = "test/fixtures/peft/qwen3_moe_experts_lora_logits.npy"
R, ALPHA = 4, 8


def base_model():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32, attn_implementation="eager").eval()


def logits_of(model, tokens):
    with torch.no_grad():
        return np.stack([model(torch.tensor(row[None], dtype=torch.long)).logits[0].numpy() for row in tokens])


def delta(A, B, E):
    """Expert e's delta (E, out, in) from lora_A (E r, in) and lora_B (out, r E), as the docstring says."""
    out = torch.empty(E, B.shape[0], A.shape[1], dtype=torch.float64)
    for e in range(E):
        Ae = A[e * R:(e + 1) * R].double()           # (r, in)
        Be = B[:, [k * E + e for k in range(R)]].double()  # (out, r)
        out[e] = ALPHA / R * Be @ Ae
    return out


def merged_by_formula(tensors):
    """A plain transformers model with every adapter of the saved tensors added to its weights by hand."""
    model = base_model()
    E = model.config.num_experts
    pre = "base_model.model."
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj"):
                mod = name.rsplit(".", 1)[0]
                key = pre + mod + (".base_layer" if name.endswith("gate_up_proj") else "")
                p += delta(tensors[key + ".lora_A.weight"], tensors[key + ".lora_B.weight"], E).float()
            elif name.endswith("_proj.weight") and ".self_attn." in name:
                key = pre + name[:-len(".weight")]
                p += (ALPHA / R * tensors[key + ".lora_B.weight"].double() @ tensors[key + ".lora_A.weight"].double()).float()
    return model


def main():
    warnings.filterwarnings("ignore")
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    torch.manual_seed(11)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                     target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    model = get_peft_model(base_model(), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(OUT)
    if os.path.exists(os.path.join(OUT, "README.md")):  # peft's model card: not a fixture
        os.remove(os.path.join(OUT, "README.md"))
    tokens = np.load(os.path.join(BASE, "tokens.npy"))
    lg = logits_of(model.eval(), tokens).astype(np.float32)
    np.save(LOGITS, lg)
    base = logits_of(base_model(), tokens)
    loaded = logits_of(PeftModel.from_pretrained(base_model(), OUT).eval(), tokens)
    tensors = load_file(os.path.join(OUT, "adapter_model.safetensors"))
    by_hand = logits_of(merged_by_formula(tensors), tokens)
    mx = np.abs(lg).max()
    e1, e2 = np.abs(loaded - lg).max(), np.abs(by_hand - lg).max()
    print(f"saved {OUT}: {len(tensors)} tensors, logits {lg.shape}, max |logit| {mx:.3g}, max change from the base "
          f"{np.abs(lg - base).max():.3g}; PeftModel.from_pretrained differs by {e1:.3g}, the per-expert formula by {e2:.3g}")
    assert e1 <= 1e-6 * mx and e2 <= 1e-5 * mx


def check(adapter_dir):
    warnings.filterwarnings("ignore")
    from peft import PeftModel
    tokens = np.load(os.path.join(BASE, "tokens.npy"))
    ref = np.load(LOGITS)
    lg = logits_of(PeftModel.from_pretrained(base_model(), adapter_dir).eval(), tokens)
    err = np.abs(lg - ref).max()
    print(f"peft loaded {adapter_dir}: max |logit - fixture| = {err:.3g} (max |logit| {np.abs(ref).max():.3g})")
    assert err <= 1e-5 * np.abs(ref).max(), "the adapter written by C does not reproduce the fixture in peft"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", help="adapter directory written by lora_save_peft")
    a = ap.parse_args()
    check(a.check) if a.check else main()
