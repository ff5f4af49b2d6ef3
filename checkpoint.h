// checkpoint.h: reading back a run's checkpoint-N/ (what train_grpo's --resume continues from):
// trainer_state.json (global_step, and "run": the settings the run must share) and
// optimizer.safetensors (the LoRA's parameters, Adam moments and step, lora_save_state's format).
// train_grpo.c writes them (save_checkpoint); the PEFT adapter next to them is for peft / vLLM.
// Implemented in checkpoint.c. Bad files: a one-line error naming the file and the field (die).
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include "lora.h"

#ifdef __cplusplus
extern "C" {
#endif

// Restore lo (made with the run's LoRA settings) from dir, the checkpoint of global step `step`.
// identity_json: the "run" object this run would write (JSON text); the checkpoint's must equal it.
void checkpoint_read(const char *dir, int step, const char *identity_json, LoRA *lo);

#ifdef __cplusplus
}
#endif
#endif  // CHECKPOINT_H
