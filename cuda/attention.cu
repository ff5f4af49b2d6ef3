// attention.cu: the training attention kernels of the CUDA backend (see attention_cuda.h); the decode
// step's attention over the paged KV cache is attention_decode.cu.
//   defines: attention_forward_cuda, attention_backward_cuda, attention_set_hopper, attention_backward_scratch
// Needs: sm_80+ (mma.sync bf16, ldmatrix, cp.async); on sm_90a the kernels for head dims 64 and 128 run
// as wgmma + TMA versions of the same loops (further down, after the mma.sync ones;
// attention_set_hopper(0) leaves them aside). The numeric truth is ops_cpu.c's
// attention_forward_cpu / attention_backward_cpu.
//
// Training attention is FlashAttention-2 written with mma.sync.m16n8k16 (bf16 in, fp32
// accumulate), for head dims 16, 32, 64, 128 and (where a block may have 192 KiB of shared memory) 256:
//   forward     a block owns 64 queries of one (batch, head), 4 warps x 16 rows; it walks the
//               key blocks (64 keys, double-buffered with cp.async) up to the diagonal,
//               S = Q K^T in registers, online softmax (exp2, running max and sum), O += P V
//               with P re-packed from the S accumulators as the A operand. Writes lse.
//   backward    D = rowsum(dO * O) first; then a block owns 64 keys of one (batch, kv head)
//               and loops over the query blocks and the NH/KVH query heads of its group,
//               recomputing P = exp(S - lse): dV += P^T dO, dK += dS^T Q with
//               dS = P (dP - D), dP = dO V^T. dK/dV live in its registers: no atomics.
//               dQ is a second pass where a block owns 64 queries (the forward's shape):
//               it recomputes S and dP and accumulates dQ += dS K. Two passes cost two extra
//               small matmuls per tile but keep the backward deterministic.
// Shared-memory tiles hold rows of HD bf16 in 16-byte chunks, chunk index XOR-swizzled
// with the row (mod 8), so that the 8 row addresses of an ldmatrix hit 8 different bank
// groups (mma_tile.cuh: the tile, the fragments, the PTX; shared with the decode kernel).
// Other even head dims up to 256 (and 256 on GPUs with less shared memory) take plain
// fp32 kernels, one warp per row (slow, correct).
// Sliding windows (window > 0: query t sees keys t - window < s <= t): every kernel masks the keys
// outside (the same condition as the causal one: masked_key), and skips key (or query) blocks that lie
// wholly outside: the forward and dQ loops start at the block of the first query's first key, the dK/dV
// loops stop at the block of the last key's last query.
#include <math.h>

#include "cuda/attention_cuda.h"
#include "cuda/cuda_common.cuh"
#include "cuda/hopper.cuh"
#include "cuda/mma_tile.cuh"

#define LOG2E 1.4426950408889634f
#define FULL 0xffffffffu

// key s is hidden from query t: a later key (causal), or one window or more back (window > 0)
__device__ __forceinline__ bool masked_key(int s, int t, int window) { return s > t || (window > 0 && t - s >= window); }
// the key block (of bc keys) holding the first key that query q0 sees
__device__ __forceinline__ int first_key_block(int q0, int window, int bc) { return window > 0 && q0 >= window ? (q0 - window + 1) / bc : 0; }
// the end (exclusive) of the queries that see some key of the block [k0, k0 + bc)
__device__ __forceinline__ int query_end(int k0, int bc, int T, int window) { return window > 0 ? min(T, k0 + bc + window - 1) : T; }

// rows [r0, r0 + R) of a row-strided (ld elements) bf16 matrix into a tile; rows >= rmax are zeros
template <int HD, int R>
__device__ __forceinline__ void load_rows(bf16 *s, const bf16 *g, size_t ld, int r0, int rmax, int tid) {
    constexpr int CH = HD / 8, TOTAL = R * CH, ITERS = (TOTAL + 127) / 128;
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        int i = it * 128 + tid;
        if (i < TOTAL) {
            int r = i / CH, c = i % CH;
            bool ok = r0 + r < rmax;
            cp_async16(s + toff<HD>(r, c), ok ? g + (size_t)(r0 + r) * ld + c * 8 : g, ok);
        }
    }
}

// Key/value block j is in buffer j & 1 (of Ks, Vs: 2 x BC rows each): start loading block j + 1 into
// the other, then wait until block j has landed and every thread sees it
template <int HD, int BC>
__device__ __forceinline__ void next_kv_block(bf16 *Ks, bf16 *Vs, const bf16 *kg, const bf16 *vg, size_t ldk, int j,
                                              int nkt, int T, int tid) {
    if (j + 1 < nkt) {
        int nb = (j + 1) & 1;
        load_rows<HD, BC>(Ks + nb * BC * HD, kg, ldk, (j + 1) * BC, T, tid);
        load_rows<HD, BC>(Vs + nb * BC * HD, vg, ldk, (j + 1) * BC, T, tid);
        cp_async_commit();
        cp_async_wait<1>();
    } else cp_async_wait<0>();
    __syncthreads();
}

// c1 (16 x 16 NP, as 2 NP n-tiles) += A1 B1^T and c2 += A2 B2^T over the tiles' HD: A1, A2 hold the
// warp's 16 rows from row a0, B1, B2 the 16 NP rows of B^T. The backward's two products of a tile,
// S = Q K^T and dP = dO V^T (or their transposes), sharing each k step's loop.
template <int HD, int NP>
__device__ __forceinline__ void mma_abt2(float (&c1)[2 * NP][4], float (&c2)[2 * NP][4], const bf16 *A1, const bf16 *A2,
                                         int a0, const bf16 *B1, const bf16 *B2) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a1[4], a2[4];
        ldsm4(a1, A1 + toff<HD>(A_ROW(a0), A_CH(kk)));
        ldsm4(a2, A2 + toff<HD>(A_ROW(a0), A_CH(kk)));
#pragma unroll
        for (int np = 0; np < NP; np++) {
            uint32_t bb[4];
            ldsm4(bb, B1 + toff<HD>(BN_ROW(np * 16), BN_CH(kk)));
            mma16816(c1[2 * np], a1, bb[0], bb[1]);
            mma16816(c1[2 * np + 1], a1, bb[2], bb[3]);
            ldsm4(bb, B2 + toff<HD>(BN_ROW(np * 16), BN_CH(kk)));
            mma16816(c2[2 * np], a2, bb[0], bb[1]);
            mma16816(c2[2 * np + 1], a2, bb[2], bb[3]);
        }
    }
}
// ----------------------------------------------------------------------------
// forward (tensor cores)

template <int HD>
__global__ void __launch_bounds__(128) attn_fwd_mma(bf16 *__restrict__ out, float *__restrict__ lse,
                                                    const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                                    const bf16 *__restrict__ v, int T, int NH, int KVH, float sc,
                                                    int window) {
    constexpr int BR = 64, BC = 64, KS = HD / 16, ND = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + BR * HD, *Vs = Ks + 2 * BC * HD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    // the last query blocks have the most keys: they start first (causal_grid)
    const int qt = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, kvh = h / (NH / KVH);
    const int q0 = qt * BR;
    const size_t ldq = (size_t)NH * HD, ldk = (size_t)KVH * HD;
    const bf16 *qg = q + (size_t)b * T * ldq + (size_t)h * HD;
    const bf16 *kg = k + (size_t)b * T * ldk + (size_t)kvh * HD, *vg = v + (size_t)b * T * ldk + (size_t)kvh * HD;
    const int j0 = first_key_block(q0, window, BC);   // key blocks from the window's start (0: no window)
    load_rows<HD, BR>(Qs, qg, ldq, q0, T, tid);
    load_rows<HD, BC>(Ks + (j0 & 1) * BC * HD, kg, ldk, j0 * BC, T, tid);
    load_rows<HD, BC>(Vs + (j0 & 1) * BC * HD, vg, ldk, j0 * BC, T, tid);
    cp_async_commit();
    const int nkt = (min(q0 + BR, T) + BC - 1) / BC;  // causal: key blocks up to the diagonal
    const float sl2 = sc * LOG2E;
    const int row0 = q0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    float o[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    // the warp's Q fragments stay in registers across the key blocks, up to HD 128; at 256 they would
    // not fit beside O's accumulators, and are read from shared memory at each use instead
    constexpr bool QREG = HD <= 128;
    uint32_t qf[QREG ? KS : 1][4];
    for (int j = j0; j < nkt; j++) {
        next_kv_block<HD, BC>(Ks, Vs, kg, vg, ldk, j, nkt, T, tid);
        if (QREG && j == j0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++) ldsm4(qf[QREG ? kk : 0], Qs + toff<HD>(A_ROW(warp * 16), A_CH(kk)));
        }
        const bf16 *Kb = Ks + (j & 1) * BC * HD, *Vb = Vs + (j & 1) * BC * HD;
        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            const int fk = QREG ? kk : 0;
            if (!QREG) ldsm4(qf[0], Qs + toff<HD>(A_ROW(warp * 16), A_CH(kk)));
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                ldsm4(bb, Kb + toff<HD>(BN_ROW(np * 16), BN_CH(kk)));
                mma16816(s[2 * np], qf[fk], bb[0], bb[1]);
                mma16816(s[2 * np + 1], qf[fk], bb[2], bb[3]);
            }
        }
        const int kb = j * BC;
        if (kb + BC - 1 > q0 + warp * 16 || window > 0) {  // the diagonal block (and a window): mask
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (masked_key(kb + nt * 8 + 2 * t4 + (e & 1), row0 + (e >> 1) * 8, window)) s[nt][e] = -INFINITY;
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
            float mnew = fmaxf(mrow[r], mx);
            float mb = mnew == -INFINITY ? 0.f : mnew * sl2;
            float alpha = exp2f(mrow[r] * sl2 - mb), rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                float p0 = exp2f(s[nt][2 * r] * sl2 - mb), p1 = exp2f(s[nt][2 * r + 1] * sl2 - mb);
                s[nt][2 * r] = p0;
                s[nt][2 * r + 1] = p1;
                rs += p0 + p1;
            }
            lrow[r] = lrow[r] * alpha + rs;
            mrow[r] = mnew;
#pragma unroll
            for (int nd = 0; nd < ND; nd++) {
                o[nd][2 * r] *= alpha;
                o[nd][2 * r + 1] *= alpha;
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t a[4];
            c_to_a(a, s[2 * kk], s[2 * kk + 1]);
            mma_ab_rows<HD>(o, a, Vb, kk * 16);
        }
        __syncthreads();  // the buffer is refilled next iteration
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(FULL, l, 1);
        l += __shfl_xor_sync(FULL, l, 2);
        int row = row0 + r * 8;
        float inv = l > 0.f ? 1.f / l : 0.f;
        if (row < T) {
            bf16 *op = out + ((size_t)b * T + row) * ldq + (size_t)h * HD + 2 * t4;
#pragma unroll
            for (int nd = 0; nd < ND; nd++)
                *(__nv_bfloat162 *)(op + nd * 8) = __floats2bfloat162_rn(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
            if (t4 == 0) lse[((size_t)b * NH + h) * T + row] = mrow[r] * sc + logf(l);
        }
    }
}

// ----------------------------------------------------------------------------
// forward on Hopper (sm_90a): the same algorithm with wgmma
//
// mma.sync keeps a warp's tensor-core work in flight only as far as its own registers and issue
// slots allow (the kernel above holds so many registers a thread that few warps share an SM, and
// they wait on their own products); wgmma is asynchronous and reads its operands from shared memory
// through descriptors, a warpgroup (4 warps) multiplying 64 rows at a time. A block: 2 warpgroups x 64 queries (BR 128) of one
// (batch, head); thread 0 streams the key and value blocks (64 keys) by TMA into two buffers,
// each guarded by an mbarrier, one block ahead. Per key block, per warpgroup:
//   S (64 x 64 fp32) = Q K^T        wgmma.m64n64k16, Q and K K-major (head dim contiguous)
//   online softmax on S in registers, the same arithmetic as the kernel above
//   O (64 x HD fp32) += P V         wgmma.m64nHDk16, P from registers (the accumulator layout of S
//                                   is the register A operand's, once packed to bf16), V from
//                                   shared memory MN-major (its rows are keys: the reduction)
// Tiles are stored as TMA's 128-byte swizzle writes them: panels of 64 bf16 columns (hopper.cuh).
template <int HD>
__global__ void __launch_bounds__(256) attn_fwd_wgmma(bf16 *__restrict__ out, float *__restrict__ lse,
                                                      const __grid_constant__ CUtensorMap tq,
                                                      const __grid_constant__ CUtensorMap tk,
                                                      const __grid_constant__ CUtensorMap tv, int T, int NH, int KVH,
                                                      float sc, int window) {
#ifdef FP8_SM90A
    constexpr int BR = 128, BC = 64, NP = HD / 64, PANEL = 64 * 128, TILE = NP * PANEL;  // bytes
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char *Qs = sm, *Ks = Qs + 2 * TILE, *Vs = Ks + 2 * TILE;  // Q per warpgroup; K, V per buffer
    uint64_t *full = (uint64_t *)(Vs + 2 * TILE);
    const int wg = threadIdx.x >> 7, t = threadIdx.x & 127, wi = t >> 5, lane = t & 31, g = lane >> 2, t4 = lane & 3;
    const int qt = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, kvh = h / (NH / KVH);
    const int q0 = qt * BR, wrow0 = q0 + 64 * wg;  // the block's and the warpgroup's first query
    const int nkt = (min(q0 + BR, T) + BC - 1) / BC;  // causal: key blocks up to the block's diagonal
    const int j0 = first_key_block(q0, window, BC);   // from the window's first (0: no window); step i = j - j0
    if (threadIdx.x == 0) {
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        mbar_fence_init();
        mbar_expect_tx(&full[0], 4 * TILE);  // Q (2 warpgroups), K and V of block j0
        for (int w = 0; w < 2; w++)
            for (int p = 0; p < NP; p++) tma_load_2d(Qs + w * TILE + p * PANEL, &tq, &full[0], h * HD + 64 * p, b * T + q0 + 64 * w);
        for (int p = 0; p < NP; p++) {
            tma_load_2d(Ks + p * PANEL, &tk, &full[0], kvh * HD + 64 * p, b * T + j0 * BC);
            tma_load_2d(Vs + p * PANEL, &tv, &full[0], kvh * HD + 64 * p, b * T + j0 * BC);
        }
    }
    __syncthreads();
    const float sl2 = sc * LOG2E;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
    const int row_a = wrow0 + 16 * wi + g;  // this thread's rows: row_a and row_a + 8
    for (int j = j0; j < nkt; j++) {
        const int i = j - j0, buf = i & 1, kb = j * BC;
        if (threadIdx.x == 0 && j + 1 < nkt) {  // the next block into the other buffer (free since the last barrier)
            const int nb = buf ^ 1;
            mbar_expect_tx(&full[nb], 2 * TILE);
            for (int p = 0; p < NP; p++) {
                tma_load_2d(Ks + nb * TILE + p * PANEL, &tk, &full[nb], kvh * HD + 64 * p, b * T + kb + BC);
                tma_load_2d(Vs + nb * TILE + p * PANEL, &tv, &full[nb], kvh * HD + 64 * p, b * T + kb + BC);
            }
        }
        mbar_wait(&full[buf], (i >> 1) & 1);
        // else every key of the block comes after this warpgroup's queries, or (a window) before all they see
        if (kb <= wrow0 + 63 && !(window > 0 && kb + BC - 1 <= wrow0 - window)) {
            float s[32];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint64_t da = wg_desc(Qs + wg * TILE + (kk / 4) * PANEL) + 2 * (kk % 4);
                uint64_t db = wg_desc(Ks + buf * TILE + (kk / 4) * PANEL) + 2 * (kk % 4);
                wgmma_m64n64k16_bf16(s, da, db, kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(s);
            if (kb + BC - 1 > wrow0 || window > 0) {  // a block on the diagonal (and a window): mask
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (masked_key(kb + 8 * i + 2 * t4 + (e & 1), row_a + 8 * (e >> 1), window)) s[4 * i + e] = -INFINITY;
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int i = 0; i < 8; i++) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
                float mnew = fmaxf(mrow[r], mx);
                float mb = mnew == -INFINITY ? 0.f : mnew * sl2;
                float alpha = exp2f(mrow[r] * sl2 - mb), rs = 0.f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float p0 = exp2f(s[4 * i + 2 * r] * sl2 - mb), p1 = exp2f(s[4 * i + 2 * r + 1] * sl2 - mb);
                    s[4 * i + 2 * r] = p0;
                    s[4 * i + 2 * r + 1] = p1;
                    rs += p0 + p1;
                }
                lrow[r] = lrow[r] * alpha + rs;
                mrow[r] = mnew;
#pragma unroll
                for (int i = 0; i < HD / 8; i++) {
                    o[4 * i + 2 * r] *= alpha;
                    o[4 * i + 2 * r + 1] *= alpha;
                }
            }
            wgmma_fence();  // o was rescaled in registers: order that before the wgmmas read it
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t a[4] = {pack_bf16(s[8 * kk], s[8 * kk + 1]), pack_bf16(s[8 * kk + 2], s[8 * kk + 3]),
                                 pack_bf16(s[8 * kk + 4], s[8 * kk + 5]), pack_bf16(s[8 * kk + 6], s[8 * kk + 7])};
                uint64_t dv = wg_desc_mn(Vs + buf * TILE + kk * 2048, PANEL);
                if constexpr (HD == 128) wgmma_m64n128k16_bf16_rs(o, a, dv);
                else wgmma_m64n64k16_bf16_rs(o, a, dv);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(o);
        }
        __syncthreads();  // both warpgroups are done with this buffer: it is refilled next iteration
    }
    const size_t ldq = (size_t)NH * HD;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(FULL, l, 1);
        l += __shfl_xor_sync(FULL, l, 2);
        int row = row_a + 8 * r;
        float inv = l > 0.f ? 1.f / l : 0.f;
        if (row < T) {
            bf16 *op = out + ((size_t)b * T + row) * ldq + (size_t)h * HD + 2 * t4;
#pragma unroll
            for (int i = 0; i < HD / 8; i++)
                *(__nv_bfloat162 *)(op + 8 * i) = __floats2bfloat162_rn(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
            if (t4 == 0) lse[((size_t)b * NH + h) * T + row] = mrow[r] * sc + logf(l);
        }
    }
#endif
}

// ----------------------------------------------------------------------------
// backward (tensor cores)

// D[b, h, t] = sum_d dO * O (fp32), one warp per (b, t, h) row
__global__ void attn_rowdot(float *D, const bf16 *dout, const bf16 *out, int B, int T, int NH, int HD) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= (size_t)B * T * NH) return;
    const bf16 *a = dout + row * HD, *o = out + row * HD;
    float s = 0.f;
    for (int d = 2 * lane; d < HD; d += 64) {
        float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)(a + d)), y = __bfloat1622float2(*(const __nv_bfloat162 *)(o + d));
        s += x.x * y.x + x.y * y.y;
    }
    s = warp_sum(s);
    int h = (int)(row % NH);
    size_t bt = row / NH;
    int t = (int)(bt % T), b = (int)(bt / T);
    if (lane == 0) D[((size_t)b * NH + h) * T + t] = s;
}

// dK, dV for 64 keys of one (b, kv head): 4 warps x 16 keys, 32 queries per step over the
// NH/KVH query heads of the group and the query blocks at or after the keys (causal)
template <int HD>
__global__ void __launch_bounds__(128) attn_bwd_dkdv_mma(bf16 *__restrict__ dk, bf16 *__restrict__ dv,
                                                         const bf16 *__restrict__ dout, const float *__restrict__ lse,
                                                         const float *__restrict__ Dg, const bf16 *__restrict__ q,
                                                         const bf16 *__restrict__ k, const bf16 *__restrict__ v, int T,
                                                         int NH, int KVH, float sc, int window) {
    constexpr int BC = 64, BQ = 32, ND = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + BC * HD, *Qs = Vs + BC * HD, *dOs = Qs + 2 * BQ * HD;
    float *Ls = (float *)(dOs + 2 * BQ * HD), *Ds = Ls + 2 * BQ;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int kvh = blockIdx.x, b = blockIdx.y, rep = NH / KVH, k0 = blockIdx.z * BC;
    const size_t ldq = (size_t)NH * HD, ldk = (size_t)KVH * HD;
    const bf16 *kg = k + (size_t)b * T * ldk + (size_t)kvh * HD, *vg = v + (size_t)b * T * ldk + (size_t)kvh * HD;
    load_rows<HD, BC>(Ks, kg, ldk, k0, T, tid);
    load_rows<HD, BC>(Vs, vg, ldk, k0, T, tid);
    const int nq = (query_end(k0, BC, T, window) - k0 + BQ - 1) / BQ, items = rep * nq;
    auto load_item = [&](int it, int buf) {
        int h = kvh * rep + it / nq, qb = k0 + (it % nq) * BQ;
        load_rows<HD, BQ>(Qs + buf * BQ * HD, q + (size_t)b * T * ldq + (size_t)h * HD, ldq, qb, T, tid);
        load_rows<HD, BQ>(dOs + buf * BQ * HD, dout + (size_t)b * T * ldq + (size_t)h * HD, ldq, qb, T, tid);
        if (tid < BQ) {
            int t = qb + tid;
            size_t li = ((size_t)b * NH + h) * T + t;
            Ls[buf * BQ + tid] = t < T ? lse[li] * LOG2E : INFINITY;  // +inf: P = 0 for padding rows
            Ds[buf * BQ + tid] = t < T ? Dg[li] : 0.f;
        }
    };
    load_item(0, 0);
    cp_async_commit();
    const float sl2 = sc * LOG2E;
    const int key0 = k0 + warp * 16 + g;  // this thread's keys: key0, key0 + 8
    float dka[ND][4], dva[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;
    for (int it = 0; it < items; it++) {
        const int buf = it & 1;
        if (it + 1 < items) {
            load_item(it + 1, buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else cp_async_wait<0>();
        __syncthreads();
        const int qb = k0 + (it % nq) * BQ;
        const bf16 *Qb = Qs + buf * BQ * HD, *dOb = dOs + buf * BQ * HD;
        const float *Lb = Ls + buf * BQ, *Db = Ds + buf * BQ;
        float st[4][4], dp[4][4];  // S^T and dP^T: 16 keys x 32 queries per warp
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[i][e] = dp[i][e] = 0.f;
        mma_abt2<HD, 2>(st, dp, Ks, Vs, warp * 16, Qb, dOb);
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qq = nt * 8 + 2 * t4 + (e & 1);
                float p = masked_key(key0 + (e >> 1) * 8, qb + qq, window) ? 0.f : exp2f(st[nt][e] * sl2 - Lb[qq]);
                st[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - Db[qq]);
            }
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t pa[4], da[4];
            c_to_a(pa, st[2 * kk], st[2 * kk + 1]);
            c_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
            mma_ab_rows<HD>(dva, pa, dOb, kk * 16);  // dV += P^T dO
            mma_ab_rows<HD>(dka, da, Qb, kk * 16);   // dK += dS^T Q
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = key0 + r * 8;
        if (key >= T) continue;
        size_t off = ((size_t)b * T + key) * ldk + (size_t)kvh * HD + 2 * t4;
#pragma unroll
        for (int nd = 0; nd < ND; nd++) {
            *(__nv_bfloat162 *)(dk + off + nd * 8) = __floats2bfloat162_rn(dka[nd][2 * r] * sc, dka[nd][2 * r + 1] * sc);
            *(__nv_bfloat162 *)(dv + off + nd * 8) = __floats2bfloat162_rn(dva[nd][2 * r], dva[nd][2 * r + 1]);
        }
    }
}

// dQ for 64 queries of one (b, head): the forward's loop with S and dP recomputed
template <int HD>
__global__ void __launch_bounds__(128) attn_bwd_dq_mma(bf16 *__restrict__ dq, const bf16 *__restrict__ dout,
                                                       const float *__restrict__ lse, const float *__restrict__ Dg,
                                                       const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                                       const bf16 *__restrict__ v, int T, int NH, int KVH, float sc,
                                                       int window) {
    constexpr int BR = 64, BC = 64, ND = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + BR * HD, *Ks = dOs + BR * HD, *Vs = Ks + 2 * BC * HD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int qt = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, kvh = h / (NH / KVH);
    const int q0 = qt * BR;
    const size_t ldq = (size_t)NH * HD, ldk = (size_t)KVH * HD;
    const bf16 *kg = k + (size_t)b * T * ldk + (size_t)kvh * HD, *vg = v + (size_t)b * T * ldk + (size_t)kvh * HD;
    load_rows<HD, BR>(Qs, q + (size_t)b * T * ldq + (size_t)h * HD, ldq, q0, T, tid);
    load_rows<HD, BR>(dOs, dout + (size_t)b * T * ldq + (size_t)h * HD, ldq, q0, T, tid);
    const int j0 = first_key_block(q0, window, BC);
    load_rows<HD, BC>(Ks + (j0 & 1) * BC * HD, kg, ldk, j0 * BC, T, tid);
    load_rows<HD, BC>(Vs + (j0 & 1) * BC * HD, vg, ldk, j0 * BC, T, tid);
    cp_async_commit();
    const int row0 = q0 + warp * 16 + g;
    float Lr[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + r * 8;
        size_t li = ((size_t)b * NH + h) * T + row;
        Lr[r] = row < T ? lse[li] * LOG2E : INFINITY;
        Dr[r] = row < T ? Dg[li] : 0.f;
    }
    const int nkt = (min(q0 + BR, T) + BC - 1) / BC;
    const float sl2 = sc * LOG2E;
    float dqa[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.f;
    for (int j = j0; j < nkt; j++) {
        next_kv_block<HD, BC>(Ks, Vs, kg, vg, ldk, j, nkt, T, tid);
        const bf16 *Kb = Ks + (j & 1) * BC * HD, *Vb = Vs + (j & 1) * BC * HD;
        float s[8][4], dp[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
        mma_abt2<HD, 4>(s, dp, Qs, dOs, warp * 16, Kb, Vb);
        const int kb = j * BC;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1;
                float p = masked_key(kb + nt * 8 + 2 * t4 + (e & 1), row0 + r * 8, window) ? 0.f : exp2f(s[nt][e] * sl2 - Lr[r]);
                s[nt][e] = p * (dp[nt][e] - Dr[r]);  // dS
            }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t a[4];
            c_to_a(a, s[2 * kk], s[2 * kk + 1]);
            mma_ab_rows<HD>(dqa, a, Kb, kk * 16);  // dQ += dS K
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + r * 8;
        if (row >= T) continue;
        bf16 *op = dq + ((size_t)b * T + row) * ldq + (size_t)h * HD + 2 * t4;
#pragma unroll
        for (int nd = 0; nd < ND; nd++)
            *(__nv_bfloat162 *)(op + nd * 8) = __floats2bfloat162_rn(dqa[nd][2 * r] * sc, dqa[nd][2 * r + 1] * sc);
    }
}

// ----------------------------------------------------------------------------
// backward on Hopper (sm_90a): the two kernels above with wgmma, fed by TMA as the forward is.
// Every product maps onto wgmma as the forward's do: the ones reducing over the head dim read both
// operands K-major from shared memory (S = Q K^T, dP = dO V^T and their transposes); the ones
// reducing over queries or keys take P, dS (or their transposes) from registers as A and read the
// other operand MN-major (dV += P^T dO, dK += dS^T Q, dQ += dS K).

// dQ for 128 queries of one (b, head), 2 warpgroups x 64: S and dP recomputed per key block
template <int HD>
__global__ void __launch_bounds__(256) attn_bwd_dq_wgmma(bf16 *__restrict__ dq, const float *__restrict__ lse,
                                                         const float *__restrict__ Dg, const __grid_constant__ CUtensorMap tq,
                                                         const __grid_constant__ CUtensorMap tdo,
                                                         const __grid_constant__ CUtensorMap tk,
                                                         const __grid_constant__ CUtensorMap tv, int T, int NH, int KVH,
                                                         float sc, int window) {
#ifdef FP8_SM90A
    constexpr int BR = 128, BC = 64, NP = HD / 64, PANEL = 64 * 128, TILE = NP * PANEL;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char *Qs = sm, *dOs = Qs + 2 * TILE, *Ks = dOs + 2 * TILE, *Vs = Ks + 2 * TILE;
    uint64_t *full = (uint64_t *)(Vs + 2 * TILE);
    const int wg = threadIdx.x >> 7, t = threadIdx.x & 127, wi = t >> 5, lane = t & 31, g = lane >> 2, t4 = lane & 3;
    const int qt = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, kvh = h / (NH / KVH);
    const int q0 = qt * BR, wrow0 = q0 + 64 * wg;
    const int nkt = (min(q0 + BR, T) + BC - 1) / BC, j0 = first_key_block(q0, window, BC);  // step i = j - j0
    if (threadIdx.x == 0) {
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        mbar_fence_init();
        mbar_expect_tx(&full[0], 6 * TILE);  // Q and dO (2 warpgroups), K and V of block j0
        for (int w = 0; w < 2; w++)
            for (int p = 0; p < NP; p++) {
                tma_load_2d(Qs + w * TILE + p * PANEL, &tq, &full[0], h * HD + 64 * p, b * T + q0 + 64 * w);
                tma_load_2d(dOs + w * TILE + p * PANEL, &tdo, &full[0], h * HD + 64 * p, b * T + q0 + 64 * w);
            }
        for (int p = 0; p < NP; p++) {
            tma_load_2d(Ks + p * PANEL, &tk, &full[0], kvh * HD + 64 * p, b * T + j0 * BC);
            tma_load_2d(Vs + p * PANEL, &tv, &full[0], kvh * HD + 64 * p, b * T + j0 * BC);
        }
    }
    __syncthreads();
    const int row_a = wrow0 + 16 * wi + g;
    float Lr[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row_a + 8 * r;
        size_t li = ((size_t)b * NH + h) * T + row;
        Lr[r] = row < T ? lse[li] * LOG2E : INFINITY;
        Dr[r] = row < T ? Dg[li] : 0.f;
    }
    const float sl2 = sc * LOG2E;
    float acc[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) acc[i] = 0.f;
    for (int j = j0; j < nkt; j++) {
        const int buf = (j - j0) & 1, kb = j * BC;
        if (threadIdx.x == 0 && j + 1 < nkt) {
            const int nb = buf ^ 1;
            mbar_expect_tx(&full[nb], 2 * TILE);
            for (int p = 0; p < NP; p++) {
                tma_load_2d(Ks + nb * TILE + p * PANEL, &tk, &full[nb], kvh * HD + 64 * p, b * T + kb + BC);
                tma_load_2d(Vs + nb * TILE + p * PANEL, &tv, &full[nb], kvh * HD + 64 * p, b * T + kb + BC);
            }
        }
        mbar_wait(&full[buf], ((j - j0) >> 1) & 1);
        {  // every warpgroup multiplies every block (one past its diagonal is all masked, P = 0): a
           // branch on the warpgroup would make ptxas serialize the wgmmas
            float s[32], dp[32];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t off = (kk / 4) * PANEL;
                wgmma_m64n64k16_bf16(s, wg_desc(Qs + wg * TILE + off) + 2 * (kk % 4), wg_desc(Ks + buf * TILE + off) + 2 * (kk % 4), kk > 0);
                wgmma_m64n64k16_bf16(dp, wg_desc(dOs + wg * TILE + off) + 2 * (kk % 4), wg_desc(Vs + buf * TILE + off) + 2 * (kk % 4), kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(s);
            fence_regs(dp);
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = e >> 1;
                    float p = masked_key(kb + 8 * i + 2 * t4 + (e & 1), row_a + 8 * r, window) ? 0.f : exp2f(s[4 * i + e] * sl2 - Lr[r]);
                    s[4 * i + e] = p * (dp[4 * i + e] - Dr[r]);  // dS
                }
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {  // dQ += dS K
                uint32_t a[4] = {pack_bf16(s[8 * kk], s[8 * kk + 1]), pack_bf16(s[8 * kk + 2], s[8 * kk + 3]),
                                 pack_bf16(s[8 * kk + 4], s[8 * kk + 5]), pack_bf16(s[8 * kk + 6], s[8 * kk + 7])};
                uint64_t dk_ = wg_desc_mn(Ks + buf * TILE + kk * 2048, PANEL);
                if constexpr (HD == 128) wgmma_m64n128k16_bf16_rs(acc, a, dk_);
                else wgmma_m64n64k16_bf16_rs(acc, a, dk_);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(acc);
        }
        __syncthreads();
    }
    const size_t ldq = (size_t)NH * HD;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row_a + 8 * r;
        if (row >= T) continue;
        bf16 *op = dq + ((size_t)b * T + row) * ldq + (size_t)h * HD + 2 * t4;
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
            *(__nv_bfloat162 *)(op + 8 * i) = __floats2bfloat162_rn(acc[4 * i + 2 * r] * sc, acc[4 * i + 2 * r + 1] * sc);
    }
#endif
}

// dK, dV for 128 keys of one (b, kv head), 2 warpgroups x 64 keys: blocks of 64 queries over the
// NH/KVH query heads of the group, from the first query at or after the keys (causal); Q, dO and the
// blocks' lse and D double-buffered
template <int HD>
__global__ void __launch_bounds__(256) attn_bwd_dkdv_wgmma(bf16 *__restrict__ dk, bf16 *__restrict__ dv,
                                                           const float *__restrict__ lse, const float *__restrict__ Dg,
                                                           const __grid_constant__ CUtensorMap tq,
                                                           const __grid_constant__ CUtensorMap tdo,
                                                           const __grid_constant__ CUtensorMap tk,
                                                           const __grid_constant__ CUtensorMap tv, int T, int NH, int KVH,
                                                           float sc, int window) {
#ifdef FP8_SM90A
    constexpr int BKEY = 128, BQ = 64, NP = HD / 64, PANEL = 64 * 128, TILE = NP * PANEL;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char *Ks = sm, *Vs = Ks + 2 * TILE, *Qs = Vs + 2 * TILE, *dOs = Qs + 2 * TILE;  // K, V per warpgroup; Q, dO per buffer
    float *Ls = (float *)(dOs + 2 * TILE), *Ds = Ls + 2 * BQ;
    uint64_t *full = (uint64_t *)(Ds + 2 * BQ);
    const int wg = threadIdx.x >> 7, t = threadIdx.x & 127, wi = t >> 5, lane = t & 31, g = lane >> 2, t4 = lane & 3;
    const int kvh = blockIdx.x, b = blockIdx.y, rep = NH / KVH, k0 = blockIdx.z * BKEY, wk0 = k0 + 64 * wg;
    const int nq = (query_end(k0, BKEY, T, window) - k0 + BQ - 1) / BQ, items = rep * nq;
    auto issue = [&](int it, int bf) {  // thread 0: Q and dO of item it into buffer bf
        int h = kvh * rep + it / nq, qb = k0 + (it % nq) * BQ;
        mbar_expect_tx(&full[bf], 2 * TILE);
        for (int p = 0; p < NP; p++) {
            tma_load_2d(Qs + bf * TILE + p * PANEL, &tq, &full[bf], h * HD + 64 * p, b * T + qb);
            tma_load_2d(dOs + bf * TILE + p * PANEL, &tdo, &full[bf], h * HD + 64 * p, b * T + qb);
        }
    };
    auto load_ld = [&](int it, int bf) {  // threads 0..63: the item's lse (log2 units) and D
        if (threadIdx.x < BQ) {
            int h = kvh * rep + it / nq, q = k0 + (it % nq) * BQ + threadIdx.x;
            size_t li = ((size_t)b * NH + h) * T + q;
            Ls[bf * BQ + threadIdx.x] = q < T ? lse[li] * LOG2E : INFINITY;  // +inf: P = 0 for padding rows
            Ds[bf * BQ + threadIdx.x] = q < T ? Dg[li] : 0.f;
        }
    };
    if (threadIdx.x == 0) {
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        mbar_init(&full[2], 1);
        mbar_fence_init();
        mbar_expect_tx(&full[2], 4 * TILE);  // K and V of the block's keys
        for (int w = 0; w < 2; w++)
            for (int p = 0; p < NP; p++) {
                tma_load_2d(Ks + w * TILE + p * PANEL, &tk, &full[2], kvh * HD + 64 * p, b * T + k0 + 64 * w);
                tma_load_2d(Vs + w * TILE + p * PANEL, &tv, &full[2], kvh * HD + 64 * p, b * T + k0 + 64 * w);
            }
        issue(0, 0);
    }
    load_ld(0, 0);
    __syncthreads();
    mbar_wait(&full[2], 0);
    const float sl2 = sc * LOG2E;
    const int key_a = wk0 + 16 * wi + g;  // this thread's keys: key_a and key_a + 8
    float dka[HD / 2], dva[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dka[i] = dva[i] = 0.f;
    for (int it = 0; it < items; it++) {
        const int buf = it & 1, qb = k0 + (it % nq) * BQ;
        if (it + 1 < items) {
            if (threadIdx.x == 0) issue(it + 1, buf ^ 1);
            load_ld(it + 1, buf ^ 1);
        }
        mbar_wait(&full[buf], (it >> 1) & 1);
        {  // every warpgroup, as in the dQ kernel (its first block may be all masked: P = 0)
            const float *Lb = Ls + buf * BQ, *Db = Ds + buf * BQ;
            float st[32], dpt[32];  // S^T and dP^T: 64 keys x 64 queries
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t off = (kk / 4) * PANEL;
                wgmma_m64n64k16_bf16(st, wg_desc(Ks + wg * TILE + off) + 2 * (kk % 4), wg_desc(Qs + buf * TILE + off) + 2 * (kk % 4), kk > 0);
                wgmma_m64n64k16_bf16(dpt, wg_desc(Vs + wg * TILE + off) + 2 * (kk % 4), wg_desc(dOs + buf * TILE + off) + 2 * (kk % 4), kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(st);
            fence_regs(dpt);
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qq = 8 * i + 2 * t4 + (e & 1);
                    float p = masked_key(key_a + 8 * (e >> 1), qb + qq, window) ? 0.f : exp2f(st[4 * i + e] * sl2 - Lb[qq]);
                    st[4 * i + e] = p;
                    dpt[4 * i + e] = p * (dpt[4 * i + e] - Db[qq]);  // dS^T
                }
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                uint32_t pa[4] = {pack_bf16(st[8 * kk], st[8 * kk + 1]), pack_bf16(st[8 * kk + 2], st[8 * kk + 3]),
                                  pack_bf16(st[8 * kk + 4], st[8 * kk + 5]), pack_bf16(st[8 * kk + 6], st[8 * kk + 7])};
                uint32_t da[4] = {pack_bf16(dpt[8 * kk], dpt[8 * kk + 1]), pack_bf16(dpt[8 * kk + 2], dpt[8 * kk + 3]),
                                  pack_bf16(dpt[8 * kk + 4], dpt[8 * kk + 5]), pack_bf16(dpt[8 * kk + 6], dpt[8 * kk + 7])};
                uint64_t ddo = wg_desc_mn(dOs + buf * TILE + kk * 2048, PANEL), dq_ = wg_desc_mn(Qs + buf * TILE + kk * 2048, PANEL);
                if constexpr (HD == 128) {
                    wgmma_m64n128k16_bf16_rs(dva, pa, ddo);  // dV += P^T dO
                    wgmma_m64n128k16_bf16_rs(dka, da, dq_);  // dK += dS^T Q
                } else {
                    wgmma_m64n64k16_bf16_rs(dva, pa, ddo);
                    wgmma_m64n64k16_bf16_rs(dka, da, dq_);
                }
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(dva);
            fence_regs(dka);
        }
        __syncthreads();  // Q, dO, lse and D of this buffer are refilled next iteration
    }
    const size_t ldk = (size_t)KVH * HD;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = key_a + 8 * r;
        if (key >= T) continue;
        size_t off = ((size_t)b * T + key) * ldk + (size_t)kvh * HD + 2 * t4;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            *(__nv_bfloat162 *)(dk + off + 8 * i) = __floats2bfloat162_rn(dka[4 * i + 2 * r] * sc, dka[4 * i + 2 * r + 1] * sc);
            *(__nv_bfloat162 *)(dv + off + 8 * i) = __floats2bfloat162_rn(dva[4 * i + 2 * r], dva[4 * i + 2 * r + 1]);
        }
    }
#endif
}

// ----------------------------------------------------------------------------
// plain fp32 kernels for other even head dims (<= 256): one warp per row, keys in
// groups of 32 (one per lane), each lane holding head-dim elements lane + 32 i

#define SIMPLE_MAXD 256
__device__ __forceinline__ float dot_sf(const float *a, const bf16 *b, int HD) {
    float s = 0.f;
    for (int d = 0; d < HD; d++) s += a[d] * __bfloat162float(b[d]);
    return s;
}

__global__ void attn_fwd_simple(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T, int NH,
                                int KVH, int HD, float sc, int window) {
    __shared__ float qs[SIMPLE_MAXD];
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x, kvh = h / (NH / KVH);
    const bf16 *qr = q + (((size_t)b * T + t) * NH + h) * HD;
    for (int d = lane; d < HD; d += 32) qs[d] = __bfloat162float(qr[d]);
    __syncwarp();
    float m = -INFINITY, l = 0.f, acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.f;
    for (int s0 = window > 0 ? max(0, t - window + 1) : 0; s0 <= t; s0 += 32) {  // the keys query t sees
        int s = s0 + lane;
        float sco = s <= t ? dot_sf(qs, k + (((size_t)b * T + s) * KVH + kvh) * HD, HD) * sc : -INFINITY;
        float mnew = fmaxf(m, warp_max(sco));
        float alpha = expf(m - mnew), p = s <= t ? expf(sco - mnew) : 0.f;
        l = l * alpha + warp_sum(p);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] *= alpha;
        int nj = min(32, t - s0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            float pj = __shfl_sync(FULL, p, jj);
            const bf16 *vr = v + (((size_t)b * T + s0 + jj) * KVH + kvh) * HD;
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (lane + 32 * i < HD) acc[i] += pj * __bfloat162float(vr[lane + 32 * i]);
        }
        m = mnew;
    }
    bf16 *orow = out + (((size_t)b * T + t) * NH + h) * HD;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (lane + 32 * i < HD) orow[lane + 32 * i] = __float2bfloat16_rn(acc[i] / l);
    if (lane == 0) lse[((size_t)b * NH + h) * T + t] = m + logf(l);
}

__global__ void attn_bwd_dq_simple(bf16 *dq, const bf16 *dout, const float *lse, const float *Dg, const bf16 *q,
                                   const bf16 *k, const bf16 *v, int T, int NH, int KVH, int HD, float sc, int window) {
    __shared__ float qs[SIMPLE_MAXD], dos[SIMPLE_MAXD];
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x, kvh = h / (NH / KVH);
    size_t row = ((size_t)b * T + t) * NH + h;
    for (int d = lane; d < HD; d += 32) {
        qs[d] = __bfloat162float(q[row * HD + d]);
        dos[d] = __bfloat162float(dout[row * HD + d]);
    }
    __syncwarp();
    float L = lse[((size_t)b * NH + h) * T + t], Dt = Dg[((size_t)b * NH + h) * T + t], acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.f;
    for (int s0 = window > 0 ? max(0, t - window + 1) : 0; s0 <= t; s0 += 32) {
        int s = s0 + lane;
        float ds = 0.f;
        if (s <= t) {
            size_t kr = (((size_t)b * T + s) * KVH + kvh) * HD;
            float p = expf(dot_sf(qs, k + kr, HD) * sc - L);
            ds = p * (dot_sf(dos, v + kr, HD) - Dt);
        }
        int nj = min(32, t - s0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            float dsj = __shfl_sync(FULL, ds, jj);
            const bf16 *kr = k + (((size_t)b * T + s0 + jj) * KVH + kvh) * HD;
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (lane + 32 * i < HD) acc[i] += dsj * __bfloat162float(kr[lane + 32 * i]);
        }
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (lane + 32 * i < HD) dq[row * HD + lane + 32 * i] = __float2bfloat16_rn(acc[i] * sc);
}

__global__ void attn_bwd_dkdv_simple(bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *Dg,
                                     const bf16 *q, const bf16 *k, const bf16 *v, int T, int NH, int KVH, int HD,
                                     float sc, int window) {
    __shared__ float ks[SIMPLE_MAXD], vs[SIMPLE_MAXD];
    const int s = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, lane = threadIdx.x, rep = NH / KVH;
    const int te = window > 0 ? min(T, s + window) : T;  // the queries that see key s
    size_t krow = ((size_t)b * T + s) * KVH + kvh;
    for (int d = lane; d < HD; d += 32) {
        ks[d] = __bfloat162float(k[krow * HD + d]);
        vs[d] = __bfloat162float(v[krow * HD + d]);
    }
    __syncwarp();
    float dka[8], dva[8];
#pragma unroll
    for (int i = 0; i < 8; i++) dka[i] = dva[i] = 0.f;
    for (int h = kvh * rep; h < (kvh + 1) * rep; h++)
        for (int t0 = s; t0 < te; t0 += 32) {
            int t = t0 + lane;
            float p = 0.f, ds = 0.f;
            if (t < te) {
                size_t qr = (((size_t)b * T + t) * NH + h) * HD, li = ((size_t)b * NH + h) * T + t;
                p = expf(dot_sf(ks, q + qr, HD) * sc - lse[li]);
                ds = p * (dot_sf(vs, dout + qr, HD) - Dg[li]);
            }
            int nj = min(32, te - t0);
            for (int jj = 0; jj < nj; jj++) {
                float pj = __shfl_sync(FULL, p, jj), dsj = __shfl_sync(FULL, ds, jj);
                size_t qr = (((size_t)b * T + t0 + jj) * NH + h) * HD;
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (lane + 32 * i < HD) {
                        dva[i] += pj * __bfloat162float(dout[qr + lane + 32 * i]);
                        dka[i] += dsj * __bfloat162float(q[qr + lane + 32 * i]);
                    }
            }
        }
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (lane + 32 * i < HD) {
            dk[krow * HD + lane + 32 * i] = __float2bfloat16_rn(dka[i] * sc);
            dv[krow * HD + lane + 32 * i] = __float2bfloat16_rn(dva[i]);
        }
}

// ----------------------------------------------------------------------------
// launchers

// head dim 256 (Gemma 3 4B/12B) needs up to 192 KiB of shared memory a block (the dQ kernel's): Hopper and
// the data-center GPUs have it, sm_89 and sm_120 (99 KiB) take the scalar kernels
static int smem_optin(void) {
    static int v = -1;
    if (v < 0) {
        int dev;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    return v;
}
static int use_mma(int HD, const void *a, const void *b, const void *c, const void *d) {
    if (HD != 16 && HD != 32 && HD != 64 && HD != 128 && !(HD == 256 && smem_optin() >= (2 * 64 + 4 * 64) * 256 * 2)) return 0;
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15) == 0;  // cp.async needs 16-byte rows
}
static void check_heads(const char *what, int NH, int KVH, int HD) {
    if (KVH <= 0 || NH % KVH) die("%s: %d query heads are not a multiple of %d kv heads", what, NH, KVH);
    if (HD % 2 || HD > SIMPLE_MAXD) die("%s: head_dim %d is not supported (even, <= %d)", what, HD, SIMPLE_MAXD);
}

// The causal kernels' grid: (heads, sequences, blocks of the sequence), the sequence's blocks
// slowest, so that the blocks with the most work (the last queries, the first keys: each kernel maps
// blockIdx.z so) of every head and sequence start before any lighter one. Longest first, the SMs
// finish together; with the heads slowest instead, the last head's heaviest block would start when
// the GPU is nearly done and run alone at the end.
static dim3 causal_grid(int blocks, int heads, int B) { return dim3(heads, B, blocks); }

template <int HD>
static void fwd_mma(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int KVH,
                    float sc, int window, cudaStream_t st) {
    const int smem = (64 + 4 * 64) * HD * 2;
    static int attr = 0;
    if (!attr) {
        cudaCheck(cudaFuncSetAttribute(attn_fwd_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr = 1;
    }
    dim3 grid = causal_grid((T + 63) / 64, NH, B);
    attn_fwd_mma<HD><<<grid, 128, smem, st>>>(out, lse, q, k, v, T, NH, KVH, sc, window);
    launchCheck();
}

static int hopper_off;  // attention_set_hopper(0)
void attention_set_hopper(int on) { hopper_off = !on; }

// the wgmma forward: maps for TMA over q, k, v as 2-D (tokens, heads x HD), boxes of 64 x 64
template <int HD>
static void fwd_wgmma(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int NH, int KVH,
                      float sc, int window, cudaStream_t st) {
    const int smem = 6 * (HD / 64) * 64 * 128 + 1024 + 64;  // Q, K, V tiles of 2 x 64 rows; alignment; barriers
    static int attr = 0;
    if (!attr) {
        cudaCheck(cudaFuncSetAttribute(attn_fwd_wgmma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr = 1;
    }
    CUtensorMap tq = tma_map_2d(q, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B * T, NH * HD, 64, 64);
    CUtensorMap tk = tma_map_2d(k, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B * T, KVH * HD, 64, 64);
    CUtensorMap tv = tma_map_2d(v, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B * T, KVH * HD, 64, 64);
    dim3 grid = causal_grid((T + 127) / 128, NH, B);
    attn_fwd_wgmma<HD><<<grid, 256, smem, st>>>(out, lse, tq, tk, tv, T, NH, KVH, sc, window);
    launchCheck();
}

void attention_forward_cuda(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int NH,
                            int KVH, int HD, float sc, int window, void *stream) {
    check_heads("attention_forward", NH, KVH, HD);
    cudaStream_t st = (cudaStream_t)stream;
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    if (use_mma(HD, out, q, k, v) && !hopper_off && hopper_enabled() && (HD == 64 || HD == 128)) {
        if (HD == 64) fwd_wgmma<64>(o, lse, qq, kk, vv, B, T, NH, KVH, sc, window, st);
        else fwd_wgmma<128>(o, lse, qq, kk, vv, B, T, NH, KVH, sc, window, st);
        return;
    }
    if (use_mma(HD, out, q, k, v)) {
        switch (HD) {
            case 16: fwd_mma<16>(o, lse, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
            case 32: fwd_mma<32>(o, lse, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
            case 64: fwd_mma<64>(o, lse, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
            case 128: fwd_mma<128>(o, lse, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
            case 256: fwd_mma<256>(o, lse, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
        }
    }
    attn_fwd_simple<<<dim3(T, NH, B), 32, 0, st>>>(o, lse, qq, kk, vv, T, NH, KVH, HD, sc, window);
    launchCheck();
}

size_t attention_backward_scratch(int B, int T, int NH) { return (size_t)B * NH * T; }

template <int HD>
static void bwd_mma(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *D, const bf16 *q,
                    const bf16 *k, const bf16 *v, int B, int T, int NH, int KVH, float sc, int window, cudaStream_t st) {
    const int smem_kv = (2 * 64 + 4 * 32) * HD * 2 + 4 * 32 * 4, smem_q = (2 * 64 + 4 * 64) * HD * 2;
    static int attr = 0;
    if (!attr) {
        cudaCheck(cudaFuncSetAttribute(attn_bwd_dkdv_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_kv));
        cudaCheck(cudaFuncSetAttribute(attn_bwd_dq_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_q));
        attr = 1;
    }
    attn_bwd_dkdv_mma<HD><<<causal_grid((T + 63) / 64, KVH, B), 128, smem_kv, st>>>(dk, dv, dout, lse, D, q, k, v, T, NH, KVH, sc, window);
    launchCheck();
    attn_bwd_dq_mma<HD><<<causal_grid((T + 63) / 64, NH, B), 128, smem_q, st>>>(dq, dout, lse, D, q, k, v, T, NH, KVH, sc, window);
    launchCheck();
}

template <int HD>
static void bwd_wgmma(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *D, const bf16 *q,
                      const bf16 *k, const bf16 *v, int B, int T, int NH, int KVH, float sc, int window, cudaStream_t st) {
    const int tile = (HD / 64) * 64 * 128;
    const int smem_q = 8 * tile + 1024 + 64, smem_kv = 8 * tile + 4 * 64 * 4 + 1024 + 64;
    static int attr = 0;
    if (!attr) {
        cudaCheck(cudaFuncSetAttribute(attn_bwd_dq_wgmma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_q));
        cudaCheck(cudaFuncSetAttribute(attn_bwd_dkdv_wgmma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_kv));
        attr = 1;
    }
    CUtensorMap tq = tma_map_2d(q, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B * T, NH * HD, 64, 64);
    CUtensorMap tdo = tma_map_2d(dout, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B * T, NH * HD, 64, 64);
    CUtensorMap tk = tma_map_2d(k, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B * T, KVH * HD, 64, 64);
    CUtensorMap tv = tma_map_2d(v, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B * T, KVH * HD, 64, 64);
    attn_bwd_dkdv_wgmma<HD><<<causal_grid((T + 127) / 128, KVH, B), 256, smem_kv, st>>>(dk, dv, lse, D, tq, tdo, tk, tv, T, NH, KVH, sc, window);
    launchCheck();
    attn_bwd_dq_wgmma<HD><<<causal_grid((T + 127) / 128, NH, B), 256, smem_q, st>>>(dq, lse, D, tq, tdo, tk, tv, T, NH, KVH, sc, window);
    launchCheck();
}

void attention_backward_cuda(void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                             const void *q, const void *k, const void *v, int B, int T, int NH, int KVH, int HD,
                             float sc, int window, float *scratch, void *stream) {
    check_heads("attention_backward", NH, KVH, HD);
    cudaStream_t st = (cudaStream_t)stream;
    size_t rows = (size_t)B * T * NH;
    attn_rowdot<<<(unsigned)((rows + 7) / 8), 256, 0, st>>>(scratch, (const bf16 *)dout, (const bf16 *)out, B, T, NH, HD);
    launchCheck();
    bf16 *a = (bf16 *)dq, *bk = (bf16 *)dk, *bv = (bf16 *)dv;
    const bf16 *o = (const bf16 *)dout, *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    if (use_mma(HD, q, k, v, dout) && use_mma(HD, dq, dk, dv, out) && !hopper_off && hopper_enabled() && (HD == 64 || HD == 128)) {
        if (HD == 64) bwd_wgmma<64>(a, bk, bv, o, lse, scratch, qq, kk, vv, B, T, NH, KVH, sc, window, st);
        else bwd_wgmma<128>(a, bk, bv, o, lse, scratch, qq, kk, vv, B, T, NH, KVH, sc, window, st);
        return;
    }
    if (use_mma(HD, q, k, v, dout) && use_mma(HD, dq, dk, dv, out)) {
        switch (HD) {
            case 16: bwd_mma<16>(a, bk, bv, o, lse, scratch, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
            case 32: bwd_mma<32>(a, bk, bv, o, lse, scratch, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
            case 64: bwd_mma<64>(a, bk, bv, o, lse, scratch, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
            case 128: bwd_mma<128>(a, bk, bv, o, lse, scratch, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
            case 256: bwd_mma<256>(a, bk, bv, o, lse, scratch, qq, kk, vv, B, T, NH, KVH, sc, window, st); return;
        }
    }
    attn_bwd_dq_simple<<<dim3(T, NH, B), 32, 0, st>>>(a, o, lse, scratch, qq, kk, vv, T, NH, KVH, HD, sc, window);
    launchCheck();
    attn_bwd_dkdv_simple<<<dim3(T, KVH, B), 32, 0, st>>>(bk, bv, o, lse, scratch, qq, kk, vv, T, NH, KVH, HD, sc, window);
    launchCheck();
}
