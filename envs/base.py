"""The env interface every nanosky environment implements.

An env is one episode of one task. `reset()` returns the opening chat messages; `step(action_text)` takes the
policy's whole assistant turn as a string and returns what to append, the reward and whether the episode is over.
`step` never raises: malformed actions become observations (and usually reward 0).
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}


class NoExpert(ValueError):
    """An env, its kwargs or its split has no scripted expert to demonstrate it (`--algo sft`)."""


@dataclass
class StepResult:
    observations: list[Message]  # messages to append to the conversation (empty when done)
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)  # e.g. {"success": bool, "answer": str}


class Env:
    """Base class. Subclasses set `tools` (tool objects with .name/.schema/__call__) when the task uses tools."""

    name: str = "env"
    max_turns: int = 1  # assistant turns before the agent loop stops the episode
    tools: list = []
    checker: bool = True  # False: no checker (reward 0, success None); only a judge scores it (envs/reply.py)
    # the splits it makes; "validation" (for choosing the lr, the steps and the checkpoint) shares no question with
    # test or train, where an env declares it
    splits: tuple[str, ...] = ("train", "test")

    def reset(self) -> list[Message]:
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the episode holds (a checkout on disk, a process). Whoever made the env calls it once the
        episode is over (the env pool, `EnvTask`); after it the env is not stepped again. Default: nothing."""

    def state_key(self) -> Hashable | None:
        """A canonical, hashable key of the current state: equal keys mean the same state however it was reached
        (GiGPO's anchor states). Envs that define it also put it in each step's `info["state_key"]` (the state the
        next action is taken in). None = no key: consumers fall back to the observation text."""
        return None

    def action_choices(self) -> list[str] | None:
        """The exact replies that are valid actions now, for constrained sampling (`--rollout.constrain-actions`);
        None = free text (the default). Text-game envs return their `available_actions()`."""
        return None

    def action_grammar(self) -> str | None:
        """An EBNF grammar (xgrammar / vLLM structured outputs) every valid reply matches, for constrained sampling
        when there is no finite list of choices; None = free text (the default). Envs whose every turn is one tool
        call return `envs.tools.tool_call_grammar(self.tools)`."""
        return None

    def action_constraint(self) -> list[str] | str | None:
        """What the next reply may be: `action_choices()` if the env has them, else `action_grammar()`."""
        choices = self.action_choices()
        return choices if choices is not None else self.action_grammar()

    def expert_action(self) -> str:
        """A scripted expert's next reply, the demonstration `--algo sft` trains on (`nanosky/agent/demos.py`). Envs
        with an expert override it; where there is none (this default, a held-out split, a file without solutions)
        it raises a `ValueError` in one line (`NoExpert` here)."""
        raise NoExpert(f"env {self.name!r} has no scripted expert to demonstrate it")

    # ---- class-level hooks: what the trainer asks of the env's kind, before or after any episode -------------------
    @classmethod
    def group_scorer(cls, split: str = "train", **kwargs):
        """What scores this env's episodes a group at a time, called `(seeds, replies) -> (rewards, successes)` (a
        reward None: unscored; it raises when it cannot score the group), or None, the default: each episode scores
        itself in `step`. `--env dataset` with a TRL reward function returns one (`envs/ecosystem/dataset.py`)."""
        return None

    @classmethod
    def expert_refusal(cls, **kwargs) -> str | None:
        """Why the episodes built with constructor `kwargs` (the run's --env-kwargs and --env-data) would have no
        scripted expert, in one line; None when they have one. Without kwargs it answers for the env's kind (the
        list `--algo sft` offers). Default: an expert where the class overrides `expert_action`. Envs whose expert
        depends on their kwargs (a file's solutions, a game's scripted player) override it, so that start-up can
        answer without playing an episode."""
        if cls.expert_action is Env.expert_action:
            return f"env {cls.name!r} has no scripted expert to demonstrate it"
        return None

    @classmethod
    def has_expert(cls, **kwargs) -> bool:
        """Whether the episodes built with `kwargs` have a scripted expert (`expert_refusal` says why not)."""
        return cls.expert_refusal(**kwargs) is None

    @staticmethod
    def aggregate_metrics(metrics: list[dict]) -> dict[str, float]:
        """A batch's env metrics (each episode's `info["env_metrics"]`) as one dict. Default: the mean of each numeric
        key over the episodes that report it (NaN, not measured, left out). SkyRL-Gym's envs use their own."""
        values: dict[str, list[float]] = {}
        for m in metrics:
            for k, v in m.items():
                if isinstance(v, (int, float)) and v == v:  # numbers and bools; NaN is left out
                    values.setdefault(k, []).append(float(v))
        return {k: sum(v) / len(v) for k, v in values.items()}


ACTIONS_HEADER = "\n\nYour admissible actions of the current situation are: ["
"""Starts the `show_actions` suffix; step-wise prompts cut it from past observations (`nanosky.agent.window`)."""


def admissible_actions_text(actions: list[str]) -> str:
    """The `show_actions` suffix of an observation, in the style of verl-agent's ALFWorld prompt."""
    return ACTIONS_HEADER + " | ".join(actions) + "]"


_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)


def extract_action(text: str) -> str:
    """The action inside a model's reply for text-game envs: the text of the first `<action>...</action>` if
    present, else the first non-empty line (a reply that is exactly one action is itself)."""
    if match := _ACTION_TAG.search(text):
        return match.group(1).strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def run_policy(make_env, policy_fn, seeds) -> dict:
    """One episode per seed with `policy_fn(env) -> action` on envs built by `make_env(seed)` (envs exposing
    `.steps`); mean reward, success rate and mean steps."""
    rewards, successes, steps = [], [], []
    for seed in seeds:
        env = make_env(seed)
        total, result = 0.0, None
        while result is None or not result.done:
            result = env.step(policy_fn(env))
            total += result.reward
        rewards.append(total)
        successes.append(bool(result.info.get("success")))
        steps.append(env.steps)
    n = max(len(rewards), 1)
    return {
        "episodes": len(rewards),
        "mean_reward": sum(rewards) / n,
        "success_rate": sum(successes) / n,
        "mean_steps": sum(steps) / n,
    }


def expert_episode(env) -> list[Message]:
    """An env's scripted expert played to the end, as a chat (system, user, then assistant action / user
    observation turns), e.g. for a warm start by imitation."""
    messages = env.reset()
    while not env.done:
        action = env.expert_action()
        messages += [{"role": "assistant", "content": action}, *env.step(action).observations]
    return messages
