// sft.c: supervised fine-tuning: the JSONL data, its tokens, batches, the completion-only loss
// and the optimizer step (sft.h).
#include <ctype.h>
#include <errno.h>
#include <math.h>

#include <cjson/cJSON.h>

#include "dist/data_parallel.h"    // dp_all_reduce_grads
#include "tasks/tasks.h"  // jsonl_reader_open, jsonl_next
#include "train/optim.h"  // grad_clip_factor
#include "train/sft.h"

// ----------------------------------------------------------------------------
// JSONL

// Content given as a list of parts ([{"type": "text", "text": ...}, ...], the shape multimodal chat templates
// take: gemma-3-it's) made text in the message itself: the parts' texts joined as gemma-3-it's template joins
// them, each stripped of white space at both ends. An image part is refused: the vision tower is not read.
// NULL, or what is wrong (into why).
static const char *join_parts(cJSON *msg, const cJSON *parts, const char *field, int n, char *why, size_t cap) {
    size_t len = 0;
    char *out = (char *)mallocCheck(1);
    const cJSON *p;
    int k = 0;
    cJSON_ArrayForEach(p, parts) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type"), *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : NULL;
        if (t && (!strcmp(t, "image") || !strcmp(t, "image_url")))
            snprintf(why, cap, "\"%s\"[%d] has an image (part %d): fp8-grpo trains a model on text (Gemma 3's vision tower is "
                     "not read): give text parts only", field, n, k);
        else if (!t || strcmp(t, "text") || !cJSON_IsString(tx))
            snprintf(why, cap, "\"%s\"[%d]'s content part %d is not {\"type\": \"text\", \"text\": \"...\"}", field, n, k);
        else {
            const char *a = tx->valuestring, *b = a + strlen(a);
            while (*a && isspace((unsigned char)*a)) a++;
            while (b > a && isspace((unsigned char)b[-1])) b--;
            out = (char *)reallocCheck(out, len + (size_t)(b - a) + 1);
            memcpy(out + len, a, (size_t)(b - a));
            len += (size_t)(b - a);
            k++;
            continue;
        }
        free(out);
        return why;
    }
    out[len] = 0;
    cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateString(out));
    free(out);
    return NULL;
}

// A list of chat messages -> system (optional), user, assistant contents. want_user / want_reply
// say which roles the list must end with: "messages" has both, a conversational "prompt" the
// user turn alone, its "completion" the reply alone. Returns NULL, or what is wrong.
const char *sft_read_messages(const cJSON *list, const char *field, int want_user, int want_reply, const char **system,
                              const char **user, const char **reply, char *why, size_t cap) {
    const char *roles[16];
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(e, "role"), *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (cJSON_IsObject(e) && cJSON_IsArray(c)) {  // the line's own tree: the list is replaced by its text
            if (join_parts((cJSON *)e, c, field, n, why, cap)) return why;
            c = cJSON_GetObjectItemCaseSensitive(e, "content");
        }
        if (!cJSON_IsObject(e) || !cJSON_IsString(r) || !cJSON_IsString(c)) {
            snprintf(why, cap, "\"%s\"[%d] is not a {\"role\": ..., \"content\": \"text\"} message", field, n);
            return why;
        }
        if (n < 16) roles[n] = r->valuestring;
        n++;
    }
    // the roles wanted, in order: [system] user assistant (or the part of it this field holds)
    int k = 0, ok = n <= 16;
    *system = *user = *reply = NULL;
    const cJSON *msg = list->child;
    if (ok && want_user && k < n && !strcmp(roles[k], "system")) *system = cJSON_GetObjectItemCaseSensitive(msg, "content")->valuestring, k++, msg = msg->next;
    if (ok && want_user) {
        ok = k < n && !strcmp(roles[k], "user");
        if (ok) *user = cJSON_GetObjectItemCaseSensitive(msg, "content")->valuestring, k++, msg = msg->next;
    }
    if (ok && want_reply) {
        ok = k < n && !strcmp(roles[k], "assistant");
        if (ok) *reply = cJSON_GetObjectItemCaseSensitive(msg, "content")->valuestring, k++;
    }
    if (ok && k == n) return NULL;
    char got[256] = "";
    size_t g = 0;
    for (int i = 0; i < n && i < 16 && g + 40 < sizeof got; i++) g += snprintf(got + g, sizeof got - g, "%s%.30s", i ? ", " : "", roles[i]);
    if (n > 16) snprintf(got + g, sizeof got - g, ", ...");
    const char *supported = want_user && want_reply ? "an optional system message, one user turn and the assistant's reply"
                            : want_user           ? "an optional system message and one user turn"
                                                  : "one assistant message";
    snprintf(why, cap, "\"%s\" has the roles [%s]: %s are supported (multi-turn conversations are not)", field, n ? got : "none",
             supported);
    return why;
}

// one line's object -> t; NULL, or what is wrong
static const char *read_example(const cJSON *j, SftText *t, char *why, size_t cap) {
    if (!cJSON_IsObject(j)) return "not a JSON object";
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages"), *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "completion");
    const char *system = NULL, *user = NULL, *reply = NULL, *unused = NULL, *e;
    if (msgs) {
        if (p || c) return "both \"messages\" and \"prompt\"/\"completion\": give one of the two formats";
        if (!cJSON_IsArray(msgs)) return "\"messages\" must be a list of {\"role\", \"content\"} messages";
        if ((e = sft_read_messages(msgs, "messages", 1, 1, &system, &user, &reply, why, cap))) return e;
        t->conversational = 1;
    } else if (!p || !c) {
        if (cJSON_GetObjectItemCaseSensitive(j, "text"))
            return "\"text\" (language modelling, a loss on every token) is not supported: give \"prompt\" and \"completion\", or "
                   "\"messages\"";
        if (p && cJSON_GetObjectItemCaseSensitive(j, "answer"))
            return "missing \"completion\" (\"prompt\"/\"answer\" is train_grpo's data: SFT needs the completion to learn)";
        return p ? "missing \"completion\"" : c ? "missing \"prompt\"" : "missing \"prompt\" and \"completion\" (or \"messages\")";
    } else if (cJSON_IsString(p) && cJSON_IsString(c)) {
        user = p->valuestring, reply = c->valuestring;
    } else if (cJSON_IsArray(p) && cJSON_IsArray(c)) {
        if ((e = sft_read_messages(p, "prompt", 1, 0, &system, &user, &unused, why, cap))) return e;
        if ((e = sft_read_messages(c, "completion", 0, 1, &unused, &unused, &reply, why, cap))) return e;
        t->conversational = 1;
    } else {
        return "\"prompt\" and \"completion\" must both be text, or both lists of {\"role\", \"content\"} messages";
    }
    if (!*user) return t->conversational ? "the user message is empty" : "\"prompt\" is empty";
    t->system = system ? str_dup(system) : NULL;
    t->prompt = str_dup(user);
    t->completion = str_dup(reply);
    return NULL;
}

int jsonl_read_all(const char *path, size_t size, JsonlRecordFn read, void (*free_all)(void *, long), const char *expected,
                   void **out, long *n_out, char *err, size_t cap) {
    *out = NULL, *n_out = 0;
    JsonlReader rd;
    if (jsonl_reader_open(&rd, path, err, cap)) return -1;
    char why[512];
    long n = 0, ncap = 0;
    int rc;
    char *t = NULL;
    cJSON *j;
    while ((rc = jsonl_next(&rd, &j, err, cap)) > 0) {
        if (n == ncap) t = (char *)reallocCheck(t, (size_t)(ncap = ncap ? 2 * ncap : 256) * size);
        memset(t + n * size, 0, size);
        const char *e = read(j, t + n * size, rd.lineno, why, sizeof why);
        cJSON_Delete(j);
        if (e) {
            rc = error_msg(err, cap, "%s:%ld: %s", path, rd.lineno, e);
            break;
        }
        n++;
    }
    jsonl_reader_close(&rd);
    if (!rc && n == 0) rc = error_msg(err, cap, "%s: no examples (one JSON object per line: %s)", path, expected);
    if (rc) {
        free_all(t, n);
        return rc;
    }
    *out = t, *n_out = n;
    return 0;
}

static const char *read_example_at(const cJSON *j, void *t, long line, char *why, size_t cap) {
    ((SftText *)t)->line = line;
    return read_example(j, (SftText *)t, why, cap);
}
static void texts_free(void *t, long n) { sft_texts_free((SftText *)t, n); }

int sft_read_jsonl(const char *path, SftText **out, long *n_out, char *err, size_t cap) {
    return jsonl_read_all(path, sizeof(SftText), read_example_at, texts_free, "{\"prompt\", \"completion\"} or {\"messages\"}",
                          (void **)out, n_out, err, cap);
}

void sft_texts_free(SftText *t, long n) {
    for (long i = 0; i < n; i++) free(t[i].system), free(t[i].prompt), free(t[i].completion);
    free(t);
}

// ----------------------------------------------------------------------------
// text -> tokens

int sft_encode(const SftFormat *f, const char *system, const char *prompt, const char *completion, SftExample *out) {
    int *p, *c;
    int np = f->chat ? tokenizer_chat_prompt(f->tok, system ? system : f->system, prompt, &p) : tokenizer_encode(f->tok, prompt, &p);
    int nc = tokenizer_encode(f->tok, completion, &c);
    if (np == 0) die("a prompt encodes to no tokens: '%.60s'", prompt);
    int n = np + nc + 1, keep = f->max_length > 0 && n > f->max_length ? f->max_length : n;
    out->ids = (int *)mallocCheck((size_t)n * sizeof(int));
    memcpy(out->ids, p, np * sizeof(int));
    memcpy(out->ids + np, c, nc * sizeof(int));
    out->ids[np + nc] = f->eos;
    out->n = keep;
    out->plen = np;
    out->line = 0;
    free(p);
    free(c);
    return n - keep;
}

void sft_example_free(SftExample *e) {
    free(e->ids);
    memset(e, 0, sizeof *e);
}

int sft_eos_id(const Tokenizer *tok, int chat) {
    if (chat) {
        const char *fmt = tokenizer_chat_format(tok);
        int id = !strcmp(fmt, "chatml") ? tokenizer_token_id(tok, "<|im_end|>")
                 : !strncmp(fmt, "llama3", 6) ? tokenizer_token_id(tok, "<|eot_id|>")
                 : !strcmp(fmt, "gemma")       ? tokenizer_token_id(tok, "<end_of_turn>") : -1;
        if (id >= 0) return id;
    }
    int n;
    const int *e = tokenizer_eos_ids(tok, &n);
    return n > 0 ? e[0] : -1;
}

// ----------------------------------------------------------------------------
// the data

int sft_data_load(SftData *d, const char *path, const SftFormat *f, uint64_t seed, char *err, size_t cap) {
    memset(d, 0, sizeof *d);
    d->seed = seed;
    d->perm_epoch = -1;
    if (sft_read_jsonl(path, &d->text, &d->n_text, err, cap) < 0) return -1;
    d->ex = (SftExample *)callocCheck(d->n_text, sizeof(SftExample));
    for (long i = 0; i < d->n_text; i++) {
        const SftText *t = &d->text[i];
        if (t->conversational && !f->chat) {
            long line = t->line;  // (t is freed with d)
            sft_data_free(d);
            return error_msg(err, cap, "%s:%ld: a conversation (chat messages), but prompts are raw text here (the checkpoint has no "
                             "chat template, or --chat 0): give \"prompt\"/\"completion\" text", path, line);
        }
        SftExample *e = &d->ex[d->n];
        d->truncated += sft_encode(f, t->system, t->prompt, t->completion, e) > 0;
        e->line = t->line;
        if (e->n <= e->plen) {  // the prompt alone fills max_length: nothing to learn
            if (!d->dropped++) d->first_dropped = t->line;
            d->truncated--;
            sft_example_free(e);
            continue;
        }
        d->completion_tokens += e->n - e->plen;
        if (e->n > d->max_tokens) d->max_tokens = e->n;
        d->n++;
    }
    if (d->n == 0) {
        long first = d->first_dropped;
        sft_data_free(d);
        return error_msg(err, cap, "%s: every prompt fills max_length %d tokens (line %ld is the first): no completion token is "
                         "left to train on: raise --max_length", path, f->max_length, first);
    }
    d->perm = (uint32_t *)mallocCheck((size_t)d->n * sizeof(uint32_t));
    return 0;
}

void sft_data_free(SftData *d) {
    for (long i = 0; i < d->n; i++) sft_example_free(&d->ex[i]);
    free(d->ex);
    sft_texts_free(d->text, d->n_text);
    free(d->perm);
    memset(d, 0, sizeof *d);
}

long data_order_at(uint32_t *perm, long n, uint64_t seed, long *perm_epoch, long pos) {
    long epoch = pos / n;
    if (epoch != *perm_epoch) {  // Fisher-Yates with the epoch's own stream
        uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)epoch * 0xbf58476d1ce4e5b9ull ^ 0x5f7ull;
        Rng r = rng_make(splitmix64(&x));
        for (long i = 0; i < n; i++) perm[i] = (uint32_t)i;
        for (long i = n - 1; i > 0; i--) {
            long j = (long)(rng_u64(&r) % (uint64_t)(i + 1));
            uint32_t tmp = perm[i];
            perm[i] = perm[j], perm[j] = tmp;
        }
        *perm_epoch = epoch;
    }
    return perm[pos % n];
}

const SftExample *sft_data_at(SftData *d, long pos) { return &d->ex[data_order_at(d->perm, d->n, d->seed, &d->perm_epoch, pos)]; }

// ----------------------------------------------------------------------------
// a batch and its loss

void sft_batch_make(SftBatch *b, const SftExample *const *ex, int B) {
    int T = 0;
    for (int i = 0; i < B; i++) T = ex[i]->n > T ? ex[i]->n : T;
    b->B = B, b->T = T, b->ntok = 0;
    b->ids = (int *)callocCheck((size_t)B * T, sizeof(int));
    b->tg = (int *)mallocCheck((size_t)B * T * sizeof(int));
    for (int i = 0; i < B; i++) {
        const SftExample *e = ex[i];
        for (int t = 0; t < T; t++) {
            if (t < e->n) b->ids[(size_t)i * T + t] = e->ids[t];
            int predicts_completion = t >= e->plen - 1 && t + 1 < e->n;
            b->tg[(size_t)i * T + t] = predicts_completion ? e->ids[t + 1] : -1;
            b->ntok += predicts_completion;
        }
    }
}

void sft_batch_free(SftBatch *b) {
    free(b->ids);
    free(b->tg);
    memset(b, 0, sizeof *b);
}

double sft_loss(Model *m, LoRA *lo, const SftBatch *b, double norm, int backward) {
    size_t N = (size_t)b->B * b->T;
    double *lp = (double *)mallocCheck(N * sizeof(double)), *w = (double *)mallocCheck(N * sizeof(double));
    for (size_t i = 0; i < N; i++) w[i] = b->tg[i] >= 0 ? -1.0 / norm : 0;  // dL/dlogp
    model_forward(m, lo, b->ids, b->B, b->T);
    if (backward) model_logprobs_grad(m, b->tg, 1.0f, w, lp);  // the loss is linear in the logprobs: dL/dlogp = w
    else model_logprobs(m, b->tg, 1.0f, lp);
    double loss = 0;
    for (size_t i = 0; i < N; i++) loss += w[i] * lp[i];
    if (backward) model_backward(m, lo, NULL);
    free(lp);
    free(w);
    return loss;
}

// ----------------------------------------------------------------------------
// training

SftStats sft_step(SftTrainer *t, const SftExample *const *ex, int n, double lr) {
    Model *m = t->m;
    SftStats s = {0};
    if (!t->full == !t->lora) die("sft_step: train either every weight (full) or a LoRA adapter, not %s", t->full ? "both" : "neither");
    for (int i = 0; i < n; i++) {
        s.tokens += ex[i]->n - ex[i]->plen;
        s.seq_tokens += ex[i]->n;
    }
    if (t->dist) {  // the whole step's counts: the loss's normalizer is every rank's tokens
        double c[2] = {(double)s.tokens, (double)s.seq_tokens};
        dist_all_reduce_sum_f64_host(t->dist, c, 2);
        s.tokens = (long)c[0], s.seq_tokens = (long)c[1];
    }
    if (s.tokens == 0) die("sft_step: the step's examples have no completion token");
    sft_zero_grads(t);
    for (int b0 = 0; b0 < n; b0 += t->micro_batch) {
        SftBatch b;
        sft_batch_make(&b, ex + b0, n - b0 < t->micro_batch ? n - b0 : t->micro_batch);
        s.loss += sft_loss(m, t->lora, &b, (double)s.tokens, 1);
        s.pad_tokens += (long)b.B * b.T;
        sft_batch_free(&b);
    }
    if (t->dist) dist_all_reduce_sum_f64_host(t->dist, &s.loss, 1);
    s.grad_norm = sft_apply(t, lr, "SFT");
    return s;
}

double sft_eval(SftTrainer *t, const SftExample *const *ex, int n, long *tokens) {
    double c[2] = {0, 0};  // the NLL summed, the completion tokens
    for (int b0 = 0; b0 < n; b0 += t->micro_batch) {
        SftBatch b;
        sft_batch_make(&b, ex + b0, n - b0 < t->micro_batch ? n - b0 : t->micro_batch);
        c[0] += sft_loss(t->m, t->lora, &b, 1.0, 0);
        c[1] += (double)b.ntok;
        sft_batch_free(&b);
    }
    if (t->dist) dist_all_reduce_sum_f64_host(t->dist, c, 2);
    if (c[1] == 0) die("sft_eval: the held-out examples have no completion token");
    if (tokens) *tokens = (long)c[1];
    return c[0] / c[1];
}

void sft_zero_grads(SftTrainer *t) {
    if (t->full) model_zero_grads(t->m);
    else lora_zero_grads(t->lora);
}

double sft_apply(SftTrainer *t, double lr, const char *who) {
    if (t->full) return full_step(t->full, t->m, (float)lr, t->beta1, t->beta2, t->eps, t->weight_decay, t->max_grad_norm);
    if (t->dist) dp_all_reduce_grads(t->dist, t->m->be, t->lora->grads, t->lora->n);
    double norm = lora_grad_norm(t->lora), clip = grad_clip_factor(norm, t->max_grad_norm);
    if (!isfinite(clip)) die("%s: the gradient norm is %g (NaN/inf) at step %d: lower the learning rate", who, norm, t->lora->step + 1);
    if (clip != 1.0) lora_scale_grads(t->lora, (float)clip);
    lora_adamw_step(t->lora, (float)lr, t->beta1, t->beta2, t->eps, t->weight_decay);
    return norm;
}
