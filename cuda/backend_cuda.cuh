// backend_cuda.cuh: what the CUDA backend's files share (backend_cuda.cu, ops_cuda.cu, sample.cu, moe.cu):
// its stream, its scratch buffers, and the ops whose kernels live outside backend_cuda.cu. Each op
// is the backend.h op of the same name (its shapes and semantics are there), on bf16 activations
// and f32 high-precision values.
#ifndef BACKEND_CUDA_CUH
#define BACKEND_CUDA_CUH

#include <cublas_v2.h>

#include "core/backend.h"
#include "cuda/cuda_common.cuh"

// the scratch buffers: one per role, each only grows (moving it bumps the backend's epoch, which
// drops its recorded decode steps)
enum {
    SC_STAGE,    // host upload staging (raw source bytes)
    SC_STAGE2,   // converted staging (f32 copy of an f16/f64 weight)
    SC_ACT_Q,    // FP8 codes of the activations of a linear layer
    SC_ACT_S,    // their scales
    SC_F32,      // fp32 (rows, OC) of a linear with bias; the logits chunk of logprobs
    SC_BF16,     // bf16 dz chunk of logprobs_backward
    SC_HEAD_W,   // an FP8 LM head's backward: bf16 rows of W dequantized, a chunk of the vocabulary
    SC_HEAD_DH,  // its fp32 dh, summed over the chunks
    SC_LORA_X,   // bf16 ax (N, R) (lora_apply)
    SC_RED,      // reduction partials
    SC_ATT,      // attention backward D / decode partials
    SC_SORT,     // sampling: sorted keys, ids, CUB temp
    SC_SMALL,    // per-row sampling state
    SC_TRAIN_W, SC_TRAIN_W_S,      // FP8 training: W's (or W^T's) codes and scales,
    SC_TRAIN_DY, SC_TRAIN_DY_S,    // dY's,
    SC_TRAIN_DYT, SC_TRAIN_DYT_S,  // dY^T's,
    SC_TRAIN_XT, SC_TRAIN_XT_S,    // X^T's (fp8_train.cu)
    SC_HEAD_WT,                    // an LM head trained in FP8: W^T's codes (fp8_train.cu)
    SC_MOE_INT,                    // Qwen3 MoE (moe.cu): the slots' groups by expert (counts, offsets, perm),
    SC_MOE_SX, SC_MOE_SH,          // the FP8 scales of the experts' inputs and of the SwiGLU's outputs,
    SC_MOE_GU, SC_MOE_H,           // gate|up (the decode step's) or their gradients, the SwiGLU's outputs (or dh),
    SC_MOE_Y,                      // each slot's expert output (or its gradients, dy then dx)
    SC_COUNT
};
cudaStream_t cu_stream(void);              // every op runs on it
void *cu_scratch(int which, size_t bytes);  // scratch buffer `which` (SC_*), at least bytes long

// ---- ops_cuda.cu ----
void cu_rmsnorm_forward(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps);
void cu_rmsnorm_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w, const void *rstd,
                         int N, int C);
void cu_rope_forward(void *x, const int32_t *pos, const void *inv_freq, int N, int H, int HD);
void cu_rope_backward(void *dx, const int32_t *pos, const void *inv_freq, int N, int H, int HD);
void cu_add_rmsnorm(void *x, void *out, void *rstd, const void *dx, const void *w, int N, int C, float eps, int norm1p,
                    FP8Tensor *outq);
void cu_qkv_rope_kv(void *q, void *k, const void *qin, const void *kin, const void *vin, int ldq, int ldkv,
                    const void *q_norm, const void *k_norm, int norm1p, const int32_t *pos, const void *inv_freq, void *kc,
                    void *vc, float *ks, float *vs, const int32_t *slots, int N, int NH, int KVH, int HD, float eps);
void cu_swiglu_forward(void *out, const void *gate, const void *up, size_t n);
void cu_glu_gu(void *out, FP8Tensor *outq, const void *gu, int N, int FF, int gelu);
void cu_glu_forward_q(void *out, FP8Tensor *outq, const void *gate, const void *up, int N, int FF, int gelu);
// dies in one line unless outq (backend.h) is a copy the fused kernels can write for (N, C) act
void cu_check_outq(const FP8Tensor *outq, int N, int C, const char *op);
void cu_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n);
void cu_add(void *out, const void *a, const void *b, size_t n);
void cu_rmsnorm1p_forward(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps);
void cu_rmsnorm1p_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w, const void *rstd,
                           int N, int C);
void cu_geglu_forward(void *out, const void *gate, const void *up, size_t n);
void cu_geglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n);
void cu_scale_act(void *x, size_t n, float s);
void cu_gather_rows(void *out, const void *inp, const int32_t *idx, int n_idx, int C);
void cu_embedding_forward(void *out, const int32_t *ids, const QWeight *wte, int N);
void cu_embedding_backward(void *dwte, const int32_t *ids, const void *dout, int N, int C);
// dst (C) f32 += the column sums of a (N, C) bf16, in a fixed order (a bias's gradient)
void cu_colsum(float *dst, const bf16 *a, int N, int C);

// dinp (n) bf16 = bf16(dinp + y), summed in fp32 (backend_cuda.cu)

// FP8 training (fp8_train.cu): rmsnorm_forward (norm1p: rmsnorm1p_forward) and swiglu / geglu_forward
// with their outputs written only as E4M3 codes q of the per-tensor scale *mul (scale_inv = 1 / *mul),
// the bf16 values' amax recorded; 0 where the shapes or alignment do not allow (nothing done)
int cu_rmsnorm_q(uint8_t *q, float *scale_inv, unsigned *amax, const float *mul, void *rstd, const void *inp, const void *w,
                 int N, int C, float eps, int norm1p);
int cu_glu_q(uint8_t *q, float *scale_inv, unsigned *amax, const float *mul, const void *gate, const void *up, size_t n,
             int gelu);

// ---- fp8_train.cu ----
FP8Train *cu_fp8_train_new(const QWeight *w, const FP8Recipe *r, FP8Train *leader, char *why, size_t why_cap);
void cu_fp8_train_free(FP8Train *t);
void cu_fp8_train_step(FP8Train *const *t, int n, AmaxReduce reduce, void *ctx, long *overflows);
size_t cu_fp8_train_state(FP8Train *const *t, int n, float *buf, int set);
int fp8_train_keeps(const FP8Train *t);  // 1: its recipe scales per tensor, so its input codes can be kept
// linear_forward / linear_backward of a weight with an FP8Train (out: yt DT_BF16 or DT_F32); keep /
// kept: the input's FP8 codes kept from the forward for the backward (backend.h fp8_train_forward_keep)
void cu_fp8_train_forward(void *out, DType yt, const void *inp, const QWeight *w, int N, FP8Tensor *keep);
void cu_fp8_train_backward(void *dinp, int accumulate, float *dw, const void *dout, const void *inp, const FP8Tensor *kept,
                           const QWeight *w, int N);
void cu_fp8_train_forward_kept(void *out, DType yt, const FP8Tensor *xq, const QWeight *w, int N);
int cu_fp8_train_norm_q(FP8Tensor *keep, void *rstd, const void *inp, const void *w, int N, int C, float eps, int norm1p,
                        const QWeight *consumer);
int cu_fp8_train_glu_q(FP8Tensor *keep, const void *gate, const void *up, int N, int FF, int gelu, const QWeight *consumer);
int cu_fp8_train_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, int N, int FF,
                                 const QWeight *wg, const QWeight *wu);
// The LM head trained in FP8 (--fp8_lm_head): w (V, C) with an FP8Train. cu_fp8_head_weight: W's codes
// (wq, (V, C)) and, with wt, W^T's ((C, V), from the same read), once per call of the head's ops.
// cu_fp8_head_logits: z (nr, V) f32 = h (nr, C) W^T. cu_fp8_head_chunks: logprobs_chunks (backend_cuda.cu)
// for such a head, over chunks of CH rows with z (CH, V) f32 their logits' memory: logp and lse (when logp
// is not NULL, by rows, which launches logprobs_rows_kernel), dh (N, C) bf16 and, with dw, dw (V, C) f32 +=.
typedef void (*HeadRows)(float *logp, float *lse, const float *z, const int32_t *targets, float inv_temp, int nr, int V);
void cu_fp8_head_weight(const QWeight *w, FP8Tensor *wq, FP8Tensor *wt);
void cu_fp8_head_logits(float *z, const void *h, const QWeight *w, const FP8Tensor *wq, int nr);
void cu_fp8_head_chunks(float *logp, float *lse, void *dh, float *dw, const float *dlogp, const void *h, const QWeight *w,
                        const int32_t *targets, float inv_temp, int N, int CH, float *z, HeadRows rows);

// ---- moe.cu: Qwen3 MoE's router and experts (backend.h moe_*) ----
void cu_moe_route(int32_t *idx, void *w, const void *logits, int N, int E, int K, int norm);
void cu_moe_route_backward(void *dlogits, const void *dw, const void *logits, const int32_t *idx, int N, int E, int K,
                           int norm);
void cu_moe_experts_forward(void *out, void *gate, void *up, const void *x, const int32_t *idx, const void *w,
                            const QWeight *experts, int N, int E, int K, const ExpertLoRA *lora);
void cu_moe_experts_backward(void *dx, void *dw, const QWeight *dexperts, const void *dout, const void *x,
                             const int32_t *idx, const void *w, const void *gate, const void *up, const QWeight *experts,
                             int N, int E, int K, const ExpertLoRA *lora);

// ---- sample.cu ----
void cu_sample(int32_t *tokens, void *logp, const void *logits, uint64_t *rng, int S, int V, float temperature,
               int top_k, float top_p);

#endif  // BACKEND_CUDA_CUH
