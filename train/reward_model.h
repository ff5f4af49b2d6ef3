// reward_model.h: a reward model (--reward_model DIR): a Hugging Face LlamaForSequenceClassification,
// Qwen2ForSequenceClassification or Qwen3ForSequenceClassification checkpoint (the transformer and a score
// head (1, C) without bias), frozen, on the policy's backend, in BF16 or FP8 (--reward_model_fp8), scoring
// each prompt + completion as TRL's GRPOTrainer and PPOTrainer do with one:
//   - the text under the reward model's own tokenizer (tokenizer.json and tokenizer_config.json in DIR):
//     a text prompt as prompt + completion; a conversational prompt (system and user messages) through
//     the reward model's chat template with the completion as the assistant's message (TRL's
//     apply_chat_template); tokenized without added special tokens, right-padded;
//   - the score at each row's last token that is not config.json's pad_token_id, as transformers'
//     *ForSequenceClassification takes it: score = score_w . lnf[last] (the final norm's output).
// Its weights are another model's (the policy's memory plan counts them: they are held before the arena's
// budget is set); its activations are a forward's alone (ACTS_FORWARD_ONLY), in micro-batches that fit,
// and live in the policy's time-shared arena (model.h Arena), idle between the rollout and the update.
// Defines RewardModel, reward_model_open / _load / _name / _text / _score / _score_ids /
// _init_random / _report / _close (reward_model.c).
// Depends on model.h, tokenizer.h, tasks/tasks.h (Example).
#ifndef REWARD_MODEL_H
#define REWARD_MODEL_H

#include "model.h"
#include "tasks/tasks.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Model m;            // the checkpoint's transformer (m.w.score: the head), recompute = ACTS_FORWARD_ONLY
    Tokenizer *tok;     // its own tokenizer (NULL: not opened)
    const char *dir;    // the checkpoint directory
    char name[64];      // the reward's name (rewards/<name>/mean): the directory's basename
    char cls[96];       // config.json's architectures[0], for messages
    int pad;            // config.json's pad_token_id: each row's score is at its last other token
    QWeight head;       // (1, C) the score head as the ops read it (dense view of m.w.score)
    void *rows, *idx, *vals;  // scratch for mb_cap rows: (mb, C) act last tokens, (mb) i32 their rows, (mb) hp scores
    int mb_cap;
    size_t peak_acts;   // the most its activations have held (the memory report)
    int max_tokens;     // the longest text scored so far, in its tokens
    double seconds;     // wall time of the last reward_model_score
} RewardModel;

// Check DIR and read its tokenizer (nothing on the device yet). conversational: the data has prompts as
// messages, which need the tokenizer's chat template (ChatML or Llama 3). Dies with one line naming the
// cause and the fix when DIR is not a supported reward model: not a *ForSequenceClassification, another
// architecture than Llama / Qwen2 / Qwen3, num_labels != 1, no score head, no pad_token_id (or a tokenizer
// pad token that differs from it), no tokenizer.json, no usable chat template for conversational data.
void reward_model_open(RewardModel *rm, const char *dir, int conversational);
// then its weights onto be, the linear ones as gran (FP8_OFF: BF16 / the backend's act dtype)
void reward_model_load(RewardModel *rm, const Backend *be, FP8Gran gran);
// the reward's name for DIR: its basename ("models/rm/" -> "rm")
void reward_model_name(const char *dir, char *out, size_t cap);
// The text the reward model reads for ex's prompt and a completion (malloc'ed): see above.
char *reward_model_text(const RewardModel *rm, const Example *ex, const char *completion);
// Scores of S completions (texts) of the examples ex (S / G of them, each repeated for its G completions)
// into out[q * stride]. arena: the policy's model, whose arena the forward passes borrow (no KV cache may
// live in it), or NULL (activations of their own).
void reward_model_score(RewardModel *rm, Model *arena, const Example *ex, int G, int S, char *const *texts, double *out,
                        int stride);
// the same for S texts as its token ids (ids[q], lens[q] of them)
void reward_model_score_ids(RewardModel *rm, Model *arena, int *const *ids, const int *lens, int S, double *out, int stride);
// A reward model of a shape made here with random weights (benchmarks: dev/bench_grpo.c), its linear
// weights as gran; no tokenizer (score ids alone), pad id V - 1
void reward_model_init_random(RewardModel *rm, const Config *shape, const Backend *be, FP8Gran gran, uint64_t seed);
// one line on its memory: weights and the most its activations held
void reward_model_report(const RewardModel *rm, FILE *f);
size_t reward_model_weight_bytes(const RewardModel *rm);
void reward_model_close(RewardModel *rm);

#ifdef __cplusplus
}
#endif
#endif  // REWARD_MODEL_H
