"""`--env openenv`: OpenEnv environments served by `openenv-core`'s own `create_app` (tests/scripts/openenv_toy.py),
started by nanosky per env worker or given by URL; text and tool actions; faults that cost one episode (issue 73)."""

import json
import os
import time

import pytest

pytest.importorskip("openenv.core", reason="the gyms setup (make install puts openenv-core in)")

import envs  # noqa: E402
from envs.mcp.client import ServerFault  # noqa: E402
from envs.openenv import SPLIT_SEEDS, action_rule, render  # noqa: E402
from envs.openenv.client import Server  # noqa: E402
from nanosky.rollout.envpool import EnvFailure, EnvPool  # noqa: E402

TOY = os.path.join(os.path.dirname(__file__), "..", "scripts", "openenv_toy.py")


def toy():
    import importlib.util

    spec = importlib.util.spec_from_file_location("openenv_toy_for_tests", TOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def guess(digit: int) -> str:
    return f"<tool_call>{json.dumps({'name': 'guess', 'arguments': {'digit': digit}})}</tool_call>"


def test_a_text_env_plays_its_game_with_the_env_s_rewards_and_seeds_by_split():
    game = toy()
    env = envs.make("openenv", "train", 4, app=f"{TOY}:app")
    assert env.reset() == [{"role": "user", "content": "Guess the hidden digit (0-9). Reply with one digit."}]
    digit = game.digit_of(4)
    wrong = (digit + 1) % 10
    first = env.step(f"  I say {wrong}\n")
    assert first.reward == pytest.approx(0.1) and not first.done
    assert first.observations == [{"role": "user", "content": "Not it: lower. Guess again."}]
    last = env.step(f"<answer>{digit}</answer>")
    assert last.done and last.reward == 1.0 and last.info["success"] and last.info["return"] == pytest.approx(1.1)
    assert last.info["env_metrics"] == {"openenv/return": pytest.approx(1.1), "openenv/turns": 2.0}
    env.close()
    # splits draw other seeds: the test episode of index 4 hides another digit than the train one
    test = envs.make("openenv", "test", 4, app=f"{TOY}:app")
    test.reset()
    assert test.step(str(game.digit_of(SPLIT_SEEDS["test"] + 4))).reward == 1.0
    assert game.digit_of(SPLIT_SEEDS["test"] + 4) != digit
    test.close()


def test_a_server_with_one_session_gets_siblings_and_each_episode_its_own_environment():
    made = [envs.make("openenv", "train", s, app=f"{TOY}:single_app") for s in range(3)]
    for env in made:
        env.reset()
    servers = {env.session.server for env in made}
    assert len(servers) == 3 and all(s.capacity in (None, 0, 1) for s in servers)
    assert [env.step("no digit here").reward for env in made] == [0.0, 0.0, 0.0]
    for env in made:
        env.close()
    again = envs.make("openenv", "train", 5, app=f"{TOY}:single_app")
    again.reset()
    assert again.session.server in servers  # a free server is reused, not a new process per episode
    again.close()


def test_a_tool_env_lists_its_tools_and_calls_are_call_tool_steps():
    game = toy()
    env = envs.make("openenv", "train", 2, app=f"{TOY}:tool_app")
    assert [t.name for t in env.tools] == ["guess"] and env.tools[0].parameters["required"] == ["digit"]
    assert env.reset()[-1]["content"] == "Find the digit with the guess tool."
    digit = game.digit_of(2)
    miss = env.step(guess((digit + 5) % 10))
    assert miss.reward == 0.0 and not miss.done and miss.observations[0]["role"] == "tool"
    assert miss.observations[0]["content"] in ("higher", "lower")
    hit = env.step(guess(digit))
    assert hit.done and hit.reward == 1.0 and hit.info["success"] and hit.info["calls"][0]["ok"]
    env.close()
    plain = envs.make("openenv", "train", 2, app=f"{TOY}:tool_app")
    plain.reset()
    end = plain.step("I give up.")  # a reply without a call ends a tool env's episode
    assert end.done and end.reward == 0.0 and not end.info["success"]
    plain.close()


@pytest.mark.parametrize("fault", ["hang", "die", "garble"])
def test_a_server_that_hangs_dies_or_garbles_costs_the_episode_and_the_next_episode_plays(fault):
    app = f"{TOY}:garbled_app" if fault == "garble" else f"{TOY}:single_app"
    env = envs.make("openenv", "train", 0, app=app, step_timeout_s=2.0)
    env.reset()
    start = time.monotonic()
    with pytest.raises(ServerFault, match={"hang": "no reply within 2s", "die": "exited", "garble": "outside"}[fault]):
        env.step(fault)
    assert time.monotonic() - start < 15
    env.close()
    nxt = envs.make("openenv", "train", 0, app=app, step_timeout_s=2.0)
    assert nxt.reset()[-1]["content"].startswith("Guess")
    if fault != "garble":
        assert nxt.step("nothing").reward == 0.0
    nxt.close()


def test_through_the_env_pool_a_hung_or_dead_server_loses_its_trajectory_only():
    with EnvPool(n_workers=1, step_timeout_s=60) as pool:
        handles = [pool.make("openenv", "train", s, app=f"{TOY}:single_app", step_timeout_s=2.0) for s in range(4)]
        pool.reset(handles)
        out = pool.step([(handles[0], "hang"), (handles[1], "die"), (handles[2], "7")])
        assert isinstance(out[0], EnvFailure) and "no reply within 2s" in out[0].reason
        assert isinstance(out[1], EnvFailure) and "exited" in out[1].reason
        assert out[2].reward in (0.1, 1.0)
        [after] = pool.step([(handles[3], "3")])
        assert after.reward in (0.1, 1.0) and pool.stats["failed"] == 2


def test_a_server_given_by_url_and_its_capacity_refusal():
    served = Server(app=f"{TOY}:single_app")
    try:
        env = envs.make("openenv", "validation", 1, url=served.url)
        env.reset()
        assert env.step("x").reward == 0.0
        with pytest.raises(ServerFault, match="max_concurrent_envs"):  # a URL's server cannot be multiplied
            envs.make("openenv", "validation", 2, url=served.url).reset()
        env.close()
    finally:
        served.stop()


def test_action_types_it_cannot_fill_are_refused_in_one_line():
    text = {"title": "A", "properties": {"message": {"type": "string"}, "metadata": {"type": "object"}}}
    assert action_rule(text, None) == "message"
    assert action_rule({"title": "CallToolAction", "properties": {"tool_name": {}, "arguments": {}}}, None) is None
    two = {"title": "Edit", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}}
    with pytest.raises(ValueError, match="action type Edit has 2 text fields .*--env-kwargs.action-field"):
        action_rule(two, None)
    assert action_rule(two, "text") == "text"
    move = {"title": "Move", "properties": {"dx": {"type": "integer"}, "note": {"type": "string"}}, "required": ["dx"]}
    with pytest.raises(ValueError, match=r"action type Move also requires 'dx' \(integer\)"):
        action_rule(move, None)
    with pytest.raises(ValueError, match="is integer, not text"):
        action_rule(move, "dx")
    with pytest.raises(ValueError, match="has no field 'msg'"):
        action_rule(text, "msg")


def test_observations_render_as_one_turn():
    assert render({"prompt": "Hi", "reward": 1, "done": False, "metadata": {"x": 1}}) == "Hi"
    assert render({"board": [[0, 1]], "legal": "a b"}) == '{"board": [[0, 1]], "legal": "a b"}'
    assert render({"board": [[0, 1]], "legal": "a b"}, "legal") == "a b"
    assert render({"reward": 0.0, "metadata": {}}) == "(no observation)"
