// checkpoint.c: a training run's output directory and its checkpoints (checkpoint.h): the
// directory checked before any work, checkpoint-N/ written atomically and rotated, and what
// --resume reads back (train_grpo.c's and train_sft.c's); the reading out of the programs so that
// the fuzz target test/fuzz/fuzz_resume.c reads checkpoints as they do.
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint.h"
#include "safetensors.h"

// ----------------------------------------------------------------------------
// the output directory

int dir_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}
void mkdir_or_die(const char *p) {
    if (mkdir(p, 0755) != 0 && errno != EEXIST) die("cannot create directory %s (%s)", p, strerror(errno));
}
void rm_rf(const char *p) {
    DIR *d = opendir(p);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char q[4096];
        path_join(q, sizeof q, p, e->d_name);
        if (dir_exists(q)) rm_rf(q);
        else remove(q);
    }
    closedir(d);
    rmdir(p);
}

// dir and its parents, as mkdir -p
void mkdir_p(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = 0;
        mkdir_or_die(p);
        *c = '/';
    }
    mkdir_or_die(p);
}

// dir exists (made if need be) and this process can create files in it; else one line and
// exit now, not after minutes of warm-up
void make_writable_dir(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) die("output directory %s exists and is not a directory: give another --output_dir", dir);
    mkdir_p(dir);
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.write_test_XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0) die("cannot write in output directory %s (%s): give another --output_dir", dir, strerror(errno));
    close(fd);
    unlink(probe);
}

// the largest N of dir's directories named prefix-N (prefix "checkpoint": its newest checkpoint; "run":
// its newest run), counting only those that hold a checkpoint when with_checkpoint; -1 if none
int newest_numbered(const char *dir, const char *prefix, int with_checkpoint) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int best = -1;
    size_t np = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d))) {
        int n;
        char tail, p[4200];
        if (strncmp(e->d_name, prefix, np) || e->d_name[np] != '-' || sscanf(e->d_name + np + 1, "%d%c", &n, &tail) != 1 ||
            n < 0 || n <= best)
            continue;
        path_join(p, sizeof p, dir, e->d_name);
        if (dir_exists(p) && (!with_checkpoint || newest_numbered(p, "checkpoint", 0) >= 0)) best = n;
    }
    closedir(d);
    return best;
}
int last_checkpoint(const char *dir) { return newest_numbered(dir, "checkpoint", 0); }

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

// TRL's save_total_limit, called once checkpoint-`newest` is complete (renamed into place):
// delete dir's oldest checkpoints until at most `limit` remain, never `newest` itself nor `keep`
// (the one this run resumed from; -1: none). Checkpoints numbered above newest were left by an
// earlier run that --overwrite_output_dir started over: not counted, not touched. Each goes
// atomically as far as --resume can tell: first renamed out of the checkpoint-N names (to a
// hidden .checkpoint-N.deleting that the next rotation finishes removing if this one is killed),
// then removed, so a half-deleted checkpoint is never taken for one to resume.
void rotate_checkpoints(const char *dir, int limit, int newest, int keep, int quiet) {
    DIR *d = opendir(dir);
    if (!d) return;
    int *steps = NULL, n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int k;
        char tail, p[4200];
        path_join(p, sizeof p, dir, e->d_name);
        if (!strncmp(e->d_name, ".checkpoint-", 12) && strstr(e->d_name, ".deleting")) {
            rm_rf(p);  // what a killed rotation left
            continue;
        }
        if (strncmp(e->d_name, "checkpoint-", 11) || sscanf(e->d_name + 11, "%d%c", &k, &tail) != 1 || k < 0 || k > newest ||
            !dir_exists(p))
            continue;
        if (n == cap) steps = (int *)reallocCheck(steps, (cap = cap ? 2 * cap : 16) * sizeof(int));
        steps[n++] = k;
    }
    closedir(d);
    if (n) qsort(steps, n, sizeof(int), cmp_int);
    for (int i = 0, left = n; i < n && left > limit; i++) {
        if (steps[i] == newest || steps[i] == keep) continue;
        char from[4200], to[4200];
        snprintf(from, sizeof from, "%s/checkpoint-%d", dir, steps[i]);
        snprintf(to, sizeof to, "%s/.checkpoint-%d.deleting", dir, steps[i]);
        rm_rf(to);
        if (rename(from, to) != 0) die("--save_total_limit: cannot remove %s (%s)", from, strerror(errno));
        rm_rf(to);
        left--;
        if (!quiet) printf("deleted %s (--save_total_limit %d)\n", from, limit);
    }
    free(steps);
}


// keep the metrics lines of steps <= upto (after a resume, later lines belong to the lost run)
void metrics_truncate(const char *path, int upto) {
    if (!file_exists(path)) return;
    char *text = read_file(path, NULL), *keep = (char *)callocCheck(strlen(text) + 1, 1), *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
        if (cJSON_IsNumber(s) && s->valueint <= upto) {
            strcat(keep, line);
            strcat(keep, "\n");
        }
        cJSON_Delete(j);
    }
    write_file_atomic(path, keep, strlen(keep));
    free(text);
    free(keep);
}

// ----------------------------------------------------------------------------
// writing a checkpoint

void checkpoint_begin(const char *out_dir, int step, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s/checkpoint-%d.tmp", out_dir, step);
    rm_rf(tmp);  // what a killed run left
    mkdir_or_die(tmp);
}

void checkpoint_commit(const char *out_dir, int step, const char *tmp, const cJSON *run) {
    cJSON *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "global_step", step);
    cJSON_AddItemToObject(st, "run", cJSON_Duplicate(run, 1));
    char *text = cJSON_Print(st), p[4200], final[4200];
    cJSON_Delete(st);
    path_join(p, sizeof p, tmp, "trainer_state.json");
    write_file_atomic(p, text, strlen(text));
    free(text);
    // the directory appears under its final name only once complete
    snprintf(final, sizeof final, "%s/checkpoint-%d", out_dir, step);
    if (dir_exists(final)) rm_rf(final);
    if (rename(tmp, final) != 0) die("cannot rename %s to %s (%s)", tmp, final, strerror(errno));
}

// ----------------------------------------------------------------------------
// reading one back

// trainer_state.json of dir: the run's settings must equal identity_json, global_step must be step
static void read_trainer_state(const char *dir, int step, const char *identity_json) {
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
}

void checkpoint_copy_tokenizer(const char *from, const char *to) {
    const char *names[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                           "generation_config.json", "vocab.json", "merges.txt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char src[4300], dst[4300];
        path_join(src, sizeof src, from, names[i]);
        if (!file_exists(src)) continue;
        path_join(dst, sizeof dst, to, names[i]);
        size_t n;
        char *data = read_file(src, &n);
        write_file_atomic(dst, data, n);
        free(data);
    }
}

void checkpoint_read(const char *dir, int step, const char *identity_json, LoRA *lo) {
    read_trainer_state(dir, step, identity_json);
    char p[4200];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    lora_load_state(lo, p);
    // AdamW takes num_iterations >= 1 steps per global step; a step below that (or a negative
    // one, or text that is no number: 0) would restart the bias correction silently
    if (lo->step < step) die("%s: its metadata's step %d is below global_step %d: not this checkpoint's optimizer state", p, lo->step, step);
}

void checkpoint_read_full(const char *dir, int step, const char *identity_json, FullTrainer *ft, Model *m) {
    read_trainer_state(dir, step, identity_json);
    char p[4200];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    full_load_state(ft, m, p);
    if (ft->step != step) die("%s: its metadata's step %d is not global_step %d: not this checkpoint's optimizer state", p, ft->step, step);
}
