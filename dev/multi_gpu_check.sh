#!/usr/bin/env bash
# dev/multi_gpu_check.sh: what several GPUs must show, checked and measured, in stages that each fit in a
# few minutes (run them in order on one machine; the build stays between them):
#
#   bash dev/multi_gpu_check.sh build    make with NCCL (found by make, or unpacked from a carried wheel
#                                        .whl/nvidia_nccl_cu1*.whl), bench_dp
#   bash dev/multi_gpu_check.sh one      world size 1 on one GPU: ./train_grpo as before, then the same
#                                        through --nproc_per_node 1 (the data-parallel code with one rank)
#   bash dev/multi_gpu_check.sh grpo     the GRPO step at the Qwen3-8B shape on 1, 2 and 4 GPUs (those
#                                        there are), the same per-GPU batch: speed-up over one GPU and the
#                                        all-reduce's share (the goal: >= 1.85x on 2, >= 3.6x on 4)
#   bash dev/multi_gpu_check.sh full     full fine-tuning, FP8 delayed, sharded: the Llama-3.2-3B shape on
#                                        1, 2, 4 GPUs (tokens/s, each GPU's peak), the 8B shape on 1 and all
#   bash dev/multi_gpu_check.sh balance  GRPO on every GPU with EOS-ended completions: the share of a step
#                                        the ranks wait for the slowest one
#   bash dev/multi_gpu_check.sh sft      SFT (FP8 delayed) on 1 GPU and on 2, the same global batch: the
#                                        loss curves (dev/plot_dp_sft.py draws them)
#   bash dev/multi_gpu_check.sh kill     ./train_grpo on 2 GPUs with rank 1 killed at step 3: every rank
#                                        stops with one line, in seconds; --resume finishes the run
#   bash dev/multi_gpu_check.sh all      all of them, the summary put into dev/notes/multi-gpu.md as the
#                                        newest section of its history
#                                        (on a machine without GPUs: the build alone, as CI runs it)
#
# Output: each stage's log and a summary line per result in ${OUT:-.bench}/multi_gpu/ (summary.txt).
# NVLink multicast stays off (the programs set NCCL_NVLS_ENABLE=0; so does this script).
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-all}
dir=${OUT:-.bench}/multi_gpu
mkdir -p "$dir"
export NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
say() { echo "$*" | tee -a "$dir/summary.txt"; }

make_args() {  # for make: DEPS_PREFIX (given, or the carried .devdeps/), and NCCL_HOME: given, found by
  # make itself, or the carried wheel unpacked
  local deps=${DEPS_PREFIX:-} d=""
  [ -z "$deps" ] && [ -d .devdeps/usr ] && deps=$PWD/.devdeps/usr
  [ -n "$deps" ] && d="DEPS_PREFIX=$deps" && echo -n "$d "
  if [ -n "${NCCL_HOME:-}" ]; then echo "NCCL_HOME=$NCCL_HOME"; return; fi
  local whl; whl=$(ls .whl/nvidia_nccl_cu1*.whl 2>/dev/null | head -n1)
  if [ -n "$whl" ] && make $d -n 2>/dev/null | grep -q "^probe NCCL: not found"; then
    mkdir -p .whl/nccl && python3 -m zipfile -e "$whl" .whl/nccl >/dev/null 2>&1
    echo "NCCL_HOME=$PWD/.whl/nccl/nvidia/nccl"
  fi
}

do_build() {
  local args; args=$(make_args)
  echo "make $args (GPUs: $ngpu)"
  make $args 2>&1 | tee "$dir/build.log" | grep -E "^probe|error" || true
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    say "build: no nvcc: the programs run on the CPU (the ranks through the TCP ring); bench_dp needs CUDA"
    [ -x ./train_grpo ] || { echo "build failed: see $dir/build.log"; exit 1; }
    return
  fi
  make $args bench-dp 2>&1 | tee -a "$dir/build.log" | grep -E "error" || true
  [ -x ./train_grpo ] && [ -x build/bench_dp ] || { echo "build failed: see $dir/build.log"; exit 1; }
  grep -q "probe NCCL: not found" "$dir/build.log" && say "build: WITHOUT NCCL (gradients through the host): carry the wheel in .whl/"
  say "build: $(grep '^probe NCCL' "$dir/build.log" | head -n1)"
}

do_one() {
  rm -rf "$dir/one" "$dir/one-dp"
  local t0=$SECONDS
  ./train_grpo --output_dir "$dir/one" > "$dir/one.log" 2>&1
  say "world 1, ./train_grpo: exit $?, $(( SECONDS - t0 )) s, $(grep 'held-out accuracy:' "$dir/one.log")"
  ./train_grpo --nproc_per_node 1 --output_dir "$dir/one-dp" > "$dir/one-dp.log" 2>&1
  say "world 1, --nproc_per_node 1: $(grep 'held-out accuracy:' "$dir/one-dp.log")"
  if [ "$ngpu" -ge 2 ]; then
    rm -rf "$dir/two"
    ./train_grpo --nproc_per_node 2 --per_device_train_batch_size 32 --output_dir "$dir/two" > "$dir/two.log" 2>&1
    say "world 2 (2 x 32 completions a step): $(grep 'held-out accuracy:' "$dir/two.log"); $(grep -o 'gradients summed over them by [a-z]*' "$dir/two.log")"
  fi
}

# the GRPO step: 64 completions a GPU (8 prompts x 8), prompt 128 + 256 new tokens, micro-batches of 4, recompute
do_grpo() {
  local base="" W
  for W in 1 2 4; do
    [ "$W" -le "$ngpu" ] || continue
    ./build/bench_dp grpo --model 8b --batch 64 --group 8 --prompt 128 --new 256 --micro 4 --recompute --steps 3 --warmup 1 \
      --nproc_per_node "$W" > "$dir/grpo-$W.log" 2>&1 || { say "grpo world $W: failed (see $dir/grpo-$W.log)"; continue; }
    local row tps share
    row=$(grep -A1 '^world' "$dir/grpo-$W.log" | tail -n1)
    tps=$(echo "$row" | awk '{print $NF}')
    share=$(echo "$row" | awk '{print $9}')
    [ -n "$base" ] || base=$tps
    say "grpo 8B shape, world $W: $tps completion tokens/s, $(awk -v a="$tps" -v b="$base" 'BEGIN {printf "%.2fx", a / b}') one GPU's, all-reduce $share of the step; $(grep 'peak GiB' "$dir/grpo-$W.log")"
  done
}

# full fine-tuning, FP8 delayed scaling (its amaxes reduced over the ranks), 4 x 2048 tokens a GPU, recompute:
# tokens/s and each GPU's peak on 1, 2, 4 GPUs at the 3B shape (the goal: >= 1.85x on 2, >= 3.6x on 4,
# each GPU's peak on 4 at most half one GPU's); then the 8B shape on the most GPUs there are, and on one
# (which says how much it would need)
do_full() {
  local W base="" basepk=""
  for W in 1 2 4; do
    [ "$W" -le "$ngpu" ] || continue
    ./build/bench_dp full --model 3b --batch 4 --seq 2048 --recompute --recipe delayed --steps 3 --warmup 1 --nproc_per_node "$W" \
      > "$dir/full-$W.log" 2>&1 || { say "full 3B world $W: failed ($(grep -m1 error "$dir/full-$W.log"))"; continue; }
    local tps pk
    tps=$(grep -A1 '^world' "$dir/full-$W.log" | tail -n1 | awk '{print $NF}')
    pk=$(grep 'peak GiB' "$dir/full-$W.log" | awk '{m = 0; for (i = 5; i <= NF; i++) if ($i + 0 > m) m = $i + 0; print m}')
    [ -n "$base" ] || base=$tps basepk=$pk
    say "full 3B shape, FP8 delayed, world $W: $tps tokens/s ($(awk -v a="$tps" -v b="$base" 'BEGIN {printf "%.2fx", a / b}') one GPU's); peak GiB per GPU: $(grep 'peak GiB' "$dir/full-$W.log" | cut -d: -f2) (the largest $(awk -v a="$pk" -v b="$basepk" 'BEGIN {printf "%.2fx", a / b}') one GPU's); $(grep 'a rank holds' "$dir/full-$W.log")"
  done
  for W in 1 $ngpu; do
    ./build/bench_dp full --model 8b --batch 4 --seq 2048 --recompute --recipe delayed --steps 3 --warmup 1 --nproc_per_node "$W" \
      > "$dir/full8b-$W.log" 2>&1
    if grep -q '^world' "$dir/full8b-$W.log"; then
      say "full 8B shape, FP8 delayed, world $W: $(grep -A1 '^world' "$dir/full8b-$W.log" | tail -n1 | awk '{print $NF}') tokens/s; $(grep 'peak GiB' "$dir/full8b-$W.log")"
    else say "full 8B shape, world $W: $(grep -m1 error "$dir/full8b-$W.log")"; fi
  done
}

# GRPO with completions that end at EOS (the built-in task's lengths) on every GPU: each step the ranks
# wait for the slowest rank's rollout (time/rank_wait) and update (time/update_wait), beside the
# transfers themselves (time/all_reduce); the waits' share of the step (the goal: <= 10%)
do_balance() {
  [ "$ngpu" -ge 2 ] || { say "balance: needs 2 GPUs"; return; }
  rm -rf "$dir/balance"
  ./train_grpo --nproc_per_node "$ngpu" --max_steps 60 --eval_steps 0 --output_dir "$dir/balance" > "$dir/balance.log" 2>&1
  say "balance, $ngpu GPUs, built-in task (EOS), steps 11-60: $(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "\"step_time\"" in l]
rows = [r for r in rows if r["step"] > 10]
mean = lambda k: sum(r[k] for r in rows) / len(rows)
st, ro, w, u, a = (mean(k) for k in ("step_time", "time/rollout", "time/rank_wait", "time/update_wait", "time/all_reduce"))
share = sorted((r["time/rank_wait"] + r["time/update_wait"]) / r["step_time"] for r in rows)
print("step %.1f ms (rollout %.1f), waiting for the slowest rollout %.2f ms (%.1f%%), for the slowest update %.2f ms (%.1f%%): idle %.1f%% of the step (a step: median %.1f%%, 90th percentile %.1f%%); the gradients all-reduce %.2f ms"
      % (1e3 * st, 1e3 * ro, 1e3 * w, 100 * w / st, 1e3 * u, 100 * u / st, 100 * (w + u) / st, 100 * share[len(share) // 2],
         100 * share[len(share) * 9 // 10], 1e3 * a))
' "$dir/balance/metrics.jsonl" 2>&1)"
}

# SFT of every weight, FP8 delayed, on 1 GPU and on 2 with the same global batch (16 a step): the two
# loss curves (metrics.jsonl of each, for dev/plot_dp_sft.py)
do_sft() {
  [ "$ngpu" -ge 2 ] || { say "sft: needs 2 GPUs"; return; }
  rm -rf "$dir/sft-1" "$dir/sft-2" "$dir/sft-base"
  XDG_CACHE_HOME="$dir/sft-base/cache" ./train_grpo --max_steps 1 --output_dir "$dir/sft-base" > "$dir/sft-base.log" 2>&1
  local model; model=$(ls -d "$dir"/sft-base/cache/fp8-grpo/warmup-* | head -n1)
  for i in $(seq 0 399); do echo "{\"prompt\": \"$((i % 23))+$((i % 17))=\", \"completion\": \"$((i % 23 + i % 17))\"}"; done >"$dir/sum.jsonl"
  local args="--model $model --data $dir/sum.jsonl --chat 0 --max_steps 200 --learning_rate 2e-4 --logging_steps 1 --fp8_recipe delayed --quiet"
  ./train_sft $args --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --output_dir "$dir/sft-1" > "$dir/sft-1.log" 2>&1
  local rc1=$?
  ./train_sft $args --per_device_train_batch_size 8 --nproc_per_node 2 --output_dir "$dir/sft-2" > "$dir/sft-2.log" 2>&1
  say "sft, FP8 delayed, 16 examples a step: 1 GPU (exit $rc1) $(tail -n1 "$dir/sft-1.log"); 2 GPUs (exit $?) $(tail -n1 "$dir/sft-2.log")"
  cp "$dir/sft-1/metrics.jsonl" "$dir/sft-1.jsonl" 2>/dev/null; cp "$dir/sft-2/metrics.jsonl" "$dir/sft-2.jsonl" 2>/dev/null
}

do_kill() {
  [ "$ngpu" -ge 2 ] || { say "kill: needs 2 GPUs"; return; }
  rm -rf "$dir/kill"
  local t0 rc
  t0=$(date +%s)
  FP8GRPO_TEST_KILL=1:3 ./train_grpo --nproc_per_node 2 --max_steps 6 --save_steps 2 --output_dir "$dir/kill" > "$dir/kill.log" 2>&1
  rc=$?
  say "kill: exit $rc after $(( $(date +%s) - t0 )) s: $(grep -m1 'error: rank' "$dir/kill.log")"
  ./train_grpo --nproc_per_node 2 --max_steps 6 --save_steps 2 --resume --output_dir "$dir/kill" > "$dir/resume.log" 2>&1
  say "resume: exit $? $(grep -m1 'resumed from' "$dir/resume.log"); $(grep 'held-out accuracy:' "$dir/resume.log")"
}

case "$stage" in
  build) do_build ;;
  one) do_one ;;
  grpo) do_grpo ;;
  full) do_full ;;
  kill) do_kill ;;
  balance) do_balance ;;
  sft) do_sft ;;
  all)  # every stage, then the summary into dev/notes/multi-gpu.md (this tree's; copy it back from a GPU machine)
    : > "$dir/summary.txt"
    do_build
    if [ "$ngpu" -ge 1 ]; then
      for st in one grpo full balance sft kill; do
        t0=$SECONDS; "do_$st"; echo "stage $st: $(( SECONDS - t0 )) s"
      done
      { echo "### dev/multi_gpu_check.sh all ($(date -u '+%F %H:%M') UTC, $ngpu x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1))"
        echo; sed 's/^/- /' "$dir/summary.txt"; } > "$dir/section.md"
      # under the "## History, newest first" heading, the newest section (at the end where there is none)
      awk -v f="$dir/section.md" 'BEGIN { while ((getline l < f) > 0) sec = sec l "\n" }
        { print } /^## History/ && !done { printf "\n%s", sec; done = 1 } END { if (!done) printf "\n%s", sec }' \
        dev/notes/multi-gpu.md > "$dir/multi-gpu.md" && cp "$dir/multi-gpu.md" dev/notes/multi-gpu.md
    else say "no GPU: only the build stage runs here"; fi ;;
  *) echo "usage: bash dev/multi_gpu_check.sh build|one|grpo|full|balance|sft|kill|all"; exit 1 ;;
esac
echo "summary: $dir/summary.txt"
