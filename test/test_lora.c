// test/test_lora.c: LoRA adapters. Against peft (an adapter peft saved on the Qwen3, Mistral and
// Gemma 3 fixtures, with the logits transformers+peft computed: test/fixtures/peft, made by
// dev/make_peft_fixture.py),
// PEFT-format round trip, PEFT's initialisation, AdamW against a hand-computed step,
// optimizer-state round trip, bad adapter files. (The gradients through LoRA are
// checked by finite differences in test_model.c.)
#include <check.h>
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <unistd.h>

#include "grpo.h"
#include "lora.h"
#include "model.h"
#include "testutil.h"
#include "io/safetensors.h"

static void load_arch(Model *m, const Backend *be, const char *arch) {
    char p[1024];
    fixture_path(p, sizeof p, arch);
    ModelOptions o = {FP8_OFF, 0, 0, 0, 0};
    model_load(m, p, be, &o);
}
static void load_qwen3(Model *m, const Backend *be) { load_arch(m, be, "qwen3"); }

static double logits_err_of(Model *m, LoRA *lo, const char *tokens_rel, const char *ref_rel, double *max_ref) {
    char p[1024];
    fixture_path(p, sizeof p, tokens_rel);
    Npy tk = npy_read(p);
    fixture_path(p, sizeof p, ref_rel);
    Npy ref = npy_read(p);
    int B = (int)tk.shape[0], T = (int)tk.shape[1], V = m->cfg.V;
    int *ids = (int *)mallocCheck(B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) ids[i] = (int)tk.data[i];
    model_forward(m, lo, ids, B, T);
    float *lg = (float *)mallocCheck((size_t)B * T * V * sizeof(float));
    model_logits(m, lg);
    double err = 0;
    for (long i = 0; i < ref.n; i++) err = fmax(err, fabs(lg[i] - ref.data[i]));
    *max_ref = max_abs_d(ref.data, ref.n);
    free(ids);
    free(lg);
    npy_free(&tk);
    npy_free(&ref);
    return err;
}
static double logits_err(Model *m, LoRA *lo, const char *ref_rel, double *max_ref) {
    return logits_err_of(m, lo, "qwen3/tokens.npy", ref_rel, max_ref);
}

// an adapter saved by peft, applied by lora.c, gives transformers+peft's logits on the fixture's own
// tokens (Qwen3, Mistral, Gemma 3); switched off, the same model gives the base logits
START_TEST(test_peft_adapter_logits) {
    const char *archs[3] = {"qwen3", "mistral", "gemma3"};
    for (int k = 0; k < 3; k++) {
        Model m;
        load_arch(&m, backend_cpu(), archs[k]);
        char p[1024], rel[64], tokens[64], ref[64], base[64];
        snprintf(rel, sizeof rel, "peft/%s_lora", archs[k]);
        fixture_path(p, sizeof p, rel);
        LoRA *lo = lora_load_peft(&m, p);
        ck_assert_int_eq(lo->r, 4);
        ck_assert(fabsf(lo->scale - 2.0f) < 1e-7f);
        ck_assert_uint_eq(lo->targets, (1u << LIN_COUNT) - 1);
        snprintf(tokens, sizeof tokens, "%s/tokens.npy", archs[k]);
        if (k == 0) snprintf(ref, sizeof ref, "peft/lora_logits.npy");
        else snprintf(ref, sizeof ref, "peft/%s_lora_logits.npy", archs[k]);
        double mx, err = logits_err_of(&m, lo, tokens, ref, &mx);
        printf("%s peft adapter: max |logit - transformers+peft| %.3g (max |logit| %.3g)\n", archs[k], err, mx);
        ck_assert_msg(err <= 1e-4 * mx, "%s: max |diff| %g", archs[k], err);
        snprintf(base, sizeof base, "%s/logits.npy", archs[k]);
        err = logits_err_of(&m, NULL, tokens, base, &mx);
        ck_assert_msg(err <= 1e-4 * mx, "%s, LoRA off: max |diff| %g", archs[k], err);
        lora_free(lo);
        model_free(&m);
    }
}
END_TEST

// Qwen3 MoE: peft's adapter on the attention (q, k, v, o; dev/make_peft_fixture.py --arch qwen3_moe) gives
// transformers+peft's logits through the sparse and dense layers; one on an MLP projection or on the experts is refused
START_TEST(test_peft_adapter_moe) {
    Model m;
    load_arch(&m, backend_cpu(), "qwen3_moe");
    char p[1024];
    fixture_path(p, sizeof p, "peft/qwen3_moe_lora");
    LoRA *lo = lora_load_peft(&m, p);
    ck_assert_uint_eq(lo->targets, (1u << LIN_Q) | (1u << LIN_K) | (1u << LIN_V) | (1u << LIN_O));
    double mx, err = logits_err_of(&m, lo, "qwen3_moe/tokens.npy", "peft/qwen3_moe_lora_logits.npy", &mx);
    printf("qwen3_moe peft adapter: max |logit - transformers+peft| %.3g (max |logit| %.3g)\n", err, mx);
    ck_assert_msg(err <= 1e-5, "max |diff| %g", err);
    lora_free(lo);
    EXPECT_DIE(lora_create(&m, 2, 4.0f, lora_parse_targets("q_proj,down_proj"), 1, 0),
               "LoRA on gate_proj, up_proj or down_proj of a qwen3_moe model is not supported");
    model_free(&m);
}
END_TEST

// Qwen3 MoE with LoRA on the experts too (PEFT's target_parameters mlp.experts.gate_up_proj, down_proj;
// dev/make_moe_expert_lora_fixture.py): peft's adapter gives transformers+peft's logits; saved by lora_save_peft
// it is peft's file again, tensor for tensor under peft's names (so PeftModel.from_pretrained reads it as it
// read the fixture: the script's --check), and it loads back to the same logits
START_TEST(test_peft_adapter_moe_experts) {
    Model m;
    load_arch(&m, backend_cpu(), "qwen3_moe");
    char p[1024], dir[] = "/tmp/fp8grpo_loraXXXXXX";
    fixture_path(p, sizeof p, "peft/qwen3_moe_experts_lora");
    LoRA *lo = lora_load_peft(&m, p);
    ck_assert_uint_eq(lo->targets, (1u << LIN_Q) | (1u << LIN_K) | (1u << LIN_V) | (1u << LIN_O) | LORA_EXPERTS);
    for (int l = 0; l < m.cfg.L; l++)  // layer 1 is dense (mlp_only_layers): no expert adapter there
        ck_assert(!lo->eA[2 * l] == !m.cfg.moe[l] && !lo->eA[2 * l + 1] == !m.cfg.moe[l]);
    double mx, err = logits_err_of(&m, lo, "qwen3_moe/tokens.npy", "peft/qwen3_moe_experts_lora_logits.npy", &mx);
    printf("qwen3_moe peft adapter on the experts: max |logit - transformers+peft| %.3g (max |logit| %.3g)\n", err, mx);
    ck_assert_msg(err <= 1e-5, "max |diff| %g", err);
    double base_mx, base = logits_err_of(&m, NULL, "qwen3_moe/tokens.npy", "peft/qwen3_moe_experts_lora_logits.npy", &base_mx);
    ck_assert_msg(base > 0.1, "the adapter changes the logits by %g only: the test would not see it", base);

    ck_assert(mkdtemp(dir));
    lora_save_peft(lo, &m, dir, "test/fixtures/qwen3_moe", NULL);
    SafeTensors a, b;
    char q[1200];
    snprintf(q, sizeof q, "%s/adapter_model.safetensors", p);
    st_open(&a, q);
    snprintf(q, sizeof q, "%s/adapter_model.safetensors", dir);
    st_open(&b, q);
    ck_assert_int_eq(a.n, b.n);
    for (int k = 0; k < a.n; k++) {
        const STensor *t = st_find(&b, a.t[k].name);
        ck_assert_msg(t, "lora_save_peft wrote no %s", a.t[k].name);
        ck_assert(t->ndim == 2 && t->shape[0] == a.t[k].shape[0] && t->shape[1] == a.t[k].shape[1]);
        ck_assert(t->dtype == a.t[k].dtype && memcmp(t->data, a.t[k].data, t->nbytes) == 0);
    }
    st_close(&a), st_close(&b);
    snprintf(q, sizeof q, "%s/adapter_config.json", dir);
    char *cfg = read_file(q, NULL);
    ck_assert(strstr(cfg, "\"target_parameters\":\t[\"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\"]"));
    free(cfg);
    LoRA *back = lora_load_peft(&m, dir);
    ck_assert_uint_eq(back->n, lo->n);
    ck_assert(memcmp(back->params, lo->params, lo->n * sizeof(float)) == 0);
    err = logits_err_of(&m, back, "qwen3_moe/tokens.npy", "peft/qwen3_moe_experts_lora_logits.npy", &mx);
    ck_assert_msg(err <= 1e-5, "after the round trip: max |diff| %g", err);
    lora_free(back);
    lora_free(lo);
    // one of the two alone: the unnested names (peft's, when a module has one adapted parameter)
    lo = lora_create(&m, 2, 4.0f, lora_parse_targets("q_proj") | lora_parse_target_parameters("down_proj"), 3, 0);
    lora_save_peft(lo, &m, dir, "test/fixtures/qwen3_moe", NULL);
    snprintf(q, sizeof q, "%s/adapter_model.safetensors", dir);
    st_open(&b, q);
    ck_assert(st_find(&b, "base_model.model.model.layers.0.mlp.experts.lora_B.weight"));
    ck_assert(st_find(&b, "base_model.model.model.layers.0.mlp.experts.lora_B.weight")->shape[0] == m.cfg.C);
    st_close(&b);
    lora_free(lo);
    EXPECT_DIE(lora_parse_target_parameters("mlp.experts.up_proj"), "unknown LoRA target parameter 'mlp.experts.up_proj'");
    model_free(&m);
    load_qwen3(&m, backend_cpu());  // a dense model has no experts to adapt
    EXPECT_DIE(lora_create(&m, 2, 4.0f, lora_parse_targets("all") | LORA_EXPERTS, 1, 0), "this model has none");
    model_free(&m);
}
END_TEST

// save with lora_save_peft, load again: the same numbers, the same logits
START_TEST(test_peft_roundtrip) {
    Model m;
    load_qwen3(&m, backend_cpu());
    char p[1024], dir[] = "/tmp/fp8grpo_loraXXXXXX";
    fixture_path(p, sizeof p, "peft/qwen3_lora");
    LoRA *a = lora_load_peft(&m, p);
    ck_assert(mkdtemp(dir));
    lora_save_peft(a, &m, dir, "test/fixtures/qwen3", NULL);
    LoRA *b = lora_load_peft(&m, dir);
    ck_assert_uint_eq(a->n, b->n);
    ck_assert(memcmp(a->params, b->params, a->n * sizeof(float)) == 0);
    ck_assert_int_eq(b->r, a->r);
    ck_assert(b->alpha == a->alpha);
    // the config peft needs
    char cp[1200];
    snprintf(cp, sizeof cp, "%s/adapter_config.json", dir);
    char *cfg = read_file(cp, NULL);
    ck_assert(strstr(cfg, "\"peft_type\":\t\"LORA\"") || strstr(cfg, "\"peft_type\": \"LORA\""));
    ck_assert(strstr(cfg, "\"target_modules\""));
    free(cfg);
    double mx, err = logits_err(&m, b, "peft/lora_logits.npy", &mx);
    ck_assert_msg(err <= 1e-4 * mx, "after the round trip: max |diff| %g", err);
    lora_free(a);
    lora_free(b);
    model_free(&m);
}
END_TEST

// An adapter's base is found from any working directory: lora_save_peft records the absolute path of
// a base given relative to where the run started, and lora_base_dir reads it from elsewhere (here
// "/"); an adapter whose config holds such a relative path (written by earlier versions) is found
// beside a directory above the adapter; one found nowhere: one line asking for --model.
START_TEST(test_peft_base_found_anywhere) {
    Model m;
    load_qwen3(&m, backend_cpu());
    char fix[1024], abs[PATH_MAX], here[PATH_MAX], dir[] = "/tmp/fp8grpo_loraXXXXXX", ad[1200], cmd[8400];
    fixture_path(fix, sizeof fix, "qwen3");
    ck_assert(realpath(fix, abs) && getcwd(here, sizeof here) && mkdtemp(dir));
    fixture_path(fix, sizeof fix, "peft/qwen3_lora");
    LoRA *a = lora_load_peft(&m, fix);
    snprintf(ad, sizeof ad, "%s/run/out/run-1/checkpoint-1", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && ln -s %s %s/run/out/warm", ad, abs, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/run", dir);  // the run starts in <dir>/run, its base out/warm
    ck_assert_int_eq(chdir(cmd), 0);
    lora_save_peft(a, &m, "out/run-1/checkpoint-1", "out/warm", NULL);
    ck_assert_int_eq(chdir("/"), 0);
    snprintf(cmd, sizeof cmd, "%s/adapter_config.json", ad);
    char *text = read_file(cmd, NULL);
    cJSON *r = cJSON_Parse(text);
    ck_assert_str_eq(cJSON_GetObjectItem(r, "base_model_name_or_path")->valuestring, abs);
    cJSON_Delete(r);
    free(text);
    ck_assert_str_eq(lora_base_dir(ad), abs);
    // an adapter_config.json of an earlier version: the path relative to <dir>/run
    const char *old = "{\"peft_type\": \"LORA\", \"base_model_name_or_path\": \"out/warm\", \"r\": 8, \"lora_alpha\": 16}";
    write_file_atomic(cmd, old, strlen(old));
    char want[1300];
    snprintf(want, sizeof want, "%s/run/out/warm", dir);
    ck_assert_str_eq(lora_base_dir(ad), want);
    const char *none = "{\"peft_type\": \"LORA\", \"base_model_name_or_path\": \"out/gone\", \"r\": 8, \"lora_alpha\": 16}";
    write_file_atomic(cmd, none, strlen(none));
    EXPECT_DIE(lora_base_dir(ad), "'s base out/gone is not a checkpoint directory here nor beside any directory above the adapter: give --model");
    ck_assert_int_eq(chdir(here), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    lora_free(a);
    model_free(&m);
}
END_TEST

// Mistral and Gemma 3 have Llama's seven projections under the same names: an adapter on every one,
// on FP8 block weights (their widths, 64 and 160, are not whole 128 blocks), saved in PEFT's format and
// loaded again gives the same logits, and they differ from the base's
START_TEST(test_peft_roundtrip_mistral_gemma3) {
    const char *archs[2] = {"mistral", "gemma3"};
    for (int a_ = 0; a_ < 2; a_++) {
        char p[1024], dir[] = "/tmp/fp8grpo_lora2XXXXXX";
        fixture_path(p, sizeof p, archs[a_]);
        ModelOptions o = {FP8_BLOCK, 0, 0, 0, 0};
        Model m;
        model_load(&m, p, backend_cpu(), &o);
        LoRA *a = lora_create(&m, 4, 8.0f, lora_parse_targets("all"), 3, 0);
        Rng r = rng_make(5);
        for (size_t i = 0; i < a->n; i++) ((float *)a->params)[i] += 0.05f * rng_normal(&r);  // B = 0 at init
        ck_assert(mkdtemp(dir));
        lora_save_peft(a, &m, dir, p, NULL);
        LoRA *b = lora_load_peft(&m, dir);
        ck_assert_uint_eq(a->n, b->n);
        ck_assert(memcmp(a->params, b->params, a->n * sizeof(float)) == 0);
        int ids[16], V = m.cfg.V;
        for (int i = 0; i < 16; i++) ids[i] = (i * 37 + 11) % V;
        float *lg[3];
        LoRA *use[3] = {NULL, a, b};
        for (int k = 0; k < 3; k++) {
            model_forward(&m, use[k], ids, 1, 16);
            lg[k] = (float *)mallocCheck((size_t)16 * V * sizeof(float));
            model_logits(&m, lg[k]);
        }
        ck_assert_msg(!memcmp(lg[1], lg[2], (size_t)16 * V * sizeof(float)), "%s: logits changed in the round trip", archs[a_]);
        ck_assert_msg(memcmp(lg[0], lg[1], (size_t)16 * V * sizeof(float)), "%s: the adapter changed nothing", archs[a_]);
        for (int k = 0; k < 3; k++) free(lg[k]);
        lora_free(a);
        lora_free(b);
        model_free(&m);
        char cmd[1100];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
}
END_TEST

// Gemma 3 as published (Gemma3ForConditionalGeneration, test/fixtures/gemma3_mm, made by
// dev/make_gemma3_mm_fixture.py), both ways:
//   peft -> here: the adapter peft made on the multimodal model (its modules model.language_model.layers.*)
//     gives peft's logits within 1e-5 (of the largest), on the checkpoint under either naming;
//   here -> peft: a seeded adapter saved by lora_save_peft is byte for byte test/fixtures/peft/gemma3_mm_c_lora,
//     which the fixture script loaded in peft on Gemma3ForConditionalGeneration (--check-adapter): its logits there,
//     gemma3_mm_c_lora_logits.npy, are the ones here within 1e-5. Its tensor names are those peft gives.
// An adapter that adapts the vision tower (target_modules a list: SigLIP has q_proj, k_proj, v_proj too) is
// refused in one line.
static int file_equal(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    int eq = na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return eq;
}
// adapter_config.json files a and b equal but for base_model_name_or_path, and b's base that directory
// (rel) made absolute
static int config_equal_but_base(const char *a, const char *b, const char *rel) {
    char *ta = read_file(a, NULL), *tb = read_file(b, NULL), abs_base[4096];
    cJSON *ja = cJSON_Parse(ta), *jb = cJSON_Parse(tb);
    ck_assert(ja && jb && realpath(rel, abs_base));
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(jb, "base_model_name_or_path");
    int ok = cJSON_IsString(base) && !strcmp(base->valuestring, abs_base);
    cJSON_DeleteItemFromObjectCaseSensitive(ja, "base_model_name_or_path");
    cJSON_DeleteItemFromObjectCaseSensitive(jb, "base_model_name_or_path");
    ok = ok && cJSON_Compare(ja, jb, 1);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    free(ta);
    free(tb);
    return ok;
}

START_TEST(test_peft_gemma3_multimodal) {
    const char *bases[2] = {"gemma3_mm", "gemma3_mm_v5"};
    char p[1024], q[1200], dir[] = "/tmp/fp8grpo_lora_mmXXXXXX";
    for (int k = 0; k < 2; k++) {
        Model m;
        load_arch(&m, backend_cpu(), bases[k]);
        fixture_path(p, sizeof p, "peft/gemma3_mm_lora");
        LoRA *lo = lora_load_peft(&m, p);
        ck_assert_uint_eq(lo->targets, (1u << LIN_COUNT) - 1);
        double mx, err = logits_err_of(&m, lo, "gemma3_mm/tokens.npy", "peft/gemma3_mm_lora_logits.npy", &mx);
        printf("%s: peft's adapter: max |logit - Gemma3ForConditionalGeneration+peft| %.3g (max |logit| %.3g)\n", bases[k],
               err, mx);
        ck_assert_msg(err <= 1e-5 * mx, "%s: max |diff| %g", bases[k], err);
        lora_free(lo);
        model_free(&m);
    }

    Model m;
    load_arch(&m, backend_cpu(), "gemma3_mm");
    LoRA *a = lora_create(&m, 4, 8.0f, lora_parse_targets("all"), 3, 0);
    Rng r = rng_make(11);
    for (size_t i = 0; i < a->n; i++) ((float *)a->params)[i] += 0.2f * rng_normal(&r);  // B = 0 at init
    ck_assert(mkdtemp(dir));
    char base[PATH_MAX];
    fixture_path(base, sizeof base, "gemma3_mm");
    lora_save_peft(a, &m, dir, base, NULL);
    const char *files[2] = {"adapter_model.safetensors", "adapter_config.json"};
    for (int i = 0; i < 2; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "peft/gemma3_mm_c_lora/%s", files[i]);
        fixture_path(p, sizeof p, rel);
        snprintf(q, sizeof q, "%s/%s", dir, files[i]);
        // the config's base is recorded as an absolute path (where this checkout is): compared apart
        int same = file_exists(p) && (i == 0 ? file_equal(p, q) : config_equal_but_base(p, q, base));
        ck_assert_msg(same,
                      "%s differs from what lora_save_peft writes now (%s, kept): if the change is meant, copy it there and "
                      "run python3 dev/make_gemma3_mm_fixture.py --check-adapter on it", p, q);
    }
    // the names peft gave its own adapter on this model
    SafeTensors ours, theirs;
    snprintf(q, sizeof q, "%s/adapter_model.safetensors", dir);
    st_open(&ours, q);
    fixture_path(p, sizeof p, "peft/gemma3_mm_lora/adapter_model.safetensors");
    st_open(&theirs, p);
    ck_assert_int_eq(ours.n, theirs.n);
    for (int i = 0; i < ours.n; i++) ck_assert_msg(st_find(&theirs, ours.t[i].name), "peft has no %s", ours.t[i].name);
    st_close(&ours);
    st_close(&theirs);
    double mx, err = logits_err_of(&m, a, "gemma3_mm/tokens.npy", "peft/gemma3_mm_c_lora_logits.npy", &mx);
    printf("gemma3_mm: the adapter saved here, in peft: max |logit here - there| %.3g (max |logit| %.3g)\n", err, mx);
    ck_assert_msg(err <= 1e-5 * mx, "max |diff| %g", err);

    // a list of names: peft adapts the vision tower's q_proj too
    snprintf(q, sizeof q, "%s/adapter_model.safetensors", dir);
    STWrite t = {"base_model.model.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.lora_A.weight", DT_F32, 2,
                 {4, 16}, calloc(64, sizeof(float))};
    st_write(q, &t, 1, NULL);
    free((void *)t.data);
    EXPECT_DIE(lora_load_peft(&m, dir), "adapts the vision tower, and fp8-grpo runs Gemma 3's text model only");
    lora_free(a);
    model_free(&m);
    snprintf(q, sizeof q, "rm -rf %s", dir);
    ck_assert_int_eq(system(q), 0);
}
END_TEST

// adapter_config.json's target_modules read as PEFT reads it: a string is a regular expression the
// whole module name must match, a list holds names (or name endings); a tensor of a module the
// config does not select is an error, never ignored
static void write_targets(const char *dir, const char *json) {
    char p[1200];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    char *text = read_file(p, NULL);
    cJSON *r = cJSON_Parse(text);
    free(text);
    cJSON_ReplaceItemInObject(r, "target_modules", cJSON_Parse(json));
    text = cJSON_Print(r);
    write_file_atomic(p, text, strlen(text));
    free(text);
    cJSON_Delete(r);
}
START_TEST(test_peft_target_modules) {
    Model m;
    load_qwen3(&m, backend_cpu());
    char dir[] = "/tmp/fp8grpo_loratmXXXXXX";
    ck_assert(mkdtemp(dir));
    unsigned qv = (1u << LIN_Q) | (1u << LIN_V);
    LoRA *a = lora_create(&m, 4, 8.0f, qv, 3, 0);
    lora_save_peft(a, &m, dir, "test/fixtures/qwen3", NULL);
    const char *ok[] = {"\"model\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.(q|v)_proj\"", "\".*[qv]_proj\"", "[\"q_proj\", \"v_proj\"]",
                        "[\"self_attn.q_proj\", \"v_proj\", \"lm_head\"]"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        write_targets(dir, ok[i]);
        LoRA *b = lora_load_peft(&m, dir);
        ck_assert_msg(b->targets == qv, "%s: targets %x", ok[i], b->targets);
        ck_assert(b->n == a->n && memcmp(a->params, b->params, a->n * sizeof(float)) == 0);
        lora_free(b);
    }
    struct { const char *json, *msg; } bad[] = {
        {"\"q,,v\"", "target_modules selects none of the projections"},  // a regex that matches no module, as PEFT reads it
        {"\"q_proj\"", "target_modules selects none of the projections"},  // a full match: not a name ending
        {"\"model\\\\.layers\\\\.0\\\\..*_proj\"", "target_modules selects q_proj in 1 of the 2 layers: adapters on every layer only"},
        {"\"(q_proj\"", "is not a regular expression"},
        {"[\"q_proj\"]", "tensor base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight is of no module that target_modules"},
        {"[\"q_proj\", \"k_proj\", \"v_proj\"]", "\"r\" 4 needs 3584 values"},  // k_proj's tensors are not there
        {"[\"q_proj\", 3]", "target_modules must be names"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_targets(dir, bad[i].json);
        EXPECT_DIE(lora_load_peft(&m, dir), bad[i].msg);
    }
    EXPECT_DIE(lora_parse_targets("q,,v"), "an empty name in the list");
    EXPECT_DIE(lora_parse_targets("q,v,"), "an empty name in the list");
    lora_free(a);
    model_free(&m);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

// PEFT's init: A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0, so a fresh adapter changes nothing
START_TEST(test_init_like_peft) {
    Model m;
    load_qwen3(&m, backend_cpu());
    LoRA *lo = lora_create(&m, 8, 16.0f, lora_parse_targets("q_proj,v,down_proj"), 1, 0);
    ck_assert_uint_eq(lo->targets, (1u << LIN_Q) | (1u << LIN_V) | (1u << LIN_DOWN));
    ck_assert(lo->A[LIN_K] == NULL && lo->A[LIN_Q] != NULL);
    for (int l = 0; l < m.cfg.L; l++)
        for (int i = 0; i < LIN_COUNT; i++) {
            int k = l * LIN_COUNT + i;
            if (!lo->A[k]) continue;
            const float *A = (const float *)lo->A[k], *B = (const float *)lo->B[k];
            double bound = 1.0 / sqrt((double)lo->in[i]), amax = 0, mean = 0;
            size_t na = (size_t)lo->r * lo->in[i];
            for (size_t j = 0; j < na; j++) {
                amax = fmax(amax, fabs(A[j]));
                mean += A[j];
            }
            ck_assert_msg(amax <= bound && amax > 0.9 * bound, "A range %g vs bound %g", amax, bound);
            ck_assert(fabs(mean / na) < 0.2 * bound);
            for (size_t j = 0; j < (size_t)lo->out[i] * lo->r; j++) ck_assert(B[j] == 0.0f);
        }
    double mx, err = logits_err(&m, lo, "qwen3/logits.npy", &mx);
    ck_assert_msg(err <= 1e-4 * mx, "fresh adapter changed the logits by %g", err);
    EXPECT_DIE(lora_parse_targets("q_proj,lm_head"), "unknown LoRA target module 'lm_head'");
    lora_free(lo);
    model_free(&m);
}
END_TEST

// two AdamW steps against the formula computed here in double (torch.optim.AdamW's)
START_TEST(test_adamw_step) {
    const Backend *be = backend_cpu();
    int n = 5;
    float p[5] = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f}, g1[5] = {0.1f, -0.2f, 0.3f, 1.0f, -4.0f}, g2[5] = {-0.3f, 0.1f, 0.0f, 2.0f, 1.0f};
    float m[5] = {0}, v[5] = {0};
    double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
    double P[5], M[5] = {0}, Vv[5] = {0};
    for (int i = 0; i < n; i++) P[i] = p[i];
    for (int step = 1; step <= 2; step++) {
        float *g = step == 1 ? g1 : g2;
        be->adamw(p, g, 1.0f, m, v, n, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, step, NULL, NULL);
        for (int i = 0; i < n; i++) {
            P[i] *= 1 - lr * wd;
            M[i] = b1 * M[i] + (1 - b1) * g[i];
            Vv[i] = b2 * Vv[i] + (1 - b2) * g[i] * g[i];
            double mh = M[i] / (1 - pow(b1, step)), vh = Vv[i] / (1 - pow(b2, step));
            P[i] -= lr * mh / (sqrt(vh) + eps);
        }
        for (int i = 0; i < n; i++) ck_assert_msg(fabs(p[i] - P[i]) < 1e-6 * fmax(1, fabs(P[i])), "step %d p[%d] %.9g vs %.9g", step, i, p[i], P[i]);
    }
    // the first step moves every parameter with a non-zero gradient by ~lr (Adam's sign-like step)
    ck_assert(fabs(P[4] - (3.0 * (1 - lr * wd) * (1 - lr * wd))) > 0.5 * lr);
}
END_TEST

// the fused step (gradients times the clip factor, the act copy written) is the passes it replaces:
// scale, AdamW, to_act, bit for bit; the gradients stay as they were
START_TEST(test_adamw_fused) {
    const Backend *be = backend_cpu();
    enum { n = 1001 };
    float p[n], g[n], m[n], v[n], p2[n], g2[n], m2[n], v2[n], act[n], g0[n];
    Rng r = rng_make(11);
    for (int i = 0; i < n; i++) {
        p[i] = p2[i] = rng_normal(&r), g[i] = g2[i] = g0[i] = 0.1f * rng_normal(&r);
        m[i] = m2[i] = 0.01f * rng_normal(&r), v[i] = v2[i] = 1e-4f * fabsf(rng_normal(&r)) + 1e-6f;
    }
    be->adamw(p, g, 0.37f, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3, act, NULL);
    be->scale(g2, n, 0.37f);
    be->adamw(p2, g2, 1.0f, m2, v2, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3, NULL, NULL);
    ck_assert(memcmp(p, p2, sizeof p) == 0 && memcmp(m, m2, sizeof m) == 0 && memcmp(v, v2, sizeof v) == 0);
    ck_assert(memcmp(act, p, sizeof p) == 0);
    ck_assert(memcmp(g, g0, sizeof g) == 0);
    ck_assert(memcmp(g2, g0, sizeof g) != 0);  // (the scaling was not a no-op)
}
END_TEST

// optimizer state written and read back bit for bit; mismatched settings refused
START_TEST(test_state_roundtrip) {
    Model m;
    load_qwen3(&m, backend_cpu());
    LoRA *a = lora_create(&m, 4, 8.0f, lora_parse_targets("all"), 3, 0);
    Rng r = rng_make(5);
    for (size_t i = 0; i < a->n; i++) {
        ((float *)a->grads)[i] = rng_normal(&r);
    }
    lora_adamw_step(a, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f);
    lora_adamw_step(a, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f);
    char path[] = "/tmp/fp8grpo_stateXXXXXX";
    int fd = mkstemp(path);
    ck_assert(fd >= 0);
    lora_save_state(a, path);
    LoRA *b = lora_create(&m, 4, 8.0f, lora_parse_targets("all"), 99, 0);
    lora_load_state(b, path);
    ck_assert_int_eq(b->step, 2);
    ck_assert(memcmp(a->params, b->params, a->n * 4) == 0);
    ck_assert(memcmp(a->m, b->m, a->n * 4) == 0);
    ck_assert(memcmp(a->v, b->v, a->n * 4) == 0);
    LoRA *c = lora_create(&m, 8, 8.0f, lora_parse_targets("all"), 3, 0);
    EXPECT_DIE(lora_load_state(c, path), "other LoRA settings");
    // a state an earlier build wrote, its blobs adapter by adapter (A then B) and no "order" in the
    // metadata: read into the units' order, the same values at the same adapters
    float *blob[3] = {(float *)a->params, (float *)a->m, (float *)a->v}, *old[3];
    for (int t = 0; t < 3; t++) {
        old[t] = (float *)mallocCheck(a->n * sizeof(float));
        size_t off = 0;
        for (int k = 0; k < a->L * LIN_COUNT; k++) {
            if (!a->A[k]) continue;
            int i = k % LIN_COUNT;
            size_t na = (size_t)a->r * a->in[i], nb = (size_t)a->out[i] * a->r;
            memcpy(old[t] + off, blob[t] + ((float *)a->A[k] - (float *)a->params), na * sizeof(float));
            memcpy(old[t] + off + na, blob[t] + ((float *)a->B[k] - (float *)a->params), nb * sizeof(float));
            off += na + nb;
        }
    }
    STWrite w[3] = {{"params", DT_F32, 1, {(int64_t)a->n}, old[0]},
                    {"adam_m", DT_F32, 1, {(int64_t)a->n}, old[1]},
                    {"adam_v", DT_F32, 1, {(int64_t)a->n}, old[2]}};
    st_write(path, w, 3, "{\"step\":\"2\",\"r\":\"4\"}");
    LoRA *d = lora_create(&m, 4, 8.0f, lora_parse_targets("all"), 99, 0);
    lora_load_state(d, path);
    ck_assert(memcmp(a->params, d->params, a->n * 4) == 0);
    ck_assert(memcmp(a->m, d->m, a->n * 4) == 0);
    ck_assert(memcmp(a->v, d->v, a->n * 4) == 0);
    for (int t = 0; t < 3; t++) free(old[t]);
    lora_free(a);
    lora_free(b);
    lora_free(c);
    lora_free(d);
    model_free(&m);
}
END_TEST

START_TEST(test_bad_adapters) {
    Model m;
    load_qwen3(&m, backend_cpu());
    char dir[] = "/tmp/fp8grpo_badloraXXXXXX", p[1200];
    ck_assert(mkdtemp(dir));
    EXPECT_DIE(lora_load_peft(&m, dir), "no adapter_config.json");
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    const char *dora = "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],\"use_dora\":true}";
    write_file_atomic(p, dora, strlen(dora));
    EXPECT_DIE(lora_load_peft(&m, dir), "DoRA");
    const char *ok = "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}";
    write_file_atomic(p, ok, strlen(ok));
    EXPECT_DIE(lora_load_peft(&m, dir), "cannot open");  // no weights file
    // an adapter for another rank than its tensors
    char src[1024];
    fixture_path(src, sizeof src, "peft/qwen3_lora/adapter_model.safetensors");
    size_t n;
    char *w = read_file(src, &n);
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    write_file_atomic(p, w, n);
    free(w);
    const char *r8 = "{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}";
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    write_file_atomic(p, r8, strlen(r8));
    EXPECT_DIE(lora_load_peft(&m, dir), "wrong shape");
    model_free(&m);
}
END_TEST

// The GRPO loss of a batch, through the model's logprobs, differentiated with respect to the
// LoRA parameters: the analytic gradient (grpo_loss's dL/dlogp, back-propagated by
// model_backward) against central differences in fp64. Exercised: old_logp (num_iterations > 1,
// so the ratio is not 1 and clipping can act), the k3 KL to a reference, the IS weight, GSPO.
typedef struct {
    Model *m;
    LoRA *lo;
    GrpoConfig *cfg;
    GrpoNorm *norm;
    const int *ids, *tg;
    const double *old_c, *ref_c, *samp_c, *adv;
    const uint8_t *mask;
    int B, T, Tc, P;  // P: prompt length; completion token j sits at position P - 1 + j
} GrpoCase;

static double grpo_case_loss(GrpoCase *k, double *dlogp_full) {
    int N = k->B * k->T;
    double *lp = (double *)mallocCheck(N * sizeof(double)), *lc = (double *)callocCheck(k->B * k->Tc, sizeof(double));
    double *dc = (double *)callocCheck(k->B * k->Tc, sizeof(double));
    model_forward(k->m, k->lo, k->ids, k->B, k->T);
    model_logprobs(k->m, k->tg, 1.25f, lp);
    for (int b = 0; b < k->B; b++)
        for (int j = 0; j < k->Tc; j++) lc[b * k->Tc + j] = lp[b * k->T + k->P - 1 + j];
    GrpoInputs in = {lc, k->old_c, k->ref_c, k->samp_c, k->adv, k->mask, NULL};
    double loss = grpo_loss(k->cfg, k->norm, &in, k->B, dc, NULL);
    if (dlogp_full) {
        memset(dlogp_full, 0, N * sizeof(double));
        for (int b = 0; b < k->B; b++)
            for (int j = 0; j < k->Tc; j++) dlogp_full[b * k->T + k->P - 1 + j] = dc[b * k->Tc + j];
    }
    free(lp);
    free(lc);
    free(dc);
    return loss;
}

START_TEST(test_grpo_loss_gradient_through_lora) {
    const Backend *be = backend_cpu64();
    Config c = {0};
    c.arch = ARCH_QWEN3, c.V = 19, c.C = 16, c.FF = 24, c.L = 2, c.NH = 4, c.KVH = 2, c.HD = 8, c.max_pos = 32;
    c.eps = 1e-5f, c.rope_theta = 100.0f, c.qk_norm = 1, c.tied = 1, c.bos_id = -1;
    Model m;
    ModelOptions o = {FP8_OFF, 0, 0, 0, 0};
    model_init_random(&m, &c, be, &o, 21);
    LoRA *lo = lora_create(&m, 2, 4.0f, lora_parse_targets("q_proj,v_proj,up_proj,down_proj"), 4, 0);
    Rng r = rng_make(8);
    for (size_t i = 0; i < lo->n; i++) ((double *)lo->params)[i] += 0.2 * rng_normal(&r);
    enum { B = 4, P = 3, Tc = 4, T = P + Tc };
    int ids[B * T], tg[B * T];
    uint8_t mask[B * Tc];
    double old_c[B * Tc], ref_c[B * Tc], samp_c[B * Tc], adv[B] = {0.9, -0.4, 0.3, -0.8};
    int lens[B] = {4, 2, 3, 4};
    for (int i = 0; i < B * T; i++) ids[i] = rng_int(&r, c.V);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int j = t + 1 - P;
            tg[b * T + t] = (j >= 0 && j < lens[b]) ? ids[b * T + t + 1] : -1;  // t + 1 <= T - 1: inside the row
        }
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tc; j++) mask[b * Tc + j] = j < lens[b] && tg[b * T + P - 1 + j] >= 0;
    // the policy's own logprobs, perturbed: old (ratios away from 1, some clipped), reference, sampler
    GrpoConfig cfg = grpo_config_default();
    cfg.num_generations = 2;
    cfg.beta = 0.05;
    cfg.epsilon = 0.1;
    cfg.max_completion_length = Tc;
    GrpoNorm norm = grpo_prepare(&cfg, B, Tc, mask, NULL);
    GrpoCase k = {&m, lo, &cfg, &norm, ids, tg, old_c, ref_c, samp_c, adv, mask, B, T, Tc, P};
    double lp[B * T];
    model_forward(&m, lo, ids, B, T);
    model_logprobs(&m, tg, 1.25f, lp);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tc; j++) {
            double x = lp[b * T + P - 1 + j];
            old_c[b * Tc + j] = x + 0.15 * rng_normal(&r);
            ref_c[b * Tc + j] = x + 0.3 * rng_normal(&r);
            samp_c[b * Tc + j] = old_c[b * Tc + j] + 0.05 * rng_normal(&r);
        }
    for (int level = 0; level < 2; level++) {  // token-level ratio, then GSPO's sequence-level ratio
        cfg.importance_sampling_level = level ? IS_LEVEL_SEQUENCE : IS_LEVEL_TOKEN;
        double dl[B * T];
        grpo_case_loss(&k, dl);
        lora_zero_grads(lo);
        model_backward(&m, lo, dl);
        double *p = (double *)lo->params, *g = (double *)lo->grads;
        Rng pick = rng_make(100 + level);
        for (int s = 0; s < 12; s++) {
            size_t i = (size_t)rng_int(&pick, (int)lo->n);
            double old = p[i], h = 1e-6;
            p[i] = old + h;
            double up = grpo_case_loss(&k, NULL);
            p[i] = old - h;
            double dn = grpo_case_loss(&k, NULL);
            p[i] = old;
            double num = (up - dn) / (2 * h);
            // fp64 central differences: truncation h^2 ~ 1e-12, rounding ~1e-16 / h = 1e-10
            ck_assert_msg(fabs(num - g[i]) <= 1e-6 * fmax(1e-3, fabs(num)) + 1e-9, "level %d param %zu: analytic %.10g numeric %.10g",
                          level, i, g[i], num);
        }
    }
    lora_free(lo);
    model_free(&m);
}
END_TEST

static Suite *lora_suite(void) {
    Suite *s = suite_create("lora");
    TCase *tc = tcase_create("lora");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_peft_adapter_logits);
    tcase_add_test(tc, test_peft_adapter_moe);
    tcase_add_test(tc, test_peft_adapter_moe_experts);
    tcase_add_test(tc, test_peft_roundtrip);
    tcase_add_test(tc, test_peft_base_found_anywhere);
    tcase_add_test(tc, test_peft_roundtrip_mistral_gemma3);
    tcase_add_test(tc, test_peft_target_modules);
    tcase_add_test(tc, test_peft_gemma3_multimodal);
    tcase_add_test(tc, test_init_like_peft);
    tcase_add_test(tc, test_adamw_step);
    tcase_add_test(tc, test_adamw_fused);
    tcase_add_test(tc, test_state_roundtrip);
    tcase_add_test(tc, test_bad_adapters);
    tcase_add_test(tc, test_grpo_loss_gradient_through_lora);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(lora_suite()); }
