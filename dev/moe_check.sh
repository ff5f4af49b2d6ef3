#!/usr/bin/env bash
# dev/moe_check.sh: the Qwen3 MoE (Qwen3-30B-A3B) measurements on a GPU (one H100 or H200), each section one
# command of under 10 minutes. From the repository root:
#   bash dev/moe_check.sh build      make (sm_90a), the GPU suites, bench_grpo, bench_rollout
#   bash dev/moe_check.sh tests      gpu_moe (the router and the grouped expert GEMMs against the CPU's ops) and
#                                    gpu_models (the qwen3_moe, qwen3_moe16 and qwen3_moe_fp8 fixtures, CPU vs GPU)
#   bash dev/moe_check.sh memory     bench_grpo's GRPO step at qwen3-30b-a3b (8 prompts x 8, 256 + 256 new, LoRA
#                                    r 16 on the attention), FP8 block, everything held within 40 GiB: its time
#                                    and peak memory by part
#   bash dev/moe_check.sh rollout    bench_rollout at batch 64 (128 + 64): qwen3-30b-a3b FP8 block and BF16, with the
#                                    grouped GEMM (FP8GRPO_MOE_DECODE=0) and with moe_decode_kernel (the default), beside
#                                    the dense 8b in the same command, then a profiled FP8 run (--profile: the
#                                    grouped expert GEMMs' time a decode step, for their bandwidth against the
#                                    experts' bytes: E (1 - (1 - K/E)^64) of 128 experts x 3 x 768 x 2048 bytes a layer)
#   bash dev/moe_check.sh grpo       ./train_grpo with its defaults (FP8 block, LoRA on the attention) on a random
#                                    Qwen3-30B-A3B checkpoint (bench_grpo --save: 61 GB of bf16 on disk, removed
#                                    after) with the qwen2 fixture tokenizer beside (ChatML)
# dev/notes/models.md gets the tables.
set -uo pipefail
ARCH=${GPU_ARCH:-90a}
W=${WORK:-/tmp/moe_check}
run() { echo; echo "== $*"; "$@" || echo "(exit $?)"; }
data() {  # 200 arithmetic problems
    for i in $(seq 0 199); do echo "{\"prompt\": \"$((i % 97)) + $((i % 89)) = ?\", \"answer\": \"$((i % 97 + i % 89))\"}"; done
}

case "${1:-}" in
build)
    make GPU_ARCH=$ARCH -j16 && make GPU_ARCH=$ARCH -j16 $(ls test/gpu_*.cu | sed 's|test/\(.*\)\.cu|build/\1|') &&
        make -C dev GPU_ARCH=$ARCH -j16 ../build/bench_grpo ../build/bench_rollout
    ;;
tests)
    for t in build/gpu_moe build/gpu_models; do run env CK_FORK=no $t; done
    ;;
memory)
    run ./build/bench_grpo --model qwen3-30b-a3b --fp8 block --prompts 8 --generations 8 --prompt 256 --new 256 --rank 16 \
        --total_gib 40
    ;;
rollout)
    # the experts' decode products: the grouped GEMM (FP8GRPO_MOE_DECODE=0), then moe_decode_kernel (the default)
    for dec in 0 1; do
        run env FP8GRPO_MOE_DECODE=$dec ./build/bench_rollout --model qwen3-30b-a3b --fp8 block,off --batch 64 --new 64
    done
    run ./build/bench_rollout --model 8b --fp8 block,off --batch 64 --new 64
    run env FP8GRPO_MOE_DECODE=1 ./build/bench_rollout --model qwen3-30b-a3b --fp8 block --batch 64 --new 64 --profile
    ;;
grpo)
    rm -rf "$W" && mkdir -p "$W"
    data >"$W/d.jsonl"
    run ./build/bench_grpo --model qwen3-30b-a3b --save "$W/qwen3-30b-a3b"
    cp test/fixtures/tokenizer/qwen2/tokenizer.json test/fixtures/tokenizer/qwen2/tokenizer_config.json "$W/qwen3-30b-a3b/"
    run ./train_grpo --model "$W/qwen3-30b-a3b" --data "$W/d.jsonl" --output_dir "$W/run" --max_steps 3 --eval_size 8
    rm -rf "$W/qwen3-30b-a3b"
    ;;
*)
    sed -n '2,17p' "$0"
    exit 2
    ;;
esac
