// dev/cuda/fp8_gemm_v6_persistent.cu: version 6 of the FP8 GEMM, Y[M,N] = X[M,K] W[N,K]^T (Hopper, sm_90a):
// persistent, with split promotion and a TMA-store epilogue; 128 x 128 tiles.
// What it adds over version 5:
// - persistent grid: one block per SM walks the tiles (blockIdx.x, + gridDim.x, ...) in groups of 8
//   tile rows, column by column within a group, so that the blocks running at once share X and W
//   tiles in L2; the producer runs ahead into the next tile while the consumers store the last one;
//   the walk advances by subtraction, not two integer divisions a tile (dev/RESULTS.md, session 8);
// - split promotion: each K step is issued as two halves of the tile's columns (m64n64k32 wgmmas, L
//   and R, each its own commit group), and L is promoted while R's wgmmas still run, so the CUDA-core
//   promotion does not leave the tensor cores waiting on this warpgroup (session 4);
// - the epilogue (bf16, Y =): registers -> 128-byte-swizzled shared memory (stmatrix) -> TMA stores,
//   which clip rows >= M and columns >= N; f32 or Y += goes straight from registers. Row scaling's
//   scales reach shared memory by cp.async at the tile's start, so the epilogue has no load latency.
// This is the old template's BN = 128 instantiation (48caab8's fp8.cu, gemm_fp8_v6_kernel): with 128
// x 128 tiles neither the K steps in pairs nor the stagger of the consumers paid (pairs +2 to +10%,
// stagger +1 to +10% at 8192x4096x4096; session 5), so this version has neither; version 7 has both.
// Measured (H100): session 1 (before the split promotion and the walk), M = 8192: block 920-1008
// TFLOP/s (0.81-0.97x cuBLASLt), tensor 963-1168, row 920-1053 (dev/RESULTS.md "Hopper wgmma
// kernel"); the split promotion -1 to -2% cycles (session 4), the walk -1 to -6% (session 8), then
// ncu cycles at 8192x4096x4096 368 / 389 / 403k (tensor / row / block) against cuBLASLt's ~315 /
// 316 / 348k (sessions 6-8), and under the power cap 0.88-0.91x cuBLASLt at 8192x1024x3072 (session
// 6, --ab). Until the redesign fp8.cu chose it over version 7 by shape (fewer than 8 tiles of 128 x
// 192 per SM, or N < 3072), which mattered only where cuBLASLt declines a product (AUTO's fallback)
// or with the kernel backend forced; the product now keeps version 7 alone (fp8_hopper.cu).
// 230,496 B of shared memory (tensor; row 232,032 with its scales), 202,832 B (block).
// The versions after it: 7 and 8 (fp8_hopper.cu, what the program runs); the history is
// dev/cuda/README.md.
//
//   make -C dev GPU_ARCH=90a ../build/fp8_gemm_v6_persistent && ../build/fp8_gemm_v6_persistent [M N K] [--gran ...] [--validate]
// Needs an sm_90a GPU and build (says so and exits 1 otherwise); E4M3 x E4M3, K % 16 == 0.
#include "common.cuh"

#define V6_BM 128
#define V6_BN 128
#define V6_TILE_X (V6_BM * WG_BK)  // bytes of one stage of X (16 KiB)
#define V6_TILE_W (V6_BN * WG_BK)  // of W (16 KiB)
#define V6_GROUP_M 8               // tile rows per group of the persistent tile order
#define V6_SC 256                  // floats of block scales per stage: sx of the 128 rows, then sw
#define V6_SCALE_WARPS 2           // producer warps staging block scales, taking the K steps in turn
// per granularity: stages (as many as fit in 227 KiB), bytes of block scales per stage, of the bf16
// output staging, floats of row scales per consumer (sx of its 64 rows, sw of the 128 columns), in all
template <int GRAN>
struct V6Cfg {
    static constexpr int STAGES = GRAN == FP8_BLOCK ? 5 : 6;
    static constexpr int SC = GRAN == FP8_BLOCK ? V6_SC * 4 : 0;
    static constexpr int EPI = V6_BM * V6_BN * 2;
    static constexpr int RSC = GRAN == FP8_ROW ? 64 + V6_BN : 0;
    static constexpr int SMEM = STAGES * (V6_TILE_X + V6_TILE_W + SC) + EPI + 2 * RSC * 4 + 2 * STAGES * 8 + 1024;
};
static_assert(V6Cfg<FP8_BLOCK>::SMEM <= 232448 && V6Cfg<FP8_ROW>::SMEM <= 232448, "over the 227 KiB of a block");

// the producer thread: all K steps of one tile into the stage ring (stage, phase carry over tiles)
template <int GRAN>
__device__ __forceinline__ void v6_produce_tile(const CUtensorMap *tmx, const CUtensorMap *tmw, uint8_t *xs, uint8_t *ws,
                                                uint64_t *full, uint64_t *empty, int &stage, int &phase, int m0, int n0,
                                                int KB) {
    constexpr int S = V6Cfg<GRAN>::STAGES;
    for (int kb = 0; kb < KB; kb++) {
        mbar_wait(&empty[stage], phase ^ 1);                  // the consumers released it (at once the first round)
        mbar_expect_tx(&full[stage], V6_TILE_X + V6_TILE_W);  // whole boxes count, the zero-filled parts too
        tma_load_2d(xs + stage * V6_TILE_X, tmx, &full[stage], kb * WG_BK, m0);
        tma_load_2d(ws + stage * V6_TILE_W, tmw, &full[stage], kb * WG_BK, n0);
        if (++stage == S) { stage = 0; phase ^= 1; }
    }
}

// Block scaling: two warps of the producer warpgroup stage each K step's scales in shared memory
// next to its tiles (sx of the tile's 128 rows, then sw of its weight block), taking even and odd
// steps in turn (`step` counts over tiles), and arrive on the stage's full barrier (32 arrivals).
__device__ __forceinline__ void v6_produce_scales(const GemmArgs &a, float *sc, uint64_t *full, uint64_t *empty, int &stage,
                                                  int &phase, int &step, int which, int m0, int n0, int KB) {
    constexpr int S = V6Cfg<FP8_BLOCK>::STAGES;
    int lane = threadIdx.x & 31;
    for (int kb = 0; kb < KB; kb++, step++) {
        if (step % V6_SCALE_WARPS == which) {
            float v[4], w = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int r = m0 + 4 * lane + j;
                v[j] = r < a.M ? __ldg(a.sx + (size_t)kb * a.M + r) : 0.0f;
            }
            if (lane == 0) w = __ldg(a.sw + (size_t)(n0 / FP8_BLOCK_SIZE) * a.ldsw + kb);
            mbar_wait(&empty[stage], phase ^ 1);
            float *d = sc + stage * V6_SC;
            *(float4 *)(d + 4 * lane) = make_float4(v[0], v[1], v[2], v[3]);
            if (lane == 0) d[128] = w;
            mbar_arrive(&full[stage]);  // release: the consumers' wait on full sees the stores
        }
        if (++stage == S) { stage = 0; phase ^= 1; }
    }
}

// acc += p * (f0 for the thread's row r, f1 for r + 8), for the N / 4 column groups (8 columns each)
// of p, the tile's groups from `first` on (the accumulator layout: hopper.cuh, wgmma_m64n128k32_e4m3)
template <int N>
__device__ __forceinline__ void v6_promote(float (&acc)[V6_BN / 2], const float (&p)[N], int first, float f0, float f1) {
#pragma unroll
    for (int j = 0; j < N / 4; j++) {
        int i = first + j;
        acc[4 * i + 0] += p[4 * j + 0] * f0;
        acc[4 * i + 1] += p[4 * j + 1] * f0;
        acc[4 * i + 2] += p[4 * j + 2] * f1;
        acc[4 * i + 3] += p[4 * j + 3] * f1;
    }
}

// One consumer warpgroup (c = 0, 1: rows m0 + 64c ..) over all K steps of one tile: acc gets the
// promoted fp32 sum (block scales applied; tensor / row scales not yet). Each step as two halves of
// the tile's columns (L: 0-63, R: 64-127), each its own commit group: wait for L only, promote it
// while R's wgmmas run, then wait for R, release the stage, promote R.
template <int GRAN>
__device__ __forceinline__ void v6_consume_tile(float (&acc)[V6_BN / 2], const uint8_t *xs, const uint8_t *ws, const float *sc,
                                                uint64_t *full, uint64_t *empty, int &stage, int &phase, int c, int KB) {
    constexpr int S = V6Cfg<GRAN>::STAGES;
    constexpr int H = V6_BN / 2;                // columns of a half step
    constexpr uint64_t RIGHT = H * WG_BK >> 4;  // descriptor offset of rows H.. of the W tile
    int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, rl = c * 64 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int i = 0; i < V6_BN / 2; i++) acc[i] = 0.0f;
    for (int kb = 0; kb < KB; kb++) {
        mbar_wait(&full[stage], phase);
        float f0 = 1.0f, f1 = 1.0f;
        if (GRAN == FP8_BLOCK) {
            const float *d = sc + stage * V6_SC;
            f0 = d[rl] * d[128];
            f1 = d[rl + 8] * d[128];
        }
        uint64_t da = wg_desc(xs + stage * V6_TILE_X + c * 64 * WG_BK), db = wg_desc(ws + stage * V6_TILE_W);
        float pl[H / 2], pr[H / 2];
        wgmma_fence();
        wg_issue<H>(pl, da, db);
        wg_issue<H>(pr, da, db + RIGHT);
        wgmma_wait<1>();
        fence_regs(pl);
        v6_promote(acc, pl, 0, f0, f1);
        wgmma_wait<0>();
        fence_regs(pr);
        if (lane == 0) mbar_arrive(&empty[stage]);  // this warp is done with the stage
        if (++stage == S) { stage = 0; phase ^= 1; }
        v6_promote(acc, pr, H / 8, f0, f1);
    }
}

// The scales the epilogue multiplies by, fetched before the main loop so that their latency hides
// behind it. Tensor: sx sw in registers. Row: sx of this warpgroup's 64 rows and sw of the tile's
// columns, copied into shared memory (rsc) by cp.async (loaded in the epilogue, between its stores,
// they cost row scaling 0.6x at K = 1024).
template <int GRAN>
__device__ __forceinline__ void v6_epi_scales(float (&fr)[2], float *rsc, const GemmArgs &a, int m0, int n0) {
    int tid = threadIdx.x & 127;
    if (GRAN == FP8_TENSOR) fr[0] = fr[1] = __ldg(a.sx) * __ldg(a.sw);
    if (GRAN == FP8_ROW) {
        if (tid < 64) cp_async4(rsc + tid, a.sx + min(m0 + tid, a.M - 1), m0 + tid < a.M);
        for (int j = tid; j < V6_BN; j += 128) cp_async4(rsc + 64 + j, a.sw + min(n0 + j, a.N - 1), n0 + j < a.N);
        cp_async_commit();
    }
}

// the epilogue straight from registers (f32, or Y +=): the thread's rows r0 and r0 + 8
template <typename T, int GRAN>
__device__ __forceinline__ void v6_store_direct(T *y, const GemmArgs &a, const float (&acc)[V6_BN / 2], int r0, int n0) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < V6_BN / 8; i++)
#pragma unroll
        for (int v = 0; v < 4; v++) {
            int m = r0 + (v >= 2 ? 8 : 0), n = n0 + 8 * i + 2 * (lane & 3) + (v & 1);
            if (m >= a.M || n >= a.N) continue;
            float val = GRAN == FP8_BLOCK ? acc[4 * i + v] : acc[4 * i + v] * (sx_at(a, m, 0) * sw_at(a, n, 0));
            store_out(y, a, m, n, val);
        }
}

// The epilogue through shared memory: this warpgroup's 64 x 128 bf16 block as 2 boxes of 64 x 64 in
// TMA's 128-byte swizzle, then one thread issues the TMA stores. stmatrix writes four 8 x 8 bf16
// matrices an instruction (column groups i and i + 1, rows 0-7 and 8-15 of the warp: exactly the
// accumulator's fragments), lane l giving the address of row l % 8 of matrix l / 8: conflict-free,
// since the swizzle puts a matrix's 8 rows of 16 bytes in 8 different chunks.
template <int GRAN>
__device__ __forceinline__ void v6_store_tma(const CUtensorMap *tmy, uint8_t *ys, const GemmArgs &a,
                                             const float (&acc)[V6_BN / 2], const float (&fr)[2], const float *rsc, int m0,
                                             int n0, int c) {
    int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) bulk_wait_read0();          // the previous tile's stores have read the buffer
    if (GRAN == FP8_ROW) cp_async_wait<0>();  // this thread's row scales have landed (the barrier: everyone's)
    named_bar_sync(1 + c, 128);
    float s0 = GRAN == FP8_BLOCK ? 1.0f : fr[0], s1 = GRAN == FP8_BLOCK ? 1.0f : fr[1];  // block: applied already
    // row: the thread's sx and sw, all read before the first stmatrix (whose "memory" clobber would
    // otherwise leave each read's latency between two stores: +10% cycles at K = 1024)
    float2 w[GRAN == FP8_ROW ? V6_BN / 8 : 1];
    if (GRAN == FP8_ROW) {
        int rl = warp * 16 + (lane >> 2);
        s0 = rsc[rl]; s1 = rsc[rl + 8];
#pragma unroll
        for (int g = 0; g < V6_BN / 8; g++) w[g] = *(const float2 *)(rsc + 64 + 8 * g + 2 * (lane & 3));
    }
    int srow = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), scol = lane >> 4;
#pragma unroll
    for (int i = 0; i < V6_BN / 8; i += 2) {
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
        for (int h = 0; h < V6_BN / 64; h++)
            if (n0 + 64 * h < a.N) tma_store_2d(tmy, ys + 8192 * h, n0 + 64 * h, m0);
        bulk_commit();
    }
}

// A block's walk through the persistent tile order: groups of V6_GROUP_M tile rows, column by column
// within a group; the block takes tiles blockIdx.x, + gridDim.x, ... The position (group g, rank r in
// it) advances by subtraction; only a last, partial group of tile rows divides.
struct V6TileWalk {
    int g, r, per_group, mblocks;
    __device__ V6TileWalk(int t, int mblocks_, int nblocks) : mblocks(mblocks_) {
        per_group = V6_GROUP_M * nblocks;
        g = t / per_group;
        r = t - g * per_group;
    }
    __device__ void tile(int &mb, int &nb) const {
        static_assert(V6_GROUP_M == 8, "the full-group path below shifts by 3");
        int first = g * V6_GROUP_M, rows = min(mblocks - first, V6_GROUP_M);
        if (rows == V6_GROUP_M) { mb = first + (r & 7); nb = r >> 3; }
        else { mb = first + r % rows; nb = r / rows; }
    }
    __device__ void next(int step) {
        for (r += step; r >= per_group; g++) r -= per_group;
    }
};

// TMA_OUT: the bf16 epilogue through shared memory and TMA stores (Y =, 16-byte output rows)
template <typename T, int GRAN, bool TMA_OUT>
__global__ void __launch_bounds__(384, 1)
    gemm_fp8_v6_kernel(T *y, const GemmArgs a, const __grid_constant__ CUtensorMap tmx,
                       const __grid_constant__ CUtensorMap tmw, const __grid_constant__ CUtensorMap tmy) {
#ifdef FP8_SM90A
    using Cfg = V6Cfg<GRAN>;
    constexpr int S = Cfg::STAGES;
    extern __shared__ uint8_t smem_raw[];
    // 128-byte swizzle: 1 KiB aligned. Offsetting smem_raw (not casting through an integer) keeps the
    // pointer in the shared space: LDS/STS, not generic LD/ST
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint8_t *xs = smem;                      // [stage][128 rows][128 B]
    uint8_t *ws = xs + S * V6_TILE_X;        // [stage][128 rows][128 B]
    uint8_t *ys = ws + S * V6_TILE_W;        // [consumer][2 boxes][64 rows][64 bf16]
    float *rsc = (float *)(ys + Cfg::EPI);   // [consumer][64 + 128] row scales (row scaling)
    float *sc = rsc + 2 * Cfg::RSC;          // [stage][V6_SC] block scales (block scaling)
    uint64_t *full = (uint64_t *)((uint8_t *)sc + S * Cfg::SC), *empty = full + S;
    int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    int mblocks = cdiv(a.M, V6_BM), nblocks = cdiv(a.N, V6_BN), tiles = mblocks * nblocks, KB = cdiv(a.K, WG_BK);
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
        if (tid == 0 || (GRAN == FP8_BLOCK && warp >= 1 && warp <= V6_SCALE_WARPS)) {
            V6TileWalk walk(blockIdx.x, mblocks, nblocks);
            for (int t = blockIdx.x; t < tiles; t += gridDim.x, walk.next(gridDim.x)) {
                int mb, nb;
                walk.tile(mb, nb);
                if (tid == 0) v6_produce_tile<GRAN>(&tmx, &tmw, xs, ws, full, empty, stage, phase, mb * V6_BM, nb * V6_BN, KB);
                else v6_produce_scales(a, sc, full, empty, stage, phase, step, warp - 1, mb * V6_BM, nb * V6_BN, KB);
            }
        }
    } else {  // consumers
        setmaxnreg_inc<232>();
        int c = wg - 1, lane = tid & 31, warp = tid >> 5;
        float acc[V6_BN / 2], fr[2];
        float *my_rsc = rsc + c * Cfg::RSC;
        V6TileWalk walk(blockIdx.x, mblocks, nblocks);
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, walk.next(gridDim.x)) {
            int mb, nb;
            walk.tile(mb, nb);
            int m0 = mb * V6_BM, n0 = nb * V6_BN, r0 = m0 + 64 * c + 16 * warp + (lane >> 2);
            if (TMA_OUT) v6_epi_scales<GRAN>(fr, my_rsc, a, m0 + 64 * c, n0);
            v6_consume_tile<GRAN>(acc, xs, ws, sc, full, empty, stage, phase, c, KB);
            if (TMA_OUT) v6_store_tma<GRAN>(&tmy, ys + c * (Cfg::EPI / 2), a, acc, fr, my_rsc, m0 + 64 * c, n0, c);
            else v6_store_direct<T, GRAN>(y, a, acc, r0, n0);
        }
        if (TMA_OUT && tid == 0) bulk_wait0();
    }
#endif
}

template <int GRAN, bool TMA_OUT>
static void launch_v6_g(bf16 *y, const GemmArgs &a) {
    static int attr_set = 0;  // per instantiation
    auto kern = gemm_fp8_v6_kernel<bf16, GRAN, TMA_OUT>;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, V6Cfg<GRAN>::SMEM));
        attr_set = 1;
    }
    CUtensorMap tx = tma_map_2d(a.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.M, a.K, V6_BM, WG_BK);
    CUtensorMap tw = tma_map_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.N, a.K, V6_BN, WG_BK);
    CUtensorMap ty = TMA_OUT ? tma_map_2d(y, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.M, a.N, 64, 64) : tx;
    int tiles = cdiv(a.M, V6_BM) * cdiv(a.N, V6_BN), sms = num_sms(), grid = tiles < sms ? tiles : sms;
    kern<<<grid, 384, V6Cfg<GRAN>::SMEM>>>(y, a, tx, tw, ty);
    launchCheck();
}
template <bool TMA_OUT>
static void launch_v6_t(bf16 *y, const GemmArgs &a) {
    if (a.gran == FP8_BLOCK) launch_v6_g<FP8_BLOCK, TMA_OUT>(y, a);
    else if (a.gran == FP8_ROW) launch_v6_g<FP8_ROW, TMA_OUT>(y, a);
    else launch_v6_g<FP8_TENSOR, TMA_OUT>(y, a);
}
static void launch_v6(bf16 *y, const GemmArgs &a) {
    // the TMA-store epilogue needs Y = (not +=), 16-byte output rows and pointer
    if (!a.accumulate && a.N % 8 == 0 && ptr_align(y) >= 16) launch_v6_t<true>(y, a);
    else launch_v6_t<false>(y, a);
}

int main(int argc, char **argv) {
    GemmVersion v = {"fp8_gemm_v6_persistent", "v6",
                     "version 6 (sm_90a): persistent, split promotion, TMA-store epilogue, 128 x 128 tiles", ACC_TC, 1, 16,
                     launch_v6};
    return gemm_version_main(argc, argv, v);
}
