// fp8_train.cu: FP8 training of a dense linear layer on the CUDA backend (--fp8_recipe): the three
// products of Y = X W^T run as FP8 GEMMs, with the scaling rules of fp8_recipe.h.
//   defines: the backend ops fp8_train_new, fp8_train_free, fp8_train_step, fp8_train_state,
//            swiglu_backward_q (the SwiGLU backward writing gate's and up's dY in FP8),
//            cu_fp8_train_forward / cu_fp8_train_backward, which backend_cuda.cu's linear ops call
//            for a weight that has an FP8Train, and cu_fp8_head_* (the LM head's products in FP8)
//
// What is FP8 and what is not. The three GEMMs of every trained projection (q, k, v, o, gate, up,
// down) read FP8 operands and accumulate in fp32:
//   forward      Y  (N, OC) = X  (N, C)  . W   (OC, C)^T     X, W  E4M3
//   input grad   dX (N, C)  = dY (N, OC) . W^T (C, OC)^T     dY    E5M2 (hybrid) or E4M3
//   weight grad  dW (OC, C) = dY^T (OC, N) . X^T (C, N)^T    the reduction runs over the tokens
// Hopper's FP8 tensor cores read both operands K-major (fp8.cu), so each product needs its
// operands laid out with the reduced dimension innermost: W^T for dX, dY^T and X^T for dW, each
// quantized in one pass from the bf16 tensor, transposing as it goes (fp8_quantize_t_cuda). No FP8
// copy of a weight is kept between calls. Everything else stays as in BF16 training, for the reasons
// Transformer Engine gives: the master weights, gradients and AdamW in fp32 (an update is often below
// an FP8, even a BF16, step of the weight); the embeddings, norms, attention (softmax), the LM head
// and the loss in bf16/fp32 (small GEMMs or none, and the logits' precision sets the loss's). The LM
// head's products can be FP8 too (--fp8_lm_head: the section on it below).
//
// What the backward reads of X. The weight gradient needs X^T in FP8 with the forward's scale, so
// its codes are the forward's codes (per tensor: the transpose of X's codes). With a per-tensor
// recipe the caller may keep the forward's codes of X (the `keep` of cu_fp8_train_forward, 1 byte an
// element) in place of the bf16 X (2 bytes): the backward transposes them, and the weight gradient is
// bit for bit the one computed from the bf16 X (model.c keeps the norms' outputs and the MLP's hidden
// this way: Transformer Engine's FP8-saved activations, the memory FP8 training saves). Blocks cannot:
// X's 1x128 groups run along C and X^T's along the tokens, other scales, so the backward quantizes X
// again from bf16.
//
// Scaling, per tensor x, w, dy of each linear (fp8_recipe.h):
//   current  the tensor's own amax now (an amax pass, then the encode with TE's scale fmax / amax);
//   delayed  the scale from the amax history of earlier steps (fp8_quantize_scaled_cuda: one pass
//            that also records this step's amax); after the optimizer step fp8_train_step
//            downloads the amaxes, rolls the histories (delayed_update, the CPU code tested
//            against TE's rules) and uploads the next scales;
//   block    1x128 groups for X and dY along the reduction (C, OC in the forward and dX; the tokens
//            in dW, quantized again transposed), 128x128 tiles for W (and W^T: the same tiles).
#include <math.h>

#include "cuda/backend_cuda.cuh"
#include "cuda/fp8_cuda.h"
#include "core/fp8_recipe.h"

enum { T_X = 0, T_W, T_DY };  // a linear's three scaled tensors

// the FP8 codes of a layer input, kept for the projections that read it next (see reuse)
typedef struct {
    const void *in;      // the input they were made of, (n, cols)
    int n;
    unsigned long call;  // the call that made or last used them
    FP8Tensor q;
} XCache;

struct FP8Train {
    FP8Recipe r;
    FP8Train *leader;  // the projection whose input this one shares and that runs just before it, or NULL
    XCache fwd, bwd;   // a leader's: X's codes for the forward, X^T's for the weight gradient
    // dY's codes in both layouts, made by the op that computed dY (cu_fp8_train_swiglu_backward) for
    // the next backward call, whose dout is dy_for (its memory holds them); NULL: none
    const void *dy_for;
    FP8Tensor dy_row, dy_t;
    // device, one 16-byte slot each (cuBLASLt reads scales only from 16-byte aligned addresses):
    // mul[3] (delayed: TE's multiplying scales), inv[3] (their inverses, what the GEMMs read;
    // current: the tensor's own scale), amax[3] (delayed: this step's, as float bits)
    float *dev;
    DelayedScale d[3];  // host: the histories (delayed)
};

enum { SLOT = 4, SLOTS = 9 };  // floats per slot; slots: mul[3], inv[3], amax[3]
static float *dev_mul(const FP8Train *t, int i) { return t->dev + SLOT * i; }
static float *dev_inv(const FP8Train *t, int i) { return t->dev + SLOT * (3 + i); }
static unsigned *dev_amax(const FP8Train *t, int i) { return (unsigned *)(t->dev + SLOT * (6 + i)); }

static FP8Gran recipe_gran(const FP8Recipe *r) { return r->kind == FP8_RECIPE_BLOCK ? FP8_BLOCK : FP8_TENSOR; }
int fp8_train_keeps(const FP8Train *t) { return t->r.kind != FP8_RECIPE_BLOCK; }

static FP8Tensor tensor_of(int rows, int cols, FP8Gran g, FP8Format fmt, int block_rows) {
    FP8Tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows, t.cols = cols, t.gran = g, t.fmt = fmt, t.block_rows = block_rows;
    return t;
}

FP8Train *cu_fp8_train_new(const QWeight *w, const FP8Recipe *r, FP8Train *leader, char *why, size_t why_cap) {
    if (w->gran != FP8_OFF) die("fp8_train_new: the weight must be dense (--load_in_fp8 off)");
    if (fp8_cuda_cc() < 89) {
        snprintf(why, why_cap, "this GPU (compute capability %d.%d) has no FP8 tensor cores (sm_89+: Ada, Hopper, Blackwell)",
                 fp8_cuda_cc() / 10, fp8_cuda_cc() % 10);
        return NULL;
    }
    FP8Train *t = (FP8Train *)callocCheck(1, sizeof *t);
    t->r = *r;
    t->leader = leader;
    cudaCheck(cudaMalloc(&t->dev, SLOT * SLOTS * sizeof(float)));
    float init[SLOT * SLOTS] = {0};
    for (int i = 0; i < 6; i++) init[SLOT * i] = 1.0f;  // delayed: scale 1 before any history (TE); amax 0
    cudaCheck(cudaMemcpy(t->dev, init, sizeof init, cudaMemcpyHostToDevice));
    if (r->kind == FP8_RECIPE_DELAYED) {
        delayed_init(&t->d[T_X], r, FP8_E4M3);
        delayed_init(&t->d[T_W], r, FP8_E4M3);
        delayed_init(&t->d[T_DY], r, r->hybrid ? FP8_E5M2 : FP8_E4M3);
    }
    return t;
}

void cu_fp8_train_free(FP8Train *t) {
    if (!t) return;
    cudaFree(t->dev);
    for (int i = 0; i < 3; i++) delayed_free(&t->d[i]);
    free(t);
}

static float scaled_max(const FP8Train *t, int i) {
    return fp8_max(i == T_DY && t->r.hybrid ? FP8_E5M2 : FP8_E4M3) * powf(2.0f, -t->r.margin);
}

// current scaling: tensor i's scale from x's amax now (n values); delayed: the history's, already set
static void tensor_scale(FP8Train *t, int i, const void *x, size_t n) {
    if (t->r.kind == FP8_RECIPE_CURRENT) fp8_tensor_scale_cuda(dev_mul(t, i), dev_amax(t, i), x, DT_BF16, n, scaled_max(t, i));
}

// x (rows, cols) bf16 quantized as tensor i of t by the recipe into q (codes and, for block, scales
// in scratch; a per-tensor scale in t's slot for tensor i, or where q->scale already points)
static void quantize(FP8Train *t, int i, FP8Tensor *q, const void *x) {
    if (t->r.kind == FP8_RECIPE_BLOCK) {
        fp8_quantize_cuda(q, x, DT_BF16, 0);
        return;
    }
    tensor_scale(t, i, x, (size_t)q->rows * q->cols);
    if (!q->scale) q->scale = dev_inv(t, i);
    fp8_quantize_scaled_cuda(q, x, DT_BF16, dev_mul(t, i), t->r.kind == FP8_RECIPE_DELAYED ? dev_amax(t, i) : NULL);
}

// the same, transposed: q (cols, rows) = quantize(x^T); block: 1x128 groups along x's rows
static void quantize_t(FP8Train *t, int i, FP8Tensor *q, const void *x) {
    if (t->r.kind != FP8_RECIPE_BLOCK) q->scale = dev_inv(t, i);
    fp8_quantize_t_cuda(q, x, dev_mul(t, i), t->r.kind == FP8_RECIPE_DELAYED ? dev_amax(t, i) : NULL);
}

// W (OC, C) for the forward, or W^T (C, OC) for dX, quantized from the bf16 weight into scratch at
// each call: no FP8 copy of the weights is kept, so FP8 training holds no more memory than BF16 (a
// kept W and W^T would cost 2 bytes a parameter, for one pass over the weight a call saved)
static FP8Tensor weight_q(FP8Train *t, const QWeight *w, int transposed) {
    FP8Gran g = recipe_gran(&t->r);
    int rows = transposed ? w->cols : w->rows, cols = transposed ? w->rows : w->cols;
    FP8Tensor q = tensor_of(rows, cols, g, FP8_E4M3, g == FP8_BLOCK ? FP8_BLOCK_SIZE : 1);
    q.data = (uint8_t *)cu_scratch(SC_TRAIN_W, (size_t)rows * cols);
    if (g == FP8_BLOCK) q.scale = (float *)cu_scratch(SC_TRAIN_W_S, fp8_num_scales(g, rows, cols, FP8_BLOCK_SIZE) * 4);
    if (!transposed) quantize(t, T_W, &q, w->dense);
    else {
        tensor_scale(t, T_W, w->dense, (size_t)rows * cols);
        quantize_t(t, T_W, &q, w->dense);  // 128x128 tiles: the transpose of W's
    }
    return q;
}

// an activation-layout FP8 tensor (rows, cols) of format fmt over scratch buffers sc (codes) and sc + 1 (scales)
static FP8Tensor act_tensor(const FP8Train *t, int rows, int cols, FP8Format fmt, int sc) {
    FP8Tensor q = tensor_of(rows, cols, recipe_gran(&t->r), fmt, 1);
    q.data = (uint8_t *)cu_scratch(sc, (size_t)rows * cols);
    if (q.gran == FP8_BLOCK) q.scale = (float *)cu_scratch(sc + 1, fp8_num_scales(FP8_BLOCK, rows, cols, 1) * 4);
    return q;
}

// Projections that read one input (q, k, v; gate, up) quantize it once: a member reuses the codes
// its group's leader made, when the call just before was the group's with the same input (model.c
// calls them back to back); else it quantizes for itself. The calls are counted to know that.
static unsigned long calls;
static int reuse(FP8Train *t, XCache *c, const void *inp, int N, unsigned long me) {
    int hit = t->leader && c->in == inp && c->n == N && c->call == me - 1;
    c->in = inp, c->n = N, c->call = me;
    return hit;
}

// out (N, OC) (yt: DT_BF16, or DT_F32 for the caller's bias pass) = inp (N, C) W^T in FP8. keep (or
// NULL): inp's codes and their scale go to the caller's keep->data (N * C bytes) and keep->scale (one
// float) as well, for the weight gradient (cu_fp8_train_backward's kept)
void cu_fp8_train_forward(void *out, DType yt, const void *inp, const QWeight *w, int N, FP8Tensor *keep) {
    FP8Train *t = w->train;
    if (keep && t->r.kind == FP8_RECIPE_BLOCK) die("fp8_train: kept input codes need a per-tensor recipe");
    FP8Tensor wq = weight_q(t, w, 0);
    XCache *c = &(t->leader ? t->leader : t)->fwd;
    if (!reuse(t, c, inp, N, ++calls)) {
        c->q = act_tensor(t, N, w->cols, FP8_E4M3, SC_ACT_Q);
        if (keep) c->q.data = keep->data, c->q.scale = keep->scale;  // the codes and scale straight where they stay
        quantize(t, T_X, &c->q, inp);
    } else if (keep && (keep->data != c->q.data || keep->scale != c->q.scale))
        die("fp8_train: a projection that reads its leader's codes keeps them in its leader's keep");
    if (keep) {
        FP8Tensor k = c->q;
        k.data = keep->data, k.scale = keep->scale;
        *keep = k;
    }
    fp8_gemm_cuda(out, yt, &c->q, &wq, 0);
}

// out (N, OC) = X W^T from X's codes xq as a forward kept them (keep above): the forward's product again,
// the same bytes (the weight quantized again as that forward quantized it)
void cu_fp8_train_forward_kept(void *out, DType yt, const FP8Tensor *xq, const QWeight *w, int N) {
    if (xq->gran != FP8_TENSOR || xq->rows != N || xq->cols != w->cols)
        die("fp8_train: kept input codes (%d, %d) for a product of (%d, %d) per tensor", xq->rows, xq->cols, N, w->cols);
    FP8Tensor wq = weight_q(w->train, w, 0);
    fp8_gemm_cuda(out, yt, xq, &wq, 0);
}

// The ops that make a kept input, writing it only as the codes its consumer's forward reads: with
// delayed scaling the scale is known before the pass, so the norm (the GLU) encodes its values as it
// computes them, and the bf16 values are never written and read again (the per-op path: rmsnorm_forward,
// then the consumer's forward quantizing its output). The codes, scale and amax are that path's.
static int delayed_input(const QWeight *consumer, FP8Tensor *keep, int N, int C, float **mul, unsigned **amax) {
    FP8Train *t = consumer->train;
    if (!t || t->r.kind != FP8_RECIPE_DELAYED || consumer->cols != C) return 0;
    FP8Train *l = t->leader ? t->leader : t;  // whose codes of this input the group reads (reuse)
    *mul = dev_mul(l, T_X), *amax = dev_amax(l, T_X);
    uint8_t *data = keep->data;
    float *scale = keep->scale;
    *keep = tensor_of(N, C, FP8_TENSOR, FP8_E4M3, 1);
    keep->data = data, keep->scale = scale;
    return 1;
}
int cu_fp8_train_norm_q(FP8Tensor *keep, void *rstd, const void *inp, const void *w, int N, int C, float eps, int norm1p,
                        const QWeight *consumer) {
    float *mul;
    unsigned *amax;
    FP8Tensor k = *keep;
    if (!delayed_input(consumer, &k, N, C, &mul, &amax) || !cu_rmsnorm_q(k.data, k.scale, amax, mul, rstd, inp, w, N, C, eps, norm1p))
        return 0;
    *keep = k;
    return 1;
}
int cu_fp8_train_glu_q(FP8Tensor *keep, const void *gate, const void *up, int N, int FF, int gelu, const QWeight *consumer) {
    float *mul;
    unsigned *amax;
    FP8Tensor k = *keep;
    if (!delayed_input(consumer, &k, N, FF, &mul, &amax) || !cu_glu_q(k.data, k.scale, amax, mul, gate, up, (size_t)N * FF, gelu))
        return 0;
    *keep = k;
    return 1;
}

// dinp (N, C) bf16 (=, or += with accumulate) = dout W ; dw (OC, C) f32 += dout^T inp ; in FP8. kept (or
// NULL): inp's codes as the forward kept them, read in inp's place (inp may then be NULL)
void cu_fp8_train_backward(void *dinp, int accumulate, float *dw, const void *dout, const void *inp, const FP8Tensor *kept,
                           const QWeight *w, int N) {
    FP8Train *t = w->train;
    int C = w->cols, OC = w->rows;
    FP8Format gfmt = t->r.hybrid ? FP8_E5M2 : FP8_E4M3;
    unsigned long me = ++calls;
    // dY's codes made ahead by the op that computed dY: nothing to quantize
    int made = t->dy_for != NULL;
    if (made && (t->dy_for != dout || t->dy_row.rows != N))
        die("fp8_train: dY's FP8 codes were made for another tensor (swiglu_backward_q, then this projection's backward)");
    t->dy_for = NULL;
    // dY is read for dX (row layout) and for dW (transposed): per tensor both take the same scale,
    // so one pass over dY writes both (blocks: their groups run along different axes, two passes)
    int both = dinp && dw && t->r.kind != FP8_RECIPE_BLOCK;
    FP8Tensor dyt, dyq;
    memset(&dyt, 0, sizeof dyt);
    if (made) dyq = t->dy_row, dyt = t->dy_t;
    else if (dw) dyt = act_tensor(t, OC, N, gfmt, SC_TRAIN_DYT);
    if (dinp) {
        FP8Tensor wt = weight_q(t, w, 1);
        if (!made) {
            dyq = act_tensor(t, N, OC, gfmt, SC_TRAIN_DY);
            if (!both) quantize(t, T_DY, &dyq, dout);
            else {
                tensor_scale(t, T_DY, dout, (size_t)N * OC);
                dyq.scale = dyt.scale = dev_inv(t, T_DY);
                fp8_quantize_both_cuda(&dyq, &dyt, dout, dev_mul(t, T_DY),
                                       t->r.kind == FP8_RECIPE_DELAYED ? dev_amax(t, T_DY) : NULL);
            }
        }
        // accumulated in the product's epilogue, bf16(dinp + the fp32 product), one rounding (fp8_gemm_cuda
        // keeps cuBLASLt from splitting K into bf16 partial sums there)
        fp8_gemm_cuda(dinp, DT_BF16, &dyq, &wt, accumulate);
    } else if (!made) tensor_scale(t, T_DY, dout, (size_t)N * OC);
    if (!dw) return;
    // dY^T (OC, N) and X^T (C, N), the tokens innermost, quantized from dY and X in one pass each:
    // per tensor with the scales of dX's and the forward's products, or in 1x128 groups along the tokens
    if (!both && !made) quantize_t(t, T_DY, &dyt, dout);
    XCache *c = &(t->leader ? t->leader : t)->bwd;
    if (!reuse(t, c, kept ? (const void *)kept->data : inp, N, me)) {
        c->q = act_tensor(t, C, N, FP8_E4M3, SC_TRAIN_XT);
        if (kept) {  // one scale for the tensor: X^T's codes are X's codes transposed
            if (kept->rows != N || kept->cols != C || kept->gran != FP8_TENSOR)
                die("fp8_train: the kept input codes are (%d, %d), this backward reads (%d, %d) per tensor", kept->rows,
                    kept->cols, N, C);
            c->q.scale = kept->scale;
            fp8_transpose_cuda(&c->q, kept);
        } else {
            tensor_scale(t, T_X, inp, (size_t)N * C);
            quantize_t(t, T_X, &c->q, inp);
        }
    }
    fp8_gemm_cuda(dw, DT_F32, &dyt, &c->q, 1);
}

// ----------------------------------------------------------------------------
// The SwiGLU backward, fused with the quantization of its outputs. dgate and dup are read by
// nothing but the FP8 products of gate's and up's backward, which read them as codes: so the
// kernel writes the codes, in the row layout (dX's product) and transposed (dW's), into the
// arrays' memory (2 bytes an element, as the bf16 values), and never the bf16 values, which the
// per-op path writes (4 bytes an element) and reads back (4 more) to quantize. The codes are the per-op path's bit for bit: the same derivative (swiglu_grad), rounded
// to bf16 as swiglu_backward stores it, encoded with the delayed scale as fp8_quantize_both_cuda
// would, the same amaxes recorded. Delayed scaling only: its scales are known before the pass
// (current scaling needs dY's amax first, blocks their own groups).

// one block a 128x128 tile of (N, FF): row codes written from registers, transposed through
// shared memory (tile_codes_write_t); mul: the two delayed scales, inv their inverses (written),
// amax the two tensors' amax slots
__global__ void __launch_bounds__(256) swiglu_bwd_q_kernel(uint8_t *g_row, uint8_t *g_t, uint8_t *u_row, uint8_t *u_t,
                                                           float *g_inv, float *u_inv, const float *g_mul,
                                                           const float *u_mul, unsigned *g_amax, unsigned *u_amax,
                                                           const bf16 *dout, const bf16 *gate, const bf16 *up, int N, int FF,
                                                           int fmt) {
    __shared__ TileCodes tg, tu;
    int r0 = blockIdx.y * 128, c0 = blockIdx.x * 128;
    float sg = *g_mul, su = *u_mul;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) g_inv[0] = __frcp_rn(sg), u_inv[0] = __frcp_rn(su);
    unsigned mg = 0, mu = 0;
#pragma unroll 2
    for (int i = 0; i < 8; i++) {
        int p = threadIdx.x + 256 * i, r = p >> 4, k8 = p & 15;
        size_t at = (size_t)(r0 + r) * FF + c0 + 8 * k8;
        float d[8], g[8], u[8];
        unpack8(d, *(const uint4 *)(dout + at));
        unpack8(g, *(const uint4 *)(gate + at));
        unpack8(u, *(const uint4 *)(up + at));
        uint32_t wg[2] = {0, 0}, wu[2] = {0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float dg, du;
            swiglu_grad(d[j], g[j], u[j], &dg, &du);
            dg = __bfloat162float(__float2bfloat16_rn(dg));  // the bf16 values swiglu_backward stores
            du = __bfloat162float(__float2bfloat16_rn(du));
            mg = max(mg, __float_as_uint(fabsf(dg)));
            mu = max(mu, __float_as_uint(fabsf(du)));
            wg[j >> 2] |= (uint32_t)fp8_encode_dev(dg * sg, fmt) << (8 * (j & 3));
            wu[j >> 2] |= (uint32_t)fp8_encode_dev(du * su, fmt) << (8 * (j & 3));
        }
        uint2 cg = make_uint2(wg[0], wg[1]), cu = make_uint2(wu[0], wu[1]);
        *(uint2 *)(g_row + at) = cg;
        *(uint2 *)(u_row + at) = cu;
        tile_codes_put(tg, r, k8, cg);
        tile_codes_put(tu, r, k8, cu);
    }
    block_amax_record(g_amax, mg);  // (its __syncthreads also orders the tiles' writes and reads)
    __syncthreads();
    block_amax_record(u_amax, mu);
    tile_codes_write_t(tg, g_t, N, r0, c0);
    tile_codes_write_t(tu, u_t, N, r0, c0);
}

int cu_fp8_train_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, int N, int FF,
                                 const QWeight *wg, const QWeight *wu) {
    FP8Train *tg = wg->train, *tu = wu->train;
    if (!tg || !tu || tg->r.kind != FP8_RECIPE_DELAYED || tu->r.kind != FP8_RECIPE_DELAYED || tg->r.hybrid != tu->r.hybrid ||
        N <= 0 || N % 128 || FF % 128 || wg->rows != FF || wu->rows != FF ||
        ((uintptr_t)dout | (uintptr_t)gate | (uintptr_t)up | (uintptr_t)dgate | (uintptr_t)dup) % 16)
        return 0;
    FP8Format f = tg->r.hybrid ? FP8_E5M2 : FP8_E4M3;
    FP8Train *t[2] = {tg, tu};
    void *mem[2] = {dgate, dup};
    for (int i = 0; i < 2; i++) {  // the row codes, then the transposed ones, where the bf16 values would be
        t[i]->dy_row = tensor_of(N, FF, FP8_TENSOR, f, 1), t[i]->dy_t = tensor_of(FF, N, FP8_TENSOR, f, 1);
        t[i]->dy_row.data = (uint8_t *)mem[i], t[i]->dy_t.data = (uint8_t *)mem[i] + (size_t)N * FF;
        t[i]->dy_row.scale = t[i]->dy_t.scale = dev_inv(t[i], T_DY);
    }
    dim3 grid(FF / 128, N / 128);
    swiglu_bwd_q_kernel<<<grid, 256, 0, cu_stream()>>>(tg->dy_row.data, tg->dy_t.data, tu->dy_row.data, tu->dy_t.data,
                                                       dev_inv(tg, T_DY), dev_inv(tu, T_DY), dev_mul(tg, T_DY),
                                                       dev_mul(tu, T_DY), dev_amax(tg, T_DY), dev_amax(tu, T_DY),
                                                       (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, N, FF, f);
    launchCheck();
    tg->dy_for = dgate, tu->dy_for = dup;
    return 1;
}

// ----------------------------------------------------------------------------
// The LM head in FP8 (--fp8_lm_head, delayed scaling). The head is a linear layer of V outputs, and
// with the option its three products are FP8 GEMMs as a projection's are, with its own delayed scales
// for h (x), W (w) and the logits' gradient dz (dy):
//   logits       z  (nr, V)  = h  (nr, C) . W   (V, C)^T     h, W E4M3; z in fp32
//   input grad   dh (nr, C)  = dz (nr, V) . W^T (C, V)^T     dz E5M2 (hybrid) or E4M3
//   weight grad  dW (V, C)  += dz^T (V, nr) . h^T (C, nr)^T  summed over the chunks of rows
// The head is the largest GEMM of a small model's step (V = 128,256 against C = 2,048 at Llama-3.2-1B:
// a fifth of the 1B step in bf16), which is why it is worth it; the recipes of Transformer Engine,
// torchao and DeepSeek-V3 keep it in bf16 because the logits set the loss's precision, so it is an
// option, measured against BF16 by the loss curves (dev/notes/fp8-training.md, "The FP8 head's weight
// gradient a product per group of chunks; what the FP8 head learns, held out"). What stays exact: the
// logits are fp32 and the softmax, lse and logprobs run on them as in the bf16 path; the error is that of the
// product's operands (E4M3 h and W: a relative 2^-4 each, averaging over C), the same error every
// projection's forward has. dz is made from the fp32 logits in one pass that writes its codes in both
// layouts (the scale is known before the pass), never its bf16 values (the per-op path: bf16 dz,
// written and read again to quantize it).

// one block a 128x128 tile of (nr, V): row codes from registers, transposed through shared memory into
// columns col0 .. col0 + nr - 1 of qt (V, ld)
__global__ void __launch_bounds__(256) head_dz_q_kernel(uint8_t *q, uint8_t *qt, float *inv, const float *mul,
                                                        unsigned *amax, const float *z, const float *dlogp, const float *lse,
                                                        const int32_t *targets, float inv_temp, int nr, int V, int ld,
                                                        int col0, int fmt) {
    __shared__ TileCodes tile;
    int r0 = blockIdx.y * 128, c0 = blockIdx.x * 128;
    float s = *mul;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) inv[0] = __frcp_rn(s);
    unsigned m = 0;
#pragma unroll 2
    for (int i = 0; i < 8; i++) {
        int p = threadIdx.x + 256 * i, r = p >> 4, k8 = p & 15, row = r0 + r, c = c0 + 8 * k8;
        uint32_t word[2] = {0, 0};
        if (row < nr && c < V) {
            int t = targets[row];
            float g = dlogp[row], L = lse[row];
            int live = t >= 0 && g != 0.f;  // rows without a target, or without weight, are zero
            const float4 *zr = (const float4 *)(z + (size_t)row * V + c);
            float4 a = zr[0], b = zr[1];
            float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float v = live ? logprob_grad(f[j], c + j == t, g, L, inv_temp) : 0.f;
                v = __bfloat162float(__float2bfloat16_rn(v));  // the bf16 value logprobs_backward stores
                m = max(m, __float_as_uint(fabsf(v)));
                word[j >> 2] |= (uint32_t)fp8_encode_dev(v * s, fmt) << (8 * (j & 3));
            }
            *(uint2 *)(q + (size_t)row * V + c) = make_uint2(word[0], word[1]);
        }
        tile_codes_put(tile, r, k8, make_uint2(word[0], word[1]));
    }
    if (amax) block_amax_record(amax, m);  // (its __syncthreads also orders the tile's writes and reads)
    else __syncthreads();
    if (r0 + 128 <= nr && c0 + 128 <= V && ld % 4 == 0 && col0 % 4 == 0) {
        tile_codes_write_t(tile, qt, ld, col0 + r0, c0);
        return;
    }
    // an edge tile, byte by byte: code (r, c) is byte c % 4 of word (c / 4 + r / 4) % 32 of row r (tile_codes_put)
    for (int e = threadIdx.x; e < 128 * 128; e += 256) {
        int c = e >> 7, r = e & 127;
        if (r0 + r < nr && c0 + c < V)
            qt[(size_t)(c0 + c) * ld + col0 + r0 + r] = (uint8_t)(tile[r][((c >> 2) + (r >> 2)) & 31] >> (8 * (c & 3)));
    }
}

void fp8_head_dz_q_cuda(FP8Tensor *q, FP8Tensor *qt, int col0, const float *z, const float *dlogp, const float *lse,
                        const int32_t *targets, float inv_temp, const float *mul, unsigned *amax) {
    int nr = q->rows, V = q->cols;
    if (q->gran != FP8_TENSOR || qt->gran != FP8_TENSOR || qt->rows != V || col0 < 0 || qt->cols < col0 + nr ||
        q->fmt != qt->fmt || V % 8 || (uintptr_t)z % 16 || (uintptr_t)q->data % 8)
        die("fp8_head_dz_q_cuda: per tensor (nr, V) and (V, >= col0 + nr) of one format, V a multiple of 8, aligned buffers");
    if (nr <= 0) return;
    dim3 grid(cdiv(V, 128), cdiv(nr, 128));
    head_dz_q_kernel<<<grid, 256, 0, cu_stream()>>>(q->data, qt->data, qt->scale, mul, amax, z, dlogp, lse, targets, inv_temp,
                                                    nr, V, qt->cols, col0, q->fmt);
    launchCheck();
    if (q->scale != qt->scale) cudaCheck(cudaMemcpyAsync(q->scale, qt->scale, 4, cudaMemcpyDeviceToDevice, cu_stream()));
}

void cu_fp8_head_weight(const QWeight *w, FP8Tensor *wq, FP8Tensor *wt) {
    FP8Train *t = w->train;
    int V = w->rows, C = w->cols;
    *wq = tensor_of(V, C, FP8_TENSOR, FP8_E4M3, 1);
    wq->data = (uint8_t *)cu_scratch(SC_TRAIN_W, (size_t)V * C);
    wq->scale = dev_inv(t, T_W);
    if (!wt) {
        quantize(t, T_W, wq, w->dense);
        return;
    }
    *wt = tensor_of(C, V, FP8_TENSOR, FP8_E4M3, 1);
    wt->data = (uint8_t *)cu_scratch(SC_HEAD_WT, (size_t)V * C);
    wt->scale = dev_inv(t, T_W);
    fp8_quantize_both_cuda(wq, wt, w->dense, dev_mul(t, T_W), dev_amax(t, T_W));
}

void cu_fp8_head_logits(float *z, const void *h, const QWeight *w, const FP8Tensor *wq, int nr) {
    FP8Train *t = w->train;
    FP8Tensor hq = act_tensor(t, nr, w->cols, FP8_E4M3, SC_ACT_Q);
    hq.scale = dev_inv(t, T_X);
    quantize(t, T_X, &hq, h);
    fp8_gemm_cuda(z, DT_F32, &hq, wq, 0);
}

// dz^T (V, rows) of at most this many bytes a weight-gradient product: each product reads and writes the
// whole fp32 dW (V x C x 4 bytes, 1 GiB at Llama-3.2-1B), so the fewer the better
#define HEAD_DZT_BYTES ((size_t)512 << 20)

// dz's row codes (a chunk), 256-byte aligned before dz^T's (the GEMMs read 16-byte aligned operands)
static size_t dz_rows_bytes(int nr, int V) { return ((size_t)nr * V + 255) / 256 * 256; }

void cu_fp8_head_chunks(float *logp, float *lse, void *dh, float *dw, const float *dlogp, const void *h, const QWeight *w,
                        const int32_t *targets, float inv_temp, int N, int CH, float *z, HeadRows rows) {
    FP8Train *t = w->train;
    int V = w->rows, C = w->cols;
    FP8Format f = t->r.hybrid ? FP8_E5M2 : FP8_E4M3;
    FP8Tensor wq, wt;
    cu_fp8_head_weight(w, &wq, &wt);
    // the rows of a group: whole chunks whose dz^T fits HEAD_DZT_BYTES (at least one chunk;
    // FP8GRPO_HEAD_GROUP_ROWS, a multiple of CH, overrides it: the tests use it to cover several groups)
    static long forced = -1;
    if (forced < 0) forced = backend_env_rows("FP8GRPO_HEAD_GROUP_ROWS");
    size_t fit = forced > 0 ? (size_t)forced / CH : HEAD_DZT_BYTES / V / CH;
    int GR = dw && fit > 1 ? (int)(fit * CH < (size_t)N ? fit * CH : N) : CH;
    uint8_t *mem = (uint8_t *)cu_scratch(SC_BF16, dz_rows_bytes(CH, V) + (size_t)V * GR);
    for (int g0 = 0; g0 < N; g0 += GR) {
        int gn = N - g0 < GR ? N - g0 : GR;
        const bf16 *hg = (const bf16 *)h + (size_t)g0 * C;
        // h's codes for the group: rows for the logits, transposed (h^T (C, gn)) for dW, from one read
        FP8Tensor hq = act_tensor(t, gn, C, FP8_E4M3, SC_ACT_Q), ht = act_tensor(t, C, gn, FP8_E4M3, SC_TRAIN_XT);
        hq.scale = ht.scale = dev_inv(t, T_X);
        if (dw) fp8_quantize_both_cuda(&hq, &ht, hg, dev_mul(t, T_X), dev_amax(t, T_X));
        else quantize(t, T_X, &hq, hg);
        FP8Tensor dzt = tensor_of(V, gn, FP8_TENSOR, f, 1);  // dz^T of the whole group, a chunk's columns at a time
        dzt.data = mem + dz_rows_bytes(CH, V);
        dzt.scale = dev_inv(t, T_DY);
        for (int r0 = 0; r0 < gn; r0 += CH) {
            int nr = gn - r0 < CH ? gn - r0 : CH, row = g0 + r0;
            FP8Tensor hc = hq;  // the chunk's rows of the group's codes
            hc.rows = nr;
            hc.data += (size_t)r0 * C;
            fp8_gemm_cuda(z, DT_F32, &hc, &wq, 0);  // z (nr, V) = h W^T
            if (logp) rows(logp + row, lse + row, z, targets + row, inv_temp, nr, V);
            FP8Tensor dzq = tensor_of(nr, V, FP8_TENSOR, f, 1);
            dzq.data = mem;
            dzq.scale = dev_inv(t, T_DY);
            fp8_head_dz_q_cuda(&dzq, &dzt, r0, z, dlogp + row, lse + row, targets + row, inv_temp, dev_mul(t, T_DY),
                               dev_amax(t, T_DY));
            fp8_gemm_cuda((bf16 *)dh + (size_t)row * C, DT_BF16, &dzq, &wt, 0);  // dh (nr, C) = dz W
        }
        if (dw) fp8_gemm_cuda(dw, DT_F32, &dzt, &ht, 1);  // dW (V, C) += dz^T h over the group's rows
    }
}

// After an optimizer step: delayed scaling rolls every tensor's history and sets the next scales,
// from one download and one upload (the other recipes keep nothing between steps).
void cu_fp8_train_step(FP8Train *const *ts, int n, AmaxReduce reduce, void *ctx, long *overflows) {
    if (n == 0 || ts[0]->r.kind != FP8_RECIPE_DELAYED) return;
    const size_t per = SLOT * SLOTS;
    static float *host;  // pinned, grown to the most weights seen (kept: this runs every step)
    static size_t cap;
    if (cap < n * per) {
        if (host) cudaFreeHost(host);
        cudaCheck(cudaMallocHost(&host, n * per * sizeof(float)));
        cap = n * per;
    }
    for (int k = 0; k < n; k++)
        cudaCheck(cudaMemcpyAsync(host + per * k, ts[k]->dev, per * sizeof(float), cudaMemcpyDeviceToHost, cu_stream()));
    cudaCheck(cudaStreamSynchronize(cu_stream()));
    if (reduce) {  // the amaxes (their bits, read as the floats they are) side by side, reduced, put back
        float *a = (float *)mallocCheck(3 * (size_t)n * sizeof(float));
        for (int k = 0; k < n; k++)
            for (int i = 0; i < 3; i++) a[3 * k + i] = host[per * k + SLOT * (6 + i)];
        reduce(a, 3 * (size_t)n, ctx);
        for (int k = 0; k < n; k++)
            for (int i = 0; i < 3; i++) host[per * k + SLOT * (6 + i)] = a[3 * k + i];
        free(a);
    }
    for (int k = 0; k < n; k++) {
        float *h = host + per * k;
        for (int i = 0; i < 3; i++) {
            DelayedScale *d = &ts[k]->d[i];
            long before = d->overflows;
            delayed_record(d, h[SLOT * (6 + i)]);  // the amax bits, read as the float they are
            delayed_update(d);
            if (overflows) *overflows += d->overflows - before;
            h[SLOT * i] = d->scale;
            h[SLOT * (3 + i)] = d->scale_inv;
            h[SLOT * (6 + i)] = 0.0f;  // the next step's amax starts at 0
        }
        cudaCheck(cudaMemcpyAsync(ts[k]->dev, h, per * sizeof(float), cudaMemcpyHostToDevice, cu_stream()));
    }
    cudaCheck(cudaStreamSynchronize(cu_stream()));
}

// Delayed scaling's state for a checkpoint (what makes a resumed run scale as the unbroken one
// would): per weight and tensor, the scale in force and the history. Setting it uploads the scales.
size_t cu_fp8_train_state(FP8Train *const *ts, int n, float *buf, int set) {
    if (n == 0 || ts[0]->r.kind != FP8_RECIPE_DELAYED) return 0;
    size_t per = 1 + (size_t)ts[0]->r.history_len, count = (size_t)n * 3 * per;
    if (!buf) return count;
    for (int k = 0; k < n; k++) {
        float slots[SLOT * SLOTS] = {0};  // set: the scales, and this step's amaxes at 0 (as after a step)
        for (int i = 0; i < 3; i++) {
            DelayedScale *d = &ts[k]->d[i];
            float *b = buf + ((size_t)k * 3 + i) * per;
            if (!set) {
                b[0] = d->scale;
                memcpy(b + 1, d->history, d->len * sizeof(float));
                continue;
            }
            d->scale = b[0], d->scale_inv = 1.0f / b[0];
            memcpy(d->history, b + 1, d->len * sizeof(float));
            slots[SLOT * i] = d->scale, slots[SLOT * (3 + i)] = d->scale_inv;
        }
        if (set) cudaCheck(cudaMemcpy(ts[k]->dev, slots, sizeof slots, cudaMemcpyHostToDevice));
    }
    return count;
}
