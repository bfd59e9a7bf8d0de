"""evals.judged: an env's test split played by a model and scored by a judge, both scripted servers here (the
self-judge runs in tests/e2e/test_judge_e2e.py's held-out eval): the headline is the judge's mean over what it
scored, a masked group is counted and left out (never a 0), each episode keeps its score and explanation, and a
run dir given as --ckpt brings the judge that run trained with."""

import json
import math
import re

import pytest

from evals import judged
from evals.scripted import ScriptedServer
from nanosky.config.reward import RewardConfig


def policy(messages) -> str:
    return "Dear customer, thanks for waiting. Sam" if "customer" in messages[-1]["content"] else "ok"


def judge(messages) -> str:
    """Scores by length / 100; a task about a fire drill gets no JSON (its group is masked)."""
    body = messages[-1]["content"]
    if "fire drill" in body:
        return "I refuse."
    attempts = re.findall(r"<attempt id=(\d+)>\n(.*?)\n</attempt>", body, re.S)
    return json.dumps(
        {
            "scores": [
                {"trajectory_id": int(i), "explanation": f"{len(a)} chars", "score": len(a) / 100} for i, a in attempts
            ]
        }
    )


def test_the_report_is_the_judges_mean_with_each_explanation_kept(tmp_path):
    from envs.reply import test_requests

    n = 12
    masked = sum("fire drill" in r.text for r in test_requests()[:n])
    with ScriptedServer(policy) as purl, ScriptedServer(judge) as jurl:
        report = judged.main(
            [
                "--base-url",
                purl,
                "--env",
                "reply",
                "--limit",
                str(n),
                "--n-samples",
                "2",
                "--temperature",
                "1",
                "--reward.judge",
                "group",
                "--reward.judge-url",
                jurl,
                "--out",
                str(tmp_path / "out"),
            ]
        )
    recs = [json.loads(x) for x in open(tmp_path / "out" / "examples.jsonl")]
    scored = [r for r in recs if r["score"] is not None]
    assert len(recs) == 2 * n and len(scored) == 2 * (n - masked)
    for r in scored:  # the attempt as the judge saw it: "[assistant]\n" + the reply
        reply = r["messages"][-1]["content"]
        assert r["score"] == pytest.approx(len(f"[assistant]\n{reply}") / 100) and r["explanation"].endswith("chars")
    assert all(r["judge_error"] for r in recs if r["score"] is None)
    assert report["headline"] == "score" and report["judge_errors"] == masked
    assert report["score"] == pytest.approx(sum(r["score"] for r in scored) / len(scored))
    assert "accuracy" not in report  # reply has no checker


def test_a_judge_that_scores_nothing_reports_nan(tmp_path):
    with ScriptedServer(policy) as purl, ScriptedServer(lambda m: "no") as jurl:
        report = judged.main(
            [
                "--base-url",
                purl,
                "--env",
                "reply",
                "--limit",
                "2",
                "--reward.judge",
                "pointwise",
                "--reward.judge-url",
                jurl,
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert math.isnan(report["score"]) and report["judge_errors"] == 2


def test_a_run_dir_brings_its_own_judge_and_a_judge_is_required(tmp_path):
    run = tmp_path / "run"
    export = run / "checkpoints" / "step_000002" / "export"
    export.mkdir(parents=True)
    reward = {
        "judge": "pointwise",
        "judge_url": "http://127.0.0.1:9/v1",
        "judge_model": "big",
        "judge_weight": 1.0,
    }
    (run / "config.json").write_text(json.dumps({"reward": reward}))
    for ckpt in (run, export):
        cfg = judged.JudgedEvalConfig(ckpt=str(ckpt))
        assert (cfg.reward.judge, cfg.reward.judge_model) == ("pointwise", "big")
    with pytest.raises(ValueError, match="needs a judge"):
        judged.JudgedEvalConfig(ckpt=str(tmp_path))
    with pytest.raises(ValueError, match="self judges with the evaluated model"):
        judged.JudgedEvalConfig(base_url="http://127.0.0.1:9/v1", reward=RewardConfig(judge="group", judge_url="self"))
