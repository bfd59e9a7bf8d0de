"""Judged eval: an env's held-out split scored by a judge, with the `--reward.*` flags training takes. It is how an
env without a checker (envs/reply.py) is evaluated, and it puts a judge beside the checker of one that has one.

    python -m evals.judged --ckpt runs/reply-grpo                       # the judge that run trained with
    python -m evals.judged --ckpt runs/reply-grpo --env reply --reward.judge group --reward.judge-url URL
    python -m evals.judged --ckpt tiny --env reply --reward.judge pointwise --reward.judge-url self --limit 20

Episodes 0..limit-1 of the env's test split (default limit 100), --n-samples each, judged as a group per episode
(group mode: the samples relative to each other). The report's headline is `score`, the judge's mean over what it
scored; `judge_errors` counts masked groups (a score over nothing is NaN, never 0); `accuracy` is there where the
env has a checker. examples.jsonl keeps each episode's score and explanation. Given a run dir without --reward.*,
the run's own judge settings are read from its config.json. `self` judges with the evaluated model (--ckpt).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import envs
from evals import common, models
from nanosky import process
from nanosky.agent.trajectory import success_rate
from nanosky.config.reward import RewardConfig
from nanosky.judge.rewards import Judging


@dataclass(kw_only=True)
class JudgedEvalConfig(common.BaseEvalConfig):
    env: str = "reply"
    """A registered env (its test split), e.g. reply, or one of --plugins."""
    env_kwargs: str = "{}"
    """The env's keyword arguments, as JSON."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The judge: --reward.judge group|pointwise, --reward.judge-url URL|self, --reward.rubric, ... (as in training).
    Left off with a run dir as --ckpt: that run's own."""

    def __post_init__(self):
        super().__post_init__()
        if self.reward.judge == "off" and (run := _run_reward(self.ckpt)) is not None:
            self.reward = run
        if self.reward.judge == "off":
            raise ValueError(
                "evals.judged needs a judge: --reward.judge group|pointwise --reward.judge-url URL|self "
                "(or a run dir as --ckpt that trained with one)"
            )
        if self.reward.judge_url == "self" and not self.ckpt:
            raise ValueError("--reward.judge-url self judges with the evaluated model: it needs --ckpt")
        if self.reward.judge_url == "self" and self.reward.judge_max_tokens >= self.max_model_len:
            raise ValueError(
                f"--reward.judge-max-tokens {self.reward.judge_max_tokens} leaves no room for the judge's prompt "
                f"in --max-model-len {self.max_model_len}"
            )


def _run_reward(ckpt: str | None) -> RewardConfig | None:
    """The judge a run trained with, from the config.json of `ckpt` (a run dir, or a checkpoint or export in one)."""
    if not ckpt:
        return None
    p = Path(ckpt)
    for d in (p, *p.parents[:3]):
        f = d / "config.json"
        if f.is_file() and "reward" in (cfg := json.loads(f.read_text(encoding="utf-8"))):
            r = cfg["reward"]
            return RewardConfig(**r) if r.get("judge", "off") != "off" else None
    return None


def evaluate(model, tok, cfg: JudgedEvalConfig) -> tuple[dict, list[dict]]:
    """(report, records): the env's first `limit` test episodes, played and judged."""
    t0, n = time.time(), cfg.limit or 100
    kwargs = json.loads(cfg.env_kwargs)
    episodes = [envs.make(cfg.env, split="test", seed=i, **kwargs) for i in range(n) for _ in range(cfg.n_samples)]
    trajs = models.rollout(model, tok, episodes, cfg, desc=f"{cfg.env} (judged)")
    for j, t in enumerate(trajs):
        t.env_seed = j // cfg.n_samples  # the judge's groups: the samples of one episode
    backend = model if cfg.reward.judge_url == "self" else None
    total, scored, masked = Judging(cfg.reward, backend).held_out(trajs, asyncio.run)
    records = []
    for j, t in enumerate(trajs):
        i, s = divmod(j, cfg.n_samples)
        judge = t.info.get("judge", {})
        records.append(
            common.record(
                i,
                s,
                t,
                score=judge.get("score"),
                explanation=judge.get("explanation"),
                judge_error=judge.get("error"),
                correct=t.success,
                reward=t.reward,
            )
        )
    extra = {
        "score": total / scored if scored else float("nan"),
        "judge_errors": int(masked),
        "judge": cfg.reward.judge,
        "judge_url": cfg.reward.judge_url,
    }
    if envs.has_checker(cfg.env):
        extra["accuracy"] = success_rate(trajs)
    report = common.finish_report(f"judged/{cfg.env}", records, [], time.time() - t0, "score", **extra)
    return report, records


def main(argv: list[str] | None = None) -> dict:
    import tyro

    cfg = tyro.cli(JudgedEvalConfig, args=argv, description=__doc__)
    return models.run_cli(f"judged-{cfg.env}", cfg, lambda model, tok: evaluate(model, tok, cfg))


if __name__ == "__main__":
    main()
    process.exit_now(0)  # a finished eval skips the interpreter's ~2 s teardown (torch, vLLM and transformers loaded)
