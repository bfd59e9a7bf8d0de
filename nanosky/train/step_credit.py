"""The steps inside multi-turn trajectories, for step-level credit (GiGPO's anchor states).

A concatenated multi-turn trajectory holds every assistant turn as one run of loss-mask-1 tokens, separated by
observation tokens (mask 0). `step_info` finds those runs and pairs each with the turn's env reward and the state
key the runner recorded before the action (`Trajectory.state_keys`), in the batch's response coordinates.
"""

from __future__ import annotations

import torch

import algos
from algos import StepInfo
from nanosky.agent.trajectory import Trajectory


def action_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s in a token-level loss mask."""
    spans, start = [], None
    for p, m in enumerate([*loss_mask, 0]):
        if m and start is None:
            start = p
        elif not m and start is not None:
            spans.append((start, p))
            start = None
    return spans


def step_rewards(t: Trajectory, n: int) -> list[float]:
    """r_{t,k} for the trajectory's n steps: what the env paid per turn, with the rest of `t.reward` (the final
    verdict, shaping, a failed episode's 0) on the last step, so they sum to the trajectory's reward."""
    r = list(t.turn_rewards[:n]) + [0.0] * (n - len(t.turn_rewards))
    if r:
        r[-1] += t.reward - sum(r)
    return r


def step_keys(t: Trajectory, i: int, n: int) -> list:
    """The state keys of trajectory i's n steps: a step whose turn never reached its env step (no key recorded)
    gets a key no other step has."""
    return list(t.state_keys[:n]) + [("unstepped", t.group, i, k) for k in range(len(t.state_keys), n)]


def estimator_kwargs(cfg: algos.AlgoConfig, steps: StepInfo | None) -> dict:
    """Keyword arguments of the registered estimator: γ, λ, and for a step-level one (`needs_steps`) the steps, ω
    and the normalisation mode."""
    kw = {"gamma": cfg.gamma, "lam": cfg.lam}
    if algos.registry.ADV_ESTIMATORS.meta(cfg.adv_estimator)["needs_steps"]:
        kw |= {"steps": steps, "omega": cfg.step_adv_weight, "mode": cfg.step_adv_mode}
    return kw


def step_info(trajs: list[Trajectory]) -> StepInfo:
    """StepInfo of a batch built by `to_batch(trajs)`: spans shifted by one (position p of the batch's [B, L-1]
    tensors scores token p+1), `step_rewards` per step. Tokens sampled in a turn that never
    reached its env step form a step of their own, with a key no other step has."""
    spans, rewards, keys = [], [], []
    for i, t in enumerate(trajs):
        s = [(a - 1, b - 1) for a, b in action_spans(t.loss_mask)]
        spans.append(s)
        rewards.append(step_rewards(t, len(s)))
        keys.append(step_keys(t, i, len(s)))
    return StepInfo(spans, rewards, keys)


def anchor_metrics(steps: StepInfo, groups: list[int], gamma: float, mode: str) -> dict[str, float]:
    """What GiGPO's step term sees: mean anchor-group size, the share of steps in non-singleton anchors, and the
    std of the step-level advantages A^S."""
    rows = [(i, t) for i in range(len(steps.spans)) for t in range(len(steps.spans[i]))]
    if not rows:  # same keys on every rank: the caller all-reduces them
        return {
            "gigpo/anchor_size_mean": 0.0,
            "gigpo/anchor_nonsingleton_frac": 0.0,
            "gigpo/step_adv_std": 0.0,
        }
    g = torch.tensor([groups[i] for i, _ in rows])
    keys = [steps.state_keys[i][t] for i, t in rows]
    q = [algos.discounted_returns(steps.rewards[i], gamma)[t] for i, t in rows]
    a_step = algos.step_group_advantages(torch.tensor(q, dtype=torch.float64), list(zip(g.tolist(), keys)), mode)
    stats = algos.anchor_stats(g, keys)
    return {
        "gigpo/anchor_size_mean": stats["anchor_size_mean"],
        "gigpo/anchor_nonsingleton_frac": stats["anchor_nonsingleton_frac"],
        "gigpo/step_adv_std": float(a_step.std()) if len(rows) > 1 else 0.0,
    }
