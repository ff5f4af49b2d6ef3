// test/fuzz/fuzz_resume.c: a run's checkpoint through checkpoint_read (checkpoint.c, what
// train_grpo --resume reads: trainer_state.json, then optimizer.safetensors through
// lora_load_state) into a LoRA (r 2, alpha 4, q_proj and v_proj) of the fixed model of
// base_model.h, as checkpoint 3 of a run whose identity is RUN below. Input:
// trainer_state.json, then optimizer.safetensors (test/fuzz/fuzz.h's separator between them).
#include "base_model.h"
#include "fuzz.h"
#include "train/checkpoint.h"

static const char RUN[] = "{\"model\":\"builtin-tiny\",\"data\":\"arithmetic\",\"lora_r\":2,\"lora_alpha\":4}";
static Model base;

static void body(const char *dir, const uint8_t *rest, size_t nrest) {
    (void)rest, (void)nrest;
    LoRA *lo = lora_create(&base, 2, 4.0f, (1u << LIN_Q) | (1u << LIN_V), 1, 0);
    checkpoint_read(dir, 3, RUN, lo);
    lora_free(lo);
}

static void init(void) {
    fuzz_base_model(&base);
}

FUZZ_TARGET(body, init, "trainer_state.json", "optimizer.safetensors")
