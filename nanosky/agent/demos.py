"""Demonstrations: the player SFT trains on (`--algo sft`). Each episode is the env's own scripted expert, played
through nanosky's loop: the expert's reply stands where the engine's sample would, so the episode renders, masks
and tokenises exactly as an RL episode of the same env (the chat template's opening and observations at mask 0,
each assistant turn, its end-of-turn token included, at mask 1), multi-turn and tool-using envs alike. The trainer
then sees ordinary `Rollouts`; the `demo` estimator gives every demonstrated token advantage 1 and the `nll` loss
makes the RL step supervised fine-tuning (algos/advantages.py, algos/policy_losses.py).

    player = Demonstrator(AgentRunner.from_config(cfg.rollout, backend, tok))
    out = await player.play(tasks, groups=groups, seeds=seeds)     # the experts' episodes, as Rollouts

Only the training split is demonstrated: an env's expert refuses a held-out task. An SFT run is built with this
player for its training phases and the policy's for its evals (`nanosky/collect.py`'s `players`). It is a `Player`
and not a `Carrier`: nothing is sampled, so nothing is carried (`--rollout.max-staleness` with `--algo sft` is
refused at start-up).
"""

from __future__ import annotations

import asyncio
import time

from nanosky.agent.backends import GenerationResult, Request
from nanosky.agent.player import Episode, Layout, Rollouts
from nanosky.agent.runner import AgentRunner
from nanosky.agent.task import Task
from nanosky.agent.trajectory import Trajectory


class Expert:
    """One episode's backend: its task's expert's next reply, as text (the runner tokenises it and appends the
    end-of-turn token, as for a server that returns no ids; a move the turn's choices do not list then trains
    without their mask). No logprobs: nothing sampled it."""

    def __init__(self, task: Task):
        self.task = task

    async def generate(self, req: Request) -> GenerationResult:
        text = await self.task.expert_action()
        return GenerationResult(text, None, None, "stop", prompt_tokens=0, completion_tokens=0)

    async def aclose(self) -> None:
        pass


class Demonstrator:
    """The `Player` of a run whose estimator trains on demonstrations: every task played by its expert, through
    `runner` (the run's own loop, its windows and token budget)."""

    def __init__(self, runner: AgentRunner):
        self.runner = runner

    async def play(self, tasks: list[Task], *, groups=None, seeds=None, sample_seed=None, temperature=None) -> Rollouts:
        t0 = time.perf_counter()
        episodes = Episode.of_phase(len(tasks), groups, seeds, sample_seed)
        trajs = await asyncio.gather(
            *(self.runner.start_episode(task, ep, via=Expert(task)) for task, ep in zip(tasks, episodes))
        )
        return Rollouts(list(trajs), self.layout(trajs), time.perf_counter() - t0)

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        return {}

    def layout(self, trajs: list[Trajectory]) -> Layout:
        return self.runner.layout(trajs)

    async def aclose(self) -> None:
        pass
