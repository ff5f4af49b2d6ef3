// test/testutil.h: helpers shared by the Check suites: where the fixtures are,
// a NumPy .npy reader (the fixtures' format), and a main() that runs a suite
// and exits non-zero on any failure.
// Header-only; include after <check.h>.
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "model.h"             // hf_vision_tensor
#include "io/safetensors.h"

// fixtures live in test/fixtures (run from the repo root, as make test does)
static inline const char *fixture_dir(void) {
    const char *d = getenv("FIXTURES");
    return d ? d : "test/fixtures";
}
static inline void fixture_path(char *out, size_t cap, const char *rel) { path_join(out, cap, fixture_dir(), rel); }

// random values with log-normal magnitudes (sigma binades), random signs; never zero
static inline void fill_random(float *x, size_t n, Rng *r, float sigma) {
    for (size_t i = 0; i < n; i++) {
        float v = expf(rng_normal(r) * sigma);
        x[i] = rng_uniform(r) < 0.5f ? -v : v;
    }
}

// the one warm-up cache of the built-in model in dir (train_grpo's dir/warmup-<key of its settings>)
// into out
#include <glob.h>
static inline void warm_dir_in(const char *dir, char *out, size_t cap) {
    char pat[8300];
    snprintf(pat, sizeof pat, "%s/warmup-*", dir);
    glob_t g;
    ck_assert_msg(glob(pat, 0, NULL, &g) == 0 && g.gl_pathc == 1, "%s: not one warm-up", pat);
    snprintf(out, cap, "%s", g.gl_pathv[0]);
    globfree(&g);
}

// The suites that run the programs keep the built-in model's warm-up cache (train/builtin.h:
// $XDG_CACHE_HOME/fp8-grpo) in a directory of their own, not the user's: XDG_CACHE_HOME=dir/cache for
// every program they start from now on. warm_cache: that cache's directory (dir/cache/fp8-grpo);
// warm_cached: the one warm-up in it.
static inline void use_cache_in(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/cache", dir);
    ck_assert(setenv("XDG_CACHE_HOME", p, 1) == 0);
}
static inline const char *warm_cache(void) {
    static char p[1024];
    ck_assert_msg(getenv("XDG_CACHE_HOME"), "use_cache_in first");
    snprintf(p, sizeof p, "%.1000s/fp8-grpo", getenv("XDG_CACHE_HOME"));
    return p;
}
static inline void warm_cached(char *out, size_t cap) { warm_dir_in(warm_cache(), out, cap); }

// A checkpoint written from the one in base_dir (an export, a full fine-tune's): the same tensor names, and a
// multimodal Gemma 3's vision tower and projector byte for byte; returns how many of those there are
static inline int assert_whole_checkpoint(const char *base_dir, const char *out_dir) {
    SafeTensors a, b;
    st_open_dir(&a, base_dir);
    st_open_dir(&b, out_dir);
    ck_assert_int_eq(a.n, b.n);
    int nv = 0;
    for (int i = 0; i < a.n; i++) {
        const STensor *x = &a.t[i], *y = st_find(&b, x->name);
        ck_assert_msg(y, "%s has no %s", out_dir, x->name);
        if (!hf_vision_tensor(x->name)) continue;
        nv++;
        ck_assert_msg(y->dtype == x->dtype && y->ndim == x->ndim && !memcmp(y->shape, x->shape, sizeof x->shape) &&
                          y->nbytes == x->nbytes && !memcmp(y->data, x->data, x->nbytes),
                      "%s: %s changed", out_dir, x->name);
    }
    st_close(&a);
    st_close(&b);
    return nv;
}

// A loaded .npy array: data converted to double (float32/float64/int32/int64/uint8/bool),
// shape up to 4 dims.
typedef struct {
    double *data;
    int ndim;
    long shape[4];
    long n;
} Npy;

static inline void npy_free(Npy *a) { free(a->data); a->data = NULL; }

// Reads a little-endian C-order .npy (version 1 or 2); dies on anything else.
static inline Npy npy_read(const char *path) {
    Npy a = {0};
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open fixture %s: run from the repo root (make test), or regenerate with dev/make_fixtures.py", path);
    unsigned char magic[8];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "\x93NUMPY", 6) != 0) die("%s: not a .npy file", path);
    uint32_t hlen = 0;
    if (magic[6] == 1) {
        uint16_t h16;
        if (fread(&h16, 2, 1, f) != 1) die("%s: truncated header", path);
        hlen = h16;
    } else if (fread(&hlen, 4, 1, f) != 1) die("%s: truncated header", path);
    char *hdr = (char *)callocCheck(hlen + 1, 1);
    if (fread(hdr, 1, hlen, f) != hlen) die("%s: truncated header", path);
    char *descr = strstr(hdr, "'descr':");
    if (!descr) die("%s: no descr", path);
    char typ[8] = {0};
    if (sscanf(descr, "'descr': '%7[^']'", typ) != 1) die("%s: bad descr", path);
    if (strstr(hdr, "'fortran_order': True")) die("%s: fortran order not supported", path);
    char *sh = strstr(hdr, "'shape': (");
    if (!sh) die("%s: no shape", path);
    sh += strlen("'shape': (");
    a.n = 1;
    while (*sh && *sh != ')') {
        char *end;
        long v = strtol(sh, &end, 10);
        if (end == sh) { sh++; continue; }
        if (a.ndim == 4) die("%s: more than 4 dims", path);
        a.shape[a.ndim++] = v;
        a.n *= v;
        sh = end;
    }
    free(hdr);
    size_t esz;
    if (!strcmp(typ, "<f4") || !strcmp(typ, "<i4")) esz = 4;
    else if (!strcmp(typ, "<f8") || !strcmp(typ, "<i8")) esz = 8;
    else if (!strcmp(typ, "|u1") || !strcmp(typ, "|b1") || !strcmp(typ, "|i1")) esz = 1;
    else die("%s: unsupported dtype %s", path, typ);
    unsigned char *raw = (unsigned char *)mallocCheck(a.n * esz);
    if (fread(raw, esz, a.n, f) != (size_t)a.n) die("%s: truncated data", path);
    fclose(f);
    a.data = (double *)mallocCheck(a.n * sizeof(double));
    for (long i = 0; i < a.n; i++) {
        if (!strcmp(typ, "<f4")) { float v; memcpy(&v, raw + 4 * i, 4); a.data[i] = v; }
        else if (!strcmp(typ, "<i4")) { int32_t v; memcpy(&v, raw + 4 * i, 4); a.data[i] = v; }
        else if (!strcmp(typ, "<f8")) { double v; memcpy(&v, raw + 8 * i, 8); a.data[i] = v; }
        else if (!strcmp(typ, "<i8")) { int64_t v; memcpy(&v, raw + 8 * i, 8); a.data[i] = (double)v; }
        else if (!strcmp(typ, "|i1")) a.data[i] = (signed char)raw[i];
        else a.data[i] = raw[i];
    }
    free(raw);
    return a;
}

// max |a - b| over n values
static inline double max_abs_diff_d(const double *a, const double *b, long n) {
    double m = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (d > m || d != d) m = d;
    }
    return m;
}
static inline double max_abs_d(const double *a, long n) {
    double m = 0;
    for (long i = 0; i < n; i++) if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

// Catching die(): EXPECT_DIE(statement, "part of the message") runs the statement and
// passes only if it calls die() with a one-line message containing the given text.
// die() ends a program, which frees everything; jumping out of it instead leaves behind what the
// statement had allocated, so LeakSanitizer (make test SAN=1) is told to ignore the statement's
// allocations (__lsan_disable: weak, absent outside the sanitizer build); all others are checked.
#include <setjmp.h>
__attribute__((weak)) void __lsan_disable(void);
__attribute__((weak)) void __lsan_enable(void);
static jmp_buf testutil_jb;
static char testutil_err[1024];
__attribute__((unused)) static void testutil_hook(const char *msg) {
    snprintf(testutil_err, sizeof testutil_err, "%s", msg);
    longjmp(testutil_jb, 1);
}
__attribute__((unused)) static void testutil_lsan(int off) {
    if (off && __lsan_disable) __lsan_disable();
    if (!off && __lsan_enable) __lsan_enable();
}
#define EXPECT_DIE(stmt, substr)                                                                     \
    do {                                                                                             \
        testutil_err[0] = 0;                                                                         \
        die_hook = testutil_hook;                                                                    \
        testutil_lsan(1);                                                                            \
        if (!setjmp(testutil_jb)) {                                                                  \
            stmt;                                                                                    \
            die_hook = NULL;                                                                         \
            testutil_lsan(0);                                                                        \
            ck_abort_msg("expected an error containing '%s', got none", substr);                     \
        }                                                                                            \
        die_hook = NULL;                                                                             \
        testutil_lsan(0);                                                                            \
        ck_assert_msg(strstr(testutil_err, substr), "error '%s' does not mention '%s'", testutil_err, \
                      substr);                                                                       \
        ck_assert_msg(!strchr(testutil_err, '\n'), "error '%s' is not one line", testutil_err);        \
    } while (0)

// Run one suite; exit status is the number of failures (0 = all passed).
// Check prints "NN%: Checks: X, Failures: Y, Errors: Z" which make test sums.
static inline int run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf == 0 ? 0 : 1;
}

#endif  // TESTUTIL_H
