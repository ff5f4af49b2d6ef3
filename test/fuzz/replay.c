// test/fuzz/replay.c: the main() of a fuzz target built without libFuzzer (make fuzz-replay, and
// CI with SAN=1): LLVMFuzzerTestOneInput on every file of the directories (or files) given, in
// name order, each within FUZZ_TIMEOUT seconds (default 10: a hang is a finding). It prints
// one line: the inputs, how many loaded and how many were rejected with a one-line error;
// -v also each input's outcome. Exit 0, or 1 on a timeout; a sanitizer report ends it first.
//
//   build/fuzz_model test/fuzz/corpus/model            (-v: the error line of each input)
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *fuzz_last_error(void);

static const char *current;
static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "replay: timeout (FUZZ_TIMEOUT) on ";
    if (write(2, msg, sizeof msg - 1) < 0 || write(2, current, strlen(current)) < 0 || write(2, "\n", 1) < 0) _exit(1);
    _exit(1);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + len, 1, cap - len, f)) > 0)
        if ((len += k) == cap) buf = realloc(buf, cap *= 2);
    fclose(f);
    *n = len;
    return buf;
}

int main(int argc, char **argv) {
    int verbose = 0, nloaded = 0, nrejected = 0, nfiles = 0;
    char **files = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) { verbose = 1; continue; }
        struct stat sb;
        if (stat(argv[i], &sb) != 0) { fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]); return 1; }
        if (!S_ISDIR(sb.st_mode)) {
            files = realloc(files, (nfiles + 1) * sizeof *files);
            files[nfiles++] = strdup(argv[i]);
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            files = realloc(files, (nfiles + 1) * sizeof *files);
            files[nfiles] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
            sprintf(files[nfiles++], "%s/%s", argv[i], e->d_name);
        }
        if (d) closedir(d);
    }
    qsort(files, nfiles, sizeof *files, cmp_str);
    const char *t = getenv("FUZZ_TIMEOUT");
    int timeout = t ? atoi(t) : 10;
    signal(SIGALRM, on_alarm);
    LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 0; i < nfiles; i++) {
        size_t n;
        void *data = read_all(files[i], &n);
        if (!data) { fprintf(stderr, "replay: cannot read %s\n", files[i]); return 1; }
        current = files[i];
        alarm(timeout);
        LLVMFuzzerTestOneInput((const uint8_t *)data, n);
        alarm(0);
        const char *err = fuzz_last_error();
        if (err[0]) nrejected++;
        else nloaded++;
        if (verbose) printf("%s: %s%s\n", files[i], err[0] ? "error: " : "loaded", err);
        free(data);
        free(files[i]);
    }
    free(files);
    const char *name = strrchr(argv[0], '/');
    printf("%s: %d inputs replayed, %d loaded, %d rejected with a one-line error\n", name ? name + 1 : argv[0], nfiles, nloaded,
           nrejected);
    return 0;
}
