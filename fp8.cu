// fp8.cu: the CUDA FP8 kernels behind fp8_cuda.h.
//   defines: fp8_cuda_init/free, casts, fp8_quantize_cuda (tensor / row / 1x128 / 128x128,
//   dynamic amax, pow2), fp8_dequantize_cuda, fp8_gemm_cuda (cuBLASLt or the hand-written
//   kernels), bf16_gemm_cuda, fp8_linear_dx_cuda.
// Numerics follow fp8.h exactly (scale = amax / max in fp32, q = encode(x / scale) with an
// IEEE division, satfinite round-to-nearest-even), so the bytes equal dev/fp8_cpu.c's.
// The hand-written GEMM kernels are versions 2, 3 (any sm_89+), 6/7 (Hopper, sm_90a: TMA +
// wgmma) and 8 (Hopper, M <= 64: split-K over a cluster) of dev/gemm_fp8.cu (which holds versions 1, 4 and 5, the validation and the
// benchmark); they keep their numbers here.
// Needs: CUDA >= 12.9 (cuBLASLt's VEC128 / BLK128x128 scale modes), cublasLt.
#include <cooperative_groups.h>
#include <cublasLt.h>
#include <cudaTypedefs.h>  // cuda.h's CUtensorMap and the type of cuTensorMapEncodeTiled (no -lcuda)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdio.h>

#include "fp8.h"
#include "fp8_cuda.h"

namespace cg = cooperative_groups;

#if CUBLAS_VERSION < 120900
#error "fp8.cu needs cuBLAS >= 12.9 (CUDA 12.9) for VEC128_32F / BLK128x128_32F block scaling"
#endif

// ----------------------------------------------------------------------------
// checks that say where and why

static void cuda_check(cudaError_t e, const char *file, int line) {
    if (e != cudaSuccess) die("CUDA error %s at %s:%d: %s", cudaGetErrorName(e), file, line, cudaGetErrorString(e));
}
static void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) die("cuBLAS error %d (%s) at %s:%d", (int)s, cublasLtGetStatusString(s), file, line);
}
#define cudaCheck(e) cuda_check((e), __FILE__, __LINE__)
#define cublasCheck(s) cublas_check((s), __FILE__, __LINE__)
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

__host__ __device__ static inline int cdiv(long a, long b) { return (int)((a + b - 1) / b); }

// ----------------------------------------------------------------------------
// the context: one per process, used from one stream

#define PLAN_CACHE 64
typedef struct {
    // key
    int used, M, N, K, kind;  // kind: 0 fp8 (gran in gran), 1 bf16
    int gran, fx, fw, ydt, fast, transa, align_a, align_b, align_y;
    // value
    int ok;
    char why[160];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ly;
    cublasLtMatmulAlgo_t algo;  // the heuristic's first choice
} LtPlan;

static struct {
    int init, cc, has_fp8, force_no_fp8, fast_accum;
    int sms, wgmma;  // multiprocessors; 1 if the Hopper wgmma kernel can run (sm_90a GPU and build)
    int wgmma_version;  // 0: by shape (wgmma_version()), 6 or 7: forced (tests)
    FP8GemmBackend backend;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    float *amax;  // (1) scratch for per-tensor amax
    void *scratch[2];  // bf16 scratch (dequantized operands), grown on demand
    size_t scratch_bytes[2];
    LtPlan plans[PLAN_CACHE];
    int next_plan;
    const char *last;
    unsigned epoch;     // bumped when scratch moves
    int dk_split;       // the decode kernel's K splits (fp8_cuda_set_decode_split): 0 = by shape
} ctx;

static int wgmma_probe(void);  // (Hopper section)

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
    ctx.wgmma = wgmma_probe();
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
    for (int i = 0; i < 2; i++) cudaFree(ctx.scratch[i]);
    cublasLtDestroy(ctx.lt);
    memset(&ctx, 0, sizeof ctx);
}

static void need_init(void) {
    if (!ctx.init) die("fp8 CUDA: call fp8_cuda_init() first");
}
int fp8_cuda_cc(void) { return ctx.cc; }
void fp8_cuda_force_no_fp8(int on) { ctx.force_no_fp8 = on; }
void fp8_cuda_set_backend(FP8GemmBackend b) { ctx.backend = b; }
void fp8_cuda_set_fast_accum(int on) { ctx.fast_accum = on; }
void fp8_cuda_set_wgmma_version(int v) { ctx.wgmma_version = v; }
const char *fp8_cuda_last_backend(void) { return ctx.last; }
unsigned fp8_cuda_scratch_epoch(void) { return ctx.epoch; }
void fp8_cuda_set_decode_split(int ksplit) { ctx.dk_split = ksplit; }

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
// device codecs (same numerics as dev/fp8_cpu.c)

__device__ __forceinline__ uint8_t encode_dev(float v, int fmt) {
    // the hardware cvt (sm_89+, emulated in software below) rounds to nearest even and, with
    // satfinite, clamps +-inf and overflow to +-max; NaN keeps its sign as PyTorch does
    if (isnan(v)) return (signbit(v) ? 0x80 : 0x00) | 0x7F;
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}
__device__ __forceinline__ float decode_dev(uint8_t q, int fmt) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}
__device__ __forceinline__ float scale_from_amax_dev(float amax, int fmt, int pow2) {
    if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
    float s = __fdiv_rn(amax, fmt == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX);
    if (s == 0.0f) s = FLT_MIN;
    if (pow2) {
        int e;
        float m = frexpf(s, &e);
        s = m == 0.5f ? s : ldexpf(1.0f, e);
    }
    return s;
}
__device__ __forceinline__ float load_f(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// max over a block of blockDim.x threads (a multiple of 32, <= 1024); all threads get it
__device__ float block_max(float v) {
    __shared__ float part[32];
    v = warp_max(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // part may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
    return warp_max(v);
}

// ----------------------------------------------------------------------------
// casts

__global__ void cast_kernel(uint8_t *q, const float *x, size_t n, int fmt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q[i] = encode_dev(x[i], fmt);
}
__global__ void decode_kernel(float *x, const uint8_t *q, size_t n, int fmt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = decode_dev(q[i], fmt);
}
static int grid_for(size_t n) { size_t g = (n + 255) / 256; return (int)(g < 4096 ? (g ? g : 1) : 4096); }

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
    float s = scale_from_amax_dev(*amax, fmt, pow2);
    if (blockIdx.x == 0 && threadIdx.x == 0) scale[0] = s;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q[i] = encode_dev(__fdiv_rn(load_f(x, i), s), fmt);
}
// per row: one block of 256 threads per row; the second read of the row hits L2
template <typename T>
__global__ void quant_row_kernel(uint8_t *q, float *scale, const T *x, int cols, int fmt, int pow2) {
    size_t r = blockIdx.x;
    const T *xr = x + r * cols;
    float m = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(load_f(xr, c)));
    float s = scale_from_amax_dev(block_max(m), fmt, pow2);
    if (threadIdx.x == 0) scale[r] = s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) q[r * cols + c] = encode_dev(__fdiv_rn(load_f(xr, c), s), fmt);
}
// activations, 1x128 groups: one warp per group, 4 consecutive elements per lane.
// scale layout (cols/128, rows): warps of one block walk consecutive rows of one k-block,
// so their scale stores are contiguous.
template <typename T>
__global__ void quant_1x128_kernel(uint8_t *q, float *scale, const T *x, int rows, int cols, int fmt, int pow2) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp, kb = blockIdx.y;
    if (r >= rows) return;
    int c0 = kb * FP8_BLOCK_SIZE + lane * 4;
    const T *xr = x + (size_t)r * cols;
    float v[4], m = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[j] = c0 + j < cols ? load_f(xr, c0 + j) : 0.0f;
        m = fmaxf(m, fabsf(v[j]));
    }
    float s = scale_from_amax_dev(warp_max(m), fmt, pow2);
    if (lane == 0) scale[(size_t)kb * rows + r] = s;
    uint8_t *qr = q + (size_t)r * cols;
    if (c0 + 3 < cols && (cols & 3) == 0) {
        uint32_t packed = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) packed |= (uint32_t)encode_dev(__fdiv_rn(v[j], s), fmt) << (8 * j);
        *(uint32_t *)(qr + c0) = packed;
    } else {
        for (int j = 0; j < 4; j++)
            if (c0 + j < cols) qr[c0 + j] = encode_dev(__fdiv_rn(v[j], s), fmt);
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
    float s = scale_from_amax_dev(block_max(m), fmt, pow2);
    if (threadIdx.x == 0) scale[(size_t)rb * ldk + kb] = s;
#pragma unroll
    for (int i = 0; i < 64; i++) {
        int r = r0 + 2 * i;
        if (r < rows && c < cols) q[(size_t)r * cols + c] = encode_dev(__fdiv_rn(v[i], s), fmt);
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
            quant_row_kernel<T><<<R, 256, 0, ctx.stream>>>(t->data, t->scale, x, C, fmt, pow2);
            break;
        case FP8_BLOCK:
            if (t->block_rows == 1) {
                dim3 grid(cdiv(R, 8), cdiv(C, FP8_BLOCK_SIZE));
                quant_1x128_kernel<T><<<grid, 256, 0, ctx.stream>>>(t->data, t->scale, x, R, C, fmt, pow2);
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
    if (xdt == DT_BF16) quantize_t(t, (const __nv_bfloat16 *)x, pow2);
    else if (xdt == DT_F32) quantize_t(t, (const float *)x, pow2);
    else die("fp8_quantize_cuda: input must be bf16 or f32, got %s", dtype_name(xdt));
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
__device__ __forceinline__ void store_f(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

template <typename T>
__global__ void dequant_kernel(T *out, const uint8_t *q, const float *scale, int rows, int cols, int gran, int block_rows,
                               int ld, int fmt) {
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / cols), c = (int)(i % cols);
        store_f(out, i, decode_dev(q[i], fmt) * scale[scale_index_dev(gran, block_rows, rows, ld, r, c)]);
    }
}

void fp8_dequantize_cuda(void *out, DType odt, const FP8Tensor *t) {
    need_init();
    size_t n = (size_t)t->rows * t->cols;
    int ld = fp8_scale_ld(t->gran, t->rows, t->cols, t->block_rows);
    if (odt == DT_BF16)
        dequant_kernel<<<grid_for(n), 256, 0, ctx.stream>>>((__nv_bfloat16 *)out, t->data, t->scale, t->rows, t->cols,
                                                            t->gran, t->block_rows, ld, t->fmt);
    else if (odt == DT_F32)
        dequant_kernel<<<grid_for(n), 256, 0, ctx.stream>>>((float *)out, t->data, t->scale, t->rows, t->cols, t->gran,
                                                            t->block_rows, ld, t->fmt);
    else die("fp8_dequantize_cuda: output must be bf16 or f32, got %s", dtype_name(odt));
    launchCheck();
}

// ----------------------------------------------------------------------------
// hand-written GEMM kernels: Y[M,N] = X[M,K] W[N,K]^T
// Both take the scale layouts of fp8.h. For BLOCK a partial sum is kept per 128-wide K
// step and promoted into the fp32 accumulator with sx[m, kb] * sw[n/128, kb], as
// DeepSeek-V3 does; for TENSOR/ROW the scales multiply once at the end.

typedef struct {
    const uint8_t *x, *w;
    const float *sx, *sw;
    int M, N, K, gran, fx, fw, ldsw, accumulate;
} GemmArgs;

__device__ __forceinline__ float sx_at(const GemmArgs &a, int m, int kb) {
    return a.gran == FP8_BLOCK ? a.sx[(size_t)kb * a.M + m] : a.gran == FP8_ROW ? a.sx[m] : a.sx[0];
}
__device__ __forceinline__ float sw_at(const GemmArgs &a, int n, int kb) {
    return a.gran == FP8_BLOCK ? a.sw[(size_t)(n / FP8_BLOCK_SIZE) * a.ldsw + kb] : a.gran == FP8_ROW ? a.sw[n] : a.sw[0];
}
template <typename T>
__device__ __forceinline__ void store_out(T *y, const GemmArgs &a, int m, int n, float v) {
    size_t i = (size_t)m * a.N + n;
    if (a.accumulate) v += load_f(y, i);
    store_f(y, i, v);
}

// ---- version 2: tiled, CUDA cores. 64x64 output tile per block of 256 threads, 4x4 outputs
// per thread; a K step of 128 codes of X and W is staged in shared memory and decoded through
// a 256-entry table. Any shape. This is the fallback for what version 3 does not take.
template <typename T>
__global__ void __launch_bounds__(256) gemm_fp8_v2_kernel(T *y, GemmArgs a) {
    __shared__ uint8_t xs[64][FP8_BLOCK_SIZE + 4], ws[64][FP8_BLOCK_SIZE + 4];
    __shared__ float lutx[256], lutw[256];
    lutx[threadIdx.x] = decode_dev((uint8_t)threadIdx.x, a.fx);
    lutw[threadIdx.x] = decode_dev((uint8_t)threadIdx.x, a.fw);
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    float acc[4][4] = {}, part[4][4];
    for (int k0 = 0, kb = 0; k0 < a.K; k0 += FP8_BLOCK_SIZE, kb++) {
        __syncthreads();
        for (int i = threadIdx.x; i < 64 * FP8_BLOCK_SIZE; i += 256) {
            int r = i / FP8_BLOCK_SIZE, k = i % FP8_BLOCK_SIZE;
            bool kin = k0 + k < a.K;
            xs[r][k] = (m0 + r < a.M && kin) ? a.x[(size_t)(m0 + r) * a.K + k0 + k] : 0;
            ws[r][k] = (n0 + r < a.N && kin) ? a.w[(size_t)(n0 + r) * a.K + k0 + k] : 0;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) part[i][j] = 0.0f;
        for (int k = 0; k < FP8_BLOCK_SIZE; k++) {
            float xv[4], wv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) xv[i] = lutx[xs[ty * 4 + i][k]];
#pragma unroll
            for (int j = 0; j < 4; j++) wv[j] = lutw[ws[tx * 4 + j][k]];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) part[i][j] += xv[i] * wv[j];
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
                if (a.gran == FP8_BLOCK) {
                    float s = (m < a.M && n < a.N) ? sx_at(a, m, kb) * sw_at(a, n, kb) : 0.0f;
                    acc[i][j] += part[i][j] * s;
                } else acc[i][j] += part[i][j];
            }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
            if (m >= a.M || n >= a.N) continue;
            float v = a.gran == FP8_BLOCK ? acc[i][j] : acc[i][j] * (sx_at(a, m, 0) * sw_at(a, n, 0));
            store_out(y, a, m, n, v);
        }
}

// ---- version 3: tensor cores through mma.sync.m16n8k32 with FP8 operands (sm_89+; on
// Hopper the fast path is wgmma, a later version). Block tile 128x128, K step 128 (one scale
// block), 8 warps as 2 (M) x 4 (N), each warp 64x32 = 4x4 mma tiles of 16x8. Tiles go
// global -> shared with cp.async, two stages, rows padded to 144 bytes so the fragment loads
// of a warp hit 32 different banks. Needs K % 16 == 0 (16-byte rows for cp.async).
#define V3_BM 128
#define V3_BN 128
#define V3_BK 128
#define V3_LDS (V3_BK + 16)
#define V3_SMEM (2 * (V3_BM + V3_BN) * V3_LDS)

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;  // 0: zero-fill the 16 bytes
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 4 : 0;  // 0: zero-fill
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

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
__global__ void __launch_bounds__(256) gemm_fp8_v3_kernel(T *y, GemmArgs a) {
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t *xs = smem, *ws = smem + 2 * V3_BM * V3_LDS;  // [stage][row][V3_LDS]
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t4 = lane & 3;     // mma fragment coordinates
    int wm = warp >> 2, wn = warp & 3;    // warp tile (64 x 32) in the block tile
    int m0 = blockIdx.y * V3_BM, n0 = blockIdx.x * V3_BN;
    int KT = cdiv(a.K, V3_BK);

    auto load_stage = [&](int stage, int kt) {
        int k0 = kt * V3_BK;
        for (int c = tid; c < V3_BM * (V3_BK / 16); c += 256) {  // 1024 chunks of 16 bytes
            int r = c >> 3, kc = (c & 7) * 16;
            bool kin = k0 + kc < a.K;
            int mr = min(m0 + r, a.M - 1), nr = min(n0 + r, a.N - 1), kk = kin ? k0 + kc : 0;
            cp_async16(xs + (stage * V3_BM + r) * V3_LDS + kc, a.x + (size_t)mr * a.K + kk, kin && m0 + r < a.M);
            cp_async16(ws + (stage * V3_BN + r) * V3_LDS + kc, a.w + (size_t)nr * a.K + kk, kin && n0 + r < a.N);
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
        const uint8_t *xt = xs + (kt & 1) * V3_BM * V3_LDS, *wt = ws + (kt & 1) * V3_BN * V3_LDS;
        if (BLOCKWISE) {
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int v = 0; v < 4; v++) part[i][j][v] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < V3_BK; kk += 32) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint8_t *p = xt + (wm * 64 + i * 16 + g) * V3_LDS + kk + t4 * 4;
                af[i][0] = *(const uint32_t *)p;
                af[i][1] = *(const uint32_t *)(p + 8 * V3_LDS);
                af[i][2] = *(const uint32_t *)(p + 16);
                af[i][3] = *(const uint32_t *)(p + 8 * V3_LDS + 16);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint8_t *p = wt + (wn * 32 + j * 8 + g) * V3_LDS + kk + t4 * 4;
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

// launchers (also used by dev/gemm_fp8.cu)
template <typename T>
static void launch_v2(T *y, const GemmArgs &a) {
    dim3 grid(cdiv(a.N, 64), cdiv(a.M, 64));
    gemm_fp8_v2_kernel<T><<<grid, 256, 0, ctx.stream>>>(y, a);
    launchCheck();
}
template <typename T, int FX, int FW, bool BW>
static void launch_v3_t(T *y, const GemmArgs &a) {
    static int attr_set = 0;  // per instantiation
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(gemm_fp8_v3_kernel<T, FX, FW, BW>, cudaFuncAttributeMaxDynamicSharedMemorySize, V3_SMEM));
        attr_set = 1;
    }
    dim3 grid(cdiv(a.N, V3_BN), cdiv(a.M, V3_BM));
    gemm_fp8_v3_kernel<T, FX, FW, BW><<<grid, 256, V3_SMEM, ctx.stream>>>(y, a);
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

static GemmArgs gemm_args(const FP8Tensor *x, const FP8Tensor *w, int accumulate) {
    GemmArgs a;
    a.x = x->data; a.w = w->data; a.sx = x->scale; a.sw = w->scale;
    a.M = x->rows; a.N = w->rows; a.K = x->cols;
    a.gran = x->gran; a.fx = x->fmt; a.fw = w->fmt;
    a.ldsw = fp8_scale_ld(w->gran, w->rows, w->cols, w->block_rows);
    a.accumulate = accumulate;
    return a;
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

static int ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (u % a)) a >>= 1;
    return a;
}
static cudaDataType_t cuda_fp8_type(int fmt) { return fmt == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
static cudaDataType_t cuda_out_type(DType t) { return t == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

static LtPlan *plan_find(int kind, int M, int N, int K, int gran, int fx, int fw, int ydt, int transa, int aa, int ab,
                         int ay) {
    for (int i = 0; i < PLAN_CACHE; i++) {
        LtPlan *p = &ctx.plans[i];
        if (p->used && p->kind == kind && p->M == M && p->N == N && p->K == K && p->gran == gran && p->fx == fx &&
            p->fw == fw && p->ydt == ydt && p->fast == ctx.fast_accum && p->transa == transa && p->align_a == aa &&
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
    p->ydt = ydt; p->fast = ctx.fast_accum; p->transa = transa; p->align_a = aa; p->align_b = ab; p->align_y = ay;
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
    return pref;
}

// build the plan's descriptor and layouts and ask the heuristic; p->ok says if it found one
static void plan_build(LtPlan *p, cudaDataType_t ta, cudaDataType_t tb, int lda) {
    cublasOperation_t opa = p->transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (p->kind == 0) {
        int8_t fast = (int8_t)p->fast;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
        cublasLtMatmulMatrixScale_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, mb = ma;
        if (p->gran == FP8_ROW) ma = mb = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if (p->gran == FP8_BLOCK) { ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; }
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
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ly, cuda_out_type((DType)p->ydt), p->N, p->M, p->N));
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
static LtPlan *fp8_plan(DType ydt, const FP8Tensor *x, const FP8Tensor *w, const void *y, char *why, size_t cap) {
    int M = x->rows, N = w->rows, K = x->cols;
    if (!ctx.has_fp8 || ctx.force_no_fp8) { snprintf(why, cap, "no FP8 tensor cores (compute capability %d)", ctx.cc); return NULL; }
    if (x->fmt == FP8_E5M2 && w->fmt == FP8_E5M2) { snprintf(why, cap, "cuBLASLt does not multiply E5M2 by E5M2"); return NULL; }
    if (K % 16) { snprintf(why, cap, "K = %d is not a multiple of 16 (cuBLASLt FP8 needs 16-byte rows)", K); return NULL; }
    if (N % (ydt == DT_BF16 ? 8 : 4)) { snprintf(why, cap, "N = %d: output rows must be 16-byte multiples", N); return NULL; }
    int aa = ptr_align(w->data), ab = ptr_align(x->data), ay = y ? ptr_align(y) : 256;
    if (aa < 16 || ab < 16 || ay < 16) { snprintf(why, cap, "operand pointers must be 16-byte aligned"); return NULL; }
    LtPlan *p = plan_find(0, M, N, K, x->gran, x->fmt, w->fmt, ydt, 1, aa, ab, ay);
    if (!p->desc) plan_build(p, cuda_fp8_type(w->fmt), cuda_fp8_type(x->fmt), K);
    if (!p->ok) { snprintf(why, cap, "%s for %dx%dx%d %s", p->why, M, N, K, fp8_gran_name((FP8Gran)x->gran)); return NULL; }
    return p;
}

int fp8_gemm_cublaslt_supported(DType ydt, const FP8Tensor *x, const FP8Tensor *w, char *why, size_t why_cap) {
    need_init();
    char tmp[256];
    if (!why) { why = tmp; why_cap = sizeof tmp; }
    return fp8_plan(ydt, x, w, NULL, why, why_cap) != NULL;
}

static void lt_matmul(LtPlan *p, const cublasLtMatmulAlgo_t *algo, void *y, const void *A, const void *B, float beta) {
    float alpha = 1.0f;
    cublasCheck(cublasLtMatmul(ctx.lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, y, p->ly, y, p->ly, algo,
                               ctx.workspace, ctx.workspace_bytes, ctx.stream));
}

static void lt_run(LtPlan *p, void *y, const void *A, const void *B, const void *sa, const void *sb, int accumulate) {
    if (p->kind == 0) {
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    }
    lt_matmul(p, &p->algo, y, A, B, accumulate ? 1.0f : 0.0f);
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
// Hopper (sm_90a): TMA + wgmma. Versions 6 and 7 of dev/gemm_fp8.cu; versions 4 (TMA +
// wgmma, one warpgroup, two stages) and 5 (a producer warpgroup, two consumer warpgroups,
// five stages, one tile per block) live there and use the pieces below.
//
// Why a new kernel: on sm_90 the FP8 mma.sync of version 3 is emulated (widened to f16
// HMMA); the FP8 tensor-core rate is reached only through wgmma, which reads its operands
// from shared memory through a "matrix descriptor", and whose tiles are fed by the TMA copy
// engine (cp.async.bulk.tensor) completing on mbarriers.
//
// The plan of version 6, for Y[M,N] = X[M,K] W[N,K]^T, both operands K-major:
// - output tile 128 (M) x BN (N), BN = 128; K step 128 = one scale block = one 128-byte row
//   of codes;
// - 384 threads = 3 warpgroups. Warpgroup 0 is the producer: one thread issues two TMA loads
//   per K step (X: 128 rows x 128 B, W: BN rows x 128 B) into a ring of 6 stages of 32 KiB,
//   each guarded by a "full" mbarrier (TMA bytes landed) and an "empty" one (8 consumer
//   warps done reading); for block scaling two more of its warps copy each step's scales
//   into the stage (wg_produce_scales; 5 stages of 33 KiB then). Warpgroups 1 and 2 are consumers, 64 output rows
//   each; setmaxnreg gives the producer 40 registers and each consumer thread 232;
// - a consumer multiplies each K step with 4 wgmma.m64nBNk32.e4m3.e4m3 into a FRESH fp32
//   accumulator (part), then promotes it into the running fp32 sum on the CUDA cores:
//   acc += part * (sx[row, kb] * sw[n/128, kb]) for block scaling (DeepSeek-V3), acc += part
//   for tensor/row scaling (their scales multiply once at the end). The promotion also bounds
//   the error of the tensor cores' reduced-precision accumulation (~14 bits, DeepSeek-V3
//   sec. 3.3.2) to one K step, as cuBLASLt does with fast accumulation off. The promotion and
//   the wait before it are what separates this kernel from cuBLASLt: without them (an
//   ablation, session 4) it ran 8192x4096x4096 in 0.85x the cycles. So each step is issued as
//   two halves of the tile's columns, each its own commit group, and the left half is
//   promoted while the right half's wgmmas run (wg_consume_tile, SPLIT). With 128 x 192
//   tiles, two K steps an iteration with their four halves pipelined (PAIRS), and for
//   tensor/row scaling the second warpgroup two steps behind the first (STAGGER), so that one's
//   promotion and epilogue overlap the other's wgmmas. (Promoting step kb while the
//   warpgroup's own wgmmas of step kb + 1 run, with two fresh accumulators in turn across the
//   loop's back edge, was tried: ptxas 13.0 then serializes every wgmma (C7514) and tensor
//   scaling fell from 1189 to 885 TFLOP/s. Strict turns between the two warpgroups, handed
//   over by named barriers at every step, cost 7-9%: dev/RESULTS.md, "Session 4");
// - persistent: one block per SM walks the tiles (grouped by 8 tile rows so that the blocks
//   running at once share X and W tiles in L2); the producer runs ahead into the next tile
//   while the consumers write the last one;
// - epilogue (bf16 out): registers -> swizzled shared memory (stmatrix) -> TMA store, which
//   clips the rows >= M and columns >= N; f32 output or Y += goes straight from registers.
//   Row scaling's scales reach shared memory by cp.async during the main loop (wg_epi_scales).
// Version 7 is the same kernel with BN = 192 (wgmma m64n192k32, 4 stages of 40 KiB): a
// sixth less L2 and shared-memory traffic per flop; its tiles straddle two 128-wide weight
// scale blocks, so block scaling promotes with two weight scales.
// Measured on the H100 at M = 8192 (dev/RESULTS.md, "Hopper wgmma kernel", "Session 4" and
// "Session 5"), with the version wgmma_version() picks (session 5): block 932-1055 TFLOP/s
// (0.86-1.09x cuBLASLt), tensor 1091-1221 (0.88-1.07x), row 1038-1157 (0.90-1.07x); the
// 1.07-1.09x at 8192 x 3072 x 1024, where AUTO takes it. The history of block scaling: scales
// loaded by the consumers (block 623-782), then prefetched a step ahead (661-872: the
// scoreboard, see wg_produce_scales), then staged by the producer (910-1028).
// Shapes: rows >= M and columns >= K, N of a partial tile are zero-filled by TMA, so any M, N
// work, and any K % 16 == 0 (TMA needs 16-byte rows; a partial last K block is zero-padded).
// E4M3 x E4M3 only (the forward); other formats take the mma.sync kernel or cuBLASLt.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP8_SM90A 1  // wgmma and setmaxnreg exist only in the sm_90a target
#endif

#define WG_BM 128
#define WG_BK 128
#define WG_TILE_X (WG_BM * WG_BK)  // bytes of one stage of X (16 KiB)
#define WG_BAR_STAGGER 3          // named barrier of the consumers' stagger (versions 6/7)
#define WG_GROUP_M 8               // tile rows per group of the persistent tile order
#define WG_SC 256                 // floats of block scales per stage: sx of the 128 rows, sw of 2 weight blocks
#define WG_SCALE_WARPS 2           // producer warps staging block scales, taking the K steps in turn (3: up to +4% cycles)
// per tile width BN and granularity: bytes of block scales per stage, stages (as many as
// fit in 227 KiB), bytes of one stage of W, of the bf16 output staging, in all
template <int BN, int GRAN>
struct WgCfg {
    static constexpr int SC = GRAN == FP8_BLOCK ? WG_SC * 4 : 0;
    static constexpr int STAGES = BN == 128 ? (GRAN == FP8_BLOCK ? 5 : 6) : 4;
    static constexpr int TILE_W = BN * WG_BK;
    static constexpr int EPI = WG_BM * BN * 2;
    static constexpr int RSC = GRAN == FP8_ROW ? 64 + BN : 0;  // floats of row scales per consumer: sx of its 64 rows, sw of BN columns
    static constexpr int SMEM = STAGES * (WG_TILE_X + TILE_W + SC) + EPI + 2 * RSC * 4 + 2 * STAGES * 8 + 1024;  // + barriers, alignment
};
static_assert(WgCfg<128, FP8_BLOCK>::SMEM <= 232448 && WgCfg<128, FP8_ROW>::SMEM <= 232448 &&
                  WgCfg<192, FP8_BLOCK>::SMEM <= 232448 && WgCfg<192, FP8_ROW>::SMEM <= 232448,
              "over the 227 KiB of shared memory of a block");

// ---- PTX wrappers (sm_90a bodies; empty elsewhere, where the host never launches them) ----

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
#ifdef FP8_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
#endif
}
// make the initialised barriers visible to the async proxy (TMA) before first use
__device__ __forceinline__ void mbar_fence_init() {
#ifdef FP8_SM90A
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// arrive once and announce that `bytes` of TMA data will complete this phase
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
#ifdef FP8_SM90A
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
#ifdef FP8_SM90A
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}
// wait until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) {
#ifdef FP8_SM90A
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
#endif
}
// TMA: box at (c0 = column, c1 = row) of the tensor map -> shared memory, completing on bar
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1) : "memory");
#endif
}
// TMA: shared memory -> box at (c0, c1); OOB parts of the box are not written
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, const void *src, int c0, int c1) {
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1) : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_read0() {  // earlier stores have read their shared memory
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait0() {  // earlier stores are complete
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// ordinary shared-memory writes -> visible to the async proxy (the TMA store)
__device__ __forceinline__ void fence_proxy_async() {
#ifdef FP8_SM90A
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {  // arrive without waiting
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef FP8_SM90A
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef FP8_SM90A
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
__device__ __forceinline__ void wgmma_fence() {  // order earlier register accesses before the next wgmma
#ifdef FP8_SM90A
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef FP8_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {  // at most N committed groups still in flight
#ifdef FP8_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// stmatrix: four 8 x 8 b16 matrices from a warp's registers (mma fragment layout) to shared memory
__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#ifdef FP8_SM90A
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2),
                 "r"(r3)
                 : "memory");
#endif
}
// keep the compiler from moving accesses of the accumulators across wgmma_wait
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// wgmma shared-memory matrix descriptor of a K-major tile stored as TMA's 128-byte swizzle
// writes it: rows of 128 bytes (one K step of FP8 codes), 16-byte chunk j of row r at chunk
// j ^ (r % 8), 8-row groups of 1024 bytes (the stride-dimension offset); the tile starts on
// a 1024-byte boundary. The leading-dimension offset is unused for swizzled K-major tiles.
// Bits: [0,14) address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [62,64) swizzle (1 = 128 B).
// The k-th 32-wide slice of the K step starts 32 bytes further: descriptor + 2 * k.
__device__ __forceinline__ uint64_t wg_desc(const void *tile) {
    uint64_t d = (uint64_t)((smem_u32(tile) & 0x3FFFF) >> 4);
    d |= (uint64_t)1 << 16;
    d |= (uint64_t)(1024 >> 4) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

// D (64 x 128 fp32, per thread 64 values) (+)= A (64 x 32 e4m3, descriptor) B (128 x 32 e4m3)^T.
// accumulate = 0 overwrites D. Thread t of the warpgroup holds, for i = 0..15,
//   d[4i + 0/1] at row 16 (t / 32) + (t % 32) / 4,     columns 8i + 2 (t % 4) + 0/1
//   d[4i + 2/3] at that row + 8,                        the same columns.
#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
        "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
        : "l"(da), "l"(db), "r"(accumulate));
#endif
}

// the same with N = 192 (96 values per thread, i = 0..23)
__device__ __forceinline__ void wgmma_m64n192k32_e4m3(float (&d)[96], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
        "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
        "%96, %97, p, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56), WG_D8(64), WG_D8(72),
          WG_D8(80), WG_D8(88)
        : "l"(da), "l"(db), "r"(accumulate));
#endif
}
// halves of the tiles above (the split promotion of versions 6/7)
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
        : "l"(da), "l"(db), "r"(accumulate));
#endif
}
__device__ __forceinline__ void wgmma_m64n96k32_e4m3(float (&d)[48], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
        "%48, %49, p, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40)
        : "l"(da), "l"(db), "r"(accumulate));
#endif
}
#undef WG_D8
template <int BN>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[BN / 2], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (BN == 128) wgmma_m64n128k32_e4m3(d, da, db, accumulate);
    else if constexpr (BN == 192) wgmma_m64n192k32_e4m3(d, da, db, accumulate);
    else if constexpr (BN == 96) wgmma_m64n96k32_e4m3(d, da, db, accumulate);
    else wgmma_m64n64k32_e4m3(d, da, db, accumulate);
}

// the 4 wgmmas (k = 32 each) of one 128-wide K step of a warpgroup's 64 x BN tile into the fresh
// accumulator part (the first overwrites it), as one commit group (after a wgmma_fence)
template <int BN>
__device__ __forceinline__ void wg_issue(float (&part)[BN / 2], uint64_t da, uint64_t db) {
#pragma unroll
    for (int k = 0; k < WG_BK / 32; k++) wgmma_e4m3<BN>(part, da + 2 * k, db + 2 * k, k);
    wgmma_commit();
}
// one K step, issued and waited for (versions 4 to 8)
template <int BN>
__device__ __forceinline__ void wg_kstep(float (&part)[BN / 2], uint64_t da, uint64_t db) {
    wgmma_fence();
    wg_issue<BN>(part, da, db);
    wgmma_wait<0>();
    fence_regs(part);
}

// ---- pieces shared by versions 5, 6 and 7 ----

// the producer thread: all K steps of one tile into the stage ring
template <int BN, int GRAN>
__device__ __forceinline__ void wg_produce_tile(const CUtensorMap *tmx, const CUtensorMap *tmw, uint8_t *xs, uint8_t *ws,
                                                uint64_t *full, uint64_t *empty, int &stage, int &phase, int m0, int n0,
                                                int KB) {
    constexpr int S = WgCfg<BN, GRAN>::STAGES, TW = WgCfg<BN, GRAN>::TILE_W;
    for (int kb = 0; kb < KB; kb++) {
        mbar_wait(&empty[stage], phase ^ 1);  // the consumers released this stage (passes at once the first round)
        mbar_expect_tx(&full[stage], WG_TILE_X + TW);  // full boxes count, OOB-filled parts too
        tma_load_2d(xs + stage * WG_TILE_X, tmx, &full[stage], kb * WG_BK, m0);
        tma_load_2d(ws + stage * TW, tmw, &full[stage], kb * WG_BK, n0);
        if (++stage == S) { stage = 0; phase ^= 1; }
    }
}

// block scaling: two warps of the producer warpgroup stage each K step's scales in shared
// memory next to its tiles (sc[stage]: sx of the tile's 128 rows, then sw of the weight block
// of column n0 and, BN = 192, of the next one), taking even and odd steps in turn (three
// warps taking every third step measured 1-4% slower: session 5), and
// arrive on the stage's full barrier (32 arrivals) after their stores. Loading them in the
// consumers instead cost 35%: ptxas put the multiply by the scales between the wgmmas and,
// as all those loads share one scoreboard, it waited there for the loads of the NEXT step.
template <int BN>
__device__ __forceinline__ void wg_produce_scales(const GemmArgs &a, float *sc, uint64_t *full, uint64_t *empty, int &stage,
                                                  int &phase, int &step, int which, int m0, int n0, int KB) {
    constexpr int S = WgCfg<BN, FP8_BLOCK>::STAGES;
    int lane = threadIdx.x & 31, nbw = n0 / FP8_BLOCK_SIZE;
    int wblock = lane == 1 && BN > 128 && (nbw + 1) * FP8_BLOCK_SIZE < a.N ? nbw + 1 : nbw;
    for (int kb = 0; kb < KB; kb++, step++) {
        if (step % WG_SCALE_WARPS == which) {
            float v[4], w = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int r = m0 + 4 * lane + j;
                v[j] = r < a.M ? __ldg(a.sx + (size_t)kb * a.M + r) : 0.0f;
            }
            if (lane < 2) w = __ldg(a.sw + (size_t)wblock * a.ldsw + kb);
            mbar_wait(&empty[stage], phase ^ 1);
            float *d = sc + stage * WG_SC;
            *(float4 *)(d + 4 * lane) = make_float4(v[0], v[1], v[2], v[3]);
            if (lane < 2) d[128 + lane] = w;
            mbar_arrive(&full[stage]);  // release: the consumers' wait on full sees the stores
        }
        if (++stage == S) { stage = 0; phase ^= 1; }
    }
}

// the multipliers of one K step's promotion, per thread: f0 / f1 for the thread's rows r / r + 8
// of columns 0-63 (a), 64-127 (m) and 128-191 (b, BN = 192). Block scaling: sx of the row times
// sw of the column's weight block, read from the stage's staged scales (before the stage is
// released); tensor/row scaling: 1 (their scales multiply once, in the epilogue).
struct WgScales { float a0, a1, m0, m1, b0, b1; };
template <int GRAN, int BN>
__device__ __forceinline__ WgScales wg_step_scales(const float *sc, int stage, int rl, bool mid_b) {
    WgScales s = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    if (GRAN == FP8_BLOCK) {
        const float *d = sc + stage * WG_SC;
        float x0 = d[rl], x1 = d[rl + 8], wa = d[128];
        s.a0 = x0 * wa; s.a1 = x1 * wa;
        if (BN > 128) { float wb = d[129]; s.b0 = x0 * wb; s.b1 = x1 * wb; }
    }
    s.m0 = mid_b ? s.b0 : s.a0; s.m1 = mid_b ? s.b1 : s.a1;
    return s;
}

// acc[group i] += p[group i - first] * the scale of group i's rows and columns, for the N / 4
// column groups (8 columns each) of the tile from group `first` on
template <int BN, int N>
__device__ __forceinline__ void wg_promote(float (&acc)[BN / 2], const float (&p)[N], int first, const WgScales &s) {
#pragma unroll
    for (int j = 0; j < N / 4; j++) {
        int i = first + j;
        float f0 = i < 8 ? s.a0 : i < 16 ? s.m0 : s.b0, f1 = i < 8 ? s.a1 : i < 16 ? s.m1 : s.b1;
        acc[4 * i + 0] += p[4 * j + 0] * f0;
        acc[4 * i + 1] += p[4 * j + 1] * f0;
        acc[4 * i + 2] += p[4 * j + 2] * f1;
        acc[4 * i + 3] += p[4 * j + 3] * f1;
    }
}

// one consumer warpgroup (c = 0, 1: rows m0 + 64c ..) over all K steps of one tile: acc gets
// the promoted fp32 sum (block scaling applied; tensor/row scales not yet).
// Plain (version 5): each step's 4 wgmmas into one fresh accumulator, waited for, promoted.
// SPLIT (versions 6, 7): the step as two halves of the tile's columns (m64n64 / m64n96 wgmmas),
// L and R, each its own commit group, so L is promoted while R's wgmmas still run.
// PAIRS (with SPLIT): two steps an iteration, a and b, their halves pipelined: issue La Ra |
// promote La, issue Lb | promote Ra, issue Rb | promote Lb | promote Rb, so the warpgroup drains
// its wgmmas once per two steps instead of every step. (Across the loop's back edge ptxas
// would serialize every wgmma: the chain must end inside the iteration.) With tensor/row
// scaling the tile's first step (a of the first pair) accumulates straight into acc, which
// spares zeroing acc and promoting that step: tensor -2 to -4%, row 0 to -2.5% cycles (dev/
// RESULTS.md, "Session 8"); block scaling must scale every step (in place it measured +4-7%).
// It is a peeled first pair, not a branch in the loop: choosing the wgmmas' registers at run
// time makes ptxas serialize them (C7520).
// STAGGER = d > 0: warpgroup 1 starts its first step once warpgroup 0 has finished d steps, so
// that the two run about d steps apart for the rest of the kernel (see the kernel).
template <int GRAN, int BN, bool SPLIT = false, int STAGGER = 0, bool PAIRS = false>
__device__ __forceinline__ void wg_consume_tile(float (&acc)[BN / 2], const GemmArgs &a, const uint8_t *xs, const uint8_t *ws,
                                                const float *sc, uint64_t *full, uint64_t *empty, int &stage, int &phase,
                                                int n0, int c, int KB, bool first_tile = false) {
    constexpr int S = WgCfg<BN, GRAN>::STAGES, TW = WgCfg<BN, GRAN>::TILE_W;
    constexpr uint64_t RIGHT = (BN / 2) * WG_BK >> 4;  // descriptor offset of rows BN / 2.. of the W tile
    constexpr bool FIRST_INTO_ACC = SPLIT && PAIRS && GRAN != FP8_BLOCK;
    int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, rl = c * 64 + warp * 16 + (lane >> 2);
    // columns 8i.. of the tile use the second weight scale from i = 16 on, or from i = 8 when
    // n0 is 64 past a 128 boundary (BN = 192, odd tiles)
    bool mid_b = BN > 128 && n0 % FP8_BLOCK_SIZE != 0;
    auto release = [&]() {  // this warp is done with the stage: next stage
        if (lane == 0) mbar_arrive(&empty[stage]);
        if (++stage == S) { stage = 0; phase ^= 1; }
    };
    // the second step of a pair (kb + 1, stage + 1), issued while the first's right half ra still
    // runs: issue Lb | promote ra (promote_a; not when ra is acc's own) | issue Rb | promote Lb, Rb
    auto pair_second = [&](float(&pl)[BN / 4], float(&pr)[BN / 4], float(&ra)[BN / 4], bool promote_a, const WgScales &s) {
        int st = stage + 1 == S ? 0 : stage + 1, ph = stage + 1 == S ? phase ^ 1 : phase;
        mbar_wait(&full[st], ph);
        WgScales s2 = wg_step_scales<GRAN, BN>(sc, st, rl, mid_b);
        uint64_t da2 = wg_desc(xs + st * WG_TILE_X + c * 64 * WG_BK), db2 = wg_desc(ws + st * TW);
        wgmma_fence();
        wg_issue<BN / 2>(pl, da2, db2);
        wgmma_wait<1>();
        fence_regs(ra);
        release();
        if (promote_a) wg_promote<BN, BN / 4>(acc, ra, BN / 16, s);
        wgmma_fence();
        wg_issue<BN / 2>(pr, da2, db2 + RIGHT);
        wgmma_wait<1>();
        fence_regs(pl);
        wg_promote<BN, BN / 4>(acc, pl, 0, s2);
        wgmma_wait<0>();
        fence_regs(pr);
        release();
        wg_promote<BN, BN / 4>(acc, pr, BN / 16, s2);
    };
    int kb = 0;
    if constexpr (FIRST_INTO_ACC) {  // the tile's first step (or pair) with step 0's halves acc's own
        float(&al)[BN / 4] = *reinterpret_cast<float(*)[BN / 4]>(&acc[0]);
        float(&ar)[BN / 4] = *reinterpret_cast<float(*)[BN / 4]>(&acc[BN / 4]);
        mbar_wait(&full[stage], phase);
        WgScales s = wg_step_scales<GRAN, BN>(sc, stage, rl, mid_b);
        if (STAGGER && first_tile && c == 1) named_bar_sync(WG_BAR_STAGGER, 256);
        uint64_t da = wg_desc(xs + stage * WG_TILE_X + c * 64 * WG_BK), db = wg_desc(ws + stage * TW);
        wgmma_fence();
        wg_issue<BN / 2>(al, da, db);
        wg_issue<BN / 2>(ar, da, db + RIGHT);
        wgmma_wait<1>();
        fence_regs(al);
        if (KB > 1) {
            float pl[BN / 4], pr[BN / 4];
            pair_second(pl, pr, ar, false, s);
            kb = 2;
        } else {
            wgmma_wait<0>();
            fence_regs(ar);
            release();
            kb = 1;
        }
        if (STAGGER && first_tile && c == 0 && kb >= min(STAGGER, KB)) named_bar_arrive(WG_BAR_STAGGER, 256);
    } else {
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
    }
    while (kb < KB) {
        const int kb0 = kb;
        mbar_wait(&full[stage], phase);
        WgScales s = wg_step_scales<GRAN, BN>(sc, stage, rl, mid_b);
        if (STAGGER && first_tile && c == 1 && kb == 0) named_bar_sync(WG_BAR_STAGGER, 256);
        uint64_t da = wg_desc(xs + stage * WG_TILE_X + c * 64 * WG_BK), db = wg_desc(ws + stage * TW);
        if constexpr (SPLIT) {
            float pl[BN / 4], pr[BN / 4];
            wgmma_fence();
            wg_issue<BN / 2>(pl, da, db);
            wg_issue<BN / 2>(pr, da, db + RIGHT);
            wgmma_wait<1>();
            fence_regs(pl);
            wg_promote<BN, BN / 4>(acc, pl, 0, s);
            if (PAIRS && kb + 1 < KB) {
                pair_second(pl, pr, pr, true, s);
                kb++;
            } else {
                wgmma_wait<0>();
                fence_regs(pr);
                release();
                wg_promote<BN, BN / 4>(acc, pr, BN / 16, s);
            }
        } else {
            float part[BN / 2];
            wg_kstep<BN>(part, da, db);
            release();
            wg_promote<BN, BN / 2>(acc, part, 0, s);
        }
        kb++;
        if (STAGGER && first_tile && c == 0 && kb0 < STAGGER && kb >= min(STAGGER, KB))
            named_bar_arrive(WG_BAR_STAGGER, 256);
    }
}

// scales the epilogue multiplies by, fetched before the main loop so that their latency hides
// behind it. Tensor: sx sw (fr, registers). Row: sx of this warpgroup's 64 rows and sw of the
// tile's BN columns, copied into shared memory (rsc) by cp.async: no registers held through
// the main loop (with BN = 192 there are none to spare), and no load latency at the epilogue
// (loaded there, between the stores, they cost row scaling 0.6x at K = 1024). rsc is free:
// the previous tile's epilogue finished reading it before its last barrier.
template <int GRAN, int BN>
__device__ __forceinline__ void wg_epi_scales(float (&fr)[2], float *rsc, const GemmArgs &a, int m0, int n0) {
    int tid = threadIdx.x & 127;
    if (GRAN == FP8_TENSOR) fr[0] = fr[1] = __ldg(a.sx) * __ldg(a.sw);
    if (GRAN == FP8_ROW) {
        if (tid < 64) cp_async4(rsc + tid, a.sx + min(m0 + tid, a.M - 1), m0 + tid < a.M);
        for (int j = tid; j < BN; j += 128) cp_async4(rsc + 64 + j, a.sw + min(n0 + j, a.N - 1), n0 + j < a.N);
        cp_async_commit();
    }
}

// epilogue straight from registers (any T, Y += with a.accumulate): thread rows r0 and r0 + 8
template <typename T, int GRAN, int BN>
__device__ __forceinline__ void wg_store_direct(T *y, const GemmArgs &a, const float (&acc)[BN / 2], int r0, int n0) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < BN / 8; i++)
#pragma unroll
        for (int v = 0; v < 4; v++) {
            int m = r0 + (v >= 2 ? 8 : 0), n = n0 + 8 * i + 2 * (lane & 3) + (v & 1);
            if (m >= a.M || n >= a.N) continue;
            float val = GRAN == FP8_BLOCK ? acc[4 * i + v] : acc[4 * i + v] * (sx_at(a, m, 0) * sw_at(a, n, 0));
            store_out(y, a, m, n, val);
        }
}

// epilogue through shared memory: this warpgroup's 64 x BN bf16 block as BN / 64 boxes of
// 64 x 64 in TMA's 128-byte swizzle, then one thread issues the TMA stores. The stores are
// stmatrix: a warp writes four 8 x 8 bf16 matrices an instruction (column groups i and i + 1,
// rows 0-7 and 8-15 of the warp: exactly the accumulator's fragments), lane l giving the
// address of row l % 8 of matrix l / 8; a quarter of the store instructions of 32-bit stores,
// and conflict-free, as the swizzle puts a matrix's 8 rows of 16 bytes in 8 different chunks.
template <int GRAN, int BN>
__device__ __forceinline__ void wg_store_tma(const CUtensorMap *tmy, uint8_t *ys, const GemmArgs &a, const float (&acc)[BN / 2],
                                             const float (&fr)[2], const float *rsc, int m0, int n0, int c) {
    int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) bulk_wait_read0();  // the previous tile's stores have read the buffer
    if (GRAN == FP8_ROW) cp_async_wait<0>();  // this thread's row scales have landed (the barrier: everyone's)
    named_bar_sync(1 + c, 128);
    float s0 = GRAN == FP8_BLOCK ? 1.0f : fr[0], s1 = GRAN == FP8_BLOCK ? 1.0f : fr[1];  // block: applied in the main loop
    // row: the thread's sx and sw, all read before the first stmatrix (whose "memory" clobber
    // would otherwise leave each read's latency between two stores: +10% cycles at K = 1024)
    float2 w[GRAN == FP8_ROW ? BN / 8 : 1];
    if (GRAN == FP8_ROW) {
        int rl = warp * 16 + (lane >> 2);
        s0 = rsc[rl]; s1 = rsc[rl + 8];
#pragma unroll
        for (int g = 0; g < BN / 8; g++) w[g] = *(const float2 *)(rsc + 64 + 8 * g + 2 * (lane & 3));
    }
    int srow = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), scol = lane >> 4;
#pragma unroll
    for (int i = 0; i < BN / 8; i += 2) {
        uint32_t r[4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int g = i + h;
            float f00 = s0, f01 = s0, f10 = s1, f11 = s1;
            if (GRAN == FP8_ROW) {  // acc * (sx sw), as the reference
                f00 = s0 * w[g].x; f01 = s0 * w[g].y; f10 = s1 * w[g].x; f11 = s1 * w[g].y;
            }
            float v0 = acc[4 * g] * f00, v1 = acc[4 * g + 1] * f01, v2 = acc[4 * g + 2] * f10, v3 = acc[4 * g + 3] * f11;
            __nv_bfloat162 lo = __floats2bfloat162_rn(v0, v1), hi = __floats2bfloat162_rn(v2, v3);
            r[2 * h] = *(uint32_t *)&lo;
            r[2 * h + 1] = *(uint32_t *)&hi;
        }
        int ch = i + scol;  // 16-byte chunk (8 columns) of this lane's row
        stsm_x4(smem_u32(ys + (ch >> 3) * 8192 + srow * 128 + (((ch & 7) ^ (srow & 7)) << 4)), r[0], r[1], r[2], r[3]);
    }
    fence_proxy_async();
    named_bar_sync(1 + c, 128);
    if (tid == 0 && m0 < a.M) {
#pragma unroll
        for (int h = 0; h < BN / 64; h++)
            if (n0 + 64 * h < a.N) tma_store_2d(tmy, ys + 8192 * h, n0 + 64 * h, m0);
        bulk_commit();
    }
}

// a block's walk through the persistent tile order: groups of WG_GROUP_M tile rows, column by
// column within a group; the block takes tiles blockIdx.x, + gridDim.x, ... So the position
// (group g, rank r in it) advances by subtraction: the two integer divisions of computing it
// from scratch were a ~25-instruction dependent chain each at every tile start, which cost
// version 7 1-3% of its cycles at K = 1024 and version 6 1-6% (dev/RESULTS.md, "Session 8").
// Only a last, partial group of rows divides.
struct WgTileWalk {
    int g, r, per_group, mblocks;
    __device__ WgTileWalk(int t, int mblocks_, int nblocks) : mblocks(mblocks_) {
        per_group = WG_GROUP_M * nblocks;
        g = t / per_group;
        r = t - g * per_group;
    }
    __device__ void tile(int &mb, int &nb) const {
        static_assert(WG_GROUP_M == 8, "the full-group path below shifts by 3");
        int first = g * WG_GROUP_M, rows = min(mblocks - first, WG_GROUP_M);
        if (rows == WG_GROUP_M) { mb = first + (r & 7); nb = r >> 3; }
        else { mb = first + r % rows; nb = r / rows; }
    }
    __device__ void next(int step) {
        for (r += step; r >= per_group; g++) r -= per_group;
    }
};

// ---- versions 6 (BN = 128) and 7 (BN = 192): persistent, warp-specialized, TMA-store
// epilogue (TMA_OUT: bf16, Y =) ----
template <typename T, int GRAN, int BN, bool TMA_OUT>
__global__ void __launch_bounds__(384, 1)
    gemm_fp8_v6_kernel(T *y, const GemmArgs a, const __grid_constant__ CUtensorMap tmx,
                       const __grid_constant__ CUtensorMap tmw, const __grid_constant__ CUtensorMap tmy) {
#ifdef FP8_SM90A
    using Cfg = WgCfg<BN, GRAN>;
    constexpr int S = Cfg::STAGES;
    // the consumers' K step (wg_consume_tile), as measured (ncu cycles, dev/RESULTS.md
    // "Session 5"): split promotion always; with 128 x 192 tiles, K steps in pairs (-2 to -4%
    // with block scaling, and with the stagger below -3 to -9% with tensor scaling at K <= 4096)
    // and, for tensor/row scaling, the second warpgroup two steps behind the first (one step:
    // session 4; two: a further -2 to -3%; three leave the first warpgroup no loaded stage
    // ahead of it in 4). With 128 x 128 tiles neither paid (pairs: +2 to +10% at
    // 8192x4096x4096; stagger +1 to +10%); with block scaling, no stagger (+2 to +8%).
    constexpr bool PAIRS = BN > 128;
    constexpr int STAGGER = BN > 128 && GRAN != FP8_BLOCK ? 2 : 0;
    extern __shared__ uint8_t smem_raw[];
    // 128-byte swizzle: 1 KiB aligned. Offsetting smem_raw (not casting through an integer)
    // keeps the pointer in the shared space: LDS/STS, not generic LD/ST
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint8_t *xs = smem;                            // [stage][128 rows][128 B]
    uint8_t *ws = xs + S * WG_TILE_X;              // [stage][BN rows][128 B]
    uint8_t *ys = ws + S * Cfg::TILE_W;            // [consumer][BN / 64 boxes][64 rows][64 bf16]
    float *rsc = (float *)(ys + Cfg::EPI);          // [consumer][64 + BN] row scales (row scaling only)
    float *sc = rsc + 2 * Cfg::RSC;                 // [stage][WG_SC] block scales (block scaling only)
    uint64_t *full = (uint64_t *)((uint8_t *)sc + S * Cfg::SC), *empty = full + S;
    int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    int mblocks = cdiv(a.M, WG_BM), nblocks = cdiv(a.N, BN), tiles = mblocks * nblocks, KB = cdiv(a.K, WG_BK);
    if (threadIdx.x == 0) {
        // full: the TMA thread's arrival (+ bytes), and for block scaling a scale warp's 32
        for (int s = 0; s < S; s++) { mbar_init(&full[s], GRAN == FP8_BLOCK ? 33 : 1); mbar_init(&empty[s], 8); }
        mbar_fence_init();
    }
    __syncthreads();
    int stage = 0, phase = 0;
    if (wg == 0) {  // producer: thread 0 the TMA loads, warps 1 and 2 the block scales
        setmaxnreg_dec<40>();
        int warp = tid >> 5, step = 0;
        if (tid == 0 || (GRAN == FP8_BLOCK && warp >= 1 && warp <= WG_SCALE_WARPS)) {
            WgTileWalk walk(blockIdx.x, mblocks, nblocks);
            for (int t = blockIdx.x; t < tiles; t += gridDim.x, walk.next(gridDim.x)) {
                int mb, nb;
                walk.tile(mb, nb);
                if (tid == 0) wg_produce_tile<BN, GRAN>(&tmx, &tmw, xs, ws, full, empty, stage, phase, mb * WG_BM, nb * BN, KB);
                else wg_produce_scales<BN>(a, sc, full, empty, stage, phase, step, warp - 1, mb * WG_BM, nb * BN, KB);
            }
        }
    } else {  // consumers
        setmaxnreg_inc<232>();
        int c = wg - 1, lane = tid & 31, warp = tid >> 5;
        float acc[BN / 2], fr[2];
        float *my_rsc = rsc + c * Cfg::RSC;
        WgTileWalk walk(blockIdx.x, mblocks, nblocks);
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, walk.next(gridDim.x)) {
            int mb, nb;
            walk.tile(mb, nb);
            int m0 = mb * WG_BM, n0 = nb * BN, r0 = m0 + 64 * c + 16 * warp + (lane >> 2);
            if (TMA_OUT) wg_epi_scales<GRAN, BN>(fr, my_rsc, a, m0 + 64 * c, n0);
            wg_consume_tile<GRAN, BN, true, STAGGER, PAIRS>(acc, a, xs, ws, sc, full, empty, stage, phase, n0, c, KB, t == (int)blockIdx.x);
            if (TMA_OUT) wg_store_tma<GRAN, BN>(&tmy, ys + c * (Cfg::EPI / 2), a, acc, fr, my_rsc, m0 + 64 * c, n0, c);
            else wg_store_direct<T, GRAN, BN>(y, a, acc, r0, n0);
        }
        if (TMA_OUT && tid == 0) bulk_wait0();
    }
#endif
}

// ---- version 8: the decode kernel (small M): one 64-row tile, split-K over a cluster ----
// A decode step multiplies a few dozen tokens (M <= 64) by every weight once: the time is the
// time to stream W from memory. Versions 6/7 give each 128 x 128 output tile to one block
// walking all of K, so at N = 4096 only 32 SMs read; cuBLASLt reads the 8B weights at
// 1.0-2.2 TB/s (dev/RESULTS.md, "The FP8 GEMM at M = 64"). Here:
// - a block owns a 64 x 128 output tile (one wgmma.m64n128k32 row of warps) and a slice of K:
//   the ks blocks of one tile form a thread-block cluster (ks <= 8), as many as still let every
//   cluster run at once (decode_splits; two blocks fit on an SM by shared memory);
// - warp 4 is the producer: its lane 0 streams the slice's K steps (X 64 x 128 B, W 128 x 128 B)
//   through a ring of 4 stages by TMA, as in version 6; warps 0-3 (one warpgroup) multiply each
//   step into a fresh accumulator and promote it as version 6 does (block scales staged in
//   shared memory once, at the start: at most DK_MAXSTEPS steps per block);
// - the splits are summed through distributed shared memory: each block leaves its fp32 tile in
//   its own shared memory, the cluster synchronizes, and block r adds up its 1/ks share of the
//   tile from all ks blocks in split order (the same order whichever block finishes first:
//   results do not depend on timing), then scales (row / tensor) and stores it. No global
//   workspace, no second kernel.
// Measured on the H100 (dev/RESULTS.md, "Session 3"): faster than cuBLASLt on the narrow
// products with a long K (1024 x 3072: 9.5 vs 14.3 us), as fast on 4096 x 4096, slower on the
// widest (24576 x 4096: 48 vs 46 us); its loads, like cuBLASLt's, stream at ~2.1-2.2 TB/s there.
#define DK_BM 64
#define DK_BN 128
#define DK_STAGES 4
#define DK_MAXSTEPS 32      // K steps (of 128) per block: the block scales staged at the start
#define DK_MAXSPLIT 8       // blocks per cluster (the portable maximum)
#define DK_TILE_X (DK_BM * WG_BK)
#define DK_TILE_W (DK_BN * WG_BK)
#define DK_LDR (DK_BN + 8)  // row stride (floats) of the reduction tile: float2 stores hit 32 banks
#define DK_SMEM (DK_STAGES * (DK_TILE_X + DK_TILE_W) + DK_MAXSTEPS * (DK_BM + 1) * 4 + 2 * DK_STAGES * 8 + 1024)
static_assert(DK_BM * DK_LDR * 4 <= DK_STAGES * (DK_TILE_X + DK_TILE_W), "the reduction tile overlays the stages");
static_assert(2 * (DK_SMEM + 1024) <= 233472, "two blocks per SM");

template <typename T, int GRAN>
__global__ void __launch_bounds__(160, 2)
    gemm_fp8_decode_kernel(T *y, const GemmArgs a, const __grid_constant__ CUtensorMap tmx,
                           const __grid_constant__ CUtensorMap tmw) {
#ifdef FP8_SM90A
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint8_t *xs = smem;                                      // [stage][64 rows][128 B]
    uint8_t *ws = xs + DK_STAGES * DK_TILE_X;                // [stage][128 rows][128 B]
    float *red = (float *)smem;                              // [64][DK_LDR] after the main loop
    float *scx = (float *)(ws + DK_STAGES * DK_TILE_W);      // [step][64] sx of the tile's rows
    float *scw = scx + DK_MAXSTEPS * DK_BM;                  // [step] sw of the tile's weight block
    uint64_t *full = (uint64_t *)(scw + DK_MAXSTEPS), *empty = full + DK_STAGES;
    cg::cluster_group cluster = cg::this_cluster();
    const int split = blockIdx.x, ks = gridDim.x, m0 = blockIdx.z * DK_BM, n0 = blockIdx.y * DK_BN;
    const int KB = cdiv(a.K, WG_BK), kb0 = (int)((long)KB * split / ks), steps = (int)((long)KB * (split + 1) / ks) - kb0;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (int s = 0; s < DK_STAGES; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 4); }
        mbar_fence_init();
    }
    __syncthreads();
    if (warp == 4) {  // producer
        if (lane == 0)
            for (int s = 0, stage = 0, phase = 0; s < steps; s++) {
                mbar_wait(&empty[stage], phase ^ 1);
                mbar_expect_tx(&full[stage], DK_TILE_X + DK_TILE_W);
                tma_load_2d(xs + stage * DK_TILE_X, &tmx, &full[stage], (kb0 + s) * WG_BK, m0);
                tma_load_2d(ws + stage * DK_TILE_W, &tmw, &full[stage], (kb0 + s) * WG_BK, n0);
                if (++stage == DK_STAGES) { stage = 0; phase ^= 1; }
            }
    } else {  // consumers: thread rows rl and rl + 8, columns 8i + 2 (lane % 4) + 0/1
        float acc[DK_BN / 2], part[DK_BN / 2];
        const int rl = warp * 16 + (lane >> 2);
        if (GRAN == FP8_BLOCK) {  // the block scales, while the producer's first loads are in flight
            for (int i = tid; i < steps * DK_BM; i += 128) {
                int s = i / DK_BM, r = m0 + i % DK_BM;
                scx[i] = r < a.M ? __ldg(a.sx + (size_t)(kb0 + s) * a.M + r) : 0.0f;
            }
            for (int s = tid; s < steps; s += 128) scw[s] = __ldg(a.sw + (size_t)blockIdx.y * a.ldsw + kb0 + s);
            named_bar_sync(1, 128);
        }
#pragma unroll
        for (int i = 0; i < DK_BN / 2; i++) acc[i] = 0.0f;
        // one K step: its 4 wgmmas into a fresh accumulator, wait for them, release the stage,
        // promote. The wait serializes a block's steps (~0.5 us each on the H100: the wgmmas'
        // latency); the second block on the SM fills the gap. (Issuing step s + 1 before promoting
        // step s, with two accumulators in turn, makes ptxas serialize every wgmma: C7514.)
        for (int s = 0, stage = 0, phase = 0; s < steps; s++) {
            mbar_wait(&full[stage], phase);
            wg_kstep<DK_BN>(part, wg_desc(xs + stage * DK_TILE_X), wg_desc(ws + stage * DK_TILE_W));
            if (lane == 0) mbar_arrive(&empty[stage]);
            if (++stage == DK_STAGES) { stage = 0; phase ^= 1; }
            float f0 = 1.0f, f1 = 1.0f;
            if (GRAN == FP8_BLOCK) { f0 = scx[s * DK_BM + rl] * scw[s]; f1 = scx[s * DK_BM + rl + 8] * scw[s]; }
#pragma unroll
            for (int i = 0; i < DK_BN / 8; i++) {
                acc[4 * i + 0] += part[4 * i + 0] * f0;
                acc[4 * i + 1] += part[4 * i + 1] * f0;
                acc[4 * i + 2] += part[4 * i + 2] * f1;
                acc[4 * i + 3] += part[4 * i + 3] * f1;
            }
        }
        named_bar_sync(1, 128);  // every consumer is past the last wgmma: the stages can be overwritten
#pragma unroll
        for (int i = 0; i < DK_BN / 8; i++) {
            int c = 8 * i + 2 * (lane & 3);
            *(float2 *)(red + rl * DK_LDR + c) = make_float2(acc[4 * i], acc[4 * i + 1]);
            *(float2 *)(red + (rl + 8) * DK_LDR + c) = make_float2(acc[4 * i + 2], acc[4 * i + 3]);
        }
    }
    cluster.sync();  // every block's partial tile is in its shared memory
    const int Q = DK_BM * DK_BN / 4, q1 = (int)((long)Q * (split + 1) / ks);
    const bool vec = sizeof(T) == 2 && !a.accumulate && a.N % 4 == 0;
    for (int q = (int)((long)Q * split / ks) + tid; q < q1; q += blockDim.x) {
        int r = q / (DK_BN / 4), c = 4 * (q % (DK_BN / 4)), m = m0 + r, n = n0 + c;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int j = 0; j < ks; j++) {
            float4 p = *(const float4 *)(cluster.map_shared_rank(red, j) + r * DK_LDR + c);
            v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
        }
        if (m >= a.M) continue;
        float o[4] = {v.x, v.y, v.z, v.w};
        if (GRAN != FP8_BLOCK) {
            float fx = GRAN == FP8_ROW ? __ldg(a.sx + m) : __ldg(a.sx);
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (n + e < a.N) o[e] *= fx * (GRAN == FP8_ROW ? __ldg(a.sw + n + e) : __ldg(a.sw));
        }
        if (vec && n + 3 < a.N) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(o[0], o[1]), hi = __floats2bfloat162_rn(o[2], o[3]);
            uint2 u = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
            *(uint2 *)((__nv_bfloat16 *)y + (size_t)m * a.N + n) = u;
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (n + e < a.N) store_out(y, a, m, n + e, o[e]);
        }
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
#endif
}

// ---- host side ----

// 1 if this build holds sm_90a code for the kernels (a plain sm_90 build compiles them empty)
__global__ void sm90a_probe_kernel(int *out) {
#ifdef FP8_SM90A
    *out = 1;
#else
    *out = 0;
#endif
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled;  // from the driver, without linking libcuda

// whether the wgmma kernels can run on this GPU and build (once, at init)
static int wgmma_probe(void) {
    if (ctx.cc != 90) return 0;
    int *d, h = 0;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) { cudaGetLastError(); return 0; }
    sm90a_probe_kernel<<<1, 1, 0, ctx.stream>>>(d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess || !h) {
        cudaGetLastError();
        fprintf(stderr, "fp8: this build has no sm_90a code (build with GPU_ARCH=90a or all): the Hopper wgmma "
                        "kernel is off, cuBLASLt and the mma.sync kernel remain\n");
        return 0;
    }
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        cudaGetLastError();
        fprintf(stderr, "fp8: the driver has no cuTensorMapEncodeTiled: the Hopper wgmma kernel is off\n");
        return 0;
    }
    encode_tiled = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    return 1;
}

// a 2-D row-major tensor (rows, cols) of esz-byte elements read or written in boxes of
// (box_rows, box_cols) with the 128-byte swizzle; out-of-bounds reads give zeros
static CUtensorMap tmap_2d(const void *base, CUtensorMapDataType dt, int esz, int rows, int cols, int box_rows, int box_cols) {
    CUtensorMap m;
    cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)cols * esz};
    cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, estride[2] = {1, 1};
    CUresult r = encode_tiled(&m, dt, 2, (void *)base, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) die("cuTensorMapEncodeTiled failed (CUresult %d) for a %d x %d tensor at %p", (int)r, rows, cols, base);
    return m;
}

// whether the wgmma kernel runs this product, and if not why
static int wgmma_supported(const FP8Tensor *x, const FP8Tensor *w, char *why, size_t cap) {
    if (!ctx.wgmma) { snprintf(why, cap, "no sm_90a GPU and build (wgmma)"); return 0; }
    if (x->fmt != FP8_E4M3 || w->fmt != FP8_E4M3) { snprintf(why, cap, "the wgmma kernel multiplies E4M3 by E4M3 only"); return 0; }
    if (x->cols % 16) { snprintf(why, cap, "K = %d is not a multiple of 16 (TMA needs 16-byte rows)", x->cols); return 0; }
    if (ptr_align(x->data) < 16 || ptr_align(w->data) < 16) { snprintf(why, cap, "operands must be 16-byte aligned for TMA"); return 0; }
    return 1;
}

int fp8_gemm_wgmma_supported(const FP8Tensor *x, const FP8Tensor *w, char *why, size_t why_cap) {
    need_init();
    char tmp[256];
    if (!why) { why = tmp; why_cap = sizeof tmp; }
    return wgmma_supported(x, w, why, why_cap);
}

template <typename T, int GRAN, int BN, bool TMA_OUT>
static void launch_v6_t(T *y, const GemmArgs &a) {
    static int attr_set = 0;  // per instantiation
    auto kern = gemm_fp8_v6_kernel<T, GRAN, BN, TMA_OUT>;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, WgCfg<BN, GRAN>::SMEM));
        attr_set = 1;
    }
    CUtensorMap tx = tmap_2d(a.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.M, a.K, WG_BM, WG_BK);
    CUtensorMap tw = tmap_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.N, a.K, BN, WG_BK);
    CUtensorMap ty = TMA_OUT ? tmap_2d(y, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.M, a.N, 64, 64) : tx;
    int tiles = cdiv(a.M, WG_BM) * cdiv(a.N, BN), grid = tiles < ctx.sms ? tiles : ctx.sms;
    kern<<<grid, 384, WgCfg<BN, GRAN>::SMEM, ctx.stream>>>(y, a, tx, tw, ty);
    launchCheck();
}

template <typename T, int BN, bool TMA_OUT>
static void launch_v6_g(T *y, const GemmArgs &a) {
    if (a.gran == FP8_BLOCK) launch_v6_t<T, FP8_BLOCK, BN, TMA_OUT>(y, a);
    else if (a.gran == FP8_ROW) launch_v6_t<T, FP8_ROW, BN, TMA_OUT>(y, a);
    else launch_v6_t<T, FP8_TENSOR, BN, TMA_OUT>(y, a);
}
template <int BN>
static void launch_v6_n(void *y, DType ydt, const GemmArgs &a) {
    // the TMA-store epilogue needs bf16, Y = (not +=), 16-byte output rows and pointer
    if (ydt == DT_BF16 && !a.accumulate && a.N % 8 == 0 && ptr_align(y) >= 16) launch_v6_g<__nv_bfloat16, BN, true>((__nv_bfloat16 *)y, a);
    else if (ydt == DT_BF16) launch_v6_g<__nv_bfloat16, BN, false>((__nv_bfloat16 *)y, a);
    else launch_v6_g<float, BN, false>((float *)y, a);
}
// version 6 (128 x 128 tiles) or 7 (128 x 192)
static void launch_v6(void *y, DType ydt, const GemmArgs &a, int version) {
    if (version == 7) launch_v6_n<192>(y, ydt, a);
    else launch_v6_n<128>(y, ydt, a);
}

// ---- version 8 (decode) host side ----

// whether the decode kernel runs this product, and if not why (the wgmma kernel's rules, and K
// within DK_MAXSPLIT x DK_MAXSTEPS steps of 128)
static int decode_supported(const FP8Tensor *x, const FP8Tensor *w, char *why, size_t cap) {
    if (!wgmma_supported(x, w, why, cap)) return 0;
    if (cdiv(x->cols, WG_BK) > DK_MAXSPLIT * DK_MAXSTEPS) {
        snprintf(why, cap, "K = %d is over the decode kernel's %d", x->cols, DK_MAXSPLIT * DK_MAXSTEPS * WG_BK);
        return 0;
    }
    return 1;
}

// K splits ks (blocks per cluster). All of a product's blocks should run in one wave: a second,
// partial wave costs as much as the first (measured: 12288 x 4096 with 3 splits, 288 blocks where 264
// fit, 35 us; with 2, 29.5 us). So ks is the largest (up to DK_MAXSPLIT, and each block at least
// two K steps) whose clusters all fit at once (maxc[ks]: cudaOccupancyMaxActiveClusters, which
// knows the GPC limits: 30 clusters of 8 on the H100, not 132 * 2 / 8 = 33), and at least what
// keeps a block within DK_MAXSTEPS steps. fp8_cuda_set_decode_split forces it.
static int decode_splits(int M, int N, int K, const int *maxc) {
    int tiles = cdiv(M, DK_BM) * cdiv(N, DK_BN), KB = cdiv(K, WG_BK), ks = 1;
    if (ctx.dk_split > 0) ks = ctx.dk_split;
    else
        for (int k = 2; k <= DK_MAXSPLIT && 2 * k <= KB; k++)
            if (tiles <= maxc[k]) ks = k;
    if (ks > DK_MAXSPLIT) ks = DK_MAXSPLIT;
    if (ks > KB) ks = KB;
    while (cdiv(KB, ks) > DK_MAXSTEPS) ks++;  // decode_supported bounds this by DK_MAXSPLIT
    return ks;
}

template <typename T, int GRAN>
static void launch_decode_t(T *y, const GemmArgs &a) {
    static int attr_set = 0;  // per instantiation
    auto kern = gemm_fp8_decode_kernel<T, GRAN>;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, DK_SMEM));
        attr_set = 1;
    }
    CUtensorMap tx = tmap_2d(a.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.M, a.K, DK_BM, WG_BK);
    CUtensorMap tw = tmap_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.N, a.K, DK_BN, WG_BK);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(160);
    cfg.dynamicSmemBytes = DK_SMEM;
    cfg.stream = ctx.stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    static int maxc[DK_MAXSPLIT + 1];  // clusters of k blocks that run at once, per instantiation
    if (!maxc[1])
        for (int k = 1; k <= DK_MAXSPLIT; k++) {
            attr[0].val.clusterDim.x = k;
            cfg.gridDim = dim3(k);
            cudaCheck(cudaOccupancyMaxActiveClusters(&maxc[k], (void *)kern, &cfg));
        }
    int ks = decode_splits(a.M, a.N, a.K, maxc);
    attr[0].val.clusterDim.x = ks;
    cfg.gridDim = dim3(ks, cdiv(a.N, DK_BN), cdiv(a.M, DK_BM));
    cudaCheck(cudaLaunchKernelEx(&cfg, kern, y, a, tx, tw));
}
template <typename T>
static void launch_decode(T *y, const GemmArgs &a) {
    if (a.gran == FP8_BLOCK) launch_decode_t<T, FP8_BLOCK>(y, a);
    else if (a.gran == FP8_ROW) launch_decode_t<T, FP8_ROW>(y, a);
    else launch_decode_t<T, FP8_TENSOR>(y, a);
}

// ----------------------------------------------------------------------------
// the FP8 GEMM with backend choice

// AUTO at M <= 64: the decode kernel where it beat cuBLASLt on the H100 (dev/RESULTS.md, "The decode
// GEMM"): the narrow products with a long K and at most 8 MiB of weight, where cuBLASLt's 128-wide
// tiles leave most SMs idle (gemm_fp8 --decode: 1024 x 2048 8.7 vs 11.2 us, 1024 x 3072 9.5 vs 14.3,
// 1024 x 4096 9.8 vs 17.0; Qwen3-0.6B's decode step with it for o and down 23.6k vs 22.7k tokens/s).
// Elsewhere cuBLASLt was as fast or faster: K = 1024 (6144 x 1024 11.6 vs 9.4 us: too few K steps
// to split), N >= 12288 (12288 x 4096 29.1 vs 25.2: no room for splits), and the 8B step, where
// the kernel on 4096 x 4096 and 4096 x 12288 (16.5 vs 17.4, 29.4 vs 29.2 us alone) gave 8.4-8.6k
// tokens/s against cuBLASLt's 8.7k.
static int decode_preferred(int N, int K) { return N <= 4096 && K >= 2048 && (long)N * K <= (8L << 20); }
// version 7's 128 x 192 tiles at K <= 1024, where its paired and staggered consumers hide the
// epilogue better than cuBLASLt does (8 K steps a tile): it won at every granularity wherever
// its tiles keep the GPU busy, the output's share of the last wave and of partial tiles
// counted: (M N) / (waves x SMs x 128 x 192) >= 0.9, from 3 tiles per SM (measured 4 to 16).
// Session 5 (dev/RESULTS.md), ncu cycles v7 vs cuBLASLt, tensor: 4096x3072, 8192x1536 (0.97:
// -7%, -8%), 8192x3072, 16384x3072 (0.97: -7%, -4%), 8192x4096, 16384x2048 (0.94: -2%, -5%);
// but 4096x4096, 8192x2048, 16384x1024 (0.86: +1 to +3%, block even). Row and block alike.
static int v7_short_k(int M, int N, int K) {
    long tiles = (long)cdiv(M, WG_BM) * cdiv(N, 192), waves = (tiles + ctx.sms - 1) / ctx.sms;
    return K <= 1024 && tiles >= 3L * ctx.sms && (double)M * N >= 0.9 * waves * ctx.sms * WG_BM * 192;
}
// which of versions 6 (128 x 128 tiles) and 7 (128 x 192) fp8_gemm_cuda runs. 192-wide tiles
// move a sixth less data per flop but come in fewer, larger pieces: they won at N >= 3072 once
// there were enough of them for the last wave not to matter (>= 8 per SM; at 4096^3, 704 tiles =
// 5.3 waves, version 6 won). Tensor scaling took version 7 only at K = 12288 until its consumers
// were staggered (session 4); since, it wins there at every K measured, as block and row do.
// At K <= 1024, where v7_short_k holds.
static int wgmma_version(int M, int N, int K) {
    if (v7_short_k(M, N, K)) return 7;
    long tiles192 = (long)cdiv(M, WG_BM) * cdiv(N, 192);
    if (tiles192 < 8L * ctx.sms) return 6;
    return N >= 3072 ? 7 : 6;
}
// AUTO: where the wgmma kernel beats cuBLASLt on the H100 (dev/RESULTS.md, "Hopper wgmma
// kernel", "Session 4" and "Session 5"): version 7 at K <= 1024 where v7_short_k holds, at every
// granularity (8192 x 3072 x 1024, session 5: tensor 1091 vs 1024 TFLOP/s, row 1038 vs 968,
// block 1047 vs 960; ncu cycles 77.5k / 81.8k / 81.6k vs 83.2k / 88.3k / 91.0k). Elsewhere
// cuBLASLt (block 0.86-0.93x at the other M = 8192 shapes; at M = 64 it ties).
// FP8_GEMM_KERNEL (and any GPU where cuBLASLt declines a shape) gets the wgmma kernel.
static int wgmma_preferred(int M, int N, int K) { return v7_short_k(M, N, K); }

void fp8_gemm_cuda(void *y, DType ydt, const FP8Tensor *x, const FP8Tensor *w, int accumulate) {
    need_init();
    int M = x->rows, N = w->rows, K = x->cols;
    if (w->cols != K) die("fp8_gemm_cuda: X is (%d, %d) but W is (%d, %d): inner dimensions differ", M, K, N, w->cols);
    if (x->gran != w->gran) die("fp8_gemm_cuda: X is %s-scaled, W %s-scaled: use one granularity", fp8_gran_name(x->gran), fp8_gran_name(w->gran));
    if (x->gran == FP8_BLOCK && (x->block_rows != 1 || w->block_rows != FP8_BLOCK_SIZE))
        die("fp8_gemm_cuda: BLOCK needs X in 1x128 groups and W in 128x128 tiles (block_rows %d, %d)", x->block_rows, w->block_rows);
    if (ydt != DT_BF16 && ydt != DT_F32) die("fp8_gemm_cuda: output must be bf16 or f32, got %s", dtype_name(ydt));
    if (!ctx.has_fp8 || ctx.force_no_fp8) {  // BF16 path: dequantize both operands, one BF16 GEMM
        void *xd = scratch(0, (size_t)M * K * 2), *wd = scratch(1, (size_t)N * K * 2);
        fp8_dequantize_cuda(xd, DT_BF16, x);
        fp8_dequantize_cuda(wd, DT_BF16, w);
        bf16_gemm_cuda(y, ydt, xd, wd, M, N, K, accumulate);
        ctx.last = "bf16-fallback";
        return;
    }
    GemmArgs a = gemm_args(x, w, accumulate);
    FP8GemmBackend b = ctx.backend;
    char why[256];
    int dk = decode_supported(x, w, why, sizeof why);
    if (b == FP8_GEMM_KERNEL_DECODE && !dk)
        die("fp8_gemm_cuda: the decode kernel cannot run %dx%dx%d (%s): %s", M, N, K, fp8_gran_name(x->gran), why);
    if (b == FP8_GEMM_KERNEL_DECODE || (dk && M <= DK_BM && (b == FP8_GEMM_KERNEL || (b == FP8_GEMM_AUTO && decode_preferred(N, K))))) {
        if (ydt == DT_BF16) launch_decode((__nv_bfloat16 *)y, a);
        else launch_decode((float *)y, a);
        ctx.last = "kernel-decode";
        return;
    }
    int wg = wgmma_supported(x, w, why, sizeof why);
    if (b == FP8_GEMM_KERNEL_WGMMA && !wg)
        die("fp8_gemm_cuda: the wgmma kernel cannot run %dx%dx%d (%s): %s", M, N, K, fp8_gran_name(x->gran), why);
    int use_wg = b == FP8_GEMM_KERNEL_WGMMA || (b == FP8_GEMM_KERNEL && wg) ||
                 (b == FP8_GEMM_AUTO && wg && wgmma_preferred(M, N, K));
    if (!use_wg && (b == FP8_GEMM_AUTO || b == FP8_GEMM_CUBLASLT)) {
        LtPlan *p = fp8_plan(ydt, x, w, y, why, sizeof why);
        if (p) {
            lt_run(p, y, w->data, x->data, w->scale, x->scale, accumulate);
            ctx.last = "cublaslt";
            return;
        }
        if (b == FP8_GEMM_CUBLASLT)
            die("fp8_gemm_cuda: cuBLASLt cannot run %dx%dx%d (%s): %s; the hand-written kernel can (backend auto or kernel)",
                M, N, K, fp8_gran_name(x->gran), why);
        use_wg = wg;  // AUTO where cuBLASLt declines (block scaling with K % 128 != 0, N % 8 != 0, ...)
    }
    if (use_wg) {
        launch_v6(y, ydt, a, ctx.wgmma_version ? ctx.wgmma_version : wgmma_version(M, N, K));
        ctx.last = "kernel-wgmma";
        return;
    }
    if (K % 16 == 0) {
        if (ydt == DT_BF16) launch_v3((__nv_bfloat16 *)y, a);
        else launch_v3((float *)y, a);
        ctx.last = "kernel-mma";
    } else {
        if (ydt == DT_BF16) launch_v2((__nv_bfloat16 *)y, a);
        else launch_v2((float *)y, a);
        ctx.last = "kernel-tiled";
    }
}

// ----------------------------------------------------------------------------
// backward: dX[M,K] = dY[M,N] W[N,K]. In cuBLASLt's column-major terms dX is D (K x M,
// ld K) = A (K x N, ld K: W row-major, not transposed) * B (N x M, ld N: dY row-major).

void fp8_linear_dx_cuda(void *dx, int accumulate, const void *dy, const FP8Tensor *w, int M) {
    need_init();
    int N = w->rows, K = w->cols;
    void *wd = scratch(1, (size_t)N * K * 2);
    fp8_dequantize_cuda(wd, DT_BF16, w);
    // reuse the bf16 plan machinery with the roles renamed: output width K, reduction N
    LtPlan *p = plan_find(1, M, K, N, 0, 0, 0, DT_BF16, 0, ptr_align(wd), ptr_align(dy), ptr_align(dx));
    if (!p->desc) plan_build(p, CUDA_R_16BF, CUDA_R_16BF, K);
    if (!p->ok) die("fp8_linear_dx_cuda %dx%dx%d: %s", M, K, N, p->why);
    lt_run(p, dx, wd, dy, NULL, NULL, accumulate);
}
