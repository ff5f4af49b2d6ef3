// dev/cuda/fp8_gemm_v5_warp_specialized.cu: version 5 of the FP8 GEMM, Y[M,N] = X[M,K] W[N,K]^T (Hopper,
// sm_90a): warp specialization and a deep ring.
// What it adds over version 4: the loads and the math run in different warps. 384 threads = 3
// warpgroups: warpgroup 0 produces (one thread issues the TMA loads; for block scaling two more of
// its warps stage each K step's scales in shared memory; setmaxnreg gives it 40 registers a thread),
// warpgroups 1 and 2 consume, 64 rows each of a 128 x 128 tile (setmaxnreg 232). Between them a
// ring of 6 stages (5 with the block scales beside them), each guarded by a "full" mbarrier (the
// TMA bytes landed, and the scale warp's 32 arrivals) and an "empty" one (the 8 consumer warps are
// done reading): the loads run up to 6 K steps ahead, and with two consumers one warpgroup's
// promotion overlaps the other's wgmmas. One tile per block; the epilogue stores from registers.
// Measured (H100, dev/notes/gemm.md "Hopper wgmma kernel"): block scaling at M = 8192, 643-877 TFLOP/s,
// 352 at K = 1024, where the prologue and the register epilogue of 1536 one-tile blocks dominate.
// Its first runs loaded the block scales in the consumers: 292-648 (ptxas put the multiply by the
// scales between the wgmmas, waiting on one scoreboard with the next step's loads: the producer's
// scale warps fixed that). 168 registers at launch, 40 / 232 after setmaxnreg, 197,728 B of shared
// memory (tensor / row), 170,064 B (block). The versions after it: 6 (dev/cuda/), 7 and 8
// (fp8_hopper.cu, what the program runs); the history is dev/cuda/README.md.
//
//   make -C dev GPU_ARCH=90a ../build/fp8_gemm_v5_warp_specialized && ../build/fp8_gemm_v5_warp_specialized [M N K] [--gran ...] [--validate]
// Needs an sm_90a GPU and build (says so and exits 1 otherwise); E4M3 x E4M3, K % 16 == 0.
#include "common.cuh"

#define V5_BM 128
#define V5_BN 128
#define V5_TILE_X (V5_BM * WG_BK)  // bytes of one stage of X (16 KiB)
#define V5_TILE_W (V5_BN * WG_BK)  // of W (16 KiB)
#define V5_SC 256                  // floats of block scales per stage: sx of the 128 rows, then sw
#define V5_SCALE_WARPS 2           // producer warps staging the block scales, taking the K steps in turn
// stages (as many as fit in 227 KiB), bytes of block scales per stage, in all (+ the barriers, alignment)
template <int GRAN>
struct V5Cfg {
    static constexpr int STAGES = GRAN == FP8_BLOCK ? 5 : 6;
    static constexpr int SC = GRAN == FP8_BLOCK ? V5_SC * 4 : 0;
    static constexpr int SMEM = STAGES * (V5_TILE_X + V5_TILE_W + SC) + 2 * STAGES * 8 + 1024;
};

// One consumer warpgroup (c = 0, 1: rows m0 + 64c ..) over all K steps of the tile: each step's 4
// wgmmas into a fresh accumulator, waited for, the stage released, then promoted into acc (block
// scales applied: sx of the thread's rows rl, rl + 8 times the step's sw, read before the release;
// tensor / row scales not yet).
template <int GRAN>
__device__ __forceinline__ void v5_consume_tile(float (&acc)[64], const uint8_t *xs, const uint8_t *ws, const float *sc,
                                                uint64_t *full, uint64_t *empty, int c, int KB) {
    constexpr int S = V5Cfg<GRAN>::STAGES;
    int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, rl = c * 64 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    for (int kb = 0, stage = 0, phase = 0; kb < KB; kb++) {
        mbar_wait(&full[stage], phase);
        float f0 = 1.0f, f1 = 1.0f;
        if (GRAN == FP8_BLOCK) {
            const float *d = sc + stage * V5_SC;
            f0 = d[rl] * d[128];
            f1 = d[rl + 8] * d[128];
        }
        float part[64];
        wg_kstep<V5_BN>(part, wg_desc(xs + stage * V5_TILE_X + c * 64 * WG_BK), wg_desc(ws + stage * V5_TILE_W));
        if (lane == 0) mbar_arrive(&empty[stage]);  // this warp is done with the stage
        if (++stage == S) { stage = 0; phase ^= 1; }
#pragma unroll
        for (int i = 0; i < 16; i++) {
            acc[4 * i + 0] += part[4 * i + 0] * f0;
            acc[4 * i + 1] += part[4 * i + 1] * f0;
            acc[4 * i + 2] += part[4 * i + 2] * f1;
            acc[4 * i + 3] += part[4 * i + 3] * f1;
        }
    }
}

template <typename T, int GRAN>
__global__ void __launch_bounds__(384, 1)
    gemm_fp8_v5_kernel(T *y, const GemmArgs a, const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw) {
#ifdef FP8_SM90A
    using Cfg = V5Cfg<GRAN>;
    constexpr int S = Cfg::STAGES;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *xs = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // [stage][128 rows][128 B], 1 KiB aligned
    uint8_t *ws = xs + S * V5_TILE_X;                                          // [stage][128 rows][128 B]
    float *sc = (float *)(ws + S * V5_TILE_W);                                 // [stage][V5_SC] (block scaling)
    uint64_t *full = (uint64_t *)((uint8_t *)sc + S * Cfg::SC), *empty = full + S;
    int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    int m0 = blockIdx.y * V5_BM, n0 = blockIdx.x * V5_BN, KB = cdiv(a.K, WG_BK);
    if (threadIdx.x == 0) {
        // full: the TMA thread's arrival (+ bytes), and for block scaling a scale warp's 32
        for (int s = 0; s < S; s++) { mbar_init(&full[s], GRAN == FP8_BLOCK ? 33 : 1); mbar_init(&empty[s], 8); }
        mbar_fence_init();
    }
    __syncthreads();
    int warp = tid >> 5;
    if (wg == 0) {  // producer: thread 0 the TMA loads, warps 1 and 2 the block scales
        setmaxnreg_dec<40>();
        int stage = 0, phase = 0, step = 0;  // one tile a block: the ring starts afresh
        if (tid == 0) wg_produce_tile<V5_BN, S>(&tmx, &tmw, xs, ws, full, empty, stage, phase, m0, n0, KB);
        else if (GRAN == FP8_BLOCK && warp >= 1 && warp <= V5_SCALE_WARPS)
            wg_produce_scales<V5_BN, V5Cfg<FP8_BLOCK>::STAGES>(a, sc, full, empty, stage, phase, step, warp - 1, m0, n0, KB);
    } else {  // consumers
        setmaxnreg_inc<232>();
        int c = wg - 1;
        float acc[64];
        v5_consume_tile<GRAN>(acc, xs, ws, sc, full, empty, c, KB);
        wg_store_direct<T, GRAN, V5_BN>(y, a, acc, m0 + 64 * c + 16 * warp + ((tid & 31) >> 2), n0);
    }
#endif
}

template <int GRAN>
static void launch_v5_g(bf16 *y, const GemmArgs &a) {
    static int attr_set = 0;  // per instantiation
    auto kern = gemm_fp8_v5_kernel<bf16, GRAN>;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, V5Cfg<GRAN>::SMEM));
        attr_set = 1;
    }
    CUtensorMap tx = tma_map_2d(a.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.M, a.K, V5_BM, WG_BK);
    CUtensorMap tw = tma_map_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.N, a.K, V5_BN, WG_BK);
    dim3 grid(cdiv(a.N, V5_BN), cdiv(a.M, V5_BM));
    kern<<<grid, 384, V5Cfg<GRAN>::SMEM>>>(y, a, tx, tw);
    launchCheck();
}
static void launch_v5(bf16 *y, const GemmArgs &a) {
    if (a.gran == FP8_BLOCK) launch_v5_g<FP8_BLOCK>(y, a);
    else if (a.gran == FP8_ROW) launch_v5_g<FP8_ROW>(y, a);
    else launch_v5_g<FP8_TENSOR>(y, a);
}

int main(int argc, char **argv) {
    GemmVersion v = {"fp8_gemm_v5_warp_specialized", "v5",
                     "version 5 (sm_90a): a producer and two consumer warpgroups, 128 x 128 tiles, a ring of 5-6 stages",
                     ACC_TC, 1, 16, launch_v5};
    return gemm_version_main(argc, argv, v);
}
