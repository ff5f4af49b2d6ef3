// ops_cpu.c: the CPU reference kernels declared in ops_cpu.h, and cpu_threads_update (their
// OpenMP team sized to the cores this process gets).
// Written once for `real`; the Makefile compiles this file with real = float
// (suffix _cpu) and with -DCPU_F64, real = double (suffix _cpu64).
// Reductions accumulate in double whatever `real` is: these are the truth the
// fast kernels are compared with, so they favour accuracy over speed.
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else  // built without OpenMP (make fuzz: -fopenmp-simd): one thread, a team never resized
#define omp_get_max_threads() 1
#define omp_get_num_threads() 1
#define omp_get_thread_num() 0
#define omp_set_num_threads(n) ((void)(n))
#endif
#include <sys/resource.h>
#include <unistd.h>
#if defined(__F16C__) && defined(__SSE4_1__)
#include <immintrin.h>  // fp8_row_decode's E4M3 path
#endif

#include "fp8.h"
#include "core/common.h"
#include "cpu/ops_cpu.h"

#ifdef CPU_F64
typedef double real;
#define FN(name) name##_cpu64
#else
typedef float real;
#define FN(name) name##_cpu
#endif

// ----------------------------------------------------------------------------
// How many threads the kernels use: the cores this process gets, re-decided every 200 ms.
// OpenMP's threads spin-wait at every barrier for the others; a thread whose core another
// process holds keeps the whole team waiting for a whole time slice (ms) at kernels that take
// microseconds: on 2 cores with one busy process a run took 3.4x as long, with two 18x. So the
// team is sized to the cores that other processes leave idle: from /proc/stat (the busy time of
// the cores this process may run on) less this process's own CPU time (getrusage), over the
// last interval. Every parallel loop here is over independent rows, never a reduction, so the
// results do not depend on the thread count (resume stays bit-exact under any load).
#ifndef CPU_F64  // once, in the float build
typedef struct {
    double wall;                  // CLOCK_MONOTONIC seconds
    double busy, total;           // /proc/stat ticks over the cores in our affinity mask
    double own;                   // this process's CPU seconds
} CpuSample;

static int cpu_sample(CpuSample *s) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) CPU_ZERO(&set);
    char line[512];
    s->busy = s->total = 0;
    while (fgets(line, sizeof line, f) && !strncmp(line, "cpu", 3)) {
        int id;
        unsigned long long v[8] = {0};  // user nice system idle iowait irq softirq steal
        if (sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &id, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]) < 5)
            continue;  // the all-cores line ("cpu  ...") has no number after "cpu"
        if (CPU_COUNT(&set) > 0 && (id < 0 || id >= CPU_SETSIZE || !CPU_ISSET(id, &set))) continue;
        double t = 0;
        for (int i = 0; i < 8; i++) t += (double)v[i];
        s->total += t;
        s->busy += t - (double)v[3] - (double)v[4];
    }
    fclose(f);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    s->own = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    s->wall = now_sec();
    return s->total > 0 ? 0 : -1;
}

static struct {
    int init, max, cur;  // the cap (OMP_NUM_THREADS or the cores we may use), the team size now
    double hz;
    CpuSample last;
} thr;

int cpu_threads_update(void) {
    if (!thr.init) {
        thr.init = 1;
        thr.max = thr.cur = omp_get_max_threads();
        thr.hz = (double)sysconf(_SC_CLK_TCK);
        if (thr.max <= 1 || thr.hz <= 0 || cpu_sample(&thr.last) < 0) thr.max = thr.cur;  // nothing to adapt
        return thr.cur;
    }
    if (thr.max <= 1 || now_sec() - thr.last.wall < 0.2) return thr.cur;
    CpuSample s;
    if (cpu_sample(&s) < 0) return thr.cur;
    double dt = s.total - thr.last.total;  // ticks of all our cores over the interval
    if (dt < 5) return thr.cur;            // /proc/stat moves in 10 ms ticks: wait for enough of them
    double cores = dt / (thr.hz * (s.wall - thr.last.wall));  // ~ the number of cores
    double others = (s.busy - thr.last.busy) / thr.hz - (s.own - thr.last.own);  // CPU seconds not ours
    double idle_for_us = cores - fmax(others, 0) / (s.wall - thr.last.wall);
    thr.last = s;
    // a core only three-quarters free already stalls a team at its barriers: round down past 0.25
    int n = (int)floor(idle_for_us + 0.25);
    n = n < 1 ? 1 : n > thr.max ? thr.max : n;
    if (n != thr.cur) {
        omp_set_num_threads(n);
        thr.cur = n;
    }
    return n;
}
#endif

// SIMD through GCC/Clang vector extensions (32 bytes: 8 floats or 4 doubles). Sums keep
// one partial sum per lane and add the lanes in a fixed order: deterministic.
#define VL ((int)(32 / sizeof(real)))
typedef real vreal __attribute__((vector_size(32)));
static inline vreal vload(const real *p) {
    vreal v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline double vsum(vreal v) {
    double s = 0;
    for (int j = 0; j < VL; j++) s += v[j];
    return s;
}

// dot product of two contiguous rows
static inline double dot(const real *a, const real *b, int n) {
    vreal acc = {0};
    int i = 0;
    for (; i + VL <= n; i += VL) acc += vload(a + i) * vload(b + i);
    double s = vsum(acc);
    for (; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// four dot products of one row x with rows w0..w3 (x is loaded once for all four)
static inline void dot4(const real *x, const real *w0, const real *w1, const real *w2, const real *w3, int n,
                        double *out) {
    vreal a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int i = 0;
    for (; i + VL <= n; i += VL) {
        vreal xv = vload(x + i);
        a0 += xv * vload(w0 + i);
        a1 += xv * vload(w1 + i);
        a2 += xv * vload(w2 + i);
        a3 += xv * vload(w3 + i);
    }
    out[0] = vsum(a0), out[1] = vsum(a1), out[2] = vsum(a2), out[3] = vsum(a3);
    for (; i < n; i++) {
        out[0] += (double)x[i] * w0[i];
        out[1] += (double)x[i] * w1[i];
        out[2] += (double)x[i] * w2[i];
        out[3] += (double)x[i] * w3[i];
    }
}

void FN(embedding_forward)(real *out, const int32_t *ids, const real *wte, int N, int C) {
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * C, wte + (size_t)ids[n] * C, C * sizeof(real));
}

// in row order, so repeated ids accumulate deterministically
void FN(embedding_backward)(real *dwte, const int32_t *ids, const real *dout, int N, int C) {
    for (int n = 0; n < N; n++) {
        real *d = dwte + (size_t)ids[n] * C;
        const real *g = dout + (size_t)n * C;
        for (int i = 0; i < C; i++) d[i] += g[i];
    }
}

// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)  (Hugging Face LlamaRMSNorm / Qwen3RMSNorm: x * rstd
// rounded first); p1: Gemma3RMSNorm's y = x * rstd * (1 + w), formed in one go and rounded once (what
// transformers computes in fp32, here in double)
static void rmsnorm_fwd(real *out, real *rstd, const real *inp, const real *w, int N, int C, float eps, int p1) {
    cpu_threads_update();
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C;
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
        double r = 1.0 / sqrt(ss / C + eps);
        rstd[n] = (real)r;
        real *y = out + (size_t)n * C;
        if (p1)
            for (int i = 0; i < C; i++) y[i] = (real)(x[i] * r * (1.0 + (double)w[i]));
        else
            for (int i = 0; i < C; i++) y[i] = (real)(x[i] * r) * w[i];
    }
}
void FN(rmsnorm_forward)(real *out, real *rstd, const real *inp, const real *w, int N, int C, float eps) {
    rmsnorm_fwd(out, rstd, inp, w, N, C, eps, 0);
}
void FN(rmsnorm1p_forward)(real *out, real *rstd, const real *inp, const real *w, int N, int C, float eps) {
    rmsnorm_fwd(out, rstd, inp, w, N, C, eps, 1);
}

// dx_i += r (w_i dy_i) - r^3 / C * x_i * sum_j (w_j dy_j x_j);  dw_i += sum_n dy_i x_i r
// (p1: the weight is 1 + w; its derivative is w's)
static void rmsnorm_bwd(real *dinp, real *dw, const real *dout, const real *inp, const real *w, const real *rstd,
                        int N, int C, int p1) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        real *dx = dinp + (size_t)n * C;
        double r = rstd[n], s = 0;
        for (int i = 0; i < C; i++) s += (p1 + (double)w[i]) * dy[i] * x[i];
        double c = r * r * r * s / C;
        for (int i = 0; i < C; i++) dx[i] += (real)(r * (p1 + (double)w[i]) * dy[i] - c * x[i]);
    }
    if (dw) {
#pragma omp parallel for
        for (int i = 0; i < C; i++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += (double)dout[(size_t)n * C + i] * inp[(size_t)n * C + i] * rstd[n];
            dw[i] += (real)s;
        }
    }
}
void FN(rmsnorm_backward)(real *dinp, real *dw, const real *dout, const real *inp, const real *w, const real *rstd,
                          int N, int C) {
    rmsnorm_bwd(dinp, dw, dout, inp, w, rstd, N, C, 0);
}
void FN(rmsnorm1p_backward)(real *dinp, real *dw, const real *dout, const real *inp, const real *w, const real *rstd,
                            int N, int C) {
    rmsnorm_bwd(dinp, dw, dout, inp, w, rstd, N, C, 1);
}

void FN(matmul_forward)(real *out, const real *inp, const real *W, const real *bias, int N, int C, int OC) {
    cpu_threads_update();
    int OC4 = OC / 4 * 4;
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC4; o += 4) {
            double d[4];
            const real *w = W + (size_t)o * C;
            dot4(inp + (size_t)n * C, w, w + C, w + 2 * (size_t)C, w + 3 * (size_t)C, C, d);
            for (int k = 0; k < 4; k++) out[(size_t)n * OC + o + k] = (real)(d[k] + (bias ? bias[o + k] : 0));
        }
    for (int n = 0; n < N; n++)
        for (int o = OC4; o < OC; o++)
            out[(size_t)n * OC + o] = (real)(dot(inp + (size_t)n * C, W + (size_t)o * C, C) + (bias ? bias[o] : 0));
}

// ---- the products with an FP8 weight (codes + scales, fp8.h), as the frozen base's linears run ----
// W's rows are decoded into a thread's scratch when needed (code value * scale in fp32: the values
// fp8_dequantize_cpu gives) and used there, so a call reads each code once and holds no dequantized
// copy of W: a quarter of fp32's bytes from memory. Each result is the dense op's over the dequantized
// W, bit for bit (the same values summed in the same order).

// row r of W into dst (C values), through tab (the 256 codes' values).
// E4M3 eight codes at a time where the CPU has F16C (x86-64 since 2012): an E4M3 code's exponent and
// mantissa bits, shifted into a half's (the sign << 8, the rest << 7), are a half worth exactly
// value / 256, normals and subnormals alike (the exponent biases are 7 and 15); so half * (256 sc) is
// value * sc rounded once, the same float as tab[code] * sc. Only the NaN codes (0x7F, 0xFF, a half
// worth 480 there) and a row's last < 8 columns go through the table.
#if defined(__F16C__) && defined(__SSE4_1__)
#define FP8_DECODE_F16C 1
// 8 codes -> 8 floats (value * s256 / 256); *nan: whether one of them is a NaN code
static inline __m256 e4m3_x8(const uint8_t *q, __m256 s256, int *nan) {
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)q));  // 8 codes as 16-bit lanes
    __m128i m = _mm_and_si128(b, _mm_set1_epi16(0x7F));
    *nan = _mm_movemask_epi8(_mm_cmpeq_epi16(m, _mm_set1_epi16(0x7F)));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8), _mm_slli_epi16(m, 7));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), s256);
}
#endif
static void fp8_row_decode(real *dst, const FP8Tensor *W, int r, const float *tab) {
    const uint8_t *q = W->data + (size_t)r * W->cols;
    for (int c0 = 0; c0 < W->cols; c0 += FP8_BLOCK_SIZE) {  // one scale per 128 columns at most
        int c1 = c0 + FP8_BLOCK_SIZE < W->cols ? c0 + FP8_BLOCK_SIZE : W->cols, c = c0;
        float sc = W->scale[fp8_scale_index(W, r, c0)];
#ifdef FP8_DECODE_F16C
        if (W->fmt == FP8_E4M3) {
            __m256 s256 = _mm256_set1_ps(sc * 256.0f);  // exact: a power of two
            for (; c + 8 <= c1; c += 8) {
                int nan;
                __m256 v = e4m3_x8(q + c, s256, &nan);
                if (sizeof(real) == sizeof(float)) _mm256_storeu_ps((float *)(dst + c), v);
                else {
                    _mm256_storeu_pd((double *)(dst + c), _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
                    _mm256_storeu_pd((double *)(dst + c + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
                }
                if (nan)
                    for (int k = c; k < c + 8; k++)
                        if ((q[k] & 0x7Fu) == 0x7Fu) dst[k] = (real)(tab[q[k]] * sc);
            }
        }
#endif
        for (; c < c1; c++) dst[c] = (real)(tab[q[c]] * sc);
    }
}
static void fp8_table(float *tab, FP8Format fmt) {
    for (int i = 0; i < 256; i++) tab[i] = fp8_decode(fmt, (uint8_t)i);
}

// matmul_forward: W's rows 4 at a time, each group met by every input row (dot4, as there)
void FN(matmul_forward_fp8)(real *out, const real *inp, const FP8Tensor *W, const real *bias, int N) {
    cpu_threads_update();
    int C = W->cols, OC = W->rows, groups = (OC + 3) / 4;
    float tab[256];
    fp8_table(tab, W->fmt);
#pragma omp parallel
    {
        real *w = (real *)mallocCheck((size_t)4 * C * sizeof(real));
#pragma omp for schedule(static)
        for (int g = 0; g < groups; g++) {
            int o0 = 4 * g, nr = OC - o0 < 4 ? OC - o0 : 4;
            for (int k = 0; k < nr; k++) fp8_row_decode(w + (size_t)k * C, W, o0 + k, tab);
            for (int n = 0; n < N; n++) {
                const real *x = inp + (size_t)n * C;
                real *y = out + (size_t)n * OC + o0;
                if (nr == 4) {  // matmul_forward's dot4 rows
                    double d[4];
                    dot4(x, w, w + C, w + 2 * (size_t)C, w + 3 * (size_t)C, C, d);
                    for (int k = 0; k < 4; k++) y[k] = (real)(d[k] + (bias ? bias[o0 + k] : 0));
                } else {  // its last OC % 4 rows, one dot each
                    for (int k = 0; k < nr; k++) y[k] = (real)(dot(x, w + (size_t)k * C, C) + (bias ? bias[o0 + k] : 0));
                }
            }
        }
        free(w);
    }
}

// matmul_backward's dinp (= or += dout W): each thread decodes every row of W once and adds it into its
// own rows of dinp, in matmul_backward's order (for each row n, o ascending)
void FN(matmul_backward_fp8)(real *dinp, int accumulate, const real *dout, const FP8Tensor *W, int N) {
    cpu_threads_update();
    int C = W->cols, OC = W->rows;
    float tab[256];
    fp8_table(tab, W->fmt);
#pragma omp parallel
    {
        real *w = (real *)mallocCheck((size_t)C * sizeof(real));
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int n0 = (int)((long)N * t / nt), n1 = (int)((long)N * (t + 1) / nt);  // this thread's rows
        if (!accumulate)
            for (int n = n0; n < n1; n++) memset(dinp + (size_t)n * C, 0, C * sizeof(real));
        for (int o = 0; o < OC && n0 < n1; o++) {
            int used = 0;  // decode row o only if one of this thread's rows needs it
            for (int n = n0; n < n1; n++) {
                real g = dout[(size_t)n * OC + o];
                if (g == 0) continue;
                if (!used) fp8_row_decode(w, W, o, tab), used = 1;
                real *dx = dinp + (size_t)n * C;
                for (int i = 0; i < C; i++) dx[i] += g * w[i];
            }
        }
        free(w);
    }
}

// The sums run over rows (axpy form: acc[i] += g * w[i]), so the inner loops vectorize
// without reassociating any sum; each thread owns its output rows.
void FN(matmul_backward)(real *dinp, int accumulate, real *dW, real *dbias, const real *dout, const real *inp,
                         const real *W, int N, int C, int OC) {
    cpu_threads_update();
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const real *dy = dout + (size_t)n * OC;
            real *dx = dinp + (size_t)n * C;
            if (!accumulate) memset(dx, 0, C * sizeof(real));
            for (int o = 0; o < OC; o++) {
                real g = dy[o];
                if (g == 0) continue;
                const real *wr = W + (size_t)o * C;
                for (int i = 0; i < C; i++) dx[i] += g * wr[i];
            }
        }
    }
    if (dW) {
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            real *dwr = dW + (size_t)o * C;
            for (int n = 0; n < N; n++) {
                real g = dout[(size_t)n * OC + o];
                if (g == 0) continue;
                const real *x = inp + (size_t)n * C;
                for (int i = 0; i < C; i++) dwr[i] += g * x[i];
            }
        }
    }
    if (dbias) {
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
            dbias[o] += (real)s;
        }
    }
}

// Hugging Face rotate_half: for i < HD/2, with angle a = pos * inv_freq[i],
//   y_i = x_i cos a - x_{i+HD/2} sin a,  y_{i+HD/2} = x_{i+HD/2} cos a + x_i sin a.
// The inverse (for the backward) rotates by -a. The angle is formed in float
// like transformers does (position * inv_freq in fp32), then cos/sin in double.
void FN(rope_forward)(real *x, const int32_t *pos, const real *inv_freq, int N, int H, int HD, int inverse) {
    int half = HD / 2;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < half; i++) {
            double a = (double)((float)pos[n] * (float)inv_freq[i]);
            double c = cos(a), s = inverse ? -sin(a) : sin(a);
            for (int h = 0; h < H; h++) {
                real *v = x + ((size_t)n * H + h) * HD;
                double x1 = v[i], x2 = v[i + half];
                v[i] = (real)(x1 * c - x2 * s);
                v[i + half] = (real)(x2 * c + x1 * s);
            }
        }
    }
}

// the first key query t sees: 0, or with a sliding window the oldest of the last `window` (t - s < window)
static inline int first_key(int t, int window) { return window > 0 && t >= window ? t - window + 1 : 0; }

// Naive causal attention, one (b, h, t) row at a time; scores never exceed T.
// GQA: query head h reads key/value head h / (NH / KVH) (transformers' repeat_kv).
// Sliding window: keys s < first_key(t) are left out, as transformers' mask leaves them out.
void FN(attention_forward)(real *out, real *lse, const real *q, const real *k, const real *v, int B, int T, int NH,
                           int KVH, int HD, double scale, int window) {
    cpu_threads_update();
    double sc = scale;
    int rep = NH / KVH;
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double *p = (double *)malloc((t + 1) * sizeof(double)), *o = (double *)calloc(HD, sizeof(double));
                const real *qv = q + (((size_t)b * T + t) * NH + h) * HD;
                int kh = h / rep, s0 = first_key(t, window);
                double mx = -INFINITY;
                for (int s = s0; s <= t; s++) {
                    p[s] = sc * dot(qv, k + (((size_t)b * T + s) * KVH + kh) * HD, HD);
                    if (p[s] > mx) mx = p[s];
                }
                double sum = 0;
                for (int s = s0; s <= t; s++) sum += (p[s] = exp(p[s] - mx));
                for (int s = s0; s <= t; s++) {
                    const real *vv = v + (((size_t)b * T + s) * KVH + kh) * HD;
                    double w = p[s] / sum;
                    for (int d = 0; d < HD; d++) o[d] += w * vv[d];
                }
                real *ov = out + (((size_t)b * T + t) * NH + h) * HD;
                for (int d = 0; d < HD; d++) ov[d] = (real)o[d];
                lse[((size_t)b * NH + h) * T + t] = (real)(mx + log(sum));
                free(p);
                free(o);
            }
}

// Backward of softmax attention with the probabilities recomputed from lse:
//   P = exp(S - lse), dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = dS K sc, dK = dS^T Q sc.
// Parallel over (b, kv head) so each thread owns its dk/dv rows: no atomics.
void FN(attention_backward)(real *dq, real *dk, real *dv, const real *dout, const real *out, const real *lse,
                            const real *q, const real *k, const real *v, int B, int T, int NH, int KVH, int HD,
                            double scale, int window) {
    cpu_threads_update();
    double sc = scale;
    int rep = NH / KVH;
    memset(dq, 0, (size_t)B * T * NH * HD * sizeof(real));
    memset(dk, 0, (size_t)B * T * KVH * HD * sizeof(real));
    memset(dv, 0, (size_t)B * T * KVH * HD * sizeof(real));
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < KVH; kh++) {
            double *dkacc = (double *)calloc((size_t)T * HD, sizeof(double));
            double *dvacc = (double *)calloc((size_t)T * HD, sizeof(double));
            double *p = (double *)malloc(T * sizeof(double)), *dqacc = (double *)malloc(HD * sizeof(double));
            for (int h = kh * rep; h < (kh + 1) * rep; h++)
                for (int t = 0; t < T; t++) {
                    const real *qv = q + (((size_t)b * T + t) * NH + h) * HD;
                    const real *dov = dout + (((size_t)b * T + t) * NH + h) * HD;
                    const real *ov = out + (((size_t)b * T + t) * NH + h) * HD;
                    double L = lse[((size_t)b * NH + h) * T + t];
                    double Dt = dot(dov, ov, HD);
                    memset(dqacc, 0, HD * sizeof(double));
                    for (int s = first_key(t, window); s <= t; s++) {
                        const real *kv = k + (((size_t)b * T + s) * KVH + kh) * HD;
                        const real *vv = v + (((size_t)b * T + s) * KVH + kh) * HD;
                        p[s] = exp(sc * dot(qv, kv, HD) - L);
                        double dp = dot(dov, vv, HD);
                        double ds = p[s] * (dp - Dt) * sc;
                        for (int d = 0; d < HD; d++) {
                            dvacc[(size_t)s * HD + d] += p[s] * dov[d];
                            dkacc[(size_t)s * HD + d] += ds * qv[d];
                            dqacc[d] += ds * kv[d];
                        }
                    }
                    real *dqv = dq + (((size_t)b * T + t) * NH + h) * HD;
                    for (int d = 0; d < HD; d++) dqv[d] = (real)dqacc[d];
                }
            for (int s = 0; s < T; s++)
                for (int d = 0; d < HD; d++) {
                    dk[(((size_t)b * T + s) * KVH + kh) * HD + d] = (real)dkacc[(size_t)s * HD + d];
                    dv[(((size_t)b * T + s) * KVH + kh) * HD + d] = (real)dvacc[(size_t)s * HD + d];
                }
            free(dkacc);
            free(dvacc);
            free(p);
            free(dqacc);
        }
}

// silu(g) * u, silu(g) = g * sigmoid(g)
void FN(swiglu_forward)(real *out, const real *gate, const real *up, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        double g = gate[i];
        out[i] = (real)(g / (1.0 + exp(-g)) * up[i]);
    }
}
void FN(swiglu_backward)(real *dgate, real *dup, const real *dout, const real *gate, const real *up, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        double g = gate[i], sg = 1.0 / (1.0 + exp(-g));
        dgate[i] = (real)(dout[i] * up[i] * sg * (1.0 + g * (1.0 - sg)));
        dup[i] = (real)(dout[i] * g * sg);
    }
}

// gelu_tanh(g) = g/2 (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3) (PyTorch's approximate="tanh")
#define GELU_K0 0.7978845608028654  // sqrt(2 / pi)
#define GELU_K1 0.044715
void FN(geglu_forward)(real *out, const real *gate, const real *up, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        double g = gate[i], t = tanh(GELU_K0 * (g + GELU_K1 * g * g * g));
        out[i] = (real)(0.5 * g * (1.0 + t) * up[i]);
    }
}
// d gelu_tanh / dg = (1 + t) / 2 + g/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2)
void FN(geglu_backward)(real *dgate, real *dup, const real *dout, const real *gate, const real *up, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        double g = gate[i], t = tanh(GELU_K0 * (g + GELU_K1 * g * g * g));
        double dgelu = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * GELU_K0 * (1.0 + 3.0 * GELU_K1 * g * g);
        dgate[i] = (real)(dout[i] * up[i] * dgelu);
        dup[i] = (real)(dout[i] * 0.5 * g * (1.0 + t));
    }
}

void FN(add)(real *out, const real *a, const real *b, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void FN(gather_rows)(real *out, const real *inp, const int32_t *idx, int n_idx, int C) {
    for (int i = 0; i < n_idx; i++) memcpy(out + (size_t)i * C, inp + (size_t)idx[i] * C, C * sizeof(real));
}

// Qwen3 MoE's router, a token (row) at a time: p = softmax(logits) over the E experts (in double), its K
// largest picked in turn (a tie goes to the lower expert, as torch.topk), w their p, divided by their sum
// when norm (norm_topk_prob)
static void router_probs(double *p, const real *z, int E) {
    double mx = z[0], s = 0;
    for (int e = 1; e < E; e++) mx = fmax(mx, z[e]);
    for (int e = 0; e < E; e++) s += p[e] = exp(z[e] - mx);
    for (int e = 0; e < E; e++) p[e] /= s;
}
void FN(moe_route)(int32_t *idx, real *w, const real *logits, int N, int E, int K, int norm) {
    double *p = (double *)mallocCheck(E * sizeof(double));
    for (int n = 0; n < N; n++) {
        router_probs(p, logits + (size_t)n * E, E);
        int32_t *ix = idx + (size_t)n * K;
        double sum = 0;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= ix[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ix[j] = best;
            sum += p[best];
        }
        for (int j = 0; j < K; j++) w[(size_t)n * K + j] = (real)(norm ? p[ix[j]] / sum : p[ix[j]]);
    }
    free(p);
}
// w_j = p_j / S (S = sum of the chosen p; S = 1 without norm): dp_j = (dw_j - sum_i dw_i w_i) / S on the chosen
// experts, 0 elsewhere; then the softmax: dz_e = p_e (dp_e - sum_f p_f dp_f)
void FN(moe_route_backward)(real *dlogits, const real *dw, const real *logits, const int32_t *idx, int N, int E, int K,
                            int norm) {
    double *p = (double *)mallocCheck(2 * E * sizeof(double)), *dp = p + E;
    for (int n = 0; n < N; n++) {
        router_probs(p, logits + (size_t)n * E, E);
        const int32_t *ix = idx + (size_t)n * K;
        const real *g = dw + (size_t)n * K;
        double S = 0, gw = 0, pdp = 0;
        for (int j = 0; j < K; j++) S += p[ix[j]];
        if (!norm) S = 1;
        for (int j = 0; j < K; j++) gw += g[j] * p[ix[j]] / S;
        for (int e = 0; e < E; e++) dp[e] = 0;
        for (int j = 0; j < K; j++) dp[ix[j]] = norm ? (g[j] - gw) / S : g[j];
        for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
        for (int e = 0; e < E; e++) dlogits[(size_t)n * E + e] = (real)(p[e] * (dp[e] - pdp));
    }
    free(p);
}

// log_softmax(inv_temp * h wlm^T)[target], one row at a time (never (N, V) at once)
void FN(logprobs_forward)(real *logp, real *lse, const real *h, const real *wlm, const int32_t *targets,
                          float inv_temp, int N, int C, int V) {
    cpu_threads_update();
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        if (targets[n] < 0) { logp[n] = 0; lse[n] = 0; continue; }
        double *z = (double *)malloc(V * sizeof(double)), mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) {
            z[j] = inv_temp * dot(h + (size_t)n * C, wlm + (size_t)j * C, C);
            if (z[j] > mx) mx = z[j];
        }
        for (int j = 0; j < V; j++) s += exp(z[j] - mx);
        double L = mx + log(s);
        lse[n] = (real)L;
        logp[n] = (real)(z[targets[n]] - L);
        free(z);
    }
}

// d logp / d z_j = 1[j = target] - softmax_j ; dh = inv_temp * sum_j dz_j wlm_j
void FN(logprobs_backward)(real *dh, real *dwlm, const real *dlogp, const real *lse, const real *h, const real *wlm,
                           const int32_t *targets, float inv_temp, int N, int C, int V) {
    cpu_threads_update();
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *d = dh + (size_t)n * C;
        if (targets[n] < 0 || dlogp[n] == 0) { memset(d, 0, C * sizeof(real)); continue; }
        double *acc = (double *)calloc(C, sizeof(double));
        double g = dlogp[n], L = lse[n];
        for (int j = 0; j < V; j++) {
            const real *w = wlm + (size_t)j * C;
            double pj = exp(inv_temp * dot(h + (size_t)n * C, w, C) - L);
            double dz = g * ((j == targets[n]) - pj) * inv_temp;
            for (int i = 0; i < C; i++) acc[i] += dz * w[i];
        }
        for (int i = 0; i < C; i++) d[i] = (real)acc[i];
        free(acc);
    }
    if (!dwlm) return;
    // dwlm_j += sum_n dz_nj h_n, parallel over vocabulary rows (each thread owns its rows)
#pragma omp parallel for
    for (int j = 0; j < V; j++) {
        const real *w = wlm + (size_t)j * C;
        double *acc = (double *)calloc(C, sizeof(double));
        for (int n = 0; n < N; n++) {
            if (targets[n] < 0 || dlogp[n] == 0) continue;
            const real *hn = h + (size_t)n * C;
            double dz = dlogp[n] * ((j == targets[n]) - exp(inv_temp * dot(hn, w, C) - lse[n])) * inv_temp;
            for (int i = 0; i < C; i++) acc[i] += dz * hn[i];
        }
        real *dw = dwlm + (size_t)j * C;
        for (int i = 0; i < C; i++) dw[i] += (real)acc[i];
        free(acc);
    }
}

// one head's row of a cache slot: act values as they are, or FP8 codes decoded and scaled
// (the product in fp32, as the GPU forms it)
static const real *kv_row(const void *cache, const float *scales, size_t slot, int KVH, int kh, int HD, real *tmp) {
    size_t r = slot * KVH + kh;
    if (!scales) return (const real *)cache + r * HD;
    const uint8_t *q = (const uint8_t *)cache + r * HD;
    for (int d = 0; d < HD; d++) tmp[d] = (real)(fp8_e4m3_decode(q[d]) * scales[r]);
    return tmp;
}

void FN(kv_write)(void *kc, void *vc, float *ks, float *vs, const real *k, const real *v, const int32_t *slots, int N,
                  int KVH, int HD) {
    size_t row = (size_t)KVH * HD;
    for (int n = 0; n < N; n++) {
        if (slots[n] < 0) continue;
        if (!ks) {
            memcpy((real *)kc + (size_t)slots[n] * row, k + (size_t)n * row, row * sizeof(real));
            memcpy((real *)vc + (size_t)slots[n] * row, v + (size_t)n * row, row * sizeof(real));
            continue;
        }
        // FP8: per (slot, head) scale = amax / 448 of the head's values (as fp32), codes of x / scale
        for (int h = 0; h < KVH; h++)
            for (int w = 0; w < 2; w++) {
                const real *x = (w ? v : k) + (size_t)n * row + (size_t)h * HD;
                uint8_t *q = (uint8_t *)(w ? vc : kc) + ((size_t)slots[n] * KVH + h) * HD;
                float amax = 0;
                for (int d = 0; d < HD; d++) amax = fmaxf(amax, fabsf((float)x[d]));
                float sc = fp8_scale_from_amax(amax, FP8_E4M3, 0);
                (w ? vs : ks)[(size_t)slots[n] * KVH + h] = sc;
                for (int d = 0; d < HD; d++) q[d] = fp8_e4m3_encode((float)x[d] / sc);
            }
    }
}

void FN(attention_decode)(real *out, const real *q, const void *kc, const void *vc, const float *ks, const float *vs,
                          const int32_t *block_table, const int32_t *seq_lens, int S_, int NH, int KVH, int HD, int BS,
                          int MB, double scale, int window) {
    double sc = scale;
    int rep = NH / KVH;
#pragma omp parallel for collapse(2)
    for (int s = 0; s < S_; s++)
        for (int h = 0; h < NH; h++) {
            // the query is token len - 1: with a window, the tokens before first_key stay cached but unseen
            int len = seq_lens[s], kh = h / rep, t0 = first_key(len - 1, window);
            double *p = (double *)malloc(len * sizeof(double)), *o = (double *)calloc(HD, sizeof(double)), mx = -INFINITY;
            real *tmp = (real *)malloc(HD * sizeof(real));
            const real *qv = q + ((size_t)s * NH + h) * HD;
            for (int t = t0; t < len; t++) {
                size_t slot = (size_t)block_table[(size_t)s * MB + t / BS] * BS + t % BS;
                p[t] = sc * dot(qv, kv_row(kc, ks, slot, KVH, kh, HD, tmp), HD);
                if (p[t] > mx) mx = p[t];
            }
            double sum = 0;
            for (int t = t0; t < len; t++) sum += (p[t] = exp(p[t] - mx));
            for (int t = t0; t < len; t++) {
                size_t slot = (size_t)block_table[(size_t)s * MB + t / BS] * BS + t % BS;
                const real *vv = kv_row(vc, vs, slot, KVH, kh, HD, tmp);
                for (int d = 0; d < HD; d++) o[d] += p[t] / sum * vv[d];
            }
            real *ov = out + ((size_t)s * NH + h) * HD;
            for (int d = 0; d < HD; d++) ov[d] = (real)o[d];
            free(p);
            free(o);
            free(tmp);
        }
}

typedef struct { double p; int id; } ProbId;
static int cmp_prob_desc(const void *a, const void *b) {
    const ProbId *x = (const ProbId *)a, *y = (const ProbId *)b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;  // ties: lower id first, so the order is deterministic
}

// Sampling as transformers' generate applies it: temperature, then top-k, then
// top-p (keep the smallest prefix of the sorted distribution whose mass reaches
// top_p, at least one token), renormalise, draw with the sequence's own RNG.
// The logprob returned is that of the untruncated distribution at the temperature
// (what the trainer computes), or at temperature 1 for greedy.
void FN(sample)(int32_t *tokens, real *logp, const real *logits, uint64_t *rng, int S_, int V, float temperature,
                int top_k, float top_p) {
#pragma omp parallel for
    for (int s = 0; s < S_; s++) {
        const real *z = logits + (size_t)s * V;
        double T = temperature > 0 ? temperature : 1.0, mx = -INFINITY, sum = 0;
        int arg = 0;
        for (int j = 0; j < V; j++)
            if (z[j] > z[arg]) arg = j;
        mx = z[arg] / T;
        for (int j = 0; j < V; j++) sum += exp(z[j] / T - mx);
        double lse = mx + log(sum);
        int tok = arg;
        if (temperature > 0) {
            Rng r = {rng[s]};
            double u = rng_uniform_d(&r);
            rng[s] = r.s;
            if (top_k <= 0 && top_p >= 1.0f) {
                double c = 0, target = u * sum;
                tok = V - 1;
                for (int j = 0; j < V; j++) {
                    c += exp(z[j] / T - mx);
                    if (c > target) { tok = j; break; }
                }
            } else {
                ProbId *pi = (ProbId *)malloc(V * sizeof(ProbId));
                for (int j = 0; j < V; j++) pi[j] = (ProbId){exp(z[j] / T - lse), j};
                qsort(pi, V, sizeof(ProbId), cmp_prob_desc);
                int keep = (top_k > 0 && top_k < V) ? top_k : V;
                if (top_p < 1.0f) {
                    double kept_mass = 0;
                    for (int j = 0; j < V; j++) kept_mass += j < keep ? pi[j].p : 0;
                    double c = 0;
                    int kp = 0;
                    // the mass is measured after top-k renormalisation, as the warpers chain
                    while (kp < keep) {
                        c += pi[kp].p / kept_mass;
                        kp++;
                        if (c >= top_p) break;
                    }
                    keep = kp;
                }
                double m = 0;
                for (int j = 0; j < keep; j++) m += pi[j].p;
                double c = 0, target = u * m;
                tok = pi[keep - 1].id;
                for (int j = 0; j < keep; j++) {
                    c += pi[j].p;
                    if (c > target) { tok = pi[j].id; break; }
                }
                free(pi);
            }
        }
        tokens[s] = tok;
        logp[s] = (real)(z[tok] / T - lse);
    }
}

// one element of AdamW in the masters' own precision, real (fp32 on the fp32 backend, as the GPU's fp32
// masters and torch.optim.AdamW on fp32 parameters compute it; fp64 on cpu64), each operation rounded
// once, in the order backend_cuda.cu's kernel spells out (bit-identical results): *m and *v updated,
// the new parameter returned. Decoupled weight decay (torch.optim.AdamW): p -= lr * wd * p, then the
// Adam step. bc1, bc2: the bias corrections 1 - beta^step (computed in fp64, rounded to real).
static inline real adamw_elem(real p, real g, real *m, real *v, real lr, real beta1, real beta2, real eps, real wd,
                              real bc1, real bc2) {
    real mi = beta1 * *m + (1 - beta1) * g;
    real vi = beta2 * *v + (1 - beta2) * g * g;
    *m = mi;
    *v = vi;
    p = p * (1 - lr * wd);
#ifdef CPU_F64
    real root = sqrt(vi / bc2);
#else
    real root = sqrtf(vi / bc2);
#endif
    return p - lr * (mi / bc1) / (root + eps);
}

// the gradient times gscale, rounded as FN(scale) rounds it; m16: the moments are bf16 values
// (backend.h Bf16Moments: seed, i0), rounded stochastically
void FN(adamw)(real *param, const real *grad, float gscale, real *m, real *v, size_t n, float lr, float beta1, float beta2,
               float eps, float weight_decay, int step, int m16, uint64_t seed, size_t i0) {
    real bc1 = (real)(1.0 - pow(beta1, step)), bc2 = (real)(1.0 - pow(beta2, step));
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real mi = m[i], vi = v[i];
        real g = gscale == 1.0f ? grad[i] : (real)(grad[i] * (double)gscale);
        param[i] = adamw_elem(param[i], g, &mi, &vi, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
        if (m16) {
            m[i] = bf16_to_f32(f32_to_bf16_sr((float)mi, sr_bits(seed, step, i0 + i, 1)));
            v[i] = bf16_to_f32(f32_to_bf16_sr((float)vi, sr_bits(seed, step, i0 + i, 2)));
        } else {
            m[i] = mi;
            v[i] = vi;
        }
    }
}

// adamw with the three results rounded to bf16 stochastically (backend.h adamw_bf16), kept as real values
void FN(adamw_bf16)(real *param, const real *grad, real *m, real *v, size_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int step, uint64_t seed) {
    real bc1 = (real)(1.0 - pow(beta1, step)), bc2 = (real)(1.0 - pow(beta2, step));
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real mi = m[i], vi = v[i];
        real p = adamw_elem(param[i], grad[i], &mi, &vi, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
        param[i] = bf16_to_f32(f32_to_bf16_sr((float)p, sr_bits(seed, step, i, 0)));
        m[i] = bf16_to_f32(f32_to_bf16_sr((float)mi, sr_bits(seed, step, i, 1)));
        v[i] = bf16_to_f32(f32_to_bf16_sr((float)vi, sr_bits(seed, step, i, 2)));
    }
}

double FN(sumsq)(const real *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void FN(scale)(real *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = (real)(x[i] * (double)s);
}

void FN(accumulate)(real *dst, const real *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
