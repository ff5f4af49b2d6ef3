// test/gpu_util.cuh: what the GPU suites of the CUDA backend share (gpu_backend.cu: every op;
// gpu_models.cu: whole models): the two backends, random bf16-rounded data, uploads and downloads,
// QWeights on either backend, and checks against a reference with a tolerance per element.
//
// How the tolerances are derived. The GPU holds activations in bf16 (8 significant bits), so
// the reference is fed the same bf16-rounded inputs and a tolerance only has to cover
//   - rounding of a bf16 output:            |bf16(x) - x| <= 2^-8 |x|                 (U8)
//   - an operand rounded to bf16 inside the op (a P or dS matrix in attention, dz in the
//     logprobs backward, LoRA's fp32 masters): <= 2^-8 of that operand, so 2^-8 M where M
//     is the sum of |terms| of the product it feeds (computed here in fp64 per element)
//   - fp32 accumulation of K terms: (K + 32) 2^-23 of the sum of |terms| (gamma_K with a
//     factor 2 for tensor cores that truncate rather than round)                  (acc32)
//   - FP8 tensor-core GEMMs (cuBLASLt on Hopper: ~14-bit accumulation within a group of 32
//     products, fp32 between groups): 2^-8 of sum |x w|, as test/gpu_fp8.cu derives (ACC_TC)
// Each check prints the worst error as a fraction of its tolerance, so the margin is visible.
#ifndef GPU_UTIL_CUH
#define GPU_UTIL_CUH

#include <check.h>
#include <cuda_runtime.h>
#include <math.h>

#include "grpo.h"
#include "lora.h"
#include "model.h"
#include "testutil.h"
#include "core/backend.h"
#include "cpu/ops_cpu.h"
#include "cuda/fp8_cuda.h"

static const Backend *G;    // CUDA
static const Backend *CPU;  // fp32 reference backend
static Rng rng;

#define U8 0x1p-8
#define ACC_TC 0x1p-8
static inline double acc32(int K) { return (K + 32) * 0x1p-23; }

// ---- host helpers -------------------------------------------------------------------

static inline float *fmalloc(size_t n) { return (float *)mallocCheck(n * sizeof(float)); }
static inline double *dmalloc_h(size_t n) { return (double *)callocCheck(n, sizeof(double)); }
static inline float bfr(float x) { return bf16_to_f32(f32_to_bf16(x)); }
// normal values with standard deviation sd, never zero
static inline float *randn(size_t n, float sd) {
    float *x = fmalloc(n);
    for (size_t i = 0; i < n; i++) {
        float v = sd * rng_normal(&rng);
        x[i] = v != 0 ? v : sd * 1e-3f;
    }
    return x;
}
static inline float *randn_bf(size_t n, float sd) {
    float *x = randn(n, sd);
    for (size_t i = 0; i < n; i++) x[i] = bfr(x[i]);
    return x;
}
static inline float *fdup(const float *x, size_t n) {
    float *y = fmalloc(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}
// device copies: act (bf16) of values already bf16-exact, hp (f32)
static inline void *up_act(const float *x, size_t n) {
    uint16_t *b = (uint16_t *)mallocCheck(n * 2);
    for (size_t i = 0; i < n; i++) b[i] = f32_to_bf16(x[i]);
    void *d = G->alloc(n * 2);
    G->upload(d, b, n * 2);
    G->sync();
    free(b);
    return d;
}
static inline void *up_hp(const float *x, size_t n) {
    void *d = G->alloc(n * 4);
    G->upload(d, x, n * 4);
    return d;
}
static inline void *up_i32(const int32_t *x, size_t n) {
    void *d = G->alloc(n * 4);
    G->upload(d, x, n * 4);
    return d;
}
static inline float *down_act(const void *d, size_t n) {
    uint16_t *b = (uint16_t *)mallocCheck(n * 2);
    G->download(b, d, n * 2);
    float *x = fmalloc(n);
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(b[i]);
    free(b);
    return x;
}
static inline float *down_hp(const void *d, size_t n) {
    float *x = fmalloc(n);
    G->download(x, d, n * 4);
    return x;
}

// |got - ref| <= tol[i] everywhere (NaN fails); prints the worst error / tolerance
static inline double check_close(const char *what, const float *got, const float *ref, const double *tol, size_t n) {
    double worst = 0;
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        if (!(e <= tol[i])) {
            if (bad++ < 4) fprintf(stderr, "    %s[%zu]: gpu %.8g ref %.8g (err %.3g > tol %.3g)\n", what, i, got[i], ref[i], e, tol[i]);
            worst = isnan(e) ? INFINITY : fmax(worst, e / tol[i]);
        } else if (tol[i] > 0) worst = fmax(worst, e / tol[i]);
    }
    printf("  %-52s worst err/tol %.3f (%zu values)\n", what, worst, n);
    ck_assert_msg(bad == 0, "%s: %ld of %zu values outside their tolerance", what, bad, n);
    return worst;
}
static inline void check_exact(const char *what, const void *a, const void *b, size_t bytes) {
    ck_assert_msg(memcmp(a, b, bytes) == 0, "%s: not bit-identical", what);
    printf("  %-52s bit-identical (%zu bytes)\n", what, bytes);
}
// tolerance for a bf16 output: U8 |ref| + k * mag
static inline double *tol_bf(const float *ref, const double *mag, double k, size_t n) {
    double *t = dmalloc_h(n);
    for (size_t i = 0; i < n; i++) t[i] = U8 * fabs(ref[i]) + k * (mag ? mag[i] : 0) + 1e-30;
    return t;
}

// a QWeight (rows, cols) of granularity g in the memory of the GPU (device 1) or the CPU backend, and its release
static inline void qweight_setup(QWeight *w, int rows, int cols, FP8Gran g, int device) {
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->gran = g;
    const Backend *b = device ? G : CPU;
    if (g == FP8_OFF) {
        w->dense = b->alloc((size_t)rows * cols * dtype_size(b->act));
        return;
    }
    w->q.rows = rows;
    w->q.cols = cols;
    w->q.gran = g;
    w->q.fmt = FP8_E4M3;
    w->q.block_rows = FP8_BLOCK_SIZE;
    w->q.data = (uint8_t *)b->alloc((size_t)rows * cols);
    w->q.scale = (float *)b->alloc(fp8_num_scales(g, rows, cols, FP8_BLOCK_SIZE) * 4);
}
static inline void qweight_free(QWeight *w, int device) {
    const Backend *b = device ? G : CPU;
    if (w->gran == FP8_OFF) b->free(w->dense);
    else {
        b->free(w->q.data);
        b->free(w->q.scale);
    }
}

#endif  // GPU_UTIL_CUH
