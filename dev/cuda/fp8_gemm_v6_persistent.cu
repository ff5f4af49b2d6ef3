// dev/cuda/fp8_gemm_v6_persistent.cu: version 6 of the FP8 GEMM, Y[M,N] = X[M,K] W[N,K]^T (Hopper, sm_90a):
// persistent, with split promotion and a TMA-store epilogue; 128 x 128 tiles.
// What it adds over version 5:
// - persistent grid: one block per SM walks the tiles (blockIdx.x, + gridDim.x, ...) in groups of 8
//   tile rows, column by column within a group, so that the blocks running at once share X and W
//   tiles in L2; the producer runs ahead into the next tile while the consumers store the last one;
//   the walk advances by subtraction, not two integer divisions a tile (dev/notes/gemm.md, the 21:30 runs);
// - split promotion: each K step is issued as two halves of the tile's columns (m64n64k32 wgmmas, L
//   and R, each its own commit group), and L is promoted while R's wgmmas still run, so the CUDA-core
//   promotion does not leave the tensor cores waiting on this warpgroup (the 14:03 runs);
// - the epilogue (bf16, Y =): registers -> 128-byte-swizzled shared memory (stmatrix) -> TMA stores,
//   which clip rows >= M and columns >= N; f32 or Y += goes straight from registers. Row scaling's
//   scales reach shared memory by cp.async at the tile's start, so the epilogue has no load latency.
// This is the old template's BN = 128 instantiation (48caab8's fp8.cu, gemm_fp8_v6_kernel): with 128
// x 128 tiles neither the K steps in pairs nor the stagger of the consumers paid (pairs +2 to +10%,
// stagger +1 to +10% at 8192x4096x4096; the 16:31 runs), so this version has neither; version 7 has both.
// Measured (H100; dev/notes/gemm.md, its 2026-11-22 sections named by start time): the first wgmma
// runs (before the split promotion and the walk), M = 8192: block 920-1008 TFLOP/s (0.81-0.97x
// cuBLASLt), tensor 963-1168, row 920-1053 ("Hopper wgmma kernel"); the split promotion -1 to -2%
// cycles (the 14:03 runs), the walk -1 to -6% (the 21:30 runs), then ncu cycles at 8192x4096x4096
// 368 / 389 / 403k (tensor / row / block) against cuBLASLt's ~315 / 316 / 348k (the 18:28-21:30
// runs), and under the power cap 0.88-0.91x cuBLASLt at 8192x1024x3072 (the 18:28 runs, --ab).
// Until the redesign fp8.cu chose it over version 7 by shape (fewer than 8 tiles of 128 x 192 per
// SM, or N < 3072), which mattered only where cuBLASLt declines a product (AUTO's fallback)
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
            WgTileWalk walk(blockIdx.x, mblocks, nblocks);
            for (int t = blockIdx.x; t < tiles; t += gridDim.x, walk.next(gridDim.x)) {
                int mb, nb;
                walk.tile(mb, nb);
                if (tid == 0) wg_produce_tile<V6_BN, V6Cfg<GRAN>::STAGES>(&tmx, &tmw, xs, ws, full, empty, stage, phase, mb * V6_BM, nb * V6_BN, KB);
                else wg_produce_scales<V6_BN, V6Cfg<FP8_BLOCK>::STAGES>(a, sc, full, empty, stage, phase, step, warp - 1, mb * V6_BM, nb * V6_BN, KB);
            }
        }
    } else {  // consumers
        setmaxnreg_inc<232>();
        int c = wg - 1, lane = tid & 31, warp = tid >> 5;
        float acc[V6_BN / 2], fr[2];
        float *my_rsc = rsc + c * Cfg::RSC;
        WgTileWalk walk(blockIdx.x, mblocks, nblocks);
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, walk.next(gridDim.x)) {
            int mb, nb;
            walk.tile(mb, nb);
            int m0 = mb * V6_BM, n0 = nb * V6_BN, r0 = m0 + 64 * c + 16 * warp + (lane >> 2);
            if (TMA_OUT) wg_epi_scales<GRAN, V6_BN>(fr, my_rsc, a, m0 + 64 * c, n0);
            v6_consume_tile<GRAN>(acc, xs, ws, sc, full, empty, stage, phase, c, KB);
            if (TMA_OUT) wg_store_tma<GRAN, V6_BN>(&tmy, ys + c * (Cfg::EPI / 2), a, acc, fr, my_rsc, m0 + 64 * c, n0, c);
            else wg_store_direct<T, GRAN, V6_BN>(y, a, acc, r0, n0);
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
