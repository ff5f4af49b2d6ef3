// ppo.c: PPO's rewards, whitening, GAE and clipped losses with their gradients (ppo.h), as TRL's
// PPOTrainer computes them. Sums run in index order, so results repeat bit for bit.
#include <math.h>
#include <string.h>

#include "ppo.h"
#include "core/common.h"

PpoConfig ppo_config_default(void) {
    PpoConfig c;
    memset(&c, 0, sizeof c);
    c.num_ppo_epochs = 4;
    c.cliprange = 0.2;
    c.cliprange_value = 0.2;
    c.vf_coef = 0.1;
    c.gamma = 1.0;
    c.lam = 0.95;
    c.kl_coef = 0.05;
    c.kl_estimator = PPO_KL_K1;
    c.whiten_rewards = 0;
    c.num_mini_batches = 1;
    c.missing_eos_penalty = 0;
    return c;
}

double ppo_kl(const PpoConfig *c, double logp, double ref_logp) {
    double r = ref_logp - logp;                                 // TRL's logr
    return c->kl_estimator == PPO_KL_K1 ? -r : expm1(r) - r;  // k3: (e^r - 1) - r
}

void ppo_token_rewards(const PpoConfig *c, int B, int T, const double *logp, const double *ref_logp,
                       const double *score, const int *end, double *rewards) {
    for (int b = 0; b < B; b++) {
        if (end[b] < 0 || end[b] >= T) die("ppo_token_rewards: sequence %d ends at %d, outside its %d tokens", b, end[b], T);
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            rewards[i] = -c->kl_coef * ppo_kl(c, logp[i], ref_logp[i]);
        }
        rewards[(size_t)b * T + end[b]] += score[b];
    }
}

void ppo_masked_whiten(double *x, const unsigned char *mask, int n, int shift_mean) {
    double s = 0, m = 0;
    for (int i = 0; i < n; i++)
        if (mask[i]) s += x[i], m++;
    if (m < 2) die("ppo_masked_whiten: %g masked values: the variance needs at least 2 (use a larger mini-batch)", m);
    double mean = s / m, v = 0;
    for (int i = 0; i < n; i++)
        if (mask[i]) v += (x[i] - mean) * (x[i] - mean);
    double var = v / m * (m / (m - 1));  // masked_var: the masked mean of squares, Bessel-corrected
    double inv = 1.0 / sqrt(var + 1e-8);
    for (int i = 0; i < n; i++) x[i] = (x[i] - mean) * inv + (shift_mean ? 0.0 : mean);
}

void ppo_gae(const PpoConfig *c, int B, int T, const double *rewards, const double *values, double *adv, double *ret) {
    for (int b = 0; b < B; b++) {
        const double *r = rewards + (size_t)b * T, *v = values + (size_t)b * T;
        double *a = adv + (size_t)b * T, last = 0;
        for (int t = T - 1; t >= 0; t--) {
            double next = t < T - 1 ? v[t + 1] : 0.0;
            double delta = r[t] + c->gamma * next - v[t];
            last = delta + c->gamma * c->lam * last;
            a[t] = last;
        }
        for (int t = 0; t < T; t++) ret[(size_t)b * T + t] = a[t] + v[t];
    }
}

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

static double mask_count(size_t n, const unsigned char *mask) {
    double k = 0;
    for (size_t i = 0; i < n; i++) k += mask[i];
    return k;
}

double ppo_policy_loss(const PpoConfig *c, size_t n, const double *logp, const double *old_logp, const double *adv,
                       const unsigned char *mask, double *d_logp, PpoLossStats *st) {
    double nm = mask_count(n, mask);
    if (nm == 0) die("ppo_policy_loss: no token counts (the mask is empty)");
    double pg = 0, pgc = 0, akl = 0, rs = 0;
    for (size_t i = 0; i < n; i++) {
        // max(-A ratio, -A clamp(ratio)); d/dlogp through ratio = exp(logp - old)
        double diff = logp[i] - old_logp[i], ratio = exp(diff);
        double lo = 1.0 - c->cliprange, hi = 1.0 + c->cliprange, cr = clampd(ratio, lo, hi);
        double l1 = -adv[i] * ratio, l2 = -adv[i] * cr;
        double dl1 = l1, dl2 = ratio >= lo && ratio <= hi ? -adv[i] * ratio : 0.0;  // d(l)/d(diff)
        // torch.maximum's gradient: the larger side's, half each on a tie
        double dmax = l1 > l2 ? dl1 : l2 > l1 ? dl2 : 0.5 * (dl1 + dl2);
        akl += diff * diff;
        rs += ratio;
        if (mask[i]) {
            pg += l1 > l2 ? l1 : l2;
            pgc += l2 > l1;
        }
        d_logp[i] = mask[i] ? dmax / nm : 0.0;
    }
    if (st) {
        st->pg_loss = pg / nm;
        st->pg_clipfrac = pgc / nm;
        st->approxkl = 0.5 * akl / (double)n;
        st->ratio_mean = rs / (double)n;
    }
    return pg / nm;
}

double ppo_value_loss(const PpoConfig *c, size_t n, const double *vpred, const double *values, const double *returns,
                      const unsigned char *vmask, double *d_vpred, PpoLossStats *st) {
    double nv = mask_count(n, vmask);
    if (nv == 0) die("ppo_value_loss: no token counts (the mask is empty)");
    double vf = 0, vfc = 0;
    for (size_t i = 0; i < n; i++) {
        // max((vpred - R)^2, (vclip - R)^2), vclip = clamp(vpred, v - c, v + c)
        double vlo = values[i] - c->cliprange_value, vhi = values[i] + c->cliprange_value;
        double vc = clampd(vpred[i], vlo, vhi);
        double e1 = vpred[i] - returns[i], e2 = vc - returns[i], s1 = e1 * e1, s2 = e2 * e2;
        double ds1 = 2 * e1, ds2 = vpred[i] >= vlo && vpred[i] <= vhi ? 2 * e2 : 0.0;
        double dv = s1 > s2 ? ds1 : s2 > s1 ? ds2 : 0.5 * (ds1 + ds2);
        if (vmask[i]) {
            vf += s1 > s2 ? s1 : s2;
            vfc += s2 > s1;
        }
        d_vpred[i] = vmask[i] ? c->vf_coef * 0.5 * dv / nv : 0.0;
    }
    if (st) {
        st->vf_loss = 0.5 * (vf / nv);
        st->vf_clipfrac = vfc / nv;
    }
    return 0.5 * (vf / nv);
}

double ppo_loss(const PpoConfig *c, int B, int T, const double *logp, const double *old_logp, const double *adv,
                const unsigned char *mask, const double *vpred, const double *values, const double *returns,
                const unsigned char *vmask, double *d_logp, double *d_vpred, PpoLossStats *st) {
    size_t n = (size_t)B * T;
    double pg_loss = ppo_policy_loss(c, n, logp, old_logp, adv, mask, d_logp, st);
    double vf_loss = ppo_value_loss(c, n, vpred, values, returns, vmask, d_vpred, st);
    double loss = pg_loss + c->vf_coef * vf_loss;
    if (st) st->loss = loss;
    return loss;
}
