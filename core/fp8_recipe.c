// fp8_recipe.c: the FP8 training recipe's scaling rules and CPU reference (fp8_recipe.h).
// Plain C11; the delayed scaling follows Transformer Engine's amax_and_scale_update (checked
// against an independent NumPy reimplementation: test/test_fp8.c, dev/make_recipe_fixtures.py).
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp8_recipe.h"

FP8Recipe fp8_recipe_default(void) {
    FP8Recipe r = {FP8_RECIPE_DELAYED, 1, 1024, AMAX_MAX, 0.0f, 0};
    return r;
}
int fp8_recipe_parse(const char *s) {
    return !strcmp(s, "current") ? FP8_RECIPE_CURRENT : !strcmp(s, "delayed") ? FP8_RECIPE_DELAYED
         : !strcmp(s, "block")   ? FP8_RECIPE_BLOCK : -1;
}
int amax_algo_parse(const char *s) { return !strcmp(s, "max") ? AMAX_MAX : !strcmp(s, "most_recent") ? AMAX_MOST_RECENT : -1; }
int fp8_format_hybrid_parse(const char *s) { return !strcmp(s, "hybrid") ? 1 : !strcmp(s, "e4m3") ? 0 : -1; }

// ----------------------------------------------------------------------------
// delayed scaling

void delayed_init(DelayedScale *d, const FP8Recipe *r, FP8Format fmt) {
    if (r->history_len < 1) die("--fp8_amax_history_len must be at least 1, got %d", r->history_len);
    memset(d, 0, sizeof *d);
    d->len = r->history_len;
    d->algo = r->algo;
    d->fmt = fmt;
    d->scaled_max = fp8_max(fmt) * powf(2.0f, -r->margin);  // fp32, as TE computes it
    d->history = (float *)callocCheck(d->len, sizeof(float));
    d->scale = d->scale_inv = 1.0f;
}

void delayed_free(DelayedScale *d) {
    free(d->history);
    memset(d, 0, sizeof *d);
}

void delayed_record(DelayedScale *d, float amax) {
    float *h = &d->history[0];
    if (isnan(amax) || isnan(*h)) *h = NAN;  // a NaN in any of the step's tensors marks the step
    else if (amax > *h) *h = amax;
}

void delayed_update(DelayedScale *d) {
    float last = d->history[0], amax = last;
    if (!isfinite(last)) d->overflows++;
    if (d->algo == AMAX_MAX) {
        amax = 0.0f;
        for (int i = 0; i < d->len; i++) amax = fmaxf(amax, d->history[i]);  // fmaxf: a NaN is ignored
    }
    // roll: the oldest entry leaves, this step's amax becomes the newest of the past, row 0 restarts
    if (d->len > 1) {
        memmove(&d->history[1], &d->history[2], (size_t)(d->len - 2) * sizeof(float));
        d->history[d->len - 1] = last;
    }
    d->history[0] = 0.0f;
    if (isfinite(amax) && amax > 0.0f) {
        float s = d->scaled_max / amax;
        d->scale = isinf(s) ? FLT_MAX : s;
        d->scale_inv = 1.0f / d->scale;
    }
}

// ----------------------------------------------------------------------------
// quantization with a given scale, and the three products

float fp8_quantize_scaled_cpu(FP8Tensor *t, const float *x, float scale) {
    if (t->gran != FP8_TENSOR) die("fp8_quantize_scaled_cpu: a given scale is per tensor, not %s", fp8_gran_name(t->gran));
    size_t n = (size_t)t->rows * t->cols;
    float amax = 0.0f;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) nan = 1;
        else amax = fmaxf(amax, fabsf(x[i]));
        t->data[i] = fp8_encode(t->fmt, x[i] * scale);
    }
    t->scale[0] = 1.0f / scale;
    return nan ? NAN : amax;
}

void fp8_linear_train_cpu(double *y, double *dx, double *dw, const FP8Tensor *x, const FP8Tensor *w,
                          const FP8Tensor *dy) {
    int N = x ? x->rows : dy->rows, C = w->cols, OC = w->rows;
    float *xf = x ? (float *)mallocCheck((size_t)N * C * sizeof(float)) : NULL;
    float *wf = (float *)mallocCheck((size_t)OC * C * sizeof(float));
    float *gf = dy ? (float *)mallocCheck((size_t)N * OC * sizeof(float)) : NULL;
    if (x) fp8_dequantize_cpu(xf, x);
    fp8_dequantize_cpu(wf, w);
    if (dy) fp8_dequantize_cpu(gf, dy);
    if (y) {
        if (!x) die("fp8_linear_train_cpu: the forward needs x");
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double s = 0;
                for (int c = 0; c < C; c++) s += (double)xf[(size_t)n * C + c] * wf[(size_t)o * C + c];
                y[(size_t)n * OC + o] = s;
            }
    }
    if (dx) {
        if (!dy) die("fp8_linear_train_cpu: the input gradient needs dy");
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int o = 0; o < OC; o++) s += (double)gf[(size_t)n * OC + o] * wf[(size_t)o * C + c];
                dx[(size_t)n * C + c] = s;
            }
    }
    if (dw) {
        if (!dy || !x) die("fp8_linear_train_cpu: the weight gradient needs dy and x");
        for (int o = 0; o < OC; o++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int n = 0; n < N; n++) s += (double)gf[(size_t)n * OC + o] * xf[(size_t)n * C + c];
                dw[(size_t)o * C + c] = s;
            }
    }
    free(xf);
    free(wf);
    free(gf);
}
