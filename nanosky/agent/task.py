"""Tasks: what an agent works on. The runner drives every task through the same life cycle:

    await task.initialize_runtime()          # e.g. build the env, start a sandbox
    messages = task.get_instruction()        # opening chat messages
    loop: text = <backend generates>; res = await task.step(text)   # until res.done or a limit
    await task.complete_runtime()            # tear down (always called, also after errors)
    verdict = await task.evaluate_result(trajectory)   # {"reward": float, "success": bool, ...}

`EnvTask` adapts any `envs.Env` (steps run in a thread so a slow tool never stalls other agents); `PooledEnvTask`
runs the env in an `EnvPool` worker instead, with the pool's timeouts and crash isolation.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Any

import envs
from envs.base import Env, StepResult
from nanosky.agent.trajectory import success_of
from nanosky.rollout.envpool import EnvFailure


class EnvError(RuntimeError):
    """A task's runtime failed (env hung, crashed, raised); costs this trajectory only."""


class Task(ABC):
    """Subclass and implement `get_instruction` and `evaluate_result`; multi-turn tasks also implement `step`."""

    task_id: str = ""
    tools: list[dict] = []  # OpenAI function schemas shown to the model (the chat template lists them)
    max_turns: int = 1

    async def initialize_runtime(self) -> None:  # noqa: B027 - optional hook
        """Set up whatever the task needs (env, sandbox, files). Default: nothing."""

    @abstractmethod
    def get_instruction(self) -> list[dict]: ...

    def state_key(self) -> Hashable | None:
        """The state before the first action, read after `initialize_runtime` (GiGPO's anchors; later states come
        from each step's `info["state_key"]`). None: the runner keys states by the observation text."""
        return None

    async def action_constraint(self) -> list[str] | str | None:
        """What the next reply may be, for constrained sampling (`AgentRunner(constrain_actions=True)`): a list of
        exact replies (a text game's admissible actions), an EBNF grammar the reply matches (one well-formed tool
        call), or None = any reply. Default: None."""
        return None

    async def expert_action(self) -> str:
        """The task's own scripted expert's next reply (SFT's demonstrations: nanosky/agent/demos.py). Default: none."""
        raise EnvError(f"{self.task_id or type(self).__name__}: this task has no expert to demonstrate it")

    async def step(self, action: str) -> StepResult:
        """React to one assistant turn. Default: a single-turn task, judged by `evaluate_result`."""
        return StepResult(observations=[], reward=0.0, done=True)

    async def complete_runtime(self) -> None:  # noqa: B027 - optional hook
        """Tear the runtime down; called even when the task failed. Default: nothing."""

    @abstractmethod
    async def evaluate_result(self, result: Any) -> dict:
        """`result` is the finished `Trajectory`. Returns at least {"reward": float, "success": bool (None: not checked)}."""


class EnvTask(Task):
    """Any `envs.Env` as a task: reward = sum of step rewards, success = the last step's `info["success"]`."""

    def __init__(self, env: Env, task_id: str = ""):
        self.env, self.task_id = env, task_id
        self.tools = [t.schema for t in env.tools]
        self.max_turns = int(env.max_turns)
        self._messages: list[dict] | None = None
        self._state_key: Hashable | None = None
        self._rewards: list[float] = []
        self._info: dict = {}

    @classmethod
    def make(cls, name: str, split: str = "train", seed: int = 0, **kwargs) -> EnvTask:
        return cls(envs.make(name, split=split, seed=seed, **kwargs), task_id=f"{name}/{split}/{seed}")

    async def initialize_runtime(self) -> None:
        self._messages = await asyncio.to_thread(self.env.reset)
        self._state_key = self.env.state_key()

    def get_instruction(self) -> list[dict]:
        return list(self._messages or [])

    def state_key(self) -> Hashable | None:
        return self._state_key

    async def action_constraint(self) -> list[str] | str | None:
        return await asyncio.to_thread(self.env.action_constraint)

    async def expert_action(self) -> str:
        try:  # as in a pool worker: what the env raises (`NoExpert` too) costs this episode (env_error), not the run
            return await asyncio.to_thread(self.env.expert_action)
        except Exception as e:  # noqa: BLE001
            raise EnvError(f"env raised in expert_action: {e!r}"[:500]) from e

    async def step(self, action: str) -> StepResult:
        res = await asyncio.to_thread(self.env.step, action)
        self._rewards.append(float(res.reward))
        self._info = dict(res.info)
        return res

    async def complete_runtime(self) -> None:
        self.env.close()

    async def evaluate_result(self, result: Any) -> dict:
        return {"reward": float(sum(self._rewards)), "success": success_of(self._info)}  # None: no checker


class PooledEnvTask(EnvTask):
    """An env that lives in an `EnvPool` worker; a hung or crashed env raises `EnvError` for this task only."""

    def __init__(self, pool, name: str, split: str = "train", seed: int = 0, **kwargs):
        self.pool, self.spec = pool, (name, split, seed, kwargs)
        self.task_id, self.handle = f"{name}/{split}/{seed}", None
        self.tools, self.max_turns = [], 1
        self._messages, self._rewards, self._info, self._state_key = None, [], {}, None

    async def initialize_runtime(self) -> None:
        name, split, seed, kwargs = self.spec
        self.handle = await asyncio.to_thread(self.pool.make, name, split, seed, **kwargs)
        self.tools, self.max_turns = self.pool.tools(self.handle), self.pool.max_turns(self.handle)
        [msgs] = await asyncio.to_thread(self.pool.reset, [self.handle])
        self._messages = _ok(msgs)
        self._state_key = _ok(await asyncio.to_thread(self.pool.state_key, self.handle))

    async def action_constraint(self) -> list[str] | str | None:
        return _ok(await asyncio.to_thread(self.pool.action_constraint, self.handle))

    async def expert_action(self) -> str:
        return _ok(await asyncio.to_thread(self.pool.expert_action, self.handle))

    async def step(self, action: str) -> StepResult:
        res = _ok(await asyncio.wrap_future(self.pool.step_async(self.handle, action)))
        self._rewards.append(float(res.reward))
        self._info = dict(res.info)
        return res

    async def complete_runtime(self) -> None:
        if self.handle is not None:
            self.pool.close(self.handle)


def _ok(x):
    if isinstance(x, EnvFailure):
        raise EnvError(x.reason)
    return x
