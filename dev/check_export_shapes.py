"""dev/check_export_shapes.py: ./export --dtype fp8 of models whose widths are not whole 128x128 blocks,
loaded by transformers on the CPU. Development only (torch, transformers, safetensors, numpy; run on
the GPU machine, whose Python has them), from the repository root after building ./export and ./generate:

    make NO_CUDA=1 export generate && python3 dev/check_export_shapes.py

Two random bf16 Llamas with 2 layers (transformers' LlamaForCausalLM, tied embeddings, vocabulary 512):
  smollm   SmolLM2-135M's widths: hidden 576, 9 / 3 heads of 64, intermediate 1536. 576 is 4.5 x 128, so
           no projection has whole 128x128 blocks: the export is all BF16, with no quantization_config.
  mixed    hidden 640 (5 x 128), 10 / 2 heads of 64, intermediate 1600 (12.5 x 128): q, k, v and o in
           FP8 blocks, gate, up and down in BF16, named in modules_to_not_convert.
For each, transformers loads the export (the mixed one through its FineGrainedFP8 loader with
dequantize=True, which reads quantization_config, the E4M3 codes and weight_scale_inv, and must leave
the modules_to_not_convert as they are), and its fp32 logits of 32 fixed ids are compared with
./generate --load_in_fp8 off of the same export (codes times scales, the rest as stored): the same
weights, so within fp32's error (1e-5 relative L2). Also the export's logits against the original
model's through ./generate --load_in_fp8 block, within FP8's effect on them (reported).
Prints one line per check, and "check_export_shapes: all N checks passed" (exit 0) or the failures.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_export import c_logits, hf_logits, rel_l2, run  # noqa: E402


def make_llama(d, hidden, heads, kv_heads, inter):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(99)
    cfg = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=64,
                      max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=2)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "embed" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / np.sqrt(p.shape[1]))
    base = os.path.join(d, "base")
    model.to(torch.bfloat16).save_pretrained(base)
    return base


def main():
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    fails, n = [], 0
    ids = [(7 * i + 3) % 512 for i in range(32)]
    cases = [("smollm", 576, 9, 3, 1536), ("mixed", 640, 10, 2, 1600)]
    for name, hidden, heads, kvh, inter in cases:
        d = tempfile.mkdtemp(prefix=f"export_{name}_")
        base = make_llama(d, hidden, heads, kvh, inter)
        out = os.path.join(d, "fp8")
        r = subprocess.run(["./export", "--model", base, "--output_dir", out, "--dtype", "fp8"], capture_output=True, text=True)
        print(r.stderr.strip())
        if r.returncode:
            fails.append(f"{name}: ./export failed")
            continue
        cfg = json.load(open(os.path.join(out, "config.json")))
        q = cfg.get("quantization_config")
        skip = q["modules_to_not_convert"] if q else None
        print(f"{name}: quantization_config {'absent' if q is None else 'with ' + str(len(skip)) + ' modules_to_not_convert'}")
        if q:
            m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                     quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
        else:
            m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        kinds = sorted({type(mod).__name__ for mod in m.modules() if "Linear" in type(mod).__name__})
        hf = hf_logits(m, ids)
        c_off = c_logits(os.path.join(d, "c_off.npy"), out, ids, "off")
        c_fp8 = c_logits(os.path.join(d, "c_fp8.npy"), base, ids, "block")
        e = rel_l2(hf, c_off)
        n += 1
        ok = e <= 1e-5
        print(f"{'ok  ' if ok else 'FAIL'} {name}: transformers on the export ({', '.join(kinds)}) vs ./generate "
              f"--load_in_fp8 off of it: rel L2 {e:.2e} (tol 1e-5); the export vs the base at --load_in_fp8 block: "
              f"{rel_l2(c_off, c_fp8):.2e}")
        if not ok:
            fails.append(name)
    if fails:
        print("check_export_shapes: FAILED:", ", ".join(fails))
        sys.exit(1)
    print(f"check_export_shapes: all {n} checks passed")


if __name__ == "__main__":
    main()
