// dpo.h: the host side of DPO (Direct Preference Optimization). From each preference pair's
// summed completion log-probabilities, the policy's and the reference's for the chosen and the
// rejected completion, the loss of each loss_type, its gradient with respect to the policy's
// summed log-probabilities (the trainer spreads it over the completion tokens and
// back-propagates it like any dL/dlogp), the implicit rewards and TRL's metrics.
//   defines: DpoLossType, DpoConfig, dpo_config_default, dpo_loss_type_parse, dpo_loss_type_name,
//            dpo_config_check, DpoInputs, DpoStats, dpo_stats_init, dpo_loss, DpoMetrics, dpo_metrics,
//            DpoEvalStats, dpo_eval_add, dpo_eval_metrics (TRL's evaluation over batches)
// Plain C on the host in double precision; it knows nothing of models, tokens or GPUs (as grpo.h).
//
// Semantics and names follow TRL's DPOConfig / DPOTrainer.dpo_loss of the 0.2x line (read at
// v0.28.0, the last with reference_free and max_prompt_length; TRL 0.29 rewrote the trainer):
//   logits          = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
//                     (reference_free: the reference term is 0)
//   sigmoid         = -logsigmoid(beta logits) (1 - ls) - logsigmoid(-beta logits) ls
//   robust          = (-logsigmoid(beta logits) (1 - ls) + logsigmoid(-beta logits) ls) / (1 - 2 ls)
//   exo_pair        = s(z) (logsigmoid(z) - log(1 - e)) + s(-z) (logsigmoid(-z) - log e),
//                     z = beta logits, e = ls, or 1e-3 when ls is 0
//   hinge           = relu(1 - beta logits)
//   ipo             = (logits - 1 / (2 beta))^2, with every log-prob (policy and reference) the
//                     mean over its completion tokens instead of the sum
//   nca_pair        = -logsigmoid(c) - logsigmoid(-c) / 2 - logsigmoid(-r) / 2,
//                     c = beta (chosen_logps - ref_chosen_logps), r = beta (rejected_logps - ref_rejected_logps)
//   sppo_hard       = (a - 1 / (2 beta))^2 + (b + 1 / (2 beta))^2, a, b: the two log-ratios
//   apo_zero        = 1 - s(beta cl) + s(beta rl)       cl, rl: the log-ratios (0 reference
//   apo_down        = s(beta cl) + 1 - s(beta (cl - rl))  when reference_free)
//   discopop        = -logsigmoid(x) (1 - m) + exp(-x) m, x = beta logits (with the reference,
//                     whatever reference_free says, as TRL), m = s(x / discopop_tau)
//   loss            = the mean over the pairs (ls = label_smoothing, s = sigmoid)
//   rewards/chosen  = beta (chosen_logps - ref_chosen_logps), rejected likewise: always against
//                     the reference (reference_free changes the loss only, as TRL's)
// TRL 1.16 (the current release; its trainer rewritten at 0.29) computes the same losses, but for:
// sigmoid reads no label_smoothing (cDPO is gone), exo_pair takes label_smoothing 0 as it is (an
// infinite loss) where 0.28 took 1e-3, and reference_free is gone; the options keep 0.28's.
// nca_pair and sppo_hard ignore reference_free, as TRL's do. Not here: bco_pair (a running mean of
// the rewards across steps: state, not a formula), aot / aot_unpaired (they sort the pairs of a
// batch against each other, so that micro-batching would change the loss), sft / rpo_alpha, and
// the f-divergences other than TRL's default reverse KL.
//
// Use (one optimizer step over P pairs, in micro-batches):
//   DpoConfig cfg = dpo_config_default();   // then the options
//   DpoStats st; dpo_stats_init(&st);
//   for each micro-batch of n pairs:
//       loss += dpo_loss(&cfg, &in, n, P, d_chosen, d_rejected, &st);  // spread d_* over the tokens
//   DpoMetrics mt = dpo_metrics(&st);
// Each pair's loss is divided by P, so the micro-batches' losses and gradients add up to the
// step's (TRL: each micro-batch's mean, divided by the accumulation steps: the same when the
// micro-batches are equal in size).
#ifndef DPO_H
#define DPO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DPO_SIGMOID = 0, DPO_ROBUST, DPO_EXO_PAIR, DPO_HINGE, DPO_IPO, DPO_NCA_PAIR, DPO_SPPO_HARD,
    DPO_APO_ZERO, DPO_APO_DOWN, DPO_DISCOPOP, DPO_N_LOSS_TYPES
} DpoLossType;

// TRL's names and defaults (dpo_config_default)
typedef struct {
    double beta;             // 0.1: how far the policy may move from the reference (IPO's tau)
    DpoLossType loss_type;   // sigmoid
    double label_smoothing;  // 0: the share of pairs assumed mislabeled (sigmoid: cDPO; robust, exo_pair)
    int reference_free;      // 0: 1 = the loss against a uniform reference (the log-ratios' reference term 0)
    double discopop_tau;     // 0.05: discopop's temperature
} DpoConfig;

DpoConfig dpo_config_default(void);
// "sigmoid" -> DPO_SIGMOID ...; -1 for a name that is not one
int dpo_loss_type_parse(const char *name);
const char *dpo_loss_type_name(DpoLossType t);
// the names, "sigmoid|robust|...", for --help and errors
const char *dpo_loss_type_names(void);
// Cross-option checks, as TRL's: beta > 0; label_smoothing in [0, 0.5) for robust (it divides by
// 1 - 2 ls), in [0, 1) for exo_pair; discopop_tau > 0. 0, or -1 with a one-line message in err.
int dpo_config_check(const DpoConfig *cfg, char *err, size_t cap);
// whether loss_type takes the mean log-prob per completion token instead of the sum (ipo)
int dpo_mean_logps(const DpoConfig *cfg);

// n pairs; the log-probs are sums over each completion's tokens (its prompt is never a target)
typedef struct {
    const double *chosen_logps, *rejected_logps;          // (n) the policy's (what the gradient is for)
    const double *ref_chosen_logps, *ref_rejected_logps;  // (n) the reference's (adapter off, or precomputed)
    const int *chosen_tokens, *rejected_tokens;           // (n) completion tokens each (ipo's mean; >= 1)
} DpoInputs;

// sums over the pairs of a step (the metrics are their means)
typedef struct {
    double pairs;
    double loss;                                // sum of the returned losses
    double rewards_chosen, rewards_rejected;    // sums of beta * log-ratio
    double accuracies;                          // pairs whose chosen reward is above the rejected one
    double logps_chosen, logps_rejected;        // sums of the policy's log-probs (ipo: the means)
} DpoStats;
void dpo_stats_init(DpoStats *st);

// The n pairs' share of the step's loss (each pair's loss / norm: norm = the step's pairs) and its
// gradient with respect to the summed log-probs: d_chosen[i] = dL / d chosen_logps[i], d_rejected
// likewise. st accumulates the metrics (may be NULL). Non-finite inputs pass through into the loss,
// so the caller's NaN check sees them.
double dpo_loss(const DpoConfig *cfg, const DpoInputs *in, int n, double norm, double *d_chosen, double *d_rejected,
                DpoStats *st);

// TRL's metric names
typedef struct {
    double loss;
    double rewards_chosen;     // "rewards/chosen": mean of beta (chosen_logps - ref_chosen_logps)
    double rewards_rejected;   // "rewards/rejected"
    double rewards_accuracies; // "rewards/accuracies": share of pairs with rewards/chosen > rewards/rejected
    double rewards_margins;    // "rewards/margins": mean of their difference
    double logps_chosen;       // "logps/chosen": mean of the policy's chosen_logps
    double logps_rejected;     // "logps/rejected"
} DpoMetrics;
DpoMetrics dpo_metrics(const DpoStats *st);

// TRL's evaluation (DPOTrainer.evaluate, transformers' Trainer.evaluation_loop): held-out pairs in
// batches of per_device_eval_batch_size, each batch's loss the mean of its pairs' (dpo_loss with
// norm = its pairs). eval_loss is the mean over every pair (the Trainer repeats each batch's loss
// batch-size times before the mean); every other metric, eval_rewards/accuracies included, the
// mean of the batches' means (DPOTrainer.log averages what each batch appended), which weighs a
// short last batch's pairs more: the same as the pairs' mean when the batch size divides them.
typedef struct {
    double batches, pairs;
    double loss;     // sum over the batches of (batch mean loss x its pairs)
    DpoMetrics sum;  // sums of the batches' metrics (its loss unused)
} DpoEvalStats;
// one batch's sums (dpo_loss's st over that batch alone, norm = its pairs) into e (zeroed to start)
void dpo_eval_add(DpoEvalStats *e, const DpoStats *batch);
// the metrics with TRL's evaluation means (names: "eval_" + DpoMetrics's)
DpoMetrics dpo_eval_metrics(const DpoEvalStats *e);

#ifdef __cplusplus
}
#endif
#endif  // DPO_H
