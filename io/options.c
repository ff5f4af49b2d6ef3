// options.c: the command-line parser of ./train_grpo and ./generate (options.h says the rules).
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "io/options.h"
#include "text/unicode.h"

// the row named name (underscore form), or -1
static int opt_find(const OptionTable *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (t->rows[i].kind != OPT_SECTION && !strcmp(t->rows[i].name, name)) return i;
    return -1;
}

// 1, 0, or -1 when v is not a boolean word
static int opt_bool(const char *v) {
    static const char *yes[] = {"true", "True", "1", "yes", "on"}, *no[] = {"false", "False", "0", "no", "off"};
    for (int i = 0; i < 5; i++) {
        if (!strcmp(v, yes[i])) return 1;
        if (!strcmp(v, no[i])) return 0;
    }
    return -1;
}

// "a|b|c" -> "a, b or c"
static void opt_choices_text(const char *choices, char *out, size_t cap) {
    size_t n = 0, bars = 0;
    for (const char *c = choices; *c; c++) bars += *c == '|';
    out[0] = 0;
    for (const char *c = choices; *c && n + 5 < cap; c++) {
        if (*c != '|') { out[n++] = *c; continue; }
        const char *sep = --bars ? ", " : " or ";
        memcpy(out + n, sep, strlen(sep));
        n += strlen(sep);
    }
    out[n] = 0;
}

static int opt_is_choice(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *c = choices; *c;) {
        size_t k = strcspn(c, "|");
        if (k == n && !strncmp(c, v, n)) return 1;
        c += k + (c[k] == '|');
    }
    return 0;
}

// row i's value from text v (a command-line value or a default); dies naming the option
static void opt_set(OptionTable *t, int i, const char *v) {
    const Option *o = &t->rows[i];
    void *p = (char *)t->base + o->off;
    char *end, what[256], err[256];
    switch (o->kind) {
        case OPT_INT:
        case OPT_LONG: {
            if (o->hi >= 1e9) snprintf(what, sizeof what, "an integer >= %.0f", o->lo);
            else snprintf(what, sizeof what, "an integer in [%.0f, %.0f]", o->lo, o->hi);
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (end == v || *end) die("--%s: '%s' is not %s", o->name, v, what);
            if ((errno == ERANGE && x > 0) || x > o->hi) die("--%s: %s is too large: at most %.0f", o->name, v, o->hi);
            if (errno == ERANGE || x < o->lo) die("--%s: %s is too small: at least %.0f", o->name, v, o->lo);
            if (o->kind == OPT_LONG) *(long *)p = (long)x;
            else *(int *)p = (int)x;
            break;
        }
        case OPT_DOUBLE: {
            double x = strtod(v, &end);
            if (end == v || *end || !(x >= o->lo && x <= o->hi)) die("--%s: '%s' is not a number in [%g, %g]", o->name, v, o->lo, o->hi);
            *(double *)p = x;
            break;
        }
        case OPT_STRING: *(const char **)p = v; break;
        case OPT_TEXT: {  // (the tokenizer would read stray bytes as U+FFFD: the prompt would not be the one given)
            size_t n = strlen(v), ok = utf8_valid_len((const uint8_t *)v, n);
            if (ok < n) die("--%s: not valid UTF-8 (byte 0x%02X at offset %zu): give the text in UTF-8", o->name, (unsigned char)v[ok], ok);
            *(const char **)p = v;
            break;
        }
        case OPT_LIST: {
            OptList *l = (OptList *)p;
            if (l->n == OPT_LIST_MAX) die("--%s: given more than %d times", o->name, OPT_LIST_MAX);
            l->v[l->n++] = v;
            break;
        }
        case OPT_CHOICE:
            opt_choices_text(o->choices, what, sizeof what);
            if (!opt_is_choice(o->choices, v)) die("--%s: unknown value '%s': use %s", o->name, v, what);
            *(const char **)p = v;
            break;
        case OPT_FLAG: {
            int b = opt_bool(v);
            if (b < 0) die("--%s: '%s' is not true or false", o->name, v);
            *(int *)p = b;
            break;
        }
        case OPT_GRPO:
        case OPT_GRPO_FLAG: {
            if (!t->grpo) die("option table: --%s is a GRPO option but the table has no GrpoConfig", o->name);
            int r = grpo_config_set(t->grpo, o->name, v, err, sizeof err);
            if (r == 1) die("option table: --%s is not an option grpo_config_set knows", o->name);
            size_t n = strlen(o->name);
            if (r < 0) {  // grpo.c's messages often start with the name: "beta must be >= 0 (got -1)"
                if (!strncmp(err, o->name, n) && (err[n] == ' ' || err[n] == ':')) die("--%s", err);
                die("--%s: %s", o->name, err);
            }
            break;
        }
        case OPT_SECTION: break;
    }
}

// Defaults, then argv, then the --model defaults of the options argv did not name.
// --help or -h anywhere: the help on stdout, exit 0.
void options_parse(OptionTable *t, int argc, char **argv) {
    if (t->n > OPTIONS_MAX) die("option table: %d rows, more than OPTIONS_MAX %d", t->n, OPTIONS_MAX);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            options_help(t, stdout);
            exit(0);
        }
    if (t->grpo) *t->grpo = grpo_config_default();
    for (int k = 0; k < t->n; k++)
        if (t->rows[k].kind != OPT_SECTION && t->rows[k].dflt) opt_set(t, k, t->rows[k].dflt);
    memset(t->given, 0, sizeof t->given);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) || !a[2]) die("unexpected argument '%s' (options start with --; see --help)", a);
        const char *eq = strchr(a, '='), *val = eq ? eq + 1 : NULL;  // into argv: lives as long as the program
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        char name[128];
        if (len >= sizeof name) die("unknown option --%.60s... (see --help)", a + 2);
        for (size_t c = 0; c < len; c++) name[c] = a[2 + c] == '-' ? '_' : a[2 + c];
        name[len] = 0;
        int k = opt_find(t, name);
        if (k < 0) {  // a near name: one holding what was typed as a word (--fp8: --load_in_fp8), else at all
            for (int pass = 0; pass < 2 && len >= 3; pass++)
                for (int j = 0; j < t->n; j++) {
                    const char *rn = t->rows[j].name, *at = t->rows[j].kind == OPT_SECTION ? NULL : strstr(rn, name);
                    int word = at && (at == rn || at[-1] == '_') && (at[len] == 0 || at[len] == '_');
                    if (at && (word || pass == 1))
                        die("unknown option --%.*s: did you mean --%s? (see --help)", (int)len, a + 2, rn);
                }
            die("unknown option --%.*s (see --help)", (int)len, a + 2);
        }
        OptKind kind = t->rows[k].kind;
        if (!val && (kind == OPT_FLAG || kind == OPT_GRPO_FLAG))
            val = i + 1 < argc && opt_bool(argv[i + 1]) >= 0 ? argv[++i] : "true";
        if (!val) {
            if (i + 1 >= argc) die("--%s needs a value (see --help)", t->rows[k].name);
            val = argv[++i];
        }
        if (t->given[k] && kind != OPT_LIST) die("--%s is given twice (the second time as '%.60s'): give it once", t->rows[k].name, val);
        opt_set(t, k, val);
        t->given[k] = 1;
    }
    int k_model = opt_find(t, "model");
    if (k_model >= 0 && t->given[k_model])
        for (int k = 0; k < t->n; k++)
            if (t->rows[k].dflt_model && !t->given[k]) opt_set(t, k, t->rows[k].dflt_model);
}

// 1 when the command line named the option
int options_given(const OptionTable *t, const char *name) {
    int k = opt_find(t, name);
    return k >= 0 && t->given[k];
}

// --help: by section, each option with its value's name, meaning and default, wrapped at 100 columns
void options_help(const OptionTable *t, FILE *f) {
    enum { COL = 34, WIDTH = 100 };
    GrpoConfig gd = grpo_config_default();
    fprintf(f, "%s\n", t->usage);
    for (int k = 0; k < t->n; k++) {
        const Option *o = &t->rows[k];
        if (o->kind == OPT_SECTION) {
            fprintf(f, "\n%s:\n", o->name);
            continue;
        }
        const char *meta = o->meta;
        if (!meta) {
            switch (o->kind) {
                case OPT_INT:
                case OPT_LONG: meta = "N"; break;
                case OPT_DOUBLE: meta = "X"; break;
                case OPT_CHOICE: meta = o->choices; break;
                case OPT_GRPO: meta = o->choices ? o->choices : "X"; break;
                case OPT_STRING:
                case OPT_TEXT: meta = "TEXT"; break;
                case OPT_LIST: meta = "TEXT"; break;
                default: meta = "";
            }
        }
        char buf[128], text[1024];
        const char *d = o->dflt;
        if (!d && (o->kind == OPT_GRPO || o->kind == OPT_GRPO_FLAG) && grpo_config_get(&gd, o->name, buf, sizeof buf) == 0) d = buf;
        if (!d && o->kind != OPT_FLAG) d = o->unset ? o->unset : "none";  // flags are off unless given
        int n = snprintf(text, sizeof text, "%s", o->help);
        if (d && o->dflt_model)
            snprintf(text + n, sizeof text - n, " (default: %s; %s with --model)", d, o->dflt_model);
        else if (d)
            snprintf(text + n, sizeof text - n, " (default: %s)", d);
        int col = fprintf(f, "  --%s%s%s", o->name, *meta ? " " : "", meta);
        if (col >= COL - 1) {
            fprintf(f, "\n");
            col = 0;
        }
        fprintf(f, "%*s", COL - col, "");
        col = COL;
        for (const char *w = text; *w;) {  // word-wrap the meaning
            size_t wl = strcspn(w, " ");
            if (col > COL && col + 1 + (int)wl > WIDTH) {
                fprintf(f, "\n%*s", COL, "");
                col = COL;
            } else if (col > COL) {
                fputc(' ', f);
                col++;
            }
            fprintf(f, "%.*s", (int)wl, w);
            col += (int)wl;
            w += wl;
            while (*w == ' ') w++;
        }
        fprintf(f, "\n");
    }
}

const Backend *backend_select(const char *device, int verbose) {
    backend_env_rows("FP8GRPO_LOGITS_CHUNK_ROWS");
    backend_env_rows("FP8GRPO_HEAD_GROUP_ROWS");
    char why[256] = "";
    const Backend *be = NULL;
    if (!strcmp(device, "cpu")) be = backend_cpu();
    else if (!strcmp(device, "cuda")) {
        be = backend_cuda(why, sizeof why);
        if (!be) die("--device cuda: %s", why);
    } else if (!strcmp(device, "auto")) {
        be = backend_cuda(why, sizeof why);
        if (!be) {
            be = backend_cpu();
            if (verbose) fprintf(stderr, "no usable GPU (%s): running on the CPU reference backend (slow; tiny models only)\n", why);
        }
    } else die("unknown --device '%s': use auto, cpu or cuda", device);
    if (verbose) fprintf(stderr, "backend: %s\n", be->device_desc);
    return be;
}
