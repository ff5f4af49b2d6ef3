// test/test_fp8.c: Check suite for the FP8 CPU reference (fp8_cpu.c, fp8.h).
// The truth is PyTorch (fixtures from dev/make_fp8_table.py): every BF16 bit
// pattern cast to E4M3 and E5M2, every code decoded, and a (200, 300) matrix
// quantized at each granularity. The rest checks properties that follow from the
// formats: saturation, NaN, scales (zero groups, powers of two, partial edge
// blocks), the quantization error bound, the GEMM against a float64 matmul of
// the dequantized operands, and SQNR.
// Build: make test   (or standalone: gcc -std=c11 -D_GNU_SOURCE -O2 -I. -Idev -Itest
//        test/test_fp8.c cpu/fp8_cpu.c -lcheck -lsubunit -lm -lrt -lpthread)
#include <check.h>
#include <float.h>
#include <math.h>

#include "fp8.h"
#include "testutil.h"
#include "cpu/ops_cpu.h"

static Npy load(const char *name) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "fp8/%s", name);
    fixture_path(path, sizeof path, rel);
    return npy_read(path);
}

// ----------------------------------------------------------------------------
// codecs against PyTorch

static void check_all_bf16(FP8Format fmt, const char *codes_name, const char *finite_name) {
    Npy codes = load(codes_name), finite = load(finite_name);
    ck_assert_int_eq(codes.n, 65536);
    ck_assert_int_eq(finite.n, 65536);
    long n_finite = 0, mismatches = 0;
    for (long i = 0; i < 65536; i++) {
        float x = bf16_to_f32((uint16_t)i);
        uint8_t q = fp8_encode(fmt, x);
        if (finite.data[i] != 0) {
            n_finite++;
            if (q != (uint8_t)codes.data[i]) {
                if (mismatches++ < 5)
                    fprintf(stderr, "bf16 0x%04lx (%g): ours 0x%02x, torch 0x%02x\n", i, x, q, (int)codes.data[i]);
            }
        } else if (isnan(x)) {
            ck_assert_msg(isnan(fp8_decode(fmt, q)), "NaN input 0x%04lx must encode to NaN", i);
        } else {
            // PyTorch overflowed to inf/NaN: we saturate to +-max
            ck_assert_msg(fp8_decode(fmt, q) == copysignf(fp8_max(fmt), x), "0x%04lx (%g) must saturate", i, x);
        }
    }
    ck_assert_msg(mismatches == 0, "%ld of %ld finite patterns differ from PyTorch", mismatches, n_finite);
    ck_assert_int_gt(n_finite, 30000);  // the table really holds finite results
    npy_free(&codes);
    npy_free(&finite);
}
START_TEST(test_e4m3_all_bf16) { check_all_bf16(FP8_E4M3, "bf16_e4m3.npy", "bf16_e4m3_finite.npy"); }
END_TEST
START_TEST(test_e5m2_all_bf16) { check_all_bf16(FP8_E5M2, "bf16_e5m2.npy", "bf16_e5m2_finite.npy"); }
END_TEST

static void check_decode(FP8Format fmt, const char *name) {
    Npy v = load(name);
    ck_assert_int_eq(v.n, 256);
    for (int q = 0; q < 256; q++) {
        float ours = fp8_decode(fmt, (uint8_t)q);
        if (isnan(v.data[q])) ck_assert_msg(isnan(ours), "code 0x%02x must decode to NaN", q);
        else {
            ck_assert_msg(ours == (float)v.data[q], "code 0x%02x: ours %g, torch %g", q, ours, v.data[q]);
            ck_assert_msg(!!signbit(ours) == (q >= 0x80), "code 0x%02x: sign", q);
            if (isfinite(ours)) ck_assert_int_eq(fp8_encode(fmt, ours), q);  // round trip
        }
    }
    npy_free(&v);
}
START_TEST(test_decode_all_codes) {
    check_decode(FP8_E4M3, "decode_e4m3.npy");
    check_decode(FP8_E5M2, "decode_e5m2.npy");
}
END_TEST

START_TEST(test_saturation_and_nan) {
    // E4M3: 448 = 0x7E is the largest finite; 464 is the tie between 448 and (missing) 480
    ck_assert_int_eq(fp8_e4m3_encode(448.0f), 0x7E);
    ck_assert_int_eq(fp8_e4m3_encode(464.0f), 0x7E);
    ck_assert_int_eq(fp8_e4m3_encode(480.0f), 0x7E);
    ck_assert_int_eq(fp8_e4m3_encode(1e30f), 0x7E);
    ck_assert_int_eq(fp8_e4m3_encode(INFINITY), 0x7E);
    ck_assert_int_eq(fp8_e4m3_encode(-INFINITY), 0xFE);
    ck_assert_int_eq(fp8_e4m3_encode(-1e9f), 0xFE);
    ck_assert(isnan(fp8_e4m3_decode(fp8_e4m3_encode(NAN))));
    ck_assert(isnan(fp8_e4m3_decode(fp8_e4m3_encode(-NAN))));
    ck_assert(isnan(fp8_e4m3_decode(0x7F)) && isnan(fp8_e4m3_decode(0xFF)));
    // E5M2: 57344 = 0x7B; 61440 (tie with inf) and beyond saturate; inf saturates
    ck_assert_int_eq(fp8_e5m2_encode(57344.0f), 0x7B);
    ck_assert_int_eq(fp8_e5m2_encode(61440.0f), 0x7B);
    ck_assert_int_eq(fp8_e5m2_encode(1e30f), 0x7B);
    ck_assert_int_eq(fp8_e5m2_encode(INFINITY), 0x7B);
    ck_assert_int_eq(fp8_e5m2_encode(-INFINITY), 0xFB);
    ck_assert(isnan(fp8_e5m2_decode(fp8_e5m2_encode(NAN))));
    ck_assert(isinf(fp8_e5m2_decode(0x7C)));
    // smallest subnormals and ties to even at the bottom
    ck_assert_int_eq(fp8_e4m3_encode(ldexpf(1.0f, -9)), 0x01);
    ck_assert_int_eq(fp8_e4m3_encode(ldexpf(1.0f, -10)), 0x00);  // tie to even (0)
    ck_assert_int_eq(fp8_e4m3_encode(ldexpf(3.0f, -10)), 0x02);  // tie 1.5 -> 2
    ck_assert_int_eq(fp8_e4m3_encode(-ldexpf(1.0f, -11)), 0x80);  // keeps the sign
    ck_assert_int_eq(fp8_e5m2_encode(ldexpf(1.0f, -16)), 0x01);
    // float subnormal inputs
    ck_assert_int_eq(fp8_e4m3_encode(1e-40f), 0x00);
    ck_assert_int_eq(fp8_e5m2_encode(-1e-40f), 0x80);
}
END_TEST

// ----------------------------------------------------------------------------
// scales

START_TEST(test_scale_rules) {
    ck_assert(fp8_scale_from_amax(0.0f, FP8_E4M3, 0) == 1.0f);
    ck_assert(fp8_scale_from_amax(0.0f, FP8_E5M2, 1) == 1.0f);
    ck_assert(fp8_scale_from_amax(448.0f, FP8_E4M3, 0) == 1.0f);
    ck_assert(fp8_scale_from_amax(448.0f, FP8_E4M3, 1) == 1.0f);
    ck_assert(fp8_scale_from_amax(449.0f, FP8_E4M3, 1) == 2.0f);
    Rng r = rng_make(7);
    for (int i = 0; i < 100000; i++) {
        float amax = ldexpf(0.5f + rng_uniform(&r), rng_int(&r, 120) - 60);
        for (int f = 0; f < 2; f++) {
            FP8Format fmt = (FP8Format)f;
            float s = fp8_scale_from_amax(amax, fmt, 1), s0 = fp8_scale_from_amax(amax, fmt, 0);
            int e;
            ck_assert_msg(frexpf(s, &e) == 0.5f, "pow2 scale %g of amax %g is not a power of two", s, amax);
            ck_assert_msg(s >= s0 && s < 2.0f * s0, "pow2 scale %g of amax %g not in [amax/max, 2 amax/max)", s, amax);
            ck_assert_msg(amax / s <= fp8_max(fmt), "amax %g / scale %g exceeds the range", amax, s);
            ck_assert(s0 == amax / fp8_max(fmt));
        }
    }
}
END_TEST

// quantize x into a fresh tensor and check every group's scale against its own amax
static void check_group_scales(int rows, int cols, FP8Gran gran, int block_rows, int pow2) {
    Rng r = rng_make((uint64_t)rows * 1000 + cols);
    float *x = (float *)mallocCheck((size_t)rows * cols * sizeof(float));
    fill_random(x, (size_t)rows * cols, &r, 3.0f);
    FP8Tensor t;
    fp8_tensor_alloc_cpu(&t, rows, cols, gran, FP8_E4M3, block_rows);
    for (size_t i = 0; i < fp8_num_scales(gran, rows, cols, t.block_rows); i++) t.scale[i] = -7.0f;  // poison
    fp8_quantize_cpu(&t, x, pow2);
    int gh = gran == FP8_TENSOR ? rows : gran == FP8_ROW ? 1 : block_rows;
    int gw = gran == FP8_BLOCK ? 128 : cols;
    size_t used = 0;
    for (int r0 = 0; r0 < rows; r0 += gh)
        for (int c0 = 0; c0 < cols; c0 += gw) {
            float amax = 0;
            for (int i = r0; i < rows && i < r0 + gh; i++)
                for (int j = c0; j < cols && j < c0 + gw; j++) amax = fmaxf(amax, fabsf(x[(size_t)i * cols + j]));
            float want = fp8_scale_from_amax(amax, FP8_E4M3, pow2);
            // every element of the group maps to the same scale
            for (int i = r0; i < rows && i < r0 + gh; i++)
                for (int j = c0; j < cols && j < c0 + gw; j++)
                    ck_assert_msg(t.scale[fp8_scale_index(&t, i, j)] == want, "(%d,%d) %dx%d %s: scale %g, want %g", i,
                                  j, rows, cols, fp8_gran_name(gran), t.scale[fp8_scale_index(&t, i, j)], want);
            used++;
        }
    size_t ns = fp8_num_scales(gran, rows, cols, t.block_rows), ones = 0;
    for (size_t i = 0; i < ns; i++) {
        ck_assert_msg(t.scale[i] != -7.0f, "scale %zu never written", i);
        ones += t.scale[i] == 1.0f;
    }
    ck_assert(ns >= used);
    ck_assert_msg(ones >= ns - used, "padding scales must be 1");
    fp8_tensor_free_cpu(&t);
    free(x);
}
START_TEST(test_partial_edge_blocks) {
    int shapes[][2] = {{200, 300}, {130, 129}, {1, 1}, {129, 257}, {3, 128}, {256, 384}, {5, 1000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int R = shapes[s][0], C = shapes[s][1];
        for (int pow2 = 0; pow2 < 2; pow2++) {
            check_group_scales(R, C, FP8_TENSOR, 0, pow2);
            check_group_scales(R, C, FP8_ROW, 0, pow2);
            check_group_scales(R, C, FP8_BLOCK, 128, pow2);
            check_group_scales(R, C, FP8_BLOCK, 1, pow2);
        }
    }
    // the layouts: 1x128 activation scales are token-contiguous; 128x128 rows padded to 4
    ck_assert_int_eq(fp8_num_scales(FP8_BLOCK, 5, 300, 1), 3 * 5);
    ck_assert_int_eq(fp8_num_scales(FP8_BLOCK, 300, 5 * 128, 128), 3 * 8);
    FP8Tensor a = {0};
    a.rows = 5; a.cols = 300; a.gran = FP8_BLOCK; a.block_rows = 1;
    ck_assert_int_eq(fp8_scale_index(&a, 4, 299), 2 * 5 + 4);
}
END_TEST

START_TEST(test_zero_block_scale_is_one) {
    int R = 256, C = 384;
    Rng r = rng_make(3);
    float *x = (float *)mallocCheck((size_t)R * C * sizeof(float));
    fill_random(x, (size_t)R * C, &r, 1.0f);
    for (int i = 128; i < 256; i++)
        for (int j = 128; j < 256; j++) x[(size_t)i * C + j] = 0.0f;  // tile (1, 1) all zero
    for (int pow2 = 0; pow2 < 2; pow2++) {
        FP8Tensor t;
        fp8_tensor_alloc_cpu(&t, R, C, FP8_BLOCK, FP8_E4M3, 128);
        fp8_quantize_cpu(&t, x, pow2);
        ck_assert(t.scale[fp8_scale_index(&t, 128, 128)] == 1.0f);
        for (int i = 128; i < 256; i++)
            for (int j = 128; j < 256; j++) ck_assert_int_eq(t.data[(size_t)i * C + j], 0);
        ck_assert(t.scale[fp8_scale_index(&t, 0, 0)] != 1.0f);
        fp8_tensor_free_cpu(&t);
        // and a zero row gets scale 1 per row
        for (int j = 0; j < C; j++) x[(size_t)5 * C + j] = 0.0f;
        fp8_tensor_alloc_cpu(&t, R, C, FP8_ROW, FP8_E4M3, 0);
        fp8_quantize_cpu(&t, x, pow2);
        ck_assert(t.scale[5] == 1.0f);
        ck_assert(isfinite(fp8_sqnr_db(x, &t)));
        fp8_tensor_free_cpu(&t);
    }
    free(x);
}
END_TEST

// ----------------------------------------------------------------------------
// quantizers against PyTorch (fixture), in the plain (unpadded) scale layout

static void check_quant_case(const char *name, FP8Gran gran, int block_rows, FP8Format fmt, int pow2) {
    char fq[64], fs[64], fd[64];
    snprintf(fq, sizeof fq, "quant_%s_q.npy", name);
    snprintf(fs, sizeof fs, "quant_%s_s.npy", name);
    snprintf(fd, sizeof fd, "quant_%s_deq.npy", name);
    Npy X = load("quant_x.npy"), Q = load(fq), S = load(fs), D = load(fd);
    int R = (int)X.shape[0], C = (int)X.shape[1];
    float *x = (float *)mallocCheck((size_t)R * C * sizeof(float)), *deq = (float *)mallocCheck((size_t)R * C * sizeof(float));
    for (long i = 0; i < X.n; i++) x[i] = (float)X.data[i];
    FP8Tensor t;
    fp8_tensor_alloc_cpu(&t, R, C, gran, fmt, block_rows);
    fp8_quantize_cpu(&t, x, pow2);
    fp8_dequantize_cpu(deq, &t);
    long bad_q = 0, bad_d = 0;
    for (long i = 0; i < X.n; i++) {
        bad_q += t.data[i] != (uint8_t)Q.data[i];
        bad_d += deq[i] != (float)D.data[i];
    }
    ck_assert_msg(bad_q == 0, "%s: %ld of %ld codes differ from PyTorch", name, bad_q, X.n);
    ck_assert_msg(bad_d == 0, "%s: %ld of %ld dequantized values differ from PyTorch", name, bad_d, X.n);
    // scales: the fixture is plain row-major (groups of rows, groups of cols)
    int gh = gran == FP8_TENSOR ? R : gran == FP8_ROW ? 1 : block_rows, gw = gran == FP8_BLOCK ? 128 : C;
    int rg = (R + gh - 1) / gh, cg = (C + gw - 1) / gw;
    ck_assert_int_eq(S.n, (long)rg * cg);
    for (int i = 0; i < rg; i++)
        for (int j = 0; j < cg; j++)
            ck_assert_msg(t.scale[fp8_scale_index(&t, i * gh, j * gw)] == (float)S.data[(long)i * cg + j],
                          "%s: scale of group (%d, %d)", name, i, j);
    fp8_tensor_free_cpu(&t);
    free(x);
    free(deq);
    npy_free(&X); npy_free(&Q); npy_free(&S); npy_free(&D);
}
START_TEST(test_quantize_vs_torch) {
    check_quant_case("tensor", FP8_TENSOR, 0, FP8_E4M3, 0);
    check_quant_case("row", FP8_ROW, 0, FP8_E4M3, 0);
    check_quant_case("w128", FP8_BLOCK, 128, FP8_E4M3, 0);
    check_quant_case("a128", FP8_BLOCK, 1, FP8_E4M3, 0);
    check_quant_case("w128_pow2", FP8_BLOCK, 128, FP8_E4M3, 1);
    check_quant_case("row_e5m2", FP8_ROW, 0, FP8_E5M2, 0);
}
END_TEST

// ----------------------------------------------------------------------------
// the error bound of quantize -> dequantize. With M mantissa bits, rounding to
// nearest moves a normal value by at most half an ulp: |x/s - q| <= 2^-(M+1) |x/s|
// (2^-4 for E4M3, 2^-3 for E5M2). Below the smallest normal 2^(1-B) the spacing is
// fixed at 2^(1-B-M), so the error is at most 2^(-B-M) (2^-10 E4M3, 2^-17 E5M2)
// in units of s. Multiplying by s (fp32) and the fp32 division x/s add a few 2^-24.

static void check_error_bound(FP8Format fmt, FP8Gran gran, int block_rows, int pow2) {
    int R = 130, C = 300;
    Rng r = rng_make(11 + gran * 10 + pow2 + fmt * 100);
    float *x = (float *)mallocCheck((size_t)R * C * sizeof(float)), *d = (float *)mallocCheck((size_t)R * C * sizeof(float));
    fill_random(x, (size_t)R * C, &r, 2.5f);
    x[17] = 5e6f;  // an outlier far beyond the range
    FP8Tensor t;
    fp8_tensor_alloc_cpu(&t, R, C, gran, fmt, block_rows);
    fp8_quantize_cpu(&t, x, pow2);
    fp8_dequantize_cpu(d, &t);
    int M = fmt == FP8_E4M3 ? 3 : 2, B = fmt == FP8_E4M3 ? 7 : 15;
    double rel = ldexp(1.0, -(M + 1)) + ldexp(1.0, -21), sub = ldexp(1.0, -B - M);
    double worst = 0;  // largest error relative to the bound
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            double v = x[(size_t)i * C + j], s = t.scale[fp8_scale_index(&t, i, j)];
            double bound = fmax(rel * fabs(v), sub * s * (1 + ldexp(1.0, -20)));
            double err = fabs(v - d[(size_t)i * C + j]);
            ck_assert_msg(err <= bound, "%s %s: x %g deq %g err %g > bound %g", fmt == FP8_E4M3 ? "e4m3" : "e5m2",
                          fp8_gran_name(gran), v, d[(size_t)i * C + j], err, bound);
            if (err / bound > worst) worst = err / bound;
        }
    ck_assert_msg(worst > 0.5, "the bound is never approached (worst %g): is the test testing anything?", worst);
    fp8_tensor_free_cpu(&t);
    free(x);
    free(d);
}
START_TEST(test_error_bound) {
    for (int f = 0; f < 2; f++)
        for (int pow2 = 0; pow2 < 2; pow2++) {
            check_error_bound((FP8Format)f, FP8_TENSOR, 0, pow2);
            check_error_bound((FP8Format)f, FP8_ROW, 0, pow2);
            check_error_bound((FP8Format)f, FP8_BLOCK, 128, pow2);
            check_error_bound((FP8Format)f, FP8_BLOCK, 1, pow2);
        }
}
END_TEST

// ----------------------------------------------------------------------------
// GEMM: against a float64 matmul of the dequantized operands. The products of two
// decoded FP8 values are exact in fp32 (4-bit x 4-bit mantissas), so the only
// error is fp32 summation and the scale multiplications: at most (K + 4) * 2^-24
// * sum_k |x_k w_k| (the classic bound for recursive summation; the block path
// sums 128 terms, then K/128 partial sums, which is within the same bound).

static void check_gemm(int M, int N, int K, FP8Gran gran, FP8Format fx, FP8Format fw, float sigma) {
    Rng r = rng_make((uint64_t)M * 31 + N * 7 + K + gran);
    float *x = (float *)mallocCheck((size_t)M * K * 4), *w = (float *)mallocCheck((size_t)N * K * 4);
    fill_random(x, (size_t)M * K, &r, sigma);
    fill_random(w, (size_t)N * K, &r, sigma);
    FP8Tensor qx, qw;
    fp8_tensor_alloc_cpu(&qx, M, K, gran, fx, 1);
    fp8_tensor_alloc_cpu(&qw, N, K, gran, fw, 128);
    fp8_quantize_cpu(&qx, x, 0);
    fp8_quantize_cpu(&qw, w, 0);
    float *dx = (float *)mallocCheck((size_t)M * K * 4), *dw = (float *)mallocCheck((size_t)N * K * 4);
    fp8_dequantize_cpu(dx, &qx);
    fp8_dequantize_cpu(dw, &qw);
    float *y = (float *)mallocCheck((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * N; i++) y[i] = NAN;  // poison
    fp8_gemm_cpu(y, &qx, &qw);
    double worst = 0, u = ldexp(1.0, -24);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)dx[(size_t)m * K + k] * dw[(size_t)n * K + k];
                ref += p;
                mag += fabs(p);
            }
            double err = fabs(y[(size_t)m * N + n] - ref), bound = (K + 4) * u * mag;
            ck_assert_msg(err <= bound, "gemm %s %dx%dx%d (%d,%d): %g vs %g (err %g > %g)", fp8_gran_name(gran), M, N, K,
                          m, n, y[(size_t)m * N + n], ref, err, bound);
            if (err / mag > worst) worst = err / mag;
        }
    // and the quantized product is close to the unquantized one (a coarse sanity check:
    // each operand within 2^-4 relative, so the product within ~2^-3 of sum |x w|)
    for (int m = 0; m < M; m += 7)
        for (int n = 0; n < N; n += 5) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)x[(size_t)m * K + k] * w[(size_t)n * K + k];
                ref += p;
                mag += fabs(p);
            }
            double tol = (fx == FP8_E4M3 && fw == FP8_E4M3 ? 0.13 : 0.26) * mag + 1e-30;
            ck_assert_msg(fabs(y[(size_t)m * N + n] - ref) <= tol, "gemm vs fp32 inputs too far");
        }
    fp8_tensor_free_cpu(&qx);
    fp8_tensor_free_cpu(&qw);
    free(x); free(w); free(dx); free(dw); free(y);
}
START_TEST(test_gemm_reference) {
    FP8Gran g[] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    for (int i = 0; i < 3; i++) {
        check_gemm(33, 200, 300, g[i], FP8_E4M3, FP8_E4M3, 1.5f);  // partial blocks everywhere
        check_gemm(16, 128, 1024, g[i], FP8_E4M3, FP8_E4M3, 1.0f);
        check_gemm(5, 130, 129, g[i], FP8_E5M2, FP8_E4M3, 2.0f);   // E5M2 gradients x E4M3 weights
    }
}
END_TEST

// The CPU backend's products with an FP8 weight decode W's rows inside the product
// (matmul_forward_fp8 / matmul_backward_fp8): each must equal the dense product of fp8_dequantize_cpu's
// W bit for bit, at every granularity, with partial blocks, OC % 4 != 0, zeros in dout, = and +=.
static void check_fp8_matmul(int N, int C, int OC, FP8Gran g, uint64_t seed) {
    Rng r = rng_make(seed);
    float *w = (float *)mallocCheck((size_t)OC * C * 4), *wd = (float *)mallocCheck((size_t)OC * C * 4);
    float *x = (float *)mallocCheck((size_t)N * C * 4), *bias = (float *)mallocCheck(OC * 4);
    float *dy = (float *)mallocCheck((size_t)N * OC * 4);
    for (size_t i = 0; i < (size_t)OC * C; i++) w[i] = rng_normal(&r) * ldexpf(1.0f, (int)(i / C % 5) - 2);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = rng_normal(&r);
    for (int i = 0; i < OC; i++) bias[i] = rng_normal(&r);
    for (size_t i = 0; i < (size_t)N * OC; i++) dy[i] = i % 7 == 3 ? 0.0f : rng_normal(&r);  // matmul_backward skips zeros
    FP8Tensor q;
    fp8_tensor_alloc_cpu(&q, OC, C, g, FP8_E4M3, g == FP8_BLOCK ? FP8_BLOCK_SIZE : 1);
    fp8_quantize_cpu(&q, w, 0);
    if (seed % 2 == 0)  // every code, the NaNs and subnormals included, through the decode
        for (size_t i = 0; i < (size_t)OC * C; i++) q.data[i] = (uint8_t)(i * 37 + seed);
    fp8_dequantize_cpu(wd, &q);
    double *xd = (double *)mallocCheck((size_t)N * C * 8), *wdd = (double *)mallocCheck((size_t)OC * C * 8);
    double *bd = (double *)mallocCheck(OC * 8), *dyd = (double *)mallocCheck((size_t)N * OC * 8);
    for (size_t i = 0; i < (size_t)N * C; i++) xd[i] = x[i];
    for (size_t i = 0; i < (size_t)OC * C; i++) wdd[i] = wd[i];
    for (int i = 0; i < OC; i++) bd[i] = bias[i];
    for (size_t i = 0; i < (size_t)N * OC; i++) dyd[i] = dy[i];
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *y1 = (float *)mallocCheck((size_t)N * OC * 4), *y2 = (float *)mallocCheck((size_t)N * OC * 4);
        matmul_forward_cpu(y1, x, wd, with_bias ? bias : NULL, N, C, OC);
        matmul_forward_fp8_cpu(y2, x, &q, with_bias ? bias : NULL, N);
        ck_assert_msg(!memcmp(y1, y2, (size_t)N * OC * 4), "matmul_forward_fp8 (%d x %d x %d, %s) differs", N, C, OC,
                      fp8_gran_name(g));
        double *z1 = (double *)mallocCheck((size_t)N * OC * 8), *z2 = (double *)mallocCheck((size_t)N * OC * 8);
        matmul_forward_cpu64(z1, xd, wdd, with_bias ? bd : NULL, N, C, OC);
        matmul_forward_fp8_cpu64(z2, xd, &q, with_bias ? bd : NULL, N);
        ck_assert_msg(!memcmp(z1, z2, (size_t)N * OC * 8), "matmul_forward_fp8_cpu64 differs");
        free(y1), free(y2), free(z1), free(z2);
    }
    for (int acc = 0; acc < 2; acc++) {
        float *d1 = (float *)mallocCheck((size_t)N * C * 4), *d2 = (float *)mallocCheck((size_t)N * C * 4);
        for (size_t i = 0; i < (size_t)N * C; i++) d1[i] = d2[i] = x[i];  // the += case starts from x
        matmul_backward_cpu(d1, acc, NULL, NULL, dy, x, wd, N, C, OC);
        matmul_backward_fp8_cpu(d2, acc, dy, &q, N);
        ck_assert_msg(!memcmp(d1, d2, (size_t)N * C * 4), "matmul_backward_fp8 (%d x %d x %d, %s, %s) differs", N, C,
                      OC, fp8_gran_name(g), acc ? "+=" : "=");
        double *e1 = (double *)mallocCheck((size_t)N * C * 8), *e2 = (double *)mallocCheck((size_t)N * C * 8);
        for (size_t i = 0; i < (size_t)N * C; i++) e1[i] = e2[i] = xd[i];
        matmul_backward_cpu64(e1, acc, NULL, NULL, dyd, xd, wdd, N, C, OC);
        matmul_backward_fp8_cpu64(e2, acc, dyd, &q, N);
        ck_assert_msg(!memcmp(e1, e2, (size_t)N * C * 8), "matmul_backward_fp8_cpu64 differs");
        free(d1), free(d2), free(e1), free(e2);
    }
    fp8_tensor_free_cpu(&q);
    free(w), free(wd), free(x), free(bias), free(dy), free(xd), free(wdd), free(bd), free(dyd);
}

START_TEST(test_cpu_matmul_fp8_weight) {
    FP8Gran g[] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    for (int i = 0; i < 3; i++) {
        check_fp8_matmul(1, 300, 130, g[i], 1 + i);   // decode: one row; partial blocks in C and OC
        check_fp8_matmul(7, 128, 5, g[i], 4 + i);     // OC % 4 != 0
        check_fp8_matmul(17, 576, 259, g[i], 7 + i);  // the 135M model's width, not a multiple of 128
    }
}
END_TEST

START_TEST(test_gemm_all_positive_large_k) {
    // all-positive values: no cancellation, the sum grows with K (K = 4096)
    int M = 4, N = 130, K = 4096;
    Rng r = rng_make(99);
    float *x = (float *)mallocCheck((size_t)M * K * 4), *w = (float *)mallocCheck((size_t)N * K * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = 0.5f + rng_uniform(&r);
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = 0.5f + rng_uniform(&r);
    FP8Tensor qx, qw;
    fp8_tensor_alloc_cpu(&qx, M, K, FP8_BLOCK, FP8_E4M3, 1);
    fp8_tensor_alloc_cpu(&qw, N, K, FP8_BLOCK, FP8_E4M3, 128);
    fp8_quantize_cpu(&qx, x, 1);
    fp8_quantize_cpu(&qw, w, 1);
    float *y = (float *)mallocCheck((size_t)M * N * 4), *dx = (float *)mallocCheck((size_t)M * K * 4),
          *dw = (float *)mallocCheck((size_t)N * K * 4);
    fp8_gemm_cpu(y, &qx, &qw);
    fp8_dequantize_cpu(dx, &qx);
    fp8_dequantize_cpu(dw, &qw);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0;
            for (int k = 0; k < K; k++) ref += (double)dx[(size_t)m * K + k] * dw[(size_t)n * K + k];
            ck_assert(fabs(y[(size_t)m * N + n] - ref) <= (K + 4) * ldexp(1.0, -24) * ref);
        }
    fp8_tensor_free_cpu(&qx);
    fp8_tensor_free_cpu(&qw);
    free(x); free(w); free(y); free(dx); free(dw);
}
END_TEST

// ----------------------------------------------------------------------------
// SQNR: for Gaussian data the relative rounding error of a format with M mantissa
// bits is roughly uniform within +-2^-(M+1), which gives ~ 6.02 (M+1) + 4.8 dB
// minus a little for the wider binades: about 31 dB for E4M3 and 25 dB for E5M2.

START_TEST(test_sqnr) {
    int R = 256, C = 512;
    Rng r = rng_make(5);
    float *x = (float *)mallocCheck((size_t)R * C * 4);
    for (size_t i = 0; i < (size_t)R * C; i++) x[i] = rng_normal(&r);
    FP8Tensor t;
    fp8_tensor_alloc_cpu(&t, R, C, FP8_TENSOR, FP8_E4M3, 0);
    fp8_quantize_cpu(&t, x, 0);
    double s4 = fp8_sqnr_db(x, &t);
    fp8_tensor_free_cpu(&t);
    fp8_tensor_alloc_cpu(&t, R, C, FP8_TENSOR, FP8_E5M2, 0);
    fp8_quantize_cpu(&t, x, 0);
    double s5 = fp8_sqnr_db(x, &t);
    fp8_tensor_free_cpu(&t);
    ck_assert_msg(s4 > 27 && s4 < 35, "E4M3 SQNR %g dB", s4);
    ck_assert_msg(s5 > 21 && s5 < 29, "E5M2 SQNR %g dB", s5);
    ck_assert_msg(s4 - s5 > 4 && s4 - s5 < 8, "one mantissa bit is ~6 dB: %g vs %g", s4, s5);
    // outliers: one huge row hurts a per-tensor scale, not per-row or block scales
    for (int j = 0; j < C; j++) x[j] *= 1e5f;
    double sq[4];
    FP8Gran g[] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    for (int i = 0; i < 3; i++) {
        fp8_tensor_alloc_cpu(&t, R, C, g[i], FP8_E4M3, 128);
        fp8_quantize_cpu(&t, x, 0);
        sq[i] = fp8_sqnr_db(x, &t);
        fp8_tensor_free_cpu(&t);
    }
    // SQNR is dominated by the huge row in all three, so compare the error on the rest
    ck_assert(isfinite(sq[0]) && isfinite(sq[1]) && isfinite(sq[2]));
    fp8_tensor_alloc_cpu(&t, R, C, FP8_TENSOR, FP8_E4M3, 0);
    fp8_quantize_cpu(&t, x, 0);
    FP8Tensor tr;
    fp8_tensor_alloc_cpu(&tr, R, C, FP8_ROW, FP8_E4M3, 0);
    fp8_quantize_cpu(&tr, x, 0);
    // rows 1.. as their own tensors: build views
    FP8Tensor vt = t, vr = tr;
    vt.rows = vr.rows = R - 1;
    vt.data += C; vr.data += C; vr.scale += 1;
    double rest_t = fp8_sqnr_db(x + C, &vt), rest_r = fp8_sqnr_db(x + C, &vr);
    ck_assert_msg(rest_r > 27 && rest_t < rest_r - 10, "outlier row: tensor %g dB, row %g dB on the other rows", rest_t, rest_r);
    fp8_tensor_free_cpu(&t);
    fp8_tensor_free_cpu(&tr);
    free(x);
}
END_TEST

static Suite *fp8_suite(void) {
    Suite *s = suite_create("fp8");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_e4m3_all_bf16);
    tcase_add_test(tc, test_e5m2_all_bf16);
    tcase_add_test(tc, test_decode_all_codes);
    tcase_add_test(tc, test_saturation_and_nan);
    tcase_add_test(tc, test_scale_rules);
    tcase_add_test(tc, test_partial_edge_blocks);
    tcase_add_test(tc, test_zero_block_scale_is_one);
    tcase_add_test(tc, test_quantize_vs_torch);
    tcase_add_test(tc, test_error_bound);
    tcase_add_test(tc, test_gemm_reference);
    tcase_add_test(tc, test_cpu_matmul_fp8_weight);
    tcase_add_test(tc, test_gemm_all_positive_large_k);
    tcase_add_test(tc, test_sqnr);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(fp8_suite()); }
