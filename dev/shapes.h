// dev/shapes.h: the model shapes the benchmarks build from random weights (the 0.6B and 8B ones are
// the configurations dev/peers.py builds for the peers). Each is the checkpoint's config.json as
// model_load would read it: Qwen3-0.6B, Qwen3-8B, Qwen3-32B, Llama-3.3-70B (Llama 3 RoPE scaling),
// Gemma-3-4B and Gemma-3-27B as published (the multimodal checkpoint: --save writes Gemma3ForConditionalGeneration's
// config.json and tensor names, the text model's weights alone), Mistral-7B (v0.3) and Qwen3-30B-A3B (the
// mixture of experts: --save writes Qwen3MoeForCausalLM's config.json, model_type qwen3_moe, and its names);
// and the Llama-3.2 1B and 3B shapes of the full fine-tuning benchmarks (bench_full, bench_dp).
#ifndef SHAPES_H
#define SHAPES_H

#include <string.h>

#include "model.h"

#define SHAPE_NAMES "135m|0.6b|8b|32b|70b|gemma3-4b|gemma3-27b|mistral-7b|qwen3-30b-a3b"

// "135m": SmolLM2-135M's config (Llama: 30 layers, hidden 576, 9/3 heads x 64, FF 1536, tied, vocab
// 49,152; 576 is not a multiple of 128: FP8 block scaling's partial blocks);
// "0.6b": 28 layers, hidden 1024, 16/8 heads x 128, FF 3072, tied; "8b": 36 layers, hidden 4096,
// 32/8 heads, FF 12288, untied; "32b": 64 layers, hidden 5120, 64/8 heads, FF 25600, untied (vocab
// 151,936 each, Qwen3); "70b": Llama-3.3-70B, 80 layers, hidden 8192, 64/8 heads, FF 28672, vocab
// 128,256, untied; "gemma3-4b": Gemma 3's text layer (norms x (1 + w), four a layer, GeGLU), 34 layers,
// hidden 2560, 8/4 heads x 256, FF 10240, vocab 262,208, tied, every sixth layer full and the others
// a 1024-token sliding window (RoPE base 10,000; the full layers' 1e6 with linear scaling 8);
// "gemma3-27b": the same with 62 layers, hidden 5376, 32/16 heads x 128, FF 21504, queries scaled by
// 168^-0.5; "mistral-7b": Mistral-7B-v0.3, Llama's layer, 32 layers, hidden 4096, 32/8 heads x 128,
// FF 14336, vocab 32,768, untied, no window; "qwen3-30b-a3b": Qwen3-30B-A3B, Qwen3's attention (qk-norm) in 48
// layers, hidden 2048, 32/4 heads x 128, vocab 151,936, untied, and on every layer (decoder_sparse_step 1, no
// mlp_only_layers) 128 experts of 768, 8 a token, norm_topk_prob (intermediate_size 6144, the dense MLP's,
// unused). Dies on another name.
static inline Config bench_shape(const char *size) {
    Config c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_QWEN3;
    c.V = 151936;
    c.HD = 128;
    c.KVH = 8;
    c.max_pos = 40960;
    c.eps = 1e-6f;
    c.rope_theta = 1e6f;
    c.qk_norm = 1;
    c.bos_id = -1;
    c.eos_ids[0] = 151645;
    c.n_eos = 1;
    if (!strcmp(size, "135m")) {
        c.arch = ARCH_LLAMA;
        c.V = 49152, c.C = 576, c.FF = 1536, c.L = 30, c.NH = 9, c.KVH = 3, c.HD = 64, c.tied = 1, c.qk_norm = 0;
        c.max_pos = 8192, c.eps = 1e-5f, c.rope_theta = 100000.0f;
        c.eos_ids[0] = 2;
    } else if (!strcmp(size, "0.6b")) {
        c.C = 1024, c.FF = 3072, c.L = 28, c.NH = 16, c.tied = 1;
    } else if (!strcmp(size, "8b")) {
        c.C = 4096, c.FF = 12288, c.L = 36, c.NH = 32, c.tied = 0;
    } else if (!strcmp(size, "32b")) {
        c.C = 5120, c.FF = 25600, c.L = 64, c.NH = 64, c.tied = 0;
    } else if (!strcmp(size, "70b")) {
        c.arch = ARCH_LLAMA;
        c.V = 128256, c.C = 8192, c.FF = 28672, c.L = 80, c.NH = 64, c.tied = 0, c.qk_norm = 0;
        c.max_pos = 131072, c.eps = 1e-5f, c.rope_theta = 500000.0f;
        c.rope_scaling = 1, c.rope_factor = 8.0f, c.rope_low_freq_factor = 1.0f, c.rope_high_freq_factor = 4.0f;
        c.rope_original_max_pos = 8192;
        c.bos_id = 128000;
        c.eos_ids[0] = 128001, c.eos_ids[1] = 128008, c.eos_ids[2] = 128009, c.n_eos = 3;
    } else if (!strncmp(size, "gemma3-", 7) && (!strcmp(size + 7, "4b") || !strcmp(size + 7, "27b"))) {
        int big = !strcmp(size + 7, "27b");
        c.arch = ARCH_GEMMA3, c.gemma = 1, c.qk_norm = 1, c.tied = 1;
        c.V = 262208, c.max_pos = 131072, c.eps = 1e-6f, c.rope_theta = 1e6f, c.rope_local_theta = 10000.0f;
        c.rope_scaling = 2, c.rope_factor = 8.0f;
        if (big) c.C = 5376, c.FF = 21504, c.L = 62, c.NH = 32, c.KVH = 16, c.HD = 128, c.query_pre_attn_scalar = 168;
        else c.C = 2560, c.FF = 10240, c.L = 34, c.NH = 8, c.KVH = 4, c.HD = 256, c.query_pre_attn_scalar = 256;
        c.window = 1024;
        for (int l = 0; l < c.L; l++) c.sliding[l] = (l + 1) % 6 != 0;
        c.bos_id = 2, c.eos_ids[0] = 1, c.eos_ids[1] = 106, c.n_eos = 2;
        c.mm = MM_V4, c.mm_ids[0] = 262144, c.mm_ids[1] = 255999, c.mm_ids[2] = 256000, c.n_mm_ids = 3;
    } else if (!strcmp(size, "mistral-7b")) {
        c.arch = ARCH_MISTRAL;
        c.V = 32768, c.C = 4096, c.FF = 14336, c.L = 32, c.NH = 32, c.KVH = 8, c.HD = 128, c.tied = 0, c.qk_norm = 0;
        c.max_pos = 32768, c.eps = 1e-5f, c.rope_theta = 1e6f;
        c.bos_id = 1, c.eos_ids[0] = 2;
    } else if (!strcmp(size, "qwen3-30b-a3b")) {
        c.arch = ARCH_QWEN3_MOE;
        c.C = 2048, c.FF = 6144, c.L = 48, c.NH = 32, c.KVH = 4, c.tied = 0;
        c.E = 128, c.K = 8, c.FFe = 768, c.norm_topk = 1;
        for (int l = 0; l < c.L; l++) c.moe[l] = 1;
    } else die("--model must be one of " SHAPE_NAMES ", got '%s'", size);
    return c;
}

// "1b": Llama-3.2-1B (hidden 2048, 16 layers, 32/8 heads x 64, FF 8192, tied, vocab 128256);
// "3b": Llama-3.2-3B (hidden 3072, 28 layers, 24/8 heads x 128, FF 8192, tied);
// "8b": Llama-3.1-8B (hidden 4096, 32 layers, 32/8 heads x 128, FF 14336, an untied head)
static inline Config llama32_shape(const char *size) {
    Config c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_LLAMA;
    c.V = 128256, c.KVH = 8, c.max_pos = 131072, c.eps = 1e-5f, c.rope_theta = 500000.0f, c.tied = 1;
    c.bos_id = 128000, c.eos_ids[0] = 128001, c.n_eos = 1;
    if (!strcmp(size, "1b")) c.C = 2048, c.FF = 8192, c.L = 16, c.NH = 32, c.HD = 64;
    else if (!strcmp(size, "3b")) c.C = 3072, c.FF = 8192, c.L = 28, c.NH = 24, c.HD = 128;
    else if (!strcmp(size, "8b")) c.C = 4096, c.FF = 14336, c.L = 32, c.NH = 32, c.HD = 128, c.tied = 0;
    else die("--model must be 1b, 3b or 8b, got '%s'", size);
    return c;
}

#endif  // SHAPES_H
