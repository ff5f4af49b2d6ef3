// backend.h: the one interface between the model/LoRA/GRPO code and the hardware.
//
// model.c, lora.c and the rollout engine are written once against the ops below;
// two implementations exist:
//   backend_cpu.c   the CPU reference backend (plain C + OpenMP), built on the
//                   reference kernels of ops_cpu.c and fp8_cpu.c; compiled twice: "cpu"
//                   (fp32) and "cpu64" (fp64, for finite-difference gradient checks)
//   backend_cuda.cu the CUDA backend (bf16 activations, fp8 GEMMs), with its kernels in
//                   ops_cuda.cu, attention.cu, attention_decode.cu, sample.cu and fp8.cu
// Ops a backend may leave NULL, and what then happens:
//   - the CPU backends: the eight FP8-training ops (fp8_train_*: FP8 training runs on the GPU;
//     model_fp8_train stops with one line on the CPU) and three fusions, swiglu_backward_q,
//     glu_forward_q and logprobs_fused, where model.c calls the ops they fuse instead;
//   - either backend: the four mixture-of-experts ops (moe_route, moe_route_backward,
//     moe_experts_forward, moe_experts_backward; both have them: cpu/, cuda/moe.cu): a backend without
//     them gets a Qwen3 MoE checkpoint refused by model_load in one line naming --device cpu.
// Every other op is in both, and model.c calls it the same way on either.
// The program picks the GPU when a usable one is present and the CPU otherwise
// (backend_select in io/options.c, --device overrides). Nothing above this header knows which.
//
// Memory: every pointer an op takes is backend memory (host memory for the CPU
// backends, device memory for CUDA) unless its name ends in _host. Element types:
//   act   activations, norm weights, embeddings, biases, dense linear weights
//         (f32 on cpu, f64 on cpu64, bf16 on cuda)
//   hp    "high precision": rstd, logsumexp, logprobs, logits, gradients of
//         LoRA and of dense weights, LoRA master weights, optimizer state
//         (f32 on cpu and cuda, f64 on cpu64)
//   i32   token ids, positions, KV slots, block tables
// Shapes use fixed letters: N rows (tokens), C model width, OC output width,
// V vocab, NH query heads, KVH key/value heads, HD head dim, FF MLP width,
// S sequences in a decode step, R LoRA rank.
// Ops run in order on the backend's stream; sync() waits for them.
#ifndef BACKEND_H
#define BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "fp8.h"
#include "core/common.h"
#include "core/fp8_recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

// A frozen linear weight W (OC, C), as Hugging Face stores it: either FP8 codes
// with scales (gran != FP8_OFF, in q) or dense act-dtype values (gran == FP8_OFF, in dense).
typedef struct FP8Train FP8Train;  // a trained weight's FP8 state (the backend's: fp8_train.cu)
typedef struct {
    int rows, cols;  // OC, C
    FP8Gran gran;
    FP8Tensor q;     // gran != OFF: codes (OC, C) + scales, block_rows 128 for BLOCK
    void *dense;     // gran == OFF: (OC, C) act
    FP8Train *train; // FP8 training (--fp8_recipe) of a dense weight: its three products in FP8, else NULL
} QWeight;

// options for turning a high-precision weight into a QWeight
typedef struct {
    FP8Gran gran;    // granularity of the weight (and of the activations it meets)
    int pow2;        // power-of-two scales
} QuantOptions;

// AdamW's two moments held as bf16 values (adamw's m16; full fine-tuning's --adam_moments bf16, as
// DeepSeek-V3 trains): bf16 storage where act is bf16 (the CUDA backend's), on the CPU backends their
// values in hp storage. Each is rounded stochastically after its update (common.h f32_to_bf16_sr),
// value i of the n with the bits sr_bits(seed, step, i0 + i, 1 for m / 2 for v): i0 the first value's
// index in the whole array, so that a block of it (a rank's shard) rounds as the whole would. Rounding
// to nearest would lose v's updates, (1 - beta2) = 0.1% of v, below half a bf16 step (0.2-0.4%).
typedef struct {
    uint64_t seed;
    size_t i0;
} Bf16Moments;

// LoRA on Qwen3 MoE's experts (PEFT's target_parameters mlp.experts.gate_up_proj and down_proj), hp values in
// PEFT's layout: gate_up's A (E r, C) and B (2 FFe, r E), its rows gate then up; down's A (E r, FFe), B (C, r E).
// Expert e's weight gains scale * sum_k B[:, k E + e] A[e r + k, :] (A's rows expert-major, B's columns
// rank-major). [0] gate_up, [1] down; A[j] NULL: that one not adapted; dA, dB (NULL: no gradient) accumulate.
typedef struct {
    const void *A[2], *B[2];
    void *dA[2], *dB[2];
    int r;
    float scale;
} ExpertLoRA;

typedef struct Backend Backend;
struct Backend {
    const char *name;  // "cpu", "cpu64", "cuda"
    DType act, hp;     // element types (above)
    char device_desc[128];

    // ---- memory ------------------------------------------------------------
    void *(*alloc)(size_t bytes);  // dies with a clear message when out of memory
    void (*free)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*upload)(void *dst, const void *src_host, size_t bytes);
    void (*download)(void *dst_host, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);  // device to device
    // rows of width bytes from src (row pitch spitch bytes) to dst (row pitch dpitch), device to device
    void (*copy_2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
    // upload n elements of type st from the host, converting to type dt (act or hp)
    void (*upload_convert)(void *dst, DType dt, const void *src_host, DType st, size_t n);
    void (*sync)(void);
    // bytes this process holds through alloc now (CUDA: device memory in use beyond the context's
    // at start-up); *peak (may be NULL): the most it has held since start-up
    size_t (*mem_in_use)(size_t *peak);
    // device memory this process can use at most: the device's total less what was in use when
    // the backend started (the CUDA context, other processes); 0 where memory is the host's
    size_t (*mem_capacity)(void);

    // ---- weights -----------------------------------------------------------
    // Fill w (rows, cols, gran set by the caller; w->q.data/q.scale or w->dense
    // already allocated in backend memory by the caller) from a host tensor of type st.
    // FP8: quantized with dynamic (amax) scales, E4M3, block_rows 128.
    void (*quantize_weight)(QWeight *w, const void *src_host, DType st, int pow2);
    // Dequantize w to act values (rows, cols) in backend memory (for error reports / backward)
    void (*dequantize_weight)(void *out, const QWeight *w);

    // ---- transformer ops ---------------------------------------------------
    // out (N, C) act = wte[ids[n]]; ids (N) i32; wte (V, C): dense act values, or FP8 E4M3 with a scale
    // per row (FP8_ROW: --fp8_embeddings), each row dequantized (code * scale, rounded once to act)
    void (*embedding_forward)(void *out, const int32_t *ids, const QWeight *wte, int N);
    // dwte (V, C) hp += scatter of dout (N, C) act rows to ids (training the embeddings: warm-up / SFT)
    void (*embedding_backward)(void *dwte, const int32_t *ids, const void *dout, int N, int C);
    // out (N, C) act = inp / rms(inp) * w ; rstd (N) hp saved for backward; out may alias inp
    void (*rmsnorm_forward)(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps);
    // dinp (N, C) act += d/dinp ; dw (C) hp += d/dw (dw may be NULL)
    void (*rmsnorm_backward)(void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                             const void *rstd, int N, int C);
    // out (N, OC) act = inp (N, C) W^T + bias; activations quantized dynamically to
    // match W's granularity (TENSOR: per tensor, ROW: per token, BLOCK: 1x128)
    void (*linear_forward)(void *out, const void *inp, const QWeight *w, const void *bias, int N);
    // linear_forward's product from its input already quantized: xq (N, C) E4M3 with W's granularity
    // (ROW or BLOCK), as the decode step's producers make it (add_rmsnorm, glu_gu: their outq), so
    // the FP8 GEMM runs without a quantization pass of its own; or, for a weight trained in FP8, xq its
    // input's codes as fp8_train_forward_keep kept them (the forward's product again, the same bytes)
    void (*linear_forward_q)(void *out, const FP8Tensor *xq, const QWeight *w, const void *bias, int N);
    // xq (N, C) E4M3 = inp (N, C) act quantized as linear_forward quantizes its input for a weight of xq's
    // granularity (ROW or BLOCK, block_rows 1; buffers given), the same bytes: the projections that read one
    // input (q, k and v; gate and up) quantize it once and each multiply through linear_forward_q
    void (*quantize_act)(FP8Tensor *xq, const void *inp, int N);
    // dinp (N, C) act (= if !accumulate, += if accumulate) = dout (N, OC) W (W dequantized:
    // a straight-through estimator for FP8 weights); dw (OC, C) hp += dout^T inp and
    // dbias (OC) hp += sum dout, each when not NULL (dw only for gran OFF)
    void (*linear_backward)(void *dinp, int accumulate, void *dw, void *dbias, const void *dout,
                            const void *inp, const QWeight *w, int N);
    // ---- FP8 training (--fp8_recipe; NULL where the backend has none: the CPU's) ----
    // The state that makes w's three products (forward, dinp, dw in linear_forward/backward) FP8
    // GEMMs under recipe r; w dense. leader: the trained weight that reads the same input and is
    // called just before this one (k and v: q's; up: gate's), whose FP8 copy of the input this one
    // reuses, or NULL. NULL, with the reason in why, where the device cannot.
    FP8Train *(*fp8_train_new)(const QWeight *w, const FP8Recipe *r, FP8Train *leader, char *why, size_t why_cap);
    void (*fp8_train_free)(FP8Train *t);
    // The forward's FP8 codes of a trained weight's input kept for its weight gradient, in place of the
    // bf16 input (the activations saved in FP8: half the bytes). fp8_train_forward_keep is linear_forward
    // that also leaves inp's codes, (N, C) E4M3, and their per-tensor scale in the caller's keep->data
    // (N * C bytes) and keep->scale (one float, 16-byte aligned) and sets keep's shape and format; it
    // returns 0 and does nothing where w's recipe scales per block (X's groups are not X^T's: that
    // backward needs the bf16 input). The projections that read their leader's input (fp8_train_new) take
    // the leader's keep. fp8_train_backward_kept is linear_backward reading those codes in inp's place: the
    // same bytes out.
    int (*fp8_train_forward_keep)(void *out, const void *inp, const QWeight *w, const void *bias, int N, FP8Tensor *keep);
    void (*fp8_train_backward_kept)(void *dinp, int accumulate, void *dw, void *dbias, const void *dout,
                                    const FP8Tensor *kept, const QWeight *w, int N);
    // The ops that make a kept input, writing it only as the codes its consumer reads (delayed scaling:
    // the scale is known before the pass, so the bf16 values are never written): fp8_train_norm_q is
    // rmsnorm_forward (norm1p: rmsnorm1p_forward) with its output (N, C) as consumer's codes in keep (as
    // fp8_train_forward_keep leaves them: the same codes, scale and amax), fp8_train_glu_q swiglu_forward
    // (gelu: geglu_forward) of (N, FF) values likewise. Then linear_forward_q of keep runs the consumer's
    // product (and its group's). Each returns 0 and does nothing where it does not apply (another recipe,
    // rows or pointers it cannot take).
    int (*fp8_train_norm_q)(FP8Tensor *keep, void *rstd, const void *inp, const void *w, int N, int C, float eps, int norm1p,
                            const QWeight *consumer);
    int (*fp8_train_glu_q)(FP8Tensor *keep, const void *gate, const void *up, int N, int FF, int gelu, const QWeight *consumer);
    // after an optimizer step, for all n trained weights: delayed scaling rolls the amax histories
    // and sets the next scales (*overflows += tensors whose amax was inf/NaN). reduce (or NULL) gets
    // the step's 3 n amaxes (x, w, dy of each weight) first, to reduce them over the ranks.
    void (*fp8_train_step)(FP8Train *const *t, int n, AmaxReduce reduce, void *ctx, long *overflows);
    // delayed scaling's state of n trained weights as floats, for a checkpoint: per weight and
    // tensor (x, w, dy) the scale in force, then the amax history (len values); into buf (set 0),
    // or from it (set 1: the scales uploaded too). Returns the count (buf NULL: counted only), 0
    // for the recipes that keep nothing between steps.
    size_t (*fp8_train_state)(FP8Train *const *t, int n, float *buf, int set);
    // LoRA, unmerged, as two small products: down, ax = inp A^T (rank R), and up, out += scale ax B^T.
    // A (R, C) and B (OC, R) are act values (lora.c's act copies of the masters, or bf16 masters as
    // they are). Members of a unit share one down product (lora.h): A is their A's stacked and each
    // member's up product reads its R columns of ax (row stride ld).
    // ax (N, R) act = inp (N, C) A^T, fp32 sums rounded once (kept for the backward)
    void (*lora_down)(void *ax, const void *inp, const void *A, int N, int C, int R);
    // out (N, OC) act += scale * ax B^T, ax (N, R) of row stride ld
    void (*lora_up)(void *out, const void *ax, int ld, const void *B, float scale, int N, int R, int OC);
    // out (N, OC) act += scale * (inp A^T) B^T: lora_down then lora_up through the backend's own
    // scratch, for the forwards that keep nothing for a backward (the decode step)
    void (*lora_apply)(void *out, const void *inp, const void *A, const void *B, float scale, int N, int C, int R,
                       int OC);
    // dst (n) act = src (n) hp, rounded (device to device)
    void (*to_act)(void *dst, const void *src, size_t n);
    // the up product's backward: dax (N, R) act = scale * dout B ; dB (OC, R) hp += scale * dout^T ax;
    // dax and ax of row stride ld
    void (*lora_up_backward)(void *dax, void *dB, const void *dout, const void *ax, int ld, const void *B, float scale,
                             int N, int R, int OC);
    // the down product's backward: dinp (N, C) act += dax A ; dA (R, C) hp += dax^T inp
    void (*lora_down_backward)(void *dinp, void *dA, const void *dax, const void *inp, const void *A, int N, int C, int R);
    // x (N, H, HD) act rotated in place by position pos[n] (Hugging Face rotate_half
    // convention); inv_freq (HD/2) hp. Backward rotates by the negative angle.
    void (*rope_forward)(void *x, const int32_t *pos, const void *inv_freq, int N, int H, int HD);
    void (*rope_backward)(void *dx, const int32_t *pos, const void *inv_freq, int N, int H, int HD);
    // causal self-attention over B right-padded sequences of length T (padding only
    // attends to itself and earlier tokens, so it never touches real tokens):
    // q (B, T, NH, HD), k, v (B, T, KVH, HD), out (B, T, NH, HD) act; lse (B, NH, T) hp (of the scaled
    // scores). scale: the softmax scale (1 / sqrt(HD) for Llama; Gemma 3: query_pre_attn_scalar^-0.5), a double
    // because the CPU reference computes in double (CUDA rounds it to float).
    // window > 0: sliding-window attention, query t sees key s iff s <= t and t - s < window
    // (transformers' sliding_window_overlay: kv_idx > q_idx - window); 0: every earlier key
    void (*attention_forward)(void *out, void *lse, const void *q, const void *k, const void *v, int B, int T,
                              int NH, int KVH, int HD, double scale, int window);
    // dq, dk, dv (overwritten) from dout; uses out and lse from the forward (the same scale and window)
    void (*attention_backward)(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *lse,
                               const void *q, const void *k, const void *v, int B, int T, int NH, int KVH,
                               int HD, double scale, int window);
    // out (n) act = silu(gate) * up
    void (*swiglu_forward)(void *out, const void *gate, const void *up, size_t n);
    void (*swiglu_backward)(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n);
    // swiglu_backward in FP8 training, where dgate and dup (N, FF) are the dY of the FP8-trained gate
    // and up projections wg, wu (fp8_train_new): in place of each bf16 array it writes the FP8 codes
    // its backward products read, in the two layouts they read (row, then transposed: the same 2
    // bytes an element); the next linear_backward of wg with dout == dgate (of wu, dout == dup) takes
    // them. Returns 0 and does nothing where that does not apply (a recipe other than delayed; N or FF
    // not a multiple of 128): then call swiglu_backward. NULL: the backend has no such path.
    int (*swiglu_backward_q)(void *dgate, void *dup, const void *dout, const void *gate, const void *up, int N, int FF,
                             const QWeight *wg, const QWeight *wu);
    // GeGLU (Gemma 3's MLP): out (n) act = gelu_tanh(gate) * up, gelu_tanh(g) = g/2 (1 + tanh(sqrt(2/pi)
    // (g + 0.044715 g^3))) (PyTorch's gelu(approximate="tanh"), transformers' gelu_pytorch_tanh)
    void (*geglu_forward)(void *out, const void *gate, const void *up, size_t n);
    void (*geglu_backward)(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n);
    // Gemma's RMSNorm: out (N, C) act = inp / rms(inp) * (1 + w), computed in fp32 and rounded once
    // (Gemma3RMSNorm: "(x * w).to(dtype)", where Llama rounds x / rms(x) before the product); rstd
    // (N) hp; out may alias inp. The backward: dinp += , dw (may be NULL) += (the d/dw of w and of
    // 1 + w are one)
    void (*rmsnorm1p_forward)(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps);
    void (*rmsnorm1p_backward)(void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                               const void *rstd, int N, int C);
    // x (n act) *= s, each product rounded once to act (Gemma's embeddings times sqrt(C), and that
    // product's gradient)
    void (*scale_act)(void *x, size_t n, float s);
    // out = a + b (n act); out may alias a or b
    void (*add)(void *out, const void *a, const void *b, size_t n);
    // Fusions of the decode step, equal to the ops they replace (same roundings). outq, when not NULL
    // (E4M3, ROW or BLOCK with block_rows 1, rows N, buffers given): out's FP8 copy for the weight out
    // feeds, the bytes fp8_quantize gives for out's act values, written in the same pass (see
    // linear_forward_q). x (N, C) act += dx; out = rmsnorm(x) * w; rstd (N) hp (add, then rmsnorm_forward;
    // norm1p: rmsnorm1p_forward, Gemma's)
    void (*add_rmsnorm)(void *x, void *out, void *rstd, const void *dx, const void *w, int N, int C, float eps, int norm1p,
                        FP8Tensor *outq);
    // out (N, FF) act = act(gate) * up read from gu (N, 2 FF), the fused gate|up product: its halves
    // through swiglu_forward (gelu 0) or geglu_forward (gelu 1, Gemma 3); outq as add_rmsnorm's
    void (*glu_gu)(void *out, FP8Tensor *outq, const void *gu, int N, int FF, int gelu);
    // out (N, FF) act = act(gate) * up from separate (N, FF) halves, as swiglu_forward / geglu_forward,
    // and outq (as add_rmsnorm's, required) its FP8 copy in the same pass: the training forward's input of
    // a frozen FP8 down projection. Optional (NULL: those two ops, then quantize_act)
    void (*glu_forward_q)(void *out, FP8Tensor *outq, const void *gate, const void *up, int N, int FF, int gelu);
    // out (n_idx, C) act = inp[idx[i]] rows; idx (n_idx) i32
    void (*gather_rows)(void *out, const void *inp, const int32_t *idx, int n_idx, int C);

    // ---- Qwen3 MoE's sparse MLP (Qwen3MoeSparseMoeBlock): the CPU's in backend_cpu.c / ops_cpu.c, the GPU's
    // in cuda/moe.cu (the slots grouped by expert, the experts' products as grouped GEMMs). Optional: NULL
    // where a backend has no experts' products (model_load refuses a qwen3_moe checkpoint there).
    // idx (N, K) i32, w (N, K) hp: each row's K largest probabilities of softmax(logits (N, E) act), computed
    // in fp32 or wider, largest first (ties: the lower expert; the CUDA backend ranks the logits, the same order),
    // divided by their sum when norm
    void (*moe_route)(int32_t *idx, void *w, const void *logits, int N, int E, int K, int norm);
    // dlogits (N, E) act = the gradient of the loss through the routing weights w, given dw (N, K) hp: through
    // the renormalization (norm) and the softmax; the choice of experts itself is not differentiated
    void (*moe_route_backward)(void *dlogits, const void *dw, const void *logits, const int32_t *idx, int N, int E,
                               int K, int norm);
    // out (N, C) act = sum_j w[n, j] * down_e(silu(gate_e(x[n])) * up_e(x[n])), e = idx[n, j], with experts
    // (E, 3) the weights gate, up (FFe, C), down (C, FFe) of each expert (dense or FP8, as linear_forward);
    // gate, up (N, K, FFe) act: each (token, choice)'s products, kept for the backward (NULL: not kept);
    // lora: adapters on the experts, added to each routed token's gate, up and down products (NULL: none;
    // the CPU's alone: CUDA has no kernels for them, and lora.c refuses such adapters there)
    void (*moe_experts_forward)(void *out, void *gate, void *up, const void *x, const int32_t *idx, const void *w,
                                const QWeight *experts, int N, int E, int K, const ExpertLoRA *lora);
    // dx (N, C) act = the gradient through the experts of dout (N, C); dw (N, K) hp = <dout[n], the output of
    // expert idx[n, j]>, what moe_route_backward takes; dexperts (E, 3) dense: the experts' weight gradients,
    // accumulated (NULL: none). gate, up as moe_experts_forward kept them; lora as it was given, its dA and
    // dB accumulated.
    void (*moe_experts_backward)(void *dx, void *dw, const QWeight *dexperts, const void *dout, const void *x,
                                 const int32_t *idx, const void *w, const void *gate, const void *up,
                                 const QWeight *experts, int N, int E, int K, const ExpertLoRA *lora);

    // ---- the language-model head -------------------------------------------
    // wlm (V, C): dense act values, or FP8 E4M3 with a scale per vocabulary row (FP8_ROW, the
    // --fp8_embeddings option); then h is quantized per row (token) to E4M3 as linear_forward does, the
    // product is an FP8 GEMM with fp32 output, and the backward's dh goes through W dequantized
    // (straight-through, as for the linear layers). A dense head with an FP8Train (wlm->train, --fp8_lm_head)
    // runs the three products as FP8 GEMMs under its recipe (fp8_train.cu). C = wlm->cols, V = wlm->rows.
    // logits (N, V) hp = h (N, C) wlm^T
    void (*logits_forward)(void *logits, const void *h, const QWeight *wlm, int N);
    // logp (N) hp = log_softmax(inv_temp * h wlm^T)[targets[n]], lse (N) hp saved;
    // rows with targets[n] < 0 give 0. Never materializes (N, V).
    void (*logprobs_forward)(void *logp, void *lse, const void *h, const QWeight *wlm, const int32_t *targets,
                             float inv_temp, int N);
    // dh (N, C) act = d(sum_n dlogp[n] logp[n]) / dh ; dlogp (N) hp;
    // dwlm (V, C) hp += the same gradient with respect to wlm (NULL: frozen head, the LoRA case; an FP8
    // head is always frozen)
    void (*logprobs_backward)(void *dh, void *dwlm, const void *dlogp, const void *lse, const void *h,
                              const QWeight *wlm, const int32_t *targets, float inv_temp, int N);
    // logprobs_forward and logprobs_backward in one pass, for a dlogp known before the logprobs: the
    // same values, each chunk of logits computed once instead of twice. NULL: call the two.
    void (*logprobs_fused)(void *logp, void *lse, void *dh, void *dwlm, const void *dlogp, const void *h,
                           const QWeight *wlm, const int32_t *targets, float inv_temp, int N);

    // ---- KV cache and decode -----------------------------------------------
    // The cache of one layer is a pool of blocks: kc, vc (NB, BS, KVH, HD). A token's slot is
    // block * BS + offset. slots (N) i32, < 0 = skip. Two formats: act values (ks = vs = NULL), or
    // FP8 E4M3 codes (1 byte each) with one fp32 dequantization scale per (slot, kv head) in
    // ks, vs (NB * BS, KVH): amax / 448 of the head's HD values, as fp8.h scales (an FP8 KV cache
    // halves the bytes a decode step reads from the cache).
    void (*kv_write)(void *kc, void *vc, float *ks, float *vs, const void *k, const void *v, const int32_t *slots,
                     int N, int KVH, int HD);
    // The decode step's attention inputs from its q, k, v projections: q (N, NH, HD) and k (N, KVH, HD)
    // act, each head rmsnorm'ed with q_norm / k_norm (HD) when not NULL (norm1p: Gemma's
    // rmsnorm1p_forward), then rotated by pos; k and v written to the cache as kv_write does. The
    // projections are read where they lie: row n of q's at qin + n ldq, of k's and v's at kin / vin +
    // n ldkv (the column blocks of one fused q|k|v output, or three buffers; qin may be q). Equal to
    // rmsnorm_forward (rmsnorm1p_forward) per head, rope_forward and kv_write.
    void (*qkv_rope_kv)(void *q, void *k, const void *qin, const void *kin, const void *vin, int ldq, int ldkv,
                        const void *q_norm, const void *k_norm, int norm1p, const int32_t *pos, const void *inv_freq, void *kc,
                        void *vc, float *ks, float *vs, const int32_t *slots, int N, int NH, int KVH, int HD, float eps);
    // one query token per sequence: q (S, NH, HD), out (S, NH, HD) act; sequence s
    // attends to its first seq_lens[s] cached tokens, found through block_table (S, MB) i32;
    // scale and window as attention_forward's (window > 0: only the last window of those tokens, the
    // older ones stay in the cache, masked); outq as add_rmsnorm's (out's FP8 copy: the o projection's input)
    void (*attention_decode)(void *out, const void *q, const void *kc, const void *vc, const float *ks,
                             const float *vs, const int32_t *block_table, const int32_t *seq_lens, int S, int NH,
                             int KVH, int HD, int BS, int MB, double scale, int window, FP8Tensor *outq);

    // ---- sampling ----------------------------------------------------------
    // For each of S rows of logits (S, V) hp: sample a token from softmax(logits / temperature)
    // restricted to top_k (0 = all) and top_p (1 = all); greedy when temperature == 0.
    // tokens (S) i32; logp (S) hp = log_softmax(logits / temperature)[token] (before
    // truncation, matching the trainer's logprobs; greedy: temperature 1);
    // rng (S) u64 per-sequence states, advanced.
    void (*sample)(int32_t *tokens, void *logp, const void *logits, uint64_t *rng, int S, int V, float temperature,
                   int top_k, float top_p);

    // ---- optimizer -----------------------------------------------------------
    // AdamW on n hp values, computed in hp (fp32 on the GPU, as torch.optim.AdamW on fp32 parameters; each
    // operation in one order on every backend, so the GPU's results are the CPU's bit for bit): m, v hp
    // state; step counts from 1 (bias correction). Each gradient is taken
    // times gscale (the clip factor; rounded to hp as `scale` rounds, the gradients left as they are).
    // act_out (n act values) or NULL: the new values in the act dtype as well, as to_act writes them (the
    // working copy full fine-tuning's forward reads), in the same pass: one read and write of each array.
    // m16 (or NULL): m and v held as bf16 values instead (Bf16Moments), the same arithmetic
    void (*adamw)(void *param, const void *grad, float gscale, void *m, void *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step, void *act_out, const Bf16Moments *m16);
    // AdamW with param, m and v held as bf16 values (--lora_dtype bf16: bf16 storage where act is bf16, the
    // CUDA backend's; on the CPU backends their values in hp storage); grad hp. The same arithmetic as
    // adamw, then each of the three rounded to bf16 stochastically (common.h f32_to_bf16_sr, its bits from
    // sr_bits(seed, step, i, 0 param / 1 m / 2 v)), bit-exact between the backends
    void (*adamw_bf16)(void *param, const void *grad, void *m, void *v, size_t n, float lr, float beta1, float beta2,
                       float eps, float weight_decay, int step, uint64_t seed);
    // sum of squares of n hp values, returned to the host (deterministic)
    double (*sumsq)(const void *x, size_t n);
    // x (n hp) *= s
    void (*scale)(void *x, size_t n, float s);
    // dst (n hp) += src (n hp) (sharded gradients: a layer's share summed into the step's)
    void (*accumulate)(void *dst, const void *src, size_t n);

    // ---- replay: the decode step is ~600 small launches; the CUDA backend records them once -------
    // replay runs run(arg), the ops it issues, through the recording kept under key (key_bytes bytes
    // that must name every buffer and size those ops see). The CUDA backend runs it plainly the first
    // time it sees a key (so that buffers made lazily get made), captures it as a CUDA graph the
    // second time and replays the graph from then on; it drops its recordings whenever its own
    // scratch memory moves. The CPU backend just calls run.
    void (*replay)(const void *key, size_t key_bytes, void (*run)(void *arg), void *arg);
    // drop every recording (before freeing buffers a key names)
    void (*replay_forget)(void);
    // the rows a step of S rows is padded to for replay (recordings are per shape): S on the CPU, the
    // next power of two on CUDA, so sequences finishing one by one reuse a handful of recordings
    int (*replay_rows)(int S);
};

// linear_forward_q's precondition, for both backends: dies in one line unless xq (N rows) was quantized
// for w (ROW or BLOCK, its granularity and width; a frozen weight)
void linear_q_check(const FP8Tensor *xq, const QWeight *w, int N);

// the backends
const Backend *backend_cpu(void);    // fp32
const Backend *backend_cpu64(void);  // fp64 (tests)
// the CUDA backend, or NULL with a one-line reason in why (no GPU, no driver, not built with nvcc)
const Backend *backend_cuda(char *why, size_t why_cap);
// The tuning knobs of the environment (FP8GRPO_LOGITS_CHUNK_ROWS, FP8GRPO_HEAD_GROUP_ROWS: how many
// rows the CUDA backend's LM head takes at a time; the tests set them small to cover several chunks):
// the value of the variable name, or 0 when it is unset; anything but a whole number of rows in
// [1, 2^24] dies in one line. backend_select (io/options.h) checks every knob, on any device, so that a typo is said
// at the start of a run and not ignored.
long backend_env_rows(const char *name);

// host-side conversion of backend values (act or hp) to fp64 / fp32 for reports and tests
void convert_to_f64(double *dst, const void *src_host, DType st, size_t n);
void convert_to_f32(float *dst, const void *src_host, DType st, size_t n);

#ifdef __cplusplus
}
#endif
#endif  // BACKEND_H
