// builtin.c: the built-in model: its shape, its warm-up and the cache of it, greedy held-out
// accuracy (builtin.h).
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <pwd.h>
#include <sys/file.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "rollout.h"
#include "io/safetensors.h"
#include "train/builtin.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train/sft.h"

Config builtin_config(int V, int gpu) {
    Config c = {0};
    c.arch = ARCH_QWEN3;
    c.V = (V + 7) / 8 * 8;
    c.C = gpu ? 256 : 128;
    c.FF = gpu ? 768 : 256;
    c.L = gpu ? 6 : 4;
    c.NH = gpu ? 8 : 4;
    c.KVH = gpu ? 4 : 2;
    c.HD = 32;
    c.max_pos = 64;
    c.eps = 1e-6f;
    c.rope_theta = 10000.0f;
    c.qk_norm = 1;
    c.tied = 1;
    c.bos_id = -1;
    c.eos_ids[0] = 256;  // <|endoftext|> of tokenizer_byte_level()
    c.n_eos = 1;
    return c;
}

// ----------------------------------------------------------------------------
// prompts and completions as tokens

int encode_prompt(const Formatter *f, const Example *ex, int **ids) {
    // a conversational line's messages as it gives them (its system message or none), else --system_prompt's
    const char *text = ex->prompt, *system = ex->messages ? ex->system : f->system;
    int n = f->chat ? tokenizer_chat_prompt(f->tok, system, text, ids) : tokenizer_encode(f->tok, text, ids);
    if (n == 0) die("a prompt encodes to no tokens: '%s'", text);
    if (n > f->max_prompt) die("a prompt has %d tokens, more than max_prompt_length %d: '%.60s...'", n, f->max_prompt, text);
    return n;
}

int prompts_in_chat(const Tokenizer *tok, int chat_opt, const char *system_prompt, const char *model) {
    int chat = !model ? 0 : chat_opt >= 0 ? chat_opt : strcmp(tokenizer_chat_format(tok), "none") != 0;
    if (system_prompt && !chat) {
        if (!model) die("--system_prompt: the built-in model reads its prompts as raw text, with no chat template to hold a system "
                        "message: drop --system_prompt");
        if (chat_opt == 0) die("--system_prompt: --chat 0 gives the prompts as raw text, with no chat template to hold a system "
                               "message: drop one of the two");
        die("--system_prompt: %s has no chat template (tokenizer_config.json's chat_template), so its prompts are raw text with "
            "no place for a system message: drop --system_prompt, or write it into the prompts", model);
    }
    return chat;
}


// ----------------------------------------------------------------------------
// held-out accuracy: greedy, one completion per prompt

// an accuracy as printed: "0.650", or why there is none (never "nan")
const char *acc_text(double acc, const char *why_none, char *buf, size_t cap) {
    if (isfinite(acc)) snprintf(buf, cap, "%.3f", acc);
    else snprintf(buf, cap, "%s", why_none);
    return buf;
}

// the held-out problems an evaluation of n asks for that exist (0: none)
int eval_count(const Task *task, int n) {
    long avail = task_size(task, SPLIT_HELDOUT);
    if (n <= 0 || avail == 0) return 0;
    return avail > 0 && n > avail ? (int)avail : n;
}

// the number of held-out problems i0 <= i < i1 answered correctly (greedy) with the adapter lo; each (or
// NULL): every problem's reward, i1 - i0 of them
double evaluate_range(Model *m, LoRA *lo, const Task *task, const Formatter *f, int i0, int i1, int max_new, const int *eos, int neos,
                             double *each) {
    int n = i1 - i0;
    if (n <= 0) return 0;
    int **prompts = (int **)mallocCheck(n * sizeof(int *)), *plens = (int *)mallocCheck(n * sizeof(int));
    Example *ex = (Example *)callocCheck(n, sizeof(Example));
    uint64_t *seeds = (uint64_t *)callocCheck(n, sizeof(uint64_t));
    for (int i = 0; i < n; i++) {
        task_example(task, SPLIT_HELDOUT, i0 + i, &ex[i]);
        plens[i] = encode_prompt(f, &ex[i], &prompts[i]);
    }
    RolloutConfig rc = {1, max_new, 0.0f, 1.0f, 0, eos, neos, 16, 1};
    Rollout r;
    rollout_run(m, lo, &rc, n, (const int *const *)prompts, plens, seeds, &r);
    double correct = 0;
    for (int i = 0; i < n; i++) {
        char *text = tokenizer_decode_ex(f->tok, r.ids + (size_t)i * max_new, r.len[i], 1, NULL);
        double c = reward_correctness(&ex[i], text, r.truncated[i]);
        if (each) each[i] = c;
        correct += c;
        free(text);
        free(prompts[i]);
        example_free(&ex[i]);
    }
    rollout_free(&r);
    free(prompts);
    free(plens);
    free(ex);
    free(seeds);
    return correct;
}

double evaluate(Model *m, LoRA *lo, const Task *task, const Formatter *f, int n, int max_new, const int *eos, int neos) {
    n = eval_count(task, n);
    return n ? evaluate_range(m, lo, task, f, 0, n, max_new, eos, neos, NULL) / n : NAN;
}

// ----------------------------------------------------------------------------
// supervised warm-up of the built-in model: SFT (sft.h) of every weight (full_finetune.h) on task
// demonstrations "prompt answer<eos>" made in memory, the loss on the answer tokens only.
// It gives GRPO a model that is sometimes right, so rewards have variance to learn from.

// The answer a warm-up demonstration shows. With probability p_forget an addition whose
// ones digits carry is shown with the carry forgotten ("17+25=32"): imperfect data, as real
// SFT data is. The warmed-up model then makes this one systematic error often; the
// correctness reward lets GRPO find and fix it, and the fix carries over to held-out problems.
void demo_answer(const Example *ex, double p_forget, Rng *r, char *out, size_t cap) {
    long a, b;
    char op;
    snprintf(out, cap, "%s", ex->answer);
    if (p_forget <= 0 || ex->kind != TASK_ARITHMETIC || sscanf(ex->prompt, "%ld%c%ld=", &a, &op, &b) != 3 || op != '+')
        return;
    if (a % 10 + b % 10 >= 10 && rng_uniform_d(r) < p_forget) snprintf(out, cap, "%ld", a + b - 10);
}

static void sft_warmup(Model *m, const Task *task, const Formatter *f, int steps, int batch, long seed, int eos, int quiet,
                       int eval_size, int max_new, double p_forget) {
    Rng demo_rng = rng_make((uint64_t)seed ^ 0xd3e0ull);
    FullTrainer ft;
    full_init(&ft, m);
    SftTrainer tr = {.m = m, .full = &ft, .micro_batch = batch, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .max_grad_norm = 1.0};
    SftFormat fmt = {.tok = f->tok, .eos = eos};
    SftExample *ex = (SftExample *)callocCheck(batch, sizeof(SftExample));
    const SftExample **exp = (const SftExample **)mallocCheck(batch * sizeof(SftExample *));
    double t0 = now_sec();
    for (int step = 0; step < steps; step++) {
        for (int b = 0; b < batch; b++) {  // the step's demonstrations: the same on every run
            Example e;
            task_example(task, SPLIT_TRAIN, (uint64_t)step * batch + b + (uint64_t)seed * 1000003ull, &e);
            char ans[64];
            demo_answer(&e, p_forget, &demo_rng, ans, sizeof ans);
            sft_encode(&fmt, NULL, e.prompt, ans, &ex[b]);
            exp[b] = &ex[b];
            example_free(&e);
        }
        double lr = lr_schedule("cosine", 3e-3, step, steps / 10, steps);
        SftStats st = sft_step(&tr, exp, batch, lr);
        if (!quiet && ((step + 1) % 50 == 0 || step == steps - 1)) {
            double acc = evaluate(m, NULL, task, f, eval_size, max_new, &eos, 1);
            printf("warm-up %4d/%d | loss %.4f | grad_norm %.3f | lr %.2e | held-out %.3f | %.1f s\n", step + 1, steps, st.loss,
                   st.grad_norm, lr, acc, now_sec() - t0);
        }
        for (int b = 0; b < batch; b++) sft_example_free(&ex[b]);
    }
    full_free(&ft);
    free(ex);
    free(exp);
}

// The built-in byte-level vocabulary as a Hugging Face tokenizer.json, so that the warm-up
// directory is a checkpoint ./generate reads on its own: BPE without merges over ByteLevel
// without the regex split or a prefix space, so each byte is one token as in
// tokenizer_byte_level(), and its special tokens as added tokens. (test_train_grpo reads it back
// through tokenizer_load_dir and compares ids and text with tokenizer_byte_level's.)
static void write_tokenizer_json(const Tokenizer *tok, const char *path) {
    cJSON *root = cJSON_CreateObject(), *vocab = cJSON_CreateObject(), *added = cJSON_CreateArray();
    for (int id = 0; id < tokenizer_vocab_size(tok); id++) {
        const char *s = tokenizer_token_str(tok, id);  // byte-level form: byte 0x20 is "Ġ"
        if (!s) continue;
        if (!tokenizer_is_special(tok, id)) {
            cJSON_AddNumberToObject(vocab, s, id);
            continue;
        }
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", id);
        cJSON_AddStringToObject(a, "content", s);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
    }
    cJSON *bytelevel[2];
    for (int i = 0; i < 2; i++) {  // the pre-tokenizer and the decoder
        bytelevel[i] = cJSON_CreateObject();
        cJSON_AddStringToObject(bytelevel[i], "type", "ByteLevel");
        cJSON_AddBoolToObject(bytelevel[i], "add_prefix_space", 0);
        cJSON_AddBoolToObject(bytelevel[i], "trim_offsets", 1);
        cJSON_AddBoolToObject(bytelevel[i], "use_regex", 0);
    }
    cJSON *model = cJSON_CreateObject();
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", cJSON_CreateArray());
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", bytelevel[0]);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON_AddItemToObject(root, "decoder", bytelevel[1]);
    cJSON_AddItemToObject(root, "model", model);
    char *text = cJSON_Print(root);
    write_file_atomic(path, text, strlen(text));
    free(text);
    cJSON_Delete(root);
}


WarmupSpec warmup_spec_default(void) {
    WarmupSpec w = {"arithmetic", 30, 1000, 0.7, 42, 0, 200, 8};
    return w;
}

// The XDG base-directory rule for caches (Hugging Face's hub cache follows it too): $XDG_CACHE_HOME
// when it is an absolute path (the specification ignores a relative one), else ~/.cache.
void warmup_cache_root(char *out, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/') {
        snprintf(out, cap, "%s/fp8-grpo", xdg);
        return;
    }
    if (!home || home[0] != '/') {
        const struct passwd *pw = getpwuid(getuid());
        home = pw && pw->pw_dir && pw->pw_dir[0] == '/' ? pw->pw_dir : NULL;
    }
    if (!home) die("the built-in model's warm-up has no cache directory: set XDG_CACHE_HOME (or HOME) to an absolute path");
    snprintf(out, cap, "%s/.cache/fp8-grpo", home);
}

const char *path_for_shell(const char *dir, char *out, size_t cap) {
    const char *home = getenv("HOME");
    size_t n = home ? strlen(home) : 0;
    if (!n || home[0] != '/' || strncmp(dir, home, n) || dir[n] != '/') return dir;
    for (const char *p = dir + n; *p; p++)
        if (!(isalnum((unsigned char)*p) || strchr("_./+=:,@%-", *p))) return dir;
    snprintf(out, cap, "~%s", dir + n);
    return out;
}

void warmup_key(const WarmupSpec *w, const Config *tc, const char *root, char *json, size_t jcap, char *dir, size_t dcap) {
    snprintf(json, jcap, "{\"task\":\"%s\",\"max_operand\":%d,\"steps\":%d,\"carry_errors\":%g,\"seed\":%ld,\"C\":%d,\"L\":%d,\"FF\":%d}",
             w->task, w->max_operand, w->steps, w->carry_errors, w->seed, tc->C, tc->L, tc->FF);
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (const char *c = json; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    snprintf(dir, dcap, "%s/warmup-%08x", root, (unsigned)(h ^ h >> 32));
}

// What the built-in model is, beside its tokenizer.json, for the programs that read the warm-up as a
// checkpoint (./train_sft, ./generate, transformers): no chat template (its prompts are raw text; the
// vocabulary's ChatML tokens are not a template), and its one end token, <|endoftext|>, not the
// <|im_end|> a vocabulary with ChatML tokens suggests.
static void write_tokenizer_config(const char *dir) {
    char p[4200];
    path_join(p, sizeof p, dir, "tokenizer_config.json");
    const char *text = "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"eos_token\": \"<|endoftext|>\",\n"
                       "  \"bos_token\": null,\n  \"pad_token\": null,\n  \"chat_template\": null\n}\n";
    write_file_atomic(p, text, strlen(text));
}

// dir's parents made (mkdir -p) and dir's lock taken: <parent>/.<name>.lock, flock'ed, so that of
// the runs that need one warm-up at once one makes it and the others wait for it. Returns the lock's
// fd (closing it lets go; so does the process's end, however it ends).
static int lock_warmup(const char *dir) {
    char p[4500];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = strchr(p + 1, '/'); c; c = strchr(c + 1, '/')) {  // the parents
        *c = 0;
        mkdir_or_die(p);
        *c = '/';
    }
    const char *name = strrchr(dir, '/');
    snprintf(p, sizeof p, "%.*s/.%s.lock", (int)(name - dir), dir, name + 1);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) die("cannot open %s (%s): is the warm-up cache writable? (XDG_CACHE_HOME sets where it is)", p, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        printf("built-in model: another run is making or checking this warm-up (%s): waiting for it\n", dir);
        if (flock(fd, LOCK_EX) != 0) die("cannot lock %s (%s)", p, strerror(errno));
    }
    return fd;
}

void warmup_ensure(const WarmupSpec *w, const Config *tc, const Backend *be, const Task *task, const Formatter *f, const char *json,
                   const char *dir) {
    char wjson[4500], tmp[4500], p[4600];
    path_join(wjson, sizeof wjson, dir, "warmup.json");
    int lock = lock_warmup(dir);
    if (dir_exists(dir)) {
        if (!file_exists(wjson)) die("%s holds no warmup.json: not a warm-up this program made; remove it", dir);
        char *text = read_file(wjson, NULL), have[512];
        snprintf(have, sizeof have, "%s", text);
        int same = !strcmp(text, json);
        free(text);
        if (!same) die("%s holds another warm-up (%.200s) than this run's (%s): remove it", dir, have, json);
        path_join(p, sizeof p, dir, "tokenizer_config.json");
        if (!file_exists(p)) write_tokenizer_config(dir);  // (a warm-up cached before the file was written)
        printf("built-in model: warm-up loaded from %s\n", dir);
        close(lock);
        return;
    }
    printf("built-in model: %d layers, hidden %d, vocab %d (byte-level); supervised warm-up on '%s' for %d steps (cached in %s)\n",
           tc->L, tc->C, tc->V, w->task, w->steps, dir);
    Model m;  // every weight trained (full_finetune.h), unquantized, on the run's backend
    ModelOptions dense = {FP8_OFF, 0, 0, 0, 0};
    model_init_random(&m, tc, be, &dense, (uint64_t)w->seed);
    sft_warmup(&m, task, f, w->steps, 64, w->seed, tc->eos_ids[0], w->quiet, w->eval_size, w->max_new, w->carry_errors);
    snprintf(tmp, sizeof tmp, "%s.tmp-*", dir);  // what a run killed while making it left
    glob_t g;
    if (glob(tmp, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) rm_rf(g.gl_pathv[i]);
    globfree(&g);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", dir, (int)getpid());
    mkdir_or_die(tmp);
    model_save_hf(&m, tmp, DT_F32);
    path_join(p, sizeof p, tmp, "tokenizer.json");
    write_tokenizer_json(f->tok, p);
    write_tokenizer_config(tmp);
    path_join(p, sizeof p, tmp, "warmup.json");
    write_file_atomic(p, json, strlen(json));
    model_free(&m);
    if (rename(tmp, dir) != 0) die("cannot rename %s to %s (%s)", tmp, dir, strerror(errno));
    close(lock);
}
