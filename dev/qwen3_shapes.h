// dev/qwen3_shapes.h: the Qwen3-0.6B and Qwen3-8B shapes the benchmarks use (the same
// configurations dev/peers.py builds for the peers: random weights), and the Llama-3.2 1B and 3B
// shapes of the full fine-tuning benchmarks (bench_full, bench_dp).
#ifndef QWEN3_SHAPES_H
#define QWEN3_SHAPES_H

#include <string.h>

#include "model.h"

// "0.6b": 28 layers, hidden 1024, 16/8 heads x 128, FF 3072, tied; "8b": 36 layers, hidden 4096,
// 32/8 heads x 128, FF 12288, untied; vocab 151,936. Dies on another name.
static inline Config qwen3_shape(const char *size) {
    Config c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_QWEN3;
    c.V = 151936;
    c.HD = 128;
    c.KVH = 8;
    c.max_pos = 8192;
    c.eps = 1e-6f;
    c.rope_theta = 1e6f;
    c.qk_norm = 1;
    c.bos_id = -1;
    c.eos_ids[0] = 151645;
    c.n_eos = 1;
    if (!strcmp(size, "0.6b")) {
        c.C = 1024, c.FF = 3072, c.L = 28, c.NH = 16, c.tied = 1;
    } else if (!strcmp(size, "8b")) {
        c.C = 4096, c.FF = 12288, c.L = 36, c.NH = 32, c.tied = 0;
    } else die("--model must be 0.6b or 8b, got '%s'", size);
    return c;
}

// "1b": Llama-3.2-1B (hidden 2048, 16 layers, 32/8 heads x 64, FF 8192, tied, vocab 128256);
// "3b": Llama-3.2-3B (hidden 3072, 28 layers, 24/8 heads x 128, FF 8192, tied)
static inline Config llama32_shape(const char *size) {
    Config c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_LLAMA;
    c.V = 128256, c.KVH = 8, c.max_pos = 131072, c.eps = 1e-5f, c.rope_theta = 500000.0f, c.tied = 1;
    c.bos_id = 128000, c.eos_ids[0] = 128001, c.n_eos = 1;
    if (!strcmp(size, "1b")) c.C = 2048, c.FF = 8192, c.L = 16, c.NH = 32, c.HD = 64;
    else if (!strcmp(size, "3b")) c.C = 3072, c.FF = 8192, c.L = 28, c.NH = 24, c.HD = 128;
    else die("--model must be 1b or 3b, got '%s'", size);
    return c;
}

#endif  // QWEN3_SHAPES_H
