#!/usr/bin/env bash
# dev/fp8_train_check.sh: FP8 training's measurements on a GPU (one H100 or H200), each section one command
# of under 10 minutes. From the repository root:
#   bash dev/fp8_train_check.sh build     make (sm_90a), the GPU suites, bench_full
#   bash dev/fp8_train_check.sh tests     gpu_fp8_train (the kept inputs' ops, the FP8 LM head),
#                                         gpu_models (training with kept inputs / recomputed gate and up
#                                         bit-identical to the bf16-saved path), gpu_backend (AdamW, bf16 moments)
#   bash dev/fp8_train_check.sh bench     bench_full at the 1B and 3B shapes: BF16, FP8 delayed, and both
#                                         with the memory options (RECIPE:bf16:mlp), FP8 with the LM head in
#                                         FP8 (:head), and FP8's larger batch
#   bash dev/fp8_train_check.sh peer      torchao float8 (tensorwise, compiled) at the 1B shape; carry its
#                                         wheel in PEERS (default .bench/peers)
#   bash dev/fp8_train_check.sh curves    dev/sft_fp8_curves.sh's text task, BF16 and FP8 delayed with bf16
#                                         moments and gate/up recomputed, 3 seeds each, into OUT (default
#                                         /tmp/fp8_curves), each run's held-out loss too (EVAL=1); then
#                                         python3 dev/plot_sft_curves.py OUT
#   bash dev/fp8_train_check.sh curves_head   the same for FP8 delayed with the LM head in FP8
#                                         (--fp8_lm_head), with fp32 and with bf16 moments
# dev/notes/fp8-training.md gets the tables.
set -uo pipefail
ARCH=${GPU_ARCH:-90a}
run() { echo; echo "== $*"; "$@" || echo "(exit $?)"; }
B="./build/bench_full --steps 3 --warmup 1 --seq 2048"

case "${1:-}" in
build)
    make GPU_ARCH=$ARCH -j16 && make GPU_ARCH=$ARCH -j16 $(ls test/gpu_*.cu | sed 's|test/\(.*\)\.cu|build/\1|') &&
        make GPU_ARCH=$ARCH -j16 build/bench_full
    ;;
tests)
    for t in build/gpu_fp8_train build/gpu_models build/gpu_backend; do run env CK_FORK=no $t; done
    ;;
bench)
    run $B --model 1b --batch 4 --recipe off,off:bf16:mlp,delayed,delayed:mlp,delayed:bf16:mlp,delayed:head,delayed:bf16:mlp:head
    run $B --model 1b --batch 8 --recipe delayed:bf16:mlp
    run $B --model 3b --batch 4 --recipe off,delayed,delayed:bf16:mlp,delayed:head
    ;;
peer)
    pip install --no-deps --no-index --target /tmp/tao ${PEERS:-.bench/peers}/torchao-*.whl > /dev/null &&
        PYTHONPATH=/tmp/tao run python3 dev/peers.py full --model 1b --batch 4 --seq 2048 --float8 tensorwise --compile
    ;;
curves)
    # each run writes a last checkpoint before its metrics are taken (BF16's optimizer state: ~15 GB at this
    # shape), so the BF16 seeds go two and one at a time on a 64 GB disk
    O=${OUT:-/tmp/fp8_curves}
    mkdir -p "$O"
    export EVAL=1
    RECIPES=delayed EXTRA="--adam_moments bf16 --recompute_mlp" TAG=bf16moments TASK=text BATCH=16 PARALLEL=1 \
        run bash dev/sft_fp8_curves.sh "$O"
    RECIPES=off SEEDS="1 2" TASK=text BATCH=16 PARALLEL=1 run bash dev/sft_fp8_curves.sh "$O"
    RECIPES=off SEEDS="3" TASK=text BATCH=16 run bash dev/sft_fp8_curves.sh "$O"
    ;;
curves_head)
    O=${OUT:-/tmp/fp8_curves}
    mkdir -p "$O"
    export EVAL=1
    RECIPES=delayed EXTRA="--adam_moments bf16 --recompute_mlp --fp8_lm_head" TAG=head-bf16moments TASK=text BATCH=16 PARALLEL=1 \
        run bash dev/sft_fp8_curves.sh "$O"
    RECIPES=delayed EXTRA="--fp8_lm_head" TAG=head SEEDS="1 2" TASK=text BATCH=16 PARALLEL=1 run bash dev/sft_fp8_curves.sh "$O"
    RECIPES=delayed EXTRA="--fp8_lm_head" TAG=head SEEDS="3" TASK=text BATCH=16 run bash dev/sft_fp8_curves.sh "$O"
    ;;
*)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
