// memory_fit.h: the update's micro-batch and recomputation chosen to fit the time-shared arena.
// (And a forward's alone, a reward model's: memfit_forward.)
// An update runs forward + logprobs + backward over micro-batches of mb sequences of T tokens; their
// activations live in the arena (model.h), and LoRA's saved ax beside it. A user's explicit
// --micro_batch_size / --gradient_checkpointing always win; what is left open is chosen here:
//   1. without recomputation, the largest micro-batch that fits (S, S/2, S/4, ... 1), when it holds
//      the whole batch or at least MEMFIT_MIN_TOKENS tokens (GEMMs of fewer rows lose speed, and
//      recomputing costs a forward: about a third of a step);
//   2. else with recomputation (--gradient_checkpointing), the largest micro-batch that fits;
//   3. else the smaller of the two that fits at all; else nothing fits (memfit_update returns -1).
// Written against model.h, so the CPU backend (no arena: everything fits) takes the same path.
#ifndef MEMFIT_H
#define MEMFIT_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MEMFIT_MIN_TOKENS 4096

typedef struct {
    int mb;         // sequences per forward/backward
    int recompute;  // gradient checkpointing
    size_t bytes;   // what the activations of one micro-batch take (arena + LoRA's ax)
} FitChoice;

// bytes the update's activations take for mb sequences of T tokens: the arena's part and LoRA's ax
size_t memfit_bytes(const Model *m, int mb, int T, int recompute);
// Choose for S sequences of T tokens. want_mb: the user's micro-batch (0: choose); want_rc: the user's
// recomputation (1: on; -1: choose). Fits within the arena's cap (m->arena.cap; 0: no arena, the
// largest choice is taken) less what LoRA's ax would take. 0 and *out on success; -1 when not even
// the smallest allowed choice fits, with out->bytes its need.
int memfit_update(const Model *m, int S, int T, int want_mb, int want_rc, FitChoice *out);
// A forward alone (no backward: a reward model's, ACTS_FORWARD_ONLY) over S sequences of T tokens: the
// largest of S, S/2, S/4, ..., 1 sequences whose activations fit in cap (0: no limit, S); 0 if none does.
int memfit_forward(const Model *m, int S, int T, size_t cap);

#ifdef __cplusplus
}
#endif
#endif  // MEMFIT_H
