// unicode.h: what tokenizer.c (and every reader of text) needs of Unicode beyond its tables: UTF-8
// one character at a time (utf8_char, utf8_put, utf8_valid_len: inline here) and NFC as Hugging
// Face tokenizers' normalizer computes it (nfc_normalize, in unicode.c, on the tables of
// tokenizer_unicode.h).
#ifndef UNICODE_H
#define UNICODE_H

#include <stddef.h>
#include <stdint.h>

// The character at s[0..n): returns its length (> 0) and *cp; or -k for an invalid maximal
// subpart of k bytes (Unicode's rule, also Python's errors="replace" and Rust's
// from_utf8_lossy: each such subpart becomes one U+FFFD); or 0 for a valid but unfinished
// character cut by the end of s.
static inline int utf8_char(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    int need;
    uint32_t v;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) { need = 2; v = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; v = c & 0x0F; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; v = c & 0x07; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return -1;
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n) return 0;
        uint8_t b = s[k];
        if (b < lo || b > hi) return -k;
        lo = 0x80, hi = 0xBF;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return need;
}
// the length of the valid UTF-8 that s[0..n) starts with (n: all of it)
static inline size_t utf8_valid_len(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int k = utf8_char(s + i, n - i, &cp);
        if (k <= 0) return i;
        i += k;
    }
    return n;
}
static inline int utf8_put(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | c >> 6); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) { o[0] = (char)(0xE0 | c >> 12); o[1] = (char)(0x80 | (c >> 6 & 0x3F)); o[2] = (char)(0x80 | (c & 0x3F)); return 3; }
    o[0] = (char)(0xF0 | c >> 18); o[1] = (char)(0x80 | (c >> 12 & 0x3F)); o[2] = (char)(0x80 | (c >> 6 & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

// NFC of valid UTF-8 s[0..n): NULL when s is NFC already (most text), else the normalized text
// (malloc'ed, NUL-terminated; its length in *out_len)
char *nfc_normalize(const uint8_t *s, size_t n, size_t *out_len);

#endif  // UNICODE_H
