"""Reward shaping before advantage estimation: scalar → token rewards, DAPO's soft overlong punishment."""

from __future__ import annotations

import torch


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
    return torch.where(
        lengths <= start, torch.zeros_like(lengths), torch.where(lengths <= max_len, band, -1.0)
    )
