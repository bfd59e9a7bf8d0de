"""On-policy distillation's one config (`--distill.teacher PATH`, `--distill.reward-weight`): a teacher given is
the switch; `--algo distill` is the algorithm preset that goes with it (GRPO's estimator for the env reward mixed in,
PPO's loss at r = 1). `--teacher.path` is the teacher's flag too (nanosky/cli.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class DistillConfig:
    teacher: str | None = None
    """The teacher (`--teacher.path` too): an HF folder, a run dir or checkpoint, a GGUF file or a bundled name; any
    size or architecture, with the student's tokenizer (another is refused at start-up). Given, the run distils:
    frozen and sharded in the trainer, where a KL reference is held, the teacher scores the tokens the student
    sampled, so multi-turn and endpoint episodes work. None: no distillation."""
    reward_weight: float = 0.0
    """The env's reward mixed in: advantage = (log π_teacher − log π_student) + w × the run's estimator's advantage
    on the env reward (GRPO's by default). 0: distillation alone (the env's reward is still logged)."""

    def __post_init__(self):
        if self.reward_weight < 0:
            raise ValueError(f"distill.reward_weight must be >= 0, got {self.reward_weight}")

    @property
    def on(self) -> bool:
        return self.teacher is not None
