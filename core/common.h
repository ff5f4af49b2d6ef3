// common.h: what every file of fp8-grpo uses. Error checks that name the file,
// the line and the fix (mallocCheck, fopenCheck, die), a seeded RNG kept in a
// struct (no global state), a wall clock, and the DType enum shared by the
// safetensors reader, the backends and the model.
// Header-only; C11.
#ifndef COMMON_H
#define COMMON_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// errors: one line, naming the cause and (where we know it) the fix, then exit(1).
// Library code calls die(); programs never see a crash for bad input.

// Tests set die_hook to catch the message (they longjmp out of it); programs leave it NULL.
// (A weak definition, so the header alone is enough: every file shares one variable.)
__attribute__((weak)) void (*die_hook)(const char *msg) = NULL;

__attribute__((format(printf, 1, 2), noreturn)) static inline void die(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)  // one line, whatever it quotes from a file (a name with a newline)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    if (die_hook) die_hook(msg);  // does not return when it longjmps
    fprintf(stderr, "error: %s\n", msg);
    exit(1);
}

static inline void *malloc_check(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of host memory allocating %zu bytes (%s:%d)", n, file, line);
    return p;
}
static inline void *calloc_check(size_t n, size_t sz, const char *file, int line) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) die("out of host memory allocating %zu x %zu bytes (%s:%d)", n, sz, file, line);
    return p;
}
static inline void *realloc_check(void *q, size_t n, const char *file, int line) {
    void *p = realloc(q, n ? n : 1);
    if (!p) die("out of host memory allocating %zu bytes (%s:%d)", n, file, line);
    return p;
}
static inline FILE *fopen_check(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (!f) die("cannot open %s (mode %s): check the path exists and is readable (%s:%d)", path, mode, file, line);
    return f;
}
// for functions that report an error to their caller instead of dying: the message into err (cap
// bytes, may be NULL), and -1 to return
__attribute__((format(printf, 3, 4))) static inline int error_msg(char *err, size_t cap, const char *fmt, ...) {
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

#define mallocCheck(n) malloc_check((n), __FILE__, __LINE__)
#define callocCheck(n, sz) calloc_check((n), (sz), __FILE__, __LINE__)
#define reallocCheck(p, n) realloc_check((p), (n), __FILE__, __LINE__)
#define fopenCheck(path, mode) fopen_check((path), (mode), __FILE__, __LINE__)

static inline char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)mallocCheck(n);
    memcpy(d, s, n);
    return d;
}

// path join into a caller buffer; dies if it does not fit
static inline void path_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) die("path too long: %s/%s", dir, name);
}

// ----------------------------------------------------------------------------
// element types. Storage types of tensors on disk (safetensors) and in memory.

typedef enum {
    DT_F32 = 0,
    DT_F64,
    DT_BF16,
    DT_F16,
    DT_E4M3,  // float8_e4m3fn (no inf, one NaN pattern, max 448)
    DT_E5M2,  // float8_e5m2 (IEEE-like, max 57344)
    DT_I32,
    DT_I64,
    DT_U8,
    DT_COUNT
} DType;

static inline size_t dtype_size(DType t) {
    static const size_t sz[DT_COUNT] = {4, 8, 2, 2, 1, 1, 4, 8, 1};
    return sz[t];
}
static inline const char *dtype_name(DType t) {
    static const char *nm[DT_COUNT] = {"F32", "F64", "BF16", "F16", "F8_E4M3", "F8_E5M2", "I32", "I64", "U8"};
    return nm[t];
}

// The few helpers a CUDA kernel shares with the host, bit for bit (the stochastic rounding below)
#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif

// bf16 <-> f32 on the host. f32 -> bf16 rounds to nearest even (NaN stays NaN),
// exactly what PyTorch's .to(torch.bfloat16) does.
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
HOST_DEVICE static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
// IEEE half -> f32 (exact)
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ----------------------------------------------------------------------------
// RNG: splitmix64, one 64-bit state in a struct, so every sequence and every
// run owns its stream and resume can restore it exactly.

typedef struct { uint64_t s; } Rng;

HOST_DEVICE static inline uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Stochastic rounding to bf16 (the LoRA masters and AdamW state of --lora_dtype bf16). f rounds up
// to the next bf16 with probability (its 16 dropped bits) / 2^16, else down: the expectation is f,
// so an update far below a bf16 step (lr 1e-5 on weights of 1e-2: 2^-10 of them, a bf16 step being
// 2^-8) still moves the value on average, where rounding to nearest would drop it every time.
// The 16 random bits come from a hash of what names the rounding (seed, step, element, which of
// param / m / v), so a run repeats bit for bit and the CPU and the GPU agree.
HOST_DEVICE static inline uint32_t sr_bits(uint64_t seed, int step, size_t i, int which) {
    uint64_t x = seed ^ ((uint64_t)step * 0xd1b54a32d192ed03ull) ^ (((uint64_t)i * 4 + (uint64_t)which) * 0x9e3779b97f4a7c15ull);
    return (uint32_t)(splitmix64(&x) & 0xffffu);
}
HOST_DEVICE static inline uint16_t f32_to_bf16_sr(float f, uint32_t r16) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return f32_to_bf16(f);  // inf and NaN as they are
    u += r16;  // a carry out of the dropped half rounds the magnitude up (the sign bit stays)
    return (uint16_t)(u >> 16);
}
static inline Rng rng_make(uint64_t seed) { Rng r = {seed}; return r; }
static inline uint64_t rng_u64(Rng *r) { return splitmix64(&r->s); }
// uniform in [0, 1) with 24 random bits (exact in float)
static inline float rng_uniform(Rng *r) { return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f); }
static inline double rng_uniform_d(Rng *r) { return (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
static inline int rng_int(Rng *r, int n) { return (int)(rng_u64(r) % (uint64_t)n); }
// standard normal (Box-Muller), for random init and tests
static inline float rng_normal(Rng *r) {
    double u1 = rng_uniform_d(r), u2 = rng_uniform_d(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// ----------------------------------------------------------------------------
// wall clock in seconds
static inline double now_sec(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);  // C11; wall time is fine for the durations we report
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#ifdef __cplusplus
}
#endif
#endif  // COMMON_H
