// dpo.c: DPO's losses on the host, in double precision: TRL's DPOTrainer.dpo_loss for each
// loss_type (the formulas: dpo.h), the gradient with respect to the policy's summed log-probs, the
// implicit rewards and TRL's metrics. Depends on core/common.h only.
//
// The gradients are derived by hand, per loss type, as dL/dz for the one argument z the loss is a
// function of (z = beta * logits for most), then chained to the log-probs; test/test_dpo.c checks
// them against a NumPy reimplementation of TRL differentiated by complex steps
// (dev/make_dpo_fixture.py) and against finite differences of dpo_loss itself.
#include "dpo.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"

static const char *const LOSS_NAMES[DPO_N_LOSS_TYPES] = {"sigmoid", "robust",    "exo_pair", "hinge",    "ipo",
                                                         "nca_pair", "sppo_hard", "apo_zero", "apo_down", "discopop"};

DpoConfig dpo_config_default(void) {
    DpoConfig c = {.beta = 0.1, .loss_type = DPO_SIGMOID, .label_smoothing = 0.0, .reference_free = 0, .discopop_tau = 0.05};
    return c;
}

int dpo_loss_type_parse(const char *name) {
    for (int i = 0; i < DPO_N_LOSS_TYPES; i++)
        if (!strcmp(name, LOSS_NAMES[i])) return i;
    return -1;
}

const char *dpo_loss_type_name(DpoLossType t) { return t >= 0 && t < DPO_N_LOSS_TYPES ? LOSS_NAMES[t] : "?"; }

const char *dpo_loss_type_names(void) {
    static char buf[256];
    if (!buf[0])
        for (int i = 0; i < DPO_N_LOSS_TYPES; i++) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? "|" : "", LOSS_NAMES[i]);
    return buf;
}

int dpo_config_check(const DpoConfig *c, char *err, size_t cap) {
    if (!(c->beta > 0)) return error_msg(err, cap, "beta %g: it must be > 0 (TRL's default is 0.1)", c->beta);
    if (c->loss_type < 0 || c->loss_type >= DPO_N_LOSS_TYPES)
        return error_msg(err, cap, "unknown loss_type: use one of %s", dpo_loss_type_names());
    double ls = c->label_smoothing;
    if (!(ls >= 0 && ls < 1)) return error_msg(err, cap, "label_smoothing %g: it must lie in [0, 1)", ls);
    if (c->loss_type == DPO_ROBUST && !(ls < 0.5))
        return error_msg(err, cap, "label_smoothing %g with loss_type robust: it must lie in [0, 0.5) (the loss divides by 1 - 2 "
                         "label_smoothing)", ls);
    if (c->loss_type == DPO_DISCOPOP && !(c->discopop_tau > 0))
        return error_msg(err, cap, "discopop_tau %g: it must be > 0 (the paper's 0.05 is the default)", c->discopop_tau);
    return 0;
}

int dpo_mean_logps(const DpoConfig *c) { return c->loss_type == DPO_IPO; }

void dpo_stats_init(DpoStats *st) { memset(st, 0, sizeof *st); }

// log(sigmoid(x)) without overflow either way
static double logsigmoid(double x) { return x < 0 ? x - log1p(exp(x)) : -log1p(exp(-x)); }
static double sigmoid(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

double dpo_loss(const DpoConfig *cfg, const DpoInputs *in, int n, double norm, double *d_chosen, double *d_rejected,
                DpoStats *st) {
    const double beta = cfg->beta, ls = cfg->label_smoothing, keep_ref = cfg->reference_free ? 0.0 : 1.0;
    const int mean = dpo_mean_logps(cfg);
    double total = 0;
    for (int i = 0; i < n; i++) {
        // ipo: every log-prob the mean per completion token (TRL divides in concatenated_forward, for
        // the reference too); the gradient with respect to the sum is then d/dmean / tokens
        double sc = 1, sr = 1;
        if (mean) {
            if (in->chosen_tokens[i] < 1 || in->rejected_tokens[i] < 1)
                die("dpo_loss: pair %d has a completion of no tokens (ipo divides by its length)", i);
            sc = 1.0 / in->chosen_tokens[i], sr = 1.0 / in->rejected_tokens[i];
        }
        double pc = in->chosen_logps[i] * sc, pr = in->rejected_logps[i] * sr;
        double rc = in->ref_chosen_logps[i] * sc, rr = in->ref_rejected_logps[i] * sr;
        double cl = pc - keep_ref * rc, rl = pr - keep_ref * rr;  // the log-ratios as the loss sees them
        double logits = cl - rl;                                  // = (pc - pr) - keep_ref (rc - rr)
        double z = beta * logits, L, gc, gr;                      // gc, gr: dL/dpc, dL/dpr
        switch (cfg->loss_type) {
            case DPO_SIGMOID: {
                L = -logsigmoid(z) * (1 - ls) - logsigmoid(-z) * ls;
                double dz = -(1 - ls) * sigmoid(-z) + ls * sigmoid(z);
                gc = beta * dz, gr = -beta * dz;
                break;
            }
            case DPO_ROBUST: {
                L = (-logsigmoid(z) * (1 - ls) + logsigmoid(-z) * ls) / (1 - 2 * ls);
                double dz = (-(1 - ls) * sigmoid(-z) - ls * sigmoid(z)) / (1 - 2 * ls);
                gc = beta * dz, gr = -beta * dz;
                break;
            }
            case DPO_EXO_PAIR: {
                double e = ls == 0 ? 1e-3 : ls, s = sigmoid(z), sn = sigmoid(-z);
                L = s * (logsigmoid(z) - log1p(-e)) + sn * (logsigmoid(-z) - log(e));
                // d/dz: s(1-s) (logsigmoid(z) - logsigmoid(-z) - log(1-e) + log e), and logsigmoid(z) -
                // logsigmoid(-z) = z
                double dz = s * sn * (z - log1p(-e) + log(e));
                gc = beta * dz, gr = -beta * dz;
                break;
            }
            case DPO_HINGE: {
                L = 1 - z > 0 ? 1 - z : 0;
                double dz = 1 - z > 0 ? -1 : 0;  // torch.relu's gradient is 0 at 0
                gc = beta * dz, gr = -beta * dz;
                break;
            }
            case DPO_IPO: {
                double u = logits - 1 / (2 * beta);
                L = u * u;
                gc = 2 * u, gr = -2 * u;
                break;
            }
            case DPO_NCA_PAIR: {  // the reference always (TRL's nca_pair does not read reference_free)
                double c = beta * (pc - rc), r = beta * (pr - rr);
                L = -logsigmoid(c) - 0.5 * logsigmoid(-c) - 0.5 * logsigmoid(-r);
                gc = beta * (-sigmoid(-c) + 0.5 * sigmoid(c));
                gr = beta * 0.5 * sigmoid(r);
                break;
            }
            case DPO_SPPO_HARD: {  // the same
                double a = pc - rc - 0.5 / beta, b = pr - rr + 0.5 / beta;
                L = a * a + b * b;
                gc = 2 * a, gr = 2 * b;
                break;
            }
            case DPO_APO_ZERO: {
                double s1 = sigmoid(beta * cl), s2 = sigmoid(beta * rl);
                L = 1 - s1 + s2;
                gc = -beta * s1 * (1 - s1), gr = beta * s2 * (1 - s2);
                break;
            }
            case DPO_APO_DOWN: {
                double s1 = sigmoid(beta * cl), s2 = sigmoid(z);
                L = s1 + 1 - s2;
                gc = beta * s1 * (1 - s1) - beta * s2 * (1 - s2), gr = beta * s2 * (1 - s2);
                break;
            }
            case DPO_DISCOPOP: {  // with the reference whatever reference_free says (TRL recomputes the logits)
                double x = beta * ((pc - pr) - (rc - rr)), m = sigmoid(x / cfg->discopop_tau), dm = m * (1 - m) / cfg->discopop_tau;
                double ex = exp(-x);
                L = -logsigmoid(x) * (1 - m) + ex * m;
                double dx = -sigmoid(-x) * (1 - m) + logsigmoid(x) * dm - ex * m + ex * dm;
                gc = beta * dx, gr = -beta * dx;
                break;
            }
            default: die("dpo_loss: unknown loss_type %d", (int)cfg->loss_type);
        }
        total += L / norm;
        if (d_chosen) d_chosen[i] = gc * sc / norm;
        if (d_rejected) d_rejected[i] = gr * sr / norm;
        if (st) {
            double rwc = beta * (pc - rc), rwr = beta * (pr - rr);  // against the reference, always
            st->pairs += 1;
            st->rewards_chosen += rwc, st->rewards_rejected += rwr;
            st->accuracies += rwc > rwr;
            st->logps_chosen += pc, st->logps_rejected += pr;
        }
    }
    if (st) st->loss += total;
    return total;
}

DpoMetrics dpo_metrics(const DpoStats *st) {
    DpoMetrics m;
    double n = st->pairs > 0 ? st->pairs : NAN;
    m.loss = st->loss;
    m.rewards_chosen = st->rewards_chosen / n;
    m.rewards_rejected = st->rewards_rejected / n;
    m.rewards_accuracies = st->accuracies / n;
    m.rewards_margins = (st->rewards_chosen - st->rewards_rejected) / n;
    m.logps_chosen = st->logps_chosen / n;
    m.logps_rejected = st->logps_rejected / n;
    return m;
}

void dpo_eval_add(DpoEvalStats *e, const DpoStats *batch) {
    DpoMetrics m = dpo_metrics(batch);
    e->batches += 1, e->pairs += batch->pairs;
    e->loss += batch->loss * batch->pairs;  // batch->loss: the batch's mean (norm = its pairs)
    e->sum.rewards_chosen += m.rewards_chosen, e->sum.rewards_rejected += m.rewards_rejected;
    e->sum.rewards_accuracies += m.rewards_accuracies, e->sum.rewards_margins += m.rewards_margins;
    e->sum.logps_chosen += m.logps_chosen, e->sum.logps_rejected += m.logps_rejected;
}

DpoMetrics dpo_eval_metrics(const DpoEvalStats *e) {
    double b = e->batches > 0 ? e->batches : NAN;
    DpoMetrics m = {.loss = e->loss / (e->pairs > 0 ? e->pairs : NAN)};
    m.rewards_chosen = e->sum.rewards_chosen / b, m.rewards_rejected = e->sum.rewards_rejected / b;
    m.rewards_accuracies = e->sum.rewards_accuracies / b, m.rewards_margins = e->sum.rewards_margins / b;
    m.logps_chosen = e->sum.logps_chosen / b, m.logps_rejected = e->sum.logps_rejected / b;
    return m;
}
