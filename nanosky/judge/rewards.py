"""The judge in training: a step's groups judged (each rank its share, the verdicts gathered so every rank applies
the same), the scores combined with the env's rewards, masked groups given no gradient, and the judge/* metrics.

    judging = Judging(cfg.reward, backend)           # once, by the rollout phase (backend: the rank's, for `self`)
    m = judging.step(trajs, loop.run)                # trajs: the step's gathered trajectories, changed in place

reward = env reward + w · score (`--reward.judge-weight`), or the score alone (`--reward.judge-only`). Each
trajectory keeps `info["judge"]` = {score, explanation} (or {error}) for rollouts.jsonl and the viewer; a
self-judged one also the weight version that judged it (`--reward.judge-url self`: the rank's own engine, through
`backend`, at temperature 0 under a strict JSON schema; `Judge.engine` in nanosky/judge/__init__.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from nanosky import dist
from nanosky.config.reward import RewardConfig
from nanosky.judge import Judge, Verdict, judge_groups, rubric


def attempt_text(t) -> tuple[list[dict], str]:
    """(the task: the messages before the first assistant turn, the attempt: the rest as text) of a trajectory."""
    msgs = t.messages
    k = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
    body = "\n\n".join(
        f"[{m.get('role')}{' ' + m['name'] if m.get('name') else ''}]\n{m.get('content') or ''}" for m in msgs[k:]
    )
    return msgs[:k], body


def _spearman(a: list[float], b: list[float]) -> float | None:
    """Rank correlation of two lists (ties averaged); None where either is constant."""

    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(ra, rb)) / math.sqrt(va * vb)


class Judging:
    """The run's judge, built once by whoever owns the run's rollouts (`collect.Rollout`, `evals.judged`): the judge
    (a server, or `self`: the rank's engine through `backend`) and the rubric's text. A server found to refuse
    structured outputs is asked plainly from then on, since the judge lives as long as the run."""

    def __init__(self, cfg: RewardConfig, backend=None):
        self.judge = Judge.from_config(cfg, backend)
        self.cfg, self.rubric = cfg, rubric(cfg.rubric)

    def verdicts(self, groups: list[list], run: Callable) -> list[Verdict]:
        """Each group's verdict (a group: the attempts at one task), judged from this rank. A self-judge's verdicts
        carry the weight version that judged them."""
        asks = []
        for members in groups:
            texts = [attempt_text(t) for t in members]
            asks.append((texts[0][0], [a for _, a in texts]))
        return run(judge_groups(self.judge, asks, self.cfg.judge, self.rubric, 2.5 * self.cfg.judge_timeout_s))

    def step(self, trajs: list, run: Callable) -> dict[str, float]:
        """Judge the step's groups and fold the scores into `trajs` (in place, the same on every rank). `run(coro)`
        runs a coroutine on the rank's event loop. Returns the judge/* metrics (NaN where nothing was scored)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        info = dist.get_info()
        groups: dict[int, list] = {}
        for t in trajs:
            groups.setdefault(t.group, []).append(t)
        keys = sorted(groups)
        mine = keys[info.rank :: info.world]  # each rank judges its share of the groups
        got: dict[int, Verdict] = {}
        for part in dist.all_gather_objects(list(zip(mine, self.verdicts([groups[g] for g in mine], run)))):
            got.update(part)
        scores, agree, errors = [], [], 0
        for g in keys:
            v, members = got[g], groups[g]
            env = [t.reward for t in members]
            if v.scores is None:
                errors += 1
                for t in members:  # masked: no token of it is trained
                    t.info["judge"] = {"error": v.error}
                    t.mask_out()
                continue
            for i, t in enumerate(members):
                s = v.scores[i]
                t.info["judge"] = _record(v, i)
                t.reward = s if cfg.judge_only else t.reward + cfg.judge_weight * s
                scores.append(s)
            if (rho := _spearman([v.scores[i] for i in range(len(members))], env)) is not None:
                agree.append(rho)
        lat = [v.latency_s for v in got.values()]
        nan = float("nan")
        return {
            "judge/score_mean": sum(scores) / len(scores) if scores else nan,
            "judge/agreement_with_env": sum(agree) / len(agree) if agree else nan,
            "judge/errors": float(errors),
            "judge/latency_s": sum(lat) / len(lat) if lat else nan,
            "timing/judge_s": time.perf_counter() - t0,
        }

    def held_out(self, trajs: list, run: Callable) -> tuple[float, float, float]:
        """Judge held-out episodes on this rank, the samples of one episode as a group (their `env_seed`): each keeps
        its verdict in `info["judge"]`; rewards are left as the env gave them. Returns (score sum, scored, masked
        groups) for the caller to sum over ranks."""
        by_seed: dict[int, list] = {}
        for t in trajs:
            by_seed.setdefault(t.env_seed, []).append(t)
        groups = list(by_seed.values())
        total = scored = masked = 0.0
        for members, v in zip(groups, self.verdicts(groups, run)):
            masked += v.scores is None
            for i, t in enumerate(members):
                t.info["judge"] = _record(v, i)
                if v.scores is not None:
                    total, scored = total + v.scores[i], scored + 1
        return total, scored, masked


def _record(v: Verdict, i: int) -> dict:
    """What a trajectory keeps of its group's verdict (rollouts.jsonl, the viewer)."""
    if v.scores is None:
        return {"error": v.error}
    out = {"score": v.scores[i], "explanation": v.explanations.get(i, "")}
    return out if v.version is None else out | {"weight_version": v.version}
