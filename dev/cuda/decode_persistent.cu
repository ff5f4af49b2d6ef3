// dev/cuda/decode_persistent.cu: the second half of a decode step's layer as ONE persistent kernel,
// against the per-op path the program runs today, at M <= 64 rows with FP8 block scaling (E4M3).
//   make -C dev ../build/decode_persistent && ./build/decode_persistent [--shape 0.6b|8b] [--rows M]
//
// The half layer: o = att W_o^T; x += o; ln = rmsnorm(x) w_2 (its FP8 copy lnq); gu = lnq W_gu^T;
// h = silu(gate) * up (its FP8 copy hq); d = hq W_d^T; x += d; the next layer's norm and its FP8 copy
// nq. Today that is six launches (fp8_gemm_cuda, cu_add_rmsnorm, fp8_gemm_cuda, cu_glu_gu,
// fp8_gemm_cuda, cu_add_rmsnorm), each paying a ramp of a few microseconds before the weights stream
// at speed, and a gap between launches (dev/notes/decode.md: 6.5-7 us a product at 0.6B for 1-6 MB).
// The question here: how much of that goes when one kernel runs the six as phases, and the weights of
// the next product stream into shared memory while the current phase finishes.
//
// The schedule. One block per SM, every block resident at once (so blocks may wait for each other).
// Six phases, in order:
//   G0  o:       tasks = (128-column tile of W_o, K split) -> an fp32 partial tile in `part`
//   R1  norm:    one row a block: x += bf16(sum of the splits' partials); ln, rstd, lnq
//   G2  gate|up: tasks as G0 over W_gu (2 FF rows) -> partials
//   R3  SwiGLU:  (row, 128 columns) units over all blocks: g, u = bf16(sums); h; hq
//   G4  down:    tasks as G0 over W_d -> partials
//   R5  norm:    as R1 with the next layer's norm weight -> x, ln, rstd, nq
// Task t of a GEMM phase runs on block t % blocks, so every block knows its whole list of loads
// before it starts. The GEMM phases split K so that every block streams about the same bytes
// (choose_splits), and the partial tiles are summed by the row phase that reads them, in split order:
// the result does not depend on which block finishes first.
//
// Dependencies. `sync` holds a counter per phase in global memory; a block adds 1 when it has done its
// share of a phase (its stores fenced first); a phase that reads a phase's output waits until that
// counter equals the number of blocks. The last block to leave sets every counter back to 0 for the
// next launch.
//
// The pipeline. Warp 4 produces, warps 0-3 (one warpgroup) consume, as in fp8_hopper.cu's decode
// kernel, through a ring of PD_STAGES stages (X 64 x 128 B, W 128 x 128 B, the step's 64 + 1 block
// scales). The producer runs two cursors over the block's K steps of all three GEMM phases: W's runs
// up to the ring's depth ahead, needing only a free stage (weights depend on nothing); X's (and its
// scales, cp.async) waits for the phase that writes X. So when a row phase ends, the next product's
// first PD_STAGES steps of W are already in shared memory on every SM, meant to hide the ramp a new
// launch pays. What it measured, and why it is slower than the per-op path: dev/notes/decode.md ("One
// persistent kernel for half a decode layer") and dev/cuda/README.md.
#include <math.h>

#include <algorithm>
#include <vector>

#include "common.cuh"
#include "cuda/backend_cuda.cuh"

#define PD_STAGES 7
#define PD_TX (64 * WG_BK)   // bytes of one stage of X
#define PD_TW (128 * WG_BK)  // of W
#define PD_SC 68             // floats of a stage's scales: sx of 64 rows, sw, padding
#define PD_MAXC 8192         // widest row the row phases hold (C)
#define PD_THREADS 160
#define PD_SMEM (PD_STAGES * (PD_TX + PD_TW) + PD_STAGES * PD_SC * 4 + PD_MAXC * 4 + 2 * PD_STAGES * 8 + 1024)
static_assert(PD_SMEM <= 232448, "over the 227 KiB of a block");

enum { PH_O, PH_NORM, PH_GU, PH_SWIGLU, PH_DOWN, PH_NORM2, PH_EXIT, PH_N };

typedef struct {
    int N, K, ks;         // W (N, K); K split into ks ranges
    const float *sw;      // W's 128 x 128 block scales, row length ldsw
    int ldsw;
    const float *sx;      // X's 1 x 128 scales (K / 128, M); written by an earlier phase for G2 and G4
} PdGemm;

typedef struct {
    int M, C, FF;
    float eps;
    PdGemm g[3];                  // o, gate|up, down
    bf16 *x, *ln;                 // (M, C): the residual stream, the normalized rows
    float *rstd;                  // (M)
    const bf16 *w_norm, *w_next;  // (C): the post-attention norm, the next layer's input norm
    uint8_t *lnq; float *lnqs;    // (M, C) E4M3 + (C / 128, M): gate|up's input
    uint8_t *hq; float *hqs;      // (M, FF) + (FF / 128, M): down's input
    uint8_t *nq; float *nqs;      // (M, C) + (C / 128, M): the next layer's q|k|v input
    float *part;                  // the split partials: (ks, M, N) of the phase's product
    unsigned *sync;               // PH_N counters, 0 between launches
    int variant;                  // experiments: bit 0 one thread fences a phase's stores, bit 1 W waits for X's phase,
                                  // bit 2 an idle producer sleeps 2 us between polls
    unsigned long long *trace;    // NULL, or PD_MARKS times a block (ns, %globaltimer) where its phases end
} PdArgs;
#define PD_MARKS 14

typedef struct {
    CUtensorMap x[3], w[3];  // X boxes of 64 x 128 B, W boxes of 128 x 128 B
} PdMaps;

__device__ __forceinline__ void pd_mark(const PdArgs &a, int k) {
    if (a.trace && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        a.trace[blockIdx.x * PD_MARKS + k] = t;
    }
}

// ---- small PTX pieces beyond hopper.cuh ----
// A counter is polled with relaxed loads and acquired once it is reached: an acquire load invalidates
// the SM's L1 (CCTL.IVALL) every time it runs, which the ncu profile showed thousands of times a launch.
__device__ __forceinline__ unsigned ld_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acquire() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// ordinary global writes -> visible to TMA reads (the async proxy) after the release that follows
__device__ __forceinline__ void fence_proxy_async_global() {
#ifdef FP8_SM90A
    asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
// whether the phase of parity `parity` has completed (no waiting)
__device__ __forceinline__ int mbar_test(uint64_t *bar, int parity) {
    uint32_t done = 0;
#ifdef FP8_SM90A
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
#endif
    return (int)done;
}
// the barrier's phase also waits for this thread's earlier cp.asyncs (counted in its expected arrivals)
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// as ops_cuda.cu's: silu(g) u
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// ---- the walk over a block's K steps of the three GEMM phases ----
struct PdWalk {
    int g, t, kb, kb1, tile, split;  // phase (0..2, 3 = done), task, K step, its task's end
    __device__ void task_begin(const PdArgs &a) {
        for (;;) {
            if (g > 2) return;
            const PdGemm &G = a.g[g];
            int tasks = (G.N / 128) * G.ks;
            if (t < tasks) {
                int KB = G.K / WG_BK;
                tile = t / G.ks;
                split = t % G.ks;
                kb = (int)((long)KB * split / G.ks);
                kb1 = (int)((long)KB * (split + 1) / G.ks);
                if (kb < kb1) return;
                t += gridDim.x;  // an empty split (ks > KB is never chosen, but be safe)
                continue;
            }
            g++;
            t = blockIdx.x;
        }
    }
    __device__ void begin(const PdArgs &a) { g = 0; t = blockIdx.x; task_begin(a); }
    __device__ bool done() const { return g > 2; }
    __device__ void next(const PdArgs &a) {  // the next K step
        if (++kb < kb1) return;
        t += gridDim.x;
        task_begin(a);
    }
};

// ---- phase counters ----
// the consumers' share of a phase is done: fence their stores (for TMA readers too), then count
__device__ __forceinline__ void pd_arrive(const PdArgs &a, int ph) {
    if (a.variant & 1) {
        named_bar_sync(1, 128);
        if (threadIdx.x == 0) {
            fence_proxy_async_global();
            __threadfence();
            atomicAdd(&a.sync[ph], 1u);
        }
        return;
    }
    fence_proxy_async_global();
    __threadfence();
    named_bar_sync(1, 128);
    if (threadIdx.x == 0) atomicAdd(&a.sync[ph], 1u);
}
// wait until every block has arrived at phase ph (consumers: thread 0 spins, the others wait for it)
__device__ __forceinline__ void pd_wait_consumers(const PdArgs &a, int ph) {
    if (threadIdx.x == 0) {
        while (ld_relaxed(&a.sync[ph]) < gridDim.x) __nanosleep(32);
        fence_acquire();
    }
    named_bar_sync(1, 128);
}

// ---- the row phases ----
// They read the GEMM phases' fp32 partials from L2, a few bytes of work per load: what costs is the
// latency of a load (~1 us while the weights stream), so each thread issues a batch of independent
// loads (~128 floats) before it adds any, instead of one chain of dependent loads per split.

// One row: v = x + bf16(sum of the ks partials in split order), stored back to x; out = rmsnorm(v) w;
// the FP8 copy in 1x128 groups. Thread t (of 128) holds the 8 columns of chunks t, t + 128, .. (NCH
// of them: C <= 1024 NCH). The arithmetic is cu_add_rmsnorm's (norm_row_kernel): the sum of squares
// in row_rstd's order (lane l adds elements 8 l + 256 k + j for k, then j, through shared memory), the
// copy's scale and codes.
template <int NCH>
__device__ void pd_norm_row(const PdArgs &a, int r, const float *part, int ks, int N, const bf16 *w, uint8_t *q, float *qs,
                            float *rowbuf) {
    constexpr int SB = NCH >= 16 ? 1 : 16 / NCH;  // splits loaded at once
    __shared__ float rstd_shared;
    const int t = threadIdx.x, C = a.C, chunks = C / 8;
    float f[NCH][8];
#pragma unroll
    for (int i = 0; i < NCH; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) f[i][j] = 0.f;
    for (int s0 = 0; s0 < ks; s0 += SB) {
        float4 p[NCH][SB][2];
#pragma unroll
        for (int i = 0; i < NCH; i++)
#pragma unroll
            for (int j = 0; j < SB; j++) {
                int c = t + 128 * i, sp = s0 + j;
                if (c < chunks && sp < ks) {
                    const float4 *src = (const float4 *)(part + ((size_t)sp * a.M + r) * N + 8 * c);
                    p[i][j][0] = __ldcg(src);
                    p[i][j][1] = __ldcg(src + 1);
                } else {
                    p[i][j][0] = p[i][j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
#pragma unroll
        for (int i = 0; i < NCH; i++)
#pragma unroll
            for (int j = 0; j < SB; j++) {  // in split order
                f[i][0] += p[i][j][0].x; f[i][1] += p[i][j][0].y; f[i][2] += p[i][j][0].z; f[i][3] += p[i][j][0].w;
                f[i][4] += p[i][j][1].x; f[i][5] += p[i][j][1].y; f[i][6] += p[i][j][1].z; f[i][7] += p[i][j][1].w;
            }
    }
#pragma unroll
    for (int i = 0; i < NCH; i++) {
        int c = t + 128 * i;
        if (c >= chunks) break;
        bf16 *xr = a.x + (size_t)r * C + 8 * c;
        float xv[8], ov[8];
        unpack8(xv, *(const uint4 *)xr);
        unpack8(ov, pack8(f[i]));  // the product's bf16 output, as the per-op GEMM stores it
#pragma unroll
        for (int j = 0; j < 8; j++) xv[j] += ov[j];
        uint4 packed = pack8(xv);
        *(uint4 *)xr = packed;
        unpack8(f[i], packed);  // the rounded sums
#pragma unroll
        for (int j = 0; j < 8; j++) rowbuf[8 * c + j] = f[i][j];
    }
    named_bar_sync(1, 128);
    if (t < 32) {  // row_rstd's order
        float ss = 0.f;
        for (int k = 0; t * 8 + 256 * k < C; k++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float v = rowbuf[t * 8 + 256 * k + j];
                ss += v * v;
            }
        ss = warp_sum(ss);
        if (t == 0) rstd_shared = 1.0f / sqrtf(ss / C + a.eps);
    }
    named_bar_sync(1, 128);
    float rs = rstd_shared;
    if (t == 0) a.rstd[r] = rs;
#pragma unroll
    for (int i = 0; i < NCH; i++) {
        int c = t + 128 * i;
        bool on = c < chunks;  // whole 16-thread groups are on or off (C % 128 == 0); all shuffle together
        float g[8];
        if (on) unpack8(g, *(const uint4 *)(w + 8 * c));
#pragma unroll
        for (int j = 0; j < 8; j++) f[i][j] = on ? (f[i][j] * rs) * g[j] : 0.f;
        uint4 y = pack8(f[i]);
        if (on) *(uint4 *)(a.ln + (size_t)r * C + 8 * c) = y;
        unpack8(f[i], y);  // the copy encodes the stored (rounded) values
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[i][j]));
        for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (!on) continue;
        float sc = fp8_scale_dev(m, FP8_E4M3, 0);
        if (t % 16 == 0) qs[(size_t)(8 * c / FP8_BLOCK_SIZE) * a.M + r] = sc;
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            lo |= (uint32_t)fp8_encode_dev(__fdiv_rn(f[i][j], sc), FP8_E4M3) << (8 * j);
            hi |= (uint32_t)fp8_encode_dev(__fdiv_rn(f[i][j + 4], sc), FP8_E4M3) << (8 * j);
        }
        *(uint2 *)(q + (size_t)r * C + 8 * c) = make_uint2(lo, hi);
    }
    named_bar_sync(1, 128);  // rowbuf is reused by the next row
}
// the row phase R1 / R5: this block's rows (block b: rows b, b + blocks, ..)
__device__ void pd_norm_rows(const PdArgs &a, const float *part, int ks, const bf16 *w, uint8_t *q, float *qs, float *rowbuf) {
    for (int r = blockIdx.x; r < a.M; r += gridDim.x) {
        if (r >= (int)gridDim.x && w == a.w_norm) pd_mark(a, 13);  // R1's second row starts (experiment: rows > blocks)
        if (a.C <= 1024) pd_norm_row<1>(a, r, part, ks, a.C, w, q, qs, rowbuf);
        else if (a.C <= 2048) pd_norm_row<2>(a, r, part, ks, a.C, w, q, qs, rowbuf);
        else if (a.C <= 4096) pd_norm_row<4>(a, r, part, ks, a.C, w, q, qs, rowbuf);
        else pd_norm_row<8>(a, r, part, ks, a.C, w, q, qs, rowbuf);
    }
}

// SwiGLU units: (row, 128 columns), 16 threads each (8 columns a thread), 8 units a block at a time,
// UB of those rounds loaded at once. g and u are the gate|up product's bf16 outputs (the splits
// summed in order, rounded), h = bf16(silu(g) u) as swiglu_gu_kernel rounds it, and h's FP8 copy in
// its 1x128 group.
__device__ void pd_swiglu(const PdArgs &a) {
    constexpr int UB = 4, SB = 2;
    const int t = threadIdx.x, hw = t >> 4, G = a.FF / FP8_BLOCK_SIZE, units = a.M * G, N = 2 * a.FF, ks = a.g[1].ks;
    for (int k0 = 0; (blockIdx.x + gridDim.x * k0) * 8 < units; k0 += UB) {  // the same rounds for every thread
        float gs[UB][8], us[UB][8];
#pragma unroll
        for (int v = 0; v < UB; v++)
#pragma unroll
            for (int j = 0; j < 8; j++) gs[v][j] = us[v][j] = 0.f;
        for (int s0 = 0; s0 < ks; s0 += SB) {
            float4 pg[UB][SB][2], pu[UB][SB][2];
#pragma unroll
            for (int v = 0; v < UB; v++)
#pragma unroll
                for (int j = 0; j < SB; j++) {
                    int u = (blockIdx.x + gridDim.x * (k0 + v)) * 8 + hw, sp = s0 + j;
                    if (u < units && sp < ks) {
                        int r = u / G, c0 = (u % G) * FP8_BLOCK_SIZE + 8 * (t & 15);
                        const float *src = a.part + ((size_t)sp * a.M + r) * N + c0;
                        pg[v][j][0] = __ldcg((const float4 *)src);
                        pg[v][j][1] = __ldcg((const float4 *)src + 1);
                        pu[v][j][0] = __ldcg((const float4 *)(src + a.FF));
                        pu[v][j][1] = __ldcg((const float4 *)(src + a.FF) + 1);
                    } else {
                        pg[v][j][0] = pg[v][j][1] = pu[v][j][0] = pu[v][j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
                    }
                }
#pragma unroll
            for (int v = 0; v < UB; v++)
#pragma unroll
                for (int j = 0; j < SB; j++) {  // in split order
                    gs[v][0] += pg[v][j][0].x; gs[v][1] += pg[v][j][0].y; gs[v][2] += pg[v][j][0].z; gs[v][3] += pg[v][j][0].w;
                    gs[v][4] += pg[v][j][1].x; gs[v][5] += pg[v][j][1].y; gs[v][6] += pg[v][j][1].z; gs[v][7] += pg[v][j][1].w;
                    us[v][0] += pu[v][j][0].x; us[v][1] += pu[v][j][0].y; us[v][2] += pu[v][j][0].z; us[v][3] += pu[v][j][0].w;
                    us[v][4] += pu[v][j][1].x; us[v][5] += pu[v][j][1].y; us[v][6] += pu[v][j][1].z; us[v][7] += pu[v][j][1].w;
                }
        }
#pragma unroll
        for (int v = 0; v < UB; v++) {
            int u = (blockIdx.x + gridDim.x * (k0 + v)) * 8 + hw;
            bool on = u < units;  // whole groups of 16 threads are on or off together
            float gb[8], ub[8], h[8];
            unpack8(gb, pack8(gs[v]));
            unpack8(ub, pack8(us[v]));
#pragma unroll
            for (int j = 0; j < 8; j++) h[j] = silu_mul(gb[j], ub[j]);
            unpack8(h, pack8(h));
            float m = 0.f;
#pragma unroll
            for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(h[j]));
            for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            if (!on) continue;
            int r = u / G, gi = u % G, c0 = gi * FP8_BLOCK_SIZE + 8 * (t & 15);
            float sc = fp8_scale_dev(m, FP8_E4M3, 0);
            if ((t & 15) == 0) a.hqs[(size_t)gi * a.M + r] = sc;
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                lo |= (uint32_t)fp8_encode_dev(__fdiv_rn(h[j], sc), FP8_E4M3) << (8 * j);
                hi |= (uint32_t)fp8_encode_dev(__fdiv_rn(h[j + 4], sc), FP8_E4M3) << (8 * j);
            }
            *(uint2 *)(a.hq + (size_t)r * a.FF + c0) = make_uint2(lo, hi);
        }
    }
}

// whether GEMM phase g's input X exists (R1 / R3 done, for g = 1 / 2); ready: the last phase seen so
// (the producer warp's; lane 0 reads the counter, the warp decides together)
__device__ __forceinline__ bool pd_input_ready(const PdArgs &a, int g, int lane, int &ready) {
    if (g <= ready) return true;
    int ph = g == 1 ? PH_NORM : PH_SWIGLU;
    unsigned n = lane == 0 ? ld_relaxed(&a.sync[ph]) : 0;
    if (__shfl_sync(0xffffffffu, n, 0) < gridDim.x) return false;
    fence_acquire();
    fence_proxy_async_global();
    ready = g;
    return true;
}

// ---- the kernel ----
__global__ void __launch_bounds__(PD_THREADS, 1) decode_half_kernel(const PdArgs a, const __grid_constant__ PdMaps maps) {
#ifdef FP8_SM90A
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint8_t *xs = smem;                                   // [stage][64 rows][128 B]
    uint8_t *ws = xs + PD_STAGES * PD_TX;                 // [stage][128 rows][128 B]
    float *sc = (float *)(ws + PD_STAGES * PD_TW);        // [stage][PD_SC]: sx of 64 rows, then sw
    float *rowbuf = sc + PD_STAGES * PD_SC;               // [PD_MAXC]
    uint64_t *full = (uint64_t *)(rowbuf + PD_MAXC), *empty = full + PD_STAGES;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (int s = 0; s < PD_STAGES; s++) {
            mbar_init(&full[s], 1 + 32);  // the TMA thread's expect_tx, the producer lanes' cp.asyncs
            mbar_init(&empty[s], 4);      // the 4 consumer warps
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (warp == 4) {  // ---- producer ----
        // Two cursors over the same walk: w issues a step's W as soon as its stage is free, x its X and
        // scales as soon as the step's W is issued and the phase that writes X is done. Neither waits
        // for the other: while a row phase runs, w fills the ring with the next product's weights.
        // Every decision is lane 0's, broadcast, so that the warp's lanes walk together.
        PdWalk w, x;
        w.begin(a);
        x.begin(a);
        long wi = 0, xi = 0;
        int ready = 0;  // the GEMM phases whose X exists: G0's input is there at launch
        while (!x.done()) {
            bool progress = false;
            while (xi < wi) {  // X: the steps whose W is on its way
                if (x.g > ready && !pd_input_ready(a, x.g, lane, ready)) break;  // X of G2 / G4: R1 / R3 not done
                int st = (int)(xi % PD_STAGES);
                const PdGemm &G = a.g[x.g];
                float *s = sc + st * PD_SC;
                for (int r = lane; r < a.M; r += 32) cp_async4(s + r, G.sx + (size_t)x.kb * a.M + r);
                if (lane == 0) {
                    cp_async4(s + 64, G.sw + (size_t)x.tile * G.ldsw + x.kb);
                    tma_load_2d(xs + st * PD_TX, &maps.x[x.g], &full[st], x.kb * WG_BK, 0);
                }
                cp_async_mbar_arrive(&full[st]);
                x.next(a);
                xi++;
                progress = true;
            }
            if (!w.done() && (!(a.variant & 2) || w.g <= ready || pd_input_ready(a, w.g, lane, ready))) {  // W: the next step, if its stage is free
                int st = (int)(wi % PD_STAGES), par = (int)((wi / PD_STAGES) & 1);
                int free_ = lane == 0 ? mbar_test(&empty[st], par ^ 1) : 0;
                if (__shfl_sync(0xffffffffu, free_, 0)) {
                    if (lane == 0) {
                        mbar_expect_tx(&full[st], PD_TX + PD_TW);
                        tma_load_2d(ws + st * PD_TW, &maps.w[w.g], &full[st], w.kb * WG_BK, w.tile * 128);
                    }
                    w.next(a);
                    wi++;
                    progress = true;
                }
            }
            if (!progress) __nanosleep(a.variant & 4 ? 2000 : 20);
        }
    } else {  // ---- consumers: thread rows rl and rl + 8, columns 8i + 2 (lane % 4) + 0/1 ----
        const int rl = warp * 16 + (lane >> 2);
        float acc[64], part[64];
        PdWalk it;
        it.begin(a);
        long i = 0;
        pd_mark(a, 0);
        for (int g = 0; g < 3; g++) {
            while (!it.done() && it.g == g) {  // this block's tasks of phase g
                const PdGemm &G = a.g[g];
                const int tile = it.tile, split = it.split;
#pragma unroll
                for (int j = 0; j < 64; j++) acc[j] = 0.0f;
                do {
                    int st = (int)(i % PD_STAGES), par = (int)((i / PD_STAGES) & 1);
                    mbar_wait(&full[st], par);
                    const float *s = sc + st * PD_SC;
                    float f0 = s[rl] * s[64], f1 = s[rl + 8] * s[64];
                    wg_kstep<128>(part, wg_desc(xs + st * PD_TX), wg_desc(ws + st * PD_TW));
                    if (lane == 0) mbar_arrive(&empty[st]);
#pragma unroll
                    for (int j = 0; j < 16; j++) {
                        acc[4 * j + 0] += part[4 * j + 0] * f0;
                        acc[4 * j + 1] += part[4 * j + 1] * f0;
                        acc[4 * j + 2] += part[4 * j + 2] * f1;
                        acc[4 * j + 3] += part[4 * j + 3] * f1;
                    }
                    i++;
                    it.next(a);
                } while (!it.done() && it.g == g && it.tile == tile && it.split == split);
                // the partial tile (rows < M) to part[split]
                float *p = a.part + (size_t)split * a.M * G.N + tile * 128;
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    int c = 8 * j + 2 * (lane & 3);
                    if (rl < a.M) __stcg((float2 *)(p + (size_t)rl * G.N + c), make_float2(acc[4 * j], acc[4 * j + 1]));
                    if (rl + 8 < a.M)
                        __stcg((float2 *)(p + (size_t)(rl + 8) * G.N + c), make_float2(acc[4 * j + 2], acc[4 * j + 3]));
                }
            }
            // the phase's products are stored: count them, then the row phase that reads them
            pd_mark(a, 1 + 3 * g);
            if (g == 0) {
                pd_arrive(a, PH_O);
                pd_mark(a, 10);
                if ((int)blockIdx.x < a.M) {
                    pd_wait_consumers(a, PH_O);
                    pd_mark(a, 2);
                    pd_norm_rows(a, a.part, a.g[0].ks, a.w_norm, a.lnq, a.lnqs, rowbuf);
                } else pd_mark(a, 2);
                pd_arrive(a, PH_NORM);
                pd_mark(a, 3);
            } else if (g == 1) {
                pd_arrive(a, PH_GU);
                pd_mark(a, 11);
                pd_wait_consumers(a, PH_GU);
                pd_mark(a, 5);
                pd_swiglu(a);
                pd_arrive(a, PH_SWIGLU);
                pd_mark(a, 6);
            } else {
                pd_arrive(a, PH_DOWN);
                pd_mark(a, 12);
                if ((int)blockIdx.x < a.M) {
                    pd_wait_consumers(a, PH_DOWN);
                    pd_mark(a, 8);
                    pd_norm_rows(a, a.part, a.g[2].ks, a.w_next, a.nq, a.nqs, rowbuf);
                } else pd_mark(a, 8);
                pd_mark(a, 9);
                // leave; the last block out resets the counters (every block has passed its waits)
                named_bar_sync(1, 128);
                if (tid == 0) {
                    __threadfence();
                    if (atomicAdd(&a.sync[PH_EXIT], 1u) == gridDim.x - 1)
                        for (int k = 0; k < PH_N; k++) a.sync[k] = 0;
                }
            }
        }
    }
#endif
}

// The row phases alone, as kernels of their own in the same block shape (160 threads, the persistent
// kernel's shared memory, so one block an SM), on the partials the last persistent launch left: what
// the same code costs outside the persistent kernel.
__global__ void __launch_bounds__(PD_THREADS, 1) norm_rows_alone_kernel(const PdArgs a) {
    extern __shared__ uint8_t smem_raw[];
    if (threadIdx.x >= 128) return;
    pd_norm_rows(a, a.part, a.g[2].ks, a.w_next, a.nq, a.nqs, (float *)smem_raw);
}
__global__ void __launch_bounds__(PD_THREADS, 1) swiglu_alone_kernel(const PdArgs a) {
    if (threadIdx.x >= 128) return;
    pd_swiglu(a);
}
__global__ void empty_kernel() {}

// ----------------------------------------------------------------------------
// host

// the K splits of a product of `tiles` 128-column tiles and KB K steps on nb blocks: the fewest
// bytes the busiest block moves, its W steps (16 KB each) and its partial tiles written and read back
static int choose_splits(int tiles, int KB, int nb, int M) {
    int best = 1;
    double bcost = 1e30;
    for (int ks = 1; ks <= KB; ks++) {
        long tasks = (long)tiles * ks, per = (tasks + nb - 1) / nb;
        double cost = per * ((KB + ks - 1) / ks) * (double)PD_TW + 2.0 * per * M * 128 * 4;
        if (cost < bcost - 1e-9) { bcost = cost; best = ks; }
    }
    return best;
}

typedef struct {
    int C, FF, A;   // hidden, intermediate, attention width (NH HD: o's K)
    const char *name;
} Shape;

typedef struct {        // one layer's half: weights (device)
    FP8Tensor wo, wgu, wd;
    bf16 *w_norm, *w_next;
} Layer;

typedef struct {        // the activations a path reads and writes (device)
    FP8Tensor aq, lnq, hq, nq;
    bf16 *x, *ln, *tmp, *gu, *h;
    float *rstd;
} Acts;

static void acts_alloc(Acts *t, const Shape *s, int M) {
    t->aq = fp8_dev_alloc(M, s->A, FP8_BLOCK, 1);
    t->lnq = fp8_dev_alloc(M, s->C, FP8_BLOCK, 1);
    t->hq = fp8_dev_alloc(M, s->FF, FP8_BLOCK, 1);
    t->nq = fp8_dev_alloc(M, s->C, FP8_BLOCK, 1);
    cudaCheck(cudaMalloc(&t->x, (size_t)M * s->C * 2));
    cudaCheck(cudaMalloc(&t->ln, (size_t)M * s->C * 2));
    cudaCheck(cudaMalloc(&t->tmp, (size_t)M * s->C * 2));
    cudaCheck(cudaMalloc(&t->gu, (size_t)M * 2 * s->FF * 2));
    cudaCheck(cudaMalloc(&t->h, (size_t)M * s->FF * 2));
    cudaCheck(cudaMalloc(&t->rstd, (size_t)M * 4));
}

static FP8Tensor weight_make(int N, int K, uint64_t seed, float gain) {
    bf16 *b;
    cudaCheck(cudaMalloc(&b, (size_t)N * K * 2));
    fill_normal_bf16(b, (size_t)N * K, seed);
    // N(0, 1) * gain: a weight of the scale a real layer has (1 / sqrt(K)), so activations stay O(1)
    if (gain != 1.0f) {
        std::vector<bf16> h((size_t)N * K);
        cudaCheck(cudaMemcpy(h.data(), b, h.size() * 2, cudaMemcpyDeviceToHost));
        for (auto &v : h) v = __float2bfloat16(__bfloat162float(v) * gain);
        cudaCheck(cudaMemcpy(b, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    FP8Tensor w = fp8_dev_alloc(N, K, FP8_BLOCK, FP8_BLOCK_SIZE);
    fp8_quantize_cuda(&w, b, DT_BF16, 0);
    cudaCheck(cudaDeviceSynchronize());
    cudaFree(b);
    return w;
}

static void layer_make(Layer *L, const Shape *s, uint64_t seed) {
    L->wo = weight_make(s->C, s->A, seed * 8 + 1, 1.0f / sqrtf((float)s->A));
    L->wgu = weight_make(2 * s->FF, s->C, seed * 8 + 2, 1.0f / sqrtf((float)s->C));
    L->wd = weight_make(s->C, s->FF, seed * 8 + 3, 1.0f / sqrtf((float)s->FF));
    std::vector<bf16> h(s->C);
    cudaCheck(cudaMalloc(&L->w_norm, s->C * 2));
    cudaCheck(cudaMalloc(&L->w_next, s->C * 2));
    for (int i = 0; i < s->C; i++) h[i] = __float2bfloat16(1.0f + 0.1f * sinf(0.37f * i + seed));
    cudaCheck(cudaMemcpy(L->w_norm, h.data(), s->C * 2, cudaMemcpyHostToDevice));
    for (int i = 0; i < s->C; i++) h[i] = __float2bfloat16(1.0f + 0.1f * cosf(0.23f * i + seed));
    cudaCheck(cudaMemcpy(L->w_next, h.data(), s->C * 2, cudaMemcpyHostToDevice));
}

// the per-op path, as model.c's decode step runs this half
static void per_op(Acts *t, const Layer *L, const Shape *s, int M) {
    fp8_gemm_cuda(t->tmp, DT_BF16, &t->aq, &L->wo, 0);
    cu_add_rmsnorm(t->x, t->ln, t->rstd, t->tmp, L->w_norm, M, s->C, 1e-6f, 0, &t->lnq);
    fp8_gemm_cuda(t->gu, DT_BF16, &t->lnq, &L->wgu, 0);
    cu_glu_gu(t->h, &t->hq, t->gu, M, s->FF, 0);
    fp8_gemm_cuda(t->tmp, DT_BF16, &t->hq, &L->wd, 0);
    cu_add_rmsnorm(t->x, t->ln, t->rstd, t->tmp, L->w_next, M, s->C, 1e-6f, 0, &t->nq);
}

typedef struct {
    PdArgs a;
    PdMaps maps;
    int blocks;
} PdPlan;

static void plan_make(PdPlan *p, Acts *t, const Layer *L, const Shape *s, int M, float *part, unsigned *sync, int sms) {
    PdArgs &a = p->a;
    memset(&a, 0, sizeof a);
    a.M = M; a.C = s->C; a.FF = s->FF; a.eps = 1e-6f;
    const FP8Tensor *W[3] = {&L->wo, &L->wgu, &L->wd}, *X[3] = {&t->aq, &t->lnq, &t->hq};
    for (int g = 0; g < 3; g++) {
        PdGemm &G = a.g[g];
        G.N = W[g]->rows; G.K = W[g]->cols;
        G.ks = choose_splits(G.N / 128, G.K / WG_BK, sms, M);
        G.sw = W[g]->scale; G.ldsw = fp8_scale_ld(FP8_BLOCK, W[g]->rows, W[g]->cols, FP8_BLOCK_SIZE);
        G.sx = X[g]->scale;
        p->maps.x[g] = tma_map_2d(X[g]->data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, M, G.K, 64, WG_BK);
        p->maps.w[g] = tma_map_2d(W[g]->data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, G.N, G.K, 128, WG_BK);
    }
    a.x = t->x; a.ln = t->ln; a.rstd = t->rstd;
    a.w_norm = L->w_norm; a.w_next = L->w_next;
    a.lnq = t->lnq.data; a.lnqs = t->lnq.scale;
    a.hq = t->hq.data; a.hqs = t->hq.scale;
    a.nq = t->nq.data; a.nqs = t->nq.scale;
    a.part = part; a.sync = sync;
    p->blocks = sms;
}

// One block per SM, all resident at once: blocks wait for each other, so a block that could not start
// until another left would wait forever. A graph runs the kernel after the one before it has left its
// SMs, and the occupancy check in main says a block fits on every SM. (A cooperative launch would
// guarantee it; plain launches keep the experiment independent of its support in stream capture.)
static void pd_launch(const PdPlan *p) {
    decode_half_kernel<<<p->blocks, PD_THREADS, PD_SMEM, cu_stream()>>>(p->a, p->maps);
    launchCheck();
}

// sign bits cleared: |codes| (E4M3's bit 7 is the sign)
__global__ void abs_codes(uint8_t *q, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) q[i] &= 0x7F;
}
static FP8Tensor abs_copy(const FP8Tensor *t) {
    FP8Tensor c = fp8_dev_alloc(t->rows, t->cols, t->gran, t->block_rows);
    size_t n = (size_t)t->rows * t->cols;
    cudaCheck(cudaMemcpy(c.data, t->data, n, cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(c.scale, t->scale, fp8_num_scales(t->gran, t->rows, t->cols, t->block_rows) * 4, cudaMemcpyDeviceToDevice));
    abs_codes<<<256, 256>>>(c.data, n);
    launchCheck();
    return c;
}
static std::vector<float> bf16_host(const bf16 *d, size_t n) {
    std::vector<bf16> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
    return f;
}
static std::vector<float> f32_host(const float *d, size_t n) {
    std::vector<float> f(n);
    cudaCheck(cudaMemcpy(f.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return f;
}
// the fraction of codes (and their scales) that agree
static double codes_agree(const FP8Tensor *a, const FP8Tensor *b) {
    size_t n = (size_t)a->rows * a->cols;
    std::vector<uint8_t> x(n), y(n);
    cudaCheck(cudaMemcpy(x.data(), a->data, n, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(y.data(), b->data, n, cudaMemcpyDeviceToHost));
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += x[i] == y[i];
    return (double)same / n;
}

// One case: the persistent kernel against the per-op path on the same inputs. x after the half layer
// must agree within what the two paths' FP8 products may differ by: each is within 2^-8 sum |x w| of
// the exact product (the tensor cores' sums inside a K step, test/gpu_fp8.cu), so the two within
// twice that, for o and for down; plus a bf16 rounding of x each (2^-8 |x|). The FP8 copies agree
// where no rounding of a bf16 value fell on the other side between the paths (reported, and at
// least 99% of codes).
static int check_case(const Shape *s, int M, int sms, float *part, unsigned *sync) {
    Layer L;
    layer_make(&L, s, 7);
    Acts r, p;
    acts_alloc(&r, s, M);
    acts_alloc(&p, s, M);
    bf16 *ab;
    cudaCheck(cudaMalloc(&ab, (size_t)M * s->A * 2));
    fill_normal_bf16(ab, (size_t)M * s->A, 11);
    fp8_quantize_cuda(&r.aq, ab, DT_BF16, 0);
    fp8_quantize_cuda(&p.aq, ab, DT_BF16, 0);
    fill_normal_bf16(r.x, (size_t)M * s->C, 12);
    cudaCheck(cudaMemcpy(p.x, r.x, (size_t)M * s->C * 2, cudaMemcpyDeviceToDevice));
    std::vector<float> x0 = bf16_host(r.x, (size_t)M * s->C);
    per_op(&r, &L, s, M);
    PdPlan plan;
    plan_make(&plan, &p, &L, s, M, part, sync, sms);
    pd_launch(&plan);
    cudaCheck(cudaDeviceSynchronize());
    // the tolerance's scale: sum |x w| of o and of down, from |codes| through the same GEMM
    FP8Tensor aa = abs_copy(&r.aq), awo = abs_copy(&L.wo), ah = abs_copy(&r.hq), awd = abs_copy(&L.wd);
    float *so, *sd;
    cudaCheck(cudaMalloc(&so, (size_t)M * s->C * 4));
    cudaCheck(cudaMalloc(&sd, (size_t)M * s->C * 4));
    fp8_gemm_cuda(so, DT_F32, &aa, &awo, 0);
    fp8_gemm_cuda(sd, DT_F32, &ah, &awd, 0);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> xr = bf16_host(r.x, (size_t)M * s->C), xp = bf16_host(p.x, (size_t)M * s->C);
    std::vector<float> So = f32_host(so, (size_t)M * s->C), Sd = f32_host(sd, (size_t)M * s->C);
    double worst = 0, l2d = 0, l2r = 0;
    size_t same = 0, bad = 0;
    for (size_t i = 0; i < xr.size(); i++) {
        double d = fabs((double)xr[i] - xp[i]);
        double tol = 2 * 0x1p-8 * (So[i] + Sd[i]) + 0x1p-8 * fabs(xr[i]) + 0x1p-8 * fabs(x0[i]);
        double q = d / tol;
        if (!(q <= 1.0) && bad++ < 5)
            fprintf(stderr, "  x[%zu] (row %zu): per-op %g persistent %g, tolerance %g\n", i, i / s->C, xr[i], xp[i], tol);
        if (!(q <= worst)) worst = q;
        same += xr[i] == xp[i];
        l2d += d * d;
        l2r += (double)xr[i] * xr[i];
    }
    double alnq = codes_agree(&r.lnq, &p.lnq), ahq = codes_agree(&r.hq, &p.hq), anq = codes_agree(&r.nq, &p.nq);
    int ok = worst <= 1.0 && alnq >= 0.99 && ahq >= 0.99 && anq >= 0.99;
    printf("check %s M=%d (splits o %d, gate|up %d, down %d): x worst error / tolerance %.3f, bit-equal %.4f, rel L2 "
           "%.2e; FP8 codes equal: lnq %.4f, hq %.4f, nq %.4f: %s\n",
           s->name, M, plan.a.g[0].ks, plan.a.g[1].ks, plan.a.g[2].ks, worst, (double)same / xr.size(), sqrt(l2d / l2r), alnq,
           ahq, anq, ok ? "ok" : "FAILED");
    return ok;
}

// Timing: `layers` distinct layers (weights rotated over more than the 50 MB L2), each path recorded
// as one CUDA graph over all of them and replayed, as the decode step is.
static int trace_blocks;  // --trace-blocks N: the traced launches on N blocks (rows > blocks: a second row each)
static void bench(const Shape *s, int M, int sms, float *part, unsigned *sync, int layers) {
    std::vector<Layer> L(layers);
    for (int l = 0; l < layers; l++) layer_make(&L[l], s, 100 + l);
    Acts t;
    acts_alloc(&t, s, M);
    bf16 *ab;
    cudaCheck(cudaMalloc(&ab, (size_t)M * s->A * 2));
    fill_normal_bf16(ab, (size_t)M * s->A, 21);
    fp8_quantize_cuda(&t.aq, ab, DT_BF16, 0);
    fill_normal_bf16(t.x, (size_t)M * s->C, 22);
    std::vector<PdPlan> plans(layers);
    for (int l = 0; l < layers; l++) plan_make(&plans[l], &t, &L[l], s, M, part, sync, sms);
    enum { NV = 8 };
    cudaGraphExec_t ge[1 + NV];
    for (int path = 0; path < 1 + NV; path++) {
        cudaGraph_t g;
        cudaCheck(cudaStreamBeginCapture(cu_stream(), cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < layers; l++) {
            if (path == 0) per_op(&t, &L[l], s, M);
            else {
                PdPlan v = plans[l];
                v.a.variant = path - 1;
                pd_launch(&v);
            }
        }
        cudaCheck(cudaStreamEndCapture(cu_stream(), &g));
        cudaCheck(cudaGraphInstantiate(&ge[path], g, 0));
        cudaGraphDestroy(g);
    }
    double ms[1 + NV];
    // launched on the legacy default stream, where time_interleaved records its events (the capture
    // needed the backend's own stream)
    time_interleaved([&](int k, int) { cudaCheck(cudaGraphLaunch(ge[k], 0)); }, 1 + NV, 1, 1, ms);
    for (int v = 1; v < NV; v++)
        printf("  variant %d (%s%s%s): %.2f us a half layer, %.2fx per-op\n", v, v & 1 ? "one fencing thread, " : "",
               v & 2 ? "no W across phases, " : "", v & 4 ? "idle producer sleeps 2 us" : "", ms[1 + v] * 1e3 / layers,
               ms[0] / ms[1 + v]);
    // where one launch's time goes: every block's marks, the last layer's launch after the others
    unsigned long long *tr;
    cudaCheck(cudaMalloc(&tr, (size_t)sms * PD_MARKS * 8));
    const int traced[3] = {1, 5, 7};
    for (int vi = 0; vi < 3; vi++) {
        int variant = traced[vi];
        PdPlan last = plans[layers - 1];
        last.a.trace = tr;
        last.a.variant = variant;
        if (trace_blocks) last.blocks = trace_blocks;
        for (int l = 0; l + 1 < layers; l++) pd_launch(&plans[l]);
        pd_launch(&last);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<unsigned long long> h((size_t)sms * PD_MARKS);
        cudaCheck(cudaMemcpy(h.data(), tr, h.size() * 8, cudaMemcpyDeviceToHost));
        unsigned long long t0 = ~0ull;
        int nbk = last.blocks;
        for (int b = 0; b < nbk; b++) t0 = std::min(t0, h[(size_t)b * PD_MARKS]);
        static const char *mark[PD_MARKS] = {"start", "G0 o done", "R1 may start", "R1 norm done", "G2 gate|up done",
                                             "R3 may start", "R3 SwiGLU done", "G4 down done", "R5 may start", "R5 norm done",
                                             "G0 counted", "G2 counted", "G4 counted", "R1 2nd row start"};
        printf("  one launch (%s M=%d, variant %d), us since the first block started: earliest / mean / latest block\n",
               s->name, M, variant);
        for (int k = 0; k < PD_MARKS; k++) {
            double lo = 1e30, hi = 0, sum = 0;
            int n = 0;
            for (int b = 0; b < nbk; b++) {
                if (k == 13 && (b >= M - nbk || b >= M)) continue;  // only blocks with a second row
                double v = (h[(size_t)b * PD_MARKS + k] - t0) * 1e-3;
                lo = std::min(lo, v); hi = std::max(hi, v); sum += v; n++;
            }
            if (n) printf("  %-16s %7.2f %7.2f %7.2f\n", mark[k], lo, sum / n, hi);
        }
    }
    cudaFree(tr);
    {  // the row phases alone (after the traced launch: its partials are in part)
        PdPlan last = plans[layers - 1];
        cudaCheck(cudaFuncSetAttribute(norm_rows_alone_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, PD_SMEM));
        cudaCheck(cudaFuncSetAttribute(swiglu_alone_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, PD_SMEM));
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        float ms[3];
        for (int k = 0; k < 3; k++) {
            for (int rep = 0; rep < 2; rep++) {  // a warm-up pass, then the timed one
                cudaCheck(cudaEventRecord(e0, cu_stream()));
                for (int i = 0; i < 200; i++) {
                    if (k == 0) norm_rows_alone_kernel<<<M, PD_THREADS, PD_SMEM, cu_stream()>>>(last.a);
                    else if (k == 1) swiglu_alone_kernel<<<last.blocks, PD_THREADS, PD_SMEM, cu_stream()>>>(last.a);
                    else empty_kernel<<<last.blocks, PD_THREADS, 0, cu_stream()>>>();
                }
                cudaCheck(cudaEventRecord(e1, cu_stream()));
                cudaCheck(cudaEventSynchronize(e1));
                cudaCheck(cudaEventElapsedTime(&ms[k], e0, e1));
            }
        }
        launchCheck();
        printf("  the row phases alone, launched back to back (us a launch): add + norm (R5, %d blocks) %.2f, SwiGLU (R3, "
               "%d blocks) %.2f, an empty kernel %.2f\n", M, ms[0] * 5, last.blocks, ms[1] * 5, ms[2] * 5);
    }
    double bytes = (double)s->C * s->A + 2.0 * s->FF * s->C + (double)s->C * s->FF;  // FP8 weights of the half layer
    double floor_us = bytes / 3.35e12 * 1e6;
    printf("bench %s M=%d, %d layers: per-op %.2f us a half layer (%.2f TB/s), persistent %.2f us (%.2f TB/s): %.2fx; "
           "floor (the weights at 3.35 TB/s) %.2f us: per-op %.2fx, persistent %.2fx the floor\n",
           s->name, M, layers, ms[0] * 1e3 / layers, bytes * layers / (ms[0] * 1e-3) / 1e12, ms[1] * 1e3 / layers,
           bytes * layers / (ms[1] * 1e-3) / 1e12, ms[0] / ms[1], floor_us, ms[0] * 1e3 / layers / floor_us,
           ms[1] * 1e3 / layers / floor_us);
}

int main(int argc, char **argv) {
    const Shape shapes[2] = {{1024, 3072, 2048, "0.6b"}, {4096, 12288, 4096, "8b"}};
    const char *only = NULL;
    int rows = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--trace-blocks") && i + 1 < argc) trace_blocks = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--shape 0.6b|8b] [--rows M <= 64]\n", argv[0]); return 2; }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);  // each line as it comes, also when a hang is killed
    char why[256];
    if (!backend_cuda(why, sizeof why)) { fprintf(stderr, "decode_persistent: no CUDA backend: %s\n", why); return 1; }
    if (!hopper_ready(why, sizeof why)) { fprintf(stderr, "decode_persistent: %s\n", why); return 1; }
    int sms;
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaCheck(cudaFuncSetAttribute(decode_half_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, PD_SMEM));
    int per_sm = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_half_kernel, PD_THREADS, PD_SMEM));
    if (per_sm < 1) { fprintf(stderr, "decode_persistent: the kernel does not fit on an SM\n"); return 1; }
    float *part;
    unsigned *sync;
    size_t part_floats = (size_t)64 * 2 * 12288 * 8;  // ks * M * N for every shape here (checked below)
    cudaCheck(cudaMalloc(&part, part_floats * 4));
    cudaCheck(cudaMalloc(&sync, PH_N * sizeof(unsigned)));
    cudaCheck(cudaMemset(sync, 0, PH_N * sizeof(unsigned)));
    int fails = 0;
    for (int k = 0; k < 2; k++) {
        const Shape *s = &shapes[k];
        if (only && strcmp(only, s->name)) continue;
        const int Ns[3] = {s->C, 2 * s->FF, s->C}, Ks[3] = {s->A, s->C, s->FF};
        for (int g = 0; g < 3; g++)
            if ((size_t)choose_splits(Ns[g] / 128, Ks[g] / 128, sms, 64) * 64 * Ns[g] > part_floats) {
                fprintf(stderr, "decode_persistent: the partials of %s do not fit\n", s->name);
                return 1;
            }
        int Ms[3] = {1, 7, 64};
        for (int j = 0; j < 3; j++)
            if (!rows || rows == Ms[j]) fails += !check_case(s, Ms[j], sms, part, sync);
        if (rows && rows != 1 && rows != 7 && rows != 64) fails += !check_case(s, rows, sms, part, sync);
        double half_bytes = (double)s->C * s->A + 3.0 * s->FF * s->C;
        int layers = (int)ceil(3 * 50e6 / half_bytes);
        bench(s, rows ? rows : 64, sms, part, sync, layers < 4 ? 4 : layers);
    }
    printf("%s\n", fails ? "FAILED" : "all checks passed");
    return fails ? 1 : 0;
}
