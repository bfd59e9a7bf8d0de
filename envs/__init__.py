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
    "mcp": "envs.mcp:MCPEnv",  # any MCP server's tools (the `mcp` SDK)
    "mcp_sqlite": "envs.mcp.shop:SQLShopEnv",
    "mcp_time": "envs.mcp.clock:TimeEnv",
    "openenv": "envs.openenv:OpenEnvEnv",  # any OpenEnv server (its WebSocket protocol)
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


def env_class(name: str) -> type[Env]:
    """Env `name`'s class, for its class-level hooks (`checker`, `has_expert`, `group_scorer`, ...); a registered
    factory that is not an `Env` subclass (a function) has `Env`'s defaults."""
    factory = get_env_factory(name)
    return factory if isinstance(factory, type) and issubclass(factory, Env) else Env


def has_checker(name: str) -> bool:
    """Whether env `name` grades its episodes itself (False: its reward says nothing; a judge must score it)."""
    return env_class(name).checker


def has_expert(name: str, **kwargs) -> bool:
    """`Env.has_expert` of env `name`: whether its episodes, built with `kwargs`, have a scripted expert, whose
    episodes SFT trains on (`--algo sft`)."""
    return env_class(name).has_expert(**kwargs)


def group_scorer(name: str, split: str = "train", **kwargs):
    """`Env.group_scorer` of env `name`: what scores its episodes a group at a time, or None."""
    return env_class(name).group_scorer(split, **kwargs)


def aggregate_metrics(name: str, metrics: list[dict]) -> dict[str, float]:
    """`Env.aggregate_metrics` of env `name`: a batch's env metrics as one dict."""
    return env_class(name).aggregate_metrics(metrics)


def make(name: str, split: str = "train", seed: int = 0, **kwargs) -> Env:
    """Env `name`'s episode `seed` of `split`: train, test, or validation where the env makes one (`Env.splits`)."""
    if split not in (splits := env_class(name).splits):
        raise ValueError(f"env {name!r}: split must be one of {', '.join(splits)}, got {split!r}")
    return get_env_factory(name)(split=split, seed=seed, **kwargs)


__all__ = [
    "Env",
    "Message",
    "StepResult",
    "make",
    "register_env",
    "env_names",
    "get_env_factory",
    "env_class",
    "has_checker",
    "has_expert",
    "group_scorer",
    "aggregate_metrics",
]
