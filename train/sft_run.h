// sft_run.h: what ./train_sft (train_sft.c) and ./train_dpo (train_dpo.c) share: one option table
// (TRL's SFTConfig / TrainingArguments names; train_dpo's adds DPOConfig's), and the run's stages,
// each a function the programs' main calls in turn: options, (train_dpo alone: the built-in base),
// inputs, output directory, load, begin (the run's length, --resume), then per step the program's
// own (sft_step or dpo_step) with sft_run_log and sft_run_checkpoint, sft_run_eval, sft_run_plot,
// sft_run_free. Opts.dpo picks DPO's data, loss, metrics and defaults where they differ.
//   defines: SftOpts, SftRun, SftWindow and the sft_run_* stages
#ifndef SFT_RUN_H
#define SFT_RUN_H

#include "dist/dist.h"
#include "tasks/tasks.h"
#include "train/builtin.h"
#include "train/dpo_train.h"
#include "train/full_finetune.h"
#include "train/sft.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *model, *data, *output_dir, *device, *system_prompt, *lr_scheduler_type, *lora_target_modules, *load_in_fp8;
    const char *lora_target_parameters;
    const char *fp8_recipe, *fp8_format, *fp8_amax_compute_algo, *adam_moments, *eval_data;
    int resume, overwrite_output_dir, use_peft, gradient_checkpointing, recompute_mlp, quiet, chat, fp8_lm_head;
    int fp8_amax_history_len, bf16_first_layers, bf16_last_layers;
    double fp8_margin;
    int max_steps, per_device_train_batch_size, gradient_accumulation_steps, max_length, lora_r;
    int logging_steps, save_steps, save_total_limit, nproc_per_node, eval_steps;
    double num_train_epochs, learning_rate, warmup_ratio, weight_decay, max_grad_norm, adam_beta1, adam_beta2, adam_epsilon;
    double lora_alpha;
    long seed;
    // DPO (train_dpo): TRL's DPOConfig
    int dpo;      // the program runs as train_dpo (not an option: its name)
    int builtin;  // train_dpo without --model and --data: the built-in preference task
    const char *loss_type, *truncation_mode;
    double beta, label_smoothing, discopop_tau;
    int reference_free, precompute_ref_log_probs, max_prompt_length, max_completion_length, per_device_eval_batch_size;
    int max_length_given;  // --max_length on the command line (its default fits itself to the model unsaid)
} SftOpts;

typedef struct {
    SftOpts o;
    Dist *dist;          // the ranks (world 1: this process alone)
    int rank, world;
    char metrics[4200];  // <output_dir>/metrics.jsonl
    int last;            // the newest checkpoint-N in output_dir (-1: none)
    char base_fp[17];    // the fingerprint of --model's weights (st_fingerprint), recorded in checkpoints
    const Backend *be;
    Tokenizer *tok;
    Model m;
    DType save_dt;       // the dtype a full run's checkpoints are saved in (the --model checkpoint's)
    SftData data;        // SFT's examples...
    SftData eval;        // (--eval_data) the held-out ones, and this rank's share of them (every world-th)
    const SftExample **eval_ex;
    int eval_n, eval_last;  // eval_last: the step evaluated last
    PrefData pref;       // ...or DPO's pairs
    PrefData pref_eval;  // (--eval_data) DPO's held-out pairs
    // train_dpo's built-in run: the warm-up model, its task and tokenizer, held-out accuracy
    char warm_dir[4400], dir[4200];
    Task task;
    Formatter fmt;
    int claimed;         // dir is claimed already (a new out/dpo-N)
    double acc0;         // held-out accuracy of the base
    long n_items;        // examples or pairs: what an epoch goes through
    DpoTrainer dpo;      // DPO: the loss's settings, on tr
    FullTrainer ft;      // every weight...
    LoRA *lo;            // ...or an adapter
    SftTrainer tr;
    int per_step;        // this rank's examples per optimizer step: batch x gradient accumulation
    int per_step_all;    // every rank's: world x per_step
    long total;          // optimizer steps of the whole run
    long warmup;         // of which ramp the learning rate up
    int start;           // the step resumed from (0: a fresh run)
} SftRun;

// the stats of the steps since the last logged one
typedef struct {
    int steps;
    double loss, t0;
    long tokens, seq_tokens;
    DpoStats dpo;  // DPO: the sums behind its metrics
} SftWindow;

// the options of argv (dpo: train_dpo's table and defaults); every bad one dies in one line
void sft_run_options(int argc, char **argv, int dpo, SftOpts *o);
// train_dpo without --model and --data: the built-in model (./train_grpo's warm-up, cached) and task
void sft_run_builtin_base(SftRun *r);
// the tokenizer and the data (examples or pairs; --eval_data's): each bad input said before any directory exists
void sft_run_read_inputs(SftRun *r);
// where the run writes, checked (and claimed) before any work
void sft_run_prepare_output(SftRun *r);
// the backend, the model and what is trained (every weight or an adapter; DPO: its reference)
void sft_run_load(SftRun *r);
// the built-in run's held-out accuracy (greedy, as ./train_grpo's evaluation) with the adapter lo (or NULL)
double sft_run_builtin_accuracy(SftRun *r, LoRA *lo);
// the run's length, and --resume's checkpoint read back
void sft_run_begin(SftRun *r);
// the step's line and metrics.jsonl record every logging_steps (ds: DPO's sums, else NULL)
void sft_run_log(const SftRun *r, SftWindow *w, const SftStats *s, const DpoStats *ds, int step, double lr, long tokens_seen);
// a checkpoint every save_steps and at the end
void sft_run_checkpoint(const SftRun *r, int step);
// --eval_data's metrics at step
void sft_run_eval(SftRun *r, int step);
// plot.svg from metrics.jsonl (rank 0)
void sft_run_plot(const SftRun *r);
// after the last step (t0: when the steps began; last_loss: the last step's): --eval_data's metrics at the
// end (once), the line saying what the run did, the plot
void sft_run_finish(SftRun *r, double t0, double last_loss);
void sft_run_free(SftRun *r);

#ifdef __cplusplus
}
#endif
#endif  // SFT_RUN_H
