#!/usr/bin/env python3
"""Make the Hugging Face reference fixtures the C model is tested against.

For each of seven tiny random-weight models (Qwen3, Qwen2, Llama 3, Mistral,
Gemma 3 text, two Qwen3 MoE) this writes, under test/fixtures/<name>/:

  config.json, *.safetensors   the checkpoint, written by transformers'
                               save_pretrained (what the C loader must read)
  tokens.npy    int32 (2, 24)        seeded random token ids
  logits.npy    float32 (2, 24, V)   fp32 logits transformers computes for each
                                     row of tokens.npy, run on its own (batch 1)
  generate.npy  int32 (8,)           greedy continuation (8 new ids) of the first
                                     8 tokens of row 0
  inv_freq.npy  float32 (HD/2,)      the RoPE inverse frequencies transformers uses
                                     (Gemma 3: its full layers'; inv_freq_local.npy
                                     the sliding layers')

The models together cover what the C side must get right: an explicit
head_dim with NH*HD != hidden (Qwen3, Mistral, Gemma 3), q/k-norm (Qwen3, Gemma 3),
q/k/v biases (Qwen2), tied and untied embeddings, GQA, llama3 RoPE scaling (all
three branches of its formula), an intermediate size that is not a multiple of
128, checkpoints in float32, bfloat16 and float16, a checkpoint sharded over
several files; and sliding-window attention with a window (8, 6) well under the
24 tokens, so that both the full forward and the KV-cache decode (logits and the
greedy path, 16 tokens) run past it: on every layer (Mistral), on a mix of
sliding and full layers with their own RoPE bases and a linearly scaled one for
the full layers (Gemma 3), with Gemma's (1 + w) norms, sandwich norms, GeGLU,
embeddings times sqrt(hidden) and query_pre_attn_scalar != head_dim.
Qwen3 MoE (Qwen3MoeForCausalLM): 8 experts, top 2, norm_topk_prob, a dense layer
between two sparse ones by mlp_only_layers (qwen3_moe, float32); 16 experts, top 4,
not renormalized, every second layer sparse by decoder_sparse_step 2 (qwen3_moe16,
bfloat16). transformers 5.x holds the experts as 3D tensors (gate_up_proj, down_proj)
and saves them as published checkpoints have them, one tensor per expert and
projection (mlp.experts.E.gate_proj.weight, ...).

The weights are not transformers' default init (std 0.02 gives near-uniform
logits that hide bugs): every tensor is drawn from a seeded generator at a scale
where a transposed, swapped or ignored tensor changes the logits visibly. Each
model is saved in its target dtype and reloaded from disk in float32, so the
reference logits use exactly the rounded values the C loader will read.

Run from the repository root: python3 dev/make_fixtures.py [NAME ...]  (CPU is
enough; names pick some of the fixtures, the default is all of them).
"""
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GenerationConfig,
                          LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures")

# shapes shared by the three models
COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=160,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, rms_norm_eps=1e-6)

N_ROWS, N_TOKENS = 2, 24            # tokens.npy shape
PROMPT_LEN = 8                      # greedy generation check: NEW_TOKENS after the first 8 tokens
NEW_TOKENS = {"mistral": 16, "gemma3": 16, "qwen3_moe": 16, "qwen3_moe16": 16}  # past the sliding window (8, 6) by far; the others 8
MIN_REL_MARGIN = 1e-3               # top-2 logit gap along the greedy path, relative to the top logit
MIN_DISTINCT = 5                    # distinct ids the greedy path must have (a repeated token tests little)
# The seeds in model_specs() were chosen (by trying 1000..1049) for a wide
# top-2 margin, a varied greedy path and no eos id on it.

# llama3 RoPE scaling; original_max_position_embeddings is picked from these
# candidates (first one that exercises all three branches of the formula)
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
LLAMA3_ORIG_MAX_POS_CANDIDATES = [32, 64, 16, 128]


def llama3_branches(head_dim, theta, orig_max_pos, low_freq_factor, high_freq_factor):
    """Which branch of the llama3 formula each RoPE frequency takes:
    'high' (kept), 'low' (divided by factor) or 'mid' (smoothed)."""
    out = []
    for i in range(0, head_dim, 2):
        inv_freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / inv_freq
        if wavelen < orig_max_pos / high_freq_factor:
            out.append("high")
        elif wavelen > orig_max_pos / low_freq_factor:
            out.append("low")
        else:
            out.append("mid")
    return out


def pick_llama3_orig_max_pos(head_dim, theta):
    for orig in LLAMA3_ORIG_MAX_POS_CANDIDATES:
        b = llama3_branches(head_dim, theta, orig, LLAMA3_ROPE["low_freq_factor"], LLAMA3_ROPE["high_freq_factor"])
        if {"high", "mid", "low"} <= set(b):
            return orig, b
    raise SystemExit("no candidate original_max_position_embeddings exercises all three llama3 branches")


# Gemma 3: five layers, sliding and full mixed (not transformers' every-sixth pattern, so that two full
# layers sit among three sliding ones)
GEMMA3_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                      "full_attention"]


def model_specs():
    """(name, model class, config, saved dtype, max_shard_size, embedding std, seed) for each fixture.

    The tied Qwen3 uses a smaller embedding std: its embedding is also the
    lm_head, and at std 0.5 the token just read dominates its own logit
    (e.e = 64 * 0.25), so greedy decoding repeats one token and would not test
    that the decoder feeds back the right ids. Gemma 3 is tied too, and its
    embeddings enter the residual stream times sqrt(hidden) = 8: std 0.05."""
    llama_theta, llama_hd = 500000.0, 16
    orig, branches = pick_llama3_orig_max_pos(llama_hd, llama_theta)
    print(f"llama3 rope: original_max_position_embeddings={orig}, branch per frequency: {branches}")
    llama_rope = dict(LLAMA3_ROPE, rope_theta=llama_theta, original_max_position_embeddings=orig)
    return [
        ("qwen3", Qwen3ForCausalLM,
         Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True, bos_token_id=None, eos_token_id=2,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
         torch.float32, None, 0.2, 1021),
        ("qwen2", Qwen2ForCausalLM,
         Qwen2Config(**COMMON, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                     rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
         torch.bfloat16, None, 0.5, 1044),
        ("llama3", LlamaForCausalLM,
         LlamaConfig(**COMMON, head_dim=llama_hd, tie_word_embeddings=False, bos_token_id=1, eos_token_id=[2, 3],
                     rope_parameters=llama_rope),
         torch.float16, "100KB", 0.5, 1043),
        ("mistral", MistralForCausalLM,
         MistralConfig(**COMMON, head_dim=32, sliding_window=8, tie_word_embeddings=False, bos_token_id=1,
                       eos_token_id=2, rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
         torch.bfloat16, None, 0.5, 1000),
        ("gemma3", Gemma3ForCausalLM,
         Gemma3TextConfig(**dict(COMMON, num_hidden_layers=5, num_key_value_heads=1), head_dim=32,
                          query_pre_attn_scalar=24, sliding_window=6, layer_types=GEMMA3_LAYER_TYPES,
                          tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                          rope_parameters=dict(
                              full_attention=dict(rope_type="linear", factor=4.0, rope_theta=1000000.0),
                              sliding_attention=dict(rope_type="default", rope_theta=10000.0))),
         torch.float32, None, 0.05, 1007),
        ("qwen3_moe", Qwen3MoeForCausalLM,
         Qwen3MoeConfig(**dict(COMMON, num_hidden_layers=3), head_dim=32, num_experts=8, num_experts_per_tok=2,
                        moe_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1,
                        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
         torch.float32, None, 0.5, 1001),
        ("qwen3_moe16", Qwen3MoeForCausalLM,
         Qwen3MoeConfig(**COMMON, head_dim=16, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=40,
                        norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=2,
                        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
         torch.bfloat16, None, 0.5, 1002),
    ]


def init_weights(model, embed_std, seed):
    """Overwrite every parameter with seeded random values at a visible scale."""
    g = torch.Generator().manual_seed(seed)
    # Gemma's RMSNorm multiplies by 1 + w: w around 0 gives the same factors as w around 1 elsewhere
    norm_center = 0.0 if model.config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied lm_head is listed once, as embed_tokens
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):          # every RMSNorm, incl. Qwen3 / Gemma 3 q_norm / k_norm
                p.copy_(norm_center + 0.2 * z)
            elif name.endswith(".bias"):              # Qwen2 q/k/v biases
                p.copy_(0.1 * z)
            elif "embed_tokens" in name:
                p.copy_(embed_std * z)
            else:                                     # linear (out, in), lm_head, a MoE router, experts (E, out, in)
                p.copy_(z / math.sqrt(p.shape[-1]))


def save_and_reload(cls, config, dtype, shard, embed_std, seed, path):
    """Build the random model, save it in `dtype`, reload it from disk in float32."""
    torch.manual_seed(seed)
    model = cls._from_config(config, attn_implementation="eager")
    init_weights(model, embed_std, seed)
    model = model.to(dtype)
    shutil.rmtree(path, ignore_errors=True)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kw)
    ref = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    return ref


@torch.no_grad()
def row_logits(model, ids):
    """fp32 logits (T, V) of one sequence, batch of 1."""
    return model(torch.tensor(ids, dtype=torch.long)[None]).logits[0].float()


@torch.no_grad()
def greedy(model, prompt, new_tokens):
    """new_tokens greedy ids after prompt, with no early stop at eos."""
    gen = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=0,
                           eos_token_id=None, pad_token_id=0, bos_token_id=None)
    ids = torch.tensor(prompt, dtype=torch.long)[None]
    # an explicit all-ones mask: without it generate() masks out prompt ids equal to pad_token_id
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    return out[0, len(prompt):].numpy()


def greedy_margins(model, prompt, new):
    """Check that `new` is the argmax path of a plain (uncached) forward, and
    return the top-1 minus top-2 gap, absolute and relative to |top-1|, per step."""
    full = list(prompt) + list(new)
    lg = row_logits(model, full[:-1])[len(prompt) - 1:]
    top2 = lg.topk(2, dim=-1)
    assert (top2.indices[:, 0].numpy() == np.asarray(new)).all(), "generate() disagrees with argmax of the forward"
    gap = (top2.values[:, 0] - top2.values[:, 1]).numpy()
    return gap, gap / np.abs(top2.values[:, 0].numpy())


def eos_ids(config):
    e = config.eos_token_id
    return set() if e is None else set(e if isinstance(e, list) else [e])


def make_fixture(name, cls, config, dtype, shard, embed_std, seed):
    path = os.path.join(OUT_DIR, name)
    model = save_and_reload(cls, config, dtype, shard, embed_std, seed, path)

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, size=(N_ROWS, N_TOKENS)).astype(np.int32)
    logits = np.stack([row_logits(model, row.tolist()).numpy() for row in tokens]).astype(np.float32)
    prompt = tokens[0, :PROMPT_LEN].tolist()
    new = greedy(model, prompt, NEW_TOKENS.get(name, 8)).astype(np.int32)
    gap, rel = greedy_margins(model, prompt, new)
    rot = model.model.rotary_emb
    if hasattr(rot, "full_attention_inv_freq"):  # Gemma 3: a set per layer type
        inv_freq = rot.full_attention_inv_freq.float().numpy()
        np.save(os.path.join(path, "inv_freq_local.npy"), rot.sliding_attention_inv_freq.float().numpy())
    else:
        inv_freq = rot.inv_freq.float().numpy()

    np.save(os.path.join(path, "tokens.npy"), tokens)
    np.save(os.path.join(path, "logits.npy"), logits)
    np.save(os.path.join(path, "generate.npy"), new)
    np.save(os.path.join(path, "inv_freq.npy"), inv_freq)

    nparams = sum(p.numel() for p in model.parameters())
    files = sorted(os.listdir(path))
    print(f"\n{name}: {cls.__name__}, {nparams} params, saved as {str(dtype).replace('torch.', '')}")
    print(f"  files: {', '.join(f'{f} ({os.path.getsize(os.path.join(path, f))} B)' for f in files)}")
    print(f"  max |logit| {np.abs(logits).max():.3f}, logit std {logits.std():.3f}")
    print(f"  greedy {prompt} -> {new.tolist()}")
    print(f"  top-2 margin along the greedy path: min abs {gap.min():.4f}, min rel {rel.min():.2e}"
          f" ({'ok' if rel.min() > MIN_REL_MARGIN else 'TOO SMALL'})")
    hit = eos_ids(config) & set(new.tolist())
    print(f"  eos ids {sorted(eos_ids(config))} in the greedy path: {sorted(hit) if hit else 'none'}")
    if rel.min() <= MIN_REL_MARGIN:
        raise SystemExit(f"{name}: near-tie on the greedy path; change its seed")
    if hit:
        raise SystemExit(f"{name}: greedy path contains an eos id; change its seed")
    if len(set(new.tolist())) < MIN_DISTINCT:
        raise SystemExit(f"{name}: greedy path repeats itself; change its seed")
    return path


def check_llama3_inv_freq(path):
    """Print transformers' llama3 inv_freq next to the unscaled one, with the branch each took."""
    cfg = json.load(open(os.path.join(path, "config.json")))
    rp = cfg["rope_parameters"]
    hd = cfg["head_dim"]
    inv = np.load(os.path.join(path, "inv_freq.npy"))
    branches = llama3_branches(hd, rp["rope_theta"], rp["original_max_position_embeddings"],
                               rp["low_freq_factor"], rp["high_freq_factor"])
    print("\nllama3 inv_freq (i, unscaled, transformers, ratio, branch):")
    for j, (v, b) in enumerate(zip(inv, branches)):
        base = 1.0 / rp["rope_theta"] ** (2 * j / hd)
        print(f"  {j}: {base:.6e} {v:.6e} {base / v:7.4f} {b}")
        expect = {"high": 1.0, "low": rp["factor"]}.get(b)
        if expect is not None:
            assert abs(base / v - expect) < 1e-4, "unexpected llama3 scaling"
        else:
            assert 1.0 < base / v < rp["factor"], "smoothed frequency not between the two"
    assert {"high", "mid", "low"} <= set(branches)


def main():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.disable_progress_bar()
    os.makedirs(OUT_DIR, exist_ok=True)
    specs = model_specs()
    names = sys.argv[1:] or [spec[0] for spec in specs]
    unknown = set(names) - {spec[0] for spec in specs}
    if unknown:
        raise SystemExit(f"unknown fixture {sorted(unknown)}: the fixtures are {[spec[0] for spec in specs]}")
    paths = {spec[0]: make_fixture(*spec) for spec in specs if spec[0] in names}
    if "llama3" in paths:
        check_llama3_inv_freq(paths["llama3"])
        n_shards = len([f for f in os.listdir(paths["llama3"]) if f.endswith(".safetensors")])
        assert n_shards >= 2 and os.path.exists(os.path.join(paths["llama3"], "model.safetensors.index.json"))
        print(f"\nllama3 is sharded into {n_shards} safetensors files")


if __name__ == "__main__":
    main()
