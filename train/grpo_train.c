// grpo_train.c: one GRPO update (grpo_train.h says what and why).
#include <math.h>

#include "train/grpo_train.h"
#include "dist/data_parallel.h"

void grpo_train_init(GrpoTrainer *t, int S, int Tc) {
    memset(t, 0, sizeof *t);
    t->S = S, t->Tc = Tc;
    size_t n = (size_t)S * Tc * sizeof(double);
    t->logp = (double *)mallocCheck(n), t->old = (double *)mallocCheck(n);
    t->ref = (double *)mallocCheck(n), t->dlogp = (double *)mallocCheck(n);
}

void grpo_train_free(GrpoTrainer *t) {
    free(t->logp), free(t->old), free(t->ref), free(t->dlogp), free(t->lp), free(t->dl);
    memset(t, 0, sizeof *t);
}

// full (nb, T): per-position values of sequences b0..b0+nb-1 -> comp (S, Tc): the values at
// their completion tokens (completion token j is predicted at position start + j), 0 after
static void to_completion(const GrpoBatch *b, const double *full, double *comp, int b0, int nb) {
    for (int q = b0; q < b0 + nb; q++)
        for (int j = 0; j < b->Tc; j++) comp[q * b->Tc + j] = j < b->len[q] ? full[(size_t)(q - b0) * b->T + b->start[q] + j] : 0;
}

void grpo_step(GrpoTrainer *t, Model *m, LoRA *lo, FullTrainer *ft, Dist *dist, const GrpoConfig *g, const GrpoBatch *b,
               int mb, const OptimConfig *o, long step, GrpoStepStats *st) {
    int S = b->S, T = b->T, Tc = b->Tc;
    if (S != t->S || Tc != t->Tc) die("grpo_step: a batch of %d x %d, the trainer was made for %d x %d", S, Tc, t->S, t->Tc);
    if (T > t->cap_T) {
        t->cap_T = T;
        t->lp = (double *)reallocCheck(t->lp, (size_t)S * T * sizeof(double));
        t->dl = (double *)reallocCheck(t->dl, (size_t)S * T * sizeof(double));
    }
    memset(st, 0, sizeof *st);
    double t0 = now_sec();
    int need_old = g->num_iterations > 1;
    for (int pass = 0; pass < 2; pass++) {  // 0: the reference, 1: the old policy
        if ((pass == 0 && g->beta == 0) || (pass == 1 && !need_old)) continue;
        for (int b0 = 0; b0 < S; b0 += mb) {
            int nb = S - b0 < mb ? S - b0 : mb;
            model_forward(m, pass == 1 ? lo : NULL, b->ids + (size_t)b0 * T, nb, T);
            model_logprobs(m, b->tg + (size_t)b0 * T, b->inv_temp, t->lp);
            to_completion(b, t->lp, pass == 0 ? t->ref : t->old, b0, nb);
        }
    }
    st->t_ref = now_sec() - t0;
    GrpoStats gs;
    grpo_stats_init(&gs);
    for (int it = 0; it < g->num_iterations; it++) {
        grpo_stats_init(&gs);
        if (lo) lora_zero_grads(lo);
        else model_zero_grads(m);
        st->loss = 0;
        for (int b0 = 0; b0 < S; b0 += mb) {
            int nb = S - b0 < mb ? S - b0 : mb;
            model_forward(m, lo, b->ids + (size_t)b0 * T, nb, T);
            model_logprobs(m, b->tg + (size_t)b0 * T, b->inv_temp, t->lp);
            to_completion(b, t->lp, t->logp, b0, nb);
            GrpoInputs in = {t->logp + (size_t)b0 * Tc, need_old ? t->old + (size_t)b0 * Tc : NULL,
                             g->beta != 0 ? t->ref + (size_t)b0 * Tc : NULL, b->samp + (size_t)b0 * Tc, b->adv + b0,
                             b->mask + (size_t)b0 * Tc, b->trunc + b0};
            st->loss += grpo_loss(g, b->norm, &in, nb, t->dlogp + (size_t)b0 * Tc, &gs);
            memset(t->dl, 0, (size_t)nb * T * sizeof(double));  // dL/dlogp back at the positions of the (nb, T) batch
            for (int q = b0; q < b0 + nb; q++)
                for (int j = 0; j < b->len[q]; j++) t->dl[(size_t)(q - b0) * T + b->start[q] + j] = t->dlogp[q * Tc + j];
            model_backward(m, lo, t->dl);
        }
        st->lr = lr_schedule(o->lr_scheduler_type, o->learning_rate, (step - 1) * g->num_iterations + it, o->warmup, o->total);
        if (!lo) {  // every weight: full_step clips the global norm and steps the masters (full_finetune.h)
            st->grad_norm = full_step(ft, m, (float)st->lr, (float)o->beta1, (float)o->beta2, (float)o->eps,
                                      (float)o->weight_decay, o->max_grad_norm);
            continue;
        }
        // every rank's gradient of its rows, summed: the whole batch's (data_parallel.h); then the same clip
        // and AdamW step on every rank keep the copies equal
        st->t_reduce += dp_all_reduce_grads(dist, m->be, lo->grads, lo->n);
        st->grad_norm = lora_grad_norm(lo);
        double clip = grad_clip_factor(st->grad_norm, o->max_grad_norm);
        if (!isfinite(clip))
            die("step %ld: the gradient norm is %g (NaN/inf): lower --learning_rate or check the data", step, st->grad_norm);
        if (clip != 1.0) lora_scale_grads(lo, (float)clip);
        lora_adamw_step(lo, (float)st->lr, (float)o->beta1, (float)o->beta2, (float)o->eps, (float)o->weight_decay);
    }
    dp_stats(dist, &gs);
    double red[2] = {st->loss, st->t_reduce}, least = -st->t_reduce;
    dist_all_reduce_sum_f64_host(dist, red, 2);
    dist_all_reduce_max_f64_host(dist, &least, 1);
    st->loss = red[0], st->t_reduce = red[1] / dist_world(dist), st->t_reduce_min = -least;
    st->gm = grpo_metrics(&gs);
}
