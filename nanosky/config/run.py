"""The run's configs: `--eval.*` (the held-out eval during training), `--log.*` (run dir, checkpoints, samples),
`--probe.*` (the sync check), `--dist.*` and `--debug.*`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class EvalConfig:
    every: int = 10
    """Evaluate on the held-out split every k steps (and at step 0 and at the end); 0 = only start and end."""
    limit: int = 200
    """Held-out problems to evaluate."""
    n_samples: int = 2
    """Samples per problem; accuracy is the mean over all samples (mean@n)."""
    temperature: float = 1.0
    """Eval sampling temperature (1.0 measures the policy as it samples in training)."""
    split: Literal["test", "validation"] = "test"
    """The held-out split evaluated in-run: validation to choose the lr, the step count and the checkpoint (envs
    that have one: text_math, reasoning_gym), test for a final figure."""
    before_train: bool = True
    """Evaluate at step 0, before any update (`--eval.no-before-train`: skip it where the starting model's score is
    known, e.g. a warm start from a checkpoint already evaluated; the run's initial accuracy is then NaN)."""

    def __post_init__(self):
        if self.every < 0 or self.limit < 1 or self.n_samples < 1:
            raise ValueError("eval.every must be >= 0, eval.limit and eval.n_samples >= 1")


@dataclass(kw_only=True)
class LogConfig:
    run_dir: str = "runs/{env}-{algo}-s{seed}"
    """Run directory (TensorBoard events, rollouts.jsonl, checkpoints, summary.json); {env}/{algo}/{seed} expand."""
    ckpt_every: int = 0
    """Save a training checkpoint (sharded model/optimizer/RNG state + an HF export in `export/`) every k steps;
    0 = only at the end."""
    keep_ckpts: int = 3
    """Keep the last K checkpoints."""
    samples_per_step: int = 4
    """Rollouts written to rollouts.jsonl each step (and two to TensorBoard's text tab): whole groups, at least this
    many trajectories, with their per-token values (`nanosky/trace.py`) for the viewer (`python -m nanosky.view`)."""
    sample_tokens: int = 8192
    """At most this many tokens per step carry per-token values in rollouts.jsonl (~20 bytes each: ≤ 160 KB a step,
    ≤ 160 MB over 1,000 steps); the groups past it are written without them."""
    eval_samples: int = 2
    """Eval rollouts written to rollouts.jsonl (split "eval") at each eval, from rank 0's share of the held-out
    episodes; a large number keeps all of that share, to read where the held-out episodes fail."""
    tqdm: bool = True
    profile_step: int = 0
    """Profile this step's logprob, train and sync phases with torch.profiler (0: never): per rank and phase, a
    Chrome / Perfetto trace `profile/step{N}.rank{r}.{phase}.trace.json` and the top operators' table beside it
    (`.txt`); `bench/profile_step.py` groups a trace into matmuls, attention, the head, casts, collectives, ...."""
    overwrite: bool = False
    """Start afresh in a run dir that holds an earlier run (checkpoints or TensorBoard events): the earlier run is
    moved to a timestamped sibling folder (`runs/x.20261126-101500`), nothing is deleted. Without it such a start is
    refused; `--resume latest` continues the earlier run instead."""

    def __post_init__(self):
        if self.samples_per_step < 0 or self.sample_tokens < 0 or self.eval_samples < 0 or self.profile_step < 0:
            raise ValueError(
                "log.samples-per-step, log.sample-tokens, log.eval-samples and log.profile-step must be >= 0"
            )


@dataclass(kw_only=True)
class ProbeConfig:
    max_mean_diff: float | None = None
    """Fail the run when the mean |trainer − engine| logprob on the probe exceeds this after a sync (stale
    weights). None = calibrated at the build sync, where both sides hold the same weights: 4 × that gap, at least
    1e-4 (float32 engine) or 0.02 (bf16/fp16); a build gap over 1e-3 / 0.25 is refused (`nanosky/sync.py`)."""


@dataclass(kw_only=True)
class DistConfig:
    timeout_s: float = 600.0
    """Collective timeout: a rank stuck this long in a collective fails the job instead of hanging it."""


@dataclass(kw_only=True)
class DebugConfig:
    """Testing only: settings that break a run on purpose, to check that the run notices, or that make a timing
    fact happen on any machine."""

    skip_sync: bool = False
    """Do not push weights to the engine after an update (the sync probe must then catch the stale engine)."""
    hold_extra_groups: bool = False
    """Partial rollouts: the groups a phase starts beyond its rank's share send their episodes' first requests, and
    hold the rest until that phase has ended, so episodes are carried across a weight update, cut mid-episode, on
    any machine, fast or slow (without it, which episodes are carried is timing)."""
    fail_rank: int = -1
    """This rank raises at `fail_step` (checks that the whole job stops promptly)."""
    fail_step: int = 0

    def fail_here(self, step: int, rank: int) -> None:
        """Raise where `--debug.fail-rank/-step` say (the injected failure); nothing otherwise."""
        if step == self.fail_step and rank == self.fail_rank:
            raise RuntimeError(f"injected failure on rank {rank} at step {step} (--debug)")
