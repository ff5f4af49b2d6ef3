// memory_fit.c: the update's micro-batch and recomputation chosen to fit the arena (memory_fit.h says how).
#include "train/memory_fit.h"

#include "lora.h"

size_t memfit_bytes(const Model *m, int mb, int T, int recompute) {
    size_t b = model_acts_bytes(m, mb, T, recompute);
    const LoRA *lo = m->lora;
    if (lo) b += lora_acts_bytes(lo, mb * T);  // the adapters' saved ax and their dax, outside the arena
    // Qwen3 MoE: the experts' per-slot buffers a sparse layer's backward holds outside the arena (the CUDA
    // backend's, cuda/moe.cu: for each of the N K (token, expert) pairs dgate|dup, h then dh, y then dy and dx):
    // counted here so that the arena never grows into the memory they take
    const Config *c = &m->cfg;
    if (c->E) b += (size_t)mb * T * c->K * (3 * (size_t)c->FFe + c->C) * dtype_size(m->be->act);
    return b;
}

// the largest of S, S/2, S/4, ..., 1 (or want_mb alone) whose activations fit in cap; 0 if none
static int largest_fit(const Model *m, int S, int T, int want_mb, int rc, size_t cap) {
    for (int mb = want_mb > 0 ? want_mb : S; mb >= 1; mb = want_mb > 0 ? 0 : (mb == 1 ? 0 : (mb + 1) / 2))
        if (!cap || memfit_bytes(m, mb, T, rc) <= cap) return mb;
    return 0;
}

int memfit_update(const Model *m, int S, int T, int want_mb, int want_rc, FitChoice *out) {
    if (want_mb > S) want_mb = S;
    size_t cap = m->arena.cap;
    int plain = want_rc == 1 ? 0 : largest_fit(m, S, T, want_mb, 0, cap);
    int rec = want_rc == 0 ? 0 : largest_fit(m, S, T, want_mb, 1, cap);
    if (plain && (plain == S || (long)plain * T >= MEMFIT_MIN_TOKENS || !rec)) *out = (FitChoice){plain, 0, 0};
    else if (rec) *out = (FitChoice){rec, 1, 0};
    else {  // nothing: the need of the smallest allowed choice
        int mb = want_mb > 0 ? want_mb : 1, rc = want_rc != 0;
        *out = (FitChoice){mb, rc, memfit_bytes(m, mb, T, rc)};
        return -1;
    }
    out->bytes = memfit_bytes(m, out->mb, T, out->recompute);
    return 0;
}

int memfit_forward(const Model *m, int S, int T, size_t cap) {
    for (int mb = S; mb >= 1; mb = mb == 1 ? 0 : (mb + 1) / 2)
        if (!cap || model_acts_bytes(m, mb, T, ACTS_FORWARD_ONLY) <= cap) return mb;
    return 0;
}
