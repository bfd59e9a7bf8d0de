"""The one trajectory type: what the agent loop returns, the trainer trains on, the logs and evals read.

`ids`, `loss_mask` and `logprobs` are aligned token by token: the rendered opening (mask 0), then each assistant
turn exactly as sampled (mask 1, with the backend's logprobs), then each observation turn (mask 0, logprob 0).
A backend that reports no token ids (a plain OpenAI-compatible server) leaves them empty unless the runner has a
tokenizer (see `nanosky.agent.backends`). In step-wise mode (`AgentRunner(history_window=K)`) each turn was sampled
from its own, shorter prompt, kept in `steps` (`nanosky.train.stepwise` turns them into training rows); `ids` is still
the whole conversation, for the logs.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STOP_REASONS = (
    "done",
    "max_turns",
    "max_tokens",
    "length",  # an external agent's conversation reached --rollout.max-total-tokens (the endpoint refused a call)
    "prompt_too_long",
    "timeout",
    "env_error",
    "backend_error",
    "error",
)
SCORED = frozenset({"done", "max_turns", "max_tokens", "length", "timeout"})
"""The stop reasons whose episode is graded (its task's verdict, or its group's scorer); any other is a failure that
scores 0 and says why in `error` (`prompt_too_long`: skipped, nothing sampled)."""


@dataclass
class Step:
    """One assistant turn of a step-wise episode (`history_window` set): the prompt it was sampled from (the opening
    messages and the last K turns, re-rendered) and the sampled ids with their logprobs."""

    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    constraint: list[str] | str | None = None  # the choices or grammar it was sampled under (constrained turns)
    # which of `ids` are trained (1) and which are observations (0): an external agent's segment holds several
    # calls and the messages between them (nanosky/endpoint/rows.py). None: every id was sampled
    loss_mask: list[int] | None = None
    versions: list[int] | None = None  # per id of `ids`, the weights that sampled it, as `Trajectory.versions`


@dataclass
class Trajectory:
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # per id, the weight version that sampled it (-1: not sampled, a prompt or observation id); may stop short of
    # `ids` (the rest are not sampled); empty where the player does not know (`token_versions`)
    versions: list[int] = field(default_factory=list)
    prompt_len: int = 0
    reward: float = 0.0
    turn_rewards: list[float] = field(default_factory=list)
    state_keys: list = field(default_factory=list)  # per turn: the env's state key before the action (GiGPO anchors)
    steps: list[Step] = field(default_factory=list)  # step-wise mode: each turn's own prompt + sampled ids
    # constrained turns (`--rollout.constrain-actions`): (index in `ids` of the turn's first sampled id, the
    # admissible actions it was sampled from, or its EBNF grammar); the trainer scores those ids under the same masks
    # (nanosky/train/constrain.py)
    constraints: list[tuple[int, list[str] | str]] = field(default_factory=list)
    success: bool | None = False  # None: the env has no checker (`Env.checker`; a judge scores it)
    stop_reason: str = ""  # one of STOP_REASONS
    turns: int = 0
    group: int = 0  # samples with equal group share a prompt
    env_seed: int = 0
    task_id: str = ""
    messages: list[dict] = field(default_factory=list)  # decoded conversation (for logs / evals)
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    prompt_tokens: int = 0  # summed over turns: what the backend processed (an API bills every call's context)
    completion_tokens: int = 0
    latency_s: float = 0.0
    error: str = ""  # why an episode ended in env_error / backend_error / error / timeout
    turn_log: list[dict] = field(default_factory=list)  # per turn: finish_reason, tokens, latency_s, reward
    info: dict[str, Any] = field(default_factory=dict)  # the env's info (later steps overwrite), "calls" added up

    def mask_out(self) -> None:
        """No token of this episode is trained (its agent failed, its judgement or reward function did): every loss
        mask 0, the step-wise rows' too."""
        self.loss_mask = [0] * len(self.loss_mask)
        for s in self.steps:
            s.loss_mask = [0] * len(s.ids)

    def token_versions(self) -> list[int]:
        """`versions` as long as `ids` (-1 past its end)."""
        return self.versions + [-1] * (len(self.ids) - len(self.versions))

    def sampled_versions(self) -> list[int]:
        """The weight version of each sampled id, over every row the episode trains: each segment's where an external
        agent's episode came back in several (`ids` holds its last), else `versions`'."""
        if len(self.steps) > 1 and all(s.versions is not None for s in self.steps):
            return [v for s in self.steps for v in s.versions if v >= 0]
        return [v for v in self.versions if v >= 0]

    @property
    def n_policy_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_json(self, with_ids: bool = True) -> dict:
        d = asdict(self)
        if not with_ids:
            for k in ("ids", "loss_mask", "logprobs", "versions", "steps", "constraints"):
                d.pop(k)
        return d


def success_of(verdict: dict) -> bool | None:
    """An episode's success from its task's verdict: True / False, or None where the env has no checker."""
    s = verdict.get("success", False)
    return None if s is None else bool(s)


def success_rate(trajs: list[Trajectory]) -> float:
    """The success rate over the episodes an env checked; NaN where none was (an env without a checker)."""
    ok = [t.success for t in trajs if t.success is not None]
    return sum(ok) / len(ok) if ok else float("nan")


def save_jsonl(trajs: list[Trajectory], path: str | Path, with_ids: bool = False) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in trajs:
            f.write(json.dumps(t.to_json(with_ids), default=repr) + "\n")
    return path


def load_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def env_step_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """How long the envs' `step` calls took (tool runs, sandboxed test runs and grading included): the mean and max
    per turn, and their share of the episodes' wall time (the rest is generation and queueing)."""
    steps = [x["step_latency_s"] for t in trajs for x in t.turn_log if "step_latency_s" in x]
    wall = sum(t.latency_s for t in trajs)
    return {
        "envs/step_latency_s": sum(steps) / max(len(steps), 1),
        "envs/step_latency_max_s": max(steps, default=0.0),
        "envs/step_share": sum(steps) / wall if wall > 0 else 0.0,
    }


def summarize(trajs: list[Trajectory]) -> dict[str, Any]:
    """Accuracy and the usual agent metrics over a batch."""
    n = max(len(trajs), 1)
    calls = sum(t.tool_calls for t in trajs)
    return {
        "n": len(trajs),
        "accuracy": success_rate(trajs),
        "reward_mean": sum(t.reward for t in trajs) / n,
        "turns_mean": sum(t.turns for t in trajs) / n,
        "tool_calls_per_traj": calls / n,
        "invalid_tool_call_rate": sum(t.invalid_tool_calls for t in trajs) / max(calls, 1),
        "completion_tokens_mean": sum(t.completion_tokens for t in trajs) / n,
        "latency_s_mean": sum(t.latency_s for t in trajs) / n,
        "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
    }
