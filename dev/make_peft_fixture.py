"""Make the PEFT LoRA fixtures the C tests compare lora.c with (an independent oracle).

peft attaches a LoRA adapter (r=4, alpha=8, all seven projections) to a tiny fixture
checkpoint (test/fixtures/qwen3, mistral or gemma3; qwen3_moe with the attention's four
projections alone, what lora.c adapts on Qwen3 MoE), gives every A and B seeded random
values (peft initialises B to zero, which would test nothing), saves the adapter
with save_pretrained (adapter_model.safetensors + adapter_config.json) into
test/fixtures/peft/<arch>_lora/, and writes the fp32 logits of the fixture's token
rows with the adapter applied to test/fixtures/peft/lora_logits.npy (qwen3; the others
<arch>_lora_logits.npy), (B, T, V).

    python3 dev/make_peft_fixture.py [--arch qwen3|mistral|gemma3|qwen3_moe]   # from the repository root

It also checks the other direction when given an adapter the C code saved:

    python3 dev/make_peft_fixture.py --arch A --check DIR   # DIR: an adapter written by lora_save_peft
"""
import argparse
import os

import numpy as np
import torch

OUT = "test/fixtures/peft"
BASE = "test/fixtures/qwen3"  # set by --arch
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_model():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32, attn_implementation="eager").eval()


def logits_of(model, tokens):
    with torch.no_grad():
        return np.stack([model(torch.tensor(row[None], dtype=torch.long)).logits[0].numpy() for row in tokens])


def make():
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(7)
    targets = TARGETS[:4] if ARCH == "qwen3_moe" else TARGETS
    model = get_peft_model(base_model(), LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    d = os.path.join(OUT, ARCH + "_lora")
    model.save_pretrained(d)
    if os.path.exists(os.path.join(d, "README.md")):  # peft's model card: not a fixture
        os.remove(os.path.join(d, "README.md"))
    tokens = np.load(os.path.join(BASE, "tokens.npy"))
    lg = logits_of(model.eval(), tokens).astype(np.float32)
    np.save(LOGITS, lg)
    base = logits_of(base_model(), tokens)
    print("saved", d, "logits", lg.shape, "max |logit|", np.abs(lg).max(), "max change from base", np.abs(lg - base).max())


def check(adapter_dir):
    from peft import PeftModel
    model = PeftModel.from_pretrained(base_model(), adapter_dir).eval()
    tokens = np.load(os.path.join(BASE, "tokens.npy"))
    ref = np.load(LOGITS)
    lg = logits_of(model, tokens)
    err = np.abs(lg - ref).max()
    print(f"peft loaded {adapter_dir}: max |logit - fixture| = {err:.3g} (max |logit| {np.abs(ref).max():.3g})")
    assert err <= 1e-4 * np.abs(ref).max(), "the adapter written by C does not reproduce the fixture in peft"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", help="adapter directory written by the C code")
    ap.add_argument("--arch", default="qwen3", choices=["qwen3", "mistral", "gemma3", "qwen3_moe"])
    a = ap.parse_args()
    ARCH, BASE = a.arch, "test/fixtures/" + a.arch
    LOGITS = os.path.join(OUT, "lora_logits.npy" if ARCH == "qwen3" else ARCH + "_lora_logits.npy")
    check(a.check) if a.check else make()
