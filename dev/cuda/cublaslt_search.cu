// dev/cuda/cublaslt_search.cu: what cuBLASLt has beyond its heuristic's first choice, for one product
// Y[M,N] = X[M,K] W[N,K]^T in BF16 and in FP8 at each granularity (bf16 output), timed on the GPU.
//   --lt-algos MxNxK     every algorithm the heuristic offers (up to 16, in its order), each timed: the
//                        heuristic's first is what fp8.cu runs (and torch._scaled_mm)
//   --lt-search MxNxK    every configuration cuBLASLt accepts (each algorithm id x its tiles x stages x
//                        seven cluster shapes x CTA swizzle x custom options 0-3, as
//                        cublasLtMatmulAlgoCheck accepts them) plus what the heuristic offers per id, each
//                        timed briefly; then the fastest three against the heuristic's first, called in
//                        turn, with the largest difference of their outputs (an accepted configuration can
//                        compute a wrong product)
// It explores cuBLASLt, so it sets cuBLASLt up itself (one handle, a 32 MiB workspace, the descriptors
// fp8.cu builds: the "TN" layout with both operands K-major, fast accumulation off, the scale modes of
// fp8.h's layouts); it is not the product's path (fp8.cu's plan cache is). Operands and timing:
// dev/cuda/common.cuh (the quantization is the product's).
// Findings (H100, dev/notes/gemm.md, the 16:31 runs and "The 23:00 runs"; dev/cuda/README.md): for row and block
// scaling the heuristic offers one algorithm at every M = 8192 shape; no accepted configuration beats
// the heuristic's for FP8; its 128 x 64 block-scaled configurations compute wrong products (max |diff|
// 56-68 of a largest |y| of 169-372); for BF16 two configurations ran 1.065-1.075x the heuristic's at
// 8192x3072x1024.
//
//   make -C dev ../build/cublaslt_search
//   ../build/cublaslt_search --lt-algos 8192x4096x4096
//   ../build/cublaslt_search --lt-search 8192x1024x3072 [--lt-search MxNxK ...]
// Prints one summary table last, naming the GPU.
#include <algorithm>
#include <cublasLt.h>  // before common.cuh: cuda_common.cuh then defines cublasCheck

#include "common.cuh"

// ----------------------------------------------------------------------------
// a minimal cuBLASLt setup (fp8.cu's, without its plan cache)

static struct {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
} L;

static void lt_init(void) {
    cublasCheck(cublasLtCreate(&L.lt));
    L.ws_bytes = 32u << 20;
    cudaCheck(cudaMalloc(&L.ws, L.ws_bytes));
}

// One product as cuBLASLt sees it. cuBLASLt is column-major: our row-major Y[M,N] is its D (N x M,
// ld N) = op(A) B with A = W (stored K x N, ld K, op = transpose) and B = X (K x M, ld K), so its
// A scales are W's and its B scales are X's. kind: 0 BF16, 1-3 FP8 at GRANS[kind - 1].
typedef struct {
    int kind, M, N, K;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ly;
    cublasLtMatmulAlgo_t algo;  // the heuristic's first
} LtProduct;

static cublasLtMatmulPreference_t lt_pref(void) {
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = L.ws_bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    return pref;  // the operands are 256-byte aligned (cudaMalloc): no alignment limits
}

static LtProduct lt_product(int kind, int M, int N, int K, const OperandSet *o) {
    LtProduct p;
    memset(&p, 0, sizeof p);
    p.kind = kind; p.M = M; p.N = N; p.K = K;
    cudaDataType_t t = kind ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (kind) {
        int8_t fast = 0;  // fast accumulation off, as fp8.cu (dev/notes/gemm.md: 4.7e-2 relative error with it)
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
        FP8Gran g = GRANS[kind - 1];
        cublasLtMatmulMatrixScale_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, mb = ma;
        if (g == FP8_ROW) ma = mb = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if (g == FP8_BLOCK) { ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; }
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
        // the heuristic needs the scale pointers set to know the modes are in use
        const void *sa = o->w[kind - 1].scale, *sb = o->x[kind - 1].scale;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    }
    cublasCheck(cublasLtMatrixLayoutCreate(&p.la, t, K, N, K));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.lb, t, K, M, K));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.ly, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref = lt_pref();
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(L.lt, p.desc, p.la, p.lb, p.ly, p.ly, pref, 1, &res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || n == 0)
        die("cuBLASLt has no algorithm for %dx%dx%d %s (%s)", M, N, K, kind ? fp8_gran_name(GRANS[kind - 1]) : "bf16",
            cublasLtGetStatusString(st));
    p.algo = res.algo;
    return p;
}
static void lt_product_free(LtProduct *p) {
    cublasLtMatmulDescDestroy(p->desc);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->ly);
}

// one call of product p on operand set o with algorithm al, into out; its status (a configuration
// cublasLtMatmulAlgoCheck accepted may still refuse to launch)
static cublasStatus_t lt_call(const LtProduct *p, const OperandSet *o, const cublasLtMatmulAlgo_t *al, void *out) {
    const void *A = o->wb, *B = o->xb;
    if (p->kind) {
        const FP8Tensor *x = &o->x[p->kind - 1], *w = &o->w[p->kind - 1];
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w->scale, sizeof w->scale));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x->scale, sizeof x->scale));
        A = w->data;
        B = x->data;
    }
    float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(L.lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, out, p->ly, out, p->ly, al, L.ws, L.ws_bytes, 0);
}

static const char *kind_name(int kind) { return kind ? fp8_gran_name(GRANS[kind - 1]) : "bf16"; }

// ----------------------------------------------------------------------------
// --lt-algos

typedef struct { int M, N, K, kind, n; double first, best, again; } AlgosRow;

static void lt_algos(int M, int N, int K, AlgosRow *rows) {
    OperandSet o[1];
    bf16 *y;
    operands_make(o, 1, M, N, K);
    cudaCheck(cudaMalloc(&y, (size_t)M * N * sizeof(bf16)));
    for (int kind = 0; kind < 4; kind++) {  // BF16, FP8 tensor, row, block
        LtProduct p = lt_product(kind, M, N, K, &o[0]);
        auto run = [&](const cublasLtMatmulAlgo_t *al) { cublasCheck(lt_call(&p, &o[0], al, y)); };
        cublasLtMatmulPreference_t pref = lt_pref();
        cublasLtMatmulHeuristicResult_t res[16];
        int n = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(L.lt, p.desc, p.la, p.lb, p.ly, p.ly, pref, 16, res, &n));
        cublasLtMatmulPreferenceDestroy(pref);
        printf("%dx%dx%d %-6s %2d algorithms, TFLOP/s in the heuristic's order:", M, N, K, kind_name(kind), n);
        AlgosRow &r = rows[kind];
        r.M = M; r.N = N; r.K = K; r.kind = kind; r.n = n; r.best = 0;
        for (int i = 0; i < n; i++) {
            double tf = tflops_of(M, N, K, time_ms([&](int) { run(&res[i].algo); }, 1));
            if (i == 0) r.first = tf;
            if (tf > r.best) r.best = tf;
            printf(" %.0f", tf);
        }
        r.again = tflops_of(M, N, K, time_ms([&](int) { run(&res[0].algo); }, 1));
        printf(" | first again %.0f (%.0f)\n", r.again, r.first);
        fflush(stdout);
        lt_product_free(&p);
    }
    operands_free(o, 1);
    cudaFree(y);
}

// ----------------------------------------------------------------------------
// --lt-search

// the largest |a - b| of two bf16 device arrays of n values, and the largest |a|
static void compare_bf16(const bf16 *a, const bf16 *b, size_t n, double *max_diff, double *max_a) {
    uint16_t *ha = (uint16_t *)mallocCheck(n * 2), *hb = (uint16_t *)mallocCheck(n * 2);
    cudaCheck(cudaMemcpy(ha, a, n * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(hb, b, n * 2, cudaMemcpyDeviceToHost));
    *max_diff = *max_a = 0;
    for (size_t i = 0; i < n; i++) {
        double x = bf16_to_f32(ha[i]), d = fabs(x - bf16_to_f32(hb[i]));
        if (d > *max_diff || d != d) *max_diff = d;
        if (fabs(x) > *max_a) *max_a = fabs(x);
    }
    free(ha);
    free(hb);
}

// a cuBLASLt configuration in words (tile and stages ids as cublasLt.h's cublasLtMatmulTile_t and
// cublasLtMatmulStages_t number them, cluster as cublasLtClusterShape_t)
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

// the ids a capability lists (tiles or stages), below `end` (values past the enum are not ids), or
// {0} (undefined) when it lists none; *v is malloc'ed. (The whole list is read: id 66 lists more than
// 256 tiles, and a shorter read fails and leaves garbage ids that crash cublasLtMatmulAlgoCheck.)
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

typedef struct {
    int M, N, K, kind, nid, from_heur, accepted, timed, top;
    double heur_turn, best_ratio;  // the heuristic's TFLOP/s in turn; the best other's time ratio (heuristic / it)
    int wrong;                     // how many of the top three differ from the heuristic's output by > 1% of max |y|
} SearchRow;

static void lt_search(int M, int N, int K, SearchRow *rows) {
    size_t set_bytes = (size_t)(M + N) * K * 3;
    int nb = (int)((160u << 20) / set_bytes) + 1;
    nb = nb < 2 ? 2 : nb > 8 ? 8 : nb;
    OperandSet o[8];
    bf16 *y, *y2;
    operands_make(o, nb, M, N, K);
    cudaCheck(cudaMalloc(&y, (size_t)M * N * sizeof(bf16)));
    cudaCheck(cudaMalloc(&y2, (size_t)M * N * sizeof(bf16)));
    enum { MAXC = 4000, MAXM = 50000 };
    static cublasLtMatmulAlgo_t cand[MAXC], man[MAXM];
    static double ctf[MAXC];
    for (int kind = 0; kind < 4; kind++) {  // BF16, FP8 tensor, row, block
        LtProduct p = lt_product(kind, M, N, K, &o[0]);
        auto try_run = [&](const cublasLtMatmulAlgo_t *al, int b, void *out) { return lt_call(&p, &o[b], al, out); };
        auto run = [&](const cublasLtMatmulAlgo_t *al, int b, void *out) { cublasCheck(try_run(al, b, out)); };
        // a brief timing: 2 warm-up calls, then 10 timed back to back (TFLOP/s; 0 if it does not launch)
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        auto quick = [&](const cublasLtMatmulAlgo_t *al) {
            if (try_run(al, 0, y) != CUBLAS_STATUS_SUCCESS) return 0.0;
            run(al, 1 % nb, y);
            cudaCheck(cudaEventRecord(e0));
            for (int i = 0; i < 10; i++) run(al, i % nb, y);
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            float ms;
            cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
            return tflops_of(M, N, K, ms / 10);
        };
        cudaDataType_t t = kind ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        int ids[512], nid = 0, nc = 0, from_heur = 0, nm = 0;
        cublasCheck(cublasLtMatmulAlgoGetIds(L.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t, CUDA_R_16BF, CUDA_R_16BF, 512, ids, &nid));
        cublasLtMatmulHeuristicResult_t check;
        for (int ii = 0; ii < nid; ii++) {
            // what the heuristic offers for this id alone
            cublasLtMatmulPreference_t pref = lt_pref();
            uint32_t mode = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
            cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode, sizeof mode));
            cublasLtMatmulHeuristicResult_t res[32];
            for (int i = 0; i < 32; i++)
                cublasLtMatmulAlgoInit(L.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t, CUDA_R_16BF, CUDA_R_16BF, ids[ii], &res[i].algo);
            int n = 0;
            if (cublasLtMatmulAlgoGetHeuristic(L.lt, p.desc, p.la, p.lb, p.ly, p.ly, pref, 32, res, &n) != CUBLAS_STATUS_SUCCESS) n = 0;
            cublasLtMatmulPreferenceDestroy(pref);
            for (int i = 0; i < n && nc < MAXC; i++)
                if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= L.ws_bytes) cand[nc++] = res[i].algo, from_heur++;
            // every configuration its capabilities list
            cublasLtMatmulAlgo_t a;
            if (cublasLtMatmulAlgoInit(L.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, t, t, CUDA_R_16BF, CUDA_R_16BF, ids[ii], &a) !=
                CUBLAS_STATUS_SUCCESS)
                continue;
            uint32_t *tiles, *stages, swz_ok = 0, custom_max = 0;
            int ntile = algo_cap_list(&a, CUBLASLT_ALGO_CAP_TILE_IDS, CUBLASLT_MATMUL_TILE_END, &tiles);
            int nstage = algo_cap_list(&a, CUBLASLT_ALGO_CAP_STAGES_IDS, CUBLASLT_MATMUL_STAGES_END, &stages);
            size_t w;
            cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok, &w);
            cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof custom_max, &w);
            if (custom_max > 3) custom_max = 3;
            const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
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
                                if (cublasLtMatmulAlgoCheck(L.lt, p.desc, p.la, p.lb, p.ly, p.ly, &c, &check) == CUBLAS_STATUS_SUCCESS &&
                                    check.workspaceSize <= L.ws_bytes)
                                    man[nm++] = c;
                            }
            free(tiles);
            free(stages);
        }
        // the heuristic's offers first, then the configurations in a shuffled order, so that the time
        // bound below samples every id alike
        uint32_t rng = 12345;
        for (int i = nm - 1; i > 0; i--) {
            rng = rng * 1664525u + 1013904223u;
            int j = (int)((rng >> 8) % (uint32_t)(i + 1));
            cublasLtMatmulAlgo_t t2 = man[i]; man[i] = man[j]; man[j] = t2;
        }
        for (int i = 0; i < nm && nc < MAXC; i++) cand[nc++] = man[i];
        double def0 = quick(&p.algo), t_start = now_sec();
        int timed = 0;
        for (int i = 0; i < nc; i++, timed++) {
            if (now_sec() - t_start > 12.0) break;  // a bound on the GPU time a case may take
            ctf[i] = quick(&cand[i]);
        }
        double def1 = quick(&p.algo);
        static int order[MAXC];
        for (int i = 0; i < timed; i++) order[i] = i;
        std::sort(order, order + timed, [&](int a, int b) { return ctf[a] > ctf[b]; });
        char s[160];
        algo_name(&p.algo, s, sizeof s);
        printf("%dx%dx%d %-6s %d ids, %d offers of the heuristic per id + %d configurations accepted, %d timed; heuristic's "
               "first (%s): %.0f, %.0f at the end\n", M, N, K, kind_name(kind), nid, from_heur, nm, timed, s, def0, def1);
        for (int r = 0; r < 6 && r < timed; r++) {
            algo_name(&cand[order[r]], s, sizeof s);
            printf("    %5.0f  %s\n", ctf[order[r]], s);
        }
        // the best three against the heuristic's first, called in turn (time_interleaved: not in
        // rounds, where the one timed second runs at the clocks the first left)
        int top = timed < 3 ? timed : 3;
        const cublasLtMatmulAlgo_t *turn[4] = {&p.algo, NULL, NULL, NULL};
        for (int r = 0; r < top; r++) turn[1 + r] = &cand[order[r]];
        double ms[4];
        time_interleaved([&](int k, int b) { run(turn[k], b, y); }, 1 + top, nb, 10, ms);
        SearchRow &row = rows[kind];
        row.M = M; row.N = N; row.K = K; row.kind = kind; row.nid = nid; row.from_heur = from_heur; row.accepted = nm;
        row.timed = timed; row.top = top; row.heur_turn = tflops_of(M, N, K, ms[0]); row.best_ratio = 0; row.wrong = 0;
        printf("    in turn: heuristic %.0f", row.heur_turn);
        for (int r = 0; r < top; r++) {
            run(&p.algo, 0, y);
            run(turn[1 + r], 0, y2);
            double md = 0, my = 0;
            compare_bf16(y, y2, (size_t)M * N, &md, &my);
            if (!(md <= 0.01 * my)) row.wrong++;
            if (ms[0] / ms[1 + r] > row.best_ratio) row.best_ratio = ms[0] / ms[1 + r];
            printf(" | #%d %.0f (%.3fx; max |diff| %.3g of max |y| %.3g)", r + 1, tflops_of(M, N, K, ms[1 + r]), ms[0] / ms[1 + r],
                   md, my);
        }
        printf("\n");
        fflush(stdout);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        lt_product_free(&p);
    }
    operands_free(o, nb);
    cudaFree(y);
    cudaFree(y2);
}

int main(int argc, char **argv) {
    int ashape[16][3], na = 0, sshape[16][3], ns = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--lt-algos") && i + 1 < argc && na < 16 &&
            sscanf(argv[++i], "%dx%dx%d", &ashape[na][0], &ashape[na][1], &ashape[na][2]) == 3)
            na++;
        else if (!strcmp(argv[i], "--lt-search") && i + 1 < argc && ns < 16 &&
                 sscanf(argv[++i], "%dx%dx%d", &sshape[ns][0], &sshape[ns][1], &sshape[ns][2]) == 3)
            ns++;
        else die("usage: %s [--lt-algos MxNxK]... [--lt-search MxNxK]...", argv[0]);
    }
    if (!na && !ns) die("usage: %s [--lt-algos MxNxK]... [--lt-search MxNxK]...", argv[0]);
    if (!fp8_cuda_init(NULL)) die("cublaslt_search times FP8 products: this GPU has no FP8 tensor cores");
    lt_init();
    cudaDeviceProp prop = gpu_props();
    int drv = 0;
    cudaDriverGetVersion(&drv);
    printf("cublaslt_search: %s (sm_%d%d, %d SMs), driver %d, cuBLASLt %zu\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, drv, cublasLtGetVersion());
    setvbuf(stdout, NULL, _IOLBF, 0);  // a long search: each line as it comes
    AlgosRow *arows = (AlgosRow *)callocCheck(na * 4, sizeof(AlgosRow));
    SearchRow *srows = (SearchRow *)callocCheck(ns * 4, sizeof(SearchRow));
    for (int i = 0; i < na; i++) lt_algos(ashape[i][0], ashape[i][1], ashape[i][2], arows + 4 * i);
    for (int i = 0; i < ns; i++) lt_search(sshape[i][0], sshape[i][1], sshape[i][2], srows + 4 * i);

    // the summary tables, last
    if (na) {
        printf("\n## cuBLASLt's heuristic offers, TFLOP/s, bf16 output, %s\n\n", prop.name);
        printf("| M x N x K | product | algorithms offered | the first | the best of them | the first again (last) |\n");
        printf("|---|---|---|---|---|---|\n");
        for (int i = 0; i < 4 * na; i++) {
            AlgosRow &r = arows[i];
            printf("| %dx%dx%d | %s | %d | %.0f | %.0f | %.0f |\n", r.M, r.N, r.K, kind_name(r.kind), r.n, r.first, r.best, r.again);
        }
    }
    if (ns) {
        printf("\n## Every configuration cuBLASLt accepts, bf16 output, %s\n\n", prop.name);
        printf("| M x N x K | product | ids | configurations accepted (timed) | heuristic's, in turn, TFLOP/s | best of the top "
               "%d / heuristic's | of them wrong (> 1%% of max |y|) |\n", 3);
        printf("|---|---|---|---|---|---|---|\n");
        for (int i = 0; i < 4 * ns; i++) {
            SearchRow &r = srows[i];
            printf("| %dx%dx%d | %s | %d | %d + %d (%d) | %.0f | %.3f | %d of %d |\n", r.M, r.N, r.K, kind_name(r.kind), r.nid,
                   r.from_heur, r.accepted, r.timed, r.heur_turn, r.best_ratio, r.wrong, r.top);
        }
    }
    free(arows);
    free(srows);
    fp8_cuda_free();
    return 0;
}
