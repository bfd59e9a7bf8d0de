"""The harness runner: an external agent plays a rank's episodes through the endpoint (`--rollout.agent MODULE:FN`,
or `--rollout.agent-cmd "CMD"`), in place of nanosky's own loop.

    harness = Harness(engine_backend, tok, Sampling(...), agent="my_agent:solve", timeout_s=300, log_dir=run_dir)
    harness = Harness.from_config(cfg.rollout, engine_backend, tok, log_dir=run_dir, rank=rank)   # a training run's
    out = await harness.play(tasks, groups=groups, seeds=seeds, sample_seed=s)   # the Player interface
    trajs = harness.run(tasks, seeds=seeds)      # blocking, outside a training run (evals); harness.close() after

Up to `concurrency` episodes run at once (`--rollout.agent-concurrency`; the others wait in a queue, and an
episode's time counts from its start): its env is set up (in the env pool), it gets a key of its own on the
endpoint, and the agent runs with a client pointed there. The endpoint serves on the same event loop as the
engine's backend, from the first phase to the end of the run, so the agent's calls join the engine's continuous
batch with no thread hop; the endpoint records the exact tokens (`endpoint/episode.py`), and `rows.to_trajectory`
turns them into the trainer's `Trajectory`.
An async `solve` runs on this loop; a blocking one in a thread of its own, with a blocking client and a
`BlockingTask`. A command runs as a subprocess (`command.py`). An agent that raises, exits non-zero, returns
something other than a number or None, or runs past `timeout_s` costs its episode only: the episode is masked (no
token of it is trained, and its reward is its group's mean, so it moves no baseline), its traceback goes to
`<run dir>/agent_errors.rank<R>.log`, and `agent/errors` / `agent/timeouts` count it. Its key ends with the
episode: a thread that outlives its episode gets 410 on its next call (between phases, when the next phase starts).
With partial rollouts (`--rollout.max-staleness`) the carry starts each episode on its own (`start_episode`): it
may span phases, its calls held between them, and its time counts only while its phases run (`within`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import ssl
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import httpx

from nanosky.agent.player import Episode, Layout, Rollouts
from nanosky.agent.task import EnvError, Task
from nanosky.agent.trajectory import Trajectory
from nanosky.config import RolloutConfig, import_plugins
from nanosky.endpoint.agent_task import AgentTask, BlockingTask
from nanosky.endpoint.command import run_command
from nanosky.endpoint.rows import mask_failed, to_trajectory
from nanosky.endpoint.server import Endpoint, Sampling, Slot
from nanosky.rollout.loop import RankLoop
from nanosky.seeds import derive_seed

FAILED = ("error", "timeout", "env_error")
"""Stop reasons of a masked episode: the agent raised (or its command failed), it ran past its time, or its env
failed (hung or crashed in the pool)."""


class AgentError(ValueError):
    """`--rollout.agent` names nothing that can be called."""


def load_agent(spec: str) -> Callable:
    """MODULE:FN → the function, imported as `--plugins` imports (the working directory, then PYTHONPATH)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise AgentError(f"{spec!r}: expected MODULE:FUNCTION, e.g. my_agent:solve")
    import_plugins([])  # the working directory on sys.path, as `--plugins` has it
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise AgentError(f"{spec}: no module named {module!r} in the working directory or on PYTHONPATH")
    fn = importlib.import_module(module)
    for part in name.split("."):
        if not hasattr(fn, part):
            raise AgentError(f"{spec}: module {module!r} has no {name!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise AgentError(f"{spec}: {name} is not a function")
    return fn


def is_async(fn: Callable) -> bool:
    """An async function, or an object whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


class Harness:
    """The `Player` for external agents: `play` runs the episodes, `metrics` gives the `agent/*` scalars."""

    def __init__(
        self,
        backend,
        tok,
        sampling: Sampling,
        *,
        agent: str | Callable | None = None,
        cmd: str | None = None,
        timeout_s: float | None = 300.0,
        log_dir: str | None = None,
        rank: int = 0,
        concurrency: int | None = 32,
    ):
        if (agent is None) == (cmd is None):
            raise ValueError("give the agent as a function (agent) or as a command (cmd), not both")
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 (or None: no bound), got {concurrency}")
        self.backend, self.sampling, self.cmd, self.timeout_s = backend, sampling, cmd, timeout_s
        self.fn = load_agent(agent) if isinstance(agent, str) else agent
        self.errors_path = Path(log_dir) / f"agent_errors.rank{rank}.log" if log_dir else None
        self.concurrency, self.live, self.peak = concurrency, 0, 0  # episodes running now / at most at once
        # the weight version each call records: the engine backend's (set by the phase)
        self.endpoint = Endpoint(backend, tok, sampling, version=lambda: getattr(backend, "version", None) or 0)
        self.on_episode_done: Callable[[Trajectory], None] | None = None
        self._loop: RankLoop | None = None  # `run`'s own loop, when used outside a training run
        self._carried: asyncio.Semaphore | None = None  # the bound on carried episodes (`start_episode`)

    @classmethod
    def from_config(cls, cfg: RolloutConfig, backend, tok, log_dir: str | None = None, rank: int = 0) -> Harness:
        """The training run's harness: `--rollout.agent` / `--rollout.agent-cmd` and their limits, sampled as
        `--rollout.*` says."""
        sampling = Sampling(cfg.temperature, cfg.top_p, cfg.max_new_tokens, cfg.max_total_tokens)
        return cls(
            backend,
            tok,
            sampling,
            agent=cfg.agent,
            cmd=cfg.agent_cmd,
            timeout_s=cfg.agent_timeout_s,
            log_dir=log_dir,
            rank=rank,
            concurrency=cfg.agent_concurrency,
        )

    @property
    def base_url(self) -> str:
        return self.endpoint.base_url

    async def start(self) -> str:
        """Serve the endpoint on the running loop (once: the address stays the same for the whole run)."""
        if self.endpoint.server is None:
            await self.endpoint.start()
        return self.base_url

    async def play(self, tasks: list[Task], *, groups=None, seeds=None, sample_seed=None, temperature=None) -> Rollouts:
        """One episode per task; at most `concurrency` run at once, the others wait their turn (an episode's
        timeout counts from its start). Rows are step-wise when any episode came back in several segments."""
        await self.start()
        sampling = self.sampling if temperature is None else replace(self.sampling, temperature=temperature)
        gate = asyncio.Semaphore(self.concurrency or max(len(tasks), 1))
        self.peak = 0
        episodes = Episode.of_phase(len(tasks), groups, seeds, sample_seed)
        t0 = time.perf_counter()
        trajs = await asyncio.gather(
            *(self._queued(gate, self._bound(task, e, sampling)) for task, e in zip(tasks, episodes))
        )
        if hasattr(self.backend, "drain"):  # requests of timed-out episodes: the engine ends idle
            await self.backend.drain()
        trajs = self.settle(list(trajs))
        return Rollouts(trajs, self.layout(trajs), time.perf_counter() - t0)

    def settle(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """Episodes that ended, whole groups, as the trainer takes them: the engine's fatal error (stale weights, a
        bug) raised, since the run must stop as in nanosky's own loop; failed agents' episodes masked."""
        if self.endpoint.fatal is not None:
            fatal, self.endpoint.fatal = self.endpoint.fatal, None
            raise fatal
        return mask_failed(trajs, FAILED)

    def layout(self, trajs: list[Trajectory]) -> Layout:
        """Step-wise rows when any episode came back in several segments, else one row per episode."""
        return "stepwise" if any(len(t.steps) > 1 for t in trajs) else "concat"

    def start_episode(self, task: Task, episode: Episode, *, via) -> asyncio.Task:
        """One episode as a task on the running loop, not bound to a phase (partial rollouts carry it from one phase
        into the next: `nanosky/partial.py`). Its calls go to the engine through `via`, the carry's gate, which
        holds them between phases; its time (`timeout_s`) counts only while the gate lets calls through, so the
        training between two phases never times an agent out. At most `concurrency` such episodes run at once
        (apart from an eval's, which has its own bound: carried episodes waiting on the gate must not block it)."""
        if self._carried is None:
            self._carried = asyncio.Semaphore(self.concurrency or 1 << 30)
        bound = self._bound(task, episode, self.sampling, via=via)

        async def run() -> Trajectory:
            await self.start()
            return await self._queued(self._carried, bound)

        return asyncio.get_running_loop().create_task(run())

    def _bound(self, task: Task, episode: Episode, sampling, via=None):
        """One episode of `task`, ready to run (`play`'s and `start_episode`'s alike): its calls seeded by
        derive_seed(sample_seed, index) (an unseeded phase: 0), through `via` (None: the engine directly)."""
        return functools.partial(self._episode, self.endpoint, task, episode, sampling=sampling, via=via)

    def run(self, tasks: list[Task], groups=None, seeds=None, sample_seed=None, temperature=None):
        """Blocking `play` for use outside a training run (evals, benches, tests), on a loop of the harness's own
        that lives until `close` (so the endpoint keeps its address)."""
        self._loop = self._loop or RankLoop()
        play = self.play(tasks, groups=groups, seeds=seeds, sample_seed=sample_seed, temperature=temperature)
        return self._loop.run(play, threads=len(tasks)).trajs

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        return metrics(trajs)

    async def aclose(self) -> None:
        await self.endpoint.stop()

    def close(self) -> None:
        """Ends what `run` started: the endpoint and its loop."""
        if self._loop is not None:
            self._loop.run(self.aclose())
            self._loop.close()
            self._loop = None

    async def _queued(self, gate: asyncio.Semaphore, episode: Callable[[], Awaitable[Trajectory]]) -> Trajectory:
        """`episode()` once `gate` lets it in (--rollout.agent-concurrency), counted as live while it runs."""
        async with gate:
            self.live += 1
            self.peak = max(self.peak, self.live)
            try:
                return await episode()
            finally:
                self.live -= 1

    async def _episode(self, ep, task: Task, episode: Episode, *, sampling, via=None) -> Trajectory:
        t0 = time.perf_counter()
        t = episode.trajectory(task, stop_reason="done")
        seed = derive_seed(0 if episode.sample_seed is None else episode.sample_seed, episode.index)
        key = slot = at = None
        try:
            await task.initialize_runtime()
            at = AgentTask(list(task.get_instruction()), list(task.tools or []), t.task_id, episode.env_seed, task)
            key = ep.open_episode(t.task_id, seed, sampling, backend=via)
            solve = self._solve(at, key)
            held = via.held_s if via is not None else None
            result = await (within(solve, self.timeout_s, held) if self.timeout_s else solve)
            slot = ep.close_episode(key)
            if result is None:
                result = await at.grade(slot.last_text)
            elif isinstance(result, bool) or not isinstance(result, int | float):
                raise TypeError(f"the agent returned {type(result).__name__} {result!r:.80}: expected a float or None")
            t.reward = float(result)
        except Exception as e:  # noqa: BLE001 - costs this episode only
            slot = _out_of_budget(ep, key, at, e)
            graded = await _grade_last(at, slot) if slot is not None else e
            if not isinstance(graded, Exception):
                t.reward = graded
            else:
                e = graded
                timeout = isinstance(e, asyncio.TimeoutError | TimeoutError)
                t.stop_reason = "timeout" if timeout else "env_error" if isinstance(e, EnvError) else "error"
                why = f"ran past --rollout.agent-timeout-s {self.timeout_s}"
                t.error = why if timeout else f"{type(e).__name__}: {e}"[:1000]
                self._log_error(t, e)
        if slot is None and key is not None:
            slot = ep.close_episode(key)
        if slot is not None and slot.out_of_budget and t.stop_reason == "done":
            t.stop_reason = "length"  # cut at --rollout.max-total-tokens, as nanosky's loop cuts its episodes
        try:
            await task.complete_runtime()
        except Exception as e:  # noqa: BLE001
            t.error = (t.error + " | " if t.error else "") + f"complete_runtime: {e!r}"[:500]
        to_trajectory(t, slot, at, ep.tok)
        t.latency_s = round(time.perf_counter() - t0, 4)
        if self.on_episode_done is not None:
            self.on_episode_done(t)
        return t

    async def _solve(self, task: AgentTask, key: str):
        import openai

        base_url = self.base_url
        if self.cmd:
            return await run_command(self.cmd, base_url, key, task)
        if is_async(self.fn):
            async with httpx.AsyncClient(verify=_ssl_context(), timeout=TIMEOUT) as http:
                client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=2, http_client=http)
                return await self.fn(client, task)
        blocking = BlockingTask(task, asyncio.get_running_loop())

        def run():
            with httpx.Client(verify=_ssl_context(), timeout=TIMEOUT) as http:
                client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=2, http_client=http)
                return self.fn(client, blocking)

        return await in_thread(run)

    def _log_error(self, t: Trajectory, e: BaseException) -> None:
        if self.errors_path is None:
            return
        self.errors_path.parent.mkdir(parents=True, exist_ok=True)
        trace = "".join(traceback.format_exception(e)) if not isinstance(e, TimeoutError) else t.error + "\n"
        with self.errors_path.open("a") as f:
            f.write(
                f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} episode {t.task_id} (group {t.group}): "
                f"{t.stop_reason}\n{trace}"
            )


def _out_of_budget(ep: Endpoint, key: str | None, at: AgentTask | None, e: Exception) -> Slot | None:
    """An agent that failed after the endpoint refused it a call for the token budget (its harness raised on the
    400, or its command exited non-zero) ran out of budget; it did not fail. Its episode ends truncated: the slot,
    closed, with its segments; None for any other failure."""
    slot = ep.slots.get(key) if key is not None else None
    if slot is None or not slot.out_of_budget or at is None or isinstance(e, EnvError | TimeoutError):
        return None
    return ep.close_episode(key)


async def _grade_last(at: AgentTask, slot: Slot) -> float | Exception:
    """A truncated episode's grade: its last reply, as when an agent returns None (or what grading raised)."""
    try:
        return await at.grade(slot.last_text)
    except Exception as e:  # noqa: BLE001 - the env failed: the episode's error
        return e


def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every episode's HTTP client. httpx builds one per client by default, loading the CA
    bundle each time (measured 19 ms per episode, in the event loop that drives the engine), for an endpoint that
    is plain HTTP on localhost. Not one shared client either: httpcore's pool scans every connection for every
    request, quadratic in the episodes (measured 3.9 s of a 128-episode phase)."""
    global _SSL
    if _SSL is None:
        _SSL = ssl.create_default_context()
    return _SSL


_SSL: ssl.SSLContext | None = None
TIMEOUT = httpx.Timeout(600.0, connect=10.0)


async def within(aw: Awaitable, limit_s: float, held: Callable[[], float] | None = None):
    """`aw` given `limit_s` seconds, or TimeoutError (it is cancelled). `held`, a running total of seconds, is
    time that does not count: a carried episode's time between phases, while the loop did not run at all."""
    if held is None:
        return await asyncio.wait_for(aw, limit_s)
    task, t0, h0 = asyncio.ensure_future(aw), time.monotonic(), held()
    try:
        while (left := limit_s - (time.monotonic() - t0 - (held() - h0))) > 0:
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
        raise TimeoutError
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def in_thread(fn: Callable) -> asyncio.Future:
    """`fn()` in a daemon thread of its own, as a future of this loop. Not a thread pool: a blocking agent that
    hangs is abandoned when its episode times out, and a daemon thread never holds up the process's exit."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(value, error) -> None:
        if not fut.done():
            fut.set_exception(error) if error is not None else fut.set_result(value)

    def target() -> None:
        value, error = None, None
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the episode, which fails on it
            error = e
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the rollout phase is over and its loop closed: nobody waits any more
            pass

    threading.Thread(target=target, name="nanosky-agent", daemon=True).start()
    return fut


def metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """The step's `agent/*` scalars over a global batch of harness episodes (none over no episodes)."""
    if not trajs:
        return {}
    n = len(trajs)
    agent = [t.info.get("agent", {}) for t in trajs]
    return {
        "agent/segments_per_episode": sum(a.get("segments", 0) for a in agent) / n,
        "agent/calls_per_episode": sum(a.get("calls", 0) for a in agent) / n,
        "agent/errors": float(sum(t.stop_reason == "error" for t in trajs)),
        "agent/timeouts": float(sum(t.stop_reason == "timeout" for t in trajs)),
        "agent/truncated": float(sum(t.stop_reason == "length" for t in trajs)),  # out of --rollout.max-total-tokens
        "agent/rejected_calls": float(sum(a.get("rejected", 0) for a in agent)),
    }
