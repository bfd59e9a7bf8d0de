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
    ignore_eos: bool = False
    """Never stop at the end-of-turn token (set by --dry-run to produce the longest sequences)."""

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


def run_episodes(
    engine,
    tok,
    envs: list[Env] | None,
    cfg: RolloutConfig,
    groups: list[int] | None = None,
    seeds: list[int] | None = None,
    version: int | None = None,
    temperature: float | None = None,
    pool=None,
    handles: list[int] | None = None,
    sample_seed: int | None = None,
) -> list[Trajectory]:
    """Roll out every episode to the end. Episodes are either env objects (`envs`, stepped in-process) or `handles`
    of envs living in `pool` (a per-rank EnvPool of worker processes). With `sample_seed`, every request gets a
    seed derived from (sample_seed, episode, turn), so the same call samples the same tokens (exact resume).

    With a worker pool, live episodes are split into two waves: while one wave's env steps run in the workers, the
    engine generates the other wave's next turn."""
    if pool is None:
        from nanosky.envpool import InProcessPool

        pool = InProcessPool()
        handles = [pool.add(e) for e in envs]
    n = len(handles)
    starts = pool.reset(handles)
    trajs: list[Trajectory] = []
    histories: list[list[dict]] = []
    for i, h in enumerate(handles):
        msgs = starts[i] if isinstance(starts[i], list) else []
        ids = prompt_ids(tok, msgs, pool.tools(h) or None) if msgs else []
        t = Trajectory(
            ids=ids,
            loss_mask=[0] * len(ids),
            logprobs=[0.0] * len(ids),
            prompt_len=len(ids),
            group=groups[i] if groups else i,
            env_seed=seeds[i] if seeds else 0,
            messages=list(msgs),
        )
        if not msgs:
            t.stop_reason, t.info["error"] = "env_error", getattr(starts[i], "reason", "reset failed")
        elif len(ids) >= cfg.max_total_tokens:
            t.stop_reason = "max_tokens"
        trajs.append(t)
        histories.append(list(msgs))
    live = [i for i in range(n) if not trajs[i].stop_reason]
    n_waves = 2 if getattr(pool, "step_timeout_s", None) is not None and len(live) > 1 else 1
    waves = [live[w::n_waves] for w in range(n_waves)]
    pending: list[list[tuple[int, object, object]]] = [[] for _ in waves]
    while any(waves) or any(pending):
        for w in range(n_waves):
            if pending[w]:
                waves[w] = [
                    i
                    for i, fut, g in pending[w]
                    if _absorb(tok, pool, handles[i], trajs[i], histories[i], g, fut.result(), cfg)
                ]
                pending[w] = []
            if waves[w]:
                req_seeds = (
                    None
                    if sample_seed is None
                    else [
                        (sample_seed + 1_000_003 * i + 7919 * trajs[i].turns) % (2**31 - 1) for i in waves[w]
                    ]
                )
                gens = _generate(engine, [trajs[i] for i in waves[w]], cfg, temperature, version, req_seeds)
                pending[w] = []
                for i, g in zip(waves[w], gens):
                    text = _append_turn(tok, trajs[i], histories[i], g)
                    pending[w].append((i, pool.step_async(handles[i], text), g))
                waves[w] = []
    for t in trajs:
        t.reward = float(sum(t.turn_rewards))
        t.success = bool(t.info.get("success", False))
    return trajs


def _generate(engine, trajs: list[Trajectory], cfg: RolloutConfig, temperature, version, seeds=None):
    """One engine call per distinct token budget (each episode may only use what is left of its budget)."""
    budgets = [min(cfg.max_new_tokens, cfg.max_total_tokens - len(t.ids)) for t in trajs]
    out: list = [None] * len(trajs)
    for b in sorted(set(budgets)):
        idx = [k for k, x in enumerate(budgets) if x == b]
        spec = SamplingSpec(
            n=1,
            max_tokens=b,
            temperature=cfg.temperature if temperature is None else temperature,  # 0.0 = greedy
            top_p=cfg.top_p,
            ignore_eos=cfg.ignore_eos,
        )
        req_seeds = [seeds[k] for k in idx] if seeds else None
        for k, samples in zip(
            idx, engine.generate([trajs[k].ids for k in idx], spec, version=version, seeds=req_seeds)
        ):
            out[k] = samples[0]
    return out


def _append_turn(tok, t: Trajectory, history: list[dict], g) -> str:
    t.ids += g.token_ids
    t.loss_mask += [1] * len(g.token_ids)
    t.logprobs += g.logprobs
    t.turns += 1
    text = tok.decode([x for x in g.token_ids if x != tok.eos_token_id], skip_special_tokens=False)
    t.messages.append({"role": "assistant", "content": text})
    history.append({"role": "assistant", "content": text})
    return text


def _absorb(tok, pool, handle: int, t: Trajectory, history: list[dict], g, res, cfg: RolloutConfig) -> bool:
    """Record an env step's result; append the observation turn if the episode goes on. Returns True if it does."""
    if not hasattr(res, "reward"):  # EnvFailure: a hung, crashed or raising env costs this trajectory only
        t.stop_reason, t.turn_rewards, t.info["error"] = "env_error", [0.0], res.reason
        t.info["success"] = False
        return False
    t.turn_rewards.append(float(res.reward))
    t.info.update({k: v for k, v in res.info.items() if k != "calls"})
    t.info.setdefault("calls", []).extend(res.info.get("calls", []))
    t.tool_calls = int(res.info.get("tool_calls", t.tool_calls))
    t.invalid_tool_calls = int(res.info.get("invalid_calls", t.invalid_tool_calls))
    if res.done:
        t.stop_reason = "done"
    elif t.turns >= (cfg.max_turns or pool.max_turns(handle)):
        t.stop_reason = "max_turns"
    elif g.finish_reason == "length" and g.token_ids[-1:] != [tok.eos_token_id]:
        t.stop_reason = "max_tokens"
    else:
        obs = observation_ids(tok, history, res.observations, pool.tools(handle) or None)
        if len(t.ids) + len(obs) >= cfg.max_total_tokens:
            t.stop_reason = "max_tokens"
        else:
            t.ids += obs
            t.loss_mask += [0] * len(obs)
            t.logprobs += [0.0] * len(obs)
            t.messages += res.observations
            history += res.observations
            return True
    return False


def timed(fn, *args, **kwargs) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0
