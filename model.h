// model.h: Llama 3 / Qwen2 / Qwen3 / Qwen3 MoE / Mistral / Gemma 3 (text) decoder-only transformers on any Backend.
// Defines: Config (from a Hugging Face config.json), Weights (one allocation
// per role with a pointer table), the training forward/backward with
// per-token logprobs, and the KV-cache decode used by the rollout engine.
// Implemented in model.c, model_alloc.c (its memory) and io/model_load.c (checkpoints); LoRA hooks in
// through lora.h.
#ifndef MODEL_H
#define MODEL_H

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ARCH_LLAMA = 0, ARCH_QWEN2, ARCH_QWEN3, ARCH_MISTRAL, ARCH_GEMMA3, ARCH_QWEN3_MOE } Arch;
#define CONFIG_MAX_LAYERS 1024

// The tensor names of a multimodal Gemma 3's text model: transformers 4.x's (language_model.model.*, the head
// language_model.lm_head; what save_pretrained writes and the published checkpoints hold) or 5.x's
// (model.language_model.*, lm_head: the modules' own names, which PEFT adapters use)
typedef enum { MM_NONE, MM_V4, MM_V5 } MMLayout;

typedef struct {
    Arch arch;
    int V;            // vocab_size
    int C;            // hidden_size
    int FF;           // intermediate_size
    int L;            // num_hidden_layers
    int NH;           // num_attention_heads
    int KVH;          // num_key_value_heads
    int HD;           // head_dim
    int max_pos;      // max_position_embeddings
    float eps;        // rms_norm_eps
    float rope_theta;
    int qkv_bias;     // Qwen2: q/k/v projections have biases
    int qk_norm;      // Qwen3: RMSNorm on each head of q and k before RoPE
    int tied;         // tie_word_embeddings: lm_head = embed_tokens
    // rope_scaling {"rope_type": "llama3", ...}; type 0 = none, 1 = llama3, 2 = linear (inv_freq / factor)
    int rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    // Mistral and Gemma 3. A zeroed Config is Llama's: no window, 1/sqrt(HD), x * w norms, SiLU.
    int window;       // sliding_window: on a sliding layer query t sees keys s with t - s < window; 0: none
    unsigned char sliding[CONFIG_MAX_LAYERS];  // 1: layer l is a sliding-window layer (Mistral with a window:
                                               // every layer; Gemma 3: layer_types "sliding_attention")
    float query_pre_attn_scalar;  // Gemma 3: the softmax scale is query_pre_attn_scalar^-0.5; 0: head_dim's
    float rope_local_theta;       // Gemma 3: the sliding layers' RoPE base (rope_local_base_freq, never
                                  // scaled); 0: every layer uses rope_theta (and rope_scaling)
    int gemma;        // Gemma 3's layer: RMSNorm x * (1 + w) in fp32, a norm after the attention and after
                      // the MLP as well, GeGLU (gelu tanh) MLP, embeddings times sqrt(hidden_size)
    // Qwen3 MoE (qwen3_moe: Qwen3's attention; on its sparse layers the MLP is a router and experts,
    // Qwen3MoeSparseMoeBlock). E = 0: no experts (every layer dense, of FF).
    int E;            // num_experts
    int K;            // num_experts_per_tok: the experts each token goes to
    int FFe;          // moe_intermediate_size: each expert's SwiGLU width
    int norm_topk;    // norm_topk_prob: the k routing weights renormalized to sum to 1
    unsigned char moe[CONFIG_MAX_LAYERS];  // 1: layer l's MLP is the experts (not in mlp_only_layers, and
                                           // (l + 1) % decoder_sparse_step == 0)
    int bos_id;       // -1 if none
    int eos_ids[4];   // eos_token_id (int or list); n_eos of them
    int n_eos;
    // Gemma 3 as published (model_type "gemma3", Gemma3ForConditionalGeneration): the text model of the
    // multimodal checkpoint, its config under text_config. The vision tower and the projector are never read
    // (text only: an image in the data is refused); ./export copies them into the merged checkpoint unchanged.
    MMLayout mm;      // where the text model's tensors lie; MM_NONE: a text-only checkpoint
    int mm_ids[3];    // image_token_index, boi_token_index, eoi_token_index where inside the vocabulary:
    int n_mm_ids;     // the ids of image input, which text never holds
    int num_labels;   // a *ForSequenceClassification (a reward model): its score head's rows (score.weight), and
                      // no LM head (tied: the embedding table stands in, never read); 0: a causal LM
} Config;

// the seven LoRA-able projections of a layer, in PEFT's target_modules names
enum { LIN_Q = 0, LIN_K, LIN_V, LIN_O, LIN_GATE, LIN_UP, LIN_DOWN, LIN_COUNT };
// their names (model.c, lora.c and the checkpoint code read them; static: every file its own copy, no file
// the others depend on for it)
static const char *const lin_names[LIN_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

typedef struct {
    void *ln1;             // (C) act   input_layernorm
    void *ln2;             // (C) act   the norm before the MLP: post_attention_layernorm (Gemma 3:
                           //           pre_feedforward_layernorm)
    void *ln_attn, *ln_mlp;// (C) act   Gemma 3 only, else NULL: the norms of the attention's and the MLP's
                           //           outputs (post_attention_layernorm, post_feedforward_layernorm)
    void *q_norm, *k_norm; // (HD) act  Qwen3 only, else NULL
    void *bias[3];         // q (NH*HD), k, v (KVH*HD) act, Qwen2 only, else NULL
    QWeight lin[LIN_COUNT];// q (NH*HD, C), k, v (KVH*HD, C), o (C, NH*HD), gate, up (FF, C), down (C, FF)
    // Views of q|k|v ((NH + 2 KVH) HD, C) and gate|up (2 FF, C) as one weight each, where the parts
    // lie back to back in memory with scales that concatenate (FP8 row or 128x128 blocks of whole
    // rows; dense): the decode step then runs one GEMM instead of three and two. rows == 0: none.
    QWeight qkv, gateup;
    void *bias_qkv;        // the three biases back to back (Qwen2), or NULL
    // Qwen3 MoE's sparse layers (Config.moe[l]), where lin[LIN_GATE .. LIN_DOWN] are absent (rows 0):
    QWeight router;        // (E, C) mlp.gate, always dense (the published FP8 checkpoint keeps it BF16)
    QWeight *experts;      // (E, 3) gate, up (FFe, C), down (C, FFe) of mlp.experts.e, dense or FP8 with
                           // scales of their own; NULL on a dense layer
} LayerWeights;

typedef struct {
    void *wte;             // (V, C) act   embed_tokens; NULL when FP8 (emb)
    void *norm;            // (C) act      final norm
    void *lm_head;         // (V, C) act   == wte when tied; NULL when FP8 (head)
    void *score;           // (num_labels, C) act  a *ForSequenceClassification's score head, else NULL
    // The embedding table and the LM head as the ops read them (backend.h): dense (gran OFF, dense =
    // wte / lm_head), or with ModelOptions.fp8_embed E4M3 codes (V, C) + a scale per row (FP8_ROW) in
    // fp8_mem. Tied: head == emb, one copy.
    QWeight emb, head;
    LayerWeights *layers;  // (L) host array of pointers into the two blobs below
    QWeight *experts;      // (sparse layers, E, 3) host array: what LayerWeights.experts point into, or NULL
    void *dense_mem;       // one allocation: embeddings, norms, biases, lm_head, linears kept dense
    size_t dense_bytes;
    void *fp8_mem;         // one allocation: FP8 codes and their scales
    size_t fp8_bytes;
    size_t linear_bytes;   // bytes of the linear layers alone (codes + scales, or dense)
    size_t bucket_at, bucket_bytes;  // gradients in a bucket (model_alloc_grads_bucket): where the layers'
                                     // one bucket begins in dense_mem, and its size; 0: no bucket
} Weights;

// how to hold the linear weights
typedef struct {
    FP8Gran gran;          // FP8_OFF keeps them dense (act dtype)
    int pow2;              // power-of-two scales
    int bf16_first, bf16_last;  // keep the first / last N layers dense
    int fp8_embed;         // the embedding table and LM head in E4M3 with a scale per row (--fp8_embeddings):
                           // frozen, half the bytes of BF16 (1.16 GiB less at the Qwen3-8B shape)
} ModelOptions;

typedef struct LoRA LoRA;

// Saved activations of the training forward, for B sequences of T tokens (N = B*T).
// One arena allocation; the walker in model.c sets these pointers. With m->recompute
// the per-layer buffers (all but x) hold one layer instead of L.
typedef struct {
    void *x;      // (L+1, N, C) act   residual stream entering each layer; x[L] = final
    void *ln1;    // (L, N, C) act
    void *rstd1;  // (L, N) hp
    void *qpre;   // (L, N, NH*HD) act  q projection before q_norm (Qwen3) / == q otherwise
    void *kpre;   // (L, N, KVH*HD) act
    void *qrstd;  // (L, N*NH) hp      Qwen3 q_norm rstd
    void *krstd;  // (L, N*KVH) hp
    void *q;      // (L, N, NH*HD) act  after norm and RoPE
    void *k;      // (L, N, KVH*HD) act
    void *v;      // (L, N, KVH*HD) act
    void *att;    // (L, N, NH*HD) act  attention output
    void *lse;    // (L, B, NH, T) hp
    void *ao;     // (L, N, C) act      Gemma 3: the o projection's output (ln_attn's input), else NULL
    void *rstda;  // (L, N) hp          its rstd
    void *mo;     // (L, N, C) act      Gemma 3: the down projection's output (ln_mlp's input), else NULL
    void *rstdm;  // (L, N) hp
    void *xmid;   // (L, N, C) act      residual after attention
    void *ln2;    // (L, N, C) act
    void *rstd2;  // (L, N) hp
    void *gate;   // (L, N, FF) act
    void *up;     // (L, N, FF) act
    void *hmlp;   // (L, N, FF) act     silu(gate) * up (Gemma 3: gelu_tanh(gate) * up)
    // Qwen3 MoE (Config.E), else NULL: a sparse layer's router and experts (model.c moe_forward)
    void *rlogits;// (L, N, E) act      router logits
    void *ridx;   // (L, N, K) i32      each token's experts
    void *rw;     // (L, N, K) hp       their routing weights
    void *egate, *eup;  // (L, N, K, FFe) act  each (token, expert)'s gate and up products
    // keep (FP8 training, per-tensor recipes: model.c acts_keep): ln1, ln2 and hmlp hold one layer, and
    // the backward reads the FP8 codes the forward's products read, with their scales
    void *ln1q, *ln2q;  // (L, N, C) u8  E4M3 codes of ln1, ln2
    void *hq;     // (L, N, FF) u8      of hmlp
    void *kscale; // (L, 3) hp, a 16-byte slot each: their scales (ln1, ln2, hmlp)
    // a norm's output quantized once for the frozen FP8 projections that read it (q, k, v; gate, up:
    // model.c shared_input), each of which would otherwise quantize it again; NULL where no layer has them
    void *xq;     // (N, C) u8          E4M3 codes
    void *xqs;    // (N, C / 128) f32   their scales (ROW: N)
    void *lnf;    // (N, C) act         final norm output
    void *rstdf;  // (N) hp
    void *logp;   // (N) hp
    void *lsef;   // (N) hp
    // backward scratch (not per layer)
    void *dx;     // (N, C) act   gradient of the residual stream
    void *dln;    // (N, C) act
    void *dpost;  // (N, C) act   Gemma 3: the gradient of ln_attn's / ln_mlp's input, else NULL
    void *dq, *dk, *dv, *datt;  // (N, NH*HD), (N, KVH*HD) x2, (N, NH*HD) act
    void *dqpre, *dkpre;        // (N, NH*HD), (N, KVH*HD) act  (Qwen3 q/k-norm backward)
    void *dff1, *dff2, *dff3;   // (N, FF) act
    void *drw;    // (N, K) hp    Qwen3 MoE: the routing weights' gradient
    void *drlogits;  // (N, E) act  the router logits'
    void *ids, *pos, *targets;  // (N) i32
    void *dlogp;  // (N) hp
    void *mem;
    size_t bytes;
    int B, T;     // the shape the arena was sized for (capacity)
    float inv_temp;  // of the last model_logprobs (its backward uses the same)
    LoRA *lora;      // the adapter the last forward applied, or NULL (its backward must be given the same)
    int head_done;   // model_logprobs_grad made the head's gradient (dln) already
    int recompute;   // the layout: 1 recomputation (one layer of per-layer buffers), ACTS_FORWARD_ONLY a prefill
    int keep;        // the layout keeps ln1, ln2 and hmlp as FP8 codes (above)
    int recompute_mlp;  // the layout holds one layer of gate and up (Model.recompute_mlp)
} Acts;

typedef struct KVCache KVCache;

// The time-shared pool: one allocation that holds the KV cache during a
// rollout (at its top, with the prefill's activations at its bottom) and the training
// activations during an update (from its bottom), never both at once, so their peaks do not add.
// It grows on demand up to cap (--gpu_memory_utilization's budget) and dies naming the budget
// beyond it. cap == 0: no arena (KV caches and activations get allocations of their own).
typedef struct {
    void *mem;
    size_t bytes, cap;
    size_t kv_bytes;  // held at the top by the live KV cache, 0 when none
    size_t peak_kv, peak_acts;  // the most each role has held (the memory report)
} Arena;

// Scratch of the decode step (and of prefill's last-position logits): one row per
// sequence, not per layer. One allocation, sized for cap sequences.
typedef struct {
    int cap, mb_cap;
    void *x, *ln, *q, *k, *v, *att, *tmp;   // (cap, C) / (cap, NH*HD) / (cap, KVH*HD) act
    void *ff1, *ff2, *ff3;                  // (cap, FF) act
    void *fused;                            // (cap, max((NH + 2 KVH) HD, 2 FF)) act: a fused projection's output
    void *rlogits, *ridx, *rw;              // Qwen3 MoE: (cap, E) act, (cap, K) i32, (cap, K) hp (Acts' own)
    void *rstd;                             // (cap * NH) hp
    FP8Tensor xq;                           // the next FP8 product's input, quantized by the op that makes it
                                            // (codes (cap, max(C, FF)), scales for 1x128 groups; decode_fp8_input)
    void *tok, *pos, *slots, *seq_lens;     // (cap) i32, back to back (one upload per step)
    void *block_table;                      // (cap, mb_cap) i32, right after seq_lens
    void *logits;                           // (cap, V) hp: what the (replayed) decode step writes
    void *mem;
    size_t bytes;
} DecodeScratch;

typedef struct {
    Config cfg;
    const Backend *be;
    ModelOptions opt;
    Weights w;
    void *inv_freq;        // (HD/2) hp   RoPE inverse frequencies (scaling applied)
    void *inv_freq_local;  // (HD/2) hp   Gemma 3's sliding layers' (rope_local_theta), else NULL
    char *src_dir;         // the checkpoint directory model_load read (NULL: a model made here): model_save_hf
                           // writes a multimodal Gemma 3's vision tower and config.json back from it
    LoRA *lora;            // the adapter trained or loaded with the model, or NULL: what the activations' layout
                           // (no FP8 codes kept where an adapter reads its input), the memory report and
                           // ./export account for. No forward applies it unless it is passed (model_forward's lo)
    int recompute;         // gradient checkpointing: keep each layer's input only, recompute the layer in
                           // the backward (per-layer activations shrink L-fold for one more forward)
    int recompute_mlp;     // keep no gate and up products (2 FF values a token a layer): the backward computes
                           // them again from their saved input (the FP8 codes where Acts.keep), two products more
    Acts acts;
    int B, T;              // shape of the last forward
    void *grads;           // optional fp gradients of every dense weight (hp), one allocation, or NULL
    Weights gw;            // pointer table into grads (same layout as w's dense part, or with a bucket)
    // called by model_backward after layer l's gradients are complete (bucketed gradients), or NULL
    void (*layer_grads)(void *ctx, int l);
    void *layer_grads_ctx;
    DecodeScratch dec;
    int no_graphs;         // 1: run the decode step plainly, never through the backend's replay
                           // (comparisons, debugging)
    int kv_fp8;            // the KV caches this model allocates hold FP8 E4M3 (--kv_cache_dtype fp8)
    Arena arena;
    FP8Train **fp8_train;  // (n_fp8_train) the linear weights trained in FP8 (model_fp8_train), or NULL
    int n_fp8_train;
    long fp8_overflows;    // delayed scaling: tensors whose amax was inf/NaN at a step, so far
    int fp8_keep;          // every layer trained in FP8 with a per-tensor recipe: the activations the
                           // projections read are saved as their FP8 codes (model.c acts_keep); 0 turns it off
} Model;

// ---- the model's memory (model_alloc.c) ----
// a Model of config c on be: its weights allocated as opt holds them (unset), its RoPE frequencies made;
// what model_load fills from a checkpoint and model_init_random at random
void model_common_init(Model *m, const Config *c, const Backend *be, const ModelOptions *opt);
// the shape (rows, cols) of a layer's projection which (LIN_*), and of expert weight k (0 gate, 1 up, 2 down)
void lin_shape(const Config *c, int which, int *rows, int *cols);
void expert_shape(const Config *c, int k, int *rows, int *cols);
void model_free(Model *m);
// FP8 training (--fp8_recipe): the dense projections (q, k, v, o, gate, up, down) of every layer
// but the --bf16_first_layers / --bf16_last_layers run their three products as FP8 GEMMs under
// recipe r from now on (fp8_train.cu says which tensors are FP8), and with r->lm_head the LM head's
// (--fp8_lm_head; its state last in fp8_train). Dies in one line where the
// backend (the CPU's) or the GPU (no FP8 tensor cores) cannot, naming BF16 as the way on.
void model_fp8_train(Model *m, const FP8Recipe *r);
// after each optimizer step (full_step calls it): delayed scaling's histories roll, from the step's
// amaxes as reduce leaves them (NULL: as this process saw them; several ranks: their max)
void model_fp8_train_step(Model *m, AmaxReduce reduce, void *ctx);
// delayed scaling's state (scales and amax histories) as floats into buf, or from it (set 1), for
// a checkpoint; returns the count (buf NULL: counted only), 0 when nothing is kept between steps
size_t model_fp8_train_state(const Model *m, float *buf, int set);
// allocate (zeroed) gradients for every dense weight; zero them again later with model_zero_grads
void model_alloc_grads(Model *m);
// the same, but the layers' gradients in one bucket of one layer's size (gw.bucket_at, gw.bucket_bytes),
// which every layer's backward writes in turn: set m->layer_grads to take each layer's away (summed
// to where they are kept) and zero the bucket before the next. What sharded full training holds
// (train/full_finetune.h) instead of every gradient.
void model_alloc_grads_bucket(Model *m);
void model_zero_grads(Model *m);

// ---- config and weights (io/model_load.c) ----
void config_from_json(Config *cfg, const char *json_text, const char *path_for_errors);
void config_print(const Config *cfg, FILE *f);
// config.json of a checkpoint directory alone (what a program checks before it loads the weights)
void config_load_dir(Config *cfg, const char *dir);
// dies with one line when a tokenizer's ids (0 .. tokenizer_vocab - 1) do not fit vocab_size: the
// tokenizer belongs to another checkpoint
void config_check_tokenizer(const Config *cfg, int tokenizer_vocab, const char *dir);
// the checkpoint names of the text model's tensors: the decoder's prefix ("model.", or a multimodal Gemma 3's
// "language_model.model." / "model.language_model.") and the LM head's name
const char *config_text_prefix(const Config *cfg);
const char *config_head_name(const Config *cfg);
// 1 for a tensor of a multimodal Gemma 3's vision tower or projector (never read by the model)
int hf_vision_tensor(const char *name);
// load a Hugging Face checkpoint directory (config.json + *.safetensors); dies with a one-line error on bad input
void model_load(Model *m, const char *dir, const Backend *be, const ModelOptions *opt);
// the same for a *ForSequenceClassification checkpoint (a reward model): its transformer and its score head
// (w.score); model_load refuses one, and this anything else
void model_load_classifier(Model *m, const char *dir, const Backend *be, const ModelOptions *opt);
// a random-weight model of the given config (for the built-in tiny model and tests); std 0.02-ish init
void model_init_random(Model *m, const Config *cfg, const Backend *be, const ModelOptions *opt, uint64_t seed);
// One tensor of the model under its Hugging Face checkpoint name (model_hf_tensors): a vector (cols 0)
// or matrix of act values (dense), or a linear layer's weight (lin: dense or FP8, as it is held)
typedef struct {
    char name[96];      // "model.layers.0.self_attn.q_proj.weight"
    int64_t rows, cols;
    const void *dense;  // (rows) or (rows, cols) act; NULL for a linear weight
    const QWeight *lin; // the linear weight (rows, cols), or NULL
    int layer, which;   // lin, or an expert's weight: its layer; lin: its LIN_*; else -1
    int expert;         // Qwen3 MoE: 3 e + k for expert e's gate (k 0), up (1), down (2) weight; else -1
} HFTensor;
// the model's tensors as a checkpoint names and orders them, into out (NULL: counted only); returns the count
int model_hf_tensors(const Model *m, HFTensor *out);
// write the model's weights as a Hugging Face checkpoint (config.json + model.safetensors, bf16 or f32),
// dense weights only (a model loaded with FP8 is dequantized); a multimodal Gemma 3 whole, its vision tower
// and projector copied from src_dir as they are (a model made here: the text model alone)
void model_save_hf(const Model *m, const char *dir, DType dt);
void model_free_scratch(Model *m);  // the activation arena and decode scratch (weights stay)
// turn the time-shared arena on with this budget (bytes); see Arena
void model_arena_init(Model *m, size_t cap);
// make the arena hold at least bytes (moving it: nothing may live in it); dies beyond the budget
void model_arena_reserve(Model *m, size_t bytes, const char *what);
// m->recompute / Acts.recompute: a forward that no backward follows (the rollout's prefill): one
// layer's buffers, two of x in turn, none of the backward's
#define ACTS_FORWARD_ONLY 2
// bytes the activations of B sequences of T tokens take: every layer's, one layer's with recompute
// (1), or a forward alone's (ACTS_FORWARD_ONLY: what a prefill uses)
size_t model_acts_bytes(const Model *m, int B, int T, int recompute);
// per-layer quantization error report: SQNR (dB) of each linear weight at each granularity
void model_sqnr_report(const char *dir, FILE *f);

// ---- forward / backward (model.c) ----
// training / scoring forward over B right-padded sequences of T tokens ids_host (B*T), with the adapter lo
// applied (NULL: none; the base model, the KL and DPO reference); saves what backward needs. Then logprobs of targets_host (B*T, -1 = none) at
// inverse temperature inv_temp, returned to the host in logp_host (B*T) as fp64.
void model_forward(Model *m, LoRA *lo, const int *ids_host, int B, int T);
void model_logprobs(Model *m, const int *targets_host, float inv_temp, double *logp_host);
// full logits (B*T, V) as fp32 on the host, after model_forward
void model_logits(Model *m, float *logits_host);
// backward of sum_n dlogp[n] * logp[n] (the last model_logprobs call): accumulates into the gradients
// of lo, the adapter the forward applied (any other dies: its saved activations are the forward's), and
// into m->grads (when allocated)
void model_backward(Model *m, LoRA *lo, const double *dlogp_host);
// model_logprobs for a loss whose dlogp is known before the logprobs (one linear in them: the SFT
// loss, -1/norm for each target), with the head's part of the backward in the same pass: each chunk
// of logits computed once, where model_logprobs and model_backward compute it twice. Then
// model_backward(m, lo, NULL) goes on from the head's gradient; the results are model_logprobs' and
// model_backward(m, lo, dlogp_host)'s.
void model_logprobs_grad(Model *m, const int *targets_host, float inv_temp, const double *dlogp_host, double *logp_host);
// backward of sum_n <dh[n], h[n]>, h the final norm's output of the last model_forward (acts.lnf, (N, C)
// act): the hook for a head of the caller's own on the hidden states in place of the LM head's logprobs
// (PPO's value head, train/ppo_train.h). dh (N, C) act in backend memory; it may be acts.dln itself
// (no copy). Accumulates as model_backward does.
void model_backward_hidden(Model *m, LoRA *lo, const void *dh);

// ---- KV cache decode (model.c) ----
struct KVCache {
    int L, KVH, HD;
    int BS;          // tokens per block
    int NB;          // blocks in the pool
    int fp8;         // 1: E4M3 codes with a scale per (slot, head) (backend.h kv_write), 0: act values
    size_t esize;    // bytes per element: 1 (FP8) or the act size
    void *k, *v;     // (L, NB, BS, KVH, HD) act values or FP8 codes each
    float *ks, *vs;  // FP8: (L, NB * BS, KVH) hp scales each; else NULL
    void *mem;
    size_t bytes;
    int in_arena;    // at the top of the model's arena (kvcache_free releases, not frees)
};
size_t kvcache_bytes(const Model *m, int num_blocks, int block_size);
// with an arena: at its top (the activations below it are dropped if they overlap); the arena
// must already hold it (model_arena_reserve), else the cache gets an allocation of its own
void kvcache_alloc(KVCache *kv, Model *m, int num_blocks, int block_size);
void kvcache_free_model(KVCache *kv, Model *m);
// layer l's values or codes (kc, vc) and, for FP8, scales (ks, vs; else NULL)
void kvcache_layer(const KVCache *kv, int l, void **kc, void **vc, float **ks, float **vs);
void kvcache_free(KVCache *kv, const Backend *be);

// Prefill B right-padded prompts ids_host (B*T) with the adapter lo (or NULL): writes their K/V to slots_host (B*T, -1 = padding),
// and returns the last-position logits of each prompt (lens_host (B)) as logits (B, V) hp in backend memory
void model_prefill(Model *m, LoRA *lo, KVCache *kv, const int *ids_host, const int *lens_host, const int *slots_host,
                   int B, int T, void *logits);
// One decode step for S sequences with the adapter lo (or NULL; from its act copies, lora_sync_act): token tokens_host[s] at position pos_host[s] goes to slot
// slots_host[s]; then attends to seq_lens[s] = pos + 1 cached tokens via block_table_host (S, MB).
// Writes logits (S, V) hp in backend memory.
void model_decode(Model *m, LoRA *lo, KVCache *kv, const int *tokens_host, const int *pos_host, const int *slots_host,
                  const int *block_table_host, int S, int MB, void *logits);

#ifdef __cplusplus
}
#endif
#endif  // MODEL_H
