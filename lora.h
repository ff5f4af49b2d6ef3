// lora.h: LoRA adapters on the frozen (FP8) linear layers, applied unmerged:
//   y = W x + scale * B (A x),  scale = alpha / r,  A (r, in), B (out, r)
// on any of q, k, v, o, gate, up, down, and on Qwen3 MoE's experts (PEFT's target_parameters, the CPU's
// alone; each routed token's expert e computes with W_e + scale * B_e A_e: ExpertLoRA, backend.h).
// FP32 master weights (hp), their gradients and AdamW state live in one allocation each; with --lora_dtype bf16 the masters and
// AdamW's m and v are bf16 (stochastic rounding at each update: backend.h adamw_bf16) and the
// gradients stay fp32 (they sum over micro-batches): 10 bytes a parameter instead of 16. PEFT-format save/load
// (adapter_model.safetensors + adapter_config.json) so peft / vLLM load them.
// model.c calls the two hooks for every linear layer; everything else (init,
// optimizer, clipping, I/O) is here.
#ifndef LORA_H
#define LORA_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct LoRA {
    int r;
    float alpha, scale;     // scale = alpha / r
    unsigned targets;       // bit (1 << LIN_*) per adapted projection
    int L;
    int in[LIN_COUNT], out[LIN_COUNT];
    const Backend *be;
    // per (layer, projection): pointers into the four blobs (NULL where not adapted)
    void **A, **B;          // (L * LIN_COUNT): A (r, in), B (out, r) sdt
    void **dA, **dB;        // gradients, same shapes, hp
    size_t n;               // number of parameters (all adapters)
    void *params, *grads, *m, *v;  // four allocations of n values, same layout: params, m, v sdt, grads hp
    int bf16;               // --lora_dtype bf16: params, m, v hold bf16 values, updated by adamw_bf16
    DType sdt;              // their element type: hp; bf16 with bf16 on a backend whose act is bf16 (CUDA)
                            // (the CPU keeps the bf16 values in hp storage)
    uint64_t sr_seed;       // the stochastic rounding's seed (bf16)
    // The training products by unit: q, k, v read one input, and so do gate and up; o and down are
    // units of one. A unit's adapted members lie one after another in the blobs (their A's, then
    // their B's), so its A's are one (R, in) matrix, R = r times its adapted members, and one down
    // product ax = x A^T (N, R) serves them all; each member's up product reads its r columns.
    int ld[LIN_COUNT];      // R of projection i's unit: the row length of its ax and dax
    int col[LIN_COUNT];     // the first of projection i's r columns in them
    // activations saved by the training forward: the units' ax (N, R) act, per (layer, projection)
    // the member's first column (row stride ld)
    void **ax;              // (L * LIN_COUNT)
    void *ax_mem;
    void *dax;              // (N, the widest R) act: the backward's gradient of a unit's ax, made member by member
    int ax_cap;             // rows the ax and dax buffers hold
    // the hooks' check that a unit's members come in order: the last down product's input and its
    // (layer, first member) k; the members' backwards since the last unit's input gradient
    const void *down_inp;
    int down_k, up_done;
    // act-typed copies of every A and B (same layout as params) for the decode step's lora_apply:
    // made by lora_sync_act when a rollout starts (the masters do not change during one) and
    // marked stale by lora_release_act when it ends; act_valid while they are current. The
    // training products read them too, made again by lora_train_weights at each training forward
    void *act_mem;
    void **A_act, **B_act;  // (L * LIN_COUNT), NULL where not adapted
    int act_valid;
    // and, where projections share their input and the model has their fused weight (q|k|v,
    // gate|up), one adapter for the group: A the unit's stacked A in the act copies (R = ld, its
    // members' r's), B their B's on the block diagonal of (fused width, R), zeros elsewhere, so that
    // one lora_apply adds every member's product to the fused output (2 small GEMMs for the group
    // instead of 2 per member)
    void *grp_mem;          // the block-diagonal B's
    size_t grp_bytes;       // of grp_mem
    void **gB;              // (L * 2): group 0 = q|k|v, 1 = gate|up; NULL where none is adapted
    int step;               // AdamW steps taken
    // Qwen3 MoE's experts (targets' LORA_EXPERTS bits; PEFT's target_parameters): per sparse layer and j
    // (0 gate_up_proj, 1 down_proj) A (E r, ein[j]) and B (eout[j], r E) in PEFT's layout (ExpertLoRA,
    // backend.h), in the blobs after the projections' adapters; NULL where not adapted (a dense layer)
    int E, ein[2], eout[2];
    void **eA, **eB, **edA, **edB;  // (L * 2)
};

// targets' bits beyond the projections': LoRA on the experts' gate_up_proj, down_proj (PEFT's target_parameters)
#define LORA_EXPERTS_GATE_UP (1u << LIN_COUNT)
#define LORA_EXPERTS_DOWN (1u << (LIN_COUNT + 1))
#define LORA_EXPERTS (LORA_EXPERTS_GATE_UP | LORA_EXPERTS_DOWN)

// bit mask from a comma-separated list of PEFT names ("q_proj,v_proj" or "all"); dies on unknown names
unsigned lora_parse_targets(const char *list);
// the LORA_EXPERTS bits from a comma-separated list of PEFT's target_parameters (mlp.experts.gate_up_proj,
// mlp.experts.down_proj, or their ends after a '.'); "" gives 0; dies on other names. OR them into targets.
unsigned lora_parse_target_parameters(const char *list);
// Create adapters for model m: A ~ PEFT's kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0;
// bf16: masters and AdamW state in bf16 (--lora_dtype bf16; A rounded to nearest at creation)
LoRA *lora_create(const Model *m, int r, float alpha, unsigned targets, uint64_t seed, int bf16);
void lora_free(LoRA *lo);
void lora_zero_grads(LoRA *lo);
// global L2 norm of the gradients
double lora_grad_norm(const LoRA *lo);
// one AdamW step on every adapter (after clipping / scaling of the gradients by the caller)
void lora_adamw_step(LoRA *lo, float lr, float beta1, float beta2, float eps, float weight_decay);
// scale all gradients by s (gradient clipping)
void lora_scale_grads(LoRA *lo, float s);

// PEFT format. Tensor names: base_model.model.model.layers.{l}.{self_attn|mlp}.{proj}.lora_{A|B}.weight
// (a multimodal Gemma 3's: base_model.model.model.language_model.layers..., and target_modules a regular
// expression over the language model, so that PEFT adapts no module of the vision tower)
// base_fingerprint (st_fingerprint's, of the base it was trained on; NULL: none) goes into
// adapter_model.safetensors' metadata as "base_model_fingerprint" (peft and vLLM ignore it)
void lora_save_peft(const LoRA *lo, const Model *m, const char *dir, const char *base_model_name, const char *base_fingerprint);
// Load adapters saved by lora_save_peft or by peft; dies naming the file on a mismatch with the model, and
// on a tensor of a module target_modules does not select (PEFT's reading of target_modules: lora.c)
LoRA *lora_load_peft(const Model *m, const char *dir);
// An adapter applied to a base other than the one it was trained on computes something else, silently:
// when adapter_dir records its base's fingerprint and model_dir's weights have another, one line naming
// both and exit (allow_other: a warning, and on)
void lora_check_base(const char *adapter_dir, const char *model_dir, int allow_other);
// the base adapter_config.json names (base_model_name_or_path, as PEFT's AutoPeftModel reads it), when
// it is a checkpoint directory here (lora_save_peft records an absolute path); a relative one not found
// from here is looked for beside each directory above the adapter (where its training run started);
// else one line asking for --model
const char *lora_base_dir(const char *adapter_dir);
// raw state (params + Adam m, v + step) for checkpoints that resume bit-exactly
void lora_save_state(const LoRA *lo, const char *path);
void lora_load_state(LoRA *lo, const char *path);

// the act copies (above): fresh from the masters, and stale (an optimizer step also makes them stale)
void lora_sync_act(LoRA *lo);
void lora_release_act(LoRA *lo);
// What the training products read of each A and B: the masters where they are act values already (the
// CPU; bf16 masters on CUDA), else the per-member act copies, made from the masters at the start of
// every training forward (model_forward; its backward reads the same): one pass over the n values,
// where rounding the masters at each product cost a launch per product. The decode step's group
// copies are left as they are (lora_sync_act makes them).
void lora_train_weights(LoRA *lo);
// A decode step's adapter for a group of layer l (group 0 = q|k|v, 1 = gate|up), from the act copies:
// *A (R, in) and *B (fused width, R); returns R (0: no member adapted, nothing to add)
int lora_group_act(const LoRA *lo, int layer, int group, const void **A, const void **B);

// ---- hooks called by model.c (for the adapter a forward or backward is given) ----
// out (N, out) += scale * (inp A^T) B^T ; save: keep inp A^T for the backward (training forward), else
// a decode step: from the act copies. A training forward calls a unit's members in order (q, k, v;
// gate, up) with the same inp: the first adapted one makes the unit's ax.
void lora_hook_forward(LoRA *lo, int layer, int which, void *out, const void *inp, int N, int save);
// dB accumulates, and the member's columns of dax are made; after the unit's last adapted member (in
// the same order) dinp (N, in) += the unit's input gradient and its dA's accumulate
void lora_hook_backward(LoRA *lo, int layer, int which, void *dinp, const void *dout, const void *inp, int N);
// layer l's expert adapters for the moe ops, filled into *xl (NULL: lo NULL, or none on that layer)
const ExpertLoRA *lora_experts(const LoRA *lo, int layer, ExpertLoRA *xl);
// make the saved-activation buffers hold N rows
void lora_ensure_acts(LoRA *lo, int N);
// bytes of the saved activations (every unit's ax) and dax for N rows
size_t lora_acts_bytes(const LoRA *lo, int N);
// bytes of the parameters, their gradients and AdamW's m and v (the optimizer state, all adapters)
size_t lora_state_bytes(const LoRA *lo);
// bytes of the act-typed copies the rollouts read (each adapter's, and the groups'), once made
size_t lora_copies_bytes(const LoRA *lo);

#ifdef __cplusplus
}
#endif
#endif  // LORA_H
