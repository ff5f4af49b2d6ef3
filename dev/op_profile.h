// dev/op_profile.h: where the GPU time goes, op by op. A Backend wrapper that records a
// CUDA event pair around every op on the backend's stream (no synchronization, so the ops
// run as they do unprofiled, minus graphs) and sums the GPU time per category.
// Header-only, for the dev/ benchmark programs (CUDA backend):
//
//   Backend W;  prof_install(be, &W);  m.be = &W;  ...run...;  prof_report(stdout, wall_s, steps);
//
// "GPU busy" is the sum over ops; wall time minus it is what the host costs (launches,
// synchronizations, host-side work) when the ops run without a graph.
#ifndef OP_PROFILE_H
#define OP_PROFILE_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "core/backend.h"

void *backend_cuda_stream(void);  // backend_cuda.cu: the stream every op runs on

enum { P_LIN_F, P_LIN_B, P_LORA_F, P_LORA_B, P_ATT_F, P_ATT_B, P_ATT_DEC, P_KV_WRITE, P_NORM, P_ROPE, P_SWIGLU, P_ADD,
       P_MOE_R, P_MOE_F, P_MOE_B, P_LOGITS, P_HEAD_F, P_HEAD_B, P_SAMPLE, P_EMB, P_OPT, P_MEM, P_COUNT };
static const char *const prof_name[P_COUNT] = {
    "linear forward (FP8 quantize + GEMM)", "linear backward (dX)", "LoRA forward", "LoRA backward",
    "attention forward", "attention backward", "attention decode (paged)", "KV cache write",
    "rmsnorm f+b (decode: + residual add)", "rope f+b (decode: + q/k norm, KV write)", "swiglu f+b", "residual add",
    "MoE router f+b (softmax, top-K)", "MoE experts forward (grouped GEMMs)", "MoE experts backward", "logits (lm head, decode)", "logprobs forward (lm head)",
    "logprobs backward (lm head)", "sampling", "embedding", "AdamW + grad zero", "memcpy / memset"};

static double prof_ms[P_COUNT];
static long prof_calls[P_COUNT];

#define PROF_CAP 8192  // event pairs in flight before the wrapper folds them into the sums
static struct {
    const Backend *R;
    cudaStream_t st;
    cudaEvent_t a[PROF_CAP], b[PROF_CAP];
    int cat[PROF_CAP], n;
} PF;

static void prof_flush(void) {
    if (!PF.n) return;
    cudaEventSynchronize(PF.b[PF.n - 1]);
    for (int i = 0; i < PF.n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, PF.a[i], PF.b[i]);
        prof_ms[PF.cat[i]] += ms;
        prof_calls[PF.cat[i]]++;
    }
    PF.n = 0;
}
static int prof_begin(int cat) {
    if (PF.n == PROF_CAP) prof_flush();
    PF.cat[PF.n] = cat;
    cudaEventRecord(PF.a[PF.n], PF.st);
    return PF.n++;
}
static void prof_end(int i) { cudaEventRecord(PF.b[i], PF.st); }
// a host round trip (download, sync) is timed on the host: its GPU part is a copy
#define PW(cat, call) do { int i_ = prof_begin(cat); call; prof_end(i_); } while (0)

static void pw_linear_forward(void *out, const void *inp, const QWeight *w, const void *bias, int N) {
    PW(P_LIN_F, PF.R->linear_forward(out, inp, w, bias, N));
}
static void pw_linear_forward_q(void *out, const FP8Tensor *xq, const QWeight *w, const void *bias, int N) {
    PW(P_LIN_F, PF.R->linear_forward_q(out, xq, w, bias, N));
}
static void pw_linear_backward(void *dinp, int acc, void *dw, void *db, const void *dout, const void *inp, const QWeight *w, int N) {
    PW(P_LIN_B, PF.R->linear_backward(dinp, acc, dw, db, dout, inp, w, N));
}
static void pw_lora_down(void *ax, const void *inp, const void *A, int N, int C, int Rk) {
    PW(P_LORA_F, PF.R->lora_down(ax, inp, A, N, C, Rk));
}
static void pw_lora_up(void *out, const void *ax, int ld, const void *B, float s, int N, int Rk, int OC) {
    PW(P_LORA_F, PF.R->lora_up(out, ax, ld, B, s, N, Rk, OC));
}
static void pw_lora_apply(void *out, const void *inp, const void *A, const void *B, float s, int N, int C, int Rk, int OC) {
    PW(P_LORA_F, PF.R->lora_apply(out, inp, A, B, s, N, C, Rk, OC));
}
static void pw_lora_up_backward(void *dax, void *dB, const void *dout, const void *ax, int ld, const void *B, float s, int N,
                                int Rk, int OC) {
    PW(P_LORA_B, PF.R->lora_up_backward(dax, dB, dout, ax, ld, B, s, N, Rk, OC));
}
static void pw_lora_down_backward(void *dinp, void *dA, const void *dax, const void *inp, const void *A, int N, int C, int Rk) {
    PW(P_LORA_B, PF.R->lora_down_backward(dinp, dA, dax, inp, A, N, C, Rk));
}
static void pw_att_f(void *out, void *lse, const void *q, const void *k, const void *v, int B, int T, int NH, int KVH, int HD,
                     double sc, int win) {
    PW(P_ATT_F, PF.R->attention_forward(out, lse, q, k, v, B, T, NH, KVH, HD, sc, win));
}
static void pw_att_b(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *lse, const void *q,
                     const void *k, const void *v, int B, int T, int NH, int KVH, int HD, double sc, int win) {
    PW(P_ATT_B, PF.R->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, KVH, HD, sc, win));
}
static void pw_att_dec(void *out, const void *q, const void *kc, const void *vc, const float *ks, const float *vs,
                       const int32_t *bt, const int32_t *sl, int S, int NH, int KVH, int HD, int BS, int MB, double sc,
                       int win, FP8Tensor *outq) {
    PW(P_ATT_DEC, PF.R->attention_decode(out, q, kc, vc, ks, vs, bt, sl, S, NH, KVH, HD, BS, MB, sc, win, outq));
}
static void pw_kv_write(void *kc, void *vc, float *ks, float *vs, const void *k, const void *v, const int32_t *slots, int N,
                        int KVH, int HD) {
    PW(P_KV_WRITE, PF.R->kv_write(kc, vc, ks, vs, k, v, slots, N, KVH, HD));
}
static void pw_norm_f(void *out, void *rstd, const void *inp, const void *w, int N, int C, float eps) {
    PW(P_NORM, PF.R->rmsnorm_forward(out, rstd, inp, w, N, C, eps));
}
static void pw_norm_b(void *dinp, void *dw, const void *dout, const void *inp, const void *w, const void *rstd, int N, int C) {
    PW(P_NORM, PF.R->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C));
}
static void pw_rope_f(void *x, const int32_t *pos, const void *f, int N, int H, int HD) { PW(P_ROPE, PF.R->rope_forward(x, pos, f, N, H, HD)); }
static void pw_rope_b(void *x, const int32_t *pos, const void *f, int N, int H, int HD) { PW(P_ROPE, PF.R->rope_backward(x, pos, f, N, H, HD)); }
static void pw_swiglu_f(void *o, const void *g, const void *u, size_t n) { PW(P_SWIGLU, PF.R->swiglu_forward(o, g, u, n)); }
static void pw_swiglu_b(void *dg, void *du, const void *d, const void *g, const void *u, size_t n) {
    PW(P_SWIGLU, PF.R->swiglu_backward(dg, du, d, g, u, n));
}
static int pw_swiglu_bq(void *dg, void *du, const void *d, const void *g, const void *u, int N, int FF, const QWeight *wg,
                        const QWeight *wu) {
    int done = 0;
    PW(P_SWIGLU, done = PF.R->swiglu_backward_q(dg, du, d, g, u, N, FF, wg, wu));
    return done;
}
static void pw_add(void *o, const void *a, const void *b, size_t n) { PW(P_ADD, PF.R->add(o, a, b, n)); }
static void pw_add_rmsnorm(void *x, void *o, void *r, const void *dx, const void *w, int N, int C, float eps, int n1p,
                           FP8Tensor *q) {
    PW(P_NORM, PF.R->add_rmsnorm(x, o, r, dx, w, N, C, eps, n1p, q));
}
static void pw_glu_gu(void *o, FP8Tensor *q, const void *gu, int N, int FF, int gelu) { PW(P_SWIGLU, PF.R->glu_gu(o, q, gu, N, FF, gelu)); }
static void pw_qkv_rope_kv(void *q, void *k, const void *qin, const void *kin, const void *vin, int ldq, int ldkv,
                           const void *qn, const void *kn, int n1p, const int32_t *pos, const void *f, void *kc, void *vc,
                           float *ks, float *vs, const int32_t *slots, int N, int NH, int KVH, int HD, float eps) {
    PW(P_ROPE, PF.R->qkv_rope_kv(q, k, qin, kin, vin, ldq, ldkv, qn, kn, n1p, pos, f, kc, vc, ks, vs, slots, N, NH, KVH, HD, eps));
}
static void pw_moe_route(int32_t *idx, void *w, const void *lg, int N, int E, int K, int norm) {
    PW(P_MOE_R, PF.R->moe_route(idx, w, lg, N, E, K, norm));
}
static void pw_moe_route_b(void *dlg, const void *dw, const void *lg, const int32_t *idx, int N, int E, int K, int norm) {
    PW(P_MOE_R, PF.R->moe_route_backward(dlg, dw, lg, idx, N, E, K, norm));
}
static void pw_moe_f(void *out, void *g, void *u, const void *x, const int32_t *idx, const void *w, const QWeight *ex, int N,
                     int E, int K, const ExpertLoRA *xl) {
    PW(P_MOE_F, PF.R->moe_experts_forward(out, g, u, x, idx, w, ex, N, E, K, xl));
}
static void pw_moe_b(void *dx, void *dw, const QWeight *dex, const void *dout, const void *x, const int32_t *idx, const void *w,
                     const void *g, const void *u, const QWeight *ex, int N, int E, int K,
                     const ExpertLoRA *xl) {
    PW(P_MOE_B, PF.R->moe_experts_backward(dx, dw, dex, dout, x, idx, w, g, u, ex, N, E, K, xl));
}
// no recording: every op runs (and is timed) each step
static void pw_replay(const void *key, size_t key_bytes, void (*run)(void *arg), void *arg) { run(arg); }
static void pw_logits(void *lg, const void *h, const QWeight *w, int N) { PW(P_LOGITS, PF.R->logits_forward(lg, h, w, N)); }
static void pw_logp_f(void *logp, void *lse, const void *h, const QWeight *wlm, const int32_t *t, float it, int N) {
    PW(P_HEAD_F, PF.R->logprobs_forward(logp, lse, h, wlm, t, it, N));
}
static void pw_logp_b(void *dh, void *dwlm, const void *dl, const void *lse, const void *h, const QWeight *wlm,
                      const int32_t *t, float it, int N) {
    PW(P_HEAD_B, PF.R->logprobs_backward(dh, dwlm, dl, lse, h, wlm, t, it, N));
}
static void pw_logp_fused(void *logp, void *lse, void *dh, void *dwlm, const void *dl, const void *h, const QWeight *wlm,
                          const int32_t *t, float it, int N) {
    PW(P_HEAD_B, PF.R->logprobs_fused(logp, lse, dh, dwlm, dl, h, wlm, t, it, N));
}
static void pw_sample(int32_t *tok, void *logp, const void *lg, uint64_t *rng, int S, int V, float T, int k, float p) {
    PW(P_SAMPLE, PF.R->sample(tok, logp, lg, rng, S, V, T, k, p));
}
static void pw_emb_f(void *out, const int32_t *ids, const QWeight *wte, int N) { PW(P_EMB, PF.R->embedding_forward(out, ids, wte, N)); }
static void pw_adamw(void *p, const void *g, float gs, void *m, void *v, size_t n, float lr, float b1, float b2, float eps,
                     float wd, int step, void *act, const Bf16Moments *m16) {
    PW(P_OPT, PF.R->adamw(p, g, gs, m, v, n, lr, b1, b2, eps, wd, step, act, m16));
}
static void pw_zero(void *p, size_t bytes) { PW(P_MEM, PF.R->zero(p, bytes)); }
static void pw_upload(void *d, const void *s, size_t b) { PW(P_MEM, PF.R->upload(d, s, b)); }
static void pw_download(void *d, const void *s, size_t b) { PW(P_MEM, PF.R->download(d, s, b)); }
static void pw_copy(void *d, const void *s, size_t b) { PW(P_MEM, PF.R->copy(d, s, b)); }
static void pw_upload_convert(void *d, DType dt, const void *s, DType st, size_t n) { PW(P_MEM, PF.R->upload_convert(d, dt, s, st, n)); }

// W becomes real with every op timed; graphs are left out (a captured step would hide the ops)
static void prof_install(const Backend *real, Backend *W) {
    if (!PF.R)
        for (int i = 0; i < PROF_CAP; i++) {
            cudaEventCreate(&PF.a[i]);
            cudaEventCreate(&PF.b[i]);
        }
    PF.R = real;
    PF.st = (cudaStream_t)backend_cuda_stream();
    PF.n = 0;
    memset(prof_ms, 0, sizeof prof_ms);
    memset(prof_calls, 0, sizeof prof_calls);
    *W = *real;
    W->linear_forward = pw_linear_forward; W->linear_backward = pw_linear_backward;
    W->moe_route = pw_moe_route; W->moe_route_backward = pw_moe_route_b;
    W->moe_experts_forward = pw_moe_f; W->moe_experts_backward = pw_moe_b;
    W->lora_down = pw_lora_down; W->lora_up = pw_lora_up; W->lora_apply = pw_lora_apply;
    W->lora_up_backward = pw_lora_up_backward; W->lora_down_backward = pw_lora_down_backward;
    W->attention_forward = pw_att_f; W->attention_backward = pw_att_b;
    W->attention_decode = pw_att_dec; W->kv_write = pw_kv_write;
    W->rmsnorm_forward = pw_norm_f; W->rmsnorm_backward = pw_norm_b;
    W->rope_forward = pw_rope_f; W->rope_backward = pw_rope_b;
    W->swiglu_forward = pw_swiglu_f; W->swiglu_backward = pw_swiglu_b; W->add = pw_add;
    if (real->swiglu_backward_q) W->swiglu_backward_q = pw_swiglu_bq;
    W->add_rmsnorm = pw_add_rmsnorm; W->qkv_rope_kv = pw_qkv_rope_kv;
    W->linear_forward_q = pw_linear_forward_q; W->glu_gu = pw_glu_gu;
    W->logits_forward = pw_logits; W->logprobs_forward = pw_logp_f; W->logprobs_backward = pw_logp_b;
    if (real->logprobs_fused) W->logprobs_fused = pw_logp_fused;
    W->sample = pw_sample; W->embedding_forward = pw_emb_f; W->adamw = pw_adamw;
    W->zero = pw_zero; W->upload = pw_upload; W->download = pw_download; W->copy = pw_copy;
    W->upload_convert = pw_upload_convert;
    W->replay = pw_replay;
}

// the table: GPU ms per category (per step when steps > 0), share of the GPU-busy time;
// returns the GPU-busy total in ms
static double prof_report(FILE *f, const char *title, double wall_ms, int steps) {
    prof_flush();
    double tot = 0;
    for (int k = 0; k < P_COUNT; k++) tot += prof_ms[k];
    double per = steps > 0 ? steps : 1;
    fprintf(f, "\nprofile: %s (CUDA events around each op, no graphs; %s)\n", title, steps > 0 ? "ms per step" : "ms");
    for (int k = 0; k < P_COUNT; k++)
        if (prof_calls[k])
            fprintf(f, "  %-40s %9.3f ms  %5.1f%%  (%ld calls)\n", prof_name[k], prof_ms[k] / per, 100 * prof_ms[k] / tot,
                    prof_calls[k]);
    fprintf(f, "  %-40s %9.3f ms\n", "GPU busy (sum of the ops)", tot / per);
    if (wall_ms > 0) fprintf(f, "  %-40s %9.3f ms  (host: launches, syncs, host work)\n", "wall - GPU busy", (wall_ms - tot) / per);
    return tot;
}

#endif  // OP_PROFILE_H
