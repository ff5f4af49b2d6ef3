// test/gpu_models.cu: GPU suite for whole models from the Hugging Face fixtures (test/fixtures/{qwen3,
// qwen2,llama3,mistral,gemma3,qwen3_moe,qwen3_moe16,qwen3_moe_fp8}) on both backends: logits, KV-cache decode, LoRA
// gradients, and one GRPO step, PPO's value model and one full-weight training step CPU vs GPU; the reward
// models of test/fixtures/reward_model scoring their cases.
// Tolerances: gpu_util.cuh. Run on a GPU: make test-gpu (CK_FORK=no).
#include "gpu_util.cuh"
#include "train/full_finetune.h"
#include "train/optim.h"
#include "train/ppo_train.h"
#include "train/reward_model.h"
#include <cjson/cJSON.h>

// ---- whole models: the fixtures on both backends -----------------------------------------------

// Mistral (a sliding window on every layer) and Gemma 3 (sliding and full layers, GeGLU, (1 + w) norms):
// their decode below runs to position 17, past both fixtures' windows (8, 6)
// Qwen3 MoE: 8 experts top 2 with norm_topk_prob and a dense layer among the sparse ones, 16 top 4 without,
// and the published FP8 layout (each expert its own 128x128 block scales); their LoRA is on the attention
// ("all" becomes q, k, v, o), so its gradients come through the experts' input gradient
static const char *ARCHS[] = {"qwen3", "qwen2", "llama3", "mistral", "gemma3", "qwen3_moe", "qwen3_moe16", "qwen3_moe_fp8"};
#define N_ARCHS ((int)(sizeof ARCHS / sizeof ARCHS[0]))

static double rel_l2(const float *a, const float *b, size_t n, double *maxabs) {
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        mx = fmax(mx, fabs(d));
    }
    if (maxabs) *maxabs = mx;
    return sqrt(num / den);
}
static double max_abs_f(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

// Everything one backend computes on one fixture: forward logits, prefill + decode logits (without and with
// the adapter), LoRA logprobs and LoRA gradients
typedef struct {
    float *logits, *dec, *dec_lora, *grads;
    double *lp;
    size_t nlogits, ndec, ngrads;
    int nlp;
    int *tg;
} ModelRun;

// the fixture checkpoint of arch (its directory into dir) on backend be, at granularity gran
static void load_fixture(Model *m, char *dir, size_t cap, const char *arch, const Backend *be, FP8Gran gran) {
    snprintf(dir, cap, "%s/%s", fixture_dir(), arch);
    ModelOptions o;
    memset(&o, 0, sizeof o);
    o.gran = gran;
    model_load(m, dir, be, &o);
}

// prefill two right-padded prompts of the fixture's rows (3 and 7 tokens), then 10 decode steps each: the
// logits of all 11 steps (*n floats)
static float *prefill_decode(Model *m, LoRA *lo, const Backend *be, const int *ids, int T, size_t *n) {
    int V = m->cfg.V, BS = 8, MB = 3, lens[2] = {3, 7}, table[6] = {0, 2, 4, 1, 3, 5}, pids[14], slots[14], steps = 10;
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 7; t++) {
            pids[s * 7 + t] = t < lens[s] ? ids[s * T + t] : 0;
            slots[s * 7 + t] = t < lens[s] ? table[s * MB + t / BS] * BS + t % BS : -1;
        }
    KVCache kv;
    kvcache_alloc(&kv, m, 6, BS);
    *n = (size_t)(steps + 1) * 2 * V;
    float *dec = fmalloc(*n);
    void *z = be->alloc(2 * V * 4);
    model_prefill(m, lo, &kv, pids, lens, slots, 2, 7, z);
    be->download(dec, z, 2 * V * 4);
    int pos[2] = {3, 7};
    for (int step = 0; step < steps; step++) {
        int tok[2], sl[2];
        for (int s = 0; s < 2; s++) {
            tok[s] = ids[s * T + pos[s]];
            sl[s] = table[s * MB + pos[s] / BS] * BS + pos[s] % BS;
        }
        model_decode(m, lo, &kv, tok, pos, sl, table, 2, MB, z);
        be->download(dec + (size_t)(step + 1) * 2 * V, z, 2 * V * 4);
        pos[0]++;
        pos[1]++;
    }
    kvcache_free(&kv, be);
    be->free(z);
    return dec;
}

static void model_run(ModelRun *r, const char *arch, const Backend *be, FP8Gran gran) {
    char dir[1024], p[1100];
    Model m;
    load_fixture(&m, dir, sizeof dir, arch, be, gran);
    path_join(p, sizeof p, dir, "tokens.npy");
    Npy tk = npy_read(p);
    int B = (int)tk.shape[0], T = (int)tk.shape[1], V = m.cfg.V;
    int *ids = (int *)mallocCheck(B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) ids[i] = (int)tk.data[i];
    npy_free(&tk);
    memset(r, 0, sizeof *r);
    r->nlogits = (size_t)B * T * V;
    r->logits = fmalloc(r->nlogits);
    model_forward(&m, NULL, ids, B, T);
    model_logits(&m, r->logits);

    r->dec = prefill_decode(&m, NULL, be, ids, T, &r->ndec);

    // LoRA on all projections with random A and B (the same on every backend); logprobs of the
    // next token (some rows -1) at temperature 0.8; backward of sum dlogp * logp
    LoRA *lo = lora_create(&m, 4, 8.0f, (1u << LIN_COUNT) - 1, 7, 0);
    Rng pr = rng_make(31);
    double *par = (double *)mallocCheck(lo->n * sizeof(double));
    for (size_t i = 0; i < lo->n; i++) par[i] = 0.1 * rng_normal(&pr);
    be->upload_convert(lo->params, be->hp, par, DT_F64, lo->n);
    lora_sync_act(lo);  // prefill and decode with the adapter: its products in the decode step's kernels
    r->dec_lora = prefill_decode(&m, lo, be, ids, T, &r->ndec);
    lora_release_act(lo);
    r->nlp = B * T;
    r->tg = (int *)mallocCheck(B * T * sizeof(int));
    r->lp = (double *)mallocCheck(B * T * 8);
    double *dl = (double *)mallocCheck(B * T * 8);
    for (int i = 0; i < B * T; i++) {
        r->tg[i] = (i % T == T - 1 || i % 9 == 4) ? -1 : ids[i + 1];
        dl[i] = r->tg[i] < 0 ? 0 : rng_normal(&pr);
    }
    model_forward(&m, lo, ids, B, T);
    model_logprobs(&m, r->tg, 1.0f / 0.8f, r->lp);
    lora_zero_grads(lo);
    model_backward(&m, lo, dl);
    r->ngrads = lo->n;
    r->grads = fmalloc(lo->n);
    be->download(r->grads, lo->grads, lo->n * 4);
    lora_free(lo);
    free(par);
    free(dl);
    free(ids);
    model_free(&m);
}
static void model_run_free(ModelRun *r) {
    free(r->logits); free(r->dec); free(r->dec_lora); free(r->grads); free(r->lp); free(r->tg);
}

// Tolerances for whole models. BF16 storage rounds every activation (about 15 times per layer,
// plus the embeddings and the final norm): each rounding is a relative error of at most 2^-8,
// about 2^-9.8 RMS, independent between roundings, so after ~35 of them the logits carry
// ~sqrt(35) 2^-9.8 ~ 0.7% RMS relative error, amplified some by the norms and the softmax:
// we allow 2^-5 (3%) relative L2 for the logits, 2^-4 for the LoRA gradients (the chain runs
// forward and back). FP8 (BLOCK on both backends, the same weight codes): an activation that
// differs by a bf16 rounding can land on the other side of an E4M3 rounding boundary and move
// by one E4M3 ulp, with probability ~2^-9 / 2^-4 per element; that noise is of the order of
// the FP8 quantization noise itself (about 0.6x its RMS), so the GPU's FP8 run may differ from
// the CPU's FP8 run by the BF16 allowance plus q = rel L2 between the CPU's FP8 and fp32 runs,
// the measured effect of FP8 quantization on this model.
static double model_cmp(const char *arch, const char *gran, const char *what, const float *g, const float *c, size_t n,
                        double tol) {
    double mx, e = rel_l2(g, c, n, &mx);
    printf("  model %-6s %-5s %-26s rel L2 %.4f (tol %.4f), max |diff| %.3g of max |ref| %.3g\n", arch, gran, what, e,
           tol, mx, max_abs_f(c, n));
    ck_assert_msg(e <= tol, "%s %s %s: rel L2 %g > %g", arch, gran, what, e, tol);
    return e;
}

// ---- Qwen3 MoE: the CPU's run follows the GPU's routing -------------------------------------------
// Where two experts' router logits nearly tie (these tiny random fixtures have gaps down to 6e-4 of the
// row's largest logit, and bf16 activations move the logits by more), the GPU and the CPU may choose
// differently, and a token sent to another expert changes its logits by up to 40%: transformers' own bf16
// run of qwen3_moe differs from its fp32 run by 0.13 rel L2 for that reason alone. The router's choices are
// checked bit for bit on equal logits (gpu_moe); here the GPU's backend records each moe_route's choices
// (its decode steps run plainly: no graph, so every call is seen) and the CPU's takes them in the same
// order, with the weights of its own probabilities, after checking that each choice it changes is a near
// tie: the CPU's logit of the GPU's expert within the logits' allowance of its own K-th largest (2^-5 of the
// row's largest |logit|; FP8, where an activation may land one E4M3 step away, 2^-3 more).
#define RT_CAP 4096
static struct {
    int32_t *idx[RT_CAP];
    int n[RT_CAP], count, pos;
    long followed, tokens;
    double slack;  // the near-tie allowance, a fraction of the row's largest |logit|
} RT;
static Backend GW, CW;  // the GPU's backend recording its choices, the CPU's following them

static void rt_reset(void) {
    for (int i = 0; i < RT.count; i++) free(RT.idx[i]);
    memset(&RT, 0, sizeof RT);
}
static void rt_record(int32_t *idx, void *w, const void *logits, int N, int E, int K, int norm) {
    G->moe_route(idx, w, logits, N, E, K, norm);
    ck_assert_msg(RT.count < RT_CAP, "more than %d routing calls", RT_CAP);
    int32_t *h = (int32_t *)mallocCheck((size_t)N * K * 4);
    G->download(h, idx, (size_t)N * K * 4);
    RT.idx[RT.count] = h, RT.n[RT.count++] = N * K;
}
static void rt_plain(const void *key, size_t key_bytes, void (*run)(void *arg), void *arg) { run(arg); }
static void rt_follow(int32_t *idx, void *w, const void *logits, int N, int E, int K, int norm) {
    CPU->moe_route(idx, w, logits, N, E, K, norm);
    ck_assert_msg(RT.pos < RT.count && RT.n[RT.pos] == N * K, "routing call %d: the CPU's run routes %d choices, the GPU's %d",
                  RT.pos, N * K, RT.pos < RT.count ? RT.n[RT.pos] : 0);
    const int32_t *g = RT.idx[RT.pos++];
    const float *z = (const float *)logits;
    float *wt = (float *)w;
    RT.tokens += N;
    for (int n = 0; n < N; n++) {
        const float *zr = z + (size_t)n * E;
        const int32_t *gi = g + (size_t)n * K;
        int32_t *ci = idx + (size_t)n * K;
        if (!memcmp(gi, ci, K * sizeof(int32_t))) continue;
        RT.followed++;
        double mx = zr[0], zmax = 0, s = 0, S = 0, kth = zr[ci[K - 1]];  // the CPU's choices come largest first
        for (int e = 0; e < E; e++) mx = fmax(mx, zr[e]), zmax = fmax(zmax, fabs(zr[e]));
        for (int e = 0; e < E; e++) s += exp(zr[e] - mx);
        for (int j = 0; j < K; j++) {
            ck_assert_msg(zr[gi[j]] >= kth - RT.slack * zmax, "the GPU routed a token to expert %d, logit %g, where the "
                          "CPU's K-th largest is %g: not a near tie", gi[j], zr[gi[j]], kth);
            S += exp(zr[gi[j]] - mx) / s;
        }
        if (!norm) S = 1;
        for (int j = 0; j < K; j++) ci[j] = gi[j], wt[j + (size_t)n * K] = (float)(exp(zr[gi[j]] - mx) / s / S);
    }
}
// a pair of runs, the GPU's on &GW recording its routing, then the CPU's on &CW following it: begun with
// the near-tie allowance slack, ended with the check that both routed as often, and what was followed
static void rt_begin(double slack) {
    GW = *G, GW.moe_route = rt_record, GW.replay = rt_plain;
    CW = *CPU, CW.moe_route = rt_follow;
    rt_reset();
    RT.slack = slack;
}
static void rt_end(const char *what, const char *arch, const char *gran) {
    ck_assert_msg(RT.pos == RT.count, "the CPU's run routed %d times, the GPU's %d", RT.pos, RT.count);
    printf("  %s %-6s %-5s routing: the CPU took the GPU's choices (near ties) on %ld of %ld tokens\n", what, arch, gran,
           RT.followed, RT.tokens);
    rt_reset();
}

// the two runs of a fixture at granularity gran: the GPU's, then the CPU's (following its routing: Qwen3 MoE)
static void model_runs(ModelRun *g, ModelRun *c, const char *arch, FP8Gran gran) {
    if (strncmp(arch, "qwen3_moe", 9)) {
        model_run(g, arch, G, gran);
        model_run(c, arch, CPU, gran);
        return;
    }
    rt_begin(gran == FP8_OFF ? 0x1p-5 : 0x1p-5 + 0x1p-3);
    model_run(g, arch, &GW, gran);
    model_run(c, arch, &CW, gran);
    rt_end("model", arch, fp8_gran_name(gran));
}

START_TEST(test_models) {
    for (int a = 0; a < N_ARCHS; a++) {
        const char *arch = ARCHS[a];
        ModelRun co, go, cb, gb;
        model_runs(&go, &co, arch, FP8_OFF);
        model_runs(&gb, &cb, arch, FP8_BLOCK);
        double tl = 0x1p-5, tgr = 0x1p-4;
        model_cmp(arch, "off", "forward logits", go.logits, co.logits, co.nlogits, tl);
        model_cmp(arch, "off", "prefill + 10 decode steps", go.dec, co.dec, co.ndec, tl);
        model_cmp(arch, "off", "prefill + decode, LoRA", go.dec_lora, co.dec_lora, co.ndec, tl);
        model_cmp(arch, "off", "LoRA gradients", go.grads, co.grads, co.ngrads, tgr);
        double ql = rel_l2(cb.logits, co.logits, co.nlogits, NULL), qd = rel_l2(cb.dec, co.dec, co.ndec, NULL);
        double qg = rel_l2(cb.grads, co.grads, co.ngrads, NULL), qdl = rel_l2(cb.dec_lora, co.dec_lora, co.ndec, NULL);
        printf("  model %-6s FP8 quantization effect on the CPU: logits %.4f, decode %.4f (with LoRA %.4f), LoRA gradients %.4f\n",
               arch, ql, qd, qdl, qg);
        model_cmp(arch, "block", "forward logits", gb.logits, cb.logits, cb.nlogits, tl + ql);
        model_cmp(arch, "block", "prefill + 10 decode steps", gb.dec, cb.dec, cb.ndec, tl + qd);
        model_cmp(arch, "block", "prefill + decode, LoRA", gb.dec_lora, cb.dec_lora, cb.ndec, tl + qdl);
        model_cmp(arch, "block", "LoRA gradients", gb.grads, cb.grads, cb.ngrads, tgr + qg);
        // dX through the frozen FP8 weights as an FP8 product (dY quantized; forced: these widths are
        // below AUTO's) against the BF16 reference (W dequantized): what it changes in the LoRA
        // gradients is at most what the FP8 forward itself changes in them (qg), the quantization
        // the run has already accepted
        ModelRun g8, gr;
        fp8_cuda_set_dx(FP8_DX_FP8);
        model_run(&g8, arch, G, FP8_BLOCK);
        fp8_cuda_set_dx(FP8_DX_BF16);
        model_run(&gr, arch, G, FP8_BLOCK);
        fp8_cuda_set_dx(FP8_DX_AUTO);
        model_cmp(arch, "block", "LoRA gradients, FP8 dX", g8.grads, cb.grads, cb.ngrads, tgr + qg);
        model_cmp(arch, "block", "LoRA grads FP8 dX vs BF16", g8.grads, gr.grads, gr.ngrads, qg);
        if (!strncmp(arch, "qwen3_moe", 9)) {  // gb's decode steps ran plainly (model_runs), gr's through CUDA graphs
            check_exact("qwen3_moe decode: CUDA graphs = plain steps", gr.dec, gb.dec, gb.ndec * 4);
            check_exact("qwen3_moe decode with LoRA: CUDA graphs = plain steps", gr.dec_lora, gb.dec_lora, gb.ndec * 4);
        }
        model_run_free(&g8), model_run_free(&gr);
        // logprobs: rows without a target are exactly 0; the rest within the logits' allowance
        const ModelRun *gs[2] = {&go, &gb}, *cs[2] = {&co, &cb};
        for (int k = 0; k < 2; k++) {
            double lmax = 0, lerr = 0;
            for (int i = 0; i < co.nlp; i++) {
                lmax = fmax(lmax, fabs(cs[k]->lp[i]));
                lerr = fmax(lerr, fabs(gs[k]->lp[i] - cs[k]->lp[i]));
                if (co.tg[i] < 0) ck_assert_msg(gs[k]->lp[i] == 0, "logp of a row without target is %g", gs[k]->lp[i]);
            }
            double tol = (k ? tl + ql : tl) * (1 + lmax);
            printf("  model %-6s %-5s LoRA logprobs: max |diff| %.3g (tol %.3g, max |logp| %.3g)\n", arch, k ? "block" : "off",
                   lerr, tol, lmax);
            ck_assert_msg(lerr <= tol, "%s: logprobs differ by %g", arch, lerr);
        }
        model_run_free(&co); model_run_free(&go); model_run_free(&cb); model_run_free(&gb);
    }
}
END_TEST

// One GRPO step on a fixed batch, CPU vs GPU (the same weights, LoRA, batch and old/reference/
// sampler logprobs): the loss, the gradient norm, and the LoRA parameters after clipping and one
// AdamW step. Four sequences of the qwen3 fixture: 8 prompt tokens + up to 8 completion tokens.
typedef struct {
    double loss, gnorm;
    double lp[4 * 8], dlogp[4 * 8];
    float *grads, *before, *after;
    size_t n;
} GrpoStepRun;  // one backend's run of the step (the product's step: train/grpo_train.h GrpoStep)

enum { GS_B = 4, GS_P = 8, GS_TC = 8, GS_T = GS_P + GS_TC };

static void grpo_step(GrpoStepRun *r, const Backend *be, FP8Gran gran, const double *ref_c, const double *samp_c,
                      int fill_base) {
    char dir[1024], p[1100];
    Model m;
    load_fixture(&m, dir, sizeof dir, "qwen3", be, gran);
    path_join(p, sizeof p, dir, "tokens.npy");
    Npy tk = npy_read(p);
    int ids[GS_B * GS_T], tg[GS_B * GS_T], lens[GS_B] = {8, 5, 8, 3};
    for (int b = 0; b < GS_B; b++)  // rows 0 and 1 of the fixture, and their second halves
        for (int t = 0; t < GS_T; t++) ids[b * GS_T + t] = (int)tk.data[(b % 2) * tk.shape[1] + (b / 2) * 8 + t];
    npy_free(&tk);
    uint8_t mask[GS_B * GS_TC];
    for (int b = 0; b < GS_B; b++)
        for (int t = 0; t < GS_T; t++) {
            int j = t + 1 - GS_P;
            tg[b * GS_T + t] = (j >= 0 && j < lens[b]) ? ids[b * GS_T + t + 1] : -1;  // t + 1 <= GS_T - 1
        }
    for (int b = 0; b < GS_B; b++)
        for (int j = 0; j < GS_TC; j++) mask[b * GS_TC + j] = j < lens[b] && tg[b * GS_T + GS_P - 1 + j] >= 0;
    LoRA *lo = lora_create(&m, 4, 8.0f, (1u << LIN_COUNT) - 1, 7, 0);
    Rng pr = rng_make(77);
    double *par = (double *)mallocCheck(lo->n * sizeof(double));
    for (size_t i = 0; i < lo->n; i++) par[i] = 0.1 * rng_normal(&pr);
    be->upload_convert(lo->params, be->hp, par, DT_F64, lo->n);
    free(par);
    m.lora = lo;
    double lp[GS_B * GS_T], dl[GS_B * GS_T];
    model_forward(&m, lo, ids, GS_B, GS_T);
    model_logprobs(&m, tg, 1.0f, lp);
    for (int b = 0; b < GS_B; b++)
        for (int j = 0; j < GS_TC; j++) r->lp[b * GS_TC + j] = mask[b * GS_TC + j] ? lp[b * GS_T + GS_P - 1 + j] : 0;
    if (fill_base) return;  // the caller only wanted this backend's logprobs
    GrpoConfig cfg = grpo_config_default();
    cfg.num_generations = 2;
    cfg.beta = 0.04;
    cfg.max_completion_length = GS_TC;
    double adv[GS_B] = {0.7, -0.7, -0.3, 0.3};
    GrpoNorm norm = grpo_prepare(&cfg, GS_B, GS_TC, mask, NULL);
    // old_logp NULL: num_iterations 1, TRL's default (ratio = exp(logp - logp.detach()) = 1), so no
    // token sits at a clipping boundary where a bf16-sized difference would flip its gradient to 0
    GrpoInputs in = {r->lp, NULL, ref_c, samp_c, adv, mask, NULL};
    r->loss = grpo_loss(&cfg, &norm, &in, GS_B, r->dlogp, NULL);
    memset(dl, 0, sizeof dl);
    for (int b = 0; b < GS_B; b++)
        for (int j = 0; j < GS_TC; j++) dl[b * GS_T + GS_P - 1 + j] = r->dlogp[b * GS_TC + j];
    lora_zero_grads(lo);
    model_backward(&m, lo, dl);
    r->gnorm = lora_grad_norm(lo);
    r->n = lo->n;
    r->grads = fmalloc(lo->n);
    r->before = fmalloc(lo->n);
    r->after = fmalloc(lo->n);
    be->download(r->grads, lo->grads, lo->n * 4);
    be->download(r->before, lo->params, lo->n * 4);
    double clip = grad_clip_factor(r->gnorm, 0.1);  // small max_norm: the clip acts
    lora_scale_grads(lo, (float)clip);
    lora_adamw_step(lo, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f);
    be->download(r->after, lo->params, lo->n * 4);
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
}

START_TEST(test_grpo_step) {
    // reference and sampler logprobs: the CPU fp32 run's own, perturbed (KL and IS weights away from 0 and 1)
    GrpoStepRun base, co, go, cb, gb;
    memset(&base, 0, sizeof base);
    grpo_step(&base, CPU, FP8_OFF, NULL, NULL, 1);
    double ref_c[GS_B * GS_TC], samp_c[GS_B * GS_TC];
    Rng r = rng_make(5);
    for (int i = 0; i < GS_B * GS_TC; i++) {
        ref_c[i] = base.lp[i] + 0.2 * rng_normal(&r);
        samp_c[i] = base.lp[i] + 0.03 * rng_normal(&r);
    }
    grpo_step(&co, CPU, FP8_OFF, ref_c, samp_c, 0);
    grpo_step(&go, G, FP8_OFF, ref_c, samp_c, 0);
    grpo_step(&cb, CPU, FP8_BLOCK, ref_c, samp_c, 0);
    grpo_step(&gb, G, FP8_BLOCK, ref_c, samp_c, 0);
    // the allowances of test_models: bf16 2^-5 on logprobs (relative to 1 + |logp|), 2^-4 on
    // gradients, plus the FP8 quantization effect measured here on the CPU for block
    double qg = rel_l2(cb.grads, co.grads, co.n, NULL), ql = 0;
    for (int i = 0; i < GS_B * GS_TC; i++) ql = fmax(ql, fabs(cb.lp[i] - co.lp[i]) / (1 + fabs(co.lp[i])));
    const GrpoStepRun *gs[2] = {&go, &gb}, *cs[2] = {&co, &cb};
    for (int k = 0; k < 2; k++) {
        const GrpoStepRun *g = gs[k], *c = cs[k];
        const char *nm = k ? "block" : "off";
        // loss: first order in the logprob errors, |dL| <= sum_t |dL/dlogp_t| * tol_t
        double tl = 0x1p-5 + (k ? ql : 0), bound = 0;
        for (int i = 0; i < GS_B * GS_TC; i++) bound += fabs(c->dlogp[i]) * tl * (1 + fabs(c->lp[i]));
        printf("  grpo step %-5s loss GPU %.6f CPU %.6f (|diff| %.2g, bound %.2g)\n", nm, g->loss, c->loss, fabs(g->loss - c->loss), bound);
        ck_assert_msg(fabs(g->loss - c->loss) <= bound, "%s: loss %g vs %g", nm, g->loss, c->loss);
        // gradient norm: |norm(a) - norm(b)| <= norm(a - b) (triangle inequality)
        double tg = 0x1p-4 + (k ? qg : 0), eg = rel_l2(g->grads, c->grads, c->n, NULL);
        printf("  grpo step %-5s grad norm GPU %.6f CPU %.6f; gradients rel L2 %.4f (tol %.4f)\n", nm, g->gnorm, c->gnorm, eg, tg);
        ck_assert_msg(eg <= tg, "%s: gradients differ by %g", nm, eg);
        ck_assert_msg(fabs(g->gnorm - c->gnorm) <= tg * c->gnorm, "%s: grad norm %g vs %g", nm, g->gnorm, c->gnorm);
        // the update: Adam's first step moves each parameter by ~lr sign(g), so it is the same where
        // the gradient's sign is beyond doubt; count disagreements where |g| > 3 x the RMS gradient error
        double rms_err = 0, rms = 0;
        for (size_t i = 0; i < c->n; i++) rms += (double)c->grads[i] * c->grads[i];
        rms = sqrt(rms / c->n);
        rms_err = eg * rms;
        size_t clear = 0, flips = 0;
        for (size_t i = 0; i < c->n; i++) {
            ck_assert(g->before[i] == c->before[i] || fabs(g->before[i] - c->before[i]) < 1e-7);
            if (fabs(c->grads[i]) <= 3 * rms_err) continue;
            clear++;
            double ug = g->after[i] - g->before[i], uc = c->after[i] - c->before[i];
            if ((ug > 0) != (uc > 0) || fabs(ug - uc) > 0.05 * fabs(uc) + 1e-6) flips++;
        }
        printf("  grpo step %-5s updated LoRA: %zu of %zu parameters with a clear gradient, %zu disagree\n", nm, clear, c->n, flips);
        // (at least a tenth of the parameters must be clear of the error, or the check tests nothing)
        ck_assert_msg(clear >= c->n / 10, "%s: only %zu of %zu parameters have a clear gradient", nm, clear, c->n);
        ck_assert_msg(flips <= clear / 200, "%s: %zu of %zu clear updates disagree", nm, flips, clear);
    }
    GrpoStepRun *all[4] = {&co, &go, &cb, &gb};
    for (int i = 0; i < 4; i++) free(all[i]->grads), free(all[i]->before), free(all[i]->after);
}
END_TEST

// PPO's value model (train/ppo_train.h) on the qwen3 fixture, CPU vs GPU: the values (the score head on
// the final normed hidden state of the value adapter's forward: logits_forward with a one-row head) and
// the gradients of sum_n dv_n value_n (the head's: linear_backward; the value adapter's: through
// model_backward_hidden), within test_grpo_step's allowances; the policy's adapter gets none
typedef struct {
    double val[GS_B * GS_T], policy_gnorm;
    float *gh, *ga;
    size_t na;
    int C;
} ValueRun;

static void value_run(ValueRun *r, const Backend *be) {
    char dir[1024], p[1100];
    Model m;
    load_fixture(&m, dir, sizeof dir, "qwen3", be, FP8_OFF);
    path_join(p, sizeof p, dir, "tokens.npy");
    Npy tk = npy_read(p);
    int ids[GS_B * GS_T];
    for (int b = 0; b < GS_B; b++)  // as grpo_step's
        for (int t = 0; t < GS_T; t++) ids[b * GS_T + t] = (int)tk.data[(b % 2) * tk.shape[1] + (b / 2) * 8 + t];
    npy_free(&tk);
    LoRA *lo = lora_create(&m, 4, 8.0f, (1u << LIN_COUNT) - 1, 7, 0);
    m.lora = lo;
    ValueModel v;
    value_init(&v, &m, lo, 9);
    Rng pr = rng_make(78);  // the value adapter and the head away from zero, the same on both backends
    double *par = (double *)mallocCheck(v.lo->n * sizeof(double));
    for (size_t i = 0; i < v.lo->n; i++) par[i] = 0.1 * rng_normal(&pr);
    be->upload_convert(v.lo->params, be->hp, par, DT_F64, v.lo->n);
    for (int i = 0; i < v.C; i++) par[i] = rng_normal(&pr) / sqrt((double)v.C);
    be->upload_convert(v.w, be->hp, par, DT_F64, v.C);
    be->to_act(v.w_act, v.w, v.C);
    free(par);
    value_forward(&v, &m, ids, GS_B, GS_T, r->val);
    double dv[GS_B * GS_T];
    Rng dr = rng_make(79);
    for (int i = 0; i < GS_B * GS_T; i++) dv[i] = rng_normal(&dr) / (GS_B * GS_T);
    lora_zero_grads(lo);
    value_zero_grads(&v);
    value_backward(&v, &m, dv);
    r->policy_gnorm = lora_grad_norm(lo);
    r->C = v.C, r->na = v.lo->n;
    r->gh = fmalloc(v.C);
    r->ga = fmalloc(v.lo->n);
    be->download(r->gh, v.g, (size_t)v.C * 4);
    be->download(r->ga, v.lo->grads, v.lo->n * 4);
    value_free(&v);
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
}

START_TEST(test_value_model) {
    ValueRun c, g;
    value_run(&c, CPU);
    value_run(&g, G);
    // values: bf16 hidden states, 2^-5 of their scale (relative L2 over the batch)
    double num = 0, den = 0;
    for (int i = 0; i < GS_B * GS_T; i++) num += (g.val[i] - c.val[i]) * (g.val[i] - c.val[i]), den += c.val[i] * c.val[i];
    double ev = sqrt(num / den), eh = rel_l2(g.gh, c.gh, c.C, NULL), ea = rel_l2(g.ga, c.ga, c.na, NULL);
    printf("  value model: values rel L2 %.4f (tol %.4f); gradients rel L2 head %.4f, adapter %.4f (tol %.4f)\n", ev, 0x1p-5,
           eh, ea, 0x1p-4);
    ck_assert_msg(ev <= 0x1p-5, "values differ by %g", ev);
    ck_assert_msg(eh <= 0x1p-4 && ea <= 0x1p-4, "gradients differ: head %g, adapter %g", eh, ea);
    ck_assert_msg(c.policy_gnorm == 0 && g.policy_gnorm == 0, "the policy got a gradient: %g (CPU), %g (GPU)", c.policy_gnorm,
                  g.policy_gnorm);
    free(c.gh), free(c.ga), free(g.gh), free(g.ga);
}
END_TEST

// Reward models (train/reward_model.h): each fixture's cases (cases.json: text and conversational prompts)
// scored on backend be at gran into out (*n of them); lend: through an arena of a policy's too small for the
// whole batch (micro-batches, as between a rollout and an update)
static void reward_scores(const char *name, const Backend *be, FP8Gran gran, int lend, double *out, int *n) {
    char dir[1024], p[1100];
    snprintf(dir, sizeof dir, "%s/reward_model/%s", fixture_dir(), name);
    path_join(p, sizeof p, dir, "cases.json");
    char *text = read_file(p, NULL);
    cJSON *root = cJSON_Parse(text), *it;
    free(text);
    Example ex[16];
    char *comp[16];
    memset(ex, 0, sizeof ex);
    *n = 0;
    cJSON_ArrayForEach(it, root) {
        cJSON *sys = cJSON_GetObjectItem(it, "system");
        ex[*n].prompt = cJSON_GetObjectItem(it, "prompt")->valuestring;
        ex[*n].system = cJSON_IsString(sys) ? sys->valuestring : NULL;
        ex[*n].messages = cJSON_IsTrue(cJSON_GetObjectItem(it, "messages")) ? (char *)"[]" : NULL;
        comp[(*n)++] = cJSON_GetObjectItem(it, "completion")->valuestring;
    }
    RewardModel rm;
    reward_model_open(&rm, dir, 1);
    reward_model_load(&rm, be, gran);
    Model owner;
    memset(&owner, 0, sizeof owner);
    owner.be = be;
    if (lend) model_arena_init(&owner, model_acts_bytes(&rm.m, 2, 64, ACTS_FORWARD_ONLY));
    reward_model_score(&rm, lend ? &owner : NULL, ex, 1, *n, comp, out, 1);
    if (owner.arena.mem) be->free(owner.arena.mem);
    reward_model_close(&rm);
    cJSON_Delete(root);
}

// The GPU's scores against the CPU's: BF16 within 2^-5 (rel L2 over the cases, the value model's allowance:
// a dot product of bf16 hidden states); FP8 block within that plus the FP8 quantization's own effect on the
// CPU (rel L2 between the CPU's FP8 and fp32 scores), as the logits above
START_TEST(test_reward_models) {
    const char *names[2] = {"llama", "qwen3"};
    for (int a = 0; a < 2; a++)
        for (int lend = 0; lend < 2; lend++) {
            double co[16], go[16], cb[16], gb[16];
            int n;
            reward_scores(names[a], CPU, FP8_OFF, 0, co, &n);
            reward_scores(names[a], G, FP8_OFF, lend, go, &n);
            reward_scores(names[a], CPU, FP8_BLOCK, 0, cb, &n);
            reward_scores(names[a], G, FP8_BLOCK, lend, gb, &n);
            float f[4][16];
            for (int i = 0; i < n; i++) f[0][i] = (float)co[i], f[1][i] = (float)go[i], f[2][i] = (float)cb[i], f[3][i] = (float)gb[i];
            double q = rel_l2(f[2], f[0], n, NULL), eo = rel_l2(f[1], f[0], n, NULL), eb = rel_l2(f[3], f[2], n, NULL);
            printf("  reward model %-5s%s: scores rel L2 off %.4f (tol %.4f), block %.4f (tol %.4f; FP8's effect on the CPU %.4f)\n",
                   names[a], lend ? " (lent an arena)" : "", eo, 0x1p-5, eb, 0x1p-5 + q, q);
            ck_assert_msg(eo <= 0x1p-5, "%s: BF16 scores differ by %g", names[a], eo);
            ck_assert_msg(eb <= 0x1p-5 + q, "%s: FP8 scores differ by %g", names[a], eb);
        }
}
END_TEST

// One full-weight training step (full_finetune.h) on each fixture, CPU vs GPU: the gradients of every dense
// weight (embeddings, norms, projections, biases, the LM head) within the LoRA gradients' allowance
// (2^-4 rel L2: the chain runs forward and back through bf16 storage), the AdamW update of the fp32
// masters the same where the gradient's sign is beyond doubt, and the act weights after the step
// exactly the masters rounded (bf16 on the GPU: round to nearest even; the values on the CPU).
typedef struct {
    float *grads, *before, *after;
    size_t n;
} FullRun;

static void full_run(FullRun *r, const char *arch, const Backend *be) {
    char dir[1024], p[1100];
    Model m;
    load_fixture(&m, dir, sizeof dir, arch, be, FP8_OFF);
    path_join(p, sizeof p, dir, "tokens.npy");
    Npy tk = npy_read(p);
    int B = (int)tk.shape[0], T = (int)tk.shape[1];
    int *ids = (int *)mallocCheck(B * T * sizeof(int)), *tg = (int *)mallocCheck(B * T * sizeof(int));
    double *lp = (double *)mallocCheck(B * T * 8), *dl = (double *)mallocCheck(B * T * 8);
    for (int i = 0; i < B * T; i++) ids[i] = (int)tk.data[i];
    npy_free(&tk);
    Rng pr = rng_make(41);
    for (int i = 0; i < B * T; i++) {
        tg[i] = (i % T == T - 1 || i % 7 == 3) ? -1 : ids[i + 1];
        dl[i] = tg[i] < 0 ? 0 : -1.0 / (B * T) + 0.01 * rng_normal(&pr);
    }
    FullTrainer ft;
    full_init(&ft, &m);
    r->n = ft.n;
    r->grads = fmalloc(ft.n), r->before = fmalloc(ft.n), r->after = fmalloc(ft.n);
    be->download(r->before, ft.master, ft.n * 4);
    model_forward(&m, NULL, ids, B, T);
    model_logprobs(&m, tg, 1.0f, lp);
    model_zero_grads(&m);
    model_backward(&m, NULL, dl);
    be->download(r->grads, m.grads, ft.n * 4);
    full_step(&ft, &m, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.0);
    be->download(r->after, ft.master, ft.n * 4);
    // the act weights are the masters rounded
    size_t act = dtype_size(be->act);
    void *w = mallocCheck(ft.n * act);
    be->download(w, m.w.dense_mem, ft.n * act);
    for (size_t i = 0; i < ft.n; i++) {
        float want = be->act == DT_BF16 ? bf16_to_f32(f32_to_bf16(r->after[i])) : r->after[i];
        float got = be->act == DT_BF16 ? bf16_to_f32(((uint16_t *)w)[i]) : ((float *)w)[i];
        ck_assert_msg(got == want || (isnan(got) && isnan(want)), "%s %s: weight %zu is %g, its master rounds to %g", arch,
                      be->name, i, got, want);
    }
    free(w);
    full_free(&ft);
    free(ids), free(tg), free(lp), free(dl);
    model_free(&m);
}

// the GPU's full step, then the CPU's (following the GPU's routing: Qwen3 MoE, as model_runs)
static void full_runs(FullRun *g, FullRun *c, const char *arch) {
    if (strncmp(arch, "qwen3_moe", 9)) {
        full_run(g, arch, G);
        full_run(c, arch, CPU);
        return;
    }
    rt_begin(0x1p-5);  // (BF16 weights: a full step trains them)
    full_run(g, arch, &GW);
    full_run(c, arch, &CW);
    rt_end("full step", arch, "off");
}

START_TEST(test_full_step) {
    for (int a = 0; a < N_ARCHS; a++) {
        FullRun c, g;
        full_runs(&g, &c, ARCHS[a]);
        ck_assert_int_eq(c.n, g.n);
        double eg = rel_l2(g.grads, c.grads, c.n, NULL), tg = 0x1p-4;
        printf("  full step %-6s %zu weights: gradients rel L2 %.4f (tol %.4f)\n", ARCHS[a], c.n, eg, tg);
        ck_assert_msg(eg <= tg, "%s: full-weight gradients differ by %g", ARCHS[a], eg);
        // as test_grpo_step: Adam's first step moves each master by ~lr sign(g); compared where the
        // gradient is clear of the error (|g| > 3 x the RMS gradient error)
        double rms = 0;
        for (size_t i = 0; i < c.n; i++) rms += (double)c.grads[i] * c.grads[i];
        double rms_err = eg * sqrt(rms / c.n);
        size_t clear = 0, flips = 0;
        for (size_t i = 0; i < c.n; i++) {
            ck_assert_msg(fabs(g.before[i] - c.before[i]) <= 0x1p-8 * fabs(c.before[i]), "%s: masters differ at load", ARCHS[a]);
            if (fabs(c.grads[i]) <= 3 * rms_err) continue;
            clear++;
            double ug = g.after[i] - g.before[i], uc = c.after[i] - c.before[i];
            if ((ug > 0) != (uc > 0) || fabs(ug - uc) > 0.05 * fabs(uc) + 1e-6) flips++;
        }
        printf("  full step %-6s updated masters: %zu with a clear gradient, %zu disagree\n", ARCHS[a], clear, flips);
        ck_assert_msg(clear >= c.n / 20, "%s: only %zu of %zu weights have a clear gradient", ARCHS[a], clear, c.n);
        ck_assert_msg(flips <= clear / 200, "%s: %zu of %zu clear updates disagree", ARCHS[a], flips, clear);
        free(c.grads), free(c.before), free(c.after), free(g.grads), free(g.before), free(g.after);
    }
}
END_TEST

// FP8 training that keeps its projections' inputs as FP8 codes (Model.fp8_keep, model.c acts_keep)
// against the same training with their bf16 values saved: per tensor the weight gradient's codes are
// the forward's codes transposed, so three steps give bit-identical logprobs, gradients and masters,
// with Qwen2's biases, Qwen3's q/k norms and Gemma 3's sandwich norms and GeGLU, and the delayed
// recipe (whose norms and GLU write the codes alone: fp8_train_norm_q / glu_q) and the current one
// (whose products quantize and keep them); and the saved activations are smaller by a byte an element
// of ln1, ln2, hmlp.
// The same with gate and up recomputed in the backward (Model.recompute_mlp) from the kept codes, and
// from the bf16 input, bit-identical again: the products run again on the same operands.
START_TEST(test_fp8_kept_inputs) {
    int B = 2, T = 64, N = B * T;
    Arch archs[3] = {ARCH_QWEN2, ARCH_QWEN3, ARCH_GEMMA3};
    const char *how[4] = {"kept in FP8", "bf16-saved", "kept, gate/up recomputed", "bf16-saved, gate/up recomputed"};
    for (int a = 0; a < 3; a++)
        for (int kind = 0; kind < 2; kind++) {
            Config c;
            memset(&c, 0, sizeof c);
            c.arch = archs[a];
            c.V = 256, c.C = 128, c.FF = 256, c.L = 3, c.NH = 4, c.KVH = 2, c.HD = 32, c.max_pos = 128;
            c.eps = 1e-6f, c.rope_theta = 10000.0f, c.tied = 1, c.bos_id = -1;
            c.qkv_bias = archs[a] == ARCH_QWEN2, c.qk_norm = archs[a] != ARCH_QWEN2, c.gemma = archs[a] == ARCH_GEMMA3;
            FP8Recipe r = fp8_recipe_default();
            r.kind = kind ? FP8_RECIPE_CURRENT : FP8_RECIPE_DELAYED;
            ModelOptions o = {FP8_OFF, 0, 0, 0, 0};
            Model m[4];
            FullTrainer ft[4];
            for (int k = 0; k < 4; k++) {
                model_init_random(&m[k], &c, G, &o, 5);
                full_init(&ft[k], &m[k]);
                model_fp8_train(&m[k], &r);
                ck_assert_msg(m[k].fp8_keep, "a per-tensor recipe on every layer keeps the inputs in FP8");
                m[k].fp8_keep = k % 2 == 0;
                m[k].recompute_mlp = k >= 2;
            }
            size_t bytes[4];
            for (int k = 0; k < 4; k++) bytes[k] = model_acts_bytes(&m[k], B, T, 0);
            // kept: L - 1 layers of ln1, ln2, hmlp at 2 bytes less, L layers of codes at 1 byte more;
            // recomputed: L - 1 layers of gate and up less (all within the 256-byte alignment of each buffer)
            size_t less = (size_t)(c.L - 1) * N * (2 * c.C + c.FF) * 2 - (size_t)c.L * N * (2 * c.C + c.FF);
            size_t gu = (size_t)(c.L - 1) * N * 2 * c.FF * 2;
            ck_assert_msg(bytes[1] - bytes[0] >= less - 2048 && bytes[1] - bytes[0] <= less + 2048,
                          "activations %zu bytes less, %zu expected", bytes[1] - bytes[0], less);
            ck_assert_msg(bytes[0] - bytes[2] == gu && bytes[1] - bytes[3] == gu, "recomputed: %zu / %zu bytes less, %zu expected",
                          bytes[0] - bytes[2], bytes[1] - bytes[3], gu);
            size_t n = ft[0].n;
            float *g[4], *w[4];
            double *lp[4];
            for (int k = 0; k < 4; k++) g[k] = fmalloc(n), w[k] = fmalloc(n), lp[k] = (double *)mallocCheck(N * 8);
            int *ids = (int *)mallocCheck(N * sizeof(int)), *tg = (int *)mallocCheck(N * sizeof(int));
            double *dl = (double *)mallocCheck(N * 8);
            Rng rg = rng_make(3);
            for (int step = 0; step < 3; step++) {
                for (int i = 0; i < N; i++) ids[i] = rng_int(&rg, c.V);
                for (int i = 0; i < N; i++) tg[i] = i % T == T - 1 ? -1 : ids[i + 1], dl[i] = tg[i] < 0 ? 0 : -1.0 / N;
                for (int k = 0; k < 4; k++) {
                    model_forward(&m[k], NULL, ids, B, T);
                    model_logprobs(&m[k], tg, 1.0f, lp[k]);
                    model_zero_grads(&m[k]);
                    model_backward(&m[k], NULL, dl);
                    G->download(g[k], m[k].grads, n * 4);
                    full_step(&ft[k], &m[k], 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0);
                    G->download(w[k], ft[k].master, n * 4);
                    ck_assert_int_eq(m[k].acts.keep, k % 2 == 0);
                }
                for (int k = 0; k < 4; k++) {
                    if (k == 1) continue;
                    char what[160];
                    snprintf(what, sizeof what, "arch %d %s step %d, %s: logprobs", a, kind ? "current" : "delayed", step, how[k]);
                    check_exact(what, lp[k], lp[1], N * 8);
                    snprintf(what, sizeof what, "arch %d %s step %d, %s: gradients", a, kind ? "current" : "delayed", step, how[k]);
                    check_exact(what, g[k], g[1], n * 4);
                    snprintf(what, sizeof what, "arch %d %s step %d, %s: masters", a, kind ? "current" : "delayed", step, how[k]);
                    check_exact(what, w[k], w[1], n * 4);
                }
            }
            printf("  fp8 kept inputs, arch %d, %s: 3 steps bit-identical to bf16-saved; activations %zu -> %zu bytes "
                   "(gate/up recomputed: %zu)\n", a, kind ? "current" : "delayed", bytes[1], bytes[0], bytes[2]);
            for (int k = 0; k < 4; k++) full_free(&ft[k]), model_free(&m[k]), free(g[k]), free(w[k]), free(lp[k]);
            free(ids), free(tg), free(dl);
        }
}
END_TEST

static Suite *gpu_models_suite(void) {
    Suite *s = suite_create("gpu_models");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_models);
    tcase_add_test(tc, test_grpo_step);
    tcase_add_test(tc, test_value_model);
    tcase_add_test(tc, test_reward_models);
    tcase_add_test(tc, test_full_step);
    tcase_add_test(tc, test_fp8_kept_inputs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    char why[256];
    setenv("FP8GRPO_LOGITS_CHUNK_ROWS", "16", 1);  // before the first logprobs call: several chunks in small tests
    G = backend_cuda(why, sizeof why);
    if (!G) {
        fprintf(stderr, "gpu_models: %s; this suite runs on a GPU machine (make test-gpu)\n", why);
        return 1;
    }
    CPU = backend_cpu();
    rng = rng_make(20261122);
    printf("gpu_models on %s\n", G->device_desc);
    return run_suite(gpu_models_suite());
}
