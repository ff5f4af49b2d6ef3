// dev/cuda/common.cuh: the harness the FP8 GEMM kernel versions of dev/cuda/ share (and dev/bench_gemm.cu,
// dev/cuda/cublaslt_search.cu): operands, the CPU reference, the validation, the timing, the printing.
//   defines: fill_normal_bf16, fp8_dev_alloc / fp8_dev_free / fp8_to_host, fp8_operands_make (random
//   bf16 operands quantized by the product's fp8_quantize_cuda), OperandSet (bf16 + FP8 at each
//   granularity), RefCase (the operands with fp8_gemm_cpu's product and sum |x w| on the
//   host), check_bf16 (worst error / tolerance), acc_of_backend, median / time_ms / time_interleaved /
//   time_ms_flushed, tflops_of, hopper_ready (an sm_90a GPU and build?), and gemm_version_main: the
//   main of every dev/cuda/fp8_gemm_v*.cu (parse, validate, time against cuBLASLt, print a summary).
// Links with ../build/libfp8grpo.a (fp8_quantize_cuda, fp8_gemm_cuda with the cuBLASLt backend,
// fp8_gemm_cpu); the kernels themselves use the product headers (cuda_common.cuh, hopper.cuh,
// fp8_gemm.cuh) for their PTX wrappers and scale lookups.
//
// The product is Y[M,N] = X[M,K] W[N,K]^T with X an activation (1x128 groups for block scaling) and
// W a weight (128x128 tiles), both E4M3, bf16 output. The data: standard normal bf16 values (as
// the notebook's benchmarks (dev/notes/gemm.md) used; never all zeros, whose low power would flatter the clocks),
// quantized on the GPU with dynamic amax scales, so every scale is a real one.
//
// The tolerance (as test/gpu_fp8.cu derives it): |y - ref| <= ACC sum_k |x_k w_k| + 2^-8 |ref|,
// the second term the bf16 output's rounding; ACC = 2^-10 for kernels that accumulate in fp32
// (the recursive-summation bound (K + 4) 2^-24 for K <= 16384; also mma.sync, whose e4m3 products
// are exact), 2^-8 for the Hopper tensor cores' reduced-precision sums inside a 128-wide K step
// (~14 bits: a group of 32 products loses < 32 * 2^-13 of its sum |x w|).
#ifndef DEV_CUDA_COMMON_CUH
#define DEV_CUDA_COMMON_CUH

#include "cuda/cuda_common.cuh"
#include "cuda/fp8_cuda.h"
#include "cuda/fp8_gemm.cuh"
#include "cuda/wgmma_tile.cuh"  // hopper.cuh and the tile pieces the Hopper versions share with fp8_hopper.cu

// the H100 SXM's dense FP8 tensor-core peak from NVIDIA's datasheet (3958 is the figure with 2:4
// sparsity): a floor no kernel reaches (boost clock; these GEMMs run power-capped at ~1.3-1.5 GHz)
#define H100_FP8_DENSE_TFLOPS 1979.0
#define L2_BYTES (50u << 20)          // the H100's L2: timed operands rotate over more than this
#define ACC_FP32 0x1p-10              // tolerance of fp32-accumulating kernels (see above)
#define ACC_TC 0x1p-8                 // of the Hopper FP8 tensor cores
static const FP8Gran GRANS[3] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};  // the granularities, in table order

// ----------------------------------------------------------------------------
// operands

// x[i] ~ N(0, 1) rounded to bf16, from (seed, i) alone (a splitmix64 hash, Box-Muller): the same
// values whatever the launch shape
__global__ void fill_normal_bf16_kernel(bf16 *x, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        // u1 in (0, 1) and 2 u2 never 1/2 or 3/2: no value is exactly zero
        float u1 = ((uint32_t)(z >> 41) + 0.5f) * (1.0f / 8388608.0f), u2 = ((uint32_t)(z & 0xffffff) + 0.5f) * (1.0f / 16777216.0f);
        x[i] = __float2bfloat16_rn(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
    }
}
static inline void fill_normal_bf16(bf16 *x, size_t n, uint64_t seed) {
    fill_normal_bf16_kernel<<<grid_for(n), 256>>>(x, n, seed);
    launchCheck();
}

// an FP8 tensor (rows, cols) on the device; block_rows: 1 for activations, 128 for weights (BLOCK)
static inline FP8Tensor fp8_dev_alloc(int rows, int cols, FP8Gran g, int block_rows) {
    FP8Tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows; t.cols = cols; t.gran = g; t.fmt = FP8_E4M3; t.block_rows = g == FP8_BLOCK ? block_rows : 0;
    cudaCheck(cudaMalloc(&t.data, (size_t)rows * cols));
    cudaCheck(cudaMalloc(&t.scale, fp8_num_scales(g, rows, cols, t.block_rows) * sizeof(float)));
    return t;
}
static inline void fp8_dev_free(FP8Tensor *t) {
    cudaFree(t->data);
    cudaFree(t->scale);
    t->data = NULL;
    t->scale = NULL;
}
// a host copy (free with fp8_tensor_free_cpu)
static inline FP8Tensor fp8_to_host(const FP8Tensor *d) {
    FP8Tensor h = *d;
    size_t ns = fp8_num_scales(d->gran, d->rows, d->cols, d->block_rows);
    h.data = (uint8_t *)mallocCheck((size_t)d->rows * d->cols);
    h.scale = (float *)mallocCheck(ns * sizeof(float));
    cudaCheck(cudaMemcpy(h.data, d->data, (size_t)d->rows * d->cols, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h.scale, d->scale, ns * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// X (M, K) and W (N, K) at granularity g: random bf16 values quantized by the product's kernels
static inline void fp8_operands_make(FP8Tensor *x, FP8Tensor *w, int M, int N, int K, FP8Gran g, uint64_t seed) {
    bf16 *xb, *wb;
    cudaCheck(cudaMalloc(&xb, (size_t)M * K * sizeof(bf16)));
    cudaCheck(cudaMalloc(&wb, (size_t)N * K * sizeof(bf16)));
    fill_normal_bf16(xb, (size_t)M * K, 2 * seed);
    fill_normal_bf16(wb, (size_t)N * K, 2 * seed + 1);
    *x = fp8_dev_alloc(M, K, g, 1);
    *w = fp8_dev_alloc(N, K, g, FP8_BLOCK_SIZE);
    fp8_quantize_cuda(x, xb, DT_BF16, 0);
    fp8_quantize_cuda(w, wb, DT_BF16, 0);
    cudaCheck(cudaDeviceSynchronize());
    cudaFree(xb);
    cudaFree(wb);
}

// One product's operands in bf16 and in FP8 at each granularity (x[gi] for GRANS[gi]); benchmarks
// rotate through several so that the timings read from memory, not from L2.
typedef struct {
    bf16 *xb, *wb;      // (M, K), (N, K) bf16
    FP8Tensor x[3], w[3];
} OperandSet;
static inline void operands_make(OperandSet *o, int nb, int M, int N, int K) {
    for (int b = 0; b < nb; b++) {
        cudaCheck(cudaMalloc(&o[b].xb, (size_t)M * K * sizeof(bf16)));
        cudaCheck(cudaMalloc(&o[b].wb, (size_t)N * K * sizeof(bf16)));
        fill_normal_bf16(o[b].xb, (size_t)M * K, 100 + b);
        fill_normal_bf16(o[b].wb, (size_t)N * K, 200 + b);
        for (int gi = 0; gi < 3; gi++) {
            o[b].x[gi] = fp8_dev_alloc(M, K, GRANS[gi], 1);
            o[b].w[gi] = fp8_dev_alloc(N, K, GRANS[gi], FP8_BLOCK_SIZE);
            fp8_quantize_cuda(&o[b].x[gi], o[b].xb, DT_BF16, 0);
            fp8_quantize_cuda(&o[b].w[gi], o[b].wb, DT_BF16, 0);
        }
    }
    cudaCheck(cudaDeviceSynchronize());
}
static inline void operands_free(OperandSet *o, int nb) {
    for (int b = 0; b < nb; b++) {
        cudaFree(o[b].xb);
        cudaFree(o[b].wb);
        for (int gi = 0; gi < 3; gi++) { fp8_dev_free(&o[b].x[gi]); fp8_dev_free(&o[b].w[gi]); }
    }
}

// ----------------------------------------------------------------------------
// the CPU reference

// fp8_gemm_cpu (serial) on blocks of 16 rows of X in parallel: each block is an FP8 tensor of its
// own (block scaling's token-contiguous scales copied out), so the result is fp8_gemm_cpu's exactly
static inline void gemm_cpu_parallel(float *y, const FP8Tensor *x, const FP8Tensor *w) {
    int M = x->rows, N = w->rows, K = x->cols, KB = cdiv(K, FP8_BLOCK_SIZE);
#pragma omp parallel for schedule(dynamic)
    for (int m0 = 0; m0 < M; m0 += 16) {
        FP8Tensor xs = *x;
        float *sc = NULL;
        xs.rows = M - m0 < 16 ? M - m0 : 16;
        xs.data = x->data + (size_t)m0 * K;
        if (x->gran == FP8_ROW) xs.scale = x->scale + m0;
        if (x->gran == FP8_BLOCK) {
            sc = (float *)mallocCheck((size_t)KB * xs.rows * sizeof(float));
            for (int kb = 0; kb < KB; kb++)
                for (int r = 0; r < xs.rows; r++) sc[kb * xs.rows + r] = x->scale[(size_t)kb * M + m0 + r];
            xs.scale = sc;
        }
        fp8_gemm_cpu(y + (size_t)m0 * N, &xs, w);
        free(sc);
    }
}

// A validation case: X, W quantized on the GPU (the program's path), fp8_gemm_cpu of the same codes
// and scales, and sum_k |x_k w_k| of the dequantized operands (the tolerance's scale).
typedef struct {
    int M, N, K;
    FP8Tensor x, w;     // device
    float *ref, *mag;   // (M, N) host
} RefCase;

static inline void ref_case_make(RefCase *c, int M, int N, int K, FP8Gran g, uint64_t seed) {
    c->M = M; c->N = N; c->K = K;
    fp8_operands_make(&c->x, &c->w, M, N, K, g, seed);
    FP8Tensor hx = fp8_to_host(&c->x), hw = fp8_to_host(&c->w);
    c->ref = (float *)mallocCheck((size_t)M * N * sizeof(float));
    c->mag = (float *)mallocCheck((size_t)M * N * sizeof(float));
    gemm_cpu_parallel(c->ref, &hx, &hw);
    float *dx = (float *)mallocCheck((size_t)M * K * sizeof(float)), *dw = (float *)mallocCheck((size_t)N * K * sizeof(float));
    fp8_dequantize_cpu(dx, &hx);
    fp8_dequantize_cpu(dw, &hw);
#pragma omp parallel for schedule(dynamic)
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *xr = dx + (size_t)m * K, *wr = dw + (size_t)n * K;
            float a = 0.0f;
            for (int k = 0; k < K; k++) a += fabsf(xr[k] * wr[k]);
            c->mag[(size_t)m * N + n] = a;
        }
    free(dx); free(dw);
    fp8_tensor_free_cpu(&hx);
    fp8_tensor_free_cpu(&hw);
}
static inline void ref_case_free(RefCase *c) {
    fp8_dev_free(&c->x);
    fp8_dev_free(&c->w);
    free(c->ref);
    free(c->mag);
}

// worst |y - ref| / (acc sum|x w| + 2^-8 |ref|) of a bf16 device output (<= 1 passes; an unwritten,
// NaN-poisoned element counts as infinity); the first failures go to stderr under `label`
static inline double check_bf16(const RefCase *c, const bf16 *y, double acc, const char *label) {
    size_t n = (size_t)c->M * c->N;
    uint16_t *h = (uint16_t *)mallocCheck(n * sizeof(uint16_t));
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(h, y, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    double worst = 0;
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        double r = c->ref[i], v = bf16_to_f32(h[i]), tol = acc * c->mag[i] + 0x1p-8 * fabs(r);
        double e = tol > 0 ? fabs(v - r) / tol : v == r ? 0.0 : INFINITY;
        if (!(e <= 1.0) && shown++ < 3)
            fprintf(stderr, "    %s %dx%dx%d %s: y[%zu, %zu] = %.6g, want %.6g (tolerance %.3g)\n", label, c->M, c->N, c->K,
                    fp8_gran_name(c->x.gran), i / c->N, i % c->N, v, r, tol);
        if (!(e <= worst)) worst = e == e ? e : INFINITY;
    }
    free(h);
    return worst;
}

// the ACC of the tolerance for what fp8_gemm_cuda ran (fp8_cuda_last_backend)
static inline double acc_of_backend(const char *backend) {
    if (!strcmp(backend, "kernel-mma")) return ACC_FP32;  // fp32 sums (on sm_90 the e4m3 mma runs as f16 HMMA)
    if (!strcmp(backend, "bf16-fallback")) return 2 * 0x1p-8 + ACC_FP32;  // each operand rounded to bf16 (8 significant bits: 2^-8)
    return ACC_TC;  // cublaslt, kernel-wgmma, kernel-decode
}

// ----------------------------------------------------------------------------
// timing. All on the default stream (the product's, with fp8_cuda_init(NULL)).

static inline double median(double *v, int n) {  // sorts v
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && v[k] < v[k - 1]; k--) { double t = v[k]; v[k] = v[k - 1]; v[k - 1] = t; }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline double tflops_of(int M, int N, int K, double ms) { return 2.0 * M * N * K / (ms * 1e-3) / 1e12; }

// median time in ms of op(b) over up to 100 repeats, b rotating over nb operand sets. The repeats
// are queued back to back with an event between each (no host sync inside), so the GPU never waits
// for a launch and the events measure kernel time, as triton's do_bench does.
template <typename F>
static double time_ms(F op, int nb) {
    enum { REPS = 100 };
    cudaEvent_t e[REPS + 1];
    for (int i = 0; i <= REPS; i++) cudaCheck(cudaEventCreate(&e[i]));
    for (int i = 0; i < 5; i++) op(i % nb);  // warm-up (plans, heuristics, clocks)
    cudaCheck(cudaDeviceSynchronize());
    float ms1;  // one timed call, to size the repeats to ~300 ms
    cudaCheck(cudaEventRecord(e[0]));
    op(0);
    cudaCheck(cudaEventRecord(e[1]));
    cudaCheck(cudaEventSynchronize(e[1]));
    cudaCheck(cudaEventElapsedTime(&ms1, e[0], e[1]));
    int reps = (int)(300.0 / (ms1 + 1e-3));
    reps = reps < 20 ? 20 : reps > REPS ? REPS : reps;
    cudaCheck(cudaEventRecord(e[0]));
    for (int i = 0; i < reps; i++) {
        op((i + 1) % nb);
        cudaCheck(cudaEventRecord(e[i + 1]));
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
// than when timed first at K >= 4096 (dev/notes/gemm.md, the 23:00 runs). With burst > 1 an event's own
// cost (~1 us a call, 1-3% of a 50 us GEMM) is shared by burst calls. Passes sized to ~1.5 s, at
// least 10.
template <typename F>
static void time_interleaved(F op, int n, int nb, int burst, double *ms) {
    enum { EVENTS = 2001 };
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < n; k++) op(k, i % nb);  // warm-up
    cudaEvent_t *e = (cudaEvent_t *)mallocCheck(EVENTS * sizeof(cudaEvent_t));
    for (int i = 0; i < EVENTS; i++) cudaCheck(cudaEventCreate(&e[i]));
    float pass;  // one pass of every op, to size the passes
    cudaCheck(cudaEventRecord(e[0]));
    for (int k = 0; k < n; k++)
        for (int j = 0; j < burst; j++) op(k, j % nb);
    cudaCheck(cudaEventRecord(e[1]));
    cudaCheck(cudaEventSynchronize(e[1]));
    cudaCheck(cudaEventElapsedTime(&pass, e[0], e[1]));
    int reps = (int)(1500.0 / (pass + 1e-3)), cap = (EVENTS - 1) / n;
    reps = reps < 10 ? 10 : reps > cap ? cap : reps;
    cudaCheck(cudaEventRecord(e[0]));
    for (int r = 0, b = 0; r < reps; r++)
        for (int k = 0; k < n; k++) {
            for (int j = 0; j < burst; j++) op(k, b++ % nb);
            cudaCheck(cudaEventRecord(e[r * n + k + 1]));
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
    free(e);
    free(t);
}

// median time in ms of op() timed as triton's do_bench times torch in dev/peers.py: the same
// operands every call, L2 flushed (a 256 MiB memset) before each, events around the call alone. A
// kernel timed so can run faster than back to back on the power-capped H100 (cuBLASLt block at
// 8192x4096x4096: 0.91-0.93 of torch back to back, 0.96 so; dev/notes/gemm.md, the 21:30 runs).
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
        cudaCheck(cudaMemsetAsync(flush, 0, flush_bytes));
        cudaCheck(cudaEventRecord(e0[i]));
        op();
        cudaCheck(cudaEventRecord(e1[i]));
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

// ----------------------------------------------------------------------------
// the machine

static inline cudaDeviceProp gpu_props(void) {
    int dev;
    cudaDeviceProp p;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&p, dev));
    return p;
}
static inline int num_sms(void) {
    static int sms;
    if (!sms) sms = gpu_props().multiProcessorCount;
    return sms;
}

// 1 if this TU was compiled with sm_90a code (hopper.cuh's FP8_SM90A): a plain sm_90 or another
// target compiles the Hopper kernels empty
__global__ void dev_sm90a_probe_kernel(int *out) {
#ifdef FP8_SM90A
    *out = 1;
#else
    *out = 0;
#endif
}

// whether the TMA + wgmma kernels of this program can run here: an sm_90 GPU, sm_90a code in this
// build, the driver's tensor-map encoder. If not, why (one line).
static inline int hopper_ready(char *why, size_t cap) {
    cudaDeviceProp p = gpu_props();
    if (p.major != 9 || p.minor != 0) {
        snprintf(why, cap, "the GPU is %.100s (sm_%d%d): TMA + wgmma need an sm_90 GPU (H100, H200)", p.name, p.major, p.minor);
        return 0;
    }
    int *d, h = 0;
    cudaCheck(cudaMalloc(&d, sizeof(int)));
    dev_sm90a_probe_kernel<<<1, 1>>>(d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess || !h) {
        cudaGetLastError();
        snprintf(why, cap, "this build has no sm_90a code (%s): rebuild with make -C dev GPU_ARCH=90a",
                 e != cudaSuccess ? cudaGetErrorName(e) : "wgmma compiled empty");
        return 0;
    }
    if (!tma_encoder()) {
        snprintf(why, cap, "the driver has no cuTensorMapEncodeTiled (TMA): update the driver");
        return 0;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// the main of a kernel version (dev/cuda/fp8_gemm_v*.cu)

typedef struct {
    const char *name;     // the program, "fp8_gemm_v1_naive"
    const char *label;    // its column, "v1"
    const char *what;     // one line: what the version is
    double acc;           // ACC of its tolerance: ACC_FP32 or ACC_TC
    int hopper;           // 1: TMA + wgmma, needs hopper_ready()
    int k_multiple;       // K must be a multiple of this (TMA: 16-byte rows)
    void (*launch)(bf16 *y, const GemmArgs &a);  // Y (bf16, =) = X W^T on the default stream
} GemmVersion;

// partial tiles in M, N and K (528: a partial last 128-wide step), N not a multiple of 8 (100: no TMA
// store), a square with full tiles, and more tiles than SMs with a last, partial group of tile rows
// (1300 x 2504: 11 x 20 tiles of 128 x 128) for the persistent version
static const int VAL_SHAPES[][3] = {{300, 264, 528}, {130, 100, 528}, {1024, 1024, 1024}, {1300, 2504, 256}};
#define N_VAL_SHAPES ((int)(sizeof VAL_SHAPES / sizeof VAL_SHAPES[0]))

static inline void version_usage(const GemmVersion &v) {
    die("usage: %s [M N K] [--gran tensor|row|block|all] [--validate]   (default 8192 4096 4096, all; --validate: "
        "the validation alone)", v.name);
}

// validate at every shape of VAL_SHAPES and each chosen granularity, then time the version against
// cuBLASLt (the product's fp8_gemm_cuda, forced to FP8_GEMM_CUBLASLT) at M x N x K, in turn; the
// summary table last. Returns the exit status: 1 if any validation fails.
static inline int gemm_version_main(int argc, char **argv, const GemmVersion &v) {
    int shape[3] = {8192, 4096, 4096}, nshape = 0, gmask = 7, validate_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gran") && i + 1 < argc) {
            const char *g = argv[++i];
            int p = fp8_gran_parse(g);
            if (!strcmp(g, "all")) gmask = 7;
            else if (p >= FP8_TENSOR) gmask = 1 << (p - FP8_TENSOR);
            else version_usage(v);
        } else if (!strcmp(argv[i], "--validate")) validate_only = 1;
        else if (argv[i][0] != '-' && nshape < 3 && atoi(argv[i]) > 0) shape[nshape++] = atoi(argv[i]);
        else version_usage(v);
    }
    if (nshape != 0 && nshape != 3) version_usage(v);
    int M = shape[0], N = shape[1], K = shape[2];
    if (K % v.k_multiple) die("%s: K = %d must be a multiple of %d (TMA moves 16-byte rows)", v.name, K, v.k_multiple);

    fp8_cuda_init(NULL);
    cudaDeviceProp p = gpu_props();
    printf("%s: %s (sm_%d%d, %d SMs): %s\n", v.name, p.name, p.major, p.minor, p.multiProcessorCount, v.what);
    char why[256];
    if (v.hopper && !hopper_ready(why, sizeof why)) {
        printf("%s: cannot run here: %s\n", v.name, why);
        return 1;
    }

    // validation
    double worst[3] = {0, 0, 0};
    int fails = 0;
    bf16 *y;
    printf("validation against fp8_gemm_cpu (bf16 out; worst |err| / (%s sum|x w| + 2^-8 |ref|), <= 1 passes):\n",
           v.acc == ACC_TC ? "2^-8" : "2^-10");
    for (int si = 0; si < N_VAL_SHAPES; si++) {
        int m = VAL_SHAPES[si][0], n = VAL_SHAPES[si][1], k = VAL_SHAPES[si][2];
        cudaCheck(cudaMalloc(&y, (size_t)m * n * sizeof(bf16)));
        printf("  %5dx%5dx%5d", m, n, k);
        for (int gi = 0; gi < 3; gi++) {
            if (!(gmask >> gi & 1)) continue;
            RefCase c;
            ref_case_make(&c, m, n, k, GRANS[gi], 1 + si);
            cudaCheck(cudaMemset(y, 0xFF, (size_t)m * n * sizeof(bf16)));  // NaN poison: every output must be written
            GemmArgs a = gemm_args(&c.x, &c.w, 0);
            v.launch(y, a);
            launchCheck();
            double e = check_bf16(&c, y, v.acc, v.label);
            printf("  %s %.3f%s", fp8_gran_name(GRANS[gi]), e, e <= 1.0 ? "" : " FAIL");
            fflush(stdout);
            if (e > worst[gi]) worst[gi] = e;
            fails += !(e <= 1.0);
            ref_case_free(&c);
        }
        printf("\n");
        cudaFree(y);
    }
    if (fails) {
        printf("%s: validation FAILED (%d cases over the tolerance)\n", v.name, fails);
        return 1;
    }
    if (validate_only) {
        printf("%s: validation passed\n", v.name);
        return 0;
    }

    // timing: the version and cuBLASLt called in turn over nb operand sets of > 3x L2 in all
    size_t set_bytes = (size_t)(M + N) * K;
    int nb = (int)((3 * (size_t)L2_BYTES) / set_bytes) + 1;
    nb = nb < 2 ? 2 : nb > 64 ? 64 : nb;
    double tf[3] = {0, 0, 0}, lt[3] = {0, 0, 0};
    cudaCheck(cudaMalloc(&y, (size_t)M * N * sizeof(bf16)));
    printf("timing %dx%dx%d (%d operand sets, %.0f MB), %s and cuBLASLt called in turn, medians:\n", M, N, K, nb,
           nb * set_bytes / 1e6, v.label);
    for (int gi = 0; gi < 3; gi++) {
        if (!(gmask >> gi & 1)) continue;
        FP8Tensor *x = (FP8Tensor *)mallocCheck(nb * sizeof(FP8Tensor)), *w = (FP8Tensor *)mallocCheck(nb * sizeof(FP8Tensor));
        for (int b = 0; b < nb; b++) fp8_operands_make(&x[b], &w[b], M, N, K, GRANS[gi], 50 + b);
        int has_lt = fp8_gemm_supported(FP8_GEMM_CUBLASLT, DT_BF16, &x[0], &w[0], why, sizeof why);
        if (!has_lt) printf("  (cuBLASLt declines %s: %s)\n", fp8_gran_name(GRANS[gi]), why);
        fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
        auto op = [&](int k, int b) {
            if (k == 0) v.launch(y, gemm_args(&x[b], &w[b], 0));
            else fp8_gemm_cuda(y, DT_BF16, &x[b], &w[b], 0);
        };
        // one call, to choose the burst: 10 calls between events for kernels of < 2 ms, else 1
        cudaEvent_t e0, e1;
        float one;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        op(0, 0);
        cudaCheck(cudaEventRecord(e0));
        op(0, 1 % nb);
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&one, e0, e1));
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        double ms[2] = {0, 0};
        time_interleaved(op, has_lt ? 2 : 1, nb, one < 2.0f ? 10 : 1, ms);
        fp8_cuda_set_backend(FP8_GEMM_AUTO);
        tf[gi] = tflops_of(M, N, K, ms[0]);
        lt[gi] = has_lt ? tflops_of(M, N, K, ms[1]) : 0;
        printf("  %-6s %s %8.1f TFLOP/s (%.3f ms)", fp8_gran_name(GRANS[gi]), v.label, tf[gi], ms[0]);
        if (has_lt) printf("  cuBLASLt %6.0f TFLOP/s  %s/cuBLASLt %.3f", lt[gi], v.label, tf[gi] / lt[gi]);
        printf("  %.1f%% of %.0f\n", 100 * tf[gi] / H100_FP8_DENSE_TFLOPS, H100_FP8_DENSE_TFLOPS);
        fflush(stdout);
        for (int b = 0; b < nb; b++) { fp8_dev_free(&x[b]); fp8_dev_free(&w[b]); }
        free(x);
        free(w);
    }
    cudaFree(y);

    printf("\n## %s, %dx%dx%d, E4M3, bf16 output, %s (%d SMs)\n\n", v.name, M, N, K, p.name, p.multiProcessorCount);
    printf("| granularity | validation: worst err / tol, %d shapes | %s TFLOP/s | cuBLASLt TFLOP/s (in turn) | %s / cuBLASLt "
           "| of the H100's %.0f TFLOP/s dense FP8 (datasheet) |\n", N_VAL_SHAPES, v.label, v.label, H100_FP8_DENSE_TFLOPS);
    printf("|---|---|---|---|---|---|\n");
    for (int gi = 0; gi < 3; gi++) {
        if (!(gmask >> gi & 1)) continue;
        printf("| %s | %.3f | %.1f | ", fp8_gran_name(GRANS[gi]), worst[gi], tf[gi]);
        if (lt[gi] > 0) printf("%.0f | %.3f ", lt[gi], tf[gi] / lt[gi]);
        else printf("- | - ");
        printf("| %.1f%% |\n", 100 * tf[gi] / H100_FP8_DENSE_TFLOPS);
    }
    fp8_cuda_free();
    return 0;
}

#endif  // DEV_CUDA_COMMON_CUH
