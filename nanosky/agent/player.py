"""One interface for whatever plays a step's episodes: nanosky's own loop (`AgentRunner`) or an external agent
through the endpoint (`nanosky.endpoint.Harness`). The phase that collects a step (`nanosky/collect.py`) and the
eval call `play` and never ask which player ran; the result says what training rows its trajectories make, so the
trainer reads the layout instead of inspecting the data (as SkyRL's `GeneratorInterface.generate`).

    out = await player.play(tasks, groups=groups, seeds=seeds, sample_seed=s, temperature=None)
    out.trajs       # one Trajectory per task, in order
    out.layout      # "concat": one row per episode; "stepwise": one row per `Step` of each episode
    player.metrics(trajs)   # the player's own scalars over a (gathered) batch, e.g. agent/* for external agents
    player.start_episode(task, Episode(i, group=g, env_seed=e, sample_seed=s), via=gate)   # a Carrier's (partial.py)

`Carrier` adds what partial rollouts need (an episode not bound to a phase); a player that cannot carry (SFT's
`Demonstrator`) implements `Player` alone.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from nanosky.agent.task import Task
from nanosky.agent.trajectory import Trajectory

Layout = Literal["concat", "stepwise"]


@dataclass(frozen=True)
class Episode:
    """One episode's identity in its phase: `index` (its place: the sampling seeds derive from it), the prompt
    `group` it belongs to, the `env_seed` its task was made from, and the phase's `sample_seed` (None: unseeded)."""

    index: int
    group: int
    env_seed: int = 0
    sample_seed: int | None = None

    @staticmethod
    def of_phase(n: int, groups: list[int] | None, seeds: list[int] | None, sample_seed: int | None) -> list[Episode]:
        """A phase's `n` episodes, as `Player.play`'s arguments give them (no groups: each episode its own)."""
        return [Episode(i, groups[i] if groups else i, seeds[i] if seeds else 0, sample_seed) for i in range(n)]

    def trajectory(self, task: Task, **fields) -> Trajectory:
        """The episode's empty trajectory (its task's id, else its index)."""
        return Trajectory(task_id=task.task_id or str(self.index), group=self.group, env_seed=self.env_seed, **fields)


@dataclass
class Rollouts:
    """A phase's episodes, and how they train: `concat` (each episode one row, observations masked inside it) or
    `stepwise` (each `Step` of an episode its own row, with its episode's advantage)."""

    trajs: list[Trajectory]
    layout: Layout = "concat"
    wall_s: float = 0.0  # how long the phase took
    # the phase's own scalars (rollout/*: throughput, the engine's share, the tail), set by the phase that ran it
    # (nanosky/collect.py) on this rank's part; a merge holds none (they are per rank)
    metrics: dict[str, float] = field(default_factory=dict)
    scored: bool = False  # the env scored these episodes by groups (a TRL reward function: `env/reward_errors`)

    @staticmethod
    def merge(parts: list[Rollouts]) -> Rollouts:
        """Several ranks' or rounds' rollouts as one batch: step-wise when any part is (a concatenated episode of an
        external agent is also its one step, so step-wise rows hold every episode)."""
        layout: Layout = "stepwise" if any(p.layout == "stepwise" for p in parts) else "concat"
        return Rollouts([t for p in parts for t in p.trajs], layout, max((p.wall_s for p in parts), default=0.0))


def tail_s(ends: list[float], n: int, wall: float) -> float:
    """`rollout/tail_s`: how long a phase of `n` episodes ran with fewer than a quarter of them still running, from
    the episode end (seconds into the phase; `ends` holds those that ended within it) that left fewer than n/4
    running to the phase's end at `wall`. 0.0 when that never happened (the phase ended first, cutting the rest: a
    partial-rollout phase); NaN over no episode (nothing to measure)."""
    if n == 0:
        return math.nan
    k = n * 3 // 4  # after the (k+1)-th end, n - k - 1 < n / 4 run
    ends = sorted(e for e in ends if e <= wall)
    return max(0.0, wall - ends[k]) if len(ends) > k else 0.0


@runtime_checkable
class Player(Protocol):
    async def play(
        self,
        tasks: list[Task],
        *,
        groups: list[int] | None = None,
        seeds: list[int] | None = None,
        sample_seed: int | None = None,
        temperature: float | None = None,
    ) -> Rollouts:
        """One episode per task, all in flight at once (within the player's limits). `groups` / `seeds` are recorded
        on the trajectories; `sample_seed` fixes every call's sampling seed; `temperature` overrides the player's
        (the eval's)."""
        ...

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        """The player's own step scalars over a batch of its episodes."""
        ...

    def layout(self, trajs: list[Trajectory]) -> Layout:
        """What training rows these episodes of this player make (`Rollouts.layout`), decided here only: `play`
        returns it, and so does a partial-rollout phase over the player's carried episodes."""
        ...

    async def aclose(self) -> None:
        """Release what the player holds on the event loop (the endpoint's server)."""
        ...


@runtime_checkable
class Carrier(Player, Protocol):
    """A player whose episodes a partial rollout can carry from one phase into the next (`nanosky/partial.py`)."""

    def start_episode(self, task: Task, episode: Episode, *, via) -> asyncio.Task:
        """One episode as a task on the running loop, not bound to a phase (a partial rollout carries it from one
        phase into the next: `nanosky/partial.py`), its calls through `via` (the carry's gate). Awaiting it gives
        the trajectory; an error that must stop the run is raised from it."""
        ...

    def settle(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """Carried episodes that ended, whole groups, as the trainer takes them (an external agent's failed episodes
        masked, the engine's fatal error raised); nanosky's loop raises from the episode itself."""
        ...
