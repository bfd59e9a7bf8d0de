"""A step's rollout phase: this rank's episodes of an env, played by the run's player on the rank's one event loop,
then gathered across ranks. The player is nanosky's own agent loop, or the user's agent through the endpoint
(`--rollout.agent` / `--rollout.agent-cmd`); this phase and the trainer see only what it returns (`Rollouts`).

    train, heldout = players(cfg, EngineBackend(engine, tok), tok)    # the run's players, chosen once (SFT: two)
    rollout = Rollout(cfg.rollout, backend, pool, tok, player=train)
    out = rollout.run("math", {}, "train", seeds, version=v, groups=groups, sample_seed=s)  # this rank's Rollouts
    out = rollout.run("math", {}, "test", seeds, version=v, player=heldout)                   # an eval's
    batch, metrics = collect(cfg, rollout, step, version=v)   # the step's global batch (+ DAPO's rounds)
    rollout.close(heldout)                                  # the end of the run: the players, then the loop

Each episode is a `PooledEnvTask` in this rank's env pool (a hung or crashing env costs its episode only); the
player runs them all at once, continuously, against the colocated engine (token-in/token-out). A phase's
`Rollouts.metrics` hold its rollout throughput, the engine's busy share and the tail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import algos
import envs
from nanosky import dist
from nanosky.agent import AgentRunner, EngineBackend, PooledEnvTask, Trajectory
from nanosky.agent.demos import Demonstrator
from nanosky.agent.player import Player, Rollouts, tail_s
from nanosky.config import DebugConfig, RolloutConfig
from nanosky.config.reward import RewardConfig
from nanosky.env_rewards import env_metrics, score_groups
from nanosky.judge.rewards import Judging
from nanosky.partial import Carry
from nanosky.rollout.loop import RankLoop
from nanosky.seeds import derive_seed
from nanosky.train.step_credit import action_spans

if TYPE_CHECKING:
    from nanosky.config import TrainConfig


def make_player(cfg: RolloutConfig, backend: EngineBackend, tok, log_dir: str | None, rank: int) -> Player:
    """The policy's player, built from its config: the user's agent when one is given, else nanosky's loop with
    every episode live at once (the engine batches them)."""
    if cfg.agent or cfg.agent_cmd:
        from nanosky.endpoint.harness import Harness

        return Harness.from_config(cfg, backend, tok, log_dir=log_dir, rank=rank)
    return AgentRunner.from_config(cfg, backend, tok)


def players(cfg: TrainConfig, backend: EngineBackend, tok) -> tuple[Player, Player]:
    """The run's players, chosen once: (its training phases', its held-out evals'). RL samples the policy in both;
    a run that trains on demonstrations (`--algo sft`) plays its training episodes by the env's expert
    (`Demonstrator`, through nanosky's loop) and evaluates the policy."""
    policy = make_player(cfg.rollout, backend, tok, cfg.run_dir, dist.get_info().rank)
    if cfg.demonstrations:
        return Demonstrator(AgentRunner.from_config(cfg.rollout, backend, tok)), policy
    return policy, policy


class Rollout:
    def __init__(
        self,
        cfg: RolloutConfig,
        backend: EngineBackend,
        pool,
        tok,
        *,
        player: Player | None = None,
        log_dir: str | None = None,
        reward: RewardConfig | None = None,
        debug: DebugConfig | None = None,
    ):
        """`player`: what plays this rollout's episodes (None: the policy's, `make_player`; a training run's come
        from `players`)."""
        self.cfg, self.backend, self.pool, self.tok = cfg, backend, pool, tok
        # --reward.judge: the run's one judge (a server, or this rank's engine), built here, used by every phase
        self.judging = Judging(reward, backend) if reward is not None and reward.judge != "off" else None
        self.player = player or make_player(cfg, backend, tok, log_dir, dist.get_info().rank)
        # --rollout.max-staleness > 0: the episodes carried from step to step (K = 0: none, the synchronous step),
        # played by the run's player (an external agent's carried episodes share its endpoint)
        info, hold = dist.get_info(), debug is not None and debug.hold_extra_groups  # testing only: partial.Hold
        self.carry = Carry(cfg, backend, info.world, info.rank, player=self.player, hold=hold) if cfg.partial else None
        self.loop = RankLoop()  # every phase of the run, and the endpoint, on this one loop

    def run(
        self,
        env: str,
        env_kwargs: dict,
        split: str,
        seeds: list[int],
        *,
        version: int,
        groups: list[int] | None = None,
        sample_seed: int | None = None,
        temperature: float | None = None,
        player: Player | None = None,
    ) -> Rollouts:
        """One episode per seed (env `env`, `split`), rolled out to the end with weights `version`, by `player`
        (None: this rollout's own; an SFT run's evals pass the policy's)."""
        self.backend.version = version
        start = self._counters()
        seeds = [self.task_seed(split, s) for s in seeds]
        tasks = [PooledEnvTask(self.pool, env, split, seed=s, **env_kwargs) for s in seeds]
        play = (player or self.player).play(
            tasks, groups=groups, seeds=seeds, sample_seed=sample_seed, temperature=temperature
        )
        out = self.loop.run(play, threads=len(tasks))
        wall = max(out.wall_s, 1e-9)
        ends = [t.latency_s for t in out.trajs]  # every episode starts with the phase
        by = "group" if groups is not None else "env_seed"
        out.metrics, out.scored = self._finish(env, env_kwargs, split, out.trajs, by=by, wall=wall, start=start)
        out.metrics["rollout/tail_s"] = tail_s(ends, len(ends), wall)
        return out

    def task_seed(self, split: str, seed: int) -> int:
        """The env seed an episode is made from: `--rollout.train-tasks N` folds a training seed onto 0..N-1."""
        n = self.cfg.train_tasks
        return seed % n if split == "train" and n else seed

    def phase(self, env: str, env_kwargs: dict, step: int, version: int, seed: int, drain: bool) -> Rollouts:
        """A partial-rollout step's phase (`nanosky/partial.py`): the carried episodes resumed, new groups started,
        this rank's share of complete groups returned, the rest paused."""
        start = self._counters()

        def make(env_seed: int) -> PooledEnvTask:
            return PooledEnvTask(self.pool, env, "train", seed=self.task_seed("train", env_seed), **env_kwargs)

        out = self.loop.run(self.carry.phase(make, step, version, seed, drain), threads=self.carry.most_episodes)
        finish, out.scored = self._finish(
            env, env_kwargs, "train", out.trajs, by="group", wall=max(out.wall_s, 1e-9), start=start
        )
        out.metrics |= finish
        return out

    @classmethod
    def from_config(cls, cfg: TrainConfig, backend: EngineBackend, pool, tok, player: Player) -> Rollout:
        """The run's rollout phase, as its flags say (the judge, the testing-only hold), played by `player`."""
        return cls(cfg.rollout, backend, pool, tok, player=player, reward=cfg.reward, debug=cfg.debug)

    def _counters(self) -> tuple[float, int, int]:
        """The engine backend's running totals: busy seconds, engine steps, requests summed over those steps."""
        return self.backend.busy_s, self.backend.engine_steps, self.backend.batched

    def _finish(
        self, env: str, env_kwargs: dict, split: str, trajs: list[Trajectory], *, by: str, wall: float, start
    ) -> tuple[dict[str, float], bool]:
        """A phase's end, either kind: this rank's groups scored before the gather where the env scores by groups
        (a user's function runs once per group), and the engine's share of the phase since `start` (`_counters`).
        Returns those metrics and whether the env scored by groups."""
        scorer = envs.group_scorer(env, split, **env_kwargs)
        if scorer is not None:
            score_groups(scorer, trajs, by=by)
        busy0, steps0, batch0 = start
        steps = self.backend.engine_steps - steps0
        return {
            "rollout/tokens_per_s": sum(t.completion_tokens for t in trajs) / wall,
            "rollout/engine_busy_frac": (self.backend.busy_s - busy0) / wall,
            "rollout/engine_batch_mean": (self.backend.batched - batch0) / steps if steps else float("nan"),
        }, scorer is not None

    def on_stop(self) -> str:
        """What a graceful stop now discards (partial rollouts: the episodes in flight), as a line; "" if nothing."""
        n = self.carry.in_flight() if self.carry is not None else 0
        return (
            f"\n  {n} episodes in flight (--rollout.max-staleness) were discarded: the resumed run starts new groups"
            if n
            else ""
        )

    def close(self, *others: Player) -> None:
        """The players' resources (the endpoint): this rollout's, and `others` it played for (an SFT run's
        evaluating player), then the loop. Safe to call twice."""
        if self.loop.loop.is_closed():
            return
        try:
            for p in dict.fromkeys([self.player, *others]):  # each once, in order
                self.loop.run(p.aclose())
        finally:
            self.loop.close()


def gather(local: Rollouts) -> Rollouts:
    """Every rank's rollouts in rank order, one batch (identical on every rank), with the layout they agree on."""
    return Rollouts.merge(dist.all_gather_objects(local))


def collect(
    cfg: TrainConfig, rollout: Rollout, step: int, *, version: int, drain: bool = False
) -> tuple[Rollouts, dict]:
    """Generate this step's global batch (every rank's rollouts, gathered). With DAPO's dynamic sampling, more
    rounds are generated until `filter_groups` keeps a full batch or `max_gen_rounds` is reached. With partial
    rollouts, this rank's share of complete groups; `drain` (a checkpoint follows the step, `Checkpointer.drains`):
    every started group finishes."""
    a, P, n = cfg.algorithm, cfg.rollout.prompts_per_step, cfg.rollout.group_size
    kept: list[Trajectory] = []
    dropped: list[Trajectory] = []
    parts: list[Rollouts] = []  # each round's, for the layout the players reported
    local = Rollouts([])  # this rank's last round (its phase metrics: per rank, not gathered)
    judged: list[dict[str, float]] = []  # each round's judge/* metrics (--reward.judge)
    rounds = a.max_gen_rounds if a.dynamic_sampling else 1
    for rnd in range(rounds):
        local = _round(cfg, rollout, step, rnd, version=version, drain=drain)
        out = gather(local)
        new = out.trajs
        parts.append(out)
        if rollout.judging is not None:  # the judge's scores into the rewards, before any filter reads them
            judged.append(rollout.judging.step(new, rollout.loop.run))
        if a.overlong_cache_len:
            overlong_penalty(new, cfg.rollout.max_new_tokens, a.overlong_cache_len)
        if not a.dynamic_sampling:
            kept = new
            break
        k, d = filter_groups(new)
        kept, dropped = kept + k, dropped + d
        if len(kept) >= P * n:
            rounds = rnd + 1
            break
    # Fixed batch size: truncate to P groups, or top up with dropped groups (zero advantage: no gradient signal).
    batch = (kept + dropped)[: P * n]
    metrics = {"train/dropped_groups": len(dropped) / n, "train/gen_rounds": rounds} | local.metrics
    metrics |= rollout.player.metrics(batch) | env_metrics(cfg.env, batch, local.scored)
    if judged:  # errors and judging time add up over DAPO's rounds; the rest is the last round's
        metrics |= judged[-1] | {k: sum(m[k] for m in judged) for k in ("judge/errors", "timing/judge_s")}
    return Rollouts(batch, Rollouts.merge(parts).layout), metrics


def _round(cfg: TrainConfig, rollout: Rollout, step: int, rnd: int, *, version: int, drain: bool) -> Rollouts:
    """This rank's episodes of one round: a partial-rollout phase (its own groups and seeds; no DAPO rounds, refused
    at start-up), or one group of `group_size` episodes a prompt of this rank's share, seeded by (step, round)."""
    if rollout.carry is not None:
        return rollout.phase(cfg.env, cfg.env_args(), step, version, cfg.seed, drain)
    info, P, n = dist.get_info(), cfg.rollout.prompts_per_step, cfg.rollout.group_size
    js = list(range(info.rank, P, info.world))
    seeds = [derive_seed(cfg.seed, step, rnd, j) for j in js for _ in range(n)]
    groups = [rnd * P + j for j in js for _ in range(n)]
    sample_seed = derive_seed(cfg.seed, step, rnd, "sample", info.rank)
    return rollout.run(cfg.env, cfg.env_args(), "train", seeds, version=version, groups=groups, sample_seed=sample_seed)


def overlong_penalty(trajs: list[Trajectory], max_len: int, cache_len: int) -> None:
    """DAPO's soft overlong punishment (`algos.overlong_penalty`), added to each reward, on the policy's own tokens
    (not tool outputs): a turn that nears `max_len` (rollout.max_new_tokens, a per-turn cap) costs its episode; the
    longest turn counts."""
    longest = [max((b - a for a, b in action_spans(t.loss_mask)), default=0) for t in trajs]
    pen = algos.overlong_penalty(torch.tensor(longest), max_len, cache_len)
    for t, p in zip(trajs, pen.tolist()):
        t.reward += p


def filter_groups(trajs: list[Trajectory]) -> tuple[list[Trajectory], list[Trajectory]]:
    """DAPO's dynamic sampling (`algos.group_has_signal`): (kept, dropped), whole groups each, in their order."""
    if not trajs:
        return [], []
    keep = algos.group_has_signal([t.reward for t in trajs], [t.group for t in trajs]).tolist()  # [N]
    by_group: dict[int, tuple[bool, list[Trajectory]]] = {}
    for t, k in zip(trajs, keep):
        by_group.setdefault(t.group, (k, []))[1].append(t)
    kept, dropped = [], []
    for k, g in by_group.values():
        (kept if k else dropped).extend(g)
    return kept, dropped
