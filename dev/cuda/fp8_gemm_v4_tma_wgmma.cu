// dev/cuda/fp8_gemm_v4_tma_wgmma.cu: version 4 of the FP8 GEMM, Y[M,N] = X[M,K] W[N,K]^T: the simplest
// Hopper (sm_90a) kernel, TMA + wgmma with one warpgroup.
// What it adds over version 3 (fp8.cu's mma.sync kernel): the Hopper way of feeding the tensor
// cores. On sm_90 the FP8 mma.sync of version 3 is emulated (the codes widened to f16, HMMA at f16
// rate: 145-290 TFLOP/s on the H100); the FP8 rate is reached only through wgmma, which reads its
// operands from shared memory through matrix descriptors, fed by the TMA copy engine. One warpgroup
// (128 threads) computes a 64 x 128 tile; thread 0 loads each 128-wide K step of X (64 x 128 B) and
// W (128 x 128 B) with TMA into one of two stages (128-byte swizzle, completing on an mbarrier); all
// threads wait on the stage's mbarrier, run 4 wgmma.m64n128k32 into a fresh accumulator, wait for
// them, promote it into the fp32 sum (acc += part * sx sw for block scaling: DeepSeek-V3; acc += part
// for tensor / row, scaled at the end), and meet at __syncthreads before the stage is reused. Only
// the load of the next K step overlaps the math: the promotion and the wgmmas of the one warpgroup
// never overlap, and the tensor cores idle while it waits.
// Measured (H100, dev/notes/gemm.md "Hopper wgmma kernel"): block scaling at M = 8192, 502-647 TFLOP/s
// (0.46-0.60x cuBLASLt), 335 at K = 1024; correct on its first run, 3x version 3. 134-138 registers,
// 50,192 B of shared memory, 4 QGMMA.64x128x32 a step. The versions after it: 5 and 6 (dev/cuda/),
// 7 and 8 (fp8_hopper.cu, what the program runs); the history is dev/cuda/README.md.
//
//   make -C dev GPU_ARCH=90a ../build/fp8_gemm_v4_tma_wgmma && ../build/fp8_gemm_v4_tma_wgmma [M N K] [--gran tensor|row|block|all] [--validate]
// Needs an sm_90a GPU and build (says so and exits 1 otherwise); E4M3 x E4M3, K % 16 == 0.
#include "common.cuh"

#define V4_BM 64
#define V4_BN 128
#define V4_SMEM (2 * (V4_BM + V4_BN) * WG_BK + 16 + 1024)  // two stages, two mbarriers, 1 KiB alignment

template <typename T, int GRAN>
__global__ void __launch_bounds__(128)
    gemm_fp8_v4_kernel(T *y, const GemmArgs a, const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw) {
#ifdef FP8_SM90A
    extern __shared__ uint8_t smem_raw[];
    uint8_t *xs = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // [2][64][128 B], 1 KiB aligned
    uint8_t *ws = xs + 2 * V4_BM * WG_BK;                                       // [2][128][128 B]
    uint64_t *full = (uint64_t *)(ws + 2 * V4_BN * WG_BK);
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int m0 = blockIdx.y * V4_BM, n0 = blockIdx.x * V4_BN, KB = cdiv(a.K, WG_BK);
    int r0 = m0 + warp * 16 + (lane >> 2), r1 = r0 + 8;
    if (tid == 0) { mbar_init(&full[0], 1); mbar_init(&full[1], 1); mbar_fence_init(); }
    __syncthreads();
    auto load = [&](int kb) {
        int s = kb & 1;
        mbar_expect_tx(&full[s], (V4_BM + V4_BN) * WG_BK);
        tma_load_2d(xs + s * V4_BM * WG_BK, &tmx, &full[s], kb * WG_BK, m0);
        tma_load_2d(ws + s * V4_BN * WG_BK, &tmw, &full[s], kb * WG_BK, n0);
    };
    if (tid == 0) load(0);
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    for (int kb = 0; kb < KB; kb++) {
        if (tid == 0 && kb + 1 < KB) load(kb + 1);  // its stage was released by the last __syncthreads
        float s0 = 1.0f, s1 = 1.0f;
        if (GRAN == FP8_BLOCK) {
            float sb = a.sw[(size_t)(n0 / FP8_BLOCK_SIZE) * a.ldsw + kb];
            s0 = r0 < a.M ? a.sx[(size_t)kb * a.M + r0] * sb : 0.0f;
            s1 = r1 < a.M ? a.sx[(size_t)kb * a.M + r1] * sb : 0.0f;
        }
        mbar_wait(&full[kb & 1], (kb >> 1) & 1);
        wg_kstep<128>(part, wg_desc(xs + (kb & 1) * V4_BM * WG_BK), wg_desc(ws + (kb & 1) * V4_BN * WG_BK));
#pragma unroll
        for (int i = 0; i < 16; i++) {
            acc[4 * i + 0] += part[4 * i + 0] * s0;
            acc[4 * i + 1] += part[4 * i + 1] * s0;
            acc[4 * i + 2] += part[4 * i + 2] * s1;
            acc[4 * i + 3] += part[4 * i + 3] * s1;
        }
        __syncthreads();
    }
    wg_store_direct<T, GRAN, V4_BN>(y, a, acc, r0, n0);
#endif
}

template <int GRAN>
static void launch_v4_g(bf16 *y, const GemmArgs &a) {
    static int attr_set = 0;  // per instantiation
    auto kern = gemm_fp8_v4_kernel<bf16, GRAN>;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, V4_SMEM));
        attr_set = 1;
    }
    CUtensorMap tx = tma_map_2d(a.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.M, a.K, V4_BM, WG_BK);
    CUtensorMap tw = tma_map_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.N, a.K, V4_BN, WG_BK);
    dim3 grid(cdiv(a.N, V4_BN), cdiv(a.M, V4_BM));
    kern<<<grid, 128, V4_SMEM>>>(y, a, tx, tw);
    launchCheck();
}
static void launch_v4(bf16 *y, const GemmArgs &a) {
    if (a.gran == FP8_BLOCK) launch_v4_g<FP8_BLOCK>(y, a);
    else if (a.gran == FP8_ROW) launch_v4_g<FP8_ROW>(y, a);
    else launch_v4_g<FP8_TENSOR>(y, a);
}

int main(int argc, char **argv) {
    GemmVersion v = {"fp8_gemm_v4_tma_wgmma", "v4",
                     "version 4 (sm_90a): TMA + wgmma, one warpgroup, 64 x 128 tiles, two stages", ACC_TC, 1, 16, launch_v4};
    return gemm_version_main(argc, argv, v);
}
