// attention_decode.cu: the rollout engine's attention kernels (see attention_cuda.h): the paged KV
// cache's writes and the decode step's attention over it.
//   defines: kv_write_cuda, attention_decode_cuda, attention_decode_scratch, attention_decode_set_mma
// Decode: one block per (sequence, kv head, context split); its warps stride over the cached
// tokens (found through the block table), each keeping an online softmax for all the query
// heads of the kv head (GQA: K and V are read once per group); warps, then splits, are
// combined with their max and sum. A sliding window starts the walk at the window's first token.
// Two ways to do a block's walk: fp32 on the CUDA cores (any head dim; the first two kernels), or on
// the tensor cores (head dims 64 and 128: attn_decode_mma_kernel, further down), which long contexts
// with groups of 4+ query heads need (there the fp32 kernels are bound by their instructions).
// The numeric truth is ops_cpu.c's attention_decode_cpu.
#include <math.h>

#include "cuda/attention_cuda.h"
#include "cuda/cuda_common.cuh"
#include "cuda/mma_tile.cuh"

// ----------------------------------------------------------------------------
// KV cache

// the cache row (slot x KVH + kvh) of token t of a sequence whose block-table row is btr (a block size
// that is a power of two, as the engine's are, takes a shift instead of a 32-bit division)
__device__ __forceinline__ size_t cache_row(const int32_t *btr, int t, int BS, int KVH, int kvh) {
    const int b = BS & (BS - 1) ? t / BS : t >> (__ffs(BS) - 1);
    return ((size_t)btr[b] * BS + (t - b * BS)) * KVH + kvh;
}

__global__ void kv_write_kernel(bf16 *kc, bf16 *vc, const bf16 *k, const bf16 *v, const int32_t *slots, int row,
                                int vec) {
    int n = blockIdx.x, slot = slots[n];
    if (slot < 0) return;
    const bf16 *ks = k + (size_t)n * row, *vs = v + (size_t)n * row;
    bf16 *kd = kc + (size_t)slot * row, *vd = vc + (size_t)slot * row;
    if (vec) {  // 16-byte copies: rows of whole uint4s, 16-byte aligned pointers
        for (int i = threadIdx.x; i < row / 8; i += blockDim.x) {
            ((uint4 *)kd)[i] = ((const uint4 *)ks)[i];
            ((uint4 *)vd)[i] = ((const uint4 *)vs)[i];
        }
    } else {
        for (int i = threadIdx.x; i < row; i += blockDim.x) {
            kd[i] = ks[i];
            vd[i] = vs[i];
        }
    }
}

// FP8 cache: one warp per (token, head, k or v), quantized by the row codec (cuda_common.cuh)
__global__ void kv_write_fp8_kernel(uint8_t *kc, uint8_t *vc, float *ks, float *vs, const bf16 *k, const bf16 *v,
                                    const int32_t *slots, int N, int KVH, int HD) {
    int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (w >= N * KVH * 2) return;
    int n = w / (KVH * 2), h = (w / 2) % KVH, isv = w & 1, slot = slots[n];
    if (slot < 0) return;
    fp8_quantize_warp<KV_CHUNKS>((isv ? vc : kc) + ((size_t)slot * KVH + h) * HD, (isv ? vs : ks) + (size_t)slot * KVH + h,
                                 (isv ? v : k) + ((size_t)n * KVH + h) * HD, HD, FP8_E4M3, 0);
}

void kv_write_cuda(void *kc, void *vc, float *ks, float *vs, const void *k, const void *v, const int32_t *slots, int N,
                   int KVH, int HD, void *stream) {
    if (ks) {
        if (N <= 0) return;
        if (HD > 128 * KV_CHUNKS) die("kv_write_cuda: head_dim %d is over the FP8 KV cache's %d", HD, 128 * KV_CHUNKS);
        kv_write_fp8_kernel<<<(N * KVH * 2 + 7) / 8, 256, 0, (cudaStream_t)stream>>>(
            (uint8_t *)kc, (uint8_t *)vc, ks, vs, (const bf16 *)k, (const bf16 *)v, slots, N, KVH, HD);
        launchCheck();
        return;
    }
    if (N <= 0) return;
    int row = KVH * HD;
    int vec = row % 8 == 0 && !(((uintptr_t)kc | (uintptr_t)vc | (uintptr_t)k | (uintptr_t)v) & 15);
    kv_write_kernel<<<N, 128, 0, (cudaStream_t)stream>>>((bf16 *)kc, (bf16 *)vc, (const bf16 *)k, (const bf16 *)v,
                                                          slots, row, vec);
    launchCheck();
}

// ----------------------------------------------------------------------------
// decode

#define DEC_MAXREP 8  // query heads per block; larger groups take several blocks
#define DEC_WARPS 4

// The FP8 copy (1x128 groups, E4M3) of heads h0 .. h0 + nh - 1 of output row s that this block has just
// written: a warp per group through fp8_quantize_warp, as fp8.cu's quant_1x128_kernel does it, so the
// bytes are fp8_quantize_cuda's. oq (S, NH HD) codes, oqs (NH HD / 128, S) scales; HD % 128 == 0.
__device__ void decode_out_fp8(uint8_t *oq, float *oqs, const bf16 *out, int nh, int h0, int s, int S, int NH, int HD) {
    __syncthreads();  // the block's writes of out are visible to all its threads
    const int C = NH * HD, g0 = h0 * HD / FP8_BLOCK_SIZE, ng = nh * HD / FP8_BLOCK_SIZE;
    for (int g = g0 + (threadIdx.x >> 5); g < g0 + ng; g += blockDim.x >> 5)
        fp8_quantize_warp<1>(oq + (size_t)s * C + g * FP8_BLOCK_SIZE, oqs + (size_t)g * S + s,
                             out + (size_t)s * C + g * FP8_BLOCK_SIZE, FP8_BLOCK_SIZE, FP8_E4M3, 0);
}

// The end of both decode kernels: each warp left (max, sum, accumulator) per query head in shared
// memory (sm_m, sm_l [DEC_WARPS][reps], sm_acc [DEC_WARPS][reps][accw]); merge them per output
// element, then write the output (one split) or the split's partial (max, sum, accumulator)
__device__ void decode_merge_warps(bf16 *out, float *part, const float *sm_m, const float *sm_l, const float *sm_acc, int reps,
                                   int accw, int nh, int h0, int s, int sp, int NH, int HD, int nsplit) {
    for (int idx = threadIdx.x; idx < nh * HD; idx += blockDim.x) {
        int r = idx / HD, d = idx % HD, h = h0 + r;
        float M = -INFINITY, L = 0.f, A = 0.f;
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, sm_m[w * reps + r]);
        if (M != -INFINITY)
            for (int w = 0; w < DEC_WARPS; w++) {
                float mw = sm_m[w * reps + r];
                if (mw == -INFINITY) continue;
                float f = expf(mw - M);
                L += sm_l[w * reps + r] * f;
                A += sm_acc[((size_t)w * reps + r) * accw + d] * f;
            }
        if (nsplit == 1) out[((size_t)s * NH + h) * HD + d] = __float2bfloat16_rn(L > 0.f ? A / L : 0.f);
        else {
            float *pp = part + (((size_t)s * NH + h) * nsplit + sp) * (HD + 2);
            if (d == 0) {
                pp[0] = M;
                pp[1] = L;
            }
            pp[2 + d] = A;
        }
    }
}

// NP: bf16 pairs per lane (HD <= 64 NP). Grid (splits, KVH * groups, S).
template <int NP>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attn_decode_kernel(bf16 *out, float *part, const bf16 *q, const bf16 *kc, const bf16 *vc, const int32_t *bt,
                       const int32_t *lens, int NH, int KVH, int HD, int BS, int MB, int ngroups, int nsplit, int tps,
                       float sc, int window, uint8_t *oq, float *oqs) {
    __shared__ float sm_m[DEC_WARPS][DEC_MAXREP], sm_l[DEC_WARPS][DEC_MAXREP];
    __shared__ float sm_acc[DEC_WARPS][DEC_MAXREP][64 * NP];
    const int sp = blockIdx.x, s = blockIdx.z, kvh = blockIdx.y / ngroups, grp = blockIdx.y % ngroups;
    const int rep = NH / KVH, h0 = kvh * rep + grp * DEC_MAXREP, nh = min(DEC_MAXREP, rep - grp * DEC_MAXREP);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // this split's tokens; with a window, none before the window's first (len - window): masked there
    const int len = lens[s], tb = max(sp * tps, window > 0 ? len - window : 0), te = min(len, sp * tps + tps);
    float2 qv[DEC_MAXREP][NP], acc[DEC_MAXREP][NP];
    float m[DEC_MAXREP], l[DEC_MAXREP];
#pragma unroll
    for (int r = 0; r < DEC_MAXREP; r++) {
        m[r] = -INFINITY;
        l[r] = 0.f;
#pragma unroll
        for (int i = 0; i < NP; i++) {
            int d = 2 * (lane + 32 * i);
            acc[r][i] = make_float2(0.f, 0.f);
            qv[r][i] = (r < nh && d < HD)
                           ? __bfloat1622float2(*(const __nv_bfloat162 *)(q + ((size_t)s * NH + h0 + r) * HD + d))
                           : make_float2(0.f, 0.f);
        }
    }
    for (int t = tb + warp; t < te; t += DEC_WARPS) {
        size_t row = cache_row(bt + (size_t)s * MB, t, BS, KVH, kvh);
        const bf16 *kr = kc + row * HD, *vr = vc + row * HD;
        float2 kk[NP], vv[NP];
#pragma unroll
        for (int i = 0; i < NP; i++) {
            int d = 2 * (lane + 32 * i);
            kk[i] = d < HD ? __bfloat1622float2(*(const __nv_bfloat162 *)(kr + d)) : make_float2(0.f, 0.f);
            vv[i] = d < HD ? __bfloat1622float2(*(const __nv_bfloat162 *)(vr + d)) : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int r = 0; r < DEC_MAXREP; r++) {
            if (r >= nh) break;  // uniform across the warp
            float dt = 0.f;
#pragma unroll
            for (int i = 0; i < NP; i++) dt += qv[r][i].x * kk[i].x + qv[r][i].y * kk[i].y;
            float sco = warp_sum(dt) * sc;
            float mnew = fmaxf(m[r], sco), a = expf(m[r] - mnew), p = expf(sco - mnew);
            l[r] = l[r] * a + p;
            m[r] = mnew;
#pragma unroll
            for (int i = 0; i < NP; i++) {
                acc[r][i].x = acc[r][i].x * a + p * vv[i].x;
                acc[r][i].y = acc[r][i].y * a + p * vv[i].y;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < DEC_MAXREP; r++) {
        if (lane == 0) {
            sm_m[warp][r] = m[r];
            sm_l[warp][r] = l[r];
        }
#pragma unroll
        for (int i = 0; i < NP; i++) {
            int d = 2 * (lane + 32 * i);
            if (d < HD) {
                sm_acc[warp][r][d] = acc[r][i].x;
                sm_acc[warp][r][d + 1] = acc[r][i].y;
            }
        }
    }
    __syncthreads();
    decode_merge_warps(out, part, &sm_m[0][0], &sm_l[0][0], &sm_acc[0][0][0], DEC_MAXREP, 64 * NP, nh, h0, s, sp, NH, HD,
                       nsplit);
    if (oq && nsplit == 1) decode_out_fp8(oq, oqs, out, nh, h0, s, gridDim.z, NH, HD);
}

// The fast path for HD in {32, 64, 128, 256} (every model we know): LPT = HD/8 lanes share a
// token, each lane holding 8 consecutive dims (one 16-byte load of K and one of V), so a warp
// covers 32/LPT tokens at once and U steps of them are loaded before any is used: many
// loads in flight per lane, which is what a memory-bound kernel needs (the kernel above
// has one token per warp and waits on each load). Scores reduce over LPT lanes only.
// REP: query heads handled per block (the GQA group, or 8 of it); the register arrays
// are sized by it, so small groups (Qwen3-0.6B: 2, -8B: 4) use few registers.
// Grid (splits, KVH * groups, S), 4 warps. Same partial format as attn_decode_kernel.
// 8 values of a cache row as floats: bf16 (16 bytes), or FP8 E4M3 codes (the first 8 bytes) times
// the row's scale (the product in fp32, as ops_cpu.c forms it)
template <bool F8>
__device__ __forceinline__ void kv8(float f[8], const uint4 &raw, float scale) {
    if (F8) {
        const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
            f[2 * i] = __half2float(__half(__half_raw{h.x})) * scale;
            f[2 * i + 1] = __half2float(__half(__half_raw{h.y})) * scale;
        }
    } else {
        const __nv_bfloat162 *p2 = (const __nv_bfloat162 *)&raw;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 t = __bfloat1622float2(p2[i]);
            f[2 * i] = t.x, f[2 * i + 1] = t.y;
        }
    }
}

// the K and V rows of the U tokens t0, t0 + step, ... (< te) this lane group reads: lane c's 8 values
// of each (16 bytes bf16, 8 FP8 codes and the row's scale); zeros past te
template <int U, bool F8>
__device__ __forceinline__ void dec_load(uint4 (&kr)[U], uint4 (&vr)[U], float (&ksc)[U], float (&vsc)[U], int t0, int step,
                                         int te, const int32_t *bt, int BS, int KVH, int kvh, int HD, int c, const void *kc,
                                         const void *vc, const float *ks, const float *vs) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int t = t0 + u * step;
        kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
        ksc[u] = vsc[u] = 0.f;
        if (t < te) {
            size_t row = cache_row(bt, t, BS, KVH, kvh), off = row * HD + c * 8;
            if (F8) {
                uint2 a = __ldg((const uint2 *)((const uint8_t *)kc + off)), b = __ldg((const uint2 *)((const uint8_t *)vc + off));
                kr[u].x = a.x, kr[u].y = a.y, vr[u].x = b.x, vr[u].y = b.y;
                ksc[u] = __ldg(ks + row), vsc[u] = __ldg(vs + row);
            } else {
                kr[u] = __ldg((const uint4 *)((const bf16 *)kc + off));
                vr[u] = __ldg((const uint4 *)((const bf16 *)vc + off));
            }
        }
    }
}

// F8: the cache holds FP8 codes with a scale per (slot, head) in ks, vs (8 bytes per lane)
template <int HD, int REP, bool F8>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attn_decode_vec_kernel(bf16 *out, float *part, const bf16 *q, const void *kc, const void *vc, const float *ks,
                           const float *vs, const int32_t *bt, const int32_t *lens, int NH, int KVH, int BS, int MB,
                           int ngroups, int nsplit, int tps, float sc, int window, uint8_t *oq, float *oqs) {
    constexpr int LPT = HD / 8, TPW = 32 / LPT, U = REP <= 2 ? 4 : 2, STEP = DEC_WARPS * TPW;
    __shared__ float sm_m[DEC_WARPS][REP], sm_l[DEC_WARPS][REP];
    __shared__ float sm_acc[DEC_WARPS][REP][HD];
    const int sp = blockIdx.x, s = blockIdx.z, kvh = blockIdx.y / ngroups, grp = blockIdx.y % ngroups;
    const int rep = NH / KVH, h0 = kvh * rep + grp * REP, nh = min(REP, rep - grp * REP);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / LPT, c = lane % LPT;
    const int len = lens[s], tb = max(sp * tps, window > 0 ? len - window : 0), te = min(len, sp * tps + tps);
    float qf[REP][8], acc[REP][8], m[REP], l[REP];
#pragma unroll
    for (int r = 0; r < REP; r++) {
        m[r] = -INFINITY;
        l[r] = 0.f;
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (r < nh) raw = *(const uint4 *)(q + ((size_t)s * NH + h0 + r) * HD + c * 8);
        const __nv_bfloat162 *p2 = (const __nv_bfloat162 *)&raw;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __bfloat1622float2(p2[i]);
            qf[r][2 * i] = f.x * sc;  // the softmax scale folded into q
            qf[r][2 * i + 1] = f.y * sc;
            acc[r][2 * i] = acc[r][2 * i + 1] = 0.f;
        }
    }
    // the loop bound is uniform over the warp (the shuffles below need every lane). PF: the next
    // step's rows are loaded before this step's math, so they are in flight while it runs. The
    // second set of rows costs registers: with 2 heads a block (U = 4) it still leaves 4 blocks on
    // an SM; with 4 heads U = 4 would leave 3 (fewer loads in flight: slower), so U = 2; with 8
    // heads the registers leave no room for it (dev/notes/decode.md, "Figures that were in product
    // comments: the decode attention's prefetch").
    constexpr bool PF = REP <= 4;
    const int32_t *btr = bt + (size_t)s * MB;
    uint4 kr[U], vr[U];
    float ksc[U], vsc[U];
    if (PF) dec_load<U, F8>(kr, vr, ksc, vsc, tb + warp * TPW + g, STEP, te, btr, BS, KVH, kvh, HD, c, kc, vc, ks, vs);
    for (int base = tb + warp * TPW; base < te; base += STEP * U) {
        const int t0 = base + g;
        uint4 kn[U], vn[U];
        float ksn[U], vsn[U];
        if (PF) dec_load<U, F8>(kn, vn, ksn, vsn, t0 + STEP * U, STEP, te, btr, BS, KVH, kvh, HD, c, kc, vc, ks, vs);
        else dec_load<U, F8>(kr, vr, ksc, vsc, t0, STEP, te, btr, BS, KVH, kvh, HD, c, kc, vc, ks, vs);
        // the U scores of every head first, then one online-softmax update per head for all U
        // tokens (U + 1 exponentials and one rescale of acc instead of 2U and U)
        float sc_[U][REP];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const bool ok = t0 + u * STEP < te;  // uniform over the LPT lanes of a token
            float kf[8];
            kv8<F8>(kf, kr[u], ksc[u]);
#pragma unroll
            for (int r = 0; r < REP; r++) {
                float d = 0.f;
#pragma unroll
                for (int i = 0; i < 8; i++) d += qf[r][i] * kf[i];
#pragma unroll
                for (int o = LPT / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                sc_[u][r] = ok ? d : -INFINITY;
            }
        }
        // then, when the step has a token for these lanes (the first is the earliest), per head: the
        // new max and the rescale; then per token: V decoded once, added to every head's sum (the
        // same operations in the same order per head as one head at a time, with V decoded REP x less)
        if (t0 < te) {
#pragma unroll
            for (int r = 0; r < REP; r++) {
                if (r >= nh) continue;
                float mx = sc_[0][r];
#pragma unroll
                for (int u = 1; u < U; u++) mx = fmaxf(mx, sc_[u][r]);
                float mnew = fmaxf(m[r], mx), a = __expf(m[r] - mnew);
                l[r] *= a;
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r][i] *= a;
                m[r] = mnew;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                float vf[8];
                kv8<F8>(vf, vr[u], vsc[u]);
#pragma unroll
                for (int r = 0; r < REP; r++) {
                    if (r >= nh) continue;
                    float p = __expf(sc_[u][r] - m[r]);  // 0 for masked tokens
                    l[r] += p;
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[r][i] += p * vf[i];
                }
            }
        }
        if (PF)
#pragma unroll
            for (int u = 0; u < U; u++) kr[u] = kn[u], vr[u] = vn[u], ksc[u] = ksn[u], vsc[u] = vsn[u];
    }
    // merge the TPW tokens slots of the warp (lanes c, c + LPT, ...), then the warps through shared memory
#pragma unroll
    for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
        for (int r = 0; r < REP; r++) {
            float m2 = __shfl_xor_sync(0xffffffffu, m[r], o), l2 = __shfl_xor_sync(0xffffffffu, l[r], o);
            float M = fmaxf(m[r], m2);
            float a = M == -INFINITY ? 0.f : __expf(m[r] - M), b = M == -INFINITY ? 0.f : __expf(m2 - M);
            l[r] = l[r] * a + l2 * b;
            m[r] = M;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[r][i] = acc[r][i] * a + __shfl_xor_sync(0xffffffffu, acc[r][i], o) * b;
        }
    if (g == 0)
#pragma unroll
        for (int r = 0; r < REP; r++) {
            if (c == 0) {
                sm_m[warp][r] = m[r];
                sm_l[warp][r] = l[r];
            }
#pragma unroll
            for (int i = 0; i < 8; i++) sm_acc[warp][r][c * 8 + i] = acc[r][i];
        }
    __syncthreads();
    decode_merge_warps(out, part, &sm_m[0][0], &sm_l[0][0], &sm_acc[0][0][0], REP, HD, nh, h0, s, sp, NH, HD, nsplit);
    if (oq && nsplit == 1) decode_out_fp8(oq, oqs, out, nh, h0, s, gridDim.z, NH, HD);
}

// ----------------------------------------------------------------------------
// The tensor-core kernel (HD 64 or 128, up to 16 query heads a kv head: every model we run). The
// kernels above spend tens of instructions a cached token and kv head on dot products, shuffles and
// exponentials, one token per lane group at a time: at long contexts with several query heads a kv
// head they are bound by those instructions, not by the bytes (dev/notes/decode.md, "The decode step on
// the H200: where an 8B layer's time goes", its long contexts). Here a block (one
// sequence, kv head and context split) holds the group's query heads as the 16 rows of an mma A operand
// (rows past the group zero), and walks the context in stages of 64 tokens, 16 a warp:
//   S (16 heads x 16 tokens) = Q K^T    K's rows are B^T's (bf16: ldmatrix straight from the staged tile)
//   online softmax per head row         in exp2's domain; its max moves only past a slack (DS_SLACK)
//   O (16 x HD) += P V                  P re-packed from S's accumulators (the A operand)
// Each warp owns DS_W tokens of every stage and loads them itself by cp.async, DS_STAGES - 1 stages ahead
// of the one in use, every row found through the block table (tokens past the split's end zero-filled):
// no block barrier until the warps merge. A bf16 cache's products are bf16 (P rounded to
// bf16: 2^-9 of each p, this path's one departure from fp32 arithmetic; gpu_backend's tolerance is
// derived from it). An FP8 cache's are f16, its codes turned into fragments as they are read (an E4M3
// code is an f16 value: one cvt a pair): K's in a dims order that makes one 32-bit read two fragments
// (Q's A operand in the same order), V's gathered by byte permutes from two rows, the output's columns
// in the matching order. K's scale multiplies the scores; V's is folded into P, divided by the largest
// V scale the warp has seen so far (vref) so that P stays within f16's range, O kept in units of vref.
// Q goes to f16 times 2^-3 (exact for |q| in [2^-11, 2^19), far beyond a trained model's queries),
// P is rounded to f16 (2^-11). The warps' (max, sum, O) merge and the splits combine as in the kernels above.
#define DS_T 64       // tokens a stage
#define DS_STAGES 3   // stages in flight
#define DS_ROWS 16    // query heads a block: the A operand's rows
#define DS_W 16       // tokens a warp takes of each stage (DS_T = DEC_WARPS x DS_W)
#define DS_SLACK 8.f  // how far (log2) a score may pass a row's running max before the max moves

template <int HD, bool F8>
struct DecodeMmaSmem {
    static constexpr int TILE = DS_T * HD * 2;                             // bytes of a bf16 K or V tile
    static constexpr int KP = HD + 16;  // bytes of an FP8 row in shared memory: padded, so a warp's reads miss no bank twice
    static constexpr int STAGE = F8 ? 2 * DS_T * KP + 2 * DS_T * 4 : 2 * TILE;  // codes + scales, or the tiles
    static constexpr int MERGE = DEC_WARPS * DS_ROWS * (HD + 2) * 4;       // the warps' (max, sum, O), after the walk
    static constexpr int WALK = DS_STAGES * STAGE;
    static constexpr int BYTES = WALK > MERGE ? WALK : MERGE;
};

// a warp's share of stage buffer `st`: rows w0 .. w0 + DS_W - 1 (tokens t0 .. t0 + DS_W - 1; zeros from te on):
// bf16 rows into the swizzled tiles (mma_tile.cuh toff), FP8 codes as padded rows, then each row's two scales.
// Each lane finds one token's cache row (lanes 16-31 repeat 0-15) and the warp's copies take it by shuffle
// (32 bits: a cache of 2^32 rows would be terabytes).
template <int HD, bool F8>
__device__ __forceinline__ void ds_load(uint8_t *st, const void *kc, const void *vc, const float *ks, const float *vs,
                                        const int32_t *btr, int BS, int KVH, int kvh, int w0, int t0, int te) {
    using L = DecodeMmaSmem<HD, F8>;
    constexpr int EB = F8 ? 1 : 2, CH = HD * EB / 16;  // 16-byte chunks a row
    const int lane = threadIdx.x & 31, tl = lane % DS_W;
    const bool ok = t0 + tl < te;
    const uint32_t row = ok ? (uint32_t)cache_row(btr, t0 + tl, BS, KVH, kvh) : 0;
#pragma unroll
    for (int i = lane; i < DS_W * CH; i += 32) {
        const int r = i / CH, c = i % CH;
        const size_t off = (size_t)__shfl_sync(0xffffffffu, row, r) * (HD * EB) + c * 16;
        const int dst = F8 ? (w0 + r) * L::KP + c * 16 : toff<HD>(w0 + r, c) * 2;
        cp_async16(st + dst, (const uint8_t *)kc + off, t0 + r < te);
        cp_async16(st + (F8 ? DS_T * L::KP : L::TILE) + dst, (const uint8_t *)vc + off, t0 + r < te);
    }
    if (F8) cp_async4(st + 2 * DS_T * L::KP + ((lane / DS_W) * DS_T + w0 + tl) * 4, (lane < DS_W ? ks : vs) + row, ok);
}

// four E4M3 codes (w's bytes, the first lowest) -> two f16 pairs (exact): bytes 0, 1 into lo, 2, 3 into hi
// (sm_89+: each cvt reads a 16-bit half of w as it is, no shift)
__device__ __forceinline__ void e4m3x4_f16x4(uint32_t w, uint32_t &lo, uint32_t &hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#else  // no FP8 conversion instruction: cuda_fp8.h's arithmetic
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    lo = (uint32_t)a.x | ((uint32_t)a.y << 16);
    hi = (uint32_t)b.x | ((uint32_t)b.y << 16);
#endif
}
// 2^x in one MUFU instruction (ex2.approx: 2 ulp; results below 2^-126 flush to 0, as a softmax may let them)
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Grid (splits, KVH, S), DEC_WARPS warps; out / part as attn_decode_kernel's
template <int HD, bool F8>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attn_decode_mma_kernel(bf16 *out, float *part, const bf16 *q, const void *kc, const void *vc, const float *ks,
                           const float *vs, const int32_t *bt, const int32_t *lens, int NH, int KVH, int BS, int MB,
                           int nsplit, int tps, float sc, int window, uint8_t *oq, float *oqs) {
    using L = DecodeMmaSmem<HD, F8>;
    constexpr int KS = HD / 16, ND = HD / 8;
    extern __shared__ __align__(128) uint8_t smem[];
    const int sp = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z, rep = NH / KVH, h0 = kvh * rep;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int len = lens[s], tb = max(sp * tps, window > 0 ? len - window : 0), te = min(len, sp * tps + tps);
    const int32_t *btr = bt + (size_t)s * MB;
    // each warp walks its own DS_W tokens of every stage: it loads them, waits for them and reads them
    // alone (its own cp.async groups and __syncwarp, no block barrier inside the walk)
    const int w0 = warp * DS_W, nwst = tb + w0 < te ? (te - tb - w0 + DS_T - 1) / DS_T : 0;
    for (int j = 0; j < DS_STAGES - 1; j++) {
        if (j < nwst) ds_load<HD, F8>(smem + j * L::STAGE, kc, vc, ks, vs, btr, BS, KVH, kvh, w0, tb + j * DS_T + w0, te);
        cp_async_commit();
    }
    // the A operand: rows g and g + 8 are query heads h0 + g, h0 + g + 8 (zero past the group); k = 2 t4
    // (+1) and 2 t4 + 8 (+1) of step kk are dims 16 kk + 2 t4 and + 8 (bf16), or 16 kk + 4 t4 and + 2 (f16:
    // the order in which one 32-bit read of a K row's codes holds both of a lane's B fragments)
    uint32_t qa[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = g + (e & 1) * 8, d = kk * 16 + (F8 ? 4 * t4 + (e >> 1) * 2 : 2 * t4 + (e >> 1) * 8);
            const uint32_t v = r < rep ? *(const uint32_t *)(q + ((size_t)s * NH + h0 + r) * HD + d) : 0u;
            if (F8) {  // times 2^-3 (exact), for f16's range; the scores take the 8 back
                const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&v);
                qa[kk][e] = pack_f16(f.x * 0.125f, f.y * 0.125f);
            } else qa[kk][e] = v;
        }
    const float slk = sc * 1.4426950408889634f * (F8 ? 8.f : 1.f);  // scores in exp2's domain (FP8: Q's 2^-3 back)
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f}, o[ND][4], vref = 0.f, vinv = 0.f;
#pragma unroll
    for (int i = 0; i < ND; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    for (int j = 0; j < nwst; j++) {
        cp_async_wait<DS_STAGES - 2>();
        __syncwarp();  // stage j landed for every lane; every lane is done reading stage j - 1's buffer
        {
            const int jn = j + DS_STAGES - 1;
            if (jn < nwst)
                ds_load<HD, F8>(smem + (jn % DS_STAGES) * L::STAGE, kc, vc, ks, vs, btr, BS, KVH, kvh, w0, tb + jn * DS_T + w0, te);
            cp_async_commit();
        }
        const uint8_t *st = smem + (j % DS_STAGES) * L::STAGE;
        const bf16 *Kt = (const bf16 *)st, *Vt = (const bf16 *)(st + L::TILE);
        const uint8_t *Kc = st, *Vc = st + DS_T * L::KP;  // FP8 codes
        const float *kscale = (const float *)(st + 2 * DS_T * L::KP), *vscale = kscale + DS_T;
        const int tok0 = tb + j * DS_T + w0;  // this warp's DS_W tokens
        // S = Q K^T, the k steps in two chains (even, odd) so that each product waits on half as many
        float sf[2][4] = {}, sg[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            float (*acc)[4] = kk & 1 ? sg : sf;
            if (F8) {  // lane (g, t4): token w0 + 8 nt + g, dims 16 kk + 4 t4 .. + 3
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    uint32_t b0, b1;
                    e4m3x4_f16x4(*(const uint32_t *)(Kc + (w0 + nt * 8 + g) * L::KP + kk * 16 + 4 * t4), b0, b1);
                    mma16816_f16(acc[nt], qa[kk], b0, b1);
                }
            } else {
                uint32_t bb[4];
                ldsm4(bb, Kt + toff<HD>(BN_ROW(w0), BN_CH(kk)));
                mma16816(acc[0], qa[kk], bb[0], bb[1]);
                mma16816(acc[1], qa[kk], bb[2], bb[3]);
            }
        }
        // scores (scaled, K's scale for FP8; -inf past the split's end), each row's max over the DS_W tokens.
        // Scales are read for every token (past the end they are staged zeros) and the end is a select, so
        // that no load waits behind a branch.
        float mx[2] = {-INFINITY, -INFINITY};
        const bool whole = tok0 + DS_W <= te;  // the warp's tokens all in the split (uniform)
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int c = nt * 8 + 2 * t4;  // this lane's two tokens: c, c + 1 of the warp's
            const float2 ksc = F8 ? *(const float2 *)(kscale + w0 + c) : make_float2(1.f, 1.f);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float x = (sf[nt][e] + sg[nt][e]) * slk * (e & 1 ? ksc.y : ksc.x);
                sf[nt][e] = whole || tok0 + c + (e & 1) < te ? x : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], sf[nt][e]);
            }
        }
        float vmx = 0.f;  // FP8: the largest V scale of the DS_W tokens
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        if (F8) {
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) vmx = fmaxf(vmx, vscale[w0 + nt * 8 + 2 * t4 + e]);
            vmx = fmaxf(vmx, __shfl_xor_sync(0xffffffffu, vmx, 1));
            vmx = fmaxf(vmx, __shfl_xor_sync(0xffffffffu, vmx, 2));
        }
        // The online softmax, lazily: a row's running max (the reference its sum and O are kept against) moves
        // only when a score passes it by more than DS_SLACK, so that P <= 2^DS_SLACK and O is rescaled at the
        // few stages where some row's max (or, FP8, the V scale reference vref) grows, not at every stage.
        // FP8: P carries V's scale over vref, the largest the warp has seen (P V is then in units of vref).
        const bool grow = mx[0] > mrow[0] + DS_SLACK || mx[1] > mrow[1] + DS_SLACK || (F8 && vmx > vref);
        if (__any_sync(0xffffffffu, grow)) {
            float vfac = 1.f;
            if (F8 && vmx > vref) {
                vfac = vref / vmx;
                vref = vmx;
                vinv = 1.f / vmx;
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float mnew = fmaxf(mrow[r], mx[r]), mb = mnew == -INFINITY ? 0.f : mnew;
                const float of = exp2_fast(mrow[r] - mb);
                lrow[r] *= of;
                mrow[r] = mnew;
#pragma unroll
                for (int nd = 0; nd < ND; nd++) o[nd][2 * r] *= of * vfac, o[nd][2 * r + 1] *= of * vfac;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float mb = mrow[r] == -INFINITY ? 0.f : mrow[r];
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2_fast(sf[nt][2 * r + e] - mb);
                    rs += p;
                    sf[nt][2 * r + e] = F8 ? p * (vscale[w0 + nt * 8 + 2 * t4 + e] * vinv) : p;  // V's scale into P
                }
            lrow[r] += rs;
        }
        if (F8) {
            // P (f16) times V: k = tokens 2 t4 (+1), 2 t4 + 8 (+1); n-tile 4 q + i, column n <-> dim 32 q + 4 n + i,
            // so that lane g's two 32-bit reads of rows 2 t4, 2 t4 + 1 (dims 32 q + 4 g .. + 3) make four B
            // fragments by byte permutes
            const uint32_t pa[4] = {pack_f16(sf[0][0], sf[0][1]), pack_f16(sf[0][2], sf[0][3]), pack_f16(sf[1][0], sf[1][1]),
                                    pack_f16(sf[1][2], sf[1][3])};
#pragma unroll
            for (int qd = 0; qd < HD / 32; qd++) {
                const uint8_t *v0 = Vc + (w0 + 2 * t4) * L::KP + 32 * qd + 4 * g;
                const uint32_t A = *(const uint32_t *)v0, B = *(const uint32_t *)(v0 + L::KP);
                const uint32_t C = *(const uint32_t *)(v0 + 8 * L::KP), D = *(const uint32_t *)(v0 + 9 * L::KP);
                uint32_t b0[4], b1[4];  // n-tile i's fragments: (A_i, B_i) and (C_i, D_i) as f16 pairs
                e4m3x4_f16x4(__byte_perm(A, B, 0x5140), b0[0], b0[1]);  // A0 B0 A1 B1
                e4m3x4_f16x4(__byte_perm(A, B, 0x7362), b0[2], b0[3]);  // A2 B2 A3 B3
                e4m3x4_f16x4(__byte_perm(C, D, 0x5140), b1[0], b1[1]);
                e4m3x4_f16x4(__byte_perm(C, D, 0x7362), b1[2], b1[3]);
#pragma unroll
                for (int i = 0; i < 4; i++) mma16816_f16(o[4 * qd + i], pa, b0[i], b1[i]);
            }
        } else {
            uint32_t pa[4];
            c_to_a(pa, sf[0], sf[1]);
            mma_ab_rows<HD>(o, pa, Vt, w0);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages: their memory holds the merge from here
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
    }
    float *sm_m = (float *)smem, *sm_l = sm_m + DEC_WARPS * DS_ROWS, *sm_acc = sm_l + DEC_WARPS * DS_ROWS;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = g + 8 * r;
        if (t4 == 0) {
            sm_m[warp * DS_ROWS + row] = mrow[r] * 0.6931471805599453f;  // back to exp's domain, as the merge reads it
            sm_l[warp * DS_ROWS + row] = lrow[r];
        }
        float *a = sm_acc + ((size_t)warp * DS_ROWS + row) * HD;
#pragma unroll
        for (int nd = 0; nd < ND; nd++) {
            // column 2 t4 (+1) of n-tile nd: dim 8 nd + 2 t4 (+1); FP8: dim 32 (nd / 4) + 8 t4 (+4) + nd % 4, times vref
            const int d0 = F8 ? 32 * (nd / 4) + 8 * t4 + nd % 4 : nd * 8 + 2 * t4, d1 = F8 ? d0 + 4 : d0 + 1;
            a[d0] = o[nd][2 * r] * (F8 ? vref : 1.f);
            a[d1] = o[nd][2 * r + 1] * (F8 ? vref : 1.f);
        }
    }
    __syncthreads();
    decode_merge_warps(out, part, sm_m, sm_l, sm_acc, DS_ROWS, HD, rep, h0, s, sp, NH, HD, nsplit);
    if (oq && nsplit == 1) decode_out_fp8(oq, oqs, out, rep, h0, s, gridDim.z, NH, HD);
}

__global__ void attn_decode_combine(bf16 *out, const float *part, int NH, int HD, int nsplit, uint8_t *oq, float *oqs) {
    const int h = blockIdx.x, s = blockIdx.y;
    const float *pp = part + ((size_t)s * NH + h) * nsplit * (HD + 2);
    float M = -INFINITY;
    for (int sp = 0; sp < nsplit; sp++) M = fmaxf(M, pp[(size_t)sp * (HD + 2)]);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float L = 0.f, A = 0.f;
        for (int sp = 0; sp < nsplit; sp++) {
            const float *p = pp + (size_t)sp * (HD + 2);
            if (p[0] == -INFINITY) continue;
            float f = expf(p[0] - M);
            L += p[1] * f;
            A += p[2 + d] * f;
        }
        out[((size_t)s * NH + h) * HD + d] = __float2bfloat16_rn(L > 0.f ? A / L : 0.f);
    }
    if (oq) decode_out_fp8(oq, oqs, out, 1, h, s, gridDim.y, NH, HD);
}

static int num_sms(void) {
    static int n = 0;
    if (!n) {
        int dev;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    }
    return n;
}

// Splits of the context. The fp32 kernels: enough blocks for two an SM, at least 256 tokens a split, at
// most 64 splits. The tensor-core kernel's blocks are few (one a kv head) and long, and an SM holds only
// per_sm of them: a batch's blocks in 1.3 waves take as long as in 2. Its split count is the one with the
// least (whole waves) x (tokens a split + 512, a block's fixed cost in tokens' time: prologue, merge, partial
// sums; fitted to 8B's 64 x 2,048 tokens: dev/notes/decode.md, "The decode attention on the tensor cores,
// second version").
static int decode_nsplit(int S, int KVH, int ngroups, int maxlen, int per_sm) {
    long blocks = (long)S * KVH * ngroups, most = (maxlen + 255) / 256;
    if (most > 64) most = 64;
    if (per_sm) {
        long slots = (long)num_sms() * per_sm, best = 1;
        double cost = 1e300;
        for (long ns = 1; ns <= most; ns++) {
            double c = (double)((blocks * ns + slots - 1) / slots) * ((double)maxlen / ns + 512);
            if (c < cost) cost = c, best = ns;
        }
        return (int)best;
    }
    long want = (2L * num_sms() + blocks - 1) / blocks, ns = want < most ? want : most;
    return ns < 1 ? 1 : (int)ns;
}

// blocks of the tensor-core kernel an SM holds at once (its shared memory and registers decide)
template <int HD, bool F8>
static int mma_blocks_per_sm(void) {
    static int n = 0;
    if (!n) {
        cudaCheck(cudaFuncSetAttribute(attn_decode_mma_kernel<HD, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       DecodeMmaSmem<HD, F8>::BYTES));
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_decode_mma_kernel<HD, F8>, DEC_WARPS * 32,
                                                                DecodeMmaSmem<HD, F8>::BYTES));
        if (n < 1) n = 1;
    }
    return n;
}
static int mma_per_sm(int HD, int f8) {
    if (HD == 64) return f8 ? mma_blocks_per_sm<64, true>() : mma_blocks_per_sm<64, false>();
    return f8 ? mma_blocks_per_sm<128, true>() : mma_blocks_per_sm<128, false>();
}

// The tensor-core kernel for groups of 3 to 16 query heads a kv head, where it is the faster at every
// context length; with 2 (0.6B) the fp32 kernel's work is small enough that it stays the faster (the
// measurements: dev/notes/decode.md, "The decode attention's walk in fewer instructions").
// attention_decode_set_mma: 0 never, 1 wherever it can run (HD 64 or 128, up to 16 heads; the tests), -1 the rule.
static int decode_mma_mode = -1;
void attention_decode_set_mma(int mode) { decode_mma_mode = mode; }
static int decode_mma(int NH, int KVH, int HD) {
    int rep = NH / KVH, can = (HD == 64 || HD == 128) && rep <= DS_ROWS;
    if (decode_mma_mode >= 0) return can && decode_mma_mode;
    return can && rep >= 3;
}
static int decode_groups(int NH, int KVH, int HD) {
    return decode_mma(NH, KVH, HD) ? 1 : (NH / KVH + DEC_MAXREP - 1) / DEC_MAXREP;
}

// the decode kernels take GQA groups of any size and even head dims up to 256 (4 bf16 pairs a lane)
static void check_heads(const char *what, int NH, int KVH, int HD) {
    if (KVH <= 0 || NH % KVH) die("%s: %d query heads are not a multiple of %d kv heads", what, NH, KVH);
    if (HD % 2 || HD > 256) die("%s: head_dim %d is not supported (even, <= 256)", what, HD);
}

size_t attention_decode_scratch(int S, int NH, int KVH, int HD, int BS, int MB) {
    int maxlen = BS * MB, ns = decode_nsplit(S, KVH, decode_groups(NH, KVH, HD), maxlen, 0);
    if (decode_mma(NH, KVH, HD)) {  // either cache's kernel (FP8 or bf16), whichever splits more
        int n8 = decode_nsplit(S, KVH, 1, maxlen, mma_per_sm(HD, 1)), n16 = decode_nsplit(S, KVH, 1, maxlen, mma_per_sm(HD, 0));
        ns = n8 > n16 ? n8 : n16;
    }
    return ns > 1 ? (size_t)S * NH * ns * (HD + 2) : 0;
}

void attention_decode_cuda(void *out, const void *q, const void *kc, const void *vc, const float *ks, const float *vs,
                           const int32_t *block_table, const int32_t *seq_lens, int S, int NH, int KVH, int HD, int BS,
                           int MB, float sc, int window, float *scratch, uint8_t *oq, float *oqs, void *stream) {
    check_heads("attention_decode", NH, KVH, HD);
    if (oq && HD % FP8_BLOCK_SIZE) die("attention_decode: the FP8 copy of out needs head_dim %% 128 == 0 (got %d)", HD);
    if (S <= 0) return;
    cudaStream_t st = (cudaStream_t)stream;
    // (unaligned rows take the other kernels: more blocks, so no more splits than attention_decode_scratch planned)
    int rep = NH / KVH, maxlen = BS * MB;
    int mma = decode_mma(NH, KVH, HD) && !(((uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc) & 15);
    int ngroups = mma ? 1 : (rep + DEC_MAXREP - 1) / DEC_MAXREP;
    int ns = decode_nsplit(S, KVH, ngroups, maxlen, mma ? mma_per_sm(HD, ks != NULL) : 0), tps = (maxlen + ns - 1) / ns;
    dim3 grid(ns, KVH * ngroups, S);
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q;
    // the vectorized fp32 kernel where HD has a template and every row is aligned (16 bytes, 8 for FP8 codes)
    int vec = (HD == 32 || HD == 64 || HD == 128 || HD == 256) &&
              !(((uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc) & (ks ? 7 : 15));
    if (ks && !vec) die("attention_decode: an FP8 KV cache needs head_dim 32, 64, 128 or 256 (got %d)", HD);
    int REP = rep <= 2 ? 2 : rep <= 4 ? 4 : DEC_MAXREP;  // groups of more than 8 take ngroups blocks of 8
#define DEC_MMA(H, F)                                                                                      \
    attn_decode_mma_kernel<H, F><<<grid, DEC_WARPS * 32, DecodeMmaSmem<H, F>::BYTES, st>>>(                \
        o, scratch, qq, kc, vc, ks, vs, block_table, seq_lens, NH, KVH, BS, MB, ns, tps, sc, window, oq, oqs)
#define DEC_MMA_H(H) \
    if (ks) DEC_MMA(H, true); else DEC_MMA(H, false)
#define DEC_VEC(H, R, F)                                                                                              \
    attn_decode_vec_kernel<H, R, F><<<grid, DEC_WARPS * 32, 0, st>>>(o, scratch, qq, kc, vc, ks, vs, block_table,    \
                                                                      seq_lens, NH, KVH, BS, MB, ngroups, ns, tps, sc, window, oq, oqs)
#define DEC_VEC_F(H, R) \
    if (ks) DEC_VEC(H, R, true); else DEC_VEC(H, R, false)
#define DEC_VEC_H(H) \
    if (REP == 2) { DEC_VEC_F(H, 2); } else if (REP == 4) { DEC_VEC_F(H, 4); } else { DEC_VEC_F(H, 8); }
#define DEC_LAUNCH(NP)                                                                                           \
    attn_decode_kernel<NP><<<grid, DEC_WARPS * 32, 0, st>>>(o, scratch, qq, (const bf16 *)kc, (const bf16 *)vc,    \
                                                             block_table, seq_lens, NH, KVH, HD, BS, MB, ngroups, ns, tps, sc, \
                                                             window, oq, oqs)
    if (mma && HD == 64) { DEC_MMA_H(64); }
    else if (mma) { DEC_MMA_H(128); }
    else if (vec && HD == 32) { DEC_VEC_H(32); }
    else if (vec && HD == 64) { DEC_VEC_H(64); }
    else if (vec && HD == 128) { DEC_VEC_H(128); }
    else if (vec && HD == 256) { DEC_VEC_H(256); }
    else if (HD <= 64) DEC_LAUNCH(1);
    else if (HD <= 128) DEC_LAUNCH(2);
    else DEC_LAUNCH(4);
#undef DEC_LAUNCH
#undef DEC_VEC_H
#undef DEC_VEC_F
#undef DEC_VEC
#undef DEC_MMA_H
#undef DEC_MMA
    launchCheck();
    if (ns > 1) {
        attn_decode_combine<<<dim3(NH, S), 128, 0, st>>>(o, scratch, NH, HD, ns, oq, oqs);
        launchCheck();
    }
}
