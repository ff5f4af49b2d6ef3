// full.c: full-weight training with fp32 master weights and AdamW (full.h).
#include <math.h>

#include "full.h"
#include "grpo.h"  // grad_clip_factor
#include "safetensors.h"

void full_init(FullTrainer *ft, Model *m) {
    const Backend *be = m->be;
    for (int l = 0; l < m->cfg.L; l++)
        for (int i = 0; i < LIN_COUNT; i++)
            if (m->w.layers[l].lin[i].gran != FP8_OFF)
                die("full-weight training updates every weight, and layer %d's are FP8 (frozen): load the model with "
                    "--load_in_fp8 off", l);
    // what full training adds to the weights: fp32 gradients, masters and two AdamW moments, 16
    // bytes a parameter; said before anything is allocated where the device cannot hold it
    size_t n = m->w.dense_bytes / dtype_size(be->act), need = 4 * n * dtype_size(be->hp), cap = be->mem_capacity();
    size_t used = be->mem_in_use(NULL);
    if (cap > 0 && used + need > cap)
        die("full-weight training needs %.1f GiB beyond the model's %.1f GiB (fp32 gradients, master weights and AdamW's two "
            "moments: 16 bytes a parameter, %.2fB parameters), and the GPU has %.1f GiB left: train a LoRA adapter instead "
            "(--use_peft), or a smaller model",
            need / 1073741824.0, m->w.dense_bytes / 1073741824.0, n / 1e9, (cap > used ? cap - used : 0) / 1073741824.0);
    model_alloc_grads(m);
    memset(ft, 0, sizeof *ft);
    ft->be = be;
    size_t act = dtype_size(be->act), hp = dtype_size(be->hp);
    ft->n = m->w.dense_bytes / act;
    if (m->gw.dense_bytes != ft->n * hp) die("full_init: the gradients' layout differs from the weights'");
    ft->mem = be->alloc(3 * ft->n * hp);
    ft->master = ft->mem;
    ft->adam_m = (char *)ft->mem + ft->n * hp;
    ft->adam_v = (char *)ft->mem + 2 * ft->n * hp;
    be->zero(ft->adam_m, 2 * ft->n * hp);
    // the masters start as the act weights, through the host (once): act -> f64 -> hp
    void *raw = mallocCheck(m->w.dense_bytes);
    double *h = (double *)mallocCheck(ft->n * sizeof(double));
    be->download(raw, m->w.dense_mem, m->w.dense_bytes);
    convert_to_f64(h, raw, be->act, ft->n);
    be->upload_convert(ft->master, be->hp, h, DT_F64, ft->n);
    free(raw);
    free(h);
}

double full_step(FullTrainer *ft, Model *m, float lr, float beta1, float beta2, float eps, float weight_decay,
                 double max_grad_norm) {
    const Backend *be = ft->be;
    double norm = sqrt(be->sumsq(m->grads, ft->n));
    double clip = grad_clip_factor(norm, max_grad_norm);
    if (!isfinite(clip)) die("full-weight training: the gradient norm is %g (NaN/inf) at step %d: lower the learning rate", norm, ft->step + 1);
    if (clip != 1.0) be->scale(m->grads, ft->n, (float)clip);
    ft->step++;
    be->adamw(ft->master, m->grads, ft->adam_m, ft->adam_v, ft->n, lr, beta1, beta2, eps, weight_decay, ft->step);
    be->to_act(m->w.dense_mem, ft->master, ft->n);
    model_fp8_train_step(m);  // FP8 training: delayed scaling's histories roll
    return norm;
}

void full_free(FullTrainer *ft) {
    if (ft->mem) ft->be->free(ft->mem);
    memset(ft, 0, sizeof *ft);
}

void full_save_state(const FullTrainer *ft, const Model *m, const char *path) {
    const Backend *be = ft->be;
    size_t bytes = ft->n * dtype_size(be->hp);
    const void *src[3] = {ft->master, ft->adam_m, ft->adam_v};
    const char *names[3] = {"params", "adam_m", "adam_v"};
    STWrite t[4];
    void *h[4] = {0};
    for (int i = 0; i < 3; i++) {
        h[i] = mallocCheck(bytes);
        be->download(h[i], src[i], bytes);
        t[i] = (STWrite){names[i], be->hp, 1, {(int64_t)ft->n}, h[i]};
    }
    // FP8 delayed scaling: the scales and amax histories, so that a resumed run scales as the
    // unbroken one would (restarted histories would scale the first steps after a resume from
    // nothing: by 1, TE's initial scale)
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
    SafeTensors st;
    st_open(&st, path);
    const char *names[3] = {"params", "adam_m", "adam_v"};
    void *dst[3] = {ft->master, ft->adam_m, ft->adam_v};
    for (int i = 0; i < 3; i++) {
        const STensor *t = st_find(&st, names[i]);
        if (!t || t->dtype != be->hp || (size_t)t->numel != ft->n)
            die("%s: %s missing or not %zu %s values: the checkpoint is another model's (or another backend's)", path, names[i],
                ft->n, dtype_name(be->hp));
        be->upload(dst[i], t->data, t->nbytes);
    }
    size_t nf = model_fp8_train_state(m, NULL, 0);
    if (nf) {
        const STensor *t = st_find(&st, "fp8_delayed_state");
        if (!t || t->dtype != DT_F32 || (size_t)t->numel != nf)
            die("%s: fp8_delayed_state missing or not %zu f32 values: not a checkpoint of this FP8 delayed-scaling run", path, nf);
        float *f = (float *)mallocCheck(nf * sizeof(float));
        memcpy(f, t->data, nf * sizeof(float));  // the mapped file's bytes may sit unaligned
        model_fp8_train_state(m, f, 1);
        free(f);
        m->fp8_overflows = st_metadata_int(&st, "fp8_overflows", path);
    }
    ft->step = st_metadata_int(&st, "step", path);
    st_close(&st);
    be->to_act(m->w.dense_mem, ft->master, ft->n);
}
