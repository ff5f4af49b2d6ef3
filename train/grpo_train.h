// grpo_train.h: one GRPO step, TRL's GRPOTrainer: rollout -> rewards -> advantages -> batch -> update,
// the loop around grpo.c's advantages and loss, as ppo_train.h's is around ppo.c's.
//   defines: GrpoSetup, GrpoStep, grpo_step_init, grpo_step_free, grpo_train_step and its stages
//            grpo_rollout, grpo_score, grpo_batch, grpo_update, grpo_step_end
//
// One step (grpo_train_step), on this rank's P prompts of the step (DpBatch):
//   1. rollout: the step's problems (the same on every run and after a resume), G completions of each
//      sampled with the adapter (rollout.h), with the seeds one process would give them;
//   2. rewards: each completion's, by the built-in rewards and reward programs (tasks/reward_program.h)
//      and a reward model (train/reward_model.h), every rank's gathered;
//   3. advantages: grpo_advantages over the whole batch, each rank taking its rows; the loss's
//      normalizers (grpo_prepare) summed over the ranks;
//   4. batch: prompt + completion per sequence, right-padded to T (the longest); the micro-batch and
//      recomputation that fit the arena (memory_fit.h);
//   5. update: where the loss needs them, per micro-batch the reference's log-probs (beta != 0: the base
//      with no adapter) and the old policy's (num_iterations > 1: the policy before this step's updates);
//      then num_iterations times: per micro-batch the policy's forward and log-probs, grpo_loss (its
//      value and dL/dlogp), the backward; the gradients summed over the ranks (data_parallel.h), the
//      global norm clipped, one AdamW step (LoRA: the adapter; else every weight, full_finetune.h).
// Every rank calls it on its own rows; its figures are the whole batch's. ./train_grpo --algo ppo runs
// stages 1, 2 and 4 too, then ppo_step (ppo_train.h) in place of the update.
#ifndef GRPO_TRAIN_H
#define GRPO_TRAIN_H

#include "grpo.h"
#include "lora.h"
#include "model.h"
#include "rollout.h"
#include "dist/data_parallel.h"
#include "dist/dist.h"
#include "tasks/reward_program.h"
#include "train/builtin.h"
#include "train/full_finetune.h"
#include "train/optim.h"
#include "train/reward_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {  // what the steps read of the run, the same for all of them
    const GrpoConfig *g;
    const Task *task;          // the problems: step k's are SPLIT_TRAIN's (k - 1) P_all ... k P_all - 1
    const Formatter *fmt;      // a problem's prompt as tokens
    const Tokenizer *tok;      // the completions as text, for the rewards
    RewardSet *rewards;        // the built-in rewards and reward programs
    RewardModel *rmodel;       // a reward model, the rewards' last column (NULL: none)
    const double *weights;     // (rewards->R) a weight per reward
    Dist *dist;                // the ranks (world 1: this process alone)
    DpBatch dp;                // this rank's share of a step's prompts and sequences
    RolloutConfig rc;          // the sampling: G completions a prompt, at most Tc (max_new) tokens, the EOS ids
    uint64_t seed;             // of the sampling: sequence q of step k gets the same seed on every run
    int max_steps;             // the run's (the reward programs are told it)
    float inv_temp;            // log-probs at the sampling temperature, as TRL's trainer computes them
    OptimConfig oc;            // the optimizer; its schedule counts num_iterations steps a GRPO step
    int micro_batch_size;      // the user's (0: chosen to fit the arena each step)
    int recompute;             // 1: the user asked for gradient checkpointing; -1: chosen to fit
    const char *memory_help;   // the options that would shrink what the run holds ("raise --... , "), for
                               // the one-line error when no micro-batch fits
} GrpoSetup;

// One step's data. The (P), (S) and (S, Tc) buffers are made once; the training batch (S, T) every
// step, as T (the longest prompt + completion) changes.
typedef struct {
    GrpoSetup u;
    int G, S, P, Tc, R;      // group size, this rank's sequences (P prompts x G), max completion tokens, rewards
    Example *ex;             // (P) the step's problems
    int **prompts, *plens;   // (P) their prompt token ids, lengths
    uint64_t *seeds;         // (S) a sampling seed per sequence
    Rollout ro;              // (S, Tc) completion ids, lengths, the sampler's logprobs
    double *rewards;         // (S, R) this rank's
    double *rewards_all;     // (S_all, R) every rank's, gathered (the advantages and reward metrics see the whole batch)
    double *adv_all;         // (S_all)
    double *adv;             // (S) advantages
    uint8_t *mask, *trunc;   // (S, Tc) 1 on completion tokens; (S) 1 when cut at Tc
    double *samp;            // (S, Tc) the sampler's logprobs of the completion tokens
    int T;                   // tokens of the longest prompt + completion
    int *ids, *tg;           // (S, T) prompt + completion, right-padded; the token each position predicts (-1: none)
    int *start;              // (S) the position that predicts each completion's first token
    int mb;                  // sequences a forward / backward (grpo_batch's choice; 0: none yet)
    double *logp, *old, *ref, *dlogp;  // (S, Tc) the policy's now, before the step, the reference's; dL/dlogp
    double *lp, *dl;                   // (S, T) a micro-batch's log-probs at every position, their gradient
    int cap_T;                         // the T lp and dl hold
    GrpoRewardMetrics rm;
    GrpoNorm norm;
    GrpoMetrics gm;          // the last iteration's, every rank's
    long gen_tokens;         // completion tokens, every rank's
    int minlen, maxlen, nclip;
    double loss;             // the last iteration's loss, summed over the ranks
    double gnorm, lr;        // the last iteration's, before clipping
    double t_step, t_roll, t_ref, t_train, t_total;  // seconds: start, rollout, reference passes, all training, all
    double t_reward;         // seconds: the rewards (the reward programs' answers included)
    // Several ranks: the time each spends in the first collective after its rollout (the rewards' gather)
    // and in the gradients' all-reduce, as the ranks' mean and their least. The rank that arrives last
    // spends the least, the transfer alone; the mean less the least is the mean wait for the slowest rank.
    double t_wait, t_wait_min;
    double t_reduce, t_reduce_min;
} GrpoStep;

void grpo_step_init(GrpoStep *s, const GrpoSetup *u);
void grpo_step_free(GrpoStep *s);
// One GRPO step, the run's step-th (1, 2, ...): the stages below in order, under the adapter lo, or with
// lo NULL every weight through ft. step places the step's problems, seeds and optimizer steps
// ((step - 1) x num_iterations before it) in the run. Dies in one line on a reward program's failure,
// an update that does not fit memory, or a NaN/inf gradient norm.
void grpo_train_step(GrpoStep *s, Model *m, LoRA *lo, FullTrainer *ft, int step);
// 1. the problems and their completions (sampled with lo); s->t_step is the step's start
void grpo_rollout(GrpoStep *s, Model *m, LoRA *lo, int step);
// 2. and 3. the rewards, advantages, the loss's normalizers, the completions' masks and sampler log-probs
// (m: the reward model borrows its arena)
void grpo_score(GrpoStep *s, Model *m, int step);
// 4. the training batch and the micro-batch that fits (s->mb; sets m->recompute)
void grpo_batch(GrpoStep *s, Model *m);
// 5. the update (grpo_batch's batch made here first)
void grpo_update(GrpoStep *s, Model *m, LoRA *lo, FullTrainer *ft, int step);
// what the next step makes anew (the rollout, the batch)
void grpo_step_end(GrpoStep *s);

#ifdef __cplusplus
}
#endif
#endif  // GRPO_TRAIN_H
