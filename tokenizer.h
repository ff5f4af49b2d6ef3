// tokenizer.h: Hugging Face tokenizer.json BPE, byte-level (Qwen2/Qwen3, Llama 3, SmolLM) and
// SentencePiece-style (Gemma, Mistral, Llama 2: byte fallback, U+2581), giving the
// same ids as the `tokenizers` library; decode (whole or streaming); the chat prompt
// (system + user turn + assistant prefix) in the ChatML (Qwen) or Llama 3 format; and the
// plain byte-level vocabulary of the built-in tiny models.
// Implemented in tokenizer.c (cJSON for the JSON, PCRE2 for the pre-tokenizer regex,
// tokenizer_unicode.h for NFC). Errors in the files are one line on stderr and exit(1) (die()).
// A loaded Tokenizer is read-only: encode/decode may run on several threads at once.
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Tokenizer Tokenizer;

// ---- loading ----
// A tokenizer.json: model BPE, byte-level (pre-tokenizer Split, Digits and ByteLevel; decoder
// ByteLevel) or SentencePiece-style (byte_fallback, unk_token; pre-tokenizer Metaspace, Split,
// Digits or none; decoders Replace, ByteFallback, Fuse, Strip, Metaspace); normalizers NFC,
// Replace, Prepend; added tokens. Dies on a malformed file, another model type (Unigram,
// WordPiece, ...), an unsupported component, or a regex PCRE2 rejects. Without a
// tokenizer_config.json the chat format is guessed from the added tokens (<|im_start|>:
// ChatML, <|start_header_id|>: Llama 3, <start_of_turn>: Gemma 3) and eos ids from their end-of-turn/end-of-text tokens
// (Gemma's <end_of_turn> and <eos>, </s> included).
Tokenizer *tokenizer_load(const char *tokenizer_json_path);
// A Hugging Face checkpoint directory: tokenizer.json, plus tokenizer_config.json
// (chat_template, bos/eos/pad tokens), chat_template.jinja and generation_config.json
// (eos_token_id) where present.
Tokenizer *tokenizer_load_dir(const char *checkpoint_dir);
// Built-in vocabulary of the tiny models: ids 0..255 are the bytes, then
// 256 <|endoftext|>, 257 <|im_start|>, 258 <|im_end|>; no merges; ChatML chat format.
Tokenizer *tokenizer_byte_level(void);
void tokenizer_free(Tokenizer *t);

// ---- encode / decode ----
// The ids of text (NUL-terminated), special tokens inside it recognized: Hugging Face's
// tokenizer.encode(text, add_special_tokens=False). *ids_out is malloc'ed (free it); returns
// the count. Invalid UTF-8 is read as Python's bytes.decode("utf-8", "replace") would
// (each maximal invalid subsequence becomes U+FFFD).
int tokenizer_encode(const Tokenizer *t, const char *text, int **ids_out);
// Same with an explicit length, and add_special_tokens=1 for what the file's post-processor
// adds (Llama 3: <|begin_of_text|> in front; Qwen: nothing).
int tokenizer_encode_ex(const Tokenizer *t, const char *text, size_t len, int add_special_tokens, int **ids_out);
// Text of ids (malloc'ed, NUL-terminated): Hugging Face's tokenizer.decode(ids,
// skip_special_tokens=False). Ids outside the vocabulary are skipped; invalid UTF-8 in the
// result becomes U+FFFD.
char *tokenizer_decode(const Tokenizer *t, const int *ids, int n);
// skip_special: drop special added tokens; *len_out (may be NULL): length in bytes.
char *tokenizer_decode_ex(const Tokenizer *t, const int *ids, int n, int skip_special, size_t *len_out);

// Streaming decode for printing completions as they are sampled: push ids one at a time
// and get back the text that became complete (a UTF-8 character split across tokens is
// held until its last byte arrives). The concatenation of everything returned, flush
// included, equals tokenizer_decode_ex of all the ids.
typedef struct {
    const Tokenizer *t;
    int skip_special;
    unsigned char pend[8];  // byte-level: bytes of an unfinished UTF-8 character (at most 3)
    int npend;
    char *buf;              // the text returned by the last call
    size_t cap;
    // SentencePiece-style: the bytes of the <0xNN> tokens since the last other token (held
    // until the run ends: tokenizers' ByteFallback decodes a run as a whole), strings seen
    // before and after ByteFallback, what each Strip after Fuse still removes at the start
    char *run;
    size_t nrun, caprun;
    int ntok, npost, strip_left[8];
} TokenizerStream;
void tokenizer_stream_init(TokenizerStream *s, const Tokenizer *t, int skip_special);
const char *tokenizer_stream_push(TokenizerStream *s, int id);  // valid until the next call
const char *tokenizer_stream_flush(TokenizerStream *s);        // an unfinished character -> U+FFFD
void tokenizer_stream_free(TokenizerStream *s);

// ---- chat ----
// The ids of one system + user turn followed by the assistant prefix, as transformers'
// apply_chat_template(messages, add_generation_prompt=True) gives them. system may be NULL
// (no system message: Qwen2/2.5 templates then insert their default system prompt, Llama 3.1
// its date block). Dies with a clear error when the checkpoint's template is none of the built-in
// formats, or when it refuses a system message and one is given.
int tokenizer_chat_prompt(const Tokenizer *t, const char *system, const char *user, int **ids_out);
// The same prompt as text (malloc'ed), for logs and --tokenize.
char *tokenizer_chat_text(const Tokenizer *t, const char *system, const char *user);
// Recognize a Jinja chat template (what tokenizer_load_dir does with tokenizer_config.json's).
void tokenizer_set_chat_template(Tokenizer *t, const char *jinja);
const char *tokenizer_chat_format(const Tokenizer *t);  // "chatml", "llama3", "llama3.1", "gemma", "mistral", "none", "unsupported"
// 1 when the template writes a <think> block into the assistant's turns (Qwen3's): the prompt ending in the
// generation prompt is ChatML's, a whole conversation is not
int tokenizer_chat_thinks(const Tokenizer *t);

// ---- vocabulary ----
int tokenizer_vocab_size(const Tokenizer *t);                 // largest id + 1 (model vocab and added tokens)
int tokenizer_token_id(const Tokenizer *t, const char *token);  // added token or vocab string as the file writes it ("Ġthe", "▁the"); -1 if none
const char *tokenizer_token_str(const Tokenizer *t, int id);  // the inverse; NULL if no such id
int tokenizer_is_special(const Tokenizer *t, int id);         // a special added token (skipped by skip_special)
int tokenizer_bos_id(const Tokenizer *t);                     // -1 if none
int tokenizer_pad_id(const Tokenizer *t);                     // -1 if none
// ids that end a completion: tokenizer_config's eos_token, generation_config's eos_token_id(s)
// and the chat format's end of turn (<|im_end|>, <|eot_id|>, <end_of_turn>)
const int *tokenizer_eos_ids(const Tokenizer *t, int *n);
int tokenizer_is_eos(const Tokenizer *t, int id);

// ---- pieces, exposed for tests and debugging ----
// The pre-tokenizer's words of text (after added-token splitting and normalization; an added
// token is one piece, its content). *pieces_out: malloc'ed array of malloc'ed strings.
int tokenizer_pretokenize(const Tokenizer *t, const char *text, char ***pieces_out);
void tokenizer_free_pieces(char **pieces, int n);
// NFC of valid UTF-8 s[0..len) as Hugging Face tokenizers computes it (malloc'ed, *out_len set).
char *tokenizer_nfc(const char *s, size_t len, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif  // TOKENIZER_H
