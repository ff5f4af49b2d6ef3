// checkpoint.h: a training run's output directory and its checkpoints, shared by ./train_grpo
// and ./train_sft: the directory made and checked writable before any work, checkpoint-N/ written
// under a temporary name and renamed into place once complete (trainer_state.json: global_step,
// and "run": the settings a resumed run must share), TRL's save_total_limit, and what --resume
// reads back: trainer_state.json, then optimizer.safetensors (a LoRA's parameters and Adam moments,
// lora_save_state's format, or a full run's masters and moments, full_save_state's).
// Implemented in checkpoint.c. Bad files: a one-line error naming the file and the field (die).
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include <cjson/cJSON.h>

#include "lora.h"
#include "train/full_finetune.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- the output directory ----
int dir_exists(const char *p);
void mkdir_or_die(const char *p);
void rm_rf(const char *p);  // a directory and everything in it (rm -rf)
// The directory a run writes, claimed before any work: made if need be (with its parents), writable,
// and locked (dir/.lock, flock: one run at a time; a second one stops at once with one line naming
// the first's pid; the kernel releases the lock when the process ends, however it ends). What the
// claim made is removed again at exit while it holds nothing but the lock, so a run that stops on a
// bad input leaves no empty directory. A directory holding checkpoints needs resume (continue the
// newest) or overwrite (start over); returns the newest checkpoint-N to resume (-1: none).
int run_dir_claim(const char *dir, int resume, int overwrite);
// a new parent/prefix-N (the next N; mkdir takes it, so two runs started at once never share one),
// claimed likewise; its path into dir, returns N
int run_dir_claim_new(const char *parent, const char *prefix, char *dir, size_t cap);
// When the run is about to write (its inputs all read and checked): with overwrite, every file an
// earlier run left (checkpoint-N, metrics.jsonl, plot.svg, partial checkpoints) moved aside and
// removed, so that nothing of it can be resumed or read beside the new run's; without it, a
// metrics.jsonl left by a run that stopped before its first checkpoint removed.
void run_dir_start(const char *dir, int overwrite);
// the largest N of dir's directories named prefix-N, counting only those that hold a checkpoint
// when with_checkpoint; -1 if none
int newest_numbered(const char *dir, const char *prefix, int with_checkpoint);
int last_checkpoint(const char *dir);  // the newest checkpoint-N in dir, -1: none
// TRL's save_total_limit once checkpoint-`newest` is complete: the oldest deleted (atomically)
// until at most limit remain, never newest nor keep (the one resumed from; -1: none)
void rotate_checkpoints(const char *dir, int limit, int newest, int keep, int quiet);
// keep the lines of metrics.jsonl whose "step" is <= upto (after a resume, later ones belong to the lost run)
void metrics_truncate(const char *path, int upto);

// ---- writing checkpoint-N ----
// a fresh out_dir/checkpoint-N.tmp (its path into tmp) for the caller to fill
void checkpoint_begin(const char *out_dir, int step, char *tmp, size_t cap);
// trainer_state.json (global_step = step, "run": run) into tmp, then tmp renamed to checkpoint-N
void checkpoint_commit(const char *out_dir, int step, const char *tmp, const cJSON *run);
// the tokenizer's files of checkpoint directory from, copied into to (a full run's checkpoint, so
// that it loads on its own); those from lacks are skipped
void checkpoint_copy_tokenizer(const char *from, const char *to);

// ---- reading one back (--resume) ----
// dir's trainer_state.json: its "run" settings equal identity_json (the "run" this run would write),
// its global_step is step; else one line naming the settings that differ. The programs call it
// before any work, then again through checkpoint_read*.
void checkpoint_check_run(const char *dir, int step, const char *identity_json);
// Restore lo (made with the run's LoRA settings) from dir, the checkpoint of global step `step`.
// identity_json: the "run" object this run would write (JSON text); the checkpoint's must equal it.
void checkpoint_read(const char *dir, int step, const char *identity_json, LoRA *lo);
// the same for full-weight training: ft's masters and moments (m's weights from the masters)
void checkpoint_read_full(const char *dir, int step, const char *identity_json, FullTrainer *ft, Model *m);

#ifdef __cplusplus
}
#endif
#endif  // CHECKPOINT_H
