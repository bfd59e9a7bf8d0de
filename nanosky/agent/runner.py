"""AgentRunner: a batch of tasks → a list of `AgentTrajectory`, many agents at once, through a `Dispatcher`.

    runner = AgentRunner(OpenAIBackend("http://127.0.0.1:8000/v1"), max_parallel_agents=8, max_tokens_per_turn=128)
    trajs = runner.run([EnvTask.make("math", "test", seed=i) for i in range(50)])
    save_jsonl(trajs, "evals.jsonl"); print(summarize(trajs)["accuracy"])

Per task: initialise → (generate → step)* → complete → evaluate, each stage under its own concurrency limit.
Anything a task or backend does wrong ends that trajectory with a stop reason (env_error, backend_error, error,
timeout), never the batch. This is the message-level runner for evaluation and standalone use; training uses the
token-level loop in `nanosky.rollout`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nanosky.agent.backends import Backend, BackendError, ContextLengthError
from nanosky.agent.dispatcher import STAGES, Dispatcher
from nanosky.agent.task import EnvError, Task


@dataclass
class AgentTrajectory:
    task_id: str
    messages: list[dict] = field(default_factory=list)  # the whole conversation, instruction first
    turns: list[dict] = field(
        default_factory=list
    )  # per assistant turn: text, finish_reason, tokens, latency_s, reward
    tool_calls: list[dict] = field(
        default_factory=list
    )  # every call the env ran: name, arguments, ok, error, turn
    reward: float = 0.0
    success: bool = False
    stop_reason: str = ""  # done | max_turns | max_tokens | timeout | env_error | backend_error | error
    prompt_tokens: int = 0  # summed over turns: what the backend processed
    completion_tokens: int = 0
    latency_s: float = 0.0
    error: str = ""
    evaluation: dict[str, Any] = field(default_factory=dict)  # what task.evaluate_result returned

    @property
    def n_turns(self) -> int:
        return len(self.turns)

    @property
    def n_invalid_tool_calls(self) -> int:
        return sum(not c.get("ok", True) for c in self.tool_calls)

    def to_json(self) -> dict:
        return asdict(self) | {"n_turns": self.n_turns, "n_invalid_tool_calls": self.n_invalid_tool_calls}


class AgentRunner:
    """`max_parallel_agents` bounds every stage; `stage_limits` overrides single stages (e.g. {"generate": 64} for a
    batching engine). `max_turns` None = each task's own. `max_total_tokens` stops a conversation whose prompt +
    reply reached it. `task_timeout_s` bounds one task's whole turn loop."""

    def __init__(
        self,
        backend: Backend,
        max_parallel_agents: int = 8,
        max_turns: int | None = None,
        max_tokens_per_turn: int = 256,
        temperature: float = 1.0,
        max_total_tokens: int | None = None,
        task_timeout_s: float | None = None,
        stage_limits: dict[str, int] | None = None,
    ):
        if max_parallel_agents < 1 or max_tokens_per_turn < 1 or (max_turns is not None and max_turns < 1):
            raise ValueError("max_parallel_agents, max_tokens_per_turn and max_turns must be >= 1")
        self.backend, self.max_turns, self.max_tokens_per_turn = backend, max_turns, max_tokens_per_turn
        self.temperature, self.max_total_tokens, self.task_timeout_s = (
            temperature,
            max_total_tokens,
            task_timeout_s,
        )
        self.limits = {s: max_parallel_agents for s in STAGES} | dict(stage_limits or {})
        self.last_dispatcher: Dispatcher | None = None  # inspect .peak after a run

    def run(self, tasks: list[Task]) -> list[AgentTrajectory]:
        """Blocking: runs its own event loop (use `arun` from async code)."""

        async def main():
            # Env steps run in threads; the default executor (cpu + 4 threads) would cap them below the stage limit.
            workers = max(self.limits["step"], self.limits["initialize"]) + 4
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(workers))
            try:
                return await self.arun(tasks)
            finally:
                if hasattr(self.backend, "aclose"):
                    await self.backend.aclose()

        return asyncio.run(main())

    async def arun(self, tasks: list[Task]) -> list[AgentTrajectory]:
        d = self.last_dispatcher = Dispatcher(self.limits)
        return await d.map(lambda i, t: self._run_one(d, i, t), tasks)

    async def _run_one(self, d: Dispatcher, index: int, task: Task) -> AgentTrajectory:
        t0 = time.perf_counter()
        traj = AgentTrajectory(task_id=task.task_id or str(index))
        try:
            async with d.stage("initialize"):
                await task.initialize_runtime()
            traj.messages = list(task.get_instruction())
            loop = self._turns(d, task, traj)
            traj.stop_reason = await (
                asyncio.wait_for(loop, self.task_timeout_s) if self.task_timeout_s else loop
            )
        except Exception as e:  # noqa: BLE001 - costs this trajectory only
            traj.stop_reason, traj.error = _stop_reason(e), f"{type(e).__name__}: {e}"[:1000]
        try:
            await task.complete_runtime()
        except Exception as e:  # noqa: BLE001
            traj.error = (traj.error + " | " if traj.error else "") + f"complete_runtime: {e!r}"[:500]
        if traj.stop_reason in ("done", "max_turns", "max_tokens", "timeout"):
            try:
                async with d.stage("evaluate"):
                    traj.evaluation = _jsonable(await task.evaluate_result(traj))
                traj.reward = float(traj.evaluation.get("reward", 0.0))
                traj.success = bool(traj.evaluation.get("success", False))
            except Exception as e:  # noqa: BLE001
                traj.stop_reason, traj.error = "error", f"evaluate_result: {e!r}"[:1000]
        traj.latency_s = round(time.perf_counter() - t0, 4)
        return traj

    async def _turns(self, d: Dispatcher, task: Task, traj: AgentTrajectory) -> str:
        """Generate / step until the task is done or a limit is hit; returns the stop reason."""
        max_turns = self.max_turns or task.max_turns
        for turn in range(1, max_turns + 1):
            async with d.stage("generate"):
                t0 = time.perf_counter()
                g = await self.backend.generate(
                    traj.messages, task.tools or None, self.max_tokens_per_turn, self.temperature
                )
                gen_s = time.perf_counter() - t0
            traj.messages.append({"role": "assistant", "content": g.text})
            traj.prompt_tokens += g.prompt_tokens
            traj.completion_tokens += g.completion_tokens
            record = {"text": g.text, "finish_reason": g.finish_reason, "prompt_tokens": g.prompt_tokens,
                      "completion_tokens": g.completion_tokens, "latency_s": round(gen_s, 4)}  # fmt: skip
            if g.token_ids is not None:
                record["token_ids"] = g.token_ids
            if g.logprobs is not None:
                record["logprobs"] = g.logprobs
            traj.turns.append(record)
            async with d.stage("step"):
                t0 = time.perf_counter()
                res = await task.step(g.text)
                record["step_latency_s"] = round(time.perf_counter() - t0, 4)
            record["reward"], record["done"] = float(res.reward), bool(res.done)
            traj.tool_calls += [{**c, "turn": turn} for c in res.info.get("calls", [])]
            if res.done:
                return "done"
            if turn == max_turns:
                return "max_turns"
            if g.finish_reason == "length":  # a cut-off turn: what follows would answer half a message
                return "max_tokens"
            if self.max_total_tokens and g.prompt_tokens + g.completion_tokens >= self.max_total_tokens:
                return "max_tokens"
            traj.messages += res.observations
        return "max_turns"


def _stop_reason(e: BaseException) -> str:
    if isinstance(e, ContextLengthError):
        return "max_tokens"
    if isinstance(e, BackendError):
        return "backend_error"
    if isinstance(e, EnvError):
        return "env_error"
    if isinstance(e, asyncio.TimeoutError | TimeoutError):
        return "timeout"
    return "error"


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=repr))


# ---------------------------------------------------------------------------------------------- outputs


def save_jsonl(trajs: list[AgentTrajectory], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in trajs:
            f.write(json.dumps(t.to_json(), default=repr) + "\n")
    return path


def load_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def summarize(trajs: list[AgentTrajectory]) -> dict[str, Any]:
    """Accuracy and the usual agent metrics over a batch."""
    n = max(len(trajs), 1)
    calls = sum(len(t.tool_calls) for t in trajs)
    return {
        "n": len(trajs),
        "accuracy": sum(t.success for t in trajs) / n,
        "reward_mean": sum(t.reward for t in trajs) / n,
        "turns_mean": sum(t.n_turns for t in trajs) / n,
        "tool_calls_per_traj": calls / n,
        "invalid_tool_call_rate": sum(t.n_invalid_tool_calls for t in trajs) / max(calls, 1),
        "completion_tokens_mean": sum(t.completion_tokens for t in trajs) / n,
        "latency_s_mean": sum(t.latency_s for t in trajs) / n,
        "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
    }
