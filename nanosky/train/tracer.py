"""The update's token trace for the rollout viewer: which of a step's rows to trace, and their per-token log p and
entropy from the update's first pass (before any optimizer step). The update owns it; `nanosky.trace` reads it.

    update = PolicyUpdate(optim, algo, model, tracer=Tracer(n=cfg.log.samples_per_step, on=is_main))
    update(batch)                         # picks the batch's first whole groups (concat rows), keeps their values
    update.tracer.rows, update.tracer.kept   # [row indices], {row: (log p [T], entropy [T])}
"""

from __future__ import annotations

import torch

from nanosky.train.batch import Batch


def whole_groups(groups: list, n: int) -> list[int]:
    """Indices of the items of the first groups (in order of appearance; None: in no group) that hold >= n items."""
    out: list[int] = []
    for g in dict.fromkeys(x for x in groups if x is not None) if n > 0 else ():
        if len(out) >= n:
            break
        out += [i for i, x in enumerate(groups) if x == g]
    return out


def pick(batch: Batch, n: int) -> list[int]:
    """Rows of `batch` (real ones, in order) making up whole groups, the fewest groups holding at least n rows."""
    real = batch.row_mask.tolist()
    return whole_groups([g if g >= 0 and r > 0 else None for g, r in zip(batch.group_index.tolist(), real)], n)


class Tracer:
    """A step's traced rows and what the update's first pass computed for them. `on` False (every rank but 0) or
    step-wise rows (turns, spread over ranks): nothing is traced."""

    def __init__(self, n: int = 0, on: bool = False):
        self.n, self.on = n, on
        self.rows: list[int] = []
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def begin(self, batch: Batch) -> None:
        """A new step: trace the batch's first whole groups (episodes' rows only)."""
        self.rows = pick(batch, self.n) if self.on and batch.layout == "concat" else []
        self.kept = {}

    def keep(self, m: Batch, lp: torch.Tensor, ent: torch.Tensor) -> None:
        """Keep the traced rows' log p and entropy [T] from their first pass (before any optimizer step)."""
        if not self.rows or m.row_id is None:
            return
        rows = set(self.rows)
        for j, (rid, real) in enumerate(zip(m.row_id.tolist(), m.row_mask.tolist())):
            if real and rid in rows and rid not in self.kept:
                self.kept[rid] = (lp[j].detach().float().cpu(), ent[j].detach().float().cpu())
