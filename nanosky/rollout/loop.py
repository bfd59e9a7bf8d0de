"""The rank's one event loop, for the whole run. Every rollout phase (the step's episodes, the eval's) runs on it,
and the endpoint for external agents serves on it, so an agent's call reaches the engine with no thread hop.

    loop = RankLoop()
    trajs = loop.run(player.play(tasks), threads=len(tasks))   # one phase: the loop runs until the phase is done
    loop.close()                                                # the end of the run (also on an exception)

The loop runs only inside `run`: between phases (while the trainer trains) nothing on it moves. A request that
reaches a server on it then waits in the socket's queue and is answered when the next phase starts (or at close).
Blocking work of a phase (env steps of in-process envs, env-pool calls) runs in the loop's thread pool, which grows
to the largest phase's `threads`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
SPARE_THREADS = 4
"""Threads beyond a phase's episodes: set-up calls that are not an episode's (an env pool's first worker)."""


class RankLoop:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._pools: list[ThreadPoolExecutor] = []
        self._threads = 0

    def run(self, coro: Coroutine[Any, Any, T], threads: int = 0) -> T:
        """Run one phase to its end. `threads`: the blocking calls it may have in flight at once."""
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("this rank's event loop is closed (the run has ended)")
        if threads > self._threads or not self._pools:
            self._threads = max(threads, self._threads)
            pool = ThreadPoolExecutor(self._threads + SPARE_THREADS, thread_name_prefix="nanosky-blocking")
            self.loop.set_default_executor(pool)
            self._pools.append(pool)
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        """Cancel what is left on the loop (servers' open connections, abandoned requests) and close it. Threads still
        blocked in an env call are not waited for: they end with their call, or with the process."""
        if self.loop.is_closed():
            return
        try:
            left = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for t in left:
                t.cancel()
            if left:
                self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            for pool in self._pools:
                pool.shutdown(wait=False, cancel_futures=True)
            self.loop.close()
