"""Rollout correction for the vLLM-vs-trainer mismatch (TIS / MIS, token or sequence level) and its metrics.

The sampler (vLLM) and the trainer compute slightly different log-probs for the same tokens (kernels, bf16,
stale weights), so the data are off-policy by ρ = π_old(trainer) / π_vllm. Healthy bf16 runs show a mean
|Δlogp| of ~0.01–0.02; ~0.2 means the sampler's weights are stale. `mismatch_metrics` is meant to be logged every
step, correction on or off; `mismatch_by_origin` splits it by the weights that sampled each token (partial rollouts).
"""

from __future__ import annotations

import math

import torch

from algos.kl import kl_penalty
from algos.stats import masked_mean, masked_quantile

LEVELS = ("none", "token", "sequence")
MODES = ("truncate", "mask")
CORRECTIONS = ("auto", "off", "tis", "mis", "seq-tis", "seq-mis")
"""`AlgoConfig.rollout_correction`'s names; each of tis / mis / seq-tis / seq-mis is one (level, mode) below."""
_RULES = {"tis": ("token", "truncate"), "mis": ("token", "mask"), "seq-tis": ("sequence", "truncate")}
_RULES["seq-mis"] = ("sequence", "mask")
LOG_RATIO_CLAMP = 20.0


@torch.no_grad()
def mismatch_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """mean/max/p99 of |logπ_old − logπ_vllm| over valid tokens and the k3 KL(π_vllm‖π_old) (samples from vLLM);
    NaN over no valid token (a statistic of nothing, not a reassuring 0)."""
    m = response_mask.bool()
    if not m.any():
        return dict.fromkeys(("mismatch_abs_mean", "mismatch_abs_max", "mismatch_abs_p99", "mismatch_k3"), math.nan)
    diff = (old_log_prob - rollout_log_prob).float()  # [B, T]
    abs_diff = diff.abs()
    return {
        "mismatch_abs_mean": float(masked_mean(abs_diff, m)),
        "mismatch_abs_max": float(abs_diff[m].max()),
        "mismatch_abs_p99": masked_quantile(abs_diff, m, 0.99),
        # k3 with log_prob = vLLM (the sampler), ref = trainer: exp(old − vllm) − (old − vllm) − 1.
        "mismatch_k3": float(masked_mean(kl_penalty(rollout_log_prob.float(), old_log_prob.float(), "k3"), m)),
    }


ORIGINS = ("fresh", "stale")
"""Where a token's sampler stood (`mismatch_by_origin`): at the weights `old_log_prob` comes from, or behind them."""


@torch.no_grad()
def mismatch_by_origin(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor, lag: torch.Tensor
) -> tuple[dict[str, float], dict[str, int]]:
    """`mismatch_metrics` over each origin of the valid tokens (`fresh_abs_mean`, ..., `stale_k3`), and each origin's
    token count. `lag` [B, T]: the weight versions between a token's sampler and the weights of `old_log_prob`
    (negative: not known, in neither). Fresh (lag 0): one set of weights on both sides, so the gap is numerics alone,
    and a sync that failed shows there. Stale (lag > 0, partial rollouts): the gap also holds the policy's drift
    since the token was sampled, which the IS weight corrects; one number for both would hide the first in the
    second. NaN for an origin with no token."""
    valid = response_mask.bool()  # [B, T]
    metrics, counts = {}, {}
    for origin, on in zip(ORIGINS, (valid & (lag == 0), valid & (lag > 0)), strict=True):
        m = mismatch_metrics(old_log_prob, rollout_log_prob, on)
        metrics |= {origin + k.removeprefix("mismatch"): v for k, v in m.items()}
        counts[origin] = int(on.sum())
    return metrics, counts


@torch.no_grad()
def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    mode: str,
    threshold: float,
    floor: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token loss weights `(B, T)` (detached, 0 off the mask) correcting for the sampler/trainer mismatch.

    ρ = exp(logπ_old − logπ_vllm) per token ("token") or exp(Σ_t of it) per sequence ("sequence", broadcast to its
    tokens). mode "truncate" (TIS): w = min(ρ, C); "mask" (MIS): w = 0 where ρ > C (or ρ < `floor`), else 1. level "none" gives
    w = mask. metrics: `mismatch_metrics` plus `frac_corrected`, the fraction of units (valid tokens, or sequences
    with at least one valid token) whose ρ exceeds C, i.e. that were truncated or masked (NaN over none).
    """
    if level not in LEVELS:
        raise ValueError(f"unknown rollout correction level {level!r}; valid levels: {', '.join(LEVELS)}")
    if mode not in MODES:
        raise ValueError(f"unknown rollout correction mode {mode!r}; valid modes: {', '.join(MODES)}")
    m = response_mask.to(old_log_prob.dtype)  # [B, T]
    metrics = mismatch_metrics(old_log_prob, rollout_log_prob, response_mask)
    if level == "none":
        return m.clone(), {**metrics, "frac_corrected": 0.0}

    log_rho = torch.where(response_mask.bool(), old_log_prob - rollout_log_prob, torch.zeros_like(m))  # [B, T]
    if level == "token":
        units_valid = response_mask.bool()  # [B, T]
    else:
        log_rho = log_rho.sum(-1, keepdim=True).expand_as(log_rho)  # [B, T], Σ_t over the sequence
        units_valid = response_mask.bool().any(-1)  # [B]
    rho = torch.exp(log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # [B, T]
    over = (rho > threshold) | (rho < floor)  # [B, T]
    weights = torch.clamp(rho, max=threshold) if mode == "truncate" else (~over).to(rho.dtype)
    over_units = over if level == "token" else over[:, 0]
    frac = float(over_units[units_valid].float().mean()) if units_valid.any() else math.nan
    return weights * m, {**metrics, "frac_corrected": frac}


def correction_rule(cfg, off_policy: bool) -> tuple[str, str, float, float] | None:
    """The run's rollout correction as `rollout_correction`'s (level, mode, threshold, floor), or None (off), from
    `cfg` (an AlgoConfig): its one name (`rollout_correction`; auto: tis when the data are off-policy, i.e. partial
    rollouts, else off) and its one cap. A masking rule also masks rho below 1/cap."""
    choice = cfg.rollout_correction
    if choice == "auto":
        choice = "tis" if off_policy else "off"
    if choice == "off":
        return None
    level, mode = _RULES[choice]
    cap = cfg.rollout_is_cap
    return level, mode, cap, 1.0 / cap if mode == "mask" else 0.0
