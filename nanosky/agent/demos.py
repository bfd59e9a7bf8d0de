"""Demonstrations: the player SFT trains on (`--algo sft`). Each episode is the env's own scripted expert, played
through nanosky's loop: the expert's reply stands where the engine's sample would, so the episode renders, masks
and tokenises exactly as an RL episode of the same env (the chat template's opening and observations at mask 0,
each assistant turn, its end-of-turn token included, at mask 1), multi-turn and tool-using envs alike. The trainer
then sees ordinary `Rollouts`; the `demo` estimator gives every demonstrated token advantage 1 and the `nll` loss
makes the RL step supervised fine-tuning (algos/advantages.py, algos/policy_losses.py).

    player = Demonstrator(AgentRunner.from_config(cfg.rollout, backend, tok))
    out = await player.play(tasks, groups=groups, seeds=seeds)     # the experts' episodes, as Rollouts

Only the training split is demonstrated: an env's expert refuses a held-out task, and the run's evals sample the
policy through the engine as in RL (`nanosky/collect.py` picks the player by split).
"""

from __future__ import annotations

import asyncio
import time

from nanosky.agent.backends import GenerationResult, Request
from nanosky.agent.player import Layout, Rollouts
from nanosky.agent.runner import AgentRunner
from nanosky.agent.task import Task
from nanosky.agent.trajectory import Trajectory


class Expert:
    """One episode's backend: its task's expert's next reply, as text (the runner tokenises it and appends the
    end-of-turn token, as for a server that returns no ids). No logprobs: nothing sampled it. A move the turn's
    choices do not list (webshop_lite's expert may search a product's title; the policy is offered only the
    instruction's search) is trained without the choices' mask, as an unconstrained turn."""

    def __init__(self, task: Task):
        self.task = task

    async def generate(self, req: Request) -> GenerationResult:
        text = await self.task.expert_action()
        off_list = req.choices is not None and text not in req.choices
        return GenerationResult(text, None, None, "stop", prompt_tokens=0, completion_tokens=0, unconstrained=off_list)

    async def aclose(self) -> None:
        pass


class Demonstrator:
    """The `Player` of a run whose estimator trains on demonstrations (`demos=True`): every task played by its
    expert, through `runner` (the run's own loop, its windows and token budget)."""

    def __init__(self, runner: AgentRunner):
        self.runner = runner

    async def play(self, tasks: list[Task], *, groups=None, seeds=None, sample_seed=None, temperature=None) -> Rollouts:
        t0 = time.perf_counter()
        episodes = [
            self.runner.start_episode(
                task,
                index=i,
                group=groups[i] if groups else i,
                env_seed=seeds[i] if seeds else 0,
                sample_seed=sample_seed,
                via=Expert(task),
            )
            for i, task in enumerate(tasks)
        ]
        trajs = list(await asyncio.gather(*episodes))
        return Rollouts(trajs, self.layout(trajs), time.perf_counter() - t0)

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        return {}

    def layout(self, trajs: list[Trajectory]) -> Layout:
        return self.runner.layout(trajs)

    def start_episode(self, task: Task, *, index: int, group: int, env_seed: int, sample_seed, via) -> asyncio.Task:
        """Demonstrations are never carried (`--rollout.max-staleness` with `--algo sft` is refused at start-up)."""
        raise NotImplementedError("demonstrations are not partial rollouts: nothing is sampled to carry")

    def settle(self, trajs: list[Trajectory]) -> list[Trajectory]:
        return trajs

    async def aclose(self) -> None:
        pass
