// test/gpu_backend.cu: GPU suite for the CUDA backend's ops (backend_cuda.cu, ops_cuda.cu, attention.cu,
// attention_decode.cu, sample.cu) against the CPU reference kernels (ops_cpu.c) and the CPU backend (backend_cpu.c), every
// op on random inputs (never zeros); the tolerances are derived in gpu_util.cuh. Whole models:
// gpu_models.cu. Run on a GPU: make test-gpu (CK_FORK=no: a CUDA context does not survive fork).
#include "gpu_util.cuh"
#include "cuda/attention_cuda.h"

// ---- memory and conversions ---------------------------------------------------------

START_TEST(test_memory) {
    size_t n = 100003;  // not a multiple of 8
    float *x = randn(n, 3.0f);
    // f16 sources: random finite half patterns
    uint16_t *h = (uint16_t *)mallocCheck(n * 2);
    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        do v = (uint16_t)rng_u64(&rng);
        while (((v >> 10) & 0x1f) == 0x1f);
        h[i] = v;
    }
    double *xd = (double *)mallocCheck(n * 8);
    uint16_t *xb = (uint16_t *)mallocCheck(n * 2);
    for (size_t i = 0; i < n; i++) { xd[i] = x[i]; xb[i] = f32_to_bf16(x[i]); }
    const void *srcs[4] = {x, xb, h, xd};
    DType sts[4] = {DT_F32, DT_BF16, DT_F16, DT_F64};
    void *d = G->alloc(n * 4);
    uint16_t *gb = (uint16_t *)mallocCheck(n * 2), *wb = (uint16_t *)mallocCheck(n * 2);
    float *gf = fmalloc(n), *wf = fmalloc(n);
    for (int s = 0; s < 4; s++) {
        for (size_t i = 0; i < n; i++) {  // the value each source holds, in f32 (exact for all four)
            float v = s == 2 ? f16_to_f32(h[i]) : s == 1 ? bf16_to_f32(xb[i]) : x[i];
            wf[i] = v;
            wb[i] = f32_to_bf16(v);
        }
        char what[64];
        G->upload_convert(d, DT_BF16, srcs[s], sts[s], n);
        G->download(gb, d, n * 2);
        snprintf(what, sizeof what, "upload_convert %s -> BF16", dtype_name(sts[s]));
        check_exact(what, gb, wb, n * 2);
        G->upload_convert(d, DT_F32, srcs[s], sts[s], n);
        G->download(gf, d, n * 4);
        snprintf(what, sizeof what, "upload_convert %s -> F32", dtype_name(sts[s]));
        check_exact(what, gf, wf, n * 4);
    }
    // copy, zero
    void *d2 = G->alloc(n * 4);
    G->copy(d2, d, n * 4);
    G->download(gf, d2, n * 4);
    check_exact("copy", gf, wf, n * 4);
    G->zero(d2, n * 4 - 4);
    G->download(gf, d2, n * 4);
    long nz = 0;
    for (size_t i = 0; i < n - 1; i++) nz += gf[i] != 0;
    ck_assert_msg(nz == 0 && gf[n - 1] == wf[n - 1], "zero: %ld non-zero values, or wrote past the end", nz);
    // copy_2d: 300 rows of 24 bytes from a 40-byte pitch into a 56-byte pitch (LoRA's block-diagonal
    // B); the bytes between the rows keep their values
    {
        size_t rows = 300, w = 24, sp = 40, dp = 56;
        G->copy(d2, d, n * 4);  // dst starts as wf
        G->copy_2d(d2, dp, (const char *)d + 4, sp, w, rows);
        G->download(gf, d2, n * 4);
        float *want = fmalloc(n);
        memcpy(want, wf, n * 4);
        for (size_t r = 0; r < rows; r++) memcpy((char *)want + r * dp, (const char *)wf + 4 + r * sp, w);
        check_exact("copy_2d", gf, want, n * 4);
        free(want);
    }
    // out of memory: a one-line error naming the size and the fix
    EXPECT_DIE(G->alloc((size_t)1 << 50), "out of GPU memory allocating");
    G->free(d);
    G->free(d2);
    free(x); free(h); free(xd); free(xb); free(gb); free(wb); free(gf); free(wf);
}
END_TEST

// ---- weights ------------------------------------------------------------------------

START_TEST(test_weights) {
    int R = 300, C = 520;  // neither a multiple of 128
    size_t n = (size_t)R * C;
    float *w = randn(n, 0.05f);
    w[7] = 30.0f;  // an outlier: its block / row / tensor scale differs
    uint16_t *wb = (uint16_t *)mallocCheck(n * 2);
    for (size_t i = 0; i < n; i++) wb[i] = f32_to_bf16(w[i]);
    FP8Gran grans[4] = {FP8_OFF, FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    for (int gi = 0; gi < 4; gi++)
        for (int pow2 = 0; pow2 < 2; pow2++)
            for (int st = 0; st < 2; st++) {
                if (grans[gi] == FP8_OFF && pow2) continue;
                const void *src = st ? (const void *)wb : (const void *)w;
                DType sdt = st ? DT_BF16 : DT_F32;
                QWeight gw, cw;
                qweight_setup(&gw, R, C, grans[gi], 1);
                qweight_setup(&cw, R, C, grans[gi], 0);
                G->quantize_weight(&gw, src, sdt, pow2);
                CPU->quantize_weight(&cw, src, sdt, pow2);
                char what[96];
                if (grans[gi] != FP8_OFF) {
                    size_t ns = fp8_num_scales(grans[gi], R, C, 128);
                    uint8_t *q = (uint8_t *)mallocCheck(n);
                    float *s = fmalloc(ns);
                    G->download(q, gw.q.data, n);
                    G->download(s, gw.q.scale, ns * 4);
                    snprintf(what, sizeof what, "quantize_weight %s pow2 %d from %s: codes", fp8_gran_name(grans[gi]), pow2, dtype_name(sdt));
                    check_exact(what, q, cw.q.data, n);
                    snprintf(what, sizeof what, "quantize_weight %s pow2 %d from %s: scales", fp8_gran_name(grans[gi]), pow2, dtype_name(sdt));
                    check_exact(what, s, cw.q.scale, ns * 4);
                    free(q);
                    free(s);
                }
                // dequantize: the CPU's values rounded once to bf16
                void *dd = G->alloc(n * 2);
                G->dequantize_weight(dd, &gw);
                float *got = down_act(dd, n), *ref = fmalloc(n);
                CPU->dequantize_weight(ref, &cw);
                for (size_t i = 0; i < n; i++) ref[i] = bfr(ref[i]);
                snprintf(what, sizeof what, "dequantize_weight %s pow2 %d from %s", fp8_gran_name(grans[gi]), pow2, dtype_name(sdt));
                check_exact(what, got, ref, n * 4);
                G->free(dd);
                free(got);
                free(ref);
                qweight_free(&gw, 1);
                qweight_free(&cw, 0);
            }
    free(w);
    free(wb);
}
END_TEST

// ---- linear layers ------------------------------------------------------------------

// an activation-shaped FP8 tensor (E4M3, ROW or 1x128 BLOCK) in device memory, and its release
static void fp8_device_tensor(FP8Tensor *t, int rows, int cols, FP8Gran g) {
    memset(t, 0, sizeof *t);
    t->rows = rows;
    t->cols = cols;
    t->gran = g;
    t->fmt = FP8_E4M3;
    t->block_rows = 1;
    t->data = (uint8_t *)G->alloc((size_t)rows * cols);
    t->scale = (float *)G->alloc(fp8_num_scales(g, rows, cols, 1) * 4);
}
static void fp8_device_tensor_free(FP8Tensor *t) {
    G->free(t->data);
    G->free(t->scale);
}
// a fused op's FP8 copy (backend.h outq) against fp8_quantize_cuda of the act values it was made from:
// the same codes and scales, bit for bit
static void check_fp8_copy(const char *what, const FP8Tensor *got, const void *from) {
    FP8Tensor ref;
    fp8_device_tensor(&ref, got->rows, got->cols, got->gran);
    fp8_quantize_cuda(&ref, from, DT_BF16, 0);
    size_t nc = (size_t)got->rows * got->cols, ns = fp8_num_scales(got->gran, got->rows, got->cols, 1);
    uint8_t *a = (uint8_t *)mallocCheck(nc), *b = (uint8_t *)mallocCheck(nc);
    float *sa = fmalloc(ns), *sb = fmalloc(ns);
    G->download(a, got->data, nc);
    G->download(b, ref.data, nc);
    G->download(sa, got->scale, ns * 4);
    G->download(sb, ref.scale, ns * 4);
    char w[160];
    snprintf(w, sizeof w, "%s: codes", what);
    check_exact(w, a, b, nc);
    snprintf(w, sizeof w, "%s: scales", what);
    check_exact(w, sa, sb, ns * 4);
    free(a); free(b); free(sa); free(sb);
    fp8_device_tensor_free(&ref);
}

// the bound on the error of dout's FP8 quantization for dX (fp8_linear_dx_cuda's FP8 product), element
// by element: half an ulp of the format (2^-4 E4M3, 2^-3 E5M2) of |d|, or half the smallest subnormal
// times the group's scale, plus the fp32 division (2^-23); groups: 1x128 along OC (BLOCK, E4M3) or
// the whole tensor (TENSOR, E5M2)
static double *dout_quant_err(const float *d, int N, int OC, FP8Gran g) {
    double *e = dmalloc_h((size_t)N * OC), u = g == FP8_BLOCK ? 0x1p-4 : 0x1p-3;
    double h = g == FP8_BLOCK ? 0x1p-10 / 448 : 0x1p-17 / 57344, tmax = 0;
    for (size_t k = 0; k < (size_t)N * OC; k++) tmax = fmax(tmax, fabs(d[k]));
    for (int i = 0; i < N; i++)
        for (int o0 = 0; o0 < OC; o0 += 128) {
            int o1 = o0 + 128 < OC ? o0 + 128 : OC;
            double amax = g == FP8_BLOCK ? 0 : tmax;
            for (int o = o0; g == FP8_BLOCK && o < o1; o++) amax = fmax(amax, fabs(d[(size_t)i * OC + o]));
            for (int o = o0; o < o1; o++) e[(size_t)i * OC + o] = (u + 0x1p-23) * fabs(d[(size_t)i * OC + o]) + h * amax * (1 + 0x1p-23);
        }
    return e;
}

START_TEST(test_linear) {
    int N = 77, C = 320;
    FP8Gran grans[4] = {FP8_OFF, FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    // OC 200: dX through FP8 weights by the BF16 reference (200 is not a multiple of 16); OC 256: by
    // the FP8 product for TENSOR and BLOCK weights (forced: AUTO would take it from C = 2048)
    fp8_cuda_set_dx(FP8_DX_FP8);
    for (int OC = 200; OC <= 256; OC += 56)
    for (int gi = 0; gi < 4; gi++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            FP8Gran g = grans[gi];
            float *w = g == FP8_OFF ? randn_bf((size_t)OC * C, 0.06f) : randn((size_t)OC * C, 0.06f);
            float *x = randn_bf((size_t)N * C, 1.0f), *bias = randn_bf(OC, 0.5f);
            QWeight gw, cw;
            qweight_setup(&gw, OC, C, g, 1);
            qweight_setup(&cw, OC, C, g, 0);
            G->quantize_weight(&gw, w, DT_F32, 0);
            CPU->quantize_weight(&cw, w, DT_F32, 0);
            float *wd = fmalloc((size_t)OC * C);  // the weight as both use it
            CPU->dequantize_weight(wd, &cw);
            void *dx = up_act(x, (size_t)N * C), *db = up_act(bias, OC), *dy = G->alloc((size_t)N * OC * 2);
            float *ref = fmalloc((size_t)N * OC);
            G->linear_forward(dy, dx, &gw, with_bias ? db : NULL, N);
            CPU->linear_forward(ref, x, &cw, with_bias ? bias : NULL, N);
            float *got = down_act(dy, (size_t)N * OC);
            double *mag = dmalloc_h((size_t)N * OC);
            for (int i = 0; i < N; i++)
                for (int o = 0; o < OC; o++) {
                    double s = 0;
                    for (int c = 0; c < C; c++) s += fabs(x[(size_t)i * C + c] * wd[(size_t)o * C + c]);
                    mag[(size_t)i * OC + o] = s;
                }
            // OFF: fp32 accumulation; FP8: the tensor cores' FP8 accumulation (the activation codes are
            // the CPU's: same bf16 values, same amax scales)
            double *tol = tol_bf(ref, mag, g == FP8_OFF ? acc32(C) : ACC_TC, (size_t)N * OC);
            char what[96];
            snprintf(what, sizeof what, "linear_forward %s%s (N %d, C %d, OC %d)", fp8_gran_name(g), with_bias ? " + bias" : "", N, C, OC);
            check_close(what, got, ref, tol, (size_t)N * OC);
            if (g == FP8_ROW || g == FP8_BLOCK) {  // quantize_act, then linear_forward_q: the same product, to the bit
                FP8Tensor xq;
                fp8_device_tensor(&xq, N, C, g);
                G->quantize_act(&xq, dx, N);
                void *dy2 = G->alloc((size_t)N * OC * 2);
                G->linear_forward_q(dy2, &xq, &gw, with_bias ? db : NULL, N);
                float *got2 = down_act(dy2, (size_t)N * OC);
                snprintf(what, sizeof what, "linear_forward_q = linear_forward, %s%s", fp8_gran_name(g), with_bias ? " + bias" : "");
                check_exact(what, got2, got, (size_t)N * OC * 4);
                free(got2); G->free(dy2); fp8_device_tensor_free(&xq);
            }
            free(got); free(tol); free(mag); free(ref);

            // backward: dX (= and +=); dW and dbias (dense only) accumulate into fp32
            float *dout = randn_bf((size_t)N * OC, 1.0f), *dx0 = randn_bf((size_t)N * C, 1.0f);
            float *dw0 = randn((size_t)OC * C, 1.0f), *dbias0 = randn(OC, 1.0f);
            void *ddout = up_act(dout, (size_t)N * OC), *ddx = up_act(dx0, (size_t)N * C);
            void *ddw = g == FP8_OFF ? up_hp(dw0, (size_t)OC * C) : NULL, *ddb = up_hp(dbias0, OC);
            int dx_fp8 = g != FP8_OFF && fp8_linear_dx_is_fp8(&gw.q);
            ck_assert_int_eq(dx_fp8, OC == 256 && (g == FP8_TENSOR || g == FP8_BLOCK));
            double *eq = dx_fp8 ? dout_quant_err(dout, N, OC, g) : NULL;
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                void *tmp = up_act(dx0, (size_t)N * C);
                G->copy(ddx, tmp, (size_t)N * C * 2);
                G->free(tmp);
                float *rdx = fdup(dx0, (size_t)N * C), *rdw = g == FP8_OFF ? fdup(dw0, (size_t)OC * C) : NULL;
                float *rdb = fdup(dbias0, OC);
                int first = accumulate == 0;  // dW / dbias only once (they accumulate across calls)
                G->linear_backward(ddx, accumulate, first ? ddw : NULL, first ? ddb : NULL, ddout, dx, &gw, N);
                matmul_backward_cpu(rdx, accumulate, first ? rdw : NULL, first ? rdb : NULL, dout, x, wd, N, C, OC);
                float *gdx = down_act(ddx, (size_t)N * C);
                double *m2 = dmalloc_h((size_t)N * C), *m2q = dmalloc_h((size_t)N * C);  // sum |dout w|; its error's part
                for (int i = 0; i < N; i++)
                    for (int c = 0; c < C; c++) {
                        double s = accumulate ? fabs(dx0[(size_t)i * C + c]) : 0, sq = 0;
                        for (int o = 0; o < OC; o++) {
                            s += fabs(dout[(size_t)i * OC + o] * wd[(size_t)o * C + c]);
                            if (eq) sq += eq[(size_t)i * OC + o] * fabs(wd[(size_t)o * C + c]);
                        }
                        m2[(size_t)i * C + c] = s + sq, m2q[(size_t)i * C + c] = sq;
                    }
                // FP8 weights by the BF16 reference: W dequantized to bf16, one more 2^-8 of sum |dout w|;
                // by the FP8 product: dout's quantization error (m2q) and the tensor cores' FP8 accumulation
                // on the quantized values (ACC_TC of their sum |dout w|), added to dinp before the one
                // rounding. With accumulate the BF16 reference's product is rounded to bf16 once before
                // the sum: another 2^-8.
                double k2 = g == FP8_OFF ? acc32(OC) : dx_fp8 ? ACC_TC : acc32(OC) + U8 * (1 + accumulate);
                double *t2 = tol_bf(rdx, m2, k2, (size_t)N * C);
                for (size_t i = 0; i < (size_t)N * C; i++) t2[i] += m2q[i];
                snprintf(what, sizeof what, "linear_backward %s dX %s%s", fp8_gran_name(g), accumulate ? "+=" : "=",
                         dx_fp8 ? " (FP8 product)" : "");
                check_close(what, gdx, rdx, t2, (size_t)N * C);
                free(gdx); free(m2); free(m2q); free(t2);
                if (first && g == FP8_OFF) {
                    float *gdw = down_hp(ddw, (size_t)OC * C);
                    double *t3 = dmalloc_h((size_t)OC * C);
                    for (int o = 0; o < OC; o++)
                        for (int c = 0; c < C; c++) {
                            double s = fabs(dw0[(size_t)o * C + c]);
                            for (int i = 0; i < N; i++) s += fabs(dout[(size_t)i * OC + o] * x[(size_t)i * C + c]);
                            t3[(size_t)o * C + c] = acc32(N) * s + 0x1p-23 * fabs(rdw[(size_t)o * C + c]);
                        }
                    check_close("linear_backward off dW +=", gdw, rdw, t3, (size_t)OC * C);
                    free(gdw); free(t3);
                }
                if (first) {
                    float *gdb = down_hp(ddb, OC);
                    double *t4 = dmalloc_h(OC);
                    for (int o = 0; o < OC; o++) {
                        double s = fabs(dbias0[o]);
                        for (int i = 0; i < N; i++) s += fabs(dout[(size_t)i * OC + o]);
                        t4[o] = acc32(N) * s;
                    }
                    snprintf(what, sizeof what, "linear_backward %s dbias +=", fp8_gran_name(g));
                    check_close(what, gdb, rdb, t4, OC);
                    free(gdb); free(t4);
                }
                free(rdx); free(rdw); free(rdb);
            }
            G->free(dx); G->free(db); G->free(dy); G->free(ddout); G->free(ddx); G->free(ddb);
            if (ddw) G->free(ddw);
            qweight_free(&gw, 1);
            qweight_free(&cw, 0);
            free(w); free(x); free(bias); free(wd); free(dout); free(dx0); free(dw0); free(dbias0); free(eq);
        }
    fp8_cuda_set_dx(FP8_DX_AUTO);
}
END_TEST

// ---- LoRA ---------------------------------------------------------------------------

// the magnitudes the LoRA tolerances scale with: mx (N, R) = sum |x a| of each ax, mo (N, OC) = scale
// sum_r mx |b| of each output's term
static void lora_mags(double **mx, double **mo, const float *x, const float *A, const float *B, float scale, int N,
                      int C, int R, int OC) {
    *mx = dmalloc_h((size_t)N * R), *mo = dmalloc_h((size_t)N * OC);
    for (int i = 0; i < N; i++)
        for (int r = 0; r < R; r++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += fabs(x[(size_t)i * C + c] * A[(size_t)r * C + c]);
            (*mx)[(size_t)i * R + r] = s;
        }
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int r = 0; r < R; r++) s += (*mx)[(size_t)i * R + r] * fabs(B[(size_t)o * R + r]);
            (*mo)[(size_t)i * OC + o] = scale * s;
        }
}

// lora_apply against the CPU's (fp32 A, B, ax), with test_lora's tolerance (A, ax, B each rounded to
// bf16, fp32 sums), at the decode step's shapes
static void lora_apply_case(int N, int C, int R, int OC) {
    float scale = 2.0f;
    float *x = randn_bf((size_t)N * C, 1.0f), *A = randn((size_t)R * C, 0.05f), *B = randn((size_t)OC * R, 0.05f);
    float *out0 = randn_bf((size_t)N * OC, 1.0f), *rout = fdup(out0, (size_t)N * OC);
    CPU->lora_apply(rout, x, A, B, scale, N, C, R, OC);
    double *max_, *mo;
    lora_mags(&max_, &mo, x, A, B, scale, N, C, R, OC);
    double *to = tol_bf(rout, mo, 3 * U8 + acc32(C), (size_t)N * OC);
    void *dx = up_act(x, (size_t)N * C), *dA = up_hp(A, (size_t)R * C), *dB = up_hp(B, (size_t)OC * R);
    void *dA16 = G->alloc((size_t)R * C * 2), *dB16 = G->alloc((size_t)OC * R * 2), *dout = up_act(out0, (size_t)N * OC);
    G->to_act(dA16, dA, (size_t)R * C);
    G->to_act(dB16, dB, (size_t)OC * R);
    G->lora_apply(dout, dx, dA16, dB16, scale, N, C, R, OC);
    float *got = down_act(dout, (size_t)N * OC);
    char what[96];
    snprintf(what, sizeof what, "lora_apply out += N %d C %d R %d OC %d", N, C, R, OC);
    check_close(what, got, rout, to, (size_t)N * OC);
    free(x); free(A); free(B); free(out0); free(rout); free(max_); free(mo); free(to); free(got);
    G->free(dx); G->free(dA); G->free(dB); G->free(dA16); G->free(dB16); G->free(dout);
}

// a unit of three members sharing one input (q, k, v at r 16): the down product with their A's stacked
// (R = 48), each member's up product and its backward on its 16 columns of ax and dax (row stride 48),
// then the unit's down backward; against the CPU's ops on fp32 A, B (the GPU's are their bf16 copies)
START_TEST(test_lora) {
    lora_apply_case(64, 1024, 48, 4096);  // the 0.6B shape's q|k|v group at batch 64 (r 16, three members)
    lora_apply_case(5, 3072, 16, 1024);   // down, a few rows
    lora_apply_case(7, 320, 12, 200);     // odd sizes
    enum { M = 3 };
    int N = 150, C = 320, r = 16, R = M * r, OC[M] = {200, 72, 72};
    float scale = 2.0f;
    float *x = randn_bf((size_t)N * C, 1.0f), *A = randn((size_t)R * C, 0.05f);
    void *dx = up_act(x, (size_t)N * C), *dA = up_hp(A, (size_t)R * C), *dA16 = G->alloc((size_t)R * C * 2);
    G->to_act(dA16, dA, (size_t)R * C);
    float *gA16 = down_act(dA16, (size_t)R * C), *rA16 = fmalloc((size_t)R * C);
    for (size_t i = 0; i < (size_t)R * C; i++) rA16[i] = bfr(A[i]);
    check_exact("to_act (f32 -> bf16, nearest even)", gA16, rA16, (size_t)R * C * 4);
    free(gA16); free(rA16);
    // ax = x A^T with A rounded to bf16 and ax stored in bf16: 2 x 2^-8 sum |x a| + fp32 accumulation
    void *dax = G->alloc((size_t)N * R * 2);
    float *rax = fmalloc((size_t)N * R);
    G->lora_down(dax, dx, dA16, N, C, R);
    CPU->lora_down(rax, x, A, N, C, R);
    float *gax = down_act(dax, (size_t)N * R);
    double *mx = dmalloc_h((size_t)N * R), *tax = dmalloc_h((size_t)N * R);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < R; c++) {
            double s = 0;
            for (int k = 0; k < C; k++) s += fabs(x[(size_t)i * C + k] * A[(size_t)c * C + k]);
            mx[(size_t)i * R + c] = s, tax[(size_t)i * R + c] = (2 * U8 + acc32(C)) * s;
        }
    check_close("lora_down ax", gax, rax, tax, (size_t)N * R);

    // per member, last first (a member's writes beyond its columns would show): out += scale ax B^T, then
    // its backward: dax's columns = scale g B, dB += scale g^T ax
    void *ddax = G->alloc((size_t)N * R * 2);
    float *rdax = fmalloc((size_t)N * R);
    double *mdax = dmalloc_h((size_t)N * R);
    for (int m = M - 1; m >= 0; m--) {
        int O = OC[m];
        size_t no = (size_t)N * O, nb = (size_t)O * r;
        float *B = randn(nb, 0.05f), *out0 = randn_bf(no, 1.0f), *rout = fdup(out0, no);
        void *dB = up_hp(B, nb), *dB16 = G->alloc(nb * 2), *dout = up_act(out0, no);
        G->to_act(dB16, dB, nb);
        G->lora_up(dout, (uint16_t *)dax + m * r, R, dB16, scale, N, r, O);
        CPU->lora_up(rout, rax + m * r, R, B, scale, N, r, O);
        float *gout = down_act(dout, no);
        // A, ax and B each rounded to bf16 (3 x 2^-8 of the magnitude), bf16 output
        double *mo = dmalloc_h(no);
        for (int i = 0; i < N; i++)
            for (int o = 0; o < O; o++) {
                double s = 0;
                for (int c = 0; c < r; c++) s += mx[(size_t)i * R + m * r + c] * fabs(B[(size_t)o * r + c]);
                mo[(size_t)i * O + o] = scale * s;
            }
        double *to = tol_bf(rout, mo, 3 * U8 + acc32(C), no);
        char what[64];
        snprintf(what, sizeof what, "lora_up out += (member %d)", m);
        check_close(what, gout, rout, to, no);

        float *g = randn_bf(no, 1.0f), *gB0 = randn(nb, 0.1f), *rgB = fdup(gB0, nb);
        void *dg = up_act(g, no), *dgB = up_hp(gB0, nb);
        G->lora_up_backward((uint16_t *)ddax + m * r, dgB, dg, (uint16_t *)dax + m * r, R, dB16, scale, N, r, O);
        CPU->lora_up_backward(rdax + m * r, rgB, g, rax + m * r, R, B, scale, N, r, O);
        float *ggB = down_hp(dgB, nb);
        // dB += scale g^T ax: ax rounded to bf16 (ax itself carries the forward's error, bounded above)
        double *tB = dmalloc_h(nb);
        for (int o = 0; o < O; o++)
            for (int c = 0; c < r; c++) {
                double s = 0, e = 0;
                for (int i = 0; i < N; i++) {
                    s += fabs(g[(size_t)i * O + o] * rax[(size_t)i * R + m * r + c]);
                    e += fabs(g[(size_t)i * O + o]) * tax[(size_t)i * R + m * r + c];
                }
                tB[(size_t)o * r + c] = scale * ((U8 + acc32(N)) * s + e) + 0x1p-22 * fabs(rgB[(size_t)o * r + c]);
            }
        snprintf(what, sizeof what, "lora_up_backward dB += (member %d)", m);
        check_close(what, ggB, rgB, tB, nb);
        for (int i = 0; i < N; i++)  // the magnitude of dax = scale g B
            for (int c = 0; c < r; c++) {
                double s = 0;
                for (int o = 0; o < O; o++) s += fabs(g[(size_t)i * O + o] * B[(size_t)o * r + c]);
                mdax[(size_t)i * R + m * r + c] = scale * s;
            }
        free(B); free(out0); free(rout); free(gout); free(mo); free(to); free(g); free(gB0); free(rgB); free(ggB); free(tB);
        G->free(dB); G->free(dB16); G->free(dout); G->free(dg); G->free(dgB);
    }
    // dax: B rounded to bf16 and dax stored in bf16
    float *gdax = down_act(ddax, (size_t)N * R);
    double *tdax = tol_bf(rdax, mdax, 2 * U8 + acc32(OC[0]), (size_t)N * R);
    check_close("lora_up_backward dax (three members' columns)", gdax, rdax, tdax, (size_t)N * R);

    // the unit's down backward: dinp += dax A, dA += dax^T x with dax and A rounded: 3 roundings for
    // dinp (B's, dax's, A's; and the output's), 2 for dA
    float *din0 = randn_bf((size_t)N * C, 1.0f), *gA0 = randn((size_t)R * C, 0.1f);
    void *ddin = up_act(din0, (size_t)N * C), *dgA = up_hp(gA0, (size_t)R * C);
    float *rdin = fdup(din0, (size_t)N * C), *rgA = fdup(gA0, (size_t)R * C);
    G->lora_down_backward(ddin, dgA, ddax, dx, dA16, N, C, R);
    CPU->lora_down_backward(rdin, rgA, rdax, x, A, N, C, R);
    float *gdin = down_act(ddin, (size_t)N * C), *ggA = down_hp(dgA, (size_t)R * C);
    double *mdin = dmalloc_h((size_t)N * C), *tA = dmalloc_h((size_t)R * C);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int k = 0; k < R; k++) s += mdax[(size_t)i * R + k] * fabs(A[(size_t)k * C + c]);
            mdin[(size_t)i * C + c] = s;
        }
    double *tdin = tol_bf(rdin, mdin, 3 * U8 + acc32(OC[0]) + acc32(R), (size_t)N * C);
    check_close("lora_down_backward dinp +=", gdin, rdin, tdin, (size_t)N * C);
    for (int k = 0; k < R; k++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += mdax[(size_t)i * R + k] * fabs(x[(size_t)i * C + c]);
            tA[(size_t)k * C + c] = (2 * U8 + acc32(OC[0]) + acc32(N)) * s + 0x1p-22 * fabs(rgA[(size_t)k * C + c]);
        }
    check_close("lora_down_backward dA +=", ggA, rgA, tA, (size_t)R * C);
    G->free(dx); G->free(dA); G->free(dA16); G->free(dax); G->free(ddax); G->free(ddin); G->free(dgA);
    free(x); free(A); free(rax); free(gax); free(mx); free(tax); free(rdax); free(mdax); free(gdax); free(tdax);
    free(din0); free(gA0); free(rdin); free(rgA); free(gdin); free(ggA); free(mdin); free(tA); free(tdin);
}
END_TEST

// ---- norms, RoPE, elementwise, embeddings -------------------------------------------------

// p1: Gemma's norm, x / rms(x) * (1 + w) (rmsnorm1p_forward / backward), w around 0
static void rmsnorm_case(int N, int C, int alias, int with_dw, int p1 = 0) {
    float *x = randn_bf((size_t)N * C, 1.5f), *w = randn_bf(C, 1.0f);
    for (int i = 0; i < C; i++) w[i] = bfr((p1 ? 0.0f : 1.0f) + 0.2f * w[i]);
    void *dxin = up_act(x, (size_t)N * C), *dw = up_act(w, C), *drs = G->alloc((size_t)N * 4);
    void *dout = alias ? dxin : G->alloc((size_t)N * C * 2);
    float *ref = fmalloc((size_t)N * C), *rrs = fmalloc(N);
    if (p1) {
        rmsnorm1p_forward_cpu(ref, rrs, x, w, N, C, 1e-6f);
        G->rmsnorm1p_forward(dout, drs, dxin, dw, N, C, 1e-6f);
    } else {
        rmsnorm_forward_cpu(ref, rrs, x, w, N, C, 1e-6f);
        G->rmsnorm_forward(dout, drs, dxin, dw, N, C, 1e-6f);
    }
    float *got = down_act(dout, (size_t)N * C), *grs = down_hp(drs, N);
    double *t = tol_bf(ref, NULL, 0, (size_t)N * C), *trs = dmalloc_h(N);
    for (size_t i = 0; i < (size_t)N * C; i++) t[i] += acc32(C) * fabs(ref[i]);  // rstd from an fp32 sum of squares
    for (int i = 0; i < N; i++) trs[i] = acc32(C) * rrs[i];
    char what[96];
    const char *nm = p1 ? "rmsnorm1p" : "rmsnorm";
    snprintf(what, sizeof what, "%s_forward N %d C %d%s", nm, N, C, alias ? " (out = inp)" : "");
    check_close(what, got, ref, t, (size_t)N * C);
    snprintf(what, sizeof what, "%s_forward rstd N %d C %d", nm, N, C);
    check_close(what, grs, rrs, trs, N);
    free(got); free(grs); free(t); free(trs);
    if (alias) {  // restore the input
        G->free(dxin);
        dxin = up_act(x, (size_t)N * C);
    }
    // backward: dinp += ..., dw += ... (given the CPU's rstd, as the model saves it)
    float *dy = randn_bf((size_t)N * C, 1.0f), *din0 = randn_bf((size_t)N * C, 1.0f), *dw0 = randn(C, 1.0f);
    void *ddy = up_act(dy, (size_t)N * C), *ddin = up_act(din0, (size_t)N * C), *ddw = up_hp(dw0, C), *drs2 = up_hp(rrs, N);
    float *rdin = fdup(din0, (size_t)N * C), *rdw = fdup(dw0, C);
    if (p1) {
        G->rmsnorm1p_backward(ddin, with_dw ? ddw : NULL, ddy, dxin, dw, drs2, N, C);
        rmsnorm1p_backward_cpu(rdin, with_dw ? rdw : NULL, dy, x, w, rrs, N, C);
    } else {
        G->rmsnorm_backward(ddin, with_dw ? ddw : NULL, ddy, dxin, dw, drs2, N, C);
        rmsnorm_backward_cpu(rdin, with_dw ? rdw : NULL, dy, x, w, rrs, N, C);
    }
    float *gdin = down_act(ddin, (size_t)N * C);
    double *mag = dmalloc_h((size_t)N * C);
    for (int n = 0; n < N; n++) {
        double s = 0, r = rrs[n];
        for (int i = 0; i < C; i++) s += fabs((p1 + w[i]) * dy[(size_t)n * C + i] * x[(size_t)n * C + i]);
        for (int i = 0; i < C; i++)
            mag[(size_t)n * C + i] = r * fabs((p1 + w[i]) * dy[(size_t)n * C + i]) + r * r * r * s / C * fabs(x[(size_t)n * C + i]);
    }
    double *tb = tol_bf(rdin, mag, acc32(C), (size_t)N * C);
    snprintf(what, sizeof what, "%s_backward dinp += N %d C %d", nm, N, C);
    check_close(what, gdin, rdin, tb, (size_t)N * C);
    if (with_dw) {
        float *gdw = down_hp(ddw, C);
        double *tw = dmalloc_h(C);
        for (int i = 0; i < C; i++) {
            double s = fabs(dw0[i]);
            for (int n = 0; n < N; n++) s += fabs(dy[(size_t)n * C + i] * x[(size_t)n * C + i] * rrs[n]);
            tw[i] = acc32(N) * s;
        }
        snprintf(what, sizeof what, "%s_backward dw += N %d C %d", nm, N, C);
        check_close(what, gdw, rdw, tw, C);
        free(gdw); free(tw);
    }
    G->free(dxin); G->free(dw); G->free(drs); if (!alias) G->free(dout); G->free(ddy); G->free(ddin); G->free(ddw); G->free(drs2);
    free(x); free(w); free(ref); free(rrs); free(dy); free(din0); free(dw0); free(rdin); free(rdw); free(gdin); free(mag); free(tb);
}

START_TEST(test_norm_rope_elementwise) {
    rmsnorm_case(300, 1024, 0, 1);
    rmsnorm_case(301, 1024, 1, 0);
    rmsnorm_case(1000, 128, 0, 1);  // q/k-norm shape (rows of head_dim)
    rmsnorm_case(37, 100, 1, 1);    // C not a multiple of 8: the scalar path
    rmsnorm_case(64, 4096, 1, 0);   // decode (8B hidden): the row in registers, one row per block
    rmsnorm_case(300, 1152, 0, 1, 1);  // Gemma's x * (1 + w) at gemma-3-1b's hidden
    rmsnorm_case(1000, 256, 1, 1, 1);  // its q/k-norm shape (head_dim 256), in place
    rmsnorm_case(37, 100, 1, 1, 1);    // the scalar path
    rmsnorm_case(64, 2560, 1, 0, 1);   // Gemma-3-4B's decode: one row per block
    rmsnorm_case(40, 9216, 0, 1);   // C over NORM_ROW_MAXC: the loop over the row
    rmsnorm_case(3000, 1024, 0, 1); // many rows (training): the loops, 8 rows per block

    // one block per row (few rows) against the loops (many rows): bit for bit, rstd included (the same
    // sum of squares in the same order). C 1000: the last warp of a row part empty. Llama's norm, then
    // Gemma's (rmsnorm1p_forward) at 2560.
    const int rowC[4] = {1000, 1024, 4096, 2560};
    for (int vi = 0; vi < 4; vi++) {
        int Nm = 1100, Nr = 64, C = rowC[vi], p1 = vi == 3;
        float *x = randn_bf((size_t)Nm * C, 1.5f), *w = randn_bf(C, 1.0f);
        void *dx = up_act(x, (size_t)Nm * C), *dw = up_act(w, C), *om = G->alloc((size_t)Nm * C * 2);
        void *orow = G->alloc((size_t)Nr * C * 2), *rm = G->alloc(Nm * 4), *rr = G->alloc(Nr * 4);
        (p1 ? G->rmsnorm1p_forward : G->rmsnorm_forward)(om, rm, dx, dw, Nm, C, 1e-6f);
        (p1 ? G->rmsnorm1p_forward : G->rmsnorm_forward)(orow, rr, dx, dw, Nr, C, 1e-6f);
        float *a = down_act(om, (size_t)Nr * C), *b = down_act(orow, (size_t)Nr * C);
        check_exact("rmsnorm_forward, a block per row against the loops", a, b, (size_t)Nr * C * 4);
        free(a); free(b);
        a = down_hp(rm, Nr), b = down_hp(rr, Nr);
        check_exact("rmsnorm_forward rstd, a block per row against the loops", a, b, (size_t)Nr * 4);
        free(a); free(b); free(x); free(w);
        G->free(dx); G->free(dw); G->free(om); G->free(orow); G->free(rm); G->free(rr);
    }

    // the decode fusions against the GPU ops they replace: bit for bit (same roundings, same order)
    // (C 100: scalar kernels; 1000, 1024, 1152, 4096, 6400, 576: a block per row, C 1000 and 576 with a
    // partial last group, 1152 with a half-empty last warp; 9216: 16-byte loops); Llama's norm, and
    // Gemma's (1 + w) one (norm1p: add then rmsnorm1p_forward) at Gemma-3-4B's 2560 and two others
    const int fusedC[11] = {100, 1000, 1024, 1152, 4096, 6400, 9216, 576, 2560, 1152, 100};
    for (int vi = 0; vi < 11; vi++) {
        int Nf = 64, Cf = fusedC[vi], p1 = vi >= 8;
        float *x = randn_bf((size_t)Nf * Cf, 1.0f), *dxh = randn_bf((size_t)Nf * Cf, 1.0f), *w = randn_bf(Cf, 1.0f);
        void *x1 = up_act(x, (size_t)Nf * Cf), *x2 = up_act(x, (size_t)Nf * Cf), *ddx = up_act(dxh, (size_t)Nf * Cf);
        void *dw = up_act(w, Cf), *o1 = G->alloc((size_t)Nf * Cf * 2), *o2 = G->alloc((size_t)Nf * Cf * 2);
        void *r1 = G->alloc(Nf * 4), *r2 = G->alloc(Nf * 4);
        // with the FP8 copy of out: none, per token, 1x128 groups (C 100: one partial group)
        for (int qi = 0; qi < 3; qi++) {
            FP8Tensor oq;
            if (qi) fp8_device_tensor(&oq, Nf, Cf, qi == 1 ? FP8_ROW : FP8_BLOCK);
            G->upload_convert(x1, DT_BF16, x, DT_F32, (size_t)Nf * Cf);
            G->upload_convert(x2, DT_BF16, x, DT_F32, (size_t)Nf * Cf);
            G->add_rmsnorm(x1, o1, r1, ddx, dw, Nf, Cf, 1e-6f, p1, qi ? &oq : NULL);
            G->add(x2, x2, ddx, (size_t)Nf * Cf);
            if (p1) G->rmsnorm1p_forward(o2, r2, x2, dw, Nf, Cf, 1e-6f);
            else G->rmsnorm_forward(o2, r2, x2, dw, Nf, Cf, 1e-6f);
            float *a = down_act(x1, (size_t)Nf * Cf), *b = down_act(x2, (size_t)Nf * Cf);
            char what[96];
            snprintf(what, sizeof what, "add_rmsnorm%s x (C %d)", p1 ? " norm1p" : "", Cf);
            check_exact(what, a, b, (size_t)Nf * Cf * 4);
            free(a); free(b);
            a = down_act(o1, (size_t)Nf * Cf), b = down_act(o2, (size_t)Nf * Cf);
            snprintf(what, sizeof what, "add_rmsnorm%s out (C %d)", p1 ? " norm1p" : "", Cf);
            check_exact(what, a, b, (size_t)Nf * Cf * 4);
            free(a); free(b);
            if (qi) {
                snprintf(what, sizeof what, "add_rmsnorm%s's FP8 copy, %s (C %d)", p1 ? " norm1p" : "", qi == 1 ? "ROW" : "BLOCK", Cf);
                check_fp8_copy(what, &oq, o2);
                fp8_device_tensor_free(&oq);
            }
        }
        free(x); free(dxh); free(w);
        G->free(x1); G->free(x2); G->free(ddx); G->free(dw); G->free(o1); G->free(o2); G->free(r1); G->free(r2);
    }

    // glu_gu (SwiGLU or GeGLU from the fused gate|up product) and glu_forward_q (from the two halves) against
    // swiglu_forward / geglu_forward of the two halves, and their FP8 copies against fp8_quantize_cuda: bit for bit (FF 100: a partial 128-group;
    // 3072: 0.6B's; 10240: Gemma-3-4B's)
    const int ffs[4] = {100, 3072, 12288, 10240};
    for (int fi = 0; fi < 4; fi++) {
        int Ng = 37, FF = ffs[fi], gelu = fi == 3 || fi == 0;
        float *gu = randn_bf((size_t)Ng * 2 * FF, 2.0f), *gh = fmalloc((size_t)Ng * FF), *uh = fmalloc((size_t)Ng * FF);
        for (int r = 0; r < Ng; r++) {
            memcpy(gh + (size_t)r * FF, gu + (size_t)r * 2 * FF, FF * 4);
            memcpy(uh + (size_t)r * FF, gu + (size_t)r * 2 * FF + FF, FF * 4);
        }
        void *dgu = up_act(gu, (size_t)Ng * 2 * FF), *dg = up_act(gh, (size_t)Ng * FF), *du = up_act(uh, (size_t)Ng * FF);
        void *o1 = G->alloc((size_t)Ng * FF * 2), *o2 = G->alloc((size_t)Ng * FF * 2);
        if (gelu) G->geglu_forward(o2, dg, du, (size_t)Ng * FF);
        else G->swiglu_forward(o2, dg, du, (size_t)Ng * FF);
        float *b = down_act(o2, (size_t)Ng * FF);
        for (int qi = 0; qi < 3; qi++) {
            FP8Tensor oq;
            if (qi) fp8_device_tensor(&oq, Ng, FF, qi == 1 ? FP8_ROW : FP8_BLOCK);
            G->zero(o1, (size_t)Ng * FF * 2);
            G->glu_gu(o1, qi ? &oq : NULL, dgu, Ng, FF, gelu);
            float *a = down_act(o1, (size_t)Ng * FF);
            char what[96];
            snprintf(what, sizeof what, "glu_gu = %s_forward (FF %d, copy %d)", gelu ? "geglu" : "swiglu", FF, qi);
            check_exact(what, a, b, (size_t)Ng * FF * 4);
            free(a);
            if (qi) {
                snprintf(what, sizeof what, "glu_gu's FP8 copy, %s (FF %d, gelu %d)", qi == 1 ? "ROW" : "BLOCK", FF, gelu);
                check_fp8_copy(what, &oq, o2);
                // glu_forward_q, the same from the separate halves (fused at FF % 16 == 0 with BLOCK)
                G->zero(o1, (size_t)Ng * FF * 2);
                G->zero(oq.data, (size_t)Ng * FF);  // glu_gu's copy gone: what is compared is glu_forward_q's
                G->zero(oq.scale, fp8_num_scales(oq.gran, Ng, FF, 1) * 4);
                G->glu_forward_q(o1, &oq, dg, du, Ng, FF, gelu);
                a = down_act(o1, (size_t)Ng * FF);
                snprintf(what, sizeof what, "glu_forward_q = %s_forward (FF %d, %s)", gelu ? "geglu" : "swiglu", FF, qi == 1 ? "ROW" : "BLOCK");
                check_exact(what, a, b, (size_t)Ng * FF * 4);
                free(a);
                snprintf(what, sizeof what, "glu_forward_q's FP8 copy, %s (FF %d, gelu %d)", qi == 1 ? "ROW" : "BLOCK", FF, gelu);
                check_fp8_copy(what, &oq, o2);
                fp8_device_tensor_free(&oq);
            }
        }
        free(b); free(gu); free(gh); free(uh);
        G->free(dgu); G->free(dg); G->free(du); G->free(o1); G->free(o2);
    }

    // RoPE on (N, H, HD) with positions up to 5000; backward = rotation by -angle
    int N = 97, H = 6, HD = 128;
    size_t n = (size_t)N * H * HD;
    int32_t *pos = (int32_t *)mallocCheck(N * 4);
    for (int i = 0; i < N; i++) pos[i] = (i * 53) % 5000;
    float *inv = fmalloc(HD / 2);
    for (int i = 0; i < HD / 2; i++) inv[i] = 1.0f / powf(1e6f, (float)(2 * i) / HD);
    float *x = randn_bf(n, 1.0f);
    void *dx = up_act(x, n), *dpos = up_i32(pos, N), *dinv = up_hp(inv, HD / 2);
    for (int inverse = 0; inverse < 2; inverse++) {
        float *ref = fdup(x, n);
        rope_forward_cpu(ref, pos, inv, N, H, HD, inverse);
        void *d = up_act(x, n);
        if (inverse) G->rope_backward(d, (const int32_t *)dpos, dinv, N, H, HD);
        else G->rope_forward(d, (const int32_t *)dpos, dinv, N, H, HD);
        float *got = down_act(d, n);
        double *mag = dmalloc_h(n);
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++)
                for (int j = 0; j < HD; j++) {
                    size_t b = ((size_t)i * H + h) * HD;
                    mag[b + j] = fabs(x[b + j % (HD / 2)]) + fabs(x[b + HD / 2 + j % (HD / 2)]);
                }
        double *t = tol_bf(ref, mag, 0x1p-20, n);  // fp32 rotation of fp64 cos/sin
        check_close(inverse ? "rope_backward (N 97, H 6, HD 128)" : "rope_forward (N 97, H 6, HD 128)", got, ref, t, n);
        G->free(d); free(ref); free(got); free(mag); free(t);
    }
    G->free(dx); G->free(dpos); G->free(dinv); free(x); free(pos); free(inv);

    // swiglu, add (with aliasing), odd lengths for the scalar tail
    size_t m = 100005;
    float *gt = randn_bf(m, 2.0f), *up = randn_bf(m, 1.0f), *dout = randn_bf(m, 1.0f);
    void *dg = up_act(gt, m), *du = up_act(up, m), *dd = up_act(dout, m), *o1 = G->alloc(m * 2), *o2 = G->alloc(m * 2);
    float *r1 = fmalloc(m), *r2 = fmalloc(m);
    // SwiGLU, then GeGLU (Gemma 3: gelu_tanh(gate) * up): expf / tanhf against exp / tanh, fp32 against
    // fp64 (2^-20 of the magnitude)
    double *mag = dmalloc_h(m);
    for (int gelu = 0; gelu < 2; gelu++) {
        const char *nm = gelu ? "geglu" : "swiglu";
        char what[64];
        (gelu ? geglu_forward_cpu : swiglu_forward_cpu)(r1, gt, up, m);
        (gelu ? G->geglu_forward : G->swiglu_forward)(o1, dg, du, m);
        float *g1 = down_act(o1, m);
        for (size_t i = 0; i < m; i++) mag[i] = fabs(gt[i] * up[i]);
        double *t = tol_bf(r1, mag, 0x1p-20, m);
        snprintf(what, sizeof what, "%s_forward (n %zu)", nm, m);
        check_close(what, g1, r1, t, m);
        free(g1); free(t);
        (gelu ? geglu_backward_cpu : swiglu_backward_cpu)(r1, r2, dout, gt, up, m);
        (gelu ? G->geglu_backward : G->swiglu_backward)(o1, o2, dd, dg, du, m);
        g1 = down_act(o1, m);
        float *g2 = down_act(o2, m);
        // |d act(g)/dg| is at most 1 + |g| for silu, 1 + |g| (1 + 0.14 g^2) for gelu_tanh
        for (size_t i = 0; i < m; i++)
            mag[i] = fabs(dout[i] * up[i]) * (1 + fabs(gt[i]) * (gelu ? 1 + 0.14 * gt[i] * gt[i] : 1));
        t = tol_bf(r1, mag, 0x1p-20, m);
        snprintf(what, sizeof what, "%s_backward dgate", nm);
        check_close(what, g1, r1, t, m);
        free(t);
        for (size_t i = 0; i < m; i++) mag[i] = fabs(dout[i] * gt[i]);
        t = tol_bf(r2, mag, 0x1p-20, m);
        snprintf(what, sizeof what, "%s_backward dup", nm);
        check_close(what, g2, r2, t, m);
        free(g1); free(g2); free(t);
    }
    float *g1;
    double *t;
    // scale_act (Gemma's embeddings times sqrt(C), bf16-rounded 34 for C 1152): the fp32 product rounded once
    {
        float sc = bfr(sqrtf(1152.0f));
        void *dx = up_act(gt, m);
        G->scale_act(dx, m, sc);
        for (size_t i = 0; i < m; i++) r1[i] = bfr(gt[i] * sc);
        g1 = down_act(dx, m);
        check_exact("scale_act (n 100005, by 34)", g1, r1, m * 4);
        free(g1);
        G->free(dx);
    }
    add_cpu(r1, gt, up, m);
    G->add(dg, dg, du, m);  // out aliases a
    g1 = down_act(dg, m);
    for (size_t i = 0; i < m; i++) mag[i] = fabs(gt[i]) + fabs(up[i]);
    t = tol_bf(r1, mag, 0x1p-22, m);  // bf16(fp32 sum): rounding once, or twice when the fp32 sum is inexact
    check_close("add (out = a)", g1, r1, t, m);
    free(g1); free(t);
    G->free(dg); G->free(du); G->free(dd); G->free(o1); G->free(o2);
    free(gt); free(up); free(dout); free(r1); free(r2); free(mag);

    // embeddings and gather (exact), embedding backward with repeated ids (same fp32 order: exact)
    int V = 1000, C = 264, NT = 3000;
    float *wte = randn_bf((size_t)V * C, 1.0f), *dE = randn_bf((size_t)NT * C, 1.0f), *acc0 = randn((size_t)V * C, 1.0f);
    int32_t *ids = (int32_t *)mallocCheck(NT * 4);
    for (int i = 0; i < NT; i++) ids[i] = i % 7 == 0 ? 5 : (int)(rng_u64(&rng) % 200) * 5;  // many repeats
    void *dwte = up_act(wte, (size_t)V * C), *dids = up_i32(ids, NT), *dE_ = up_act(dE, (size_t)NT * C);
    void *demb = G->alloc((size_t)NT * C * 2), *dacc = up_hp(acc0, (size_t)V * C);
    QWeight qwte = {V, C, FP8_OFF};
    qwte.dense = dwte;
    G->embedding_forward(demb, (const int32_t *)dids, &qwte, NT);
    float *ge = down_act(demb, (size_t)NT * C), *re = fmalloc((size_t)NT * C);
    embedding_forward_cpu(re, ids, wte, NT, C);
    check_exact("embedding_forward", ge, re, (size_t)NT * C * 4);
    G->gather_rows(demb, dwte, (const int32_t *)dids, 500, C);
    free(ge);
    ge = down_act(demb, (size_t)500 * C);
    gather_rows_cpu(re, wte, ids, 500, C);
    check_exact("gather_rows", ge, re, (size_t)500 * C * 4);
    G->embedding_backward(dacc, (const int32_t *)dids, dE_, NT, C);
    float *ga = down_hp(dacc, (size_t)V * C), *ra = fdup(acc0, (size_t)V * C);
    embedding_backward_cpu(ra, ids, dE, NT, C);
    check_exact("embedding_backward (repeated ids, CPU order)", ga, ra, (size_t)V * C * 4);
    G->free(dwte); G->free(dids); G->free(dE_); G->free(demb); G->free(dacc);
    free(wte); free(dE); free(acc0); free(ids); free(ge); free(re); free(ga); free(ra);
}
END_TEST

// ---- attention ----------------------------------------------------------------------

// fp64 magnitudes for the tolerances: p = exp(sc q.k - lse) from the reference lse
typedef struct { double *out, *dq, *dk, *dv; } AttMag;

static AttMag att_magnitudes(const float *q, const float *k, const float *v, const float *dout, const float *out,
                             const float *lse, int B, int T, int NH, int KVH, int HD, double sc, int window) {
    AttMag m;
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * KVH * HD;
    m.out = dmalloc_h(nq); m.dq = dmalloc_h(nq); m.dk = dmalloc_h(nk); m.dv = dmalloc_h(nk);
    int rep = NH / KVH;
    double *p = dmalloc_h(T), *dp = dmalloc_h(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *qv = q + (((size_t)b * T + t) * NH + h) * HD, *dov = dout + (((size_t)b * T + t) * NH + h) * HD;
                const float *ov = out + (((size_t)b * T + t) * NH + h) * HD;
                double L = lse[((size_t)b * NH + h) * T + t], D = 0;
                for (int d = 0; d < HD; d++) D += (double)dov[d] * ov[d];
                int s0 = window > 0 && t >= window ? t - window + 1 : 0;  // the keys query t sees
                for (int s = s0; s <= t; s++) {
                    const float *kv = k + (((size_t)b * T + s) * KVH + h / rep) * HD, *vv = v + (((size_t)b * T + s) * KVH + h / rep) * HD;
                    double qk = 0, dv_ = 0;
                    for (int d = 0; d < HD; d++) { qk += (double)qv[d] * kv[d]; dv_ += (double)dov[d] * vv[d]; }
                    p[s] = exp(sc * qk - L);
                    dp[s] = p[s] * (fabs(dv_) + fabs(D));  // bounds |dS| and its error sources
                }
                for (int s = s0; s <= t; s++) {
                    const float *kv = k + (((size_t)b * T + s) * KVH + h / rep) * HD, *vv = v + (((size_t)b * T + s) * KVH + h / rep) * HD;
                    size_t kr = (((size_t)b * T + s) * KVH + h / rep) * HD, qr = (((size_t)b * T + t) * NH + h) * HD;
                    for (int d = 0; d < HD; d++) {
                        m.out[qr + d] += p[s] * fabs(vv[d]);
                        m.dq[qr + d] += sc * dp[s] * fabs(kv[d]);
                        m.dk[kr + d] += sc * dp[s] * fabs(qv[d]);
                        m.dv[kr + d] += p[s] * fabs(dov[d]);
                    }
                }
            }
    free(p); free(dp);
    return m;
}

// sc: the softmax scale (0: 1 / sqrt(HD)); window > 0: sliding-window attention
static void attention_case(int B, int T, int NH, int KVH, int HD, double sc = 0, int window = 0) {
    if (sc == 0) sc = 1.0 / sqrt((double)HD);
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * KVH * HD, nl = (size_t)B * NH * T;
    float *q = randn_bf(nq, 1.0f), *k = randn_bf(nk, 1.0f), *v = randn_bf(nk, 1.0f), *dout = randn_bf(nq, 1.0f);
    // a few large scores so the online softmax has to rescale
    for (size_t i = 0; i < nq; i += 97) q[i] = bfr(q[i] * 4);
    float *out = fmalloc(nq), *lse = fmalloc(nl);
    attention_forward_cpu(out, lse, q, k, v, B, T, NH, KVH, HD, sc, window);
    void *dq = up_act(q, nq), *dk = up_act(k, nk), *dv = up_act(v, nk), *dout_ = up_act(dout, nq);
    void *dO = G->alloc(nq * 2), *dL = G->alloc(nl * 4);
    G->attention_forward(dO, dL, dq, dk, dv, B, T, NH, KVH, HD, sc, window);
    float *gO = down_act(dO, nq), *gL = down_hp(dL, nl);
    for (size_t i = 0; i < nq; i++) out[i] = bfr(out[i]);  // what the GPU holds (the backward's input)
    AttMag m = att_magnitudes(q, k, v, dout, out, lse, B, T, NH, KVH, HD, sc, window);
    // out: P rounded to bf16 for P V (2^-8 sum p |v|), bf16 output; 2^-7 leaves a factor 2 for
    // the online rescaling and exp2f
    double *t = tol_bf(out, m.out, 0x1p-7, nq), *tl = dmalloc_h(nl);
    char what[128], cfg[64] = "";
    if (window || fabs(sc * sqrt((double)HD) - 1) > 1e-12) snprintf(cfg, sizeof cfg, " (scale %.3g, window %d)", sc, window);
    snprintf(what, sizeof what, "attention_forward B %d T %d NH %d KVH %d HD %d%s", B, T, NH, KVH, HD, cfg);
    check_close(what, gO, out, t, nq);
    for (size_t i = 0; i < nl; i++) tl[i] = 0x1p-16 * (1 + fabs(lse[i]));  // fp32 scores, logf
    snprintf(what, sizeof what, "attention_forward lse B %d T %d HD %d", B, T, HD);
    check_close(what, gL, lse, tl, nl);
    free(t);
    // backward from the reference's out and lse
    float *rdq = fmalloc(nq), *rdk = fmalloc(nk), *rdv = fmalloc(nk);
    attention_backward_cpu(rdq, rdk, rdv, dout, out, lse, q, k, v, B, T, NH, KVH, HD, sc, window);
    void *dO2 = up_act(out, nq), *dL2 = up_hp(lse, nl), *gdq = G->alloc(nq * 2), *gdk = G->alloc(nk * 2), *gdv = G->alloc(nk * 2);
    G->attention_backward(gdq, gdk, gdv, dout_, dO2, dL2, dq, dk, dv, B, T, NH, KVH, HD, sc, window);
    float *hdq = down_act(gdq, nq), *hdk = down_act(gdk, nk), *hdv = down_act(gdv, nk);
    // P (dV) and dS (dQ, dK) are rounded to bf16 for their products: 2^-8 of the magnitude, x2
    t = tol_bf(rdq, m.dq, 0x1p-7, nq);
    snprintf(what, sizeof what, "attention_backward dq B %d T %d NH %d KVH %d HD %d%s", B, T, NH, KVH, HD, cfg);
    check_close(what, hdq, rdq, t, nq);
    free(t);
    t = tol_bf(rdk, m.dk, 0x1p-7, nk);
    snprintf(what, sizeof what, "attention_backward dk B %d T %d NH %d KVH %d HD %d%s", B, T, NH, KVH, HD, cfg);
    check_close(what, hdk, rdk, t, nk);
    free(t);
    t = tol_bf(rdv, m.dv, 0x1p-7, nk);
    snprintf(what, sizeof what, "attention_backward dv B %d T %d NH %d KVH %d HD %d%s", B, T, NH, KVH, HD, cfg);
    check_close(what, hdv, rdv, t, nk);
    free(t);
    G->free(dq); G->free(dk); G->free(dv); G->free(dout_); G->free(dO); G->free(dL); G->free(dO2); G->free(dL2);
    G->free(gdq); G->free(gdk); G->free(gdv);
    free(q); free(k); free(v); free(dout); free(out); free(lse); free(gO); free(gL); free(tl); free(rdq); free(rdk); free(rdv);
    free(hdq); free(hdk); free(hdv); free(m.out); free(m.dq); free(m.dk); free(m.dv);
}

START_TEST(test_attention) {
    // head dims 64 and 128 on Hopper: the wgmma kernels, then the mma.sync ones (what other GPUs run)
    for (int hopper = 1; hopper >= 0; hopper--) {
        attention_set_hopper(hopper);
        printf("  attention by the %s kernels where they run:\n", hopper ? "Hopper (wgmma)" : "mma.sync");
        attention_case(2, 130, 4, 2, 64);   // GQA 2, T not a multiple of the 64 tile
        attention_case(1, 257, 8, 2, 128);  // GQA 4, HD 128
        attention_case(2, 64, 4, 4, 128);   // MHA, exactly one tile
        // sliding windows: key blocks skipped before the window and masked inside it, a window that is
        // not a multiple of the 64 tiles, one shorter than a tile; Gemma 3 27B's scale (168^-0.5 at HD 128)
        attention_case(2, 300, 4, 2, 64, 0, 100);
        attention_case(1, 257, 8, 2, 128, 1.0 / sqrt(168.0), 40);
        attention_case(1, 200, 4, 1, 128, 0, 1);  // every query sees itself only
    }
    attention_set_hopper(1);
    attention_case(2, 50, 4, 2, 32);    // the fixtures' Qwen3 head dim
    attention_case(1, 33, 4, 1, 16);    // the fixtures' Qwen2 / Llama head dim, one kv head
    attention_case(2, 45, 6, 3, 48);    // an even head dim without a tensor-core kernel
    attention_case(2, 24, 4, 2, 32, 0, 8);                 // the Mistral fixture's window
    attention_case(2, 24, 4, 1, 32, 1.0 / sqrt(24.0), 6);  // the Gemma 3 fixture's scale and window
    attention_case(2, 45, 6, 3, 48, 0, 7);                 // the scalar kernels with a window
    // Gemma 3 1B/4B's head dim 256: mma.sync where shared memory allows (Hopper), else the scalar kernels
    attention_case(1, 70, 4, 1, 256, 0.0625, 20);
    attention_case(2, 300, 8, 4, 256, 0.0625, 100);  // gemma-3-4b's heads: 8 / 4 x 256, a 100-key window
    attention_case(1, 257, 4, 2, 256);
    // right padding: the real tokens' outputs do not depend on what the padding holds
    int B = 2, T = 100, NH = 4, KVH = 2, HD = 128, len = 61;
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * KVH * HD;
    float *q = randn_bf(nq, 1.0f), *k = randn_bf(nk, 1.0f), *v = randn_bf(nk, 1.0f);
    void *dq = up_act(q, nq), *dk = up_act(k, nk), *dv = up_act(v, nk), *dO = G->alloc(nq * 2), *dL = G->alloc((size_t)B * NH * T * 4);
    G->attention_forward(dO, dL, dq, dk, dv, B, T, NH, KVH, HD, 1.0 / sqrt((double)HD), 0);
    float *o1 = down_act(dO, nq);
    for (int b = 0; b < B; b++)
        for (int t = len; t < T; t++) {
            for (int i = 0; i < NH * HD; i++) q[((size_t)b * T + t) * NH * HD + i] = bfr(5 * rng_normal(&rng));
            for (int i = 0; i < KVH * HD; i++) {
                k[((size_t)b * T + t) * KVH * HD + i] = bfr(5 * rng_normal(&rng));
                v[((size_t)b * T + t) * KVH * HD + i] = bfr(5 * rng_normal(&rng));
            }
        }
    G->free(dq); G->free(dk); G->free(dv);
    dq = up_act(q, nq); dk = up_act(k, nk); dv = up_act(v, nk);
    G->attention_forward(dO, dL, dq, dk, dv, B, T, NH, KVH, HD, 1.0 / sqrt((double)HD), 0);
    float *o2 = down_act(dO, nq);
    long diff = 0;
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < (size_t)len * NH * HD; i++) diff += o1[(size_t)b * T * NH * HD + i] != o2[(size_t)b * T * NH * HD + i];
    ck_assert_msg(diff == 0, "right padding changed %ld outputs of real tokens", diff);
    printf("  %-52s real tokens unchanged by padding content\n", "attention_forward right-padded (len 61 of 100)");
    G->free(dq); G->free(dk); G->free(dv); G->free(dO); G->free(dL);
    free(q); free(k); free(v); free(o1); free(o2);
}
END_TEST

// ---- KV cache and decode ----------------------------------------------------------------

// fp8: the cache holds E4M3 codes with a scale per (slot, head): kv_write must give the CPU's codes
// and scales bit for bit, and attention reads them as the CPU does (the same tolerance, on the
// dequantized values)
// window > 0: sliding-window attention (the cache keeps every token; those before the window are masked)
static void decode_case(int S, int NH, int KVH, int HD, int BS, int MB, const int *lens, int fp8, int window = 0) {
    const double scale = window ? 1.0 / sqrt(2.0 * HD) : 1.0 / sqrt((double)HD);  // windowed cases: another scale too
    int NB = S * MB + 3;
    size_t row = (size_t)KVH * HD, ncache = (size_t)NB * BS * row, nsc = (size_t)NB * BS * KVH;
    size_t cb = fp8 ? ncache : ncache * 4;  // host cache bytes: codes, or f32 values
    int32_t *table = (int32_t *)mallocCheck((size_t)S * MB * 4);
    // blocks in a shuffled order
    int *perm = (int *)mallocCheck(NB * sizeof(int));
    for (int i = 0; i < NB; i++) perm[i] = i;
    for (int i = NB - 1; i > 0; i--) { int j = (int)(rng_u64(&rng) % (i + 1)), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (int i = 0; i < S * MB; i++) table[i] = perm[i];
    // the cache's earlier tokens: values (bf16-exact), or codes and scales of random values
    float *kf = randn_bf(ncache, 1.0f), *vf = randn_bf(ncache, 1.0f);
    void *kc = kf, *vc = vf, *dkc, *dvc;
    float *ks = NULL, *vs = NULL, *dks = NULL, *dvs = NULL;
    if (fp8) {
        kc = mallocCheck(ncache), vc = mallocCheck(ncache);
        ks = fmalloc(nsc), vs = fmalloc(nsc);
        int32_t *all = (int32_t *)mallocCheck(NB * BS * 4);
        for (int i = 0; i < NB * BS; i++) all[i] = i;
        kv_write_cpu(kc, vc, ks, vs, kf, vf, all, NB * BS, KVH, HD);
        free(all);
        dks = (float *)up_hp(ks, nsc), dvs = (float *)up_hp(vs, nsc);
        dkc = G->alloc(ncache), dvc = G->alloc(ncache);
        G->upload(dkc, kc, ncache), G->upload(dvc, vc, ncache);
    } else {
        dkc = up_act(kf, ncache), dvc = up_act(vf, ncache);
    }
    // kv_write: one new token per sequence at its last position; a slot of -1 is skipped
    float *kn = randn_bf((size_t)S * row, 1.0f), *vn = randn_bf((size_t)S * row, 1.0f);
    int32_t *slots = (int32_t *)mallocCheck(S * 4), *sl = (int32_t *)mallocCheck(S * 4);
    for (int s = 0; s < S; s++) {
        int t = lens[s] - 1;
        slots[s] = s == 1 ? -1 : table[s * MB + t / BS] * BS + t % BS;
        sl[s] = lens[s];
    }
    void *dkn = up_act(kn, (size_t)S * row), *dvn = up_act(vn, (size_t)S * row), *dslots = up_i32(slots, S);
    G->kv_write(dkc, dvc, dks, dvs, dkn, dvn, (const int32_t *)dslots, S, KVH, HD);
    kv_write_cpu(kc, vc, ks, vs, kn, vn, slots, S, KVH, HD);
    void *gk, *gv;
    if (fp8) {
        gk = mallocCheck(ncache), gv = mallocCheck(ncache);
        G->download(gk, dkc, ncache), G->download(gv, dvc, ncache);
        float *gks = down_hp(dks, nsc), *gvs = down_hp(dvs, nsc);
        check_exact("kv_write fp8 k scales", gks, ks, nsc * 4);
        check_exact("kv_write fp8 v scales", gvs, vs, nsc * 4);
        free(gks), free(gvs);
    } else {
        gk = down_act(dkc, ncache), gv = down_act(dvc, ncache);
    }
    check_exact(fp8 ? "kv_write fp8 k codes" : "kv_write k", gk, kc, cb);
    check_exact(fp8 ? "kv_write fp8 v codes" : "kv_write v", gv, vc, cb);
    size_t nq = (size_t)S * NH * HD;
    float *q = randn_bf(nq, 1.0f), *ref = fmalloc(nq);
    void *dq = up_act(q, nq), *dt = up_i32(table, (size_t)S * MB), *dl = up_i32(sl, S), *dout = G->alloc(nq * 2);
    attention_decode_cpu(ref, q, kc, vc, ks, vs, table, sl, S, NH, KVH, HD, BS, MB, scale, window);
    // sum p |v| per output (v as the kernels read it: dequantized for fp8), for the tolerances
    double *mag = dmalloc_h(nq), sc = scale;
    int rep = NH / KVH;
    double *p = dmalloc_h(MB * BS);
    auto val = [&](const void *c, const float *scl, size_t slot, int kh, int i) -> double {
        size_t r = slot * KVH + kh;
        if (!scl) return ((const float *)c)[r * HD + i];
        return (double)(fp8_e4m3_decode(((const uint8_t *)c)[r * HD + i]) * scl[r]);
    };
    for (int s = 0; s < S; s++)
        for (int h = 0; h < NH; h++) {
            double mx = -INFINITY, sum = 0;
            int t0 = window > 0 && sl[s] > window ? sl[s] - window : 0;
            for (int t = t0; t < sl[s]; t++) {
                size_t slot = (size_t)table[s * MB + t / BS] * BS + t % BS;
                double d = 0;
                for (int i = 0; i < HD; i++) d += (double)q[((size_t)s * NH + h) * HD + i] * val(kc, ks, slot, h / rep, i);
                p[t] = sc * d;
                mx = fmax(mx, p[t]);
            }
            for (int t = t0; t < sl[s]; t++) sum += (p[t] = exp(p[t] - mx));
            for (int t = t0; t < sl[s]; t++) {
                size_t slot = (size_t)table[s * MB + t / BS] * BS + t % BS;
                for (int i = 0; i < HD; i++) mag[((size_t)s * NH + h) * HD + i] += p[t] / sum * fabs(val(vc, vs, slot, h / rep, i));
            }
        }
    // both kernels where the tensor-core one runs (HD 64, 128; up to 16 query heads a kv head), else the other
    const int has_mma = (HD == 64 || HD == 128) && rep <= 16;
    for (int mma = has_mma; mma >= 0; mma--) {
        attention_decode_set_mma(mma);
        G->attention_decode(dout, dq, dkc, dvc, dks, dvs, (const int32_t *)dt, (const int32_t *)dl, S, NH, KVH, HD, BS, MB,
                            scale, window, NULL);
        float *got = down_act(dout, nq);
        // with out's FP8 copy (the o projection's input): out unchanged bit for bit, the copy fp8_quantize_cuda's
        // (BLOCK in the same launch where HD % 128 == 0, else and for ROW a pass of its own)
        for (int qi = 0; qi < 2; qi++) {
            FP8Tensor oq;
            fp8_device_tensor(&oq, S, NH * HD, qi ? FP8_BLOCK : FP8_ROW);
            void *dout2 = G->alloc(nq * 2);
            G->attention_decode(dout2, dq, dkc, dvc, dks, dvs, (const int32_t *)dt, (const int32_t *)dl, S, NH, KVH, HD, BS,
                                MB, scale, window, &oq);
            float *got2 = down_act(dout2, nq);
            check_exact("attention_decode's out with its FP8 copy", got2, got, nq * 4);
            check_fp8_copy(qi ? "attention_decode's FP8 copy, BLOCK" : "attention_decode's FP8 copy, ROW", &oq, dout2);
            free(got2);
            G->free(dout2);
            fp8_device_tensor_free(&oq);
        }
        // output rounding + a relative bound on sum p |v|: 2^-12 for the fp32 kernels (their sums and
        // exponentials); the tensor-core kernel rounds each p to bf16 for its P V product (an FP8 cache's
        // p times V's scale to f16, 2^-11: within the same bound), 2^-9 of each term, doubled for its fp32
        // sums and exponentials: 2^-8
        double *t = tol_bf(ref, mag, mma ? 0x1p-8 : 0x1p-12, nq);
        char what[200];
        snprintf(what, sizeof what, "attention_decode%s S %d NH %d KVH %d HD %d BS %d (max len %d)%s, %s kernel",
                 fp8 ? " fp8 cache" : "", S, NH, KVH, HD, BS, MB * BS, window ? " window" : "", mma ? "tensor-core" : "fp32");
        check_close(what, got, ref, t, nq);
        free(got);
        free(t);
    }
    attention_decode_set_mma(-1);
    G->free(dkc); G->free(dvc); G->free(dkn); G->free(dvn); G->free(dslots); G->free(dq); G->free(dt); G->free(dl); G->free(dout);
    if (fp8) { G->free(dks); G->free(dvs); free(kc); free(vc); free(ks); free(vs); }
    free(table); free(perm); free(kf); free(vf); free(kn); free(vn); free(slots); free(sl); free(gk); free(gv); free(q);
    free(ref); free(mag); free(p);
}

// the q|k|v epilogue (qkv_rope_kv) against the plain ops it replaces: the columns split, rmsnorm_forward per
// head, rope_forward, kv_write, bit for bit (q, k, the cache's codes / values and scales), bf16 and FP8
// caches, with and without the q/k norms (norm 1: rmsnorm_forward, 2: Gemma's rmsnorm1p_forward), a skipped
// slot (-1). Two layouts of its inputs: the column
// blocks of one fused q|k|v output (parts 0), and three buffers with q normed in place (parts 1).
static void qkv_rope_kv_case(int S, int NH, int KVH, int HD, int norm, int fp8, int parts) {
    int H = NH + 2 * KVH, NSL = 4 * S;
    size_t nf = (size_t)S * H * HD, nq = (size_t)S * NH * HD, nk = (size_t)S * KVH * HD;
    size_t esz = fp8 ? 1 : 2, cb = (size_t)NSL * KVH * HD * esz, nsc = (size_t)NSL * KVH;
    float *f = randn_bf(nf, 1.5f), *qw = randn_bf(HD, 1.0f), *kw = randn_bf(HD, 1.0f), *invf = fmalloc(HD / 2);
    for (int i = 0; i < HD / 2; i++) invf[i] = 1.0f / powf(1e6f, (float)(2 * i) / HD);
    int32_t *pos = (int32_t *)mallocCheck(S * 4), *slots = (int32_t *)mallocCheck(S * 4);
    for (int i = 0; i < S; i++) { pos[i] = (i * 37) % 500; slots[i] = i == 1 ? -1 : (i * 3 + 1) % NSL; }
    void *dqkv = up_act(f, nf), *dqw = norm ? up_act(qw, HD) : NULL, *dkw = norm ? up_act(kw, HD) : NULL;
    void *dinv = up_hp(invf, HD / 2), *dpos = up_i32(pos, S), *dsl = up_i32(slots, S);
    void *q1 = G->alloc(nq * 2), *k1 = G->alloc(nk * 2), *q2 = G->alloc(nq * 2), *k2 = G->alloc(nk * 2), *v2 = G->alloc(nk * 2);
    void *kin = G->alloc(nk * 2), *vin = G->alloc(nk * 2), *rs = G->alloc((size_t)S * NH * 4);
    void *kc1 = G->alloc(cb), *vc1 = G->alloc(cb), *kc2 = G->alloc(cb), *vc2 = G->alloc(cb);
    float *ks1 = fp8 ? (float *)G->alloc(nsc * 4) : NULL, *vs1 = fp8 ? (float *)G->alloc(nsc * 4) : NULL;
    float *ks2 = fp8 ? (float *)G->alloc(nsc * 4) : NULL, *vs2 = fp8 ? (float *)G->alloc(nsc * 4) : NULL;
    void *all[8] = {kc1, vc1, kc2, vc2, ks1, vs1, ks2, vs2};
    for (int i = 0; i < 8; i++)
        if (all[i]) G->zero(all[i], i < 4 ? cb : nsc * 4);
    // the plain ops
    void *outs[3] = {q2, k2, v2};
    size_t widths[3] = {(size_t)NH * HD, (size_t)KVH * HD, (size_t)KVH * HD}, ld = (widths[0] + 2 * widths[1]) * 2;
    for (int i = 0, c0 = 0; i < 3; c0 += (int)widths[i++])  // the column blocks of q|k|v into their buffers
        G->copy_2d(outs[i], widths[i] * 2, (const char *)dqkv + (size_t)c0 * 2, ld, widths[i] * 2, S);
    if (parts) {  // the inputs as three buffers, q in its output
        G->copy(q1, q2, nq * 2);
        G->copy(kin, k2, nk * 2);
        G->copy(vin, v2, nk * 2);
    }
    if (norm == 1) {
        G->rmsnorm_forward(q2, rs, q2, dqw, S * NH, HD, 1e-6f);
        G->rmsnorm_forward(k2, rs, k2, dkw, S * KVH, HD, 1e-6f);
    } else if (norm == 2) {
        G->rmsnorm1p_forward(q2, rs, q2, dqw, S * NH, HD, 1e-6f);
        G->rmsnorm1p_forward(k2, rs, k2, dkw, S * KVH, HD, 1e-6f);
    }
    G->rope_forward(q2, (const int32_t *)dpos, dinv, S, NH, HD);
    G->rope_forward(k2, (const int32_t *)dpos, dinv, S, KVH, HD);
    G->kv_write(kc2, vc2, ks2, vs2, k2, v2, (const int32_t *)dsl, S, KVH, HD);
    // the fused op
    if (parts)
        G->qkv_rope_kv(q1, k1, q1, kin, vin, NH * HD, KVH * HD, dqw, dkw, norm == 2, (const int32_t *)dpos, dinv, kc1, vc1, ks1, vs1,
                       (const int32_t *)dsl, S, NH, KVH, HD, 1e-6f);
    else
        G->qkv_rope_kv(q1, k1, dqkv, (const char *)dqkv + (size_t)NH * HD * 2, (const char *)dqkv + (size_t)(NH + KVH) * HD * 2,
                       H * HD, H * HD, dqw, dkw, norm == 2, (const int32_t *)dpos, dinv, kc1, vc1, ks1, vs1, (const int32_t *)dsl, S, NH,
                       KVH, HD, 1e-6f);
    char what[96];
    const char *tag = fp8 ? (parts ? "fp8, parts" : "fp8") : (parts ? "bf16, parts" : "bf16");
    void *a = mallocCheck(cb), *b = mallocCheck(cb);
    G->download(a, q1, nq * 2); G->download(b, q2, nq * 2);
    snprintf(what, sizeof what, "qkv_rope_kv q (HD %d, norm %d, %s)", HD, norm, tag);
    check_exact(what, a, b, nq * 2);
    G->download(a, k1, nk * 2); G->download(b, k2, nk * 2);
    snprintf(what, sizeof what, "qkv_rope_kv k (HD %d, norm %d, %s)", HD, norm, tag);
    check_exact(what, a, b, nk * 2);
    for (int i = 0; i < 2; i++) {
        G->download(a, i ? vc1 : kc1, cb); G->download(b, i ? vc2 : kc2, cb);
        snprintf(what, sizeof what, "qkv_rope_kv %s cache (HD %d, norm %d, %s)", i ? "v" : "k", HD, norm, tag);
        check_exact(what, a, b, cb);
        if (fp8) {
            G->download(a, i ? vs1 : ks1, nsc * 4); G->download(b, i ? vs2 : ks2, nsc * 4);
            snprintf(what, sizeof what, "qkv_rope_kv %s scales (HD %d, norm %d)", i ? "v" : "k", HD, norm);
            check_exact(what, a, b, nsc * 4);
        }
    }
    free(a); free(b); free(f); free(qw); free(kw); free(invf); free(pos); free(slots);
    void *bufs[] = {dqkv, dqw, dkw, dinv, dpos, dsl, q1, k1, q2, k2, v2, kin, vin, rs, kc1, vc1, kc2, vc2, ks1, vs1, ks2, vs2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) G->free(bufs[i]);
}

START_TEST(test_decode) {
    int l1[5] = {1, 17, 300, 2000, 64};
    decode_case(5, 16, 8, 128, 16, 125, l1, 0);  // long contexts: split over the context and combined
    decode_case(5, 16, 8, 128, 16, 125, l1, 1);
    decode_case(5, 32, 2, 128, 16, 125, l1, 1);  // 16 query heads a kv head: the tensor-core kernel's every row
    int l7[3] = {70, 1, 130};
    decode_case(3, 9, 3, 64, 16, 13, l7, 0);      // SmolLM2-135M's heads (3 a kv head of 64)
    decode_case(3, 9, 3, 64, 16, 13, l7, 1);
    int l2[3] = {5, 40, 33};
    decode_case(3, 8, 2, 64, 8, 6, l2, 0);
    int l3[4] = {24, 3, 11, 7};
    decode_case(4, 4, 2, 32, 8, 3, l3, 0);       // the fixtures' shapes
    int l4[2] = {9, 30};
    decode_case(2, 24, 2, 96, 16, 2, l4, 0);     // 12 query heads per kv head: two groups of 8
    int l5[64];                               // Qwen3-8B's heads at a rollout's lengths (128..384)
    for (int s = 0; s < 64; s++) l5[s] = 128 + (int)(rng_u64(&rng) % 257);
    decode_case(64, 32, 8, 128, 16, 24, l5, 0);
    decode_case(64, 32, 8, 128, 16, 24, l5, 1);  // the FP8 cache
    int l6[3] = {200, 1, 77};
    decode_case(3, 24, 2, 128, 16, 13, l6, 0);
    decode_case(3, 24, 2, 128, 16, 13, l6, 1);   // groups of 8 in the vectorized kernel
    decode_case(3, 8, 8, 256, 16, 13, l6, 0);    // HD 256, one query head per kv head
    decode_case(4, 4, 2, 32, 8, 3, l3, 1);       // the fixtures' shape, FP8 cache
    // sliding windows: longer, shorter and as long as the contexts; split contexts whose first splits lie
    // wholly before the window (lengths 2000 with a window of 300)
    decode_case(5, 16, 8, 128, 16, 125, l1, 0, 300);
    decode_case(5, 16, 8, 128, 16, 125, l1, 1, 300);
    decode_case(4, 4, 2, 32, 8, 3, l3, 0, 8);    // the Mistral fixture's window
    decode_case(4, 4, 1, 32, 8, 3, l3, 1, 6);    // the Gemma 3 fixture's window, FP8 cache
    decode_case(3, 8, 2, 64, 8, 6, l2, 0, 33);
    decode_case(3, 8, 8, 256, 16, 13, l6, 0, 50);  // gemma-3-1b's head dim
    decode_case(2, 24, 2, 96, 16, 2, l4, 0, 9);  // the scalar kernel
    for (int fp8 = 0; fp8 < 2; fp8++)
        for (int norm = 0; norm < 3; norm++) {
            for (int parts = 0; parts < 2; parts++) {
                qkv_rope_kv_case(64, 16, 8, 128, norm, fp8, parts);  // Qwen3-0.6B's heads
                qkv_rope_kv_case(5, 4, 2, 36, norm, fp8, parts);     // HD 36: the scalar norm path
            }
            if (norm == 2) qkv_rope_kv_case(64, 8, 4, 256, norm, fp8, 0);  // Gemma-3-4B's heads
        }
}
END_TEST

// ---- language-model head -------------------------------------------------------------

// logp and lse against the reference: fp32 logits, each within acc sum|h w| inv_temp <= acc inv_temp
// max|w| sum|h| (acc: the GEMM's accumulation, acc32(C) for bf16 products, ACC_TC for the FP8 tensor
// cores; h grown by hgrow: its quantization), and the logsumexp's fp32 rounding of V terms (~2^-14
// with the per-thread runs). Returns the tolerances (N).
static double *check_logprobs(const char *label, const float *glp, const float *gls, const float *rlp, const float *rls,
                              const float *h, double wmax, double hgrow, double acc, float inv_temp, int N, int C, int V) {
    double *tl = dmalloc_h(N);
    for (int i = 0; i < N; i++) {
        double sh = 0;
        for (int c = 0; c < C; c++) sh += fabs(h[(size_t)i * C + c]) * hgrow;
        tl[i] = 2 * acc * inv_temp * wmax * sh + 0x1p-14 * (1 + fabs(rls[i]));
    }
    char what[128];
    snprintf(what, sizeof what, "%slogprobs_forward logp N %d C %d V %d", label, N, C, V);
    check_close(what, glp, rlp, tl, N);
    snprintf(what, sizeof what, "%slogprobs_forward lse N %d C %d V %d", label, N, C, V);
    check_close(what, gls, rls, tl, N);
    return tl;
}

// dh = dz W against the reference, W (V, C) the values the head computes with: dz rounded to bf16,
// sum_j |dz_j| <= 2 |g| inv_temp, so |err| <= 2^-7 |g| inv_temp max_j |w_jc| (x2 headroom) + the
// output's rounding
static void check_dh(const char *label, const float *gdh, const float *rdh, const float *w, const float *g,
                     const int32_t *tg, float inv_temp, int N, int C, int V) {
    double *colmax = dmalloc_h(C), *mag = dmalloc_h((size_t)N * C);
    for (size_t j = 0; j < (size_t)V; j++)
        for (int c = 0; c < C; c++) colmax[c] = fmax(colmax[c], fabs(w[j * C + c]));
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) mag[(size_t)i * C + c] = tg[i] < 0 ? 0 : 2 * fabs(g[i]) * inv_temp * colmax[c];
    double *t = tol_bf(rdh, mag, 0x1p-7, (size_t)N * C);
    char what[128];
    snprintf(what, sizeof what, "%slogprobs_backward dh N %d C %d V %d", label, N, C, V);
    check_close(what, gdh, rdh, t, (size_t)N * C);
    free(colmax); free(mag); free(t);
}

static void logprobs_case(int N, int C, int V, float inv_temp, int with_dwlm) {
    float *h = randn_bf((size_t)N * C, 1.0f), *w = randn_bf((size_t)V * C, 0.5f);
    int32_t *tg = (int32_t *)mallocCheck(N * 4);
    for (int i = 0; i < N; i++) tg[i] = i % 5 == 3 ? -1 : (int)(rng_u64(&rng) % V);
    tg[0] = V - 1;
    void *dh = up_act(h, (size_t)N * C), *dw = up_act(w, (size_t)V * C), *dt = up_i32(tg, N);
    void *dlp = G->alloc(N * 4), *dls = G->alloc(N * 4);
    QWeight qw = {V, C, FP8_OFF};
    qw.dense = dw;
    G->logprobs_forward(dlp, dls, dh, &qw, (const int32_t *)dt, inv_temp, N);
    float *rlp = fmalloc(N), *rls = fmalloc(N);
    logprobs_forward_cpu(rlp, rls, h, w, tg, inv_temp, N, C, V);
    float *glp = down_hp(dlp, N), *gls = down_hp(dls, N);
    double wmax = 0;  // for the tolerances of check_logprobs
    for (size_t i = 0; i < (size_t)V * C; i++) wmax = fmax(wmax, fabs(w[i]));
    double *tl = check_logprobs("", glp, gls, rlp, rls, h, wmax, 1.0, acc32(C), inv_temp, N, C, V);
    char what[128];
    // backward: dh = dz W with dz rounded to bf16; sum_j |dz_j| <= 2 |g| inv_temp, so
    // |err| <= 2^-7 |g| inv_temp max_j |w_jc| (x2 headroom) + output rounding
    float *g = randn(N, 1.0f);
    g[1] = 0;  // a zero gradient row
    void *dg = up_hp(g, N), *ddh = G->alloc((size_t)N * C * 2), *ddw = NULL;
    float *dw0 = NULL;
    if (with_dwlm) {
        dw0 = randn((size_t)V * C, 0.1f);
        ddw = up_hp(dw0, (size_t)V * C);
    }
    G->logprobs_backward(ddh, ddw, dg, dls, dh, &qw, (const int32_t *)dt, inv_temp, N);
    float *rdh = fmalloc((size_t)N * C), *rdw = with_dwlm ? fdup(dw0, (size_t)V * C) : NULL;
    logprobs_backward_cpu(rdh, rdw, g, rls, h, w, tg, inv_temp, N, C, V);
    float *gdh = down_act(ddh, (size_t)N * C);
    check_dh("", gdh, rdh, w, g, tg, inv_temp, N, C, V);
    for (int i = 0; i < N; i++)
        if (tg[i] < 0 || g[i] == 0)
            for (int c = 0; c < C; c++) ck_assert_msg(gdh[(size_t)i * C + c] == 0, "dh row %d without gradient is not zero", i);
    {  // the fused op: the bytes of logprobs_forward, then logprobs_backward
        void *flp = G->alloc(N * 4), *fls = G->alloc(N * 4), *fdh = G->alloc((size_t)N * C * 2);
        void *fdw = with_dwlm ? up_hp(dw0, (size_t)V * C) : NULL;
        G->logprobs_fused(flp, fls, fdh, fdw, dg, dh, &qw, (const int32_t *)dt, inv_temp, N);
        float *a = down_hp(flp, N), *b = down_hp(fls, N);
        check_exact("logprobs_fused logp", a, glp, N * 4);
        check_exact("logprobs_fused lse", b, gls, N * 4);
        float *c = down_act(fdh, (size_t)N * C);
        check_exact("logprobs_fused dh", c, gdh, (size_t)N * C * 4);
        if (with_dwlm) {
            float *d = down_hp(fdw, (size_t)V * C), *e = down_hp(ddw, (size_t)V * C);
            check_exact("logprobs_fused dwlm", d, e, (size_t)V * C * 4);
            free(d), free(e);
            G->free(fdw);
        }
        free(a), free(b), free(c);
        G->free(flp), G->free(fls), G->free(fdh);
    }
    if (with_dwlm) {
        // dW_j += sum_n dz_nj h_n: 2^-7 sum_n |dz_nj| |h_n| (dz rounded), needs p_nj
        float *gdw = down_hp(ddw, (size_t)V * C);
        double *tw = dmalloc_h((size_t)V * C);
        for (int i = 0; i < N; i++) {
            if (tg[i] < 0 || g[i] == 0) continue;
            for (int j = 0; j < V; j++) {
                double z = 0;
                for (int c = 0; c < C; c++) z += (double)h[(size_t)i * C + c] * w[(size_t)j * C + c];
                double dz = fabs(g[i]) * inv_temp * ((j == tg[i]) + exp(inv_temp * z - rls[i]));
                for (int c = 0; c < C; c++) tw[(size_t)j * C + c] += (0x1p-7 + acc32(N)) * dz * fabs(h[(size_t)i * C + c]);
            }
        }
        for (size_t i = 0; i < (size_t)V * C; i++) tw[i] += 0x1p-22 * fabs(rdw[i]) + acc32(N) * fabs(dw0[i]);
        snprintf(what, sizeof what, "logprobs_backward dwlm += N %d C %d V %d", N, C, V);
        check_close(what, gdw, rdw, tw, (size_t)V * C);
        free(gdw); free(tw);
    }
    // logits_forward on the first rows: fp32 out
    int NL = N < 20 ? N : 20;
    void *dz = G->alloc((size_t)NL * V * 4);
    G->logits_forward(dz, dh, &qw, NL);
    float *gz = down_hp(dz, (size_t)NL * V), *rz = fmalloc((size_t)NL * V);
    matmul_forward_cpu(rz, h, w, NULL, NL, C, V);
    double *tz = dmalloc_h((size_t)NL * V);
    for (int i = 0; i < NL; i++)
        for (int j = 0; j < V; j++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += fabs(h[(size_t)i * C + c] * w[(size_t)j * C + c]);
            tz[(size_t)i * V + j] = acc32(C) * s;
        }
    snprintf(what, sizeof what, "logits_forward N %d C %d V %d", NL, C, V);
    check_close(what, gz, rz, tz, (size_t)NL * V);
    G->free(dh); G->free(dw); G->free(dt); G->free(dlp); G->free(dls); G->free(dg); G->free(ddh); G->free(dz);
    if (ddw) G->free(ddw);
    free(h); free(w); free(tg); free(rlp); free(rls); free(glp); free(gls); free(tl); free(g); free(rdh); free(rdw);
    free(gdh); free(dw0); free(gz); free(rz); free(tz);
}

// The FP8 embedding table and LM head (--fp8_embeddings: E4M3, a scale per row) against the CPU
// backend's fake quantization of the same codes. The GPU quantizes the bf16 h per row to the same
// bytes as the CPU (fp8_quantize_cuda's contract), so the logits differ only by the FP8 GEMM's
// accumulation: ACC_TC sum_c |hq_c wq_c| (Hopper's FP8 tensor cores keep ~14 bits within a group of
// 32 products: gpu_util.cuh), plus the logsumexp's fp32 rounding as in logprobs_case. The backward: dz
// rounded to bf16 and the dequantized rows of W rounded to bf16 (2^-9 each: 2^-7 covers both, as above).
static void fp8_head_case(int N, int C, int V, float inv_temp) {
    const Backend *cpu = backend_cpu();
    float *h = randn_bf((size_t)N * C, 1.0f), *w = randn((size_t)V * C, 0.5f);
    int32_t *tg = (int32_t *)mallocCheck(N * 4);
    for (int i = 0; i < N; i++) tg[i] = i % 5 == 3 ? -1 : (int)(rng_u64(&rng) % V);
    // the weight's codes and row scales, made on the host and uploaded: both backends read the same
    QWeight cw = {V, C, FP8_ROW};
    fp8_tensor_alloc_cpu(&cw.q, V, C, FP8_ROW, FP8_E4M3, FP8_BLOCK_SIZE);
    fp8_quantize_cpu(&cw.q, w, 0);
    QWeight gw = cw;
    gw.q.data = (uint8_t *)G->alloc((size_t)V * C);
    gw.q.scale = (float *)G->alloc((size_t)V * 4);
    G->upload(gw.q.data, cw.q.data, (size_t)V * C);
    G->upload(gw.q.scale, cw.q.scale, (size_t)V * 4);
    void *dh = up_act(h, (size_t)N * C), *dt = up_i32(tg, N);
    void *dlp = G->alloc(N * 4), *dls = G->alloc(N * 4);
    G->logprobs_forward(dlp, dls, dh, &gw, (const int32_t *)dt, inv_temp, N);
    float *rlp = fmalloc(N), *rls = fmalloc(N);
    cpu->logprobs_forward(rlp, rls, h, &cw, tg, inv_temp, N);
    float *glp = down_hp(dlp, N), *gls = down_hp(dls, N);
    // |hq_c| <= |h_c| (1 + 2^-4) and |wq_jc| <= max_j |wq_j| per column: the bound of logprobs_case on
    // the quantized operands
    float *wd = fmalloc((size_t)V * C);
    fp8_dequantize_cpu(wd, &cw.q);
    double wmax = 0;
    for (size_t i = 0; i < (size_t)V * C; i++) wmax = fmax(wmax, fabs(wd[i]));
    double *tl = check_logprobs("FP8 head ", glp, gls, rlp, rls, h, wmax, 1 + 0x1p-4, ACC_TC, inv_temp, N, C, V);
    char what[128];
    // backward, in chunks of the vocabulary on the GPU (V > 8192 covers several)
    float *g = randn(N, 1.0f);
    void *dg = up_hp(g, N), *ddh = G->alloc((size_t)N * C * 2);
    G->logprobs_backward(ddh, NULL, dg, dls, dh, &gw, (const int32_t *)dt, inv_temp, N);
    float *rdh = fmalloc((size_t)N * C);
    cpu->logprobs_backward(rdh, NULL, g, rls, h, &cw, tg, inv_temp, N);
    float *gdh = down_act(ddh, (size_t)N * C);
    check_dh("FP8 head ", gdh, rdh, wd, g, tg, inv_temp, N, C, V);
    // logits_forward (the decode step's): the forward's bound per element
    int NL = N < 16 ? N : 16;
    void *dz = G->alloc((size_t)NL * V * 4);
    G->logits_forward(dz, dh, &gw, NL);
    float *gz = down_hp(dz, (size_t)NL * V), *rz = fmalloc((size_t)NL * V);
    cpu->logits_forward(rz, h, &cw, NL);
    double *tz = dmalloc_h((size_t)NL * V);
    for (int i = 0; i < NL; i++)
        for (int j = 0; j < V; j++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += fabs(h[(size_t)i * C + c] * (1 + 0x1p-4) * wd[(size_t)j * C + c]);
            tz[(size_t)i * V + j] = ACC_TC * s;
        }
    snprintf(what, sizeof what, "FP8 head logits_forward N %d C %d V %d", NL, C, V);
    check_close(what, gz, rz, tz, (size_t)NL * V);
    // the embedding rows: code * scale in fp32 on both, rounded once to bf16 on the GPU
    int NT = 3 * N;
    int32_t *ids = (int32_t *)mallocCheck(NT * 4);
    for (int i = 0; i < NT; i++) ids[i] = (int)(rng_u64(&rng) % V);
    void *dids = up_i32(ids, NT), *demb = G->alloc((size_t)NT * C * 2);
    G->embedding_forward(demb, (const int32_t *)dids, &gw, NT);
    float *ge = down_act(demb, (size_t)NT * C), *re = fmalloc((size_t)NT * C);
    cpu->embedding_forward(re, ids, &cw, NT);
    for (size_t i = 0; i < (size_t)NT * C; i++) re[i] = bfr(re[i]);
    snprintf(what, sizeof what, "FP8 embedding_forward N %d C %d V %d", NT, C, V);
    check_exact(what, ge, re, (size_t)NT * C * 4);
    G->free(gw.q.data); G->free(gw.q.scale); G->free(dh); G->free(dt); G->free(dlp); G->free(dls); G->free(dg);
    G->free(ddh); G->free(dz); G->free(dids); G->free(demb);
    fp8_tensor_free_cpu(&cw.q);
    free(h); free(w); free(tg); free(rlp); free(rls); free(glp); free(gls); free(wd); free(tl); free(g); free(rdh);
    free(gdh); free(gz); free(rz); free(tz); free(ids); free(ge); free(re);
}

START_TEST(test_logprobs) {
    logprobs_case(37, 64, 151936, 1.0f / 0.7f, 0);  // the Qwen vocabulary, rows with target -1
    logprobs_case(45, 64, 151936, 1.0f, 1);         // with the lm_head gradient
    // several row chunks (FP8GRPO_LOGITS_CHUNK_ROWS = 16, set in main)
    logprobs_case(70, 128, 3000, 1.0f, 1);
    fp8_head_case(29, 256, 20000, 1.0f / 0.7f);  // several vocabulary chunks in the backward (8192 rows each)
    fp8_head_case(70, 128, 3000, 1.0f);          // several row chunks
}
END_TEST

// ---- sampling -----------------------------------------------------------------------------

static void sample_case(int S, int V, float temperature, int top_k, float top_p, int ties) {
    float *z = randn((size_t)S * V, 3.0f);
    if (ties)  // coarse logits: many exact ties, including at the maximum
        for (size_t i = 0; i < (size_t)S * V; i++) z[i] = roundf(z[i]);
    uint64_t *seeds = (uint64_t *)mallocCheck(S * 8), *rc = (uint64_t *)mallocCheck(S * 8), *rg = (uint64_t *)mallocCheck(S * 8);
    for (int s = 0; s < S; s++) seeds[s] = rc[s] = rng_u64(&rng);
    int32_t *tc = (int32_t *)mallocCheck(S * 4), *tgp = (int32_t *)mallocCheck(S * 4);
    float *lc = fmalloc(S);
    sample_cpu(tc, lc, z, rc, S, V, temperature, top_k, top_p);
    void *dz = up_hp(z, (size_t)S * V), *drng = G->alloc(S * 8), *dtok = G->alloc(S * 4), *dlp = G->alloc(S * 4);
    G->upload(drng, seeds, S * 8);
    G->sample((int32_t *)dtok, dlp, dz, (uint64_t *)drng, S, V, temperature, top_k, top_p);
    G->download(tgp, dtok, S * 4);
    G->download(rg, drng, S * 8);
    float *lg = down_hp(dlp, S);
    int same = 0;
    for (int s = 0; s < S; s++) same += tgp[s] == tc[s];
    printf("  sample S %d V %d T %.2f top_k %d top_p %.2f%s: %d/%d tokens equal the CPU's\n", S, V, temperature, top_k, top_p,
           ties ? " (ties)" : "", same, S);
    for (int s = 0; s < S; s++) {
        ck_assert_msg(tgp[s] == tc[s], "sample row %d: gpu token %d, cpu %d", s, tgp[s], tc[s]);
        ck_assert_msg(rg[s] == rc[s], "sample row %d: rng state differs", s);
        ck_assert_msg(fabs(lg[s] - lc[s]) <= 0x1p-20 * (1 + fabs(lc[s])), "sample row %d: logp %g vs %g", s, lg[s], lc[s]);
    }
    G->free(dz); G->free(drng); G->free(dtok); G->free(dlp);
    free(z); free(seeds); free(rc); free(rg); free(tc); free(tgp); free(lc); free(lg);
}

START_TEST(test_sample) {
    int V = 151936;
    sample_case(8, V, 0.0f, 0, 1.0f, 0);    // greedy
    sample_case(16, 1000, 0.0f, 0, 1.0f, 1);  // greedy with tied maxima: lowest index
    for (int rep = 0; rep < 4; rep++) {
        sample_case(8, V, 1.0f, 0, 1.0f, 0);   // plain
        sample_case(8, V, 0.7f, 50, 1.0f, 0);  // top-k
        sample_case(8, V, 1.0f, 0, 0.9f, 0);   // top-p
        sample_case(8, V, 0.8f, 100, 0.8f, 0); // both
    }
    sample_case(32, 1000, 1.0f, 0, 1.0f, 1);
    sample_case(32, 1000, 1.0f, 40, 0.95f, 1);  // ties at the top-k / top-p boundaries: by id
    sample_case(32, 1000, 1.5f, 1000, 0.5f, 1);
}
END_TEST

// ---- optimizer ------------------------------------------------------------------------------

START_TEST(test_optimizer) {
    size_t n = 1000003;
    float *p = randn(n, 0.1f), *g = randn(n, 0.01f), *m = randn(n, 0.001f), *v = randn(n, 1e-4f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    void *dp = up_hp(p, n), *dg = up_hp(g, n), *dm = up_hp(m, n), *dv = up_hp(v, n);
    for (int step = 1; step <= 3; step++) {
        G->adamw(dp, dg, 1.0f, dm, dv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step, NULL, NULL);
        adamw_cpu(p, g, 1.0f, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step, 0, 0, 0);
    }
    float *gp = down_hp(dp, n), *gm = down_hp(dm, n), *gv = down_hp(dv, n);
    check_exact("adamw param (3 steps, fp32, CPU order)", gp, p, n * 4);
    check_exact("adamw m", gm, m, n * 4);
    check_exact("adamw v", gv, v, n * 4);
    {  // the fused step (clip factor and act copy in the pass) against the passes it replaces, on the GPU:
       // scale, AdamW, to_act; and against the CPU's fused step
        float *g2 = (float *)mallocCheck(n * 4);
        memcpy(g2, g, n * 4);
        void *fp = up_hp(p, n), *fm = up_hp(m, n), *fv = up_hp(v, n), *fa = G->alloc(n * 2);
        void *rp = up_hp(p, n), *rm = up_hp(m, n), *rv = up_hp(v, n), *ra = G->alloc(n * 2), *rg = up_hp(g, n);
        G->adamw(fp, dg, 0.37f, fm, fv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 4, fa, NULL);
        G->scale(rg, n, 0.37f);
        G->adamw(rp, rg, 1.0f, rm, rv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 4, NULL, NULL);
        G->to_act(ra, rp, n);
        adamw_cpu(p, g2, 0.37f, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 4, 0, 0, 0);
        float *a = down_hp(fp, n), *b = down_hp(rp, n), *fa32 = down_act(fa, n), *ra32 = down_act(ra, n), *g3 = down_hp(dg, n);
        check_exact("adamw fused (clip 0.37, act copy): param vs scale + adamw", a, b, n * 4);
        check_exact("adamw fused: param vs the CPU's", a, p, n * 4);
        check_exact("adamw fused: act copy vs to_act", fa32, ra32, n * 4);
        check_exact("adamw fused: the gradients left as they were", g3, g, n * 4);
        free(a); free(b); free(fa32); free(ra32); free(g3);
        a = down_hp(fm, n), b = down_hp(rm, n);
        check_exact("adamw fused: m", a, b, n * 4);
        free(a); free(b);
        a = down_hp(fv, n), b = down_hp(rv, n);
        check_exact("adamw fused: v", a, b, n * 4);
        free(a); free(b); free(g2);
        G->free(fp); G->free(fm); G->free(fv); G->free(fa); G->free(rp); G->free(rm); G->free(rv); G->free(ra); G->free(rg);
    }
    {  // --adam_moments bf16: fp32 params, bf16 moments rounded stochastically from the same hashed bits on
       // both sides (a block at i0 = 12345, with the clip factor and the act copy), bit for bit the CPU's
        float *cp = (float *)mallocCheck(n * 4), *cm = (float *)mallocCheck(n * 4), *cv = (float *)mallocCheck(n * 4);
        for (size_t i = 0; i < n; i++) cp[i] = p[i], cm[i] = bfr(m[i]), cv[i] = bfr(v[i]);
        void *hp_ = up_hp(cp, n), *hm = up_act(cm, n), *hv = up_act(cv, n), *ha = G->alloc(n * 2);
        Bf16Moments m16 = {77, 12345};
        for (int step = 1; step <= 3; step++) {
            G->adamw(hp_, dg, 0.37f, hm, hv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step, ha, &m16);
            CPU->adamw(cp, g, 0.37f, cm, cv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step, NULL, &m16);
        }
        float *a = down_hp(hp_, n), *bm_ = down_act(hm, n), *bv_ = down_act(hv, n), *aa = down_act(ha, n);
        check_exact("adamw, bf16 moments: param (3 steps, stochastic rounding)", a, cp, n * 4);
        check_exact("adamw, bf16 moments: m", bm_, cm, n * 4);
        check_exact("adamw, bf16 moments: v", bv_, cv, n * 4);
        for (size_t i = 0; i < n; i++) cp[i] = bfr(cp[i]);
        check_exact("adamw, bf16 moments: the act copy", aa, cp, n * 4);
        G->free(hp_); G->free(hm); G->free(hv); G->free(ha);
        free(a); free(bm_); free(bv_); free(aa); free(cp); free(cm); free(cv);
    }
    // --lora_dtype bf16: bf16 param, m, v, stochastic rounding from the same hashed bits on both sides
    for (size_t i = 0; i < n; i++) p[i] = bfr(p[i]), m[i] = bfr(m[i]), v[i] = bfr(v[i]);
    void *bp = up_act(p, n), *bm = up_act(m, n), *bv = up_act(v, n);
    for (int step = 1; step <= 3; step++) {
        G->adamw_bf16(bp, dg, bm, bv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step, 77);
        CPU->adamw_bf16(p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step, 77);
    }
    float *bgp = down_act(bp, n), *bgm = down_act(bm, n), *bgv = down_act(bv, n);
    check_exact("adamw_bf16 param (3 steps, stochastic rounding)", bgp, p, n * 4);
    check_exact("adamw_bf16 m", bgm, m, n * 4);
    check_exact("adamw_bf16 v", bgv, v, n * 4);
    G->free(bp); G->free(bm); G->free(bv); free(bgp); free(bgm); free(bgv);
    double s1 = G->sumsq(dg, n), s2 = G->sumsq(dg, n), rs = sumsq_cpu(g, n);
    ck_assert_msg(s1 == s2, "sumsq not deterministic: %.17g vs %.17g", s1, s2);
    // both sum n non-negative fp64 terms; the CPU sequentially, whose own error bound is n 2^-53
    ck_assert_msg(fabs(s1 - rs) <= n * 0x1p-53 * rs, "sumsq %.17g vs %.17g", s1, rs);
    printf("  %-52s rel err %.2g, repeatable\n", "sumsq (fp64)", fabs(s1 - rs) / rs);
    G->scale(dg, n, 0.37f);
    scale_cpu(g, n, 0.37f);
    float *gg = down_hp(dg, n);
    check_exact("scale", gg, g, n * 4);
    void *dx = up_hp(m, n);  // g += m (random, never zero): one fp32 addition each, the same on both
    G->accumulate(dg, dx, n);
    accumulate_cpu(g, m, n);
    free(gg);
    gg = down_hp(dg, n);
    check_exact("accumulate", gg, g, n * 4);
    G->free(dx);
    G->free(dp); G->free(dg); G->free(dm); G->free(dv);
    free(p); free(g); free(m); free(v); free(gp); free(gm); free(gv); free(gg);
}
END_TEST

static Suite *gpu_backend_suite(void) {
    Suite *s = suite_create("gpu_backend");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_memory);
    tcase_add_test(tc, test_weights);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_lora);
    tcase_add_test(tc, test_norm_rope_elementwise);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_decode);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_sample);
    tcase_add_test(tc, test_optimizer);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    char why[256];
    setenv("FP8GRPO_LOGITS_CHUNK_ROWS", "16", 1);  // before the first logprobs call: several chunks in small tests
    G = backend_cuda(why, sizeof why);
    if (!G) {
        fprintf(stderr, "gpu_backend: %s; this suite runs on a GPU machine (make test-gpu)\n", why);
        return 1;
    }
    CPU = backend_cpu();
    rng = rng_make(20261122);
    printf("gpu_backend on %s\n", G->device_desc);
    return run_suite(gpu_backend_suite());
}
