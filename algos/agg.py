"""Loss aggregation (`loss_agg_mode`) and the micro-batch scale that keeps gradients independent of batching.

A trainer that splits a global mini-batch into micro-batches (and ranks) computes, per micro-batch,

    loss_mb = agg_loss(L_mb, mask_mb, mode) * agg_scale(mode, mask_mb, global_tokens, global_seqs)

and back-propagates each `loss_mb`; the *sum* of these over micro-batches and ranks equals `agg_loss` of the whole
global batch, so the gradient does not depend on micro-batch size, accumulation steps or world size. (If the
data-parallel reduction averages gradients over ranks, multiply by the world size.)
"""

from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _check_mode(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")


def agg_loss(
    loss_mat: torch.Tensor, response_mask: torch.Tensor, mode: str, norm_const: float | None = None
) -> torch.Tensor:
    """Aggregate a per-token loss `(B, T)` into a scalar over the tokens where `response_mask` is 1.

    - "token-mean":               Σ L·m / Σ m
    - "seq-mean-token-mean":      (1/B) Σ_i (Σ_t L·m / Σ_t m)   (a row with no tokens contributes 0, still counts in B)
    - "seq-mean-token-sum":       (1/B) Σ_i Σ_t L·m
    - "seq-mean-token-sum-norm":  (1/B) Σ_i Σ_t L·m / C, C = `norm_const` (default T = loss_mat.shape[-1]; pass a
                                  fixed C, e.g. the max response length, when micro-batches are padded to different
                                  T). Dr. GRPO: no 1/|o_i| length term, but the 1/G mean over responses stays (as
                                  verl >= 0.5 and TRL's `dr_grpo`: B·C, not C)
    An all-masked input gives 0, never NaN.
    """
    _check_mode(mode)
    m = response_mask.to(loss_mat.dtype)  # [B, T]
    # where, not L·m: garbage (inf/NaN) at padding positions must not leak into the sum.
    masked = torch.where(response_mask.bool(), loss_mat, torch.zeros_like(loss_mat))  # [B, T]
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / m.sum(-1).clamp(min=1.0)  # [B]
        return per_seq.sum() / max(loss_mat.shape[0], 1)
    if mode == "seq-mean-token-sum":
        return masked.sum() / max(loss_mat.shape[0], 1)
    c = float(loss_mat.shape[-1]) if norm_const is None else float(norm_const)
    if c <= 0:
        raise ValueError(f"norm_const must be > 0, got {norm_const}")
    return masked.sum() / (max(loss_mat.shape[0], 1) * c)


def agg_scale(
    mode: str,
    response_mask_mb: torch.Tensor,
    global_tokens: float | torch.Tensor,
    global_seqs: float | torch.Tensor,
) -> float:
    """Factor for one micro-batch's `agg_loss` so the sum over micro-batches (and ranks) is the global `agg_loss`.

    `global_tokens` = Σ mask over the whole global mini-batch (all micro-batches, all ranks); `global_seqs` = its
    number of rows (fully masked rows included, as in `agg_loss`).
    token-mean → mb_tokens / global_tokens; every seq-mean-* mode (sum-norm too) → mb_seqs / global_seqs.
    """
    _check_mode(mode)
    if mode == "token-mean":
        num, den = float(response_mask_mb.sum()), float(global_tokens)
    else:
        num, den = float(response_mask_mb.shape[0]), float(global_seqs)
    return num / den if den > 0 else 0.0
