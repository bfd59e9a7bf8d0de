"""`--env mcp_time`: time-zone conversions through the real `mcp-server-time` (issue 73's second server)."""

import json

import pytest

import envs
from envs.mcp.clock import ZONES, as_time, questions

pytest.importorskip("mcp_server_time")


def test_splits_are_disjoint_by_zone_pair_and_every_zone_is_seen_in_training():
    rows = questions()
    pairs = {s: {r["pair"] for r in rs} for s, rs in rows.items()}
    assert not pairs["train"] & pairs["test"] and not pairs["train"] & pairs["validation"]
    assert not pairs["validation"] & pairs["test"]
    trained = {z for p in pairs["train"] for z in p.split(">")}
    assert trained == set(ZONES)
    assert questions() == rows  # the same on every machine


def test_every_held_out_answer_is_the_servers_conversion():
    env = envs.make("mcp_time", "train", 0)
    rows = [r for s in ("validation", "test") for r in questions()[s]]
    for row in rows:
        [call] = row["calls"]
        text, is_error = env.server.call(call["name"], call["arguments"], 10.0)
        assert not is_error, text
        assert json.loads(text)["target"]["datetime"][11:16] == row["answer"], row
    env.close()


def test_the_expert_solves_its_episodes_through_the_server_and_scoring_is_strict_and_lenient():
    for seed in range(3):
        env = envs.make("mcp_time", "train", seed)
        env.reset()
        r = env.step(env.expert_action())
        assert not r.done and '"target"' in r.observations[0]["content"]
        r = env.step(env.expert_action())
        assert r.done and r.reward == 1.0 and r.info["env_metrics"]["mcp/lenient"] == 1.0
    env = envs.make("mcp_time", "test", 0)
    answer = env.task.answer
    h, m = answer.split(":")
    assert env.step(f"It is {int(h)}:{m} there.").reward == 0.0  # lenient only: no tag
    env = envs.make("mcp_time", "test", 0)
    r = env.step(f"<answer>{answer}</answer>")
    assert r.reward == 1.0 and r.info["env_metrics"]["mcp/lenient"] == 1.0
    env = envs.make("mcp_time", "test", 0)
    r = env.step(f"So it is {int(h)}:{m}.")
    assert r.reward == 0.0 and r.info["env_metrics"]["mcp/lenient"] == 1.0
    env = envs.make("mcp_time", "test", 0)
    wrong = f"{(int(h) + 1) % 24:02d}:{m}"
    assert env.step(f"<answer>{wrong}</answer>").info["env_metrics"]["mcp/lenient"] == 0.0
    assert as_time("between 9:05 and 23:59, 12:345") == "23:59" and as_time("no time") is None
