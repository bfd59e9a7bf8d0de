"""Environments: `envs.make(name, split="train", seed=0, **kwargs)`.

Built-in envs are imported lazily by module path so that importing `envs` stays cheap; users add their own with
`@envs.register_env("name")` on a class or factory taking `(split, seed, **kwargs)`.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

from envs.base import Env, Message, StepResult

_BUILTIN = {
    "math": "envs.text_math:TextMathEnv",
    "text_math": "envs.text_math:TextMathEnv",
    "tool_use": "envs.tool_use:ToolUseEnv",
    "webshop_lite": "envs.webshop_lite:WebShopEnv",
    "alfworld_lite": "envs.alfworld_lite:AlfWorldEnv",
    "swe": "envs.swe:SWETaskEnv",
    "reply": "envs.reply:ReplyEnv",
    # the ecosystem's (envs/ecosystem/; the `gyms` extra)
    "dataset": "envs.ecosystem.dataset:DatasetEnv",
    "skyrl_gym": "envs.ecosystem.skyrl:SkyRLGymEnv",
    "reasoning_gym": "envs.ecosystem.reasoning:ReasoningGymEnv",
    "textarena": "envs.ecosystem.arena:TextArenaEnv",
}
_REGISTRY: dict[str, Callable[..., Env]] = {}
log = logging.getLogger("envs")


def register_env(name: str):
    def deco(factory):
        own = f"{getattr(factory, '__module__', '')}:{getattr(factory, '__qualname__', '')}"
        if name in _BUILTIN and own != _BUILTIN[name]:  # (env workers register the built-in itself again)
            log.warning("env %r: the built-in (%s) is replaced by %s", name, _BUILTIN[name], factory.__qualname__)
        _REGISTRY[name] = factory
        return factory

    return deco


def env_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def get_env_factory(name: str) -> Callable[..., Env]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name not in _BUILTIN:
        raise KeyError(f"unknown env {name!r}; valid names: {', '.join(env_names())}")
    module, attr = _BUILTIN[name].split(":")
    return getattr(importlib.import_module(module), attr)


def has_checker(name: str) -> bool:
    """Whether env `name` grades its episodes itself (False: its reward says nothing; a judge must score it)."""
    return getattr(get_env_factory(name), "checker", True)


def has_expert(name: str) -> bool:
    """Whether env `name` has a scripted expert (`expert_action()`), whose episodes SFT trains on (`--algo sft`)."""
    return callable(getattr(get_env_factory(name), "expert_action", None))


def group_scorer(name: str, split: str = "train", **kwargs):
    """What scores env `name`'s episodes a group at a time (a TRL reward function: `envs/ecosystem/dataset.py`), or
    None when each episode scores itself in `step` (every other env). Called `(seeds, replies) -> (rewards,
    successes)`, a reward None meaning unscored; it raises when it cannot score the group."""
    hook = getattr(get_env_factory(name), "group_scorer", None)
    return hook(split, **kwargs) if hook is not None else None


def aggregate_metrics(name: str, metrics: list[dict]) -> dict[str, float]:
    """A batch's env metrics (each episode's `info["env_metrics"]`), by the env's own `aggregate_metrics` where it
    has one (SkyRL-Gym's), else the mean of each numeric key over the episodes that report it."""
    hook = getattr(get_env_factory(name), "aggregate_metrics", None)
    if hook is not None:
        return hook(metrics)
    sums: dict[str, list[float]] = {}
    for m in metrics:
        for k, v in m.items():
            if isinstance(v, (int, float)) and v == v:  # numbers and bools; NaN (not measured) is left out
                sums.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sums.items()}


def make(name: str, split: str = "train", seed: int = 0, **kwargs) -> Env:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return get_env_factory(name)(split=split, seed=seed, **kwargs)


__all__ = [
    "Env",
    "Message",
    "StepResult",
    "make",
    "register_env",
    "env_names",
    "get_env_factory",
    "has_checker",
    "group_scorer",
    "aggregate_metrics",
]
