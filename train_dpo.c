// train_dpo.c: DPO (TRL's DPOTrainer) on a JSONL of preference pairs, or alone on the built-in
// preference task: every weight (the reference: its log-probs computed before training) or a LoRA
// adapter (the reference: the same weights with no adapter). The run is ./train_sft's
// (train/sft_run.h: options, data, model, checkpoints, metrics, plot), with the pairs
// (train/dpo_train.h), the loss (dpo.h) and TRL's DPO metrics in place of SFT's.
//
//   ./train_dpo                                                          the built-in task on the built-in model
//   ./train_dpo --model DIR --data PAIRS.jsonl --use_peft --load_in_fp8 block ...   DPO, the reference
//                                                                        with no adapter
//   ./train_dpo --help                                                   every option, its default and meaning
//
// Option names are TRL's DPOConfig / TrainingArguments ones. Per optimizer step: the next
// per_device_train_batch_size x gradient_accumulation_steps pairs of the seeded shuffle
// (pref_data_at), dpo_step, a line in metrics.jsonl every logging_steps, a checkpoint every
// save_steps and at the end (as ./train_sft's). DPO runs on one process so far. main() is the list
// of stages.
#include <math.h>

#include "dist/data_parallel.h"
#include "train/optim.h"
#include "train/sft_run.h"

int main(int argc, char **argv) {
    SftRun r;
    memset(&r, 0, sizeof r);
    sft_run_options(argc, argv, 1, &r.o);
    dist_launch(argc, argv);  // (refused by the options: DPO runs on one process so far)
    setvbuf(stdout, NULL, _IOLBF, 0);
    r.dist = dist_from_env();
    r.rank = dist_rank(r.dist), r.world = dist_world(r.dist);
    if (r.o.builtin) sft_run_builtin_base(&r);  // alone: the built-in model (warmed up once) and task
    sft_run_read_inputs(&r);     // tokenizer, pairs: each bad input said before any directory exists
    sft_run_prepare_output(&r);  // where the run writes, checked before any work
    sft_run_load(&r);            // backend, model, what is trained, the reference
    if (r.o.builtin) {
        r.acc0 = sft_run_builtin_accuracy(&r, NULL);
        printf("held-out accuracy of the warmed-up model (greedy, %d problems): %.3f\n", eval_count(&r.task, 200), r.acc0);
    }
    sft_run_begin(&r);           // the run's length; resume a checkpoint

    if (r.world > 1) die("train_dpo runs on one process so far: start it alone (not under torchrun or srun)");
    long *idx = (long *)mallocCheck(r.per_step * sizeof(long));
    SftWindow w = {.t0 = now_sec()};
    long tokens_seen = 0;  // of this run's steps (prompt and completion, no padding)
    double t0 = now_sec(), last_loss = NAN;
    for (int step = r.start + 1; step <= r.total; step++) {
        long pos = (long)(step - 1) * r.per_step_all + (long)r.rank * r.per_step;  // the same after a resume
        double lr = lr_schedule(r.o.lr_scheduler_type, r.o.learning_rate, step - 1, r.warmup, r.total);
        for (int i = 0; i < r.per_step; i++) idx[i] = pref_data_at(&r.pref, pos + i);
        DpoStepStats ds = dpo_step(&r.dpo, &r.pref, idx, r.per_step, lr);
        SftStats s = {.loss = ds.dpo.loss, .grad_norm = ds.grad_norm, .seq_tokens = ds.seq_tokens};
        tokens_seen += s.seq_tokens;
        last_loss = s.loss;
        sft_run_log(&r, &w, &s, &ds.dpo, step, lr, tokens_seen);
        sft_run_checkpoint(&r, step);
        if (r.o.eval_data && r.o.eval_steps && step % r.o.eval_steps == 0) sft_run_eval(&r, step);
    }
    sft_run_finish(&r, t0, last_loss);  // the end's evaluation, what the run did, the plot
    if (r.o.builtin && r.lo) {
        double acc1 = sft_run_builtin_accuracy(&r, r.lo);
        char wd[4200];
        printf("held-out accuracy (greedy, %d problems): %.3f before DPO, %.3f after\n", eval_count(&r.task, 200), r.acc0, acc1);
        printf("try it: ./generate --model %s --lora %s/checkpoint-%ld --load_in_fp8 %s --prompt '17+25='   (without --lora: the "
               "warm-up's answer)\n", path_for_shell(r.warm_dir, wd, sizeof wd), r.o.output_dir, r.total, r.o.load_in_fp8);
    }
    free(idx);
    sft_run_free(&r);
    dist_finalize(r.dist);
    return 0;
}
