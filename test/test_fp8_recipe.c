// test/test_fp8_recipe.c: the FP8 training recipe's CPU reference (core/fp8_recipe.h): delayed
// scaling step by step against an independent NumPy reimplementation of Transformer Engine's
// amax_and_scale_update (fixtures: dev/make_recipe_fixtures.py), and the three FP8 products of a
// trained linear layer against each other (adjoints). The GPU's recipe: test/gpu_fp8_train.cu.
#include <check.h>
#include <math.h>

#include "fp8.h"
#include "testutil.h"
#include "core/fp8_recipe.h"

// Delayed scaling against Transformer Engine's semantics.
// Each case of test/fixtures/recipe (dev/make_recipe_fixtures.py: an independent NumPy
// reimplementation of TE's amax_and_scale_update) is 400 steps of amaxes with drift, spikes x1000,
// zeros, dips, an inf and a NaN; after each step the scale and its inverse must equal the fixture's
// bit for bit, and the two non-finite steps are counted as overflows.
START_TEST(test_delayed_scaling_vs_te) {
    char p[1024];
    fixture_path(p, sizeof p, "recipe/cases.txt");
    FILE *f = fopen(p, "r");
    ck_assert_msg(f != NULL, "cannot open %s: run from the repo root or regenerate with dev/make_recipe_fixtures.py", p);
    char name[64], algo[16], fmt[8];
    int len, ncases = 0;
    float margin;
    while (fscanf(f, "%63s %d %15s %f %7s", name, &len, algo, &margin, fmt) == 5) {
        FP8Recipe r = fp8_recipe_default();
        r.history_len = len;
        r.algo = (AmaxAlgo)amax_algo_parse(algo);
        r.margin = margin;
        ck_assert_int_ge(r.algo, 0);
        DelayedScale d;
        delayed_init(&d, &r, !strcmp(fmt, "e5m2") ? FP8_E5M2 : FP8_E4M3);
        char rel[128];
        snprintf(rel, sizeof rel, "recipe/%s.npy", name);
        fixture_path(p, sizeof p, rel);
        Npy a = npy_read(p);
        ck_assert_int_eq(a.shape[1], 3);
        int changes = 0;
        float prev = d.scale;
        for (long t = 0; t < a.shape[0]; t++) {
            delayed_record(&d, (float)a.data[t * 3]);
            delayed_update(&d);
            float want = (float)a.data[t * 3 + 1], want_inv = (float)a.data[t * 3 + 2];
            ck_assert_msg(d.scale == want && d.scale_inv == want_inv, "%s step %ld: scale %.9g (inv %.9g), TE's %.9g (%.9g)",
                          name, t, d.scale, d.scale_inv, want, want_inv);
            changes += d.scale != prev;
            prev = d.scale;
        }
        ck_assert_msg(d.overflows == 2, "%s: %ld overflow steps, the fixture has 2", name, d.overflows);
        ck_assert_msg(changes >= 3, "%s: the scale changed only %d times: the case tests little", name, changes);
        npy_free(&a);
        delayed_free(&d);
        ncases++;
    }
    fclose(f);
    ck_assert_int_eq(ncases, 5);
}
END_TEST

// A given scale multiplies before the cast, its inverse dequantizes; the recorded amax ignores
// nothing but reports a NaN; and the three products of a linear layer are each other's adjoints:
// sum dy * (x W^T) = sum dx * x = sum dW * W (dx = dy W, dW = dy^T x), on FP8 operands (E4M3
// forward, E5M2 gradients), in fp64: equal to ~1e-12 relative.
START_TEST(test_recipe_reference) {
    Rng r = rng_make(77);
    int N = 24, C = 40, OC = 56;
    float *x = (float *)mallocCheck(N * C * 4), *w = (float *)mallocCheck(OC * C * 4), *g = (float *)mallocCheck(N * OC * 4);
    fill_random(x, N * C, &r, 1.0f);
    fill_random(w, OC * C, &r, 1.0f);
    fill_random(g, N * OC, &r, 2.0f);
    FP8Tensor qx, qw, qg;
    fp8_tensor_alloc_cpu(&qx, N, C, FP8_TENSOR, FP8_E4M3, 1);
    fp8_tensor_alloc_cpu(&qw, OC, C, FP8_TENSOR, FP8_E4M3, 128);
    fp8_tensor_alloc_cpu(&qg, N, OC, FP8_TENSOR, FP8_E5M2, 1);
    float amax = 0;
    for (int i = 0; i < N * C; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = 448.0f / amax;
    ck_assert(fp8_quantize_scaled_cpu(&qx, x, s) == amax);
    ck_assert(qx.scale[0] == 1.0f / s);
    for (int i = 0; i < N * C; i++) ck_assert(qx.data[i] == fp8_e4m3_encode(x[i] * s));
    fp8_quantize_scaled_cpu(&qw, w, 1.0f);
    fp8_quantize_scaled_cpu(&qg, g, 0.25f);
    float xn[2] = {1.0f, NAN};
    FP8Tensor q2;
    fp8_tensor_alloc_cpu(&q2, 1, 2, FP8_TENSOR, FP8_E4M3, 1);
    ck_assert(isnan(fp8_quantize_scaled_cpu(&q2, xn, 1.0f)));
    fp8_tensor_free_cpu(&q2);
    double *y = (double *)mallocCheck(N * OC * 8), *dx = (double *)mallocCheck(N * C * 8), *dw = (double *)mallocCheck(OC * C * 8);
    fp8_linear_train_cpu(y, dx, dw, &qx, &qw, &qg);
    float *xf = (float *)mallocCheck(N * C * 4), *wf = (float *)mallocCheck(OC * C * 4), *gf = (float *)mallocCheck(N * OC * 4);
    fp8_dequantize_cpu(xf, &qx), fp8_dequantize_cpu(wf, &qw), fp8_dequantize_cpu(gf, &qg);
    double a = 0, b = 0, c = 0, mag = 0;
    for (int i = 0; i < N * OC; i++) a += gf[i] * y[i], mag += fabs(gf[i] * y[i]);
    for (int i = 0; i < N * C; i++) b += dx[i] * xf[i];
    for (int i = 0; i < OC * C; i++) c += dw[i] * wf[i];
    ck_assert_msg(fabs(a - b) <= 1e-12 * mag && fabs(a - c) <= 1e-12 * mag, "adjoints: %.17g %.17g %.17g", a, b, c);
    fp8_tensor_free_cpu(&qx), fp8_tensor_free_cpu(&qw), fp8_tensor_free_cpu(&qg);
    free(x), free(w), free(g), free(y), free(dx), free(dw), free(xf), free(wf), free(gf);
}
END_TEST

static Suite *recipe_suite(void) {
    Suite *s = suite_create("fp8_recipe");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_delayed_scaling_vs_te);
    tcase_add_test(tc, test_recipe_reference);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(recipe_suite()); }
