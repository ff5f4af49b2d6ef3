// model_alloc.c: the model's memory, from a Config to a Model and back. Defines the weight layout (one
// allocation for the dense weights, one for the FP8 codes and scales; the fused q|k|v and gate|up
// views), model_common_init (a Model of a config with its weights allocated, unset, and its RoPE
// frequencies: what io/model_load.c fills from a checkpoint and model_init_random at random),
// model_free, FP8 training's state (model_fp8_train), and the dense weights' gradients
// (model_alloc_grads). The shapes of a layer's projections and experts (lin_shape, expert_shape).
#include <math.h>

#include "model.h"

// ----------------------------------------------------------------------------
// weight layout: one table of slots per allocation, a walker sets the pointers.
// Every tensor starts on a 256-byte boundary (vector loads, cuBLASLt alignment), but for the FP8 scales: on
// a 16-byte one (slot_add_scales), so that the scales of gate and up lie back to back and fuse
// (fuse_views) where a 256-byte boundary would leave a gap (60 floats at SmolLM2-135M's shape).

typedef struct {
    void **ptr;
    size_t bytes, align;
} Slot;
typedef struct {
    Slot *s;
    int n, cap;
    size_t esize;  // element size of the table's slots (act or hp), 0: bytes (FP8 codes and scales)
} SlotTable;

static void slot_add(SlotTable *t, void **ptr, size_t bytes) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->s = (Slot *)reallocCheck(t->s, t->cap * sizeof(Slot));
    }
    t->s[t->n++] = (Slot){ptr, bytes, 256};
}
static void slot_add_scales(SlotTable *t, void **ptr, size_t bytes) {
    slot_add(t, ptr, bytes);
    t->s[t->n - 1].align = 16;
}
static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
// a slot's bytes, in a table of elements a multiple of 128 of them, so that the dense weights (act) and
// their gradients and master copies (hp) have every tensor at the same element offset: full-weight
// training updates them as one flat array (full_finetune.c)
static size_t slot_room(const SlotTable *t, const Slot *s) {
    return t->esize ? (s->bytes / t->esize + 127) / 128 * 128 * t->esize : s->bytes;
}
// where slot k starts (k = t->n: the table's bytes, a whole 256): each slot on its alignment after the last
static size_t slots_before(const SlotTable *t, int k) {
    size_t off = 0;
    for (int i = 0; i < k; i++) off = align_up(off, t->s[i].align) + slot_room(t, &t->s[i]);
    return align_up(off, k < t->n ? t->s[k].align : 256);
}
static size_t slots_total(const SlotTable *t) { return slots_before(t, t->n); }
// the slots from base on, one after another; past byte `wrap` (0: never) every wrap_len bytes start
// again at wrap (the layers' gradients in one bucket: model_alloc_grads_bucket)
static void slots_point(const SlotTable *t, void *base, size_t wrap, size_t wrap_len) {
    size_t off = 0;
    for (int i = 0; i < t->n; i++) {
        off = align_up(off, t->s[i].align);
        *t->s[i].ptr = (char *)base + (wrap && off >= wrap ? wrap + (off - wrap) % wrap_len : off);
        off += slot_room(t, &t->s[i]);
    }
}

// which granularity layer l's linears get under the options
static FP8Gran layer_gran(const ModelOptions *o, int l, int L) {
    if (l < o->bf16_first || l >= L - o->bf16_last) return FP8_OFF;
    return o->gran;
}

void lin_shape(const Config *c, int which, int *rows, int *cols) {
    int q = c->NH * c->HD, kv = c->KVH * c->HD;
    switch (which) {
        case LIN_Q: *rows = q; *cols = c->C; break;
        case LIN_K:
        case LIN_V: *rows = kv; *cols = c->C; break;
        case LIN_O: *rows = c->C; *cols = q; break;
        case LIN_GATE:
        case LIN_UP: *rows = c->FF; *cols = c->C; break;
        default: *rows = c->C; *cols = c->FF; break;
    }
}

// Build the tables of both allocations for config c and allocate them.
// grads: a mirror of the dense part in hp (for full fine-tuning / gradient checks).
// out = parts[0..n-1] as one weight (rows summed) when they lie back to back: dense values, or FP8
// codes and scales where the scales concatenate (row; blocks of 128 whole rows), else rows = 0.
// Per-tensor scales differ between the parts, so TENSOR never fuses.
static void fuse_views(QWeight *out, const QWeight *parts, int n, size_t act) {
    memset(out, 0, sizeof *out);
    const QWeight *p0 = &parts[0];
    int rows = 0;
    for (int i = 0; i < n; i++) {
        const QWeight *p = &parts[i];
        if (p->gran != p0->gran || p->cols != p0->cols || p->gran == FP8_TENSOR) return;
        if (p->gran == FP8_BLOCK && i < n - 1 && p->rows % FP8_BLOCK_SIZE) return;
        if (i > 0) {
            const QWeight *q = &parts[i - 1];
            if (p->gran == FP8_OFF) {
                if ((char *)q->dense + (size_t)q->rows * q->cols * act != (char *)p->dense) return;
            } else {
                size_t ns = fp8_num_scales(q->gran, q->rows, q->cols, FP8_BLOCK_SIZE);
                if (q->q.data + (size_t)q->rows * q->cols != p->q.data || q->q.scale + ns != p->q.scale) return;
            }
        }
        rows += p->rows;
    }
    *out = *p0;
    out->rows = rows;
    out->q.rows = rows;
}

// q (rows, cols) held at granularity g: a dense slot, or its FP8 codes and then their scales
static void weight_slots(SlotTable *dense, SlotTable *fp8, QWeight *q, int rows, int cols, FP8Gran g, size_t act,
                         size_t *linear_bytes) {
    *q = (QWeight){.rows = rows, .cols = cols, .gran = g};
    if (g == FP8_OFF) {
        slot_add(dense, &q->dense, (size_t)rows * cols * act);
        *linear_bytes += (size_t)rows * cols * act;
        return;
    }
    q->q = (FP8Tensor){.rows = rows, .cols = cols, .gran = g, .fmt = FP8_E4M3, .block_rows = FP8_BLOCK_SIZE};
    size_t ns = fp8_num_scales(g, rows, cols, FP8_BLOCK_SIZE);
    slot_add(fp8, (void **)&q->q.data, (size_t)rows * cols);
    slot_add_scales(fp8, (void **)&q->q.scale, ns * sizeof(float));
    *linear_bytes += (size_t)rows * cols + ns * sizeof(float);
}

// the shape of expert weight k (0 gate, 1 up, 2 down)
void expert_shape(const Config *c, int k, int *rows, int *cols) {
    *rows = k < 2 ? c->FFe : c->C;
    *cols = k < 2 ? c->C : c->FFe;
}

// bucket (with dense_only_hp: gradients): the dense part allocated only up to the end of layer 0, every
// layer's slots pointing into layer 0's (model_alloc_grads_bucket); w->dense_bytes is what was allocated
static void weights_layout(Weights *w, const Config *c, const ModelOptions *o, const Backend *be, int dense_only_hp,
                           int bucket) {
    size_t act = dtype_size(dense_only_hp ? be->hp : be->act);
    SlotTable dense = {NULL, 0, 0, act}, fp8 = {NULL, 0, 0, 0};
    memset(w, 0, sizeof *w);
    w->layers = (LayerWeights *)callocCheck(c->L, sizeof(LayerWeights));
    int n_sparse = 0;
    for (int l = 0; l < c->L; l++) n_sparse += c->moe[l];
    if (n_sparse) w->experts = (QWeight *)callocCheck((size_t)n_sparse * c->E * 3, sizeof(QWeight));
    // the embedding table and the LM head: dense, or FP8 rows (codes, then the row scales)
    int fp8_embed = o->fp8_embed && !dense_only_hp;
    QWeight *vw[2] = {&w->emb, c->tied ? NULL : &w->head};
    void **vdense[2] = {&w->wte, &w->lm_head};
    for (int i = 0; i < 2; i++) {
        if (!vw[i]) continue;
        *vw[i] = (QWeight){.rows = c->V, .cols = c->C, .gran = fp8_embed ? FP8_ROW : FP8_OFF};
        if (!fp8_embed) {
            slot_add(&dense, vdense[i], (size_t)c->V * c->C * act);
            continue;
        }
        vw[i]->q = (FP8Tensor){.rows = c->V, .cols = c->C, .gran = FP8_ROW, .fmt = FP8_E4M3, .block_rows = FP8_BLOCK_SIZE};
        slot_add(&fp8, (void **)&vw[i]->q.data, (size_t)c->V * c->C);
        slot_add(&fp8, (void **)&vw[i]->q.scale, (size_t)c->V * sizeof(float));
    }
    slot_add(&dense, &w->norm, (size_t)c->C * act);
    if (c->num_labels) slot_add(&dense, &w->score, (size_t)c->num_labels * c->C * act);
    int layer_slot[2] = {0, 0};  // the dense slots where layers 0 and 1 begin
    for (int l = 0, sparse = 0; l < c->L; l++) {
        if (l < 2) layer_slot[l] = dense.n;
        LayerWeights *lw = &w->layers[l];
        slot_add(&dense, &lw->ln1, (size_t)c->C * act);
        slot_add(&dense, &lw->ln2, (size_t)c->C * act);
        if (c->gemma) {
            slot_add(&dense, &lw->ln_attn, (size_t)c->C * act);
            slot_add(&dense, &lw->ln_mlp, (size_t)c->C * act);
        }
        if (c->qk_norm) {
            slot_add(&dense, &lw->q_norm, (size_t)c->HD * act);
            slot_add(&dense, &lw->k_norm, (size_t)c->HD * act);
        }
        if (c->qkv_bias)  // one slot: q|k|v biases back to back (the fused projection's bias)
            slot_add(&dense, &lw->bias[0], (size_t)(c->NH + 2 * c->KVH) * c->HD * act);
        FP8Gran g = dense_only_hp ? FP8_OFF : layer_gran(o, l, c->L);
        // a layer's seven codes blocks first, then their scales, in projection order, so that
        // q|k|v and gate|up can lie back to back (fuse_views)
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < LIN_COUNT; i++) {
                QWeight *q = &lw->lin[i];
                if (c->moe[l] && i >= LIN_GATE) continue;  // the experts in place of the MLP: below
                lin_shape(c, i, &q->rows, &q->cols);
                q->gran = g;
                if (g == FP8_OFF) {
                    if (pass) continue;
                    slot_add(&dense, &q->dense, (size_t)q->rows * q->cols * act);
                    w->linear_bytes += (size_t)q->rows * q->cols * act;
                } else {
                    q->q.rows = q->rows;
                    q->q.cols = q->cols;
                    q->q.gran = g;
                    q->q.fmt = FP8_E4M3;
                    q->q.block_rows = FP8_BLOCK_SIZE;
                    size_t ns = fp8_num_scales(g, q->rows, q->cols, FP8_BLOCK_SIZE);
                    if (!pass) slot_add(&fp8, (void **)&q->q.data, (size_t)q->rows * q->cols);
                    else slot_add_scales(&fp8, (void **)&q->q.scale, ns * sizeof(float));
                    if (pass) w->linear_bytes += (size_t)q->rows * q->cols + ns * sizeof(float);
                }
            }
        if (c->moe[l]) {  // the router (dense) and each expert's three weights
            weight_slots(&dense, &fp8, &lw->router, c->E, c->C, FP8_OFF, act, &w->linear_bytes);
            lw->experts = w->experts + (size_t)sparse++ * c->E * 3;
            for (int e = 0; e < c->E; e++)
                for (int k = 0; k < 3; k++) {
                    int rows, cols;
                    expert_shape(c, k, &rows, &cols);
                    weight_slots(&dense, &fp8, &lw->experts[3 * e + k], rows, cols, g, act, &w->linear_bytes);
                }
        }
    }
    w->dense_bytes = slots_total(&dense);
    w->fp8_bytes = slots_total(&fp8);
    size_t wrap = 0, wrap_len = 0;
    if (bucket) {
        wrap = slots_before(&dense, layer_slot[0]);
        wrap_len = (c->L > 1 ? slots_before(&dense, layer_slot[1]) : w->dense_bytes) - wrap;
        w->bucket_at = wrap, w->bucket_bytes = wrap_len;
        w->dense_bytes = wrap + wrap_len;
    }
    w->dense_mem = be->alloc(w->dense_bytes);
    be->zero(w->dense_mem, w->dense_bytes);  // the padding between tensors too: full_finetune.c steps it as weights
    slots_point(&dense, w->dense_mem, wrap, wrap_len);
    if (w->fp8_bytes) {
        w->fp8_mem = be->alloc(w->fp8_bytes);
        slots_point(&fp8, w->fp8_mem, 0, 0);
    }
    w->emb.dense = w->wte;
    w->head.dense = w->lm_head;
    if (c->tied) w->lm_head = w->wte, w->head = w->emb;
    free(dense.s);
    free(fp8.s);
    for (int l = 0; l < c->L; l++) {
        LayerWeights *lw = &w->layers[l];
        fuse_views(&lw->qkv, lw->lin + LIN_Q, 3, act);
        if (!c->moe[l]) fuse_views(&lw->gateup, lw->lin + LIN_GATE, 2, act);
        if (c->qkv_bias) {
            lw->bias[1] = (char *)lw->bias[0] + (size_t)c->NH * c->HD * act;
            lw->bias[2] = (char *)lw->bias[1] + (size_t)c->KVH * c->HD * act;
            lw->bias_qkv = lw->bias[0];
        }
    }
}

void model_common_init(Model *m, const Config *c, const Backend *be, const ModelOptions *opt) {
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->be = be;
    if (opt) m->opt = *opt;
    if (m->opt.gran < FP8_OFF || m->opt.gran > FP8_BLOCK) die("bad FP8 granularity");
    if (c->E && !be->moe_experts_forward)
        die("qwen3_moe: the %s backend has no mixture-of-experts products yet (the experts' grouped GEMMs): run it on "
            "the CPU reference backend (--device cpu)", be->name);
    weights_layout(&m->w, c, &m->opt, be, 0, 0);

    // RoPE inverse frequencies, with llama3 scaling (transformers' _compute_llama3_parameters):
    // wavelengths shorter than original_max / high_freq_factor stay, longer than
    // original_max / low_freq_factor are divided by factor, the band between is interpolated.
    // Linear scaling (Gemma 3's full layers) divides every frequency by factor. Gemma 3's sliding layers
    // have their own base, unscaled (inv_freq_local).
    int half = c->HD / 2;
    double *f = (double *)mallocCheck(half * sizeof(double));
    if (c->rope_local_theta > 0) {
        for (int i = 0; i < half; i++) f[i] = 1.0f / powf(c->rope_local_theta, (float)(2 * i) / (float)c->HD);
        m->inv_freq_local = be->alloc(half * dtype_size(be->hp));
        be->upload_convert(m->inv_freq_local, be->hp, f, DT_F64, half);
    }
    for (int i = 0; i < half; i++) {
        // as transformers: 1 / theta^(arange(0, HD, 2) / HD), computed in fp32
        float e = (float)(2 * i) / (float)c->HD;
        float inv = 1.0f / powf(c->rope_theta, e);
        double x = inv;
        if (c->rope_scaling == 2) x = inv / c->rope_factor;  // fp32 division, as transformers' inv_freq /= factor
        if (c->rope_scaling == 1) {
            double lo_wl = c->rope_original_max_pos / c->rope_low_freq_factor;
            double hi_wl = c->rope_original_max_pos / c->rope_high_freq_factor;
            double wl = 2 * M_PI / inv;
            if (wl > lo_wl) x = inv / c->rope_factor;
            else if (wl >= hi_wl) {
                double smooth = (c->rope_original_max_pos / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                x = (1 - smooth) * inv / c->rope_factor + smooth * inv;
            }
            x = (float)x;
        }
        f[i] = x;
    }
    m->inv_freq = be->alloc(half * dtype_size(be->hp));
    be->upload_convert(m->inv_freq, be->hp, f, DT_F64, half);
    free(f);
}

void model_free(Model *m) {
    const Backend *be = m->be;
    if (!be) return;
    if (m->w.dense_mem) be->free(m->w.dense_mem);
    if (m->w.fp8_mem) be->free(m->w.fp8_mem);
    free(m->w.layers);
    free(m->w.experts);
    if (m->grads) be->free(m->grads);
    free(m->gw.layers);
    free(m->gw.experts);
    if (m->inv_freq) be->free(m->inv_freq);
    if (m->inv_freq_local) be->free(m->inv_freq_local);
    for (int i = 0; i < m->n_fp8_train; i++) be->fp8_train_free(m->fp8_train[i]);
    free(m->fp8_train);
    free(m->src_dir);
    model_free_scratch(m);
    memset(m, 0, sizeof *m);
}

void model_fp8_train(Model *m, const FP8Recipe *r) {
    const Backend *be = m->be;
    if (m->cfg.E) die("FP8 training (--fp8_recipe) of a qwen3_moe model is not supported: use --fp8_recipe off");
    if (!be->fp8_train_new)
        die("FP8 training (--fp8_recipe) runs on the GPU (the %s backend has no FP8 GEMMs): use --device cuda, or "
            "--fp8_recipe off to train in BF16", be->name);
    int L = m->cfg.L, first = m->opt.bf16_first, last = m->opt.bf16_last;
    m->fp8_train = (FP8Train **)callocCheck((size_t)L * LIN_COUNT + 1, sizeof(FP8Train *));
    for (int l = first; l < L - last; l++)
        for (int i = 0; i < LIN_COUNT; i++) {
            QWeight *w = &m->w.layers[l].lin[i];
            if (w->gran != FP8_OFF) die("FP8 training updates the weights, and layer %d's are FP8 (frozen): load with --load_in_fp8 off", l);
            char why[256];
            // k and v read q's input, up reads gate's: one FP8 copy of it (fp8_train.cu)
            FP8Train *leader = i == LIN_K || i == LIN_V ? m->w.layers[l].lin[LIN_Q].train : i == LIN_UP ? m->w.layers[l].lin[LIN_GATE].train : NULL;
            if (!(w->train = be->fp8_train_new(w, r, leader, why, sizeof why))) die("--fp8_recipe: %s: use --fp8_recipe off to train in BF16", why);
            m->fp8_train[m->n_fp8_train++] = w->train;
        }
    if (r->lm_head) {  // the head's three products too (fp8_train.cu); its state is the list's last
        QWeight *w = &m->w.head;
        if (r->kind != FP8_RECIPE_DELAYED)
            die("--fp8_lm_head takes delayed scaling (its logits' gradient is quantized as it is made, with a scale known "
                "before): use --fp8_recipe delayed, or drop --fp8_lm_head");
        if (w->gran != FP8_OFF) die("--fp8_lm_head trains the LM head, and it is FP8 (frozen): drop --fp8_embeddings");
        if (m->cfg.V % 8)
            die("--fp8_lm_head: the vocabulary (%d) is not a multiple of 8, which the FP8 head's kernels read 8 at a time: drop "
                "--fp8_lm_head", m->cfg.V);
        char why[256];
        if (!(w->train = be->fp8_train_new(w, r, NULL, why, sizeof why))) die("--fp8_lm_head: %s: drop --fp8_lm_head", why);
        m->fp8_train[m->n_fp8_train++] = w->train;
    }
    m->fp8_keep = r->kind != FP8_RECIPE_BLOCK && first == 0 && last == 0;
}

void model_fp8_train_step(Model *m, AmaxReduce reduce, void *ctx) {
    if (m->n_fp8_train) m->be->fp8_train_step(m->fp8_train, m->n_fp8_train, reduce, ctx, &m->fp8_overflows);
}

size_t model_fp8_train_state(const Model *m, float *buf, int set) {
    return m->n_fp8_train ? m->be->fp8_train_state(m->fp8_train, m->n_fp8_train, buf, set) : 0;
}

// ----------------------------------------------------------------------------
// gradients of the dense weights (full fine-tuning, gradient checks): the same
// layout as the dense weights, in hp

static void alloc_grads(Model *m, int bucket) {
    if (m->grads) return;
    if (bucket && m->cfg.E)  // the bucket holds one layer's gradients, and sparse and dense layers differ in size
        die("sharded full training of a qwen3_moe model is not supported: train a LoRA adapter (--use_peft)");
    if (m->w.emb.gran != FP8_OFF)
        die("the embedding table and LM head are FP8 (--fp8_embeddings), and FP8 weights are frozen: training every "
            "weight needs them dense (drop --fp8_embeddings)");
    ModelOptions dense = m->opt;
    dense.gran = FP8_OFF;
    Weights g;
    weights_layout(&g, &m->cfg, &dense, m->be, 1, bucket);
    m->gw = g;
    m->grads = g.dense_mem;
    model_zero_grads(m);
}
void model_alloc_grads(Model *m) { alloc_grads(m, 0); }
void model_alloc_grads_bucket(Model *m) { alloc_grads(m, 1); }
void model_zero_grads(Model *m) {
    if (m->grads) m->be->zero(m->grads, m->gw.dense_bytes);
}
