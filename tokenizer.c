// tokenizer.c: Hugging Face tokenizer.json BPE, id for id what the `tokenizers` library
// computes: byte-level BPE (Qwen2/Qwen3, Llama 3, SmolLM) and SentencePiece-style BPE (Gemma,
// Mistral, Llama 2: characters as symbols, byte fallback, U+2581 for spaces); decode (whole
// and streaming); the ChatML, Llama 3, Gemma and Mistral chat prompts.
// Defines tokenizer.h's encode, decode, streaming, chat-prompt and vocabulary functions; reading
// the files (tokenizer.json, tokenizer_config.json, the chat template) and the built-in byte
// vocabulary are text/tokenizer_load.c's, the struct both fill and read text/tokenizer_internal.h.
// Uses PCRE2 (the pre-tokenizer regex, with UTF and UCP so \p{L}, \p{N}, \s and lookaheads
// behave like Oniguruma's in tokenizers), unicode.h (UTF-8 characters; NFC, in unicode.c) and
// tokenizer_unicode.h (where PCRE2's character classes differ). Tested against HF's own output in
// test/test_tokenizer.c (fixtures from dev/make_tokenizer_fixtures.py and _sp.py).
//
// The pipeline of tokenizers' encode(text, add_special_tokens), step by step:
//   1. split out added tokens (<|im_end|>, ...) that match the raw text (leftmost-longest,
//      with their lstrip/rstrip/single_word options)
//   2. tok_normalize the rest (NFC, Replace " " -> U+2581, Prepend U+2581: what the file asks),
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
#include "text/tokenizer_internal.h"  // struct Tokenizer and what text/tokenizer_load.c shares
#include "text/tokenizer_unicode.h"
#include "text/unicode.h"

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

uint32_t tok_bl_char[256];  // byte -> code point
int16_t tok_bl_byte[324];   // code point -> byte, -1 if none
pthread_once_t tok_bl_once = PTHREAD_ONCE_INIT;
void tok_bl_init(void) {
    int n = 0;
    for (int i = 0; i < 324; i++) tok_bl_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        tok_bl_char[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        tok_bl_byte[tok_bl_char[b]] = (int16_t)b;
    }
}
// the byte-level string of raw bytes (for vocabulary lookups); out needs 2*n bytes
static size_t bl_encode(const uint8_t *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += utf8_put(tok_bl_char[s[i]], out + k);
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

// ---- maps ----

int tok_vocab_get(const Tokenizer *t, const char *s, size_t n) {
    uint32_t h = (uint32_t)hash_bytes(s, n);
    for (uint32_t i = h & t->vmask;; i = (i + 1) & t->vmask) {
        uint32_t e = t->vmap[i];
        if (!e) return -1;
        int id = (int)e - 1;
        if ((size_t)t->vlen[id] == n && memcmp(t->vstr[id], s, n) == 0) return id;
    }
}
void tok_vocab_index(Tokenizer *t) {
    uint32_t cap = 1024;
    while (cap < 2u * (uint32_t)t->n_vocab + 16) cap *= 2;
    t->vmap = (uint32_t *)callocCheck(cap, sizeof(uint32_t));
    t->vmask = cap - 1;
    for (int id = 0; id < t->n_ids; id++) {
        if (!t->vstr[id]) continue;
        if (tok_vocab_get(t, t->vstr[id], t->vlen[id]) >= 0) continue;  // duplicate string: first id wins
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
void tok_merge_put(Tokenizer *t, int a, int b, int rank, int id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t i = merge_hash(key) & t->mmask;
    while (t->merges[i].key != UINT64_MAX && t->merges[i].key != key) i = (i + 1) & t->mmask;
    t->merges[i] = (MergeSlot){key, rank, id};  // a repeated pair: the later line wins, as in HF
}

char *tok_normalize(const Tokenizer *t, const char *s, size_t n, size_t *out_n) {
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
const char *tok_token_text(const Tokenizer *t, int id, size_t *n) {
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
int tok_hexval(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; }
int tok_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = tok_hexval(s[3]), lo = tok_hexval(s[4]);
    if (lo < 0 || (hi < 0 && s[3] != '+')) return -1;
    return hi < 0 ? lo : 16 * hi + lo;
}

// one string through the SentencePiece-style decoder steps dec[from..to) (none of them
// ByteFallback or Fuse), as the list's first string or not: malloc'ed, or NULL if no steps
char *tok_dec_string(const Tokenizer *t, int from, int to, int first, const char *s, size_t n, size_t *out_n) {
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
        int k = utf8_len1(w[i]), id = tok_vocab_get(t, (const char *)w + i, (size_t)k);
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
            id = tok_vocab_get(t, c->blbuf, bl_encode(w, n, c->blbuf));
        } else {
            id = tok_vocab_get(t, (const char *)w, n);
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
            char *norm = tok_normalize(t, p, n, &m);
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
    char *d = tok_dec_string(t, from, t->dec_fuse, st->npost++ == 0, s, n, &m);
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
        s = tok_token_text(t, id, &n);
        size_t m;
        if ((d = tok_dec_string(t, 0, pre_end, 1, s, n, &m)) != NULL) s = d, n = m;
        byte = t->dec_bf < t->n_dec ? tok_byte_token(s, n) : -1;
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
    if (system && t->no_system)
        die("%s: this chat template takes no system message (Gemma 1/2, Mistral v0.1 refuse one): leave the system "
            "prompt out", t->path);
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
    case CHAT_GEMMA:  // Gemma 3: the system message heads the first user turn; the user's is trimmed
        if (t->bos_str) buf_str(&b, t->bos_str);
        buf_str(&b, "<start_of_turn>user\n");
        if (system) {
            buf_str(&b, system);
            buf_str(&b, "\n\n");
        }
        put_trimmed(&b, user);
        buf_str(&b, "<end_of_turn>\n<start_of_turn>model\n");
        break;
    case CHAT_MISTRAL:  // [INST] system\n\nuser [/INST], the markers spelled as the template spells them
        if (t->bos_str) buf_str(&b, t->bos_str);
        buf_str(&b, t->inst_open);
        if (system) {
            buf_str(&b, system);
            buf_str(&b, "\n\n");
        }
        buf_str(&b, user);
        buf_str(&b, t->inst_close);
        break;
    case CHAT_NONE:
        die("%s: the checkpoint has no chat_template (a base model?): give prompts as raw text", t->path);
    default:
        die("%s: the chat template is none of ChatML (<|im_start|>, Qwen), Llama 3 (<|start_header_id|>), Gemma "
            "(<start_of_turn>) or Mistral ([INST]); only these are built in (tokenizer.c)", t->path);
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
// vocabulary access

int tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }
int tok_token_id_named(const Tokenizer *t, const char *name) {
    if (!name) return -1;
    for (int i = 0; i < t->n_added; i++) if (!strcmp(t->added[i].content, name)) return t->added[i].id;
    return tok_vocab_get(t, name, strlen(name));
}
int tokenizer_token_id(const Tokenizer *t, const char *token) { return tok_token_id_named(t, token); }
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
    free(t->default_system), free(t->date), free(t->bos_str), free(t->inst_open), free(t->inst_close), free(t->path);
    free(t);
}
