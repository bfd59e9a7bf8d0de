"""Where the endpoint lives during a run: a thread of its own, with its own event loop, from the first rollout phase
to the end of training. Its address stays the same from step to step, and a call that arrives between rollout
phases (an agent that outlived its episode) still gets an answer: 410, that episode has ended.

The engine is not thread-safe: it is driven by the rollout phase's event loop (`EngineBackend`). While a phase
runs, `attach` hands the endpoint a backend whose calls are submitted to that loop, so an external agent's requests
join the same continuous batch as every other episode's.

    host = Host(tok, Sampling(max_tokens=64))       # starts the thread; host.base_url = http://127.0.0.1:PORT/v1
    with host.attached(engine_backend, asyncio.get_running_loop(), version=lambda: v):
        key = host.endpoint.open_episode(...)       # ... agents call base_url with their keys ...
    host.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

from nanosky.agent.backends import BackendError, GenerationResult, Request
from nanosky.endpoint.server import Endpoint, Sampling


class OnLoop:
    """A backend whose calls run `inner.generate` on `loop` (the rollout phase's), from any other loop."""

    def __init__(self, inner, loop: asyncio.AbstractEventLoop):
        self.inner, self.loop = inner, loop

    async def generate(self, req: Request) -> GenerationResult:
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self.inner.generate(req), self.loop)
        )

    async def aclose(self) -> None:
        pass


class Detached:
    """The backend between rollout phases: no engine to sample from (every episode has ended by then)."""

    async def generate(self, req: Request) -> GenerationResult:
        raise BackendError("no rollout phase is running")

    async def aclose(self) -> None:
        pass


class Host:
    def __init__(self, tok, sampling: Sampling, host: str = "127.0.0.1", port: int = 0):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="nanosky-endpoint", daemon=True)
        self.thread.start()
        self.endpoint = Endpoint(Detached(), tok, sampling)
        self.base_url = self._call(self.endpoint.start(host, port))

    async def _shutdown(self) -> None:
        """Stop listening, then end the connections still open (keep-alive clients) before the loop goes."""
        await self.endpoint.stop()
        open_ = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in open_:
            t.cancel()
        await asyncio.gather(*open_, return_exceptions=True)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    @contextlib.contextmanager
    def attached(
        self, backend, loop: asyncio.AbstractEventLoop, version: Callable[[], int]
    ) -> Iterator[Endpoint]:
        """The endpoint samples with `backend` on `loop` for the duration (one rollout phase)."""
        self.endpoint.backend, self.endpoint.version = OnLoop(backend, loop), version
        try:
            yield self.endpoint
        finally:
            self.endpoint.backend = Detached()

    def close(self) -> None:
        if not self.thread.is_alive():
            return
        self._call(self._shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
