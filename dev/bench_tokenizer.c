// dev/bench_tokenizer.c: how fast tokenizer.c loads a large tokenizer.json and encodes and
// decodes text, on one core; with HF's ids for the same text, also whether they are identical.
//
//   python3 dev/make_tokenizer_fixtures.py --bench   # build/tokenizer_bench/: a 151,643-vocab
//                                                    # Qwen2-style tokenizer.json, 1 MB of text, HF's ids
//   make build/bench_tokenizer       (or make dev: every lab program)
//   taskset -c 0 build/bench_tokenizer [tokenizer.json text.txt [hf_ids.bin]]
//
// Defaults to the build/tokenizer_bench files. Prints one summary table last.
#include <sys/utsname.h>

#include "tokenizer.h"
#include "core/common.h"
#include "io/safetensors.h"  // read_file

static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = 0;
                snprintf(out, cap, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

int main(int argc, char **argv) {
    const char *tok_path = argc > 1 ? argv[1] : "build/tokenizer_bench/tokenizer.json";
    const char *text_path = argc > 2 ? argv[2] : "build/tokenizer_bench/text_1mb.txt";
    const char *ids_path = argc > 3 ? argv[3] : (argc > 1 ? NULL : "build/tokenizer_bench/text_1mb.ids");
    FILE *probe = fopen(tok_path, "rb");
    if (!probe) die("no %s: run python3 dev/make_tokenizer_fixtures.py --bench first", tok_path);
    fclose(probe);

    // load: best of 5 (the first also warms the page cache)
    double t_load = 1e9;
    Tokenizer *t = NULL;
    for (int i = 0; i < 5; i++) {
        if (t) tokenizer_free(t);
        double t0 = now_sec();
        t = tokenizer_load(tok_path);
        double dt = now_sec() - t0;
        if (dt < t_load) t_load = dt;
    }
    size_t n;
    char *text = read_file(text_path, &n);

    // encode: best of 3
    double t_enc = 1e9;
    int *ids = NULL, nids = 0;
    for (int i = 0; i < 3; i++) {
        free(ids);
        double t0 = now_sec();
        nids = tokenizer_encode_ex(t, text, n, 0, &ids);
        double dt = now_sec() - t0;
        if (dt < t_enc) t_enc = dt;
    }
    // encode in small pieces, as GRPO prompts are (one call per ~200-byte line)
    double t0 = now_sec();
    long nsmall = 0, calls = 0;
    for (size_t a = 0; a < n;) {
        size_t b = a + 200 < n ? a + 200 : n;
        while (b < n && ((unsigned char)text[b] & 0xC0) == 0x80) b++;  // cut at a character boundary
        int *x;
        nsmall += tokenizer_encode_ex(t, text + a, b - a, 0, &x);
        free(x);
        calls++;
        a = b;
    }
    double t_small = now_sec() - t0;
    t0 = now_sec();
    size_t dn;
    char *back = tokenizer_decode_ex(t, ids, nids, 0, &dn);
    double t_dec = now_sec() - t0;
    // decode(encode(text)) is the text, or its NFC for a tokenizer that normalizes
    size_t nn;
    char *nfc = tokenizer_nfc(text, n, &nn);
    const char *roundtrip = dn == n && !memcmp(back, text, n) ? "exact" : dn == nn && !memcmp(back, nfc, nn) ? "exact up to NFC" : "DIFFERS";
    free(nfc);

    const char *hf = "not compared";
    if (ids_path) {
        size_t hn;
        char *raw = read_file(ids_path, &hn);
        int nh = (int)(hn / 4);
        const int32_t *h = (const int32_t *)raw;
        int first = -1;
        for (int i = 0; i < nids && i < nh; i++) if (ids[i] != h[i]) { first = i; break; }
        if (first < 0 && nh != nids) first = nids < nh ? nids : nh;
        static char msg[128];
        if (first < 0) snprintf(msg, sizeof msg, "identical (%d ids)", nh);
        else snprintf(msg, sizeof msg, "DIFFER at id %d (ours %d, HF %d)", first, nids, nh);
        hf = msg;
        free(raw);
    }

    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    printf("\ntokenizer benchmark on %s (one thread)\n", cpu);
    printf("| what | result |\n| --- | --- |\n");
    printf("| tokenizer.json | %s: vocab %d (largest id + 1) |\n", tok_path, tokenizer_vocab_size(t));
    printf("| load (best of 5) | %.3f s |\n", t_load);
    printf("| encode %.2f MB in one call (best of 3) | %.3f s = %.2f MB/s, %d tokens |\n", n / 1e6, t_enc, n / 1e6 / t_enc, nids);
    printf("| encode in %ld calls of ~200 bytes | %.3f s = %.2f MB/s, %ld tokens |\n", calls, t_small, n / 1e6 / t_small, nsmall);
    printf("| decode all ids | %.3f s, round trip %s |\n", t_dec, roundtrip);
    printf("| ids vs HF tokenizers | %s |\n", hf);
    free(back), free(ids), free(text);
    tokenizer_free(t);
    return strcmp(roundtrip, "DIFFERS") != 0 && (!ids_path || strncmp(hf, "identical", 9) == 0) ? 0 : 1;
}
