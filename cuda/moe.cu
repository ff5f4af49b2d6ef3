// moe.cu: Qwen3 MoE's sparse MLP on the GPU (Qwen3MoeSparseMoeBlock).
//   defines: cu_moe_route, cu_moe_route_backward, cu_moe_experts_forward, cu_moe_experts_backward
//   (backend_cuda.cuh; their contracts are core/backend.h's moe_* ops, their truth cpu/backend_cpu.c and
//   cpu/ops_cpu.c; test/gpu_backend.cu compares them on random inputs, test/gpu_models.cu on the fixtures).
//
// The picture, for N tokens each sent to K of E experts (the N K (token, choice) pairs are the "slots",
// slot n K + j):
//   1. the router: one warp a token picks its K experts and their weights (moe_route_kernel).
//   2. the groups: a counting sort of the slots by expert (moe_count_kernel, moe_offsets_kernel,
//      moe_scatter_kernel): offsets (E + 1) and perm (N K), so that perm[offsets[e] .. offsets[e + 1]) are the
//      slots routed to expert e in ascending order (the CPU's order), and tile_start (E + 1): where each
//      expert's row tiles begin in the list of all experts' row tiles.
//   3. the products as grouped GEMMs (moe_gemm_kernel): ONE launch covers every expert. Its blocks are
//      (row tile, column tile) work items; block b of the row tiles finds its expert by a binary search of
//      tile_start, and its rows are a run of perm: row m of the product reads A's row perm[m] / K (a token:
//      the experts' input) or perm[m] (a slot: the SwiGLU's output, a gradient) and writes slot perm[m] of
//      its output. gate|up is one launch (blockIdx.z picks the weight), down another. An expert with at
//      most 64 rows is one row tile, so its weights are read once.
//   3'. the decode step's products (N = the batch: a few rows an expert) by moe_decode_kernel instead, chosen
//      on the host by the shape (decode_ok: N K <= MOE_DEC_AVG E, no sync; FP8GRPO_MOE_DECODE=0 turns it
//      off, below): weight rows streamed as dot
//      products with the expert's rows held in shared memory, gate|up with the SwiGLU in the same pass.
//   4. the weighted sum of each token's K outputs, in slot order (moe_combine_kernel): no atomics, so the
//      results repeat bit for bit.
//
// The grouped GEMM is the simplest correct tensor-core kernel: 64 x 64 tiles, 64-deep K steps staged
// through registers into padded shared memory, four warps of mma.sync m16n8k16 (bf16 in, fp32 sums).
// FP8 weights are read as their codes (exact in bf16) and the activations are quantized as they are
// loaded, to the weight's granularity with the CPU's scales (TENSOR: one scale for the rows of an expert,
// as the CPU quantizes its gathered rows; ROW: per row; BLOCK: 1x128 groups): the products of codes are
// exact, each 128-deep K step's sum is promoted into the accumulator times sx * sw (DeepSeek-V3's
// promotion), which is the CPU's fake-quantized product up to the order of the fp32 sums.
// The backward's products go through the weights dequantized to bf16 (straight-through, as
// linear_backward's BF16 reference) and read them transposed.
//
// Kernel parameters hold each expert's weight pointers (moe_gemm_kernel: up to 2 weights x MOE_MAX_E
// experts, 8 KB): CUDA 12.1 or newer on Volta or newer takes parameters up to 32 KB, and a recorded decode
// step replays them with the graph, with no table to upload or keep valid.
#include "cuda/backend_cuda.cuh"
#include "cuda/mma_tile.cuh"

#define MOE_MAX_E 256       // experts a layer may have (Qwen3 MoE: 128)
#define MOE_SORT_TILE 256   // slots a warp of the counting sort takes
#define MOE_BM 64           // the grouped GEMM's tile: rows (slots) ...
#define MOE_BN 64           // ... columns (outputs) ...
#define MOE_BK 64           // ... and the depth of one K step
#define MOE_LDS (MOE_BK + 8)  // shared-memory row pitch (144 bytes: ldmatrix's 8 rows hit 32 different banks)
#define MOE_CK (MOE_BK / 8)   // 8-element chunks in a row of a tile's A (or B^T) part
#define MOE_CN (MOE_BN / 8)   // 8-element chunks in a row of W^T's part (the backward's transposed read)
#define MOE_CH (MOE_BM * MOE_BK / 8 / 128)  // chunks each of the 128 threads loads of A, and of B, a step
static_assert(MOE_BM == MOE_BN, "A and B tiles of one shape: MOE_CH chunks a thread each");

// ----------------------------------------------------------------------------
// the router: one warp a token

// a row's softmax over E logits, by a warp (lane l reads l, l + 32, ...): its largest logit mx and
// s = sum exp(z - mx), every lane alike; the router and its backward make them the same way
__device__ __forceinline__ void softmax_stats(const bf16 *z, int E, int lane, float *mx_out, float *s_out) {
    float mx = -INFINITY, s = 0.0f;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, __bfloat162float(z[e]));
    mx = warp_max(mx);
    for (int e = lane; e < E; e += 32) s += expf(__bfloat162float(z[e]) - mx);
    *mx_out = mx, *s_out = warp_sum(s);
}

// idx (N, K), w (N, K) f32 from logits (N, E) bf16. The K largest logits are the K largest probabilities
// (softmax is monotonic), so the choice is made on the logits themselves, larger first, a tie to the lower
// expert: the CPU's choice (by probability in double) wherever distinct logits give distinct probabilities.
// Lane l holds experts l, l + 32, ...; taken: bit t set when expert l + 32 t was chosen.
__global__ void moe_route_kernel(int32_t *idx, float *w, const bf16 *logits, int N, int E, int K, int norm) {
    int n = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (n >= N) return;  // the whole warp
    const bf16 *z = logits + (size_t)n * E;
    float mx, s;
    softmax_stats(z, E, lane, &mx, &s);
    uint32_t taken = 0;
    float p[MOE_MAX_E / 32];  // lane l: the probabilities of choices l, l + 32, ... (K <= MOE_MAX_E: route_check)
    float sum = 0.0f;
    for (int j = 0; j < K; j++) {
        float bv = 0.0f;
        int be = -1;
        for (int e = lane, t = 0; e < E; e += 32, t++) {
            float v = __bfloat162float(z[e]);
            if (!(taken >> t & 1) && (be < 0 || v > bv)) bv = v, be = e;
        }
        for (int o = 16; o > 0; o >>= 1) {  // a strict order: every lane ends with the same (bv, be)
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
        }
        if ((be & 31) == lane) taken |= 1u << (be >> 5);
        float pj = expf(bv - mx) / s;
        sum += pj;
        if (lane == 0) idx[(size_t)n * K + j] = be;
        if (lane == j % 32) p[j / 32] = pj;  // lane j % 32 keeps choice j's probability
    }
    for (int j = lane, t = 0; j < K; j += 32, t++) w[(size_t)n * K + j] = norm ? p[t] / sum : p[t];
}

// dlogits (N, E) bf16 from dw (N, K) f32: w_j = p_j / S (S the chosen p's sum, 1 without norm), so
// dp_j = (dw_j - sum_i dw_i w_i) / S on the chosen experts and 0 elsewhere; then dz_e = p_e (dp_e - sum_f p_f dp_f)
__global__ void moe_route_backward_kernel(bf16 *dlogits, const float *dw, const bf16 *logits, const int32_t *idx, int N,
                                          int E, int K, int norm) {
    int n = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (n >= N) return;
    const bf16 *z = logits + (size_t)n * E;
    const int32_t *ix = idx + (size_t)n * K;
    const float *g = dw + (size_t)n * K;
    float mx, s;
    softmax_stats(z, E, lane, &mx, &s);
    float S = 0.0f, gw = 0.0f, pdp = 0.0f;  // every lane alike: K terms each
    for (int j = 0; j < K; j++) S += expf(__bfloat162float(z[ix[j]]) - mx) / s;
    if (!norm) S = 1.0f;
    for (int j = 0; j < K; j++) gw += g[j] * (expf(__bfloat162float(z[ix[j]]) - mx) / s) / S;
    for (int j = 0; j < K; j++) {
        float pj = expf(__bfloat162float(z[ix[j]]) - mx) / s;
        pdp += pj * (norm ? (g[j] - gw) / S : g[j]);
    }
    for (int e = lane; e < E; e += 32) {
        float pe = expf(__bfloat162float(z[e]) - mx) / s, dp = 0.0f;
        for (int j = 0; j < K; j++)
            if (ix[j] == e) dp = norm ? (g[j] - gw) / S : g[j];
        dlogits[(size_t)n * E + e] = __float2bfloat16_rn(pe * (dp - pdp));
    }
}

static void route_check(int E, int K, const char *op) {
    if (E < 1 || E > MOE_MAX_E || K < 1 || K > E)
        die("%s: %d experts, %d a token: the CUDA backend takes 1 <= K <= E <= %d (raise MOE_MAX_E in cuda/moe.cu)", op, E,
            K, MOE_MAX_E);
}

void cu_moe_route(int32_t *idx, void *w, const void *logits, int N, int E, int K, int norm) {
    route_check(E, K, "moe_route");
    if (N <= 0) return;
    moe_route_kernel<<<cdiv(N, 8), 256, 0, cu_stream()>>>(idx, (float *)w, (const bf16 *)logits, N, E, K, norm);
    launchCheck();
}
void cu_moe_route_backward(void *dlogits, const void *dw, const void *logits, const int32_t *idx, int N, int E, int K,
                           int norm) {
    route_check(E, K, "moe_route_backward");
    if (N <= 0) return;
    moe_route_backward_kernel<<<cdiv(N, 8), 256, 0, cu_stream()>>>((bf16 *)dlogits, (const float *)dw,
                                                                     (const bf16 *)logits, idx, N, E, K, norm);
    launchCheck();
}

// ----------------------------------------------------------------------------
// the groups: a stable counting sort of the NK slots by expert, a warp per tile of MOE_SORT_TILE slots.
// A slot whose expert is out of [0, E) belongs to no group (the CPU skips it too).

// counts (tiles, E): how many of tile t's slots go to each expert
__global__ void moe_count_kernel(int *counts, const int32_t *idx, int NK, int E) {
    extern __shared__ int cnt[];
    int t = blockIdx.x, lane = threadIdx.x;
    for (int e = lane; e < E; e += 32) cnt[e] = 0;
    __syncwarp();
    for (int i = t * MOE_SORT_TILE + lane; i < NK && i < (t + 1) * MOE_SORT_TILE; i += 32) {
        int e = idx[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);  // integer counts: the same whatever the order
    }
    __syncwarp();
    for (int e = lane; e < E; e += 32) counts[(size_t)t * E + e] = cnt[e];
}

// one block: offsets (E + 1) of each expert's slots, tile_start (E + 1) of its row tiles of MOE_BM, and
// tile_off (tiles, E): where tile t's first slot of expert e goes
__global__ void moe_offsets_kernel(int *offsets, int *tile_start, int *tile_off, const int *counts, int tiles, int E) {
    __shared__ int base[MOE_MAX_E + 1];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int n = 0;
        for (int t = 0; t < tiles; t++) n += counts[(size_t)t * E + e];
        base[e] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // E <= 256 terms: an exclusive scan by one thread
        int o = 0, r = 0;
        for (int e = 0; e < E; e++) {
            int n = base[e];
            offsets[e] = o, tile_start[e] = r, base[e] = o;
            o += n, r += cdiv(n, MOE_BM);
        }
        offsets[E] = o, tile_start[E] = r;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = base[e];
        for (int t = 0; t < tiles; t++) {
            tile_off[(size_t)t * E + e] = run;
            run += counts[(size_t)t * E + e];
        }
    }
}

// perm: each slot at its expert's next place, in slot order within the expert. A warp takes its tile 32
// slots at a time: the lanes of one expert (__match_any_sync) take consecutive places by lane order.
__global__ void moe_scatter_kernel(int32_t *perm, const int32_t *idx, const int *tile_off, int NK, int E) {
    extern __shared__ int cur[];
    int t = blockIdx.x, lane = threadIdx.x;
    for (int e = lane; e < E; e += 32) cur[e] = tile_off[(size_t)t * E + e];
    __syncwarp();
    for (int c = 0; c < MOE_SORT_TILE; c += 32) {
        int i = t * MOE_SORT_TILE + c + lane;
        int e = i < NK ? idx[i] : -1;
        bool ok = e >= 0 && e < E;
        if (!ok) e = -1;
        unsigned same = __match_any_sync(0xffffffffu, e);
        if (ok) perm[cur[e] + __popc(same & ((1u << lane) - 1))] = i;
        __syncwarp();
        if (ok && lane == __ffs(same) - 1) cur[e] += __popc(same);
        __syncwarp();
    }
}

// the groups of NK slots: device arrays in scratch
typedef struct {
    int *offsets, *tile_start;  // (E + 1) each
    int32_t *perm;              // (NK)
    int row_tiles;              // an upper bound of tile_start[E]: the grids' row-tile count
} MoeGroups;

static MoeGroups moe_groups(const int32_t *idx, int NK, int E) {
    int tiles = cdiv(NK, MOE_SORT_TILE);
    int *buf = (int *)cu_scratch(SC_MOE_INT, (2 * (size_t)tiles * E + 2 * (E + 1) + (size_t)NK) * sizeof(int));
    int *counts = buf, *tile_off = counts + (size_t)tiles * E;
    MoeGroups g;
    g.offsets = tile_off + (size_t)tiles * E;
    g.tile_start = g.offsets + E + 1;
    g.perm = g.tile_start + E + 1;
    g.row_tiles = cdiv(NK, MOE_BM) + E;  // sum of ceil(n_e / BM) <= NK / BM + E
    cudaStream_t st = cu_stream();
    moe_count_kernel<<<tiles, 32, E * sizeof(int), st>>>(counts, idx, NK, E);
    launchCheck();
    moe_offsets_kernel<<<1, 256, 0, st>>>(g.offsets, g.tile_start, tile_off, counts, tiles, E);
    launchCheck();
    moe_scatter_kernel<<<tiles, 32, E * sizeof(int), st>>>(g.perm, idx, tile_off, NK, E);
    launchCheck();
    return g;
}

// ----------------------------------------------------------------------------
// the activations' FP8 scales (the forward's products through FP8 weights), as the CPU quantizes the
// rows it gathers for an expert: ROW one scale a row, BLOCK one a 1x128 group (sx[kb * R + r]), TENSOR
// one for all the rows of an expert (sx[e])

// ROW / BLOCK: a warp a row of x (R, D) bf16
__global__ void moe_row_scales_kernel(float *sx, const bf16 *x, int R, int D, int block) {
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (r >= R) return;
    const bf16 *row = x + (size_t)r * D;
    float m = 0.0f;
    for (int k0 = 0; k0 < D; k0 += FP8_BLOCK_SIZE) {
        float mb = 0.0f;
        for (int k = k0 + lane; k < D && k < k0 + FP8_BLOCK_SIZE; k += 32) mb = fmaxf(mb, fabsf(__bfloat162float(row[k])));
        mb = warp_max(mb);
        if (block && lane == 0) sx[(size_t)(k0 / FP8_BLOCK_SIZE) * R + r] = fp8_scale_dev(mb, FP8_E4M3, 0);
        m = fmaxf(m, mb);
    }
    if (!block && lane == 0) sx[r] = fp8_scale_dev(m, FP8_E4M3, 0);
}

// TENSOR: a block an expert, over its rows: row m of expert e is x's row perm[m] / div
__global__ void moe_expert_scales_kernel(float *sx, const bf16 *x, const int32_t *perm, const int *offsets, int div, int D) {
    int e = blockIdx.x;
    float m = 0.0f;
    for (int i = offsets[e]; i < offsets[e + 1]; i++) {
        const bf16 *row = x + (size_t)(perm[i] / div) * D;
        for (int k = threadIdx.x; k < D; k += blockDim.x) m = fmaxf(m, fabsf(__bfloat162float(row[k])));
    }
    m = block_max(m);
    if (threadIdx.x == 0) sx[e] = fp8_scale_dev(m, FP8_E4M3, 0);
}

// ----------------------------------------------------------------------------
// the grouped GEMM: for each expert e and each of its rows m (offsets[e] <= m < offsets[e + 1]),
//   out[z][perm[m]] (N_out) = sum over the sources s of A_s[perm[m] / div] (K_in) W_s,e^T
// with src = z for the forward's gate|up (one source, blockIdx.z = which) and src = 0, 1 summed for the
// backward's dx (dgate Wg + dup Wu). W_s,e is (N_out, K_in) as stored (the forward: Y = X W^T), or with
// trans (the backward, dX = dY W) (K_in, N_out) read transposed.

typedef struct {
    const void *w[2][MOE_MAX_E];    // expert e's weight of source s: bf16 (gran OFF) or E4M3 codes
    const float *ws[2][MOE_MAX_E];  // its scales (fp8.h's layout; NULL for OFF)
    const bf16 *a[2];               // the sources' rows
    bf16 *out[2];                   // (NK, N_out) of each output, rows by slot
    const int32_t *perm;
    const int *offsets, *tile_start;
    const float *sx;                // the activations' scales (qx), by x_gran's layout; NULL if none
    int E, div;                     // div: K (A's rows are tokens) or 1 (slots)
    int nsrc;                       // sources summed into each output (1 or 2)
    int n_out, k_in, ra;            // N_out, K_in; ra: A's rows (the BLOCK scales' row count)
    FP8Gran gran;                   // the weights' granularity (the same for every expert)
    int trans;                      // W read transposed, dequantized to bf16 (the backward)
    int qx;                         // quantize A to E4M3 with sx as it is loaded (the forward through FP8)
    int ldws;                       // BLOCK: the row length of a weight's scale matrix (fp8_scale_ld)
    int vec;                        // K_in and N_out multiples of 8, every operand 16-byte aligned: 16-byte loads
    bf16 *h;                        // moe_decode_kernel's gate|up: the SwiGLU's output (NK, N_out) too, by slot
} MoeGemm;

// the scale of weight element (r, c) of W (its own rows and columns)
__device__ __forceinline__ float moe_ws_at(const MoeGemm &p, const float *ws, int r, int c) {
    return p.gran == FP8_BLOCK ? ws[(size_t)(r / FP8_BLOCK_SIZE) * p.ldws + c / FP8_BLOCK_SIZE]
                               : p.gran == FP8_ROW ? ws[r] : ws[0];
}
// the scale of A's element (row r of A, column k) of expert e
__device__ __forceinline__ float moe_sx_at(const MoeGemm &p, int e, int r, int k) {
    return p.gran == FP8_BLOCK ? p.sx[(size_t)(k / FP8_BLOCK_SIZE) * p.ra + r] : p.gran == FP8_ROW ? p.sx[r] : p.sx[e];
}
// 8 consecutive elements of A's row r from column k (0 beyond the row; the row r < 0: none), quantized to
// E4M3 with the scale sx and decoded again when p.qx (the value the FP8 product multiplies)
__device__ __forceinline__ void moe_load_a8(float v[8], const MoeGemm &p, const bf16 *A, int r, int k, float sx) {
    const bf16 *row = A + (size_t)r * p.k_in;
    if (r >= 0 && p.vec && k + 8 <= p.k_in) unpack8(v, *(const uint4 *)(row + k));
    else
        for (int j = 0; j < 8; j++) v[j] = r >= 0 && k + j < p.k_in ? __bfloat162float(row[k + j]) : 0.0f;
    if (p.qx)
        for (int j = 0; j < 8; j++) v[j] = fp8_decode_dev(fp8_encode_dev(fp8_div(v[j], sx), FP8_E4M3), FP8_E4M3);
}
// 8 consecutive elements of row r of W_s,e (rows x cols) from column c (0 outside W), as the product reads
// them: an FP8 code's value (the forward: its scale multiplies at the promotion), bf16(code * scale) (the
// backward; c .. c + 7 lie in one 128-wide block, so one scale), or the bf16 value (OFF)
__device__ __forceinline__ void moe_load_w8(float v[8], const MoeGemm &p, int s, int e, int r, int c, int rows, int cols) {
    size_t i = (size_t)r * cols + c;
    bool in = r < rows && c < cols, whole = in && p.vec && c + 8 <= cols;
    if (p.gran == FP8_OFF) {
        const bf16 *w = (const bf16 *)p.w[s][e];
        if (whole) unpack8(v, *(const uint4 *)(w + i));
        else
            for (int j = 0; j < 8; j++) v[j] = in && c + j < cols ? __bfloat162float(w[i + j]) : 0.0f;
        return;
    }
    const uint8_t *q = (const uint8_t *)p.w[s][e];
    uint8_t b[8];
    if (whole) *(uint2 *)b = *(const uint2 *)(q + i);
    else
        for (int j = 0; j < 8; j++) b[j] = in && c + j < cols ? q[i + j] : 0;  // code 0 is +0
    float sc = p.trans && in ? moe_ws_at(p, p.ws[s][e], r, c) : 1.0f;
    for (int j = 0; j < 8; j++) {
        float x = fp8_decode_dev(b[j], FP8_E4M3);
        v[j] = p.trans ? __bfloat162float(__float2bfloat16_rn(x * sc)) : x;
    }
}

// grid (row tiles, column tiles, outputs), 128 threads: warp w computes rows 32 (w / 2) .. + 32 and
// columns 32 (w % 2) .. + 32 of the 64 x 64 tile as 2 x 4 fragments of m16n8
__global__ void __launch_bounds__(128) moe_gemm_kernel(const __grid_constant__ MoeGemm p) {
    __shared__ __align__(16) bf16 As[MOE_BM * MOE_LDS], Bs[MOE_BN * MOE_LDS];
    int b = blockIdx.x;
    if (b >= p.tile_start[p.E]) return;
    int lo = 0, hi = p.E - 1;  // the expert e with tile_start[e] <= b < tile_start[e + 1]
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (p.tile_start[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    int e = lo;
    int m0 = p.offsets[e] + (b - p.tile_start[e]) * MOE_BM, m_end = p.offsets[e + 1];
    int n0 = blockIdx.y * MOE_BN, z = blockIdx.z;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float acc[2][4][4], part[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = part[i][j][c] = 0.0f;
    // the A rows this thread loads (chunks of 8 columns: chunk q = tid + 128 i is row q / MOE_CK, columns
    // 8 (q % MOE_CK)); the same q of B is row q / MOE_CK of W (its output n), or with trans row q / MOE_CN (its k)
    int arow[MOE_CH];
#pragma unroll
    for (int i = 0; i < MOE_CH; i++) {
        int m = m0 + (tid + 128 * i) / MOE_CK;
        arow[i] = m < m_end ? p.perm[m] / p.div : -1;
    }
    for (int si = 0; si < p.nsrc; si++) {
        int s = p.nsrc == 1 ? z : si;
        const bf16 *A = p.a[s];
        for (int k0 = 0; k0 < p.k_in; k0 += MOE_BK) {
            __syncthreads();  // the previous step's fragments are read
#pragma unroll
            for (int i = 0; i < MOE_CH; i++) {  // A: 64 rows x MOE_BK columns
                int q = tid + 128 * i, r = q / MOE_CK, k = k0 + 8 * (q % MOE_CK);
                float v[8], sx = p.qx && arow[i] >= 0 && k < p.k_in ? moe_sx_at(p, e, arow[i], k) : 1.0f;
                moe_load_a8(v, p, A, arow[i], k, sx);
                *(uint4 *)(As + r * MOE_LDS + 8 * (q % MOE_CK)) = pack8(v);
            }
#pragma unroll
            for (int i = 0; i < MOE_CH; i++) {  // B: 64 columns (outputs) x MOE_BK deep, stored as Bs[n][k]
                int q = tid + 128 * i;
                float v[8];
                if (!p.trans) {  // W (N_out, K_in): 8 consecutive k of row n
                    int r = q / MOE_CK;
                    moe_load_w8(v, p, s, e, n0 + r, k0 + 8 * (q % MOE_CK), p.n_out, p.k_in);
                    *(uint4 *)(Bs + r * MOE_LDS + 8 * (q % MOE_CK)) = pack8(v);
                } else {  // W (K_in, N_out): 8 consecutive n of row k, stored down a column of Bs
                    int kr = q / MOE_CN;
                    moe_load_w8(v, p, s, e, k0 + kr, n0 + 8 * (q % MOE_CN), p.k_in, p.n_out);
#pragma unroll
                    for (int j = 0; j < 8; j++) Bs[(8 * (q % MOE_CN) + j) * MOE_LDS + kr] = __float2bfloat16_rn(v[j]);
                }
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < MOE_BK / 16; kk++) {
                uint32_t af[2][4];
#pragma unroll
                for (int i = 0; i < 2; i++)
                    ldsm4(af[i], As + (wm + 16 * i + (lane & 15)) * MOE_LDS + 16 * kk + 8 * (lane >> 4));
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    uint32_t bb[4];
                    ldsm4(bb, Bs + (wn + 16 * np + (lane & 7) + ((lane >> 4) << 3)) * MOE_LDS + 16 * kk + 8 * ((lane >> 3) & 1));
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        mma16816(part[i][2 * np], af[i], bb[0], bb[1]);
                        mma16816(part[i][2 * np + 1], af[i], bb[2], bb[3]);
                    }
                }
            }
            // the end of a 128-deep group (or of K): promote the partial sums, times the scales of the
            // forward's FP8 product (sums of the codes' exact products; the scales change only between groups)
            if ((k0 + MOE_BK) % FP8_BLOCK_SIZE == 0 || k0 + MOE_BK >= p.k_in) {
                int kb = k0 / FP8_BLOCK_SIZE;
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            float f = 1.0f;
                            if (p.qx) {
                                int m = m0 + wm + 16 * i + lane / 4 + 8 * (c >> 1);
                                int n = n0 + wn + 8 * j + 2 * (lane % 4) + (c & 1);
                                f = 0.0f;
                                if (m < m_end && n < p.n_out)
                                    f = moe_sx_at(p, e, p.perm[m] / p.div, kb * FP8_BLOCK_SIZE) *
                                        moe_ws_at(p, p.ws[s][e], n, kb * FP8_BLOCK_SIZE);
                            }
                            acc[i][j][c] += part[i][j][c] * f;
                            part[i][j][c] = 0.0f;
                        }
            }
        }
    }
    bf16 *out = p.out[z];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int c2 = 0; c2 < 2; c2++) {
            int m = m0 + wm + 16 * i + lane / 4 + 8 * c2;
            if (m >= m_end) continue;
            size_t row = (size_t)p.perm[m] * p.n_out;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int c1 = 0; c1 < 2; c1++) {
                    int n = n0 + wn + 8 * j + 2 * (lane % 4) + c1;
                    if (n < p.n_out) out[row + n] = __float2bfloat16_rn(acc[i][j][2 * c2 + c1]);
                }
        }
}

// ----------------------------------------------------------------------------
// the decode step's products (moe_decode_kernel): a few rows an expert (N K / E ~ 4 at a batch of 64), so the
// work is reading each active expert's weights once, each weight row a dot product with each of the rows.
// grid (column slices, E), 256 threads. Block (b, e) takes 64 weight rows of expert e: rows n0 .. n0 + 64 of
// its one weight (down: n0 = 64 b), or rows n0 .. n0 + 32 of gate and of up (n0 = 32 b), whose SwiGLU it
// writes as h as well (the same values as cu_swiglu_forward of the bf16 gate and up). An expert with no rows
// exits at once. Its rows are taken MOE_DEC_R at a time: their values in shared memory (FP8 weights: the
// rows quantized with moe_gemm_kernel's scales and codes, the division by Markstein's exact one, the codes'
// values exact in bf16) with their scales; then warp w takes 8 weight rows, its units u (down: row
// n0 + 8 w + u; gate|up: u < 4 gate's row n0 + 4 w + u, u >= 4 up's row n0 + 4 w + u - 4), and the lanes split
// K: a step, each lane loads 8 weights (8 or 16 bytes) of each of the 8 rows (the warp: 8 runs of 256 or 512
// contiguous bytes in flight) and adds their products with the rows' values, each 8 products' fp32 sum times
// sx * sw (the FP8 product's promotion: 8 elements lie in one 128-wide block; sums of the codes' exact
// products). The 32 (unit, row) sums are reduced across the lanes, lane l ending with unit l / MOE_DEC_R, row
// l % MOE_DEC_R. An expert with more than MOE_DEC_R rows reads its weights again for each further MOE_DEC_R
// (from L2: the block has just read them). At most 128 registers, no spills (sm_89, sm_90a, sm_120): two
// blocks an SM.
#define MOE_DEC_R 4       // an expert's rows a pass
#define MOE_DEC_U 8       // weight rows a warp
#define MOE_DEC_ROWS 64   // weight rows a block: 8 warps
#define MOE_DEC_AVG 16    // the decode kernel takes a product of N K <= MOE_DEC_AVG E slots (see decode_ok)
static_assert(MOE_DEC_R * MOE_DEC_U == 32, "a warp's sums: one a lane");
static_assert(MOE_DEC_U * 8 == MOE_DEC_ROWS, "8 warps of MOE_DEC_U weight rows");

// lane l gets the sum over the warp's lanes of v[l]: a reduce-scatter (31 shuffles for 32 sums). At the step
// of offset O a lane keeps the half of its values whose index has its own bit O and adds its partner's copy of
// that half, so after the steps 16, 8, .., 1 v[0] holds the sum of value `lane`.
template <int O>
__device__ __forceinline__ void warp_scatter_step(float v[32], int lane) {
    bool hi = lane & O;
#pragma unroll
    for (int i = 0; i < O; i++) {
        float send = hi ? v[i] : v[i + O];
        v[i] = (hi ? v[i + O] : v[i]) + __shfl_xor_sync(0xffffffffu, send, O);
    }
}
__device__ __forceinline__ float warp_sum_scatter(float v[32]) {
    int lane = threadIdx.x & 31;
    warp_scatter_step<16>(v, lane);
    warp_scatter_step<8>(v, lane);
    warp_scatter_step<4>(v, lane);
    warp_scatter_step<2>(v, lane);
    warp_scatter_step<1>(v, lane);
    return v[0];
}

// 8 E4M3 codes (byte j of w: code j) as floats, the hardware's paired conversion (exactly fp8_decode_dev's)
__device__ __forceinline__ void moe_decode8(float f[8], uint2 w) {
    const __nv_fp8x2_storage_t *q = (const __nv_fp8x2_storage_t *)&w;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(q[i], __NV_E4M3)));
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}

// FP8W: the weights are E4M3 codes (else bf16). p.out[1] != NULL: gate|up (p.h the SwiGLU), else one weight.
// Dynamic shared memory: decode_smem(p.k_in)
template <bool FP8W>
__global__ void __launch_bounds__(256, 2) moe_decode_kernel(const __grid_constant__ MoeGemm p) {
    extern __shared__ __align__(16) unsigned char moe_dec_smem[];
    __shared__ int xrow[MOE_DEC_R];  // the pass's rows of A (-1: none)
    constexpr int ES = FP8W ? 1 : 2;  // a weight element's bytes
    int e = blockIdx.y, m_beg = p.offsets[e], m_end = p.offsets[e + 1];
    if (m_beg >= m_end) return;  // the whole block: an expert with no rows
    int K_in = p.k_in, nkb = cdiv(K_in, FP8_BLOCK_SIZE), two = p.out[1] != NULL;
    bf16 *xs = (bf16 *)moe_dec_smem;                // (MOE_DEC_R, K_in): the rows' values
    float *xsc = (float *)(xs + MOE_DEC_R * K_in);  // (MOE_DEC_R, nkb): their scales (1 without FP8)
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n0 = blockIdx.x * (two ? MOE_DEC_ROWS / 2 : MOE_DEC_ROWS);
    // unit u is row n = nw + u (down) or nw + u % 4 of weight s = u / 4 (gate|up): in = how many of a
    // weight's units lie within N_out; w0, w1: the first byte of weight 0's, 1's row nw (row bytes rb)
    int nw = n0 + (two ? 4 : MOE_DEC_U) * warp, in = min(p.n_out - nw, two ? 4 : MOE_DEC_U);
    size_t rb = (size_t)K_in * ES;
    const uint8_t *w0 = (const uint8_t *)p.w[0][e] + nw * rb, *w1 = two ? (const uint8_t *)p.w[1][e] + nw * rb : NULL;
    for (int m0 = m_beg; m0 < m_end; m0 += MOE_DEC_R) {
        __syncthreads();  // the previous pass's rows are read
        if (tid < MOE_DEC_R) xrow[tid] = m0 + tid < m_end ? p.perm[m0 + tid] / p.div : -1;
        __syncthreads();
        int kc = K_in / 8;  // 8-element chunks a row (decode_ok: K_in a multiple of 8, A 16-byte aligned)
        for (int q = tid; q < MOE_DEC_R * kc; q += blockDim.x) {
            int r = q / kc, k = 8 * (q % kc), xr = xrow[r];
            float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // a row of none: zeros
            if (xr >= 0) unpack8(v, *(const uint4 *)(p.a[0] + (size_t)xr * K_in + k));
            if (p.qx && xr >= 0) {  // moe_load_a8's codes; the division as fp8_quantize_warp_regs takes it
                float sx = moe_sx_at(p, e, xr, k), y = __frcp_rn(sx);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float d = sx >= 0x1p-60f && fabsf(v[j]) < INFINITY ? fp8_div_fast(v[j], sx, y) : fp8_div(v[j], sx);
                    v[j] = fp8_decode_dev(fp8_encode_dev(d, FP8_E4M3), FP8_E4M3);
                }
            }
            *(uint4 *)(xs + r * K_in + k) = pack8(v);
        }
        for (int q = tid; q < MOE_DEC_R * nkb; q += blockDim.x) {
            int xr = xrow[q / nkb];
            xsc[q] = p.qx && xr >= 0 ? moe_sx_at(p, e, xr, (q % nkb) * FP8_BLOCK_SIZE) : 1.0f;
        }
        __syncthreads();
        float acc[32];  // acc[u MOE_DEC_R + r]: unit u's weight row times row r, this lane's part
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i] = 0.0f;
        for (int k = 8 * lane; k < K_in; k += 32 * 8) {  // this lane: columns k .. k + 8 (one 128-wide group)
            uint4 raw[MOE_DEC_U];  // unit u's 8 weights: 8 codes in .x, .y (FP8W) or 8 bf16
            float sw[MOE_DEC_U], sx[MOE_DEC_R];  // the promotion's scales of these columns
#pragma unroll
            for (int u = 0; u < MOE_DEC_U; u++) {
                int i = two ? u % 4 : u;  // unit u: row nw + i of weight u / 4 (gate|up) or 0
                const uint8_t *w = (two && u >= 4 ? w1 : w0) + i * rb + (size_t)k * ES;
                bool ok = i < in;
                raw[u] = make_uint4(0, 0, 0, 0);
                if (ok && FP8W) *(uint2 *)&raw[u] = __ldg((const uint2 *)w);
                else if (ok) raw[u] = __ldg((const uint4 *)w);
                sw[u] = FP8W && ok ? moe_ws_at(p, p.ws[two ? u / 4 : 0][e], nw + i, k) : 1.0f;
            }
            float xv[MOE_DEC_R][8];
#pragma unroll
            for (int r = 0; r < MOE_DEC_R; r++) {
                sx[r] = xsc[r * nkb + k / FP8_BLOCK_SIZE];
                unpack8(xv[r], *(const uint4 *)(xs + r * K_in + k));
            }
#pragma unroll
            for (int u = 0; u < MOE_DEC_U; u++) {
                float wv[8];
                if (FP8W) moe_decode8(wv, make_uint2(raw[u].x, raw[u].y));
                else unpack8(wv, raw[u]);
#pragma unroll
                for (int r = 0; r < MOE_DEC_R; r++) {
                    float part = 0.0f;
#pragma unroll
                    for (int j = 0; j < 8; j++) part = fmaf(wv[j], xv[r][j], part);
                    acc[u * MOE_DEC_R + r] += FP8W ? part * (sx[r] * sw[u]) : part;
                }
            }
        }
        float v = warp_sum_scatter(acc);
        int u = lane / MOE_DEC_R, m = m0 + lane % MOE_DEC_R;  // this lane's sum: unit u, row m
        if (!two) {
            if (m < m_end && u < in) p.out[0][(size_t)p.perm[m] * p.n_out + nw + u] = __float2bfloat16_rn(v);
        } else {
            float up = __shfl_down_sync(0xffffffffu, v, 16);  // lane l < 16 (gate's unit u): up's unit u + 4, same row
            if (lane < 16 && m < m_end && u < in) {
                size_t i = (size_t)p.perm[m] * p.n_out + nw + u;
                float g = __bfloat162float(__float2bfloat16_rn(v)), uq = __bfloat162float(__float2bfloat16_rn(up));
                p.out[0][i] = __float2bfloat16_rn(g), p.out[1][i] = __float2bfloat16_rn(uq);
                p.h[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * uq);  // ops_cuda.cu's silu_mul
            }
        }
    }
}

// ----------------------------------------------------------------------------
// the per-slot passes

// out (N, C) bf16 = sum_j w[n, j] y[n K + j] in fp32, j ascending, rounded once (slots of no expert skipped)
__global__ void moe_combine_kernel(bf16 *out, const bf16 *y, const float *w, const int32_t *idx, int N, int C, int K,
                                   int E) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)N * C; i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C, c = i % C;
        float s = 0.0f;
        for (int j = 0; j < K; j++) {
            size_t sl = n * K + j;
            if (idx[sl] >= 0 && idx[sl] < E) s += w[sl] * __bfloat162float(y[sl * C + c]);
        }
        out[i] = __float2bfloat16_rn(s);
    }
}

// a warp a slot: dw[slot] = <dout[n], y[slot]> (fp32), dy[slot] = bf16(w[slot] dout[n]) (0 for a slot of no
// expert); dy may be y (each element is read before the same thread writes it)
__global__ void moe_dw_kernel(float *dw, bf16 *dy, const bf16 *dout, const bf16 *y, const float *w, const int32_t *idx,
                              int NK, int C, int K, int E) {
    int sl = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (sl >= NK) return;
    bool ok = idx[sl] >= 0 && idx[sl] < E;
    const bf16 *d = dout + (size_t)(sl / K) * C;
    float s = 0.0f, ws = w[sl];
    for (int c = lane; c < C; c += 32) {
        float v = __bfloat162float(d[c]);
        if (ok) s += v * __bfloat162float(y[(size_t)sl * C + c]);
        dy[(size_t)sl * C + c] = __float2bfloat16_rn(ok ? ws * v : 0.0f);
    }
    s = warp_sum(s);
    if (lane == 0) dw[sl] = s;
}

// dx (N, C) bf16 = sum_j dxs[n K + j] (fp32, j ascending; slots of no expert skipped)
__global__ void moe_sum_slots_kernel(bf16 *dx, const bf16 *dxs, const int32_t *idx, int N, int C, int K, int E) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)N * C; i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C, c = i % C;
        float s = 0.0f;
        for (int j = 0; j < K; j++) {
            size_t sl = n * K + j;
            if (idx[sl] >= 0 && idx[sl] < E) s += __bfloat162float(dxs[sl * C + c]);
        }
        dx[i] = __float2bfloat16_rn(s);
    }
}

// An expert's weight gradient (full fine-tuning of bf16 experts): dW_e (O, I) f32 += sum over its rows m of
// G[perm[m]] (O) x X[perm[m] / div] (I), a 32 x 32 tile a block (256 threads, 4 outputs each), the rows in
// order (no atomics). grid (I / 32, O / 32, E).
typedef struct {
    float *dw[MOE_MAX_E];  // each expert's (O, I) f32
} MoeDW;
__global__ void moe_dweight_kernel(const __grid_constant__ MoeDW dW, const bf16 *G, const bf16 *X, const int32_t *perm, const int *offsets,
                                   int O, int I, int div) {
    __shared__ float gs[32][33], xs[32][33];
    int e = blockIdx.z, o0 = blockIdx.y * 32, i0 = blockIdx.x * 32, tid = threadIdx.x;
    int tx = tid % 32, ty = tid / 32;  // this thread: column i0 + tx, rows o0 + ty + 8 r
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int m0 = offsets[e]; m0 < offsets[e + 1]; m0 += 32) {
        __syncthreads();
        for (int q = tid; q < 32 * 32; q += 256) {
            int r = q / 32, c = q % 32, m = m0 + r;
            bool in = m < offsets[e + 1];
            gs[r][c] = in && o0 + c < O ? __bfloat162float(G[(size_t)perm[m] * O + o0 + c]) : 0.0f;
            xs[r][c] = in && i0 + c < I ? __bfloat162float(X[(size_t)(perm[m] / div) * I + i0 + c]) : 0.0f;
        }
        __syncthreads();
        for (int r = 0; r < 32; r++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[k] += gs[r][ty + 8 * k] * xs[r][tx];
    }
    if (i0 + tx >= I) return;
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (o0 + ty + 8 * k < O) dW.dw[e][(size_t)(o0 + ty + 8 * k) * I + i0 + tx] += acc[k];
}

// ----------------------------------------------------------------------------
// the launchers

// the experts' shared shape and granularity, checked: F (FFe), C
static void experts_shape(const QWeight *experts, int E, int *F, int *C, const char *op) {
    *F = experts[0].rows, *C = experts[0].cols;
    for (int e = 0; e < E; e++)
        for (int k = 0; k < 3; k++) {
            const QWeight *w = &experts[3 * e + k];
            int r = k < 2 ? *F : *C, c = k < 2 ? *C : *F;
            if (w->rows != r || w->cols != c || w->gran != experts[0].gran || w->train)
                die("%s: expert %d's weight %d is (%d, %d) %s where the experts are (%d, %d) %s, frozen: every expert "
                    "must have one shape and granularity",
                    op, e, k, w->rows, w->cols, fp8_gran_name(w->gran), r, c, fp8_gran_name(experts[0].gran));
        }
}

// a grouped GEMM's parameters for weight k (0 gate, 1 up, 2 down) of every expert as source s
static void gemm_weights(MoeGemm *p, int s, const QWeight *experts, int E, int k) {
    for (int e = 0; e < E; e++) {
        const QWeight *w = &experts[3 * e + k];
        p->w[s][e] = w->gran == FP8_OFF ? w->dense : (const void *)w->q.data;
        p->ws[s][e] = w->gran == FP8_OFF ? NULL : w->q.scale;
    }
    const QWeight *w0 = &experts[k];
    p->gran = w0->gran;
    p->ldws = fp8_scale_ld(w0->gran, w0->rows, w0->cols, FP8_BLOCK_SIZE);
}

// whether every row the product reads can be loaded 8 elements at a time (MoeGemm.vec)
static int gemm_vec(const MoeGemm *p) {
    if (p->k_in % 8 || p->n_out % 8) return 0;
    for (int s = 0; s < 2; s++) {
        if (p->a[s] && ptr_align(p->a[s]) < 16) return 0;
        for (int e = 0; e < p->E; e++)
            if (p->w[s][e] && ptr_align(p->w[s][e]) < (p->gran == FP8_OFF ? 16 : 8)) return 0;
    }
    return 1;
}

static void gemm_launch(MoeGemm *p, const MoeGroups *g, int outputs) {
    dim3 grid(g->row_tiles, cdiv(p->n_out, MOE_BN), outputs);
    moe_gemm_kernel<<<grid, 128, 0, cu_stream()>>>(*p);
    launchCheck();
}

// moe_decode_kernel's shared memory for rows of k_in: MOE_DEC_R rows' values and their 128-wide groups' scales
static size_t decode_smem(int k_in) {
    return (size_t)MOE_DEC_R * k_in * sizeof(bf16) + (size_t)MOE_DEC_R * cdiv(k_in, FP8_BLOCK_SIZE) * sizeof(float);
}

// whether moe_decode_kernel takes the forward's product p of NK slots: few rows an expert on average (the decode
// step: N K <= MOE_DEC_AVG E; an expert with more rows is still right, its weights read once per MOE_DEC_R of
// them), K_in a multiple of 8 with A and every weight aligned for the kernel's 16- (bf16) or 8-byte (FP8) loads,
// and the rows' values well within the 48 KB of shared memory a block may take without opting in (40 KB:
// K_in up to ~5,000)
// The decode kernel is the default (FP8GRPO_MOE_DECODE=0: the grouped GEMM instead, to compare the two in one
// process; read at each call, a host getenv beside a kernel launch). On an H100 at Qwen3-30B-A3B's shape,
// batch 64, it made the decode step 6.8x faster with FP8 block weights and 2.8x with BF16
// (dev/notes/models.md, "Qwen3 MoE's decode step"); gpu_moe checks both paths against the CPU.
static int moe_decode_enabled(void) {
    const char *v = getenv("FP8GRPO_MOE_DECODE");
    return !(v && !strcmp(v, "0"));
}

static int decode_ok(const MoeGemm *p, int NK) {
    if (!moe_decode_enabled()) return 0;
    if (NK > MOE_DEC_AVG * p->E || p->k_in % 8 || ptr_align(p->a[0]) < 16 || decode_smem(p->k_in) > 40 * 1024) return 0;
    for (int s = 0; s < 2; s++)
        for (int e = 0; e < p->E; e++)
            if (p->w[s][e] && ptr_align(p->w[s][e]) < (p->gran == FP8_OFF ? 16 : 8)) return 0;
    return 1;
}

// the forward's product through weight k of each expert: out[z] (NK, n_out) by slot, from a (by token: div K;
// by slot: div 1) of width k_in; ks: weights k, k + 1 for outputs 0, 1 when outputs is 2 (gate|up).
// FP8 weights: a's rows quantized to their granularity (the scales computed here). h (gate|up, NULL: not
// wanted): where the decode kernel writes silu(gate) * up as well; returns whether h was written (the decode
// kernel took the product) or is still to be computed
static int forward_product(bf16 *out0, bf16 *out1, bf16 *h, const bf16 *a, int ra, int div, int k, int outputs,
                           const QWeight *experts, const MoeGroups *g, int E, int n_out, int k_in) {
    MoeGemm p;
    memset(&p, 0, sizeof p);
    for (int s = 0; s < outputs; s++) gemm_weights(&p, s, experts, E, k + s);
    p.a[0] = p.a[1] = a;
    p.out[0] = out0, p.out[1] = out1;
    p.perm = g->perm, p.offsets = g->offsets, p.tile_start = g->tile_start;
    p.E = E, p.div = div, p.nsrc = 1, p.n_out = n_out, p.k_in = k_in, p.ra = ra;
    p.qx = p.gran != FP8_OFF;
    if (p.qx) {
        size_t ns = p.gran == FP8_BLOCK ? (size_t)cdiv(k_in, FP8_BLOCK_SIZE) * ra : p.gran == FP8_ROW ? (size_t)ra : (size_t)E;
        float *sx = (float *)cu_scratch(div == 1 ? SC_MOE_SH : SC_MOE_SX, ns * sizeof(float));
        if (p.gran == FP8_TENSOR) moe_expert_scales_kernel<<<E, 256, 0, cu_stream()>>>(sx, a, g->perm, g->offsets, div, k_in);
        else moe_row_scales_kernel<<<cdiv(ra, 8), 256, 0, cu_stream()>>>(sx, a, ra, k_in, p.gran == FP8_BLOCK);
        launchCheck();
        p.sx = sx;
    }
    p.vec = gemm_vec(&p);
    if ((outputs == 1 || h) && decode_ok(&p, ra * div)) {  // ra div: the slots (by token: N K; by slot: NK)
        p.h = outputs == 2 ? h : NULL;
        dim3 grid(cdiv(n_out, outputs == 2 ? MOE_DEC_ROWS / 2 : MOE_DEC_ROWS), E);
        size_t smem = decode_smem(k_in);
        if (p.gran == FP8_OFF) moe_decode_kernel<false><<<grid, 256, smem, cu_stream()>>>(p);
        else moe_decode_kernel<true><<<grid, 256, smem, cu_stream()>>>(p);
        launchCheck();
        return outputs == 2;
    }
    gemm_launch(&p, g, outputs);
    return 0;
}

// dxs (NK, n_out) by slot = sum over the sources s of a_s (NK, k_in) by slot times weight ks[s] of its expert,
// the weight read transposed and dequantized to bf16
static void backward_product(bf16 *dxs, const bf16 *a0, const bf16 *a1, int k, int nsrc, const QWeight *experts,
                             const MoeGroups *g, int E, int n_out, int k_in) {
    MoeGemm p;
    memset(&p, 0, sizeof p);
    for (int s = 0; s < nsrc; s++) gemm_weights(&p, s, experts, E, k + s);
    p.a[0] = a0, p.a[1] = a1;
    p.out[0] = dxs;
    p.perm = g->perm, p.offsets = g->offsets, p.tile_start = g->tile_start;
    p.E = E, p.div = 1, p.nsrc = nsrc, p.n_out = n_out, p.k_in = k_in, p.ra = 0;
    p.trans = 1;
    p.vec = gemm_vec(&p);
    gemm_launch(&p, g, 1);
}

// h (NK, F) = silu(gate) * up, then y (NK, C) by slot = each slot's expert's down product of h
static void down_forward(bf16 *y, bf16 *h, const bf16 *gate, const bf16 *up, const QWeight *experts, const MoeGroups *g,
                         int NK, int E, int F, int C) {
    cu_swiglu_forward(h, gate, up, (size_t)NK * F);
    forward_product(y, NULL, NULL, h, NK, 1, 2, 1, experts, g, E, C, F);
}

void cu_moe_experts_forward(void *out, void *gate, void *up, const void *x, const int32_t *idx, const void *w,
                            const QWeight *experts, int N, int E, int K, const ExpertLoRA *lora) {
    int F, C, NK = N * K;
    route_check(E, K, "moe_experts_forward");
    if (lora) die("moe_experts_forward: LoRA on the experts has no CUDA kernels yet: use --device cpu, or LoRA on the attention");
    experts_shape(experts, E, &F, &C, "moe_experts_forward");
    if (N <= 0) return;
    MoeGroups g = moe_groups(idx, NK, E);
    bf16 *gu = (gate && up) ? NULL : (bf16 *)cu_scratch(SC_MOE_GU, 2 * (size_t)NK * F * 2);
    bf16 *gb = gate ? (bf16 *)gate : gu, *ub = up ? (bf16 *)up : gu + (size_t)NK * F;
    bf16 *h = (bf16 *)cu_scratch(SC_MOE_H, (size_t)NK * F * 2), *y = (bf16 *)cu_scratch(SC_MOE_Y, (size_t)NK * C * 2);
    // a slot of no expert (an index out of [0, E)) is written by no product and skipped by the sums
    // gate|up (the decode kernel writes h too), h, then down
    if (!forward_product(gb, ub, h, (const bf16 *)x, N, K, 0, 2, experts, &g, E, F, C))
        cu_swiglu_forward(h, gb, ub, (size_t)NK * F);
    forward_product(y, NULL, NULL, h, NK, 1, 2, 1, experts, &g, E, C, F);
    moe_combine_kernel<<<grid_for((size_t)N * C), 256, 0, cu_stream()>>>((bf16 *)out, y, (const float *)w, idx, N, C, K, E);
    launchCheck();
}

void cu_moe_experts_backward(void *dx, void *dw, const QWeight *dexperts, const void *dout, const void *x,
                             const int32_t *idx, const void *w, const void *gate, const void *up, const QWeight *experts,
                             int N, int E, int K, const ExpertLoRA *lora) {
    int F, C, NK = N * K;
    route_check(E, K, "moe_experts_backward");
    if (lora) die("moe_experts_backward: LoRA on the experts has no CUDA kernels yet: use --device cpu, or LoRA on the attention");
    experts_shape(experts, E, &F, &C, "moe_experts_backward");
    if (dexperts && experts[0].gran != FP8_OFF)
        die("moe_experts_backward: weight gradients of FP8 experts are not supported (they are frozen)");
    if (N <= 0) return;
    cudaStream_t st = cu_stream();
    MoeGroups g = moe_groups(idx, NK, E);
    // three per-slot buffers, each reused once its contents are spent: h then dh (F), y then dy then each
    // slot's dx (C), and dgate|dup (2 F)
    bf16 *h = (bf16 *)cu_scratch(SC_MOE_H, (size_t)NK * F * 2), *y = (bf16 *)cu_scratch(SC_MOE_Y, (size_t)NK * C * 2);
    bf16 *dg = (bf16 *)cu_scratch(SC_MOE_GU, 2 * (size_t)NK * F * 2), *du = dg + (size_t)NK * F;
    MoeDW d[3];  // the weight gradients' pointers (dexperts: BF16 experts, full fine-tuning)
    for (int e = 0; dexperts && e < E; e++)
        for (int k = 0; k < 3; k++) d[k].dw[e] = (float *)dexperts[3 * e + k].dense;
    // each slot's expert output again (the routing weight's gradient), dy = w dout in its place; then dy
    // through down (dWd += dy^T h first: h's buffer takes dh), the SwiGLU, and gate and up (one product,
    // dy's buffer takes it); each token's K slots summed; dWg += dgate^T x, dWu += dup^T x
    down_forward(y, h, (const bf16 *)gate, (const bf16 *)up, experts, &g, NK, E, F, C);
    moe_dw_kernel<<<cdiv(NK, 8), 256, 0, st>>>((float *)dw, y, (const bf16 *)dout, y, (const float *)w, idx, NK, C, K, E);
    launchCheck();
    if (dexperts) {
        moe_dweight_kernel<<<dim3(cdiv(F, 32), cdiv(C, 32), E), 256, 0, st>>>(d[2], y, h, g.perm, g.offsets, C, F, 1);
        launchCheck();
    }
    bf16 *dh = h;
    backward_product(dh, y, NULL, 2, 1, experts, &g, E, F, C);
    cu_swiglu_backward(dg, du, dh, gate, up, (size_t)NK * F);
    backward_product(y, dg, du, 0, 2, experts, &g, E, C, F);
    moe_sum_slots_kernel<<<grid_for((size_t)N * C), 256, 0, st>>>((bf16 *)dx, y, idx, N, C, K, E);
    launchCheck();
    if (!dexperts) return;
    moe_dweight_kernel<<<dim3(cdiv(C, 32), cdiv(F, 32), E), 256, 0, st>>>(d[0], dg, (const bf16 *)x, g.perm, g.offsets, F, C, K);
    moe_dweight_kernel<<<dim3(cdiv(C, 32), cdiv(F, 32), E), 256, 0, st>>>(d[1], du, (const bf16 *)x, g.perm, g.offsets, F, C, K);
    launchCheck();
}
