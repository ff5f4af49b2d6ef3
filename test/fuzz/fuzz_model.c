// test/fuzz/fuzz_model.c: a checkpoint directory through model_load (model_load.c: config.json
// and the weights checked against each other, then loaded and quantized) and a forward of four
// tokens on the CPU backend, as ./generate runs it. Input: config.json, model.safetensors, then
// optionally one byte choosing the linear weights' format (0 block FP8, 1 row, 2 tensor, 3 off).
#include "fuzz.h"
#include "model.h"

static void body(const char *dir, const uint8_t *rest, size_t nrest) {
    static const FP8Gran grans[4] = {FP8_BLOCK, FP8_ROW, FP8_TENSOR, FP8_OFF};
    ModelOptions o = {nrest ? grans[rest[0] % 4] : FP8_BLOCK, 0, 0, 0, 0};
    Model m;
    model_load(&m, dir, backend_cpu(), &o);
    int T = m.cfg.max_pos < 4 ? m.cfg.max_pos : 4, ids[4];
    for (int t = 0; t < T; t++) ids[t] = (t * 7 + 1) % m.cfg.V;
    model_forward(&m, NULL, ids, 1, T);
    float *logits = (float *)mallocCheck((size_t)T * m.cfg.V * sizeof(float));
    model_logits(&m, logits);
    free(logits);
    model_free(&m);
}

// OpenMP's pools and the backend's first allocations, made before the first input
static void init(void) {
    Config c = {0};
    c.arch = ARCH_QWEN3, c.V = 16, c.C = 8, c.FF = 8, c.L = 1, c.NH = 2, c.KVH = 1, c.HD = 4, c.max_pos = 8;
    c.eps = 1e-6f, c.rope_theta = 1e4f, c.qk_norm = 1, c.bos_id = -1;
    ModelOptions o = {FP8_BLOCK, 0, 0, 0, 0};
    Model m;
    model_init_random(&m, &c, backend_cpu(), &o, 1);
    int ids[2] = {1, 2};
    model_forward(&m, NULL, ids, 1, 2);
    model_free(&m);
}

FUZZ_TARGET(body, init, "config.json", "model.safetensors")
