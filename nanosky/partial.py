"""Partial rollouts with bounded staleness (`--rollout.max-staleness K`, `--rollout.oversample F`): a step no longer
waits for its slowest episode. The rule (docs/partial_rollouts.md):

- A rank keeps ceil(F × its share) groups in flight. Its rollout phase ends once its share of groups is complete;
  it trains its share of complete groups, oldest first, and carries the rest.
- A carried episode is paused, not dropped: its engine request is cut (`EngineBackend.pause`), its ids, logprobs
  and their weight versions are kept, its env state stays in the pool worker, and its coroutine waits on the rank's
  loop. In the next phase it goes on under the new weights, prefilled again from its own ids.
- A group is trained only when all its members are done. A group whose oldest token is K versions old must
  finish: the phase waits for it. Nothing is dropped, nothing is trained twice.
- A step at which a checkpoint is due (and the last step) drains: it starts only what completes its share, and
  every started group finishes, so no episode spans a checkpoint.
- The run's player plays the carried episodes (`Carrier.start_episode`, each episode's calls through the gate),
  whichever it is: nanosky's loop, or an external agent (`--rollout.agent`) on the run's endpoint, where a call cut
  at a phase's end is answered in the next phase, a call made between phases waits for it, and the agent's clock
  stops between phases (`Gate.held_s`). The carry never asks which.

    carry = Carry(cfg.rollout, engine_backend, world, rank, player=player)
    out = await carry.phase(make_task, step, version, seed, drain=ckpt_due)   # Rollouts, on the rank's loop

K = 0 never builds a Carry: the step is the synchronous one (`collect.Rollout.run`), unchanged.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from nanosky.agent.backends import EngineBackend, GenerationResult, Request
from nanosky.agent.player import Carrier, Episode, Rollouts, tail_s
from nanosky.agent.task import Task
from nanosky.config import RolloutConfig
from nanosky.seeds import derive_seed


class Gate:
    """The carried episodes' backend: their requests pass while a phase of theirs runs and wait between phases (an
    eval's requests go to the engine backend itself and do not wait). `held_s()` is the time it has held them, a
    running total: an external agent's clock (`--rollout.agent-timeout-s`) leaves it out."""

    def __init__(self, inner: EngineBackend):
        self.inner, self.open = inner, asyncio.Event()
        self._held, self._since = 0.0, time.monotonic()  # held from its start to the first phase

    async def generate(self, req: Request) -> GenerationResult:
        await self.open.wait()
        return await self.inner.generate(req)

    def release(self) -> None:
        if not self.open.is_set():
            self._held += time.monotonic() - self._since
            self.open.set()

    def hold(self) -> None:
        if self.open.is_set():
            self._since = time.monotonic()
            self.open.clear()

    def held_s(self) -> float:
        return self._held + (0.0 if self.open.is_set() else time.monotonic() - self._since)

    async def aclose(self) -> None:
        pass


class Hold:
    """Testing only (`--debug.hold-extra-groups`): one episode's backend that lets its first request through and
    holds the later ones until `ended` (the phase it started in has ended), so the episode is carried across the
    weight update, cut mid-episode, however fast the machine (the gate then holds it until the next phase)."""

    def __init__(self, inner, ended: asyncio.Event):
        self.inner, self.ended, self.first = inner, ended, True

    async def generate(self, req: Request) -> GenerationResult:
        if not self.first:
            await self.ended.wait()
        self.first = False
        return await self.inner.generate(req)

    def held_s(self) -> float:  # the gate's clock (an external agent's timeout leaves the held time out)
        return self.inner.held_s()


@dataclass
class Group:
    gid: int
    episodes: list[asyncio.Task]  # each gives its Trajectory
    step: int  # the step that started it
    version: int  # the weights it started under: the version of its oldest token

    @property
    def done(self) -> bool:
        return all(e.done() for e in self.episodes)


class Carry:
    def __init__(
        self, cfg: RolloutConfig, backend: EngineBackend, world: int, rank: int, *, player: Carrier, hold=False
    ):
        """`player`: the run's, which plays the carried episodes (`Carrier.start_episode`, its calls through the
        gate) and settles them once trained. `hold`: `--debug.hold-extra-groups` (testing only): the groups started
        beyond the share `Hold`."""
        self.backend, self.gate, self.hold, self.player = backend, Gate(backend), hold, player
        self.K, self.n, self.world, self.rank = cfg.max_staleness, cfg.group_size, world, rank
        self.share = cfg.prompts_per_step // world  # groups this rank trains per step
        self.target = math.ceil(cfg.oversample * self.share)  # groups in flight at a phase's start
        self.groups: list[Group] = []  # started, not yet trained, oldest first

    @property
    def most_episodes(self) -> int:
        """The most episodes a phase has in flight at once (its target of groups, each of group size)."""
        return self.target * self.n

    def in_flight(self) -> int:
        """Episodes started and not yet trained (what a stop now would discard)."""
        return sum(len(g.episodes) for g in self.groups)

    async def phase(
        self, make_task: Callable[[int], Task], step: int, version: int, seed: int, drain: bool = False
    ) -> Rollouts:
        """This step's phase: resume the carried episodes under `version`, start new groups up to the target (a
        draining step: up to its share), run until the rule above holds, pause the rest. Returns the trained
        groups' trajectories (this rank's share, oldest first), in the player's layout, with the rollout/* metrics."""
        t0 = time.perf_counter()
        carried = sum(not e.done() for g in self.groups for e in g.episodes)
        prefill0 = self.backend.resumed_prefill_tokens
        self.backend.resume(version)
        self.gate.release()
        ended = asyncio.Event()  # set when this phase ends (what `Hold` waits for)
        for k in range(max(0, (self.share if drain else self.target) - len(self.groups))):
            gid = (step * self.world + self.rank) * self.target + k  # unique over the run's ranks and steps
            env_seed, sample_seed = derive_seed(seed, step, "group", gid), derive_seed(seed, step, "sample", gid)
            held = self.hold and k >= self.share  # beyond the share: the phase completes without them
            eps = [
                self._start(make_task(env_seed), i, gid, env_seed, sample_seed, ended if held else None)
                for i in range(self.n)
            ]
            self.groups.append(Group(gid, eps, step, version))
        live = [e for g in self.groups for e in g.episodes]
        ends: list[float] = []  # seconds into the phase at which each live episode ended (0.0: before it began)
        for e in live:
            if e.done():
                ends.append(0.0)
            else:
                e.add_done_callback(lambda _: ends.append(time.perf_counter() - t0))
        try:
            while not self._ready(version, drain) and (pending := [e for e in live if not e.done()]):
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.gate.hold()  # carried episodes' next requests wait for the next phase
            self.backend.pause()  # and those in the engine are cut
            ended.set()
        for e in live:
            if e.done() and e.exception() is not None:  # a fatal error (stale weights, a bug): the run stops
                raise e.exception()
        trained = [g for g in self.groups if g.done][: self.share]
        self.groups = [g for g in self.groups if g not in trained]
        trajs = self.player.settle([e.result() for g in trained for e in g.episodes])
        end = time.perf_counter()
        lag = [version - v for t in trajs for v in t.sampled_versions()]  # per sampled token, in versions
        return Rollouts(
            trajs,
            self.player.layout(trajs),
            end - t0,
            metrics={
                "rollout/carried": float(carried),
                "rollout/staleness_mean": sum(lag) / len(lag) if lag else float("nan"),
                "rollout/staleness_max": float(max(lag)) if lag else float("nan"),
                "rollout/resumed_prefill_tokens": float(self.backend.resumed_prefill_tokens - prefill0),
                "rollout/tail_s": tail_s(list(ends), len(live), end - t0),
                "rollout/phase_s": end - t0,
            },
        )

    def _start(
        self, task: Task, index: int, gid: int, env_seed: int, sample_seed: int, held: asyncio.Event | None
    ) -> asyncio.Task:
        via = self.gate if held is None else Hold(self.gate, held)
        return self.player.start_episode(task, Episode(index, gid, env_seed, sample_seed), via=via)

    def _ready(self, version: int, drain: bool) -> bool:
        """The phase may end: its share of groups complete, none at the staleness bound unfinished (a draining
        step: every group complete)."""
        if drain:
            return all(g.done for g in self.groups)
        due = [g for g in self.groups if version - g.version >= self.K]
        return sum(g.done for g in self.groups) >= self.share and all(g.done for g in due)
