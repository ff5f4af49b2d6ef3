// dev/bench_full.c: the full fine-tuning step on the CUDA backend, BF16 against the FP8 training
// recipes (fp8_train.cu), on Llama-3.2-shaped random models. One step = model_forward +
// model_logprobs + model_backward (next-token loss over every token) + full_step (clip, AdamW on
// the fp32 masters, the bf16 weights rounded from them, FP8: re-quantized at the next forward) +
// zeroing the gradients; timed CUDA-synchronized, the median of several steps after warm-up.
// Peak memory: the most the run held on the GPU (the backend's mem_in_use peak); each recipe runs
// in a child process of its own, so that each starts from an empty GPU and its peak is its own.
//
//   make bench-full && ./build/bench_full --model 1b --recipe off,delayed,current,block --batch 8 --seq 2048
//   ./build/bench_full --model 1b --recipe off,delayed,delayed:bf16:mlp   (:bf16: AdamW's moments in bf16;
//                                                                          :mlp: gate and up recomputed;
//                                                                          :head: the LM head in FP8 too)
//   ./build/bench_full --model 3b --recipe off,block --batch 4 --seq 2048 --recompute
// With --profile, one more step per recipe with every backend op timed (dev/op_profile.h); with
// --parts, one linear layer's products and kernels timed alone at the 1B projections' shapes.
// Prints one table last: tokens/s, the ratio to BF16 (the first "off" row), peak GiB, the loss.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model.h"
#include "op_profile.h"
#include "cuda/attention_cuda.h"
#include "shapes.h"  // llama32_shape
#include "cuda/fp8_cuda.h"
#include "train/full_finetune.h"
#include "io/options.h"  // backend_select

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    char recipe[24];
    double step_ms, tok_s, peak_gib, loss;
    long overflows;
} Result;

static int profile;

// one step: forward, logprobs, backward, optimizer
static void one_step(Model *m, FullTrainer *ft, const int *ids, const int *tg, const double *dl, double *logp, int B, int T) {
    model_forward(m, NULL, ids, B, T);
    model_logprobs_grad(m, tg, 1.0f, dl, logp);  // the next-token loss: dL/dlogp known ahead
    model_backward(m, NULL, NULL);
    full_step(ft, m, 1e-5f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0);
    model_zero_grads(m);
}

// recipe: off, delayed, current or block, then ":bf16" for AdamW's moments in bf16 (--adam_moments bf16),
// then ":mlp" for gate and up recomputed in the backward (--recompute_mlp), then ":head" for the LM head
// trained in FP8 too (--fp8_lm_head)
static Result run(const char *size, const char *recipe_m, int B, int T, int steps, int warmup, int recompute) {
    const Backend *be = backend_select("cuda", 0);
    Config cfg = llama32_shape(size);
    Result res;
    memset(&res, 0, sizeof res);
    snprintf(res.recipe, sizeof res.recipe, "%s", recipe_m);
    char recipe[24];
    snprintf(recipe, sizeof recipe, "%s", recipe_m);
    int m16 = 0, mlp = 0, head = 0;
    for (char *o = strchr(recipe, ':'); o; o = strchr(o + 1, ':')) {
        m16 |= !strncmp(o, ":bf16", 5) && (o[5] == ':' || !o[5]);
        mlp |= !strncmp(o, ":mlp", 4) && (o[4] == ':' || !o[4]);
        head |= !strncmp(o, ":head", 5) && (o[5] == ':' || !o[5]);
    }
    if (strchr(recipe, ':')) *strchr(recipe, ':') = 0;
    char canon[40];
    snprintf(canon, sizeof canon, "%s%s%s%s", recipe, m16 ? ":bf16" : "", mlp ? ":mlp" : "", head ? ":head" : "");
    if (strcmp(canon, recipe_m))
        die("--recipe: '%s': RECIPE, then :bf16 (AdamW's moments in bf16), then :mlp (gate and up recomputed), then :head (the "
            "LM head in FP8)", recipe_m);
    ModelOptions opt;
    memset(&opt, 0, sizeof opt);
    opt.gran = FP8_OFF;
    Model m;
    model_init_random(&m, &cfg, be, &opt, 1234);
    m.recompute = recompute;
    m.recompute_mlp = mlp;
    if (strcmp(recipe, "off")) {
        FP8Recipe r = fp8_recipe_default();
        int k = fp8_recipe_parse(recipe);
        if (k < 0) die("--recipe: unknown '%s' (off, delayed, current, block)", recipe);
        r.kind = (FP8RecipeKind)k;
        r.lm_head = head;
        model_fp8_train(&m, &r);
    } else if (head) die("--recipe: 'off:head': the LM head in FP8 is part of an FP8 recipe (delayed:head)");
    FullTrainer ft;
    full_init_sharded(&ft, &m, NULL, m16);
    int N = B * T;
    int *ids = (int *)mallocCheck(N * sizeof(int)), *tg = (int *)mallocCheck(N * sizeof(int));
    double *dl = (double *)mallocCheck(N * sizeof(double)), *logp = (double *)mallocCheck(N * sizeof(double));
    Rng rng = rng_make(5);
    for (int i = 0; i < N; i++) ids[i] = rng_int(&rng, 128000);
    for (int i = 0; i < N; i++) tg[i] = (i % T == T - 1) ? -1 : ids[i + 1];
    for (int i = 0; i < N; i++) dl[i] = tg[i] < 0 ? 0 : -1.0 / N;  // the mean next-token NLL's gradient
    double *ms = (double *)mallocCheck((steps + warmup) * sizeof(double));
    for (int s = 0; s < warmup + steps; s++) {
        be->sync();
        double a = now_sec();
        one_step(&m, &ft, ids, tg, dl, logp, B, T);
        be->sync();
        ms[s] = (now_sec() - a) * 1e3;
        double loss = 0;
        for (int i = 0; i < N; i++) loss -= tg[i] < 0 ? 0 : logp[i];
        res.loss = loss / (N - B);
        fprintf(stderr, "  %s %s step %d: %.1f ms, loss %.4f%s\n", size, recipe, s, ms[s], res.loss, s < warmup ? " (warm-up)" : "");
    }
    qsort(ms + warmup, steps, sizeof(double), cmp_d);
    res.step_ms = ms[warmup + steps / 2];
    res.tok_s = N / (res.step_ms * 1e-3);
    size_t peak = 0;
    be->mem_in_use(&peak);
    res.peak_gib = peak / 1073741824.0;
    res.overflows = m.fp8_overflows;
    if (profile) {
        Backend W;
        prof_install(be, &W);
        m.be = &W;
        ft.be = &W;
        double a = now_sec();
        one_step(&m, &ft, ids, tg, dl, logp, B, T);
        be->sync();
        char title[128];
        snprintf(title, sizeof title, "one full fine-tuning step, Llama-3.2-%s shape, recipe %s", size, recipe);
        prof_report(stdout, title, (now_sec() - a) * 1e3, 0);
        m.be = be;
        ft.be = be;
    }
    full_free(&ft);
    model_free(&m);
    free(ids), free(tg), free(dl), free(logp), free(ms);
    return res;
}

// ---- --parts: one linear layer's pieces, timed alone ---------------------------------------
// For the projections of the 1B shape at N tokens: the BF16 products, the FP8 training products
// under block and delayed (through the backend's linear ops), and the kernels they are made of.
static double time_it(const Backend *be, void (*f)(void *), void *arg) {
    f(arg);
    be->sync();
    int reps = 20;
    double a = now_sec();
    for (int i = 0; i < reps; i++) f(arg);
    be->sync();
    return (now_sec() - a) / reps * 1e3;
}
typedef struct {
    const Backend *be;
    QWeight *w;
    void *x, *dy, *y, *dx, *dw, *bf;
    FP8Tensor q, qt;
    int N, what;
} Part;
static void run_part(void *arg) {
    Part *p = (Part *)arg;
    switch (p->what) {
        case 0: p->be->linear_forward(p->y, p->x, p->w, NULL, p->N); break;
        case 1: p->be->linear_backward(p->dx, 0, NULL, NULL, p->dy, p->x, p->w, p->N); break;
        case 2: p->be->linear_backward(NULL, 0, p->dw, NULL, p->dy, p->x, p->w, p->N); break;
        case 3: fp8_quantize_cuda(&p->q, p->x, DT_BF16, 0); break;
        case 4: fp8_quantize_t_cuda(&p->qt, p->x, NULL, NULL); break;
    }
}
static void parts(int N) {
    const Backend *be = backend_select("cuda", 0);
    int shapes[3][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};  // (OC, C): q/o, gate/up, down
    printf("\none linear layer, %d tokens, ms (20 calls each)\n\n", N);
    printf("| OC x C | BF16 fwd | dX | dW | block fwd | dX | dW | delayed fwd | dX | dW | quant 1x128 X | quant_t X |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int k = 0; k < 3; k++) {
        int OC = shapes[k][0], C = shapes[k][1];
        Part p;
        memset(&p, 0, sizeof p);
        p.be = be, p.N = N;
        p.x = be->alloc((size_t)N * C * 2), p.dy = be->alloc((size_t)N * OC * 2), p.y = be->alloc((size_t)N * OC * 2);
        p.dx = be->alloc((size_t)N * C * 2), p.dw = be->alloc((size_t)OC * C * 4);
        float *h = (float *)mallocCheck((size_t)N * (C > OC ? C : OC) * sizeof(float));
        Rng r = rng_make(3);
        for (size_t i = 0; i < (size_t)N * C; i++) h[i] = rng_normal(&r);
        be->upload_convert(p.x, DT_BF16, h, DT_F32, (size_t)N * C);
        for (size_t i = 0; i < (size_t)N * OC; i++) h[i] = 1e-3f * rng_normal(&r);
        be->upload_convert(p.dy, DT_BF16, h, DT_F32, (size_t)N * OC);
        QWeight w;
        memset(&w, 0, sizeof w);
        w.rows = OC, w.cols = C, w.gran = FP8_OFF, w.dense = be->alloc((size_t)OC * C * 2);
        for (size_t i = 0; i < (size_t)OC * C; i++) h[i] = 0.02f * rng_normal(&r);
        be->upload_convert(w.dense, DT_BF16, h, DT_F32, (size_t)OC * C);
        p.w = &w;
        double t[11];
        for (int i = 0; i < 3; i++) p.what = i, t[i] = time_it(be, run_part, &p);
        for (int rk = 0; rk < 2; rk++) {
            FP8Recipe rc = fp8_recipe_default();
            rc.kind = rk ? FP8_RECIPE_DELAYED : FP8_RECIPE_BLOCK;
            char why[256];
            w.train = be->fp8_train_new(&w, &rc, NULL, why, sizeof why);
            if (!w.train) die("%s", why);
            for (int i = 0; i < 3; i++) p.what = i, t[3 + 3 * rk + i] = time_it(be, run_part, &p);
            be->fp8_train_free(w.train);
            w.train = NULL;
        }
        FP8Tensor q = {0}, qt = {0};
        q.rows = N, q.cols = C, q.gran = FP8_BLOCK, q.fmt = FP8_E4M3, q.block_rows = 1;
        q.data = (uint8_t *)be->alloc((size_t)N * C), q.scale = (float *)be->alloc(fp8_num_scales(FP8_BLOCK, N, C, 1) * 4);
        qt = q, qt.rows = C, qt.cols = N;
        qt.data = (uint8_t *)be->alloc((size_t)N * C), qt.scale = (float *)be->alloc(fp8_num_scales(FP8_BLOCK, C, N, 1) * 4);
        p.q = q, p.qt = qt;
        p.what = 3, t[9] = time_it(be, run_part, &p);
        p.what = 4, t[10] = time_it(be, run_part, &p);
        printf("| %d x %d |", OC, C);
        for (int i = 0; i < 11; i++) printf(" %.3f |", t[i]);
        printf("\n");
        void *fr[] = {p.x, p.dy, p.y, p.dx, p.dw, w.dense, q.data, q.scale, qt.data, qt.scale};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) be->free(fr[i]);
        free(h);
    }
}

int main(int argc, char **argv) {
    const char *size = "1b", *recipes = "off,delayed,current,block";
    int B = 4, T = 2048, steps = 5, warmup = 2, recompute = 0, parts_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) size = argv[++i];
        else if (!strcmp(argv[i], "--recipe") && i + 1 < argc) recipes = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--recompute")) recompute = 1;
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--attention") && i + 1 < argc) {  // the training attention's forward kernel
            const char *k = argv[++i];
            if (strcmp(k, "auto") && strcmp(k, "mma")) die("--attention: auto (the Hopper kernel where it runs) or mma");
            attention_set_hopper(!strcmp(k, "auto"));
        }
        else if (!strcmp(argv[i], "--parts")) parts_only = 1;
        else die("usage: bench_full [--model 1b|3b] [--recipe off,delayed,current,block[:bf16][:mlp],...] [--batch B] [--seq T] [--steps n] "
                 "[--warmup n] [--recompute] [--profile] [--parts] [--attention auto|mma]");
    }
    if (B < 1 || T < 2 || steps < 1 || warmup < 0) die("bad --batch/--seq/--steps/--warmup");
    if (parts_only) {
        parts(B * T);
        return 0;
    }
    Result res[8];
    int n = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", recipes);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && n < 8; tok = strtok_r(NULL, ",", &save))
    {  // in a child: the parent never touches the GPU
        int fd[2];
        if (pipe(fd) != 0) die("pipe failed");
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            close(fd[0]);
            Result r = run(size, tok, B, T, steps, warmup, recompute);
            fflush(stdout);
            if (write(fd[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
            exit(0);  // not _exit: the child's atexit handlers run (dev/kernel_trace.c writes its trace there)
        }
        close(fd[1]);
        int st = 0;
        ssize_t got = read(fd[0], &res[n], sizeof res[n]);
        close(fd[0]);
        waitpid(pid, &st, 0);
        if (got != (ssize_t)sizeof res[n] || !WIFEXITED(st) || WEXITSTATUS(st)) die("the %s run failed (above)", tok);
        n++;
    }
    printf("\nfull fine-tuning step, Llama-3.2-%s shape, %d x %d tokens%s, AdamW on fp32 masters (:bf16: its moments in bf16; :mlp: gate and up recomputed)\n\n", size, B, T,
           recompute ? ", recompute" : "");
    printf("| recipe | step ms | tokens/s | vs BF16 | peak GiB | loss after %d steps | amax overflows |\n", steps + warmup);
    printf("| --- | --- | --- | --- | --- | --- | --- |\n");
    double base = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(res[i].recipe, "off")) { base = res[i].tok_s; break; }
    for (int i = 0; i < n; i++)
        printf("| %s | %.1f | %.0f | %s%.3f | %.2f | %.4f | %ld |\n", strcmp(res[i].recipe, "off") ? res[i].recipe : "off (BF16)",
               res[i].step_ms, res[i].tok_s, base > 0 ? "" : "n/a ", base > 0 ? res[i].tok_s / base : 0.0, res[i].peak_gib,
               res[i].loss, res[i].overflows);
    return 0;
}
