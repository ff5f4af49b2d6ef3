// train_grpo.c: GRPO + LoRA on one frozen FP8 copy of the weights.
//
//   make && ./train_grpo                       built-in tiny model + arithmetic task (warm-up, then GRPO)
//   ./train_grpo --model DIR --data FILE.jsonl  a Hugging Face checkpoint and your data
//   ./train_grpo --help                         every option
//
// One step: sample per_device_train_batch_size / num_generations prompts; the
// rollout engine (rollout.c) samples num_generations completions of each with
// LoRA on; rewards (tasks.c) -> group advantages (grpo.c); then num_iterations
// updates: per micro-batch a forward to per-token logprobs, grpo_loss gives
// dL/dlogp, model_backward accumulates the LoRA gradients; clip, AdamW.
// The reference for the KL (beta != 0) is the same model with LoRA switched off.
// Writes output_dir/metrics.jsonl (TRL's metric names), checkpoints
// (checkpoint-N/: PEFT adapter + optimizer state, written atomically), and at the
// end plot.svg. --resume continues from the last checkpoint bit-exactly.
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "grpo.h"
#include "lora.h"
#include "model.h"
#include "plot.h"
#include "rollout.h"
#include "safetensors.h"
#include "tasks.h"
#include "tokenizer.h"

// ----------------------------------------------------------------------------
// options

typedef struct {
    const char *model, *data, *task, *output_dir, *device, *system_prompt, *lr_scheduler_type, *lora_target_modules;
    const char *load_in_fp8, *kv_cache_dtype;
    int resume, overwrite_output_dir, fp8_pow2, bf16_first_layers, bf16_last_layers, quiet, gradient_checkpointing;
    int max_steps, per_device_train_batch_size, micro_batch_size, lora_r, top_k, logging_steps, save_steps;
    int eval_steps, eval_size, warmup_sft_steps, max_prompt_length, chat, max_operand;
    double learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm, warmup_ratio;
    double lora_alpha, temperature, top_p, gpu_memory_utilization, warmup_carry_errors;
    long seed;
} Opts;

typedef enum { O_INT, O_LONG, O_DBL, O_STR, O_FLAG } OptKind;
typedef struct {
    const char *name;
    OptKind kind;
    size_t off;
    double lo, hi;
    const char *help;
} OptDef;

#define OFF(f) offsetof(Opts, f)
static const OptDef OPTS[] = {
    {"model", O_STR, OFF(model), 0, 0, "Hugging Face checkpoint directory (default: the built-in tiny model)"},
    {"data", O_STR, OFF(data), 0, 0, "JSONL training data, one {\"prompt\", \"answer\"} per line (GSM8K \"#### N\" answers ok)"},
    {"task", O_STR, OFF(task), 0, 0, "built-in task when no --data: arithmetic | countdown (default arithmetic)"},
    {"max_operand", O_INT, OFF(max_operand), 1, 999, "built-in arithmetic: operands in [0, max_operand]"},
    {"output_dir", O_STR, OFF(output_dir), 0, 0, "where metrics, checkpoints and the plot go (default out)"},
    {"resume", O_FLAG, OFF(resume), 0, 0, "continue from the last checkpoint in output_dir"},
    {"overwrite_output_dir", O_FLAG, OFF(overwrite_output_dir), 0, 0, "start over even if output_dir has checkpoints"},
    {"device", O_STR, OFF(device), 0, 0, "auto | cpu | cuda (default auto: the GPU when usable)"},
    {"load_in_fp8", O_STR, OFF(load_in_fp8), 0, 0, "frozen weights: block | row | tensor | off (default block)"},
    {"kv_cache_dtype", O_STR, OFF(kv_cache_dtype), 0, 0, "rollout KV cache: auto (the activations' type) | fp8 (E4M3, a scale per token and head)"},
    {"fp8_pow2_scales", O_FLAG, OFF(fp8_pow2), 0, 0, "round FP8 scales up to powers of two"},
    {"bf16_first_layers", O_INT, OFF(bf16_first_layers), 0, 1e6, "keep the first N layers unquantized"},
    {"bf16_last_layers", O_INT, OFF(bf16_last_layers), 0, 1e6, "keep the last N layers unquantized"},
    {"max_steps", O_INT, OFF(max_steps), 1, 1e9, "GRPO steps (rollout + num_iterations updates each)"},
    {"per_device_train_batch_size", O_INT, OFF(per_device_train_batch_size), 1, 1e6,
     "completions per step (a multiple of num_generations)"},
    {"micro_batch_size", O_INT, OFF(micro_batch_size), 1, 1e6, "sequences per forward/backward (default: all)"},
    {"gradient_checkpointing", O_FLAG, OFF(gradient_checkpointing), 0, 0, "recompute each layer in the backward (less memory)"},
    {"learning_rate", O_DBL, OFF(learning_rate), 0, 1, "AdamW peak learning rate"},
    {"lr_scheduler_type", O_STR, OFF(lr_scheduler_type), 0, 0, "cosine | constant (default cosine)"},
    {"warmup_ratio", O_DBL, OFF(warmup_ratio), 0, 1, "share of the updates spent warming the learning rate up"},
    {"weight_decay", O_DBL, OFF(weight_decay), 0, 1, "AdamW decoupled weight decay"},
    {"adam_beta1", O_DBL, OFF(adam_beta1), 0, 0.999999, "AdamW beta1"},
    {"adam_beta2", O_DBL, OFF(adam_beta2), 0, 0.999999999, "AdamW beta2"},
    {"adam_epsilon", O_DBL, OFF(adam_epsilon), 1e-30, 1, "AdamW epsilon"},
    {"max_grad_norm", O_DBL, OFF(max_grad_norm), 0, 1e9, "global gradient-norm clipping (0 = off)"},
    {"lora_r", O_INT, OFF(lora_r), 1, 4096, "LoRA rank"},
    {"lora_alpha", O_DBL, OFF(lora_alpha), 1e-6, 1e6, "LoRA alpha (scale = alpha / r)"},
    {"lora_target_modules", O_STR, OFF(lora_target_modules), 0, 0, "comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all"},
    {"temperature", O_DBL, OFF(temperature), 0, 100, "sampling temperature of the rollouts (and of the trainer's logprobs)"},
    {"top_p", O_DBL, OFF(top_p), 1e-6, 1, "nucleus sampling (1 = off)"},
    {"top_k", O_INT, OFF(top_k), 0, 1e9, "top-k sampling (0 = off)"},
    {"max_prompt_length", O_INT, OFF(max_prompt_length), 1, 1e7, "prompts longer than this are an error"},
    {"system_prompt", O_STR, OFF(system_prompt), 0, 0, "system message for checkpoints with a chat template"},
    {"chat", O_INT, OFF(chat), -1, 1, "-1 auto (chat template when the tokenizer has one), 0 raw text, 1 chat"},
    {"seed", O_LONG, OFF(seed), 0, 9e18, "seed of everything random"},
    {"logging_steps", O_INT, OFF(logging_steps), 1, 1e9, "print and log metrics every N steps"},
    {"save_steps", O_INT, OFF(save_steps), 0, 1e9, "checkpoint every N steps (0: only at the end)"},
    {"eval_steps", O_INT, OFF(eval_steps), 0, 1e9, "held-out greedy evaluation every N steps (0: start and end only)"},
    {"eval_size", O_INT, OFF(eval_size), 0, 1e7, "held-out examples per evaluation"},
    {"warmup_sft_steps", O_INT, OFF(warmup_sft_steps), 0, 1e7, "built-in model: supervised warm-up steps before GRPO (cached)"},
    {"warmup_carry_errors", O_DBL, OFF(warmup_carry_errors), 0, 1,
     "built-in arithmetic: share of warm-up additions demonstrated with the carry forgotten"},
    {"gpu_memory_utilization", O_DBL, OFF(gpu_memory_utilization), 0.05, 0.99, "share of GPU memory for the KV-cache/activation arena"},
    {"quiet", O_FLAG, OFF(quiet), 0, 0, "only the summary"},
};
#define N_OPTS ((int)(sizeof OPTS / sizeof OPTS[0]))

// the options given on the command line (so per-model defaults never override them)
static char given[64][128];
static int n_given;
static int was_given(const char *name) {
    for (int i = 0; i < n_given; i++)
        if (!strcmp(given[i], name)) return 1;
    return 0;
}

static void opts_default(Opts *o, GrpoConfig *g) {
    memset(o, 0, sizeof *o);
    o->task = "arithmetic";
    o->output_dir = "out";
    o->device = "auto";
    o->load_in_fp8 = "block";
    o->kv_cache_dtype = "auto";
    o->lr_scheduler_type = "cosine";
    o->lora_target_modules = "all";
    o->max_steps = 150;
    o->per_device_train_batch_size = 64;
    o->learning_rate = 5e-4;
    o->adam_beta1 = 0.9;
    o->adam_beta2 = 0.999;
    o->adam_epsilon = 1e-8;
    o->max_grad_norm = 1.0;
    o->lora_r = 16;
    o->lora_alpha = 32;
    o->temperature = 1.0;
    o->top_p = 1.0;
    o->max_prompt_length = 512;
    o->chat = -1;
    o->seed = 42;
    o->logging_steps = 1;
    o->eval_steps = 25;
    o->eval_size = 200;
    o->warmup_sft_steps = 1000;
    o->gpu_memory_utilization = 0.6;
    o->max_operand = 30;
    o->warmup_carry_errors = 0.7;
    *g = grpo_config_default();
    g->num_generations = 8;
    g->max_completion_length = 8;
    g->beta = 0.0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: ./train_grpo [--option value ...]   (names as TRL's GRPOConfig; '-' or '_' both work)\n\n");
    for (int i = 0; i < N_OPTS; i++) fprintf(f, "  --%-28s %s\n", OPTS[i].name, OPTS[i].help);
    fprintf(f, "\nGRPO options (TRL GRPOConfig names): --num_generations, --beta, --epsilon, --epsilon_high, --loss_type\n"
               "  grpo|bnpo|dr_grpo|dapo, --scale_rewards group|batch|none, --importance_sampling_level token|sequence,\n"
               "  --num_iterations, --mask_truncated_completions, --max_completion_length, --reward_weights 1.0,0.2,\n"
               "  --vllm_importance_sampling_correction, --vllm_importance_sampling_mode, --vllm_importance_sampling_cap\n");
}

static void norm_name(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++) dst[i] = src[i] == '-' ? '_' : src[i];
    dst[i] = 0;
}

static void parse_args(int argc, char **argv, Opts *o, GrpoConfig *g) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (strncmp(a, "--", 2)) die("unexpected argument '%s' (options start with --; see --help)", a);
        char key[128], val_buf[256];
        const char *val = NULL, *eq = strchr(a, '=');
        if (eq) {
            snprintf(val_buf, sizeof val_buf, "%s", eq + 1);
            val = val_buf;
            snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
        } else snprintf(key, sizeof key, "%s", a + 2);
        char name[128];
        norm_name(name, sizeof name, key);
        if (n_given < 64) snprintf(given[n_given++], sizeof given[0], "%s", name);
        const OptDef *d = NULL;
        for (int k = 0; k < N_OPTS; k++)
            if (!strcmp(OPTS[k].name, name)) d = &OPTS[k];
        if (d && d->kind == O_FLAG && !val) {
            *(int *)((char *)o + d->off) = 1;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) die("--%s needs a value (see --help)", key);
            val = argv[++i];
        }
        if (!d) {
            char err[256];
            int r = grpo_config_set(g, name, val, err, sizeof err);
            if (r == 1) die("unknown option --%s (see --help)", key);
            if (r < 0) die("--%s: %s", key, err);
            continue;
        }
        char *end;
        void *p = (char *)o + d->off;
        switch (d->kind) {
            case O_STR: *(const char **)p = eq ? str_dup(val) : val; break;  // --k=v lives in a local buffer
            case O_FLAG:
            case O_INT:
            case O_LONG: {
                errno = 0;
                long long v = strtoll(val, &end, 10);
                if (errno || *end || end == val || v < d->lo || v > d->hi)
                    die("--%s: '%s' is not an integer in [%g, %g]", key, val, d->lo, d->hi);
                if (d->kind == O_LONG) *(long *)p = (long)v;
                else *(int *)p = (int)v;
                break;
            }
            case O_DBL: {
                double v = strtod(val, &end);
                if (*end || end == val || !(v >= d->lo && v <= d->hi)) die("--%s: '%s' is not a number in [%g, %g]", key, val, d->lo, d->hi);
                *(double *)p = v;
                break;
            }
        }
    }
    // defaults above suit the built-in demo; a real checkpoint gets TRL-like ones where not given
    if (o->model) {
        if (!was_given("max_completion_length")) g->max_completion_length = 256;
        if (!was_given("learning_rate")) o->learning_rate = 1e-5;
        if (!was_given("max_steps")) o->max_steps = 200;
        if (!was_given("eval_size")) o->eval_size = 100;
        if (!was_given("eval_steps")) o->eval_steps = 50;
    }
    char err[256];
    if (grpo_config_check(g, err, sizeof err) < 0) die("%s", err);
    if (o->per_device_train_batch_size % g->num_generations)
        die("per_device_train_batch_size %d is not a multiple of num_generations %d", o->per_device_train_batch_size,
            g->num_generations);
    if (fp8_gran_parse(o->load_in_fp8) < 0) die("--load_in_fp8: unknown mode '%s': use block, row, tensor or off", o->load_in_fp8);
    if (strcmp(o->kv_cache_dtype, "auto") && strcmp(o->kv_cache_dtype, "fp8"))
        die("--kv_cache_dtype: unknown type '%s': use auto or fp8", o->kv_cache_dtype);
    if (strcmp(o->lr_scheduler_type, "cosine") && strcmp(o->lr_scheduler_type, "constant"))
        die("--lr_scheduler_type: '%s' is not supported: use cosine or constant", o->lr_scheduler_type);
    if (o->data && o->model == NULL) die("--data needs --model (the built-in tiny model only knows the built-in tasks)");
    if (o->resume && o->overwrite_output_dir) die("--resume and --overwrite_output_dir contradict each other");
}

// ----------------------------------------------------------------------------
// the built-in tiny model (Qwen3-style, byte-level vocabulary); on a GPU a larger one
// (hidden 256, 6 layers: ~7x the parameters; its warm-up still runs on the CPU backend)

static Config tiny_config(int V, int gpu) {
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

typedef struct {
    const Tokenizer *tok;
    int chat;
    const char *system;
    int max_prompt;
} Formatter;

static int encode_prompt(const Formatter *f, const char *text, int **ids) {
    int n = f->chat ? tokenizer_chat_prompt(f->tok, f->system, text, ids) : tokenizer_encode(f->tok, text, ids);
    if (n == 0) die("a prompt encodes to no tokens: '%s'", text);
    if (n > f->max_prompt) die("a prompt has %d tokens, more than max_prompt_length %d: '%.60s...'", n, f->max_prompt, text);
    return n;
}

// seed of sequence s at step `step`: the same on every run and after resume
static uint64_t seq_seed(long seed, long step, int s, uint64_t purpose) {
    uint64_t x = (uint64_t)seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)step * 0xbf58476d1ce4e5b9ull ^ (uint64_t)s * 0x94d049bb133111ebull ^ purpose;
    return splitmix64(&x);
}

// ----------------------------------------------------------------------------
// held-out accuracy: greedy, one completion per prompt

static double evaluate(Model *m, const Task *task, const Formatter *f, int n, int max_new, const int *eos, int neos) {
    if (n <= 0) return NAN;
    long avail = task_size(task, SPLIT_HELDOUT);
    if (avail == 0) return NAN;
    if (avail > 0 && n > avail) n = (int)avail;
    int **prompts = (int **)mallocCheck(n * sizeof(int *)), *plens = (int *)mallocCheck(n * sizeof(int));
    Example *ex = (Example *)callocCheck(n, sizeof(Example));
    uint64_t *seeds = (uint64_t *)callocCheck(n, sizeof(uint64_t));
    for (int i = 0; i < n; i++) {
        task_example(task, SPLIT_HELDOUT, i, &ex[i]);
        plens[i] = encode_prompt(f, ex[i].prompt, &prompts[i]);
    }
    RolloutConfig rc = {1, max_new, 0.0f, 1.0f, 0, eos, neos, 16, 1};
    Rollout r;
    rollout_run(m, &rc, n, (const int *const *)prompts, plens, seeds, &r);
    double correct = 0;
    for (int i = 0; i < n; i++) {
        char *text = tokenizer_decode_ex(f->tok, r.ids + (size_t)i * max_new, r.len[i], 1, NULL);
        correct += reward_correctness(&ex[i], text, r.truncated[i]);
        free(text);
        free(prompts[i]);
        example_free(&ex[i]);
    }
    rollout_free(&r);
    free(prompts);
    free(plens);
    free(ex);
    free(seeds);
    return correct / n;
}

// ----------------------------------------------------------------------------
// supervised warm-up of the built-in model: full fine-tuning (fp32, every weight)
// on task demonstrations "prompt answer<eos>", loss = mean -log p of the answer tokens.
// It gives GRPO a model that is sometimes right, so rewards have variance to learn from.

static double evaluate(Model *m, const Task *task, const Formatter *f, int n, int max_new, const int *eos, int neos);

// The answer a warm-up demonstration shows. With probability p_forget an addition whose
// ones digits carry is shown with the carry forgotten ("17+25=32"): imperfect data, as real
// SFT data is. The warmed-up model then makes this one systematic error often; the
// correctness reward lets GRPO find and fix it, and the fix carries over to held-out problems.
static void demo_answer(const Example *ex, double p_forget, Rng *r, char *out, size_t cap) {
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
    const Backend *be = m->be;
    if (be->act != be->hp) die("the warm-up trains every weight in fp32 and needs the CPU backend");
    model_alloc_grads(m);
    size_t n = m->w.dense_bytes / dtype_size(be->hp);
    void *mom = be->alloc(m->w.dense_bytes), *vel = be->alloc(m->w.dense_bytes);
    be->zero(mom, m->w.dense_bytes);
    be->zero(vel, m->w.dense_bytes);
    int T = 0;
    int **ids = (int **)mallocCheck(batch * sizeof(int *)), *lens = (int *)mallocCheck(batch * sizeof(int)),
        *plen = (int *)mallocCheck(batch * sizeof(int));
    double t0 = now_sec();
    for (int step = 0; step < steps; step++) {
        T = 0;
        for (int b = 0; b < batch; b++) {
            Example ex;
            task_example(task, SPLIT_TRAIN, (uint64_t)step * batch + b + (uint64_t)seed * 1000003ull, &ex);
            int *p, *a;
            char ans[64];
            demo_answer(&ex, p_forget, &demo_rng, ans, sizeof ans);
            int np = encode_prompt(f, ex.prompt, &p), na = tokenizer_encode(f->tok, ans, &a);
            ids[b] = (int *)mallocCheck((np + na + 1) * sizeof(int));
            memcpy(ids[b], p, np * sizeof(int));
            memcpy(ids[b] + np, a, na * sizeof(int));
            ids[b][np + na] = eos;
            lens[b] = np + na + 1;
            plen[b] = np;
            if (lens[b] > T) T = lens[b];
            free(p);
            free(a);
            example_free(&ex);
        }
        int *flat = (int *)callocCheck((size_t)batch * T, sizeof(int)), *tg = (int *)mallocCheck((size_t)batch * T * sizeof(int));
        double *w = (double *)callocCheck((size_t)batch * T, sizeof(double)), *lp = (double *)mallocCheck((size_t)batch * T * sizeof(double));
        int ntok = 0;
        for (int b = 0; b < batch; b++)
            for (int t = 0; t < T; t++) {
                flat[b * T + t] = t < lens[b] ? ids[b][t] : 0;
                int predicts_answer = t >= plen[b] - 1 && t + 1 < lens[b];
                tg[b * T + t] = predicts_answer ? ids[b][t + 1] : -1;
                ntok += predicts_answer;
            }
        for (int i = 0; i < batch * T; i++) w[i] = tg[i] >= 0 ? -1.0 / ntok : 0;
        model_forward(m, flat, batch, T);
        model_logprobs(m, tg, 1.0f, lp);
        double loss = 0;
        for (int i = 0; i < batch * T; i++) loss += w[i] * lp[i];
        model_zero_grads(m);
        model_backward(m, w);
        double gn = sqrt(be->sumsq(m->grads, n)), clip = grad_clip_factor(gn, 1.0);
        if (!isfinite(clip)) die("warm-up: the gradient norm is not finite at step %d", step);
        be->scale(m->grads, n, (float)clip);
        double lr = lr_cosine_with_warmup(3e-3, step, steps / 10, steps);
        be->adamw(m->w.dense_mem, m->grads, mom, vel, n, (float)lr, 0.9f, 0.99f, 1e-8f, 0.0f, step + 1);
        if (!quiet && ((step + 1) % 50 == 0 || step == steps - 1)) {
            double acc = evaluate(m, task, f, eval_size, max_new, &eos, 1);
            printf("warm-up %4d/%d | loss %.4f | grad_norm %.3f | lr %.2e | held-out %.3f | %.1f s\n", step + 1, steps, loss, gn,
                   lr, acc, now_sec() - t0);
        }
        for (int b = 0; b < batch; b++) free(ids[b]);
        free(flat);
        free(tg);
        free(w);
        free(lp);
    }
    be->free(mom);
    be->free(vel);
    free(ids);
    free(lens);
    free(plen);
}

// ----------------------------------------------------------------------------
// output directory, checkpoints, metrics

static int dir_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}
static void mkdir_or_die(const char *p) {
    if (mkdir(p, 0755) != 0 && errno != EEXIST) die("cannot create directory %s (%s)", p, strerror(errno));
}
static void rm_rf(const char *p) {
    DIR *d = opendir(p);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char q[4096];
        path_join(q, sizeof q, p, e->d_name);
        if (dir_exists(q)) rm_rf(q);
        else remove(q);
    }
    closedir(d);
    rmdir(p);
}

// the newest checkpoint-N in dir (-1 if none)
static int last_checkpoint(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int n;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%d%c", &n, &tail) == 1 && n > best) best = n;
    }
    closedir(d);
    return best;
}

// the settings a checkpoint must agree with to be resumed
static cJSON *run_identity(const Opts *o, const GrpoConfig *g) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", o->model ? o->model : "builtin-tiny");
    cJSON_AddStringToObject(j, "data", o->data ? o->data : o->task);
    cJSON_AddStringToObject(j, "load_in_fp8", o->load_in_fp8);
    cJSON_AddStringToObject(j, "kv_cache_dtype", o->kv_cache_dtype);
    cJSON_AddNumberToObject(j, "lora_r", o->lora_r);
    cJSON_AddNumberToObject(j, "lora_alpha", o->lora_alpha);
    cJSON_AddStringToObject(j, "lora_target_modules", o->lora_target_modules);
    cJSON_AddNumberToObject(j, "per_device_train_batch_size", o->per_device_train_batch_size);
    cJSON_AddNumberToObject(j, "num_generations", g->num_generations);
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    return j;
}

static void save_checkpoint(const Opts *o, const GrpoConfig *g, const LoRA *lo, const Model *m, int step) {
    char final[4096], tmp[4096], p[4200];
    snprintf(final, sizeof final, "%s/checkpoint-%d", o->output_dir, step);
    snprintf(tmp, sizeof tmp, "%s/checkpoint-%d.tmp", o->output_dir, step);
    rm_rf(tmp);
    mkdir_or_die(tmp);
    lora_save_peft(lo, m, tmp, o->model ? o->model : "builtin-tiny");
    snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
    lora_save_state(lo, p);
    cJSON *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "global_step", step);
    cJSON_AddItemToObject(st, "run", run_identity(o, g));
    char *text = cJSON_Print(st);
    cJSON_Delete(st);
    snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
    write_file_atomic(p, text, strlen(text));
    free(text);
    // the directory appears under its final name only once complete
    if (dir_exists(final)) rm_rf(final);
    if (rename(tmp, final) != 0) die("cannot rename %s to %s (%s)", tmp, final, strerror(errno));
}

// restore a checkpoint; returns its step
static int load_checkpoint(const Opts *o, const GrpoConfig *g, LoRA *lo, int n) {
    char dir[4096], p[4200];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", o->output_dir, n);
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    char *text = read_file(p, NULL);
    cJSON *st = cJSON_Parse(text);
    free(text);
    if (!st) die("%s: not valid JSON", p);
    cJSON *run = cJSON_GetObjectItemCaseSensitive(st, "run"), *mine = run_identity(o, g);
    if (!cJSON_Compare(run, mine, 1)) {
        char *a = cJSON_PrintUnformatted(run), *b = cJSON_PrintUnformatted(mine);
        die("%s was made with other settings (%s) than this run (%s): resume with the same options or use a new --output_dir", dir, a, b);
    }
    cJSON_Delete(mine);
    cJSON *gs = cJSON_GetObjectItemCaseSensitive(st, "global_step");
    if (!cJSON_IsNumber(gs) || gs->valueint != n) die("%s: global_step does not match the directory name", p);
    cJSON_Delete(st);
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    lora_load_state(lo, p);
    return n;
}

// keep the metrics lines of steps <= upto (after a resume, later lines belong to the lost run)
static void metrics_truncate(const char *path, int upto) {
    if (!file_exists(path)) return;
    char *text = read_file(path, NULL), *keep = (char *)callocCheck(strlen(text) + 1, 1), *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
        if (cJSON_IsNumber(s) && s->valueint <= upto) {
            strcat(keep, line);
            strcat(keep, "\n");
        }
        cJSON_Delete(j);
    }
    write_file_atomic(path, keep, strlen(keep));
    free(text);
    free(keep);
}

// ----------------------------------------------------------------------------
// the run

typedef struct {  // what the plot needs, per step (reward: the sampled correctness)
    double *step, *reward, *acc, *kl, *len;
    int n, cap;
} History;

static void hist_add(History *h, double step, double reward, double acc, double kl, double len) {
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        h->step = (double *)reallocCheck(h->step, h->cap * sizeof(double));
        h->reward = (double *)reallocCheck(h->reward, h->cap * sizeof(double));
        h->acc = (double *)reallocCheck(h->acc, h->cap * sizeof(double));
        h->kl = (double *)reallocCheck(h->kl, h->cap * sizeof(double));
        h->len = (double *)reallocCheck(h->len, h->cap * sizeof(double));
    }
    h->step[h->n] = step, h->reward[h->n] = reward, h->acc[h->n] = acc, h->kl[h->n] = kl, h->len[h->n] = len;
    h->n++;
}

static void hist_from_metrics(History *h, const char *path) {
    if (!file_exists(path)) return;
    char *text = read_file(path, NULL), *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *r = cJSON_GetObjectItemCaseSensitive(j, "rewards/correctness/mean");
        cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "eval/accuracy"), *k = cJSON_GetObjectItemCaseSensitive(j, "kl");
        cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "completions/mean_length");
        if (cJSON_IsNumber(s))
            hist_add(h, s->valuedouble, cJSON_IsNumber(r) ? r->valuedouble : NAN, cJSON_IsNumber(a) ? a->valuedouble : NAN,
                     cJSON_IsNumber(k) ? k->valuedouble : NAN, cJSON_IsNumber(l) ? l->valuedouble : NAN);
        cJSON_Delete(j);
    }
    free(text);
}

static void add_num(cJSON *j, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(j, k, v);
    else cJSON_AddNullToObject(j, k);
}

int main(int argc, char **argv) {
    Opts o;
    GrpoConfig g;
    opts_default(&o, &g);
    parse_args(argc, argv, &o, &g);
    setvbuf(stdout, NULL, _IOLBF, 0);

    // ---- output directory: never clobber a previous run by accident ----
    char mpath[4200];
    mkdir_or_die(o.output_dir);
    int last = last_checkpoint(o.output_dir);
    if (last >= 0 && !o.resume && !o.overwrite_output_dir)
        die("%s already holds checkpoint-%d: pass --resume to continue it, --overwrite_output_dir to start over, or another --output_dir",
            o.output_dir, last);
    if (o.resume && last < 0) die("--resume: no checkpoint-N in %s", o.output_dir);

    const Backend *be = backend_select(o.device, 1);
    ModelOptions mo = {(FP8Gran)fp8_gran_parse(o.load_in_fp8), o.fp8_pow2, o.bf16_first_layers, o.bf16_last_layers};

    // ---- task, tokenizer, model ----
    Task task;
    TaskOptions to = task_options_default();
    to.seed = (uint64_t)o.seed;
    to.max_operand = o.max_operand;
    task_open_or_die(&task, o.data ? o.data : o.task, &to);
    Tokenizer *tok;
    Model m;
    Formatter fmt = {0};
    fmt.system = o.system_prompt;
    fmt.max_prompt = o.max_prompt_length;
    int eos_buf[8], neos = 0;
    double acc_warm = NAN;
    if (o.model) {
        tok = tokenizer_load_dir(o.model);
        fmt.tok = tok;
        fmt.chat = o.chat >= 0 ? o.chat : strcmp(tokenizer_chat_format(tok), "none") != 0;
        model_load(&m, o.model, be, &mo);
        int n;
        const int *e = tokenizer_eos_ids(tok, &n);
        for (int i = 0; i < n && neos < 8; i++) eos_buf[neos++] = e[i];
        for (int i = 0; i < m.cfg.n_eos && neos < 8; i++) eos_buf[neos++] = m.cfg.eos_ids[i];
    } else {
        tok = tokenizer_byte_level();
        fmt.tok = tok;
        fmt.chat = 0;
        Config tc = tiny_config(tokenizer_vocab_size(tok), !strcmp(be->name, "cuda"));
        eos_buf[neos++] = tc.eos_ids[0];
        // the warm-up runs once and is cached in output_dir/warmup (a Hugging Face checkpoint)
        char wdir[4096], wjson[4200];
        snprintf(wdir, sizeof wdir, "%s/warmup", o.output_dir);
        snprintf(wjson, sizeof wjson, "%s/warmup.json", wdir);
        char want[512];
        snprintf(want, sizeof want,
                 "{\"task\":\"%s\",\"max_operand\":%d,\"steps\":%d,\"carry_errors\":%g,\"seed\":%ld,\"C\":%d,\"L\":%d,\"FF\":%d}",
                 o.task, o.max_operand, o.warmup_sft_steps, o.warmup_carry_errors, o.seed, tc.C, tc.L, tc.FF);
        int cached = 0;
        if (file_exists(wjson)) {
            char *have = read_file(wjson, NULL);
            cached = !strcmp(have, want);
            free(have);
        }
        if (!cached) {
            printf("built-in model: %d layers, hidden %d, vocab %d (byte-level); supervised warm-up on '%s' for %d steps (cached in %s)\n",
                   tc.L, tc.C, tc.V, o.task, o.warmup_sft_steps, wdir);
            const Backend *cpu = backend_cpu();
            Model w;
            ModelOptions dense = {FP8_OFF, 0, 0, 0};
            model_init_random(&w, &tc, cpu, &dense, (uint64_t)o.seed);
            sft_warmup(&w, &task, &fmt, o.warmup_sft_steps, 64, o.seed, tc.eos_ids[0], o.quiet, o.eval_size, g.max_completion_length,
                       o.warmup_carry_errors);
            mkdir_or_die(wdir);
            model_save_hf(&w, wdir, DT_F32);
            write_file_atomic(wjson, want, strlen(want));
            model_free(&w);
        } else printf("built-in model: warm-up loaded from %s\n", wdir);
        model_load(&m, wdir, be, &mo);
    }
    config_print(&m.cfg, stdout);
    printf("frozen linear weights: %s, %.2f MiB (of %.2f MiB of weights)\n", o.load_in_fp8, m.w.linear_bytes / 1048576.0,
           (m.w.dense_bytes + m.w.fp8_bytes) / 1048576.0);

    m.recompute = o.gradient_checkpointing;
    m.kv_fp8 = !strcmp(o.kv_cache_dtype, "fp8");
    LoRA *lo = lora_create(&m, o.lora_r, (float)o.lora_alpha, lora_parse_targets(o.lora_target_modules), (uint64_t)o.seed + 17);
    m.lora = lo;
    m.lora_on = 1;
    printf("LoRA: r %d, alpha %g, %zu parameters\n", lo->r, lo->alpha, lo->n);
    size_t lora_bytes = 4 * lo->n * dtype_size(be->hp);  // parameters, gradients, Adam m and v
    printf("memory (%s): weights %.1f MiB (linear %.1f MiB as %s), LoRA + AdamW %.1f MiB\n", be->name,
           (m.w.dense_bytes + m.w.fp8_bytes) / 1048576.0, m.w.linear_bytes / 1048576.0, o.load_in_fp8, lora_bytes / 1048576.0);
    if (be->mem_capacity() > 0) {  // a device with a memory budget (not the host)
        // the time-shared arena (KV cache during rollouts, activations during updates) gets what
        // --gpu_memory_utilization leaves after what is held now and a reserve for the backend's
        // scratch, which grows lazily (FP8 activation codes, 512 MiB logits chunks, LoRA copies)
        size_t budget = (size_t)(o.gpu_memory_utilization * (double)be->mem_capacity()), used = be->mem_in_use(NULL);
        size_t reserve = (size_t)1 << 30;
        if (budget <= used + reserve)
            die("--gpu_memory_utilization %.2f gives %.2f GiB, but the weights, LoRA and optimizer hold %.2f GiB and the "
                "backend keeps 1 GiB in reserve: raise --gpu_memory_utilization",
                o.gpu_memory_utilization, budget / 1073741824.0, used / 1073741824.0);
        model_arena_init(&m, budget - used - reserve);
        printf("arena (KV cache during rollouts, activations during updates): up to %.2f GiB, grown on demand\n",
               (budget - used - reserve) / 1073741824.0);
    }

    int start = 0;
    path_join(mpath, sizeof mpath, o.output_dir, "metrics.jsonl");
    if (o.resume) {
        start = load_checkpoint(&o, &g, lo, last);
        metrics_truncate(mpath, start);
        printf("resumed from %s/checkpoint-%d\n", o.output_dir, start);
    } else if (file_exists(mpath)) remove(mpath);
    History hist = {0};
    hist_from_metrics(&hist, mpath);

    int G = g.num_generations, S = o.per_device_train_batch_size, P = S / G, Tc = g.max_completion_length;
    int mb = o.micro_batch_size > 0 ? o.micro_batch_size : S;
    long total_updates = (long)o.max_steps * g.num_iterations;
    long warm = warmup_steps_from_ratio(o.warmup_ratio, total_updates);
    float inv_temp = o.temperature > 0 ? (float)(1.0 / o.temperature) : 1.0f;
    int R = N_REWARD_FUNCS;
    double defaults[GRPO_MAX_REWARDS], weights[GRPO_MAX_REWARDS];
    const char *names[GRPO_MAX_REWARDS];
    for (int r = 0; r < R; r++) defaults[r] = REWARD_FUNCS[r].weight, names[r] = REWARD_FUNCS[r].name;
    char err[256];
    if (grpo_resolve_reward_weights(&g, R, defaults, names, weights, err, sizeof err) < 0) die("%s", err);

    if (!o.resume) {
        m.lora_on = 0;
        acc_warm = evaluate(&m, &task, &fmt, o.eval_size, Tc, eos_buf, neos);
        m.lora_on = 1;
        long avail = task_size(&task, SPLIT_HELDOUT);
        printf("held-out accuracy before GRPO: %.3f (%ld held-out problems, greedy)\n", acc_warm,
               avail >= 0 && avail < o.eval_size ? avail : (long)o.eval_size);
        FILE *mf = fopenCheck(mpath, "a");
        fprintf(mf, "{\"step\": 0, \"eval/accuracy\": %.6f}\n", acc_warm);
        fclose(mf);
        hist_add(&hist, 0, NAN, acc_warm, NAN, NAN);
    }
    printf("GRPO: %d steps x %d prompts x %d completions, max %d new tokens, loss %s, beta %g, lr %g\n", o.max_steps, P, G, Tc,
           grpo_loss_type_name(g.loss_type), g.beta, o.learning_rate);

    // per-step buffers
    int **prompts = (int **)callocCheck(P, sizeof(int *)), *plens = (int *)mallocCheck(P * sizeof(int));
    Example *ex = (Example *)callocCheck(P, sizeof(Example));
    uint64_t *seeds = (uint64_t *)mallocCheck(S * sizeof(uint64_t));
    double *rewards = (double *)mallocCheck((size_t)S * R * sizeof(double)), *adv = (double *)mallocCheck(S * sizeof(double));
    uint8_t *mask = (uint8_t *)mallocCheck((size_t)S * Tc), *trunc = (uint8_t *)mallocCheck(S);
    double *samp = (double *)mallocCheck((size_t)S * Tc * sizeof(double)), *logp_c = (double *)mallocCheck((size_t)S * Tc * sizeof(double));
    double *old_c = (double *)mallocCheck((size_t)S * Tc * sizeof(double)), *ref_c = (double *)mallocCheck((size_t)S * Tc * sizeof(double));
    double *dlogp_c = (double *)mallocCheck((size_t)S * Tc * sizeof(double));
    double acc = NAN;
    for (int step = start + 1; step <= o.max_steps; step++) {
        double t_step = now_sec();
        // ---- rollouts ----
        for (int p = 0; p < P; p++) {
            example_free(&ex[p]);
            free(prompts[p]);
            task_example(&task, SPLIT_TRAIN, (uint64_t)(step - 1) * P + p, &ex[p]);
            plens[p] = encode_prompt(&fmt, ex[p].prompt, &prompts[p]);
        }
        for (int s = 0; s < S; s++) seeds[s] = seq_seed(o.seed, step, s, 1);
        RolloutConfig rc = {G, Tc, (float)o.temperature, (float)o.top_p, o.top_k, eos_buf, neos, 16, 1};
        Rollout ro;
        rollout_run(&m, &rc, P, (const int *const *)prompts, plens, seeds, &ro);
        double t_roll = now_sec() - t_step;
        // ---- rewards, advantages ----
        long gen_tokens = 0;
        int minlen = Tc, maxlen = 0, nclip = 0;
        for (int s = 0; s < S; s++) {
            char *text = tokenizer_decode_ex(tok, ro.ids + (size_t)s * Tc, ro.len[s], 1, NULL);
            for (int r = 0; r < R; r++) rewards[s * R + r] = REWARD_FUNCS[r].fn(&ex[s / G], text, ro.truncated[s]);
            free(text);
            gen_tokens += ro.len[s];
            minlen = ro.len[s] < minlen ? ro.len[s] : minlen;
            maxlen = ro.len[s] > maxlen ? ro.len[s] : maxlen;
            nclip += ro.truncated[s];
            trunc[s] = ro.truncated[s];
            for (int j = 0; j < Tc; j++) {
                mask[s * Tc + j] = j < ro.len[s];
                samp[s * Tc + j] = j < ro.len[s] ? ro.logp[(size_t)s * Tc + j] : 0;
            }
        }
        GrpoRewardMetrics rm;
        grpo_advantages(&g, S, R, rewards, weights, adv, &rm);
        GrpoNorm norm = grpo_prepare(&g, S, Tc, mask, trunc);

        // ---- the training batch: prompt + completion, right-padded; logp of the completion tokens ----
        double t_train0 = now_sec();
        int T = 0;
        for (int s = 0; s < S; s++) T = plens[s / G] + ro.len[s] > T ? plens[s / G] + ro.len[s] : T;
        int *ids = (int *)callocCheck((size_t)S * T, sizeof(int)), *tg = (int *)mallocCheck((size_t)S * T * sizeof(int));
        for (int s = 0; s < S; s++) {
            int pl = plens[s / G];
            for (int t = 0; t < T; t++) {
                ids[s * T + t] = t < pl ? prompts[s / G][t] : (t - pl < ro.len[s] ? ro.ids[(size_t)s * Tc + t - pl] : 0);
                int j = t + 1 - pl;  // the completion token position t predicts
                tg[s * T + t] = (j >= 0 && j < ro.len[s]) ? ro.ids[(size_t)s * Tc + j] : -1;
            }
        }
        double *lp = (double *)mallocCheck((size_t)S * T * sizeof(double)), *dl = (double *)callocCheck((size_t)S * T, sizeof(double));
#define TO_COMPLETION(full, comp)                                                          \
    for (int s = b0; s < b0 + nb; s++)                                                       \
        for (int j = 0; j < Tc; j++)                                                         \
            comp[s * Tc + j] = j < ro.len[s] ? full[(size_t)(s - b0) * T + plens[s / G] - 1 + j] : 0;
        // reference (LoRA off) and old-policy logprobs, when the loss needs them
        int need_old = g.num_iterations > 1;
        for (int pass = 0; pass < 2; pass++) {
            if ((pass == 0 && g.beta == 0) || (pass == 1 && !need_old)) continue;
            m.lora_on = pass == 1;
            for (int b0 = 0; b0 < S; b0 += mb) {
                int nb = S - b0 < mb ? S - b0 : mb;
                model_forward(&m, ids + (size_t)b0 * T, nb, T);
                model_logprobs(&m, tg + (size_t)b0 * T, inv_temp, lp);
                if (pass == 0) { TO_COMPLETION(lp, ref_c) }
                else { TO_COMPLETION(lp, old_c) }
            }
            m.lora_on = 1;
        }
        double t_ref = now_sec() - t_train0;
        GrpoStats st;
        grpo_stats_init(&st);
        double loss = 0, gnorm = 0, lr = 0;
        for (int it = 0; it < g.num_iterations; it++) {
            grpo_stats_init(&st);
            lora_zero_grads(lo);
            loss = 0;
            for (int b0 = 0; b0 < S; b0 += mb) {
                int nb = S - b0 < mb ? S - b0 : mb;
                model_forward(&m, ids + (size_t)b0 * T, nb, T);
                model_logprobs(&m, tg + (size_t)b0 * T, inv_temp, lp);
                TO_COMPLETION(lp, logp_c)
                GrpoInputs in = {logp_c + (size_t)b0 * Tc, need_old ? old_c + (size_t)b0 * Tc : NULL,
                                 g.beta != 0 ? ref_c + (size_t)b0 * Tc : NULL, samp + (size_t)b0 * Tc, adv + b0,
                                 mask + (size_t)b0 * Tc, trunc + b0};
                loss += grpo_loss(&g, &norm, &in, nb, dlogp_c + (size_t)b0 * Tc, &st);
                memset(dl, 0, (size_t)nb * T * sizeof(double));
                for (int s = b0; s < b0 + nb; s++)
                    for (int j = 0; j < ro.len[s]; j++) dl[(size_t)(s - b0) * T + plens[s / G] - 1 + j] = dlogp_c[s * Tc + j];
                model_backward(&m, dl);
            }
            gnorm = lora_grad_norm(lo);
            double clip = grad_clip_factor(gnorm, o.max_grad_norm);
            if (!isfinite(clip)) die("step %d: the gradient norm is %g (NaN/inf): lower --learning_rate or check the data", step, gnorm);
            if (clip != 1.0) lora_scale_grads(lo, (float)clip);
            long upd = (long)(step - 1) * g.num_iterations + it;
            lr = strcmp(o.lr_scheduler_type, "cosine") ? (upd < warm ? o.learning_rate * upd / (double)(warm > 0 ? warm : 1) : o.learning_rate)
                                                       : lr_cosine_with_warmup(o.learning_rate, upd, warm, total_updates);
            lora_adamw_step(lo, (float)lr, (float)o.adam_beta1, (float)o.adam_beta2, (float)o.adam_epsilon, (float)o.weight_decay);
        }
#undef TO_COMPLETION
        GrpoMetrics gm = grpo_metrics(&st);
        double t_train = now_sec() - t_train0, t_total = now_sec() - t_step;

        // ---- evaluation, logging, checkpoint ----
        acc = NAN;
        if ((o.eval_steps > 0 && step % o.eval_steps == 0) || step == o.max_steps)
            acc = evaluate(&m, &task, &fmt, o.eval_size, Tc, eos_buf, neos);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "step", step);
        add_num(j, "loss", loss);
        add_num(j, "grad_norm", gnorm);
        add_num(j, "learning_rate", lr);
        add_num(j, "reward", rm.reward);
        add_num(j, "reward_std", rm.reward_std);
        for (int r = 0; r < R; r++) {
            char k[96];
            snprintf(k, sizeof k, "rewards/%s/mean", names[r]);
            add_num(j, k, rm.func_mean[r]);
            snprintf(k, sizeof k, "rewards/%s/std", names[r]);
            add_num(j, k, rm.func_std[r]);
        }
        add_num(j, "frac_reward_zero_std", rm.frac_reward_zero_std);
        add_num(j, "kl", gm.kl);
        add_num(j, "clip_ratio/low_mean", gm.clip_low_mean);
        add_num(j, "clip_ratio/high_mean", gm.clip_high_mean);
        add_num(j, "clip_ratio/region_mean", gm.clip_region_mean);
        add_num(j, "completions/mean_length", (double)gen_tokens / S);
        add_num(j, "completions/min_length", minlen);
        add_num(j, "completions/max_length", maxlen);
        add_num(j, "completions/clipped_ratio", (double)nclip / S);
        add_num(j, "sampling/sampling_logp_difference/mean", gm.sampling_logp_diff_mean);
        add_num(j, "sampling/sampling_logp_difference/max", gm.sampling_logp_diff_max);
        add_num(j, "sampling/importance_sampling_ratio/min", gm.is_ratio_min);
        add_num(j, "sampling/importance_sampling_ratio/mean", gm.is_ratio_mean);
        add_num(j, "sampling/importance_sampling_ratio/max", gm.is_ratio_max);
        add_num(j, "eval/accuracy", acc);
        add_num(j, "step_time", t_total);
        add_num(j, "time/rollout", t_roll);
        add_num(j, "time/reference", t_ref);
        add_num(j, "time/update", t_train - t_ref);
        add_num(j, "tokens_per_sec/rollout", gen_tokens / fmax(t_roll, 1e-9));
        double ref_passes = (g.beta != 0) + (g.num_iterations > 1), upd_tok_s = (double)g.num_iterations * S * T / fmax(t_train - t_ref, 1e-9);
        add_num(j, "tokens_per_sec/reference", ref_passes > 0 ? ref_passes * S * T / fmax(t_ref, 1e-9) : 0.0);
        add_num(j, "tokens_per_sec/update", upd_tok_s);
        size_t peak_held = 0;
        be->mem_in_use(&peak_held);
        add_num(j, "memory/weights_mib", (m.w.dense_bytes + m.w.fp8_bytes) / 1048576.0);
        add_num(j, "memory/lora_adamw_mib", lora_bytes / 1048576.0);
        add_num(j, "memory/kv_cache_mib", ro.kv_bytes / 1048576.0);
        add_num(j, "memory/activations_mib", m.acts.bytes / 1048576.0);
        if (m.arena.cap) add_num(j, "memory/arena_mib", m.arena.bytes / 1048576.0);
        add_num(j, "memory/peak_mib", peak_held / 1048576.0);
        char *line = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        FILE *mf = fopenCheck(mpath, "a");
        fprintf(mf, "%s\n", line);
        fclose(mf);
        free(line);
        hist_add(&hist, step, rm.func_mean[0], acc, gm.kl, (double)gen_tokens / S);
        if (!o.quiet && (step % o.logging_steps == 0 || step == o.max_steps)) {
            printf("step %4d/%d | reward %.3f (std %.3f) | correct %.3f", step, o.max_steps, rm.reward, rm.reward_std, rm.func_mean[0]);
            if (isfinite(acc)) printf(" | held-out %.3f", acc);
            printf(" | len %.1f | kl %.4f | loss %+.4f | |g| %.3f | %.2f s: rollout %.2f (%.0f tok/s), ref %.2f, update %.2f "
                   "(%.0f tok/s)\n",
                   (double)gen_tokens / S, isfinite(gm.kl) ? gm.kl : 0.0, loss, gnorm, t_total, t_roll,
                   gen_tokens / fmax(t_roll, 1e-9), t_ref, t_train - t_ref, upd_tok_s);
        }
        if (step == start + 1) {  // the report by part, once every buffer has been made
            size_t peak = 0;
            be->mem_in_use(&peak);
            printf("memory after the first step: weights %.1f MiB, LoRA + AdamW %.1f MiB, activations %.1f MiB "
                   "(%s), KV cache %.1f MiB (during the rollout), decode scratch %.1f MiB; peak held %.1f MiB\n",
                   (m.w.dense_bytes + m.w.fp8_bytes) / 1048576.0, lora_bytes / 1048576.0,
                   (m.acts.bytes + lora_acts_bytes(lo)) / 1048576.0, m.recompute ? "recomputed per layer" : "all layers kept",
                   ro.kv_bytes / 1048576.0, m.dec.bytes / 1048576.0, peak / 1048576.0);
            if (m.arena.cap)
                printf("arena: %.1f MiB, time-shared: KV cache %.1f MiB at most, activations %.1f MiB at most "
                       "(separate allocations would hold %.1f MiB)\n",
                       m.arena.bytes / 1048576.0, m.arena.peak_kv / 1048576.0, m.arena.peak_acts / 1048576.0,
                       (m.arena.peak_kv + m.arena.peak_acts) / 1048576.0);
        }
        if ((o.save_steps > 0 && step % o.save_steps == 0) || step == o.max_steps) save_checkpoint(&o, &g, lo, &m, step);
        rollout_free(&ro);
        free(ids);
        free(tg);
        free(lp);
        free(dl);
    }

    // ---- the end: before/after, plot ----
    char plot[4200];
    path_join(plot, sizeof plot, o.output_dir, "plot.svg");
    PlotSeries rs = {"correct (sampled)", hist.step, hist.reward, hist.n, "#1f77b4", 0, 0};
    PlotSeries as = {"held-out (greedy)", hist.step, hist.acc, hist.n, "#d62728", 0, 1};
    PlotSeries ks = {"kl", hist.step, hist.kl, hist.n, "#2ca02c", 0, 0};
    PlotSeries ls = {"mean length", hist.step, hist.len, hist.n, "#9467bd", 0, 0};
    PlotSeries top[2] = {rs, as};
    PlotPanel panels[3] = {{"GRPO: accuracy on training rollouts and on held-out problems", "step", "", top, 2},
                           {"completion length", "step", "tokens", &ls, 1},
                           {"KL to the reference (LoRA off)", "step", "", &ks, 1}};
    plot_svg(plot, panels, g.beta != 0 ? 3 : 2);
    double first = NAN;
    for (int i = 0; i < hist.n; i++)
        if (isfinite(hist.acc[i])) { first = hist.acc[i]; break; }
    printf("held-out accuracy: %.3f before GRPO -> %.3f after %d steps\n", first, acc, o.max_steps);
    printf("adapter: %s/checkpoint-%d (PEFT format)\nmetrics: %s\nplot: %s\n", o.output_dir, o.max_steps, mpath, plot);

    for (int p = 0; p < P; p++) {
        example_free(&ex[p]);
        free(prompts[p]);
    }
    free(prompts), free(plens), free(ex), free(seeds), free(rewards), free(adv), free(mask), free(trunc);
    free(samp), free(logp_c), free(old_c), free(ref_c), free(dlogp_c);
    free(hist.step), free(hist.reward), free(hist.acc), free(hist.kl), free(hist.len);
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
    tokenizer_free(tok);
    task_free(&task);
    return 0;
}
