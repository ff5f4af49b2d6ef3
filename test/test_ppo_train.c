// test/test_ppo_train.c: Check suite for train/ppo_train.c on a tiny random model (the fp64 CPU
// backend). The value model's gradients (its score head and its own LoRA adapter, through
// model_backward_hidden) against central finite differences, the policy's untouched; one PPO step's
// numbers against ppo.c's formulas (tested against TRL in test_ppo) fed the test's own passes: the
// rollout's KL, entropy and scores, the first update's policy and value losses, and the gradients it
// leaves in both adapters and the head, with the step's micro-batches smaller than its batch; more
// epochs and mini-batches move both models, the same way twice; the value state round-trips.
//   make build/test_ppo_train && ./build/test_ppo_train
#include <check.h>
#include <unistd.h>

#include "lora.h"
#include "model.h"
#include "ppo.h"
#include "testutil.h"
#include "train/ppo_train.h"

static void tiny(Model *m, LoRA **lo) {
    Config c = {0};
    c.arch = ARCH_QWEN3, c.V = 19, c.C = 16, c.FF = 24, c.L = 2, c.NH = 4, c.KVH = 2, c.HD = 8, c.max_pos = 32;
    c.eps = 1e-5f, c.rope_theta = 100.0f, c.qk_norm = 1, c.tied = 1, c.bos_id = -1;
    ModelOptions o = {FP8_OFF, 0, 0, 0, 0};
    model_init_random(m, &c, backend_cpu64(), &o, 21);
    *lo = lora_create(m, 2, 4.0f, lora_parse_targets("q_proj,v_proj,up_proj,down_proj"), 4, 0);
    Rng r = rng_make(8);
    for (size_t i = 0; i < (*lo)->n; i++) ((double *)(*lo)->params)[i] += 0.2 * rng_normal(&r);
    m->lora = *lo;
}

// the value model's weights away from their start (B = 0, head = 0), so that every gradient is alive
static void randomize_value(ValueModel *v, uint64_t seed) {
    Rng r = rng_make(seed);
    for (size_t i = 0; i < v->lo->n; i++) ((double *)v->lo->params)[i] += 0.2 * rng_normal(&r);
    for (int i = 0; i < v->C; i++) ((double *)v->w)[i] = 0.3 * rng_normal(&r);
    v->be->to_act(v->w_act, v->w, v->C);
}

enum { B = 4, T = 7 };

// L = sum_n c_n value_n over a batch (B, T)
static double value_objective(ValueModel *v, Model *m, const int *ids, const double *c) {
    double val[B * T], L = 0;
    value_forward(v, m, ids, B, T, val);
    for (int i = 0; i < B * T; i++) L += c[i] * val[i];
    return L;
}

START_TEST(test_value_gradient) {
    Model m;
    LoRA *lo;
    tiny(&m, &lo);
    ValueModel v;
    value_init(&v, &m, lo, 5);
    ck_assert_int_eq(v.lo->r, lo->r);
    ck_assert(v.lo->n == lo->n && v.lo->params != lo->params);
    randomize_value(&v, 6);
    Rng r = rng_make(7);
    int ids[B * T];
    double c[B * T], val[B * T];
    for (int i = 0; i < B * T; i++) ids[i] = rng_int(&r, m.cfg.V), c[i] = rng_normal(&r);
    value_forward(&v, &m, ids, B, T, val);
    ck_assert_ptr_eq(m.acts.lora, v.lo);  // the forward applied the value's adapter, and its backward must too
    EXPECT_DIE(model_backward_hidden(&m, lo, m.acts.dln), "model_backward_hidden: given an adapter, but the forward applied another one: pass the forward's adapter");
    EXPECT_DIE(model_backward_hidden(&m, NULL, m.acts.dln), "given no adapter, but the forward applied one");
    // the values are score . lnf, lnf the final norm's output of the value adapter's forward
    for (int i = 0; i < B * T; i++) {
        double d = 0;
        for (int k = 0; k < v.C; k++) d += ((double *)v.w)[k] * ((double *)m.acts.lnf)[(size_t)i * v.C + k];
        ck_assert_msg(fabs(d - val[i]) <= 1e-12 * (1 + fabs(d)), "value %d: %.17g vs %.17g", i, val[i], d);
    }
    lora_zero_grads(lo);
    value_zero_grads(&v);
    value_backward(&v, &m, c);
    for (size_t i = 0; i < lo->n; i++) ck_assert_msg(((double *)lo->grads)[i] == 0, "the policy's gradient moved at %zu", i);
    // every head weight, and 16 of the value adapter's parameters, against central differences
    double h = 1e-6;
    for (int k = 0; k < v.C + 16; k++) {
        int head = k < v.C;
        size_t i = head ? (size_t)k : (size_t)rng_int(&r, (int)v.lo->n);
        double *p = head ? (double *)v.w + i : (double *)v.lo->params + i;
        double g = head ? ((double *)v.g)[i] : ((double *)v.lo->grads)[i], old = *p;
        *p = old + h;
        if (head) v.be->to_act(v.w_act, v.w, v.C);
        double up = value_objective(&v, &m, ids, c);
        *p = old - h;
        if (head) v.be->to_act(v.w_act, v.w, v.C);
        double dn = value_objective(&v, &m, ids, c);
        *p = old;
        if (head) v.be->to_act(v.w_act, v.w, v.C);
        double num = (up - dn) / (2 * h);
        // fp64 central differences: truncation h^2 ~ 1e-12, rounding ~1e-16 / h = 1e-10
        ck_assert_msg(fabs(num - g) <= 1e-6 * fmax(1e-3, fabs(num)) + 1e-9, "%s %zu: analytic %.10g numeric %.10g",
                      head ? "score" : "value adapter", i, g, num);
    }
    value_free(&v);
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
}
END_TEST

// a fixed rollout batch: prompts of 2-3 tokens, completions of 1-4, right-padded to T
typedef struct {
    int ids[B * T], tg[B * T], start[B], len[B];
    unsigned char trunc[B];
    double score[B];
} Roll;
enum { TC = 4 };
static void make_roll(Roll *x, int V) {
    int plen[B] = {3, 2, 3, 2}, len[B] = {4, 1, 3, 4};
    Rng r = rng_make(11);
    for (int q = 0; q < B; q++) {
        x->start[q] = plen[q] - 1, x->len[q] = len[q];
        x->trunc[q] = len[q] == TC;
        x->score[q] = q == 2 ? 0.0 : 1.0 + 0.2 * q;
        for (int t = 0; t < T; t++) x->ids[q * T + t] = t < plen[q] + len[q] ? rng_int(&r, V) : 0;
        for (int t = 0; t < T; t++) {
            int j = t + 1 - plen[q];
            x->tg[q * T + t] = j >= 0 && j < len[q] ? x->ids[q * T + t + 1] : -1;
        }
    }
}
static void comp(const Roll *x, const double *full, double *c) {
    for (int q = 0; q < B; q++)
        for (int j = 0; j < TC; j++) c[q * TC + j] = j < x->len[q] ? full[q * T + x->start[q] + j] : 0;
}
static void uncomp(const Roll *x, const double *c, double *full) {
    memset(full, 0, B * T * sizeof(double));
    for (int q = 0; q < B; q++)
        for (int j = 0; j < x->len[q]; j++) full[q * T + x->start[q] + j] = c[q * TC + j];
}
static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * (1 + fabs(b)); }

START_TEST(test_ppo_step_against_formulas) {
    Model m;
    LoRA *lo;
    tiny(&m, &lo);
    Roll x;
    make_roll(&x, m.cfg.V);
    PpoConfig c = ppo_config_default();
    c.num_ppo_epochs = 1;
    c.kl_coef = 0.3;  // (the tiny model's KL is small: a larger coefficient makes its part of the rewards count)
    PpoTrainer p;
    ppo_init(&p, &c, &m, lo, B, TC, 3);
    randomize_value(&p.value, 6);
    // the test's own passes: the reference (no adapter), the policy, the value (its adapter, score . lnf)
    double full[B * T], ref[B * TC], old[B * TC], val[B * TC];
    model_forward(&m, NULL, x.ids, B, T);
    model_logprobs(&m, x.tg, 1.0f, full);
    comp(&x, full, ref);
    model_forward(&m, lo, x.ids, B, T);
    model_logprobs(&m, x.tg, 1.0f, full);
    comp(&x, full, old);
    model_forward(&m, p.value.lo, x.ids, B, T);
    for (int i = 0; i < B * T; i++) {
        full[i] = 0;
        for (int k = 0; k < m.cfg.C; k++) full[i] += ((double *)p.value.w)[k] * ((double *)m.acts.lnf)[(size_t)i * m.cfg.C + k];
    }
    comp(&x, full, val);
    // ppo.h's formulas on them
    int end[B];
    unsigned char mask[B * TC];
    double rew[B * TC], adv[B * TC], ret[B * TC], kl = 0, ent = 0, sc = 0;
    for (int q = 0; q < B; q++) {
        end[q] = x.len[q] - 1, sc += x.score[q];
        for (int j = 0; j < TC; j++) {
            mask[q * TC + j] = j < x.len[q];
            if (j < x.len[q]) kl += old[q * TC + j] - ref[q * TC + j], ent -= old[q * TC + j];
        }
    }
    ppo_token_rewards(&c, B, TC, old, ref, x.score, end, rew);
    ppo_gae(&c, B, TC, rew, val, adv, ret);
    ppo_masked_whiten(adv, mask, B * TC, 1);
    for (int i = 0; i < B * TC; i++) adv[i] = mask[i] ? adv[i] : 0;
    double dlogp[B * TC], dv[B * TC];
    PpoLossStats want;
    ppo_policy_loss(&c, B * TC, old, old, adv, mask, dlogp, &want);
    ppo_value_loss(&c, B * TC, val, val, ret, mask, dv, &want);
    ck_assert(want.vf_loss > 0.01);  // (values far from the returns: a loss that tests something)

    // the step, in micro-batches of 3 (3 + 1) that an epoch shuffles, lr 0: the gradients stay to be read
    PpoBatch b = {B, T, TC, x.ids, x.tg, x.start, x.len, x.trunc, x.score, 1.0f};
    OptimConfig po = {"constant", 0.0, 0.9, 0.999, 1e-8, 0.0, 0.0, 0, 1};
    PpoStepStats st;
    ppo_step(&p, &m, lo, &b, 3, &po, 1, &st);
    ck_assert_msg(close_rel(st.kl, kl / B, 1e-12), "objective/kl %.17g, want %.17g", st.kl, kl / B);
    ck_assert_msg(close_rel(st.entropy, ent / B, 1e-12), "objective/entropy %.17g, want %.17g", st.entropy, ent / B);
    ck_assert_msg(close_rel(st.scores, sc / B, 1e-12), "objective/scores %.17g", st.scores);
    ck_assert_msg(close_rel(st.rlhf_reward, sc / B - c.kl_coef * kl / B, 1e-12), "objective/rlhf_reward %.17g", st.rlhf_reward);
    ck_assert_msg(close_rel(st.pg_loss, want.pg_loss, 1e-10), "loss/policy_avg %.17g, want %.17g", st.pg_loss, want.pg_loss);
    ck_assert_msg(close_rel(st.vf_loss, want.vf_loss, 1e-10), "loss/value_avg %.17g, want %.17g", st.vf_loss, want.vf_loss);
    ck_assert_msg(close_rel(st.ratio, 1.0, 1e-12) && st.approxkl < 1e-24 && st.pg_clipfrac == 0 && st.vf_clipfrac == 0,
                  "the first update's ratio %.17g, approxkl %g", st.ratio, st.approxkl);
    ck_assert(isnan(st.ratio_var));  // one update
    // the gradients it left: the whole batch's d loss through model_backward / value_backward at once
    size_t n = lo->n, nv = p.value.lo->n;
    double *gp = (double *)mallocCheck(n * sizeof(double)), *gv = (double *)mallocCheck(nv * sizeof(double)), gh[16];
    memcpy(gp, lo->grads, n * sizeof(double));
    memcpy(gv, p.value.lo->grads, nv * sizeof(double));
    memcpy(gh, p.value.g, sizeof gh);
    lora_zero_grads(lo);
    value_zero_grads(&p.value);
    model_forward(&m, lo, x.ids, B, T);
    model_logprobs(&m, x.tg, 1.0f, full);
    uncomp(&x, dlogp, full);
    model_backward(&m, lo, full);
    value_forward(&p.value, &m, x.ids, B, T, full);
    uncomp(&x, dv, full);
    value_backward(&p.value, &m, full);
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(((double *)lo->grads)[i]));
    ck_assert(mx > 1e-6);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(gp[i] - ((double *)lo->grads)[i]) <= 1e-10 * mx, "policy gradient %zu: step %.17g, whole batch %.17g", i,
                      gp[i], ((double *)lo->grads)[i]);
    for (size_t i = 0; i < nv; i++) ck_assert(fabs(gv[i] - ((double *)p.value.lo->grads)[i]) <= 1e-10 * (1 + fabs(gv[i])));
    for (int i = 0; i < 16; i++) ck_assert(fabs(gh[i] - ((double *)p.value.g)[i]) <= 1e-10 * (1 + fabs(gh[i])));
    free(gp);
    free(gv);
    ppo_free(&p);
    m.lora = NULL;
    lora_free(lo);
    model_free(&m);
}
END_TEST

// two epochs of two mini-batches with a learning rate: both adapters and the head move, the step repeats
// bit for bit from the same start (the shuffles are seeded), and the value state saves and loads whole
START_TEST(test_ppo_step_trains) {
    double out[2][3];
    for (int run = 0; run < 2; run++) {
        Model m;
        LoRA *lo;
        tiny(&m, &lo);
        Roll x;
        make_roll(&x, m.cfg.V);
        PpoConfig c = ppo_config_default();
        c.num_ppo_epochs = 2, c.num_mini_batches = 2, c.whiten_rewards = 1, c.kl_estimator = PPO_KL_K3;
        PpoTrainer p;
        ppo_init(&p, &c, &m, lo, B, TC, 3);
        double p0 = ((double *)lo->params)[lo->n - 1];
        PpoBatch b = {B, T, TC, x.ids, x.tg, x.start, x.len, x.trunc, x.score, 1.0f};
        OptimConfig po = {"constant", 1e-2, 0.9, 0.999, 1e-8, 0.0, 1.0, 0, 4};
        PpoStepStats st;
        ppo_step(&p, &m, lo, &b, 1, &po, 1, &st);
        ck_assert_int_eq(lo->step, 4);
        ck_assert_int_eq(p.value.step, 4);
        ck_assert(p.value.lo->step == 4 && isfinite(st.ratio_var) && isfinite(st.loss));
        double hw = 0;
        for (int i = 0; i < 16; i++) hw += fabs(((double *)p.value.w)[i]);
        ck_assert_msg(hw > 0, "the head did not move");
        ck_assert(((double *)lo->params)[lo->n - 1] != p0);
        out[run][0] = st.loss, out[run][1] = hw, out[run][2] = ((double *)lo->params)[lo->n - 1];
        if (run == 1) {  // the value state: saved, zeroed, loaded back
            char path[] = "/tmp/fp8grpo_valueXXXXXX";
            int fd = mkstemp(path);
            ck_assert(fd >= 0);
            close(fd);
            value_save_state(&p.value, path);
            double w3 = ((double *)p.value.w)[3], a7 = ((double *)p.value.lo->m)[7];
            memset(p.value.w, 0, 16 * sizeof(double));
            memset(p.value.lo->m, 0, p.value.lo->n * sizeof(double));
            p.value.step = 0;
            value_load_state(&p.value, path);
            unlink(path);
            ck_assert(((double *)p.value.w)[3] == w3 && ((double *)p.value.w_act)[3] == w3 && ((double *)p.value.lo->m)[7] == a7);
            ck_assert_int_eq(p.value.step, 4);
        }
        ppo_free(&p);
        m.lora = NULL;
        lora_free(lo);
        model_free(&m);
    }
    for (int k = 0; k < 3; k++) ck_assert_msg(out[0][k] == out[1][k], "run 2 differs from run 1 (%d)", k);
}
END_TEST

static Suite *ppo_train_suite(void) {
    Suite *s = suite_create("ppo_train");
    TCase *tc = tcase_create("ppo_train");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_value_gradient);
    tcase_add_test(tc, test_ppo_step_against_formulas);
    tcase_add_test(tc, test_ppo_step_trains);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(ppo_train_suite()); }
