// sft.h: supervised fine-tuning (SFT) on (prompt, completion) pairs, the loss on the completion
// tokens only (TRL's completion_only_loss), training every weight (full_finetune.h) or a LoRA adapter (lora.h).
//   defines: SftText, sft_read_jsonl (the user's JSONL), SftFormat, SftExample, sft_encode,
//            sft_eos_id (text -> tokens), SftData, sft_data_load, sft_data_at (the data and its
//            order), SftBatch, sft_batch_make, sft_loss (a batch and its loss), SftTrainer,
//            sft_step (one optimizer step; its learning rate from train/optim.h's lr_schedule), and
//            what train/dpo_train.h shares: sft_read_messages, jsonl_read_all, data_order_at,
//            sft_zero_grads and sft_apply
// Used by ./train_sft (train_sft.c) on a user's data, and by ./train_grpo's warm-up of the
// built-in model, which makes its demonstrations itself and trains on them with sft_step.
//
// The data: JSONL, each line a prompt and its completion, as text or as chat messages (see
// sft_read_jsonl). A prompt goes through the checkpoint's chat template when it has one (the user
// turn and the assistant prefix, as tokenizer_chat_prompt gives them), else it is raw text; the
// completion follows it, ended by EOS (the chat format's end of turn). Prompt and completion are
// tokenized apart, as the rollout engine and ./generate see them: the prompt's ids alone, then
// the model's continuation (TRL tokenizes prompt + completion at once and can merge a token
// across the boundary; here the trained sequence is exactly the one generation produces).
//
// The loss: the mean negative log-likelihood per completion token, over all the completion
// tokens of an optimizer step's examples (transformers' num_items_in_batch: gradient accumulation
// changes the memory, not the loss). Prompt tokens and padding are never targets.
//
// Batches are right-padded to their longest example, not packed: packing several examples into
// one row needs attention that stops at each example's boundary (position ids restarting and a
// block-diagonal causal mask, as TRL's packing gets from flash-attention's varlen kernels), which
// attention.cu does not have; packed rows under the plain causal mask would let an example attend
// to the one before it. Padding costs the forward on the pad positions instead.
#ifndef SFT_H
#define SFT_H

#include <stddef.h>
#include <stdint.h>

#include "lora.h"
#include "model.h"
#include "tokenizer.h"
#include "train/full_finetune.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// the data as text

typedef struct {
    char *system;        // the system message, or NULL
    char *prompt;        // the prompt, or the user turn of a conversation
    char *completion;    // the completion, or the assistant's reply
    int conversational;  // 1: given as chat messages (it needs the chat template)
    long line;           // its line in the file (1-based)
} SftText;

// Read a JSONL file of SFT examples; each non-blank line one of (TRL's dataset formats)
//   {"prompt": "17+25=", "completion": "42"}                                  prompt-completion
//   {"messages": [{"role": "system", "content": ...}, (optional)
//                 {"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}
//   {"prompt": [system?, user messages], "completion": [{"role": "assistant", ...}]}
// (the conversations: one user turn and the assistant's reply, an optional system message first).
// Returns 0 and *out (n, malloc'ed), or -1 with a one-line message in err naming the line and
// what is supported: "data.jsonl:3: \"messages\" has 2 user turns: one user turn and the
// assistant's reply are supported (an optional system message first)".
int sft_read_jsonl(const char *path, SftText **out, long *n, char *err, size_t cap);
void sft_texts_free(SftText *t, long n);
// A list of chat messages -> its system (optional), user and assistant contents; want_user /
// want_reply say which the list holds ("messages": both; a conversational "prompt": the user turn,
// a "completion" (or DPO's "chosen" / "rejected"): the reply alone). NULL, or what is wrong (into why).
struct cJSON;
const char *sft_read_messages(const struct cJSON *list, const char *field, int want_user, int want_reply, const char **system,
                              const char **user, const char **reply, char *why, size_t cap);
// Every line of a JSONL file as a record of size bytes, each filled by read (given the line's
// number; NULL, or what is wrong) into a malloc'ed array: 0, or -1 with "path:line: what" in err
// (free_all then frees the records read so far). expected: the formats, for the message on an
// empty file. The reader of ./train_sft's and ./train_dpo's data.
typedef const char *(*JsonlRecordFn)(const struct cJSON *j, void *record, long line, char *why, size_t cap);
int jsonl_read_all(const char *path, size_t size, JsonlRecordFn read, void (*free_all)(void *, long), const char *expected,
                   void **out, long *n, char *err, size_t cap);

// ----------------------------------------------------------------------------
// text -> tokens

typedef struct {
    const Tokenizer *tok;
    int chat;            // 1: prompts through the chat template (tokenizer_chat_prompt), 0: raw text
    const char *system;  // chat: the system message of examples that have none, or NULL
    int eos;             // the id every completion ends with (sft_eos_id)
    int max_length;      // tokens kept at most, prompt + completion (0: no limit); TRL's truncation:
                         // the start is kept, so a long completion loses its end and its EOS
} SftFormat;

typedef struct {
    int *ids;   // (n) the prompt's tokens, then the completion's and EOS (unless truncated)
    int n;      // tokens in all
    int plen;   // of which the prompt's
    long line;  // where it came from (the JSONL line; 0: made in memory)
} SftExample;

// The tokens of one example (into out); returns how many max_length cut off (0: none).
// Dies when the prompt encodes to no tokens.
int sft_encode(const SftFormat *f, const char *system, const char *prompt, const char *completion, SftExample *out);
void sft_example_free(SftExample *e);
// The id that ends a completion: with chat, the format's end of turn (<|im_end|> for ChatML,
// <|eot_id|> for Llama 3), what the template writes after an assistant reply; without, the
// tokenizer's eos_token (tokenizer_config.json's, else the first of tokenizer_eos_ids), as TRL
// appends it. -1 when there is none.
int sft_eos_id(const Tokenizer *tok, int chat);

// ----------------------------------------------------------------------------
// the data: every example tokenized, and the order they are trained in

typedef struct {
    SftText *text;          // (n_text) as read
    long n_text;
    SftExample *ex;         // (n) tokenized, in file order; examples with no completion token left out
    long n;
    long truncated;         // examples max_length cut (kept, shorter)
    long dropped;           // examples whose prompt alone fills max_length: no completion token to
    long first_dropped;     // train on, so left out (the first one's line)
    long completion_tokens; // in all n examples (EOS included): the loss's tokens of an epoch
    long max_tokens;        // the longest example
    uint32_t *perm;         // (n) the order of epoch perm_epoch
    long perm_epoch;
    uint64_t seed;
} SftData;

// Read path (sft_read_jsonl) and tokenize every example with f. A conversation with no chat
// template to render it is an error naming its line. Returns 0, or -1 with the message in err.
int sft_data_load(SftData *d, const char *path, const SftFormat *f, uint64_t seed, char *err, size_t cap);
void sft_data_free(SftData *d);
// The example at position pos of the data stream: the stream is the epochs back to back, each
// epoch all n examples in its own seeded shuffle (epoch pos / n); a batch may span two epochs.
// The same pos gives the same example on every run, so a checkpoint stores pos and nothing more.
const SftExample *sft_data_at(SftData *d, long pos);
// the index behind position pos of such a stream of n items: each epoch (pos / n) its own seeded
// shuffle, made into perm (n) when *perm_epoch is not that epoch (-1: none yet)
long data_order_at(uint32_t *perm, long n, uint64_t seed, long *perm_epoch, long pos);

// ----------------------------------------------------------------------------
// a batch and its loss

typedef struct {
    int B, T;   // sequences, and tokens each (the longest; the others right-padded)
    int *ids;   // (B, T) the tokens; padding 0 (causal attention: a pad never reaches an earlier position)
    int *tg;    // (B, T) the token position t predicts when that is a completion token (t + 1 >= plen), else -1
    long ntok;  // completion tokens: targets >= 0
} SftBatch;

void sft_batch_make(SftBatch *b, const SftExample *const *ex, int B);
void sft_batch_free(SftBatch *b);
// Forward and logprobs of b on m with the adapter lo (or NULL); returns -(sum of the completion tokens' logprobs) / norm
// (norm: the completion tokens the step's loss is the mean over). backward != 0: then
// model_backward of that loss, accumulating into m's gradients (m->grads and/or lo's).
double sft_loss(Model *m, LoRA *lo, const SftBatch *b, double norm, int backward);

// ----------------------------------------------------------------------------
// training

typedef struct {
    Model *m;
    FullTrainer *full;     // full-weight training, or NULL; exactly one of full and lora
    LoRA *lora;            // LoRA training: the adapter the step's forwards apply (m->lora too), or NULL
    int micro_batch;       // sequences per forward/backward
    float beta1, beta2, eps, weight_decay;  // AdamW
    double max_grad_norm;  // clip the global gradient norm to this (0: off)
    Dist *dist;            // data parallel: the ranks whose examples make the step together (each calls
                           // sft_step with its share), or NULL: this process alone. Full: full's dist.
} SftTrainer;

typedef struct {
    double loss;       // mean NLL per completion token over the step's examples
    double grad_norm;  // before clipping
    long tokens;       // completion tokens (what the loss is the mean over)
    long seq_tokens;   // tokens of the examples, prompt and completion (no padding)
    long pad_tokens;   // tokens the forwards ran on, padding included
} SftStats;

// One optimizer step on ex (n): micro-batches of micro_batch examples in order (each padded to
// its longest), gradients accumulated, the loss the mean over the completion tokens of all n;
// the gradient norm clipped, AdamW at learning rate lr. Dies on a NaN/inf gradient norm.
// Data parallel (t->dist): ex are this rank's share; the loss is the mean over the completion
// tokens of every rank's examples (their count summed first, so that the ranks' gradients add up to
// the whole step's), the gradients summed over the ranks (LoRA: all-reduced, every rank steps its
// copy; full: reduce-scattered, each rank steps its block, full_finetune.h), the stats the whole step's.
SftStats sft_step(SftTrainer *t, const SftExample *const *ex, int n, double lr);
// The loss of held-out examples ex (n, this rank's share with t->dist): the mean NLL per completion token
// over every rank's examples, micro_batch at a time, forward only (nothing learned; the same products as a
// step's forward, FP8 ones included). *tokens (or NULL): the completion tokens it is the mean over.
double sft_eval(SftTrainer *t, const SftExample *const *ex, int n, long *tokens);
// the two ends of an optimizer step, for a trainer with a loss of its own (train/dpo_train.h): the
// gradients zeroed; then, once the backward passes have accumulated them, summed over the ranks,
// their norm (returned, before clipping) clipped and AdamW at lr. Dies on a NaN/inf norm, naming who.
void sft_zero_grads(SftTrainer *t);
double sft_apply(SftTrainer *t, double lr, const char *who);

#ifdef __cplusplus
}
#endif
#endif  // SFT_H
