// backend_cpu.c: the CPU reference backend ("cpu", fp32) and, compiled again
// with -DCPU_F64, the fp64 backend ("cpu64") used by the gradient checks.
// Each Backend op is a thin wrapper over the reference kernels of ops_cpu.c and
// fp8_cpu.c; the fused ops of the decode step are the plain ops they fuse, in
// turn. The only logic here is FP8 fake quantization in the linear layer:
// activations are quantized dynamically to the weight's granularity and both
// operands are dequantized and multiplied in full precision, which is the
// numeric truth for the real FP8 GEMMs (they must agree with it to FP8-derived
// tolerances).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "cpu/ops_cpu.h"

#ifdef CPU_F64
typedef double real;
#define OP(name) name##_cpu64
#define BACKEND_NAME "cpu64"
#define BACKEND_FN backend_cpu64
#define REAL_DT DT_F64
#else
typedef float real;
#define OP(name) name##_cpu
#define BACKEND_NAME "cpu"
#define BACKEND_FN backend_cpu
#define REAL_DT DT_F32
#endif

// ---- memory: plain host memory, each block's size kept in a 64-byte header -------------
static size_t mem_now, mem_peak;
static void *cpu_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes + 64) != 0) die("out of host memory allocating %zu bytes", bytes);
    *(size_t *)p = bytes;
    mem_now += bytes;
    if (mem_now > mem_peak) mem_peak = mem_now;
    return (char *)p + 64;
}
static void cpu_free(void *p) {
    if (!p) return;
    char *b = (char *)p - 64;
    mem_now -= *(size_t *)b;
    free(b);
}
static size_t cpu_mem_in_use(size_t *peak) {
    if (peak) *peak = mem_peak;
    return mem_now;
}
static size_t cpu_mem_capacity(void) { return 0; }  // host memory: no budget to fit into
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static void cpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    for (size_t r = 0; r < rows; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}
static void cpu_sync(void) {}

static void cpu_upload_convert(void *dst, DType dt, const void *src, DType st, size_t n) {
    if (dt != REAL_DT) die(BACKEND_NAME " backend: upload_convert to %s unsupported", dtype_name(dt));
    real *d = (real *)dst;
    switch (st) {
        case DT_F32: for (size_t i = 0; i < n; i++) d[i] = (real)((const float *)src)[i]; break;
        case DT_F64: for (size_t i = 0; i < n; i++) d[i] = (real)((const double *)src)[i]; break;
        case DT_BF16: for (size_t i = 0; i < n; i++) d[i] = bf16_to_f32(((const uint16_t *)src)[i]); break;
        case DT_F16: for (size_t i = 0; i < n; i++) d[i] = f16_to_f32(((const uint16_t *)src)[i]); break;
        default: die(BACKEND_NAME " backend: cannot convert %s to %s", dtype_name(st), dtype_name(dt));
    }
}

// ---- weights -------------------------------------------------------------------
static float *to_f32(const void *src, DType st, size_t n) {
    float *f = (float *)mallocCheck(n * sizeof(float));
    convert_to_f32(f, src, st, n);
    return f;
}

static void cpu_quantize_weight(QWeight *w, const void *src, DType st, int pow2) {
    size_t n = (size_t)w->rows * w->cols;
    if (w->gran == FP8_OFF) {
        cpu_upload_convert(w->dense, REAL_DT, src, st, n);
        return;
    }
    float *f = to_f32(src, st, n);
    fp8_quantize_cpu(&w->q, f, pow2);
    free(f);
}

static void cpu_dequantize_weight(void *out, const QWeight *w) {
    size_t n = (size_t)w->rows * w->cols;
    if (w->gran == FP8_OFF) {
        memcpy(out, w->dense, n * sizeof(real));
        return;
    }
    float *f = (float *)mallocCheck(n * sizeof(float));
    fp8_dequantize_cpu(f, &w->q);
    for (size_t i = 0; i < n; i++) ((real *)out)[i] = f[i];
    free(f);
}

// ---- the linear layer with FP8 fake quantization ---------------------------------
// Activations (N, C) quantized with the weight's granularity (TENSOR: one scale,
// ROW: per token, BLOCK: 1x128 groups), E4M3, then dequantized: xq (N, C) real.
// q (allocated, shape and granularity set) = the quantization of x (n = rows * cols values)
static void quantize_act(FP8Tensor *q, const real *x) {
    size_t n = (size_t)q->rows * q->cols;
    float *f = (float *)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    fp8_quantize_cpu(q, f, 0);
    free(f);
}
// xq's values, dequantized (N, C) real
static real *dequantize_act(const FP8Tensor *q) {
    size_t n = (size_t)q->rows * q->cols;
    float *f = (float *)mallocCheck(n * sizeof(float));
    fp8_dequantize_cpu(f, q);
    real *x = (real *)mallocCheck(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = f[i];
    free(f);
    return x;
}
static real *fake_quant_act(const real *x, int N, int C, FP8Gran gran) {
    FP8Tensor q;
    fp8_tensor_alloc_cpu(&q, N, C, gran, FP8_E4M3, 1);
    quantize_act(&q, x);
    real *xq = dequantize_act(&q);
    fp8_tensor_free_cpu(&q);
    return xq;
}

// out = xq W^T + bias: xq the fake-quantized activations (freed here), the weight decoded from its codes
// row by row inside the product (matmul_forward_fp8: the dense product of the dequantized W, bit for bit)
static void fp8_linear(void *out, real *xq, const QWeight *w, const void *bias, int N) {
    OP(matmul_forward_fp8)((real *)out, xq, &w->q, (const real *)bias, N);
    free(xq);
}
static void cpu_linear_forward(void *out, const void *inp, const QWeight *w, const void *bias, int N) {
    int C = w->cols, OC = w->rows;
    if (w->gran == FP8_OFF) {
        OP(matmul_forward)((real *)out, (const real *)inp, (const real *)w->dense, (const real *)bias, N, C, OC);
        return;
    }
    fp8_linear(out, fake_quant_act((const real *)inp, N, C, w->gran), w, bias, N);
}
static void cpu_quantize_act(FP8Tensor *xq, const void *inp, int N) {
    if (xq->rows != N) die(BACKEND_NAME " backend: quantize_act: %d rows into an FP8 tensor of %d", N, xq->rows);
    quantize_act(xq, (const real *)inp);
}
static void cpu_linear_forward_q(void *out, const FP8Tensor *xq, const QWeight *w, const void *bias, int N) {
    linear_q_check(xq, w, N);
    fp8_linear(out, dequantize_act(xq), w, bias, N);
}

// dX = dY W with W dequantized (straight-through for the FP8 weights)
static void cpu_linear_backward(void *dinp, int accumulate, void *dw, void *dbias, const void *dout, const void *inp,
                                const QWeight *w, int N) {
    int C = w->cols, OC = w->rows;
    if (w->gran == FP8_OFF) {
        OP(matmul_backward)((real *)dinp, accumulate, (real *)dw, (real *)dbias, (const real *)dout,
                            (const real *)inp, (const real *)w->dense, N, C, OC);
        return;
    }
    if (dw) die(BACKEND_NAME " backend: weight gradients of FP8 weights are not supported (they are frozen)");
    if (dinp) OP(matmul_backward_fp8)((real *)dinp, accumulate, (const real *)dout, &w->q, N);
    if (dbias) OP(matmul_backward)(NULL, 0, NULL, (real *)dbias, (const real *)dout, NULL, NULL, N, C, OC);
}

// ---- Qwen3 MoE: the router's ops (ops_cpu.c), and each expert's SwiGLU on the rows routed to it ------------
static void w_moe_route(int32_t *idx, void *w, const void *logits, int N, int E, int K, int norm) {
    OP(moe_route)(idx, (real *)w, (const real *)logits, N, E, K, norm);
}
static void w_moe_route_backward(void *dlogits, const void *dw, const void *logits, const int32_t *idx, int N, int E,
                                 int K, int norm) {
    OP(moe_route_backward)((real *)dlogits, (const real *)dw, (const real *)logits, idx, N, E, K, norm);
}

// the (token, choice) pairs routed to expert e: their tokens rows[i] and slots n * K + j; returns how many
static int expert_rows(const int32_t *idx, int N, int K, int e, int32_t *rows, int32_t *slots) {
    int n = 0;
    for (int i = 0; i < N * K; i++)
        if (idx[i] == e) rows[n] = i / K, slots[n++] = i;
    return n;
}

// ---- LoRA on the experts (ExpertLoRA, backend.h): PEFT's layout, A (E r, in), B (out0 + out, r E) ----

// y (n, out) += scale * (x A_e^T) B_e^T over B's rows [o0, o0 + out): expert e's adapter on x (n, in)
static void expert_lora_forward(real *y, const real *x, int n, int in, int out, int o0, const ExpertLoRA *lr, int j,
                                int e, int E) {
    const real *A = (const real *)lr->A[j] + (size_t)e * lr->r * in, *B = (const real *)lr->B[j];
    int r = lr->r;
    double t[r];  // x A_e^T of one row
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < r; k++) {
            double s = 0;
            for (int c = 0; c < in; c++) s += (double)x[(size_t)i * in + c] * A[(size_t)k * in + c];
            t[k] = s;
        }
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int k = 0; k < r; k++) s += t[k] * B[(size_t)(o0 + o) * r * E + (size_t)k * E + e];
            y[(size_t)i * out + o] += (real)(lr->scale * s);
        }
    }
}

// expert_lora_forward's backward for dy (n, out): dx (n, in) += dt A_e with dt = scale dy B_e; dA_e += dt^T x,
// dB_e += scale dy^T (x A_e^T), accumulated
static void expert_lora_backward(real *dx, const real *dy, const real *x, int n, int in, int out, int o0,
                                 const ExpertLoRA *lr, int j, int e, int E) {
    const real *A = (const real *)lr->A[j] + (size_t)e * lr->r * in, *B = (const real *)lr->B[j];
    real *dA = lr->dA[j] ? (real *)lr->dA[j] + (size_t)e * lr->r * in : NULL, *dB = (real *)lr->dB[j];
    int r = lr->r;
    double t[r], dt[r];
    for (int i = 0; i < n; i++) {
        const real *xi = x + (size_t)i * in, *dyi = dy + (size_t)i * out;
        for (int k = 0; k < r; k++) {
            double s = 0, d = 0;
            for (int c = 0; c < in; c++) s += (double)xi[c] * A[(size_t)k * in + c];
            for (int o = 0; o < out; o++) d += (double)dyi[o] * B[(size_t)(o0 + o) * r * E + (size_t)k * E + e];
            t[k] = s, dt[k] = lr->scale * d;
        }
        for (int c = 0; c < in; c++) {
            double s = 0;
            for (int k = 0; k < r; k++) s += dt[k] * A[(size_t)k * in + c];
            dx[(size_t)i * in + c] += (real)s;
        }
        for (int k = 0; dA && k < r; k++)
            for (int c = 0; c < in; c++) dA[(size_t)k * in + c] += (real)(dt[k] * xi[c]);
        for (int o = 0; dB && o < out; o++)
            for (int k = 0; k < r; k++) dB[(size_t)(o0 + o) * r * E + (size_t)k * E + e] += (real)(lr->scale * dyi[o] * t[k]);
    }
}

// An expert at a time, in expert order, as transformers' loop over the experts (index_add_ of each
// one's weighted output): its rows gathered, gate and up, SwiGLU, down, each row added to its token
// times its routing weight
static void cpu_moe_experts_forward(void *out, void *gate, void *up, const void *x, const int32_t *idx, const void *w,
                                    const QWeight *experts, int N, int E, int K, const ExpertLoRA *lr) {
    int C = experts[0].cols, F = experts[0].rows, NK = N * K;
    int lgu = lr && lr->A[0], ldn = lr && lr->A[1];  // adapters on gate|up, on down
    real *o = (real *)out, *wt = (real *)w;
    int32_t *rows = (int32_t *)mallocCheck(2 * (size_t)NK * sizeof(int32_t)), *slots = rows + NK;
    real *xe = (real *)mallocCheck((size_t)NK * C * sizeof(real)), *y = (real *)mallocCheck((size_t)NK * C * sizeof(real));
    real *g = (real *)mallocCheck(3 * (size_t)NK * F * sizeof(real)), *u = g + (size_t)NK * F, *h = u + (size_t)NK * F;
    memset(o, 0, (size_t)N * C * sizeof(real));
    for (int e = 0; e < E; e++) {
        int n = expert_rows(idx, N, K, e, rows, slots);
        if (!n) continue;
        const QWeight *ew = &experts[3 * e];
        OP(gather_rows)(xe, (const real *)x, rows, n, C);
        cpu_linear_forward(g, xe, &ew[0], NULL, n);
        cpu_linear_forward(u, xe, &ew[1], NULL, n);
        if (lgu) expert_lora_forward(g, xe, n, C, F, 0, lr, 0, e, E), expert_lora_forward(u, xe, n, C, F, F, lr, 0, e, E);
        OP(swiglu_forward)(h, g, u, (size_t)n * F);
        cpu_linear_forward(y, h, &ew[2], NULL, n);
        if (ldn) expert_lora_forward(y, h, n, F, C, 0, lr, 1, e, E);
        for (int i = 0; i < n; i++) {
            for (int c = 0; c < C; c++) o[(size_t)rows[i] * C + c] += wt[slots[i]] * y[(size_t)i * C + c];
            if (gate) memcpy((real *)gate + (size_t)slots[i] * F, g + (size_t)i * F, F * sizeof(real));
            if (up) memcpy((real *)up + (size_t)slots[i] * F, u + (size_t)i * F, F * sizeof(real));
        }
    }
    free(rows), free(xe), free(y), free(g);
}

// The forward's expert loop in reverse, from its kept gate and up: an expert's output again (down of the
// SwiGLU) for the routing weight's gradient, then the rows' gradient times their weight through down,
// SwiGLU, gate and up, added to each row's token
static void cpu_moe_experts_backward(void *dx, void *dw, const QWeight *dexperts, const void *dout, const void *x,
                                     const int32_t *idx, const void *w, const void *gate, const void *up,
                                     const QWeight *experts, int N, int E, int K, const ExpertLoRA *lr) {
    int C = experts[0].cols, F = experts[0].rows, NK = N * K;
    int lgu = lr && lr->A[0], ldn = lr && lr->A[1];  // adapters on gate|up, on down
    real *d = (real *)dx, *wt = (real *)w, *dwt = (real *)dw;
    int32_t *rows = (int32_t *)mallocCheck(2 * (size_t)NK * sizeof(int32_t)), *slots = rows + NK;
    real *xe = (real *)mallocCheck(3 * (size_t)NK * C * sizeof(real)), *y = xe + (size_t)NK * C, *dy = y + (size_t)NK * C;
    real *g = (real *)mallocCheck(6 * (size_t)NK * F * sizeof(real)), *u = g + (size_t)NK * F, *h = u + (size_t)NK * F;
    real *dh = h + (size_t)NK * F, *dg = dh + (size_t)NK * F, *du = dg + (size_t)NK * F;
    memset(d, 0, (size_t)N * C * sizeof(real));
    for (int e = 0; e < E; e++) {
        int n = expert_rows(idx, N, K, e, rows, slots);
        if (!n) continue;
        const QWeight *ew = &experts[3 * e];
        OP(gather_rows)(xe, (const real *)x, rows, n, C);
        OP(gather_rows)(g, (const real *)gate, slots, n, F);
        OP(gather_rows)(u, (const real *)up, slots, n, F);
        OP(swiglu_forward)(h, g, u, (size_t)n * F);
        cpu_linear_forward(y, h, &ew[2], NULL, n);
        if (ldn) expert_lora_forward(y, h, n, F, C, 0, lr, 1, e, E);
        OP(gather_rows)(dy, (const real *)dout, rows, n, C);
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += (double)dy[(size_t)i * C + c] * y[(size_t)i * C + c];
            dwt[slots[i]] = (real)s;
            for (int c = 0; c < C; c++) dy[(size_t)i * C + c] *= wt[slots[i]];
        }
        cpu_linear_backward(dh, 0, dexperts ? dexperts[3 * e + 2].dense : NULL, NULL, dy, h, &ew[2], n);
        if (ldn) expert_lora_backward(dh, dy, h, n, F, C, 0, lr, 1, e, E);
        OP(swiglu_backward)(dg, du, dh, g, u, (size_t)n * F);
        cpu_linear_backward(y, 0, dexperts ? dexperts[3 * e].dense : NULL, NULL, dg, xe, &ew[0], n);  // y: dxe
        cpu_linear_backward(y, 1, dexperts ? dexperts[3 * e + 1].dense : NULL, NULL, du, xe, &ew[1], n);
        if (lgu)  // gate's rows of B, then up's: dA_e and dxe take both
            expert_lora_backward(y, dg, xe, n, C, F, 0, lr, 0, e, E), expert_lora_backward(y, du, xe, n, C, F, F, lr, 0, e, E);
        for (int i = 0; i < n; i++)
            for (int c = 0; c < C; c++) d[(size_t)rows[i] * C + c] += y[(size_t)i * C + c];
    }
    free(rows), free(xe), free(g);
}

// ---- LoRA: out += scale * (inp A^T) B^T, A and B act (here hp) -------------------

// the R columns of x (N rows of stride ld), contiguous
static real *lora_columns(const void *x, int ld, int N, int R) {
    real *c = (real *)callocCheck((size_t)N * R, sizeof(real));  // calloc: GCC cannot see the rows fill it
    for (int n = 0; n < N; n++) memcpy(c + (size_t)n * R, (const real *)x + (size_t)n * ld, R * sizeof(real));
    return c;
}
static void cpu_lora_down(void *ax, const void *inp, const void *A, int N, int C, int R) {
    OP(matmul_forward)((real *)ax, (const real *)inp, (const real *)A, NULL, N, C, R);
}
static void cpu_lora_up(void *out, const void *ax, int ld, const void *B, float scale, int N, int R, int OC) {
    real *x = lora_columns(ax, ld, N, R), *tmp = (real *)mallocCheck((size_t)N * OC * sizeof(real));
    OP(matmul_forward)(tmp, x, (const real *)B, NULL, N, R, OC);
    real *o = (real *)out;
    for (size_t i = 0; i < (size_t)N * OC; i++) o[i] += (real)(scale * (double)tmp[i]);
    free(x);
    free(tmp);
}

// act == hp on the CPU backends: the copies are the masters' values and nothing is rounded
static void cpu_lora_apply(void *out, const void *inp, const void *A, const void *B, float scale, int N, int C, int R,
                           int OC) {
    real *ax = (real *)mallocCheck((size_t)N * R * sizeof(real));
    cpu_lora_down(ax, inp, A, N, C, R);
    cpu_lora_up(out, ax, R, B, scale, N, R, OC);
    free(ax);
}
static void cpu_to_act(void *dst, const void *src, size_t n) { memcpy(dst, src, n * sizeof(real)); }

static void cpu_lora_up_backward(void *dax, void *dB, const void *dout, const void *ax, int ld, const void *B, float scale,
                                 int N, int R, int OC) {
    // the adapter's output is scale * ax B^T, so its upstream gradient is scale * dout
    size_t nd = (size_t)N * OC;
    real *sd = (real *)mallocCheck(nd * sizeof(real));
    for (size_t i = 0; i < nd; i++) sd[i] = (real)(scale * (double)((const real *)dout)[i]);
    real *x = lora_columns(ax, ld, N, R), *d = (real *)mallocCheck((size_t)N * R * sizeof(real));
    OP(matmul_backward)(d, 0, (real *)dB, NULL, sd, x, (const real *)B, N, R, OC);
    for (int n = 0; n < N; n++) memcpy((real *)dax + (size_t)n * ld, d + (size_t)n * R, R * sizeof(real));
    free(sd);
    free(x);
    free(d);
}
static void cpu_lora_down_backward(void *dinp, void *dA, const void *dax, const void *inp, const void *A, int N, int C,
                                   int R) {
    OP(matmul_backward)((real *)dinp, 1, (real *)dA, NULL, (const real *)dax, (const real *)inp, (const real *)A, N, C, R);
}

// ---- thin wrappers (the void* interface over the typed kernels) -------------------
// FP8 rows (--fp8_embeddings): each looked-up row dequantized, code * scale in fp32
static void w_embedding_forward(void *out, const int32_t *ids, const QWeight *wte, int N) {
    int C = wte->cols;
    if (wte->gran == FP8_OFF) {
        OP(embedding_forward)((real *)out, ids, (const real *)wte->dense, N, C);
        return;
    }
    float *row = (float *)mallocCheck(C * sizeof(float));
    for (int n = 0; n < N; n++) {
        fp8_dequantize_row_cpu(row, &wte->q, ids[n]);
        for (int c = 0; c < C; c++) ((real *)out)[(size_t)n * C + c] = row[c];
    }
    free(row);
}
static void w_embedding_backward(void *dwte, const int32_t *ids, const void *dout, int N, int C) {
    OP(embedding_backward)((real *)dwte, ids, (const real *)dout, N, C);
}
static void w_rmsnorm_forward(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps) {
    OP(rmsnorm_forward)((real *)out, (real *)rstd, (const real *)inp, (const real *)w, N, C, eps);
}
static void w_rmsnorm_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                               const void *rstd, int N, int C) {
    OP(rmsnorm_backward)((real *)dinp, (real *)dw, (const real *)dout, (const real *)inp, (const real *)w,
                         (const real *)rstd, N, C);
}
static void w_add_rmsnorm(void *x, void *out, void *rstd, const void *dx, const void *w, int N, int C, float eps,
                          int norm1p, FP8Tensor *outq) {
    OP(add)((real *)x, (const real *)x, (const real *)dx, (size_t)N * C);
    if (norm1p) OP(rmsnorm1p_forward)((real *)out, (real *)rstd, (const real *)x, (const real *)w, N, C, eps);
    else OP(rmsnorm_forward)((real *)out, (real *)rstd, (const real *)x, (const real *)w, N, C, eps);
    if (outq) quantize_act(outq, (const real *)out);
}
static void w_glu_gu(void *out, FP8Tensor *outq, const void *gu, int N, int FF, int gelu) {
    for (int n = 0; n < N; n++) {
        const real *g = (const real *)gu + (size_t)n * 2 * FF;
        if (gelu) OP(geglu_forward)((real *)out + (size_t)n * FF, g, g + FF, FF);
        else OP(swiglu_forward)((real *)out + (size_t)n * FF, g, g + FF, FF);
    }
    if (outq) quantize_act(outq, (const real *)out);
}
// the rows of q, k, v gathered from where they lie (memmove: qin may be q), then each head normed,
// q and k rotated, k and v written to the cache
static void cpu_qkv_rope_kv(void *q, void *k, const void *qin, const void *kin, const void *vin, int ldq, int ldkv,
                            const void *q_norm, const void *k_norm, int norm1p, const int32_t *pos, const void *inv_freq, void *kc,
                            void *vc, float *ks, float *vs, const int32_t *slots, int N, int NH, int KVH, int HD,
                            float eps) {
    size_t qw = (size_t)NH * HD, kw = (size_t)KVH * HD;
    real *v = (real *)mallocCheck((size_t)N * kw * sizeof(real)), *rstd = (real *)mallocCheck((size_t)N * NH * sizeof(real));
    for (int n = 0; n < N; n++) {
        memmove((real *)q + n * qw, (const real *)qin + (size_t)n * ldq, qw * sizeof(real));
        memmove((real *)k + n * kw, (const real *)kin + (size_t)n * ldkv, kw * sizeof(real));
        memcpy(v + n * kw, (const real *)vin + (size_t)n * ldkv, kw * sizeof(real));
    }
    if (q_norm && norm1p) OP(rmsnorm1p_forward)((real *)q, rstd, (const real *)q, (const real *)q_norm, N * NH, HD, eps);
    else if (q_norm) OP(rmsnorm_forward)((real *)q, rstd, (const real *)q, (const real *)q_norm, N * NH, HD, eps);
    if (k_norm && norm1p) OP(rmsnorm1p_forward)((real *)k, rstd, (const real *)k, (const real *)k_norm, N * KVH, HD, eps);
    else if (k_norm) OP(rmsnorm_forward)((real *)k, rstd, (const real *)k, (const real *)k_norm, N * KVH, HD, eps);
    OP(rope_forward)((real *)q, pos, (const real *)inv_freq, N, NH, HD, 0);
    OP(rope_forward)((real *)k, pos, (const real *)inv_freq, N, KVH, HD, 0);
    OP(kv_write)(kc, vc, ks, vs, (const real *)k, v, slots, N, KVH, HD);
    free(v);
    free(rstd);
}
static void w_rope_forward(void *x, const int32_t *pos, const void *inv_freq, int N, int H, int HD) {
    OP(rope_forward)((real *)x, pos, (const real *)inv_freq, N, H, HD, 0);
}
static void w_rope_backward(void *dx, const int32_t *pos, const void *inv_freq, int N, int H, int HD) {
    OP(rope_forward)((real *)dx, pos, (const real *)inv_freq, N, H, HD, 1);
}
static void w_attention_forward(void *out, void *lse, const void *q, const void *k, const void *v, int B, int T, int NH,
                                int KVH, int HD, double scale, int window) {
    OP(attention_forward)((real *)out, (real *)lse, (const real *)q, (const real *)k, (const real *)v, B, T, NH, KVH,
                          HD, scale, window);
}
static void w_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *lse,
                                 const void *q, const void *k, const void *v, int B, int T, int NH, int KVH, int HD,
                                 double scale, int window) {
    OP(attention_backward)((real *)dq, (real *)dk, (real *)dv, (const real *)dout, (const real *)out,
                           (const real *)lse, (const real *)q, (const real *)k, (const real *)v, B, T, NH, KVH, HD,
                           scale, window);
}
static void w_swiglu_forward(void *out, const void *gate, const void *up, size_t n) {
    OP(swiglu_forward)((real *)out, (const real *)gate, (const real *)up, n);
}
static void w_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    OP(swiglu_backward)((real *)dgate, (real *)dup, (const real *)dout, (const real *)gate, (const real *)up, n);
}
static void w_geglu_forward(void *out, const void *gate, const void *up, size_t n) {
    OP(geglu_forward)((real *)out, (const real *)gate, (const real *)up, n);
}
static void w_geglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    OP(geglu_backward)((real *)dgate, (real *)dup, (const real *)dout, (const real *)gate, (const real *)up, n);
}
static void w_rmsnorm1p_forward(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps) {
    OP(rmsnorm1p_forward)((real *)out, (real *)rstd, (const real *)inp, (const real *)w, N, C, eps);
}
static void w_rmsnorm1p_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                                 const void *rstd, int N, int C) {
    OP(rmsnorm1p_backward)((real *)dinp, (real *)dw, (const real *)dout, (const real *)inp, (const real *)w,
                           (const real *)rstd, N, C);
}
// the product in double, rounded once: for fp32, the correctly rounded fp32 product PyTorch forms
static void w_scale_act(void *x, size_t n, float s) {
    real *v = (real *)x;
    for (size_t i = 0; i < n; i++) v[i] = (real)(v[i] * (double)s);
}
static void w_add(void *out, const void *a, const void *b, size_t n) {
    OP(add)((real *)out, (const real *)a, (const real *)b, n);
}
static void w_gather_rows(void *out, const void *inp, const int32_t *idx, int n_idx, int C) {
    OP(gather_rows)((real *)out, (const real *)inp, idx, n_idx, C);
}
// The LM head through an FP8 weight (--fp8_embeddings) is fake quantization, as the linear layers: h
// quantized per row (token), W dequantized from its codes; then the dense reference. The backward
// differentiates through the same fake-quantized h and dequantized W (straight-through).
typedef struct {
    const real *h, *w;
    real *hq, *wd;  // owned copies when the head is FP8, else NULL
} HeadOperands;
static HeadOperands head_operands(const void *h, const QWeight *wlm, int N) {
    HeadOperands o = {(const real *)h, (const real *)wlm->dense, NULL, NULL};
    if (wlm->gran == FP8_OFF) return o;
    o.hq = fake_quant_act((const real *)h, N, wlm->cols, wlm->gran);
    o.wd = (real *)mallocCheck((size_t)wlm->rows * wlm->cols * sizeof(real));
    cpu_dequantize_weight(o.wd, wlm);
    o.h = o.hq, o.w = o.wd;
    return o;
}
static void head_operands_free(HeadOperands *o) {
    free(o->hq);
    free(o->wd);
}
static void w_logits_forward(void *logits, const void *h, const QWeight *wlm, int N) {
    HeadOperands o = head_operands(h, wlm, N);
    OP(matmul_forward)((real *)logits, o.h, o.w, NULL, N, wlm->cols, wlm->rows);
    head_operands_free(&o);
}
static void w_logprobs_forward(void *logp, void *lse, const void *h, const QWeight *wlm, const int32_t *targets,
                               float inv_temp, int N) {
    HeadOperands o = head_operands(h, wlm, N);
    OP(logprobs_forward)((real *)logp, (real *)lse, o.h, o.w, targets, inv_temp, N, wlm->cols, wlm->rows);
    head_operands_free(&o);
}
static void w_logprobs_backward(void *dh, void *dwlm, const void *dlogp, const void *lse, const void *h,
                                const QWeight *wlm, const int32_t *targets, float inv_temp, int N) {
    if (dwlm && wlm->gran != FP8_OFF) die(BACKEND_NAME " backend: an FP8 LM head is frozen (no gradient)");
    HeadOperands o = head_operands(h, wlm, N);
    OP(logprobs_backward)((real *)dh, (real *)dwlm, (const real *)dlogp, (const real *)lse, o.h, o.w, targets,
                          inv_temp, N, wlm->cols, wlm->rows);
    head_operands_free(&o);
}
static void w_kv_write(void *kc, void *vc, float *ks, float *vs, const void *k, const void *v, const int32_t *slots,
                       int N, int KVH, int HD) {
    OP(kv_write)(kc, vc, ks, vs, (const real *)k, (const real *)v, slots, N, KVH, HD);
}
static void w_attention_decode(void *out, const void *q, const void *kc, const void *vc, const float *ks,
                               const float *vs, const int32_t *block_table, const int32_t *seq_lens, int S, int NH,
                               int KVH, int HD, int BS, int MB, double scale, int window, FP8Tensor *outq) {
    OP(attention_decode)((real *)out, (const real *)q, kc, vc, ks, vs, block_table, seq_lens, S, NH, KVH, HD, BS, MB,
                         scale, window);
    if (outq) quantize_act(outq, (const real *)out);
}
static void w_sample(int32_t *tokens, void *logp, const void *logits, uint64_t *rng, int S, int V, float temperature,
                     int top_k, float top_p) {
    OP(sample)(tokens, (real *)logp, (const real *)logits, rng, S, V, temperature, top_k, top_p);
}
static void w_adamw(void *param, const void *grad, float gscale, void *m, void *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int step, void *act_out, const Bf16Moments *m16) {
    OP(adamw)((real *)param, (const real *)grad, gscale, (real *)m, (real *)v, n, lr, beta1, beta2, eps, weight_decay, step,
              m16 != NULL, m16 ? m16->seed : 0, m16 ? m16->i0 : 0);
    if (act_out) cpu_to_act(act_out, param, n);
}
static void w_adamw_bf16(void *param, const void *grad, void *m, void *v, size_t n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int step, uint64_t seed) {
    OP(adamw_bf16)((real *)param, (const real *)grad, (real *)m, (real *)v, n, lr, beta1, beta2, eps, weight_decay, step,
                   seed);
}
static double w_sumsq(const void *x, size_t n) { return OP(sumsq)((const real *)x, n); }

// replay: nothing to record on the CPU, the ops just run
static void cpu_replay(const void *key, size_t key_bytes, void (*run)(void *arg), void *arg) { run(arg); }
static void cpu_replay_forget(void) {}
static int cpu_replay_rows(int S) { return S; }
static void w_scale(void *x, size_t n, float s) { OP(scale)((real *)x, n, s); }
static void w_accumulate(void *dst, const void *src, size_t n) { OP(accumulate)((real *)dst, (const real *)src, n); }

static Backend be = {
    .name = BACKEND_NAME,
    .act = REAL_DT,
    .hp = REAL_DT,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .copy_2d = cpu_copy_2d,
    .upload_convert = cpu_upload_convert,
    .sync = cpu_sync,
    .mem_in_use = cpu_mem_in_use,
    .mem_capacity = cpu_mem_capacity,
    .quantize_weight = cpu_quantize_weight,
    .dequantize_weight = cpu_dequantize_weight,
    .embedding_forward = w_embedding_forward,
    .embedding_backward = w_embedding_backward,
    .rmsnorm_forward = w_rmsnorm_forward,
    .rmsnorm_backward = w_rmsnorm_backward,
    .linear_forward = cpu_linear_forward,
    .linear_forward_q = cpu_linear_forward_q,
    .quantize_act = cpu_quantize_act,
    .linear_backward = cpu_linear_backward,
    .lora_down = cpu_lora_down,
    .lora_up = cpu_lora_up,
    .lora_apply = cpu_lora_apply,
    .to_act = cpu_to_act,
    .lora_up_backward = cpu_lora_up_backward,
    .lora_down_backward = cpu_lora_down_backward,
    .rope_forward = w_rope_forward,
    .add_rmsnorm = w_add_rmsnorm,
    .glu_gu = w_glu_gu,
    .qkv_rope_kv = cpu_qkv_rope_kv,
    .rope_backward = w_rope_backward,
    .attention_forward = w_attention_forward,
    .attention_backward = w_attention_backward,
    .swiglu_forward = w_swiglu_forward,
    .swiglu_backward = w_swiglu_backward,
    .geglu_forward = w_geglu_forward,
    .geglu_backward = w_geglu_backward,
    .rmsnorm1p_forward = w_rmsnorm1p_forward,
    .rmsnorm1p_backward = w_rmsnorm1p_backward,
    .scale_act = w_scale_act,
    .add = w_add,
    .gather_rows = w_gather_rows,
    .moe_route = w_moe_route,
    .moe_route_backward = w_moe_route_backward,
    .moe_experts_forward = cpu_moe_experts_forward,
    .moe_experts_backward = cpu_moe_experts_backward,
    .logits_forward = w_logits_forward,
    .logprobs_forward = w_logprobs_forward,
    .logprobs_backward = w_logprobs_backward,
    .kv_write = w_kv_write,
    .attention_decode = w_attention_decode,
    .sample = w_sample,
    .adamw = w_adamw,
    .adamw_bf16 = w_adamw_bf16,
    .sumsq = w_sumsq,
    .scale = w_scale,
    .accumulate = w_accumulate,
    .replay = cpu_replay,
    .replay_forget = cpu_replay_forget,
    .replay_rows = cpu_replay_rows,
};

const Backend *BACKEND_FN(void) {
    if (!be.device_desc[0]) snprintf(be.device_desc, sizeof be.device_desc, "CPU reference backend (%s)", dtype_name(REAL_DT));
    return &be;
}
