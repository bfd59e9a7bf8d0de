"""`TrainConfig`: one dataclass per component, composed; `--algo NAME` and `--preset NAME` pick starting points.

    python run.py --help                          # every flag, documented at its field
    python run.py --algo dapo --env math --algorithm.clip-high 0.3 --rollout.group-size 4

The presets (`--preset NAME`) are in `nanosky/presets.py`, the command line itself in `nanosky/cli.py`. This package
is a leaf: plain dataclasses that import no component (engine.py, model.py, rollout.py, run.py hold the parts); a
component takes its config from here.

Validation runs in each dataclass's `__post_init__` (bad values fail at start-up naming the field); checks that need
the world size run in `TrainConfig.validate_for_world`.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Literal

import algos
from algos import AlgoConfig
from algos.registry import ADV_ESTIMATORS
from nanosky.config.distill import DistillConfig
from nanosky.config.engine import EngineConfig
from nanosky.config.model import ALL_LINEAR, LoraConfig, ModelConfig, OptimConfig
from nanosky.config.reward import RewardConfig
from nanosky.config.rollout import EnvPoolConfig, RolloutConfig
from nanosky.config.run import DebugConfig, DistConfig, EvalConfig, LogConfig, ProbeConfig

__all__ = [
    "ALL_LINEAR",
    "DebugConfig",
    "DistConfig",
    "DistillConfig",
    "EngineConfig",
    "EnvPoolConfig",
    "EvalConfig",
    "LogConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "ProbeConfig",
    "RolloutConfig",
    "TrainConfig",
    "import_plugins",
]


def import_plugins(modules: list[str]) -> None:
    """Import the user's modules (from the working directory too, as `python -m` does) so their @register_* calls
    run."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        importlib.import_module(module)


@dataclass(kw_only=True)
class TrainConfig:
    env: str = "math"
    """Environment name (envs.make): math, tool_use, webshop_lite, alfworld_lite, swe, or a registered one."""
    env_data: str | None = None
    """Optional data file for the env (e.g. GSM8K-style JSONL for math)."""
    env_kwargs: dict[str, str] = field(default_factory=dict)
    """Extra env constructor arguments, e.g. `--env-kwargs page_size 3 max_turns 6` or `--env-kwargs.page-size 3`
    (values parsed as JSON when they are JSON, else kept as strings); merged over the preset's."""
    steps: int = 50
    """Optimizer steps (rollout → update → sync cycles)."""
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """The run's numerics, engine and trainer together (fp32 master weights and optimizer state always): bf16 runs
    the engine in bf16 and the trainer's compute through FSDP2's bf16 mixed precision. auto = bf16 on CUDA and on a
    CPU with bf16 units (AMX, AVX-512-BF16), fp32 on other CPUs (`nanosky/precision.py`)."""
    plugins: list[str] = field(default_factory=list)
    """Python modules imported first (`--plugins my_losses my_envs`): the losses, estimators and envs they register
    become valid --algorithm.* / --env values."""
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    envpool: EnvPoolConfig = field(default_factory=EnvPoolConfig)
    algorithm: AlgoConfig = field(default_factory=lambda: algos.preset("grpo"))
    """The RL algorithm; `--algo NAME` replaces it with the preset NAME (grpo, dr_grpo, rloo, reinforce_pp, ppo, dapo,
    gspo, sapo, cispo, gigpo; sft: supervised on the env's expert's episodes; distill: on-policy distillation from
    `--distill.teacher`), and every field stays overridable
    (`--algo dapo --algorithm.clip-high 0.3`)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    dry_run: bool = False
    """One step with the longest possible sequences (no eos), no eval, then exit: exposes OOM at step 0."""
    resume: str | None = None
    """Resume from `latest` (the last complete checkpoint of this run dir) or a checkpoint PATH; a requested resume
    with no checkpoint fails."""

    def __post_init__(self):
        import envs

        import_plugins(self.plugins)
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.env not in envs.env_names():
            raise ValueError(f"env: unknown env {self.env!r}; valid: {', '.join(envs.env_names())}")
        distills = self.distill.on
        if self.algorithm.name == "distill" and not distills:
            raise ValueError("--algo distill needs --distill.teacher (the model whose log-probs are the signal)")
        if distills and self.demonstrations:
            raise ValueError("--distill.teacher scores the student's own samples; --algo sft plays the expert's")
        grouped = ADV_ESTIMATORS.meta(self.algorithm.adv_estimator)["per_group"]
        # a group baseline is needed only for the env reward mixed in
        if grouped and self.rollout.group_size < 2 and not (distills and not self.distill.reward_weight):
            raise ValueError(
                f"rollout.group_size must be >= 2 for the group estimator "
                f"{self.algorithm.adv_estimator!r}, got {self.rollout.group_size}"
            )
        if self.eval.split != "test" and self.eval.split not in (splits := envs.env_class(self.env).splits):
            raise ValueError(f"eval.split {self.eval.split!r}: env {self.env!r} makes only {', '.join(splits)}")
        if self.rollout.max_total_tokens > self.engine.max_model_len:
            raise ValueError(
                f"rollout.max_total_tokens ({self.rollout.max_total_tokens}) exceeds "
                f"engine.max_model_len ({self.engine.max_model_len})"
            )
        if self.demonstrations and self.rollout.partial:
            raise ValueError("rollout.max_staleness > 0 with demonstrations (--algo sft): nothing is sampled to carry")
        if self.demonstrations and self.rollout.group_size != 1:  # `--algo sft` sets 1 (nanosky/cli.py)
            raise ValueError(
                f"rollout.group_size must be 1 with demonstrations (--algo sft), got {self.rollout.group_size}: "
                "the expert plays a prompt the same way every time"
            )
        if self.rollout.partial and self.algorithm.dynamic_sampling:
            raise ValueError("rollout.max_staleness > 0 with algorithm.dynamic_sampling is not supported yet")
        if self.algorithm.overlong_cache_len >= self.rollout.max_new_tokens and self.algorithm.overlong_cache_len:
            raise ValueError("algorithm.overlong_cache_len must be < rollout.max_new_tokens")

    def finalize(self) -> None:
        """Derived values, set once when training starts (and so recorded in config.json): the dry run's overrides
        and the constant C of seq-mean-token-sum-norm (the max response length of a row, unless given)."""
        if self.dry_run:
            self.steps, self.eval.every, self.eval.limit, self.log.ckpt_every = 1, 0, 1, 0
            self.rollout.ignore_eos = True
        if self.algorithm.norm_const is None:
            # a step-wise row holds one turn, a concatenated one all of them
            turns = 1 if self.rollout.mode == "stepwise" else (self.rollout.max_turns or 1)
            self.algorithm.norm_const = self.rollout.max_new_tokens * turns

    @property
    def demonstrations(self) -> bool:
        """The run trains on the env's expert's episodes (an estimator registered with `demos=True`: `--algo sft`)."""
        return ADV_ESTIMATORS.meta(self.algorithm.adv_estimator).get("demos", False)

    def validate_for_world(self, world: int) -> None:
        if self.rollout.prompts_per_step % world:
            raise ValueError(
                f"rollout.prompts_per_step ({self.rollout.prompts_per_step}) must be divisible by the "
                f"world size ({world})"
            )
        local = self.rollout.prompts_per_step * self.rollout.group_size // world
        if local % self.algorithm.mini_batches:
            raise ValueError(
                f"per-rank batch ({local}) must be divisible by algorithm.mini_batches ({self.algorithm.mini_batches})"
            )

    def env_args(self) -> dict:
        import json

        def parse(v: str):
            try:
                return json.loads(v)
            except (json.JSONDecodeError, TypeError):
                return v

        out = {k: parse(v) for k, v in self.env_kwargs.items()}
        return out | ({"data_path": self.env_data} if self.env_data else {})

    @property
    def run_dir(self) -> str:
        return self.log.run_dir.format(env=self.env, algo=self.algorithm.name, seed=self.seed)
