// full.h: full-weight training of a model's dense weights (every weight: embeddings, norms,
// projections, the LM head) with AdamW on fp32 master weights.
//   defines: FullTrainer, full_init, full_step, full_free, full_save_state, full_load_state
// The model computes in its backend's act type (bf16 on the GPU, fp32 on the CPU): the trainer
// keeps the fp32 (hp) master copy of every weight and AdamW's two moments, steps them with the
// gradients model_backward accumulates (model_alloc_grads), and rounds the masters into the act
// weights after each step. The weights, gradients and masters share one layout (model_load.c pads
// every tensor to 128 elements), so each is one flat array of n values. Needs the linear weights
// unquantized (--load_in_fp8 off): a frozen FP8 weight has no master to update.
#ifndef FULL_H
#define FULL_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const Backend *be;
    size_t n;          // values in the dense weights (= in the gradients and in each of the arrays below)
    void *mem;         // one allocation: master (n) hp, adam_m (n) hp, adam_v (n) hp
    void *master, *adam_m, *adam_v;
    int step;          // AdamW steps taken
} FullTrainer;

// Master weights from m's current weights, zero moments; allocates m's gradients. Dies naming
// --load_in_fp8 off when a linear weight is FP8.
void full_init(FullTrainer *ft, Model *m);
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
// model's state.
void full_save_state(const FullTrainer *ft, const Model *m, const char *path);
void full_load_state(FullTrainer *ft, Model *m, const char *path);

#ifdef __cplusplus
}
#endif
#endif  // FULL_H
