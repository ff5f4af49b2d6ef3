"""dev/check_export.py: ./export's merged checkpoints, loaded by Hugging Face transformers, against the
logits the C program computes. Development only (torch, transformers, peft, safetensors, numpy; no
internet): run on the GPU machine, from the repository root, after building ./export and ./generate:

    make NO_CUDA=1 export generate && python3 dev/check_export.py
    python3 dev/check_export.py --model BASE --lora ADAPTER     (a checkpoint of your own; else a random one)

With no --model it makes a random Qwen3 whose every projection is a multiple of 128 wide (hidden 256,
intermediate 512, 4 heads of 64, 2 KV heads: the FP8 block kernels of transformers and vLLM want whole
128x128 blocks) in bfloat16, and a random LoRA adapter through peft (r 8, alpha 16, every projection,
B not zero). Then:
  1. ./export --dtype bf16 and --dtype fp8 of base + adapter;
  2. the C logits of 32 fixed ids, ./generate --device cpu --dump_logits (fp32):
       ref   base + adapter applied unmerged, --load_in_fp8 off            (the truth of the merge)
       c8    the FP8 export, codes and scales as they are, --load_in_fp8 block  (the project's FP8 block forward)
       c8d   the FP8 export dequantized, --load_in_fp8 off
  3. transformers on the exports, each compared by relative L2 over all logits:
       bf16 export in float32           vs ref  tol 4 sqrt(chain) 2^-9.8 (chain: tensors a logit passes
                                                through; every weight rounded once to bf16: test_export.c derives it)
       transformers + peft, unmerged     vs ref  tol 1e-5 (the same fp32 computation: the adapter itself)
       fp8 export dequantized, float32   vs c8d  tol 1e-5 (the same weights: the codes and scales are read right)
       fp8 export, transformers' loader  vs c8d  tol 1e-5: transformers reads the FP8 format itself
         (FineGrainedFP8Config(dequantize=True): quantization_config, codes, weight_scale_inv), fp32
       fp8 export, transformers' FP8      vs c8   tol 2^-5 + q: transformers runs FineGrainedFP8 (weights E4M3 in
         (FP8Linear, bf16 activations           128x128 blocks, activations quantized per 1x128 group at run
          on the GPU)                           time: the project's semantics) on bf16 activations; a bf16 rounding
                                                that moves an activation across an E4M3 rounding boundary moves it
                                                by an E4M3 ulp, so the two may differ by bf16's allowance (2^-5, as
                                                test/gpu_models.cu) plus q = rel L2 (c8, c8d), FP8's own effect
     If the installed transformers cannot run FP8 block on this GPU, that row says so and is skipped; the
     dequantized row still checks the checkpoint.
Prints one line per check and, last, "check_export: all N checks passed" (exit 0), or the failures (exit 1).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def make_random_model(d):
    """A random bf16 Qwen3 with 128-multiple projections, and a random peft adapter (B not zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1234)
    cfg = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=2)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "embed" in name or "lm_head" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))
    base = os.path.join(d, "base")
    model.to(torch.bfloat16).save_pretrained(base)
    model = Qwen3ForCausalLM.from_pretrained(base, dtype=torch.float32)
    lcfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, init_lora_weights=False,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():  # init_lora_weights=False draws B too; scale it so the adapter moves the logits by ~10%
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.mul_(0.3)
    lora = os.path.join(d, "lora")
    pm.save_pretrained(lora)
    return base, lora


def c_logits(out, model, ids, gran, lora=None):
    cmd = ["./generate", "--device", "cpu", "--model", model, "--load_in_fp8", gran, "--tokens", " ".join(map(str, ids)),
           "--dump_logits", out]
    if lora:
        cmd += ["--lora", lora]
    run(cmd)
    return np.load(out).astype(np.float64)


def hf_logits(model, ids, device="cpu"):
    with torch.no_grad():
        x = torch.tensor([ids], device=device)
        return model(x).logits[0].float().cpu().numpy().astype(np.float64)


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def dequantized_fp8_model(d):
    """The FP8 export with every projection dequantized (codes * weight_scale_inv per 128x128 block) in
    float32, built by hand from the safetensors: independent of transformers' FP8 support."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    sd = {}
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    for f in files:
        sd.update(load_file(os.path.join(d, f)))
    out = {}
    for k, v in sd.items():
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            s = sd[k + "_scale_inv"].float()
            rows, cols = v.shape
            s = s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
            v = v.float() * s
        out[k] = v.float()
    cfg = AutoConfig.from_pretrained(d)
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    missing, unexpected = model.load_state_dict(out, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    if missing:
        model.tie_weights()
    return model.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="base checkpoint (default: a random Qwen3 made here)")
    ap.add_argument("--lora", help="PEFT adapter (default: a random one made here)")
    ap.add_argument("--workdir", help="where to write (default: a temporary directory)")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM

    d = a.workdir or tempfile.mkdtemp(prefix="check_export_")
    os.makedirs(d, exist_ok=True)
    base, lora = (a.model, a.lora) if a.model else make_random_model(d)
    bf16, fp8 = os.path.join(d, "export-bf16"), os.path.join(d, "export-fp8")
    lora_args = ["--lora", lora] if lora else []
    run(["./export", "--model", base, *lora_args, "--output_dir", bf16, "--dtype", "bf16", "--overwrite"])
    run(["./export", "--model", base, *lora_args, "--output_dir", fp8, "--dtype", "fp8", "--overwrite"])
    cfg = json.load(open(os.path.join(base, "config.json")))
    rng = np.random.default_rng(7)
    ids = [int(x) for x in rng.integers(0, cfg["vocab_size"], 32)]
    ref = c_logits(os.path.join(d, "ref.npy"), base, ids, "off", lora)
    c8 = c_logits(os.path.join(d, "c8.npy"), fp8, ids, "block")
    c8d = c_logits(os.path.join(d, "c8d.npy"), fp8, ids, "off")

    results = []

    def check(what, got, want, tol):
        e = rel_l2(got, want)
        ok = e <= tol
        results.append(ok)
        print(f"  {'ok  ' if ok else 'FAIL'} {what:58s} rel L2 {e:.2e} (tol {tol:.2e}), max |diff| {np.abs(got - want).max():.3g}"
              f" of max |logit| {np.abs(want).max():.3g}", flush=True)

    L = cfg["num_hidden_layers"]
    chain = L * (4 + 7) + 2 + (0 if cfg.get("tie_word_embeddings") else 1)
    print(f"checks (logits of {len(ids)} ids, {cfg.get('model_type')}, {L} layers):")
    m = AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    check("bf16 export, transformers fp32  vs C base + adapter", hf_logits(m, ids), ref, 4 * math.sqrt(chain) * 2 ** -9.8)
    if lora:
        from peft import PeftModel

        pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), lora).eval()
        check("transformers + peft, unmerged   vs C base + adapter", hf_logits(pm, ids), ref, 1e-5)
    m = dequantized_fp8_model(fp8)
    check("fp8 export dequantized, fp32    vs C --load_in_fp8 off", hf_logits(m, ids), c8d, 1e-5)
    # transformers' own reading of the FP8 format (quantization_config, E4M3 codes, weight_scale_inv per
    # 128x128 block): its FineGrainedFP8 loader with dequantize=True, which needs no GPU kernel
    from transformers import FineGrainedFP8Config

    m = AutoModelForCausalLM.from_pretrained(fp8, dtype=torch.float32,
                                             quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
    check("fp8 export, transformers' FP8 loader (dequantize) vs C off", hf_logits(m, ids), c8d, 1e-5)
    q = rel_l2(c8, c8d)
    print(f"  (FP8's own effect on these logits: q = rel L2 (C block, C dequantized) = {q:.3e})")
    try:
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU")
        m = AutoModelForCausalLM.from_pretrained(fp8, dtype=torch.bfloat16, device_map="cuda").eval()
        lin = m.model.layers[0].self_attn.q_proj
        kind = f"{type(lin).__name__}, weight {lin.weight.dtype}"
        if lin.weight.dtype != torch.float8_e4m3fn:
            raise RuntimeError(f"transformers did not keep the weights in FP8 ({kind})")
        got = hf_logits(m, ids, "cuda")
    except Exception as e:  # noqa: BLE001 - any failure of transformers' FP8 path is reported, not fatal
        print(f"  SKIP fp8 export, transformers' FP8 block on the GPU: it could not run here ({type(e).__name__}: {e});"
              " the dequantized row above checked the checkpoint")
    else:
        check(f"fp8 export, transformers FP8 ({kind}) vs C --load_in_fp8 block", got, c8, 2 ** -5 + q)
    n = len(results)
    if all(results):
        print(f"check_export: all {n} checks passed ({d})")
        return 0
    print(f"check_export: {n - sum(results)} of {n} checks FAILED ({d})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
