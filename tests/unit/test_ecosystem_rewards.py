"""A user's TRL reward function on `--env dataset`: called once per group with the rows' columns; one that raises
or returns the wrong length masks its group (counted in env/reward_errors); None leaves an episode unscored."""

import json
import math

import pytest

import envs
from nanosky.agent.trajectory import Trajectory
from nanosky.env_rewards import env_metrics, score_groups

pytest.importorskip("datasets", reason="the gyms extra (make test installs it)")


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1] / "scripts"))
    rows = [{"prompt": f"Say {i}.", "answer": str(i), "difficulty": i % 3} for i in range(30)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _group(data, fn, replies, group=0, seed=None):
    kw = {"data_path": data, "reward": f"trl_rewards:{fn}"}
    seed = group if seed is None else seed
    out = []
    for r in replies:
        env = envs.make("dataset", "train", seed, **kw)
        env.reset()
        res = env.step(r)
        assert res.reward == 0.0 and res.info["success"] is None  # scored with its group, not alone
        msgs = [*env.task.prompt, {"role": "assistant", "content": r}]
        out.append(
            Trajectory(
                ids=[1, 2, 3], loss_mask=[0, 1, 1], group=group, env_seed=seed, messages=msgs, stop_reason="done"
            )
        )
    return out, envs.group_scorer("dataset", "train", **kw)


def test_the_function_gets_the_group_and_the_rows_columns(data):
    import trl_rewards

    trl_rewards.CALLS.clear()
    task = envs.make("dataset", "train", 4, data_path=data).task
    trajs, scorer = _group(data, "exact", [task.answer, "nope", task.answer], group=7, seed=4)
    score_groups(scorer, trajs)
    [call] = trl_rewards.CALLS  # one call for the whole group
    assert call["prompts"] == [task.raw_prompt] * 3 and call["completions"] == [
        task.answer,
        "nope",
        task.answer,
    ]
    assert call["answer"] == [task.answer] * 3 and call["difficulty"] == [task.columns["difficulty"]] * 3
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0] and [t.success for t in trajs] == [True, False, True]
    assert env_metrics("dataset", trajs, scored=True) == {"env/reward_errors": 0.0}


@pytest.mark.parametrize(("fn", "why"), [("raises", "RuntimeError: the judge is down"), ("short", "returned 2 values")])
def test_a_function_that_fails_masks_its_group_and_the_run_goes_on(data, fn, why):
    bad, scorer = _group(data, fn, ["a", "b", "c"], group=1)
    good, ok = _group(data, "exact", ["x", "y", "z"], group=2)
    score_groups(scorer, bad)
    score_groups(ok, good)
    assert all(t.loss_mask == [0, 0, 0] and why in t.info["reward_error"] for t in bad)
    assert all(t.success is None for t in bad)  # not silently a failure
    assert all(t.loss_mask == [0, 1, 1] for t in good)
    assert env_metrics("dataset", bad + good, scored=True) == {"env/reward_errors": 1.0}


def test_none_leaves_an_episode_unscored(data):
    from nanosky.agent.trajectory import success_rate

    trajs, scorer = _group(data, "unscored", ["skip this", "answer"])
    score_groups(scorer, trajs)
    assert trajs[0].success is None and trajs[0].info["unscored"] and trajs[0].reward == 0.0
    assert trajs[1].reward == 0.5 and trajs[1].success is False
    assert trajs[0].loss_mask == [0, 1, 1]  # unscored is not masked: a judge may still score it
    assert math.isnan(success_rate(trajs[:1]))


def test_math_reward_needs_no_group_scorer(data):
    assert envs.group_scorer("dataset", "train", data_path=data) is None
    assert envs.group_scorer("math", "train") is None


def test_the_env_api_declares_its_class_hooks_and_a_function_factory_gets_the_defaults(monkeypatch):
    """`Env` declares `group_scorer` and `aggregate_metrics` with their defaults, as it does `checker`: an env
    overrides them (dataset's TRL scorer, SkyRL-Gym's per-class metrics), and a factory that is a function, which
    has no class to ask, gets the base's."""
    from envs.base import Env

    assert Env.group_scorer("train") is None
    # the mean over the episodes that report a key; NaN (not measured) left out, not counted as 0
    assert Env.aggregate_metrics([{"a": 1, "b": float("nan")}, {"a": 0.0, "b": 2.0}, {}]) == {"a": 0.5, "b": 2.0}
    monkeypatch.setitem(envs._REGISTRY, "fn_made", lambda split="train", seed=0, **kw: envs.make("math", split, seed))
    assert envs.env_class("fn_made") is Env and envs.group_scorer("fn_made") is None and envs.has_checker("fn_made")
    assert envs.env_class("skyrl_gym").aggregate_metrics is not Env.aggregate_metrics
