"""From trajectories to training tensors: global gather, token-balanced re-split, padding, advantages.

Every rank ends up with the same global list of trajectories (so advantages, filters and metrics see the whole
batch), then keeps a token-balanced share of equal size (FSDP needs every rank to run the same number of
forward/backward passes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import algos
from nanosky import dist
from nanosky.agent.trajectory import Trajectory


def gather_trajectories(local: list[Trajectory]) -> list[Trajectory]:
    """All ranks' trajectories in rank order (identical list on every rank)."""
    return [t for part in dist.all_gather_objects(local) for t in part]


def balanced_split(lengths: list[int], world: int) -> list[list[int]]:
    """Indices for each rank: equal counts, token totals as even as a greedy longest-first fill gets them."""
    n = len(lengths)
    per = n // world
    order = sorted(range(n), key=lambda i: -lengths[i])
    parts: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in order:
        r = min((r for r in range(world) if len(parts[r]) < per), key=lambda r: load[r], default=None)
        if r is None:  # n not divisible by world: the remainder is dropped (callers keep n divisible)
            break
        parts[r].append(i)
        load[r] += lengths[i]
    return [sorted(p) for p in parts]


@dataclass
class Batch:
    """One rank's share, padded. Token tensors are aligned with next-token prediction: position t scores
    ids[:, t+1], so masks/logprobs are [B, L-1]."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L-1] float, 1 on policy tokens
    rollout_logprobs: torch.Tensor  # [B, L-1] engine logprobs of the sampled tokens
    rewards: torch.Tensor  # [B]
    group_index: torch.Tensor  # [B]
    advantages: torch.Tensor | None = None  # [B, L-1]
    returns: torch.Tensor | None = None  # [B, L-1]
    old_logprobs: torch.Tensor | None = None  # [B, L-1]
    ref_logprobs: torch.Tensor | None = None  # [B, L-1]
    values: torch.Tensor | None = None  # [B, L-1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, idx: slice | list[int]) -> Batch:
        kw = {k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return Batch(**kw)


def to_batch(trajs: list[Trajectory], pad_id: int, device) -> Batch:
    L = max(len(t.ids) for t in trajs)
    B = len(trajs)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    att = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.float32)
    lps = torch.zeros((B, L), dtype=torch.float32)
    for i, t in enumerate(trajs):
        n = len(t.ids)
        ids[i, :n] = torch.tensor(t.ids)
        att[i, :n] = 1
        mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        lps[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    return Batch(
        input_ids=ids.to(device),
        attention_mask=att.to(device),
        loss_mask=mask[:, 1:].to(device),  # token t+1 is predicted at position t
        rollout_logprobs=lps[:, 1:].to(device),
        rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float32, device=device),
        group_index=torch.tensor([t.group for t in trajs], dtype=torch.long, device=device),
    )


def compute_advantages(batch: Batch, cfg: algos.AlgoConfig, global_rows: dict[str, torch.Tensor]) -> None:
    """Advantages over the *global* batch (group stats and whitening see every rank's samples).

    `global_rows` holds the global [N, T] tensors the estimator needs (token_rewards, response_mask, values,
    group_index) plus `local_index` ([B] rows of this rank); results for the local rows are stored on `batch`.
    """
    fn = algos.get_adv_estimator(cfg.adv_estimator)
    adv, ret = fn(
        global_rows["token_rewards"],
        global_rows["response_mask"],
        global_rows["group_index"],
        values=global_rows.get("values"),
        gamma=cfg.gamma,
        lam=cfg.lam,
    )
    idx = global_rows["local_index"]
    batch.advantages, batch.returns = adv[idx], ret[idx]
