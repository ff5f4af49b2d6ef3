// fp8_hopper.cu: the two Hopper (sm_90a) FP8 GEMM kernels the program runs where they beat cuBLASLt.
//   defines: hopper_probe, hopper_supported, hopper_wgmma_preferred / hopper_decode_preferred (AUTO's
//   rules), hopper_wgmma_gemm, hopper_decode_gemm (fp8_gemm.cuh); fp8.cu's fp8_gemm_cuda calls them.
// Read fp8.cu's mma.sync kernel first: the same product, Y[M,N] = X[M,K] W[N,K]^T with both operands
// K-major, and the same promotion of block-scaled partial sums; here it is fed the Hopper way.
// Their history (versions 1, 2, 4, 5, 6 as standalone files) is in dev/cuda/, their measurements in
// dev/notes/gemm.md.
//
// Why Hopper needs its own kernel: on sm_90 the FP8 mma.sync is emulated (widened to f16 HMMA, a
// fraction of the FP8 rate); the FP8 tensor-core rate is reached only through wgmma, which reads
// its operands from shared memory through "matrix descriptors", fed by the TMA copy engine
// (cp.async.bulk.tensor) completing on mbarriers (the instructions: hopper.cuh).
//
// 1. The wgmma kernel (dev/cuda/ holds the versions that led to it). AUTO runs it at K <= 1024 on
//    large products, where its tiles keep every SM busy and it is faster than cuBLASLt at every
//    granularity; elsewhere cuBLASLt is as fast or faster and runs instead.
//    - Output tile 128 (M) x 192 (N); K step 128 = one scale block = one 128-byte row of codes.
//    - 384 threads = 3 warpgroups. Warpgroup 0 produces: one thread issues two TMA loads per K step
//      (X 128 x 128 B, W 192 x 128 B) into a ring of 4 stages, each guarded by a "full" mbarrier (the
//      bytes landed) and an "empty" one (the 8 consumer warps are done reading); for block scaling two
//      more of its warps copy the step's scales into the stage. Warpgroups 1 and 2 consume, 64 output
//      rows each; setmaxnreg gives the producer 40 registers a thread and the consumers 232.
//    - A consumer multiplies each K step with wgmma.m64n96k32 into a FRESH fp32 accumulator, then
//      promotes it into its running fp32 sum on the CUDA cores: acc += part * sx[row, kb] * sw[n/128, kb]
//      for block scaling (DeepSeek-V3: every 128-wide step has its own scales), acc += part for
//      tensor / row scaling (their scales multiply once, in the epilogue). The promotion also bounds
//      the tensor cores' reduced-precision accumulation (~14 bits) to one K step, as cuBLASLt does
//      with fast accumulation off.
//    - The promotion is CUDA-core work the tensor cores must not wait for. So each step is issued as
//      two halves of the tile's columns (L, R: 96 each), each its own commit group, and L is promoted
//      while R still runs; the steps go in pairs (a, b) pipelined as issue La Ra | promote La, issue
//      Lb | promote Ra, issue Rb | promote Lb | promote Rb, so a warpgroup drains its wgmmas once per
//      two steps. For tensor / row scaling the second warpgroup starts two steps after the first
//      (STAGGER), so one's promotion and epilogue overlap the other's wgmmas.
//    - Persistent: one block per SM walks the tiles, 8 tile rows at a time, so the blocks running at
//      once share X and W tiles in L2; the producer runs ahead into the next tile while the consumers
//      store the last one.
//    - Epilogue (bf16, Y =): registers -> 128-byte-swizzled shared memory (stmatrix) -> TMA store,
//      which clips rows >= M and columns >= N. f32 or Y += goes straight from registers.
//    - Any M, N (TMA zero-fills the parts of a box outside the tensor) and K % 16 == 0 (TMA needs
//      16-byte rows; a partial last K step is zero-padded).
// 2. The decode kernel, for M <= 64: a decode step multiplies a few dozen tokens by every weight
//    once, so its time is the time to stream W. One 64 x 128 output tile per block and K split over a
//    thread-block cluster of up to 8 blocks, summed through distributed shared memory: more SMs read W
//    than cuBLASLt's 128-wide tiles keep busy at a decode step's widths.
#include <cooperative_groups.h>
#include <cudaTypedefs.h>

#include "cuda/wgmma_tile.cuh"

namespace cg = cooperative_groups;

// ----------------------------------------------------------------------------
// 1. the wgmma kernel

#define WG_BN 192
#define WG_TILE_X (WG_BM * WG_BK)  // bytes of one stage of X (16 KiB)
#define WG_TILE_W (WG_BN * WG_BK)  // of W (24 KiB)
#define WG_STAGES 4                // as many as fit in 227 KiB beside the epilogue's staging
#define WG_BAR_STAGGER 3           // named barrier of the consumers' stagger
// shared memory per granularity: block scales per stage, row scales per consumer (sx of its 64 rows,
// sw of the tile's 192 columns), the bf16 output staging, the barriers and 1 KiB of alignment
template <int GRAN>
struct WgCfg {
    static constexpr int SC = GRAN == FP8_BLOCK ? WG_SC * 4 : 0;
    static constexpr int EPI = WG_BM * WG_BN * 2;
    static constexpr int RSC = GRAN == FP8_ROW ? 64 + WG_BN : 0;
    static constexpr int SMEM = WG_STAGES * (WG_TILE_X + WG_TILE_W + SC) + EPI + 2 * RSC * 4 + 2 * WG_STAGES * 8 + 1024;
};
static_assert(WgCfg<FP8_BLOCK>::SMEM <= 232448 && WgCfg<FP8_ROW>::SMEM <= 232448, "over the 227 KiB of a block");

// The multipliers of one K step's promotion for a thread's rows r (f0) and r + 8 (f1): of columns
// 0-63 (a), 64-127 (m) and 128-191 (b). Block scaling: sx of the row times sw of the column's weight
// block, from the stage's staged scales; a tile starting 64 past a 128 boundary (odd tiles) has its
// second weight block from column 64 on (mid_b). Tensor / row scaling: 1.
struct WgScales { float a0, a1, m0, m1, b0, b1; };
template <int GRAN>
__device__ __forceinline__ WgScales wg_step_scales(const float *sc, int stage, int rl, bool mid_b) {
    WgScales s = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    if (GRAN == FP8_BLOCK) {
        const float *d = sc + stage * WG_SC;
        float x0 = d[rl], x1 = d[rl + 8], wa = d[128], wb = d[129];
        s.a0 = x0 * wa; s.a1 = x1 * wa;
        s.b0 = x0 * wb; s.b1 = x1 * wb;
    }
    s.m0 = mid_b ? s.b0 : s.a0; s.m1 = mid_b ? s.b1 : s.a1;
    return s;
}

// acc += p * the scale of its rows and columns, for the N / 4 column groups (8 columns each) of p,
// the tile's groups from `first` on (the accumulator layout: hopper.cuh, wgmma_m64n128k32_e4m3)
template <int N>
__device__ __forceinline__ void wg_promote(float (&acc)[WG_BN / 2], const float (&p)[N], int first, const WgScales &s) {
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

// One consumer warpgroup (c = 0, 1: rows m0 + 64c ..) over all K steps of one tile: acc gets the
// promoted fp32 sum (block scales applied; tensor / row scales not yet), pipelined as the top of the
// file says. With tensor / row scaling the tile's first step accumulates straight into acc (nothing
// to scale), which spares zeroing acc and promoting that step (2-4% of the cycles); it is a peeled
// first pair, not a branch in the loop, because wgmma registers chosen at run time make ptxas
// serialize every wgmma (C7520), as does a wgmma chain across the loop's back edge (C7514).
// STAGGER = d > 0: warpgroup 1 starts its first step once warpgroup 0 has done d steps.
template <int GRAN, int STAGGER>
__device__ __forceinline__ void wg_consume_tile(float (&acc)[WG_BN / 2], const uint8_t *xs, const uint8_t *ws,
                                                const float *sc, uint64_t *full, uint64_t *empty, int &stage, int &phase,
                                                int n0, int c, int KB, bool first_tile) {
    constexpr int H = WG_BN / 2;                        // columns of a half step
    constexpr uint64_t RIGHT = H * WG_BK >> 4;          // descriptor offset of rows H.. of the W tile
    constexpr bool FIRST_INTO_ACC = GRAN != FP8_BLOCK;
    int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, rl = c * 64 + warp * 16 + (lane >> 2);
    bool mid_b = n0 % FP8_BLOCK_SIZE != 0;
    auto release = [&]() {  // this warp is done with the stage: next stage
        if (lane == 0) mbar_arrive(&empty[stage]);
        if (++stage == WG_STAGES) { stage = 0; phase ^= 1; }
    };
    auto x_desc = [&](int st) { return wg_desc(xs + st * WG_TILE_X + c * 64 * WG_BK); };
    // the second step of a pair (stage + 1), issued while the first's right half ra still runs:
    // issue Lb | promote ra (unless ra is acc's own) | issue Rb | promote Lb, Rb
    auto pair_second = [&](float(&pl)[H / 2], float(&pr)[H / 2], float(&ra)[H / 2], bool promote_a, const WgScales &s) {
        int st = stage + 1 == WG_STAGES ? 0 : stage + 1, ph = stage + 1 == WG_STAGES ? phase ^ 1 : phase;
        mbar_wait(&full[st], ph);
        WgScales s2 = wg_step_scales<GRAN>(sc, st, rl, mid_b);
        uint64_t da2 = x_desc(st), db2 = wg_desc(ws + st * WG_TILE_W);
        wgmma_fence();
        wg_issue<H>(pl, da2, db2);
        wgmma_wait<1>();
        fence_regs(ra);
        release();
        if (promote_a) wg_promote(acc, ra, H / 8, s);
        wgmma_fence();
        wg_issue<H>(pr, da2, db2 + RIGHT);
        wgmma_wait<1>();
        fence_regs(pl);
        wg_promote(acc, pl, 0, s2);
        wgmma_wait<0>();
        fence_regs(pr);
        release();
        wg_promote(acc, pr, H / 8, s2);
    };
    int kb = 0;
    if constexpr (FIRST_INTO_ACC) {  // the first step's halves are acc's own two halves
        float(&al)[H / 2] = *reinterpret_cast<float(*)[H / 2]>(&acc[0]);
        float(&ar)[H / 2] = *reinterpret_cast<float(*)[H / 2]>(&acc[H / 2]);
        mbar_wait(&full[stage], phase);
        WgScales s = wg_step_scales<GRAN>(sc, stage, rl, mid_b);
        if (STAGGER && first_tile && c == 1) named_bar_sync(WG_BAR_STAGGER, 256);
        uint64_t da = x_desc(stage), db = wg_desc(ws + stage * WG_TILE_W);
        wgmma_fence();
        wg_issue<H>(al, da, db);
        wg_issue<H>(ar, da, db + RIGHT);
        wgmma_wait<1>();
        fence_regs(al);
        if (KB > 1) {
            float pl[H / 2], pr[H / 2];
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
        for (int i = 0; i < WG_BN / 2; i++) acc[i] = 0.0f;
    }
    while (kb < KB) {
        const int kb0 = kb;
        mbar_wait(&full[stage], phase);
        WgScales s = wg_step_scales<GRAN>(sc, stage, rl, mid_b);
        if (STAGGER && first_tile && c == 1 && kb == 0) named_bar_sync(WG_BAR_STAGGER, 256);
        uint64_t da = x_desc(stage), db = wg_desc(ws + stage * WG_TILE_W);
        float pl[H / 2], pr[H / 2];
        wgmma_fence();
        wg_issue<H>(pl, da, db);
        wg_issue<H>(pr, da, db + RIGHT);
        wgmma_wait<1>();
        fence_regs(pl);
        wg_promote(acc, pl, 0, s);
        if (kb + 1 < KB) {
            pair_second(pl, pr, pr, true, s);
            kb++;
        } else {
            wgmma_wait<0>();
            fence_regs(pr);
            release();
            wg_promote(acc, pr, H / 8, s);
        }
        kb++;
        if (STAGGER && first_tile && c == 0 && kb0 < STAGGER && kb >= min(STAGGER, KB))
            named_bar_arrive(WG_BAR_STAGGER, 256);
    }
}

// TMA_OUT: the bf16 epilogue through shared memory and TMA stores (Y =, 16-byte output rows)
template <typename T, int GRAN, bool TMA_OUT>
__global__ void __launch_bounds__(384, 1)
    gemm_fp8_wgmma_kernel(T *y, const GemmArgs a, const __grid_constant__ CUtensorMap tmx,
                          const __grid_constant__ CUtensorMap tmw, const __grid_constant__ CUtensorMap tmy) {
#ifdef FP8_SM90A
    using Cfg = WgCfg<GRAN>;
    // with block scaling the stagger did not pay (+2 to +8% cycles): each step is scaled anyway
    constexpr int STAGGER = GRAN != FP8_BLOCK ? 2 : 0;
    extern __shared__ uint8_t smem_raw[];
    // 128-byte swizzle: 1 KiB aligned. Offsetting smem_raw (not casting through an integer) keeps the
    // pointer in the shared space: LDS/STS, not generic LD/ST
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint8_t *xs = smem;                          // [stage][128 rows][128 B]
    uint8_t *ws = xs + WG_STAGES * WG_TILE_X;    // [stage][192 rows][128 B]
    uint8_t *ys = ws + WG_STAGES * WG_TILE_W;    // [consumer][3 boxes][64 rows][64 bf16]
    float *rsc = (float *)(ys + Cfg::EPI);       // [consumer][64 + 192] row scales (row scaling)
    float *sc = rsc + 2 * Cfg::RSC;              // [stage][WG_SC] block scales (block scaling)
    uint64_t *full = (uint64_t *)((uint8_t *)sc + WG_STAGES * Cfg::SC), *empty = full + WG_STAGES;
    int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    int mblocks = cdiv(a.M, WG_BM), nblocks = cdiv(a.N, WG_BN), tiles = mblocks * nblocks, KB = cdiv(a.K, WG_BK);
    if (threadIdx.x == 0) {
        // full: the TMA thread's arrival (+ bytes), and for block scaling a scale warp's 32
        for (int s = 0; s < WG_STAGES; s++) { mbar_init(&full[s], GRAN == FP8_BLOCK ? 33 : 1); mbar_init(&empty[s], 8); }
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
                if (tid == 0) wg_produce_tile<WG_BN, WG_STAGES>(&tmx, &tmw, xs, ws, full, empty, stage, phase, mb * WG_BM, nb * WG_BN, KB);
                else wg_produce_scales<WG_BN, WG_STAGES>(a, sc, full, empty, stage, phase, step, warp - 1, mb * WG_BM, nb * WG_BN, KB);
            }
        }
    } else {  // consumers
        setmaxnreg_inc<232>();
        int c = wg - 1, lane = tid & 31, warp = tid >> 5;
        float acc[WG_BN / 2], fr[2];
        float *my_rsc = rsc + c * Cfg::RSC;
        WgTileWalk walk(blockIdx.x, mblocks, nblocks);
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, walk.next(gridDim.x)) {
            int mb, nb;
            walk.tile(mb, nb);
            int m0 = mb * WG_BM, n0 = nb * WG_BN, r0 = m0 + 64 * c + 16 * warp + (lane >> 2);
            if (TMA_OUT) wg_epi_scales<GRAN, WG_BN>(fr, my_rsc, a, m0 + 64 * c, n0);
            wg_consume_tile<GRAN, STAGGER>(acc, xs, ws, sc, full, empty, stage, phase, n0, c, KB, t == (int)blockIdx.x);
            if (TMA_OUT) wg_store_tma<GRAN, WG_BN>(&tmy, ys + c * (Cfg::EPI / 2), a, acc, fr, my_rsc, m0 + 64 * c, n0, c);
            else wg_store_direct<T, GRAN, WG_BN>(y, a, acc, r0, n0);
        }
        if (TMA_OUT && tid == 0) bulk_wait0();
    }
#endif
}

// ----------------------------------------------------------------------------
// 2. the decode kernel: one 64-row tile, K split over a cluster
// - a block owns a 64 x 128 output tile (one wgmma.m64n128k32 row of warps) and a slice of K: the ks
//   blocks of one tile form a thread-block cluster (ks <= 8), as many as still let every cluster run
//   at once (decode_splits; two blocks fit on an SM);
// - warp 4 produces: its lane 0 streams the slice's K steps (X 64 x 128 B, W 128 x 128 B) through a
//   ring of 4 stages by TMA; warps 0-3 (one warpgroup) multiply each step into a fresh accumulator and
//   promote it as the wgmma kernel does (block scales staged in shared memory once, at the start: at
//   most DK_MAXSTEPS steps per block);
// - the splits are summed through distributed shared memory: each block leaves its fp32 tile in its
//   own shared memory, the cluster synchronizes, and block r adds up its 1/ks share of the tile from
//   all ks blocks in split order (the same order whichever block finishes first: results do not
//   depend on timing), then scales (row / tensor) and stores it. No workspace, no second kernel.
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
        // one K step: its 4 wgmmas into a fresh accumulator, wait, release the stage, promote. The wait
        // serializes a block's steps (the wgmmas' latency); the second block on the SM fills the gap.
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
            *(uint2 *)((bf16 *)y + (size_t)m * a.N + n) = u;
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (n + e < a.N) store_out(y, a, m, n + e, o[e]);
        }
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
#endif
}

// ----------------------------------------------------------------------------
// host side

// 1 if this build holds sm_90a code for the kernels (a plain sm_90 build compiles them empty)
__global__ void sm90a_probe_kernel(int *out) {
#ifdef FP8_SM90A
    *out = 1;
#else
    *out = 0;
#endif
}

static int hopper_on;
int hopper_enabled(void) { return hopper_on; }

int hopper_probe(int cc) {
    hopper_on = 0;
    if (cc != 90) return 0;
    int *d, h = 0;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) { cudaGetLastError(); return 0; }
    sm90a_probe_kernel<<<1, 1>>>(d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess || !h) {
        cudaGetLastError();
        fprintf(stderr, "fp8: this build has no sm_90a code (build with GPU_ARCH=90a or all): the Hopper wgmma "
                        "kernels are off, cuBLASLt and the mma.sync kernel remain\n");
        return 0;
    }
    if (!tma_encoder()) {
        fprintf(stderr, "fp8: the driver has no cuTensorMapEncodeTiled: the Hopper wgmma kernels are off\n");
        return 0;
    }
    return hopper_on = 1;
}

int hopper_supported(const GemmArgs &a, int decode, char *why, size_t cap) {
    if (!hopper_on) { snprintf(why, cap, "no sm_90a GPU and build (wgmma)"); return 0; }
    if (a.fx != FP8_E4M3 || a.fw != FP8_E4M3) { snprintf(why, cap, "the wgmma kernels multiply E4M3 by E4M3 only"); return 0; }
    if (a.K % 16) { snprintf(why, cap, "K = %d is not a multiple of 16 (TMA needs 16-byte rows)", a.K); return 0; }
    if (ptr_align(a.x) < 16 || ptr_align(a.w) < 16) { snprintf(why, cap, "operands must be 16-byte aligned for TMA"); return 0; }
    if (decode && cdiv(a.K, WG_BK) > DK_MAXSPLIT * DK_MAXSTEPS) {
        snprintf(why, cap, "K = %d is over the decode kernel's %d", a.K, DK_MAXSPLIT * DK_MAXSTEPS * WG_BK);
        return 0;
    }
    return 1;
}

// K <= 1024 (8 K steps a tile: the epilogue is a large share of a tile's time, and the stagger hides
// it better than cuBLASLt does) wherever the tiles keep the GPU busy: at least 3 a SM, and the last
// wave's and the partial tiles' share counted, (M N) / (waves x SMs x 128 x 192) >= 0.9. Below 0.9
// the idle SMs of the last wave cost more than the kernel gains (the shapes measured on each side of
// the line: dev/notes/gemm.md, "AUTO at other K = 1024 shapes").
int hopper_wgmma_preferred(int M, int N, int K, int sms) {
    long tiles = (long)cdiv(M, WG_BM) * cdiv(N, WG_BN), waves = (tiles + sms - 1) / sms;
    return K <= 1024 && tiles >= 3L * sms && (double)M * N >= 0.9 * waves * sms * WG_BM * WG_BN;
}

// K >= 2048 and M <= 64: the clusters split K, so more SMs stream W than cuBLASLt's 128-wide tiles
// keep busy, and the decode step is faster for it at every width. M <= 128 too where W is at most
// 8 MiB: the second 64-row tile reads W again, from the L2 while it is that small (larger weights at
// M <= 128 stay on cuBLASLt; at M = 256, one read of W a 64-row tile, the kernel is far slower than
// cuBLASLt). At K = 1024 there are too few steps to split and cuBLASLt is as fast or faster. The
// measurements, each shape alone and in the decode step: dev/notes/decode.md, "The decode kernel's
// rule set in the step".
int hopper_decode_preferred(int M, int N, int K) {
    return K >= 2048 && (M <= DK_BM || (M <= 2 * DK_BM && (long)N * K <= (8L << 20)));
}

template <typename T, int GRAN, bool TMA_OUT>
static void launch_wgmma(T *y, const GemmArgs &a, int sms, cudaStream_t stream) {
    static int attr_set = 0;  // per instantiation
    auto kern = gemm_fp8_wgmma_kernel<T, GRAN, TMA_OUT>;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, WgCfg<GRAN>::SMEM));
        attr_set = 1;
    }
    CUtensorMap tx = tma_map_2d(a.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.M, a.K, WG_BM, WG_BK);
    CUtensorMap tw = tma_map_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.N, a.K, WG_BN, WG_BK);
    CUtensorMap ty = TMA_OUT ? tma_map_2d(y, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.M, a.N, 64, 64) : tx;
    int tiles = cdiv(a.M, WG_BM) * cdiv(a.N, WG_BN), grid = tiles < sms ? tiles : sms;
    kern<<<grid, 384, WgCfg<GRAN>::SMEM, stream>>>(y, a, tx, tw, ty);
    launchCheck();
}
template <typename T, bool TMA_OUT>
static void launch_wgmma_g(T *y, const GemmArgs &a, int sms, cudaStream_t stream) {
    if (a.gran == FP8_BLOCK) launch_wgmma<T, FP8_BLOCK, TMA_OUT>(y, a, sms, stream);
    else if (a.gran == FP8_ROW) launch_wgmma<T, FP8_ROW, TMA_OUT>(y, a, sms, stream);
    else launch_wgmma<T, FP8_TENSOR, TMA_OUT>(y, a, sms, stream);
}
void hopper_wgmma_gemm(void *y, DType ydt, const GemmArgs &a, int sms, cudaStream_t stream) {
    // the TMA-store epilogue needs bf16, Y = (not +=), 16-byte output rows and pointer
    if (ydt == DT_BF16 && !a.accumulate && a.N % 8 == 0 && ptr_align(y) >= 16)
        launch_wgmma_g<bf16, true>((bf16 *)y, a, sms, stream);
    else if (ydt == DT_BF16) launch_wgmma_g<bf16, false>((bf16 *)y, a, sms, stream);
    else launch_wgmma_g<float, false>((float *)y, a, sms, stream);
}

// K splits ks (blocks per cluster). All of a product's blocks should run in one wave: a second,
// partial wave costs as much as the first (3 splits of 12288 x 4096 make 288 blocks where 264 fit,
// and run slower than 2). So ks is the largest (up to DK_MAXSPLIT, each block at least two K steps)
// whose clusters all fit at once (maxc[ks]: cudaOccupancyMaxActiveClusters, which knows the GPC
// limits: 30 clusters of 8 on the H100, not 132 * 2 / 8 = 33), and at least what keeps a block
// within DK_MAXSTEPS steps.
static int decode_splits(int M, int N, int K, const int *maxc) {
    int tiles = cdiv(M, DK_BM) * cdiv(N, DK_BN), KB = cdiv(K, WG_BK), ks = 1;
    for (int k = 2; k <= DK_MAXSPLIT && 2 * k <= KB; k++)
        if (tiles <= maxc[k]) ks = k;
    while (cdiv(KB, ks) > DK_MAXSTEPS) ks++;  // hopper_supported bounds this by DK_MAXSPLIT
    return ks;
}

template <typename T, int GRAN>
static void launch_decode(T *y, const GemmArgs &a, cudaStream_t stream) {
    static int attr_set = 0;  // per instantiation
    auto kern = gemm_fp8_decode_kernel<T, GRAN>;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, DK_SMEM));
        attr_set = 1;
    }
    CUtensorMap tx = tma_map_2d(a.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.M, a.K, DK_BM, WG_BK);
    CUtensorMap tw = tma_map_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.N, a.K, DK_BN, WG_BK);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(160);
    cfg.dynamicSmemBytes = DK_SMEM;
    cfg.stream = stream;
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
static void launch_decode_g(T *y, const GemmArgs &a, cudaStream_t stream) {
    if (a.gran == FP8_BLOCK) launch_decode<T, FP8_BLOCK>(y, a, stream);
    else if (a.gran == FP8_ROW) launch_decode<T, FP8_ROW>(y, a, stream);
    else launch_decode<T, FP8_TENSOR>(y, a, stream);
}
void hopper_decode_gemm(void *y, DType ydt, const GemmArgs &a, cudaStream_t stream) {
    if (ydt == DT_BF16) launch_decode_g((bf16 *)y, a, stream);
    else launch_decode_g((float *)y, a, stream);
}
