"""Held-out evaluation during training (`eval/*` tags; `Evaluator` decides when), played by the run's player.

evaluator = Evaluator(cfg, rollout, log, rank)
if evaluator.due(step): acc = evaluator(step, version)     # --eval.every k; the run's close evaluates the end
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanosky import dist
from nanosky.seeds import derive_seed

if TYPE_CHECKING:
    from nanosky.collect import Rollout
    from nanosky.config import TrainConfig
    from nanosky.logger import RunLogger


def evaluate(rollout_fn, limit: int, n_samples: int) -> tuple[dict[str, float], list]:
    """Mean@n success on the first `limit` test episodes, split across ranks. `rollout_fn(seeds)` rolls out the
    test episodes with those seeds. Returns (metrics, this rank's trajectories)."""
    info = dist.get_info()
    idx = list(range(info.rank, limit, info.world))
    trajs = rollout_fn([i for i in idx for _ in range(n_samples)])
    s = dist.all_reduce_sum(
        [
            float(sum(t.success for t in trajs)),
            float(len(trajs)),
            float(sum(t.reward for t in trajs)),
            float(sum(t.n_policy_tokens for t in trajs)),
            float(sum(t.tool_calls for t in trajs)),
            float(sum(t.turns for t in trajs)),
        ]
    )
    n = max(s[1], 1.0)
    return {
        "eval/accuracy": s[0] / n,
        "eval/reward_mean": s[2] / n,
        "eval/response_len": s[3] / n,
        "eval/tool_calls_per_traj": s[4] / n,
        "eval/turns_mean": s[5] / n,
    }, trajs


class Evaluator:
    """The held-out eval of a training run: `limit` test episodes × `n_samples`, split across ranks."""

    def __init__(self, cfg: TrainConfig, rollout: Rollout, log: RunLogger, rank: int):
        self.cfg, self.rollout, self.log = cfg, rollout, log
        # Same sampling seeds at every eval (common random numbers): accuracy changes come from the weights.
        self.sample_seed = derive_seed(cfg.seed, "eval", rank)

    def due(self, step: int) -> bool:
        """`--eval.every k`: every k steps; step 0 and the last step are evaluated by the run's start and close."""
        every = self.cfg.eval.every
        return bool(every) and step % every == 0 and step != self.cfg.steps

    def __call__(self, step: int, version: int) -> float:
        """Evaluate, log `eval/*` and the eval rollouts at `step`; returns the accuracy (mean@n success)."""
        cfg = self.cfg

        def rollout_fn(seeds: list[int]) -> list:
            return self.rollout.run(
                cfg.env, cfg.env_args(), "test", seeds, version,
                sample_seed=self.sample_seed, temperature=cfg.eval.temperature,
            ).trajs  # fmt: skip

        m, trajs = evaluate(rollout_fn, cfg.eval.limit, cfg.eval.n_samples)
        self.log.scalars(step, m)
        self.log.rollouts(step, trajs, self.rollout.tok, cfg.log.eval_samples, tag="eval")
        self.log.print(f"step {step}: eval accuracy {m['eval/accuracy']:.3f}")
        return m["eval/accuracy"]
