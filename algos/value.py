"""Critic side of PPO: the clipped value loss and explained variance."""

from __future__ import annotations

import torch

from algos.agg import agg_loss
from algos.stats import masked_mean


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip: float | None = 0.5,
    mode: str = "token-mean",
    norm_const: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped value loss: ½·max((V − R)², (V_clip − R)²), V_clip = V_old + clip(V − V_old, ±clip).

    The ½ makes the gradient V − R, as in verl/SkyRL, so `vf_coef` means the same as there. `clip=None` → plain ½
    squared error. metrics: `value_clip_frac` (tokens where the clipped branch is active), `value_mean`,
    `returns_mean`.
    """
    err = (values - returns).square()  # [B, T]
    if clip is None:
        loss_mat, clipped = 0.5 * err, torch.zeros_like(err, dtype=torch.bool)
    else:
        v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
        err_clip = (v_clip - returns).square()
        loss_mat, clipped = 0.5 * torch.maximum(err, err_clip), err_clip > err
    loss = agg_loss(loss_mat, response_mask, mode, norm_const)
    metrics = {
        "value_clip_frac": float(masked_mean(clipped.float(), response_mask)),
        "value_mean": float(masked_mean(values.detach().float(), response_mask)),
        "returns_mean": float(masked_mean(returns.detach().float(), response_mask)),
    }
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var[R − V] / Var[R] over valid tokens: 1 = perfect critic, 0 = no better than a constant, < 0 = worse.

    NaN when Var[R] is 0 (e.g. every reward equal): the quantity is undefined there, and NaN says so in the logs.
    """
    m = mask.bool()
    r, v = returns.detach()[m].double(), values.detach()[m].double()
    if r.numel() == 0:
        return float("nan")
    var_r = r.var(unbiased=False)
    if var_r <= 0:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)
