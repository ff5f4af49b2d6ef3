#!/usr/bin/env python3
"""dev/make_ppo_fixture.py: the independent truth for ppo.c.

Writes test/fixtures/ppo/: a seeded batch of B completions of T tokens with their lengths, the
rollout's log-probs, the reference's, the current policy's, the rollout's values, the current value
predictions and the scores, and for each configuration in CASES what TRL's PPOTrainer computes
from them (trl/experimental/ppo/ppo_trainer.py, read at trl f2cd577, its train() loop): the masks
(padding_mask, padding_mask_p1), the INVALID_LOGPROB and zero fills, the per-token rewards (k1 or
k3 KL, the score at actual_end), whiten_rewards, GAE, the returns, the whitened advantages, and the
policy and value losses with their clip fractions. masked_mean / masked_var / masked_whiten are
TRL's, written in NumPy float64 (no torch needed).

    python3 dev/make_ppo_fixture.py     # rewrites test/fixtures/ppo/
    make build/test_ppo && ./build/test_ppo

Needs numpy.
"""
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures", "ppo")
B, T = 6, 10
INVALID_LOGPROB = 1.0

CASES = [  # name, PPOConfig options by TRL's name (defaults otherwise)
    ("default", dict()),
    ("k3_whiten", dict(kl_estimator="k3", whiten_rewards=True, gamma=0.99, lam=0.9, cliprange=0.1,
                       cliprange_value=0.3, vf_coef=0.5, kl_coef=0.2)),
]
DEFAULTS = dict(cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, gamma=1.0, lam=0.95, kl_coef=0.05,
                kl_estimator="k1", whiten_rewards=False)


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def masked_var(values, mask):
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    s = mask.sum()
    return variance * (s / (s - 1))


def masked_whiten(values, mask, shift_mean=True):
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    w = (values - mean) / np.sqrt(var + 1e-8)
    if not shift_mean:
        w = w + mean
    return w


def main():
    rng = np.random.default_rng(20261128)
    seq_len = np.array([9, 3, 7, 0, 5, 8])  # TRL's sequence_lengths: the index of the last token
    logprobs = -rng.exponential(1.0, (B, T))
    ref_logprobs = logprobs + 0.3 * rng.standard_normal((B, T))
    new_logprobs = logprobs + 0.25 * rng.standard_normal((B, T))  # the policy after some updates
    values = rng.standard_normal((B, T))
    vpred = values + 0.4 * rng.standard_normal((B, T))
    scores = rng.standard_normal(B) * 2
    idx = np.tile(np.arange(T), (B, 1))
    padding_mask = idx > seq_len[:, None]
    seq_p1 = seq_len + 1
    padding_mask_p1 = idx > seq_p1[:, None]
    logprobs = np.where(padding_mask, INVALID_LOGPROB, logprobs)
    ref_logprobs = np.where(padding_mask, INVALID_LOGPROB, ref_logprobs)
    new_logprobs = np.where(padding_mask, INVALID_LOGPROB, new_logprobs)
    values = np.where(padding_mask_p1, 0.0, values)
    vpred = np.where(padding_mask_p1, 0.0, vpred)
    actual_end = np.where(seq_p1 < T, seq_p1, seq_len)
    os.makedirs(OUT, exist_ok=True)
    inputs = dict(logprobs=logprobs, ref_logprobs=ref_logprobs, new_logprobs=new_logprobs, values=values,
                  vpred=vpred, scores=scores, end=actual_end.astype(np.float64),
                  mask=(~padding_mask).astype(np.float64), vmask=(~padding_mask_p1).astype(np.float64))
    for k, v in inputs.items():
        np.save(os.path.join(OUT, f"in_{k}.npy"), v.astype(np.float64))
    for name, opts in CASES:
        a = dict(DEFAULTS, **opts)
        logr = ref_logprobs - logprobs
        kl = -logr if a["kl_estimator"] == "k1" else (np.exp(logr) - 1) - logr
        rewards = -a["kl_coef"] * kl
        rewards[np.arange(B), actual_end] += scores
        if a["whiten_rewards"]:
            rewards = masked_whiten(rewards, ~padding_mask_p1, shift_mean=False)
            rewards = np.where(padding_mask_p1, 0.0, rewards)
        lastgaelam = 0
        rev = []
        for t in reversed(range(T)):
            nextvalues = values[:, t + 1] if t < T - 1 else 0.0
            delta = rewards[:, t] + a["gamma"] * nextvalues - values[:, t]
            lastgaelam = delta + a["gamma"] * a["lam"] * lastgaelam
            rev.append(lastgaelam)
        advantages = np.stack(rev[::-1], axis=1)
        returns = advantages + values
        advantages = masked_whiten(advantages, ~padding_mask)
        advantages = np.where(padding_mask, 0.0, advantages)
        # the losses, as one micro-batch of the whole batch
        vpredclipped = np.clip(vpred, values - a["cliprange_value"], values + a["cliprange_value"])
        vf_losses1 = np.square(vpred - returns)
        vf_losses2 = np.square(vpredclipped - returns)
        vf_loss = 0.5 * masked_mean(np.maximum(vf_losses1, vf_losses2), ~padding_mask_p1)
        vf_clipfrac = masked_mean((vf_losses2 > vf_losses1).astype(np.float64), ~padding_mask_p1)
        logprobs_diff = new_logprobs - logprobs
        ratio = np.exp(logprobs_diff)
        pg_losses = -advantages * ratio
        pg_losses2 = -advantages * np.clip(ratio, 1.0 - a["cliprange"], 1.0 + a["cliprange"])
        pg_loss = masked_mean(np.maximum(pg_losses, pg_losses2), ~padding_mask)
        pg_clipfrac = masked_mean((pg_losses2 > pg_losses).astype(np.float64), ~padding_mask)
        loss = pg_loss + a["vf_coef"] * vf_loss
        approxkl = 0.5 * (logprobs_diff ** 2).mean()
        np.save(os.path.join(OUT, f"{name}_rewards.npy"), rewards)
        np.save(os.path.join(OUT, f"{name}_advantages.npy"), advantages)
        np.save(os.path.join(OUT, f"{name}_returns.npy"), returns)
        np.save(os.path.join(OUT, f"{name}_stats.npy"),
                np.array([loss, pg_loss, vf_loss, pg_clipfrac, vf_clipfrac, approxkl], dtype=np.float64))
        print(f"{name}: loss {loss:.6f} (pg {pg_loss:.6f}, vf {vf_loss:.6f}), clipfrac pg {pg_clipfrac:.3f} "
              f"vf {vf_clipfrac:.3f}")


if __name__ == "__main__":
    main()
