"""The env without a checker (envs/reply.py) and what "no checker" means downstream: reward 0 and success None,
rates over checked episodes only (NaN where none was), and a run that would train on nothing refused at start."""

import math

import pytest

import envs
from envs.reply import TEST_SIZE, ReplyEnv, test_requests
from nanosky.agent.trajectory import Trajectory, success_rate, summarize


def test_requests_state_constraints_and_the_splits_share_none():
    test = {r.text for r in test_requests()}
    assert len(test) == TEST_SIZE  # no repeats inside the test split
    train = [ReplyEnv("train", seed=s) for s in range(400)]
    assert not test & {e.request.text for e in train}
    e = ReplyEnv("test", seed=7)
    msgs = e.reset()
    assert msgs[-1]["content"] == test_requests()[7].text and "Constraints: " in msgs[-1]["content"]
    assert 2 <= len(e.request.constraints) <= 3
    assert ReplyEnv("train", seed=3).request == ReplyEnv("train", seed=3).request  # a seed is a task


def test_no_checker_means_reward_zero_and_success_unknown():
    r = envs.make("reply", split="test", seed=0).step("Dear customer, thanks for your patience. Sam")
    assert r.done and r.reward == 0.0 and r.info["success"] is None and r.info["constraints"]
    assert not envs.has_checker("reply") and envs.has_checker("text_math")


def test_rates_count_checked_episodes_only():
    mixed = [Trajectory(success=True), Trajectory(success=None), Trajectory(success=False)]
    assert success_rate(mixed) == 0.5
    assert math.isnan(success_rate([Trajectory(success=None)] * 3))  # never a reassuring 0
    assert math.isnan(summarize([Trajectory(success=None)])["accuracy"])


def test_in_training_eval_reports_nan_accuracy_and_the_judges_score(dist_info):
    from nanosky.evaluate import evaluate

    trajs = [Trajectory(success=None, reward=0.0) for _ in range(4)]
    m, _ = evaluate(lambda seeds: trajs, 4, 1, judge_fn=lambda ts: (1.5, 3.0, 1.0))
    assert math.isnan(m["eval/accuracy"]) and m["eval/judge_score"] == 0.5 and m["eval/judge_errors"] == 1.0
    m, _ = evaluate(lambda seeds: trajs, 4, 1, judge_fn=lambda ts: (0.0, 0.0, 2.0))
    assert math.isnan(m["eval/judge_score"])


def test_an_env_without_a_checker_needs_a_judge_alone(tmp_path):
    from nanosky import preflight
    from nanosky.cli import parse_args

    base = ["--preset", "smoke", "--env", "reply", "--log.run-dir", str(tmp_path / "run")]
    for extra in ([], ["--reward.judge", "group", "--reward.judge-url", "self"]):
        with pytest.raises(preflight.UsageError, match="--env reply has no checker.*--reward.judge-only"):
            preflight.check(parse_args([*base, *extra], console=False), 1)
    ok = [
        *base,
        "--reward.judge",
        "pointwise",
        "--reward.judge-url",
        "self",
        "--reward.judge-only",
        "--reward.judge-max-tokens",
        "128",
    ]
    preflight.check(parse_args(ok, console=False), 1)
    with pytest.raises(preflight.UsageError, match="cannot hold one judgement of 8 attempts"):
        preflight.check(parse_args([*ok, "--reward.judge", "group", "--rollout.group-size", "8"], console=False), 1)
    with pytest.raises(preflight.UsageError, match="leaves no room for the judge's prompt"):
        preflight.check(parse_args([*ok, "--reward.judge-max-tokens", "4096"], console=False), 1)
