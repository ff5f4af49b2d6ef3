// test/reward_prog.c: the reward program of test_reward_program (CI has no Python): a --reward_cmd
// that speaks the protocol of tasks/reward_program.h, in one of these modes (argv[1]):
//   builtin          the built-in correctness and format rewards of the arithmetic task, computed from
//                    the request alone (prompts, completions, truncated, the "answer" column) with
//                    tasks.c's functions: an object {"correctness": [...], "format": [...]}
//   dump FILE        appends each request line to FILE; answers 1 for every completion
//   null             answers 1 for the even completions and null for the odd ones
//   fail KIND STEP   builtin, until the request of step STEP, which it answers by KIND: exit (status 3),
//                    hang (never answers), malformed ("{oops"), count (one correctness short), nonnumber
//                    ("a" for the first correctness), stdout (a log line first, then a right answer),
//                    huge (17 MiB on one line, unfinished)
// Built by the Makefile into build/; linked against the library for tasks.c.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tasks/tasks.h"

static void print_list(const double *v, int n) {
    printf("[");
    for (int i = 0; i < n; i++) printf(i ? ",%.17g" : "%.17g", v[i]);
    printf("]");
}

// the built-in rewards of completion i, as train_grpo computes them for the arithmetic task
static void builtin(const cJSON *req, int i, double *correct, double *format) {
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "completions"), i);
    const cJSON *a = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "answer"), i);
    const cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "prompts"), i);
    int truncated = cJSON_IsTrue(cJSON_GetArrayItem(cJSON_GetObjectItem(req, "truncated"), i));
    Example ex = {.kind = TASK_ARITHMETIC, .prompt = p->valuestring, .answer = a->valuestring};
    *correct = reward_correctness(&ex, c->valuestring, truncated);
    *format = reward_format(&ex, c->valuestring, truncated);
}

static void answer_builtin(const cJSON *req, int S) {
    double *c = malloc(S * sizeof(double)), *f = malloc(S * sizeof(double));
    for (int i = 0; i < S; i++) builtin(req, i, &c[i], &f[i]);
    printf("{\"correctness\": ");
    print_list(c, S);
    printf(", \"format\": ");
    print_list(f, S);
    printf("}\n");
    free(c), free(f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: reward_prog builtin | dump FILE | null | fail KIND STEP\n");
        return 2;
    }
    const char *mode = argv[1];
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, stdin) > 0) {
        cJSON *req = cJSON_Parse(line);
        if (!req) {
            fprintf(stderr, "reward_prog: the request is not JSON\n");
            free(line);
            return 1;
        }
        int S = cJSON_GetArraySize(cJSON_GetObjectItem(req, "completions"));
        int step = cJSON_GetObjectItem(cJSON_GetObjectItem(req, "trainer_state"), "global_step")->valueint;
        if (!strcmp(mode, "dump") && argc > 2) {
            FILE *f = fopen(argv[2], "a");
            fputs(line, f);
            fclose(f);
        }
        if (!strcmp(mode, "builtin")) answer_builtin(req, S);
        else if (!strcmp(mode, "null")) {
            printf("[");
            for (int i = 0; i < S; i++) printf("%s%s", i ? "," : "", i % 2 ? "null" : "1");
            printf("]\n");
        } else if (!strcmp(mode, "fail") && argc > 3 && step == atoi(argv[3])) {
            const char *kind = argv[2];
            fprintf(stderr, "reward_prog: failing by '%s' at step %d\n", kind, step);  // (the user's terminal)
            if (!strcmp(kind, "exit")) {
                cJSON_Delete(req), free(line);  // (all freed: a sanitizer build's leak check would change the status)
                return 3;
            }
            if (!strcmp(kind, "hang")) pause();
            if (!strcmp(kind, "malformed")) printf("{oops\n");
            if (!strcmp(kind, "count")) {  // correctness one short
                printf("{\"correctness\": [");
                for (int i = 0; i < S - 1; i++) printf("%s1", i ? "," : "");
                printf("], \"format\": [");
                for (int i = 0; i < S; i++) printf("%s1", i ? "," : "");
                printf("]}\n");
            }
            if (!strcmp(kind, "nonnumber")) {  // a text for the first correctness
                printf("{\"correctness\": [\"a\"");
                for (int i = 1; i < S; i++) printf(",1");
                printf("], \"format\": [");
                for (int i = 0; i < S; i++) printf("%s1", i ? "," : "");
                printf("]}\n");
            }
            if (!strcmp(kind, "huge")) {  // 17 MiB of rewards and no end of line
                printf("[");
                for (int i = 0; i < (17 << 20) / 2; i++) printf("1,");
                fflush(stdout);
                pause();
            }
            if (!strcmp(kind, "stdout")) {
                printf("debug: scoring %d completions\n", S);
                fflush(stdout);
                answer_builtin(req, S);
            }
        } else if (!strcmp(mode, "fail")) answer_builtin(req, S);
        else {  // dump (and anything else): 1 each
            printf("[");
            for (int i = 0; i < S; i++) printf("%s1", i ? "," : "");
            printf("]\n");
        }
        fflush(stdout);
        cJSON_Delete(req);
    }
    free(line);
    return 0;
}
