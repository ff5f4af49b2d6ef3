// fp8.h: FP8 formats and scaled FP8 tensors, shared by the CPU reference
// (dev/fp8_cpu.c) and the CUDA kernels (fp8.cu).
//
// Conventions (read these once; everything FP8 in the project follows them):
// - An FP8 tensor is a row-major matrix (rows, cols) of 1-byte codes plus FP32
//   dequantization scales kept in the same struct: x ~= decode(q) * scale.
//   (This is the `weight_scale_inv` of Hugging Face / vLLM FP8 checkpoints.)
// - scale = amax / FP8_MAX (448 for E4M3, 57344 for E5M2); an all-zero group
//   gets scale 1, never 0 or NaN. With pow2 the scale is rounded UP to a power
//   of two (so amax/scale still fits the range and the scaling is exact).
// - Granularity (FP8Gran):
//     FP8_TENSOR  one scale                                 scale[1]
//     FP8_ROW     one per row (weights: per output channel; scale[rows]
//                 activations: per token)
//     FP8_BLOCK   weights: 128x128 tiles (block_rows = 128)   scale[ceil(rows/128)][ceil(cols/128)]
//                 activations: 1x128 groups (block_rows = 1)  scale[rows][ceil(cols/128)]
//   Edge tiles that are not full are scaled by their own amax.
// - Weights are stored as Hugging Face stores them: W is (out_features, in_features),
//   so a linear layer computes Y[M,N] = X[M,K] * W[N,K]^T and both operands are K-major.
#ifndef FP8_H
#define FP8_H

#include <stdint.h>
#include <string.h>

#include "common.h"

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

// number of scales for a granularity and shape
static inline size_t fp8_num_scales(FP8Gran g, int rows, int cols, int block_rows) {
    switch (g) {
        case FP8_TENSOR: return 1;
        case FP8_ROW: return (size_t)rows;
        case FP8_BLOCK:
            return (size_t)((rows + block_rows - 1) / block_rows) * (size_t)((cols + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE);
        default: return 0;
    }
}

// ----------------------------------------------------------------------------
// Host codecs (dev/fp8_cpu.c). Round to nearest even; beyond the range they
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
// CPU reference (dev/fp8_cpu.c): the numeric truth for every FP8 kernel.

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
