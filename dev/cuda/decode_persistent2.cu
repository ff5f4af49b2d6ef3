// dev/cuda/decode_persistent2.cu: the second half of a decode step's layer as ONE persistent kernel, second
// version: K whole in every tile (no split partials), dependencies per tile instead of per phase, and
// epilogues that finish rows. Against the per-op path the program runs today, at M <= 64 rows with FP8
// block scaling (E4M3).
//   make -C dev ../build/decode_persistent2 && ./build/decode_persistent2 [--shape 0.6b|8b] [--rows M]
//   ./build/decode_persistent2 --shape 8b --stream-only      (W alone through a ring: by producer, box, depth)
//
// The half layer (as decode_persistent.cu, the first version): o = att W_o^T; x += o; ln = rmsnorm(x) w_2
// (its FP8 copy lnq, 1 x 128 scales); gu = lnq W_gu^T; h = silu(gate) * up (its FP8 copy hq); d = hq W_d^T;
// x += d; the next layer's norm and its FP8 copy nq. The first version ran it as six phases behind
// global barriers, each GEMM phase's K split into fp32 partials that the row phase after it re-read:
// 0.64-0.88x the per-op path (dev/notes/decode.md). This one keeps K whole and makes tiles narrow
// instead, so that there are still about as many tiles as SMs, and finishes rows in the epilogues.
//
// The tasks, one global list in this order; block b runs tasks b, b + blocks, b + 2 blocks, ...:
//   O   (C / T_o tiles)     o's columns [n0, n0 + T_o), K = A whole. Epilogue: x = bf16(x + bf16(o)) for
//                           its columns (each column of x has one owner), and the rows' sums of squares
//                           of the new x over its columns added to ss[row] (an fp32 atomic a row).
//                           Then count cnt_o.
//   N1  (C / 128 units)     unit kb: waits for cnt_o = every O tile; then, for every row, rstd from ss,
//                           ln = bf16(x rstd w) of columns kb 128 ..+128 and their FP8 codes + scale
//                           (lnq's block kb); then sets flag_n[kb].
//   GU  (FF / (T_gu / 2))   T_gu / 2 gate rows and the matching up rows of W_gu, interleaved at load
//                           (two TMA boxes into one W stage), so one tile holds g and u of the same
//                           columns. X's K step kb waits for flag_n[kb]. Epilogue: h = bf16(silu(g) u)
//                           stored (bf16); then cnt_h[the h 128-block] counted: the tile that brings it
//                           to 256 / T_gu (the block's last) reads the block's h back from L2 and writes
//                           its FP8 codes and scales (hq's block), then sets flag_h[block].
//   D   (C / T_d tiles)     as O over W_d with X = hq: its K step kb waits for flag_h[kb]. Epilogue as O
//                           (x += d, ss2), counted in cnt_d.
//   N5  (C / 128 units)     as N1 with the next layer's norm weight (cnt_d, ss2) -> nq.
// Why a task can always go on (no deadlock, given every block resident: one block an SM): a task waits
// only for tasks earlier in the list, every block runs its tasks in list order, and the ring below is
// filled in that order too, so the earliest unfinished task always has everything it waits for.
//
// Counters and rounding. rstd's sum of squares is added in whatever order the O / D tiles finish (an
// fp32 atomic), so it can differ from the per-op path's fixed order in the last bit, and with it a
// rounding of ln: the check reports how often x and the codes agree bit for bit. Everything else is
// the per-op path's arithmetic (the tiles' K steps summed in order as fp8_hopper.cu's decode kernel
// does, bf16 roundings where the per-op path stores bf16). The last block to leave sets every counter,
// flag and sum back to 0 for the next launch (a graph replays the same arguments, so no epoch number).
//
// The ring. Warp 4 produces, warps 0-3 (one warpgroup) consume. Stages of X (64 rows x 128 B: the K
// step of every row, zero-filled past M) and W (T rows x 128 B), their block scales beside. The
// producer walks the block's K steps of all its GEMM tasks with two cursors: W's needs only a free
// stage (weights depend on nothing), so it runs across task and op boundaries up to the ring's depth
// ahead (while a block waits in N1, its next GU tiles' weights already stream in); X's waits for the
// flag of the block of X it loads. Every K step of a tile reads all of X (64 x K codes) from L2: for a
// 32-wide tile that is twice its W bytes; the tile widths are arguments, and the bench times several.
// A stage's full barrier counts 1 + 32 arrivals: the W cursor's expect_tx (W's and X's bytes) and one
// cp.async arrive of each lane that loaded the step's scales: warp 4's own lanes, or with variant bit 5
// warp 5's, which walks the same X cursor (its own stage-free wait and flag checks) so that the TMA
// issuer executes no cp.async.mbarrier.arrive; with bit 6 the scales come by TMA too, in expect_tx's
// bytes, and the barrier counts 1 (see P2Args.variant).
//
// %globaltimer marks: each task's begin, the moment its data were there (its first stage full, or its
// wait over), its end: `bench` prints, per kind of task, when the first began, how long tasks waited
// and worked, when the last ended.
#include <math.h>

#include <algorithm>
#include <vector>

#include "common.cuh"
#include "cuda/backend_cuda.cuh"

#define P2_TX (64 * WG_BK)  // bytes of one stage of X
#define P2_SC 128           // floats of a stage's scales: sx of 64 rows, sw of gate (or the tile) at 64, of up at
#define P2_SW_UP 96         // P2_SW_UP: each part 128-byte aligned, as a TMA destination must be (variant bit 6)
#define P2_MAXSTAGES 32
#define P2_THREADS 192      // warps 0-3 consume, 4 loads by TMA, 5 loads the scales (variant bit 5; else it leaves)
#define P2_SMEM 231424       // 226 KiB of the block's 227; the stages are as many as fit (p2_stages)
#define P2_MAXT 16           // tasks a block, at most (the marks' slots)
#define P2_MARKS 3           // a task's marks: begin, data there, end
#define P2_MAXCB 64          // 128-blocks of C, at most (C <= 8192)
#define P2_MAXFB 256         // of FF (FF <= 32768)

enum { K_O, K_N1, K_GU, K_D, K_N5, K_N };  // kinds of task, in list order
static const char *KIND_NAME[K_N] = {"O", "N1 norm", "GU", "D", "N5 norm"};

// the counters, in global memory: all 0 between launches
typedef struct {
    unsigned cnt_o, cnt_d, exit, pad;
    unsigned flag_n[P2_MAXCB];  // lnq's 128-column block kb is written
    unsigned flag_h[P2_MAXFB];  // hq's block kb is written
    unsigned cnt_h[P2_MAXFB];   // GU tiles done of h's block kb
    float ss[64], ss2[64];      // the rows' sums of squares of x after o, after down
} P2Sync;

typedef struct {
    int N, K, T;                // W (N, K) (for GU: the 2 FF rows of gate then up); the tile width
    int tiles;
    const float *sw;            // W's 128 x 128 block scales, row length ldsw
    int ldsw;
    const float *sx;            // X's 1 x 128 scales (K / 128, M)
} P2Gemm;

typedef struct {
    int M, C, FF, stages;
    float eps;
    P2Gemm g[3];                  // o, gate|up, down
    int count[K_N], first[K_N];   // tasks of each kind, the list index of its first
    bf16 *x, *ln, *h;             // (M, C): the residual stream, the normalized rows; (M, FF): h
    float *rstd;                  // (M)
    const bf16 *w_norm, *w_next;  // (C)
    uint8_t *lnq; float *lnqs;    // (M, C) E4M3 + (C / 128, M): gate|up's input
    uint8_t *hq; float *hqs;      // (M, FF) + (FF / 128, M): down's input
    uint8_t *nq; float *nqs;      // (M, C) + (C / 128, M): the next layer's q|k|v input
    P2Sync *sync;
    int variant;                  // bit 0: each tile starts its K walk at step tile % KB (and wraps), so that the
                                  // tiles of an op read different K steps of X at a time; bit 1 (timing only,
                                  // wrong results): no X nor its scales loaded, W alone through the same ring;
                                  // bit 2 (timing only): no math, the consumers release each stage as it lands;
                                  // bit 3 (timing only): no scales loaded (no cp.async); bit 4 (timing only, with
                                  // bits 1-3 and o, down 32 wide): W of o and down in boxes of 2 K steps (8 KB), one
                                  // every other step (the odd step's stage gets no bytes): half the TMA loads;
                                  // bit 5: the scales' cp.asyncs and their cp.async arrives on the full barrier
                                  // move from warp 4 (the TMA issuer) to warp 5, so that the thread issuing TMA
                                  // never executes cp.async.mbarrier.arrive ("Reading the ring" in
                                  // dev/notes/decode.md: the suspected serialization of the stream); bit 6 (not
                                  // with 5): no cp.async at all, the scales by TMA boxes from 1-D maps (sx: 64
                                  // values from the step's first, sw: 4 from the tile's), counted in expect_tx
    unsigned long long *trace;    // NULL, or P2_MAXT * P2_MARKS a block (ns, %globaltimer)
} P2Args;

typedef struct {
    CUtensorMap x[3], w[3];  // X boxes of 64 x 128 B; W boxes of T x 128 B (GU: T / 2, gate and up apart)
    CUtensorMap w2[3];       // variant bit 4: o's and down's W as (K step, row, 128 B) in boxes of 2 K steps
    CUtensorMap sx[3], sw[3];  // variant bit 6: X's and W's scales as 1-D arrays, boxes of 64 and 4 floats
} P2Maps;

// ---- small PTX pieces beyond hopper.cuh (as decode_persistent.cu's) ----
__device__ __forceinline__ unsigned ld_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acquire() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// ordinary global writes -> visible to TMA reads (the async proxy) after the release that follows
__device__ __forceinline__ void fence_proxy_async_global() {
#ifdef FP8_SM90A
    asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ int mbar_test(uint64_t *bar, int parity) {
    uint32_t done = 0;
#ifdef FP8_SM90A
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
#endif
    return (int)done;
}
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1, int c2) {
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                 ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2) : "memory");
#endif
}
__device__ __forceinline__ void tma_load_1d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0) {
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];\n"
                 ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0) : "memory");
#endif
}
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ float bf16r(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// wgmma m64nNk32 e4m3 for the narrow tiles (N = 16, 32; hopper.cuh has 64, 96, 128)
#define P2_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
__device__ __forceinline__ void wgmma_m64n16k32_e4m3(float (&d)[8], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
                 : P2_D8(0) : "l"(da), "l"(db), "r"(accumulate));
#endif
}
__device__ __forceinline__ void wgmma_m64n32k32_e4m3(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
                 : P2_D8(0), P2_D8(8) : "l"(da), "l"(db), "r"(accumulate));
#endif
}
#undef P2_D8
// one 128-wide K step of a 64 x T tile into part (overwritten), issued as one commit group (not waited for)
template <int T>
__device__ __forceinline__ void p2_issue(float (&part)[T / 2], uint64_t da, uint64_t db) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < WG_BK / 32; k++) {
        if constexpr (T == 16) wgmma_m64n16k32_e4m3(part, da + 2 * k, db + 2 * k, k);
        else if constexpr (T == 32) wgmma_m64n32k32_e4m3(part, da + 2 * k, db + 2 * k, k);
        else wgmma_m64n64k32_e4m3(part, da + 2 * k, db + 2 * k, k);
    }
    wgmma_commit();
}

// ---- the task list ----
// list index t -> kind and index within the kind
__device__ __forceinline__ void p2_task(const P2Args &a, int t, int &kind, int &idx) {
    kind = K_N - 1;
    while (kind > 0 && t < a.first[kind]) kind--;
    idx = t - a.first[kind];
}
__device__ __forceinline__ int p2_gemm_of(int kind) { return kind == K_O ? 0 : kind == K_GU ? 1 : kind == K_D ? 2 : -1; }
__device__ __forceinline__ int p2_total(const P2Args &a) { return a.first[K_N - 1] + a.count[K_N - 1]; }

// the walk over a block's K steps of its GEMM tasks (the producer's two cursors, the consumers' one)
struct P2Walk {
    int t, g, tile, kb, KB, k0;  // list index, GEMM (-1: done), tile, K step, K steps of the tile, the first
    __device__ int k() const { return kb + k0 < KB ? kb + k0 : kb + k0 - KB; }  // the K step's position in K
    __device__ void settle(const P2Args &a) {  // from t: the next GEMM task at or after it
        for (; t < p2_total(a); t += gridDim.x) {
            int kind, idx;
            p2_task(a, t, kind, idx);
            g = p2_gemm_of(kind);
            if (g >= 0) {
                tile = idx; kb = 0; KB = a.g[g].K / WG_BK;
                k0 = a.variant & 1 ? tile % KB : 0;
                return;
            }
        }
        g = -1;
    }
    __device__ void begin(const P2Args &a) { t = blockIdx.x; settle(a); }
    __device__ bool done() const { return g < 0; }
    __device__ void next(const P2Args &a) {
        if (++kb < KB) return;
        t += gridDim.x;
        settle(a);
    }
};

// whether X's K step k of GEMM g may be loaded (the producer warp). The flags only go 0 -> 1: the warp
// keeps those it has seen set in shared memory (seen: a bit a flag, per GEMM), and reads the 32 around k at once.
__device__ __forceinline__ bool p2_x_ready(const P2Args &a, int g, int k, int lane, unsigned *seen) {
    if (g == 0) return true;  // O's X (the attention's codes) exists at launch
    unsigned *bits = seen + (g - 1) * (P2_MAXFB / 32);
    if (bits[k >> 5] >> (k & 31) & 1) return true;
    const unsigned *flags = g == 1 ? a.sync->flag_n : a.sync->flag_h;
    int n = a.g[g].K / WG_BK, i = (k & ~31) + lane;
    unsigned set = __ballot_sync(0xffffffffu, i < n && ld_relaxed(flags + i) != 0);
    if (!(set >> (k & 31) & 1)) return false;
    fence_acquire();  // their writers' stores (lnq / hq codes and scales) before our loads
    fence_proxy_async_global();
    __syncwarp();
    if (lane == 0) bits[k >> 5] = set;  // includes the bits seen before
    __syncwarp();
    return true;
}

// ---- the consumers' pieces (warps 0-3, 128 threads; named barrier 1) ----
// the warpgroup's stores are done: fence them (for TMA readers too); thread 0 then adds 1 to *cnt and
// returns its old value (the others get 0)
__device__ __forceinline__ unsigned p2_count(unsigned *cnt) {
    fence_proxy_async_global();
    __threadfence();
    named_bar_sync(1, 128);
    unsigned old = 0;
    if (threadIdx.x == 0) old = atomicAdd(cnt, 1u);
    return old;
}
__device__ __forceinline__ void p2_set(unsigned *flag) {
    fence_proxy_async_global();
    __threadfence();
    named_bar_sync(1, 128);
    if (threadIdx.x == 0) atomicExch(flag, 1u);
}
// wait until *cnt >= n (thread 0 polls, the others wait for it)
__device__ __forceinline__ void p2_wait(const unsigned *cnt, unsigned n) {
    if (threadIdx.x == 0) {
        while (ld_relaxed(cnt) < n) __nanosleep(32);
        fence_acquire();
    }
    named_bar_sync(1, 128);
}

// 64 values of row r (thread t: row t / 2, columns 64 (t % 2) ..+64 of a 128-block) -> their FP8 codes
// at q (row r, the block's column c0) and, from the thread of the even half, the block's scale at
// qs[r]: fp8_quantize's 1 x 128 block (the amax of both halves). Every thread calls it (shuffles).
__device__ __forceinline__ void p2_encode_half(const float (&v)[64], bool on, uint8_t *q, float *qs) {
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < 64; j++) m = fmaxf(m, fabsf(v[j]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    if (!on) return;
    float sc = fp8_scale_dev(m, FP8_E4M3, 0);
    if ((threadIdx.x & 1) == 0) *qs = sc;
#pragma unroll
    for (int j = 0; j < 64; j += 8) {
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo |= (uint32_t)fp8_encode_dev(__fdiv_rn(v[j + k], sc), FP8_E4M3) << (8 * k);
            hi |= (uint32_t)fp8_encode_dev(__fdiv_rn(v[j + k + 4], sc), FP8_E4M3) << (8 * k);
        }
        *(uint2 *)(q + j) = make_uint2(lo, hi);
    }
}

// N1 / N5 unit kb: after every O (D) tile, ln = bf16(bf16... (x rstd) w) of columns kb 128 ..+128 of
// every row, as cu_add_rmsnorm computes it from the rounded x, and its FP8 block
__device__ void p2_norm_unit(const P2Args &a, int kb, const unsigned *cnt, unsigned tiles, const float *ss, const bf16 *w,
                             uint8_t *q, float *qs, unsigned long long *mk) {
    const int t = threadIdx.x, r = t >> 1, c0 = kb * FP8_BLOCK_SIZE + 64 * (t & 1);
    const bool on = r < a.M;
    float g[64];  // the norm weight: static, loaded before the wait
#pragma unroll
    for (int j = 0; j < 64; j += 8) unpack8(g + j, __ldg((const uint4 *)(w + c0 + j)));
    p2_wait(cnt, tiles);
    if (mk && t == 0) mk[1] = globaltimer();
    float v[64];
    float rs = on ? 1.0f / sqrtf(__ldcg(ss + r) / a.C + a.eps) : 0.f;
#pragma unroll
    for (int j = 0; j < 64; j += 8) {
        float xv[8];
        if (on) unpack8(xv, __ldcg((const uint4 *)(a.x + (size_t)r * a.C + c0 + j)));
        else for (int k = 0; k < 8; k++) xv[k] = 0.f;
#pragma unroll
        for (int k = 0; k < 8; k++) xv[k] = (xv[k] * rs) * g[j + k];
        uint4 y = pack8(xv);
        if (on && w == a.w_norm) *(uint4 *)(a.ln + (size_t)r * a.C + c0 + j) = y;
        unpack8(v + j, y);  // the copy encodes the stored (rounded) values
    }
    if (on && kb == 0 && (t & 1) == 0 && w == a.w_norm) a.rstd[r] = rs;
    p2_encode_half(v, on, q + (size_t)r * a.C + c0, qs + (size_t)kb * a.M + r);
}

// h's block kb is complete (every GU tile of it counted): its FP8 codes and scales, from h in L2
__device__ void p2_h_block(const P2Args &a, int kb) {
    const int t = threadIdx.x, r = t >> 1, c0 = kb * FP8_BLOCK_SIZE + 64 * (t & 1);
    const bool on = r < a.M;
    float v[64];
#pragma unroll
    for (int j = 0; j < 64; j += 8) {
        if (on) unpack8(v + j, __ldcg((const uint4 *)(a.h + (size_t)r * a.FF + c0 + j)));
        else for (int k = 0; k < 8; k++) v[j + k] = 0.f;
    }
    p2_encode_half(v, on, a.hq + (size_t)r * a.FF + c0, a.hqs + (size_t)kb * a.M + r);
}

// O / D epilogue: x = bf16(x + bf16(acc)) for the tile's columns, the rows' sums of squares to ss.
// The thread's rows rl and rl + 8, columns 8 i + 2 (lane % 4) + 0/1 (wgmma's accumulator layout).
template <int T>
__device__ __forceinline__ void p2_epi_add(const P2Args &a, const float (&acc)[T / 2], int n0, float *ss, int rl) {
    const int lane = threadIdx.x & 31;
    float s[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < T / 8; i++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int r = rl + 8 * hr;
            if (r >= a.M) continue;
            unsigned *xp = (unsigned *)(a.x + (size_t)r * a.C + n0 + 8 * i + 2 * (lane & 3));
            unsigned xw = __ldcg(xp);
            float2 xv = __bfloat1622float2(*(__nv_bfloat162 *)&xw);
            float x0 = bf16r(xv.x + bf16r(acc[4 * i + 2 * hr])), x1 = bf16r(xv.y + bf16r(acc[4 * i + 2 * hr + 1]));
            __nv_bfloat162 y = __floats2bfloat162_rn(x0, x1);
            __stcg(xp, *(unsigned *)&y);
            s[hr] += x0 * x0 + x1 * x1;
        }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        s[hr] += __shfl_xor_sync(0xffffffffu, s[hr], 1);
        s[hr] += __shfl_xor_sync(0xffffffffu, s[hr], 2);
        if ((lane & 3) == 0 && rl + 8 * hr < a.M) atomicAdd(ss + rl + 8 * hr, s[hr]);
    }
}

// GU epilogue: the tile's columns 0..T/2 are gate, T/2..T up, of h's columns h0 ..+T/2: h = bf16(silu(g) u)
// of the rounded g and u, as cu_glu_gu computes it from the per-op product's bf16 output
template <int T>
__device__ __forceinline__ void p2_epi_glu(const P2Args &a, const float (&acc)[T / 2], int h0, int rl) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < T / 16; i++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int r = rl + 8 * hr;
            if (r >= a.M) continue;
            float h[2];
#pragma unroll
            for (int e = 0; e < 2; e++)
                h[e] = silu_mul(bf16r(acc[4 * i + 2 * hr + e]), bf16r(acc[4 * (i + T / 16) + 2 * hr + e]));
            __nv_bfloat162 y = __floats2bfloat162_rn(h[0], h[1]);
            __stcg((unsigned *)(a.h + (size_t)r * a.FF + h0 + 8 * i + 2 * (lane & 3)), *(unsigned *)&y);
        }
}

// The ring's stage of step j: wait for it to be full, issue its wgmmas into part
template <int T>
__device__ __forceinline__ void p2_step_issue(const P2Args &a, long j, float (&part)[T / 2], uint8_t *xs, uint8_t *ws,
                                              int stage_bytes, uint64_t *full) {
    int st = (int)(j % a.stages), par = (int)((j / a.stages) & 1);
    mbar_wait(&full[st], par);
    p2_issue<T>(part, wg_desc(xs + (size_t)st * stage_bytes), wg_desc(ws + (size_t)st * stage_bytes));
}
// step j's product is in part (waited for): acc += part (sx sw), and the stage goes back to the producer.
// W's scale: one for the tile, or (GU) gate's for columns < T / 2 and up's for the rest.
template <int T>
__device__ __forceinline__ void p2_step_promote(const P2Args &a, long j, float (&acc)[T / 2], float (&part)[T / 2], bool glu,
                                                const float *sc, uint64_t *empty) {
    const int lane = threadIdx.x & 31, rl = (threadIdx.x >> 5) * 16 + (lane >> 2);
    int st = (int)(j % a.stages);
    fence_regs(part);
    const float *s = sc + st * P2_SC;
    float f00 = s[rl] * s[64], f10 = s[rl + 8] * s[64], f01 = s[rl] * s[P2_SW_UP], f11 = s[rl + 8] * s[P2_SW_UP];
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[st]);  // the warp's reads of the stage (its scales) are done
#pragma unroll
    for (int q = 0; q < T / 8; q++) {
        bool up = glu && q >= T / 16;
        acc[4 * q + 0] += part[4 * q + 0] * (up ? f01 : f00);
        acc[4 * q + 1] += part[4 * q + 1] * (up ? f01 : f00);
        acc[4 * q + 2] += part[4 * q + 2] * (up ? f11 : f10);
        acc[4 * q + 3] += part[4 * q + 3] * (up ? f11 : f10);
    }
}

// one GEMM task: its K steps from the ring (stage counter i runs on across tasks), step k + 1's wgmmas in
// flight while step k is promoted (as fp8_hopper.cu's decode kernel), then its epilogue
template <int T>
__device__ void p2_gemm_task(const P2Args &a, int g, int tile, long &i, uint8_t *xs, uint8_t *ws, int stage_bytes, float *sc,
                             uint64_t *full, uint64_t *empty, unsigned long long *mk, int *last_shared) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, rl = warp * 16 + (lane >> 2);
    const int KB = a.g[g].K / WG_BK;
    const bool glu = g == 1;
    float acc[T / 2], p0[T / 2], p1[T / 2];
#pragma unroll
    for (int j = 0; j < T / 2; j++) acc[j] = 0.f;
    // two K steps an iteration: the second's wgmmas run while the first is promoted; every wgmma is
    // waited for inside its iteration (a chain across the loop's back edge makes ptxas serialize them)
    if (a.variant & 4) {  // timing only: no math
        for (int kb = 0; kb < KB; kb++, i++) {
            int st = (int)(i % a.stages);
            mbar_wait(&full[st], (int)((i / a.stages) & 1));
            if (kb == 0 && mk && tid == 0) mk[1] = globaltimer();
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[st]);
        }
    }
    for (int kb = 0; kb < KB && !(a.variant & 4); kb += 2, i += 2) {  // KB is even (tiles_refused)
        p2_step_issue<T>(a, i, p0, xs, ws, stage_bytes, full);
        if (kb == 0 && mk && tid == 0) mk[1] = globaltimer();
        p2_step_issue<T>(a, i + 1, p1, xs, ws, stage_bytes, full);
        wgmma_wait<1>();
        p2_step_promote<T>(a, i, acc, p0, glu, sc, empty);
        wgmma_wait<0>();
        p2_step_promote<T>(a, i + 1, acc, p1, glu, sc, empty);
    }
    if (g == 0 || g == 2) {
        p2_epi_add<T>(a, acc, tile * T, g == 0 ? a.sync->ss : a.sync->ss2, rl);
        p2_count(g == 0 ? &a.sync->cnt_o : &a.sync->cnt_d);
        return;
    }
    const int h0 = tile * (T / 2), kb = h0 / FP8_BLOCK_SIZE, per = 2 * FP8_BLOCK_SIZE / T;  // tiles a 128-block of h
    p2_epi_glu<T>(a, acc, h0, rl);
    unsigned old = p2_count(&a.sync->cnt_h[kb]);
    if (tid == 0) {
        if (old == (unsigned)per - 1) fence_acquire();  // the other tiles' h before our reads
        *last_shared = old == (unsigned)per - 1;
    }
    named_bar_sync(1, 128);
    if (!*last_shared) return;  // the same for every thread
    p2_h_block(a, kb);
    p2_set(&a.sync->flag_h[kb]);
}

// ---- the kernel ----
__global__ void __launch_bounds__(P2_THREADS, 1) decode_half2_kernel(const P2Args a, const __grid_constant__ P2Maps maps) {
#ifdef FP8_SM90A
    extern __shared__ uint8_t smem_raw[];
    __shared__ int last_shared;
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    int Tmax = max(max(a.g[0].T, a.g[1].T), a.g[2].T), stage_bytes = P2_TX + Tmax * WG_BK;
    uint8_t *xs = smem, *ws = smem + P2_TX;              // stage st: X at st * stage_bytes, W after it
    float *sc = (float *)(smem + (size_t)a.stages * stage_bytes);  // [stage][P2_SC]
    uint64_t *full = (uint64_t *)(sc + a.stages * P2_SC), *empty = full + a.stages;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (int s = 0; s < a.stages; s++) {
            mbar_init(&full[s], a.variant & 64 ? 1 : 1 + 32);  // the W cursor's expect_tx, the scale lanes' cp.asyncs
            mbar_init(&empty[s], 4);      // the 4 consumer warps
        }
        mbar_fence_init();
    }
    __syncthreads();
    const bool sc_warp = a.variant & 32, sc_tma = a.variant & 64;  // the scales by warp 5, or by TMA
    if (warp == 5) {  // ---- the scales' loader (variant bit 5) ----
        // the X cursor again: once step xi's stage is free (the consumers released its last round, so
        // the full barrier is in the phase this step completes) and X's block is there, the step's scales
        // by cp.async and the lanes' 32 arrivals on the full barrier, which fire when they land
        if (!sc_warp) return;
        P2Walk x;
        x.begin(a);
        __shared__ unsigned seen5[2 * P2_MAXFB / 32];
        for (int k = lane; k < 2 * P2_MAXFB / 32; k += 32) seen5[k] = 0;
        __syncwarp();
        const bool no_x = a.variant & 2, no_sc = a.variant & 8;
        for (long xi = 0; !x.done(); xi++, x.next(a)) {
            int st = (int)(xi % a.stages), par = (int)((xi / a.stages) & 1);
            mbar_wait(&empty[st], par ^ 1);
            while (!p2_x_ready(a, x.g, x.k(), lane, seen5)) __nanosleep(20);
            const P2Gemm &G = a.g[x.g];
            float *s = sc + st * P2_SC;
            for (int r = lane; r < a.M && !no_x && !no_sc; r += 32) cp_async4(s + r, G.sx + (size_t)x.k() * a.M + r);
            if (lane < (x.g == 1 ? 2 : 1) && !no_sc) {
                int row = x.g == 1 ? lane * a.FF + x.tile * (G.T / 2) : x.tile * G.T;
                cp_async4(s + (lane ? P2_SW_UP : 64), G.sw + (size_t)(row / FP8_BLOCK_SIZE) * G.ldsw + x.k());
            }
            cp_async_mbar_arrive(&full[st]);
        }
    } else if (warp == 4) {  // ---- producer ----
        // w issues a step's W as soon as its stage is free; x its X and scales once the step's W is
        // issued and the flag of X's block is set. Lane 0 decides, the warp walks together. With
        // variant bit 5, x issues X alone (warp 5 loads the scales and makes the 32 arrivals); with bit 6,
        // lane 0 loads the scales by TMA too, and w counts their bytes.
        P2Walk w, x;
        w.begin(a);
        x.begin(a);
        long wi = 0, xi = 0;
        __shared__ unsigned seen[2 * P2_MAXFB / 32];
        for (int k = lane; k < 2 * P2_MAXFB / 32; k += 32) seen[k] = 0;
        __syncwarp();
        const bool no_x = a.variant & 2, no_sc = a.variant & 8;
        while (!x.done()) {
            bool progress = false;
            while (xi < wi) {
                if (!p2_x_ready(a, x.g, x.k(), lane, seen)) break;
                int st = (int)(xi % a.stages);
                const P2Gemm &G = a.g[x.g];
                float *s = sc + st * P2_SC;
                const bool cp = !no_sc && !sc_warp && !sc_tma;  // the scales by this warp's cp.asyncs
                for (int r = lane; r < a.M && !no_x && cp; r += 32) cp_async4(s + r, G.sx + (size_t)x.k() * a.M + r);
                for (int h = 0; h < (x.g == 1 ? 2 : 1); h++) {  // W's scale (GU: gate's, then up's)
                    int row = x.g == 1 ? h * a.FF + x.tile * (G.T / 2) : x.tile * G.T;
                    int at = (row / FP8_BLOCK_SIZE) * G.ldsw + x.k();
                    if (cp && lane == h) cp_async4(s + (h ? P2_SW_UP : 64), G.sw + at);
                    if (sc_tma && !no_sc && lane == 0) tma_load_1d(s + (h ? P2_SW_UP : 64), &maps.sw[x.g], &full[st], at);
                }
                if (sc_tma && !no_sc && !no_x && lane == 0) tma_load_1d(s, &maps.sx[x.g], &full[st], x.k() * a.M);
                if (lane == 0 && !no_x) tma_load_2d(xs + (size_t)st * stage_bytes, &maps.x[x.g], &full[st], x.k() * WG_BK, 0);
                if (!sc_warp && !sc_tma) cp_async_mbar_arrive(&full[st]);
                x.next(a);
                xi++;
                progress = true;
            }
            if (!w.done()) {
                int st = (int)(wi % a.stages), par = (int)((wi / a.stages) & 1);
                int free_ = lane == 0 ? mbar_test(&empty[st], par ^ 1) : 0;
                if (__shfl_sync(0xffffffffu, free_, 0)) {
                    if (lane == 0) {
                        const P2Gemm &G = a.g[w.g];
                        uint8_t *dst = ws + (size_t)st * stage_bytes;
                        bool pair = (a.variant & 16) && w.g != 1;
                        int scb = sc_tma && !no_sc ? (no_x ? 0 : 64 * 4) + (w.g == 1 ? 2 : 1) * 16 : 0;  // bit 6's scale boxes
                        mbar_expect_tx(&full[st], (no_x ? 0 : P2_TX) + (pair ? (w.kb % 2 ? 0 : 2) : 1) * G.T * WG_BK + scb);
                        if (pair) {  // timing only: both K steps' W into this stage (stage_bytes hold 2 x 32 rows)
                            if (w.kb % 2 == 0) tma_load_3d(dst, &maps.w2[w.g], &full[st], 0, w.tile * G.T, w.kb);
                        } else if (w.g == 1) {  // gate's rows, then the matching up rows
                            tma_load_2d(dst, &maps.w[1], &full[st], w.k() * WG_BK, w.tile * (G.T / 2));
                            tma_load_2d(dst + (G.T / 2) * WG_BK, &maps.w[1], &full[st], w.k() * WG_BK, a.FF + w.tile * (G.T / 2));
                        } else {
                            tma_load_2d(dst, &maps.w[w.g], &full[st], w.k() * WG_BK, w.tile * G.T);
                        }
                    }
                    w.next(a);
                    wi++;
                    progress = true;
                }
            }
            if (!progress) __nanosleep(20);
        }
    } else {  // ---- consumers ----
        long i = 0;
        int slot = 0;
        for (int t = blockIdx.x; t < p2_total(a); t += gridDim.x, slot++) {  // (warps 0-3)
            int kind, idx;
            p2_task(a, t, kind, idx);
            unsigned long long *mk = a.trace ? a.trace + ((size_t)blockIdx.x * P2_MAXT + slot) * P2_MARKS : NULL;
            if (mk && tid == 0) mk[0] = globaltimer();
            int g = p2_gemm_of(kind);
            if (g >= 0) {
                int T = a.g[g].T;
                if (T == 16) p2_gemm_task<16>(a, g, idx, i, xs, ws, stage_bytes, sc, full, empty, mk, &last_shared);
                else if (T == 32) p2_gemm_task<32>(a, g, idx, i, xs, ws, stage_bytes, sc, full, empty, mk, &last_shared);
                else p2_gemm_task<64>(a, g, idx, i, xs, ws, stage_bytes, sc, full, empty, mk, &last_shared);
            } else if (kind == K_N1) {
                p2_norm_unit(a, idx, &a.sync->cnt_o, a.g[0].tiles, a.sync->ss, a.w_norm, a.lnq, a.lnqs, mk);
                p2_set(&a.sync->flag_n[idx]);
            } else {
                p2_norm_unit(a, idx, &a.sync->cnt_d, a.g[2].tiles, a.sync->ss2, a.w_next, a.nq, a.nqs, mk);
                named_bar_sync(1, 128);
            }
            if (mk && tid == 0) mk[2] = globaltimer();
        }
        // leave; the last block out sets the counters back to 0 (every block has passed its waits)
        named_bar_sync(1, 128);
        if (tid == 0) {
            __threadfence();
            last_shared = atomicAdd(&a.sync->exit, 1u) == gridDim.x - 1;
            if (last_shared) fence_acquire();
        }
        named_bar_sync(1, 128);
        if (last_shared)
            for (int k = tid; k < (int)(sizeof(P2Sync) / 4); k += 128) ((unsigned *)a.sync)[k] = 0;
    }
#endif
}

// ---- --stream-only: W alone through a ring, by producer and box shape ----
// Which part of the ring costs ~0.6 us a K step (dev/notes/decode.md, "Reading the ring")? One launch, one
// block an SM, streams the W of o, gate|up and down (the shape's), each block an equal run of each
// matrix's (row tile, K step group) boxes in turn, through a ring of `ring` bytes; a consumer warp
// releases each stage as it lands (no math, no X, no scales). What varies:
//   the producer  SO_BLOCKING: lane 0 waits for a free stage (try_wait) and issues, as fp8_hopper.cu's
//                 decode kernel and tma_stream.cu do; SO_LOOP_ARRIVE: the persistent kernel's loop (the warp
//                 tests the stage, naps 20 ns while it is taken, lane 0 issues) with its X cursor's 32
//                 cp.async.mbarrier.arrive of the step before issued before each TMA (full barrier 1 + 32);
//                 SO_LOOP: that loop without the arrives; SO_ARRIVE_WARP: SO_LOOP with the 32 arrives made by
//                 another warp (variant bit 5's split); SO_PREFETCH: SO_BLOCKING after prefetch.tensormap
//   the box       rows x 128 B x steps (K steps a box: a 3-D map, K step outermost, as variant bit 4's)
enum { SO_BLOCKING, SO_LOOP_ARRIVE, SO_LOOP, SO_ARRIVE_WARP, SO_PREFETCH, SO_NPROD };
static const char *SO_PROD_NAME[SO_NPROD] = {"lane 0 blocking", "warp loop + its cp.async arrives", "warp loop",
                                             "warp loop, arrives by warp 2", "lane 0 blocking + tensormap prefetch"};
typedef struct {
    CUtensorMap m[3];  // o, gate|up, down: boxes of rows x 128 B (2-D) or rows x 128 B x steps (3-D)
} SOMaps;
typedef struct {
    long nbox[3];      // boxes of each matrix: (N / rows) (K / 128 / steps)
    int KS[3];         // box groups along K a row tile
    int rows, steps, stages, box_bytes, prod;
} SOArgs;

__global__ void __launch_bounds__(96, 1) stream_only_kernel(const SOArgs a, const __grid_constant__ SOMaps maps) {
#ifdef FP8_SM90A
    extern __shared__ uint8_t smem_raw[];
    uint8_t *buf = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    __shared__ uint64_t full[P2_MAXSTAGES], empty[P2_MAXSTAGES];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool arrives = a.prod == SO_LOOP_ARRIVE || a.prod == SO_ARRIVE_WARP;
    long total = 0;  // this block's boxes
    for (int g = 0; g < 3; g++) total += a.nbox[g] * (blockIdx.x + 1) / gridDim.x - a.nbox[g] * blockIdx.x / gridDim.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < a.stages; s++) {
            mbar_init(&full[s], arrives ? 1 + 32 : 1);
            mbar_init(&empty[s], 1);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (warp == 1) {  // consumer: release each stage as it lands
        for (long i = 0; i < total; i++) {
            mbar_wait(&full[i % a.stages], (int)((i / a.stages) & 1));
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[i % a.stages]);
        }
        return;
    }
    if (warp == 2) {  // SO_ARRIVE_WARP: the 32 arrives of each stage, once it is free
        if (a.prod == SO_ARRIVE_WARP)
            for (long i = 0; i < total; i++) {
                mbar_wait(&empty[i % a.stages], (int)((i / a.stages) & 1) ^ 1);
                cp_async_mbar_arrive(&full[i % a.stages]);
            }
        return;
    }
    const bool loop = a.prod == SO_LOOP_ARRIVE || a.prod == SO_LOOP || a.prod == SO_ARRIVE_WARP;
    if (!loop && lane != 0) return;
    if (a.prod == SO_PREFETCH)
        for (int g = 0; g < 3; g++) asm volatile("prefetch.tensormap [%0];" ::"l"(&maps.m[g]) : "memory");
    long i = 0;
    for (int g = 0; g < 3; g++)
        for (long u = a.nbox[g] * blockIdx.x / gridDim.x; u < a.nbox[g] * (blockIdx.x + 1) / gridDim.x; u++, i++) {
            int st = (int)(i % a.stages), par = (int)((i / a.stages) & 1);
            if (loop) {
                if (a.prod == SO_LOOP_ARRIVE && i > 0) cp_async_mbar_arrive(&full[(i - 1) % a.stages]);
                while (!__shfl_sync(0xffffffffu, lane == 0 ? mbar_test(&empty[st], par ^ 1) : 0, 0)) __nanosleep(20);
            } else {
                mbar_wait(&empty[st], par ^ 1);
            }
            if (lane == 0) {
                uint8_t *dst = buf + (size_t)st * a.box_bytes;
                int tile = (int)(u / a.KS[g]), k = (int)(u % a.KS[g]) * a.steps;
                mbar_expect_tx(&full[st], a.box_bytes);
                if (a.steps == 1) tma_load_2d(dst, &maps.m[g], &full[st], k * WG_BK, tile * a.rows);
                else tma_load_3d(dst, &maps.m[g], &full[st], 0, tile * a.rows, k);
            }
        }
    if (a.prod == SO_LOOP_ARRIVE && i > 0) cp_async_mbar_arrive(&full[(i - 1) % a.stages]);
#endif
}

// ----------------------------------------------------------------------------
// host

typedef struct {
    int C, FF, A;   // hidden, intermediate, attention width (NH HD: o's K)
    const char *name;
} Shape;

typedef struct {        // one layer's half: weights (device)
    FP8Tensor wo, wgu, wd;
    bf16 *w_norm, *w_next;
} Layer;

typedef struct {        // the activations a path reads and writes (device)
    FP8Tensor aq, lnq, hq, nq;
    bf16 *x, *ln, *tmp, *gu, *h;
    float *rstd;
} Acts;

typedef struct {        // the tile widths of o, gate|up (gate and up columns together), down; P2Args.variant; the
    int o, gu, d, variant, stages;  // ring's stages (0: as many as fit)
} Tiles;
static const char *variant_name(int v) {
    static char b[4][128];
    static int k;
    char *n = b[k++ & 3];
    snprintf(n, 128, "%s%s%s%s%s%s%s", v & 1 ? ", rotated K starts" : "", v & 2 ? ", no X" : "", v & 4 ? ", no math" : "",
             v & 8 ? ", no scales" : "", v & 16 ? ", o/down W in 2-step boxes" : "",
             v & 32 ? ", scales by warp 5" : v & 64 ? ", scales by TMA" : "", v & 30 ? " (timing only)" : "");
    return n;
}

static void acts_alloc(Acts *t, const Shape *s, int M) {
    t->aq = fp8_dev_alloc(M, s->A, FP8_BLOCK, 1);
    t->lnq = fp8_dev_alloc(M, s->C, FP8_BLOCK, 1);
    t->hq = fp8_dev_alloc(M, s->FF, FP8_BLOCK, 1);
    t->nq = fp8_dev_alloc(M, s->C, FP8_BLOCK, 1);
    cudaCheck(cudaMalloc(&t->x, (size_t)M * s->C * 2));
    cudaCheck(cudaMalloc(&t->ln, (size_t)M * s->C * 2));
    cudaCheck(cudaMalloc(&t->tmp, (size_t)M * s->C * 2));
    cudaCheck(cudaMalloc(&t->gu, (size_t)M * 2 * s->FF * 2));
    cudaCheck(cudaMalloc(&t->h, (size_t)M * s->FF * 2));
    cudaCheck(cudaMalloc(&t->rstd, (size_t)M * 4));
}
static void acts_free(Acts *t) {
    fp8_dev_free(&t->aq); fp8_dev_free(&t->lnq); fp8_dev_free(&t->hq); fp8_dev_free(&t->nq);
    cudaFree(t->x); cudaFree(t->ln); cudaFree(t->tmp); cudaFree(t->gu); cudaFree(t->h); cudaFree(t->rstd);
}

static FP8Tensor weight_make(int N, int K, uint64_t seed, float gain) {
    bf16 *b;
    cudaCheck(cudaMalloc(&b, (size_t)N * K * 2));
    fill_normal_bf16(b, (size_t)N * K, seed);
    // N(0, 1) * gain: a weight of the scale a real layer has (1 / sqrt(K)), so activations stay O(1)
    std::vector<bf16> h((size_t)N * K);
    cudaCheck(cudaMemcpy(h.data(), b, h.size() * 2, cudaMemcpyDeviceToHost));
    for (auto &v : h) v = __float2bfloat16(__bfloat162float(v) * gain);
    cudaCheck(cudaMemcpy(b, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    FP8Tensor w = fp8_dev_alloc(N, K, FP8_BLOCK, FP8_BLOCK_SIZE);
    fp8_quantize_cuda(&w, b, DT_BF16, 0);
    cudaCheck(cudaDeviceSynchronize());
    cudaFree(b);
    return w;
}

static void layer_make(Layer *L, const Shape *s, uint64_t seed) {
    L->wo = weight_make(s->C, s->A, seed * 8 + 1, 1.0f / sqrtf((float)s->A));
    L->wgu = weight_make(2 * s->FF, s->C, seed * 8 + 2, 1.0f / sqrtf((float)s->C));
    L->wd = weight_make(s->C, s->FF, seed * 8 + 3, 1.0f / sqrtf((float)s->FF));
    std::vector<bf16> h(s->C);
    cudaCheck(cudaMalloc(&L->w_norm, s->C * 2));
    cudaCheck(cudaMalloc(&L->w_next, s->C * 2));
    for (int i = 0; i < s->C; i++) h[i] = __float2bfloat16(1.0f + 0.1f * sinf(0.37f * i + seed));
    cudaCheck(cudaMemcpy(L->w_norm, h.data(), s->C * 2, cudaMemcpyHostToDevice));
    for (int i = 0; i < s->C; i++) h[i] = __float2bfloat16(1.0f + 0.1f * cosf(0.23f * i + seed));
    cudaCheck(cudaMemcpy(L->w_next, h.data(), s->C * 2, cudaMemcpyHostToDevice));
}
static void layer_free(Layer *L) {
    fp8_dev_free(&L->wo); fp8_dev_free(&L->wgu); fp8_dev_free(&L->wd);
    cudaFree(L->w_norm); cudaFree(L->w_next);
}

// the per-op path, as model.c's decode step runs this half
static void per_op(Acts *t, const Layer *L, const Shape *s, int M) {
    fp8_gemm_cuda(t->tmp, DT_BF16, &t->aq, &L->wo, 0);
    cu_add_rmsnorm(t->x, t->ln, t->rstd, t->tmp, L->w_norm, M, s->C, 1e-6f, 0, &t->lnq);
    fp8_gemm_cuda(t->gu, DT_BF16, &t->lnq, &L->wgu, 0);
    cu_glu_gu(t->h, &t->hq, t->gu, M, s->FF, 0);
    fp8_gemm_cuda(t->tmp, DT_BF16, &t->hq, &L->wd, 0);
    cu_add_rmsnorm(t->x, t->ln, t->rstd, t->tmp, L->w_next, M, s->C, 1e-6f, 0, &t->nq);
}

typedef struct {
    P2Args a;
    P2Maps maps;
    int blocks;
} P2Plan;

// W (N, K) seen as (K / 128 steps, N rows, 128 B), boxes of `steps` K steps of `rows` rows, each step's
// rows x 128 B after the other in shared memory, in the 128-byte swizzle (timing variant bit 4)
static CUresult tma_map_steps_try(CUtensorMap *m, const void *base, int N, int K, int rows, int steps) {
    cuuint64_t dim[3] = {128, (cuuint64_t)N, (cuuint64_t)K / 128}, stride[2] = {(cuuint64_t)K, 128};
    cuuint32_t box[3] = {128, (cuuint32_t)rows, (cuuint32_t)steps}, estride[3] = {1, 1, 1};
    return tma_encoder()(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, (void *)base, dim, stride, box, estride,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
static CUtensorMap tma_map_steps(const void *base, int N, int K, int rows, int steps) {
    CUtensorMap m;
    CUresult r = tma_map_steps_try(&m, base, N, K, rows, steps);
    if (r != CUDA_SUCCESS) die("cuTensorMapEncodeTiled (3-D, K steps outermost) failed (CUresult %d)", (int)r);
    return m;
}

// n floats as a 1-D tensor read by TMA in boxes of `box` from any start, zeros past the end (variant bit 6)
static CUtensorMap tma_map_1d_f32(const float *base, size_t n, int box) {
    CUtensorMap m;
    cuuint64_t dim[1] = {(cuuint64_t)n}, stride[1] = {0};  // rank 1: no stride is read
    cuuint32_t bx[1] = {(cuuint32_t)box}, estride[1] = {1};
    CUresult r = tma_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, (void *)base, dim, stride, bx, estride,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) die("cuTensorMapEncodeTiled (1-D, %zu floats in boxes of %d) failed (CUresult %d)", n, box, (int)r);
    return m;
}

// the ring's stages for the widest tile: X, W and the scales of each, the barriers
static int p2_stages(int Tmax) {
    int per = P2_TX + Tmax * WG_BK + P2_SC * 4 + 16;
    return std::min(P2_MAXSTAGES, (P2_SMEM - 1024) / per);
}

// NULL, or why the tile widths cannot run this shape (checked before any launch)
static const char *tiles_refused(const Shape *s, Tiles T, int sms) {
    static char why[160];
    const int ok[3] = {16, 32, 64};
    int w[3] = {T.o, T.gu, T.d};
    for (int g = 0; g < 3; g++)
        if (std::find(ok, ok + 3, w[g]) == ok + 3) return "a tile width is not 16, 32 or 64";
    if (T.stages < 0 || T.stages == 1) return "the ring needs at least 2 stages";
    if (T.variant < 0 || T.variant > 127) return "the variant is 0..127 (P2Args.variant)";
    if ((T.variant & 96) == 96) return "variant bits 5 and 6 are two ways to load the scales: set one at most";
    if (T.variant & 16 && ((T.variant & 14) != 14 || T.o != 32 || T.d != 32 || T.gu != 64))
        return "variant bit 4 is for timing W alone (with bits 1-3) at tiles 32,64,32";
    if (T.gu < 32) return "the gate|up tile needs at least 16 gate and 16 up rows (--tiles o,gu,d with gu >= 32)";
    if (s->C % 256 || s->FF % 256 || s->A % 256 || s->C / 128 > P2_MAXCB || s->FF / 128 > P2_MAXFB)
        return "a dimension is not a multiple of 256 (an even number of K steps) or is too wide";
    int total = s->C / T.o + s->C / 128 + s->FF / (T.gu / 2) + s->C / T.d + s->C / 128;
    if ((total + sms - 1) / sms > P2_MAXT) {
        snprintf(why, sizeof why, "%d tasks on %d blocks is more than %d a block: choose wider tiles", total, sms, P2_MAXT);
        return why;
    }
    return NULL;
}

static void plan_make(P2Plan *p, Acts *t, const Layer *L, const Shape *s, int M, P2Sync *sync, int sms, Tiles T) {
    P2Args &a = p->a;
    memset(&a, 0, sizeof a);
    a.M = M; a.C = s->C; a.FF = s->FF; a.eps = 1e-6f;
    const FP8Tensor *W[3] = {&L->wo, &L->wgu, &L->wd}, *X[3] = {&t->aq, &t->lnq, &t->hq};
    const int width[3] = {T.o, T.gu, T.d};
    for (int g = 0; g < 3; g++) {
        P2Gemm &G = a.g[g];
        G.N = W[g]->rows; G.K = W[g]->cols; G.T = width[g];
        G.tiles = G.N / G.T;  // GU: (2 FF) / T tiles of T / 2 gate and T / 2 up rows
        G.sw = W[g]->scale; G.ldsw = fp8_scale_ld(FP8_BLOCK, W[g]->rows, W[g]->cols, FP8_BLOCK_SIZE);
        G.sx = X[g]->scale;
        p->maps.x[g] = tma_map_2d(X[g]->data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, M, G.K, 64, WG_BK);
        p->maps.w[g] = tma_map_2d(W[g]->data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, G.N, G.K, g == 1 ? G.T / 2 : G.T, WG_BK);
        p->maps.w2[g] = p->maps.w[g];
        p->maps.sx[g] = tma_map_1d_f32(X[g]->scale, fp8_num_scales(X[g]->gran, X[g]->rows, X[g]->cols, X[g]->block_rows), 64);
        p->maps.sw[g] = tma_map_1d_f32(W[g]->scale, fp8_num_scales(W[g]->gran, W[g]->rows, W[g]->cols, W[g]->block_rows), 4);
        if (T.variant & 16 && g != 1) p->maps.w2[g] = tma_map_steps(W[g]->data, G.N, G.K, G.T, 2);
    }
    a.count[K_O] = a.g[0].tiles; a.count[K_N1] = s->C / 128; a.count[K_GU] = a.g[1].tiles;
    a.count[K_D] = a.g[2].tiles; a.count[K_N5] = s->C / 128;
    for (int k = 1; k < K_N; k++) a.first[k] = a.first[k - 1] + a.count[k - 1];
    a.stages = p2_stages(std::max(std::max(T.o, T.gu), T.d));
    if (T.stages) a.stages = std::min(a.stages, T.stages);
    a.x = t->x; a.ln = t->ln; a.h = t->h; a.rstd = t->rstd;
    a.w_norm = L->w_norm; a.w_next = L->w_next;
    a.lnq = t->lnq.data; a.lnqs = t->lnq.scale;
    a.hq = t->hq.data; a.hqs = t->hq.scale;
    a.nq = t->nq.data; a.nqs = t->nq.scale;
    a.sync = sync;
    a.variant = T.variant;
    p->blocks = sms;
}

// One block per SM, all resident at once: blocks wait for each other (main checks that a block fits on
// every SM; a graph runs the kernel after the one before it has left its SMs), as the first version.
static void p2_launch(const P2Plan *p) {
    decode_half2_kernel<<<p->blocks, P2_THREADS, P2_SMEM, cu_stream()>>>(p->a, p->maps);
    launchCheck();
}

// sign bits cleared: |codes| (E4M3's bit 7 is the sign)
__global__ void abs_codes(uint8_t *q, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) q[i] &= 0x7F;
}
static FP8Tensor abs_copy(const FP8Tensor *t) {
    FP8Tensor c = fp8_dev_alloc(t->rows, t->cols, t->gran, t->block_rows);
    size_t n = (size_t)t->rows * t->cols;
    cudaCheck(cudaMemcpy(c.data, t->data, n, cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(c.scale, t->scale, fp8_num_scales(t->gran, t->rows, t->cols, t->block_rows) * 4, cudaMemcpyDeviceToDevice));
    abs_codes<<<256, 256>>>(c.data, n);
    launchCheck();
    return c;
}
static std::vector<float> bf16_host(const bf16 *d, size_t n) {
    std::vector<bf16> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
    return f;
}
static std::vector<float> f32_host(const float *d, size_t n) {
    std::vector<float> f(n);
    cudaCheck(cudaMemcpy(f.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return f;
}
// the fraction of codes that agree
static double codes_agree(const FP8Tensor *a, const FP8Tensor *b) {
    size_t n = (size_t)a->rows * a->cols;
    std::vector<uint8_t> x(n), y(n);
    cudaCheck(cudaMemcpy(x.data(), a->data, n, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(y.data(), b->data, n, cudaMemcpyDeviceToHost));
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += x[i] == y[i];
    return (double)same / n;
}

// One case: the persistent kernel against the per-op path on the same inputs, launched `launches`
// times on copies of the same inputs (the counters must come back to 0 after each). x after the half
// layer must agree within what the two paths' FP8 products may differ by: each is within 2^-8 sum |x w|
// of the exact product (the tensor cores' sums inside a K step, test/gpu_fp8.cu), so the two within
// twice that, for o and for down; plus a bf16 rounding of x each (2^-8 |x|). The FP8 copies agree
// where no rounding fell on the other side between the paths (reported; at least 99% of codes).
static int check_case(const Shape *s, int M, int sms, P2Sync *sync, Tiles T, int launches) {
    Layer L;
    layer_make(&L, s, 7);
    Acts r, p;
    acts_alloc(&r, s, M);
    acts_alloc(&p, s, M);
    bf16 *ab, *x0d;
    cudaCheck(cudaMalloc(&ab, (size_t)M * s->A * 2));
    cudaCheck(cudaMalloc(&x0d, (size_t)M * s->C * 2));
    fill_normal_bf16(ab, (size_t)M * s->A, 11);
    fp8_quantize_cuda(&r.aq, ab, DT_BF16, 0);
    fp8_quantize_cuda(&p.aq, ab, DT_BF16, 0);
    fill_normal_bf16(x0d, (size_t)M * s->C, 12);
    cudaCheck(cudaDeviceSynchronize());  // the inputs made on the default stream, before the backend's stream reads them
    cudaCheck(cudaMemcpy(r.x, x0d, (size_t)M * s->C * 2, cudaMemcpyDeviceToDevice));
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> x0 = bf16_host(r.x, (size_t)M * s->C);
    per_op(&r, &L, s, M);
    P2Plan plan;
    plan_make(&plan, &p, &L, s, M, sync, sms, T);
    for (int k = 0; k < launches; k++) {
        // on the kernel's stream: a device-to-device cudaMemcpy may return before it is done, and the
        // backend's stream does not wait for the default one
        cudaCheck(cudaMemcpyAsync(p.x, x0d, (size_t)M * s->C * 2, cudaMemcpyDeviceToDevice, cu_stream()));
        p2_launch(&plan);
    }
    cudaCheck(cudaDeviceSynchronize());
    P2Sync z, zero;
    memset(&zero, 0, sizeof zero);
    cudaCheck(cudaMemcpy(&z, sync, sizeof z, cudaMemcpyDeviceToHost));
    int reset = !memcmp(&z, &zero, sizeof z);
    // the tolerance's scale: sum |x w| of o and of down, from |codes| through the same GEMM
    FP8Tensor aa = abs_copy(&r.aq), awo = abs_copy(&L.wo), ah = abs_copy(&r.hq), awd = abs_copy(&L.wd);
    float *so, *sd;
    cudaCheck(cudaMalloc(&so, (size_t)M * s->C * 4));
    cudaCheck(cudaMalloc(&sd, (size_t)M * s->C * 4));
    fp8_gemm_cuda(so, DT_F32, &aa, &awo, 0);
    fp8_gemm_cuda(sd, DT_F32, &ah, &awd, 0);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> xr = bf16_host(r.x, (size_t)M * s->C), xp = bf16_host(p.x, (size_t)M * s->C);
    std::vector<float> So = f32_host(so, (size_t)M * s->C), Sd = f32_host(sd, (size_t)M * s->C);
    double worst = 0, l2d = 0, l2r = 0;
    size_t same = 0, bad = 0;
    for (size_t i = 0; i < xr.size(); i++) {
        double d = fabs((double)xr[i] - xp[i]);
        double tol = 2 * 0x1p-8 * (So[i] + Sd[i]) + 0x1p-8 * fabs(xr[i]) + 0x1p-8 * fabs(x0[i]);
        double q = d / tol;
        if (!(q <= 1.0) && bad++ < 5)
            fprintf(stderr, "  x[%zu] (row %zu): per-op %g persistent %g, tolerance %g\n", i, i / s->C, xr[i], xp[i], tol);
        if (!(q <= worst)) worst = q;
        same += xr[i] == xp[i];
        l2d += d * d;
        l2r += (double)xr[i] * xr[i];
    }
    double alnq = codes_agree(&r.lnq, &p.lnq), ahq = codes_agree(&r.hq, &p.hq), anq = codes_agree(&r.nq, &p.nq);
    int ok = worst <= 1.0 && alnq >= 0.99 && ahq >= 0.99 && anq >= 0.99 && reset;
    printf("check %s M=%d tiles o %d, gate|up %d, down %d%s (%d stages), %d launch%s: x worst error / tolerance %.3f, "
           "bit-equal %.4f, rel L2 %.2e; FP8 codes equal: lnq %.4f, hq %.4f, nq %.4f; counters back to 0: %s: %s\n",
           s->name, M, T.o, T.gu, T.d, variant_name(T.variant), plan.a.stages, launches, launches > 1 ? "es" : "", worst, (double)same / xr.size(),
           sqrt(l2d / l2r), alnq, ahq, anq, reset ? "yes" : "NO", ok ? "ok" : "FAILED");
    fp8_dev_free(&aa); fp8_dev_free(&awo); fp8_dev_free(&ah); fp8_dev_free(&awd);
    cudaFree(so); cudaFree(sd); cudaFree(ab); cudaFree(x0d);
    acts_free(&r); acts_free(&p); layer_free(&L);
    return ok;
}

// where one launch's time goes: every task's marks, per kind (us since the first task began)
static void trace_print(const P2Plan *last, const std::vector<unsigned long long> &h) {
    const P2Args &a = last->a;
    unsigned long long t0 = ~0ull, tend = 0;
    for (int b = 0; b < last->blocks; b++)
        for (int j = 0; j < P2_MAXT; j++) {
            const unsigned long long *m = &h[((size_t)b * P2_MAXT + j) * P2_MARKS];
            if (m[0]) { t0 = std::min(t0, m[0]); tend = std::max(tend, m[2]); }
        }
    printf("  %-8s %5s %8s %8s %8s %8s %8s %8s\n", "task", "count", "1st beg", "last beg", "wait", "work", "max work", "last end");
    for (int k = 0; k < K_N; k++) {
        double b0 = 1e30, b1 = 0, e1 = 0, wsum = 0, ksum = 0, kmax = 0;
        int n = 0;
        for (int t = a.first[k]; t < a.first[k] + a.count[k]; t++) {
            int b = t % last->blocks, j = t / last->blocks;
            const unsigned long long *m = &h[((size_t)b * P2_MAXT + j) * P2_MARKS];
            double beg = (m[0] - t0) * 1e-3, rdy = (m[1] - t0) * 1e-3, end = (m[2] - t0) * 1e-3;
            b0 = std::min(b0, beg); b1 = std::max(b1, beg); e1 = std::max(e1, end);
            wsum += rdy - beg; ksum += end - rdy; kmax = std::max(kmax, end - rdy);
            n++;
        }
        printf("  %-8s %5d %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", KIND_NAME[k], n, b0, b1, wsum / n, ksum / n, kmax, e1);
    }
    printf("  the launch: %.2f us from the first task's begin to the last task's end\n", (tend - t0) * 1e-3);
}

// Timing: `layers` distinct layers (weights rotated over more than the 50 MB L2), each path recorded as
// one CUDA graph over all of them and replayed, as the decode step is; the paths in turn.
static void bench(const Shape *s, int M, int sms, P2Sync *sync, int layers, const std::vector<Tiles> &tiles, double bw) {
    std::vector<Layer> L(layers);
    for (int l = 0; l < layers; l++) layer_make(&L[l], s, 100 + l);
    Acts t;
    acts_alloc(&t, s, M);
    bf16 *ab;
    cudaCheck(cudaMalloc(&ab, (size_t)M * s->A * 2));
    fill_normal_bf16(ab, (size_t)M * s->A, 21);
    fp8_quantize_cuda(&t.aq, ab, DT_BF16, 0);
    fill_normal_bf16(t.x, (size_t)M * s->C, 22);
    cudaCheck(cudaDeviceSynchronize());
    const int NV = (int)tiles.size();
    std::vector<std::vector<P2Plan>> plans(NV, std::vector<P2Plan>(layers));
    for (int v = 0; v < NV; v++)
        for (int l = 0; l < layers; l++) plan_make(&plans[v][l], &t, &L[l], s, M, sync, sms, tiles[v]);
    std::vector<cudaGraphExec_t> ge(1 + NV);
    for (int path = 0; path <= NV; path++) {
        cudaGraph_t g;
        cudaCheck(cudaStreamBeginCapture(cu_stream(), cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < layers; l++) {
            if (path == 0) per_op(&t, &L[l], s, M);
            else p2_launch(&plans[path - 1][l]);
        }
        cudaCheck(cudaStreamEndCapture(cu_stream(), &g));
        cudaCheck(cudaGraphInstantiate(&ge[path], g, 0));
        cudaGraphDestroy(g);
    }
    std::vector<double> ms(1 + NV);
    // launched on the legacy default stream, where time_interleaved records its events (the capture
    // needed the backend's own stream)
    time_interleaved([&](int k, int) { cudaCheck(cudaGraphLaunch(ge[k], 0)); }, 1 + NV, 1, 1, ms.data());
    double bytes = (double)s->C * s->A + 2.0 * s->FF * s->C + (double)s->C * s->FF;  // FP8 weights of the half layer
    double floor_us = bytes / bw * 1e6;
    printf("bench %s M=%d, %d layers: per-op %.2f us a half layer (%.2f TB/s); floor (the weights at %.2f TB/s) %.2f us, "
           "per-op %.2fx the floor\n", s->name, M, layers, ms[0] * 1e3 / layers, bytes * layers / (ms[0] * 1e-3) / 1e12,
           bw / 1e12, floor_us, ms[0] * 1e3 / layers / floor_us);
    for (int v = 0; v < NV; v++)
        printf("  persistent, tiles o %d, gate|up %d, down %d%s (%d stages): %.2f us (%.2f TB/s), %.2fx per-op's speed, "
               "%.2fx the floor\n", tiles[v].o, tiles[v].gu, tiles[v].d, variant_name(tiles[v].variant), plans[v][0].a.stages, ms[1 + v] * 1e3 / layers,
               bytes * layers / (ms[1 + v] * 1e-3) / 1e12, ms[0] / ms[1 + v], ms[1 + v] * 1e3 / layers / floor_us);
    // the marks of one launch of each: the last layer's, after the others (its weights not in L2)
    unsigned long long *tr;
    size_t nmarks = (size_t)sms * P2_MAXT * P2_MARKS;
    cudaCheck(cudaMalloc(&tr, nmarks * 8));
    for (int v = 0; v < NV; v++) {
        cudaCheck(cudaMemset(tr, 0, nmarks * 8));
        P2Plan last = plans[v][layers - 1];
        last.a.trace = tr;
        for (int l = 0; l + 1 < layers; l++) p2_launch(&plans[v][l]);
        p2_launch(&last);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<unsigned long long> h(nmarks);
        cudaCheck(cudaMemcpy(h.data(), tr, nmarks * 8, cudaMemcpyDeviceToHost));
        printf("  one launch (%s M=%d, tiles o %d, gate|up %d, down %d%s), us: wait = begin to data there (GEMM: its first "
               "stage full; norm: the counter), work = data there to end\n", s->name, M, tiles[v].o, tiles[v].gu, tiles[v].d,
               variant_name(tiles[v].variant));
        trace_print(&last, h);
    }
    cudaFree(tr);
    for (auto &g : ge) cudaGraphExecDestroy(g);
    acts_free(&t);
    cudaFree(ab);
    for (auto &l : L) layer_free(&l);
}

// --stream-only: every producer at every box shape, two ring sizes (the persistent kernel's 13 stages of
// 4 KB of W, and 192 KB), the half layer's W in one launch each, copies rotated past the L2
static void stream_only(const Shape *s, int sms, double bw) {
    const int N[3] = {s->C, 2 * s->FF, s->C}, K[3] = {s->A, s->C, s->FF};
    double bytes = 0;
    for (int g = 0; g < 3; g++) bytes += (double)N[g] * K[g];
    int copies = std::max(2, (int)ceil(3 * 50e6 / bytes));
    std::vector<uint8_t *> w(3 * copies);
    for (int c = 0; c < copies; c++)
        for (int g = 0; g < 3; g++) {
            cudaCheck(cudaMalloc(&w[3 * c + g], (size_t)N[g] * K[g]));
            cudaCheck(cudaMemset(w[3 * c + g], 0x11, (size_t)N[g] * K[g]));
        }
    CUtensorMap probe;
    const bool box3 = tma_map_steps_try(&probe, w[0], N[0], K[0], 32, 2) == CUDA_SUCCESS;
    if (!box3) printf("the 3-D map (K steps a box) is refused: boxes of 1 K step only\n");
    const int box[6][2] = {{32, 1}, {32, 2}, {32, 4}, {64, 1}, {64, 2}, {128, 1}}, ring[2] = {13 * 32 * WG_BK, 192 * 1024};
    std::vector<SOArgs> args;
    std::vector<SOMaps> maps;  // [config][copy]
    for (int r = 0; r < 2; r++)
        for (int b = 0; b < 6; b++)
            for (int p = 0; p < SO_NPROD; p++) {
                SOArgs A;
                memset(&A, 0, sizeof A);
                A.rows = box[b][0]; A.steps = box[b][1]; A.prod = p;
                if (A.steps > 1 && !box3) continue;
                if (p == SO_PREFETCH && b != 0) continue;  // the descriptor question: the persistent kernel's box only
                A.box_bytes = A.rows * WG_BK * A.steps;
                A.stages = std::min(P2_MAXSTAGES, ring[r] / A.box_bytes);
                for (int g = 0; g < 3; g++) {
                    A.KS[g] = K[g] / WG_BK / A.steps;
                    A.nbox[g] = (long)(N[g] / A.rows) * A.KS[g];
                }
                args.push_back(A);
                for (int c = 0; c < copies; c++) {
                    SOMaps m;
                    for (int g = 0; g < 3; g++)
                        m.m[g] = A.steps == 1 ? tma_map_2d(w[3 * c + g], CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, N[g], K[g], A.rows, WG_BK)
                                              : tma_map_steps(w[3 * c + g], N[g], K[g], A.rows, A.steps);
                    maps.push_back(m);
                }
            }
    const int smem = 192 * 1024 + 1024, n = (int)args.size();
    cudaCheck(cudaFuncSetAttribute(stream_only_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    std::vector<double> ms(n);
    time_interleaved([&](int k, int c) {
        stream_only_kernel<<<sms, 96, smem>>>(args[k], maps[(size_t)k * copies + c]);
        launchCheck();
    }, n, copies, 1, ms.data());
    printf("stream only %s: o, gate|up, down's W (%.1f MB) a launch, %d blocks, %d copies rotated; floor %.2f us at %.2f TB/s\n",
           s->name, bytes / 1e6, sms, copies, bytes / bw * 1e6, bw / 1e12);
    printf("| producer | box rows x K steps (KB) | stages (KB in flight) | us | TB/s | boxes/us an SM |\n| --- | --- | --- | --- | --- | --- |\n");
    for (int k = 0; k < n; k++) {
        const SOArgs &A = args[k];
        double us = ms[k] * 1e3, nb = (double)(A.nbox[0] + A.nbox[1] + A.nbox[2]);
        printf("| %s | %d x %d (%d) | %d (%d) | %.1f | %.2f | %.2f |\n", SO_PROD_NAME[A.prod], A.rows, A.steps, A.box_bytes / 1024,
               A.stages, A.stages * A.box_bytes / 1024, us, bytes / (us * 1e-6) / 1e12, nb / sms / us);
    }
    for (uint8_t *p : w) cudaFree(p);
}

static int parse_tiles(const char *s, Tiles *t) {
    t->variant = t->stages = 0;
    int n = sscanf(s, "%d,%d,%d,%d,%d", &t->o, &t->gu, &t->d, &t->variant, &t->stages);
    return n >= 3;
}

int main(int argc, char **argv) {
    const Shape shapes[2] = {{1024, 3072, 2048, "0.6b"}, {4096, 12288, 4096, "8b"}};
    const char *only = NULL;
    int rows = 0, stream_mode = 0;
    std::vector<Tiles> tiles;
    for (int i = 1; i < argc; i++) {
        Tiles t;
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--stream-only")) stream_mode = 1;
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tiles") && i + 1 < argc && parse_tiles(argv[i + 1], &t)) { tiles.push_back(t); i++; }
        else {
            fprintf(stderr, "usage: %s [--shape 0.6b|8b] [--rows M (1..64)] [--tiles o,gu,d[,variant[,stages]]]... [--stream-only] "
                    "(widths 16, 32, 64; variant: P2Args.variant; stages: at most that many; the first --tiles is checked at M = 1, 7 and 64, the others at 64 unless "
                    "timing only, every one timed; --stream-only: only the W stream by producer and box shape, no kernel of the half layer)\n", argv[0]);
            return 2;
        }
    }
    if (only && strcmp(only, "0.6b") && strcmp(only, "8b")) { fprintf(stderr, "decode_persistent2: --shape is 0.6b or 8b\n"); return 2; }
    if (rows < 0 || rows > 64) { fprintf(stderr, "decode_persistent2: --rows is 1..64 (one X box of 64 rows)\n"); return 2; }
    if (!tiles.empty() && tiles[0].variant & 30) {
        fprintf(stderr, "decode_persistent2: the first --tiles is checked, so it cannot be a timing-only variant (bits 1-3): put it later\n");
        return 2;
    }
    if (tiles.empty()) tiles = {{32, 64, 32, 0}, {32, 64, 32, 1}, {32, 64, 32, 2}, {64, 64, 64, 1}, {16, 64, 16, 1}};
    setvbuf(stdout, NULL, _IOLBF, 0);  // each line as it comes, also when a hang is killed
    char why[256];
    if (!backend_cuda(why, sizeof why)) { fprintf(stderr, "decode_persistent2: no CUDA backend: %s\n", why); return 1; }
    if (!hopper_ready(why, sizeof why)) { fprintf(stderr, "decode_persistent2: %s\n", why); return 1; }
    int sms;
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int k = 0; k < 2; k++)
        for (const Tiles &t : tiles)
            if (const char *no = tiles_refused(&shapes[k], t, sms)) {
                if (only && strcmp(only, shapes[k].name)) continue;
                fprintf(stderr, "decode_persistent2: --tiles %d,%d,%d at %s: %s\n", t.o, t.gu, t.d, shapes[k].name, no);
                return 2;
            }
    cudaCheck(cudaFuncSetAttribute(decode_half2_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, P2_SMEM));
    int per_sm = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_half2_kernel, P2_THREADS, P2_SMEM));
    if (per_sm < 1) { fprintf(stderr, "decode_persistent2: the kernel does not fit on an SM\n"); return 1; }
    cudaDeviceProp prop = gpu_props();
    double bw = strstr(prop.name, "H200") ? 4.8e12 : 3.35e12;  // HBM bandwidth: the floor's
    printf("%s, %d SMs\n", prop.name, sms);
    if (stream_mode) {
        for (int k = 0; k < 2; k++)
            if (!only || !strcmp(only, shapes[k].name)) stream_only(&shapes[k], sms, bw);
        return 0;
    }
    {  // the driver may refuse the 3-D map of variant bit 4 (a stride smaller than the one before): then not timed
        void *probe;
        CUtensorMap m;
        cudaCheck(cudaMalloc(&probe, 4096 * 4096));
        CUresult r = tma_map_steps_try(&m, probe, 4096, 4096, 32, 2);
        cudaFree(probe);
        if (r != CUDA_SUCCESS) {
            printf("the 3-D map of variant bit 4 is refused (CUresult %d): those --tiles are not timed\n", (int)r);
            tiles.erase(std::remove_if(tiles.begin(), tiles.end(), [](const Tiles &t) { return t.variant & 16; }), tiles.end());
        }
    }
    P2Sync *sync;
    cudaCheck(cudaMalloc(&sync, sizeof(P2Sync)));
    cudaCheck(cudaMemset(sync, 0, sizeof(P2Sync)));
    int fails = 0;
    for (int k = 0; k < 2; k++) {
        const Shape *s = &shapes[k];
        if (only && strcmp(only, s->name)) continue;
        const int Ms[3] = {1, 7, 64};
        for (int j = 0; j < 3; j++)
            if (!rows || rows == Ms[j]) fails += !check_case(s, Ms[j], sms, sync, tiles[0], j == 2 ? 3 : 1);
        if (rows && rows != 1 && rows != 7 && rows != 64) fails += !check_case(s, rows, sms, sync, tiles[0], 1);
        for (size_t v = 1; v < tiles.size(); v++)
            if (!(tiles[v].variant & 30)) fails += !check_case(s, rows ? rows : 64, sms, sync, tiles[v], 1);
        double half_bytes = (double)s->C * s->A + 3.0 * s->FF * s->C;
        int layers = (int)ceil(3 * 50e6 / half_bytes);
        bench(s, rows ? rows : 64, sms, sync, layers < 4 ? 4 : layers, tiles, bw);
    }
    printf("%s\n", fails ? "FAILED" : "all checks passed");
    return fails ? 1 : 0;
}
