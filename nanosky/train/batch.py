"""From trajectories to training tensors: global gather, group-aligned re-split, padding, advantages.

Every rank ends up with the same global list of trajectories (so filters and metrics see the whole batch), then
keeps whole groups, token-balanced, with the same number of rows as every other rank (FSDP needs every rank to run
the same number of forward/backward passes). Only this rank's share is ever padded into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import algos
from nanosky import dist
from nanosky.agent.trajectory import Trajectory
from nanosky.train.step_credit import estimator_kwargs


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
    row_mask: torch.Tensor  # [B] 1 = a sample, 0 = a padding row (step-wise rows do not split evenly over ranks)
    advantages: torch.Tensor | None = None  # [B, L-1]
    layout: str = "concat"  # what a row is: an episode ("concat") or one turn ("stepwise", `train/stepwise.py`)
    returns: torch.Tensor | None = None  # [B, L-1]
    old_logprobs: torch.Tensor | None = None  # [B, L-1]
    ref_logprobs: torch.Tensor | None = None  # [B, L-1]
    values: torch.Tensor | None = None  # [B, L-1]
    choice_pos: torch.Tensor | None = None  # [N, 2] (row, t) of constrained positions (nanosky/train/constrain.py)
    choice_bits: torch.Tensor | None = None  # [N, ceil(V/32)] int32: the tokens allowed at each of them
    row_id: torch.Tensor | None = None  # [B] each row's index in the rank's batch, kept through slices (the trace)
    versions: torch.Tensor | None = None  # [B, L-1] long: the weight version that sampled each token (-1: none known)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, idx: slice | list[int]) -> Batch:
        per_row = {k: v for k, v in self.__dict__.items() if k not in ("choice_pos", "choice_bits")}
        kw = {k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in per_row.items()}
        if self.choice_pos is not None:
            from nanosky.train.constrain import slice_rows

            kw["choice_pos"], kw["choice_bits"] = slice_rows(self.choice_pos, self.choice_bits, idx, len(self))
        return Batch(**kw)

    def allowed(self, T: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The constrained positions inside the first T columns that are still loss positions (a blank micro-batch
        zeroes its mask; only kept positions are scored) and their bitmasks, or None."""
        if self.choice_pos is None or not len(self.choice_pos):
            return None
        r, t = self.choice_pos.unbind(-1)
        keep = t < T
        keep &= self.loss_mask[r, t.clamp(max=self.loss_mask.shape[1] - 1)] > 0
        return (self.choice_pos[keep], self.choice_bits[keep]) if keep.any() else None

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Model inputs without the columns that are padding in every row: ids [B, L'], attention mask [B, L'], and
        T = L' − 1, the width of this batch's [B, T] token tensors that the model's outputs line up with."""
        L = int(self.attention_mask.sum(-1).max())
        return self.input_ids[:, :L], self.attention_mask[:, :L], L - 1


def micro_slices(n: int, size: int) -> list[slice]:
    """[0, n) in consecutive slices of `size` (the last may be shorter)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def to_batch(trajs: list[Trajectory | None], pad_id: int, device, masker=None) -> Batch:
    """Padded tensors of `trajs`; a None is a padding row: one pad token, fully masked, row_mask 0. `masker`
    (`nanosky.train.constrain.ChoiceMasker`): also the masks of the rows' constrained turns."""
    row_mask = torch.tensor([float(t is not None) for t in trajs], device=device)
    trajs = [Trajectory(ids=[pad_id], loss_mask=[0], logprobs=[0.0], group=-1) if t is None else t for t in trajs]
    L = max(len(t.ids) for t in trajs)
    B = len(trajs)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    att = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.float32)
    lps = torch.zeros((B, L), dtype=torch.float32)
    versions = torch.full((B, L), -1, dtype=torch.long)
    for i, t in enumerate(trajs):
        n = len(t.ids)
        ids[i, :n] = torch.tensor(t.ids)
        att[i, :n] = 1
        mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        lps[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
        versions[i, :n] = torch.tensor(t.token_versions(), dtype=torch.long)
    batch = Batch(
        input_ids=ids.to(device),
        attention_mask=att.to(device),
        loss_mask=mask[:, 1:].to(device),  # token t+1 is predicted at position t
        rollout_logprobs=lps[:, 1:].to(device),
        rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float32, device=device),
        group_index=torch.tensor([t.group for t in trajs], dtype=torch.long, device=device),
        row_mask=row_mask,
        row_id=torch.arange(B, device=device),
        versions=versions[:, 1:].to(device),
    )
    if masker is not None:
        masker.attach(batch, trajs)  # padding rows have no constrained turns
    return batch


def split_groups(trajs: list[Trajectory], world: int, signal: set[int] | None = None) -> list[list[int]]:
    """Indices for each rank: whole groups (so group statistics are local to a rank), the same number of rows on
    every rank, token totals balanced by `balanced_split` over the groups. `signal` (`signal_groups`): the groups the
    update trains on, where it leaves the others out; only their tokens are balanced (the others cost a rank nothing,
    and placing them by length left one rank with most of the work while the other waited at FSDP's collectives)."""
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(t.group, []).append(i)
    members = list(groups.values())
    if len(members) % world or len({len(g) for g in members}) > 1:
        sizes = sorted({len(g) for g in members})
        raise ValueError(f"cannot split {len(members)} groups (sizes {sizes}) evenly over {world} ranks")
    cost = [
        0 if signal is not None and trajs[g[0]].group not in signal else sum(len(trajs[i].ids) for i in g)
        for g in members
    ]
    parts = balanced_split(cost, world)
    return [sorted(i for g in part for i in members[g]) for part in parts]


def signal_groups(trajs: list[Trajectory], cfg: algos.AlgoConfig) -> set[int] | None:
    """The groups whose rows get a non-zero advantage on some policy token, where that is known before the split: a
    per-group estimator (grpo, dr_grpo, rloo, a user's) on the outcome rewards alone, computed here on every group
    (every rank holds them all). None where it is not known: step credit (gigpo), values, the KL in the reward."""
    meta = algos.registry.ADV_ESTIMATORS.meta(cfg.adv_estimator)
    if not meta["per_group"] or meta["needs_steps"] or meta["needs_values"] or cfg.kl_in_reward:
        return None
    b = to_batch(trajs, 0, "cpu")
    adv, _ = algos.get_adv_estimator(cfg.adv_estimator)(
        token_rewards(b), b.loss_mask, b.group_index, values=None, **estimator_kwargs(cfg, None)
    )
    b.advantages = adv  # scale_negative keeps zeros zero
    return {trajs[i].group for i in signal_rows(b)}


def signal_rows(b: Batch) -> list[int]:
    """Rows with a non-zero advantage on some loss token (the others add nothing to a `zero_at_zero_adv` loss)."""
    has = ((b.advantages != 0) & (b.loss_mask > 0)).any(-1) & (b.row_mask > 0)  # [B]
    return has.nonzero().flatten().tolist()


def token_rewards(batch: Batch) -> torch.Tensor:
    """The scalar outcome reward on each row's last policy token. [B, L-1]"""
    return algos.scalar_to_token_rewards(batch.rewards, batch.loss_mask)


def compute_advantages(
    batch: Batch, cfg: algos.AlgoConfig, rewards: torch.Tensor, steps: algos.StepInfo | None = None
) -> None:
    """Advantages and returns of this rank's rows from its token rewards `rewards` [B, L-1], stored on `batch`.

    A per-group estimator (grpo, dr_grpo, rloo) runs on this rank's own whole groups (`split_groups`). Any other
    (whitening over the batch, a user's estimator) sees every rank's rows: one all_gather of its inputs. A step-level
    estimator (gigpo) also gets `steps` (`nanosky.train.step_credit.step_info` of this rank's trajectories).
    """
    fn = algos.get_adv_estimator(cfg.adv_estimator)
    meta = algos.registry.ADV_ESTIMATORS.meta(cfg.adv_estimator)
    inputs = [rewards, batch.loss_mask, batch.group_index, batch.values]
    kw = estimator_kwargs(cfg, steps)
    if meta["per_group"]:
        batch.advantages, batch.returns = fn(*inputs[:3], values=inputs[3], **kw)
        return
    if meta["needs_steps"]:
        raise ValueError(f"{cfg.adv_estimator}: a step-level estimator must be registered per_group=True")
    parts = dist.all_gather_objects([None if x is None else x.cpu() for x in inputs])
    T = max(p[0].shape[1] for p in parts)
    glob = [
        None if parts[0][k] is None else torch.cat([_pad_cols(p[k], T) for p in parts]).to(rewards.device)
        for k in range(4)
    ]
    adv, ret = fn(*glob[:3], values=glob[3], **kw)  # [N, T]
    start = sum(len(p[2]) for p in parts[: dist.get_info().rank])
    rows, width = slice(start, start + len(batch)), rewards.shape[1]
    batch.advantages, batch.returns = adv[rows, :width], ret[rows, :width]


def _pad_cols(x: torch.Tensor, T: int) -> torch.Tensor:
    return x if x.dim() == 1 else torch.nn.functional.pad(x, (0, T - x.shape[1]))
