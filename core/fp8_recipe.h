// fp8_recipe.h: the FP8 training recipe's scaling rules and its CPU reference (fp8_recipe.c), after
// Transformer Engine's recipe (DelayedScaling, Float8CurrentScaling, Float8BlockScaling).
//   defines: FP8Recipe (the options: --fp8_format, --fp8_recipe, --fp8_amax_history_len,
//   --fp8_amax_compute_algo, --fp8_margin), DelayedScale (one tensor's amax history and scale) with
//   delayed_init / delayed_record / delayed_update, fp8_quantize_scaled_cpu (quantize with a given
//   scale), and fp8_linear_train_cpu (a linear layer's three products on FP8 operands, in fp64).
//
// A linear layer Y = X W^T has three products, each on FP8 operands with fp32 (here fp64)
// accumulation:
//   forward      Y  = X  W^T     X, W in the forward format
//   input grad   dX = dY W       dY in the backward format
//   weight grad  dW = dY^T X
// Formats (--fp8_format): hybrid = E4M3 forward (activations, weights), E5M2 backward (gradients:
// more range, less precision); e4m3 = E4M3 everywhere.
// Scaling (--fp8_recipe):
//   current  each tensor's scale from its own amax, computed when it is quantized (two passes);
//   delayed  the scale used at step t comes from the amax history of steps before t (one pass: the
//            quantize kernel records the amax for later); the history rolls after the step
//            (delayed_update), as TE's DelayedScaling does;
//   block    1x128 tiles for activations and gradients, 128x128 blocks for weights, each scaled by
//            its own amax (NeMo's blockwise / DeepSeek-V3): the granularity fp8.h already has.
// Scales here follow TE's convention where it says so: TE's scale multiplies (q = fp8(x * scale),
// scale = fp8_max * 2^-margin / amax); its inverse is the dequantization scale the project stores
// (FP8Tensor.scale, HF's weight_scale_inv).
#ifndef FP8_RECIPE_H
#define FP8_RECIPE_H

#include "fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FP8_RECIPE_CURRENT = 0, FP8_RECIPE_DELAYED, FP8_RECIPE_BLOCK } FP8RecipeKind;
typedef enum { AMAX_MAX = 0, AMAX_MOST_RECENT } AmaxAlgo;
// What a trainer does with a step's amaxes (n floats) before the histories roll: with several
// data-parallel ranks, reduce them over the ranks (dist_reduce_amax), so that all hold one history
typedef void (*AmaxReduce)(float *amax, size_t n, void *ctx);

typedef struct {
    FP8RecipeKind kind;
    int hybrid;          // 1: E5M2 gradients (--fp8_format hybrid), 0: E4M3 everywhere (e4m3)
    int history_len;     // --fp8_amax_history_len (TE's default 1024)
    AmaxAlgo algo;       // --fp8_amax_compute_algo max | most_recent
    float margin;        // --fp8_margin: scales leave 2^margin of headroom
    int lm_head;         // --fp8_lm_head: the LM head's three products in FP8 too (delayed; fp8_train.cu)
} FP8Recipe;

// TE's defaults: delayed, hybrid, history 1024, max, margin 0; the LM head in bf16
FP8Recipe fp8_recipe_default(void);
// "current" | "delayed" | "block"; "max" | "most_recent"; "hybrid" | "e4m3": -1 if unknown
int fp8_recipe_parse(const char *s);
int amax_algo_parse(const char *s);
int fp8_format_hybrid_parse(const char *s);

// One tensor's delayed scaling state (TE's DelayedScaling, per tensor).
typedef struct {
    int len;
    AmaxAlgo algo;
    FP8Format fmt;
    float scaled_max;  // fp8_max * 2^-margin
    float *history;    // (len): history[0] collects this step's amax; older steps follow
    float scale;       // in force this step: q = fp8(x * scale); 1 before any update
    float scale_inv;   // 1 / scale: the dequantization scale
    long overflows;    // steps whose recorded amax was inf or NaN (their scale is kept)
} DelayedScale;

void delayed_init(DelayedScale *d, const FP8Recipe *r, FP8Format fmt);
void delayed_free(DelayedScale *d);
// this step's amax of the tensor (several calls in a step: their max; a NaN sticks)
void delayed_record(DelayedScale *d, float amax);
// after the step: roll the history, and the scale for the next step from it. With algo max, the max
// of the whole history (NaN ignored); most_recent, this step's. A new scale only from a finite,
// positive amax, else the old one stays (TE). One deviation: where scaled_max / amax overflows float
// (an amax below ~1e-36) the scale is FLT_MAX, as TE's current scaling does, not inf.
void delayed_update(DelayedScale *d);

// t (allocated, TENSOR granularity) = quantize(x) with the given multiplying scale: q = encode(x *
// scale), t->scale[0] = 1 / scale. Returns amax(|x|) of x (NaN if x holds one), for delayed_record.
float fp8_quantize_scaled_cpu(FP8Tensor *t, const float *x, float scale);

// A linear layer's three products in fp64 on the FP8 operands' dequantized values, the reference
// the GPU's FP8 training GEMMs are tested against: y (N, OC) = x W^T; dx (N, C) = dy W;
// dw (OC, C) = dy^T x. x (N, C) and dy (N, OC) are activation-layout FP8 tensors, w (OC, C) a weight;
// any output may be NULL.
void fp8_linear_train_cpu(double *y, double *dx, double *dw, const FP8Tensor *x, const FP8Tensor *w,
                          const FP8Tensor *dy);

#ifdef __cplusplus
}
#endif
#endif  // FP8_RECIPE_H
