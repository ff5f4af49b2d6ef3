#!/usr/bin/env bash
# dev/sft_fp8_curves.sh: does FP8 training learn like BF16? (dev/notes/fp8-training.md) Supervised fine-tuning of a
# Llama-3.2-1B-shaped model (hidden 2048, 16 layers, 32/8 heads, FF 8192, vocab 128256; random
# weights, the built-in byte-level tokenizer) on the built-in kind of data (a + b = c), with
# ./train_sft in BF16, FP8 delayed and FP8 block (hybrid), three data-order seeds each, the same
# initial weights for all. TASK=text: language modelling on text instead (Python's standard library
# as bytes, 128 a sequence: 16 of prompt, 112 of completion), whose loss stays high (bits of real
# entropy), so that 0.5% of it is a difference the seeds can resolve. Each run's metrics.jsonl
# goes to OUT/<recipe>-<seed>.jsonl; then
#   python3 dev/plot_sft_curves.py OUT      (the table of final losses and the curves' svg)
# From the repository root on a GPU machine after make; needs python3 with transformers (the random
# checkpoint). STEPS (default 500), BATCH (32), SEEDS ("1 2 3"), RECIPES ("off delayed block");
# PARALLEL=1 runs the seeds of a recipe at once (3 x ~22 GiB: an 80 GB GPU holds them). EXTRA: more
# train_sft options for every run (e.g. "--adam_moments bf16 --recompute_mlp"), TAG: then named in the
# runs' files (OUT/<recipe>-<tag>-<seed>.jsonl). EVAL=1: each run's last checkpoint also gets its held-out
# loss from dev/eval_heldout.py (transformers, bf16) on text the runs never train on (TASK=text: pieces
# of the standard library's packages json, email, http, urllib, xml, logging; sum: 512 problems more, of
# the 10,000 the task has, so mostly seen ones), into
# OUT/<recipe>[-<tag>]-<seed>.heldout.json: the weights' loss, the same measure for every recipe; and the
# runs evaluate the same set themselves every 100 steps (train_sft --eval_data: through their own products,
# FP8 ones included), eval_loss in their metrics.
set -euo pipefail
out=${1:-/tmp/sft_curves}
steps=${STEPS:-500}
batch=${BATCH:-32}
w=$(mktemp -d /tmp/sft_curves_work.XXXXXX)
mkdir -p "$out"
XDG_CACHE_HOME="$w/cache" ./train_grpo --max_steps 1 --eval_size 4 --output_dir "$w/grpo" >/dev/null  # the built-in tokenizer.json
python3 - "$w" "${TASK:-sum}" <<'PY'
import json, os, random, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
w = sys.argv[1]
cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
                  bos_token_id=None, eos_token_id=256)
torch.manual_seed(0)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(f"{w}/model", safe_serialization=True)
os.system(f"cp {w}/cache/fp8-grpo/warmup-*/tokenizer.json {w}/cache/fp8-grpo/warmup-*/tokenizer_config.json {w}/model/")
rng = random.Random(0)
with open(f"{w}/data.jsonl", "w") as f:
    if sys.argv[2] == "text":  # the standard library's modules, in name order, cut into 128-byte pieces
        lib = os.path.dirname(os.__file__)
        text = b"".join(open(os.path.join(lib, n), "rb").read() for n in sorted(os.listdir(lib)) if n.endswith(".py"))
        text = text.decode("ascii", "ignore")
        for k in range(0, min(len(text), 128 * 60000) - 128, 128):
            f.write(json.dumps({"prompt": text[k:k + 16], "completion": text[k + 16:k + 128]}) + "\n")
    else:
        for _ in range(20000):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n")
with open(f"{w}/eval.jsonl", "w") as f:  # held out: the packages' modules (data.jsonl has the top level's)
    if sys.argv[2] == "text":
        text = ""
        for pkg in ["json", "email", "http", "urllib", "xml", "logging"]:
            for root, dirs, files in sorted(os.walk(os.path.join(lib, pkg))):
                dirs.sort()
                text += "".join(open(os.path.join(root, n), "rb").read().decode("ascii", "ignore") for n in sorted(files) if n.endswith(".py"))
        for k in range(0, min(len(text) - 128, 128 * 512), 128):
            f.write(json.dumps({"prompt": text[k:k + 16], "completion": text[k + 16:k + 128]}) + "\n")
    else:
        rng = random.Random(1)
        for _ in range(512):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n")
PY
evalflags=""
[ "${EVAL:-0}" = 1 ] && evalflags="--eval_data $w/eval.jsonl --eval_steps 100"
one() {  # recipe seed
  ./train_sft --device cuda --model "$w/model" --data "$w/data.jsonl" --chat 0 --max_steps "$steps" \
    --per_device_train_batch_size "$batch" --learning_rate 1e-4 --lr_scheduler_type cosine --warmup_ratio 0.05 \
    --logging_steps 1 --save_steps 0 --seed "$2" --fp8_recipe "$1" --output_dir "$w/run-$1-$2" --overwrite_output_dir --quiet \
    $evalflags ${EXTRA:-} | tail -1
  cp "$w/run-$1-$2/metrics.jsonl" "$out/$1${TAG:+-$TAG}-$2.jsonl"
  if [ "${EVAL:-0}" = 1 ]; then
    python3 "$(dirname "$0")/eval_heldout.py" "$w/run-$1-$2/checkpoint-$steps" "$w/eval.jsonl" > "$out/$1${TAG:+-$TAG}-$2.heldout.json"
  fi
  rm -rf "$w/run-$1-$2"
}
for recipe in ${RECIPES:-off delayed block}; do
  for seed in ${SEEDS:-1 2 3}; do
    s=$(date +%s)
    if [ "${PARALLEL:-0}" = 1 ]; then one "$recipe" "$seed" & else one "$recipe" "$seed"; echo "$recipe seed $seed: $(( $(date +%s) - s )) s"; fi
  done
  wait
done
rm -rf "$w"
