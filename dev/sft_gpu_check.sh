#!/usr/bin/env bash
# dev/sft_gpu_check.sh: ./train_sft and the built-in warm-up (sft_step) on the CUDA backend, what
# test/test_sft.c checks on the CPU: a full run and its checkpoint read back by ./generate, the
# same run with --gradient_checkpointing (its last loss next to the first's), --resume (10 + 10
# steps against 20: cmp of optimizer.safetensors, equal where the CUDA kernels are deterministic;
# the CPU test is the guarantee; on the GPU also with FP8 delayed scaling), a LoRA run on FP8 block weights; and the default ./train_grpo,
# timed, twice (the first makes the warm-up on the GPU). From the repository root after make:
#   bash dev/sft_gpu_check.sh [WORKDIR]     (default /tmp/sft_gpu_check; DEVICE=cpu: the same on the CPU)
set -euo pipefail
w=${1:-/tmp/sft_gpu_check}
dev=${DEVICE:-cuda}
rm -rf "$w" && mkdir -p "$w"
export XDG_CACHE_HOME="$w/cache"  # the warm-up's cache: made by the first run below, loaded by the second
echo "== ./train_grpo, default run (the warm-up trained by sft_step on the GPU), then again with it cached"
/usr/bin/time -f "wall %e s" ./train_grpo --device "$dev" --output_dir "$w/grpo" 2>&1 | grep -E "^backend|warm-up 1000|held-out accuracy|wall"
/usr/bin/time -f "wall %e s" ./train_grpo --device "$dev" --output_dir "$w/grpo" --overwrite_output_dir 2>&1 | grep -E "held-out accuracy:|wall"
model=$(ls -d "$w"/cache/fp8-grpo/warmup-* | head -n1)
for i in $(seq 0 199); do echo "{\"prompt\": \"$((i % 23))+$((i % 17))=\", \"completion\": \"$((i % 23 + i % 17))\"}"; done >"$w/sum.jsonl"
sft() { ./train_sft --device "$dev" --model "$model" --data "$w/sum.jsonl" --chat 0 --max_steps 20 --save_steps 10 \
  --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --logging_steps 5 --learning_rate 1e-4 "$@"; }
echo "== ./train_sft, every weight"
sft --output_dir "$w/full" | tail -6
./generate --device "$dev" --model "$w/full/checkpoint-20" --prompt "3+4=" --chat 0 --max_new_tokens 4 2>/dev/null
echo "== --gradient_checkpointing (metrics.jsonl's last line, then the run above's)"
sft --output_dir "$w/gc" --gradient_checkpointing --quiet >/dev/null
tail -1 "$w/gc/metrics.jsonl"; tail -1 "$w/full/metrics.jsonl"
echo "== --resume: 10 + 10 steps against 20"
cp -r "$w/full" "$w/resumed" && rm -rf "$w/resumed/checkpoint-20"
sft --output_dir "$w/resumed" --resume --quiet >/dev/null
cmp "$w/full/checkpoint-20/optimizer.safetensors" "$w/resumed/checkpoint-20/optimizer.safetensors" && echo "resume: bit-exact"
if [ "$dev" = cuda ]; then
  echo "== FP8 delayed scaling, --resume: 10 + 10 steps against 20 (the checkpoint holds the scales and amax histories)"
  fp8=(--fp8_recipe delayed --fp8_amax_history_len 4 --per_device_train_batch_size 16 --gradient_accumulation_steps 1)
  sft --output_dir "$w/fp8" "${fp8[@]}" | tail -2
  cp -r "$w/fp8" "$w/fp8r" && rm -rf "$w/fp8r/checkpoint-20"
  sft --output_dir "$w/fp8r" --resume "${fp8[@]}" --quiet >/dev/null
  cmp "$w/fp8/checkpoint-20/optimizer.safetensors" "$w/fp8r/checkpoint-20/optimizer.safetensors" && echo "FP8 delayed resume: bit-exact"
fi
echo "== ./train_sft --use_peft on FP8 block weights"
sft --output_dir "$w/lora" --use_peft --lora_r 8 --load_in_fp8 block --learning_rate 1e-3 | tail -4
./generate --device "$dev" --model "$model" --lora "$w/lora/checkpoint-20" --prompt "3+4=" --chat 0 --max_new_tokens 4 2>/dev/null
