// test/fuzz/fuzz_tokenizer.c: a checkpoint's tokenizer files through tokenizer_load_dir
// (tokenizer.c: tokenizer.json, tokenizer_config.json, generation_config.json), then text through
// encode (with and without special tokens), the pre-tokenizer, NFC, decode (whole, skipping
// specials, streaming; of the ids it made, of arbitrary ids in and out of range, of none) and the
// chat prompt. Input: tokenizer.json, tokenizer_config.json, generation_config.json, then the text
// (test/fuzz/fuzz.h's separator between them; a file left out is absent; the text's first 512 bytes).
#include <time.h>

#include "fuzz.h"
#include "tokenizer.h"

// whole (skipping special tokens or not) and streaming
static void decode_all(const Tokenizer *t, const int *ids, int n, int skip_special) {
    size_t len;
    free(tokenizer_decode_ex(t, ids, n, skip_special, &len));
    TokenizerStream s;
    tokenizer_stream_init(&s, t, !skip_special);
    for (int i = 0; i < n; i++) tokenizer_stream_push(&s, ids[i]);
    tokenizer_stream_flush(&s);
    tokenizer_stream_free(&s);
}

static void body(const char *dir, const uint8_t *rest, size_t nrest) {
    Tokenizer *t = tokenizer_load_dir(dir);
    // the text's first 512 bytes: enough for every path (the seeds' text is 67), and the time per
    // input grows with it (at 4096, half the executions per second)
    size_t n = nrest < 512 ? nrest : 512;
    char *text = (char *)mallocCheck(n + 1);
    if (n) memcpy(text, rest, n);
    text[n] = 0;
    int *ids;
    for (int special = 0; special < 2; special++) {
        int k = tokenizer_encode_ex(t, text, n, special, &ids);
        decode_all(t, ids, k, special);
        free(ids);
    }
    char **words;
    int nw = tokenizer_pretokenize(t, text, &words);
    tokenizer_free_pieces(words, nw);
    size_t m;
    free(tokenizer_nfc(text, n, &m));
    // ids from the text's bytes, -1 and the vocabulary size included
    int V = tokenizer_vocab_size(t), k = n < 64 ? (int)n : 64, any[64];
    for (int i = 0; i < k; i++) any[i] = (int)(((uint8_t)text[i] * 131u + (unsigned)i) % (unsigned)(V + 2)) - 1;
    decode_all(t, any, k, 0);
    decode_all(t, NULL, 0, 1);
    for (int i = 0; i < k; i++) tokenizer_token_str(t, any[i]), tokenizer_is_special(t, any[i]), tokenizer_is_eos(t, any[i]);
    tokenizer_token_id(t, text);
    const char *fmt = tokenizer_chat_format(t);
    if (strcmp(fmt, "none") && strcmp(fmt, "unsupported")) {
        free(tokenizer_chat_text(t, "You are terse.", text));
        free(tokenizer_chat_text(t, NULL, text));
        k = tokenizer_chat_prompt(t, NULL, text, &ids);
        decode_all(t, ids, k, 1);
        free(ids);
    }
    free(text);
    tokenizer_free(t);
}

// NFC's tables, made once (pthread_once) and kept, and glibc's time-zone data, which the first
// localtime_r loads and keeps (a Llama 3.2 template's strftime_now: found-chat-strftime-tzset
// was reported as a leak): before the first input
static void init(void) {
    size_t m;
    free(tokenizer_nfc("e\xCC\x81", 3, &m));
    tzset();
    fuzz_maps_files = 0;  // tokenizer.c reads its files whole, never maps them
}

FUZZ_TARGET(body, init, "tokenizer.json", "tokenizer_config.json", "generation_config.json")
