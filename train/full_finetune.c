// full_finetune.c: full-weight training with fp32 master weights and AdamW (full_finetune.h), alone or sharded over
// several ranks (ZeRO: full_finetune.h says how).
#include <math.h>

#include "dist/data_parallel.h"
#include "io/safetensors.h"
#include "train/full_finetune.h"
#include "train/optim.h"  // grad_clip_factor

void full_init(FullTrainer *ft, Model *m) { full_init_sharded(ft, m, NULL, 0); }

static int sharded(const FullTrainer *ft) { return ft->dist && dist_world(ft->dist) > 1; }

// The values [a, a + len) of the flat gradient, held in buf (buf[0] = value a), summed over the ranks
// into their owners' blocks: the part within rank r's [lo, hi) reduced to rank r, which adds it to its
// gshard (every rank calls this in the same order: each reduction is a collective)
static void to_owners(FullTrainer *ft, void *buf, size_t a, size_t len) {
    const Backend *be = ft->be;
    size_t hp = dtype_size(be->hp);
    int W = dist_world(ft->dist), me = dist_rank(ft->dist);
    for (int r = 0; r < W; r++) {
        DpShard s = dp_shard(ft->n, W, r);
        size_t x = a > s.lo ? a : s.lo, y = a + len < s.hi ? a + len : s.hi;
        if (x >= y) continue;
        void *p = (char *)buf + (x - a) * hp;
        dist_reduce_sum(ft->dist, be, p, y - x, r);
        if (r == me) be->accumulate((char *)ft->gshard + (x - s.lo) * hp, p, y - x);
    }
}

// model_backward's hook after layer l (sharded): the bucket's values, layer l's gradients, to their
// owners; the bucket zeroed for layer l - 1
static void layer_grads(void *ctx, int l) {
    FullTrainer *ft = (FullTrainer *)ctx;
    Model *m = ft->model;
    void *bucket = (char *)m->grads + m->gw.bucket_at;
    to_owners(ft, bucket, ft->layer0 + (size_t)l * ft->layer_n, ft->layer_n);
    ft->be->zero(bucket, m->gw.bucket_bytes);
}

// this rank's block of the act weights the forward reads (where the masters live)
static void *act_block(const FullTrainer *ft, const Model *m) {
    return (char *)m->w.dense_mem + ft->lo * dtype_size(ft->be->act);
}

void full_init_sharded(FullTrainer *ft, Model *m, Dist *d, int bf16_moments) {
    const Backend *be = m->be;
    for (int l = 0; l < m->cfg.L; l++)
        for (int i = 0; i < LIN_COUNT; i++)
            if (m->w.layers[l].lin[i].gran != FP8_OFF)
                die("full-weight training updates every weight, and layer %d's are FP8 (frozen): load the model with "
                    "--load_in_fp8 off", l);
    // what full training adds to the weights: fp32 gradients, masters and two AdamW moments, 16
    // bytes a parameter (12 with bf16 moments; sharded, 4 + the rest / world); said before anything
    // is allocated where the device cannot hold it
    int W = d ? dist_world(d) : 1;
    size_t n = m->w.dense_bytes / dtype_size(be->act), k = W > 1 ? dp_shard(n, W, dist_rank(d)).hi - dp_shard(n, W, dist_rank(d)).lo : n;
    size_t L = m->cfg.L, layer = L ? (n - (size_t)((char *)m->w.layers[0].ln1 - (char *)m->w.dense_mem) / dtype_size(be->act)) / L : 0;
    size_t grads = W > 1 ? n - (L - 1) * layer : n;  // sharded: the tensors outside the layers, and one layer's bucket
    size_t act = dtype_size(be->act), hp = dtype_size(be->hp), ms = bf16_moments ? act : hp;
    size_t state = k * ((W > 1 ? 2 : 1) * hp + 2 * ms);  // masters (and sharded, the block's gradients), m and v
    size_t need = grads * hp + state, cap = be->mem_capacity();
    size_t used = be->mem_in_use(NULL);
    if (cap > 0 && used + need > cap)
        die("full-weight training needs %.1f GiB beyond the model's %.1f GiB (fp32 gradients, and master weights and AdamW's two "
            "moments %s: %.2fB parameters), and the GPU has %.1f GiB left: train a LoRA adapter instead (--use_peft), a smaller "
            "model, or shard over more GPUs (--nproc_per_node)",
            need / 1073741824.0, m->w.dense_bytes / 1073741824.0,
            W > 1 ? "sharded over the ranks" : bf16_moments ? "(12 bytes a parameter)" : "(16 bytes a parameter)", n / 1e9,
            (cap > used ? cap - used : 0) / 1073741824.0);
    memset(ft, 0, sizeof *ft);
    ft->be = be;
    ft->n = n;
    ft->lo = 0, ft->hi = n;
    if (W > 1) {
        DpShard s = dp_shard(n, W, dist_rank(d));
        ft->dist = d, ft->lo = s.lo, ft->hi = s.hi, ft->shard = s.shard;
        model_alloc_grads_bucket(m);  // the layers' gradients leave for their owners layer by layer (layer_grads)
        ft->layer0 = m->gw.bucket_at / hp, ft->layer_n = m->gw.bucket_bytes / hp;
        if (ft->layer0 + L * ft->layer_n != n) die("full_init: the gradients' layout differs from the weights'");
        ft->model = m;
        m->layer_grads = layer_grads, m->layer_grads_ctx = ft;
    } else {
        model_alloc_grads(m);
        if (m->gw.dense_bytes != ft->n * hp) die("full_init: the gradients' layout differs from the weights'");
    }
    ft->bf16_moments = bf16_moments;
    ft->mdt = bf16_moments ? be->act : be->hp;
    ft->mem = be->alloc(state);
    ft->master = ft->mem;
    ft->gshard = W > 1 ? (char *)ft->mem + k * hp : NULL;
    ft->adam_m = (char *)ft->mem + (W > 1 ? 2 : 1) * k * hp;
    ft->adam_v = (char *)ft->adam_m + k * ms;
    be->zero((char *)ft->mem + k * hp, state - k * hp);
    // the masters start as the act weights of the block, through the host (once): act -> f64 -> hp
    void *raw = mallocCheck(k * act);
    double *h = (double *)mallocCheck(k * sizeof(double));
    be->download(raw, act_block(ft, m), k * act);
    convert_to_f64(h, raw, be->act, k);
    be->upload_convert(ft->master, be->hp, h, DT_F64, k);
    free(raw);
    free(h);
}

// Every rank's block of masters rounded into its block of the act weights (`round`: here; after an
// optimizer step AdamW has written them in its pass), then, sharded, the blocks all-gathered (the
// last rank's tail broadcast): every rank has all the weights again.
static void publish_weights(FullTrainer *ft, Model *m, int round) {
    const Backend *be = ft->be;
    size_t act = dtype_size(be->act);
    if (round) be->to_act(act_block(ft, m), ft->master, ft->hi - ft->lo);
    if (!sharded(ft)) return;
    int W = dist_world(ft->dist);
    dist_all_gather(ft->dist, be, m->w.dense_mem, ft->shard * act);
    size_t tail = ft->n - W * ft->shard;
    if (tail) dist_broadcast(ft->dist, be, (char *)m->w.dense_mem + W * ft->shard * act, tail * act, W - 1);
}

static void reduce_amax(float *amax, size_t n, void *dist) { dist_reduce_amax((Dist *)dist, amax, n); }

double full_step(FullTrainer *ft, Model *m, float lr, float beta1, float beta2, float eps, float weight_decay,
                 double max_grad_norm) {
    const Backend *be = ft->be;
    size_t hp = dtype_size(be->hp), k = ft->hi - ft->lo;
    // this rank's block of the gradients: sharded, the layers' reached their owners during the
    // backward (layer_grads); the tensors outside the layers (embeddings, head, final norm), summed over
    // the micro-batches, go now
    if (sharded(ft)) to_owners(ft, m->grads, 0, ft->layer0);
    void *g = sharded(ft) ? ft->gshard : (char *)m->grads + ft->lo * hp;
    double ss = be->sumsq(g, k);
    if (sharded(ft)) dist_all_reduce_sum_f64_host(ft->dist, &ss, 1);  // the global norm from the blocks'
    double norm = sqrt(ss);
    double clip = grad_clip_factor(norm, max_grad_norm);
    if (!isfinite(clip)) die("full-weight training: the gradient norm is %g (NaN/inf) at step %d: lower the learning rate", norm, ft->step + 1);
    ft->step++;
    // one pass: the gradients times the clip factor, AdamW on the masters, their act copy for the forward
    Bf16Moments m16 = {0x6d6f6d656e7473ull, ft->lo};  // the stochastic rounding's stream: fixed, so a run repeats
    be->adamw(ft->master, g, (float)clip, ft->adam_m, ft->adam_v, k, lr, beta1, beta2, eps, weight_decay, ft->step,
              act_block(ft, m), ft->bf16_moments ? &m16 : NULL);
    if (sharded(ft)) be->zero(ft->gshard, k * hp);  // the next step's sums start at 0
    publish_weights(ft, m, 0);
    // FP8 training: delayed scaling's histories roll, from the amaxes of every rank's data
    model_fp8_train_step(m, sharded(ft) ? reduce_amax : NULL, ft->dist);
    return norm;
}

void full_free(FullTrainer *ft) {
    if (ft->model && ft->model->layer_grads_ctx == ft) ft->model->layer_grads = NULL, ft->model->layer_grads_ctx = NULL;
    if (ft->mem) ft->be->free(ft->mem);
    if (ft->stage) ft->be->free(ft->stage);
    memset(ft, 0, sizeof *ft);
}

// Sharded checkpoints: rank r's block [lo_r, hi_r) of each array crosses over in pieces through
// ft->stage (64 MiB on the backend), each a broadcast from its owner (to rank 0 when saving) or from
// rank 0 (to its owner when loading).
#define STAGE_VALUES ((size_t)16 << 20)
static void *stage_of(FullTrainer *ft) {
    if (!ft->stage) ft->stage = ft->be->alloc(STAGE_VALUES * dtype_size(ft->be->hp));
    return ft->stage;
}

// saving (to_host 1): rank r's block of mine (this rank's block of an array of hp values: es bytes
// each) into host (n values) on rank 0; loading (to_host 0): host's values on rank 0 into every rank's
// block of mine
static void move_blocks(FullTrainer *ft, void *mine, void *host, int to_host, size_t es) {
    const Backend *be = ft->be;
    size_t hp = es;
    int me = dist_rank(ft->dist);
    void *st = stage_of(ft);
    for (int r = 0; r < dist_world(ft->dist); r++) {
        DpShard s = dp_shard(ft->n, dist_world(ft->dist), r);
        for (size_t off = 0; off < s.hi - s.lo; off += STAGE_VALUES) {
            size_t k = s.hi - s.lo - off < STAGE_VALUES ? s.hi - s.lo - off : STAGE_VALUES;
            char *blk = (char *)mine + off * hp, *h = (char *)host + (s.lo + off) * hp;
            if (to_host && r == me) be->copy(st, blk, k * hp);
            if (!to_host && me == 0) be->upload(st, h, k * hp);
            dist_broadcast(ft->dist, be, st, k * hp, to_host ? r : 0);
            if (to_host && me == 0) be->download(h, st, k * hp);
            if (!to_host && r == me) be->copy(blk, st, k * hp);
        }
    }
}

void full_save_state(const FullTrainer *ftc, const Model *m, const char *path) {
    FullTrainer *ft = (FullTrainer *)ftc;  // (sharded: its stage buffer is made on first use)
    const Backend *be = ft->be;
    const void *src[3] = {ft->master, ft->adam_m, ft->adam_v};
    const char *names[3] = {"params", "adam_m", "adam_v"};
    DType dt[3] = {be->hp, ft->mdt, ft->mdt};
    STWrite t[4];
    void *h[4] = {0};
    int writer = !sharded(ft) || dist_rank(ft->dist) == 0;
    for (int i = 0; i < 3; i++) {
        size_t es = dtype_size(dt[i]);
        h[i] = writer ? mallocCheck(ft->n * es) : NULL;
        if (sharded(ft)) move_blocks(ft, (void *)src[i], h[i], 1, es);
        else be->download(h[i], src[i], ft->n * es);
        t[i] = (STWrite){names[i], dt[i], 1, {(int64_t)ft->n}, h[i]};
    }
    if (!writer) return;
    // FP8 delayed scaling: the scales and amax histories, so that a resumed run scales as the
    // unbroken one would (restarted histories would scale the first steps after a resume from
    // nothing: by 1, TE's initial scale). Sharded, each rank keeps its own; rank 0's are saved,
    // and a resume gives them to every rank.
    size_t nf = model_fp8_train_state(m, NULL, 0);
    int nt = 3;
    if (nf) {
        h[3] = mallocCheck(nf * sizeof(float));
        model_fp8_train_state(m, (float *)h[3], 0);
        t[nt++] = (STWrite){"fp8_delayed_state", DT_F32, 1, {(int64_t)nf}, h[3]};
    }
    char md[96];
    snprintf(md, sizeof md, "{\"step\":\"%d\",\"fp8_overflows\":\"%ld\"}", ft->step, m->fp8_overflows);
    st_write(path, t, nt, md);
    for (int i = 0; i < 4; i++) free(h[i]);
}

void full_load_state(FullTrainer *ft, Model *m, const char *path) {
    const Backend *be = ft->be;
    int reader = !sharded(ft) || dist_rank(ft->dist) == 0;
    SafeTensors st;
    if (reader) st_open(&st, path);
    const char *names[3] = {"params", "adam_m", "adam_v"};
    void *dst[3] = {ft->master, ft->adam_m, ft->adam_v};
    DType dt[3] = {be->hp, ft->mdt, ft->mdt};
    for (int i = 0; i < 3; i++) {
        const STensor *t = reader ? st_find(&st, names[i]) : NULL;
        if (reader && t && i && (size_t)t->numel == ft->n && t->dtype != dt[i] && dt[i] != be->hp)
            die("%s: AdamW's moments were saved as %s and this run holds them in bf16: resume with the run's --adam_moments", path,
                dtype_name(t->dtype));
        if (reader && (!t || t->dtype != dt[i] || (size_t)t->numel != ft->n))
            die("%s: %s missing or not %zu %s values: the checkpoint is another model's (or another backend's, or was saved "
                "with another --adam_moments)", path, names[i], ft->n, dtype_name(dt[i]));
        if (sharded(ft)) move_blocks(ft, dst[i], t ? (void *)t->data : NULL, 0, dtype_size(dt[i]));
        else be->upload(dst[i], t->data, t->nbytes);
    }
    size_t nf = model_fp8_train_state(m, NULL, 0);
    if (nf) {
        float *f = (float *)mallocCheck(nf * sizeof(float));
        if (reader) {
            const STensor *t = st_find(&st, "fp8_delayed_state");
            if (!t || t->dtype != DT_F32 || (size_t)t->numel != nf)
                die("%s: fp8_delayed_state missing or not %zu f32 values: not a checkpoint of this FP8 delayed-scaling run", path, nf);
            memcpy(f, t->data, nf * sizeof(float));  // the mapped file's bytes may sit unaligned
            m->fp8_overflows = st_metadata_int(&st, "fp8_overflows", path);
        }
        if (sharded(ft)) dist_broadcast_host(ft->dist, f, nf * sizeof(float), 0);
        model_fp8_train_state(m, f, 1);
        free(f);
    }
    if (reader) {
        ft->step = st_metadata_int(&st, "step", path);
        st_close(&st);
    }
    if (sharded(ft)) dist_broadcast_host(ft->dist, &ft->step, sizeof ft->step, 0);
    publish_weights(ft, m, 1);
}
