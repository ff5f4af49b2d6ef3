// test/gpu_fp8_train.cu: FP8 training on the CUDA backend (fp8_train.cu, the training kernels of
// fp8.cu) against the CPU reference (fp8_recipe.c, fp8_cpu.c):
//   - quantization with a given scale (delayed scaling): codes, inverse scale and amax bit for bit,
//     NaN and inf included;
//   - the transposed quantization (W^T, dY^T, X^T: 1x128 groups, 128x128 tiles, or per tensor with a
//     given scale) and the current scale: bit for bit against the CPU quantization of x^T;
//   - a linear layer's three products under each recipe (current, delayed, block; hybrid and e4m3)
//     over three optimizer steps, the weights and the data's range changing between them, against
//     fp8_linear_train_cpu on the operands the recipe defines (delayed: the CPU's DelayedScale fed
//     the same amaxes): within the FP8 tensor cores' accumulation (ACC_TC, gpu_util.cuh) and the
//     bf16 rounding of Y and dX;
//   - delayed scaling's state through a checkpoint (fp8_train_state): set into a fresh linear, the
//     same forward bytes.
// Run on a GPU: make test-gpu (CK_FORK=no).
#include "gpu_util.cuh"

#include "core/fp8_recipe.h"

static void *dev_bytes(const void *h, size_t n) {
    void *d = G->alloc(n);
    G->upload(d, h, n);
    return d;
}
static void *down_bytes(const void *d, size_t n) {
    void *h = mallocCheck(n);
    G->download(h, d, n);
    return h;
}
// two device buffers of n bytes are byte for byte the same
static void check_same_bytes(const char *what, const void *a, const void *b, size_t n) {
    void *x = down_bytes(a, n), *y = down_bytes(b, n);
    check_exact(what, x, y, n);
    free(x);
    free(y);
}
// a device FP8 tensor of the given shape (codes and scales allocated)
static FP8Tensor dev_tensor(int rows, int cols, FP8Gran g, FP8Format fmt, int block_rows) {
    FP8Tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows, t.cols = cols, t.gran = g, t.fmt = fmt, t.block_rows = block_rows;
    t.data = (uint8_t *)G->alloc((size_t)rows * cols);
    t.scale = (float *)G->alloc(fp8_num_scales(g, rows, cols, block_rows) * 4 + 4);
    return t;
}
static void dev_tensor_free(FP8Tensor *t) {
    G->free(t->data);
    G->free(t->scale);
}
// codes and scales of a device tensor equal a host one's, byte for byte
static void check_same_tensor(const char *what, const FP8Tensor *dev, const FP8Tensor *host) {
    size_t n = (size_t)host->rows * host->cols, ns = fp8_num_scales(host->gran, host->rows, host->cols, host->block_rows);
    void *q = down_bytes(dev->data, n), *s = down_bytes(dev->scale, ns * 4);
    char w[160];
    snprintf(w, sizeof w, "%s codes", what);
    check_exact(w, q, host->data, n);
    snprintf(w, sizeof w, "%s scales", what);
    check_exact(w, s, host->scale, ns * 4);
    free(q);
    free(s);
}
static float *transpose_f(const float *x, int R, int C) {
    float *t = fmalloc((size_t)R * C);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) t[(size_t)c * R + r] = x[(size_t)r * C + c];
    return t;
}

START_TEST(test_quantize_scaled) {
    size_t n = 300007;
    for (int f = 0; f < 2; f++)
        for (int special = 0; special < 3; special++) {  // none, an inf, a NaN
            FP8Format fmt = (FP8Format)f;
            float *x = randn_bf(n, 3.0f);
            x[11] = 4000.0f;  // beyond E4M3's range at this scale: saturates
            if (special == 1) x[n / 2] = -INFINITY;
            if (special == 2) x[n / 3] = NAN;
            float mul = f == FP8_E4M3 ? 37.5f : 0.71f;
            FP8Tensor ref;
            fp8_tensor_alloc_cpu(&ref, 1, (int)n, FP8_TENSOR, fmt, 1);
            float amax_ref = fp8_quantize_scaled_cpu(&ref, x, mul);
            for (int bf = 0; bf < 2; bf++) {  // bf16 and f32 input
                void *xd = bf ? up_act(x, n) : up_hp(x, n);
                FP8Tensor t = dev_tensor(1, (int)n, FP8_TENSOR, fmt, 1);
                float *muld = (float *)dev_bytes(&mul, 4);
                unsigned zero = 0, *amax = (unsigned *)dev_bytes(&zero, 4);
                fp8_quantize_scaled_cuda(&t, xd, bf ? DT_BF16 : DT_F32, muld, amax);
                char what[96];
                snprintf(what, sizeof what, "scaled %s %s %s", fmt ? "e5m2" : "e4m3", bf ? "bf16" : "f32",
                         special == 0 ? "" : special == 1 ? "(inf)" : "(NaN)");
                check_same_tensor(what, &t, &ref);
                unsigned bits;
                G->download(&bits, amax, 4);
                float amax_gpu;
                memcpy(&amax_gpu, &bits, 4);
                ck_assert_msg(isnan(amax_ref) ? isnan(amax_gpu) : amax_gpu == amax_ref, "%s: amax %g, the CPU's %g", what, amax_gpu,
                              amax_ref);
                dev_tensor_free(&t);
                G->free(xd);
                G->free(muld);
                G->free(amax);
            }
            fp8_tensor_free_cpu(&ref);
            free(x);
        }
}
END_TEST

START_TEST(test_quantize_transposed) {
    int shapes[][2] = {{256, 384}, {300, 200}, {301, 130}, {77, 129}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int br = 1; br <= FP8_BLOCK_SIZE; br += FP8_BLOCK_SIZE - 1)
            for (int f = 0; f < 2; f++) {
                int R = shapes[k][0], C = shapes[k][1];
                float *x = randn_bf((size_t)R * C, 1.0f);
                for (int r = 0; r < R; r += 7) x[(size_t)r * C + (r % C)] *= 64.0f;  // outliers
                float *xt = transpose_f(x, R, C);
                FP8Tensor ref;
                fp8_tensor_alloc_cpu(&ref, C, R, FP8_BLOCK, (FP8Format)f, br);
                fp8_quantize_cpu(&ref, xt, 0);
                void *xd = up_act(x, (size_t)R * C);
                FP8Tensor t = dev_tensor(C, R, FP8_BLOCK, (FP8Format)f, br);
                fp8_quantize_t_cuda(&t, xd, NULL, NULL);
                char what[96];
                snprintf(what, sizeof what, "x^T %dx%d %s %s", R, C, br == 1 ? "1x128" : "128x128", f ? "e5m2" : "e4m3");
                check_same_tensor(what, &t, &ref);
                dev_tensor_free(&t);
                fp8_tensor_free_cpu(&ref);
                G->free(xd);
                free(x);
                free(xt);
            }
    // per tensor with a given scale (TE's x * mul), straight from x, and the current scale of x: on a
    // shape with edge tiles (the general kernel) and on whole tiles (the per-tensor kernel)
    int tensor_shapes[][2] = {{190, 260}, {256, 384}, {384, 128}};
    for (size_t k = 0; k < sizeof tensor_shapes / sizeof tensor_shapes[0]; k++) {
        int R = tensor_shapes[k][0], C = tensor_shapes[k][1];
        float *x = randn_bf((size_t)R * C, 2.0f), *xt = transpose_f(x, R, C);
        for (int r = 0; r < R; r += 5) x[(size_t)r * C + (3 * r % C)] *= 16.0f, xt[(size_t)(3 * r % C) * R + r] *= 16.0f;  // outliers
        void *xd = up_act(x, (size_t)R * C);
        for (int f = 0; f < 2; f++) {
            float amax_h = 0;
            for (size_t i = 0; i < (size_t)R * C; i++) amax_h = fmaxf(amax_h, fabsf(x[i]));
            float smax = fp8_max((FP8Format)f) * 0.5f, mul = smax / amax_h;  // (a margin of 1)
            FP8Tensor r2;
            fp8_tensor_alloc_cpu(&r2, C, R, FP8_TENSOR, (FP8Format)f, 1);
            float amax_ref = fp8_quantize_scaled_cpu(&r2, xt, mul);
            float *muld = (float *)G->alloc(16);
            unsigned *amax = (unsigned *)G->alloc(16), zero = 0, bits = 0;
            fp8_tensor_scale_cuda(muld, amax, xd, DT_BF16, (size_t)R * C, smax);
            float mul_gpu;
            G->download(&mul_gpu, muld, 4);
            ck_assert_msg(mul_gpu == mul, "current scale %g, the CPU's %g", mul_gpu, mul);
            G->upload(amax, &zero, 4);
            FP8Tensor t2 = dev_tensor(C, R, FP8_TENSOR, (FP8Format)f, 1);
            fp8_quantize_t_cuda(&t2, xd, muld, amax);
            char what[96];
            snprintf(what, sizeof what, "x^T %dx%d tensor %s, given scale", R, C, f ? "e5m2" : "e4m3");
            check_same_tensor(what, &t2, &r2);
            G->download(&bits, amax, 4);
            unsigned ref_bits;
            memcpy(&ref_bits, &amax_ref, 4);
            ck_assert_msg(bits == ref_bits, "amax recorded by the transposed quantization");
            dev_tensor_free(&t2);
            fp8_tensor_free_cpu(&r2);
            G->free(muld);
            G->free(amax);
        }
        G->free(xd);
        free(x);
        free(xt);
    }
    // both layouts from one read (the backward's dY): each the bytes of its own pass, on shapes with
    // edge tiles and a width that is not a multiple of 4
    int both[][2] = {{190, 260}, {256, 384}, {77, 131}, {512, 256}};
    for (size_t k = 0; k < sizeof both / sizeof both[0]; k++)
        for (int f = 0; f < 2; f++) {
            int R = both[k][0], C = both[k][1];
            float *x = randn_bf((size_t)R * C, 2.0f), mul = f ? 0.9f : 61.0f;  // (some E4M3 codes saturate)
            void *xd = up_act(x, (size_t)R * C);
            float *muld = (float *)dev_bytes(&mul, 4);
            unsigned zero = 0, *a1 = (unsigned *)dev_bytes(&zero, 4), *a2 = (unsigned *)dev_bytes(&zero, 4), b1, b2;
            FP8Tensor row = dev_tensor(R, C, FP8_TENSOR, (FP8Format)f, 1), t = dev_tensor(C, R, FP8_TENSOR, (FP8Format)f, 1);
            FP8Tensor row_ref = dev_tensor(R, C, FP8_TENSOR, (FP8Format)f, 1), t_ref = dev_tensor(C, R, FP8_TENSOR, (FP8Format)f, 1);
            fp8_quantize_both_cuda(&row, &t, xd, muld, a1);
            fp8_quantize_scaled_cuda(&row_ref, xd, DT_BF16, muld, a2);
            fp8_quantize_t_cuda(&t_ref, xd, muld, NULL);
            size_t n = (size_t)R * C;
            uint8_t *h1 = (uint8_t *)mallocCheck(n), *h2 = (uint8_t *)mallocCheck(n);
            char what[96];
            G->download(h1, row.data, n), G->download(h2, row_ref.data, n);
            snprintf(what, sizeof what, "dY %dx%d %s, both layouts at once: row", R, C, f ? "e5m2" : "e4m3");
            check_exact(what, h1, h2, n);
            G->download(h1, t.data, n), G->download(h2, t_ref.data, n);
            snprintf(what, sizeof what, "dY %dx%d %s, both layouts at once: transposed", R, C, f ? "e5m2" : "e4m3");
            check_exact(what, h1, h2, n);
            float s1, s2;
            G->download(&s1, row.scale, 4), G->download(&s2, row_ref.scale, 4);
            ck_assert_msg(s1 == s2, "both layouts: the row tensor's scale %g, the row pass's %g", s1, s2);
            G->download(&b1, a1, 4), G->download(&b2, a2, 4);
            ck_assert_msg(b1 == b2 && b1 != 0, "both layouts: amax bits %08x, the row pass's %08x", b1, b2);
            free(h1), free(h2);
            dev_tensor_free(&row), dev_tensor_free(&t), dev_tensor_free(&row_ref), dev_tensor_free(&t_ref);
            G->free(xd), G->free(muld), G->free(a1), G->free(a2);
            free(x);
        }
}
END_TEST

// ---- a linear layer under a recipe, against the CPU ------------------------------------

typedef struct {
    FP8Recipe r;
    DelayedScale d[3];  // x, w, dy: the CPU's mirror of the GPU's histories (delayed)
} Mirror;

// x (rows, cols), bf16-exact values, quantized as the recipe quantizes tensor i (activation layout
// for x and dy, a weight for w); delayed: records the amax in the mirror
static void ref_quantize(FP8Tensor *t, Mirror *mr, int i, const float *x, int rows, int cols) {
    FP8Format fmt = i == 2 && mr->r.hybrid ? FP8_E5M2 : FP8_E4M3;
    int block = mr->r.kind == FP8_RECIPE_BLOCK;
    fp8_tensor_alloc_cpu(t, rows, cols, block ? FP8_BLOCK : FP8_TENSOR, fmt, block && i == 1 ? FP8_BLOCK_SIZE : 1);
    if (mr->r.kind == FP8_RECIPE_DELAYED) delayed_record(&mr->d[i], fp8_quantize_scaled_cpu(t, x, mr->d[i].scale));
    else if (mr->r.kind == FP8_RECIPE_CURRENT) {  // TE's current scaling: fmax 2^-margin / amax of x now
        float amax = 0, smax = fp8_max(fmt) * powf(2.0f, -mr->r.margin);
        for (size_t k = 0; k < (size_t)rows * cols; k++) amax = fmaxf(amax, fabsf(x[k]));
        fp8_quantize_scaled_cpu(t, x, amax > 0 ? smax / amax : 1.0f);
    } else fp8_quantize_cpu(t, x, 0);
}

// sum over k of |a_k b_k| for each output of y = a b^T, a (M, K), b (N, K), from dequantized operands
// a dense weight (rows, cols) of the host values wh, trained in FP8 under r; leader: the trained projection
// whose input it reads (fp8_train_new), or NULL
static QWeight trained_weight(const float *wh, int rows, int cols, const FP8Recipe *r, FP8Train *leader) {
    QWeight w;
    memset(&w, 0, sizeof w);
    w.rows = rows, w.cols = cols, w.gran = FP8_OFF, w.dense = up_act(wh, (size_t)rows * cols);
    char why[256];
    w.train = G->fp8_train_new(&w, r, leader, why, sizeof why);
    ck_assert_msg(w.train, "%s", why);
    return w;
}

static double *mag_abt(const FP8Tensor *a, const FP8Tensor *b) {
    int M = a->rows, N = b->rows, K = a->cols;
    float *af = fmalloc((size_t)M * K), *bf = fmalloc((size_t)N * K);
    fp8_dequantize_cpu(af, a);
    fp8_dequantize_cpu(bf, b);
    double *m = dmalloc_h((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += fabs((double)af[(size_t)i * K + k] * bf[(size_t)j * K + k]);
            m[(size_t)i * N + j] = s;
        }
    free(af);
    free(bf);
    return m;
}
static FP8Tensor transposed_copy(const FP8Tensor *t) {  // host: codes transposed, a tensor scale kept
    FP8Tensor u;
    fp8_tensor_alloc_cpu(&u, t->cols, t->rows, t->gran, t->fmt, t->block_rows);
    for (int r = 0; r < t->rows; r++)
        for (int c = 0; c < t->cols; c++) u.data[(size_t)c * t->rows + r] = t->data[(size_t)r * t->cols + c];
    u.scale[0] = t->scale[0];
    return u;
}
static float *to_f(const double *y, size_t n) {
    float *f = fmalloc(n);
    for (size_t i = 0; i < n; i++) f[i] = (float)y[i];
    return f;
}

static void check_linear(const char *name, FP8Recipe r) {
    int N = 272, C = 320, OC = 208;  // tokens not a multiple of 128: edge groups along every dimension
    Mirror mr;
    memset(&mr, 0, sizeof mr);
    mr.r = r;
    if (r.kind == FP8_RECIPE_DELAYED) {
        delayed_init(&mr.d[0], &r, FP8_E4M3);
        delayed_init(&mr.d[1], &r, FP8_E4M3);
        delayed_init(&mr.d[2], &r, r.hybrid ? FP8_E5M2 : FP8_E4M3);
    }
    float *w = randn_bf((size_t)OC * C, 0.05f);
    QWeight qw = trained_weight(w, OC, C, &r, NULL);
    void *y = G->alloc((size_t)N * OC * 2), *dx = G->alloc((size_t)N * C * 2), *dw = G->alloc((size_t)OC * C * 4);
    long overflows = 0;
    for (int step = 0; step < 3; step++) {
        // the data's range grows 8x a step: delayed scaling lags (its scale is the last step's), the others follow
        float sx = ldexpf(1.0f, 3 * step);
        float *x = randn_bf((size_t)N * C, sx), *dy = randn_bf((size_t)N * OC, 1e-3f * sx);
        for (int n = 0; n < N; n += 5) x[(size_t)n * C + 17] = bfr(30.0f * x[(size_t)n * C + 17]);  // an outlier channel
        void *xd = up_act(x, (size_t)N * C), *dyd = up_act(dy, (size_t)N * OC);
        G->zero(dw, (size_t)OC * C * 4);
        // the three products one at a time, each by cuBLASLt where the GPU has it (sm_90: every one)
        const char *ran[3];
        G->linear_forward(y, xd, &qw, NULL, N);
        ran[0] = fp8_cuda_last_backend();
        G->linear_backward(dx, 0, NULL, NULL, dyd, xd, &qw, N);
        ran[1] = fp8_cuda_last_backend();
        G->linear_backward(NULL, 0, dw, NULL, dyd, xd, &qw, N);
        ran[2] = fp8_cuda_last_backend();
        if (fp8_cuda_cc() >= 90)
            for (int i = 0; i < 3; i++) ck_assert_msg(!strcmp(ran[i], "cublaslt"), "%s: product %d ran on %s", name, i, ran[i]);
        // the reference: the recipe's operands, in fp64
        FP8Tensor xq, wq, dyq;
        ref_quantize(&xq, &mr, 0, x, N, C);
        ref_quantize(&wq, &mr, 1, w, OC, C);
        ref_quantize(&dyq, &mr, 2, dy, N, OC);
        double *yr = dmalloc_h((size_t)N * OC), *dxr = dmalloc_h((size_t)N * C), *dwr = dmalloc_h((size_t)OC * C);
        fp8_linear_train_cpu(yr, dxr, NULL, &xq, &wq, &dyq);
        FP8Tensor dyt, xt;  // dW = dY^T X with the tokens innermost
        if (r.kind == FP8_RECIPE_BLOCK) {
            float *dyT = transpose_f(dy, N, OC), *xT = transpose_f(x, N, C);
            fp8_tensor_alloc_cpu(&dyt, OC, N, FP8_BLOCK, dyq.fmt, 1);
            fp8_tensor_alloc_cpu(&xt, C, N, FP8_BLOCK, FP8_E4M3, 1);
            fp8_quantize_cpu(&dyt, dyT, 0);
            fp8_quantize_cpu(&xt, xT, 0);
            free(dyT);
            free(xT);
        } else {
            dyt = transposed_copy(&dyq);
            xt = transposed_copy(&xq);
        }
        fp8_linear_train_cpu(dwr, NULL, NULL, &dyt, &xt, NULL);
        // W^T as a weight for the magnitudes of dX = dY W
        FP8Tensor wt;
        if (r.kind != FP8_RECIPE_BLOCK) wt = transposed_copy(&wq);
        else {
            float *wT = transpose_f(w, OC, C);
            fp8_tensor_alloc_cpu(&wt, C, OC, FP8_BLOCK, FP8_E4M3, FP8_BLOCK_SIZE);
            fp8_quantize_cpu(&wt, wT, 0);
            free(wT);
        }
        double *my = mag_abt(&xq, &wq), *mdx = mag_abt(&dyq, &wt), *mdw = mag_abt(&dyt, &xt);
        float *yf = to_f(yr, (size_t)N * OC), *dxf = to_f(dxr, (size_t)N * C), *dwf = to_f(dwr, (size_t)OC * C);
        double *ty = tol_bf(yf, my, ACC_TC, (size_t)N * OC), *tdx = tol_bf(dxf, mdx, ACC_TC, (size_t)N * C);
        double *tdw = dmalloc_h((size_t)OC * C);
        for (size_t i = 0; i < (size_t)OC * C; i++) tdw[i] = ACC_TC * mdw[i] + 1e-30;
        float *yg = down_act(y, (size_t)N * OC), *dxg = down_act(dx, (size_t)N * C), *dwg = down_hp(dw, (size_t)OC * C);
        char what[128];
        printf("%s step %d (Y, dX, dW by %s, %s, %s):\n", name, step, ran[0], ran[1], ran[2]);
        snprintf(what, sizeof what, "Y = X W^T");
        check_close(what, yg, yf, ty, (size_t)N * OC);
        snprintf(what, sizeof what, "dX = dY W");
        check_close(what, dxg, dxf, tdx, (size_t)N * C);
        snprintf(what, sizeof what, "dW = dY^T X");
        check_close(what, dwg, dwf, tdw, (size_t)OC * C);
        {  // dX added to what dinp holds (a projection sharing its input with the one before), in the
           // product's epilogue: within dX's bound plus the sum's one bf16 rounding
            float *d0 = randn_bf((size_t)N * C, 0.05f * sx), *sum = fmalloc((size_t)N * C);
            double *tsum = dmalloc_h((size_t)N * C);
            void *dx2 = up_act(d0, (size_t)N * C);
            G->linear_backward(dx2, 1, NULL, NULL, dyd, xd, &qw, N);
            for (size_t i = 0; i < (size_t)N * C; i++) {
                sum[i] = (float)(d0[i] + dxr[i]);
                tsum[i] = tdx[i] + 0x1p-8 * fabs(d0[i] + dxr[i]);
            }
            float *g2 = down_act(dx2, (size_t)N * C);
            snprintf(what, sizeof what, "dinp += dY W (by %s)", fp8_cuda_last_backend());
            check_close(what, g2, sum, tsum, (size_t)N * C);
            free(d0), free(sum), free(tsum), free(g2);
            G->free(dx2);
        }
        // the optimizer step: new weights (quantized at the next forward), the histories roll
        G->fp8_train_step(&qw.train, 1, NULL, NULL, &overflows);
        if (r.kind == FP8_RECIPE_DELAYED)
            for (int i = 0; i < 3; i++) delayed_update(&mr.d[i]);
        free(w);
        w = randn_bf((size_t)OC * C, 0.05f * (step + 2));
        void *wd = up_act(w, (size_t)OC * C);
        G->copy(qw.dense, wd, (size_t)OC * C * 2);
        G->free(wd);
        FP8Tensor *all[] = {&xq, &wq, &dyq, &dyt, &xt, &wt};
        for (int i = 0; i < 6; i++) fp8_tensor_free_cpu(all[i]);
        void *frees[] = {yr, dxr, dwr, my, mdx, mdw, yf, dxf, dwf, ty, tdx, tdw, yg, dxg, dwg, x, dy};
        for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) free(frees[i]);
        G->free(xd);
        G->free(dyd);
    }
    ck_assert_int_eq(overflows, 0);
    G->fp8_train_free(qw.train);
    G->free(qw.dense);
    G->free(y);
    G->free(dx);
    G->free(dw);
    free(w);
    for (int i = 0; i < 3; i++) delayed_free(&mr.d[i]);
}

START_TEST(test_linear_recipes) {
    FP8Recipe r = fp8_recipe_default();  // delayed, hybrid, history 1024, max
    r.history_len = 4;
    check_linear("delayed hybrid (history 4, max)", r);
    r.algo = AMAX_MOST_RECENT;
    r.margin = 1;
    check_linear("delayed hybrid (most_recent, margin 1)", r);
    r = fp8_recipe_default();
    r.hybrid = 0;
    check_linear("delayed e4m3", r);
    r = fp8_recipe_default();
    r.kind = FP8_RECIPE_CURRENT;
    check_linear("current hybrid", r);
    r.kind = FP8_RECIPE_BLOCK;
    check_linear("block hybrid", r);
    r.hybrid = 0;
    check_linear("block e4m3", r);
}
END_TEST

// k reads q's input right after q (model.c's order): it reuses q's FP8 copy of it, forward and
// backward, and gets the bytes it would get alone; called after another input, it quantizes anew
START_TEST(test_shared_input) {
    int N = 384, C = 256, OC = 128;
    for (int kind = 0; kind < 2; kind++) {
        FP8Recipe r = fp8_recipe_default();
        r.kind = kind ? FP8_RECIPE_CURRENT : FP8_RECIPE_BLOCK;
        QWeight w[3];  // q (the leader), k (its member), k alone
        float *wh[2] = {randn_bf((size_t)OC * C, 0.05f), randn_bf((size_t)OC * C, 0.05f)};
        for (int i = 0; i < 3; i++) w[i] = trained_weight(wh[i ? 1 : 0], OC, C, &r, i == 1 ? w[0].train : NULL);
        float *x1 = randn_bf((size_t)N * C, 1.0f), *x2 = randn_bf((size_t)N * C, 3.0f), *dy = randn_bf((size_t)N * OC, 0.01f);
        void *xd1 = up_act(x1, (size_t)N * C), *xd2 = up_act(x2, (size_t)N * C), *dyd = up_act(dy, (size_t)N * OC);
        void *y[2], *dx[2], *dw[2];
        for (int i = 0; i < 2; i++) {
            y[i] = G->alloc((size_t)N * OC * 2), dx[i] = G->alloc((size_t)N * C * 2), dw[i] = G->alloc((size_t)OC * C * 4);
            G->zero(dw[i], (size_t)OC * C * 4);
        }
        for (int pass = 0; pass < 2; pass++) {  // pass 0: k right after q; pass 1: after q on another input
            G->linear_forward(y[0], pass ? xd2 : xd1, &w[0], NULL, N);
            if (pass) G->linear_forward(y[0], xd2, &w[2], NULL, N);  // a call between: k must not take q's codes
            G->linear_forward(y[0], xd1, &w[1], NULL, N);
            G->linear_forward(y[1], xd1, &w[2], NULL, N);
            check_same_bytes(pass ? "k's forward after another input" : "k's forward reusing q's input", y[0], y[1], (size_t)N * OC * 2);
            G->linear_backward(dx[0], 0, dw[0], NULL, dyd, xd1, &w[0], N);
            G->linear_backward(dx[0], 0, dw[0], NULL, dyd, xd1, &w[1], N);
            G->linear_backward(dx[1], 0, dw[1], NULL, dyd, xd1, &w[2], N);
            G->zero(dw[0], (size_t)OC * C * 4);  // k's alone: q's went in first
            G->linear_backward(NULL, 0, dw[0], NULL, dyd, xd1, &w[0], N);
            G->linear_backward(NULL, 0, dw[0], NULL, dyd, xd1, &w[1], N);
            G->zero(dw[1], (size_t)OC * C * 4);
            G->linear_backward(NULL, 0, dw[1], NULL, dyd, xd1, &w[2], N);
            check_same_bytes("k's dX", dx[0], dx[1], (size_t)N * C * 2);
        }
        // dW of k after q = dW(q) + dW(k); of k alone = dW(k): compare k's part through a fresh q-only run
        void *dq = G->alloc((size_t)OC * C * 4);
        G->zero(dq, (size_t)OC * C * 4);
        G->linear_backward(NULL, 0, dq, NULL, dyd, xd1, &w[0], N);
        float *a = down_hp(dw[0], (size_t)OC * C), *b = down_hp(dw[1], (size_t)OC * C), *q = down_hp(dq, (size_t)OC * C);
        long bad = 0;
        for (size_t i = 0; i < (size_t)OC * C; i++) bad += a[i] - q[i] != b[i] && fabsf(a[i] - q[i] - b[i]) > 1e-6f * (fabsf(a[i]) + fabsf(q[i]));
        ck_assert_msg(bad == 0, "k's dW after q differs from k's alone in %ld values", bad);
        printf("  %s: k's dW after q = q's + k's alone (%d values)\n", kind ? "current" : "block", OC * C);
        for (int i = 0; i < 3; i++) G->fp8_train_free(w[i].train), G->free(w[i].dense);
        for (int i = 0; i < 2; i++) G->free(y[i]), G->free(dx[i]), G->free(dw[i]), free(wh[i]);
        G->free(dq), G->free(xd1), G->free(xd2), G->free(dyd);
        free(a), free(b), free(q), free(x1), free(x2), free(dy);
    }
}
END_TEST

// A checkpoint's delayed-scaling state (fp8_train_state): a linear trained for some steps, its
// state set into a fresh one, which then gets the same state back and makes the same bytes as the
// original at the next step (the scales the GEMMs read were uploaded); a fresh one without it does
// not (its scale is still 1)
START_TEST(test_delayed_state) {
    int N = 256, C = 384, OC = 128;
    FP8Recipe r = fp8_recipe_default();
    r.history_len = 5;
    QWeight w[2];
    float *wh = randn_bf((size_t)OC * C, 0.05f);
    for (int i = 0; i < 2; i++) w[i] = trained_weight(wh, OC, C, &r, NULL);
    void *y[2] = {G->alloc((size_t)N * OC * 2), G->alloc((size_t)N * OC * 2)}, *dx = G->alloc((size_t)N * C * 2);
    void *dw = G->alloc((size_t)OC * C * 4);
    long overflows = 0;
    for (int step = 0; step < 3; step++) {  // amaxes that change from step to step: a history of distinct values
        float *x = randn_bf((size_t)N * C, ldexpf(1.0f, step + 2)), *dy = randn_bf((size_t)N * OC, ldexpf(1e-3f, -step));
        void *xd = up_act(x, (size_t)N * C), *dyd = up_act(dy, (size_t)N * OC);
        G->linear_forward(y[0], xd, &w[0], NULL, N);
        G->linear_backward(dx, 0, dw, NULL, dyd, xd, &w[0], N);
        G->fp8_train_step(&w[0].train, 1, NULL, NULL, &overflows);
        free(x), free(dy), G->free(xd), G->free(dyd);
    }
    size_t n = G->fp8_train_state(&w[0].train, 1, NULL, 0);
    ck_assert_int_eq(n, 3 * (1 + r.history_len));
    float *a = fmalloc(n), *b = fmalloc(n);
    G->fp8_train_state(&w[0].train, 1, a, 0);
    for (int i = 0; i < 3; i++) ck_assert_msg(a[i * (1 + r.history_len)] != 1.0f, "tensor %d's scale is still 1 after 3 steps", i);
    float *x = randn_bf((size_t)N * C, 8.0f);
    void *xd = up_act(x, (size_t)N * C);
    G->linear_forward(y[1], xd, &w[1], NULL, N);  // no state yet: scale 1, other bytes
    G->linear_forward(y[0], xd, &w[0], NULL, N);
    void *ya = down_bytes(y[0], (size_t)N * OC * 2), *yb = down_bytes(y[1], (size_t)N * OC * 2);
    ck_assert_msg(memcmp(ya, yb, (size_t)N * OC * 2) != 0, "a fresh linear made the trained one's bytes without its state");
    G->fp8_train_state(&w[1].train, 1, a, 1);
    G->fp8_train_state(&w[1].train, 1, b, 0);
    check_exact("the state set, read back", a, b, n * sizeof(float));
    G->linear_forward(y[1], xd, &w[1], NULL, N);
    check_same_bytes("Y with the state set", y[0], y[1], (size_t)N * OC * 2);
    printf("  delayed state: %zu floats round trip; the next forward equals the unbroken one's\n", n);
    for (int i = 0; i < 2; i++) G->fp8_train_free(w[i].train), G->free(w[i].dense), G->free(y[i]);
    G->free(dx), G->free(dw), G->free(xd);
    free(a), free(b), free(x), free(wh), free(ya), free(yb);
}
END_TEST

// The SwiGLU backward that writes gate's and up's dY as FP8 codes (swiglu_backward_q) against the
// per-op path (swiglu_backward, then each projection quantizes its dY): two identical gate / up pairs
// trained in step, one each way, after two steps of history give bit-identical dX, dW and, after
// the next step, the same delayed-scaling state (the fused pass recorded the same amaxes)
START_TEST(test_swiglu_backward_q) {
    int N = 384, C = 256, FF = 256;
    FP8Recipe r = fp8_recipe_default();
    r.kind = FP8_RECIPE_DELAYED;
    float *wh[2] = {randn_bf((size_t)FF * C, 0.05f), randn_bf((size_t)FF * C, 0.05f)};
    QWeight w[2][2];  // [path][gate, up]: up reads gate's input, so gate leads it (model.c's order)
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 2; i++) w[p][i] = trained_weight(wh[i], FF, C, &r, i ? w[p][0].train : NULL);
    size_t nx = (size_t)N * C, nf = (size_t)N * FF;
    void *dx[2], *dw[2][2], *dgu[2][2], *y = G->alloc(nf * 2);
    for (int p = 0; p < 2; p++) {
        dx[p] = G->alloc(nx * 2);
        for (int i = 0; i < 2; i++) dw[p][i] = G->alloc((size_t)FF * C * 4), dgu[p][i] = G->alloc(nf * 2);
    }
    long overflows = 0;
    for (int step = 0; step < 3; step++) {
        float *x = randn_bf(nx, 1.0f), *g = randn_bf(nf, 2.0f), *u = randn_bf(nf, 1.0f), *d = randn_bf(nf, ldexpf(1e-3f, step));
        void *xd = up_act(x, nx), *gd = up_act(g, nf), *ud = up_act(u, nf), *dd = up_act(d, nf);
        for (int p = 0; p < 2; p++) {
            for (int i = 0; i < 2; i++) G->linear_forward(y, xd, &w[p][i], NULL, N), G->zero(dw[p][i], (size_t)FF * C * 4);
            if (p == 0) G->swiglu_backward(dgu[p][0], dgu[p][1], dd, gd, ud, nf);
            else ck_assert_msg(G->swiglu_backward_q(dgu[p][0], dgu[p][1], dd, gd, ud, N, FF, &w[p][0], &w[p][1]),
                               "swiglu_backward_q declined a delayed recipe on whole tiles");
            G->linear_backward(dx[p], 0, dw[p][0], NULL, dgu[p][0], xd, &w[p][0], N);
            G->linear_backward(dx[p], 1, dw[p][1], NULL, dgu[p][1], xd, &w[p][1], N);
            FP8Train *ts[2] = {w[p][0].train, w[p][1].train};
            G->fp8_train_step(ts, 2, NULL, NULL, &overflows);
        }
        char what[96];
        snprintf(what, sizeof what, "step %d: dX through gate and up", step);
        check_same_bytes(what, dx[0], dx[1], nx * 2);
        for (int i = 0; i < 2; i++) {
            snprintf(what, sizeof what, "step %d: %s's dW", step, i ? "up" : "gate");
            check_same_bytes(what, dw[0][i], dw[1][i], (size_t)FF * C * 4);
        }
        free(x), free(g), free(u), free(d), G->free(xd), G->free(gd), G->free(ud), G->free(dd);
    }
    FP8Train *t0[2] = {w[0][0].train, w[0][1].train}, *t1[2] = {w[1][0].train, w[1][1].train};
    size_t n = G->fp8_train_state(t0, 2, NULL, 0);
    float *a = fmalloc(n), *b = fmalloc(n);
    G->fp8_train_state(t0, 2, a, 0), G->fp8_train_state(t1, 2, b, 0);
    check_exact("the delayed state (scales and amax histories) after 3 steps", a, b, n * sizeof(float));
    ck_assert_msg(a[2 * (1 + r.history_len)] != 1.0f, "dY's scale is still 1 after 3 steps");
    // where it does not apply it declines and does nothing: rows not a multiple of 128; blocks
    ck_assert_int_eq(G->swiglu_backward_q(dgu[1][0], dgu[1][1], y, y, y, N - 128 + 8, FF, &w[1][0], &w[1][1]), 0);
    FP8Recipe rb = fp8_recipe_default();
    rb.kind = FP8_RECIPE_BLOCK;
    QWeight wb[2] = {trained_weight(wh[0], FF, C, &rb, NULL), trained_weight(wh[1], FF, C, &rb, NULL)};
    ck_assert_int_eq(G->swiglu_backward_q(dgu[1][0], dgu[1][1], y, y, y, N, FF, &wb[0], &wb[1]), 0);
    printf("  swiglu_backward_q: dX, dW and the delayed state bit-identical to the per-op path over 3 steps\n");
    for (int i = 0; i < 2; i++) G->fp8_train_free(wb[i].train), G->free(wb[i].dense);
    for (int p = 0; p < 2; p++) {
        G->free(dx[p]);
        for (int i = 0; i < 2; i++) G->fp8_train_free(w[p][i].train), G->free(w[p][i].dense), G->free(dw[p][i]), G->free(dgu[p][i]);
    }
    G->free(y), free(a), free(b), free(wh[0]), free(wh[1]);
}
END_TEST

// The ops that write a kept input as FP8 codes alone (fp8_train_norm_q, fp8_train_glu_q) against the
// per-op path they replace (rmsnorm_forward / rmsnorm1p_forward, swiglu_forward / geglu_forward, then
// the consumer's forward keeping its input's codes): two identical delayed-scaling linears, one each
// way, over 3 steps of changing amaxes: the same codes, scale, rstd, product and, after each step, the
// same delayed state (the amaxes recorded alike); at the 1B shape's width and rows not a multiple of 8
START_TEST(test_kept_input_ops) {
    int N = 301, C = 2048, OC = 128, FF = 2048;
    FP8Recipe r = fp8_recipe_default();
    r.kind = FP8_RECIPE_DELAYED;
    float *wh = randn_bf((size_t)OC * C, 0.05f), *nw = randn_bf(C, 0.5f);
    void *nwd = up_act(nw, C);
    for (int op = 0; op < 4; op++) {  // norm, norm 1 + w, SwiGLU, GeGLU
        int glu = op >= 2, flag = op & 1;
        QWeight w[2] = {trained_weight(wh, OC, C, &r, NULL), trained_weight(wh, OC, C, &r, NULL)};
        size_t nx = (size_t)N * C;
        void *out = G->alloc(nx * 2), *y[2] = {G->alloc((size_t)N * OC * 2), G->alloc((size_t)N * OC * 2)};
        void *rs[2] = {G->alloc(N * 4), G->alloc(N * 4)}, *codes[2] = {G->alloc(nx), G->alloc(nx)};
        void *sc[2] = {G->alloc(16), G->alloc(16)};
        long overflows = 0;
        for (int step = 0; step < 3; step++) {
            float *x = randn_bf(nx, ldexpf(1.0f, step)), *u = randn_bf(nx, 1.0f);
            void *xd = up_act(x, nx), *ud = up_act(u, nx);
            FP8Tensor k[2];
            for (int p = 0; p < 2; p++) {
                memset(&k[p], 0, sizeof k[p]);
                k[p].data = (uint8_t *)codes[p], k[p].scale = (float *)sc[p];
            }
            if (!glu) (flag ? G->rmsnorm1p_forward : G->rmsnorm_forward)(out, rs[0], xd, nwd, N, C, 1e-6f);
            else (flag ? G->geglu_forward : G->swiglu_forward)(out, xd, ud, nx);
            ck_assert(G->fp8_train_forward_keep(y[0], out, &w[0], NULL, N, &k[0]));
            int made = glu ? G->fp8_train_glu_q(&k[1], xd, ud, N, FF, flag, &w[1])
                           : G->fp8_train_norm_q(&k[1], rs[1], xd, nwd, N, C, 1e-6f, flag, &w[1]);
            ck_assert_msg(made, "op %d declined a delayed recipe", op);
            G->linear_forward_q(y[1], &k[1], &w[1], NULL, N);
            char what[96];
            snprintf(what, sizeof what, "op %d step %d: the codes", op, step);
            check_same_bytes(what, codes[0], codes[1], nx);
            snprintf(what, sizeof what, "op %d step %d: the scale", op, step);
            check_same_bytes(what, sc[0], sc[1], 4);
            snprintf(what, sizeof what, "op %d step %d: the product", op, step);
            check_same_bytes(what, y[0], y[1], (size_t)N * OC * 2);
            if (!glu) {
                snprintf(what, sizeof what, "op %d step %d: rstd", op, step);
                check_same_bytes(what, rs[0], rs[1], N * 4);
            }
            ck_assert(k[1].rows == N && k[1].cols == C && k[1].gran == FP8_TENSOR && k[1].fmt == FP8_E4M3);
            for (int p = 0; p < 2; p++) G->fp8_train_step(&w[p].train, 1, NULL, NULL, &overflows);
            free(x), free(u), G->free(xd), G->free(ud);
        }
        size_t n = G->fp8_train_state(&w[0].train, 1, NULL, 0);
        float *a = fmalloc(n), *b = fmalloc(n);
        G->fp8_train_state(&w[0].train, 1, a, 0), G->fp8_train_state(&w[1].train, 1, b, 0);
        check_exact("the delayed state after 3 steps", a, b, n * sizeof(float));
        ck_assert_msg(a[0] != 1.0f, "X's scale is still 1 after 3 steps");
        for (int p = 0; p < 2; p++)
            G->fp8_train_free(w[p].train), G->free(w[p].dense), G->free(y[p]), G->free(rs[p]), G->free(codes[p]), G->free(sc[p]);
        G->free(out), free(a), free(b);
    }
    // where it does not apply it declines: a current-scaling consumer
    FP8Recipe rc = fp8_recipe_default();
    rc.kind = FP8_RECIPE_CURRENT;
    QWeight wc = trained_weight(wh, OC, C, &rc, NULL);
    FP8Tensor k;
    memset(&k, 0, sizeof k);
    ck_assert_int_eq(G->fp8_train_norm_q(&k, NULL, NULL, nwd, N, C, 1e-6f, 0, &wc), 0);
    printf("  fp8_train_norm_q / glu_q: codes, scale, rstd, product and delayed state the per-op path's, 3 steps\n");
    G->fp8_train_free(wc.train), G->free(wc.dense), G->free(nwd), free(wh), free(nw);
}
END_TEST

// ---- the LM head in FP8 (--fp8_lm_head) ------------------------------------------------

#define FMTNAME(f) ((f) == FP8_E5M2 ? "E5M2" : "E4M3")

// logprob_grad (cuda_common.cuh) on the CPU: the same operations, each rounded once in float
static float logprob_grad_cpu(float z, int is_t, float g, float L, float inv_temp) {
    volatile float a = z * inv_temp, b = a - L, p = expf(b), d = (is_t ? 1.0f : 0.0f) - p, e = g * d;
    return e * inv_temp;
}

// per row: a target (or -1), dlogp (some 0) and the lse of inv_temp z (z (n, V)), the inputs of the logits' gradient
static void head_rows(int32_t *t, float *g, float *lse, const float *z, int n, int V, float inv_temp) {
    for (int r = 0; r < n; r++) {
        t[r] = r % 7 == 3 ? -1 : rng_int(&rng, V);
        g[r] = r % 11 == 5 ? 0.0f : (float)rng_normal(&rng);
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < V; j++) m = fmax(m, (double)z[(size_t)r * V + j] * inv_temp);
        for (int j = 0; j < V; j++) sum += exp((double)z[(size_t)r * V + j] * inv_temp - m);
        lse[r] = (float)(m + log(sum));
    }
}

// The logits' gradient written as FP8 codes in both layouts in one pass (fp8_head_dz_q_cuda) against
// the CPU: the bf16 value logprobs_backward stores, encoded with the given scale (fp8_quantize_scaled_cpu,
// which the per-op path's quantization equals bit for bit). expf may differ in its last bit between the
// GPU and the C library, so a code may sit one step away where the bf16 value was a rounding tie
// apart (expected: well under one in 10^4); everything else bit for bit, both layouts, the amax, the scale.
START_TEST(test_head_dz_q) {
    float inv_temp = 1.0f / 0.7f;
    for (int k = 0; k < 6; k++) {
        // V not a multiple of 128: an edge tile of columns. 301 rows: edge tiles of rows, every transposed tile
        // written byte by byte; 384: whole row tiles, the others through tile_codes_write_t. k 4, 5: the
        // transposed codes as columns 32 .. 415 of a wider dz^T (a group of chunks), the other columns untouched
        int nr = k & 2 || k >= 4 ? 384 : 301, V = 1000, col0 = k >= 4 ? 32 : 0, ldt = nr + (k >= 4 ? 96 : 0);
        size_t n = (size_t)nr * V;
        FP8Format fmt = k & 1 ? FP8_E4M3 : FP8_E5M2;
        float *z = randn(n, 3.0f), *g = fmalloc(nr), *lse = fmalloc(nr), *x = fmalloc(n);
        int32_t *t = (int32_t *)mallocCheck(nr * 4);
        head_rows(t, g, lse, z, nr, V, inv_temp);
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < V; j++) {
                int live = t[r] >= 0 && g[r] != 0.0f;
                x[(size_t)r * V + j] = live ? bfr(logprob_grad_cpu(z[(size_t)r * V + j], j == t[r], g[r], lse[r], inv_temp)) : 0.0f;
            }
        float mul = fp8_max(fmt) / 4.0f;  // |dz| <= |dlogp| inv_temp, under 4 here
        FP8Tensor ref;
        fp8_tensor_alloc_cpu(&ref, nr, V, FP8_TENSOR, fmt, 1);
        float amax_ref = fp8_quantize_scaled_cpu(&ref, x, mul);
        FP8Tensor reft = transposed_copy(&ref);
        FP8Tensor q = dev_tensor(nr, V, FP8_TENSOR, fmt, 1), qt = dev_tensor(V, ldt, FP8_TENSOR, fmt, 1);
        uint8_t *fill = (uint8_t *)mallocCheck((size_t)V * ldt);
        memset(fill, 0xAB, (size_t)V * ldt);
        G->upload(qt.data, fill, (size_t)V * ldt);
        void *zd = up_hp(z, n), *gd = up_hp(g, nr), *ld = up_hp(lse, nr), *td = up_i32(t, nr), *md = up_hp(&mul, 1);
        unsigned zero = 0, amax_bits;
        void *ad = dev_bytes(&zero, 4);
        fp8_head_dz_q_cuda(&q, &qt, col0, (const float *)zd, (const float *)gd, (const float *)ld, (const int32_t *)td, inv_temp,
                           (const float *)md, (unsigned *)ad);
        G->download(&amax_bits, ad, 4);
        uint8_t *c[2] = {(uint8_t *)down_bytes(q.data, n), (uint8_t *)mallocCheck(n)}, *all = (uint8_t *)down_bytes(qt.data, (size_t)V * ldt);
        long outside = 0;  // dz^T's columns col0 .. col0 + nr - 1, and the others as they were
        for (int j = 0; j < V; j++)
            for (int i = 0; i < ldt; i++) {
                uint8_t b = all[(size_t)j * ldt + i];
                if (i >= col0 && i < col0 + nr) c[1][(size_t)j * nr + i - col0] = b;
                else outside += b != 0xAB;
            }
        ck_assert_msg(outside == 0, "%ld codes written outside the columns %d .. %d of dz^T", outside, col0, col0 + nr - 1);
        free(all), free(fill);
        const uint8_t *cr[2] = {ref.data, reft.data};
        long off[2] = {0, 0};
        for (int l = 0; l < 2; l++)
            for (size_t i = 0; i < n; i++) {
                if (c[l][i] == cr[l][i]) continue;
                off[l]++;
                int a = c[l][i], b = cr[l][i];
                ck_assert_msg((a & 0x80) == (b & 0x80) && abs((a & 0x7f) - (b & 0x7f)) == 1,
                              "%s dz code %zu of layout %d: gpu 0x%02x, cpu 0x%02x (more than one step apart)", FMTNAME(fmt), i,
                              l, a, b);
            }
        ck_assert_msg(off[0] == off[1] && off[0] * 10000 < (long)n, "%s: %ld / %ld codes one step away of %zu", FMTNAME(fmt),
                      off[0], off[1], n);
        float amax_gpu;
        memcpy(&amax_gpu, &amax_bits, 4);
        ck_assert_msg(fabsf(amax_gpu - amax_ref) <= 0x1p-8f * amax_ref, "amax %g, cpu %g", amax_gpu, amax_ref);
        float inv[2];
        G->download(&inv[0], q.scale, 4), G->download(&inv[1], qt.scale, 4);
        ck_assert_msg(inv[0] == ref.scale[0] && inv[1] == ref.scale[0], "scale %g %g, cpu %g", inv[0], inv[1], ref.scale[0]);
        long zeros = 0;  // rows without a target or dlogp: all zero codes
        for (int r = 0; r < nr; r++)
            if (t[r] < 0 || g[r] == 0.0f)
                for (int j = 0; j < V; j++) zeros += c[0][(size_t)r * V + j] != 0;
        ck_assert_int_eq(zeros, 0);
        printf("  head dz %s, %d x %d (dz^T's columns from %d of %d): codes of both layouts the CPU's (%ld one step away: "
               "expf's last bit), amax, scale\n", FMTNAME(fmt), nr, V, col0, ldt, off[0]);
        fp8_tensor_free_cpu(&ref), fp8_tensor_free_cpu(&reft), dev_tensor_free(&q), dev_tensor_free(&qt);
        free(c[0]), free(c[1]), free(z), free(g), free(lse), free(x), free(t);
        G->free(zd), G->free(gd), G->free(ld), G->free(td), G->free(md), G->free(ad);
    }
}
END_TEST

// The LM head trained in FP8 through the backend's ops (logprobs_fused, logprobs_forward, logits_forward),
// chunks of 128 rows (three, the last ragged) in groups of two for dW, two steps of delayed scaling, against the CPU in fp64 on
// the operands the recipe defines: h and W quantized with the scales the CPU's DelayedScale mirror
// gives (which must be the GPU's), dz with the GPU's dy scale. The bounds, from the formats: the
// logits within the FP8 tensor cores' accumulation (ACC_TC of sum |h w|, e); lse within inv_temp max e
// of the row, logp within inv_temp (e_t + max e). dz: the GPU's codes differ from the exact gradient by
// what the logits' error does to exp (|dlogp| inv_temp p (exp(inv_temp (e + max e)) - 1)), the bf16
// rounding (2^-9), the FP8 rounding (half a step: 2^-3 E5M2, relative) and half the smallest
// subnormal; dh = dz W and dW = dz^T h within the sums of those through |W|, |h|, plus ACC_TC and dh's
// bf16 rounding.
START_TEST(test_fp8_head) {
    // read at the first logprobs call of the process (this one): chunks of 128 rows, and the weight gradient's
    // product over groups of two chunks (rows 0 .. 255, then the ragged 256 .. 300)
    setenv("FP8GRPO_LOGITS_CHUNK_ROWS", "128", 1);
    setenv("FP8GRPO_HEAD_GROUP_ROWS", "256", 1);
    int N = 301, C = 256, V = 1000;
    float inv_temp = 1.0f / 0.8f;
    FP8Recipe r = fp8_recipe_default();
    r.history_len = 4;
    r.margin = 1;  // dz's amax moves between the steps: room for it (the bound has no term for saturation)
    r.lm_head = 1;
    Mirror mr;
    memset(&mr, 0, sizeof mr);
    mr.r = r;
    delayed_init(&mr.d[0], &r, FP8_E4M3);
    delayed_init(&mr.d[1], &r, FP8_E4M3);
    float *w = randn_bf((size_t)V * C, 0.05f);
    QWeight qw = trained_weight(w, V, C, &r, NULL);
    size_t per = 1 + (size_t)r.history_len, ns = G->fp8_train_state(&qw.train, 1, NULL, 0);
    ck_assert_int_eq(ns, 3 * per);
    float *state = fmalloc(ns);
    void *logp = G->alloc(N * 4), *logp2 = G->alloc(N * 4), *lse = G->alloc(N * 4), *dh = G->alloc((size_t)N * C * 2);
    void *dw = G->alloc((size_t)V * C * 4), *zd = G->alloc((size_t)N * V * 4);
    long overflows = 0;
    for (int step = 0; step < 2; step++) {
        float *h = randn_bf((size_t)N * C, 1.0f + step), *g = fmalloc(N);
        int32_t *t = (int32_t *)mallocCheck(N * 4);
        for (int i = 0; i < N; i++) {
            t[i] = i % 7 == 3 ? -1 : rng_int(&rng, V);
            g[i] = i % 11 == 5 ? 0.0f : (float)(-1.0 + 0.25 * rng_normal(&rng)) / N;
        }
        void *hd = up_act(h, (size_t)N * C), *gd = up_hp(g, N), *td = up_i32(t, N);
        G->fp8_train_state(&qw.train, 1, state, 0);  // the scales in force: x and w the mirror's, dy the GPU's
        ck_assert_msg(state[0] == mr.d[0].scale && state[per] == mr.d[1].scale, "step %d: h's / W's scale %g %g, the mirror's %g %g",
                      step, state[0], state[per], mr.d[0].scale, mr.d[1].scale);
        float sdy = state[2 * per];
        G->zero(dw, (size_t)V * C * 4);
        G->logprobs_fused(logp, lse, dh, dw, gd, hd, &qw, (const int32_t *)td, inv_temp, N);
        G->logprobs_forward(logp2, lse, hd, &qw, (const int32_t *)td, inv_temp, N);
        G->logits_forward(zd, hd, &qw, N);
        // the CPU: the recipe's operands, fp64
        FP8Tensor hq, wq;
        ref_quantize(&hq, &mr, 0, h, N, C);
        ref_quantize(&wq, &mr, 1, w, V, C);
        float *hf = fmalloc((size_t)N * C), *wf = fmalloc((size_t)V * C);
        fp8_dequantize_cpu(hf, &hq), fp8_dequantize_cpu(wf, &wq);
        size_t nz = (size_t)N * V;
        double *z = dmalloc_h(nz), *e = dmalloc_h(nz), *dz = dmalloc_h(nz), *bz = dmalloc_h(nz);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < V; j++) {
                double s = 0, m = 0;
                for (int k = 0; k < C; k++) {
                    double p = (double)hf[(size_t)i * C + k] * wf[(size_t)j * C + k];
                    s += p, m += fabs(p);
                }
                z[(size_t)i * V + j] = s, e[(size_t)i * V + j] = ACC_TC * m + 0x1p-23 * fabs(s);
            }
        float *lr = fmalloc(N), *lpr = fmalloc(N), *zr = fmalloc(nz);
        double *tl = dmalloc_h(N), *tlp = dmalloc_h(N), *tz = dmalloc_h(nz);
        double usub = (r.hybrid ? 0x1p-17 : 0x1p-10) / sdy, u = r.hybrid ? 0x1p-3 : 0x1p-4;  // half a subnormal, half a step
        for (int i = 0; i < N; i++) {
            double m = -INFINITY, sum = 0, emax = 0;
            for (int j = 0; j < V; j++) m = fmax(m, z[(size_t)i * V + j] * inv_temp), emax = fmax(emax, e[(size_t)i * V + j]);
            for (int j = 0; j < V; j++) sum += exp(z[(size_t)i * V + j] * inv_temp - m);
            double L = m + log(sum);
            lr[i] = t[i] < 0 ? 0.0f : (float)L, tl[i] = inv_temp * emax + 1e-6 * fabs(L);  // no target: lse 0
            int live = t[i] >= 0 && g[i] != 0.0f;
            lpr[i] = t[i] < 0 ? 0.0f : (float)(z[(size_t)i * V + t[i]] * inv_temp - L);
            tlp[i] = t[i] < 0 ? 0 : inv_temp * (e[(size_t)i * V + t[i]] + emax) + 1e-6 * fabs(L);
            for (int j = 0; j < V; j++) {
                size_t k = (size_t)i * V + j;
                double p = exp(z[k] * inv_temp - L), gi = fabs((double)g[i]) * inv_temp;
                dz[k] = live ? g[i] * ((j == t[i]) - p) * inv_temp : 0;
                double d = live ? gi * p * expm1(inv_temp * (e[k] + emax)) : 0;  // the logits' error through exp
                bz[k] = live ? d + (0x1p-9 + u) * (fabs(dz[k]) + d) + usub : 0;
                zr[k] = (float)z[k], tz[k] = e[k];
            }
        }
        // dh = dz W, dW = dz^T h and their bounds
        double *dhr = dmalloc_h((size_t)N * C), *tdh = dmalloc_h((size_t)N * C), *dwr = dmalloc_h((size_t)V * C),
               *tdw = dmalloc_h((size_t)V * C);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < V; j++) {
                size_t k = (size_t)i * V + j;
                if (dz[k] == 0 && bz[k] == 0) continue;
                double a = fabs(dz[k]) + bz[k];
                for (int c = 0; c < C; c++) {
                    double wv = wf[(size_t)j * C + c], hv = hf[(size_t)i * C + c];
                    dhr[(size_t)i * C + c] += dz[k] * wv, tdh[(size_t)i * C + c] += bz[k] * fabs(wv) + ACC_TC * a * fabs(wv);
                    dwr[(size_t)j * C + c] += dz[k] * hv, tdw[(size_t)j * C + c] += bz[k] * fabs(hv) + ACC_TC * a * fabs(hv);
                }
            }
        float *dhf = to_f(dhr, (size_t)N * C), *dwf = to_f(dwr, (size_t)V * C);
        for (size_t k = 0; k < (size_t)N * C; k++) tdh[k] += 0x1p-8 * (fabs(dhr[k]) + tdh[k]) + 1e-30;
        for (size_t k = 0; k < (size_t)V * C; k++) tdw[k] += 1e-30;
        float *lg = down_hp(logp, N), *lg2 = down_hp(logp2, N), *lsg = down_hp(lse, N), *zg = down_hp(zd, nz);
        float *dhg = down_act(dh, (size_t)N * C), *dwg = down_hp(dw, (size_t)V * C);
        printf("FP8 LM head, step %d (h, W, dz scales %g, %g, %g):\n", step, state[0], state[per], sdy);
        check_close("logits = h W^T (logits_forward)", zg, zr, tz, nz);
        check_close("lse", lsg, lr, tl, N);
        check_close("logp", lg, lpr, tlp, N);
        check_exact("logp of logprobs_forward and of logprobs_fused", lg, lg2, N * 4);
        check_close("dh = dz W", dhg, dhf, tdh, (size_t)N * C);
        check_close("dW = dz^T h (two products, 3 chunks)", dwg, dwf, tdw, (size_t)V * C);
        G->fp8_train_step(&qw.train, 1, NULL, NULL, &overflows);  // the histories roll, as after an optimizer step
        for (int i = 0; i < 2; i++) delayed_update(&mr.d[i]);
        free(w);
        w = randn_bf((size_t)V * C, 0.05f * (step + 2));  // the optimizer's new weights
        void *wd = up_act(w, (size_t)V * C);
        G->copy(qw.dense, wd, (size_t)V * C * 2);
        G->free(wd);
        fp8_tensor_free_cpu(&hq), fp8_tensor_free_cpu(&wq);
        void *frees[] = {h, g, t, hf, wf, z, e, dz, bz, lr, lpr, zr, tl, tlp, tz, dhr, tdh, dwr, tdw, dhf, dwf, lg, lg2, lsg, zg, dhg, dwg};
        for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) free(frees[i]);
        G->free(hd), G->free(gd), G->free(td);
    }
    G->fp8_train_state(&qw.train, 1, state, 0);
    ck_assert_msg(state[2 * per] != 1.0f && overflows == 0, "dz's scale %g after 2 steps, %ld overflows", state[2 * per], overflows);
    G->fp8_train_free(qw.train);
    void *gf[] = {qw.dense, logp, logp2, lse, dh, dw, zd};
    for (size_t i = 0; i < sizeof gf / sizeof gf[0]; i++) G->free(gf[i]);
    free(w), free(state);
    for (int i = 0; i < 2; i++) delayed_free(&mr.d[i]);
}
END_TEST

static Suite *gpu_fp8_train_suite(void) {
    Suite *s = suite_create("gpu_fp8_train");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_quantize_scaled);
    tcase_add_test(tc, test_quantize_transposed);
    tcase_add_test(tc, test_linear_recipes);
    tcase_add_test(tc, test_shared_input);
    tcase_add_test(tc, test_delayed_state);
    tcase_add_test(tc, test_swiglu_backward_q);
    tcase_add_test(tc, test_kept_input_ops);
    tcase_add_test(tc, test_head_dz_q);
    tcase_add_test(tc, test_fp8_head);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    char why[256];
    G = backend_cuda(why, sizeof why);
    if (!G) {
        fprintf(stderr, "gpu_fp8_train: %s; this suite runs on a GPU machine (make test-gpu)\n", why);
        return 1;
    }
    CPU = backend_cpu();
    rng = rng_make(20261125);
    printf("gpu_fp8_train on %s\n", G->device_desc);
    return run_suite(gpu_fp8_train_suite());
}
