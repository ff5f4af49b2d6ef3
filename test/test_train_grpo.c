// test/test_train_grpo.c: ./train_grpo end to end on the built-in tiny model (CPU).
// Bad options and data are one-line errors with a non-zero exit, a bad output directory
// before any work; a run that fails never touches an existing checkpoint; --resume
// continues bit-exactly (the adapter after 2 + 2 steps equals the adapter after 4
// straight steps); a short run on an easy task raises the reward. --help shows every
// default; '-' and '_' spell the same option. Without --output_dir the default command
// runs twice (out/run-1, out/run-2) and --resume continues the newest; the warm-up
// checkpoint carries a tokenizer.json that reads back as the built-in vocabulary, and the
// ./generate command a run prints at its end works and prints text. All runs share one
// cached warm-up, in the suite's own cache (use_cache_in), whatever their --output_dir or
// working directory; runs that need a warm-up at once make it once. A tokenizer of another checkpoint is said at load; --resume of a finished run
// reports its figures and trains nothing; --save_total_limit keeps the newest checkpoints and
// the one a run resumed from.
#include <check.h>
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <unistd.h>

#include "testutil.h"
#include "tokenizer.h"
#include "core/backend.h"  // convert_to_f64
#include "io/safetensors.h"
#include "train/checkpoint.h"  // run_dir_claim
#include "train/sft.h"         // sft_eos_id

// the default task and warm-up (made once, ~2 min on 2 cores), smaller evaluations (QUIET: the
// evaluation's size left to the command, an option may be given once)
#define QUIET "--device cpu --quiet"
#define EASY "--eval_size 100 " QUIET
static char base_dir[] = "/tmp/fp8grpo_trainXXXXXX";

// run a shell command; its exit status, its stdout in out and its stderr in err (each may
// be NULL; cap bytes)
static int run_out(const char *cmd, char *out, size_t ocap, char *err, size_t ecap) {
    char full[4096], of[1200], ef[1200];
    snprintf(of, sizeof of, "%s/stdout.txt", base_dir);
    snprintf(ef, sizeof ef, "%s/stderr.txt", base_dir);
    snprintf(full, sizeof full, "%s >%s 2>%s", cmd, out ? of : "/dev/null", ef);
    int rc = system(full);
    const char *files[2] = {of, ef};
    char *bufs[2] = {out, err};
    size_t caps[2] = {ocap, ecap};
    for (int i = 0; i < 2; i++) {
        if (!bufs[i]) continue;
        char *text = file_exists(files[i]) ? read_file(files[i], NULL) : str_dup("");
        snprintf(bufs[i], caps[i], "%s", text);
        free(text);
    }
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}
static int run(const char *cmd, char *err, size_t cap) { return run_out(cmd, NULL, 0, err, cap); }

static int path_exists(const char *p) {  // a file or a directory
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void setup(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    ck_assert(mkdtemp(base_dir));
    use_cache_in(base_dir);  // one warm-up for every run below (the cache is keyed by its settings)
    char cmd[2048], err[2048];
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 1 --output_dir %s/warm", base_dir);
    int rc = run(cmd, err, sizeof err);
    ck_assert_msg(rc == 0, "warm-up run failed (%d): %s", rc, err);
}

static void fresh_dir(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", base_dir, name);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", out, out);
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
        {"--load_in_fp8 int4", "--load_in_fp8: unknown value 'int4': use block, row, tensor or off"},
        {"--loss_type foo", "unknown loss_type 'foo'"},
        {"--max_steps 0", "--max_steps: 0 is too small: at least 1"},
        {"--max_steps 3000000000", "--max_steps: 3000000000 is too large: at most 1000000000"},
        {"--temperature 0", "--temperature 0 samples (all but) greedily"},
        {"--lr_scheduler_type polynomial", "--lr_scheduler_type: unknown value 'polynomial': use cosine, linear or constant"},
        {"--device tpu", "--device: unknown value 'tpu': use auto, cpu or cuda"},
        {"--task sudoku", "--task: unknown value 'sudoku'"},
        {"--max_steps", "needs a value"},
        {"stray", "unexpected argument 'stray'"},
        {"--resume=maybe", "--resume: 'maybe' is not true or false"},
        {"--mask_truncated_completions=maybe", "mask_truncated_completions: 'maybe' is not a boolean"},
        {"--beta -1", "--beta must be >= 0"},
        {"--lr 0.1", "unknown option --lr (see --help)"},
        {"--fp8 row", "unknown option --fp8: did you mean --load_in_fp8?"},
        {"--resume --overwrite_output_dir", "contradict"},
        {"--save_total_limit -1", "--save_total_limit: -1 is too small: at least 0"},
        {"--use_peft false", "FP8 weights are frozen: add --load_in_fp8 off"},
        {"--use_peft false --load_in_fp8 off --beta 0.04", "use --beta 0"},
        {"--use_peft false --load_in_fp8 off --fp8_embeddings", "--fp8_embeddings freezes"},
        {"--adam_moments bf16", "--adam_moments bf16 is for --use_peft false"},
        {"--eval_data e.jsonl", "--eval_data needs --data"},
        {"--heldout_frac 0.2", "--heldout_frac is the share of --data held out"},
        {"--heldout_frac 0.95", "--heldout_frac: '0.95' is not a number in [0, 0.9]"},
        {"--model m --data d.jsonl --eval_data e.jsonl --heldout_frac 0.2", "give one"},
        {"--algo sac", "--algo: unknown value 'sac': use grpo or ppo"},
        {"--kl_coef 0.1", "--kl_coef is a PPO option: add --algo ppo"},
        {"--algo ppo --beta 0.04", "--beta is a GRPO option; with --algo ppo its KL penalty is --kl_coef"},
        {"--algo ppo --num_iterations 2", "--num_iterations is a GRPO option; with --algo ppo its passes over a batch are --num_ppo_epochs"},
        {"--algo ppo --loss_type bnpo", "--loss_type is a GRPO option"},
        {"--algo ppo --use_peft false --load_in_fp8 off", "drop --use_peft false"},
        {"--algo ppo --num_mini_batches 3", "per_device_train_batch_size 64 is not a multiple of num_mini_batches 3"},
        {"--algo ppo --per_device_train_batch_size 1 --num_generations 1", "per_device_train_batch_size must be >= 2"},
        {"--algo ppo --nproc_per_node 2", "--algo ppo runs on one process so far"},
        {"--algo ppo --kl_estimator k2", "--kl_estimator: unknown value 'k2': use k1 or k3"},
        {"--algo ppo --cliprange 1", "--cliprange"},
        {"--algo ppo --num_ppo_epochs 0", "--num_ppo_epochs: 0 is too small: at least 1"},
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

// The run in a "killed" after checkpoint-k: a fresh directory b (named name) holding a's checkpoint-k and
// the first k + 1 lines of its metrics (line 0 is before GRPO), resumed with opts; each of files
// (relative to the run's directory) must then be a's, byte for byte
static void resume_matches(const char *a, const char *name, char *b, size_t bcap, const char *opts, int k,
                           const char *const *files, int nfiles) {
    char cmd[8192], err[2048];
    fresh_dir(name, b, bcap);
    snprintf(cmd, sizeof cmd, "cp -r %s/checkpoint-%d %s/ && head -n %d %s/metrics.jsonl > %s/metrics.jsonl", a, k, b, k + 1, a, b);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "./train_grpo %s --resume --output_dir %s", opts, b);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < nfiles; i++) {
        size_t na, nb;
        char *x = slurp(a, files[i], &na), *y = slurp(b, files[i], &nb);
        ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "%s differs after resume (%s)", files[i], name);
        free(x);
        free(y);
    }
}

// the lines of a's and b's metrics.jsonl agree on each of keys (both absent, or the same value; with
// required, each key in every line after line 0); returns the lines compared
static int metrics_agree(const char *a, const char *b, const char *const *keys, int nkeys, int required) {
    char *ma = slurp(a, "metrics.jsonl", NULL), *mb = slurp(b, "metrics.jsonl", NULL);
    char *sa = NULL, *sb = NULL;
    int lines = 0;
    for (char *x = strtok_r(ma, "\n", &sa), *y = strtok_r(mb, "\n", &sb); x && y;
         x = strtok_r(NULL, "\n", &sa), y = strtok_r(NULL, "\n", &sb), lines++) {
        cJSON *la = cJSON_Parse(x), *lb = cJSON_Parse(y);
        for (int k = 0; k < nkeys; k++) {
            cJSON *u = cJSON_GetObjectItemCaseSensitive(la, keys[k]), *v = cJSON_GetObjectItemCaseSensitive(lb, keys[k]);
            ck_assert_msg((!u && !v) || (u && v && cJSON_Compare(u, v, 1)), "line %d: %s differs", lines, keys[k]);
            ck_assert_msg(!required || lines == 0 || u, "line %d: no %s", lines, keys[k]);
        }
        cJSON_Delete(la);
        cJSON_Delete(lb);
    }
    free(ma);
    free(mb);
    return lines;
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
    const char *opts = EASY " --max_steps 4 --save_steps 2 --eval_steps 2";
    snprintf(cmd, sizeof cmd, "./train_grpo %s --output_dir %s", opts, a);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    const char *files[] = {"checkpoint-4/adapter_model.safetensors", "checkpoint-4/optimizer.safetensors"};
    resume_matches(a, "resumed", b, sizeof b, opts, 2, files, 2);
    // the metrics of steps 3 and 4 agree too (all but the timings)
    const char *keys[] = {"step", "loss", "reward", "grad_norm", "eval/accuracy", "completions/mean_length"};
    ck_assert_int_eq(metrics_agree(a, b, keys, 6, 0), 5);  // step 0 (before GRPO) and steps 1..4
}
END_TEST

// PPO: 4 steps straight == 2 steps, "killed", resumed to 4: the policy adapter, its optimizer state and the
// value model (adapter, head and their AdamW state) byte for byte, the metrics too (TRL's PPO names); a
// GRPO run does not resume a PPO checkpoint
START_TEST(test_ppo_resume_bit_exact) {
    setup();
    char a[1200], b[1200], cmd[8192], out[8192], err[2048];
    const char *opts = QUIET " --algo ppo --max_steps 4 --save_steps 2 --eval_steps 2 --eval_size 20 --per_device_train_batch_size 16"
                            " --num_ppo_epochs 2 --num_mini_batches 2 --missing_eos_penalty 0.5";
    fresh_dir("ppo_straight", a, sizeof a);
    snprintf(cmd, sizeof cmd, "./train_grpo %s --output_dir %s", opts, a);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(out, "PPO value model") && strstr(out, "before PPO") && strstr(out, "\nPPO: 4 steps x ") &&
                      !strstr(out, "GRPO"), "%s", out);
    const char *files[] = {"checkpoint-4/adapter_model.safetensors", "checkpoint-4/optimizer.safetensors",
                           "checkpoint-4/value_model.safetensors"};
    resume_matches(a, "ppo_resumed", b, sizeof b, opts, 2, files, 3);
    const char *keys[] = {"step", "loss", "reward", "grad_norm", "objective/kl", "objective/entropy", "policy/approxkl_avg",
                          "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg", "val/clipfrac_avg", "val/ratio"};
    ck_assert_int_eq(metrics_agree(a, b, keys, 12, 1), 5);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 5 --per_device_train_batch_size 16 --resume --output_dir %s", b);
    ck_assert(run(cmd, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "other settings") && strstr(err, "algo"), "%s", err);
}
END_TEST

// GRPO of every weight (--use_peft false): it trains (the weights move, the checkpoint is a Hugging Face
// model that ./generate loads on its own), and resumes bit-exactly (4 steps straight == 2 + 2)
START_TEST(test_full_weight_grpo) {
    setup();
    char a[1200], b[1200], cmd[8192], out[8192], err[2048];
    const char *opts = QUIET " --use_peft false --load_in_fp8 off --learning_rate 1e-4 --max_steps 4 --save_steps 2 --eval_steps 0"
                             " --eval_size 20";
    fresh_dir("full_straight", a, sizeof a);
    snprintf(cmd, sizeof cmd, "./train_grpo %s --output_dir %s", opts, a);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    const char *names[] = {"model.safetensors", "config.json", "tokenizer.json", "optimizer.safetensors"};
    for (int i = 0; i < 4; i++) {
        char p[1400];
        snprintf(p, sizeof p, "%s/checkpoint-4/%s", a, names[i]);
        ck_assert_msg(path_exists(p), "%s missing", p);
    }
    // the weights move from step 2 to step 4 (both saved in bf16), and ./generate loads the checkpoint alone
    SafeTensors w2, w4;
    snprintf(cmd, sizeof cmd, "%s/checkpoint-2", a);
    st_open_dir(&w2, cmd);
    snprintf(cmd, sizeof cmd, "%s/checkpoint-4", a);
    st_open_dir(&w4, cmd);
    const char *tn = "model.layers.0.mlp.down_proj.weight";
    const STensor *t2 = st_find(&w2, tn), *t4 = st_find(&w4, tn);
    ck_assert(t2 && t4 && t2->numel == t4->numel && t2->dtype == t4->dtype);
    double *v2 = (double *)mallocCheck(t2->numel * sizeof(double)), *v4 = (double *)mallocCheck(t2->numel * sizeof(double));
    convert_to_f64(v2, t2->data, t2->dtype, t2->numel);
    convert_to_f64(v4, t4->data, t4->dtype, t4->numel);
    long moved = 0;
    for (int64_t i = 0; i < t2->numel; i++) moved += v2[i] != v4[i];
    ck_assert_msg(moved > t2->numel / 10, "only %ld of %ld weights moved in 2 steps", moved, (long)t2->numel);
    free(v2);
    free(v4);
    st_close(&w2);
    st_close(&w4);
    snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s/checkpoint-4 --load_in_fp8 off --prompt '3+4=' --max_new_tokens 3", a);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    // resumed from checkpoint-2: the same model and optimizer state at step 4
    const char *files[] = {"checkpoint-4/model.safetensors", "checkpoint-4/optimizer.safetensors"};
    resume_matches(a, "full_resumed", b, sizeof b, opts, 2, files, 2);
    // and a LoRA run does not resume it
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 5 --resume --output_dir %s", b);
    ck_assert(run(cmd, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "other settings") && strstr(err, "use_peft"), "%s", err);
    // AdamW's moments in bf16 (stochastic rounding): it resumes bit-exactly too, and the fp32 run's
    // checkpoint is not resumed with them
    char m16[1024], c[1200], d[1200];
    snprintf(m16, sizeof m16, "%s --adam_moments bf16", opts);
    fresh_dir("full_m16", c, sizeof c);
    snprintf(cmd, sizeof cmd, "./train_grpo %s --output_dir %s", m16, c);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(out, "AdamW's moments in bf16"), "%s", out);
    resume_matches(c, "full_m16_resumed", d, sizeof d, m16, 2, files, 2);
    snprintf(cmd, sizeof cmd, "./train_grpo %s --resume --output_dir %s", m16, b);  // (m16 names --max_steps 4 already)
    ck_assert(run(cmd, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "other settings") && strstr(err, "adam_moments"), "%s", err);
}
END_TEST

// the memory options end to end: --fp8_embeddings and --lora_dtype bf16 run, resume bit-exactly
// (the stochastic rounding's bits come from the step, not from a stream), and a checkpoint of one is not
// resumed without the same --lora_dtype
START_TEST(test_memory_options) {
    setup();
    char a[1200], b[1200], cmd[8192], out[8192], err[2048];
    const char *opts = QUIET " --max_steps 2 --save_steps 1 --eval_steps 0 --eval_size 20 --fp8_embeddings --lora_dtype bf16";
    fresh_dir("mem_straight", a, sizeof a);
    snprintf(cmd, sizeof cmd, "./train_grpo %s --output_dir %s", opts, a);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(out, "LoRA: r 16"), "%s", out);
    const char *files[] = {"checkpoint-2/optimizer.safetensors"};  // the bf16 state
    resume_matches(a, "mem_resumed", b, sizeof b, opts, 1, files, 1);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 3 --fp8_embeddings --resume --output_dir %s", a);
    ck_assert(run(cmd, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "other settings") && strstr(err, "lora_dtype"), "%s", err);
}
END_TEST

// The README says what plot.svg draws: the names it quotes in "`plot.svg` (per step: ...)" are the
// plot's legends (each legend: a line of stroke-width 2, then its text), and "kl", drawn when beta != 0
static void plot_as_readme_says(const char *svg_path) {
    char rp[PATH_MAX];  // the repository's README (the suites may run from build-san/: found from the fixtures)
    fixture_path(rp, sizeof rp, "../../README.md");
    char *svg = read_file(svg_path, NULL), *readme = read_file(rp, NULL), said[2048], drawn[2048] = "\"kl\"";
    const char *at = strstr(readme, "`plot.svg` (per step: ");
    ck_assert_msg(at, "README.md has no \"`plot.svg` (per step: ...)\"");
    const char *end = strchr(at, '(');  // to the parenthesis that closes this one
    for (int depth = 0; *end && (depth += (*end == '(') - (*end == ')')) > 0;) end++;
    ck_assert(*end == ')');
    snprintf(said, sizeof said, "%.*s", (int)(end - at), at);
    int n = 0;
    for (const char *l = strstr(svg, "stroke-width=\"2\""); l; l = strstr(l + 1, "stroke-width=\"2\""), n++) {
        const char *t = strchr(strstr(l, "<text"), '>') + 1;
        char name[128], quoted[140];
        snprintf(name, sizeof name, "%.*s", (int)(strstr(t, "</text>") - t), t);
        snprintf(quoted, sizeof quoted, "\"%s\"", name);
        ck_assert_msg(strstr(said, quoted), "the plot draws \"%s\"; the README says: %s", name, said);
        snprintf(drawn + strlen(drawn), sizeof drawn - strlen(drawn), " %s", quoted);
    }
    ck_assert_int_ge(n, 3);
    for (const char *q = strchr(said, '"'); q; q = strchr(strchr(q + 1, '"') + 1, '"')) {
        char quoted[140];
        snprintf(quoted, sizeof quoted, "%.*s", (int)(strchr(q + 1, '"') - q + 1), q);
        ck_assert_msg(strstr(drawn, quoted), "the README names %s; the plot draws %s", quoted, drawn);
    }
    free(svg), free(readme);
}

// The header line and the plot name the algorithm that runs: RLOO with --advantage_estimator rloo
// (PPO's: test_ppo_resume_bit_exact), GRPO by default
START_TEST(test_header_names_the_algorithm) {
    setup();
    char dir[1200], cmd[4096], out[16384], err[2048];
    const char *modes[2] = {"", "--advantage_estimator rloo --scale_rewards none"}, *names[2] = {"GRPO", "RLOO"};
    for (int k = 0; k < 2; k++) {
        fresh_dir(k ? "header_rloo" : "header_grpo", dir, sizeof dir);
        snprintf(cmd, sizeof cmd, "./train_grpo " QUIET " --eval_size 0 --max_steps 1 --per_device_train_batch_size 16 %s --output_dir %s",
                 modes[k], dir);
        ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
        char want[64];
        snprintf(want, sizeof want, "\n%s: 1 steps x 2 prompts x 8 completions", names[k]);
        ck_assert_msg(strstr(out, want) && !strstr(out, names[!k]), "%s", out);
        char *svg = slurp(dir, "plot.svg", NULL);
        snprintf(want, sizeof want, ">%s: accuracy on training rollouts", names[k]);
        ck_assert_msg(strstr(svg, want), "plot.svg's title is not %s's", names[k]);
        free(svg);
    }
}
END_TEST

static void assert_one_line(const char *err, const char *want);

// ./generate --lora follows the weights the adapter was trained on (its trainer_state.json): an adapter
// of --load_in_fp8 off runs unquantized unless --load_in_fp8 is given, and stderr says which and why;
// an adapter without the file gets the defaults, said; a recorded value it cannot use: one line
START_TEST(test_generate_follows_adapter) {
    setup();
    char dir[1200], cmd[4096], out[16384], err[4096];
    fresh_dir("unquantized", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "./train_grpo " QUIET " --eval_size 0 --max_steps 1 --per_device_train_batch_size 16 --load_in_fp8 off "
             "--output_dir %s", dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    const char *gen = "./generate --device cpu --prompt 1+2= --max_new_tokens 4 --lora";
    snprintf(cmd, sizeof cmd, "%s %s/checkpoint-1", gen, dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(err, "adapter: --load_in_fp8 off (as trained), --kv_cache_dtype auto (as trained), from ") &&
                      strstr(err, "\nlinear weights: off;"), "%s", err);
    snprintf(cmd, sizeof cmd, "%s %s/checkpoint-1 --load_in_fp8 block", gen, dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(err, "adapter: --load_in_fp8 block (given; trained on off)") && strstr(err, "\nlinear weights: block;"),
                  "%s", err);
    snprintf(cmd, sizeof cmd, "cp -r %s/checkpoint-1 %s/peft && rm %s/peft/trainer_state.json", dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s %s/peft", gen, dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(err, "records no training settings (no trainer_state.json): --load_in_fp8 block") &&
                      strstr(err, "\nlinear weights: block;"), "%s", err);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"load_in_fp8\":[[:space:]]*\"off\"/\"load_in_fp8\": \"int4\"/' %s/checkpoint-1/trainer_state.json", dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s %s/checkpoint-1", gen, dir);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    assert_one_line(err, "trainer_state.json: \"load_in_fp8\" is not one of block|row|tensor|off: fix the file, or give --load_in_fp8");
}
END_TEST

// GRPO fixes what the warm-up got wrong: held-out accuracy rises, the sampled reward does not fall
START_TEST(test_grpo_learns) {
    setup();
    char dir[1200], cmd[4096], err[2048];
    fresh_dir("learn", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "./train_grpo " QUIET " --max_steps 100 --eval_size 200 --eval_steps 0 --output_dir %s", dir);
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
    plot_as_readme_says(p);
    snprintf(p, sizeof p, "%s/checkpoint-100/adapter_config.json", dir);
    ck_assert(file_exists(p));
}
END_TEST

// --help: exit 0, every option by section with its default; defaults that --model changes show both
START_TEST(test_help_lists_defaults) {
    setup();
    char out[32768], err[2048];
    ck_assert_int_eq(run_out("./train_grpo --help", out, sizeof out, err, sizeof err), 0);
    const char *sections[] = {"\nmodel and data:\n", "\nFP8 (the frozen weights):\n", "\nGRPO (TRL's GRPOConfig names):\n",
                              "\noptimizer (AdamW on the LoRA weights):\n", "\nLoRA:\n", "\nsampling (the rollouts):\n",
                              "\nlogging and checkpoints:\n", "\nmemory:\n",
                              "\nPPO (--algo ppo; TRL's PPOConfig names; of the GRPO options, num_generations, max_completion_length and the reward options apply):\n"};
    for (int i = 0; i < 9; i++) ck_assert_msg(strstr(out, sections[i]), "no section '%s'", sections[i] + 1);
    // each option: its line, and "(default: ...)" before the next option (flags that default to off excepted)
    struct { const char *name, *dflt; } want[] = {
        {"model", "the built-in tiny model"}, {"output_dir", "a new out/run-N per run"},
        {"load_in_fp8", "block"}, {"learning_rate", "5e-4; 1e-5 with --model"}, {"max_steps", "150; 200 with --model"},
        {"max_completion_length", "8; 256 with --model"}, {"eval_size", "200; 100 with --model"},
        {"eval_steps", "25; 50 with --model"}, {"per_device_train_batch_size", "64"}, {"lora_r", "16"}, {"lora_alpha", "32"},
        {"temperature", "1"}, {"seed", "42"}, {"gpu_memory_utilization", "0.6"}, {"kv_cache_dtype", "auto"},
        {"save_total_limit", "none, every checkpoint is kept"},
        // the GRPO options, defaults from grpo_config_default() through grpo_config_get
        {"num_generations", "8"}, {"beta", "0"}, {"epsilon", "0.2"}, {"epsilon_high", "none"}, {"loss_type", "dapo"},
        {"scale_rewards", "group"}, {"importance_sampling_level", "token"}, {"num_iterations", "1"},
        {"mask_truncated_completions", "false"}, {"reward_weights", "none"}, {"vllm_importance_sampling_correction", "true"},
        {"reward_funcs", "correctness,format; none with --reward_cmd or --reward_model"}, {"reward_cmd", "none"}, {"reward_names", "cmd0,cmd1,..."},
        {"reward_timeout", "300"}, {"reward_model", "none"}, {"reward_model_fp8", "--load_in_fp8's"},
        {"vllm_importance_sampling_mode", "sequence_mask"}, {"vllm_importance_sampling_cap", "3"},
        // PPO's: TRL's PPOConfig defaults
        {"algo", "grpo"}, {"num_ppo_epochs", "4"}, {"num_mini_batches", "1"}, {"cliprange", "0.2"}, {"cliprange_value", "0.2"},
        {"vf_coef", "0.1"}, {"gamma", "1"}, {"lam", "0.95"}, {"kl_coef", "0.05"}, {"kl_estimator", "k1"}, {"missing_eos_penalty", "0"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char key[128], d[256];
        snprintf(key, sizeof key, "\n  --%s ", want[i].name);
        char *at = strstr(out, key);
        if (!at) snprintf(key, sizeof key, "\n  --%s\n", want[i].name), at = strstr(out, key);
        ck_assert_msg(at, "--help lacks --%s", want[i].name);
        char *next = strstr(at + 1, "\n  --");
        size_t len = next ? (size_t)(next - at) : strlen(at);
        char entry[1024];
        snprintf(entry, sizeof entry, "%.*s", (int)(len < sizeof entry ? len : sizeof entry - 1), at);
        for (char *c = entry; *c; c++)  // unwrap
            if (*c == '\n') *c = ' ';
        for (char *c = strstr(entry, "  "); c; c = strstr(entry, "  ")) memmove(c, c + 1, strlen(c));
        snprintf(d, sizeof d, "(default: %s)", want[i].dflt);
        ck_assert_msg(strstr(entry, d), "--%s: '%s' lacks '%s'", want[i].name, entry, d);
    }
    ck_assert_int_eq(run_out("./train_grpo --max_steps 0 -h", out, sizeof out, NULL, 0), 0);  // help first, wherever it is
    ck_assert(strstr(out, "usage: ./train_grpo"));
}
END_TEST

// '-' and '_' and --name=value spell the same options: two runs spelled differently train the same adapter
START_TEST(test_dash_underscore_same_run) {
    setup();
    char a[1200], b[1200], cmd[4096], err[2048];
    fresh_dir("under", a, sizeof a);
    fresh_dir("dash", b, sizeof b);
    snprintf(cmd, sizeof cmd,
             "./train_grpo --device cpu --quiet --eval_size 20 --max_steps 2 --lora_r 8 --learning_rate 1e-3 "
             "--num_generations 4 --per_device_train_batch_size 16 --output_dir %s", a);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd,
             "./train_grpo --device=cpu --quiet=true --eval-size 20 --max-steps=2 --lora-r 8 --learning-rate=1e-3 "
             "--num-generations 4 --per_device-train_batch-size=16 --output-dir %s", b);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    size_t na, nb;
    char *x = slurp(a, "checkpoint-2/adapter_model.safetensors", &na), *y = slurp(b, "checkpoint-2/adapter_model.safetensors", &nb);
    ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "the adapters differ");
    free(x);
    free(y);
    char *cfg = slurp(b, "checkpoint-2/adapter_config.json", NULL);  // the options took effect
    cJSON *j = cJSON_Parse(cfg);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(j, "r")->valueint, 8);
    cJSON_Delete(j);
    free(cfg);
    char *m = slurp(b, "metrics.jsonl", NULL);
    ck_assert_msg(strstr(m, "\"step\":2") && !strstr(m, "\"step\":3"), "%s", m);
    free(m);
}
END_TEST

// a bad output directory fails at once, before the warm-up (an empty cache: none to load); a run that
// fails on its inputs leaves no directory behind
START_TEST(test_output_dir_checked_first) {
    setup();
    char dir[1200], cmd[4096], err[2048], here[1024];
    ck_assert(getcwd(here, sizeof here));
    fresh_dir("badout", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "echo x > %s/file", dir);
    ck_assert_int_eq(system(cmd), 0);
    struct { const char *args, *msg; } cases[] = {
        {"--output_dir file", "output directory file exists and is not a directory"},
        {"--output_dir file/sub", "cannot create directory file/sub"},
        {"--overwrite_output_dir", "--overwrite_output_dir needs --output_dir"},
        {"--resume", "--resume: no out/run-N holds a checkpoint"},
        // a run that fails on its inputs after its directory was made: the directory goes again
        {"--model /nonexistent/m", "/nonexistent/m is not a directory"},
        {"--model /nonexistent/m --output_dir new/sub", "/nonexistent/m is not a directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd %s && XDG_CACHE_HOME=%s/cache %s/train_grpo --device cpu %s", dir, dir, here, cases[i].args);
        int rc = run(cmd, err, sizeof err);
        ck_assert_msg(rc != 0 && strstr(err, cases[i].msg), "'%s': rc %d, stderr '%s'", cases[i].args, rc, err);
        ck_assert_msg(strncmp(err, "error: ", 7) == 0 && strchr(err, '\n') == err + strlen(err) - 1, "not one line: %s", err);
        // nothing made: no warm-up (so the check came before that work: no cache/), no out/, no new/
        snprintf(cmd, sizeof cmd, "ls -A %s | grep -v -x -e file", dir);
        ck_assert_msg(run_out(cmd, err, sizeof err, NULL, 0) != 0, "'%s' left behind: %s", cases[i].args, err);
    }
}
END_TEST

// the warm-up checkpoint's tokenizer.json reads back as the built-in byte-level vocabulary, and its
// tokenizer_config.json says what the model is: no chat template, one end token (256, the one the
// warm-up taught), so that ./train_sft and ./generate on it write and stop as the model does
START_TEST(test_warmup_tokenizer_json) {
    setup();
    char dir[1400];
    warm_cached(dir, sizeof dir);
    Tokenizer *a = tokenizer_byte_level(), *b = tokenizer_load_dir(dir);
    ck_assert_int_eq(tokenizer_vocab_size(a), tokenizer_vocab_size(b));
    ck_assert_str_eq(tokenizer_chat_format(b), "none");
    int nb;
    const int *eb = tokenizer_eos_ids(b, &nb);
    ck_assert_int_eq(nb, 1);
    ck_assert_int_eq(eb[0], 256);
    ck_assert_int_eq(sft_eos_id(b, 0), 256);
    const char *texts[] = {"17+25=", "42", " 3*5+7 ", "Hello, world!\n\tTabs and  spaces  ", "<|im_start|>user\nhi<|im_end|>",
                           "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82", "bad utf-8: \xff\xfe\xc3", "<|endoftext|>x<|endoftext|>",
                           "'s 're \\ \" {}"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int *ia, *ib, n = tokenizer_encode(a, texts[i], &ia), m = tokenizer_encode(b, texts[i], &ib);
        ck_assert_msg(n == m && memcmp(ia, ib, n * sizeof(int)) == 0, "'%s': the ids differ", texts[i]);
        char *da = tokenizer_decode(a, ia, n), *db = tokenizer_decode(b, ib, m);
        ck_assert_msg(!strcmp(da, db), "'%s': decoded '%s' vs '%s'", texts[i], da, db);
        free(ia), free(ib), free(da), free(db);
    }
    int all[259];
    for (int i = 0; i < 259; i++) all[i] = i;
    size_t la, lb;  // every id, NUL and invalid UTF-8 included
    char *da = tokenizer_decode_ex(a, all, 259, 0, &la), *db = tokenizer_decode_ex(b, all, 259, 0, &lb);
    ck_assert(la == lb && memcmp(da, db, la) == 0);
    free(da), free(db);
    tokenizer_free(a);
    tokenizer_free(b);
}
END_TEST

// the value of "key: " on its line of text (into out), or 0 when absent
static int line_after(const char *text, const char *key, char *out, size_t cap) {
    const char *at = strstr(text, key);
    if (!at) return 0;
    at += strlen(key);
    snprintf(out, cap, "%.*s", (int)strcspn(at, "\n"), at);
    return 1;
}

// The default command without --output_dir, twice (out/run-1, out/run-2, the warm-up shared
// from the cache), --resume continuing the newest run that has a checkpoint, and the
// ./generate command a run prints: it runs, and prints the completion's text (the decode of
// its --print_ids ids). The warm-up is the cache's wherever the run writes: a new --output_dir from
// another working directory loads it too, and no output directory holds one.
START_TEST(test_default_runs_and_generate) {
    setup();
    char dir[1200], cmd[8192], out[16384], err[4096], here[1024], line[4096], name[1400];
    ck_assert(getcwd(here, sizeof here));
    snprintf(dir, sizeof dir, "%s/default", base_dir);
    warm_cached(name, sizeof name);  // <cache>/fp8-grpo/warmup-<key>
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/elsewhere", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "cd %s/elsewhere && %s/train_grpo " EASY " --max_steps 1 --output_dir new", dir, here);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    char want[1500];
    snprintf(want, sizeof want, "warm-up loaded from %s\n", name);
    ck_assert_msg(strstr(out, want) && !strstr(out, "supervised warm-up"), "a new --output_dir did not reuse the warm-up: %s", out);
    snprintf(cmd, sizeof cmd, "ls -A %s/elsewhere/new | grep -v -x -e checkpoint-1 -e metrics.jsonl -e plot.svg -e .lock", dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, NULL, 0) != 0, "the output directory holds more: %s", out);
    for (int r = 1; r <= 2; r++) {
        snprintf(cmd, sizeof cmd, "cd %s && %s/train_grpo " EASY " --max_steps 1", dir, here);
        ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "run %d: %s", r, err);
        snprintf(want, sizeof want, "output: out/run-%d (a new out/run-N", r);
        ck_assert_msg(strstr(out, want), "run %d: %s", r, out);
        snprintf(want, sizeof want, "warm-up loaded from %s", name);
        ck_assert_msg(strstr(out, want), "run %d did not reuse the warm-up: %s", r, out);
        snprintf(cmd, sizeof cmd, "%s/out/run-%d/checkpoint-1/adapter_model.safetensors", dir, r);
        ck_assert(file_exists(cmd));
    }
    // the ready-to-copy generate command, with the real paths, and below it why that problem
    ck_assert_msg(line_after(out, "try it: ", line, sizeof line), "%s", out);
    char why[4096], answer[64] = "";
    ck_assert_msg(line_after(out, "        (a held-out problem", why, sizeof why), "%s", out);
    const char *a = strstr(why, "its answer: ");
    ck_assert_msg(a, "%s", why);
    snprintf(answer, sizeof answer, "%.*s", (int)strcspn(a + 12, ")"), a + 12);
    snprintf(cmd, sizeof cmd, "%s/generate --model %s --lora out/run-2/checkpoint-1 --max_new_tokens 8 --prompt '", here, name);
    ck_assert_msg(!strncmp(line, cmd, strlen(cmd)), "'%s'", line);
    snprintf(cmd, sizeof cmd, "cd %s && %s", dir, line);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s: %s", line, err);
    char text[16384];
    memcpy(text, out, sizeof text);
    ck_assert_msg(strchr(text, '\n') == text + strlen(text) - 1 && strlen(text) > 1, "stdout '%s'", text);
    ck_assert_msg(strstr(err, "backend: ") && !strstr(text, "backend"), "diagnostics not on stderr: '%s'", err);
    if (strstr(why, "the adapter answers")) ck_assert_msg(strstr(text, answer), "'%s' answered '%s', not %s", line, text, answer);
    // the text is the decode of the ids --print_ids gives (EOS not shown)
    snprintf(cmd, sizeof cmd, "cd %s && %s --print_ids", dir, line);
    ck_assert_int_eq(run_out(cmd, out, sizeof out, NULL, 0), 0);
    int ids[64], n = 0;
    for (char *p = out, *end; n < 64; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ids[n++] = (int)v;
    }
    ck_assert_int_gt(n, 0);
    Tokenizer *tok = tokenizer_byte_level();
    if (n > 0 && tokenizer_is_eos(tok, ids[n - 1])) n--;
    char *decoded = tokenizer_decode(tok, ids, n);
    text[strlen(text) - 1] = 0;
    ck_assert_msg(!strcmp(text, decoded), "text '%s', ids decode to '%s'", text, decoded);
    printf("generate: '%s' -> '%s'\n", strstr(line, "--prompt"), text);
    free(decoded);
    tokenizer_free(tok);
    // --resume without --output_dir continues the newest run with a checkpoint, out/run-2 (not
    // out/run-3, a run stopped before its first checkpoint)
    snprintf(cmd, sizeof cmd, "mkdir %s/out/run-3 && cd %s && %s/train_grpo " EASY " --max_steps 2 --resume", dir, dir, here);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(out, "output: out/run-2 (the newest out/run-N with a checkpoint)") && strstr(out, "resumed from out/run-2/checkpoint-1"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s/out/run-2/checkpoint-2/adapter_model.safetensors", dir);
    ck_assert(file_exists(cmd));
    snprintf(cmd, sizeof cmd, "%s/out/run-1/checkpoint-2", dir);
    ck_assert(!path_exists(cmd));
    snprintf(cmd, sizeof cmd, "%s/out/run-3/checkpoint-2", dir);
    ck_assert(!path_exists(cmd));
}
END_TEST

// A tokenizer.json whose ids do not fit the checkpoint's vocab_size: one line at load, before the
// weights, the task's data or any step
START_TEST(test_tokenizer_checkpoint_disagree) {
    setup();
    char dir[1200], model[1300], data[1300], cmd[3 * PATH_MAX + 4096], err[2048], rel[1024], q[PATH_MAX], t[1024];
    fresh_dir("tokmismatch", dir, sizeof dir);
    snprintf(model, sizeof model, "%s/model", dir);
    fixture_path(rel, sizeof rel, "qwen3");
    ck_assert(realpath(rel, q));  // the links' targets absolute (FIXTURES is absolute in make test SAN=1)
    fixture_path(t, sizeof t, "tokenizer/gpt2/tokenizer.json");
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    const char *text = "{\"prompt\": \"1+1?\", \"answer\": \"2\"}\n";
    write_file_atomic(data, text, strlen(text));
    snprintf(cmd, sizeof cmd, "mkdir %s && ln -s %s/config.json %s/model.safetensors %s/ && cp %s %s/", model, q, q, model, t,
             model);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "./train_grpo --device cpu --model %s --data %s --output_dir %s/out", model, data, dir);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "tokenizer.json has ids up to 606 but config.json's vocab_size is 320: the tokenizer and the "
                              "checkpoint disagree (use the tokenizer.json saved with this checkpoint)") &&
                      !strncmp(err, "error: ", 7) && strchr(err, '\n') == err + strlen(err) - 1,
                  "stderr '%s'", err);
}
END_TEST

// --data with --eval_data: the data line says what trains and what is held out, and that a prompt of
// the evaluation file is in the training file too; --heldout_frac 0 holds none out, said so at the end
START_TEST(test_data_and_eval_files) {
    setup();
    char dir[1200], model[1400], data[1300], eval[1300], cmd[8192], out[16384], err[2048];
    fresh_dir("evalfile", dir, sizeof dir);
    warm_cached(model, sizeof model);  // the built-in model as a checkpoint (its tokenizer: a byte a token)
    snprintf(data, sizeof data, "%s/d.jsonl", dir);
    snprintf(eval, sizeof eval, "%s/e.jsonl", dir);
    const char *d = "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n{\"prompt\": \"2+2=\", \"answer\": 4}\n"
                    "{\"prompt\": \"13+5=\", \"answer\": \"18\"}\n";
    const char *e = "{\"prompt\": \"3+4=\", \"answer\": \"7\"}\n{\"prompt\": \"2+2=\", \"answer\": \"4\"}\n";
    write_file_atomic(data, d, strlen(d));
    write_file_atomic(eval, e, strlen(e));
    const char *small = "--device cpu --quiet --max_steps 1 --per_device_train_batch_size 4 --num_generations 4 "
                        "--max_completion_length 4 --eval_size 2";
    snprintf(cmd, sizeof cmd, "./train_grpo %s --model %s --data %s --eval_data %s --output_dir %s/a", small, model, data, eval, dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    char want[4096];
    snprintf(want, sizeof want, "data: %s: 3 training and 2 held-out problems (held out: those of %s); prompts 4-5 tokens "
             "(mean 4.2), answers 1-2 characters (mean 1.2)", data, eval);
    ck_assert_msg(strstr(out, want), "stdout lacks '%s':\n%s", want, out);
    snprintf(want, sizeof want, "note: 1 of the 2 problems of %s are in %s too", eval, data);
    ck_assert_msg(strstr(out, want), "stdout lacks '%s':\n%s", want, out);
    ck_assert_msg(strstr(out, "held-out accuracy before GRPO: ") && strstr(out, "(2 held-out problems, greedy)"), "%s", out);
    snprintf(cmd, sizeof cmd, "./train_grpo %s --model %s --data %s --heldout_frac 0 --output_dir %s/b", small, model, data, dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    snprintf(want, sizeof want, "data: %s: 3 training and 0 held-out problems (held out: --heldout_frac 0 of the problems", data);
    ck_assert_msg(strstr(out, want), "stdout lacks '%s':\n%s", want, out);
    ck_assert_msg(strstr(out, "not measured (no held-out problems)"), "%s", out);
}
END_TEST

// the metrics.jsonl value of key at step (NAN when absent)
static double metric_at(const char *dir, int step, const char *key) {
    char *m = slurp(dir, "metrics.jsonl", NULL), *save = NULL;
    double v = NAN;
    for (char *line = strtok_r(m, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line), *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *x = cJSON_GetObjectItemCaseSensitive(j, key);
        if (cJSON_IsNumber(s) && s->valueint == step && cJSON_IsNumber(x)) v = x->valuedouble;
        cJSON_Delete(j);
    }
    free(m);
    return v;
}

// --resume of a run that reached --max_steps: nothing to train; it says so, reports the accuracy
// before and after from metrics.jsonl (never "nan"), exits 0 and leaves the run as it was. Also
// with a smaller --max_steps than the checkpoint's step.
START_TEST(test_resume_finished_run) {
    setup();
    char dir[1200], cmd[4096], out[16384], err[2048], want[256];
    fresh_dir("finished", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 2 --output_dir %s", dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    size_t n0, m0;
    char *ckpt = slurp(dir, "checkpoint-2/adapter_model.safetensors", &n0), *metrics = slurp(dir, "metrics.jsonl", &m0);
    double before = metric_at(dir, 0, "eval/accuracy"), after = metric_at(dir, 2, "eval/accuracy");
    ck_assert(isfinite(before) && isfinite(after));
    snprintf(want, sizeof want, "held-out accuracy: %.3f before GRPO -> %.3f after 2 steps\n", before, after);
    for (int max_steps = 2; max_steps >= 1; max_steps--) {
        snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps %d --resume --output_dir %s", max_steps, dir);
        ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
        char said[128];
        snprintf(said, sizeof said, "checkpoint-2 is at --max_steps %d: nothing left to do", max_steps);
        ck_assert_msg(strstr(out, said) && strstr(out, want) && !strstr(out, "nan") && !strstr(out, "step    1/"),
                      "--max_steps %d: stdout '%s', want '%s'", max_steps, out, want);
        ck_assert_msg(strstr(out, "adapter: ") && strstr(out, "/checkpoint-2 (PEFT format)") && strstr(out, "--lora ") &&
                          strstr(out, "/checkpoint-2 "),
                      "%s", out);
        size_t n1, m1;
        char *c1 = slurp(dir, "checkpoint-2/adapter_model.safetensors", &n1), *mm = slurp(dir, "metrics.jsonl", &m1);
        ck_assert(n1 == n0 && !memcmp(c1, ckpt, n0) && m1 == m0 && !memcmp(mm, metrics, m0));
        free(c1);
        free(mm);
    }
    free(ckpt);
    free(metrics);
}
END_TEST

// TRL's save_total_limit: the newest N checkpoints are kept, the older deleted once the new one is
// complete, nothing half-deleted left behind; a resumed run never deletes the checkpoint it
// continued from. Without the option every checkpoint stays (the other tests).
START_TEST(test_save_total_limit) {
    setup();
    char dir[1200], cmd[4096], out[16384], err[2048], p[1400];
    fresh_dir("limit", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "./train_grpo --device cpu --eval_size 20 --max_steps 4 --save_steps 1 --save_total_limit 2 --output_dir %s",
             dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    int kept[] = {0, 0, 0, 1, 1, 0, 0};
    for (int k = 1; k <= 6; k++) {
        snprintf(p, sizeof p, "%s/checkpoint-%d", dir, k);
        ck_assert_msg(path_exists(p) == kept[k], "checkpoint-%d %s", k, kept[k] ? "deleted" : "kept");
    }
    ck_assert_msg(strstr(out, "/checkpoint-1 (--save_total_limit 2)") && strstr(out, "/checkpoint-2 (--save_total_limit 2)"),
                  "%s", out);
    // resumed from checkpoint-4 with a limit of 1: checkpoint-4 stays, each newer one replaces the last
    snprintf(cmd, sizeof cmd,
             "./train_grpo --device cpu --eval_size 20 --max_steps 6 --save_steps 1 --save_total_limit 1 --resume --output_dir %s", dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    int kept2[] = {0, 0, 0, 0, 1, 0, 1};
    for (int k = 1; k <= 6; k++) {
        snprintf(p, sizeof p, "%s/checkpoint-%d", dir, k);
        ck_assert_msg(path_exists(p) == kept2[k], "after the resume: checkpoint-%d %s", k, kept2[k] ? "deleted" : "kept");
    }
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -v -x -e checkpoint-4 -e checkpoint-6 -e metrics.jsonl -e plot.svg -e .lock", dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, NULL, 0) != 0, "left behind: %s", out);
    // and the last one is whole: the adapter loads
    char warm[1400];
    warm_cached(warm, sizeof warm);
    snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s --lora %s/checkpoint-6 --prompt '1+2=' --max_new_tokens 4", warm, dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
}
END_TEST

// stderr ends in one line "error: ..." naming want (after the backend's line, where one was chosen)
static void assert_one_line(const char *err, const char *want) {
    const char *e = strstr(err, "error: ");
    ck_assert_msg(e && (e == err || e[-1] == '\n') && strstr(e, want) && strchr(e, '\n') == e + strlen(e) - 1,
                  "stderr '%s', want one line with '%s'", err, want);
}

// the number of warm-up caches in dir
static int count_warmups(const char *dir) {
    char pat[1400];
    snprintf(pat, sizeof pat, "%s/warmup-*", dir);
    glob_t g;
    int n = glob(pat, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    globfree(&g);
    return n;
}

// The built-in model's warm-up is cached per setting, never replaced by another; an adapter records
// the base it was trained on (its weights' fingerprint), and ./generate, ./export and --resume refuse
// another base with one line naming both (--allow_other_base: generate and export go on, warned); a
// resume with other settings stops before any work (no warm-up made for it); a cache that holds other
// settings than its name says is refused, not replaced. Here in a cache of its own, dir/cache.
START_TEST(test_warmups_and_bases) {
    setup();
    char dir[1200], cmd[8192], out[16384], err[4096], here[1024], a[1600], b[1600], outdir[1024], shared[1400];
    ck_assert(getcwd(here, sizeof here));
    snprintf(dir, sizeof dir, "%s/bases", base_dir);
    warm_cached(a, sizeof a);
    snprintf(shared, sizeof shared, "%s", getenv("XDG_CACHE_HOME"));
    use_cache_in(dir);
    snprintf(outdir, sizeof outdir, "%s", warm_cache());
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp -r %s %s/", dir, outdir, a, outdir);
    ck_assert_int_eq(system(cmd), 0);
    char name[256];
    snprintf(name, sizeof name, "%s", strrchr(a, '/') + 1);
    snprintf(a, sizeof a, "%s/%s", outdir, name);  // warm-up A, in the cache
    // run-1 on the shared warm-up A; run-2 with another seed and warm-up length makes a warm-up B of its own
    size_t n0, n1;
    char *before = slurp(a, "model.safetensors", &n0);
    snprintf(cmd, sizeof cmd, "cd %s && %s/train_grpo " EASY " --max_steps 1", dir, here);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "cd %s && %s/train_grpo " EASY " --max_steps 1 --seed 7 --warmup_sft_steps 20", dir, here);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(count_warmups(outdir), 2);
    char *after = slurp(a, "model.safetensors", &n1);
    ck_assert_msg(n0 == n1 && !memcmp(before, after, n0), "warm-up A was replaced");
    free(before), free(after);
    snprintf(cmd, sizeof cmd, "ls -d %s/warmup-* | grep -v -x %s", outdir, a);
    ck_assert_int_eq(run_out(cmd, b, sizeof b, NULL, 0), 0);
    b[strcspn(b, "\n")] = 0;  // warm-up B
    // run-1's adapter: on its own base it runs; on B refused, naming both; forced, a warning
    const char *gen = "--device cpu --lora out/run-1/checkpoint-1 --prompt 1+2= --max_new_tokens 4";
    snprintf(cmd, sizeof cmd, "cd %s && %s/generate --model %s %s", dir, here, a, gen);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    char out_a[256], out_none[256];  // without --model: the base adapter_config.json names, A
    snprintf(cmd, sizeof cmd, "cd %s && %s/generate --model %s %s", dir, here, a, gen);
    ck_assert_int_eq(run_out(cmd, out_a, sizeof out_a, NULL, 0), 0);
    snprintf(cmd, sizeof cmd, "cd %s && %s/generate %s", dir, here, gen);
    ck_assert_msg(run_out(cmd, out_none, sizeof out_none, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out_a, out_none);
    snprintf(cmd, sizeof cmd, "cd %s && %s/generate --model %s %s", dir, here, b, gen);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    assert_one_line(err, "out/run-1/checkpoint-1 was trained on another base");
    ck_assert_msg(strstr(err, name) && strstr(err, b) && strstr(err, "--allow_other_base"), "%s", err);
    snprintf(cmd, sizeof cmd, "cd %s && %s/generate --model %s %s --allow_other_base", dir, here, b, gen);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0 && strstr(err, "warning: ") && strstr(err, "applied anyway"),
                  "%s", err);
    snprintf(cmd, sizeof cmd, "cd %s && %s/export --model %s --lora out/run-1/checkpoint-1 --output_dir merged", dir, here, b);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    assert_one_line(err, "was trained on another base");
    snprintf(cmd, sizeof cmd, "%s/merged", dir);
    ck_assert(!path_exists(cmd));
    // a resume (of run-2, the newest) with other settings: stopped before any work, naming what differs
    snprintf(cmd, sizeof cmd, "cd %s && %s/train_grpo " EASY " --max_steps 2 --resume --seed 9 --warmup_sft_steps 30", dir, here);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    assert_one_line(err, "was made with other settings than this run");
    ck_assert_msg(strstr(err, "seed 7 there, 9 here") && strstr(err, "\"steps\":20") && strstr(err, "\"steps\":30"), "%s", err);
    ck_assert_int_eq(count_warmups(outdir), 2);
    // its base replaced under the same path (B's weights now A's): refused by the fingerprint
    snprintf(cmd, sizeof cmd, "cp %s/model.safetensors %s/b.safetensors && cp %s/model.safetensors %s/", b, dir, a, b);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "cd %s && %s/train_grpo " EASY " --max_steps 2 --resume --seed 7 --warmup_sft_steps 20", dir, here);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    assert_one_line(err, "base_model_fingerprint");
    snprintf(cmd, sizeof cmd, "mv %s/b.safetensors %s/model.safetensors", dir, b);
    ck_assert_int_eq(system(cmd), 0);
    // a cache whose warmup.json is not what its name says: refused, left as it is
    snprintf(cmd, sizeof cmd, "%s/warmup.json", b);
    write_file_atomic(cmd, "{}", 2);
    snprintf(cmd, sizeof cmd, "cd %s && %s/train_grpo " EASY " --max_steps 1 --seed 7 --warmup_sft_steps 20", dir, here);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    assert_one_line(err, "holds another warm-up");
    char *w = slurp(b, "warmup.json", NULL);
    ck_assert_str_eq(w, "{}");
    free(w);
    // two runs that need a warm-up not made yet, started at once: one makes it, the other waits for it
    // and loads it (the cache's lock), whichever comes first
    snprintf(cmd, sizeof cmd, "cd %s && for k in 1 2; do %s/train_grpo " EASY " --max_steps 1 --seed 11 --warmup_sft_steps 5 "
             "--output_dir two-$k >two-$k.txt 2>&1 & done; wait", dir, here);
    ck_assert_int_eq(system(cmd), 0);
    int made = 0, loaded = 0;
    for (int k = 1; k <= 2; k++) {
        char log[32];
        snprintf(log, sizeof log, "two-%d.txt", k);
        char *t = slurp(dir, log, NULL);
        ck_assert_msg(strstr(t, "/checkpoint-1 (PEFT format)"), "run %d: %s", k, t);
        made += strstr(t, "supervised warm-up on") != NULL, loaded += strstr(t, "warm-up loaded from") != NULL;
        free(t);
    }
    ck_assert_msg(made == 1 && loaded == 1, "%d runs made the warm-up, %d loaded it", made, loaded);
    ck_assert_int_eq(count_warmups(outdir), 3);
    ck_assert(setenv("XDG_CACHE_HOME", shared, 1) == 0);
}
END_TEST

// --overwrite_output_dir: nothing of the earlier run is left to resume or to read beside the new
// one's metrics; a start-over that fails on its inputs leaves the earlier run as it was
START_TEST(test_overwrite_output_dir) {
    setup();
    char dir[1200], cmd[4096], out[16384], err[2048], p[1400];
    fresh_dir("over", dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 3 --save_steps 1 --output_dir %s", dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 1 --overwrite_output_dir --model %s/none --output_dir %s", dir, dir);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/checkpoint-3", dir);
    ck_assert_msg(path_exists(p) && metric_at(dir, 3, "loss") == metric_at(dir, 3, "loss"), "the earlier run was touched");
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 1 --overwrite_output_dir --output_dir %s", dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -v -x -e checkpoint-1 -e metrics.jsonl -e plot.svg -e .lock", dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, NULL, 0) != 0, "left of the earlier run: %s", out);
    ck_assert(isnan(metric_at(dir, 2, "loss")) && isnan(metric_at(dir, 3, "loss")) && !isnan(metric_at(dir, 1, "loss")));
    // a resume continues the new run
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 2 --resume --output_dir %s", dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    snprintf(p, sizeof p, "resumed from %s/checkpoint-1", dir);
    ck_assert_msg(strstr(out, p), "%s", out);
    ck_assert(!isnan(metric_at(dir, 2, "loss")) && isnan(metric_at(dir, 3, "loss")));
}
END_TEST

// One run at a time in an output directory: a second stops at once, naming the first's pid; the lock
// goes with the process that held it, however that ends (here: SIGKILL)
START_TEST(test_output_dir_locked) {
    setup();
    char dir[1200], cmd[4096], err[2048], want[128];
    fresh_dir("locked", dir, sizeof dir);
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    if (pid == 0) {  // a run that holds the directory
        run_dir_claim(dir, 0, 0);
        if (write(ready[1], "x", 1) != 1) _exit(1);
        for (;;) pause();
    }
    char c;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 1 --output_dir %s", dir);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    snprintf(want, sizeof want, "is in use by another run (pid %d)", (int)pid);
    assert_one_line(err, want);
    char warm[1400], data[1300];  // (train_sft reads its inputs first: good ones, to reach the lock)
    warm_cached(warm, sizeof warm);
    snprintf(data, sizeof data, "%s/locked.jsonl", base_dir);
    const char *example = "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n";
    write_file_atomic(data, example, strlen(example));
    snprintf(cmd, sizeof cmd, "./train_sft --device cpu --model %s --data %s --output_dir %s", warm, data, dir);
    ck_assert_int_ne(run(cmd, err, sizeof err), 0);
    assert_one_line(err, want);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(ready[0]), close(ready[1]);
    snprintf(cmd, sizeof cmd, "./train_grpo " EASY " --max_steps 1 --output_dir %s", dir);
    ck_assert_msg(run(cmd, err, sizeof err) == 0, "after the holder was killed: %s", err);
}
END_TEST

// Gemma 3 as published: ./train_grpo and ./train_sft run on the multimodal fixture (test/fixtures/gemma3_mm:
// Gemma3ForConditionalGeneration, vocabulary 320, with the built-in model's tokenizer of a byte a token beside
// it), and the model line says the vision tower is not read. GRPO's adapter is one PEFT resolves on the
// multimodal model (its names under model.language_model., target_modules over the language model only); SFT's
// full fine-tune is the whole checkpoint again (the vision tower and projector as the base holds them).
static void assert_mm_adapter(const char *ckpt) {
    char p[1500];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", ckpt);
    SafeTensors st;
    st_open(&st, p);
    ck_assert_int_gt(st.n, 0);
    for (int i = 0; i < st.n; i++)
        ck_assert_msg(!strncmp(st.t[i].name, "base_model.model.model.language_model.layers.", 45), "%s", st.t[i].name);
    st_close(&st);
    snprintf(p, sizeof p, "%s/adapter_config.json", ckpt);
    char *text = read_file(p, NULL);
    ck_assert_msg(strstr(text, "\"target_modules\":\t\".*language_model.*\\\\.("), "%s", text);
    free(text);
}
START_TEST(test_gemma3_multimodal_trains) {
    setup();
    char dir[1200], model[1300], data[1300], rel[1024], q[PATH_MAX], warm[1400], cmd[3 * PATH_MAX + 4096], out[16384],
        err[4096], ck[1400];
    fresh_dir("gemma3_mm", dir, sizeof dir);
    warm_cached(warm, sizeof warm);
    snprintf(model, sizeof model, "%s/model", dir);
    fixture_path(rel, sizeof rel, "gemma3_mm");
    ck_assert(realpath(rel, q));
    snprintf(cmd, sizeof cmd, "mkdir %s && ln -s %s/config.json %s/model.safetensors %s/ && cp %s/tokenizer.json %s/tokenizer_config.json %s/",
             model, q, q, model, warm, warm, model);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    const char *text = "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n{\"prompt\": \"2+3=\", \"answer\": \"5\"}\n";
    write_file_atomic(data, text, strlen(text));
    snprintf(cmd, sizeof cmd, "./train_grpo --device cpu --quiet --model %s --data %s --heldout_frac 0 --max_steps 2 "
             "--per_device_train_batch_size 4 --num_generations 4 --max_completion_length 4 --save_steps 2 --output_dir %s/grpo",
             model, data, dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(out, "the text model of a multimodal gemma3 (its vision tower and projector are not read: text only)"),
                  "%s", out);
    ck_assert_msg(!strstr(err, "warning"), "%s", err);
    snprintf(ck, sizeof ck, "%s/grpo/checkpoint-2", dir);
    assert_mm_adapter(ck);
    snprintf(data, sizeof data, "%s/sft.jsonl", dir);
    text = "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n{\"prompt\": \"2+3=\", \"completion\": \"5\"}\n";
    write_file_atomic(data, text, strlen(text));
    snprintf(cmd, sizeof cmd, "./train_sft --device cpu --quiet --model %s --data %s --max_steps 2 --save_steps 2 "
             "--per_device_train_batch_size 2 --output_dir %s/sft", model, data, dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    snprintf(ck, sizeof ck, "%s/sft/checkpoint-2", dir);
    ck_assert_int_eq(assert_whole_checkpoint(model, ck), 34);
    snprintf(cmd, sizeof cmd, "%s/config.json", ck);
    char *cfg = read_file(cmd, NULL);
    ck_assert_msg(strstr(cfg, "\"Gemma3ForConditionalGeneration\"") && strstr(cfg, "\"vision_config\""), "%s", cfg);
    free(cfg);
}
END_TEST

// ./generate --tokenize: the ids on stdout (a file here), an empty prompt none, exit 0; a config.json
// with fewer layers than its checkpoint names the tensors it leaves unused
START_TEST(test_generate_tokenize_and_unused_tensors) {
    setup();
    char warm[1400], cmd[8192], out[4096], err[4096], dir[1300];
    warm_cached(warm, sizeof warm);
    snprintf(cmd, sizeof cmd, "./generate --model %s --tokenize --prompt ''", warm);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out, "\n");
    snprintf(cmd, sizeof cmd, "./generate --model %s --tokenize --prompt '17+25='", warm);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out, "49 55 43 50 53 61\n");  // a byte a token
    snprintf(dir, sizeof dir, "%s/fewer_layers", base_dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && sed -i 's/\"num_hidden_layers\":[[:space:]]*4/\"num_hidden_layers\": 2/' %s/config.json",
             dir, warm, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s --tokens '1 2' --max_new_tokens 1", dir);
    ck_assert_msg(run_out(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(err, "warning: ") && strstr(err, ": 22 tensors of the checkpoint are not used by the model config.json "
                                                      "describes (model.layers.2.input_layernorm.weight"),
                  "%s", err);
}
END_TEST

static Suite *train_suite(void) {
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_help_lists_defaults);
    tcase_add_test(tc, test_bad_options);
    tcase_add_test(tc, test_output_dir_checked_first);
    tcase_add_test(tc, test_warmup_tokenizer_json);
    tcase_add_test(tc, test_dash_underscore_same_run);
    tcase_add_test(tc, test_default_runs_and_generate);
    tcase_add_test(tc, test_bad_jsonl);
    tcase_add_test(tc, test_data_and_eval_files);
    tcase_add_test(tc, test_checkpoint_never_overwritten);
    tcase_add_test(tc, test_resume_bit_exact);
    tcase_add_test(tc, test_ppo_resume_bit_exact);
    tcase_add_test(tc, test_header_names_the_algorithm);
    tcase_add_test(tc, test_generate_follows_adapter);
    tcase_add_test(tc, test_memory_options);
    tcase_add_test(tc, test_full_weight_grpo);
    tcase_add_test(tc, test_grpo_learns);
    tcase_add_test(tc, test_tokenizer_checkpoint_disagree);
    tcase_add_test(tc, test_resume_finished_run);
    tcase_add_test(tc, test_save_total_limit);
    tcase_add_test(tc, test_warmups_and_bases);
    tcase_add_test(tc, test_overwrite_output_dir);
    tcase_add_test(tc, test_output_dir_locked);
    tcase_add_test(tc, test_generate_tokenize_and_unused_tensors);
    // its own case: CK_RUN_CASE=gemma3_mm runs it alone
    TCase *mm = tcase_create("gemma3_mm");
    tcase_set_timeout(mm, 900);
    tcase_add_test(mm, test_gemma3_multimodal_trains);
    suite_add_tcase(s, tc);
    suite_add_tcase(s, mm);
    return s;
}

int main(void) {
    // one process: the warm-up made by the first test is reused by the others
    setenv("CK_FORK", "no", 1);
    return run_suite(train_suite());
}
