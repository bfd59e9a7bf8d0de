"""The agent loop: multi-turn, token-in token-out rollouts of many episodes at once.

Per episode: render the opening messages once → generate → env.step(decoded turn) → append the observation turn's
ids (loss mask 0) → generate again … until the env says done, or max turns / max total tokens is reached. The ids
the policy is trained on are exactly the ids the engine sampled; the engine's per-token logprobs travel with them
(rollout correction and the vLLM-vs-trainer mismatch metrics read them).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from envs.base import Env
from nanosky.chat import observation_ids, prompt_ids
from nanosky.engine import SamplingSpec


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

    def __post_init__(self):
        for f in ("group_size", "prompts_per_step", "max_new_tokens", "max_total_tokens"):
            if getattr(self, f) < 1:
                raise ValueError(f"rollout.{f} must be >= 1, got {getattr(self, f)}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"rollout.max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 < self.temperature <= 10.0:
            raise ValueError(f"rollout.temperature must be in (0, 10], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Trajectory:
    """One episode. `ids`, `loss_mask`, `logprobs` are aligned token by token (logprob 0 where mask 0)."""

    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    reward: float = 0.0
    turn_rewards: list[float] = field(default_factory=list)
    success: bool = False
    stop_reason: str = ""  # done | max_turns | max_tokens | env_error
    turns: int = 0
    group: int = 0  # samples with equal group share a prompt
    env_seed: int = 0
    messages: list[dict] = field(default_factory=list)  # decoded conversation (for logs / evals)
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_policy_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_json(self, with_ids: bool = True) -> dict:
        d = asdict(self)
        if not with_ids:
            for k in ("ids", "loss_mask", "logprobs"):
                d.pop(k)
        return d


def _tool_schemas(env: Env) -> list[dict] | None:
    return [t.schema for t in env.tools] or None if getattr(env, "tools", None) else None


def run_episodes(
    engine, tok, envs: list[Env], cfg: RolloutConfig, groups: list[int] | None = None, seeds: list[int] | None = None,
    version: int | None = None, temperature: float | None = None,
) -> list[Trajectory]:
    """Roll out every env to the end, batching all active episodes into one engine call per turn."""
    eos = tok.eos_token_id
    trajs, histories = [], []
    for i, env in enumerate(envs):
        msgs = env.reset()
        ids = prompt_ids(tok, msgs, _tool_schemas(env))
        trajs.append(Trajectory(ids=ids, loss_mask=[0] * len(ids), logprobs=[0.0] * len(ids), prompt_len=len(ids),
                                group=groups[i] if groups else i, env_seed=seeds[i] if seeds else 0, messages=list(msgs)))
        histories.append(list(msgs))
    active = [i for i, t in enumerate(trajs) if len(t.ids) < cfg.max_total_tokens]
    for i in set(range(len(trajs))) - set(active):
        trajs[i].stop_reason = "max_tokens"
    turn = 0
    while active:
        turn += 1
        # One engine call per turn for every live episode; each may only use what is left of its token budget.
        budgets = [min(cfg.max_new_tokens, cfg.max_total_tokens - len(trajs[i].ids)) for i in active]
        outs = []
        for budget in sorted(set(budgets)):
            idx = [i for i, b in zip(active, budgets) if b == budget]
            spec = SamplingSpec(n=1, max_tokens=budget, temperature=temperature or cfg.temperature, top_p=cfg.top_p)
            outs += list(zip(idx, engine.generate([trajs[i].ids for i in idx], spec, version=version)))
        still = []
        for i, samples in sorted(outs):
            t, env, g = trajs[i], envs[i], samples[0]
            t.ids += g.token_ids
            t.loss_mask += [1] * len(g.token_ids)
            t.logprobs += g.logprobs
            text = tok.decode([x for x in g.token_ids if x != eos], skip_special_tokens=False)
            t.messages.append({"role": "assistant", "content": text})
            histories[i].append({"role": "assistant", "content": text})
            t.turns = turn
            try:
                res = env.step(text)
            except Exception as e:  # envs promise never to raise; if one does, it costs this trajectory only
                t.stop_reason, t.reward, t.info["error"] = "env_error", 0.0, repr(e)
                continue
            t.turn_rewards.append(float(res.reward))
            t.info.update(res.info)
            t.tool_calls += int(res.info.get("tool_calls", 0))
            t.invalid_tool_calls += int(res.info.get("invalid_calls", 0))
            max_turns = cfg.max_turns or getattr(env, "max_turns", 1)
            if res.done:
                t.stop_reason = "done"
            elif turn >= max_turns:
                t.stop_reason = "max_turns"
            elif g.finish_reason == "length" and g.token_ids[-1:] != [eos]:
                t.stop_reason = "max_tokens"
            else:
                obs = observation_ids(tok, histories[i], res.observations, _tool_schemas(env))
                if len(t.ids) + len(obs) >= cfg.max_total_tokens:
                    t.stop_reason = "max_tokens"
                else:
                    t.ids += obs
                    t.loss_mask += [0] * len(obs)
                    t.logprobs += [0.0] * len(obs)
                    t.messages += res.observations
                    histories[i] += res.observations
                    still.append(i)
            if t.stop_reason:
                t.reward = float(sum(t.turn_rewards))
                t.success = bool(t.info.get("success", False))
        active = still
    return trajs


def timed(fn, *args, **kwargs) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0
