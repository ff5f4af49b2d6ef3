// test/test_reward_model.c: reward models (--reward_model, train/reward_model.h) on the CPU backend.
// The two fixtures of dev/make_reward_model_fixture.py (a LlamaForSequenceClassification with the Llama 3
// tokenizer, a Qwen3ForSequenceClassification with the Qwen2 tokenizer's ChatML) score text and
// conversational prompt + completion pairs within 1e-5 of transformers, with the same ids; in micro-batches
// lent the policy's arena as well; each bad checkpoint is one line; ./train_grpo runs GRPO and PPO with one,
// logs its reward under its name (the scores of the run's own completions), weighs it beside a built-in
// reward, and refuses another on --resume.
#include <check.h>
#include <limits.h>
#include <cjson/cJSON.h>
#include <sys/wait.h>
#include <unistd.h>

#define TMP_TEMPLATE "/tmp/fp8grpo_rmXXXXXX"
#include "testutil.h"
#include "progutil.h"
#include "train/memory_fit.h"
#include "train/reward_model.h"

// the cases of a fixture as Examples and completions; their ids and scores
typedef struct {
    int n;
    Example ex[16];
    char *completion[16];
    int *ids[16], nids[16];
    double score[16];
    cJSON *root;
} Cases;

static void cases_read(Cases *c, const char *name) {
    char rel[256], p[1200];
    snprintf(rel, sizeof rel, "reward_model/%s/cases.json", name);
    fixture_path(p, sizeof p, rel);
    char *text = read_file(p, NULL);
    memset(c, 0, sizeof *c);
    c->root = cJSON_Parse(text);
    free(text);
    ck_assert(cJSON_IsArray(c->root));
    cJSON *it;
    cJSON_ArrayForEach(it, c->root) {
        int k = c->n++;
        ck_assert(k < 16);
        cJSON *sys = cJSON_GetObjectItem(it, "system"), *ids = cJSON_GetObjectItem(it, "ids");
        c->ex[k].prompt = cJSON_GetObjectItem(it, "prompt")->valuestring;
        c->ex[k].system = cJSON_IsString(sys) ? sys->valuestring : NULL;
        c->ex[k].messages = cJSON_IsTrue(cJSON_GetObjectItem(it, "messages")) ? "[]" : NULL;  // (only its presence is read)
        c->completion[k] = cJSON_GetObjectItem(it, "completion")->valuestring;
        c->score[k] = cJSON_GetObjectItem(it, "score")->valuedouble;
        c->nids[k] = cJSON_GetArraySize(ids);
        c->ids[k] = (int *)mallocCheck(c->nids[k] * sizeof(int));
        for (int i = 0; i < c->nids[k]; i++) c->ids[k][i] = cJSON_GetArrayItem(ids, i)->valueint;
    }
}

static void cases_free(Cases *c) {
    for (int k = 0; k < c->n; k++) free(c->ids[k]);
    cJSON_Delete(c->root);
}

static void open_fixture(RewardModel *rm, const char *name, char *dir, size_t cap) {
    char rel[256];
    snprintf(rel, sizeof rel, "reward_model/%s", name);
    fixture_path(dir, cap, rel);
    reward_model_open(rm, dir, 1);
    reward_model_load(rm, backend_cpu(), FP8_OFF);
}

// each text tokenized as transformers does, and every score within 1e-5 of transformers' (fp32, one batch
// per kind of prompt; here all in one batch, G = 1)
static void check_fixture(const char *name) {
    RewardModel rm;
    char dir[1200];
    open_fixture(&rm, name, dir, sizeof dir);
    ck_assert_str_eq(rm.name, name);
    Cases c;
    cases_read(&c, name);
    for (int k = 0; k < c.n; k++) {
        char *text = reward_model_text(&rm, &c.ex[k], c.completion[k]);
        int *ids, n = tokenizer_encode(rm.tok, text, &ids);
        ck_assert_msg(n == c.nids[k], "%s case %d: %d ids, transformers %d: '%s'", name, k, n, c.nids[k], text);
        for (int i = 0; i < n; i++) ck_assert_msg(ids[i] == c.ids[k][i], "%s case %d: id %d is %d, transformers %d", name, k, i, ids[i], c.ids[k][i]);
        free(ids), free(text);
    }
    double got[16];
    reward_model_score(&rm, NULL, c.ex, 1, c.n, c.completion, got, 1);
    for (int k = 0; k < c.n; k++)
        ck_assert_msg(fabs(got[k] - c.score[k]) < 1e-5, "%s case %d: score %.7f, transformers %.7f", name, k, got[k], c.score[k]);
    // the same cases as G = 1 rows of a wider table (stride 3): only their column written
    double wide[48];
    for (int i = 0; i < 48; i++) wide[i] = -7;
    reward_model_score(&rm, NULL, c.ex, 1, c.n, c.completion, wide + 2, 3);
    for (int k = 0; k < c.n; k++) {
        ck_assert(wide[3 * k] == -7 && wide[3 * k + 1] == -7);
        ck_assert(wide[3 * k + 2] == got[k]);
    }
    cases_free(&c);
    reward_model_close(&rm);
}

START_TEST(test_llama_scores) { check_fixture("llama"); }
END_TEST

START_TEST(test_qwen3_scores) { check_fixture("qwen3"); }
END_TEST

// Lent an arena too small for the whole batch (a policy's, as between a rollout and an update): the forward
// runs in micro-batches that fit (memfit_forward), the scores are the same, and the arena goes back to its
// owner with the reward model's activations counted in its peak
START_TEST(test_arena_micro_batches) {
    RewardModel rm;
    char dir[1200];
    open_fixture(&rm, "qwen3", dir, sizeof dir);
    Cases c;
    cases_read(&c, "qwen3");
    Model owner;
    memset(&owner, 0, sizeof owner);
    owner.be = backend_cpu();
    size_t two = model_acts_bytes(&rm.m, 2, 64, ACTS_FORWARD_ONLY);
    model_arena_init(&owner, two);  // two sequences of the longest text (under 64 tokens), not all seven
    ck_assert_int_eq(memfit_forward(&rm.m, c.n, 64, two), 2);
    double got[16];
    reward_model_score(&rm, &owner, c.ex, 1, c.n, c.completion, got, 1);
    for (int k = 0; k < c.n; k++) ck_assert_msg(fabs(got[k] - c.score[k]) < 1e-5, "case %d: %.7f vs %.7f", k, got[k], c.score[k]);
    ck_assert(owner.arena.mem && owner.arena.peak_acts > 0 && owner.arena.peak_acts <= two);
    ck_assert(!rm.m.arena.mem && !rm.m.acts.mem);  // given back, nothing of it kept
    // an arena that holds not one sequence: one line naming the memory
    Model tiny;
    memset(&tiny, 0, sizeof tiny);
    tiny.be = backend_cpu();
    model_arena_init(&tiny, 4096);
    EXPECT_DIE(reward_model_score(&rm, &tiny, c.ex, 1, c.n, c.completion, got, 1), "memory: the reward model's forward over one sequence");
    owner.be->free(owner.arena.mem);
    cases_free(&c);
    reward_model_close(&rm);
}
END_TEST

// ----------------------------------------------------------------------------
// bad checkpoints: a directory like the llama fixture with one thing changed

// dir = base_dir/name holding the llama fixture's config.json edited by edit(root), and links to the files
// named in links (of "model.safetensors tokenizer.json tokenizer_config.json")
static void variant(const char *name, void (*edit)(cJSON *), const char *links, char *dir, size_t cap) {
    tmp_path("");
    char src[PATH_MAX], rel[1024], p[PATH_MAX + 64], cmd[3 * PATH_MAX];
    fixture_path(rel, sizeof rel, "reward_model/llama");
    ck_assert(realpath(rel, src));
    snprintf(dir, cap, "%s/%s", base_dir, name);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir %s", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    for (const char *s = links; *s;) {
        size_t n = strcspn(s, " ");
        snprintf(cmd, sizeof cmd, "ln -s %s/%.*s %s/", src, (int)n, s, dir);
        ck_assert_int_eq(system(cmd), 0);
        s += n + (s[n] == ' ');
    }
    snprintf(p, sizeof p, "%s/config.json", src);
    char *text = read_file(p, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (edit) edit(root);
    char *out = cJSON_Print(root);
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_file_atomic(p, out, strlen(out));
    free(out);
    cJSON_Delete(root);
}

static void set_arch(cJSON *root, const char *cls, const char *model_type) {
    cJSON_ReplaceItemInObject(root, "architectures", cJSON_CreateStringArray(&cls, 1));
    if (model_type) cJSON_ReplaceItemInObject(root, "model_type", cJSON_CreateString(model_type));
}
static void causal(cJSON *root) { set_arch(root, "LlamaForCausalLM", NULL); }
static void mistral(cJSON *root) {
    set_arch(root, "MistralForSequenceClassification", "mistral");
    cJSON_AddNumberToObject(root, "sliding_window", 4096);
}
static void gpt2(cJSON *root) { set_arch(root, "GPT2ForSequenceClassification", "gpt2"); }
static void two_labels(cJSON *root) {
    cJSON *l = cJSON_CreateObject();
    cJSON_AddStringToObject(l, "0", "LABEL_0");
    cJSON_AddStringToObject(l, "1", "LABEL_1");
    cJSON_ReplaceItemInObject(root, "id2label", l);
}
static void no_labels(cJSON *root) { cJSON_ReplaceItemInObject(root, "id2label", cJSON_CreateObject()); }
static void no_pad(cJSON *root) { cJSON_DeleteItemFromObject(root, "pad_token_id"); }
static void other_pad(cJSON *root) { cJSON_ReplaceItemInObject(root, "pad_token_id", cJSON_CreateNumber(5)); }
static void pad0(cJSON *root) { cJSON_ReplaceItemInObject(root, "pad_token_id", cJSON_CreateNumber(0)); }  // (Gemma's <pad>)

START_TEST(test_bad_checkpoints) {
    RewardModel rm;
    char dir[1200];
    const char *all = "model.safetensors tokenizer.json tokenizer_config.json chat_template.jinja";
    struct {
        const char *name;
        void (*edit)(cJSON *);
        const char *links, *want;
    } cases[] = {
        {"causal", causal, all, "is a LlamaForCausalLM, not a reward model: --reward_model takes a LlamaForSequenceClassification"},
        {"mistral", mistral, all, "unsupported architecture MistralForSequenceClassification: --reward_model takes"},
        {"gpt2", gpt2, all, "unsupported architecture \"gpt2\""},
        {"labels", two_labels, all, "num_labels is 2 (config.json's id2label): a reward model gives one score, num_labels 1"},
        {"nolabels", no_labels, all, "id2label has 0 labels: a classifier has 1 or more"},
        {"nopad", no_pad, all, "config.json has no pad_token_id in [0, 3968)"},
        {"otherpad", other_pad, all, "the tokenizer pads with id 3692 but config.json's pad_token_id is 5"},
        {"notok", NULL, "model.safetensors", "no tokenizer.json: the reward model reads the text under its own tokenizer"},
        {"noweights", NULL, "tokenizer.json", "no *.safetensors"},
    };
    for (volatile size_t i = 0; i < sizeof cases / sizeof *cases; i++) {  // (volatile: EXPECT_DIE's longjmp)
        variant(cases[i].name, cases[i].edit, cases[i].links, dir, sizeof dir);
        EXPECT_DIE(reward_model_open(&rm, dir, 0), cases[i].want);
    }
    // a checkpoint without its score head: the weights of the llama fixture less score.weight
    variant("noscore", NULL, "tokenizer.json tokenizer_config.json", dir, sizeof dir);
    char src[1200], p[4000];
    fixture_path(src, sizeof src, "reward_model/llama/model.safetensors");
    SafeTensors st;
    st_open(&st, src);
    STWrite w[64];
    int n = 0;
    for (int i = 0; i < st.n; i++)
        if (strcmp(st.t[i].name, "score.weight"))
            w[n++] = (STWrite){st.t[i].name, st.t[i].dtype, st.t[i].ndim, {st.t[i].shape[0], st.t[i].shape[1]}, st.t[i].data};
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_write(p, w, n, NULL);
    st_close(&st);
    EXPECT_DIE(reward_model_open(&rm, dir, 0), "has no score head (score.weight)");
    // a chat template other than ChatML / Llama 3, for conversational data only
    variant("gemmatok", pad0, "model.safetensors", dir, sizeof dir);
    fixture_path(src, sizeof src, "tokenizer/gemma");
    snprintf(p, sizeof p, "cp %s/tokenizer.json %s/tokenizer_config.json %s/", src, src, dir);
    ck_assert_int_eq(system(p), 0);
    EXPECT_DIE(reward_model_open(&rm, dir, 1), "the reward model's chat template is gemma, not ChatML or Llama 3");
    // ChatML with a <think> block in the assistant's turn (as Qwen3's template writes one): conversational data refused,
    // text prompts taken
    variant("thinks", NULL, "model.safetensors tokenizer.json", dir, sizeof dir);
    const char *cfg = "{\"pad_token\": \"<|end_of_text|>\", \"chat_template\": \"{%- for m in messages %}{{- '<|im_start|>' + "
                      "m.role + '\\n' }}{%- if m.role == 'assistant' %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{{- "
                      "m.content + '<|im_end|>\\n' }}{%- endfor %}\"}";
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_file_atomic(p, cfg, strlen(cfg));
    EXPECT_DIE(reward_model_open(&rm, dir, 1), "writes a <think> block into the assistant's turn (Qwen3's)");
    reward_model_open(&rm, dir, 0);
    ck_assert_str_eq(tokenizer_chat_format(rm.tok), "chatml");
    reward_model_close(&rm);
    // a policy (--model) that is a reward model
    Model m;
    ModelOptions o = {0};
    fixture_path(src, sizeof src, "reward_model/qwen3");
    EXPECT_DIE(model_load(&m, src, backend_cpu(), &o), "is a *ForSequenceClassification checkpoint (a reward model");
}
END_TEST

// ----------------------------------------------------------------------------
// ./train_grpo with a reward model

#define SMALL "./train_grpo --device cpu --warmup_sft_steps 0 --per_device_train_batch_size 4 " \
              "--num_generations 2 --max_completion_length 8 --eval_size 2 --eval_steps 0 --reward_model_fp8 off --reward_funcs format " \
              "--reward_weights 0.5,2"

// GRPO and PPO, 2 steps each with the qwen3 fixture: its reward logged under its name at each step; with
// the built-in format reward beside it, reward = 0.5 format + 2 qwen3 (--reward_weights)
START_TEST(test_grpo_and_ppo) {
    tmp_path("");  // the suite's directory made, the warm-up cache in it
    char fix[PATH_MAX], rel[1024], cmd[3 * PATH_MAX + 1024], out[32768], dir[PATH_MAX];
    fixture_path(rel, sizeof rel, "reward_model/qwen3");
    ck_assert(realpath(rel, fix));
    const char *algos[2] = {"", "--algo ppo"};
    for (int a = 0; a < 2; a++) {
        snprintf(dir, sizeof dir, "%s/run%d", base_dir, a);
        snprintf(cmd, sizeof cmd, SMALL " --max_steps 2 %s --reward_model %s --output_dir %s", algos[a], fix, dir);
        ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s\n%s", cmd, out);
        ck_assert_msg(strstr(out, "reward model qwen3: a Qwen3ForSequenceClassification, linear weights off"), "%s", out);
        ck_assert_msg(strstr(out, "reward model qwen3 (Qwen3ForSequenceClassification): weights "), "%s", out);
        for (int step = 1; step <= 2; step++) {
            double rm = metrics_value(dir, step, "rewards/qwen3/mean"), sd = metrics_value(dir, step, "rewards/qwen3/std");
            double fm = metrics_value(dir, step, "rewards/format/mean"), rw = metrics_value(dir, step, "reward");
            ck_assert_msg(isfinite(rm) && isfinite(sd) && sd > 0 && rm != 0, "%s step %d: qwen3 %g (std %g)", algos[a], step, rm, sd);
            ck_assert_msg(fabs(rw - (0.5 * fm + 2 * rm)) < 1e-5, "%s step %d: reward %g, 0.5 x %g + 2 x %g", algos[a], step, rw, fm, rm);
        }
    }
    // --resume with another reward model: refused (the objective would change under the run)
    char other[PATH_MAX];
    fixture_path(rel, sizeof rel, "reward_model/llama");
    ck_assert(realpath(rel, other));
    snprintf(cmd, sizeof cmd, SMALL " --max_steps 3 --reward_model %s --output_dir %s/run0 --resume", other, base_dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) != 0, "%s", out);
    const char *e = strstr(out, "error: ");
    ck_assert_msg(e && strstr(e, "was made with other settings than this run (reward_model ") && strchr(e, '\n') == e + strlen(e) - 1,
                  "%s", out);
}
END_TEST

// The logged reward is the reward model's score of the run's own completions: a reward program (of weight 0)
// records each step's request, whose prompts and completions, scored here, give rewards/qwen3/mean
START_TEST(test_logged_scores_are_the_completions) {
    tmp_path("");  // the suite's directory made, the warm-up cache in it
    char fix[PATH_MAX], rel[1024], cmd[6 * PATH_MAX], out[32768], dir[PATH_MAX], req[PATH_MAX + 32];
    fixture_path(rel, sizeof rel, "reward_model/qwen3");
    ck_assert(realpath(rel, fix));
    snprintf(dir, sizeof dir, "%s/logged", base_dir);
    snprintf(req, sizeof req, "%s/requests.jsonl", base_dir);
    snprintf(cmd, sizeof cmd, "rm -f %s && ./train_grpo --device cpu --warmup_sft_steps 0 --per_device_train_batch_size 4 "
             "--num_generations 2 --max_completion_length 8 --eval_size 2 --eval_steps 0 --max_steps 2 --reward_model %s "
             "--reward_model_fp8 off --reward_funcs none --reward_cmd 'while IFS= read -r l; do printf \"%%s\\n\" \"$l\" >> %s; "
             "echo \"[0, 0, 0, 0]\"; done' --reward_weights 0,1 --output_dir %s", req, fix, req, dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s\n%s", cmd, out);
    RewardModel rm;
    reward_model_open(&rm, fix, 0);
    reward_model_load(&rm, backend_cpu(), FP8_OFF);
    char *text = read_file(req, NULL), *line = text;
    int step = 0;
    for (char *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(line), *ps = cJSON_GetObjectItem(j, "prompts"), *cs = cJSON_GetObjectItem(j, "completions");
        int S = cJSON_GetArraySize(cs);
        ck_assert_int_eq(S, 4);
        Example ex[4];
        char *comp[4];
        memset(ex, 0, sizeof ex);
        for (int q = 0; q < S; q++) {
            ex[q].prompt = cJSON_GetArrayItem(ps, q)->valuestring;
            comp[q] = cJSON_GetArrayItem(cs, q)->valuestring;
        }
        double sc[4], mean = 0;
        reward_model_score(&rm, NULL, ex, 1, S, comp, sc, 1);
        for (int q = 0; q < S; q++) mean += sc[q] / S;
        double logged = metrics_value(dir, ++step, "rewards/qwen3/mean");
        ck_assert_msg(fabs(logged - mean) < 1e-6, "step %d: logged %.7f, the completions score %.7f", step, logged, mean);
        cJSON_Delete(j);
    }
    ck_assert_int_eq(step, 2);
    free(text);
    reward_model_close(&rm);
}
END_TEST

static Suite *reward_model_suite(void) {
    Suite *s = suite_create("reward_model");
    TCase *tc = tcase_create("reward_model");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_llama_scores);
    tcase_add_test(tc, test_qwen3_scores);
    tcase_add_test(tc, test_arena_micro_batches);
    tcase_add_test(tc, test_bad_checkpoints);
    tcase_add_test(tc, test_grpo_and_ppo);
    tcase_add_test(tc, test_logged_scores_are_the_completions);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    setenv("CK_FORK", "no", 1);  // one process: the suite's directory made once, removed when it passes
    return tmp_cleanup(run_suite(reward_model_suite()));
}
