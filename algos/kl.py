"""Per-token KL estimators against a reference policy, and the entropy of the policy's distribution."""

from __future__ import annotations

import torch

KL_KINDS = ("k1", "k2", "k3")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(π‖π_ref) from samples of π, `(B, T)`; d = logπ − logπ_ref.

    k1 = d (unbiased, high variance, can be negative); k2 = ½d²; k3 = exp(−d) + d − 1 (unbiased, ≥ 0, low variance;
    Schulman's estimator), with d clamped to ±20 and the result to ±10 so one wild token cannot blow up the loss.
    """
    d = log_prob - ref_log_prob  # [B, T]
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        d = d.clamp(-20.0, 20.0)
        return (torch.exp(-d) + d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL kind {kind!r}; valid kinds: {', '.join(KL_KINDS)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: `(..., V)` → `(...)`.

    H = logsumexp(x) − Σ softmax(x)·x, which never forms log(0) and so stays finite for peaked distributions.
    −inf logits (banned tokens) are clamped to the dtype's finite minimum so 0·(−inf) cannot make a NaN.
    Computed in the logits' dtype; upcast first if you need fp32 entropy from bf16 logits.
    """
    logits = logits.clamp(min=torch.finfo(logits.dtype).min)  # [..., V]
    probs = torch.softmax(logits, dim=-1)  # [..., V]
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
