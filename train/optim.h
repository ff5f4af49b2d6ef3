// optim.h: what the optimizer steps of every trainer share (GRPO, SFT, the built-in model's warm-up):
// the learning-rate schedule, the warm-up from a ratio, and gradient clipping, as transformers and
// torch define them. The optimizers themselves: AdamW on a LoRA adapter (lora.h), on every weight
// (train/full_finetune.h).
#ifndef OPTIM_H
#define OPTIM_H

#ifdef __cplusplus
extern "C" {
#endif

// the optimizer's settings as a trainer's step takes them (TRL's names; AdamW's betas and epsilon)
typedef struct {
    const char *lr_scheduler_type;
    double learning_rate, beta1, beta2, eps, weight_decay, max_grad_norm;
    long warmup, total;    // optimizer steps of warm-up, of the run
} OptimConfig;

// transformers' get_scheduler: a linear ramp from 0 over `warmup` steps, then
//   linear:   lr * max(0, (total - step) / max(1, total - warmup))
//   cosine:   lr * max(0, 0.5 * (1 + cos(pi * (step - warmup) / max(1, total - warmup))))  (num_cycles 0.5)
//   constant: lr
// step = optimizer steps already taken (0 for the first update, as LambdaLR counts). Another type dies
// naming the three.
double lr_schedule(const char *type, double lr, long step, long warmup, long total);
// transformers' warmup_ratio -> steps: ceil(ratio * total)
long warmup_steps_from_ratio(double warmup_ratio, long total_steps);
// torch.nn.utils.clip_grad_norm_: multiply gradients by min(1, max_norm / (norm + 1e-6)).
// max_norm <= 0 disables clipping (1.0). A non-finite norm returns NaN: the caller
// should stop with a message rather than apply it.
double grad_clip_factor(double total_norm, double max_norm);

#ifdef __cplusplus
}
#endif
#endif  // OPTIM_H
