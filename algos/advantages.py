"""Advantage estimators, registered by name: grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae.

Every estimator has the signature

    fn(token_rewards, response_mask, group_index, values=None, gamma=1.0, lam=1.0) -> (advantages, returns)

with `token_rewards`, `response_mask`, `values`, `advantages`, `returns` all `(B, T)` over response positions and
`group_index` a `(B,)` integer tensor (equal values = responses to the same prompt). Outputs are 0 where the mask
is 0. Rewards must sit on valid tokens: a reward at a masked position is ignored (`scalar_to_token_rewards` puts a
scalar outcome reward on the last valid token). Outcome estimators use R_i = Σ_t token_rewards·m.

`returns` is the return the advantage was built from: R_i on every valid token for the outcome estimators, the
reward-to-go G_t for REINFORCE++, and A + V (before whitening) for GAE — the critic's regression target.
Estimators that whiten (reinforce_pp*, gae) do so over all valid tokens of the batch they are given, so call them
on the global batch, not per rank.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algos.registry import register_adv_estimator
from algos.stats import masked_whiten

GRPO_EPS = 1e-6


def _valid(x: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """x with masked positions set to 0 (where, not x·m, so NaN/inf padding cannot leak)."""
    return torch.where(response_mask.bool(), x, torch.zeros_like(x))


def _outcome(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return _valid(token_rewards, response_mask).sum(-1)  # [B]


def _group_mean_std(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample group mean and unbiased std of `scores` `(B,)`; a group of size 1 gets mean 0, std 1.

    float64, so an all-equal group gives R − mean = 0 exactly rather than rounding noise that /1e-6 would amplify.
    """
    dtype, scores = scores.dtype, scores.double()
    _, inv = torch.unique(torch.as_tensor(group_index, device=scores.device), return_inverse=True)  # [B]
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    count = scores.new_zeros(n_groups).index_add_(0, inv, torch.ones_like(scores))  # [G]
    mean = scores.new_zeros(n_groups).index_add_(0, inv, scores) / count  # [G]
    sq = scores.new_zeros(n_groups).index_add_(0, inv, (scores - mean[inv]) ** 2)  # [G]
    std = (sq / (count - 1).clamp(min=1)).sqrt()  # [G]
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[inv].to(dtype), std[inv].to(dtype)  # [B], [B]


def _group_size(group_index: torch.Tensor, device: torch.device) -> torch.Tensor:
    _, inv, counts = torch.unique(torch.as_tensor(group_index, device=device), return_inverse=True, return_counts=True)
    return counts[inv]  # [B]


def _broadcast(per_seq: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_seq[:, None] * response_mask.to(per_seq.dtype)  # [B, T]


def _reward_to_go(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = Σ_{s≥t} γ^{s−t} r_s over valid tokens only (masked env/padding tokens are skipped, not reset)."""
    m = response_mask.to(token_rewards.dtype)
    token_rewards = _valid(token_rewards, response_mask)
    out = torch.zeros_like(token_rewards)  # [B, T]
    running = token_rewards.new_zeros(token_rewards.shape[0])  # [B]
    for t in reversed(range(token_rewards.shape[-1])):
        running = torch.where(m[:, t] > 0, token_rewards[:, t] + gamma * running, running)
        out[:, t] = running * m[:, t]
    return out


@register_adv_estimator("grpo", per_group=True)
@torch.no_grad()
def grpo(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """GRPO: Â_i = (R_i − mean_g R) / (std_g R + 1e-6), std unbiased; a group of size 1 uses mean 0, std 1."""
    R = _outcome(token_rewards, response_mask)  # [B]
    mean, std = _group_mean_std(R, group_index)
    adv = (R - mean) / (std + GRPO_EPS)  # [B]
    return _broadcast(adv, response_mask), _broadcast(R, response_mask)


@register_adv_estimator("demo", demos=True)
@torch.no_grad()
def demo(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Demonstrations (SFT, `--algo sft`): every demonstrated token's advantage is 1, whatever the episode's reward;
    with the `nll` loss the step is supervised fine-tuning on the assistant's tokens (observations stay masked)."""
    R = _outcome(token_rewards, response_mask)  # [B]
    return response_mask.to(token_rewards.dtype), _broadcast(R, response_mask)


@register_adv_estimator("dr_grpo", per_group=True)
@torch.no_grad()
def dr_grpo(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Dr. GRPO: Â_i = R_i − mean_g R (no std division); a group of size 1 uses mean 0 like GRPO, so Â = R."""
    R = _outcome(token_rewards, response_mask)  # [B]
    mean, _ = _group_mean_std(R, group_index)
    return _broadcast(R - mean, response_mask), _broadcast(R, response_mask)


@register_adv_estimator("rloo", per_group=True)
@torch.no_grad()
def rloo(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """RLOO: Â_i = R_i − mean_{j≠i} R_j = n/(n−1)·(R_i − mean_g R); a group of size 1 has no baseline → Â = 0."""
    R = _outcome(token_rewards, response_mask)  # [B]
    n = _group_size(group_index, R.device).to(R.dtype)  # [B]
    mean, _ = _group_mean_std(R, group_index)  # size-1 groups: mean 0, zeroed below anyway
    adv = torch.where(n > 1, n / (n - 1).clamp(min=1) * (R - mean), torch.zeros_like(R))  # [B]
    return _broadcast(adv, response_mask), _broadcast(R, response_mask)


@register_adv_estimator("reinforce_pp")
@torch.no_grad()
def reinforce_pp(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: reward-to-go G_t (token rewards incl. any KL-in-reward), whitened over the batch's valid tokens."""
    G = _reward_to_go(token_rewards, response_mask, gamma)  # [B, T]
    return masked_whiten(G, response_mask), G


@register_adv_estimator("reinforce_pp_baseline")
@torch.no_grad()
def reinforce_pp_baseline(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline: (R_i − mean_g R) on every valid token, then whitened over the batch's valid tokens."""
    R = _outcome(token_rewards, response_mask)  # [B]
    mean, _ = _group_mean_std(R, group_index)
    adv = _broadcast(R - mean, response_mask)  # [B, T]
    return masked_whiten(adv, response_mask), _broadcast(R, response_mask)


@register_adv_estimator("gae", needs_values=True)
@torch.no_grad()
def gae(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """GAE: δ_t = r_t + γV_{t+1} − V_t, A_t = δ_t + γλA_{t+1}, run backwards over valid tokens only.

    "t+1" is the next *valid* token (env tokens inside a multi-turn response are skipped), V after the last valid
    token is 0. returns = A + V; advantages are then whitened over valid tokens.
    """
    if values is None:
        raise ValueError("adv_estimator 'gae' needs `values` from a critic (use the 'ppo' preset or pass values=)")
    m = response_mask.to(token_rewards.dtype)
    token_rewards = _valid(token_rewards, response_mask)  # [B, T]
    values = _valid(values.to(token_rewards.dtype), response_mask)  # [B, T]
    adv = torch.zeros_like(token_rewards)  # [B, T]
    next_value = token_rewards.new_zeros(token_rewards.shape[0])  # [B]
    next_adv = token_rewards.new_zeros(token_rewards.shape[0])  # [B]
    for t in reversed(range(token_rewards.shape[-1])):
        valid = m[:, t] > 0
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * next_adv
        next_value = torch.where(valid, values[:, t], next_value)
        next_adv = torch.where(valid, a_t, next_adv)
        adv[:, t] = a_t * m[:, t]
    returns = (adv + values) * m
    return masked_whiten(adv, response_mask), returns


def scale_negative(advantages: Tensor, scale: float) -> Tensor:
    """Advantages with every negative entry multiplied by `scale` (same shape; positive and zero entries unchanged).

    scale = 1 is the estimator's own advantage; scale = 0 learns only from better-than-average samples, as
    rejection-sampling fine-tuning (RAFT) does; in between, negative samples are down-weighted. A small agent whose
    failures far outnumber its successes otherwise spends most of each gradient pushing its own sampled actions
    down, which moves the freed mass onto actions it never tried."""
    if scale < 0:
        raise ValueError(f"scale must be >= 0, got {scale}")
    return advantages if scale == 1 else torch.where(advantages < 0, advantages * scale, advantages)
