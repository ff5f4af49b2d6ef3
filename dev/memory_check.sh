#!/usr/bin/env bash
# dev/memory_check.sh: the memory measurements (dev/notes/memory.md) on a GPU (H100 80 GB; the 70B default step on an H200),
# each section one command of under 10 minutes. From the repository root:
#   bash dev/memory_check.sh build      make (sm_90a), the GPU suites and dev/bench_grpo
#   bash dev/memory_check.sh tests      make test-gpu (gpu_backend has the FP8 embedding / LM head cases)
#   bash dev/memory_check.sh 8b         the Qwen3-8B-shape GRPO step (8 prompts x 8, 256 + 512, LoRA r 16
#                                       on all seven projections): FP8 (+ FP8 embeddings, FP8 KV, bf16 LoRA
#                                       state) at the smallest arena, the project's BF16 mode at its
#                                       smallest, and the step as train_grpo's defaults choose it
#   bash dev/memory_check.sh 32b        the Qwen3-32B shape, same step, within 40 GiB
#   bash dev/memory_check.sh 70b        the Llama-3.3-70B shape, same step, on one H100 (80 GB)
#   bash dev/memory_check.sh 70b-h200   the same with the project's default embeddings, on one H200
#   bash dev/memory_check.sh context    the longest completion a batch of 8 reaches when the 8B total is
#                                       24 GiB: FP8 weights + FP8 KV against BF16 weights + BF16 KV
#   bash dev/memory_check.sh learning   dev/learning.sh with --lora_dtype bf16 against the fp32 state
#   bash dev/memory_check.sh train      ./train_grpo --model DIR --data FILE with no other option on an
#                                       8B-shaped random checkpoint, then with the process held to 16 GiB
# Each bench_grpo run prints its memory by part and the peak held (cudaMemGetInfo, CUDA context
# included) last; dev/notes/memory.md gets the tables.
set -uo pipefail
B=./build/bench_grpo
ARCH=${GPU_ARCH:-90a}
# the LM head's logits chunks (backend_cuda.cu: 512 MiB of fp32 rows by default) at 256 rows, 148 MiB
# at the Qwen vocabulary: what the 10 GiB runs leave for the arena
small_chunks() { FP8GRPO_LOGITS_CHUNK_ROWS=256 "$@"; }
run() { echo; echo "== $*"; "$@" || echo "(exit $?)"; }

case "${1:-}" in
build)
    make GPU_ARCH=$ARCH -j16 && make GPU_ARCH=$ARCH -j16 $(ls test/gpu_*.cu | sed 's|test/\(.*\)\.cu|build/\1|') &&
        make -C dev GPU_ARCH=$ARCH -j16 ../build/bench_grpo
    ;;
tests)
    make GPU_ARCH=$ARCH test-gpu
    ;;
8b)
    # the arena at what one prompt's 8 completions need (FP8 KV: 0.32 GiB + its prefill) and the update of
    # one sequence with recomputation (0.41 GiB); the BF16 mode's KV cache needs 0.62 GiB for the same
    run small_chunks $B --model 8b --fp8_embeddings --kv fp8 --lora_dtype bf16 --arena_gib 0.45
    run small_chunks $B --model 8b --fp8 off --arena_gib 0.7
    run $B --model 8b --gpu_memory_utilization 0.6
    ;;
32b)
    run $B --model 32b --fp8_embeddings --kv fp8 --total_gib 38
    run $B --model 32b --total_gib 39
    ;;
70b)
    run $B --model 70b --fp8_embeddings --kv fp8 --lora_dtype bf16 --gpu_memory_utilization 0.97 --reserve_gib 2
    ;;
70b-h200)
    run $B --model 70b --kv fp8 --total_gib 100
    ;;
context)
    run $B --model 8b --prompts 1 --generations 8 --fp8_embeddings --kv fp8 --total_gib 24 --fit_new
    run $B --model 8b --prompts 1 --generations 8 --fp8 off --total_gib 24 --fit_new
    ;;
learning)
    # the learning check with the adapters' state in BF16 against fp32 (3 seeds each; compare the block rows)
    bash dev/learning.sh /tmp/learning_fp32 && bash dev/learning.sh /tmp/learning_bf16 --lora_dtype bf16
    ;;
train)
    w=${WORK:-/tmp/memory_check}
    rm -rf "$w" && mkdir -p "$w"
    run $B --model 8b --save "$w/q8b"
    XDG_CACHE_HOME="$w/cache" ./train_grpo --max_steps 1 --output_dir "$w/tiny" --quiet >/dev/null  # the byte-level tokenizer.json
    cp "$w"/cache/fp8-grpo/warmup-*/tokenizer.json "$w/q8b/"
    for i in $(seq 0 199); do echo "{\"prompt\": \"$((i % 97)) + $((i % 89)) = ?\", \"answer\": \"$((i % 97 + i % 89))\"}"; done >"$w/d.jsonl"
    run ./train_grpo --model "$w/q8b" --data "$w/d.jsonl" --output_dir "$w/run1" --max_steps 2 --eval_size 8
    run ./train_grpo --model "$w/q8b" --data "$w/d.jsonl" --output_dir "$w/run2" --max_steps 2 --eval_size 8 \
        --gpu_memory_utilization 0.19
    ;;
*)
    sed -n '2,19p' "$0"
    exit 2
    ;;
esac
