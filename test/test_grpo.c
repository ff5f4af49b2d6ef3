// test/test_grpo.c: Check suite for grpo.c. The loss, dL/dlogp, metrics and
// advantages against test/fixtures/grpo (TRL's formulas in torch float64 with
// autograd: dev/grpo_reference.py); the gradient against finite differences of
// grpo_loss itself; micro-batch equivalence; NaN safety; the option parser; the
// LR schedule and the clip factor.
//   gcc -std=c11 -D_GNU_SOURCE -O2 -I. -Itest test/test_grpo.c grpo.c -lcjson -lcheck -lsubunit -lm -lrt -lpthread -o /tmp/tg && /tmp/tg
// (run from the repo root: the fixtures are read from test/fixtures)
#include <check.h>

#include "grpo.h"
#include "testutil.h"
#include "train/optim.h"

// Tolerances. Fixture and C are both float64 evaluations of the same formulas;
// they differ only in summation order, ~1e-16 relative. 1e-11 leaves room for
// that and is 8+ orders of magnitude below any formula error (a wrong normalizer,
// sign or clip branch changes some value by more than 1e-6: see
// fixtures_discriminate).
#define TOL_FIX 1e-11

static int close_rel(double a, double b, double tol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return fabs(a - b) <= tol * (1.0 + fabs(b));
}

// ----------------------------------------------------------------------------
// fixtures

typedef struct {
    int B, T;
    double *logp, *old, *ref, *samp, *adv;
    uint8_t *mask, *trunc;
    Npy raw[7];
} Batch;

static Npy load(const char *name) {
    char p[512];
    fixture_path(p, sizeof p, name);
    return npy_read(p);
}

static Batch batch_load(void) {
    Batch b;
    memset(&b, 0, sizeof b);
    const char *names[7] = {"grpo/logp.npy", "grpo/old_logp.npy", "grpo/ref_logp.npy", "grpo/sampling_logp.npy",
                            "grpo/advantages.npy", "grpo/mask.npy", "grpo/truncated.npy"};
    for (int i = 0; i < 7; i++) b.raw[i] = load(names[i]);
    b.B = (int)b.raw[0].shape[0];
    b.T = (int)b.raw[0].shape[1];
    b.logp = b.raw[0].data, b.old = b.raw[1].data, b.ref = b.raw[2].data, b.samp = b.raw[3].data, b.adv = b.raw[4].data;
    b.mask = (uint8_t *)mallocCheck((size_t)b.B * b.T);
    b.trunc = (uint8_t *)mallocCheck((size_t)b.B);
    for (int i = 0; i < b.B * b.T; i++) b.mask[i] = b.raw[5].data[i] != 0;
    for (int i = 0; i < b.B; i++) b.trunc[i] = b.raw[6].data[i] != 0;
    return b;
}
static void batch_free(Batch *b) {
    for (int i = 0; i < 7; i++) npy_free(&b->raw[i]);
    free(b->mask);
    free(b->trunc);
}

typedef struct {
    char name[64];
    GrpoConfig cfg;
    int old, is;
} Case;

// test/fixtures/grpo/cases.txt: "name key=value ..." with TRL option names, set through grpo_config_set
static int cases_load(Case *cs, int cap) {
    char p[512], line[1024];
    fixture_path(p, sizeof p, "grpo/cases.txt");
    FILE *f = fopen(p, "r");
    ck_assert_msg(f != NULL, "cannot open %s: run from the repo root or regenerate with dev/grpo_reference.py", p);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        ck_assert_int_lt(n, cap);
        Case *c = &cs[n++];
        c->cfg = grpo_config_default();
        c->old = 1, c->is = 0;
        char *save, *tok = strtok_r(line, " \n", &save);
        snprintf(c->name, sizeof c->name, "%s", tok);
        while ((tok = strtok_r(NULL, " \n", &save))) {
            char *eq = strchr(tok, '=');
            ck_assert_msg(eq != NULL, "bad token %s in cases.txt", tok);
            *eq = 0;
            if (!strcmp(tok, "old")) c->old = atoi(eq + 1);
            else if (!strcmp(tok, "is")) c->is = atoi(eq + 1);
            else {
                char err[256];
                int rc = grpo_config_set(&c->cfg, tok, eq + 1, err, sizeof err);
                ck_assert_msg(rc == 0, "case %s: %s=%s: rc %d %s", c->name, tok, eq + 1, rc, rc < 0 ? err : "");
            }
        }
    }
    fclose(f);
    return n;
}

static GrpoInputs inputs_at(const Batch *b, const Case *c, int b0) {
    size_t o = (size_t)b0 * b->T;
    GrpoInputs in = {b->logp + o, c->old ? b->old + o : NULL, b->ref + o, c->is ? b->samp + o : NULL,
                     b->adv + b0, b->mask + o, b->trunc + b0};
    return in;
}

static double metric_of(const GrpoMetrics *m, int k) {
    double v[10] = {m->loss, m->kl, m->clip_low_mean, m->clip_high_mean, m->clip_region_mean, m->is_ratio_min,
                    m->is_ratio_mean, m->is_ratio_max, m->sampling_logp_diff_mean, m->sampling_logp_diff_max};
    return v[k];
}
static const char *METRIC_NAMES[10] = {"loss", "kl", "clip_low", "clip_high", "clip_region",
                                       "is_min", "is_mean", "is_max", "delta_mean", "delta_max"};

// ----------------------------------------------------------------------------
// config and parser

START_TEST(defaults_are_trls) {
    GrpoConfig c = grpo_config_default();
    ck_assert_int_eq(c.num_generations, 8);
    ck_assert_int_eq(c.num_iterations, 1);
    ck_assert_int_eq(c.max_completion_length, 256);
    ck_assert(c.beta == 0.0);
    ck_assert(c.epsilon == 0.2);
    ck_assert(grpo_epsilon_high(&c) == 0.2);  // None -> epsilon
    ck_assert_int_eq(c.loss_type, LOSS_DAPO);
    ck_assert_int_eq(c.scale_rewards, SCALE_GROUP);
    ck_assert_int_eq(c.importance_sampling_level, IS_LEVEL_TOKEN);
    ck_assert_int_eq(c.mask_truncated_completions, 0);
    ck_assert_int_eq(c.vllm_importance_sampling_correction, 1);
    ck_assert_int_eq(c.vllm_importance_sampling_mode, VIS_SEQUENCE_MASK);
    ck_assert(c.vllm_importance_sampling_cap == 3.0);
    char err[256];
    ck_assert_int_eq(grpo_config_check(&c, err, sizeof err), 0);
}
END_TEST

START_TEST(parser_accepts_and_rejects) {
    GrpoConfig c = grpo_config_default();
    char err[256];
    ck_assert_int_eq(grpo_config_set(&c, "loss_type", "bnpo", err, sizeof err), 0);
    ck_assert_int_eq(c.loss_type, LOSS_BNPO);
    ck_assert_int_eq(grpo_config_set(&c, "--loss-type", "dr_grpo", err, sizeof err), 0);
    ck_assert_int_eq(c.loss_type, LOSS_DR_GRPO);
    ck_assert_int_eq(grpo_config_set(&c, "loss_type", "x", err, sizeof err), -1);
    ck_assert_str_eq(err, "unknown loss_type 'x': use grpo, bnpo, dr_grpo or dapo");
    ck_assert_int_eq(grpo_config_set(&c, "scale_rewards", "false", err, sizeof err), 0);  // TRL's bool form
    ck_assert_int_eq(c.scale_rewards, SCALE_NONE);
    ck_assert_int_eq(grpo_config_set(&c, "scale_rewards", "batch", err, sizeof err), 0);
    ck_assert_int_eq(c.scale_rewards, SCALE_BATCH);
    ck_assert_int_eq(grpo_config_set(&c, "scale_rewards", "global", err, sizeof err), -1);
    ck_assert_str_eq(err, "unknown scale_rewards 'global': use group, batch or none");
    ck_assert_int_eq(grpo_config_set(&c, "importance_sampling_level", "sequence", err, sizeof err), 0);
    ck_assert_int_eq(c.importance_sampling_level, IS_LEVEL_SEQUENCE);
    ck_assert_int_eq(grpo_config_set(&c, "importance_sampling_level", "seq", err, sizeof err), -1);
    ck_assert_int_eq(grpo_config_set(&c, "vllm_importance_sampling_mode", "token_mask", err, sizeof err), 0);
    ck_assert_int_eq(c.vllm_importance_sampling_mode, VIS_TOKEN_MASK);
    ck_assert_int_eq(grpo_config_set(&c, "vllm_importance_sampling_mode", "token", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "token_truncate, token_mask, sequence_truncate or sequence_mask") != NULL, "%s", err);
    ck_assert_int_eq(grpo_config_set(&c, "beta", "0.04", err, sizeof err), 0);
    ck_assert(c.beta == 0.04);
    ck_assert_int_eq(grpo_config_set(&c, "beta", "abc", err, sizeof err), -1);
    ck_assert_str_eq(err, "beta: 'abc' is not a number");
    ck_assert_int_eq(grpo_config_set(&c, "beta", "-1", err, sizeof err), -1);
    ck_assert_int_eq(grpo_config_set(&c, "beta", "nan", err, sizeof err), -1);
    ck_assert_int_eq(grpo_config_set(&c, "epsilon_high", "0.28", err, sizeof err), 0);
    ck_assert(grpo_epsilon_high(&c) == 0.28);
    ck_assert_int_eq(grpo_config_set(&c, "epsilon_high", "None", err, sizeof err), 0);
    ck_assert(grpo_epsilon_high(&c) == c.epsilon);
    ck_assert_int_eq(grpo_config_set(&c, "epsilon", "1.5", err, sizeof err), -1);
    ck_assert_int_eq(grpo_config_set(&c, "num_generations", "4x", err, sizeof err), -1);
    ck_assert_str_eq(err, "num_generations: '4x' is not an integer");
    ck_assert_int_eq(grpo_config_set(&c, "mask_truncated_completions", "yes", err, sizeof err), 0);
    ck_assert_int_eq(c.mask_truncated_completions, 1);
    ck_assert_int_eq(grpo_config_set(&c, "mask_truncated_completions", "maybe", err, sizeof err), -1);
    ck_assert_str_eq(err, "mask_truncated_completions: 'maybe' is not a boolean: use true or false");
    ck_assert_int_eq(grpo_config_set(&c, "vllm_importance_sampling_cap", "0", err, sizeof err), -1);
    ck_assert_int_eq(grpo_config_set(&c, "reward_weights", "1.0,0.25", err, sizeof err), 0);
    ck_assert_int_eq(c.num_reward_weights, 2);
    ck_assert(c.reward_weights[1] == 0.25);
    ck_assert_int_eq(grpo_config_set(&c, "reward_weights", "1.0,,2", err, sizeof err), -1);
    ck_assert_int_eq(grpo_config_set(&c, "reward_weights", "1.0,x", err, sizeof err), -1);
    // not ours: 1, err untouched
    strcpy(err, "untouched");
    ck_assert_int_eq(grpo_config_set(&c, "learning_rate", "1e-5", err, sizeof err), 1);
    ck_assert_str_eq(err, "untouched");
    // cross-option check
    c = grpo_config_default();
    c.num_generations = 1;
    ck_assert_int_eq(grpo_config_check(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "num_generations is 1") != NULL, "%s", err);
}
END_TEST

// grpo_config_get is grpo_config_set's inverse: every option's text reads back to the same
// config (what --help shows as a default is what the parser would set)
START_TEST(get_reads_back_through_set) {
    static const char *names[] = {"num_generations", "num_iterations", "max_completion_length", "beta", "epsilon",
                                  "epsilon_high", "loss_type", "scale_rewards", "importance_sampling_level",
                                  "mask_truncated_completions", "vllm_importance_sampling_correction",
                                  "vllm_importance_sampling_mode", "vllm_importance_sampling_cap", "reward_weights",
                                  "advantage_estimator"};
    char err[256], buf[256];
    GrpoConfig d = grpo_config_default(), c = d;
    const char *want[] = {"8", "1", "256", "0", "0.2", "none", "dapo", "group", "token", "false", "true", "sequence_mask", "3", "none",
                          "grpo"};
    for (int i = 0; i < 15; i++) {
        ck_assert_int_eq(grpo_config_get(&d, names[i], buf, sizeof buf), 0);
        ck_assert_str_eq(buf, want[i]);
    }
    ck_assert_int_eq(grpo_config_get(&d, "no_such_option", buf, sizeof buf), 1);
    ck_assert_int_eq(grpo_config_get(&d, "max-completion-length", buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "256");
    // a config far from the defaults, through get then set into a fresh default config
    const char *set[][2] = {{"num_generations", "4"}, {"num_iterations", "3"}, {"beta", "0.04"}, {"epsilon", "0.1"},
                            {"epsilon_high", "0.28"}, {"loss_type", "dr_grpo"}, {"scale_rewards", "none"},
                            {"importance_sampling_level", "sequence"}, {"mask_truncated_completions", "true"},
                            {"vllm_importance_sampling_correction", "false"}, {"vllm_importance_sampling_mode", "token_truncate"},
                            {"vllm_importance_sampling_cap", "2.5"}, {"reward_weights", "1,0.1"}, {"max_completion_length", "17"},
                            {"advantage_estimator", "rloo"}};
    for (int i = 0; i < 15; i++) ck_assert_int_eq(grpo_config_set(&c, set[i][0], set[i][1], err, sizeof err), 0);
    c.beta = 1.0 / 3.0;  // not exact in %g: the text keeps all digits
    GrpoConfig r = grpo_config_default();
    for (int i = 0; i < 15; i++) {
        ck_assert_int_eq(grpo_config_get(&c, names[i], buf, sizeof buf), 0);
        ck_assert_msg(grpo_config_set(&r, names[i], buf, err, sizeof err) == 0, "%s '%s': %s", names[i], buf, err);
    }
    ck_assert_int_eq(memcmp(&r, &c, sizeof c), 0);
    ck_assert_int_eq(grpo_config_set(&r, "reward_weights", "none", err, sizeof err), 0);
    ck_assert_int_eq(r.num_reward_weights, 0);
}
END_TEST

START_TEST(reward_weights_resolve) {
    GrpoConfig c = grpo_config_default();
    const char *names[2] = {"correctness", "format"};
    double defaults[2] = {1.0, 0.2}, w[2];
    char err[256];
    ck_assert_int_eq(grpo_resolve_reward_weights(&c, 2, defaults, names, w, err, sizeof err), 0);
    ck_assert(w[0] == 1.0 && w[1] == 0.2);
    grpo_config_set(&c, "reward_weights", "0.5,3", err, sizeof err);
    ck_assert_int_eq(grpo_resolve_reward_weights(&c, 2, defaults, names, w, err, sizeof err), 0);
    ck_assert(w[0] == 0.5 && w[1] == 3.0);
    grpo_config_set(&c, "reward_weights", "1,2,3", err, sizeof err);
    ck_assert_int_eq(grpo_resolve_reward_weights(&c, 2, defaults, names, w, err, sizeof err), -1);
    ck_assert_str_eq(err, "reward_weights has 3 values but there are 2 reward functions (correctness, format)");
}
END_TEST

// ----------------------------------------------------------------------------
// advantages

START_TEST(advantages_match_fixture) {
    Npy rw = load("grpo/rewards.npy"), wt = load("grpo/reward_weights.npy");
    int B = (int)rw.shape[0], R = (int)rw.shape[1];
    const char *scales[3] = {"group", "batch", "none"};
    for (int s = 0; s < 3; s++) {
        GrpoConfig c = grpo_config_default();
        char err[256], name[64];
        ck_assert_int_eq(grpo_config_set(&c, "scale_rewards", scales[s], err, sizeof err), 0);
        ck_assert_int_eq(grpo_config_set(&c, "num_generations", "4", err, sizeof err), 0);
        double adv[64];
        GrpoRewardMetrics m;
        grpo_advantages(&c, B, R, rw.data, wt.data, adv, &m);
        snprintf(name, sizeof name, "grpo/adv_%s.npy", scales[s]);
        Npy want = load(name);
        for (int b = 0; b < B; b++)
            ck_assert_msg(close_rel(adv[b], want.data[b], TOL_FIX), "%s: adv[%d] %.15g want %.15g", scales[s], b, adv[b], want.data[b]);
        snprintf(name, sizeof name, "grpo/adv_%s_metrics.npy", scales[s]);
        Npy wm = load(name);
        double got[3 + 2 * GRPO_MAX_REWARDS] = {m.reward, m.reward_std, m.frac_reward_zero_std};
        for (int k = 0; k < R; k++) got[3 + 2 * k] = m.func_mean[k], got[4 + 2 * k] = m.func_std[k];
        for (int k = 0; k < 3 + 2 * R; k++)
            ck_assert_msg(close_rel(got[k], wm.data[k], TOL_FIX), "%s: metric %d %.15g want %.15g", scales[s], k, got[k], wm.data[k]);
        npy_free(&want);
        npy_free(&wm);
    }
    npy_free(&rw);
    npy_free(&wt);
}
END_TEST

// a case small enough to do by hand: rewards 1,0,0,0 in one group of 4
START_TEST(advantages_by_hand) {
    GrpoConfig c = grpo_config_default();
    c.num_generations = 4;
    double r[4] = {1, 0, 0, 0}, w = 1.0, adv[4];
    GrpoRewardMetrics m;
    grpo_advantages(&c, 4, 1, r, &w, adv, &m);
    // mean 0.25; Bessel std = sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    ck_assert(fabs(adv[0] - 0.75 / 0.5001) < 1e-15);
    ck_assert(fabs(adv[1] + 0.25 / 0.5001) < 1e-15);
    ck_assert(fabs(m.reward - 0.25) < 1e-15 && fabs(m.reward_std - 0.5) < 1e-15 && m.frac_reward_zero_std == 0);
    // all equal: advantages exactly 0, the whole group counts as zero-std
    double z[4] = {0.5, 0.5, 0.5, 0.5};
    grpo_advantages(&c, 4, 1, z, &w, adv, &m);
    for (int i = 0; i < 4; i++) ck_assert(adv[i] == 0.0);
    ck_assert(m.frac_reward_zero_std == 1.0);
    // weights multiply; a NaN reward is left out of the sum (TRL's None)
    double r2[8] = {1, 1, 0, NAN, 0, 0, 0, 0}, w2[2] = {2.0, 0.5};
    c.scale_rewards = SCALE_NONE;
    grpo_advantages(&c, 4, 2, r2, w2, adv, &m);
    // weighted sums: 2.5, 0, 0, 0 -> mean 0.625
    ck_assert(fabs(adv[0] - 1.875) < 1e-15 && fabs(adv[1] + 0.625) < 1e-15);
    ck_assert(fabs(m.func_mean[1] - 1.0 / 3.0) < 1e-15);  // nanmean over 3 values
}
END_TEST

// RLOO: each reward less the mean of its group's OTHER rewards. By hand, rewards 1, 0, 0, 1 in a
// group of 4: the 1s' baseline (1 + 0 + 0) / 3, advantage 2/3; the 0s' (1 + 0 + 1) / 3, advantage -2/3.
// In general r_i - (S - r_i) / (G - 1) = G / (G - 1) (r_i - S / G): the group-mean advantage scaled,
// which random groups check; with scale_rewards group the scale cancels up to the 1e-4 in the divisor.
START_TEST(advantages_rloo) {
    char err[256];
    GrpoConfig c = grpo_config_default();
    c.num_generations = 4;
    c.scale_rewards = SCALE_NONE;
    ck_assert_int_eq(grpo_config_set(&c, "advantage_estimator", "rloo", err, sizeof err), 0);
    double r[4] = {1, 0, 0, 1}, w = 1.0, adv[4];
    grpo_advantages(&c, 4, 1, r, &w, adv, NULL);
    for (int i = 0; i < 4; i++) ck_assert(fabs(adv[i] - (r[i] == 1 ? 2.0 / 3.0 : -2.0 / 3.0)) < 1e-15);
    Rng g = rng_make(5);
    enum { B = 24 };
    double x[B], a1[B], a2[B];
    for (int i = 0; i < B; i++) x[i] = rng_normal(&g);
    for (int G = 2; G <= 8; G *= 2) {
        GrpoConfig grpo = grpo_config_default(), rloo;
        grpo.num_generations = G;
        grpo.scale_rewards = SCALE_NONE;
        rloo = grpo;
        rloo.advantage_estimator = ADV_RLOO;
        grpo_advantages(&grpo, B, 1, x, &w, a1, NULL);
        grpo_advantages(&rloo, B, 1, x, &w, a2, NULL);
        for (int i = 0; i < B; i++) ck_assert(fabs(a2[i] - a1[i] * G / (G - 1)) < 1e-12);
    }
    ck_assert_int_eq(grpo_config_set(&c, "advantage_estimator", "loo", err, sizeof err), -1);
    ck_assert(strstr(err, "unknown advantage_estimator 'loo'"));
}
END_TEST

// ----------------------------------------------------------------------------
// loss against the fixture

START_TEST(loss_matches_fixture) {
    Batch bt = batch_load();
    Case cs[64];
    int n = cases_load(cs, 64);
    ck_assert_int_ge(n, 20);
    double *g = (double *)mallocCheck((size_t)bt.B * bt.T * sizeof(double));
    for (int i = 0; i < n; i++) {
        Case *c = &cs[i];
        c->cfg.num_generations = 4;
        GrpoNorm norm = grpo_prepare(&c->cfg, bt.B, bt.T, bt.mask, bt.trunc);
        GrpoStats st;
        grpo_stats_init(&st);
        GrpoInputs in = inputs_at(&bt, c, 0);
        double loss = grpo_loss(&c->cfg, &norm, &in, bt.B, g, &st);
        GrpoMetrics m = grpo_metrics(&st);
        char name[128];
        snprintf(name, sizeof name, "grpo/case_%.63s_dlogp.npy", c->name);
        Npy want = load(name);
        snprintf(name, sizeof name, "grpo/case_%.63s_metrics.npy", c->name);
        Npy wm = load(name);
        ck_assert_msg(close_rel(loss, wm.data[0], TOL_FIX), "%s: loss %.15g want %.15g", c->name, loss, wm.data[0]);
        for (int k = 0; k < bt.B * bt.T; k++)
            ck_assert_msg(close_rel(g[k], want.data[k], TOL_FIX), "%s: dlogp[%d,%d] %.15g want %.15g", c->name, k / bt.T,
                          k % bt.T, g[k], want.data[k]);
        for (int k = 0; k < 10; k++)
            ck_assert_msg(close_rel(metric_of(&m, k), wm.data[k], TOL_FIX), "%s: metric %s %.15g want %.15g", c->name,
                          METRIC_NAMES[k], metric_of(&m, k), wm.data[k]);
        npy_free(&want);
        npy_free(&wm);
    }
    free(g);
    batch_free(&bt);
}
END_TEST

// The comparison above can fail: the fixtures of different configurations differ
// by > 1e-6 in the loss or somewhere in the gradient, 5 orders of magnitude above TOL_FIX, so
// taking a wrong branch (normalizer, clip, IS mode, masking) would show.
START_TEST(fixtures_discriminate) {
    Case cs[64];
    int n = cases_load(cs, 64);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            // equal by design: IS switched off by its flag is plain dapo; without mask_truncated_completions
            // bnpo's and dapo's token counts coincide
            if (!strcmp(cs[j].name, "is_off_by_flag") || !strcmp(cs[i].name, "is_off_by_flag")) continue;
            if (!strcmp(cs[i].name, "bnpo") && !strcmp(cs[j].name, "dapo")) continue;
            char p[128];
            snprintf(p, sizeof p, "grpo/case_%.60s_dlogp.npy", cs[i].name);
            Npy a = load(p);
            snprintf(p, sizeof p, "grpo/case_%.60s_dlogp.npy", cs[j].name);
            Npy b = load(p);
            snprintf(p, sizeof p, "grpo/case_%.60s_metrics.npy", cs[i].name);
            Npy ma = load(p);
            snprintf(p, sizeof p, "grpo/case_%.60s_metrics.npy", cs[j].name);
            Npy mb = load(p);
            double d = fmax(max_abs_diff_d(a.data, b.data, a.n), fabs(ma.data[0] - mb.data[0]));
            ck_assert_msg(d > 1e-6, "%s and %s have the same loss and gradient", cs[i].name, cs[j].name);
            npy_free(&a);
            npy_free(&b);
            npy_free(&ma);
            npy_free(&mb);
        }
}
END_TEST

// ----------------------------------------------------------------------------
// micro-batches: same normalizers, whole sequences -> same loss and gradient

START_TEST(microbatches_equal_full_batch) {
    Batch bt = batch_load();
    Case cs[64];
    int n = cases_load(cs, 64);
    size_t BT = (size_t)bt.B * bt.T;
    double *gf = (double *)mallocCheck(BT * sizeof(double)), *gm = (double *)mallocCheck(BT * sizeof(double));
    const int splits[][4] = {{3, 1, 4, 0}, {1, 1, 1, 5}, {4, 4, 0, 0}};
    for (int i = 0; i < n; i++) {
        Case *c = &cs[i];
        c->cfg.num_generations = 4;
        GrpoNorm norm = grpo_prepare(&c->cfg, bt.B, bt.T, bt.mask, bt.trunc);
        GrpoStats sf;
        grpo_stats_init(&sf);
        GrpoInputs in = inputs_at(&bt, c, 0);
        double lf = grpo_loss(&c->cfg, &norm, &in, bt.B, gf, &sf);
        GrpoMetrics mf = grpo_metrics(&sf);
        for (int s = 0; s < 3; s++) {
            GrpoStats sm;
            grpo_stats_init(&sm);
            double lsum = 0;
            int b0 = 0;
            for (int k = 0; k < 4 && splits[s][k]; k++) {
                GrpoInputs mi = inputs_at(&bt, c, b0);
                lsum += grpo_loss(&c->cfg, &norm, &mi, splits[s][k], gm + (size_t)b0 * bt.T, &sm);
                b0 += splits[s][k];
            }
            ck_assert_int_eq(b0, bt.B);
            // the same per-sequence arithmetic: the gradient is bit-identical; the loss is a sum in another order
            ck_assert_msg(memcmp(gf, gm, BT * sizeof(double)) == 0, "%s split %d: gradient differs", c->name, s);
            ck_assert_msg(fabs(lsum - lf) <= 1e-15 * (1 + fabs(lf)) * bt.B, "%s split %d: loss %.17g vs %.17g", c->name, s, lsum, lf);
            GrpoMetrics mm = grpo_metrics(&sm);
            for (int k = 1; k < 10; k++)
                ck_assert_msg(close_rel(metric_of(&mm, k), metric_of(&mf, k), 1e-14), "%s split %d: metric %s", c->name, s,
                              METRIC_NAMES[k]);
        }
    }
    free(gf);
    free(gm);
    batch_free(&bt);
}
END_TEST

// ----------------------------------------------------------------------------
// gradient by central differences of grpo_loss itself

START_TEST(gradient_matches_finite_differences) {
    Batch bt = batch_load();
    Case cs[64];
    int n = cases_load(cs, 64);
    size_t BT = (size_t)bt.B * bt.T;
    double *g = (double *)mallocCheck(BT * sizeof(double)), *scratch = (double *)mallocCheck(BT * sizeof(double));
    double *lp = (double *)mallocCheck(BT * sizeof(double)), *oldc = (double *)mallocCheck(BT * sizeof(double));
    for (int i = 0; i < n; i++) {
        Case *c = &cs[i];
        c->cfg.num_generations = 4;
        GrpoNorm norm = grpo_prepare(&c->cfg, bt.B, bt.T, bt.mask, bt.trunc);
        memcpy(lp, bt.logp, BT * sizeof(double));
        // old = NULL means logp.detach(): the same values, held fixed while logp moves
        memcpy(oldc, c->old ? bt.old : bt.logp, BT * sizeof(double));
        GrpoInputs in = inputs_at(&bt, c, 0);
        in.logp = lp;
        grpo_loss(&c->cfg, &norm, &in, bt.B, g, NULL);
        in.old_logp = oldc;
        const double h = 1e-6;
        for (size_t k = 0; k < BT; k++) {
            if (!bt.mask[k]) {
                ck_assert_msg(g[k] == 0.0, "%s: gradient %g at a padded position", c->name, g[k]);
                continue;
            }
            double x = lp[k];
            lp[k] = x + h;
            double lpls = grpo_loss(&c->cfg, &norm, &in, bt.B, scratch, NULL);
            lp[k] = x - h;
            double lmin = grpo_loss(&c->cfg, &norm, &in, bt.B, scratch, NULL);
            lp[k] = x;
            double fd = (lpls - lmin) / (2 * h);
            // central difference: truncation O(h^2 L''') ~ 1e-12, rounding ~ eps |L| / h ~ 1e-10
            ck_assert_msg(fabs(fd - g[k]) <= 1e-8 + 1e-6 * fabs(g[k]), "%s: dlogp[%zu] analytic %.12g finite-diff %.12g", c->name,
                          k, g[k], fd);
        }
    }
    free(g);
    free(scratch);
    free(lp);
    free(oldc);
    batch_free(&bt);
}
END_TEST

// the gradient must not be trivially zero where the fixture is flat: a sanity check
// that the finite-difference test above compares something
START_TEST(gradient_is_not_trivial) {
    Batch bt = batch_load();
    Case cs[64];
    int n = cases_load(cs, 64);
    double g[512];
    for (int i = 0; i < n; i++) {
        cs[i].cfg.num_generations = 4;
        GrpoNorm norm = grpo_prepare(&cs[i].cfg, bt.B, bt.T, bt.mask, bt.trunc);
        GrpoInputs in = inputs_at(&bt, &cs[i], 0);
        grpo_loss(&cs[i].cfg, &norm, &in, bt.B, g, NULL);
        ck_assert_msg(max_abs_d(g, bt.B * bt.T) > 1e-3, "%s: gradient is ~0", cs[i].name);
    }
    batch_free(&bt);
}
END_TEST

// ----------------------------------------------------------------------------
// NaN safety

START_TEST(nan_safety) {
    enum { B = 4, T = 5 };
    GrpoConfig c = grpo_config_default();
    c.num_generations = 4;
    c.beta = 0.1;
    c.vllm_importance_sampling_mode = VIS_TOKEN_TRUNCATE;
    uint8_t mask[B * T] = {1, 1, 0, 0, 0,  1, 1, 1, 1, 1,  1, 0, 0, 0, 0,  1, 1, 1, 0, 0};
    uint8_t trunc[B] = {0, 1, 0, 0};
    double logp[B * T], old[B * T], ref[B * T], samp[B * T], adv[B] = {1.0, -1.0, 0.5, -0.5}, g[B * T];
    for (int i = 0; i < B * T; i++) {
        logp[i] = mask[i] ? -1.0 : -INFINITY;  // padding: -inf, NaN, garbage
        old[i] = mask[i] ? -1.1 : NAN;
        ref[i] = mask[i] ? -0.9 : NAN;
        samp[i] = mask[i] ? -1.2 : INFINITY;
    }
    logp[1] = 1e4;     // a log-ratio of 1e4 on an active token
    old[5] = -1e4;     // and -1e4 the other way
    samp[6] = -1e300;  // the engine saw a (numerically) impossible token
    ref[7] = 1e5;
    GrpoInputs in = {logp, old, ref, samp, adv, mask, trunc};
    for (int lt = 0; lt < 4; lt++)
        for (int lvl = 0; lvl < 2; lvl++)
            for (int mode = 0; mode < 4; mode++) {
                c.loss_type = (GrpoLossType)lt;
                c.importance_sampling_level = (GrpoImportanceLevel)lvl;
                c.vllm_importance_sampling_mode = (GrpoVllmISMode)mode;
                GrpoNorm norm = grpo_prepare(&c, B, T, mask, trunc);
                GrpoStats st;
                grpo_stats_init(&st);
                double loss = grpo_loss(&c, &norm, &in, B, g, &st);
                ck_assert_msg(isfinite(loss), "loss %g (loss_type %d level %d mode %d)", loss, lt, lvl, mode);
                for (int i = 0; i < B * T; i++) {
                    ck_assert_msg(isfinite(g[i]), "dlogp[%d] = %g", i, g[i]);
                    if (!mask[i]) ck_assert(g[i] == 0.0);
                }
                GrpoMetrics m = grpo_metrics(&st);
                ck_assert(isfinite(m.kl) && isfinite(m.is_ratio_max) && isfinite(m.sampling_logp_diff_mean));
            }
    // the clamp: beyond |log-ratio| 20 the gradient through the ratio stops (torch.clamp semantics)
    c.loss_type = LOSS_DAPO;
    c.importance_sampling_level = IS_LEVEL_TOKEN;
    c.beta = 0;
    GrpoInputs in2 = {logp, old, NULL, NULL, adv, mask, trunc};
    GrpoNorm norm = grpo_prepare(&c, B, T, mask, trunc);
    grpo_loss(&c, &norm, &in2, B, g, NULL);
    ck_assert(g[1] == 0.0 && g[5] == 0.0 && g[0] != 0.0);

    // and the KL's: with A = 0 only the KL term is left; ref - logp = 1e5 + 1 is clamped, its neighbour is not
    double zero_adv[B] = {0};
    GrpoInputs in4 = {logp, NULL, ref, NULL, zero_adv, mask, trunc};
    c.beta = 0.1;
    grpo_loss(&c, &norm, &in4, B, g, NULL);
    ck_assert(g[7] == 0.0 && g[8] != 0.0);

    // no completion tokens at all: loss 0, not 0/0
    uint8_t none[B * T] = {0};
    GrpoInputs in3 = {logp, old, ref, samp, adv, none, NULL};
    for (int lt = 0; lt < 4; lt++) {
        c.loss_type = (GrpoLossType)lt;
        c.beta = 0.1;
        GrpoNorm nn = grpo_prepare(&c, B, T, none, NULL);
        GrpoStats st;
        grpo_stats_init(&st);
        double loss = grpo_loss(&c, &nn, &in3, B, g, &st);
        ck_assert(loss == 0.0);
        for (int i = 0; i < B * T; i++) ck_assert(g[i] == 0.0);
        GrpoMetrics m = grpo_metrics(&st);
        ck_assert(m.kl == 0.0 && m.clip_region_mean == 0.0);
    }
    // NaN in an active token is not hidden: the caller's NaN check must see it
    old[0] = NAN;
    c.loss_type = LOSS_DAPO;
    norm = grpo_prepare(&c, B, T, mask, trunc);
    ck_assert(isnan(grpo_loss(&c, &norm, &in, B, g, NULL)));
}
END_TEST

START_TEST(beta_without_reference_dies) {
    GrpoConfig c = grpo_config_default();
    c.beta = 0.04;
    uint8_t mask[2] = {1, 1};
    double lp[2] = {-1, -1}, adv[1] = {1}, g[2];
    GrpoInputs in = {lp, NULL, NULL, NULL, adv, mask, NULL};
    GrpoNorm norm = grpo_prepare(&c, 1, 2, mask, NULL);
    EXPECT_DIE(grpo_loss(&c, &norm, &in, 1, g, NULL), "needs ref_logp");
}
END_TEST

START_TEST(advantages_bad_group_dies) {
    GrpoConfig c = grpo_config_default();
    double r[6] = {0}, w = 1, adv[6];
    EXPECT_DIE(grpo_advantages(&c, 6, 1, r, &w, adv, NULL), "not a multiple of num_generations=8");  // 6 sequences, G = 8
}
END_TEST

// ----------------------------------------------------------------------------
// optimizer helpers

START_TEST(schedule_matches_transformers) {
    Npy s = load("grpo/schedule_w3_t20.npy");
    for (long k = 0; k < s.n; k++) {
        double lr = lr_schedule("cosine", 1e-3, k, 3, 20);
        ck_assert_msg(fabs(lr - s.data[k]) <= 1e-15, "step %ld: %.17g want %.17g", k, lr, s.data[k]);
    }
    npy_free(&s);
    // by hand: warmup is linear from 0; the peak; half-way down is half; the end is 0
    ck_assert(lr_schedule("cosine", 1.0, 0, 10, 110) == 0.0);
    ck_assert(fabs(lr_schedule("cosine", 1.0, 5, 10, 110) - 0.5) < 1e-15);
    ck_assert(fabs(lr_schedule("cosine", 1.0, 10, 10, 110) - 1.0) < 1e-15);
    ck_assert(fabs(lr_schedule("cosine", 1.0, 60, 10, 110) - 0.5) < 1e-15);
    ck_assert(fabs(lr_schedule("cosine", 1.0, 110, 10, 110)) < 1e-15);
    ck_assert(lr_schedule("cosine", 1.0, 200, 10, 110) >= 0.0);
    ck_assert(fabs(lr_schedule("cosine", 2.0, 0, 0, 10) - 2.0) < 1e-15);  // no warmup: starts at the peak
    ck_assert_int_eq(warmup_steps_from_ratio(0.1, 95), 10);                  // ceil(9.5)
    ck_assert_int_eq(warmup_steps_from_ratio(0.0, 95), 0);
}
END_TEST

START_TEST(clip_matches_torch) {
    Npy c = load("grpo/clip.npy");
    for (long r = 0; r < c.shape[0]; r++) {
        double norm = c.data[3 * r], mx = c.data[3 * r + 1], want = c.data[3 * r + 2];
        double f = grad_clip_factor(norm, mx);
        // torch computes in float32 here (the gradient tensor's dtype): agree to float32 precision
        ck_assert_msg(fabs(f - want) <= 1e-6 * want, "norm %g max %g: %.9g want %.9g", norm, mx, f, want);
    }
    npy_free(&c);
    ck_assert(grad_clip_factor(0.5, 1.0) == 1.0);
    ck_assert(fabs(grad_clip_factor(4.0, 1.0) - 1.0 / (4.0 + 1e-6)) < 1e-16);
    ck_assert(grad_clip_factor(4.0, 0.0) == 1.0);  // disabled
    ck_assert(isnan(grad_clip_factor(NAN, 1.0)));
    ck_assert(isnan(grad_clip_factor(INFINITY, 1.0)));
}
END_TEST

Suite *grpo_suite(void) {
    Suite *s = suite_create("grpo");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, defaults_are_trls);
    tcase_add_test(tc, parser_accepts_and_rejects);
    tcase_add_test(tc, get_reads_back_through_set);
    tcase_add_test(tc, reward_weights_resolve);
    tcase_add_test(tc, advantages_match_fixture);
    tcase_add_test(tc, advantages_by_hand);
    tcase_add_test(tc, advantages_rloo);
    tcase_add_test(tc, loss_matches_fixture);
    tcase_add_test(tc, fixtures_discriminate);
    tcase_add_test(tc, microbatches_equal_full_batch);
    tcase_add_test(tc, gradient_matches_finite_differences);
    tcase_add_test(tc, gradient_is_not_trivial);
    tcase_add_test(tc, nan_safety);
    tcase_add_test(tc, beta_without_reference_dies);
    tcase_add_test(tc, advantages_bad_group_dies);
    tcase_add_test(tc, schedule_matches_transformers);
    tcase_add_test(tc, clip_matches_torch);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(grpo_suite()); }
