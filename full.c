// full.c: full-weight training with fp32 master weights and AdamW (full.h).
#include <math.h>

#include "full.h"
#include "grpo.h"  // grad_clip_factor

void full_init(FullTrainer *ft, Model *m) {
    const Backend *be = m->be;
    for (int l = 0; l < m->cfg.L; l++)
        for (int i = 0; i < LIN_COUNT; i++)
            if (m->w.layers[l].lin[i].gran != FP8_OFF)
                die("full-weight training updates every weight, and layer %d's are FP8 (frozen): load the model with "
                    "--load_in_fp8 off", l);
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
    model_fp8_train_step(m);  // FP8 training: the new weights quantized at the next forward
    return norm;
}

void full_free(FullTrainer *ft) {
    if (ft->mem) ft->be->free(ft->mem);
    memset(ft, 0, sizeof *ft);
}
