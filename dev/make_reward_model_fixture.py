#!/usr/bin/env python3
"""Make the reward-model fixtures (test/fixtures/reward_model/) that train/reward_model.c is tested against.

Two tiny random-weight *ForSequenceClassification checkpoints (num_labels 1: a score head (1, hidden), no
bias), each with the tokenizer of an existing tokenizer fixture, its chat template and a pad token:

  llama/   LlamaForSequenceClassification, the llama3 tokenizer (Llama 3 template), pad <|end_of_text|>
  qwen3/   Qwen3ForSequenceClassification, the qwen2 tokenizer (ChatML, default system prompt), pad <|endoftext|>

Shape: hidden 64, intermediate 160, 2 layers, 4 heads, 2 KV heads, saved in bfloat16 (the expected scores
are computed on the model reloaded from disk in float32, so they use exactly the values the C loader reads).
Weights are seeded at a visible scale (dev/make_fixtures.py's init_weights), the score head N(0, 1/hidden).

Each directory's cases.json holds prompt + completion pairs and the score transformers gives each, computed
the way TRL's GRPOTrainer scores with a reward model: text prompts as prompt + completion, conversational
prompts (a system and a user message) with the assistant's completion through the tokenizer's chat template;
tokenized with padding=True, padding_side="right", add_special_tokens=False, as one batch per kind; the
score is logits[:, 0] of the model, which takes it at each row's last token that is not config.pad_token_id.
The ids of each text are kept too ("ids"), to tell a tokenizer difference from a model one.

Run from the repository root: python3 dev/make_reward_model_fixture.py  (CPU; made with torch 2.15,
transformers 5.25).
"""
import json
import math
import os
import shutil

import torch
from transformers import (AutoTokenizer, LlamaConfig, LlamaForSequenceClassification, Qwen3Config,
                          Qwen3ForSequenceClassification)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "test", "fixtures", "reward_model")
TOK = os.path.join(ROOT, "test", "fixtures", "tokenizer")
COMMON = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, num_labels=1)

TEXT = [("What is 17+25? ", "42"),
        ("Solve 3*5+7. Answer:", " 22, because 15 + 7 = 22."),
        ("Name a colour.", " Blue\n\nor red"),
        ("12-5=", "7")]
CHAT = [("You are terse.", "What is 2+3?", "The answer is 5."),
        (None, "Write a number between 1 and 9.", " 7 "),
        (None, "Is 91 prime?", "No: 91 = 7 * 13.")]


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"): p.copy_(1.0 + 0.2 * z)
            elif "embed_tokens" in name: p.copy_(0.5 * z)
            else: p.copy_(z / math.sqrt(p.shape[-1]))  # linear (out, in) and the score head (1, hidden)


@torch.no_grad()
def scores(model, tok, texts):
    enc = tok(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    logits = model(**enc).logits[:, 0].float()
    ids = [[int(i) for i, m in zip(row, mask) if m] for row, mask in zip(enc["input_ids"], enc["attention_mask"])]
    return logits.tolist(), ids


def make(name, cls, config, tok_name, pad, seed):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    src = os.path.join(TOK, tok_name)
    tok = AutoTokenizer.from_pretrained(src)
    tok.pad_token = pad
    config.pad_token_id = tok.pad_token_id
    torch.manual_seed(seed)
    model = cls._from_config(config, attn_implementation="eager")
    assert model.score.bias is None and tuple(model.score.weight.shape) == (1, config.hidden_size)
    init_weights(model, seed)
    model.to(torch.bfloat16).save_pretrained(path)
    tok.save_pretrained(path)
    for extra in ("vocab.json", "merges.txt", "special_tokens_map.json"):  # tokenizer.json holds what they do
        if os.path.exists(os.path.join(path, extra)): os.remove(os.path.join(path, extra))
    ref = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.pad_token_id == ref.config.pad_token_id
    cases = []
    text_scores, text_ids = scores(ref, tok, [p + c for p, c in TEXT])
    for (p, c), s, ids in zip(TEXT, text_scores, text_ids):
        cases.append({"prompt": p, "system": None, "messages": False, "completion": c, "ids": ids, "score": s})
    chats = []
    for system, user, c in CHAT:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user},
                                                                              {"role": "assistant", "content": c}]
        chats.append(tok.apply_chat_template(msgs, tokenize=False))
    chat_scores, chat_ids = scores(ref, tok, chats)
    for (system, user, c), s, ids in zip(CHAT, chat_scores, chat_ids):
        cases.append({"prompt": user, "system": system, "messages": True, "completion": c, "ids": ids, "score": s})
    with open(os.path.join(path, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    spread = max(c["score"] for c in cases) - min(c["score"] for c in cases)
    print(f"{name}: {len(cases)} cases, scores {[round(c['score'], 4) for c in cases]} (spread {spread:.3f})")
    assert spread > 0.1, "scores too alike to tell a wrong last token from the right one"


def main():
    llama = LlamaConfig(**COMMON, vocab_size=3968, head_dim=16, tie_word_embeddings=False, bos_token_id=None,
                        eos_token_id=None, rope_parameters=dict(rope_type="default", rope_theta=500000.0))
    make("llama", LlamaForSequenceClassification, llama, "llama3", "<|end_of_text|>", 2001)
    qwen3 = Qwen3Config(**COMMON, vocab_size=3072, head_dim=32, tie_word_embeddings=False, bos_token_id=None,
                        eos_token_id=None, rope_parameters=dict(rope_type="default", rope_theta=1000000.0))
    make("qwen3", Qwen3ForSequenceClassification, qwen3, "qwen2", "<|endoftext|>", 2002)


if __name__ == "__main__":
    main()
