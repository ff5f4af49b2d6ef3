// attention_cuda.h: the CUDA attention kernels of the CUDA backend (training: attention.cu; the
// rollout engine's KV cache and decode: attention_decode.cu), as plain C launchers. Every pointer is device memory; bf16 = act, float = hp.
// Shapes and semantics are those of backend.h's attention ops (causal, GQA: query
// head h reads key/value head h / (NH / KVH)); the CPU truth is ops_cpu.c.
//
//   attention_forward_cuda    fused flash attention (online softmax, never T x T):
//                             tensor cores (mma.sync bf16, fp32 accumulation) for
//                             HD in {16, 32, 64, 128} and 256 where shared memory allows
//                             (Hopper), a scalar fp32 kernel for other even HD;
//                             on Hopper (sm_90a) wgmma + TMA for HD 64 and 128 (backward too)
//   attention_backward_cuda   FlashAttention-2 backward, P recomputed from lse: one kernel
//                             owns dK/dV per key block (no atomics), a second owns dQ per
//                             query block; deterministic
//   attention_decode_cuda     one query token per sequence over a paged KV cache,
//                             split over the context (flash-decoding) and combined; fp32 on
//                             the CUDA cores, or mma.sync for head dims 64 and 128 (3-16 query heads a kv head)
//   kv_write_cuda             rows of k, v into their cache slots
#ifndef ATTENTION_CUDA_H
#define ATTENTION_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// out (B, T, NH, HD) bf16, lse (B, NH, T) f32 (natural log); q (B, T, NH, HD), k, v (B, T, KVH, HD) bf16
// sc: the softmax scale; window > 0: sliding-window attention (query t sees keys t - window < s <= t)
void attention_forward_cuda(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int NH,
                            int KVH, int HD, float sc, int window, void *stream);
// 0: attention_forward_cuda and attention_backward_cuda leave the Hopper kernels aside and run the
// mma.sync ones (the tests check both); 1 (the default): the Hopper kernels where they run
void attention_set_hopper(int on);
// floats of scratch attention_backward_cuda needs (the row dot products D = rowsum(dO * O))
size_t attention_backward_scratch(int B, int T, int NH);
// dq (B, T, NH, HD), dk, dv (B, T, KVH, HD) bf16, overwritten
void attention_backward_cuda(void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                             const void *q, const void *k, const void *v, int B, int T, int NH, int KVH, int HD,
                             float sc, int window, float *scratch, void *stream);
// floats of scratch attention_decode_cuda needs for these shapes (split partials)
size_t attention_decode_scratch(int S, int NH, int KVH, int HD, int BS, int MB);
// kc, vc bf16, or FP8 E4M3 codes when ks, vs (scales per (slot, head)) are given (backend.h). With oq,
// out's FP8 copy as well (E4M3, 1x128 groups: codes oq (S, NH HD), scales oqs (NH HD / 128, S)); HD % 128 == 0
void attention_decode_cuda(void *out, const void *q, const void *kc, const void *vc, const float *ks, const float *vs,
                           const int32_t *block_table, const int32_t *seq_lens, int S, int NH, int KVH, int HD, int BS,
                           int MB, float sc, int window, float *scratch, uint8_t *oq, float *oqs, void *stream);
// attention_decode_cuda's tensor-core kernel (head dims 64 and 128, up to 16 query heads a kv head): -1 (the
// default) where it is the faster, 0 never, 1 wherever it can run (the tests check both kernels)
void attention_decode_set_mma(int mode);
void kv_write_cuda(void *kc, void *vc, float *ks, float *vs, const void *k, const void *v, const int32_t *slots, int N,
                   int KVH, int HD, void *stream);

#ifdef __cplusplus
}
#endif

// an FP8 KV cache row (one token's HD values of one head) is quantized by one warp, fp8_quantize_warp
// (cuda_common.cuh) with this many 128-wide chunks: head_dim <= 256
#define KV_CHUNKS 2

#endif  // ATTENTION_CUDA_H
