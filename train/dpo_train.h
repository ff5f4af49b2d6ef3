// dpo_train.h: DPO training on preference pairs (TRL's DPOTrainer), every weight or a LoRA adapter
// on the frozen (FP8) weights; the losses themselves are dpo.h's.
//   defines: PrefText, pref_read_jsonl (the user's JSONL), PrefFormat, PrefPair, pref_encode
//            (text -> tokens, TRL's truncations), PrefData, pref_data_load, pref_data_from_pairs,
//            pref_data_at (the pairs and their order), pref_logps, pref_precompute_ref (log-probs of
//            pairs), DpoTrainer, DpoStepStats, dpo_step (one optimizer step), dpo_evaluate (held-out pairs)
// Used by ./train_dpo (train_dpo.c). Built on train/sft.h: a pair is two SftExamples
// (the prompt then the chosen completion, the prompt then the rejected one), batched, encoded and
// stepped by sft.h's functions.
//
// The data, TRL's preference formats, one pair a line:
//   {"prompt": "17+25=", "chosen": "42", "rejected": "32"}                         standard
//   {"prompt": [{"role": "user", "content": ...}], (a system message may come first)
//    "chosen": [{"role": "assistant", "content": ...}], "rejected": [{"role": "assistant", ...}]}  conversational
//   {"chosen": [system?, user, assistant], "rejected": [the same system and user, assistant]}   implicit prompt
// Tokens as ./train_sft's (sft_encode: the prompt through the chat template when there is one, the
// completion after it, ended by EOS; through the template, also what it writes after the end of
// turn, ChatML's and Gemma's "\n", as TRL 1.16), then the truncations in TRL's order: the prompt's
// last max_prompt_length tokens, each completion's first max_completion_length (EOS included; these
// two are TRL 0.28's, 1.16 has neither: 0 leaves them off), then the whole sequence to max_length,
// keeping its start (truncation_mode keep_start, TRL 1.16's default) or its end (keep_end, 0.28's
// default: the prompt's start goes first). A pair where either side has no completion token left to
// score is left out (counted).
//
// The reference: the same model with no adapter (the forward given NULL: no second copy of the
// weights), run on each micro-batch before the policy's forward; or log-probabilities computed once
// before training (pref_precompute_ref: TRL's precompute_ref_log_probs, and what training every weight
// uses, since it keeps no frozen copy of the weights it changes).
#ifndef DPO_TRAIN_H
#define DPO_TRAIN_H

#include "dpo.h"
#include "train/sft.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *system;        // the system message, or NULL
    char *prompt;        // the prompt, or the user turn
    char *chosen, *rejected;
    int conversational;  // given as chat messages (needs the chat template)
    long line;
} PrefText;

// Read a JSONL file of preference pairs (the formats above). 0 and *out (n), or -1 with
// "data.jsonl:3: <what is wrong and what is supported>" in err.
int pref_read_jsonl(const char *path, PrefText **out, long *n, char *err, size_t cap);
void pref_texts_free(PrefText *t, long n);

typedef struct {
    SftFormat f;                // tokenizer, chat, system, eos; f.max_length: max_length (0: no limit)
    int max_prompt_length;      // the prompt's last tokens kept (0: all)
    int max_completion_length;  // each completion's first tokens kept, EOS included (0: all; TRL's None)
    int keep_end;               // 1: truncation_mode keep_end, 0: keep_start (TRL 1.16's default)
} PrefFormat;

typedef struct {
    SftExample chosen, rejected;  // each: the prompt's tokens, then the completion's (plen: the prompt's)
    long line;                    // its line in the file (0: made in memory)
} PrefPair;

// The tokens of one pair into out; returns 1 when a truncation cut something, else 0.
int pref_encode(const PrefFormat *f, const char *system, const char *prompt, const char *chosen, const char *rejected,
                PrefPair *out);
void pref_pair_free(PrefPair *p);

typedef struct {
    PrefText *text;         // (n_text) as read (NULL for pairs made in memory)
    long n_text;
    PrefPair *pairs;        // (n) tokenized, file order; pairs with nothing to score left out
    long n;
    long truncated;         // pairs a truncation cut (kept)
    long dropped, first_dropped;  // pairs left out (a side with no completion token left), the first one's line
    long max_tokens;        // the longest sequence
    uint32_t *perm;         // (n) the order of epoch perm_epoch
    long perm_epoch;
    uint64_t seed;
    double *ref_chosen, *ref_rejected;  // (n) the reference's summed log-probs, once precomputed; else NULL
} PrefData;

// Read path and tokenize every pair with f. A conversation with no chat template is an error naming
// its line. 0, or -1 with the message in err.
int pref_data_load(PrefData *d, const char *path, const PrefFormat *f, uint64_t seed, char *err, size_t cap);
// pairs made in memory (n of them, malloc'ed; d owns them now)
void pref_data_from_pairs(PrefData *d, PrefPair *pairs, long n, uint64_t seed);
void pref_data_free(PrefData *d);
// the index of the pair at position pos of the data stream (epochs back to back, each its own
// seeded shuffle: sft.h's data_order_at)
long pref_data_at(PrefData *d, long pos);

// Forward only, on m with the adapter lo (NULL: none, the reference): the summed log-probs of k pairs'
// completion tokens, chosen[i] and rejected[i], and how many tokens each sum has (tc, tr; may be NULL).
void pref_logps(Model *m, LoRA *lo, const PrefPair *const *p, int k, double *chosen, double *rejected, int *tc, int *tr);
// the reference's log-probs of every pair into d->ref_* (micro_batch pairs a forward): m with no adapter
// (training every weight: call before training)
void pref_precompute_ref(PrefData *d, Model *m, int micro_batch);

typedef struct {
    SftTrainer *t;  // the model, what is trained (exactly one of full, lora), AdamW, clipping; micro_batch: pairs
    DpoConfig cfg;
} DpoTrainer;

typedef struct {
    DpoStats dpo;      // the loss and the sums behind TRL's metrics (dpo_metrics)
    double grad_norm;  // before clipping
    long seq_tokens;   // tokens of the step's sequences, prompt and completion, both sides (no padding)
} DpoStepStats;

// One optimizer step over the pairs idx (n) of d: micro-batches of t->micro_batch pairs (2 x that
// sequences a forward, chosen then rejected), the reference's log-probs from d->ref_* when
// precomputed, else from the adapter-off forward of each micro-batch (needs a LoRA adapter); the
// loss the mean over the n pairs, gradients accumulated, then sft_apply. Dies on a NaN loss.
DpoStepStats dpo_step(DpoTrainer *t, PrefData *d, const long *idx, int n, double lr);

// TRL's evaluation of every pair of d (DPOTrainer.evaluate): forward only, in file order, batch
// pairs a batch (per_device_eval_batch_size), the reference as dpo_step's (d->ref_* when
// precomputed, else the adapter off); the weights and gradients untouched. The metrics with TRL's
// evaluation means (dpo.h, DpoEvalStats): "eval_" + their names.
DpoMetrics dpo_evaluate(DpoTrainer *t, PrefData *d, int batch);

#ifdef __cplusplus
}
#endif
#endif  // DPO_TRAIN_H
