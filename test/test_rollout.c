// test/test_rollout.c: the rollout engine and the sampler on the CPU backend.
// Prefix sharing equals no sharing; greedy rollouts equal transformers' greedy
// continuation; a sequence's completion does not depend on what else is in the
// batch; EOS and truncation; the sampler's frequencies match the softmax
// (chi-square) for plain, top-k and top-p sampling; the returned logprobs.
#include <check.h>
#include <math.h>

#include "lora.h"
#include "model.h"
#include "rollout.h"
#include "testutil.h"

static void load(Model *m, const char *arch, FP8Gran g) {
    char p[1024];
    fixture_path(p, sizeof p, arch);
    ModelOptions o = {g, 0, 0, 0, 0};
    model_load(m, p, backend_cpu(), &o);
}

static int *fixture_prompt(const char *arch, int row, int n) {
    char p[1024], rel[256];
    snprintf(rel, sizeof rel, "%s/tokens.npy", arch);
    fixture_path(p, sizeof p, rel);
    Npy tk = npy_read(p);
    int *ids = (int *)mallocCheck(n * sizeof(int));
    for (int t = 0; t < n; t++) ids[t] = (int)tk.data[row * tk.shape[1] + t];
    npy_free(&tk);
    return ids;
}

// greedy rollout (G = 1) reproduces transformers' generate(do_sample=False)
START_TEST(test_greedy_matches_transformers) {
    const char *archs[3] = {"qwen3", "qwen2", "llama3"};
    for (int a = 0; a < 3; a++) {
        Model m;
        load(&m, archs[a], FP8_OFF);
        int *prompt = fixture_prompt(archs[a], 0, 8), plen = 8;
        char p[1024], rel[256];
        snprintf(rel, sizeof rel, "%s/generate.npy", archs[a]);
        fixture_path(p, sizeof p, rel);
        Npy gen = npy_read(p);
        uint64_t seed = 1;
        RolloutConfig rc = {1, (int)gen.n, 0.0f, 1.0f, 0, NULL, 0, 4, 1};
        Rollout r;
        rollout_run(&m, NULL, &rc, 1, (const int *const *)&prompt, &plen, &seed, &r);
        ck_assert_int_eq(r.len[0], gen.n);
        ck_assert_int_eq(r.truncated[0], 1);
        for (int t = 0; t < gen.n; t++) ck_assert_msg(r.ids[t] == (int)gen.data[t], "%s token %d: %d vs %d", archs[a], t, r.ids[t], (int)gen.data[t]);
        rollout_free(&r);
        npy_free(&gen);
        free(prompt);
        model_free(&m);
    }
}
END_TEST

// A multimodal Gemma 3 (test/fixtures/gemma3_mm): greedy rollouts equal Gemma3ForConditionalGeneration's
// generate on text; the ids of Config.mm_ids are never produced. To see the mask work, mm_ids is set to the two
// ids greedy decoding picks first: then the first token is the argmax over the other ids, its logprob the
// log-softmax over them, and no completion, greedy or sampled, holds either id.
START_TEST(test_never_image_ids) {
    Model m;
    load(&m, "gemma3_mm", FP8_OFF);
    ck_assert_int_eq(m.cfg.n_mm_ids, 3);
    int *prompt = fixture_prompt("gemma3_mm", 0, 8), plen = 8, V = m.cfg.V;
    char p[1024];
    fixture_path(p, sizeof p, "gemma3_mm/generate.npy");
    Npy gen = npy_read(p);
    uint64_t seeds[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    RolloutConfig rc = {1, (int)gen.n, 0.0f, 1.0f, 0, NULL, 0, 4, 1};
    Rollout r;
    rollout_run(&m, NULL, &rc, 1, (const int *const *)&prompt, &plen, seeds, &r);
    for (int t = 0; t < gen.n; t++) ck_assert_msg(r.ids[t] == (int)gen.data[t], "token %d: %d vs %d", t, r.ids[t], (int)gen.data[t]);
    rollout_free(&r);
    int banned[2] = {(int)gen.data[0], (int)gen.data[1]};
    ck_assert_int_ne(banned[0], banned[1]);
    m.cfg.mm_ids[0] = banned[0], m.cfg.mm_ids[1] = banned[1], m.cfg.n_mm_ids = 2;
    model_forward(&m, NULL, prompt, 1, plen);
    float *lg = (float *)mallocCheck((size_t)plen * V * sizeof(float));
    model_logits(&m, lg);
    const float *z = lg + (size_t)(plen - 1) * V;
    int arg = -1;
    double sum = 0;
    for (int j = 0; j < V; j++) {
        if (j == banned[0] || j == banned[1]) continue;
        if (arg < 0 || z[j] > z[arg]) arg = j;
        sum += exp((double)z[j]);
    }
    rollout_run(&m, NULL, &rc, 1, (const int *const *)&prompt, &plen, seeds, &r);
    ck_assert_int_eq(r.ids[0], arg);
    ck_assert_msg(fabs(r.logp[0] - (z[arg] - log(sum))) < 1e-5, "logp %g vs %g", r.logp[0], z[arg] - log(sum));
    for (int t = 0; t < r.len[0]; t++) ck_assert(r.ids[t] != banned[0] && r.ids[t] != banned[1]);
    rollout_free(&r);
    RolloutConfig rs = {8, 16, 1.0f, 1.0f, 0, NULL, 0, 4, 1};
    rollout_run(&m, NULL, &rs, 1, (const int *const *)&prompt, &plen, seeds, &r);
    for (int s = 0; s < 8; s++)
        for (int t = 0; t < r.len[s]; t++) ck_assert(r.ids[s * 16 + t] != banned[0] && r.ids[s * 16 + t] != banned[1]);
    rollout_free(&r);
    free(lg);
    npy_free(&gen);
    free(prompt);
    model_free(&m);
}
END_TEST

// sampled completions with shared prompt blocks (copy-on-write of the partial block)
// equal those of separately prefilled prompts, token for token and logprob for logprob
START_TEST(test_prefix_sharing_equals_no_sharing) {
    FP8Gran grans[2] = {FP8_OFF, FP8_BLOCK};  // (per-tensor activation scales depend on the batch, so not TENSOR)
    for (int gi = 0; gi < 2; gi++) {
        Model m;
        load(&m, "llama3", grans[gi]);
        int *p0 = fixture_prompt("llama3", 0, 6), *p1 = fixture_prompt("llama3", 1, 11);
        const int *prompts[2] = {p0, p1};
        int plens[2] = {6, 11}, G = 3, S = 6;
        uint64_t seeds[6];
        for (int s = 0; s < S; s++) seeds[s] = 1000 + 77 * s;
        Rollout a, b;
        for (int bs = 4; bs <= 5; bs++) {  // 11 % 4 = 3, 6 % 4 = 2; 5 divides neither
            RolloutConfig rc = {G, 9, 1.0f, 1.0f, 0, NULL, 0, bs, 1};
            rollout_run(&m, NULL, &rc, 2, prompts, plens, seeds, &a);
            rc.share_prefix = 0;
            rollout_run(&m, NULL, &rc, 2, prompts, plens, seeds, &b);
            for (int s = 0; s < S; s++) {
                ck_assert_int_eq(a.len[s], b.len[s]);
                for (int t = 0; t < a.len[s]; t++) {
                    ck_assert_int_eq(a.ids[s * 9 + t], b.ids[s * 9 + t]);
                    ck_assert_msg(a.logp[s * 9 + t] == b.logp[s * 9 + t], "logp differs at %d,%d", s, t);
                }
            }
            // sampling happened: the three completions of a prompt are not all the same
            int differ = 0;
            for (int t = 0; t < 9; t++) differ |= a.ids[0 * 9 + t] != a.ids[1 * 9 + t] || a.ids[1 * 9 + t] != a.ids[2 * 9 + t];
            ck_assert(differ);
            ck_assert(a.kv_bytes < b.kv_bytes);  // sharing holds fewer blocks
            rollout_free(&a);
            rollout_free(&b);
        }
        free(p0);
        free(p1);
        model_free(&m);
    }
}
END_TEST

// a sequence's completion depends only on its prompt and seed, not on the batch around it
START_TEST(test_batch_independence) {
    Model m;
    load(&m, "qwen2", FP8_BLOCK);
    int *p0 = fixture_prompt("qwen2", 0, 5), *p1 = fixture_prompt("qwen2", 1, 13);
    const int *prompts[2] = {p0, p1};
    int plens[2] = {5, 13};
    uint64_t seeds[4] = {11, 12, 13, 14};
    RolloutConfig rc = {2, 7, 0.8f, 0.9f, 20, NULL, 0, 16, 1};
    Rollout both, one;
    rollout_run(&m, NULL, &rc, 2, prompts, plens, seeds, &both);
    rollout_run(&m, NULL, &rc, 1, prompts + 1, plens + 1, seeds + 2, &one);
    for (int s = 0; s < 2; s++) {
        ck_assert_int_eq(one.len[s], both.len[2 + s]);
        for (int t = 0; t < one.len[s]; t++) ck_assert_int_eq(one.ids[s * 7 + t], both.ids[(2 + s) * 7 + t]);
    }
    rollout_free(&both);
    rollout_free(&one);
    free(p0);
    free(p1);
    model_free(&m);
}
END_TEST

// completions end at (and include) EOS; the others are truncated at max_new
START_TEST(test_eos_and_truncation) {
    Model m;
    load(&m, "qwen3", FP8_OFF);
    int *p0 = fixture_prompt("qwen3", 0, 8), plen = 8;
    char p[1024];
    fixture_path(p, sizeof p, "qwen3/generate.npy");
    Npy gen = npy_read(p);
    int eos = (int)gen.data[3];  // the 4th greedy token plays EOS
    uint64_t seed = 1;
    RolloutConfig rc = {1, 8, 0.0f, 1.0f, 0, &eos, 1, 16, 1};
    Rollout r;
    rollout_run(&m, NULL, &rc, 1, (const int *const *)&p0, &plen, &seed, &r);
    int first = 0;
    while ((int)gen.data[first] != eos) first++;
    ck_assert_int_eq(r.len[0], first + 1);
    ck_assert_int_eq(r.ids[first], eos);
    ck_assert_int_eq(r.truncated[0], 0);
    rollout_free(&r);
    rc.max_new = 2;  // stops before reaching it
    rollout_run(&m, NULL, &rc, 1, (const int *const *)&p0, &plen, &seed, &r);
    if (first >= 2) {
        ck_assert_int_eq(r.len[0], 2);
        ck_assert_int_eq(r.truncated[0], 1);
    }
    rollout_free(&r);
    EXPECT_DIE(({ rc.max_new = 200; rollout_run(&m, NULL, &rc, 1, (const int *const *)&p0, &plen, &seed, &r); }), "exceeds max_position_embeddings");
    npy_free(&gen);
    free(p0);
    model_free(&m);
}
END_TEST

// ---- the sampler ----------------------------------------------------------------------

// draw n tokens from one row of logits, each with a fresh RNG state; counts (V)
static void draw(const float *z, int V, float temp, int top_k, float top_p, int n, long *counts, double *logp_of) {
    const Backend *be = backend_cpu();
    int chunk = 1000;
    float *L = (float *)mallocCheck((size_t)chunk * V * sizeof(float)), *lp = (float *)mallocCheck(chunk * sizeof(float));
    int32_t *tok = (int32_t *)mallocCheck(chunk * sizeof(int32_t));
    uint64_t *rng = (uint64_t *)mallocCheck(chunk * sizeof(uint64_t));
    for (int i = 0; i < chunk; i++) memcpy(L + (size_t)i * V, z, V * sizeof(float));
    memset(counts, 0, V * sizeof(long));
    for (int done = 0; done < n; done += chunk) {
        for (int i = 0; i < chunk; i++) rng[i] = 0x1234567ull * (done + i + 1);
        be->sample(tok, lp, L, rng, chunk, V, temp, top_k, top_p);
        for (int i = 0; i < chunk; i++) {
            counts[tok[i]]++;
            logp_of[tok[i]] = lp[i];
        }
    }
    free(L);
    free(lp);
    free(tok);
    free(rng);
}

// chi-square statistic of counts against probabilities q over the tokens with q > 0;
// tokens with q = 0 must never be drawn
static double chi2(const long *counts, const double *q, int V, int n, int *df) {
    double x = 0;
    *df = -1;
    for (int j = 0; j < V; j++) {
        if (q[j] == 0) {
            ck_assert_msg(counts[j] == 0, "token %d drawn %ld times but excluded", j, counts[j]);
            continue;
        }
        double e = q[j] * n;
        x += (counts[j] - e) * (counts[j] - e) / e;
        (*df)++;
    }
    return x;
}

START_TEST(test_sampler_frequencies) {
    enum { V = 10, N = 40000 };
    float z[V] = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.0f, 1.5f, 0.2f, -2.0f, 0.8f};
    long counts[V];
    double lp[V], q[V], p[V];
    float temp = 0.7f;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < V; j++) mx = fmax(mx, z[j] / temp);
    for (int j = 0; j < V; j++) s += exp(z[j] / temp - mx);
    for (int j = 0; j < V; j++) p[j] = exp(z[j] / temp - mx) / s;
    // critical values of chi-square at p = 0.001: df 9: 27.88, df 3: 16.27, df 2: 13.82
    int df;
    draw(z, V, temp, 0, 1.0f, N, counts, lp);
    double x = chi2(counts, p, V, N, &df);
    ck_assert_msg(df == 9 && x < 27.88, "plain sampling: chi2 %g (df %d)", x, df);
    for (int j = 0; j < V; j++) ck_assert_msg(fabs(lp[j] - log(p[j])) < 1e-5, "logp of %d: %g vs %g", j, lp[j], log(p[j]));
    // top-k 4: tokens 3, 6, 0, 9 renormalised
    int keep[4] = {3, 6, 0, 9};
    double m = 0;
    memset(q, 0, sizeof q);
    for (int i = 0; i < 4; i++) m += p[keep[i]];
    for (int i = 0; i < 4; i++) q[keep[i]] = p[keep[i]] / m;
    draw(z, V, temp, 4, 1.0f, N, counts, lp);
    x = chi2(counts, q, V, N, &df);
    ck_assert_msg(df == 3 && x < 16.27, "top-k: chi2 %g (df %d)", x, df);
    // the logprob stays that of the untruncated distribution (what the trainer computes)
    ck_assert(fabs(lp[3] - log(p[3])) < 1e-5);
    // top-p: the smallest set of most likely tokens with mass >= top_p
    int order[V];
    for (int j = 0; j < V; j++) order[j] = j;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (p[order[j]] > p[order[i]]) { int t = order[i]; order[i] = order[j]; order[j] = t; }
    double c = 0;
    int k = 0;
    while (c < 0.6) c += p[order[k++]];
    memset(q, 0, sizeof q);
    for (int i = 0; i < k; i++) q[order[i]] = p[order[i]] / c;
    draw(z, V, temp, 0, 0.6f, N, counts, lp);
    x = chi2(counts, q, V, N, &df);
    ck_assert_msg(df == k - 1 && x < (k - 1 == 2 ? 13.82 : k - 1 == 3 ? 16.27 : 18.47), "top-p: chi2 %g (df %d)", x, df);
    // greedy: the argmax, logprob at temperature 1
    draw(z, V, 0.0f, 0, 1.0f, 1000, counts, lp);
    ck_assert_int_eq(counts[3], 1000);
}
END_TEST

// The time-shared arena: the KV cache of a rollout and the activations of an update use the same
// bytes. A rollout after an update (whose activations overwrote the cache's bytes) must equal the
// rollout of a fresh model without an arena holding the same updated adapter: nothing of the old
// cache or of the activations leaks into it.
START_TEST(test_arena_handover) {
    Model a, b;
    load(&a, "qwen3", FP8_OFF);
    load(&b, "qwen3", FP8_OFF);
    model_arena_init(&a, (size_t)64 << 20);
    LoRA *la = lora_create(&a, 4, 8.0f, (1u << LIN_COUNT) - 1, 5, 0), *lb = lora_create(&b, 4, 8.0f, (1u << LIN_COUNT) - 1, 5, 0);
    int *pr0 = fixture_prompt("qwen3", 0, 7), *pr1 = fixture_prompt("qwen3", 1, 13), plens[2] = {7, 13};
    const int *prompts[2] = {pr0, pr1};
    uint64_t seeds[6] = {1, 2, 3, 4, 5, 6}, seeds2[6] = {11, 12, 13, 14, 15, 16};
    RolloutConfig rc = {3, 12, 1.0f, 1.0f, 0, NULL, 0, 4, 1};
    Rollout r1, r2, rb;
    rollout_run(&a, la, &rc, 2, prompts, plens, seeds, &r1);
    ck_assert(a.arena.peak_kv > 0 && a.arena.kv_bytes == 0);  // the cache was in the arena and is released
    // an update: 6 sequences of 25 tokens, forward, logprobs, backward, one AdamW step (B leaves 0)
    int B = 6, T = 25, ids[150], tg[150];
    double dl[150], lp[150];
    int *pool = fixture_prompt("qwen3", 0, 24);
    for (int i = 0; i < B * T; i++) {
        ids[i] = pool[(i * 7) % 24];
        tg[i] = i % T == T - 1 ? -1 : pool[(i * 7 + 7) % 24];
        dl[i] = tg[i] < 0 ? 0 : ((i % 3) - 1) * 0.1;
    }
    model_forward(&a, la, ids, B, T);
    ck_assert_ptr_eq(a.acts.mem, a.arena.mem);  // the activations live in the arena ...
    ck_assert_msg(a.arena.peak_acts + a.arena.peak_kv > a.arena.bytes,  // ... over the bytes the cache used
                  "arena %zu bytes, KV %zu + activations %zu do not overlap", a.arena.bytes, a.arena.peak_kv, a.arena.peak_acts);
    model_logprobs(&a, tg, 1.0f, lp);
    model_backward(&a, la, dl);
    lora_adamw_step(la, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f);
    rollout_run(&a, la, &rc, 2, prompts, plens, seeds2, &r2);
    // the fresh model gets the updated adapter
    memcpy(lb->params, la->params, la->n * sizeof(float));
    rollout_run(&b, lb, &rc, 2, prompts, plens, seeds2, &rb);
    int S = 6, differ1 = 0;
    for (int s = 0; s < S; s++) {
        ck_assert_int_eq(r2.len[s], rb.len[s]);
        for (int t = 0; t < r2.len[s]; t++) {
            ck_assert_int_eq(r2.ids[s * 12 + t], rb.ids[s * 12 + t]);
            ck_assert(r2.logp[s * 12 + t] == rb.logp[s * 12 + t]);
        }
        for (int t = 0; t < 12; t++) differ1 += r1.ids[s * 12 + t] != r2.ids[s * 12 + t];
    }
    ck_assert(differ1 > 0);  // other seeds and an updated adapter: a different rollout
    printf("arena hand-over: arena %.2f MiB, KV %.2f MiB and activations %.2f MiB at most; rollout after the update "
           "equals a fresh model's\n", a.arena.bytes / 1048576.0, a.arena.peak_kv / 1048576.0, a.arena.peak_acts / 1048576.0);
    rollout_free(&r1), rollout_free(&r2), rollout_free(&rb);
    lora_free(la), lora_free(lb);
    free(pr0), free(pr1), free(pool);
    model_free(&a), model_free(&b);
}
END_TEST

static int lens_differ_check(const Rollout *r) {
    for (int s = 1; s < r->S; s++)
        if (r->len[s] != r->len[0]) return 1;
    return 0;
}

// Continuous batching: with an arena that holds the blocks of about two prompts' groups at a time,
// prompts wait and are prefilled as earlier completions finish; the CPU backend computes each row on
// its own, so the result must equal, token for token and logprob for logprob, a rollout with
// room for all (with and without prefix sharing; EOS tokens make the lengths differ)
// The decode step adds the adapters of q|k|v and of gate|up as one group each (stacked A's, B's on a
// block diagonal: lora_group_act), from the act copies; the trainer's forward adds each projection's own
// adapter from the masters. On the CPU act == hp, so both compute the same products, in other orders
// (the KV cache's attention, the group's zero blocks): each sampled token's logprob must equal the
// teacher-forced logprob of the same sequence to fp32 rounding (1e-5 at |logp| ~ 5: ~40 ulps, over a
// dozen decode steps of a 2-layer model; measured 1.7e-6). All seven projections adapted, then some of each group missing.
START_TEST(test_lora_groups) {
    unsigned sets[2] = {(1u << LIN_COUNT) - 1, (1u << LIN_Q) | (1u << LIN_V) | (1u << LIN_UP) | (1u << LIN_DOWN)};
    for (int si = 0; si < 2; si++) {
        Model a;
        load(&a, "qwen3", FP8_OFF);
        ck_assert_msg(a.w.layers[0].qkv.rows && a.w.layers[0].gateup.rows, "the fixture has no fused q|k|v / gate|up views");
        LoRA *la = lora_create(&a, 4, 8.0f, sets[si], 5, 0);
        // B = 0 after lora_create (the adapter adds nothing): random A and B instead
        double *h = (double *)mallocCheck(la->n * sizeof(double));
        Rng rng = rng_make(77 + si);
        for (size_t i = 0; i < la->n; i++) h[i] = 0.2 * (2.0 * rng_uniform_d(&rng) - 1.0);
        a.be->upload_convert(la->params, a.be->hp, h, DT_F64, la->n);
        free(h);
        int *pr0 = fixture_prompt("qwen3", 0, 7), *pr1 = fixture_prompt("qwen3", 1, 13), plens[2] = {7, 13};
        const int *prompts[2] = {pr0, pr1};
        uint64_t seeds[6] = {1, 2, 3, 4, 5, 6};
        RolloutConfig rc = {3, 12, 1.0f, 1.0f, 0, NULL, 0, 4, 1};
        Rollout ra;
        rollout_run(&a, la, &rc, 2, prompts, plens, seeds, &ra);
        ck_assert_msg(la->gB && la->ld[LIN_Q] == (si ? 8 : 12) && la->ld[LIN_GATE] == (si ? 4 : 8), "group copies: R %d, %d",
                      la->ld[LIN_Q], la->ld[LIN_GATE]);
        double worst = 0;
        for (int s = 0; s < 6; s++) {
            int pl = plens[s / 3], T = pl + ra.len[s];
            int *ids = (int *)mallocCheck(T * sizeof(int)), *tg = (int *)mallocCheck(T * sizeof(int));
            double *lp = (double *)mallocCheck(T * sizeof(double));
            for (int t = 0; t < T; t++) {
                ids[t] = t < pl ? prompts[s / 3][t] : ra.ids[s * 12 + t - pl];
                tg[t] = t + 1 >= pl && t + 1 < T ? ra.ids[s * 12 + t + 1 - pl] : -1;
            }
            model_forward(&a, la, ids, 1, T);
            model_logprobs(&a, tg, 1.0f, lp);
            for (int t = 0; t < ra.len[s]; t++) {
                double d = fabs((double)ra.logp[s * 12 + t] - lp[pl - 1 + t]);
                if (d > worst) worst = d;
                ck_assert_msg(d <= 1e-5, "targets %x: logp[%d][%d] %.9g (decode, grouped) vs %.9g (forward)", sets[si], s, t,
                              ra.logp[s * 12 + t], lp[pl - 1 + t]);
            }
            free(ids), free(tg), free(lp);
        }
        printf("LoRA groups (targets %x): decode logprobs equal the forward's within %.2g\n", sets[si], worst);
        rollout_free(&ra);
        lora_free(la);
        free(pr0), free(pr1);
        model_free(&a);
    }
}
END_TEST

START_TEST(test_continuous_batching) {
    int P = 5, G = 3, plens[5] = {7, 13, 5, 9, 11};
    int *pr[5];
    for (int p = 0; p < P; p++) pr[p] = fixture_prompt("qwen3", p % 2, plens[p]);
    uint64_t seeds[15];
    for (int s = 0; s < 15; s++) seeds[s] = 100 + s;
    int eos[32];  // a tenth of the fixture's 320-token vocabulary: completions end early, at different lengths
    for (int i = 0; i < 32; i++) eos[i] = 7 + 10 * i;
    for (int share = 0; share < 2; share++) {
        RolloutConfig rc = {G, 10, 1.0f, 1.0f, 0, eos, 32, 4, share};
        Model a, b;
        load(&a, "qwen3", FP8_OFF);
        load(&b, "qwen3", FP8_OFF);
        // room for 30 (45) blocks beside the prefill of one group (rollout.c: a pool that cannot hold
        // every group prefills one at a time)
        size_t cap = kvcache_bytes(&b, share ? 30 : 45, 4) + model_acts_bytes(&b, share ? 1 : G, 13, ACTS_FORWARD_ONLY);
        model_arena_init(&b, cap);
        Rollout ra, rb;
        rollout_run(&a, NULL, &rc, P, (const int *const *)pr, plens, seeds, &ra);
        rollout_run(&b, NULL, &rc, P, (const int *const *)pr, plens, seeds, &rb);
        ck_assert_msg(rb.admissions > 0, "the small arena should have made prompts wait");
        ck_assert(lens_differ_check(&ra));
        ck_assert(rb.kv_bytes < ra.kv_bytes);
        int lens_differ = 0;
        for (int s = 0; s < P * G; s++) {
            ck_assert_int_eq(ra.len[s], rb.len[s]);
            ck_assert_int_eq(ra.truncated[s], rb.truncated[s]);
            lens_differ |= ra.len[s] != ra.len[0];
            for (int t = 0; t < ra.len[s]; t++) {
                ck_assert_int_eq(ra.ids[s * 10 + t], rb.ids[s * 10 + t]);
                ck_assert(ra.logp[s * 10 + t] == rb.logp[s * 10 + t]);
            }
        }
        printf("continuous batching (share %d): KV %.1f KiB instead of %.1f, %d later admissions, lengths %s; equal to "
               "the rollout with room for all\n", share, rb.kv_bytes / 1024.0, ra.kv_bytes / 1024.0, rb.admissions,
               lens_differ ? "vary" : "all equal");
        rollout_free(&ra), rollout_free(&rb);
        model_free(&a), model_free(&b);
    }
    for (int p = 0; p < P; p++) free(pr[p]);
}
END_TEST

// The FP8 KV cache (--kv_cache_dtype fp8). kv_write's codes and scales are those of fp8.h's per-row
// quantization of the (token, head) rows (fp8_cpu.c, tested against PyTorch in test_fp8.c), bit
// for bit. Then decode: the logits of a KV-cache decode with the FP8 cache against the bf16-free
// (fp32 here) cache on the same tokens: E4M3 keeps 3 mantissa bits (relative rounding <= 2^-4 per
// element), attention averages the rounded values, so the logits move by a few percent at most:
// bound 2^-3 relative L2 (measured below).
START_TEST(test_fp8_kv_cache) {
    const Backend *be = backend_cpu();
    int N = 5, KVH = 2, HD = 32, row = KVH * HD;
    Rng r = rng_make(9);
    float *k = (float *)mallocCheck(N * row * sizeof(float)), *v = (float *)mallocCheck(N * row * sizeof(float));
    for (int i = 0; i < N * row; i++) k[i] = (rng_uniform(&r) - 0.5f) * 8, v[i] = (rng_uniform(&r) - 0.5f) * (i % 7 + 1);
    for (int d = 0; d < HD; d++) k[row + HD + d] = 0;  // an all-zero head: scale 1, codes 0
    int32_t slots[5] = {3, -1, 0, 7, 5};
    uint8_t kc[8 * 64], vc[8 * 64];
    float ks[16], vs[16];
    be->kv_write(kc, vc, ks, vs, k, v, slots, N, KVH, HD);
    FP8Tensor t;
    fp8_tensor_alloc_cpu(&t, N * KVH, HD, FP8_ROW, FP8_E4M3, 1);
    for (int w = 0; w < 2; w++) {
        fp8_quantize_cpu(&t, w ? v : k, 0);
        for (int n = 0; n < N; n++) {
            if (slots[n] < 0) continue;
            for (int h = 0; h < KVH; h++) {
                ck_assert(memcmp((w ? vc : kc) + ((size_t)slots[n] * KVH + h) * HD, t.data + (size_t)(n * KVH + h) * HD, HD) == 0);
                ck_assert((w ? vs : ks)[slots[n] * KVH + h] == t.scale[n * KVH + h]);
            }
        }
    }
    fp8_tensor_free_cpu(&t);
    free(k), free(v);
    // decode logits with the FP8 cache vs the plain one, teacher-forced on the same tokens
    Model m;
    load(&m, "qwen3", FP8_OFF);
    int *ids = fixture_prompt("qwen3", 0, 20), T = 20, V = m.cfg.V, BS = 4, MB = 5;
    int table[5] = {4, 0, 3, 1, 2}, sl[20];
    for (int i = 0; i < T; i++) sl[i] = table[i / BS] * BS + i % BS;
    double num = 0, den = 0;
    float *lg[2];
    for (int f = 0; f < 2; f++) {
        m.kv_fp8 = f;
        KVCache kv;
        kvcache_alloc(&kv, &m, MB, BS);
        lg[f] = (float *)mallocCheck((size_t)T * V * sizeof(float));
        int P = 6;
        model_prefill(&m, NULL, &kv, ids, &P, sl, 1, P, lg[f] + (size_t)(P - 1) * V);
        for (int t = P; t < T; t++) model_decode(&m, NULL, &kv, &ids[t], &t, &sl[t], table, 1, MB, lg[f] + (size_t)t * V);
        kvcache_free_model(&kv, &m);
    }
    for (int t = 5; t < T; t++)
        for (int j = 0; j < V; j++) {
            double d = lg[1][(size_t)t * V + j] - lg[0][(size_t)t * V + j];
            num += d * d, den += (double)lg[0][(size_t)t * V + j] * lg[0][(size_t)t * V + j];
        }
    printf("FP8 KV cache: decode logits vs the fp32 cache: relative L2 %.3e (bound 2^-3)\n", sqrt(num / den));
    ck_assert(sqrt(num / den) < 0.125 && sqrt(num / den) > 0);
    free(lg[0]), free(lg[1]), free(ids);
    model_free(&m);
}
END_TEST

// the arena's budget is a hard limit with a message that names the option
START_TEST(test_arena_budget) {
    Model m;
    load(&m, "qwen3", FP8_OFF);
    model_arena_init(&m, 4096);
    int *pr = fixture_prompt("qwen3", 0, 13), plen = 13;
    uint64_t seed = 1;
    RolloutConfig rc = {2, 8, 1.0f, 1.0f, 0, NULL, 0, 4, 1};
    Rollout r;
    EXPECT_DIE(rollout_run(&m, NULL, &rc, 1, (const int *const *)&pr, &plen, &seed, &r), "--gpu_memory_utilization");
    free(pr);
    model_free(&m);
}
END_TEST

static Suite *rollout_suite(void) {
    Suite *s = suite_create("rollout");
    TCase *tc = tcase_create("rollout");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_greedy_matches_transformers);
    tcase_add_test(tc, test_prefix_sharing_equals_no_sharing);
    tcase_add_test(tc, test_batch_independence);
    tcase_add_test(tc, test_eos_and_truncation);
    tcase_add_test(tc, test_sampler_frequencies);
    tcase_add_test(tc, test_arena_handover);
    tcase_add_test(tc, test_lora_groups);
    tcase_add_test(tc, test_arena_budget);
    tcase_add_test(tc, test_continuous_batching);
    tcase_add_test(tc, test_fp8_kv_cache);
    tcase_add_test(tc, test_never_image_ids);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(rollout_suite()); }
