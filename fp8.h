// fp8.h: FP8 formats and scaled FP8 tensors, shared by the CPU reference
// (fp8_cpu.c) and the CUDA kernels (fp8.cu).
//
// Conventions (read these once; everything FP8 in the project follows them):
// - An FP8 tensor is a row-major matrix (rows, cols) of 1-byte codes plus FP32
//   dequantization scales kept in the same struct: x ~= decode(q) * scale.
//   (This is the `weight_scale_inv` of Hugging Face / vLLM FP8 checkpoints.)
// - scale = amax / FP8_MAX (448 for E4M3, 57344 for E5M2), computed in fp32; an
//   all-zero group gets scale 1, never 0 or NaN. With pow2 the scale is rounded UP
//   to a power of two (so amax/scale still fits the range and the scaling is exact).
//   Codes are q = encode(x / scale) with an fp32 division (CPU and GPU alike, so the
//   two produce the same bytes). amax ignores NaNs (fmaxf); a NaN element encodes to NaN.
// - Granularity (FP8Gran) and the ONE scale layout used on the host and on the GPU:
//     FP8_TENSOR  one scale                                     scale[0]
//     FP8_ROW     one per row (weights: per output channel;     scale[r]
//                 activations: per token)
//     FP8_BLOCK   weights, 128x128 tiles (block_rows = 128):
//                   (ceil(rows/128), ldk) row-major, ldk = ceil(cols/128) rounded up to 4;
//                   scale of element (r, c) at [(r/128) * ldk + c/128]. This is HF's
//                   weight_scale_inv (ceil(N/128), ceil(K/128)) with each row padded to a
//                   multiple of 4 floats, as cuBLASLt's BLK128x128_32F wants (16-byte rows).
//                 activations, 1x128 groups (block_rows = 1): TRANSPOSED, token-contiguous:
//                   (ceil(cols/128), rows) row-major: scale of element (r, c) at
//                   [(c/128) * rows + r]. This is the layout cuBLASLt's VEC128_32F reads
//                   (torch._scaled_mm's scale_a of shape (M, K/128) with strides (1, M)).
//   Padding scales are written as 1. Use fp8_scale_index() rather than indexing by hand.
//   Edge tiles that are not full are scaled by their own amax.
// - Weights are stored as Hugging Face stores them: W is (out_features, in_features),
//   so a linear layer computes Y[M,N] = X[M,K] * W[N,K]^T and both operands are K-major.
// - E5M2 (more range, less precision: gradients) uses the same API with fmt = FP8_E5M2.
#ifndef FP8_H
#define FP8_H

#include <stdint.h>
#include <string.h>

#include "core/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } FP8Format;
typedef enum { FP8_OFF = 0, FP8_TENSOR, FP8_ROW, FP8_BLOCK } FP8Gran;

#define FP8_E4M3_MAX 448.0f
#define FP8_E5M2_MAX 57344.0f
#define FP8_BLOCK_SIZE 128

static inline float fp8_max(FP8Format f) { return f == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX; }

// "block" | "row" | "tensor" | "off" (the names of --load-in-fp8 / --fp8); -1 if unknown
static inline int fp8_gran_parse(const char *s) {
    if (!strcmp(s, "off")) return FP8_OFF;
    if (!strcmp(s, "tensor")) return FP8_TENSOR;
    if (!strcmp(s, "row")) return FP8_ROW;
    if (!strcmp(s, "block")) return FP8_BLOCK;
    return -1;
}
static inline const char *fp8_gran_name(FP8Gran g) {
    static const char *n[] = {"off", "tensor", "row", "block"};
    return n[g];
}

typedef struct {
    uint8_t *data;   // (rows, cols) fp8 codes, row-major
    float *scale;    // dequantization scales, layout by granularity (above)
    int rows, cols;
    FP8Gran gran;    // TENSOR, ROW or BLOCK
    FP8Format fmt;
    int block_rows;  // BLOCK only: 128 for weights, 1 for activations (1x128 groups)
} FP8Tensor;

// leading dimension of a BLOCK tensor's scale matrix (see the layout above); 0 otherwise
static inline int fp8_scale_ld(FP8Gran g, int rows, int cols, int block_rows) {
    if (g != FP8_BLOCK) return 0;
    if (block_rows == 1) return rows;
    int kb = (cols + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
    return (kb + 3) / 4 * 4;
}

// number of scales (padding included) for a granularity and shape; BLOCK needs
// block_rows 1 (activations) or 128 (weights)
static inline size_t fp8_num_scales(FP8Gran g, int rows, int cols, int block_rows) {
    switch (g) {
        case FP8_TENSOR: return 1;
        case FP8_ROW: return (size_t)rows;
        case FP8_BLOCK: {
            size_t ld = (size_t)fp8_scale_ld(g, rows, cols, block_rows);
            if (block_rows == 1) return (size_t)((cols + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE) * ld;
            return (size_t)((rows + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE) * ld;
        }
        default: return 0;
    }
}

// index into t->scale of the scale that element (r, c) uses
static inline size_t fp8_scale_index(const FP8Tensor *t, int r, int c) {
    switch (t->gran) {
        case FP8_ROW: return (size_t)r;
        case FP8_BLOCK: {
            size_t ld = (size_t)fp8_scale_ld(FP8_BLOCK, t->rows, t->cols, t->block_rows);
            if (t->block_rows == 1) return (size_t)(c / FP8_BLOCK_SIZE) * ld + (size_t)r;
            return (size_t)(r / FP8_BLOCK_SIZE) * ld + (size_t)(c / FP8_BLOCK_SIZE);
        }
        default: return 0;
    }
}

// ----------------------------------------------------------------------------
// Host codecs (fp8_cpu.c). Round to nearest even; beyond the range they
// saturate to +-max (CUDA's satfinite); NaN maps to the format's NaN. On every
// float that PyTorch's .to(float8_*) maps to a finite value they are bit-identical
// to it (test/test_fp8.c checks all 65,536 BF16 patterns against a PyTorch table).
uint8_t fp8_e4m3_encode(float x);
float fp8_e4m3_decode(uint8_t q);
uint8_t fp8_e5m2_encode(float x);
float fp8_e5m2_decode(uint8_t q);
static inline uint8_t fp8_encode(FP8Format f, float x) { return f == FP8_E4M3 ? fp8_e4m3_encode(x) : fp8_e5m2_encode(x); }
static inline float fp8_decode(FP8Format f, uint8_t q) { return f == FP8_E4M3 ? fp8_e4m3_decode(q) : fp8_e5m2_decode(q); }

// ----------------------------------------------------------------------------
// CPU reference (fp8_cpu.c): the numeric truth for every FP8 kernel.

// scale for one group with absolute maximum amax (1 for amax == 0; pow2: rounded up to 2^k)
float fp8_scale_from_amax(float amax, FP8Format fmt, int pow2);

// Allocate data and scales on the host for a (rows, cols) tensor; free with fp8_tensor_free_cpu.
void fp8_tensor_alloc_cpu(FP8Tensor *t, int rows, int cols, FP8Gran gran, FP8Format fmt, int block_rows);
void fp8_tensor_free_cpu(FP8Tensor *t);

// Quantize x (rows, cols) fp32 into t (already allocated with its shape, gran, fmt, block_rows).
// The scale of each group comes from the group's amax (dynamic scaling).
void fp8_quantize_cpu(FP8Tensor *t, const float *x, int pow2);
// Dequantize t into x (rows, cols) fp32.
void fp8_dequantize_cpu(float *x, const FP8Tensor *t);
// Dequantize one row r of t into x (cols) fp32 (used by the CPU backend's linear layer).
void fp8_dequantize_row_cpu(float *x, const FP8Tensor *t, int r);

// Reference FP8 GEMM: Y[M,N] = X[M,K] * W[N,K]^T, fp32 accumulation. For BLOCK it
// accumulates each 128-wide K step in fp32 and promotes it with sx * sw, as
// DeepSeek-V3 does; for ROW/TENSOR the scales are applied once at the end.
// X must be an activation tensor (block_rows 1) and W a weight (block_rows 128)
// of the same granularity (TENSOR/TENSOR, ROW/ROW or BLOCK/BLOCK).
void fp8_gemm_cpu(float *y, const FP8Tensor *x, const FP8Tensor *w);

// Signal-to-quantization-noise ratio of t against x in dB: 10 log10(sum x^2 / sum (x - deq(t))^2)
double fp8_sqnr_db(const float *x, const FP8Tensor *t);

#ifdef __cplusplus
}
#endif
#endif  // FP8_H
