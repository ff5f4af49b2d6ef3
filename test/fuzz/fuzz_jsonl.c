// test/fuzz/fuzz_jsonl.c: user data through task_open (tasks.c: JSONL, one {"prompt", "answer"}
// per line, GSM8K's "#### 72", prompts as messages, other columns), every example of both splits, and a
// completion scored against each by the reward functions, as train_grpo scores its rollouts, and put
// in a reward program's request (reward_program.h); the same file through
// ./train_sft's and ./train_dpo's readers (sft.h, dpo_train.h) first. Input: data.jsonl, then the
// completion text (test/fuzz/fuzz.h's separator between them).
#include "fuzz.h"
#include "tasks/reward_program.h"
#include "tasks/tasks.h"
#include "train/dpo_train.h"

static void score(const Example *ex, const char *completion) {
    char out[256];
    extract_answer(ex, completion, out, sizeof out);
    for (int r = 0; r < N_REWARD_FUNCS; r++) {
        REWARD_FUNCS[r].fn(ex, completion, 0);
        REWARD_FUNCS[r].fn(ex, completion, 1);
    }
}

static void body(const char *dir, const uint8_t *rest, size_t nrest) {
    char p[600], err[512];
    snprintf(p, sizeof p, "%s/data.jsonl", dir);
    SftText *st;
    PrefText *pt;
    long n_text;
    if (sft_read_jsonl(p, &st, &n_text, err, sizeof err) == 0) sft_texts_free(st, n_text);
    if (pref_read_jsonl(p, &pt, &n_text, err, sizeof err) == 0) pref_texts_free(pt, n_text);
    Task t;
    if (task_open(&t, p, NULL, err, sizeof err)) die("%s", err);
    size_t n = nrest < 4096 ? nrest : 4096;
    char *completion = (char *)mallocCheck(n + 1);
    if (n) memcpy(completion, rest, n);
    completion[n] = 0;
    for (int s = 0; s < 2; s++)
        for (long i = 0; i < task_size(&t, (Split)s) && i < 16; i++) {
            Example ex;
            task_example(&t, (Split)s, (uint64_t)i, &ex);
            score(&ex, completion);
            if (ex.answer) score(&ex, ex.answer);  // the answer itself scores (a reward's own edge cases)
            // a reward program's request for two completions of it: the line's columns and messages as JSON again
            int ids[4] = {1, 2, 3, 4}, lens[2] = {2, 0};
            unsigned char trunc[2] = {0, 1};
            char *texts[2] = {completion, ""};
            free(reward_request(&ex, 2, 2, texts, ids, lens, 2, trunc, 1, 1));
            example_free(&ex);
        }
    // the completion as a countdown expression
    Rational v;
    long lits[8];
    int nl, nums[3] = {3, 5, 7};
    expr_eval(completion, &v, lits, 8, &nl, err, sizeof err);
    countdown_check(nums, 3, 22, completion, err, sizeof err);
    free(completion);
    task_free(&t);
}

FUZZ_TARGET(body, NULL, "data.jsonl")
