// cuda_common.cuh: what every .cu file of fp8-grpo shares (included by fp8.cu, fp8_hopper.cu,
// attention.cu, attention_decode.cu, backend_cuda.cu, sample.cu, and the kernel versions in dev/cuda/).
//   defines: cudaCheck / cublasCheck / launchCheck (file, line and the error's name),
//   cdiv, grid_for (the grid of a grid-stride loop), load_f / store_f (bf16 or f32 as f32), unpack8 / pack8
//   (8 bf16 values <-> f32),
//   warp_sum / warp_max / block_max, and the device FP8 codec: fp8_encode_dev, fp8_decode_dev,
//   fp8_scale_dev, fp8_div / fp8_div_fast (a value over its scale, as the CPU divides), fp8_encode4_dev
//   (four codes a word) and fp8_quantize_warp (_regs), the one routine that turns a row of values into FP8
//   codes and their scale (the GEMM's 1x128 activation groups and the KV cache's rows both use it);
//   block_amax_record (a tensor's amax, as bits, from every block), tile_codes_put /
//   tile_codes_write_t (a 128x128 tile of FP8 codes written transposed), swiglu_grad (SwiGLU's
//   derivative) and logprob_grad (a logit's gradient): the per-op and the fused FP8 backwards compute
//   them alike.
// The numerics are fp8.h's, bit for bit: scale = amax / max in fp32 (1 for an all-zero group),
// codes = encode(x / scale) with an IEEE division, round to nearest even, saturating.
#ifndef CUDA_COMMON_CUH
#define CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "fp8.h"
#include "core/common.h"

typedef __nv_bfloat16 bf16;

// ----------------------------------------------------------------------------
// checks that say where and why

static inline void cuda_check(cudaError_t e, const char *file, int line) {
    if (e != cudaSuccess) die("CUDA error %s at %s:%d: %s", cudaGetErrorName(e), file, line, cudaGetErrorString(e));
}
#define cudaCheck(e) cuda_check((e), __FILE__, __LINE__)
#define launchCheck() cuda_check(cudaGetLastError(), __FILE__, __LINE__)
#ifdef CUBLAS_VERSION  // files that include cuBLAS (before this header) get its check too
static inline void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) die("cuBLAS error %d at %s:%d", (int)s, file, line);
}
#define cublasCheck(s) cublas_check((s), __FILE__, __LINE__)
#endif

__host__ __device__ static inline int cdiv(long a, long b) { return (int)((a + b - 1) / b); }
// the largest power of two (<= 256) that divides the address: what vector loads, TMA and
// cuBLASLt's alignment rules ask of an operand
static inline int ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (u % a)) a >>= 1;
    return a;
}

// blocks of 256 threads for a grid-stride loop over n items: one item a thread up to 8192
// blocks (enough to fill any GPU several times over), then each thread takes several
static inline unsigned grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    return (unsigned)(g < 8192 ? (g ? g : 1) : 8192);
}

// ----------------------------------------------------------------------------
// element access: activations are bf16 on the GPU, high-precision values f32

__device__ __forceinline__ float load_f(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store_f(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(bf16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }
// 8 bf16 values (16 bytes) <-> fp32, rounding to nearest even
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

// ----------------------------------------------------------------------------
// reductions (every lane / thread gets the result; fixed order, so results repeat bit for bit)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// max over a block of blockDim.x threads (a multiple of 32, <= 1024)
__device__ __forceinline__ float block_max(float v) {
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
// asynchronous copies global -> shared (sm_80+): tiles staged while the previous one is in use

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16 (4) bytes; with ok == false the bytes are zero-filled and nothing is read
__device__ __forceinline__ void cp_async16(void *s, const void *g, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(s)), "l"(g), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void *s, const void *g, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(s)), "l"(g), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>  // wait until at most N committed groups are still in flight
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ----------------------------------------------------------------------------
// the FP8 codec on the device (the same numbers as fp8_cpu.c)

__device__ __forceinline__ uint8_t fp8_encode_dev(float v, int fmt) {
    // the hardware cvt (sm_89+, emulated in software below) rounds to nearest even and, with
    // satfinite, clamps +-inf and overflow to +-max; NaN keeps its sign as PyTorch does
    if (isnan(v)) return (signbit(v) ? 0x80 : 0x00) | 0x7F;
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}
__device__ __forceinline__ float fp8_decode_dev(uint8_t q, int fmt) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}
// fp8_scale_from_amax: amax / max (1 for 0, inf or NaN), at least FLT_MIN, pow2: rounded up to 2^k
__device__ __forceinline__ float fp8_scale_dev(float amax, int fmt, int pow2) {
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

// x / s as the CPU's division gives it (the GPU's division returns NaN without x's sign, x86's keeps
// it: the code of a NaN carries its sign, as PyTorch's does)
__device__ __forceinline__ float fp8_div(float x, float s) { return copysignf(__fdiv_rn(x, s), x); }
// The same, rounded to nearest, from y = 1/s rounded to nearest: x y is
// within two ulps of x / s; one correction by the exact remainder x - q s (an fma) brings it within
// one ulp, and a second makes it the rounded quotient (Markstein's theorem: y correctly rounded, q
// within an ulp, no underflow or overflow on the way). Exact for s >= 2^-60 and finite x: callers
// check s, and keep IEEE division for the rest. The sign is x's, so zeros keep theirs as x / s does.
// Three fmas and a multiply where IEEE division is a reciprocal, its refinement and a range check
// every value: the quantization passes are instruction-bound without it.
__device__ __forceinline__ float fp8_div_fast(float x, float s, float y) {
    float q = x * y;
    q = fmaf(fmaf(-q, s, x), y, q);
    q = fmaf(fmaf(-q, s, x), y, q);
    return copysignf(q, x);
}
// four quotients as four codes in one word (value j in byte j): the hardware's paired conversion
// (sm_89+), each value as fp8_encode_dev encodes it (NaN keeps its sign)
template <int FMT>
__device__ __forceinline__ uint32_t fp8_encode4_dev(const float (&d)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint16_t lo, hi;
    if (FMT == FP8_E4M3) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(d[1]), "f"(d[0]));
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d[3]), "f"(d[2]));
    } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(d[1]), "f"(d[0]));
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d[3]), "f"(d[2]));
    }
    uint32_t w = (uint32_t)lo | (uint32_t)hi << 16;
    if (isnan(d[0]) || isnan(d[1]) || isnan(d[2]) || isnan(d[3]))  // rare: one test for the four
        for (int j = 0; j < 4; j++)
            if (isnan(d[j])) w = (w & ~(0xffu << (8 * j))) | (uint32_t)(signbit(d[j]) ? 0xFF : 0x7F) << (8 * j);
    return w;
#else
    uint32_t w = 0;
    for (int j = 0; j < 4; j++) w |= (uint32_t)fp8_encode_dev(d[j], FMT) << (8 * j);
    return w;
#endif
}

// One group of n values (n <= 128 * CHUNKS) quantized by one warp: lane l holds values 4l..4l+3
// of each 128-wide chunk in registers between the amax and the encode, so x is read once.
// q[0..n) = codes, *scale (lane 0 writes it) = the group's scale. 4-byte stores where q allows.
// Callers: activations in 1x128 groups (fp8.cu) and the FP8 KV cache's (token, head) rows.
// fp8_quantize_warp_regs: the same from values the lanes already hold (v[c][j] = value c * 128 + lane * 4
// + j, 0 beyond n).
template <int CHUNKS, int FMT, bool FAST>
__device__ __forceinline__ void fp8_encode_warp(uint8_t *q, const float (&v)[CHUNKS][4], int n, float s) {
    int lane = threadIdx.x & 31;
    float y = __frcp_rn(s);
    bool packed = ((uintptr_t)q & 3) == 0;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
        int i0 = c * 128 + lane * 4;
        float d[4];
#pragma unroll
        for (int j = 0; j < 4; j++) d[j] = FAST ? fp8_div_fast(v[c][j], s, y) : fp8_div(v[c][j], s);
        uint32_t word = fp8_encode4_dev<FMT>(d);
        if (packed && i0 + 3 < n) *(uint32_t *)(q + i0) = word;
        else
            for (int j = 0; j < 4; j++)
                if (i0 + j < n) q[i0 + j] = (uint8_t)(word >> (8 * j));
    }
}
template <int CHUNKS>
__device__ __forceinline__ void fp8_quantize_warp_regs(uint8_t *q, float *scale, const float (&v)[CHUNKS][4], int n,
                                                       int fmt, int pow2) {
    int lane = threadIdx.x & 31;
    float m = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++)
#pragma unroll
        for (int j = 0; j < 4; j++) m = fmaxf(m, fabsf(v[c][j]));
    float amax = warp_max(m), s = fp8_scale_dev(amax, fmt, pow2);
    if (lane == 0) *scale = s;
    bool fast = s >= 0x1p-60f && amax < INFINITY;  // the whole warp alike: fp8_div_fast is exact
    if (fmt == FP8_E4M3) {
        if (fast) fp8_encode_warp<CHUNKS, FP8_E4M3, true>(q, v, n, s);
        else fp8_encode_warp<CHUNKS, FP8_E4M3, false>(q, v, n, s);
    } else {
        if (fast) fp8_encode_warp<CHUNKS, FP8_E5M2, true>(q, v, n, s);
        else fp8_encode_warp<CHUNKS, FP8_E5M2, false>(q, v, n, s);
    }
}
// One 1x128 group quantized by 8 lanes, 16 values a lane (lane t = lane % 8 holds values 16t..16t+15 of
// the group in v, 0 where the row has none): the group's amax, scale and reciprocal are paid once for 16
// values a lane, where fp8_quantize_warp pays them for 4 (a pass over a wide activation is instruction-
// bound that way). Every lane of the warp calls it (the shuffles); row_ok: the group exists (else
// nothing is written); in: this lane's 16 values are in the row (the row's length a multiple of 16).
// q: the lane's 16 codes (16-byte aligned), scale: the group's (lane t = 0 writes it). E4M3 or E5M2.
template <int FMT, bool FAST>
__device__ __forceinline__ uint4 fp8_encode16(const float (&v)[16], float s) {
    float y = __frcp_rn(s);
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float d[4];
#pragma unroll
        for (int j = 0; j < 4; j++) d[j] = FAST ? fp8_div_fast(v[4 * k + j], s, y) : fp8_div(v[4 * k + j], s);
        w[k] = fp8_encode4_dev<FMT>(d);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ void fp8_quantize_group16(uint8_t *q, float *scale, const float (&v)[16], bool row_ok, bool in,
                                                     int fmt, int pow2) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; j++) m = fmaxf(m, fabsf(v[j]));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));  // the group's 8 lanes
    if (!row_ok) return;
    float s = fp8_scale_dev(m, fmt, pow2);
    if ((threadIdx.x & 7) == 0) *scale = s;
    if (!in) return;
    bool fast = s >= 0x1p-60f && m < INFINITY;  // fp8_div_fast is exact
    *(uint4 *)q = fmt == FP8_E4M3 ? (fast ? fp8_encode16<FP8_E4M3, true>(v, s) : fp8_encode16<FP8_E4M3, false>(v, s))
                                  : (fast ? fp8_encode16<FP8_E5M2, true>(v, s) : fp8_encode16<FP8_E5M2, false>(v, s));
}
template <int CHUNKS, typename T>
__device__ __forceinline__ void fp8_quantize_warp(uint8_t *q, float *scale, const T *x, int n, int fmt, int pow2) {
    int lane = threadIdx.x & 31;
    float v[CHUNKS][4];
#pragma unroll
    for (int c = 0; c < CHUNKS; c++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int i = c * 128 + lane * 4 + j;
            v[c][j] = i < n ? load_f(x, i) : 0.0f;
        }
    fp8_quantize_warp_regs<CHUNKS>(q, scale, v, n, fmt, pow2);
}

// *amax = max(*amax, the bits of m over the block): one atomic per block. On the bits of |x| a NaN
// (sign cleared) orders above inf, above every number: the host sees NaN if any value was NaN.
// (A second call in the same kernel needs a __syncthreads() before it: part is reused.)
__device__ __forceinline__ void block_amax_record(unsigned *amax, unsigned m) {
    __shared__ unsigned part[32];
    m = __reduce_max_sync(0xffffffffu, m);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) part[w] = m;
    __syncthreads();
    if (w == 0) {
        m = __reduce_max_sync(0xffffffffu, l < (int)(blockDim.x >> 5) ? part[l] : 0u);
        if (l == 0 && m) atomicMax(amax, m);
    }
}

// A 128x128 tile of FP8 codes written transposed. The codes are staged in shared memory as bytes
// (16 KB), then written a warp-wide 128-byte store at a time: a lane reads one 4-byte word (4 codes
// of one row) from each of 4 consecutive rows and transposes the 4x4 bytes in registers
// (__byte_perm), giving 4 bytes of each of 4 output rows. Row r's words are stored rotated by r / 4
// (word w at (w + r / 4) mod 32), so that the 32 lanes, reading the same word of rows 4 apart, hit
// 32 different banks.
typedef uint32_t TileCodes[128][32];
// the codes of tile row r, columns 8 k8 .. 8 k8 + 7 (two words, the lower columns in the lower bytes)
__device__ __forceinline__ void tile_codes_put(TileCodes t, int r, int k8, uint2 codes) {
    t[r][(2 * k8 + (r >> 2)) & 31] = codes.x;
    t[r][(2 * k8 + 1 + (r >> 2)) & 31] = codes.y;
}
// after a __syncthreads(), by a block of 256 threads: q (C, R) rows c0 .. c0 + 127, columns r0 .. r0 + 127
// = the tile transposed (R a multiple of 4, q 4-byte aligned)
__device__ __forceinline__ void tile_codes_write_t(const TileCodes t, uint8_t *q, size_t R, int r0, int c0) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int it = 0; it < 4; it++) {
        int g = warp + 8 * it;  // the word of each row: tile columns 4g .. 4g + 3
        uint32_t a0 = t[4 * lane + 0][(g + lane) & 31], a1 = t[4 * lane + 1][(g + lane) & 31];
        uint32_t a2 = t[4 * lane + 2][(g + lane) & 31], a3 = t[4 * lane + 3][(g + lane) & 31];
        uint32_t lo01 = __byte_perm(a0, a1, 0x5140), hi01 = __byte_perm(a0, a1, 0x7362);
        uint32_t lo23 = __byte_perm(a2, a3, 0x5140), hi23 = __byte_perm(a2, a3, 0x7362);
        uint32_t col[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                           __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
        for (int i = 0; i < 4; i++) *(uint32_t *)(q + (size_t)(c0 + 4 * g + i) * R + r0 + 4 * lane) = col[i];
    }
}

// ----------------------------------------------------------------------------
// SwiGLU's derivative: out = silu(g) u, so dg = d u s (1 + g (1 - s)) and du = d g s, s = sigmoid(g)

__device__ __forceinline__ void swiglu_grad(float d, float g, float u, float *dg, float *du) {
    float sg = 1.0f / (1.0f + expf(-g));
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
    *du = d * g * sg;
}

// The gradient of dlogp logp, logp = log_softmax(inv_temp z)[t], with respect to the logit z of
// vocabulary entry j (is_t: j is the target t): dlogp (1[j = t] - exp(inv_temp z - lse)) inv_temp, each
// operation rounded once, in this order (no contraction: the tests repeat it on the CPU)
__device__ __forceinline__ float logprob_grad(float z, int is_t, float dlogp, float lse, float inv_temp) {
    float p = expf(__fsub_rn(__fmul_rn(z, inv_temp), lse));
    return __fmul_rn(__fmul_rn(dlogp, __fsub_rn(is_t ? 1.0f : 0.0f, p)), inv_temp);
}

#endif  // CUDA_COMMON_CUH
