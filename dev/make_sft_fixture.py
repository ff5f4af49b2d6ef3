#!/usr/bin/env python3
"""Make test/fixtures/sft/transformers_logits.npy: transformers' logits of a checkpoint ./train_sft
saved, for test_sft's check that a full fine-tune reloads in transformers as the same model.

It runs what test/test_sft.c runs (setup_program's ./train_grpo warm-up, the same 48-line sum.jsonl,
./train_sft with SFT_ARGS): on the CPU backend that is deterministic, so the test's checkpoint-20 is
the one here. transformers loads checkpoint-20 (config.json + model.safetensors as model_save_hf
wrote them) in fp32 and scores the ids 49 43 50 61: logits (4, V) float32.

Run from the repository root after make: python3 dev/make_sft_fixture.py  (CPU is enough).
"""
import glob, os, subprocess, tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

SFT_ARGS = ("--device cpu --quiet --max_steps 20 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 "
            "--learning_rate 1e-3 --logging_steps 5 --save_steps 10 --warmup_ratio 0.1")  # test_sft.c's SFT_ARGS
IDS = [49, 43, 50, 61]

w = tempfile.mkdtemp(prefix="sft_fixture_")
subprocess.run(f"XDG_CACHE_HOME={w}/cache ./train_grpo --device cpu --quiet --eval_size 0 --warmup_sft_steps 3 --max_steps 1 "
               f"--per_device_train_batch_size 8 --output_dir {w}/grpo", shell=True, check=True)
with open(f"{w}/sum.jsonl", "w") as f:
    for i in range(48):
        f.write(f'{{"prompt": "{i % 13}+{i % 7}=", "completion": "{i % 13 + i % 7}"}}\n')
subprocess.run(f"./train_sft {SFT_ARGS} --model {glob.glob(w + '/cache/fp8-grpo/warmup-*')[0]} --data {w}/sum.jsonl --output_dir {w}/full", shell=True, check=True)
ckpt = f"{w}/full/checkpoint-20"
model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32).eval()
with torch.no_grad():
    logits = model(torch.tensor([IDS])).logits[0].float().numpy()
os.makedirs("test/fixtures/sft", exist_ok=True)
np.save("test/fixtures/sft/transformers_logits.npy", logits.astype(np.float32))
subprocess.run(f"./generate --device cpu --model {ckpt} --tokens '{' '.join(map(str, IDS))}' --load_in_fp8 off "
               f"--dump_logits {w}/c.npy", shell=True, check=True, stdout=subprocess.DEVNULL)
c = np.load(f"{w}/c.npy")
print(f"transformers_logits.npy {logits.shape}: |C - transformers| max {np.abs(c - logits).max():.3e} "
      f"of max |logit| {np.abs(logits).max():.3f} ({type(model).__name__})")
