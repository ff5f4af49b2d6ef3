// full_finetune.h: full-weight training of a model's dense weights (every weight: embeddings, norms,
// projections, the LM head) with AdamW on fp32 master weights.
//   defines: FullTrainer, full_init, full_step, full_free, full_save_state, full_load_state
// The model computes in its backend's act type (bf16 on the GPU, fp32 on the CPU): the trainer
// keeps the fp32 (hp) master copy of every weight and AdamW's two moments, steps them with the
// gradients model_backward accumulates (model_alloc_grads), and rounds the masters into the act
// weights after each step. The weights, gradients and masters share one layout (model_load.c pads
// every tensor to 128 elements), so each is one flat array of n values. Needs the linear weights
// unquantized (--load_in_fp8 off): a frozen FP8 weight has no master to update.
//
// Sharded over several ranks (full_init_sharded, ZeRO stage 2): every rank keeps the whole act
// weights (its forward and backward need them), but the fp32 masters, both AdamW moments and the
// gradients (all 16 bytes a parameter, 12 with bf16 moments) only for its block [lo, hi) of the n values. The gradients
// never exist whole: the layers' share one bucket of one layer's size (model_alloc_grads_bucket);
// after each layer's backward its values are summed over the ranks straight to their owners (a
// reduce to rank r of the part within r's block) and added to the owner's block (gshard), and the
// bucket is reused by the next layer; the tensors outside the layers (embeddings, head, final norm)
// are kept whole and go the same way at the step. A step: the global norm from each block's sum of
// squares, AdamW on the block, the block rounded into the act weights, and the act weights
// all-gathered so every rank computes with all of them again. Per parameter a rank holds 2 bytes of
// weights and 16 (12) / world of the rest. The sum over ranks is the whole batch's gradient when each
// rank's loss is normalized by the whole batch (sft.c). A checkpoint holds the whole masters and
// moments (rank 0 gathers them), so it resumes on any number of ranks, or on one. FP8 training
// (--fp8_recipe delayed) reduces each step's amaxes over the ranks before the histories roll
// (dist_reduce_amax, Transformer Engine's reduce_amax), so that every rank quantizes with the same
// scales and rank 0's checkpoint holds the group's.
#ifndef FULL_H
#define FULL_H

#include "model.h"
#include "dist/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const Backend *be;
    size_t n;          // values in the dense weights (= in the gradients)
    void *mem;         // one allocation: master (hi - lo) hp, [sharded: gshard (hi - lo) hp,] adam_m, adam_v (hi - lo) mdt
    void *master, *adam_m, *adam_v;
    int bf16_moments;  // AdamW's moments held as bf16 values (backend.h Bf16Moments; --adam_moments bf16)
    DType mdt;         // their storage: hp, or with bf16_moments the act dtype (bf16 on the GPU)
    int step;          // AdamW steps taken
    Dist *dist;        // the ranks that share the state (NULL or world 1: this process holds all of it)
    size_t lo, hi;     // the values held: [lo, hi) of the n (all n alone; dp_shard's block when sharded)
    size_t shard;      // floor(n / world): the blocks the collectives move
    void *stage;       // (hi - lo) hp on the backend: one rank's block in transit (checkpoints), or NULL
    // sharded: the step's gradients of this rank's block, summed over micro-batches and ranks as the
    // backward hands them over (hi - lo hp, in mem); where the layers begin in the flat array and one
    // layer's values (the model's gradient bucket: model_alloc_grads_bucket); the model of the hook
    void *gshard;
    size_t layer0, layer_n;
    Model *model;
} FullTrainer;

// Master weights from m's current weights, zero moments; allocates m's gradients. Dies naming
// --load_in_fp8 off when a linear weight is FP8.
void full_init(FullTrainer *ft, Model *m);
// the same, the masters and moments sharded over d's ranks (above; d NULL or of world 1: one rank);
// bf16_moments: AdamW's two moments held as bf16 values rounded stochastically (backend.h Bf16Moments,
// DeepSeek-V3's optimizer state): 2 bytes a parameter each instead of 4 on the GPU
void full_init_sharded(FullTrainer *ft, Model *m, Dist *d, int bf16_moments);
// One update from the gradients in m->grads (the caller zeroes them before the backward): the
// global norm is clipped to max_grad_norm (0: no clipping), AdamW steps the masters, and the act
// weights get the rounded masters. Returns the gradient norm before clipping; dies on a NaN/inf norm.
double full_step(FullTrainer *ft, Model *m, float lr, float beta1, float beta2, float eps, float weight_decay,
                 double max_grad_norm);
void full_free(FullTrainer *ft);
// The trainer's state for a checkpoint that resumes bit-exactly: the masters and both moments
// (n hp values each, as "params", "adam_m", "adam_v") and the step, in a safetensors file (the
// layout of lora_save_state's), and with FP8 delayed scaling m's scales and amax histories
// ("fp8_delayed_state", model_fp8_train_state). Loading also sets m's weights from the masters
// (and m's FP8 state: call model_fp8_train first); dies naming the file when it holds another
// model's state. Sharded: every rank calls them (collectives); rank 0 alone writes or reads path
// (the others may pass NULL) and sends each rank its block.
void full_save_state(const FullTrainer *ft, const Model *m, const char *path);
void full_load_state(FullTrainer *ft, Model *m, const char *path);

#ifdef __cplusplus
}
#endif
#endif  // FULL_H
