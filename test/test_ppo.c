// test/test_ppo.c: Check suite for ppo.c. The per-token rewards, whitening, GAE, returns, whitened
// advantages and the clipped policy and value losses against test/fixtures/ppo (TRL's PPOTrainer
// train() loop reimplemented in NumPy float64: dev/make_ppo_fixture.py), fed the same filled
// arrays and masks; the gradients against central finite differences of ppo_loss itself; TRL's
// PPOConfig defaults.
//   make build/test_ppo && ./build/test_ppo     (from the repo root: the fixtures are read from test/fixtures)
#include <check.h>

#include "ppo.h"
#include "testutil.h"

// Fixture and C are float64 evaluations of the same formulas in a different order of a few sums
// (NumPy's pairwise sums against C's left-to-right ones over <= 60 terms): ~1e-15 relative, grown
// by at most the whitening's division by a standard deviation of order 1. 1e-11 leaves margin.
#define TOL_FIX 1e-11
enum { B = 6, T = 10 };

static Npy load(const char *name) {
    char p[512];
    fixture_path(p, sizeof p, name);
    Npy a = npy_read(p);
    return a;
}
static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * (1.0 + fabs(b)); }
static void expect_all(const double *got, const char *name, int n, double tol) {
    Npy want = load(name);
    ck_assert_int_eq((int)want.n, n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(close_rel(got[i], want.data[i], tol), "%s[%d]: C %.17g, fixture %.17g", name, i, got[i], want.data[i]);
    npy_free(&want);
}

typedef struct {
    Npy logp, ref, newp, values, vpred, scores, endf, maskf, vmaskf;
    int end[B];
    unsigned char mask[B * T], vmask[B * T];
} In;
static In in_load(void) {
    In in;
    in.logp = load("ppo/in_logprobs.npy");
    in.ref = load("ppo/in_ref_logprobs.npy");
    in.newp = load("ppo/in_new_logprobs.npy");
    in.values = load("ppo/in_values.npy");
    in.vpred = load("ppo/in_vpred.npy");
    in.scores = load("ppo/in_scores.npy");
    in.endf = load("ppo/in_end.npy");
    in.maskf = load("ppo/in_mask.npy");
    in.vmaskf = load("ppo/in_vmask.npy");
    ck_assert_int_eq((int)in.logp.n, B * T);
    for (int b = 0; b < B; b++) in.end[b] = (int)in.endf.data[b];
    for (int i = 0; i < B * T; i++) in.mask[i] = in.maskf.data[i] != 0, in.vmask[i] = in.vmaskf.data[i] != 0;
    return in;
}
static void in_free(In *in) {
    Npy *a[] = {&in->logp, &in->ref, &in->newp, &in->values, &in->vpred, &in->scores, &in->endf, &in->maskf, &in->vmaskf};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) npy_free(a[i]);
}

// the trainer's steps as TRL's train() runs them, through ppo.c: rewards (whitened and zero-filled
// past vmask when asked), GAE, returns, advantages whitened over mask and zero-filled past it
static void pipeline(const PpoConfig *c, const In *in, double *rewards, double *adv, double *ret) {
    ppo_token_rewards(c, B, T, in->logp.data, in->ref.data, in->scores.data, in->end, rewards);
    if (c->whiten_rewards) {
        ppo_masked_whiten(rewards, in->vmask, B * T, 0);
        for (int i = 0; i < B * T; i++) if (!in->vmask[i]) rewards[i] = 0;
    }
    ppo_gae(c, B, T, rewards, in->values.data, adv, ret);
    ppo_masked_whiten(adv, in->mask, B * T, 1);
    for (int i = 0; i < B * T; i++) if (!in->mask[i]) adv[i] = 0;
}

static void check_case(const char *name, const PpoConfig *c) {
    In in = in_load();
    double rewards[B * T], adv[B * T], ret[B * T], dl[B * T], dv[B * T];
    pipeline(c, &in, rewards, adv, ret);
    char f[128];
    snprintf(f, sizeof f, "ppo/%s_rewards.npy", name);
    expect_all(rewards, f, B * T, TOL_FIX);
    snprintf(f, sizeof f, "ppo/%s_returns.npy", name);
    expect_all(ret, f, B * T, TOL_FIX);
    snprintf(f, sizeof f, "ppo/%s_advantages.npy", name);
    expect_all(adv, f, B * T, TOL_FIX);
    PpoLossStats st;
    double loss = ppo_loss(c, B, T, in.newp.data, in.logp.data, adv, in.mask, in.vpred.data, in.values.data, ret, in.vmask,
                           dl, dv, &st);
    double got[6] = {loss, st.pg_loss, st.vf_loss, st.pg_clipfrac, st.vf_clipfrac, st.approxkl};
    snprintf(f, sizeof f, "ppo/%s_stats.npy", name);
    expect_all(got, f, 6, TOL_FIX);
    ck_assert(st.pg_clipfrac > 0 && st.vf_clipfrac > 0);  // the clips are exercised
    printf("ppo %s: loss %.6f (pg %.6f, vf %.6f), clipfrac pg %.3f vf %.3f: as TRL's\n", name, loss, st.pg_loss, st.vf_loss,
           st.pg_clipfrac, st.vf_clipfrac);
    in_free(&in);
}

START_TEST(matches_trl_default) {
    PpoConfig c = ppo_config_default();
    check_case("default", &c);
}
END_TEST

START_TEST(matches_trl_k3_whiten) {
    PpoConfig c = ppo_config_default();
    c.kl_estimator = PPO_KL_K3;
    c.whiten_rewards = 1;
    c.gamma = 0.99, c.lam = 0.9, c.cliprange = 0.1, c.cliprange_value = 0.3, c.vf_coef = 0.5, c.kl_coef = 0.2;
    check_case("k3_whiten", &c);
}
END_TEST

// d loss / d logp and d loss / d vpred against central differences of ppo_loss (h = 1e-6: truncation
// ~h^2 |f'''| ~1e-12, rounding ~1e-16 / h ~1e-10), away from the kinks where a max or a clamp
// switches side within h (those elements are skipped; at least 80% are checked); masked tokens' exactly 0
START_TEST(gradient_matches_finite_differences) {
    In in = in_load();
    PpoConfig c = ppo_config_default();
    double rewards[B * T], adv[B * T], ret[B * T], dl[B * T], dv[B * T], g1[B * T], g2[B * T];
    pipeline(&c, &in, rewards, adv, ret);
    double lp[B * T], vp[B * T];
    memcpy(lp, in.newp.data, sizeof lp);
    memcpy(vp, in.vpred.data, sizeof vp);
    ppo_loss(&c, B, T, lp, in.logp.data, adv, in.mask, vp, in.values.data, ret, in.vmask, dl, dv, NULL);
    const double h = 1e-6;
    int checked = 0, total = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < B * T; i++) {
            double *x = k ? vp : lp, x0 = x[i], d = k ? dv[i] : dl[i];
            if (!(k ? in.vmask[i] : in.mask[i])) {
                ck_assert(d == 0.0);
                continue;
            }
            total++;
            // a kink within h: the ratio at a clip edge, or vpred at its clip edge
            double ratio = exp(lp[i] - in.logp.data[i]), vlo = in.values.data[i] - c.cliprange_value,
                   vhi = in.values.data[i] + c.cliprange_value;
            if (k == 0 && (fabs(ratio - (1 - c.cliprange)) < 1e-4 || fabs(ratio - (1 + c.cliprange)) < 1e-4)) continue;
            if (k == 1 && (fabs(vp[i] - vlo) < 1e-4 || fabs(vp[i] - vhi) < 1e-4)) continue;
            x[i] = x0 + h;
            double fp = ppo_loss(&c, B, T, lp, in.logp.data, adv, in.mask, vp, in.values.data, ret, in.vmask, g1, g2, NULL);
            x[i] = x0 - h;
            double fm = ppo_loss(&c, B, T, lp, in.logp.data, adv, in.mask, vp, in.values.data, ret, in.vmask, g1, g2, NULL);
            x[i] = x0;
            double fd = (fp - fm) / (2 * h);
            ck_assert_msg(fabs(fd - d) <= 1e-8 + 1e-6 * fabs(d), "%s[%d]: analytic %.12g, finite differences %.12g",
                          k ? "d_vpred" : "d_logp", i, d, fd);
            checked++;
        }
    ck_assert_msg(checked >= 0.8 * total, "only %d of %d gradients away from a kink", checked, total);
    in_free(&in);
}
END_TEST

START_TEST(defaults_are_trls) {
    PpoConfig c = ppo_config_default();  // TRL's PPOConfig
    ck_assert_int_eq(c.num_ppo_epochs, 4);
    ck_assert(c.cliprange == 0.2 && c.cliprange_value == 0.2 && c.vf_coef == 0.1);
    ck_assert(c.gamma == 1.0 && c.lam == 0.95 && c.kl_coef == 0.05);
    ck_assert_int_eq(c.kl_estimator, PPO_KL_K1);
    ck_assert_int_eq(c.whiten_rewards, 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ppo");
    TCase *tc = tcase_create("formulas");
    tcase_add_test(tc, matches_trl_default);
    tcase_add_test(tc, matches_trl_k3_whiten);
    tcase_add_test(tc, gradient_matches_finite_differences);
    tcase_add_test(tc, defaults_are_trls);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
