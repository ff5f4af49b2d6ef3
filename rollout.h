// rollout.h: the rollout engine. For P prompts it samples G completions each,
// reading the model's one copy of the (FP8) weights with LoRA applied unmerged:
//   - each prompt is prefilled once; its G completions share the prompt's KV
//     blocks (the last, partly filled block is copied per completion: copy-on-write)
//   - all live sequences decode together, one token each per step; finished
//     sequences leave the batch and return their blocks
//   - when the model's arena (the KV/activation pool) holds fewer blocks than all
//     prompts need at once, prompts wait and are prefilled as blocks come back
//     (continuous batching); a prompt's G completions are admitted together
//   - sampling (temperature, top-k, top-p) with one RNG per sequence, seeded by
//     the caller, so results do not depend on batching or on the backend's threads
// It returns the completion ids and the sampling logprobs (for the trainer's
// importance-sampling correction). Written against model.h, so the same code
// drives the CPU and CUDA backends.
#ifndef ROLLOUT_H
#define ROLLOUT_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int G;                 // completions per prompt (num_generations)
    int max_new;           // max_completion_length
    float temperature;     // 0 = greedy
    float top_p;           // 1 = off
    int top_k;             // 0 = off
    const int *eos_ids;    // a completion ends after any of these (kept in the completion)
    int n_eos;
    int block_size;        // KV-cache tokens per block (16)
    int share_prefix;      // 1: the G completions share the prompt's KV blocks (default);
                           // 0: each prefills its own copy (for tests and comparisons)
} RolloutConfig;

typedef struct {
    int S, max_new;        // S = P * G sequences; completion s belongs to prompt s / G
    int *len;              // (S) completion lengths, EOS included when generated
    int *ids;              // (S, max_new) completion ids
    double *logp;          // (S, max_new) sampling logprobs
    unsigned char *truncated;  // (S) 1: max_new tokens and no EOS
    double prefill_s, decode_s;  // wall time of the two phases
    long decode_steps;
    size_t kv_bytes;       // KV cache held during the rollout
    int admissions;        // prefills after the first: prompts that waited for blocks (continuous batching)
} Rollout;

// Sample G completions for each of P prompts (prompts[p], plens[p] tokens) from the model with the adapter
// lo (NULL: the base model alone). seeds (P * G): the RNG state of each sequence. out is allocated here;
// free with rollout_free.
void rollout_run(Model *m, LoRA *lo, const RolloutConfig *rc, int P, const int *const *prompts, const int *plens,
                 const uint64_t *seeds, Rollout *out);
void rollout_free(Rollout *r);

#ifdef __cplusplus
}
#endif
#endif  // ROLLOUT_H
