// backend_cuda.cu: the CUDA backend (backend.h): act = bf16, hp = f32, one stream.
//   defines: backend_cuda(), the Backend table, and the ops built on cuBLAS and on the other files'
//   kernels: memory, weights, linear (FP8: fp8.cu), LoRA, attention (attention.cu), the LM head and
//   logprobs, the optimizer, replay (CUDA graphs). The per-token ops are in ops_cuda.cu, the sampler
//   in sample.cu, Qwen3 MoE's router and experts (grouped GEMMs) in moe.cu (backend_cuda.cuh).
// Needs: a GPU of compute capability 8.0+ (BF16 tensor cores), cuBLAS. The numeric truth
// of every op is its ops_cpu.c reference; test/gpu_backend.cu checks each against it.
//
// Where the precision goes (everything else is fp32 arithmetic on bf16 storage):
//   linear      FP8: activations quantized per call to the weight's granularity (E4M3,
//               amax scales, as the CPU's fake quantization), FP8 GEMM (cuBLASLt) into
//               bf16. OFF: BF16 GEMM, fp32 accumulation. dX through frozen FP8 weights
//               (fp8_linear_dx_cuda): where dX is 2048 wide or more, dY quantized as the
//               forward's X is (E4M3 1x128 groups; E5M2 per tensor), one FP8 GEMM with
//               W^T (W's codes transposed); narrower, and ROW weights: W dequantized to
//               bf16, one BF16 GEMM.
//   LoRA        BF16 tensor-core GEMMs with fp32 accumulation: the fp32 masters A, B and
//               the saved fp32 ax are rounded to bf16 (2^-8 relative) for each product;
//               ax, the gradients dA, dB and the masters stay fp32.
//   logprobs    fp32 logits in chunks of rows (never (N, V) at once), fp32 logsumexp;
//               the backward's dz = dlogp (onehot - softmax) / T is rounded to bf16 for
//               the two GEMMs (dh = dz W, dW += dz^T h).
//   reductions  no float atomics anywhere: sums over rows (dbias, norm weights, embedding
//               rows, sumsq) use fixed-order partials, so results repeat bit for bit.
//   moe         the router in fp32 (the CPU's in double: the same choices, see moe.cu); the
//               experts' grouped GEMMs as linear's products (FP8: activations quantized to the
//               weight's granularity, fp32 sums), each token's K outputs summed in slot order.
//   sample      fp64, the CPU's formulas; the draw is the sequence's splitmix64 state.
//   adamw (fp32) and scale with the CPU's operation order and no FMA contraction: bit-exact.
#include <math.h>

#include "cuda/attention_cuda.h"
#include "cuda/backend_cuda.cuh"
#include "cuda/fp8_cuda.h"

// ----------------------------------------------------------------------------
// the backend's state: one stream, one cuBLAS handle, scratch buffers that only grow, the recorded
// decode steps

#define MAX_REPLAYS 16
#define REPLAY_KEY_BYTES 128
typedef struct {
    unsigned char key[REPLAY_KEY_BYTES];
    size_t key_bytes;     // 0: a free slot
    int runs;             // plain runs so far (it is captured on the second call)
    cudaGraphExec_t exec;
} Replay;

static struct {
    int init;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *scratch[SC_COUNT];
    size_t scratch_bytes[SC_COUNT];
    double *sum_host;  // pinned, sumsq result
    unsigned epoch;    // bumped when a scratch buffer moves: the recordings hold the old pointers
    Replay replays[MAX_REPLAYS];
    unsigned replay_epoch;  // epoch + fp8.cu's when the recordings were made
    int replay_next;        // round robin over the slots when all are taken
} G;

cudaStream_t cu_stream(void) { return G.stream; }

// the one-line error of a failed cudaMalloc: what was asked, what is free, which options lower it
__attribute__((noreturn)) static void die_out_of_memory(size_t bytes, const char *what) {
    cudaGetLastError();
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    die("out of GPU memory allocating %.1f MiB%s (%.1f MiB free of %.1f): lower --gpu_memory_utilization or the batch "
        "size", bytes / 1048576.0, what, fr / 1048576.0, tot / 1048576.0);
}

void *cu_scratch(int i, size_t bytes) {
    if (G.scratch_bytes[i] < bytes) {
        cudaCheck(cudaStreamSynchronize(G.stream));
        if (G.scratch[i]) cudaCheck(cudaFree(G.scratch[i]));
        G.scratch[i] = NULL;
        size_t want = bytes + bytes / 8;  // a little headroom against regrowth
        if (cudaMalloc(&G.scratch[i], want) != cudaSuccess) die_out_of_memory(want, " of CUDA backend scratch");
        G.scratch_bytes[i] = want;
        G.epoch++;  // recordings made before hold the old pointer
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
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) die_out_of_memory(bytes, "");
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
        void *stage = cu_scratch(SC_STAGE, m * ss);
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
    if (w->gran == FP8_ROW && n > ((size_t)32 << 20) && w->rows > 1) {
        // rows quantize on their own: a large table (an FP8 embedding, 4.2 GB in f32 at the 70B shape)
        // goes through the staging buffers in chunks of rows, never all at once
        int rows = (int)(((size_t)32 << 20) / w->cols);
        if (rows < 1) rows = 1;
        for (int r0 = 0; r0 < w->rows; r0 += rows) {
            QWeight part = *w;
            part.rows = part.q.rows = w->rows - r0 < rows ? w->rows - r0 : rows;
            part.q.data += (size_t)r0 * w->cols;
            part.q.scale += r0;
            cu_quantize_weight(&part, (const char *)src + (size_t)r0 * w->cols * dtype_size(st), st, pow2);
        }
        return;
    }
    // fp8_quantize_cuda reads bf16 or f32; other sources go through an f32 copy (as the CPU does)
    void *stage = cu_scratch(SC_STAGE, n * dtype_size(st));
    cu_upload(stage, src, n * dtype_size(st));
    const void *x = stage;
    DType xt = st;
    if (st != DT_BF16 && st != DT_F32) {
        x = cu_scratch(SC_STAGE2, n * 4);
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
// out (N, OC) bf16 = y (N, OC) f32 + bias (OC) bf16, in fp32 then rounded once
__global__ void bias_out_kernel(bf16 *out, const float *y, const bf16 *bias, size_t n, int OC) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(y[i] + __bfloat162float(bias[i % OC]));
}

// ----------------------------------------------------------------------------
// linear layers

// y (N, OC) (ydt bf16 or f32) = inp (N, C) bf16 W^T for an FP8 weight: the activations quantized
// dynamically to the weight's granularity (as backend_cpu.c), then the FP8 GEMM
static void fp8_act_gemm(void *y, DType yt, const void *inp, const QWeight *w, int N) {
    FP8Tensor xq;
    memset(&xq, 0, sizeof xq);
    xq.rows = N;
    xq.cols = w->cols;
    xq.gran = w->gran;
    xq.fmt = FP8_E4M3;
    xq.block_rows = 1;
    xq.data = (uint8_t *)cu_scratch(SC_ACT_Q, (size_t)N * w->cols);
    xq.scale = (float *)cu_scratch(SC_ACT_S, fp8_num_scales(w->gran, N, w->cols, 1) * 4);
    fp8_quantize_cuda(&xq, inp, DT_BF16, 0);
    fp8_gemm_cuda(y, yt, &xq, &w->q, 0);
}

// linear_forward (inp act), linear_forward_q (xq, inp's FP8 copy) and fp8_train_forward_keep (keep:
// where a trained weight's forward leaves inp's codes): the product, then the bias
static void linear_impl(void *out, const void *inp, const FP8Tensor *xq, const QWeight *w, const void *bias, int N,
                        FP8Tensor *keep) {
    int C = w->cols, OC = w->rows;
    if (N <= 0) return;
    size_t n = (size_t)N * OC;
    void *y = bias ? cu_scratch(SC_F32, n * 4) : out;
    DType yt = bias ? DT_F32 : DT_BF16;
    if (xq && w->train) {
        cu_fp8_train_forward_kept(y, yt, xq, w, N);
    } else if (xq) {
        linear_q_check(xq, w, N);
        fp8_gemm_cuda(y, yt, xq, &w->q, 0);
    } else if (w->train) {
        cu_fp8_train_forward(y, yt, inp, w, N, keep);
    } else if (w->gran == FP8_OFF) {
        gemm_xwt(y, bias ? F32 : BF, inp, w->dense, N, OC, C, 1.f, 0.f);
    } else fp8_act_gemm(y, yt, inp, w, N);
    if (bias) {
        bias_out_kernel<<<grid_for(n), 256, 0, G.stream>>>((bf16 *)out, (const float *)y, (const bf16 *)bias, n, OC);
        launchCheck();
    }
}
static void cu_linear_forward(void *out, const void *inp, const QWeight *w, const void *bias, int N) {
    linear_impl(out, inp, NULL, w, bias, N, NULL);
}
static void cu_linear_forward_q(void *out, const FP8Tensor *xq, const QWeight *w, const void *bias, int N) {
    linear_impl(out, NULL, xq, w, bias, N, NULL);
}
static void cu_quantize_act(FP8Tensor *xq, const void *inp, int N) {  // as fp8_act_gemm quantizes
    if (N <= 0) return;
    if (xq->rows != N) die("quantize_act: %d rows into an FP8 tensor of %d", N, xq->rows);
    fp8_quantize_cuda(xq, inp, DT_BF16, 0);
}
static int cu_fp8_train_forward_keep(void *out, const void *inp, const QWeight *w, const void *bias, int N, FP8Tensor *keep) {
    if (!w->train || !fp8_train_keeps(w->train)) return 0;
    linear_impl(out, inp, NULL, w, bias, N, keep);
    return 1;
}

// dinp (n) bf16 = bf16(dinp + y), y f32 or bf16, summed in fp32
template <typename T>
__global__ void accumulate_kernel(bf16 *dinp, const T *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dinp[i] = __float2bfloat16_rn(__bfloat162float(dinp[i]) + ld_f(y, i));
}

// With accumulate, the BF16 products go to scratch and are added in a second pass: a GEMM with
// beta = 1 and a bf16 output may split K and round its partial sums to bf16 (dev/notes/fp8-training.md,
// "Figures that were in product comments"), which the fp32 scratch avoids (FP8 weights through the
// BF16 reference: bf16 scratch, one rounding of the product before the sum). The FP8 product of dX adds itself
// (fp8_linear_dx_cuda with accumulate: its plans do not split K into bf16 partial sums, so
// dinp + the fp32 product is rounded once), sparing the scratch's write and the second pass's
// three reads and writes of dinp's size.
static void cu_linear_backward(void *dinp, int accumulate, void *dw, void *dbias, const void *dout, const void *inp,
                               const QWeight *w, int N) {
    int C = w->cols, OC = w->rows;
    if (N <= 0) return;
    if (w->train) {
        cu_fp8_train_backward(dinp, accumulate, (float *)dw, dout, inp, NULL, w, N);
        if (dbias) cu_colsum((float *)dbias, (const bf16 *)dout, N, OC);
        return;
    }
    if (dinp) {
        size_t n = (size_t)N * C;
        if (w->gran == FP8_OFF) {
            if (!accumulate) gemm_xw(dinp, BF, dout, w->dense, N, OC, C, 1.f, 0.f);
            else {
                float *y = (float *)cu_scratch(SC_F32, n * 4);
                gemm_xw(y, F32, dout, w->dense, N, OC, C, 1.f, 0.f);
                accumulate_kernel<<<grid_for(n), 256, 0, G.stream>>>((bf16 *)dinp, y, n);
                launchCheck();
            }
        } else {
            if (!accumulate || fp8_linear_dx_is_fp8(&w->q)) fp8_linear_dx_cuda(dinp, accumulate, dout, &w->q, N);
            else {
                bf16 *y = (bf16 *)cu_scratch(SC_BF16, n * 2);
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
    if (dbias) cu_colsum((float *)dbias, (const bf16 *)dout, N, OC);
}
static void cu_fp8_train_backward_kept(void *dinp, int accumulate, void *dw, void *dbias, const void *dout,
                                       const FP8Tensor *kept, const QWeight *w, int N) {
    if (N <= 0) return;
    if (!w->train) die("fp8_train_backward_kept: the weight is not trained in FP8");
    cu_fp8_train_backward(dinp, accumulate, (float *)dw, dout, NULL, kept, w, N);
    if (dbias) cu_colsum((float *)dbias, (const bf16 *)dout, N, w->rows);
}

// ---- LoRA: out += scale * (inp A^T) B^T, in BF16 GEMMs (see the top of the file) ----
// ax and dax of row stride ld: the GEMM's leading dimension

static void cu_lora_down(void *ax, const void *inp, const void *A, int N, int C, int R) {
    if (N <= 0) return;
    gemm_xwt(ax, BF, inp, A, N, R, C, 1.f, 0.f);  // ax (N, R) bf16 = inp A^T (fp32 sums, one rounding)
}
static void cu_lora_up(void *out, const void *ax, int ld, const void *B, float scale, int N, int R, int OC) {
    if (N <= 0) return;
    gemm(OPT, OPN, OC, N, R, scale, B, BF, R, ax, BF, ld, 1.f, out, BF, OC);  // out (N, OC) += scale ax B^T
}
static void cu_lora_apply(void *out, const void *inp, const void *A, const void *B, float scale, int N, int C, int R,
                          int OC) {
    if (N <= 0) return;
    bf16 *ax = (bf16 *)cu_scratch(SC_LORA_X, (size_t)N * R * 2);
    cu_lora_down(ax, inp, A, N, C, R);
    cu_lora_up(out, ax, R, B, scale, N, R, OC);
}
static void cu_to_act(void *dst, const void *src, size_t n) { to_bf16((bf16 *)dst, (const float *)src, n); }

static void cu_lora_up_backward(void *dax, void *dB, const void *dout, const void *ax, int ld, const void *B, float scale,
                                int N, int R, int OC) {
    if (N <= 0) return;
    gemm(OPN, OPN, R, N, OC, scale, B, BF, R, dout, BF, OC, 0.f, dax, BF, ld);   // dax (N, R) bf16 = scale dout B
    gemm(OPN, OPT, R, OC, N, scale, ax, BF, ld, dout, BF, OC, 1.f, dB, F32, R);  // dB (OC, R) += scale dout^T ax
}
static void cu_lora_down_backward(void *dinp, void *dA, const void *dax, const void *inp, const void *A, int N, int C,
                                  int R) {
    if (N <= 0) return;
    gemm_xw(dinp, BF, dax, A, N, R, C, 1.f, 1.f);   // dinp (N, C) += dax A
    gemm_xtz(dA, F32, dax, inp, N, R, C, 1.f, 1.f);  // dA (R, C) += dax^T inp
}

// ----------------------------------------------------------------------------
// attention (attention.cu)

static void cu_attention_forward(void *out, void *lse, const void *q, const void *k, const void *v, int B, int T, int NH,
                                 int KVH, int HD, double scale, int window) {
    if (B <= 0 || T <= 0) return;
    attention_forward_cuda(out, (float *)lse, q, k, v, B, T, NH, KVH, HD, (float)scale, window, G.stream);
}
static void cu_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *lse,
                                  const void *q, const void *k, const void *v, int B, int T, int NH, int KVH, int HD,
                                  double scale, int window) {
    if (B <= 0 || T <= 0) return;
    float *D = (float *)cu_scratch(SC_ATT, attention_backward_scratch(B, T, NH) * 4);
    attention_backward_cuda(dq, dk, dv, dout, out, (const float *)lse, q, k, v, B, T, NH, KVH, HD, (float)scale, window, D,
                            G.stream);
}
static void cu_kv_write(void *kc, void *vc, float *ks, float *vs, const void *k, const void *v, const int32_t *slots,
                        int N, int KVH, int HD) {
    kv_write_cuda(kc, vc, ks, vs, k, v, slots, N, KVH, HD, G.stream);
}
static void cu_attention_decode(void *out, const void *q, const void *kc, const void *vc, const float *ks,
                                const float *vs, const int32_t *block_table, const int32_t *seq_lens, int S, int NH,
                                int KVH, int HD, int BS, int MB, double scale, int window, FP8Tensor *outq) {
    size_t ns = attention_decode_scratch(S, NH, KVH, HD, BS, MB);
    float *part = ns ? (float *)cu_scratch(SC_ATT, ns * 4) : NULL;
    if (outq) cu_check_outq(outq, S, NH * HD, "attention_decode");
    // the FP8 copy in the same launch where a head is whole 1x128 groups (ROW needs the whole row's amax)
    int fuse = outq && outq->gran == FP8_BLOCK && HD % FP8_BLOCK_SIZE == 0;
    attention_decode_cuda(out, q, kc, vc, ks, vs, block_table, seq_lens, S, NH, KVH, HD, BS, MB, (float)scale, window, part,
                          fuse ? outq->data : NULL, fuse ? outq->scale : NULL, G.stream);
    if (outq && !fuse) fp8_quantize_cuda(outq, out, DT_BF16, 0);
}

// ----------------------------------------------------------------------------
// the language-model head

// z (nr, V) f32 = h (nr, C) W^T: a BF16 GEMM, or for an FP8 head (E4M3 rows) h quantized per row as
// linear_forward quantizes a ROW weight's input, and the FP8 GEMM with fp32 output; or for a head
// trained in FP8 (w->train: --fp8_lm_head) its FP8 product from W's codes wq (head_weight; fp8_train.cu)
static void head_logits(float *z, const void *h, const QWeight *w, const FP8Tensor *wq, int nr) {
    if (w->train) cu_fp8_head_logits(z, h, w, wq, nr);
    else if (w->gran == FP8_OFF) gemm_xwt(z, F32, h, w->dense, nr, w->rows, w->cols, 1.f, 0.f);
    else fp8_act_gemm(z, DT_F32, h, w, nr);
}
// a head trained in FP8: W's codes, made once for all of a call's chunks
static FP8Tensor head_weight(const QWeight *w) {
    FP8Tensor wq;
    memset(&wq, 0, sizeof wq);
    if (w->train) cu_fp8_head_weight(w, &wq, NULL);
    return wq;
}

// vocabulary rows of an FP8 head dequantized at a time in its backward: 8192 x C bf16 (64 MiB at
// C 4096), where the whole of W in bf16 would be the 1.16 GiB the FP8 head saves
#define HEAD_DX_ROWS 8192

// dh (nr, C) bf16 = dz (nr, V) bf16 W (V, C): W dense, or FP8 dequantized a chunk of rows at a
// time (straight-through), the chunks' products summed in fp32 and rounded once
static void head_dx(bf16 *dh, const bf16 *dz, const QWeight *w, int nr) {
    int V = w->rows, C = w->cols;
    if (w->gran == FP8_OFF) {
        gemm_xw(dh, BF, dz, w->dense, nr, V, C, 1.f, 0.f);
        return;
    }
    int VC = V < HEAD_DX_ROWS ? V : HEAD_DX_ROWS;
    bf16 *wc = (bf16 *)cu_scratch(SC_HEAD_W, (size_t)VC * C * 2);
    float *acc = (float *)cu_scratch(SC_HEAD_DH, (size_t)nr * C * 4);
    for (int v0 = 0; v0 < V; v0 += VC) {
        int nv = V - v0 < VC ? V - v0 : VC;
        FP8Tensor part = w->q;  // rows v0 .. v0 + nv: their codes and their row scales
        part.rows = nv;
        part.data += (size_t)v0 * C;
        part.scale += v0;
        fp8_dequantize_cuda(wc, DT_BF16, &part);
        // acc (nr, C) (+)= dz[:, v0 : v0 + nv] (ld V) wc (nv, C), as gemm_xw with dz's leading dimension V
        gemm(OPN, OPN, C, nr, nv, 1.f, wc, BF, C, dz + v0, BF, V, v0 ? 1.f : 0.f, acc, F32, C);
    }
    to_bf16(dh, acc, (size_t)nr * C);
}

static void cu_logits_forward(void *logits, const void *h, const QWeight *wlm, int N) {
    if (N <= 0) return;
    FP8Tensor wq = head_weight(wlm);
    head_logits((float *)logits, h, wlm, &wq, N);
}

// rows of the logits are processed in chunks of at most this many bytes of fp32
#define LOGITS_CHUNK_BYTES ((size_t)512 << 20)
// (FP8GRPO_LOGITS_CHUNK_ROWS overrides it: the tests use it to cover several chunks)
static int logits_chunk_rows(int N, int V) {
    static long forced = -1;
    if (forced < 0) forced = backend_env_rows("FP8GRPO_LOGITS_CHUNK_ROWS");
    size_t r = forced > 0 ? (size_t)forced : LOGITS_CHUNK_BYTES / ((size_t)V * 4);
    // whole 128-row tiles: the chunk's rows are the reduced dimension of the weight gradient's product
    // (dz^T h), which the FP8 GEMMs take in multiples of 16, and the FP8 head's dz kernel writes in 128s
    if (!forced && r > 128) r -= r % 128;
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

// logp, lse of nr rows from their logits z (nr, V) (HeadRows: fp8_train.cu's head calls it too)
static void logprobs_rows(float *logp, float *lse, const float *z, const int32_t *targets, float inv_temp, int nr, int V) {
    logprobs_rows_kernel<<<nr, 256, 0, G.stream>>>(logp, lse, z, targets, inv_temp, V);
    launchCheck();
}

static void cu_logprobs_forward(void *logp, void *lse, const void *h, const QWeight *wlm, const int32_t *targets,
                                float inv_temp, int N) {
    int C = wlm->cols, V = wlm->rows;
    if (N <= 0) return;
    int CH = logits_chunk_rows(N, V);
    float *z = (float *)cu_scratch(SC_F32, (size_t)CH * V * 4);
    FP8Tensor wq = head_weight(wlm);
    for (int r0 = 0; r0 < N; r0 += CH) {
        int nr = N - r0 < CH ? N - r0 : CH;
        head_logits(z, (const bf16 *)h + (size_t)r0 * C, wlm, &wq, nr);
        logprobs_rows((float *)logp + r0, (float *)lse + r0, z, targets + r0, inv_temp, nr, V);
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
        float v = live ? logprob_grad(z[j], j == t, g, L, inv_temp) : 0.f;
        d[j] = __float2bfloat16_rn(v);
    }
}

// The backward makes each chunk's logits again (the forward kept only lse); with logp (the fused
// op, dlogp known ahead) it makes logp and lse from the same logits first, so the forward's pass
// is not needed at all.
static void logprobs_chunks(void *logp, void *lse, void *dh, void *dwlm, const void *dlogp, const void *h,
                            const QWeight *wlm, const int32_t *targets, float inv_temp, int N) {
    int C = wlm->cols, V = wlm->rows;
    if (N <= 0) return;
    if (dwlm && wlm->gran != FP8_OFF) die("cuda backend: an FP8 LM head is frozen (no gradient)");
    int CH = logits_chunk_rows(N, V);
    float *z = (float *)cu_scratch(SC_F32, (size_t)CH * V * 4);
    if (wlm->train) {  // the head trained in FP8: its products and dz's codes (fp8_train.cu)
        cu_fp8_head_chunks((float *)logp, (float *)lse, dh, (float *)dwlm, (const float *)dlogp, h, wlm, targets, inv_temp, N,
                           CH, z, logprobs_rows);
        return;
    }
    bf16 *dz = (bf16 *)cu_scratch(SC_BF16, (size_t)CH * V * 2);
    for (int r0 = 0; r0 < N; r0 += CH) {
        int nr = N - r0 < CH ? N - r0 : CH;
        const bf16 *hc = (const bf16 *)h + (size_t)r0 * C;
        head_logits(z, hc, wlm, NULL, nr);
        if (logp) logprobs_rows((float *)logp + r0, (float *)lse + r0, z, targets + r0, inv_temp, nr, V);
        logprobs_dz_kernel<<<nr, 256, 0, G.stream>>>(dz, z, (const float *)dlogp + r0, (const float *)lse + r0,
                                                      targets + r0, inv_temp, V);
        launchCheck();
        head_dx((bf16 *)dh + (size_t)r0 * C, dz, wlm, nr);                   // dh (nr, C) = dz W
        if (dwlm) gemm_xtz(dwlm, F32, dz, hc, nr, V, C, 1.f, 1.f);             // dW (V, C) += dz^T h
    }
}
static void cu_logprobs_backward(void *dh, void *dwlm, const void *dlogp, const void *lse, const void *h,
                                 const QWeight *wlm, const int32_t *targets, float inv_temp, int N) {
    logprobs_chunks(NULL, (void *)lse, dh, dwlm, dlogp, h, wlm, targets, inv_temp, N);
}
static void cu_logprobs_fused(void *logp, void *lse, void *dh, void *dwlm, const void *dlogp, const void *h,
                              const QWeight *wlm, const int32_t *targets, float inv_temp, int N) {
    logprobs_chunks(logp, lse, dh, dwlm, dlogp, h, wlm, targets, inv_temp, N);
}

// ----------------------------------------------------------------------------
// optimizer and reductions: the CPU's operation order, no FMA contraction (AdamW in fp32, sums in fp64)

// The whole optimizer step in one pass over the arrays: the clip factor gs applied as scale_kernel
// applies it, AdamW, and the bf16 working copy (act, or NULL) as to_bf16 writes it. Fused, a step of
// full fine-tuning reads and writes each array once instead of in three passes (scale, AdamW, copy).
// one value's AdamW step in fp32 (the masters' precision, as torch.optim.AdamW on fp32 parameters), each
// operation rounded once in the CPU's order (ops_cpu.c adamw_elem: bit-identical results). The moments
// are stored as float, or as bf16 values rounded stochastically (backend.h Bf16Moments)
struct AdamW {
    float gs, lr, b1, b2, eps, wd, bc1, bc2;  // bc1, bc2: 1 - beta^step, computed in fp64 and rounded
    uint64_t seed;  // bf16 storage: its rounding's bits, sr_bits(seed, step, i0 + i, 1 m / 2 v; 0 a bf16 parameter)
    int t;
    size_t i0;
    __device__ static float get(float x) { return x; }
    __device__ static float get(bf16 x) { return __bfloat162float(x); }
    __device__ void put(float &dst, float x, size_t, int) const { dst = x; }
    __device__ void put(bf16 &dst, float x, size_t i, int which) const {
        dst = __ushort_as_bfloat16(f32_to_bf16_sr(x, sr_bits(seed, t, i0 + i, which)));
    }
    // the new parameter from p, g and the moments m, v, which become mi, vi (adamw_elem's operations)
    __device__ float core(float p, float g, float m, float v, float &mi, float &vi) const {
        mi = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(__fsub_rn(1.0f, b1), g));
        vi = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), g), g));
        p = __fmul_rn(p, __fsub_rn(1.0f, __fmul_rn(lr, wd)));
        float st = __fdiv_rn(__fmul_rn(lr, __fdiv_rn(mi, bc1)), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, bc2)), eps));
        return __fsub_rn(p, st);
    }
    template <typename MT>
    __device__ float step(float &param, float grad, MT &m, MT &v, size_t i) const {
        float g = gs == 1.0f ? grad : __fmul_rn(grad, gs);  // FN(scale)'s rounding of the product
        float mi, vi;
        param = core(param, g, get(m), get(v), mi, vi);
        put(m, mi, i, 1);
        put(v, vi, i, 2);
        return param;
    }
};

// four moments as one vector load / store: 16 bytes of float, 8 of bf16
template <typename MT> struct Vec4;
template <> struct Vec4<float> { typedef float4 T; };
template <> struct Vec4<bf16> { typedef uint2 T; };

// The step streams 30 bytes a value (param, grad, m, v read; param, m, v, act written; 22 with bf16
// moments), so it runs at the memory's speed only with wide accesses: vectors of 4 values where the
// arrays allow (the scalar loop takes the rest).
template <typename MT>
__global__ void adamw_kernel(float *param, const float *grad, MT *m, MT *v, size_t n, AdamW a, bf16 *act) {
    typedef typename Vec4<MT>::T MV;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    int vec = ((uintptr_t)param | (uintptr_t)grad) % 16 == 0 && ((uintptr_t)m | (uintptr_t)v) % sizeof(MV) == 0 &&
              (uintptr_t)act % 8 == 0;
    size_t n4 = vec ? n / 4 : 0;
    for (size_t i = tid; i < n4; i += stride) {
        float4 p = ((float4 *)param)[i], g = ((const float4 *)grad)[i];
        MV mv = ((MV *)m)[i], vv = ((MV *)v)[i];
        MT *mi = (MT *)&mv, *vi = (MT *)&vv;
        a.step(p.x, g.x, mi[0], vi[0], 4 * i);
        a.step(p.y, g.y, mi[1], vi[1], 4 * i + 1);
        a.step(p.z, g.z, mi[2], vi[2], 4 * i + 2);
        a.step(p.w, g.w, mi[3], vi[3], 4 * i + 3);
        ((float4 *)param)[i] = p, ((MV *)m)[i] = mv, ((MV *)v)[i] = vv;
        if (act) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
            uint2 o;
            o.x = *(uint32_t *)&lo, o.y = *(uint32_t *)&hi;
            ((uint2 *)act)[i] = o;
        }
    }
    for (size_t i = 4 * n4 + tid; i < n; i += stride) {
        float np = a.step(param[i], grad[i], m[i], v[i], i);
        if (act) act[i] = __float2bfloat16_rn(np);
    }
}
static void cu_adamw(void *param, const void *grad, float gscale, void *m, void *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, int step, void *act_out, const Bf16Moments *m16) {
    if (!n) return;
    float bc1 = (float)(1.0 - pow(beta1, step)), bc2 = (float)(1.0 - pow(beta2, step));
    AdamW a = {gscale, lr, beta1, beta2, eps, weight_decay, bc1, bc2, m16 ? m16->seed : 0, step, m16 ? m16->i0 : 0};
    if (m16)
        adamw_kernel<<<grid_for(n / 4 + 1), 256, 0, G.stream>>>((float *)param, (const float *)grad, (bf16 *)m, (bf16 *)v,
                                                                n, a, (bf16 *)act_out);
    else
        adamw_kernel<<<grid_for(n / 4 + 1), 256, 0, G.stream>>>((float *)param, (const float *)grad, (float *)m, (float *)v,
                                                                n, a, (bf16 *)act_out);
    launchCheck();
}

// adamw_kernel's arithmetic on bf16 param, m, v, each result rounded stochastically (common.h), as the CPU's
// (the moments through AdamW::put, the bf16 moments' rounding; the parameter with the bits of `which` 0)
__global__ void adamw_bf16_kernel(bf16 *param, const float *grad, bf16 *m, bf16 *v, size_t n, AdamW a) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float mi, vi;
        float p = a.core(__bfloat162float(param[i]), grad[i], __bfloat162float(m[i]), __bfloat162float(v[i]), mi, vi);
        param[i] = __ushort_as_bfloat16(f32_to_bf16_sr(p, sr_bits(a.seed, a.t, i, 0)));
        a.put(m[i], mi, i, 1);
        a.put(v[i], vi, i, 2);
    }
}
static void cu_adamw_bf16(void *param, const void *grad, void *m, void *v, size_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, int step, uint64_t seed) {
    if (!n) return;
    float bc1 = (float)(1.0 - pow(beta1, step)), bc2 = (float)(1.0 - pow(beta2, step));
    AdamW a = {1.0f, lr, beta1, beta2, eps, weight_decay, bc1, bc2, seed, step, 0};
    adamw_bf16_kernel<<<grid_for(n), 256, 0, G.stream>>>((bf16 *)param, (const float *)grad, (bf16 *)m, (bf16 *)v, n, a);
    launchCheck();
}

// one wave of blocks on an H100 (8 of 256 threads an SM); each thread reads 16-byte vectors, so that
// enough loads are in flight to stream the gradients at the memory's speed (deterministic: the same
// partial sums in the same order every time)
#define SUMSQ_BLOCKS 1024
__global__ void sumsq_partial(double *part, const float *x, size_t n) {
    __shared__ double sm[256];
    double s = 0;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t n4 = (uintptr_t)x % 16 == 0 ? n / 4 : 0;
    for (size_t i = tid; i < n4; i += stride) {
        float4 a = ((const float4 *)x)[i];
        s += (double)a.x * a.x;
        s += (double)a.y * a.y;
        s += (double)a.z * a.z;
        s += (double)a.w * a.w;
    }
    for (size_t i = 4 * n4 + tid; i < n; i += stride) s += (double)x[i] * x[i];
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
    double *part = (double *)cu_scratch(SC_RED, (SUMSQ_BLOCKS + 1) * sizeof(double));
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

__global__ void accumulate_kernel(float *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] += src[i];
}
static void cu_accumulate(void *dst, const void *src, size_t n) {
    if (!n) return;
    accumulate_kernel<<<grid_for(n), 256, 0, G.stream>>>((float *)dst, (const float *)src, n);
    launchCheck();
}

// ----------------------------------------------------------------------------
// the table and its initialisation

__global__ void probe_kernel(int *x) { *x = 1; }

// ---- replay: the decode step is ~600 small launches; a CUDA graph replays them in one (backend.h) ----

static void replay_drop(Replay *r) {
    if (r->exec) cudaCheck(cudaGraphExecDestroy(r->exec));
    memset(r, 0, sizeof *r);
}
static void cu_replay_forget(void) {
    for (int i = 0; i < MAX_REPLAYS; i++) replay_drop(&G.replays[i]);
}
static int cu_replay_rows(int S) {
    int b = 1;
    while (b < S) b <<= 1;
    return b;
}
static void cu_replay(const void *key, size_t key_bytes, void (*run)(void *arg), void *arg) {
    if (key_bytes > REPLAY_KEY_BYTES) die("replay: a key of %zu bytes (at most %d)", key_bytes, REPLAY_KEY_BYTES);
    unsigned epoch = G.epoch + fp8_cuda_scratch_epoch();
    if (epoch != G.replay_epoch) {  // a scratch buffer moved since the recordings were made
        cu_replay_forget();
        G.replay_epoch = epoch;
    }
    Replay *r = NULL;
    for (int i = 0; i < MAX_REPLAYS && !r; i++)
        if (G.replays[i].key_bytes == key_bytes && !memcmp(G.replays[i].key, key, key_bytes)) r = &G.replays[i];
    if (!r) {
        for (int i = 0; i < MAX_REPLAYS && !r; i++)
            if (!G.replays[i].key_bytes) r = &G.replays[i];
        if (!r) {
            r = &G.replays[G.replay_next++ % MAX_REPLAYS];
            replay_drop(r);
        }
        memcpy(r->key, key, key_bytes);
        r->key_bytes = key_bytes;
    }
    if (r->exec) {
        cudaCheck(cudaGraphLaunch(r->exec, G.stream));
        return;
    }
    if (r->runs++ == 0) {  // the first time plainly: every buffer made on demand gets made
        run(arg);
        return;
    }
    cudaGraph_t g = NULL;
    cudaCheck(cudaStreamBeginCapture(G.stream, cudaStreamCaptureModeRelaxed));
    run(arg);
    cudaError_t e = cudaStreamEndCapture(G.stream, &g);
    if (e == cudaSuccess && g) e = cudaGraphInstantiate(&r->exec, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess || !r->exec)
        die("replay: capturing the decode step as a CUDA graph failed (%s): run with graphs off to find the op",
            cudaGetErrorString(e));
    if (G.epoch + fp8_cuda_scratch_epoch() != epoch)  // an op grew its scratch while captured
        die("replay: a buffer moved during the capture (an op grew its scratch on a second run)");
    cudaCheck(cudaGraphLaunch(r->exec, G.stream));
}

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
    .linear_forward_q = cu_linear_forward_q,
    .quantize_act = cu_quantize_act,
    .linear_backward = cu_linear_backward,
    .fp8_train_new = cu_fp8_train_new,
    .fp8_train_free = cu_fp8_train_free,
    .fp8_train_forward_keep = cu_fp8_train_forward_keep,
    .fp8_train_backward_kept = cu_fp8_train_backward_kept,
    .fp8_train_norm_q = cu_fp8_train_norm_q,
    .fp8_train_glu_q = cu_fp8_train_glu_q,
    .fp8_train_step = cu_fp8_train_step,
    .fp8_train_state = cu_fp8_train_state,
    .lora_down = cu_lora_down,
    .lora_up = cu_lora_up,
    .lora_apply = cu_lora_apply,
    .to_act = cu_to_act,
    .lora_up_backward = cu_lora_up_backward,
    .lora_down_backward = cu_lora_down_backward,
    .rope_forward = cu_rope_forward,
    .rope_backward = cu_rope_backward,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
    .swiglu_forward = cu_swiglu_forward,
    .swiglu_backward = cu_swiglu_backward,
    .swiglu_backward_q = cu_fp8_train_swiglu_backward,
    .geglu_forward = cu_geglu_forward,
    .geglu_backward = cu_geglu_backward,
    .rmsnorm1p_forward = cu_rmsnorm1p_forward,
    .rmsnorm1p_backward = cu_rmsnorm1p_backward,
    .scale_act = cu_scale_act,
    .add = cu_add,
    .add_rmsnorm = cu_add_rmsnorm,
    .glu_gu = cu_glu_gu,
    .glu_forward_q = cu_glu_forward_q,
    .gather_rows = cu_gather_rows,
    .moe_route = cu_moe_route,
    .moe_route_backward = cu_moe_route_backward,
    .moe_experts_forward = cu_moe_experts_forward,
    .moe_experts_backward = cu_moe_experts_backward,
    .logits_forward = cu_logits_forward,
    .logprobs_forward = cu_logprobs_forward,
    .logprobs_backward = cu_logprobs_backward,
    .logprobs_fused = cu_logprobs_fused,
    .kv_write = cu_kv_write,
    .qkv_rope_kv = cu_qkv_rope_kv,
    .attention_decode = cu_attention_decode,
    .sample = cu_sample,
    .adamw = cu_adamw,
    .adamw_bf16 = cu_adamw_bf16,
    .sumsq = cu_sumsq,
    .scale = cu_scale,
    .accumulate = cu_accumulate,
    .replay = cu_replay,
    .replay_forget = cu_replay_forget,
    .replay_rows = cu_replay_rows,
};

extern "C" const Backend *backend_cuda(char *why, size_t why_cap) {
    if (G.init) return &be;
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        // Without the NVIDIA driver (no libcuda.so.1) the runtime reports "CUDA driver version is
        // insufficient for CUDA runtime version", which sends a user to update a driver that is not
        // there: cudaDriverGetVersion gives 0 when no driver is installed, so say what is missing.
        // A driver that sees no GPU says cudaErrorNoDevice. Any other error is reported as it is.
        cudaGetLastError();
        if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
        cudaRuntimeGetVersion(&rt);
        cudaGetLastError();
        if (e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && drv == 0))
            snprintf(why, why_cap, "no NVIDIA GPU/driver found: %s",
                     drv == 0 ? "the NVIDIA driver's libcuda.so.1 is not installed" : "the driver sees no CUDA device");
        else if (e == cudaErrorInsufficientDriver)
            snprintf(why, why_cap, "the NVIDIA driver supports CUDA %d.%d, this build needs %d.%d: update the driver (%s)",
                     drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, cudaGetErrorString(e));
        else snprintf(why, why_cap, "no usable CUDA driver or device (%s)", cudaGetErrorString(e));
        return NULL;
    }
    if (n == 0) {
        snprintf(why, why_cap, "no NVIDIA GPU/driver found: the driver sees no CUDA device");
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
