// train_sft.c: supervised fine-tuning (SFT) of a Hugging Face checkpoint on a JSONL of prompts
// and completions, every weight or a LoRA adapter; the loss on the completion tokens only.
// ./train_dpo (train_dpo.c) is its DPO twin: the same run (train/sft_run.h) with TRL's DPOTrainer's
// data, loss and metrics.
//
//   ./train_sft --model DIR --data FILE.jsonl --output_dir DIR            every weight (fp32 masters)
//   ./train_sft --model DIR --data FILE.jsonl --use_peft --lora_r 16 ...  a LoRA adapter (frozen base,
//                                                                         FP8 with --load_in_fp8)
//   ./train_sft --help                                                    every option, its default and meaning
//
// Option names are TRL's SFTConfig / TrainingArguments ones. sft.h holds the data, the loss and
// the optimizer step; train/sft_run.h the stages of the run (options, data, model, checkpoints,
// metrics) that ./train_dpo shares; this file is the program around them: load, then per optimizer step the
// next per_device_train_batch_size x gradient_accumulation_steps examples of the seeded shuffle
// (sft_data_at), sft_step, a line in metrics.jsonl every logging_steps, a checkpoint every
// save_steps and at the end. A checkpoint (checkpoint-N/, written under a temporary name and
// renamed, checkpoint.h) is what the run trained, readable by others, plus what --resume needs:
//   every weight: a Hugging Face checkpoint (config.json, model.safetensors in the --model
//                 checkpoint's dtype: bf16 stays bf16, anything else is saved in fp32) with the
//                 tokenizer files copied, so ./generate and transformers load it as it is; it holds
//                 the weights the model computes with (model_save_hf): the fp32 masters on the CPU,
//                 their bf16 rounding on the GPU (the masters are in optimizer.safetensors);
//   LoRA:         the PEFT adapter (adapter_config.json, adapter_model.safetensors);
//   both:         optimizer.safetensors (fp32 masters and Adam moments) and trainer_state.json
//                 (global_step and the settings a resume must share). The data position is
//                 global_step x the examples per step: sft_data_at gives the same example for
//                 the same position on every run, so --resume continues bit-exactly (CPU).
// Several processes (torchrun, srun or --nproc_per_node N; dist.h) train as one: each takes its
// share of a step's examples, and every weight's masters and AdamW moments are sharded over them
// (ZeRO, full_finetune.h; a LoRA adapter's are small and replicated); rank 0 writes metrics and checkpoints.
// main() is the list of stages.
#include <math.h>

#include "dist/data_parallel.h"
#include "train/optim.h"
#include "train/sft_run.h"

int main(int argc, char **argv) {
    SftRun r;
    memset(&r, 0, sizeof r);
    sft_run_options(argc, argv, 0, &r.o);
    dist_launch(argc, argv);  // --nproc_per_node N: start N of these (each goes on below), wait, exit
    setvbuf(stdout, NULL, _IOLBF, 0);
    r.dist = dist_from_env();  // the ranks (torchrun's or srun's environment; none: one process)
    r.rank = dist_rank(r.dist), r.world = dist_world(r.dist);
    sft_run_read_inputs(&r);     // tokenizer, data: each bad input said before any directory exists
    sft_run_prepare_output(&r);  // where the run writes, checked before any work
    sft_run_load(&r);            // backend, model, what is trained
    sft_run_begin(&r);           // the run's length; resume a checkpoint

    const SftExample **ex = (const SftExample **)mallocCheck(r.per_step * sizeof(SftExample *));
    SftWindow w = {.t0 = now_sec()};
    long tokens_seen = 0;  // of this run's steps, every rank's (prompt and completion, no padding)
    double t0 = now_sec(), last_loss = NAN;
    for (int step = r.start + 1; step <= r.total; step++) {
        // the data stream's position (the same after a resume); this rank's share of the step's examples
        long pos = (long)(step - 1) * r.per_step_all + (long)r.rank * r.per_step;
        double lr = lr_schedule(r.o.lr_scheduler_type, r.o.learning_rate, step - 1, r.warmup, r.total);
        for (int i = 0; i < r.per_step; i++) ex[i] = sft_data_at(&r.data, pos + i);
        SftStats s = sft_step(&r.tr, ex, r.per_step, lr);
        tokens_seen += s.seq_tokens;
        last_loss = s.loss;
        sft_run_log(&r, &w, &s, NULL, step, lr, tokens_seen);
        sft_run_checkpoint(&r, step);
        if (r.o.eval_data && r.o.eval_steps && step % r.o.eval_steps == 0) sft_run_eval(&r, step);
    }
    sft_run_finish(&r, t0, last_loss);  // the end's evaluation, what the run did, the plot
    free(ex);
    sft_run_free(&r);
    dist_finalize(r.dist);
    return 0;
}
