// grpo_train.c: one GRPO step (grpo_train.h says what and why).
#include <math.h>

#include "train/grpo_train.h"
#include "train/memory_fit.h"

void grpo_step_init(GrpoStep *s, const GrpoSetup *u) {
    memset(s, 0, sizeof *s);
    s->u = *u;
    int G = u->rc.G, S = u->dp.S, Tc = u->rc.max_new, R = u->rewards->R;
    s->G = G, s->S = S, s->P = S / G, s->Tc = Tc, s->R = R;
    s->prompts = (int **)callocCheck(s->P, sizeof(int *));
    s->plens = (int *)mallocCheck(s->P * sizeof(int));
    s->ex = (Example *)callocCheck(s->P, sizeof(Example));
    s->seeds = (uint64_t *)mallocCheck(S * sizeof(uint64_t));
    s->rewards = (double *)mallocCheck((size_t)S * R * sizeof(double));
    s->rewards_all = (double *)mallocCheck((size_t)u->dp.S_all * R * sizeof(double));
    s->adv_all = (double *)mallocCheck((size_t)u->dp.S_all * sizeof(double));
    s->adv = (double *)mallocCheck(S * sizeof(double));
    s->mask = (uint8_t *)mallocCheck((size_t)S * Tc);
    s->trunc = (uint8_t *)mallocCheck(S);
    s->samp = (double *)mallocCheck((size_t)S * Tc * sizeof(double));
    s->start = (int *)mallocCheck(S * sizeof(int));
    size_t n = (size_t)S * Tc * sizeof(double);
    s->logp = (double *)mallocCheck(n), s->old = (double *)mallocCheck(n);
    s->ref = (double *)mallocCheck(n), s->dlogp = (double *)mallocCheck(n);
}

void grpo_step_end(GrpoStep *s) {
    rollout_free(&s->ro);
    free(s->ids), free(s->tg);
    s->ids = s->tg = NULL;
}

void grpo_step_free(GrpoStep *s) {
    grpo_step_end(s);
    for (int p = 0; p < s->P; p++) {
        example_free(&s->ex[p]);
        free(s->prompts[p]);
    }
    free(s->prompts), free(s->plens), free(s->ex), free(s->seeds), free(s->rewards), free(s->adv), free(s->mask), free(s->trunc);
    free(s->rewards_all), free(s->adv_all), free(s->samp), free(s->start);
    free(s->logp), free(s->old), free(s->ref), free(s->dlogp), free(s->lp), free(s->dl);
    memset(s, 0, sizeof *s);
}

void grpo_train_step(GrpoStep *s, Model *m, LoRA *lo, FullTrainer *ft, int step) {
    grpo_rollout(s, m, lo, step);  // P prompts x G completions, sampled with the adapter
    grpo_score(s, m, step);        // rewards (built-in, reward programs, a reward model) -> group advantages
    grpo_update(s, m, lo, ft, step);  // the batch; reference / old logprobs, num_iterations x (forward, backward, AdamW)
}

// seed of sequence q at step `step`: the same on every run and after resume
static uint64_t seq_seed(uint64_t seed, long step, int q, uint64_t purpose) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)step * 0xbf58476d1ce4e5b9ull ^ (uint64_t)q * 0x94d049bb133111ebull ^ purpose;
    return splitmix64(&x);
}

// ----------------------------------------------------------------------------
// 1. rollout: this rank's P of the step's P_all problems, G completions of each

void grpo_rollout(GrpoStep *s, Model *m, LoRA *lo, int step) {
    const DpBatch *b = &s->u.dp;
    s->t_step = now_sec();
    for (int p = 0; p < s->P; p++) {
        example_free(&s->ex[p]);
        free(s->prompts[p]);
        task_example(s->u.task, SPLIT_TRAIN, (uint64_t)(step - 1) * b->P_all + b->p0 + p, &s->ex[p]);
        s->plens[p] = encode_prompt(s->u.fmt, &s->ex[p], &s->prompts[p]);
    }
    for (int q = 0; q < s->S; q++) s->seeds[q] = seq_seed(s->u.seed, step, b->q0 + q, 1);
    rollout_run(m, lo, &s->u.rc, s->P, (const int *const *)s->prompts, s->plens, s->seeds, &s->ro);
    s->t_roll = now_sec() - s->t_step;
}

// ----------------------------------------------------------------------------
// 2. and 3. rewards and advantages. With several ranks the rewards of all are gathered and the
// advantages computed over the whole batch (each rank then takes its rows), the normalizers and length
// metrics summed: every rank has the numbers one process would.

void grpo_score(GrpoStep *s, Model *m, int step) {
    const GrpoSetup *u = &s->u;
    int S = s->S, R = s->R, Tc = s->Tc;
    const Rollout *ro = &s->ro;
    s->gen_tokens = 0, s->minlen = Tc, s->maxlen = 0, s->nclip = 0;
    double t0 = now_sec();
    char **texts = (char **)mallocCheck(S * sizeof(char *)), err[1024];
    for (int q = 0; q < S; q++) texts[q] = tokenizer_decode_ex(u->tok, ro->ids + (size_t)q * Tc, ro->len[q], 1, NULL);
    if (reward_set_score(u->rewards, s->ex, s->G, S, texts, ro->ids, ro->len, Tc, ro->truncated, step, u->max_steps, s->rewards, err,
                         sizeof err))
        die("%s; the run stops here, its last checkpoint intact: fix the program, then --resume continues the run", err);
    if (u->rmodel) reward_model_score(u->rmodel, m, s->ex, s->G, S, texts, s->rewards + u->rewards->model_col, R);
    for (int q = 0; q < S; q++) free(texts[q]);
    free(texts);
    s->t_reward = now_sec() - t0;
    for (int q = 0; q < S; q++) {
        s->gen_tokens += ro->len[q];
        s->minlen = ro->len[q] < s->minlen ? ro->len[q] : s->minlen;
        s->maxlen = ro->len[q] > s->maxlen ? ro->len[q] : s->maxlen;
        s->nclip += ro->truncated[q];
        s->trunc[q] = ro->truncated[q];
        for (int j = 0; j < Tc; j++) {
            s->mask[q * Tc + j] = j < ro->len[q];
            s->samp[q * Tc + j] = j < ro->len[q] ? ro->logp[(size_t)q * Tc + j] : 0;
        }
    }
    const DpBatch *b = &u->dp;
    memcpy(s->rewards_all + (size_t)b->q0 * R, s->rewards, (size_t)S * R * sizeof(double));
    t0 = now_sec();  // the first collective after the rollout: a rank that finished first waits here
    dist_all_gather_host(u->dist, s->rewards_all, (size_t)S * R * sizeof(double));
    s->t_wait = now_sec() - t0;
    grpo_advantages(u->g, b->S_all, R, s->rewards_all, u->weights, s->adv_all, &s->rm);
    memcpy(s->adv, s->adv_all + b->q0, S * sizeof(double));  // (PPO: only the reward metrics are used)
    s->norm = dp_norm(u->dist, grpo_prepare(u->g, S, Tc, s->mask, s->trunc), b->S_all);
    double sums[3] = {(double)s->gen_tokens, s->nclip, s->t_wait}, ext[3] = {s->maxlen, -s->minlen, -s->t_wait};
    dist_all_reduce_sum_f64_host(u->dist, sums, 3);
    dist_all_reduce_max_f64_host(u->dist, ext, 3);
    s->gen_tokens = (long)sums[0], s->nclip = (int)sums[1], s->maxlen = (int)ext[0], s->minlen = (int)-ext[1];
    s->t_wait = sums[2] / b->world, s->t_wait_min = -ext[2];
}

// ----------------------------------------------------------------------------
// 4. the batch

// prompt + completion per sequence, right-padded to T; tg holds the token each position predicts
// where that is a completion token, else -1
static void make_batch(GrpoStep *s) {
    int S = s->S, G = s->G, Tc = s->Tc;
    const Rollout *ro = &s->ro;
    int T = 0;
    for (int q = 0; q < S; q++) T = s->plens[q / G] + ro->len[q] > T ? s->plens[q / G] + ro->len[q] : T;
    s->T = T;
    s->ids = (int *)callocCheck((size_t)S * T, sizeof(int));
    s->tg = (int *)mallocCheck((size_t)S * T * sizeof(int));
    for (int q = 0; q < S; q++) {
        int pl = s->plens[q / G];
        for (int t = 0; t < T; t++) {
            s->ids[q * T + t] = t < pl ? s->prompts[q / G][t] : (t - pl < ro->len[q] ? ro->ids[(size_t)q * Tc + t - pl] : 0);
            int j = t + 1 - pl;  // the completion token position t predicts
            s->tg[q * T + t] = (j >= 0 && j < ro->len[q]) ? ro->ids[(size_t)q * Tc + j] : -1;
        }
    }
    for (int q = 0; q < S; q++) s->start[q] = s->plens[q / G] - 1;  // completion token 0 is predicted there
}

// The update's micro-batch and recomputation for this step's T (memory_fit.h): the user's choice where
// given, else the largest that fits the arena; printed when it changes. When nothing fits, one line
// naming every option that would help.
static void fit_update(GrpoStep *s, Model *m) {
    const GrpoSetup *u = &s->u;
    int T = s->T;
    FitChoice fc;
    if (memfit_update(m, s->S, T, u->micro_batch_size, u->recompute, &fc) < 0) {
        char help[512];
        size_t n = snprintf(help, sizeof help, "%s", u->memory_help);
        if (fc.mb > 1) n += snprintf(help + n, sizeof help - n, "lower --micro_batch_size (now %d), ", fc.mb);
        if (!fc.recompute) n += snprintf(help + n, sizeof help - n, "turn on --gradient_checkpointing, ");
        snprintf(help + n, sizeof help - n, "or lower --max_completion_length (%d) / --max_prompt_length", s->Tc);
        die("memory: the update of sequences of %d tokens needs %.2f GiB of activations at micro-batch %d with%s "
            "recomputation, but the arena holds %.2f GiB: %s",
            T, fc.bytes / 1073741824.0, fc.mb, fc.recompute ? "" : "out", m->arena.cap / 1073741824.0, help);
    }
    if (m->arena.cap && (fc.mb != s->mb || fc.recompute != m->recompute))  // (no arena: the CPU, nothing to choose)
        printf("memory: updates in micro-batches of %d x %d tokens, recomputation %s (%s; activations %.2f GiB)\n", fc.mb,
               T, fc.recompute ? "on" : "off",
               u->micro_batch_size && u->recompute == 1 ? "as asked" : "chosen to fit the arena", fc.bytes / 1073741824.0);
    s->mb = fc.mb;
    m->recompute = fc.recompute;
}

void grpo_batch(GrpoStep *s, Model *m) {
    make_batch(s);
    fit_update(s, m);
}

// ----------------------------------------------------------------------------
// 5. the update

// full (nb, T): per-position values of sequences b0..b0+nb-1 -> comp (S, Tc): the values at
// their completion tokens (completion token j is predicted at position start + j), 0 after
static void to_completion(const GrpoStep *s, const double *full, double *comp, int b0, int nb) {
    for (int q = b0; q < b0 + nb; q++)
        for (int j = 0; j < s->Tc; j++) comp[q * s->Tc + j] = j < s->ro.len[q] ? full[(size_t)(q - b0) * s->T + s->start[q] + j] : 0;
}

void grpo_update(GrpoStep *s, Model *m, LoRA *lo, FullTrainer *ft, int step) {
    const GrpoSetup *u = &s->u;
    const GrpoConfig *g = u->g;
    const OptimConfig *o = &u->oc;
    double t_train0 = now_sec();
    grpo_batch(s, m);
    int S = s->S, T = s->T, Tc = s->Tc, mb = s->mb;
    const int *len = s->ro.len;
    if (T > s->cap_T) {
        s->cap_T = T;
        s->lp = (double *)reallocCheck(s->lp, (size_t)S * T * sizeof(double));
        s->dl = (double *)reallocCheck(s->dl, (size_t)S * T * sizeof(double));
    }
    double t0 = now_sec();
    int need_old = g->num_iterations > 1;
    for (int pass = 0; pass < 2; pass++) {  // 0: the reference, 1: the old policy
        if ((pass == 0 && g->beta == 0) || (pass == 1 && !need_old)) continue;
        for (int b0 = 0; b0 < S; b0 += mb) {
            int nb = S - b0 < mb ? S - b0 : mb;
            model_forward(m, pass == 1 ? lo : NULL, s->ids + (size_t)b0 * T, nb, T);
            model_logprobs(m, s->tg + (size_t)b0 * T, u->inv_temp, s->lp);
            to_completion(s, s->lp, pass == 0 ? s->ref : s->old, b0, nb);
        }
    }
    s->t_ref = now_sec() - t0;
    s->t_reduce = 0;
    GrpoStats gs;
    grpo_stats_init(&gs);
    for (int it = 0; it < g->num_iterations; it++) {
        grpo_stats_init(&gs);
        if (lo) lora_zero_grads(lo);
        else model_zero_grads(m);
        s->loss = 0;
        for (int b0 = 0; b0 < S; b0 += mb) {
            int nb = S - b0 < mb ? S - b0 : mb;
            model_forward(m, lo, s->ids + (size_t)b0 * T, nb, T);
            model_logprobs(m, s->tg + (size_t)b0 * T, u->inv_temp, s->lp);
            to_completion(s, s->lp, s->logp, b0, nb);
            GrpoInputs in = {s->logp + (size_t)b0 * Tc, need_old ? s->old + (size_t)b0 * Tc : NULL,
                             g->beta != 0 ? s->ref + (size_t)b0 * Tc : NULL, s->samp + (size_t)b0 * Tc, s->adv + b0,
                             s->mask + (size_t)b0 * Tc, s->trunc + b0};
            s->loss += grpo_loss(g, &s->norm, &in, nb, s->dlogp + (size_t)b0 * Tc, &gs);
            memset(s->dl, 0, (size_t)nb * T * sizeof(double));  // dL/dlogp back at the positions of the (nb, T) batch
            for (int q = b0; q < b0 + nb; q++)
                for (int j = 0; j < len[q]; j++) s->dl[(size_t)(q - b0) * T + s->start[q] + j] = s->dlogp[q * Tc + j];
            model_backward(m, lo, s->dl);
        }
        s->lr = lr_schedule(o->lr_scheduler_type, o->learning_rate, (step - 1) * g->num_iterations + it, o->warmup, o->total);
        if (!lo) {  // every weight: full_step clips the global norm and steps the masters (full_finetune.h)
            s->gnorm = full_step(ft, m, (float)s->lr, (float)o->beta1, (float)o->beta2, (float)o->eps, (float)o->weight_decay,
                                 o->max_grad_norm);
            continue;
        }
        // every rank's gradient of its rows, summed: the whole batch's (data_parallel.h); then the same clip
        // and AdamW step on every rank keep the copies equal
        s->t_reduce += dp_all_reduce_grads(u->dist, m->be, lo->grads, lo->n);
        s->gnorm = lora_grad_norm(lo);
        double clip = grad_clip_factor(s->gnorm, o->max_grad_norm);
        if (!isfinite(clip))
            die("step %d: the gradient norm is %g (NaN/inf): lower --learning_rate or check the data", step, s->gnorm);
        if (clip != 1.0) lora_scale_grads(lo, (float)clip);
        lora_adamw_step(lo, (float)s->lr, (float)o->beta1, (float)o->beta2, (float)o->eps, (float)o->weight_decay);
    }
    dp_stats(u->dist, &gs);
    double red[2] = {s->loss, s->t_reduce}, least = -s->t_reduce;
    dist_all_reduce_sum_f64_host(u->dist, red, 2);
    dist_all_reduce_max_f64_host(u->dist, &least, 1);
    s->loss = red[0], s->t_reduce = red[1] / dist_world(u->dist), s->t_reduce_min = -least;
    s->gm = grpo_metrics(&gs);
    s->t_train = now_sec() - t_train0, s->t_total = now_sec() - s->t_step;
}
