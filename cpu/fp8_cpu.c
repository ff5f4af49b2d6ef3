// fp8_cpu.c: the CPU reference for everything FP8 (declared in fp8.h):
// E4M3/E5M2 codecs, scales from amax, quantize/dequantize at tensor, row and
// block granularity, the reference FP8 GEMM and the SQNR of a quantization.
// It is the numeric truth the CUDA kernels (fp8.cu) are tested against, and the
// codecs are tested bit for bit against PyTorch (test/test_fp8.c).
// Plain C11, no dependencies beyond libm.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"

// ----------------------------------------------------------------------------
// Codecs. Both formats are "1 sign, E exponent, M mantissa bits, bias B":
//   normal    (-1)^s * 2^(e - B) * (1 + m / 2^M)   for 1 <= e
//   subnormal (-1)^s * 2^(1 - B) * (m / 2^M)       for e == 0
// E4M3 (float8_e4m3fn): E=4, M=3, B=7; no infinities, S.1111.111 is NaN, so the
//   largest finite value is S.1111.110 = 1.75 * 2^8 = 448.
// E5M2: E=5, M=2, B=15; IEEE-like: exponent 31 is inf (m == 0) or NaN, largest
//   finite S.11110.11 = 1.75 * 2^15 = 57344.
//
// Encoding works on values rather than bits: for |x| in the binade [2^e, 2^(e+1))
// the representable numbers are spaced by the quantum 2^(e - M) (below the
// smallest normal, by the fixed subnormal quantum 2^(1 - B - M)). |x| / quantum is
// exact (a power-of-two scaling), so one rintf (round to nearest, ties to even,
// the default rounding mode) is the only rounding: the result is correctly rounded.
// Values beyond the largest finite value saturate (CUDA's satfinite): since max
// is itself representable, clamping |x| to max before rounding gives exactly that.

typedef struct {
    int man_bits, bias;
    float max;
    uint8_t nan_code;  // positive NaN code; the sign bit is ORed in as PyTorch does
} Fp8Spec;

static const Fp8Spec E4M3 = {3, 7, FP8_E4M3_MAX, 0x7F};
static const Fp8Spec E5M2 = {2, 15, FP8_E5M2_MAX, 0x7F};

static uint8_t encode(const Fp8Spec *f, float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    if (isnan(x)) return sign | f->nan_code;
    float a = fminf(fabsf(x), f->max);  // saturate (inf too)
    int min_exp = 1 - f->bias;          // exponent of the smallest normal
    int e;
    frexpf(a, &e);  // a = m * 2^e with m in [0.5, 1), so a is in the binade [2^(e-1), 2^e)
    e -= 1;
    if (a == 0.0f || e < min_exp) e = min_exp;  // subnormals share the smallest normal's quantum
    float quantum = ldexpf(1.0f, e - f->man_bits);
    float n = rintf(a / quantum);  // integer number of quanta, ties to even
    // n in [0, 2^(M+1)]; n == 2^(M+1) means we rounded up into the next binade
    int ni = (int)n;
    if (ni >= (2 << f->man_bits)) { ni >>= 1; e += 1; }
    uint8_t code;
    if (ni < (1 << f->man_bits)) {
        code = (uint8_t)ni;  // subnormal (e == min_exp): exponent field 0, mantissa ni
    } else {
        int exp_field = e + f->bias;
        code = (uint8_t)((exp_field << f->man_bits) | (ni - (1 << f->man_bits)));
    }
    return sign | code;
}

static float decode(const Fp8Spec *f, uint8_t q, int ieee_specials) {
    int sign = q & 0x80, exp_bits = 7 - f->man_bits;
    int exp_field = (q >> f->man_bits) & ((1 << exp_bits) - 1);
    int man = q & ((1 << f->man_bits) - 1);
    float v;
    if (ieee_specials && exp_field == (1 << exp_bits) - 1) {
        v = man == 0 ? INFINITY : NAN;                        // E5M2
    } else if (!ieee_specials && (q & 0x7F) == f->nan_code) {
        v = NAN;                                              // E4M3's only NaN
    } else if (exp_field == 0) {
        v = ldexpf((float)man, 1 - f->bias - f->man_bits);    // subnormal
    } else {
        v = ldexpf((float)((1 << f->man_bits) + man), exp_field - f->bias - f->man_bits);
    }
    return sign ? -v : v;
}

uint8_t fp8_e4m3_encode(float x) { return encode(&E4M3, x); }
float fp8_e4m3_decode(uint8_t q) { return decode(&E4M3, q, 0); }
uint8_t fp8_e5m2_encode(float x) { return encode(&E5M2, x); }
float fp8_e5m2_decode(uint8_t q) { return decode(&E5M2, q, 1); }

// ----------------------------------------------------------------------------
// scales

float fp8_scale_from_amax(float amax, FP8Format fmt, int pow2) {
    if (!(amax > 0.0f) || isinf(amax)) return 1.0f;  // all-zero (or unusable) group
    float s = amax / fp8_max(fmt);
    if (s == 0.0f) s = FLT_MIN;  // amax tiny enough to underflow: any positive scale is exact enough
    if (pow2) {
        int e;
        float m = frexpf(s, &e);  // s = m * 2^e, m in [0.5, 1)
        s = m == 0.5f ? s : ldexpf(1.0f, e);  // already a power of two, else round up
    }
    return s;
}

// ----------------------------------------------------------------------------
// tensors

static void check_shape(FP8Gran gran, int block_rows) {
    if (gran != FP8_TENSOR && gran != FP8_ROW && gran != FP8_BLOCK)
        die("fp8: granularity %d is not tensor, row or block", (int)gran);
    if (gran == FP8_BLOCK && block_rows != 1 && block_rows != FP8_BLOCK_SIZE)
        die("fp8: block_rows must be 1 (activations) or 128 (weights), got %d", block_rows);
}

void fp8_tensor_alloc_cpu(FP8Tensor *t, int rows, int cols, FP8Gran gran, FP8Format fmt, int block_rows) {
    check_shape(gran, block_rows);
    t->rows = rows;
    t->cols = cols;
    t->gran = gran;
    t->fmt = fmt;
    t->block_rows = gran == FP8_BLOCK ? block_rows : 0;
    t->data = (uint8_t *)mallocCheck((size_t)rows * cols);
    size_t ns = fp8_num_scales(gran, rows, cols, t->block_rows);
    t->scale = (float *)mallocCheck(ns * sizeof(float));
    for (size_t i = 0; i < ns; i++) t->scale[i] = 1.0f;
}

void fp8_tensor_free_cpu(FP8Tensor *t) {
    free(t->data);
    free(t->scale);
    t->data = NULL;
    t->scale = NULL;
}

// the groups of a tensor as rectangles: group g covers rows [r0, r1) x cols [c0, c1)
static int num_groups(const FP8Tensor *t, int *n_row_groups, int *n_col_groups) {
    int rg = 1, cg = 1;
    if (t->gran == FP8_ROW) rg = t->rows;
    if (t->gran == FP8_BLOCK) {
        rg = (t->rows + t->block_rows - 1) / t->block_rows;
        cg = (t->cols + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
    }
    *n_row_groups = rg;
    *n_col_groups = cg;
    return rg * cg;
}
static void group_rect(const FP8Tensor *t, int gi, int gj, int *r0, int *r1, int *c0, int *c1) {
    int h = t->gran == FP8_TENSOR ? t->rows : t->gran == FP8_ROW ? 1 : t->block_rows;
    int w = t->gran == FP8_BLOCK ? FP8_BLOCK_SIZE : t->cols;
    *r0 = gi * h;
    *r1 = *r0 + h < t->rows ? *r0 + h : t->rows;
    *c0 = gj * w;
    *c1 = *c0 + w < t->cols ? *c0 + w : t->cols;
}

void fp8_quantize_cpu(FP8Tensor *t, const float *x, int pow2) {
    check_shape(t->gran, t->block_rows);
    size_t ns = fp8_num_scales(t->gran, t->rows, t->cols, t->block_rows);
    for (size_t i = 0; i < ns; i++) t->scale[i] = 1.0f;  // padding
    int rg, cg;
    num_groups(t, &rg, &cg);
    for (int gi = 0; gi < rg; gi++)
        for (int gj = 0; gj < cg; gj++) {
            int r0, r1, c0, c1;
            group_rect(t, gi, gj, &r0, &r1, &c0, &c1);
            float amax = 0.0f;
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[(size_t)r * t->cols + c]));
            float s = fp8_scale_from_amax(amax, t->fmt, pow2);
            if (r0 < r1 && c0 < c1) t->scale[fp8_scale_index(t, r0, c0)] = s;
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) {
                    size_t i = (size_t)r * t->cols + c;
                    t->data[i] = fp8_encode(t->fmt, x[i] / s);
                }
        }
}

void fp8_dequantize_row_cpu(float *x, const FP8Tensor *t, int r) {
    const uint8_t *q = t->data + (size_t)r * t->cols;
    for (int c = 0; c < t->cols; c++) x[c] = fp8_decode(t->fmt, q[c]) * t->scale[fp8_scale_index(t, r, c)];
}

void fp8_dequantize_cpu(float *x, const FP8Tensor *t) {
    for (int r = 0; r < t->rows; r++) fp8_dequantize_row_cpu(x + (size_t)r * t->cols, t, r);
}

// ----------------------------------------------------------------------------
// reference GEMM: Y[M,N] = X[M,K] * W[N,K]^T

void fp8_gemm_cpu(float *y, const FP8Tensor *x, const FP8Tensor *w) {
    int M = x->rows, N = w->rows, K = x->cols;
    if (w->cols != K) die("fp8_gemm_cpu: X is (%d, %d) but W is (%d, %d): inner dimensions differ", M, K, N, w->cols);
    if (x->gran != w->gran) die("fp8_gemm_cpu: X is %s-scaled but W is %s-scaled", fp8_gran_name(x->gran), fp8_gran_name(w->gran));
    if (x->gran == FP8_BLOCK && (x->block_rows != 1 || w->block_rows != FP8_BLOCK_SIZE))
        die("fp8_gemm_cpu: BLOCK needs X in 1x128 groups and W in 128x128 tiles (block_rows %d, %d)", x->block_rows, w->block_rows);
    float tx[256], tw[256];  // decode tables
    for (int i = 0; i < 256; i++) { tx[i] = fp8_decode(x->fmt, (uint8_t)i); tw[i] = fp8_decode(w->fmt, (uint8_t)i); }
    for (int m = 0; m < M; m++) {
        const uint8_t *xr = x->data + (size_t)m * K;
        for (int n = 0; n < N; n++) {
            const uint8_t *wr = w->data + (size_t)n * K;
            float acc = 0.0f;
            if (x->gran == FP8_BLOCK) {
                // DeepSeek-V3: a partial sum per 128-wide K step, promoted with sx * sw
                for (int k0 = 0; k0 < K; k0 += FP8_BLOCK_SIZE) {
                    int k1 = k0 + FP8_BLOCK_SIZE < K ? k0 + FP8_BLOCK_SIZE : K;
                    float part = 0.0f;
                    for (int k = k0; k < k1; k++) part += tx[xr[k]] * tw[wr[k]];
                    acc += part * (x->scale[fp8_scale_index(x, m, k0)] * w->scale[fp8_scale_index(w, n, k0)]);
                }
            } else {
                for (int k = 0; k < K; k++) acc += tx[xr[k]] * tw[wr[k]];
                acc *= x->scale[fp8_scale_index(x, m, 0)] * w->scale[fp8_scale_index(w, n, 0)];
            }
            y[(size_t)m * N + n] = acc;
        }
    }
}

double fp8_sqnr_db(const float *x, const FP8Tensor *t) {
    double sig = 0.0, err = 0.0;
    float *row = (float *)mallocCheck((size_t)t->cols * sizeof(float));
    for (int r = 0; r < t->rows; r++) {
        fp8_dequantize_row_cpu(row, t, r);
        for (int c = 0; c < t->cols; c++) {
            double v = x[(size_t)r * t->cols + c], d = v - row[c];
            sig += v * v;
            err += d * d;
        }
    }
    free(row);
    if (err == 0.0) return INFINITY;
    return 10.0 * log10(sig / err);
}
