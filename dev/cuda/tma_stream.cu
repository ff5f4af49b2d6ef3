// dev/cuda/tma_stream.cu: how fast can a Hopper GPU stream an FP8 weight matrix into shared memory,
// by the access pattern? The question behind the decode GEMM (M = 64): both cuBLASLt and
// fp8_hopper.cu's decode kernel read W at ~2.2 TB/s where BF16 cuBLAS reads ~2.57 (dev/notes/decode.md),
// and without loading W the decode kernel's time drops by 40%. No math here: each block only
// streams its share of W (N x K bytes, row-major as Hugging Face stores it) through a 4-stage ring of
// 16 KB, and a consumer warp releases each stage as it lands.
//   make -C dev ../build/tma_stream && ./build/tma_stream [N K]      (default 24576 4096: 8B gate|up)
// Patterns:
//   tile128x128  the decode kernel's: a block per 128-row tile, boxes of 128 rows x 128 B down K
//                (128-byte swizzle), two blocks an SM (192 blocks for the default: 1.45 a SM)
//   tile64x256   a block per 64-row tile, boxes of 64 rows x 256 B (no swizzle): twice the
//                contiguous bytes per row
//   balanced     tile128x128's boxes, but 2 blocks per SM each taking an equal run of the (tile,
//                K step) boxes in order (stream-K's split): the same bytes on every SM
//   contiguous   16 KB bulk copies of consecutive memory, equal runs per block: W as if stored
//                tile by tile (the ceiling of a re-laid-out weight)
#include <cuda.h>

#include "cuda/cuda_common.cuh"
#include "cuda/hopper.cuh"

#define STAGES 4
#define STAGE_BYTES 16384
#define L2_ROTATE (50ull << 20)  // the H100's L2: each launch reads a copy of W not in it

enum { TILE128, TILE64x256, BALANCED, CONTIGUOUS, NPAT };
static const char *NAMES[NPAT] = {"tile128x128", "tile64x256", "balanced", "contiguous"};

__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

// box u of block blockIdx.x (of nb boxes in all: pattern-specific order), loaded into stage buffer dst
template <int PAT>
__device__ __forceinline__ void load_box(uint8_t *dst, const CUtensorMap *map, const uint8_t *w, uint64_t *bar, long u,
                                         int K) {
    if (PAT == CONTIGUOUS) bulk_load(dst, w + u * STAGE_BYTES, STAGE_BYTES, bar);
    else if (PAT == TILE64x256) {
        int ks = K / 256;
        tma_load_2d(dst, map, bar, (int)(u % ks) * 256, (int)(u / ks) * 64);
    } else {
        int ks = K / 128;
        tma_load_2d(dst, map, bar, (int)(u % ks) * 128, (int)(u / ks) * 128);
    }
}

template <int PAT>
__global__ void __launch_bounds__(64) stream_kernel(const __grid_constant__ CUtensorMap map, const uint8_t *w, long nbox,
                                                    int K, int *sink) {
#ifdef FP8_SM90A
    extern __shared__ uint8_t smem_raw[];
    uint8_t *buf = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    __shared__ uint64_t full[STAGES], empty[STAGES];
    long b0, b1;  // this block's boxes
    if (PAT == TILE128 || PAT == TILE64x256) {
        long per = nbox / gridDim.x;  // a tile's K steps
        b0 = blockIdx.x * per;
        b1 = b0 + per;
    } else {
        b0 = nbox * blockIdx.x / gridDim.x;
        b1 = nbox * (blockIdx.x + 1) / gridDim.x;
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 1); }
        mbar_fence_init();
    }
    __syncthreads();
    int acc = 0;
    if (threadIdx.x == 0) {  // producer
        for (long u = b0, i = 0; u < b1; u++, i++) {
            int stage = (int)(i % STAGES), phase = (int)((i / STAGES) & 1);
            mbar_wait(&empty[stage], phase ^ 1);
            mbar_expect_tx(&full[stage], STAGE_BYTES);
            load_box<PAT>(buf + stage * STAGE_BYTES, &map, w, &full[stage], u, K);
        }
    } else if (threadIdx.x == 32) {  // consumer: touch a byte of each stage, release it
        for (long u = b0, i = 0; u < b1; u++, i++) {
            int stage = (int)(i % STAGES), phase = (int)((i / STAGES) & 1);
            mbar_wait(&full[stage], phase);
            acc += buf[stage * STAGE_BYTES + (int)(i & 1023)];
            mbar_arrive(&empty[stage]);
        }
        if (acc == 0x7fffffff) *sink = acc;  // never: keeps the reads
    }
#endif
}

static CUtensorMap map_of(const void *w, int N, int K, int box_rows, int box_bytes, CUtensorMapSwizzle sw) {
    CUtensorMap m;
    cuuint64_t dim[2] = {(cuuint64_t)K, (cuuint64_t)N}, stride[1] = {(cuuint64_t)K};
    cuuint32_t box[2] = {(cuuint32_t)box_bytes, (cuuint32_t)box_rows}, es[2] = {1, 1};
    CUresult r = tma_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)w, dim, stride, box, es,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) die("cuTensorMapEncodeTiled: CUresult %d", (int)r);
    return m;
}

int main(int argc, char **argv) {
    int N = argc > 2 ? atoi(argv[1]) : 24576, K = argc > 2 ? atoi(argv[2]) : 4096;
    if (N % 128 || K % 256) die("tma_stream: N must be a multiple of 128 and K of 256 (got %d x %d)", N, K);
    int dev, sms, cc;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaCheck(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev));
    if (cc != 9) die("tma_stream: needs a Hopper GPU (sm_90a build)");
    size_t bytes = (size_t)N * K;
    int copies = (int)((3ull * L2_ROTATE + bytes - 1) / bytes) + 1;  // rotate past the L2
    uint8_t *w;
    cudaCheck(cudaMalloc(&w, bytes * copies));
    cudaCheck(cudaMemset(w, 0x11, bytes * copies));
    int *sink;
    cudaCheck(cudaMalloc(&sink, 4));
    size_t smem = STAGES * STAGE_BYTES + 1024;
    printf("tma_stream: W %d x %d FP8 (%.1f MB), %d SMs, %d copies rotated\n", N, K, bytes / 1e6, sms, copies);
    printf("| pattern | blocks | us | GB/s |\n| --- | --- | --- | --- |\n");
    for (int p = 0; p < NPAT; p++) {
        long nbox = (long)(bytes / STAGE_BYTES);
        int grid = p == TILE128 ? N / 128 : p == TILE64x256 ? N / 64 : 2 * sms;
        void (*k)(const CUtensorMap, const uint8_t *, long, int, int *) =
            p == TILE128 ? stream_kernel<TILE128> : p == TILE64x256 ? stream_kernel<TILE64x256>
                                                  : p == BALANCED   ? stream_kernel<BALANCED>
                                                                    : stream_kernel<CONTIGUOUS>;
        cudaCheck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        float best = 1e30f, t;
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        for (int it = 0; it < 30; it++) {
            const uint8_t *wi = w + (size_t)(it % copies) * bytes;
            CUtensorMap m = p == TILE64x256 ? map_of(wi, N, K, 64, 256, CU_TENSOR_MAP_SWIZZLE_NONE)
                                            : map_of(wi, N, K, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B);
            cudaCheck(cudaEventRecord(e0));
            k<<<grid, 64, smem>>>(m, wi, nbox, K, sink);
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            cudaCheck(cudaEventElapsedTime(&t, e0, e1));
            if (it >= 3 && t < best) best = t;
        }
        launchCheck();
        printf("| %s | %d | %.1f | %.0f |\n", NAMES[p], grid, best * 1e3, bytes / (best * 1e-3) / 1e9);
    }
    cudaFree(w);
    return 0;
}
