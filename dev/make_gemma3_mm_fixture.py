#!/usr/bin/env python3
"""Make the fixtures of Gemma 3 as published: the multimodal checkpoint (Gemma3ForConditionalGeneration,
model_type "gemma3"), whose text model the C code loads, adapts and writes back whole.

Writes, from the repository root (python3 dev/make_gemma3_mm_fixture.py; CPU torch, transformers 5.x,
peft, safetensors, numpy):

  test/fixtures/gemma3_mm/       a tiny random Gemma3ForConditionalGeneration as save_pretrained writes it
                                 (transformers 4.x tensor names: language_model.model.*, vision_tower.*,
                                 multi_modal_projector.*; the text config under text_config), bfloat16,
                                 and what its own forward computes on text, in the files of
                                 dev/make_fixtures.py (tokens.npy, logits.npy, generate.npy, inv_freq.npy,
                                 inv_freq_local.npy), so test_model's checks run on it as on the others
  test/fixtures/gemma3_mm_v5/    the same weights under transformers 5.x's names (model.language_model.*,
                                 model.vision_tower.*, ...: the model's own parameter names, which
                                 other tools save), config.json alike; transformers is checked to load it to
                                 the same logits
  test/fixtures/peft/gemma3_mm_lora/   a LoRA adapter peft makes on the multimodal model (r 4, alpha 8, every
                                 projection of the language model only: target_modules a regular expression,
                                 as a list of names would adapt the vision tower's q/k/v too), A and B seeded
                                 random; gemma3_mm_lora_logits.npy its logits on tokens.npy (2, 24, 320)

The text model: vocab 320, hidden 64, intermediate 160, 3 layers (sliding, full, sliding; window 6),
4 heads of 32, 1 KV head, query_pre_attn_scalar 24, tied, full layers' RoPE theta 1e6 linear x4,
sliding layers' theta 1e4; bos 1, eos 2, pad 0, boi 317, eoi 318, image 319 (ids the text never uses:
tokens.npy avoids them). The vision tower: SigLIP of 1 layer, hidden 16, 28x28 images of 14x14 patches,
4 tokens an image. The logits are the multimodal class's forward on input_ids alone (no pixel_values),
fp32 eager attention, each row alone.

The other directions of the round trips:
  python3 dev/make_gemma3_mm_fixture.py --check-adapter
        test/fixtures/peft/gemma3_mm_c_lora, the adapter lora_save_peft writes for gemma3_mm (test_lora's
        test_peft_gemma3_multimodal makes it, seeded, and checks that it still writes it byte for byte): peft
        loads it on Gemma3ForConditionalGeneration, and its logits there go to gemma3_mm_c_lora_logits.npy,
        which the same test compares with the C logits
  python3 dev/make_gemma3_mm_fixture.py --check-export DIR    a ./export of gemma3_mm + its adapter: loads
        as Gemma3ForConditionalGeneration, vision tensors byte-equal to the base's, text logits within 1e-5
        (relative to the largest logit) of gemma3_mm_lora_logits.npy
  python3 dev/make_gemma3_mm_fixture.py --check-checkpoint DIR   a full fine-tune of gemma3_mm (./train_sft's
        checkpoint-N): loads as Gemma3ForConditionalGeneration, vision tensors byte-equal to the base's, text
        logits within 1e-5 of what ./generate --device cpu --dump_logits computes on it (built beforehand)
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import PROMPT_LEN, greedy, greedy_margins, row_logits  # noqa: E402

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures")
BASE = os.path.join(FIX, "gemma3_mm")
BASE_V5 = os.path.join(FIX, "gemma3_mm_v5")
ADAPTER = os.path.join(FIX, "peft", "gemma3_mm_lora")
ADAPTER_LOGITS = os.path.join(FIX, "peft", "gemma3_mm_lora_logits.npy")
SEED = int(os.environ.get("GEMMA3_MM_SEED", 1008))  # chosen (by trying 1000..) for a wide top-2 margin on a varied greedy path
BOI, EOI, IMAGE = 317, 318, 319
# PEFT fullmatches a string target_modules against each module's name: the language model's projections only
TEXT_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def config():
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig
    tc = Gemma3TextConfig(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
                          rms_norm_eps=1e-6, query_pre_attn_scalar=24, sliding_window=6,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                          tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                          rope_parameters=dict(
                              full_attention=dict(rope_type="linear", factor=4.0, rope_theta=1000000.0),
                              sliding_attention=dict(rope_type="default", rope_theta=10000.0)))
    vc = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                            image_size=28, patch_size=14)
    return Gemma3Config(text_config=tc, vision_config=vc, mm_tokens_per_image=4, boi_token_index=BOI,
                        eoi_token_index=EOI, image_token_index=IMAGE)


def init_weights(model):
    """Seeded values at a visible scale, by dev/make_fixtures.py's rules: Gemma's norms 0.2 N(0,1) (it multiplies by
    1 + w), SigLIP's LayerNorms 1 + 0.2 N(0,1), biases 0.1 N(0,1), embeddings 0.05 N(0,1) (they enter times
    sqrt(hidden) = 8), every other matrix N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith(".bias"):
                p.copy_(0.1 * z)
            elif p.ndim == 1:
                p.copy_((1.0 if "vision_tower" in name else 0.0) + 0.2 * z)
            elif "embed_tokens" in name:
                p.copy_(0.05 * z)
            else:
                p.copy_(z / np.sqrt(p[0].numel()))


def load(path):
    from transformers import Gemma3ForConditionalGeneration
    return Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def logits_of(model, tokens):
    return np.stack([row_logits(model, row.tolist()).numpy() for row in tokens]).astype(np.float32)


def tensors(path):
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# transformers 4.x names (as save_pretrained writes them) -> 5.x names (the modules' own)
def v5_name(k):
    for old, new in (("language_model.model.", "model.language_model."), ("vision_tower.", "model.vision_tower."),
                     ("multi_modal_projector.", "model.multi_modal_projector."), ("language_model.lm_head.", "lm_head.")):
        if k.startswith(old):
            return new + k[len(old):]
    raise SystemExit(f"unexpected tensor name {k}")


def make():
    from transformers import Gemma3ForConditionalGeneration
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    model = Gemma3ForConditionalGeneration._from_config(config(), attn_implementation="eager")
    init_weights(model)
    model = model.to(torch.bfloat16)
    shutil.rmtree(BASE, ignore_errors=True)
    model.save_pretrained(BASE)
    ref = load(BASE)

    rng = np.random.default_rng(SEED)
    text_ids = np.setdiff1d(np.arange(320), [BOI, EOI, IMAGE])
    tokens = rng.choice(text_ids, size=(2, 24)).astype(np.int32)
    logits = logits_of(ref, tokens)
    prompt = tokens[0, :PROMPT_LEN].tolist()
    new = greedy(ref, prompt, 16).astype(np.int32)
    gap, rel = greedy_margins(ref, prompt, new)
    assert rel.min() > 1e-3 and len(set(new.tolist())) >= 5 and 2 not in new, "greedy path: change SEED"
    rot = ref.model.language_model.rotary_emb
    for name, a in (("tokens", tokens), ("logits", logits), ("generate", new),
                    ("inv_freq", rot.full_attention_inv_freq.float().numpy()),
                    ("inv_freq_local", rot.sliding_attention_inv_freq.float().numpy())):
        np.save(os.path.join(BASE, name + ".npy"), a)
    names = sorted(tensors(BASE))
    print(f"gemma3_mm: {len(names)} tensors ({sum(n.startswith('language_model.') for n in names)} of the text model), "
          f"max |logit| {np.abs(logits).max():.3f}, greedy {prompt} -> {new.tolist()}, min rel margin {rel.min():.2e}")

    # the 5.x layout: the same tensors renamed
    shutil.rmtree(BASE_V5, ignore_errors=True)
    os.makedirs(BASE_V5)
    save_file({v5_name(k): v for k, v in tensors(BASE).items()}, os.path.join(BASE_V5, "model.safetensors"),
              metadata={"format": "pt"})
    for f in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(BASE, f), BASE_V5)
    err = np.abs(logits_of(load(BASE_V5), tokens) - logits).max()
    assert err == 0, f"the 5.x layout loads to other logits ({err})"
    print("gemma3_mm_v5: transformers loads it to the same logits")

    # the PEFT adapter
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(7)
    pm = get_peft_model(load(BASE), LoraConfig(r=4, lora_alpha=8, target_modules=TEXT_TARGETS, lora_dropout=0.0))
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                assert "language_model" in name, name
                p.copy_(torch.randn_like(p) * 0.2)
    shutil.rmtree(ADAPTER, ignore_errors=True)
    pm.save_pretrained(ADAPTER)
    if os.path.exists(os.path.join(ADAPTER, "README.md")):  # peft's model card: not a fixture
        os.remove(os.path.join(ADAPTER, "README.md"))
    lg = logits_of(pm.eval(), tokens)
    np.save(ADAPTER_LOGITS, lg)
    with safe_open(os.path.join(ADAPTER, "adapter_model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    print(f"peft adapter: {len(keys)} tensors (e.g. {keys[0]}), max change of a logit {np.abs(lg - logits).max():.3f}")


def check_adapter():
    from peft import PeftModel
    d = os.path.join(FIX, "peft", "gemma3_mm_c_lora")
    model = PeftModel.from_pretrained(load(BASE), d).eval()
    names = [n for n, _ in model.named_parameters() if "lora_A" in n]
    assert names and all("language_model" in n for n in names), "peft adapted modules outside the language model"
    tokens = np.load(os.path.join(BASE, "tokens.npy"))
    lg = logits_of(model, tokens)
    change = np.abs(lg - np.load(os.path.join(BASE, "logits.npy"))).max()
    assert change > 0.1, "the adapter changes nothing"
    np.save(os.path.join(FIX, "peft", "gemma3_mm_c_lora_logits.npy"), lg)
    print(f"peft loaded {d} on Gemma3ForConditionalGeneration: {len(names)} adapted projections, max change of a "
          f"logit {change:.3f}; its logits saved for test_lora")


def check_whole(d):
    """d is Gemma3ForConditionalGeneration again: its config, every tensor name of the base, the vision tower and
    projector byte for byte; returns the model transformers loads from it"""
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["model_type"] == "gemma3" and cfg["architectures"] == ["Gemma3ForConditionalGeneration"], cfg
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.startswith("model") and fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})
    base = tensors(BASE)
    vision = [k for k in base if not k.startswith("language_model.")]
    assert set(out) == set(base), f"names differ: {sorted(set(out) ^ set(base))[:4]}"
    for k in vision:
        assert out[k].dtype == base[k].dtype and torch.equal(out[k], base[k]), f"{k} changed"
    model = load(d)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    print(f"{d}: Gemma3ForConditionalGeneration, {len(vision)} vision/projector tensors byte-equal to the base's")
    return model


def check_export(d):
    model = check_whole(d)
    tokens = np.load(os.path.join(BASE, "tokens.npy"))
    ref = np.load(ADAPTER_LOGITS)
    lg = logits_of(model, tokens)
    err, mx = np.abs(lg - ref).max(), np.abs(ref).max()
    print(f"export {d}: text logits max |diff| from peft's unmerged {err:.3g} (max |logit| {mx:.3g}, ratio {err / mx:.3g})")
    assert err <= 1e-5 * mx, "the merged export's logits differ"


def check_checkpoint(d):
    import subprocess
    import tempfile
    model = check_whole(d)
    ids = np.load(os.path.join(BASE, "tokens.npy"))[0]
    with tempfile.TemporaryDirectory() as t:
        out = os.path.join(t, "logits.npy")
        subprocess.run(["./generate", "--device", "cpu", "--model", d, "--load_in_fp8", "off", "--tokens",
                        " ".join(map(str, ids)), "--dump_logits", out], check=True, stdout=subprocess.DEVNULL)
        c = np.load(out)
    lg = row_logits(model, ids.tolist()).numpy()
    err, mx = np.abs(lg - c).max(), np.abs(lg).max()
    print(f"checkpoint {d}: text logits, transformers vs ./generate: max |diff| {err:.3g} (max |logit| {mx:.3g}, "
          f"ratio {err / mx:.3g})")
    assert err <= 1e-5 * mx, "the checkpoint's logits differ"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-adapter", action="store_true")
    ap.add_argument("--check-export", metavar="DIR")
    ap.add_argument("--check-checkpoint", metavar="DIR")
    a = ap.parse_args()
    if a.check_adapter:
        check_adapter()
    elif a.check_export:
        check_export(a.check_export)
    elif a.check_checkpoint:
        check_checkpoint(a.check_checkpoint)
    else:
        make()
