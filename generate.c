// generate.c: inference from the command line, for users and for tests.
//
//   ./generate --model DIR --prompt "17+25="                       greedy continuation, as text
//   ./generate --model DIR --lora out/run-1/checkpoint-150 --prompt "17+25="   with a trained adapter
//   ./generate --model DIR --tokens "1 2 3" --max_new_tokens 16 --print_ids   ids in, ids out
//   ./generate --model DIR --prompt "Hello" --tokenize            the prompt's ids, nothing run
//   ./generate --model DIR --tokens "..." --dump_logits out.npy    teacher-forced fp32 logits (T, V)
//   ./generate --model DIR --sqnr                                 per-layer FP8 quantization error
//   ./generate --help                                             every option, its default and meaning
//
// Greedy by default (temperature 0). The frozen weights are quantized as ./train_grpo's are
// (--load_in_fp8 block by default; --fp8_embeddings, --kv_cache_dtype as there); with --lora, as the
// adapter's checkpoint records its training (trainer_state.json: --load_in_fp8, --kv_cache_dtype)
// where those options are not given, so an adapter runs on the weights and cache it was trained with.
// stdout gets the continuation's text, or its token ids with --print_ids or when the
// checkpoint has no tokenizer.json; stderr the diagnostics (backend, config). Runs on the GPU
// when one is usable, else the CPU. Options: the parser and rules of train_grpo (options.h).
#include <errno.h>
#include <math.h>

#include <cjson/cJSON.h>

#include "lora.h"
#include "model.h"
#include "tokenizer.h"
#include "io/options.h"
#include "io/safetensors.h"

// ----------------------------------------------------------------------------
// options

typedef struct {
    const char *model, *lora, *prompt, *tokens, *system_prompt, *device, *load_in_fp8, *kv_cache_dtype, *dump_logits;
    int chat, tokenize, sqnr, print_ids, allow_other_base, fp8_pow2, bf16_first_layers, bf16_last_layers, fp8_embeddings;
    int max_new_tokens, top_k;
    double temperature, top_p;
    long seed;
} GenOpts;

#define OFF(f) offsetof(GenOpts, f)
static const Option OPTIONS[] = {
    {.name = "model and prompt", .kind = OPT_SECTION},
    {"model", OPT_STRING, OFF(model), .meta = "DIR", .unset = "with --lora: the base its adapter_config.json names, else required",
     .help = "Hugging Face checkpoint directory (config.json, *.safetensors; tokenizer.json for text)"},
    {"lora", OPT_STRING, OFF(lora), .meta = "DIR", .help = "a PEFT LoRA adapter to apply (e.g. train_grpo's checkpoint-N)"},
    {"allow_other_base", OPT_FLAG, OFF(allow_other_base),
     .help = "apply --lora to a --model other than the base it was trained on (its weights' fingerprint differs)"},
    {"prompt", OPT_TEXT, OFF(prompt), .help = "the prompt as text (needs the checkpoint's tokenizer.json)"},
    {"tokens", OPT_STRING, OFF(tokens), .meta = "IDS", .help = "or the prompt as token ids, separated by spaces or commas"},
    {"chat", OPT_FLAG, OFF(chat), .help = "wrap --prompt in the checkpoint's chat format (user turn + assistant prefix)"},
    {"system_prompt", OPT_TEXT, OFF(system_prompt), .help = "with --chat: the system message"},
    {"device", OPT_CHOICE, OFF(device), .choices = "auto|cpu|cuda", .dflt = "auto", .help = "auto: the GPU when usable, else the CPU"},

    {.name = "FP8 (the frozen weights, as train_grpo's)", .kind = OPT_SECTION},
    {"load_in_fp8", OPT_CHOICE, OFF(load_in_fp8), .choices = "block|row|tensor|off", .dflt = "block",
     .help = "linear weights in E4M3 with a scale per 128x128 block, per row or per tensor; off: unquantized (with --lora, "
             "when not given: as the adapter was trained, its trainer_state.json says)"},
    {"fp8_pow2_scales", OPT_FLAG, OFF(fp8_pow2), .help = "round the FP8 scales up to powers of two"},
    {"bf16_first_layers", OPT_INT, OFF(bf16_first_layers), 0, 1e6, .dflt = "0", .help = "keep the first N layers unquantized"},
    {"bf16_last_layers", OPT_INT, OFF(bf16_last_layers), 0, 1e6, .dflt = "0", .help = "keep the last N layers unquantized"},
    {"fp8_embeddings", OPT_FLAG, OFF(fp8_embeddings),
     .help = "the embedding table and LM head in E4M3 too, a scale per row (as train_grpo --fp8_embeddings)"},
    {"kv_cache_dtype", OPT_CHOICE, OFF(kv_cache_dtype), .choices = "auto|fp8", .dflt = "auto",
     .help = "the KV cache: the activations' type, or E4M3 with a scale per token and head (as train_grpo's; with --lora, "
             "when not given: as the adapter was trained)"},

    {.name = "sampling", .kind = OPT_SECTION},
    {"max_new_tokens", OPT_INT, OFF(max_new_tokens), 0, 1 << 20, .dflt = "16", .help = "tokens to generate at most (EOS stops sooner)"},
    {"temperature", OPT_DOUBLE, OFF(temperature), 0, 100, .dflt = "0", .help = "0: greedy"},
    {"top_p", OPT_DOUBLE, OFF(top_p), 1e-6, 1, .dflt = "1", .help = "nucleus sampling (1: off)"},
    {"top_k", OPT_INT, OFF(top_k), 0, 1 << 30, .dflt = "0", .help = "top-k sampling (0: off)"},
    {"seed", OPT_LONG, OFF(seed), 0, 9e18, .dflt = "1", .help = "sampling seed"},

    {.name = "output", .kind = OPT_SECTION},
    {"print_ids", OPT_FLAG, OFF(print_ids), .help = "print the continuation's token ids on stdout (its text goes to stderr)"},
    {"tokenize", OPT_FLAG, OFF(tokenize), .help = "print the prompt's token ids and exit"},
    {"dump_logits", OPT_STRING, OFF(dump_logits), .meta = "FILE",
     .help = "write the prompt's teacher-forced fp32 logits as .npy (T, V) and exit"},
    {"sqnr", OPT_FLAG, OFF(sqnr), .help = "print the per-layer FP8 quantization error (SQNR) of each granularity and exit"},
};
#define N_OPTIONS ((int)(sizeof OPTIONS / sizeof OPTIONS[0]))

// The frozen-weight settings the adapter was trained with, as its checkpoint's trainer_state.json
// records them ("run": train_grpo's, train_sft's and train_dpo's), taken for each option not given
// here: an adapter trained on --load_in_fp8 off is not tried on FP8 blocks unless asked. said: what
// was chosen and why, for stderr. An adapter without the file (PEFT's): the defaults, said so.
static const char *const FOLLOWED[2][2] = {{"load_in_fp8", "block|row|tensor|off"}, {"kv_cache_dtype", "auto|fp8"}};
static void follow_adapter(GenOpts *o, const OptionTable *t, char *said, size_t cap) {
    const char **field[2] = {&o->load_in_fp8, &o->kv_cache_dtype};
    static char vals[2][16];
    char p[4200];
    path_join(p, sizeof p, o->lora, "trainer_state.json");
    if (!file_exists(p)) {
        snprintf(said, cap, "adapter: %s records no training settings (no trainer_state.json): --load_in_fp8 %s, "
                 "--kv_cache_dtype %s", o->lora, o->load_in_fp8, o->kv_cache_dtype);
        return;
    }
    char *text = read_file(p, NULL);
    cJSON *st = cJSON_Parse(text), *run = cJSON_GetObjectItemCaseSensitive(st, "run");
    free(text);
    if (!cJSON_IsObject(run)) die("%s: no \"run\" object (not a trainer_state.json of this program): give --load_in_fp8", p);
    size_t n = snprintf(said, cap, "adapter: ");
    for (int i = 0; i < 2; i++) {
        const char *name = FOLLOWED[i][0], *choices = FOLLOWED[i][1];
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(run, name);
        char pat[64];
        if (v) snprintf(pat, sizeof pat, "|%s|", cJSON_IsString(v) ? v->valuestring : "");
        char all[64];
        snprintf(all, sizeof all, "|%s|", choices);
        if (v && (!cJSON_IsString(v) || strlen(v->valuestring) >= sizeof vals[i] || !strstr(all, pat)))
            die("%s: \"%s\" is not one of %s: fix the file, or give --%s", p, name, choices, name);
        const char *why = "not recorded: the default";
        char differs[64];
        snprintf(differs, sizeof differs, "given; trained on %s", v && cJSON_IsString(v) ? v->valuestring : "");
        if (v && options_given(t, name)) why = strcmp(*field[i], v->valuestring) ? differs : "given, as trained";
        else if (v) {
            snprintf(vals[i], sizeof vals[i], "%s", v->valuestring);
            *field[i] = vals[i];
            why = "as trained";
        } else if (options_given(t, name)) why = "given";
        if (n < cap) n += snprintf(said + n, cap - n, "%s--%s %s (%s)", i ? ", " : "", name, *field[i], why);
    }
    if (n < cap) snprintf(said + n, cap - n, ", from %s", p);
    cJSON_Delete(st);
}

static void parse_options(int argc, char **argv, GenOpts *o, char *said, size_t cap) {
    memset(o, 0, sizeof *o);
    OptionTable t = {.usage = "usage: ./generate --model DIR (--prompt TEXT | --tokens IDS) [--name value | --name=value ...]\n"
                              "'-' and '_' are the same in names; a flag alone means true.",
                     .rows = OPTIONS, .n = N_OPTIONS, .base = o};
    options_parse(&t, argc, argv);
    said[0] = 0;
    if (o->lora) follow_adapter(o, &t, said, cap);
    if (!o->model && o->lora) o->model = lora_base_dir(o->lora);
    if (!o->model) die("--model DIR is required (see --help)");
    if (!o->sqnr && !!o->tokens + !!o->prompt != 1) die("give exactly one of --tokens or --prompt (see --help)");
    if (o->system_prompt && !o->chat) die("--system_prompt needs --chat");
}

// ----------------------------------------------------------------------------
// prompt in, tokens out

static int parse_ids(const char *s, int **out) {
    int n = 0, cap = 16;
    int *ids = (int *)mallocCheck(cap * sizeof(int));
    while (*s) {
        while (*s == ' ' || *s == ',' || *s == '\t') s++;
        if (!*s) break;
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff) die("--tokens: '%s' is not a list of token ids", s);
        if (n == cap) ids = (int *)reallocCheck(ids, (cap *= 2) * sizeof(int));
        ids[n++] = (int)v;
        s = end;
    }
    if (n == 0) die("--tokens: no token ids given");
    *out = ids;
    return n;
}

static void npy_write_f32(const char *path, const float *x, int rows, int cols) {
    char hdr[128];
    int hl = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows, cols);
    int total = 10 + hl + 1, pad = (64 - total % 64) % 64;  // header padded so the data is 64-byte aligned
    size_t n = 10 + hl + pad + 1 + (size_t)rows * cols * 4;
    unsigned char *buf = (unsigned char *)mallocCheck(n);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    uint16_t h16 = (uint16_t)(hl + pad + 1);
    memcpy(buf + 8, &h16, 2);
    memcpy(buf + 10, hdr, hl);
    memset(buf + 10 + hl, ' ', pad);
    buf[10 + hl + pad] = '\n';
    memcpy(buf + 10 + hl + pad + 1, x, (size_t)rows * cols * 4);
    write_file_atomic(path, buf, n);
    free(buf);
}

// the prompt's ids (malloc'ed): --prompt through the tokenizer (chat-wrapped with --chat), or --tokens;
// none is an error, except to --tokenize (an empty text is no tokens, as tokenizers says)
static int prompt_ids(const GenOpts *o, const Tokenizer *tok, int **ids) {
    if (!o->prompt) return parse_ids(o->tokens, ids);
    if (!tok) die("%s: no tokenizer.json, so --prompt cannot be encoded: use --tokens", o->model);
    int n = o->chat ? tokenizer_chat_prompt(tok, o->system_prompt, o->prompt, ids) : tokenizer_encode(tok, o->prompt, ids);
    if (n == 0 && !o->tokenize) die("--prompt encodes to no tokens");
    return n;
}

static void dump_logits(Model *m, const int *ids, int n, const char *path) {
    model_forward(m, m->lora, ids, 1, n);
    float *lg = (float *)mallocCheck((size_t)n * m->cfg.V * sizeof(float));
    model_logits(m, lg);
    npy_write_f32(path, lg, n, m->cfg.V);
    free(lg);
    fprintf(stderr, "wrote logits (%d, %d) to %s\n", n, m->cfg.V, path);
}

// Prefill the prompt, then sample up to max_new_tokens, one at a time, into a KV cache of one
// sequence (blocks 0..MB-1 in order). Each token goes out as it comes: as text through the
// streaming decoder (EOS itself not shown), or as its id.
static void generate(Model *m, const GenOpts *o, const Tokenizer *tok, const int *ids, int n) {
    const Backend *be = m->be;
    int max_new = o->max_new_tokens, total = n + max_new, BS = 16, MB = (total + BS - 1) / BS;
    if (total > m->cfg.max_pos) die("prompt + max_new_tokens = %d exceeds max_position_embeddings %d", total, m->cfg.max_pos);
    KVCache kv;
    kvcache_alloc(&kv, m, MB, BS);
    int *slots = (int *)mallocCheck(total * sizeof(int)), *table = (int *)mallocCheck(MB * sizeof(int));
    for (int i = 0; i < total; i++) slots[i] = i;
    for (int b = 0; b < MB; b++) table[b] = b;
    size_t hp = dtype_size(be->hp);
    void *logits = be->alloc((size_t)m->cfg.V * hp), *logp = be->alloc(hp), *tokd = be->alloc(4), *rngd = be->alloc(8);
    uint64_t rng = (uint64_t)o->seed;
    be->upload(rngd, &rng, 8);
    model_prefill(m, m->lora, &kv, ids, &n, slots, 1, n, logits);
    FILE *text_out = o->print_ids ? stderr : stdout;  // the text, where the ids are not
    TokenizerStream ts;
    if (tok) tokenizer_stream_init(&ts, tok, 0);
    for (int t = 0; t < max_new; t++) {
        be->sample((int32_t *)tokd, logp, logits, (uint64_t *)rngd, 1, m->cfg.V, (float)o->temperature, o->top_k, (float)o->top_p);
        int32_t next;
        be->download(&next, tokd, 4);
        int is_eos = tok && tokenizer_is_eos(tok, next);
        for (int e = 0; e < m->cfg.n_eos; e++) is_eos |= next == m->cfg.eos_ids[e];
        if (o->print_ids || !tok) printf("%s%d", t ? " " : "", next);
        if (tok && !is_eos) fputs(tokenizer_stream_push(&ts, next), text_out);
        fflush(stdout);
        if (is_eos || t == max_new - 1) break;
        int pos = n + t;
        model_decode(m, m->lora, &kv, &next, &pos, &slots[pos], table, 1, MB, logits);
    }
    if (tok) {
        fprintf(text_out, "%s", tokenizer_stream_flush(&ts));
        tokenizer_stream_free(&ts);
        if (text_out != stdout) fputc('\n', text_out);
    }
    printf("\n");
    be->free(logits);
    be->free(logp);
    be->free(tokd);
    be->free(rngd);
    kvcache_free(&kv, be);
    free(slots);
    free(table);
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv) {
    GenOpts o;
    char weights_from[4600];  // with --lora: the frozen-weight settings, and whether the adapter's or given
    parse_options(argc, argv, &o, weights_from, sizeof weights_from);
    if (o.sqnr) {
        model_sqnr_report(o.model, stdout);
        return 0;
    }
    char tp[4096];
    path_join(tp, sizeof tp, o.model, "tokenizer.json");
    Tokenizer *tok = file_exists(tp) ? tokenizer_load_dir(o.model) : NULL;  // without one: ids in, ids out
    int *ids, n = prompt_ids(&o, tok, &ids);
    if (o.tokenize) {  // the ids on one line (an empty one for no tokens)
        for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        tokenizer_free(tok);
        free(ids);
        return 0;
    }

    if (tok) {  // before the weights are read: a tokenizer of another checkpoint
        Config cfg;
        config_load_dir(&cfg, o.model);
        config_check_tokenizer(&cfg, tokenizer_vocab_size(tok), o.model);
    }
    if (o.lora) lora_check_base(o.lora, o.model, o.allow_other_base);  // before the weights are read, too
    const Backend *be = backend_select(o.device, 1);
    ModelOptions mo = {(FP8Gran)fp8_gran_parse(o.load_in_fp8), o.fp8_pow2, o.bf16_first_layers, o.bf16_last_layers,
                       o.fp8_embeddings};
    Model m;
    model_load(&m, o.model, be, &mo);
    m.kv_fp8 = !strcmp(o.kv_cache_dtype, "fp8");
    config_print(&m.cfg, stderr);
    if (weights_from[0]) fprintf(stderr, "%s\n", weights_from);
    fprintf(stderr, "linear weights: %s; embeddings and LM head: %s; KV cache: %s\n", o.load_in_fp8,
            o.fp8_embeddings ? "fp8 (a scale per row)" : "unquantized", m.kv_fp8 ? "fp8" : dtype_name(be->act));
    if (o.lora) m.lora = lora_load_peft(&m, o.lora);  // (applied by every forward below)
    for (int i = 0; i < n; i++)
        if (ids[i] >= m.cfg.V) die("token id %d is outside the vocabulary (%d)", ids[i], m.cfg.V);

    if (o.dump_logits) dump_logits(&m, ids, n, o.dump_logits);
    else generate(&m, &o, tok, ids, n);

    if (m.lora) lora_free(m.lora);
    model_free(&m);
    tokenizer_free(tok);
    free(ids);
    return 0;
}
