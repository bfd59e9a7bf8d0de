"""Policy losses, registered by name: ppo (+ dual-clip), gspo (GSPO-token), sapo, cispo.

Every loss has the signature

    fn(log_prob, old_log_prob, advantages, response_mask, cfg, weights=None) -> (loss, metrics)

with `(B, T)` tensors over response positions and `cfg` the run's `AlgoConfig` (each loss reads the fields it needs;
None = the defaults); `loss` is a differentiable scalar aggregated with `cfg.loss_agg_mode` and `cfg.norm_const`; `metrics` is a dict of python floats over the valid tokens: `clip_frac` (fraction of tokens
where clipping takes effect; always 0 for SAPO, which has no hard clip), `ratio_mean`, `ppo_kl` (mean of
old − new log-prob). `weights` `(B, T)` (rollout correction, treated as constants) multiply the per-token loss
before aggregation. Notation: r = exp(logπ_θ − logπ_old) with the log-ratio clamped to ±20, A = advantage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from algos.agg import agg_loss
from algos.registry import register_policy_loss
from algos.stats import masked_mean

if TYPE_CHECKING:
    from algos.config import AlgoConfig

LOG_RATIO_CLAMP = 20.0


def _default(cfg: AlgoConfig | None) -> AlgoConfig:
    from algos.config import AlgoConfig  # late: config validates names against this module's registrations

    return cfg if cfg is not None else AlgoConfig()


def _finish(
    loss_mat: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: AlgoConfig,
    weights: torch.Tensor | None,
    metrics: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    if weights is not None:
        loss_mat = loss_mat * weights.detach()
    loss = agg_loss(loss_mat, response_mask, cfg.loss_agg_mode, cfg.norm_const)
    return loss, {k: float(masked_mean(v.detach().float(), response_mask)) for k, v in metrics.items()}


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)) and where the clipped branch is the active one."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@register_policy_loss("ppo", zero_at_zero_adv=True)
def ppo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: AlgoConfig | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clip: L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); dual-clip (A < 0 only): L = min(L, −c·A)."""
    cfg = _default(cfg)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)  # [B, T]
    loss_mat, clipped = _clipped_surrogate(ratio, advantages, cfg.clip_low, cfg.clip_high)
    metrics = {"clip_frac": clipped.float(), "ratio_mean": ratio, "ppo_kl": old_log_prob - log_prob}
    if cfg.dual_clip_c is not None:
        # With A < 0 and r → ∞ the clipped surrogate is unbounded; cap it at −c·A (Ye et al. 2020).
        cap = -cfg.dual_clip_c * advantages
        dual = (advantages < 0) & (loss_mat > cap)
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, cap), loss_mat)
        metrics["dual_clip_frac"] = dual.float()
    return _finish(loss_mat, response_mask, cfg, weights, metrics)


def gspo_token_log_ratio(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """GSPO-token log s_{i,t} = logπ_θ(y_t) − sg(logπ_θ(y_t)) + sg(log s_i), log s_i = mean_t(logπ_θ − logπ_old).

    Its value is log s_i on every token of sequence i while the gradient flows through each token's log-prob.
    """
    m = response_mask.to(log_prob.dtype)
    seq_log_ratio = ((log_prob - old_log_prob) * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # [B]
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).detach()
    return log_prob - log_prob.detach() + seq_log_ratio[:, None]  # [B, T]


@register_policy_loss("nll", zero_at_zero_adv=True)
def nll_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: AlgoConfig | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Supervised: L = −A·logπ_θ, with no ratio and no clip (the behaviour policy does not enter). Under the `demo`
    estimator (A = 1 on every demonstrated token) it is the tokens' negative log-likelihood: SFT as the RL step."""
    cfg = _default(cfg)
    return _finish(-advantages * log_prob, response_mask, cfg, weights, {"nll": -log_prob.detach()})


@register_policy_loss("gspo", zero_at_zero_adv=True)
def gspo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: AlgoConfig | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token (arXiv 2507.18071): the PPO clipped surrogate on the sequence ratio s_i (see gspo_token_log_ratio).

    Dual-clip does not apply. Use with the paper's tiny clip ranges (3e-4 / 4e-4) and "seq-mean-token-mean".
    """
    cfg = _default(cfg)
    seq_ratio = torch.exp(gspo_token_log_ratio(log_prob, old_log_prob, response_mask))  # [B, T], value s_i
    loss_mat, clipped = _clipped_surrogate(seq_ratio, advantages, cfg.clip_low, cfg.clip_high)
    metrics = {"clip_frac": clipped.float(), "ratio_mean": seq_ratio, "ppo_kl": old_log_prob - log_prob}
    return _finish(loss_mat, response_mask, cfg, weights, metrics)


@register_policy_loss("sapo", zero_at_zero_adv=True)
def sapo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: AlgoConfig | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """SAPO (arXiv 2511.20347): L = −f(r)·A, f(r) = σ(τ(r − 1))·4/τ, τ = τ_pos if A > 0 else τ_neg; no clip.

    df/dr = 4σ(1 − σ): exactly 1 at r = 1 (on-policy gradient = plain policy gradient), decaying smoothly as r
    moves away — a soft trust region instead of PPO's hard cut. Metric `gate_weight_mean` is that mean weight.
    """
    cfg = _default(cfg)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)  # [B, T]
    tau = torch.where(advantages > 0, cfg.tau_pos, cfg.tau_neg).to(ratio.dtype)  # [B, T]
    sig = torch.sigmoid(tau * (ratio - 1.0))
    loss_mat = -(sig * 4.0 / tau) * advantages
    metrics = {
        "clip_frac": torch.zeros_like(ratio),
        "ratio_mean": ratio,
        "ppo_kl": old_log_prob - log_prob,
        "gate_weight_mean": 4.0 * sig * (1.0 - sig),
    }
    return _finish(loss_mat, response_mask, cfg, weights, metrics)


@register_policy_loss("cispo", zero_at_zero_adv=True)
def cispo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: AlgoConfig | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1): L = −sg(clip(r, 1−ε_low^IS, 1+ε_high^IS))·A·logπ_θ.

    The importance weight is clipped and detached instead of the update, so every token keeps a gradient
    (PPO zeroes the gradient of clipped tokens, which tend to be the rare "fork" tokens of reflective reasoning).
    """
    cfg = _default(cfg)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)  # [B, T]
    is_weight = torch.clamp(ratio, 1.0 - cfg.cispo_clip_low, 1.0 + cfg.cispo_clip_high).detach()
    loss_mat = -is_weight * advantages * log_prob
    clipped = (ratio > 1.0 + cfg.cispo_clip_high) | (ratio < 1.0 - cfg.cispo_clip_low)
    metrics = {"clip_frac": clipped.float(), "ratio_mean": ratio, "ppo_kl": old_log_prob - log_prob}
    return _finish(loss_mat, response_mask, cfg, weights, metrics)
