// model_load.c: from a Hugging Face checkpoint directory to a Model.
// Defines: config_from_json (Llama 3 / Qwen2 / Qwen3 / Qwen3 MoE / Mistral / Gemma 3 text config.json, both
// the transformers 4.x keys (rope_theta, rope_scaling) and 5.x (rope_parameters); the multimodal Gemma 3's
// text_config), the text model's tensor names (config_text_prefix: both namings of the multimodal Gemma 3),
// model_load (safetensors, BF16/F16/F32, or pre-quantized
// FP8 with weight_scale_inv read as is), config_load_dir and config_check_tokenizer (a tokenizer
// of another checkpoint, said before the weights are read), model_init_random, model_hf_tensors (the
// checkpoint names of the model's tensors), model_save_hf,
// and the per-layer quantization error (SQNR) report.
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>

#include "model.h"
#include "io/safetensors.h"

static const char *const lin_parent[LIN_COUNT] = {"self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp"};

// ----------------------------------------------------------------------------
// config.json

static double json_num(cJSON *root, const char *key, double dflt, int required, const char *path) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) die("%s: missing \"%s\"", path, key);
        return dflt;
    }
    if (!cJSON_IsNumber(v)) die("%s: \"%s\" must be a number", path, key);
    return v->valuedouble;
}
// an integer in [lo, hi]: the bounds keep every size and product of sizes the model computes
// (heads x head_dim, rows x columns) in range, and the error states them
static int json_int(cJSON *root, const char *key, int dflt, int required, int lo, int hi, const char *path) {
    double d = json_num(root, key, dflt, required, path);
    if (!(d >= lo && d <= hi) || d != floor(d)) die("%s: \"%s\" is %.15g: it must be an integer in [%d, %d]", path, key, d, lo, hi);
    return (int)d;
}
// a finite number in (lo, hi]
static double json_pos(cJSON *root, const char *key, double dflt, int required, double lo, double hi, const char *path) {
    double d = json_num(root, key, dflt, required, path);
    if (!(d > lo && d <= hi)) die("%s: \"%s\" is %.15g: it must be a number in (%g, %g]", path, key, d, lo, hi);
    return d;
}
// a token id: an integer in [0, vocab_size)
static int json_id(cJSON *v, const char *key, int V, const char *path) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < V) || v->valuedouble != floor(v->valuedouble))
        die("%s: \"%s\" must be a token id: an integer in [0, vocab_size %d)", path, key, V);
    return (int)v->valuedouble;
}

// The bounds of config.json's sizes (generous: Llama 3.1 405B has hidden 16384, intermediate 53248,
// 126 layers, 128 heads of 128; Qwen3's vocabulary is 151936)
enum { MAX_VOCAB = 1 << 24, MAX_HIDDEN = 1 << 16, MAX_FF = 1 << 18, MAX_LAYERS = CONFIG_MAX_LAYERS, MAX_HEADS = 1024,
       MAX_HEAD_DIM = 1024, MAX_POS = 1 << 24 };
static int json_bool(cJSON *root, const char *key, int dflt, const char *path) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return dflt;
    if (!cJSON_IsBool(v)) die("%s: \"%s\" must be true or false", path, key);
    return cJSON_IsTrue(v);
}

// a key that must be absent or null: what the model does not implement (Gemma 2's logit soft-capping)
static void json_null(cJSON *root, const char *key, const char *why, const char *path) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (v && !cJSON_IsNull(v)) die("%s: \"%s\" is set: %s", path, key, why);
}

// sliding_window: an integer >= 1, or absent / null (0: no window)
static int json_window(cJSON *root, int dflt, const char *path) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (v && cJSON_IsNull(v)) return 0;
    return json_int(root, "sliding_window", dflt, 0, 1, MAX_POS, path);
}

// Gemma 3's layer types: layer_types ["sliding_attention" | "full_attention", ...] (transformers 5.x
// and recent 4.x), else every sliding_window_pattern-th layer full, the others sliding (older 4.x
// configs; transformers' default pattern 6)
static void gemma3_layer_types(Config *c, cJSON *root, const char *path) {
    cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->L)
            die("%s: \"layer_types\" must list num_hidden_layers (%d) strings", path, c->L);
        int l = 0;
        cJSON *e;
        cJSON_ArrayForEach(e, lt) {
            int sl = cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention");
            if (!sl && !(cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")))
                die("%s: layer_types[%d] must be \"sliding_attention\" or \"full_attention\"", path, l);
            c->sliding[l++] = (unsigned char)sl;
        }
        return;
    }
    int pat = json_int(root, "sliding_window_pattern", 6, 0, 1, MAX_LAYERS, path);
    for (int l = 0; l < c->L; l++) c->sliding[l] = (l + 1) % pat != 0;
}

// Qwen3 MoE's experts (transformers' Qwen3MoeConfig defaults where a key is absent) and which layers have
// them: layer l is sparse unless listed in mlp_only_layers, when (l + 1) % decoder_sparse_step == 0
// (Qwen3MoeDecoderLayer). router_aux_loss_coef and output_router_logits are read by nobody here: the
// load-balancing loss is a pre-training term, and an RL or SFT step here trains no router.
enum { MAX_EXPERTS = 1 << 12 };
static void qwen3_moe_layers(Config *c, cJSON *root, const char *path) {
    // num_experts (the published checkpoints, transformers 4.x), num_local_experts (what 5.x writes)
    const char *ne = cJSON_GetObjectItemCaseSensitive(root, "num_experts") ? "num_experts" : "num_local_experts";
    c->E = json_int(root, ne, 128, 0, 1, MAX_EXPERTS, path);
    c->K = json_int(root, "num_experts_per_tok", 8, 0, 1, c->E, path);
    c->FFe = json_int(root, "moe_intermediate_size", 768, 0, 1, MAX_FF, path);
    c->norm_topk = json_bool(root, "norm_topk_prob", 0, path);
    int step = json_int(root, "decoder_sparse_step", 1, 0, 1, MAX_LAYERS, path);
    for (int l = 0; l < c->L; l++) c->moe[l] = (l + 1) % step == 0;
    cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers"), *e;
    if (only && !cJSON_IsNull(only) && !cJSON_IsArray(only)) die("%s: \"mlp_only_layers\" must be a list of layer indices", path);
    cJSON_ArrayForEach(e, only) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble < c->L) || e->valuedouble != floor(e->valuedouble))
            die("%s: \"mlp_only_layers\" must list layer indices in [0, num_hidden_layers %d)", path, c->L);
        c->moe[(int)e->valuedouble] = 0;
    }
}

// one RoPE parameter set (the top level of a 4.x config, rope_scaling, rope_parameters, or one of Gemma 3's
// per-layer-type sets of rope_parameters): its scaling, when it has one, into c; the type's name returned
static void rope_scaling_read(Config *c, cJSON *scaling, const char *sp, const char *path) {
    cJSON *ty = cJSON_GetObjectItemCaseSensitive(scaling, "rope_type");
    if (!ty) ty = cJSON_GetObjectItemCaseSensitive(scaling, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "default";
    if (!strcmp(t, "llama3")) {
        c->rope_scaling = 1;
        c->rope_factor = (float)json_pos(scaling, "factor", 0, 1, 0, 1e6, sp);
        c->rope_low_freq_factor = (float)json_pos(scaling, "low_freq_factor", 0, 1, 0, 1e6, sp);
        c->rope_high_freq_factor = (float)json_pos(scaling, "high_freq_factor", 0, 1, 0, 1e6, sp);
        c->rope_original_max_pos = json_int(scaling, "original_max_position_embeddings", 0, 1, 1, MAX_POS, sp);
        if (c->rope_high_freq_factor <= c->rope_low_freq_factor)
            die("%s: llama3 rope scaling needs high_freq_factor > low_freq_factor", path);
    } else if (!strcmp(t, "linear")) {  // positions divided by factor: inv_freq / factor (Gemma 3 4B and up)
        c->rope_scaling = 2;
        c->rope_factor = (float)json_pos(scaling, "factor", 0, 1, 0, 1e6, sp);
    } else if (strcmp(t, "default"))
        die("%s: rope scaling type \"%s\" is not supported (default, linear and llama3 are)", path, t);
}

// A multimodal Gemma 3's config.json (model_type "gemma3"): its text model's config, text_config (absent:
// Gemma3TextConfig's defaults, as transformers' Gemma3Config makes it), and its tensor layout (MM_V4 until
// model_load finds the other in the weights). Returns the object to read the text model from.
static cJSON *gemma3_text_config(Config *c, cJSON *top, const char *path) {
    cJSON *t = cJSON_GetObjectItemCaseSensitive(top, "text_config");
    if (!t || cJSON_IsNull(t)) {
        cJSON_DeleteItemFromObjectCaseSensitive(top, "text_config");
        t = cJSON_AddObjectToObject(top, "text_config");  // freed with top
    }
    if (!cJSON_IsObject(t)) die("%s: \"text_config\" must be an object (the language model's config)", path);
    cJSON *mt = cJSON_GetObjectItemCaseSensitive(t, "model_type");
    if (mt && !(cJSON_IsString(mt) && !strcmp(mt->valuestring, "gemma3_text")))
        die("%s: text_config's model_type must be \"gemma3_text\" (the text model of a gemma3 checkpoint)", path);
    c->mm = MM_V4;
    return t;
}

// bos_token_id / eos_token_id: a multimodal config's top level holds them (the text_config's where it does not)
static cJSON *token_key(cJSON *top, cJSON *root, const char *key) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(top, key);
    return v && !cJSON_IsNull(v) ? v : cJSON_GetObjectItemCaseSensitive(root, key);
}

void config_from_json(Config *c, const char *text, const char *path) {
    memset(c, 0, sizeof *c);
    cJSON *top = cJSON_Parse(text), *root = top;
    if (!root || !cJSON_IsObject(root)) die("%s: not valid JSON", path);
    cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) die("%s: missing \"model_type\"", path);
    if (!strcmp(mt->valuestring, "llama")) c->arch = ARCH_LLAMA;
    else if (!strcmp(mt->valuestring, "qwen2")) c->arch = ARCH_QWEN2;
    else if (!strcmp(mt->valuestring, "qwen3")) c->arch = ARCH_QWEN3;
    else if (!strcmp(mt->valuestring, "mistral")) c->arch = ARCH_MISTRAL;
    else if (!strcmp(mt->valuestring, "gemma3_text")) c->arch = ARCH_GEMMA3;
    else if (!strcmp(mt->valuestring, "qwen3_moe")) c->arch = ARCH_QWEN3_MOE;
    else if (!strcmp(mt->valuestring, "gemma3")) c->arch = ARCH_GEMMA3;  // Gemma3ForConditionalGeneration
    else
        die("%s: unsupported architecture \"%s\": fp8-grpo runs llama (Llama 3), qwen2, qwen3, qwen3_moe, mistral, "
            "gemma3_text and gemma3 (its text model) checkpoints", path, mt->valuestring);
    int gemma = c->arch == ARCH_GEMMA3;
    const char *top_path = path;
    char tpath[4200];
    if (!strcmp(mt->valuestring, "gemma3")) {
        root = gemma3_text_config(c, top, path);
        snprintf(tpath, sizeof tpath, "%s: text_config", path);
        path = tpath;
    }

    // Gemma3TextConfig gives every size a default (the published 4B's text_config leaves out its heads and
    // vocabulary); the other configs must state them
    c->V = json_int(root, "vocab_size", 262208, !gemma, 1, MAX_VOCAB, path);
    c->C = json_int(root, "hidden_size", 2304, !gemma, 1, MAX_HIDDEN, path);
    c->FF = json_int(root, "intermediate_size", 9216, !gemma, 1, MAX_FF, path);
    c->L = json_int(root, "num_hidden_layers", 26, !gemma, 1, MAX_LAYERS, path);
    c->NH = json_int(root, "num_attention_heads", 8, !gemma, 1, MAX_HEADS, path);
    c->KVH = json_int(root, "num_key_value_heads", gemma ? 4 : c->NH, 0, 1, MAX_HEADS, path);
    if (c->NH % c->KVH) die("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path, c->NH, c->KVH);
    cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (c->C % c->NH && (!hd || cJSON_IsNull(hd)))
        die("%s: hidden_size %d not divisible by num_attention_heads %d and no head_dim", path, c->C, c->NH);
    // transformers' defaults where a key is absent: Gemma 3's (Gemma3TextConfig) differ
    c->HD = json_int(root, "head_dim", gemma ? 256 : c->C / c->NH, 0, 2, MAX_HEAD_DIM, path);
    if (c->HD % 2) die("%s: head_dim %d must be even (RoPE rotates pairs)", path, c->HD);
    c->max_pos = json_int(root, "max_position_embeddings", gemma ? 131072 : 4096, 0, 1, MAX_POS, path);
    c->eps = (float)json_pos(root, "rms_norm_eps", 1e-6, 0, 0, 1, path);
    c->tied = json_bool(root, "tie_word_embeddings", gemma, path);
    // A *ForSequenceClassification (a reward model): a score head in the LM head's place, of num_labels rows
    // (id2label's entries; transformers' default 2). It has no LM head: the embedding table stands in (tied).
    cJSON *archs = cJSON_GetObjectItemCaseSensitive(top, "architectures"), *a0 = cJSON_GetArrayItem(archs, 0);
    const char *cls = cJSON_IsString(a0) ? a0->valuestring : "", *suffix = "ForSequenceClassification";
    if (strlen(cls) > strlen(suffix) && !strcmp(cls + strlen(cls) - strlen(suffix), suffix)) {
        cJSON *labels = cJSON_GetObjectItemCaseSensitive(root, "id2label");
        c->num_labels = cJSON_IsObject(labels) ? cJSON_GetArraySize(labels) : json_int(root, "num_labels", 2, 0, 1, 1 << 20, path);
        if (c->num_labels < 1 || c->num_labels > 1 << 20) die("%s: id2label has %d labels: a classifier has 1 or more", path, c->num_labels);
        c->tied = 1;
    }
    c->qkv_bias = c->arch == ARCH_QWEN2;
    c->qk_norm = c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE || gemma;
    c->gemma = gemma;

    // the MLP's activation: SiLU (SwiGLU), Gemma 3's gelu tanh (GeGLU)
    const char *want_act = gemma ? "gelu_pytorch_tanh" : "silu";
    const char *act_keys[2] = {"hidden_act", "hidden_activation"};
    for (int i = 0; i < 2; i++) {
        cJSON *act = cJSON_GetObjectItemCaseSensitive(root, act_keys[i]);
        if (act && !cJSON_IsNull(act) && (!cJSON_IsString(act) || strcmp(act->valuestring, want_act)))
            die("%s: %s must be \"%s\" for %s (%s)", path, act_keys[i], want_act, mt->valuestring, gemma ? "GeGLU" : "SwiGLU");
    }
    if (c->arch != ARCH_QWEN2 && json_bool(root, "attention_bias", 0, path))
        die("%s: attention_bias true is not supported for %s", path, mt->valuestring);
    if (json_bool(root, "mlp_bias", 0, path)) die("%s: mlp_bias true is not supported", path);
    if (c->arch == ARCH_QWEN3_MOE) qwen3_moe_layers(c, root, path);
    // Sliding windows: Mistral's sliding_window applies to every layer (null: none); Gemma 3's to its
    // layer_types' sliding layers. Qwen2's use_sliding_window (layers past max_window_layers) is not done.
    if (c->arch == ARCH_MISTRAL) {
        c->window = json_window(root, 0, path);
        for (int l = 0; l < c->L; l++) c->sliding[l] = c->window > 0;
    } else if (gemma) {
        c->window = json_window(root, 4096, path);
        gemma3_layer_types(c, root, path);
        if (!c->window) memset(c->sliding, 0, sizeof c->sliding);
        c->query_pre_attn_scalar = (float)json_pos(root, "query_pre_attn_scalar", 256, 0, 0, 1e9, path);
        json_null(root, "final_logit_softcapping", "logit soft-capping (Gemma 2) is not supported: Gemma 3 has none, "
                  "set it to null", path);
        json_null(root, "attn_logit_softcapping", "attention soft-capping (Gemma 2) is not supported: Gemma 3 has none, "
                  "set it to null", path);
        if (json_bool(root, "use_bidirectional_attention", 0, path))
            die("%s: use_bidirectional_attention true (an embedding model) is not supported: fp8-grpo trains causal "
                "language models", path);
    } else if (json_bool(root, "use_sliding_window", 0, path))
        die("%s: use_sliding_window true is not supported for %s (sliding windows are for mistral and gemma3_text)", path,
            mt->valuestring);

    // RoPE: transformers 5.x writes rope_parameters {rope_theta, rope_type, ...};
    // 4.x checkpoints have rope_theta and rope_scaling {rope_type | type, ...}. Gemma 3: the full layers'
    // set as above (rope_theta 1e6 by default), the sliding layers' base rope_local_base_freq (10000 by
    // default) unscaled; 5.x writes both as rope_parameters {"full_attention": {...}, "sliding_attention": {...}}.
    cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    c->rope_theta = (float)json_pos(root, "rope_theta", gemma ? 1000000.0 : 10000.0, 0, 1, 1e12, path);
    char sp[4400];  // its fields' errors name it: "config.json: rope_scaling: \"factor\" is 0: ..."
    if (gemma) {
        c->rope_local_theta = (float)json_pos(root, "rope_local_base_freq", 10000.0, 0, 1, 1e12, path);
        cJSON *full = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "full_attention") : NULL;
        cJSON *loc = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention") : NULL;
        if (cJSON_IsObject(loc)) {
            snprintf(sp, sizeof sp, "%s: rope_parameters.sliding_attention", path);
            c->rope_local_theta = (float)json_pos(loc, "rope_theta", c->rope_local_theta, 0, 1, 1e12, sp);
            rope_scaling_read(c, loc, sp, path);
            if (c->rope_scaling) die("%s: a scaled RoPE on the sliding layers is not supported (Gemma 3 has none)", sp);
        }
        rp = cJSON_IsObject(full) ? full : cJSON_IsObject(rp) && (full || loc) ? NULL : rp;
    }
    cJSON *scaling = NULL;
    if (cJSON_IsObject(rp)) {
        c->rope_theta = (float)json_pos(rp, "rope_theta", c->rope_theta, 0, 1, 1e12, path);
        scaling = rp;
    }
    if (cJSON_IsObject(rs)) scaling = rs;
    snprintf(sp, sizeof sp, "%s: %s", path, scaling == rs ? "rope_scaling" : "rope_parameters");
    if (scaling) rope_scaling_read(c, scaling, sp, path);

    c->bos_id = -1;
    cJSON *bos = token_key(top, root, "bos_token_id"), *eos = token_key(top, root, "eos_token_id");
    if (c->mm && !bos) bos = cJSON_AddNumberToObject(root, "bos_token_id", 2);  // Gemma3TextConfig's
    if (c->mm && !eos) eos = cJSON_AddNumberToObject(root, "eos_token_id", 1);
    if (bos && !cJSON_IsNull(bos)) c->bos_id = json_id(bos, "bos_token_id", c->V, path);
    if (cJSON_IsArray(eos)) {
        int n = cJSON_GetArraySize(eos);
        if (n > (int)(sizeof c->eos_ids / sizeof c->eos_ids[0]))
            die("%s: \"eos_token_id\" lists %d ids: at most %d are supported", path, n, (int)(sizeof c->eos_ids / sizeof c->eos_ids[0]));
        cJSON *e;
        cJSON_ArrayForEach(e, eos) c->eos_ids[c->n_eos++] = json_id(e, "eos_token_id", c->V, path);
    } else if (eos && !cJSON_IsNull(eos)) c->eos_ids[c->n_eos++] = json_id(eos, "eos_token_id", c->V, path);

    // the image ids (Gemma3Config's defaults: the published checkpoints'): those inside the vocabulary are
    // what a text model must never be given or produce (transformers maps one beyond it to 0 before the lookup)
    static const char *mm_keys[3] = {"image_token_index", "boi_token_index", "eoi_token_index"};
    static const int mm_dflt[3] = {262144, 255999, 256000};
    for (int i = 0; c->mm && i < 3; i++) {
        int id = json_int(top, mm_keys[i], mm_dflt[i], 0, 0, 1 << 30, top_path);
        if (id < c->V) c->mm_ids[c->n_mm_ids++] = id;
    }
    cJSON_Delete(top);
}

static const char *const arch_names[] = {"llama", "qwen2", "qwen3", "mistral", "gemma3_text", "qwen3_moe"};

void config_print(const Config *c, FILE *f) {
    static const char *rs[] = {"", ", llama3 rope", ", linear rope"};
    int ns = 0;
    for (int l = 0; l < c->L; l++) ns += c->sliding[l];
    char win[96] = "";
    if (c->window && ns) snprintf(win, sizeof win, ", sliding window %d on %d of %d layers", c->window, ns, c->L);
    int nm = 0;
    for (int l = 0; l < c->L; l++) nm += c->moe[l];
    char moe[128] = "";
    if (c->E) snprintf(moe, sizeof moe, ", %d experts of %d (top %d%s) on %d of %d layers", c->E, c->FFe, c->K,
                       c->norm_topk ? ", renormalized" : "", nm, c->L);
    fprintf(f, "model: %s, %d layers, hidden %d, mlp %d, heads %d/%d x %d, vocab %d, %s embeddings%s%s%s%s%s\n",
            arch_names[c->arch], c->L, c->C, c->FF, c->NH, c->KVH, c->HD, c->V, c->tied ? "tied" : "untied",
            rs[c->rope_scaling], c->qk_norm ? ", qk-norm" : "", win, moe,
            c->mm ? "; the text model of a multimodal gemma3 (its vision tower and projector are not read: text only)" : "");
}
const char *config_text_prefix(const Config *c) {
    return c->mm == MM_V4 ? "language_model.model." : c->mm == MM_V5 ? "model.language_model." : "model.";
}
const char *config_head_name(const Config *c) { return c->mm == MM_V4 ? "language_model.lm_head.weight" : "lm_head.weight"; }

int hf_vision_tensor(const char *name) {
    static const char *const pre[] = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                      "model.multi_modal_projector."};
    for (int i = 0; i < 4; i++)
        if (!strncmp(name, pre[i], strlen(pre[i]))) return 1;
    return 0;
}

// A layer's norms (ln1, ln2, then Gemma 3's ln_attn, ln_mlp) as pointers into lw, with their
// checkpoint names; returns how many. Llama's post_attention_layernorm is the MLP's input norm; Gemma
// 3's is the norm of the attention's output, its MLP input norm pre_feedforward_layernorm.
static int layer_norms(const Config *c, const LayerWeights *lw, void *const **ptrs, const char **names) {
    static const char *llama[] = {"input_layernorm", "post_attention_layernorm"};
    static const char *gemma[] = {"input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm",
                                  "post_feedforward_layernorm"};
    void *const *p[4] = {&lw->ln1, &lw->ln2, &lw->ln_attn, &lw->ln_mlp};
    int n = c->gemma ? 4 : 2;
    for (int i = 0; i < n; i++) {
        if (ptrs) ptrs[i] = p[i];
        names[i] = c->gemma ? gemma[i] : llama[i];
    }
    return n;
}

static const char *const expert_names[3] = {"gate_proj", "up_proj", "down_proj"};

// ----------------------------------------------------------------------------
// loading

typedef struct {
    const SafeTensors *st;
    const Config *c;
    const Backend *be;
    const char *dir;
    uint8_t *used;  // (st->n) 1 for each tensor the model reads (walk_tensors marks them); NULL: not kept
} Loader;

static const STensor *need(const Loader *ld, const char *name, int64_t d0, int64_t d1) {
    const STensor *t = st_find(ld->st, name);
    if (!t) die("%s: missing tensor %s", ld->dir, name);
    if (ld->used) ld->used[t - ld->st->t] = 1;
    int ok = d1 ? (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1) : (t->ndim == 1 && t->shape[0] == d0);
    if (!ok) {
        char got[128] = "";
        for (int i = 0; i < t->ndim; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        die("%s: tensor %s has shape (%s) but config.json implies (%lld%s%lld)", ld->dir, name, got, (long long)d0,
            d1 ? ", " : "", d1 ? (long long)d1 : 0LL);
    }
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16 && t->dtype != DT_E4M3)
        die("%s: tensor %s has dtype %s (expected BF16, F16, F32 or F8_E4M3)", ld->dir, name, dtype_name(t->dtype));
    return t;
}

// dst NULL: the tensor checked only (walk_tensors)
static void load_dense(const Loader *ld, void *dst, const char *name, int64_t d0, int64_t d1) {
    const STensor *t = need(ld, name, d0, d1);
    if (t->dtype == DT_E4M3) die("%s: tensor %s is FP8 but only linear weights may be", ld->dir, name);
    if (dst) ld->be->upload_convert(dst, ld->be->act, t->data, t->dtype, (size_t)t->numel);
}

// a pre-quantized FP8 weight's scales, name + "_scale_inv": F32 or BF16, one per 128x128 block
static const STensor *need_scales(const Loader *ld, const char *name, int rows, int cols) {
    char sn[600];
    snprintf(sn, sizeof sn, "%s_scale_inv", name);
    const STensor *s = st_find(ld->st, sn);
    int br = (rows + 127) / 128, bc = (cols + 127) / 128;
    if (!s || (s->dtype != DT_F32 && s->dtype != DT_BF16)) die("%s: FP8 tensor %s has no F32/BF16 %s", ld->dir, name, sn);
    if (ld->used) ld->used[s - ld->st->t] = 1;
    if (!(s->ndim == 2 && s->shape[0] == br && s->shape[1] == bc))
        die("%s: %s must have shape (%d, %d): only 128x128 block-scaled FP8 checkpoints are supported", ld->dir, sn, br, bc);
    return s;
}

// A pre-quantized FP8 weight (F8_E4M3 + weight_scale_inv, 128x128 blocks, as
// vLLM / transformers' FineGrainedFP8 write them) dequantized to fp32 on the host.
static float *dequant_prequantized(const Loader *ld, const STensor *t, const char *name) {
    int rows = (int)t->shape[0], cols = (int)t->shape[1];
    int br = (rows + 127) / 128, bc = (cols + 127) / 128;
    const STensor *s = need_scales(ld, name, rows, cols);
    float *sc = (float *)mallocCheck((size_t)br * bc * sizeof(float));
    convert_to_f32(sc, s->data, s->dtype, (size_t)br * bc);
    float *f = (float *)mallocCheck((size_t)rows * cols * sizeof(float));
    const uint8_t *q = (const uint8_t *)t->data;
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) f[(size_t)r * cols + k] = fp8_e4m3_decode(q[(size_t)r * cols + k]) * sc[(r / 128) * bc + k / 128];
    free(sc);
    return f;
}

// w NULL: the tensor (rows, cols) checked only (walk_tensors)
static void load_linear(const Loader *ld, QWeight *w, const char *name, int rows, int cols, int pow2) {
    const STensor *t = need(ld, name, rows, cols);
    if (!w) {
        if (t->dtype == DT_E4M3) need_scales(ld, name, rows, cols);
        return;
    }
    if (t->dtype != DT_E4M3) {
        ld->be->quantize_weight(w, t->data, t->dtype, pow2);
        return;
    }
    // Pre-quantized block FP8 and we hold block FP8: take the codes and scales as they are.
    char sn[600];
    snprintf(sn, sizeof sn, "%s_scale_inv", name);
    const STensor *s = st_find(ld->st, sn);
    int br = (w->rows + 127) / 128, bc = (w->cols + 127) / 128;
    if (w->gran == FP8_BLOCK && s && s->dtype == DT_F32 && s->ndim == 2 && s->shape[0] == br && s->shape[1] == bc) {
        // HF's weight_scale_inv is (br, bc); ours pads each row to fp8_scale_ld floats (fp8.h)
        int sld = fp8_scale_ld(FP8_BLOCK, w->rows, w->cols, 128);
        size_t ns = fp8_num_scales(FP8_BLOCK, w->rows, w->cols, 128);
        float *sc = (float *)mallocCheck(ns * sizeof(float));
        for (size_t i = 0; i < ns; i++) sc[i] = 1.0f;
        for (int r = 0; r < br; r++) memcpy(sc + (size_t)r * sld, (const float *)s->data + (size_t)r * bc, bc * sizeof(float));
        ld->be->upload(w->q.data, t->data, (size_t)w->rows * w->cols);
        ld->be->upload(w->q.scale, sc, ns * sizeof(float));
        free(sc);
        return;
    }
    float *f = dequant_prequantized(ld, t, name);  // other granularities: requantize
    ld->be->quantize_weight(w, f, DT_F32, pow2);
    free(f);
}

// the embedding table or the LM head (V, C) into w as it is held: dense, or quantized to FP8 rows
// from the tensor as it lies in the mapped file (one tensor at a time, no copy of the whole model);
// w NULL: checked only
static void load_vocab(const Loader *ld, QWeight *w, const char *name, int pow2) {
    if (!w || w->gran == FP8_OFF) {
        load_dense(ld, w ? w->dense : NULL, name, ld->c->V, ld->c->C);
        return;
    }
    const STensor *t = need(ld, name, ld->c->V, ld->c->C);
    if (t->dtype == DT_E4M3) die("%s: tensor %s is FP8 but only linear weights may be", ld->dir, name);
    ld->be->quantize_weight(w, t->data, t->dtype, pow2);
}

static void read_config(Config *c, const char *dir) {
    char p[4096];
    path_join(p, sizeof p, dir, "config.json");
    if (!file_exists(p)) die("%s: no config.json: --model expects a Hugging Face checkpoint directory", dir);
    char *text = read_file(p, NULL);
    config_from_json(c, text, p);
    free(text);
}

// Every tensor of the checkpoint in config.json's shapes: with m NULL, each one's presence, shape
// and dtype (and a pre-quantized weight's scales) checked; with the model, loaded. model_load walks
// twice, checking before it allocates anything, so that a config.json that disagrees with its
// weights (vocab_size 953326694 next to an embedding table of 320 rows) is an error naming the
// tensor, never an allocation sized by config.json alone: what is allocated is then bounded by the
// size of the files.
static void walk_tensors(const Loader *ld, Model *m) {
    const Config *c = ld->c;
    char nm[512];
    const char *pre = config_text_prefix(c);
    load_vocab(ld, m ? &m->w.emb : NULL, (snprintf(nm, sizeof nm, "%sembed_tokens.weight", pre), nm), m ? m->opt.pow2 : 0);
    load_dense(ld, m ? m->w.norm : NULL, (snprintf(nm, sizeof nm, "%snorm.weight", pre), nm), c->C, 0);
    if (!c->tied) load_vocab(ld, m ? &m->w.head : NULL, config_head_name(c), m ? m->opt.pow2 : 0);
    if (c->num_labels) load_dense(ld, m ? m->w.score : NULL, "score.weight", c->num_labels, c->C);
    for (int l = 0; l < c->L; l++) {
        LayerWeights *lw = m ? &m->w.layers[l] : NULL;
#define LNAME(fmt, ...) (snprintf(nm, sizeof nm, "%slayers.%d." fmt, pre, l, __VA_ARGS__), nm)
        void *const *np[4];
        const char *nn[4];
        int nnorm = layer_norms(c, lw ? lw : &(LayerWeights){0}, np, nn);
        for (int i = 0; i < nnorm; i++) load_dense(ld, lw ? *np[i] : NULL, LNAME("%s.weight", nn[i]), c->C, 0);
        if (c->qk_norm) {
            load_dense(ld, lw ? lw->q_norm : NULL, LNAME("%s", "self_attn.q_norm.weight"), c->HD, 0);
            load_dense(ld, lw ? lw->k_norm : NULL, LNAME("%s", "self_attn.k_norm.weight"), c->HD, 0);
        }
        for (int i = 0; i < LIN_COUNT; i++) {
            int rows, cols;
            if (c->moe[l] && i >= LIN_GATE) continue;  // the experts in place of the MLP: below
            lin_shape(c, i, &rows, &cols);
            if (c->qkv_bias && i < 3) load_dense(ld, lw ? lw->bias[i] : NULL, LNAME("self_attn.%s.bias", lin_names[i]), rows, 0);
            load_linear(ld, lw ? &lw->lin[i] : NULL, LNAME("%s.%s.weight", lin_parent[i], lin_names[i]), rows, cols,
                        m ? m->opt.pow2 : 0);
        }
        if (c->moe[l]) {  // the router mlp.gate, then mlp.experts.e.{gate,up,down}_proj (each its own scales)
            load_dense(ld, lw ? lw->router.dense : NULL, LNAME("%s", "mlp.gate.weight"), c->E, c->C);
            for (int e = 0; e < c->E; e++)
                for (int k = 0; k < 3; k++) {
                    int rows, cols;
                    expert_shape(c, k, &rows, &cols);
                    load_linear(ld, lw ? &lw->experts[3 * e + k] : NULL, LNAME("mlp.experts.%d.%s.weight", e, expert_names[k]),
                                rows, cols, m ? m->opt.pow2 : 0);
                }
        }
#undef LNAME
    }
}

// The checkpoint's tensors the model config.json describes does not read, named on one line, as
// transformers names them ("Some weights of the model checkpoint were not used"): a num_hidden_layers
// below the checkpoint's layers, say, loads a smaller model than the one trained. Not named: what
// transformers ignores too (a tied model's lm_head.weight, the rotary inv_freq buffers of older
// Llama checkpoints), and a multimodal Gemma 3's vision tower and projector (config_print says so).
static void warn_unused(const Loader *ld) {
    int n = 0;
    char names[512] = "";
    size_t len = 0;
    for (int i = 0; i < ld->st->n; i++) {
        const char *nm = ld->st->t[i].name;
        size_t k = strlen(nm);
        if (ld->used[i] || (ld->c->tied && !strcmp(nm, config_head_name(ld->c))) || (k >= 9 && !strcmp(nm + k - 9, ".inv_freq")) ||
            (ld->c->mm && hf_vision_tensor(nm)))
            continue;
        if (n++ < 3 && len < sizeof names) len += snprintf(names + len, sizeof names - len, "%s%s", n > 1 ? ", " : "", nm);
    }
    if (n)
        fprintf(stderr, "warning: %s: %d tensor%s of the checkpoint %s not used by the model config.json describes (%s%s): "
                "check config.json (num_hidden_layers %d)\n", ld->dir, n, n > 1 ? "s" : "", n > 1 ? "are" : "is", names,
                n > 3 ? ", ..." : "", ld->c->L);
}

void config_load_dir(Config *c, const char *dir) { read_config(c, dir); }

// A tokenizer with more ids than the checkpoint's vocabulary (a tokenizer.json of another
// model) would fail at the first prompt that reaches a large id, with an id out of range deep
// in the forward: said here instead, before the weights are read. The reverse is normal: real
// checkpoints pad vocab_size beyond the tokenizer's ids (Qwen: 151,936 rows, 151,669 ids).
void config_check_tokenizer(const Config *c, int tokenizer_vocab, const char *dir) {
    if (tokenizer_vocab > c->V)
        die("%s: tokenizer.json has ids up to %d but config.json's vocab_size is %d: the tokenizer and the checkpoint "
            "disagree (use the tokenizer.json saved with this checkpoint)",
            dir, tokenizer_vocab - 1, c->V);
}

// A multimodal Gemma 3's text model under transformers 4.x's names or 5.x's: which, from the embedding table
static void find_layout(Config *c, const SafeTensors *st, const char *dir) {
    if (!c->mm) return;
    c->mm = MM_V4;
    if (st_find(st, "language_model.model.embed_tokens.weight")) return;
    c->mm = MM_V5;
    if (st_find(st, "model.language_model.embed_tokens.weight")) return;
    die("%s: config.json says gemma3 (Gemma3ForConditionalGeneration), but the weights hold neither "
        "language_model.model.embed_tokens.weight (transformers 4.x names) nor model.language_model.embed_tokens.weight "
        "(5.x): is this the multimodal checkpoint's own safetensors?", dir);
}

// classifier: a *ForSequenceClassification is wanted (model_load_classifier), and only one is taken
static void load_impl(Model *m, const char *dir, const Backend *be, const ModelOptions *opt, int classifier) {
    Config c;
    read_config(&c, dir);
    if (c.num_labels && !classifier)
        die("%s is a *ForSequenceClassification checkpoint (a reward model: --reward_model takes it), not a language model: "
            "give a *ForCausalLM checkpoint", dir);
    if (!c.num_labels && classifier)
        die("%s: config.json's architectures name no *ForSequenceClassification: not a reward model checkpoint", dir);
    SafeTensors st;
    st_open_dir(&st, dir);
    if (classifier && !st_find(&st, "score.weight"))
        die("%s: the checkpoint has no score head (score.weight): save the reward model with its head (save_pretrained of "
            "the *ForSequenceClassification)", dir);
    find_layout(&c, &st, dir);
    if (!c.tied && !st_find(&st, config_head_name(&c)))
        die("%s: missing tensor %s (and tie_word_embeddings is false)", dir, config_head_name(&c));
    Loader ld = {&st, &c, be, dir, (uint8_t *)callocCheck(st.n ? st.n : 1, 1)};
    walk_tensors(&ld, NULL);
    warn_unused(&ld);
    model_common_init(m, &c, be, opt);
    m->src_dir = str_dup(dir);
    walk_tensors(&ld, m);
    be->sync();
    free(ld.used);
    st_close(&st);
}

void model_load(Model *m, const char *dir, const Backend *be, const ModelOptions *opt) { load_impl(m, dir, be, opt, 0); }
void model_load_classifier(Model *m, const char *dir, const Backend *be, const ModelOptions *opt) { load_impl(m, dir, be, opt, 1); }

// buf[i] = bound * U(-1, 1), element i drawn from its own counter-based stream (seed, tag, i):
// parallel over elements and the same for any thread count (an 8B model in seconds)
static void fill_uniform(float *buf, size_t n, double bound, uint64_t seed, uint64_t tag) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ tag * 0xd1b54a32d192ed03ull ^ i;
        double u = (double)(splitmix64(&x) >> 11) * (1.0 / 9007199254740992.0);
        buf[i] = (float)(bound * (2.0 * u - 1.0));
    }
}

// nn.Linear-like init: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)); embeddings uniform with std
// 1/sqrt(C); norms 1, biases 0
void model_init_random(Model *m, const Config *c, const Backend *be, const ModelOptions *opt, uint64_t seed) {
    model_common_init(m, c, be, opt);
    size_t big = (size_t)c->V * c->C;
    size_t lmax = (size_t)(c->FF > c->NH * c->HD ? c->FF : c->NH * c->HD) * (c->C > c->FF ? c->C : c->FF);
    if (lmax > big) big = lmax;
    size_t emax = (size_t)c->C * (c->E > c->FFe ? c->E : c->FFe);  // the router's and the experts' sizes
    if (emax > big) big = emax;
    float *buf = (float *)mallocCheck(big * sizeof(float));
    double es = sqrt(3.0 / c->C);  // uniform(-b, b) has std b / sqrt(3)
    uint64_t tag = 1;
    fill_uniform(buf, (size_t)c->V * c->C, es, seed, tag++);
    be->quantize_weight(&m->w.emb, buf, DT_F32, m->opt.pow2);  // dense: converted; FP8: rows quantized
    if (!c->tied) {
        fill_uniform(buf, (size_t)c->V * c->C, es, seed, tag++);
        be->quantize_weight(&m->w.head, buf, DT_F32, m->opt.pow2);
    }
    for (int i = 0; i < c->C; i++) buf[i] = c->gemma ? 0.0f : 1.0f;
    be->upload_convert(m->w.norm, be->act, buf, DT_F32, c->C);
    for (int l = 0; l < c->L; l++) {
        LayerWeights *lw = &m->w.layers[l];
        for (int i = 0; i < c->C; i++) buf[i] = c->gemma ? 0.0f : 1.0f;  // Gemma's norms multiply by 1 + w
        void *const *np[4];
        const char *nn[4];
        int nnorm = layer_norms(c, lw, np, nn);
        for (int i = 0; i < nnorm; i++) be->upload_convert(*np[i], be->act, buf, DT_F32, c->C);
        if (c->qk_norm) {
            be->upload_convert(lw->q_norm, be->act, buf, DT_F32, c->HD);
            be->upload_convert(lw->k_norm, be->act, buf, DT_F32, c->HD);
        }
        if (c->qkv_bias)
            for (int i = 0; i < 3; i++) {
                for (int j = 0; j < lw->lin[i].rows; j++) buf[j] = 0.0f;
                be->upload_convert(lw->bias[i], be->act, buf, DT_F32, lw->lin[i].rows);
            }
        for (int i = 0; i < LIN_COUNT; i++) {
            QWeight *w = &lw->lin[i];
            if (!w->rows) continue;  // a sparse layer's absent MLP
            fill_uniform(buf, (size_t)w->rows * w->cols, 1.0 / sqrt((double)w->cols), seed, tag++);
            be->quantize_weight(w, buf, DT_F32, m->opt.pow2);
        }
        if (c->moe[l])  // the router, then the experts
            for (int i = -1; i < 3 * c->E; i++) {
                QWeight *w = i < 0 ? &lw->router : &lw->experts[i];
                fill_uniform(buf, (size_t)w->rows * w->cols, 1.0 / sqrt((double)w->cols), seed, tag++);
                be->quantize_weight(w, buf, DT_F32, m->opt.pow2);
            }
    }
    free(buf);
    be->sync();
}

// ----------------------------------------------------------------------------
// saving as a Hugging Face checkpoint

static void *to_host_dtype(const Model *m, const void *src, size_t n, DType dt, int is_linear, const QWeight *w) {
    const Backend *be = m->be;
    size_t esz = dtype_size(be->act);
    void *tmp = mallocCheck(n * esz);
    if (is_linear) {
        void *dev = be->alloc(n * esz);
        be->dequantize_weight(dev, w);
        be->download(tmp, dev, n * esz);
        be->free(dev);
    } else be->download(tmp, src, n * esz);
    float *f = (float *)mallocCheck(n * sizeof(float));
    convert_to_f32(f, tmp, be->act, n);
    free(tmp);
    if (dt == DT_F32) return f;
    uint16_t *b = (uint16_t *)mallocCheck(n * 2);
    for (size_t i = 0; i < n; i++) b[i] = f32_to_bf16(f[i]);
    free(f);
    return b;
}

// A multimodal Gemma 3's config.json around its text model's (text): the base's (src_dir's) with text_config
// replaced, or for a model made here Gemma3ForConditionalGeneration with the published checkpoints' vision tower
// (SigLIP so400m, 896-pixel images of 14-pixel patches, 256 tokens an image) in vision_config, whose weights are
// not written: transformers loads such a checkpoint with the vision tower freshly initialized, and says so.
static cJSON *gemma3_wrap(const Config *c, cJSON *text, const char *src_dir) {
    cJSON_DeleteItemFromObjectCaseSensitive(text, "architectures");
    const char *dt = cJSON_GetObjectItemCaseSensitive(text, "torch_dtype")->valuestring;
    if (src_dir) {
        char p[4096];
        path_join(p, sizeof p, src_dir, "config.json");
        cJSON *r = read_json_object(p);
        cJSON_ReplaceItemInObjectCaseSensitive(r, "text_config", text);
        cJSON_DeleteItemFromObjectCaseSensitive(r, "dtype");  // 5.x's name of torch_dtype
        cJSON_DeleteItemFromObjectCaseSensitive(r, "torch_dtype");
        cJSON_AddStringToObject(r, "torch_dtype", dt);
        return r;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "architectures"), cJSON_CreateString("Gemma3ForConditionalGeneration"));
    cJSON_AddStringToObject(r, "model_type", "gemma3");
    cJSON_AddItemToObject(r, "text_config", text);
    cJSON *v = cJSON_AddObjectToObject(r, "vision_config");
    cJSON_AddStringToObject(v, "model_type", "siglip_vision_model");
    cJSON_AddNumberToObject(v, "hidden_size", 1152);
    cJSON_AddNumberToObject(v, "intermediate_size", 4304);
    cJSON_AddNumberToObject(v, "num_hidden_layers", 27);
    cJSON_AddNumberToObject(v, "num_attention_heads", 16);
    cJSON_AddNumberToObject(v, "image_size", 896);
    cJSON_AddNumberToObject(v, "patch_size", 14);
    cJSON_AddBoolToObject(v, "vision_use_head", 0);
    cJSON_AddNumberToObject(r, "mm_tokens_per_image", 256);
    static const char *mm_keys[3] = {"image_token_index", "boi_token_index", "eoi_token_index"};
    for (int i = 0; c->n_mm_ids == 3 && i < 3; i++) cJSON_AddNumberToObject(r, mm_keys[i], c->mm_ids[i]);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tied);
    cJSON_AddStringToObject(r, "torch_dtype", dt);
    return r;
}

// config.json in the keys of transformers 4.x (which 5.x reads too)
static void config_write(const Config *c, const char *path, DType dt, const char *src_dir) {
    static const char *cls[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                                "Gemma3ForCausalLM", "Qwen3MoeForCausalLM"};
    cJSON *r = cJSON_CreateObject();
    cJSON *ar = cJSON_AddArrayToObject(r, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString(cls[c->arch]));
    cJSON_AddStringToObject(r, "model_type", arch_names[c->arch]);
    cJSON_AddNumberToObject(r, "vocab_size", c->V);
    cJSON_AddNumberToObject(r, "hidden_size", c->C);
    cJSON_AddNumberToObject(r, "intermediate_size", c->FF);
    cJSON_AddNumberToObject(r, "num_hidden_layers", c->L);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->NH);
    cJSON_AddNumberToObject(r, "num_key_value_heads", c->KVH);
    cJSON_AddNumberToObject(r, "head_dim", c->HD);
    cJSON_AddNumberToObject(r, "max_position_embeddings", c->max_pos);
    cJSON_AddNumberToObject(r, "rms_norm_eps", c->eps);
    cJSON_AddNumberToObject(r, "rope_theta", c->rope_theta);
    if (c->rope_scaling == 1) {
        cJSON *s = cJSON_AddObjectToObject(r, "rope_scaling");
        cJSON_AddStringToObject(s, "rope_type", "llama3");
        cJSON_AddNumberToObject(s, "factor", c->rope_factor);
        cJSON_AddNumberToObject(s, "low_freq_factor", c->rope_low_freq_factor);
        cJSON_AddNumberToObject(s, "high_freq_factor", c->rope_high_freq_factor);
        cJSON_AddNumberToObject(s, "original_max_position_embeddings", c->rope_original_max_pos);
    } else if (c->rope_scaling == 2) {
        cJSON *s = cJSON_AddObjectToObject(r, "rope_scaling");
        cJSON_AddStringToObject(s, "rope_type", "linear");
        cJSON_AddNumberToObject(s, "factor", c->rope_factor);
    }
    if (c->arch == ARCH_MISTRAL || c->gemma) {
        if (c->window) cJSON_AddNumberToObject(r, "sliding_window", c->window);
        else cJSON_AddNullToObject(r, "sliding_window");
    }
    if (c->gemma) {
        cJSON_AddNumberToObject(r, "rope_local_base_freq", c->rope_local_theta);
        cJSON_AddNumberToObject(r, "query_pre_attn_scalar", c->query_pre_attn_scalar);
        cJSON *lt = cJSON_AddArrayToObject(r, "layer_types");
        for (int l = 0; l < c->L; l++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(c->sliding[l] ? "sliding_attention" : "full_attention"));
        cJSON_AddNullToObject(r, "final_logit_softcapping");
        cJSON_AddNullToObject(r, "attn_logit_softcapping");
    }
    if (c->E) {
        cJSON_AddNumberToObject(r, "num_experts", c->E);
        cJSON_AddNumberToObject(r, "num_experts_per_tok", c->K);
        cJSON_AddNumberToObject(r, "moe_intermediate_size", c->FFe);
        cJSON_AddBoolToObject(r, "norm_topk_prob", c->norm_topk);
        cJSON_AddNumberToObject(r, "decoder_sparse_step", 1);  // and the dense layers listed:
        cJSON *only = cJSON_AddArrayToObject(r, "mlp_only_layers");
        for (int l = 0; l < c->L; l++)
            if (!c->moe[l]) cJSON_AddItemToArray(only, cJSON_CreateNumber(l));
    }
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tied);
    cJSON_AddStringToObject(r, c->gemma ? "hidden_activation" : "hidden_act", c->gemma ? "gelu_pytorch_tanh" : "silu");
    cJSON_AddBoolToObject(r, "attention_bias", 0);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(r, "bos_token_id", c->bos_id);
    if (c->n_eos == 1) cJSON_AddNumberToObject(r, "eos_token_id", c->eos_ids[0]);
    else if (c->n_eos > 1) {
        cJSON *e = cJSON_AddArrayToObject(r, "eos_token_id");
        for (int i = 0; i < c->n_eos; i++) cJSON_AddItemToArray(e, cJSON_CreateNumber(c->eos_ids[i]));
    }
    cJSON_AddStringToObject(r, "torch_dtype", dt == DT_F32 ? "float32" : "bfloat16");
    if (c->mm) r = gemma3_wrap(c, r, src_dir);
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    write_file_atomic(path, text, strlen(text));
    free(text);
}

// The model's tensors in a Hugging Face checkpoint's names and order (model.h)
int model_hf_tensors(const Model *m, HFTensor *out) {
    const Config *c = &m->cfg;
    int n = 0;
#define ADD(dense_, lin_, l_, i_, d0, d1, ...)                                                              \
    do {                                                                                                   \
        if (out) {                                                                                         \
            out[n] = (HFTensor){.rows = (d0), .cols = (d1), .dense = (dense_), .lin = (lin_), .layer = (l_),     \
                                .which = (i_), .expert = -1};                                              \
            snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__);                                        \
        }                                                                                                  \
        n++;                                                                                               \
    } while (0)
    // FP8 embeddings / LM head are given as weights (lin), which model_save_hf dequantizes
    const char *pre = config_text_prefix(c);
    ADD(m->w.wte, m->w.wte ? NULL : &m->w.emb, -1, -1, c->V, c->C, "%sembed_tokens.weight", pre);
    ADD(m->w.norm, NULL, -1, -1, c->C, 0, "%snorm.weight", pre);
    if (!c->tied) ADD(m->w.lm_head, m->w.lm_head ? NULL : &m->w.head, -1, -1, c->V, c->C, "%s", config_head_name(c));
    for (int l = 0; l < c->L; l++) {
        const LayerWeights *lw = &m->w.layers[l];
        void *const *np[4];
        const char *nn[4];
        int nnorm = layer_norms(c, lw, np, nn);
        for (int i = 0; i < nnorm; i++) ADD(*np[i], NULL, -1, -1, c->C, 0, "%slayers.%d.%s.weight", pre, l, nn[i]);
        if (c->qk_norm) {
            ADD(lw->q_norm, NULL, -1, -1, c->HD, 0, "%slayers.%d.self_attn.q_norm.weight", pre, l);
            ADD(lw->k_norm, NULL, -1, -1, c->HD, 0, "%slayers.%d.self_attn.k_norm.weight", pre, l);
        }
        if (c->qkv_bias)
            for (int i = 0; i < 3; i++)
                ADD(lw->bias[i], NULL, -1, -1, lw->lin[i].rows, 0, "%slayers.%d.self_attn.%s.bias", pre, l, lin_names[i]);
        for (int i = 0; i < LIN_COUNT; i++)
            if (lw->lin[i].rows)  // (a sparse layer's MLP is its router and experts)
                ADD(NULL, &lw->lin[i], l, i, lw->lin[i].rows, lw->lin[i].cols, "%slayers.%d.%s.%s.weight", pre, l,
                    lin_parent[i], lin_names[i]);
        if (!c->moe[l]) continue;
        // the router; the experts as dense tensors where they are (no adapter merges into them), FP8 ones
        // as weights of no projection (layer and which -1), which model_save_hf dequantizes
        ADD(lw->router.dense, NULL, -1, -1, c->E, c->C, "%slayers.%d.mlp.gate.weight", pre, l);
        for (int k = 0; k < 3 * c->E; k++) {
            const QWeight *w = &lw->experts[k];
            ADD(w->gran == FP8_OFF ? w->dense : NULL, w->gran == FP8_OFF ? NULL : w, -1, -1, w->rows, w->cols,
                "%slayers.%d.mlp.experts.%d.%s.weight", pre, l, k / 3, expert_names[k % 3]);
            if (out) out[n - 1].layer = l, out[n - 1].expert = k;  // (what ./export merges an expert adapter into)
        }
    }
#undef ADD
    return n;
}

void model_save_hf(const Model *m, const char *dir, DType dt) {
    if (dt != DT_F32 && dt != DT_BF16) die("model_save_hf: dtype must be F32 or BF16");
    mkdir(dir, 0755);
    int n = model_hf_tensors(m, NULL);
    HFTensor *h = (HFTensor *)mallocCheck(n * sizeof(HFTensor));
    model_hf_tensors(m, h);
    SafeTensors base;  // a multimodal Gemma 3's vision tower and projector, as the checkpoint read holds them
    int from_base = m->cfg.mm && m->src_dir, nt = n;
    if (from_base) {
        st_open_dir(&base, m->src_dir);
        for (int i = 0; i < base.n; i++) nt += hf_vision_tensor(base.t[i].name);
    }
    STWrite *t = (STWrite *)callocCheck(nt, sizeof(STWrite));
    void **bufs = (void **)callocCheck(n, sizeof(void *));
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)h[i].rows * (h[i].cols ? h[i].cols : 1);
        bufs[i] = to_host_dtype(m, h[i].dense, numel, dt, h[i].lin != NULL, h[i].lin);
        t[i] = (STWrite){h[i].name, dt, h[i].cols ? 2 : 1, {h[i].rows, h[i].cols}, bufs[i]};
    }
    for (int i = 0, k = n; from_base && i < base.n; i++) {
        const STensor *b = &base.t[i];
        if (!hf_vision_tensor(b->name)) continue;
        t[k] = (STWrite){b->name, b->dtype, b->ndim, {0}, b->data};
        memcpy(t[k++].shape, b->shape, sizeof b->shape);
    }
    char p[4096];
    path_join(p, sizeof p, dir, "model.safetensors");
    st_write(p, t, nt, "{\"format\":\"pt\"}");
    if (from_base) st_close(&base);
    path_join(p, sizeof p, dir, "config.json");
    config_write(&m->cfg, p, dt, m->cfg.mm ? m->src_dir : NULL);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(h);
    free(t);
    free(bufs);
}

// ----------------------------------------------------------------------------
// SQNR report: each linear weight of a checkpoint at each granularity

// the SQNR (dB) of the checkpoint's weight name (rows, cols) held in E4M3 per tensor, row, block, block with
// power-of-two scales, into db
static void weight_sqnr(const Loader *ld, const char *name, int rows, int cols, double db[4]) {
    const STensor *t = need(ld, name, rows, cols);
    size_t n = (size_t)rows * cols;
    float *x;
    if (t->dtype == DT_E4M3) x = dequant_prequantized(ld, t, name);
    else {
        x = (float *)mallocCheck(n * sizeof(float));
        convert_to_f32(x, t->data, t->dtype, n);
    }
    FP8Gran gs[4] = {FP8_TENSOR, FP8_ROW, FP8_BLOCK, FP8_BLOCK};
    for (int k = 0; k < 4; k++) {
        FP8Tensor q;
        fp8_tensor_alloc_cpu(&q, rows, cols, gs[k], FP8_E4M3, 128);
        fp8_quantize_cpu(&q, x, k == 3);
        db[k] = fp8_sqnr_db(x, &q);
        fp8_tensor_free_cpu(&q);
    }
    free(x);
}

void model_sqnr_report(const char *dir, FILE *f) {
    Config c;
    read_config(&c, dir);
    SafeTensors st;
    st_open_dir(&st, dir);
    find_layout(&c, &st, dir);
    Loader ld = {&st, &c, NULL, dir, NULL};
    fprintf(f, "per-layer FP8 (E4M3) quantization error of %s: SQNR in dB (higher is better)\n", dir);
    fprintf(f, "%-5s %-10s %9s %9s %9s %11s\n", "layer", "weight", "tensor", "row", "block", "block-pow2");
    double tot[4] = {0};
    int cnt = 0;
    for (int l = 0; l < c.L; l++) {
        for (int i = 0; i < LIN_COUNT; i++) {
            if (c.moe[l] && i >= LIN_GATE) continue;  // a sparse layer's experts: below
            char nm[512];
            snprintf(nm, sizeof nm, "%slayers.%d.%s.%s.weight", config_text_prefix(&c), l, lin_parent[i], lin_names[i]);
            int rows, cols;
            lin_shape(&c, i, &rows, &cols);
            double db[4];
            weight_sqnr(&ld, nm, rows, cols, db);
            for (int k = 0; k < 4; k++) tot[k] += db[k];
            cnt++;
            fprintf(f, "%-5d %-10s %9.2f %9.2f %9.2f %11.2f\n", l, lin_names[i], db[0], db[1], db[2], db[3]);
        }
        for (int k = 0; c.moe[l] && k < 3; k++) {  // Qwen3 MoE: each projection's mean over the experts
            double mean[4] = {0};
            int rows, cols;
            expert_shape(&c, k, &rows, &cols);
            for (int e = 0; e < c.E; e++) {
                char nm[512];
                double db[4];
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, expert_names[k]);
                weight_sqnr(&ld, nm, rows, cols, db);
                for (int j = 0; j < 4; j++) mean[j] += db[j] / c.E, tot[j] += db[j];
                cnt++;
            }
            fprintf(f, "%-5d %-10s %9.2f %9.2f %9.2f %11.2f  (mean of %d experts)\n", l, expert_names[k], mean[0], mean[1],
                    mean[2], mean[3], c.E);
        }
    }
    fprintf(f, "%-16s %9.2f %9.2f %9.2f %11.2f\n", "mean", tot[0] / cnt, tot[1] / cnt, tot[2] / cnt, tot[3] / cnt);
    st_close(&st);
}
