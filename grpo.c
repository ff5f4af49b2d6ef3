// grpo.c: GRPO on the host, in double precision. Defines the config (TRL's
// GRPOConfig names and defaults) and its string parser, group advantages, the
// clipped-surrogate loss with KL, GSPO and truncated importance sampling, and its
// gradient with respect to each per-token log-probability. Depends on core/common.h only.
// See grpo.h for the API.
//
// TRL version followed: the 0.2x GRPOTrainer (read at v0.25+ where
// vllm_importance_sampling_mode exists; config defaults from that grpo_config.py):
//   advantages      = (r - mean_group(r)) / (std + 1e-4), std = torch.std (Bessel)
//   ratio           = exp(logp - old_logp)                       (token level)
//                   = exp(sum_t m_t (logp - old_logp) / max(1, sum_t m_t))  (sequence level, GSPO)
//   per_token_loss  = -min(ratio * A, clamp(ratio, 1 - eps, 1 + eps_high) * A)
//                     * is_weight                                (no gradient through is_weight)
//                     + beta * (exp(ref - logp) - (ref - logp) - 1)          (k3)
//   loss            = grpo:    mean_b( sum_t m pl / max(1, sum_t m) )
//                     bnpo:    sum m pl / max(1, sum m)
//                     dr_grpo: sum m pl / (B * max_completion_length)
//                     dapo:    sum m pl / num_items_in_batch
//   is_weight       = exp(old_logp - sampling_logp), per token or summed over the sequence,
//                     then min(w, cap) (truncate) or w > cap ? 0 : w (mask)
// The gradient is derived by hand below and checked against autograd
// (dev/grpo_reference.py) and against finite differences (test/test_grpo.c).
//
// Where this file departs from TRL, on purpose:
//  - Normalizers come from the whole optimizer-step batch (grpo_prepare), not from
//    each micro-batch, so micro-batching (a memory detail here) never changes the
//    loss. TRL's grpo and dr_grpo agree exactly when micro-batches are equal in
//    size; TRL's bnpo normalizes per micro-batch ("local batch"), so ours equals
//    TRL's bnpo with gradient_accumulation_steps = 1.
//  - Metrics average over the whole step's tokens (TRL averages per-micro-batch means).
//  - NaN safety: values at mask == 0 never enter arithmetic; the policy and KL
//    log-ratios of active tokens are clamped to [-20, 20] (gradient 0 outside,
//    like torch.clamp). e^20 ~ 5e8: a ratio that large means the step is already
//    broken; the clamp keeps loss and gradient finite so the caller's NaN/norm
//    check can say so, instead of inf poisoning every LoRA weight. Inside the
//    range the numbers are exactly TRL's. The dapo normalizer is clamped to >= 1
//    (TRL divides by 0 when a batch has no completion tokens). NaN in an active
//    token's inputs is passed through (not hidden), so the caller's NaN check fires.
#include "grpo.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

#define LOGRATIO_CLAMP 20.0

// ----------------------------------------------------------------------------
// config

GrpoConfig grpo_config_default(void) {
    GrpoConfig c;
    memset(&c, 0, sizeof c);
    c.num_generations = 8;
    c.num_iterations = 1;
    c.max_completion_length = 256;
    c.beta = 0.0;
    c.epsilon = 0.2;
    c.epsilon_high = -1.0;  // None: same as epsilon
    c.loss_type = LOSS_DAPO;
    c.scale_rewards = SCALE_GROUP;
    c.advantage_estimator = ADV_GRPO;
    c.importance_sampling_level = IS_LEVEL_TOKEN;
    c.mask_truncated_completions = 0;
    c.vllm_importance_sampling_correction = 1;
    c.vllm_importance_sampling_mode = VIS_SEQUENCE_MASK;
    c.vllm_importance_sampling_cap = 3.0;
    c.num_reward_weights = 0;
    for (int i = 0; i < GRPO_MAX_REWARDS; i++) c.reward_weights[i] = 1.0;
    return c;
}

double grpo_epsilon_high(const GrpoConfig *cfg) { return cfg->epsilon_high < 0 ? cfg->epsilon : cfg->epsilon_high; }

static const char *LOSS_NAMES[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
static const char *SCALE_NAMES[] = {"group", "batch", "none"};
static const char *ADV_NAMES[] = {"grpo", "rloo"};
static const char *LEVEL_NAMES[] = {"token", "sequence"};
static const char *VIS_NAMES[] = {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask"};

const char *grpo_loss_type_name(GrpoLossType t) { return (unsigned)t < 4 ? LOSS_NAMES[t] : "?"; }
const char *grpo_scale_rewards_name(GrpoScaleRewards s) { return (unsigned)s < 3 ? SCALE_NAMES[s] : "?"; }
const char *grpo_advantage_estimator_name(GrpoAdvantageEstimator a) { return (unsigned)a < 2 ? ADV_NAMES[a] : "?"; }
const char *grpo_is_level_name(GrpoImportanceLevel l) { return (unsigned)l < 2 ? LEVEL_NAMES[l] : "?"; }
const char *grpo_vllm_is_mode_name(GrpoVllmISMode m) { return (unsigned)m < 4 ? VIS_NAMES[m] : "?"; }


// index of value in names[0..n), or -1
static int lookup(const char *value, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(value, names[i])) return i;
    return -1;
}

static int parse_double(const char *key, const char *v, double *out, char *err, size_t cap) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    while (isspace((unsigned char)*end)) end++;
    if (end == v || *end || errno == ERANGE || !isfinite(x))
        return error_msg(err, cap, "%s: '%s' is not a number", key, v);
    *out = x;
    return 0;
}
static int parse_int(const char *key, const char *v, int *out, char *err, size_t cap) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (end == v || *end || errno == ERANGE || x < -2147483647L || x > 2147483647L)
        return error_msg(err, cap, "%s: '%s' is not an integer", key, v);
    *out = (int)x;
    return 0;
}
static int parse_bool(const char *key, const char *v, int *out, char *err, size_t cap) {
    static const char *yes[] = {"1", "true", "True", "yes", "on"}, *no[] = {"0", "false", "False", "no", "off"};
    if (lookup(v, yes, 5) >= 0) { *out = 1; return 0; }
    if (lookup(v, no, 5) >= 0) { *out = 0; return 0; }
    return error_msg(err, cap, "%s: '%s' is not a boolean: use true or false", key, v);
}

int grpo_config_set(GrpoConfig *c, const char *key_in, const char *v, char *err, size_t cap) {
    char key[64];
    while (*key_in == '-') key_in++;
    size_t n = strlen(key_in);
    if (n >= sizeof key) return 1;
    for (size_t i = 0; i <= n; i++) key[i] = key_in[i] == '-' ? '_' : key_in[i];
    if (!v) return error_msg(err, cap, "%s needs a value", key);
    int i;
    if (!strcmp(key, "num_generations")) {
        if (parse_int(key, v, &c->num_generations, err, cap)) return -1;
        if (c->num_generations < 1) return error_msg(err, cap, "num_generations must be >= 1 (got %s)", v);
    } else if (!strcmp(key, "num_iterations")) {
        if (parse_int(key, v, &c->num_iterations, err, cap)) return -1;
        if (c->num_iterations < 1) return error_msg(err, cap, "num_iterations must be >= 1 (got %s)", v);
    } else if (!strcmp(key, "max_completion_length")) {
        if (parse_int(key, v, &c->max_completion_length, err, cap)) return -1;
        if (c->max_completion_length < 1) return error_msg(err, cap, "max_completion_length must be >= 1 (got %s)", v);
    } else if (!strcmp(key, "beta")) {
        if (parse_double(key, v, &c->beta, err, cap)) return -1;
        if (c->beta < 0) return error_msg(err, cap, "beta must be >= 0 (got %s)", v);
    } else if (!strcmp(key, "epsilon")) {
        if (parse_double(key, v, &c->epsilon, err, cap)) return -1;
        if (c->epsilon < 0 || c->epsilon >= 1) return error_msg(err, cap, "epsilon must be in [0, 1) (got %s)", v);
    } else if (!strcmp(key, "epsilon_high")) {
        if (!strcmp(v, "none") || !strcmp(v, "None")) { c->epsilon_high = -1; return 0; }
        if (parse_double(key, v, &c->epsilon_high, err, cap)) return -1;
        if (c->epsilon_high < 0) return error_msg(err, cap, "epsilon_high must be >= 0 (got %s)", v);
    } else if (!strcmp(key, "loss_type")) {
        if ((i = lookup(v, LOSS_NAMES, 4)) < 0)
            return error_msg(err, cap, "unknown loss_type '%s': use grpo, bnpo, dr_grpo or dapo", v);
        c->loss_type = (GrpoLossType)i;
    } else if (!strcmp(key, "scale_rewards")) {
        // TRL also takes booleans: True = group, False = none
        if (!strcmp(v, "true") || !strcmp(v, "True")) i = SCALE_GROUP;
        else if (!strcmp(v, "false") || !strcmp(v, "False")) i = SCALE_NONE;
        else if ((i = lookup(v, SCALE_NAMES, 3)) < 0)
            return error_msg(err, cap, "unknown scale_rewards '%s': use group, batch or none", v);
        c->scale_rewards = (GrpoScaleRewards)i;
    } else if (!strcmp(key, "advantage_estimator")) {
        if ((i = lookup(v, ADV_NAMES, 2)) < 0)
            return error_msg(err, cap, "unknown advantage_estimator '%s': use grpo (the group's mean as baseline) or rloo "
                                       "(the mean of the group's others)", v);
        c->advantage_estimator = (GrpoAdvantageEstimator)i;
    } else if (!strcmp(key, "importance_sampling_level")) {
        if ((i = lookup(v, LEVEL_NAMES, 2)) < 0)
            return error_msg(err, cap, "unknown importance_sampling_level '%s': use token or sequence (GSPO)", v);
        c->importance_sampling_level = (GrpoImportanceLevel)i;
    } else if (!strcmp(key, "mask_truncated_completions")) {
        return parse_bool(key, v, &c->mask_truncated_completions, err, cap);
    } else if (!strcmp(key, "vllm_importance_sampling_correction")) {
        return parse_bool(key, v, &c->vllm_importance_sampling_correction, err, cap);
    } else if (!strcmp(key, "vllm_importance_sampling_mode")) {
        if ((i = lookup(v, VIS_NAMES, 4)) < 0)
            return error_msg(err, cap,
                        "unknown vllm_importance_sampling_mode '%s': use token_truncate, token_mask, "
                        "sequence_truncate or sequence_mask", v);
        c->vllm_importance_sampling_mode = (GrpoVllmISMode)i;
    } else if (!strcmp(key, "vllm_importance_sampling_cap")) {
        if (parse_double(key, v, &c->vllm_importance_sampling_cap, err, cap)) return -1;
        if (c->vllm_importance_sampling_cap <= 0)
            return error_msg(err, cap, "vllm_importance_sampling_cap must be > 0 (got %s)", v);
    } else if (!strcmp(key, "reward_weights")) {
        // comma-separated list, e.g. "1.0,0.2"; none (TRL's None): each reward function's own weight
        if (!strcmp(v, "none") || !strcmp(v, "None")) { c->num_reward_weights = 0; return 0; }
        int k = 0;
        const char *p = v;
        while (1) {
            if (k == GRPO_MAX_REWARDS) return error_msg(err, cap, "reward_weights: more than %d values", GRPO_MAX_REWARDS);
            char item[64];
            size_t len = strcspn(p, ",");
            if (len == 0 || len >= sizeof item) return error_msg(err, cap, "reward_weights: '%s' is not a comma-separated list of numbers", v);
            memcpy(item, p, len);
            item[len] = 0;
            if (parse_double("reward_weights", item, &c->reward_weights[k], err, cap)) return -1;
            k++;
            if (!p[len]) break;
            p += len + 1;
        }
        c->num_reward_weights = k;
    } else {
        return 1;
    }
    return 0;
}

// %g when it reads back as the same double, else all 17 digits
static void put_double(char *buf, size_t cap, double x) {
    snprintf(buf, cap, "%g", x);
    if (strtod(buf, NULL) != x) snprintf(buf, cap, "%.17g", x);
}

int grpo_config_get(const GrpoConfig *c, const char *key_in, char *buf, size_t cap) {
    char key[64];
    while (*key_in == '-') key_in++;
    size_t n = strlen(key_in);
    if (n >= sizeof key || !cap) return 1;
    for (size_t i = 0; i <= n; i++) key[i] = key_in[i] == '-' ? '_' : key_in[i];
    const char *s = NULL;
    if (!strcmp(key, "num_generations")) snprintf(buf, cap, "%d", c->num_generations);
    else if (!strcmp(key, "num_iterations")) snprintf(buf, cap, "%d", c->num_iterations);
    else if (!strcmp(key, "max_completion_length")) snprintf(buf, cap, "%d", c->max_completion_length);
    else if (!strcmp(key, "beta")) put_double(buf, cap, c->beta);
    else if (!strcmp(key, "epsilon")) put_double(buf, cap, c->epsilon);
    else if (!strcmp(key, "epsilon_high")) {
        if (c->epsilon_high < 0) s = "none";
        else put_double(buf, cap, c->epsilon_high);
    } else if (!strcmp(key, "loss_type")) s = grpo_loss_type_name(c->loss_type);
    else if (!strcmp(key, "scale_rewards")) s = grpo_scale_rewards_name(c->scale_rewards);
    else if (!strcmp(key, "advantage_estimator")) s = grpo_advantage_estimator_name(c->advantage_estimator);
    else if (!strcmp(key, "importance_sampling_level")) s = grpo_is_level_name(c->importance_sampling_level);
    else if (!strcmp(key, "mask_truncated_completions")) s = c->mask_truncated_completions ? "true" : "false";
    else if (!strcmp(key, "vllm_importance_sampling_correction")) s = c->vllm_importance_sampling_correction ? "true" : "false";
    else if (!strcmp(key, "vllm_importance_sampling_mode")) s = grpo_vllm_is_mode_name(c->vllm_importance_sampling_mode);
    else if (!strcmp(key, "vllm_importance_sampling_cap")) put_double(buf, cap, c->vllm_importance_sampling_cap);
    else if (!strcmp(key, "reward_weights")) {
        if (!c->num_reward_weights) s = "none";
        buf[0] = 0;
        for (int i = 0; i < c->num_reward_weights; i++) {
            size_t l = strlen(buf);
            if (i && l + 1 < cap) buf[l++] = ',', buf[l] = 0;
            put_double(buf + l, cap - l, c->reward_weights[i]);
        }
    } else return 1;
    if (s) snprintf(buf, cap, "%s", s);
    return 0;
}

int grpo_config_check(const GrpoConfig *c, char *err, size_t cap) {
    if (c->num_generations < 2)
        return error_msg(err, cap, "num_generations is %d: GRPO compares completions of the same prompt, use >= 2", c->num_generations);
    if (c->max_completion_length < 1) return error_msg(err, cap, "max_completion_length must be >= 1");
    if (c->epsilon < 0 || c->epsilon >= 1) return error_msg(err, cap, "epsilon must be in [0, 1) (got %g)", c->epsilon);
    if (!(c->beta >= 0)) return error_msg(err, cap, "beta must be >= 0 (got %g)", c->beta);
    if (!(c->vllm_importance_sampling_cap > 0))
        return error_msg(err, cap, "vllm_importance_sampling_cap must be > 0 (got %g)", c->vllm_importance_sampling_cap);
    if ((unsigned)c->loss_type > LOSS_DAPO || (unsigned)c->scale_rewards > SCALE_NONE || (unsigned)c->advantage_estimator > ADV_RLOO ||
        (unsigned)c->importance_sampling_level > IS_LEVEL_SEQUENCE || (unsigned)c->vllm_importance_sampling_mode > VIS_SEQUENCE_MASK)
        return error_msg(err, cap, "GrpoConfig has an out-of-range enum value (set it with grpo_config_set)");
    return 0;
}

void grpo_config_print(const GrpoConfig *c, FILE *f) {
    fprintf(f, "num_generations = %d\nnum_iterations = %d\nmax_completion_length = %d\n", c->num_generations,
            c->num_iterations, c->max_completion_length);
    fprintf(f, "beta = %g\nepsilon = %g\nepsilon_high = %g\n", c->beta, c->epsilon, grpo_epsilon_high(c));
    fprintf(f, "loss_type = %s\nscale_rewards = %s\nadvantage_estimator = %s\nimportance_sampling_level = %s\n",
            grpo_loss_type_name(c->loss_type), grpo_scale_rewards_name(c->scale_rewards),
            grpo_advantage_estimator_name(c->advantage_estimator), grpo_is_level_name(c->importance_sampling_level));
    fprintf(f, "mask_truncated_completions = %s\n", c->mask_truncated_completions ? "true" : "false");
    fprintf(f, "vllm_importance_sampling_correction = %s\nvllm_importance_sampling_mode = %s\nvllm_importance_sampling_cap = %g\n",
            c->vllm_importance_sampling_correction ? "true" : "false", grpo_vllm_is_mode_name(c->vllm_importance_sampling_mode),
            c->vllm_importance_sampling_cap);
    fprintf(f, "reward_weights = ");
    if (!c->num_reward_weights) fprintf(f, "(each reward function's default)");
    for (int i = 0; i < c->num_reward_weights; i++) fprintf(f, "%s%g", i ? "," : "", c->reward_weights[i]);
    fprintf(f, "\n");
}

int grpo_resolve_reward_weights(const GrpoConfig *cfg, int R, const double *defaults, const char *const *names,
                                double *out, char *err, size_t cap) {
    if (R > GRPO_MAX_REWARDS) return error_msg(err, cap, "%d reward functions: at most %d are supported", R, GRPO_MAX_REWARDS);
    if (cfg->num_reward_weights == 0) {
        for (int r = 0; r < R; r++) out[r] = defaults ? defaults[r] : 1.0;
        return 0;
    }
    if (cfg->num_reward_weights != R) {
        char list[256] = "";
        for (int r = 0; r < R && names; r++) {
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%s", r ? ", " : "", names[r]);
        }
        return error_msg(err, cap, "reward_weights has %d values but there are %d reward functions (%s)", cfg->num_reward_weights, R,
                    list);
    }
    for (int r = 0; r < R; r++) out[r] = cfg->reward_weights[r];
    return 0;
}

// ----------------------------------------------------------------------------
// advantages

// torch.std: Bessel-corrected; TRL uses 0 for a single element
static double std_bessel(const double *x, int n) {
    if (n < 2) return 0.0;
    double m = 0, s = 0;
    for (int i = 0; i < n; i++) m += x[i];
    m /= n;
    for (int i = 0; i < n; i++) s += (x[i] - m) * (x[i] - m);
    return sqrt(s / (n - 1));
}

void grpo_advantages(const GrpoConfig *cfg, int B, int R, const double *rewards, const double *weights, double *adv,
                     GrpoRewardMetrics *m) {
    int G = cfg->num_generations;
    if (G < 1 || B % G != 0) die("grpo_advantages: batch of %d sequences is not a multiple of num_generations=%d", B, G);
    if (R > GRPO_MAX_REWARDS) die("grpo_advantages: %d reward functions, at most %d", R, GRPO_MAX_REWARDS);
    double *r = (double *)mallocCheck((size_t)B * sizeof(double));
    double *sd = (double *)mallocCheck((size_t)B * sizeof(double));
    // weighted sum; NaN (not applicable) terms are skipped, as TRL's nansum
    for (int b = 0; b < B; b++) {
        double s = 0;
        for (int k = 0; k < R; k++) {
            double v = rewards[(size_t)b * R + k] * weights[k];
            if (!isnan(v)) s += v;
        }
        r[b] = s;
    }
    // a reward less its baseline: the group's mean (GRPO) or the mean of the group's others (RLOO);
    // the scale is per-group, whole-batch or none
    double batch_std = B > 1 ? std_bessel(r, B) : 0.0;
    for (int g = 0; g < B / G; g++) {
        double sum = 0;
        for (int i = 0; i < G; i++) sum += r[g * G + i];
        double mean = sum / G, gstd = std_bessel(r + g * G, G);
        for (int i = 0; i < G; i++) {
            int b = g * G + i;
            sd[b] = cfg->scale_rewards == SCALE_BATCH ? batch_std : gstd;  // "none" still logs the group std
            adv[b] = cfg->advantage_estimator == ADV_RLOO ? r[b] - (sum - r[b]) / (G - 1) : r[b] - mean;
            if (cfg->scale_rewards != SCALE_NONE) adv[b] /= sd[b] + 1e-4;
        }
    }
    if (m) {
        memset(m, 0, sizeof *m);
        m->R = R;
        double rs = 0, ss = 0, nz = 0;
        for (int b = 0; b < B; b++) {
            rs += r[b];
            ss += sd[b];
            nz += fabs(sd[b]) <= 1e-8;  // torch.isclose(std, 0): atol 1e-8
        }
        m->reward = rs / B;
        m->reward_std = ss / B;
        m->frac_reward_zero_std = nz / B;
        for (int k = 0; k < R; k++) {
            // TRL's nanmean / nanstd (Bessel over the non-NaN count)
            double s = 0, n = 0;
            for (int b = 0; b < B; b++) {
                double v = rewards[(size_t)b * R + k];
                if (!isnan(v)) { s += v; n++; }
            }
            double mean = n > 0 ? s / n : NAN, var = 0;
            for (int b = 0; b < B; b++) {
                double v = rewards[(size_t)b * R + k];
                if (!isnan(v)) var += (v - mean) * (v - mean);
            }
            m->func_mean[k] = mean;
            m->func_std[k] = n > 1 ? sqrt(var / (n - 1)) : NAN;
        }
    }
    free(r);
    free(sd);
}

// ----------------------------------------------------------------------------
// loss

static inline int seq_counts(const GrpoConfig *cfg, const uint8_t *trunc, int b) {
    return !(cfg->mask_truncated_completions && trunc && trunc[b]);
}

GrpoNorm grpo_prepare(const GrpoConfig *cfg, int B, int T, const uint8_t *mask, const uint8_t *truncated) {
    GrpoNorm n = {B, T, 0, 0};
    for (int b = 0; b < B; b++) {
        double cnt = 0;
        for (int t = 0; t < T; t++) cnt += mask[(size_t)b * T + t] != 0;
        n.num_items_in_batch += cnt;  // TRL counts generated tokens before masking truncated ones
        if (seq_counts(cfg, truncated, b)) n.active_tokens += cnt;
    }
    return n;
}

void grpo_stats_init(GrpoStats *st) {
    memset(st, 0, sizeof *st);
    st->is_min = INFINITY;
    st->is_max = -INFINITY;
}

// clamp with the torch.clamp gradient: *inside = 1 when x is within [lo, hi]
static inline double clampg(double x, double lo, double hi, int *inside) {
    *inside = 1;
    if (x < lo) { *inside = 0; return lo; }
    if (x > hi) { *inside = 0; return hi; }
    return x;  // NaN passes through
}

// the IS weight for a (token or summed-sequence) log-difference old - sampling
static inline double is_weight(const GrpoConfig *cfg, double d) {
    double w = exp(d > 700.0 ? 700.0 : d);  // exp(700) is finite; only the comparison with cap matters beyond
    int mask_mode = cfg->vllm_importance_sampling_mode == VIS_TOKEN_MASK || cfg->vllm_importance_sampling_mode == VIS_SEQUENCE_MASK;
    double cap = cfg->vllm_importance_sampling_cap;
    if (mask_mode) return w > cap ? 0.0 : w;
    return w > cap ? cap : w;
}

// -min(r A, clip(r) A) and its derivative with respect to log r. Inside the clip
// range clip(r) == r, the two terms tie and torch.minimum splits the gradient:
// half through r A, half through clip(r) A (clamp passes it inside): r A in all.
// Outside, only the unclipped term carries a gradient, and only when it is the min.
static inline double surrogate(double r, double A, double lo, double hi, double *dlr) {
    double l1 = r * A, c = r < lo ? lo : (r > hi ? hi : r), l2 = c * A;
    *dlr = l1 <= l2 ? -A * r : 0.0;
    return -(l1 < l2 ? l1 : l2);
}

double grpo_loss(const GrpoConfig *cfg, const GrpoNorm *norm, const GrpoInputs *in, int nb, double *dlogp, GrpoStats *st) {
    const int T = norm->T;
    const double lo = 1.0 - cfg->epsilon, hi = 1.0 + grpo_epsilon_high(cfg), beta = cfg->beta;
    if (beta != 0 && !in->ref_logp) die("grpo_loss: beta = %g needs ref_logp (the reference model's log-probabilities, LoRA off)", beta);
    const int use_is = cfg->vllm_importance_sampling_correction && in->sampling_logp != NULL;
    const int seq_is = cfg->vllm_importance_sampling_mode == VIS_SEQUENCE_TRUNCATE || cfg->vllm_importance_sampling_mode == VIS_SEQUENCE_MASK;
    const int gspo = cfg->importance_sampling_level == IS_LEVEL_SEQUENCE;
    double *w = (double *)mallocCheck((size_t)T * sizeof(double));   // IS weight per token of one sequence
    double *lr = (double *)mallocCheck((size_t)T * sizeof(double));  // clamped log-ratio
    int *lr_in = (int *)mallocCheck((size_t)T * sizeof(int));        // 1 where the clamp passes the gradient
    double total = 0;
    if (st) {
        st->has_is |= use_is;
        st->has_kl |= in->ref_logp != NULL;
    }

    for (int b = 0; b < nb; b++) {
        const size_t row = (size_t)b * T;
        const uint8_t *m = in->mask + row;
        const double *lp = in->logp + row;
        const double *old = in->old_logp ? in->old_logp + row : lp;  // NULL: logp.detach()
        const int counts = seq_counts(cfg, in->truncated, b);
        double *g = dlogp + row;
        int n = 0;
        for (int t = 0; t < T; t++) {
            g[t] = 0;
            n += counts && m[t];
        }
        // per-token aggregation weight of this sequence
        double coef;
        switch (cfg->loss_type) {
        case LOSS_GRPO: coef = 1.0 / ((double)norm->B * (n > 1 ? n : 1)); break;
        case LOSS_BNPO: coef = 1.0 / (norm->active_tokens > 1 ? norm->active_tokens : 1); break;
        case LOSS_DR_GRPO: coef = 1.0 / ((double)norm->B * cfg->max_completion_length); break;
        default: coef = 1.0 / (norm->num_items_in_batch > 1 ? norm->num_items_in_batch : 1); break;
        }
        const double A = in->advantages[b];

        // importance-sampling weights between the trainer (old) and the rollout engine (sampling)
        double dsum = 0;
        for (int t = 0; t < T; t++) {
            w[t] = 1.0;
            if (!use_is || !counts || !m[t]) continue;
            double d = old[t] - in->sampling_logp[row + t];
            dsum += d;
            if (!seq_is) w[t] = is_weight(cfg, d);
            if (st) {
                double ad = fabs(d);
                st->delta_sum += ad;
                st->delta_n += 1;
                if (ad > st->delta_max) st->delta_max = ad;
                if (!seq_is) {
                    st->is_sum += w[t];
                    st->is_n += 1;
                    if (w[t] < st->is_min) st->is_min = w[t];
                    if (w[t] > st->is_max) st->is_max = w[t];
                }
            }
        }
        if (use_is && seq_is) {
            double ws = is_weight(cfg, dsum);  // a fully masked sequence sums to 0: weight 1, as TRL
            for (int t = 0; t < T; t++) w[t] = ws;
            if (st) {  // TRL: sequence modes take statistics over all sequences
                st->is_sum += ws;
                st->is_n += 1;
                if (ws < st->is_min) st->is_min = ws;
                if (ws > st->is_max) st->is_max = ws;
            }
        }

        // policy log-ratios
        double lr_mean = 0;
        for (int t = 0; t < T; t++) {
            lr[t] = 0;
            lr_in[t] = 0;
            if (!counts || !m[t]) continue;
            lr[t] = in->old_logp ? clampg(lp[t] - old[t], -LOGRATIO_CLAMP, LOGRATIO_CLAMP, &lr_in[t]) : 0.0;
            if (!in->old_logp) lr_in[t] = 1;
            lr_mean += lr[t];
        }
        lr_mean /= n > 1 ? n : 1;

        double seq_loss = 0;
        if (gspo) {
            // one ratio per sequence: exp(mean log-ratio), broadcast to its tokens
            double r = exp(lr_mean), dlr;
            double s = surrogate(r, A, lo, hi, &dlr);
            double wsum = 0;
            for (int t = 0; t < T; t++)
                if (counts && m[t]) {
                    seq_loss += w[t] * s;
                    wsum += w[t];
                }
            // d/dlogp_t of sum_t' w_t' S(mean lr) = (sum w) S'(.) / n (through the clamp)
            double gs = coef * wsum * dlr / (n > 1 ? n : 1);
            for (int t = 0; t < T; t++)
                if (counts && m[t]) g[t] = gs * lr_in[t];
            if (st) {
                st->clip_n += 1;  // TRL: x.mean() over sequences, masked ones included
                int low = r < lo && A < 0, high = r > hi && A > 0;
                st->clip_low += low;
                st->clip_high += high;
                st->clip_region += low || high;
            }
        } else {
            for (int t = 0; t < T; t++) {
                if (!counts || !m[t]) continue;
                double r = exp(lr[t]), dlr;
                double s = surrogate(r, A, lo, hi, &dlr);
                seq_loss += w[t] * s;
                g[t] = coef * w[t] * dlr * lr_in[t];
                if (st) {
                    st->clip_n += 1;
                    int low = r < lo && A < 0, high = r > hi && A > 0;
                    st->clip_low += low;
                    st->clip_high += high;
                    st->clip_region += low || high;
                }
            }
        }

        // KL to the reference, k3 = exp(x) - x - 1 with x = ref - logp; dk3/dlogp = 1 - exp(x)
        if (in->ref_logp) {
            const double *ref = in->ref_logp + row;
            for (int t = 0; t < T; t++) {
                if (!counts || !m[t]) continue;
                int inside;
                double x = clampg(ref[t] - lp[t], -LOGRATIO_CLAMP, LOGRATIO_CLAMP, &inside);
                double ex = exp(x), k3 = ex - x - 1.0;
                if (st) st->kl_sum += k3;
                if (beta != 0) {
                    seq_loss += beta * k3;
                    g[t] += coef * beta * (1.0 - ex) * inside;
                }
            }
        }
        total += coef * seq_loss;
        if (st) st->tokens += n;
    }
    if (st) st->loss += total;
    free(w);
    free(lr);
    free(lr_in);
    return total;
}

GrpoMetrics grpo_metrics(const GrpoStats *st) {
    GrpoMetrics m;
    double tok = st->tokens > 1 ? st->tokens : 1, cn = st->clip_n > 1 ? st->clip_n : 1;
    m.loss = st->loss;
    m.kl = st->has_kl ? st->kl_sum / tok : NAN;
    m.clip_low_mean = st->clip_low / cn;
    m.clip_high_mean = st->clip_high / cn;
    m.clip_region_mean = st->clip_region / cn;
    if (st->has_is) {  // TRL logs 0 for an empty selection
        m.sampling_logp_diff_mean = st->delta_n > 0 ? st->delta_sum / st->delta_n : 0;
        m.sampling_logp_diff_max = st->delta_n > 0 ? st->delta_max : 0;
        m.is_ratio_min = st->is_n > 0 ? st->is_min : 0;
        m.is_ratio_mean = st->is_n > 0 ? st->is_sum / st->is_n : 0;
        m.is_ratio_max = st->is_n > 0 ? st->is_max : 0;
    } else {
        m.sampling_logp_diff_mean = m.sampling_logp_diff_max = NAN;
        m.is_ratio_min = m.is_ratio_mean = m.is_ratio_max = NAN;
    }
    return m;
}
