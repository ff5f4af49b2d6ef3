// dpo_train.c: DPO training: the preference JSONL, its tokens and TRL's truncations, the pairs'
// log-probabilities (policy, reference with the adapter off, or precomputed) and the optimizer
// step (dpo_train.h).
#include <math.h>

#include <cjson/cJSON.h>

#include "train/dpo_train.h"

// ----------------------------------------------------------------------------
// JSONL

// one line's object -> t; NULL, or what is wrong
static const char *read_pair(const cJSON *j, void *rec, long line, char *why, size_t cap) {
    PrefText *t = (PrefText *)rec;
    t->line = line;
    if (!cJSON_IsObject(j)) return "not a JSON object";
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt"), *c = cJSON_GetObjectItemCaseSensitive(j, "chosen"),
                *r = cJSON_GetObjectItemCaseSensitive(j, "rejected");
    const char *system = NULL, *user = NULL, *cho = NULL, *rej = NULL, *s2 = NULL, *u2 = NULL, *unused = NULL, *e;
    if (!c || !r) {
        if (cJSON_GetObjectItemCaseSensitive(j, "label"))
            return "unpaired preference data (\"completion\"/\"label\", KTO's format) is not supported: give \"prompt\", \"chosen\" and "
                   "\"rejected\"";
        if (cJSON_GetObjectItemCaseSensitive(j, "completion") || cJSON_GetObjectItemCaseSensitive(j, "messages"))
            return "a completion without a rejected one is ./train_sft's data: DPO needs \"chosen\" and \"rejected\" (and \"prompt\")";
        return !c && !r ? "missing \"chosen\" and \"rejected\"" : !c ? "missing \"chosen\"" : "missing \"rejected\"";
    }
    if (!p) {  // implicit prompt: two whole conversations that share their start
        if (!cJSON_IsArray(c) || !cJSON_IsArray(r))
            return "missing \"prompt\" (a prompt inside \"chosen\" and \"rejected\" is understood for chat messages only: give \"prompt\")";
        if ((e = sft_read_messages(c, "chosen", 1, 1, &system, &user, &cho, why, cap))) return e;
        if ((e = sft_read_messages(r, "rejected", 1, 1, &s2, &u2, &rej, why, cap))) return e;
        if (strcmp(user, u2) || (system == NULL) != (s2 == NULL) || (system && strcmp(system, s2)))
            return "\"chosen\" and \"rejected\" start with different prompts: both must hold the same system and user messages";
        t->conversational = 1;
    } else if (cJSON_IsString(p) && cJSON_IsString(c) && cJSON_IsString(r)) {
        user = p->valuestring, cho = c->valuestring, rej = r->valuestring;
    } else if (cJSON_IsArray(p) && cJSON_IsArray(c) && cJSON_IsArray(r)) {
        if ((e = sft_read_messages(p, "prompt", 1, 0, &system, &user, &unused, why, cap))) return e;
        if ((e = sft_read_messages(c, "chosen", 0, 1, &unused, &unused, &cho, why, cap))) return e;
        if ((e = sft_read_messages(r, "rejected", 0, 1, &unused, &unused, &rej, why, cap))) return e;
        t->conversational = 1;
    } else {
        return "\"prompt\", \"chosen\" and \"rejected\" must all be text, or all lists of {\"role\", \"content\"} messages";
    }
    if (!*user) return t->conversational ? "the user message is empty" : "\"prompt\" is empty";
    t->system = system ? str_dup(system) : NULL;
    t->prompt = str_dup(user);
    t->chosen = str_dup(cho);
    t->rejected = str_dup(rej);
    return NULL;
}

void pref_texts_free(PrefText *t, long n) {
    for (long i = 0; i < n; i++) free(t[i].system), free(t[i].prompt), free(t[i].chosen), free(t[i].rejected);
    free(t);
}
static void texts_free(void *t, long n) { pref_texts_free((PrefText *)t, n); }

int pref_read_jsonl(const char *path, PrefText **out, long *n, char *err, size_t cap) {
    return jsonl_read_all(path, sizeof(PrefText), read_pair, texts_free, "{\"prompt\", \"chosen\", \"rejected\"}", (void **)out, n,
                          err, cap);
}

// ----------------------------------------------------------------------------
// text -> tokens

// The truncations of one side: max_prompt_length and max_completion_length as TRL 0.28's
// DPOTrainer.tokenize_row, then max_length as TRL 1.16's DataCollatorForPreference (the whole
// sequence sliced, [:max_length] or [-max_length:]); 1 when something was cut
static int truncate_side(const PrefFormat *f, SftExample *e) {
    int plen = e->plen, clen = e->n - e->plen, cut = 0;
    if (f->max_prompt_length > 0 && plen > f->max_prompt_length) {  // the prompt's end is kept
        int drop = plen - f->max_prompt_length;
        memmove(e->ids, e->ids + drop, (size_t)(e->n - drop) * sizeof(int));
        plen -= drop, cut = 1;
    }
    if (f->max_completion_length > 0 && clen > f->max_completion_length) clen = f->max_completion_length, cut = 1;
    int n = plen + clen, ml = f->f.max_length;
    if (ml > 0 && n > ml) {
        cut = 1;
        if (f->keep_end) {  // the sequence's last ml tokens: the prompt's start goes first
            int drop = n - ml;
            memmove(e->ids, e->ids + drop, (size_t)ml * sizeof(int));
            plen = plen > drop ? plen - drop : 0;
        } else if (plen > ml) plen = ml;
        n = ml;
    }
    e->n = n, e->plen = plen;
    return cut;
}

// the completion tokens a sequence scores: those a position predicts (sft_batch_make's targets);
// with the prompt cut away entirely, the first token has no position before it
static int scored(const SftExample *e) { return e->n - (e->plen > 1 ? e->plen : 1); }

// What the chat template writes after the end-of-turn token that closes the assistant's reply: "\n"
// in ChatML ("<|im_end|>\n") and Gemma ("<end_of_turn>\n"), nothing in Llama 3 and Mistral. TRL
// 1.16 renders prompt + completion through the template and takes the completion as all that follows
// the prompt, so a conversational completion ends with it (TRL 0.28 stopped at the end-of-turn token).
static const char *after_turn_end(const Tokenizer *tok) {
    const char *fmt = tokenizer_chat_format(tok);
    return !strcmp(fmt, "chatml") || !strcmp(fmt, "gemma") ? "\n" : "";
}

// e's completion followed by the tokens of text (none when text is empty)
static void append_text(const Tokenizer *tok, SftExample *e, const char *text) {
    if (!*text) return;
    int *t, n = tokenizer_encode(tok, text, &t);
    e->ids = (int *)reallocCheck(e->ids, (size_t)(e->n + n) * sizeof(int));
    memcpy(e->ids + e->n, t, (size_t)n * sizeof(int));
    e->n += n;
    free(t);
}

int pref_encode(const PrefFormat *f, const char *system, const char *prompt, const char *chosen, const char *rejected,
                PrefPair *out) {
    SftFormat g = f->f;
    g.max_length = 0;  // TRL's truncations, below, instead of sft_encode's
    memset(out, 0, sizeof *out);
    sft_encode(&g, system, prompt, chosen, &out->chosen);
    sft_encode(&g, system, prompt, rejected, &out->rejected);
    if (g.chat) {  // the completion is an assistant turn of the template: it ends as the template ends it
        append_text(g.tok, &out->chosen, after_turn_end(g.tok));
        append_text(g.tok, &out->rejected, after_turn_end(g.tok));
    }
    int a = truncate_side(f, &out->chosen), b = truncate_side(f, &out->rejected);
    return a || b;
}

void pref_pair_free(PrefPair *p) {
    sft_example_free(&p->chosen);
    sft_example_free(&p->rejected);
}

// ----------------------------------------------------------------------------
// the data

int pref_data_load(PrefData *d, const char *path, const PrefFormat *f, uint64_t seed, char *err, size_t cap) {
    memset(d, 0, sizeof *d);
    if (pref_read_jsonl(path, &d->text, &d->n_text, err, cap) < 0) return -1;
    PrefPair *pairs = (PrefPair *)callocCheck(d->n_text, sizeof(PrefPair));
    long n = 0, truncated = 0, dropped = 0, first_dropped = 0;
    for (long i = 0; i < d->n_text; i++) {
        const PrefText *t = &d->text[i];
        if (t->conversational && !f->f.chat) {
            long line = t->line;
            for (long k = 0; k < n; k++) pref_pair_free(&pairs[k]);
            free(pairs);
            pref_data_free(d);
            return error_msg(err, cap, "%s:%ld: a conversation (chat messages), but prompts are raw text here (the checkpoint has no "
                             "chat template, or --chat 0): give \"prompt\"/\"chosen\"/\"rejected\" text", path, line);
        }
        PrefPair *p = &pairs[n];
        int cut = pref_encode(f, t->system, t->prompt, t->chosen, t->rejected, p);
        p->line = t->line;
        if (scored(&p->chosen) < 1 || scored(&p->rejected) < 1) {  // nothing of a completion left to score
            if (!dropped++) first_dropped = t->line;
            pref_pair_free(p);
            continue;
        }
        truncated += cut;
        n++;
    }
    if (n == 0) {
        free(pairs);
        pref_data_free(d);
        return error_msg(err, cap, "%s: every pair's prompt fills max_length %d (line %ld is the first): no completion token is left "
                         "to score: raise --max_length or lower --max_prompt_length", path, f->f.max_length, first_dropped);
    }
    PrefText *text = d->text;
    long n_text = d->n_text;
    pref_data_from_pairs(d, pairs, n, seed);
    d->text = text, d->n_text = n_text;
    d->truncated = truncated, d->dropped = dropped, d->first_dropped = first_dropped;
    return 0;
}

void pref_data_from_pairs(PrefData *d, PrefPair *pairs, long n, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->pairs = pairs, d->n = n, d->seed = seed, d->perm_epoch = -1;
    for (long i = 0; i < n; i++) {
        int a = pairs[i].chosen.n, b = pairs[i].rejected.n;
        if (a > d->max_tokens) d->max_tokens = a;
        if (b > d->max_tokens) d->max_tokens = b;
    }
    d->perm = (uint32_t *)mallocCheck((size_t)n * sizeof(uint32_t));
}

void pref_data_free(PrefData *d) {
    for (long i = 0; i < d->n; i++) pref_pair_free(&d->pairs[i]);
    free(d->pairs);
    pref_texts_free(d->text, d->n_text);
    free(d->perm);
    free(d->ref_chosen);
    free(d->ref_rejected);
    memset(d, 0, sizeof *d);
}

long pref_data_at(PrefData *d, long pos) { return data_order_at(d->perm, d->n, d->seed, &d->perm_epoch, pos); }

// ----------------------------------------------------------------------------
// log-probabilities

// the k pairs as one batch of 2k sequences: the chosen ones, then the rejected ones (TRL's concatenated_forward)
static void pairs_batch(const PrefPair *const *p, int k, SftBatch *b) {
    const SftExample **ex = (const SftExample **)mallocCheck(2 * (size_t)k * sizeof(SftExample *));
    for (int i = 0; i < k; i++) ex[i] = &p[i]->chosen, ex[k + i] = &p[i]->rejected;
    sft_batch_make(b, ex, 2 * k);
    free(ex);
}

// forward and logprobs of b on m with the adapter lo (or NULL); every row's summed completion log-probs (sums) and their count
// (counts, may be NULL); lp (B*T) keeps the per-token values
static void forward_sums(Model *m, LoRA *lo, const SftBatch *b, double *lp, double *sums, int *counts) {
    model_forward(m, lo, b->ids, b->B, b->T);
    model_logprobs(m, b->tg, 1.0f, lp);
    for (int r = 0; r < b->B; r++) {
        double s = 0;
        int c = 0;
        for (int t = 0; t < b->T; t++)
            if (b->tg[(size_t)r * b->T + t] >= 0) s += lp[(size_t)r * b->T + t], c++;
        sums[r] = s;
        if (counts) counts[r] = c;
    }
}

void pref_logps(Model *m, LoRA *lo, const PrefPair *const *p, int k, double *chosen, double *rejected, int *tc, int *tr) {
    SftBatch b;
    pairs_batch(p, k, &b);
    double *lp = (double *)mallocCheck((size_t)b.B * b.T * sizeof(double)), *sums = (double *)mallocCheck(2 * (size_t)k * sizeof(double));
    int *cnt = (int *)mallocCheck(2 * (size_t)k * sizeof(int));
    forward_sums(m, lo, &b, lp, sums, cnt);
    for (int i = 0; i < k; i++) {
        chosen[i] = sums[i], rejected[i] = sums[k + i];
        if (tc) tc[i] = cnt[i];
        if (tr) tr[i] = cnt[k + i];
    }
    free(lp), free(sums), free(cnt);
    sft_batch_free(&b);
}

void pref_precompute_ref(PrefData *d, Model *m, int micro_batch) {
    d->ref_chosen = (double *)reallocCheck(d->ref_chosen, (size_t)d->n * sizeof(double));
    d->ref_rejected = (double *)reallocCheck(d->ref_rejected, (size_t)d->n * sizeof(double));
    const PrefPair **pp = (const PrefPair **)mallocCheck((size_t)micro_batch * sizeof(PrefPair *));
    for (long i0 = 0; i0 < d->n; i0 += micro_batch) {
        int k = d->n - i0 < micro_batch ? (int)(d->n - i0) : micro_batch;
        for (int i = 0; i < k; i++) pp[i] = &d->pairs[i0 + i];
        pref_logps(m, NULL, pp, k, d->ref_chosen + i0, d->ref_rejected + i0, NULL, NULL);  // the base model
    }
    free(pp);
}

// ----------------------------------------------------------------------------
// the optimizer step

DpoStepStats dpo_step(DpoTrainer *dt, PrefData *d, const long *idx, int n, double lr) {
    SftTrainer *t = dt->t;
    Model *m = t->m;
    DpoStepStats s;
    memset(&s, 0, sizeof s);
    dpo_stats_init(&s.dpo);
    if (!d->ref_chosen && !t->lora)
        die("dpo_step: no reference: precompute its log-probabilities (pref_precompute_ref) or train a LoRA adapter (the reference "
            "is then the adapter off)");
    int mb = t->micro_batch;
    const PrefPair **pp = (const PrefPair **)mallocCheck((size_t)mb * sizeof(PrefPair *));
    double *v = (double *)mallocCheck(8 * (size_t)mb * sizeof(double));
    double *sums = v, *pc = v + 2 * mb, *pr = v + 3 * mb, *rc = v + 4 * mb, *rr = v + 5 * mb, *dc = v + 6 * mb, *dr = v + 7 * mb;
    int *cnt = (int *)mallocCheck(2 * (size_t)mb * sizeof(int));
    sft_zero_grads(t);
    for (int b0 = 0; b0 < n; b0 += mb) {
        int k = n - b0 < mb ? n - b0 : mb;
        for (int i = 0; i < k; i++) {
            pp[i] = &d->pairs[idx[b0 + i]];
            s.seq_tokens += pp[i]->chosen.n + pp[i]->rejected.n;
        }
        SftBatch b;
        pairs_batch(pp, k, &b);
        size_t N = (size_t)b.B * b.T;
        double *lp = (double *)mallocCheck(N * sizeof(double)), *w = (double *)mallocCheck(N * sizeof(double));
        if (d->ref_chosen) {
            for (int i = 0; i < k; i++) rc[i] = d->ref_chosen[idx[b0 + i]], rr[i] = d->ref_rejected[idx[b0 + i]];
        } else {  // the reference: the same weights with no adapter, before the forward the backward needs
            forward_sums(m, NULL, &b, lp, sums, NULL);
            for (int i = 0; i < k; i++) rc[i] = sums[i], rr[i] = sums[k + i];
        }
        forward_sums(m, t->lora, &b, lp, sums, cnt);
        for (int i = 0; i < k; i++) pc[i] = sums[i], pr[i] = sums[k + i];
        DpoInputs in = {pc, pr, rc, rr, cnt, cnt + k};
        double loss = dpo_loss(&dt->cfg, &in, k, n, dc, dr, &s.dpo);
        if (!isfinite(loss))
            die("DPO: the loss is %g (NaN/inf) at step %d: lower the learning rate", loss, t->lora ? t->lora->step + 1 : t->full->step + 1);
        // dL/dlogp of every scored token: its sequence's dL/d(summed log-prob)
        for (int r = 0; r < b.B; r++)
            for (int tt = 0; tt < b.T; tt++) {
                size_t o = (size_t)r * b.T + tt;
                w[o] = b.tg[o] >= 0 ? (r < k ? dc[r] : dr[r - k]) : 0;
            }
        model_backward(m, t->lora, w);
        free(lp), free(w);
        sft_batch_free(&b);
    }
    s.grad_norm = sft_apply(t, lr, "DPO");
    free(pp), free(v), free(cnt);
    return s;
}

// ----------------------------------------------------------------------------
// evaluation

DpoMetrics dpo_evaluate(DpoTrainer *dt, PrefData *d, int batch) {
    Model *m = dt->t->m;
    if (!d->ref_chosen && !dt->t->lora)
        die("dpo_evaluate: no reference: precompute the held-out pairs' log-probabilities (pref_precompute_ref) before training");
    const PrefPair **pp = (const PrefPair **)mallocCheck((size_t)batch * sizeof(PrefPair *));
    double *v = (double *)mallocCheck(4 * (size_t)batch * sizeof(double));
    double *pc = v, *pr = v + batch, *rc = v + 2 * batch, *rr = v + 3 * batch;
    int *cnt = (int *)mallocCheck(2 * (size_t)batch * sizeof(int));
    DpoEvalStats e;
    memset(&e, 0, sizeof e);
    for (long i0 = 0; i0 < d->n; i0 += batch) {
        int k = d->n - i0 < batch ? (int)(d->n - i0) : batch;
        for (int i = 0; i < k; i++) pp[i] = &d->pairs[i0 + i];
        pref_logps(m, dt->t->lora, pp, k, pc, pr, cnt, cnt + k);
        if (d->ref_chosen) {
            memcpy(rc, d->ref_chosen + i0, k * sizeof(double));
            memcpy(rr, d->ref_rejected + i0, k * sizeof(double));
        } else pref_logps(m, NULL, pp, k, rc, rr, NULL, NULL);  // the reference: no adapter
        DpoInputs in = {pc, pr, rc, rr, cnt, cnt + k};
        DpoStats st;
        dpo_stats_init(&st);
        dpo_loss(&dt->cfg, &in, k, k, NULL, NULL, &st);  // the batch's mean
        dpo_eval_add(&e, &st);
    }
    free(pp), free(v), free(cnt);
    return dpo_eval_metrics(&e);
}
