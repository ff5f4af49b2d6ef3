// dev/cuda/fp8_gemm_v1_naive.cu: version 1 of the FP8 GEMM, Y[M,N] = X[M,K] W[N,K]^T, the naive one.
// One thread per output: it walks its row of X and its row of W, decodes each code with the cvt
// instruction (fp8_decode_dev), and sums in fp32; for block scaling each 128-wide K step gets its own
// partial sum, promoted with sx[m, kb] * sw[n / 128, kb] (DeepSeek-V3), for tensor / row scaling the
// scales multiply once at the end. It is fp8_gemm_cpu on the GPU, and the truth the faster versions
// were first checked against.
// Measured: nothing worth recording (dev/notes/gemm.md has no figure for it); it exists to be obviously
// right. The versions after it: 2 (dev/cuda/fp8_gemm_v2_tiled.cu), 3 (fp8.cu: mma.sync, the portable
// kernel the program runs), 4-6 (dev/cuda/), 7 and 8 (fp8_hopper.cu); the history is dev/cuda/README.md.
//
//   make -C dev ../build/fp8_gemm_v1_naive && ../build/fp8_gemm_v1_naive [M N K] [--gran tensor|row|block|all] [--validate]
// Validates against fp8_gemm_cpu, then times it against cuBLASLt (dev/cuda/common.cuh); any GPU.
#include "common.cuh"

template <typename T>
__global__ void gemm_fp8_v1_kernel(T *y, GemmArgs a) {
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= a.N) return;
    const uint8_t *xr = a.x + (size_t)m * a.K, *wr = a.w + (size_t)n * a.K;
    float acc = 0.0f;
    for (int k0 = 0, kb = 0; k0 < a.K; k0 += FP8_BLOCK_SIZE, kb++) {
        float part = 0.0f;
        for (int k = k0; k < min(k0 + FP8_BLOCK_SIZE, a.K); k++) part += fp8_decode_dev(xr[k], a.fx) * fp8_decode_dev(wr[k], a.fw);
        acc += a.gran == FP8_BLOCK ? part * (sx_at(a, m, kb) * sw_at(a, n, kb)) : part;
    }
    if (a.gran != FP8_BLOCK) acc *= sx_at(a, m, 0) * sw_at(a, n, 0);
    store_out(y, a, m, n, acc);
}

static void launch_v1(bf16 *y, const GemmArgs &a) {
    gemm_fp8_v1_kernel<bf16><<<dim3(cdiv(a.N, 256), a.M), 256>>>(y, a);
    launchCheck();
}

int main(int argc, char **argv) {
    GemmVersion v = {"fp8_gemm_v1_naive", "v1", "version 1, naive: one thread per output, fp32 sums", ACC_FP32, 0, 1, launch_v1};
    return gemm_version_main(argc, argv, v);
}
