// checkpoint.h: a training run's output directory and its checkpoints, shared by ./train_grpo
// and ./train_sft (and the output directory's lock by ./export): the directory made and locked
// before any work, checkpoint-N/ written under a temporary name and renamed into place once
// complete (trainer_state.json: global_step, and "run": the settings a resumed run must share;
// manifest.json, written last: every file's size and checksum), TRL's save_total_limit, and what
// --resume checks and reads back: the manifest and the settings, then optimizer.safetensors (a
// LoRA's parameters and Adam moments, lora_save_state's format, or a full run's masters and
// moments, full_save_state's).
// Implemented in checkpoint.c. Bad files: a one-line error naming the file and the field (die).
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include <cjson/cJSON.h>

#include "lora.h"
#include "io/options.h"
#include "train/full_finetune.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- the output directory ----
int dir_exists(const char *p);
void mkdir_or_die(const char *p);
void rm_rf(const char *p);  // a directory and everything in it, as rm -rf (links removed, not followed)
// A directory a program writes into, claimed before any work: made if need be (with its parents when
// parents), and locked: dir/.lock, held with flock until the process ends, however it ends; a second
// process stops at once with one line naming the first's pid (the lock file is written whole, pid
// included, before it takes the name .lock). Every removal in dir happens under this lock. At exit
// the lock file is removed, and the directories the claim made too if they hold nothing else (a run
// that stops on a bad input leaves none behind); a process refused the lock removes nothing.
void dir_claim(const char *dir, int parents);
// After dir_claim(dir): the finished directory tmp (beside dir) put in dir's place in one step, the
// lock held throughout, and what dir held before removed (./export)
void dir_replace(const char *dir, const char *tmp);
// A training run's directory: dir_claim'ed, what a killed run's removals left finished
// (.checkpoint-N.deleting, .overwritten-PID, checkpoint-N.tmp). A directory holding checkpoints needs
// resume (continue the newest) or overwrite (start over); returns the newest checkpoint-N to resume
// (-1: none).
int run_dir_claim(const char *dir, int resume, int overwrite);
// a new parent/prefix-N (the next N; mkdir takes it, so two runs started at once never share one),
// locked likewise; its path into dir, returns N
int run_dir_claim_new(const char *parent, const char *prefix, char *dir, size_t cap);
// A test hook: with FP8GRPO_TEST_PAUSE="point:path" (the suites set it; nothing else does) the
// process makes path.reached at the named point and waits there until path exists. Points:
// dir_made (the claim's mkdir done, the lock not yet tried), lock_taken, pruning (a checkpoint
// renamed to .checkpoint-N.deleting, not yet removed).
void test_pause(const char *point);
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
// The "run" settings of a checkpoint, from a program's options (t: its table over its values): every
// option but those a resume may change (checkpoint.c: RESUME_MAY_CHANGE, listed in the README's "Runs
// never mix"); the programs add what the options alone do not say (the batch over every rank, the
// base's fingerprint).
cJSON *run_options_json(const OptionTable *t);
// checkpoint dir's files as its manifest.json lists them (written last by checkpoint_commit: each
// file's size and a 64-bit hash of its bytes), every one there and the same; else one line naming
// the file (a checkpoint without a manifest is refused: written by an earlier version, unchecked)
void checkpoint_check_files(const char *dir);
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
