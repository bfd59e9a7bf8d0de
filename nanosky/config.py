"""`TrainConfig`: one dataclass per component, composed; `--algo NAME` and `--preset NAME` pick starting points.

    python run.py --help                          # every flag, documented at its field
    python run.py --algo dapo --env math --algorithm.clip-high 0.3 --rollout.group-size 4

Validation runs in each dataclass's `__post_init__` (bad values fail at start-up naming the field); checks that need
the world size run in `TrainConfig.validate_for_world`.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
from dataclasses import dataclass, field

import algos
from algos import AlgoConfig
from algos.registry import ADV_ESTIMATORS
from nanosky.rollout.collect import RolloutConfig
from nanosky.rollout.engine import EngineConfig
from nanosky.train.lora import LoraConfig
from nanosky.train.policy import ModelConfig
from nanosky.train.update import OptimConfig


def import_plugins(modules: list[str]) -> None:
    """Import the user's modules (from the working directory too) so their @register_* calls run."""
    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        importlib.import_module(module)


@dataclass(kw_only=True)
class EnvPoolConfig:
    workers: int = 2
    """Env worker processes per rank (multiprocess, spawn); 0 = step envs in the trainer process."""
    step_timeout_s: float = 60.0
    """A reset/step taking longer costs that trajectory (reward 0, counted in envs/failed); the worker is replaced."""

    def __post_init__(self):
        if self.workers < 0 or self.step_timeout_s <= 0:
            raise ValueError("envpool.workers must be >= 0 and envpool.step_timeout_s > 0")


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
    """Rollouts written to rollouts.jsonl and TensorBoard text each step."""
    eval_samples: int = 2
    """Eval rollouts written to rollouts.jsonl (split "eval") at each eval, from rank 0's share of the held-out
    episodes; a large number keeps all of that share, to read where the held-out episodes fail."""
    tqdm: bool = True


@dataclass(kw_only=True)
class ProbeConfig:
    max_mean_diff: float | None = None
    """Fail the run when the mean |trainer − engine| logprob on the probe exceeds this after a sync (stale
    weights). None = 1e-3 for a float32 engine, 0.05 for bf16/fp16."""
    skip_sync: bool = False
    """Testing only: do not push weights to the engine (the probe must then catch the stale engine)."""


@dataclass(kw_only=True)
class DistConfig:
    timeout_s: float = 600.0
    """Collective timeout: a rank stuck this long in a collective fails the job instead of hanging it."""
    fail_rank: int = -1
    """Testing only: this rank raises at `fail_step` (checks that the whole job stops promptly)."""
    fail_step: int = 0


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
    plugins: list[str] = field(default_factory=list)
    """Python modules imported first (`--plugins my_losses my_envs`): the losses, estimators and envs they register
    become valid --algorithm.* / --env values."""
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    envpool: EnvPoolConfig = field(default_factory=EnvPoolConfig)
    algorithm: AlgoConfig = field(default_factory=lambda: algos.preset("grpo"))
    """The RL algorithm; `--algo NAME` replaces it with the preset NAME (grpo, dr_grpo, rloo, reinforce_pp, ppo, dapo,
    gspo, sapo, cispo), and every field stays overridable (`--algo dapo --algorithm.clip-high 0.3`)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
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
        if ADV_ESTIMATORS.meta(self.algorithm.adv_estimator)["per_group"] and self.rollout.group_size < 2:
            raise ValueError(
                f"rollout.group_size must be >= 2 for the group estimator "
                f"{self.algorithm.adv_estimator!r}, got {self.rollout.group_size}"
            )
        if self.rollout.max_total_tokens > self.engine.max_model_len:
            raise ValueError(
                f"rollout.max_total_tokens ({self.rollout.max_total_tokens}) exceeds "
                f"engine.max_model_len ({self.engine.max_model_len})"
            )
        if (
            self.algorithm.overlong_cache_len >= self.rollout.max_new_tokens
            and self.algorithm.overlong_cache_len
        ):
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

    def validate_for_world(self, world: int) -> None:
        if self.rollout.prompts_per_step % world:
            raise ValueError(
                f"rollout.prompts_per_step ({self.rollout.prompts_per_step}) must be divisible by the "
                f"world size ({world})"
            )
        local = self.rollout.prompts_per_step * self.rollout.group_size // world
        if local % self.algorithm.mini_batches:
            raise ValueError(
                f"per-rank batch ({local}) must be divisible by algorithm.mini_batches "
                f"({self.algorithm.mini_batches})"
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


# ---- presets: Python functions returning a config ------------------------------------------------------------
def demo() -> TrainConfig:
    """`make demo`: GRPO on text_math's logic problems with the bundled tiny model, 2 CPU ranks (~5 minutes).

    The logic subset because the 3.4M-parameter warm start has real signal there (≈23 % held-out) but almost none
    on multi-digit arithmetic yet (see README); `--env-kwargs kinds '["arith","word","logic"]' --eval.limit 200`
    trains on the full mix."""
    return TrainConfig(
        env="math",
        env_kwargs={"kinds": '["logic"]'},
        steps=40,
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=48, max_total_tokens=160),
        optim=OptimConfig(lr=5e-4, micro_batch_size=32),
        eval=EvalConfig(every=10, limit=66, n_samples=4),  # the 66 held-out logic problems, 4 samples each
        log=LogConfig(run_dir="runs/demo", ckpt_every=20),
    )


def smoke() -> TrainConfig:
    """A few fast steps (tests, CI)."""
    return TrainConfig(
        steps=3,
        rollout=RolloutConfig(group_size=4, prompts_per_step=8, max_new_tokens=32, max_total_tokens=160),
        optim=OptimConfig(lr=5e-4, micro_batch_size=16),
        eval=EvalConfig(every=0, limit=16, n_samples=1),
        log=LogConfig(ckpt_every=2, tqdm=False),
    )


def bench() -> TrainConfig:
    """`make bench`: 32 prompts × 8 samples × 32 new tokens."""
    return TrainConfig(
        steps=6,
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=32, max_total_tokens=160),
        optim=OptimConfig(lr=5e-4, micro_batch_size=64),
        eval=EvalConfig(every=0, limit=8, n_samples=1),
        log=LogConfig(run_dir="runs/bench", tqdm=False),
    )


def compare() -> TrainConfig:
    """`make compare`: the same short budget for every --algo preset (bench/compare_algos.py)."""
    return TrainConfig(
        steps=15,
        rollout=RolloutConfig(group_size=8, prompts_per_step=16, max_new_tokens=48, max_total_tokens=160),
        optim=OptimConfig(lr=5e-4, micro_batch_size=32),
        eval=EvalConfig(every=0, limit=200, n_samples=1),
        log=LogConfig(ckpt_every=0, tqdm=False),
    )


def tool_use() -> TrainConfig:
    """Dr. GRPO on the tool_use env (calculator / python_exec tasks), multi-turn, the bundled tool model.

    arith + python only: the train split's wiki / search questions name entities the model saw in its demonstrations,
    so on train they are answered from memory, not with the tools. 80 steps: held-out accuracy still rose at step 80
    in both seeds measured (0.130 -> 0.214, 0.131 -> 0.224). Dr. GRPO, not GRPO: std normalisation turns the
    0.1 format term into a full-size signal in groups with no correct answer. lr 5e-5: at 1e-4 and above the policy
    got worse within 10 steps (README, tool_use)."""
    return TrainConfig(
        algorithm=algos.preset("dr_grpo"),
        env="tool_use",
        env_kwargs={"kinds": '["arith", "python"]'},
        model=ModelConfig(path="tiny-tool"),
        steps=80,  # ~12 s per step on the 2-core box: ~20 minutes with the evals (README, tool_use)
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=64, max_total_tokens=480),
        envpool=EnvPoolConfig(workers=2, step_timeout_s=60.0),
        optim=OptimConfig(lr=5e-5, micro_batch_size=16),
        # limit 200 = every held-out task of the two kinds (100), 4 samples each
        eval=EvalConfig(every=10, limit=200, n_samples=4),
        log=LogConfig(run_dir="runs/tool_use", ckpt_every=0),
    )


def agent_env(env: str) -> TrainConfig:
    """A multi-step text env (webshop_lite / alfworld_lite) the way verl-agent runs ALFWorld: step-wise samples with a
    2-turn history, the admissible actions in each observation, the bundled agent model (trained on exactly these
    prompts; webshop_lite with 3 results per page, as in its demonstrations), each turn sampled from the admissible
    actions only (`--rollout.no-constrain-actions` samples freely). GRPO; `--algo gigpo` adds step-level credit from
    repeated states."""
    # alfworld_lite in rooms of 3-5 receptacles (default 6-10): the agent model succeeds in 13 % of those episodes
    # at T = 1 against 5 % in full rooms, where GRPO's groups were nearly all failures (README, issue 13)
    # invalid_penalty 0 (verl-agent uses 0.1): with it, a loop of valid moves out-earns exploring, and at lr 3e-4
    # the policy fell into such loops within 5 steps (README, alfworld_lite)
    kwargs = {"show_actions": "true", "invalid_penalty": "0"} | (
        {"page_size": "3"}
        if env == "webshop_lite"
        else {"n_receptacles": "[3, 5]", "progress_reward": "0", "test_set": "unseen"}
    )
    return TrainConfig(
        env=env,
        env_kwargs=kwargs,
        model=ModelConfig(path="tiny-agent"),
        engine=EngineConfig(max_model_len=768),
        # the measured runs (README, issue 13): 20 steps of 8 tasks x 8 episodes, ~10 (webshop_lite) to ~22
        # (alfworld_lite) minutes on the 2-core box with the evals
        steps=20,
        # 64 new tokens on webshop: search[...] repeats the instruction (~40 tokens); a turn cut off without its
        # end-of-turn token ends the episode. alfworld's commands are under 16 tokens.
        rollout=RolloutConfig(
            group_size=8,
            prompts_per_step=8,
            max_new_tokens=64 if env == "webshop_lite" else 24,
            max_total_tokens=768,
            mode="stepwise",
            history_window=2,
            # sample only admissible actions (nanosky/rollout/constrain.py): held-out success at the start 0.00 -> 0.08
            # (webshop_lite) and 0.145 -> 0.26 (alfworld_lite), 200 episodes each (README, issue 13)
            constrain_actions=True,
        ),
        # lr 1e-4 with constrained actions (the measured runs); sampling freely, at 2e-4 both grpo and gigpo fell
        # into loops within 7 steps (README, alfworld_lite).
        # Micro-batches by tokens: sorted, so a group's turns (one system prompt and task) are packed together.
        # 768 (one packed row): a 14 % faster train phase than 4,096 in rows of 1,024 (bench/train_phase.py)
        optim=OptimConfig(lr=1e-4, micro_batch_tokens=768),
        # 200 held-out episodes: the standard error of a success rate near 0.1 is ~0.02
        eval=EvalConfig(every=10, limit=200, n_samples=1),
        log=LogConfig(run_dir=f"runs/{env}", ckpt_every=0),
    )


def swe() -> TrainConfig:
    """GRPO on generated bug-fix tasks (`--env swe`, level 1), multi-turn with the bash / str_replace_editor /
    submit tools, from the bundled `tiny-swe` (trained on the expert's episodes), each turn sampled as one valid call
    (`--rollout.no-constrain-actions` samples freely). Evals run on held-out generated
    bugs (`test_suite generated`); `python -m evals.swebench --ckpt` runs the shipped suite. A turn's tools, the
    test runs and the grading at submit run in the env pools, concurrently (`envs/step_latency_s`, `envs/step_share`
    say what they cost)."""
    return TrainConfig(
        env="swe",
        env_kwargs={"level": "1", "test_suite": "generated", "max_turns": "6"},
        model=ModelConfig(path="tiny-swe"),
        engine=EngineConfig(max_model_len=1536),
        steps=20,
        # an expert episode is ~850 tokens; a str_replace call with a 4-line old_str ~120
        # each turn one well-formed call whose paths and old_str exist (env kwargs constrain_paths /
        # constrain_old_str): held-out level-1 resolve rate at the start 0.04 -> 0.32 (README, swe);
        # `--rollout.no-constrain-actions --optim.lr 5e-5` gives the earlier free-sampling preset
        rollout=RolloutConfig(
            group_size=8,
            prompts_per_step=4,
            max_new_tokens=160,
            max_total_tokens=1536,
            constrain_actions=True,
        ),
        envpool=EnvPoolConfig(workers=2, step_timeout_s=180.0),
        optim=OptimConfig(lr=1e-4, micro_batch_tokens=8192),
        eval=EvalConfig(every=5, limit=50, n_samples=1),
        log=LogConfig(run_dir="runs/swe", ckpt_every=0),
    )


ENV_PRESETS = ("tool_use", "webshop_lite", "alfworld_lite", "swe")
"""Envs whose preset is the base config when `--env` is given without `--preset`."""

PRESETS = {
    "default": TrainConfig,
    "demo": demo,
    "smoke": smoke,
    "bench": bench,
    "compare": compare,
    "tool_use": tool_use,
    "webshop_lite": lambda: agent_env("webshop_lite"),
    "alfworld_lite": lambda: agent_env("alfworld_lite"),
    "swe": swe,
}


def _env_kwargs_flags(base: TrainConfig, argv: list[str]) -> tuple[TrainConfig, list[str]]:
    """Env kwargs from `--env-kwargs K V [K V ...]` and `--env-kwargs.K V` (K with - or _), merged over the
    preset's. Parsed here, not by tyro: tyro gives a dict with preset keys only per-key flags for those keys, so
    every other key (and the pairs form) would be refused on the presets that set any."""
    extra, rest, i = {}, [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--env-kwargs":
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            pairs = argv[i + 1 : j]
            if len(pairs) % 2:
                raise SystemExit(f"--env-kwargs takes KEY VALUE pairs, got {pairs}")
            extra |= {k.replace("-", "_"): v for k, v in zip(pairs[::2], pairs[1::2])}
            i = j
        elif a.startswith("--env-kwargs."):
            key, eq, value = a[len("--env-kwargs.") :].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{a} needs a value")
                value, i = argv[i + 1], i + 1
            extra[key.replace("-", "_")] = value
            i += 1
        else:
            rest.append(a)
            i += 1
    if extra:
        base = copy.copy(base)
        base.env_kwargs = base.env_kwargs | extra
    return base, rest


def parse_args(argv: list[str] | None = None, console: bool = True) -> TrainConfig:
    """`--preset NAME` picks the base config, `--algo NAME` the algorithm preset, `--plugins` are imported first (so
    their registered names are valid choices); tyro parses every other flag."""
    import argparse

    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=None, choices=sorted(PRESETS))
    pre.add_argument("--algo", default=None)
    known, rest = pre.parse_known_args(argv)
    plugins = argparse.ArgumentParser(
        add_help=False
    )  # --plugins stays in `rest`: tyro records it in the config
    plugins.add_argument("--plugins", nargs="*", default=[])
    import_plugins(plugins.parse_known_args(rest)[0].plugins)  # first: --algo and tyro's checks look names up
    # `--env tool_use` alone starts from that env's preset (its model, context and budgets), as the agent envs need
    # the agent models; an explicit --preset always wins. --env itself is left for tyro to parse.
    env = argparse.ArgumentParser(add_help=False)
    env.add_argument("--env", default=None)
    env_name = env.parse_known_args(rest)[0].env
    preset = known.preset or (env_name if env_name in ENV_PRESETS else "default")
    base = PRESETS[preset]()
    base, rest = _env_kwargs_flags(base, rest)
    if known.algo is not None:
        if known.algo not in algos.PRESETS:
            raise SystemExit(f"--algo: unknown {known.algo!r}; valid: {', '.join(sorted(algos.PRESETS))}")
        # Set fields directly: cross-field checks must see the final flags (tyro re-validates the parsed config).
        base = copy.copy(base)
        base.algorithm = algos.preset(known.algo)
    return tyro.cli(
        TrainConfig,
        default=base,
        args=rest,
        console_outputs=console,
        description="nanosky: agentic RL with torchrun + colocated vLLM + FSDP2. "
        "--algo {" + ",".join(sorted(algos.PRESETS)) + "} picks the algorithm preset; "
        "--preset {"
        + ",".join(sorted(PRESETS))
        + "} picks a base config; --env "
        + "/".join(ENV_PRESETS)
        + " without --preset starts from that env's preset.",
    )
