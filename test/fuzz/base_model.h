// test/fuzz/base_model.h: the fixed model that fuzz_peft.c and fuzz_resume.c load their inputs
// onto: the test fixtures' qwen3 shape (test/fixtures/README.md: vocab 320, hidden 64,
// intermediate 160, 2 layers, 4 heads of 32, 2 KV heads), random weights, kept dense (a forward
// through FP8 weights spends the time dequantizing, not on the adapter).
#ifndef FUZZ_BASE_MODEL_H
#define FUZZ_BASE_MODEL_H

#include "model.h"

static void fuzz_base_model(Model *m) {
    Config c = {0};
    c.arch = ARCH_QWEN3, c.V = 320, c.C = 64, c.FF = 160, c.L = 2, c.NH = 4, c.KVH = 2, c.HD = 32, c.max_pos = 128;
    c.eps = 1e-6f, c.rope_theta = 1e4f, c.qk_norm = 1, c.tied = 1, c.bos_id = -1;
    ModelOptions o = {FP8_OFF, 0, 0, 0, 0};
    model_init_random(m, &c, backend_cpu(), &o, 1);
}

#endif  // FUZZ_BASE_MODEL_H
