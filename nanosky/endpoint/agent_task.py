"""What an external agent is given for one episode (the contract of `--rollout.agent MODULE:FN`):

    async def solve(client, task) -> float | None:
        # client: an openai.AsyncOpenAI pointed at this episode's endpoint (any `model` string is accepted)
        # task.messages, task.tools, task.id, task.seed; await task.grade(answer) -> float
        return reward        # or None: nanosky grades the last assistant message with the env

Behind the task is one env episode (in the rank's env pool during training). `grade(answer)` is the env's return
for that final answer: the env's step on the answer's text, plus what earlier env steps paid. The first grade is
the episode's: a second call returns the same value, as the env's episode is over. `step(text)` is the env's own
step, for agents that act in the env (text games, or the env's own tools: a reply holding `<tool_call>` text runs
them, as nanosky's loop does) rather than only answering.

A blocking harness gets `BlockingTask` (the same fields; `grade` and `step` block) and a blocking `openai.OpenAI`
client, and runs in a thread of its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from envs.base import StepResult
from nanosky.agent.task import Task
from nanosky.agent.trajectory import success_of


@dataclass
class AgentTask:
    messages: list[dict]  # the env episode's opening chat messages
    tools: list[dict]  # OpenAI tool schemas; [] when the env has none
    id: str
    seed: int
    env: Task = field(repr=False)  # the episode behind it
    graded: float | None = None  # the return the env gave, once graded
    success: bool | None = None  # the env's verdict, once graded (None then: the env has no checker)
    steps: int = 0  # env steps taken (grading included)
    info: dict = field(default_factory=dict)  # the env's info, once graded

    @property
    def done(self) -> bool:
        return self.graded is not None

    async def step(self, action: str) -> StepResult:
        """The env's step on one reply's text: its observations (chat messages), reward and whether it is done."""
        if self.done:
            return StepResult([], 0.0, True, {"error": "the episode is over"})
        res = await self.env.step(action)
        self.steps += 1
        if res.done:
            await self._finish()
        return res

    async def grade(self, answer: str) -> float:
        """The env's return for this final answer (the first grade is final)."""
        if not self.done:
            await self.env.step(answer if isinstance(answer, str) else str(answer))
            self.steps += 1
            await self._finish()
        return float(self.graded)

    async def _finish(self) -> None:
        verdict = await self.env.evaluate_result(None)
        self.graded, self.success = float(verdict.get("reward", 0.0)), success_of(verdict)
        self.info = dict(getattr(self.env, "_info", {}))  # the env's last info (its answer, prediction, ...)


class BlockingTask:
    """`AgentTask` for a harness that blocks (runs in a thread): `grade` and `step` wait for the episode's loop."""

    def __init__(self, task: AgentTask, loop: asyncio.AbstractEventLoop):
        self._task, self._loop = task, loop
        self.messages, self.tools, self.id, self.seed = task.messages, task.tools, task.id, task.seed

    @property
    def done(self) -> bool:
        return self._task.done

    def _wait(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def grade(self, answer: str) -> float:
        return self._wait(self._task.grade(answer))

    def step(self, action: str) -> StepResult:
        return self._wait(self._task.step(action))
