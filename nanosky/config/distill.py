"""The teacher and the mix of on-policy distillation (`--algo distill --teacher.path PATH`, `--distill.*`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class TeacherConfig:
    path: str | None = None
    """`--algo distill`'s teacher: an HF folder, a run dir or checkpoint, a GGUF file or a bundled name; any size or
    architecture, with the student's tokenizer (another is refused at start-up). Frozen and sharded in the trainer,
    where a KL reference is held; it scores the tokens the student sampled, so multi-turn and endpoint episodes work."""


@dataclass(kw_only=True)
class DistillConfig:
    reward_weight: float = 0.0
    """The env's reward mixed in: advantage = (log π_teacher − log π_student) + w × the run's estimator's advantage
    on the env reward (GRPO's by default). 0: distillation alone (the env's reward is still logged)."""

    def __post_init__(self):
        if self.reward_weight < 0:
            raise ValueError(f"distill.reward_weight must be >= 0, got {self.reward_weight}")
