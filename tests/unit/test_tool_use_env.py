"""tool_use env: contract, splits, expert demonstrations, and how bad tool calls are reported."""

import json
import random
import string

import pytest

import envs
from envs.base import NoExpert, StepResult
from envs.tool_use import ALL_KINDS, KINDS, NUDGE, ToolUseEnv, score_answer, test_tasks, train_task
from envs.tools import format_tool_call
from envs.tools.wiki_data import is_test_entity

CALC = format_tool_call("calculator", {"expression": "6 * 7"})


def _env(kind="arith", split="train", seed=0, **kw) -> ToolUseEnv:
    env = ToolUseEnv(split=split, seed=seed, kinds=(kind,), **kw)
    env.reset()
    return env


def test_make_and_reset_contract():
    env = envs.make("tool_use", split="test", seed=5)
    assert isinstance(env, ToolUseEnv) and env.split == "test" and env.seed == 5
    msgs = env.reset()
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "<answer>" in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    assert {t.name for t in env.tools} == {"calculator", "search", "wiki", "python_exec"}
    assert all(t.schema["type"] == "function" for t in env.tools)
    assert env.max_turns == 4 and ToolUseEnv(max_turns=2).max_turns == 2


def test_tasks_are_deterministic_and_short():
    assert train_task(123).question == train_task(123).question
    assert ToolUseEnv(seed=9).task == ToolUseEnv(seed=9).task
    tasks = [train_task(s, ALL_KINDS) for s in range(300)] + test_tasks()
    assert max(len(t.question.split()) for t in tasks) <= 30
    assert {t.kind for t in tasks} == set(ALL_KINDS)


def test_splits_are_disjoint_in_questions_and_entities():
    test = test_tasks()
    assert len(test) >= 150 and len({t.question for t in test}) == len(test)
    test_questions = {t.question for t in test}
    train = [train_task(s, ALL_KINDS) for s in range(1000)]
    assert not test_questions & {t.question for t in train}
    for t in train:  # training never shows a fact about a held-out entity
        assert not any(is_test_entity(e) for e in t.entities)
    for t in test:
        if t.entities:
            assert any(is_test_entity(e) for e in t.entities)
    assert len({t.question for t in train}) > 600  # plenty of distinct training tasks


def test_the_expert_makes_the_gold_calls_then_answers_and_refuses_held_out_tasks():
    """`--algo sft --env tool_use`: each expert reply is the task's next gold call, then the answer; a held-out split
    has no expert (it is never taught), and an `EnvTask` (what SFT's demonstrator plays) makes that refusal the
    episode's error."""
    import asyncio

    from nanosky.agent.task import EnvError, EnvTask

    assert envs.has_expert("tool_use") and envs.has_expert("tool_use", kinds=["arith", "python"])
    env = _env("python", seed=3)
    first = env.expert_action()
    assert first == format_tool_call(*env.task.calls[0])
    res = env.step(first)
    assert res.observations and res.observations[0]["role"] == "tool" and not res.done
    res = env.step(env.expert_action())
    assert res.done and res.info["success"] and res.reward == 1.0
    for split in ("test", "validation"):
        with pytest.raises(NoExpert, match=rf"no expert on the {split} split"):
            _env(split=split).expert_action()
    with pytest.raises(EnvError, match="no expert on the test split"):
        asyncio.run(EnvTask(_env(split="test")).expert_action())
    with pytest.raises(NoExpert, match="need more than max_turns=1"):
        _env(max_turns=1).expert_action()


@pytest.mark.parametrize("split", ["test", "validation"])
def test_the_expert_passes_its_own_scorer_on_every_held_out_task(split):
    """The expert's policy (`_expert_reply`, what `expert_action` returns on train) solves every held-out task, all
    kinds, when played through `step`: its calls run, and its answer scores 1.0."""
    pool = test_tasks(ALL_KINDS, split)
    for seed, task in enumerate(pool):
        env = ToolUseEnv(split=split, seed=seed, kinds=ALL_KINDS)
        assert env.task == task
        env.reset()
        while not (res := env.step(env._expert_reply())).done:
            pass
        assert res.reward == 1.0 and res.info["success"], task.question
        assert res.info["tool_calls"] == len(task.calls) and res.info["invalid_calls"] == 0


@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_conversations_solve_the_env(split):
    seen_kinds = set()
    for seed in range(40):
        env = ToolUseEnv(split=split, seed=seed, kinds=ALL_KINDS)
        conv = env.expert_conversation()
        assert [m["role"] for m in conv[:2]] == ["system", "user"]
        assert conv[-1] == {"role": "assistant", "content": f"<answer>{env.task.answer}</answer>"}
        tool_msgs = [m for m in conv if m["role"] == "tool"]
        assert tool_msgs and all(len(m["content"].split()) <= 40 for m in tool_msgs)
        assert env.task.answer.lower() in tool_msgs[-1]["content"].lower()  # answer readable from the tool
        # Replay the assistant turns through step(): same tool outputs, reward 1.0 at the end.
        env.reset()
        replayed = []
        for msg in conv[2:]:
            if msg["role"] == "assistant":
                res = env.step(msg["content"])
                replayed += res.observations
        assert replayed == tool_msgs
        assert res.done and res.reward == 1.0 and res.info["success"]
        assert res.info["tool_calls"] == len(env.task.calls) and res.info["invalid_calls"] == 0
        seen_kinds.add(env.task.kind)
    assert seen_kinds == set(ALL_KINDS)


def test_tool_call_step_returns_tool_messages():
    env = _env()
    res = env.step(f"Let me compute. {CALC} {format_tool_call('wiki', {'title': 'nowhere'})}")
    assert isinstance(res, StepResult) and not res.done and res.reward == 0.0
    assert res.observations[0] == {"role": "tool", "name": "calculator", "content": "42"}
    assert res.observations[1]["name"] == "wiki" and res.observations[1]["content"].startswith("No page")
    assert res.info["tool_calls"] == 2 and res.info["invalid_calls"] == 0
    assert [c["name"] for c in res.info["calls"]] == ["calculator", "wiki"]
    assert all(c["ok"] and c["latency_s"] >= 0 for c in res.info["calls"])
    json.dumps(res.info)  # per-call records are serialisable


def test_invalid_calls_become_error_observations_and_counts():
    env = _env()
    bad = (
        "<tool_call>{not json</tool_call>"
        '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
    )
    res = env.step(bad)
    assert not res.done and len(res.observations) == 3
    assert all(o["role"] == "tool" and o["content"].startswith("Error:") for o in res.observations)
    assert "invalid JSON" in res.observations[0]["content"]
    assert "unknown tool 'teleport'" in res.observations[1]["content"]
    assert "unexpected argument 'expr'" in res.observations[2]["content"]
    assert res.info["invalid_calls"] == 3 and res.info["tool_calls"] == 3
    res = env.step(CALC)  # counts are cumulative over the episode
    assert res.info["tool_calls"] == 4 and res.info["invalid_calls"] == 3


def test_too_many_calls_in_one_turn():
    env = _env(max_calls_per_turn=2)
    res = env.step(CALC * 3)
    assert [o["content"] for o in res.observations[:2]] == ["42", "42"]
    assert "at most 2 tool calls" in res.observations[2]["content"]
    assert res.info["invalid_calls"] == 1


def test_answers_are_scored():
    env = _env()
    res = env.step(f"<answer>{env.task.answer}</answer>")
    assert res.done and res.reward == 1.0 and res.info["success"]
    env.reset()
    res = env.step("<answer>definitely wrong</answer>")  # a guess without tools: no format credit
    assert res.done and res.reward == 0.0 and not res.info["success"]
    env.reset()
    env.step('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')  # a call that did not run
    assert env.step("<answer>definitely wrong</answer>").reward == 0.0
    env.reset()
    env.step(CALC)  # a call that ran, then a well-formed wrong answer: the format term
    res = env.step("<answer>definitely wrong</answer>")
    assert res.done and res.reward == 0.1 and not res.info["success"]
    env.reset()
    assert _env(format_needs_tool=False).step("<answer>definitely wrong</answer>").reward == 0.1
    env = _env(format_reward=0.0)  # correctness only
    env.step(CALC)
    assert env.step("<answer>definitely wrong</answer>").reward == 0.0
    env.reset()
    assert env.step(f"<answer>{env.task.answer}</answer>").reward == 1.0
    env.reset()
    assert env.step("<answer></answer>").reward == 0.0
    assert score_answer("<answer>The Skyloom</answer>", "Skyloom")[0] == 1.0
    assert score_answer("<answer>1,234</answer>", "1234")[0] == 1.0


def test_call_reward_pays_once_for_a_call_that_returns_the_gold_result():
    env = _env(call_reward=0.5)
    ((name, args),) = env.task.calls
    assert name == "calculator" and env.gold_outputs() == {env.task.answer}
    assert env.step(CALC).reward == 0.0 and not env.step(CALC).info["gold_call"]  # ran, but not the result
    # the gold expression rewritten (parentheses, spacing) returns the same output: paid, on that turn, once
    res = env.step(format_tool_call("calculator", {"expression": f"( {args['expression']} )"}))
    assert res.reward == 0.5 and res.info["gold_call"] and not res.done
    env = _env(call_reward=0.5)
    assert env.step(format_tool_call(name, args)).reward == 0.5
    assert env.step(format_tool_call(name, args)).reward == 0.0  # a second gold call earns nothing more
    res = env.step(f"<answer>{env.task.answer}</answer>")
    assert res.reward == 1.0 and res.info["success"] and res.info["gold_call"]  # success and its reward unchanged
    env.reset()  # a new episode pays again
    assert not env.call_paid and env.step(format_tool_call(name, args)).reward == 0.5
    # python: a different program that prints the same value is paid; the default pays nothing
    env = _env("python", call_reward=0.3)
    code = f"print({env.task.answer!r})"  # prints the answer string itself
    assert env.step(format_tool_call("python_exec", {"code": code})).reward == 0.3
    plain = _env("python")
    assert plain.step(format_tool_call("python_exec", {"code": code})).reward == 0.0
    with pytest.raises(ValueError, match="call_reward"):
        _env(call_reward=-1)


def test_neither_call_nor_answer_nudges_until_out_of_turns():
    env = _env(max_turns=3)
    for turn in (1, 2):
        assert env.turn == turn - 1
        res = env.step("hmm, let me think")
        assert not res.done and res.reward == 0.0
        assert res.observations == [{"role": "user", "content": NUDGE}]
    res = env.step(CALC)  # third turn: out of turns even with a valid call
    assert res.done and res.reward == 0.0 and res.observations == []
    assert res.info["tool_calls"] == 1
    after = env.step(f"<answer>{env.task.answer}</answer>")
    assert after.done and after.reward == 0.0  # nothing counts after the episode ended


def test_step_never_raises():
    env = _env(kind="wiki")
    rng = random.Random(0)
    pieces = ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "{", '"name"', '"wiki"', ":"]
    for _ in range(200):
        if env.done:
            env.reset()
        text = "".join(rng.choice(pieces + list(string.printable)) for _ in range(rng.randint(0, 60)))
        res = env.step(text)
        # noise earns nothing, and every reply is answered with tool outputs or a nudge (never silence)
        assert res.reward == 0.0 and not res.info["success"]
        assert res.done or (res.observations and {m["role"] for m in res.observations} <= {"tool", "user"})
    env.reset()
    res = env.step(None)  # type: ignore[arg-type]
    assert not res.done and res.reward == 0.0 and res.observations[0]["content"] == NUDGE


def test_kinds_and_split_validation():
    with pytest.raises(ValueError):
        ToolUseEnv(kinds=("nope",))
    with pytest.raises(ValueError, match="split must be one of train, validation, test"):
        ToolUseEnv(split="dev")
    assert all(ToolUseEnv(split="test", seed=s, kinds=("python",)).task.kind == "python" for s in range(5))
    assert set(KINDS) < set(ALL_KINDS)
