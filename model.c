// model.c: the transformer, written once against backend.h.
// Defines: the activation arena (one allocation, a walker sets the pointers),
// model_forward (training / scoring over B right-padded sequences of T tokens),
// model_logprobs / model_logits, model_backward (the mirror of the forward, to
// the LoRA adapters and optionally to every dense weight), and the KV-cache
// prefill and decode step the rollout engine drives.
//
// One layer (Llama 3 / Qwen2 / Qwen3 / Mistral), x the residual stream (N, C):
//   h = rmsnorm(x) ; q, k, v = h Wq^T (+b), h Wk^T (+b), h Wv^T (+b)
//   Qwen3: q, k = rmsnorm per head (q_norm, k_norm) ; q, k = rope(q, k)
//   x = x + attention(q, k, v) Wo^T
//   h = rmsnorm(x) ; x = x + (silu(h Wg^T) * h Wu^T) Wd^T
// and every W above may carry a LoRA adapter (lora.h). Qwen3 MoE's sparse layers (Config.moe) replace the
// MLP by a router and experts (moe_forward): p = softmax(h Wr^T) over the E experts, each token's K
// largest (divided by their sum with norm_topk_prob), x = x + sum over them of p_e * expert_e(h), each
// expert a SwiGLU MLP of its own; the router carries no adapter, the experts one if asked (PEFT's
// target_parameters, lora.h; the CPU's alone).
// Gemma 3 (Config.gemma) is the same layer with
// its norms x / rms(x) * (1 + w), q_norm and k_norm, a norm on each branch's output before the residual
// add ("sandwich" norms), and GeGLU:
//   x = x + rmsnorm_attn(attention(q, k, v) Wo^T) ; h = rmsnorm(x)
//   x = x + rmsnorm_mlp((gelu_tanh(h Wg^T) * h Wu^T) Wd^T)
// Sliding-window layers (Mistral's every layer with a sliding_window, Gemma 3's "sliding_attention"
// layers) see only the last window keys; Gemma 3's sliding layers rotate with their own RoPE base.
#include <math.h>

#include "lora.h"
#include "model.h"

// ----------------------------------------------------------------------------
// the activation arena

typedef struct {
    void **ptr;
    size_t bytes;
} ASlot;

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

// FP8 training with a per-tensor recipe on every layer (model_fp8_train sets Model.fp8_keep) saves the
// projections' inputs for the backward as the FP8 codes their products read, not as bf16: the weight
// gradient reads X^T's codes, which per tensor are X's codes transposed, so 1 byte an element is all it
// needs (fp8_train.cu). Not for a forward alone (no backward), nor with adapters (their backward reads
// the bf16 input).
static int acts_keep(const Model *m, int recompute) {
    return m->fp8_keep && recompute != ACTS_FORWARD_ONLY && !m->lora;
}

// A frozen FP8 weight whose products quantize their input a row or a 1x128 group at a time: the
// projections of a group that read one input (q, k, v; gate, up) can share that input's codes
static int quantizes_input(const QWeight *w) {
    return w->rows && !w->train && (w->gran == FP8_ROW || w->gran == FP8_BLOCK);
}
// t's shape: w's input codes for N rows (E4M3, w's granularity, 1x128 groups); its buffers untouched
static void act_codes(FP8Tensor *t, const QWeight *w, int N) {
    t->rows = N, t->cols = w->cols, t->gran = w->gran, t->fmt = FP8_E4M3, t->block_rows = 1;
}
// the columns of Acts.xq: the widest input a layer's frozen FP8 products share (ln1, ln2: C; hm: FF), 0 if none
static int acts_share(const Model *m, int recompute) {
    if (!m->be->quantize_act || !m->w.layers || acts_keep(m, recompute)) return 0;
    int cols = 0;
    for (int l = 0; l < m->cfg.L; l++)
        for (int i = 0; i < LIN_COUNT; i++) {
            const QWeight *w = &m->w.layers[l].lin[i];
            if ((i == LIN_Q || i == LIN_GATE || i == LIN_DOWN) && quantizes_input(w) && w->cols > cols) cols = w->cols;
        }
    return cols;
}

// the width of the dense MLP's buffers: intermediate_size, or 0 where every layer is sparse (Qwen3-30B-A3B's
// intermediate_size, 6144, is no layer's: its MLPs are the experts)
static size_t dense_ff(const Config *c) {
    for (int l = 0; l < c->L; l++)
        if (!c->moe[l]) return (size_t)c->FF;
    return 0;
}

// (re)allocate m->acts for N = B*T rows; keeps the old arena when it is big enough
// the activation layout for B x T (one layer of per-layer buffers with recompute): sizes into s
// (pointers into a), count returned
static size_t acts_slots(const Model *m, Acts *a, int B, int T, int recompute, ASlot *s) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    size_t N = (size_t)B * T;
    // per-layer buffers hold every layer, or one with recomputation; x holds all L + 1 layer inputs
    // (the backward starts each layer from its input), or with ACTS_FORWARD_ONLY two, in turn, and no
    // backward buffers at all (b = 0)
    size_t act = dtype_size(be->act), hp = dtype_size(be->hp), L = recompute ? 1 : c->L;
    size_t q = (size_t)c->NH * c->HD, kv = (size_t)c->KVH * c->HD;
    size_t xl = recompute == ACTS_FORWARD_ONLY ? 2 : (size_t)c->L + 1, b = recompute == ACTS_FORWARD_ONLY ? 0 : 1;
    // Keeping the FP8 codes of ln1, ln2 and hmlp (acts_keep) in place of their bf16 values, which then
    // hold one layer: the one being computed
    size_t keep = acts_keep(m, recompute), Lb = keep ? 1 : L;
    // gate and up recomputed in the backward (Model.recompute_mlp): one layer's, the one being computed
    size_t Lg = m->recompute_mlp && recompute != ACTS_FORWARD_ONLY ? 1 : L;
    size_t FF = dense_ff(c);
    ASlot t[] = {
        {&a->x, xl * N * c->C * act},
        {&a->ln1, Lb * N * c->C * act},
        {&a->ln1q, keep * L * N * c->C},
        {&a->ln2q, keep * L * N * c->C},
        {&a->hq, keep * L * N * c->FF},
        {&a->kscale, keep * L * 3 * 16},
        {&a->xq, N * acts_share(m, recompute)},
        {&a->xqs, N * ((acts_share(m, recompute) + 127) / 128) * 4},
        {&a->rstd1, L * N * hp},
        {&a->qpre, c->qk_norm ? L * N * q * act : 0},
        {&a->kpre, c->qk_norm ? L * N * kv * act : 0},
        {&a->qrstd, c->qk_norm ? L * N * c->NH * hp : 0},
        {&a->krstd, c->qk_norm ? L * N * c->KVH * hp : 0},
        {&a->q, L * N * q * act},
        {&a->k, L * N * kv * act},
        {&a->v, L * N * kv * act},
        {&a->att, L * N * q * act},
        {&a->lse, L * N * c->NH * hp},
        {&a->ao, c->gemma ? L * N * c->C * act : 0},
        {&a->rstda, c->gemma ? L * N * hp : 0},
        {&a->mo, c->gemma ? L * N * c->C * act : 0},
        {&a->rstdm, c->gemma ? L * N * hp : 0},
        {&a->xmid, L * N * c->C * act},
        {&a->ln2, Lb * N * c->C * act},
        {&a->rstd2, L * N * hp},
        {&a->gate, Lg * N * FF * act},
        {&a->up, Lg * N * FF * act},
        {&a->hmlp, Lb * N * FF * act},
        {&a->rlogits, L * N * c->E * act},
        {&a->ridx, L * N * c->K * 4},
        {&a->rw, L * N * c->K * hp},
        {&a->egate, L * N * c->K * c->FFe * act},
        {&a->eup, L * N * c->K * c->FFe * act},
        {&a->lnf, N * c->C * act},
        {&a->rstdf, N * hp},
        {&a->logp, N * hp},
        {&a->lsef, N * hp},
        {&a->dx, b * N * c->C * act},
        {&a->dln, b * N * c->C * act},
        {&a->dpost, c->gemma ? b * N * c->C * act : 0},
        {&a->dq, b * N * q * act},
        {&a->dk, b * N * kv * act},
        {&a->dv, b * N * kv * act},
        {&a->datt, b * N * q * act},
        {&a->dqpre, b * N * q * act},
        {&a->dkpre, b * N * kv * act},
        {&a->dff1, b * N * FF * act},
        {&a->dff2, b * N * FF * act},
        {&a->dff3, b * N * FF * act},
        {&a->drw, b * N * c->K * hp},
        {&a->drlogits, b * N * c->E * act},
        {&a->ids, N * 4},
        {&a->pos, N * 4},
        {&a->targets, N * 4},
        {&a->dlogp, b * N * hp},
    };
    memcpy(s, t, sizeof t);
    return sizeof t / sizeof t[0];
}

size_t model_acts_bytes(const Model *m, int B, int T, int recompute) {
    Acts tmp;
    ASlot s[64] = {{0}};
    size_t ns = acts_slots(m, &tmp, B, T, recompute, s), total = 0;
    for (size_t i = 0; i < ns; i++) total += al256(s[i].bytes);
    return total;
}

static void acts_ensure(Model *m, int B, int T) {
    Acts *a = &m->acts;
    const Backend *be = m->be;
    size_t N = (size_t)B * T;
    if (a->mem && (size_t)a->B * a->T >= N && a->recompute == m->recompute && a->keep == acts_keep(m, m->recompute) &&
        a->recompute_mlp == m->recompute_mlp)
        return;
    ASlot s[64] = {{0}};
    size_t ns = acts_slots(m, a, B, T, m->recompute, s), total = 0;
    for (size_t i = 0; i < ns; i++) total += al256(s[i].bytes);
    Arena *ar = &m->arena;
    if (ar->cap) {  // the bottom of the arena, below a live KV cache (none during an update)
        if (!ar->kv_bytes) model_arena_reserve(m, total, "the training activations");
        if (total > ar->bytes - ar->kv_bytes)
            die("memory: activations of %d x %d tokens (%.2f GiB) do not fit beside the KV cache (%.2f GiB) in the "
                "arena (%.2f GiB)", B, T, total / 1073741824.0, ar->kv_bytes / 1073741824.0, ar->bytes / 1073741824.0);
        a->mem = ar->mem;
        if (total > ar->peak_acts) ar->peak_acts = total;
    } else {
        if (a->mem) be->free(a->mem);
        a->mem = be->alloc(total);
    }
    a->bytes = total;
    char *p = (char *)a->mem;
    for (size_t i = 0; i < ns; i++) {
        *s[i].ptr = s[i].bytes ? p : NULL;
        p += al256(s[i].bytes);
    }
    a->B = B;
    a->T = T;
    a->recompute = m->recompute;
    a->keep = acts_keep(m, m->recompute);
    a->recompute_mlp = m->recompute_mlp;
}

void model_arena_init(Model *m, size_t cap) { m->arena.cap = cap; }

void model_arena_reserve(Model *m, size_t bytes, const char *what) {
    Arena *ar = &m->arena;
    if (!ar->cap || bytes <= ar->bytes) return;
    if (ar->kv_bytes) die("memory: the arena cannot grow while a KV cache lives in it");
    if (bytes > ar->cap)
        die("memory: %s need %.2f GiB of the KV-cache/activation arena, but --gpu_memory_utilization leaves it "
            "%.2f GiB: raise --gpu_memory_utilization, %sor lower --per_device_train_batch_size / --micro_batch_size / "
            "--max_completion_length",
            what, bytes / 1073741824.0, ar->cap / 1073741824.0, m->recompute ? "" : "turn on --gradient_checkpointing, ");
    if (ar->mem) m->be->free(ar->mem);
    ar->mem = m->be->alloc(bytes);
    ar->bytes = bytes;
    memset(&m->acts, 0, sizeof m->acts);  // they lived in the old pool
}

// per-layer slices of the arena (NULL: a buffer the model has none of)
#define LAYER(base, l, per) ((base) ? (void *)((char *)(base) + (size_t)(l) * (per)) : NULL)

void model_free_scratch(Model *m) {
    m->be->replay_forget();
    if (m->acts.mem && !m->arena.cap) m->be->free(m->acts.mem);
    memset(&m->acts, 0, sizeof m->acts);
    if (m->arena.mem) m->be->free(m->arena.mem);
    m->arena.mem = NULL;
    m->arena.bytes = m->arena.kv_bytes = 0;
    if (m->dec.mem) m->be->free(m->dec.mem);
    memset(&m->dec, 0, sizeof m->dec);
}

// ----------------------------------------------------------------------------
// a linear layer with its LoRA adapter, and its input as the products read it

// A projection's input. The plain model: the act values x. Two optimizations change what the products
// read and are kept here, so that the layer's code reads the same with them or without:
//   - frozen FP8 weights whose products quantize their input (q, k, v; gate, up; down) read one FP8 copy
//     of it (xq) that the op making the input, or one quantize_act, wrote once, where each product would
//     quantize it again (Acts.xq: shared_input; the decode step: decode_fp8_input);
//   - FP8 training with a per-tensor recipe (Acts.keep) keeps the input for the backward as the FP8 codes
//     the products read (kept), written by the first product, or by the op that made the input in its
//     place (x NULL: norm_fwd_kept, glu_to_linear). Never with an adapter (its backward reads x).
typedef struct {
    const void *x;        // (N, in) act, or NULL where the input exists as kept's codes alone
    const FP8Tensor *xq;  // x's shared FP8 copy, or NULL
    FP8Tensor *kept;      // the codes kept for the backward, or NULL
    FP8Tensor t;          // the storage xq points at when this struct made it
} LinearInput;

// out = in W^T (+ bias) (+ the adapter's product). save: a training forward (the adapter keeps its
// activation for the backward), else a decode step
static void linear_fwd(Model *m, LoRA *lo, int l, int which, void *out, const LinearInput *in, int N, int save) {
    const LayerWeights *lw = &m->w.layers[l];
    const void *bias = which <= LIN_V ? lw->bias[which] : NULL;
    if (in->xq) m->be->linear_forward_q(out, in->xq, &lw->lin[which], bias, N);
    else if (in->kept && !in->x) m->be->linear_forward_q(out, in->kept, &lw->lin[which], bias, N);  // the codes alone were made
    else if (in->kept) {
        if (!m->be->fp8_train_forward_keep(out, in->x, &lw->lin[which], bias, N, in->kept))
            die("model: layer %d's %s cannot keep its input in FP8 (not trained with a per-tensor recipe)", l, lin_names[which]);
    } else m->be->linear_forward(out, in->x, &lw->lin[which], bias, N);
    if (lo) lora_hook_forward(lo, l, which, out, in->x, N, save);
}

// dinp (= or +=) gradient through W (and the adapter); dense weight grads when allocated. in: the input
// as the forward saved it (its kept codes, where there are, read in x's place)
static void linear_bwd(Model *m, LoRA *lo, int l, int which, void *dinp, int accumulate, const void *dout,
                       const LinearInput *in, int N) {
    const LayerWeights *lw = &m->w.layers[l];
    void *dw = NULL, *db = NULL;
    if (m->grads) {
        const LayerWeights *gl = &m->gw.layers[l];
        if (lw->lin[which].gran == FP8_OFF) dw = gl->lin[which].dense;
        if (which <= LIN_V) db = gl->bias[which];
    }
    if (in->kept) m->be->fp8_train_backward_kept(dinp, accumulate, dw, db, dout, in->kept, &lw->lin[which], N);
    else m->be->linear_backward(dinp, accumulate, dw, db, dout, in->x, &lw->lin[which], N);
    if (lo) lora_hook_backward(lo, l, which, dinp, dout, in->x, N);
}

// ----------------------------------------------------------------------------
// training / scoring forward. kv, slots: also write each layer's K/V to the cache (prefill)

// the activations of layer l: with recomputation every layer uses slot 0 of the
// per-layer buffers (the arena holds one layer), and the backward recomputes them
enum { KEPT_LN1, KEPT_LN2, KEPT_HM };  // the inputs of q|k|v, gate|up and down
typedef struct {
    void *x, *xn, *ln1, *rstd1, *qpre, *kpre, *qrstd, *krstd, *q, *k, *v, *att, *lse, *xmid, *ln2, *rstd2, *gate, *up, *hm;
    void *ao, *rstda, *mo, *rstdm;  // Gemma 3's sandwich norms' inputs and rstds, else NULL
    FP8Tensor kept[3];  // Acts.keep: ln1's, ln2's and hm's FP8 codes (KEPT_*), what the backward reads of
                        // them; else zeroed
    void *rlogits, *rw, *egate, *eup;  // Qwen3 MoE (Acts), else NULL
    int32_t *ridx;
} LayerActs;

static FP8Tensor *kept(LayerActs *la, int i) { return la->kept[i].data ? &la->kept[i] : NULL; }
// ln1, ln2 or hm (KEPT_*) as the forward saved it for the backward
static LinearInput saved_input(LayerActs *la, int i) {
    LinearInput in = {i == KEPT_LN1 ? la->ln1 : i == KEPT_LN2 ? la->ln2 : la->hm, NULL, kept(la, i), {0}};
    return in;
}

// the slot of x holding layer l's input: l, or with ACTS_FORWARD_ONLY l % 2 (two slots in turn)
static int x_slot(const Model *m, int l) { return m->recompute == ACTS_FORWARD_ONLY ? l % 2 : l; }

static LayerActs layer_acts(const Model *m, int l) {
    const Config *c = &m->cfg;
    const Acts *a = &m->acts;
    size_t N = (size_t)m->B * m->T, act = dtype_size(m->be->act), hp = dtype_size(m->be->hp);
    size_t C = c->C, q = (size_t)c->NH * c->HD, kvw = (size_t)c->KVH * c->HD, FF = dense_ff(c);
    int i = m->recompute ? 0 : l, ib = a->keep ? 0 : i;  // ib: ln1, ln2 and hmlp, one layer when kept in FP8
    int ig = a->recompute_mlp ? 0 : i;                    // ig: gate and up, one layer when recomputed
    int x0 = x_slot(m, l), x1 = x_slot(m, l + 1);
    LayerActs la = {
        LAYER(a->x, x0, N * C * act), LAYER(a->x, x1, N * C * act), LAYER(a->ln1, ib, N * C * act),
        LAYER(a->rstd1, i, N * hp), NULL, NULL, NULL, NULL, LAYER(a->q, i, N * q * act), LAYER(a->k, i, N * kvw * act),
        LAYER(a->v, i, N * kvw * act), LAYER(a->att, i, N * q * act), LAYER(a->lse, i, N * c->NH * hp),
        LAYER(a->xmid, i, N * C * act), LAYER(a->ln2, ib, N * C * act), LAYER(a->rstd2, i, N * hp),
        LAYER(a->gate, ig, N * FF * act), LAYER(a->up, ig, N * FF * act), LAYER(a->hmlp, ib, N * FF * act),
        NULL, NULL, NULL, NULL, {{0}}, NULL, NULL, NULL, NULL, NULL,
    };
    if (c->gemma) {
        la.ao = LAYER(a->ao, i, N * C * act);
        la.rstda = LAYER(a->rstda, i, N * hp);
        la.mo = LAYER(a->mo, i, N * C * act);
        la.rstdm = LAYER(a->rstdm, i, N * hp);
    }
    if (a->keep) {  // (N, C) / (N, FF) codes, each with its scale in a 16-byte slot
        void *codes[3] = {LAYER(a->ln1q, i, N * C), LAYER(a->ln2q, i, N * C), LAYER(a->hq, i, N * FF)};
        int cols[3] = {c->C, c->C, c->FF};
        for (int k = 0; k < 3; k++) {
            FP8Tensor *t = &la.kept[k];
            t->rows = (int)N, t->cols = cols[k], t->gran = FP8_TENSOR, t->fmt = FP8_E4M3, t->block_rows = 1;
            t->data = (uint8_t *)codes[k];
            t->scale = (float *)LAYER(a->kscale, 3 * i + k, 16);
        }
    }
    if (c->E) {
        size_t NK = N * c->K;
        la.rlogits = LAYER(a->rlogits, i, N * c->E * act);
        la.ridx = (int32_t *)LAYER(a->ridx, i, NK * 4);
        la.rw = LAYER(a->rw, i, NK * hp);
        la.egate = LAYER(a->egate, i, NK * c->FFe * act);
        la.eup = LAYER(a->eup, i, NK * c->FFe * act);
    }
    if (c->qk_norm) {
        la.qpre = LAYER(a->qpre, i, N * q * act);
        la.kpre = LAYER(a->kpre, i, N * kvw * act);
        la.qrstd = LAYER(a->qrstd, i, N * c->NH * hp);
        la.krstd = LAYER(a->krstd, i, N * c->KVH * hp);
    }
    return la;
}

// what a layer's attention is: its softmax scale, its window (0: none), its RoPE frequencies
static double attn_scale(const Config *c) {
    return 1.0 / sqrt(c->query_pre_attn_scalar > 0 ? (double)c->query_pre_attn_scalar : (double)c->HD);
}
static int layer_window(const Config *c, int l) { return c->window > 0 && c->sliding[l] ? c->window : 0; }
static const void *layer_inv_freq(const Model *m, int l) {
    return m->inv_freq_local && m->cfg.sliding[l] ? m->inv_freq_local : m->inv_freq;
}
// every RMSNorm of the model: x * w, or Gemma's x * (1 + w)
static void norm_fwd(const Model *m, void *out, void *rstd, const void *inp, const void *w, int N, int C) {
    if (m->cfg.gemma) m->be->rmsnorm1p_forward(out, rstd, inp, w, N, C, m->cfg.eps);
    else m->be->rmsnorm_forward(out, rstd, inp, w, N, C, m->cfg.eps);
}
static void norm_bwd(const Model *m, void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                     const void *rstd, int N, int C) {
    if (m->cfg.gemma) m->be->rmsnorm1p_backward(dinp, dw, dout, inp, w, rstd, N, C);
    else m->be->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
}
// a norm whose output the projections of w's group read kept in FP8 (keep, or NULL): where the backend
// can, the norm writes the codes alone (fp8_train_norm_q) and the bf16 output is NULL; else out
static void *norm_fwd_kept(const Model *m, void *out, void *rstd, const void *inp, const void *w, int N, int C, FP8Tensor *keep,
                           const QWeight *consumer) {
    if (keep && m->be->fp8_train_norm_q && m->be->fp8_train_norm_q(keep, rstd, inp, w, N, C, m->cfg.eps, m->cfg.gemma, consumer))
        return NULL;
    norm_fwd(m, out, rstd, inp, w, N, C);
    return out;
}
// Gemma's embeddings are scaled by sqrt(hidden_size), the factor rounded to the embeddings' dtype as
// transformers rounds it (Gemma3TextScaledWordEmbedding: embed_scale.to(weight.dtype)): 33.94 is 34 in
// bf16 for hidden 1152. 1 for the others.
static float embed_scale(const Model *m) {
    if (!m->cfg.gemma) return 1.0f;
    float s = (float)sqrt((double)m->cfg.C);
    return m->be->act == DT_BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

// whether the n weights w[0 .. n-1] can read one FP8 copy of their input: each a frozen FP8 weight that
// quantizes its input, of one granularity and width
static int parts_share_codes(const QWeight *w, int n) {
    for (int i = 0; i < n; i++)
        if (!quantizes_input(&w[i]) || w[i].gran != w[0].gran || w[i].cols != w[0].cols) return 0;
    return 1;
}
// Acts.xq as the input codes of layer l's projections first .. first + n - 1 (q, k, v; gate, up; down) where
// every one of them is a frozen FP8 weight of one granularity, its buffers unwritten; else NULL (each
// product quantizes its own input)
static FP8Tensor *input_codes(Model *m, int l, int first, int n, int N, FP8Tensor *t) {
    const QWeight *w = &m->w.layers[l].lin[first];
    if (!m->acts.xq || !parts_share_codes(w, n)) return NULL;
    memset(t, 0, sizeof *t);
    act_codes(t, w, N);
    t->data = (uint8_t *)m->acts.xq;
    t->scale = (float *)m->acts.xqs;
    return t;
}
// inp (N rows) quantized once into Acts.xq for the projections of layer l's group that read it (q, k, v or
// gate, up; input_codes), or NULL. The same bytes each product would make itself (backend.h quantize_act).
static const FP8Tensor *shared_input(Model *m, int l, int first, int n, const void *inp, int N, FP8Tensor *t) {
    if (!inp || !input_codes(m, l, first, n, N, t)) return NULL;
    m->be->quantize_act(t, inp, N);
    return t;
}

// The norm whose output layer l's projections first .. first + n - 1 read (q, k, v: ln1; gate, up: ln2)
// into out, and that output as they read it (LinearInput): the act values with their shared FP8 copy,
// or (keep) the codes kept for FP8 training, which the norm may write alone
static void norm_to_linear(Model *m, int l, int first, int n, LinearInput *in, void *out, void *rstd, const void *inp,
                           const void *w, int N, FP8Tensor *keep) {
    in->x = norm_fwd_kept(m, out, rstd, inp, w, N, m->cfg.C, keep, &m->w.layers[l].lin[first]);
    in->kept = keep;
    in->xq = keep ? NULL : shared_input(m, l, first, n, in->x, N, &in->t);
}

// hm = gelu_tanh(gate) * up (Gemma 3) or silu(gate) * up, and hm as layer l's down projection reads it:
// its codes alone (keep, where the backend writes them in the GLU's pass: fp8_train_glu_q), or the act
// values with the shared FP8 copy, written in the same pass where the backend can (glu_forward_q)
static void glu_to_linear(Model *m, int l, LinearInput *in, void *hm, const void *gate, const void *up, int N,
                          FP8Tensor *keep) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    FP8Tensor *xq = keep ? NULL : input_codes(m, l, LIN_DOWN, 1, N, &in->t);
    in->x = hm, in->xq = xq, in->kept = keep;
    if (keep && be->fp8_train_glu_q && be->fp8_train_glu_q(keep, gate, up, N, c->FF, c->gemma, &m->w.layers[l].lin[LIN_DOWN]))
        in->x = NULL;
    else if (xq && be->glu_forward_q) be->glu_forward_q(hm, xq, gate, up, N, c->FF, c->gemma);
    else {
        if (c->gemma) be->geglu_forward(hm, gate, up, (size_t)N * c->FF);
        else be->swiglu_forward(hm, gate, up, (size_t)N * c->FF);
        if (xq) be->quantize_act(xq, hm, N);
    }
}

// Qwen3 MoE's sparse MLP of layer l (Qwen3MoeSparseMoeBlock): out (N, C) from its input x, the norm's
// output. The router's logits x Wr^T, each token's K experts and routing weights (softmax in fp32, the
// K largest, renormalized with norm_topk_prob), then the sum of the experts' SwiGLU outputs so weighted.
// rlogits, ridx, rw: where the routing goes; gate, up: the experts' products kept for the backward, or NULL.
// lo's adapters on the experts, if it has them, go into each routed token's products (lora_experts).
static void moe_forward(Model *m, const LoRA *lo, int l, void *out, const void *x, void *rlogits, int32_t *ridx, void *rw,
                        void *gate, void *up, int N) {
    const Config *c = &m->cfg;
    const LayerWeights *lw = &m->w.layers[l];
    ExpertLoRA xl;
    m->be->linear_forward(rlogits, x, &lw->router, NULL, N);
    m->be->moe_route(ridx, rw, rlogits, N, c->E, c->K, c->norm_topk);
    m->be->moe_experts_forward(out, gate, up, x, ridx, rw, lw->experts, N, c->E, c->K, lora_experts(lo, l, &xl));
}

// Layer l: la.x -> la.xn, saving what the backward needs in la. What each projection reads of its input
// (an FP8 copy made once, codes kept for FP8 training) is LinearInput's, made by the op before it.
static void layer_forward(Model *m, LoRA *lo, int l, LayerActs *la, KVCache *kv, const int32_t *slots_dev) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    const LayerWeights *lw = &m->w.layers[l];
    int B = m->B, T = m->T, N = B * T;
    const int32_t *pos = (const int32_t *)m->acts.pos;
    const void *inv_freq = layer_inv_freq(m, l);
    LinearInput in;

    // attention: xmid = x + o(attention(rope(q), rope(k), v)) of ln1 = rmsnorm(x)
    // (Qwen3: q and k normed per head before RoPE; Gemma 3: o's output normed before the residual add)
    norm_to_linear(m, l, LIN_Q, 3, &in, la->ln1, la->rstd1, la->x, lw->ln1, N, kept(la, KEPT_LN1));
    linear_fwd(m, lo, l, LIN_Q, c->qk_norm ? la->qpre : la->q, &in, N, 1);
    linear_fwd(m, lo, l, LIN_K, c->qk_norm ? la->kpre : la->k, &in, N, 1);
    linear_fwd(m, lo, l, LIN_V, la->v, &in, N, 1);
    if (c->qk_norm) {
        norm_fwd(m, la->q, la->qrstd, la->qpre, lw->q_norm, N * c->NH, c->HD);
        norm_fwd(m, la->k, la->krstd, la->kpre, lw->k_norm, N * c->KVH, c->HD);
    }
    be->rope_forward(la->q, pos, inv_freq, N, c->NH, c->HD);
    be->rope_forward(la->k, pos, inv_freq, N, c->KVH, c->HD);
    if (kv) {  // a prefill: this layer's K and V into the cache as well
        void *kc, *vc;
        float *ks, *vs;
        kvcache_layer(kv, l, &kc, &vc, &ks, &vs);
        be->kv_write(kc, vc, ks, vs, la->k, la->v, slots_dev, N, c->KVH, c->HD);
    }
    be->attention_forward(la->att, la->lse, la->q, la->k, la->v, B, T, c->NH, c->KVH, c->HD, attn_scale(c),
                          layer_window(c, l));
    in = (LinearInput){.x = la->att};
    linear_fwd(m, lo, l, LIN_O, c->gemma ? la->ao : la->xmid, &in, N, 1);
    if (c->gemma) norm_fwd(m, la->xmid, la->rstda, la->ao, lw->ln_attn, N, c->C);
    be->add(la->xmid, la->xmid, la->x, (size_t)N * c->C);

    // MLP: xn = xmid + down(glu(gate(ln2), up(ln2))) of ln2 = rmsnorm(xmid) (Gemma 3: down's output normed
    // before the residual add; Qwen3 MoE's sparse layer: the router and its experts in the MLP's place)
    if (c->moe[l]) {
        norm_fwd(m, la->ln2, la->rstd2, la->xmid, lw->ln2, N, c->C);
        moe_forward(m, lo, l, la->xn, la->ln2, la->rlogits, la->ridx, la->rw, la->egate, la->eup, N);
    } else {
        norm_to_linear(m, l, LIN_GATE, 2, &in, la->ln2, la->rstd2, la->xmid, lw->ln2, N, kept(la, KEPT_LN2));
        linear_fwd(m, lo, l, LIN_GATE, la->gate, &in, N, 1);
        linear_fwd(m, lo, l, LIN_UP, la->up, &in, N, 1);
        glu_to_linear(m, l, &in, la->hm, la->gate, la->up, N, kept(la, KEPT_HM));
        linear_fwd(m, lo, l, LIN_DOWN, c->gemma ? la->mo : la->xn, &in, N, 1);
        if (c->gemma) norm_fwd(m, la->xn, la->rstdm, la->mo, lw->ln_mlp, N, c->C);
    }
    be->add(la->xn, la->xn, la->xmid, (size_t)N * c->C);
}

static void forward_impl(Model *m, LoRA *lo, const int *ids_host, int B, int T, KVCache *kv, const int32_t *slots_dev) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    int N = B * T;
    if (T > c->max_pos) die("sequence of %d tokens is longer than max_position_embeddings %d", T, c->max_pos);
    for (int i = 0; i < N; i++)
        if (ids_host[i] < 0 || ids_host[i] >= c->V) die("token id %d out of range [0, %d)", ids_host[i], c->V);
    acts_ensure(m, B, T);
    if (lo && m->acts.keep)
        die("model: this layout keeps the layers' inputs as FP8 codes alone, which an adapter cannot read: set m->lora "
            "before the first forward");
    if (lo) {
        lora_ensure_acts(lo, N);
        lora_train_weights(lo);
    }
    m->acts.lora = lo;
    m->B = B;
    m->T = T;
    Acts *a = &m->acts;
    int32_t *pos = (int32_t *)mallocCheck(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) pos[i] = i % T;
    be->upload(a->ids, ids_host, N * sizeof(int32_t));
    be->upload(a->pos, pos, N * sizeof(int32_t));
    free(pos);

    be->embedding_forward(a->x, (const int32_t *)a->ids, &m->w.emb, N);
    if (c->gemma) be->scale_act(a->x, (size_t)N * c->C, embed_scale(m));
    for (int l = 0; l < c->L; l++) {
        LayerActs la = layer_acts(m, l);
        layer_forward(m, lo, l, &la, kv, slots_dev);
    }
    norm_fwd(m, a->lnf, a->rstdf, LAYER(a->x, x_slot(m, c->L), (size_t)N * c->C * dtype_size(be->act)), m->w.norm, N,
             c->C);
}

void model_forward(Model *m, LoRA *lo, const int *ids_host, int B, int T) {
    forward_impl(m, lo, ids_host, B, T, NULL, NULL);
}

// the logprobs, and with dlogp_host the head's backward (dln = dL/dlnf; the head's gradient)
static void logprobs_impl(Model *m, const int *targets_host, float inv_temp, const double *dlogp_host, double *logp_host) {
    const Backend *be = m->be;
    const Config *c = &m->cfg;
    Acts *a = &m->acts;
    int N = m->B * m->T;
    for (int i = 0; i < N; i++)
        if (targets_host[i] >= c->V) die("target id %d out of range [0, %d)", targets_host[i], c->V);
    be->upload(a->targets, targets_host, N * sizeof(int32_t));
    a->inv_temp = inv_temp;
    a->head_done = dlogp_host != NULL;
    if (!dlogp_host) be->logprobs_forward(a->logp, a->lsef, a->lnf, &m->w.head, (const int32_t *)a->targets, inv_temp, N);
    else {
        void *dwlm = m->grads ? m->gw.lm_head : NULL;
        be->upload_convert(a->dlogp, be->hp, dlogp_host, DT_F64, N);
        if (be->logprobs_fused)
            be->logprobs_fused(a->logp, a->lsef, a->dln, dwlm, a->dlogp, a->lnf, &m->w.head, (const int32_t *)a->targets,
                               inv_temp, N);
        else {
            be->logprobs_forward(a->logp, a->lsef, a->lnf, &m->w.head, (const int32_t *)a->targets, inv_temp, N);
            be->logprobs_backward(a->dln, dwlm, a->dlogp, a->lsef, a->lnf, &m->w.head, (const int32_t *)a->targets,
                                  inv_temp, N);
        }
    }
    size_t hp = dtype_size(be->hp);
    void *tmp = mallocCheck(N * hp);
    be->download(tmp, a->logp, N * hp);
    convert_to_f64(logp_host, tmp, be->hp, N);
    free(tmp);
}

void model_logprobs(Model *m, const int *targets_host, float inv_temp, double *logp_host) {
    logprobs_impl(m, targets_host, inv_temp, NULL, logp_host);
}
void model_logprobs_grad(Model *m, const int *targets_host, float inv_temp, const double *dlogp_host, double *logp_host) {
    if (!dlogp_host) die("model_logprobs_grad: dlogp is needed (model_logprobs computes the logprobs alone)");
    logprobs_impl(m, targets_host, inv_temp, dlogp_host, logp_host);
}

void model_logits(Model *m, float *logits_host) {
    const Backend *be = m->be;
    const Config *c = &m->cfg;
    int N = m->B * m->T;
    size_t hp = dtype_size(be->hp), n = (size_t)N * c->V;
    void *dev = be->alloc(n * hp);
    be->logits_forward(dev, m->acts.lnf, &m->w.head, N);
    void *tmp = mallocCheck(n * hp);
    be->download(tmp, dev, n * hp);
    convert_to_f32(logits_host, tmp, be->hp, n);
    free(tmp);
    be->free(dev);
}

// ----------------------------------------------------------------------------
// backward: the forward's loop in reverse

// moe_forward's backward: a->dln = the gradient of its input from a->dx, its output's. Through the experts
// (their input, and the routing weights' gradient), then through the weights to the router's logits and
// its input. The choice of experts is not differentiated (transformers' autograd: topk's indices have
// none), the weights it picked are. gl: the layer's weight gradients (dense experts, the router), or NULL;
// lo's adapters on the experts (if any) get theirs.
static void moe_backward(Model *m, const LoRA *lo, int l, const LayerActs *la, const LayerWeights *gl, int N) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    Acts *a = &m->acts;
    const LayerWeights *lw = &m->w.layers[l];
    const QWeight *dexperts = gl && lw->experts[0].gran == FP8_OFF ? gl->experts : NULL;  // FP8 experts: frozen
    ExpertLoRA xl;
    be->moe_experts_backward(a->dln, a->drw, dexperts, a->dx, la->ln2, la->ridx, la->rw, la->egate, la->eup, lw->experts,
                             N, c->E, c->K, lora_experts(lo, l, &xl));
    be->moe_route_backward(a->drlogits, a->drw, la->rlogits, la->ridx, N, c->E, c->K, c->norm_topk);
    be->linear_backward(a->dln, 1, gl ? gl->router.dense : NULL, NULL, a->drlogits, la->ln2, &lw->router, N);
}

// Model.recompute_mlp: layer l's gate and up products again, as its forward computed them (from ln2's kept
// codes, or from ln2 with its shared FP8 copy)
static void gate_up_again(Model *m, LoRA *lo, int l, LayerActs *la, int N) {
    LinearInput in = {NULL, NULL, kept(la, KEPT_LN2), {0}};  // the codes alone: read as they are
    if (!in.kept) in.x = la->ln2, in.xq = shared_input(m, l, LIN_GATE, 2, la->ln2, N, &in.t);
    linear_fwd(m, lo, l, LIN_GATE, la->gate, &in, N, 1);
    linear_fwd(m, lo, l, LIN_UP, la->up, &in, N, 1);
}

// the GLU's backward: dff1, dff2 (gate's and up's gradients) from dff3 (hm's); SwiGLU with FP8-trained
// gate and up in the op that quantizes them for their backward where the backend has it (swiglu_backward_q)
static void glu_bwd(Model *m, int l, const LayerActs *la, int N) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    Acts *a = &m->acts;
    const LayerWeights *lw = &m->w.layers[l];
    if (c->gemma) be->geglu_backward(a->dff1, a->dff2, a->dff3, la->gate, la->up, (size_t)N * c->FF);
    else if (!be->swiglu_backward_q || !be->swiglu_backward_q(a->dff1, a->dff2, a->dff3, la->gate, la->up, N, c->FF,
                                                               &lw->lin[LIN_GATE], &lw->lin[LIN_UP]))
        be->swiglu_backward(a->dff1, a->dff2, a->dff3, la->gate, la->up, (size_t)N * c->FF);
}

// Layer l's backward: a->dx, the gradient of its output, becomes its input's; its weights' gradients
// accumulate into gl (or NULL: none kept) and the adapter's. The forward's sequence in reverse.
static void layer_backward(Model *m, LoRA *lo, int l, LayerActs *la, const LayerWeights *gl) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    Acts *a = &m->acts;
    const LayerWeights *lw = &m->w.layers[l];
    int B = m->B, T = m->T, N = B * T;
    size_t act = dtype_size(be->act), C = c->C, q = (size_t)c->NH * c->HD, kvw = (size_t)c->KVH * c->HD;
    const void *inv_freq = layer_inv_freq(m, l);
    LinearInput in;

    // MLP: xn = xmid + down(glu(gate(ln2), up(ln2))); dx passes through the residual.
    // Gemma 3: the branch's output goes through rmsnorm_mlp first, and its activation is gelu_tanh.
    if (c->moe[l]) moe_backward(m, lo, l, la, gl, N);  // Qwen3 MoE's sparse layer
    else {
        if (a->recompute_mlp && !m->recompute) gate_up_again(m, lo, l, la, N);
        const void *dmlp = a->dx;
        if (c->gemma) {
            be->zero(a->dpost, N * C * act);
            norm_bwd(m, a->dpost, gl ? gl->ln_mlp : NULL, a->dx, la->mo, lw->ln_mlp, la->rstdm, N, c->C);
            dmlp = a->dpost;
        }
        in = saved_input(la, KEPT_HM);
        linear_bwd(m, lo, l, LIN_DOWN, a->dff3, 0, dmlp, &in, N);
        glu_bwd(m, l, la, N);
        in = saved_input(la, KEPT_LN2);
        linear_bwd(m, lo, l, LIN_GATE, a->dln, 0, a->dff1, &in, N);
        linear_bwd(m, lo, l, LIN_UP, a->dln, 1, a->dff2, &in, N);
    }
    norm_bwd(m, a->dx, gl ? gl->ln2 : NULL, a->dln, la->xmid, lw->ln2, la->rstd2, N, c->C);

    // attention: xmid = x + o(attention(rope(q), rope(k), v)) (Gemma 3: x + rmsnorm_attn(o(...)))
    const void *dattn = a->dx;
    if (c->gemma) {
        be->zero(a->dpost, N * C * act);
        norm_bwd(m, a->dpost, gl ? gl->ln_attn : NULL, a->dx, la->ao, lw->ln_attn, la->rstda, N, c->C);
        dattn = a->dpost;
    }
    in = (LinearInput){.x = la->att};
    linear_bwd(m, lo, l, LIN_O, a->datt, 0, dattn, &in, N);
    be->attention_backward(a->dq, a->dk, a->dv, a->datt, la->att, la->lse, la->q, la->k, la->v, B, T, c->NH, c->KVH, c->HD,
                           attn_scale(c), layer_window(c, l));
    be->rope_backward(a->dq, (const int32_t *)a->pos, inv_freq, N, c->NH, c->HD);
    be->rope_backward(a->dk, (const int32_t *)a->pos, inv_freq, N, c->KVH, c->HD);
    void *dqp = a->dq, *dkp = a->dk;
    if (c->qk_norm) {
        be->zero(a->dqpre, N * q * act);
        be->zero(a->dkpre, N * kvw * act);
        norm_bwd(m, a->dqpre, gl ? gl->q_norm : NULL, a->dq, la->qpre, lw->q_norm, la->qrstd, N * c->NH, c->HD);
        norm_bwd(m, a->dkpre, gl ? gl->k_norm : NULL, a->dk, la->kpre, lw->k_norm, la->krstd, N * c->KVH, c->HD);
        dqp = a->dqpre;
        dkp = a->dkpre;
    }
    in = saved_input(la, KEPT_LN1);
    linear_bwd(m, lo, l, LIN_Q, a->dln, 0, dqp, &in, N);
    linear_bwd(m, lo, l, LIN_K, a->dln, 1, dkp, &in, N);
    linear_bwd(m, lo, l, LIN_V, a->dln, 1, a->dv, &in, N);
    norm_bwd(m, a->dx, gl ? gl->ln1 : NULL, a->dln, la->x, lw->ln1, la->rstd1, N, c->C);
}

// from a->dln = dL/d(the final norm's output): the final norm into the residual gradient dx, then the
// layers in reverse
static void backward_from_hidden(Model *m, LoRA *lo) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    Acts *a = &m->acts;
    int N = m->B * m->T;
    size_t act = dtype_size(be->act), C = c->C;
    const Weights *gw = m->grads ? &m->gw : NULL;

    be->zero(a->dx, N * C * act);
    norm_bwd(m, a->dx, gw ? gw->norm : NULL, a->dln, LAYER(a->x, c->L, N * C * act), m->w.norm, a->rstdf, N, c->C);
    for (int l = c->L - 1; l >= 0; l--) {
        const LayerWeights *gl = gw ? &gw->layers[l] : NULL;
        LayerActs la = layer_acts(m, l);
        if (m->recompute) layer_forward(m, lo, l, &la, NULL, NULL);  // the layer's activations again, from its input
        layer_backward(m, lo, l, &la, gl);
        if (gl && m->layer_grads) m->layer_grads(m->layer_grads_ctx, l);  // layer l's gradients are complete
    }
    // a->dx now holds the gradient with respect to the embeddings' output (Gemma: the scaled one's)
    if (gw) {
        if (c->gemma) be->scale_act(a->dx, (size_t)N * C, embed_scale(m));
        be->embedding_backward(gw->wte, (const int32_t *)a->ids, a->dx, N, c->C);
    }
}

// the backward reads what the forward saved, the adapter's activations too: it takes the forward's adapter
static void check_adapter(const Model *m, const LoRA *lo, const char *who) {
    if (lo != m->acts.lora)
        die("%s: given %s, but the forward applied %s: pass the forward's adapter", who, lo ? "an adapter" : "no adapter",
            m->acts.lora ? (lo ? "another one" : "one") : "none");
}

void model_backward(Model *m, LoRA *lo, const double *dlogp_host) {
    const Backend *be = m->be;
    Acts *a = &m->acts;
    int N = m->B * m->T;
    check_adapter(m, lo, "model_backward");
    // the head: dlnf (already there after model_logprobs_grad), then the rest
    if ((dlogp_host == NULL) != a->head_done)
        die(a->head_done ? "model_backward: the head's gradient was made by model_logprobs_grad: pass NULL"
                         : "model_backward: dlogp is NULL but the head's gradient was not made (model_logprobs_grad)");
    if (dlogp_host) {
        be->upload_convert(a->dlogp, be->hp, dlogp_host, DT_F64, N);
        be->logprobs_backward(a->dln, m->grads ? m->gw.lm_head : NULL, a->dlogp, a->lsef, a->lnf, &m->w.head,
                              (const int32_t *)a->targets, a->inv_temp, N);
    }
    a->head_done = 0;
    backward_from_hidden(m, lo);
}

void model_backward_hidden(Model *m, LoRA *lo, const void *dh) {
    Acts *a = &m->acts;
    check_adapter(m, lo, "model_backward_hidden");
    if (dh != a->dln) m->be->copy(a->dln, dh, (size_t)m->B * m->T * m->cfg.C * dtype_size(m->be->act));
    a->head_done = 0;
    backward_from_hidden(m, lo);
}

// ----------------------------------------------------------------------------
// KV cache and decode

size_t kvcache_bytes(const Model *m, int num_blocks, int block_size) {
    const Config *c = &m->cfg;
    size_t slots = (size_t)c->L * num_blocks * block_size * c->KVH;
    return m->kv_fp8 ? 2 * slots * (c->HD + sizeof(float)) : 2 * slots * c->HD * dtype_size(m->be->act);
}

void kvcache_alloc(KVCache *kv, Model *m, int num_blocks, int block_size) {
    const Config *c = &m->cfg;
    memset(kv, 0, sizeof *kv);
    kv->L = c->L;
    kv->KVH = c->KVH;
    kv->HD = c->HD;
    kv->BS = block_size;
    kv->NB = num_blocks;
    kv->fp8 = m->kv_fp8;
    kv->esize = kv->fp8 ? 1 : dtype_size(m->be->act);
    kv->bytes = kvcache_bytes(m, num_blocks, block_size);
    Arena *ar = &m->arena;
    if (ar->cap && !ar->kv_bytes && kv->bytes <= ar->bytes) {
        kv->mem = (char *)ar->mem + (ar->bytes - kv->bytes);
        kv->in_arena = 1;
        ar->kv_bytes = kv->bytes;
        if (kv->bytes > ar->peak_kv) ar->peak_kv = kv->bytes;
        if (m->acts.mem && m->acts.bytes > ar->bytes - kv->bytes) memset(&m->acts, 0, sizeof m->acts);  // overwritten
    } else {
        kv->mem = m->be->alloc(kv->bytes);
    }
    size_t slots = (size_t)c->L * num_blocks * block_size * c->KVH, codes = slots * c->HD * kv->esize;
    kv->k = kv->mem;
    kv->v = (char *)kv->mem + codes;
    if (kv->fp8) {  // the scales after the codes (4-byte aligned: codes is a multiple of HD, even)
        kv->ks = (float *)((char *)kv->mem + 2 * codes);
        kv->vs = kv->ks + slots;
    }
}

// layer l's part of the cache
void kvcache_layer(const KVCache *kv, int l, void **kc, void **vc, float **ks, float **vs) {
    size_t slots = (size_t)kv->NB * kv->BS * kv->KVH, per = slots * kv->HD * kv->esize;
    *kc = (char *)kv->k + l * per;
    *vc = (char *)kv->v + l * per;
    *ks = kv->fp8 ? kv->ks + l * slots : NULL;
    *vs = kv->fp8 ? kv->vs + l * slots : NULL;
}

void kvcache_free(KVCache *kv, const Backend *be) {
    if (kv->mem) be->free(kv->mem);
    memset(kv, 0, sizeof *kv);
}

void kvcache_free_model(KVCache *kv, Model *m) {
    if (kv->in_arena) {
        m->arena.kv_bytes = 0;
        memset(kv, 0, sizeof *kv);
    } else kvcache_free(kv, m->be);
}

static void dec_ensure(Model *m, int S, int MB) {
    DecodeScratch *d = &m->dec;
    if (d->mem && d->cap >= S && d->mb_cap >= MB) return;
    if (d->mem) m->be->free(d->mem);
    const Config *c = &m->cfg;
    int cap = S > d->cap ? S : d->cap, mb = MB > d->mb_cap ? MB : d->mb_cap;
    size_t act = dtype_size(m->be->act), hp = dtype_size(m->be->hp);
    size_t q = (size_t)c->NH * c->HD, kvw = (size_t)c->KVH * c->HD;
    size_t wide = q > (size_t)c->C ? q : (size_t)c->C;
    size_t fused = q + 2 * kvw > 2 * (size_t)c->FF ? q + 2 * kvw : 2 * (size_t)c->FF;
    size_t qin = wide > (size_t)c->FF ? wide : (size_t)c->FF;  // the widest input quantized by its producer
    void *xq_scales;
    ASlot s[] = {
        {&d->fused, cap * fused * act},
        {&d->x, cap * c->C * act}, {&d->ln, cap * c->C * act}, {&d->q, cap * q * act}, {&d->k, cap * kvw * act},
        {&d->v, cap * kvw * act}, {&d->att, cap * q * act}, {&d->tmp, cap * wide * act},
        {&d->ff1, cap * dense_ff(c) * act}, {&d->ff2, cap * dense_ff(c) * act}, {&d->ff3, cap * dense_ff(c) * act},
        {&d->rlogits, cap * (size_t)c->E * act}, {&d->ridx, cap * (size_t)c->K * 4}, {&d->rw, cap * (size_t)c->K * hp},
        // the step's index arrays back to back (tok, pos, slots, seq_lens: cap each; block_table): one upload
        {&d->tok, ((size_t)4 * cap + (size_t)cap * mb) * 4},
        {&d->rstd, cap * (size_t)c->NH * hp},
        {(void **)&d->xq.data, cap * qin}, {&xq_scales, cap * ((qin + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE) * 4},
        {&d->logits, (size_t)cap * c->V * hp},
    };
    size_t ns = sizeof s / sizeof s[0], total = 0;
    for (size_t i = 0; i < ns; i++) total += al256(s[i].bytes);
    d->mem = m->be->alloc(total);
    d->bytes = total;
    char *p = (char *)d->mem;
    for (size_t i = 0; i < ns; i++) {
        *s[i].ptr = p;
        p += al256(s[i].bytes);
    }
    d->xq.scale = (float *)xq_scales;
    int32_t *ix = (int32_t *)d->tok;
    d->pos = ix + cap;
    d->slots = ix + 2 * cap;
    d->seq_lens = ix + 3 * cap;
    d->block_table = ix + 4 * cap;
    d->cap = cap;
    d->mb_cap = mb;
}

void model_prefill(Model *m, LoRA *lo, KVCache *kv, const int *ids_host, const int *lens_host, const int *slots_host, int B,
                   int T, void *logits) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    dec_ensure(m, B, 1);
    // no backward follows, so one layer's buffers and two of x do (ACTS_FORWARD_ONLY): a prefill of
    // 64 x 128 tokens of an 8B model would otherwise hold 36 layers of activations (~36 GiB), and with
    // recomputation's layout still 37 layers of x and the backward's buffers (1.08 -> 0.29 GiB for
    // 8 prompts of 256 tokens)
    int recompute = m->recompute;
    m->recompute = ACTS_FORWARD_ONLY;
    acts_ensure(m, B, T);
    // slots go through the arena's targets buffer (unused by a prefill)
    be->upload(m->acts.targets, slots_host, (size_t)B * T * sizeof(int32_t));
    forward_impl(m, lo, ids_host, B, T, kv, (const int32_t *)m->acts.targets);
    m->recompute = recompute;
    int32_t *last = (int32_t *)mallocCheck(B * sizeof(int32_t));
    for (int b = 0; b < B; b++) {
        if (lens_host[b] < 1 || lens_host[b] > T) die("prefill: prompt length %d outside [1, %d]", lens_host[b], T);
        last[b] = b * T + lens_host[b] - 1;
    }
    be->upload(m->dec.pos, last, B * sizeof(int32_t));
    free(last);
    be->gather_rows(m->dec.ln, m->acts.lnf, (const int32_t *)m->dec.pos, B, c->C);
    be->logits_forward(logits, m->dec.ln, &m->w.head, B);
}

// The compute of one decode step for S rows already uploaded to m->dec: what the backend replays.
// Logits (S, V) into d->logits.
typedef struct {
    Model *m;
    LoRA *lo;
    KVCache *kv;
    int S, MB;
} DecodeStep;

// the decode step's groups of projections that share their input: 0 = q, k, v; 1 = gate, up
static const int GROUP_FIRST[2] = {LIN_Q, LIN_GATE}, GROUP_N[2] = {3, 2};

// The decode step's projections of a group of layer l that share their input (group 0: q, k, v; 1:
// gate, up). Where the model has the group's fused weight (the parts' codes and scales back to back:
// model_load.c fuse_views), one GEMM into d->fused, and the adapters, unmerged, as one product for the
// group (lora_group_act); returns d->fused (N, the parts' widths summed). Where it has not (per-tensor
// scales, or block scales whose boundaries do not line up), one GEMM and adapter per part into
// parts[i]; returns NULL.
// in: the group's input as the products read it (decode_add_norm): its FP8 copy, where there is one, for
// the fused weight or for every part.
static void *decode_project(Model *m, LoRA *lo, int l, int group, void *const *parts, const LinearInput *in, int N) {
    const LayerWeights *lw = &m->w.layers[l];
    const QWeight *fw = group == 0 ? &lw->qkv : &lw->gateup;
    int first = GROUP_FIRST[group], n = GROUP_N[group];
    if (!fw->rows) {
        for (int i = 0; i < n; i++) linear_fwd(m, lo, l, first + i, parts[i], in, N, 0);
        return NULL;
    }
    void *fused = m->dec.fused;
    const void *bias = group == 0 ? lw->bias_qkv : NULL;
    if (in->xq) m->be->linear_forward_q(fused, in->xq, fw, bias, N);
    else m->be->linear_forward(fused, in->x, fw, bias, N);
    const void *A, *B;
    int R = lo ? lora_group_act(lo, l, group, &A, &B) : 0;
    if (R) m->be->lora_apply(fused, in->x, A, B, lo->scale, N, fw->cols, R, fw->rows);
    return fused;
}

// The FP8 copy of the decode step's input to w (S rows), for the op that makes that input to write in
// the same pass (add_rmsnorm, attention_decode, glu_gu: backend.h outq): where w is a fused or plain FP8 weight
// whose activations are quantized a row or a 1x128 group at a time. NULL where w quantizes its input
// itself (BF16 weights, per-tensor scales: the amax of the whole input first, parts not fused).
static FP8Tensor *decode_fp8_input(Model *m, const QWeight *w, int S) {
    if (!w || !quantizes_input(w)) return NULL;
    act_codes(&m->dec.xq, w, S);
    return &m->dec.xq;
}
// the weight whose input codes layer l's group (0: q|k|v, 1: gate|up) reads in a decode step: the fused one,
// else the first part where every part reads one copy (parts_share_codes), else NULL
static const QWeight *group_input(const Model *m, int l, int group) {
    const LayerWeights *lw = &m->w.layers[l];
    const QWeight *fw = group == 0 ? &lw->qkv : &lw->gateup, *w = &lw->lin[GROUP_FIRST[group]];
    if (fw->rows) return fw;
    return parts_share_codes(w, GROUP_N[group]) ? w : NULL;
}

// The decode step's ops that make a projection's input, each with the FP8 copy of it written in the same
// pass (backend.h outq) where the weight reads one (decode_fp8_input), and that input as the projections
// read it (LinearInput), as norm_to_linear and glu_to_linear are the training forward's. They share one
// buffer for the copy (d->xq), each written after the last product that read the one before.

// the residual add d->x += d->tmp and the norm w of the sum into d->ln, one op (add_rmsnorm), and d->ln
// as layer l's group (0: q|k|v, 1: gate|up) reads it; l == L: the final norm, no copy
static void decode_add_norm(Model *m, int l, int group, LinearInput *in, const void *w, int S) {
    const Config *c = &m->cfg;
    DecodeScratch *d = &m->dec;
    FP8Tensor *xq = l < c->L ? decode_fp8_input(m, group_input(m, l, group), S) : NULL;
    m->be->add_rmsnorm(d->x, d->ln, d->rstd, d->tmp, w, S, c->C, c->eps, c->gemma, xq);
    *in = (LinearInput){.x = d->ln, .xq = xq};
}

// attention over the cache of layer l (kc, vc, ks, vs: kvcache_layer; this token's K and V already in it)
// into d->att, and d->att as layer l's o projection reads it
static void decode_attention(const DecodeStep *st, int l, LinearInput *in, const void *kc, const void *vc, const float *ks,
                             const float *vs) {
    Model *m = st->m;
    const Config *c = &m->cfg;
    DecodeScratch *d = &m->dec;
    FP8Tensor *xq = decode_fp8_input(m, &m->w.layers[l].lin[LIN_O], st->S);
    m->be->attention_decode(d->att, d->q, kc, vc, ks, vs, (const int32_t *)d->block_table, (const int32_t *)d->seq_lens, st->S,
                            c->NH, c->KVH, c->HD, st->kv->BS, st->MB, attn_scale(c), layer_window(c, l), xq);
    *in = (LinearInput){.x = d->att, .xq = xq};
}

// hm = silu(gate) * up (Gemma 3: gelu_tanh) into d->ff3, and hm as layer l's down projection reads it.
// fused: the fused gate|up product (decode_project), which glu_gu reads, writing the copy in its pass;
// NULL: the two halves in d->ff1 and d->ff2, and no copy (down quantizes its input itself)
static void decode_glu(Model *m, int l, LinearInput *in, const void *fused, int S) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    DecodeScratch *d = &m->dec;
    FP8Tensor *xq = fused ? decode_fp8_input(m, &m->w.layers[l].lin[LIN_DOWN], S) : NULL;
    if (fused) be->glu_gu(d->ff3, xq, fused, S, c->FF, c->gemma);
    else if (c->gemma) be->geglu_forward(d->ff3, d->ff1, d->ff2, (size_t)S * c->FF);
    else be->swiglu_forward(d->ff3, d->ff1, d->ff2, (size_t)S * c->FF);
    *in = (LinearInput){.x = d->ff3, .xq = xq};
}

// A decode step's attention inputs for layer l: q (S, NH, HD) normed and rotated in d->q, this
// token's k and v in the cache (kc, vc, ks, vs: kvcache_layer). in: d->ln as q|k|v read it.
static void decode_qkv(Model *m, LoRA *lo, int l, int S, const LinearInput *in, void *kc, void *vc, float *ks, float *vs) {
    const Config *c = &m->cfg;
    const LayerWeights *lw = &m->w.layers[l];
    DecodeScratch *d = &m->dec;
    int q = c->NH * c->HD, kvw = c->KVH * c->HD;
    void *parts[3] = {d->q, d->k, d->v};
    const char *fused = (const char *)decode_project(m, lo, l, 0, parts, in, S);
    size_t act = dtype_size(m->be->act);
    const void *qin = fused ? fused : d->q, *kin = fused ? fused + q * act : d->k, *vin = fused ? fused + (q + kvw) * act : d->v;
    int ldq = fused ? q + 2 * kvw : q, ldkv = fused ? q + 2 * kvw : kvw;
    m->be->qkv_rope_kv(d->q, d->k, qin, kin, vin, ldq, ldkv, c->qk_norm ? lw->q_norm : NULL, c->qk_norm ? lw->k_norm : NULL,
                       c->gemma, (const int32_t *)d->pos, layer_inv_freq(m, l), kc, vc, ks, vs, (const int32_t *)d->slots, S, c->NH, c->KVH,
                       c->HD, c->eps);
}

// Layer l of a decode step on m->dec: in, the residual stream d->x and its normed copy d->ln as q|k|v read
// it (the previous add_rmsnorm's); out, the same for the next layer (or the final norm). What each
// projection reads of its input (an FP8 copy written by the op that made the input) is LinearInput's,
// made by the op before it. Gemma 3: its norms are x * (1 + w) (norm1p, gelu below), and each branch's
// output is normed before the residual add (its sandwich norms: plain ops).
static void decode_layer(const DecodeStep *st, int l, LinearInput *in) {
    Model *m = st->m;
    LoRA *lo = st->lo;
    int S = st->S;
    const Config *c = &m->cfg;
    const LayerWeights *lw = &m->w.layers[l];
    DecodeScratch *d = &m->dec;
    void *kc, *vc;
    float *ks, *vs;
    kvcache_layer(st->kv, l, &kc, &vc, &ks, &vs);

    // attention: x += o(attention(rope(q), the cache with this token's rope(k), v)) of ln; ln = rmsnorm(x)
    decode_qkv(m, lo, l, S, in, kc, vc, ks, vs);
    decode_attention(st, l, in, kc, vc, ks, vs);
    linear_fwd(m, lo, l, LIN_O, d->tmp, in, S, 0);
    if (c->gemma) norm_fwd(m, d->tmp, d->rstd, d->tmp, lw->ln_attn, S, c->C);
    decode_add_norm(m, l, 1, in, lw->ln2, S);

    // MLP: x += down(glu(gate|up(ln))); ln = the next layer's rmsnorm(x) (or the final norm's)
    if (c->moe[l])  // Qwen3 MoE's sparse layer (in.xq is NULL: no FP8 copy of its input is made for it)
        moe_forward(m, lo, l, d->tmp, d->ln, d->rlogits, (int32_t *)d->ridx, d->rw, NULL, NULL, S);
    else {
        void *gu[2] = {d->ff1, d->ff2};
        const void *fused = decode_project(m, lo, l, 1, gu, in, S);
        decode_glu(m, l, in, fused, S);
        linear_fwd(m, lo, l, LIN_DOWN, d->tmp, in, S, 0);
    }
    if (c->gemma) norm_fwd(m, d->tmp, d->rstd, d->tmp, lw->ln_mlp, S, c->C);
    decode_add_norm(m, l + 1, 0, in, l + 1 < c->L ? m->w.layers[l + 1].ln1 : m->w.norm, S);
}

static void decode_compute(void *arg) {
    const DecodeStep *st = (const DecodeStep *)arg;
    Model *m = st->m;
    int S = st->S;
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    DecodeScratch *d = &m->dec;
    be->embedding_forward(d->x, (const int32_t *)d->tok, &m->w.emb, S);
    if (c->gemma) be->scale_act(d->x, (size_t)S * c->C, embed_scale(m));
    norm_fwd(m, d->ln, d->rstd, d->x, m->w.layers[0].ln1, S, c->C);
    LinearInput in = {.x = d->ln};  // (layer 0's q|k|v quantize their input themselves)
    for (int l = 0; l < c->L; l++) decode_layer(st, l, &in);
    be->logits_forward(d->logits, d->ln, &m->w.head, S);
}

// what a recorded decode step depends on: every buffer and size it saw (backend.h replay)
typedef struct {
    const void *dec, *kv_k, *kv_v, *lora, *lora_act;
    int S, MB, dec_cap, kv_nb, kv_bs;
    int zero;  // 0: the struct has no padding
} DecodeKey;
_Static_assert(sizeof(DecodeKey) == 5 * sizeof(void *) + 6 * sizeof(int), "no padding: keys are compared as bytes");

void model_decode(Model *m, LoRA *lo, KVCache *kv, const int *tokens_host, const int *pos_host, const int *slots_host,
                  const int *block_table_host, int S, int MB, void *logits) {
    const Config *c = &m->cfg;
    const Backend *be = m->be;
    int Sp = m->no_graphs ? S : be->replay_rows(S);  // rows computed; rows S..Sp-1 are padding
    void *mem_before = m->dec.mem;
    dec_ensure(m, Sp, MB);
    if (m->dec.mem != mem_before) be->replay_forget();  // the scratch moved: recordings point at the old one
    if (lo && !lo->act_valid) lora_sync_act(lo);  // the decode step reads the act copies
    DecodeScratch *d = &m->dec;
    // packed as the device region is (dec_ensure): four arrays of cap, then the table (Sp, MB)
    int cap = d->cap;
    size_t nix = (size_t)4 * cap + (size_t)Sp * MB;
    int32_t *h = (int32_t *)callocCheck(nix, sizeof(int32_t));
    int32_t *tok = h, *pos = h + cap, *slot = h + 2 * cap, *lens = h + 3 * cap, *table = h + 4 * cap;
    for (int s = 0; s < Sp; s++) {
        int real = s < S;
        if (real && (tokens_host[s] < 0 || tokens_host[s] >= c->V)) die("decode: token id %d out of range", tokens_host[s]);
        if (real && pos_host[s] >= c->max_pos) die("decode: position %d beyond max_position_embeddings %d", pos_host[s], c->max_pos);
        // padding: token 0 at position 0, written nowhere (slot -1), attending to one cached token of block 0
        tok[s] = real ? tokens_host[s] : 0;
        pos[s] = real ? pos_host[s] : 0;
        slot[s] = real ? slots_host[s] : -1;
        lens[s] = real ? pos_host[s] + 1 : 1;
        for (int b = 0; b < MB; b++) table[(size_t)s * MB + b] = real ? block_table_host[(size_t)s * MB + b] : 0;
    }
    be->upload(d->tok, h, nix * sizeof(int32_t));
    free(h);
    DecodeStep step = {m, lo, kv, Sp, MB};
    if (m->no_graphs) decode_compute(&step);
    else {
        DecodeKey key = {d->mem, kv->k, kv->v, lo, lo ? lo->act_mem : NULL, Sp, MB, d->cap, kv->NB, kv->BS, 0};
        be->replay(&key, sizeof key, decode_compute, &step);
    }
    be->copy(logits, d->logits, (size_t)S * c->V * dtype_size(be->hp));
}
