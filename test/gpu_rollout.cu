// test/gpu_rollout.cu: GPU suite for the rollout engine (rollout.c) on the CUDA backend, against
// the CPU reference backend ("cpu", fp32) and against exact probabilities.
//   test_greedy_cpu_vs_gpu       greedy rollouts of the fixtures (qwen3, qwen2, llama3; FP8 off and
//                                block) on both backends: the same tokens, or a flip explained by rounding
//   test_prefix_sharing_gpu      shared prompt blocks vs one prefill per completion, CUDA graphs on vs
//                                off, a rerun, and the CPU's sampled rollout with the same seeds
//   test_sampler_chi_square_gpu  the sample op's frequencies vs the truncated softmax (chi-square),
//                                excluded tokens never drawn, the returned logprobs, the RNG's advance
// Run on a GPU: make test-gpu (CK_FORK=no: a CUDA context does not survive fork).
//
// The rule behind every "explained" divergence below. Two computations of the same logits that
// differ by rounding (bf16 activations, FP8 codes that land on the other side of an E4M3 boundary)
// can disagree about a token only where the choice is within that rounding of a boundary. The
// rounding at a position is measured there, on the GPU's teacher-forced logits against the CPU's
// (fp32, the reference) for the same prefix: eps = max_j |z_gpu[j] - z_cpu[j]| for greedy choices
// and logprobs, TV = the total variation distance of their softmaxes for sampled choices. A GPU
// decode step is the same chain of roundings in other kernels, so its logits are taken to lie
// within 2 eps (2 TV) of the GPU's teacher-forced ones (one rounding chain from the CPU each, and
// the triangle inequality). Measured on the H100 with a correct engine: greedy flips use at most
// 0.35 of their allowance, sampled ones 0.16 (66 divergences), sampled logprobs 0.27 (of 4 eps).
#include <check.h>
#include <math.h>

#include "lora.h"
#include "model.h"
#include "rollout.h"
#include "testutil.h"
#include "core/backend.h"

static const Backend *GPU;  // CUDA
static const Backend *CPU;  // fp32 reference backend

static const char *ARCHS[3] = {"qwen3", "qwen2", "llama3"};
static const FP8Gran GRANS[2] = {FP8_OFF, FP8_BLOCK};
// test_models' (test/gpu_backend.cu) allowance for GPU vs CPU logits: 2^-5 relative L2 (bf16
// roundings, ~35 of them through a 2-layer model), plus for FP8 the CPU's own FP8-vs-fp32 rel L2
#define TOL_LOGITS 0x1p-5

static void load(Model *m, const char *arch, const Backend *be, FP8Gran g) {
    char p[1024];
    fixture_path(p, sizeof p, arch);
    ModelOptions o;
    memset(&o, 0, sizeof o);
    o.gran = g;
    model_load(m, p, be, &o);
}

// the fixture's two rows of 24 random ids end to end: 48 ids to cut prompts from
static int *token_pool(const char *arch) {
    char p[1024], rel[256];
    snprintf(rel, sizeof rel, "%s/tokens.npy", arch);
    fixture_path(p, sizeof p, rel);
    Npy tk = npy_read(p);
    int *ids = (int *)mallocCheck(tk.n * sizeof(int));
    for (long i = 0; i < tk.n; i++) ids[i] = (int)tk.data[i];
    npy_free(&tk);
    return ids;
}

// Teacher forcing: the logits (n, V) of the n positions that predict comp[0..n-1] after the
// prompt, from one forward over prompt + comp[0..n-2]
static float *tf_logits(Model *m, const int *prompt, int plen, const int *comp, int n) {
    int T = plen + n - 1, V = m->cfg.V;
    int *ids = (int *)mallocCheck(T * sizeof(int));
    memcpy(ids, prompt, plen * sizeof(int));
    memcpy(ids + plen, comp, (n - 1) * sizeof(int));
    float *all = (float *)mallocCheck((size_t)T * V * sizeof(float)), *z = (float *)mallocCheck((size_t)n * V * sizeof(float));
    model_forward(m, NULL, ids, 1, T);
    model_logits(m, all);
    memcpy(z, all + (size_t)(plen - 1) * V, (size_t)n * V * sizeof(float));
    free(ids);
    free(all);
    return z;
}

static double max_abs_diff_f(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

// ---- greedy: CPU vs GPU ----------------------------------------------------------------------

enum { NP1 = 3, NEW1 = 16 };
static const int PLEN1[NP1] = {5, 12, 20}, OFF1[NP1] = {0, 7, 26};

// Greedy decoding takes the argmax, so the GPU may take another token only where the CPU's logit
// of its own token a exceeds that of the GPU's token b by at most the rounding of the two:
// z_cpu[a] - z_cpu[b] <= |dz[a]| + |dz[b]| <= 2 max|dz| (at the first disagreement; after it the
// prefixes differ and nothing is compared). The logits over the CPU's whole sequences are checked
// against test_models' allowance. So that a broken decode cannot hide behind near ties, most
// positions must come before a first flip: 75% with FP8 off (bf16 rounding only; measured on the
// H100: 134 of 144). With FP8 block the GPU is another FP8 computation, not a rounding of the CPU's:
// a bf16-sized difference moves an activation across an E4M3 rounding boundary, and the logits
// differ by ~0.65x the FP8 quantization error itself (max |dz| 0.15-0.65 here), while top-2 gaps in
// these random tiny models are often < 0.1: measured 71 of 144; required 25%, a guard against
// wholesale breakage only (every flip is still checked).
START_TEST(test_greedy_cpu_vs_gpu) {
    long matched[2] = {0, 0}, total[2] = {0, 0};  // per granularity
    for (int a = 0; a < 3; a++) {
        int *pool = token_pool(ARCHS[a]);
        const int *prompts[NP1];
        for (int p = 0; p < NP1; p++) prompts[p] = pool + OFF1[p];
        Model m0;  // fp32 weights on the CPU: FP8's own effect on the logits
        load(&m0, ARCHS[a], CPU, FP8_OFF);
        for (int gi = 0; gi < 2; gi++) {
            const char *gn = fp8_gran_name(GRANS[gi]);
            Model mc, mg;
            load(&mc, ARCHS[a], CPU, GRANS[gi]);
            load(&mg, ARCHS[a], GPU, GRANS[gi]);
            int V = mc.cfg.V;
            uint64_t seeds[NP1] = {1, 2, 3};  // greedy draws nothing
            RolloutConfig rc = {1, NEW1, 0.0f, 1.0f, 0, NULL, 0, 16, 1};
            Rollout rcpu, rgpu;
            rollout_run(&mc, NULL, &rc, NP1, prompts, PLEN1, seeds, &rcpu);
            rollout_run(&mg, NULL, &rc, NP1, prompts, PLEN1, seeds, &rgpu);
            double num = 0, den = 0, qnum = 0, qden = 0, lperr = 0, lpmax = 0;
            long m_here = 0;
            for (int p = 0; p < NP1; p++) {
                const int *tc = rcpu.ids + p * NEW1, *tg = rgpu.ids + p * NEW1;
                ck_assert_msg(rcpu.len[p] == NEW1 && rgpu.len[p] == NEW1, "no EOS is set: %d and %d tokens", rcpu.len[p], rgpu.len[p]);
                float *zc = tf_logits(&mc, prompts[p], PLEN1[p], tc, NEW1), *zg = tf_logits(&mg, prompts[p], PLEN1[p], tc, NEW1);
                float *z0 = gi ? tf_logits(&m0, prompts[p], PLEN1[p], tc, NEW1) : NULL;
                for (int i = 0; i < NEW1 * V; i++) {
                    num += ((double)zg[i] - zc[i]) * ((double)zg[i] - zc[i]);
                    den += (double)zc[i] * zc[i];
                    if (z0) qnum += ((double)zc[i] - z0[i]) * ((double)zc[i] - z0[i]), qden += (double)z0[i] * z0[i];
                }
                int k = 0;
                while (k < NEW1 && tc[k] == tg[k]) k++;
                for (int t = 0; t < k; t++) {  // greedy logprobs (temperature 1) of the shared tokens
                    lperr = fmax(lperr, fabs(rgpu.logp[p * NEW1 + t] - rcpu.logp[p * NEW1 + t]));
                    lpmax = fmax(lpmax, fabs(rcpu.logp[p * NEW1 + t]));
                }
                m_here += k;
                if (k < NEW1) {
                    const float *c = zc + (size_t)k * V, *g = zg + (size_t)k * V;
                    int ta = tc[k], tb = tg[k], t1 = 0, t2 = -1;
                    for (int j = 1; j < V; j++)
                        if (c[j] > c[t1]) t2 = t1, t1 = j;
                        else if (t2 < 0 || c[j] > c[t2]) t2 = j;
                    double d = max_abs_diff_f(g, c, V), gap = (double)c[ta] - c[tb];
                    printf("  greedy %-6s %-5s prompt %2d: first flip at token %2d (cpu %d, gpu %d): cpu gap %.4f "
                           "(top-2 margin %.4f) vs 2 max|dz| %.4f\n", ARCHS[a], gn, PLEN1[p], k, ta, tb, gap, c[t1] - c[t2], 2 * d);
                    ck_assert_msg(gap <= 2 * d, "%s %s prompt %d token %d: cpu prefers %d over the gpu's %d by %g, more than "
                                  "2 max|z_gpu - z_cpu| = %g", ARCHS[a], gn, PLEN1[p], k, ta, tb, gap, 2 * d);
                }
                free(zc);
                free(zg);
                free(z0);
            }
            double e = sqrt(num / den), q = gi ? sqrt(qnum / qden) : 0, tol = TOL_LOGITS + q;
            printf("  greedy %-6s %-5s %2ld of %d tokens before a first flip; teacher-forced logits rel L2 %.4f "
                   "(tol %.4f = 2^-5 + FP8 effect %.4f); logp max |diff| %.3g (tol %.3g)\n", ARCHS[a], gn, m_here,
                   NP1 * NEW1, e, tol, q, lperr, tol * (1 + lpmax));
            ck_assert_msg(e <= tol, "%s %s: teacher-forced logits rel L2 %g > %g", ARCHS[a], gn, e, tol);
            // test_models' logprob allowance: the logits' relative one, times 1 + max |logp|
            ck_assert_msg(lperr <= tol * (1 + lpmax), "%s %s: greedy logprobs differ by %g", ARCHS[a], gn, lperr);
            matched[gi] += m_here;
            total[gi] += NP1 * NEW1;
            rollout_free(&rcpu);
            rollout_free(&rgpu);
            model_free(&mc);
            model_free(&mg);
        }
        model_free(&m0);
        free(pool);
    }
    for (int gi = 0; gi < 2; gi++)
        printf("  greedy %-5s: %ld of %ld tokens (%.1f%%) before a first flip\n", fp8_gran_name(GRANS[gi]), matched[gi],
               total[gi], 100.0 * matched[gi] / total[gi]);
    ck_assert_msg(matched[0] >= 0.75 * total[0], "off: only %ld of %ld greedy tokens before a first flip", matched[0], total[0]);
    ck_assert_msg(matched[1] >= 0.25 * total[1], "block: only %ld of %ld greedy tokens before a first flip", matched[1], total[1]);
}
END_TEST

// ---- prefix sharing, graphs, reruns: GPU vs GPU (and vs the CPU) -------------------------------

enum { NP2 = 3, G2 = 4, S2 = NP2 * G2, NEW2 = 24 };
// 21 and 37 end inside a 16-token block (copy-on-write of the partial block), 32 on a boundary
static const int PLEN2[NP2] = {21, 37, 32}, OFF2[NP2] = {0, 11, 16};

// Two rollouts of the same prompts and seeds (plain sampling at temperature T) that ran different
// batch shapes. Whether they are equal bit for bit is a property of the kernels, not of the engine:
// with sharing the prefill is one (P, Tmax) batch, without it (P*G, Tmax); with graphs a decode step
// of S rows is padded to the next power of two. Every op but the GEMMs is row-wise in a fixed order,
// but cuBLAS's heuristic may pick another kernel (tile, split-K) for another M, which changes the
// summation order of a row. On the H100 every pair below is bit-identical (measured); elsewhere it
// need not be, so bit-identity is reported, not required, and where a completion diverges the
// divergence must be a rounding one (see the top of the file):
//   - before it, |logp_A - logp_B| <= 4 eps / T at each position (logp moves by <= 2 max|dz| / T,
//     and the two runs' logits differ by <= 2 eps);
//   - at it, both runs drew the same u (splitmix64 state seeds[s], advanced once per token); in id
//     order (plain sampling) the token is the first j whose CDF exceeds u, so if one run took a and
//     the other b > a, then CDF_B(a) <= u < CDF_A(a): u lies within the larger CDF change of the two
//     runs from the teacher-forced CDF(a). A CDF value moves by at most the total variation distance
//     TV of the two distributions; TV(GPU tf, CPU tf) is measured at the position (a sum over the
//     vocabulary, so it concentrates: unlike max |dz| it is a fair scale of the next such distance)
//     and each run is within ~2 such roundings of the GPU's teacher-forced logits. Allowed: 2 TV.
//     (Between CPU and GPU, 320 CDF boundaries each moved by ~1e-3 make a flip every few tokens;
//     2 TV is 1.5e-2 to 3.5e-2 with FP8 off, ~0.1 with block, so a random u, as a decode bug would
//     give, lands within it of the CDF value 3-7% (20%) of the time.)
// min_frac: the least share of positions that must come before a divergence.
static void cmp_runs(const char *what, Model *mg, Model *mc, const Rollout *A, const Rollout *B, const int *const *prompts,
                     const uint64_t *seeds, float T, double min_frac) {
    int S = A->S, NEW = A->max_new, V = mg->cfg.V, nbit = 0, ndiv = 0;
    long matched = 0;
    double worst_lp = 0;  // worst |dlogp| / allowance
    for (int s = 0; s < S; s++) {
        int p = s / G2;
        ck_assert_msg(A->len[s] == NEW && B->len[s] == NEW, "%s: no EOS is set, lengths %d %d", what, A->len[s], B->len[s]);
        const int *ia = A->ids + (size_t)s * NEW, *ib = B->ids + (size_t)s * NEW;
        const double *la = A->logp + (size_t)s * NEW, *lb = B->logp + (size_t)s * NEW;
        if (!memcmp(ia, ib, NEW * sizeof(int)) && !memcmp(la, lb, NEW * sizeof(double))) {
            nbit++;
            matched += NEW;
            continue;
        }
        int k = 0;
        while (k < NEW && ia[k] == ib[k]) k++;
        matched += k;
        int n = k < NEW ? k + 1 : NEW;
        float *zg = tf_logits(mg, prompts[p], PLEN2[p], ia, n), *zc = tf_logits(mc, prompts[p], PLEN2[p], ia, n);
        for (int t = 0; t < k; t++) {
            double eps = max_abs_diff_f(zg + (size_t)t * V, zc + (size_t)t * V, V), d = fabs(la[t] - lb[t]);
            worst_lp = fmax(worst_lp, d / (4 * eps / T));
            ck_assert_msg(d <= 4 * eps / T, "%s: sequence %d token %d: logp %.6f vs %.6f, more than 4 eps / T = %g apart", what,
                          s, t, la[t], lb[t], 4 * eps / T);
        }
        if (k < NEW) {
            ndiv++;
            Rng r = rng_make(seeds[s]);
            double u = 0;
            for (int i = 0; i <= k; i++) u = rng_uniform_d(&r);
            const float *g = zg + (size_t)k * V, *c = zc + (size_t)k * V;
            int lo = ia[k] < ib[k] ? ia[k] : ib[k];
            double xg = -INFINITY, xc = -INFINITY, sg = 0, sc = 0, cdf = 0, tv = 0;
            for (int j = 0; j < V; j++) xg = fmax(xg, g[j] / (double)T), xc = fmax(xc, c[j] / (double)T);
            for (int j = 0; j < V; j++) sg += exp(g[j] / (double)T - xg), sc += exp(c[j] / (double)T - xc);
            for (int j = 0; j < V; j++) {
                double pg = exp(g[j] / (double)T - xg) / sg, pc = exp(c[j] / (double)T - xc) / sc;
                if (j <= lo) cdf += pg;
                tv += 0.5 * fabs(pg - pc);
            }
            printf("  %-26s seq %2d diverges at token %2d (%3d vs %3d): |u - CDF(%3d)| %.2e, allowed 2 TV %.2e\n", what, s, k,
                   ia[k], ib[k], lo, fabs(u - cdf), 2 * tv);
            ck_assert_msg(fabs(u - cdf) <= 2 * tv, "%s: sequence %d token %d (%d vs %d): u %.6f is %.3g from CDF %.6f, beyond "
                          "what rounding (2 TV = %.3g) explains", what, s, k, ia[k], ib[k], u, fabs(u - cdf), cdf, 2 * tv);
        }
        free(zg);
        free(zc);
    }
    printf("  %-34s %2d of %d completions bit-identical, %d diverge (all explained); %ld of %d tokens before a divergence"
           "; worst logp diff / allowance %.3f\n", what, nbit, S, ndiv, matched, S * NEW, worst_lp);
    ck_assert_msg(matched >= min_frac * S * NEW, "%s: only %ld of %d tokens before a divergence", what, matched, S * NEW);
}

static void same_bits(const char *what, const Rollout *A, const Rollout *B) {
    size_t n = (size_t)A->S * A->max_new;
    ck_assert_msg(!memcmp(A->len, B->len, A->S * sizeof(int)) && !memcmp(A->ids, B->ids, n * sizeof(int)) &&
                  !memcmp(A->logp, B->logp, n * sizeof(double)), "%s: not bit-identical", what);
    printf("  %-34s bit-identical\n", what);
}

START_TEST(test_prefix_sharing_gpu) {
    uint64_t seeds[S2];
    Rng sr = rng_make(4242);
    for (int s = 0; s < S2; s++) seeds[s] = rng_u64(&sr);
    for (int a = 0; a < 3; a++) {
        int *pool = token_pool(ARCHS[a]);
        const int *prompts[NP2];
        for (int p = 0; p < NP2; p++) prompts[p] = pool + OFF2[p];
        for (int gi = 0; gi < 2; gi++) {
            Model mc, mg;
            load(&mc, ARCHS[a], CPU, GRANS[gi]);
            load(&mg, ARCHS[a], GPU, GRANS[gi]);
            printf("  -- %s %s\n", ARCHS[a], fp8_gran_name(GRANS[gi]));
            RolloutConfig rc = {G2, NEW2, 1.0f, 1.0f, 0, NULL, 0, 16, 1};
            Rollout sh, nosh, sh2, nog, cpu;
            // The order matters: the larger no-share KV cache first, so that the share run's smaller
            // cache tends to be allocated where it was (the same address, another layout: more
            // blocks per layer, so another layer stride and V base). A decode graph replayed for
            // another cache than it was captured with shows up as a divergence at the first decode
            // step (token 1) of every completion.
            rc.share_prefix = 0;
            rollout_run(&mg, NULL, &rc, NP2, prompts, PLEN2, seeds, &nosh);
            rc.share_prefix = 1;
            rollout_run(&mg, NULL, &rc, NP2, prompts, PLEN2, seeds, &sh);
            mg.no_graphs = 1;
            rollout_run(&mg, NULL, &rc, NP2, prompts, PLEN2, seeds, &nog);
            mg.no_graphs = 0;
            // the same rollout again, after others with other buffers and sizes: the same kernels on
            // the same shapes must repeat bit for bit
            rollout_run(&mg, NULL, &rc, NP2, prompts, PLEN2, seeds, &sh2);
            rollout_run(&mc, NULL, &rc, NP2, prompts, PLEN2, seeds, &cpu);
            // sampling happened (the G completions of a prompt are not all alike), sharing held fewer blocks
            for (int p = 0; p < NP2; p++) {
                int differ = 0;
                for (int g = 1; g < G2; g++)
                    differ |= memcmp(sh.ids + (size_t)(p * G2) * NEW2, sh.ids + (size_t)(p * G2 + g) * NEW2, NEW2 * sizeof(int)) != 0;
                ck_assert_msg(differ, "prompt %d: all %d sampled completions are the same", p, G2);
            }
            ck_assert_msg(sh.kv_bytes < nosh.kv_bytes, "sharing holds %zu KV bytes, not sharing %zu", sh.kv_bytes, nosh.kv_bytes);
            cmp_runs("share vs no share", &mg, &mc, &sh, &nosh, prompts, seeds, rc.temperature, 0.75);
            cmp_runs("graphs on vs off", &mg, &mc, &sh, &nog, prompts, seeds, rc.temperature, 0.75);
            same_bits("rerun (share, graphs)", &sh, &sh2);
            // the CPU's rollout differs by a full chain of bf16/FP8 roundings: in these flat distributions
            // a divergence comes every few tokens (measured on the H100: 11 to 149 of 288 tokens before
            // one), so no share is required, but each divergence must be explained
            cmp_runs("gpu vs cpu (sampled)", &mg, &mc, &sh, &cpu, prompts, seeds, rc.temperature, 0.0);
            // continuous batching: an arena with room for one prompt's group (10-11 of the 31 blocks)
            // at a time beside the prefill of one prompt (rollout.c: a pool that cannot hold every
            // group prefills one at a time); the later prompts wait for blocks and are prefilled alone
            Rollout cb;
            model_arena_init(&mg, kvcache_bytes(&mg, 15, 16) + model_acts_bytes(&mg, 1, 37, ACTS_FORWARD_ONLY));
            rollout_run(&mg, NULL, &rc, NP2, prompts, PLEN2, seeds, &cb);
            ck_assert_msg(cb.admissions == NP2 - 1, "%d later admissions, expected %d", cb.admissions, NP2 - 1);
            cmp_runs("continuous batching", &mg, &mc, &sh, &cb, prompts, seeds, rc.temperature, 0.75);
            Rollout *all[6] = {&sh, &nosh, &sh2, &nog, &cpu, &cb};
            for (int i = 0; i < 6; i++) rollout_free(all[i]);
            model_free(&mc);
            model_free(&mg);
        }
        free(pool);
    }
}
END_TEST

// ---- the sampler: frequencies vs exact probabilities ----------------------------------------------

enum { SS = 64, SV = 50, SCALLS = 400 };

// Upper 1e-4 point of chi-square with df degrees of freedom, Wilson-Hilferty:
// df (1 - 2/(9 df) + z sqrt(2/(9 df)))^3 with z = 3.7190 (the normal's upper 1e-4 point).
// Always a little above the exact value (df 49: 94.77 vs 94.60, df 9: 34.15 vs 33.72, df 4: 24.16
// vs 23.51, df 1: 16.21 vs 15.14), so the test is at a level just under 1e-4, never stricter.
static double chi2_crit_1e4(int df) {
    double h = 2.0 / (9.0 * df), b = 1 - h + 3.7190 * sqrt(h);
    return df * b * b * b;
}

// S rows of the same logits z (V), each row its own RNG stream; SCALLS calls of the op, which
// advances the states in device memory. n = S * SCALLS = 25,600 draws.
static void chi_case(const float *z, float temperature, int top_k, float top_p, uint64_t seed0) {
    const int n = SS * SCALLS;
    double T = (double)temperature;  // the op divides by the float temperature, in fp64
    // exact probabilities (fp64): softmax(z / T), sorted descending (ties by id; none here),
    // top-k, then top-p on the top-k-renormalised mass (as ops_cpu.c's sample defines it)
    double p[SV], q[SV], mx = -INFINITY, sum = 0;
    int ord[SV];
    for (int j = 0; j < SV; j++) mx = fmax(mx, z[j] / T);
    for (int j = 0; j < SV; j++) sum += exp(z[j] / T - mx);
    for (int j = 0; j < SV; j++) p[j] = exp(z[j] / T - mx) / sum, ord[j] = j;
    for (int i = 1; i < SV; i++)
        for (int j = i; j > 0 && (p[ord[j]] > p[ord[j - 1]] || (p[ord[j]] == p[ord[j - 1]] && ord[j] < ord[j - 1])); j--) {
            int t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
        }
    int keep = top_k > 0 && top_k < SV ? top_k : SV;
    if (top_p < 1.0f) {
        double kept = 0, c = 0;
        for (int i = 0; i < keep; i++) kept += p[ord[i]];
        int kp = 0;
        while (kp < keep) {
            double before = c;
            c += p[ord[kp++]] / kept;
            // the GPU sums in another order (~1e-16 apart): the set must not hinge on that
            ck_assert_msg(fabs(c - (double)top_p) > 1e-9 && fabs(before - (double)top_p) > 1e-9, "top-p boundary ambiguous");
            if (c >= (double)top_p) break;
        }
        keep = kp;
    }
    double m = 0;
    for (int i = 0; i < keep; i++) m += p[ord[i]];
    memset(q, 0, sizeof q);
    for (int i = 0; i < keep; i++) q[ord[i]] = p[ord[i]] / m;

    float *rows = (float *)mallocCheck((size_t)SS * SV * sizeof(float));
    for (int s = 0; s < SS; s++) memcpy(rows + (size_t)s * SV, z, SV * sizeof(float));
    uint64_t seeds[SS], st[SS];
    Rng r = rng_make(seed0);
    for (int s = 0; s < SS; s++) seeds[s] = rng_u64(&r);
    void *dz = GPU->alloc((size_t)SS * SV * 4), *drng = GPU->alloc(SS * 8), *dtok = GPU->alloc(SS * 4), *dlp = GPU->alloc(SS * 4);
    GPU->upload(dz, rows, (size_t)SS * SV * 4);
    GPU->upload(drng, seeds, SS * 8);
    long counts[SV] = {0};
    int32_t tok[SS];
    float lp[SS];
    double worst_lp = 0;
    for (int call = 0; call < SCALLS; call++) {
        GPU->sample((int32_t *)dtok, dlp, dz, (uint64_t *)drng, SS, SV, temperature, top_k, top_p);
        GPU->download(tok, dtok, SS * 4);
        GPU->download(lp, dlp, SS * 4);
        for (int s = 0; s < SS; s++) {
            ck_assert_msg(tok[s] >= 0 && tok[s] < SV, "token %d out of range", tok[s]);
            counts[tok[s]]++;
            // logp = log_softmax(z / T)[token] before truncation, computed in fp64 and returned as
            // fp32: one fp32 rounding (2^-24 relative) plus fp64 noise; allowed 2^-22 (1 + |ref|)
            double ref = log(p[tok[s]]), e = fabs(lp[s] - ref);
            worst_lp = fmax(worst_lp, e / (0x1p-22 * (1 + fabs(ref))));
            ck_assert_msg(e <= 0x1p-22 * (1 + fabs(ref)), "logp of token %d: %.9g vs %.9g", tok[s], lp[s], ref);
        }
    }
    // one uniform per call: each state moved SCALLS splitmix64 steps (its increment is 0x9e3779b97f4a7c15)
    GPU->download(st, drng, SS * 8);
    for (int s = 0; s < SS; s++)
        ck_assert_msg(st[s] == seeds[s] + (uint64_t)SCALLS * 0x9e3779b97f4a7c15ull, "row %d: rng state not advanced once per call", s);
    // excluded tokens never drawn; then chi-square over the kept ones, smallest expected counts
    // merged (in ascending order) until each bin expects >= 5
    for (int j = 0; j < SV; j++)
        ck_assert_msg(q[j] > 0 || counts[j] == 0, "token %d is outside top-k/top-p but was drawn %ld times", j, counts[j]);
    double E[SV], O[SV], pe = 0, po = 0, x2 = 0;
    int nb = 0;
    for (int i = keep - 1; i >= 0; i--) {
        pe += q[ord[i]] * n;
        po += counts[ord[i]];
        if (pe >= 5) E[nb] = pe, O[nb] = po, nb++, pe = po = 0;
    }
    if (pe > 0) E[nb - 1] += pe, O[nb - 1] += po;  // (the largest bin alone expects >= 5: nb >= 1)
    for (int b = 0; b < nb; b++) x2 += (O[b] - E[b]) * (O[b] - E[b]) / E[b];
    int df = nb - 1;
    double crit = df > 0 ? chi2_crit_1e4(df) : 0;
    printf("  sample T %.2f top_k %2d top_p %.2f: %d tokens kept, %d bins, chi2 %.2f (df %d, p = 1e-4 critical %.2f); "
           "logp worst err/tol %.3f\n", temperature, top_k, top_p, keep, nb, x2, df, crit, worst_lp);
    ck_assert_msg(df >= 1, "only one token kept: nothing to test");
    ck_assert_msg(x2 < crit, "T %g top_k %d top_p %g: chi2 %g >= %g (df %d)", temperature, top_k, top_p, x2, crit, df);
    GPU->free(dz); GPU->free(drng); GPU->free(dtok); GPU->free(dlp);
    free(rows);
}

START_TEST(test_sampler_chi_square_gpu) {
    Rng r = rng_make(20261122);
    float z[SV];
    for (int j = 0; j < SV; j++) z[j] = 1.5f * rng_normal(&r);
    chi_case(z, 1.0f, 0, 1.0f, 1);     // plain
    chi_case(z, 1.0f, 10, 1.0f, 2);    // top-k
    chi_case(z, 0.7f, 0, 0.8f, 3);     // top-p at a temperature
    chi_case(z, 0.7f, 10, 0.8f, 4);    // both: top-p on the top-k-renormalised mass
}
END_TEST

// The time-shared arena on the GPU (as test_rollout.c's test_arena_handover on the CPU): a rollout,
// an update whose activations reuse the cache's bytes, then a rollout that must equal, bit for bit,
// that of a fresh model without an arena holding the same updated adapter (graphs on in both).
START_TEST(test_arena_handover_gpu) {
    for (int gi = 0; gi < 2; gi++) {
        Model a, b;
        load(&a, "qwen3", GPU, GRANS[gi]);
        load(&b, "qwen3", GPU, GRANS[gi]);
        model_arena_init(&a, (size_t)256 << 20);
        LoRA *la = lora_create(&a, 4, 8.0f, (1u << LIN_COUNT) - 1, 5, 0), *lb = lora_create(&b, 4, 8.0f, (1u << LIN_COUNT) - 1, 5, 0);
        int *pool = token_pool("qwen3"), plens[2] = {7, 13};
        const int *prompts[2] = {pool, pool + 20};
        uint64_t seeds[6] = {1, 2, 3, 4, 5, 6}, seeds2[6] = {11, 12, 13, 14, 15, 16};
        RolloutConfig rc = {3, 12, 1.0f, 1.0f, 0, NULL, 0, 16, 1};
        Rollout r1, r2, rb;
        rollout_run(&a, la, &rc, 2, prompts, plens, seeds, &r1);
        int B = 6, T = 25, ids[150], tg[150];
        double dl[150], lp[150];
        for (int i = 0; i < B * T; i++) {
            ids[i] = pool[(i * 7) % 48];
            tg[i] = i % T == T - 1 ? -1 : pool[(i * 7 + 7) % 48];
            dl[i] = tg[i] < 0 ? 0 : ((i % 3) - 1) * 0.1;
        }
        model_forward(&a, la, ids, B, T);
        ck_assert_ptr_eq(a.acts.mem, a.arena.mem);
        ck_assert_msg(a.arena.peak_acts + a.arena.peak_kv > a.arena.bytes, "KV and activations do not share bytes");
        model_logprobs(&a, tg, 1.0f, lp);
        model_backward(&a, la, dl);
        lora_adamw_step(la, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f);
        rollout_run(&a, la, &rc, 2, prompts, plens, seeds2, &r2);
        GPU->copy(lb->params, la->params, la->n * sizeof(float));
        rollout_run(&b, lb, &rc, 2, prompts, plens, seeds2, &rb);
        for (int s = 0; s < 6; s++) {
            ck_assert_int_eq(r2.len[s], rb.len[s]);
            for (int t = 0; t < r2.len[s]; t++) {
                ck_assert_msg(r2.ids[s * 12 + t] == rb.ids[s * 12 + t], "%s: sequence %d token %d differs", fp8_gran_name(GRANS[gi]), s, t);
                ck_assert(r2.logp[s * 12 + t] == rb.logp[s * 12 + t]);
            }
        }
        printf("  arena hand-over (%s): arena %.2f MiB, KV %.2f and activations %.2f MiB at most, rollout after the update "
               "= a fresh model's, bit for bit\n", fp8_gran_name(GRANS[gi]), a.arena.bytes / 1048576.0,
               a.arena.peak_kv / 1048576.0, a.arena.peak_acts / 1048576.0);
        rollout_free(&r1), rollout_free(&r2), rollout_free(&rb);
        lora_free(la), lora_free(lb);
        free(pool);
        model_free(&a), model_free(&b);
    }
}
END_TEST

static Suite *gpu_rollout_suite(void) {
    Suite *s = suite_create("gpu_rollout");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_greedy_cpu_vs_gpu);
    tcase_add_test(tc, test_prefix_sharing_gpu);
    tcase_add_test(tc, test_sampler_chi_square_gpu);
    tcase_add_test(tc, test_arena_handover_gpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    char why[256];
    GPU = backend_cuda(why, sizeof why);
    if (!GPU) {
        fprintf(stderr, "gpu_rollout: %s; this suite runs on a GPU machine (make test-gpu)\n", why);
        return 1;
    }
    CPU = backend_cpu();
    setenv("CK_FORK", "no", 0);  // as make test-gpu runs it, also when started by hand
    printf("gpu_rollout on %s\n", GPU->device_desc);
    return run_suite(gpu_rollout_suite());
}
