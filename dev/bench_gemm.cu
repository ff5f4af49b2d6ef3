// dev/bench_gemm.cu: the FP8 GEMM as the program runs it, Y[M,N] = X[M,K] W[N,K]^T with bf16 output,
// through the product's API (fp8_cuda.h, linked from ../build/libfp8grpo.a): fp8_gemm_cuda with AUTO's
// choice or one backend forced (fp8_cuda_set_backend: cuBLASLt, the mma.sync kernel = version 3, the
// Hopper wgmma kernel = version 7, the decode kernel = version 8, the BF16 path), bf16_gemm_cuda as
// the baseline, fp8_quantize_cuda for the operands.
//
//   make bench-gemm && ./build/bench_gemm [--peers peers.json] [--quick] [--validate]
//   ./build/bench_gemm --decode [--decode-shape NxK]... [--decode-m M]   the products of a decode step
//   ./build/bench_gemm --ab MxNxK ...      cuBLASLt against the hand-written kernel, alternating
//   ./build/bench_gemm --profile MxNxK [--sustain S]   each kernel twice (for ncu: --kernel-name
//                            regex:"gemm_fp8|nvjet"), then S seconds each with wall-clock spans
//   peers.json: python3 dev/peers.py gemm [--shape MxNxK ...] --json peers.json   (torch, same machine)
//
// Default mode: the validation of each backend against fp8_gemm_cpu (where fp8_gemm_supported says it
// can run the product), then at eight shapes (the M = 8192 products of dev/notes/gemm.md, two M = 64
// ones, 4096^3): every backend timed back to back (median of CUDA-event-timed calls over rotating
// operand sets larger than L2), BF16 and cuBLASLt timed as peers.py times torch (L2 flushed before
// each call) against torch, and FP8 as the program runs it (AUTO) against BF16 with the kernels called
// in turn, the table dev/notes/gemm.md compares across changes: printed last, naming the GPU.
// The kernel versions themselves (1, 2, 4, 5, 6 standalone; 3, 7, 8 in the product) and cuBLASLt's
// configurations (--lt-algos, --lt-search) are in dev/cuda/; their history in dev/cuda/README.md.
#include <cjson/cJSON.h>
#include <cublasLt.h>  // cublasLtGetVersion, for the header line

#include "cuda/common.cuh"

// the backends fp8_gemm_cuda can be forced to, in the validation's order
static const FP8GemmBackend BACKENDS[] = {FP8_GEMM_AUTO, FP8_GEMM_CUBLASLT, FP8_GEMM_MMA, FP8_GEMM_WGMMA, FP8_GEMM_DECODE, FP8_GEMM_BF16};
static const char *const BACKEND_NAMES[] = {"auto", "cublaslt", "mma", "wgmma", "decode", "bf16"};
#define N_BACKENDS 6

// ----------------------------------------------------------------------------
// validation: every backend at every granularity against fp8_gemm_cpu, on shapes with partial tiles
// (M = 200, 333, 2000; N = 200, 1544: a partial 128-wide weight block; K = 528: a partial last K step,
// which cuBLASLt's block scaling declines), the last with more tiles than SMs (the persistent loop).
// Tolerance (dev/cuda/common.cuh): ACC sum|x w| + 2^-8 |y|, ACC by what ran (acc_of_backend).

static int validate(void) {
    const int shapes[][3] = {{200, 384, 1024}, {333, 200, 528}, {2000, 1544, 256}};
    int fails = 0;
    printf("validation (bf16 out, vs fp8_gemm_cpu; worst error in units of the tolerance; - where the backend cannot run it):\n");
    for (int si = 0; si < 3; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        bf16 *y;
        cudaCheck(cudaMalloc(&y, (size_t)M * N * sizeof(bf16)));
        for (int gi = 0; gi < 3; gi++) {
            RefCase c;
            ref_case_make(&c, M, N, K, GRANS[gi], 1 + si);
            printf("  %4dx%4dx%4d %-6s", M, N, K, fp8_gran_name(GRANS[gi]));
            for (int bi = 0; bi < N_BACKENDS; bi++) {
                if (!fp8_gemm_supported(BACKENDS[bi], DT_BF16, &c.x, &c.w, NULL, 0)) {
                    printf("  %s -", BACKEND_NAMES[bi]);
                    continue;
                }
                cudaCheck(cudaMemset(y, 0xFF, (size_t)M * N * sizeof(bf16)));  // NaN poison: every output must be written
                fp8_cuda_set_backend(BACKENDS[bi]);
                fp8_gemm_cuda(y, DT_BF16, &c.x, &c.w, 0);
                const char *ran = fp8_cuda_last_backend();
                double worst = check_bf16(&c, y, acc_of_backend(ran), ran);
                if (BACKENDS[bi] == FP8_GEMM_AUTO) printf("  auto (%s) %.3f", ran, worst);
                else printf("  %s %.3f", BACKEND_NAMES[bi], worst);
                if (!(worst <= 1.0)) printf(" FAIL");
                fails += !(worst <= 1.0);
            }
            printf("\n");
            fflush(stdout);
            ref_case_free(&c);
        }
        cudaFree(y);
    }
    fp8_cuda_set_backend(FP8_GEMM_AUTO);
    return fails;
}

// ----------------------------------------------------------------------------
// torch's figures (dev/peers.py)

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
    if (!g) die("%s: no \"gemm\" list (write it with python3 dev/peers.py gemm --json FILE)", path);
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

// ----------------------------------------------------------------------------
// --decode: the products of a decode step (M = 64 and 256 tokens) of Qwen3-0.6B and -8B, where the time
// is the time to read W: microseconds and W bytes / time for BF16 cuBLAS, cuBLASLt FP8 block, the
// decode kernel (version 8, fp8_hopper.cu), and AUTO (with what it ran); plus the activation
// quantization. (Its K splits forced, and the other algorithms cuBLASLt offers, were measured with
// switches since removed: dev/notes/gemm.md "The decode GEMM: version 8"; dev/cuda/cublaslt_search.cu --lt-algos.)

typedef struct { int M, N, K; double bf, lt, q, dk, au; const char *au_be; } DecodeRow;

static int decode_bench(int (*only)[2], int nonly, int Monly, DecodeRow *rows) {
    int all[][2] = {{2048, 1024}, {1024, 1024}, {1024, 2048}, {3072, 1024}, {1024, 3072},
                    {4096, 4096}, {1024, 4096}, {12288, 4096}, {4096, 12288},
                    {4096, 1024}, {6144, 1024}, {6144, 4096}, {24576, 4096}};  // fused q|k|v, gate|up
    int (*shapes)[2] = nonly ? only : all;
    int nshapes = nonly ? nonly : (int)(sizeof all / sizeof all[0]), nr = 0;
    for (int M = Monly ? Monly : 64; M <= (Monly ? Monly : 256); M *= 4) {
        for (int si = 0; si < nshapes; si++) {
            int N = shapes[si][0], K = shapes[si][1];
            int nb = (int)((200u << 20) / ((size_t)N * K * 3)) + 2;
            if (nb > 8) nb = 8;
            bf16 *xb, *wb[8], *y;
            FP8Tensor x = fp8_dev_alloc(M, K, FP8_BLOCK, 1), w[8];
            cudaCheck(cudaMalloc(&xb, (size_t)M * K * sizeof(bf16)));
            fill_normal_bf16(xb, (size_t)M * K, 7);
            fp8_quantize_cuda(&x, xb, DT_BF16, 0);
            for (int b = 0; b < nb; b++) {
                cudaCheck(cudaMalloc(&wb[b], (size_t)N * K * sizeof(bf16)));
                fill_normal_bf16(wb[b], (size_t)N * K, 300 + b);
                w[b] = fp8_dev_alloc(N, K, FP8_BLOCK, FP8_BLOCK_SIZE);
                fp8_quantize_cuda(&w[b], wb[b], DT_BF16, 0);
            }
            cudaCheck(cudaMalloc(&y, (size_t)M * N * sizeof(float)));
            auto gemm = [&](int b) { fp8_gemm_cuda(y, DT_BF16, &x, &w[b], 0); };
            DecodeRow &r = rows[nr++];
            r.M = M; r.N = N; r.K = K;
            r.bf = time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, xb, wb[b], M, N, K, 0); }, nb) * 1e3;
            r.q = time_ms([&](int) { fp8_quantize_cuda(&x, xb, DT_BF16, 0); }, nb) * 1e3;
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
            r.au = time_ms(gemm, nb) * 1e3;
            r.au_be = fp8_cuda_last_backend();
            r.lt = r.dk = 0;
            if (fp8_gemm_supported(FP8_GEMM_CUBLASLT, DT_BF16, &x, &w[0], NULL, 0)) {
                fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
                r.lt = time_ms(gemm, nb) * 1e3;
            }
            if (fp8_gemm_supported(FP8_GEMM_DECODE, DT_BF16, &x, &w[0], NULL, 0)) {
                fp8_cuda_set_backend(FP8_GEMM_DECODE);
                r.dk = time_ms(gemm, nb) * 1e3;
            }
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
            printf("  decode M = %d, %5d x %5d: bf16 %.1f us, cuBLASLt %.1f, quant X %.1f, decode kernel %.1f, AUTO %.1f (%s)\n", M,
                   N, K, r.bf, r.lt, r.q, r.dk, r.au, r.au_be);
            fflush(stdout);
            cudaFree(xb);
            cudaFree(y);
            fp8_dev_free(&x);
            for (int b = 0; b < nb; b++) { cudaFree(wb[b]); fp8_dev_free(&w[b]); }
        }
    }
    return nr;
}

// ----------------------------------------------------------------------------
// --ab MxNxK: cuBLASLt against the hand-written kernel (wgmma where it runs, else mma.sync) at each
// granularity, as the GPU runs them for minutes: power-capped, each clock set by the power of the
// kernel before it. So the two are timed symmetrically, ROUNDS times [BF16, cuBLASLt, BF16, kernel],
// medians. ncu cycles compare the kernels at equal clocks; this compares what a run gets.

typedef struct { int M, N, K, gi; double bf, lt, kn; const char *kname; } AbRow;

static void ab_bench(int M, int N, int K, AbRow *rows) {
    enum { ROUNDS = 7 };
    const int nb = 4;
    OperandSet o[nb];
    bf16 *y;
    operands_make(o, nb, M, N, K);
    cudaCheck(cudaMalloc(&y, (size_t)M * N * sizeof(bf16)));
    auto tflops = [&](double ms) { return tflops_of(M, N, K, ms); };
    printf("A/B, %dx%dx%d, %d rounds of [BF16, cuBLASLt, BF16, kernel], medians, TFLOP/s:\n", M, N, K, ROUNDS);
    for (int gi = 0; gi < 3; gi++) {
        FP8GemmBackend kb = fp8_gemm_supported(FP8_GEMM_WGMMA, DT_BF16, &o[0].x[gi], &o[0].w[gi], NULL, 0) ? FP8_GEMM_WGMMA : FP8_GEMM_MMA;
        char why[256];
        if (!fp8_gemm_supported(kb, DT_BF16, &o[0].x[gi], &o[0].w[gi], why, sizeof why) ||
            !fp8_gemm_supported(FP8_GEMM_CUBLASLT, DT_BF16, &o[0].x[gi], &o[0].w[gi], why, sizeof why))
            die("--ab %dx%dx%d %s: %s", M, N, K, fp8_gran_name(GRANS[gi]), why);
        double bf[2 * ROUNDS], lt[ROUNDS], kn[ROUNDS];
        const char *kname = "";
        for (int r = 0; r < ROUNDS; r++) {
            bf[2 * r] = tflops(time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0); }, nb));
            fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
            lt[r] = tflops(time_ms([&](int b) { fp8_gemm_cuda(y, DT_BF16, &o[b].x[gi], &o[b].w[gi], 0); }, nb));
            bf[2 * r + 1] = tflops(time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0); }, nb));
            fp8_cuda_set_backend(kb);
            kn[r] = tflops(time_ms([&](int b) { fp8_gemm_cuda(y, DT_BF16, &o[b].x[gi], &o[b].w[gi], 0); }, nb));
            kname = fp8_cuda_last_backend();
        }
        fp8_cuda_set_backend(FP8_GEMM_AUTO);
        AbRow &a = rows[gi];
        a.M = M; a.N = N; a.K = K; a.gi = gi; a.kname = kname;
        a.bf = median(bf, 2 * ROUNDS); a.lt = median(lt, ROUNDS); a.kn = median(kn, ROUNDS);
        printf("  %-6s BF16 %5.0f  cuBLASLt %5.0f (%.2fx BF16)  %s %5.0f (%.2fx BF16)  kernel / cuBLASLt %.3f\n",
               fp8_gran_name(GRANS[gi]), a.bf, a.lt, a.lt / a.bf, kname, a.kn, a.kn / a.bf, a.kn / a.lt);
        fflush(stdout);
    }
    operands_free(o, nb);
    cudaFree(y);
}

// ----------------------------------------------------------------------------
// --profile MxNxK: each kernel of one product (BF16 cuBLAS, then cuBLASLt, the wgmma kernel and the
// mma.sync kernel at each granularity, where they run) launched twice back to back, for a profiler to
// pick (ncu --kernel-name regex:"gemm_fp8|nvjet" --metrics sm__cycles_elapsed.max), then, with
// --sustain S, run for S seconds each with the wall-clock span printed, so that clocks and power
// sampled alongside (nvidia-smi -lms) can be matched to it.

static void profile_bench(int M, int N, int K, double sustain) {
    const int nb = 4;
    OperandSet o[nb];
    bf16 *y;
    operands_make(o, nb, M, N, K);
    cudaCheck(cudaMalloc(&y, (size_t)M * N * sizeof(bf16)));
    struct { const char *name; int bf16; FP8GemmBackend b; int gi; } ks[] = {
        {"bf16 cuBLAS", 1, FP8_GEMM_AUTO, 0},        {"LT tensor", 0, FP8_GEMM_CUBLASLT, 0}, {"LT row", 0, FP8_GEMM_CUBLASLT, 1},
        {"LT block", 0, FP8_GEMM_CUBLASLT, 2},       {"wgmma tensor", 0, FP8_GEMM_WGMMA, 0}, {"wgmma row", 0, FP8_GEMM_WGMMA, 1},
        {"wgmma block", 0, FP8_GEMM_WGMMA, 2},       {"mma tensor", 0, FP8_GEMM_MMA, 0},     {"mma row", 0, FP8_GEMM_MMA, 1},
        {"mma block", 0, FP8_GEMM_MMA, 2}};
    for (auto &k : ks) {
        if (!k.bf16 && !fp8_gemm_supported(k.b, DT_BF16, &o[0].x[k.gi], &o[0].w[k.gi], NULL, 0)) {
            printf("profile %-12s %dx%dx%d: the backend cannot run it here\n", k.name, M, N, K);
            continue;
        }
        auto op = [&](int b) {
            if (k.bf16) bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0);
            else fp8_gemm_cuda(y, DT_BF16, &o[b].x[k.gi], &o[b].w[k.gi], 0);
        };
        fp8_cuda_set_backend(k.b);
        op(0);
        op(1);
        cudaCheck(cudaDeviceSynchronize());
        if (sustain <= 0) continue;
        struct timespec t0, t1;
        clock_gettime(CLOCK_REALTIME, &t0);
        double best = 0, sum = 0;
        int n = 0;
        for (;;) {
            double ms = time_ms(op, nb);
            sum += ms;
            n++;
            double tf = tflops_of(M, N, K, ms);
            if (tf > best) best = tf;
            clock_gettime(CLOCK_REALTIME, &t1);
            if ((t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec) > sustain) break;
        }
        printf("sustain %-12s %dx%dx%d  wall %ld.%03ld-%ld.%03ld  median-of-medians %.0f TFLOP/s (best %.0f, %d timings)\n", k.name,
               M, N, K, (long)t0.tv_sec, t0.tv_nsec / 1000000, (long)t1.tv_sec, t1.tv_nsec / 1000000, tflops_of(M, N, K, sum / n),
               best, n);
        fflush(stdout);
    }
    fp8_cuda_set_backend(FP8_GEMM_AUTO);
    operands_free(o, nb);
    cudaFree(y);
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv) {
    const char *peers_path = NULL;
    int abshape[16][3], nab = 0;
    int quick = 0, validate_only = 0, decode = 0, dshapes[16][2], nds = 0, dm = 0, pshape[3] = {0, 0, 0};
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
        else if (!strcmp(argv[i], "--ab") && i + 1 < argc && nab < 16 &&
                 sscanf(argv[++i], "%dx%dx%d", &abshape[nab][0], &abshape[nab][1], &abshape[nab][2]) == 3) nab++;
        else die("usage: %s [--peers peers.json] [--quick] [--validate] [--decode [--decode-shape NxK]... [--decode-m M]] "
                 "[--profile MxNxK [--sustain S]] [--ab MxNxK]...", argv[0]);
    }
    if (!fp8_cuda_init(NULL)) die("bench_gemm benchmarks FP8 tensor cores: this GPU has none");
    cudaDeviceProp prop = gpu_props();
    int drv = 0, hopper;
    cudaDriverGetVersion(&drv);
    {  // whether the library's Hopper kernels run here (its build and this GPU: fp8_hopper.cu's probe)
        FP8Tensor x, w;
        fp8_operands_make(&x, &w, 128, 128, 128, FP8_TENSOR, 1);
        hopper = fp8_gemm_supported(FP8_GEMM_WGMMA, DT_BF16, &x, &w, NULL, 0);
        fp8_dev_free(&x);
        fp8_dev_free(&w);
    }
    printf("bench_gemm: %s (sm_%d%d, %d SMs), driver %d, cuBLASLt %zu, Hopper kernels (wgmma, decode) %s\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, drv, cublasLtGetVersion(), hopper ? "on" : "off (no sm_90a GPU and build)");
    if (nab) {
        AbRow *rows = (AbRow *)mallocCheck(3 * nab * sizeof(AbRow));
        for (int i = 0; i < nab; i++) ab_bench(abshape[i][0], abshape[i][1], abshape[i][2], rows + 3 * i);
        printf("\n## cuBLASLt against the hand-written kernel under the power cap, TFLOP/s, %s\n\n", prop.name);
        printf("| M x N x K | granularity | BF16 | cuBLASLt | kernel | kernel TFLOP/s | kernel / cuBLASLt |\n|---|---|---|---|---|---|---|\n");
        for (int i = 0; i < 3 * nab; i++) {
            AbRow &a = rows[i];
            printf("| %dx%dx%d | %s | %.0f | %.0f | %s | %.0f | %.3f |\n", a.M, a.N, a.K, fp8_gran_name(GRANS[a.gi]), a.bf, a.lt,
                   a.kname, a.kn, a.kn / a.lt);
        }
        free(rows);
        fp8_cuda_free();
        return 0;
    }
    if (pshape[0] > 0) {
        profile_bench(pshape[0], pshape[1], pshape[2], sustain);
        fp8_cuda_free();
        return 0;
    }
    if (decode) {
        DecodeRow rows[2 * 16 + 26];
        int nr = decode_bench(dshapes, nds, dm, rows);
        auto gbs = [&](double us, double bytes) { return bytes / (us * 1e-6) / 1e9; };
        printf("\n## Decode products, FP8 block, us (GB/s of W read: N K bytes FP8, 2 N K BF16), %s\n\n", prop.name);
        printf("| M | N x K | BF16 cuBLAS | FP8 cuBLASLt | quant X | decode kernel | AUTO | AUTO runs |\n|---|---|---|---|---|---|---|---|\n");
        for (int i = 0; i < nr; i++) {
            DecodeRow &r = rows[i];
            double wb = (double)r.N * r.K;
            printf("| %d | %d x %d | %.1f (%.0f) | ", r.M, r.N, r.K, r.bf, gbs(r.bf, 2 * wb));
            if (r.lt > 0) printf("%.1f (%.0f) | ", r.lt, gbs(r.lt, wb)); else printf("- | ");
            printf("%.1f | ", r.q);
            if (r.dk > 0) printf("%.1f (%.0f) | ", r.dk, gbs(r.dk, wb)); else printf("- | ");
            printf("%.1f (%.0f) | %s |\n", r.au, gbs(r.au, wb), r.au_be);
        }
        fp8_cuda_free();
        return 0;
    }
    int fails = validate();
    if (fails) printf("validation: %d FAILED\n", fails);
    if (validate_only) { fp8_cuda_free(); return fails ? 1 : 0; }

    Peer peers[32];
    int np = peers_path ? load_peers(peers_path, peers, 32) : 0;
    const int shapes[][3] = {{8192, 4096, 4096}, {8192, 12288, 4096}, {8192, 4096, 12288}, {8192, 3072, 1024},
                             {8192, 1024, 3072}, {64, 12288, 4096},   {64, 4096, 12288},  {4096, 4096, 4096}};
    int ns = quick ? 2 : (int)(sizeof shapes / sizeof shapes[0]);
    // per shape: each backend back to back (0 where it cannot run), as peers.py times torch (dob: BF16,
    // cuBLASLt tensor, row, block), and in turn (turn: BF16, AUTO tensor, row, block, block again)
    typedef struct { double bf16, bf16_2, lt[3], mma[3], wg[3], dk[3], dob[4], turn[5]; const char *au_be[3]; } Row;
    Row rows[16];
    for (int si = 0; si < ns; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        size_t set_bytes = (size_t)(M + N) * K * 3;  // bf16 + fp8 of X and W
        int nb = (int)((160u << 20) / set_bytes) + 1;
        if (nb < 2) nb = 2;
        if (nb > 8) nb = 8;
        OperandSet o[8];
        bf16 *y;
        operands_make(o, nb, M, N, K);
        cudaCheck(cudaMalloc(&y, (size_t)M * N * sizeof(bf16)));
        auto tflops = [&](double ms) { return tflops_of(M, N, K, ms); };
        Row &r = rows[si];
        memset(&r, 0, sizeof r);
        r.bf16 = tflops(time_ms([&](int b) { bf16_gemm_cuda(y, DT_BF16, o[b].xb, o[b].wb, M, N, K, 0); }, nb));
        // each backend forced, at each granularity, back to back
        auto backend = [&](FP8GemmBackend be, double *out) {
            fp8_cuda_set_backend(be);
            for (int gi = 0; gi < 3; gi++)
                if (fp8_gemm_supported(be, DT_BF16, &o[0].x[gi], &o[0].w[gi], NULL, 0))
                    out[gi] = tflops(time_ms([&](int b) { fp8_gemm_cuda(y, DT_BF16, &o[b].x[gi], &o[b].w[gi], 0); }, nb));
            fp8_cuda_set_backend(FP8_GEMM_AUTO);
        };
        backend(FP8_GEMM_CUBLASLT, r.lt);
        // BF16 and cuBLASLt again, timed as peers.py times torch (its order: bf16, tensor, row, block)
        r.dob[0] = tflops(time_ms_flushed([&]() { bf16_gemm_cuda(y, DT_BF16, o[0].xb, o[0].wb, M, N, K, 0); }));
        fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
        for (int gi = 0; gi < 3; gi++)
            if (r.lt[gi] > 0) r.dob[1 + gi] = tflops(time_ms_flushed([&]() { fp8_gemm_cuda(y, DT_BF16, &o[0].x[gi], &o[0].w[gi], 0); }));
        fp8_cuda_set_backend(FP8_GEMM_AUTO);
        backend(FP8_GEMM_MMA, r.mma);
        backend(FP8_GEMM_WGMMA, r.wg);
        if (M <= 64) backend(FP8_GEMM_DECODE, r.dk);  // AUTO's choice is among these at M <= 64 only
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
        printf("  %5dx%5dx%5d  bf16 %4.0f  cublaslt t/r/b %4.0f %4.0f %4.0f  mma %4.0f %4.0f %4.0f  wgmma %4.0f %4.0f %4.0f  decode %4.0f "
               "%4.0f %4.0f\n", M, N, K, r.bf16, r.lt[0], r.lt[1], r.lt[2], r.mma[0], r.mma[1], r.mma[2], r.wg[0], r.wg[1], r.wg[2],
               r.dk[0], r.dk[1], r.dk[2]);
        fflush(stdout);
        operands_free(o, nb);
        cudaFree(y);
    }

    // activation quantization bandwidth (bf16 in, fp8 + scales out) at 8192 x 4096
    {
        int M = 8192, K = 4096;
        bf16 *xb;
        cudaCheck(cudaMalloc(&xb, (size_t)M * K * sizeof(bf16)));
        fill_normal_bf16(xb, (size_t)M * K, 7);
        printf("\nactivation quantization, %d x %d bf16 -> e4m3 (bytes = 3 per element; floor ~3.0 TB/s):", M, K);
        for (int gi = 0; gi < 3; gi++) {
            FP8Tensor t = fp8_dev_alloc(M, K, GRANS[gi], 1);
            double ms = time_ms([&](int) { fp8_quantize_cuda(&t, xb, DT_BF16, 0); }, 1);
            printf("  %s %.0f GB/s", fp8_gran_name(GRANS[gi]), 3.0 * M * K / (ms * 1e-3) / 1e9);
            fp8_dev_free(&t);
        }
        FP8Tensor t = fp8_dev_alloc(K, K, FP8_BLOCK, FP8_BLOCK_SIZE);
        double ms = time_ms([&](int) { fp8_quantize_cuda(&t, xb, DT_BF16, 0); }, 1);
        printf("  weight 128x128 (%dx%d) %.0f GB/s\n", K, K, 3.0 * K * K / (ms * 1e-3) / 1e9);
        fp8_dev_free(&t);
        cudaFree(xb);
    }

    // the tables (markdown); the one compared across changes last
    auto cells = [](const double *v) {  // t / r / b, '-' where the backend cannot run
        printf("| ");
        for (int gi = 0; gi < 3; gi++) {
            if (v[gi] > 0) printf("%.0f", v[gi]);
            else printf("-");
            printf(gi < 2 ? " / " : " ");
        }
    };
    printf("\n## The FP8 GEMM's backends, each timed back to back, TFLOP/s (tensor / row / block), bf16 output, %s\n\n", prop.name);
    printf("| M x N x K | BF16 | cuBLASLt | mma.sync (v3) | wgmma (v7) | decode (v8) | BF16 again |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < ns; si++) {
        Row &r = rows[si];
        printf("| %dx%dx%d | %.0f ", shapes[si][0], shapes[si][1], shapes[si][2], r.bf16);
        cells(r.lt);
        cells(r.mma);
        cells(r.wg);
        cells(r.dk);
        printf("| %.0f |\n", r.bf16_2);
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
    printf("\n## FP8 (AUTO) against BF16, the kernels called in turn (10 calls each between events; medians), TFLOP/s, %s\n\n",
           prop.name);
    printf("| M x N x K | BF16 | FP8 tensor | row | block | FP8/BF16: tensor | row | block | AUTO ran | control: block / block again |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < ns; si++) {
        Row &r = rows[si];
        const double *v = r.turn;
        printf("| %dx%dx%d | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f | %s, %s, %s | %.3f |\n", shapes[si][0], shapes[si][1],
               shapes[si][2], v[0], v[1], v[2], v[3], v[1] / v[0], v[2] / v[0], v[3] / v[0], r.au_be[0], r.au_be[1], r.au_be[2],
               v[3] / v[4]);
    }
    fp8_cuda_free();
    return fails ? 1 : 0;
}
