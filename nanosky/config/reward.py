"""`--reward.*`: rewards from a model (a judge), alone or added to the env's checker (`nanosky/judge/`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(kw_only=True)
class RewardConfig:
    judge: Literal["off", "group", "pointwise"] = "off"
    """A judge model scores the trajectories. group (RULER-style): one call scores a whole group, relative to each
    other, the shared task sent once; pointwise: one call per trajectory."""
    rubric: str | None = None
    """A plain-text rubric file; None: the default rubric (`nanosky/judge/rubric.txt`)."""
    judge_url: str | None = None
    """Any OpenAI-compatible server (…/v1), e.g. a `vllm serve` of a larger model; or `self`: the run's own engine
    (the policy judges its own attempts, at temperature 0, between the rollout and the update; docs/judge.md says
    why that can be gamed)."""
    judge_model: str = "judge"
    """The model name sent to the judge server."""
    judge_key_env: str = "NANOSKY_JUDGE_KEY"
    """The environment variable that holds the judge server's API key (never a flag: it would land in config.json
    and the shell's history). Unset: no key is sent."""
    judge_weight: float = 1.0
    """reward = env reward + judge_weight × judge score (in [0, 1]); see `judge_only`."""
    judge_only: bool = False
    """reward = the judge's score alone (envs without a checker)."""
    judge_concurrency: int = 8
    """Groups judged at once, per rank, by a server (`self` judges all of them at once: the engine batches them)."""
    judge_timeout_s: float = 120.0
    """One judge call's limit; a call that times out is retried once, then its group is masked."""
    judge_max_tokens: int = 1024
    """`self`: the tokens one judgement may take. Its schema bounds each explanation to fit (a group's share each),
    so every answer finishes; the judge's prompt plus this must fit --engine.max-model-len."""

    def __post_init__(self):
        if self.judge != "off" and not self.judge_url:
            raise ValueError("--reward.judge needs --reward.judge-url (an OpenAI-compatible server's …/v1)")
        if self.rubric and not Path(self.rubric).is_file():
            raise ValueError(f"--reward.rubric {self.rubric}: no such file")
        if self.judge_concurrency < 1 or self.judge_timeout_s <= 0 or self.judge_max_tokens < 1:
            raise ValueError(
                "reward.judge-concurrency and reward.judge-max-tokens must be >= 1, reward.judge-timeout-s > 0"
            )
