// dev/cuda/fp8_gemm_v2_tiled.cu: version 2 of the FP8 GEMM, Y[M,N] = X[M,K] W[N,K]^T, tiled on the
// CUDA cores.
// What it adds over version 1: shared-memory tiling. A block of 256 threads computes a 64 x 64 output
// tile, 4 x 4 outputs a thread; each 128-wide K step (one scale block) of X and W is staged in shared
// memory once for the whole block (rows padded by 4 bytes), and the codes are decoded through a
// 256-entry table per operand instead of a cvt per use. Block scaling promotes each step's partial
// sums as version 1 does. Any shape, any format pair: until the redesign fp8.cu kept it as the
// fallback for what version 3 would not take (K % 16 != 0); that case now takes the BF16 path.
// Measured (H100, dev/notes/gemm.md "FP8 GEMM", run 2): 10.2 TFLOP/s at 4096^3, block scaling: the CUDA
// cores' fp32 rate, about 1/100 of cuBLASLt's FP8. The versions after it: 3 (fp8.cu: the FP8 tensor
// cores through mma.sync), 4-6 (dev/cuda/), 7 and 8 (fp8_hopper.cu); the history is dev/cuda/README.md.
//
//   make -C dev ../build/fp8_gemm_v2_tiled && ../build/fp8_gemm_v2_tiled [M N K] [--gran tensor|row|block|all] [--validate]
// Validates against fp8_gemm_cpu, then times it against cuBLASLt (dev/cuda/common.cuh); any GPU.
#include "common.cuh"

template <typename T>
__global__ void __launch_bounds__(256) gemm_fp8_v2_kernel(T *y, GemmArgs a) {
    __shared__ uint8_t xs[64][FP8_BLOCK_SIZE + 4], ws[64][FP8_BLOCK_SIZE + 4];
    __shared__ float lutx[256], lutw[256];
    lutx[threadIdx.x] = fp8_decode_dev((uint8_t)threadIdx.x, a.fx);
    lutw[threadIdx.x] = fp8_decode_dev((uint8_t)threadIdx.x, a.fw);
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    float acc[4][4] = {}, part[4][4];
    for (int k0 = 0, kb = 0; k0 < a.K; k0 += FP8_BLOCK_SIZE, kb++) {
        __syncthreads();
        for (int i = threadIdx.x; i < 64 * FP8_BLOCK_SIZE; i += 256) {
            int r = i / FP8_BLOCK_SIZE, k = i % FP8_BLOCK_SIZE;
            bool kin = k0 + k < a.K;
            xs[r][k] = (m0 + r < a.M && kin) ? a.x[(size_t)(m0 + r) * a.K + k0 + k] : 0;
            ws[r][k] = (n0 + r < a.N && kin) ? a.w[(size_t)(n0 + r) * a.K + k0 + k] : 0;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) part[i][j] = 0.0f;
        for (int k = 0; k < FP8_BLOCK_SIZE; k++) {
            float xv[4], wv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) xv[i] = lutx[xs[ty * 4 + i][k]];
#pragma unroll
            for (int j = 0; j < 4; j++) wv[j] = lutw[ws[tx * 4 + j][k]];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) part[i][j] += xv[i] * wv[j];
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
                if (a.gran == FP8_BLOCK) {
                    float s = (m < a.M && n < a.N) ? sx_at(a, m, kb) * sw_at(a, n, kb) : 0.0f;
                    acc[i][j] += part[i][j] * s;
                } else acc[i][j] += part[i][j];
            }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
            if (m >= a.M || n >= a.N) continue;
            float v = a.gran == FP8_BLOCK ? acc[i][j] : acc[i][j] * (sx_at(a, m, 0) * sw_at(a, n, 0));
            store_out(y, a, m, n, v);
        }
}

static void launch_v2(bf16 *y, const GemmArgs &a) {
    dim3 grid(cdiv(a.N, 64), cdiv(a.M, 64));
    gemm_fp8_v2_kernel<bf16><<<grid, 256>>>(y, a);
    launchCheck();
}

int main(int argc, char **argv) {
    GemmVersion v = {"fp8_gemm_v2_tiled", "v2", "version 2: 64 x 64 tiles staged in shared memory, table decode, CUDA cores",
                     ACC_FP32, 0, 1, launch_v2};
    return gemm_version_main(argc, argv, v);
}
