// test/fuzz/fuzz.h: what the fuzz targets (test/fuzz/fuzz_*.c) share. Header-only; each target
// includes it once and defines its body with FUZZ_TARGET.
//
// An input is one or more files: their contents one after another, separated by the line
// FUZZ_SEP ("\n--8<--\n"); fuzz_files writes the k-th part to the k-th of the target's file names
// in a scratch directory (a part missing: no file), and the body runs the loaders on that
// directory, as the programs do. A loader that rejects its input calls die(): that is the
// expected outcome of a bad input, not a finding. die_hook jumps back here; the message must be
// one line.
//
// Findings: what the sanitizers report (libFuzzer and make fuzz-replay SAN=1 stop at the first),
// a hang (libFuzzer's -timeout, FUZZ_TIMEOUT in replay.c), an error of more than one line, and
// memory an input that loaded leaves allocated (a leak on a path that succeeds).
//
// Memory: a program ends at die(), which frees everything; jumping out of it instead leaves
// behind what the loaders had allocated. Under the sanitizers, their malloc/free hooks keep the
// set of blocks the running input holds: after a die() they are freed (a run of millions of
// rejected inputs would otherwise grow without bound), after a success any left is the leak
// finding above; LeakSanitizer is told to ignore the input's allocations (__lsan_disable), as
// the hooks judge them. The files a rejected input had mapped are unmapped likewise. What a loader allocates once and keeps (NFC tables) must be made before
// the first input, in the target's init.
//
//   FUZZ_TARGET(body, init, "config.json", "model.safetensors")
//       body(const char *dir, const uint8_t *rest, size_t nrest): the loaders on dir, which holds
//       the files; rest is what follows the files in the input (NULL, 0: nothing)
#ifndef FUZZ_H
#define FUZZ_H

#include <dirent.h>
#include <link.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"

// The harness's own code is not the fuzzed program: no coverage (its comparisons would feed the
// fuzzer noise) and no sanitizer checks (they would cost every malloc and free twice); unused is
// for test/test_inputs.c, which includes this file for fuzz_files alone.
#ifdef __clang__
#define FUZZ_HARNESS __attribute__((unused, no_sanitize("coverage", "address", "undefined")))
#else
#define FUZZ_HARNESS __attribute__((unused, no_sanitize("address", "undefined")))
#endif

#define FUZZ_SEP "\n--8<--\n"

// the sanitizers' interfaces, weak: absent (NULL) in the plain replay build
__attribute__((weak)) void __lsan_disable(void);
__attribute__((weak)) void __lsan_enable(void);

__attribute__((unused)) static char fuzz_dir[256];             // the scratch directory, made once per process
__attribute__((unused)) static char fuzz_error[1024];          // the last input's error ("" when it loaded)
__attribute__((unused)) static jmp_buf fuzz_jb;
FUZZ_HARNESS static void fuzz_hook(const char *msg) {
    snprintf(fuzz_error, sizeof fuzz_error, "%s", msg);
    longjmp(fuzz_jb, 1);
}

FUZZ_HARNESS static void fuzz_cleanup(void) {
    DIR *d = opendir(fuzz_dir);
    if (!d) return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", fuzz_dir, e->d_name), unlink(p);
    closedir(d);
    rmdir(fuzz_dir);
}
FUZZ_HARNESS static const char *fuzz_scratch(void) {
    if (!fuzz_dir[0]) {  // tmpfs when there is one: the files are rewritten for every input
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/fp8grpo-fuzz-XXXXXX", base);
        if (!mkdtemp(fuzz_dir)) fprintf(stderr, "fuzz: cannot make %s\n", fuzz_dir), abort();
        atexit(fuzz_cleanup);
    }
    return fuzz_dir;
}

// the parts of data as the files names[0..n) of the scratch directory; returns what follows them
FUZZ_HARNESS static const uint8_t *fuzz_files(const uint8_t *data, size_t size, const char *const *names, int n, size_t *nrest) {
    const char *dir = fuzz_scratch();
    const uint8_t *p = data, *end = data + size;
    size_t sl = strlen(FUZZ_SEP);
    for (int i = 0; i < n; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!p) {  // no more parts: no file
            unlink(path);
            continue;
        }
        const uint8_t *q = (const uint8_t *)memmem(p, (size_t)(end - p), FUZZ_SEP, sl);
        size_t len = q ? (size_t)(q - p) : (size_t)(end - p);
        FILE *f = fopen(path, "wb");
        if (!f || (len && fwrite(p, 1, len, f) != len) || fclose(f) != 0) fprintf(stderr, "fuzz: cannot write %s\n", path), abort();
        p = q ? q + sl : NULL;
    }
    *nrest = p ? (size_t)(end - p) : 0;
    return p;
}


// ---- the blocks the running input holds: an open-addressing set of addresses, filled by the
// sanitizer's hooks (which must not allocate: static arrays), emptied after each input
__attribute__((weak)) int __sanitizer_install_malloc_and_free_hooks(void (*m)(const volatile void *, size_t),
                                                                    void (*f)(const volatile void *));
#define FUZZ_SLOTS (1 << 15)
__attribute__((unused)) static uintptr_t fuzz_slot[FUZZ_SLOTS];  // 0: empty, 1: freed
__attribute__((unused)) static uint32_t fuzz_used[FUZZ_SLOTS / 2];  // the slots set since the last reset
__attribute__((unused)) static int fuzz_nused, fuzz_overflow;
__attribute__((unused)) static _Thread_local int fuzz_tracking;  // on the thread running the input (not libFuzzer's RSS monitor)
__attribute__((unused)) static volatile int fuzz_lock;
FUZZ_HARNESS static uint32_t fuzz_hash(uintptr_t p) { return (uint32_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> 43) & (FUZZ_SLOTS - 1); }
FUZZ_HARNESS static void fuzz_on_malloc(const volatile void *ptr, size_t size) {
    (void)size;
    if (!fuzz_tracking || !ptr) return;
    while (__atomic_test_and_set(&fuzz_lock, __ATOMIC_ACQUIRE)) {}
    if (fuzz_nused == FUZZ_SLOTS / 2) fuzz_overflow = 1;
    else {
        uint32_t i = fuzz_hash((uintptr_t)ptr);
        while (fuzz_slot[i] > 1) i = (i + 1) & (FUZZ_SLOTS - 1);
        if (fuzz_slot[i] == 0) fuzz_used[fuzz_nused++] = i;
        fuzz_slot[i] = (uintptr_t)ptr;
    }
    __atomic_clear(&fuzz_lock, __ATOMIC_RELEASE);
}
FUZZ_HARNESS static void fuzz_on_free(const volatile void *ptr) {
    if (!fuzz_tracking || !ptr) return;
    while (__atomic_test_and_set(&fuzz_lock, __ATOMIC_ACQUIRE)) {}
    for (uint32_t i = fuzz_hash((uintptr_t)ptr); fuzz_slot[i]; i = (i + 1) & (FUZZ_SLOTS - 1))
        if (fuzz_slot[i] == (uintptr_t)ptr) {
            fuzz_slot[i] = 1;
            break;
        }
    __atomic_clear(&fuzz_lock, __ATOMIC_RELEASE);
}
// ---- the OpenMP runtime's own blocks. The CPU kernels size their OpenMP team to the cores other
// processes leave idle (ops_cpu.c, cpu_threads_update), so on a busy machine the team changes size
// during an input; libgomp then allocates a team of the new size on the thread running the input
// and keeps it cached after the parallel region ends (its pool's last team), freeing it only when
// the size changes again. That block is the runtime's, not the loader's: it must be neither
// counted as a leak nor freed after a die() (libgomp would reuse it). A block is the runtime's
// when the code that called malloc, the first frame of its allocation stack (ASan records one for
// every block) outside the sanitizer runtime, lies in libgomp. Exact, and cheap: asked only of
// the blocks still held after an input.
__attribute__((weak)) size_t __asan_get_alloc_stack(void *addr, void **trace, size_t size, int *thread_id);
#define FUZZ_MAX_RANGES 64
__attribute__((unused)) static struct { uintptr_t lo, hi; int omp; } fuzz_range[FUZZ_MAX_RANGES];  // omp: libgomp, else the sanitizers'
__attribute__((unused)) static int fuzz_nrange;
FUZZ_HARNESS static int fuzz_add_ranges(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size, (void)data;
    const char *name = info->dlpi_name, *slash = name ? strrchr(name, '/') : NULL, *base = slash ? slash + 1 : name;
    if (!base) return 0;
    int omp = strstr(base, "libgomp") == base;
    if (!omp && strstr(base, "libasan") != base && strstr(base, "libubsan") != base) return 0;
    for (int i = 0; i < info->dlpi_phnum && fuzz_nrange < FUZZ_MAX_RANGES; i++)
        if (info->dlpi_phdr[i].p_type == PT_LOAD) {
            uintptr_t lo = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
            fuzz_range[fuzz_nrange].lo = lo, fuzz_range[fuzz_nrange].hi = lo + info->dlpi_phdr[i].p_memsz;
            fuzz_range[fuzz_nrange++].omp = omp;
        }
    return 0;
}
// -1: not in libgomp nor a sanitizer runtime; else that range's omp
FUZZ_HARNESS static int fuzz_pc_kind(uintptr_t pc) {
    for (int i = 0; i < fuzz_nrange; i++)
        if (pc >= fuzz_range[i].lo && pc < fuzz_range[i].hi) return fuzz_range[i].omp;
    return -1;
}
FUZZ_HARNESS static int fuzz_runtime_block(uintptr_t p) {
    if (!__asan_get_alloc_stack) return 0;
    void *trace[16];
    int tid;
    size_t n = __asan_get_alloc_stack((void *)p, trace, 16, &tid);
    for (size_t i = 0; i < n; i++) {
        int kind = fuzz_pc_kind((uintptr_t)trace[i]);
        if (kind < 0) return 0;     // the caller of malloc is the program's (or a library's) own code
        if (kind == 1) return 1;    // ... is libgomp
    }
    return 0;
}

// the blocks still held, the OpenMP runtime's left out: freed (free_them) or counted; the set emptied
FUZZ_HARNESS static int fuzz_held(int free_them) {
    int n = 0;
    for (int k = 0; k < fuzz_nused; k++) {
        uintptr_t p = fuzz_slot[fuzz_used[k]];
        fuzz_slot[fuzz_used[k]] = 0;
        if (p > 1 && !fuzz_runtime_block(p)) {
            n++;
            if (free_them) free((void *)p);
        }
    }
    fuzz_nused = 0;
    return n;
}

// after a die(): the scratch files the loaders had mapped (safetensors.c maps its files) unmapped,
// or every rejected input would leave a mapping behind (the next input's truncating write then
// walks all of them, and mmap fails at vm.max_map_count)
FUZZ_HARNESS static void fuzz_unmap_scratch(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return;
    char line[1024];
    size_t dl = strlen(fuzz_dir);
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char *path = strchr(line, '/');
        if (path && !strncmp(path, fuzz_dir, dl) && sscanf(line, "%lx-%lx", &a, &b) == 2) munmap((void *)a, b - a);
    }
    fclose(f);
}

// 1 (the default): the target's loaders may map the input's files (safetensors.c does), and the
// scan above runs after each rejected input; a target whose loaders only read their files sets
// it to 0 in its init (the scan of /proc/self/maps is a tenth of the tokenizer target's time)
__attribute__((unused)) static int fuzz_maps_files = 1;

typedef void (*FuzzBody)(const char *dir, const uint8_t *rest, size_t nrest);

// one input through body; 0 when it loaded, 1 when a loader rejected it (fuzz_error says why)
FUZZ_HARNESS static int fuzz_run(const uint8_t *data, size_t size, const char *const *names, int n, FuzzBody body) {
    static int hooked;
    if (!hooked && __sanitizer_install_malloc_and_free_hooks) {
        hooked = __sanitizer_install_malloc_and_free_hooks(fuzz_on_malloc, fuzz_on_free);
        dl_iterate_phdr(fuzz_add_ranges, NULL);  // where libgomp and the sanitizers' runtimes lie (fuzz_runtime_block)
    }
    size_t nrest;
    const uint8_t *rest = fuzz_files(data, size, names, n, &nrest);
    fuzz_error[0] = 0;
    fuzz_overflow = 0;
    if (__lsan_disable) __lsan_disable();
    die_hook = fuzz_hook;
    fuzz_tracking = hooked;
    int died = setjmp(fuzz_jb);
    if (!died) body(fuzz_scratch(), rest, nrest);
    fuzz_tracking = 0;
    die_hook = NULL;
    int held = fuzz_held(died && !fuzz_overflow);
    if (died && fuzz_maps_files) fuzz_unmap_scratch();
    if (__lsan_enable) __lsan_enable();
    if (died && (!fuzz_error[0] || strchr(fuzz_error, '\n'))) {
        fprintf(stderr, "fuzz: finding: the error is not one line: \"%s\"\n", fuzz_error);
        abort();
    }
    if (!died && held && !fuzz_overflow) {
        fprintf(stderr, "fuzz: finding: %d blocks still allocated after an input that loaded (a leak)\n", held);
        abort();
    }
    return died;
}

// FUZZ_TARGET(body, init, file names...): init (or NULL) runs once, before the first input: what
// the body allocates once and keeps (caches, a shared model) is made there
typedef void (*FuzzInit)(void);
#define FUZZ_TARGET(body, init, ...)                                                             \
    static const char *const fuzz_names[] = {__VA_ARGS__};                                     \
    int LLVMFuzzerInitialize(int *argc, char ***argv) {                                        \
        (void)argc, (void)argv;                                                                \
        FuzzInit f = init;                                                                     \
        if (f) f();                                                                            \
        return 0;                                                                              \
    }                                                                                          \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {                             \
        fuzz_run(data, size, fuzz_names, (int)(sizeof fuzz_names / sizeof fuzz_names[0]), body); \
        return 0;                                                                              \
    }                                                                                          \
    const char *fuzz_last_error(void) { return fuzz_error; }

#endif  // FUZZ_H
