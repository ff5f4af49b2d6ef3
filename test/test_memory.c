// test/test_memory.c: the memory options on the CPU reference backend.
// Checks: the FP8 embedding table and LM head (--fp8_embeddings: E4M3, a scale per row) within
// bounds derived from E4M3's precision, op by op and through a whole fixture model; the tied
// checkpoint's one copy; the bytes it saves; frozen (no gradients). The update's micro-batch and
// recomputation chosen to fit the arena (memory_fit.h). LoRA masters and AdamW state in bf16 (--lora_dtype
// bf16): stochastic rounding's expectation, a small update kept on average, training as fp32 state does.
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "lora.h"
#include "model.h"
#include "testutil.h"
#include "train/memory_fit.h"

static Rng rng;

static float *randu(size_t n, float a) {
    float *x = (float *)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float u;
        do u = (float)(2 * rng_uniform(&rng) - 1);
        while (u == 0);  // never zeros
        x[i] = a * u;
    }
    return x;
}

// E4M3 rounds to nearest with 3 mantissa bits: a normal value moves by at most 2^-4 of itself; below
// the normal range (2^-6 of the scale) the step is 2^-9 of the scale, so at most 2^-10 scale absolute.
// |q(x) - x| <= 2^-4 |x| + 2^-10 s, s the group's dequantization scale (amax / 448).
static double e4m3_err(double x, double s) { return 0x1p-4 * fabs(x) + 0x1p-10 * s; }

static float row_scale(const float *x, int C) {
    float amax = 0;
    for (int c = 0; c < C; c++) amax = fmaxf(amax, fabsf(x[c]));
    return fp8_scale_from_amax(amax, FP8_E4M3, 0);
}

// The CPU backend's FP8 head against the dense one on the same fp32 W and h. Per logit,
// |hq.wq - h.w| <= sum_c |dh_c| |w_c| + |h_c| |dw_c| + |dh_c| |dw_c| with the bounds above; a logprob
// moves by at most its logit's error plus the largest one (the logsumexp is 1-Lipschitz in max norm).
START_TEST(test_fp8_head_ops) {
    const Backend *be = backend_cpu();
    int N = 13, C = 96, V = 500;
    float *h = randu((size_t)N * C, 2.0f), *w = randu((size_t)V * C, 0.3f);
    int32_t tg[13];
    for (int i = 0; i < N; i++) tg[i] = i == 4 ? -1 : rng_int(&rng, V);
    QWeight dense = {.rows = V, .cols = C, .gran = FP8_OFF};
    dense.dense = w;
    QWeight q8 = {.rows = V, .cols = C, .gran = FP8_ROW};
    fp8_tensor_alloc_cpu(&q8.q, V, C, FP8_ROW, FP8_E4M3, FP8_BLOCK_SIZE);
    be->quantize_weight(&q8, w, DT_F32, 0);
    float *zd = (float *)mallocCheck((size_t)N * V * 4), *zq = (float *)mallocCheck((size_t)N * V * 4);
    be->logits_forward(zd, h, &dense, N);
    be->logits_forward(zq, h, &q8, N);
    double worst = 0, moved = 0, *zb = (double *)mallocCheck(N * sizeof(double));
    for (int n = 0; n < N; n++) {
        double sh = row_scale(h + (size_t)n * C, C);
        zb[n] = 0;
        for (int j = 0; j < V; j++) {
            double sw = row_scale(w + (size_t)j * C, C), b = 0;
            for (int c = 0; c < C; c++) {
                double x = h[(size_t)n * C + c], y = w[(size_t)j * C + c], ex = e4m3_err(x, sh), ey = e4m3_err(y, sw);
                b += ex * fabs(y) + fabs(x) * ey + ex * ey;
            }
            double e = fabs((double)zq[(size_t)n * V + j] - zd[(size_t)n * V + j]);
            ck_assert_msg(e <= b * (1 + 1e-5) + 1e-6, "FP8 logit (%d, %d) off by %g > bound %g", n, j, e, b);
            worst = fmax(worst, e / b);
            moved = fmax(moved, e);
            zb[n] = fmax(zb[n], b);
        }
    }
    ck_assert_msg(moved > 0, "the FP8 head gave the dense logits exactly: its path did not run");
    printf("  FP8 head logits: worst err / E4M3 bound %.3f\n", worst);
    // logprobs
    float lpd[13], lpq[13], lsd[13], lsq[13];
    be->logprobs_forward(lpd, lsd, h, &dense, tg, 1.0f, N);
    be->logprobs_forward(lpq, lsq, h, &q8, tg, 1.0f, N);
    for (int n = 0; n < N; n++) {
        if (tg[n] < 0) {
            ck_assert(lpq[n] == 0);
            continue;
        }
        ck_assert_msg(fabsf(lpq[n] - lpd[n]) <= 2 * zb[n] * (1 + 1e-5) + 1e-5, "logprob %d off by %g > %g", n,
                      fabsf(lpq[n] - lpd[n]), 2 * zb[n]);
    }
    // the backward goes through the same operands: dh of the FP8 head = the dense backward on the
    // fake-quantized h and the dequantized W (straight-through), here rebuilt by hand
    float g[13], *dhq = (float *)mallocCheck((size_t)N * C * 4), *dhr = (float *)mallocCheck((size_t)N * C * 4);
    for (int n = 0; n < N; n++) g[n] = (float)(rng_uniform(&rng) + 0.5);
    be->logprobs_backward(dhq, NULL, g, lsq, h, &q8, tg, 1.0f, N);
    float *hq = (float *)mallocCheck((size_t)N * C * 4), *wq = (float *)mallocCheck((size_t)V * C * 4);
    FP8Tensor ht;
    fp8_tensor_alloc_cpu(&ht, N, C, FP8_ROW, FP8_E4M3, 1);
    fp8_quantize_cpu(&ht, h, 0);
    fp8_dequantize_cpu(hq, &ht);
    fp8_dequantize_cpu(wq, &q8.q);
    QWeight deq = {.rows = V, .cols = C, .gran = FP8_OFF};
    deq.dense = wq;
    be->logprobs_backward(dhr, NULL, g, lsq, hq, &deq, tg, 1.0f, N);
    for (size_t i = 0; i < (size_t)N * C; i++)
        ck_assert_msg(fabsf(dhq[i] - dhr[i]) <= 1e-5f * (1 + fabsf(dhr[i])), "dh[%zu] %g != %g", i, dhq[i], dhr[i]);
    // the frozen head has no gradient
    float *dw = (float *)callocCheck((size_t)V * C, 4);
    EXPECT_DIE(be->logprobs_backward(dhq, dw, g, lsq, h, &q8, tg, 1.0f, N), "frozen");
    // embedding rows: each within the bound of its own row scale
    float *e = (float *)mallocCheck((size_t)N * C * 4);
    int32_t ids[13];
    for (int n = 0; n < N; n++) ids[n] = rng_int(&rng, V);
    be->embedding_forward(e, ids, &q8, N);
    for (int n = 0; n < N; n++) {
        const float *src = w + (size_t)ids[n] * C;
        double s = row_scale(src, C);
        for (int c = 0; c < C; c++)
            ck_assert_msg(fabs((double)e[(size_t)n * C + c] - src[c]) <= e4m3_err(src[c], s) * (1 + 1e-6),
                          "embedding (%d, %d): %g from %g", n, c, e[(size_t)n * C + c], src[c]);
    }
    fp8_tensor_free_cpu(&q8.q);
    fp8_tensor_free_cpu(&ht);
    free(h); free(w); free(zd); free(zq); free(zb); free(dhq); free(dhr); free(hq); free(wq); free(dw); free(e);
}
END_TEST

static void load(Model *m, const char *arch, int fp8_embed) {
    char p[1024];
    fixture_path(p, sizeof p, arch);
    ModelOptions o = {FP8_BLOCK, 0, 0, 0, fp8_embed};
    model_load(m, p, backend_cpu(), &o);
}

// A fixture model with --fp8_embeddings against the same model whose dense embedding table and head
// hold the FP8 tables' dequantized values: the embeddings are then identical, and so is everything up
// to the head, which differs only by the quantization of its input h per row: per logit
// sum_c (2^-4 |h_c| + 2^-10 s_h) |wq_c|.
static void fp8_embed_model_case(const char *arch) {
    Model q, d;
    load(&q, arch, 1);
    load(&d, arch, 0);
    const Config *c = &q.cfg;
    int V = c->V, C = c->C;
    ck_assert_int_eq(q.w.emb.gran, FP8_ROW);
    ck_assert_msg(q.w.wte == NULL && q.w.lm_head == NULL, "FP8 tables keep no dense copy");
    if (c->tied) ck_assert_msg(q.w.head.q.data == q.w.emb.q.data, "tied: one FP8 copy");
    else ck_assert_msg(q.w.head.q.data != q.w.emb.q.data, "untied: two tables");
    // bytes: the dense part loses the tables (act = 4 bytes on the CPU), the FP8 part gains a byte per
    // value and a scale per row, each tensor 256-byte aligned
    int ntab = c->tied ? 1 : 2;
    size_t cut = d.w.dense_bytes - q.w.dense_bytes, gain = q.w.fp8_bytes - d.w.fp8_bytes;
    ck_assert_msg(cut >= (size_t)ntab * V * C * 4 && cut < (size_t)ntab * (V * C * 4 + 1024), "dense part shrank by %zu", cut);
    ck_assert_msg(gain >= (size_t)ntab * ((size_t)V * C + V * 4) && gain < (size_t)ntab * ((size_t)V * C + V * 4 + 512),
                  "FP8 part grew by %zu", gain);
    // the dense model gets the dequantized tables
    float *t = (float *)mallocCheck((size_t)V * C * 4);
    fp8_dequantize_cpu(t, &q.w.emb.q);
    memcpy(d.w.wte, t, (size_t)V * C * 4);
    if (!c->tied) fp8_dequantize_cpu(t, &q.w.head.q);
    if (!c->tied) memcpy(d.w.lm_head, t, (size_t)V * C * 4);
    int B = 2, T = 9, N = B * T;
    int ids[18];
    for (int i = 0; i < N; i++) ids[i] = rng_int(&rng, V);
    float *lq = (float *)mallocCheck((size_t)N * V * 4), *ld = (float *)mallocCheck((size_t)N * V * 4);
    model_forward(&q, NULL, ids, B, T);
    model_logits(&q, lq);
    model_forward(&d, NULL, ids, B, T);
    model_logits(&d, ld);
    const float *h = (const float *)d.acts.lnf;  // the head's input, the same in both up to here
    double worst = 0, moved = 0;
    for (int n = 0; n < N; n++) {
        double sh = row_scale(h + (size_t)n * C, C);
        for (int j = 0; j < V; j++) {
            double b = 0;
            for (int k = 0; k < C; k++) b += e4m3_err(h[(size_t)n * C + k], sh) * fabs(t[(size_t)j * C + k]);
            double e = fabs((double)lq[(size_t)n * V + j] - ld[(size_t)n * V + j]);
            ck_assert_msg(e <= b * (1 + 1e-4) + 1e-5, "%s: logit (%d, %d) off by %g > bound %g", arch, n, j, e, b);
            worst = fmax(worst, e / b);
            moved = fmax(moved, e);
        }
    }
    ck_assert_msg(moved > 0, "%s: the head's input was not quantized", arch);
    printf("  %s with --fp8_embeddings: worst logit err / E4M3 bound %.3f\n", arch, worst);
    EXPECT_DIE(model_alloc_grads(&q), "drop --fp8_embeddings");
    free(t); free(lq); free(ld);
    model_free(&q);
    model_free(&d);
}

START_TEST(test_fp8_embed_model) {
    fp8_embed_model_case("qwen3");   // tied
    fp8_embed_model_case("llama3");  // untied
}
END_TEST

// memfit (memory_fit.h's rule) on a fixture model with LoRA, against arena caps placed between the needs
START_TEST(test_memfit) {
    Model m;
    load(&m, "qwen3", 0);
    LoRA *lo = lora_create(&m, 4, 8.0f, (1u << LIN_COUNT) - 1, 3, 0);
    m.lora = lo;  // (memfit counts its memory)
    int S = 8, T = 40;
    FitChoice f;
    // the needs grow with the micro-batch, and recomputation lowers them
    for (int mb = 1; mb < S; mb++) {
        ck_assert(memfit_bytes(&m, mb, T, 0) < memfit_bytes(&m, mb + 1, T, 0));
        ck_assert(memfit_bytes(&m, mb, T, 1) < memfit_bytes(&m, mb, T, 0));
    }
    // a prefill's forward alone holds less than recomputation's layout (two slots of x, no backward)
    ck_assert(model_acts_bytes(&m, S, T, ACTS_FORWARD_ONLY) < model_acts_bytes(&m, S, T, 1));
    // no arena (the CPU): the whole batch, no recomputation
    ck_assert(memfit_update(&m, S, T, 0, -1, &f) == 0 && f.mb == S && f.recompute == 0);
    // room for the whole batch
    m.arena.cap = memfit_bytes(&m, S, T, 0);
    ck_assert(memfit_update(&m, S, T, 0, -1, &f) == 0 && f.mb == S && f.recompute == 0 && f.bytes == m.arena.cap);
    // room for all of it with recomputation only: short sequences (a micro-batch of fewer than
    // MEMFIT_MIN_TOKENS tokens without it) recompute over the whole batch
    m.arena.cap = memfit_bytes(&m, S, T, 1);
    ck_assert(memfit_update(&m, S, T, 0, -1, &f) == 0 && f.mb == S && f.recompute == 1);
    // long sequences (2 x 4096 tokens) keep the plain backward at a smaller micro-batch
    int TL = 4096;
    m.arena.cap = memfit_bytes(&m, 2, TL, 0);
    ck_assert(memfit_update(&m, S, TL, 0, -1, &f) == 0 && f.mb == 2 && f.recompute == 0);
    // the user's options win: --gradient_checkpointing, --micro_batch_size
    ck_assert(memfit_update(&m, S, TL, 0, 1, &f) == 0 && f.recompute == 1 && f.bytes <= m.arena.cap);
    ck_assert(memfit_update(&m, S, TL, 1, -1, &f) == 0 && f.mb == 1 && f.recompute == 0);
    m.arena.cap = memfit_bytes(&m, 4, TL, 1);  // 4 sequences fit with recomputation only
    ck_assert(memfit_update(&m, S, TL, 4, -1, &f) == 0 && f.mb == 4 && f.recompute == 1);
    // nothing fits: -1 and the need of the smallest setting (micro-batch 1, recomputation on)
    m.arena.cap = memfit_bytes(&m, 1, T, 1) - 1;
    ck_assert(memfit_update(&m, S, T, 0, -1, &f) == -1 && f.mb == 1 && f.recompute == 1 &&
              f.bytes == memfit_bytes(&m, 1, T, 1));
    ck_assert(memfit_update(&m, S, T, 3, -1, &f) == -1 && f.mb == 3);
    m.arena.cap = 0;
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
}
END_TEST

// f32_to_bf16_sr over all 2^16 random halves: the mean is the input exactly (its expectation), every
// result is one of the two bf16 neighbours, and rounding to nearest is one of them
START_TEST(test_stochastic_rounding) {
    for (int k = 0; k < 200; k++) {
        float f = (float)((rng_uniform(&rng) - 0.5) * pow(2.0, rng_int(&rng, 40) - 20));
        if (f == 0) continue;
        uint16_t lo = f32_to_bf16_sr(f, 0), hi = f32_to_bf16_sr(f, 0xffff);
        double sum = 0;
        for (uint32_t r = 0; r < 65536; r++) {
            uint16_t b = f32_to_bf16_sr(f, r);
            ck_assert_msg(b == lo || b == hi, "SR(%g) gave %g, not a neighbour", f, bf16_to_f32(b));
            sum += bf16_to_f32(b);
        }
        ck_assert_msg(sum == (double)f * 65536, "SR(%g): mean %.10g", f, sum / 65536);
        uint16_t rn = f32_to_bf16(f);
        ck_assert(rn == lo || rn == hi);
    }
    // the hashed bits: uniform enough that their mean over 2^20 elements is 2^15 - 1/2 within 6 sigma
    double mean = 0;
    for (size_t i = 0; i < (1u << 20); i++) mean += sr_bits(99, 3, i, i % 3);
    mean /= 1u << 20;
    ck_assert_msg(fabs(mean - 32767.5) < 6 * 18918.6 / 1024, "sr_bits mean %.2f", mean);
}
END_TEST

// adamw_bf16 on the CPU backend: an update of 1/16 of a bf16 step, which rounding to nearest would
// drop, moves the weights by the right amount on average; every result is a bf16 value; it repeats
START_TEST(test_adamw_bf16) {
    const Backend *be = backend_cpu();
    size_t n = 100000;
    float *p = (float *)mallocCheck(n * 4), *g = (float *)mallocCheck(n * 4), *m = (float *)callocCheck(n, 4),
          *v = (float *)callocCheck(n, 4);
    for (size_t i = 0; i < n; i++) p[i] = 1.0f, g[i] = 0.5f + rng_uniform(&rng);
    float lr = 0x1p-12f;  // the first Adam step is lr g / (|g| + eps) ~ lr: 1/16 of bf16's step below 1.0 (2^-8)
    be->adamw_bf16(p, g, m, v, n, lr, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 5);
    double mean = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(bf16_to_f32(f32_to_bf16(p[i])) == p[i] && bf16_to_f32(f32_to_bf16(m[i])) == m[i] &&
                          bf16_to_f32(f32_to_bf16(v[i])) == v[i], "element %zu is not a bf16 value", i);
        mean += p[i];
    }
    mean /= n;
    // each weight is 1 - 2^-8 (the bf16 below 1) with probability q = 2^-12 / 2^-8 = 1/16: the mean moves by
    // lr, with a standard deviation of 2^-8 sqrt(q (1 - q) / n)
    double sd = 0x1p-8 * sqrt(1.0 / 16 * 15 / 16 / n);
    ck_assert_msg(fabs(mean - (1.0 - lr)) < 6 * sd, "mean weight %.9f, expected %.9f +- %.2g", mean, 1.0 - lr, sd);
    ck_assert_msg(f32_to_bf16(1.0f - lr) == f32_to_bf16(1.0f), "rounding to nearest would have moved it");
    float *p2 = (float *)mallocCheck(n * 4), *m2 = (float *)callocCheck(n, 4), *v2 = (float *)callocCheck(n, 4);
    for (size_t i = 0; i < n; i++) p2[i] = 1.0f;
    be->adamw_bf16(p2, g, m2, v2, n, lr, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 5);
    ck_assert(!memcmp(p, p2, n * 4) && !memcmp(m, m2, n * 4) && !memcmp(v, v2, n * 4));
    free(p); free(g); free(m); free(v); free(p2); free(m2); free(v2);
}
END_TEST

// adamw with bf16 moments (m16, full fine-tuning's --adam_moments bf16) on the CPU backend: m and v are
// bf16 values; with the gradients gone, v decays by beta2 a step on average (0.999^700 = 0.496), which
// rounding to nearest would never do (a 0.1% step is below half a bf16 step); the params follow the
// fp32 moments' within 2^-6 of the update; two halves with their own i0 round as the whole; it repeats
START_TEST(test_adamw_bf16_moments) {
    const Backend *be = backend_cpu();
    size_t n = 4096;
    float *p = (float *)mallocCheck(n * 4), *g = (float *)mallocCheck(n * 4), *m = (float *)callocCheck(n, 4),
          *v = (float *)callocCheck(n, 4), *z = (float *)callocCheck(n, 4);
    float *p32 = (float *)mallocCheck(n * 4), *m32 = (float *)callocCheck(n, 4), *v32 = (float *)callocCheck(n, 4);
    for (size_t i = 0; i < n; i++) p[i] = p32[i] = rng_normal(&rng), g[i] = 0.01f * rng_normal(&rng);
    Bf16Moments m16 = {7, 0};
    float lr = 1e-3f;
    for (int step = 1; step <= 5; step++) {
        be->adamw(p, g, 1.0f, m, v, n, lr, 0.9f, 0.999f, 1e-8f, 0.0f, step, NULL, &m16);
        be->adamw(p32, g, 1.0f, m32, v32, n, lr, 0.9f, 0.999f, 1e-8f, 0.0f, step, NULL, NULL);
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(bf16_to_f32(f32_to_bf16(m[i])) == m[i] && bf16_to_f32(f32_to_bf16(v[i])) == v[i],
                      "moment %zu is not a bf16 value", i);
        worst = fmax(worst, fabs(p[i] - p32[i]));
    }
    ck_assert_msg(worst <= 5 * lr * 0x1p-6, "params differ from the fp32 moments' by %g after 5 steps of %g", worst, lr);
    float *v0 = (float *)mallocCheck(n * 4);
    memcpy(v0, v, n * 4);
    for (int step = 6; step < 706; step++) be->adamw(p, z, 1.0f, m, v, n, lr, 0.9f, 0.999f, 1e-8f, 0.0f, step, NULL, &m16);
    double ratio = 0;
    for (size_t i = 0; i < n; i++) ratio += v[i] / v0[i];
    ratio /= n;
    ck_assert_msg(fabs(ratio - pow(0.999, 700)) < 0.01, "v decayed to %.4f of itself in 700 steps, expected %.4f", ratio,
                  pow(0.999, 700));
    ck_assert_msg(f32_to_bf16(0.999f * 1.0f) == f32_to_bf16(1.0f), "rounding to nearest would have kept v");
    // halves with i0 = 0 and n / 2, against the whole
    float *q[2], *qm[2], *qv[2];
    for (int k = 0; k < 2; k++) {
        q[k] = (float *)mallocCheck(n * 4), qm[k] = (float *)mallocCheck(n * 4), qv[k] = (float *)mallocCheck(n * 4);
        memcpy(q[k], p32, n * 4), memcpy(qm[k], m, n * 4), memcpy(qv[k], v0, n * 4);
    }
    be->adamw(q[0], g, 0.5f, qm[0], qv[0], n, lr, 0.9f, 0.999f, 1e-8f, 0.01f, 9, NULL, &m16);
    Bf16Moments a = {7, 0}, b = {7, n / 2};
    be->adamw(q[1], g, 0.5f, qm[1], qv[1], n / 2, lr, 0.9f, 0.999f, 1e-8f, 0.01f, 9, NULL, &a);
    be->adamw(q[1] + n / 2, g + n / 2, 0.5f, qm[1] + n / 2, qv[1] + n / 2, n / 2, lr, 0.9f, 0.999f, 1e-8f, 0.01f, 9, NULL, &b);
    ck_assert(!memcmp(q[0], q[1], n * 4) && !memcmp(qm[0], qm[1], n * 4) && !memcmp(qv[0], qv[1], n * 4));
    for (int k = 0; k < 2; k++) free(q[k]), free(qm[k]), free(qv[k]);
    free(p); free(g); free(m); free(v); free(z); free(p32); free(m32); free(v32); free(v0);
}
END_TEST

// LoRA with bf16 masters and AdamW state on a fixture model: a few steps raising the log-likelihood
// of fixed targets do so as the fp32 state does (within a quarter of the gain), the masters stay bf16
// values, and the state written for --resume reads back as it was
START_TEST(test_lora_bf16) {
    int B = 2, T = 12, N = B * T;
    int ids[24], tg[24];
    for (int i = 0; i < N; i++) ids[i] = rng_int(&rng, 300);
    for (int i = 0; i < N; i++) tg[i] = i % T == T - 1 ? -1 : ids[i + 1];
    double gain[2];
    for (int bf = 0; bf < 2; bf++) {
        Model m;
        load(&m, "qwen3", 0);
        LoRA *lo = lora_create(&m, 4, 8.0f, (1u << LIN_COUNT) - 1, 11, bf);
        double lp[24], dl[24], first = 0, last = 0;
        for (int step = 0; step <= 8; step++) {
            model_forward(&m, lo, ids, B, T);
            model_logprobs(&m, tg, 1.0f, lp);
            double sum = 0;
            for (int i = 0; i < N; i++) sum += lp[i], dl[i] = tg[i] < 0 ? 0 : -1.0 / N;  // minimize -mean logp
            if (step == 0) first = sum;
            last = sum;
            if (step == 8) break;
            lora_zero_grads(lo);
            model_backward(&m, lo, dl);
            lora_adamw_step(lo, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f);
        }
        gain[bf] = last - first;
        ck_assert_msg(gain[bf] > 0, "%s state: log-likelihood %g -> %g", bf ? "bf16" : "fp32", first, last);
        if (bf) {
            const float *pp = (const float *)lo->params;
            for (size_t i = 0; i < lo->n; i++) ck_assert(bf16_to_f32(f32_to_bf16(pp[i])) == pp[i]);
            ck_assert(lora_state_bytes(lo) == lo->n * 16);  // the CPU keeps bf16 values in fp32 storage
            char path[] = "/tmp/test_memory_state_XXXXXX";
            int fd = mkstemp(path);
            ck_assert(fd >= 0);
            close(fd);
            lora_save_state(lo, path);
            LoRA *l2 = lora_create(&m, 4, 8.0f, (1u << LIN_COUNT) - 1, 12, 1);
            lora_load_state(l2, path);
            ck_assert(l2->step == lo->step && !memcmp(l2->params, lo->params, lo->n * 4) &&
                      !memcmp(l2->m, lo->m, lo->n * 4) && !memcmp(l2->v, lo->v, lo->n * 4));
            lora_free(l2);
            remove(path);
        }
        lora_free(lo);
        model_free(&m);
    }
    printf("  LoRA, 8 steps: log-likelihood gain %.4f with fp32 state, %.4f with bf16\n", gain[0], gain[1]);
    ck_assert_msg(fabs(gain[1] - gain[0]) <= 0.25 * gain[0], "bf16 state gained %g, fp32 %g", gain[1], gain[0]);
}
END_TEST

static Suite *memory_suite(void) {
    Suite *s = suite_create("memory");
    TCase *tc = tcase_create("memory");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fp8_head_ops);
    tcase_add_test(tc, test_fp8_embed_model);
    tcase_add_test(tc, test_memfit);
    tcase_add_test(tc, test_stochastic_rounding);
    tcase_add_test(tc, test_adamw_bf16);
    tcase_add_test(tc, test_adamw_bf16_moments);
    tcase_add_test(tc, test_lora_bf16);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    rng = rng_make(23);
    return run_suite(memory_suite());
}
