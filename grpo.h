// grpo.h: the host side of GRPO. Rewards -> group advantages; per-token
// log-probabilities -> the loss and its gradient dL/dlogp, which the model then
// back-propagates (the learning-rate schedule and clipping: train/optim.h).
// Everything here is plain C on the host in double precision; it knows nothing of
// models, tokens or GPUs.
//
// Semantics and option names follow TRL's GRPOConfig / GRPOTrainer (the 0.2x line:
// v0.25 and later, where vllm_importance_sampling_mode exists and loss_type
// defaults to "dapo"). Where this file departs from TRL it says so, next to the
// code, in grpo.c.
//
// Use (one optimizer step):
//   GrpoConfig cfg = grpo_config_default();           // then grpo_config_set(...) per option
//   grpo_advantages(&cfg, B, R, rewards, weights, adv, &rm);   // rewards of the whole (gathered) batch
//   GrpoNorm norm = grpo_prepare(&cfg, B, T, mask, truncated); // normalizers from the whole batch
//   GrpoStats st; grpo_stats_init(&st);
//   for each micro-batch of whole sequences [b0, b0+nb):
//       loss += grpo_loss(&cfg, &norm, &in_for_rows_b0, nb, dlogp_rows, &st);  // backprop dlogp
//   GrpoMetrics m = grpo_metrics(&st);
// The sum of the micro-batch losses is the full-batch loss and each micro-batch's
// dL/dlogp is exactly the full batch's rows (tested), whatever the split.
#ifndef GRPO_H
#define GRPO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GRPO_MAX_REWARDS 8

typedef enum { LOSS_GRPO = 0, LOSS_BNPO, LOSS_DR_GRPO, LOSS_DAPO } GrpoLossType;
typedef enum { SCALE_GROUP = 0, SCALE_BATCH, SCALE_NONE } GrpoScaleRewards;
typedef enum { ADV_GRPO = 0, ADV_RLOO } GrpoAdvantageEstimator;
typedef enum { IS_LEVEL_TOKEN = 0, IS_LEVEL_SEQUENCE } GrpoImportanceLevel;  // SEQUENCE = GSPO
typedef enum { VIS_TOKEN_TRUNCATE = 0, VIS_TOKEN_MASK, VIS_SEQUENCE_TRUNCATE, VIS_SEQUENCE_MASK } GrpoVllmISMode;

// TRL's names and TRL's defaults (grpo_config_default()).
typedef struct {
    int num_generations;             // 8: completions per prompt; a group = this many consecutive sequences
    int num_iterations;              // 1: updates per generation batch (mu); informational here, the caller
                                     //    passes old_logp = NULL when it is 1 (TRL: logp.detach())
    int max_completion_length;       // 256: dr_grpo's constant normalizer
    double beta;                     // 0.0: KL coefficient (k3 estimator against the reference = LoRA off)
    double epsilon;                  // 0.2: lower clip, ratio >= 1 - epsilon
    double epsilon_high;             // < 0 (TRL's None): same as epsilon; DAPO recommends 0.28
    GrpoLossType loss_type;          // dapo
    GrpoScaleRewards scale_rewards;  // group
    // grpo: a completion's reward less its group's mean. rloo: less the mean of the group's OTHER
    // completions (REINFORCE leave-one-out, TRL's RLOOTrainer; with scale_rewards none its advantages),
    // which is the group-mean advantage times G / (G - 1). Not a TRL GRPOConfig option (verl's name).
    GrpoAdvantageEstimator advantage_estimator;
    GrpoImportanceLevel importance_sampling_level;  // token
    int mask_truncated_completions;  // 0: 1 = truncated completions get no loss (mask zeroed)
    // truncated importance sampling between the rollout engine's logprobs (sampling_logp)
    // and the trainer's (old_logp): TRL's vllm_importance_sampling_* options
    int vllm_importance_sampling_correction;        // 1 (applies when the caller passes sampling_logp)
    GrpoVllmISMode vllm_importance_sampling_mode;   // sequence_mask
    double vllm_importance_sampling_cap;            // 3.0
    // reward_weights: 0 given = each reward function's own default weight
    // (see grpo_resolve_reward_weights); TRL's None means all 1.0
    int num_reward_weights;
    double reward_weights[GRPO_MAX_REWARDS];
} GrpoConfig;

GrpoConfig grpo_config_default(void);
// the epsilon_high in effect (epsilon when unset)
double grpo_epsilon_high(const GrpoConfig *cfg);

// Sets one option from strings, by TRL's name (dashes accepted for underscores:
// "loss-type" == "loss_type"; booleans: 1/0/true/false/yes/no; reward_weights:
// "1.0,0.5"). Returns 0, or -1 with a one-line message in err, e.g.
// "unknown loss_type 'x': use grpo, bnpo, dr_grpo or dapo".
// Returns 1 (err untouched) when key is not a GRPO option, so a command-line
// parser can try its other tables.
int grpo_config_set(GrpoConfig *cfg, const char *key, const char *value, char *err, size_t errcap);
// The inverse: the option's value as grpo_config_set reads it back ("dapo", "0.2", "none",
// "true", "1,0.2"), into buf. Returns 0, or 1 when key is not a GRPO option. --help shows
// grpo_config_default()'s values through it, so each default is written once (grpo.c).
int grpo_config_get(const GrpoConfig *cfg, const char *key, char *buf, size_t cap);
// Cross-option checks (num_generations >= 2, epsilon in [0,1), cap >= 1, ...):
// 0, or -1 with a one-line message.
int grpo_config_check(const GrpoConfig *cfg, char *err, size_t errcap);
// one line per option, "name = value", for logs
void grpo_config_print(const GrpoConfig *cfg, FILE *f);
// names of the enum values (for logs and errors)
const char *grpo_loss_type_name(GrpoLossType t);
const char *grpo_scale_rewards_name(GrpoScaleRewards s);
const char *grpo_advantage_estimator_name(GrpoAdvantageEstimator a);
const char *grpo_is_level_name(GrpoImportanceLevel l);
const char *grpo_vllm_is_mode_name(GrpoVllmISMode m);

// Weights for R reward functions: cfg's reward_weights when given (then exactly R
// of them, else -1 and "reward_weights has 3 values but there are 2 reward
// functions (correctness, format)"), else the functions' defaults.
int grpo_resolve_reward_weights(const GrpoConfig *cfg, int R, const double *defaults,
                                const char *const *names, double *out, char *err, size_t errcap);

// ----------------------------------------------------------------------------
// advantages

typedef struct {
    double reward;                // mean of the weighted rewards ("reward")
    double reward_std;            // mean over sequences of the std used for scaling: the mean of the
                                  // per-group stds for group/none, the batch std for batch ("reward_std")
    double frac_reward_zero_std;  // fraction of sequences whose std is ~0 (isclose(std, 0)): groups with
                                  // no learning signal ("frac_reward_zero_std")
    int R;
    double func_mean[GRPO_MAX_REWARDS];  // "rewards/<name>/mean": nanmean over the batch
    double func_std[GRPO_MAX_REWARDS];   // "rewards/<name>/std": nanstd (Bessel) over the batch
} GrpoRewardMetrics;

// rewards (B, R) row-major, one row per sequence; NaN = this function does not
// apply to this sequence (TRL's None: left out of the weighted sum and the
// function's metrics). weights (R). Groups are num_generations consecutive
// sequences (B must be a multiple). Writes advantages (B); m may be NULL.
// std is torch.std's (Bessel-corrected); scaling divides by (std + 1e-4).
void grpo_advantages(const GrpoConfig *cfg, int B, int R, const double *rewards, const double *weights,
                     double *advantages, GrpoRewardMetrics *m);

// ----------------------------------------------------------------------------
// loss and dL/dlogp

// Whole-batch normalizers: computed once per optimizer step from the whole
// batch's masks, then shared by every micro-batch call.
typedef struct {
    int B, T;                  // the whole batch: B sequences of T completion positions
    double active_tokens;      // tokens that count (mask, after mask_truncated_completions): bnpo
    double num_items_in_batch; // completion tokens before mask_truncated_completions (TRL counts the
                               // generated tokens): dapo. For data parallel over P ranks that average
                               // gradients, set it to (global count) / P, as TRL does.
} GrpoNorm;

// mask (B, T): 1 for completion tokens (up to and including EOS), 0 for padding.
// truncated (B): 1 when the completion hit max_completion_length without EOS; may be NULL.
GrpoNorm grpo_prepare(const GrpoConfig *cfg, int B, int T, const uint8_t *mask, const uint8_t *truncated);

// Inputs for nb consecutive whole sequences; every (nb, T) array starts at the
// micro-batch's first row. Values at mask == 0 are never read into arithmetic
// (they may be -inf or NaN).
typedef struct {
    const double *logp;           // (nb, T) current policy log-probabilities (the ones dL/dlogp is for)
    const double *old_logp;       // (nb, T) policy at rollout time, or NULL: logp.detach() (num_iterations == 1;
                                  //   then logp's values also stand in for old_logp in the IS weight)
    const double *ref_logp;       // (nb, T) reference (LoRA off), or NULL; required when beta != 0
    const double *sampling_logp;  // (nb, T) rollout engine's logprobs, or NULL: no IS correction
    const double *advantages;     // (nb)
    const uint8_t *mask;          // (nb, T) as given to grpo_prepare
    const uint8_t *truncated;     // (nb) or NULL
} GrpoInputs;

// Accumulators for the loss metrics over the micro-batches of one step.
typedef struct {
    double tokens;                         // active tokens seen
    double kl_sum;                         // sum of k3 over active tokens
    int has_kl;
    double clip_n;                         // clip-metric denominator: tokens (token level) or sequences (GSPO)
    double clip_low, clip_high, clip_region;
    int has_is;                            // IS correction applied
    double delta_sum, delta_max, delta_n;  // |old_logp - sampling_logp| over active tokens
    double is_min, is_max, is_sum, is_n;   // IS weight over active tokens (token modes) or sequences
    double loss;                           // sum of the returned losses
} GrpoStats;
void grpo_stats_init(GrpoStats *st);

// The loss of these nb sequences (their share of the full-batch loss) and
// dlogp (nb, T) = dL/dlogp (0 where mask == 0). st accumulates metrics (may be NULL).
// Dies with a clear message on a missing input (ref_logp with beta != 0).
double grpo_loss(const GrpoConfig *cfg, const GrpoNorm *norm, const GrpoInputs *in, int nb, double *dlogp,
                 GrpoStats *st);

typedef struct {
    double loss;
    double kl;                    // "kl": mean k3 over active tokens (NaN when no ref_logp)
    double clip_low_mean;         // "clip_ratio/low_mean": ratio < 1-eps with A < 0
    double clip_high_mean;        // "clip_ratio/high_mean": ratio > 1+eps_high with A > 0
    double clip_region_mean;      // "clip_ratio/region_mean": either
    // "sampling/..." (NaN when no IS correction)
    double sampling_logp_diff_mean, sampling_logp_diff_max;  // |old_logp - sampling_logp|
    double is_ratio_min, is_ratio_mean, is_ratio_max;        // the IS weight (after truncate/mask)
} GrpoMetrics;
GrpoMetrics grpo_metrics(const GrpoStats *st);

#ifdef __cplusplus
}
#endif
#endif  // GRPO_H
