#!/usr/bin/env python3
"""dev/grpo_reference.py: the independent truth for grpo.c.

Writes test/fixtures/grpo/*.npy: a seeded random batch (log-probabilities of the
policy, the rollout-time policy, the reference and the rollout engine; masks,
truncated flags, advantages, rewards) and, for each configuration in CASES, the
loss, dL/dlogp and the logged metrics, computed the way TRL's GRPOTrainer does
(the 0.2x line, v0.25+: _generate_and_score_completions for the advantages and the
IS weights, _compute_loss for the loss). The forward formulas are written here in
torch float64 and the gradient comes from autograd, so the hand-derived gradient
in grpo.c is checked against something it shares no code or algebra with. Also
the LR schedule (transformers.get_cosine_schedule_with_warmup) and the grad-norm
clip factor (torch.nn.utils.clip_grad_norm_).

    python3 dev/grpo_reference.py          # rewrites test/fixtures/grpo/
    make test                              # test/test_grpo.c compares with it

Needs numpy and torch (transformers for the schedule).
"""
import math
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures", "grpo")

# Each case: a name and GRPOConfig options by TRL's name (parsed by grpo_config_set
# in the C test, so the parser is exercised too), plus two switches of the inputs:
# old=0 passes no old_logp (num_iterations == 1: TRL uses logp.detach()), is=1
# passes the rollout engine's logprobs (sampling_logp).
BASE = dict(beta=0.04, epsilon=0.2, epsilon_high=0.28, max_completion_length=10, vllm_importance_sampling_cap=2.0)
CASES = [
    ("grpo", dict(loss_type="grpo")),
    ("bnpo", dict(loss_type="bnpo")),
    ("dr_grpo", dict(loss_type="dr_grpo")),
    ("dapo", dict(loss_type="dapo")),
    ("dapo_detach_nobeta", dict(loss_type="dapo", beta=0.0, old=0)),
    ("grpo_eps_sym", dict(loss_type="grpo", epsilon=0.1, epsilon_high="none")),
    ("gspo_grpo", dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.05, epsilon_high=0.08)),
    ("gspo_dapo", dict(loss_type="dapo", importance_sampling_level="sequence", epsilon=0.05, epsilon_high=0.08)),
    ("gspo_detach", dict(loss_type="dr_grpo", importance_sampling_level="sequence", old=0)),
    ("is_token_truncate", dict(loss_type="dapo", vllm_importance_sampling_mode="token_truncate", is_=1)),
    ("is_token_mask", dict(loss_type="dapo", vllm_importance_sampling_mode="token_mask", is_=1)),
    ("is_sequence_truncate", dict(loss_type="dapo", vllm_importance_sampling_mode="sequence_truncate", is_=1)),
    ("is_sequence_mask", dict(loss_type="grpo", vllm_importance_sampling_mode="sequence_mask", is_=1)),
    ("is_off_by_flag", dict(loss_type="dapo", vllm_importance_sampling_correction="false", is_=1)),
    ("gspo_is_token_mask", dict(loss_type="bnpo", importance_sampling_level="sequence", epsilon=0.05,
                                vllm_importance_sampling_mode="token_mask", is_=1)),
    ("is_detach", dict(loss_type="dapo", vllm_importance_sampling_mode="token_truncate", is_=1, old=0)),
    ("masktrunc_grpo", dict(loss_type="grpo", mask_truncated_completions="true")),
    ("masktrunc_bnpo", dict(loss_type="bnpo", mask_truncated_completions="true")),
    ("masktrunc_dr_grpo", dict(loss_type="dr_grpo", mask_truncated_completions="true")),
    ("masktrunc_dapo_is_seq", dict(loss_type="dapo", mask_truncated_completions="true",
                                   vllm_importance_sampling_mode="sequence_truncate", is_=1)),
    ("masktrunc_gspo", dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.05,
                            mask_truncated_completions="true")),
]
METRICS = ["loss", "kl", "clip_low", "clip_high", "clip_region", "is_min", "is_mean", "is_max", "delta_mean", "delta_max"]

B, G, T = 8, 4, 7
LENGTHS = [7, 3, 5, 7, 1, 4, 7, 6]
TRUNCATED = [1, 0, 0, 1, 0, 0, 0, 0]  # 0 and 3 hit T without EOS; 6 ended with EOS at the last position


def make_batch(seed=1234):
    rng = np.random.default_rng(seed)
    mask = np.zeros((B, T), dtype=np.uint8)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
    logp = -rng.uniform(0.05, 3.0, (B, T))
    old = logp + rng.normal(0, 0.25, (B, T))
    ref = logp + rng.normal(0, 0.3, (B, T))
    samp = old + rng.normal(0, 0.35, (B, T))
    # advantages of both signs, one exactly 0, so every clip counter has something to count
    adv = np.array([-1.3, 0.9, 0.8, 1.2, -0.5, 0.0, 0.7, -1.6]) + rng.normal(0, 0.05, B)
    adv[5] = 0.0
    # padding holds what a careless reader would choke on: the C side must never read it
    m = mask.astype(bool)
    logp[~m] = -np.inf
    old[~m] = np.nan
    ref[~m] = np.nan
    samp[~m] = 0.0  # TRL pads the engine's logprobs with 0
    return dict(mask=mask, truncated=np.array(TRUNCATED, dtype=np.uint8), logp=logp, old_logp=old, ref_logp=ref,
                sampling_logp=samp, advantages=adv)


def case_config(opts):
    c = dict(BASE)
    c.update(opts)
    old = c.pop("old", 1)
    is_ = c.pop("is_", 0)
    cfg = dict(loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=None, importance_sampling_level="token",
               mask_truncated_completions=False, vllm_importance_sampling_correction=True,
               vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_cap=3.0,
               max_completion_length=256)
    for k, v in c.items():
        if v in ("true", "false"):
            v = v == "true"
        if v == "none":
            v = None
        cfg[k] = v
    if cfg["epsilon_high"] is None:
        cfg["epsilon_high"] = cfg["epsilon"]
    return cfg, bool(old), bool(is_)


def trl_loss(cfg, batch, use_old, use_is):
    """TRL's loss on one batch (= one micro-batch holding the whole step), float64."""
    m0 = torch.tensor(batch["mask"], dtype=torch.float64)
    valid = m0.bool()
    clean = lambda x: torch.where(valid, torch.tensor(x), torch.zeros(()))  # what a model gives at pads: finite values
    logp = clean(batch["logp"]).clone().requires_grad_(True)
    ref = clean(batch["ref_logp"])
    samp = clean(batch["sampling_logp"])
    old = clean(batch["old_logp"]) if use_old else None
    adv = torch.tensor(batch["advantages"])
    truncated = torch.tensor(batch["truncated"]).bool()

    # _generate: num_items_in_batch counts the completion tokens before truncated ones are masked
    num_items_in_batch = m0.sum()
    mask = m0 * (~truncated).unsqueeze(1).double() if cfg["mask_truncated_completions"] else m0

    # _generate_and_score_completions: old logps (no grad) and the IS weight
    old_eff = old if old is not None else logp.detach()
    is_on = use_is and cfg["vllm_importance_sampling_correction"]
    metrics = dict.fromkeys(METRICS, float("nan"))
    if is_on:
        mode = cfg["vllm_importance_sampling_mode"]
        diff = (old_eff - samp) * mask
        seq = mode.startswith("sequence")
        if seq:
            diff = diff.sum(-1, keepdim=True)
        ratio = torch.exp(diff)
        if mode.endswith("truncate"):
            ratio = torch.clamp(ratio, max=cfg["vllm_importance_sampling_cap"])
        else:
            ratio = ratio.masked_fill(ratio > cfg["vllm_importance_sampling_cap"], 0.0)
        delta = torch.abs(old_eff - samp)[mask.bool()]
        metrics["delta_mean"] = delta.mean().item() if delta.numel() else 0.0
        metrics["delta_max"] = delta.max().item() if delta.numel() else 0.0
        flat = ratio.flatten() if seq else ratio[mask.bool()]
        metrics["is_min"], metrics["is_mean"], metrics["is_max"] = flat.min().item(), flat.mean().item(), flat.max().item()

    # _compute_loss
    log_ratio = logp - old_eff
    if cfg["importance_sampling_level"] == "token":
        liw = log_ratio
    else:
        liw = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(liw)
    coef_2 = torch.clamp(coef_1, 1 - cfg["epsilon"], 1 + cfg["epsilon_high"])
    A = adv.unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * A, coef_2 * A)
    if is_on:
        per_token_loss = per_token_loss * ratio
    per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    if cfg["beta"] != 0.0:
        per_token_loss = per_token_loss + cfg["beta"] * per_token_kl
    lt = cfg["loss_type"]
    if lt == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif lt == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif lt == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * cfg["max_completion_length"])
    elif lt == "dapo":
        loss = (per_token_loss * mask).sum() / num_items_in_batch
    loss.backward()

    count = mask.sum().clamp(min=1.0)
    bmean = lambda x: x.mean() if x.shape[1] == 1 else (x * mask).sum() / count
    metrics["loss"] = loss.item()
    metrics["kl"] = bmean(per_token_kl).item()  # the C side logs kl whenever ref_logp is given
    low = (coef_1 < 1 - cfg["epsilon"]) & (A < 0)
    high = (coef_1 > 1 + cfg["epsilon_high"]) & (A > 0)
    metrics["clip_low"] = bmean(low.double()).item()
    metrics["clip_high"] = bmean(high.double()).item()
    metrics["clip_region"] = bmean((low | high).double()).item()
    return loss.item(), logp.grad.numpy().copy(), np.array([metrics[k] for k in METRICS])


def advantages(rewards, weights, G, scale):
    """_generate_and_score_completions: weighted nansum, group-centred, scaled by the group or batch std."""
    r_pf = torch.tensor(rewards)
    r = (r_pf * torch.tensor(weights).unsqueeze(0)).nansum(dim=1)
    mean_g = r.view(-1, G).mean(dim=1).repeat_interleave(G, dim=0)
    adv = r - mean_g
    if scale in ("group", "none"):
        std = r.view(-1, G).std(dim=1).repeat_interleave(G, dim=0)
    else:
        std = r.std().expand_as(r)
    zero = torch.isclose(std, torch.zeros_like(std))
    if scale != "none":
        adv = adv / (std + 1e-4)

    def nanstd(x):
        v = torch.nanmean((x - torch.nanmean(x)) ** 2)
        n = torch.sum(~torch.isnan(x))
        return torch.sqrt(v * n / (n - 1))

    met = [mean_g.mean().item(), std.mean().item(), zero.double().mean().item()]
    for k in range(r_pf.shape[1]):
        met += [torch.nanmean(r_pf[:, k]).item(), nanstd(r_pf[:, k]).item()]
    return adv.numpy(), np.array(met)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_default_dtype(torch.float64)
    batch = make_batch()
    for k, v in batch.items():
        np.save(os.path.join(OUT, f"{k}.npy"), v)

    lines = []
    for name, opts in CASES:
        cfg, use_old, use_is = case_config(opts)
        loss, grad, met = trl_loss(cfg, batch, use_old, use_is)
        assert np.all(np.isfinite(grad)) and np.isfinite(loss), name
        np.save(os.path.join(OUT, f"case_{name}_dlogp.npy"), grad)
        np.save(os.path.join(OUT, f"case_{name}_metrics.npy"), met)
        kv = dict(BASE)
        kv.update(opts)
        kv.setdefault("old", 1)
        kv.setdefault("is_", 0)
        lines.append(name + " " + " ".join(f"{'is' if k == 'is_' else k}={v}" for k, v in kv.items()))
        print(f"{name:24s} loss {loss:+.6f}  " + " ".join(f"{k}={x:.4g}" for k, x in zip(METRICS[1:], met[1:])))
    with open(os.path.join(OUT, "cases.txt"), "w") as f:
        f.write("# name option=value ... (TRL names; old=0: no old_logp; is=1: pass sampling_logp). Made by dev/grpo_reference.py\n")
        f.write("\n".join(lines) + "\n")

    # advantages: 3 groups of 4, two reward functions; group 2 has zero spread; a NaN = "not applicable"
    rng = np.random.default_rng(99)
    rewards = np.stack([rng.integers(0, 2, 12).astype(np.float64), rng.choice([0.0, 0.5, 1.0], 12)], axis=1)
    rewards[4:8] = [1.0, 0.5]
    rewards[9, 1] = np.nan
    weights = np.array([1.0, 0.3])
    np.save(os.path.join(OUT, "rewards.npy"), rewards)
    np.save(os.path.join(OUT, "reward_weights.npy"), weights)
    for scale in ("group", "batch", "none"):
        adv, met = advantages(rewards, weights, 4, scale)
        np.save(os.path.join(OUT, f"adv_{scale}.npy"), adv)
        np.save(os.path.join(OUT, f"adv_{scale}_metrics.npy"), met)
        print(f"adv {scale:5s}", np.round(adv, 4), "metrics", np.round(met, 4))

    # LR schedule: transformers' cosine with warmup; rows (lr at step) for base 1e-3, warmup 3, total 20
    from transformers import get_cosine_schedule_with_warmup
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1e-3)
    sch = get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=20)
    lrs = []
    for _ in range(23):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    np.save(os.path.join(OUT, "schedule_w3_t20.npy"), np.array(lrs))

    # clip factor: clip_grad_norm_ on a gradient of known norm; rows (norm, max_norm, factor applied)
    rows = []
    for norm, max_norm in [(2.0, 1.0), (0.5, 1.0), (1.0, 1.0), (1e-9, 1.0), (37.5, 0.3)]:
        q = torch.nn.Parameter(torch.zeros(2))
        q.grad = torch.tensor([norm * 0.6, norm * 0.8])
        torch.nn.utils.clip_grad_norm_([q], max_norm)
        rows.append([norm, max_norm, (q.grad.norm() / norm).item()])
    np.save(os.path.join(OUT, "clip.npy"), np.array(rows))
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
