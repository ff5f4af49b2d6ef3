// backend_cuda.cu: the CUDA backend (backend.h): act = bf16, hp = f32, one stream.
//   defines: backend_cuda() and every op of the Backend table; the attention kernels are
//   in attention.cu (attention_cuda.h), the FP8 quantize/GEMM in fp8.cu (fp8_cuda.h).
// Needs: a GPU of compute capability 8.0+ (BF16 tensor cores), cuBLAS. The numeric truth
// of every op is its dev/ops_cpu.c reference; test/gpu_backend.cu checks each against it.
//
// Where the precision goes (everything else is fp32 arithmetic on bf16 storage):
//   linear      FP8: activations quantized per call to the weight's granularity (E4M3,
//               amax scales, as the CPU's fake quantization), FP8 GEMM (cuBLASLt) into
//               bf16. OFF: BF16 GEMM, fp32 accumulation. dX through FP8 weights: the
//               weight dequantized to bf16, one BF16 GEMM (fp8_linear_dx_cuda).
//   LoRA        BF16 tensor-core GEMMs with fp32 accumulation: the fp32 masters A, B and
//               the saved fp32 ax are rounded to bf16 (2^-9 relative) for each product;
//               ax, the gradients dA, dB and the masters stay fp32.
//   logprobs    fp32 logits in chunks of rows (never (N, V) at once), fp32 logsumexp;
//               the backward's dz = dlogp (onehot - softmax) / T is rounded to bf16 for
//               the two GEMMs (dh = dz W, dW += dz^T h).
//   reductions  no float atomics anywhere: sums over rows (dbias, norm weights, embedding
//               rows, sumsq) use fixed-order partials, so results repeat bit for bit.
//   sample      fp64, the CPU's formulas; the draw is the sequence's splitmix64 state.
//   adamw/scale fp64 with the CPU's operation order and no FMA contraction: bit-exact.
#include <cublas_v2.h>
#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "attention_cuda.h"
#include "backend.h"
#include "fp8_cuda.h"

typedef __nv_bfloat16 bf16;

// ----------------------------------------------------------------------------
// checks that say where and why

static void cuda_check(cudaError_t e, const char *file, int line) {
    if (e != cudaSuccess) die("CUDA error %s at %s:%d: %s", cudaGetErrorName(e), file, line, cudaGetErrorString(e));
}
static void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) die("cuBLAS error %d at %s:%d", (int)s, file, line);
}
#define cudaCheck(e) cuda_check((e), __FILE__, __LINE__)
#define cublasCheck(s) cublas_check((s), __FILE__, __LINE__)
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

static inline unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
// grid for a grid-stride loop over n items, 256 threads a block
static inline unsigned grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    return (unsigned)(g < 8192 ? (g ? g : 1) : 8192);
}

// ----------------------------------------------------------------------------
// the backend's state: one stream, one cuBLAS handle, scratch buffers that only grow

enum {
    SC_STAGE,    // host upload staging (raw source bytes)
    SC_STAGE2,   // converted staging (f32 copy of an f16/f64 weight)
    SC_ACT_Q,    // FP8 codes of the activations of a linear layer
    SC_ACT_S,    // their scales
    SC_F32,      // fp32 (rows, OC) of a linear with bias; the logits chunk of logprobs
    SC_BF16,     // bf16 dz chunk of logprobs_backward
    SC_LORA_A,   // bf16 copy of A (R, C)
    SC_LORA_B,   // bf16 copy of B (OC, R)
    SC_LORA_X,   // bf16 ax (N, R)
    SC_LORA_DX,  // fp32 dax (N, R)
    SC_RED,      // reduction partials
    SC_ATT,      // attention backward D / decode partials
    SC_SORT,     // sampling: sorted keys, ids, CUB temp
    SC_SMALL,    // per-row sampling state
    SC_COUNT
};

static struct {
    int init;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *scratch[SC_COUNT];
    size_t scratch_bytes[SC_COUNT];
    double *sum_host;  // pinned, sumsq result
    unsigned epoch;    // bumped when a scratch buffer moves (backend.h scratch_epoch)
} G;

static void *scratch(int i, size_t bytes) {
    if (G.scratch_bytes[i] < bytes) {
        cudaCheck(cudaStreamSynchronize(G.stream));
        if (G.scratch[i]) cudaCheck(cudaFree(G.scratch[i]));
        G.scratch[i] = NULL;
        size_t want = bytes + bytes / 8;  // a little headroom against regrowth
        if (cudaMalloc(&G.scratch[i], want) != cudaSuccess) {
            cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            die("out of GPU memory allocating %.1f MiB of CUDA backend scratch (%.1f MiB free of %.1f): lower "
                "--gpu-memory-utilization or the batch size",
                want / 1048576.0, fr / 1048576.0, tot / 1048576.0);
        }
        G.scratch_bytes[i] = want;
        G.epoch++;  // graphs captured before hold the old pointer
    }
    return G.scratch[i];
}

// ----------------------------------------------------------------------------
// memory

static size_t mem_base, mem_peak;  // device memory in use at start-up (context, libraries); the most seen since
static size_t cu_mem_in_use(size_t *peak) {
    size_t fr = 0, tot = 0;
    cudaCheck(cudaMemGetInfo(&fr, &tot));
    size_t now = tot - fr > mem_base ? tot - fr - mem_base : 0;
    if (now > mem_peak) mem_peak = now;
    if (peak) *peak = mem_peak;
    return now;
}

static size_t mem_total;
static size_t cu_mem_capacity(void) { return mem_total > mem_base ? mem_total - mem_base : 0; }

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        die("out of GPU memory allocating %.1f MiB (%.1f MiB free of %.1f): lower --gpu-memory-utilization or the "
            "batch size",
            bytes / 1048576.0, fr / 1048576.0, tot / 1048576.0);
    }
    cu_mem_in_use(NULL);  // usage only grows at allocations: sampling here keeps the peak exact
    return p;
}
static void cu_free(void *p) {
    if (p) cudaCheck(cudaFree(p));
}
static void cu_zero(void *p, size_t bytes) { cudaCheck(cudaMemsetAsync(p, 0, bytes, G.stream)); }
// From pageable host memory the copy has left the host buffer when the call returns,
// so callers may free it at once (model.c does).
static void cu_upload(void *dst, const void *src, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, G.stream));
}
static void cu_download(void *dst, const void *src, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, G.stream));
    cudaCheck(cudaStreamSynchronize(G.stream));
}
static void cu_copy(void *dst, const void *src, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, G.stream));
}
static void cu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    if (!rows || !width) return;
    cudaCheck(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, G.stream));
}
// Also gives back large upload staging (weights pass through it at load time), so that
// it does not sit in the memory report of the training step.
static void cu_sync(void) {
    cudaCheck(cudaStreamSynchronize(G.stream));
    for (int i = SC_STAGE; i <= SC_STAGE2; i++)
        if (G.scratch_bytes[i] > ((size_t)64 << 20)) {
            cudaCheck(cudaFree(G.scratch[i]));
            G.scratch[i] = NULL;
            G.scratch_bytes[i] = 0;
        }
}

__device__ __forceinline__ float ld_f(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld_f(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float ld_f(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void st_f(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st_f(bf16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

template <typename S, typename D>
__global__ void convert_kernel(D *dst, const S *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st_f(dst, i, ld_f(src, i));
}
// f64 sources convert directly (no double rounding through f32)
__global__ void convert_f64_bf16(bf16 *dst, const double *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __double2bfloat16(src[i]);
}
__global__ void convert_f64_f32(float *dst, const double *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = (float)src[i];
}

// dst (device, type dt) = src (device, type st), n elements
static void convert_dev(void *dst, DType dt, const void *src, DType st, size_t n) {
    unsigned gr = grid_for(n);
    cudaStream_t s = G.stream;
    if (dt == DT_BF16) {
        switch (st) {
            case DT_F32: convert_kernel<<<gr, 256, 0, s>>>((bf16 *)dst, (const float *)src, n); break;
            case DT_BF16: cu_copy(dst, src, n * 2); return;
            case DT_F16: convert_kernel<<<gr, 256, 0, s>>>((bf16 *)dst, (const __half *)src, n); break;
            case DT_F64: convert_f64_bf16<<<gr, 256, 0, s>>>((bf16 *)dst, (const double *)src, n); break;
            default: die("cuda backend: cannot convert %s to %s", dtype_name(st), dtype_name(dt));
        }
    } else if (dt == DT_F32) {
        switch (st) {
            case DT_F32: cu_copy(dst, src, n * 4); return;
            case DT_BF16: convert_kernel<<<gr, 256, 0, s>>>((float *)dst, (const bf16 *)src, n); break;
            case DT_F16: convert_kernel<<<gr, 256, 0, s>>>((float *)dst, (const __half *)src, n); break;
            case DT_F64: convert_f64_f32<<<gr, 256, 0, s>>>((float *)dst, (const double *)src, n); break;
            default: die("cuda backend: cannot convert %s to %s", dtype_name(st), dtype_name(dt));
        }
    } else die("cuda backend: upload_convert to %s unsupported (bf16 or f32)", dtype_name(dt));
    launchCheck();
}

// upload raw through a staging buffer in chunks of 32M elements, convert on the device
static void cu_upload_convert(void *dst, DType dt, const void *src, DType st, size_t n) {
    size_t ss = dtype_size(st), ds = dtype_size(dt), chunk = (size_t)32 << 20;
    if (st == dt) {
        cu_upload(dst, src, n * ss);
        return;
    }
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        void *stage = scratch(SC_STAGE, m * ss);
        cu_upload(stage, (const char *)src + i * ss, m * ss);
        convert_dev((char *)dst + i * ds, dt, stage, st, m);
    }
}

// ----------------------------------------------------------------------------
// weights

static void cu_quantize_weight(QWeight *w, const void *src, DType st, int pow2) {
    size_t n = (size_t)w->rows * w->cols;
    if (w->gran == FP8_OFF) {
        cu_upload_convert(w->dense, DT_BF16, src, st, n);
        return;
    }
    // fp8_quantize_cuda reads bf16 or f32; other sources go through an f32 copy (as the CPU does)
    void *stage = scratch(SC_STAGE, n * dtype_size(st));
    cu_upload(stage, src, n * dtype_size(st));
    const void *x = stage;
    DType xt = st;
    if (st != DT_BF16 && st != DT_F32) {
        x = scratch(SC_STAGE2, n * 4);
        convert_dev((void *)x, DT_F32, stage, st, n);
        xt = DT_F32;
    }
    fp8_quantize_cuda(&w->q, x, xt, pow2);
}

static void cu_dequantize_weight(void *out, const QWeight *w) {
    if (w->gran == FP8_OFF) cu_copy(out, w->dense, (size_t)w->rows * w->cols * 2);
    else fp8_dequantize_cuda(out, DT_BF16, &w->q);
}

// ----------------------------------------------------------------------------
// GEMMs through cuBLAS (column-major). A row-major (r, c) matrix is a column-major (c, r) one,
// so each call below states the row-major product it computes and how it maps.

static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
                 cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb, float beta, void *C,
                 cudaDataType_t ct, int ldc) {
    cublasCheck(cublasGemmEx(G.cublas, ta, tb, m, n, k, &alpha, A, at, lda, B, bt, ldb, &beta, C, ct, ldc,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
#define BF CUDA_R_16BF
#define F32 CUDA_R_32F
#define OPN CUBLAS_OP_N
#define OPT CUBLAS_OP_T
// Y (M, N) = X (M, K) W (N, K)^T: column-major Y^T (N x M) = W^T-op (N x K) * X (K x M)
static void gemm_xwt(void *y, cudaDataType_t yt, const void *x, const void *w, int M, int N, int K, float alpha,
                     float beta) {
    gemm(OPT, OPN, N, M, K, alpha, w, BF, K, x, BF, K, beta, y, yt, N);
}
// Y (M, K) = X (M, N) W (N, K): column-major Y^T (K x M) = W (K x N, ld K) * X^T (N x M, ld N)
static void gemm_xw(void *y, cudaDataType_t yt, const void *x, const void *w, int M, int N, int K, float alpha,
                    float beta) {
    gemm(OPN, OPN, K, M, N, alpha, w, BF, K, x, BF, N, beta, y, yt, K);
}
// Y (N, K) (+)= X (M, N)^T Z (M, K): column-major Y^T (K x N) = Z (K x M, ld K) * X-op^T (M x N, ld N)
static void gemm_xtz(void *y, cudaDataType_t yt, const void *x, const void *z, int M, int N, int K, float alpha,
                     float beta) {
    gemm(OPN, OPT, K, N, M, alpha, z, BF, K, x, BF, N, beta, y, yt, K);
}

// ----------------------------------------------------------------------------
// small kernels

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}
static void to_bf16(bf16 *dst, const float *src, size_t n) {
    f32_to_bf16_kernel<<<grid_for(n), 256, 0, G.stream>>>(dst, src, n);
    launchCheck();
}
// two arrays in one launch (LoRA's A and B)
__global__ void f32_to_bf16_2_kernel(bf16 *d1, const float *s1, size_t n1, bf16 *d2, const float *s2, size_t n2) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n1 + n2; i += (size_t)gridDim.x * blockDim.x) {
        if (i < n1) d1[i] = __float2bfloat16_rn(s1[i]);
        else d2[i - n1] = __float2bfloat16_rn(s2[i - n1]);
    }
}
static void to_bf16_2(bf16 *d1, const float *s1, size_t n1, bf16 *d2, const float *s2, size_t n2) {
    f32_to_bf16_2_kernel<<<grid_for(n1 + n2), 256, 0, G.stream>>>(d1, s1, n1, d2, s2, n2);
    launchCheck();
}

// out (N, OC) bf16 = y (N, OC) f32 + bias (OC) bf16, in fp32 then rounded once
__global__ void bias_out_kernel(bf16 *out, const float *y, const bf16 *bias, size_t n, int OC) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(y[i] + __bfloat162float(bias[i % OC]));
}

// Column sums in two fixed-order passes (no atomics). Pass 1: block `chunk` sums rows
// [chunk * rpc, ...) of column c into part[chunk, c]; MODE 0: a[n, c]; MODE 1: a * b * rs[n].
#define COLSUM_ROWS 64
template <int MODE>
__global__ void colsum_partial(float *part, const bf16 *a, const bf16 *b, const float *rs, int N, int C) {
    int n0 = blockIdx.y * COLSUM_ROWS, n1 = min(N, n0 + COLSUM_ROWS);
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int n = n0; n < n1; n++) {
            float v = __bfloat162float(a[(size_t)n * C + c]);
            if (MODE == 1) v *= __bfloat162float(b[(size_t)n * C + c]) * rs[n];
            s += v;
        }
        part[(size_t)blockIdx.y * C + c] = s;
    }
}
// pass 2: dst[c] += sum over chunks (8 row groups per column, then a fixed tree of 8)
__global__ void colsum_finish(float *dst, const float *part, int nchunks, int C) {
    __shared__ float sm[8][33];
    int cx = threadIdx.x & 31, gy = threadIdx.x >> 5, c = blockIdx.x * 32 + cx;
    float s = 0.f;
    if (c < C)
        for (int i = gy; i < nchunks; i += 8) s += part[(size_t)i * C + c];
    sm[gy][cx] = s;
    __syncthreads();
    if (gy == 0 && c < C) {
        float t = 0.f;
        for (int i = 0; i < 8; i++) t += sm[i][cx];
        dst[c] += t;
    }
}
template <int MODE>
static void colsum(float *dst, const bf16 *a, const bf16 *b, const float *rs, int N, int C) {
    int nch = (N + COLSUM_ROWS - 1) / COLSUM_ROWS;
    float *part = (float *)scratch(SC_RED, (size_t)nch * C * 4);
    colsum_partial<MODE><<<dim3(cdiv(C, 256), nch), 256, 0, G.stream>>>(part, a, b, rs, N, C);
    launchCheck();
    colsum_finish<<<cdiv(C, 32), 256, 0, G.stream>>>(dst, part, nch, C);
    launchCheck();
}

// ----------------------------------------------------------------------------
// linear layers

static void cu_linear_forward(void *out, const void *inp, const QWeight *w, const void *bias, int N) {
    int C = w->cols, OC = w->rows;
    if (N <= 0) return;
    size_t n = (size_t)N * OC;
    void *y = bias ? scratch(SC_F32, n * 4) : out;
    DType yt = bias ? DT_F32 : DT_BF16;
    if (w->gran == FP8_OFF) {
        gemm_xwt(y, bias ? F32 : BF, inp, w->dense, N, OC, C, 1.f, 0.f);
    } else {
        // the activations, quantized dynamically to the weight's granularity (as backend_cpu.c)
        FP8Tensor xq;
        memset(&xq, 0, sizeof xq);
        xq.rows = N;
        xq.cols = C;
        xq.gran = w->gran;
        xq.fmt = FP8_E4M3;
        xq.block_rows = 1;
        xq.data = (uint8_t *)scratch(SC_ACT_Q, (size_t)N * C);
        xq.scale = (float *)scratch(SC_ACT_S, fp8_num_scales(w->gran, N, C, 1) * 4);
        fp8_quantize_cuda(&xq, inp, DT_BF16, 0);
        fp8_gemm_cuda(y, yt, &xq, &w->q, 0);
    }
    if (bias) {
        bias_out_kernel<<<grid_for(n), 256, 0, G.stream>>>((bf16 *)out, (const float *)y, (const bf16 *)bias, n, OC);
        launchCheck();
    }
}

// dinp (n) bf16 = bf16(dinp + y), y f32 or bf16, summed in fp32
template <typename T>
__global__ void accumulate_kernel(bf16 *dinp, const T *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dinp[i] = __float2bfloat16_rn(__bfloat162float(dinp[i]) + ld_f(y, i));
}

// With accumulate, the product goes to scratch and is added in a second pass: a GEMM with
// beta = 1 and a bf16 output may split K and round its partial sums to bf16 (seen on H100:
// errors of 3 bf16 ulps), which the fp32 scratch avoids (FP8 weights: bf16 scratch, one
// rounding of the product before the sum).
static void cu_linear_backward(void *dinp, int accumulate, void *dw, void *dbias, const void *dout, const void *inp,
                               const QWeight *w, int N) {
    int C = w->cols, OC = w->rows;
    if (N <= 0) return;
    if (dinp) {
        size_t n = (size_t)N * C;
        if (w->gran == FP8_OFF) {
            if (!accumulate) gemm_xw(dinp, BF, dout, w->dense, N, OC, C, 1.f, 0.f);
            else {
                float *y = (float *)scratch(SC_F32, n * 4);
                gemm_xw(y, F32, dout, w->dense, N, OC, C, 1.f, 0.f);
                accumulate_kernel<<<grid_for(n), 256, 0, G.stream>>>((bf16 *)dinp, y, n);
                launchCheck();
            }
        } else {
            if (!accumulate) fp8_linear_dx_cuda(dinp, 0, dout, &w->q, N);
            else {
                bf16 *y = (bf16 *)scratch(SC_BF16, n * 2);
                fp8_linear_dx_cuda(y, 0, dout, &w->q, N);
                accumulate_kernel<<<grid_for(n), 256, 0, G.stream>>>((bf16 *)dinp, y, n);
                launchCheck();
            }
        }
    }
    if (dw) {
        if (w->gran != FP8_OFF) die("cuda backend: weight gradients of FP8 weights are not supported (they are frozen)");
        gemm_xtz(dw, F32, dout, inp, N, OC, C, 1.f, 1.f);  // dW (OC, C) += dout^T inp
    }
    if (dbias) colsum<0>((float *)dbias, (const bf16 *)dout, NULL, NULL, N, OC);
}

// ---- LoRA: out += scale * (inp A^T) B^T, in BF16 GEMMs (see the top of the file) ----

static void cu_lora_forward(void *out, void *ax, const void *inp, const void *A, const void *B, float scale, int N,
                            int C, int R, int OC) {
    if (N <= 0) return;
    bf16 *Ab = (bf16 *)scratch(SC_LORA_A, (size_t)R * C * 2), *Bb = (bf16 *)scratch(SC_LORA_B, (size_t)OC * R * 2);
    bf16 *axb = (bf16 *)scratch(SC_LORA_X, (size_t)N * R * 2);
    to_bf16_2(Ab, (const float *)A, (size_t)R * C, Bb, (const float *)B, (size_t)OC * R);
    gemm_xwt(ax, F32, inp, Ab, N, R, C, 1.f, 0.f);  // ax (N, R) f32 = inp A^T
    to_bf16(axb, (const float *)ax, (size_t)N * R);
    gemm_xwt(out, BF, axb, Bb, N, OC, R, scale, 1.f);  // out (N, OC) += scale ax B^T
}

static void cu_lora_apply(void *out, const void *inp, const void *A, const void *B, float scale, int N, int C, int R,
                          int OC) {
    if (N <= 0) return;
    bf16 *axb = (bf16 *)scratch(SC_LORA_X, (size_t)N * R * 2);
    gemm_xwt(axb, BF, inp, A, N, R, C, 1.f, 0.f);        // ax (N, R) bf16 = inp A^T (fp32 sums, one rounding)
    gemm_xwt(out, BF, axb, B, N, OC, R, scale, 1.f);     // out (N, OC) += scale ax B^T
}
static void cu_to_act(void *dst, const void *src, size_t n) { to_bf16((bf16 *)dst, (const float *)src, n); }

static void cu_lora_backward(void *dinp, void *dA, void *dB, const void *dout, const void *inp, const void *ax,
                             const void *A, const void *B, float scale, int N, int C, int R, int OC) {
    if (N <= 0) return;
    bf16 *Ab = (bf16 *)scratch(SC_LORA_A, (size_t)R * C * 2), *Bb = (bf16 *)scratch(SC_LORA_B, (size_t)OC * R * 2);
    bf16 *xb = (bf16 *)scratch(SC_LORA_X, (size_t)N * R * 2);
    float *dax = (float *)scratch(SC_LORA_DX, (size_t)N * R * 4);
    to_bf16_2(Ab, (const float *)A, (size_t)R * C, Bb, (const float *)B, (size_t)OC * R);
    to_bf16(xb, (const float *)ax, (size_t)N * R);
    gemm_xw(dax, F32, dout, Bb, N, OC, R, scale, 0.f);    // dax (N, R) = scale dout B
    gemm_xtz(dB, F32, dout, xb, N, OC, R, scale, 1.f);    // dB (OC, R) += scale dout^T ax
    to_bf16(xb, dax, (size_t)N * R);                       // xb now holds dax in bf16
    gemm_xw(dinp, BF, xb, Ab, N, R, C, 1.f, 1.f);         // dinp (N, C) += dax A
    gemm_xtz(dA, F32, xb, inp, N, R, C, 1.f, 1.f);        // dA (R, C) += dax^T inp
}

// ----------------------------------------------------------------------------
// norms and elementwise ops. bf16 rows are read 8 at a time (16 bytes) when the row
// length and pointers allow, else one at a time.

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ void unpack8(float f[8], uint4 u) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ uint4 pack8(const float f[8]) {
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return u;
}
__device__ __forceinline__ void load8(float f[8], const bf16 *p) { unpack8(f, *(const uint4 *)p); }
__device__ __forceinline__ void store8(bf16 *p, const float f[8]) { *(uint4 *)p = pack8(f); }
static int aligned16(const void *a, const void *b, const void *c, const void *d) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15) == 0;
}

// RMSNorm of one row of C by one warp, in two passes that every norm kernel shares (so fused
// kernels round exactly as rmsnorm_fwd_kernel does): the rstd from the sum of squares, then
// y = (x * rstd) * w. VEC: 8 consecutive elements per lane (16-byte loads), else one. y may alias
// x: each lane rewrites only the elements it read.
template <bool VEC>
__device__ __forceinline__ float row_rstd(const bf16 *x, int C, float eps, int lane) {
    float ss = 0.f;
    if (VEC) {
        for (int i = lane * 8; i < C; i += 256) {
            float f[8];
            load8(f, x + i);
#pragma unroll
            for (int j = 0; j < 8; j++) ss += f[j] * f[j];
        }
    } else
        for (int i = lane; i < C; i += 32) {
            float f = __bfloat162float(x[i]);
            ss += f * f;
        }
    ss = warp_sum(ss);
    return 1.0f / sqrtf(ss / C + eps);
}
template <bool VEC>
__device__ __forceinline__ void row_scale(bf16 *y, const bf16 *x, const bf16 *w, float r, int C, int lane) {
    if (VEC) {
        for (int i = lane * 8; i < C; i += 256) {
            float f[8], g[8];
            load8(f, x + i);
            load8(g, w + i);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = (f[j] * r) * g[j];
            store8(y + i, f);
        }
    } else
        for (int i = lane; i < C; i += 32) y[i] = __float2bfloat16_rn((__bfloat162float(x[i]) * r) * __bfloat162float(w[i]));
}

// The same norm with the lane's part of the row held in registers (chunk k of lane: elements
// lane * 8 + 256 k .. + 7, as row_rstd / row_scale walk it, in the same order, so the results are
// theirs bit for bit). row_rstd then row_scale read the row twice and loop over it with a memory
// round trip per 256 elements: at decode (64 rows, 8 of 256-thread blocks) that made the 8B
// model's add + norm 19.5 us a call (bench_rollout --profile); here every load of the row is in
// flight at once and the blocks are small enough to spread over the SMs. C <= 256 * ROW_MAXCH
// (5120: Qwen3-14B); wider rows take the loops.
#define ROW_MAXCH 20
__device__ __forceinline__ float regs_rstd(const uint4 (&c)[ROW_MAXCH], int C, float eps, int lane) {
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < ROW_MAXCH; k++)
        if (lane * 8 + 256 * k < C) {
            float f[8];
            unpack8(f, c[k]);
#pragma unroll
            for (int j = 0; j < 8; j++) ss += f[j] * f[j];
        }
    ss = warp_sum(ss);
    return 1.0f / sqrtf(ss / C + eps);
}
// y = (x * r) * w; w's chunks were loaded before (wv), next to the row's
__device__ __forceinline__ void regs_scale(bf16 *y, const uint4 (&c)[ROW_MAXCH], const uint4 (&wv)[ROW_MAXCH], float r,
                                          int C, int lane) {
#pragma unroll
    for (int k = 0; k < ROW_MAXCH; k++)
        if (lane * 8 + 256 * k < C) {
            float f[8], g[8];
            uint4 u = c[k];  // unpacked again, not kept from regs_rstd (that would hold 8 floats per chunk)
            asm volatile("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w));
            unpack8(f, u);
            unpack8(g, wv[k]);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = (f[j] * r) * g[j];
            *(uint4 *)(y + lane * 8 + 256 * k) = pack8(f);
        }
}
__device__ __forceinline__ void regs_load(uint4 (&c)[ROW_MAXCH], const bf16 *x, int C, int lane) {
#pragma unroll
    for (int k = 0; k < ROW_MAXCH; k++)
        if (lane * 8 + 256 * k < C) c[k] = *(const uint4 *)(x + lane * 8 + 256 * k);
}
// Few rows (a decode step): the row in registers, one row per block so that the rows spread over
// the SMs. Many rows (training, prefill): the loops, 8 rows per block; there the SMs are full of
// warps anyway, and the register kernels' ~200 registers would cut that to 8 warps per SM.
#define ROW_FEW 1024
static int row_warps(int N) { return N <= ROW_FEW ? 1 : 8; }

// one warp per row; y = (x * rstd) * w with fp32 statistics; out may alias inp
template <bool VEC>
__global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C;
    float r = row_rstd<VEC>(x, C, eps, lane);
    if (lane == 0) rstd[row] = r;
    row_scale<VEC>(out + (size_t)row * C, x, w, r, C, lane);
}
__global__ void rmsnorm_regs_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    uint4 c[ROW_MAXCH], wv[ROW_MAXCH];
    regs_load(c, inp + (size_t)row * C, C, lane);
    regs_load(wv, w, C, lane);
    float r = regs_rstd(c, C, eps, lane);
    if (lane == 0) rstd[row] = r;
    regs_scale(out + (size_t)row * C, c, wv, r, C, lane);
}

static void cu_rmsnorm_forward(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps) {
    if (N <= 0) return;
    int wpb = row_warps(N);
    unsigned gr = cdiv(N, wpb);
    if (N <= ROW_FEW && C % 8 == 0 && C <= 256 * ROW_MAXCH && aligned16(out, inp, w, NULL))
        rmsnorm_regs_kernel<<<gr, 32 * wpb, 0, G.stream>>>((bf16 *)out, (float *)rstd, (const bf16 *)inp, (const bf16 *)w,
                                                           N, C, eps);
    else if (C % 8 == 0 && aligned16(out, inp, w, NULL))
        rmsnorm_fwd_kernel<true><<<gr, 32 * wpb, 0, G.stream>>>((bf16 *)out, (float *)rstd, (const bf16 *)inp,
                                                                  (const bf16 *)w, N, C, eps);
    else
        rmsnorm_fwd_kernel<false><<<gr, 32 * wpb, 0, G.stream>>>((bf16 *)out, (float *)rstd, (const bf16 *)inp,
                                                                   (const bf16 *)w, N, C, eps);
    launchCheck();
}

// dx += r w dy - r^3 / C * x * sum_j(w dy x), one warp per row
template <bool VEC>
__global__ void rmsnorm_bwd_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *w, const float *rstd,
                                   int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    bf16 *dx = dinp + (size_t)row * C;
    float s = 0.f, r = rstd[row];
    if (VEC) {
        for (int i = lane * 8; i < C; i += 256) {
            float a[8], b[8], c[8];
            load8(a, x + i);
            load8(b, dy + i);
            load8(c, w + i);
#pragma unroll
            for (int j = 0; j < 8; j++) s += c[j] * b[j] * a[j];
        }
    } else
        for (int i = lane; i < C; i += 32)
            s += __bfloat162float(w[i]) * __bfloat162float(dy[i]) * __bfloat162float(x[i]);
    s = warp_sum(s);
    float cc = r * r * r * s / C;
    if (VEC) {
        for (int i = lane * 8; i < C; i += 256) {
            float a[8], b[8], c[8], d[8];
            load8(a, x + i);
            load8(b, dy + i);
            load8(c, w + i);
            load8(d, dx + i);
#pragma unroll
            for (int j = 0; j < 8; j++) d[j] += r * c[j] * b[j] - cc * a[j];
            store8(dx + i, d);
        }
    } else
        for (int i = lane; i < C; i += 32)
            dx[i] = __float2bfloat16_rn(__bfloat162float(dx[i]) + r * __bfloat162float(w[i]) * __bfloat162float(dy[i]) -
                                        cc * __bfloat162float(x[i]));
}

static void cu_rmsnorm_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w, const void *rstd,
                                int N, int C) {
    if (N <= 0) return;
    unsigned gr = cdiv(N, 8);
    if (C % 8 == 0 && aligned16(dinp, dout, inp, w))
        rmsnorm_bwd_kernel<true><<<gr, 256, 0, G.stream>>>((bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp,
                                                             (const bf16 *)w, (const float *)rstd, N, C);
    else
        rmsnorm_bwd_kernel<false><<<gr, 256, 0, G.stream>>>((bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp,
                                                              (const bf16 *)w, (const float *)rstd, N, C);
    launchCheck();
    if (dw) colsum<1>((float *)dw, (const bf16 *)dout, (const bf16 *)inp, (const float *)rstd, N, C);
}

// RoPE, rotate_half: for i < HD/2, angle = (float)pos * inv_freq[i] in fp32 (as transformers),
// cos/sin in fp64 (as the CPU); one thread per (token, i), looping over the heads
__global__ void rope_kernel(bf16 *x, const int32_t *pos, const float *inv_freq, int N, int H, int HD, int inverse) {
    int half = HD / 2;
    size_t total = (size_t)N * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(idx / half), i = (int)(idx % half);
        double a = (double)((float)pos[n] * inv_freq[i]), sd, cd;
        sincos(a, &sd, &cd);
        float c = (float)cd, s = inverse ? -(float)sd : (float)sd;
        for (int h = 0; h < H; h++) {
            bf16 *v = x + ((size_t)n * H + h) * HD;
            float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
            v[i] = __float2bfloat16_rn(x1 * c - x2 * s);
            v[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
        }
    }
}
static void rope(void *x, const int32_t *pos, const void *inv_freq, int N, int H, int HD, int inverse) {
    if (N <= 0) return;
    size_t total = (size_t)N * (HD / 2);
    rope_kernel<<<grid_for(total), 256, 0, G.stream>>>((bf16 *)x, pos, (const float *)inv_freq, N, H, HD, inverse);
    launchCheck();
}
static void cu_rope_forward(void *x, const int32_t *pos, const void *inv_freq, int N, int H, int HD) {
    rope(x, pos, inv_freq, N, H, HD, 0);
}
static void cu_rope_backward(void *dx, const int32_t *pos, const void *inv_freq, int N, int H, int HD) {
    rope(dx, pos, inv_freq, N, H, HD, 1);
}

// ---- decode fusions (backend.h): the same arithmetic as the kernels they replace ----

// x += dx, then out = rmsnorm(x) * w: one warp per row; the norm is rmsnorm_fwd_kernel's (row_rstd,
// row_scale) on the rounded sums, so the result is that of add then rmsnorm_forward bit for bit
template <bool VEC>
__global__ void add_rmsnorm_kernel(bf16 *x, bf16 *out, float *rstd, const bf16 *dx, const bf16 *w, int N, int C,
                                   float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    bf16 *xr = x + (size_t)row * C, *y = out + (size_t)row * C;
    const bf16 *d = dx + (size_t)row * C;
    if (VEC) {  // the add, as add_kernel rounds it; each lane later reads back only what it wrote
        for (int i = lane * 8; i < C; i += 256) {
            float f[8], g[8];
            load8(f, xr + i);
            load8(g, d + i);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] += g[j];
            store8(xr + i, f);
        }
    } else
        for (int i = lane; i < C; i += 32) xr[i] = __float2bfloat16_rn(__bfloat162float(xr[i]) + __bfloat162float(d[i]));
    float r = row_rstd<VEC>(xr, C, eps, lane);
    if (lane == 0) rstd[row] = r;
    row_scale<VEC>(y, xr, w, r, C, lane);
}
// the same with the row in registers (rmsnorm_regs_kernel): the rounded sums are kept, stored, and
// normalized from the registers
__global__ void add_rmsnorm_regs_kernel(bf16 *x, bf16 *out, float *rstd, const bf16 *dx, const bf16 *w, int N, int C,
                                        float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    bf16 *xr = x + (size_t)row * C;
    uint4 c[ROW_MAXCH], wv[ROW_MAXCH];
    regs_load(c, xr, C, lane);
    regs_load(wv, dx + (size_t)row * C, C, lane);  // dx now (all loads before the first store), w later
#pragma unroll
    for (int k = 0; k < ROW_MAXCH; k++)
        if (lane * 8 + 256 * k < C) {
            float f[8], g[8];
            unpack8(f, c[k]);
            unpack8(g, wv[k]);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] += g[j];
            c[k] = pack8(f);
            *(uint4 *)(xr + lane * 8 + 256 * k) = c[k];
        }
    regs_load(wv, w, C, lane);
    float r = regs_rstd(c, C, eps, lane);
    if (lane == 0) rstd[row] = r;
    regs_scale(out + (size_t)row * C, c, wv, r, C, lane);
}
static void cu_add_rmsnorm(void *x, void *out, void *rstd, const void *dx, const void *w, int N, int C, float eps) {
    if (N <= 0) return;
    int wpb = row_warps(N);
    unsigned gr = cdiv(N, wpb);
    if (N <= ROW_FEW && C % 8 == 0 && C <= 256 * ROW_MAXCH && aligned16(x, out, dx, w))
        add_rmsnorm_regs_kernel<<<gr, 32 * wpb, 0, G.stream>>>((bf16 *)x, (bf16 *)out, (float *)rstd, (const bf16 *)dx,
                                                               (const bf16 *)w, N, C, eps);
    else if (C % 8 == 0 && aligned16(x, out, dx, w))
        add_rmsnorm_kernel<true><<<gr, 32 * wpb, 0, G.stream>>>((bf16 *)x, (bf16 *)out, (float *)rstd,
                                                                  (const bf16 *)dx, (const bf16 *)w, N, C, eps);
    else
        add_rmsnorm_kernel<false><<<gr, 32 * wpb, 0, G.stream>>>((bf16 *)x, (bf16 *)out, (float *)rstd,
                                                                   (const bf16 *)dx, (const bf16 *)w, N, C, eps);
    launchCheck();
}

// rope_kernel's rotation of one head row v (HD) at position p, by one warp
__device__ __forceinline__ void rope_row(bf16 *v, int p, const float *inv_freq, int HD, int lane) {
    int half = HD / 2;
    for (int i = lane; i < half; i += 32) {
        double a = (double)((float)p * inv_freq[i]), sd, cd;
        sincos(a, &sd, &cd);
        float c = (float)cd, s = (float)sd;
        float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
        v[i] = __float2bfloat16_rn(x1 * c - x2 * s);
        v[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
    }
}

// one head row, by one warp: normed from src with the head's weight w (when given: rmsnorm_fwd_kernel's
// row_rstd, row_scale) into v, then rotated in place (src may be v)
template <bool VEC>
__device__ __forceinline__ void norm_rope_head(bf16 *v, const bf16 *src, const bf16 *w, int p, const float *inv_freq,
                                               int HD, float eps, int lane) {
    if (w) {
        float r = row_rstd<VEC>(src, HD, eps, lane);
        row_scale<VEC>(v, src, w, r, HD, lane);
    } else if (v != src)
        for (int i = lane; i < HD; i += 32) v[i] = src[i];
    __syncwarp();
    rope_row(v, p, inv_freq, HD, lane);
}

// one warp per head row (token n, head h) of q then of k: rmsnorm_fwd_kernel's norm with the head's
// weight (row_rstd, row_scale), then rope_kernel's rotation of the rounded values
template <bool VEC>
__global__ void qk_norm_rope_kernel(bf16 *q, bf16 *k, const bf16 *qw, const bf16 *kw, const int32_t *pos,
                                    const float *inv_freq, int N, int NH, int KVH, int HD, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N * (NH + KVH)) return;
    int n = row / (NH + KVH), h = row % (NH + KVH);
    bool isq = h < NH;
    bf16 *v = isq ? q + ((size_t)n * NH + h) * HD : k + ((size_t)n * KVH + (h - NH)) * HD;
    norm_rope_head<VEC>(v, v, isq ? qw : kw, pos[n], inv_freq, HD, eps, lane);
}
// the VEC condition of cu_rmsnorm_forward for the (rows, HD) calls these kernels replace
static bool qk_vec(const void *q, const void *k, const void *q_norm, const void *k_norm, int HD) {
    return HD % 8 == 0 && aligned16(q, q_norm ? q_norm : q, NULL, NULL) && aligned16(k, k_norm ? k_norm : k, NULL, NULL);
}
static void cu_qk_norm_rope(void *q, void *k, const void *q_norm, const void *k_norm, const int32_t *pos,
                            const void *inv_freq, int N, int NH, int KVH, int HD, float eps) {
    if (N <= 0) return;
    unsigned gr = cdiv((size_t)N * (NH + KVH), 8);
    if (qk_vec(q, k, q_norm, k_norm, HD))
        qk_norm_rope_kernel<true><<<gr, 256, 0, G.stream>>>((bf16 *)q, (bf16 *)k, (const bf16 *)q_norm, (const bf16 *)k_norm,
                                                             pos, (const float *)inv_freq, N, NH, KVH, HD, eps);
    else
        qk_norm_rope_kernel<false><<<gr, 256, 0, G.stream>>>((bf16 *)q, (bf16 *)k, (const bf16 *)q_norm,
                                                              (const bf16 *)k_norm, pos, (const float *)inv_freq, N, NH,
                                                              KVH, HD, eps);
    launchCheck();
}

// split_columns + qk_norm_rope + kv_write in one kernel: one warp per head row (token n, head h)
// of the fused projection's output, q heads then k heads then v heads. A q or k row is normed from
// the fused row into q or k (row_scale reads the same bf16 values split_columns would have copied),
// rotated there, and a k row then stored into the cache from k; a v row goes to the cache straight
// from the fused row. The cache store is kv_write's: a copy (bf16) or kv_fp8_row (FP8 codes).
template <bool VEC>
__global__ void qkv_rope_kv_kernel(bf16 *q, bf16 *k, const bf16 *qkv, const bf16 *qw, const bf16 *kw, const int32_t *pos,
                                   const float *inv_freq, void *kc, void *vc, float *ks, float *vs, const int32_t *slots,
                                   int N, int NH, int KVH, int HD, float eps) {
    const int H = NH + 2 * KVH;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N * H) return;
    int n = row / H, h = row % H, slot = slots[n];
    const bf16 *src = qkv + ((size_t)n * H + h) * HD;
    if (h < NH + KVH) {
        bool isq = h < NH;
        bf16 *v = isq ? q + ((size_t)n * NH + h) * HD : k + ((size_t)n * KVH + (h - NH)) * HD;
        norm_rope_head<VEC>(v, src, isq ? qw : kw, pos[n], inv_freq, HD, eps, lane);
        if (isq) return;
        __syncwarp();
        src = v;
    }
    if (slot < 0) return;
    bool isv = h >= NH + KVH;
    int hk = isv ? h - NH - KVH : h - NH;
    size_t at = (size_t)slot * KVH + hk;
    if (ks) kv_fp8_row((uint8_t *)(isv ? vc : kc) + at * HD, (isv ? vs : ks) + at, src, HD, lane);
    else {
        bf16 *dst = (bf16 *)(isv ? vc : kc) + at * HD;
        for (int i = lane; i < HD; i += 32) dst[i] = src[i];
    }
}
static void cu_qkv_rope_kv(void *q, void *k, const void *qkv, const void *q_norm, const void *k_norm, const int32_t *pos,
                           const void *inv_freq, void *kc, void *vc, float *ks, float *vs, const int32_t *slots, int N,
                           int NH, int KVH, int HD, float eps) {
    if (N <= 0) return;
    unsigned gr = cdiv((size_t)N * (NH + 2 * KVH), 8);
    // VEC as qk_norm_rope's on the split parts (the same order of sums), reading qkv's head rows
    bool vec = qk_vec(q, k, q_norm, k_norm, HD);
    if (vec && !aligned16(qkv, NULL, NULL, NULL)) die("qkv_rope_kv: the fused q|k|v output must be 16-byte aligned");
#define QKV_LAUNCH(V)                                                                                                   \
    qkv_rope_kv_kernel<V><<<gr, 256, 0, G.stream>>>((bf16 *)q, (bf16 *)k, (const bf16 *)qkv, (const bf16 *)q_norm,      \
                                                    (const bf16 *)k_norm, pos, (const float *)inv_freq, kc, vc, ks, vs, \
                                                    slots, N, NH, KVH, HD, eps)
    if (vec) QKV_LAUNCH(true);
    else QKV_LAUNCH(false);
#undef QKV_LAUNCH
    launchCheck();
}

// elementwise: OP 0 swiglu forward, 1 add; n8 groups of 8 vectorized then a scalar tail
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__global__ void swiglu_fwd_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t n, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = t; i < nv; i += stride) {
        float g[8], u[8];
        load8(g, gate + 8 * i);
        load8(u, up + 8 * i);
#pragma unroll
        for (int j = 0; j < 8; j++) g[j] = silu_mul(g[j], u[j]);
        store8(out + 8 * i, g);
    }
    for (size_t i = nv * 8 + t; i < n; i += stride)
        out[i] = __float2bfloat16_rn(silu_mul(__bfloat162float(gate[i]), __bfloat162float(up[i])));
}
__global__ void swiglu_bwd_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, size_t n,
                                  int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = t; i < nv; i += stride) {
        float d[8], g[8], u[8], dg[8], du[8];
        load8(d, dout + 8 * i);
        load8(g, gate + 8 * i);
        load8(u, up + 8 * i);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float sg = 1.0f / (1.0f + expf(-g[j]));
            dg[j] = d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
            du[j] = d[j] * g[j] * sg;
        }
        store8(dgate + 8 * i, dg);
        store8(dup + 8 * i, du);
    }
    for (size_t i = nv * 8 + t; i < n; i += stride) {
        float d = __bfloat162float(dout[i]), g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
        float sg = 1.0f / (1.0f + expf(-g));
        dgate[i] = __float2bfloat16_rn(d * u * sg * (1.0f + g * (1.0f - sg)));
        dup[i] = __float2bfloat16_rn(d * g * sg);
    }
}
__global__ void add_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = t; i < nv; i += stride) {
        float x[8], y[8];
        load8(x, a + 8 * i);
        load8(y, b + 8 * i);
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] += y[j];
        store8(out + 8 * i, x);
    }
    for (size_t i = nv * 8 + t; i < n; i += stride) out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}
static unsigned grid_vec(size_t n) { return grid_for((n + 7) / 8); }

static void cu_swiglu_forward(void *out, const void *gate, const void *up, size_t n) {
    if (!n) return;
    swiglu_fwd_kernel<<<grid_vec(n), 256, 0, G.stream>>>((bf16 *)out, (const bf16 *)gate, (const bf16 *)up, n,
                                                          aligned16(out, gate, up, NULL));
    launchCheck();
}
static void cu_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    if (!n) return;
    swiglu_bwd_kernel<<<grid_vec(n), 256, 0, G.stream>>>((bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout,
                                                          (const bf16 *)gate, (const bf16 *)up, n,
                                                          aligned16(dgate, dup, dout, gate) && aligned16(up, 0, 0, 0));
    launchCheck();
}
static void cu_add(void *out, const void *a, const void *b, size_t n) {
    if (!n) return;
    add_kernel<<<grid_vec(n), 256, 0, G.stream>>>((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n,
                                                   aligned16(out, a, b, NULL));
    launchCheck();
}

// out[i] = inp[idx[i]] rows (embedding_forward and gather_rows)
__global__ void gather_kernel(bf16 *out, const bf16 *inp, const int32_t *idx, int C, int vec) {
    int i = blockIdx.x;
    const bf16 *src = inp + (size_t)idx[i] * C;
    bf16 *dst = out + (size_t)i * C;
    if (vec)
        for (int c = threadIdx.x; c < C / 8; c += blockDim.x) ((uint4 *)dst)[c] = ((const uint4 *)src)[c];
    else
        for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}
static void cu_gather_rows(void *out, const void *inp, const int32_t *idx, int n_idx, int C) {
    if (n_idx <= 0) return;
    gather_kernel<<<n_idx, 128, 0, G.stream>>>((bf16 *)out, (const bf16 *)inp, idx, C,
                                                C % 8 == 0 && aligned16(out, inp, NULL, NULL));
    launchCheck();
}
// the columns of a fused projection back into their own buffers: one thread per 8 (or 1) elements
struct SplitArgs {
    bf16 *out[4];
    int w[4], n, total, vec;
};
__global__ void split_columns_kernel(SplitArgs a, const bf16 *inp, int N) {
    const int per = a.vec ? 8 : 1, cols = a.total / per;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)N * cols; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / cols), c = (int)(i % cols) * per, p = 0;
        while (c >= a.w[p]) c -= a.w[p++];
        const bf16 *src = inp + i * per;
        bf16 *dst = a.out[p] + (size_t)r * a.w[p] + c;
        if (a.vec) *(uint4 *)dst = *(const uint4 *)src;
        else *dst = *src;
    }
}
static void cu_split_columns(void *const *outs, const int *widths, int n, const void *inp, int N) {
    if (N <= 0) return;
    if (n < 1 || n > 4) die("split_columns: %d parts (1..4)", n);
    SplitArgs a;
    memset(&a, 0, sizeof a);
    a.n = n;
    a.vec = aligned16(inp, NULL, NULL, NULL);
    for (int i = 0; i < n; i++) {
        a.out[i] = (bf16 *)outs[i];
        a.w[i] = widths[i];
        a.total += widths[i];
        a.vec = a.vec && widths[i] % 8 == 0 && aligned16(outs[i], NULL, NULL, NULL);
    }
    split_columns_kernel<<<grid_for((size_t)N * a.total / (a.vec ? 8 : 1)), 256, 0, G.stream>>>(a, (const bf16 *)inp, N);
    launchCheck();
}

static void cu_embedding_forward(void *out, const int32_t *ids, const void *wte, int N, int C) {
    cu_gather_rows(out, wte, ids, N, C);
}

// dwte[id] += dout rows, deterministic and equal to the CPU's row order: the block of the
// first occurrence of an id owns its row; it lists the later occurrences in order
// (ballots, 256 ids at a time) and adds them one after the other in fp32.
#define EMB_LIST 1024
__global__ void embedding_bwd_kernel(float *dwte, const int32_t *ids, const bf16 *dout, int N, int C) {
    __shared__ int list[EMB_LIST + 256];
    __shared__ int wcount[8], cnt;
    const int n = blockIdx.x, id = ids[n], tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int dup = 0;
    for (int m = tid; m < n; m += blockDim.x) dup |= ids[m] == id;
    if (__syncthreads_or(dup)) return;  // an earlier token owns this row
    if (tid == 0) cnt = 0;
    __syncthreads();
    float *row = dwte + (size_t)id * C;
    for (int base = n; base < N; base += 256) {
        int m = base + tid, match = m < N && ids[m] == id;
        unsigned bal = __ballot_sync(0xffffffffu, match);
        if (lane == 0) wcount[warp] = __popc(bal);
        __syncthreads();
        int off = cnt;
        for (int w = 0; w < warp; w++) off += wcount[w];
        if (match) list[off + __popc(bal & ((1u << lane) - 1))] = m;
        __syncthreads();
        if (tid == 0)
            for (int w = 0; w < 8; w++) cnt += wcount[w];
        __syncthreads();
        if (cnt >= EMB_LIST || base + 256 >= N) {  // flush the list in order
            for (int c = tid; c < C; c += blockDim.x) {
                float acc = row[c];
                for (int j = 0; j < cnt; j++) acc += __bfloat162float(dout[(size_t)list[j] * C + c]);
                row[c] = acc;
            }
            __syncthreads();
            if (tid == 0) cnt = 0;
            __syncthreads();
        }
    }
}
static void cu_embedding_backward(void *dwte, const int32_t *ids, const void *dout, int N, int C) {
    if (N <= 0) return;
    embedding_bwd_kernel<<<N, 256, 0, G.stream>>>((float *)dwte, ids, (const bf16 *)dout, N, C);
    launchCheck();
}

// ----------------------------------------------------------------------------
// attention (attention.cu)

static void cu_attention_forward(void *out, void *lse, const void *q, const void *k, const void *v, int B, int T, int NH,
                                 int KVH, int HD) {
    if (B <= 0 || T <= 0) return;
    attention_forward_cuda(out, (float *)lse, q, k, v, B, T, NH, KVH, HD, G.stream);
}
static void cu_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *lse,
                                  const void *q, const void *k, const void *v, int B, int T, int NH, int KVH, int HD) {
    if (B <= 0 || T <= 0) return;
    float *D = (float *)scratch(SC_ATT, attention_backward_scratch(B, T, NH) * 4);
    attention_backward_cuda(dq, dk, dv, dout, out, (const float *)lse, q, k, v, B, T, NH, KVH, HD, D, G.stream);
}
static void cu_kv_write(void *kc, void *vc, float *ks, float *vs, const void *k, const void *v, const int32_t *slots,
                        int N, int KVH, int HD) {
    kv_write_cuda(kc, vc, ks, vs, k, v, slots, N, KVH, HD, G.stream);
}
static void cu_attention_decode(void *out, const void *q, const void *kc, const void *vc, const float *ks,
                                const float *vs, const int32_t *block_table, const int32_t *seq_lens, int S, int NH,
                                int KVH, int HD, int BS, int MB) {
    size_t ns = attention_decode_scratch(S, NH, KVH, HD, BS, MB);
    float *part = ns ? (float *)scratch(SC_ATT, ns * 4) : NULL;
    attention_decode_cuda(out, q, kc, vc, ks, vs, block_table, seq_lens, S, NH, KVH, HD, BS, MB, part, G.stream);
}

// ----------------------------------------------------------------------------
// the language-model head

static void cu_logits_forward(void *logits, const void *h, const void *wlm, int N, int C, int V) {
    if (N <= 0) return;
    gemm_xwt(logits, F32, h, wlm, N, V, C, 1.f, 0.f);
}

// rows of the logits are processed in chunks of at most this many bytes of fp32
#define LOGITS_CHUNK_BYTES ((size_t)512 << 20)
// (FP8GRPO_LOGITS_CHUNK_ROWS overrides it: the tests use it to cover several chunks)
static int logits_chunk_rows(int N, int V) {
    static long forced = -1;
    if (forced < 0) {
        const char *e = getenv("FP8GRPO_LOGITS_CHUNK_ROWS");
        forced = e ? atol(e) : 0;
    }
    size_t r = forced > 0 ? (size_t)forced : LOGITS_CHUNK_BYTES / ((size_t)V * 4);
    if (r < 1) r = 1;
    return (int)(r < (size_t)N ? r : (size_t)N);
}

// (max, sum of exp(x - max)) pairs, merged
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) { m = m2; s = s2; return; }
    if (m2 > m) {
        s = s * expf(m - m2) + s2;
        m = m2;
    } else s += s2 * expf(m2 - m);
}
// block-wide (max, sum) of z = inv_temp * logits[row]; all threads get it. 256 threads.
__device__ void row_lse(const float *z, int V, float inv_temp, float &m_out, float &s_out) {
    __shared__ float sm[8], ss[8];
    float m = -INFINITY, s = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float x = z[j] * inv_temp;
        if (x > m) {
            s = (m == -INFINITY ? 0.f : s * expf(m - x)) + 1.f;
            m = x;
        } else if (x != -INFINITY) s += expf(x - m);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    m = sm[0];
    s = ss[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) lse_merge(m, s, sm[w], ss[w]);
    m_out = m;
    s_out = s;
}

__global__ void logprobs_rows_kernel(float *logp, float *lse, const float *logits, const int32_t *targets, float inv_temp,
                                     int V) {
    int r = blockIdx.x, t = targets[r];
    if (t < 0) {
        if (threadIdx.x == 0) { logp[r] = 0.f; lse[r] = 0.f; }
        return;
    }
    const float *z = logits + (size_t)r * V;
    float m, s;
    row_lse(z, V, inv_temp, m, s);
    if (threadIdx.x == 0) {
        float L = m + logf(s);
        lse[r] = L;
        logp[r] = z[t] * inv_temp - L;
    }
}

static void cu_logprobs_forward(void *logp, void *lse, const void *h, const void *wlm, const int32_t *targets,
                                float inv_temp, int N, int C, int V) {
    if (N <= 0) return;
    int CH = logits_chunk_rows(N, V);
    float *z = (float *)scratch(SC_F32, (size_t)CH * V * 4);
    for (int r0 = 0; r0 < N; r0 += CH) {
        int nr = N - r0 < CH ? N - r0 : CH;
        gemm_xwt(z, F32, (const bf16 *)h + (size_t)r0 * C, wlm, nr, V, C, 1.f, 0.f);
        logprobs_rows_kernel<<<nr, 256, 0, G.stream>>>((float *)logp + r0, (float *)lse + r0, z, targets + r0, inv_temp,
                                                        V);
        launchCheck();
    }
}

// dz[j] = dlogp (1[j = target] - exp(inv_temp z_j - lse)) inv_temp, bf16; zero rows without a target
__global__ void logprobs_dz_kernel(bf16 *dz, const float *logits, const float *dlogp, const float *lse,
                                   const int32_t *targets, float inv_temp, int V) {
    int r = blockIdx.x, t = targets[r];
    float g = dlogp[r], L = lse[r];
    const float *z = logits + (size_t)r * V;
    bf16 *d = dz + (size_t)r * V;
    int live = t >= 0 && g != 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = live ? g * ((float)(j == t) - expf(z[j] * inv_temp - L)) * inv_temp : 0.f;
        d[j] = __float2bfloat16_rn(v);
    }
}

static void cu_logprobs_backward(void *dh, void *dwlm, const void *dlogp, const void *lse, const void *h,
                                 const void *wlm, const int32_t *targets, float inv_temp, int N, int C, int V) {
    if (N <= 0) return;
    int CH = logits_chunk_rows(N, V);
    float *z = (float *)scratch(SC_F32, (size_t)CH * V * 4);
    bf16 *dz = (bf16 *)scratch(SC_BF16, (size_t)CH * V * 2);
    for (int r0 = 0; r0 < N; r0 += CH) {
        int nr = N - r0 < CH ? N - r0 : CH;
        const bf16 *hc = (const bf16 *)h + (size_t)r0 * C;
        gemm_xwt(z, F32, hc, wlm, nr, V, C, 1.f, 0.f);
        logprobs_dz_kernel<<<nr, 256, 0, G.stream>>>(dz, z, (const float *)dlogp + r0, (const float *)lse + r0,
                                                      targets + r0, inv_temp, V);
        launchCheck();
        gemm_xw((bf16 *)dh + (size_t)r0 * C, BF, dz, wlm, nr, V, C, 1.f, 0.f);  // dh (nr, C) = dz W
        if (dwlm) gemm_xtz(dwlm, F32, dz, hc, nr, V, C, 1.f, 1.f);             // dW (V, C) += dz^T h
    }
}

// ----------------------------------------------------------------------------
// sampling, as sample_cpu defines it (fp64; see dev/ops_cpu.c). One block of 256
// threads per row. Sums run in a fixed order (per-thread runs of consecutive elements,
// then a fixed tree), so the result repeats; it differs from the CPU's sequential sums
// only by rounding (~1e-16 relative), which can change the token only when the draw
// falls within that distance of a boundary.

#define SB 256  // threads per sampling block
#define SITEMS 8  // consecutive elements per thread in a scan chunk

struct SampleRow {  // per-row state between the kernels
    double mx, lse, u, T, sum;
    int arg, pad;
};

__device__ __forceinline__ uint64_t splitmix64_dev(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// block-wide inclusive scan of one double per thread (fixed tree: warp shuffles, then warps)
__device__ double block_scan_incl(double v, double *total) {
    __shared__ double ws[SB / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    __syncthreads();
    if (lane == 31) ws[warp] = v;
    __syncthreads();
    double before = 0, all = 0;
    for (int w = 0; w < SB / 32; w++) {
        if (w < warp) before += ws[w];
        all += ws[w];
    }
    *total = all;
    return v + before;
}
__device__ int block_min_int(int v) {
    __shared__ int wm[SB / 32];
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = wm[0];
    for (int w = 1; w < SB / 32; w++) v = min(v, wm[w]);
    return v;
}

// The first index j < n whose running sum of w(j) exceeds target (or -1), and the total,
// in the fixed chunk order: chunk of SB*SITEMS, thread runs of SITEMS, block scan.
// With target = +inf it only returns the total.
template <typename W>
__device__ int scan_find(W w, int n, double target, double *total_out) {
    double run = 0;
    for (int base = 0; base < n; base += SB * SITEMS) {
        int j0 = base + threadIdx.x * SITEMS;
        double part = 0;
        for (int i = 0; i < SITEMS; i++)
            if (j0 + i < n) part += w(j0 + i);
        double tot, incl = block_scan_incl(part, &tot);
        double c = run + (incl - part);
        int found = n;
        for (int i = 0; i < SITEMS; i++)
            if (j0 + i < n && found == n) {
                c += w(j0 + i);
                if (c > target) found = j0 + i;
            }
        found = block_min_int(found);
        if (found < n) return found;
        run += tot;
    }
    *total_out = run;
    return -1;
}

// The row is cut into NSEG segments so that S rows keep S * NSEG blocks busy (one block
// per row leaves most of the GPU idle at S = 64 and walks 151,936 logits serially).
#define NSEG 16

// (value, index) max with the lowest index on ties; index V means "none yet"
__device__ __forceinline__ void argmax_merge(float &best, int &bidx, float b2, int i2, int V) {
    if (i2 != V && (bidx == V || b2 > best || (b2 == best && i2 < bidx))) {
        best = b2;
        bidx = i2;
    }
}
__device__ void block_argmax(float &best, int &bidx, int V) {
    __shared__ float bv[SB / 32];
    __shared__ int bi[SB / 32];
    for (int o = 16; o > 0; o >>= 1)
        argmax_merge(best, bidx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bidx, o), V);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        bv[threadIdx.x >> 5] = best;
        bi[threadIdx.x >> 5] = bidx;
    }
    __syncthreads();
    best = bv[0];
    bidx = bi[0];
    for (int w = 1; w < SB / 32; w++) argmax_merge(best, bidx, bv[w], bi[w], V);
}
__device__ __forceinline__ void seg_range(int seg, int V, int *j0, int *j1) {
    int len = (V + NSEG - 1) / NSEG;
    *j0 = min(V, seg * len);
    *j1 = min(V, *j0 + len);
}

// pass 1, grid (NSEG, S): each segment's argmax (lowest index on ties)
__global__ void sample_segmax_kernel(float *segv, int *segi, const float *logits, int V) {
    int seg = blockIdx.x, s = blockIdx.y, j0, j1;
    seg_range(seg, V, &j0, &j1);
    const float *z = logits + (size_t)s * V;
    float best = -INFINITY;
    int bidx = V;
    for (int j = j0 + threadIdx.x; j < j1; j += SB) argmax_merge(best, bidx, z[j], j, V);
    block_argmax(best, bidx, V);
    if (threadIdx.x == 0) {
        segv[s * NSEG + seg] = best;
        segi[s * NSEG + seg] = bidx;
    }
}

// the row's argmax from its segments, in segment order (so ties go to the lowest index)
__device__ __forceinline__ int row_argmax(const float *segv, const int *segi, int s, int V) {
    float best = -INFINITY;
    int bidx = V;
    for (int k = 0; k < NSEG; k++) argmax_merge(best, bidx, segv[s * NSEG + k], segi[s * NSEG + k], V);
    return bidx;
}

// pass 2, grid (NSEG, S): each segment's sum of exp(z/T - mx), mx = max z / T; a fixed order
// (SITEMS-runs per thread, then block_scan_incl's fixed tree), so the result repeats
__global__ void sample_segsum_kernel(double *segsum, const float *segv, const int *segi, const float *logits, int V,
                                     double T) {
    int seg = blockIdx.x, s = blockIdx.y, j0, j1;
    seg_range(seg, V, &j0, &j1);
    const float *z = logits + (size_t)s * V;
    double mx = (double)z[row_argmax(segv, segi, s, V)] / T, total;
    scan_find([&](int j) { return exp((double)z[j0 + j] / T - mx); }, j1 - j0, INFINITY, &total);
    if (threadIdx.x == 0) segsum[s * NSEG + seg] = total;
}

// pass 3, grid S: lse and the draw u; without truncation also the token: the segment where
// the running sum (segments in order) passes u * sum, then the index within it
__global__ void sample_finish_kernel(SampleRow *st, int32_t *tokens, float *logp, const double *segsum,
                                     const float *segv, const int *segi, const float *logits, uint64_t *rng, int V,
                                     float temperature, int pick) {
    int s = blockIdx.x;
    const float *z = logits + (size_t)s * V;
    double T = temperature > 0 ? (double)temperature : 1.0, total = 0;
    int arg = row_argmax(segv, segi, s, V);
    double mx = (double)z[arg] / T;
    for (int k = 0; k < NSEG; k++) total += segsum[s * NSEG + k];
    SampleRow r;
    r.mx = mx;
    r.sum = total;
    r.lse = mx + log(total);
    r.T = T;
    r.arg = arg;
    r.u = 0;
    if (temperature > 0) {
        uint64_t x = rng[s];  // every thread draws the same u; thread 0 stores the state
        r.u = (double)(splitmix64_dev(&x) >> 11) * (1.0 / 9007199254740992.0);
        __syncthreads();
        if (threadIdx.x == 0) rng[s] = x;
    }
    if (threadIdx.x == 0) st[s] = r;
    if (!pick) return;
    int tok = arg;
    if (temperature > 0) {
        double target = r.u * total, before = 0;
        int k = 0;
        while (k < NSEG - 1 && before + segsum[s * NSEG + k] <= target) before += segsum[s * NSEG + k++];
        int j0, j1;
        seg_range(k, V, &j0, &j1);
        double dummy;
        int f = scan_find([&](int j) { return exp((double)z[j0 + j] / T - mx); }, j1 - j0, target - before, &dummy);
        // not found: rounding put the target at the segment's very end
        tok = f >= 0 ? j0 + f : j1 - 1;
    }
    if (threadIdx.x == 0) {
        tokens[s] = tok;
        logp[s] = (float)((double)z[tok] / T - r.lse);
    }
}

// pass 2 (top-k / top-p) over the row sorted by logit, descending, ties by id (a stable
// sort of ids 0..V-1 keeps the CPU's id order)
__global__ void sample_trunc_kernel(int32_t *tokens, float *logp, const SampleRow *st, const float *logits,
                                    const float *skeys, const int32_t *sids, int V, int top_k, float top_p,
                                    double top_p_below) {
    int s = blockIdx.x;
    const float *z = logits + (size_t)s * V, *k = skeys + (size_t)s * V;
    const int32_t *ids = sids + (size_t)s * V;
    SampleRow r = st[s];
    auto p = [&](int j) { return exp((double)k[j] / r.T - r.lse); };
    int keep = (top_k > 0 && top_k < V) ? top_k : V;
    double kept_mass, m;
    scan_find(p, keep, INFINITY, &kept_mass);
    if (top_p < 1.0f) {
        // the smallest prefix whose renormalised mass reaches top_p (c >= top_p, at least one);
        // top_p_below is the double just under top_p, so c > top_p_below is c >= top_p
        double dummy;
        int f = scan_find([&](int j) { return p(j) / kept_mass; }, keep, top_p_below, &dummy);
        keep = f >= 0 ? f + 1 : keep;
    }
    scan_find(p, keep, INFINITY, &m);
    double dummy;
    int f = scan_find(p, keep, r.u * m, &dummy);
    int tok = ids[f >= 0 ? f : keep - 1];
    if (threadIdx.x == 0) {
        tokens[s] = tok;
        logp[s] = (float)((double)z[tok] / r.T - r.lse);
    }
}

__global__ void iota_rows_kernel(int32_t *ids, int32_t *offsets, int S, int V) {
    size_t n = (size_t)S * V;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        ids[i] = (int32_t)(i % V);
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i <= S; i += blockDim.x) offsets[i] = i * V;
}

static void cu_sample(int32_t *tokens, void *logp, const void *logits, uint64_t *rng, int S, int V, float temperature,
                      int top_k, float top_p) {
    if (S <= 0) return;
    size_t off_seg = ((size_t)S * sizeof(SampleRow) + (size_t)(S + 1) * 4 + 255) / 256 * 256;
    char *small = (char *)scratch(SC_SMALL, off_seg + (size_t)S * NSEG * (8 + 4 + 4) + 256);
    SampleRow *st = (SampleRow *)small;
    int32_t *offsets = (int32_t *)(small + ((size_t)S * sizeof(SampleRow) + 255) / 256 * 256);
    double *segsum = (double *)(small + off_seg);
    float *segv = (float *)(segsum + (size_t)S * NSEG);
    int *segi = (int *)(segv + (size_t)S * NSEG);
    const float *z = (const float *)logits;
    double T = temperature > 0 ? (double)temperature : 1.0;
    int plain = !(temperature > 0) || (top_k <= 0 && top_p >= 1.0f);
    sample_segmax_kernel<<<dim3(NSEG, S), SB, 0, G.stream>>>(segv, segi, z, V);
    launchCheck();
    sample_segsum_kernel<<<dim3(NSEG, S), SB, 0, G.stream>>>(segsum, segv, segi, z, V, T);
    launchCheck();
    sample_finish_kernel<<<S, SB, 0, G.stream>>>(st, tokens, (float *)logp, segsum, segv, segi, z, rng, V, temperature,
                                                 plain);
    launchCheck();
    if (plain) return;
    // sort each row by logit (descending, stable, so equal logits keep ascending ids)
    size_t n = (size_t)S * V, temp = 0;
    cudaCheck(cub::DeviceSegmentedRadixSort::SortPairsDescending(NULL, temp, z, (float *)NULL, (int32_t *)NULL,
                                                                 (int32_t *)NULL, (int)n, S, offsets, offsets + 1, 0,
                                                                 32, G.stream));
    size_t al = 256, off_keys = 0, off_ids_in = (n * 4 + al - 1) / al * al, off_ids = off_ids_in * 2,
           off_tmp = off_ids + off_ids_in;
    char *buf = (char *)scratch(SC_SORT, off_tmp + temp);
    float *skeys = (float *)(buf + off_keys);
    int32_t *ids_in = (int32_t *)(buf + off_ids_in), *sids = (int32_t *)(buf + off_ids);
    iota_rows_kernel<<<grid_for(n), 256, 0, G.stream>>>(ids_in, offsets, S, V);
    launchCheck();
    cudaCheck(cub::DeviceSegmentedRadixSort::SortPairsDescending(buf + off_tmp, temp, z, skeys, ids_in, sids, (int)n, S,
                                                                 offsets, offsets + 1, 0, 32, G.stream));
    sample_trunc_kernel<<<S, SB, 0, G.stream>>>(tokens, (float *)logp, st, z, skeys, sids, V, top_k, top_p,
                                                    nextafter((double)top_p, -INFINITY));
    launchCheck();
}

// ----------------------------------------------------------------------------
// optimizer and reductions: fp64 with the CPU's operation order, no FMA contraction

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, double lr, double b1,
                             double b2, double eps, double wd, double bc1, double bc2) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double g = grad[i];
        double mi = __dadd_rn(__dmul_rn(b1, (double)m[i]), __dmul_rn(__dsub_rn(1.0, b1), g));
        double vi = __dadd_rn(__dmul_rn(b2, (double)v[i]), __dmul_rn(__dmul_rn(__dsub_rn(1.0, b2), g), g));
        m[i] = (float)mi;
        v[i] = (float)vi;
        double p = __dmul_rn((double)param[i], __dsub_rn(1.0, __dmul_rn(lr, wd)));
        double step = __ddiv_rn(__dmul_rn(lr, __ddiv_rn(mi, bc1)), __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, bc2)), eps));
        param[i] = (float)__dsub_rn(p, step);
    }
}
static void cu_adamw(void *param, const void *grad, void *m, void *v, size_t n, float lr, float beta1, float beta2,
                     float eps, float weight_decay, int step) {
    if (!n) return;
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    adamw_kernel<<<grid_for(n), 256, 0, G.stream>>>((float *)param, (const float *)grad, (float *)m, (float *)v, n, lr,
                                                    beta1, beta2, eps, weight_decay, bc1, bc2);
    launchCheck();
}

#define SUMSQ_BLOCKS 512
__global__ void sumsq_partial(double *part, const float *x, size_t n) {
    __shared__ double sm[256];
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    sm[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) sm[threadIdx.x] += sm[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sm[0];
}
__global__ void sumsq_finish(double *out, const double *part, int np) {
    __shared__ double sm[256];
    double s = 0;
    for (int i = threadIdx.x; i < np; i += 256) s += part[i];
    sm[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) sm[threadIdx.x] += sm[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sm[0];
}
static double cu_sumsq(const void *x, size_t n) {
    if (!n) return 0;
    double *part = (double *)scratch(SC_RED, (SUMSQ_BLOCKS + 1) * sizeof(double));
    sumsq_partial<<<SUMSQ_BLOCKS, 256, 0, G.stream>>>(part, (const float *)x, n);
    launchCheck();
    sumsq_finish<<<1, 256, 0, G.stream>>>(part + SUMSQ_BLOCKS, part, SUMSQ_BLOCKS);
    launchCheck();
    cudaCheck(cudaMemcpyAsync(G.sum_host, part + SUMSQ_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost, G.stream));
    cudaCheck(cudaStreamSynchronize(G.stream));
    return *G.sum_host;
}

__global__ void scale_kernel(float *x, size_t n, double s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (float)__dmul_rn((double)x[i], s);
}
static void cu_scale(void *x, size_t n, float s) {
    if (!n) return;
    scale_kernel<<<grid_for(n), 256, 0, G.stream>>>((float *)x, n, s);
    launchCheck();
}

// ----------------------------------------------------------------------------
// the table and its initialisation

__global__ void probe_kernel(int *x) { *x = 1; }

// ---- CUDA graphs: the decode step is ~600 small launches; a graph replays them in one ----
static void cu_graph_begin(void) { cudaCheck(cudaStreamBeginCapture(G.stream, cudaStreamCaptureModeRelaxed)); }
static void *cu_graph_end(void) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamEndCapture(G.stream, &g);
    if (e != cudaSuccess || !g) {
        cudaGetLastError();
        return NULL;
    }
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return exec;
}
static void cu_graph_launch(void *graph) { cudaCheck(cudaGraphLaunch((cudaGraphExec_t)graph, G.stream)); }
static void cu_graph_destroy(void *graph) {
    if (graph) cudaCheck(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}
static unsigned cu_scratch_epoch(void) { return G.epoch + fp8_cuda_scratch_epoch(); }

// for dev/ tools (dev/op_profile.h): the stream every op runs on
extern "C" void *backend_cuda_stream(void) { return G.stream; }

static Backend be = {
    .name = "cuda",
    .act = DT_BF16,
    .hp = DT_F32,
    .device_desc = "",
    .alloc = cu_alloc,
    .free = cu_free,
    .zero = cu_zero,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .copy_2d = cu_copy_2d,
    .upload_convert = cu_upload_convert,
    .sync = cu_sync,
    .mem_in_use = cu_mem_in_use,
    .mem_capacity = cu_mem_capacity,
    .quantize_weight = cu_quantize_weight,
    .dequantize_weight = cu_dequantize_weight,
    .embedding_forward = cu_embedding_forward,
    .embedding_backward = cu_embedding_backward,
    .rmsnorm_forward = cu_rmsnorm_forward,
    .rmsnorm_backward = cu_rmsnorm_backward,
    .linear_forward = cu_linear_forward,
    .linear_backward = cu_linear_backward,
    .lora_forward = cu_lora_forward,
    .lora_apply = cu_lora_apply,
    .to_act = cu_to_act,
    .lora_backward = cu_lora_backward,
    .rope_forward = cu_rope_forward,
    .rope_backward = cu_rope_backward,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
    .swiglu_forward = cu_swiglu_forward,
    .swiglu_backward = cu_swiglu_backward,
    .add = cu_add,
    .add_rmsnorm = cu_add_rmsnorm,
    .qk_norm_rope = cu_qk_norm_rope,
    .gather_rows = cu_gather_rows,
    .split_columns = cu_split_columns,
    .logits_forward = cu_logits_forward,
    .logprobs_forward = cu_logprobs_forward,
    .logprobs_backward = cu_logprobs_backward,
    .kv_write = cu_kv_write,
    .qkv_rope_kv = cu_qkv_rope_kv,
    .attention_decode = cu_attention_decode,
    .sample = cu_sample,
    .adamw = cu_adamw,
    .sumsq = cu_sumsq,
    .scale = cu_scale,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_destroy = cu_graph_destroy,
    .scratch_epoch = cu_scratch_epoch,
};

extern "C" const Backend *backend_cuda(char *why, size_t why_cap) {
    if (G.init) return &be;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, why_cap, "no usable CUDA driver or device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    if (n == 0) {
        snprintf(why, why_cap, "no CUDA device found");
        return NULL;
    }
    int dev = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, why_cap, "cannot query the CUDA device");
        return NULL;
    }
    if (p.major < 8) {
        snprintf(why, why_cap, "%s has compute capability %d.%d; the CUDA backend needs 8.0+ (BF16 tensor cores)",
                 p.name, p.major, p.minor);
        return NULL;
    }
    // a build without code for this GPU fails here rather than at the first op
    int *probe = NULL;
    if (cudaMalloc(&probe, sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, why_cap, "cannot allocate memory on %s", p.name);
        return NULL;
    }
    probe_kernel<<<1, 1>>>(probe);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    cudaFree(probe);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, why_cap, "%s (sm_%d%d) cannot run this build's kernels (%s): rebuild with make GPU_ARCH=%d%d", p.name,
                 p.major, p.minor, cudaGetErrorString(e), p.major, p.minor);
        return NULL;
    }
    cudaCheck(cudaStreamCreateWithFlags(&G.stream, cudaStreamNonBlocking));
    cublasCheck(cublasCreate(&G.cublas));
    cublasCheck(cublasSetStream(G.cublas, G.stream));
    cublasCheck(cublasSetMathMode(G.cublas, CUBLAS_DEFAULT_MATH));  // no TF32 for fp32 products
    cudaCheck(cudaMallocHost((void **)&G.sum_host, sizeof(double)));
    fp8_cuda_init(G.stream);
    {
        size_t fr = 0, tot = 0;
        cudaCheck(cudaMemGetInfo(&fr, &tot));
        mem_base = tot - fr;
        mem_total = tot;
    }
    snprintf(be.device_desc, sizeof be.device_desc, "%.90s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
             p.totalGlobalMem / 1073741824.0);
    G.init = 1;
    return &be;
}
