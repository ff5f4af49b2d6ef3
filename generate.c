// generate.c: inference from the command line, for users and for tests.
//
//   ./generate --model DIR --tokens "1 2 3" [--max-new-tokens 16] [--temperature 0]
//   ./generate --model DIR --prompt "Hello" [--tokenize]
//   ./generate --model DIR --tokens "..." --dump-logits out.npy   (teacher-forced fp32 logits (T, V))
//   ./generate --model DIR --sqnr                                 (per-layer FP8 quantization error)
//
// Greedy by default (temperature 0); prints the continuation's ids (and text when
// the checkpoint has a tokenizer). Runs on the GPU when one is usable, else the CPU.
#include <errno.h>
#include <math.h>

#include "lora.h"
#include "model.h"
#include "safetensors.h"
#include "tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ./generate --model DIR (--tokens \"IDS\" | --prompt TEXT) [options]\n"
            "  --model DIR            Hugging Face checkpoint directory (config.json, *.safetensors)\n"
            "  --tokens \"IDS\"         prompt token ids, separated by spaces or commas\n"
            "  --prompt TEXT          prompt text (needs tokenizer.json in DIR)\n"
            "  --chat                 wrap --prompt in the checkpoint's chat format (user turn + assistant prefix)\n"
            "  --tokenize             print the prompt's ids and exit\n"
            "  --max-new-tokens N     tokens to generate (default 16)\n"
            "  --temperature T        0 = greedy (default 0)\n"
            "  --top-p P, --top-k K   sampling truncation (default 1.0, 0 = off)\n"
            "  --seed S               sampling seed (default 1)\n"
            "  --fp8 MODE             linear weights: block | row | tensor | off (default off)\n"
            "  --lora DIR             apply a PEFT LoRA adapter\n"
            "  --device D             auto | cpu | cuda (default auto)\n"
            "  --dump-logits FILE     write the teacher-forced fp32 logits of the prompt as .npy (T, V) and exit\n"
            "  --sqnr                 print the per-layer FP8 quantization error (SQNR) of each granularity and exit\n");
}

static long parse_long(const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) die("%s: '%s' is not an integer in [%ld, %ld]", flag, v, lo, hi);
    return x;
}
static double parse_double(const char *flag, const char *v, double lo, double hi) {
    char *end;
    double x = strtod(v, &end);
    if (*end || end == v || !(x >= lo && x <= hi)) die("%s: '%s' is not a number in [%g, %g]", flag, v, lo, hi);
    return x;
}

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

int main(int argc, char **argv) {
    const char *model_dir = NULL, *tokens = NULL, *prompt = NULL, *dump = NULL, *device = "auto", *lora_dir = NULL;
    int max_new = 16, top_k = 0, tokenize_only = 0, sqnr = 0, chat = 0;
    double temperature = 0, top_p = 1;
    long seed = 1;
    ModelOptions opt = {FP8_OFF, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--tokenize")) { tokenize_only = 1; continue; }
        if (!strcmp(a, "--sqnr")) { sqnr = 1; continue; }
        if (!strcmp(a, "--chat")) { chat = 1; continue; }
        static const char *valued[] = {"--model", "--tokens", "--prompt", "--dump-logits", "--device", "--lora",
                                       "--max-new-tokens", "--temperature", "--top-p", "--top-k", "--seed", "--fp8"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
        if (!known) die("unknown option %s (see --help)", a);
        if (i + 1 >= argc) die("%s needs a value (see --help)", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--dump-logits")) dump = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--lora")) lora_dir = v;
        else if (!strcmp(a, "--max-new-tokens")) max_new = (int)parse_long(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--temperature")) temperature = parse_double(a, v, 0, 100);
        else if (!strcmp(a, "--top-p")) top_p = parse_double(a, v, 1e-6, 1);
        else if (!strcmp(a, "--top-k")) top_k = (int)parse_long(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--seed")) seed = parse_long(a, v, 0, 0x7fffffffffffffffL);
        else if (!strcmp(a, "--fp8")) {
            int g = fp8_gran_parse(v);
            if (g < 0) die("--fp8: unknown mode '%s': use block, row, tensor or off", v);
            opt.gran = (FP8Gran)g;
        }
    }
    if (!model_dir) die("--model DIR is required (see --help)");
    if (sqnr) {
        model_sqnr_report(model_dir, stdout);
        return 0;
    }
    if (!!tokens + !!prompt != 1) die("give exactly one of --tokens or --prompt (see --help)");

    int *ids = NULL, n;
    Tokenizer *tok = NULL;
    char tp[4096];
    path_join(tp, sizeof tp, model_dir, "tokenizer.json");
    if (file_exists(tp)) tok = tokenizer_load_dir(model_dir);
    if (prompt) {
        if (!tok) die("%s: no tokenizer.json, so --prompt cannot be encoded: use --tokens", model_dir);
        n = chat ? tokenizer_chat_prompt(tok, NULL, prompt, &ids) : tokenizer_encode(tok, prompt, &ids);
        if (n == 0) die("--prompt encodes to no tokens");
    } else n = parse_ids(tokens, &ids);
    if (tokenize_only) {
        for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        return 0;
    }

    const Backend *be = backend_select(device, 1);
    Model m;
    model_load(&m, model_dir, be, &opt);
    config_print(&m.cfg, stderr);
    if (lora_dir) {
        m.lora = lora_load_peft(&m, lora_dir);
        m.lora_on = 1;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] >= m.cfg.V) die("token id %d is outside the vocabulary (%d)", ids[i], m.cfg.V);

    if (dump) {
        model_forward(&m, ids, 1, n);
        float *lg = (float *)mallocCheck((size_t)n * m.cfg.V * sizeof(float));
        model_logits(&m, lg);
        npy_write_f32(dump, lg, n, m.cfg.V);
        fprintf(stderr, "wrote logits (%d, %d) to %s\n", n, m.cfg.V, dump);
        return 0;
    }

    // one sequence: blocks 0..MB-1 of the cache in order
    int total = n + max_new, BS = 16, MB = (total + BS - 1) / BS;
    if (total > m.cfg.max_pos) die("prompt + max-new-tokens = %d exceeds max_position_embeddings %d", total, m.cfg.max_pos);
    KVCache kv;
    kvcache_alloc(&kv, &m, MB, BS);
    int *slots = (int *)mallocCheck(total * sizeof(int)), *table = (int *)mallocCheck(MB * sizeof(int));
    for (int i = 0; i < total; i++) slots[i] = i;
    for (int b = 0; b < MB; b++) table[b] = b;
    size_t hp = dtype_size(be->hp);
    void *logits = be->alloc((size_t)m.cfg.V * hp), *logp = be->alloc(hp), *tokd = be->alloc(4), *rngd = be->alloc(8);
    uint64_t rng = (uint64_t)seed;
    be->upload(rngd, &rng, 8);
    model_prefill(&m, &kv, ids, &n, slots, 1, n, logits);
    TokenizerStream ts;
    if (tok) tokenizer_stream_init(&ts, tok, 0);
    for (int t = 0; t < max_new; t++) {
        be->sample((int32_t *)tokd, logp, logits, (uint64_t *)rngd, 1, m.cfg.V, (float)temperature, top_k, (float)top_p);
        int32_t next;
        be->download(&next, tokd, 4);
        printf("%s%d", t ? " " : "", next);
        fflush(stdout);
        int is_eos = 0;
        for (int e = 0; e < m.cfg.n_eos; e++) is_eos |= next == m.cfg.eos_ids[e];
        if (tok) {
            is_eos |= tokenizer_is_eos(tok, next);
            fprintf(stderr, "%s", tokenizer_stream_push(&ts, next));
        }
        if (is_eos || t == max_new - 1) break;
        int pos = n + t;
        model_decode(&m, &kv, &next, &pos, &slots[pos], table, 1, MB, logits);
    }
    printf("\n");
    if (tok) {
        fprintf(stderr, "%s\n", tokenizer_stream_flush(&ts));
        tokenizer_stream_free(&ts);
        tokenizer_free(tok);
    }
    be->free(logits);
    be->free(logp);
    be->free(tokd);
    be->free(rngd);
    kvcache_free(&kv, be);
    if (m.lora) lora_free(m.lora);
    model_free(&m);
    free(ids);
    free(slots);
    free(table);
    return 0;
}
