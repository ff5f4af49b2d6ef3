// tokenizer.c: Hugging Face tokenizer.json BPE, id for id what the `tokenizers` library
// computes: byte-level BPE (Qwen2/Qwen3, Llama 3, SmolLM) and SentencePiece-style BPE (Gemma,
// Mistral, Llama 2: characters as symbols, byte fallback, U+2581 for spaces); decode (whole
// and streaming); the ChatML and Llama 3 chat prompts; the built-in byte vocabulary.
// Defines everything in tokenizer.h. Uses cJSON (the files), PCRE2 (the pre-tokenizer
// regex, with UTF and UCP so \p{L}, \p{N}, \s and lookaheads behave like Oniguruma's in
// tokenizers), unicode.h (UTF-8 characters; NFC, in unicode.c) and tokenizer_unicode.h (where
// PCRE2's character classes differ). Tested against HF's own output in test/test_tokenizer.c
// (fixtures from dev/make_tokenizer_fixtures.py).
//
// The pipeline of tokenizers' encode(text, add_special_tokens), step by step:
//   1. split out added tokens (<|im_end|>, ...) that match the raw text (leftmost-longest,
//      with their lstrip/rstrip/single_word options)
//   2. normalize the rest (NFC, Replace " " -> U+2581, Prepend U+2581: what the file asks),
//      then split out the added tokens that match normalized text
//   3. pre-tokenize each remaining piece into words (Split regex, Digits, ByteLevel, Metaspace)
//   4. BPE each word. Byte-level files: its bytes are the initial symbols (ByteLevel maps byte
//      b to one printable character, so "symbol = byte" and we skip building the mapped
//      string). SentencePiece-style files: its characters are, and a character missing from
//      the vocabulary becomes its bytes' <0xNN> tokens (byte_fallback) or unk. Then merge
//      the lowest-ranked adjacent pair, leftmost first, until none applies
//   5. the post-processor's special tokens around it (Llama 3: <|begin_of_text|>)
// Decode: byte-level files map each token's characters back to bytes (a table per id);
// SentencePiece-style files run the decoder chain (Replace, ByteFallback, Fuse, Strip,
// Metaspace) as a small state machine over the ids, the same one for whole and streaming
// decode, so the two agree by construction.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <pthread.h>
#include <sys/stat.h>

#include "tokenizer.h"
#include "core/common.h"
#include "text/tokenizer_unicode.h"
#include "text/unicode.h"

// ----------------------------------------------------------------------------
// small growable arrays

typedef struct { int *a; int n, cap; } IntVec;
static void iv_push(IntVec *v, int x) {
    if (v->n == v->cap) { v->cap = v->cap ? 2 * v->cap : 256; v->a = (int *)reallocCheck(v->a, (size_t)v->cap * sizeof(int)); }
    v->a[v->n++] = x;
}
typedef struct { char *p; size_t n, cap; } Buf;
static void buf_put(Buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = (char *)reallocCheck(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void buf_str(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}

// ----------------------------------------------------------------------------
// UTF-8

// Appends s[0..n) to out with every invalid subpart replaced by U+FFFD. With keep_tail, an
// unfinished character at the very end is not replaced: its length is returned (streaming).
static size_t utf8_lossy(Buf *out, const uint8_t *s, size_t n, int keep_tail) {
    if (n == 0) return 0;  // (s may be NULL: the bytes of zero ids)
    size_t i = 0, run = 0;  // s[run..i) is valid and not yet copied
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int k = utf8_char(s + i, n - i, &cp);
        if (k > 0) { i += k; continue; }
        buf_put(out, s + run, i - run);
        if (k == 0 && keep_tail) return n - i;
        buf_put(out, "\xEF\xBF\xBD", 3);
        i += k == 0 ? n - i : (size_t)-k;
        run = i;
    }
    buf_put(out, s + run, i - run);
    return 0;
}
// the length of the valid UTF-8 that s[0..n) starts with (n: all of it)
static size_t utf8_valid_len(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int k = utf8_char(s + i, n - i, &cp);
        if (k <= 0) return i;
        i += k;
    }
    return n;
}
static int utf8_len1(uint8_t c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }  // of valid text

// Unicode White_Space (Rust's char::is_whitespace and regex \s, used by lstrip/rstrip)
static int is_white_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
// Python's str.isspace (Jinja's trim): White_Space plus the ASCII separators 0x1C..0x1F
static int is_py_space(uint32_t c) { return is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

// ----------------------------------------------------------------------------
// ByteLevel: GPT-2's map of the 256 bytes to printable characters (the printable Latin-1
// ones stay, the 68 others go to U+0100..U+0143 in order). Vocabulary strings are written
// in these characters ("Ġthe" is " the").

static uint32_t bl_char[256];  // byte -> code point
static int16_t bl_byte[324];   // code point -> byte, -1 if none
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;
static void bl_init(void) {
    int n = 0;
    for (int i = 0; i < 324; i++) bl_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        bl_char[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        bl_byte[bl_char[b]] = (int16_t)b;
    }
}
// the byte-level string of raw bytes (for vocabulary lookups); out needs 2*n bytes
static size_t bl_encode(const uint8_t *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += utf8_put(bl_char[s[i]], out + k);
    return k;
}

char *tokenizer_nfc(const char *s, size_t len, size_t *out_len) {
    Buf b = {0}, fix = {0};
    if (utf8_valid_len((const uint8_t *)s, len) < len) {  // invalid bytes: U+FFFD first, as encode does
        utf8_lossy(&fix, (const uint8_t *)s, len, 0);
        s = fix.p, len = fix.n;
    }
    size_t m;
    char *nfc = nfc_normalize((const uint8_t *)s, len, &m);
    if (nfc) buf_put(&b, nfc, m);
    else buf_put(&b, s, len);
    free(nfc);
    free(fix.p);
    if (!b.p) buf_put(&b, "", 0);
    if (out_len) *out_len = b.n;
    return b.p;
}

// ----------------------------------------------------------------------------
// the tokenizer

typedef struct {
    char *content;  // what it is (and decodes to)
    char *match;    // what it matches: content, or NFC(content) for normalized tokens
    int len, mlen, id;
    unsigned char single_word, lstrip, rstrip, normalized, special;
} AddedTok;

typedef struct {  // leftmost-longest matcher over some of the added tokens
    int *idx;        // indices into t->added, grouped by first byte, longest first
    int start[257];  // idx[start[b] .. start[b + 1]) start with byte b
} AddedSet;

enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
typedef struct {
    pcre2_code *re;    // Split's pattern, or GPT-2's for ByteLevel(use_regex); NULL: no split
    int behavior, invert;
    int literal;       // a Split {"String": ...} pattern: matched as is
    int prefix_space;  // ByteLevel(add_prefix_space): " " in front of each piece first
    // Metaspace: " " becomes the replacement (U+2581), which is put in front of a piece that
    // does not start with it (prepend always; first: only the piece at the start of the input);
    // split: re is the replacement, behavior MergedWithNext ("a▁b" -> "a", "▁b")
    int metaspace, prepend;
    char rep[8];
    int rep_len;
} PreStep;
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

// a normalizer step: NFC, Replace (every non-overlapping a -> b, left to right), Prepend b
// (to non-empty text)
enum { NORM_NFC, NORM_REPLACE, NORM_PREPEND };
typedef struct { int type; char *a, *b; size_t na, nb; } NormStep;

// A SentencePiece-style decoder step. tokenizers runs them in order over the list of token
// strings, then joins the list: Replace and Strip change each string; Metaspace too (its
// replacement -> " ", but dropped from the list's first string unless prepend_scheme is
// never); ByteFallback turns each run of <0xNN> tokens into its bytes' text (or one U+FFFD
// per byte when they are not valid UTF-8); Fuse joins the list into one string.
enum { DEC_REPLACE, DEC_STRIP, DEC_METASPACE, DEC_BYTEFALLBACK, DEC_FUSE };
typedef struct { int type; char *a, *b; size_t na, nb; uint32_t ch; int start, stop, never; } DecStep;
#define MAX_DEC 8

typedef struct { uint64_t key; int rank, id; } MergeSlot;  // key (a << 32 | b), empty: UINT64_MAX

enum { CHAT_NONE, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA31, CHAT_UNSUPPORTED };
#define MAX_STEPS 8
#define MAX_EOS 8

struct Tokenizer {
    char *path;  // for error messages
    int n_ids;   // largest id + 1
    // model vocabulary, strings in byte-level form as in the file
    char **vstr;  // [n_ids] into vpool, NULL: no vocabulary entry with this id
    int *vlen;    // [n_ids]
    char *vpool;
    uint32_t *vmap;  // open addressing over vocabulary strings: id + 1, 0 = empty
    uint32_t vmask;
    MergeSlot *merges;
    uint64_t mmask;
    int n_merges, n_vocab;
    int byte_level;    // ByteLevel pre-tokenizer: symbols are bytes; else SentencePiece-style: characters
    int byte_id[256];  // id of each byte's token (byte-level: its one character; else <0xNN>), -1 if none
    int ignore_merges, unk_id, byte_fallback, fuse_unk;
    // added tokens
    AddedTok *added;
    int n_added;
    int *added_of;  // [n_ids] index into added, -1
    AddedSet raw_set, norm_set;
    pcre2_code *word_re;  // Rust regex's \w, for single_word
    // pipeline
    NormStep norm[MAX_STEPS];
    int n_norm;
    PreStep steps[MAX_STEPS];
    int n_steps;
    int prefix[4], n_prefix, suffix[4], n_suffix;  // post-processor's special tokens
    // decoder: the bytes of each id (byte-level); SentencePiece-style: each id's text after the
    // steps before ByteFallback (as a token other than the first), dbyte its <0xNN> value or -1
    char *dpool;
    size_t *doff;  // [n_ids + 1]
    int16_t *dbyte;  // [n_ids], SentencePiece-style only
    DecStep dec[MAX_DEC];
    int n_dec, dec_bf, dec_fuse;  // dec[0..dec_bf): before ByteFallback (n_dec if none); dec_fuse: index of Fuse (n_dec if none)
    // chat, special ids
    int chat;
    char *default_system, *date, *bos_str;
    int bos, pad, eos[MAX_EOS], n_eos;
};

// ---- maps ----

static int vocab_get(const Tokenizer *t, const char *s, size_t n) {
    uint32_t h = (uint32_t)hash_bytes(s, n);
    for (uint32_t i = h & t->vmask;; i = (i + 1) & t->vmask) {
        uint32_t e = t->vmap[i];
        if (!e) return -1;
        int id = (int)e - 1;
        if ((size_t)t->vlen[id] == n && memcmp(t->vstr[id], s, n) == 0) return id;
    }
}
static void vocab_index(Tokenizer *t) {
    uint32_t cap = 1024;
    while (cap < 2u * (uint32_t)t->n_vocab + 16) cap *= 2;
    t->vmap = (uint32_t *)callocCheck(cap, sizeof(uint32_t));
    t->vmask = cap - 1;
    for (int id = 0; id < t->n_ids; id++) {
        if (!t->vstr[id]) continue;
        if (vocab_get(t, t->vstr[id], t->vlen[id]) >= 0) continue;  // duplicate string: first id wins
        uint32_t i = (uint32_t)hash_bytes(t->vstr[id], t->vlen[id]) & t->vmask;
        while (t->vmap[i]) i = (i + 1) & t->vmask;
        t->vmap[i] = (uint32_t)id + 1;
    }
}
static inline uint64_t merge_hash(uint64_t k) { return (k * 0x9E3779B97F4A7C15ull) >> 20; }
static inline const MergeSlot *merge_get(const Tokenizer *t, int a, int b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = merge_hash(key) & t->mmask;; i = (i + 1) & t->mmask) {
        const MergeSlot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}
static void merge_put(Tokenizer *t, int a, int b, int rank, int id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t i = merge_hash(key) & t->mmask;
    while (t->merges[i].key != UINT64_MAX && t->merges[i].key != key) i = (i + 1) & t->mmask;
    t->merges[i] = (MergeSlot){key, rank, id};  // a repeated pair: the later line wins, as in HF
}

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

static int token_id_named(const Tokenizer *t, const char *name) {
    if (!name) return -1;
    for (int i = 0; i < t->n_added; i++) if (!strcmp(t->added[i].content, name)) return t->added[i].id;
    return vocab_get(t, name, strlen(name));
}
static void add_eos(Tokenizer *t, int id) {
    if (id < 0) return;
    for (int i = 0; i < t->n_eos; i++) if (t->eos[i] == id) return;
    if (t->n_eos < MAX_EOS) t->eos[t->n_eos++] = id;
}

// the normalizer's steps over valid UTF-8 s[0..n): malloc'ed (NUL-terminated, length in
// *out_n), or NULL when the text comes out unchanged
static char *normalize(const Tokenizer *t, const char *s, size_t n, size_t *out_n) {
    char *cur = NULL;  // the text so far when it is no longer s
    for (int i = 0; i < t->n_norm; i++) {
        const NormStep *st = &t->norm[i];
        char *next = NULL;
        size_t m = 0;
        if (st->type == NORM_NFC) {
            next = nfc_normalize((const uint8_t *)s, n, &m);
        } else if (st->type == NORM_PREPEND) {
            if (n == 0) continue;  // tokenizers prepends to non-empty text only
            Buf b = {0};
            buf_put(&b, st->b, st->nb);
            buf_put(&b, s, n);
            next = b.p, m = b.n;
        } else if (memmem(s, n, st->a, st->na)) {  // Replace
            Buf b = {0};
            const char *p = s, *e = s + n, *q;
            while ((q = (const char *)memmem(p, (size_t)(e - p), st->a, st->na)) != NULL) {
                buf_put(&b, p, (size_t)(q - p));
                buf_put(&b, st->b, st->nb);
                p = q + st->na;
            }
            buf_put(&b, p, (size_t)(e - p));
            next = b.p ? b.p : str_dup(""), m = b.n;
        }
        if (next) {
            free(cur);
            cur = next, s = next, n = m;
        }
    }
    *out_n = n;
    return cur;
}

// the string tokenizers decodes an id from: its vocabulary entry, an added token's content
// (normalized as the normalizer changes it, if the token is: tokenizers stores it so); NULL if none
static const char *token_text(const Tokenizer *t, int id, size_t *n) {
    if (t->added_of[id] >= 0) {
        const AddedTok *a = &t->added[t->added_of[id]];
        *n = (size_t)(a->normalized ? a->mlen : a->len);
        return a->normalized ? a->match : a->content;
    }
    *n = t->vstr[id] ? (size_t)t->vlen[id] : 0;
    return t->vstr[id];
}

// ByteFallback's test for a byte token: "<0xNN>", NN read by Rust's u8::from_str_radix (which
// also takes "+F"); the byte, or -1
static int hexval(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; }
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    if (lo < 0 || (hi < 0 && s[3] != '+')) return -1;
    return hi < 0 ? lo : 16 * hi + lo;
}

// one string through the SentencePiece-style decoder steps dec[from..to) (none of them
// ByteFallback or Fuse), as the list's first string or not: malloc'ed, or NULL if no steps
static char *dec_string(const Tokenizer *t, int from, int to, int first, const char *s, size_t n, size_t *out_n) {
    if (from >= to) return NULL;
    Buf cur = {0}, next = {0};
    buf_put(&cur, s, n);
    for (int i = from; i < to; i++) {
        const DecStep *st = &t->dec[i];
        const char *p = cur.p, *e = cur.p + cur.n;
        next.n = 0;
        buf_put(&next, "", 0);
        if (st->type == DEC_REPLACE) {
            const char *q;
            while ((q = (const char *)memmem(p, (size_t)(e - p), st->a, st->na)) != NULL) {
                buf_put(&next, p, (size_t)(q - p));
                buf_put(&next, st->b, st->nb);
                p = q + st->na;
            }
            buf_put(&next, p, (size_t)(e - p));
        } else if (st->type == DEC_METASPACE) {  // tokenizers drops it from the first string
            while (p < e) {
                uint32_t c = 0;
                int k = utf8_char((const uint8_t *)p, (size_t)(e - p), &c);
                if (c != st->ch) buf_put(&next, p, (size_t)k);
                else if (!first || st->never) buf_put(&next, " ", 1);
                p += k;
            }
        } else {  // DEC_STRIP: up to start leading and stop trailing content characters
            for (int j = 0; j < st->start && p < e; j++) {
                uint32_t c = 0;
                int k = utf8_char((const uint8_t *)p, (size_t)(e - p), &c);
                if (c != st->ch) break;
                p += k;
            }
            for (int j = 0; j < st->stop && e > p; j++) {
                const char *q = e - 1;
                while (q > p && ((uint8_t)*q & 0xC0) == 0x80) q--;
                uint32_t c = 0;
                utf8_char((const uint8_t *)q, (size_t)(e - q), &c);
                if (c != st->ch) break;
                e = q;
            }
            buf_put(&next, p, (size_t)(e - p));
        }
        Buf tmp = cur;
        cur = next, next = tmp;
    }
    free(next.p);
    *out_n = cur.n;
    return cur.p;
}

// decode table: ByteLevel decoder per token (all characters map to bytes, else the raw text);
// SentencePiece-style: the steps before ByteFallback per token (as not the first), and which
// tokens are then <0xNN>
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
            const char *s = token_text(t, id, &n);
            if (!s) continue;
            char *d = dec_string(t, 0, pre_end, 0, s, n, &m);
            if (d) s = d, n = m;
            buf_put(&pool, s, n);
            if (t->dec_bf < t->n_dec) t->dbyte[id] = (int16_t)byte_token(s, n);
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
        const char *s = token_text(t, id, &n);
        if (!s) continue;
        size_t start = pool.n;
        for (size_t i = 0; i < n;) {
            uint32_t c;
            int k = utf8_char((const uint8_t *)s + i, n - i, &c);
            if (k <= 0 || c >= 324 || bl_byte[c] < 0) { pool.n = start; buf_put(&pool, s, n); break; }
            char b = (char)bl_byte[c];
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
    vocab_index(t);
    char tmp[8];
    for (int b = 0; b < 256; b++) {
        if (t->byte_level) t->byte_id[b] = vocab_get(t, tmp, utf8_put(bl_char[b], tmp));
        else t->byte_id[b] = vocab_get(t, tmp, (size_t)snprintf(tmp, sizeof tmp, "<0x%02X>", b));  // Rust's "<{:#04X}>"
    }
    t->added_of = (int *)mallocCheck((size_t)t->n_ids * sizeof(int));
    for (int i = 0; i < t->n_ids; i++) t->added_of[i] = -1;
    for (int i = 0; i < t->n_added; i++) {
        AddedTok *a = &t->added[i];
        t->added_of[a->id] = i;
        size_t n;
        if (a->normalized && (a->match = normalize(t, a->content, a->len, &n)) != NULL) {  // as tokenizers matches it
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
    for (int i = 0; i < 7; i++) add_eos(t, token_id_named(t, ends[i]));
    if (token_id_named(t, "<|im_start|>") >= 0) t->chat = CHAT_CHATML;
    else if (token_id_named(t, "<|start_header_id|>") >= 0) t->chat = CHAT_LLAMA3;
    t->bos = token_id_named(t, "<|begin_of_text|>");
    free(t->bos_str);
    t->bos_str = t->bos >= 0 ? str_dup("<|begin_of_text|>") : NULL;
}

Tokenizer *tokenizer_load(const char *path) {
    pthread_once(&bl_once, bl_init);
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
        die("%s: model type %s is not supported: fp8-grpo reads byte-level BPE tokenizers (Qwen2/Qwen3, Llama 3)", path,
            mtype ? mtype : "(none)");
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
    t->unk_id = unk ? vocab_get(t, unk, strlen(unk)) : -1;
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
        int ia = vocab_get(t, a, la), ib = vocab_get(t, b, lb);
        cat.n = 0;
        buf_put(&cat, a, la);
        buf_put(&cat, b, lb);
        int ic = vocab_get(t, cat.p, cat.n);
        if (ia < 0 || ib < 0 || ic < 0)
            die("%s: merge %d (%.*s %.*s): %s is not in the vocabulary", path, rank, (int)la, a, (int)lb, b,
                ia < 0 ? "the first token" : ib < 0 ? "the second token" : "their concatenation");
        merge_put(t, ia, ib, rank++, ic);
    }
    free(cat.p);
    cJSON_Delete(root);
    guess_specials(t);
    return t;
}

// ----------------------------------------------------------------------------
// encode

typedef struct { const char *p; size_t n; int start0; } Piece;  // start0: at offset 0 of the input (Metaspace's "first")
typedef struct { Piece *v; int n, cap; } PieceVec;
static void pv_push(PieceVec *v, const char *p, size_t n, int start0) {
    if (n == 0) return;  // tokenizers drops empty splits
    if (v->n == v->cap) { v->cap = v->cap ? 2 * v->cap : 64; v->v = (Piece *)reallocCheck(v->v, (size_t)v->cap * sizeof(Piece)); }
    v->v[v->n++] = (Piece){p, n, start0};
}
typedef struct { size_t a, b; int match; } Span;
typedef struct { int id; size_t a, b; } Seg;  // id >= 0: an added token over [a, b); -1: text

typedef struct {  // one encode call's scratch: nothing in the Tokenizer changes, so threads may share it
    pcre2_match_data *md;
    pcre2_match_context *mctx;  // with a bigger JIT stack, made on first need
    pcre2_jit_stack *jstack;
    Span *spans;
    int nspan, capspan;
    Seg *segs[2];
    int nseg[2], capseg[2];
    char **owned;  // strings made here (prefix-space pieces, normalized text)
    int nowned, capowned;
    struct Sym { int id, prev, next; } *sym;
    struct HeapE { int rank, pos, id; } *heap;
    int capsym, capheap;
    char *blbuf, *shadow;
    size_t capbl, capshadow;
    PieceVec pv[2];
} Ctx;

static const char *ctx_own(Ctx *c, char *s) {
    if (c->nowned == c->capowned) { c->capowned = c->capowned * 2 + 8; c->owned = (char **)reallocCheck(c->owned, c->capowned * sizeof(char *)); }
    return c->owned[c->nowned++] = s;
}
static void ctx_free(Ctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    if (c->mctx) pcre2_match_context_free(c->mctx);
    if (c->jstack) pcre2_jit_stack_free(c->jstack);
    for (int i = 0; i < c->nowned; i++) free(c->owned[i]);
    free(c->owned), free(c->spans), free(c->segs[0]), free(c->segs[1]), free(c->sym), free(c->heap), free(c->blbuf), free(c->shadow);
    free(c->pv[0].v), free(c->pv[1].v);
}
static void span_push(Ctx *c, size_t a, size_t b, int match) {
    if (c->nspan == c->capspan) { c->capspan = c->capspan * 2 + 64; c->spans = (Span *)reallocCheck(c->spans, c->capspan * sizeof(Span)); }
    c->spans[c->nspan++] = (Span){a, b, match};
}
static void seg_push(Ctx *c, int w, int id, size_t a, size_t b) {
    if (c->nseg[w] == c->capseg[w]) { c->capseg[w] = c->capseg[w] * 2 + 16; c->segs[w] = (Seg *)reallocCheck(c->segs[w], c->capseg[w] * sizeof(Seg)); }
    c->segs[w][c->nseg[w]++] = (Seg){id, a, b};
}

static int re_match(Ctx *c, const pcre2_code *re, const char *s, size_t n, size_t off) {
    if (!c->md) c->md = pcre2_match_data_create(4, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) {  // 32 KB by default; long runs may need more
        c->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        c->mctx = pcre2_match_context_create(NULL);
        pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    }
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        die("pre-tokenizer regex failed on a %zu-byte input: %s", n, (char *)msg);
    }
    return rc >= 0;
}

// PCRE2 and HF's Oniguruma disagree on the class of a few characters: U+180E (a space in
// PCRE2's \h list, not White_Space since Unicode 6.3) and those newer than PCRE2's Unicode
// tables (Unicode 15-16 letters and digits, in tokenizer_unicode.h). The regex runs on a copy
// where each of them is replaced by a character of the same UTF-8 length and Oniguruma's
// class (letter, digit, space, other), so the match offsets hold for the real text.
#define RE_NFIX ((int)(sizeof re_class_fix / sizeof re_class_fix[0]))
static int class_fix(uint32_t c) {
    int lo = 0, hi = RE_NFIX - 1;
    while (lo <= hi) {
        int m = (lo + hi) / 2;
        if (c < re_class_fix[m][0]) hi = m - 1;
        else if (c > re_class_fix[m][1]) lo = m + 1;
        else return (int)re_class_fix[m][2];
    }
    return -1;
}
static const char *class_rep[4][5] = {  // [class][UTF-8 length]
    {NULL, NULL, "\xC3\xA0", "\xE4\xB8\x80", "\xF0\xA0\x80\x80"},  // U+00E0, U+4E00, U+20000: letters
    {NULL, NULL, "\xD9\xA0", "\xE0\xA5\xA6", "\xF0\x9D\x9F\x8E"},  // U+0660, U+0966, U+1D7CE: digits
    {NULL, NULL, "\xC2\xA0", "\xE3\x80\x80", NULL},                // U+00A0, U+3000: spaces
    {NULL, NULL, "\xC2\xA7", "\xE2\x80\xA2", "\xF0\x9F\x98\x80"},  // U+00A7, U+2022, U+1F600: other
};
static const char *regex_subject(Ctx *c, const char *s, size_t n) {
    char *copy = NULL;
    for (size_t i = 0; i < n;) {
        uint8_t b = (uint8_t)s[i];
        if (b < 0xC2) { i++; continue; }
        uint32_t cp;
        int k = utf8_char((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0) { i++; continue; }  // not a character (the text is valid UTF-8: never, but never a hang)
        int cl = cp >= re_class_fix[0][0] ? class_fix(cp) : -1;
        if (cl >= 0 && class_rep[cl][k]) {
            if (!copy) {
                if (n + 1 > c->capshadow) { c->capshadow = 2 * n + 64; c->shadow = (char *)reallocCheck(c->shadow, c->capshadow); }
                copy = c->shadow;
                memcpy(copy, s, n);
            }
            memcpy(copy + i, class_rep[cl][k], (size_t)k);
        }
        i += k;
    }
    return copy ? copy : s;
}

// tokenizers' Split: the pattern's matches and the gaps between them, then the behaviour
static void split_piece(Ctx *c, const PreStep *st, const char *s, size_t n, int start0, PieceVec *out) {
    c->nspan = 0;
    size_t off = 0, prev = 0;
    const char *subj = st->literal ? s : regex_subject(c, s, n);
    while (off <= n && re_match(c, st->re, subj, n, off)) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t a = ov[0], b = ov[1];
        if (a > prev) span_push(c, prev, a, st->invert);
        span_push(c, a, b, !st->invert);
        prev = b;
        off = b > a ? b : b + (b < n ? (size_t)utf8_len1((uint8_t)s[b]) : 1);
    }
    if (prev < n) span_push(c, prev, n, st->invert);
    Span *v = c->spans;
    int m = c->nspan, k = 0;  // spans merged in place: v[0..k)
    switch (st->behavior) {
    case SPLIT_ISOLATED: k = m; break;
    case SPLIT_REMOVED:
        for (int i = 0; i < m; i++) if (!v[i].match) v[k++] = v[i];
        break;
    case SPLIT_CONTIGUOUS:  // runs of matches (and of non-matches) become one piece
        for (int i = 0, pm = 0; i < m; pm = v[i].match, i++) {
            if (k > 0 && v[i].match == pm) v[k - 1].b = v[i].b;
            else v[k++] = v[i];
        }
        break;
    case SPLIT_MERGED_PREV:  // a match joins the piece before it
        for (int i = 0, pm = 0; i < m; pm = v[i].match, i++) {
            if (k > 0 && v[i].match && !pm) v[k - 1].b = v[i].b;
            else v[k++] = v[i];
        }
        break;
    case SPLIT_MERGED_NEXT: {  // a match joins the piece after it: the same, walking backwards
        int j = m;
        for (int i = m - 1, pm = 0; i >= 0; pm = v[i].match, i--) {
            if (j < m && v[i].match && !pm) v[j].a = v[i].a;
            else v[--j] = v[i];
        }
        for (int i = j; i < m; i++) v[k++] = v[i];
        break;
    }
    }
    for (int i = 0; i < k; i++) pv_push(out, s + v[i].a, v[i].b - v[i].a, start0 && v[i].a == 0);
}

// Metaspace: " " -> the replacement, which goes in front if the scheme says so
static Piece metaspace(Ctx *c, const PreStep *st, Piece p) {
    Buf b = {0};
    int starts = p.p[0] == ' ' || (p.n >= (size_t)st->rep_len && !memcmp(p.p, st->rep, (size_t)st->rep_len));
    if (!starts && (st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && p.start0))) buf_put(&b, st->rep, (size_t)st->rep_len);
    const char *q = p.p, *e = p.p + p.n, *sp;
    while ((sp = (const char *)memchr(q, ' ', (size_t)(e - q))) != NULL) {
        buf_put(&b, q, (size_t)(sp - q));
        buf_put(&b, st->rep, (size_t)st->rep_len);
        q = sp + 1;
    }
    buf_put(&b, q, (size_t)(e - q));
    return (Piece){ctx_own(c, b.p), b.n, p.start0};
}

// the pre-tokenizer steps over one piece of text; the words end up in c->pv[result]
static int pretokenize_piece(const Tokenizer *t, Ctx *c, const char *s, size_t n, int start0) {
    int cur = 0;
    c->pv[0].n = 0;
    pv_push(&c->pv[0], s, n, start0);
    for (int i = 0; i < t->n_steps; i++) {
        const PreStep *st = &t->steps[i];
        PieceVec *in = &c->pv[cur], *out = &c->pv[1 - cur];
        out->n = 0;
        for (int j = 0; j < in->n; j++) {
            Piece p = in->v[j];
            if (st->prefix_space && p.p[0] != ' ') {
                char *q = (char *)mallocCheck(p.n + 2);
                q[0] = ' ';
                memcpy(q + 1, p.p, p.n);
                q[p.n + 1] = 0;
                p = (Piece){ctx_own(c, q), p.n + 1, p.start0};
            }
            if (st->metaspace) p = metaspace(c, st, p);
            if (st->re) split_piece(c, st, p.p, p.n, p.start0, out);
            else pv_push(out, p.p, p.n, p.start0);
        }
        cur = 1 - cur;
    }
    return cur;
}

// BPE of one word, tokenizers' Word::merge_all: a min-heap of (rank, position) over adjacent
// pairs; pop the best, skip it if stale, merge, push the two new neighbour pairs.
static void heap_push(Ctx *c, int *nh, int rank, int pos, int id) {
    struct HeapE *h = c->heap;
    int i = (*nh)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h[p].rank < rank || (h[p].rank == rank && h[p].pos < pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = (struct HeapE){rank, pos, id};
}
static struct HeapE heap_pop(Ctx *c, int *nh) {
    struct HeapE *h = c->heap, top = h[0], last = h[--(*nh)];
    int i = 0, n = *nh;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        struct HeapE *best = &last;
        if (l < n && (h[l].rank < best->rank || (h[l].rank == best->rank && h[l].pos < best->pos))) m = l, best = &h[l];
        if (r < n && (h[r].rank < best->rank || (h[r].rank == best->rank && h[r].pos < best->pos))) m = r, best = &h[r];
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = last;
    return top;
}
// SentencePiece-style initial symbols, tokenizers' BPE::merge_word: each character's vocabulary
// entry; else with byte_fallback its bytes' <0xNN> tokens if all exist; else unk (a run of
// them fused into one with fuse_unk), or nothing without an unk_token. (tokenizers adds a
// pending unk only at the next character found in the vocabulary or at the end, so it lands
// after byte tokens that come between; so here.)
static int sp_symbols(const Tokenizer *t, struct Sym *s, const uint8_t *w, size_t n) {
    int ns = 0, unk = 0;  // unk: an unk symbol pending
    for (size_t i = 0; i < n;) {
        int k = utf8_len1(w[i]), id = vocab_get(t, (const char *)w + i, (size_t)k);
        if (id >= 0) {
            if (unk) s[ns] = (struct Sym){t->unk_id, ns - 1, ns + 1}, ns++, unk = 0;
            s[ns] = (struct Sym){id, ns - 1, ns + 1}, ns++;
        } else {
            int all = t->byte_fallback;
            for (int j = 0; j < k && all; j++) all = t->byte_id[w[i + j]] >= 0;
            if (all) {
                for (int j = 0; j < k; j++) s[ns] = (struct Sym){t->byte_id[w[i + j]], ns - 1, ns + 1}, ns++;
            } else if (t->unk_id >= 0) {
                if (unk && !t->fuse_unk) s[ns] = (struct Sym){t->unk_id, ns - 1, ns + 1}, ns++;
                unk = 1;
            }
        }
        i += (size_t)k;
    }
    if (unk) s[ns] = (struct Sym){t->unk_id, ns - 1, ns + 1}, ns++;
    return ns;
}

static void bpe_word(const Tokenizer *t, Ctx *c, const uint8_t *w, size_t n, IntVec *out) {
    if (t->ignore_merges) {  // Llama 3: a word that is a vocabulary entry is one token, whatever the merges say
        int id;
        if (t->byte_level) {
            if (2 * n > c->capbl) { c->capbl = 2 * n + 64; c->blbuf = (char *)reallocCheck(c->blbuf, c->capbl); }
            id = vocab_get(t, c->blbuf, bl_encode(w, n, c->blbuf));
        } else {
            id = vocab_get(t, (const char *)w, n);
        }
        if (id >= 0) { iv_push(out, id); return; }
    }
    if ((int)n + 1 > c->capsym) {
        c->capsym = (int)n * 2 + 64;
        c->sym = (struct Sym *)reallocCheck(c->sym, c->capsym * sizeof(struct Sym));
        c->capheap = 3 * c->capsym;  // at most n - 1 initial pairs plus 2 per merge
        c->heap = (struct HeapE *)reallocCheck(c->heap, c->capheap * sizeof(struct HeapE));
    }
    struct Sym *s = c->sym;
    int ns = 0;
    if (!t->byte_level) {
        ns = sp_symbols(t, s, w, n);
    } else {
        for (size_t i = 0; i < n; i++) {
            int id = t->byte_id[w[i]];
            if (id < 0) id = t->unk_id;  // a byte missing from the vocabulary: unk, or dropped as tokenizers does
            if (id < 0) continue;
            s[ns] = (struct Sym){id, ns - 1, ns + 1};
            ns++;
        }
    }
    if (ns == 0) return;
    s[ns - 1].next = -1;
    int nh = 0;
    for (int i = 0; i + 1 < ns; i++) {
        const MergeSlot *m = merge_get(t, s[i].id, s[i + 1].id);
        if (m) heap_push(c, &nh, m->rank, i, m->id);
    }
    while (nh > 0) {
        struct HeapE top = heap_pop(c, &nh);
        struct Sym *a = &s[top.pos];
        if (a->id < 0 || a->next < 0) continue;  // merged away, or last
        struct Sym *b = &s[a->next];
        const MergeSlot *m = merge_get(t, a->id, b->id);
        if (!m || m->id != top.id) continue;  // stale: this pair changed since it was pushed
        a->id = top.id;
        b->id = -1;
        a->next = b->next;
        if (a->next >= 0) s[a->next].prev = top.pos;
        if (a->prev >= 0 && (m = merge_get(t, s[a->prev].id, a->id))) heap_push(c, &nh, m->rank, a->prev, m->id);
        if (a->next >= 0 && (m = merge_get(t, a->id, s[a->next].id))) heap_push(c, &nh, m->rank, top.pos, m->id);
    }
    for (int i = 0; i >= 0; i = s[i].next) iv_push(out, s[i].id);
}

// tokenizers' AddedVocabulary::find_matches: leftmost-longest, then the token's options
static int word_char_at(const Tokenizer *t, Ctx *c, const char *s, size_t n) {
    if (n == 0) return 0;
    uint8_t b = (uint8_t)s[0];
    if (b < 0x80) return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_';
    return re_match(c, t->word_re, s, utf8_len1(b), 0);
}
static void find_added(const Tokenizer *t, Ctx *c, const AddedSet *set, const char *s, size_t n, int w) {
    c->nseg[w] = 0;
    size_t start_off = 0;
    for (size_t i = 0; i < n;) {
        uint8_t b = (uint8_t)s[i];
        int hit = -1;
        for (int k = set->start[b]; k < set->start[b + 1]; k++) {
            const AddedTok *a = &t->added[set->idx[k]];
            if ((size_t)a->mlen <= n - i && memcmp(s + i, a->match, a->mlen) == 0) { hit = set->idx[k]; break; }
        }
        if (hit < 0) { i++; continue; }
        const AddedTok *a = &t->added[hit];
        size_t ms = i, me = i + a->mlen;
        i = me;  // the next match starts after this one, even if this one is then refused
        if (a->single_word) {  // refused inside a word: a word character just before or after
            size_t p = ms;
            if (p > 0) p--;
            while (p > 0 && ((uint8_t)s[p] & 0xC0) == 0x80) p--;  // start of the character before
            if ((ms > 0 && word_char_at(t, c, s + p, ms - p)) || word_char_at(t, c, s + me, n - me)) continue;
        }
        if (a->lstrip) {  // swallow the white space before, but not into the previous match
            size_t p = ms;
            while (p > 0) {
                size_t q = p - 1;
                while (q > 0 && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
                uint32_t cp;
                if (utf8_char((const uint8_t *)s + q, n - q, &cp) <= 0 || !is_white_space(cp)) break;
                p = q;
            }
            ms = p > start_off ? p : start_off;
        }
        if (a->rstrip) {
            while (me < n) {
                uint32_t cp;
                int k = utf8_char((const uint8_t *)s + me, n - me, &cp);
                if (k <= 0 || !is_white_space(cp)) break;
                me += k;
            }
        }
        if (start_off < ms) seg_push(c, w, -1, start_off, ms);
        seg_push(c, w, a->id, ms, me);
        start_off = me;
    }
    if (start_off < n) seg_push(c, w, -1, start_off, n);
}

// The whole pipeline. With words != NULL, the pre-tokenizer's words are collected instead of ids.
static int encode_impl(const Tokenizer *t, const char *text, size_t len, int add_special, int **ids_out, char ***words, int *nwords) {
    if (!text) die("tokenizer_encode: text is NULL");
    Ctx c = {0};
    IntVec ids = {0};
    Buf wb = {0};  // words: NUL-separated
    const char *s = text;
    if (utf8_valid_len((const uint8_t *)text, len) < len) {  // read it as Python's decode(errors="replace")
        Buf fix = {0};
        utf8_lossy(&fix, (const uint8_t *)text, len, 0);
        s = ctx_own(&c, fix.p), len = fix.n;
    }
    if (add_special) for (int i = 0; i < t->n_prefix; i++) iv_push(&ids, t->prefix[i]);
    find_added(t, &c, &t->raw_set, s, len, 0);
    for (int i = 0; i < c.nseg[0]; i++) {
        Seg g = c.segs[0][i];
        if (g.id >= 0) {
            iv_push(&ids, g.id);
            if (words) buf_put(&wb, t->added[t->added_of[g.id]].content, t->added[t->added_of[g.id]].len + 1);
            continue;
        }
        const char *p = s + g.a;
        size_t n = g.b - g.a;
        if (t->n_norm) {
            size_t m;
            char *norm = normalize(t, p, n, &m);
            if (norm) p = ctx_own(&c, norm), n = m;
        }
        find_added(t, &c, &t->norm_set, p, n, 1);
        for (int j = 0; j < c.nseg[1]; j++) {
            Seg h = c.segs[1][j];
            if (h.id >= 0) {
                iv_push(&ids, h.id);
                if (words) buf_put(&wb, t->added[t->added_of[h.id]].content, t->added[t->added_of[h.id]].len + 1);
                continue;
            }
            int r = pretokenize_piece(t, &c, p + h.a, h.b - h.a, g.a == 0 && h.a == 0);
            for (int k = 0; k < c.pv[r].n; k++) {
                Piece w = c.pv[r].v[k];
                if (words) {
                    buf_put(&wb, w.p, w.n);
                    buf_put(&wb, "", 1);
                } else {
                    bpe_word(t, &c, (const uint8_t *)w.p, w.n, &ids);
                }
            }
        }
    }
    if (add_special) for (int i = 0; i < t->n_suffix; i++) iv_push(&ids, t->suffix[i]);
    ctx_free(&c);
    if (words) {
        int nw = 0;
        for (size_t i = 0; i < wb.n; i++) nw += wb.p[i] == 0;
        *words = (char **)mallocCheck((size_t)(nw + 1) * sizeof(char *));
        for (size_t i = 0, k = 0; i < wb.n; k++) {
            (*words)[k] = str_dup(wb.p + i);
            i += strlen(wb.p + i) + 1;
        }
        *nwords = nw;
        free(wb.p), free(ids.a);
        return nw;
    }
    *ids_out = ids.a ? ids.a : (int *)mallocCheck(sizeof(int));
    return ids.n;
}

int tokenizer_encode_ex(const Tokenizer *t, const char *text, size_t len, int add_special_tokens, int **ids_out) {
    return encode_impl(t, text, len, add_special_tokens, ids_out, NULL, NULL);
}
int tokenizer_encode(const Tokenizer *t, const char *text, int **ids_out) {
    if (!text) die("tokenizer_encode: text is NULL");
    return encode_impl(t, text, strlen(text), 0, ids_out, NULL, NULL);
}
int tokenizer_pretokenize(const Tokenizer *t, const char *text, char ***pieces_out) {
    int n = 0;
    encode_impl(t, text, strlen(text), 0, NULL, pieces_out, &n);
    return n;
}
void tokenizer_free_pieces(char **pieces, int n) {
    for (int i = 0; i < n; i++) free(pieces[i]);
    free(pieces);
}

// ----------------------------------------------------------------------------
// decode

static int decodable(const Tokenizer *t, int id, int skip_special) {
    if (id < 0 || id >= t->n_ids) return 0;
    if (t->added_of[id] >= 0) return !(skip_special && t->added[t->added_of[id]].special);
    return t->vstr[id] != NULL;
}

// SentencePiece-style decode as a machine over the ids (TokenizerStream's state): each id's
// text after the steps before ByteFallback; a byte token joins the pending run; any other
// string first ends the run (its text, or one U+FFFD per byte when not valid UTF-8), then
// goes through the steps between ByteFallback and Fuse, then those after Fuse, and out.
static void sp_emit(const Tokenizer *t, TokenizerStream *st, const char *s, size_t n, Buf *out) {
    size_t m;
    int from = t->dec_bf < t->n_dec ? t->dec_bf + 1 : t->dec_fuse;
    char *d = dec_string(t, from, t->dec_fuse, st->npost++ == 0, s, n, &m);
    if (d) s = d, n = m;
    if (t->dec_fuse == t->n_dec) {  // no Fuse: tokenizers joins the strings at the end
        buf_put(out, s, n);
        free(d);
        return;
    }
    Buf cur = {0}, next = {0};  // after Fuse, the one string goes by in pieces: steps per character
    buf_put(&cur, s, n);
    free(d);
    for (int i = t->dec_fuse + 1; i < t->n_dec; i++) {
        const DecStep *ds = &t->dec[i];
        const char *p = cur.p, *e = cur.p + cur.n;
        next.n = 0;
        buf_put(&next, "", 0);
        while (p < e) {
            uint32_t c = 0;
            int k = utf8_char((const uint8_t *)p, (size_t)(e - p), &c);
            if (ds->type == DEC_STRIP) {  // start of the whole text: up to start content characters
                if (st->strip_left[i] > 0 && c == ds->ch) st->strip_left[i]--;
                else st->strip_left[i] = 0, buf_put(&next, p, (size_t)k);
            } else if (ds->type == DEC_METASPACE) {  // the whole text is the first string
                if (c != ds->ch) buf_put(&next, p, (size_t)k);
                else if (ds->never) buf_put(&next, " ", 1);
            } else {  // DEC_REPLACE of one character
                if (c == ds->ch) buf_put(&next, ds->b, ds->nb);
                else buf_put(&next, p, (size_t)k);
            }
            p += k;
        }
        Buf tmp = cur;
        cur = next, next = tmp;
    }
    buf_put(out, cur.p, cur.n);
    free(cur.p), free(next.p);
}
static void sp_end_run(const Tokenizer *t, TokenizerStream *st, Buf *out) {
    if (!st->nrun) return;
    size_t n = st->nrun;
    st->nrun = 0;
    if (utf8_valid_len((const uint8_t *)st->run, n) == n) sp_emit(t, st, st->run, n, out);
    else for (size_t i = 0; i < n; i++) sp_emit(t, st, "\xEF\xBF\xBD", 3, out);
}
static void sp_push(const Tokenizer *t, TokenizerStream *st, int id, Buf *out) {
    const char *s = t->dpool + t->doff[id];
    size_t n = t->doff[id + 1] - t->doff[id];
    int byte = t->dbyte[id];
    char *d = NULL;
    if (st->ntok++ == 0) {  // the first string: the steps again, as the first (Metaspace differs)
        int pre_end = t->dec_bf < t->n_dec ? t->dec_bf : t->dec_fuse;
        s = token_text(t, id, &n);
        size_t m;
        if ((d = dec_string(t, 0, pre_end, 1, s, n, &m)) != NULL) s = d, n = m;
        byte = t->dec_bf < t->n_dec ? byte_token(s, n) : -1;
    }
    if (byte >= 0) {
        if (st->nrun == st->caprun) st->caprun = 2 * st->caprun + 16, st->run = (char *)reallocCheck(st->run, st->caprun);
        st->run[st->nrun++] = (char)byte;
    } else {
        sp_end_run(t, st, out);
        sp_emit(t, st, s, n, out);
    }
    free(d);
}

char *tokenizer_decode_ex(const Tokenizer *t, const int *ids, int n, int skip_special, size_t *len_out) {
    Buf raw = {0}, out = {0};
    if (!t->byte_level) {
        TokenizerStream st;
        tokenizer_stream_init(&st, t, skip_special);
        for (int i = 0; i < n; i++) if (decodable(t, ids[i], skip_special)) sp_push(t, &st, ids[i], &out);
        sp_end_run(t, &st, &out);
        free(st.run);
        if (!out.p) buf_put(&out, "", 0);
        if (len_out) *len_out = out.n;
        return out.p;
    }
    for (int i = 0; i < n; i++)
        if (decodable(t, ids[i], skip_special)) buf_put(&raw, t->dpool + t->doff[ids[i]], t->doff[ids[i] + 1] - t->doff[ids[i]]);
    utf8_lossy(&out, (const uint8_t *)raw.p, raw.n, 0);
    if (!out.p) buf_put(&out, "", 0);
    free(raw.p);
    if (len_out) *len_out = out.n;
    return out.p;
}
char *tokenizer_decode(const Tokenizer *t, const int *ids, int n) { return tokenizer_decode_ex(t, ids, n, 0, NULL); }

void tokenizer_stream_init(TokenizerStream *s, const Tokenizer *t, int skip_special) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    for (int i = t->dec_fuse + 1; i < t->n_dec; i++) s->strip_left[i] = t->dec[i].start;
}
const char *tokenizer_stream_push(TokenizerStream *s, int id) {
    const Tokenizer *t = s->t;
    Buf in = {0}, out = {0};
    if (!t->byte_level) {
        if (decodable(t, id, s->skip_special)) sp_push(t, s, id, &out);
        if (!out.p) buf_put(&out, "", 0);
        free(s->buf);
        s->buf = out.p, s->cap = out.cap;
        return s->buf;
    }
    buf_put(&in, s->pend, s->npend);
    if (decodable(t, id, s->skip_special)) buf_put(&in, t->dpool + t->doff[id], t->doff[id + 1] - t->doff[id]);
    size_t tail = in.n ? utf8_lossy(&out, (const uint8_t *)in.p, in.n, 1) : 0;
    if (tail) memcpy(s->pend, in.p + in.n - tail, tail);  // an unfinished character: at most 3 bytes
    s->npend = (int)tail;
    free(in.p);
    free(s->buf);
    if (!out.p) buf_put(&out, "", 0);
    s->buf = out.p;
    s->cap = out.cap;
    return s->buf;
}
const char *tokenizer_stream_flush(TokenizerStream *s) {
    Buf out = {0};
    if (!s->t->byte_level) sp_end_run(s->t, s, &out);
    utf8_lossy(&out, s->pend, s->npend, 0);
    if (!out.p) buf_put(&out, "", 0);
    s->npend = 0;
    free(s->buf);
    s->buf = out.p;
    s->cap = out.cap;
    return s->buf;
}
void tokenizer_stream_free(TokenizerStream *s) {
    free(s->buf), free(s->run);
    memset(s, 0, sizeof *s);
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

// We do not run Jinja: we recognize the two template families GRPO needs and render them in
// C. ChatML (Qwen2, Qwen2.5, Qwen3) differs only in the default system prompt Qwen2/2.5
// insert when there is no system message: a string literal "<|im_start|>system\n...<|im_end|>"
// in the template. Llama 3.1+ always emit a system block opening with the knowledge-cutoff
// lines (the date: the template's date_string default, or today's as transformers'
// strftime_now gives it). Anything else is refused with a clear error when a chat prompt is asked for.
void tokenizer_set_chat_template(Tokenizer *t, const char *tmpl) {
    free(t->default_system), free(t->date);
    t->default_system = t->date = NULL;
    if (!tmpl) { t->chat = CHAT_NONE; return; }
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
    } else {
        t->chat = CHAT_UNSUPPORTED;
    }
}

const char *tokenizer_chat_format(const Tokenizer *t) {
    static const char *names[] = {"none", "chatml", "llama3", "llama3.1", "unsupported"};
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
    if (text) {
        cJSON *cfg = parse_json(p, text, n);
        free(text);
        t->n_eos = 0;
        const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token"), *pad = config_token(cfg, "pad_token");
        t->bos = token_id_named(t, bos);
        free(t->bos_str);
        t->bos_str = bos ? str_dup(bos) : NULL;
        t->pad = token_id_named(t, pad);
        add_eos(t, token_id_named(t, eos));
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
    if (text || tmpl) tokenizer_set_chat_template(t, tmpl);
    free(tmpl);
    path_join(p, sizeof p, dir, "generation_config.json");
    if ((text = read_file(p, &n, 0)) != NULL) {
        cJSON *g = parse_json(p, text, n), *e;
        free(text);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(g, "eos_token_id");
        const cJSON *list = cJSON_IsArray(ids) ? ids : NULL;
        if (cJSON_IsNumber(ids)) add_eos(t, jid(p, ids, "eos_token_id"));
        cJSON_ArrayForEach(e, list) add_eos(t, jid(p, e, "eos_token_id"));
        cJSON_Delete(g);
    }
    if (t->chat == CHAT_CHATML) add_eos(t, token_id_named(t, "<|im_end|>"));
    if (t->chat >= CHAT_LLAMA3 && t->chat <= CHAT_LLAMA31) add_eos(t, token_id_named(t, "<|eot_id|>"));
    return t;
}

// ----------------------------------------------------------------------------
// chat prompt

static void put_trimmed(Buf *b, const char *s) {  // Jinja's |trim: Python's str.strip()
    const uint8_t *p = (const uint8_t *)s, *e = p + strlen(s);
    uint32_t c;
    int k;
    while (p < e && (k = utf8_char(p, (size_t)(e - p), &c)) > 0 && is_py_space(c)) p += k;
    while (e > p) {
        const uint8_t *q = e - 1;
        while (q > p && (*q & 0xC0) == 0x80) q--;
        if ((k = utf8_char(q, (size_t)(e - q), &c)) <= 0 || !is_py_space(c)) break;
        e = q;
    }
    buf_put(b, p, (size_t)(e - p));
}

char *tokenizer_chat_text(const Tokenizer *t, const char *system, const char *user) {
    if (!user) die("tokenizer_chat_prompt: user message is NULL");
    Buf b = {0};
    switch (t->chat) {
    case CHAT_CHATML:
        if (!system) system = t->default_system;
        if (system) {
            buf_str(&b, "<|im_start|>system\n");
            buf_str(&b, system);
            buf_str(&b, "<|im_end|>\n");
        }
        buf_str(&b, "<|im_start|>user\n");
        buf_str(&b, user);
        buf_str(&b, "<|im_end|>\n<|im_start|>assistant\n");
        break;
    case CHAT_LLAMA3:
    case CHAT_LLAMA31:
        if (t->bos_str) buf_str(&b, t->bos_str);
        if (system || t->chat == CHAT_LLAMA31) {
            buf_str(&b, "<|start_header_id|>system<|end_header_id|>\n\n");
            if (t->chat == CHAT_LLAMA31) {
                buf_str(&b, "Cutting Knowledge Date: December 2023\nToday Date: ");
                buf_str(&b, t->date);
                buf_str(&b, "\n\n");
            }
            put_trimmed(&b, system ? system : "");
            buf_str(&b, "<|eot_id|>");
        }
        buf_str(&b, "<|start_header_id|>user<|end_header_id|>\n\n");
        put_trimmed(&b, user);
        buf_str(&b, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_NONE:
        die("%s: the checkpoint has no chat_template (a base model?): give prompts as raw text", t->path);
    default:
        die("%s: the chat template is neither ChatML (<|im_start|>, Qwen) nor Llama 3 (<|start_header_id|>); "
            "only these two are built in (tokenizer.c)", t->path);
    }
    return b.p;
}

int tokenizer_chat_prompt(const Tokenizer *t, const char *system, const char *user, int **ids_out) {
    char *text = tokenizer_chat_text(t, system, user);
    int n = tokenizer_encode(t, text, ids_out);
    free(text);
    return n;
}

// ----------------------------------------------------------------------------
// the built-in byte vocabulary

Tokenizer *tokenizer_byte_level(void) {
    pthread_once(&bl_once, bl_init);
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
        int k = utf8_put(bl_char[b], t->vpool + off);
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

// ----------------------------------------------------------------------------
// vocabulary access

int tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }
int tokenizer_token_id(const Tokenizer *t, const char *token) { return token_id_named(t, token); }
const char *tokenizer_token_str(const Tokenizer *t, int id) {
    if (id < 0 || id >= t->n_ids) return NULL;
    return t->added_of[id] >= 0 ? t->added[t->added_of[id]].content : t->vstr[id];
}
int tokenizer_is_special(const Tokenizer *t, int id) {
    return id >= 0 && id < t->n_ids && t->added_of[id] >= 0 && t->added[t->added_of[id]].special;
}
int tokenizer_bos_id(const Tokenizer *t) { return t->bos; }
int tokenizer_pad_id(const Tokenizer *t) { return t->pad; }
const int *tokenizer_eos_ids(const Tokenizer *t, int *n) {
    *n = t->n_eos;
    return t->eos;
}
int tokenizer_is_eos(const Tokenizer *t, int id) {
    for (int i = 0; i < t->n_eos; i++) if (t->eos[i] == id) return 1;
    return 0;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content), free(t->added[i].match);
    for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    for (int i = 0; i < t->n_dec; i++) free(t->dec[i].a), free(t->dec[i].b);
    if (t->word_re) pcre2_code_free(t->word_re);
    free(t->added), free(t->raw_set.idx), free(t->norm_set.idx), free(t->added_of);
    free(t->vstr), free(t->vlen), free(t->vpool), free(t->vmap), free(t->merges), free(t->dpool), free(t->doff), free(t->dbyte);
    free(t->default_system), free(t->date), free(t->bos_str), free(t->path);
    free(t);
}
