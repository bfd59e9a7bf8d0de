"""A judge's rewards in a real 2-rank run (`--reward.judge`): tool_use with a scripted judge's score weighted into
the env's reward, its metrics and explanations logged, and a resume from step 1 whose step 2 equals the straight
run's (the judge at temperature 0 is part of the run's determinism)."""

import json
import math
import os
import re
import shutil

import pytest
import torch
from spawn import scalars, torchrun

import algos
from evals.scripted import ScriptedServer


def judge(messages) -> str:
    """A deterministic judge: an attempt that ends in an <answer> scores by its length (a stand-in for quality)."""
    body = messages[-1]["content"]
    attempts = re.findall(r"<attempt id=(\d+)>\n(.*?)\n</attempt>", body, re.S)
    return json.dumps(
        {
            "scores": [
                {
                    "trajectory_id": int(i),
                    "explanation": f"{len(a)} chars",
                    "score": min(1.0, len(a) / 400) * ("<answer>" in a),
                }
                for i, a in attempts
            ]
        }
    )


def _straight_then_resumed(tmp_path, args: list[str]):
    """A straight 2-step run, and one resumed from its step-1 checkpoint: (straight's dir, its result, the two runs'
    scalars)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r = torchrun([*args, "--log.run-dir", str(straight)])
    assert r.returncode == 0, r.stderr[-3000:]
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(straight / "checkpoints" / "step_000001", resumed / "checkpoints" / "step_000001")
    r2 = torchrun([*args, "--log.run-dir", str(resumed), "--resume", str(resumed / "checkpoints" / "step_000001")])
    assert r2.returncode == 0, r2.stderr[-3000:]
    return straight, r, scalars(str(straight)), scalars(str(resumed))


@pytest.mark.slow
def test_tool_use_trains_with_a_judge_weighted_in_and_resumes_exactly(tmp_path):
    with ScriptedServer(judge) as url:
        args = [
            "--preset",
            "tool_use",
            "--steps",
            "2",
            "--rollout.prompts-per-step",
            "2",
            "--rollout.group-size",
            "2",
            "--eval.every",
            "0",
            "--eval.limit",
            "2",
            "--envpool.workers",
            "1",
            "--engine.kv-cache-gib",
            "0.25",
            "--log.ckpt-every",
            "1",
            "--reward.judge",
            "group",
            "--reward.judge-url",
            url,
            "--reward.judge-weight",
            "0.5",
        ]
        straight, _, a, b = _straight_then_resumed(tmp_path, args)
    assert [s for s, _ in a["judge/errors"]] == [1, 2] and all(v == 0 for _, v in a["judge/errors"])
    assert all(0 <= v <= 1 for _, v in a["judge/score_mean"]) and all(v > 0 for _, v in a["judge/step_share"])
    for tag in ("train/pg_loss", "train/reward_mean", "judge/score_mean"):
        assert b[tag][-1] == a[tag][-1], (tag, a[tag], b[tag])
    recs = [json.loads(x) for x in open(os.path.join(straight, "rollouts.jsonl")) if '"split": "train"' in x]
    assert recs and all(r["info"]["judge"]["explanation"].endswith("chars") for r in recs)
    for r in recs:  # env reward + 0.5 x the judge's score
        assert 0 <= r["reward"] - 0.5 * r["info"]["judge"]["score"] <= 1.0 + 1e-9


@pytest.mark.slow
def test_the_env_without_a_checker_trains_on_its_own_engines_judgement_and_resumes_exactly(tmp_path):
    """reply (no checker) judged alone by the run's own engine (`self`, pointwise: the tiny model's 512-token context
    leaves a group's judgement too little room; group mode is tested on the engine), under the strict schema: every
    group is scored, each score carries the weights that judged it, the held-out episodes are judged too (the
    run's headline), and a resume from step 1 gives step 2 exactly."""
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Score each reply from 0 to 1: does it do what was asked, under every constraint?")
    args = [
        "--preset",
        "smoke",
        "--env",
        "reply",
        "--steps",
        "2",
        "--rollout.prompts-per-step",
        "2",
        "--rollout.group-size",
        "2",
        "--rollout.max-new-tokens",
        "16",
        "--eval.limit",
        "2",
        "--envpool.workers",
        "1",
        "--log.ckpt-every",
        "1",
        "--reward.judge",
        "pointwise",
        "--reward.judge-url",
        "self",
        "--reward.judge-only",
        "--reward.rubric",
        str(rubric),
        "--reward.judge-max-tokens",
        "100",
    ]
    straight, r, a, b = _straight_then_resumed(tmp_path, args)
    assert [v for _, v in a["judge/errors"]] == [0, 0] and all(0 <= v <= 1 for _, v in a["judge/score_mean"])
    assert all(math.isnan(v) for _, v in a["train/success_rate"])  # no checker: unknown, not 0
    assert math.isnan(a["eval/accuracy"][-1][1]) and 0 <= a["eval/judge_score"][-1][1] <= 1
    for tag in ("train/pg_loss", "train/reward_mean", "judge/score_mean"):
        assert b[tag][-1] == a[tag][-1], (tag, a[tag], b[tag])
    recs = [json.loads(x) for x in open(straight / "rollouts.jsonl")]
    train = [r for r in recs if r["split"] == "train"]
    assert train and all(r["reward"] == r["info"]["judge"]["score"] for r in train)  # the judge alone
    checked = 0  # the trainer's advantages are GRPO's on the judge's scores (each traced row's first loss token)
    for step, g in {(r["step"], r["group"]) for r in train}:
        rows = [r for r in train if (r["step"], r["group"]) == (step, g) and r.get("tokens")]
        if len(rows) == 2:
            scores = torch.tensor([[r["info"]["judge"]["score"]] for r in rows])  # [2, 1]
            want, _ = algos.get_adv_estimator("grpo")(scores, torch.ones(2, 1), torch.zeros(2, dtype=torch.long))
            got = [next(a for a in r["tokens"]["adv"] if a is not None) for r in rows]
            assert got == pytest.approx(want[:, 0].tolist(), abs=1e-3), (step, g, got, scores)
            checked += 1
    assert checked
    versions = {r["step"]: r["info"]["judge"]["weight_version"] for r in train}
    assert versions[2] > versions[1]  # the weights that judged: step 2's after step 1's update
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["eval_metric"] == "judge_score" and "eval judge score" in r.stdout
