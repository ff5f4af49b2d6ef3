// test/gpu_moe.cu: GPU suite for Qwen3 MoE's ops (cuda/moe.cu: moe_route, moe_route_backward,
// moe_experts_forward, moe_experts_backward) against the CPU backend's (backend_cpu.c, ops_cpu.c), on random
// inputs (never zeros): E 8, 16 and 128 experts, K 2, 4 and 8 a token, N 1, 7, 64 and 300 tokens (many experts
// empty, one expert's rows a partial tile, several tiles), BF16 experts and FP8 ones of the three
// granularities, at widths that are not multiples of the kernel's tiles (C 192, F 80 and 84) and at the
// fixtures' (C 64, F 48 and 40). The forward's products go two ways (cuda/moe.cu): with the decode kernel (the
// default; the cases run with FP8GRPO_MOE_DECODE=0, then 1), N 1, 7 and 64 (N K <= 16 E) through the decode kernel (each expert's rows 4 at a time: 1 to ~20 rows an expert here), where F is a
// multiple of 8 for down too (F 84: down through the grouped GEMM, from the decode kernel's h), and N 300
// through the grouped GEMM. The tolerances follow gpu_util.cuh's rules, carried through the SwiGLU and the sums
// as each check says. Whole models: gpu_models.cu.
// Run on a GPU: make test-gpu (CK_FORK=no).
#include "gpu_util.cuh"

static const int NS[4] = {1, 7, 64, 300};

static double sigm(double g) { return 1.0 / (1.0 + exp(-g)); }

// ---- the router ----------------------------------------------------------------------

// The choices must be the CPU's, to the bit: every third row has a tie among its largest logits (experts 0, 1
// and 2 all at 3.5), which both take lower expert first. The weights: fp32 against the CPU's double,
// the softmax's sum over E and the renormalization's over K (acc32 of each, twice: terms and quotient).
static void route_case(int N, int E, int K, int norm) {
    size_t NE = (size_t)N * E, NK = (size_t)N * K;
    float *z = randn_bf(NE, 1.0f);
    for (int n = 0; n < N; n += 3) z[(size_t)n * E] = z[(size_t)n * E + 1] = z[(size_t)n * E + 2] = 3.5f;
    int32_t *cidx = (int32_t *)mallocCheck(NK * 4), *gidx = (int32_t *)mallocCheck(NK * 4);
    float *cw = fmalloc(NK);
    CPU->moe_route(cidx, cw, z, N, E, K, norm);
    void *dz = up_act(z, NE), *didx = G->alloc(NK * 4), *dw = G->alloc(NK * 4);
    G->moe_route((int32_t *)didx, dw, dz, N, E, K, norm);
    G->download(gidx, didx, NK * 4);
    float *gw = down_hp(dw, NK);
    char what[96];
    snprintf(what, sizeof what, "moe_route choices E %d K %d N %d%s", E, K, N, norm ? " norm" : "");
    check_exact(what, gidx, cidx, NK * 4);
    double *tw = dmalloc_h(NK);
    for (size_t i = 0; i < NK; i++) tw[i] = 2 * (acc32(E) + acc32(K)) * fabs(cw[i]);
    snprintf(what, sizeof what, "moe_route weights E %d K %d N %d%s", E, K, N, norm ? " norm" : "");
    check_close(what, gw, cw, tw, NK);

    // the backward, from the same choices: dz_e = p_e (dp_e - sum_f p_f dp_f), dp on the chosen experts
    // (dw_j - sum_i dw_i w_i) / S (norm) or dw_j. Its magnitude: p_e (|dp_e| + sum_j p_j |dp_j|) with
    // |dp_j| <= (|dw_j| + sum_i |dw_i| w_i) / S; four fp32 stages (p, S and the sums over K, dp, the
    // product) of acc32(E + K) each, and the bf16 output
    float *g = randn(NK, 1.0f), *cdl = fmalloc(NE);
    CPU->moe_route_backward(cdl, g, z, cidx, N, E, K, norm);
    void *dg = up_hp(g, NK), *ddl = G->alloc(NE * 2);
    G->moe_route_backward(ddl, dg, dz, (const int32_t *)didx, N, E, K, norm);
    float *gdl = down_act(ddl, NE);
    double *mag = dmalloc_h(NE), *p = dmalloc_h(E), *dpm = dmalloc_h(E);
    for (int n = 0; n < N; n++) {
        const float *zr = z + (size_t)n * E;
        double mx = zr[0], s = 0, S = 0, gw_abs = 0, pdp = 0;
        for (int e = 1; e < E; e++) mx = fmax(mx, zr[e]);
        for (int e = 0; e < E; e++) s += p[e] = exp(zr[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= s, dpm[e] = 0;
        for (int j = 0; j < K; j++) S += p[cidx[n * K + j]];
        if (!norm) S = 1;
        for (int j = 0; j < K; j++) gw_abs += fabs(g[n * K + j]) * p[cidx[n * K + j]] / S;
        for (int j = 0; j < K; j++) {
            int e = cidx[n * K + j];
            dpm[e] = norm ? (fabs(g[n * K + j]) + gw_abs) / S : fabs(g[n * K + j]);
            pdp += p[e] * dpm[e];
        }
        for (int e = 0; e < E; e++) mag[(size_t)n * E + e] = p[e] * (dpm[e] + pdp);
    }
    double *tl = tol_bf(cdl, mag, 4 * acc32(E + K), NE);
    snprintf(what, sizeof what, "moe_route_backward E %d K %d N %d%s", E, K, N, norm ? " norm" : "");
    check_close(what, gdl, cdl, tl, NE);
    free(z); free(cidx); free(gidx); free(cw); free(gw); free(tw); free(g); free(cdl); free(gdl); free(mag); free(p);
    free(dpm); free(tl);
    G->free(dz); G->free(didx); G->free(dw); G->free(dg); G->free(ddl);
}

START_TEST(test_moe_route) {
    int EK[3][2] = {{8, 2}, {16, 4}, {128, 8}};
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 4; i++)
            for (int norm = 0; norm < 2; norm++) route_case(NS[i], EK[c][0], EK[c][1], norm);
}
END_TEST

// ---- the experts -------------------------------------------------------------------------

// C and F of the case at hand: neither a multiple of the GEMM's 64-wide tiles nor of 128; F 80 (every row
// loaded 8 elements at a time) or 84 (an element at a time: the kernel's other path), or the fixtures' widths
enum { MC_MAX = 192, MF_MAX = 96, ME_MAX = 128 };
static int MC, MF;

// E experts' three weights on both backends (the same codes: test_weights), and the values both use
typedef struct {
    QWeight g[3 * ME_MAX], c[3 * ME_MAX];
    float *wd[3 * ME_MAX];  // the CPU's dequantized values (gate, up (F, C), down (C, F))
    int E;
    FP8Gran gran;
} Experts;

static void experts_make(Experts *x, int E, FP8Gran gran) {
    x->E = E, x->gran = gran;
    for (int e = 0; e < E; e++)
        for (int k = 0; k < 3; k++) {
            int rows = k < 2 ? MF : MC, cols = k < 2 ? MC : MF, i = 3 * e + k;
            float sd = k < 2 ? 0.08f : 0.1f;  // gate and up of about unit size
            float *w = gran == FP8_OFF ? randn_bf((size_t)rows * cols, sd) : randn((size_t)rows * cols, sd);
            qweight_setup(&x->g[i], rows, cols, gran, 1);
            qweight_setup(&x->c[i], rows, cols, gran, 0);
            G->quantize_weight(&x->g[i], w, DT_F32, 0);
            CPU->quantize_weight(&x->c[i], w, DT_F32, 0);
            x->wd[i] = fmalloc((size_t)rows * cols);
            CPU->dequantize_weight(x->wd[i], &x->c[i]);
            free(w);
        }
}
static void experts_free(Experts *x) {
    for (int i = 0; i < 3 * x->E; i++) qweight_free(&x->g[i], 1), qweight_free(&x->c[i], 0), free(x->wd[i]);
}

// each token's K distinct experts, and positive routing weights
static void random_route(int32_t *idx, float *w, int N, int E, int K) {
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = rng_int(&rng, E), dup = 0;
                for (int i = 0; i < j; i++) dup |= idx[n * K + i] == e;
            } while (dup);
            idx[n * K + j] = e;
            w[n * K + j] = 0.1f + 0.9f * rng_uniform(&rng);
        }
}

// The error of one slot's expert output y (C) between the backends, from h = silu(g) u (F, the CPU's values)
// and dh (F), a bound on how far the GPU's h is from it before its own bf16 rounding: per output c,
// sum_f dhq_f |Wd_cf| + (acc32(F) + U8) sum_f |h_f Wd_cf| (the fp32 sums; y's bf16 rounding, |y| <= that sum).
// Through FP8 each backend rounds its h to its own E4M3 grid (half a step each: 2^-4 |h| for normal codes,
// 2^-10 s for subnormal ones, s <= hmax / 448 the group's scale): dhq = dh + U8 |h| + 2^-3 |h| + 2^-9 hmax / 448;
// BF16: dhq = dh + U8 |h| (the GPU's h rounded to bf16). my (C): sum_f |h_f Wd_cf|.
static void y_error(double *dy, double *my, const double *h, const double *dh, const float *wd, int fp8, double hmax) {
    double dhq[MF_MAX];
    for (int f = 0; f < MF; f++) {
        dhq[f] = dh[f] + U8 * fabs(h[f]) + 0x1p-21 * fabs(h[f]);  // and the fp32 SwiGLU's few ulps
        if (fp8) dhq[f] += 0x1p-3 * fabs(h[f]) + 0x1p-9 * hmax / 448;
    }
    for (int c = 0; c < MC; c++) {
        double s = 0, m = 0;
        for (int f = 0; f < MF; f++) {
            s += dhq[f] * fabs(wd[(size_t)c * MF + f]);
            m += fabs(h[f] * wd[(size_t)c * MF + f]);
        }
        my[c] = m;
        dy[c] = s + (acc32(MF) + U8) * m;
    }
}

static double max_abs_d(const double *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

// The forward: gate and up (kept, by slot) from the same activation codes on both backends (the same bf16 x,
// the same amax scales) with exact products of codes: acc32(C) of sum |x w| and the bf16 output. The output:
// each slot's y carries the error y_error gives for the GPU's h, which differs from the CPU's by the
// SwiGLU's derivatives times gate's and up's errors; then the weighted sum over K (acc32(K)) and the bf16 output.
static void experts_forward_case(Experts *ex, int N, int K) {
    int E = ex->E, NK = N * K, fp8 = ex->gran != FP8_OFF;
    size_t nx = (size_t)N * MC, ng = (size_t)NK * MF;
    float *x = randn_bf(nx, 1.0f), *w = fmalloc(NK), *cout = fmalloc(nx), *cg = fmalloc(ng), *cu = fmalloc(ng);
    int32_t *idx = (int32_t *)mallocCheck(NK * 4);
    random_route(idx, w, N, E, K);
    CPU->moe_experts_forward(cout, cg, cu, x, idx, w, ex->c, N, E, K, NULL);
    void *dx = up_act(x, nx), *didx = up_i32(idx, NK), *dw = up_hp(w, NK);
    void *dout = G->alloc(nx * 2), *dg = G->alloc(ng * 2), *du = G->alloc(ng * 2);
    G->moe_experts_forward(dout, dg, du, dx, (const int32_t *)didx, dw, ex->g, N, E, K, NULL);
    float *gout = down_act(dout, nx), *gg = down_act(dg, ng), *gu = down_act(du, ng);

    double *mg = dmalloc_h(ng), *mu = dmalloc_h(ng), *h = dmalloc_h(ng), *dh = dmalloc_h(ng);
    for (int sl = 0; sl < NK; sl++) {
        int e = idx[sl];
        const float *xr = x + (size_t)(sl / K) * MC;
        for (int f = 0; f < MF; f++) {
            double sg = 0, su = 0;
            for (int c = 0; c < MC; c++) {
                sg += fabs(xr[c] * ex->wd[3 * e][(size_t)f * MC + c]);
                su += fabs(xr[c] * ex->wd[3 * e + 1][(size_t)f * MC + c]);
            }
            size_t i = (size_t)sl * MF + f;
            mg[i] = sg, mu[i] = su;
            double g = cg[i], u = cu[i], s = sigm(g);
            double tg = U8 * fabs(g) + acc32(MC) * sg, tu = U8 * fabs(u) + acc32(MC) * su;  // gate's and up's errors
            h[i] = g * s * u;
            dh[i] = fabs(u * s * (1 + g * (1 - s))) * tg + fabs(g * s) * tu;
        }
    }
    char what[112];
    const char *gn = fp8_gran_name(ex->gran);
    double *tg = tol_bf(cg, mg, acc32(MC), ng), *tu = tol_bf(cu, mu, acc32(MC), ng);
    snprintf(what, sizeof what, "moe_experts_forward %s gate E %d K %d N %d F %d", gn, E, K, N, MF);
    check_close(what, gg, cg, tg, ng);
    snprintf(what, sizeof what, "moe_experts_forward %s up E %d K %d N %d", gn, E, K, N);
    check_close(what, gu, cu, tu, ng);

    double hmax = max_abs_d(h, ng), *to = dmalloc_h(nx), dy[MC_MAX], my[MC_MAX];
    for (size_t i = 0; i < nx; i++) to[i] = U8 * fabs(cout[i]);
    for (int sl = 0; sl < NK; sl++) {
        y_error(dy, my, h + (size_t)sl * MF, dh + (size_t)sl * MF, ex->wd[3 * idx[sl] + 2], fp8, hmax);
        for (int c = 0; c < MC; c++) to[(size_t)(sl / K) * MC + c] += w[sl] * (dy[c] + acc32(K) * my[c]);
    }
    snprintf(what, sizeof what, "moe_experts_forward %s out E %d K %d N %d", gn, E, K, N);
    check_close(what, gout, cout, to, nx);

    // the decode step's call, which keeps no gate and up: the same output bit for bit (the same kernels, the
    // same order of sums; gate|up into scratch)
    void *dout2 = G->alloc(nx * 2);
    G->moe_experts_forward(dout2, NULL, NULL, dx, (const int32_t *)didx, dw, ex->g, N, E, K, NULL);
    float *gout2 = down_act(dout2, nx);
    snprintf(what, sizeof what, "moe_experts_forward %s out (gate, up not kept) E %d K %d N %d", gn, E, K, N);
    check_exact(what, gout2, gout, nx * sizeof(float));
    free(x); free(w); free(cout); free(cg); free(cu); free(idx); free(gout); free(gout2); free(gg); free(gu);
    free(mg); free(mu); free(h); free(dh); free(tg); free(tu); free(to);
    G->free(dx); G->free(didx); G->free(dw); G->free(dout); G->free(dout2); G->free(dg); G->free(du);
}

// The backward, from the same gate and up on both backends (random bf16 values: what a forward kept).
//   dw[slot] = <dout, y>: y's error as y_error gives it (h computed from the same g, u), and acc32(C).
//   dx: dys = w dout rounded to bf16 (U8); dh = dys Wd (the GPU's W dequantized to bf16 where FP8: another U8;
//   acc32(C); dh rounded: U8); dg = dh u s (1 + g (1 - s)), du = dh g s (their errors, a few fp32 ulps, the
//   bf16 rounding); dxs = dg Wg + du Wu (W's bf16 rounding where FP8, acc32(2F), bf16 rounding); dx = the K
//   slots summed (acc32(K), bf16 rounding).
//   BF16 experts: the weight gradients too, added to random values: dWd += dys^T h, dWg += dg^T x, dWu += du^T x
//   over each expert's slots (dys and h rounded to bf16 on the GPU; dg and du with their errors above).
static void experts_backward_case(Experts *ex, int N, int K) {
    int E = ex->E, NK = N * K, fp8 = ex->gran != FP8_OFF;
    size_t nx = (size_t)N * MC, ng = (size_t)NK * MF, nw = (size_t)MF * MC;
    float *x = randn_bf(nx, 1.0f), *w = fmalloc(NK), *gq = randn_bf(ng, 1.5f), *uq = randn_bf(ng, 1.0f);
    float *dout = randn_bf(nx, 1.0f), *cdx = fmalloc(nx), *cdw = fmalloc(NK);
    int32_t *idx = (int32_t *)mallocCheck(NK * 4);
    random_route(idx, w, N, E, K);
    QWeight cde[3 * ME_MAX], gde[3 * ME_MAX];
    float *de0[3 * ME_MAX];
    for (int i = 0; i < 3 * E; i++) {
        de0[i] = randn(nw, 1.0f);
        memset(&cde[i], 0, sizeof cde[i]);
        cde[i].rows = i % 3 < 2 ? MF : MC, cde[i].cols = i % 3 < 2 ? MC : MF, cde[i].gran = FP8_OFF;
        gde[i] = cde[i];
        cde[i].dense = fdup(de0[i], nw);
        gde[i].dense = up_hp(de0[i], nw);
    }
    CPU->moe_experts_backward(cdx, cdw, fp8 ? NULL : cde, dout, x, idx, w, gq, uq, ex->c, N, E, K, NULL);
    void *dx = up_act(x, nx), *didx = up_i32(idx, NK), *dwt = up_hp(w, NK), *dg = up_act(gq, ng), *du = up_act(uq, ng);
    void *ddout = up_act(dout, nx), *ddx = G->alloc(nx * 2), *ddw = G->alloc((size_t)NK * 4);
    G->moe_experts_backward(ddx, ddw, fp8 ? NULL : gde, ddout, dx, (const int32_t *)didx, dwt, dg, du, ex->g, N, E, K, NULL);
    float *gdx = down_act(ddx, nx), *gdw = down_hp(ddw, NK);

    double kW = fp8 ? U8 : 0;  // the GPU's dequantized weights' rounding to bf16
    double *h = dmalloc_h(ng), *zero = dmalloc_h(MF), *tdw = dmalloc_h(NK), *tdx = dmalloc_h(nx);
    double *eg = dmalloc_h(ng), *eu = dmalloc_h(ng), *vg = dmalloc_h(ng), *vu = dmalloc_h(ng), dy[MC_MAX], my[MC_MAX];
    for (size_t i = 0; i < ng; i++) h[i] = gq[i] * sigm(gq[i]) * uq[i];
    double hmax = max_abs_d(h, ng);
    for (size_t i = 0; i < nx; i++) tdx[i] = U8 * fabs(cdx[i]);
    for (int sl = 0; sl < NK; sl++) {
        int e = idx[sl];
        const float *d = dout + (size_t)(sl / K) * MC, *wd = ex->wd[3 * e + 2], *wg = ex->wd[3 * e], *wu = ex->wd[3 * e + 1];
        y_error(dy, my, h + (size_t)sl * MF, zero, wd, fp8, hmax);
        double t = 0;
        for (int c = 0; c < MC; c++) t += fabs(d[c]) * (dy[c] + acc32(MC) * my[c]);
        tdw[sl] = t;
        for (int f = 0; f < MF; f++) {  // dh, then dg and du: values (vg, vu) and error bounds (eg, eu)
            double v = 0, m1 = 0;
            for (int c = 0; c < MC; c++) {
                double ys = (double)w[sl] * d[c];
                v += ys * wd[(size_t)c * MF + f];
                m1 += fabs(ys * wd[(size_t)c * MF + f]);
            }
            double edh = (U8 + kW + acc32(MC)) * m1 + U8 * fabs(v);
            size_t i = (size_t)sl * MF + f;
            double g = gq[i], u = uq[i], s = sigm(g), a = u * s * (1 + g * (1 - s)), b = g * s;
            vg[i] = v * a, vu[i] = v * b;
            eg[i] = fabs(a) * edh + (U8 + 0x1p-20) * fabs(vg[i]);
            eu[i] = fabs(b) * edh + (U8 + 0x1p-20) * fabs(vu[i]);
        }
        for (int c = 0; c < MC; c++) {  // dxs
            double e2 = 0, m2 = 0;
            for (int f = 0; f < MF; f++) {
                size_t i = (size_t)sl * MF + f;
                double ag = fabs(wg[(size_t)f * MC + c]), au = fabs(wu[(size_t)f * MC + c]);
                e2 += eg[i] * ag + eu[i] * au;
                m2 += fabs(vg[i]) * ag + fabs(vu[i]) * au;
            }
            tdx[(size_t)(sl / K) * MC + c] += e2 + (kW + acc32(2 * MF) + U8 + acc32(K)) * m2;
        }
    }
    char what[112];
    const char *gn = fp8_gran_name(ex->gran);
    snprintf(what, sizeof what, "moe_experts_backward %s dw E %d K %d N %d", gn, E, K, N);
    check_close(what, gdw, cdw, tdw, NK);
    snprintf(what, sizeof what, "moe_experts_backward %s dx E %d K %d N %d F %d", gn, E, K, N, MF);
    check_close(what, gdx, cdx, tdx, nx);
    if (!fp8) {  // each weight kind's gradients over all the experts, one check each
        int *slots = (int *)mallocCheck(NK * sizeof(int));
        double *t = dmalloc_h((size_t)E * nw);
        float *got = fmalloc((size_t)E * nw), *ref = fmalloc((size_t)E * nw);
        for (int k = 0; k < 3; k++) {
            int O = k < 2 ? MF : MC, I = k < 2 ? MC : MF;
            for (int e = 0; e < E; e++) {
                int i = 3 * e + k, n_e = 0;
                for (int sl = 0; sl < NK; sl++)
                    if (idx[sl] == e) slots[n_e++] = sl;
                for (int o = 0; o < O; o++)
                    for (int c = 0; c < I; c++) {
                        double err = 0, m = fabs(de0[i][(size_t)o * I + c]);
                        for (int q = 0; q < n_e; q++) {
                            int sl = slots[q];
                            if (k == 2) {  // dys_o h_c: both rounded to bf16 on the GPU
                                double a = fabs((double)w[sl] * dout[(size_t)(sl / K) * MC + o] * h[(size_t)sl * MF + c]);
                                m += a, err += 2 * U8 * a;
                            } else {  // dg_o x_c (du_o x_c)
                                size_t j = (size_t)sl * MF + o;
                                double xa = fabs(x[(size_t)(sl / K) * MC + c]);
                                m += fabs(k ? vu[j] : vg[j]) * xa, err += (k ? eu[j] : eg[j]) * xa;
                            }
                        }
                        t[(size_t)e * nw + (size_t)o * I + c] = err + acc32(n_e + 1) * m;
                    }
                G->download(got + (size_t)e * nw, gde[i].dense, nw * 4);
                memcpy(ref + (size_t)e * nw, cde[i].dense, nw * 4);
            }
            snprintf(what, sizeof what, "moe_experts_backward dW%s += E %d K %d N %d", k == 0 ? "gate" : k == 1 ? "up" : "down",
                     E, K, N);
            check_close(what, got, ref, t, (size_t)E * nw);
        }
        free(slots); free(t); free(got); free(ref);
    }
    for (int i = 0; i < 3 * E; i++) free(de0[i]), free(cde[i].dense), G->free(gde[i].dense);
    free(x); free(w); free(gq); free(uq); free(dout); free(cdx); free(cdw); free(idx); free(gdx); free(gdw);
    free(h); free(zero); free(tdw); free(tdx); free(eg); free(eu); free(vg); free(vu);
    G->free(dx); G->free(didx); G->free(dwt); G->free(dg); G->free(du); G->free(ddout); G->free(ddx); G->free(ddw);
}

START_TEST(test_moe_experts) {
    FP8Gran grans[4] = {FP8_OFF, FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    // E, K, F, C: two fixtures' E and K at the kernels' awkward widths, Qwen3-30B-A3B's E and K, the fixtures
    // (test/fixtures/qwen3_moe, qwen3_moe16)
    int EKFC[5][4] = {{8, 2, 84, 192}, {16, 4, 80, 192}, {128, 8, 80, 192}, {8, 2, 48, 64}, {16, 4, 40, 64}};
    // the decode kernel is the default where it applies (cuda/moe.cu moe_decode_enabled): every case with it
    // off (FP8GRPO_MOE_DECODE=0, the grouped GEMM alone), then on
    for (int dec = 0; dec < 2; dec++) {
        setenv("FP8GRPO_MOE_DECODE", dec ? "1" : "0", 1);
        for (int gi = 0; gi < 4; gi++)
            for (int c = 0; c < 5; c++) {
                Experts ex;
                MF = EKFC[c][2], MC = EKFC[c][3];
                experts_make(&ex, EKFC[c][0], grans[gi]);
                for (int i = 0; i < 4; i++) {
                    experts_forward_case(&ex, NS[i], EKFC[c][1]);
                    experts_backward_case(&ex, NS[i], EKFC[c][1]);
                }
                experts_free(&ex);
            }
    }
    unsetenv("FP8GRPO_MOE_DECODE");
}
END_TEST

static Suite *gpu_moe_suite(void) {
    Suite *s = suite_create("gpu_moe");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_moe_route);
    tcase_add_test(tc, test_moe_experts);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    char why[256];
    G = backend_cuda(why, sizeof why);
    if (!G) {
        fprintf(stderr, "gpu_moe: %s; this suite runs on a GPU machine (make test-gpu)\n", why);
        return 1;
    }
    CPU = backend_cpu();
    rng = rng_make(20261206);
    printf("gpu_moe on %s\n", G->device_desc);
    return run_suite(gpu_moe_suite());
}
