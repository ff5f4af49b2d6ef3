// backend.c: choosing a backend at run time (GPU when usable, CPU otherwise),
// and host-side conversions of backend values for reports and tests, and the checks both backends share.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"

#define CONVERT_BODY(dst, src, st, n)                                                              \
    switch (st) {                                                                                  \
        case DT_F32: for (size_t i = 0; i < n; i++) dst[i] = ((const float *)src)[i]; break;      \
        case DT_F64: for (size_t i = 0; i < n; i++) dst[i] = ((const double *)src)[i]; break;     \
        case DT_BF16: for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(((const uint16_t *)src)[i]); break; \
        case DT_F16: for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(((const uint16_t *)src)[i]); break;   \
        case DT_E4M3: for (size_t i = 0; i < n; i++) dst[i] = fp8_e4m3_decode(((const uint8_t *)src)[i]); break; \
        case DT_E5M2: for (size_t i = 0; i < n; i++) dst[i] = fp8_e5m2_decode(((const uint8_t *)src)[i]); break; \
        case DT_I32: for (size_t i = 0; i < n; i++) dst[i] = ((const int32_t *)src)[i]; break;    \
        default: die("cannot convert %s values to floating point", dtype_name(st));              \
    }

void convert_to_f64(double *dst, const void *src, DType st, size_t n) { CONVERT_BODY(dst, src, st, n) }
void convert_to_f32(float *dst, const void *src, DType st, size_t n) { CONVERT_BODY(dst, src, st, n) }

long backend_env_rows(const char *name) {
    const char *v = getenv(name);
    if (!v) return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (end == v || *end || errno || n < 1 || n > (1L << 24))
        die("%s='%.40s': not a number of rows in [1, 16777216]: set a positive integer, or unset it for the default", name, v);
    return n;
}

void linear_q_check(const FP8Tensor *xq, const QWeight *w, int N) {
    if (w->train || xq->gran != w->gran || (w->gran != FP8_ROW && w->gran != FP8_BLOCK) || xq->rows != N ||
        xq->cols != w->cols)
        die("linear_forward_q: an input quantized as gran %d, %d x %d, for %d rows into a weight of gran %d and %d "
            "columns", (int)xq->gran, xq->rows, xq->cols, N, (int)w->gran, w->cols);
}
