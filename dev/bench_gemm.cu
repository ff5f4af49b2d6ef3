// dev/gemm_fp8.cu: the FP8 GEMM, Y[M,N] = X[M,K] W[N,K]^T, from naive to tensor cores,
// in llm.c's dev/cuda manner: the CPU reference (dev/fp8_cpu.c: fp8_gemm_cpu), numbered
// kernel versions, a validation of each against the reference, and a benchmark.
//
//   version 1  naive: one thread per output, codes decoded with the cvt instruction,
//              DeepSeek-V3 promotion per 128-wide K step for block scaling (here)
//   version 2  tiled on CUDA cores: 64x64 tiles, 128-wide K steps staged in shared memory,
//              decode through a table (fp8.cu: gemm_fp8_v2_kernel, the any-shape fallback)
//   version 3  tensor cores: mma.sync.m16n8k32 with e4m3/e5m2 operands, 128x128 tiles,
//              cp.async double buffering (fp8.cu: gemm_fp8_v3_kernel). On sm_90 this FP8
//              mma.sync is emulated (HMMA at f16 rate): 145-290 TFLOP/s on the H100
//   version 4  Hopper (sm_90a): TMA loads into 128-byte-swizzled shared memory, mbarriers,
//              wgmma.m64n128k32.e4m3 from shared-memory descriptors, one warpgroup, 64x128
//              tiles, two stages, the promotion per K step in fp32 registers (here)
//   version 5  + warp specialization: a producer warpgroup and two consumer warpgroups
//              (setmaxnreg 40 / 232), 128x128 tiles, 5-6 stages with full/empty mbarriers (here)
//   version 6  + persistent grid (one block per SM, grouped tile order), epilogue through
//              swizzled shared memory and TMA stores (fp8.cu: gemm_fp8_v6_kernel, the kernel
//              backend on sm_90a and AUTO's choice where it beats cuBLASLt)
//   version 7  version 6 with 128 x 192 tiles (wgmma m64n192k32, 4 stages): less L2 and shared
//              memory traffic per flop (fp8.cu: the same kernel, BN = 192). Both promote each
//              K step in two halves (the left while the right's wgmmas run); version 7 takes
//              the K steps in pairs and staggers its two consumer warpgroups by two steps for
//              tensor/row scaling
//   version 8  the decode kernel (M <= 64): 64 x 128 tiles, K split over a thread-block
//              cluster of up to 8 blocks, summed through distributed shared memory
//              (fp8.cu: gemm_fp8_decode_kernel, AUTO's choice for M <= 64 on sm_90a)
//   cuBLASLt   fp8.cu's fp8_gemm_cuda with the cuBLASLt backend, at each granularity
// What each version measured on the H100 is in dev/RESULTS.md ("FP8 GEMM", "Hopper wgmma
// kernel"). Versions 2, 3, 6, 7 and 8 live in fp8.cu (included below, so the benchmark times the
// code the program runs).
//
// Build and run (GPU): make bench-gemm && ./build/gemm_fp8 [--peers peers.json] [--quick] [--validate]
//   ./build/gemm_fp8 --decode   the M = 64 and 256 products of a decode step (the decode kernel, v8)
//   ./build/gemm_fp8 --lt-algos MxNxK   every algorithm cuBLASLt offers for one product, timed
//   ./build/gemm_fp8 --lt-search MxNxK ...   every configuration cuBLASLt accepts for one product, timed
//   ./build/gemm_fp8 --ab MxNxK ...   cuBLASLt against the hand-written kernel, alternating, power-capped
//   ./build/gemm_fp8 --profile MxNxK [--sustain S]   each kernel of one product twice (for ncu),
//                               then S seconds each with wall-clock spans (for nvidia-smi clocks)
//   peers.json from: python3 ../shared/bench/peers.py gemm --json peers.json (same command)
// Prints: validation, then tables (TFLOP/s, median of CUDA-event-timed runs over rotating
// buffers larger than L2), with torch._scaled_mm / torch.matmul when given, BF16 and cuBLASLt
// timed as peers.py times torch (L2 flushed before each call) against them, and FP8 as the
// program runs it against BF16 with the kernels called in turn (time_interleaved).
#include <algorithm>
#include <cjson/cJSON.h>
#include <time.h>

#include "fp8.cu"

static const FP8Gran GRANS[3] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};  // the granularities, in table order

// ----------------------------------------------------------------------------
// version 1: naive

template <typename T>
__global__ void gemm_fp8_v1_kernel(T *y, GemmArgs a) {
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= a.N) return;
    const uint8_t *xr = a.x + (size_t)m * a.K, *wr = a.w + (size_t)n * a.K;
    float acc = 0.0f;
    for (int k0 = 0, kb = 0; k0 < a.K; k0 += FP8_BLOCK_SIZE, kb++) {
        float part = 0.0f;
        for (int k = k0; k < min(k0 + FP8_BLOCK_SIZE, a.K); k++) part += decode_dev(xr[k], a.fx) * decode_dev(wr[k], a.fw);
        acc += a.gran == FP8_BLOCK ? part * (sx_at(a, m, kb) * sw_at(a, n, kb)) : part;
    }
    if (a.gran != FP8_BLOCK) acc *= sx_at(a, m, 0) * sw_at(a, n, 0);
    store_out(y, a, m, n, acc);
}
template <typename T>
static void launch_v1(T *y, const GemmArgs &a) {
    gemm_fp8_v1_kernel<T><<<dim3(cdiv(a.N, 256), a.M), 256, 0, ctx.stream>>>(y, a);
    launchCheck();
}

// ----------------------------------------------------------------------------
// version 4: Hopper, the simplest TMA + wgmma kernel (sm_90a). One warpgroup (128 threads)
// computes a 64 x 128 tile; thread 0 loads each 128-wide K step of X (64 x 128 B) and W
// (128 x 128 B) with TMA into one of two stages; all threads wait on the stage's mbarrier,
// run 4 wgmma.m64n128k32 into a fresh accumulator, wait for them, promote into the fp32 sum
// (scales as in fp8.cu's version 6) and meet at __syncthreads before the stage is reused.
// Only the load of the next K step overlaps the math; the promotion and the wgmmas of the
// only warpgroup never overlap. Uses fp8.cu's PTX wrappers, descriptor and epilogue.
// Measured (H100, block scaling, M = 8192): 502-647 TFLOP/s (0.46-0.60x cuBLASLt), 335 at
// K = 1024: correct on the first run, 3x version 3, but the tensor cores idle while it waits.
#define V4_BM 64
#define V4_BN 128
#define V4_SMEM (2 * (V4_BM + V4_BN) * WG_BK + 16 + 1024)

template <typename T, int GRAN>
__global__ void __launch_bounds__(128)
    gemm_fp8_v4_kernel(T *y, const GemmArgs a, const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw) {
#ifdef FP8_SM90A
    extern __shared__ uint8_t smem_raw[];
    uint8_t *xs = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // [2][64][128 B], 1 KiB aligned
    uint8_t *ws = xs + 2 * V4_BM * WG_BK;                                          // [2][128][128 B]
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
    wg_store_direct<T, GRAN, 128>(y, a, acc, r0, n0);
#endif
}

// ----------------------------------------------------------------------------
// version 5: warp specialization and a deeper pipeline (sm_90a). 384 threads: a producer
// warpgroup (one thread issues the TMA loads, two warps stage the block scales in shared
// memory, setmaxnreg 40) and two consumer warpgroups (64 rows each of a 128 x 128 tile,
// setmaxnreg 232) around a ring of 6 stages (5 with block scales) with full and empty
// mbarriers: the loads run up to 6 K steps ahead and, with two consumers, one warpgroup's promotion overlaps the other's
// wgmmas. One tile per block; the epilogue stores from registers. The main loop is fp8.cu's
// wg_produce_tile / wg_produce_scales / wg_consume_tile, which versions 6 and 7 keep.
// Measured (block, M = 8192): 643-877 TFLOP/s, 352 at K = 1024, where the prologue and the
// register epilogue of 1536 one-tile blocks dominate (first runs, with the scales loaded by
// the consumers: 292-648).
template <typename T, int GRAN>
__global__ void __launch_bounds__(384, 1)
    gemm_fp8_v5_kernel(T *y, const GemmArgs a, const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw) {
#ifdef FP8_SM90A
    extern __shared__ uint8_t smem_raw[];
    uint8_t *xs = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // 1 KiB aligned
    using Cfg = WgCfg<128, GRAN>;
    constexpr int S = Cfg::STAGES;
    uint8_t *ws = xs + S * WG_TILE_X;
    float *sc = (float *)(ws + S * Cfg::TILE_W);
    uint64_t *full = (uint64_t *)((uint8_t *)sc + S * Cfg::SC), *empty = full + S;
    int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    int m0 = blockIdx.y * WG_BM, n0 = blockIdx.x * 128, KB = cdiv(a.K, WG_BK);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) { mbar_init(&full[s], GRAN == FP8_BLOCK ? 33 : 1); mbar_init(&empty[s], 8); }
        mbar_fence_init();
    }
    __syncthreads();
    int stage = 0, phase = 0, step = 0, warp = tid >> 5;
    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (tid == 0) wg_produce_tile<128, GRAN>(&tmx, &tmw, xs, ws, full, empty, stage, phase, m0, n0, KB);
        else if (GRAN == FP8_BLOCK && warp >= 1 && warp <= WG_SCALE_WARPS)
            wg_produce_scales<128>(a, sc, full, empty, stage, phase, step, warp - 1, m0, n0, KB);
    } else {
        setmaxnreg_inc<232>();
        int c = wg - 1;
        float acc[64];
        wg_consume_tile<GRAN, 128>(acc, a, xs, ws, sc, full, empty, stage, phase, n0, c, KB);
        wg_store_direct<T, GRAN, 128>(y, a, acc, m0 + 64 * c + 16 * (tid >> 5) + ((tid & 31) >> 2), n0);
    }
#endif
}
template <int GRAN>  // the stages of version 6 without its output staging
constexpr int v5_smem() { return WgCfg<128, GRAN>::SMEM - WgCfg<128, GRAN>::EPI; }

template <typename T, int GRAN, int V>
static void launch_v45_t(T *y, const GemmArgs &a) {
    static int attr_set = 0;
    auto kern = V == 4 ? gemm_fp8_v4_kernel<T, GRAN> : gemm_fp8_v5_kernel<T, GRAN>;
    int smem = V == 4 ? V4_SMEM : v5_smem<GRAN>(), bm = V == 4 ? V4_BM : WG_BM;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = 1;
    }
    CUtensorMap tx = tmap_2d(a.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.M, a.K, bm, WG_BK);
    CUtensorMap tw = tmap_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.N, a.K, 128, WG_BK);
    dim3 grid(cdiv(a.N, 128), cdiv(a.M, bm));
    kern<<<grid, V == 4 ? 128 : 384, smem, ctx.stream>>>(y, a, tx, tw);
    launchCheck();
}
template <int V>
static void launch_v45(__nv_bfloat16 *y, const GemmArgs &a) {
    if (a.gran == FP8_BLOCK) launch_v45_t<__nv_bfloat16, FP8_BLOCK, V>(y, a);
    else if (a.gran == FP8_ROW) launch_v45_t<__nv_bfloat16, FP8_ROW, V>(y, a);
    else launch_v45_t<__nv_bfloat16, FP8_TENSOR, V>(y, a);
}

// version 0 is cuBLASLt
static void run_version(int v, __nv_bfloat16 *y, const FP8Tensor *x, const FP8Tensor *w) {
    GemmArgs a = gemm_args(x, w, 0);
    switch (v) {
        case 0: fp8_cuda_set_backend(FP8_GEMM_CUBLASLT); fp8_gemm_cuda(y, DT_BF16, x, w, 0); break;
        case 1: launch_v1(y, a); break;
        case 2: launch_v2(y, a); break;
        case 3: launch_v3(y, a); break;
        case 4: launch_v45<4>(y, a); break;
        case 5: launch_v45<5>(y, a); break;
        case 6: launch_v6(y, DT_BF16, a, 6); break;
        case 7: launch_v6(y, DT_BF16, a, 7); break;
        case 8: launch_decode(y, a); break;  // any M: one 64-row tile after another
        default: die("no version %d", v);
    }
}

// ----------------------------------------------------------------------------
// helpers

static void fill_bf16_random(__nv_bfloat16 *d, size_t n, uint64_t seed) {
    uint16_t *h = (uint16_t *)mallocCheck(n * 2);
    Rng r = rng_make(seed);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(rng_normal(&r));
    cudaCheck(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
}
static FP8Tensor fp8_alloc_dev(int rows, int cols, FP8Gran g, int block_rows) {
    FP8Tensor t = {0};
    t.rows = rows; t.cols = cols; t.gran = g; t.fmt = FP8_E4M3; t.block_rows = g == FP8_BLOCK ? block_rows : 0;
    cudaCheck(cudaMalloc(&t.data, (size_t)rows * cols));
    cudaCheck(cudaMalloc(&t.scale, fp8_num_scales(g, rows, cols, t.block_rows) * 4));
    return t;
}
static void fp8_free_dev(FP8Tensor *t) { cudaFree(t->data); cudaFree(t->scale); }
static FP8Tensor to_host(const FP8Tensor *d) {
    FP8Tensor h = *d;
    size_t ns = fp8_num_scales(d->gran, d->rows, d->cols, d->block_rows);
    h.data = (uint8_t *)mallocCheck((size_t)d->rows * d->cols);
    h.scale = (float *)mallocCheck(ns * 4);
    cudaCheck(cudaMemcpy(h.data, d->data, (size_t)d->rows * d->cols, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h.scale, d->scale, ns * 4, cudaMemcpyDeviceToHost));
    return h;
}

// ----------------------------------------------------------------------------
// validation: every version at every granularity against fp8_gemm_cpu, on shapes with
// partial tiles (M = 200, 333, 2000; N = 200, 1544: a partial 128-wide weight block; K = 528:
// a partial last K step), the last with more tiles than SMs (the persistent loop). Tolerance as test/gpu_fp8.cu: ACC sum|x w| + 2^-8 |y| (bf16 output),
// ACC = 2^-10 for fp32 accumulation (v1-v3: v3's e4m3 products are exact in f16 HMMA) and
// 2^-8 for the FP8 tensor cores' reduced-precision sums within a K step (cuBLASLt, v4-v6).

static int validate(void) {
    int shapes[][3] = {{200, 384, 1024}, {333, 200, 528}, {2000, 1544, 256}}, fails = 0;  // the last: 208 (v7: 144) tiles > 132 SMs
    printf("validation (bf16 out, vs fp8_gemm_cpu; worst error in units of the tolerance):\n");
    for (int si = 0; si < 3; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        __nv_bfloat16 *xb, *wb, *y;
        cudaCheck(cudaMalloc(&xb, (size_t)M * K * 2));
        cudaCheck(cudaMalloc(&wb, (size_t)N * K * 2));
        cudaCheck(cudaMalloc(&y, (size_t)M * N * 2));
        fill_bf16_random(xb, (size_t)M * K, 1 + si);
        fill_bf16_random(wb, (size_t)N * K, 2 + si);
        for (int gi = 0; gi < 3; gi++) {
            FP8Tensor x = fp8_alloc_dev(M, K, GRANS[gi], 1), w = fp8_alloc_dev(N, K, GRANS[gi], 128);
            fp8_quantize_cuda(&x, xb, DT_BF16, 0);
            fp8_quantize_cuda(&w, wb, DT_BF16, 0);
            FP8Tensor hx = to_host(&x), hw = to_host(&w);
            float *ref = (float *)mallocCheck((size_t)M * N * 4), *dx = (float *)mallocCheck((size_t)M * K * 4),
                  *dw = (float *)mallocCheck((size_t)N * K * 4);
            double *mag = (double *)mallocCheck((size_t)M * N * 8);
            fp8_gemm_cpu(ref, &hx, &hw);
            fp8_dequantize_cpu(dx, &hx);
            fp8_dequantize_cpu(dw, &hw);
            #pragma omp parallel for
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    double a = 0;
                    for (int k = 0; k < K; k++) a += fabs((double)dx[(size_t)m * K + k] * dw[(size_t)n * K + k]);
                    mag[(size_t)m * N + n] = a;
                }
            uint16_t *hy = (uint16_t *)mallocCheck((size_t)M * N * 2);
            printf("  %dx%dx%d %-6s", M, N, K, fp8_gran_name(GRANS[gi]));
            for (int v = 0; v <= 8; v++) {
                if ((v >= 4 && !ctx.wgmma) || (v == 0 && !fp8_gemm_cublaslt_supported(DT_BF16, &x, &w, NULL, 0))) {
                    printf("  v%d -", v);  // cuBLASLt's block scaling wants K % 128 == 0
                    continue;
                }
                cudaCheck(cudaMemset(y, 0xFF, (size_t)M * N * 2));  // NaN poison: every output must be written
                run_version(v, y, &x, &w);
                cudaCheck(cudaMemcpy(hy, y, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
                double acc_tol = (v == 0 || v >= 4) ? 0x1p-8 : 0x1p-10, worst = 0;
                int shown = 0;
                for (size_t i = 0; i < (size_t)M * N; i++) {
                    double r = ref[i], tol = acc_tol * mag[i] + 0x1p-8 * fabs(r);
                    double e = fabs(bf16_to_f32(hy[i]) - r) / tol;
                    if (!(e <= worst)) worst = e;  // NaN (unwritten) counts as a failure
                    if (!(e <= 1.0) && shown++ < 3)
                        fprintf(stderr, "    v%d %s: y[%zu, %zu] = %g, want %g\n", v, fp8_gran_name(GRANS[gi]), i / N, i % N,
                                bf16_to_f32(hy[i]), r);
                }
                printf("  v%d%s %.3f%s", v, v == 0 ? " (cuBLASLt)" : "", worst, worst <= 1.0 ? "" : " FAIL");
                fails += !(worst <= 1.0);
            }
            printf("\n");
            fp8_free_dev(&x); fp8_free_dev(&w);
            fp8_tensor_free_cpu(&hx); fp8_tensor_free_cpu(&hw);
            free(ref); free(dx); free(dw); free(hy); free(mag);
        }
        cudaFree(xb); cudaFree(wb); cudaFree(y);
    }
    fp8_cuda_set_backend(FP8_GEMM_AUTO);
    return fails;
}

// ----------------------------------------------------------------------------
// benchmark

// median of n values (sorts them)
static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && v[k] < v[k - 1]; k--) { double t = v[k]; v[k] = v[k - 1]; v[k - 1] = t; }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// median time in ms of op(i) over reps, i rotating over nb buffer sets. All reps are queued
// back to back with an event between each (no host sync inside), so the GPU never waits for
// a launch and the events measure kernel time, as triton's do_bench does.
template <typename F>
static double time_ms(F op, int nb) {
    enum { REPS = 100 };
    cudaEvent_t e[REPS + 1];
    for (int i = 0; i <= REPS; i++) cudaCheck(cudaEventCreate(&e[i]));
    for (int i = 0; i < 5; i++) op(i % nb);  // warm-up (plans, heuristics, autotuning, clocks)
    cudaCheck(cudaDeviceSynchronize());
    float ms1;  // one timed call, to size the repeats to ~300 ms
    cudaCheck(cudaEventRecord(e[0], ctx.stream));
    op(0);
    cudaCheck(cudaEventRecord(e[1], ctx.stream));
    cudaCheck(cudaEventSynchronize(e[1]));
    cudaCheck(cudaEventElapsedTime(&ms1, e[0], e[1]));
    int reps = (int)(300.0 / (ms1 + 1e-3));
    reps = reps < 20 ? 20 : reps > REPS ? REPS : reps;
    cudaCheck(cudaEventRecord(e[0], ctx.stream));
    for (int i = 0; i < reps; i++) {
        op((i + 1) % nb);
        cudaCheck(cudaEventRecord(e[i + 1], ctx.stream));
    }
    cudaCheck(cudaEventSynchronize(e[reps]));
    double t[REPS];
    for (int i = 0; i < reps; i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, e[i], e[i + 1]));
        t[i] = ms;
    }
    for (int i = 0; i <= REPS; i++) cudaEventDestroy(e[i]);
    return median(t, reps);
}

// median time in ms per call of each of n ops, called in turn (burst calls of op(0, b), an event,
// burst calls of op(1, b), an event, ..., then the next buffer set b of nb). Every op then runs
// through the same span of clocks and power, which time_ms, called for one op after another, does
// not give: on the power-capped H100 a kernel runs at the clocks the kernel before it left, and the
// same cuBLASLt block-scaled kernel timed second in a round of time_ms calls measured 3-7% slower
// than when timed first at K >= 4096 (dev/RESULTS.md, "Session 9"). With burst > 1 an event's own
// cost (~1 us a call, 1-3% of a 50 us GEMM) is shared by burst calls.
template <typename F>
static void time_interleaved(F op, int n, int nb, int burst, double *ms) {
    enum { EVENTS = 2001 };
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < n; k++) op(k, i % nb);  // warm-up
    cudaEvent_t *e = (cudaEvent_t *)mallocCheck(EVENTS * sizeof(cudaEvent_t));
    for (int i = 0; i < EVENTS; i++) cudaCheck(cudaEventCreate(&e[i]));
    float pass;  // one pass of every op, to size the passes to ~1.5 s
    cudaCheck(cudaEventRecord(e[0], ctx.stream));
    for (int k = 0; k < n; k++)
        for (int j = 0; j < burst; j++) op(k, j % nb);
    cudaCheck(cudaEventRecord(e[1], ctx.stream));
    cudaCheck(cudaEventSynchronize(e[1]));
    cudaCheck(cudaEventElapsedTime(&pass, e[0], e[1]));
    int reps = (int)(1500.0 / (pass + 1e-3)), cap = (EVENTS - 1) / n;
    reps = reps < 10 ? 10 : reps > cap ? cap : reps;
    cudaCheck(cudaEventRecord(e[0], ctx.stream));
    for (int r = 0, b = 0; r < reps; r++)
        for (int k = 0; k < n; k++) {
            for (int j = 0; j < burst; j++) op(k, b++ % nb);
            cudaCheck(cudaEventRecord(e[r * n + k + 1], ctx.stream));
        }
    cudaCheck(cudaEventSynchronize(e[reps * n]));
    double *t = (double *)mallocCheck(reps * sizeof(double));
    for (int k = 0; k < n; k++) {
        for (int r = 0; r < reps; r++) {
            float x;
            cudaCheck(cudaEventElapsedTime(&x, e[r * n + k], e[r * n + k + 1]));
            t[r] = x / burst;
        }
        ms[k] = median(t, reps);
    }
    for (int i = 0; i < EVENTS; i++) cudaEventDestroy(e[i]);
    free(e); free(t);
}

// median time in ms of op() timed as triton's do_bench times torch in peers.py: the same operands
// every call, L2 flushed (a 256 MiB memset) before each, events around the call alone. A kernel
// timed so can run faster than back to back (time_ms) on the power-capped H100 (cuBLASLt block at
// 8192x4096x4096: 0.91-0.93 of torch back to back, 0.96 so; dev/RESULTS.md, "Session 8"), so the
// cuBLASLt path is compared with torch this way too.
template <typename F>
static double time_ms_flushed(F op) {
    enum { REPS = 100 };
    static void *flush = NULL;
    const size_t flush_bytes = (size_t)256 << 20;
    if (!flush) cudaCheck(cudaMalloc(&flush, flush_bytes));
    cudaEvent_t e0[REPS], e1[REPS];
    for (int i = 0; i < REPS; i++) { cudaCheck(cudaEventCreate(&e0[i])); cudaCheck(cudaEventCreate(&e1[i])); }
    for (int i = 0; i < 5; i++) op();  // warm-up
    double t[REPS];
    for (int i = 0; i < REPS; i++) {
        cudaCheck(cudaMemsetAsync(flush, 0, flush_bytes, ctx.stream));
        cudaCheck(cudaEventRecord(e0[i], ctx.stream));
        op();
        cudaCheck(cudaEventRecord(e1[i], ctx.stream));
    }
    cudaCheck(cudaEventSynchronize(e1[REPS - 1]));
    for (int i = 0; i < REPS; i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, e0[i], e1[i]));
        t[i] = ms;
        cudaEventDestroy(e0[i]);
        cudaEventDestroy(e1[i]);
    }
    return median(t, REPS);
}

typedef struct { int M, N, K; double bf16, tensor, row, block; } Peer;

static int load_peers(const char *path, Peer *p, int cap) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "warning: no peers file %s: printing our figures only\n", path); return 0; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = (char *)mallocCheck(n + 1);
    if (fread(s, 1, n, f) != (size_t)n) die("cannot read %s", path);
    s[n] = 0;
    fclose(f);
    cJSON *root = cJSON_Parse(s), *g = root ? cJSON_GetObjectItem(root, "gemm") : NULL;
    if (!g) die("%s: no \"gemm\" list (write it with peers.py gemm --json FILE)", path);
    int k = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, g) {
        if (k == cap) break;
        auto num = [&](const char *key) { cJSON *v = cJSON_GetObjectItem(e, key); return cJSON_IsNumber(v) ? v->valuedouble : 0.0; };
        p[k].M = (int)num("M"); p[k].N = (int)num("N"); p[k].K = (int)num("K");
        p[k].bf16 = num("bf16"); p[k].tensor = num("fp8_tensor"); p[k].row = num("fp8_row"); p[k].block = num("fp8_block");
        k++;
    }
    cJSON_Delete(root);
    free(s);
    return k;
}

// the peers' figures for M x N x K, or NULL
static Peer *peer_of(Peer *p, int np, int M, int N, int K) {
    for (int i = 0; i < np; i++)
        if (p[i].M == M && p[i].N == N && p[i].K == K) return &p[i];
    return NULL;
}
// three table cells: ours, the peer's and their ratio, or dashes where the peer has no figure
static void print_vs_peer(double ours, double peer) {
    if (peer > 0) printf("| %.0f | %.0f | %.2f ", ours, peer, ours / peer);
    else printf("| %.0f | - | - ", ours);
}

// cuBLASLt's other candidates for an FP8 product: the heuristic's first 16 algorithms for the plan
// fp8_gemm_cuda uses, each timed; returns the best time (us) and its rank in *best_i (0 = the one
// fp8_gemm_cuda runs). An experiment: does autotuning over the heuristic's list pay at decode shapes?
static double lt_sweep(FP8Tensor *x, FP8Tensor *w, int nb, void *y, int *best_i, int *nalgo) {
    char why[256];
    LtPlan *p = fp8_plan(DT_BF16, x, &w[0], y, why, sizeof why);
    if (!p) die("lt_sweep: %s", why);
    cublasLtMatmulPreference_t pref = plan_pref(p);
    cublasLtMatmulHeuristicResult_t res[16];
    int n = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.lt, p->desc, p->la, p->lb, p->ly, p->ly, pref, 16, res, &n));
    cublasLtMatmulPreferenceDestroy(pref);
    double best = 1e30;
    *best_i = -1;
    *nalgo = n;
    for (int i = 0; i < n; i++) {
        double t = time_ms([&](int b) {
            const void *sa = w[b].scale, *sb = x->scale;
            cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
            cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
            lt_matmul(p, &res[i].algo, y, w[b].data, x->data, 0.0f);
        }, nb) * 1e3;
        if (t < best) { best = t; *best_i = i; }
    }
    return best;
}

// --decode: the products of a decode step (M = 64 and 256 tokens) of Qwen3-0.6B and -8B, where the
// time is the time to read W: microseconds and W bytes / time for BF16 cuBLAS, cuBLASLt FP8 block
// and the decode kernel (version 8, fp8.cu) by shape and with its K splits forced; plus the
// activation quantization.
static void decode_bench(int (*only)[2], int nonly, int Monly) {
    int all[][2] = {{2048, 1024}, {1024, 1024}, {1024, 2048}, {3072, 1024}, {1024, 3072},
                    {4096, 4096}, {1024, 4096}, {12288, 4096}, {4096, 12288},
                    {4096, 1024}, {6144, 1024}, {6144, 4096}, {24576, 4096}};  // fused q|k|v, gate|up
    int (*shapes)[2] = nonly ? only : all;
    size_t nshapes = nonly ? (size_t)nonly : sizeof all / sizeof all[0];
    const int splits[] = {1, 2, 4, 8};
    for (int M = Monly ? Monly : 64; M <= (Monly ? Monly : 256); M *= 4) {
        printf("\ndecode products, M = %d, FP8 block (us, and GB/s of W read: N*K bytes FP8, 2*N*K BF16)\n", M);
        printf("| N x K | bf16 cuBLAS | fp8 cuBLASLt | best of its list (rank/of) | quant X | decode kernel | splits 1 | 2 | 4 | 8 | AUTO runs |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (size_t si = 0; si < nshapes; si++) {
            int N = shapes[si][0], K = shapes[si][1];
            int nb = (int)((200u << 20) / ((size_t)N * K * 3)) + 2;
            if (nb > 8) nb = 8;
            __nv_bfloat16 *xb, *wb[8], *y;
            FP8Tensor x = fp8_alloc_dev(M, K, FP8_BLOCK, 1), w[8];
            cudaCheck(cudaMalloc(&xb, (size_t)M * K * 2));
            fill_bf16_random(xb, (size_t)M * K, 7);
            fp8_quantize_cuda(&x, xb, DT_BF16, 0);
            for (int b = 0; b < nb; b++) {
                cudaCheck(cudaMalloc(&wb[b], (size_t)N * K * 2));
                fill_bf16_random(wb[b], (size_t)N * K, 300 + b);
                w[b] = fp8_alloc_dev(N, K, FP8_BLOCK, 128);
                fp8_quantize_cuda(&w[b], wb[b], DT_BF16, 0);
            }
            cudaCheck(cudaMalloc(&y, (size_t)M * N * 4));
            double wbytes = (double)N * K;
            auto gemm = [&](int b) { fp8_gemm_cuda(y, DT_BF16, &x, &w[b], 0); };
            double t_bf = time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, xb, wb[b], M, N, K, 0); }, nb) * 1e3;
            double t_q = time_ms([&](int b) { fp8_quantize_cuda(&x, xb, DT_BF16, 0); }, nb) * 1e3;
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
            gemm(0);
            const char *auto_be = fp8_cuda_last_backend();
            fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
            double t_lt = time_ms(gemm, nb) * 1e3;
            int bi, na;
            double t_best = lt_sweep(&x, w, nb, y, &bi, &na);
            fp8_cuda_set_backend(FP8_GEMM_KERNEL_DECODE);
            double t_dk = time_ms(gemm, nb) * 1e3, t_ks[4];
            for (int i = 0; i < 4; i++) {
                fp8_cuda_set_decode_split(splits[i]);
                t_ks[i] = time_ms(gemm, nb) * 1e3;
            }
            fp8_cuda_set_decode_split(0);
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
            auto gbs = [&](double us, double bytes) { return bytes / (us * 1e-6) / 1e9; };
            printf("| %d x %d | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) %d/%d | %.1f | %.1f (%.0f) |", N, K, t_bf,
                   gbs(t_bf, 2 * wbytes), t_lt, gbs(t_lt, wbytes), t_best, gbs(t_best, wbytes), bi, na, t_q, t_dk,
                   gbs(t_dk, wbytes));
            for (int i = 0; i < 4; i++) printf(" %.1f |", t_ks[i]);
            printf(" %s |\n", auto_be);
            fflush(stdout);
            cudaFree(xb); cudaFree(y); fp8_free_dev(&x);
            for (int b = 0; b < nb; b++) { cudaFree(wb[b]); fp8_free_dev(&w[b]); }
        }
    }
}

// TFLOP/s of an M x N x K product that took ms milliseconds
static double tflops_of(int M, int N, int K, double ms) { return 2.0 * M * N * K / (ms * 1e-3) / 1e12; }

// nb operand sets of one product (rotated through so that the timings read from memory, not L2):
// bf16 X and W from fixed seeds, and their FP8 copies at each granularity, x[gi] for GRANS[gi]
typedef struct { __nv_bfloat16 *xb, *wb; FP8Tensor x[3], w[3]; } OperandSet;
static void operands_make(OperandSet *o, int nb, int M, int N, int K) {
    for (int b = 0; b < nb; b++) {
        cudaCheck(cudaMalloc(&o[b].xb, (size_t)M * K * 2));
        cudaCheck(cudaMalloc(&o[b].wb, (size_t)N * K * 2));
        fill_bf16_random(o[b].xb, (size_t)M * K, 100 + b);
        fill_bf16_random(o[b].wb, (size_t)N * K, 200 + b);
        for (int gi = 0; gi < 3; gi++) {
            o[b].x[gi] = fp8_alloc_dev(M, K, GRANS[gi], 1);
            o[b].w[gi] = fp8_alloc_dev(N, K, GRANS[gi], 128);
            fp8_quantize_cuda(&o[b].x[gi], o[b].xb, DT_BF16, 0);
            fp8_quantize_cuda(&o[b].w[gi], o[b].wb, DT_BF16, 0);
        }
    }
}
static void operands_free(OperandSet *o, int nb) {
    for (int b = 0; b < nb; b++) {
        cudaFree(o[b].xb); cudaFree(o[b].wb);
        for (int gi = 0; gi < 3; gi++) { fp8_free_dev(&o[b].x[gi]); fp8_free_dev(&o[b].w[gi]); }
    }
}

// --profile MxNxK: each kernel of one product (BF16 cuBLAS, cuBLASLt FP8 and the wgmma versions 6
// and 7 at each granularity) launched twice back to back, for a profiler
// to pick (ncu -k / -c), then, with --sustain S, run for S seconds each with the wall-clock span
// printed, so that clocks and power sampled alongside (nvidia-smi -lms) can be matched to it.
static void profile_bench(int M, int N, int K, double sustain) {
    const int nb = 4;
    OperandSet o[nb];
    __nv_bfloat16 *y;
    operands_make(o, nb, M, N, K);
    cudaCheck(cudaMalloc(&y, (size_t)M * N * 2));
    struct { const char *name; int kind, gi; } ks[] = {{"bf16 cuBLAS", 0, 0}, {"LT tensor", 1, 0}, {"LT row", 1, 1},
                                                       {"LT block", 1, 2},    {"v6 tensor", 6, 0}, {"v6 row", 6, 1},
                                                       {"v6 block", 6, 2},    {"v7 tensor", 7, 0}, {"v7 row", 7, 1},
                                                       {"v7 block", 7, 2}};
    for (auto &k : ks) {
        auto op = [&](int b) {
            if (k.kind == 0) bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0);
            else if (k.kind == 1) fp8_gemm_cuda(y, DT_BF16, &o[b].x[k.gi], &o[b].w[k.gi], 0);
            else { GemmArgs a = gemm_args(&o[b].x[k.gi], &o[b].w[k.gi], 0); launch_v6(y, DT_BF16, a, k.kind); }
        };
        fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
        op(0); op(1);
        cudaCheck(cudaDeviceSynchronize());
        if (sustain <= 0) continue;
        struct timespec t0, t1;
        clock_gettime(CLOCK_REALTIME, &t0);
        double best = 0, sum = 0;
        int n = 0;
        for (;;) {
            double ms = time_ms(op, nb);
            sum += ms; n++;
            double tf = tflops_of(M, N, K, ms);
            if (tf > best) best = tf;
            clock_gettime(CLOCK_REALTIME, &t1);
            if ((t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec) > sustain) break;
        }
        printf("sustain %-12s %dx%dx%d  wall %ld.%03ld-%ld.%03ld  median-of-medians %.0f TFLOP/s (best %.0f, %d timings)\n", k.name,
               M, N, K, (long)t0.tv_sec, t0.tv_nsec / 1000000, (long)t1.tv_sec, t1.tv_nsec / 1000000,
               tflops_of(M, N, K, sum / n), best, n);
        fflush(stdout);
    }
    fp8_cuda_set_backend(FP8_GEMM_AUTO);
    operands_free(o, nb);
    cudaFree(y);
}

// --ab MxNxK: cuBLASLt against the hand-written kernel (the version fp8.cu would run) at each
// granularity, as the GPU runs them for minutes: power-capped, each clock set by the power of the
// kernel before it. So the two are timed symmetrically, ROUNDS times [BF16, cuBLASLt, BF16,
// kernel], medians. ncu cycles compare the kernels at equal clocks; this compares what a run gets.
static void ab_bench(int M, int N, int K) {
    enum { ROUNDS = 7 };
    if (!ctx.wgmma) die("--ab compares cuBLASLt with the wgmma kernel: it needs an sm_90a GPU and build");
    const int nb = 4;
    OperandSet o[nb];
    __nv_bfloat16 *y;
    operands_make(o, nb, M, N, K);
    cudaCheck(cudaMalloc(&y, (size_t)M * N * 2));
    auto tflops = [&](double ms) { return tflops_of(M, N, K, ms); };
    printf("A/B, %dx%dx%d, %d rounds of [BF16, cuBLASLt, BF16, kernel], medians, TFLOP/s:\n", M, N, K, ROUNDS);
    for (int gi = 0; gi < 3; gi++) {
        double bf[2 * ROUNDS], lt[ROUNDS], kn[ROUNDS];
        const char *kname = "";
        for (int r = 0; r < ROUNDS; r++) {
            bf[2 * r] = tflops(time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0); }, nb));
            fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
            lt[r] = tflops(time_ms([&](int b) { fp8_gemm_cuda(y, DT_BF16, &o[b].x[gi], &o[b].w[gi], 0); }, nb));
            bf[2 * r + 1] = tflops(time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0); }, nb));
            fp8_cuda_set_backend(FP8_GEMM_KERNEL_WGMMA);
            kn[r] = tflops(time_ms([&](int b) { fp8_gemm_cuda(y, DT_BF16, &o[b].x[gi], &o[b].w[gi], 0); }, nb));
            kname = fp8_cuda_last_backend();
        }
        fp8_cuda_set_backend(FP8_GEMM_AUTO);
        double b = median(bf, 2 * ROUNDS), l = median(lt, ROUNDS), k = median(kn, ROUNDS);
        printf("  %-6s BF16 %5.0f  cuBLASLt %5.0f (%.2fx BF16)  %s v%d %5.0f (%.2fx BF16)  kernel / cuBLASLt %.3f\n",
               fp8_gran_name(GRANS[gi]), b, l, l / b, kname, wgmma_version(M, N, K), k, k / b, k / l);
        fflush(stdout);
    }
    operands_free(o, nb);
    cudaFree(y);
}

// the cuBLASLt plan fp8.cu runs for product `kind` of operand set o: 0 BF16, 1-3 FP8 at GRANS[kind - 1]
static LtPlan *bench_plan(int kind, OperandSet *o, const void *y, int M, int N, int K) {
    if (kind == 0) {
        LtPlan *p = plan_find(1, M, N, K, 0, 0, 0, DT_BF16, 1, ptr_align(o->wb), ptr_align(o->xb), ptr_align(y));
        if (!p->desc) plan_build(p, CUDA_R_16BF, CUDA_R_16BF, K);
        return p;
    }
    char why[256];
    LtPlan *p = fp8_plan(DT_BF16, &o->x[kind - 1], &o->w[kind - 1], y, why, sizeof why);
    if (!p) die("%s", why);
    return p;
}

// one call of bench_plan's product with algorithm al, into out; its status (a configuration
// cublasLtMatmulAlgoCheck accepted may still refuse to launch)
static cublasStatus_t bench_lt_call(LtPlan *p, int kind, const OperandSet *o, const cublasLtMatmulAlgo_t *al, void *out) {
    const void *A = o->wb, *B = o->xb;
    if (kind) {
        const FP8Tensor *x = &o->x[kind - 1], *w = &o->w[kind - 1];
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w->scale, sizeof w->scale));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x->scale, sizeof x->scale));
        A = w->data; B = x->data;
    }
    float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(ctx.lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, out, p->ly, out, p->ly, al, ctx.workspace,
                          ctx.workspace_bytes, ctx.stream);
}

// --lt-algos MxNxK: every algorithm cuBLASLt's heuristic offers (up to 16, in its order) for the
// BF16 product and the FP8 one at each granularity, each timed; the heuristic's first is what
// fp8.cu runs (and what torch._scaled_mm runs). Says whether trying more than the first would pay.
static void lt_algos_bench(int M, int N, int K) {
    OperandSet o[1];
    __nv_bfloat16 *y;
    operands_make(o, 1, M, N, K);
    cudaCheck(cudaMalloc(&y, (size_t)M * N * 2));
    for (int kind = 0; kind < 4; kind++) {  // BF16, FP8 tensor, row, block
        int gi = kind - 1;
        LtPlan *p = bench_plan(kind, &o[0], y, M, N, K);
        auto run = [&](const cublasLtMatmulAlgo_t *al) { cublasCheck(bench_lt_call(p, kind, &o[0], al, y)); };
        cublasLtMatmulPreference_t pref = plan_pref(p);
        cublasLtMatmulHeuristicResult_t res[16];
        int n = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx.lt, p->desc, p->la, p->lb, p->ly, p->ly, pref, 16, res, &n));
        cublasLtMatmulPreferenceDestroy(pref);
        printf("%dx%dx%d %-6s %2d algorithms, TFLOP/s in the heuristic's order:", M, N, K, kind ? fp8_gran_name(GRANS[gi]) : "bf16", n);
        double first = 0;
        for (int i = 0; i < n; i++) {
            double ms = time_ms([&](int) { run(&res[i].algo); }, 1);
            double tf = tflops_of(M, N, K, ms);
            if (i == 0) first = tf;
            printf(" %.0f", tf);
        }
        double again = tflops_of(M, N, K, time_ms([&](int) { run(&res[0].algo); }, 1));
        printf(" | first again %.0f (%.0f)\n", again, first);
        fflush(stdout);
    }
    operands_free(o, 1);
    cudaFree(y);
}

// seconds on a monotonic clock
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// the largest |a - b| of two bf16 device arrays of n values, and the largest |a|
static void compare_bf16(const __nv_bfloat16 *a, const __nv_bfloat16 *b, size_t n, double *max_diff, double *max_a) {
    uint16_t *ha = (uint16_t *)mallocCheck(n * 2), *hb = (uint16_t *)mallocCheck(n * 2);
    cudaCheck(cudaMemcpy(ha, a, n * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(hb, b, n * 2, cudaMemcpyDeviceToHost));
    *max_diff = *max_a = 0;
    for (size_t i = 0; i < n; i++) {
        double x = bf16_to_f32(ha[i]), d = fabs(x - bf16_to_f32(hb[i]));
        if (d > *max_diff || d != d) *max_diff = d;
        if (fabs(x) > *max_a) *max_a = fabs(x);
    }
    free(ha); free(hb);
}

// a cuBLASLt configuration in words (tile and stages ids as cublasLt.h's cublasLtMatmulTile_t
// and cublasLtMatmulStages_t number them, cluster as cublasLtClusterShape_t)
static void algo_name(const cublasLtMatmulAlgo_t *a, char *s, size_t cap) {
    int32_t id = 0, split = 0;
    uint32_t tile = 0, stages = 0, swz = 0, custom = 0;
    uint16_t cluster = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    snprintf(s, cap, "id %d tile %u stages %u cluster %u split %d swz %u custom %u", id, tile, stages, cluster, split, swz,
             custom);
}

// the ids a capability lists (tiles or stages), below `end` (values past the enum are not ids),
// or {0} (undefined) when it lists none; *v is malloc'ed
static int algo_cap_list(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t attr, uint32_t end, uint32_t **v) {
    size_t sz = 0, w = 0;
    *v = (uint32_t *)mallocCheck(sizeof(uint32_t));
    (*v)[0] = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(a, attr, NULL, 0, &sz) != CUBLAS_STATUS_SUCCESS || sz < sizeof(uint32_t)) return 1;
    free(*v);
    *v = (uint32_t *)mallocCheck(sz);
    if (cublasLtMatmulAlgoCapGetAttribute(a, attr, *v, sz, &w) != CUBLAS_STATUS_SUCCESS) { (*v)[0] = 0; return 1; }
    int n = 0;
    for (size_t i = 0; i < w / sizeof(uint32_t); i++)
        if ((*v)[i] < end) (*v)[n++] = (*v)[i];
    if (!n) (*v)[n++] = 0;
    return n;
}

// --lt-search MxNxK: beyond the heuristic. Every configuration cuBLASLt accepts for the product
// (each algorithm id x its tiles x stages x seven cluster shapes up to 4 blocks x swizzle x custom
// options 0-3, as cublasLtMatmulAlgoCheck accepts them), and what the heuristic offers when
// limited to each id, each timed briefly; then the fastest three against the heuristic's first,
// called in turn, with the largest difference of their outputs (an accepted configuration can
// compute a wrong product: dev/RESULTS.md, "Session 9"). Says whether autotuning beyond the
// heuristic would pay.
static void lt_search_bench(int M, int N, int K) {
    size_t set_bytes = (size_t)(M + N) * K * 3;
    int nb = (int)((160u << 20) / set_bytes) + 1;
    nb = nb < 2 ? 2 : nb > 8 ? 8 : nb;
    OperandSet o[8];
    __nv_bfloat16 *y, *y2;
    operands_make(o, nb, M, N, K);
    cudaCheck(cudaMalloc(&y, (size_t)M * N * 2));
    cudaCheck(cudaMalloc(&y2, (size_t)M * N * 2));
    enum { MAXC = 4000 };
    enum { MAXM = 50000 };
    static cublasLtMatmulAlgo_t cand[MAXC], man[MAXM];
    static double ctf[MAXC];
    for (int kind = 0; kind < 4; kind++) {  // BF16, FP8 tensor, row, block
        int gi = kind - 1;
        LtPlan *p = bench_plan(kind, &o[0], y, M, N, K);
        auto try_run = [&](const cublasLtMatmulAlgo_t *al, int b, void *out) { return bench_lt_call(p, kind, &o[b], al, out); };
        auto run = [&](const cublasLtMatmulAlgo_t *al, int b, void *out) { cublasCheck(try_run(al, b, out)); };
        // a brief timing: 2 warm-up calls, then 10 timed back to back (TFLOP/s; 0 if it does not launch)
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1));
        auto quick = [&](const cublasLtMatmulAlgo_t *al) {
            if (try_run(al, 0, y) != CUBLAS_STATUS_SUCCESS) return 0.0;
            run(al, 1 % nb, y);
            cudaCheck(cudaEventRecord(e0, ctx.stream));
            for (int i = 0; i < 10; i++) run(al, i % nb, y);
            cudaCheck(cudaEventRecord(e1, ctx.stream));
            cudaCheck(cudaEventSynchronize(e1));
            float ms;
            cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
            return tflops_of(M, N, K, ms / 10);
        };
        cudaDataType_t t = kind ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        int ids[512], nid = 0, nc = 0, from_heur = 0, nm = 0;
        cublasCheck(cublasLtMatmulAlgoGetIds(ctx.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t, CUDA_R_16BF, CUDA_R_16BF, 512, ids, &nid));
        cublasLtMatmulHeuristicResult_t check;
        for (int ii = 0; ii < nid; ii++) {
            // what the heuristic offers for this id alone
            cublasLtMatmulPreference_t pref = plan_pref(p);
            uint32_t mode = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
            cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode, sizeof mode));
            cublasLtMatmulHeuristicResult_t res[32];
            for (int i = 0; i < 32; i++) cublasLtMatmulAlgoInit(ctx.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t, CUDA_R_16BF, CUDA_R_16BF, ids[ii], &res[i].algo);
            int n = 0;
            if (cublasLtMatmulAlgoGetHeuristic(ctx.lt, p->desc, p->la, p->lb, p->ly, p->ly, pref, 32, res, &n) != CUBLAS_STATUS_SUCCESS) n = 0;
            cublasLtMatmulPreferenceDestroy(pref);
            for (int i = 0; i < n && nc < MAXC; i++)
                if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= ctx.workspace_bytes) cand[nc++] = res[i].algo, from_heur++;
            // every configuration its capabilities list
            cublasLtMatmulAlgo_t a;
            if (cublasLtMatmulAlgoInit(ctx.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t, CUDA_R_16BF, CUDA_R_16BF, ids[ii], &a) != CUBLAS_STATUS_SUCCESS) continue;
            uint32_t *tiles, *stages, swz_ok = 0, custom_max = 0;
            int ntile = algo_cap_list(&a, CUBLASLT_ALGO_CAP_TILE_IDS, CUBLASLT_MATMUL_TILE_END, &tiles);
            int nstage = algo_cap_list(&a, CUBLASLT_ALGO_CAP_STAGES_IDS, CUBLASLT_MATMUL_STAGES_END, &stages);
            size_t w;
            cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok, &w);
            cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof custom_max, &w);
            if (custom_max > 3) custom_max = 3;
            const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                         CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                                         CUBLASLT_CLUSTER_SHAPE_1x4x1};
            for (int ti = 0; ti < ntile; ti++)
                for (int si = 0; si < nstage; si++)
                    for (int ci = 0; ci < 7; ci++)
                        for (uint32_t sw = 0; sw <= swz_ok; sw++)
                            for (uint32_t cu = 0; cu <= custom_max && nm < MAXM; cu++) {
                                cublasLtMatmulAlgo_t c = a;
                                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[ti], sizeof tiles[ti]);
                                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages[si], sizeof stages[si]);
                                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &clusters[ci], sizeof clusters[ci]);
                                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sw, sizeof sw);
                                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &cu, sizeof cu);
                                if (cublasLtMatmulAlgoCheck(ctx.lt, p->desc, p->la, p->lb, p->ly, p->ly, &c, &check) == CUBLAS_STATUS_SUCCESS &&
                                    check.workspaceSize <= ctx.workspace_bytes)
                                    man[nm++] = c;
                            }
            free(tiles); free(stages);
        }
        // the heuristic's offers first, then the configurations in a shuffled order, so that the
        // time bound below samples every id alike
        uint32_t rng = 12345;
        for (int i = nm - 1; i > 0; i--) {
            rng = rng * 1664525u + 1013904223u;
            int j = (int)((rng >> 8) % (uint32_t)(i + 1));
            cublasLtMatmulAlgo_t t2 = man[i]; man[i] = man[j]; man[j] = t2;
        }
        for (int i = 0; i < nm && nc < MAXC; i++) cand[nc++] = man[i];
        const char *name = kind ? fp8_gran_name(GRANS[gi]) : "bf16";
        double def0 = quick(&p->algo), t_start = now_s();
        int timed = 0;
        for (int i = 0; i < nc; i++, timed++) {
            if (now_s() - t_start > 12.0) break;  // a bound on the device time a case may take
            ctf[i] = quick(&cand[i]);
        }
        double def1 = quick(&p->algo);
        int order[MAXC];
        for (int i = 0; i < timed; i++) order[i] = i;
        std::sort(order, order + timed, [&](int a, int b) { return ctf[a] > ctf[b]; });
        char s[160];
        algo_name(&p->algo, s, sizeof s);
        printf("%dx%dx%d %-6s %d ids, %d offers of the heuristic per id + %d configurations accepted, %d timed; heuristic's first (%s): %.0f, %.0f at the end\n",
               M, N, K, name, nid, from_heur, nm, timed, s, def0, def1);
        for (int r = 0; r < 6 && r < timed; r++) {
            algo_name(&cand[order[r]], s, sizeof s);
            printf("    %5.0f  %s\n", ctf[order[r]], s);
        }
        // the best three against the heuristic's first, called in turn (time_interleaved: not in
        // rounds, where the one timed second runs at the clocks the first left)
        int top = timed < 3 ? timed : 3;
        const cublasLtMatmulAlgo_t *turn[4] = {&p->algo};
        for (int r = 0; r < top; r++) turn[1 + r] = &cand[order[r]];
        double ms[4];
        time_interleaved([&](int k, int b) { run(turn[k], b, y); }, 1 + top, nb, 10, ms);
        printf("    in turn: heuristic %.0f", tflops_of(M, N, K, ms[0]));
        for (int r = 0; r < top; r++) {
            run(&p->algo, 0, y);
            run(turn[1 + r], 0, y2);
            double md = 0, my = 0;
            compare_bf16(y, y2, (size_t)M * N, &md, &my);
            printf(" | #%d %.0f (%.3fx; max |diff| %.3g of max |y| %.3g)", r + 1, tflops_of(M, N, K, ms[1 + r]), ms[0] / ms[1 + r], md, my);
        }
        printf("\n");
        fflush(stdout);
        cudaEventDestroy(e0); cudaEventDestroy(e1);
    }
    operands_free(o, nb);
    cudaFree(y); cudaFree(y2);
}

int main(int argc, char **argv) {
    const char *peers_path = NULL;
    int abshape[16][3], nab = 0, sshape[16][3], nss = 0;
    int quick = 0, validate_only = 0, decode = 0, dshapes[16][2], nds = 0, dm = 0, pshape[3] = {0, 0, 0}, ashape[3] = {0, 0, 0};
    double sustain = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--peers") && i + 1 < argc) peers_path = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--validate")) validate_only = 1;
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--decode-shape") && i + 1 < argc && nds < 16 &&
                 sscanf(argv[++i], "%dx%d", &dshapes[nds][0], &dshapes[nds][1]) == 2) nds++, decode = 1;
        else if (!strcmp(argv[i], "--decode-m") && i + 1 < argc) dm = atoi(argv[++i]), decode = 1;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc &&
                 sscanf(argv[++i], "%dx%dx%d", &pshape[0], &pshape[1], &pshape[2]) == 3) {}
        else if (!strcmp(argv[i], "--sustain") && i + 1 < argc) sustain = atof(argv[++i]);
        else if (!strcmp(argv[i], "--lt-algos") && i + 1 < argc &&
                 sscanf(argv[++i], "%dx%dx%d", &ashape[0], &ashape[1], &ashape[2]) == 3) {}
        else if (!strcmp(argv[i], "--lt-search") && i + 1 < argc && nss < 16 &&
                 sscanf(argv[++i], "%dx%dx%d", &sshape[nss][0], &sshape[nss][1], &sshape[nss][2]) == 3) nss++;
        else if (!strcmp(argv[i], "--ab") && i + 1 < argc && nab < 16 &&
                 sscanf(argv[++i], "%dx%dx%d", &abshape[nab][0], &abshape[nab][1], &abshape[nab][2]) == 3) nab++;
        else die("usage: %s [--peers peers.json] [--quick] [--validate] [--decode [--decode-shape NxK]... [--decode-m M]] [--profile MxNxK [--sustain S]] [--lt-algos MxNxK] [--lt-search MxNxK]... [--ab MxNxK]...", argv[0]);
    }
    fp8_cuda_init(NULL);
    if (!ctx.has_fp8) die("gemm_fp8 benchmarks FP8 tensor cores: this GPU has none");
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    int drv = 0;
    cudaDriverGetVersion(&drv);
    printf("gemm_fp8: %s (sm_%d%d, %d SMs), driver %d, cuBLASLt %zu, wgmma kernels %s\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, drv, cublasLtGetVersion(), ctx.wgmma ? "on" : "off (no sm_90a GPU and build)");
    if (nab) {
        for (int i = 0; i < nab; i++) ab_bench(abshape[i][0], abshape[i][1], abshape[i][2]);
        fp8_cuda_free();
        return 0;
    }
    if (nss) {
        setvbuf(stdout, NULL, _IOLBF, 0);  // a long search: each line as it comes
        for (int i = 0; i < nss; i++) lt_search_bench(sshape[i][0], sshape[i][1], sshape[i][2]);
        fp8_cuda_free();
        return 0;
    }
    if (ashape[0] > 0) {
        lt_algos_bench(ashape[0], ashape[1], ashape[2]);
        fp8_cuda_free();
        return 0;
    }
    if (pshape[0] > 0) {
        profile_bench(pshape[0], pshape[1], pshape[2], sustain);
        fp8_cuda_free();
        return 0;
    }
    if (decode) {
        decode_bench(dshapes, nds, dm);
        fp8_cuda_free();
        return 0;
    }
    int fails = validate();
    if (fails) printf("validation: %d FAILED\n", fails);
    if (validate_only) { fp8_cuda_free(); return fails ? 1 : 0; }

    Peer peers[32];
    int np = peers_path ? load_peers(peers_path, peers, 32) : 0;
    int shapes[][3] = {{8192, 4096, 4096}, {8192, 12288, 4096}, {8192, 4096, 12288}, {8192, 3072, 1024},
                       {8192, 1024, 3072}, {64, 12288, 4096},   {64, 4096, 12288},  {4096, 4096, 4096}};
    int ns = quick ? 2 : (int)(sizeof shapes / sizeof shapes[0]);
    typedef struct { double bf16, lt[3], lt_fast, v3[3], v2, v4, v5, v6[3], v7[3], lt_block2, v6_block2, v7_block2, bf16_2, turn[5], dob[4]; const char *au_be[3]; } Row;
    Row rows[16];
    for (int si = 0; si < ns; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        size_t set_bytes = (size_t)(M + N) * K * 3;  // bf16 + fp8 of X and W
        int nb = (int)((160u << 20) / set_bytes) + 1;
        if (nb < 2) nb = 2;
        if (nb > 8) nb = 8;
        OperandSet o[8];
        __nv_bfloat16 *y;
        operands_make(o, nb, M, N, K);
        cudaCheck(cudaMalloc(&y, (size_t)M * N * 2));
        auto tflops = [&](double ms) { return tflops_of(M, N, K, ms); };
        Row &r = rows[si];
        r.bf16 = tflops(time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0); }, nb));
        fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
        for (int gi = 0; gi < 3; gi++)
            r.lt[gi] = tflops(time_ms([&](int b) { fp8_gemm_cuda(y, DT_BF16, &o[b].x[gi], &o[b].w[gi], 0); }, nb));
        // BF16 and cuBLASLt again, timed as peers.py times torch (its order: bf16, tensor, row, block)
        r.dob[0] = tflops(time_ms_flushed([&]() { bf16_gemm_cuda(y, DT_BF16, o[0].xb, o[0].wb, M, N, K, 0); }));
        for (int gi = 0; gi < 3; gi++)
            r.dob[1 + gi] = tflops(time_ms_flushed([&]() { fp8_gemm_cuda(y, DT_BF16, &o[0].x[gi], &o[0].w[gi], 0); }));
        fp8_cuda_set_fast_accum(1);
        r.lt_fast = tflops(time_ms([&](int b) { fp8_gemm_cuda(y, DT_BF16, &o[b].x[0], &o[b].w[0], 0); }, nb));
        fp8_cuda_set_fast_accum(0);
        fp8_cuda_set_backend(FP8_GEMM_AUTO);
        for (int gi = 0; gi < 3; gi++)
            r.v3[gi] = tflops(time_ms([&](int b) { GemmArgs a = gemm_args(&o[b].x[gi], &o[b].w[gi], 0); launch_v3(y, a); }, nb));
        r.v2 = 0;
        if (M == 4096)
            r.v2 = tflops(time_ms([&](int b) { GemmArgs a = gemm_args(&o[b].x[2], &o[b].w[2], 0); launch_v2(y, a); }, nb));
        r.v4 = r.v5 = r.lt_block2 = r.v6_block2 = r.v7_block2 = 0;
        for (int gi = 0; gi < 3; gi++) r.v6[gi] = r.v7[gi] = 0;
        if (ctx.wgmma) {  // Hopper versions; block first, then LT block and v6 block again (run-to-run spread)
            r.v4 = tflops(time_ms([&](int b) { GemmArgs a = gemm_args(&o[b].x[2], &o[b].w[2], 0); launch_v45<4>(y, a); }, nb));
            r.v5 = tflops(time_ms([&](int b) { GemmArgs a = gemm_args(&o[b].x[2], &o[b].w[2], 0); launch_v45<5>(y, a); }, nb));
            for (int gi = 0; gi < 3; gi++)
                r.v6[gi] = tflops(time_ms([&](int b) { GemmArgs a = gemm_args(&o[b].x[gi], &o[b].w[gi], 0); launch_v6(y, DT_BF16, a, 6); }, nb));
            for (int gi = 0; gi < 3; gi++)
                r.v7[gi] = tflops(time_ms([&](int b) { GemmArgs a = gemm_args(&o[b].x[gi], &o[b].w[gi], 0); launch_v6(y, DT_BF16, a, 7); }, nb));
            fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
            r.lt_block2 = tflops(time_ms([&](int b) { fp8_gemm_cuda(y, DT_BF16, &o[b].x[2], &o[b].w[2], 0); }, nb));
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
            r.v6_block2 = tflops(time_ms([&](int b) { GemmArgs a = gemm_args(&o[b].x[2], &o[b].w[2], 0); launch_v6(y, DT_BF16, a, 6); }, nb));
            r.v7_block2 = tflops(time_ms([&](int b) { GemmArgs a = gemm_args(&o[b].x[2], &o[b].w[2], 0); launch_v6(y, DT_BF16, a, 7); }, nb));
        }
        r.bf16_2 = tflops(time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0); }, nb));
        // FP8 as the program runs it (AUTO) against BF16, the kernels called in turn
        // (time_interleaved: BF16, tensor, row, block, block again, 10 calls each between events),
        // so that all run at the same clocks. Timed one after the other they do not: BF16 timed
        // first ran 795 TFLOP/s at 8192x4096x4096 and 682 when timed again after the FP8 kernels
        // (power-capped clocks). Block scaling's two timings are the method's control (a ratio of
        // 1.00 when a kernel's place in the turn does not matter).
        {
            double ms[5];
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
            time_interleaved([&](int k, int b) {
                if (k == 0) { bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0); return; }
                int gi = k < 4 ? k - 1 : 2;
                fp8_gemm_cuda(y, DT_BF16, &o[b].x[gi], &o[b].w[gi], 0);
                r.au_be[gi] = fp8_cuda_last_backend();
            }, 5, nb, 10, ms);
            for (int j = 0; j < 5; j++) r.turn[j] = tflops(ms[j]);
        }
        printf("  %5dx%5dx%5d  in turn: bf16 %4.0f, AUTO tensor %4.0f (%s) row %4.0f (%s) block %4.0f (%s); bf16 timed first %4.0f, "
               "again after the FP8 kernels %4.0f\n", M, N, K, r.turn[0], r.turn[1], r.au_be[0], r.turn[2], r.au_be[1], r.turn[3],
               r.au_be[2], r.bf16, r.bf16_2);
        printf("  %5dx%5dx%5d  bf16 %4.0f  lt tensor %4.0f (fast %4.0f) row %4.0f block %4.0f (again %4.0f) | v3 t/r/b %4.0f %4.0f %4.0f"
               "  v2 %4.0f | v4 b %4.0f  v5 b %4.0f  v6 t/r/b %4.0f %4.0f %4.0f (block again %4.0f)  v7 t/r/b %4.0f %4.0f %4.0f\n",
               M, N, K, r.bf16, r.lt[0], r.lt_fast, r.lt[1], r.lt[2], r.lt_block2, r.v3[0], r.v3[1], r.v3[2], r.v2, r.v4, r.v5,
               r.v6[0], r.v6[1], r.v6[2], r.v6_block2, r.v7[0], r.v7[1], r.v7[2]);
        fflush(stdout);
        operands_free(o, nb);
        cudaFree(y);
    }

    // activation quantization bandwidth (bf16 in, fp8 + scales out) at 8192 x 4096
    {
        int M = 8192, K = 4096;
        __nv_bfloat16 *xb;
        cudaCheck(cudaMalloc(&xb, (size_t)M * K * 2));
        fill_bf16_random(xb, (size_t)M * K, 7);
        printf("\nactivation quantization, %d x %d bf16 -> e4m3 (bytes = 3 per element; floor ~3.0 TB/s):", M, K);
        for (int gi = 0; gi < 3; gi++) {
            FP8Tensor t = fp8_alloc_dev(M, K, GRANS[gi], 1);
            double ms = time_ms([&](int) { fp8_quantize_cuda(&t, xb, DT_BF16, 0); }, 1);
            printf("  %s %.0f GB/s", fp8_gran_name(GRANS[gi]), 3.0 * M * K / (ms * 1e-3) / 1e9);
            fp8_free_dev(&t);
        }
        FP8Tensor t = fp8_alloc_dev(K, K, FP8_BLOCK, 128);
        double ms = time_ms([&](int) { fp8_quantize_cuda(&t, xb, DT_BF16, 0); }, 1);
        printf("  weight 128x128 (%dx%d) %.0f GB/s\n", K, K, 3.0 * K * K / (ms * 1e-3) / 1e9);
        fp8_free_dev(&t);
        cudaFree(xb);
    }

    // the summary table (markdown), last
    {
        printf("\n## FP8 GEMM, TFLOP/s, bf16 output, %s\n\n", prop.name);
        printf("| M x N x K | BF16 ours | BF16 torch | FP8 tensor ours | torch | ratio | FP8 row ours | torch | ratio | "
               "FP8 block ours | torch | ratio | FP8/BF16 ours: tensor, row, block | kernel v3 block | v3/LT block |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int si = 0; si < ns; si++) {
            int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            Peer *pe = peer_of(peers, np, M, N, K);
            Row &r = rows[si];
            double bf = r.bf16, *lt = r.lt;
            double pv[3] = {pe ? pe->tensor : 0, pe ? pe->row : 0, pe ? pe->block : 0};
            printf("| %dx%dx%d | %.0f | ", M, N, K, bf);
            if (pe) printf("%.0f ", pe->bf16); else printf("- ");
            for (int gi = 0; gi < 3; gi++) print_vs_peer(lt[gi], pv[gi]);
            printf("| %.2f, %.2f, %.2f | %.0f | %.2f |\n", lt[0] / bf, lt[1] / bf, lt[2] / bf, r.v3[2], r.v3[2] / lt[2]);
        }
    }
    if (np) {
        printf("\n## cuBLASLt and torch timed alike (triton's do_bench: L2 flushed before each call), TFLOP/s\n\n");
        printf("| M x N x K | BF16 ours | torch | ratio | FP8 tensor ours | torch | ratio | row ours | torch | ratio | block ours | torch | ratio |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int si = 0; si < ns; si++) {
            int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            Peer *pe = peer_of(peers, np, M, N, K);
            if (!pe) continue;
            double pv[4] = {pe->bf16, pe->tensor, pe->row, pe->block}, *d = rows[si].dob;
            printf("| %dx%dx%d ", M, N, K);
            for (int j = 0; j < 4; j++) print_vs_peer(d[j], pv[j]);
            printf("|\n");
        }
    }
    printf("\n## FP8 (AUTO) against BF16, the kernels called in turn (10 calls each between events; medians), TFLOP/s\n\n");
    printf("| M x N x K | BF16 | FP8 tensor | row | block | FP8/BF16: tensor | row | block | AUTO ran | control: block / block again |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < ns; si++) {
        Row &r = rows[si];
        const double *v = r.turn;
        printf("| %dx%dx%d | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f | %s, %s, %s | %.3f |\n", shapes[si][0], shapes[si][1],
               shapes[si][2], v[0], v[1], v[2], v[3], v[1] / v[0], v[2] / v[0], v[3] / v[0], r.au_be[0], r.au_be[1], r.au_be[2],
               v[3] / v[4]);
    }
    printf("\ntensor fast-accum (cuBLASLt heuristic):");
    for (int si = 0; si < ns; si++) printf(" %.0f", rows[si].lt_fast);
    printf("\nhand-written tiled v2 (block) at 4096^3: %.1f TFLOP/s\n", rows[ns - 1].v2);
    // the Hopper wgmma kernel against cuBLASLt and torch (markdown), last
    if (ctx.wgmma) {
        printf("\n## Hopper wgmma kernel, TFLOP/s, bf16 output, %s (ratios: the version fp8.cu runs, v6 or v7)\n\n", prop.name);
        printf("| M x N x K | block: LT | torch | v4 | v5 | v6 | v7 | /LT | /torch | /BF16 ours | tensor: LT | v6 | v7 | /LT | "
               "row: LT | v6 | v7 | /LT |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int si = 0; si < ns; si++) {
            int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            Peer *pe = peer_of(peers, np, M, N, K);
            Row &r = rows[si];
            double d[3];  // the version fp8_gemm_cuda runs for each granularity
            int v7 = wgmma_version(M, N, K) == 7;
            for (int gi = 0; gi < 3; gi++) d[gi] = v7 ? r.v7[gi] : r.v6[gi];
            printf("| %dx%dx%d | %.0f | ", M, N, K, r.lt[2]);
            if (pe && pe->block > 0) printf("%.0f ", pe->block); else printf("- ");
            printf("| %.0f | %.0f | %.0f | %.0f | %.2f | ", r.v4, r.v5, r.v6[2], r.v7[2], d[2] / r.lt[2]);
            if (pe && pe->block > 0) printf("%.2f ", d[2] / pe->block); else printf("- ");
            printf("| %.2f | %.0f | %.0f | %.0f | %.2f | %.0f | %.0f | %.0f | %.2f |\n", d[2] / r.bf16, r.lt[0], r.v6[0], r.v7[0],
                   d[0] / r.lt[0], r.lt[1], r.v6[1], r.v7[1], d[1] / r.lt[1]);
        }
        printf("\nblock timed again after the others (LT/v6/v7):");
        for (int si = 0; si < ns; si++) printf(" %.0f/%.0f/%.0f", rows[si].lt_block2, rows[si].v6_block2, rows[si].v7_block2);
        printf("\n");
    }
    fp8_cuda_free();
    return fails ? 1 : 0;
}
