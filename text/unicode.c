// unicode.c: nfc_normalize (unicode.h), for tokenizer.c (Qwen2's tokenizer.json asks for NFC).
//
// NFC (normalization form C), as HF's normalizer computes it: canonical decomposition,
// canonical ordering of combining marks, canonical composition. Tables in tokenizer_unicode.h
// follow HF's (older) Unicode data, not the newest. Most text is untouched: a string with no
// character that can decompose, reorder or combine with its predecessor is already NFC.
#include <pthread.h>

#include "core/common.h"
#include "text/tokenizer_unicode.h"
#include "text/unicode.h"

#define NFC_NDECOMP ((int)(sizeof nfc_decomp / sizeof nfc_decomp[0]))
#define NFC_NCCC ((int)(sizeof nfc_ccc / sizeof nfc_ccc[0]))
enum { HS_BASE = 0xAC00, HL_BASE = 0x1100, HV_BASE = 0x1161, HT_BASE = 0x11A7, HL_N = 19, HV_N = 21, HT_N = 28, HS_N = 11172 };

static struct {
    uint8_t *unsafe;    // bitmap over all code points: may change under NFC
    uint64_t *pair;     // sorted (first << 21 | second) of the pairs that compose
    uint32_t *pair_cp;  // what they compose to
    int npair;
} nfc;
static pthread_once_t nfc_once = PTHREAD_ONCE_INIT;

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static void nfc_mark(uint32_t c) { nfc.unsafe[c >> 3] |= (uint8_t)(1u << (c & 7)); }
static void nfc_init(void) {
    nfc.unsafe = (uint8_t *)callocCheck(0x110000 / 8, 1);
    uint64_t *tmp = (uint64_t *)mallocCheck(NFC_NDECOMP * sizeof(uint64_t));
    for (int i = 0; i < NFC_NDECOMP; i++) {
        nfc_mark(nfc_decomp[i][0]);
        if (nfc_decomp[i][3]) {
            nfc_mark(nfc_decomp[i][2]);  // the second of a pair may merge into its predecessor
            tmp[nfc.npair++] = (uint64_t)nfc_decomp[i][1] << 42 | (uint64_t)nfc_decomp[i][2] << 21 | nfc_decomp[i][0];
        }
    }
    qsort(tmp, nfc.npair, sizeof(uint64_t), cmp_u64);
    nfc.pair = (uint64_t *)mallocCheck(nfc.npair * sizeof(uint64_t));
    nfc.pair_cp = (uint32_t *)mallocCheck(nfc.npair * sizeof(uint32_t));
    for (int i = 0; i < nfc.npair; i++) { nfc.pair[i] = tmp[i] >> 21; nfc.pair_cp[i] = (uint32_t)(tmp[i] & 0x1FFFFF); }
    free(tmp);
    for (int i = 0; i < NFC_NCCC; i++)
        for (uint32_t c = nfc_ccc[i][0]; c <= nfc_ccc[i][1]; c++) nfc_mark(c);
    for (uint32_t c = HV_BASE; c < HV_BASE + HV_N; c++) nfc_mark(c);  // Hangul L+V, LV+T compose
    for (uint32_t c = HT_BASE + 1; c < HT_BASE + HT_N; c++) nfc_mark(c);
}
static int nfc_unsafe(uint32_t c) { return c >= 0x300 && (nfc.unsafe[c >> 3] >> (c & 7) & 1); }
static int ccc_of(uint32_t c) {
    if (c < 0x300) return 0;
    int lo = 0, hi = NFC_NCCC - 1;
    while (lo <= hi) {
        int m = (lo + hi) / 2;
        if (c < nfc_ccc[m][0]) hi = m - 1;
        else if (c > nfc_ccc[m][1]) lo = m + 1;
        else return (int)nfc_ccc[m][2];
    }
    return 0;
}
static void decompose(uint32_t c, uint32_t **v, int *n, int *cap) {
    if (*n + 4 > *cap) { *cap = *cap * 2 + 16; *v = (uint32_t *)reallocCheck(*v, (size_t)*cap * sizeof(uint32_t)); }
    if (c >= HS_BASE && c < HS_BASE + HS_N) {  // Hangul syllable: algorithmic
        uint32_t s = c - HS_BASE;
        (*v)[(*n)++] = HL_BASE + s / (HV_N * HT_N);
        (*v)[(*n)++] = HV_BASE + (s % (HV_N * HT_N)) / HT_N;
        if (s % HT_N) (*v)[(*n)++] = HT_BASE + s % HT_N;
        return;
    }
    int lo = 0, hi = NFC_NDECOMP - 1;
    while (c >= 0xC0 && lo <= hi) {
        int m = (lo + hi) / 2;
        if (c < nfc_decomp[m][0]) hi = m - 1;
        else if (c > nfc_decomp[m][0]) lo = m + 1;
        else {
            decompose(nfc_decomp[m][1], v, n, cap);
            if (nfc_decomp[m][2]) decompose(nfc_decomp[m][2], v, n, cap);
            return;
        }
    }
    (*v)[(*n)++] = c;
}
static uint32_t compose(uint32_t a, uint32_t b) {  // 0: none
    if (a >= HL_BASE && a < HL_BASE + HL_N && b >= HV_BASE && b < HV_BASE + HV_N)
        return HS_BASE + ((a - HL_BASE) * HV_N + (b - HV_BASE)) * HT_N;
    if (a >= HS_BASE && a < HS_BASE + HS_N && (a - HS_BASE) % HT_N == 0 && b > HT_BASE && b < HT_BASE + HT_N)
        return a + (b - HT_BASE);
    uint64_t key = (uint64_t)a << 21 | b;
    int lo = 0, hi = nfc.npair - 1;
    while (lo <= hi) {
        int m = (lo + hi) / 2;
        if (key < nfc.pair[m]) hi = m - 1;
        else if (key > nfc.pair[m]) lo = m + 1;
        else return nfc.pair_cp[m];
    }
    return 0;
}
char *nfc_normalize(const uint8_t *s, size_t n, size_t *out_len) {
    pthread_once(&nfc_once, nfc_init);
    size_t i = 0;
    for (; i < n; i++) {  // bytes below 0xCC: ASCII, continuation bytes, or a lead of U+0080..U+02FF
        if (s[i] < 0xCC) continue;
        uint32_t c;
        if (utf8_char(s + i, n - i, &c) > 0 && nfc_unsafe(c)) break;
    }
    if (i == n) return NULL;
    uint32_t *v = NULL;
    int nv = 0, cap = 0;
    for (size_t j = 0; j < n;) {  // (should s not be valid UTF-8 after all: U+FFFD per invalid byte)
        uint32_t c = 0xFFFD;
        int k = utf8_char(s + j, n - j, &c);
        j += k > 0 ? (size_t)k : 1;
        decompose(k > 0 ? c : 0xFFFD, &v, &nv, &cap);
    }
    int *cc = (int *)mallocCheck((size_t)nv * sizeof(int));
    for (int k = 0; k < nv; k++) cc[k] = ccc_of(v[k]);
    for (int k = 1; k < nv; k++) {  // canonical ordering: stable sort of each run of marks by class
        if (cc[k] == 0) continue;
        uint32_t c = v[k];
        int cl = cc[k], j = k;
        while (j > 0 && cc[j - 1] > cl) { v[j] = v[j - 1]; cc[j] = cc[j - 1]; j--; }
        v[j] = c, cc[j] = cl;
    }
    // composition: a character joins the last starter unless something between them blocks it
    // (a starter, or a mark of the same or higher class; after ordering, the last one decides)
    int m = 0, starter = -1, last_cc = 0;
    for (int k = 0; k < nv; k++) {
        if (starter >= 0 && (m - 1 == starter || (last_cc != 0 && last_cc < cc[k]))) {
            uint32_t p = compose(v[starter], v[k]);
            if (p) { v[starter] = p; continue; }
        }
        if (cc[k] == 0) starter = m;
        last_cc = cc[k];
        v[m++] = v[k];
    }
    char *out = (char *)mallocCheck((size_t)m * 4 + 1);
    size_t len = 0;
    for (int k = 0; k < m; k++) len += (size_t)utf8_put(v[k], out + len);
    out[len] = 0;
    free(v);
    free(cc);
    *out_len = len;
    return out;
}
