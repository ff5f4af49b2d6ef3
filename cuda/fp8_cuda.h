// fp8_cuda.h: the plain-C API of the CUDA FP8 kernels (fp8.cu), for the CUDA
// backend and the GPU tests. Every pointer is device memory unless named _host.
// FP8Tensor (fp8.h) is used as is: on the device its data and scale point to
// device buffers, with exactly the scale layout fp8.h documents (1x128 activation
// scales token-contiguous, 128x128 weight scales with rows padded to 4), which is
// the layout cuBLASLt reads, so nothing is converted between quantize and GEMM.
//
//   fp8_cuda_init(stream)          once: cuBLASLt handle, 32 MiB workspace, plan cache;
//                                  prints one line if the GPU has no FP8 tensor cores
//   fp8_quantize_cuda(t, x, ...)   x (rows, cols) bf16 or f32 -> t (codes + scales), dynamic
//                                  (amax in the same pass); TENSOR takes two launches
//   fp8_dequantize_cuda(out, t)    -> bf16 or f32
//   fp8_gemm_cuda(y, x, w)         Y[M,N] = X[M,K] W[N,K]^T, bf16 or f32 out: cuBLASLt, or the
//                                  hand-written kernels where they are faster or cuBLASLt declines
//   bf16_gemm_cuda(...)            the same product in BF16 (cuBLASLt): baseline and fallback
//   fp8_linear_dx_cuda(...)        dX = dY W through a frozen FP8 weight (backward): FP8, or BF16
//   fp8_tensor_scale_cuda, fp8_quantize_scaled_cuda, fp8_quantize_t_cuda, fp8_quantize_both_cuda:
//                                  FP8 training's operands
#ifndef FP8_CUDA_H
#define FP8_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "fp8.h"
#include "core/common.h"

#ifdef __cplusplus
extern "C" {
#endif

// which implementation fp8_gemm_cuda uses (fp8.cu says in which order AUTO tries them)
typedef enum {
    FP8_GEMM_AUTO = 0,  // the fastest that runs the product on this GPU (the default)
    FP8_GEMM_CUBLASLT,  // cuBLASLt
    FP8_GEMM_MMA,       // the hand-written mma.sync kernel (sm_89+)
    FP8_GEMM_WGMMA,     // the Hopper TMA + wgmma kernel (sm_90a)
    FP8_GEMM_DECODE,    // the Hopper small-M split-K kernel (sm_90a)
    FP8_GEMM_BF16,      // both operands dequantized to BF16, one BF16 GEMM (a GPU without FP8 runs this)
} FP8GemmBackend;

// Initialise on the current device; stream is a cudaStream_t (NULL = default stream).
// Returns 1 if the GPU has FP8 tensor cores (compute capability >= 8.9), else 0 after
// printing one line saying the FP8 GEMM will use the BF16 path. Safe to call twice.
int fp8_cuda_init(void *stream);
void fp8_cuda_free(void);
// compute capability as 10 * major + minor (0 before init)
int fp8_cuda_cc(void);
// Forces one implementation for every later fp8_gemm_cuda (tests and benchmarks compare them;
// the program leaves AUTO); a forced one that cannot run a product dies saying why
void fp8_cuda_set_backend(FP8GemmBackend b);
// the implementation the last fp8_gemm_cuda call used: "cublaslt", "kernel-mma", "kernel-wgmma",
// "kernel-decode", "bf16-fallback"
const char *fp8_cuda_last_backend(void);
// bumped whenever a buffer of the FP8 context moves (scratch grown for a larger shape): a CUDA graph
// captured before the change must not be replayed (backend.h scratch_epoch)
unsigned fp8_cuda_scratch_epoch(void);

// ---- casts, quantize, dequantize --------------------------------------------
// q[i] = encode(x[i]) (fp32 in, no scaling): bit-identical to fp8_e4m3_encode/fp8_e5m2_encode
void fp8_cast_f32_cuda(uint8_t *q, const float *x, size_t n, FP8Format fmt);
// x[i] = decode(q[i]) as f32
void fp8_decode_f32_cuda(float *x, const uint8_t *q, size_t n, FP8Format fmt);
// t (allocated on the device by the caller: data rows*cols bytes, scale fp8_num_scales floats;
// shape, gran, fmt, block_rows set) = quantize(x). xdt: DT_BF16 or DT_F32. Same bytes as
// fp8_quantize_cpu on the same (f32-converted) input.
void fp8_quantize_cuda(FP8Tensor *t, const void *x, DType xdt, int pow2);
// out (rows, cols) = decode(q) * scale, odt DT_BF16 (rounded to nearest even) or DT_F32
void fp8_dequantize_cuda(void *out, DType odt, const FP8Tensor *t);

// ---- GEMM -------------------------------------------------------------------
// Y[M,N] (ydt DT_BF16 or DT_F32) = X[M,K] W[N,K]^T with the scales of both. X: activations
// (block_rows 1 for BLOCK), W: weight (block_rows 128); same granularity. With
// accumulate, Y += (beta = 1). Dies with a clear message on mismatched shapes.
void fp8_gemm_cuda(void *y, DType ydt, const FP8Tensor *x, const FP8Tensor *w, int accumulate);
// Y[M,N] = X[M,K] W[N,K]^T, X and W bf16 row-major, fp32 accumulation, ydt DT_BF16 or DT_F32
void bf16_gemm_cuda(void *y, DType ydt, const void *x, const void *w, int M, int N, int K, int accumulate);
// Whether backend b can run this product (AUTO: always), and if not why (why may be NULL)
int fp8_gemm_supported(FP8GemmBackend b, DType ydt, const FP8Tensor *x, const FP8Tensor *w, char *why, size_t why_cap);

// ---- backward through a frozen FP8 weight ------------------------------------
// dX[M,K] bf16 (= or += with accumulate) = dY[M,N] bf16 * W, W an FP8 weight (N, K). Where
// fp8_linear_dx_is_fp8(w): one FP8 product of dY, quantized per call (1x128 groups E4M3, or per
// tensor E5M2), and W^T (fp8_transpose_cuda into scratch: W's codes and tile scales transposed,
// its values exactly); else the BF16 reference: W dequantized to BF16 in scratch, one BF16 GEMM,
// the straight-through estimator of the CPU backend. fp8.cu says why and when each.
void fp8_linear_dx_cuda(void *dx, int accumulate, const void *dy, const FP8Tensor *w, int M);
typedef enum {
    FP8_DX_AUTO = 0,  // the FP8 product where it runs and pays (K >= 2048: fp8.cu), else BF16 (the default)
    FP8_DX_FP8,       // the FP8 product wherever it runs
    FP8_DX_BF16,      // the BF16 reference always
} FP8DxPath;
// how every later fp8_linear_dx_cuda multiplies (tests and benchmarks compare the paths)
void fp8_cuda_set_dx(FP8DxPath p);
// whether fp8_linear_dx_cuda takes the FP8 product for W under that setting: it runs for TENSOR or
// BLOCK scales, N % 16 == 0, K % 8 == 0, on FP8 tensor cores
int fp8_linear_dx_is_fp8(const FP8Tensor *w);
// t (cols, rows of w; w's granularity, format, block_rows; allocated) = w^T: the codes transposed,
// 128x128 tile scales transposed (padding 1), a per-tensor scale copied (unless t->scale is
// w->scale). Only TENSOR and BLOCK weights (a row scale of W is a column scale of W^T).
void fp8_transpose_cuda(FP8Tensor *t, const FP8Tensor *w);

// ---- FP8 training (fp8_train.cu) -------------------------------------------------
// TE's convention for a per-tensor scale: q = encode(x * mul), dequantized by 1 / mul.
// *mul = the current scale of x (n values): scaled_max / amax(x) in fp32 (FLT_MAX where that
// overflows; 1 for an amax of 0, inf or NaN); *amax = amax(x) as float bits (device scalars)
void fp8_tensor_scale_cuda(float *mul, unsigned *amax, const void *x, DType xdt, size_t n, float scaled_max);
// t (TENSOR, allocated) = encode(x * mul[0]), t->scale[0] = 1 / mul[0]; with amax (device, float
// bits), *amax = max(*amax, |x|), NaN above inf above numbers. Same bytes as fp8_quantize_scaled_cpu.
void fp8_quantize_scaled_cuda(FP8Tensor *t, const void *x, DType xdt, const float *mul, unsigned *amax);
// t (C, R) = the quantization of x^T, x (R, C) bf16: the weight gradient's operands, whose
// reduction runs over the tokens R. BLOCK, block_rows 1 (1x128 groups along R) or 128: same
// bytes as fp8_quantize_cuda of x transposed. TENSOR: encode(x * mul[0]) as above (amax recorded
// when given).
void fp8_quantize_t_cuda(FP8Tensor *t, const void *x, const float *mul, unsigned *amax);
// per tensor, x (R, C) bf16 in both layouts from one read of x: row (R, C) as fp8_quantize_scaled_cuda
// and t (C, R) as fp8_quantize_t_cuda write them (the same codes), the amax recorded once when given
void fp8_quantize_both_cuda(FP8Tensor *row, FP8Tensor *t, const void *x, const float *mul, unsigned *amax);
// the LM head's logits gradient in FP8 (fp8_train.cu): from the logits z (nr, V) f32 and per row dlogp,
// lse (f32) and the target (< 0: none, a zero row), dz = logprob_grad (cuda_common.cuh) rounded to bf16
// as logprobs_backward stores it, then encoded with mul[0] (as fp8_quantize_both_cuda would encode those
// bf16 values) into q (nr, V) and, transposed, columns col0 .. col0 + nr - 1 of qt (V, ld) (per tensor,
// allocated; both scales = 1 / mul[0]); the amax recorded when given. V a multiple of 8.
void fp8_head_dz_q_cuda(FP8Tensor *q, FP8Tensor *qt, int col0, const float *z, const float *dlogp, const float *lse,
                        const int32_t *targets, float inv_temp, const float *mul, unsigned *amax);
#ifdef __cplusplus
}
#endif
#endif  // FP8_CUDA_H
