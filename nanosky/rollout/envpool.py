"""Per-rank pools of env worker processes: env steps run outside the trainer's process, concurrently with each
other (and with generation), and a hung, crashed or raising env costs only its own trajectory.

    pool = EnvPool(n_workers=2, step_timeout_s=30)
    h = pool.make("math", "train", seed=3)                 # the env lives in a worker; the parent holds a handle
    [msgs] = pool.reset([h])                               # list[dict] chat messages, or EnvFailure
    [res] = pool.step([(h, "<answer>42</answer>")])        # StepResult, or EnvFailure(reason)
    fut = pool.step_async(h, text)                         # concurrent.futures.Future; asyncio: asyncio.wrap_future
    pool.tools(h), pool.max_turns(h)                       # cached at make time, no round trip
    pool.close(h); pool.shutdown()                         # or `with EnvPool(...) as pool:`

How it works: each worker is a spawned process (never fork: the parent holds torch / vLLM threads and locks) fed
by one parent-side thread that sends it one request at a time and waits with a deadline. A request that misses its
deadline, or a worker that dies, gets the worker killed and respawned. The env that caused it is lost
(`EnvFailure`, counted in `stats["failed"]`); the other envs that lived in that worker are rebuilt in the new one
by replaying their actions (envs are deterministic given their seed), and the replay is checked against digests
of the original results — an env that does not replay identically is lost too, never silently different.

`InProcessPool` has the same interface without processes (n_workers = 0, evals, debugging); `make_pool` picks one.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import queue
import sys
import threading
import weakref
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

import envs
from envs.base import StepResult
from nanosky.rollout.envworker import close_env, describe, digest, worker_main


@dataclass
class EnvFailure:
    """The result of a reset/step whose env hung, died, raised or was lost with its worker."""

    reason: str
    handle: int = -1


# ---------------------------------------------------------------------------------------------- parent side


@dataclass
class _Record:
    spec: tuple  # (name, factory, split, seed, kwargs)
    worker: int
    tools: list[dict]
    max_turns: int
    log: list[tuple[str | None, str]] = field(default_factory=list)  # (action or None for reset, result digest)
    stale: bool = False  # its worker was restarted: rebuild by replay before the next op


_START_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_hidden(hide: bool):
    """A spawned child re-imports the parent's `__main__` (to find functions defined there); for run.py that drags
    torch + transformers into every worker: ~3 s and ~270 MB each. Hide it while a worker starts."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    with _START_LOCK:
        if hide:
            main.__spec__ = None
            main.__dict__.pop("__file__", None)
        try:
            yield
        finally:
            main.__dict__.update(saved)


class _Worker:
    def __init__(self, ctx, index: int, start_timeout_s: float, import_main: bool):
        self.ctx, self.index, self.start_timeout_s, self.import_main = (
            ctx,
            index,
            start_timeout_s,
            import_main,
        )
        self.requests: queue.Queue = queue.Queue()
        self.spawn()

    def spawn(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=worker_main, args=(child,), daemon=True, name=f"envpool-{self.index}")
        with _main_hidden(not self.import_main):
            self.proc.start()
        child.close()
        try:  # wait for the worker's hello, so a worker that cannot even start is an error, not a silent loss
            if self.conn.poll(self.start_timeout_s) and self.conn.recv()[0] == "ready":
                return
        except (EOFError, OSError):
            pass
        self.kill()
        raise RuntimeError(f"env worker {self.index} did not start (exit code {self.proc.exitcode}); see its stderr")

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class EnvPool:
    """`n_workers` env processes for this rank. Thread-safe; every op on one env runs in order.

    step_timeout_s bounds each reset/step; make_timeout_s bounds building an env (first imports included) and a
    worker's start. replay=False loses, instead of rebuilding, the envs that shared a replaced worker. Workers do
    not re-import the parent's `__main__`, so envs must be importable (defined in a module, not a script);
    import_main=True lifts that at the cost of importing the script's own imports in every worker.
    """

    def __init__(
        self,
        n_workers: int = 2,
        step_timeout_s: float = 30.0,
        start_method: Literal["spawn", "forkserver"] = "spawn",
        make_timeout_s: float = 120.0,
        replay: bool = True,
        import_main: bool = False,
    ):
        import multiprocess

        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1 (use InProcessPool for 0), got {n_workers}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver' (never fork), got {start_method!r}")
        self.step_timeout_s, self.make_timeout_s, self.replay = step_timeout_s, make_timeout_s, replay
        self.stats = {"failed": 0, "timeouts": 0, "worker_restarts": 0, "replayed": 0, "steps": 0}
        self._records: dict[int, _Record] = {}
        self._lost: dict[int, str] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        ctx = multiprocess.get_context(start_method)
        self._workers = [_Worker(ctx, i, make_timeout_s, import_main) for i in range(n_workers)]
        self._threads = [threading.Thread(target=self._serve, args=(w,), daemon=True) for w in self._workers]
        for t in self._threads:
            t.start()
        # Workers ignore SIGTERM (their parent finishes its step on it), so multiprocess's exit hook, which SIGTERMs
        # and joins daemon children, would wait forever on them: this hook, registered later, runs first.
        ref = weakref.ref(self)
        atexit.register(lambda: (pool := ref()) is not None and pool.shutdown())

    # ---- public API ----------------------------------------------------------------------------------------
    def make(self, name: str, split: str = "train", seed: int = 0, **kwargs) -> int:
        """Build an env in the least-loaded worker. Constructor errors (bad split, kwargs) raise here; a worker that
        hangs or dies while building returns a handle whose reset is an EnvFailure."""
        spec = (name, envs.get_env_factory(name), split, seed, kwargs)  # unknown names raise KeyError here
        with self._lock:
            handle = next(self._ids)
            load = [0] * len(self._workers)
            for r in self._records.values():
                load[r.worker] += 1
            w = min(range(len(load)), key=load.__getitem__)
            self._records[handle] = _Record(spec, w, [], 1)
        out = self._submit(handle, "make", spec).result()
        if isinstance(out, BaseException):
            with self._lock:
                del self._records[handle]
            raise out
        return handle

    def reset(self, handles: list[int]) -> list[list[dict] | EnvFailure]:
        futs = [self._submit(h, "reset", None) for h in handles]
        return [f.result() for f in futs]

    def step_async(self, handle: int, action: str) -> Future:
        """Resolves to StepResult | EnvFailure; never raises."""
        return self._submit(handle, "step", action)

    def step(self, pairs: list[tuple[int, str]]) -> list[StepResult | EnvFailure]:
        futs = [self.step_async(h, a) for h, a in pairs]
        return [f.result() for f in futs]

    def state_key(self, handle: int) -> Hashable | EnvFailure:
        """The env's `state_key()` now (None = it defines none)."""
        return self._submit(handle, "state_key", None).result()

    def action_constraint(self, handle: int) -> list[str] | str | None | EnvFailure:
        """The env's `action_constraint()` now: its choices, its grammar, or None (any reply)."""
        return self._submit(handle, "action_constraint", None).result()

    def expert_action(self, handle: int) -> str | EnvFailure:
        """The env's scripted expert's next action (`Env.expert_action()`: SFT's demonstrations)."""
        return self._submit(handle, "expert_action", None).result()

    def tools(self, handle: int) -> list[dict]:
        r = self._records.get(handle)
        return list(r.tools) if r else []

    def max_turns(self, handle: int) -> int:
        r = self._records.get(handle)
        return r.max_turns if r else 1

    def close(self, handle: int) -> None:
        with self._lock:
            r = self._records.pop(handle, None)
            self._lost.pop(handle, None)
        if r is not None and not self._closed:
            self._workers[r.worker].requests.put((None, "close", handle, None))

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            w.requests.put(None)
        for w, t in zip(self._workers, self._threads):
            t.join(timeout=1.0)
            if t.is_alive():  # still waiting on a hung step: killing the worker ends the wait
                w.proc.kill()
                t.join(timeout=5.0)
            w.kill()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    # ---- internals -----------------------------------------------------------------------------------------
    def _submit(self, handle: int, op: str, payload: Any) -> Future:
        fut: Future = Future()
        r = self._records.get(handle)
        if self._closed:
            fut.set_result(EnvFailure("env pool is shut down", handle))
        elif r is None:
            fut.set_result(EnvFailure(f"unknown or closed env handle {handle}", handle))
        else:
            self._workers[r.worker].requests.put((fut, op, handle, payload))
        return fut

    def _serve(self, w: _Worker) -> None:
        while (item := w.requests.get()) is not None:
            fut, op, handle, payload = item
            if fut is None:  # close: fire and forget
                self._send(w, (op, handle, payload))
                continue
            try:
                fut.set_result(self._run(w, op, handle, payload))
            except Exception as e:  # noqa: BLE001 - a bug here must not kill the thread and hang every caller
                fut.set_result(EnvFailure(f"env pool error: {e!r}", handle))
        self._send(w, ("stop", -1, None))
        w.proc.join(1.0)

    def _run(self, w: _Worker, op: str, handle: int, payload: Any) -> Any:
        if self._closed:
            return EnvFailure("env pool is shut down", handle)
        r = self._records.get(handle)
        if handle in self._lost or r is None:
            return EnvFailure(self._lost.get(handle, f"env handle {handle} was closed"), handle)
        if r.stale and (failure := self._rebuild(w, handle, r)):
            return failure
        timeout = self.make_timeout_s if op == "make" else self.step_timeout_s
        status, value = self._call(w, (op, handle, payload), timeout, handle)
        if status == "ok":
            if op == "make":
                r.tools, r.max_turns = value
            elif op not in ("state_key", "action_constraint", "expert_action"):  # a read: not replayed
                r.log.append((payload if op == "step" else None, digest(value)))
                with self._lock:
                    self.stats["steps"] += op == "step"
            return value
        if status == "raise":  # constructor error: the caller's mistake, re-raised by make()
            return value
        return self._lose(handle, value)

    def _call(self, w: _Worker, msg: tuple, timeout: float, culprit: int) -> tuple[str, Any]:
        """One request/response; on a timeout or a dead worker, replace the worker and report why."""
        try:
            w.conn.send(msg)
            if w.conn.poll(timeout):
                return w.conn.recv()
            reason, timed_out = f"{msg[0]} exceeded its {timeout:g}s timeout", True
        except (EOFError, OSError) as e:
            w.proc.join(0.5)
            reason, timed_out = f"env worker died during {msg[0]} (exit code {w.proc.exitcode}, {e!r})", False
        with self._lock:
            self.stats["timeouts"] += timed_out
        self._restart(w, culprit)
        return "env_error", reason

    def _send(self, w: _Worker, msg: tuple) -> None:
        try:
            w.conn.send(msg)
        except (OSError, ValueError):
            pass  # a dead worker is noticed (and replaced) by the next request that waits for a reply

    def _restart(self, w: _Worker, culprit: int) -> None:
        w.kill()
        if self._closed:
            return
        with self._lock:
            self.stats["worker_restarts"] += 1
            for h, r in self._records.items():
                if r.worker == w.index and h != culprit and h not in self._lost:
                    if self.replay:
                        r.stale = True
                    else:
                        self._lose(h, "env lost: its worker was restarted", locked=True)
        w.spawn()  # if this raises, the request that needed it fails and the next one tries again

    def _rebuild(self, w: _Worker, handle: int, r: _Record) -> EnvFailure | None:
        """Recreate an env in its new worker by replaying its actions; None on an identical replay."""
        r.stale = False
        timeout = self.make_timeout_s + self.step_timeout_s * len(r.log)
        status, digests = self._call(w, ("replay", handle, (r.spec, [a for a, _ in r.log])), timeout, handle)
        if status != "ok":
            return self._lose(handle, f"replay after a worker restart failed: {digests}")
        if digests != [d for _, d in r.log]:
            return self._lose(handle, "replay after a worker restart diverged (env is not deterministic)")
        with self._lock:
            self.stats["replayed"] += 1
        return None

    def _lose(self, handle: int, reason: str, locked: bool = False) -> EnvFailure:
        if not locked:
            with self._lock:
                return self._lose(handle, reason, locked=True)
        if handle not in self._lost:
            self._lost[handle] = reason
            self.stats["failed"] += 1
        return EnvFailure(self._lost[handle], handle)


class InProcessPool:
    """EnvPool's interface with the envs in this process: no timeouts, no isolation; a raising env still costs only
    its own trajectory. step_async runs the step immediately and returns a finished Future."""

    def __init__(self):
        self.stats = {"failed": 0, "timeouts": 0, "worker_restarts": 0, "replayed": 0, "steps": 0}
        self._envs: dict[int, Any] = {}
        self._lost: dict[int, str] = {}
        self._ids = itertools.count()

    def make(self, name: str, split: str = "train", seed: int = 0, **kwargs) -> int:
        handle = next(self._ids)
        self._envs[handle] = envs.make(name, split=split, seed=seed, **kwargs)
        return handle

    def add(self, env) -> int:
        """Adopt an already-built env object (e.g. an eval's custom Env)."""
        handle = next(self._ids)
        self._envs[handle] = env
        return handle

    def _do(self, handle: int, fn) -> Any:
        if handle in self._lost or handle not in self._envs:
            return EnvFailure(self._lost.get(handle, f"unknown or closed env handle {handle}"), handle)
        try:
            return fn(self._envs[handle])
        except Exception as e:  # noqa: BLE001 - envs promise never to raise; if one does, only it is lost
            self._lost[handle] = f"env raised: {e!r}"[:500]
            self.stats["failed"] += 1
            return EnvFailure(self._lost[handle], handle)

    def reset(self, handles: list[int]) -> list[list[dict] | EnvFailure]:
        return [self._do(h, lambda e: e.reset()) for h in handles]

    def step_async(self, handle: int, action: str) -> Future:
        fut: Future = Future()
        fut.set_result(self._do(handle, lambda e: e.step(action)))
        self.stats["steps"] += 1
        return fut

    def step(self, pairs: list[tuple[int, str]]) -> list[StepResult | EnvFailure]:
        return [self.step_async(h, a).result() for h, a in pairs]

    def state_key(self, handle: int) -> Hashable | EnvFailure:
        return self._do(handle, lambda e: e.state_key())

    def action_constraint(self, handle: int) -> list[str] | str | None | EnvFailure:
        return self._do(handle, lambda e: e.action_constraint())

    def expert_action(self, handle: int) -> str | EnvFailure:
        return self._do(handle, lambda e: e.expert_action())

    def tools(self, handle: int) -> list[dict]:
        return describe(self._envs[handle])[0] if handle in self._envs else []

    def max_turns(self, handle: int) -> int:
        return describe(self._envs[handle])[1] if handle in self._envs else 1

    def close(self, handle: int) -> None:
        close_env(self._envs.pop(handle, None))
        self._lost.pop(handle, None)

    def shutdown(self) -> None:
        for env in self._envs.values():
            close_env(env)
        self._envs.clear()

    def __enter__(self) -> InProcessPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def make_pool(n_workers: int, step_timeout_s: float = 30.0, **kwargs) -> EnvPool | InProcessPool:
    """n_workers = 0 → InProcessPool, else an EnvPool of that many workers."""
    if n_workers == 0:
        return InProcessPool()
    return EnvPool(n_workers=n_workers, step_timeout_s=step_timeout_s, **kwargs)
