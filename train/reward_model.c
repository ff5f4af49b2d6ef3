// reward_model.c: a *ForSequenceClassification checkpoint as a reward (reward_model.h says what and how).
#include <cjson/cJSON.h>
#include <ctype.h>

#include "train/reward_model.h"
#include "io/safetensors.h"  // read_json_object, file_exists
#include "train/memory_fit.h"

// ----------------------------------------------------------------------------
// opening: every bound checked before the weights are read

// config.json's architectures[0] into cls and its pad_token_id (-1: none)
static void read_head_config(const char *dir, char *cls, size_t cap, int *pad) {
    char p[4096];
    path_join(p, sizeof p, dir, "config.json");
    if (!file_exists(p))
        die("--reward_model %s: no config.json: give the directory a *ForSequenceClassification checkpoint was saved to "
            "(save_pretrained)", dir);
    cJSON *root = read_json_object(p);
    cJSON *a0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0);
    snprintf(cls, cap, "%s", cJSON_IsString(a0) ? a0->valuestring : "a checkpoint without \"architectures\"");
    cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pad_token_id");
    *pad = cJSON_IsNumber(pt) ? pt->valueint : -1;
    cJSON_Delete(root);
}

void reward_model_open(RewardModel *rm, const char *dir, int conversational) {
    memset(rm, 0, sizeof *rm);
    rm->dir = dir;
    read_head_config(dir, rm->cls, sizeof rm->cls, &rm->pad);
    Config c;
    config_load_dir(&c, dir);
    const char *takes = "--reward_model takes a LlamaForSequenceClassification, Qwen2ForSequenceClassification or "
                        "Qwen3ForSequenceClassification checkpoint";
    if (!c.num_labels) die("--reward_model %s is a %s, not a reward model: %s", dir, rm->cls, takes);
    if (c.arch != ARCH_LLAMA && c.arch != ARCH_QWEN2 && c.arch != ARCH_QWEN3)
        die("--reward_model %s: unsupported architecture %s: %s", dir, rm->cls, takes);
    if (c.num_labels != 1)
        die("--reward_model %s: num_labels is %d (config.json's id2label): a reward model gives one score, num_labels 1", dir,
            c.num_labels);
    if (rm->pad < 0 || rm->pad >= c.V)
        die("--reward_model %s: config.json has no pad_token_id in [0, %d), which transformers needs to find each sequence's "
            "last token: set it to the tokenizer's pad token id", dir, c.V);
    SafeTensors st;
    st_open_dir(&st, dir);
    int has_score = st_find(&st, "score.weight") != NULL;
    st_close(&st);
    if (!has_score)
        die("--reward_model %s: the checkpoint has no score head (score.weight): save the reward model with its head "
            "(save_pretrained of the *ForSequenceClassification)", dir);
    char p[4096];
    path_join(p, sizeof p, dir, "tokenizer.json");
    if (!file_exists(p))
        die("--reward_model %s: no tokenizer.json: the reward model reads the text under its own tokenizer; save it beside the "
            "weights (tokenizer.save_pretrained)", dir);
    rm->tok = tokenizer_load_dir(dir);
    config_check_tokenizer(&c, tokenizer_vocab_size(rm->tok), dir);
    int tp = tokenizer_pad_id(rm->tok);
    if (tp >= 0 && tp != rm->pad)
        die("--reward_model %s: the tokenizer pads with id %d but config.json's pad_token_id is %d: transformers would score "
            "the padding; make them the same", dir, tp, rm->pad);
    const char *fmt = tokenizer_chat_format(rm->tok);
    if (conversational && strcmp(fmt, "chatml") && strcmp(fmt, "llama3") && strcmp(fmt, "llama3.1"))
        die("--reward_model %s: the data's prompts are messages, but the reward model's chat template is %s, not ChatML or "
            "Llama 3 (the ones built in for scoring a whole conversation): give the prompts as text", dir, fmt);
    if (conversational && tokenizer_chat_thinks(rm->tok))
        die("--reward_model %s: the data's prompts are messages, but the reward model's chat template writes a <think> block "
            "into the assistant's turn (Qwen3's), which is not built in for scoring a whole conversation: give the prompts as "
            "text", dir);
    reward_model_name(dir, rm->name, sizeof rm->name);
}

void reward_model_load(RewardModel *rm, const Backend *be, FP8Gran gran) {
    ModelOptions mo = {gran, 0, 0, 0, 0};
    model_load_classifier(&rm->m, rm->dir, be, &mo);
    rm->m.recompute = ACTS_FORWARD_ONLY;  // no backward ever: a forward's activations alone
    rm->head = (QWeight){.rows = 1, .cols = rm->m.cfg.C, .gran = FP8_OFF, .dense = rm->m.w.score};
}

void reward_model_name(const char *dir, char *out, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;  // "dir/": the name before the slash
    size_t b = n;
    while (b && dir[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

// ----------------------------------------------------------------------------
// the text it reads

// Jinja's |trim, for ASCII whitespace (Python's str.strip also removes Unicode spaces, which a completion
// rarely begins or ends with)
static void put_trimmed(char *out, const char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    memcpy(out, s, n);
    out[n] = 0;
}

char *reward_model_text(const RewardModel *rm, const Example *ex, const char *completion) {
    size_t nc = strlen(completion);
    if (!ex->messages) {  // TRL: prompt + completion, as text
        char *t = (char *)mallocCheck(strlen(ex->prompt) + nc + 1);
        strcpy(t, ex->prompt);
        strcat(t, completion);
        return t;
    }
    // the conversation with the completion as the assistant's turn, as the chat template renders it with
    // add_generation_prompt false: the generation prompt, the content, the end of the turn
    char *head = tokenizer_chat_text(rm->tok, ex->system, ex->prompt);
    int llama = strcmp(tokenizer_chat_format(rm->tok), "chatml") != 0;  // (open allowed only these two)
    char *t = (char *)mallocCheck(strlen(head) + nc + 16);
    strcpy(t, head);
    if (llama) {
        put_trimmed(t + strlen(t), completion);
        strcat(t, "<|eot_id|>");
    } else {
        strcat(t, completion);
        strcat(t, "<|im_end|>\n");
    }
    free(head);
    return t;
}

// ----------------------------------------------------------------------------
// scoring

// The policy's arena, idle between the rollout and the update, lent to the reward model's forward passes
// (the same memory plan: its activations are time-shared with the KV cache and the update's). Given back
// after; where the reward model grew it, the policy's activations (which lived in the old pool) are
// forgotten, as model_arena_reserve does.
static void arena_borrow(RewardModel *rm, Model *owner) {
    if (!owner || !owner->arena.cap) return;
    if (owner->arena.kv_bytes) die("reward model: the policy's arena holds a KV cache (score after the rollout)");
    rm->m.arena = owner->arena;
    memset(&rm->m.acts, 0, sizeof rm->m.acts);
}
static void arena_return(RewardModel *rm, Model *owner) {
    if (!owner || !owner->arena.cap) return;
    if (rm->m.arena.mem != owner->arena.mem) memset(&owner->acts, 0, sizeof owner->acts);
    owner->arena = rm->m.arena;
    memset(&rm->m.arena, 0, sizeof rm->m.arena);
    memset(&rm->m.acts, 0, sizeof rm->m.acts);
}

static void scratch(RewardModel *rm, int mb) {
    if (mb <= rm->mb_cap) return;
    const Backend *be = rm->m.be;
    if (rm->rows) be->free(rm->rows), be->free(rm->idx), be->free(rm->vals);
    rm->rows = be->alloc((size_t)mb * rm->m.cfg.C * dtype_size(be->act));
    rm->idx = be->alloc((size_t)mb * sizeof(int32_t));
    rm->vals = be->alloc((size_t)mb * dtype_size(be->hp));
    rm->mb_cap = mb;
}

// B rows of ids (lens) right-padded to T: their scores into out[b * stride]
static void score_batch(RewardModel *rm, int *const *ids, const int *lens, int B, double *out, int stride) {
    const Backend *be = rm->m.be;
    int T = 0;
    for (int b = 0; b < B; b++) T = lens[b] > T ? lens[b] : T;
    int *tok = (int *)mallocCheck((size_t)B * T * sizeof(int));
    int32_t *last = (int32_t *)mallocCheck(B * sizeof(int32_t));
    for (int b = 0; b < B; b++) {
        // transformers: the last position whose id is not pad_token_id (position 0 when every one is)
        last[b] = b * T;
        for (int t = 0; t < T; t++) {
            tok[(size_t)b * T + t] = t < lens[b] ? ids[b][t] : rm->pad;
            if (t < lens[b] && ids[b][t] != rm->pad) last[b] = b * T + t;
        }
    }
    size_t acts = model_acts_bytes(&rm->m, B, T, ACTS_FORWARD_ONLY);
    rm->peak_acts = acts > rm->peak_acts ? acts : rm->peak_acts;
    model_forward(&rm->m, NULL, tok, B, T);  // no adapter: the reward model is frozen
    scratch(rm, B);
    be->upload(rm->idx, last, B * sizeof(int32_t));
    be->gather_rows(rm->rows, rm->m.acts.lnf, (const int32_t *)rm->idx, B, rm->m.cfg.C);
    be->logits_forward(rm->vals, rm->rows, &rm->head, B);  // (B, 1) hp: lnf[last] . score
    size_t hp = dtype_size(be->hp);
    void *tmp = mallocCheck(B * hp);
    double *v = (double *)mallocCheck(B * sizeof(double));
    be->download(tmp, rm->vals, B * hp);
    convert_to_f64(v, tmp, be->hp, B);
    for (int b = 0; b < B; b++) out[(size_t)b * stride] = v[b];
    free(tmp), free(v), free(tok), free(last);
}

void reward_model_score_ids(RewardModel *rm, Model *arena, int *const *ids, const int *lens, int S, double *out, int stride) {
    int T = 0;
    for (int q = 0; q < S; q++) {
        if (lens[q] < 1) die("reward model %s: a prompt and its completion encode to no tokens", rm->name);
        if (lens[q] > rm->m.cfg.max_pos)
            die("reward model %s: a prompt and its completion are %d of its tokens, more than its max_position_embeddings %d: "
                "lower --max_completion_length or shorten the prompts", rm->name, lens[q], rm->m.cfg.max_pos);
        T = lens[q] > T ? lens[q] : T;
    }
    rm->max_tokens = T > rm->max_tokens ? T : rm->max_tokens;
    arena_borrow(rm, arena);
    int mb = memfit_forward(&rm->m, S, T, rm->m.arena.cap);
    if (!mb)
        die("memory: the reward model's forward over one sequence of %d tokens needs %.2f GiB, more than the arena's %.2f GiB: "
            "raise --gpu_memory_utilization, use --reward_model_fp8 block, or lower --max_completion_length", T,
            model_acts_bytes(&rm->m, 1, T, ACTS_FORWARD_ONLY) / 1073741824.0, rm->m.arena.cap / 1073741824.0);
    for (int q0 = 0; q0 < S; q0 += mb) {
        int B = S - q0 < mb ? S - q0 : mb;
        score_batch(rm, ids + q0, lens + q0, B, out + (size_t)q0 * stride, stride);
    }
    arena_return(rm, arena);
}

void reward_model_score(RewardModel *rm, Model *arena, const Example *ex, int G, int S, char *const *texts, double *out,
                        int stride) {
    double t0 = now_sec();
    int **ids = (int **)callocCheck(S, sizeof(int *)), *lens = (int *)callocCheck(S, sizeof(int));
    for (int q = 0; q < S; q++) {
        char *text = reward_model_text(rm, &ex[q / G], texts[q]);
        lens[q] = tokenizer_encode(rm->tok, text, &ids[q]);
        free(text);
    }
    reward_model_score_ids(rm, arena, ids, lens, S, out, stride);
    for (int q = 0; q < S; q++) free(ids[q]);
    free(ids), free(lens);
    rm->seconds = now_sec() - t0;
}

void reward_model_init_random(RewardModel *rm, const Config *shape, const Backend *be, FP8Gran gran, uint64_t seed) {
    memset(rm, 0, sizeof *rm);
    Config c = *shape;
    c.num_labels = 1, c.tied = 1;  // a score head, no LM head
    ModelOptions mo = {gran, 0, 0, 0, 0};
    model_init_random(&rm->m, &c, be, &mo, seed);
    rm->m.recompute = ACTS_FORWARD_ONLY;
    rm->head = (QWeight){.rows = 1, .cols = c.C, .gran = FP8_OFF, .dense = rm->m.w.score};
    float *w = (float *)mallocCheck(c.C * sizeof(float));
    for (int i = 0; i < c.C; i++) w[i] = (float)(((i * 7919) % 13) - 6) / (6.0f * sqrtf((float)c.C));
    be->upload_convert(rm->m.w.score, be->act, w, DT_F32, c.C);
    free(w);
    rm->pad = c.V - 1;
    snprintf(rm->name, sizeof rm->name, "random");
    snprintf(rm->cls, sizeof rm->cls, "random *ForSequenceClassification");
}

size_t reward_model_weight_bytes(const RewardModel *rm) { return rm->m.w.dense_bytes + rm->m.w.fp8_bytes; }

void reward_model_report(const RewardModel *rm, FILE *f) {
    fprintf(f, "reward model %s (%s): weights %.1f MiB (linear as %s), activations %.1f MiB at most (a forward's alone, "
            "%s), texts up to %d tokens\n", rm->name, rm->cls, reward_model_weight_bytes(rm) / 1048576.0,
            fp8_gran_name(rm->m.opt.gran), rm->peak_acts / 1048576.0, rm->m.acts.mem ? "an allocation of their own" : "in the policy's arena",
            rm->max_tokens);
}

void reward_model_close(RewardModel *rm) {
    const Backend *be = rm->m.be;
    if (rm->rows) be->free(rm->rows), be->free(rm->idx), be->free(rm->vals);
    if (be) model_free(&rm->m);
    if (rm->tok) tokenizer_free(rm->tok);
    memset(rm, 0, sizeof *rm);
}
