// test/fuzz/fuzz_peft.c: a PEFT LoRA adapter directory through lora_load_peft (lora.c:
// adapter_config.json and adapter_model.safetensors checked against the model) onto a fixed
// model (base_model.h), then a forward of four tokens with the adapter on, as ./generate --lora
// runs it. Input: adapter_config.json, then adapter_model.safetensors (test/fuzz/fuzz.h's
// separator between them).
#include "base_model.h"
#include "fuzz.h"
#include "lora.h"

static Model base;  // made once (init), shared by every input

static void body(const char *dir, const uint8_t *rest, size_t nrest) {
    (void)rest, (void)nrest;
    LoRA *lo = lora_load_peft(&base, dir);
    int ids[4] = {1, 2, 3, 4};
    model_forward(&base, lo, ids, 1, 4);
    lora_free(lo);
}

static void init(void) {
    fuzz_base_model(&base);
    // the buffers a forward with an adapter makes and keeps in the model: before the first input
    LoRA *lo = lora_create(&base, 4, 8.0f, (1u << LIN_COUNT) - 1, 1, 0);
    int ids[4] = {1, 2, 3, 4};
    model_forward(&base, lo, ids, 1, 4);
    lora_free(lo);
}

FUZZ_TARGET(body, init, "adapter_config.json", "adapter_model.safetensors")
