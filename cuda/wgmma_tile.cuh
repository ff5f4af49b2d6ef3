// wgmma_tile.cuh: the parts of a warp-specialized Hopper GEMM kernel (TMA + wgmma, 128-row tiles, a
// producer warpgroup and two consumer warpgroups of 64 rows each) that do not depend on how the
// consumers multiply and promote: the producer's TMA loop and block-scale staging, the persistent
// tile walk, and the two epilogues (from registers; through shared memory and TMA stores).
// Templated on the tile width BN and the ring's STAGES: fp8_hopper.cu's wgmma kernel runs them at
// BN = 192, dev/cuda's versions 4-6 at 128. The accumulator layout they read is wgmma's
// (hopper.cuh, wgmma_m64n128k32_e4m3): thread t holds, for column group i (8 columns), rows
// 16 (t / 32) + (t % 32) / 4 and + 8 of the warpgroup's 64, columns 8i + 2 (t % 4) + 0/1.
#ifndef WGMMA_TILE_CUH
#define WGMMA_TILE_CUH

#include "cuda/fp8_gemm.cuh"
#include "cuda/hopper.cuh"

#define WG_BM 128          // tile rows: two consumer warpgroups of 64
#define WG_GROUP_M 8       // tile rows per group of the persistent tile order
#define WG_SC 256          // floats of block scales per stage: sx of the 128 rows, sw of up to 2 weight blocks
#define WG_SCALE_WARPS 2   // producer warps staging block scales, taking the K steps in turn (3: up to +4% cycles)

// the producer thread: all K steps of one tile into the ring of STAGES stages (X: 128 rows, W: BN rows
// of 128 bytes each), each guarded by a full and an empty mbarrier
template <int BN, int STAGES>
__device__ __forceinline__ void wg_produce_tile(const CUtensorMap *tmx, const CUtensorMap *tmw, uint8_t *xs, uint8_t *ws,
                                                uint64_t *full, uint64_t *empty, int &stage, int &phase, int m0, int n0,
                                                int KB) {
    for (int kb = 0; kb < KB; kb++) {
        mbar_wait(&empty[stage], phase ^ 1);                 // the consumers released it (at once the first round)
        mbar_expect_tx(&full[stage], WG_BM * WG_BK + BN * WG_BK);  // whole boxes count, the zero-filled parts too
        tma_load_2d(xs + stage * WG_BM * WG_BK, tmx, &full[stage], kb * WG_BK, m0);
        tma_load_2d(ws + stage * BN * WG_BK, tmw, &full[stage], kb * WG_BK, n0);
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
    }
}

// Block scaling: two warps of the producer warpgroup stage each K step's scales (WG_SC floats a stage)
// in shared memory next to its tiles (sx of the tile's 128 rows, then sw of the weight block of column
// n0 and, BN > 128, of the next one: a 192-wide tile straddles two), taking the K steps in turn (step
// counts on across tiles; `which` is the warp's turn), and arrive on the stage's full barrier (32
// arrivals) after their stores. (Loaded by the consumers instead, they cost 35%: the
// multiply by the scales then sat between the wgmmas, waiting on one scoreboard with the next step's
// loads.)
template <int BN, int STAGES>
__device__ __forceinline__ void wg_produce_scales(const GemmArgs &a, float *sc, uint64_t *full, uint64_t *empty, int &stage,
                                                  int &phase, int &step, int which, int m0, int n0, int KB) {
    constexpr int NW = BN > 128 ? 2 : 1;  // weight blocks a tile touches
    int lane = threadIdx.x & 31, nbw = n0 / FP8_BLOCK_SIZE;
    int wblock = lane == 1 && (nbw + 1) * FP8_BLOCK_SIZE < a.N ? nbw + 1 : nbw;
    for (int kb = 0; kb < KB; kb++, step++) {
        if (step % WG_SCALE_WARPS == which) {
            float v[4], w = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int r = m0 + 4 * lane + j;
                v[j] = r < a.M ? __ldg(a.sx + (size_t)kb * a.M + r) : 0.0f;
            }
            if (lane < NW) w = __ldg(a.sw + (size_t)wblock * a.ldsw + kb);
            mbar_wait(&empty[stage], phase ^ 1);
            float *d = sc + stage * WG_SC;
            *(float4 *)(d + 4 * lane) = make_float4(v[0], v[1], v[2], v[3]);
            if (lane < NW) d[128 + lane] = w;
            mbar_arrive(&full[stage]);  // release: the consumers' wait on full sees the stores
        }
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
    }
}

// The scales the epilogue multiplies by, fetched before the main loop so that their latency hides
// behind it. Tensor: sx sw in registers. Row: sx of this warpgroup's 64 rows and sw of the tile's
// columns, copied into shared memory (rsc) by cp.async: no registers held through the main loop
// (there are none to spare), no load latency between the epilogue's stores.
template <int GRAN, int BN>
__device__ __forceinline__ void wg_epi_scales(float (&fr)[2], float *rsc, const GemmArgs &a, int m0, int n0) {
    int tid = threadIdx.x & 127;
    if (GRAN == FP8_TENSOR) fr[0] = fr[1] = __ldg(a.sx) * __ldg(a.sw);
    if (GRAN == FP8_ROW) {
        if (tid < 64) cp_async4(rsc + tid, a.sx + min(m0 + tid, a.M - 1), m0 + tid < a.M);
        for (int j = tid; j < BN; j += 128) cp_async4(rsc + 64 + j, a.sw + min(n0 + j, a.N - 1), n0 + j < a.N);
        cp_async_commit();
    }
}

// epilogue straight from registers (f32, or Y +=): the thread's rows r0 and r0 + 8
template <typename T, int GRAN, int BN>
__device__ __forceinline__ void wg_store_direct(T *y, const GemmArgs &a, const float (&acc)[BN / 2], int r0, int n0) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < BN / 8; i++)
#pragma unroll
        for (int v = 0; v < 4; v++) {
            int m = r0 + (v >= 2 ? 8 : 0), n = n0 + 8 * i + 2 * (lane & 3) + (v & 1);
            if (m >= a.M || n >= a.N) continue;
            float val = GRAN == FP8_BLOCK ? acc[4 * i + v] : acc[4 * i + v] * (sx_at(a, m, 0) * sw_at(a, n, 0));
            store_out(y, a, m, n, val);
        }
}

// Epilogue through shared memory: this warpgroup's 64 x BN bf16 block as BN / 64 boxes of 64 x 64 in TMA's
// 128-byte swizzle, then one thread issues the TMA stores. stmatrix writes four 8 x 8 bf16 matrices
// an instruction (column groups i and i + 1, rows 0-7 and 8-15 of the warp: exactly the accumulator's
// fragments), lane l giving the address of row l % 8 of matrix l / 8: conflict-free, since the
// swizzle puts a matrix's 8 rows of 16 bytes in 8 different chunks.
template <int GRAN, int BN>
__device__ __forceinline__ void wg_store_tma(const CUtensorMap *tmy, uint8_t *ys, const GemmArgs &a,
                                             const float (&acc)[BN / 2], const float (&fr)[2], const float *rsc, int m0,
                                             int n0, int c) {
    int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) bulk_wait_read0();          // the previous tile's stores have read the buffer
    if (GRAN == FP8_ROW) cp_async_wait<0>();  // this thread's row scales have landed (the barrier: everyone's)
    named_bar_sync(1 + c, 128);
    float s0 = GRAN == FP8_BLOCK ? 1.0f : fr[0], s1 = GRAN == FP8_BLOCK ? 1.0f : fr[1];  // block: applied already
    // row: the thread's sx and sw, all read before the first stmatrix (whose "memory" clobber would
    // otherwise leave each read's latency between two stores: +10% cycles at K = 1024)
    float2 w[GRAN == FP8_ROW ? BN / 8 : 1];
    if (GRAN == FP8_ROW) {
        int rl = warp * 16 + (lane >> 2);
        s0 = rsc[rl]; s1 = rsc[rl + 8];
#pragma unroll
        for (int g = 0; g < BN / 8; g++) w[g] = *(const float2 *)(rsc + 64 + 8 * g + 2 * (lane & 3));
    }
    int srow = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), scol = lane >> 4;
#pragma unroll
    for (int i = 0; i < BN / 8; i += 2) {
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
        for (int h = 0; h < BN / 64; h++)
            if (n0 + 64 * h < a.N) tma_store_2d(tmy, ys + 8192 * h, n0 + 64 * h, m0);
        bulk_commit();
    }
}

// A block's walk through the persistent tile order: groups of WG_GROUP_M tile rows, column by column
// within a group; the block takes tiles blockIdx.x, + gridDim.x, ... The position (group g, rank r in
// it) advances by subtraction: computing it from scratch takes two integer divisions, a ~25-
// instruction dependent chain each at every tile start (1-3% of the cycles at K = 1024).
struct WgTileWalk {
    int g, r, per_group, mblocks;
    __device__ WgTileWalk(int t, int mblocks_, int nblocks) : mblocks(mblocks_) {
        per_group = WG_GROUP_M * nblocks;
        g = t / per_group;
        r = t - g * per_group;
    }
    __device__ void tile(int &mb, int &nb) const {
        static_assert(WG_GROUP_M == 8, "the full-group path below shifts by 3");
        int first = g * WG_GROUP_M, rows = min(mblocks - first, WG_GROUP_M);
        if (rows == WG_GROUP_M) { mb = first + (r & 7); nb = r >> 3; }
        else { mb = first + r % rows; nb = r / rows; }
    }
    __device__ void next(int step) {
        for (r += step; r >= per_group; g++) r -= per_group;
    }
};

#endif  // WGMMA_TILE_CUH
