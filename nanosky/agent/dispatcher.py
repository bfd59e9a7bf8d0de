"""The Dispatcher: run many agents at once with a concurrency limit per pipeline stage.

    d = Dispatcher({"initialize": 8, "generate": 8, "step": 8, "evaluate": 4})
    async with d.stage("generate"):      # at most 8 agents inside at any moment
        ...
    results = await d.map(run_one_agent, tasks)

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
