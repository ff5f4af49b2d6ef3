#!/usr/bin/env bash
# dev/models_check.sh: the Gemma 3 and Mistral measurements on a GPU (one H100 or H200), each section one
# command of under 10 minutes. From the repository root:
#   bash dev/models_check.sh build      make (sm_90a), the GPU suites, bench_grpo, bench_rollout, the kernel tracer
#   bash dev/models_check.sh tests      gpu_backend (windows, head dim 256, the (1 + w) norms, GeGLU) and
#                                       gpu_models (the mistral and gemma3 fixtures, CPU vs GPU)
#   bash dev/models_check.sh grpo       ./train_grpo with its defaults on random Gemma-3-4B-text and
#                                       Mistral-7B checkpoints (bench_grpo --save), the family's fixture
#                                       tokenizer beside (so its chat template), FP8 block and BF16
#   bash dev/models_check.sh memory     bench_grpo's memory by part at gemma3-4b, mistral-7b, gemma3-27b,
#                                       FP8 block and BF16 at the same 16 GiB arena
#   bash dev/models_check.sh rollout    bench_rollout at the Gemma-3-4B shape (batch 64, 128 + 256), FP8
#                                       block and BF16, and a kernel trace of its decode step
# dev/notes/models.md gets the tables.
set -uo pipefail
ARCH=${GPU_ARCH:-90a}
W=${WORK:-/tmp/models_check}
run() { echo; echo "== $*"; "$@" || echo "(exit $?)"; }
data() {  # 200 arithmetic problems
    for i in $(seq 0 199); do echo "{\"prompt\": \"$((i % 97)) + $((i % 89)) = ?\", \"answer\": \"$((i % 97 + i % 89))\"}"; done
}

case "${1:-}" in
build)
    make GPU_ARCH=$ARCH -j16 && make GPU_ARCH=$ARCH -j16 $(ls test/gpu_*.cu | sed 's|test/\(.*\)\.cu|build/\1|') &&
        make -C dev GPU_ARCH=$ARCH -j16 ../build/bench_grpo ../build/bench_rollout &&
        { make -C dev GPU_ARCH=$ARCH ../build/kernel_trace.so || echo "(no CUPTI: no kernel trace)"; }
    ;;
tests)
    for t in build/gpu_backend build/gpu_models; do run env CK_FORK=no $t; done
    ;;
grpo)
    rm -rf "$W" && mkdir -p "$W"
    data >"$W/d.jsonl"
    for s in gemma3-4b:gemma mistral-7b:mistral; do
        shape=${s%%:*} tok=${s##*:}
        run ./build/bench_grpo --model "$shape" --save "$W/$shape"
        cp test/fixtures/tokenizer/$tok/tokenizer.json test/fixtures/tokenizer/$tok/tokenizer_config.json "$W/$shape/"
        for fp in block off; do
            run ./train_grpo --model "$W/$shape" --data "$W/d.jsonl" --output_dir "$W/run_${shape}_$fp" --max_steps 3 \
                --eval_size 8 --load_in_fp8 $fp
        done
        rm -rf "$W/$shape"
    done
    ;;
memory)
    for m in gemma3-4b mistral-7b gemma3-27b; do
        for fp in block off; do run ./build/bench_grpo --model $m --fp8 $fp --arena_gib 16; done
    done
    ;;
rollout)
    run ./build/bench_rollout --model gemma3-4b --fp8 block,off --batch 64
    for fp in block off; do
        CUDA_INJECTION64_PATH=$PWD/build/kernel_trace.so KERNEL_TRACE=/tmp/gemma_$fp.csv \
            ./build/bench_rollout --model gemma3-4b --fp8 $fp --batch 64 --new 64 >/dev/null &&
            run python3 dev/kernel_trace_sum.py /tmp/gemma_$fp.csv
    done
    ;;
*)
    sed -n '2,14p' "$0"
    exit 2
    ;;
esac
