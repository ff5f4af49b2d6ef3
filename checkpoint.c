// checkpoint.c: checkpoint_read (checkpoint.h), what train_grpo's --resume reads; out of
// train_grpo.c so that the fuzz target test/fuzz/fuzz_resume.c reads checkpoints as it does.
#include <cjson/cJSON.h>

#include "checkpoint.h"
#include "safetensors.h"

void checkpoint_read(const char *dir, int step, const char *identity_json, LoRA *lo) {
    char p[4200];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    char *text = read_file(p, NULL);
    cJSON *st = cJSON_Parse(text);
    free(text);
    if (!st) die("%s: not valid JSON", p);
    cJSON *run = cJSON_GetObjectItemCaseSensitive(st, "run"), *mine = cJSON_Parse(identity_json);
    if (!cJSON_Compare(run, mine, 1)) {
        char *a = run ? cJSON_PrintUnformatted(run) : NULL, *b = cJSON_PrintUnformatted(mine);
        die("%s was made with other settings (%s) than this run (%s): resume with the same options or use a new --output_dir", dir,
            a ? a : "none recorded", b);
    }
    cJSON_Delete(mine);
    cJSON *gs = cJSON_GetObjectItemCaseSensitive(st, "global_step");
    if (!cJSON_IsNumber(gs) || gs->valuedouble != step) die("%s: global_step does not match the directory name", p);
    cJSON_Delete(st);
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    lora_load_state(lo, p);
    // AdamW takes num_iterations >= 1 steps per global step; a step below that (or a negative
    // one, or text that is no number: 0) would restart the bias correction silently
    if (lo->step < step) die("%s: its metadata's step %d is below global_step %d: not this checkpoint's optimizer state", p, lo->step, step);
}
