"""The step's token trace for the rollout viewer (`python -m nanosky.view`): a bounded sample of whole groups, each
trajectory with its per-token values from the step itself (written to rollouts.jsonl by rank 0).

    update(batch)        # its tracer (nanosky/train/tracer.py) picks rank 0's whole groups and keeps their values
    trajs, fields = trace.sample(trajs, local, batch, update.tracer, n=n, max_tokens=max_tokens)

Per token t of a trajectory's `ids` (position t − 1 predicts it): `mask` (1 = sampled), `lp` (the engine's log p),
`lp_train` (the trainer's, in the update's first pass), `adv` (the advantage) and `ent` (the trainer's entropy at
that position), each null where there is none (the prompt, observations, a row the update skipped), and
`constrained`: the index where each constrained turn starts (sampled under a mask). Values are
rounded to 4 decimals. The tokens traced per step are capped (`--log.sample-tokens`): about 20 bytes each in JSON.
"""

from __future__ import annotations

from nanosky.train.batch import Batch
from nanosky.train.tracer import Tracer, whole_groups


def _r(x: float) -> float:
    return round(float(x), 4)


def sample(trajs: list, local: list | None, batch: Batch, tracer: Tracer, *, n: int, max_tokens: int):
    """The step's logged sample: (trajectories, their token fields or None once `max_tokens` is spent). The tracer's
    rows (rank 0's whole groups of `local`, the batch's rows) with the trainer's values too; without them (step-wise
    rows) the step's first whole groups, with the engine's side only (the trainer's rows are turns, over ranks)."""
    rows, traced = tracer.rows, tracer.kept
    src, chosen = (local, rows) if rows else (trajs, whole_groups([t.group for t in trajs], n))
    fields, used = [], 0
    for i in chosen:
        t = src[i]
        used += len(t.ids)
        f = rollout_fields(t) if t.ids and used <= max_tokens else None
        if f is not None and rows:
            _trainer_values(f, batch, i, traced.get(i))
        fields.append(f)
    return [src[i] for i in chosen], fields


def _trainer_values(f: dict[str, list], batch: Batch, i: int, lp_ent: tuple | None) -> None:
    """Fill a traced row's `adv`, `lp_train` and `ent` from the batch and the update's first pass (position t − 1
    predicts token t)."""
    n = len(f["ids"])
    adv = batch.advantages[i, : n - 1].tolist() if batch.advantages is not None else None
    lp_t, ent = lp_ent if lp_ent is not None else (None, None)
    for t in range(1, n):
        if not f["mask"][t]:
            continue
        f["adv"][t] = _r(adv[t - 1]) if adv is not None else None
        if lp_t is not None and t - 1 < len(lp_t):
            f["lp_train"][t], f["ent"][t] = _r(lp_t[t - 1]), _r(ent[t - 1])


def rollout_fields(t) -> dict[str, list]:
    """A trajectory's own per-token values (ids, mask, the engine's log p, each turn's advantage where its
    `turn_log` has one: step-wise rows), the trainer's left null."""
    n = len(t.ids)
    lp = [_r(x) if m else None for x, m in zip(t.logprobs, t.loss_mask)]
    adv: list = [None] * n
    # each turn's first token; where the turns' advantages are logged (step-wise: GiGPO's per step), they colour it
    runs = [i for i in range(n) if t.loss_mask[i] and (i == 0 or not t.loss_mask[i - 1])]
    turn_adv = [x.get("advantage") for x in t.turn_log]
    if len(runs) == len(turn_adv) and None not in turn_adv:
        for start, a in zip(runs, turn_adv):
            i = start
            while i < n and t.loss_mask[i]:
                adv[i] = a
                i += 1
    return {
        "ids": list(t.ids),
        "mask": list(t.loss_mask),
        "lp": lp,
        "lp_train": [None] * n,
        "adv": adv,
        "ent": [None] * n,
        "constrained": [start for start, _ in t.constraints],
        # the weight version that sampled each id (partial rollouts: a carried episode's ids span versions)
        "version": [v if v >= 0 else None for v in t.token_versions()] if t.versions else [None] * n,
    }
