"""Reward shaping before advantage estimation: scalar → token rewards, DAPO's soft overlong punishment, KL in the
reward, and DAPO's dynamic-sampling group filter."""

from __future__ import annotations

import torch

from algos.kl import kl_penalty


def scalar_to_token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each response's scalar reward `(B,)` on its last valid token → `(B, T)`; rows with no valid token get 0."""
    rewards = torch.as_tensor(rewards, device=response_mask.device)
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    m = response_mask.bool()  # [B, T]
    B, T = m.shape
    # index of the last 1 in each row: flip, find the first 1, map back.
    last = T - 1 - torch.argmax(m.flip(-1).to(torch.int8), dim=-1)  # [B]
    out = torch.zeros((B, T), dtype=dtype, device=m.device)
    out[torch.arange(B, device=m.device), last] = rewards.to(dtype) * m.any(-1)
    return out


def overlong_penalty(response_lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO soft overlong punishment `(B,)`, added to the outcome reward.

    0 if |y| ≤ L_max − L_cache; ((L_max − L_cache) − |y|) / L_cache inside the cache band (linear from 0 to −1);
    −1 beyond L_max. `cache_len` 0 switches it off (all zeros).
    """
    lengths = torch.as_tensor(response_lengths).float()  # [B]
    if cache_len <= 0:
        return torch.zeros_like(lengths)
    if cache_len >= max_len:
        raise ValueError(f"overlong cache_len ({cache_len}) must be smaller than max_len ({max_len})")
    start = float(max_len - cache_len)
    band = (start - lengths) / cache_len  # [B], in [-1, 0] inside the band
    return torch.where(lengths <= start, torch.zeros_like(lengths), torch.where(lengths <= max_len, band, -1.0))


def kl_in_reward(
    token_rewards: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    kind: str = "k1",
) -> torch.Tensor:
    """Token rewards `(B, T)` minus coef · KL(π ‖ π_ref) on the response tokens, as REINFORCE++ and PPO-RLHF shape
    them (`kind` k1 by default: the per-token log-ratio, so its sum over a response is the sequence KL)."""
    return token_rewards - coef * kl_penalty(log_prob, ref_log_prob, kind) * response_mask


def group_has_signal(rewards: torch.Tensor, group_index: torch.Tensor, decimals: int = 6) -> torch.Tensor:
    """DAPO's dynamic-sampling filter `(B,) bool`: True for every member of a group whose rewards are not all equal
    (rounded to `decimals`). A group of equal rewards has zero advantage everywhere under a group baseline, so it
    gives no gradient signal."""
    r = torch.round(torch.as_tensor(rewards, dtype=torch.float64), decimals=decimals)  # [B]
    g = torch.as_tensor(group_index)  # [B]
    _, inv = torch.unique(g, return_inverse=True)  # [B] group ids as 0..G-1
    G = int(inv.max()) + 1 if inv.numel() else 0
    lo = torch.full((G,), float("inf"), dtype=r.dtype).scatter_reduce(0, inv, r, "amin")  # [G]
    hi = torch.full((G,), float("-inf"), dtype=r.dtype).scatter_reduce(0, inv, r, "amax")  # [G]
    return (hi > lo)[inv]
