// tasks.c: built-in tasks (arithmetic, countdown), JSONL user data (incl. GSM8K
// answers), the countdown expression evaluator and the reward functions. See
// tasks.h for the API. Depends on common.h and cJSON.
//
// Splits. Every problem has a canonical form ("17+25=" with the operands of '+'
// ordered, "3,5,7->22" with the numbers sorted, or the JSONL prompt); its hash
// (task_key, independent of the seed) decides once and for all whether it is a
// training or a held-out problem. So the two splits are disjoint for any seed and
// any number of examples drawn, and a permutation of a held-out problem is
// held-out too. The seed only changes the order in which problems come.
#include "tasks/tasks.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "text/unicode.h"


void example_free(Example *ex) {
    free(ex->prompt), free(ex->answer), free(ex->system), free(ex->messages), free(ex->columns);
    ex->prompt = ex->answer = ex->system = ex->messages = ex->columns = NULL;
}

static char *str_dup_or_null(const char *s) { return s ? str_dup(s) : NULL; }

TaskOptions task_options_default(void) {
    TaskOptions o = {1, 99, 3, 9, 0.1};
    return o;
}

// ----------------------------------------------------------------------------
// split keys

uint64_t task_key(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then one splitmix round to spread the low bits
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return splitmix64(&h);
}

Split task_split_of_key(uint64_t key, double frac) {
    return (double)(key % 1000000ull) < frac * 1e6 ? SPLIT_HELDOUT : SPLIT_TRAIN;
}

// a stream per (seed, split, index, purpose)
static Rng stream(uint64_t seed, int split, uint64_t i, uint64_t purpose) {
    uint64_t x = seed ^ 0x5851f42d4c957f2dull * (uint64_t)(split + 1);
    uint64_t a = splitmix64(&x);
    x = a ^ i * 0x9e3779b97f4a7c15ull ^ purpose;
    splitmix64(&x);
    return rng_make(x);
}

static void shuffle(uint32_t *a, long n, Rng *r) {
    for (long i = n - 1; i > 0; i--) {
        long j = (long)(rng_u64(r) % (uint64_t)(i + 1));
        uint32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

// ----------------------------------------------------------------------------
// arithmetic: code = op * M^2 + a * M + b with M = max_operand + 1; op 0 '+', 1 '-' (a >= b)

static void arith_text(const TaskOptions *o, uint32_t code, char *prompt, size_t pcap, char *canon, size_t ccap, long *ans) {
    long M = o->max_operand + 1, op = code / (M * M), a = (code / M) % M, b = code % M;
    snprintf(prompt, pcap, "%ld%c%ld=", a, op ? '-' : '+', b);
    // a+b and b+a are one problem for the split: commutativity must not leak held-out sums into training
    if (op) snprintf(canon, ccap, "%ld-%ld=", a, b);
    else snprintf(canon, ccap, "%ld+%ld=", a < b ? a : b, a < b ? b : a);
    *ans = op ? a - b : a + b;
}

static int arith_open(Task *t, char *err, size_t cap) {
    const TaskOptions *o = &t->opt;
    if (o->max_operand < 1 || o->max_operand > 9999)
        return error_msg(err, cap, "arithmetic: max_operand %d out of range: use 1..9999", o->max_operand);
    long M = o->max_operand + 1, total = 2 * M * M;
    for (int s = 0; s < 2; s++) t->order[s] = (uint32_t *)mallocCheck((size_t)total * sizeof(uint32_t));
    char p[32], c[32];
    long ans;
    for (long code = 0; code < total; code++) {
        long op = code / (M * M), a = (code / M) % M, b = code % M;
        if (op && a < b) continue;  // differences stay non-negative
        arith_text(o, (uint32_t)code, p, sizeof p, c, sizeof c, &ans);
        Split s = task_split_of_key(task_key(c), o->heldout_frac);
        t->order[s][t->n[s]++] = (uint32_t)code;
    }
    for (int s = 0; s < 2; s++) {
        Rng r = stream(o->seed, s, 0, 0xa417);
        shuffle(t->order[s], t->n[s], &r);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// expressions: recursive descent, exact rationals

static int64_t gcd64(int64_t a, int64_t b) {
    if (a < 0) a = -a;
    if (b < 0) b = -b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// a op b into *r; -1 on overflow or division by zero
static int rat_op(Rational a, Rational b, char op, Rational *r, const char **why) {
    int64_t n, d, x, y;
    switch (op) {
    case '+':
    case '-':
        if (__builtin_mul_overflow(a.num, b.den, &x) || __builtin_mul_overflow(b.num, a.den, &y) ||
            (op == '+' ? __builtin_add_overflow(x, y, &n) : __builtin_sub_overflow(x, y, &n)) ||
            __builtin_mul_overflow(a.den, b.den, &d)) { *why = "number overflow"; return -1; }
        break;
    case '*':
        if (__builtin_mul_overflow(a.num, b.num, &n) || __builtin_mul_overflow(a.den, b.den, &d)) { *why = "number overflow"; return -1; }
        break;
    default:  // '/'
        if (b.num == 0) { *why = "division by zero"; return -1; }
        if (__builtin_mul_overflow(a.num, b.den, &n) || __builtin_mul_overflow(a.den, b.num, &d)) { *why = "number overflow"; return -1; }
        break;
    }
    if (d < 0) {
        if (n == INT64_MIN || d == INT64_MIN) { *why = "number overflow"; return -1; }
        n = -n, d = -d;
    }
    int64_t g = gcd64(n, d);
    if (g > 1) n /= g, d /= g;
    r->num = n;
    r->den = d;
    return 0;
}

typedef struct {
    const char *s, *p;
    long *lits;
    int max_lits, n_lits, depth;
    const char *why;  // the first error
    int at;           // its position
} Parser;

static void skip_ws(Parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t') ps->p++;
}
static int perr(Parser *ps, const char *why) {
    if (!ps->why) ps->why = why, ps->at = (int)(ps->p - ps->s);
    return -1;
}

static int parse_expr(Parser *ps, Rational *v);

static int parse_factor(Parser *ps, Rational *v) {
    skip_ws(ps);
    if (*ps->p == '(') {
        if (++ps->depth > 64) return perr(ps, "too deeply nested");
        ps->p++;
        if (parse_expr(ps, v)) return -1;
        skip_ws(ps);
        if (*ps->p != ')') return perr(ps, "missing ')'");
        ps->p++;
        ps->depth--;
        return 0;
    }
    if (isdigit((unsigned char)*ps->p)) {
        long x = 0;
        int nd = 0;
        while (isdigit((unsigned char)*ps->p)) {
            if (++nd > 9) return perr(ps, "number too long");
            x = x * 10 + (*ps->p++ - '0');
        }
        if (ps->n_lits < ps->max_lits && ps->lits) ps->lits[ps->n_lits] = x;
        ps->n_lits++;
        v->num = x;
        v->den = 1;
        return 0;
    }
    return perr(ps, *ps->p ? "expected a number or '('" : "expression ends too early");
}

static int parse_term(Parser *ps, Rational *v) {
    if (parse_factor(ps, v)) return -1;
    for (;;) {
        skip_ws(ps);
        char op = *ps->p;
        if (op != '*' && op != '/') return 0;
        ps->p++;
        Rational r;
        if (parse_factor(ps, &r)) return -1;
        const char *why;
        if (rat_op(*v, r, op, v, &why)) return perr(ps, why);
    }
}

static int parse_expr(Parser *ps, Rational *v) {
    if (parse_term(ps, v)) return -1;
    for (;;) {
        skip_ws(ps);
        char op = *ps->p;
        if (op != '+' && op != '-') return 0;
        ps->p++;
        Rational r;
        if (parse_term(ps, &r)) return -1;
        const char *why;
        if (rat_op(*v, r, op, v, &why)) return perr(ps, why);
    }
}

int expr_eval(const char *s, Rational *value, long *lits, int max_lits, int *n_lits, char *err, size_t cap) {
    Parser ps = {s, s, lits, max_lits, 0, 0, NULL, 0};
    Rational v = {0, 1};
    int rc = parse_expr(&ps, &v);
    if (!rc) {
        skip_ws(&ps);
        if (*ps.p) rc = perr(&ps, "unexpected character");
    }
    if (n_lits) *n_lits = ps.n_lits;
    if (rc) {
        char c = s[ps.at];
        if (c && isprint((unsigned char)c)) return error_msg(err, cap, "%s: '%c' at %d", ps.why, c, ps.at);
        return error_msg(err, cap, "%s (at %d)", ps.why, ps.at);
    }
    *value = v;
    return 0;
}

int countdown_check(const int *nums, int n, long target, const char *expr, char *err, size_t cap) {
    Rational v;
    long lits[32];
    int nl;
    if (expr_eval(expr, &v, lits, 32, &nl, err, cap)) return 0;
    if (nl > n) return error_msg(err, cap, "uses %d numbers, only %d are given", nl, n), 0;
    int used[COUNTDOWN_MAX_NUMS] = {0};
    for (int i = 0; i < nl; i++) {
        int k = 0;
        while (k < n && (used[k] || nums[k] != lits[i])) k++;
        if (k == n) return error_msg(err, cap, "uses %ld, which is not one of the given numbers (or is used twice)", lits[i]), 0;
        used[k] = 1;
    }
    if (v.den != 1 || v.num != target) {
        if (v.den == 1) error_msg(err, cap, "evaluates to %lld, not %ld", (long long)v.num, target);
        else error_msg(err, cap, "evaluates to %lld/%lld, not %ld", (long long)v.num, (long long)v.den, target);
        return 0;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// countdown generation: combine the numbers pairwise with random operations
// until one value is left; keep it when it is a positive integer <= 999 that is
// not itself one of the numbers (no one-token answers).

typedef struct {
    Rational v;
    char s[96];
    int prec;  // 0 literal, 1 + -, 2 * /
} Item;

static int combine(const Item *a, const Item *b, char op, Item *out) {
    const char *why;
    if (rat_op(a->v, b->v, op, &out->v, &why)) return -1;
    if (out->v.den != 1 || out->v.num <= 0 || out->v.num > 999) return -1;  // integers along the way: readable answers
    int p = (op == '+' || op == '-') ? 1 : 2;
    // parentheses only where needed: a lower-precedence operand, or an equal one right of - or /
    int pl = a->prec && a->prec < p, pr = b->prec && (b->prec < p || (b->prec == p && (op == '-' || op == '/')));
    int n = snprintf(out->s, sizeof out->s, "%s%s%s%c%s%s%s", pl ? "(" : "", a->s, pl ? ")" : "", op, pr ? "(" : "", b->s, pr ? ")" : "");
    if (n < 0 || (size_t)n >= sizeof out->s) return -1;
    out->prec = p;
    return 0;
}

static void countdown_make(const TaskOptions *o, Split split, uint64_t i, Example *ex) {
    int n = o->countdown_numbers;
    for (uint64_t attempt = 0;; attempt++) {
        if (attempt > 100000) die("countdown: no problem found for the %s split (countdown_numbers=%d, countdown_max=%d, heldout_frac=%g)",
                                  split == SPLIT_TRAIN ? "train" : "held-out", n, o->countdown_max, o->heldout_frac);
        Rng r = stream(o->seed, split, i, 0xc0de0000ull + attempt);
        Item it[COUNTDOWN_MAX_NUMS] = {0};
        int nums[COUNTDOWN_MAX_NUMS];
        for (int k = 0; k < n; k++) {
            nums[k] = 1 + rng_int(&r, o->countdown_max);
            it[k].v.num = nums[k], it[k].v.den = 1, it[k].prec = 0;
            snprintf(it[k].s, sizeof it[k].s, "%d", nums[k]);
        }
        int m = n, ok = 1;
        while (m > 1 && ok) {
            int a = rng_int(&r, m), b = rng_int(&r, m - 1);
            if (b >= a) b++;
            static const char ops[4] = {'+', '-', '*', '/'};
            int o0 = rng_int(&r, 4), k;
            Item res;
            for (k = 0; k < 4; k++)
                if (!combine(&it[a], &it[b], ops[(o0 + k) % 4], &res)) break;
            if (k == 4) { ok = 0; break; }
            it[a < b ? a : b] = res;               // the result takes the lower slot,
            it[a < b ? b : a] = it[m - 1];         // the last item fills the other
            m--;
        }
        if (!ok) continue;
        long target = (long)it[0].v.num;
        int trivial = 0;
        for (int k = 0; k < n; k++) trivial |= nums[k] == target;
        if (trivial) continue;
        // canonical: sorted numbers and the target
        int sorted[COUNTDOWN_MAX_NUMS];
        memcpy(sorted, nums, sizeof(int) * n);
        for (int x = 1; x < n; x++)
            for (int y = x; y > 0 && sorted[y - 1] > sorted[y]; y--) {
                int t = sorted[y];
                sorted[y] = sorted[y - 1];
                sorted[y - 1] = t;
            }
        char canon[96], prompt[96];
        int pc = 0, pp = 0;
        for (int k = 0; k < n; k++) {
            pc += snprintf(canon + pc, sizeof canon - pc, "%s%d", k ? "," : "", sorted[k]);
            pp += snprintf(prompt + pp, sizeof prompt - pp, "%s%d", k ? "," : "", nums[k]);
        }
        snprintf(canon + pc, sizeof canon - pc, "->%ld", target);
        snprintf(prompt + pp, sizeof prompt - pp, "->%ld:", target);
        uint64_t key = task_key(canon);
        if (task_split_of_key(key, o->heldout_frac) != split) continue;
        memset(ex, 0, sizeof *ex);
        ex->kind = TASK_COUNTDOWN;
        ex->prompt = str_dup(prompt);
        ex->answer = str_dup(it[0].s);
        memcpy(ex->nums, nums, sizeof(int) * n);
        ex->n_nums = n;
        ex->target = target;
        ex->key = key;
        return;
    }
}

// ----------------------------------------------------------------------------
// JSONL

static void trim_inplace(char *s) {
    size_t n = strlen(s), a = 0;
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    while (isspace((unsigned char)s[a])) a++;
    memmove(s, s + a, n - a + 1);
}

// a number literal: optional '-', digits with optional thousands commas, optional fraction
static int looks_numeric(const char *s) {
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    if (*p == '$') p++;
    int digits = 0;
    for (; *p; p++) {
        if (isdigit((unsigned char)*p)) digits++;
        else if (*p == ',' && digits) continue;
        else if (*p == '.') continue;
        else return 0;
    }
    return digits > 0;
}
static void strip_number(char *s) {  // drop ',' and '$' from a numeric answer
    char *w = s;
    for (char *r = s; *r; r++)
        if (*r != ',' && *r != '$') *w++ = *r;
    *w = 0;
}

// GSM8K: "reasoning ... #### 72" -> "72"; "1,234" -> "1234"
static int normalize_answer(char *a, char *err, size_t cap) {
    char *h = NULL, *q = a;
    while ((q = strstr(q, "####"))) h = q, q += 4;
    if (h) memmove(a, h + 4, strlen(h + 4) + 1);
    trim_inplace(a);
    if (!*a) return error_msg(err, cap, h ? "nothing after \"####\" in \"answer\"" : "\"answer\" is empty");
    if (looks_numeric(a)) strip_number(a);
    return 0;
}

// What JSON allows and a C string cannot hold, or leaves undefined, said instead of read wrongly: a
// NUL character (the text would end there, silently) and a key twice in one object (which value
// wins is up to the reader: Python's json takes the last one, cJSON the first).
static int has_nul_escape(const char *s) {  // "\u0000" (backslashes appear in JSON only inside strings)
    for (; *s; s++)
        if (*s == '\\') {
            if (s[1] == 'u' && !strncmp(s + 2, "0000", 4)) return 1;
            if (s[1]) s++;
        }
    return 0;
}
static const char *duplicate_key(const cJSON *j) {
    for (const cJSON *a = j ? j->child : NULL; a; a = a->next) {
        if (cJSON_IsObject(j))
            for (const cJSON *b = a->next; b; b = b->next)
                if (!strcmp(a->string, b->string)) return a->string;
        const char *d = duplicate_key(a);
        if (d) return d;
    }
    return NULL;
}

int jsonl_reader_open(JsonlReader *r, const char *path, char *err, size_t cap) {
    memset(r, 0, sizeof *r);
    r->path = path;
    // O_NONBLOCK: the open of a FIFO must not wait for a writer (reads of a regular file ignore it)
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return error_msg(err, cap, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    const char *what = fstat(fd, &sb) ? strerror(errno)
                       : S_ISREG(sb.st_mode) ? NULL
                       : S_ISFIFO(sb.st_mode) ? "a FIFO (pipe)"
                       : S_ISCHR(sb.st_mode) ? "a character device"
                       : S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file";
    if (what) {
        close(fd);
        return error_msg(err, cap, "%s is %s, not a file: give a .jsonl file (a stream may never end: save it to a file first)",
                         path, what);
    }
    if (sb.st_size > JSONL_MAX_FILE) {
        close(fd);
        return error_msg(err, cap, "%s holds %.2f GiB, more than the %ld GiB a data file may (its examples stay in memory for the "
                         "whole run): split it, or sample it", path, sb.st_size / 1073741824.0, JSONL_MAX_FILE >> 30);
    }
    if (!(r->f = fdopen(fd, "r"))) {
        close(fd);
        return error_msg(err, cap, "cannot read %s: %s", path, strerror(errno));
    }
    return 0;
}

void jsonl_reader_close(JsonlReader *r) {
    if (r->f) fclose(r->f);
    free(r->line);
    r->f = NULL, r->line = NULL, r->cap = 0;
}

// the next line of r->f into r->line, its '\n' dropped: its length; -1 at the end of the file; -2
// when it is longer than JSONL_MAX_LINE (what was read of it is all the memory it takes)
static long jsonl_line(JsonlReader *r) {
    size_t n = 0;
    int c;
    if (!r->line) r->line = (char *)mallocCheck(r->cap = 4096);
    while ((c = getc_unlocked(r->f)) != EOF && c != '\n') {
        if (n == JSONL_MAX_LINE) return -2;
        if (n + 1 == r->cap) {  // (room for the NUL, up to JSONL_MAX_LINE + 1 bytes)
            r->cap = 2 * r->cap < JSONL_MAX_LINE + 1 ? 2 * r->cap : JSONL_MAX_LINE + 1;
            r->line = (char *)reallocCheck(r->line, r->cap);
        }
        r->line[n++] = (char)c;
    }
    if (c == EOF && n == 0) return -1;
    r->line[n] = 0;
    return (long)n;
}

int jsonl_next(JsonlReader *r, cJSON **out, char *err, size_t cap) {
    *out = NULL;
    long len;
    while ((len = jsonl_line(r)) != -1) {
        r->lineno++;
        if (len == -2)
            return error_msg(err, cap, "%s:%ld: a line longer than %zu MiB, the limit of one example: one JSON object per line", r->path,
                             r->lineno, JSONL_MAX_LINE >> 20);
        char *s = r->line;
        if ((size_t)len != strlen(s)) return error_msg(err, cap, "%s:%ld: holds a NUL byte: not a text file", r->path, r->lineno);
        size_t ok = utf8_valid_len((const uint8_t *)s, (size_t)len);
        if (ok < (size_t)len)
            return error_msg(err, cap, "%s:%ld: not valid UTF-8 (byte 0x%02X at column %zu): save the file as UTF-8", r->path,
                             r->lineno, (unsigned char)s[ok], ok + 1);
        if (has_nul_escape(s))
            return error_msg(err, cap, "%s:%ld: a string holds \\u0000 (a NUL character), which a prompt or answer cannot", r->path,
                             r->lineno);
        while (isspace((unsigned char)*s)) s++;
        if (!*s) continue;  // blank lines are allowed
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithOpts(s, &end, 0);
        if (!j) {
            const char *e = cJSON_GetErrorPtr();
            return error_msg(err, cap, "%s:%ld: not valid JSON (near \"%.20s\")", r->path, r->lineno, e ? e : s);
        }
        while (end && isspace((unsigned char)*end)) end++;
        if (end && *end) {
            cJSON_Delete(j);
            return error_msg(err, cap, "%s:%ld: more than one JSON value on the line (one object per line)", r->path, r->lineno);
        }
        const char *dup = duplicate_key(j);
        if (dup) {
            int rc = error_msg(err, cap, "%s:%ld: the key \"%.40s\" appears twice in one object: keep one", r->path, r->lineno, dup);
            cJSON_Delete(j);
            return rc;
        }
        *out = j;
        return 1;
    }
    if (ferror(r->f)) return error_msg(err, cap, "%s:%ld: cannot read on: %s", r->path, r->lineno + 1, strerror(errno));
    return 0;
}

// A conversational prompt, TRL's [{"role": ..., "content": ...}]: an optional system message and one
// user message, the turn tokenizer_chat_prompt writes (the chat template applied by the trainer).
// NULL, *system (or NULL) and *user; or why not.
static const char *prompt_messages(const cJSON *p, const char **system, const char **user) {
    *system = *user = NULL;
    int n = cJSON_GetArraySize(p), k = 0;
    if (n < 1 || n > 2) return "\"prompt\" as messages holds an optional system message and one user message (multi-turn prompts are not supported)";
    for (const cJSON *m = p->child; m; m = m->next, k++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content))
            return "a message of \"prompt\" must be {\"role\": \"system\" or \"user\", \"content\": \"text\"}";
        int last = k == n - 1;
        if (!strcmp(role->valuestring, "system") && !last) *system = content->valuestring;
        else if (!strcmp(role->valuestring, "user") && last) *user = content->valuestring;
        else return "\"prompt\" as messages must be [{\"role\": \"system\", ...} (optional), {\"role\": \"user\", ...}]";
    }
    return *user[0] ? NULL : "the user message of \"prompt\" is empty";
}

// the names a reward program's request gives its own entries (reward_program.h), which a column cannot have
static const char *const RESERVED_COLUMNS[] = {"prompts", "completions", "completion_ids", "truncated", "trainer_state"};

static int jsonl_open(Task *t, const char *path, char *err, size_t cap) {
    JsonlReader rd;
    if (jsonl_reader_open(&rd, path, err, cap)) return -1;
    long ncap = 0;
    int rc;
    cJSON *j;
    while ((rc = jsonl_next(&rd, &j, err, cap)) > 0) {
        long lineno = rd.lineno;
        const char *why = NULL, *system = NULL, *user = NULL;
        cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        if (!p) p = cJSON_GetObjectItemCaseSensitive(j, "question");  // GSM8K's own files say "question"
        cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "answer");
        if (cJSON_IsNull(a)) a = NULL;  // (a column datasets fill with None where a line lacks it)
        char num[64], reserved[160];
        if (!cJSON_IsObject(j)) why = "not a JSON object";
        else if (!p) why = "missing \"prompt\"";
        else if (cJSON_IsArray(p)) why = prompt_messages(p, &system, &user);
        else if (!cJSON_IsString(p)) why = "\"prompt\" must be a string or a list of messages";
        else if (!*p->valuestring) why = "\"prompt\" is empty";
        else user = p->valuestring;
        if (!why && a && !cJSON_IsString(a) && !cJSON_IsNumber(a)) why = "\"answer\" must be a string or a number";
        for (size_t k = 0; !why && k < sizeof RESERVED_COLUMNS / sizeof *RESERVED_COLUMNS; k++)
            if (cJSON_GetObjectItemCaseSensitive(j, RESERVED_COLUMNS[k])) {
                snprintf(reserved, sizeof reserved, "the column \"%s\" has the name of a reward program's own argument: rename it",
                         RESERVED_COLUMNS[k]);
                why = reserved;
            }
        if (why) {
            rc = error_msg(err, cap, "%s:%ld: %s", path, lineno, why);
            cJSON_Delete(j);
            break;
        }
        char *ans = NULL;
        if (a && cJSON_IsNumber(a)) {
            snprintf(num, sizeof num, "%.15g", a->valuedouble);
            ans = str_dup(num);
        } else if (a) ans = str_dup(a->valuestring);
        char aerr[128];
        if (ans && normalize_answer(ans, aerr, sizeof aerr)) {
            rc = error_msg(err, cap, "%s:%ld: %s", path, lineno, aerr);
            free(ans);
            cJSON_Delete(j);
            break;
        }
        if (t->n_items == ncap) {
            ncap = ncap ? 2 * ncap : 256;
            t->items = (Example *)reallocCheck(t->items, (size_t)ncap * sizeof(Example));
        }
        Example *ex = &t->items[t->n_items++];
        memset(ex, 0, sizeof *ex);
        ex->kind = TASK_JSONL;
        ex->prompt = str_dup(user);
        ex->answer = ans;
        ex->system = str_dup_or_null(system);
        if (cJSON_IsArray(p)) ex->messages = cJSON_PrintUnformatted(p);
        ex->key = task_key(ex->messages ? ex->messages : ex->prompt);
        t->n_unanswered += !ans;
        t->n_conversational += ex->messages != NULL;
        cJSON_Delete(cJSON_DetachItemViaPointer(j, p));  // the other columns, for the reward programs
        ex->columns = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
    }
    jsonl_reader_close(&rd);
    if (rc) return rc;
    if (t->n_items == 0) return error_msg(err, cap, "%s: no examples (one JSON object per line with a \"prompt\")", path);
    if (t->n_items > 0xffffffffL) return error_msg(err, cap, "%s: too many examples", path);
    for (int s = 0; s < 2; s++) t->order[s] = (uint32_t *)mallocCheck((size_t)t->n_items * sizeof(uint32_t));
    for (long k = 0; k < t->n_items; k++) {
        Split s = task_split_of_key(t->items[k].key, t->opt.heldout_frac);
        t->order[s][t->n[s]++] = (uint32_t)k;
    }
    if (t->n[SPLIT_TRAIN] == 0) {  // a tiny file that hashed entirely to held-out: train on it all
        memcpy(t->order[SPLIT_TRAIN], t->order[SPLIT_HELDOUT], (size_t)t->n[SPLIT_HELDOUT] * sizeof(uint32_t));
        t->n[SPLIT_TRAIN] = t->n[SPLIT_HELDOUT];
        t->n[SPLIT_HELDOUT] = 0;
    }
    for (int s = 0; s < 2; s++) {
        Rng r = stream(t->opt.seed, s, 0, 0x150e);
        shuffle(t->order[s], t->n[s], &r);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// tasks

int task_open(Task *t, const char *spec, const TaskOptions *opt, char *err, size_t cap) {
    memset(t, 0, sizeof *t);
    t->opt = opt ? *opt : task_options_default();
    snprintf(t->name, sizeof t->name, "%s", spec);
    if (!(t->opt.heldout_frac >= 0 && t->opt.heldout_frac < 1))
        return error_msg(err, cap, "heldout_frac %g out of range: use [0, 1)", t->opt.heldout_frac);
    int rc;
    if (!strcmp(spec, "arithmetic")) {
        t->kind = TASK_ARITHMETIC;
        rc = arith_open(t, err, cap);
    } else if (!strcmp(spec, "countdown")) {
        t->kind = TASK_COUNTDOWN;
        if (t->opt.countdown_numbers < 2 || t->opt.countdown_numbers > COUNTDOWN_MAX_NUMS)
            return error_msg(err, cap, "countdown: countdown_numbers %d out of range: use 2..%d", t->opt.countdown_numbers, COUNTDOWN_MAX_NUMS);
        if (t->opt.countdown_max < 2 || t->opt.countdown_max > 999)
            return error_msg(err, cap, "countdown: countdown_max %d out of range: use 2..999", t->opt.countdown_max);
        rc = 0;
    } else {
        size_t n = strlen(spec);
        struct stat sb;  // (not opened here: a FIFO's open would wait for a writer)
        if (stat(spec, &sb) && (n < 6 || strcmp(spec + n - 6, ".jsonl")))
            return error_msg(err, cap, "unknown task '%s': use arithmetic, countdown or a .jsonl file", spec);
        t->kind = TASK_JSONL;
        rc = jsonl_open(t, spec, err, cap);
    }
    if (rc) task_free(t);
    return rc;
}

void task_open_or_die(Task *t, const char *spec, const TaskOptions *opt) {
    char err[512];
    if (task_open(t, spec, opt, err, sizeof err)) die("%s", err);
}

void task_free(Task *t) {
    for (long k = 0; k < t->n_items; k++) example_free(&t->items[k]);
    free(t->items);
    free(t->order[0]);
    free(t->order[1]);
    t->items = NULL;
    t->order[0] = t->order[1] = NULL;
    t->n_items = t->n[0] = t->n[1] = 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int task_set_eval_file(Task *t, const char *path, long *both, char *err, size_t cap) {
    if (t->kind != TASK_JSONL || t->opt.heldout_frac != 0 || t->n[SPLIT_HELDOUT])
        return error_msg(err, cap, "an evaluation file needs a JSONL task opened with heldout_frac 0");
    Task ev;
    TaskOptions o = t->opt;
    if (task_open(&ev, path, &o, err, cap)) return -1;
    // the shared prompts, by key: the training file's keys sorted, each of ev's looked up
    uint64_t *keys = (uint64_t *)mallocCheck((size_t)t->n_items * sizeof(uint64_t));
    for (long k = 0; k < t->n_items; k++) keys[k] = t->items[k].key;
    qsort(keys, (size_t)t->n_items, sizeof *keys, cmp_u64);
    *both = 0;
    for (long k = 0; k < ev.n_items; k++) *both += bsearch(&ev.items[k].key, keys, (size_t)t->n_items, sizeof *keys, cmp_u64) != NULL;
    free(keys);
    if (t->n_items + ev.n_items > 0xffffffffL) {
        task_free(&ev);
        return error_msg(err, cap, "%s: too many examples", path);
    }
    // ev's examples appended to the task's, the held-out order over them (shuffled as a split is)
    long base = t->n_items;
    t->items = (Example *)reallocCheck(t->items, (size_t)(base + ev.n_items) * sizeof(Example));
    memcpy(t->items + base, ev.items, (size_t)ev.n_items * sizeof(Example));
    free(t->order[SPLIT_HELDOUT]);
    t->order[SPLIT_HELDOUT] = (uint32_t *)mallocCheck((size_t)ev.n_items * sizeof(uint32_t));
    for (long k = 0; k < ev.n_items; k++) t->order[SPLIT_HELDOUT][k] = (uint32_t)(base + k);
    t->n[SPLIT_HELDOUT] = ev.n_items;
    t->n_items = base + ev.n_items;
    t->n_unanswered += ev.n_unanswered, t->n_conversational += ev.n_conversational;
    Rng r = stream(t->opt.seed, SPLIT_HELDOUT, 0, 0x150e);
    shuffle(t->order[SPLIT_HELDOUT], t->n[SPLIT_HELDOUT], &r);
    free(ev.items);  // (their strings now belong to t)
    free(ev.order[0]);
    free(ev.order[1]);
    return 0;
}

long task_size(const Task *t, Split s) { return t->kind == TASK_COUNTDOWN ? -1 : t->n[s]; }

void task_example(const Task *t, Split s, uint64_t i, Example *ex) {
    if (t->kind == TASK_COUNTDOWN) {
        countdown_make(&t->opt, s, i, ex);
        return;
    }
    if (t->n[s] == 0)
        die("task %s has no %s examples (heldout_frac = %g): use more data, a larger heldout_frac, or a separate eval file", t->name,
            s == SPLIT_TRAIN ? "training" : "held-out", t->opt.heldout_frac);
    uint32_t k = t->order[s][i % (uint64_t)t->n[s]];
    memset(ex, 0, sizeof *ex);
    if (t->kind == TASK_JSONL) {
        const Example *src = &t->items[k];
        ex->kind = TASK_JSONL;
        ex->prompt = str_dup(src->prompt);
        ex->answer = str_dup_or_null(src->answer);
        ex->system = str_dup_or_null(src->system);
        ex->messages = str_dup_or_null(src->messages);
        ex->columns = str_dup_or_null(src->columns);
        ex->key = src->key;
        return;
    }
    char prompt[32], canon[32], ans[32];
    long v;
    arith_text(&t->opt, k, prompt, sizeof prompt, canon, sizeof canon, &v);
    snprintf(ans, sizeof ans, "%ld", v);
    ex->kind = TASK_ARITHMETIC;
    ex->prompt = str_dup(prompt);
    ex->answer = str_dup(ans);
    ex->key = task_key(canon);
}

// ----------------------------------------------------------------------------
// answer extraction and rewards

// the last "<answer>...</answer>" (the closing tag may be missing at the end)
static int find_tag(const char *c, char *out, size_t cap) {
    const char *open = NULL, *q = c;
    while ((q = strstr(q, "<answer>"))) open = q, q += 8;
    if (!open) return 0;
    open += 8;
    const char *close = strstr(open, "</answer>");
    size_t n = close ? (size_t)(close - open) : strlen(open);
    if (n >= cap) n = cap - 1;
    memcpy(out, open, n);
    out[n] = 0;
    return 1;
}

// the contents of the last \boxed{...}, braces balanced
static int find_boxed(const char *c, char *out, size_t cap) {
    const char *b = NULL, *q = c;
    while ((q = strstr(q, "\\boxed{"))) b = q, q += 7;
    if (!b) return 0;
    b += 7;
    int depth = 1;
    const char *e = b;
    while (*e && depth) {
        depth += *e == '{';
        depth -= *e == '}';
        if (depth) e++;
    }
    if (depth) return 0;  // unbalanced: not an answer
    size_t n = (size_t)(e - b);
    if (n >= cap) n = cap - 1;
    memcpy(out, b, n);
    out[n] = 0;
    return 1;
}

enum { MARK_NONE = 0, MARK_TAG, MARK_HASHES, MARK_BOXED };

static int extract(const Example *ex, const char *c, char *out, size_t cap) {
    int mark = find_tag(c, out, cap) ? MARK_TAG : MARK_NONE;
    if (!mark && ex->kind == TASK_JSONL) {
        const char *h = NULL, *q = c;
        while ((q = strstr(q, "####"))) h = q, q += 4;
        if (h) {
            snprintf(out, cap, "%s", h + 4);
            mark = MARK_HASHES;
        } else if (find_boxed(c, out, cap)) mark = MARK_BOXED;
    }
    if (!mark) snprintf(out, cap, "%s", c);
    trim_inplace(out);
    return mark;
}

int extract_answer(const Example *ex, const char *c, char *out, size_t cap) { return extract(ex, c, out, cap) != MARK_NONE; }

// a number in text: [-]digits[,digits...][.digits]; returns its end, or NULL if none at p
static const char *scan_number(const char *p, double *v) {
    const char *s = p;
    char buf[64];
    int n = 0;
    if (*p == '-') buf[n++] = *p++;
    if (!isdigit((unsigned char)*p)) return NULL;
    while (n < 60 && (isdigit((unsigned char)*p) || (*p == ',' && isdigit((unsigned char)p[1]) && p > s && isdigit((unsigned char)p[-1])))) {
        if (*p != ',') buf[n++] = *p;
        p++;
    }
    if (*p == '.' && isdigit((unsigned char)p[1])) {
        buf[n++] = *p++;
        while (n < 62 && isdigit((unsigned char)*p)) buf[n++] = *p++;
    }
    buf[n] = 0;
    *v = strtod(buf, NULL);
    return p;
}

// the first (last = 0) or the last (last = 1) number in s; 0 if none
static int find_number(const char *s, int last, double *v) {
    int found = 0;
    for (const char *p = s; *p;) {
        // a '-' is a sign only at the start or after a non-alphanumeric ("5-3" is two numbers)
        int sign_ok = *p == '-' && (p == s || !isalnum((unsigned char)p[-1]));
        if (isdigit((unsigned char)*p) || sign_ok) {
            double x;
            const char *e = scan_number(p, &x);
            if (e) {
                *v = x;
                found = 1;
                if (!last) return 1;
                p = e;
                continue;
            }
        }
        p++;
    }
    return found;
}

static int is_integer_text(const char *s, long *v) {
    const char *p = s;
    if (*p == '-') p++;
    if (!isdigit((unsigned char)*p)) return 0;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return 0;
    if (strlen(p) > 12) return 0;
    *v = strtol(s, NULL, 10);
    return 1;
}

double reward_correctness(const Example *ex, const char *completion, int truncated) {
    if (!ex->answer) return NAN;  // a JSONL line without one: does not apply
    char a[1024];
    int mark = extract(ex, completion, a, sizeof a);
    switch (ex->kind) {
    case TASK_ARITHMETIC: {
        long got, want;
        return is_integer_text(a, &got) && is_integer_text(ex->answer, &want) && got == want ? 1.0 : 0.0;
    }
    case TASK_COUNTDOWN:
        return countdown_check(ex->nums, ex->n_nums, ex->target, a, NULL, 0) ? 1.0 : 0.0;
    default: {
        char want[256];
        snprintf(want, sizeof want, "%s", ex->answer);
        if (looks_numeric(want)) {
            strip_number(want);
            double w = strtod(want, NULL), got;
            char *b = a;
            for (char *r = a; *r; r++) if (*r != '$') *b++ = *r;  // "$1,234" -> "1,234"
            *b = 0;
            // after "####" the first number is the answer; elsewhere the last one
            if (!find_number(a, mark != MARK_HASHES, &got)) return 0.0;
            return fabs(got - w) <= 1e-6 * (fabs(w) > 1 ? fabs(w) : 1) ? 1.0 : 0.0;
        }
        return strcasecmp(a, want) == 0 ? 1.0 : 0.0;
    }
    }
}

double reward_format(const Example *ex, const char *completion, int truncated) {
    if (truncated) return 0.0;
    char a[1024];
    int mark = extract(ex, completion, a, sizeof a);
    switch (ex->kind) {
    case TASK_ARITHMETIC: {
        long v;
        return is_integer_text(a, &v) ? 1.0 : 0.0;
    }
    case TASK_COUNTDOWN: {
        Rational v;
        int n;
        char err[8];
        return expr_eval(a, &v, NULL, 0, &n, err, sizeof err) == 0 && *a ? 1.0 : 0.0;
    }
    default:
        return mark != MARK_NONE ? 1.0 : 0.0;
    }
}

const RewardDef REWARD_FUNCS[] = {
    {"correctness", reward_correctness, 1.0},
    {"format", reward_format, 0.2},  // a nudge towards clean, terminated answers; correctness dominates
};
const int N_REWARD_FUNCS = (int)(sizeof REWARD_FUNCS / sizeof REWARD_FUNCS[0]);
