// fp8.cu: the FP8 kernels on the GPU, behind fp8_cuda.h.
//   defines: fp8_cuda_init / free, the casts, fp8_quantize_cuda (tensor, row, 1x128 and 128x128
//   granularity, dynamic amax scales, optional powers of two), fp8_dequantize_cuda, fp8_gemm_cuda
//   (cuBLASLt, or the hand-written kernels, chosen per shape), bf16_gemm_cuda, fp8_linear_dx_cuda.
// Numerics follow fp8.h exactly (scale = amax / max in fp32, codes = encode(x / scale) with an IEEE
// division, saturating round-to-nearest-even), so the bytes equal fp8_cpu.c's; the GEMMs agree with
// fp8_gemm_cpu within tolerances derived from the format (test/gpu_fp8.cu).
// The hand-written GEMM here is the portable one, mma.sync on FP8 tensor cores (sm_89 and up: what an
// RTX 40/50 runs for the row and block scaling cuBLASLt offers only on sm_90+); the Hopper kernels
// AUTO runs where they beat cuBLASLt are in fp8_hopper.cu; the versions that led to them, in dev/cuda/.
// Needs: CUDA >= 12.9 (cuBLASLt's VEC128 / BLK128x128 scale modes), cuBLASLt.
#include <cublasLt.h>
#include <type_traits>

#include "cuda/cuda_common.cuh"
#include "cuda/fp8_cuda.h"
#include "cuda/fp8_gemm.cuh"

#if CUBLAS_VERSION < 120900
#error "fp8.cu needs cuBLAS >= 12.9 (CUDA 12.9) for VEC128_32F / BLK128x128_32F block scaling"
#endif

// ----------------------------------------------------------------------------
// the context: one per process, used from one stream

#define PLAN_CACHE 64
typedef struct {
    // key
    int used, M, N, K, kind;  // kind: 0 fp8 (granularity gran), 1 bf16
    int gran, fx, fw, ydt, transa, align_a, align_b, align_y;  // gran | 16: BLOCK with W in 1x128 groups too;
                                                               // ydt | YDT_SUM: added to a bf16 output (below)
    // value
    int ok;
    char why[160];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ly;
    cublasLtMatmulAlgo_t algo;  // the heuristic's first choice
} LtPlan;

static struct {
    int init, cc, has_fp8;
    int sms;     // multiprocessors
    int hopper;  // 1 if the Hopper kernels can run (sm_90a GPU and build)
    FP8GemmBackend backend;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    float *amax;        // (1) scratch for per-tensor amax
    void *scratch[4];   // grown on demand: 0, 1 bf16 (dequantized operands); 2, 3 FP8 (dX's W^T, dY)
    size_t scratch_bytes[4];
    FP8DxPath dx;       // how fp8_linear_dx_cuda multiplies (fp8_cuda_set_dx)
    LtPlan plans[PLAN_CACHE];
    int next_plan;
    const char *last;
    unsigned epoch;     // bumped when scratch moves
} ctx;

int fp8_cuda_init(void *stream) {
    if (ctx.init) { ctx.stream = (cudaStream_t)stream; return ctx.has_fp8; }
    int dev;
    cudaCheck(cudaGetDevice(&dev));
    cudaDeviceProp p;
    cudaCheck(cudaGetDeviceProperties(&p, dev));
    ctx.cc = p.major * 10 + p.minor;
    ctx.has_fp8 = ctx.cc >= 89;
    ctx.sms = p.multiProcessorCount;
    if (!ctx.has_fp8)
        fprintf(stderr, "fp8: %s (compute capability %d.%d) has no FP8 tensor cores (needs 8.9+: RTX 40, H100, "
                        "B200); FP8 weights are dequantized to BF16 for each GEMM\n", p.name, p.major, p.minor);
    ctx.stream = (cudaStream_t)stream;
    cublasCheck(cublasLtCreate(&ctx.lt));
    ctx.workspace_bytes = 32u << 20;
    cudaCheck(cudaMalloc(&ctx.workspace, ctx.workspace_bytes));
    cudaCheck(cudaMalloc(&ctx.amax, sizeof(float)));
    ctx.backend = FP8_GEMM_AUTO;
    ctx.last = "none";
    ctx.init = 1;
    ctx.hopper = hopper_probe(ctx.cc);
    return ctx.has_fp8;
}

void fp8_cuda_free(void) {
    if (!ctx.init) return;
    for (int i = 0; i < PLAN_CACHE; i++) {
        LtPlan *pl = &ctx.plans[i];
        if (!pl->used) continue;
        cublasLtMatmulDescDestroy(pl->desc);
        cublasLtMatrixLayoutDestroy(pl->la);
        cublasLtMatrixLayoutDestroy(pl->lb);
        cublasLtMatrixLayoutDestroy(pl->ly);
    }
    cudaFree(ctx.workspace);
    cudaFree(ctx.amax);
    for (int i = 0; i < 4; i++) cudaFree(ctx.scratch[i]);
    cublasLtDestroy(ctx.lt);
    memset(&ctx, 0, sizeof ctx);
}

static void need_init(void) {
    if (!ctx.init) die("fp8 CUDA: call fp8_cuda_init() first");
}
int fp8_cuda_cc(void) { return ctx.cc; }
void fp8_cuda_set_backend(FP8GemmBackend b) { ctx.backend = b; }
void fp8_cuda_set_dx(FP8DxPath p) { ctx.dx = p; }
const char *fp8_cuda_last_backend(void) { return ctx.last; }
unsigned fp8_cuda_scratch_epoch(void) { return ctx.epoch; }

static void *scratch(int i, size_t bytes) {
    if (ctx.scratch_bytes[i] < bytes) {
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        cudaFree(ctx.scratch[i]);
        cudaCheck(cudaMalloc(&ctx.scratch[i], bytes));
        ctx.scratch_bytes[i] = bytes;
        ctx.epoch++;
    }
    return ctx.scratch[i];
}

// ----------------------------------------------------------------------------
// casts

__global__ void cast_kernel(uint8_t *q, const float *x, size_t n, int fmt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q[i] = fp8_encode_dev(x[i], fmt);
}
__global__ void decode_kernel(float *x, const uint8_t *q, size_t n, int fmt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = fp8_decode_dev(q[i], fmt);
}

void fp8_cast_f32_cuda(uint8_t *q, const float *x, size_t n, FP8Format fmt) {
    need_init();
    cast_kernel<<<grid_for(n), 256, 0, ctx.stream>>>(q, x, n, fmt);
    launchCheck();
}
void fp8_decode_f32_cuda(float *x, const uint8_t *q, size_t n, FP8Format fmt) {
    need_init();
    decode_kernel<<<grid_for(n), 256, 0, ctx.stream>>>(x, q, n, fmt);
    launchCheck();
}

// ----------------------------------------------------------------------------
// quantization. Each kernel finds its group's amax and encodes in the same launch.

// per tensor, pass 1: amax of the whole tensor into *amax (zeroed before). atomicMax on the
// bits of a non-negative float orders like the float, and max is order-independent, so the
// result is deterministic.
template <typename T>
__global__ void amax_kernel(float *amax, const T *x, size_t n) {
    float m = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(load_f(x, i)));
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax((unsigned int *)amax, __float_as_uint(m));
}
// per tensor, pass 2: encode with the scale of *amax; block 0 stores the scale
template <typename T>
__global__ void quant_tensor_kernel(uint8_t *q, float *scale, const float *amax, const T *x, size_t n, int fmt, int pow2) {
    float s = fp8_scale_dev(*amax, fmt, pow2);
    if (blockIdx.x == 0 && threadIdx.x == 0) scale[0] = s;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q[i] = fp8_encode_dev(fp8_div(load_f(x, i), s), fmt);
}
// per row: one block of 256 threads per row; the second read of the row hits L2
template <typename T>
__global__ void quant_row_kernel(uint8_t *q, float *scale, const T *x, int cols, int fmt, int pow2) {
    size_t r = blockIdx.x;
    const T *xr = x + r * cols;
    float m = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(load_f(xr, c)));
    float s = fp8_scale_dev(block_max(m), fmt, pow2);
    if (threadIdx.x == 0) scale[r] = s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) q[r * cols + c] = fp8_encode_dev(fp8_div(load_f(xr, c), s), fmt);
}
// per row, bf16 rows of a multiple of 8 up to 8192 (a decode step's activations): one block per row, 8
// values a thread held in registers between the row's amax and the encode, so the row is read once, 16
// bytes a load; the bytes are quant_row_kernel's (the same amax, scale and division)
#define QROW8_MAXC 8192
__global__ void __launch_bounds__(1024) quant_row8_kernel(uint8_t *q, float *scale, const bf16 *x, int cols, int fmt, int pow2) {
    size_t r = blockIdx.x;
    int i0 = 8 * threadIdx.x;
    bool in = i0 < cols;
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, m = 0.f;
    if (in) unpack8(f, *(const uint4 *)(x + r * cols + i0));
#pragma unroll
    for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
    float s = fp8_scale_dev(block_max(m), fmt, pow2);
    if (threadIdx.x == 0) scale[r] = s;
    if (!in) return;
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        lo |= (uint32_t)fp8_encode_dev(fp8_div(f[j], s), fmt) << (8 * j);
        hi |= (uint32_t)fp8_encode_dev(fp8_div(f[j + 4], s), fmt) << (8 * j);
    }
    *(uint2 *)(q + r * cols + i0) = make_uint2(lo, hi);
}
// activations, 1x128 groups, two kernels. The general one: a warp per group, through the row codec
// the KV cache also uses (cuda_common.cuh); a warp takes one k-block (128 columns) of Q1X128_ROWS
// consecutive rows and issues all their loads before it reduces any. Scale layout (cols/128, rows):
// a block's warps take consecutive rows of one k-block, so its scale stores are contiguous.
#define Q1X128_ROWS 4
template <typename T>
__global__ void __launch_bounds__(256) quant_1x128_kernel(uint8_t *q, float *scale, const T *x, int rows, int cols,
                                                          int fmt, int pow2) {
    int lane = threadIdx.x & 31, kb = blockIdx.y, c0 = kb * FP8_BLOCK_SIZE;
    int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * Q1X128_ROWS;
    int n = cols - c0 < FP8_BLOCK_SIZE ? cols - c0 : FP8_BLOCK_SIZE;
    float v[Q1X128_ROWS][1][4];
#pragma unroll
    for (int i = 0; i < Q1X128_ROWS; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int k = lane * 4 + j;
            v[i][0][j] = r0 + i < rows && k < n ? load_f(x + (size_t)(r0 + i) * cols + c0, k) : 0.0f;
        }
#pragma unroll
    for (int i = 0; i < Q1X128_ROWS; i++) {
        int r = r0 + i;
        if (r < rows)  // the same for the whole warp: the codec's shuffles see every lane
            fp8_quantize_warp_regs<1>(q + (size_t)r * cols + c0, scale + (size_t)kb * rows + r, v[i], n, fmt, pow2);
    }
}
// The one the training step runs (cols % 16 == 0, x and q 16-byte aligned): 8 lanes a group, 16 values
// a lane (fp8_quantize_group16): the pass is a stream of memory (3 bytes a bf16 value) that a warp per
// group left instruction-bound. A warp takes 4 rows of one k-block at once, Q16_SETS times.
#define Q16_SETS 2
template <typename T>
__device__ __forceinline__ void load16(float (&v)[16], const T *p) {
    if (sizeof(T) == 2) {
        uint4 u0 = *(const uint4 *)p, u1 = *(const uint4 *)(p + 8);
        float *lo = v, *hi = v + 8;
        unpack8(lo, u0);
        unpack8(hi, u1);
    } else
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float4 f = *(const float4 *)((const float *)p + 4 * k);
            v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
        }
}
template <typename T>
__global__ void __launch_bounds__(256) quant_1x128_vec_kernel(uint8_t *q, float *scale, const T *x, int rows, int cols,
                                                              int fmt, int pow2) {
    int lane = threadIdx.x & 31, t = lane & 7, kb = blockIdx.y, c0 = kb * FP8_BLOCK_SIZE + 16 * t;
    int rw = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 4 * Q16_SETS + (lane >> 3);  // row of set 0
    bool in = c0 < cols;  // cols % 16 == 0: a lane's 16 values are all in or all out
    float v[Q16_SETS][16];
#pragma unroll
    for (int i = 0; i < Q16_SETS; i++) {
        int r = rw + 4 * i;
        if (r < rows && in) load16<T>(v[i], x + (size_t)r * cols + c0);
        else
#pragma unroll
            for (int j = 0; j < 16; j++) v[i][j] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < Q16_SETS; i++) {
        int r = rw + 4 * i;
        fp8_quantize_group16(q + (size_t)r * cols + c0, scale + (size_t)kb * rows + r, v[i], r < rows, in, fmt, pow2);
    }
}
// weights, 128x128 tiles: one block of 256 threads per tile (grid: ldk x row tiles, the
// padding columns of the scale matrix write 1). Thread t owns column t % 128 of rows
// t / 128, +2, +4, ...: 64 values kept in registers between the amax and the encode.
template <typename T>
__global__ void __launch_bounds__(256) quant_128x128_kernel(uint8_t *q, float *scale, const T *x, int rows, int cols,
                                                            int ldk, int fmt, int pow2) {
    int kb = blockIdx.x, rb = blockIdx.y;
    if (kb * FP8_BLOCK_SIZE >= cols) {  // padding scale
        if (threadIdx.x == 0) scale[(size_t)rb * ldk + kb] = 1.0f;
        return;
    }
    int c = kb * FP8_BLOCK_SIZE + (threadIdx.x & 127), r0 = rb * FP8_BLOCK_SIZE + (threadIdx.x >> 7);
    float v[64], m = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; i++) {
        int r = r0 + 2 * i;
        v[i] = (r < rows && c < cols) ? load_f(x, (size_t)r * cols + c) : 0.0f;
        m = fmaxf(m, fabsf(v[i]));
    }
    float s = fp8_scale_dev(block_max(m), fmt, pow2);
    if (threadIdx.x == 0) scale[(size_t)rb * ldk + kb] = s;
#pragma unroll
    for (int i = 0; i < 64; i++) {
        int r = r0 + 2 * i;
        if (r < rows && c < cols) q[(size_t)r * cols + c] = fp8_encode_dev(fp8_div(v[i], s), fmt);
    }
}

template <typename T>
static void quantize_t(FP8Tensor *t, const T *x, int pow2) {
    int R = t->rows, C = t->cols, fmt = t->fmt;
    size_t n = (size_t)R * C;
    switch (t->gran) {
        case FP8_TENSOR:
            cudaCheck(cudaMemsetAsync(ctx.amax, 0, sizeof(float), ctx.stream));
            amax_kernel<T><<<grid_for(n), 256, 0, ctx.stream>>>(ctx.amax, x, n);
            launchCheck();
            quant_tensor_kernel<T><<<grid_for(n), 256, 0, ctx.stream>>>(t->data, t->scale, ctx.amax, x, n, fmt, pow2);
            break;
        case FP8_ROW:
            if (std::is_same<T, bf16>::value && C % 8 == 0 && C <= QROW8_MAXC && (uintptr_t)x % 16 == 0 &&
                (uintptr_t)t->data % 8 == 0)
                quant_row8_kernel<<<R, 32 * cdiv(C / 8, 32), 0, ctx.stream>>>(t->data, t->scale, (const bf16 *)x, C, fmt, pow2);
            else quant_row_kernel<T><<<R, 256, 0, ctx.stream>>>(t->data, t->scale, x, C, fmt, pow2);
            break;
        case FP8_BLOCK:
            if (t->block_rows == 1) {
                if (C % 16 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)t->data % 16 == 0) {
                    dim3 grid(cdiv(R, 8 * 4 * Q16_SETS), cdiv(C, FP8_BLOCK_SIZE));
                    quant_1x128_vec_kernel<T><<<grid, 256, 0, ctx.stream>>>(t->data, t->scale, x, R, C, fmt, pow2);
                } else {
                    dim3 grid(cdiv(R, 8 * Q1X128_ROWS), cdiv(C, FP8_BLOCK_SIZE));
                    quant_1x128_kernel<T><<<grid, 256, 0, ctx.stream>>>(t->data, t->scale, x, R, C, fmt, pow2);
                }
            } else if (t->block_rows == FP8_BLOCK_SIZE) {
                int ldk = fp8_scale_ld(FP8_BLOCK, R, C, FP8_BLOCK_SIZE);
                dim3 grid(ldk, cdiv(R, FP8_BLOCK_SIZE));
                quant_128x128_kernel<T><<<grid, 256, 0, ctx.stream>>>(t->data, t->scale, x, R, C, ldk, fmt, pow2);
            } else die("fp8_quantize_cuda: block_rows must be 1 or 128, got %d", t->block_rows);
            break;
        default: die("fp8_quantize_cuda: granularity %d is not tensor, row or block", (int)t->gran);
    }
    launchCheck();
}

void fp8_quantize_cuda(FP8Tensor *t, const void *x, DType xdt, int pow2) {
    need_init();
    if (t->rows <= 0 || t->cols <= 0) die("fp8_quantize_cuda: empty tensor (%d, %d)", t->rows, t->cols);
    if (xdt == DT_BF16) quantize_t(t, (const bf16 *)x, pow2);
    else if (xdt == DT_F32) quantize_t(t, (const float *)x, pow2);
    else die("fp8_quantize_cuda: input must be bf16 or f32, got %s", dtype_name(xdt));
}

// ----------------------------------------------------------------------------
// FP8 training (fp8_train.cu): quantization with a scale the recipe gives, and the transposed
// copies the backward's products need (Hopper's FP8 GEMMs read both operands K-major, and the
// weight gradient reduces over tokens: its operands are dY and X with the tokens innermost).

template <typename T>
__global__ void amax_bits_kernel(unsigned *amax, const T *x, size_t n) {
    unsigned m = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        m = max(m, __float_as_uint(fabsf(load_f(x, i))));
    block_amax_record(amax, m);
}

// TE's current scaling: mul = scaled_max / amax in fp32 (FLT_MAX where that overflows), 1 for an
// amax of 0, inf or NaN; inv = 1 / mul
__global__ void mul_from_amax_kernel(float *mul, const unsigned *amax, float scaled_max) {
    float a = __uint_as_float(*amax), s = 1.0f;
    if (a > 0.0f && !isinf(a)) {
        s = __fdiv_rn(scaled_max, a);
        if (isinf(s)) s = FLT_MAX;
    }
    *mul = s;
}

// q = encode(x * mul[0]), TE's convention (delayed scaling: mul from the amax of earlier steps;
// current: from this tensor's, fp8_tensor_scale_cuda); scale_inv[0] = 1 / mul[0] (IEEE); with
// amax, this tensor's amax recorded (block_amax_record). bf16 where aligned: 8 values a thread, one
// 16-byte load and one 8-byte store; else four values a thread, one 4-byte store.
template <typename T>
__global__ void quant_scaled_kernel(uint8_t *q, float *scale_inv, unsigned *amax, const float *mul, const T *x, size_t n,
                                    int fmt) {
    float s = *mul;
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_inv[0] = __frcp_rn(s);
    unsigned m = 0;
    size_t n8 = sizeof(T) == 2 && ((uintptr_t)q & 7) == 0 && ((uintptr_t)x & 15) == 0 ? n / 8 : 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        float f[8];
        unpack8(f, ((const uint4 *)x)[i]);
        uint32_t word[2] = {0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            m = max(m, __float_as_uint(fabsf(f[j])));
            word[j >> 2] |= (uint32_t)fp8_encode_dev(f[j] * s, fmt) << (8 * (j & 3));
        }
        ((uint2 *)q)[i] = make_uint2(word[0], word[1]);
    }
    size_t n4 = ((uintptr_t)q & 3) ? 0 : n / 4;
    for (size_t i = 2 * n8 + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t word = 0;
        for (int j = 0; j < 4; j++) {
            float v = load_f(x, 4 * i + j);
            m = max(m, __float_as_uint(fabsf(v)));
            word |= (uint32_t)fp8_encode_dev(v * s, fmt) << (8 * j);
        }
        ((uint32_t *)q)[i] = word;
    }
    for (size_t i = 4 * n4 + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = load_f(x, i);
        m = max(m, __float_as_uint(fabsf(v)));
        q[i] = fp8_encode_dev(v * s, fmt);
    }
    if (amax) block_amax_record(amax, m);
}

void fp8_tensor_scale_cuda(float *mul, unsigned *amax, const void *x, DType xdt, size_t n, float scaled_max) {
    need_init();
    cudaCheck(cudaMemsetAsync(amax, 0, sizeof(unsigned), ctx.stream));
    if (xdt == DT_BF16) amax_bits_kernel<<<grid_for(n), 256, 0, ctx.stream>>>(amax, (const bf16 *)x, n);
    else if (xdt == DT_F32) amax_bits_kernel<<<grid_for(n), 256, 0, ctx.stream>>>(amax, (const float *)x, n);
    else die("fp8_tensor_scale_cuda: input must be bf16 or f32, got %s", dtype_name(xdt));
    launchCheck();
    mul_from_amax_kernel<<<1, 1, 0, ctx.stream>>>(mul, amax, scaled_max);
    launchCheck();
}

void fp8_quantize_scaled_cuda(FP8Tensor *t, const void *x, DType xdt, const float *mul, unsigned *amax) {
    need_init();
    if (t->gran != FP8_TENSOR) die("fp8_quantize_scaled_cuda: a given scale is per tensor, not %s", fp8_gran_name(t->gran));
    size_t n = (size_t)t->rows * t->cols;
    unsigned blocks = grid_for(n / (xdt == DT_BF16 ? 8 : 4) + 1);
    if (xdt == DT_BF16)
        quant_scaled_kernel<<<blocks, 256, 0, ctx.stream>>>(t->data, t->scale, amax, mul, (const bf16 *)x, n, t->fmt);
    else if (xdt == DT_F32)
        quant_scaled_kernel<<<blocks, 256, 0, ctx.stream>>>(t->data, t->scale, amax, mul, (const float *)x, n, t->fmt);
    else die("fp8_quantize_scaled_cuda: input must be bf16 or f32, got %s", dtype_name(xdt));
    launchCheck();
}

// t (C, R) = the block quantization of x^T, x (R, C) bf16: 1x128 groups along R (block_rows 1)
// or 128x128 tiles. One block of 256 threads per 128x128 tile of x, staged in shared memory
// (rows padded to 130 values, so that a warp reading one column touches 32 banks); then each warp
// writes whole output rows: lane l encodes rows l, l + 32, l + 64, l + 96 of the tile's column, so
// every store instruction writes 32 consecutive bytes of t. Per tensor, qrow (or NULL) gets the
// same codes in x's own layout from the staged tile: both layouts from one read of x.
__global__ void __launch_bounds__(256) quant_t_kernel(uint8_t *q, float *scale, const bf16 *x, int R, int C, int block_rows,
                                                      int ldk, int fmt, const float *mul, unsigned *amax, uint8_t *qrow) {
    __shared__ bf16 tile[128][130];
    int r0 = blockIdx.y * 128, c0 = blockIdx.x * 128;
    if (r0 + 128 <= R && c0 + 128 <= C && (C & 7) == 0 && ((uintptr_t)x & 15) == 0) {
        for (int p = threadIdx.x; p < 128 * 16; p += 256) {  // 16-byte loads, 8 values each
            int r = p >> 4, k = (p & 15) * 8;
            uint4 v = *(const uint4 *)(x + (size_t)(r0 + r) * C + c0 + k);
            uint32_t *d = (uint32_t *)&tile[r][k];
            d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
        }
    } else {  // an edge tile: zeros beyond x (they change no amax)
        for (int p = threadIdx.x; p < 128 * 128; p += 256) {
            int r = p >> 7, c = p & 127;
            tile[r][c] = (r0 + r < R && c0 + c < C) ? x[(size_t)(r0 + r) * C + c0 + c] : __float2bfloat16(0.0f);
        }
    }
    __syncthreads();
    float tile_s = 1.0f;
    if (mul) {  // per tensor: encode(x * mul), TE's convention, as fp8_quantize_scaled_cuda
        if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) scale[0] = __frcp_rn(*mul);
        if (amax) {
            unsigned m = 0;
            for (int p = threadIdx.x; p < 128 * 128; p += 256)
                m = max(m, __float_as_uint(fabsf(__bfloat162float(tile[p >> 7][p & 127]))));
            block_amax_record(amax, m);
        }
        if (qrow) {  // x's layout: a thread encodes 4 consecutive values of a row, one 4-byte store
            float s = *mul;
            int vec = (C & 3) == 0;
            for (int p = threadIdx.x; p < 128 * 32; p += 256) {
                int r = p >> 5, k = (p & 31) * 4;
                if (r0 + r >= R) continue;
                uint8_t *o = qrow + (size_t)(r0 + r) * C + c0 + k;
                if (vec && c0 + k + 4 <= C) {
                    uint32_t word = 0;
                    for (int j = 0; j < 4; j++) word |= (uint32_t)fp8_encode_dev(__bfloat162float(tile[r][k + j]) * s, fmt) << (8 * j);
                    *(uint32_t *)o = word;
                } else
                    for (int j = 0; j < 4 && c0 + k + j < C; j++) o[j] = fp8_encode_dev(__bfloat162float(tile[r][k + j]) * s, fmt);
            }
        }
    } else if (block_rows != 1) {  // one scale for the whole tile
        float m = 0.0f;
        for (int p = threadIdx.x; p < 128 * 128; p += 256) m = fmaxf(m, fabsf(__bfloat162float(tile[p >> 7][p & 127])));
        tile_s = fp8_scale_dev(block_max(m), fmt, 0);
        if (threadIdx.x == 0) {
            scale[(size_t)blockIdx.x * ldk + blockIdx.y] = tile_s;
            if (blockIdx.y == gridDim.y - 1)  // the row's padding columns
                for (int k = gridDim.y; k < ldk; k++) scale[(size_t)blockIdx.x * ldk + k] = 1.0f;
        }
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int c = warp; c < 128 && c0 + c < C; c += 8) {  // output row c0 + c
        float v[4], m = 0.0f;
        for (int j = 0; j < 4; j++) m = fmaxf(m, fabsf(v[j] = __bfloat162float(tile[lane + 32 * j][c])));
        uint8_t *out = q + (size_t)(c0 + c) * R + r0;
        if (mul) {
            float s = *mul;
            for (int j = 0; j < 4; j++)
                if (r0 + lane + 32 * j < R) out[lane + 32 * j] = fp8_encode_dev(v[j] * s, fmt);
            continue;
        }
        float s = tile_s;
        if (block_rows == 1) {
            s = fp8_scale_dev(warp_max(m), fmt, 0);
            if (lane == 0) scale[(size_t)blockIdx.y * C + c0 + c] = s;  // (R/128, C): fp8.h's 1x128 layout
        }
        for (int j = 0; j < 4; j++)
            if (r0 + lane + 32 * j < R) out[lane + 32 * j] = fp8_encode_dev(fp8_div(v[j], s), fmt);
    }
}

// Per tensor, a whole 128x128 tile (the common case: every tile of a tensor whose sides are
// multiples of 128), the same codes faster. The scale is known before the read, so each value is
// encoded as it is loaded (16-byte loads, 8 values a thread), its row layout written from registers
// (qrow), and the codes staged as bytes, not bf16, for the transposed write (tile_codes_write_t).
__global__ void __launch_bounds__(256) quant_t_tensor_kernel(uint8_t *q, float *scale, const bf16 *x, int R, int C, int fmt,
                                                             const float *mul, unsigned *amax, uint8_t *qrow) {
    __shared__ TileCodes tile;
    int r0 = blockIdx.y * 128, c0 = blockIdx.x * 128;
    float s = *mul;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) scale[0] = __frcp_rn(s);
    uint4 in[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {  // all eight loads in flight before any use
        int p = threadIdx.x + 256 * i, r = p >> 4, k = (p & 15) * 8;
        in[i] = *(const uint4 *)(x + (size_t)(r0 + r) * C + c0 + k);
    }
    unsigned m = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int p = threadIdx.x + 256 * i, r = p >> 4, k8 = p & 15;
        float f[8];
        unpack8(f, in[i]);
        uint32_t word[2] = {0, 0};
        for (int j = 0; j < 8; j++) {
            m = max(m, __float_as_uint(fabsf(f[j])));
            word[j >> 2] |= (uint32_t)fp8_encode_dev(f[j] * s, fmt) << (8 * (j & 3));
        }
        uint2 codes = make_uint2(word[0], word[1]);
        if (qrow) *(uint2 *)(qrow + (size_t)(r0 + r) * C + c0 + 8 * k8) = codes;
        tile_codes_put(tile, r, k8, codes);
    }
    if (amax) block_amax_record(amax, m);  // (its __syncthreads also orders the tile's writes and reads)
    else __syncthreads();
    tile_codes_write_t(tile, q, R, r0, c0);
}

// the per-tensor transposes: the fast kernel where every tile is whole and aligned, else the general one
static void quant_t_tensor(FP8Tensor *t, const bf16 *x, int R, int C, const float *mul, unsigned *amax, uint8_t *qrow) {
    dim3 grid(cdiv(C, 128), cdiv(R, 128));
    if (R % 128 == 0 && C % 128 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)t->data & 3) == 0 &&
        ((uintptr_t)qrow & 7) == 0)
        quant_t_tensor_kernel<<<grid, 256, 0, ctx.stream>>>(t->data, t->scale, x, R, C, t->fmt, mul, amax, qrow);
    else
        quant_t_kernel<<<grid, 256, 0, ctx.stream>>>(t->data, t->scale, x, R, C, 1, 0, t->fmt, mul, amax, qrow);
    launchCheck();
}

void fp8_quantize_t_cuda(FP8Tensor *t, const void *x, const float *mul, unsigned *amax) {
    need_init();
    int R = t->cols, C = t->rows;  // x is (R, C)
    if (t->gran == FP8_TENSOR ? !mul : (t->gran != FP8_BLOCK || (t->block_rows != 1 && t->block_rows != FP8_BLOCK_SIZE)))
        die("fp8_quantize_t_cuda: per tensor with a given scale, or blocks of 1x128 or 128x128");
    if (t->gran == FP8_TENSOR) {
        quant_t_tensor(t, (const bf16 *)x, R, C, mul, amax, NULL);
        return;
    }
    int ldk = fp8_scale_ld(FP8_BLOCK, C, R, t->block_rows);
    dim3 grid(cdiv(C, 128), cdiv(R, 128));
    quant_t_kernel<<<grid, 256, 0, ctx.stream>>>(t->data, t->scale, (const bf16 *)x, R, C, t->block_rows, ldk, t->fmt,
                                                 NULL, amax, NULL);
    launchCheck();
}

void fp8_quantize_both_cuda(FP8Tensor *row, FP8Tensor *t, const void *x, const float *mul, unsigned *amax) {
    need_init();
    int R = t->cols, C = t->rows;
    if (t->gran != FP8_TENSOR || row->gran != FP8_TENSOR || !mul || row->rows != R || row->cols != C || row->fmt != t->fmt)
        die("fp8_quantize_both_cuda: two per-tensor tensors of one format, (R, C) and (C, R), and a given scale");
    quant_t_tensor(t, (const bf16 *)x, R, C, mul, amax, row->data);
    if (row->scale != t->scale) cudaCheck(cudaMemcpyAsync(row->scale, t->scale, sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream));
}

// ----------------------------------------------------------------------------
// dequantization

__device__ __forceinline__ size_t scale_index_dev(int gran, int block_rows, int rows, int ld, int r, int c) {
    if (gran == FP8_ROW) return r;
    if (gran == FP8_BLOCK) {
        if (block_rows == 1) return (size_t)(c / FP8_BLOCK_SIZE) * rows + r;
        return (size_t)(r / FP8_BLOCK_SIZE) * ld + c / FP8_BLOCK_SIZE;
    }
    return 0;
}

template <typename T>
__global__ void dequant_kernel(T *out, const uint8_t *q, const float *scale, int rows, int cols, int gran, int block_rows,
                               int ld, int fmt) {
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / cols), c = (int)(i % cols);
        store_f(out, i, fp8_decode_dev(q[i], fmt) * scale[scale_index_dev(gran, block_rows, rows, ld, r, c)]);
    }
}

void fp8_dequantize_cuda(void *out, DType odt, const FP8Tensor *t) {
    need_init();
    size_t n = (size_t)t->rows * t->cols;
    int ld = fp8_scale_ld(t->gran, t->rows, t->cols, t->block_rows);
    if (odt == DT_BF16)
        dequant_kernel<<<grid_for(n), 256, 0, ctx.stream>>>((bf16 *)out, t->data, t->scale, t->rows, t->cols,
                                                            t->gran, t->block_rows, ld, t->fmt);
    else if (odt == DT_F32)
        dequant_kernel<<<grid_for(n), 256, 0, ctx.stream>>>((float *)out, t->data, t->scale, t->rows, t->cols, t->gran,
                                                            t->block_rows, ld, t->fmt);
    else die("fp8_dequantize_cuda: output must be bf16 or f32, got %s", dtype_name(odt));
    launchCheck();
}

// ----------------------------------------------------------------------------
// The hand-written GEMM: Y[M,N] = X[M,K] W[N,K]^T on the FP8 tensor cores through
// mma.sync.m16n8k32 (sm_89+). A block computes a 128 x 128 output tile with 8 warps as 2 (M) x 4 (N),
// each warp 64 x 32 = 4 x 4 mma tiles of 16 x 8. K advances in steps of 128 (one scale block): the
// step's tiles of X and W go global -> shared with cp.async, two stages so that the next step loads
// while this one multiplies, rows padded to 144 bytes so that the fragment loads of a warp hit 32
// different banks. Block scaling: each step's products go into a fresh partial sum, promoted into the
// fp32 accumulator with sx[m, kb] * sw[n/128, kb] (DeepSeek-V3); tensor / row: straight into the
// accumulator, scaled once at the end. Needs K % 16 == 0 (16-byte rows for cp.async).
#define MMA_BM 128
#define MMA_BN 128
#define MMA_BK 128
#define MMA_LDS (MMA_BK + 16)
#define MMA_SMEM (2 * (MMA_BM + MMA_BN) * MMA_LDS)

// D (16x8 f32) += A (16x32 fp8, row) * B (32x8 fp8, col): FX/FW pick e4m3 or e5m2
template <int FX, int FW>
__device__ __forceinline__ void mma_fp8(float *d, const uint32_t *a, const uint32_t *b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define MMA_FP8(TA, TB)                                                                                   \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." TA "." TB ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
                 "{%8,%9}, {%0,%1,%2,%3};\n"                                                              \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
    if (FX == FP8_E4M3 && FW == FP8_E4M3) MMA_FP8("e4m3", "e4m3");
    else if (FX == FP8_E5M2 && FW == FP8_E4M3) MMA_FP8("e5m2", "e4m3");
    else if (FX == FP8_E4M3 && FW == FP8_E5M2) MMA_FP8("e4m3", "e5m2");
    else MMA_FP8("e5m2", "e5m2");
#undef MMA_FP8
#endif
}

template <typename T, int FX, int FW, bool BLOCKWISE>
__global__ void __launch_bounds__(256) gemm_fp8_mma_kernel(T *y, GemmArgs a) {
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t *xs = smem, *ws = smem + 2 * MMA_BM * MMA_LDS;  // [stage][row][MMA_LDS]
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t4 = lane & 3;     // mma fragment coordinates
    int wm = warp >> 2, wn = warp & 3;    // warp tile (64 x 32) in the block tile
    int m0 = blockIdx.y * MMA_BM, n0 = blockIdx.x * MMA_BN;
    int KT = cdiv(a.K, MMA_BK);

    auto load_stage = [&](int stage, int kt) {
        int k0 = kt * MMA_BK;
        for (int c = tid; c < MMA_BM * (MMA_BK / 16); c += 256) {  // 1024 chunks of 16 bytes
            int r = c >> 3, kc = (c & 7) * 16;
            bool kin = k0 + kc < a.K;
            int mr = min(m0 + r, a.M - 1), nr = min(n0 + r, a.N - 1), kk = kin ? k0 + kc : 0;
            cp_async16(xs + (stage * MMA_BM + r) * MMA_LDS + kc, a.x + (size_t)mr * a.K + kk, kin && m0 + r < a.M);
            cp_async16(ws + (stage * MMA_BN + r) * MMA_LDS + kc, a.w + (size_t)nr * a.K + kk, kin && n0 + r < a.N);
        }
        cp_async_commit();
    };

    float acc[4][4][4], part[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int v = 0; v < 4; v++) acc[i][j][v] = 0.0f;

    load_stage(0, 0);
    for (int kt = 0; kt < KT; kt++) {
        if (kt + 1 < KT) { load_stage((kt + 1) & 1, kt + 1); cp_async_wait<1>(); }
        else cp_async_wait<0>();
        __syncthreads();
        const uint8_t *xt = xs + (kt & 1) * MMA_BM * MMA_LDS, *wt = ws + (kt & 1) * MMA_BN * MMA_LDS;
        if (BLOCKWISE) {
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int v = 0; v < 4; v++) part[i][j][v] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < MMA_BK; kk += 32) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint8_t *p = xt + (wm * 64 + i * 16 + g) * MMA_LDS + kk + t4 * 4;
                af[i][0] = *(const uint32_t *)p;
                af[i][1] = *(const uint32_t *)(p + 8 * MMA_LDS);
                af[i][2] = *(const uint32_t *)(p + 16);
                af[i][3] = *(const uint32_t *)(p + 8 * MMA_LDS + 16);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint8_t *p = wt + (wn * 32 + j * 8 + g) * MMA_LDS + kk + t4 * 4;
                bf[j][0] = *(const uint32_t *)p;
                bf[j][1] = *(const uint32_t *)(p + 16);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if constexpr (BLOCKWISE) mma_fp8<FX, FW>(part[i][j], af[i], bf[j]);
                    else mma_fp8<FX, FW>(acc[i][j], af[i], bf[j]);
                }
        }
        if (BLOCKWISE) {  // promote: acc += part * sx[m, kt] * sw[n0/128, kt]
            float sw = a.sw[(size_t)(n0 / FP8_BLOCK_SIZE) * a.ldsw + kt];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int mlo = m0 + wm * 64 + i * 16 + g, mhi = mlo + 8;
                float slo = mlo < a.M ? a.sx[(size_t)kt * a.M + mlo] * sw : 0.0f;
                float shi = mhi < a.M ? a.sx[(size_t)kt * a.M + mhi] * sw : 0.0f;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    acc[i][j][0] += part[i][j][0] * slo;
                    acc[i][j][1] += part[i][j][1] * slo;
                    acc[i][j][2] += part[i][j][2] * shi;
                    acc[i][j][3] += part[i][j][3] * shi;
                }
            }
        }
        __syncthreads();  // the stage is overwritten by the next iteration's load
    }
    // epilogue: fragment element v sits at row g (+8 for v >= 2), column 2*t4 + (v & 1)
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int v = 0; v < 4; v++) {
                int m = m0 + wm * 64 + i * 16 + g + (v >= 2 ? 8 : 0), n = n0 + wn * 32 + j * 8 + 2 * t4 + (v & 1);
                if (m >= a.M || n >= a.N) continue;
                float val = BLOCKWISE ? acc[i][j][v] : acc[i][j][v] * (sx_at(a, m, 0) * sw_at(a, n, 0));
                store_out(y, a, m, n, val);
            }
}

template <typename T, int FX, int FW, bool BW>
static void launch_v3_t(T *y, const GemmArgs &a) {
    static int attr_set = 0;  // per instantiation
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(gemm_fp8_mma_kernel<T, FX, FW, BW>, cudaFuncAttributeMaxDynamicSharedMemorySize, MMA_SMEM));
        attr_set = 1;
    }
    dim3 grid(cdiv(a.N, MMA_BN), cdiv(a.M, MMA_BM));
    gemm_fp8_mma_kernel<T, FX, FW, BW><<<grid, 256, MMA_SMEM, ctx.stream>>>(y, a);
    launchCheck();
}
template <typename T, int FX, int FW>
static void launch_v3_f(T *y, const GemmArgs &a) {
    if (a.gran == FP8_BLOCK) launch_v3_t<T, FX, FW, true>(y, a);
    else launch_v3_t<T, FX, FW, false>(y, a);
}
template <typename T>
static void launch_v3(T *y, const GemmArgs &a) {
    if (a.fx == FP8_E4M3 && a.fw == FP8_E4M3) launch_v3_f<T, FP8_E4M3, FP8_E4M3>(y, a);
    else if (a.fx == FP8_E5M2 && a.fw == FP8_E4M3) launch_v3_f<T, FP8_E5M2, FP8_E4M3>(y, a);
    else if (a.fx == FP8_E4M3 && a.fw == FP8_E5M2) launch_v3_f<T, FP8_E4M3, FP8_E5M2>(y, a);
    else launch_v3_f<T, FP8_E5M2, FP8_E5M2>(y, a);
}

// ----------------------------------------------------------------------------
// cuBLASLt. cuBLASLt is column-major: our row-major Y[M,N] is its D (N x M, ld N), and
//   D = op(A) * B with A = W (stored K x N, ld K, op = transpose) and B = X (K x M, ld K),
// the "TN" layout Hopper's FP8 GEMMs require (both operands K-major, as HF stores them).
// So cuBLASLt's A scales are W's and its B scales are X's:
//   TENSOR  SCALAR_32F both (device pointers to one float)
//   ROW     OUTER_VEC_32F: A's per row of op(A) = per output channel (N), B's per token (M)
//   BLOCK   A BLK128x128_32F over W (ceil(N/128) rows of ldk = round4(ceil(K/128)) floats),
//           B VEC128_32F over X ((K/128, M), token-contiguous): exactly fp8.h's layouts.
// A plan (descriptor, layouts, heuristic's algorithm) is cached per shape and alignment.

static cudaDataType_t cuda_fp8_type(int fmt) { return fmt == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
static cudaDataType_t cuda_out_type(DType t) { return t == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }
// A plan whose product is added to a bf16 output (beta = 1): such a plan may not split K with a
// reduction in place or in bf16 (each split's partial sum rounded to bf16, errors of a few ulps);
// without splits (or with an fp32 workspace) the sum is bf16(y + the fp32 product), one rounding,
// what adding the product made in fp32 in a second pass gives.
enum { YDT_SUM = 256 };

static LtPlan *plan_find(int kind, int M, int N, int K, int gran, int fx, int fw, int ydt, int transa, int aa, int ab,
                         int ay) {
    for (int i = 0; i < PLAN_CACHE; i++) {
        LtPlan *p = &ctx.plans[i];
        if (p->used && p->kind == kind && p->M == M && p->N == N && p->K == K && p->gran == gran && p->fx == fx &&
            p->fw == fw && p->ydt == ydt && p->transa == transa && p->align_a == aa &&
            p->align_b == ab && p->align_y == ay)
            return p;
    }
    LtPlan *p = &ctx.plans[ctx.next_plan];
    ctx.next_plan = (ctx.next_plan + 1) % PLAN_CACHE;
    if (p->used) {  // evict
        cublasLtMatmulDescDestroy(p->desc);
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->ly);
    }
    memset(p, 0, sizeof *p);
    p->used = 1; p->kind = kind; p->M = M; p->N = N; p->K = K; p->gran = gran; p->fx = fx; p->fw = fw;
    p->ydt = ydt; p->transa = transa; p->align_a = aa; p->align_b = ab; p->align_y = ay;
    return p;
}

// what the heuristic may pick for plan p: the context's workspace, the operands' alignments
static cublasLtMatmulPreference_t plan_pref(const LtPlan *p) {
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = ctx.workspace_bytes;
    uint32_t aa = p->align_a, ab = p->align_b, ay = p->align_y;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof ay));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof ay));
    if (p->ydt & YDT_SUM) {
        uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask));
    }
    return pref;
}

// build the plan's descriptor and layouts and ask the heuristic; p->ok says if it found one
static void plan_build(LtPlan *p, cudaDataType_t ta, cudaDataType_t tb, int lda) {
    cublasOperation_t opa = p->transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (p->kind == 0) {
        // fast accumulation off: with it Hopper's FP8 tensor cores keep ~14 accumulator bits over
        // the whole K (an error that grows with K: dev/notes/gemm.md, "Figures that were in product
        // comments: cuBLASLt's fast accumulation"); off, cuBLASLt promotes the
        // partial sums to fp32 as the kernels here do
        int8_t fast = 0;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
        cublasLtMatmulMatrixScale_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, mb = ma;
        if (p->gran == FP8_ROW) ma = mb = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if ((p->gran & 15) == FP8_BLOCK) {  // W 128x128 tiles, or 1x128 groups as X (the weight gradient's X^T)
            ma = p->gran & 16 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
            mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        }
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
        // the heuristic needs scale pointers set to know the mode is in use; real ones come per call
        const void *dummy = ctx.workspace;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof dummy));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof dummy));
    }
    // A: (K x N) if transposed (W row-major), else (N... see callers) with leading dimension lda
    if (p->transa) cublasCheck(cublasLtMatrixLayoutCreate(&p->la, ta, p->K, p->N, lda));
    else cublasCheck(cublasLtMatrixLayoutCreate(&p->la, ta, p->N, p->K, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, tb, p->K, p->M, p->K));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ly, cuda_out_type((DType)(p->ydt & ~YDT_SUM)), p->N, p->M, p->N));
    cublasLtMatmulPreference_t pref = plan_pref(p);
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, p->desc, p->la, p->lb, p->ly, p->ly, pref, 1, &res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && n > 0) {
        p->ok = 1;
        p->algo = res.algo;
    } else {
        snprintf(p->why, sizeof p->why, "cuBLASLt heuristic has no algorithm (status %s)", cublasLtGetStatusString(st));
    }
}

// the plan for an FP8 product, or NULL with the reason in why
static LtPlan *fp8_plan(DType ydt, const FP8Tensor *x, const FP8Tensor *w, const void *y, int acc, char *why, size_t cap) {
    int M = x->rows, N = w->rows, K = x->cols;
    if (!ctx.has_fp8) { snprintf(why, cap, "no FP8 tensor cores (compute capability %d)", ctx.cc); return NULL; }
    if (x->fmt == FP8_E5M2 && w->fmt == FP8_E5M2) { snprintf(why, cap, "cuBLASLt does not multiply E5M2 by E5M2"); return NULL; }
    if (K % 16) { snprintf(why, cap, "K = %d is not a multiple of 16 (cuBLASLt FP8 needs 16-byte rows)", K); return NULL; }
    if (N % (ydt == DT_BF16 ? 8 : 4)) { snprintf(why, cap, "N = %d: output rows must be 16-byte multiples", N); return NULL; }
    int aa = ptr_align(w->data), ab = ptr_align(x->data), ay = y ? ptr_align(y) : 256;
    if (aa < 16 || ab < 16 || ay < 16) { snprintf(why, cap, "operand pointers must be 16-byte aligned"); return NULL; }
    if (x->gran == FP8_TENSOR && (ptr_align(w->scale) < 16 || ptr_align(x->scale) < 16)) {  // (NOT_SUPPORTED at the call on H100)
        snprintf(why, cap, "per-tensor scales must lie at 16-byte aligned addresses");
        return NULL;
    }
    int gran = x->gran | (x->gran == FP8_BLOCK && w->block_rows == 1 ? 16 : 0);
    LtPlan *p = plan_find(0, M, N, K, gran, x->fmt, w->fmt, ydt | (acc && ydt == DT_BF16 ? YDT_SUM : 0), 1, aa, ab, ay);
    if (!p->desc) plan_build(p, cuda_fp8_type(w->fmt), cuda_fp8_type(x->fmt), K);
    if (!p->ok) { snprintf(why, cap, "%s for %dx%dx%d %s", p->why, M, N, K, fp8_gran_name((FP8Gran)x->gran)); return NULL; }
    return p;
}

static void lt_run(LtPlan *p, void *y, const void *A, const void *B, const void *sa, const void *sb, int accumulate) {
    if (p->kind == 0) {
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    }
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t st = cublasLtMatmul(ctx.lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, y, p->ly, y, p->ly, &p->algo,
                                       ctx.workspace, ctx.workspace_bytes, ctx.stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        die("cuBLASLt matmul %dx%dx%d (%s, gran %d, X %s, W %s, out %s%s): %s", p->M, p->N, p->K, p->kind ? "bf16" : "fp8",
            p->gran, p->fx ? "e5m2" : "e4m3", p->fw ? "e5m2" : "e4m3", dtype_name((DType)(p->ydt & ~YDT_SUM)), accumulate ? ", accumulate" : "",
            cublasLtGetStatusString(st));
}

// BF16: D (N x M) = op(A) * B with B = X (K x M, ld K); A = W as (K x N, ld K) transposed
// (Y = X W^T) or, for the backward, A = W as (N... ) see fp8_linear_dx_cuda.
static void bf16_lt(void *y, DType ydt, const void *A, int transa, int lda, const void *B, int M, int N, int K,
                    int accumulate) {
    need_init();
    LtPlan *p = plan_find(1, M, N, K, 0, 0, 0, ydt, transa, ptr_align(A), ptr_align(B), ptr_align(y));
    if (!p->desc) plan_build(p, CUDA_R_16BF, CUDA_R_16BF, lda);
    if (!p->ok) die("bf16 GEMM %dx%dx%d: %s", M, N, K, p->why);
    lt_run(p, y, A, B, NULL, NULL, accumulate);
}

void bf16_gemm_cuda(void *y, DType ydt, const void *x, const void *w, int M, int N, int K, int accumulate) {
    if (ydt != DT_BF16 && ydt != DT_F32) die("bf16_gemm_cuda: output must be bf16 or f32");
    bf16_lt(y, ydt, w, 1, K, x, M, N, K, accumulate);
}

// ----------------------------------------------------------------------------
// fp8_gemm_cuda: which implementation runs a product
//
// AUTO takes the first that can run the product, in this order (each where it measured faster than
// what follows it: dev/notes/gemm.md, "Now: AUTO's rule and what each kernel gives"):
//   1. Hopper, K >= 2048 and M <= 64 (a decode step), or M <= 128 where W is at most 8 MiB: the
//      decode kernel;
//   2. Hopper, K <= 1024 on large products: the wgmma kernel (both: fp8_hopper.cu says where);
//   3. cuBLASLt, wherever it supports the shape and scaling (row and block scaling need sm_90+);
//   4. Hopper: the wgmma kernel where cuBLASLt declines (mma.sync FP8 is emulated on sm_90);
//   5. the mma.sync kernel above (sm_89+, K % 16 == 0): e.g. row or block scaling on an RTX 40 or 50;
//   6. BF16: both operands dequantized to BF16, one BF16 GEMM (no FP8 tensor cores, or K % 16 != 0).
// The other backends force one of them (tests and benchmarks), or die saying why it cannot run.

static int mma_supported(const GemmArgs &a, char *why, size_t cap) {
    if (!ctx.has_fp8) { snprintf(why, cap, "no FP8 tensor cores (compute capability %d)", ctx.cc); return 0; }
    if (a.K % 16) { snprintf(why, cap, "K = %d is not a multiple of 16 (cp.async moves 16-byte rows)", a.K); return 0; }
    if (ptr_align(a.x) < 16 || ptr_align(a.w) < 16) { snprintf(why, cap, "operands must be 16-byte aligned"); return 0; }
    return 1;
}

// the hand-written kernels read W's block scales as 128x128 tiles (a weight), never 1x128 groups
static int kernel_scales_ok(const FP8Tensor *x, const FP8Tensor *w, char *why, size_t cap) {
    if (x->gran != FP8_BLOCK || w->block_rows != 1) return 1;
    snprintf(why, cap, "the kernels read W's block scales as 128x128 tiles, not 1x128 groups");
    return 0;
}

// whether backend b can run this product (AUTO: always), and if not why
static int supported(FP8GemmBackend b, DType ydt, const FP8Tensor *x, const FP8Tensor *w, const void *y,
                     const GemmArgs &a, char *why, size_t cap) {
    switch (b) {
        case FP8_GEMM_AUTO: return 1;
        case FP8_GEMM_CUBLASLT: return fp8_plan(ydt, x, w, y, a.accumulate, why, cap) != NULL;
        case FP8_GEMM_MMA: return kernel_scales_ok(x, w, why, cap) && mma_supported(a, why, cap);
        case FP8_GEMM_WGMMA: return kernel_scales_ok(x, w, why, cap) && hopper_supported(a, 0, why, cap);
        case FP8_GEMM_DECODE: return kernel_scales_ok(x, w, why, cap) && hopper_supported(a, 1, why, cap);
        case FP8_GEMM_BF16: return 1;
    }
    return 0;
}

static FP8GemmBackend auto_choice(DType ydt, const FP8Tensor *x, const FP8Tensor *w, const void *y, const GemmArgs &a) {
    char why[256];
    if (!ctx.has_fp8) return FP8_GEMM_BF16;
    if (!kernel_scales_ok(x, w, why, sizeof why)) return fp8_plan(ydt, x, w, y, a.accumulate, why, sizeof why) ? FP8_GEMM_CUBLASLT : FP8_GEMM_BF16;
    if (hopper_decode_preferred(a.M, a.N, a.K) && hopper_supported(a, 1, why, sizeof why)) return FP8_GEMM_DECODE;
    if (hopper_wgmma_preferred(a.M, a.N, a.K, ctx.sms) && hopper_supported(a, 0, why, sizeof why)) return FP8_GEMM_WGMMA;
    if (fp8_plan(ydt, x, w, y, a.accumulate, why, sizeof why)) return FP8_GEMM_CUBLASLT;
    if (hopper_supported(a, 0, why, sizeof why)) return FP8_GEMM_WGMMA;
    if (mma_supported(a, why, sizeof why)) return FP8_GEMM_MMA;
    return FP8_GEMM_BF16;
}

static const char *backend_name(FP8GemmBackend b) {
    static const char *n[] = {"auto", "cublaslt", "kernel-mma", "kernel-wgmma", "kernel-decode", "bf16-fallback"};
    return n[b];
}

int fp8_gemm_supported(FP8GemmBackend b, DType ydt, const FP8Tensor *x, const FP8Tensor *w, char *why, size_t why_cap) {
    need_init();
    char tmp[256];
    if (!why) { why = tmp; why_cap = sizeof tmp; }
    return supported(b, ydt, x, w, NULL, gemm_args(x, w, 0), why, why_cap);
}

void fp8_gemm_cuda(void *y, DType ydt, const FP8Tensor *x, const FP8Tensor *w, int accumulate) {
    need_init();
    int M = x->rows, N = w->rows, K = x->cols;
    if (w->cols != K) die("fp8_gemm_cuda: X is (%d, %d) but W is (%d, %d): inner dimensions differ", M, K, N, w->cols);
    if (x->gran != w->gran) die("fp8_gemm_cuda: X is %s-scaled, W %s-scaled: use one granularity", fp8_gran_name(x->gran), fp8_gran_name(w->gran));
    if (x->gran == FP8_BLOCK && (x->block_rows != 1 || (w->block_rows != FP8_BLOCK_SIZE && w->block_rows != 1)))
        die("fp8_gemm_cuda: BLOCK needs X in 1x128 groups and W in 128x128 tiles or 1x128 groups (block_rows %d, %d)",
            x->block_rows, w->block_rows);
    if (ydt != DT_BF16 && ydt != DT_F32) die("fp8_gemm_cuda: output must be bf16 or f32, got %s", dtype_name(ydt));
    GemmArgs a = gemm_args(x, w, accumulate);
    FP8GemmBackend b = ctx.backend;
    char why[256];
    if (b == FP8_GEMM_AUTO) b = auto_choice(ydt, x, w, y, a);
    else if (!supported(b, ydt, x, w, y, a, why, sizeof why))
        die("fp8_gemm_cuda: the %s backend cannot run %dx%dx%d (%s): %s", backend_name(b), M, N, K, fp8_gran_name(x->gran), why);
    ctx.last = backend_name(b);
    switch (b) {
        case FP8_GEMM_DECODE: hopper_decode_gemm(y, ydt, a, ctx.stream); break;
        case FP8_GEMM_WGMMA: hopper_wgmma_gemm(y, ydt, a, ctx.sms, ctx.stream); break;
        case FP8_GEMM_CUBLASLT:
            lt_run(fp8_plan(ydt, x, w, y, accumulate, why, sizeof why), y, w->data, x->data, w->scale, x->scale, accumulate);
            break;
        case FP8_GEMM_MMA:
            if (ydt == DT_BF16) launch_v3((bf16 *)y, a);
            else launch_v3((float *)y, a);
            break;
        default: {  // BF16: dequantize both operands, one BF16 GEMM
            void *xd = scratch(0, (size_t)M * K * 2), *wd = scratch(1, (size_t)N * K * 2);
            fp8_dequantize_cuda(xd, DT_BF16, x);
            fp8_dequantize_cuda(wd, DT_BF16, w);
            bf16_gemm_cuda(y, ydt, xd, wd, M, N, K, accumulate);
        }
    }
}

// ----------------------------------------------------------------------------
// backward through a frozen FP8 weight: dX[M,K] = dY[M,N] W[N,K]
//
// The reduction runs over W's rows N, but the FP8 tensor cores read both operands K-major (the
// reduced dimension innermost), so W has to be laid out as W^T (K, N). Two ways:
//
//   FP8: W^T's codes are W's bytes transposed, and for 128x128 tiles
//   the tile grid of scales transposed with them, since a tile's one scale serves W and W^T alike
//   (a per-tensor scale is W's own). Nothing is quantized again, so W^T holds exactly W's values.
//   dY is quantized per call as the forward quantizes X: in 1x128 groups along N (BLOCK), or by
//   its amax (TENSOR). Then one FP8 product dX = dY_q (W^T)^T. Per weight and call this moves the
//   weight twice (read, write its transpose: half the bytes of the BF16 copy below) and dY once,
//   and the product runs at FP8 rate. dY's format: E4M3 with 1x128 groups (every group of 128
//   values has its own scale, so range is not the problem and E4M3's extra mantissa bit is the
//   better use of 8 bits: DeepSeek-V3's choice), E5M2 with one scale for the tensor (gradients'
//   range across a whole tensor is wide: Transformer Engine's hybrid format).
//   ROW weights (one scale per row of W, so per element of the reduction) cannot be a scale of
//   W^T's rows, and take the BF16 path, as do products FP8 cannot run (N not a multiple of 16,
//   K not of 8, a GPU without FP8 tensor cores).
//   Which one AUTO takes: the FP8 product saves GEMM time in proportion to M N K and costs dY's
//   quantization, 3 bytes moved per element of dY (M N), so it pays only where K is large enough
//   for the saving to outweigh the pass; with Hopper's FP8 and BF16 tensor-core rates and its memory
//   bandwidth the two meet near K = 1100, so FP8 where K >= 2048 (the measurements: dev/notes/fp8-training.md,
//   "The LoRA update's input gradient as an FP8 product").
//
//   BF16 (the reference): W dequantized to BF16 in scratch, one BF16 GEMM: the straight-through
//   estimator the CPU backend computes, exact up to BF16 rounding of W.

// out (C, R) = in (R, C)^T, bytes, a 128 x 128 tile a block. A thread reads a 4 x 4 block of bytes
// as four words (rows 4i..4i+3 of one word column j; a warp's lanes take consecutive words of a row:
// coalesced), transposes it in registers with byte permutes (four words of output rows 4j..4j+3),
// and stores those words in shared memory at their place in the output tile; then the warps write
// the output tile's rows, a word a lane. The shared tile is swizzled (word w of output row o at
// column w ^ o/4) so that neither the column of 32 words a warp stores nor the row it reads share a
// bank. Words go to and from global memory where the tile is whole and the rows are multiples of 4
// bytes; else bytes, with bounds.
#define TR_TILE 128
__device__ __forceinline__ void transpose4x4(uint32_t (&a)[4]) {
    uint32_t lo01 = __byte_perm(a[0], a[1], 0x5140), hi01 = __byte_perm(a[0], a[1], 0x7362);
    uint32_t lo23 = __byte_perm(a[2], a[3], 0x5140), hi23 = __byte_perm(a[2], a[3], 0x7362);
    a[0] = __byte_perm(lo01, lo23, 0x5410), a[1] = __byte_perm(lo01, lo23, 0x7632);
    a[2] = __byte_perm(hi01, hi23, 0x5410), a[3] = __byte_perm(hi01, hi23, 0x7632);
}
__global__ void __launch_bounds__(256) transpose_u8_kernel(uint8_t *out, const uint8_t *in, int R, int C) {
    __shared__ uint32_t tile[TR_TILE][TR_TILE / 4];  // the output tile: 128 rows of 32 words, swizzled
    constexpr int GROUPS = TR_TILE / 4 / 8;          // row groups of 4 a warp takes (8 warps)
    int r0 = blockIdx.y * TR_TILE, c0 = blockIdx.x * TR_TILE, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    bool whole = r0 + TR_TILE <= R && c0 + TR_TILE <= C;
    uint32_t a[GROUPS][4];
#pragma unroll
    for (int g = 0; g < GROUPS; g++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int r = r0 + 4 * (warp + 8 * g) + k, c = c0 + 4 * lane;
            const uint8_t *src = in + (size_t)r * C + c;
            uint32_t v = 0;
            if (whole && C % 4 == 0) v = *(const uint32_t *)src;
            else
                for (int j = 0; j < 4; j++)
                    if (r < R && c + j < C) v |= (uint32_t)src[j] << (8 * j);
            a[g][k] = v;
        }
#pragma unroll
    for (int g = 0; g < GROUPS; g++) {
        int i = warp + 8 * g;  // the 4 x 4 block's input rows 4i.., its output word column
        transpose4x4(a[g]);
#pragma unroll
        for (int t = 0; t < 4; t++) tile[4 * lane + t][i ^ lane] = a[g][t];  // output row 4 lane + t, swizzle (4 lane + t) / 4
    }
    __syncthreads();
#pragma unroll 4
    for (int o = warp; o < TR_TILE; o += 8) {  // output row c0 + o, its bytes r0 + 4 lane ..
        uint32_t v = tile[o][lane ^ (o >> 2)];
        uint8_t *dst = out + (size_t)(c0 + o) * R + r0 + 4 * lane;
        if (whole && R % 4 == 0) *(uint32_t *)dst = v;
        else
            for (int j = 0; j < 4; j++)
                if (c0 + o < C && r0 + 4 * lane + j < R) dst[j] = (uint8_t)(v >> (8 * j));
    }
}

// 128x128 tile scales: out (ceil(C/128), ldo) = in (ceil(R/128), ldi)^T, padding 1 (fp8.h)
__global__ void transpose_scales_kernel(float *out, const float *in, int rb, int cb, int ldi, int ldo) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cb * ldo) return;
    int c = i / ldo, r = i % ldo;
    out[i] = r < rb ? in[(size_t)r * ldi + c] : 1.0f;
}

void fp8_transpose_cuda(FP8Tensor *t, const FP8Tensor *w) {
    need_init();
    int R = w->rows, C = w->cols;
    if (w->gran != FP8_TENSOR && !(w->gran == FP8_BLOCK && w->block_rows == FP8_BLOCK_SIZE))
        die("fp8_transpose_cuda: only per-tensor and 128x128-tile scales transpose with the codes (got %s)",
            fp8_gran_name(w->gran));
    if (t->rows != C || t->cols != R || t->gran != w->gran || t->fmt != w->fmt || t->block_rows != w->block_rows)
        die("fp8_transpose_cuda: t must be (%d, %d) with w's granularity and format", C, R);
    dim3 grid(cdiv(C, TR_TILE), cdiv(R, TR_TILE));
    transpose_u8_kernel<<<grid, 256, 0, ctx.stream>>>(t->data, w->data, R, C);
    launchCheck();
    if (w->gran == FP8_TENSOR) {
        if (t->scale != w->scale) cudaCheck(cudaMemcpyAsync(t->scale, w->scale, 4, cudaMemcpyDeviceToDevice, ctx.stream));
        return;
    }
    int rb = cdiv(R, FP8_BLOCK_SIZE), cb = cdiv(C, FP8_BLOCK_SIZE);
    int ldi = fp8_scale_ld(FP8_BLOCK, R, C, FP8_BLOCK_SIZE), ldo = fp8_scale_ld(FP8_BLOCK, C, R, FP8_BLOCK_SIZE);
    transpose_scales_kernel<<<cdiv(cb * ldo, 256), 256, 0, ctx.stream>>>(t->scale, w->scale, rb, cb, ldi, ldo);
    launchCheck();
}

// an FP8 tensor (rows, cols) whose codes and scales lie in scratch slot i (scales 256-byte aligned)
static FP8Tensor scratch_tensor(int i, int rows, int cols, FP8Gran g, FP8Format fmt, int block_rows) {
    FP8Tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows, t.cols = cols, t.gran = g, t.fmt = fmt, t.block_rows = block_rows;
    size_t codes = ((size_t)rows * cols + 255) / 256 * 256;
    t.data = (uint8_t *)scratch(i, codes + fp8_num_scales(g, rows, cols, block_rows) * 4);
    t.scale = (float *)(t.data + codes);
    return t;
}

int fp8_linear_dx_is_fp8(const FP8Tensor *w) {
    need_init();
    int runs = ctx.has_fp8 && (w->gran == FP8_TENSOR || w->gran == FP8_BLOCK) && w->rows % 16 == 0 && w->cols % 8 == 0;
    return runs && (ctx.dx == FP8_DX_FP8 || (ctx.dx == FP8_DX_AUTO && w->cols >= 2048));
}

void fp8_linear_dx_cuda(void *dx, int accumulate, const void *dy, const FP8Tensor *w, int M) {
    need_init();
    int N = w->rows, K = w->cols;
    if (fp8_linear_dx_is_fp8(w)) {
        FP8Tensor wt = scratch_tensor(2, K, N, w->gran, w->fmt, w->block_rows);
        if (w->gran == FP8_TENSOR) wt.scale = w->scale;  // W^T's scale is W's
        fp8_transpose_cuda(&wt, w);
        FP8Tensor dyq = scratch_tensor(3, M, N, w->gran, w->gran == FP8_BLOCK ? FP8_E4M3 : FP8_E5M2, 1);
        fp8_quantize_cuda(&dyq, dy, DT_BF16, 0);
        fp8_gemm_cuda(dx, DT_BF16, &dyq, &wt, accumulate);
        return;
    }
    // BF16: D (K x M, ld K) = A (K x N, ld K: W dequantized, row-major, not transposed) * B (N x M,
    // ld N: dY row-major) in cuBLASLt's column-major terms; the bf16 plan machinery with the roles
    // renamed (output width K, reduction N)
    void *wd = scratch(1, (size_t)N * K * 2);
    fp8_dequantize_cuda(wd, DT_BF16, w);
    LtPlan *p = plan_find(1, M, K, N, 0, 0, 0, DT_BF16, 0, ptr_align(wd), ptr_align(dy), ptr_align(dx));
    if (!p->desc) plan_build(p, CUDA_R_16BF, CUDA_R_16BF, K);
    if (!p->ok) die("fp8_linear_dx_cuda %dx%dx%d: %s", M, K, N, p->why);
    lt_run(p, dx, wd, dy, NULL, NULL, accumulate);
}
