#!/usr/bin/env python3
"""dev/make_dpo_fixture.py: the independent truth for dpo.c.

Writes test/fixtures/dpo/: a seeded batch of preference pairs (the policy's and the reference's
summed completion log-probs, chosen and rejected, and each completion's token count) and, for each
configuration in CASES, every pair's loss, its gradient with respect to the policy's summed
log-probs, and TRL's metrics. The formulas are TRL's DPOTrainer (v0.28.0, the last of the 0.2x
line): dpo_loss line by line, the ipo division by the completion length from concatenated_forward,
the metrics from get_batch_loss_metrics; written here in NumPy (no torch needed), with torch's
F.logsigmoid / F.sigmoid / torch.relu as the functions below.

The gradient comes from the complex step, d f(x) / dx = Im f(x + i h) / h with h = 1e-30: exact to
float64 rounding (no difference of two nearby values is taken), and sharing no algebra with the
hand-derived gradients of dpo.c.

And TRL's evaluation (DPOTrainer.evaluate in TRL 1.16, through transformers' Trainer.evaluation_loop)
of the same pairs in batches of EVAL_BATCH, the last one short: eval_loss the mean of every pair's
loss (the Trainer repeats each batch's mean loss batch-size times, then takes the mean), each other
metric the mean of the batches' means (DPOTrainer.log averages what _compute_loss appended a batch).

    python3 dev/make_dpo_fixture.py    # rewrites test/fixtures/dpo/
    make build/test_dpo && ./build/test_dpo

Needs numpy.
"""
import math
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures", "dpo")
N = 24  # pairs
H = 1e-30  # the complex step
EVAL_BATCH = 5  # per_device_eval_batch_size: 24 pairs are batches of 5, 5, 5, 5 and 4
EVAL_CASES = ["sigmoid", "ipo", "sppo_hard"]

# name, DPOConfig options by TRL's name (the C test parses them as train_dpo's options are parsed)
CASES = [
    ("sigmoid", dict(loss_type="sigmoid", beta=0.1)),
    ("sigmoid_smooth", dict(loss_type="sigmoid", beta=0.5, label_smoothing=0.2)),
    ("sigmoid_ref_free", dict(loss_type="sigmoid", beta=0.1, reference_free=1)),
    ("robust", dict(loss_type="robust", beta=0.3, label_smoothing=0.1)),
    ("exo_pair", dict(loss_type="exo_pair", beta=0.1)),
    ("exo_pair_smooth", dict(loss_type="exo_pair", beta=0.2, label_smoothing=0.2)),
    ("hinge", dict(loss_type="hinge", beta=0.1)),
    ("hinge_b05", dict(loss_type="hinge", beta=0.5)),
    ("ipo", dict(loss_type="ipo", beta=0.1)),
    ("ipo_ref_free", dict(loss_type="ipo", beta=0.5, reference_free=1)),
    ("nca_pair", dict(loss_type="nca_pair", beta=0.2)),
    ("nca_pair_ref_free", dict(loss_type="nca_pair", beta=0.2, reference_free=1)),
    ("sppo_hard", dict(loss_type="sppo_hard", beta=0.1)),
    ("apo_zero", dict(loss_type="apo_zero", beta=0.1)),
    ("apo_zero_ref_free", dict(loss_type="apo_zero", beta=0.1, reference_free=1)),
    ("apo_down", dict(loss_type="apo_down", beta=0.2)),
    ("discopop", dict(loss_type="discopop", beta=0.1, discopop_tau=0.05)),
    ("discopop_ref_free", dict(loss_type="discopop", beta=0.05, discopop_tau=0.2, reference_free=1)),
]
METRICS = ["loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected"]


# torch's functions, for real or complex float64 arrays (the branch chosen by the real part, as the
# complex step needs: the imaginary part rides along)
def logsigmoid(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(np.real(x) < 0, x - np.log1p(np.exp(x)), -np.log1p(np.exp(-x)))


def sigmoid(x):
    return np.exp(logsigmoid(x))


def relu(x):
    return np.where(np.real(x) > 0, x, 0 * x)


def dpo_loss(c, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps):
    """TRL v0.28.0 DPOTrainer.dpo_loss, reverse KL (the default f_divergence_type)."""
    beta, ls, reference_free = c["beta"], c["label_smoothing"], c["reference_free"]
    loss_type = c["loss_type"]
    chosen_logratios = chosen_logps - (not reference_free) * ref_chosen_logps
    rejected_logratios = rejected_logps - (not reference_free) * ref_rejected_logps
    logratios = chosen_logps - rejected_logps
    ref_logratios = 0.0 if reference_free else ref_chosen_logps - ref_rejected_logps
    logits = logratios - ref_logratios
    if loss_type == "sigmoid":
        losses = -logsigmoid(beta * logits) * (1 - ls) - logsigmoid(-beta * logits) * ls
    elif loss_type == "robust":
        losses = (-logsigmoid(beta * logits) * (1 - ls) + logsigmoid(-beta * logits) * ls) / (1 - 2 * ls)
    elif loss_type == "exo_pair":
        if ls == 0:
            ls = 1e-3
        losses = sigmoid(beta * logits) * (logsigmoid(beta * logits) - math.log(1 - ls)) + sigmoid(-beta * logits) * (
            logsigmoid(-beta * logits) - math.log(ls))
    elif loss_type == "hinge":
        losses = relu(1 - beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    elif loss_type == "sppo_hard":
        a = chosen_logps - ref_chosen_logps
        b = rejected_logps - ref_rejected_logps
        losses = (a - 0.5 / beta) ** 2 + (b + 0.5 / beta) ** 2
    elif loss_type == "nca_pair":
        chosen_rewards = (chosen_logps - ref_chosen_logps) * beta
        rejected_rewards = (rejected_logps - ref_rejected_logps) * beta
        losses = -logsigmoid(chosen_rewards) - 0.5 * logsigmoid(-chosen_rewards) - 0.5 * logsigmoid(-rejected_rewards)
    elif loss_type == "apo_zero":
        losses = (1 - sigmoid(beta * chosen_logratios)) + sigmoid(beta * rejected_logratios)
    elif loss_type == "apo_down":
        losses = sigmoid(beta * chosen_logratios) + (1 - sigmoid(beta * (chosen_logratios - rejected_logratios)))
    elif loss_type == "discopop":
        logratios = chosen_logps - rejected_logps
        ref_logratios = ref_chosen_logps - ref_rejected_logps
        logits = (logratios - ref_logratios) * beta
        log_ratio_modulation = sigmoid(logits / c["discopop_tau"])
        losses = -logsigmoid(logits) * (1 - log_ratio_modulation) + np.exp(-logits) * log_ratio_modulation
    else:
        raise ValueError(loss_type)
    chosen_rewards = beta * (chosen_logps - ref_chosen_logps)
    rejected_rewards = beta * (rejected_logps - ref_rejected_logps)
    return losses, chosen_rewards, rejected_rewards


def case(c, pc, pr, rc, rr, tc, tr):
    """Every pair's loss and gradient (of the batch's mean loss) with respect to the summed policy
    log-probs, and the metrics, as get_batch_loss_metrics logs them."""
    def run(dc, dr):
        a, b, x, y = pc + dc, pr + dr, rc, rr
        if c["loss_type"] == "ipo":  # concatenated_forward: all_logps / loss_mask.sum(-1), policy and reference
            a, b, x, y = a / tc, b / tr, x / tc, y / tr
        losses, cr, rj = dpo_loss(c, a, b, x, y)
        return losses, cr, rj, a, b
    losses, cr, rj, a, b = run(0, 0)
    # each pair's loss depends on its own log-probs only: one complex step for every pair at once
    dchosen = np.imag(run(1j * H, 0)[0]) / H / len(pc)
    drejected = np.imag(run(0, 1j * H)[0]) / H / len(pc)
    losses, cr, rj, a, b = [np.real(v) for v in (losses, cr, rj, a, b)]
    metrics = [losses.mean(), cr.mean(), rj.mean(), (cr > rj).astype(np.float64).mean(), (cr - rj).mean(), a.mean(),
               b.mean()]
    return np.stack([losses, dchosen, drejected], axis=1), np.array(metrics)


def eval_case(c, pc, pr, rc, rr, tc, tr):
    """TRL's evaluation metrics of the pairs in batches of EVAL_BATCH (METRICS' order, "eval_" + each)."""
    losses, means = [], []
    for i0 in range(0, len(pc), EVAL_BATCH):
        sl = slice(i0, i0 + EVAL_BATCH)
        _, m = case(c, pc[sl], pr[sl], rc[sl], rr[sl], tc[sl], tr[sl])  # the batch's metrics, m[0] its mean loss
        losses.append(np.repeat(m[0], len(pc[sl])))  # evaluation_loop: loss.repeat(batch_size)
        means.append(m)
    return np.array([np.concatenate(losses).mean()] + list(np.mean(means, axis=0)[1:]))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261128)
    tc = rng.integers(1, 24, N).astype(np.float64)  # completion tokens
    tr = rng.integers(1, 24, N).astype(np.float64)
    pc = -tc * rng.uniform(0.1, 2.0, N)  # summed log-probs, about -0.1 to -2 a token
    pr = -tr * rng.uniform(0.1, 2.0, N)
    rc = pc + rng.normal(0, 6, N)  # the reference: log-ratios of a few nats either way, so that every
    rr = pr + rng.normal(0, 6, N)  # loss's branches (hinge's kink, the sigmoids' tails) are visited
    rc, rr = np.minimum(rc, -0.05), np.minimum(rr, -0.05)
    np.save(os.path.join(OUT, "pairs.npy"), np.stack([pc, pr, rc, rr, tc, tr], axis=1))
    lines = ["# name option=value ... (TRL's DPOConfig names). Made by dev/make_dpo_fixture.py; pairs.npy: (N, 6) chosen_logps, "
             "rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_tokens, rejected_tokens; <name>_pairs.npy: "
             "(N, 3) each pair's loss, d mean loss / d chosen_logps, d mean loss / d rejected_logps; <name>_metrics.npy: "
             + ", ".join(METRICS) + f"; <name>_eval.npy: the eval_ metrics in batches of {EVAL_BATCH} (the cases {', '.join(EVAL_CASES)})"]
    for name, opts in CASES:
        c = dict(beta=0.1, label_smoothing=0.0, reference_free=0, discopop_tau=0.05)
        c.update(opts)
        per, metrics = case(c, pc, pr, rc, rr, tc, tr)
        np.save(os.path.join(OUT, f"{name}_pairs.npy"), per)
        np.save(os.path.join(OUT, f"{name}_metrics.npy"), metrics)
        if name in EVAL_CASES:
            np.save(os.path.join(OUT, f"{name}_eval.npy"), eval_case(c, pc, pr, rc, rr, tc, tr))
        lines.append(name + " " + " ".join(f"{k}={v}" for k, v in c.items()))
    with open(os.path.join(OUT, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(CASES)} cases of {N} pairs to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
