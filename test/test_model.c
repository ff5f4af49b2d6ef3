// test/test_model.c: the CPU reference transformer against Hugging Face transformers.
// Fixtures (test/fixtures/{qwen3,qwen2,llama3,mistral,gemma3,qwen3_moe,qwen3_moe16}, made by dev/make_fixtures.py) hold
// tiny random checkpoints and the fp32 logits transformers computed on them.
// Checks: config parsing, RoPE frequencies, full-forward and KV-cache-decode logits,
// greedy continuation, FP8 fake-quant linear = the FP8 reference GEMM, FP8 block logits = an
// independent PyTorch simulation of it (test/fixtures/fp8sim), fp64 finite
// differences of every gradient the backward produces, save/load round trips, a tokenizer of
// another checkpoint said at load, the reason given on a machine without a GPU.
#include <check.h>
#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "lora.h"
#include "model.h"
#include "testutil.h"
#include "io/safetensors.h"
#include "train/full_finetune.h"

static const char *ARCHS[] = {"qwen3", "qwen2", "llama3", "mistral", "gemma3", "gemma3_mm", "qwen3_moe", "qwen3_moe16"};
#define N_ARCHS ((int)(sizeof ARCHS / sizeof ARCHS[0]))

static void fixture(char *out, size_t cap, const char *arch, const char *file) {
    char rel[256];
    snprintf(rel, sizeof rel, "%s/%s", arch, file);
    fixture_path(out, cap, rel);
}

static ModelOptions opt_dense(void) {
    ModelOptions o = {FP8_OFF, 0, 0, 0, 0};
    return o;
}

// the fixture checkpoint of arch on the CPU backend, at granularity g
static void load_fixture(Model *m, const char *arch, FP8Gran g) {
    char p[1024];
    fixture(p, sizeof p, arch, "");
    ModelOptions o = opt_dense();
    o.gran = g;
    model_load(m, p, backend_cpu(), &o);
}

// ---- config ---------------------------------------------------------------------

// a fixture's config.json as model_load reads it
static Config fixture_config(const char *arch) {
    char p[1024];
    Config c;
    fixture(p, sizeof p, arch, "config.json");
    char *t = read_file(p, NULL);
    config_from_json(&c, t, p);
    free(t);
    return c;
}

START_TEST(test_config_fixtures) {
    Config c = fixture_config("qwen3");
    ck_assert_int_eq(c.arch, ARCH_QWEN3);
    ck_assert_int_eq(c.HD, 32);
    ck_assert_int_eq(c.tied, 1);
    ck_assert_int_eq(c.qk_norm, 1);
    ck_assert_int_eq(c.KVH, 2);
    ck_assert(fabsf(c.rope_theta - 10000.f) < 1e-3f);
    c = fixture_config("qwen2");
    ck_assert_int_eq(c.arch, ARCH_QWEN2);
    ck_assert_int_eq(c.HD, 16);  // no head_dim key: hidden / heads
    ck_assert_int_eq(c.qkv_bias, 1);
    ck_assert_int_eq(c.tied, 0);
    c = fixture_config("llama3");
    ck_assert_int_eq(c.arch, ARCH_LLAMA);
    ck_assert_int_eq(c.rope_scaling, 1);
    ck_assert_int_eq(c.rope_original_max_pos, 64);
    ck_assert_int_eq(c.n_eos, 2);
    ck_assert_int_eq(c.eos_ids[1], 3);
    ck_assert_int_eq(c.window, 0);
    c = fixture_config("mistral");
    ck_assert_int_eq(c.arch, ARCH_MISTRAL);
    ck_assert_int_eq(c.HD, 32);  // explicit, != hidden / heads
    ck_assert_int_eq(c.window, 8);
    ck_assert(c.sliding[0] && c.sliding[1] && !c.gemma);
    c = fixture_config("gemma3");
    ck_assert_int_eq(c.arch, ARCH_GEMMA3);
    ck_assert(c.gemma && c.qk_norm && c.tied);
    ck_assert_int_eq(c.window, 6);
    const unsigned char sl[5] = {1, 0, 1, 1, 0};
    ck_assert(!memcmp(c.sliding, sl, 5));
    ck_assert(c.query_pre_attn_scalar == 24.0f && c.rope_theta == 1e6f && c.rope_local_theta == 1e4f);
    ck_assert_int_eq(c.rope_scaling, 2);
    ck_assert(c.rope_factor == 4.0f);
}
END_TEST

// Gemma 3 as transformers 4.x wrote it (gemma-3-1b-it's config.json): rope_theta, rope_local_base_freq,
// sliding_window_pattern instead of layer_types, rope_scaling null, and its defaults where keys are absent
START_TEST(test_config_gemma3_v4) {
    const char *j =
        "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\",\"vocab_size\":262144,"
        "\"hidden_size\":1152,\"intermediate_size\":6912,\"num_hidden_layers\":26,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":1,\"head_dim\":256,\"hidden_activation\":\"gelu_pytorch_tanh\",\"rope_theta\":1000000,"
        "\"rope_local_base_freq\":10000,\"rope_scaling\":null,\"sliding_window\":512,\"sliding_window_pattern\":6,"
        "\"query_pre_attn_scalar\":256,\"final_logit_softcapping\":null,\"attn_logit_softcapping\":null}";
    Config c;
    config_from_json(&c, j, "inline");
    ck_assert(c.gemma && c.tied && c.window == 512 && c.rope_scaling == 0);
    for (int l = 0; l < 26; l++) ck_assert_int_eq(c.sliding[l], (l + 1) % 6 != 0);
    ck_assert(c.rope_local_theta == 10000.0f && c.rope_theta == 1e6f && c.HD == 256);
    // the 4B-27B text towers' linear scaling of the full layers
    char k[2048];
    const char *at = strstr(j, "\"rope_scaling\":null");
    snprintf(k, sizeof k, "%.*s\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"}%s", (int)(at - j), j,
             at + strlen("\"rope_scaling\":null"));
    config_from_json(&c, k, "inline");
    ck_assert(c.rope_scaling == 2 && c.rope_factor == 8.0f && c.rope_local_theta == 10000.0f);
}
END_TEST

// transformers 4.x style keys (real Hub checkpoints): top-level rope_theta, rope_scaling with "type"
START_TEST(test_config_v4_keys) {
    const char *j =
        "{\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":96,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":1,\"rope_theta\":500000.0,"
        "\"rope_scaling\":{\"type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":8192},\"tie_word_embeddings\":true,\"eos_token_id\":[7,9]}";
    Config c;
    config_from_json(&c, j, "inline");
    ck_assert_int_eq(c.rope_scaling, 1);
    ck_assert(fabsf(c.rope_factor - 32.f) < 1e-6f);
    ck_assert(fabsf(c.rope_theta - 500000.f) < 1.f);
    ck_assert_int_eq(c.HD, 16);
    ck_assert_int_eq(c.KVH, 1);
    ck_assert_int_eq(c.tied, 1);
}
END_TEST

START_TEST(test_config_bad) {
    Config c;
    EXPECT_DIE(config_from_json(&c, "{\"model_type\": \"llama\", ", "x.json"), "not valid JSON");
    EXPECT_DIE(config_from_json(&c, "{\"model_type\": \"gpt2\"}", "x.json"), "unsupported architecture");
    EXPECT_DIE(config_from_json(&c, "{\"model_type\": \"qwen2\", \"vocab_size\": 10}", "x.json"), "hidden_size");
    EXPECT_DIE(config_from_json(&c,
                                "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                                "\"num_hidden_layers\":1,\"num_attention_heads\":3,\"num_key_value_heads\":2}",
                                "x.json"),
               "not a multiple");
    EXPECT_DIE(config_from_json(&c,
                                "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                                "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"rope_scaling\":{\"type\":\"yarn\"}}",
                                "x.json"),
               "not supported");
    // Mistral / Gemma 3: what is not implemented is said with the way out
#define GEMMA_BASE "{\"model_type\":\"gemma3_text\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8," \
                   "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":2,\"head_dim\":4"
    EXPECT_DIE(config_from_json(&c, GEMMA_BASE ",\"final_logit_softcapping\":30.0}", "x.json"),
               "\"final_logit_softcapping\" is set: logit soft-capping (Gemma 2) is not supported");
    EXPECT_DIE(config_from_json(&c, GEMMA_BASE ",\"attn_logit_softcapping\":50.0}", "x.json"), "attention soft-capping");
    EXPECT_DIE(config_from_json(&c, GEMMA_BASE ",\"use_bidirectional_attention\":true}", "x.json"), "causal language models");
    EXPECT_DIE(config_from_json(&c, GEMMA_BASE ",\"hidden_activation\":\"gelu\"}", "x.json"),
               "hidden_activation must be \"gelu_pytorch_tanh\" for gemma3_text");
    EXPECT_DIE(config_from_json(&c, GEMMA_BASE ",\"layer_types\":[\"full_attention\"]}", "x.json"), "layer_types");
    EXPECT_DIE(config_from_json(&c, GEMMA_BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8}}", "x.json"),
               "rope scaling type \"yarn\" is not supported (default, linear and llama3 are)");
#undef GEMMA_BASE
    EXPECT_DIE(config_from_json(&c,
                                "{\"model_type\":\"mistral\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                                "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"sliding_window\":0}",
                                "x.json"),
               "\"sliding_window\" is 0");
    EXPECT_DIE(config_from_json(&c,
                                "{\"model_type\":\"qwen2\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                                "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"use_sliding_window\":true}",
                                "x.json"),
               "use_sliding_window true is not supported for qwen2");
}
END_TEST

// Gemma 3 as published: the 4B's config.json as Google ships it (text_config without its heads, vocabulary or
// head_dim: Gemma3TextConfig's defaults), and what is refused
START_TEST(test_config_gemma3_multimodal) {
    Config c;
    config_from_json(&c,
                     "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"boi_token_index\":255999,"
                     "\"eoi_token_index\":256000,\"eos_token_id\":[1,106],\"image_token_index\":262144,"
                     "\"mm_tokens_per_image\":256,\"model_type\":\"gemma3\",\"text_config\":{\"hidden_size\":2560,"
                     "\"intermediate_size\":10240,\"model_type\":\"gemma3_text\",\"num_hidden_layers\":34,"
                     "\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"},\"sliding_window\":1024},"
                     "\"torch_dtype\":\"bfloat16\",\"vision_config\":{\"hidden_size\":1152,\"model_type\":"
                     "\"siglip_vision_model\",\"num_hidden_layers\":27}}",
                     "config.json");
    ck_assert_int_eq(c.arch, ARCH_GEMMA3);
    ck_assert(c.gemma && c.mm == MM_V4 && c.tied && c.qk_norm);
    ck_assert_int_eq(c.V, 262208);
    ck_assert_int_eq(c.C, 2560);
    ck_assert_int_eq(c.FF, 10240);
    ck_assert_int_eq(c.L, 34);
    ck_assert_int_eq(c.NH, 8);
    ck_assert_int_eq(c.KVH, 4);
    ck_assert_int_eq(c.HD, 256);
    ck_assert_int_eq(c.window, 1024);
    ck_assert(c.sliding[0] && !c.sliding[5] && c.sliding[6] && !c.sliding[11]);  // every sixth layer full
    ck_assert_int_eq(c.rope_scaling, 2);
    ck_assert_float_eq(c.rope_factor, 8.0f);
    ck_assert_float_eq(c.rope_theta, 1e6f);
    ck_assert_float_eq(c.rope_local_theta, 10000.0f);
    ck_assert_float_eq(c.query_pre_attn_scalar, 256.0f);
    ck_assert_int_eq(c.bos_id, 2);  // Gemma3TextConfig's: the file has none
    ck_assert_int_eq(c.n_eos, 2);
    ck_assert_int_eq(c.eos_ids[1], 106);
    ck_assert_int_eq(c.n_mm_ids, 3);
    ck_assert(c.mm_ids[0] == 262144 && c.mm_ids[1] == 255999 && c.mm_ids[2] == 256000);
    ck_assert_str_eq(config_text_prefix(&c), "language_model.model.");
    ck_assert(hf_vision_tensor("vision_tower.vision_model.embeddings.patch_embedding.weight"));
    ck_assert(hf_vision_tensor("model.multi_modal_projector.mm_input_projection_weight"));
    ck_assert(!hf_vision_tensor("language_model.model.norm.weight"));
    EXPECT_DIE(config_from_json(&c, "{\"model_type\":\"gemma3\",\"text_config\":{\"model_type\":\"llama\"}}", "x.json"),
               "text_config's model_type must be \"gemma3_text\"");
    EXPECT_DIE(config_from_json(&c, "{\"model_type\":\"gemma3\",\"text_config\":[1]}", "x.json"), "\"text_config\" must be an object");
    EXPECT_DIE(config_from_json(&c, "{\"model_type\":\"gemma3\",\"text_config\":{\"final_logit_softcapping\":30}}", "x.json"),
               "x.json: text_config: \"final_logit_softcapping\" is set");
}
END_TEST

// The multimodal fixture under both name layouts: the text logits within 1e-5 (of the largest) of what
// Gemma3ForConditionalGeneration computes on the same ids; the vision tower is not read (no warning about it),
// and weights of neither layout are named in one line.
START_TEST(test_gemma3_multimodal_logits) {
    const char *dirs[2] = {"gemma3_mm", "gemma3_mm_v5"};
    const MMLayout want[2] = {MM_V4, MM_V5};
    char p[1024];
    fixture(p, sizeof p, "gemma3_mm", "tokens.npy");
    Npy tk = npy_read(p);
    fixture(p, sizeof p, "gemma3_mm", "logits.npy");
    Npy lg = npy_read(p);
    int B = (int)tk.shape[0], T = (int)tk.shape[1];
    int *ids = (int *)mallocCheck(B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) ids[i] = (int)tk.data[i];
    for (int d = 0; d < 2; d++) {
        Model m;
        load_fixture(&m, dirs[d], FP8_OFF);
        ck_assert_int_eq(m.cfg.mm, want[d]);
        ck_assert_int_eq(m.cfg.n_mm_ids, 3);
        ck_assert(m.cfg.mm_ids[0] == 319 && m.cfg.mm_ids[1] == 317 && m.cfg.mm_ids[2] == 318);
        int V = m.cfg.V;
        ck_assert_int_eq(lg.shape[2], V);
        model_forward(&m, NULL, ids, B, T);
        float *out = (float *)mallocCheck((size_t)B * T * V * sizeof(float));
        model_logits(&m, out);
        double mx = max_abs_d(lg.data, lg.n), err = 0;
        for (long i = 0; i < lg.n; i++) err = fmax(err, fabs(out[i] - lg.data[i]));
        printf("logits %s (Gemma3ForConditionalGeneration's text): max |diff| %.3g, max |logit| %.3g, ratio %.3g\n", dirs[d],
               err, mx, err / mx);
        ck_assert_msg(err <= 1e-5 * mx, "%s: max |diff| %g > 1e-5 * %g", dirs[d], err, mx);
        free(out);
        model_free(&m);
    }
    // the multimodal config.json over a text-only checkpoint's weights
    char dir[] = "/tmp/fp8grpo_test_mmXXXXXX", src[PATH_MAX], dst[1200];
    ck_assert(mkdtemp(dir));
    fixture(src, sizeof src, "gemma3_mm", "config.json");
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    size_t n;
    char *text = read_file(src, &n);
    write_file_atomic(dst, text, n);
    free(text);
    fixture(p, sizeof p, "gemma3", "model.safetensors");
    ck_assert(realpath(p, src));
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    ck_assert_int_eq(symlink(src, dst), 0);
    Model m;
    ModelOptions o = opt_dense();
    EXPECT_DIE(model_load(&m, dir, backend_cpu(), &o),
               "the weights hold neither language_model.model.embed_tokens.weight (transformers 4.x names) nor "
               "model.language_model.embed_tokens.weight");
    unlink(dst);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    unlink(dst);
    rmdir(dir);
    free(ids);
    npy_free(&tk);
    npy_free(&lg);
}
END_TEST

// ---- logits against transformers --------------------------------------------------

// the RoPE inverse frequencies (llama3 scaling included) equal transformers'
START_TEST(test_inv_freq) {
    for (int a = 0; a < N_ARCHS; a++) {
        char p[1024];
        Model m;
        load_fixture(&m, ARCHS[a], FP8_OFF);
        fixture(p, sizeof p, ARCHS[a], "inv_freq.npy");
        Npy ref = npy_read(p);
        ck_assert_int_eq(ref.n, m.cfg.HD / 2);
        const float *f = (const float *)m.inv_freq;
        for (int i = 0; i < ref.n; i++)
            ck_assert_msg(fabs(f[i] - ref.data[i]) <= 1e-6 * fabs(ref.data[i]), "%s inv_freq[%d] %g vs %g", ARCHS[a], i,
                          f[i], ref.data[i]);
        npy_free(&ref);
        if (m.inv_freq_local) {  // Gemma 3's sliding layers' own base
            fixture(p, sizeof p, ARCHS[a], "inv_freq_local.npy");
            ref = npy_read(p);
            f = (const float *)m.inv_freq_local;
            for (int i = 0; i < ref.n; i++)
                ck_assert_msg(fabs(f[i] - ref.data[i]) <= 1e-6 * fabs(ref.data[i]), "%s inv_freq_local[%d] %g vs %g",
                              ARCHS[a], i, f[i], ref.data[i]);
            npy_free(&ref);
        }
        model_free(&m);
    }
}
END_TEST

// full forward, both rows as one batch of B = 2: max |diff| <= 1e-4 * max |logit|
START_TEST(test_logits_full_forward) {
    for (int a = 0; a < N_ARCHS; a++) {
        char p[1024];
        Model m;
        load_fixture(&m, ARCHS[a], FP8_OFF);
        fixture(p, sizeof p, ARCHS[a], "tokens.npy");
        Npy tk = npy_read(p);
        fixture(p, sizeof p, ARCHS[a], "logits.npy");
        Npy lg = npy_read(p);
        int B = (int)tk.shape[0], T = (int)tk.shape[1], V = m.cfg.V;
        ck_assert_int_eq(lg.shape[2], V);
        int *ids = (int *)mallocCheck(B * T * sizeof(int));
        for (int i = 0; i < B * T; i++) ids[i] = (int)tk.data[i];
        model_forward(&m, NULL, ids, B, T);
        float *out = (float *)mallocCheck((size_t)B * T * V * sizeof(float));
        model_logits(&m, out);
        double mx = max_abs_d(lg.data, lg.n), err = 0;
        for (long i = 0; i < lg.n; i++) err = fmax(err, fabs(out[i] - lg.data[i]));
        printf("logits %-6s full forward: max |diff| %.3g, max |logit| %.3g, ratio %.3g\n", ARCHS[a], err, mx, err / mx);
        ck_assert_msg(err <= 1e-4 * mx, "%s: max |diff| %g > 1e-4 * %g", ARCHS[a], err, mx);
        free(ids);
        free(out);
        npy_free(&tk);
        npy_free(&lg);
        model_free(&m);
    }
}
END_TEST

// logprobs of the next token = log_softmax(logits) at the target, from the chunked path
START_TEST(test_logprobs_match_logits) {
    char p[1024];
    Model m;
    load_fixture(&m, "qwen2", FP8_OFF);
    fixture(p, sizeof p, "qwen2", "tokens.npy");
    Npy tk = npy_read(p);
    fixture(p, sizeof p, "qwen2", "logits.npy");
    Npy lg = npy_read(p);
    int B = 2, T = 24, V = m.cfg.V, N = B * T;
    int *ids = (int *)mallocCheck(N * sizeof(int)), *tg = (int *)mallocCheck(N * sizeof(int));
    for (int i = 0; i < N; i++) ids[i] = (int)tk.data[i];
    for (int i = 0; i < N; i++) tg[i] = (i % T == T - 1) ? -1 : ids[i + 1];
    model_forward(&m, NULL, ids, B, T);
    double *lp = (double *)mallocCheck(N * sizeof(double));
    model_logprobs(&m, tg, 1.0f, lp);
    for (int i = 0; i < N; i++) {
        if (tg[i] < 0) { ck_assert(lp[i] == 0); continue; }
        const double *z = lg.data + (size_t)i * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, z[j]);
        for (int j = 0; j < V; j++) s += exp(z[j] - mx);
        double ref = z[tg[i]] - mx - log(s);
        ck_assert_msg(fabs(lp[i] - ref) < 1e-4 * fmax(1, fabs(ref)), "logp[%d] %g vs %g", i, lp[i], ref);
    }
    free(ids);
    free(tg);
    free(lp);
    npy_free(&tk);
    npy_free(&lg);
    model_free(&m);
}
END_TEST

// KV-cache decode: prefill 5 tokens, then one token per call, blocks of 4 scattered in
// the pool; every step's logits equal transformers' at that position
START_TEST(test_logits_decode) {
    for (int a = 0; a < N_ARCHS; a++) {
        char p[1024];
        Model m;
        load_fixture(&m, ARCHS[a], FP8_OFF);
        const Backend *be = m.be;
        // the decode step runs q|k|v and gate|up as one GEMM each (fused views of the weights)
        const LayerWeights *l0 = &m.w.layers[0];
        ck_assert_int_eq(l0->qkv.rows, (m.cfg.NH + 2 * m.cfg.KVH) * m.cfg.HD);
        ck_assert_int_eq(l0->gateup.rows, m.cfg.moe[0] ? 0 : 2 * m.cfg.FF);  // a sparse layer: the experts instead
        ck_assert(m.cfg.qkv_bias == (l0->bias_qkv != NULL));
        fixture(p, sizeof p, ARCHS[a], "tokens.npy");
        Npy tk = npy_read(p);
        fixture(p, sizeof p, ARCHS[a], "logits.npy");
        Npy lg = npy_read(p);
        int T = (int)tk.shape[1], V = m.cfg.V, BS = 4, MB = (T + BS - 1) / BS, P = 5;
        KVCache kv;
        kvcache_alloc(&kv, &m, 2 * MB + 3, BS);
        int table[16], slots[64], ids[64];
        for (int b = 0; b < MB; b++) table[b] = 2 * MB + 2 - 2 * b;  // out of order on purpose
        for (int t = 0; t < T; t++) slots[t] = table[t / BS] * BS + t % BS;
        double mx = max_abs_d(lg.data, (long)T * V), err = 0;
        for (int row = 0; row < 2; row++) {
            for (int t = 0; t < T; t++) ids[t] = (int)tk.data[row * T + t];
            float *lgd = (float *)be->alloc(V * sizeof(float));
            model_prefill(&m, NULL, &kv, ids, &P, slots, 1, P, lgd);
            for (int j = 0; j < V; j++) err = fmax(err, fabs(lgd[j] - lg.data[((size_t)row * T + P - 1) * V + j]));
            for (int t = P; t < T; t++) {
                model_decode(&m, NULL, &kv, &ids[t], &t, &slots[t], table, 1, MB, lgd);
                for (int j = 0; j < V; j++) err = fmax(err, fabs(lgd[j] - lg.data[((size_t)row * T + t) * V + j]));
            }
            be->free(lgd);
        }
        printf("logits %-6s KV-cache decode: max |diff| %.3g (ratio %.3g)\n", ARCHS[a], err, err / mx);
        ck_assert_msg(err <= 1e-4 * mx, "%s decode: max |diff| %g > 1e-4 * %g", ARCHS[a], err, mx);
        kvcache_free(&kv, be);
        npy_free(&tk);
        npy_free(&lg);
        model_free(&m);
    }
}
END_TEST

// several sequences decode together, each with its own length and blocks
static void decode_batched(const char *arch) {
    char p[1024];
    fixture(p, sizeof p, arch, "");
    Model m;
    ModelOptions o = opt_dense();
    const Backend *be = backend_cpu();
    model_load(&m, p, be, &o);
    fixture(p, sizeof p, arch, "tokens.npy");
    Npy tk = npy_read(p);
    fixture(p, sizeof p, arch, "logits.npy");
    Npy lg = npy_read(p);
    int T = 24, V = m.cfg.V, BS = 8, MB = 3;
    KVCache kv;
    kvcache_alloc(&kv, &m, 6, BS);
    int table[6] = {0, 2, 4, 1, 3, 5};  // sequence 0: blocks 0 2 4; sequence 1: 1 3 5
    int ids[2 * 24], lens[2] = {3, 7}, slots[2 * 7];
    for (int i = 0; i < 2 * T; i++) ids[i] = (int)tk.data[i];
    // right-padded prompts of lengths 3 and 7 in a (2, 7) batch
    int pids[14];
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 7; t++) {
            pids[s * 7 + t] = t < lens[s] ? ids[s * T + t] : 0;
            slots[s * 7 + t] = t < lens[s] ? table[s * MB + t / BS] * BS + t % BS : -1;
        }
    float *lgd = (float *)be->alloc(2 * V * sizeof(float));
    model_prefill(&m, NULL, &kv, pids, lens, slots, 2, 7, lgd);
    double mx = max_abs_d(lg.data, lg.n), err = 0;
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < V; j++) err = fmax(err, fabs(lgd[s * V + j] - lg.data[((size_t)s * T + lens[s] - 1) * V + j]));
    int pos[2] = {3, 7};
    for (int step = 0; step < 10; step++) {
        int tok[2], sl[2];
        for (int s = 0; s < 2; s++) {
            tok[s] = ids[s * T + pos[s]];
            sl[s] = table[s * MB + pos[s] / BS] * BS + pos[s] % BS;
        }
        model_decode(&m, NULL, &kv, tok, pos, sl, table, 2, MB, lgd);
        for (int s = 0; s < 2; s++)
            for (int j = 0; j < V; j++) err = fmax(err, fabs(lgd[s * V + j] - lg.data[((size_t)s * T + pos[s]) * V + j]));
        pos[0]++;
        pos[1]++;
    }
    ck_assert_msg(err <= 1e-4 * mx, "%s batched decode: max |diff| %g > 1e-4 * %g", arch, err, mx);
    be->free(lgd);
    kvcache_free(&kv, be);
    npy_free(&tk);
    npy_free(&lg);
    model_free(&m);
}
START_TEST(test_decode_batched) { decode_batched("llama3"); }
END_TEST
// Qwen3 MoE: the two sequences' tokens routed together in each step (and in the prefill, padding included)
START_TEST(test_decode_batched_moe) { decode_batched("qwen3_moe16"); }
END_TEST

// greedy continuation equals transformers' generate(do_sample=False)
START_TEST(test_greedy_generation) {
    for (int a = 0; a < N_ARCHS; a++) {
        char p[1024];
        Model m;
        load_fixture(&m, ARCHS[a], FP8_OFF);
        const Backend *be = m.be;
        fixture(p, sizeof p, ARCHS[a], "tokens.npy");
        Npy tk = npy_read(p);
        fixture(p, sizeof p, ARCHS[a], "generate.npy");
        Npy gen = npy_read(p);
        int P = 8, G = (int)gen.n, ids[16], slots[32], table[2] = {0, 1};
        for (int t = 0; t < P; t++) ids[t] = (int)tk.data[t];
        for (int t = 0; t < 32; t++) slots[t] = t;
        KVCache kv;
        kvcache_alloc(&kv, &m, 2, 16);
        float *lgd = (float *)be->alloc(m.cfg.V * sizeof(float)), lp;
        int32_t next;
        uint64_t rng = 1;
        model_prefill(&m, NULL, &kv, ids, &P, slots, 1, P, lgd);
        for (int t = 0; t < G; t++) {
            be->sample(&next, &lp, lgd, &rng, 1, m.cfg.V, 0.0f, 0, 1.0f);
            ck_assert_msg(next == (int)gen.data[t], "%s: greedy token %d is %d, transformers gives %d", ARCHS[a], t, next,
                          (int)gen.data[t]);
            int pos = P + t;
            model_decode(&m, NULL, &kv, &next, &pos, &slots[pos], table, 1, 2, lgd);
        }
        be->free(lgd);
        kvcache_free(&kv, be);
        npy_free(&tk);
        npy_free(&gen);
        model_free(&m);
    }
}
END_TEST

// ---- FP8 -----------------------------------------------------------------------------

// The CPU backend's FP8 linear (fake quantization) computes what the FP8 reference GEMM
// computes: the same codes and scales, only the summation order differs (fp32 rounding).
START_TEST(test_fp8_linear_matches_reference_gemm) {
    const Backend *be = backend_cpu();
    int M = 37, K = 300, N = 200;
    Rng r = rng_make(7);
    float *x = (float *)mallocCheck(M * K * sizeof(float)), *w = (float *)mallocCheck(N * K * sizeof(float));
    for (int i = 0; i < M * K; i++) x[i] = rng_normal(&r) * (i % 7 == 0 ? 5.0f : 1.0f);
    for (int i = 0; i < N * K; i++) w[i] = rng_normal(&r) * 0.05f;
    FP8Gran grans[3] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK};
    for (int g = 0; g < 3; g++) {
        QWeight qw = {N, K, grans[g], {0}, NULL, NULL};
        fp8_tensor_alloc_cpu(&qw.q, N, K, grans[g], FP8_E4M3, 128);
        be->quantize_weight(&qw, w, DT_F32, 0);
        float *y = (float *)mallocCheck(M * N * sizeof(float)), *yr = (float *)mallocCheck(M * N * sizeof(float));
        be->linear_forward(y, x, &qw, NULL, M);
        FP8Tensor qx;
        fp8_tensor_alloc_cpu(&qx, M, K, grans[g], FP8_E4M3, 1);
        fp8_quantize_cpu(&qx, x, 0);
        fp8_gemm_cpu(yr, &qx, &qw.q);
        if (grans[g] != FP8_TENSOR) {  // quantize_act, then linear_forward_q: the same codes and product, to the bit
            FP8Tensor qb;
            fp8_tensor_alloc_cpu(&qb, M, K, grans[g], FP8_E4M3, 1);
            be->quantize_act(&qb, x, M);
            ck_assert_msg(!memcmp(qb.data, qx.data, (size_t)M * K) &&
                              !memcmp(qb.scale, qx.scale, fp8_num_scales(grans[g], M, K, 1) * sizeof(float)),
                          "%s: quantize_act's codes differ from fp8_quantize's", fp8_gran_name(grans[g]));
            float *y2 = (float *)mallocCheck(M * N * sizeof(float));
            be->linear_forward_q(y2, &qb, &qw, NULL, M);
            ck_assert_msg(!memcmp(y, y2, (size_t)M * N * sizeof(float)), "%s: linear_forward_q differs from linear_forward",
                          fp8_gran_name(grans[g]));
            free(y2);
            fp8_tensor_free_cpu(&qb);
        }
        double mx = 0, err = 0;
        for (int i = 0; i < M * N; i++) {
            mx = fmax(mx, fabs(yr[i]));
            err = fmax(err, fabs(y[i] - yr[i]));
        }
        // both accumulate K products of exactly representable values; fp32 rounding of sums of K = 300 terms
        ck_assert_msg(err <= 1e-5 * mx, "%s: FP8 linear vs reference GEMM max |diff| %g (max %g)", fp8_gran_name(grans[g]),
                      err, mx);
        fp8_tensor_free_cpu(&qx);
        fp8_tensor_free_cpu(&qw.q);
        free(y);
        free(yr);
    }
    free(x);
    free(w);
}
END_TEST

// FP8 model logits stay close to the fp32 ones: block is the most accurate
START_TEST(test_fp8_model_logits) {
    char p[1024];
    fixture(p, sizeof p, "qwen3", "");
    fixture(p, sizeof p, "qwen3", "tokens.npy");
    Npy tk = npy_read(p);
    fixture(p, sizeof p, "qwen3", "logits.npy");
    Npy lg = npy_read(p);
    int T = 24, V = 320, ids[24];
    for (int t = 0; t < T; t++) ids[t] = (int)tk.data[t];
    double rel[4];
    for (int g = FP8_OFF; g <= FP8_BLOCK; g++) {
        Model m;
        load_fixture(&m, "qwen3", (FP8Gran)g);
        model_forward(&m, NULL, ids, 1, T);
        float *out = (float *)mallocCheck((size_t)T * V * sizeof(float));
        model_logits(&m, out);
        double se = 0, sr = 0;
        for (int i = 0; i < T * V; i++) {
            se += (out[i] - lg.data[i]) * (out[i] - lg.data[i]);
            sr += lg.data[i] * lg.data[i];
        }
        rel[g] = sqrt(se / sr);
        free(out);
        model_free(&m);
    }
    printf("qwen3 logits relative error: off %.2e tensor %.2e row %.2e block %.2e\n", rel[0], rel[1], rel[2], rel[3]);
    ck_assert(rel[FP8_OFF] < 1e-6);
    // E4M3 keeps 3 mantissa bits: round-to-nearest leaves a relative error uniform in
    // +-2^-4, RMS 2^-4/sqrt(3) = 0.036, on each weight and each activation, so one FP8
    // GEMM's output carries ~sqrt(2) * 0.036 = 0.051 relative RMS error. The logits sit
    // behind 14 such GEMMs (2 layers x 7) whose errors add in quadrature through the
    // residual stream: sqrt(14) * 0.051 = 0.19. Quantization must also show (> 1e-3).
    for (int g = FP8_TENSOR; g <= FP8_BLOCK; g++) ck_assert_msg(rel[g] > 1e-3 && rel[g] < 0.19, "gran %d rel %g", g, rel[g]);
    npy_free(&tk);
    npy_free(&lg);
}
END_TEST

// ---- FP8 block against an independent simulation -------------------------------------

// relative L2 distance of the fixture model's logits (backend be, granularity g) from ref (T, V)
static double fp8sim_rel(const Backend *be, FP8Gran g, const Npy *tk, const Npy *ref) {
    char p[1024];
    fixture(p, sizeof p, "fp8sim", "");
    ModelOptions o = opt_dense();
    o.gran = g;
    Model m;
    model_load(&m, p, be, &o);
    int T = (int)tk->n, V = m.cfg.V, ids[64];
    ck_assert(T <= 64 && ref->n == (long)T * V);
    for (int t = 0; t < T; t++) ids[t] = (int)tk->data[t];
    model_forward(&m, NULL, ids, 1, T);
    float *out = (float *)mallocCheck((size_t)T * V * sizeof(float));
    model_logits(&m, out);
    double se = 0, sr = 0;
    for (long i = 0; i < ref->n; i++) se += (out[i] - ref->data[i]) * (out[i] - ref->data[i]), sr += ref->data[i] * ref->data[i];
    free(out);
    model_free(&m);
    return sqrt(se / sr);
}

// --load_in_fp8 block against test/fixtures/fp8sim (dev/make_fp8_sim_fixture.py): transformers'
// Qwen3 with every projection's weight in 128x128 blocks and its input in 1x128 groups, E4M3,
// scale amax / 448, fake-quantized by PyTorch; a bf16 checkpoint with edge groups and blocks of
// 64 everywhere (hidden 192, intermediate 704, k/v 64 rows) and exact E4M3 ties at the first
// quantizer (bf16 embeddings, norm weight 1). When both sides give every operand the same E4M3
// code and fp32 scale, the logits differ only by the order of the sums:
//  - fp64 (the cpu64 backend against the simulation in fp64; both round the quantizer's input to
//    fp32 first, and fp64 noise of 1e-16 never moves an fp32 rounding): every code agrees, what is
//    left is model_logits' rounding to fp32, 2^-24 per logit: 1e-6 is that with a margin.
//  - fp32 (the cpu backend, what train_grpo runs, against the simulation in fp32): sums of up to
//    704 products carry 2^-24 sqrt(704) = 1.6e-6 relative each, through 14 projections and the
//    attention: 1e-5. The script chose a checkpoint whose every quantized value lies >= 2.2x its
//    fp32 noise from an E4M3 rounding midpoint, so the two fp32 computations give the same codes.
// One code more or less (2^-4 of one activation) is far above both: it moves every later layer's
// inputs and the logits by 1e-3 to 5e-2 (the script's measurements; transformers' own RMSNorm
// rounding decides one layer-0 tie of this fixture otherwise and its logits are 4.5e-2 away). If
// the fp64 check passes and the fp32 one fails, fp32 arithmetic moved a value across a midpoint:
// FP8 rounding, not FP8 semantics (the script's docstring says why that happens at all).
START_TEST(test_fp8_block_matches_simulation) {
    char p[1024];
    fixture(p, sizeof p, "fp8sim", "tokens.npy");
    Npy tk = npy_read(p);
    fixture(p, sizeof p, "fp8sim", "logits64.npy");
    Npy l64 = npy_read(p);
    fixture(p, sizeof p, "fp8sim", "logits32.npy");
    Npy l32 = npy_read(p);
    double r64 = fp8sim_rel(backend_cpu64(), FP8_BLOCK, &tk, &l64), r32 = fp8sim_rel(backend_cpu(), FP8_BLOCK, &tk, &l32);
    double off = fp8sim_rel(backend_cpu(), FP8_OFF, &tk, &l64);
    printf("FP8 block vs the PyTorch simulation: fp64 %.2e, fp32 %.2e (unquantized vs it: %.2e, the FP8 error)\n", r64, r32, off);
    ck_assert_msg(r64 <= 1e-6, "cpu64 FP8 block logits %.3g from the fp64 simulation (> 1e-6): an E4M3 code or scale differs", r64);
    ck_assert_msg(r32 <= 1e-5, "cpu FP8 block logits %.3g from the fp32 simulation (> 1e-5)", r32);
    ck_assert_msg(off > 1e-2, "the fixture does not exercise FP8: unquantized logits only %.3g away", off);
    npy_free(&tk);
    npy_free(&l64);
    npy_free(&l32);
}
END_TEST

// ---- gradients: fp64 finite differences --------------------------------------------

// a small random model
static Config tiny_cfg(Arch arch) {
    Config c = {0};
    c.arch = arch;
    c.V = 23;
    c.C = 16;
    c.FF = 24;
    c.L = 2;
    c.NH = 4;
    c.KVH = 2;
    c.HD = 8;
    c.max_pos = 64;
    c.eps = 1e-5f;
    c.rope_theta = 100.0f;
    c.qkv_bias = arch == ARCH_QWEN2;
    c.qk_norm = arch == ARCH_QWEN3 || arch == ARCH_QWEN3_MOE || arch == ARCH_GEMMA3;
    c.tied = 0;
    c.bos_id = -1;
    if (arch == ARCH_MISTRAL) {  // a window of 3 in sequences of 7: most queries lose keys to it
        c.window = 3;
        for (int l = 0; l < c.L; l++) c.sliding[l] = 1;
    }
    if (arch == ARCH_GEMMA3) {  // layer 0 sliding with its own RoPE base, layer 1 full with linear scaling
        c.gemma = 1;
        c.window = 3;
        c.sliding[0] = 1;
        c.query_pre_attn_scalar = 5;
        c.rope_local_theta = 10.0f;
        c.rope_scaling = 2;
        c.rope_factor = 2.0f;
    }
    return c;
}

typedef struct {
    Model *m;
    const int *ids, *tg;
    const double *w;
    int B, T;
} FDCase;

static double fd_loss(FDCase *f) {
    int N = f->B * f->T;
    double *lp = (double *)mallocCheck(N * sizeof(double)), s = 0;
    model_forward(f->m, f->m->lora, f->ids, f->B, f->T);
    model_logprobs(f->m, f->tg, 0.7f, lp);
    for (int i = 0; i < N; i++) s += f->w[i] * lp[i];
    free(lp);
    return s;
}

// check analytic d loss / d p[i] against central differences for a few entries of p
static void fd_check(FDCase *f, double *p, const double *g, size_t n, const char *what, int samples) {
    Rng r = rng_make(n * 31 + samples);
    for (int k = 0; k < samples; k++) {
        size_t i = (size_t)rng_int(&r, (int)n);
        double old = p[i], h = 1e-5 * fmax(1.0, fabs(old));
        p[i] = old + h;
        double lp = fd_loss(f);
        p[i] = old - h;
        double lm = fd_loss(f);
        p[i] = old;
        double num = (lp - lm) / (2 * h), ana = g[i];
        double tol = 1e-6 * fmax(1.0, fabs(num)) + 1e-8;
        ck_assert_msg(fabs(num - ana) <= tol, "%s[%zu]: analytic %.10g, numeric %.10g", what, i, ana, num);
    }
}

static void gradient_check_cfg(Config c) {
    const Backend *be = backend_cpu64();
    Model m;
    ModelOptions o = opt_dense();
    model_init_random(&m, &c, be, &o, 11);
    // norms and biases away from their init so their gradients are generic
    Rng r = rng_make(3);
    double n0 = c.gemma ? 0 : 1;  // the norms' weights around the identity: Gemma's multiply by 1 + w
    for (int l = 0; l < c.L; l++) {
        LayerWeights *lw = &m.w.layers[l];
        for (int i = 0; i < c.C; i++) ((double *)lw->ln1)[i] = n0 + 0.3 * rng_normal(&r);
        for (int i = 0; i < c.C; i++) ((double *)lw->ln2)[i] = n0 + 0.3 * rng_normal(&r);
        if (c.gemma)
            for (int i = 0; i < c.C; i++) {
                ((double *)lw->ln_attn)[i] = 0.3 * rng_normal(&r);
                ((double *)lw->ln_mlp)[i] = 0.3 * rng_normal(&r);
            }
        if (c.qk_norm)
            for (int i = 0; i < c.HD; i++) {
                ((double *)lw->q_norm)[i] = n0 + 0.3 * rng_normal(&r);
                ((double *)lw->k_norm)[i] = n0 + 0.3 * rng_normal(&r);
            }
        if (c.qkv_bias)
            for (int i = 0; i < lw->lin[1].rows; i++) ((double *)lw->bias[1])[i] = 0.2 * rng_normal(&r);
    }
    // Qwen3 MoE: the attention's adapters and the experts' (PEFT's target_parameters)
    LoRA *lo = lora_create(&m, 3, 6.0f, lora_parse_targets("all") | (c.E ? LORA_EXPERTS : 0), 5, 0);
    // B = 0 at init would hide dA: give B random values
    for (size_t i = 0; i < lo->n; i++) ((double *)lo->params)[i] += 0.1 * rng_normal(&r);
    m.lora = lo;
    model_alloc_grads(&m);

    int B = 2, T = 7, N = B * T, ids[14], tg[14];
    double w[14];
    for (int i = 0; i < N; i++) {
        ids[i] = rng_int(&r, c.V);
        tg[i] = rng_int(&r, c.V);
        w[i] = rng_normal(&r);
    }
    tg[3] = -1;  // a masked position
    FDCase f = {&m, ids, tg, w, B, T};
    fd_loss(&f);
    lora_zero_grads(lo);
    model_zero_grads(&m);
    model_backward(&m, lo, w);
    {  // the head's backward in the logprobs' pass (model_logprobs_grad): the same gradients, bit for bit
        size_t nl = lo->n * sizeof(double), nd = m.gw.dense_bytes;
        void *gl = mallocCheck(nl), *gd = mallocCheck(nd);
        memcpy(gl, lo->grads, nl), memcpy(gd, m.gw.dense_mem, nd);
        double lp[14];
        lora_zero_grads(lo);
        model_zero_grads(&m);
        model_forward(&m, lo, ids, B, T);
        model_logprobs_grad(&m, tg, 0.7f, w, lp);  // (fd_loss's temperature)
        model_backward(&m, lo, NULL);
        ck_assert_msg(memcmp(gl, lo->grads, nl) == 0, "LoRA gradients through model_logprobs_grad differ");
        ck_assert_msg(memcmp(gd, m.gw.dense_mem, nd) == 0, "weight gradients through model_logprobs_grad differ");
        free(gl), free(gd);
    }

    fd_check(&f, (double *)lo->params, (const double *)lo->grads, lo->n, "lora", 12);
    for (int l = 0; l < c.L; l++) {
        LayerWeights *lw = &m.w.layers[l], *gl = &m.gw.layers[l];
        for (int i = 0; i < LIN_COUNT; i++)
            if (lw->lin[i].rows)  // (a sparse layer has no MLP of its own)
                fd_check(&f, (double *)lw->lin[i].dense, (const double *)gl->lin[i].dense,
                         (size_t)lw->lin[i].rows * lw->lin[i].cols, lin_names[i], 2);
        if (c.moe[l]) {  // the router, each expert's three weights, and the experts' adapters
            fd_check(&f, (double *)lw->router.dense, (const double *)gl->router.dense, (size_t)c.E * c.C, "router", 4);
            for (int j = 0; j < 2; j++) {
                size_t er = (size_t)c.E * lo->r;
                fd_check(&f, (double *)lo->eA[2 * l + j], (const double *)lo->edA[2 * l + j], er * lo->ein[j],
                         j ? "experts' down lora_A" : "experts' gate_up lora_A", 4);
                fd_check(&f, (double *)lo->eB[2 * l + j], (const double *)lo->edB[2 * l + j], er * lo->eout[j],
                         j ? "experts' down lora_B" : "experts' gate_up lora_B", 4);
            }
            for (int k = 0; k < 3 * c.E; k++)
                fd_check(&f, (double *)lw->experts[k].dense, (const double *)gl->experts[k].dense,
                         (size_t)lw->experts[k].rows * lw->experts[k].cols, "expert", 2);
        }
        fd_check(&f, (double *)lw->ln1, (const double *)gl->ln1, c.C, "ln1", 2);
        fd_check(&f, (double *)lw->ln2, (const double *)gl->ln2, c.C, "ln2", 2);
        if (c.gemma) {
            fd_check(&f, (double *)lw->ln_attn, (const double *)gl->ln_attn, c.C, "ln_attn", 2);
            fd_check(&f, (double *)lw->ln_mlp, (const double *)gl->ln_mlp, c.C, "ln_mlp", 2);
        }
        if (c.qk_norm) {
            fd_check(&f, (double *)lw->q_norm, (const double *)gl->q_norm, c.HD, "q_norm", 2);
            fd_check(&f, (double *)lw->k_norm, (const double *)gl->k_norm, c.HD, "k_norm", 2);
        }
        if (c.qkv_bias)
            for (int i = 0; i < 3; i++) fd_check(&f, (double *)lw->bias[i], (const double *)gl->bias[i], lw->lin[i].rows, "bias", 2);
    }
    fd_check(&f, (double *)m.w.norm, (const double *)m.gw.norm, c.C, "norm", 3);
    // the head, and the embeddings: rows that the batch reads (other rows have zero gradient)
    fd_check(&f, (double *)m.w.lm_head, (const double *)m.gw.lm_head, (size_t)c.V * c.C, "lm_head", 6);
    for (int k = 0; k < 4; k++) {
        double *row = (double *)m.w.wte + (size_t)ids[k * 3] * c.C;
        fd_check(&f, row, (const double *)m.gw.wte + (size_t)ids[k * 3] * c.C, c.C, c.tied ? "tied wte" : "wte", 2);
    }
    lora_free(lo);
    m.lora = NULL;
    model_free(&m);
}
static void gradient_check(Arch arch, int tied) {
    Config c = tiny_cfg(arch);
    c.tied = tied;
    gradient_check_cfg(c);
}

START_TEST(test_gradients_qwen3) { gradient_check(ARCH_QWEN3, 1); }
END_TEST
START_TEST(test_gradients_qwen2) { gradient_check(ARCH_QWEN2, 0); }
END_TEST
START_TEST(test_gradients_llama) { gradient_check(ARCH_LLAMA, 0); }
END_TEST
// the sliding window in the attention's backward (keys outside it get no gradient)
START_TEST(test_gradients_mistral) { gradient_check(ARCH_MISTRAL, 0); }
END_TEST
// the (1 + w) norms (the four of a layer, q/k and final), GeGLU, the embeddings' sqrt(C), a sliding and a
// full layer with their RoPE bases and query_pre_attn_scalar's scale
START_TEST(test_gradients_gemma3) { gradient_check(ARCH_GEMMA3, 1); }
END_TEST

// ---- Qwen3 MoE ---------------------------------------------------------------------------

// the two fixtures' config.json: experts, top-k, renormalization and which layers are sparse, both by
// mlp_only_layers and by decoder_sparse_step; what is wrong in one is said
START_TEST(test_moe_config) {
    Config c = fixture_config("qwen3_moe");  // transformers 5.x writes num_local_experts
    ck_assert_int_eq(c.arch, ARCH_QWEN3_MOE);
    ck_assert(c.E == 8 && c.K == 2 && c.FFe == 48 && c.norm_topk == 1 && c.FF == 160 && c.qk_norm && !c.tied);
    ck_assert(c.moe[0] == 1 && c.moe[1] == 0 && c.moe[2] == 1);  // mlp_only_layers [1]
    c = fixture_config("qwen3_moe16");
    ck_assert(c.E == 16 && c.K == 4 && c.FFe == 40 && c.norm_topk == 0);
    ck_assert(c.moe[0] == 0 && c.moe[1] == 1);  // decoder_sparse_step 2
#define MOE_BASE "{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8," \
                 "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_experts\":4"
    config_from_json(&c, MOE_BASE ",\"num_experts_per_tok\":4,\"mlp_only_layers\":[0]}", "x.json");
    ck_assert(c.E == 4 && c.K == 4 && c.FFe == 768 && !c.norm_topk && !c.moe[0] && c.moe[1]);  // transformers' defaults
    EXPECT_DIE(config_from_json(&c, MOE_BASE "}", "x.json"), "\"num_experts_per_tok\" is 8");  // its default, > 4
    EXPECT_DIE(config_from_json(&c, MOE_BASE ",\"num_experts_per_tok\":5}", "x.json"),
               "\"num_experts_per_tok\" is 5: it must be an integer in [1, 4]");
    EXPECT_DIE(config_from_json(&c, MOE_BASE ",\"num_experts_per_tok\":2,\"mlp_only_layers\":[2]}", "x.json"),
               "\"mlp_only_layers\" must list layer indices in [0, num_hidden_layers 2)");
    EXPECT_DIE(config_from_json(&c, MOE_BASE ",\"num_experts_per_tok\":2,\"mlp_only_layers\":3}", "x.json"), "must be a list of layer indices");
#undef MOE_BASE
}
END_TEST

// the largest difference between the full forward's logits full (B, T, V) of ids (B, T) and those of a
// prefill of 3 tokens, then a KV-cache decode step a token, blocks of 4, each row in turn; with m->lora's
// adapter (NULL: none; its act copies made here)
static double decode_vs_forward(Model *m, const int *ids, int B, int T, const float *full) {
    int V = m->cfg.V, BS = 4, MB = (T + BS - 1) / BS, P = 3, table[16], slots[64];
    ck_assert(MB <= 16 && T <= 64);
    float *dec = (float *)mallocCheck(V * sizeof(float));
    double derr = 0;
    if (m->lora) lora_sync_act(m->lora);
    KVCache kv;
    kvcache_alloc(&kv, m, MB, BS);
    for (int b = 0; b < MB; b++) table[b] = MB - 1 - b;
    for (int t = 0; t < T; t++) slots[t] = table[t / BS] * BS + t % BS;
    for (int row = 0; row < B; row++) {
        const int *rid = ids + row * T;
        model_prefill(m, m->lora, &kv, rid, &P, slots, 1, P, dec);
        for (int j = 0; j < V; j++) derr = fmax(derr, fabs(dec[j] - full[((size_t)row * T + P - 1) * V + j]));
        for (int t = P; t < T; t++) {
            model_decode(m, m->lora, &kv, &rid[t], &t, &slots[t], table, 1, MB, dec);
            for (int j = 0; j < V; j++) derr = fmax(derr, fabs(dec[j] - full[((size_t)row * T + t) * V + j]));
        }
    }
    kvcache_free(&kv, m->be);
    free(dec);
    return derr;
}

// the fixtures' logits within 1e-5 of transformers' (absolute; the logits are ~4), the routing spread over
// every expert (the fixture tests the router, not one expert); the KV-cache decode of every position equal
// to the full forward's logits of it
START_TEST(test_moe_logits_decode) {
    const char *archs[] = {"qwen3_moe", "qwen3_moe16"};
    for (int a = 0; a < 2; a++) {
        char p[1024];
        Model m;
        load_fixture(&m, archs[a], FP8_OFF);
        fixture(p, sizeof p, archs[a], "tokens.npy");
        Npy tk = npy_read(p);
        fixture(p, sizeof p, archs[a], "logits.npy");
        Npy lg = npy_read(p);
        int T = (int)tk.shape[1], V = m.cfg.V, B = 2, ids[48];
        for (int i = 0; i < B * T; i++) ids[i] = (int)tk.data[i];
        model_forward(&m, NULL, ids, B, T);
        float *full = (float *)mallocCheck((size_t)B * T * V * sizeof(float));
        model_logits(&m, full);
        double err = 0;
        for (long i = 0; i < lg.n; i++) err = fmax(err, fabs(full[i] - lg.data[i]));
        int l = m.cfg.moe[0] ? 0 : 1, hit[16] = {0}, nhit = 0;  // the first sparse layer's routing
        for (int i = 0; i < B * T * m.cfg.K; i++) hit[((int32_t *)m.acts.ridx)[(size_t)l * B * T * m.cfg.K + i]] = 1;
        for (int e = 0; e < m.cfg.E; e++) nhit += hit[e];
        double derr = decode_vs_forward(&m, ids, B, T, full);
        printf("%s: logits max |diff| from transformers %.3g; decode from the full forward %.3g; layer %d routes to %d "
               "of %d experts\n", archs[a], err, derr, l, nhit, m.cfg.E);
        ck_assert_msg(err <= 1e-5, "%s: logits max |diff| %g > 1e-5", archs[a], err);
        ck_assert_msg(derr <= 1e-5, "%s: decode max |diff| from the forward %g > 1e-5", archs[a], derr);
        ck_assert_int_eq(nhit, m.cfg.E);
        if (a == 0) {  // with PEFT's adapter on the attention and the experts: the decode's products take it too
            fixture(p, sizeof p, "peft", "qwen3_moe_experts_lora");
            m.lora = lora_load_peft(&m, p);
            model_forward(&m, m.lora, ids, B, T);
            model_logits(&m, full);
            derr = decode_vs_forward(&m, ids, B, T, full);
            printf("%s + adapter on the experts: decode from the full forward %.3g\n", archs[a], derr);
            ck_assert_msg(derr <= 1e-5, "%s + adapter: decode max |diff| from the forward %g > 1e-5", archs[a], derr);
            lora_free(m.lora);
            m.lora = NULL;
        }
        free(full);
        npy_free(&tk), npy_free(&lg);
        model_free(&m);
    }
}
END_TEST

// every layer sparse (Qwen3-30B-A3B's layout: no dense MLP buffers at all), random weights, experts in FP8
// blocks: the decode step equal to the full forward
START_TEST(test_moe_all_sparse_decode) {
    Config c = tiny_cfg(ARCH_QWEN3_MOE);
    c.E = 6, c.K = 2, c.FFe = 12, c.norm_topk = 1, c.moe[0] = c.moe[1] = 1;
    ModelOptions o = opt_dense();
    o.gran = FP8_BLOCK;
    Model m;
    model_init_random(&m, &c, backend_cpu(), &o, 5);
    Rng r = rng_make(4);
    int B = 2, T = 11, ids[22];
    for (int i = 0; i < B * T; i++) ids[i] = rng_int(&r, c.V);
    model_forward(&m, NULL, ids, B, T);
    ck_assert(m.acts.gate == NULL && m.acts.hmlp == NULL);  // no dense MLP anywhere
    float *full = (float *)mallocCheck((size_t)B * T * c.V * sizeof(float));
    model_logits(&m, full);
    double derr = decode_vs_forward(&m, ids, B, T, full);
    ck_assert_msg(derr <= 1e-5, "decode max |diff| from the forward %g", derr);
    free(full);
    model_free(&m);
}
END_TEST

// the experts held in FP8 at each granularity, each expert with scales of its own: the logits within the FP8
// error of transformers' (as test_fp8_model_logits: < 0.19 relative, and > 1e-3, quantization shows)
START_TEST(test_moe_fp8_granularities) {
    char p[1024];
    fixture(p, sizeof p, "qwen3_moe16", "tokens.npy");
    Npy tk = npy_read(p);
    fixture(p, sizeof p, "qwen3_moe16", "logits.npy");
    Npy lg = npy_read(p);
    int T = 24, V = 320, ids[24];
    for (int t = 0; t < T; t++) ids[t] = (int)tk.data[t];
    for (int g = FP8_TENSOR; g <= FP8_BLOCK; g++) {
        Model m;
        load_fixture(&m, "qwen3_moe16", (FP8Gran)g);
        const LayerWeights *lw = &m.w.layers[1];
        ck_assert(lw->router.gran == FP8_OFF && lw->router.dense);
        for (int k = 0; k < 3 * m.cfg.E; k++) {
            ck_assert_int_eq(lw->experts[k].gran, g);
            if (k) ck_assert(lw->experts[k].q.scale != lw->experts[k - 1].q.scale && lw->experts[k].q.data != lw->experts[k - 1].q.data);
        }
        ck_assert(lw->experts[0].q.scale[0] != lw->experts[3].q.scale[0]);  // expert 0's gate and expert 1's: own amaxes
        model_forward(&m, NULL, ids, 1, T);
        float *out = (float *)mallocCheck((size_t)T * V * sizeof(float));
        model_logits(&m, out);
        double se = 0, sr = 0;
        for (int i = 0; i < T * V; i++) se += (out[i] - lg.data[i]) * (out[i] - lg.data[i]), sr += lg.data[i] * lg.data[i];
        double rel = sqrt(se / sr);
        printf("qwen3_moe16 FP8 gran %d: logits relative error %.3g\n", g, rel);
        ck_assert_msg(rel > 1e-3 && rel < 0.19, "gran %d rel %g", g, rel);
        free(out);
        model_free(&m);
    }
    npy_free(&tk), npy_free(&lg);
}
END_TEST

// the published FP8 layout (dev/make_moe_fp8_fixture.py: E4M3 weight + F32 weight_scale_inv of 128 x 128
// blocks, every expert's own): --load_in_fp8 block takes each expert's codes and scales as they are;
// off dequantizes them, and its logits are transformers' on the dequantized weights within 1e-5
START_TEST(test_moe_published_fp8) {
    char p[1024];
    fixture(p, sizeof p, "qwen3_moe_fp8", "");
    SafeTensors st;
    st_open_dir(&st, p);
    Model m;
    load_fixture(&m, "qwen3_moe_fp8", FP8_BLOCK);
    for (int k = 0; k < 3 * m.cfg.E; k++) {
        const QWeight *w = &m.w.layers[1].experts[k];
        char nm[128];
        static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
        snprintf(nm, sizeof nm, "model.layers.1.mlp.experts.%d.%s.weight", k / 3, proj[k % 3]);
        const STensor *t = st_find(&st, nm);
        ck_assert(t && t->dtype == DT_E4M3);
        ck_assert_msg(!memcmp(w->q.data, t->data, (size_t)w->rows * w->cols), "%s: codes not read as they are", nm);
        strcat(nm, "_scale_inv");
        const STensor *s = st_find(&st, nm);
        int br = (w->rows + 127) / 128, bc = (w->cols + 127) / 128, ld = fp8_scale_ld(FP8_BLOCK, w->rows, w->cols, 128);
        for (int r = 0; r < br; r++)
            for (int c = 0; c < bc; c++) ck_assert(w->q.scale[r * ld + c] == ((const float *)s->data)[r * bc + c]);
    }
    model_free(&m);
    st_close(&st);

    load_fixture(&m, "qwen3_moe_fp8", FP8_OFF);
    fixture(p, sizeof p, "qwen3_moe_fp8", "tokens.npy");
    Npy tk = npy_read(p);
    fixture(p, sizeof p, "qwen3_moe_fp8", "logits.npy");
    Npy lg = npy_read(p);
    int B = 2, T = 24, V = 320, ids[48];
    for (int i = 0; i < B * T; i++) ids[i] = (int)tk.data[i];
    model_forward(&m, NULL, ids, B, T);
    float *out = (float *)mallocCheck((size_t)B * T * V * sizeof(float));
    model_logits(&m, out);
    double err = 0;
    for (long i = 0; i < lg.n; i++) err = fmax(err, fabs(out[i] - lg.data[i]));
    printf("qwen3_moe_fp8 dequantized: logits max |diff| from transformers %.3g\n", err);
    ck_assert_msg(err <= 1e-5, "max |diff| %g", err);
    free(out);
    npy_free(&tk), npy_free(&lg);
    model_free(&m);
}
END_TEST

// adapters on the attention alone: "all" (the default) becomes q, k, v, o; an MLP target is refused. A
// backend without the experts' ops refuses the checkpoint in one line.
START_TEST(test_moe_refusals) {
    Model m;
    load_fixture(&m, "qwen3_moe", FP8_OFF);
    LoRA *lo = lora_create(&m, 2, 4.0f, lora_parse_targets("all"), 1, 0);
    ck_assert_uint_eq(lo->targets, (1u << LIN_Q) | (1u << LIN_K) | (1u << LIN_V) | (1u << LIN_O));
    lora_free(lo);
    EXPECT_DIE(lora_create(&m, 2, 4.0f, lora_parse_targets("q_proj,gate_proj"), 1, 0),
               "LoRA on gate_proj, up_proj or down_proj of a qwen3_moe model is not supported");
    {  // the experts' adapters have no CUDA kernels: refused on any backend but the CPU's, before anything is made
        Model mc = m;
        Backend cuda = *m.be;
        cuda.name = "cuda";
        mc.be = &cuda;
        EXPECT_DIE(lora_create(&mc, 2, 4.0f, lora_parse_targets("all") | LORA_EXPERTS, 1, 0),
                   "LoRA on Qwen3 MoE's experts runs on the CPU backend only (no CUDA kernels for it yet): use --device cpu");
    }
    EXPECT_DIE(model_fp8_train(&m, &(FP8Recipe){0}), "qwen3_moe model is not supported: use --fp8_recipe off");
    model_free(&m);
    Backend nomoe = *backend_cpu();
    nomoe.moe_experts_forward = NULL;
    char p[1024];
    fixture(p, sizeof p, "qwen3_moe", "");
    ModelOptions o = opt_dense();
    EXPECT_DIE(model_load(&m, p, &nomoe, &o), "has no mixture-of-experts products yet");
}
END_TEST

// Qwen3 MoE: a sparse layer (router, softmax, top-k, the experts) then a dense one, or two sparse ones (as
// Qwen3-30B-A3B, every layer); with norm_topk_prob the gradient goes through the renormalization too. The
// routing choice itself has no gradient: the finite differences' steps (1e-5) are far below the gaps
// between the chosen and the other probabilities.
static void gradient_check_moe(int E, int K, int norm, int all_sparse) {
    Config c = tiny_cfg(ARCH_QWEN3_MOE);
    c.E = E, c.K = K, c.FFe = 10, c.norm_topk = norm;
    c.moe[0] = 1;
    c.moe[1] = all_sparse;
    gradient_check_cfg(c);
}
START_TEST(test_gradients_qwen3_moe_norm) { gradient_check_moe(4, 2, 1, 0); }
END_TEST
START_TEST(test_gradients_qwen3_moe) { gradient_check_moe(5, 3, 0, 1); }
END_TEST

// recomputation (gradient checkpointing, or of gate and up alone: Model.recompute_mlp) changes memory, not
// numbers: the same logprobs and bit-identical gradients (LoRA and dense), on the fp32 CPU backend, FP8 weights
static void recompute_identical(const char *arch) {
    Model m;
    load_fixture(&m, arch, FP8_BLOCK);
    LoRA *lo = lora_create(&m, 4, 8.0f, lora_parse_targets("all") | (m.cfg.E ? LORA_EXPERTS : 0), 2, 0);  // (MoE: the experts')
    Rng r = rng_make(9);
    for (size_t i = 0; i < lo->n; i++) ((float *)lo->params)[i] += 0.05f * rng_normal(&r);
    m.lora = lo;
    int B = 2, T = 9, N = B * T, ids[18], tg[18];
    double w[18], lp[3][18];
    for (int i = 0; i < N; i++) ids[i] = rng_int(&r, 320), tg[i] = rng_int(&r, 320), w[i] = rng_normal(&r);
    float *g[3];
    size_t arena[3];
    for (int rc = 0; rc < 3; rc++) {
        m.recompute = rc == 1;
        m.recompute_mlp = rc == 2;
        model_forward(&m, lo, ids, B, T);
        model_logprobs(&m, tg, 1.0f, lp[rc]);
        lora_zero_grads(lo);
        model_backward(&m, lo, w);
        g[rc] = (float *)mallocCheck(lo->n * sizeof(float));
        memcpy(g[rc], lo->grads, lo->n * sizeof(float));
        arena[rc] = m.acts.bytes;
        model_free_scratch(&m);
    }
    for (int rc = 1; rc < 3; rc++) {
        ck_assert(memcmp(lp[0], lp[rc], sizeof lp[0]) == 0);
        ck_assert(memcmp(g[0], g[rc], lo->n * sizeof(float)) == 0);
        ck_assert_msg(arena[rc] < arena[0], "recompute arena %zu not smaller than %zu", arena[rc], arena[0]);
        free(g[rc]);
    }
    free(g[0]);
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
}
START_TEST(test_recompute_identical) { recompute_identical("qwen3"); }
END_TEST
// Qwen3 MoE: the sparse layers' routing and experts' products again in the backward (FP8 block experts, LoRA
// on the attention and the experts)
START_TEST(test_recompute_identical_moe) { recompute_identical("qwen3_moe"); }
END_TEST

// ---- round trips and bad input -------------------------------------------------------

// model_save_hf then model_load: the same logits bit for bit; Mistral's and Gemma 3's config.json
// (sliding windows, layer types, RoPE bases and scaling, query_pre_attn_scalar) and Gemma's norm names
// survive it (12 tokens: past both windows)
START_TEST(test_save_load_roundtrip) {
    // gemma3_mm*: model_save_hf writes Gemma3ForConditionalGeneration's config.json and the text model under the
    // naming it was read in (what bench_grpo --save makes of the gemma3-4b / 27b shapes)
    const char *archs[] = {"qwen2", "mistral", "gemma3", "gemma3_mm", "gemma3_mm_v5", "qwen3_moe", "qwen3_moe16"};
    for (int a_ = 0; a_ < 5; a_++) {
        char p[1024];
        fixture(p, sizeof p, archs[a_], "");
        Model m, m2;
        ModelOptions o = opt_dense();
        model_load(&m, p, backend_cpu(), &o);
        char dir[] = "/tmp/fp8grpo_test_saveXXXXXX";
        ck_assert(mkdtemp(dir));
        model_save_hf(&m, dir, DT_F32);
        model_load(&m2, dir, backend_cpu(), &o);
        ck_assert_msg(!memcmp(&m.cfg, &m2.cfg, sizeof m.cfg), "%s: config.json changed in the round trip", archs[a_]);
        int ids[12] = {1, 5, 9, 44, 300, 2, 7, 8, 100, 200, 3, 4};
        model_forward(&m, NULL, ids, 1, 12);
        model_forward(&m2, NULL, ids, 1, 12);
        float *a = (float *)mallocCheck(12 * 320 * 4), *b = (float *)mallocCheck(12 * 320 * 4);
        model_logits(&m, a);
        model_logits(&m2, b);
        ck_assert_msg(memcmp(a, b, 12 * 320 * 4) == 0, "%s: logits changed in the round trip", archs[a_]);
        free(a);
        free(b);
        if (m.cfg.mm) ck_assert_int_eq(assert_whole_checkpoint(p, dir), 34);  // the vision tower as the base holds it
        model_free(&m);
        model_free(&m2);
        char cmd[1100];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
}
END_TEST

// write a copy of a good single-file fixture with one byte range replaced
static void write_variant(const char *dst, const char *src, size_t off, const void *bytes, size_t n, size_t truncate_to) {
    size_t len;
    char *d = read_file(src, &len);
    if (bytes) memcpy(d + off, bytes, n);
    if (truncate_to) len = truncate_to;
    FILE *f = fopen(dst, "wb");
    fwrite(d, 1, len, f);
    fclose(f);
    free(d);
}

static void header_variant(const char *dst, const char *src, const char *from, const char *to) {
    // replace text inside the JSON header, keeping its length (pad with spaces)
    size_t len;
    char *d = read_file(src, &len);
    uint64_t hl;
    memcpy(&hl, d, 8);
    char *h = d + 8, *at = NULL;
    for (size_t i = 0; i + strlen(from) <= hl; i++)
        if (!memcmp(h + i, from, strlen(from))) { at = h + i; break; }
    ck_assert_msg(at, "fixture header lacks %s", from);
    ck_assert(strlen(to) <= strlen(from));
    memset(at, ' ', strlen(from));
    memcpy(at, to, strlen(to));
    FILE *f = fopen(dst, "wb");
    fwrite(d, 1, len, f);
    fclose(f);
    free(d);
}

// bench_grpo --save's gemma3-4b / 27b (a model made here, no checkpoint read): Gemma3ForConditionalGeneration's
// config.json (the published vision_config, the image ids) and the text model under transformers 4.x's names,
// which load back as the same model
START_TEST(test_save_multimodal_made_here) {
    Config c = fixture_config("gemma3_mm");
    c.mm = MM_V4;
    Model m, m2;
    ModelOptions o = opt_dense();
    model_init_random(&m, &c, backend_cpu(), &o, 7);
    char dir[] = "/tmp/fp8grpo_test_savemmXXXXXX", p[1200];
    ck_assert(mkdtemp(dir));
    model_save_hf(&m, dir, DT_BF16);
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *text = read_file(p, NULL);
    cJSON *r = cJSON_Parse(text);
    ck_assert_str_eq(cJSON_GetObjectItem(r, "model_type")->valuestring, "gemma3");
    ck_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "architectures"), 0)->valuestring, "Gemma3ForConditionalGeneration");
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "vision_config"), "hidden_size")->valueint, 1152);
    ck_assert_int_eq(cJSON_GetObjectItem(r, "image_token_index")->valueint, 319);
    cJSON_Delete(r);
    free(text);
    model_load(&m2, dir, backend_cpu(), &o);
    ck_assert_int_eq(m2.cfg.mm, MM_V4);
    ck_assert_msg(!memcmp(&m.cfg, &m2.cfg, sizeof m.cfg), "config.json changed in the round trip");
    SafeTensors st;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_open(&st, p);
    ck_assert(st_find(&st, "language_model.model.layers.2.mlp.down_proj.weight"));
    for (int i = 0; i < st.n; i++) ck_assert_msg(!strncmp(st.t[i].name, "language_model.model.", 21), "%s", st.t[i].name);
    st_close(&st);
    model_free(&m);
    model_free(&m2);
    snprintf(p, sizeof p, "rm -rf %s", dir);
    ck_assert_int_eq(system(p), 0);
}
END_TEST

START_TEST(test_bad_safetensors) {
    char src[1024], dir[] = "/tmp/fp8grpo_test_badXXXXXX", p[1200], cfg[1024], cp[1200];
    fixture(src, sizeof src, "qwen2", "model.safetensors");
    fixture(cfg, sizeof cfg, "qwen2", "config.json");
    ck_assert(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(cp, sizeof cp, "%s/config.json", dir);
    size_t n;
    char *c = read_file(cfg, &n);
    write_file_atomic(cp, c, n);
    free(c);
    SafeTensors st;
    // truncated: shorter than the 8-byte length
    write_variant(p, src, 0, NULL, 0, 5);
    EXPECT_DIE(st_open(&st, p), "truncated");
    // header length beyond the file
    uint64_t big = 1ull << 40;
    write_variant(p, src, 0, &big, 8, 0);
    EXPECT_DIE(st_open(&st, p), "past the end");
    // data cut short: offsets beyond the data section
    size_t len;
    free(read_file(src, &len));
    write_variant(p, src, 0, NULL, 0, len - 100);
    EXPECT_DIE(st_open(&st, p), "beyond the data section");
    // unknown dtype
    header_variant(p, src, "\"BF16\"", "\"Q4\"");
    EXPECT_DIE(st_open(&st, p), "unsupported dtype");
    // malformed JSON header
    header_variant(p, src, "\"dtype\"", "\"dtype");
    EXPECT_DIE(st_open(&st, p), "not valid JSON");
    // a tensor's size that disagrees with its shape
    header_variant(p, src, "\"shape\":[320,64]", "\"shape\":[320,63]");
    EXPECT_DIE(st_open(&st, p), "bytes of data");
    // overlapping tensors: point the first entry's offsets at [0, ...] twice
    {
        size_t L;
        char *d = read_file(src, &L);
        uint64_t hl;
        memcpy(&hl, d, 8);
        char *h = (char *)callocCheck(hl + 1, 1);
        memcpy(h, d + 8, hl);
        // find two entries of the same size (all norm weights are (64,) bf16 = 128 bytes) and make one reuse the other's offsets
        char *a = strstr(h, "input_layernorm.weight");
        char *b = a ? strstr(a + 1, "input_layernorm.weight") : NULL;
        ck_assert(a && b);
        char *ao = strstr(a, "data_offsets\":["), *bo = strstr(b, "data_offsets\":[");
        char *ae = strchr(ao, ']'), *bee = strchr(bo, ']');
        size_t al = ae - ao, bl = bee - bo;
        ck_assert(al <= bl);
        char tmp[128];
        memcpy(tmp, ao, al);
        memset(bo, ' ', bl);
        memcpy(bo, tmp, al);
        // spaces inside the array before ']' are valid JSON
        memcpy(d + 8, h, hl);
        FILE *f = fopen(p, "wb");
        fwrite(d, 1, L, f);
        fclose(f);
        free(d);
        free(h);
    }
    EXPECT_DIE(st_open(&st, p), "overlap");
    // missing file
    snprintf(p, sizeof p, "%s/nonexistent.safetensors", dir);
    EXPECT_DIE(st_open(&st, p), "cannot open");
    // a directory with config.json but no weights
    Model m;
    ModelOptions o = opt_dense();
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    remove(p);
    EXPECT_DIE(model_load(&m, dir, backend_cpu(), &o), "no *.safetensors");
}
END_TEST

START_TEST(test_bad_checkpoint) {
    char src[1024], dir[] = "/tmp/fp8grpo_test_ckXXXXXX", p[1200], cfgp[1024], cp[1200];
    ck_assert(mkdtemp(dir));
    fixture(src, sizeof src, "qwen2", "model.safetensors");
    fixture(cfgp, sizeof cfgp, "qwen2", "config.json");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(cp, sizeof cp, "%s/config.json", dir);
    size_t n;
    char *cfg = read_file(cfgp, &n), *w = read_file(src, NULL);
    Model m;
    ModelOptions o = opt_dense();
    // no config.json
    write_variant(p, src, 0, NULL, 0, 0);
    EXPECT_DIE(model_load(&m, dir, backend_cpu(), &o), "no config.json");
    // config.json that disagrees with the tensors' shapes
    char *bad = str_dup(cfg);
    char *at = strstr(bad, "\"intermediate_size\": 160");
    ck_assert(at);
    memcpy(at, "\"intermediate_size\": 176", 24);
    write_file_atomic(cp, bad, strlen(bad));
    EXPECT_DIE(model_load(&m, dir, backend_cpu(), &o), "config.json implies");
    // a missing tensor (renamed in the header)
    write_file_atomic(cp, cfg, n);
    header_variant(p, src, "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weighX");
    EXPECT_DIE(model_load(&m, dir, backend_cpu(), &o), "missing tensor model.layers.1.mlp.up_proj.weight");
    // unsupported architecture
    char *gpt = str_dup(cfg);
    at = strstr(gpt, "\"qwen2\"");
    memcpy(at, "\"gpt99\"", 7);
    write_file_atomic(cp, gpt, strlen(gpt));
    EXPECT_DIE(model_load(&m, dir, backend_cpu(), &o), "unsupported architecture");
    // malformed config JSON
    write_file_atomic(cp, cfg, n / 2);
    EXPECT_DIE(model_load(&m, dir, backend_cpu(), &o), "not valid JSON");
    free(cfg);
    free(bad);
    free(gpt);
    free(w);
}
END_TEST

// a file for a child program's stderr, this process's own: test runs side by side on one machine
// (two CI runs, say) must not read each other's (removed at exit)
static void err_file_remove(void);
static char err_path[] = "/tmp/fp8grpo_errXXXXXX";
static const char *err_file(void) {
    static int made;
    if (!made) {
        int fd = mkstemp(err_path);
        ck_assert_msg(fd >= 0, "mkstemp %s failed", err_path);
        close(fd);
        atexit(err_file_remove);
        made = 1;
    }
    return err_path;
}
static void err_file_remove(void) { unlink(err_path); }

// the inference program: a bad flag is a one-line error and a non-zero exit
START_TEST(test_generate_cli) {
    char cmd[2048], p[1024];
    fixture(p, sizeof p, "qwen3", "");
    snprintf(cmd, sizeof cmd, "./generate --no-such-flag 2>%s", err_file());
    ck_assert_int_ne(system(cmd), 0);
    char *e = read_file(err_file(), NULL);
    ck_assert_msg(strstr(e, "unknown option --no-such-flag"), "stderr: %s", e);
    free(e);
    snprintf(cmd, sizeof cmd, "./generate --model %s --tokens '1 2 x' 2>/dev/null", p);
    ck_assert_int_ne(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "./generate --model %s --tokens '1 2 3' --load_in_fp8 int4 2>%s", p, err_file());
    ck_assert_int_ne(system(cmd), 0);
    e = read_file(err_file(), NULL);
    ck_assert_msg(strstr(e, "--load_in_fp8: unknown value 'int4': use block, row, tensor or off"), "stderr: %s", e);
    free(e);
    snprintf(cmd, sizeof cmd, "./generate --model %s --tokens '1 2 3' --max_new_tokens -1 2>/dev/null", p);
    ck_assert_int_ne(system(cmd), 0);
    // --help: every option with its default, the FP8 default the same as train_grpo's
    FILE *f = popen("./generate --help", "r");
    char help[8192] = "";
    size_t hn = fread(help, 1, sizeof help - 1, f);
    help[hn] = 0;
    ck_assert_int_eq(pclose(f), 0);
    ck_assert_msg(strstr(help, "--load_in_fp8 block|row|tensor|off") && strstr(help, "(default: block)"), "%s", help);
    ck_assert_msg(strstr(help, "--max_new_tokens N") && strstr(help, "(default: 16)"), "%s", help);
    ck_assert_msg(strstr(help, "--print_ids"), "%s", help);
    // greedy continuation from the command line equals transformers' (unquantized weights, as the
    // fixture); every spelling of a name and --name=value give the same ids
    char q[1024], toks[256] = "";
    fixture(q, sizeof q, "qwen3", "tokens.npy");
    Npy tk = npy_read(q);
    for (int t = 0; t < 8; t++) snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%d ", (int)tk.data[t]);
    fixture(q, sizeof q, "qwen3", "generate.npy");
    Npy gen = npy_read(q);
    char want[512] = "";
    for (int t = 0; t < gen.n; t++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", t ? " " : "", (int)gen.data[t]);
    const char *spellings[] = {"--load_in_fp8 off --print_ids --max_new_tokens 8", "--load-in-fp8 off --print-ids --max-new-tokens 8",
                               "--load_in_fp8=off --print_ids=true --max-new_tokens=8"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s %s --tokens \"%s\" 2>/dev/null", p, spellings[i], toks);
        f = popen(cmd, "r");
        char line[512] = "";
        ck_assert(fgets(line, sizeof line, f) != NULL);
        ck_assert_int_eq(pclose(f), 0);
        line[strcspn(line, "\n")] = 0;
        ck_assert_msg(!strcmp(line, want), "%s: '%s', want '%s'", spellings[i], line, want);
    }
    npy_free(&tk);
    npy_free(&gen);
}
END_TEST

// ./generate --fp8_embeddings and --kv_cache_dtype fp8 reach the model: its ids and logits are the
// library's with the same settings (the FP8 table and cache themselves are tested in test_fp8 and
// test_rollout), and the FP8 table changes the logits
START_TEST(test_generate_frozen_settings) {
    char p[1024], q[1024], cmd[4096], toks[256] = "", dir[] = "/tmp/fp8grpo_genXXXXXX";
    ck_assert(mkdtemp(dir));
    fixture(p, sizeof p, "qwen3", "");
    fixture(q, sizeof q, "qwen3", "tokens.npy");
    Npy tk = npy_read(q);
    int P = 8, ids[8];
    for (int t = 0; t < P; t++) ids[t] = (int)tk.data[t], snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%d ", ids[t]);
    Model m;
    ModelOptions o = opt_dense();
    o.fp8_embed = 1;
    model_load(&m, p, backend_cpu(), &o);
    m.kv_fp8 = 1;
    // the library: greedy, 8 new tokens (or to an end token) over an FP8 cache
    char want[512] = "";
    int slots[32], table[2] = {0, 1}, n = P;
    for (int t = 0; t < 32; t++) slots[t] = t;
    KVCache kv;
    kvcache_alloc(&kv, &m, 2, 16);
    float *lg = (float *)mallocCheck(m.cfg.V * sizeof(float)), lp;
    uint64_t rng = 1;
    model_prefill(&m, NULL, &kv, ids, &n, slots, 1, P, lg);
    for (int t = 0; t < 8; t++) {
        int32_t next;
        m.be->sample(&next, &lp, lg, &rng, 1, m.cfg.V, 0.0f, 0, 1.0f);
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", t ? " " : "", next);
        int eos = 0;
        for (int e = 0; e < m.cfg.n_eos; e++) eos |= next == m.cfg.eos_ids[e];
        if (eos) break;
        int pos = P + t;
        model_decode(&m, NULL, &kv, &next, &pos, &slots[pos], table, 1, 2, lg);
    }
    kvcache_free(&kv, m.be);
    snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s --load_in_fp8 off --fp8_embeddings --kv_cache_dtype fp8 "
             "--print_ids --max_new_tokens 8 --tokens \"%s\" 2>/dev/null", p, toks);
    FILE *f = popen(cmd, "r");
    char line[512] = "";
    ck_assert(fgets(line, sizeof line, f) != NULL);
    ck_assert_int_eq(pclose(f), 0);
    line[strcspn(line, "\n")] = 0;
    ck_assert_msg(!strcmp(line, want), "generate with an FP8 table and cache: '%s', the library's '%s'", line, want);
    // teacher-forced logits: with --fp8_embeddings the library's with the FP8 table, and not the dense table's
    float *lib = (float *)mallocCheck((size_t)P * m.cfg.V * sizeof(float));
    model_forward(&m, NULL, ids, 1, P);
    model_logits(&m, lib);
    const char *flags[] = {"--fp8_embeddings", ""};
    float diff[2];
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s --load_in_fp8 off %s --tokens \"%s\" --dump_logits %s/l%d.npy "
                 "2>/dev/null", p, flags[i], toks, dir, i);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(q, sizeof q, "%s/l%d.npy", dir, i);
        Npy l = npy_read(q);
        ck_assert_int_eq((int)l.n, P * m.cfg.V);
        diff[i] = 0;
        for (long j = 0; j < l.n; j++) diff[i] = fmaxf(diff[i], (float)fabs(l.data[j] - lib[j]));
        npy_free(&l);
    }
    ck_assert_msg(diff[0] == 0.0f, "--dump_logits --fp8_embeddings differs from the library's by %g", diff[0]);
    ck_assert_msg(diff[1] > 0.0f, "the FP8 table changed no logit");
    free(lib);
    free(lg);
    npy_free(&tk);
    model_free(&m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

// A tokenizer.json of another checkpoint (ids up to 606 against vocab_size 320) is said at
// load, in one line naming both, before any weight is read: not "token id out of range" later
START_TEST(test_tokenizer_checkpoint_disagree) {
    char dir[] = "/tmp/fp8grpo_tokXXXXXX", rel[1024], q[PATH_MAX], t[1024], cmd[3 * PATH_MAX];
    ck_assert(mkdtemp(dir));
    fixture(rel, sizeof rel, "qwen3", "");
    ck_assert(realpath(rel, q));  // the links' targets absolute (FIXTURES is absolute in make test SAN=1)
    fixture(t, sizeof t, "tokenizer/gpt2", "tokenizer.json");
    snprintf(cmd, sizeof cmd, "ln -s %s/config.json %s/model.safetensors %s/ && cp %s %s/", q, q, dir, t, dir);
    ck_assert_int_eq(system(cmd), 0);
    const char *args[] = {"--prompt hello", "--tokens '1 2 3'", "--prompt hello --load_in_fp8 off --device cpu"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "./generate --model %s %s >/dev/null 2>%s/err.txt", dir, args[i], dir);
        ck_assert_int_ne(system(cmd), 0);
        snprintf(cmd, sizeof cmd, "%s/err.txt", dir);
        char *e = read_file(cmd, NULL);
        ck_assert_msg(strstr(e, "tokenizer.json has ids up to 606 but config.json's vocab_size is 320: the tokenizer and "
                                "the checkpoint disagree") && !strncmp(e, "error: ", 7) && strchr(e, '\n') == e + strlen(e) - 1,
                      "%s: stderr '%s'", args[i], e);
        ck_assert_msg(!strstr(e, "backend"), "the check came after the backend and the weights: %s", e);
        free(e);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

// Without a GPU the reason says so plainly: where the NVIDIA driver (libcuda.so.1) is not
// installed, "no NVIDIA GPU/driver found", not CUDA's "driver version is insufficient for CUDA
// runtime version" (what cudaGetDeviceCount reports then). A build without nvcc has the stub's
// reason; a machine with a GPU has nothing to check.
START_TEST(test_no_gpu_reason) {
    char why[256] = "";
    if (backend_cuda(why, sizeof why)) return;
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h) {
        dlclose(h);
        return;  // a driver without a GPU, or another error: reported as CUDA gives it
    }
    printf("no GPU: %s\n", why);
    ck_assert_msg(strstr(why, "no NVIDIA GPU/driver found: the NVIDIA driver's libcuda.so.1 is not installed") ||
                      strstr(why, "this build has no CUDA backend"),
                  "why: '%s'", why);
    ck_assert_msg(!strstr(why, "insufficient"), "why: '%s'", why);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "./generate --model test/fixtures/qwen3 --tokens 1 --device cuda 2>%s", err_file());
    ck_assert_int_ne(system(cmd), 0);
    char *e = read_file(err_file(), NULL);
    ck_assert_msg(strstr(e, "error: --device cuda: ") && strstr(e, why) && strchr(e, '\n') == e + strlen(e) - 1, "stderr '%s'", e);
    free(e);
}
END_TEST

// Full-weight and FP8 training say in one line when they cannot run: a model that does not fit with
// its fp32 gradients, masters and moments (how much it needs, and LoRA as the way on), FP8 training
// on the CPU backend, and an FP8 (frozen) checkpoint
static size_t tiny_capacity(void) { return 64 * 1024; }
static size_t no_use(size_t *peak) {
    if (peak) *peak = 0;
    return 0;
}
START_TEST(test_full_training_refusals) {
    Model m;
    load_fixture(&m, "qwen3", FP8_OFF);
    Backend small = *m.be;  // the CPU backend, as if it were a device with 64 KiB
    small.mem_capacity = tiny_capacity;
    small.mem_in_use = no_use;
    const Backend *real = m.be;
    m.be = &small;
    FullTrainer ft;
    EXPECT_DIE(full_init(&ft, &m), "full-weight training needs");
    ck_assert_msg(strstr(testutil_err, "16 bytes a parameter") && strstr(testutil_err, "--use_peft"), "%s", testutil_err);
    m.be = real;
    FP8Recipe r = fp8_recipe_default();
    EXPECT_DIE(model_fp8_train(&m, &r), "FP8 training (--fp8_recipe) runs on the GPU");
    model_free(&m);
    load_fixture(&m, "qwen3", FP8_BLOCK);
    EXPECT_DIE(full_init(&ft, &m), "--load_in_fp8 off");
    model_free(&m);
}
END_TEST

static Suite *model_suite(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_config_fixtures);
    tcase_add_test(tc, test_config_v4_keys);
    tcase_add_test(tc, test_config_bad);
    tcase_add_test(tc, test_config_gemma3_v4);
    tcase_add_test(tc, test_config_gemma3_multimodal);
    tcase_add_test(tc, test_gemma3_multimodal_logits);
    tcase_add_test(tc, test_inv_freq);
    tcase_add_test(tc, test_logits_full_forward);
    tcase_add_test(tc, test_logprobs_match_logits);
    tcase_add_test(tc, test_logits_decode);
    tcase_add_test(tc, test_decode_batched);
    tcase_add_test(tc, test_greedy_generation);
    tcase_add_test(tc, test_fp8_linear_matches_reference_gemm);
    tcase_add_test(tc, test_fp8_model_logits);
    tcase_add_test(tc, test_fp8_block_matches_simulation);
    tcase_add_test(tc, test_gradients_qwen3);
    tcase_add_test(tc, test_gradients_qwen2);
    tcase_add_test(tc, test_gradients_llama);
    tcase_add_test(tc, test_gradients_mistral);
    tcase_add_test(tc, test_gradients_gemma3);
    tcase_add_test(tc, test_recompute_identical);
    tcase_add_test(tc, test_save_load_roundtrip);
    tcase_add_test(tc, test_save_multimodal_made_here);
    tcase_add_test(tc, test_bad_safetensors);
    tcase_add_test(tc, test_bad_checkpoint);
    tcase_add_test(tc, test_generate_cli);
    tcase_add_test(tc, test_generate_frozen_settings);
    tcase_add_test(tc, test_tokenizer_checkpoint_disagree);
    tcase_add_test(tc, test_no_gpu_reason);
    tcase_add_test(tc, test_full_training_refusals);
    suite_add_tcase(s, tc);
    TCase *moe = tcase_create("qwen3_moe");  // CK_RUN_CASE=qwen3_moe runs these alone
    tcase_set_timeout(moe, 600);
    tcase_add_test(moe, test_moe_config);
    tcase_add_test(moe, test_moe_logits_decode);
    tcase_add_test(moe, test_moe_all_sparse_decode);
    tcase_add_test(moe, test_moe_fp8_granularities);
    tcase_add_test(moe, test_moe_published_fp8);
    tcase_add_test(moe, test_moe_refusals);
    tcase_add_test(moe, test_recompute_identical_moe);
    tcase_add_test(moe, test_decode_batched_moe);
    tcase_add_test(moe, test_gradients_qwen3_moe_norm);
    tcase_add_test(moe, test_gradients_qwen3_moe);
    suite_add_tcase(s, moe);
    return s;
}

int main(void) { return run_suite(model_suite()); }
