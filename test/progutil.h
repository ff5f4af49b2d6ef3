// test/progutil.h: what the suites that run the programs share: a temporary directory for the
// run's files, a shell command's status and output, files compared byte for byte, metrics.jsonl
// read back, and the built-in model as a checkpoint directory to train. Header-only; include after
// testutil.h, with TMP_TEMPLATE defined first ("/tmp/fp8grpo_<suite>XXXXXX").
#ifndef PROGUTIL_H
#define PROGUTIL_H

#include <cjson/cJSON.h>
#include <sys/wait.h>

#include "testutil.h"
#include "io/safetensors.h"  // read_file, write_file_atomic
#include "train/checkpoint.h"  // dir_exists

static char base_dir[] = TMP_TEMPLATE;

// a path in this run's temporary directory; made at the first call, with the warm-up cache of the
// programs started from then on in it (use_cache_in)
static const char *tmp_path(const char *name) {
    static char p[8][1200];
    static int k = 0;
    static int made = 0;
    if (!made) ck_assert(mkdtemp(base_dir)), use_cache_in(base_dir), made = 1;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", base_dir, name);
    return p[k];
}

static void write_text(const char *path, const char *text) { write_file_atomic(path, text, strlen(text)); }

// run a shell command: its exit status, stdout and stderr together in out
static int run_cmd(const char *cmd, char *out, size_t cap) {  // cmd: up to 4096 bytes
    char full[4200];
    snprintf(full, sizeof full, "{ %s ; } 2>&1", cmd);
    FILE *p = popen(full, "r");
    ck_assert(p);
    size_t n = fread(out, 1, cap - 1, p);
    while (fgetc(p) != EOF) {}
    out[n] = 0;
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static inline int same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    int same = na == nb && !memcmp(x, y, na);
    free(x), free(y);
    return same;
}

// the value of key ("loss") in metrics.jsonl's line for step (NAN: none); each line read as JSON
// (train_sft/train_dpo write "step": with a space, train_grpo without)
static double metrics_value(const char *dir, int step, const char *key) {
    char p[1300];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    char *text = read_file(p, NULL), *line = text;
    double v = NAN;
    for (char *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(line), *s = cJSON_GetObjectItem(j, "step"), *x = cJSON_GetObjectItem(j, key);
        if (cJSON_IsNumber(s) && s->valueint == step && cJSON_IsNumber(x)) v = x->valuedouble;
        cJSON_Delete(j);
    }
    free(text);
    return v;
}
static inline double metrics_loss(const char *dir, int step) { return metrics_value(dir, step, "loss"); }

// A checkpoint directory with a tokenizer, into dir: the built-in model after a short warm-up
// (./train_grpo writes it as a Hugging Face checkpoint with tokenizer.json, in the warm-up cache)
static inline void warm_model(char *dir, size_t cap) {
    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd, "./train_grpo --device cpu --quiet --eval_size 0 --warmup_sft_steps 3 --max_steps 1 "
                              "--per_device_train_batch_size 8 --output_dir %s",
             tmp_path("grpo"));
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    warm_cached(dir, cap);
}

// A JSONL reader under test: reads path; 0 (what it read freed), or -1 with the message in err (and
// nothing left allocated: the wrapper checks its outputs)
typedef int (*JsonlReadFn)(const char *path, char *err, size_t cap);
typedef struct {
    const char *line, *msg;  // a bad line, and what its error must say
} BadLine;
// a JsonlReadFn named name over a reader of sft_read_jsonl's signature (path, T **out, long *n, err,
// cap) and its free (T *, long): on an error it must return nothing (*out NULL, *n 0)
#define JSONL_READER(name, T, read_all, free_all)                  \
    static int name(const char *path, char *err, size_t cap) {     \
        T *t = (T *)1;                                             \
        long n = 7;                                                \
        int rc = read_all(path, &t, &n, err, cap);                 \
        if (rc == 0) free_all(t, n);                               \
        else ck_assert(t == NULL && n == 0);                       \
        return rc;                                                 \
    }
// each case as line 2 of a file whose line 1 (good) is read fine: -1 and one line "path:2: ...msg..."
static inline void expect_bad_lines(JsonlReadFn read, const char *good, const BadLine *cases, size_t n) {
    const char *path = tmp_path("bad.jsonl");
    for (size_t i = 0; i < n; i++) {
        char text[2048], err[1024], want[1300];
        snprintf(text, sizeof text, "%s\n%s\n", good, cases[i].line);
        write_text(path, text);
        ck_assert_msg(read(path, err, sizeof err) == -1, "case %zu accepted", i);
        snprintf(want, sizeof want, "%s:2: ", path);
        ck_assert_msg(strstr(err, want) == err, "case %zu: '%s' does not start with '%s'", i, err, want);
        ck_assert_msg(strstr(err, cases[i].msg), "case %zu: '%s' lacks '%s'", i, err, cases[i].msg);
        ck_assert_msg(!strchr(err, '\n'), "case %zu: not one line: '%s'", i, err);
    }
}

// A bad invocation: exit status not 0, and on stderr one line "error: ..." that holds msg
typedef struct {
    const char *a, *b, *c, *msg;  // three pieces of the command line, and what the error must say
} BadCase;
// each case as "rm -rf dir && <prog> --output_dir dir a b c": a one-line error, and dir not left behind
// (a run that stops on a bad input leaves no directory)
static inline void expect_bad_runs(const char *prog, const char *dir, const BadCase *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char cmd[4096], out[4096];
        snprintf(cmd, sizeof cmd, "rm -rf %s && %s --output_dir %s %s %s %s 2>&1 >/dev/null", dir, prog, dir, cases[i].a, cases[i].b,
                 cases[i].c);
        int rc = run_cmd(cmd, out, sizeof out);
        ck_assert_msg(rc != 0, "case %zu exited 0", i);
        ck_assert_msg(strstr(out, cases[i].msg), "case %zu: '%s' lacks '%s'", i, out, cases[i].msg);
        ck_assert_msg(!strncmp(out, "error: ", 7) && strchr(out, '\n') == out + strlen(out) - 1, "case %zu: not one error line: '%s'", i, out);
        ck_assert_msg(!dir_exists(dir), "case %zu left %s behind", i, dir);
    }
}

// at the end of main: a passed suite's temporary directory removed (kept on a failure, to look at); rc passed on
static int tmp_cleanup(int rc) {
    if (rc == 0 && !strstr(base_dir, "XXXXXX")) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf %s", base_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base_dir);
    }
    return rc;
}

#endif  // PROGUTIL_H
