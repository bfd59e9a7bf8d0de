"""Name → function registries for advantage estimators and policy losses.

Built-ins register themselves when `algos` is imported (so every process that imports `algos`, including env-pool
workers, sees the same table). Users add their own with the same decorators:

    @algos.register_policy_loss("my_loss")
    def my_loss(log_prob, old_log_prob, advantages, response_mask, cfg, weights=None): ...
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("algos")


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered. Subclasses both KeyError and ValueError so either `except` catches it."""

    def __str__(self) -> str:  # KeyError would repr() the message, quoting it
        return str(self.args[0]) if self.args else ""


class Registry:
    """A small name → callable table with a decorator for registration."""

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable[..., Any]] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        # Re-registering a name replaces it (later wins), so notebooks and re-run cells do not trip over it; replacing
        # a built-in (one an algos module registered) is logged, since every run that names it changes.
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            old = self._fns.get(name)
            if old is not None and old.__module__.startswith("algos.") and fn.__module__ != old.__module__:
                log.warning(
                    "%s %r: the built-in is replaced by %s.%s",
                    self.kind,
                    name,
                    fn.__module__,
                    fn.__qualname__,
                )
            self._fns[name], self._meta[name] = fn, meta
            return fn

        return deco

    def meta(self, name: str) -> dict[str, Any]:
        """What the trainer needs to know about `name` beyond its signature (see the register_* decorators)."""
        self.get(name)
        return self._meta[name]

    def get(self, name: str) -> Callable[..., Any]:
        if name not in self._fns:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}")
        return self._fns[name]

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns


ADV_ESTIMATORS = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")


def register_adv_estimator(
    name: str, per_group: bool = False, needs_values: bool = False, needs_steps: bool = False, demos: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register `fn(token_rewards, response_mask, group_index, values=None, gamma=1.0, lam=1.0)`.

    per_group: a row's advantage depends only on the rows of its group (grpo, rloo), so each rank computes it on its
    own whole groups; otherwise (the default, e.g. batch whitening) the trainer gathers every rank's rows first.
    needs_values: the estimator reads `values` (gae), so the trainer builds and trains a critic.
    needs_steps: the estimator also takes `steps=` (`algos.gigpo.StepInfo`: each row's step spans, rewards and state
    keys) and `omega=`, `mode=` (AlgoConfig.step_adv_weight / step_adv_mode), as GiGPO does.
    demos: the estimator's rows are demonstrations (SFT): the run's training episodes are the env's own expert's,
    replayed, not sampled (nanosky/agent/demos.py); the held-out evals still sample the policy.
    """
    return ADV_ESTIMATORS.register(
        name, per_group=per_group, needs_values=needs_values, needs_steps=needs_steps, demos=demos
    )


def get_adv_estimator(name: str) -> Callable[..., Any]:
    return ADV_ESTIMATORS.get(name)


def adv_estimator_names() -> list[str]:
    return ADV_ESTIMATORS.names()


def register_policy_loss(
    name: str, zero_at_zero_adv: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register `fn(log_prob, old_log_prob, advantages, response_mask, cfg, weights=None)`.

    zero_at_zero_adv: a token whose advantage is 0 adds nothing to the loss or its gradient (every built-in loss is
    A times a function of the ratio), so the trainer may skip rows whose advantages are all 0 (`--optim.skip-zero-adv`)
    while still counting them in the normalisers. Leave it False for a loss with a term of its own.
    """
    return POLICY_LOSSES.register(name, zero_at_zero_adv=zero_at_zero_adv)


def get_policy_loss(name: str) -> Callable[..., Any]:
    return POLICY_LOSSES.get(name)


def policy_loss_names() -> list[str]:
    return POLICY_LOSSES.names()
