"""What an env's episodes say beyond their own rewards: a group's rewards from a group scorer (a TRL reward
function: `envs.group_scorer`), and the env's metrics for TensorBoard (`env/*`).

    score_groups(scorer, trajs, by="group")             # in place, on this rank's episodes, before the gather
    m = env_metrics("skyrl_gym", trajs, scored)         # {"env/gsm8k_multi_turn/avg_steps": ..., ...}

A scorer that raises, or returns the wrong length, masks its group (no token of it is trained, as for a failed
judgement) and marks each episode `info["reward_error"]`; the run goes on, and `env/reward_errors` counts the
groups. An unscored episode (None) keeps reward 0 and success None: it counts as for an env without a checker.
Each rank scores its own groups (a group never spans ranks), so a user's function runs once per group.
"""

from __future__ import annotations

import envs
from nanosky.agent.trajectory import SCORED, Trajectory


def reply_text(t: Trajectory) -> str:
    """The episode's last assistant turn ("" when it never answered)."""
    return next((m.get("content") or "" for m in reversed(t.messages) if m.get("role") == "assistant"), "")


def score_groups(scorer, trajs: list[Trajectory], by: str = "group") -> None:
    """Score each group of `trajs` (keyed by `by`: "group" in training, "env_seed" in the eval) with `scorer`, in
    place. A group the scorer failed on is marked on its episodes (`info["reward_error"]`), which travel through the
    gather: `env_metrics` counts them there, once, over every rank's groups."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(getattr(t, by), []).append(t)
    for members in groups.values():
        live = [t for t in members if t.stop_reason in SCORED]  # env / backend failures keep their 0
        if not live:
            continue
        try:
            rewards, successes = scorer([t.env_seed for t in live], [reply_text(t) for t in live])
        except Exception as e:  # noqa: BLE001 - costs this group only
            for t in members:
                t.info["reward_error"] = str(e)[:500]
                t.reward, t.success = 0.0, None
                t.mask_out()
            continue
        for t, r, s in zip(live, rewards, successes):
            t.reward, t.success = (0.0, None) if r is None else (r, s)
            if r is None:
                t.info["unscored"] = True


def env_metrics(env: str, trajs: list[Trajectory], scored: bool = False) -> dict[str, float]:
    """The batch's `env/*` scalars: the env's own metrics (`info["env_metrics"]`, aggregated by the env) and, for an
    env scored by groups (`scored`), the groups its reward function failed on."""
    reported = [t.info["env_metrics"] for t in trajs if isinstance(t.info.get("env_metrics"), dict)]
    out = {f"env/{k}": float(v) for k, v in envs.aggregate_metrics(env, reported).items()} if reported else {}
    if scored:
        out["env/reward_errors"] = float(len({t.group for t in trajs if "reward_error" in t.info}))
    return out
