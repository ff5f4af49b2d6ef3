// dev/bench_grpo.c: one GRPO step at a named shape on the CUDA backend, and the memory it takes as the
// process holds it (the seeds' memory table: dev/notes/memory.md). Random weights are built on the GPU straight
// into the format the model computes with (model_init_random: one tensor at a time through a staging
// buffer, never a BF16 copy of the model). The step is train_grpo's: the rollout engine samples G
// completions of each of P random prompts (no EOS: every completion runs to --new tokens), then the
// update runs forward + logprobs + backward over micro-batches (chosen by memory_fit.h as train_grpo
// chooses them, or --micro_batch / --recompute) and one AdamW step; dL/dlogp is +-1/N per token, an
// advantage-like weight (the GRPO loss itself is host arithmetic and takes no device memory).
//
// Memory: "held" is cudaMemGetInfo's total - free, read after the backend starts (the CUDA context,
// cuBLAS/cuBLASLt and their workspaces: "context"), after the weights, after the rollout and after
// every micro-batch of the update; the peak is the largest reading (everything the step makes stays
// allocated to the end: the arena, LoRA's buffers, the backend's scratch, which only grows). It
// assumes no other process uses the GPU. Then each part, from the model's own tables.
//
//   make -C dev ../build/bench_grpo
//   ./build/bench_grpo --model 8b                               # FP8 block, 8 prompts x 8, 256 + 512
//   ./build/bench_grpo --model 8b --fp8 off                     # the project's BF16 mode, same step
//   ./build/bench_grpo --model 8b --fp8_embeddings --kv fp8 --lora_dtype bf16 --total_gib 10
//   ./build/bench_grpo --model 8b --total_gib 24 --fit_new      # the longest completion that fits 24 GiB
//   ./build/bench_grpo --model 8b --reward_model 8b              # with an 8B-shaped FP8 reward model
//   ./build/bench_grpo --model qwen3-30b-a3b --new 256           # the MoE: 8 x 8, 256 + 256, LoRA r 16 on the attention
// --total_gib X caps what the process holds, context included: the arena (KV cache / activations) gets
// X less the context, weights, LoRA and --reserve_gib for the backend's scratch; without it the arena
// gets --gpu_memory_utilization of the device, as train_grpo; --arena_gib X sets the arena's cap itself
// (two runs compared at the same arena). --save DIR writes the shape's random weights as a bf16
// checkpoint in the published layout and stops (for ./train_grpo --model DIR, with a tokenizer.json put
// beside; qwen3-30b-a3b: 61 GB, model_type qwen3_moe; gemma3-*: Gemma3ForConditionalGeneration's names).
// --reward_model SHAPE adds a reward model of that shape (random weights, a score head; --reward_fp8, default
// --fp8) held beside the policy before the arena's budget is set, as train_grpo holds one, which scores every
// prompt + completion between the rollout and the update in the policy's arena (train/reward_model.h): its
// time and memory are parts of the step. --fit_new: --new becomes the longest completion (a multiple of 64)
// whose step fits that arena for one prompt's G completions (the KV cache of the prompt and its G completions,
// and the update of one sequence with recomputation), then runs.
// Prints one summary table last.
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora.h"
#include "model.h"
#include "rollout.h"
#include "shapes.h"
#include "train/memory_fit.h"
#include "train/reward_model.h"
#include "io/options.h"  // backend_select

static double gib(size_t b) { return b / 1073741824.0; }
static size_t gpu_used(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) die("cudaMemGetInfo failed");
    return tot - fr;
}
static size_t peak;  // the largest reading of gpu_used
static size_t sample(void) {
    size_t u = gpu_used();
    if (u > peak) peak = u;
    return u;
}

typedef struct {
    const char *size;
    FP8Gran gran;
    int kv_fp8, fp8_embed, lora_bf16;
    int P, G, prompt, nnew, rank, want_mb, want_rc, fit_new;
    double total_gib, util, reserve_gib, arena_gib;
    const char *save;
    const char *reward;  // --reward_model SHAPE, or NULL
    FP8Gran reward_gran;
    int reward_gran_set;
} Args;

// bytes of the weights by part: FP8 (or dense) linears, embedding table, LM head, the rest (norms, biases)
typedef struct {
    size_t linear, emb, head, other;
} WeightBytes;
static WeightBytes weight_bytes(const Model *m) {
    const Config *c = &m->cfg;
    WeightBytes w = {m->w.linear_bytes, 0, 0, 0};
    size_t act = dtype_size(m->be->act), tab = (size_t)c->V * c->C;
    size_t one = m->w.emb.gran == FP8_OFF ? tab * act : tab + (size_t)c->V * 4;
    w.emb = one;
    w.head = c->tied ? 0 : one;
    size_t all = m->w.dense_bytes + m->w.fp8_bytes;
    w.other = all > w.linear + w.emb + w.head ? all - w.linear - w.emb - w.head : 0;
    return w;
}

// the longest completion (a multiple of 64) whose step fits an arena of cap bytes, one prompt's G
// completions at a time (what continuous batching needs at least: their KV blocks, rollout.c's count
// plus one per completion, beside the prompt's prefill) and an update of one sequence with recomputation
static int fit_new_tokens(const Model *m, const Args *a, size_t cap) {
    int best = 0;
    for (int n = 64; a->prompt + n <= m->cfg.max_pos; n += 64) {
        int blocks = (a->prompt + 15) / 16 + a->G * ((n + 15) / 16 + 1);  // the shared prompt + each completion
        size_t kv = kvcache_bytes(m, blocks, 16) + model_acts_bytes(m, 1, a->prompt, ACTS_FORWARD_ONLY);  // + its prefill
        size_t acts = memfit_bytes(m, 1, a->prompt + n, 1);
        if (kv > cap || acts > cap) break;
        best = n;
    }
    if (!best) die("--fit_new: not even 64 new tokens fit the arena of %.2f GiB", gib(cap));
    return best;
}

static void run(Args *a) {
    const Backend *be = backend_select("cuda", 1);
    be->sync();
    size_t ctx = sample(), total = 0, fr = 0;
    cudaMemGetInfo(&fr, &total);
    Config cfg = bench_shape(a->size);
    ModelOptions opt = {a->gran, 0, 0, 0, a->fp8_embed};
    Model m;
    double t0 = now_sec();
    model_init_random(&m, &cfg, be, &opt, 1234);
    be->sync();
    double t_init = now_sec() - t0;
    size_t after_w = sample();
    RewardModel rm;
    memset(&rm, 0, sizeof rm);
    if (a->reward) {
        Config rc = bench_shape(a->reward);
        reward_model_init_random(&rm, &rc, be, a->reward_gran_set ? a->reward_gran : a->gran, 4321);
        be->sync();
    }
    size_t after_rm = sample();
    m.kv_fp8 = a->kv_fp8;
    LoRA *lo = lora_create(&m, a->rank, 2.0f * a->rank, (1u << LIN_COUNT) - 1, 7, a->lora_bf16);
    m.lora = lo;
    size_t lora_state = lora_state_bytes(lo);
    be->sync();
    size_t held = sample(), reserve = (size_t)(a->reserve_gib * 1073741824.0);
    size_t budget = a->total_gib > 0 ? (size_t)(a->total_gib * 1073741824.0) : ctx + (size_t)(a->util * (total - ctx));
    if (a->arena_gib > 0) model_arena_init(&m, (size_t)(a->arena_gib * 1073741824.0));
    else {
        if (budget <= held + reserve)
            die("the budget of %.2f GiB is below what the weights and LoRA hold (%.2f GiB, context included) and the "
                "reserve (%.2f GiB): raise --total_gib / --gpu_memory_utilization",
                gib(budget), gib(held), gib(reserve));
        model_arena_init(&m, budget - held - reserve);
    }
    if (a->fit_new) a->nnew = fit_new_tokens(&m, a, m.arena.cap);
    fprintf(stderr, "%s %s: weights in %.1f s, %.2f GiB held with the context; arena up to %.2f GiB\n", a->size,
            fp8_gran_name(a->gran), t_init, gib(held), gib(m.arena.cap));

    // rollout: P random prompts, G completions each, every one --new tokens long
    int P = a->P, G = a->G, S = P * G;
    Rng r = rng_make(11);
    int **prompts = (int **)mallocCheck(P * sizeof(int *)), *plens = (int *)mallocCheck(P * sizeof(int));
    for (int p = 0; p < P; p++) {
        prompts[p] = (int *)mallocCheck(a->prompt * sizeof(int));
        for (int t = 0; t < a->prompt; t++) prompts[p][t] = rng_int(&r, cfg.V < 150000 ? cfg.V : 150000);
        plens[p] = a->prompt;
    }
    uint64_t *seeds = (uint64_t *)mallocCheck(S * sizeof(uint64_t));
    for (int s = 0; s < S; s++) seeds[s] = 1000 + s;
    RolloutConfig rc = {G, a->nnew, 1.0f, 1.0f, 0, NULL, 0, 16, 1};
    Rollout ro;
    double t1 = now_sec();
    rollout_run(&m, lo, &rc, P, (const int *const *)prompts, plens, seeds, &ro);
    be->sync();
    double t_roll = now_sec() - t1;
    size_t after_roll = sample();

    // the reward model: every prompt + completion scored (a forward alone, in the policy's arena)
    int T = a->prompt + a->nnew;
    double t_rm = 0, mean_score = 0;
    if (a->reward) {
        int **rids = (int **)mallocCheck(S * sizeof(int *)), *rlens = (int *)mallocCheck(S * sizeof(int));
        double *sc = (double *)mallocCheck(S * sizeof(double));
        for (int q = 0; q < S; q++) {
            rids[q] = (int *)mallocCheck(T * sizeof(int));
            for (int t = 0; t < T; t++)
                rids[q][t] = (t < a->prompt ? prompts[q / G][t] : ro.ids[(size_t)q * a->nnew + t - a->prompt]) % (rm.m.cfg.V - 1);
            rlens[q] = T;
        }
        double t3 = now_sec();
        reward_model_score_ids(&rm, &m, rids, rlens, S, sc, 1);
        be->sync();
        t_rm = now_sec() - t3;
        for (int q = 0; q < S; q++) mean_score += sc[q] / S, free(rids[q]);
        free(rids), free(rlens), free(sc);
        if (!isfinite(mean_score)) die("the reward model's scores are not finite (mean %g)", mean_score);
        sample();
    }

    // update: the batch prompt + completion, dL/dlogp at the completion tokens
    int *ids = (int *)mallocCheck((size_t)S * T * sizeof(int)), *tg = (int *)mallocCheck((size_t)S * T * sizeof(int));
    for (int q = 0; q < S; q++)
        for (int t = 0; t < T; t++) {
            ids[(size_t)q * T + t] = t < a->prompt ? prompts[q / G][t] : ro.ids[(size_t)q * a->nnew + t - a->prompt];
            int j = t + 1 - a->prompt;
            tg[(size_t)q * T + t] = j >= 0 && j < a->nnew ? ro.ids[(size_t)q * a->nnew + j] : -1;
        }
    FitChoice fc;
    if (memfit_update(&m, S, T, a->want_mb, a->want_rc, &fc) < 0)
        die("the update's activations need %.2f GiB at micro-batch %d with%s recomputation, the arena holds %.2f GiB",
            gib(fc.bytes), fc.mb, fc.recompute ? "" : "out", gib(m.arena.cap));
    m.recompute = fc.recompute;
    double *lp = (double *)mallocCheck((size_t)fc.mb * T * sizeof(double)), *dl = (double *)mallocCheck((size_t)fc.mb * T * sizeof(double));
    double t2 = now_sec(), mean_lp = 0;
    lora_zero_grads(lo);
    for (int b0 = 0; b0 < S; b0 += fc.mb) {
        int nb = S - b0 < fc.mb ? S - b0 : fc.mb;
        model_forward(&m, lo, ids + (size_t)b0 * T, nb, T);
        model_logprobs(&m, tg + (size_t)b0 * T, 1.0f, lp);
        for (size_t i = 0; i < (size_t)nb * T; i++) {
            dl[i] = tg[(size_t)b0 * T + i] < 0 ? 0 : ((i & 1) ? 1.0 : -1.0) / ((double)S * a->nnew);
            mean_lp += lp[i] / ((double)S * a->nnew);
        }
        model_backward(&m, lo, dl);
        sample();
    }
    lora_adamw_step(lo, 1e-5f, 0.9f, 0.999f, 1e-8f, 0.0f);
    be->sync();
    double t_upd = now_sec() - t2;
    size_t after_upd = sample();
    size_t bpeak = 0;
    be->mem_in_use(&bpeak);
    if (!isfinite(mean_lp)) die("the trainer's logprobs are not finite (mean %g)", mean_lp);

    // the parts
    WeightBytes wb = weight_bytes(&m);
    size_t lora_other = lora_acts_bytes(lo, lo->ax_cap) + lora_copies_bytes(lo);
    size_t rm_bytes = a->reward ? reward_model_weight_bytes(&rm) : 0;
    size_t parts = ctx + wb.linear + wb.emb + wb.head + wb.other + rm_bytes + lora_state + lora_other + m.arena.bytes + m.dec.bytes;
    size_t scratch = peak > parts ? peak - parts : 0;
    printf("\nGRPO step, %s shape (random weights), %s, %d prompts x %d completions, prompt %d + %d new, LoRA r %d "
           "on %s (%s masters and AdamW state)\n",
           a->size, be->device_desc, P, G, a->prompt, a->nnew, a->rank,
           cfg.E ? "the attention's 4 projections (qwen3_moe: the experts stay frozen)" : "all 7 projections",
           a->lora_bf16 ? "bf16" : "fp32");
    printf("weights %s, embeddings/LM head %s, KV cache %s; update: micro-batch %d x %d tokens, recomputation %s; "
           "rollout %.1f s (%d admissions after the first), update %.1f s; mean logprob %.3f\n",
           a->gran == FP8_OFF ? "bf16" : fp8_gran_name(a->gran), a->fp8_embed ? "fp8 rows" : "bf16",
           a->kv_fp8 ? "fp8" : "bf16", fc.mb, T, fc.recompute ? "on" : "off", t_roll, ro.admissions, t_upd, mean_lp);
    if (a->reward)
        printf("reward model %s shape, linears %s: scoring %.1f s (%d sequences of %d tokens, micro-batches in the arena), mean "
               "score %.3f\n", a->reward, fp8_gran_name(rm.m.opt.gran), t_rm, S, T, mean_score);
    printf("held (GiB): context %.2f, + weights %.2f", gib(ctx), gib(after_w));
    if (a->reward) printf(", + reward model %.2f", gib(after_rm));
    printf(", after the rollout %.2f, after the update %.2f; backend's own peak %.2f beyond the context\n", gib(after_roll),
           gib(after_upd), gib(bpeak));
    printf("| part | GiB |\n| --- | --- |\n");
    printf("| CUDA context + cuBLAS(Lt) | %.2f |\n", gib(ctx));
    printf("| weights: linears (%s) | %.2f |\n", a->gran == FP8_OFF ? "bf16" : "fp8 + scales", gib(wb.linear));
    printf("| weights: embedding table | %.2f |\n", gib(wb.emb));
    printf("| weights: LM head%s | %.2f |\n", cfg.tied ? " (tied: the table)" : "", gib(wb.head));
    printf("| weights: norms, biases | %.3f |\n", gib(wb.other));
    if (a->reward) {
        printf("| reward model: weights (%s linears, embedding table, norms, score head) | %.2f |\n",
               fp8_gran_name(rm.m.opt.gran), gib(rm_bytes));
        printf("| reward model: activations at most (in the arena, a forward's alone) | %.2f |\n", gib(rm.peak_acts));
    }
    printf("| LoRA params + grads + AdamW m, v | %.2f |\n", gib(lora_state));
    printf("| LoRA saved ax + rollout copies | %.2f |\n", gib(lora_other));
    printf("| arena (time-shared): KV cache at most | %.2f |\n", gib(m.arena.peak_kv));
    printf("| arena (time-shared): activations at most | %.2f |\n", gib(m.arena.peak_acts));
    printf("| arena as allocated | %.2f |\n", gib(m.arena.bytes));
    printf("| decode scratch | %.2f |\n", gib(m.dec.bytes));
    printf("| backend scratch (the rest: logits chunks, FP8 activations, dequantized W for dX, sampler) | %.2f |\n",
           gib(scratch));
    printf("| **peak held, context included** | **%.2f** |\n", gib(peak));
    printf("| step time: rollout, reward model, update (s) | %.2f, %.2f, %.2f |\n", t_roll, t_rm, t_upd);
    reward_model_close(&rm);
    rollout_free(&ro);
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
    for (int p = 0; p < P; p++) free(prompts[p]);
    free(prompts); free(plens); free(seeds); free(ids); free(tg); free(lp); free(dl);
}

int main(int argc, char **argv) {
    Args a = {"8b", FP8_BLOCK, 0, 0, 0, 8, 8, 256, 512, 16, 0, -1, 0, 0, 0.9, 1.0, 0, NULL, NULL, FP8_BLOCK, 0};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--model") && v) a.size = v, i++;
        else if (!strcmp(k, "--fp8") && v) {
            int g = fp8_gran_parse(v);
            if (g < 0) die("--fp8: block, row, tensor or off, not '%s'", v);
            a.gran = (FP8Gran)g, i++;
        } else if (!strcmp(k, "--kv") && v) a.kv_fp8 = !strcmp(v, "fp8"), i++;
        else if (!strcmp(k, "--fp8_embeddings")) a.fp8_embed = 1;
        else if (!strcmp(k, "--lora_dtype") && v) a.lora_bf16 = !strcmp(v, "bf16"), i++;
        else if (!strcmp(k, "--prompts") && v) a.P = atoi(v), i++;
        else if (!strcmp(k, "--generations") && v) a.G = atoi(v), i++;
        else if (!strcmp(k, "--prompt") && v) a.prompt = atoi(v), i++;
        else if (!strcmp(k, "--new") && v) a.nnew = atoi(v), i++;
        else if (!strcmp(k, "--rank") && v) a.rank = atoi(v), i++;
        else if (!strcmp(k, "--micro_batch") && v) a.want_mb = atoi(v), i++;
        else if (!strcmp(k, "--recompute")) a.want_rc = 1;
        else if (!strcmp(k, "--total_gib") && v) a.total_gib = atof(v), i++;
        else if (!strcmp(k, "--gpu_memory_utilization") && v) a.util = atof(v), i++;
        else if (!strcmp(k, "--reserve_gib") && v) a.reserve_gib = atof(v), i++;
        else if (!strcmp(k, "--arena_gib") && v) a.arena_gib = atof(v), i++;
        else if (!strcmp(k, "--fit_new")) a.fit_new = 1;
        else if (!strcmp(k, "--save") && v) a.save = v, i++;
        else if (!strcmp(k, "--reward_model") && v) a.reward = v, i++;
        else if (!strcmp(k, "--reward_fp8") && v) {
            int g = fp8_gran_parse(v);
            if (g < 0) die("--reward_fp8: block, row, tensor or off, not '%s'", v);
            a.reward_gran = (FP8Gran)g, a.reward_gran_set = 1, i++;
        }
        else die("usage: bench_grpo [--model " SHAPE_NAMES "] [--fp8 block|row|tensor|off] [--kv auto|fp8] "
                 "[--fp8_embeddings] [--lora_dtype fp32|bf16] [--prompts 8] [--generations 8] [--prompt 256] [--new 512] "
                 "[--rank 16] [--micro_batch N] [--recompute] [--total_gib X | --gpu_memory_utilization 0.9] "
                 "[--arena_gib X] [--reserve_gib 1] [--fit_new] [--save DIR] [--reward_model SHAPE] [--reward_fp8 GRAN]");
    }
    if (a.P < 1 || a.G < 1 || a.prompt < 1 || a.nnew < 1 || a.rank < 1 || a.want_mb < 0)
        die("--prompts, --generations, --prompt, --new, --rank must be positive");
    if (a.save) {  // the shape's random weights as a bf16 Hugging Face checkpoint (config.json + model.safetensors)
        Config cfg = bench_shape(a.size);
        ModelOptions dense = {FP8_OFF, 0, 0, 0, 0};
        Model m;
        model_init_random(&m, &cfg, backend_select("cuda", 1), &dense, 1234);
        model_save_hf(&m, a.save, DT_BF16);
        model_free(&m);
        printf("wrote a random %s checkpoint (bf16) to %s\n", a.size, a.save);
        return 0;
    }
    run(&a);
    return 0;
}
