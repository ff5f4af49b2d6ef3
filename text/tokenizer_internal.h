// text/tokenizer_internal.h: the insides of a Tokenizer, shared by the two files that make one:
// tokenizer.c (the lesson: encode, decode, chat prompts) and text/tokenizer_load.c (reading
// tokenizer.json, tokenizer_config.json and the checkpoint's chat files; the built-in byte
// vocabulary). Nothing else includes it: every other file sees tokenizer.h only.
//   defines: IntVec / Buf (growable arrays), the pipeline's steps (AddedTok, PreStep, NormStep,
//   DecStep), struct Tokenizer, and the functions tokenizer.c defines for text/tokenizer_load.c (tok_*;
//   the reading uses the tokenizer, never the reverse).
#ifndef TOKENIZER_INTERNAL_H
#define TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer.h"
#include "core/common.h"

// ----------------------------------------------------------------------------
// small growable arrays

typedef struct { int *a; int n, cap; } IntVec;
static inline void iv_push(IntVec *v, int x) {
    if (v->n == v->cap) { v->cap = v->cap ? 2 * v->cap : 256; v->a = (int *)reallocCheck(v->a, (size_t)v->cap * sizeof(int)); }
    v->a[v->n++] = x;
}
typedef struct { char *p; size_t n, cap; } Buf;
static inline void buf_put(Buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = (char *)reallocCheck(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static inline void buf_str(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

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

enum { CHAT_NONE, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA31, CHAT_GEMMA, CHAT_MISTRAL, CHAT_UNSUPPORTED };
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
    char *inst_open, *inst_close;  // Mistral: the literals around the user turn ("[INST] ", " [/INST]")
    int no_system;                 // the template refuses a system message (Gemma 1/2, Mistral v0.1)
    int thinks;                    // the template writes a <think> block into assistant turns (Qwen3)
    int bos, pad, eos[MAX_EOS], n_eos;
};

// ----------------------------------------------------------------------------
// defined in tokenizer.c, used by tokenizer_load.c too

// ByteLevel: GPT-2's map of the 256 bytes to printable characters (tok_bl_init fills it, once)
extern uint32_t tok_bl_char[256];  // byte -> code point
extern int16_t tok_bl_byte[324];   // code point -> byte, -1 if none
extern pthread_once_t tok_bl_once;
void tok_bl_init(void);
// the vocabulary's id of the string s[0..n), -1 if none; the index behind it; one merge rule
int tok_vocab_get(const Tokenizer *t, const char *s, size_t n);
void tok_vocab_index(Tokenizer *t);
void tok_merge_put(Tokenizer *t, int a, int b, int rank, int id);
// the normalizer's steps over valid UTF-8 s[0..n): malloc'ed, or NULL when the text comes out unchanged
char *tok_normalize(const Tokenizer *t, const char *s, size_t n, size_t *out_n);
// an id's text as the vocabulary or the added tokens hold it
const char *tok_token_text(const Tokenizer *t, int id, size_t *n);
// a hex digit's value (-1 if none); the byte of a "<0xNN>" token string (-1 if not one)
int tok_hexval(char c);
int tok_byte_token(const char *s, size_t n);
// the SentencePiece-style decoder steps [from, to) over one token's text (first: the first token)
char *tok_dec_string(const Tokenizer *t, int from, int to, int first, const char *s, size_t n, size_t *out_n);

// the id of an added token or vocabulary string by its text, -1 if none
int tok_token_id_named(const Tokenizer *t, const char *name);

#endif  // TOKENIZER_INTERNAL_H
