// dev/bench_train.c: the LoRA training step on the CUDA backend, Qwen3-shaped random models.
// One step = model_forward + model_logprobs + model_backward + lora_adamw_step (+ zeroing the
// gradients), timed CUDA-synchronized; the median of several steps after warm-up. Memory from
// cudaMemGetInfo (what this process holds beyond the CUDA context), split by part.
// With --profile, one more step runs with every backend op timed by CUDA events (dev/op_profile.h),
// and attention / GEMM TFLOP/s are derived from it.
//
//   make bench-train && ./build/bench_train --model 0.6b --fp8 block,row,tensor,off --batch 8 --seq 1024
//   ./build/bench_train --model 8b --fp8 block --batch 4 --seq 1024
// --dx auto,fp8,bf16: each granularity with dX through the frozen FP8 weights as the program takes it
// (auto), as an FP8 product wherever it runs, and as the BF16 reference (fp8_linear_dx_cuda), a row each
// Prints one summary table last.
//
// With --logprob-error, a second table: the error of the per-token logprobs of each granularity
// against an fp32 reference. The reference is the same random model (same config, seed 1234) on
// the CPU backend ("cpu", OpenMP) with dense fp32 linear weights: model_init_random draws every
// weight in fp32 from (seed, tag, index) alone, so the CPU and CUDA models start from identical
// values, and the reference is exactly the model each row was built from (FP8 rows quantize these
// fp32 values, "off" rounds them to bf16), run in fp32. It is computed once, before the GPU runs
// (its time goes to stderr), and kept in memory only. Each granularity then scores the same
// tokens with the base model (its LoRA adapter skipped), after the timed steps.
// The tokens: B x T random ids with next-token targets, built as the timed steps build theirs.
// B x T is 2 x 512 unless --batch or --seq is given, then the timed steps' batch x seq. The CPU
// reference costs about 2.4 GFLOP per token at 0.6B, ~1.2 TFLOP for 2 x 512: 45 s on 2 EPYC cores,
// some 10 s on 16 (it warns above 4096 tokens and for 8b, where fp32 weights alone are 33 GB).
//   ./build/bench_train --model 0.6b --fp8 block,row,tensor,off --logprob-error
#include <cuda_runtime_api.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora.h"
#include "model.h"
#include "op_profile.h"
#include "cuda/attention_cuda.h"
#include "cuda/fp8_cuda.h"
#include "shapes.h"
#include "io/options.h"  // backend_select


static size_t gpu_used(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) die("cudaMemGetInfo failed");
    return tot - fr;
}
enum { SEED = 1234 };  // model_init_random's seed: every run and the --logprob-error reference
static size_t used_base;  // memory in use after the backend's initialisation (CUDA context, cuBLAS)
static double gib(size_t b) { return b / 1073741824.0; }
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// ---- one configuration ----------------------------------------------------------------------
typedef struct {
    FP8Gran gran;
    double step_ms, tok_s, min_ms, max_ms;
    double peak, weights, lora, acts, scratch;  // GiB
    double att_f_tflops, att_b_tflops, lin_f_tflops, lin_b_tflops;
    double lp_mean, lp_max, lp_rel;  // --logprob-error: |logp - logp_ref| mean, max; relative L2
} Result;

// B x T random token ids below 150000 and their next-token targets (-1 at each sequence's end)
static void make_tokens(Rng *r, int *ids, int *tg, int B, int T) {
    int N = B * T;
    for (int i = 0; i < N; i++) ids[i] = rng_int(r, 150000);
    for (int i = 0; i < N; i++) tg[i] = (i % T == T - 1) ? -1 : ids[i + 1];
}

// ---- --logprob-error ------------------------------------------------------------------------
static struct {
    int on, B, T;
    int *ids, *tg;
    double *ref;  // (B*T) reference logprobs (0 where tg < 0)
} lpe;

// the reference logprobs: the random model of run() (same config, same SEED), FP8 off, on the CPU
// fp32 backend (see the header comment)
static double *lp_reference(const char *size, const int *ids, const int *tg, int B, int T) {
    const Backend *cpu = backend_select("cpu", 0);
    Config cfg = bench_shape(size);
    ModelOptions opt;
    memset(&opt, 0, sizeof opt);
    opt.gran = FP8_OFF;
    double t0 = now_sec();
    Model m;
    model_init_random(&m, &cfg, cpu, &opt, SEED);
    double t1 = now_sec();
    double *ref = (double *)mallocCheck((size_t)B * T * sizeof(double));
    model_forward(&m, NULL, ids, B, T);
    model_logprobs(&m, tg, 1.0f, ref);
    double t2 = now_sec();
    model_free(&m);
    fprintf(stderr, "  logprob reference (CPU fp32, %d threads): weights %.1f s, forward + logprobs of %d x %d %.1f s\n",
            omp_get_max_threads(), t1 - t0, B, T, t2 - t1);
    return ref;
}

// error of logp against lpe.ref over the scored tokens
static void lp_compare(Result *res, const double *logp) {
    int N = lpe.B * lpe.T;
    double sa = 0, mx = 0, se = 0, sr = 0;
    int n = 0;
    for (int i = 0; i < N; i++) {
        if (lpe.tg[i] < 0) continue;
        double e = fabs(logp[i] - lpe.ref[i]);
        if (!(e <= mx)) mx = e;  // a NaN sticks
        sa += e;
        se += e * e;
        sr += lpe.ref[i] * lpe.ref[i];
        n++;
    }
    res->lp_mean = sa / n;
    res->lp_max = mx;
    res->lp_rel = sqrt(se / sr);
}

static void one_step(Model *m, LoRA *lo, const int *ids, const int *tg, const double *dl, double *logp, int B, int T) {
    model_forward(m, lo, ids, B, T);
    model_logprobs(m, tg, 1.0f, logp);
    model_backward(m, lo, dl);
    lora_adamw_step(lo, 1e-5f, 0.9f, 0.999f, 1e-8f, 0.0f);
    lora_zero_grads(lo);
}

static int recompute;  // --recompute: gradient checkpointing (model.h's m->recompute)

static Result run(const char *size, FP8Gran gran, int B, int T, int steps, int warmup, int rank, int profile) {
    const Backend *be = backend_select("cuda", 0);
    Config cfg = bench_shape(size);
    Result res;
    memset(&res, 0, sizeof res);
    res.gran = gran;
    ModelOptions opt;
    memset(&opt, 0, sizeof opt);
    opt.gran = gran;
    Model m;
    double t0 = now_sec();
    model_init_random(&m, &cfg, be, &opt, SEED);
    fprintf(stderr, "  %s %s: random weights in %.1f s\n", size, fp8_gran_name(gran), now_sec() - t0);
    LoRA *lo = lora_create(&m, rank, (float)rank, (1u << LIN_COUNT) - 1, 99, 0);
    m.recompute = recompute;
    m.lora = lo;
    int N = B * T;
    int *ids = (int *)mallocCheck(N * sizeof(int)), *tg = (int *)mallocCheck(N * sizeof(int));
    double *dl = (double *)mallocCheck(N * sizeof(double)), *logp = (double *)mallocCheck(N * sizeof(double));
    Rng r = rng_make(5);
    make_tokens(&r, ids, tg, B, T);
    for (int i = 0; i < N; i++)
        dl[i] = tg[i] < 0 ? 0 : (rng_uniform(&r) < 0.5f ? -1.0 : 1.0) / N;  // advantage-like weights
    double *ms = (double *)mallocCheck((steps + warmup) * sizeof(double));
    for (int s = 0; s < warmup + steps; s++) {
        be->sync();
        double a = now_sec();
        one_step(&m, lo, ids, tg, dl, logp, B, T);
        be->sync();
        ms[s] = (now_sec() - a) * 1e3;
        fprintf(stderr, "  step %d: %.2f ms%s\n", s, ms[s], s < warmup ? " (warm-up)" : "");
    }
    double mean_logp = 0;
    for (int i = 0; i < N; i++) mean_logp += logp[i] / N;
    qsort(ms + warmup, steps, sizeof(double), cmp_d);
    res.step_ms = ms[warmup + steps / 2];
    res.min_ms = ms[warmup];
    res.max_ms = ms[warmup + steps - 1];
    res.tok_s = N / (res.step_ms * 1e-3);
    be->sync();
    size_t used = gpu_used() - used_base;
    size_t wbytes = m.w.dense_bytes + m.w.fp8_bytes;
    size_t lbytes = lo->n * dtype_size(be->hp) * 4;
    size_t ax = (size_t)lo->ax_cap * lo->r * dtype_size(be->act);
    int nad = 0;
    for (int i = 0; i < LIN_COUNT; i++) nad += (lo->targets >> i) & 1;
    ax *= (size_t)nad * cfg.L;
    res.peak = gib(used);
    res.weights = gib(wbytes);
    res.lora = gib(lbytes);
    res.acts = gib(m.acts.bytes + ax);
    res.scratch = gib(used > wbytes + lbytes + m.acts.bytes + ax ? used - wbytes - lbytes - m.acts.bytes - ax : 0);
    fprintf(stderr, "  mean logp %.4f (finite: %s)\n", mean_logp, mean_logp == mean_logp ? "yes" : "NO");
    if (profile) {
        Backend W;
        prof_install(be, &W);
        m.be = &W;
        lo->be = &W;
        be->sync();
        double t0p = now_sec();
        one_step(&m, lo, ids, tg, dl, logp, B, T);
        be->sync();
        double wall = (now_sec() - t0p) * 1e3;
        m.be = be;
        lo->be = be;
        char title[128];
        snprintf(title, sizeof title, "one training step, %s, fp8 %s", size, fp8_gran_name(gran));
        prof_report(stdout, title, wall, 0);
        double ptime[P_COUNT];
        for (int k = 0; k < P_COUNT; k++) ptime[k] = prof_ms[k] * 1e-3;
        // useful FLOPs (causal: half the T x T pairs; backward counted as 2.5x forward as FlashAttention does)
        double pairs = (double)B * cfg.NH * T * (T + 1) / 2;
        double af = 4.0 * pairs * cfg.HD * cfg.L;
        int passes = recompute ? 2 : 1;  // with recomputation the backward runs each layer's forward again
        res.att_f_tflops = passes * af / ptime[P_ATT_F] / 1e12;
        res.att_b_tflops = 2.5 * af / ptime[P_ATT_B] / 1e12;
        double lin_params = 0;
        for (int i = 0; i < LIN_COUNT; i++) lin_params += (double)m.w.layers[0].lin[i].rows * m.w.layers[0].lin[i].cols;
        double lf = 2.0 * N * lin_params * cfg.L;
        res.lin_f_tflops = passes * lf / ptime[P_LIN_F] / 1e12;
        res.lin_b_tflops = lf / ptime[P_LIN_B] / 1e12;
        printf("  attention forward %.0f TFLOP/s, backward %.0f TFLOP/s (useful FLOPs, causal)\n", res.att_f_tflops, res.att_b_tflops);
        printf("  linear forward %.0f TFLOP/s, linear backward dX %.0f TFLOP/s\n", res.lin_f_tflops, res.lin_b_tflops);
        double hf = 2.0 * N * (double)cfg.V * cfg.C;
        printf("  lm head forward %.0f TFLOP/s, backward %.0f TFLOP/s (recompute + dh)\n", hf / ptime[P_HEAD_F] / 1e12,
               2 * hf / ptime[P_HEAD_B] / 1e12);
    }
    if (lpe.on) {  // after the timed steps and the memory reading; the base model, its adapter skipped
        double *lp = (double *)mallocCheck((size_t)lpe.B * lpe.T * sizeof(double));
        model_forward(&m, NULL, lpe.ids, lpe.B, lpe.T);
        model_logprobs(&m, lpe.tg, 1.0f, lp);
        lp_compare(&res, lp);
        fprintf(stderr, "  logprob error vs fp32: mean %.3e, max %.3e, rel L2 %.3e\n", res.lp_mean, res.lp_max, res.lp_rel);
        free(lp);
    }
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
    free(ids); free(tg); free(dl); free(logp); free(ms);
    return res;
}

int main(int argc, char **argv) {
    const char *size = "0.6b", *grans = "block,row,tensor,off", *dxs = "auto";
    int B = 8, T = 1024, steps = 7, warmup = 2, rank = 32, profile = 0, shape_given = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) size = argv[++i];
        else if (!strcmp(argv[i], "--fp8") && i + 1 < argc) grans = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]), shape_given = 1;
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]), shape_given = 1;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--attention") && i + 1 < argc) {  // the training attention's forward kernel
            const char *k = argv[++i];
            if (strcmp(k, "auto") && strcmp(k, "mma")) die("--attention: auto (the Hopper kernel where it runs) or mma");
            attention_set_hopper(!strcmp(k, "auto"));
        }
        else if (!strcmp(argv[i], "--recompute")) recompute = 1;
        else if (!strcmp(argv[i], "--dx") && i + 1 < argc) dxs = argv[++i];
        else if (!strcmp(argv[i], "--logprob-error")) lpe.on = 1;
        else die("usage: bench_train [--model " SHAPE_NAMES "] [--fp8 block,row,tensor,off] [--batch B] [--seq T] [--steps n] "
                 "[--warmup n] [--rank r] [--profile] [--recompute] [--dx auto,fp8,bf16] [--logprob-error] [--attention auto|mma]");
    }
    if (B < 1 || T < 2 || steps < 1 || warmup < 0) die("bad --batch/--seq/--steps/--warmup");
    const Backend *be = backend_select("cuda", 0);
    be->sync();
    used_base = gpu_used();
    double ref_abs = 0, ref_sd = 0;  // mean |logp_ref| and its standard deviation, over the scored tokens
    int scored = 0;
    if (lpe.on) {
        lpe.B = shape_given ? B : 2;
        lpe.T = shape_given ? T : 512;
        int N = lpe.B * lpe.T;
        if (N > 4096 || strcmp(size, "0.6b"))
            fprintf(stderr, "warning: --logprob-error runs the %s model over %d x %d tokens in fp32 on the CPU "
                            "(~%.1f TFLOP): this may take many minutes\n",
                    size, lpe.B, lpe.T, N * (strcmp(size, "0.6b") ? 16.0 : 2.4) * 1e-3);
        lpe.ids = (int *)mallocCheck(N * sizeof(int));
        lpe.tg = (int *)mallocCheck(N * sizeof(int));
        Rng r = rng_make(5);
        make_tokens(&r, lpe.ids, lpe.tg, lpe.B, lpe.T);
        lpe.ref = lp_reference(size, lpe.ids, lpe.tg, lpe.B, lpe.T);
        double s1 = 0, s2 = 0;
        for (int i = 0; i < N; i++)
            if (lpe.tg[i] >= 0) s1 += lpe.ref[i], s2 += lpe.ref[i] * lpe.ref[i], ref_abs += fabs(lpe.ref[i]), scored++;
        ref_abs /= scored;
        ref_sd = sqrt(fmax(s2 / scored - (s1 / scored) * (s1 / scored), 0));
    }
    Result res[8];
    FP8DxPath dx[8];
    int nr = 0;
    static const char *const dx_names[] = {"auto", "fp8", "bf16"};
    char *list = str_dup(grans), *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok && nr < 8; tok = strtok_r(NULL, ",", &save)) {
        int g = fp8_gran_parse(tok);
        if (g < 0) die("--fp8: unknown granularity '%s' (block, row, tensor, off)", tok);
        char *dl = str_dup(dxs), *save2 = NULL;
        for (char *d = strtok_r(dl, ",", &save2); d && nr < 8; d = strtok_r(NULL, ",", &save2)) {
            int p = 0;
            while (p < 3 && strcmp(d, dx_names[p])) p++;
            if (p == 3) die("--dx: unknown path '%s' (auto, fp8, bf16)", d);
            dx[nr] = (FP8DxPath)p;
            fp8_cuda_set_dx(dx[nr]);
            res[nr++] = run(size, (FP8Gran)g, B, T, steps, warmup, rank, profile);
        }
        free(dl);
    }
    fp8_cuda_set_dx(FP8_DX_AUTO);
    free(list);
    printf("\nLoRA training step, CUDA backend, %s, Qwen3-%s shape, batch %d x %d, LoRA r=%d on all 7 projections, "
           "recompute %s, median of %d steps after %d warm-up\n",
           be->device_desc, size, B, T, rank, recompute ? "on" : "off", steps, warmup);
    printf("| fp8 | dX | step ms (min-max) | tokens/s | peak GiB | weights | LoRA+AdamW | activations | backend scratch |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < nr; i++)
        printf("| %s | %s | %.1f (%.1f-%.1f) | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", fp8_gran_name(res[i].gran),
               res[i].gran == FP8_OFF || res[i].gran == FP8_ROW ? "bf16" : dx_names[dx[i]], res[i].step_ms,
               res[i].min_ms, res[i].max_ms, res[i].tok_s, res[i].peak, res[i].weights, res[i].lora, res[i].acts,
               res[i].scratch);
    if (lpe.on) {
        printf("\nLogprob error vs an fp32 reference, Qwen3-%s shape, random weights (seed %d), batch %d x %d "
               "(%d scored tokens), mean |logp_ref| %.2f (std %.2f)\n",
               size, SEED, lpe.B, lpe.T, scored, ref_abs, ref_sd);
        printf("Reference: the CPU backend in fp32 with the fp32 weights every row was built from (FP8 rows quantize "
               "them, off rounds them to bf16); each row: the CUDA backend's base model (no LoRA)\n");
        printf("| fp8 | mean abs err | max abs err | rel L2 |\n");
        printf("| --- | --- | --- | --- |\n");
        for (int i = 0; i < nr; i++)
            printf("| %s | %.2e | %.2e | %.2e |\n", fp8_gran_name(res[i].gran), res[i].lp_mean, res[i].lp_max,
                   res[i].lp_rel);
        free(lpe.ids);
        free(lpe.tg);
        free(lpe.ref);
    }
    return 0;
}
