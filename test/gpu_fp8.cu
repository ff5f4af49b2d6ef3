// test/gpu_fp8.cu: GPU suite for fp8.cu against the CPU reference (fp8_cpu.c).
// Casts bit for bit on every BF16 pattern; quantization (tensor / row / 1x128 / 128x128,
// E4M3 and E5M2, pow2, bf16 and f32 input) byte for byte, scales exactly; dequantization
// exactly; the FP8 GEMM on every backend (cuBLASLt, the Hopper wgmma kernel where the GPU
// and build have sm_90a, mma kernel, tiled kernel, BF16 fallback) against fp8_gemm_cpu with
// tolerances derived from the formats; the BF16 GEMM
// and the backward dX (the BF16 reference and the FP8 product, W^T's transposition byte for byte).
// Inputs are random, with adversarial cases: all-positive values
// with K = 16384, rows of zeros, values far beyond the FP8 range.
// Run on a GPU: make test-gpu (CK_FORK=no: a CUDA context does not survive fork).
#include <check.h>
#include <cuda_runtime.h>
#include <math.h>

#include "fp8.h"
#include "testutil.h"
#include "cuda/fp8_cuda.h"

#define CU(e)                                                                                           \
    do {                                                                                                \
        cudaError_t err_ = (e);                                                                         \
        if (err_ != cudaSuccess) ck_abort_msg("CUDA %s at %s:%d", cudaGetErrorString(err_), __FILE__, __LINE__); \
    } while (0)

// Check's ck_assert records a location per call (a write in no-fork mode), too slow for
// millions of elements: count failures, print the first few, assert once per loop.
static long n_bad;
#define EXPECT(cond, ...) \
    do { if (!(cond) && n_bad++ < 3) { fprintf(stderr, "  " __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)
#define EXPECT_NONE(what) \
    do { long nb_ = n_bad; n_bad = 0; ck_assert_msg(nb_ == 0, "%s: %ld failures (first ones above)", (what), nb_); } while (0)

static void *dmalloc(size_t n) { void *p; CU(cudaMalloc(&p, n ? n : 1)); return p; }
static void *dup_to_device(const void *h, size_t n) { void *d = dmalloc(n); CU(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); return d; }
static void download(void *h, const void *d, size_t n) { CU(cudaDeviceSynchronize()); CU(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }

// random values: log-normal magnitudes over sigma binades, random signs (never zero)
static void fill_random(float *x, size_t n, Rng *r, float sigma, int all_positive) {
    for (size_t i = 0; i < n; i++) {
        float v = expf(rng_normal(r) * sigma);
        x[i] = (!all_positive && rng_uniform(r) < 0.5f) ? -v : v;
    }
}
// round to bf16 in place (so the CPU sees exactly what a bf16 input holds)
static void round_bf16(float *x, uint16_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) { b[i] = f32_to_bf16(x[i]); x[i] = bf16_to_f32(b[i]); }
}

// ----------------------------------------------------------------------------
// casts

START_TEST(test_casts_all_bf16_and_specials) {
    size_t n = 65536 + 16;
    float *x = (float *)mallocCheck(n * 4);
    for (size_t i = 0; i < 65536; i++) x[i] = bf16_to_f32((uint16_t)i);
    float sp[16] = {INFINITY, -INFINITY, NAN, -NAN, 1e30f, -1e30f, 1e-40f, -1e-40f,
                    464.0f, 480.0f, 61440.0f, 57344.0f, ldexpf(1, -10), ldexpf(3, -10), ldexpf(1, -17), -0.0f};
    memcpy(x + 65536, sp, sizeof sp);
    float *dx = (float *)dup_to_device(x, n * 4);
    uint8_t *dq = (uint8_t *)dmalloc(n), *q = (uint8_t *)mallocCheck(n);
    for (int f = 0; f < 2; f++) {
        fp8_cast_f32_cuda(dq, dx, n, (FP8Format)f);
        download(q, dq, n);
        long bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint8_t want = fp8_encode((FP8Format)f, x[i]);
            if (q[i] != want && bad++ < 5) fprintf(stderr, "cast fmt %d x=%g: gpu 0x%02x cpu 0x%02x\n", f, x[i], q[i], want);
        }
        ck_assert_msg(bad == 0, "fmt %d: %ld casts differ from the CPU codec", f, bad);
    }
    // decode all 256 codes
    uint8_t codes[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    uint8_t *dc = (uint8_t *)dup_to_device(codes, 256);
    float *dd = (float *)dmalloc(256 * 4), dec[256];
    for (int f = 0; f < 2; f++) {
        fp8_decode_f32_cuda(dd, dc, 256, (FP8Format)f);
        download(dec, dd, 256 * 4);
        for (int i = 0; i < 256; i++) {
            float want = fp8_decode((FP8Format)f, (uint8_t)i);
            EXPECT((isnan(want) && isnan(dec[i])) || (want == dec[i] && !!signbit(want) == !!signbit(dec[i])),
                   "decode fmt %d code 0x%02x: gpu %g cpu %g", f, i, dec[i], want);
        }
        EXPECT_NONE("decode");
    }
    cudaFree(dx); cudaFree(dq); cudaFree(dc); cudaFree(dd);
    free(x); free(q);
}
END_TEST

// ----------------------------------------------------------------------------
// quantize / dequantize: byte-exact against the CPU

typedef enum { DATA_RANDOM, DATA_ZERO_ROWS, DATA_HUGE, DATA_POSITIVE, DATA_SWEEP } DataKind;

static void make_input(float *x, int R, int C, DataKind kind, Rng *r) {
    if (kind == DATA_SWEEP) {  // every bf16 pattern in turn, in groups of 128 led by their amax
        uint32_t p = 0;        // (2^-70 .. 2^71, either sign); larger values scaled down below it
        for (int i = 0; i < R; i++)
            for (int c = 0; c < C; c++) {
                float v;
                if (c % 128 == 0) {
                    v = ldexpf(1.0f + rng_uniform(r), (int)(rng_uniform(r) * 141) - 70);
                    if (rng_uniform(r) < 0.5f) v = -v;
                } else {
                    uint16_t b = (uint16_t)(p++ & 0xffff);  // zeros, subnormals, inf and NaN among them,
                    if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) b |= 0x40;  // NaNs quiet: C's fmaxf makes a
                    v = bf16_to_f32(b);  // signaling one NaN (the CPU's amax restarts after it), the GPU's
                                         // max ignores it; no arithmetic makes one
                    float lead = fabsf(x[(size_t)i * C + c / 128 * 128]);
                    while (isfinite(v) && fabsf(v) > lead) v = ldexpf(v, -16);
                }
                x[(size_t)i * C + c] = v;
            }
        return;
    }
    fill_random(x, (size_t)R * C, r, 2.0f, kind == DATA_POSITIVE);
    if (kind == DATA_ZERO_ROWS)
        for (int i = 0; i < R; i += 3) memset(x + (size_t)i * C, 0, C * sizeof(float));  // rows of zeros (and, with
                                                                                        // 1 row, a zero tensor)
    if (kind == DATA_HUGE)
        for (size_t i = 0; i < (size_t)R * C; i++) x[i] *= 1e6f;  // far beyond 448 and 57344
}

static void check_quantize(int R, int C, FP8Gran gran, int block_rows, FP8Format fmt, int pow2, DType xdt, DataKind kind) {
    Rng r = rng_make((uint64_t)R * 7919 + C * 31 + gran * 5 + fmt * 3 + pow2 + kind * 1000 + xdt);
    size_t n = (size_t)R * C;
    float *x = (float *)mallocCheck(n * 4);
    uint16_t *xb = (uint16_t *)mallocCheck(n * 2);
    make_input(x, R, C, kind, &r);
    if (xdt == DT_BF16) round_bf16(x, xb, n);
    FP8Tensor ref;
    fp8_tensor_alloc_cpu(&ref, R, C, gran, fmt, block_rows);
    fp8_quantize_cpu(&ref, x, pow2);
    size_t ns = fp8_num_scales(gran, R, C, ref.block_rows);
    FP8Tensor t = ref;
    t.data = (uint8_t *)dmalloc(n);
    t.scale = (float *)dmalloc(ns * 4);
    CU(cudaMemset(t.data, 0xAB, n));
    CU(cudaMemset(t.scale, 0xFF, ns * 4));  // NaN: every scale must be written
    void *dx = xdt == DT_BF16 ? dup_to_device(xb, n * 2) : dup_to_device(x, n * 4);
    fp8_quantize_cuda(&t, dx, xdt, pow2);
    uint8_t *q = (uint8_t *)mallocCheck(n);
    float *s = (float *)mallocCheck(ns * 4);
    download(q, t.data, n);
    download(s, t.scale, ns * 4);
    long bad = 0;
    for (size_t i = 0; i < n; i++)
        if (q[i] != ref.data[i] && bad++ < 3)
            fprintf(stderr, "quantize %dx%d %s fmt %d: [%zu] x=%g gpu 0x%02x cpu 0x%02x\n", R, C, fp8_gran_name(gran), fmt, i, x[i], q[i], ref.data[i]);
    ck_assert_msg(bad == 0, "quantize %dx%d %s/%d fmt %d pow2 %d %s kind %d: %ld codes differ", R, C, fp8_gran_name(gran),
                  block_rows, fmt, pow2, dtype_name(xdt), kind, bad);
    for (size_t i = 0; i < ns; i++)
        EXPECT(s[i] == ref.scale[i], "quantize %dx%d %s/%d: scale %zu gpu %g cpu %g", R, C, fp8_gran_name(gran),
               block_rows, i, s[i], ref.scale[i]);
    EXPECT_NONE("quantize scales");
    // dequantize: f32 exactly decode * scale, bf16 that rounded to nearest even
    float *dqf = (float *)dmalloc(n * 4), *hf = (float *)mallocCheck(n * 4), *rf = (float *)mallocCheck(n * 4);
    uint16_t *dqb = (uint16_t *)dmalloc(n * 2), *hb = (uint16_t *)mallocCheck(n * 2);
    fp8_dequantize_cuda(dqf, DT_F32, &t);
    fp8_dequantize_cuda(dqb, DT_BF16, &t);
    download(hf, dqf, n * 4);
    download(hb, dqb, n * 2);
    fp8_dequantize_cpu(rf, &ref);
    for (size_t i = 0; i < n; i++) {
        EXPECT(hf[i] == rf[i] || (isnan(hf[i]) && isnan(rf[i])), "dequantize f32 [%zu]: %g vs %g", i, hf[i], rf[i]);
        EXPECT(hb[i] == f32_to_bf16(rf[i]) || isnan(rf[i]), "dequantize bf16 [%zu]", i);
    }
    EXPECT_NONE("dequantize");
    fp8_tensor_free_cpu(&ref);
    cudaFree(t.data); cudaFree(t.scale); cudaFree(dx); cudaFree(dqf); cudaFree(dqb);
    free(x); free(xb); free(q); free(s); free(hf); free(rf); free(hb);
}

START_TEST(test_quantize_all) {
    int shapes[][2] = {{200, 300}, {1, 1}, {130, 129}, {333, 4096}, {1, 1000}, {256, 384}};
    struct { FP8Gran g; int br; } grans[] = {{FP8_TENSOR, 0}, {FP8_ROW, 0}, {FP8_BLOCK, 1}, {FP8_BLOCK, 128}};
    int n = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int gi = 0; gi < 4; gi++)
            for (int f = 0; f < 2; f++)
                for (int pow2 = 0; pow2 < 2; pow2++)
                    for (int k = 0; k < 4; k++) {
                        DType xdt = (k + pow2 + f) % 2 ? DT_BF16 : DT_F32;  // both input types over the sweep
                        check_quantize(shapes[si][0], shapes[si][1], grans[gi].g, grans[gi].br, (FP8Format)f, pow2, xdt, (DataKind)k);
                        n++;
                    }
    fprintf(stderr, "quantize: %d cases byte-exact\n", n);
}
END_TEST
// The GPU divides by a group's scale through its reciprocal and two corrections (fp8_div_fast) where
// that is exact, by IEEE division elsewhere: every bf16 pattern, eight times over (4,096 groups of 128
// whose scales span both ranges; groups with inf, NaN, zeros and subnormals), byte for byte against the
// CPU's division, at every granularity and format, rounded and power-of-two scales
START_TEST(test_quantize_bf16_sweep) {
    struct { FP8Gran g; int br; } grans[] = {{FP8_TENSOR, 0}, {FP8_ROW, 0}, {FP8_BLOCK, 1}, {FP8_BLOCK, 128}};
    for (int gi = 0; gi < 4; gi++)
        for (int f = 0; f < 2; f++)
            for (int pow2 = 0; pow2 < 2; pow2++)
                for (int xb = 0; xb < 2; xb++)
                    check_quantize(4096, 128, grans[gi].g, grans[gi].br, (FP8Format)f, pow2, xb ? DT_BF16 : DT_F32, DATA_SWEEP);
}
END_TEST

// ----------------------------------------------------------------------------
// GEMM. The reference is a float64 product of the dequantized operands (= fp8_gemm_cpu up to
// its fp32 rounding). The tolerance is
//   |y - ref| <= ACC * sum_k |x_k w_k| (dequantized) + OUT * |ref|
// OUT = 2^-8 for a bf16 output (half an ulp of an 8-bit significand), 0 for f32. ACC by path:
// - fp32 accumulation (our kernels; on sm_90 mma.sync e4m3 runs as f16 HMMA, exact products,
//   fp32 sums): the recursive-summation bound (K + 4) 2^-24 <= 2^-10 for K <= 16384.
// - cuBLASLt FP8 on Hopper: the tensor cores add the 32 products of one instruction at
//   reduced precision: ~14 significant bits (DeepSeek-V3, sec. 3.3.2), the products aligned
//   to the largest and truncated; cuBLASLt (fast accumulation off) promotes the partial sums
//   to fp32 between instructions. Each product can lose up to 2^-13 of the group's largest
//   term, so a group of 32 loses < 32 * 2^-13 = 2^-8 of its sum |x w|: ACC_TC = 2^-8.
// - the wgmma kernel (Hopper): the same tensor cores, a fresh accumulator per 128-wide K step
//   promoted to fp32 on the CUDA cores (4 instructions of 32 in the tensor cores' sum): ACC_TC.
// - fast accumulation: the whole K in the reduced-precision accumulator; reported, bounded by 2^-5.

// t (rows, cols, gran, fmt, block_rows set) quantized on the GPU from the host values h, into
// data and scales allocated on the device
static void quantize_on_device(FP8Tensor *t, const float *h, int pow2) {
    size_t n = (size_t)t->rows * t->cols;
    float *d = (float *)dup_to_device(h, n * 4);
    t->data = (uint8_t *)dmalloc(n);
    t->scale = (float *)dmalloc(fp8_num_scales(t->gran, t->rows, t->cols, t->block_rows) * 4);
    fp8_quantize_cuda(t, d, DT_F32, pow2);
    CU(cudaDeviceSynchronize());
    cudaFree(d);
}

typedef struct {
    FP8Tensor x, w;        // device
    FP8Tensor hx, hw;      // host copies (the CPU reference's)
    double *ref, *mag;     // (M, N)
} GemmCase;

static void gemm_case_make(GemmCase *c, int M, int N, int K, FP8Gran gran, FP8Format fx, FP8Format fw, DataKind kind, int pow2) {
    Rng r = rng_make((uint64_t)M * 131 + N * 17 + K + gran * 7 + fx + kind * 100);
    float *x = (float *)mallocCheck((size_t)M * K * 4), *w = (float *)mallocCheck((size_t)N * K * 4);
    make_input(x, M, K, kind, &r);
    fill_random(w, (size_t)N * K, &r, 1.0f, kind == DATA_POSITIVE);
    fp8_tensor_alloc_cpu(&c->hx, M, K, gran, fx, 1);
    fp8_tensor_alloc_cpu(&c->hw, N, K, gran, fw, 128);
    // quantize on the GPU (the path the model takes), reference from the CPU quantizer
    // (the quantize test shows they are byte-identical)
    fp8_quantize_cpu(&c->hx, x, pow2);
    fp8_quantize_cpu(&c->hw, w, pow2);
    c->x = c->hx; c->w = c->hw;
    quantize_on_device(&c->x, x, pow2);
    quantize_on_device(&c->w, w, pow2);
    // float64 reference of the dequantized product, and sum |x w|
    float *dx = (float *)mallocCheck((size_t)M * K * 4), *dw = (float *)mallocCheck((size_t)N * K * 4);
    fp8_dequantize_cpu(dx, &c->hx);
    fp8_dequantize_cpu(dw, &c->hw);
    c->ref = (double *)mallocCheck((size_t)M * N * 8);
    c->mag = (double *)mallocCheck((size_t)M * N * 8);
    #pragma omp parallel for
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            const float *xr = dx + (size_t)m * K, *wr = dw + (size_t)n * K;
            for (int k = 0; k < K; k++) { double p = (double)xr[k] * wr[k]; s += p; a += fabs(p); }
            c->ref[(size_t)m * N + n] = s;
            c->mag[(size_t)m * N + n] = a;
        }
    free(x); free(w); free(dx); free(dw);
}
static void gemm_case_free(GemmCase *c) {
    cudaFree(c->x.data); cudaFree(c->x.scale); cudaFree(c->w.data); cudaFree(c->w.scale);
    fp8_tensor_free_cpu(&c->hx); fp8_tensor_free_cpu(&c->hw);
    free(c->ref); free(c->mag);
}

// run the GPU GEMM (backend b, output ydt) and compare; returns the worst err / tol (<= 1 passes)
static double gemm_check(GemmCase *c, FP8GemmBackend b, DType ydt, int accumulate, double acc_tol, const char *want_backend) {
    int M = c->x.rows, N = c->w.rows;
    size_t n = (size_t)M * N, esz = ydt == DT_BF16 ? 2 : 4;
    void *dy = dmalloc(n * esz);
    void *hy = mallocCheck(n * esz);
    float *prev = (float *)mallocCheck(n * 4);
    if (accumulate) {  // prefill with values of the output's magnitude
        Rng r = rng_make(n);
        for (size_t i = 0; i < n; i++) {
            float v = (float)c->ref[i] * (rng_uniform(&r) - 0.5f);
            if (ydt == DT_BF16) { ((uint16_t *)hy)[i] = f32_to_bf16(v); prev[i] = bf16_to_f32(((uint16_t *)hy)[i]); }
            else { ((float *)hy)[i] = v; prev[i] = v; }
        }
        CU(cudaMemcpy(dy, hy, n * esz, cudaMemcpyHostToDevice));
    } else {
        CU(cudaMemset(dy, 0xFF, n * esz));  // NaN poison: every element must be written
        memset(prev, 0, n * 4);
    }
    fp8_cuda_set_backend(b);
    fp8_gemm_cuda(dy, ydt, &c->x, &c->w, accumulate);
    download(hy, dy, n * esz);
    fp8_cuda_set_backend(FP8_GEMM_AUTO);
    if (want_backend) ck_assert_msg(!strcmp(fp8_cuda_last_backend(), want_backend), "backend %s, expected %s", fp8_cuda_last_backend(), want_backend);
    double out_tol = ydt == DT_BF16 ? ldexp(1.0, -8) : 0.0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double y = ydt == DT_BF16 ? bf16_to_f32(((uint16_t *)hy)[i]) : ((float *)hy)[i];
        double want = c->ref[i] + prev[i];
        double tol = acc_tol * c->mag[i] + out_tol * fabs(want) + (accumulate ? out_tol * fabs(prev[i]) : 0);
        double err = fabs(y - want);
        EXPECT(err <= tol, "gemm %s %dx%dx%d %s backend %s y[%zu,%zu] = %.9g, want %.9g (err %.3g > tol %.3g)",
               fp8_gran_name(c->x.gran), M, N, c->x.cols, dtype_name(ydt), fp8_cuda_last_backend(), i / N, i % N,
               y, want, err, tol);
        if (tol > 0 && err / tol > worst) worst = err / tol;
    }
    EXPECT_NONE("gemm");
    cudaFree(dy); free(hy); free(prev);
    return worst;
}

static const double ACC = 0x1p-10, ACC_TC = 0x1p-8;
static double worst_seen[5];  // worst error / (ACC * mag) per path: cublaslt, mma, tiled, fallback, wgmma
static void note_worst(int path, double w) { if (w > worst_seen[path]) worst_seen[path] = w; }

START_TEST(test_gemm_backends) {
    FP8Gran grans[] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    // partial tiles in M (200, 33, 1, 130, 2000), N (136, 100: not a multiple of 8 either, 1544) and K
    // (528: a partial last 128-wide step, zero-padded by TMA)
    int shapes[][3] = {{256, 512, 1024}, {200, 384, 640}, {33, 136, 2048}, {1, 128, 256}, {130, 100, 528}, {300, 264, 528},
                       {2000, 1544, 384},   // 144 tiles of 128x192: > 132 SMs, the persistent kernel loops
                       {1300, 2504, 256}};  // 11 tile rows: a block's later tiles fall in the last, partial group of 3
    int ncheck = 0;
    for (int gi = 0; gi < 3; gi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            GemmCase c;
            gemm_case_make(&c, shapes[si][0], shapes[si][1], shapes[si][2], grans[gi], FP8_E4M3, FP8_E4M3, DATA_RANDOM, si & 1);
            char why[256];
            int lt = fp8_gemm_supported(FP8_GEMM_CUBLASLT, DT_BF16, &c.x, &c.w, why, sizeof why);
            if (!lt) fprintf(stderr, "note: cuBLASLt declines %dx%dx%d %s: %s\n", shapes[si][0], shapes[si][1], shapes[si][2], fp8_gran_name(grans[gi]), why);
            int wg = fp8_gemm_supported(FP8_GEMM_WGMMA, DT_BF16, &c.x, &c.w, NULL, 0);
            for (int o = 0; o < 2; o++) {
                DType ydt = o ? DT_F32 : DT_BF16;
                if (lt) { note_worst(0, gemm_check(&c, FP8_GEMM_CUBLASLT, ydt, 0, ACC_TC, "cublaslt")); ncheck++; }
                if (wg) {  // bf16: the TMA-store epilogue (N % 8 == 0) or the direct one; f32: direct
                    note_worst(4, gemm_check(&c, FP8_GEMM_WGMMA, ydt, 0, ACC_TC, "kernel-wgmma"));
                    gemm_check(&c, FP8_GEMM_WGMMA, ydt, 1, ACC_TC, "kernel-wgmma");  // accumulate
                    ncheck += 2;
                }
                note_worst(1, gemm_check(&c, FP8_GEMM_MMA, ydt, 0, ACC, "kernel-mma")); ncheck++;
                gemm_check(&c, FP8_GEMM_AUTO, ydt, 1, lt || wg ? ACC_TC : ACC, NULL); ncheck++;  // accumulate
            }
            gemm_case_free(&c);
        }
    // K not a multiple of 16: no FP8 kernel takes it (16-byte rows), so AUTO runs the BF16 path: both
    // operands dequantized (each rounded to bf16: 8 significant bits, within 2^-8 relative), one BF16 GEMM
    for (int gi = 0; gi < 3; gi++) {
        GemmCase c;
        gemm_case_make(&c, 70, 200, 300, grans[gi], FP8_E4M3, FP8_E4M3, DATA_HUGE, 0);
        ck_assert(!fp8_gemm_supported(FP8_GEMM_CUBLASLT, DT_BF16, &c.x, &c.w, NULL, 0));
        ck_assert(!fp8_gemm_supported(FP8_GEMM_MMA, DT_BF16, &c.x, &c.w, NULL, 0));
        note_worst(2, gemm_check(&c, FP8_GEMM_AUTO, DT_BF16, 0, 2 * 0x1p-8 + ACC, "bf16-fallback"));
        note_worst(2, gemm_check(&c, FP8_GEMM_AUTO, DT_F32, 1, 2 * 0x1p-8 + ACC, "bf16-fallback"));
        ncheck += 2;
        gemm_case_free(&c);
    }
    fprintf(stderr, "gemm: %d backend x granularity x shape x output checks; worst error / tolerance: cublaslt %.3f, "
                    "kernel-wgmma %.3f (ACC 2^-8), kernel-mma %.3f (ACC 2^-10), bf16 (K %% 16 != 0) %.3f\n",
            ncheck, worst_seen[0], worst_seen[4], worst_seen[1], worst_seen[2]);
}
END_TEST

START_TEST(test_gemm_adversarial) {
    FP8Gran grans[] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    for (int gi = 0; gi < 3; gi++) {
        // all positive, K = 16384: no cancellation, so sum |x w| = |y| and the bound is tight
        GemmCase c;
        gemm_case_make(&c, 128, 256, 16384, grans[gi], FP8_E4M3, FP8_E4M3, DATA_POSITIVE, 0);
        double w_lt = -1, w_wg = -1;
        if (fp8_gemm_supported(FP8_GEMM_CUBLASLT, DT_F32, &c.x, &c.w, NULL, 0)) w_lt = gemm_check(&c, FP8_GEMM_CUBLASLT, DT_F32, 0, ACC_TC, "cublaslt");
        double w_k = gemm_check(&c, FP8_GEMM_MMA, DT_F32, 0, ACC, "kernel-mma");
        int wg = fp8_gemm_supported(FP8_GEMM_WGMMA, DT_F32, &c.x, &c.w, NULL, 0);
        if (wg) {
            w_wg = gemm_check(&c, FP8_GEMM_WGMMA, DT_F32, 0, ACC_TC, "kernel-wgmma");
            gemm_check(&c, FP8_GEMM_WGMMA, DT_BF16, 0, ACC_TC, "kernel-wgmma");  // TMA-store epilogue
        }
        // all positive, so |y| = sum |x w| and worst * ACC is the worst relative error
        fprintf(stderr, "all-positive K=16384 %s: worst relative error: cublaslt %.2e, kernel-wgmma %.2e (both within "
                        "ACC_TC = 2^-8 = 3.9e-3), kernel-mma %.2e (ACC 2^-10)\n",
                fp8_gran_name(grans[gi]), w_lt * ACC_TC, w_wg * ACC_TC, w_k * ACC);
        gemm_case_free(&c);
        // rows of zeros (bf16 out, pow2 scales) and values far beyond the FP8 range (f32 out; scales bring them back)
        struct { int M, K; DataKind kind; DType ydt; int pow2; const char *what; } odd[2] = {
            {96, 1024, DATA_ZERO_ROWS, DT_BF16, 1, "zero rows"}, {64, 512, DATA_HUGE, DT_F32, 0, "beyond-range"}};
        for (int k = 0; k < 2; k++) {
            gemm_case_make(&c, odd[k].M, 256, odd[k].K, grans[gi], FP8_E4M3, FP8_E4M3, odd[k].kind, odd[k].pow2);
            gemm_check(&c, FP8_GEMM_AUTO, odd[k].ydt, 0, ACC_TC, NULL);
            fprintf(stderr, "%s %s: auto chose %s\n", odd[k].what, fp8_gran_name(grans[gi]), fp8_cuda_last_backend());
            gemm_check(&c, FP8_GEMM_MMA, odd[k].ydt, 0, ACC, "kernel-mma");
            if (wg) gemm_check(&c, FP8_GEMM_WGMMA, odd[k].ydt, 0, ACC_TC, "kernel-wgmma");
            gemm_case_free(&c);
        }
        // E5M2 activations (gradients) x E4M3 weights
        gemm_case_make(&c, 128, 256, 1024, grans[gi], FP8_E5M2, FP8_E4M3, DATA_RANDOM, 0);
        gemm_check(&c, FP8_GEMM_AUTO, DT_BF16, 0, ACC_TC, NULL);
        fprintf(stderr, "e5m2 x e4m3 %s: auto chose %s\n", fp8_gran_name(grans[gi]), fp8_cuda_last_backend());
        ck_assert(!fp8_gemm_supported(FP8_GEMM_WGMMA, DT_BF16, &c.x, &c.w, NULL, 0));  // E4M3 x E4M3 only
        gemm_check(&c, FP8_GEMM_MMA, DT_BF16, 0, ACC, "kernel-mma");
        gemm_case_free(&c);
        // E5M2 x E5M2: cuBLASLt declines it, the mma.sync kernel takes it
        gemm_case_make(&c, 128, 256, 1024, grans[gi], FP8_E5M2, FP8_E5M2, DATA_RANDOM, 0);
        ck_assert(!fp8_gemm_supported(FP8_GEMM_CUBLASLT, DT_BF16, &c.x, &c.w, NULL, 0));
        gemm_check(&c, FP8_GEMM_AUTO, DT_BF16, 0, ACC, "kernel-mma");
        gemm_case_free(&c);
    }
}
END_TEST

START_TEST(test_gemm_decode) {
    {
        GemmCase c;
        gemm_case_make(&c, 1, 128, 128, FP8_BLOCK, FP8_E4M3, FP8_E4M3, DATA_RANDOM, 0);
        char why[256];
        int ok = fp8_gemm_supported(FP8_GEMM_DECODE, DT_BF16, &c.x, &c.w, why, sizeof why);
        gemm_case_free(&c);
        if (!ok) {
            fprintf(stderr, "note: the decode kernel is not tested here: %s\n", why);
            return;
        }
    }
    FP8Gran grans[] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    int shapes[][3] = {{64, 1024, 1024}, {1, 256, 3072}, {17, 512, 576}, {64, 4096, 4096}, {40, 192, 12288},
                       {64, 128, 128}, {33, 200, 1024}, {100, 100, 256}, {128, 1024, 2048}};
    double worst = 0;
    for (int gi = 0; gi < 3; gi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            GemmCase c;
            gemm_case_make(&c, shapes[si][0], shapes[si][1], shapes[si][2], grans[gi], FP8_E4M3, FP8_E4M3,
                           si == 4 ? DATA_POSITIVE : DATA_RANDOM, si & 1);
            int M = c.x.rows, N = c.w.rows;
            for (int o = 0; o < 2; o++) {
                DType ydt = o ? DT_F32 : DT_BF16;
                double w = gemm_check(&c, FP8_GEMM_DECODE, ydt, 0, ACC_TC, "kernel-decode");
                if (w > worst) worst = w;
                gemm_check(&c, FP8_GEMM_DECODE, ydt, 1, ACC_TC, "kernel-decode");  // accumulate
                if (c.x.cols >= 2048 && (M <= 64 || (M <= 128 && (long)N * c.x.cols <= (8L << 20))))  // hopper_decode_preferred
                    gemm_check(&c, FP8_GEMM_AUTO, ydt, 0, ACC_TC, "kernel-decode");
            }
            size_t n = (size_t)M * N * 4;
            float *d1 = (float *)dmalloc(n), *d2 = (float *)dmalloc(n);
            void *h1 = mallocCheck(n), *h2 = mallocCheck(n);
            fp8_cuda_set_backend(FP8_GEMM_DECODE);
            fp8_gemm_cuda(d1, DT_F32, &c.x, &c.w, 0);
            fp8_gemm_cuda(d2, DT_F32, &c.x, &c.w, 0);
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
            download(h1, d1, n);
            download(h2, d2, n);
            ck_assert_msg(!memcmp(h1, h2, n), "decode kernel %dx%dx%d: two runs differ", M, N, c.x.cols);
            cudaFree(d1); cudaFree(d2); free(h1); free(h2);
            gemm_case_free(&c);
        }
    // every cluster size, through K: two 64 x 128 tiles and 1 to 16 K steps give 1 (no partner), 2, 3
    // (uneven K slices), ... 8 blocks a cluster (decode_splits: the most that fit, at least two steps each)
    int ks_k[] = {128, 512, 768, 1024, 1280, 1536, 1792, 2048, 1152};
    for (size_t ki = 0; ki < sizeof ks_k / sizeof ks_k[0]; ki++) {
        GemmCase c;
        gemm_case_make(&c, 33, 256, ks_k[ki], FP8_BLOCK, FP8_E4M3, FP8_E4M3, DATA_RANDOM, 0);
        double w = gemm_check(&c, FP8_GEMM_DECODE, DT_BF16, 0, ACC_TC, "kernel-decode");
        if (w > worst) worst = w;
        gemm_case_free(&c);
    }
    fprintf(stderr, "decode kernel: worst error / tolerance %.3f (ACC_TC 2^-8)\n", worst);
}
END_TEST

// the BF16 path of a GPU without FP8 tensor cores, forced: both operands dequantized to bf16
// (each rounded to bf16, within 2^-8 relative), one BF16 GEMM with fp32 accumulation
START_TEST(test_gemm_bf16_fallback) {
    FP8Gran grans[] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    for (int gi = 0; gi < 3; gi++) {
        GemmCase c;
        gemm_case_make(&c, 100, 256, 768, grans[gi], FP8_E4M3, FP8_E4M3, DATA_RANDOM, 0);
        gemm_check(&c, FP8_GEMM_BF16, DT_BF16, 0, 2 * 0x1p-8 + ACC, "bf16-fallback");
        gemm_check(&c, FP8_GEMM_BF16, DT_F32, 1, 2 * 0x1p-8 + ACC, "bf16-fallback");
        gemm_case_free(&c);
    }
}
END_TEST

// ----------------------------------------------------------------------------
// BF16 GEMM and the backward dX = dY W

START_TEST(test_bf16_gemm_and_dx) {
    int M = 200, N = 384, K = 512;
    Rng r = rng_make(42);
    float *x = (float *)mallocCheck((size_t)M * K * 4), *w = (float *)mallocCheck((size_t)N * K * 4), *dy = (float *)mallocCheck((size_t)M * N * 4);
    uint16_t *xb = (uint16_t *)mallocCheck((size_t)M * K * 2), *wb = (uint16_t *)mallocCheck((size_t)N * K * 2), *dyb = (uint16_t *)mallocCheck((size_t)M * N * 2);
    fill_random(x, (size_t)M * K, &r, 1.0f, 0);
    fill_random(w, (size_t)N * K, &r, 1.0f, 0);
    fill_random(dy, (size_t)M * N, &r, 1.0f, 0);
    round_bf16(x, xb, (size_t)M * K);
    round_bf16(w, wb, (size_t)N * K);
    round_bf16(dy, dyb, (size_t)M * N);
    // Y = X W^T in bf16, f32 out: exact products, fp32 sums
    void *dxb = dup_to_device(xb, (size_t)M * K * 2), *dwb = dup_to_device(wb, (size_t)N * K * 2);
    float *dyo = (float *)dmalloc((size_t)M * N * 4), *hy = (float *)mallocCheck((size_t)M * N * 4);
    bf16_gemm_cuda(dyo, DT_F32, dxb, dwb, M, N, K, 0);
    download(hy, dyo, (size_t)M * N * 4);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) { double p = (double)x[(size_t)m * K + k] * w[(size_t)n * K + k]; s += p; a += fabs(p); }
            EXPECT(fabs(hy[(size_t)m * N + n] - s) <= ACC * a, "bf16 gemm (%d,%d)", m, n);
        }
    EXPECT_NONE("bf16 gemm");
    // dX (M, K) = dY (M, N) W (N, K), W an FP8 weight (128x128 tiles or one scale), bf16 out, by both
    // paths: the BF16 reference (W dequantized) and the FP8 product (dY quantized, W^T's codes)
    void *ddy = dup_to_device(dyb, (size_t)M * N * 2);
    uint16_t *ddx = (uint16_t *)dmalloc((size_t)M * K * 2), *hdx = (uint16_t *)mallocCheck((size_t)M * K * 2);
    float *wdq = (float *)mallocCheck((size_t)N * K * 4), *dyd = (float *)mallocCheck((size_t)M * N * 4);
    FP8Gran grans[2] = {FP8_BLOCK, FP8_TENSOR};
    for (int gi = 0; gi < 2; gi++)
        for (int fp8 = 0; fp8 < 2; fp8++) {
            FP8Gran g = grans[gi];
            int br = g == FP8_BLOCK ? 128 : 0;
            FP8Tensor hw, dw;
            fp8_tensor_alloc_cpu(&hw, N, K, g, FP8_E4M3, br);
            fp8_quantize_cpu(&hw, w, 0);
            dw = hw;
            dw.data = (uint8_t *)dup_to_device(hw.data, (size_t)N * K);
            dw.scale = (float *)dup_to_device(hw.scale, fp8_num_scales(g, N, K, br) * 4);
            fp8_dequantize_cpu(wdq, &hw);
            // the dY the product reads: as it is (BF16 path), or its codes as fp8_quantize_cpu makes them
            // (the GPU's quantization is byte-identical to it: test_quantize_all)
            if (fp8) {
                FP8Tensor q;
                fp8_tensor_alloc_cpu(&q, M, N, g, g == FP8_BLOCK ? FP8_E4M3 : FP8_E5M2, g == FP8_BLOCK ? 1 : 0);
                fp8_quantize_cpu(&q, dy, 0);
                fp8_dequantize_cpu(dyd, &q);
                fp8_tensor_free_cpu(&q);
            } else memcpy(dyd, dy, (size_t)M * N * 4);
            fp8_cuda_set_dx(fp8 ? FP8_DX_FP8 : FP8_DX_BF16);
            ck_assert_int_eq(fp8_linear_dx_is_fp8(&dw), fp8);
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                // accumulate: dX starts as the result of the first call, so the second gives 2 dY W
                fp8_linear_dx_cuda(ddx, accumulate, ddy, &dw, M);
                download(hdx, ddx, (size_t)M * K * 2);
                for (int m = 0; m < M; m++)
                    for (int k = 0; k < K; k++) {
                        double s = 0, a = 0;
                        for (int n = 0; n < N; n++) { double p = (double)dyd[(size_t)m * N + n] * wdq[(size_t)n * K + k]; s += p; a += fabs(p); }
                        s *= accumulate + 1; a *= accumulate + 1;
                        // BF16: W rounded to bf16 (2^-8), fp32 sums (2^-10 bound); FP8: the tensor cores'
                        // accumulation (ACC_TC) on exact products; bf16 output (2^-8), twice when accumulating
                        double tol = (fp8 ? ACC_TC : 0x1p-8 + ACC) * a + 0x1p-8 * fabs(s) * (accumulate + 1);
                        double got = bf16_to_f32(hdx[(size_t)m * K + k]);
                        EXPECT(fabs(got - s) <= tol, "dx %s %s (%d,%d) accumulate %d: %g vs %g", fp8_gran_name(g),
                               fp8 ? "fp8" : "bf16", m, k, accumulate, got, s);
                    }
                char what[64];
                snprintf(what, sizeof what, "dx %s %s", fp8_gran_name(g), fp8 ? "fp8" : "bf16");
                EXPECT_NONE(what);
            }
            fp8_tensor_free_cpu(&hw);
            cudaFree(dw.data); cudaFree(dw.scale);
        }
    // a ROW weight, and a reduction that is not a multiple of 16, take the BF16 path; AUTO takes FP8
    // from K = 2048
    FP8Tensor rw = {NULL, NULL, N, K, FP8_ROW, FP8_E4M3, 0}, odd = {NULL, NULL, 200, K, FP8_BLOCK, FP8_E4M3, 128};
    ck_assert(!fp8_linear_dx_is_fp8(&rw) && !fp8_linear_dx_is_fp8(&odd));
    FP8Tensor k1 = {NULL, NULL, N, 1024, FP8_BLOCK, FP8_E4M3, 128}, k2 = {NULL, NULL, N, 2048, FP8_BLOCK, FP8_E4M3, 128};
    fp8_cuda_set_dx(FP8_DX_AUTO);
    ck_assert(!fp8_linear_dx_is_fp8(&k1) && fp8_linear_dx_is_fp8(&k2));
    cudaFree(dxb); cudaFree(dwb); cudaFree(dyo); cudaFree(ddy); cudaFree(ddx);
    free(x); free(w); free(dy); free(xb); free(wb); free(dyb); free(hy); free(wdq); free(dyd); free(hdx);
}
END_TEST

// W^T of an FP8 weight: the codes transposed byte for byte, the 128x128 tile scales transposed
// (padding 1), a per-tensor scale as it is; ragged shapes (partial tiles, rows not multiples of 4)
START_TEST(test_transpose) {
    int shapes[][2] = {{384, 512}, {200, 328}, {77, 130}, {130, 77}, {64, 64}};
    Rng r = rng_make(7);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int gi = 0; gi < 2; gi++) {
            int R = shapes[si][0], C = shapes[si][1];
            FP8Gran g = gi ? FP8_TENSOR : FP8_BLOCK;
            int br = g == FP8_BLOCK ? 128 : 0;
            float *w = (float *)mallocCheck((size_t)R * C * 4);
            fill_random(w, (size_t)R * C, &r, 2.0f, 0);
            FP8Tensor hw, ht, dw, dt;
            fp8_tensor_alloc_cpu(&hw, R, C, g, FP8_E4M3, br);
            fp8_tensor_alloc_cpu(&ht, C, R, g, FP8_E4M3, br);
            fp8_quantize_cpu(&hw, w, 0);
            size_t nsw = fp8_num_scales(g, R, C, br), nst = fp8_num_scales(g, C, R, br);
            dw = hw, dt = ht;
            dw.data = (uint8_t *)dup_to_device(hw.data, (size_t)R * C);
            dw.scale = (float *)dup_to_device(hw.scale, nsw * 4);
            dt.data = (uint8_t *)dmalloc((size_t)R * C);
            dt.scale = (float *)dmalloc(nst * 4);
            fp8_transpose_cuda(&dt, &dw);
            download(ht.data, dt.data, (size_t)R * C);
            download(ht.scale, dt.scale, nst * 4);
            for (int i = 0; i < R; i++)
                for (int j = 0; j < C; j++) {
                    EXPECT(ht.data[(size_t)j * R + i] == hw.data[(size_t)i * C + j], "%dx%d %s code (%d,%d)", R, C,
                           fp8_gran_name(g), i, j);
                    EXPECT(ht.scale[fp8_scale_index(&ht, j, i)] == hw.scale[fp8_scale_index(&hw, i, j)], "%dx%d %s scale of (%d,%d)",
                           R, C, fp8_gran_name(g), i, j);
                }
            if (g == FP8_BLOCK) {  // the padding of each row of tile scales
                int ld = fp8_scale_ld(g, C, R, br), rb = (R + 127) / 128;
                for (size_t k = 0; k < nst; k++) EXPECT((int)(k % ld) < rb || ht.scale[k] == 1.0f, "padding scale %zu", k);
            }
            EXPECT_NONE("transpose");
            fp8_tensor_free_cpu(&hw); fp8_tensor_free_cpu(&ht);
            cudaFree(dw.data); cudaFree(dw.scale); cudaFree(dt.data); cudaFree(dt.scale);
            free(w);
        }
}
END_TEST

// AUTO's choice at the M = 8192 benchmark shapes (dev/bench_gemm.cu) and two more with K = 1024, as
// fp8_hopper.cu's hopper_wgmma_preferred states the rule (its measurements: dev/notes/gemm.md): on Hopper
// the wgmma kernel at K <= 1024 where its tiles keep the GPU >= 90% busy (132 SMs),
// cuBLASLt elsewhere. Only the choice is asserted here:
// each kernel's numbers are checked, forced, by test_gemm_backends.
START_TEST(test_gemm_auto_choice) {
    FP8Gran grans[] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    struct { int M, N, K; const char *want; } cases[] = {
        {8192, 3072, 1024, "kernel-wgmma"}, {8192, 4096, 4096, "cublaslt"}, {8192, 1024, 3072, "cublaslt"},
        {8192, 1536, 1024, "kernel-wgmma"},  // 512 tiles of 128 x 192 in 4 waves of 132: 97% busy
        {4096, 4096, 1024, "cublaslt"}};     // 704 tiles in 6 waves, partial tiles: 86%
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    // the last two sit near the rule's edge, which moves with the SM count: asserted on the
    // measured GPU's 132 SMs (H100 SXM) only
    size_t ncases = prop.multiProcessorCount == 132 ? sizeof cases / sizeof cases[0] : 3;
    for (int gi = 0; gi < 3; gi++)
        for (size_t ci = 0; ci < ncases; ci++) {
            int M = cases[ci].M, N = cases[ci].N, K = cases[ci].K;
            FP8Tensor t[2];  // X, W: data and scales on the device, quantized from random values there
            for (int j = 0; j < 2; j++) {
                int rows = j ? N : M;
                Rng r = rng_make(rows * 7 + j + gi);
                float *h = (float *)mallocCheck((size_t)rows * K * 4);
                fill_random(h, (size_t)rows * K, &r, 1.0f, 0);
                t[j] = (FP8Tensor){0};
                t[j].rows = rows; t[j].cols = K; t[j].gran = grans[gi]; t[j].fmt = FP8_E4M3;
                t[j].block_rows = j ? 128 : 1;
                quantize_on_device(&t[j], h, 0);
                free(h);
            }
            const char *want = fp8_gemm_supported(FP8_GEMM_WGMMA, DT_BF16, &t[0], &t[1], NULL, 0) ? cases[ci].want : "cublaslt";
            void *y = dmalloc((size_t)M * N * 2);
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
            fp8_gemm_cuda(y, DT_BF16, &t[0], &t[1], 0);
            CU(cudaDeviceSynchronize());
            ck_assert_msg(!strcmp(fp8_cuda_last_backend(), want), "%dx%dx%d %s: AUTO ran %s, expected %s", M, N, K,
                          fp8_gran_name(grans[gi]), fp8_cuda_last_backend(), want);
            cudaFree(y);
            for (int j = 0; j < 2; j++) { cudaFree(t[j].data); cudaFree(t[j].scale); }
        }
}
END_TEST

static Suite *gpu_fp8_suite(void) {
    Suite *s = suite_create("gpu_fp8");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_casts_all_bf16_and_specials);
    tcase_add_test(tc, test_quantize_all);
    tcase_add_test(tc, test_quantize_bf16_sweep);
    tcase_add_test(tc, test_gemm_backends);
    tcase_add_test(tc, test_gemm_adversarial);
    tcase_add_test(tc, test_gemm_decode);
    tcase_add_test(tc, test_gemm_auto_choice);
    tcase_add_test(tc, test_gemm_bf16_fallback);
    tcase_add_test(tc, test_bf16_gemm_and_dx);
    tcase_add_test(tc, test_transpose);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        fprintf(stderr, "gpu_fp8: no CUDA GPU; this suite runs on a GPU machine (make test-gpu)\n");
        return 1;
    }
    int fp8 = fp8_cuda_init(NULL);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    fprintf(stderr, "gpu_fp8: %s, compute capability %d.%d, FP8 tensor cores: %s\n", p.name, p.major, p.minor, fp8 ? "yes" : "no");
    int rc = run_suite(gpu_fp8_suite());
    fp8_cuda_free();
    return rc;
}
