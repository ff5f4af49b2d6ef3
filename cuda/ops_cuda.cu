// ops_cuda.cu: the CUDA backend's per-token ops (backend.h), one warp or thread per row or element.
//   defines: cu_rmsnorm_forward / backward, cu_rope_forward / backward, cu_add_rmsnorm, cu_qkv_rope_kv,
//   cu_swiglu_forward / backward, cu_glu_gu, cu_glu_forward_q, cu_add, cu_gather_rows, cu_embedding_forward /
//   cu_rmsnorm1p_forward / backward, cu_geglu_forward / backward, cu_scale_act (Gemma 3),
//   cu_rmsnorm_q, cu_glu_q (FP8 training: the norm's and the GLU's outputs as FP8 codes alone),
//   backward, cu_colsum (backend_cuda.cuh). Each has its truth in ops_cpu.c; test/gpu_backend.cu
//   compares them on random inputs.
// bf16 in and out, fp32 arithmetic; sums over rows in fixed order (no float atomics), so results
// repeat bit for bit.
#include "cuda/attention_cuda.h"  // the KV cache's FP8 rows (KV_CHUNKS)
#include "cuda/backend_cuda.cuh"
#include "cuda/fp8_cuda.h"        // fp8_quantize_cuda: the FP8 copies of rows too wide for a fused pass

// ----------------------------------------------------------------------------
// column sums

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
    float *part = (float *)cu_scratch(SC_RED, (size_t)nch * C * 4);
    colsum_partial<MODE><<<dim3(cdiv(C, 256), nch), 256, 0, cu_stream()>>>(part, a, b, rs, N, C);
    launchCheck();
    colsum_finish<<<cdiv(C, 32), 256, 0, cu_stream()>>>(dst, part, nch, C);
    launchCheck();
}

// dst (C) += the column sums of a (N, C): a bias's gradient
void cu_colsum(float *dst, const bf16 *a, int N, int C) { colsum<0>(dst, a, NULL, NULL, N, C); }

// ----------------------------------------------------------------------------
// norms and elementwise ops. bf16 rows are read 8 at a time (16 bytes) when the row
// length and pointers allow, else one at a time.

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
// P1: Gemma's weight 1 + w (formed in fp32, as Gemma3RMSNorm does)
template <bool P1>
__device__ __forceinline__ float norm_w(float w) { return P1 ? 1.0f + w : w; }
template <bool VEC, bool P1 = false>
__device__ __forceinline__ void row_scale(bf16 *y, const bf16 *x, const bf16 *w, float r, int C, int lane) {
    if (VEC) {
        for (int i = lane * 8; i < C; i += 256) {
            float f[8], g[8];
            load8(f, x + i);
            load8(g, w + i);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = (f[j] * r) * norm_w<P1>(g[j]);
            store8(y + i, f);
        }
    } else
        for (int i = lane; i < C; i += 32)
            y[i] = __float2bfloat16_rn((__bfloat162float(x[i]) * r) * norm_w<P1>(__bfloat162float(w[i])));
}

// Few rows (a decode step): one block per row, C / 8 threads, thread t holding elements 8t .. 8t + 7
// in registers, so every load of the row is in flight at once and the rows spread over the SMs (a
// warp per row would leave a few dozen warps on the whole GPU at a decode step's batch). The results are those of the loops bit for bit: the add rounds as add_kernel
// does, and norm_row_rstd sums the squares in row_rstd's order. Many rows (training, prefill): the
// loops, 8 rows per block; there the SMs are full of warps anyway.
#define ROW_FEW 1024
#define NORM_ROW_MAXC 8192  // 1024 threads
static int row_warps(int N) { return N <= ROW_FEW ? 1 : 8; }
static int norm_row_ok(int N, int C) { return N <= ROW_FEW && C % 8 == 0 && C <= NORM_ROW_MAXC; }
static unsigned norm_row_threads(int C) { return 32 * cdiv(C / 8, 32); }

// 8 values' E4M3 codes with scale s (value j in byte j), each as fp8_quantize_cuda encodes it
__device__ __forceinline__ uint2 encode8(const float (&f)[8], float s) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        lo |= (uint32_t)fp8_encode_dev(fp8_div(f[j], s), FP8_E4M3) << (8 * j);
        hi |= (uint32_t)fp8_encode_dev(fp8_div(f[j + 4], s), FP8_E4M3) << (8 * j);
    }
    return make_uint2(lo, hi);
}

// row_rstd's sum: its lane l adds elements 8 l + 256 k + j for k, then j. Here the values pass through
// shared memory (v: [k][j][lane], blockDim.x * 8 floats) and lane l of warp 0 adds them in that order.
__device__ __forceinline__ float norm_row_rstd(float *v, const float (&f)[8], int C, float eps) {
    __shared__ float r_shared;
    int t = threadIdx.x, lane = t & 31, k = t >> 5;
#pragma unroll
    for (int j = 0; j < 8; j++) v[(k * 8 + j) * 32 + lane] = f[j];
    __syncthreads();
    if (t < 32) {
        float ss = 0.f;
        for (int kk = 0; lane * 8 + 256 * kk < C; kk++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float x = v[(kk * 8 + j) * 32 + lane];
                ss += x * x;
            }
        ss = warp_sum(ss);
        if (t == 0) r_shared = 1.0f / sqrtf(ss / C + eps);
    }
    __syncthreads();
    return r_shared;
}

// out = rmsnorm(x (+= dx when ADD)) * w (P1: * (1 + w), Gemma's) for row blockIdx.x; with q, out's FP8 copy
// as well, in 1x128 groups (the last one partial where C % 128 != 0): the 16 threads of a group find its
// amax by shuffles and encode their 8 values as fp8_quantize_warp does (scales (cdiv(C, 128), N)); or,
// with qrow, a scale for the row (ROW: qs[row]): the block's amax of the whole row, which the block
// holds in registers, then each thread encodes its 8 values as quant_row_kernel does. Either way the
// bytes are fp8_quantize_cuda's.
template <bool ADD, bool P1>
__global__ void __launch_bounds__(1024) norm_row_kernel(bf16 *x, bf16 *out, float *rstd, const bf16 *dx,
                                                        const bf16 *w, int N, int C, float eps, uint8_t *q, float *qs,
                                                        bool qrow) {
    extern __shared__ float norm_v[];
    int row = blockIdx.x, i0 = 8 * threadIdx.x;
    bool in = i0 < C;
    uint4 wv = make_uint4(0, 0, 0, 0), c = wv;
    if (in) wv = *(const uint4 *)(w + i0);
    bf16 *xr = x + (size_t)row * C;
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (in) {
        c = *(const uint4 *)(xr + i0);
        if (ADD) {
            float g[8];
            unpack8(f, c);
            load8(g, dx + (size_t)row * C + i0);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] += g[j];
            c = pack8(f);
            *(uint4 *)(xr + i0) = c;
        }
        unpack8(f, c);  // the rounded sums
    }
    float r = norm_row_rstd(norm_v, f, C, eps);
    if (threadIdx.x == 0) rstd[row] = r;
    if (!in && !q) return;
    if (in) {
        float g[8];
        unpack8(g, wv);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = (f[j] * r) * norm_w<P1>(g[j]);
        uint4 y = pack8(f);
        *(uint4 *)(out + (size_t)row * C + i0) = y;
        unpack8(f, y);  // the copy encodes the stored (rounded) values
    }
    if (!q) return;
    // a group past C (or its part past C) counts zeros: the amax of the values there, as fp8_quantize_cuda's
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
    if (qrow) {  // every thread of the block is here (block_max's barriers)
        float sc = fp8_scale_dev(block_max(m), FP8_E4M3, 0);
        if (threadIdx.x == 0) qs[row] = sc;
        if (in) *(uint2 *)(q + (size_t)row * C + i0) = encode8(f, sc);
        return;
    }
    unsigned half = 0xffffu << (threadIdx.x & 16);  // the 16 threads of the group (whole warps: all here)
    for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(half, m, o));
    float sc = fp8_scale_dev(m, FP8_E4M3, 0);
    if (!in) return;
    if (threadIdx.x % 16 == 0) qs[(size_t)(i0 / FP8_BLOCK_SIZE) * N + row] = sc;
    *(uint2 *)(q + (size_t)row * C + i0) = encode8(f, sc);
}
// norm_row_kernel over N rows (norm_row_ok)
template <bool P1>
static void norm_row(bf16 *x, bf16 *out, float *rstd, const bf16 *dx, const bf16 *w, int N, int C, float eps,
                     uint8_t *q, float *qs, bool qrow) {
    unsigned th = norm_row_threads(C);
    size_t smem = th * 8 * sizeof(float);
    if (dx) norm_row_kernel<true, P1><<<N, th, smem, cu_stream()>>>(x, out, rstd, dx, w, N, C, eps, q, qs, qrow);
    else norm_row_kernel<false, P1><<<N, th, smem, cu_stream()>>>(x, out, rstd, dx, w, N, C, eps, q, qs, qrow);
    launchCheck();
}

// one warp per row; y = (x * rstd) * w (P1: * (1 + w)) with fp32 statistics; out may alias inp
template <bool VEC, bool P1 = false>
__global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C;
    float r = row_rstd<VEC>(x, C, eps, lane);
    if (lane == 0) rstd[row] = r;
    row_scale<VEC, P1>(out + (size_t)row * C, x, w, r, C, lane);
}
// P1: Gemma's norm (backend.h rmsnorm1p_forward)
template <bool P1>
static void rmsnorm_forward(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps) {
    if (N <= 0) return;
    int wpb = row_warps(N);
    unsigned gr = cdiv(N, wpb);
    if (norm_row_ok(N, C) && aligned16(out, inp, w, NULL))
        norm_row<P1>((bf16 *)inp, (bf16 *)out, (float *)rstd, NULL, (const bf16 *)w, N, C, eps, NULL, NULL, false);
    else if (C % 8 == 0 && aligned16(out, inp, w, NULL))
        rmsnorm_fwd_kernel<true, P1><<<gr, 32 * wpb, 0, cu_stream()>>>((bf16 *)out, (float *)rstd, (const bf16 *)inp,
                                                                      (const bf16 *)w, N, C, eps);
    else
        rmsnorm_fwd_kernel<false, P1><<<gr, 32 * wpb, 0, cu_stream()>>>((bf16 *)out, (float *)rstd, (const bf16 *)inp,
                                                                       (const bf16 *)w, N, C, eps);
    launchCheck();
}
// FP8 training's norm into a per-tensor-scaled FP8 input (fp8_train.cu cu_fp8_train_norm_q): the rows
// of rmsnorm_fwd_kernel (VEC), each value rounded to bf16 as it stores it, then encoded with the scale
// *mul into q in place of the store, the amax of the bf16 values recorded: fp8_quantize_scaled_cuda's
// codes and amax of rmsnorm_forward's output, from one pass that never writes the bf16 values
template <bool P1>
__global__ void rmsnorm_q_kernel(uint8_t *q, float *scale_inv, unsigned *amax, const float *mul, float *rstd,
                                 const bf16 *inp, const bf16 *w, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    float s = *mul;
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_inv[0] = __frcp_rn(s);
    unsigned m = 0;
    if (row < N) {  // (every thread reaches block_amax_record)
        const bf16 *x = inp + (size_t)row * C;
        float r = row_rstd<true>(x, C, eps, lane);
        if (lane == 0) rstd[row] = r;
        for (int i = lane * 8; i < C; i += 256) {
            float f[8], g[8];
            load8(f, x + i);
            load8(g, w + i);
            uint32_t word[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float y = __bfloat162float(__float2bfloat16_rn((f[j] * r) * norm_w<P1>(g[j])));
                m = max(m, __float_as_uint(fabsf(y)));
                word[j >> 2] |= (uint32_t)fp8_encode_dev(y * s, FP8_E4M3) << (8 * (j & 3));
            }
            *(uint2 *)(q + (size_t)row * C + i) = make_uint2(word[0], word[1]);
        }
    }
    block_amax_record(amax, m);
}
int cu_rmsnorm_q(uint8_t *q, float *scale_inv, unsigned *amax, const float *mul, void *rstd, const void *inp, const void *w,
                 int N, int C, float eps, int norm1p) {
    if (N <= 0 || C % 8 || !aligned16(inp, w, NULL, NULL) || (uintptr_t)q % 8) return 0;
    unsigned gr = cdiv(N, 8);
    if (norm1p)
        rmsnorm_q_kernel<true><<<gr, 256, 0, cu_stream()>>>(q, scale_inv, amax, mul, (float *)rstd, (const bf16 *)inp,
                                                            (const bf16 *)w, N, C, eps);
    else
        rmsnorm_q_kernel<false><<<gr, 256, 0, cu_stream()>>>(q, scale_inv, amax, mul, (float *)rstd, (const bf16 *)inp,
                                                             (const bf16 *)w, N, C, eps);
    launchCheck();
    return 1;
}
void cu_rmsnorm_forward(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps) {
    rmsnorm_forward<false>(out, rstd, inp, w, N, C, eps);
}
void cu_rmsnorm1p_forward(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps) {
    rmsnorm_forward<true>(out, rstd, inp, w, N, C, eps);
}

// dx += r w dy - r^3 / C * x * sum_j(w dy x), one warp per row
template <bool VEC, bool P1 = false>
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
            for (int j = 0; j < 8; j++) s += norm_w<P1>(c[j]) * b[j] * a[j];
        }
    } else
        for (int i = lane; i < C; i += 32)
            s += norm_w<P1>(__bfloat162float(w[i])) * __bfloat162float(dy[i]) * __bfloat162float(x[i]);
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
            for (int j = 0; j < 8; j++) d[j] += r * norm_w<P1>(c[j]) * b[j] - cc * a[j];
            store8(dx + i, d);
        }
    } else
        for (int i = lane; i < C; i += 32)
            dx[i] = __float2bfloat16_rn(__bfloat162float(dx[i]) + r * norm_w<P1>(__bfloat162float(w[i])) * __bfloat162float(dy[i]) -
                                        cc * __bfloat162float(x[i]));
}

// P1: Gemma's (1 + w): dinp through 1 + w, dw as rmsnorm_backward's (the same derivative)
template <bool P1>
static void rmsnorm_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w, const void *rstd,
                             int N, int C) {
    if (N <= 0) return;
    unsigned gr = cdiv(N, 8);
    if (C % 8 == 0 && aligned16(dinp, dout, inp, w))
        rmsnorm_bwd_kernel<true, P1><<<gr, 256, 0, cu_stream()>>>((bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp,
                                                                 (const bf16 *)w, (const float *)rstd, N, C);
    else
        rmsnorm_bwd_kernel<false, P1><<<gr, 256, 0, cu_stream()>>>((bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp,
                                                                  (const bf16 *)w, (const float *)rstd, N, C);
    launchCheck();
    if (dw) colsum<1>((float *)dw, (const bf16 *)dout, (const bf16 *)inp, (const float *)rstd, N, C);
}
void cu_rmsnorm_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w, const void *rstd,
                         int N, int C) {
    rmsnorm_backward<false>(dinp, dw, dout, inp, w, rstd, N, C);
}
void cu_rmsnorm1p_backward(void *dinp, void *dw, const void *dout, const void *inp, const void *w, const void *rstd,
                           int N, int C) {
    rmsnorm_backward<true>(dinp, dw, dout, inp, w, rstd, N, C);
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
    rope_kernel<<<grid_for(total), 256, 0, cu_stream()>>>((bf16 *)x, pos, (const float *)inv_freq, N, H, HD, inverse);
    launchCheck();
}
void cu_rope_forward(void *x, const int32_t *pos, const void *inv_freq, int N, int H, int HD) {
    rope(x, pos, inv_freq, N, H, HD, 0);
}
void cu_rope_backward(void *dx, const int32_t *pos, const void *inv_freq, int N, int H, int HD) {
    rope(dx, pos, inv_freq, N, H, HD, 1);
}

// ---- decode fusions (backend.h): the same arithmetic as the kernels they replace ----

// outq's checks (backend.h): what the fused kernels can write
void cu_check_outq(const FP8Tensor *t, int N, int C, const char *op) {
    if ((t->gran != FP8_ROW && t->gran != FP8_BLOCK) || t->fmt != FP8_E4M3 || t->rows != N || t->cols != C ||
        (t->gran == FP8_BLOCK && t->block_rows != 1))
        die("%s: the FP8 copy must be E4M3, ROW or 1x128 BLOCK, (%d, %d) (got gran %d, (%d, %d))", op, N, C,
            (int)t->gran, t->rows, t->cols);
}

// x += dx, then out = rmsnorm(x) * w: one warp per row; the norm is rmsnorm_fwd_kernel's (row_rstd,
// row_scale) on the rounded sums, so the result is that of add then rmsnorm_forward bit for bit
template <bool VEC>
__global__ void add_rmsnorm_kernel(bf16 *x, bf16 *out, float *rstd, const bf16 *dx, const bf16 *w, int N, int C,
                                   float eps, bool p1) {
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
    if (p1) row_scale<VEC, true>(y, xr, w, r, C, lane);
    else row_scale<VEC, false>(y, xr, w, r, C, lane);
}
void cu_add_rmsnorm(void *x, void *out, void *rstd, const void *dx, const void *w, int N, int C, float eps, int norm1p,
                    FP8Tensor *outq) {
    if (N <= 0) return;
    if (outq) cu_check_outq(outq, N, C, "add_rmsnorm");
    int wpb = row_warps(N);
    unsigned gr = cdiv(N, wpb);
    if (norm_row_ok(N, C) && aligned16(x, out, dx, w)) {
        // the copy from the registers: 1x128 groups or a row's scale (norm_row_kernel), 8-byte aligned codes
        int fuse = outq && !((uintptr_t)outq->data & 7);
        bool qrow = fuse && outq->gran == FP8_ROW;
        if (norm1p)
            norm_row<true>((bf16 *)x, (bf16 *)out, (float *)rstd, (const bf16 *)dx, (const bf16 *)w, N, C, eps,
                           fuse ? outq->data : NULL, fuse ? outq->scale : NULL, qrow);
        else
            norm_row<false>((bf16 *)x, (bf16 *)out, (float *)rstd, (const bf16 *)dx, (const bf16 *)w, N, C, eps,
                            fuse ? outq->data : NULL, fuse ? outq->scale : NULL, qrow);
        if (outq && !fuse) fp8_quantize_cuda(outq, out, DT_BF16, 0);
        return;
    }
    if (C % 8 == 0 && aligned16(x, out, dx, w))
        add_rmsnorm_kernel<true><<<gr, 32 * wpb, 0, cu_stream()>>>((bf16 *)x, (bf16 *)out, (float *)rstd,
                                                                  (const bf16 *)dx, (const bf16 *)w, N, C, eps, norm1p);
    else
        add_rmsnorm_kernel<false><<<gr, 32 * wpb, 0, cu_stream()>>>((bf16 *)x, (bf16 *)out, (float *)rstd,
                                                                   (const bf16 *)dx, (const bf16 *)w, N, C, eps, norm1p);
    launchCheck();
    if (outq) fp8_quantize_cuda(outq, out, DT_BF16, 0);  // many rows or odd ones: a pass of its own
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
// row_rstd, row_scale; P1: Gemma's 1 + w) into v, then rotated in place (src may be v)
template <bool VEC, bool P1>
__device__ __forceinline__ void norm_rope_head(bf16 *v, const bf16 *src, const bf16 *w, int p, const float *inv_freq,
                                               int HD, float eps, int lane) {
    if (w) {
        float r = row_rstd<VEC>(src, HD, eps, lane);
        row_scale<VEC, P1>(v, src, w, r, HD, lane);
    } else if (v != src)
        for (int i = lane; i < HD; i += 32) v[i] = src[i];
    __syncwarp();
    rope_row(v, p, inv_freq, HD, lane);
}

// The decode step's q|k|v epilogue in one kernel (backend.h qkv_rope_kv): one warp per head row
// (token n, head h), q heads then k heads then v heads, read where the projections left them. A q or
// k row is normed into q or k (rmsnorm_fwd_kernel's row_rstd, row_scale: the same roundings), rotated
// there (rope_kernel's), and a k row then stored into the cache from k; a v row goes to the cache
// straight from where it lies. The cache store is kv_write's: a copy (bf16), or FP8 codes by the row
// codec (cuda_common.cuh).
template <bool VEC, bool P1>
__global__ void qkv_rope_kv_kernel(bf16 *q, bf16 *k, const bf16 *qin, const bf16 *kin, const bf16 *vin, int ldq,
                                   int ldkv, const bf16 *qw, const bf16 *kw, const int32_t *pos, const float *inv_freq,
                                   void *kc, void *vc, float *ks, float *vs, const int32_t *slots, int N, int NH, int KVH,
                                   int HD, float eps) {
    const int H = NH + 2 * KVH;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N * H) return;
    int n = row / H, h = row % H, slot = slots[n];
    const bf16 *src = h < NH ? qin + (size_t)n * ldq + h * HD
                    : h < NH + KVH ? kin + (size_t)n * ldkv + (h - NH) * HD : vin + (size_t)n * ldkv + (h - NH - KVH) * HD;
    if (h < NH + KVH) {
        bool isq = h < NH;
        bf16 *v = isq ? q + ((size_t)n * NH + h) * HD : k + ((size_t)n * KVH + (h - NH)) * HD;
        norm_rope_head<VEC, P1>(v, src, isq ? qw : kw, pos[n], inv_freq, HD, eps, lane);
        if (isq) return;
        __syncwarp();
        src = v;
    }
    if (slot < 0) return;
    bool isv = h >= NH + KVH;
    int hk = isv ? h - NH - KVH : h - NH;
    size_t at = (size_t)slot * KVH + hk;
    if (ks) fp8_quantize_warp<KV_CHUNKS>((uint8_t *)(isv ? vc : kc) + at * HD, (isv ? vs : ks) + at, src, HD, FP8_E4M3, 0);
    else {
        bf16 *dst = (bf16 *)(isv ? vc : kc) + at * HD;
        for (int i = lane; i < HD; i += 32) dst[i] = src[i];
    }
}
void cu_qkv_rope_kv(void *q, void *k, const void *qin, const void *kin, const void *vin, int ldq, int ldkv,
                    const void *q_norm, const void *k_norm, int norm1p, const int32_t *pos, const void *inv_freq, void *kc,
                    void *vc, float *ks, float *vs, const int32_t *slots, int N, int NH, int KVH, int HD, float eps) {
    if (N <= 0) return;
    if (ks && HD > 128 * KV_CHUNKS) die("qkv_rope_kv: head_dim %d is over the FP8 KV cache's %d", HD, 128 * KV_CHUNKS);
    unsigned gr = cdiv((size_t)N * (NH + 2 * KVH), 8);
    // 16-byte row accesses where every row of every operand allows them
    bool vec = HD % 8 == 0 && ldq % 8 == 0 && ldkv % 8 == 0 && aligned16(q, k, qin, kin) &&
               aligned16(vin, q_norm ? q_norm : q, k_norm ? k_norm : k, NULL);
#define QKV_LAUNCH(V, P)                                                                                                \
    qkv_rope_kv_kernel<V, P><<<gr, 256, 0, cu_stream()>>>((bf16 *)q, (bf16 *)k, (const bf16 *)qin, (const bf16 *)kin,    \
                                                       (const bf16 *)vin, ldq, ldkv, (const bf16 *)q_norm,             \
                                                       (const bf16 *)k_norm, pos, (const float *)inv_freq, kc, vc, ks, \
                                                       vs, slots, N, NH, KVH, HD, eps)
    if (vec && norm1p) QKV_LAUNCH(true, true);
    else if (vec) QKV_LAUNCH(true, false);
    else if (norm1p) QKV_LAUNCH(false, true);
    else QKV_LAUNCH(false, false);
#undef QKV_LAUNCH
    launchCheck();
}

// elementwise: the gated MLP's activation times up (GELU false: SwiGLU's silu; true: Gemma 3's GeGLU,
// gelu_tanh in fp32 as PyTorch's gelu(approximate="tanh") forms it), add; n8 groups of 8 vectorized
// then a scalar tail
#define GELU_K0 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_K1 0.044715f
__device__ __forceinline__ float gelu_t(float g) { return tanhf(GELU_K0 * (g + GELU_K1 * g * g * g)); }
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
template <bool GELU>
__device__ __forceinline__ float glu_mul(float g, float u) { return GELU ? 0.5f * g * (1.0f + gelu_t(g)) * u : silu_mul(g, u); }
// d(act(g) u): silu' = s (1 + g (1 - s)); gelu_tanh' = (1 + t) / 2 + g/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2)
template <bool GELU>
__device__ __forceinline__ void glu_grad(float d, float g, float u, float &dg, float &du) {
    if (GELU) {
        float th = gelu_t(g);
        dg = d * u * (0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * g * g));
        du = d * 0.5f * g * (1.0f + th);
    } else {
        swiglu_grad(d, g, u, &dg, &du);  // cuda_common.cuh: the same derivative as FP8 training's fused one
    }
}
template <bool GELU>
__global__ void glu_fwd_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t n, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = t; i < nv; i += stride) {
        float g[8], u[8];
        load8(g, gate + 8 * i);
        load8(u, up + 8 * i);
#pragma unroll
        for (int j = 0; j < 8; j++) g[j] = glu_mul<GELU>(g[j], u[j]);
        store8(out + 8 * i, g);
    }
    for (size_t i = nv * 8 + t; i < n; i += stride)
        out[i] = __float2bfloat16_rn(glu_mul<GELU>(__bfloat162float(gate[i]), __bfloat162float(up[i])));
}
template <bool GELU>
__global__ void glu_bwd_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, size_t n,
                               int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = t; i < nv; i += stride) {
        float d[8], g[8], u[8], dg[8], du[8];
        load8(d, dout + 8 * i);
        load8(g, gate + 8 * i);
        load8(u, up + 8 * i);
#pragma unroll
        for (int j = 0; j < 8; j++) glu_grad<GELU>(d[j], g[j], u[j], dg[j], du[j]);
        store8(dgate + 8 * i, dg);
        store8(dup + 8 * i, du);
    }
    for (size_t i = nv * 8 + t; i < n; i += stride) {
        float dg, du;
        glu_grad<GELU>(__bfloat162float(dout[i]), __bfloat162float(gate[i]), __bfloat162float(up[i]), dg, du);
        dgate[i] = __float2bfloat16_rn(dg);
        dup[i] = __float2bfloat16_rn(du);
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

template <bool GELU>
static void glu_forward(void *out, const void *gate, const void *up, size_t n) {
    if (!n) return;
    glu_fwd_kernel<GELU><<<grid_vec(n), 256, 0, cu_stream()>>>((bf16 *)out, (const bf16 *)gate, (const bf16 *)up, n,
                                                         aligned16(out, gate, up, NULL));
    launchCheck();
}
template <bool GELU>
static void glu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    if (!n) return;
    glu_bwd_kernel<GELU><<<grid_vec(n), 256, 0, cu_stream()>>>((bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout,
                                                         (const bf16 *)gate, (const bf16 *)up, n,
                                                         aligned16(dgate, dup, dout, gate) && aligned16(up, 0, 0, 0));
    launchCheck();
}
void cu_swiglu_forward(void *out, const void *gate, const void *up, size_t n) { glu_forward<false>(out, gate, up, n); }
// FP8 training's GLU into a per-tensor-scaled FP8 input (cu_fp8_train_glu_q): glu_fwd_kernel's values,
// rounded to bf16 as it stores them, encoded with *mul into q in place of the store, their amax recorded
// (fp8_quantize_scaled_cuda's codes and amax of glu_forward's output, the bf16 values never written)
template <bool GELU>
__global__ void glu_q_kernel(uint8_t *q, float *scale_inv, unsigned *amax, const float *mul, const bf16 *gate, const bf16 *up,
                             size_t n8) {
    float s = *mul;
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_inv[0] = __frcp_rn(s);
    unsigned m = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        float g[8], u[8];
        load8(g, gate + 8 * i);
        load8(u, up + 8 * i);
        uint32_t word[2] = {0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float y = __bfloat162float(__float2bfloat16_rn(glu_mul<GELU>(g[j], u[j])));
            m = max(m, __float_as_uint(fabsf(y)));
            word[j >> 2] |= (uint32_t)fp8_encode_dev(y * s, FP8_E4M3) << (8 * (j & 3));
        }
        ((uint2 *)q)[i] = make_uint2(word[0], word[1]);
    }
    block_amax_record(amax, m);
}
int cu_glu_q(uint8_t *q, float *scale_inv, unsigned *amax, const float *mul, const void *gate, const void *up, size_t n,
             int gelu) {
    if (!n || n % 8 || !aligned16(gate, up, NULL, NULL) || (uintptr_t)q % 8) return 0;
    if (gelu)
        glu_q_kernel<true><<<grid_vec(n), 256, 0, cu_stream()>>>(q, scale_inv, amax, mul, (const bf16 *)gate, (const bf16 *)up, n / 8);
    else
        glu_q_kernel<false><<<grid_vec(n), 256, 0, cu_stream()>>>(q, scale_inv, amax, mul, (const bf16 *)gate, (const bf16 *)up, n / 8);
    launchCheck();
    return 1;
}
// glu_gu: one warp per 128 columns of a row (lane l: columns 4l..4l+3), glu_mul as glu_fwd_kernel
// rounds it; with q (BLOCK), the group's FP8 copy from the lanes' registers
template <bool GELU>
__global__ void glu_gu_kernel(bf16 *out, const bf16 *gu, int N, int FF, uint8_t *q, float *qs) {
    int groups = cdiv(FF, FP8_BLOCK_SIZE), wid = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (wid >= N * groups) return;
    int r = wid / groups, c0 = (wid % groups) * FP8_BLOCK_SIZE, lane = threadIdx.x & 31;
    const bf16 *g = gu + (size_t)r * 2 * FF, *u = g + FF;
    bf16 *y = out + (size_t)r * FF;
    float v[1][4];  // the rounded outputs, as fp8_quantize_warp_regs takes them
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int c = c0 + lane * 4 + j;
        bf16 h = __float2bfloat16_rn(c < FF ? glu_mul<GELU>(__bfloat162float(g[c]), __bfloat162float(u[c])) : 0.0f);
        if (c < FF) y[c] = h;
        v[0][j] = __bfloat162float(h);
    }
    if (q)
        fp8_quantize_warp_regs<1>(q + (size_t)r * FF + c0, qs + (size_t)(c0 / FP8_BLOCK_SIZE) * N + r, v,
                                  min(FP8_BLOCK_SIZE, FF - c0), FP8_E4M3, 0);
}
// glu_gu with a ROW copy (a scale a row): one block per row, since the scale needs the whole row's amax.
// Each thread makes 8 values at a time as glu_gu_kernel does and stores them, the block takes their amax,
// then each thread encodes the values it stored (read back from its own writes: L1 or L2) as
// quant_row_kernel does. FF % 8 == 0, out and gu 16-byte aligned, q 8-byte aligned (cu_glu_gu checks).
template <bool GELU>
__global__ void __launch_bounds__(256) glu_gu_row_kernel(bf16 *out, const bf16 *gu, int FF, uint8_t *q, float *qs) {
    int r = blockIdx.x;
    const bf16 *g = gu + (size_t)r * 2 * FF, *u = g + FF;
    bf16 *y = out + (size_t)r * FF;
    float m = 0.f;
    for (int c = 8 * threadIdx.x; c < FF; c += 8 * blockDim.x) {
        float a[8], b[8];
        load8(a, g + c);
        load8(b, u + c);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            a[j] = __bfloat162float(__float2bfloat16_rn(glu_mul<GELU>(a[j], b[j])));
            m = fmaxf(m, fabsf(a[j]));
        }
        store8(y + c, a);
    }
    float s = fp8_scale_dev(block_max(m), FP8_E4M3, 0);
    if (threadIdx.x == 0) qs[r] = s;
    for (int c = 8 * threadIdx.x; c < FF; c += 8 * blockDim.x) {
        float a[8];
        load8(a, y + c);
        *(uint2 *)(q + (size_t)r * FF + c) = encode8(a, s);
    }
}
void cu_glu_gu(void *out, FP8Tensor *outq, const void *gu, int N, int FF, int gelu) {
    if (N <= 0) return;
    if (outq) cu_check_outq(outq, N, FF, "glu_gu");
    if (outq && outq->gran == FP8_ROW && N <= ROW_FEW && FF % 8 == 0 && aligned16(out, gu, NULL, NULL) &&
        !((uintptr_t)outq->data & 7)) {
        if (gelu) glu_gu_row_kernel<true><<<N, 256, 0, cu_stream()>>>((bf16 *)out, (const bf16 *)gu, FF, outq->data, outq->scale);
        else glu_gu_row_kernel<false><<<N, 256, 0, cu_stream()>>>((bf16 *)out, (const bf16 *)gu, FF, outq->data, outq->scale);
        launchCheck();
        return;
    }
    int block = outq && outq->gran == FP8_BLOCK;  // ROW here (many rows, odd shapes): a pass of its own
    unsigned grid = cdiv((long)N * cdiv(FF, FP8_BLOCK_SIZE), 8);
    uint8_t *q = block ? outq->data : NULL;
    float *qs = block ? outq->scale : NULL;
    if (gelu) glu_gu_kernel<true><<<grid, 256, 0, cu_stream()>>>((bf16 *)out, (const bf16 *)gu, N, FF, q, qs);
    else glu_gu_kernel<false><<<grid, 256, 0, cu_stream()>>>((bf16 *)out, (const bf16 *)gu, N, FF, q, qs);
    launchCheck();
    if (outq && !block) fp8_quantize_cuda(outq, out, DT_BF16, 0);
}
// glu_forward_q: glu_fwd_kernel's values (act(gate) * up rounded to bf16) stored, and their 1x128 groups'
// FP8 codes from the same registers: 8 lanes a group, 16 values a lane (fp8_quantize_group16), a warp
// 4 rows of one group column. FF % 16 == 0, every buffer 16-byte aligned (cu_glu_forward_q checks).
template <bool GELU>
__global__ void __launch_bounds__(256) glu_q16_kernel(bf16 *out, uint8_t *q, float *qs, const bf16 *gate, const bf16 *up,
                                                      int N, int FF) {
    int lane = threadIdx.x & 31, kb = blockIdx.y, c0 = kb * FP8_BLOCK_SIZE + 16 * (lane & 7);
    int r = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 4 + (lane >> 3);
    bool ok = r < N, in = c0 < FF;
    float v[16];
    size_t at = (size_t)r * FF + c0;
    if (ok && in) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float g[8], u[8], *y = v + 8 * h;
            load8(g, gate + at + 8 * h);
            load8(u, up + at + 8 * h);
#pragma unroll
            for (int j = 0; j < 8; j++) y[j] = __bfloat162float(__float2bfloat16_rn(glu_mul<GELU>(g[j], u[j])));
            store8(out + at + 8 * h, y);  // already bf16 values: stored as they are
        }
    } else
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = 0.0f;
    fp8_quantize_group16(q + at, qs + (size_t)kb * N + r, v, ok, in, FP8_E4M3, 0);
}
void cu_glu_forward_q(void *out, FP8Tensor *outq, const void *gate, const void *up, int N, int FF, int gelu) {
    if (N <= 0) return;
    cu_check_outq(outq, N, FF, "glu_forward_q");
    bool fused = outq->gran == FP8_BLOCK && FF % 16 == 0 && aligned16(out, gate, up, outq->data);
    if (!fused) {  // glu_forward, then the quantization as its own pass
        if (gelu) glu_forward<true>(out, gate, up, (size_t)N * FF);
        else glu_forward<false>(out, gate, up, (size_t)N * FF);
        fp8_quantize_cuda(outq, out, DT_BF16, 0);
        return;
    }
    dim3 grid(cdiv(N, 32), cdiv(FF, FP8_BLOCK_SIZE));
    if (gelu) glu_q16_kernel<true><<<grid, 256, 0, cu_stream()>>>((bf16 *)out, outq->data, outq->scale, (const bf16 *)gate, (const bf16 *)up, N, FF);
    else glu_q16_kernel<false><<<grid, 256, 0, cu_stream()>>>((bf16 *)out, outq->data, outq->scale, (const bf16 *)gate, (const bf16 *)up, N, FF);
    launchCheck();
}
void cu_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    glu_backward<false>(dgate, dup, dout, gate, up, n);
}
void cu_add(void *out, const void *a, const void *b, size_t n) {
    if (!n) return;
    add_kernel<<<grid_vec(n), 256, 0, cu_stream()>>>((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n,
                                                   aligned16(out, a, b, NULL));
    launchCheck();
}

void cu_geglu_forward(void *out, const void *gate, const void *up, size_t n) { glu_forward<true>(out, gate, up, n); }
void cu_geglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    glu_backward<true>(dgate, dup, dout, gate, up, n);
}

// x *= s, each product in fp32 rounded once to bf16 (a bf16 tensor times a bf16 scalar in PyTorch)
__global__ void scale_act_kernel(bf16 *x, size_t n, float s) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * s);
}
void cu_scale_act(void *x, size_t n, float s) {
    if (!n) return;
    scale_act_kernel<<<grid_for(n), 256, 0, cu_stream()>>>((bf16 *)x, n, s);
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
void cu_gather_rows(void *out, const void *inp, const int32_t *idx, int n_idx, int C) {
    if (n_idx <= 0) return;
    gather_kernel<<<n_idx, 128, 0, cu_stream()>>>((bf16 *)out, (const bf16 *)inp, idx, C,
                                                C % 8 == 0 && aligned16(out, inp, NULL, NULL));
    launchCheck();
}

// out row i = bf16(decode(code) * scale) of FP8 row idx[i] (E4M3, a scale per row): the CPU's
// fp8_dequantize_row_cpu in fp32, rounded once
__global__ void gather_fp8_rows_kernel(bf16 *out, const uint8_t *codes, const float *scale, const int32_t *idx, int C) {
    int i = blockIdx.x;
    size_t r = (size_t)idx[i];
    const uint8_t *src = codes + r * C;
    float s = scale[r];
    bf16 *dst = out + (size_t)i * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = __float2bfloat16_rn(fp8_decode_dev(src[c], FP8_E4M3) * s);
}

void cu_embedding_forward(void *out, const int32_t *ids, const QWeight *wte, int N) {
    int C = wte->cols;
    if (wte->gran == FP8_OFF) {
        cu_gather_rows(out, wte->dense, ids, N, C);
        return;
    }
    if (wte->gran != FP8_ROW || wte->q.fmt != FP8_E4M3) die("embedding_forward: FP8 tables are E4M3 with a scale per row");
    if (N <= 0) return;
    gather_fp8_rows_kernel<<<N, 128, 0, cu_stream()>>>((bf16 *)out, wte->q.data, wte->q.scale, ids, C);
    launchCheck();
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
void cu_embedding_backward(void *dwte, const int32_t *ids, const void *dout, int N, int C) {
    if (N <= 0) return;
    embedding_bwd_kernel<<<N, 256, 0, cu_stream()>>>((float *)dwte, ids, (const bf16 *)dout, N, C);
    launchCheck();
}

