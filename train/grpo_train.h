// grpo_train.h: one GRPO update on a batch of completions, the loop around grpo.c's loss, as
// ppo_train.h's is around ppo.c's.
//   defines: GrpoBatch, GrpoStepStats, GrpoTrainer, grpo_train_init, grpo_train_free, grpo_step
//
// One step (grpo_step), TRL's GRPOTrainer on the (S, Tc) completion tokens of one rollout:
//   1. where the loss needs them, per micro-batch: the reference's log-probs (beta != 0: the base with
//      no adapter) and the old policy's (num_iterations > 1: the policy before this step's updates);
//   2. num_iterations times: per micro-batch the policy's forward and log-probs, grpo_loss (its value
//      and dL/dlogp), the backward; then the gradients summed over the ranks (data_parallel.h), the
//      global norm clipped, one AdamW step (LoRA: the adapter; else every weight, full_finetune.h).
// Every rank calls it on its own rows; its figures are the whole batch's.
#ifndef GRPO_TRAIN_H
#define GRPO_TRAIN_H

#include "grpo.h"
#include "lora.h"
#include "model.h"
#include "dist/dist.h"
#include "train/full_finetune.h"
#include "train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {  // this rank's rows of one rollout, as the update reads them
    int S, T, Tc;            // sequences, tokens of each (prompt + completion, right-padded), completion tokens
    const int *ids, *tg;     // (S, T) the tokens; the token each position predicts where it is a completion token, else -1
    const int *start;        // (S) the position that predicts completion token 0 (the prompt's length - 1)
    const int *len;          // (S) completion lengths
    const double *samp;      // (S, Tc) the sampler's log-probs of the completion tokens
    const double *adv;       // (S) advantages
    const uint8_t *mask;     // (S, Tc) 1 on completion tokens
    const uint8_t *trunc;    // (S) 1 where the completion was cut at Tc
    const GrpoNorm *norm;    // the loss's normalizers (every rank's: dp_norm)
    float inv_temp;          // log-probs at the sampling temperature, as TRL's trainer computes them
} GrpoBatch;

typedef struct {
    double loss;             // the last iteration's loss, summed over the ranks
    double grad_norm, lr;    // the last iteration's, before clipping
    double t_ref;            // seconds: the reference and old-policy passes
    double t_reduce, t_reduce_min;  // seconds in the gradients' all-reduce: the ranks' mean, their least
    GrpoMetrics gm;          // the last iteration's, every rank's
} GrpoStepStats;

typedef struct {
    int S, Tc, cap_T;
    double *logp, *old, *ref, *dlogp;  // (S, Tc) the policy's now, before the step, the reference's; dL/dlogp
    double *lp, *dl;                   // (S, T) a micro-batch's log-probs at every position, their gradient
} GrpoTrainer;

void grpo_train_init(GrpoTrainer *t, int S, int Tc);
void grpo_train_free(GrpoTrainer *t);
// One GRPO update of b (mb sequences a forward / backward) under g: the adapter lo, or with lo NULL
// every weight through ft. step: the run's step (1, 2, ...): the optimizer steps' place in o's
// schedule ((step - 1) x num_iterations before it). Dies in one line on a NaN/inf gradient norm.
void grpo_step(GrpoTrainer *t, Model *m, LoRA *lo, FullTrainer *ft, Dist *dist, const GrpoConfig *g, const GrpoBatch *b,
               int mb, const OptimConfig *o, long step, GrpoStepStats *st);

#ifdef __cplusplus
}
#endif
#endif  // GRPO_TRAIN_H
