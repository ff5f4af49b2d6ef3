// test/test_options.c: the command-line parser both programs share (options.h), on a
// table of every kind: defaults from the table, '-' and '_' and --name=value, flags with
// and without true/false, the --model defaults, GRPO options through grpo.c, each bad
// input one error naming the option and what is allowed, and --help's defaults and width.
#include <check.h>

#include "testutil.h"
#include "io/options.h"

typedef struct {
    const char *model, *name, *mode;
    int steps, flag, on;
    long seed;
    double lr;
    OptList cmd;
} T;

#define OFF(f) offsetof(T, f)
static const Option ROWS[] = {
    {.name = "things", .kind = OPT_SECTION},
    {"model", OPT_STRING, OFF(model), .meta = "DIR", .unset = "the built-in one", .help = "a checkpoint"},
    {"run_name", OPT_STRING, OFF(name), .dflt = "first", .help = "a name"},
    {"load_mode", OPT_CHOICE, OFF(mode), .choices = "block|row|off", .dflt = "block", .help = "how"},
    {"max_steps", OPT_INT, OFF(steps), 1, 1e9, .dflt = "150", .dflt_model = "200", .help = "steps"},
    {"small_flag", OPT_FLAG, OFF(flag), .help = "a flag"},
    {"on_flag", OPT_FLAG, OFF(on), .dflt = "true", .help = "a flag that is on"},
    {"seed", OPT_LONG, OFF(seed), 0, 9e18, .dflt = "42", .help = "seed"},
    {.name = "more", .kind = OPT_SECTION},
    {"learning_rate", OPT_DOUBLE, OFF(lr), 0, 1, .dflt = "5e-4", .dflt_model = "1e-5",
     .help = "a long meaning that goes on and on, long enough that --help has to wrap it onto a second line at least"},
    {"beta", OPT_GRPO, .help = "KL"},
    {"max_completion_length", OPT_GRPO, .meta = "N", .dflt = "8", .help = "tokens"},
    {"mask_truncated_completions", OPT_GRPO_FLAG, .help = "mask"},
    {"cmd", OPT_LIST, OFF(cmd), .help = "repeatable"},
};

static T t;
static GrpoConfig g;
static OptionTable table;

static void parse(const char *line) {  // split on spaces (no quoting needed here)
    static char buf[1024];
    char *argv[64] = {"prog"};
    int argc = 1;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *tok = strtok(buf, " "); tok && argc < 64; tok = strtok(NULL, " ")) argv[argc++] = tok;
    memset(&t, 0, sizeof t);
    table = (OptionTable){.usage = "usage: prog", .rows = ROWS, .n = sizeof ROWS / sizeof ROWS[0], .base = &t, .grpo = &g};
    options_parse(&table, argc, argv);
}

START_TEST(defaults_from_the_table) {
    parse("");
    ck_assert_ptr_null(t.model);
    ck_assert_str_eq(t.name, "first");
    ck_assert_str_eq(t.mode, "block");
    ck_assert_int_eq(t.steps, 150);
    ck_assert_int_eq(t.flag, 0);
    ck_assert_int_eq(t.on, 1);
    ck_assert(t.seed == 42 && t.lr == 5e-4);
    GrpoConfig d = grpo_config_default();
    ck_assert(g.beta == d.beta && g.mask_truncated_completions == 0);
    ck_assert_int_eq(g.max_completion_length, 8);  // the row's default over grpo.c's 256
    ck_assert(!options_given(&table, "max_steps"));
}
END_TEST

START_TEST(spellings_are_one) {
    const char *lines[] = {"--max_steps 7 --run_name x --load_mode row --learning_rate 0.25 --beta 0.5",
                           "--max-steps 7 --run-name x --load-mode row --learning-rate 0.25 --beta 0.5",
                           "--max_steps=7 --run-name=x --load_mode=row --learning-rate=0.25 --beta=0.5",
                           "--max-steps=7 --run_name x --load-mode=row --learning_rate 0.25 --beta=0.5"};
    for (int i = 0; i < 4; i++) {
        parse(lines[i]);
        ck_assert_msg(t.steps == 7 && !strcmp(t.name, "x") && !strcmp(t.mode, "row") && t.lr == 0.25 && g.beta == 0.5, "%s", lines[i]);
        ck_assert(options_given(&table, "max_steps") && options_given(&table, "learning_rate"));
    }
    parse("--run_name a=b");  // '=' in a separate value is the value's
    ck_assert_str_eq(t.name, "a=b");
    parse("--run_name=a=b");
    ck_assert_str_eq(t.name, "a=b");
}
END_TEST

START_TEST(flags) {
    parse("--small_flag");
    ck_assert_int_eq(t.flag, 1);
    parse("--small-flag --max_steps 3");  // a bare flag does not eat the next option
    ck_assert(t.flag == 1 && t.steps == 3);
    parse("--small_flag false --on_flag=false");
    ck_assert(t.flag == 0 && t.on == 0);
    parse("--small_flag 1 --on-flag no");
    ck_assert(t.flag == 1 && t.on == 0);
    parse("--mask-truncated-completions");
    ck_assert_int_eq(g.mask_truncated_completions, 1);
    parse("--mask_truncated_completions false");
    ck_assert_int_eq(g.mask_truncated_completions, 0);
}
END_TEST

START_TEST(model_defaults) {
    parse("--model m");
    ck_assert(t.steps == 200 && t.lr == 1e-5);
    parse("--model m --max_steps 5");  // what is given wins
    ck_assert(t.steps == 5 && t.lr == 1e-5);
    parse("--max_steps 5");
    ck_assert(t.steps == 5 && t.lr == 5e-4);
}
END_TEST

// the one repeatable kind: each use appends, in order; more than OPT_LIST_MAX is refused
START_TEST(list_option_repeats) {
    parse("");
    ck_assert_int_eq(t.cmd.n, 0);
    parse("--cmd a --max_steps 3 --cmd=b");
    ck_assert_int_eq(t.cmd.n, 2);
    ck_assert(!strcmp(t.cmd.v[0], "a") && !strcmp(t.cmd.v[1], "b") && t.steps == 3);
    EXPECT_DIE(parse("--cmd 1 --cmd 2 --cmd 3 --cmd 4 --cmd 5 --cmd 6 --cmd 7 --cmd 8 --cmd 9"), "--cmd: given more than 8 times");
}
END_TEST

START_TEST(bad_input_names_the_option) {
    EXPECT_DIE(parse("--no_such 3"), "unknown option --no_such (see --help)");
    EXPECT_DIE(parse("--no-such 3"), "unknown option --no-such (see --help)");
    EXPECT_DIE(parse("--mode off"), "unknown option --mode: did you mean --load_mode?");
    EXPECT_DIE(parse("--load_mode int4"), "--load_mode: unknown value 'int4': use block, row or off");
    EXPECT_DIE(parse("--max_steps 0"), "--max_steps: 0 is too small: at least 1");
    EXPECT_DIE(parse("--max_steps 3000000000"), "--max_steps: 3000000000 is too large: at most 1000000000");
    EXPECT_DIE(parse("--max_steps 99999999999999999999"), "--max_steps: 99999999999999999999 is too large: at most 1000000000");
    EXPECT_DIE(parse("--max_steps -99999999999999999999"), "--max_steps: -99999999999999999999 is too small: at least 1");
    EXPECT_DIE(parse("--max_steps 2x"), "--max_steps: '2x' is not an integer >= 1");
    EXPECT_DIE(parse("--max_steps 1e99"), "--max_steps: '1e99' is not an integer");
    EXPECT_DIE(parse("--learning_rate 2"), "--learning_rate: '2' is not a number in [0, 1]");
    EXPECT_DIE(parse("--learning_rate nan"), "--learning_rate: 'nan' is not a number in [0, 1]");
    EXPECT_DIE(parse("--max_steps"), "--max_steps needs a value (see --help)");
    EXPECT_DIE(parse("--small_flag=maybe"), "--small_flag: 'maybe' is not true or false");
    EXPECT_DIE(parse("--small_flag maybe"), "unexpected argument 'maybe'");
    EXPECT_DIE(parse("stray"), "unexpected argument 'stray' (options start with --; see --help)");
    EXPECT_DIE(parse("-x"), "unexpected argument '-x'");
    EXPECT_DIE(parse("--beta -1"), "--beta must be >= 0 (got -1)");
    EXPECT_DIE(parse("--beta abc"), "--beta: 'abc' is not a number");
    EXPECT_DIE(parse("--mask_truncated_completions=maybe"), "--mask_truncated_completions: 'maybe' is not a boolean");
}
END_TEST

START_TEST(help_shows_every_default) {
    parse("");
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    options_help(&table, f);
    fclose(f);
    const char *want[] = {"usage: prog\n", "\nthings:\n", "\nmore:\n", "  --model DIR ", "(default: the built-in one)",
                          "--run_name TEXT", "(default: first)", "--load_mode block|row|off", "(default: block)",
                          "(default: 150; 200 with --model)", "(default: 42)", "(default: true)",
                          "(default: 8)", "--mask_truncated_completions", "(default: false)", "(default: 0)"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) ck_assert_msg(strstr(text, want[i]), "no '%s' in:\n%s", want[i], text);
    ck_assert_msg(strstr(text, "(default: 5e-4; 1e-5") || strstr(text, "(default: 5e-4;\n"), "%s", text);
    // the flag that defaults to off shows no default; no line is wider than 100 columns
    char *fl = strstr(text, "--small_flag");
    ck_assert(fl && strcspn(fl, "\n") < strlen(fl) && !memmem(fl, strcspn(fl, "\n"), "default", 7));
    for (char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        ck_assert_msg(len <= 100, "a line of %zu columns: %.*s", len, (int)len, line);
        line += len + (line[len] == '\n');
    }
    free(text);
}
END_TEST

static Suite *options_suite(void) {
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_add_test(tc, defaults_from_the_table);
    tcase_add_test(tc, spellings_are_one);
    tcase_add_test(tc, flags);
    tcase_add_test(tc, model_defaults);
    tcase_add_test(tc, list_option_repeats);
    tcase_add_test(tc, bad_input_names_the_option);
    tcase_add_test(tc, help_shows_every_default);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(options_suite()); }
