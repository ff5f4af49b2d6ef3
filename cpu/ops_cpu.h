// ops_cpu.h: the CPU reference kernels, the numeric truth of every op in
// backend.h. Plain C + OpenMP (parallel over independent rows only, never over
// a reduction, so results do not depend on the thread count, which follows the cores this
// process gets: cpu_threads_update).
//
// ops_cpu.c is compiled twice: with real = float (names end in _cpu, the
// "cpu" backend and the reference the CUDA tests compare with) and with
// real = double (names end in _cpu64, the "cpu64" backend used for
// finite-difference gradient checks). Shapes follow backend.h.
#ifndef OPS_CPU_H
#define OPS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "fp8.h"  // FP8Tensor

#ifdef __cplusplus
extern "C" {
#endif

#define OPS_CPU_DECLARE(real, S)                                                                                     \
    void embedding_forward##S(real *out, const int32_t *ids, const real *wte, int N, int C);                        \
    void embedding_backward##S(real *dwte, const int32_t *ids, const real *dout, int N, int C);                     \
    void rmsnorm_forward##S(real *out, real *rstd, const real *inp, const real *w, int N, int C, float eps);          \
    void rmsnorm_backward##S(real *dinp, real *dw, const real *dout, const real *inp, const real *w,                 \
                             const real *rstd, int N, int C);                                                        \
    /* out (N, OC) = inp (N, C) W (OC, C)^T + bias (OC, may be NULL) */                                              \
    void matmul_forward##S(real *out, const real *inp, const real *W, const real *bias, int N, int C, int OC);       \
    /* dinp (N, C) = or += dout W ; dW (OC, C) += dout^T inp ; dbias += sum dout; NULL skips */                      \
    void matmul_backward##S(real *dinp, int accumulate, real *dW, real *dbias, const real *dout, const real *inp,   \
                            const real *W, int N, int C, int OC);                                                    \
    /* the same with W (OC, C) as FP8 codes and scales, decoded as fp8_dequantize_cpu does, bit for bit */          \
    void matmul_forward_fp8##S(real *out, const real *inp, const FP8Tensor *W, const real *bias, int N);            \
    void matmul_backward_fp8##S(real *dinp, int accumulate, const real *dout, const FP8Tensor *W, int N);           \
    void rope_forward##S(real *x, const int32_t *pos, const real *inv_freq, int N, int H, int HD, int inverse);     \
    /* scale: the softmax scale; window > 0: query t sees keys t - window < s <= t (backend.h) */                  \
    void attention_forward##S(real *out, real *lse, const real *q, const real *k, const real *v, int B, int T,      \
                              int NH, int KVH, int HD, double scale, int window);                                     \
    void attention_backward##S(real *dq, real *dk, real *dv, const real *dout, const real *out, const real *lse,    \
                               const real *q, const real *k, const real *v, int B, int T, int NH, int KVH, int HD,  \
                               double scale, int window);                                                             \
    void swiglu_forward##S(real *out, const real *gate, const real *up, size_t n);                                   \
    void swiglu_backward##S(real *dgate, real *dup, const real *dout, const real *gate, const real *up, size_t n);   \
    void geglu_forward##S(real *out, const real *gate, const real *up, size_t n);                                    \
    void geglu_backward##S(real *dgate, real *dup, const real *dout, const real *gate, const real *up, size_t n);    \
    void rmsnorm1p_forward##S(real *out, real *rstd, const real *inp, const real *w, int N, int C, float eps);        \
    void rmsnorm1p_backward##S(real *dinp, real *dw, const real *dout, const real *inp, const real *w,               \
                               const real *rstd, int N, int C);                                                      \
    void add##S(real *out, const real *a, const real *b, size_t n);                                                  \
    void gather_rows##S(real *out, const real *inp, const int32_t *idx, int n_idx, int C);                          \
    /* Qwen3 MoE's router and its backward (backend.h moe_route, moe_route_backward) */                             \
    void moe_route##S(int32_t *idx, real *w, const real *logits, int N, int E, int K, int norm);                     \
    void moe_route_backward##S(real *dlogits, const real *dw, const real *logits, const int32_t *idx, int N, int E,  \
                               int K, int norm);                                                                     \
    void logprobs_forward##S(real *logp, real *lse, const real *h, const real *wlm, const int32_t *targets,         \
                             float inv_temp, int N, int C, int V);                                                   \
    void logprobs_backward##S(real *dh, real *dwlm, const real *dlogp, const real *lse, const real *h,             \
                              const real *wlm,                                                                       \
                              const int32_t *targets, float inv_temp, int N, int C, int V);                          \
    void kv_write##S(void *kc, void *vc, float *ks, float *vs, const real *k, const real *v, const int32_t *slots,   \
                     int N, int KVH, int HD);                                                                        \
    void attention_decode##S(real *out, const real *q, const void *kc, const void *vc, const float *ks,             \
                             const float *vs, const int32_t *block_table, const int32_t *seq_lens, int S_, int NH,  \
                             int KVH, int HD, int BS, int MB, double scale, int window);                              \
    void sample##S(int32_t *tokens, real *logp, const real *logits, uint64_t *rng, int S_, int V,                    \
                   float temperature, int top_k, float top_p);                                                       \
    void adamw##S(real *param, const real *grad, float gscale, real *m, real *v, size_t n, float lr, float beta1,   \
                  float beta2, float eps, float weight_decay, int step, int m16, uint64_t seed, size_t i0);        \
    void adamw_bf16##S(real *param, const real *grad, real *m, real *v, size_t n, float lr, float beta1, float beta2, \
                       float eps, float weight_decay, int step, uint64_t seed);                                       \
    double sumsq##S(const real *x, size_t n);                                                                        \
    void scale##S(real *x, size_t n, float s);                                                                      \
    void accumulate##S(real *dst, const real *src, size_t n);

OPS_CPU_DECLARE(float, _cpu)
OPS_CPU_DECLARE(double, _cpu64)

// The OpenMP team size of the kernels above, matched every 200 ms to the cores other processes
// leave idle (1 up to OMP_NUM_THREADS or the cores this process may use); the larger kernels call
// it first. Returns the team size now.
int cpu_threads_update(void);

#ifdef __cplusplus
}
#endif
#endif  // OPS_CPU_H
