"""Step-wise samples: each assistant turn of a multi-turn episode is its own training row (`--rollout.mode stepwise`).

A 30-step alfworld episode does not fit a small context as one concatenated row. In step-wise mode the runner
samples every turn from a short prompt (`nanosky/agent/window.py`: the opening messages, then the last K turns) and
keeps that prompt with the sampled ids (`Trajectory.steps`). Here the episodes become rows (an external agent's
episode of several segments too: `nanosky/endpoint/rows.py` gives each segment as a step):

    rows = samples(trajs)                      # one Trajectory per step: prompt (mask 0) + sampled ids (mask 1)
    adv = advantages(trajs, rows, cfg)         # [N] one advantage per row, from the registered estimator

Token-in/token-out holds inside each row: its response ids are exactly the sampled ids, with the engine's
logprobs. Advantages are computed on the *episode view*, a [E, S] matrix with one row per episode and one column
per step holding that step's reward (the per-turn env rewards, the rest of the episode's reward on its last step):
an outcome estimator (grpo, rloo, dr_grpo) sees each episode's return once, whatever its length, so every step of
an episode gets its episode's advantage; GiGPO reads the columns as steps (`needs_steps`); reinforce_pp's
reward-to-go runs over steps. GAE (a critic) instead runs on the rows themselves, each row's reward being its
episode's return. The loss then treats rows like any other: token-mean normalises by the action tokens of all
rows in the global batch, seq-mean-* by the number of rows (steps), not episodes. `--rollout.step-weight episode`
scales each row's advantage by S_mean / S_i (`episode_weights`), so each episode weighs the same however many turns
it ran (by default a failed 30-turn episode outweighs a 10-turn success 3 to 1).
"""

from __future__ import annotations

import torch

import algos
from algos import AlgoConfig, StepInfo
from algos.registry import ADV_ESTIMATORS
from nanosky import dist
from nanosky.agent.trajectory import Trajectory
from nanosky.train.batch import Batch, balanced_split
from nanosky.train.step_credit import anchor_metrics, estimator_kwargs, step_keys, step_rewards


def samples(trajs: list[Trajectory]) -> list[Trajectory]:
    """One row per step of every episode, in episode then step order. A row records its episode (index in `trajs`)
    and step in `info`, the step's reward in `turn_rewards`, its state key in `state_keys`, and the episode's
    return in `reward`."""
    rows = []
    for i, t in enumerate(trajs):
        rewards, keys = step_rewards(t, len(t.steps)), step_keys(t, i, len(t.steps))
        for k, s in enumerate(t.steps):
            n = len(s.prompt_ids)
            rows.append(
                Trajectory(
                    ids=s.prompt_ids + s.ids,
                    loss_mask=[0] * n + (s.loss_mask if s.loss_mask is not None else [1] * len(s.ids)),
                    logprobs=[0.0] * n + list(s.logprobs),
                    versions=[-1] * n + s.versions if s.versions is not None else [],
                    prompt_len=n,
                    reward=t.reward,
                    turn_rewards=[rewards[k]],
                    state_keys=[keys[k]],
                    success=t.success,
                    stop_reason=t.stop_reason,
                    turns=1,
                    group=t.group,
                    env_seed=t.env_seed,
                    task_id=t.task_id,
                    info={"episode": i, "step": k},
                    constraints=[(n, s.constraint)] if s.constraint else [],
                )
            )
    return rows


def split_rows(rows: list[Trajectory], world: int) -> list[list[int | None]]:
    """Row indices for each rank, token-balanced, the same count on every rank (FSDP runs the same number of
    passes everywhere): the last ranks get a `None` (a padding row, masked and not counted) where N % world != 0."""
    per = -(-len(rows) // world)
    lengths = [len(r.ids) for r in rows] + [0] * (per * world - len(rows))
    return [[i if i < len(rows) else None for i in part] for part in balanced_split(lengths, world)]


def episode_view(
    trajs: list[Trajectory], rows: list[Trajectory], penalties: list[float] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, StepInfo]:
    """The estimator's input over episodes: step rewards [E, S] (minus each row's `penalties`, e.g. KL in the
    reward), the step mask [E, S], group ids [E], and the same steps as a StepInfo (step t of episode i is column
    t)."""
    E, S = len(trajs), max([len(t.steps) for t in trajs] + [1])
    rewards, mask = torch.zeros(E, S), torch.zeros(E, S)
    info = StepInfo([[] for _ in trajs], [[] for _ in trajs], [[] for _ in trajs])
    for n, r in enumerate(rows):
        i, k = r.info["episode"], r.info["step"]
        rewards[i, k] = r.turn_rewards[0] - (penalties[n] if penalties else 0.0)
        mask[i, k] = 1.0
        info.spans[i].append((k, k + 1))
        info.rewards[i].append(float(rewards[i, k]))
        info.state_keys[i].append(r.state_keys[0])
    return rewards, mask, torch.tensor([t.group for t in trajs]), info


def advantages(
    trajs: list[Trajectory],
    rows: list[Trajectory],
    cfg: AlgoConfig,
    penalties: list[float] | None = None,
    weight: str = "step",
) -> torch.Tensor:
    """[N] the advantage of every row, from the registered estimator run on the episode view (identical on every
    rank: every rank holds all episodes), times `episode_weights` (`weight`). Not for estimators that need values
    (GAE runs on the rows)."""
    return _estimate(episode_view(trajs, rows, penalties), rows, cfg) * episode_weights(trajs, rows, weight)


def episode_weights(trajs: list[Trajectory], rows: list[Trajectory], weight: str = "step") -> torch.Tensor:
    """[N] each row's loss weight (`--rollout.step-weight`), applied to its advantage. step: 1 for every row.
    episode: S_mean / S_i, S_i = the turns of the row's episode and S_mean their mean over the batch's episodes, so
    each episode's rows sum to S_mean: the weights still average 1 per row, and a failed 30-turn episode no longer
    outweighs a successful 10-turn one 3 to 1. Scaling the advantage is scaling the policy-gradient term of the
    loss (the KL and entropy terms keep every token at weight 1)."""
    if weight == "step" or not rows:
        return torch.ones(len(rows))
    if weight != "episode":
        raise ValueError(f"step weight must be 'step' or 'episode', got {weight!r}")
    n = [len(t.steps) for t in trajs]
    mean = sum(n) / len(n)
    return torch.tensor([mean / n[r.info["episode"]] for r in rows])


def _estimate(view: tuple, rows: list[Trajectory], cfg: AlgoConfig) -> torch.Tensor:
    if ADV_ESTIMATORS.meta(cfg.adv_estimator)["needs_values"]:
        raise ValueError(f"{cfg.adv_estimator} needs a critic's values: compute it on the rows")
    rewards, mask, groups, steps = view
    fn = algos.get_adv_estimator(cfg.adv_estimator)
    adv, _ = fn(rewards, mask, groups, **estimator_kwargs(cfg, steps))  # [E, S]
    return torch.stack([adv[r.info["episode"], r.info["step"]] for r in rows]) if rows else torch.zeros(0)


def assign_advantages(
    batch: Batch,
    trajs: list[Trajectory],
    rows: list[Trajectory],
    mine: list[int | None],
    cfg: AlgoConfig,
    penalty: torch.Tensor | None = None,
    weight: str = "step",
) -> dict[str, float]:
    """Set `batch.advantages` / `returns` (this rank's rows `mine`, None = padding) from `advantages`, weighted by
    `episode_weights`. `penalty` [B] is what KL-in-reward took from each local row; every rank's are gathered so the
    episode view is whole.
    Returns GiGPO's anchor metrics for a step-level estimator (over all episodes: the same on every rank)."""
    pen = None
    if penalty is not None:
        pen = [0.0] * len(rows)
        pairs = [(j, p) for j, p in zip(mine, penalty.tolist()) if j is not None]
        for part in dist.all_gather_objects(pairs):
            for j, p in part:
                pen[j] = p
    view = episode_view(trajs, rows, pen)
    adv = _estimate(view, rows, cfg) * episode_weights(trajs, rows, weight)  # [N]
    a = torch.tensor([0.0 if j is None else float(adv[j]) for j in mine], device=batch.loss_mask.device)
    batch.advantages = batch.returns = a[:, None] * batch.loss_mask  # [B, L-1]
    log_turn_advantages(trajs, rows, adv.tolist())
    if not ADV_ESTIMATORS.meta(cfg.adv_estimator)["needs_steps"]:
        return {}
    return anchor_metrics(view[3], [t.group for t in trajs], cfg.gamma, cfg.step_adv_mode)


def log_turn_advantages(trajs: list[Trajectory], rows: list[Trajectory], adv: list[float]) -> None:
    """Each turn's advantage into its episode's `turn_log` (for rollouts.jsonl and the viewer), where the episode's
    rows are its turns one to one (an external agent's segments may hold several calls: left out)."""
    n = [0] * len(trajs)
    for r in rows:
        n[r.info["episode"]] += 1
    for r, x in zip(rows, adv):
        log = trajs[r.info["episode"]].turn_log
        if len(log) == n[r.info["episode"]]:
            log[r.info["step"]]["advantage"] = round(x, 4)
