"""Held-out evaluation during training (`eval/*` tags; `Evaluator` decides when), played by the run's player.

evaluator = Evaluator(cfg, rollout, log, rank, player=heldout)   # `collect.players`: the policy's player
acc0 = evaluator.initial(version)                          # step 0 (--eval.no-before-train: NaN)
if evaluator.due(step): acc = evaluator(step, version)     # --eval.every k
acc = evaluator.final(version, acc0)                       # the run's end

With `--reward.judge`, the held-out episodes are judged too (`eval/judge_score`, the samples of an episode as a
group); for an env without a checker (`Env.checker`) that is the headline, and `eval/accuracy` is NaN.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

import envs
from envs.answers import normalize_answer
from nanosky import dist
from nanosky.seeds import derive_seed

if TYPE_CHECKING:
    from nanosky.agent.player import Player
    from nanosky.collect import Rollout
    from nanosky.config import TrainConfig
    from nanosky.logger import RunLogger


MAX_TASKS = 16  # a split with more distinct tasks gets no per-task accuracy


def evaluate(rollout_fn, limit: int, n_samples: int, judge_fn=None) -> tuple[dict[str, float], list]:
    """Mean@n success on the first `limit` test episodes, split across ranks. `rollout_fn(seeds)` rolls out the
    test episodes with those seeds; `judge_fn(trajs)` -> (score sum, scored, masked groups) judges them. Returns
    (metrics, this rank's trajectories). A rate over no episode is NaN."""
    info = dist.get_info()
    idx = list(range(info.rank, limit, info.world))
    trajs = rollout_fn([i for i in idx for _ in range(n_samples)])
    judged = judge_fn(trajs) if judge_fn else (0.0, 0.0, 0.0)
    s = dist.all_reduce_sum(
        [
            float(sum(t.success for t in trajs if t.success is not None)),
            float(sum(t.success is not None for t in trajs)),  # the episodes the env checked
            float(len(trajs)),
            float(sum(t.reward for t in trajs)),
            float(sum(t.n_policy_tokens for t in trajs)),
            float(sum(t.tool_calls for t in trajs)),
            float(sum(t.turns for t in trajs)),
            *judged,
        ]
    )
    nan, n = float("nan"), max(s[2], 1.0)
    m = {
        "eval/accuracy": s[0] / s[1] if s[1] else nan,
        "eval/reward_mean": s[3] / n,
        "eval/response_len": s[4] / n,
        "eval/tool_calls_per_traj": s[5] / n,
        "eval/turns_mean": s[6] / n,
    }
    if judge_fn:
        m |= {"eval/judge_score": s[7] / s[8] if s[8] else nan, "eval/judge_errors": s[9]}
    return m | answer_metrics(trajs), trajs


def answer_metrics(trajs: list) -> dict[str, float]:
    """Skill told from format, and the bar it must clear, over every rank's episodes (absent where no episode says):
    - `eval/accuracy_lenient`: the answer checked however the reply states it (an env's `lenient` verdict), over
      the episodes `eval/accuracy` counts; a gain in the strict score alone is format;
    - `eval/chance`: a random option's expected score, where the split has closed-set answers (an env's `options`;
      an open answer counts 0);
    - `eval/constant_best`: the score of the best single fixed answer (the most common gold answer's share);
    - `eval/<task>/accuracy` and `eval/<task>/accuracy_lenient` for each task of a split that mixes them (an env's
      `task`: reasoning_gym's), so a run can show what it learned and what it kept; up to `MAX_TASKS` (alfworld's
      `task` is each episode's instruction: no tags for those)."""
    mine = [
        (t.success, t.info.get("lenient"), len(t.info.get("options") or ()), t.info.get("answer"), t.info.get("task"))
        for t in trajs
    ]
    rows = [r for part in dist.all_gather_objects(mine) for r in part]
    checked, m = [r for r in rows if r[0] is not None], {}
    if checked and any(r[1] is not None for r in checked):  # an episode the env could not read is not lenient
        m["eval/accuracy_lenient"] = sum(bool(r[1]) for r in checked) / len(checked)
    tasks = sorted({r[4] for r in checked if isinstance(r[4], str)})
    for task in tasks if 1 < len(tasks) <= MAX_TASKS else ():  # kinds, not one tag per episode's text
        mine = [r for r in checked if r[4] == task]
        m[f"eval/{task}/accuracy"] = sum(bool(r[0]) for r in mine) / len(mine)
        if any(r[1] is not None for r in mine):
            m[f"eval/{task}/accuracy_lenient"] = sum(bool(r[1]) for r in mine) / len(mine)
    golds = [(k, normalize_answer(str(a))) for _, _, k, a, _ in rows if a is not None]
    if golds:
        m["eval/constant_best"] = max(Counter(g for _, g in golds).values()) / len(golds)
        if any(k for k, _ in golds):
            m["eval/chance"] = sum(1 / k for k, _ in golds if k) / len(golds)
    return m


def _score(a: float | None) -> str:
    """A score as the closing lines print it: "not measured" where it was not (NaN, or None in `by_task`)."""
    return "not measured" if a is None or math.isnan(a) else f"{a:.3f}"


class Evaluator:
    """The held-out eval of a training run: `limit` test episodes × `n_samples`, split across ranks, played by
    `player` (the policy's; None: the rollout's own)."""

    def __init__(self, cfg: TrainConfig, rollout: Rollout, log: RunLogger, rank: int, player: Player | None = None):
        self.cfg, self.rollout, self.log, self.player = cfg, rollout, log, player
        # the headline: accuracy where the env checks its episodes, else the judge's score
        self.headline = "accuracy" if envs.has_checker(cfg.env) else "judge_score"
        # Same sampling seeds at every eval (common random numbers): accuracy changes come from the weights.
        self.sample_seed = derive_seed(cfg.seed, "eval", rank)
        self.last: dict[str, float] = {}  # the latest eval's metrics
        self.first: dict[str, float] = {}  # step 0's (empty: skipped, or a resumed run)

    @property
    def at_start(self) -> bool:
        """Whether the run evaluates at step 0: unless `--eval.no-before-train`, or a dry run without evals."""
        return self.cfg.eval.before_train and bool(self.cfg.eval.every or not self.cfg.dry_run)

    def initial(self, version: int) -> float:
        """The held-out headline before training (step 0); NaN where the run skips it (not measured, not 0)."""
        if not self.at_start:
            return float("nan")
        acc = self(0, version)
        self.first = self.last
        return acc

    def final(self, version: int, initial: float) -> float:
        """The headline at the end of the run (the last step's eval); a dry run or a run of no steps keeps `initial`."""
        return self(self.cfg.steps, version) if self.cfg.steps and not self.cfg.dry_run else initial

    def summary(self, initial: float, final: float) -> str:
        """The run's closing figure: the headline before and after, on which split, with the bar it must clear
        (chance, the best constant answer) and the format-free score, where the env gives them."""
        m, name = self.last, self.headline.replace("_", " ")
        bars = [
            f"{k} {m['eval/' + k]:.3f}" for k in ("chance", "constant_best", "accuracy_lenient") if "eval/" + k in m
        ]
        start, end = _score(initial), _score(final)
        return f"eval {name} {start} -> {end} ({self.cfg.eval.split}" + "".join(", " + b for b in bars) + ")"

    def summary_fields(self, initial: float, final: float) -> dict:
        """summary.json's eval fields: the headline's name, its value before and after (None: not measured, as with
        `--eval.no-before-train` or a dry run without evals) and `by_task`."""
        return {
            "eval_metric": self.headline,  # what the two below hold: accuracy, or judge_score (no checker)
            "eval_accuracy_initial": None if math.isnan(initial) else initial,
            "eval_accuracy_final": None if math.isnan(final) else final,
            "eval_by_task": self.by_task(),
        }

    def by_task(self) -> dict[str, dict[str, float | None]]:
        """Each task's accuracy at step 0 and at the end, where the split mixes tasks (`eval/<task>/accuracy`): the
        headline averages them all, tasks the run does not train on included (reasoning_gym's weight-0 tasks), so
        a skill's gain reads here. None: not measured (step 0 skipped, or before a resume)."""
        tasks = [
            k.split("/")[1]
            for k in self.last
            if k.count("/") == 2 and k.startswith("eval/") and k.endswith("/accuracy")
        ]
        return {
            t: {"initial": self.first.get(f"eval/{t}/accuracy"), "final": self.last[f"eval/{t}/accuracy"]}
            for t in tasks
        }

    def by_task_line(self) -> str:
        """The closing line of `by_task`, or "" where the split has one task."""
        parts = [f"{t} {_score(v['initial'])} -> {_score(v['final'])}" for t, v in self.by_task().items()]
        return f"\n  by task      {', '.join(parts)}" if parts else ""

    def due(self, step: int) -> bool:
        """`--eval.every k`: every k steps; step 0 and the last step are evaluated by the run's start and close."""
        every = self.cfg.eval.every
        return bool(every) and step % every == 0 and step != self.cfg.steps

    def __call__(
        self, step: int, version: int, *, prefix: str = "eval/", label: str = "eval", rollouts: bool = True
    ) -> float:
        """Evaluate, log the metrics under `prefix` (`eval/*`) and, with `rollouts`, the eval episodes at `step`;
        returns the headline: the accuracy (mean@n success), or the judge's mean score for an env without a
        checker. `label` names the eval in its line (a teacher's: `nanosky/distill.py`)."""
        cfg = self.cfg

        def rollout_fn(seeds: list[int]) -> list:
            return self.rollout.run(
                cfg.env,
                cfg.env_args(),
                cfg.eval.split,
                seeds,
                version=version,
                sample_seed=self.sample_seed,
                temperature=cfg.eval.temperature,
                player=self.player,
            ).trajs

        def judge_fn(trajs: list) -> tuple[float, float, float]:
            return self.rollout.judging.held_out(trajs, self.rollout.loop.run)

        m, trajs = evaluate(
            rollout_fn, cfg.eval.limit, cfg.eval.n_samples, judge_fn if self.rollout.judging is not None else None
        )
        m = {prefix + k.removeprefix("eval/"): v for k, v in m.items()}
        self.last = m
        self.log.scalars(step, m)
        if rollouts:
            self.log.rollouts(step, trajs, self.rollout.tok, cfg.log.eval_samples, tag="eval")
        self.log.print(f"step {step}: {label} {self.headline.replace('_', ' ')} {m[prefix + self.headline]:.3f}")
        return m[prefix + self.headline]
