"""Masked statistics over `(B, T)` tensors (means, whitening) shared by estimators, losses and metrics."""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is 1; 0 if the mask is empty."""
    m = mask.to(x.dtype)
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum() / m.sum().clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / (std + eps) over the valid positions, std unbiased (n − 1); 0 where the mask is 0.

    Fewer than two valid values (or all equal) give 0 rather than NaN. Computed in float64 so that equal values
    whiten to exactly ~0 instead of rounding noise divided by eps.
    """
    m = mask.to(torch.float64)
    x64 = torch.where(mask.bool(), x.double(), torch.zeros_like(m))
    n = m.sum()
    mean = x64.sum() / n.clamp(min=1.0)
    var = (((x64 - mean) * m) ** 2).sum() / (n - 1.0).clamp(min=1.0)
    return ((x64 - mean) / (var.sqrt() + eps) * m).to(x.dtype)


def masked_quantile(x: torch.Tensor, mask: torch.Tensor, q: float) -> float:
    """q-quantile of the valid values of `x` (linear interpolation); 0.0 if the mask is empty."""
    vals = x[mask.bool()].float()
    return float(torch.quantile(vals, q)) if vals.numel() else 0.0
