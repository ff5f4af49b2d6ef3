// checkpoint.c: a training run's output directory and its checkpoints (checkpoint.h): the
// directory checked before any work, checkpoint-N/ written atomically and rotated, and what
// --resume reads back (train_grpo.c's and train_sft.c's); the reading out of the programs so that
// the fuzz target test/fuzz/fuzz_resume.c reads checkpoints as they do.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/safetensors.h"
#include "train/checkpoint.h"

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

// ----------------------------------------------------------------------------
// claiming it: made, locked, checked; what a run that failed on its inputs made, removed again

// the directories this process made for its run (parents first), removed at exit while they hold
// nothing but the lock: a run that stops on a bad input before writing anything leaves none behind
static struct {
    char path[8][4096];
    int n;
} made;
static int lock_fd = -1;  // the output directory's .lock, flock'ed until the process ends

static int holds_only_lock(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int other = 0;
    while ((e = readdir(d)))
        other |= strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ".lock");
    closedir(d);
    return !other;
}
static void remove_unused_dirs(void) {
    for (int i = made.n - 1; i >= 0; i--) {
        if (!holds_only_lock(made.path[i])) break;  // the run wrote here: keep it and its parents
        char lock[4200];
        path_join(lock, sizeof lock, made.path[i], ".lock");
        remove(lock);
        rmdir(made.path[i]);
    }
}
// mkdir, remembered (for remove_unused_dirs) when this call made it; 1 when it did
static int mkdir_made(const char *p) {
    if (mkdir(p, 0755) == 0) {
        if (made.n == 0) atexit(remove_unused_dirs);
        if (made.n < 8) snprintf(made.path[made.n++], sizeof made.path[0], "%s", p);
        return 1;
    }
    if (errno != EEXIST) die("cannot create directory %s (%s)", p, strerror(errno));
    return 0;
}
// dir and its parents, as mkdir -p
static void mkdir_p_made(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = 0;
        mkdir_made(p);
        *c = '/';
    }
    mkdir_made(p);
}

// One run at a time in a directory: dir/.lock held with flock (the kernel lets it go when the process
// ends, however it ends), with the holder's pid in it for the message of the run that finds it taken.
static void lock_dir(const char *dir) {
    char p[4200];
    path_join(p, sizeof p, dir, ".lock");
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) die("cannot write in output directory %s (%s): give another --output_dir", dir, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t k = pread(fd, pid, sizeof pid - 1, 0);
        pid[k > 0 ? k : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        die("%s is in use by another run (pid %s): wait for it to end, or give another --output_dir", dir, pid[0] ? pid : "unknown");
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, n, 0) != n) die("cannot write %s (%s)", p, strerror(errno));
    if (lock_fd >= 0) close(lock_fd);
    lock_fd = fd;
}

// dir made (with its parents) if need be, and writable: said now, not after minutes of warm-up
static void make_writable(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) die("output directory %s exists and is not a directory: give another --output_dir", dir);
    mkdir_p_made(dir);
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.write_test_XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0) die("cannot write in output directory %s (%s): give another --output_dir", dir, strerror(errno));
    close(fd);
    unlink(probe);
}

int run_dir_claim(const char *dir, int resume, int overwrite) {
    make_writable(dir);
    lock_dir(dir);
    int last = last_checkpoint(dir);
    if (last >= 0 && !resume && !overwrite)
        die("%s already holds checkpoint-%d: pass --resume to continue it, --overwrite_output_dir to start over, or another --output_dir",
            dir, last);
    if (resume && last < 0) die("--resume: no checkpoint-N in %s", dir);
    return overwrite ? -1 : last;
}

int run_dir_claim_new(const char *parent, const char *prefix, char *dir, size_t cap) {
    make_writable(parent);
    int n = newest_numbered(parent, prefix, 0);
    for (n = n < 0 ? 1 : n + 1;; n++) {  // the next number; mkdir claims it, so two runs started at once never share one
        snprintf(dir, cap, "%s/%s-%d", parent, prefix, n);
        if (mkdir_made(dir)) break;
    }
    lock_dir(dir);
    return n;
}

// what a run writes into its directory (and what a killed one leaves there)
static int run_file(const char *name) {
    int k;
    char tail[16];
    if (!strcmp(name, "metrics.jsonl") || !strcmp(name, "plot.svg")) return 1;
    if (!strncmp(name, ".checkpoint-", 12) && strstr(name, ".deleting")) return 1;
    if (strncmp(name, "checkpoint-", 11)) return 0;
    int got = sscanf(name + 11, "%d%15s", &k, tail);
    return got == 1 || (got == 2 && !strcmp(tail, ".tmp"));
}

void run_dir_start(const char *dir, int overwrite) {
    if (!overwrite) {
        char p[4200];
        path_join(p, sizeof p, dir, "metrics.jsonl");
        if (file_exists(p)) remove(p);  // of a run that stopped before its first checkpoint
        return;
    }
    // every file of the earlier run renamed into one hidden directory, then that removed: what a kill
    // in between leaves is out of the names a resume or a reader of metrics.jsonl looks at
    char trash[4200];
    snprintf(trash, sizeof trash, "%s/.overwritten-%d", dir, (int)getpid());
    rm_rf(trash);
    mkdir_or_die(trash);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char from[4400], to[4400];
        path_join(from, sizeof from, dir, e->d_name);
        path_join(to, sizeof to, trash, e->d_name);
        if (!strncmp(e->d_name, ".overwritten-", 13) && strcmp(from, trash)) rm_rf(from);  // a killed overwrite's
        else if (run_file(e->d_name) && rename(from, to) != 0)
            die("--overwrite_output_dir: cannot move %s aside (%s)", from, strerror(errno));
    }
    if (d) closedir(d);
    rm_rf(trash);
}


static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

// TRL's save_total_limit, called once checkpoint-`newest` is complete (renamed into place):
// delete dir's oldest checkpoints until at most `limit` remain, never `newest` itself nor `keep`
// (the one this run resumed from; -1: none); checkpoints numbered above newest are not counted
// nor touched. Each goes
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

// the settings in which two runs differ, as "seed 42 there, 7 here; ..." into out
static void describe_difference(const cJSON *theirs, const cJSON *mine, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int pass = 0; pass < 2; pass++) {  // mine's keys, then those only theirs has
        const cJSON *e;
        const cJSON *obj = pass ? theirs : mine;
        cJSON_ArrayForEach(e, obj) {
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(pass ? mine : theirs, e->string);
            if (pass && o) continue;
            if (o && cJSON_Compare(o, e, 1)) continue;
            char *a = o ? cJSON_PrintUnformatted(o) : NULL, *b = cJSON_PrintUnformatted(e);
            if (n < cap)
                n += snprintf(out + n, cap - n, "%s%s %s there, %s here", n ? "; " : "", e->string,
                              pass ? b : a ? a : "none", pass ? "none" : b);
            free(a), free(b);
        }
    }
}

void checkpoint_check_run(const char *dir, int step, const char *identity_json) {
    char p[4200];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    char *text = read_file(p, NULL);
    cJSON *st = cJSON_Parse(text);
    free(text);
    if (!st) die("%s: not valid JSON", p);
    cJSON *run = cJSON_GetObjectItemCaseSensitive(st, "run"), *mine = cJSON_Parse(identity_json);
    if (!cJSON_IsObject(run)) {
        cJSON_Delete(st), cJSON_Delete(mine);
        die("%s records no \"run\" settings: not a checkpoint this program wrote", p);
    }
    // the base's fingerprint is compared where both have it (checkpoints of earlier versions lack
    // it; a caller that cannot know it yet leaves it out, and checks again once it can)
    if (!cJSON_GetObjectItemCaseSensitive(run, "base_model_fingerprint") || !cJSON_GetObjectItemCaseSensitive(mine, "base_model_fingerprint")) {
        cJSON_DeleteItemFromObject(mine, "base_model_fingerprint");
        cJSON_DeleteItemFromObject(run, "base_model_fingerprint");
    }
    char diff[1024] = "";
    if (!cJSON_Compare(run, mine, 1)) describe_difference(run, mine, diff, sizeof diff);
    cJSON *gs = cJSON_GetObjectItemCaseSensitive(st, "global_step");
    int step_ok = cJSON_IsNumber(gs) && gs->valuedouble == step;
    cJSON_Delete(mine);
    cJSON_Delete(st);
    if (diff[0])
        die("%s was made with other settings than this run (%s): resume with the same options and model, or use a new "
            "--output_dir", dir, diff);
    if (!step_ok) die("%s: global_step does not match the directory name", p);
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
    checkpoint_check_run(dir, step, identity_json);
    char p[4200];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    lora_load_state(lo, p);
    // AdamW takes num_iterations >= 1 steps per global step; a step below that (or a negative
    // one, or text that is no number: 0) would restart the bias correction silently
    if (lo->step < step) die("%s: its metadata's step %d is below global_step %d: not this checkpoint's optimizer state", p, lo->step, step);
}

void checkpoint_read_full(const char *dir, int step, const char *identity_json, FullTrainer *ft, Model *m) {
    checkpoint_check_run(dir, step, identity_json);
    char p[4200];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    full_load_state(ft, m, p);
    if (ft->step != step) die("%s: its metadata's step %d is not global_step %d: not this checkpoint's optimizer state", p, ft->step, step);
}
