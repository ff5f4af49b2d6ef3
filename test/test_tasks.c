// test/test_tasks.c: Check suite for tasks.c: generator determinism, train /
// held-out disjointness, the countdown evaluator, reward cases (right, wrong,
// malformed, truncated) for every task kind, JSONL loading with GSM8K answers
// and one error per kind of malformed line.
//   gcc -std=c11 -D_GNU_SOURCE -O2 -I. -Itest test/test_tasks.c tasks.c -lcjson -lcheck -lsubunit -lm -lrt -lpthread -o /tmp/tt && /tmp/tt
#include <check.h>
#include <unistd.h>

#include "testutil.h"
#include "tasks/tasks.h"

// a temporary file holding text; returns its path (static buffer, one at a time)
static const char *tmp_file(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/test_tasks_XXXXXX.jsonl");
    int fd = mkstemps(path, 6);
    ck_assert_msg(fd >= 0, "mkstemps failed");
    size_t n = strlen(text);
    ck_assert_int_eq(write(fd, text, n), (ssize_t)n);
    close(fd);
    return path;
}

// open text as a JSONL task; returns task_open's rc and leaves the message in err
static int open_text(Task *t, const char *text, char *err, size_t cap, const char **path_out) {
    const char *p = tmp_file(text);
    if (path_out) *path_out = p;
    int rc = task_open(t, p, NULL, err, cap);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int in_sorted(char **v, long n, const char *s) { return bsearch(&s, v, n, sizeof(char *), cmp_str) != NULL; }

// ----------------------------------------------------------------------------
// arithmetic

START_TEST(arithmetic_deterministic_and_right) {
    Task a, b, c;
    TaskOptions o = task_options_default();
    task_open_or_die(&a, "arithmetic", &o);
    task_open_or_die(&b, "arithmetic", &o);
    o.seed = 2;
    task_open_or_die(&c, "arithmetic", &o);
    int differ = 0;
    for (int i = 0; i < 500; i++) {
        Example x, y, z;
        task_example(&a, SPLIT_TRAIN, i, &x);
        task_example(&b, SPLIT_TRAIN, i, &y);
        task_example(&c, SPLIT_TRAIN, i, &z);
        ck_assert_str_eq(x.prompt, y.prompt);
        ck_assert_str_eq(x.answer, y.answer);
        differ += strcmp(x.prompt, z.prompt) != 0;
        ck_assert_int_le(strlen(x.prompt), 12);  // a tiny byte-level model's prompt
        ck_assert_int_eq(x.prompt[strlen(x.prompt) - 1], '=');
        // the answer is what the prompt says: evaluate "a+b" / "a-b" with the countdown evaluator
        char e[32];
        snprintf(e, sizeof e, "%.*s", (int)strlen(x.prompt) - 1, x.prompt);
        Rational v;
        char err[128];
        ck_assert_int_eq(expr_eval(e, &v, NULL, 0, NULL, err, sizeof err), 0);
        ck_assert_int_eq(v.den, 1);
        ck_assert_int_ge(v.num, 0);
        ck_assert_int_eq(v.num, atol(x.answer));
        ck_assert_double_eq(reward_correctness(&x, x.answer, 0), 1.0);
        example_free(&x);
        example_free(&y);
        example_free(&z);
    }
    ck_assert_int_gt(differ, 400);  // another seed, another order
    // the split cycles: example i and i + size are the same problem
    Example p, q;
    task_example(&a, SPLIT_HELDOUT, 3, &p);
    task_example(&a, SPLIT_HELDOUT, 3 + task_size(&a, SPLIT_HELDOUT), &q);
    ck_assert_str_eq(p.prompt, q.prompt);
    example_free(&p);
    example_free(&q);
    task_free(&a);
    task_free(&b);
    task_free(&c);
}
END_TEST

START_TEST(arithmetic_splits_disjoint) {
    TaskOptions o = task_options_default();
    Task a, b;
    task_open_or_die(&a, "arithmetic", &o);
    o.seed = 77;
    task_open_or_die(&b, "arithmetic", &o);
    long ntr = task_size(&a, SPLIT_TRAIN), nho = task_size(&a, SPLIT_HELDOUT);
    ck_assert_int_eq(ntr + nho, 100 * 100 + 100 * 101 / 2);  // every sum, every non-negative difference
    ck_assert_msg(nho > 0.08 * (ntr + nho) && nho < 0.12 * (ntr + nho), "held-out %ld of %ld", nho, ntr + nho);
    ck_assert_int_eq(task_size(&b, SPLIT_HELDOUT), nho);
    char **tr = (char **)mallocCheck(ntr * sizeof(char *)), **ho = (char **)mallocCheck(nho * sizeof(char *));
    char **ho2 = (char **)mallocCheck(nho * sizeof(char *));
    for (long i = 0; i < ntr; i++) {
        Example e;
        task_example(&a, SPLIT_TRAIN, i, &e);
        tr[i] = str_dup(e.prompt);
        example_free(&e);
    }
    for (long i = 0; i < nho; i++) {
        Example e;
        task_example(&a, SPLIT_HELDOUT, i, &e);
        ho[i] = str_dup(e.prompt);
        example_free(&e);
        task_example(&b, SPLIT_HELDOUT, i, &e);
        ho2[i] = str_dup(e.prompt);
        example_free(&e);
    }
    qsort(tr, ntr, sizeof(char *), cmp_str);
    qsort(ho, nho, sizeof(char *), cmp_str);
    qsort(ho2, nho, sizeof(char *), cmp_str);
    for (long i = 1; i < ntr; i++) ck_assert_str_ne(tr[i - 1], tr[i]);  // a split lists each problem once
    for (long i = 0; i < nho; i++) {
        ck_assert_msg(!in_sorted(tr, ntr, ho[i]), "%s is in both splits", ho[i]);
        ck_assert_str_eq(ho[i], ho2[i]);  // the seed orders, it never moves a problem between splits
        // a+b held out means b+a held out: commutativity does not leak
        int x, y;
        char op;
        ck_assert_int_eq(sscanf(ho[i], "%d%c%d=", &x, &op, &y), 3);
        if (op == '+') {
            char sw[32];
            snprintf(sw, sizeof sw, "%d+%d=", y, x);
            ck_assert_msg(in_sorted(ho, nho, sw), "%s held out but %s is not", ho[i], sw);
        }
    }
    for (long i = 0; i < ntr; i++) free(tr[i]);
    for (long i = 0; i < nho; i++) free(ho[i]), free(ho2[i]);
    free(tr);
    free(ho);
    free(ho2);
    task_free(&a);
    task_free(&b);
}
END_TEST

// ----------------------------------------------------------------------------
// countdown

START_TEST(countdown_deterministic_and_solvable) {
    Task t, u;
    task_open_or_die(&t, "countdown", NULL);
    task_open_or_die(&u, "countdown", NULL);
    ck_assert_int_eq(task_size(&t, SPLIT_TRAIN), -1);
    for (int i = 0; i < 1000; i++) {
        Split s = (Split)(i % 2);
        Example x, y;
        task_example(&t, s, i, &x);
        task_example(&u, s, i, &y);
        ck_assert_str_eq(x.prompt, y.prompt);
        ck_assert_str_eq(x.answer, y.answer);
        ck_assert_int_eq(x.n_nums, 3);
        for (int k = 0; k < 3; k++) {
            ck_assert_int_ge(x.nums[k], 1);
            ck_assert_int_le(x.nums[k], 9);
            ck_assert_int_ne(x.nums[k], x.target);  // no one-number answers
        }
        ck_assert(x.target >= 1 && x.target <= 999);
        ck_assert_int_le(strlen(x.prompt), 12);
        // the prompt states the numbers and the target
        int a, b, c;
        long tg;
        ck_assert_int_eq(sscanf(x.prompt, "%d,%d,%d->%ld:", &a, &b, &c, &tg), 4);
        ck_assert(a == x.nums[0] && b == x.nums[1] && c == x.nums[2] && tg == x.target);
        char err[128];
        ck_assert_msg(countdown_check(x.nums, x.n_nums, x.target, x.answer, err, sizeof err), "%s %s: %s", x.prompt, x.answer, err);
        ck_assert_int_eq(task_split_of_key(x.key, 0.1), s);
        example_free(&x);
        example_free(&y);
    }
    task_free(&t);
    task_free(&u);
}
END_TEST

START_TEST(countdown_splits_disjoint) {
    Task t;
    task_open_or_die(&t, "countdown", NULL);
    enum { N = 3000 };
    char **tr = (char **)mallocCheck(N * sizeof(char *)), **ho = (char **)mallocCheck(N * sizeof(char *));
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < N; i++) {
            Example e;
            task_example(&t, (Split)s, i, &e);
            // canonical: the sorted numbers and the target (a permutation is the same problem)
            int v[3] = {e.nums[0], e.nums[1], e.nums[2]};
            for (int x = 0; x < 3; x++)
                for (int y = x + 1; y < 3; y++)
                    if (v[y] < v[x]) { int tmp = v[x]; v[x] = v[y]; v[y] = tmp; }
            char c[64];
            snprintf(c, sizeof c, "%d,%d,%d->%ld", v[0], v[1], v[2], e.target);
            (s ? ho : tr)[i] = str_dup(c);
            example_free(&e);
        }
    qsort(tr, N, sizeof(char *), cmp_str);
    long distinct_ho = 0;
    for (int i = 0; i < N; i++) {
        ck_assert_msg(!in_sorted(tr, N, ho[i]), "%s is in both splits", ho[i]);
        distinct_ho += i == 0 || strcmp(ho[i], ho[i - 1]);
    }
    ck_assert_int_gt(distinct_ho, 100);  // the held-out stream is not one problem repeated
    for (int i = 0; i < N; i++) free(tr[i]), free(ho[i]);
    free(tr);
    free(ho);
    task_free(&t);
}
END_TEST

START_TEST(evaluator) {
    struct { const char *e; long num, den; } ok[] = {
        {"2+3*4", 14, 1}, {"(2+3)*4", 20, 1}, {"10-4-3", 3, 1}, {"8/3*3", 8, 1}, {"7/2", 7, 2},
        {"2*(3+(4-1))", 12, 1}, {" 2 + 3 ", 5, 1}, {"100/10/5", 2, 1}, {"1-2", -1, 1}, {"6/4", 3, 2},
        {"((7))", 7, 1}, {"007", 7, 1}, {"2*3-4/2", 4, 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        Rational v;
        char err[128];
        int rc = expr_eval(ok[i].e, &v, NULL, 0, NULL, err, sizeof err);
        ck_assert_msg(rc == 0, "%s: %s", ok[i].e, err);
        ck_assert_msg(v.num == ok[i].num && v.den == ok[i].den, "%s = %lld/%lld", ok[i].e, (long long)v.num, (long long)v.den);
    }
    struct { const char *e, *why; } bad[] = {
        {"7/0", "division by zero"}, {"7/(3-3)", "division by zero"}, {"2+*3", "expected a number"},
        {"2+", "ends too early"}, {"(2+3", "missing ')'"}, {"2+3)", "unexpected character"},
        {"abc", "expected a number"}, {"", "ends too early"}, {"-3+5", "expected a number"},
        {"3.5", "unexpected character"}, {"2 3", "unexpected character"}, {"1e5", "unexpected character"},
        {"9999999999", "number too long"}, {"999999999*999999999*999999999", "overflow"}, {"3=3", "unexpected character"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Rational v;
        char err[128] = "";
        ck_assert_msg(expr_eval(bad[i].e, &v, NULL, 0, NULL, err, sizeof err) == -1, "'%s' accepted", bad[i].e);
        ck_assert_msg(strstr(err, bad[i].why) != NULL, "'%s': '%s' does not say '%s'", bad[i].e, err, bad[i].why);
    }
    char deep[300];
    memset(deep, '(', 150);
    strcpy(deep + 150, "1");
    Rational v;
    char err[128];
    ck_assert_int_eq(expr_eval(deep, &v, NULL, 0, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "too deeply nested") != NULL, "%s", err);
    // the literals, in order
    long lits[8];
    int n;
    ck_assert_int_eq(expr_eval("(12+3)*45", &v, lits, 8, &n, err, sizeof err), 0);
    ck_assert(n == 3 && lits[0] == 12 && lits[1] == 3 && lits[2] == 45);
}
END_TEST

START_TEST(countdown_rules) {
    int nums[3] = {3, 5, 7};
    char err[128];
    ck_assert(countdown_check(nums, 3, 22, "3*5+7", err, sizeof err));
    ck_assert(countdown_check(nums, 3, 22, "7+5*3", err, sizeof err));
    ck_assert(countdown_check(nums, 3, 12, "5+7", err, sizeof err));  // a subset is fine
    ck_assert(!countdown_check(nums, 3, 22, "3*5+7+0", err, sizeof err));
    ck_assert_msg(strstr(err, "uses 4 numbers") != NULL, "%s", err);
    ck_assert(!countdown_check(nums, 3, 22, "7*3+1", err, sizeof err));
    ck_assert_msg(strstr(err, "uses 1, which is not one of the given numbers") != NULL, "%s", err);
    ck_assert(!countdown_check(nums, 3, 15, "5+5+5", err, sizeof err));  // reuse
    ck_assert_msg(strstr(err, "uses 5") != NULL, "%s", err);
    ck_assert(!countdown_check(nums, 3, 22, "22", err, sizeof err));
    ck_assert(!countdown_check(nums, 3, 22, "3*7+5", err, sizeof err));
    ck_assert_msg(strstr(err, "evaluates to 26, not 22") != NULL, "%s", err);
    ck_assert(!countdown_check(nums, 3, 22, "3*(5+7", err, sizeof err));
    ck_assert(!countdown_check(nums, 3, 2, "7/5*3", err, sizeof err));
    ck_assert_msg(strstr(err, "21/5") != NULL, "%s", err);
    int n2[3] = {8, 3, 3};
    ck_assert(countdown_check(n2, 3, 8, "8/3*3", err, sizeof err));  // exact rationals, not integer division
    ck_assert(countdown_check(n2, 3, 8, "8/(3/3)", err, sizeof err));
    ck_assert(!countdown_check(n2, 3, 8, "8/3/3*3*3", err, sizeof err));  // five numbers, three given
}
END_TEST

// ----------------------------------------------------------------------------
// rewards

static Example mk(TaskKind k, const char *answer) {
    Example e;
    memset(&e, 0, sizeof e);
    e.kind = k;
    e.prompt = str_dup("p");
    e.answer = str_dup(answer);
    return e;
}

#define R2(ex, text, trunc, c, f)                                                                                    \
    do {                                                                                                             \
        double rc_ = reward_correctness(&(ex), text, trunc), rf_ = reward_format(&(ex), text, trunc);                \
        ck_assert_msg(rc_ == (c) && rf_ == (f), "'%s' (truncated %d): correctness %g format %g, want %g %g", text, \
                      trunc, rc_, rf_, (double)(c), (double)(f));                                                    \
    } while (0)

START_TEST(rewards_arithmetic) {
    Example e = mk(TASK_ARITHMETIC, "42");
    R2(e, "42", 0, 1, 1);                      // right
    R2(e, "<answer>42</answer>", 0, 1, 1);     // tags are optional
    R2(e, " 42\n", 0, 1, 1);
    R2(e, "41", 0, 0, 1);                      // wrong but well-formed
    R2(e, "42abc", 0, 0, 0);                   // malformed
    R2(e, "forty-two", 0, 0, 0);
    R2(e, "The answer is 42", 0, 0, 0);        // the built-in tasks want the bare answer
    R2(e, "", 0, 0, 0);
    R2(e, "42", 1, 1, 0);                      // truncated: the text is right, the form is not
    R2(e, "4242424242", 1, 0, 0);
    example_free(&e);
}
END_TEST

START_TEST(rewards_countdown) {
    Example e = mk(TASK_COUNTDOWN, "3*5+7");
    int nums[3] = {3, 5, 7};
    memcpy(e.nums, nums, sizeof nums);
    e.n_nums = 3;
    e.target = 22;
    R2(e, "3*5+7", 0, 1, 1);
    R2(e, "(5*3)+7", 0, 1, 1);                 // any correct expression, not only the stored one
    R2(e, "<answer>7 + 3*5</answer>", 0, 1, 1);
    R2(e, "3*7+5", 0, 0, 1);                   // wrong value
    R2(e, "7*3+1", 0, 0, 1);                   // a number that was not given
    R2(e, "3*+5", 0, 0, 0);                    // malformed
    R2(e, "3*5+7=22", 0, 0, 0);
    R2(e, "3*5+7", 1, 1, 0);                   // truncated
    example_free(&e);
}
END_TEST

START_TEST(rewards_gsm8k) {
    Example e = mk(TASK_JSONL, "72");
    R2(e, "48/2 = 24, 48 + 24 = 72. So 72.", 0, 1, 0);  // the last number; no explicit marker
    R2(e, "She sold 72 clips.\n#### 72", 0, 1, 1);
    R2(e, "####72", 0, 1, 1);
    R2(e, "#### 72 (not 73)", 0, 1, 1);                   // after ####, the first number
    R2(e, "The answer is \\boxed{72}.", 0, 1, 1);
    R2(e, "\\boxed{\\frac{144}{2}} or \\boxed{72}", 0, 1, 1);
    R2(e, "<answer>72</answer>", 0, 1, 1);
    R2(e, "<answer>The total is 72</answer>", 0, 1, 1);
    R2(e, "$72.00", 0, 1, 0);
    R2(e, "72 then 73", 0, 0, 0);                         // the last number is 73
    R2(e, "#### 71", 0, 0, 1);
    R2(e, "no idea", 0, 0, 0);
    R2(e, "#### 72", 1, 1, 0);                            // truncated
    example_free(&e);
    Example big = mk(TASK_JSONL, "1234");
    R2(big, "#### 1,234", 0, 1, 1);
    R2(big, "that is $1,234 in total", 0, 1, 0);
    example_free(&big);
    Example neg = mk(TASK_JSONL, "-3");
    R2(neg, "the result is -3", 0, 1, 0);
    R2(neg, "5-3", 0, 0, 0);                              // a minus between numbers is not a sign
    example_free(&neg);
    Example word = mk(TASK_JSONL, "Paris");
    R2(word, "<answer>paris</answer>", 0, 1, 1);
    R2(word, "Paris", 0, 1, 0);
    R2(word, "It is Paris", 0, 0, 0);
    example_free(&word);
    char out[64];
    Example j = mk(TASK_JSONL, "1");
    ck_assert_int_eq(extract_answer(&j, "work... \\boxed{x = 5}", out, sizeof out), 1);
    ck_assert_str_eq(out, "x = 5");
    ck_assert_int_eq(extract_answer(&j, "just 5", out, sizeof out), 0);
    example_free(&j);
}
END_TEST

START_TEST(reward_table) {
    ck_assert_int_eq(N_REWARD_FUNCS, 2);
    ck_assert_str_eq(REWARD_FUNCS[0].name, "correctness");
    ck_assert(REWARD_FUNCS[0].fn == reward_correctness && REWARD_FUNCS[0].weight == 1.0);
    ck_assert_str_eq(REWARD_FUNCS[1].name, "format");
    ck_assert(REWARD_FUNCS[1].fn == reward_format && REWARD_FUNCS[1].weight > 0);
}
END_TEST

// ----------------------------------------------------------------------------
// JSONL

START_TEST(jsonl_loads_gsm8k) {
    const char *text =
        "{\"prompt\": \"What is 2+2?\", \"answer\": \"4\"}\n"
        "\n"
        "   \n"
        "{\"question\": \"Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did she sell altogether?\", "
        "\"answer\": \"Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\\n#### 72\"}\n"
        "{\"prompt\": \"p3\", \"answer\": \"#### 1,234\", \"extra\": [1, 2]}\n"
        "{\"prompt\": \"p4\", \"answer\": 17}\n"
        "{\"prompt\": \"p5\", \"answer\": \"Paris\"}";  // no final newline
    Task t;
    char err[512];
    ck_assert_msg(open_text(&t, text, err, sizeof err, NULL) == 0, "%s", err);
    ck_assert_int_eq(t.n_items, 5);
    const char *want[5] = {"4", "72", "1234", "17", "Paris"};
    for (int i = 0; i < 5; i++) ck_assert_str_eq(t.items[i].answer, want[i]);
    ck_assert_msg(strncmp(t.items[1].prompt, "Natalia sold", 12) == 0, "%s", t.items[1].prompt);
    ck_assert_int_eq(task_size(&t, SPLIT_TRAIN) + task_size(&t, SPLIT_HELDOUT), 5);
    Example e;
    task_example(&t, SPLIT_TRAIN, 0, &e);
    ck_assert_int_eq(e.kind, TASK_JSONL);
    ck_assert_double_eq(reward_correctness(&e, "#### ", 0), 0.0);
    example_free(&e);
    task_free(&t);
}
END_TEST

START_TEST(jsonl_errors_name_file_and_line) {
    struct { const char *text; int line; const char *why; } bad[] = {
        {"{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"x\"\n", 2, "not valid JSON"},
        {"{\"prompt\": \"x\", \"completions\": 1}\n", 1, "the column \"completions\" has the name of a reward program's own argument"},
        {"\n\n{\"answer\": \"x\"}\n", 3, "missing \"prompt\""},
        {"[1, 2]\n", 1, "not a JSON object"},
        {"{\"prompt\": 5, \"answer\": \"1\"}\n", 1, "\"prompt\" must be a string"},
        {"{\"prompt\": \"\", \"answer\": \"1\"}\n", 1, "\"prompt\" is empty"},
        {"{\"prompt\": \"x\", \"answer\": [1]}\n", 1, "\"answer\" must be a string or a number"},
        {"{\"prompt\": \"x\", \"answer\": \"blah ####  \"}\n", 1, "nothing after \"####\""},
        {"{\"prompt\": \"x\", \"answer\": \"  \"}\n", 1, "\"answer\" is empty"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"a\"}, "
         "{\"role\": \"user\", \"content\": \"b\"}]}\n", 1, "multi-turn prompts are not supported"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"system\", \"content\": \"s\"}]}\n", 1,
         "must be [{\"role\": \"system\", ...} (optional), {\"role\": \"user\", ...}]"},
        {"{\"prompt\": [{\"role\": \"user\", \"text\": \"hi\"}]}\n", 1, "a message of \"prompt\" must be {\"role\""},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"\"}]}\n", 1, "the user message of \"prompt\" is empty"},
        {"{\"prompt\": [], \"answer\": \"1\"}\n", 1, "an optional system message and one user message"},
        {"{\"prompt\": \"a\", \"answer\": \"1\"} {\"prompt\": \"b\", \"answer\": \"2\"}\n", 1, "more than one JSON value"},
        // what a C string cannot hold, or JSON leaves undefined: said, never read as something else
        {"{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"x\\u0000y\", \"answer\": \"1\"}\n", 2, "a string holds \\u0000"},
        {"{\"prompt\": \"x\\\\u0000y\", \"answer\": \"1\"}\n{\"prompt\": \"b\", \"prompt\": \"c\", \"answer\": \"1\"}\n", 2,
         "the key \"prompt\" appears twice in one object"},
        {"{\"prompt\": \"b\", \"answer\": \"1\", \"meta\": {\"k\": 1, \"k\": 2}}\n", 1, "the key \"k\" appears twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Task t;
        char err[512] = "", want[128];
        const char *path;
        ck_assert_msg(open_text(&t, bad[i].text, err, sizeof err, &path) == -1, "case %zu accepted", i);
        snprintf(want, sizeof want, "%s:%d: ", path, bad[i].line);
        ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "case %zu: '%s' does not start with '%s'", i, err, want);
        ck_assert_msg(strstr(err, bad[i].why) != NULL, "case %zu: '%s' does not say '%s'", i, err, bad[i].why);
        ck_assert_msg(strchr(err, '\n') == NULL, "case %zu: not one line: %s", i, err);
        unlink(path);
    }
    Task t;
    char err[512];
    const char *path;
    // a NUL byte in the file (after the object, where a parser of C strings would stop reading)
    char nul[] = "/tmp/fp8grpo_nulXXXXXX";
    int fd = mkstemp(nul);
    const char bytes[] = "{\"prompt\": \"a\", \"answer\": \"1\"}\0{\"prompt\": \"b\"\n";
    ck_assert(fd >= 0 && write(fd, bytes, sizeof bytes - 1) == (ssize_t)(sizeof bytes - 1) && close(fd) == 0);
    ck_assert_int_eq(task_open(&t, nul, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ":1: holds a NUL byte") != NULL, "%s", err);
    unlink(nul);
    ck_assert_int_eq(open_text(&t, "\n  \n", err, sizeof err, &path), -1);
    ck_assert_msg(strstr(err, "no examples") != NULL, "%s", err);
    unlink(path);
    ck_assert_int_eq(task_open(&t, "/nonexistent/data.jsonl", NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "cannot open /nonexistent/data.jsonl") != NULL, "%s", err);
    ck_assert_int_eq(task_open(&t, "arithmetics", NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "unknown task 'arithmetics': use arithmetic, countdown or a .jsonl file");
    // programs get the same line through die()
    EXPECT_DIE(task_open_or_die(&t, "{bad", NULL), "unknown task '{bad'");
}
END_TEST

// TRL's shape: a prompt as messages (system + user) or text, the answer optional (null as missing), every
// other column kept for the reward programs; the built-in correctness does not apply without an answer
START_TEST(jsonl_trl_shape) {
    const char *text =
        "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"1+2=\"}], "
        "\"answer\": \"#### 3\", \"level\": 2}\n"
        "{\"prompt\": \"2+2=\", \"answer\": null, \"tags\": [\"a\"]}\n"
        "{\"question\": [{\"role\": \"user\", \"content\": \"3+3=\"}]}\n";
    Task t;
    char err[512];
    TaskOptions o = task_options_default();
    o.heldout_frac = 0;
    const char *path = tmp_file(text);
    ck_assert_msg(task_open(&t, path, &o, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(t.n_items, 3);
    ck_assert_int_eq(t.n_unanswered, 2);
    ck_assert_int_eq(t.n_conversational, 2);
    const Example *a = &t.items[0], *b = &t.items[1], *c = &t.items[2];
    ck_assert_str_eq(a->prompt, "1+2=");
    ck_assert_str_eq(a->system, "Be brief.");
    ck_assert_str_eq(a->answer, "3");
    ck_assert_str_eq(a->messages, "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"1+2=\"}]");
    ck_assert_str_eq(a->columns, "{\"answer\":\"#### 3\",\"level\":2}");  // (the answer as the line has it)
    ck_assert(!b->answer && !b->messages && !b->system);
    ck_assert_str_eq(b->columns, "{\"answer\":null,\"tags\":[\"a\"]}");
    ck_assert(!c->system && !c->answer);
    ck_assert_str_eq(c->prompt, "3+3=");
    ck_assert_str_eq(c->columns, "{}");
    ck_assert(a->key != c->key && a->key != task_key("1+2="));  // the messages decide the split
    ck_assert(isnan(reward_correctness(b, "4", 0)));
    ck_assert_double_eq(reward_correctness(a, "<answer>3</answer>", 0), 1.0);
    Example e;  // task_example copies every field
    for (int i = 0; i < 3; i++) {
        task_example(&t, SPLIT_TRAIN, i, &e);
        const Example *src = !strcmp(e.prompt, "1+2=") ? a : !strcmp(e.prompt, "2+2=") ? b : c;
        ck_assert_str_eq(e.columns, src->columns);
        ck_assert((e.messages == NULL) == (src->messages == NULL) && (e.answer == NULL) == (src->answer == NULL));
        example_free(&e);
    }
    task_free(&t);
    unlink(path);
}
END_TEST

START_TEST(jsonl_split_by_prompt) {
    // 400 distinct prompts (and one repeated): ~10% held out, disjoint, duplicates together, seed-independent
    size_t cap = 1 << 16, n = 0;
    char *text = (char *)mallocCheck(cap);
    for (int i = 0; i < 400; i++) n += snprintf(text + n, cap - n, "{\"prompt\": \"q%d\", \"answer\": \"%d\"}\n", i, i);
    n += snprintf(text + n, cap - n, "{\"prompt\": \"q7\", \"answer\": \"7\"}\n");
    const char *path = tmp_file(text);
    TaskOptions o = task_options_default();
    Task a, b;
    char err[256];
    ck_assert_int_eq(task_open(&a, path, &o, err, sizeof err), 0);
    o.seed = 5;
    ck_assert_int_eq(task_open(&b, path, &o, err, sizeof err), 0);
    long ho = task_size(&a, SPLIT_HELDOUT);
    ck_assert_msg(ho >= 20 && ho <= 60, "held-out %ld of 401", ho);
    ck_assert_int_eq(task_size(&b, SPLIT_HELDOUT), ho);
    for (long i = 0; i < task_size(&a, SPLIT_TRAIN); i++) {
        Example e;
        task_example(&a, SPLIT_TRAIN, i, &e);
        for (long k = 0; k < ho; k++) {
            Example h;
            task_example(&b, SPLIT_HELDOUT, k, &h);
            ck_assert_str_ne(e.prompt, h.prompt);
            example_free(&h);
        }
        example_free(&e);
    }
    task_free(&a);
    task_free(&b);
    // heldout_frac 0: everything trains; asking for held-out examples is an error that says what to do
    o.heldout_frac = 0;
    ck_assert_int_eq(task_open(&a, path, &o, err, sizeof err), 0);
    ck_assert_int_eq(task_size(&a, SPLIT_TRAIN), 401);
    Example e;
    EXPECT_DIE(task_example(&a, SPLIT_HELDOUT, 0, &e), "no held-out examples");
    task_free(&a);
    unlink(path);
    free(text);
}
END_TEST

// --eval_data: a second file is the held-out split, whole; the training file's examples all train;
// the prompts in both are counted; the file's errors name it and its line
START_TEST(jsonl_eval_file) {
    size_t cap = 1 << 14, n = 0;
    char *text = (char *)mallocCheck(cap), path[64], err[256];
    for (int i = 0; i < 50; i++) n += snprintf(text + n, cap - n, "{\"prompt\": \"q%d\", \"answer\": \"%d\"}\n", i, i);
    snprintf(path, sizeof path, "%s", tmp_file(text));
    n = 0;
    for (int i = 40; i < 60; i++) n += snprintf(text + n, cap - n, "{\"prompt\": \"q%d\", \"answer\": \"%d\"}\n", i, i);
    const char *epath = tmp_file(text);
    TaskOptions o = task_options_default();
    Task t;
    long both = -1;
    ck_assert_int_eq(task_open(&t, path, &o, err, sizeof err), 0);  // (a share held out already: refused)
    ck_assert_int_eq(task_set_eval_file(&t, epath, &both, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "heldout_frac 0"), "%s", err);
    task_free(&t);
    o.heldout_frac = 0;
    ck_assert_int_eq(task_open(&t, path, &o, err, sizeof err), 0);
    ck_assert_int_eq(task_set_eval_file(&t, epath, &both, err, sizeof err), 0);
    ck_assert_int_eq(task_size(&t, SPLIT_TRAIN), 50);
    ck_assert_int_eq(task_size(&t, SPLIT_HELDOUT), 20);
    ck_assert_int_eq(both, 10);  // q40..q49
    int seen[60] = {0};
    for (long k = 0; k < 20; k++) {
        Example e;
        task_example(&t, SPLIT_HELDOUT, k, &e);
        int q = atoi(e.prompt + 1);
        ck_assert_msg(q >= 40 && q < 60 && atoi(e.answer) == q, "held-out %s -> %s", e.prompt, e.answer);
        seen[q]++;
        example_free(&e);
    }
    for (int q = 40; q < 60; q++) ck_assert_int_eq(seen[q], 1);  // each once, in a shuffled order
    task_free(&t);
    unlink(epath);
    epath = tmp_file("{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\", \"answer\": [2]}\n");
    ck_assert_int_eq(task_open(&t, path, &o, err, sizeof err), 0);
    ck_assert_int_eq(task_set_eval_file(&t, epath, &both, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ":2: \"answer\" must be a string or a number"), "%s", err);
    ck_assert_int_eq(task_size(&t, SPLIT_HELDOUT), 0);  // (the task as it was)
    task_free(&t);
    unlink(epath);
    unlink(path);
    free(text);
}
END_TEST

START_TEST(options_checked) {
    Task t;
    char err[256];
    TaskOptions o = task_options_default();
    o.countdown_numbers = 9;
    ck_assert_int_eq(task_open(&t, "countdown", &o, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "countdown_numbers 9 out of range") != NULL, "%s", err);
    o = task_options_default();
    o.heldout_frac = 1.0;
    ck_assert_int_eq(task_open(&t, "arithmetic", &o, err, sizeof err), -1);
    o = task_options_default();
    o.max_operand = 9;  // a smaller space: 100 sums + 55 differences
    ck_assert_int_eq(task_open(&t, "arithmetic", &o, err, sizeof err), 0);
    ck_assert_int_eq(task_size(&t, SPLIT_TRAIN) + task_size(&t, SPLIT_HELDOUT), 155);
    task_free(&t);
    o = task_options_default();
    o.countdown_numbers = 4;
    o.countdown_max = 25;
    ck_assert_int_eq(task_open(&t, "countdown", &o, err, sizeof err), 0);
    for (int i = 0; i < 100; i++) {
        Example e;
        task_example(&t, SPLIT_TRAIN, i, &e);
        ck_assert_int_eq(e.n_nums, 4);
        ck_assert(countdown_check(e.nums, 4, e.target, e.answer, err, sizeof err));
        example_free(&e);
    }
    task_free(&t);
}
END_TEST

Suite *tasks_suite(void) {
    Suite *s = suite_create("tasks");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, arithmetic_deterministic_and_right);
    tcase_add_test(tc, arithmetic_splits_disjoint);
    tcase_add_test(tc, countdown_deterministic_and_solvable);
    tcase_add_test(tc, countdown_splits_disjoint);
    tcase_add_test(tc, evaluator);
    tcase_add_test(tc, countdown_rules);
    tcase_add_test(tc, rewards_arithmetic);
    tcase_add_test(tc, rewards_countdown);
    tcase_add_test(tc, rewards_gsm8k);
    tcase_add_test(tc, reward_table);
    tcase_add_test(tc, jsonl_loads_gsm8k);
    tcase_add_test(tc, jsonl_errors_name_file_and_line);
    tcase_add_test(tc, jsonl_trl_shape);
    tcase_add_test(tc, jsonl_split_by_prompt);
    tcase_add_test(tc, jsonl_eval_file);
    tcase_add_test(tc, options_checked);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(tasks_suite()); }
