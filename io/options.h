// options.h: the one command-line parser of ./train_grpo and ./generate, and their --help.
// Defines Option (a row of a program's option table), OptionTable, options_parse,
// options_given and options_help (options.c), and backend_select (--device's backend).
//
// A program describes every option in one table: the name (TRL's, in underscore form),
// the kind, where the value is stored, its range or choices, its default as --help shows
// it, and a one-line meaning; rows of kind OPT_SECTION title the rows below them in --help.
// One rule for both programs:
//   --name value  or  --name=value, and '-' and '_' are the same in every name;
//   a flag stands alone (--resume) or takes true/false (--resume=false, --resume false),
//   as transformers' HfArgumentParser reads booleans;
//   an OPT_LIST option (--reward_cmd) may be given several times, each adding a value;
//   --help (or -h) prints every option with its default and meaning, and exits 0;
//   an option given twice is an error (which of the two values wins is not obvious);
//   anything wrong is one line on stderr, "error: --name: what is allowed", and exit 1.
// Defaults: each row's dflt is parsed like a command-line value before argv is read, so the
// default --help shows is the one that runs. A row's dflt_model replaces dflt when --model is
// given and the option is not (train_grpo's TRL-like defaults for real checkpoints). GRPO rows
// go through grpo_config_set (grpo.c checks their values); their default is
// grpo_config_default()'s unless the row names one, so each default is written once.
#ifndef OPTIONS_H
#define OPTIONS_H

#include <stdio.h>

#include "grpo.h"
#include "core/backend.h"
#include "core/common.h"

typedef enum {
    OPT_SECTION,    // not an option: the title of the rows below it in --help
    OPT_INT,        // int in [lo, hi]
    OPT_LONG,       // long in [lo, hi]
    OPT_DOUBLE,     // double in [lo, hi]
    OPT_STRING,     // const char * (into argv, or the default's literal)
    OPT_TEXT,       // the same, text for the model (a prompt, a system message): valid UTF-8
    OPT_CHOICE,     // const char *, one of choices
    OPT_FLAG,       // int, 0 or 1
    OPT_GRPO,       // a GrpoConfig option, set by grpo_config_set (off unused)
    OPT_GRPO_FLAG,  // the same, a boolean: a bare --name means true
    OPT_LIST,       // OptList: the one option that may be given several times, each value appended
} OptKind;

#define OPT_LIST_MAX 8
typedef struct {
    const char *v[OPT_LIST_MAX];  // (into argv)
    int n;
} OptList;

typedef struct {
    const char *name;        // TRL's name, underscore form (OPT_SECTION: the section's title)
    OptKind kind;
    size_t off;              // offsetof(the program's options struct, the field)
    double lo, hi;           // OPT_INT, OPT_LONG, OPT_DOUBLE: the allowed range
    const char *choices;     // OPT_CHOICE: "block|row|tensor|off"; OPT_GRPO: the values, for --help only
    const char *dflt;        // the default, written as on a command line; NULL: unset (0 or NULL)
    const char *dflt_model;  // the default when --model is given; NULL: dflt
    const char *unset;       // --help's words for an unset default ("the built-in tiny model")
    const char *meta;        // --help's name for the value; NULL: by kind (N, X, TEXT, the choices)
    const char *help;        // what it means, one line
} Option;

#define OPTIONS_MAX 128
typedef struct {
    const char *usage;                 // --help's first line(s)
    const Option *rows;
    int n;
    void *base;                        // the struct the rows' offsets point into
    GrpoConfig *grpo;                  // where GRPO rows go (NULL: the table has none)
    unsigned char given[OPTIONS_MAX];  // filled by options_parse: 1 for the rows argv named
} OptionTable;

// Parse argv into t->base (and t->grpo): defaults first, then argv; --help prints and exits 0;
// any error is one line and exit 1
void options_parse(OptionTable *t, int argc, char **argv);
// whether argv named the option (underscore form)
int options_given(const OptionTable *t, const char *name);
// every option with its default and meaning, by section
void options_help(const OptionTable *t, FILE *f);

// --device's backend: "auto" (the GPU when usable, else the CPU), "cpu", "cuda"; prints the choice;
// dies on a bad name or when "cuda" is asked for and unusable. Checks the environment's tuning knobs
// first (core/backend.h backend_env_rows)
const Backend *backend_select(const char *device, int verbose);

#endif  // OPTIONS_H
