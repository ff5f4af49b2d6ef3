#!/usr/bin/env python3
# dev/eval_heldout.py: the held-out loss of a checkpoint as transformers computes it, in bf16: the mean
# negative log-likelihood of the completion tokens (and the EOS after them) of a {"prompt", "completion"}
# JSONL file, the tokens as train_sft --chat 0 makes them (prompt + completion + EOS, the loss on all but
# the prompt). An independent measure of what a run learned: the weights alone, read by PyTorch, whatever
# precision the run's own products had (FP8 training computes its training loss through its FP8 GEMMs).
#   python3 dev/eval_heldout.py CHECKPOINT_DIR EVAL.jsonl [--dtype bf16|fp32] [--batch 64]
# Prints one JSON line: {"checkpoint", "examples", "tokens", "loss"}.
import argparse
import json

import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("checkpoint")
ap.add_argument("data")
ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
ap.add_argument("--batch", type=int, default=64)
a = ap.parse_args()

dev = "cuda" if torch.cuda.is_available() else "cpu"
dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
tok = Tokenizer.from_file(f"{a.checkpoint}/tokenizer.json")
cfg = AutoConfig.from_pretrained(a.checkpoint)
eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, list) else cfg.eos_token_id
if eos is None:
    raise SystemExit(f"{a.checkpoint}/config.json names no eos_token_id: the completion's end token is unknown")
model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=dt).to(dev).eval()

examples = []
for line in open(a.data):
    if line.strip():
        j = json.loads(line)
        p = tok.encode(j["prompt"], add_special_tokens=False).ids
        c = tok.encode(j["completion"], add_special_tokens=False).ids + [eos]
        examples.append((p, c))

nll, count = 0.0, 0
with torch.no_grad():
    for b in range(0, len(examples), a.batch):
        chunk = examples[b:b + a.batch]
        T = max(len(p) + len(c) for p, c in chunk)
        ids = torch.zeros(len(chunk), T, dtype=torch.long)
        tgt = torch.full((len(chunk), T), -100, dtype=torch.long)  # the target of position t is token t + 1
        mask = torch.zeros(len(chunk), T, dtype=torch.long)
        for i, (p, c) in enumerate(chunk):
            s = p + c
            ids[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
            tgt[i, len(p) - 1:len(s) - 1] = torch.tensor(c)
        logits = model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits.float()
        nll += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.to(dev).reshape(-1),
                                                 ignore_index=-100, reduction="sum").item()
        count += int((tgt != -100).sum())
print(json.dumps({"checkpoint": a.checkpoint, "examples": len(examples), "tokens": count, "loss": nll / count}))
