"""The judge in training (`nanosky.judge.rewards.Judging.step`), one process, against the scripted server: known
scores reach the rewards exactly (added with a weight, or alone), a malformed answer masks only its group (no loss
token left), the metrics, and the key in neither the config nor the records."""

import asyncio
import dataclasses
import json
import math
import re

import pytest

from evals.scripted import ScriptedServer
from nanosky.agent.trajectory import Trajectory
from nanosky.config.reward import RewardConfig
from nanosky.judge.rewards import Judging, attempt_text


def oracle(messages) -> str:
    body = messages[-1]["content"]
    if "BROKEN" in body:
        return "the judge rambles, no JSON"
    ids = [int(i) for i in re.findall(r"<attempt id=(\d+)>", body)]
    said = [int(n) for n in re.findall(r"<answer>(\d+)</answer>", body)]
    return json.dumps(
        {"scores": [{"trajectory_id": i, "explanation": f"said {n}", "score": n / 10} for i, n in zip(ids, said)]}
    )


def _trajs():
    out = []
    for g, (q, answers, env) in enumerate([("Q0", [2, 9, 5], [0.0, 1.0, 0.0]), ("BROKEN", [1, 3], [1.0, 0.0])]):
        for n, r in zip(answers, env):
            out.append(
                Trajectory(
                    ids=[1, 2, 3],
                    loss_mask=[0, 1, 1],
                    logprobs=[0, -1, -1],
                    reward=r,
                    group=g,
                    messages=[
                        {"role": "system", "content": "rubric-free"},
                        {"role": "user", "content": q},
                        {"role": "assistant", "content": f"<answer>{n}</answer>"},
                    ],
                )
            )
    return out


@pytest.mark.parametrize("only", [False, True])
def test_scores_reach_the_rewards_and_a_bad_group_is_masked(dist_info, only):
    trajs = _trajs()
    with ScriptedServer(oracle) as url:
        cfg = RewardConfig(judge="group", judge_url=url, judge_weight=0.5, judge_only=only, judge_timeout_s=10)
        m = Judging(cfg).step(trajs, lambda coro: asyncio.new_event_loop().run_until_complete(coro))
    want = [0.2, 0.9, 0.5] if only else [0.0 + 0.1, 1.0 + 0.45, 0.0 + 0.25]
    assert [t.reward for t in trajs[:3]] == pytest.approx(want, abs=1e-12)
    assert trajs[1].info["judge"] == {"score": 0.9, "explanation": "said 9"}
    assert all(t.loss_mask == [0, 0, 0] and "error" in t.info["judge"] for t in trajs[3:])  # masked, not trained
    assert [t.reward for t in trajs[3:]] == [1.0, 0.0]
    assert m["judge/errors"] == 1.0 and m["judge/score_mean"] == pytest.approx((0.2 + 0.9 + 0.5) / 3)
    assert m["judge/agreement_with_env"] == pytest.approx(0.866, abs=1e-3)  # ranks (1,3,2) vs (1.5,3,1.5)
    assert m["judge/latency_s"] > 0 and m["timing/judge_s"] > 0


def test_a_step_with_nothing_scored_reports_nan_not_zero(dist_info):
    trajs = [t for t in _trajs() if t.group == 1]
    with ScriptedServer(oracle) as url:
        m = Judging(RewardConfig(judge="pointwise", judge_url=url)).step(
            trajs, lambda coro: asyncio.new_event_loop().run_until_complete(coro)
        )
    assert math.isnan(m["judge/score_mean"]) and math.isnan(m["judge/agreement_with_env"])
    assert m["judge/errors"] == 1.0


def test_the_key_is_named_never_stored(dist_info, monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-live-abc")
    cfg = RewardConfig(judge="group", judge_url="http://127.0.0.1:9/v1", judge_key_env="MY_JUDGE_KEY")
    assert "sk-live-abc" not in json.dumps(dataclasses.asdict(cfg))  # config.json holds the variable's name only


def test_the_task_is_sent_once_and_the_attempt_is_the_rest():
    t = _trajs()[0]
    t.messages += [{"role": "tool", "name": "calculator", "content": "4"}]
    task, attempt = attempt_text(t)
    assert [m["content"] for m in task] == ["rubric-free", "Q0"]
    assert attempt == "[assistant]\n<answer>2</answer>\n\n[tool calculator]\n4"


def test_flags_are_checked_at_start():
    with pytest.raises(ValueError, match="needs --reward.judge-url"):
        RewardConfig(judge="group")
    with pytest.raises(ValueError, match="no such file"):
        RewardConfig(judge="group", judge_url="http://x/v1", rubric="/nonexistent/rubric.txt")


def test_a_judge_url_where_nothing_answers_is_refused_at_start(tmp_path):
    import socket

    from nanosky import preflight
    from nanosky.cli import parse_args

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # a port nothing listens on
    base = ["--preset", "smoke", "--log.run-dir", str(tmp_path / "run"), "--reward.judge", "group"]
    with pytest.raises(preflight.UsageError, match=rf"--reward.judge-url http://127.0.0.1:{port}/v1: no server"):
        preflight.check(parse_args([*base, "--reward.judge-url", f"http://127.0.0.1:{port}/v1"], console=False), 1)
    with pytest.raises(preflight.UsageError, match="not an http"):
        preflight.check(parse_args([*base, "--reward.judge-url", "127.0.0.1:8001"], console=False), 1)
    with ScriptedServer(oracle) as url:
        preflight.check(parse_args([*base, "--reward.judge-url", url], console=False), 1)
