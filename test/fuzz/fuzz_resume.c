// test/fuzz/fuzz_resume.c: a run's checkpoint through checkpoint_read (checkpoint.c, what
// train_grpo --resume reads: trainer_state.json, then optimizer.safetensors through
// lora_load_state) into a LoRA (r 2, alpha 4, q_proj and v_proj) of the fixed model fuzz_peft.c
// uses, as checkpoint 3 of a run whose identity is RUN below. Input: trainer_state.json, then
// optimizer.safetensors (test/fuzz/fuzz.h's separator between them).
#include "fuzz.h"
#include "checkpoint.h"

static const char RUN[] = "{\"model\":\"builtin-tiny\",\"data\":\"arithmetic\",\"lora_r\":2,\"lora_alpha\":4}";
static Model base;

static void body(const char *dir, const uint8_t *rest, size_t nrest) {
    (void)rest, (void)nrest;
    LoRA *lo = lora_create(&base, 2, 4.0f, (1u << LIN_Q) | (1u << LIN_V), 1);
    checkpoint_read(dir, 3, RUN, lo);
    lora_free(lo);
}

static void init(void) {
    Config c = {0};
    c.arch = ARCH_QWEN3, c.V = 320, c.C = 64, c.FF = 160, c.L = 2, c.NH = 4, c.KVH = 2, c.HD = 32, c.max_pos = 128;
    c.eps = 1e-6f, c.rope_theta = 1e4f, c.qk_norm = 1, c.tied = 1, c.bos_id = -1;
    ModelOptions o = {FP8_OFF, 0, 0, 0};
    model_init_random(&base, &c, backend_cpu(), &o, 1);
}

FUZZ_TARGET(body, init, "trainer_state.json", "optimizer.safetensors")
