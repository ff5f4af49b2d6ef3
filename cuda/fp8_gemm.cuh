// fp8_gemm.cuh: what the FP8 GEMM's CUDA files share (fp8.cu, fp8_hopper.cu, dev/cuda/).
//   defines: GemmArgs (the operands of Y[M,N] = X[M,K] W[N,K]^T with their scales, as fp8.h lays
//   them out), sx_at / sw_at (the scale an element uses), store_out (Y = or Y +=), and the
//   interface of the Hopper kernels in fp8_hopper.cu.
// For BLOCK scaling a kernel keeps a partial sum per 128-wide K step and promotes it into its fp32
// accumulator with sx[m, kb] * sw[n / 128, kb] (DeepSeek-V3); for TENSOR / ROW the scales
// multiply once, at the end (they do not change along K).
#ifndef FP8_GEMM_CUH
#define FP8_GEMM_CUH

#include "cuda/cuda_common.cuh"

typedef struct {
    const uint8_t *x, *w;    // X (M, K), W (N, K) FP8 codes, row-major (both K-major)
    const float *sx, *sw;    // their scales (fp8.h)
    int M, N, K, gran, fx, fw;
    int ldsw;                // BLOCK: the row length of W's scale matrix (fp8_scale_ld)
    int accumulate;          // Y += (else Y =)
} GemmArgs;

__device__ __forceinline__ float sx_at(const GemmArgs &a, int m, int kb) {
    return a.gran == FP8_BLOCK ? a.sx[(size_t)kb * a.M + m] : a.gran == FP8_ROW ? a.sx[m] : a.sx[0];
}
__device__ __forceinline__ float sw_at(const GemmArgs &a, int n, int kb) {
    return a.gran == FP8_BLOCK ? a.sw[(size_t)(n / FP8_BLOCK_SIZE) * a.ldsw + kb] : a.gran == FP8_ROW ? a.sw[n] : a.sw[0];
}
// the arguments of Y (+)= X W^T (X activations, W a weight of the same granularity)
static inline GemmArgs gemm_args(const FP8Tensor *x, const FP8Tensor *w, int accumulate) {
    GemmArgs a;
    a.x = x->data; a.w = w->data; a.sx = x->scale; a.sw = w->scale;
    a.M = x->rows; a.N = w->rows; a.K = x->cols;
    a.gran = x->gran; a.fx = x->fmt; a.fw = w->fmt;
    a.ldsw = fp8_scale_ld(w->gran, w->rows, w->cols, w->block_rows);
    a.accumulate = accumulate;
    return a;
}
template <typename T>
__device__ __forceinline__ void store_out(T *y, const GemmArgs &a, int m, int n, float v) {
    size_t i = (size_t)m * a.N + n;
    if (a.accumulate) v += load_f(y, i);
    store_f(y, i, v);
}

// ---- the Hopper kernels (fp8_hopper.cu; sm_90a, E4M3 x E4M3) ----
// 1 if this GPU and build run them (an sm_90a GPU, code built for sm_90a, the driver's tensor-map
// encoder); else 0 after printing why once. Called once by fp8_cuda_init.
int hopper_probe(int cc);
// whether the wgmma kernel (decode = 0) or the decode kernel (1) can run this product (E4M3 x E4M3,
// K % 16 == 0, 16-byte aligned operands; the decode kernel: K <= 32768); if not, why
int hopper_supported(const GemmArgs &a, int decode, char *why, size_t cap);
// AUTO's rules, from the measurements (fp8_hopper.cu says which): the wgmma kernel beats cuBLASLt /
// the decode kernel beats cuBLASLt on this shape of an sm_count-SM GPU
int hopper_wgmma_preferred(int M, int N, int K, int sms);
int hopper_decode_preferred(int M, int N, int K);
// Y (ydt bf16 or f32) = or += the product, on the stream (hopper_supported must hold)
void hopper_wgmma_gemm(void *y, DType ydt, const GemmArgs &a, int sms, cudaStream_t stream);
void hopper_decode_gemm(void *y, DType ydt, const GemmArgs &a, cudaStream_t stream);

#endif  // FP8_GEMM_CUH
