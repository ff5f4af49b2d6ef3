// checkpoint.c: a training run's output directory and its checkpoints (checkpoint.h): the
// directory claimed (locked) before any work, every removal in it under that lock, checkpoint-N/
// written atomically with its manifest and rotated, and what --resume checks and reads back
// (train_grpo.c's and train_sft.c's); the reading out of the programs so that the fuzz target
// test/fuzz/fuzz_resume.c reads checkpoints as they do.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
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
    struct stat sb;
    if (lstat(p, &sb) != 0) return;
    if (!S_ISDIR(sb.st_mode)) {  // a file, or a link: the link goes, never what it points to
        unlink(p);
        return;
    }
    DIR *d = opendir(p);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char q[4096];
        path_join(q, sizeof q, p, e->d_name);
        rm_rf(q);
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

// A test hook of the programs: FP8GRPO_TEST_PAUSE="point:path" stops this process at the named
// point (test_pause's callers: dir_made, lock_taken, pruning) until path exists, after creating
// path.reached. The suites use it to put the steps of two processes in a chosen order (a race made
// deterministic); unset, as it is outside them, it does nothing.
void test_pause(const char *point) {
    const char *e = getenv("FP8GRPO_TEST_PAUSE");
    size_t n = strlen(point);
    if (!e || strncmp(e, point, n) || e[n] != ':') return;
    char reached[4200];
    snprintf(reached, sizeof reached, "%s.reached", e + n + 1);
    close(open(reached, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    while (access(e + n + 1, F_OK) != 0) usleep(2000);
}

// the directories this process made for its run (parents first), and the one it holds the lock of
static struct {
    char path[8][4096];
    int n;
} made;
static int lock_fd = -1;       // dir/.lock, flock'ed until the process ends
static char locked[4096];      // that dir

// At exit, while the lock is still held: its file removed, and the directories this process made
// for the run removed again if they hold nothing else (a run that stopped on a bad input leaves none
// behind). A process that holds no lock (refused) removes nothing: the directory it made may be the
// one another process won meanwhile.
static void release_dir(void) {
    if (lock_fd < 0) return;
    char lock[4200];
    path_join(lock, sizeof lock, locked, ".lock");
    unlink(lock);
    int i = made.n - 1;
    while (i >= 0 && strcmp(made.path[i], locked)) i--;  // the locked one, if this process made it,
    for (; i >= 0 && rmdir(made.path[i]) == 0; i--) {}    // and its parents: rmdir removes only what is empty
}
// mkdir, remembered (for release_dir) when this call made it; 1 when it did, 0 when it existed
static int mkdir_made(const char *p) {
    if (mkdir(p, 0755) == 0) {
        if (made.n < 8) snprintf(made.path[made.n++], sizeof made.path[0], "%s", p);
        return 1;
    }
    if (errno != EEXIST) die("cannot create directory %s (%s): does its parent exist and is it writable?", p, strerror(errno));
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

// whether the name path still names the file fd has open (a lock file can be replaced or removed
// between a process's open and its flock)
static int still_named(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}
// A lock file in full before anyone can see it: this process's pid written into a new file of dir
// (path into tmp), flock'ed; it becomes dir/.lock by link or rename, so .lock never names a file
// without its holder's pid.
static int new_lock_file(const char *dir, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s/.lock-XXXXXX", dir);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) die("cannot write in output directory %s (%s): give another --output_dir", dir, strerror(errno));
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (write(fd, pid, n) != n || fchmod(fd, 0644) != 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        unlink(tmp);
        die("cannot write in output directory %s (%s): give another --output_dir", dir, strerror(e));
    }
    return fd;
}
// the pid in a lock file that another process holds (into pid); 0 when that is no live process: a
// process that took over the lock file of one that ended is about to replace it with its own
static int holder_pid(int fd, char *pid, size_t cap) {
    ssize_t k = pread(fd, pid, cap - 1, 0);
    pid[k > 0 ? k : 0] = 0;
    pid[strcspn(pid, "\n")] = 0;
    return pid[0] && (kill(atoi(pid), 0) == 0 || errno != ESRCH);
}

// One run at a time in a directory: dir/.lock held with flock (the kernel lets it go when the process
// ends, however it ends), with the holder's pid in it for the message of the run that finds it taken.
// The lock file is made whole under another name and then linked to .lock (none there) or renamed over
// it (one there, left by a process that ended: taken first, so that no third process takes it meanwhile).
static void lock_dir(const char *dir) {
    char p[4200], tmp[4200], pid[32] = "";
    path_join(p, sizeof p, dir, ".lock");
    int fd = new_lock_file(dir, tmp, sizeof tmp);
    for (int tries = 0;; tries++) {
        if (link(tmp, p) == 0) break;
        int e = errno, old = e == EEXIST ? open(p, O_RDWR | O_CLOEXEC) : -1;
        if (old < 0 && e == EEXIST && errno == ENOENT) continue;  // removed meanwhile: link again
        if (old < 0) {
            e = e == EEXIST ? errno : e;
            unlink(tmp);
            die("cannot write in output directory %s (%s): give another --output_dir", dir, strerror(e));
        }
        if (flock(old, LOCK_EX | LOCK_NB) == 0) {  // its holder ended: ours replaces it
            int named = still_named(old, p), ok = named && rename(tmp, p) == 0;
            e = errno;
            close(old);
            if (ok) break;
            if (named) {
                unlink(tmp);
                die("cannot write %s (%s): give another --output_dir", p, strerror(e));
            }
            continue;
        }
        int live = holder_pid(old, pid, sizeof pid), named = still_named(old, p);
        close(old);
        if (named && (live || tries >= 1000)) {
            unlink(tmp);
            close(fd);
            die("%s is in use by another run (pid %s): wait for it to end, or give another --output_dir", dir,
                pid[0] ? pid : "unknown");
        }
        usleep(1000);  // being replaced: look again (for a second at most)
    }
    unlink(tmp);  // (after the rename: no such name left)
    if (lock_fd >= 0) close(lock_fd);
    lock_fd = fd;
    if (!locked[0]) atexit(release_dir);
    snprintf(locked, sizeof locked, "%s", dir);
    test_pause("lock_taken");
}

// what the removals of a killed run left in dir (an interrupted --save_total_limit, --overwrite_output_dir
// or checkpoint write), removed now that this run holds the directory
static void finish_removals(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int k;
        char tail[16], p[4200];
        int deleting = !strncmp(e->d_name, ".checkpoint-", 12) && strstr(e->d_name, ".deleting");
        int partial = !strncmp(e->d_name, "checkpoint-", 11) && sscanf(e->d_name + 11, "%d%15s", &k, tail) == 2 && !strcmp(tail, ".tmp");
        if (!deleting && !partial && strncmp(e->d_name, ".overwritten-", 13)) continue;
        path_join(p, sizeof p, dir, e->d_name);
        rm_rf(p);
        printf("removed %s (left by a run that was killed)\n", p);
    }
    if (d) closedir(d);
}

void dir_claim(const char *dir, int parents) {
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) die("output directory %s exists and is not a directory: give another --output_dir", dir);
    if (parents) mkdir_p_made(dir);
    else mkdir_made(dir);
    test_pause("dir_made");
    lock_dir(dir);
}

int run_dir_claim(const char *dir, int resume, int overwrite) {
    dir_claim(dir, 1);
    finish_removals(dir);
    int last = last_checkpoint(dir);
    if (last >= 0 && !resume && !overwrite)
        die("%s already holds checkpoint-%d: pass --resume to continue it, --overwrite_output_dir to start over, or another --output_dir",
            dir, last);
    if (resume && last < 0) die("--resume: no checkpoint-N in %s", dir);
    return overwrite ? -1 : last;
}

int run_dir_claim_new(const char *parent, const char *prefix, char *dir, size_t cap) {
    struct stat sb;
    if (stat(parent, &sb) == 0 && !S_ISDIR(sb.st_mode)) die("%s exists and is not a directory: give an --output_dir", parent);
    mkdir_p_made(parent);
    int n = newest_numbered(parent, prefix, 0);
    for (n = n < 0 ? 1 : n + 1;; n++) {  // the next number; mkdir claims it, so two runs started at once never share one
        snprintf(dir, cap, "%s/%s-%d", parent, prefix, n);
        if (mkdir_made(dir)) break;
    }
    test_pause("dir_made");
    lock_dir(dir);
    return n;
}

// After dir_claim(dir): tmp, a finished directory beside it, put in dir's place in one step (renameat2's
// exchange), the lock held throughout (tmp gets a held .lock of its own first); what dir held before,
// now under tmp's name, removed.
void dir_replace(const char *dir, const char *tmp) {
    char p[4200], t[4200];
    path_join(p, sizeof p, tmp, ".lock");
    int fd = new_lock_file(tmp, t, sizeof t);
    if (rename(t, p) != 0) die("cannot write %s (%s)", p, strerror(errno));
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) != 0) {
        // (a file system without the exchange: the old one moved aside first; a process that makes
        // dir in between makes the second rename fail, and the old one is put back)
        char old[4200];
        snprintf(old, sizeof old, "%s.old-%d", dir, (int)getpid());
        if (rename(dir, old) != 0) die("cannot move %s aside (%s)", dir, strerror(errno));
        if (rename(tmp, dir) != 0) {
            int e = errno;
            if (rename(old, dir) != 0) die("cannot rename %s to %s (%s); the previous one is in %s", tmp, dir, strerror(e), old);
            die("cannot rename %s to %s (%s)", tmp, dir, strerror(e));
        }
        if (rename(old, tmp) != 0) die("cannot rename %s to %s (%s)", old, tmp, strerror(errno));
    }
    close(lock_fd);  // (its file, the old .lock, now in tmp)
    lock_fd = fd;
    rm_rf(tmp);
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
    // in between leaves is out of the names a resume or a reader of metrics.jsonl looks at (and
    // removed by the next run's claim)
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
        if (run_file(e->d_name) && rename(from, to) != 0)
            die("--overwrite_output_dir: cannot move %s aside (%s)", from, strerror(errno));
    }
    if (d) closedir(d);
    rm_rf(trash);
}


static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// TRL's save_total_limit, called once checkpoint-`newest` is complete (renamed into place):
// delete dir's oldest checkpoints until at most `limit` remain, never `newest` itself nor `keep`
// (the one this run resumed from; -1: none); checkpoints numbered above newest are not counted
// nor touched. Each goes atomically as far as --resume can tell: first renamed out of the
// checkpoint-N names (to a hidden .checkpoint-N.deleting, which the next run in the directory
// finishes removing if this one is killed: run_dir_claim), then removed, so a half-deleted
// checkpoint is never taken for one to resume. (Only the holder of the directory's lock calls it.)
void rotate_checkpoints(const char *dir, int limit, int newest, int keep, int quiet) {
    DIR *d = opendir(dir);
    if (!d) return;
    int *steps = NULL, n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int k;
        char tail, p[4200];
        path_join(p, sizeof p, dir, e->d_name);
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
        test_pause("pruning");
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

// j as dir/name (atomically), and freed
static void write_json(const char *dir, const char *name, cJSON *j) {
    char *text = cJSON_Print(j), p[4300];
    cJSON_Delete(j);
    path_join(p, sizeof p, dir, name);
    write_file_atomic(p, text, strlen(text));
    free(text);
}

// A file's bytes as a 64-bit hash, read in 1 MiB pieces: four lanes of a multiply-rotate over 8-byte
// words (independent, so that their multiplies overlap), the tail's bytes last, the lanes and the size
// mixed at the end. Not cryptographic: enough to tell a truncated, damaged or replaced file, at about
// the speed the file is read. Its size into *size; -1 when it cannot be read.
static int file_hash(const char *path, uint64_t *hash, long long *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    enum { PIECE = 1 << 20 };
    uint64_t *buf = (uint64_t *)mallocCheck(PIECE), h[4] = {1, 2, 3, 4};
    long long total = 0;
    ssize_t k = 1;
    while (k > 0) {
        size_t got = 0;  // a whole piece (a multiple of 32 bytes), or the file's last bytes
        while (got < PIECE && (k = read(fd, (char *)buf + got, PIECE - got)) > 0) got += (size_t)k;
        for (size_t i = 0; i < got / 8; i++) {
            uint64_t x = h[i % 4] ^ buf[i];
            h[i % 4] = ((x << 31) | (x >> 33)) * 0xbf58476d1ce4e5b9ull;
        }
        for (size_t i = got / 8 * 8; i < got; i++) h[0] = (h[0] ^ ((unsigned char *)buf)[i]) * 0x100000001b3ull;
        total += (long long)got;
    }
    free(buf);
    close(fd);
    if (k < 0) return -1;
    uint64_t x = (uint64_t)total;
    for (int i = 0; i < 4; i++) {
        x ^= h[i];
        x = splitmix64(&x);
    }
    *hash = x;
    *size = total;
    return 0;
}

// dir's files (not manifest.json), sorted by name, into names (freed by the caller, each too); their count
static int dir_files(const char *dir, char ***names) {
    DIR *d = opendir(dir);
    if (!d) die("cannot read %s (%s)", dir, strerror(errno));
    int n = 0, cap = 0;
    *names = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[4200];
        path_join(p, sizeof p, dir, e->d_name);
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "manifest.json") || dir_exists(p)) continue;
        if (n == cap) *names = (char **)reallocCheck(*names, (cap = cap ? 2 * cap : 16) * sizeof(char *));
        (*names)[n++] = str_dup(e->d_name);
    }
    closedir(d);
    qsort(*names, n, sizeof(char *), cmp_str);
    return n;
}

// manifest.json, written last into a checkpoint: {"files": {name: {"size": bytes, "hash": "16 hex"}}}
// for every other file in it (trainer_state.json included)
static void write_manifest(const char *dir) {
    char **names;
    int n = dir_files(dir, &names);
    cJSON *m = cJSON_CreateObject(), *files = cJSON_AddObjectToObject(m, "files");
    for (int i = 0; i < n; i++) {
        char p[4300], hex[17];
        uint64_t h;
        long long size;
        path_join(p, sizeof p, dir, names[i]);
        if (file_hash(p, &h, &size) != 0) die("cannot read %s (%s)", p, strerror(errno));
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        cJSON *f = cJSON_AddObjectToObject(files, names[i]);
        cJSON_AddNumberToObject(f, "size", (double)size);
        cJSON_AddStringToObject(f, "hash", hex);
        free(names[i]);
    }
    free(names);
    write_json(dir, "manifest.json", m);
}

void checkpoint_check_files(const char *dir) {
    char p[4300];
    path_join(p, sizeof p, dir, "manifest.json");
    if (!file_exists(p))
        die("%s has no manifest.json (the sizes and checksums of its files; an earlier version wrote none), so its files "
            "cannot be checked: start over with --overwrite_output_dir, or resume it with the version that wrote it", dir);
    char *text = read_file(p, NULL);
    cJSON *m = cJSON_Parse(text);
    free(text);
    cJSON *files = cJSON_GetObjectItemCaseSensitive(m, "files"), *f;
    if (!cJSON_IsObject(files)) die("%s: not valid JSON with a \"files\" object: the checkpoint is damaged", p);
    cJSON_ArrayForEach(f, files) {
        char q[4300], hex[17];
        const cJSON *sz = cJSON_GetObjectItemCaseSensitive(f, "size"), *hs = cJSON_GetObjectItemCaseSensitive(f, "hash");
        if (!cJSON_IsNumber(sz) || !cJSON_IsString(hs) || strchr(f->string, '/') || f->string[0] == '.')
            die("%s: the entry of \"%s\" is not {\"size\": N, \"hash\": \"HEX\"}: the checkpoint is damaged", p, f->string);
        path_join(q, sizeof q, dir, f->string);
        uint64_t h;
        long long size;
        if (file_hash(q, &h, &size) != 0)
            die("%s: cannot read it (%s): the checkpoint is incomplete; resume an earlier checkpoint-N (remove this one) or "
                "start over with --overwrite_output_dir", q, strerror(errno));
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        const char *fix = "the checkpoint is damaged: resume an earlier checkpoint-N (remove this one) or start over with "
                          "--overwrite_output_dir";
        if (size != (long long)sz->valuedouble)
            die("%s is %lld bytes where its manifest.json says %.0f: %s", q, size, sz->valuedouble, fix);
        if (strcmp(hex, hs->valuestring)) die("%s does not match its checksum in manifest.json (%s, not %s): %s", q, hex, hs->valuestring, fix);
    }
    char **names, extra[256] = "";
    int n = dir_files(dir, &names);
    for (int i = 0; i < n; i++) {
        if (!extra[0] && !cJSON_GetObjectItemCaseSensitive(files, names[i])) snprintf(extra, sizeof extra, "%s", names[i]);
        free(names[i]);
    }
    free(names);
    cJSON_Delete(m);
    if (extra[0]) die("%s/%s is not in its manifest.json: not a file this checkpoint was written with; remove it", dir, extra);
}

void checkpoint_begin(const char *out_dir, int step, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s/checkpoint-%d.tmp", out_dir, step);
    rm_rf(tmp);  // what a killed run left
    mkdir_or_die(tmp);
}

void checkpoint_commit(const char *out_dir, int step, const char *tmp, const cJSON *run) {
    cJSON *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "global_step", step);
    cJSON_AddItemToObject(st, "run", cJSON_Duplicate(run, 1));
    write_json(tmp, "trainer_state.json", st);
    write_manifest(tmp);
    char final[4200];
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

// The options a resumed run may give otherwise than the run that wrote the checkpoint: where and how
// often it writes and reports, how long it runs, where it runs and in how much memory. Every other
// option changes what the run computes, and a resume must repeat it (README: Runs never mix).
// per_device_train_batch_size is the programs' train_batch_size (over every rank).
static const char *const RESUME_MAY_CHANGE[] = {
    "output_dir", "resume", "overwrite_output_dir", "max_steps", "num_train_epochs", "logging_steps", "save_steps",
    "save_total_limit", "eval_steps", "eval_size", "quiet", "device", "nproc_per_node", "per_device_train_batch_size",
    "micro_batch_size", "gradient_checkpointing", "recompute_mlp", "gpu_memory_utilization",
    "reward_cmd", "reward_timeout",  // a reward program fixed after a failure: the run goes on with it
};

cJSON *run_options_json(const OptionTable *t) {
    cJSON *j = cJSON_CreateObject();
    for (int i = 0; i < t->n; i++) {
        const Option *o = &t->rows[i];
        int skip = o->kind == OPT_SECTION;
        for (size_t k = 0; !skip && k < sizeof RESUME_MAY_CHANGE / sizeof RESUME_MAY_CHANGE[0]; k++)
            skip = !strcmp(o->name, RESUME_MAY_CHANGE[k]);
        if (skip) continue;
        const char *at = (const char *)t->base + o->off;
        char v[256];
        switch (o->kind) {
        case OPT_INT: cJSON_AddNumberToObject(j, o->name, *(const int *)at); break;
        case OPT_LONG: cJSON_AddNumberToObject(j, o->name, (double)*(const long *)at); break;
        case OPT_DOUBLE: cJSON_AddNumberToObject(j, o->name, *(const double *)at); break;
        case OPT_FLAG: cJSON_AddBoolToObject(j, o->name, *(const int *)at); break;
        case OPT_LIST: {
            const OptList *l = (const OptList *)at;
            cJSON *a = cJSON_AddArrayToObject(j, o->name);
            for (int k = 0; k < l->n; k++) cJSON_AddItemToArray(a, cJSON_CreateString(l->v[k]));
            break;
        }
        case OPT_STRING:
        case OPT_TEXT:
        case OPT_CHOICE:
            if (*(const char *const *)at) cJSON_AddStringToObject(j, o->name, *(const char *const *)at);
            else cJSON_AddNullToObject(j, o->name);
            break;
        default:  // OPT_GRPO, OPT_GRPO_FLAG: as grpo_config_set reads them
            if (grpo_config_get(t->grpo, o->name, v, sizeof v) != 0) die("run_options_json: no GRPO option %s", o->name);
            cJSON_AddStringToObject(j, o->name, v);
        }
    }
    return j;
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
