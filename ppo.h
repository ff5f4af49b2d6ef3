// ppo.h: the host side of PPO's math, as TRL's PPOTrainer computes it (trl/experimental/ppo,
// read at trl f2cd577): per-token rewards (the KL penalty on every token, the score added at one),
// masked whitening, generalized advantage estimation (GAE), and the clipped policy and value losses
// with their gradients. Plain C in double precision over (B, T) row-major arrays of completion
// tokens; it knows nothing of models or GPUs (as grpo.h and dpo.h). The trainer that samples the
// completions, runs the value model and back-propagates these gradients: train/ppo_train.h.
//   defines: PpoConfig, ppo_config_default, ppo_token_rewards, ppo_masked_whiten, ppo_gae, ppo_loss
//            (ppo_policy_loss + ppo_value_loss), PpoLossStats
//
// TRL's formulas, line for line (mask: 1 where a token counts; the trainer chooses the masks, as
// TRL's padding_mask and padding_mask_p1 do):
//   kl_t            = logp_t - ref_logp_t (k1), or e^r - 1 - r with r = ref_logp_t - logp_t (k3)
//   reward_t        = -kl_coef kl_t, and + score at the sequence's end index
//   whiten(x, m)    = (x - mean_m(x)) / sqrt(var_m(x) + 1e-8), var Bessel-corrected (masked_whiten;
//                     shift_mean false adds mean_m(x) back): whiten_rewards applies it to the rewards
//                     (no shift) and zeroes the masked-out ones; the advantages are always whitened
//   GAE             delta_t = reward_t + gamma v_{t+1} - v_t (v_T = 0), A_t = delta_t + gamma lam A_{t+1},
//                   returns_t = A_t + v_t (before the advantages are whitened)
//   policy loss     ratio_t = exp(logp_t - old_logp_t);
//                   pg = mean_mask(max(-A_t ratio_t, -A_t clamp(ratio_t, 1 - cliprange, 1 + cliprange)))
//   value loss      vclip_t = clamp(vpred_t, v_t - cliprange_value, v_t + cliprange_value);
//                   vf = 0.5 mean_vmask(max((vpred_t - R_t)^2, (vclip_t - R_t)^2))
//   loss            = pg + vf_coef vf
#ifndef PPO_H
#define PPO_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PPO_KL_K1 = 0, PPO_KL_K3 } PpoKlEstimator;

// TRL's PPOConfig names and defaults (ppo_config_default)
typedef struct {
    int num_ppo_epochs;        // 4: passes over a batch of rollouts
    double cliprange;          // 0.2: the policy ratio's clip
    double cliprange_value;    // 0.2: the value prediction's clip around the rollout's values
    double vf_coef;            // 0.1: the value loss's weight
    double gamma;              // 1.0: discount
    double lam;                // 0.95: GAE's lambda
    double kl_coef;            // 0.05: the KL penalty per token
    PpoKlEstimator kl_estimator;  // k1
    int whiten_rewards;        // 0
    int num_mini_batches;      // 1: optimizer steps per epoch, each on its share of the batch (shuffled)
    double missing_eos_penalty;  // 0 (TRL's None): subtracted from the score of a completion without EOS
} PpoConfig;

PpoConfig ppo_config_default(void);
// one token's KL estimate from the policy's and the reference's log-probs (k1 or k3, above)
double ppo_kl(const PpoConfig *c, double logp, double ref_logp);

// rewards (B, T) = -kl_coef kl per token, then + score[b] at end[b] (a token index < T). logp,
// ref_logp (B, T): the rollout policy's and the reference's log-probs of the sampled tokens.
void ppo_token_rewards(const PpoConfig *c, int B, int T, const double *logp, const double *ref_logp,
                       const double *score, const int *end, double *rewards);
// x (n) whitened in place over the entries where mask is 1 (TRL's masked_whiten; at least two)
void ppo_masked_whiten(double *x, const unsigned char *mask, int n, int shift_mean);
// advantages, returns (B, T) from rewards and values (B, T) by GAE; each row's values past its end
// must be 0, as TRL fills them
void ppo_gae(const PpoConfig *c, int B, int T, const double *rewards, const double *values, double *advantages,
             double *returns);

typedef struct {
    double pg_loss, vf_loss, loss;
    double pg_clipfrac, vf_clipfrac;  // the masked share of tokens whose clipped term was the larger
    double approxkl;                  // 0.5 mean (logp - old_logp)^2 over every token, as TRL's
    double ratio_mean;                // mean exp(logp - old_logp) over every token (TRL's val/ratio)
} PpoLossStats;

// The loss of one micro-batch (B, T) and its gradients: d_logp (B, T) = d loss / d logp_t, d_vpred
// (B, T) = d loss / d vpred_t (zero where the masks are). mask: the policy tokens, vmask: the value
// tokens (TRL: padding_mask, padding_mask_p1 negated). At a max or a clamp's edge the derivative is
// torch's: the first argument's side for max on ties, the clamped value's zero outside the range.
double ppo_loss(const PpoConfig *c, int B, int T, const double *logp, const double *old_logp, const double *adv,
                const unsigned char *mask, const double *vpred, const double *values, const double *returns,
                const unsigned char *vmask, double *d_logp, double *d_vpred, PpoLossStats *st);

// ppo_loss's two halves, over n tokens, for a trainer whose policy and value are two forwards: the
// policy's pg_loss (returned) with d_logp = d pg_loss / d logp and st's pg_loss, pg_clipfrac, approxkl,
// ratio_mean; the value's vf_loss (returned, before vf_coef) with d_vpred = d (vf_coef vf_loss) / d vpred
// and st's vf_loss, vf_clipfrac. Each dies when its mask is empty.
double ppo_policy_loss(const PpoConfig *c, size_t n, const double *logp, const double *old_logp, const double *adv,
                       const unsigned char *mask, double *d_logp, PpoLossStats *st);
double ppo_value_loss(const PpoConfig *c, size_t n, const double *vpred, const double *values, const double *returns,
                      const unsigned char *vmask, double *d_vpred, PpoLossStats *st);

#ifdef __cplusplus
}
#endif
#endif  // PPO_H
