// test/test_reward_program.c: ./train_grpo with reward programs (--reward_cmd, tasks/reward_program.h) on
// the built-in tiny model (CPU), the program being test/reward_prog.c (built by the Makefile).
// A program that computes the built-in correctness and format rewards from the request alone gives
// the built-in run's metrics.jsonl (every field but the timings) and adapter, byte for byte; the
// request holds every column of the data, conversational prompts as messages (completions as
// assistant messages), null where a line lacks a column; null rewards are left out of the weighted
// sum and of the reward's mean; each failure (exit, hang, malformed JSON, the wrong count, a
// non-number, a line over 16 MiB, a log line on stdout) stops the run with one line naming it, the
// program gone, the last checkpoint and metrics.jsonl intact, and --resume continues once the program
// is fixed; bad reward options and
// data are one line each.
#include <check.h>
#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "io/safetensors.h"  // read_file, write_file_atomic

#ifndef REWARD_PROG
#error "build with the Makefile: it passes -DREWARD_PROG=<the absolute path of build/reward_prog>"
#endif

// the default task, a short warm-up (made once by setup), small steps
#define RUN "./train_grpo --device cpu --quiet --warmup_sft_steps 300 --eval_size 20 --eval_steps 2 --per_device_train_batch_size 16 --num_generations 4"
static char base_dir[] = "/tmp/fp8grpo_rewardXXXXXX";

// a shell command's exit status; its stderr in err (cap bytes), its stdout dropped
static int run(const char *cmd, char *err, size_t cap) {
    char full[9500], ef[1200];
    snprintf(ef, sizeof ef, "%s/stderr.txt", base_dir);
    snprintf(full, sizeof full, "%s >/dev/null 2>%s", cmd, ef);
    int rc = system(full);
    char *text = read_file(ef, NULL);
    snprintf(err, cap, "%s", text);
    free(text);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void setup(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    ck_assert(mkdtemp(base_dir));
    use_cache_in(base_dir);  // the built-in warm-up, made once here for every run of the suite
    char cmd[2048], err[4096];
    snprintf(cmd, sizeof cmd, RUN " --max_steps 1 --output_dir %s/warm", base_dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "warm-up run failed: %s", err);
}

// dir = base_dir/name, fresh (the warm-up is the suite's cache's: no run makes one)
static void fresh_dir(const char *name, char *dir, size_t cap) {
    char cmd[4096];
    snprintf(dir, cap, "%s/%s", base_dir, name);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
}

static char *slurp(const char *dir, const char *rel) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    return read_file(p, NULL);
}

static int exists(const char *dir, const char *rel) {
    char p[2048];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    return stat(p, &sb) == 0;
}

// metrics.jsonl's lines as JSON objects, *n of them (the caller frees each and the array)
static cJSON **metrics_lines(const char *dir, int *n) {
    char *text = slurp(dir, "metrics.jsonl"), *save = NULL;
    cJSON **lines = NULL;
    *n = 0;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        lines = (cJSON **)reallocCheck(lines, (*n + 1) * sizeof(cJSON *));
        lines[(*n)++] = cJSON_Parse(l);
        ck_assert_msg(lines[*n - 1], "%s: a line of metrics.jsonl is not JSON: %s", dir, l);
    }
    free(text);
    return lines;
}
static void free_lines(cJSON **l, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(l[i]);
    free(l);
}

static int timing_key(const char *k) {
    return !strcmp(k, "step_time") || !strncmp(k, "time/", 5) || !strncmp(k, "tokens_per_sec/", 15);
}

// The built-in rewards as a program: the same metrics.jsonl but for the timings (every other field
// present in both, equal), the same adapter and optimizer state byte for byte. The run must have had
// something to learn from (rewards that differ within a group), or the comparison would prove little.
START_TEST(test_program_equals_builtin) {
    setup();
    char a[1200], b[1200], cmd[4096], err[4096];
    fresh_dir("builtin", a, sizeof a);
    fresh_dir("program", b, sizeof b);
    snprintf(cmd, sizeof cmd, RUN " --max_steps 4 --output_dir %s", a);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, RUN " --max_steps 4 --output_dir %s --reward_cmd '%s builtin' --reward_names correctness+format "
             "--reward_weights 1,0.2", b, REWARD_PROG);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    int na, nb, compared = 0;
    double max_std = 0;
    cJSON **la = metrics_lines(a, &na), **lb = metrics_lines(b, &nb);
    ck_assert_int_eq(na, 5);  // line 0 (before GRPO) and steps 1..4
    ck_assert_int_eq(nb, na);
    for (int i = 0; i < na; i++) {
        ck_assert_int_eq(cJSON_GetArraySize(la[i]), cJSON_GetArraySize(lb[i]));
        for (const cJSON *x = la[i]->child; x; x = x->next) {
            const cJSON *y = cJSON_GetObjectItemCaseSensitive(lb[i], x->string);
            ck_assert_msg(y, "line %d: the program's run has no %s", i, x->string);
            if (timing_key(x->string)) continue;
            ck_assert_msg(cJSON_Compare(x, y, 1), "line %d: %s differs: %.17g vs %.17g", i, x->string, x->valuedouble, y->valuedouble);
            compared++;
        }
        const cJSON *sd = cJSON_GetObjectItemCaseSensitive(la[i], "reward_std");
        if (cJSON_IsNumber(sd) && sd->valuedouble > max_std) max_std = sd->valuedouble;
    }
    ck_assert_msg(compared > 4 * 30, "only %d fields compared", compared);
    ck_assert_msg(max_std > 0, "every group's rewards were equal: nothing was learned from them");
    ck_assert(cJSON_GetObjectItemCaseSensitive(lb[1], "time/reward"));
    free_lines(la, na);
    free_lines(lb, nb);
    const char *files[] = {"checkpoint-4/adapter_model.safetensors", "checkpoint-4/optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char pa[1400], pb[1400];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        size_t sa, sb;
        char *x = read_file(pa, &sa), *y = read_file(pb, &sb);
        ck_assert_msg(sa == sb && !memcmp(x, y, sa), "%s differs", files[i]);
        free(x), free(y);
    }
}
END_TEST

// A data file in TRL's shape: a conversational prompt (system + user) and a text one, extra columns,
// a line without an answer. The request carries each by name, a value per completion.
START_TEST(test_columns_and_conversational) {
    setup();
    char dir[1200], model[1400], data[1300], dump[1300], cmd[8192], err[4096];
    fresh_dir("columns", dir, sizeof dir);
    // the built-in model with a ChatML template (its vocabulary has <|im_start|> and <|im_end|>)
    snprintf(model, sizeof model, "%s/chatmodel", dir);
    char warm[1400];
    warm_cached(warm, sizeof warm);
    snprintf(cmd, sizeof cmd, "cp -r %s %s", warm, model);
    ck_assert_int_eq(system(cmd), 0);
    char p[1500];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", model);
    const char *tc = "{\"eos_token\": \"<|im_end|>\", \"chat_template\": \"{% for m in messages %}<|im_start|>{{ m.role }}\\n"
                     "{{ m.content }}<|im_end|>\\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}\"}\n";
    write_file_atomic(p, tc, strlen(tc));
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    snprintf(dump, sizeof dump, "%s/requests.jsonl", dir);
    const char *d = "{\"prompt\": [{\"role\": \"system\", \"content\": \"Add.\"}, {\"role\": \"user\", \"content\": \"1+2=\"}], "
                    "\"answer\": \"3\", \"level\": 2, \"tags\": [\"sum\", \"small\"]}\n"
                    "{\"prompt\": \"5+4=\", \"difficulty\": \"easy\", \"level\": 1}\n";
    write_file_atomic(data, d, strlen(d));
    const char *small = "--device cpu --quiet --max_steps 2 --per_device_train_batch_size 4 --num_generations 2 "
                        "--max_completion_length 4 --heldout_frac 0";
    snprintf(cmd, sizeof cmd, "./train_grpo %s --model %s --data %s --output_dir %s/out --reward_cmd '%s dump %s'", small, model, data,
             dir, REWARD_PROG, dump);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    char *text = read_file(dump, NULL), *save = NULL;
    int steps = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), steps++) {
        cJSON *req = cJSON_Parse(line);
        ck_assert_msg(req, "a request is not JSON: %s", line);
        const char *keys[] = {"prompts", "completions", "completion_ids", "truncated", "answer", "level", "tags", "difficulty"};
        for (int k = 0; k < 8; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, keys[k]);
            ck_assert_msg(cJSON_GetArraySize(v) == 4, "step %d: \"%s\" is not a list of 4: %s", steps + 1, keys[k], line);
        }
        ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(req, "trainer_state"), "global_step")->valueint, steps + 1);
        int conv = 0, text_prompts = 0;
        for (int q = 0; q < 4; q++) {
            const cJSON *pr = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "prompts"), q);
            const cJSON *co = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "completions"), q);
            const cJSON *ids = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "completion_ids"), q);
            const cJSON *ans = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "answer"), q);
            const cJSON *lvl = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "level"), q);
            const cJSON *tags = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "tags"), q);
            const cJSON *dif = cJSON_GetArrayItem(cJSON_GetObjectItem(req, "difficulty"), q);
            ck_assert(cJSON_IsArray(ids) && cJSON_GetArraySize(ids) >= 1 && cJSON_GetArraySize(ids) <= 4);
            if (cJSON_IsArray(pr)) {  // the conversational line: its messages, an assistant message, its columns
                conv++;
                ck_assert_int_eq(cJSON_GetArraySize(pr), 2);
                ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(pr, 0), "role")->valuestring, "system");
                ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(pr, 1), "content")->valuestring, "1+2=");
                ck_assert(cJSON_IsArray(co) && cJSON_GetArraySize(co) == 1);
                ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(co, 0), "role")->valuestring, "assistant");
                ck_assert(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(co, 0), "content")));
                ck_assert_str_eq(ans->valuestring, "3");
                ck_assert_int_eq(lvl->valueint, 2);
                ck_assert_str_eq(cJSON_GetArrayItem(tags, 1)->valuestring, "small");
                ck_assert(cJSON_IsNull(dif));
            } else {  // the text line: text, text, null where it has no column
                text_prompts++;
                ck_assert_str_eq(pr->valuestring, "5+4=");
                ck_assert(cJSON_IsString(co));
                ck_assert(cJSON_IsNull(ans) && cJSON_IsNull(tags));
                ck_assert_int_eq(lvl->valueint, 1);
                ck_assert_str_eq(dif->valuestring, "easy");
            }
        }
        ck_assert_int_eq(conv, 2);  // each prompt's 2 completions
        ck_assert_int_eq(text_prompts, 2);
        cJSON_Delete(req);
    }
    ck_assert_int_eq(steps, 2);
    free(text);
    // the same data on a model without a chat template: one line saying so
    char plain[1400];
    warm_cached(plain, sizeof plain);
    snprintf(cmd, sizeof cmd, "./train_grpo %s --model %s --data %s --output_dir %s/out2 --reward_cmd '%s null'", small, plain, data, dir,
             REWARD_PROG);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "1 prompts are lists of messages, which need the chat template"), "%s", err);
    // the built-in correctness reward on it: the line without an answer does not count (NaN), the run goes on;
    // on a file where no line has an answer it is refused
    const char *none = "{\"prompt\": \"5+4=\"}\n";
    write_file_atomic(data, none, strlen(none));
    snprintf(cmd, sizeof cmd, "./train_grpo %s --model %s --data %s --output_dir %s/out3", small, plain, data, dir);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "no line has an \"answer\", which the built-in correctness reward needs"), "%s", err);
}
END_TEST

// null: "does not apply", out of the weighted sum (as 0) and out of the reward's own mean
START_TEST(test_null_rewards) {
    setup();
    char dir[1200], cmd[4096], err[4096];
    fresh_dir("null", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, RUN " --max_steps 2 --output_dir %s --reward_cmd '%s null'", dir, REWARD_PROG);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    int n;
    cJSON **l = metrics_lines(dir, &n);
    ck_assert_int_eq(n, 3);
    for (int i = 1; i < n; i++) {
        ck_assert(!cJSON_GetObjectItemCaseSensitive(l[i], "rewards/correctness/mean"));  // (no built-in ones with a program)
        ck_assert_double_eq(cJSON_GetObjectItemCaseSensitive(l[i], "rewards/cmd0/mean")->valuedouble, 1.0);  // the 8 non-null ones
        ck_assert_double_eq(cJSON_GetObjectItemCaseSensitive(l[i], "rewards/cmd0/std")->valuedouble, 0.0);
        ck_assert_double_eq(cJSON_GetObjectItemCaseSensitive(l[i], "reward")->valuedouble, 0.5);  // 8 x 1 and 8 x (nothing) over 16
    }
    free_lines(l, n);
}
END_TEST

// Each failure at step 3 of 4 (a checkpoint every step): a non-zero exit and one error line naming it
// and quoting the answer; checkpoint-2 and metrics.jsonl's lines 0-2 as they were, nothing of step 3;
// then the program fixed (the same command), --resume finishes the run.
static void failure(const char *kind, const char *want) {
    char dir[1200], script[1300], cmd[8192], err[4096], body[1600];
    fresh_dir(kind, dir, sizeof dir);
    snprintf(script, sizeof script, "%s/reward.sh", dir);
    snprintf(body, sizeof body, "exec %s fail %s 3\n", REWARD_PROG, kind);
    write_file_atomic(script, body, strlen(body));
    const char *opts = RUN " --max_steps 4 --save_steps 1 --reward_timeout 2 --reward_names correctness+format --reward_weights 1,0.2";
    snprintf(cmd, sizeof cmd, "%s --output_dir %s --reward_cmd 'sh %s'", opts, dir, script);
    double t0 = now_sec();
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    ck_assert_msg(now_sec() - t0 < 60, "%s: the run took %.0f s to stop", kind, now_sec() - t0);
    const char *line = strstr(err, "error: ");
    ck_assert_msg(line, "%s: no error line: %s", kind, err);
    ck_assert_msg(strstr(line, "reward program 'correctness+format' at step 3: ") && strstr(line, want) &&
                  strstr(line, "--resume continues the run"), "%s: stderr: %s", kind, err);
    ck_assert_msg(!strchr(line, '\n') || !strchr(line, '\n')[1], "%s: more than one error line: %s", kind, err);
    ck_assert_msg(strstr(err, "reward_prog: failing by"), "%s: the program's stderr did not reach ours: %s", kind, err);
    snprintf(cmd, sizeof cmd, "pgrep -f 'reward_pro[g] fail %s' >/dev/null", kind);  // ([g]: not this shell's own line)
    ck_assert_msg(system(cmd) != 0, "%s: the program is still running", kind);  // (killed, a hung one too)
    ck_assert(exists(dir, "checkpoint-2/adapter_model.safetensors"));
    ck_assert(!exists(dir, "checkpoint-3") && !exists(dir, "checkpoint-3.tmp"));
    int n;
    cJSON **l = metrics_lines(dir, &n);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(cJSON_GetObjectItem(l[2], "step")->valueint, 2);
    free_lines(l, n);
    snprintf(body, sizeof body, "exec %s builtin\n", REWARD_PROG);
    write_file_atomic(script, body, strlen(body));
    snprintf(cmd, sizeof cmd, "%s --resume --output_dir %s --reward_cmd 'sh %s'", opts, dir, script);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s: the resume failed: %s", kind, err);
    ck_assert(exists(dir, "checkpoint-4/adapter_model.safetensors"));
    l = metrics_lines(dir, &n);
    ck_assert_int_eq(n, 5);
    free_lines(l, n);
}

START_TEST(test_failures) {
    setup();
    failure("exit", "exited with status 3 without answering");
    failure("hang", "no answer within --reward_timeout 2 s");
    failure("malformed", "answered text that is not one JSON value: \"{oops\"");
    failure("count", "answered 15 rewards for 16 completions of \"correctness\"");
    failure("nonnumber", "answered a reward that is not a finite number or null (entry 0 of \"correctness\"): \"{\"correctness\": [\"a\",1,1");
    failure("huge", "answered a line longer than 16 MiB: \"[1,1,1,");
    failure("stdout", "wrote to stdout before its answer: \"debug: scoring 16 completions\"; write logs to stderr");
}
END_TEST

// bad reward options: one line each, before any work; a program that is not there, or that greets
// on stdout, at its first request
START_TEST(test_bad_reward_options) {
    setup();
    char dir[1200], cmd[4096], err[4096];
    struct {
        const char *opts, *want;
    } cases[] = {
        {"--reward_names a", "--reward_names names the --reward_cmd programs: add --reward_cmd"},
        {"--reward_cmd true --reward_names a,b", "has more entries than the 1 --reward_cmd programs"},
        {"--reward_cmd true --reward_cmd true --reward_names a", "has fewer entries than the 2 --reward_cmd programs"},
        {"--reward_cmd true --reward_funcs correctness --reward_names correctness", "two rewards are named 'correctness'"},
        {"--reward_cmd true --reward_names 'a b'", "a name is 1-63 letters, digits"},
        {"--reward_funcs exact", "unknown reward 'exact': use correctness, format or none"},
        {"--reward_funcs none", "no --reward_cmd or --reward_model: the run has no reward"},
        {"--reward_cmd true --reward_funcs format --reward_weights 1", "reward_weights has 1 values but there are 2 reward functions (format, cmd0)"},
        {"--reward_cmd nosuchprogram_xyz", "reward program 'cmd0' at step 1: exited with status 127 (command not found?) without answering"},
        // a banner at its start: said at the first request (before it, or after it with the answer behind)
        {"--reward_cmd 'echo hello; exec " REWARD_PROG " null'", "reward program 'cmd0' at step 1: wrote to stdout before its answer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu", i);
        fresh_dir(name, dir, sizeof dir);  // (the warm-up in each: the last two fail after it)
        snprintf(cmd, sizeof cmd, RUN " --max_steps 1 --output_dir %s %s", dir, cases[i].opts);
        ck_assert_msg(run(cmd, err, sizeof err) != 0, "accepted: %s", cases[i].opts);
        ck_assert_msg(strstr(err, cases[i].want), "%s: stderr: %s", cases[i].opts, err);
    }
}
END_TEST

static Suite *reward_suite(void) {
    Suite *s = suite_create("reward_program");
    TCase *tc = tcase_create("reward_program");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_program_equals_builtin);
    tcase_add_test(tc, test_null_rewards);
    tcase_add_test(tc, test_columns_and_conversational);
    tcase_add_test(tc, test_failures);
    tcase_add_test(tc, test_bad_reward_options);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    setenv("CK_FORK", "no", 1);  // one process: the warm-up made by the first test is reused by the others
    return run_suite(reward_suite());
}
