// ppo_train.h: PPO (TRL's PPOTrainer) on the shared FP8 base, ./train_grpo --algo ppo's update. The
// formulas (KL rewards, whitening, GAE, the clipped losses) are ppo.h's; here are the value model they
// need and the step that drives them over a batch of rollouts.
//   defines: ValueModel (value_init, value_forward, value_backward, ... its optimizer and state),
//            PpoBatch, PpoStepStats, PpoTrainer, ppo_init, ppo_step, ppo_free
//
// The value model. TRL's is a second model (AutoModelForSequenceClassification) whose `score` head, a
// Linear(hidden, 1, bias=False), reads the final normed hidden state at every position. Here it is the
// same frozen (FP8) base as the policy's, with a LoRA adapter of its own (the policy's r, alpha and
// targets) and that head, so that:
//   - no second copy of the base exists (the one FP8 copy serves the rollouts, the policy, the
//     reference (no adapter) and the value);
//   - the policy and the value share no trainable weight, so the value loss never moves the policy
//     (a shared adapter with a value head is cheaper, one forward instead of two, but its value
//     gradient flows into the policy's weights, scaled by vf_coef: a coupling TRL's separate models
//     do not have, and which this program's GRPO comparison would then carry too).
// Each forward and backward is given its adapter (the policy's, the value's, or none for the reference),
// each pass on its own activations. The head is two backend ops already there: logits_forward
// with a (1, C) dense "vocabulary" (fp32 values) and linear_backward for dh and d score; the gradient
// then enters the model through model_backward_hidden. Both backends, one code path.
// The head starts at zero (values 0 at the first step, learned from the returns): TRL's starts from a
// reward model's; this program has none.
//
// One PPO step (ppo_step), TRL's train() loop on the (S, Tc) completion tokens of one rollout:
//   1. per micro-batch: the reference's log-probs (no adapter), the policy's (the rollout's
//      policy as the trainer computes it: TRL takes the sampler's, but the rollout engine's decode differs
//      from the trainer's forward a little, and the ratio must start at exactly 1), the value model's
//      values at each completion position (the position that predicts the token);
//   2. per-token rewards (-kl_coef KL per token, the task's score at the last completion token, less
//      missing_eos_penalty when the completion has no EOS), whiten_rewards, GAE, returns, whitened
//      advantages (ppo.h);
//   3. num_ppo_epochs x num_mini_batches (a seeded shuffle per epoch) x micro-batches: the value's
//      forward, its clipped loss and backward (value adapter + head), the policy's forward, its clipped
//      loss and backward (policy adapter); after each mini-batch each model's gradient is clipped to
//      max_grad_norm on its own (TRL clips neither: --max_grad_norm 0 is its behaviour) and AdamW steps
//      both. The loss of a mini-batch is the masked mean over its tokens whatever the micro-batches
//      (memory's choice): each micro-batch's ppo_policy_loss / ppo_value_loss gradient is scaled by its
//      share of the mini-batch's tokens (TRL averages micro-batch means, which differs only when they hold
//      different numbers of tokens).
// TRL's departures kept: none of its masks' "+1" (padding_mask_p1: the value counted one token past the
// end, and the score placed there when there is room); here the score is at the last completion token
// and the value mask is the policy's, the terminal value after it 0.
#ifndef PPO_TRAIN_H
#define PPO_TRAIN_H

#include "lora.h"
#include "model.h"
#include "ppo.h"
#include "train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    LoRA *lo;          // the value adapter (the policy's settings, its own weights)
    const Backend *be;
    int C;
    void *w, *g;       // (C) hp: score.weight (its one row) and its gradient
    void *am, *av;     // (C) hp: AdamW's moments
    void *w_act;       // (C) act: the copy logits_forward reads (adamw writes it with each step)
    QWeight head;      // (1, C) dense: w_act as a one-row "vocabulary"
    void *vals, *dv;   // (cap) hp values, (cap) act their gradient: per-forward scratch
    int cap, step;     // scratch rows; AdamW steps taken
} ValueModel;

// the value adapter as lora_create makes one (r, alpha, targets, bf16 as the policy's), the head zero
void value_init(ValueModel *v, const Model *m, const LoRA *policy, uint64_t seed);
void value_free(ValueModel *v);
// values (B*T, host fp64) at every position of ids (B, T), the base with the value's adapter; leaves
// the value's activations in m for value_backward
void value_forward(ValueModel *v, Model *m, const int *ids, int B, int T, double *values);
// backward of sum_n dvalues[n] values[n] (the last value_forward): the head's and the value adapter's
// gradients accumulate
void value_backward(ValueModel *v, Model *m, const double *dvalues);
void value_zero_grads(ValueModel *v);
double value_grad_norm(const ValueModel *v);  // over the adapter and the head
void value_scale_grads(ValueModel *v, float s);
void value_adamw_step(ValueModel *v, float lr, float beta1, float beta2, float eps, float weight_decay);
size_t value_state_bytes(const ValueModel *v);  // parameters, gradients, AdamW state
// the adapter's and the head's parameters and AdamW state (value_model.safetensors), for --resume;
// the load dies naming the file when it does not fit the model
void value_save_state(const ValueModel *v, const char *path);
void value_load_state(ValueModel *v, const char *path);

// One rollout batch as the update sees it: S sequences of prompt + completion right-padded to T
typedef struct {
    int S, T, Tc;          // sequences, batch width, max_completion_length
    const int *ids, *tg;   // (S, T) tokens; the token each position predicts (-1: none), as model_logprobs takes
    const int *start;      // (S) the position that predicts completion token 0 (the prompt's length - 1)
    const int *len;        // (S) completion tokens (>= 1)
    const unsigned char *truncated;  // (S) 1: no EOS (cut at max_completion_length)
    const double *score;   // (S) the task's reward of each completion (the reward functions' weighted sum)
    float inv_temp;        // the logprobs at the sampling temperature
} PpoBatch;

typedef struct {  // one step, TRL's metric names in the comments
    double kl;                // objective/kl: the mean over sequences of the summed per-token KL
    double entropy;           // objective/entropy: the mean over sequences of the summed -logp (rollout policy)
    double non_score_reward;  // objective/non_score_reward: the same of -kl_coef KL
    double rlhf_reward;       // objective/rlhf_reward: non_score_reward + scores
    double scores;            // objective/scores: the mean score (after missing_eos_penalty)
    double approxkl, pg_clipfrac, pg_loss, vf_loss, vf_clipfrac, ratio;  // policy/approxkl_avg, policy/clipfrac_avg,
                              // loss/policy_avg, loss/value_avg, val/clipfrac_avg, val/ratio: means over the updates
    double ratio_var;         // val/ratio_var: the variance of the updates' ratio means (NaN for one update)
    double value_mean;        // the rollout's values, the mean over completion tokens
    double loss;              // the last update's pg_loss + vf_coef vf_loss
    double grad_norm, value_grad_norm, lr;  // the last update's, before clipping
    double t_rollout_passes;  // seconds: the reference, old-policy and value passes
} PpoStepStats;

typedef struct {
    PpoConfig c;
    ValueModel value;
    uint64_t seed;         // of the mini-batches' shuffles
    int S, Tc;
    double *ref, *old, *values, *rewards, *adv, *ret;  // (S, Tc) the rollout's
    double *full, *dfull, *cur, *dcur;                 // (S, T) and (S, Tc) scratch
    unsigned char *mask;                               // (S, Tc) 1 on completion tokens
    int *perm, *ids, *tg;                              // (S) the epoch's order; (mb, T) a micro-batch's rows
    int cap_T;
} PpoTrainer;

void ppo_init(PpoTrainer *p, const PpoConfig *c, const Model *m, const LoRA *policy, int S, int Tc, uint64_t seed);
void ppo_free(PpoTrainer *p);
// One PPO step on batch b with the policy's adapter: the passes, the advantages, the
// updates (mb sequences per forward / backward). step: the run's step (1, 2, ...): the shuffles' seed
// and the optimizer steps' place in the schedule ((step - 1) x epochs x mini-batches before it).
void ppo_step(PpoTrainer *p, Model *m, LoRA *policy, const PpoBatch *b, int mb, const OptimConfig *o, long step,
              PpoStepStats *st);
// the scores: the weighted sum of each completion's R rewards (NaN terms skipped, as GRPO's), less
// missing_eos_penalty where truncated (TRL: no EOS)
void ppo_scores(const PpoConfig *c, int S, int R, const double *rewards, const double *weights,
                const unsigned char *truncated, double *score);

#ifdef __cplusplus
}
#endif
#endif  // PPO_TRAIN_H
