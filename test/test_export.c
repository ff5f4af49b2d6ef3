// test/test_export.c: ./export, the merged checkpoints (export.c). Runs the program on the fixture
// models (qwen3 + the adapter peft made, qwen2, the sharded llama3) and checks what it wrote against
// numbers computed here from the input files:
//   - BF16: every tensor equals the fp64 merge W + (alpha / r) B A rounded once to BF16 (bit for bit),
//     and the logits of the export, loaded back, equal base + adapter applied unmerged within the
//     error that rounding every weight to BF16 brings (derived below);
//   - FP8: loaded back (codes and scales taken as they are), the same codes, scales, weights and
//     logits, bit for bit, as --load_in_fp8 block quantizing the merged weights at load;
//   - shards and model.safetensors.index.json; the tokenizer files copied;
//   - atomicity: an export that fails while writing leaves no directory, or the old one untouched;
//   - bad inputs: one line each, a non-zero exit, nothing written.
#include <check.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp8.h"
#include "lora.h"
#include "model.h"
#include "testutil.h"
#include "io/safetensors.h"

static char tmp[64];  // this suite's scratch directory (per test: Check forks each)

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/fp8grpo_exportXXXXXX");
    ck_assert(mkdtemp(tmp));
}
static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    ck_assert_int_eq(system(cmd), 0);
}

// run ./export with args; returns the exit status, *err what it printed on stderr (malloc'ed)
static int run_export(const char *args, char **err) {
    char cmd[4200], ep[128];
    snprintf(ep, sizeof ep, "%s/stderr.txt", tmp);
    snprintf(cmd, sizeof cmd, "./export %.4000s >/dev/null 2>%s", args, ep);
    int rc = system(cmd);
    char *e = read_file(ep, NULL);
    if (err) *err = e;
    else free(e);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}
static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}
// nothing in tmp but stderr.txt and the names given (no leftover DIR.tmp-*, DIR.old-*)
static void assert_only(const char *a, const char *b) {
    DIR *d = opendir(tmp);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        ck_assert_msg(!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "stderr.txt") || (a && !strcmp(n, a)) || (b && !strcmp(n, b)),
                      "left behind: %s/%s", tmp, n);
    }
    closedir(d);
}

// ----------------------------------------------------------------------------
// what the export should hold, computed here from the input files

// the nearest BF16 to x (ties to even), found by comparing candidates in fp64: independent of the
// round-to-odd trick export.c uses
static uint16_t bf16_nearest(double x) {
    uint16_t c = f32_to_bf16((float)x), best = c;
    double bd = fabs((double)bf16_to_f32(c) - x);
    for (int k = -1; k <= 1; k += 2) {
        uint16_t n = (uint16_t)(c + k);
        double d = fabs((double)bf16_to_f32(n) - x);
        if (d < bd || (d == bd && !(n & 1))) best = n, bd = d;
    }
    return best;
}

// The merged value of every element of base tensor t (fp64): the adapter's B A added where it has one
typedef struct {
    SafeTensors base, ad;
    double scale;  // alpha / r
    int has_ad;
} Inputs;

// model and lora: directories (lora NULL: none)
static void inputs_open(Inputs *in, const char *model, const char *lora) {
    memset(in, 0, sizeof *in);
    st_open_dir(&in->base, model);
    if (!lora) return;
    in->has_ad = 1;
    char q[1100];
    snprintf(q, sizeof q, "%s/adapter_model.safetensors", lora);
    st_open(&in->ad, q);
    snprintf(q, sizeof q, "%s/adapter_config.json", lora);
    char *text = read_file(q, NULL);
    cJSON *r = cJSON_Parse(text);
    in->scale = cJSON_GetObjectItem(r, "lora_alpha")->valuedouble / cJSON_GetObjectItem(r, "r")->valuedouble;
    cJSON_Delete(r);
    free(text);
}
static void inputs_close(Inputs *in) {
    st_close(&in->base);
    if (in->has_ad) st_close(&in->ad);
}

static double *merged(const Inputs *in, const STensor *t) {
    double *x = (double *)mallocCheck(t->numel * sizeof(double));
    convert_to_f64(x, t->data, t->dtype, t->numel);
    if (!in->has_ad) return x;
    char an[256], bn[256];
    size_t L = strlen(t->name) - strlen(".weight");
    snprintf(an, sizeof an, "base_model.model.%.*s.lora_A.weight", (int)L, t->name);
    snprintf(bn, sizeof bn, "base_model.model.%.*s.lora_B.weight", (int)L, t->name);
    const STensor *A = st_find(&in->ad, an), *B = st_find(&in->ad, bn);
    if (!A) return x;
    int R = (int)A->shape[0], rows = (int)t->shape[0], cols = (int)t->shape[1];
    double *a = (double *)mallocCheck(A->numel * sizeof(double)), *b = (double *)mallocCheck(B->numel * sizeof(double));
    convert_to_f64(a, A->data, A->dtype, A->numel);
    convert_to_f64(b, B->data, B->dtype, B->numel);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            double d = 0;
            for (int k = 0; k < R; k++) d += b[(size_t)r * R + k] * a[(size_t)k * cols + c];
            x[(size_t)r * cols + c] += in->scale * d;
        }
    free(a);
    free(b);
    return x;
}
static int is_projection(const char *name) { return strstr(name, "_proj.weight") != NULL; }

// Every tensor of the BF16 export equals the merge rounded once to BF16, and nothing else is in it
static void check_bf16_tensors(const Inputs *in, const char *dir) {
    SafeTensors out;
    st_open_dir(&out, dir);
    ck_assert_int_eq(out.n, in->base.n);
    long diff = 0;
    for (int i = 0; i < in->base.n; i++) {
        const STensor *t = &in->base.t[i], *o = st_find(&out, t->name);
        ck_assert_msg(o && o->dtype == DT_BF16 && o->numel == t->numel, "%s", t->name);
        double *x = merged(in, t);
        for (int64_t k = 0; k < t->numel; k++) diff += ((const uint16_t *)o->data)[k] != bf16_nearest(x[k]);
        free(x);
    }
    ck_assert_msg(diff == 0, "%ld values are not the merge rounded to BF16", diff);
    st_close(&out);
}

// A checkpoint of the merged weights as ./generate --load_in_fp8 block would quantize them at load: the
// projections in F32 (the merge rounded to fp32: what export.c quantizes), everything else in BF16
// Whether the FP8 export writes a projection of this shape in FP8: each side a multiple of 128 or at
// most 128, the shapes whose 128x128 scale tiles transformers and vLLM read as they were made (export.c
// says why); the others go out in BF16.
static int whole_blocks(const STensor *t) {
    return (t->shape[0] % 128 == 0 || t->shape[0] <= 128) && (t->shape[1] % 128 == 0 || t->shape[1] <= 128);
}

// The merge as an fp32 checkpoint (other tensors BF16). fp8_export: the projections the FP8 export
// writes in BF16 rounded to BF16 first (still stored as fp32), so that --load_in_fp8 block quantizes
// the same values from here as from the export.
static void write_merged_f32(const Inputs *in, const char *model_rel, const char *dir, int fp8_export) {
    mkdir(dir, 0755);
    int n = in->base.n;
    STWrite *w = (STWrite *)callocCheck(n, sizeof(STWrite));
    for (int i = 0; i < n; i++) {
        const STensor *t = &in->base.t[i];
        double *x = merged(in, t);
        int proj = is_projection(t->name), rounded = fp8_export && proj && !whole_blocks(t);
        void *buf = mallocCheck(t->numel * (proj ? 4 : 2));
        for (int64_t k = 0; k < t->numel; k++) {
            if (rounded) {
                uint32_t u = (uint32_t)bf16_nearest(x[k]) << 16;
                memcpy((float *)buf + k, &u, 4);
            } else if (proj) ((float *)buf)[k] = (float)x[k];
            else ((uint16_t *)buf)[k] = bf16_nearest(x[k]);
        }
        free(x);
        w[i] = (STWrite){t->name, proj ? DT_F32 : DT_BF16, t->ndim, {t->shape[0], t->shape[1]}, buf};
    }
    char p[1024], q[1200];
    snprintf(q, sizeof q, "%s/model.safetensors", dir);
    st_write(q, w, n, NULL);
    for (int i = 0; i < n; i++) free((void *)w[i].data);
    free(w);
    fixture_path(p, sizeof p, model_rel);
    snprintf(q, sizeof q, "cp %s/config.json %s/", p, dir);
    ck_assert_int_eq(system(q), 0);
}

// logits (B*T, V) of a checkpoint directory on the CPU backend, for qwen3's tokens.npy
static float *logits_of(const char *dir, FP8Gran gran, const char *lora_dir, Model *keep) {
    Model m;
    ModelOptions o = {gran, 0, 0, 0, 0};
    model_load(&m, dir, backend_cpu(), &o);
    if (lora_dir) m.lora = lora_load_peft(&m, lora_dir);
    char p[1024];
    fixture_path(p, sizeof p, "qwen3/tokens.npy");
    Npy tk = npy_read(p);
    int B = (int)tk.shape[0], T = (int)tk.shape[1];
    int *ids = (int *)mallocCheck(B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) ids[i] = (int)tk.data[i] % m.cfg.V;
    model_forward(&m, m.lora, ids, B, T);
    float *lg = (float *)mallocCheck((size_t)B * T * m.cfg.V * sizeof(float));
    model_logits(&m, lg);
    free(ids);
    npy_free(&tk);
    if (m.lora) lora_free(m.lora);
    m.lora = NULL;
    if (keep) *keep = m;
    else model_free(&m);
    return lg;
}
// two loaded models hold the same weights, bit for bit: each FP8 linear's codes and scales (padding
// scales included), and the dense allocation (zeroed at allocation, so its padding compares too)
static int same_weights(const Model *a, const Model *b) {
    if (a->w.dense_bytes != b->w.dense_bytes || memcmp(a->w.dense_mem, b->w.dense_mem, a->w.dense_bytes)) return 0;
    for (int l = 0; l < a->cfg.L; l++)
        for (int i = 0; i < LIN_COUNT; i++) {
            const QWeight *x = &a->w.layers[l].lin[i], *y = &b->w.layers[l].lin[i];
            if (x->gran != y->gran || x->rows != y->rows || x->cols != y->cols) return 0;
            if (x->gran == FP8_OFF) continue;
            size_t ns = fp8_num_scales(x->gran, x->rows, x->cols, FP8_BLOCK_SIZE);
            if (memcmp(x->q.data, y->q.data, (size_t)x->rows * x->cols) || memcmp(x->q.scale, y->q.scale, ns * sizeof(float)))
                return 0;
        }
    return 1;
}
static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d / r);
}

// ----------------------------------------------------------------------------

// qwen3 + peft's adapter to BF16: the tensors are the merge rounded once; the logits are base + adapter's
// within BF16's error. Each weight rounded to BF16 is off by at most 2^-9 relative, 2^-9 / sqrt(3) =
// 2^-9.8 RMS (uniform), independently per weight: a logit is the product of a chain of such tensors
// (per layer 4 norms and 7 projections for qwen3, plus the embeddings (= lm_head, tied) and the final
// norm: 24 here), so its relative error is about sqrt(24) 2^-9.8 = 0.55% RMS, amplified some by the
// norms and the softmax-weighted sums: we allow 4x that, as gpu_models.cu does for BF16 activations.
START_TEST(test_bf16_merge) {
    char args[4096], out[128], model[1024], lora[1024];
    fixture_path(model, sizeof model, "qwen3");
    fixture_path(lora, sizeof lora, "peft/qwen3_lora");
    snprintf(out, sizeof out, "%s/merged", tmp);
    snprintf(args, sizeof args, "--model %s --lora %s --output_dir %s/", model, lora, out);  // a trailing '/' too
    char *err;
    ck_assert_int_eq(run_export(args, &err), 0);
    ck_assert_msg(strstr(err, "merge: the adapter's change to the weights, as the BF16 file holds it, is off by "), "%s", err);
    free(err);
    assert_only("merged", NULL);
    Inputs in;
    inputs_open(&in, model, lora);
    ck_assert(fabs(in.scale - 2.0) == 0);
    check_bf16_tensors(&in, out);
    inputs_close(&in);
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", out);
    char *cfg = read_file(p, NULL);
    ck_assert_msg(strstr(cfg, "\"torch_dtype\":\t\"bfloat16\"") && !strstr(cfg, "quantization_config"), "%s", cfg);
    ck_assert_msg(strstr(cfg, "\"rope_parameters\""), "config.json is the base's, every field kept: %s", cfg);
    free(cfg);

    Model m;
    float *ref = logits_of(model, FP8_OFF, lora, &m), *got = logits_of(out, FP8_OFF, NULL, NULL);
    size_t n = (size_t)2 * 24 * m.cfg.V;
    int chain = m.cfg.L * (4 + LIN_COUNT) + 2;
    double e = rel_l2(got, ref, n), tol = 4 * sqrt((double)chain) * 0x1p-9 / sqrt(3.0);
    printf("bf16 export: logits rel L2 %.5f from base + adapter unmerged (tol %.5f)\n", e, tol);
    ck_assert_msg(e <= tol, "rel L2 %g > %g", e, tol);
    // and the merge is what matters: the base alone is much further from base + adapter
    float *base = logits_of(model, FP8_OFF, NULL, NULL);
    ck_assert_msg(rel_l2(base, ref, n) > 10 * tol, "the adapter changes too little to test the merge (%g)", rel_l2(base, ref, n));
    free(base);
    free(ref);
    free(got);
    model_free(&m);
}
END_TEST

// --dtype fp32: every tensor fp32, the merge W + s B A rounded once from fp64; the logits are base +
// adapter unmerged's within fp32's error: a weight off by at most 2^-24 relative, the unmerged path's
// two products (x W and (x A^T) B^T, summed in fp32 over K <= 160 terms) each off by ~K 2^-24 in the
// worst case: 160 * 2^-24 ~ 1e-5 of a logit, against BF16's 0.55% RMS above. The survival line
// says the change is kept (off by < 1e-6 of its size: one fp32 rounding of W + d against W's).
START_TEST(test_fp32_merge) {
    char args[4096], out[128], model[1024], lora[1024], p[256];
    fixture_path(model, sizeof model, "qwen3");
    fixture_path(lora, sizeof lora, "peft/qwen3_lora");
    snprintf(out, sizeof out, "%s/merged32", tmp);
    snprintf(args, sizeof args, "--model %s --lora %s --output_dir %s --dtype fp32", model, lora, out);
    char *err;
    ck_assert_int_eq(run_export(args, &err), 0);
    const char *at = strstr(err, "as the fp32 file holds it, is off by ");
    ck_assert_msg(at, "%s", err);
    double off = atof(at + strlen("as the fp32 file holds it, is off by "));
    ck_assert_msg(off > 0 && off < 1e-6 && !strstr(err, "--dtype fp32 keeps it"), "%s", err);
    free(err);
    snprintf(p, sizeof p, "%s/config.json", out);
    char *cfg = read_file(p, NULL);
    ck_assert_msg(strstr(cfg, "\"torch_dtype\":\t\"float32\"") && !strstr(cfg, "quantization_config"), "%s", cfg);
    free(cfg);
    SafeTensors st;
    st_open_dir(&st, out);
    for (int i = 0; i < st.n; i++) ck_assert_msg(st.t[i].dtype == DT_F32, "%s is not F32", st.t[i].name);
    st_close(&st);
    Model m;
    float *ref = logits_of(model, FP8_OFF, lora, &m), *got = logits_of(out, FP8_OFF, NULL, NULL);
    size_t n = (size_t)2 * 24 * m.cfg.V;
    double e = rel_l2(got, ref, n);
    printf("fp32 export: logits rel L2 %.2g from base + adapter unmerged (tol 1e-5)\n", e);
    ck_assert_msg(e <= 1e-5, "rel L2 %g", e);
    free(ref);
    free(got);
    model_free(&m);
}
END_TEST

// Qwen3 MoE with PEFT's adapter on the attention and the experts (target_parameters): the experts' weights
// merged too (expert e's gate, up and down plus its share of gate_up_proj's and down_proj's adapters), so the
// fp32 export's logits are base + adapter unmerged's within fp32's error, as test_fp32_merge's (transformers
// reading such an export: dev/notes/models.md)
START_TEST(test_fp32_merge_moe_experts) {
    char args[4096], out[128], model[1024], lora[1024];
    fixture_path(model, sizeof model, "qwen3_moe");
    fixture_path(lora, sizeof lora, "peft/qwen3_moe_experts_lora");
    snprintf(out, sizeof out, "%s/merged_moe", tmp);
    snprintf(args, sizeof args, "--model %s --lora %s --output_dir %s --dtype fp32", model, lora, out);
    char *err;
    ck_assert_int_eq(run_export(args, &err), 0);
    ck_assert_msg(strstr(err, "adapter merged"), "%s", err);
    free(err);
    Model m;
    float *ref = logits_of(model, FP8_OFF, lora, &m), *got = logits_of(out, FP8_OFF, NULL, NULL);
    float *base = logits_of(model, FP8_OFF, NULL, NULL);
    size_t n = (size_t)2 * 24 * m.cfg.V;
    double e = rel_l2(got, ref, n), moved = rel_l2(base, ref, n);
    printf("qwen3_moe fp32 export, experts adapted: logits rel L2 %.2g from base + adapter unmerged (tol 1e-5; the "
           "adapter moves them by %.2g)\n", e, moved);
    ck_assert_msg(e <= 1e-5, "rel L2 %g", e);
    ck_assert_msg(moved > 0.1, "the adapter moves the logits by %g only: the test would not see a lost merge", moved);
    // and the experts' weights are what moved them: expert 3's up_proj of layer 0 is not the base's
    SafeTensors a, b;
    st_open_dir(&a, model), st_open_dir(&b, out);
    const STensor *ta = st_find(&a, "model.layers.0.mlp.experts.3.up_proj.weight"), *tb = st_find(&b, "model.layers.0.mlp.experts.3.up_proj.weight");
    ck_assert(ta && tb && ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, ta->nbytes) != 0);
    st_close(&a), st_close(&b);
    free(ref), free(got), free(base);
    model_free(&m);
}
END_TEST

// Gemma 3 as published, under either naming: the export of the multimodal fixture + peft's adapter is the
// whole checkpoint again: the base's tensor names, its vision tower and projector byte for byte, config.json
// of the same kind (Gemma3ForConditionalGeneration); loaded back, its text logits are base + adapter unmerged
// within 1e-5. (dev/make_gemma3_mm_fixture.py --check-export loads such an export in transformers.)
START_TEST(test_gemma3_multimodal_whole) {
    const char *bases[2] = {"gemma3_mm", "gemma3_mm_v5"};
    for (int k = 0; k < 2; k++) {
        char args[4096], out[128], model[1024], lora[1024], p[256];
        fixture_path(model, sizeof model, bases[k]);
        fixture_path(lora, sizeof lora, "peft/gemma3_mm_lora");
        snprintf(out, sizeof out, "%s/%s", tmp, bases[k]);
        snprintf(args, sizeof args, "--model %s --lora %s --output_dir %s --dtype fp32", model, lora, out);
        char *err;
        ck_assert_int_eq(run_export(args, &err), 0);
        ck_assert_msg(strstr(err, "the vision tower and projector copied from the base as they are"), "%s", err);
        free(err);
        snprintf(p, sizeof p, "%s/config.json", out);
        char *text = read_file(p, NULL);
        cJSON *cfg = cJSON_Parse(text), *ar = cJSON_GetObjectItem(cfg, "architectures");
        ck_assert_str_eq(cJSON_GetObjectItem(cfg, "model_type")->valuestring, "gemma3");
        ck_assert_str_eq(cJSON_GetArrayItem(ar, 0)->valuestring, "Gemma3ForConditionalGeneration");
        ck_assert(cJSON_IsObject(cJSON_GetObjectItem(cfg, "vision_config")));
        cJSON_Delete(cfg);
        free(text);
        ck_assert_int_eq(assert_whole_checkpoint(model, out), 34);  // SigLIP's 1 layer (16), embeddings (3), post-norm
                                                                   // and head (13), projector (2)
        Model m;
        float *ref = logits_of(model, FP8_OFF, lora, &m), *got = logits_of(out, FP8_OFF, NULL, NULL);
        double e = rel_l2(got, ref, (size_t)2 * 24 * m.cfg.V);
        printf("%s: fp32 export, whole: logits rel L2 %.2g from base + adapter unmerged (tol 1e-5)\n", bases[k], e);
        ck_assert_msg(e <= 1e-5, "rel L2 %g", e);
        free(ref);
        free(got);
        model_free(&m);
    }
}
END_TEST

// Rounded once: a merged value just above (below) a BF16 midpoint goes up (down). The base's layer-0
// q_proj is all 1 + 2^-8 (F32), a midpoint between the BF16 neighbours 1 and 1 + 2^-7; an adapter of
// rank 1 on q_proj adds +-2^-30 by row. Rounded to fp32 first, 1 + 2^-8 +- 2^-30 would be the midpoint
// itself, and ties to even would give 1 for both signs.
START_TEST(test_bf16_rounded_once) {
    char base[128], ad[128], p[1200], model[1024];
    fixture_path(model, sizeof model, "qwen3");
    snprintf(base, sizeof base, "%s/base", tmp);
    snprintf(ad, sizeof ad, "%s/adapter", tmp);
    mkdir(base, 0755);
    mkdir(ad, 0755);
    SafeTensors st;
    st_open_dir(&st, model);
    STWrite *w = (STWrite *)callocCheck(st.n, sizeof(STWrite));
    float *q = NULL;
    for (int i = 0; i < st.n; i++) {
        const STensor *t = &st.t[i];
        w[i] = (STWrite){t->name, t->dtype, t->ndim, {t->shape[0], t->shape[1]}, t->data};
        if (!strcmp(t->name, "model.layers.0.self_attn.q_proj.weight")) {
            q = (float *)mallocCheck(t->numel * sizeof(float));
            for (int64_t k = 0; k < t->numel; k++) q[k] = 1.0f + 0x1p-8f;
            w[i].dtype = DT_F32;
            w[i].data = q;
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", base);
    st_write(p, w, st.n, NULL);
    snprintf(p, sizeof p, "cp %s/config.json %s/", model, base);
    ck_assert_int_eq(system(p), 0);
    int rows = 128, cols = 64, L = 2;  // qwen3: q (NH x HD = 128, C = 64)
    STWrite a[4];
    char names[4][128];
    float *A = (float *)mallocCheck(cols * sizeof(float)), *B = (float *)mallocCheck(rows * sizeof(float));
    for (int c = 0; c < cols; c++) A[c] = 0x1p-15f;
    for (int r = 0; r < rows; r++) B[r] = r % 2 ? -0x1p-15f : 0x1p-15f;
    for (int l = 0; l < L; l++) {
        snprintf(names[2 * l], 128, "base_model.model.model.layers.%d.self_attn.q_proj.lora_A.weight", l);
        snprintf(names[2 * l + 1], 128, "base_model.model.model.layers.%d.self_attn.q_proj.lora_B.weight", l);
        a[2 * l] = (STWrite){names[2 * l], DT_F32, 2, {1, cols}, A};
        a[2 * l + 1] = (STWrite){names[2 * l + 1], DT_F32, 2, {rows, 1}, B};
    }
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", ad);
    st_write(p, a, 4, NULL);
    snprintf(p, sizeof p, "%s/adapter_config.json", ad);
    const char *cfg = "{\"peft_type\": \"LORA\", \"r\": 1, \"lora_alpha\": 1, \"target_modules\": [\"q_proj\"]}";
    write_file_atomic(p, cfg, strlen(cfg));
    st_close(&st);
    free(q);
    free(w);
    free(A);
    free(B);

    char args[4096], out[128];
    snprintf(out, sizeof out, "%s/merged", tmp);
    snprintf(args, sizeof args, "--model %s --lora %s --output_dir %s", base, ad, out);
    ck_assert_int_eq(run_export(args, NULL), 0);
    SafeTensors o;
    st_open_dir(&o, out);
    const uint16_t *m = (const uint16_t *)st_find(&o, "model.layers.0.self_attn.q_proj.weight")->data;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            ck_assert_msg(m[r * cols + c] == (r % 2 ? 0x3F80 : 0x3F81), "(%d, %d): 0x%04x", r, c, m[r * cols + c]);
    st_close(&o);
    Inputs in;  // and every other tensor, as the merge rounded once
    inputs_open(&in, base, ad);
    check_bf16_tensors(&in, out);
    inputs_close(&in);
}
END_TEST

// the figure of export's "merge: ..." line that names `what` (-1: no such line)
static double printed_off(const char *err, const char *what) {
    const char *at = strstr(err, what);
    if (!at || !(at = strstr(at, "is off by "))) return -1;
    return atof(at + strlen("is off by "));
}
// the line of err that starts with "merge:" (malloc'ed; "" when none)
static char *merge_line(const char *err) {
    const char *at = strstr(err, "merge:");
    if (!at) return str_dup("");
    size_t n = strcspn(at, "\n");
    char *l = (char *)mallocCheck(n + 1);
    memcpy(l, at, n);
    l[n] = 0;
    return l;
}

// --dtype fp8 says what the merge lost, as --dtype bf16 does. qwen3 + adapter: the projections of
// whole 128x128 blocks go out as FP8 codes, the 160-wide MLP ones in BF16; one line for each kind,
// its figure recomputed here from the written file: (the file's value) - (the base's weight as that
// kind holds it: BF16 rounded, or quantized as --load_in_fp8 block does) - (the change, fp64), in
// relative L2 over the projections of that kind. Then a model no projection of which is whole blocks
// (fp8sim: hidden 192): the FP8 export is a BF16 merge, and prints the very line --dtype bf16 prints.
START_TEST(test_fp8_merge_report) {
    char args[4096], out[128], model[1024], lora[1024];
    fixture_path(model, sizeof model, "qwen3");
    fixture_path(lora, sizeof lora, "peft/qwen3_lora");
    snprintf(out, sizeof out, "%s/fp8", tmp);
    snprintf(args, sizeof args, "--model %s --lora %s --output_dir %s --dtype fp8", model, lora, out);
    char *err;
    ck_assert_int_eq(run_export(args, &err), 0);
    Inputs in;
    inputs_open(&in, model, lora);
    SafeTensors o;
    st_open_dir(&o, out);
    double c2[2] = {0, 0}, e2[2] = {0, 0};
    int n[2] = {0, 0};  // [0] BF16, [1] FP8: the projections the adapter changes
    for (int i = 0; i < in.base.n; i++) {
        const STensor *t = &in.base.t[i];
        if (!is_projection(t->name)) continue;
        int k = whole_blocks(t), rows = (int)t->shape[0], cols = (int)t->shape[1];
        double *x = merged(&in, t);
        float *W = (float *)mallocCheck(t->numel * sizeof(float)), *v = (float *)mallocCheck(t->numel * sizeof(float));
        float *vb = (float *)mallocCheck(t->numel * sizeof(float));
        convert_to_f32(W, t->data, t->dtype, t->numel);
        const STensor *f = st_find(&o, t->name);
        if (k) {  // the file's codes times their block's scale; the base quantized as --load_in_fp8 block
            char sn[300];
            snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
            const float *sc = (const float *)st_find(&o, sn)->data;
            int bc = (cols + 127) / 128;
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++)
                    v[(size_t)r * cols + c] = fp8_e4m3_decode(((const uint8_t *)f->data)[(size_t)r * cols + c]) * sc[(r / 128) * bc + c / 128];
            FP8Tensor q;
            fp8_tensor_alloc_cpu(&q, rows, cols, FP8_BLOCK, FP8_E4M3, FP8_BLOCK_SIZE);
            fp8_quantize_cpu(&q, W, 0);
            fp8_dequantize_cpu(vb, &q);
            fp8_tensor_free_cpu(&q);
        } else
            for (int64_t j = 0; j < t->numel; j++)
                v[j] = bf16_to_f32(((const uint16_t *)f->data)[j]), vb[j] = bf16_to_f32(bf16_nearest(W[j]));
        int changed = 0;
        for (int64_t j = 0; j < t->numel; j++) {
            double d = x[j] - W[j], e = (double)v[j] - vb[j] - d;
            c2[k] += d * d, e2[k] += e * e, changed |= d != 0;
        }
        n[k] += changed;
        free(x), free(W), free(v), free(vb);
    }
    st_close(&o);
    inputs_close(&in);
    ck_assert_msg(n[0] > 0 && n[1] > 0, "the adapter should change projections of both kinds (%d, %d)", n[0], n[1]);
    for (int k = 0; k < 2; k++) {
        char what[128];
        snprintf(what, sizeof what, "as the exported file holds it in the %d projections written as %s,", n[k], k ? "FP8" : "BF16");
        double want = sqrt(e2[k] / c2[k]), got = printed_off(err, what);
        printf("fp8 export of qwen3 + adapter: the change as the %s projections hold it is off by %.4g (printed %g)\n",
               k ? "FP8" : "BF16", want, got);
        ck_assert_msg(fabs(got - want) <= 0.005 * want, "'%s': printed %g, recomputed %g: %s", what, got, want, err);
    }
    free(err);

    // fp8sim with a rank-1 adapter on every layer's q_proj (128 x 192: not whole blocks)
    char ad[128], p[1200], *lines[2];
    fixture_path(model, sizeof model, "fp8sim");
    snprintf(ad, sizeof ad, "%s/adapter", tmp);
    mkdir(ad, 0755);
    enum { ROWS = 128, COLS = 192 };
    static float A[COLS], B[ROWS];
    uint64_t h = 12345;
    for (int c = 0; c < COLS; c++) A[c] = (float)((int)((h = h * 6364136223846793005ull + 1442695040888963407ull) >> 40 & 255) - 128) / 4096;
    for (int r = 0; r < ROWS; r++) B[r] = (float)((int)((h = h * 6364136223846793005ull + 1442695040888963407ull) >> 40 & 255) - 128) / 4096;
    STWrite a[4];
    char names[4][128];
    for (int l = 0; l < 2; l++) {
        snprintf(names[2 * l], 128, "base_model.model.model.layers.%d.self_attn.q_proj.lora_A.weight", l);
        snprintf(names[2 * l + 1], 128, "base_model.model.model.layers.%d.self_attn.q_proj.lora_B.weight", l);
        a[2 * l] = (STWrite){names[2 * l], DT_F32, 2, {1, COLS}, A};
        a[2 * l + 1] = (STWrite){names[2 * l + 1], DT_F32, 2, {ROWS, 1}, B};
    }
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", ad);
    st_write(p, a, 4, NULL);
    snprintf(p, sizeof p, "%s/adapter_config.json", ad);
    const char *cfg = "{\"peft_type\": \"LORA\", \"r\": 1, \"lora_alpha\": 1, \"target_modules\": [\"q_proj\"]}";
    write_file_atomic(p, cfg, strlen(cfg));
    const char *dts[2] = {"bf16", "fp8"};
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "--model %s --lora %s --output_dir %s/sim-%s --dtype %s", model, ad, tmp, dts[k], dts[k]);
        ck_assert_int_eq(run_export(args, &err), 0);
        lines[k] = merge_line(err);
        free(err);
    }
    ck_assert_msg(strstr(lines[0], "as the BF16 file holds it, is off by "), "%s", lines[0]);
    ck_assert_msg(!strcmp(lines[0], lines[1]), "--dtype bf16: '%s'; --dtype fp8: '%s'", lines[0], lines[1]);
    printf("fp8 export of fp8sim + adapter (every projection BF16): %s\n", lines[1]);
    free(lines[0]), free(lines[1]);
}
END_TEST

// The FP8 export, loaded back, is --load_in_fp8 block of the merged weights, bit for bit: the same codes
// and scales, the same BF16-rounded rest, the same logits. qwen3 + adapter (tied,
// q/k-norm, 160-wide MLP: edge blocks) and qwen2 alone (biases, untied: a conversion); then the
// FP8 export converted back to BF16.
START_TEST(test_fp8_equals_load_in_fp8_block) {
    const char *models[2] = {"qwen3", "qwen2"}, *loras[2] = {"peft/qwen3_lora", NULL};
    for (int k = 0; k < 2; k++) {
        char args[4096], out[128], ref_dir[128], model[1024], lora[1024] = "";
        fixture_path(model, sizeof model, models[k]);
        if (loras[k]) fixture_path(lora, sizeof lora, loras[k]);
        snprintf(out, sizeof out, "%s/%s-fp8", tmp, models[k]);
        snprintf(ref_dir, sizeof ref_dir, "%s/%s-merged-f32", tmp, models[k]);
        snprintf(args, sizeof args, "--model %s %s %s --output_dir %s --dtype fp8", model, loras[k] ? "--lora" : "", lora, out);
        char *err;
        ck_assert_int_eq(run_export(args, &err), 0);
        Inputs in;
        inputs_open(&in, model, loras[k] ? lora : NULL);
        write_merged_f32(&in, models[k], ref_dir, 1);
        // the file: projections of whole 128x128 blocks E4M3 with F32 (ceil(N/128), ceil(K/128)) scales,
        // the rest BF16 (the fixtures' intermediate 160: gate, up and down)
        SafeTensors st;
        st_open_dir(&st, out);
        int nproj = 0, nbf16 = 0, nall = 0;
        for (int i = 0; i < in.base.n; i++) {
            const STensor *t = &in.base.t[i], *o = st_find(&st, t->name);
            int fp8 = is_projection(t->name) && whole_blocks(t);
            ck_assert_msg(o && o->dtype == (fp8 ? DT_E4M3 : DT_BF16), "%s", t->name);
            nall += is_projection(t->name);
            nbf16 += is_projection(t->name) && !fp8;
            if (!fp8) continue;
            char sn[300];
            snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
            const STensor *s = st_find(&st, sn);
            ck_assert_msg(s && s->dtype == DT_F32 && s->ndim == 2 && s->shape[0] == (t->shape[0] + 127) / 128 &&
                              s->shape[1] == (t->shape[1] + 127) / 128, "%s", sn);
            nproj++;
        }
        ck_assert_int_eq(st.n, in.base.n + nproj);
        ck_assert_msg(nproj > 0 && nbf16 > 0, "the fixture should have projections of both kinds");
        char line[128];
        snprintf(line, sizeof line, "fp8: %d of %d projections written in BF16", nbf16, nall);
        ck_assert_msg(strstr(err, line), "no line saying which projections are BF16: %s", err);
        free(err);
        st_close(&st);
        // config.json names them (module names) in modules_to_not_convert, beside lm_head, and no other
        char cfg[300];
        snprintf(cfg, sizeof cfg, "%s/config.json", out);
        char *text = read_file(cfg, NULL);
        cJSON *r = cJSON_Parse(text), *skip = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "quantization_config"), "modules_to_not_convert");
        ck_assert_int_eq(cJSON_GetArraySize(skip), 1 + nbf16);
        ck_assert_str_eq(cJSON_GetArrayItem(skip, 0)->valuestring, "lm_head");
        for (int i = 0; i < in.base.n; i++) {
            const STensor *t = &in.base.t[i];
            if (!is_projection(t->name) || whole_blocks(t)) continue;
            char mod[300];
            snprintf(mod, sizeof mod, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
            int found = 0;
            for (int j = 1; j < cJSON_GetArraySize(skip); j++) found += !strcmp(cJSON_GetArrayItem(skip, j)->valuestring, mod);
            ck_assert_msg(found == 1, "%s is not in modules_to_not_convert once", mod);
        }
        cJSON_Delete(r);
        free(text);
        inputs_close(&in);

        Model a, b;
        float *la = logits_of(out, FP8_BLOCK, NULL, &a), *lb = logits_of(ref_dir, FP8_BLOCK, NULL, &b);
        ck_assert_msg(same_weights(&a, &b), "%s: the FP8 codes, scales or BF16 tensors differ", models[k]);
        ck_assert_msg(!memcmp(la, lb, (size_t)2 * 24 * a.cfg.V * sizeof(float)), "%s: logits differ", models[k]);
        printf("fp8 export of %s%s: codes, scales and logits identical to --load_in_fp8 block of the merged weights "
               "(%d of %d projections in BF16: not whole 128x128 blocks)\n", models[k], loras[k] ? " + adapter" : "", nbf16, nall);
        free(la);
        free(lb);
        model_free(&a);
        model_free(&b);
    }
    // config.json: the quantization_config vLLM's Fp8Config and transformers' FineGrainedFP8Config read
    char p[256];
    snprintf(p, sizeof p, "%s/qwen3-fp8/config.json", tmp);
    char *text = read_file(p, NULL);
    cJSON *r = cJSON_Parse(text), *q = cJSON_GetObjectItem(r, "quantization_config");
    ck_assert_str_eq(cJSON_GetObjectItem(q, "quant_method")->valuestring, "fp8");
    ck_assert_str_eq(cJSON_GetObjectItem(q, "activation_scheme")->valuestring, "dynamic");
    ck_assert_str_eq(cJSON_GetObjectItem(q, "fmt")->valuestring, "e4m3");
    cJSON *bs = cJSON_GetObjectItem(q, "weight_block_size");
    ck_assert(cJSON_GetArraySize(bs) == 2 && cJSON_GetArrayItem(bs, 0)->valuedouble == 128 && cJSON_GetArrayItem(bs, 1)->valuedouble == 128);
    ck_assert_str_eq(cJSON_GetObjectItem(r, "torch_dtype")->valuestring, "bfloat16");
    cJSON_Delete(r);
    free(text);

    // and back: an FP8 checkpoint as --model converts to BF16, each projection its codes times their
    // block's scale (the fp32 product the loader makes) rounded to BF16, the quantization_config gone
    char args[4096], in_dir[128], out[128];
    snprintf(in_dir, sizeof in_dir, "%s/qwen3-fp8", tmp);
    snprintf(out, sizeof out, "%s/qwen3-back", tmp);
    snprintf(args, sizeof args, "--model %s --output_dir %s", in_dir, out);
    ck_assert_int_eq(run_export(args, NULL), 0);
    SafeTensors a, b;
    st_open_dir(&a, in_dir);
    st_open_dir(&b, out);
    long diff = 0;
    for (int i = 0; i < b.n; i++) {
        const STensor *o = &b.t[i], *q = st_find(&a, o->name);
        ck_assert(o->dtype == DT_BF16 && q);
        if (q->dtype != DT_E4M3) continue;
        char sn[300];
        snprintf(sn, sizeof sn, "%s_scale_inv", o->name);
        const float *sc = (const float *)st_find(&a, sn)->data;
        int rows = (int)q->shape[0], cols = (int)q->shape[1], bc = (cols + 127) / 128;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                float v = fp8_e4m3_decode(((const uint8_t *)q->data)[(size_t)r * cols + c]) * sc[(r / 128) * bc + c / 128];
                diff += ((const uint16_t *)o->data)[(size_t)r * cols + c] != bf16_nearest(v);
            }
    }
    ck_assert_msg(diff == 0, "%ld values differ", diff);
    st_close(&a);
    st_close(&b);
    snprintf(args, sizeof args, "%s/config.json", out);
    text = read_file(args, NULL);
    ck_assert_msg(!strstr(text, "quantization_config"), "%s", text);
    free(text);
}
END_TEST

// llama3 (three F16 shards in, no adapter: a conversion) out in shards of at most 40 kB: the index
// names every tensor's shard, total_size is the bytes of tensor data, every shard holds what the index
// says and stays within the limit unless one tensor alone is larger; the loader reads it back to the
// same weights as the single-file export; the tokenizer files are copied byte for byte.
START_TEST(test_shards_and_tokenizer_files) {
    char args[4096], model[1024], one[128], many[128], cmd[4096];
    fixture_path(model, sizeof model, "llama3");
    snprintf(one, sizeof one, "%s/one", tmp);
    snprintf(many, sizeof many, "%s/many", tmp);
    // the fixture and tokenizer files beside it, in a directory of their own
    char src[128];
    snprintf(src, sizeof src, "%s/llama3-tok", tmp);
    char tk[1024];
    fixture_path(tk, sizeof tk, "tokenizer/qwen2");
    snprintf(cmd, sizeof cmd, "mkdir %s && cp %s/* %s/ && cp %s/tokenizer.json %s/tokenizer_config.json %s/ && "
             "echo '{{ messages[0].content }}' > %s/chat_template.jinja", src, model, src, tk, tk, src, src);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(args, sizeof args, "--model %s --output_dir %s --dtype fp8", src, one);
    ck_assert_int_eq(run_export(args, NULL), 0);
    snprintf(args, sizeof args, "--model %s --output_dir %s --dtype fp8 --max_shard_size 40KB", src, many);
    ck_assert_int_eq(run_export(args, NULL), 0);
    ck_assert(exists(one) && !exists(strcat(strcpy(cmd, one), "/model.safetensors.index.json")));

    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", many);
    char *text = read_file(p, NULL);
    cJSON *idx = cJSON_Parse(text), *wm = cJSON_GetObjectItem(idx, "weight_map");
    free(text);
    SafeTensors all;
    st_open_dir(&all, one);
    ck_assert_int_eq(cJSON_GetArraySize(wm), all.n);
    size_t total = 0;
    for (int i = 0; i < all.n; i++) total += all.t[i].nbytes;
    ck_assert(cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "metadata"), "total_size")->valuedouble == (double)total);
    int nshards = 0;
    for (cJSON *e = wm->child; e; e = e->next) {
        int k, of;
        ck_assert_msg(sscanf(e->valuestring, "model-%05d-of-%05d.safetensors", &k, &of) == 2 && k >= 1 && k <= of, "%s", e->valuestring);
        nshards = of;
        snprintf(p, sizeof p, "%s/%s", many, e->valuestring);
        SafeTensors sh;
        st_open(&sh, p);
        const STensor *a = st_find(&sh, e->string), *b = st_find(&all, e->string);
        ck_assert_msg(a && b && a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes), "%s in %s", e->string, p);
        size_t bytes = 0;
        for (int i = 0; i < sh.n; i++) bytes += sh.t[i].nbytes;
        ck_assert_msg(bytes <= 40000 || sh.n <= 2, "%s holds %zu bytes in %d tensors", p, bytes, sh.n);
        st_close(&sh);
    }
    ck_assert_msg(nshards >= 4, "only %d shards", nshards);
    cJSON_Delete(idx);
    st_close(&all);
    Model a, b;
    float *la = logits_of(one, FP8_BLOCK, NULL, &a), *lb = logits_of(many, FP8_BLOCK, NULL, &b);
    ck_assert(same_weights(&a, &b));
    ck_assert(!memcmp(la, lb, (size_t)2 * 24 * a.cfg.V * sizeof(float)));
    printf("sharded export: %d shards, read back to the same weights and logits\n", nshards);
    free(la);
    free(lb);
    model_free(&a);
    model_free(&b);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "cmp -s %s/%s %s/%s", src, files[i], many, files[i]);
        ck_assert_msg(system(cmd) == 0, "%s not copied", files[i]);
    }
}
END_TEST

// An export that fails while writing (here the file size limit, as a full disk would) leaves no
// --output_dir and no temporary directory; with --overwrite the previous export stays as it was. A
// successful --overwrite replaces it and leaves nothing beside it.
static int export_with_fsize_limit(const char *args, rlim_t limit) {
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {limit, limit};
        setrlimit(RLIMIT_FSIZE, &rl);
        signal(SIGXFSZ, SIG_IGN);  // so that write() fails with EFBIG instead of killing the process
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "exec ./export %s >/dev/null 2>%s/stderr.txt", args, tmp);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

START_TEST(test_atomic) {
    char args[4096], out[128], model[1024], lora[1024], p[512];
    fixture_path(model, sizeof model, "qwen3");
    fixture_path(lora, sizeof lora, "peft/qwen3_lora");
    snprintf(out, sizeof out, "%s/merged", tmp);
    // a file size limit one byte short of the largest shard (sizes from a successful run): the write of
    // that shard fails part way, after the temporary directory and its first files were made
    snprintf(args, sizeof args, "--model %s --lora %s --output_dir %s --max_shard_size 45KB", model, lora, out);
    ck_assert_int_eq(run_export(args, NULL), 0);
    long largest = 0;
    DIR *d = opendir(out);
    for (struct dirent *de; (de = readdir(d));) {
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", out, de->d_name);
        if (!strstr(de->d_name, ".safetensors") || stat(p, &sb) != 0) continue;
        if (sb.st_size > largest) largest = sb.st_size;
    }
    closedir(d);
    ck_assert(largest > 0);
    snprintf(p, sizeof p, "rm -r %s", out);
    ck_assert_int_eq(system(p), 0);

    ck_assert_int_eq(export_with_fsize_limit(args, (rlim_t)largest - 1), 1);
    snprintf(p, sizeof p, "%s/stderr.txt", tmp);
    char *e = read_file(p, NULL);
    ck_assert_msg(strstr(e, "write failed") && strchr(e, '\n') == e + strlen(e) - 1, "stderr: %s", e);
    free(e);
    ck_assert(!exists(out));
    assert_only(NULL, NULL);

    // a complete one, then a failing --overwrite: the first stays, byte for byte
    char base_args[4096];
    snprintf(base_args, sizeof base_args, "--model %s --output_dir %s", model, out);
    ck_assert_int_eq(run_export(base_args, NULL), 0);
    snprintf(p, sizeof p, "cp -r %s %s/copy", out, tmp);
    ck_assert_int_eq(system(p), 0);
    strcat(args, " --overwrite");
    ck_assert_int_eq(export_with_fsize_limit(args, (rlim_t)largest - 1), 1);
    snprintf(p, sizeof p, "diff -r %s %s/copy", out, tmp);
    ck_assert_msg(system(p) == 0, "the old export changed");
    assert_only("merged", "copy");
    // a successful --overwrite: the new one in place, nothing left beside it
    ck_assert_int_eq(run_export(args, NULL), 0);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    ck_assert(exists(p));
    assert_only("merged", "copy");
}
END_TEST

// Each bad input: exit 1, one line "error: ..." naming the cause, and no output directory
static void expect_fail(const char *args, const char *want, const char *out) {
    char *e;
    int rc = run_export(args, &e);
    ck_assert_msg(rc == 1, "%s: exit %d", args, rc);
    ck_assert_msg(!strncmp(e, "error: ", 7) && strstr(e, want) && strchr(e, '\n') == e + strlen(e) - 1,
                  "%s: stderr '%s', want '%s'", args, e, want);
    free(e);
    ck_assert_msg(!exists(out), "%s: left %s", args, out);
    assert_only("in", NULL);
}

START_TEST(test_bad_inputs) {
    char m[1024], lora[1024], llama[1024], o[128], in[128], file[160], full[160], badtok[160], a[4096];
    fixture_path(m, sizeof m, "qwen3");
    fixture_path(lora, sizeof lora, "peft/qwen3_lora");
    fixture_path(llama, sizeof llama, "llama3");
    snprintf(o, sizeof o, "%s/out", tmp);
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(file, sizeof file, "%s/file", in);
    snprintf(full, sizeof full, "%s/full", in);
    snprintf(badtok, sizeof badtok, "%s/badtok", in);
    // a file, a non-empty directory, and a model directory whose tokenizer.json is a directory (found
    // after the weights are written: the temporary directory must go)
    snprintf(a, sizeof a, "mkdir -p %s %s && echo x > %s && echo x > %s/keep && cp %s/* %s/ && mkdir %s/tokenizer.json", full,
             badtok, file, full, m, badtok, badtok);
    ck_assert_int_eq(system(a), 0);
#define FAIL(want, ...) (snprintf(a, sizeof a, __VA_ARGS__), expect_fail(a, want, o))
    FAIL("--model DIR is required", "--output_dir %s", o);
    FAIL("--output_dir DIR is required", "--model %s", m);
    FAIL("--dtype: unknown value 'fp16': use bf16, fp8 or fp32", "--model %s --output_dir %s --dtype fp16", m, o);
    FAIL("--max_shard_size: '5XB' is not a size", "--model %s --output_dir %s --max_shard_size 5XB", m, o);
    FAIL("--max_shard_size: '0' is not a size", "--model %s --output_dir %s --max_shard_size 0", m, o);
    FAIL("unknown option --no_such_flag", "--model %s --output_dir %s --no_such_flag", m, o);
    FAIL("exists and is not a directory", "--model %s --output_dir %s", m, file);
    FAIL("exists and is not empty: choose another path, or pass --overwrite", "--model %s --output_dir %s", m, full);
    FAIL("is the checkpoint being read (--model)", "--model %s --output_dir %s --overwrite", badtok, badtok);
    FAIL("no config.json", "--model %s.none --output_dir %s", o, o);
    FAIL("no adapter_config.json", "--model %s --lora %s --output_dir %s", m, m, o);
    FAIL("has the wrong shape for this model", "--model %s --lora %s --output_dir %s", llama, lora, o);
    FAIL("cannot create directory", "--model %s --output_dir %s/no/such/parent", m, o);
    FAIL("tokenizer.json: not a regular file", "--model %s --output_dir %s", badtok, o);
#undef FAIL
    // --help: every option with its default, exit 0
    FILE *f = popen("./export --help", "r");
    char help[4096] = "";
    size_t hn = fread(help, 1, sizeof help - 1, f);
    help[hn] = 0;
    ck_assert_int_eq(pclose(f), 0);
    ck_assert_msg(strstr(help, "--dtype bf16|fp8|fp32") && strstr(help, "(default: bf16)") && strstr(help, "(default: 5GB)") &&
                      strstr(help, "--overwrite") && strstr(help, "--lora DIR"), "%s", help);
    // the usage line names every --dtype too
    ck_assert_msg(strstr(help, "usage: ./export") && strstr(help, "[--dtype bf16|fp8|fp32]") < strchr(help, '\n'), "%s", help);
    // the directories given as outputs are as they were
    snprintf(a, sizeof a, "test \"$(ls %s)\" = keep && test -d %s/tokenizer.json", full, badtok);
    ck_assert_int_eq(system(a), 0);
}
END_TEST

Suite *export_suite(void) {
    Suite *s = suite_create("export");
    TCase *tc = tcase_create("export");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_bf16_merge);
    tcase_add_test(tc, test_fp32_merge);
    tcase_add_test(tc, test_fp32_merge_moe_experts);
    tcase_add_test(tc, test_gemma3_multimodal_whole);
    tcase_add_test(tc, test_bf16_rounded_once);
    tcase_add_test(tc, test_fp8_equals_load_in_fp8_block);
    tcase_add_test(tc, test_fp8_merge_report);
    tcase_add_test(tc, test_shards_and_tokenizer_files);
    tcase_add_test(tc, test_atomic);
    tcase_add_test(tc, test_bad_inputs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(export_suite()); }
