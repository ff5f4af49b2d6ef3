// ppo_train.c: the value model on the shared base and one PPO step (ppo_train.h says what and why).
#include <math.h>

#include "train/ppo_train.h"
#include "io/safetensors.h"
#include "train/optim.h"

// ----------------------------------------------------------------------------
// the value model: a LoRA adapter of its own and score (1, C) on the final normed hidden state

void value_init(ValueModel *v, const Model *m, const LoRA *policy, uint64_t seed) {
    memset(v, 0, sizeof *v);
    const Backend *be = m->be;
    v->be = be;
    v->C = m->cfg.C;
    v->lo = lora_create(m, policy->r, policy->alpha, policy->targets, seed, policy->bf16);
    size_t hp = dtype_size(be->hp) * v->C;
    v->w = be->alloc(hp), v->g = be->alloc(hp), v->am = be->alloc(hp), v->av = be->alloc(hp);
    v->w_act = be->alloc(dtype_size(be->act) * v->C);
    be->zero(v->w, hp), be->zero(v->g, hp), be->zero(v->am, hp), be->zero(v->av, hp);
    be->zero(v->w_act, dtype_size(be->act) * v->C);
    memset(&v->head, 0, sizeof v->head);
    v->head.rows = 1, v->head.cols = v->C, v->head.gran = FP8_OFF, v->head.dense = v->w_act;
}

void value_free(ValueModel *v) {
    const Backend *be = v->be;
    if (!be) return;
    if (v->lo) lora_free(v->lo);
    void *p[] = {v->w, v->g, v->am, v->av, v->w_act, v->vals, v->dv};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) be->free(p[i]);
    memset(v, 0, sizeof *v);
}

static void value_scratch(ValueModel *v, int N) {
    if (N <= v->cap) return;
    const Backend *be = v->be;
    if (v->vals) be->free(v->vals), be->free(v->dv);
    v->vals = be->alloc((size_t)N * dtype_size(be->hp));
    v->dv = be->alloc((size_t)N * dtype_size(be->act));
    v->cap = N;
}

void value_forward(ValueModel *v, Model *m, const int *ids, int B, int T, double *values) {
    model_forward(m, v->lo, ids, B, T);
    int N = B * T;
    value_scratch(v, N);
    const Backend *be = v->be;
    be->logits_forward(v->vals, m->acts.lnf, &v->head, N);  // (N, 1) fp32: lnf score^T
    size_t bytes = (size_t)N * dtype_size(be->hp);
    void *tmp = mallocCheck(bytes);
    be->download(tmp, v->vals, bytes);
    convert_to_f64(values, tmp, be->hp, N);
    free(tmp);
}

void value_backward(ValueModel *v, Model *m, const double *dvalues) {
    const Backend *be = v->be;
    int N = m->B * m->T;
    be->upload_convert(v->dv, be->act, dvalues, DT_F64, N);
    // dh (N, C) = dv score, straight into the model's dL/dlnf buffer; d score += dv^T lnf
    be->linear_backward(m->acts.dln, 0, v->g, NULL, v->dv, m->acts.lnf, &v->head, N);
    model_backward_hidden(m, v->lo, m->acts.dln);
}

void value_zero_grads(ValueModel *v) {
    lora_zero_grads(v->lo);
    v->be->zero(v->g, (size_t)v->C * dtype_size(v->be->hp));
}
double value_grad_norm(const ValueModel *v) { return sqrt(v->be->sumsq(v->lo->grads, v->lo->n) + v->be->sumsq(v->g, v->C)); }
void value_scale_grads(ValueModel *v, float s) {
    lora_scale_grads(v->lo, s);
    v->be->scale(v->g, v->C, s);
}
void value_adamw_step(ValueModel *v, float lr, float beta1, float beta2, float eps, float weight_decay) {
    lora_adamw_step(v->lo, lr, beta1, beta2, eps, weight_decay);
    v->step++;  // the head: fp32 masters, and the act copy the forward reads written in the same pass
    v->be->adamw(v->w, v->g, 1.0f, v->am, v->av, v->C, lr, beta1, beta2, eps, weight_decay, v->step, v->w_act, NULL);
}
size_t value_state_bytes(const ValueModel *v) { return lora_state_bytes(v->lo) + 4 * (size_t)v->C * dtype_size(v->be->hp); }

// value_model.safetensors: adapter.{params, adam_m, adam_v} (lora_save_state's layout, step in the
// metadata) and score.{weight, adam_m, adam_v}
void value_save_state(const ValueModel *v, const char *path) {
    const Backend *be = v->be;
    const LoRA *lo = v->lo;
    size_t la = lo->n * dtype_size(lo->sdt), hb = (size_t)v->C * dtype_size(be->hp);
    const void *src[6] = {lo->params, lo->m, lo->v, v->w, v->am, v->av};
    size_t bytes[6] = {la, la, la, hb, hb, hb};
    const char *names[6] = {"adapter.params", "adapter.adam_m", "adapter.adam_v", "score.weight", "score.adam_m", "score.adam_v"};
    void *buf[6];
    STWrite t[6];
    for (int i = 0; i < 6; i++) {
        buf[i] = mallocCheck(bytes[i]);
        be->download(buf[i], src[i], bytes[i]);
        t[i] = i < 3 ? (STWrite){names[i], lo->sdt, 1, {(int64_t)lo->n}, buf[i]}
                     : (STWrite){names[i], be->hp, 2, {1, v->C}, buf[i]};
    }
    char md[128];
    snprintf(md, sizeof md, "{\"step\":\"%d\",\"score_step\":\"%d\"}", lo->step, v->step);
    st_write(path, t, 6, md);
    for (int i = 0; i < 6; i++) free(buf[i]);
}

void value_load_state(ValueModel *v, const char *path) {
    const Backend *be = v->be;
    LoRA *lo = v->lo;
    SafeTensors st;
    st_open(&st, path);
    void *dst[6] = {lo->params, lo->m, lo->v, v->w, v->am, v->av};
    const char *names[6] = {"adapter.params", "adapter.adam_m", "adapter.adam_v", "score.weight", "score.adam_m", "score.adam_v"};
    for (int i = 0; i < 6; i++) {
        const STensor *t = st_find(&st, names[i]);
        DType want = i < 3 ? lo->sdt : be->hp;
        size_t n = i < 3 ? lo->n : (size_t)v->C;
        if (!t || t->dtype != want || (size_t)t->numel != n)
            die("%s: %s missing or not %zu %s values: the checkpoint was made with other LoRA settings or another model", path,
                names[i], n, dtype_name(want));
        be->upload(dst[i], t->data, t->nbytes);
    }
    lo->step = st_metadata_int(&st, "step", path);
    v->step = st_metadata_int(&st, "score_step", path);
    st_close(&st);
    lo->act_valid = 0;
    be->to_act(v->w_act, v->w, v->C);
}

// ----------------------------------------------------------------------------
// the step

void ppo_scores(const PpoConfig *c, int S, int R, const double *rewards, const double *weights,
                const unsigned char *truncated, double *score) {
    for (int q = 0; q < S; q++) {
        double s = 0;
        for (int k = 0; k < R; k++) {
            double x = rewards[(size_t)q * R + k] * weights[k];
            if (!isnan(x)) s += x;
        }
        score[q] = s - (truncated[q] ? c->missing_eos_penalty : 0.0);
    }
}

void ppo_init(PpoTrainer *p, const PpoConfig *c, const Model *m, const LoRA *policy, int S, int Tc, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->c = *c;
    p->seed = seed;
    p->S = S, p->Tc = Tc;
    value_init(&p->value, m, policy, seed + 29);
    size_t n = (size_t)S * Tc;
    double **a[] = {&p->ref, &p->old, &p->values, &p->rewards, &p->adv, &p->ret, &p->cur, &p->dcur};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) *a[i] = (double *)callocCheck(n * (i == 6 ? 5 : 1), sizeof(double));
    p->mask = (unsigned char *)callocCheck(2 * n, 1);
    p->perm = (int *)mallocCheck(S * sizeof(int));
}

void ppo_free(PpoTrainer *p) {
    value_free(&p->value);
    free(p->ref), free(p->old), free(p->values), free(p->rewards), free(p->adv), free(p->ret), free(p->cur), free(p->dcur);
    free(p->full), free(p->dfull), free(p->mask), free(p->perm), free(p->ids), free(p->tg);
    memset(p, 0, sizeof *p);
}

// full (nb, T) per position -> comp (nb, Tc) at the completion tokens of rows[0..nb) (0 past the end),
// and back (zeros elsewhere)
static void to_comp(const PpoBatch *b, const int *rows, int nb, const double *full, double *comp) {
    for (int i = 0; i < nb; i++)
        for (int j = 0; j < b->Tc; j++)
            comp[(size_t)i * b->Tc + j] = j < b->len[rows[i]] ? full[(size_t)i * b->T + b->start[rows[i]] + j] : 0.0;
}
static void from_comp(const PpoBatch *b, const int *rows, int nb, const double *comp, double *full) {
    memset(full, 0, (size_t)nb * b->T * sizeof(double));
    for (int i = 0; i < nb; i++)
        for (int j = 0; j < b->len[rows[i]]; j++) full[(size_t)i * b->T + b->start[rows[i]] + j] = comp[(size_t)i * b->Tc + j];
}
// rows[0..nb) of src (S, w) into dst (nb, w)
static void gather(void *dst, const void *src, const int *rows, int nb, size_t w) {
    for (int i = 0; i < nb; i++) memcpy((char *)dst + i * w, (const char *)src + rows[i] * w, w);
}

// the micro-batch's ids and targets (nb, T) from the batch's rows
static void micro_tokens(PpoTrainer *p, const PpoBatch *b, const int *rows, int nb) {
    gather(p->ids, b->ids, rows, nb, (size_t)b->T * sizeof(int));
    gather(p->tg, b->tg, rows, nb, (size_t)b->T * sizeof(int));
}

// 1. the rollout's numbers, a micro-batch at a time in batch order: the reference's log-probs (no
// adapter), the policy's, and the values
static void rollout_passes(PpoTrainer *p, Model *m, LoRA *policy, const PpoBatch *b, int mb) {
    int S = b->S, Tc = b->Tc;
    for (int b0 = 0; b0 < S; b0 += mb) {
        int nb = S - b0 < mb ? S - b0 : mb;
        const int *rows = p->perm + b0;  // (the identity here)
        micro_tokens(p, b, rows, nb);
        for (int pass = 0; pass < 3; pass++) {
            double *out = pass == 0 ? p->ref : pass == 1 ? p->old : p->values;
            if (pass < 2) {
                model_forward(m, pass == 1 ? policy : NULL, p->ids, nb, b->T);
                model_logprobs(m, p->tg, b->inv_temp, p->full);
            } else value_forward(&p->value, m, p->ids, nb, b->T, p->full);
            to_comp(b, rows, nb, p->full, out + (size_t)b0 * Tc);
        }
    }
}

// 2. per-token rewards, GAE, returns, whitened advantages; the rollout's metrics
static void advantages(PpoTrainer *p, const PpoBatch *b, PpoStepStats *st) {
    const PpoConfig *c = &p->c;
    int S = b->S, Tc = b->Tc;
    size_t n = (size_t)S * Tc;
    int *end = (int *)mallocCheck(S * sizeof(int));
    double kl = 0, ent = 0, sc = 0, vs = 0, ntok = 0;
    for (int q = 0; q < S; q++) {
        end[q] = b->len[q] - 1;  // the score at the last completion token
        sc += b->score[q];
        for (int j = 0; j < Tc; j++) {
            size_t i = (size_t)q * Tc + j;
            p->mask[i] = j < b->len[q];
            if (!p->mask[i]) continue;
            kl += ppo_kl(c, p->old[i], p->ref[i]);
            ent -= p->old[i];
            vs += p->values[i], ntok++;
        }
    }
    ppo_token_rewards(c, S, Tc, p->old, p->ref, b->score, end, p->rewards);  // (0 past each end: logp = ref = 0 there)
    free(end);
    if (c->whiten_rewards) {
        ppo_masked_whiten(p->rewards, p->mask, (int)n, 0);
        for (size_t i = 0; i < n; i++) p->rewards[i] = p->mask[i] ? p->rewards[i] : 0.0;
    }
    ppo_gae(c, S, Tc, p->rewards, p->values, p->adv, p->ret);  // (values past each end are 0: the terminal state)
    ppo_masked_whiten(p->adv, p->mask, (int)n, 1);
    for (size_t i = 0; i < n; i++) p->adv[i] = p->mask[i] ? p->adv[i] : 0.0;
    st->kl = kl / S, st->entropy = ent / S, st->scores = sc / S, st->value_mean = vs / ntok;
    st->non_score_reward = -c->kl_coef * st->kl, st->rlhf_reward = st->non_score_reward + st->scores;
}

// a seeded shuffle of 0..S-1 for each (step, epoch), the same after a resume
static void shuffle(int *perm, int S, uint64_t seed, long step, int epoch) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)step * 0xbf58476d1ce4e5b9ull ^ (uint64_t)epoch * 0x94d049bb133111ebull;
    Rng r = rng_make(splitmix64(&x));
    for (int i = 0; i < S; i++) perm[i] = i;
    for (int i = S - 1; i > 0; i--) {
        int k = rng_int(&r, i + 1), t = perm[i];
        perm[i] = perm[k], perm[k] = t;
    }
}

// 3. one mini-batch (rows[0..n)): per micro-batch the value's forward, loss and backward, then the
// policy's; the gradients accumulate in both models. Its losses, token-weighted, into *ls.
static void mini_batch(PpoTrainer *p, Model *m, LoRA *policy, const PpoBatch *b, const int *rows, int n, int mb, PpoLossStats *ls) {
    const PpoConfig *c = &p->c;
    int Tc = b->Tc;
    size_t cap = (size_t)p->S * Tc;
    double ntok = 0;
    for (int i = 0; i < n; i++) ntok += b->len[rows[i]];
    // the micro-batch's slices of the rollout's arrays, gathered: old, adv, values, returns, and the current
    // logp / vpred (cur), their gradients (dcur)
    double *old = p->cur, *adv = p->cur + cap, *val = p->cur + 2 * cap, *ret = p->cur + 3 * cap, *now = p->cur + 4 * cap;
    unsigned char *mask = p->mask + cap;
    memset(ls, 0, sizeof *ls);
    for (int u0 = 0; u0 < n; u0 += mb) {
        int nu = n - u0 < mb ? n - u0 : mb;
        const int *r = rows + u0;
        size_t w = (size_t)Tc * sizeof(double), k = (size_t)nu * Tc;
        gather(old, p->old, r, nu, w), gather(adv, p->adv, r, nu, w), gather(val, p->values, r, nu, w);
        gather(ret, p->ret, r, nu, w), gather(mask, p->mask, r, nu, Tc);
        double tok = 0;
        for (int i = 0; i < nu; i++) tok += b->len[r[i]];
        double share = tok / ntok;  // of the mini-batch's tokens: its masked means are the mini-batch's
        micro_tokens(p, b, r, nu);
        PpoLossStats s;
        // the value: forward, clipped loss, backward into the value adapter and the head
        value_forward(&p->value, m, p->ids, nu, b->T, p->full);
        to_comp(b, r, nu, p->full, now);
        ppo_value_loss(c, k, now, val, ret, mask, p->dcur, &s);
        for (size_t i = 0; i < k; i++) p->dcur[i] *= share;
        from_comp(b, r, nu, p->dcur, p->dfull);
        value_backward(&p->value, m, p->dfull);
        // the policy: forward, clipped loss, backward into the policy adapter
        model_forward(m, policy, p->ids, nu, b->T);
        model_logprobs(m, p->tg, b->inv_temp, p->full);
        to_comp(b, r, nu, p->full, now);
        ppo_policy_loss(c, k, now, old, adv, mask, p->dcur, &s);
        for (size_t i = 0; i < k; i++) p->dcur[i] *= share;
        from_comp(b, r, nu, p->dcur, p->dfull);
        model_backward(m, policy, p->dfull);
        double every = (double)nu / n;  // (approxkl and the ratio are means over every position, as TRL's)
        ls->pg_loss += share * s.pg_loss, ls->pg_clipfrac += share * s.pg_clipfrac;
        ls->vf_loss += share * s.vf_loss, ls->vf_clipfrac += share * s.vf_clipfrac;
        ls->approxkl += every * s.approxkl, ls->ratio_mean += every * s.ratio_mean;
    }
    ls->loss = ls->pg_loss + c->vf_coef * ls->vf_loss;
}

void ppo_step(PpoTrainer *p, Model *m, LoRA *policy, const PpoBatch *b, int mb, const OptimConfig *o, long step,
              PpoStepStats *st) {
    const PpoConfig *c = &p->c;
    int S = b->S, T = b->T, E = c->num_ppo_epochs, K = c->num_mini_batches, n = S / K;
    if (S != p->S || b->Tc != p->Tc) die("ppo_step: a batch of %d x %d, the trainer was made for %d x %d", S, b->Tc, p->S, p->Tc);
    if (T > p->cap_T) {
        p->cap_T = T;
        p->full = (double *)reallocCheck(p->full, (size_t)S * T * sizeof(double));
        p->dfull = (double *)reallocCheck(p->dfull, (size_t)S * T * sizeof(double));
        p->ids = (int *)reallocCheck(p->ids, (size_t)S * T * sizeof(int));
        p->tg = (int *)reallocCheck(p->tg, (size_t)S * T * sizeof(int));
    }
    memset(st, 0, sizeof *st);
    double t0 = now_sec();
    for (int i = 0; i < S; i++) p->perm[i] = i;
    rollout_passes(p, m, policy, b, mb);
    st->t_rollout_passes = now_sec() - t0;
    advantages(p, b, st);

    double *ratios = (double *)mallocCheck((size_t)E * K * sizeof(double));
    for (int e = 0; e < E; e++) {
        shuffle(p->perm, S, p->seed, step, e);
        for (int k = 0; k < K; k++) {
            lora_zero_grads(policy);
            value_zero_grads(&p->value);
            PpoLossStats ls;
            mini_batch(p, m, policy, b, p->perm + (size_t)k * n, n, mb, &ls);
            long u = (long)e * K + k;  // this step's update
            st->lr = lr_schedule(o->lr_scheduler_type, o->learning_rate, (step - 1) * E * K + u, o->warmup, o->total);
            st->grad_norm = lora_grad_norm(policy);
            st->value_grad_norm = value_grad_norm(&p->value);
            double cp = grad_clip_factor(st->grad_norm, o->max_grad_norm), cv = grad_clip_factor(st->value_grad_norm, o->max_grad_norm);
            if (!isfinite(cp) || !isfinite(cv))
                die("step %ld: the gradient norm is %g (policy) / %g (value), NaN or inf: lower --learning_rate or check the data",
                    step, st->grad_norm, st->value_grad_norm);
            if (cp != 1.0) lora_scale_grads(policy, (float)cp);
            if (cv != 1.0) value_scale_grads(&p->value, (float)cv);
            float lr = (float)st->lr, b1 = (float)o->beta1, b2 = (float)o->beta2, eps = (float)o->eps, wd = (float)o->weight_decay;
            lora_adamw_step(policy, lr, b1, b2, eps, wd);
            value_adamw_step(&p->value, lr, b1, b2, eps, wd);
            st->approxkl += ls.approxkl, st->pg_clipfrac += ls.pg_clipfrac, st->pg_loss += ls.pg_loss;
            st->vf_loss += ls.vf_loss, st->vf_clipfrac += ls.vf_clipfrac, st->ratio += ls.ratio_mean;
            st->loss = ls.loss;
            ratios[u] = ls.ratio_mean;
        }
    }
    int U = E * K;
    st->approxkl /= U, st->pg_clipfrac /= U, st->pg_loss /= U, st->vf_loss /= U, st->vf_clipfrac /= U, st->ratio /= U;
    double var = 0;  // torch's .var(): Bessel-corrected
    for (int u = 0; u < U; u++) var += (ratios[u] - st->ratio) * (ratios[u] - st->ratio);
    st->ratio_var = U > 1 ? var / (U - 1) : NAN;
    free(ratios);
}
