// text/tokenizer_load.c: reading a tokenizer into a Tokenizer (tokenizer_internal.h): tokenizer.json
// (the vocabulary and merges; each normalizer, pre-tokenizer, post-processor and decoder step
// checked against what tokenizer.c runs, anything else refused in one line; the added tokens;
// the decode tables), the checkpoint directory's tokenizer_config.json, chat_template.jinja and
// generation_config.json (the chat format, the special ids), and the built-in byte vocabulary.
// Defines tokenizer_load, tokenizer_load_dir, tokenizer_set_chat_template, tokenizer_chat_format, tokenizer_chat_thinks,
// tokenizer_byte_level (tokenizer.h). What a Tokenizer does with all this: tokenizer.c.
#include <cjson/cJSON.h>
#include <sys/stat.h>

#include "text/tokenizer_internal.h"
#include "text/tokenizer_unicode.h"
#include "text/unicode.h"

// ---- loading: JSON helpers ----

static char *read_file(const char *path, size_t *n, int must) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (!must) return NULL;
        die("cannot open %s: give the tokenizer.json of a Hugging Face checkpoint (or its directory)", path);
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) die("%s is not a regular file", path);
    char *buf = (char *)mallocCheck((size_t)st.st_size + 1);
    size_t got = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (got != (size_t)st.st_size) die("cannot read %s (got %zu of %lld bytes)", path, got, (long long)st.st_size);
    buf[got] = 0;
    *n = got;
    return buf;
}
static cJSON *parse_json(const char *path, const char *text, size_t n) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!j) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        int line = 1;
        for (size_t i = 0; i < off && i < n; i++) line += text[i] == '\n';
        die("%s is not valid JSON (error near byte %zu, line %d): is the file complete?", path, off, line);
    }
    return j;
}
static const char *jstr(const cJSON *o, const char *key) {  // string member or NULL
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static int jbool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}
static int jid(const char *path, const cJSON *v, const char *what) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (1 << 24) || v->valuedouble != (int)v->valuedouble)
        die("%s: %s has id %s, not an integer in [0, 2^24)", path, what, cJSON_IsNumber(v) ? "out of range" : "missing");
    return (int)v->valuedouble;
}
// the length of s if it is exactly one UTF-8 character, else -1
static int one_char(const char *s) {
    uint32_t cp;
    size_t n = strlen(s);
    int k = n ? utf8_char((const uint8_t *)s, n, &cp) : 0;
    return k > 0 && (size_t)k == n ? k : -1;
}
static const char *jtype(const cJSON *o) {
    const char *s = jstr(o, "type");
    return s ? s : "(no type)";
}

// ---- loading: components ----

static pcre2_code *compile_re(const char *path, const char *pattern, int literal) {
    int err;
    PCRE2_SIZE off;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // UCP is refused with LITERAL (and moot)
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opt, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        die("%s: PCRE2 rejects the pre-tokenizer regex at offset %zu (%s): %.80s", path, (size_t)off, (char *)msg, pattern);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // no JIT on this platform: the interpreter, slower
    return re;
}

// GPT-2's pattern, what ByteLevel(use_regex=true) splits with
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void load_pretokenizer(Tokenizer *t, const cJSON *p, int *saw_bytelevel) {
    if (!p || cJSON_IsNull(p)) return;
    const char *type = jtype(p);
    if (*saw_bytelevel) die("%s: pre-tokenizer %s after ByteLevel is not supported (ByteLevel must come last)", t->path, type);
    if (!strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")) load_pretokenizer(t, e, saw_bytelevel);
        return;
    }
    if (t->n_steps == MAX_STEPS) die("%s: more than %d pre-tokenizers", t->path, MAX_STEPS);
    PreStep *st = &t->steps[t->n_steps];
    memset(st, 0, sizeof *st);
    if (!strcmp(type, "ByteLevel")) {
        *saw_bytelevel = 1;
        st->prefix_space = jbool(p, "add_prefix_space", 1);
        if (jbool(p, "use_regex", 1)) st->re = compile_re(t->path, GPT2_RE, 0);
        st->behavior = SPLIT_ISOLATED;
        if (st->re || st->prefix_space) t->n_steps++;  // else the byte mapping alone: done by the BPE step
    } else if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *rx = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        if (!rx && !lit) die("%s: Split pre-tokenizer without a {\"Regex\": ...} or {\"String\": ...} pattern", t->path);
        st->re = compile_re(t->path, rx ? rx : lit, rx == NULL);
        st->literal = rx == NULL;
        const char *b = jstr(p, "behavior");
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        st->behavior = -1;
        for (int i = 0; i < 5; i++) if (b && !strcmp(b, names[i])) st->behavior = i;
        if (st->behavior < 0) die("%s: Split behavior \"%s\" is unknown", t->path, b ? b : "(none)");
        st->invert = jbool(p, "invert", 0);
        t->n_steps++;
    } else if (!strcmp(type, "Digits")) {
        // tokenizers splits at Rust's char::is_numeric: \p{N} of Unicode 17, which knows digits
        // newer than PCRE2's and Oniguruma's tables (Tolong Siki U+11DE0..9, U+16FF4..6); every
        // code point is checked against HF in test/test_tokenizer.c test_digits_classes
        st->re = compile_re(t->path, "[\\p{N}\\x{11DE0}-\\x{11DE9}\\x{16FF4}-\\x{16FF6}]", 0);
        st->behavior = jbool(p, "individual_digits", 0) ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        t->n_steps++;
    } else if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(p, "replacement");
        if (!r) r = "\xE2\x96\x81";  // U+2581, tokenizers' default
        st->rep_len = one_char(r);
        if (st->rep_len <= 0) die("%s: Metaspace replacement must be one character (U+2581 in real files)", t->path);
        memcpy(st->rep, r, (size_t)st->rep_len);
        st->metaspace = 1;
        const char *ps = jstr(p, "prepend_scheme");  // older files: add_prefix_space true/false
        st->prepend = !ps ? (jbool(p, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER)
                    : !strcmp(ps, "always") ? PREPEND_ALWAYS : !strcmp(ps, "first") ? PREPEND_FIRST
                    : !strcmp(ps, "never") ? PREPEND_NEVER : -1;
        if (st->prepend < 0) die("%s: Metaspace prepend_scheme \"%s\" is unknown (always, first, never)", t->path, ps);
        if (jbool(p, "split", 1)) {
            st->re = compile_re(t->path, st->rep, 1);
            st->literal = 1;
            st->behavior = SPLIT_MERGED_NEXT;
        }
        t->n_steps++;
    } else {
        die("%s: pre-tokenizer %s is not supported (Split, Digits, ByteLevel and Metaspace are)", t->path, type);
    }
}

static void load_normalizer(Tokenizer *t, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return;
    const char *type = jtype(n);
    if (!strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) load_normalizer(t, e);
        return;
    }
    if (t->n_norm == MAX_STEPS) die("%s: more than %d normalizers", t->path, MAX_STEPS);
    NormStep *st = &t->norm[t->n_norm];
    memset(st, 0, sizeof *st);
    if (!strcmp(type, "NFC")) {
        st->type = NORM_NFC;
    } else if (!strcmp(type, "Replace")) {  // Gemma: " " -> U+2581
        const char *a = jstr(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String"), *b = jstr(n, "content");
        if (!a) die("%s: normalizer Replace with a Regex pattern is not supported (only {\"String\": ...}, as Gemma and Llama 2 have)", t->path);
        if (!*a || !b) die("%s: normalizer Replace needs a non-empty pattern string and a content string", t->path);
        *st = (NormStep){NORM_REPLACE, str_dup(a), str_dup(b), strlen(a), strlen(b)};
    } else if (!strcmp(type, "Prepend")) {  // Llama 2: U+2581 in front
        const char *b = jstr(n, "prepend");
        if (!b) die("%s: normalizer Prepend has no \"prepend\" string", t->path);
        *st = (NormStep){NORM_PREPEND, NULL, str_dup(b), 0, strlen(b)};
    } else {
        die("%s: normalizer %s is not supported (NFC, Replace, Prepend and Sequence are)", t->path, type);
    }
    t->n_norm++;
}

static void load_postprocessor(Tokenizer *t, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return;
    const char *type = jtype(p);
    if (!strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "processors")) load_postprocessor(t, e);
    } else if (!strcmp(type, "ByteLevel")) {
        // only moves offsets; ids unchanged
    } else if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
        const cJSON *e;
        int after = 0;
        t->n_prefix = t->n_suffix = 0;
        cJSON_ArrayForEach(e, single) {
            if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) { after = 1; continue; }
            const char *name = jstr(cJSON_GetObjectItemCaseSensitive(e, "SpecialToken"), "id");
            if (!name) die("%s: TemplateProcessing item is neither Sequence nor SpecialToken", t->path);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, name), "ids"), *id;
            if (!cJSON_IsArray(ids)) die("%s: TemplateProcessing special token %s has no ids", t->path, name);
            cJSON_ArrayForEach(id, ids) {
                int *n = after ? &t->n_suffix : &t->n_prefix;
                if (*n == 4) die("%s: TemplateProcessing adds more than 4 tokens", t->path);
                (after ? t->suffix : t->prefix)[(*n)++] = jid(t->path, id, "TemplateProcessing token");
            }
        }
    } else {
        die("%s: post-processor %s is not supported (ByteLevel, TemplateProcessing)", t->path, type);
    }
}

// the decoder: ByteLevel (*bl_dec set) or SentencePiece-style steps into t->dec
static void load_decoder(Tokenizer *t, const cJSON *d, int *bl_dec) {
    if (!d || cJSON_IsNull(d)) return;  // none: check_decoder says what is missing
    const char *type = jtype(d);
    if (!strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(d, "decoders")) load_decoder(t, e, bl_dec);
        return;
    }
    if (!strcmp(type, "ByteLevel")) { *bl_dec = 1; return; }
    if (t->n_dec == MAX_DEC) die("%s: more than %d decoders", t->path, MAX_DEC);
    DecStep *st = &t->dec[t->n_dec];
    memset(st, 0, sizeof *st);
    if (!strcmp(type, "Replace")) {
        const char *a = jstr(cJSON_GetObjectItemCaseSensitive(d, "pattern"), "String"), *b = jstr(d, "content");
        if (!a || !*a || !b) die("%s: decoder Replace needs a non-empty {\"String\": ...} pattern and a content string (Regex is not supported)", t->path);
        *st = (DecStep){.type = DEC_REPLACE, .a = str_dup(a), .b = str_dup(b), .na = strlen(a), .nb = strlen(b)};
        if (one_char(a) > 0) utf8_char((const uint8_t *)a, st->na, &st->ch);
    } else if (!strcmp(type, "Strip")) {
        const char *c = jstr(d, "content");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(d, "start"), *b = cJSON_GetObjectItemCaseSensitive(d, "stop");
        if (!c || one_char(c) <= 0 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valuedouble < 0 || b->valuedouble < 0)
            die("%s: decoder Strip needs a one-character content and counts start, stop >= 0", t->path);
        st->type = DEC_STRIP;
        utf8_char((const uint8_t *)c, strlen(c), &st->ch);
        st->start = a->valuedouble > 1e6 ? 1000000 : (int)a->valuedouble;
        st->stop = b->valuedouble > 1e6 ? 1000000 : (int)b->valuedouble;
    } else if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(d, "replacement"), *ps = jstr(d, "prepend_scheme");
        if (!r) r = "\xE2\x96\x81";
        if (one_char(r) <= 0) die("%s: decoder Metaspace replacement must be one character (U+2581 in real files)", t->path);
        st->type = DEC_METASPACE;
        utf8_char((const uint8_t *)r, strlen(r), &st->ch);
        st->never = ps ? !strcmp(ps, "never") : !jbool(d, "add_prefix_space", 1);
    } else if (!strcmp(type, "ByteFallback")) {
        st->type = DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        st->type = DEC_FUSE;
    } else {
        die("%s: decoder %s is not supported (ByteLevel; or Replace, ByteFallback, Fuse, Strip and Metaspace)", t->path, type);
    }
    t->n_dec++;
}

// Which decoder chains we run. Per-string steps before Fuse are exact in any order. After Fuse
// the list is one string, and we stream it: a Replace of one character and Metaspace still act
// character by character, Strip at the start only; Strip at the end would need the text held
// back, so it is refused with the rare rest.
static void check_decoder(Tokenizer *t, int bl_dec) {
    if (t->byte_level) {
        if (!bl_dec || t->n_dec)
            die("%s: byte-level BPE (a ByteLevel pre-tokenizer) needs the decoder ByteLevel alone; this file has %s", t->path,
                t->n_dec && bl_dec ? "others with it" : t->n_dec ? "another" : "none");
        return;
    }
    if (bl_dec)
        die("%s: decoder ByteLevel but the pre-tokenizer has no ByteLevel step: byte-level BPE needs both "
            "(SentencePiece-style files decode with Replace/ByteFallback/Fuse/Strip or Metaspace)", t->path);
    if (!t->n_dec) die("%s: no decoder: SentencePiece-style BPE needs one (Replace/ByteFallback/Fuse/Strip or Metaspace)", t->path);
    t->dec_bf = t->dec_fuse = t->n_dec;
    for (int i = 0; i < t->n_dec; i++) {
        const DecStep *st = &t->dec[i];
        int fused = t->dec_fuse < i;
        if (st->type == DEC_BYTEFALLBACK) {
            if (t->dec_bf < t->n_dec || fused) die("%s: decoder ByteFallback twice, or after Fuse, is not supported", t->path);
            t->dec_bf = i;
        } else if (st->type == DEC_FUSE) {
            if (fused) die("%s: decoder Fuse twice is not supported", t->path);
            t->dec_fuse = i;
        } else if (fused && st->type == DEC_STRIP && st->stop > 0) {
            die("%s: decoder Strip with stop > 0 after Fuse is not supported (real files strip the start only)", t->path);
        } else if (fused && st->type == DEC_REPLACE && one_char(st->a) != (int)st->na) {
            die("%s: decoder Replace of more than one character after Fuse is not supported", t->path);
        }
    }
}

static int cmp_added_len(const void *a, const void *b, void *ctx) {
    const AddedTok *t = (const AddedTok *)ctx;
    const AddedTok *x = &t[*(const int *)a], *y = &t[*(const int *)b];
    if ((uint8_t)x->match[0] != (uint8_t)y->match[0]) return (uint8_t)x->match[0] - (uint8_t)y->match[0];
    return y->mlen - x->mlen;  // longest first
}
static void build_added_set(Tokenizer *t, AddedSet *s, int normalized) {
    s->idx = (int *)mallocCheck(((size_t)t->n_added + 1) * sizeof(int));
    int n = 0;
    for (int i = 0; i < t->n_added; i++) if (t->added[i].normalized == normalized && t->added[i].mlen > 0) s->idx[n++] = i;
    qsort_r(s->idx, n, sizeof(int), cmp_added_len, t->added);
    int k = 0;
    for (int b = 0; b < 257; b++) {
        s->start[b] = k;
        while (k < n && (uint8_t)t->added[s->idx[k]].match[0] == b) k++;
    }
}

static void add_eos(Tokenizer *t, int id) {
    if (id < 0) return;
    for (int i = 0; i < t->n_eos; i++) if (t->eos[i] == id) return;
    if (t->n_eos < MAX_EOS) t->eos[t->n_eos++] = id;
}
// id becomes eos[0], the token a plain completion ends with; the others keep their order
static void eos_first(Tokenizer *t, int id) {
    if (id < 0) return;
    int i = 0;
    while (i < t->n_eos && t->eos[i] != id) i++;
    if (i == t->n_eos) {  // not an eos yet: one more (when the list is full, in its last one's place)
        if (t->n_eos < MAX_EOS) t->n_eos++;
        i = t->n_eos - 1;
    }
    for (; i > 0; i--) t->eos[i] = t->eos[i - 1];
    t->eos[0] = id;
}

// the normalizer's steps over valid UTF-8 s[0..n): malloc'ed (NUL-terminated, length in
// *out_n), or NULL when the text comes out unchanged
static void build_decode_table(Tokenizer *t) {
    Buf pool = {0};
    if (!t->byte_level) {
        int pre_end = t->dec_bf < t->n_dec ? t->dec_bf : t->dec_fuse;
        t->doff = (size_t *)mallocCheck(((size_t)t->n_ids + 1) * sizeof(size_t));
        t->dbyte = (int16_t *)mallocCheck(((size_t)t->n_ids + 1) * sizeof(int16_t));
        for (int id = 0; id < t->n_ids; id++) {
            t->doff[id] = pool.n;
            t->dbyte[id] = -1;
            size_t n, m;
            const char *s = tok_token_text(t, id, &n);
            if (!s) continue;
            char *d = tok_dec_string(t, 0, pre_end, 0, s, n, &m);
            if (d) s = d, n = m;
            buf_put(&pool, s, n);
            if (t->dec_bf < t->n_dec) t->dbyte[id] = (int16_t)tok_byte_token(s, n);
            free(d);
        }
        t->doff[t->n_ids] = pool.n;
        if (!pool.p) buf_put(&pool, "", 0);
        t->dpool = pool.p;
        return;
    }
    t->doff = (size_t *)mallocCheck(((size_t)t->n_ids + 1) * sizeof(size_t));
    for (int id = 0; id < t->n_ids; id++) {
        t->doff[id] = pool.n;
        size_t n;
        const char *s = tok_token_text(t, id, &n);
        if (!s) continue;
        size_t start = pool.n;
        for (size_t i = 0; i < n;) {
            uint32_t c;
            int k = utf8_char((const uint8_t *)s + i, n - i, &c);
            if (k <= 0 || c >= 324 || tok_bl_byte[c] < 0) { pool.n = start; buf_put(&pool, s, n); break; }
            char b = (char)tok_bl_byte[c];
            buf_put(&pool, &b, 1);
            i += k;
        }
    }
    t->doff[t->n_ids] = pool.n;
    if (!pool.p) buf_put(&pool, "", 0);
    t->dpool = pool.p;
}

// everything after the arrays are filled: indexes, byte ids, added-token matchers, decode table
static void finish(Tokenizer *t) {
    tok_vocab_index(t);
    char tmp[8];
    for (int b = 0; b < 256; b++) {
        if (t->byte_level) t->byte_id[b] = tok_vocab_get(t, tmp, utf8_put(tok_bl_char[b], tmp));
        else t->byte_id[b] = tok_vocab_get(t, tmp, (size_t)snprintf(tmp, sizeof tmp, "<0x%02X>", b));  // Rust's "<{:#04X}>"
    }
    t->added_of = (int *)mallocCheck((size_t)t->n_ids * sizeof(int));
    for (int i = 0; i < t->n_ids; i++) t->added_of[i] = -1;
    for (int i = 0; i < t->n_added; i++) {
        AddedTok *a = &t->added[i];
        t->added_of[a->id] = i;
        size_t n;
        if (a->normalized && (a->match = tok_normalize(t, a->content, a->len, &n)) != NULL) {  // as tokenizers matches it
            a->mlen = (int)n;
        } else {
            a->match = str_dup(a->content);
            a->mlen = a->len;
        }
        if (a->single_word && !t->word_re) t->word_re = compile_re(t->path, "^[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]", 0);
    }
    build_added_set(t, &t->raw_set, 0);
    build_added_set(t, &t->norm_set, 1);
    build_decode_table(t);
    t->bos = t->pad = -1;
    t->chat = CHAT_NONE;
}

// chat format and default eos when there is no tokenizer_config.json: from the added tokens
static void guess_specials(Tokenizer *t) {
    t->n_eos = 0;
    static const char *ends[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>", "<eos>"};
    for (int i = 0; i < 7; i++) add_eos(t, tok_token_id_named(t, ends[i]));
    if (tok_token_id_named(t, "<|im_start|>") >= 0) t->chat = CHAT_CHATML;
    else if (tok_token_id_named(t, "<|start_header_id|>") >= 0) t->chat = CHAT_LLAMA3;
    else if (tok_token_id_named(t, "<start_of_turn>") >= 0) t->chat = CHAT_GEMMA;
    const char *bos = t->chat == CHAT_GEMMA ? "<bos>" : "<|begin_of_text|>";
    t->bos = tok_token_id_named(t, bos);
    free(t->bos_str);
    t->bos_str = t->bos >= 0 ? str_dup(bos) : NULL;
}

Tokenizer *tokenizer_load(const char *path) {
    pthread_once(&tok_bl_once, tok_bl_init);
    size_t n;
    char *text = read_file(path, &n, 1);
    // JSON is UTF-8 (tokenizers refuses the file too): an added token of stray bytes would split
    // valid text inside its characters, and the regex and NFC then see invalid UTF-8
    size_t ok = utf8_valid_len((const uint8_t *)text, n);
    if (ok < n) {
        uint8_t b = (uint8_t)text[ok];
        free(text);
        die("%s: not valid UTF-8 (byte 0x%02X at offset %zu): a tokenizer.json is UTF-8 JSON", path, b, ok);
    }
    cJSON *root = parse_json(path, text, n);
    free(text);
    Tokenizer *t = (Tokenizer *)callocCheck(1, sizeof(Tokenizer));
    t->path = str_dup(path);
    if (!cJSON_IsObject(root)) die("%s: not a tokenizer.json (the top level is not an object)", path);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) die("%s: no \"model\" object: not a Hugging Face tokenizer.json", path);
    const char *mtype = jstr(model, "type");
    if (mtype ? strcmp(mtype, "BPE") != 0 : !cJSON_GetObjectItemCaseSensitive(model, "merges"))
        die("%s: model type %s is not supported: fp8-grpo reads BPE tokenizers, byte-level (Qwen2/Qwen3, Llama 3, SmolLM) "
            "and SentencePiece-style (Gemma, Mistral, Llama 2: Metaspace, byte fallback)", path, mtype ? mtype : "(none)");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) die("%s: model.vocab is not an object of token -> id", path);
    if (!cJSON_IsArray(merges)) die("%s: model.merges is not an array", path);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0) die("%s: BPE dropout is not supported (it makes encoding random)", path);
    const char *cont = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if ((cont && *cont) || (eow && *eow))
        die("%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported (neither byte-level nor SentencePiece-style)", path);
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);

    // sizes first: the largest id, the bytes of all strings
    int max_id = -1;
    size_t pool_n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int id = jid(path, e, "a vocabulary entry");
        if (id > max_id) max_id = id;
        pool_n += strlen(e->string) + 1;
        t->n_vocab++;
    }
    cJSON_ArrayForEach(e, added) {
        int id = jid(path, cJSON_GetObjectItemCaseSensitive(e, "id"), "an added token");
        if (id > max_id) max_id = id;
        t->n_added++;
    }
    t->n_ids = max_id + 1;
    t->vstr = (char **)callocCheck((size_t)t->n_ids, sizeof(char *));
    t->vlen = (int *)callocCheck((size_t)t->n_ids, sizeof(int));
    t->vpool = (char *)mallocCheck(pool_n);
    size_t off = 0;
    cJSON_ArrayForEach(e, vocab) {
        int id = (int)e->valuedouble;
        size_t len = strlen(e->string);
        memcpy(t->vpool + off, e->string, len + 1);
        t->vstr[id] = t->vpool + off;
        t->vlen[id] = (int)len;
        off += len + 1;
    }
    t->added = (AddedTok *)callocCheck((size_t)t->n_added + 1, sizeof(AddedTok));
    int k = 0;
    cJSON_ArrayForEach(e, added) {
        AddedTok *a = &t->added[k++];
        const char *c = jstr(e, "content");
        if (!c || !*c) die("%s: added token %d has no content", path, k - 1);
        a->content = str_dup(c);
        a->len = (int)strlen(c);
        a->id = (int)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        a->single_word = (unsigned char)jbool(e, "single_word", 0);
        a->lstrip = (unsigned char)jbool(e, "lstrip", 0);
        a->rstrip = (unsigned char)jbool(e, "rstrip", 0);
        a->special = (unsigned char)jbool(e, "special", 0);
        a->normalized = (unsigned char)jbool(e, "normalized", !a->special);
    }
    load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    load_pretokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &t->byte_level);
    for (int i = 0; i < t->n_steps; i++)
        if (t->steps[i].metaspace && t->byte_level) die("%s: pre-tokenizers Metaspace and ByteLevel together are not supported", path);
    if (t->byte_level && t->byte_fallback)
        die("%s: BPE byte_fallback with a ByteLevel pre-tokenizer is not supported (byte-level BPE has every byte already)", path);
    load_postprocessor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    int bl_dec = 0;
    load_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), &bl_dec);
    check_decoder(t, bl_dec);
    finish(t);
    const char *unk = jstr(model, "unk_token");
    t->unk_id = unk ? tok_vocab_get(t, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0 && !t->byte_level) die("%s: BPE unk_token \"%.40s\" is not in the vocabulary", path, unk);

    // merges: "a b" strings (tokenizers < 0.20) or ["a", "b"] pairs; rank = position
    t->n_merges = cJSON_GetArraySize(merges);
    uint64_t cap = 1024;
    while (cap < 2ull * (uint64_t)t->n_merges + 16) cap *= 2;
    t->merges = (MergeSlot *)mallocCheck(cap * sizeof(MergeSlot));
    memset(t->merges, 0xff, cap * sizeof(MergeSlot));
    t->mmask = cap - 1;
    Buf cat = {0};
    int rank = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(e)) {
            a = e->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) die("%s: merge %d \"%.60s\" is not two tokens separated by one space", path, rank, a);
            la = (size_t)(sp - a), b = sp + 1, lb = strlen(b);
        } else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
            a = e->child->valuestring, b = e->child->next->valuestring, la = strlen(a), lb = strlen(b);
        } else {
            die("%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", path, rank);
        }
        int ia = tok_vocab_get(t, a, la), ib = tok_vocab_get(t, b, lb);
        cat.n = 0;
        buf_put(&cat, a, la);
        buf_put(&cat, b, lb);
        int ic = tok_vocab_get(t, cat.p, cat.n);
        if (ia < 0 || ib < 0 || ic < 0)
            die("%s: merge %d (%.*s %.*s): %s is not in the vocabulary", path, rank, (int)la, a, (int)lb, b,
                ia < 0 ? "the first token" : ib < 0 ? "the second token" : "their concatenation");
        tok_merge_put(t, ia, ib, rank++, ic);
    }
    free(cat.p);
    cJSON_Delete(root);
    guess_specials(t);
    return t;
}

// ----------------------------------------------------------------------------
// checkpoint directory: tokenizer_config.json, chat_template.jinja, generation_config.json

// a special token in tokenizer_config.json: "<|im_end|>" or {"content": "<|im_end|>", ...} or null
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    return jstr(v, "content");
}

// Jinja string-literal escapes (\n, \t, \', \", \\) of a piece of template text
static char *unescape(const char *s, size_t n) {
    char *o = (char *)mallocCheck(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char e = s[++i];
            o[k++] = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
            o[k++] = s[i];
        }
    }
    o[k] = 0;
    return o;
}

// The string literal of the template around position at (between its quotes, unescaped): how
// Mistral's templates spell the user turn ('[INST] ' + content + ' [/INST]' and its variants).
static char *literal_around(const char *tmpl, const char *at) {
    const char *a = at, *b = at;
    while (a > tmpl && a[-1] != '\'' && a[-1] != '"') a--;
    if (a == tmpl) return NULL;
    char q = a[-1];
    while (*b && *b != q) b++;
    if (!*b || strcspn(a, "{}+") < (size_t)(b - a)) return NULL;
    return unescape(a, (size_t)(b - a));
}

// We do not run Jinja: we recognize the template families of the models we load and render
// them in C. ChatML (Qwen2, Qwen2.5, Qwen3) differs only in the default system prompt Qwen2/2.5
// insert when there is no system message: a string literal "<|im_start|>system\n...<|im_end|>"
// in the template. Llama 3.1+ always emit a system block opening with the knowledge-cutoff
// lines (the date: the template's date_string default, or today's as transformers'
// strftime_now gives it). Gemma (<start_of_turn>user ... <end_of_turn>): Gemma 3 puts the system
// message at the head of the first user turn, Gemma 1/2 refuse one. Mistral ([INST] ... [/INST]):
// the versions differ in the spaces around the markers (we take the template's own literals) and
// in the system message (v0.2/v0.3: before the user's, v0.1: refused). Anything else is refused
// with a clear error when a chat prompt is asked for.
void tokenizer_set_chat_template(Tokenizer *t, const char *tmpl) {
    free(t->default_system), free(t->date), free(t->inst_open), free(t->inst_close);
    t->default_system = t->date = t->inst_open = t->inst_close = NULL;
    t->no_system = 0;
    if (!tmpl) { t->chat = CHAT_NONE; return; }
    t->thinks = strstr(tmpl, "<think>") != NULL;
    if (strstr(tmpl, "<|im_start|>")) {
        t->chat = CHAT_CHATML;
        for (const char *p = tmpl; (p = strstr(p, "<|im_start|>system")) != NULL; p++) {
            const char *q = p + strlen("<|im_start|>system");
            if (*q == '\n') q++;
            else if (q[0] == '\\' && q[1] == 'n') q += 2;
            else continue;
            const char *end = strstr(q, "<|im_end|>");
            if (!end || end == q || strcspn(q, "'\"{}+") < (size_t)(end - q)) continue;  // not one literal
            t->default_system = unescape(q, (size_t)(end - q));
            break;
        }
    } else if (strstr(tmpl, "<|start_header_id|>")) {
        t->chat = CHAT_LLAMA3;
        if (strstr(tmpl, "Cutting Knowledge Date")) {
            t->chat = CHAT_LLAMA31;
            char d[64] = "26 Jul 2024";
            const char *p = strstr(tmpl, "date_string = \"");
            if (p) {
                p += strlen("date_string = \"");
                size_t n = strcspn(p, "\"");
                if (n < sizeof d) memcpy(d, p, n), d[n] = 0;
            }
            if (strstr(tmpl, "strftime_now")) {  // Llama 3.2: transformers passes today's date
                time_t now = time(NULL);
                struct tm tmv;
                localtime_r(&now, &tmv);
                strftime(d, sizeof d, "%d %b %Y", &tmv);
            }
            t->date = str_dup(d);
        }
    } else if (strstr(tmpl, "<start_of_turn>")) {
        t->chat = CHAT_GEMMA;
        t->no_system = strstr(tmpl, "System role not supported") != NULL;
    } else if (strstr(tmpl, "[INST]") && strstr(tmpl, "[/INST]") && !strstr(tmpl, "[SYSTEM_PROMPT]")) {
        t->inst_open = literal_around(tmpl, strstr(tmpl, "[INST]"));
        t->inst_close = literal_around(tmpl, strstr(tmpl, "[/INST]"));
        t->chat = t->inst_open && t->inst_close ? CHAT_MISTRAL : CHAT_UNSUPPORTED;
        t->no_system = !strstr(tmpl, "system_message");
    } else {
        t->chat = CHAT_UNSUPPORTED;
    }
}

int tokenizer_chat_thinks(const Tokenizer *t) { return t->chat != CHAT_NONE && t->thinks; }

const char *tokenizer_chat_format(const Tokenizer *t) {
    static const char *names[] = {"none", "chatml", "llama3", "llama3.1", "gemma", "mistral", "unsupported"};
    return names[t->chat];
}

Tokenizer *tokenizer_load_dir(const char *dir) {
    char p[4096];
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) die("%s is not a directory: give a Hugging Face checkpoint directory", dir);
    path_join(p, sizeof p, dir, "tokenizer.json");
    if (stat(p, &st) != 0)
        die("%s has no tokenizer.json: fp8-grpo needs the fast-tokenizer file (transformers' save_pretrained writes it)", dir);
    Tokenizer *t = tokenizer_load(p);
    size_t n;
    path_join(p, sizeof p, dir, "tokenizer_config.json");
    char *text = read_file(p, &n, 0);
    char *tmpl = NULL;
    int have_config = text != NULL;
    if (text) {
        cJSON *cfg = parse_json(p, text, n);
        free(text);
        t->n_eos = 0;
        const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token"), *pad = config_token(cfg, "pad_token");
        t->bos = tok_token_id_named(t, bos);
        free(t->bos_str);
        t->bos_str = bos ? str_dup(bos) : NULL;
        t->pad = tok_token_id_named(t, pad);
        add_eos(t, tok_token_id_named(t, eos));
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
        const cJSON *list = cJSON_IsArray(ct) ? ct : NULL;
        if (cJSON_IsString(ct)) tmpl = str_dup(ct->valuestring);
        cJSON_ArrayForEach(e, list) {  // [{"name": "default", "template": ...}, ...]
            const char *name = jstr(e, "name"), *tt = jstr(e, "template");
            if (name && tt && !strcmp(name, "default")) tmpl = str_dup(tt);
        }
        cJSON_Delete(cfg);
    }
    if (!tmpl) {  // newer transformers save it beside the config
        path_join(p, sizeof p, dir, "chat_template.jinja");
        tmpl = read_file(p, &n, 0);
    }
    if (have_config || tmpl) tokenizer_set_chat_template(t, tmpl);
    free(tmpl);
    path_join(p, sizeof p, dir, "generation_config.json");
    if ((text = read_file(p, &n, 0)) != NULL) {
        cJSON *g = parse_json(p, text, n), *e;
        free(text);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(g, "eos_token_id");
        const cJSON *list = cJSON_IsArray(ids) ? ids : NULL;
        int first = cJSON_IsNumber(ids) ? jid(p, ids, "eos_token_id") : -1;  // the model's own end token
        add_eos(t, first);
        cJSON_ArrayForEach(e, list) {
            int id = jid(p, e, "eos_token_id");
            if (first < 0) first = id;
            add_eos(t, id);
        }
        // without tokenizer_config.json it goes before the ids guessed from the added tokens: a completion
        // ends with it, as transformers' generation_config says
        if (!have_config) eos_first(t, first);
        cJSON_Delete(g);
    }
    if (t->chat == CHAT_CHATML) add_eos(t, tok_token_id_named(t, "<|im_end|>"));
    if (t->chat >= CHAT_LLAMA3 && t->chat <= CHAT_LLAMA31) add_eos(t, tok_token_id_named(t, "<|eot_id|>"));
    if (t->chat == CHAT_GEMMA) add_eos(t, tok_token_id_named(t, "<end_of_turn>"));
    return t;
}

// ----------------------------------------------------------------------------
// the built-in byte vocabulary

Tokenizer *tokenizer_byte_level(void) {
    pthread_once(&tok_bl_once, tok_bl_init);
    static const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    Tokenizer *t = (Tokenizer *)callocCheck(1, sizeof(Tokenizer));
    t->path = str_dup("(built-in byte-level vocabulary)");
    t->byte_level = 1;
    t->n_ids = t->n_vocab = 256 + 3;
    t->vstr = (char **)callocCheck((size_t)t->n_ids, sizeof(char *));
    t->vlen = (int *)callocCheck((size_t)t->n_ids, sizeof(int));
    t->vpool = (char *)mallocCheck(256 * 3 + 64);
    size_t off = 0;
    for (int b = 0; b < 256; b++) {  // the same strings as a byte-level tokenizer.json would hold
        int k = utf8_put(tok_bl_char[b], t->vpool + off);
        t->vpool[off + k] = 0;
        t->vstr[b] = t->vpool + off, t->vlen[b] = k;
        off += k + 1;
    }
    t->added = (AddedTok *)callocCheck(3, sizeof(AddedTok));
    t->n_added = 3;
    for (int i = 0; i < 3; i++) {
        t->vstr[256 + i] = t->vpool + off;
        t->vlen[256 + i] = (int)strlen(specials[i]);
        memcpy(t->vpool + off, specials[i], strlen(specials[i]) + 1);
        off += strlen(specials[i]) + 1;
        t->added[i] = (AddedTok){.content = str_dup(specials[i]), .len = (int)strlen(specials[i]), .id = 256 + i, .special = 1};
    }
    t->mmask = 15;  // no merges
    t->merges = (MergeSlot *)mallocCheck(16 * sizeof(MergeSlot));
    memset(t->merges, 0xff, 16 * sizeof(MergeSlot));
    t->unk_id = -1;
    finish(t);
    guess_specials(t);
    return t;
}

