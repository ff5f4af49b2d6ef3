// lora.c: LoRA adapters (see lora.h): creation with PEFT's initialisation, the
// forward/backward hooks model.c calls, AdamW and clipping over one flat
// parameter buffer, and PEFT-format save/load.
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "lora.h"
#include "io/safetensors.h"

static const char *const lin_parent_name[LIN_COUNT] = {"self_attn", "self_attn", "self_attn", "self_attn",
                                                       "mlp",       "mlp",       "mlp"};

unsigned lora_parse_targets(const char *list) {
    if (!strcmp(list, "all") || !strcmp(list, "all-linear")) return (1u << LIN_COUNT) - 1;
    unsigned mask = 0;
    char *s = str_dup(list), *save = NULL;
    for (const char *c = list; *c; c++)
        if (*c == ',' && (c == list || c[1] == ',' || c[1] == 0)) die("LoRA target modules '%s': an empty name in the list", list);
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int i = 0; i < LIN_COUNT; i++) {
            size_t n = strlen(tok);
            // "q_proj" or "q"
            if (!strcmp(tok, lin_names[i]) || (!strncmp(tok, lin_names[i], n) && !strcmp(lin_names[i] + n, "_proj")))
                found = i;
        }
        if (found < 0) die("unknown LoRA target module '%s': use q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj or all", tok);
        mask |= 1u << found;
    }
    free(s);
    if (!mask) die("no LoRA target modules given");
    return mask;
}

// PEFT's target_parameters as it matches them: the parameter's name (mlp.experts.gate_up_proj) or its end
// after a '.'; j 0 gate_up_proj, 1 down_proj, -1 neither
static const char *const EXPERT_PARAM[2] = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
static int expert_param(const char *name) {
    size_t k = strlen(name);
    for (int j = 0; j < 2; j++) {
        size_t n = strlen(EXPERT_PARAM[j]);
        if (!strcmp(name, EXPERT_PARAM[j]) || (k < n && EXPERT_PARAM[j][n - k - 1] == '.' && !strcmp(EXPERT_PARAM[j] + n - k, name)))
            return j;
    }
    return -1;
}

unsigned lora_parse_target_parameters(const char *list) {
    unsigned mask = 0;
    if (!*list) return 0;
    char *s = str_dup(list), *save = NULL;
    for (const char *c = list; *c; c++)
        if (*c == ',' && (c == list || c[1] == ',' || c[1] == 0)) die("LoRA target parameters '%s': an empty name in the list", list);
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int j = expert_param(tok);
        if (j < 0) die("unknown LoRA target parameter '%s': use mlp.experts.gate_up_proj, mlp.experts.down_proj (Qwen3 MoE's experts)", tok);
        mask |= LORA_EXPERTS_GATE_UP << j;
    }
    free(s);
    return mask;
}

// The products' units (lora.h): q, k, v; o; gate, up; down
static const int UNIT_FIRST[4] = {LIN_Q, LIN_O, LIN_GATE, LIN_DOWN}, UNIT_N[4] = {3, 1, 2, 1};

// adapter k's unit's first adapted member: its A starts the unit's stacked A, its ax the unit's ax
static int unit_head(const LoRA *lo, int k) {
    int i = k % LIN_COUNT, u = 0;
    while (i >= UNIT_FIRST[u] + UNIT_N[u]) u++;
    int j = UNIT_FIRST[u];
    while (!(lo->targets & (1u << j))) j++;
    return k - i + j;
}

// element offset of adapter k's A (ab 0) or B (ab 1) in the blobs
static size_t blob_at(const LoRA *lo, int k, int ab) {
    return (size_t)((char *)(ab ? lo->B[k] : lo->A[k]) - (char *)lo->params) / dtype_size(lo->sdt);
}

#define ATTN_TARGETS ((1u << LIN_Q) | (1u << LIN_K) | (1u << LIN_V) | (1u << LIN_O))
#define LIN_TARGETS ((1u << LIN_COUNT) - 1)

// element offset of layer l's expert adapter j's A (ab 0) or B (ab 1) in the blobs
static size_t expert_blob_at(const LoRA *lo, int l, int j, int ab) {
    void *p = ab ? lo->eB[2 * l + j] : lo->eA[2 * l + j];
    return (size_t)((char *)p - (char *)lo->params) / dtype_size(lo->sdt);
}

// layout of the four blobs (params, grads, m, v): per layer and unit, the A's of its adapted members, then
// their B's; params, m and v in lo->sdt, grads in hp
static void lora_layout(LoRA *lo, const Model *m, int r, float alpha, unsigned targets, int bf16) {
    const Config *c = &m->cfg;
    // Qwen3 MoE: adapters on the attention, and on the experts as PEFT's target_parameters names them; the
    // router stays frozen, and so does the MLP of a dense layer among them (PEFT would name it as it names
    // the experts' modules in transformers 4.x)
    if (c->E && (targets & LIN_TARGETS & ~ATTN_TARGETS))
        die("LoRA on gate_proj, up_proj or down_proj of a qwen3_moe model is not supported: target the attention (q_proj, "
            "k_proj, v_proj, o_proj), and the experts with --lora_target_parameters mlp.experts.gate_up_proj,mlp.experts.down_proj");
    if ((targets & LORA_EXPERTS) && !c->E)
        die("LoRA target parameters mlp.experts.gate_up_proj / down_proj are Qwen3 MoE's experts, and this model has none: "
            "drop --lora_target_parameters");
    if ((targets & LORA_EXPERTS) && strncmp(m->be->name, "cpu", 3))
        die("LoRA on Qwen3 MoE's experts runs on the CPU backend only (no CUDA kernels for it yet): use --device cpu, or "
            "LoRA on the attention alone (no --lora_target_parameters)");
    lo->bf16 = bf16;
    lo->sdt = bf16 && m->be->act == DT_BF16 ? DT_BF16 : m->be->hp;
    lo->r = r;
    lo->alpha = alpha;
    lo->scale = alpha / r;
    lo->targets = targets;
    lo->L = c->L;
    lo->be = m->be;
    for (int i = 0; i < LIN_COUNT; i++) {
        lo->in[i] = m->w.layers[0].lin[i].cols;
        lo->out[i] = m->w.layers[0].lin[i].rows;
    }
    for (int u = 0; u < 4; u++) {
        int R = 0;
        for (int i = UNIT_FIRST[u]; i < UNIT_FIRST[u] + UNIT_N[u]; i++)
            if (targets & (1u << i)) lo->col[i] = R, R += r;
        for (int i = UNIT_FIRST[u]; i < UNIT_FIRST[u] + UNIT_N[u]; i++) lo->ld[i] = R;
    }
    int n = c->L * LIN_COUNT;
    lo->A = (void **)callocCheck(n, sizeof(void *));
    lo->B = (void **)callocCheck(n, sizeof(void *));
    lo->dA = (void **)callocCheck(n, sizeof(void *));
    lo->dB = (void **)callocCheck(n, sizeof(void *));
    lo->ax = (void **)callocCheck(n, sizeof(void *));
    lo->n = 0;
    for (int l = 0; l < c->L; l++)
        for (int i = 0; i < LIN_COUNT; i++)
            if (targets & (1u << i)) lo->n += (size_t)r * lo->in[i] + (size_t)lo->out[i] * r;
    // the experts' adapters (PEFT's layout, ExpertLoRA): gate_up A (E r, C), B (2 FFe, r E); down A (E r, FFe),
    // B (C, r E); after every projection's, on the sparse layers
    lo->E = c->E;
    lo->ein[0] = lo->eout[1] = c->C, lo->eout[0] = 2 * c->FFe, lo->ein[1] = c->FFe;
    lo->eA = (void **)callocCheck(2 * (size_t)c->L, sizeof(void *));
    lo->eB = (void **)callocCheck(2 * (size_t)c->L, sizeof(void *));
    lo->edA = (void **)callocCheck(2 * (size_t)c->L, sizeof(void *));
    lo->edB = (void **)callocCheck(2 * (size_t)c->L, sizeof(void *));
    for (int l = 0; l < c->L; l++)
        for (int j = 0; j < 2; j++)
            if (c->moe[l] && (targets & (LORA_EXPERTS_GATE_UP << j)))
                lo->n += (size_t)c->E * r * (lo->ein[j] + lo->eout[j]);
    size_t hp = dtype_size(m->be->hp), sd = dtype_size(lo->sdt), bytes = lo->n * sd;
    lo->params = m->be->alloc(bytes);
    lo->grads = m->be->alloc(lo->n * hp);
    lo->m = m->be->alloc(bytes);
    lo->v = m->be->alloc(bytes);
    m->be->zero(lo->grads, lo->n * hp);
    m->be->zero(lo->m, bytes);
    m->be->zero(lo->v, bytes);
    size_t off = 0;
    for (int l = 0; l < c->L; l++)
        for (int u = 0; u < 4; u++)
            for (int ab = 0; ab < 2; ab++)
                for (int i = UNIT_FIRST[u]; i < UNIT_FIRST[u] + UNIT_N[u]; i++) {
                    if (!(targets & (1u << i))) continue;
                    int k = l * LIN_COUNT + i;
                    *(ab ? &lo->B[k] : &lo->A[k]) = (char *)lo->params + off * sd;
                    *(ab ? &lo->dB[k] : &lo->dA[k]) = (char *)lo->grads + off * hp;
                    off += ab ? (size_t)lo->out[i] * r : (size_t)r * lo->in[i];
                }
    for (int l = 0; l < c->L; l++)
        for (int j = 0; j < 2; j++) {
            if (!c->moe[l] || !(targets & (LORA_EXPERTS_GATE_UP << j))) continue;
            int k = 2 * l + j;
            lo->eA[k] = (char *)lo->params + off * sd, lo->edA[k] = (char *)lo->grads + off * hp;
            off += (size_t)c->E * r * lo->ein[j];
            lo->eB[k] = (char *)lo->params + off * sd, lo->edB[k] = (char *)lo->grads + off * hp;
            off += (size_t)c->E * r * lo->eout[j];
        }
}

const ExpertLoRA *lora_experts(const LoRA *lo, int layer, ExpertLoRA *xl) {
    if (!lo || !(lo->eA[2 * layer] || lo->eA[2 * layer + 1])) return NULL;
    for (int j = 0; j < 2; j++) {
        int k = 2 * layer + j;
        xl->A[j] = lo->eA[k], xl->B[j] = lo->eB[k], xl->dA[j] = lo->edA[k], xl->dB[j] = lo->edB[k];
    }
    xl->r = lo->r;
    xl->scale = lo->scale;
    return xl;
}

// the masters from fp64 host values: rounded to bf16 (to nearest) first with bf16, so that both
// backends hold the same values whatever their storage
static void upload_params(LoRA *lo, double *h) {
    if (lo->bf16)
        for (size_t i = 0; i < lo->n; i++) h[i] = bf16_to_f32(f32_to_bf16((float)h[i]));
    lo->be->upload_convert(lo->params, lo->sdt, h, DT_F64, lo->n);
}

LoRA *lora_create(const Model *m, int r, float alpha, unsigned targets, uint64_t seed, int bf16) {
    if (r <= 0) die("lora_r must be positive (got %d)", r);
    if (m->cfg.E && (targets & LIN_TARGETS) == LIN_TARGETS) {  // "all" on Qwen3 MoE: the attention (lora_layout)
        targets = ATTN_TARGETS | (targets & LORA_EXPERTS);
        int ex = (targets & LORA_EXPERTS) != 0;
        fprintf(stderr, "qwen3_moe: LoRA adapters on the attention (q_proj, k_proj, v_proj, o_proj)%s; the router%s frozen\n",
                ex ? " and the experts" : "", ex ? " stays" : " and the experts stay");
    }
    LoRA *lo = (LoRA *)callocCheck(1, sizeof(LoRA));
    lora_layout(lo, m, r, alpha, targets, bf16);
    lo->sr_seed = seed ^ 0x5bf0363e2ad1f7a3ull;
    // kaiming_uniform_(A, a=sqrt(5)): bound = sqrt(6 / ((1 + a^2) fan_in)) = 1 / sqrt(fan_in); B = 0
    double *h = (double *)mallocCheck(lo->n * sizeof(double));
    Rng rng = rng_make(seed);
    for (int l = 0; l < lo->L; l++)  // drawn adapter by adapter, in (layer, projection) order
        for (int i = 0; i < LIN_COUNT; i++) {
            if (!(targets & (1u << i))) continue;
            double bound = 1.0 / sqrt((double)lo->in[i]), *a = h + blob_at(lo, l * LIN_COUNT + i, 0);
            double *b = h + blob_at(lo, l * LIN_COUNT + i, 1);
            for (size_t j = 0; j < (size_t)r * lo->in[i]; j++) a[j] = bound * (2.0 * rng_uniform_d(&rng) - 1.0);
            for (size_t j = 0; j < (size_t)lo->out[i] * r; j++) b[j] = 0.0;
        }
    for (int l = 0; l < lo->L; l++)  // the experts' (PEFT: nn.Linear(in, r E)'s kaiming bound, 1 / sqrt(in); B = 0)
        for (int j = 0; j < 2; j++) {
            if (!lo->eA[2 * l + j]) continue;
            double bound = 1.0 / sqrt((double)lo->ein[j]), *a = h + expert_blob_at(lo, l, j, 0);
            double *b = h + expert_blob_at(lo, l, j, 1);
            for (size_t q = 0; q < (size_t)lo->E * r * lo->ein[j]; q++) a[q] = bound * (2.0 * rng_uniform_d(&rng) - 1.0);
            for (size_t q = 0; q < (size_t)lo->E * r * lo->eout[j]; q++) b[q] = 0.0;
        }
    upload_params(lo, h);
    free(h);
    return lo;
}

void lora_free(LoRA *lo) {
    if (!lo) return;
    const Backend *be = lo->be;
    be->free(lo->params);
    if (lo->act_mem) be->free(lo->act_mem);
    free(lo->A_act);
    free(lo->B_act);
    if (lo->grp_mem) be->free(lo->grp_mem);
    free(lo->gB);
    be->free(lo->grads);
    be->free(lo->m);
    be->free(lo->v);
    if (lo->ax_mem) be->free(lo->ax_mem);
    free(lo->A);
    free(lo->B);
    free(lo->dA);
    free(lo->dB);
    free(lo->ax);
    free(lo->eA);
    free(lo->eB);
    free(lo->edA);
    free(lo->edB);
    free(lo);
}

void lora_zero_grads(LoRA *lo) { lo->be->zero(lo->grads, lo->n * dtype_size(lo->be->hp)); }
double lora_grad_norm(const LoRA *lo) { return sqrt(lo->be->sumsq(lo->grads, lo->n)); }
void lora_scale_grads(LoRA *lo, float s) { lo->be->scale(lo->grads, lo->n, s); }

void lora_adamw_step(LoRA *lo, float lr, float beta1, float beta2, float eps, float weight_decay) {
    lo->step++;
    if (lo->bf16)
        lo->be->adamw_bf16(lo->params, lo->grads, lo->m, lo->v, lo->n, lr, beta1, beta2, eps, weight_decay, lo->step,
                           lo->sr_seed);
    else lo->be->adamw(lo->params, lo->grads, 1.0f, lo->m, lo->v, lo->n, lr, beta1, beta2, eps, weight_decay, lo->step, NULL, NULL);
    lo->act_valid = 0;  // the masters moved
}

// ----------------------------------------------------------------------------
// hooks

// the widest unit's R (the rows of dax)
static int widest_unit(const LoRA *lo) {
    int w = 0;
    for (int i = 0; i < LIN_COUNT; i++)
        if (lo->targets & (1u << i) && lo->ld[i] > w) w = lo->ld[i];
    return w;
}

size_t lora_acts_bytes(const LoRA *lo, int N) {
    int count = 0;
    for (int k = 0; k < lo->L * LIN_COUNT; k++) count += lo->A[k] != NULL;
    return (size_t)N * ((size_t)count * lo->r + widest_unit(lo)) * dtype_size(lo->be->act);
}

// per (layer, unit) an (N, R) ax; the members point at their columns
void lora_ensure_acts(LoRA *lo, int N) {
    if (lo->ax_mem && lo->ax_cap >= N) return;
    const Backend *be = lo->be;
    if (lo->ax_mem) be->free(lo->ax_mem);
    size_t act = dtype_size(be->act), dax = (size_t)N * widest_unit(lo) * act;
    lo->ax_mem = be->alloc(lora_acts_bytes(lo, N));
    char *p = (char *)lo->ax_mem;
    lo->dax = p;
    p += dax;
    for (int k = 0; k < lo->L * LIN_COUNT; k++) {
        int i = k % LIN_COUNT;
        lo->ax[k] = lo->A[k] ? p + (size_t)lo->col[i] * act : NULL;
        if (lo->A[k] && lo->col[i] + lo->r == lo->ld[i]) p += (size_t)N * lo->ld[i] * act;  // the unit's last member
    }
    lo->ax_cap = N;
}

size_t lora_state_bytes(const LoRA *lo) { return lo->n * (3 * dtype_size(lo->sdt) + dtype_size(lo->be->hp)); }

size_t lora_copies_bytes(const LoRA *lo) {
    return (lo->act_mem ? lo->n * dtype_size(lo->be->act) : 0) + (lo->grp_mem ? lo->grp_bytes : 0);
}

// the decode step's groups: the units whose projections the model also holds fused (q|k|v, gate|up)
static const int GROUP_UNIT[2] = {0, 2};

// the group adapters' B's (lora.h) in one allocation, their blocks off the diagonal zero
static void groups_alloc(LoRA *lo) {
    const Backend *be = lo->be;
    size_t act = dtype_size(be->act), total = 0;
    int out[2] = {0, 0};
    for (int g = 0; g < 2; g++) {
        int u = GROUP_UNIT[g];
        for (int i = UNIT_FIRST[u]; i < UNIT_FIRST[u] + UNIT_N[u]; i++) out[g] += lo->out[i];
        total += (size_t)lo->L * lo->ld[UNIT_FIRST[u]] * out[g];
    }
    lo->gB = (void **)callocCheck((size_t)lo->L * 2, sizeof(void *));
    if (!total) return;
    lo->grp_mem = be->alloc(total * act);
    lo->grp_bytes = total * act;
    be->zero(lo->grp_mem, total * act);
    char *p = (char *)lo->grp_mem;
    for (int l = 0; l < lo->L; l++)
        for (int g = 0; g < 2; g++) {
            int R = lo->ld[UNIT_FIRST[GROUP_UNIT[g]]];
            if (!R) continue;
            lo->gB[l * 2 + g] = p;
            p += (size_t)out[g] * R * act;
        }
}

// fill the group B's from the per-member act copies: each B into its block (rows: the member's part
// of the fused output; columns: its r of the group's)
static void groups_fill(LoRA *lo) {
    const Backend *be = lo->be;
    size_t act = dtype_size(be->act);
    for (int l = 0; l < lo->L; l++)
        for (int g = 0; g < 2; g++) {
            int u = GROUP_UNIT[g], R = lo->ld[UNIT_FIRST[u]];
            if (!R) continue;
            char *B = (char *)lo->gB[l * 2 + g];
            size_t row = 0;
            for (int i = UNIT_FIRST[u]; i < UNIT_FIRST[u] + UNIT_N[u]; i++) {
                int k = l * LIN_COUNT + i;
                if (lo->B_act[k])
                    be->copy_2d(B + (row * R + lo->col[i]) * act, (size_t)R * act, lo->B_act[k], (size_t)lo->r * act,
                                (size_t)lo->r * act, (size_t)lo->out[i]);
                row += lo->out[i];
            }
        }
}

// the per-member act copies: allocated once, then each made from the masters
static void members_sync(LoRA *lo) {
    const Backend *be = lo->be;
    if (!lo->act_mem) {
        size_t sd = dtype_size(lo->sdt), act = dtype_size(be->act);
        lo->act_mem = be->alloc(lo->n * act);
        lo->A_act = (void **)callocCheck((size_t)lo->L * LIN_COUNT, sizeof(void *));
        lo->B_act = (void **)callocCheck((size_t)lo->L * LIN_COUNT, sizeof(void *));
        for (int k = 0; k < lo->L * LIN_COUNT; k++) {
            if (!lo->A[k]) continue;
            lo->A_act[k] = (char *)lo->act_mem + ((char *)lo->A[k] - (char *)lo->params) / sd * act;
            lo->B_act[k] = (char *)lo->act_mem + ((char *)lo->B[k] - (char *)lo->params) / sd * act;
        }
    }
    if (lo->sdt == be->hp) be->to_act(lo->act_mem, lo->params, lo->n);
    else be->copy(lo->act_mem, lo->params, lo->n * dtype_size(lo->sdt));  // bf16 masters are act values already
}

void lora_sync_act(LoRA *lo) {
    members_sync(lo);
    if (!lo->gB) groups_alloc(lo);
    groups_fill(lo);
    lo->act_valid = 1;
}
void lora_release_act(LoRA *lo) { lo->act_valid = 0; }

void lora_train_weights(LoRA *lo) {
    if (lo->sdt == lo->be->act) return;  // the masters are what the products read
    members_sync(lo);
}

int lora_group_act(const LoRA *lo, int layer, int group, const void **A, const void **B) {
    if (!lo->act_valid) die("lora: the decode step needs the act copies (lora_sync_act)");
    int first = UNIT_FIRST[GROUP_UNIT[group]], R = lo->ld[first];
    if (!R) return 0;
    *A = lo->A_act[unit_head(lo, layer * LIN_COUNT + first)];  // the unit's stacked A
    *B = lo->gB[layer * 2 + group];
    return R;
}

// what a training product reads of adapter k: the masters where they are act values, else the act copies
// lora_train_weights made; either way of type act
static void train_weights(const LoRA *lo, int k, const void **A, const void **B) {
    int in_place = lo->sdt == lo->be->act;
    *A = in_place ? lo->A[k] : lo->A_act[k];
    *B = in_place ? lo->B[k] : lo->B_act[k];
}

void lora_hook_forward(LoRA *lo, int layer, int which, void *out, const void *inp, int N, int save) {
    int k = layer * LIN_COUNT + which;
    if (!lo->A[k]) return;
    if (!save) {  // a decode step: the act copies, nothing kept for a backward
        if (!lo->act_valid) die("lora: the decode step needs the act copies (lora_sync_act)");
        lo->be->lora_apply(out, inp, lo->A_act[k], lo->B_act[k], lo->scale, N, lo->in[which], lo->r, lo->out[which]);
        return;
    }
    if (lo->ax_cap < N) die("lora: activation buffers hold %d rows, forward has %d", lo->ax_cap, N);
    const void *A, *B;
    int h = unit_head(lo, k), R = lo->ld[which];
    if (k == h) {  // the unit's down product, every member's ax at once
        train_weights(lo, h, &A, &B);
        lo->be->lora_down(lo->ax[h], inp, A, N, lo->in[which], R);
        lo->down_inp = inp;
        lo->down_k = h;
    } else if (lo->down_k != h || lo->down_inp != inp)
        die("lora: layer %d's %s came without its unit's first member (the hooks take q, k, v and gate, up in order, on one input)",
            layer, lin_names[which]);
    train_weights(lo, k, &A, &B);
    lo->be->lora_up(out, lo->ax[k], R, B, lo->scale, N, lo->r, lo->out[which]);
}

void lora_hook_backward(LoRA *lo, int layer, int which, void *dinp, const void *dout, const void *inp, int N) {
    int k = layer * LIN_COUNT + which;
    if (!lo->A[k]) return;
    if (lo->up_done != lo->col[which] / lo->r)
        die("lora: layer %d's %s came out of its unit's order (the hooks take q, k, v and gate, up in order)", layer,
            lin_names[which]);
    const void *A, *B;
    int R = lo->ld[which];
    train_weights(lo, k, &A, &B);
    void *dax = (char *)lo->dax + (size_t)lo->col[which] * dtype_size(lo->be->act);
    lo->be->lora_up_backward(dax, lo->dB[k], dout, lo->ax[k], R, B, lo->scale, N, lo->r, lo->out[which]);
    if (lo->col[which] + lo->r < R) {  // more members to come
        lo->up_done++;
        return;
    }
    lo->up_done = 0;  // the unit's last member: its input gradient and dA's, once for all
    int h = unit_head(lo, k);
    train_weights(lo, h, &A, &B);
    lo->be->lora_down_backward(dinp, lo->dA[h], lo->dax, inp, A, N, lo->in[which], R);
}

// ----------------------------------------------------------------------------
// PEFT format

// The modules' names PEFT sees: the decoder's layers under model. (Gemma3ForConditionalGeneration's under
// model.language_model., as transformers 4.52 and later name them; older versions named them
// language_model.model., which adapters made then hold and lora_load_peft reads too)
static const char *peft_prefix(const Model *m, int old) {
    return !m->cfg.mm ? "model." : old ? "language_model.model." : "model.language_model.";
}
static void peft_name(char *out, size_t cap, const char *prefix, int l, int i, char ab) {
    snprintf(out, cap, "base_model.model.%slayers.%d.%s.%s.lora_%c.weight", prefix, l, lin_parent_name[i], lin_names[i], ab);
}

// PEFT's names for layer l's expert adapter j (0 gate_up_proj, 1 down_proj): its ParamWrappers nest in the
// module's parameter order, so with both adapted gate_up_proj's is the inner one (base_layer.)
static void expert_peft_name(char *out, size_t cap, const char *prefix, int l, int j, unsigned targets, char ab) {
    int inner = j == 0 && (targets & LORA_EXPERTS_DOWN);
    snprintf(out, cap, "base_model.model.%slayers.%d.mlp.experts.%slora_%c.weight", prefix, l, inner ? "base_layer." : "", ab);
}

void lora_save_peft(const LoRA *lo, const Model *m, const char *dir, const char *base_model_name, const char *base_fingerprint) {
    const Backend *be = lo->be;
    mkdir(dir, 0755);
    size_t sd = dtype_size(lo->sdt);
    void *raw = mallocCheck(lo->n * sd);
    be->download(raw, lo->params, lo->n * sd);
    float *f = (float *)mallocCheck(lo->n * sizeof(float));
    convert_to_f32(f, raw, lo->sdt, lo->n);
    free(raw);
    int cnt = 0;
    for (int k = 0; k < lo->L * LIN_COUNT; k++) cnt += lo->A[k] != NULL;
    for (int k = 0; k < lo->L * 2; k++) cnt += lo->eA[k] != NULL;
    STWrite *t = (STWrite *)callocCheck(2 * cnt, sizeof(STWrite));
    char **names = (char **)callocCheck(2 * cnt, sizeof(char *));
    int n = 0;
    for (int l = 0; l < lo->L; l++)
        for (int i = 0; i < LIN_COUNT; i++) {
            int k = l * LIN_COUNT + i;
            if (!lo->A[k]) continue;
            char nm[256];
            peft_name(nm, sizeof nm, peft_prefix(m, 0), l, i, 'A');
            names[n] = str_dup(nm);
            t[n] = (STWrite){names[n], DT_F32, 2, {lo->r, lo->in[i]}, f + blob_at(lo, k, 0)};
            n++;
            peft_name(nm, sizeof nm, peft_prefix(m, 0), l, i, 'B');
            names[n] = str_dup(nm);
            t[n] = (STWrite){names[n], DT_F32, 2, {lo->out[i], lo->r}, f + blob_at(lo, k, 1)};
            n++;
        }
    for (int l = 0; l < lo->L; l++)
        for (int j = 0; j < 2; j++)
            for (int ab = 0; lo->eA[2 * l + j] && ab < 2; ab++) {
                char nm[256];
                expert_peft_name(nm, sizeof nm, peft_prefix(m, 0), l, j, lo->targets, ab ? 'B' : 'A');
                names[n] = str_dup(nm);
                int64_t er = (int64_t)lo->E * lo->r;
                t[n] = (STWrite){names[n], DT_F32, 2, {ab ? lo->eout[j] : er, ab ? er : lo->ein[j]},
                                 f + expert_blob_at(lo, l, j, ab)};
                n++;
            }
    char p[4096];
    path_join(p, sizeof p, dir, "adapter_model.safetensors");
    char md[128];
    snprintf(md, sizeof md, "{\"format\":\"pt\"%s%s%s}", base_fingerprint ? ",\"base_model_fingerprint\":\"" : "",
             base_fingerprint ? base_fingerprint : "", base_fingerprint ? "\"" : "");
    st_write(p, t, n, md);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(t);
    free(f);

    // the base as an absolute path where it is a directory here, so that the adapter finds it (and
    // PEFT's AutoPeftModel loads it) from any working directory; else as given (a hub name)
    char abs[PATH_MAX];
    struct stat sb;
    if (base_model_name && stat(base_model_name, &sb) == 0 && S_ISDIR(sb.st_mode) && realpath(base_model_name, abs))
        base_model_name = abs;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "peft_type", "LORA");
    cJSON_AddStringToObject(r, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(r, "base_model_name_or_path", base_model_name ? base_model_name : "");
    cJSON_AddNumberToObject(r, "r", lo->r);
    cJSON_AddNumberToObject(r, "lora_alpha", lo->alpha);
    cJSON_AddNumberToObject(r, "lora_dropout", 0.0);
    cJSON_AddStringToObject(r, "bias", "none");
    cJSON_AddBoolToObject(r, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(r, "use_rslora", 0);
    cJSON_AddBoolToObject(r, "use_dora", 0);
    cJSON_AddBoolToObject(r, "inference_mode", 1);
    if (m->cfg.mm) {  // a list of names would select the vision tower's q_proj, k_proj and v_proj as well
        char re[160] = ".*language_model.*\\.(";
        for (int i = 0, k = 0; i < LIN_COUNT; i++)
            if (lo->targets & (1u << i)) snprintf(re + strlen(re), sizeof re - strlen(re), "%s%s", k++ ? "|" : "", lin_names[i]);
        strcat(re, ")");
        cJSON_AddStringToObject(r, "target_modules", re);
    } else {
        cJSON *tm = cJSON_AddArrayToObject(r, "target_modules");
        for (int i = 0; i < LIN_COUNT; i++)
            if (lo->targets & (1u << i)) cJSON_AddItemToArray(tm, cJSON_CreateString(lin_names[i]));
    }
    if (lo->targets & LORA_EXPERTS) {
        cJSON *tp = cJSON_AddArrayToObject(r, "target_parameters");
        for (int j = 0; j < 2; j++)
            if (lo->targets & (LORA_EXPERTS_GATE_UP << j)) cJSON_AddItemToArray(tp, cJSON_CreateString(EXPERT_PARAM[j]));
    }
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    path_join(p, sizeof p, dir, "adapter_config.json");
    write_file_atomic(p, text, strlen(text));
    free(text);
}

// does PEFT's target_modules select the module called name?
typedef struct {
    const cJSON *tm;
    pcre2_code *re;  // a string target_modules, compiled
    pcre2_match_data *md;
} PeftTargets;
static int peft_selects(const PeftTargets *t, const char *name) {
    if (t->re) {
        int rc = pcre2_match(t->re, (PCRE2_SPTR)name, PCRE2_ZERO_TERMINATED, 0, 0, t->md, NULL);
        if (rc < PCRE2_ERROR_NOMATCH) die("target_modules: the regular expression failed on %s (PCRE2 error %d)", name, rc);
        return rc >= 0;
    }
    const cJSON *e;
    size_t n = strlen(name);
    cJSON_ArrayForEach(e, t->tm) {  // a name equal to the module's, or to the end of it after a '.'
        size_t k = strlen(e->valuestring);
        if (!strcmp(name, e->valuestring) || (k < n && name[n - k - 1] == '.' && !strcmp(name + n - k, e->valuestring))) return 1;
    }
    return 0;
}

// The projections adapter_config.json's target_modules selects, as PEFT reads it against the modules
// model.layers.{l}.{self_attn|mlp}.{q_proj|...} (peft_prefix's, either naming of a multimodal Gemma 3's):
// a string is a regular expression that the whole name
// must match (Python's re.fullmatch), "all-linear" every projection; a list holds names that a module's
// name equals or ends with after a '.'. Adapters on every layer only: a projection selected in some
// layers and not others is an error, as is a selection of no projection at all.
static unsigned peft_targets(const cJSON *tm, const Model *m, const char *path) {
    int L = m->cfg.L;
    PeftTargets t = {tm, NULL, NULL};
    if (cJSON_IsString(tm)) {
        if (!strcmp(tm->valuestring, "all-linear")) return (1u << LIN_COUNT) - 1;
        int err;
        PCRE2_SIZE off;
        t.re = pcre2_compile((PCRE2_SPTR)tm->valuestring, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF, &err,
                             &off, NULL);
        if (!t.re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            die("%s: target_modules \"%.80s\" is not a regular expression (%s at offset %zu); PEFT reads a string as one",
                path, tm->valuestring, (const char *)msg, (size_t)off);
        }
        t.md = pcre2_match_data_create_from_pattern(t.re, NULL);
    } else if (cJSON_IsArray(tm)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, tm) if (!cJSON_IsString(e)) die("%s: target_modules must be names", path);
    } else die("%s: missing target_modules", path);
    unsigned targets = 0;
    for (int i = 0; i < LIN_COUNT; i++) {
        int hits = 0;
        char name[128], old[128];
        for (int l = 0; l < L; l++) {
            snprintf(name, sizeof name, "%slayers.%d.%s.%s", peft_prefix(m, 0), l, lin_parent_name[i], lin_names[i]);
            snprintf(old, sizeof old, "%slayers.%d.%s.%s", peft_prefix(m, 1), l, lin_parent_name[i], lin_names[i]);
            hits += peft_selects(&t, name) || (m->cfg.mm && peft_selects(&t, old));
        }
        if (hits == L) targets |= 1u << i;
        else if (hits > 0) {
            if (t.re) pcre2_match_data_free(t.md), pcre2_code_free(t.re);
            die("%s: target_modules selects %s in %d of the %d layers: adapters on every layer only", path, lin_names[i], hits, L);
        }
    }
    if (t.re) pcre2_match_data_free(t.md), pcre2_code_free(t.re);
    if (!targets) die("%s: target_modules selects none of the projections (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)", path);
    return targets;
}

// tensor t (NULL: missing) of file p, called nm, into dst as fp64: (d0, d1) in f32, bf16 or f16, else one line
static void take_tensor(double *dst, const SafeTensors *st, const STensor *t, const char *p, const char *nm, int64_t d0,
                        int64_t d1, uint8_t *used) {
    if (!t) die("%s: missing tensor %s", p, nm);
    if (t->ndim != 2 || t->shape[0] != d0 || t->shape[1] != d1)
        die("%s: %s has the wrong shape for this model (expected (%lld, %lld))", p, nm, (long long)d0, (long long)d1);
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16) die("%s: %s has dtype %s", p, nm, dtype_name(t->dtype));
    convert_to_f64(dst, t->data, t->dtype, (size_t)t->numel);
    used[t - st->t] = 1;
}

LoRA *lora_load_peft(const Model *m, const char *dir) {
    char p[4096];
    path_join(p, sizeof p, dir, "adapter_config.json");
    if (!file_exists(p)) die("%s: no adapter_config.json (expected a PEFT LoRA adapter directory)", dir);
    cJSON *r = read_json_object(p);
    cJSON *ty = cJSON_GetObjectItemCaseSensitive(r, "peft_type");
    if (cJSON_IsString(ty) && strcmp(ty->valuestring, "LORA")) die("%s: peft_type %s is not LORA", p, ty->valuestring);
    cJSON *jr = cJSON_GetObjectItemCaseSensitive(r, "r"), *ja = cJSON_GetObjectItemCaseSensitive(r, "lora_alpha");
    if (!cJSON_IsNumber(jr) || !(jr->valuedouble >= 1 && jr->valuedouble <= 65536) || jr->valuedouble != floor(jr->valuedouble))
        die("%s: \"r\" must be an integer in [1, 65536]", p);
    if (ja && !cJSON_IsNull(ja) && !(cJSON_IsNumber(ja) && ja->valuedouble > 0 && ja->valuedouble <= 1e6))
        die("%s: \"lora_alpha\" must be a number in (0, 1e6]", p);
    float alpha = cJSON_IsNumber(ja) ? (float)ja->valuedouble : (float)jr->valuedouble;
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(r, "use_rslora");
    if (cJSON_IsTrue(rs)) die("%s: use_rslora adapters are not supported", p);
    cJSON *dr = cJSON_GetObjectItemCaseSensitive(r, "use_dora");
    if (cJSON_IsTrue(dr)) die("%s: DoRA adapters are not supported", p);
    const char *unsupported[] = {"rank_pattern", "alpha_pattern"};
    for (int i = 0; i < 2; i++) {
        cJSON *x = cJSON_GetObjectItemCaseSensitive(r, unsupported[i]);
        if (cJSON_IsObject(x) && x->child) die("%s: per-module %s is not supported", p, unsupported[i]);
    }
    cJSON *lt = cJSON_GetObjectItemCaseSensitive(r, "layers_to_transform");
    if (lt && !cJSON_IsNull(lt)) die("%s: layers_to_transform is not supported (adapters on every layer only)", p);
    cJSON *fi = cJSON_GetObjectItemCaseSensitive(r, "fan_in_fan_out");
    if (cJSON_IsTrue(fi)) die("%s: fan_in_fan_out adapters are not supported", p);
    unsigned targets = peft_targets(cJSON_GetObjectItemCaseSensitive(r, "target_modules"), m, p);
    // PEFT's LoRA on parameters (target_parameters): Qwen3 MoE's experts, mlp.experts.gate_up_proj and down_proj
    // in transformers 5.x (PEFT's ParamWrapper; ExpertLoRA has its layout)
    cJSON *tp = cJSON_GetObjectItemCaseSensitive(r, "target_parameters");
    if (tp && !cJSON_IsNull(tp)) {
        const cJSON *e;
        if (!cJSON_IsArray(tp)) die("%s: target_parameters must be a list of names", p);
        cJSON_ArrayForEach(e, tp) {
            int j = cJSON_IsString(e) ? expert_param(e->valuestring) : -1;
            if (j < 0)
                die("%s: target_parameters entry %.80s names no parameter fp8-grpo adapts (mlp.experts.gate_up_proj, "
                    "mlp.experts.down_proj of Qwen3 MoE)", p, cJSON_IsString(e) ? e->valuestring : "(not a name)");
            targets |= LORA_EXPERTS_GATE_UP << j;
        }
    }
    int rank = (int)jr->valuedouble;
    cJSON_Delete(r);

    // the weights first: what "r" asks for must be in the file before anything is allocated
    char pc[4096];
    snprintf(pc, sizeof pc, "%s", p);
    path_join(p, sizeof p, dir, "adapter_model.safetensors");
    SafeTensors st;
    st_open(&st, p);
    for (int k = 0; m->cfg.mm && k < st.n; k++)
        if (strstr(st.t[k].name, "vision_tower.") || strstr(st.t[k].name, "multi_modal_projector."))
            die("%s: tensor %s adapts the vision tower, and fp8-grpo runs Gemma 3's text model only: make the adapter with "
                "target_modules a regular expression over the language model's projections (e.g. "
                "\".*language_model.*\\\\.(q_proj|v_proj)\")", p, st.t[k].name);
    size_t want = 0, have = 0;
    for (int i = 0; i < LIN_COUNT; i++)
        if (targets & (1u << i)) want += (size_t)m->cfg.L * rank * (m->w.layers[0].lin[i].rows + m->w.layers[0].lin[i].cols);
    for (int l = 0; l < m->cfg.L; l++)
        for (int j = 0; j < 2; j++)
            if (m->cfg.moe[l] && (targets & (LORA_EXPERTS_GATE_UP << j)))
                want += (size_t)m->cfg.E * rank * (size_t)(j ? m->cfg.FFe + m->cfg.C : m->cfg.C + 2 * m->cfg.FFe);
    for (int k = 0; k < st.n; k++) have += (size_t)st.t[k].numel;
    if (want > have) die("%s: \"r\" %d needs %zu values, and %s holds %zu", pc, rank, want, p, have);
    LoRA *lo = (LoRA *)callocCheck(1, sizeof(LoRA));
    lora_layout(lo, m, rank, alpha, targets, 0);
    double *h = (double *)mallocCheck(lo->n * sizeof(double));
    uint8_t *used = (uint8_t *)callocCheck(st.n ? st.n : 1, 1);  // (st.n) the tensors read
    for (int l = 0; l < lo->L; l++)
        for (int i = 0; i < LIN_COUNT; i++) {
            if (!(targets & (1u << i))) continue;
            for (int ab = 0; ab < 2; ab++) {
                char nm[256];
                peft_name(nm, sizeof nm, peft_prefix(m, 0), l, i, ab ? 'B' : 'A');
                const STensor *t = st_find(&st, nm);
                if (!t && m->cfg.mm) {  // an adapter made on transformers older than 4.52
                    char old[256];
                    peft_name(old, sizeof old, peft_prefix(m, 1), l, i, ab ? 'B' : 'A');
                    if ((t = st_find(&st, old))) snprintf(nm, sizeof nm, "%s", old);
                }
                take_tensor(h + blob_at(lo, l * LIN_COUNT + i, ab), &st, t, p, nm, ab ? lo->out[i] : rank,
                            ab ? rank : lo->in[i], used);
            }
        }
    for (int l = 0; l < lo->L; l++)
        for (int j = 0; j < 2; j++)
            for (int ab = 0; lo->eA[2 * l + j] && ab < 2; ab++) {
                char nm[256];
                expert_peft_name(nm, sizeof nm, peft_prefix(m, 0), l, j, targets, ab ? 'B' : 'A');
                int64_t er = (int64_t)lo->E * rank;
                take_tensor(h + expert_blob_at(lo, l, j, ab), &st, st_find(&st, nm), p, nm, ab ? lo->eout[j] : er,
                            ab ? er : lo->ein[j], used);
            }
    for (int k = 0; k < st.n; k++)  // PEFT would not load a tensor of a module target_modules leaves out
        if (!used[k])
            die("%s: tensor %s is of no module that target_modules (or parameter that target_parameters) in %s selects", p,
                st.t[k].name, pc);
    free(used);
    upload_params(lo, h);
    free(h);
    st_close(&st);
    return lo;
}

// ----------------------------------------------------------------------------
// optimizer state for resume: params, Adam m and v in their own element type (sdt), plus the step

void lora_save_state(const LoRA *lo, const char *path) {
    const Backend *be = lo->be;
    size_t bytes = lo->n * dtype_size(lo->sdt);
    void *buf[3] = {mallocCheck(bytes), mallocCheck(bytes), mallocCheck(bytes)};
    be->download(buf[0], lo->params, bytes);
    be->download(buf[1], lo->m, bytes);
    be->download(buf[2], lo->v, bytes);
    STWrite t[3] = {
        {"params", lo->sdt, 1, {(int64_t)lo->n}, buf[0]},
        {"adam_m", lo->sdt, 1, {(int64_t)lo->n}, buf[1]},
        {"adam_v", lo->sdt, 1, {(int64_t)lo->n}, buf[2]},
    };
    char md[128];
    snprintf(md, sizeof md, "{\"step\":\"%d\",\"r\":\"%d\",\"order\":\"units\"}", lo->step, lo->r);
    st_write(path, t, 3, md);
    for (int i = 0; i < 3; i++) free(buf[i]);
}

// a blob of the earlier order (A then B, adapter by adapter in (layer, projection) order) into this one
static void from_member_order(const LoRA *lo, uint8_t *dst, const uint8_t *src) {
    size_t sd = dtype_size(lo->sdt), off = 0;
    for (int k = 0; k < lo->L * LIN_COUNT; k++) {
        int i = k % LIN_COUNT;
        if (!lo->A[k]) continue;
        for (int ab = 0; ab < 2; ab++) {
            size_t n = (size_t)lo->r * (ab ? lo->out[i] : lo->in[i]);
            memcpy(dst + blob_at(lo, k, ab) * sd, src + off * sd, n * sd);
            off += n;
        }
    }
}

void lora_load_state(LoRA *lo, const char *path) {
    const Backend *be = lo->be;
    SafeTensors st;
    st_open(&st, path);
    const char *nm[3] = {"params", "adam_m", "adam_v"};
    void *dst[3] = {lo->params, lo->m, lo->v};
    char order[16];  // "units" (lora_layout's); none: a checkpoint of an earlier build, adapter by adapter
    int units = st_metadata_str(&st, "order", order, sizeof order) >= 0;
    if (units && strcmp(order, "units")) die("%s: unknown order \"%s\" of the LoRA state", path, order);
    for (int i = 0; i < 3; i++) {
        const STensor *t = st_find(&st, nm[i]);
        if (!t || t->dtype != lo->sdt || (size_t)t->numel != lo->n)
            die("%s: %s missing or not %zu %s values: the checkpoint was made with other LoRA settings", path, nm[i],
                lo->n, dtype_name(lo->sdt));
        if (units) {
            be->upload(dst[i], t->data, t->nbytes);
            continue;
        }
        uint8_t *h = (uint8_t *)mallocCheck(t->nbytes);
        from_member_order(lo, h, (const uint8_t *)t->data);
        be->upload(dst[i], h, t->nbytes);
        free(h);
    }
    lo->step = st_metadata_int(&st, "step", path);  // the step lives in the header's metadata
    st_close(&st);
    lo->act_valid = 0;
}

// ----------------------------------------------------------------------------
// the base an adapter was trained on

void lora_check_base(const char *adapter_dir, const char *model_dir, int allow_other) {
    char p[4096], want[64], have[17], base[512] = "";
    path_join(p, sizeof p, adapter_dir, "adapter_model.safetensors");
    char pc[4096];
    path_join(pc, sizeof pc, adapter_dir, "adapter_config.json");
    if (!file_exists(p) || !file_exists(pc)) return;  // not an adapter: lora_load_peft says so
    SafeTensors st;
    st_open(&st, p);
    int recorded = st_metadata_str(&st, "base_model_fingerprint", want, sizeof want) == 0;
    st_close(&st);
    if (!recorded) return;  // an adapter made elsewhere (peft): nothing to compare
    st_dir_fingerprint(model_dir, have);
    if (!strcmp(want, have)) return;
    {  // the base's path as training saw it, for the message
        char *text = read_file(pc, NULL);
        cJSON *r = cJSON_Parse(text), *b = r ? cJSON_GetObjectItemCaseSensitive(r, "base_model_name_or_path") : NULL;
        if (cJSON_IsString(b)) snprintf(base, sizeof base, "%s, ", b->valuestring);
        cJSON_Delete(r);
        free(text);
    }
    if (allow_other)
        fprintf(stderr, "warning: %s was trained on another base (%sweights %s) than %s (weights %s): applied anyway "
                "(--allow_other_base)\n", adapter_dir, base, want, model_dir, have);
    else
        die("%s was trained on another base (%sweights %s) than %s (weights %s): give the model it was trained on, or "
            "--allow_other_base to apply it anyway", adapter_dir, base, want, model_dir, have);
}

const char *lora_base_dir(const char *adapter_dir) {
    static char base[PATH_MAX + 4200];  // room for a parent of the adapter and the relative path
    char p[4096];
    path_join(p, sizeof p, adapter_dir, "adapter_config.json");
    if (!file_exists(p)) die("%s: no adapter_config.json (expected a PEFT LoRA adapter directory)", adapter_dir);
    char *text = read_file(p, NULL);
    cJSON *r = cJSON_Parse(text), *b = r ? cJSON_GetObjectItemCaseSensitive(r, "base_model_name_or_path") : NULL;
    free(text);
    int ok = cJSON_IsString(b) && b->valuestring[0];
    if (ok) snprintf(base, sizeof base, "%s", b->valuestring);
    cJSON_Delete(r);
    if (!ok) die("%s names no base_model_name_or_path: give --model", p);
    char cfg[4200];
    path_join(cfg, sizeof cfg, base, "config.json");
    if (file_exists(cfg)) return base;
    // A relative path is relative to where the training run started (adapters of earlier versions,
    // or written so by hand): the adapter's directory lies below that, so each of its parents is tried,
    // nearest first. The weights' fingerprint (lora_check_base) then says whether it is the base.
    char up[PATH_MAX], rel[4096];
    snprintf(rel, sizeof rel, "%.4000s", base);
    if (rel[0] != '/' && realpath(adapter_dir, up))
        for (char *slash = strrchr(up, '/'); slash; slash = strrchr(up, '/')) {
            *slash = 0;
            char cand[PATH_MAX + 4200];
            snprintf(cand, sizeof cand, "%s/%s/config.json", up, rel);
            if (file_exists(cand)) {
                snprintf(base, sizeof base, "%s/%s", up, rel);
                return base;
            }
        }
    die("%s's base %s is not a checkpoint directory here%s: give --model", adapter_dir, rel,
        rel[0] != '/' ? " nor beside any directory above the adapter" : "");
}
