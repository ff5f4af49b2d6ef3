// dev/bench_dp.c: several GPUs, one process each (dist.h), on random weights of the named shapes.
//   grpo  the GRPO step data parallel at the Qwen3 shape (FP8 block weights, LoRA r 16 on every
//         projection): each rank rolls out its own P prompts x G completions, then trains on them
//         (forward, logprobs, backward in micro-batches, --recompute), the LoRA gradients summed over
//         the ranks (dp_all_reduce_grads: NCCL), AdamW. The same per-GPU batch at every world size,
//         so the ideal is world x one GPU's completions/s; the all-reduce's share of the step is
//         timed after a barrier (so it holds no wait for a slower rank).
//   full  full fine-tuning at the Llama-3.2 shape, sharded (full_finetune.h's ZeRO: masters and AdamW moments
//         by rank, gradients reduce-scattered, weights all-gathered); tokens/s and each GPU's peak.
// Each step is timed from a barrier to a barrier; the median of --steps after --warmup. Rank 0 prints
// one table last (world size, the machine); every rank's peak memory is gathered.
//
//   make bench-dp
//   ./build/bench_dp grpo --model 8b --batch 32 --group 8 --prompt 128 --new 256 --micro 4 --nproc_per_node 2
//   ./build/bench_dp full --model 3b --batch 4 --seq 2048 --recompute --recipe delayed --nproc_per_node 2
// (--nproc_per_node as the programs': or launch it with torchrun / srun; NCCL_NVLS_ENABLE=0 is set.)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora.h"
#include "model.h"
#include "rollout.h"
#include "shapes.h"
#include "dist/data_parallel.h"
#include "train/full_finetune.h"
#include "io/options.h"  // backend_select

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *x, int n) {
    qsort(x, n, sizeof(double), cmp_d);
    return x[n / 2];
}

typedef struct {
    const char *mode, *model, *recipe;
    int batch, group, prompt, nnew, micro, seq, steps, warmup, recompute;
} Args;

// per step, seconds: [0] the step (the all-reduce included, the barrier before it not), [1] rollout,
// [2] update without the all-reduce, [3] the all-reduce
// (or, full: [1] forward + backward, [2] full_step with its collectives)
typedef struct {
    double t[4];
} Times;

static void grpo_step(Dist *d, Model *m, LoRA *lo, const Args *a, int **prompts, int *plens, uint64_t *seeds, int step, Times *tm) {
    const Backend *be = m->be;
    int P = a->batch / a->group, S = a->batch, T = a->prompt + a->nnew;
    dist_barrier(d);
    double t0 = now_sec();
    for (int s = 0; s < S; s++) seeds[s] = 1000003ull * step + 7919ull * dist_rank(d) + s;
    // no EOS: every completion runs to --new tokens, so every rank has the same work
    RolloutConfig rc = {a->group, a->nnew, 1.0f, 1.0f, 0, NULL, 0, 16, 1};
    Rollout ro;
    rollout_run(m, lo, &rc, P, (const int *const *)prompts, plens, seeds, &ro);
    be->sync();
    double t1 = now_sec();
    int *ids = (int *)mallocCheck((size_t)S * T * sizeof(int)), *tg = (int *)mallocCheck((size_t)S * T * sizeof(int));
    double *lp = (double *)mallocCheck((size_t)a->micro * T * sizeof(double)), *dl = (double *)mallocCheck((size_t)a->micro * T * sizeof(double));
    for (int q = 0; q < S; q++)
        for (int t = 0; t < T; t++) {
            ids[q * T + t] = t < a->prompt ? prompts[q / a->group][t] : ro.ids[(size_t)q * a->nnew + t - a->prompt];
            tg[q * T + t] = t >= a->prompt - 1 && t < T - 1 ? ro.ids[(size_t)q * a->nnew + t + 1 - a->prompt] : -1;
        }
    lora_zero_grads(lo);
    for (int b0 = 0; b0 < S; b0 += a->micro) {
        int nb = S - b0 < a->micro ? S - b0 : a->micro;
        model_forward(m, lo, ids + (size_t)b0 * T, nb, T);
        model_logprobs(m, tg + (size_t)b0 * T, 1.0f, lp);
        for (int i = 0; i < nb * T; i++) dl[i] = tg[(size_t)b0 * T + i] < 0 ? 0 : -1.0 / ((double)S * a->nnew * dist_world(d));
        model_backward(m, lo, dl);
    }
    be->sync();
    double t2 = now_sec();
    dist_barrier(d);  // the all-reduce alone, not the wait for the slowest rank
    double t3 = now_sec();
    dp_all_reduce_grads(d, be, lo->grads, lo->n);
    double t4 = now_sec();
    lora_adamw_step(lo, 1e-5f, 0.9f, 0.999f, 1e-8f, 0.0f);
    be->sync();
    dist_barrier(d);
    double t5 = now_sec();
    tm->t[0] = t5 - t0 - (t3 - t2), tm->t[1] = t1 - t0, tm->t[2] = (t2 - t1) + (t5 - t4), tm->t[3] = t4 - t3;
    rollout_free(&ro);
    free(ids), free(tg), free(lp), free(dl);
}

static void full_one(Dist *d, Model *m, FullTrainer *ft, const Args *a, const int *ids, const int *tg, const double *dl, double *lp,
                     Times *tm) {
    const Backend *be = m->be;
    dist_barrier(d);
    double t0 = now_sec();
    model_forward(m, NULL, ids, a->batch, a->seq);
    model_logprobs(m, tg, 1.0f, lp);
    model_backward(m, NULL, dl);
    be->sync();
    double t1 = now_sec();
    full_step(ft, m, 1e-5f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0);
    model_zero_grads(m);
    be->sync();
    dist_barrier(d);
    double t2 = now_sec();
    tm->t[0] = t2 - t0, tm->t[1] = t1 - t0, tm->t[2] = t2 - t1, tm->t[3] = 0;
}

int main(int argc, char **argv) {
    Args a = {.mode = argc > 1 ? argv[1] : "", .model = NULL, .recipe = "off", .batch = 32, .group = 8, .prompt = 128, .nnew = 256, .micro = 4,
              .seq = 2048, .steps = 3, .warmup = 1, .recompute = 0};
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(k, "--recompute")) a.recompute = 1;
        else if (!strcmp(k, "--model")) a.model = v, i++;
        else if (!strcmp(k, "--recipe")) a.recipe = v, i++;
        else if (!strcmp(k, "--batch")) a.batch = atoi(v), i++;
        else if (!strcmp(k, "--group")) a.group = atoi(v), i++;
        else if (!strcmp(k, "--prompt")) a.prompt = atoi(v), i++;
        else if (!strcmp(k, "--new")) a.nnew = atoi(v), i++;
        else if (!strcmp(k, "--micro")) a.micro = atoi(v), i++;
        else if (!strcmp(k, "--seq")) a.seq = atoi(v), i++;
        else if (!strcmp(k, "--steps")) a.steps = atoi(v), i++;
        else if (!strcmp(k, "--warmup")) a.warmup = atoi(v), i++;
        else if (!strncmp(k, "--nproc", 7)) i += !strchr(k, '=');  // dist_launch's
        else die("bench_dp: unknown argument '%s'", k);
    }
    int grpo = !strcmp(a.mode, "grpo");
    if (!grpo && strcmp(a.mode, "full"))
        die("usage: bench_dp grpo|full [--model 8b|0.6b (grpo), 3b|1b (full)] [--batch B] [--group G] [--prompt T] [--new T] "
            "[--micro B] [--seq T] [--recompute] [--recipe off|delayed|current|block (full)] [--steps n] [--warmup n] [--nproc_per_node N]");
    if (!a.model) a.model = grpo ? "8b" : "3b";
    if (a.batch < 1 || a.micro < 1 || a.steps < 1 || a.warmup < 0) die("bench_dp: --batch, --micro and --steps must be positive");
    if (grpo && (a.group < 1 || a.batch % a.group)) die("bench_dp grpo: --batch must be a positive multiple of --group");
    dist_launch(argc, argv);
    Dist *d = dist_from_env();
    int W = dist_world(d), rank = dist_rank(d);
    const Backend *be = backend_select("cuda", rank == 0);
    Config cfg = grpo ? bench_shape(a.model) : llama32_shape(a.model);
    ModelOptions opt = {grpo ? FP8_BLOCK : FP8_OFF, 0, 0, 0, 0};
    Model m;
    model_init_random(&m, &cfg, be, &opt, 1234);
    m.recompute = a.recompute;
    Times *tm = (Times *)callocCheck(a.steps + a.warmup, sizeof(Times));
    double tokens_step;  // this rank's tokens a step
    if (grpo) {
        LoRA *lo = lora_create(&m, 16, 32.0f, (1u << LIN_COUNT) - 1, 7, 0);
        m.lora = lo;
        dist_broadcast(d, be, lo->params, lo->n * dtype_size(lo->sdt), 0);  // as train_grpo's begin
        int P = a.batch / a.group;
        Rng r = rng_make(11 + rank);  // each rank its own prompts
        int **prompts = (int **)mallocCheck(P * sizeof(int *)), *plens = (int *)mallocCheck(P * sizeof(int));
        for (int p = 0; p < P; p++) {
            prompts[p] = (int *)mallocCheck(a.prompt * sizeof(int));
            for (int t = 0; t < a.prompt; t++) prompts[p][t] = rng_int(&r, 150000);
            plens[p] = a.prompt;
        }
        uint64_t *seeds = (uint64_t *)mallocCheck(a.batch * sizeof(uint64_t));
        for (int s = 0; s < a.warmup + a.steps; s++) {
            grpo_step(d, &m, lo, &a, prompts, plens, seeds, s, &tm[s]);
            if (rank == 0)
                fprintf(stderr, "  step %d: %.2f s (rollout %.2f, update %.2f, all-reduce %.1f ms)%s\n", s, tm[s].t[0], tm[s].t[1],
                        tm[s].t[2], tm[s].t[3] * 1e3, s < a.warmup ? " (warm-up)" : "");
        }
        tokens_step = (double)a.batch * a.nnew;  // generated tokens: the rollout's, GRPO's cost
        if (rank == 0)
            printf("LoRA: %zu parameters, %.1f MiB of fp32 gradients all-reduced a step (%s)\n", lo->n, lo->n * 4 / 1048576.0,
                   dist_transport(d, be));
    } else {
        if (strcmp(a.recipe, "off")) {  // FP8 training (fp8_train.cu); delayed: the amaxes reduced over the ranks
            FP8Recipe rc = fp8_recipe_default();
            int k = fp8_recipe_parse(a.recipe);
            if (k < 0) die("bench_dp: --recipe: unknown '%s' (off, delayed, current, block)", a.recipe);
            rc.kind = (FP8RecipeKind)k;
            model_fp8_train(&m, &rc);
        }
        FullTrainer ft;
        full_init_sharded(&ft, &m, d, 0);
        int N = a.batch * a.seq;
        int *ids = (int *)mallocCheck(N * sizeof(int)), *tg = (int *)mallocCheck(N * sizeof(int));
        double *dl = (double *)mallocCheck(N * sizeof(double)), *lp = (double *)mallocCheck(N * sizeof(double));
        Rng rng = rng_make(5 + rank);
        for (int i = 0; i < N; i++) ids[i] = rng_int(&rng, 128000);
        for (int i = 0; i < N; i++) tg[i] = (i % a.seq == a.seq - 1) ? -1 : ids[i + 1];
        for (int i = 0; i < N; i++) dl[i] = tg[i] < 0 ? 0 : -1.0 / ((double)N * W);  // the mean NLL over every rank's tokens
        for (int s = 0; s < a.warmup + a.steps; s++) {
            full_one(d, &m, &ft, &a, ids, tg, dl, lp, &tm[s]);
            if (rank == 0)
                fprintf(stderr, "  step %d: %.3f s (forward + backward %.3f, full_step with its collectives %.3f)%s\n", s, tm[s].t[0],
                        tm[s].t[1], tm[s].t[2], s < a.warmup ? " (warm-up)" : "");
        }
        tokens_step = (double)N;
        if (rank == 0)
            printf("full fine-tuning: %zu parameters; a rank holds masters + moments + gradients of %zu (%.1f GiB), and of the "
                   "other values %s (%.1f GiB)\n", ft.n, ft.hi - ft.lo, 16.0 * (ft.hi - ft.lo) / 1073741824.0,
                   W > 1 ? "the gradients outside the layers and one layer's bucket" : "none",
                   W > 1 ? (double)m.gw.dense_bytes / 1073741824.0 : 0.0);
    }
    double col[4][64];
    for (int k = 0; k < 4; k++)
        for (int s = 0; s < a.steps && s < 64; s++) col[k][s] = tm[a.warmup + s].t[k];
    int ns = a.steps < 64 ? a.steps : 64;
    double step = median(col[0], ns), part1 = median(col[1], ns), part2 = median(col[2], ns), ar = median(col[3], ns);
    size_t peak = 0;
    be->mem_in_use(&peak);
    double *peaks = (double *)callocCheck(W, sizeof(double));
    peaks[rank] = peak / 1073741824.0;
    dist_all_gather_host(d, peaks, sizeof(double));
    if (rank == 0) {
        printf("\nbench_dp %s, %s shape, %d GPU%s (%s), %s%s%s\n", a.mode, a.model, W, W > 1 ? "s" : "", be->device_desc,
               grpo ? "FP8 block weights, LoRA r 16" : "BF16 weights, fp32 masters + AdamW sharded", grpo ? "" : ", FP8 recipe ",
               grpo ? "" : a.recipe);
        if (grpo)
            printf("%-5s %-9s %-9s %-8s %-9s %-9s %-13s %-8s %-16s %s\n", "world", "per GPU", "prompt", "new", "step s", "rollout s",
                   "update s", "allred ms", "allred share", "completion tok/s (all GPUs)");
        else printf("%-5s %-9s %-7s %-9s %-11s %-11s %s\n", "world", "per GPU", "seq", "step s", "fwd+bwd s", "full_step s", "tokens/s (all GPUs)");
        if (grpo)
            printf("%-5d %-9d %-9d %-8d %-9.3f %-9.3f %-13.3f %-8.1f %-16.2f%% %.0f\n", W, a.batch, a.prompt, a.nnew, step, part1, part2,
                   ar * 1e3, 100 * ar / step, W * tokens_step / step);
        else printf("%-5d %-9d %-7d %-9.3f %-11.3f %-11.3f %.0f\n", W, a.batch, a.seq, step, part1, part2, W * tokens_step / step);
        printf("peak GiB per GPU:");
        for (int r = 0; r < W; r++) printf(" %.2f", peaks[r]);
        printf("\n");
    }
    free(peaks), free(tm);
    dist_finalize(d);
    return 0;
}
