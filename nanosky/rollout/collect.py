"""Training-side rollout: this rank's episodes of an env, through the one agent loop (`nanosky.agent`).

    rollout = Rollout(cfg.rollout, EngineBackend(engine, tok), pool, tok)
    trajs = rollout.run("math", {}, "train", seeds, version, groups=groups, sample_seed=s)
    trajs, metrics = collect(cfg, rollout, step, version)     # a training step's global batch (+ DAPO's rounds)

Each episode is a `PooledEnvTask` in this rank's env pool (a hung or crashing env costs its episode only); the
`AgentRunner` plays them all at once, continuously, against the colocated engine (token-in/token-out). `metrics`
holds the last call's rollout throughput and the engine's busy share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

import algos
from nanosky import dist
from nanosky.agent import AgentRunner, EngineBackend, PooledEnvTask, Trajectory
from nanosky.seeds import derive_seed
from nanosky.train.batch import gather_trajectories
from nanosky.train.step_credit import action_spans

if TYPE_CHECKING:
    from nanosky.config import TrainConfig


@dataclass(kw_only=True)
class RolloutConfig:
    group_size: int = 8
    """Samples per prompt (the GRPO group n)."""
    prompts_per_step: int = 32
    """Prompts per optimizer step across all ranks (global batch = prompts_per_step × group_size trajectories)."""
    max_new_tokens: int = 64
    """Per assistant turn."""
    max_total_tokens: int = 384
    """Prompt + all turns; the episode stops (stop_reason="max_tokens") when this is reached."""
    max_turns: int | None = None
    """Assistant turns per episode; None = the env's own `max_turns`."""
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = False
    """Never stop at the end-of-turn token (set by --dry-run to produce the longest sequences)."""
    mode: Literal["concat", "stepwise"] = "concat"
    """concat: one training row per episode (every turn, observations masked). stepwise: one row per assistant turn,
    sampled from the opening messages and the last `history_window` turns (long episodes in a short context;
    `nanosky/rollout/stepwise.py`). In step-wise mode max_total_tokens bounds each turn's prompt + response."""
    history_window: int = 2
    """stepwise: turns (action + observation) shown before the current one; older turns are dropped."""
    step_weight: Literal["step", "episode"] = "step"
    """stepwise: how rows weigh in the loss. step: every turn the same, so a 30-turn episode weighs 3x a 10-turn one
    (verl-agent's choice). episode: each row's advantage is scaled by S_mean / S_i (S_i its episode's turns, S_mean
    the batch's mean), so every episode carries the same total weight, however long it ran."""

    constrain_actions: bool = False
    """Sample every turn under the env's `action_constraint()`: one of its admissible actions (`action_choices()`:
    webshop_lite, alfworld_lite) or a reply its grammar matches (`action_grammar()`: swe, one well-formed tool call),
    with vLLM's structured outputs, and train under the same masks: the policy is the masked distribution, exactly
    (nanosky/rollout/constrain.py). Turns of envs that give neither are sampled freely."""

    agent: str | None = None
    """Train your own agent: MODULE:FN, an async `solve(client, task) -> float | None` given an OpenAI client
    pointed at this episode's endpoint (nanosky/endpoint/; imported like --plugins). Replaces nanosky's loop."""
    agent_cmd: str | None = None
    """Train an agent in any language: a shell command run once per episode, with OPENAI_BASE_URL, OPENAI_API_KEY
    and NANOSKY_TASK (a JSON file: messages, tools, id, seed) set; reward = a last stdout line {"reward": x}."""
    agent_timeout_s: float = 300.0
    """--rollout.agent / agent-cmd: an episode running longer is masked (it costs that episode only)."""

    def __post_init__(self):
        if self.agent and self.agent_cmd:
            raise ValueError("give --rollout.agent or --rollout.agent-cmd, not both")
        if self.agent is not None and self.agent.count(":") != 1:
            raise ValueError(
                f"rollout.agent must be MODULE:FUNCTION (e.g. my_agent:solve), got {self.agent!r}"
            )
        if self.agent_timeout_s <= 0:
            raise ValueError(f"rollout.agent_timeout_s must be > 0, got {self.agent_timeout_s}")
        for f in ("group_size", "prompts_per_step", "max_new_tokens", "max_total_tokens"):
            if getattr(self, f) < 1:
                raise ValueError(f"rollout.{f} must be >= 1, got {getattr(self, f)}")
        if self.mode not in ("concat", "stepwise"):
            raise ValueError(f"rollout.mode must be 'concat' or 'stepwise', got {self.mode!r}")
        if self.step_weight not in ("step", "episode"):
            raise ValueError(f"rollout.step_weight must be 'step' or 'episode', got {self.step_weight!r}")
        if self.history_window < 1:
            raise ValueError(f"rollout.history_window must be >= 1, got {self.history_window}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"rollout.max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 < self.temperature <= 10.0:
            raise ValueError(f"rollout.temperature must be in (0, 10], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")


class Rollout:
    def __init__(self, cfg: RolloutConfig, backend: EngineBackend, pool, tok, log_dir: str | None = None):
        self.cfg, self.backend, self.pool, self.tok = cfg, backend, pool, tok
        self.metrics: dict[str, float] = {}
        self.log_dir, self.harness = (
            log_dir,
            None,
        )  # --rollout.agent / agent-cmd: the endpoint, from the first run

    @property
    def external(self) -> bool:
        """Whether an external agent plays the episodes (--rollout.agent or --rollout.agent-cmd)."""
        return bool(self.cfg.agent or self.cfg.agent_cmd)

    def close(self) -> None:
        if self.harness is not None:
            self.harness.host.close()

    def run(
        self,
        env: str,
        env_kwargs: dict,
        split: str,
        seeds: list[int],
        version: int,
        groups: list[int] | None = None,
        sample_seed: int | None = None,
        temperature: float | None = None,
    ) -> list[Trajectory]:
        """One episode per seed (env `env`, `split`), rolled out to the end with weights `version`."""
        self.backend.version = version
        busy0 = self.backend.busy_s
        tasks = [PooledEnvTask(self.pool, env, split, seed=s, **env_kwargs) for s in seeds]
        if self.external:
            runner, trajs = self._harness(tasks, groups, seeds, sample_seed, temperature)
        else:
            runner = AgentRunner.from_config(self.backend, self.cfg, self.tok, temperature)
            trajs = runner.run(tasks, groups=groups, seeds=seeds, sample_seed=sample_seed)
        wall = max(runner.last_wall_s, 1e-9)
        self.metrics = {
            "rollout/tokens_per_s": sum(t.completion_tokens for t in trajs) / wall,
            "rollout/engine_busy_frac": (self.backend.busy_s - busy0) / wall,
        }
        return trajs

    def _harness(self, tasks, groups, seeds, sample_seed, temperature) -> tuple:
        """The external agent's episodes, through the endpoint (started on first use, up until `close`)."""
        from nanosky.endpoint.harness import Harness
        from nanosky.endpoint.host import Host
        from nanosky.endpoint.server import Sampling

        c = self.cfg
        sampling = Sampling(c.temperature if temperature is None else temperature, c.top_p, c.max_new_tokens,
                            c.max_total_tokens)  # fmt: skip
        if self.harness is None:
            host = Host(self.tok, sampling)
            self.harness = Harness(
                host, c.agent, c.agent_cmd, c.agent_timeout_s, self.log_dir, dist.get_info().rank
            )
        version = self.backend.version
        trajs = self.harness.run(self.backend, tasks, groups, seeds, sample_seed, sampling, lambda: version)
        return self.harness, trajs


def collect(cfg: TrainConfig, rollout: Rollout, step: int, version: int) -> tuple[list[Trajectory], dict]:
    """Generate this step's global batch (every rank's rollouts, gathered). With DAPO's dynamic sampling, more
    rounds are generated until `filter_groups` keeps a full batch or `max_gen_rounds` is reached."""
    info, a, P, n = dist.get_info(), cfg.algorithm, cfg.rollout.prompts_per_step, cfg.rollout.group_size
    kept: list[Trajectory] = []
    dropped: list[Trajectory] = []
    rounds = a.max_gen_rounds if a.dynamic_sampling else 1
    for rnd in range(rounds):
        js = list(range(info.rank, P, info.world))
        seeds = [derive_seed(cfg.seed, step, rnd, j) for j in js for _ in range(n)]
        groups = [rnd * P + j for j in js for _ in range(n)]
        sample_seed = derive_seed(cfg.seed, step, rnd, "sample", info.rank)
        new = gather_trajectories(
            rollout.run(cfg.env, cfg.env_args(), "train", seeds, version, groups, sample_seed)
        )
        if a.overlong_cache_len:
            overlong_penalty(new, cfg.rollout.max_new_tokens, a.overlong_cache_len)
        if not a.dynamic_sampling:
            kept = new
            break
        k, d = filter_groups(new)
        kept, dropped = kept + k, dropped + d
        if len(kept) >= P * n:
            rounds = rnd + 1
            break
    # Fixed batch size: truncate to P groups, or top up with dropped groups (zero advantage: no gradient signal).
    batch = (kept + dropped)[: P * n]
    metrics = {"train/dropped_groups": len(dropped) / n, "train/gen_rounds": rounds} | rollout.metrics
    if rollout.external:
        from nanosky.endpoint.harness import metrics as agent_metrics

        metrics |= agent_metrics(batch)
    return batch, metrics


def overlong_penalty(trajs: list[Trajectory], max_len: int, cache_len: int) -> None:
    """DAPO's soft overlong punishment (`algos.overlong_penalty`), added to each reward, on the policy's own tokens
    (not tool outputs): a turn that nears `max_len` (rollout.max_new_tokens, a per-turn cap) costs its episode; the
    longest turn counts."""
    longest = [max((b - a for a, b in action_spans(t.loss_mask)), default=0) for t in trajs]
    pen = algos.overlong_penalty(torch.tensor(longest), max_len, cache_len)
    for t, p in zip(trajs, pen.tolist()):
        t.reward += p


def filter_groups(trajs: list[Trajectory]) -> tuple[list[Trajectory], list[Trajectory]]:
    """DAPO's dynamic sampling (`algos.group_has_signal`): (kept, dropped), whole groups each, in their order."""
    if not trajs:
        return [], []
    keep = algos.group_has_signal([t.reward for t in trajs], [t.group for t in trajs]).tolist()  # [N]
    by_group: dict[int, tuple[bool, list[Trajectory]]] = {}
    for t, k in zip(trajs, keep):
        by_group.setdefault(t.group, (k, []))[1].append(t)
    kept, dropped = [], []
    for k, g in by_group.values():
        (kept if k else dropped).extend(g)
    return kept, dropped
