"""The step's token trace for the rollout viewer (`python -m nanosky.view`): a bounded sample of whole groups, each
trajectory with its per-token values from the step itself (written to rollouts.jsonl by rank 0).

    rows = trace.pick(batch, cfg.log.samples_per_step)     # rank 0's rows to trace: whole groups
    update.trace_rows = rows                               # the update keeps their log p and entropy
    recs = trace.token_fields(batch, rows, update.traced, max_tokens)

Per token t of a trajectory's `ids` (position t − 1 predicts it): `mask` (1 = sampled), `lp` (the engine's log p),
`lp_train` (the trainer's, in the update's first pass), `adv` (the advantage) and `ent` (the trainer's entropy at
that position), each null where there is none (the prompt, observations, a row the update skipped), and
`constrained`: the index where each constrained turn starts (sampled under a mask). Values are
rounded to 4 decimals. The tokens traced per step are capped (`--log.sample-tokens`): about 20 bytes each in JSON.
"""

from __future__ import annotations

import torch

from nanosky.train.batch import Batch


def pick(batch: Batch, n: int) -> list[int]:
    """Rows of `batch` (real ones, in order) making up whole groups, the fewest groups holding at least n rows."""
    if n <= 0:
        return []
    rows: list[int] = []
    groups = batch.group_index.tolist()
    real = batch.row_mask.tolist()
    seen: list[int] = []
    for g in groups:
        if g >= 0 and g not in seen:
            seen.append(g)
    for g in seen:
        if len(rows) >= n:
            break
        rows += [i for i, (x, r) in enumerate(zip(groups, real)) if x == g and r > 0]
    return rows


def _r(x: float) -> float:
    return round(float(x), 4)


def token_fields(
    batch: Batch, rows: list[int], traced: dict[int, tuple[torch.Tensor, torch.Tensor]], max_tokens: int
) -> dict[int, dict[str, list]]:
    """Row -> its per-token lists, for `rows` while their tokens fit in `max_tokens` (later rows get none)."""
    out: dict[int, dict[str, list]] = {}
    used = 0
    for i in rows:
        n = int(batch.attention_mask[i].sum())
        if used + n > max_tokens:
            break
        used += n
        ids = batch.input_ids[i, :n].tolist()
        mask = [0] + [int(m) for m in batch.loss_mask[i, : n - 1].tolist()]  # token t's mask sits at t − 1
        lp_roll = batch.rollout_logprobs[i, : n - 1].tolist()
        adv = batch.advantages[i, : n - 1].tolist() if batch.advantages is not None else None
        lp_t, ent = traced.get(i, (None, None))
        f: dict[str, list] = {
            "ids": ids,
            "mask": mask,
            "lp": [None],
            "lp_train": [None],
            "adv": [None],
            "ent": [None],
        }
        for t in range(1, n):
            on = mask[t] == 1
            f["lp"].append(_r(lp_roll[t - 1]) if on else None)
            f["adv"].append(_r(adv[t - 1]) if on and adv is not None else None)
            has = on and lp_t is not None and t - 1 < len(lp_t)
            f["lp_train"].append(_r(lp_t[t - 1]) if has else None)
            f["ent"].append(_r(ent[t - 1]) if has and ent is not None else None)
        out[i] = f
    return out


def sample(trajs: list, local: list, batch: Batch, rows: list[int], traced: dict, n: int, max_tokens: int):
    """The step's logged sample: (trajectories, their token fields or None). Traced rows (rank 0's whole groups)
    with all their fields; without them (step-wise rows) the first whole groups of the step, with the engine's side
    of their fields (`rollout_fields`)."""
    if rows:
        fields = token_fields(batch, rows, traced, max_tokens)
        for i, f in fields.items():  # where each constrained turn starts: sampled under a mask
            f["constrained"] = [start for start, _ in local[i].constraints]
        return [local[i] for i in rows], [fields.get(i) for i in rows]
    chosen, groups = [], []
    for t in trajs:
        if t.group not in groups:
            if len(chosen) >= n:
                break
            groups.append(t.group)
        if t.group in groups:
            chosen.append(t)
    fields, used = [], 0
    for t in chosen:  # the engine's side only: the trainer's rows are turns, spread over the ranks
        used += len(t.ids)
        fields.append(rollout_fields(t) if t.ids and used <= max_tokens else None)
    return chosen, fields


def rollout_fields(t) -> dict[str, list]:
    """A trajectory's own per-token values (ids, mask, the engine's log p, each turn's advantage where its
    `turn_log` has one: step-wise rows), the trainer's left null."""
    n = len(t.ids)
    lp = [_r(x) if m else None for x, m in zip(t.logprobs, t.loss_mask)]
    adv: list = [None] * n
    runs = [
        i for i in range(n) if t.loss_mask[i] and (i == 0 or not t.loss_mask[i - 1])
    ]  # each turn's first token
    turn_adv = [x.get("advantage") for x in t.turn_log]
    if (
        len(runs) == len(turn_adv) and None not in turn_adv
    ):  # the turns' advantages (step-wise: GiGPO's per step)
        for start, a in zip(runs, turn_adv):
            i = start
            while i < n and t.loss_mask[i]:
                adv[i] = a
                i += 1
    return {"ids": list(t.ids), "mask": list(t.loss_mask), "lp": lp, "lp_train": [None] * n, "adv": adv,
            "ent": [None] * n, "constrained": [start for start, _ in t.constraints]}  # fmt: skip
