// test/test_train.c: ./train_grpo end to end on the built-in tiny model (CPU).
// Bad options and data are one-line errors with a non-zero exit; a run that fails
// never touches an existing checkpoint; --resume continues bit-exactly (the adapter
// after 2 + 2 steps equals the adapter after 4 straight steps); a short run on an
// easy task raises the reward. All runs share one cached warm-up.
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>

#include "safetensors.h"
#include "testutil.h"

// the default task and warm-up (made once, ~2 min on 2 cores), smaller evaluations
#define EASY "--eval_size 100 --device cpu --quiet"
static char base_dir[] = "/tmp/fp8grpo_trainXXXXXX";

// run a shell command; its exit status, and its stderr in err (cap bytes)
static int run(const char *cmd, char *err, size_t cap) {
    char full[4096], ef[1200];
    snprintf(ef, sizeof ef, "%s/stderr.txt", base_dir);
    snprintf(full, sizeof full, "%s >/dev/null 2>%s", cmd, ef);
    int rc = system(full);
    if (err) {
        size_t n = 0;
        char *e = file_exists(ef) ? read_file(ef, &n) : str_dup("");
        snprintf(err, cap, "%s", e);
        free(e);
    }
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void setup(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    ck_assert(mkdtemp(base_dir));
    // one warm-up, copied into each run's output_dir (the cache is keyed by its settings)
    char cmd[2048], err[2048];
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 1 --output_dir %s/warm", base_dir);
    int rc = run(cmd, err, sizeof err);
    ck_assert_msg(rc == 0, "warm-up run failed (%d): %s", rc, err);
}

static void fresh_dir(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", base_dir, name);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp -r %s/warm/warmup %s/", out, out, base_dir, out);
    ck_assert_int_eq(system(cmd), 0);
}

// each bad input: non-zero exit and one line naming the problem
START_TEST(test_bad_options) {
    setup();
    struct { const char *args, *msg; } cases[] = {
        {"--no_such_option 3", "unknown option --no_such_option"},
        {"--learning_rate abc", "--learning_rate: 'abc' is not a number"},
        {"--temperature -1", "--temperature"},
        {"--num_generations 1", "num_generations"},
        {"--per_device_train_batch_size 12 --num_generations 8", "not a multiple of num_generations"},
        {"--load_in_fp8 int4", "unknown mode 'int4'"},
        {"--loss_type foo", "unknown loss_type 'foo'"},
        {"--max_steps 0", "--max_steps"},
        {"--lr_scheduler_type polynomial", "not supported"},
        {"--device tpu", "unknown --device 'tpu'"},
        {"--max_steps", "needs a value"},
        {"stray", "unexpected argument 'stray'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[2048], err[2048], dir[1200];
        fresh_dir("bad", dir, sizeof dir);
        snprintf(cmd, sizeof cmd, "./train_grpo --output_dir %s %s", dir, cases[i].args);
        int rc = run(cmd, err, sizeof err);
        ck_assert_msg(rc != 0, "'%s' exited 0", cases[i].args);
        ck_assert_msg(strstr(err, cases[i].msg), "'%s': stderr '%s' lacks '%s'", cases[i].args, err, cases[i].msg);
        ck_assert_msg(strncmp(err, "error: ", 7) == 0 && strchr(err, '\n') == err + strlen(err) - 1 &&
                          !strstr(err, "Segmentation"),
                      "'%s': not one error line: '%s'", cases[i].args, err);
    }
}
END_TEST

START_TEST(test_bad_jsonl) {
    setup();
    char dir[1200], data[1300], cmd[4096], err[2048], model[1024];
    fresh_dir("jsonl", dir, sizeof dir);
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    const char *text = "{\"prompt\": \"1+1?\", \"answer\": \"#### 2\"}\n{\"prompt\": \"2+2?\" \"answer\": 4}\n";
    write_file_atomic(data, text, strlen(text));
    fixture_path(model, sizeof model, "qwen3");
    snprintf(cmd, sizeof cmd, "./train_grpo --output_dir %s --model %s --data %s", dir, model, data);
    int rc = run(cmd, err, sizeof err);
    ck_assert_int_ne(rc, 0);
    ck_assert_msg(strstr(err, "data.jsonl:2:"), "stderr: %s", err);
}
END_TEST

static char *slurp(const char *dir, const char *rel, size_t *n) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    return read_file(p, n);
}

// a finished run, then attempts that must fail without touching its checkpoint
START_TEST(test_checkpoint_never_overwritten) {
    setup();
    char dir[1200], cmd[4096], err[2048];
    fresh_dir("keep", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 2 --output_dir %s", dir);
    ck_assert_int_eq(run(cmd, err, sizeof err), 0);
    size_t n0, n1;
    char *before = slurp(dir, "checkpoint-2/adapter_model.safetensors", &n0);
    // the same command again: refused, the checkpoint is intact
    int rc = run(cmd, err, sizeof err);
    ck_assert_int_ne(rc, 0);
    ck_assert_msg(strstr(err, "already holds checkpoint-2"), "stderr: %s", err);
    // a resume with a bad option fails before touching anything
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 3 --resume --lora_r 0 --output_dir %s", dir);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    // a resume with settings that differ from the checkpoint's is refused
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 3 --resume --lora_r 8 --output_dir %s", dir);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "other settings"), "stderr: %s", err);
    char *after = slurp(dir, "checkpoint-2/adapter_model.safetensors", &n1);
    ck_assert(n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);
}
END_TEST

// 4 steps straight == 2 steps, "killed" (later checkpoints removed), resumed to 4
START_TEST(test_resume_bit_exact) {
    setup();
    char a[1200], b[1200], cmd[8192], err[2048];
    fresh_dir("straight", a, sizeof a);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 4 --save_steps 2 --eval_steps 2 --output_dir %s", a);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    // the interrupted run: a copy of the straight run as it was after step 2
    fresh_dir("resumed", b, sizeof b);
    snprintf(cmd, sizeof cmd, "cp -r %s/checkpoint-2 %s/ && head -n 3 %s/metrics.jsonl > %s/metrics.jsonl", a, b, a, b);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 4 --save_steps 2 --eval_steps 2 --resume --output_dir %s", b);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    const char *files[] = {"checkpoint-4/adapter_model.safetensors", "checkpoint-4/optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        size_t na, nb;
        char *x = slurp(a, files[i], &na), *y = slurp(b, files[i], &nb);
        ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "%s differs after resume", files[i]);
        free(x);
        free(y);
    }
    // the metrics of steps 3 and 4 agree too (all but the timings)
    char *ma = slurp(a, "metrics.jsonl", NULL), *mb = slurp(b, "metrics.jsonl", NULL);
    cJSON *la = NULL, *lb = NULL;
    char *sa = NULL, *sb = NULL;
    int lines = 0;
    for (char *x = strtok_r(ma, "\n", &sa), *y = strtok_r(mb, "\n", &sb); x && y;
         x = strtok_r(NULL, "\n", &sa), y = strtok_r(NULL, "\n", &sb), lines++) {
        la = cJSON_Parse(x);
        lb = cJSON_Parse(y);
        const char *keys[] = {"step", "loss", "reward", "grad_norm", "eval/accuracy", "completions/mean_length"};
        for (int k = 0; k < 6; k++) {
            cJSON *u = cJSON_GetObjectItemCaseSensitive(la, keys[k]), *v = cJSON_GetObjectItemCaseSensitive(lb, keys[k]);
            ck_assert_msg((!u && !v) || (u && v && cJSON_Compare(u, v, 1)), "line %d: %s differs", lines, keys[k]);
        }
        cJSON_Delete(la);
        cJSON_Delete(lb);
    }
    ck_assert_int_eq(lines, 5);  // step 0 (before GRPO) and steps 1..4
    free(ma);
    free(mb);
}
END_TEST

// GRPO fixes what the warm-up got wrong: held-out accuracy rises, the sampled reward does not fall
START_TEST(test_grpo_learns) {
    setup();
    char dir[1200], cmd[4096], err[2048];
    fresh_dir("learn", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 100 --eval_size 200 --eval_steps 0 --output_dir %s", dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    char *m = slurp(dir, "metrics.jsonl", NULL), *save = NULL;
    double r[128], acc0 = NAN, acc1 = NAN;
    int n = 0;
    for (char *line = strtok_r(m, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "rewards/correctness/mean");
        cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "eval/accuracy");
        if (cJSON_IsNumber(x) && n < 128) r[n++] = x->valuedouble;
        if (cJSON_IsNumber(a)) {
            if (isnan(acc0)) acc0 = a->valuedouble;
            else acc1 = a->valuedouble;
        }
        cJSON_Delete(j);
    }
    free(m);
    ck_assert_int_eq(n, 100);
    double first = 0, last = 0;
    for (int i = 0; i < 10; i++) first += r[i] / 10, last += r[n - 10 + i] / 10;
    printf("GRPO, 100 steps: sampled correctness %.3f -> %.3f, held-out accuracy %.3f -> %.3f\n", first, last, acc0, acc1);
    // The warm-up demonstrations forget 70% of the carries; GRPO's correctness reward fixes
    // that on held-out problems (the training problems were seen in the warm-up). All 149
    // held-out problems, greedy: a rise of 10 points is 15 problems that flipped to right.
    ck_assert_msg(acc1 >= acc0 + 0.10, "held-out accuracy did not rise: %.3f -> %.3f", acc0, acc1);
    ck_assert_msg(last >= first - 0.02, "sampled correctness fell: %.3f -> %.3f", first, last);
    char p[2048];
    snprintf(p, sizeof p, "%s/plot.svg", dir);
    ck_assert(file_exists(p));
    snprintf(p, sizeof p, "%s/checkpoint-100/adapter_config.json", dir);
    ck_assert(file_exists(p));
}
END_TEST

static Suite *train_suite(void) {
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_bad_options);
    tcase_add_test(tc, test_bad_jsonl);
    tcase_add_test(tc, test_checkpoint_never_overwritten);
    tcase_add_test(tc, test_resume_bit_exact);
    tcase_add_test(tc, test_grpo_learns);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    // one process: the warm-up made by the first test is reused by the others
    setenv("CK_FORK", "no", 1);
    return run_suite(train_suite());
}
