"""The ecosystem's envs (envs/ecosystem/) through their real packages: each source's gold answer gets the source's
own reward, a wrong one 0, a malformed one 0 and no exception; the files' layouts are recognised; bad input is one
line naming what was found; splits never share a question."""

import asyncio
import json

import pytest

import envs
from envs.ecosystem.mathreward import math_reward
from envs.ecosystem.rows import DataError

pytest.importorskip("datasets", reason="the gyms extra (make test installs it)")
pd = pytest.importorskip("pandas")

MALFORMED = ["", "\\boxed{", "<answer>", "\x00\xff" * 50, "}}}{{{"]


def _verl(path, n=40):
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i, "split": "train"},
        }
        for i in range(n)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    ("reply", "gold", "want"),
    [
        ("so \\boxed{0.5}", "1/2", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("it is 72 apples.", "72", 1.0),
        ("#### 1,200", "1200", 1.0),
        ("\\boxed{1+x}", "x+1", 1.0),
        ("\\boxed{71}", "72", 0.0),
        ("no idea", "72", 0.0),
    ],
)
def test_math_reward_is_math_verify_on_the_last_boxed_else_the_last_number(reply, gold, want):
    assert math_reward(reply, gold)[0] == want
    for bad in MALFORMED:
        assert math_reward(bad, gold)[0] == 0.0


def test_dataset_reads_verl_parquet_and_scores_with_math_verify(tmp_path):
    path = str(_verl(tmp_path / "train.parquet"))
    env = envs.make("dataset", "train", 3, data_path=path)
    msgs = env.reset()
    assert msgs[-1]["role"] == "user" and "+" in msgs[-1]["content"] and env.task.source == "openai/gsm8k"
    i = int(msgs[-1]["content"].split()[2])
    gold = env.step(f"The sum is \\boxed{{{2 * i}}}")
    assert gold.reward == 1.0 and gold.done and gold.info["success"]
    assert env.step(f"\\boxed{{{2 * i + 1}}}").reward == 0.0
    for bad in MALFORMED:
        assert env.step(bad).reward == 0.0
    sysp = envs.make("dataset", "train", 3, data_path=path, system_prompt="Box it.").reset()
    assert sysp[0] == {"role": "system", "content": "Box it."} and sysp[1:] == msgs


def test_dataset_layouts_trl_gsm8k_math_and_named_columns(tmp_path):
    gsm = _jsonl(tmp_path / "g.jsonl", [{"question": f"q{i}?", "answer": f"work\n#### {i}"} for i in range(20)])
    env = envs.make("dataset", "train", 0, data_path=gsm)
    assert env.task.source == "gsm8k" and env.gold == env.task.answer.rsplit("####")[1].strip()
    assert env.step(f"#### {env.gold}").reward == 1.0
    trl = _jsonl(
        tmp_path / "t.jsonl",
        [{"prompt": [{"role": "user", "content": f"p{i}"}], "solution": f"\\boxed{{{i}}}"} for i in range(20)],
    )
    env = envs.make("dataset", "test", 0, data_path=trl)
    assert env.reset() == env.task.prompt and env.step(f"\\boxed{{{env.gold}}}").reward == 1.0
    other = _jsonl(tmp_path / "o.jsonl", [{"text": f"t{i}", "meta": {"gold": str(i)}} for i in range(20)])
    env = envs.make("dataset", "train", 1, data_path=other, prompt_key="text", answer_key="meta.gold")
    assert env.reset()[-1]["content"].startswith("t") and env.step(f"\\boxed{{{env.gold}}}").reward == 1.0
    folder = tmp_path / "saved"
    import datasets

    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"question": "a?", "answer": "1"}] * 3),
            "test": datasets.Dataset.from_list([{"question": "b?", "answer": "2"}]),
        }
    ).save_to_disk(folder)
    assert envs.make("dataset", "test", 5, data_path=str(folder)).task.prompt[0]["content"] == "b?"
    assert envs.make("dataset", "train", 5, data_path=str(folder)).task.prompt[0]["content"] == "a?"


def test_dataset_demonstrations_are_each_rows_own_solution_in_every_layout(tmp_path):
    """`--algo sft --env dataset`: the expert is the row's solution column (TRL's completion, string or chat, the
    last assistant turn of TRL's `messages`, verl's extra_info.answer, MATH's solution, a GSM8K answer, a named
    column); a bare gold answer is no demonstration, and the test split is never demonstrated."""
    n = 12

    def demo(rows, split="train", **kw):
        path = _jsonl(tmp_path / f"d{len(list(tmp_path.iterdir()))}.jsonl", rows)
        env = envs.make("dataset", split, 3, data_path=path, **kw)
        return env, env.expert_action()

    trl = [{"prompt": f"What is {i} + 1?", "completion": f"{i} + 1 = {i + 1}", "answer": str(i + 1)} for i in range(n)]
    env, got = demo(trl)  # the row's own completion, beside its own prompt
    assert (
        env.reset()[-1]["content"] == f"What is {int(env.gold) - 1} + 1?"
        and got == f"{int(env.gold) - 1} + 1 = {env.gold}"
    )
    chat_rows = [
        {
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "completion": [{"role": "assistant", "content": f"so \\boxed{{{i}}}"}],
            "answer": str(i),
        }
        for i in range(n)
    ]
    env, got = demo(chat_rows)
    assert got == f"so \\boxed{{{env.gold}}}" and env.step(got).reward == 1.0  # the demonstration solves its row
    msgs = [
        {
            "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}],
            "answer": f"{i}",
        }
        for i in range(n)
    ]
    env, got = demo(msgs)
    assert env.reset() == [{"role": "user", "content": f"q{env.gold}"}] and got == f"a{env.gold}"
    verl = [
        {
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "reward_model": {"ground_truth": str(i)},
            "extra_info": {"answer": f"work\n#### {i}"},
        }
        for i in range(n)
    ]
    env, got = demo(verl)
    assert got == f"work\n#### {env.gold}" and env.step(got).reward == 1.0
    env, got = demo([{"question": f"q{i}", "answer": f"{i} = {i}\n#### {i}"} for i in range(n)])
    assert got == env.task.answer and got.endswith(f"#### {env.gold}")
    env, got = demo([{"problem": f"p{i}", "solution": f"so \\boxed{{{i}}}"} for i in range(n)])
    assert got == f"so \\boxed{{{env.gold}}}"
    env, got = demo(
        [{"q": f"q{i}", "gold": str(i), "why": f"because {i}"} for i in range(n)],
        prompt_key="q",
        answer_key="gold",
        solution_key="why",
    )
    assert got == f"because {env.gold}"

    with pytest.raises(DataError, match=r"no solution column to demonstrate .* columns found: question, answer"):
        demo([{"question": f"q{i}", "answer": str(i)} for i in range(n)])  # a bare gold answer
    with pytest.raises(DataError, match=r"no column 'why' \(--env-kwargs.solution-key\)"):
        demo([{"question": f"q{i}", "answer": str(i)} for i in range(n)], solution_key="why")
    odd = [{"prompt": f"q{i}", "response": {"score": i}, "answer": str(i)} for i in range(n)]  # not a reply
    with pytest.raises(DataError, match=r"no solution column to demonstrate"):
        demo(odd)  # found by name only, it is no demonstration; RL reads the rows as ever
    assert envs.make("dataset", "train", 0, data_path=_jsonl(tmp_path / "odd.jsonl", odd)).reset()
    with pytest.raises(DataError, match=r"column 'response': expected a reply string or one assistant turn"):
        demo(odd, solution_key="response")  # named: its cell must be a reply
    with pytest.raises(DataError, match="expected a chat ending in an assistant turn"):
        demo([{"messages": [{"role": "user", "content": f"q{i}"}], "answer": "1"} for i in range(n)])
    with pytest.raises(DataError, match="no demonstration on the test split"):
        demo(chat_rows, split="test")


def test_dataset_bad_input_is_one_line_naming_what_was_found(tmp_path):
    path = _jsonl(tmp_path / "x.jsonl", [{"text": f"hi {i}", "label": i} for i in range(4)])
    with pytest.raises(DataError, match=r"no prompt column .* columns found: text, label"):
        envs.make("dataset", data_path=path)
    with pytest.raises(DataError, match=r"no column 'nope' .* columns found: text, label"):
        envs.make("dataset", data_path=path, prompt_key="nope")
    with pytest.raises(DataError, match=r"no answer column .* columns found: text, label"):
        envs.make("dataset", data_path=path, prompt_key="text")
    with pytest.raises(DataError, match="no such file"):
        envs.make("dataset", data_path=str(tmp_path / "missing.parquet"))
    (tmp_path / "bad.txt").write_text("x")
    with pytest.raises(DataError, match="unknown file type .txt"):
        envs.make("dataset", data_path=str(tmp_path / "bad.txt"))
    with pytest.raises(DataError, match="no module named 'no_such_module'"):
        envs.make("dataset", data_path=path, prompt_key="text", reward="no_such_module:fn")


def test_held_out_split_is_fixed_by_prompt_hash_and_disjoint(tmp_path):
    rows = [{"question": f"q{i % 150}?", "answer": str(i % 150)} for i in range(200)]  # 50 prompts twice
    path = _jsonl(tmp_path / "d.jsonl", rows)
    from envs.ecosystem.dataset import _read_split, load_split

    train, test = load_split(path, "train"), load_split(path, "test")
    assert len(train) + len(test) == 200 and 0 < len(test) < 60
    assert not {t.prompt[0]["content"] for t in train} & {t.prompt[0]["content"] for t in test}
    _read_split.cache_clear()
    assert load_split(path, "test") == test  # the same rows on every run


def test_reasoning_gym_gold_wrong_malformed_and_disjoint_splits():
    kw = {
        "tasks": "basic_arithmetic,chain_sum",
        "config": '{"basic_arithmetic": {"max_terms": 2, "max_digits": 1}}',
    }
    seen = set()
    for seed in range(20):
        env = envs.make("reasoning_gym", "train", seed, **kw)
        seen.add(env.task)
        assert "<answer>" in env.reset()[0]["content"]
        gold = env.step(f"<answer>{env.entry['answer']}</answer>")
        assert gold.reward == 1.0 and gold.info["success"]
        assert gold.info["env_metrics"] == {
            f"{env.task}/reward": 1.0,
            f"{env.task}/success": 1.0,
            f"{env.task}/lenient": 1.0,
        }
        untagged = env.step(f"So the answer is {env.entry['answer']}.")  # right, but not in the tag
        assert untagged.reward == 0.0 and untagged.info["env_metrics"][f"{env.task}/lenient"] == 1.0
        assert env.step("<answer>not a number</answer>").reward == 0.0
        for bad in MALFORMED:
            assert env.step(bad).reward == 0.0
    assert seen == {"basic_arithmetic", "chain_sum"}
    test = {envs.make("reasoning_gym", "test", s, **kw).entry["question"] for s in range(100)}
    train = {envs.make("reasoning_gym", "train", s, **kw).entry["question"] for s in range(400)}
    assert len(test) > 50 and not test & train  # 1-digit sums repeat: the redraw keeps them apart
    with pytest.raises(ValueError, match="unknown task 'nope'; valid: .*basic_arithmetic"):
        envs.make("reasoning_gym", tasks="nope")


def _guess(env) -> list:
    """Binary search on GuessTheNumber: the game's hints as observations, to its end."""
    env.reset()
    lo, hi, results = 1, 20, []
    while True:
        g = (lo + hi) // 2
        r = env.step(f"I guess [{g}]")
        results.append(r)
        if r.done:
            return results
        lo, hi = (g + 1, hi) if "higher" in r.observations[0]["content"] else (lo, g - 1)


def test_textarena_guess_the_number_has_a_scripted_expert_on_its_train_games_only():
    """`--algo sft --env textarena`: GuessTheNumber's expert, a binary search on the hints the game gave, wins every
    train game within ceil(log2(20)) = 5 guesses, each a bracketed move the game takes; the test split and a game
    without an expert are refused in one line."""
    for seed in range(12):
        env = envs.make("textarena", "train", seed, game="GuessTheNumber-v0")
        env.reset()
        moves = []
        while not env.done:
            moves.append(env.expert_action())
            r = env.step(moves[-1])
        assert r.reward == 1.0 and len(moves) <= 5 and len(set(moves)) == len(moves), moves
        assert all(m.startswith("[") and m.endswith("]") for m in moves)
    # the game's own reward pays an invalid move (a repeated guess) the last guess's closeness; reward "win" pays 0
    for reward, want in (("game", lambda r: 0.5 < r < 1.0), ("win", lambda r: r == 0.0)):
        env = envs.make("textarena", "train", 3, game="GuessTheNumber-v0", reward=reward)
        env.reset()
        first = env.expert_action()
        env.step(first)
        env.step(first)  # the same guess again: invalid (the game lets one pass)
        r = env.step(first)  # and again: the game over
        assert r.done and not r.info["success"] and want(r.reward), (reward, r)
    with pytest.raises(ValueError, match="reward 'nope': expected 'game'"):
        envs.make("textarena", "train", 0, game="GuessTheNumber-v0", reward="nope")
    env = envs.make("textarena", "test", 0, game="GuessTheNumber-v0")
    env.reset()
    with pytest.raises(ValueError, match="no expert on the test split"):
        env.expert_action()
    env = envs.make("textarena", "train", 0, game="TowerOfHanoi-v0")
    env.reset()
    with pytest.raises(ValueError, match="no scripted expert for 'TowerOfHanoi-v0'; games with one: GuessTheNumber"):
        env.expert_action()


def test_has_expert_answers_for_the_runs_kwargs_without_building_an_episode(tmp_path, monkeypatch):
    """`Env.has_expert(**kwargs)`, which start-up asks of `--algo sft`: a dataset env has an expert where its file's
    rows carry solutions (found, or named with solution_key), a textarena env where its game has a scripted player
    (every variant of GuessTheNumber); with no kwargs, both kinds can have one. No episode is built to answer."""
    from envs.ecosystem.arena import TextArenaEnv
    from envs.ecosystem.dataset import DatasetEnv

    worked = _jsonl(
        tmp_path / "worked.jsonl", [{"question": f"q{i}", "answer": f"{i} = {i}\n#### {i}"} for i in range(8)]
    )
    bare = _jsonl(tmp_path / "bare.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(8)])

    def no_episode(*a, **k):
        raise AssertionError("has_expert built an episode")

    monkeypatch.setattr(DatasetEnv, "__init__", no_episode)
    monkeypatch.setattr(TextArenaEnv, "__init__", no_episode)
    assert envs.has_expert("dataset") and envs.has_expert("textarena")
    assert envs.has_expert("dataset", data_path=worked, reward="math", system_prompt="Think.")
    assert not envs.has_expert("dataset", data_path=bare)
    assert envs.has_expert("dataset", data_path=bare, solution_key="answer")  # named: the bare answer is its reply
    why = envs.env_class("dataset").expert_refusal(data_path=bare)
    assert why.startswith(f"{bare}: no solution column to demonstrate") and why.endswith(
        "columns found: question, answer"
    )
    for game in ("GuessTheNumber-v0", "GuessTheNumber-v0-hardcore", "GuessTheNumber-v0-train"):
        assert envs.has_expert("textarena", game=game), game
    assert not envs.has_expert("textarena", game="TowerOfHanoi-v0")
    assert envs.env_class("textarena").expert_refusal(game="TowerOfHanoi-v0") == (
        "textarena: no scripted expert for 'TowerOfHanoi-v0'; games with one: GuessTheNumber-v0, "
        "GuessTheNumber-v0-hardcore"
    )


def test_textarena_game_plays_to_its_end_and_an_invalid_move_is_an_observation():
    results = _guess(envs.make("textarena", "train", 3, game="GuessTheNumber-v0"))
    assert results[-1].reward == 1.0 and results[-1].info["success"] and results[-1].observations == []
    assert all(r.reward == 0.0 and not r.done and r.observations[0]["role"] == "user" for r in results[:-1])
    env = envs.make("textarena", "train", 3, game="GuessTheNumber-v0")
    opening = env.reset()
    assert opening[0]["role"] == "user" and "Guess The Number" in opening[0]["content"]
    bad = env.step("hello")
    assert not bad.done and "invalid move" in bad.observations[0]["content"]
    assert "hello" not in bad.observations[0]["content"]  # the game's echo of the move is not repeated
    for junk in MALFORMED:
        r = envs.make("textarena", "train", 3, game="GuessTheNumber-v0")
        r.reset()
        assert r.step(junk).reward == 0.0


@pytest.mark.parametrize(
    ("game", "why"),
    [
        ("Wordle-v0", "nltk download"),
        ("Debate-v0", "API key"),
        ("Nope-v0", "unknown game 'Nope-v0'; single-player games here: 2048-v0"),
    ],
)
def test_textarena_refuses_a_game_it_cannot_play_in_one_line(game, why):
    with pytest.raises(ValueError, match=why) as e:
        envs.make("textarena", game=game)
    assert "\n" not in str(e.value)


def _skyrl_rows(tmp_path, cls="gsm8k", n=30):
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}? End with #### N"}],
            "env_class": cls,
            "reward_spec": {"method": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i, "max_turns": 3},
        }
        for i in range(n)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / f"{cls}.parquet")
    return str(tmp_path / f"{cls}.parquet")


def test_skyrl_gym_gsm8k_rows_get_skyrls_own_reward(tmp_path):
    path = _skyrl_rows(tmp_path)
    env = envs.make("skyrl_gym", "train", 2, data_path=path)
    gt = env.row["reward_spec"]["ground_truth"]
    assert env.reset() == env.task.prompt and env.max_turns == 1
    r = env.step(f"so #### {gt}")
    assert r.reward == 1.0 and r.done and r.info["success"] and r.info["env_class"] == "gsm8k"
    assert env.step(f"#### {int(gt) + 1}").reward == 0.0
    for bad in MALFORMED:
        assert env.step(bad).reward == 0.0
    with pytest.raises(DataError, match="unknown env class 'nope'; registered: .*gsm8k_multi_turn"):
        envs.make("skyrl_gym", data_path=path, env_class="nope")


def test_skyrl_gym_multi_turn_plays_through_nanosky_loop_with_exact_masks(tmp_path, tok):
    from nanosky.agent import AgentRunner, EnvTask, GenerationResult
    from nanosky.rollout.chat import encode, observation_ids, prompt_ids

    path = _skyrl_rows(tmp_path, "gsm8k_multi_turn")
    env = envs.make("skyrl_gym", "train", 4, data_path=path)
    gt = env.row["reward_spec"]["ground_truth"]
    replies = ["let me think", f"#### {int(gt) + 1}", f"#### {gt}"]

    class Script:
        async def aclose(self):
            pass

        async def generate(self, req):
            text = replies[sum(m["role"] == "assistant" for m in req.messages)]
            ids = encode(tok, text) + [tok.eos_token_id]
            await asyncio.sleep(0)
            return GenerationResult(text, ids, [-0.5] * len(ids), "stop", 0, len(ids))

    [t] = AgentRunner(Script(), tok=tok, max_tokens_per_turn=32).run([EnvTask(env)])
    assert t.turns == 3 and t.stop_reason == "done" and t.success
    assert t.reward == pytest.approx(1.0 + 0.2 / 3)  # SkyRL's per-turn rewards: format score, then the answer
    # the exact sequence: prompt, then each reply (mask 1) and each observation the env returned (mask 0)
    want_ids, want_mask = prompt_ids(tok, t.messages[:1]), None
    want_mask = [0] * len(want_ids)
    for k, reply in enumerate(replies):
        ids = encode(tok, reply) + [tok.eos_token_id]
        want_ids, want_mask = want_ids + ids, want_mask + [1] * len(ids)
        if k < 2:
            obs = observation_ids(tok, t.messages[: 2 + 2 * k], [t.messages[2 + 2 * k]], None)
            want_ids, want_mask = want_ids + obs, want_mask + [0] * len(obs)
    assert t.ids == want_ids and t.loss_mask == want_mask
    assert [m["role"] for m in t.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert "tentative numeric answer" in t.messages[2]["content"]


def test_a_row_whose_prompt_cannot_fit_is_skipped_and_counted(tmp_path, tok):
    from nanosky.agent import AgentRunner, EnvTask

    rows = [{"question": ("word " * 300 if i % 2 else "") + f"q{i}?", "answer": str(i)} for i in range(40)]
    path = _jsonl(tmp_path / "rows.jsonl", rows)

    class Never:
        calls = 0

        async def aclose(self):
            pass

        async def generate(self, req):
            from nanosky.agent import GenerationResult

            Never.calls += 1
            return GenerationResult("\\boxed{0}", [tok.eos_token_id], [-0.1], "stop", 0, 1)

    tasks = [EnvTask(envs.make("dataset", "train", s, data_path=path)) for s in range(8)]
    trajs = AgentRunner(Never(), tok=tok, max_tokens_per_turn=16, max_total_tokens=200).run(tasks)
    long = [t for t, task in zip(trajs, tasks) if "word" in task.env.task.prompt[0]["content"]]
    assert long and all(t.stop_reason == "prompt_too_long" and t.success is None and t.turns == 0 for t in long)
    assert all(t.loss_mask == [0] * len(t.ids) for t in long)  # nothing of it is trained
    assert Never.calls == len(trajs) - len(long)  # the others were sampled and graded


def test_skyrl_gym_lcb_runs_the_models_code_in_the_sandbox(tmp_path):
    from envs.tools.sandbox import run_sandboxed

    tests = [{"input": f"{n}\n", "output": f"{2 * n}\n", "testtype": "stdin"} for n in (3, 7)]
    row = {
        "prompt": [{"role": "user", "content": "Read n, print 2n."}],
        "env_class": "lcb",
        "reward_spec": {"method": "rule", "ground_truth": json.dumps(tests)},
    }
    pd.DataFrame(
        [row | {"prompt": [{"role": "user", "content": f"Read n, print 2n. ({i})"}]} for i in range(4)]
    ).to_parquet(tmp_path / "lcb.parquet")
    env = envs.make("skyrl_gym", "train", 0, data_path=str(tmp_path / "lcb.parquet"))
    assert env.sandboxed
    env.reset()
    assert env.step("```python\nn = int(input())\nprint(2 * n)\n```").reward == 1.0
    assert env.step("```python\nn = int(input())\nprint(n)\n```").reward == 0.0
    assert env.step("no code here").reward == 0.0
    import socket

    server = socket.create_server(("127.0.0.1", 0))  # a host service the model's code must not reach
    port = server.getsockname()[1]
    reach = (
        f"```python\nimport socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    ok = 1\nexcept OSError:\n    ok = 2\nn = int(input())\nprint(ok * n)\n```"
    )
    r = env.step(reach)  # prints 2n only where the connection fails
    server.close()
    if run_sandboxed(["true"]).isolation == "namespaces":  # an empty network namespace: no loopback service
        assert r.reward == 1.0


def test_a_users_skyrl_env_registered_in_a_plugin_works(tmp_path, monkeypatch):
    from nanosky.config import import_plugins

    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1] / "scripts"))
    import_plugins(["my_skyrl_env"])  # what --plugins my_skyrl_env does
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Say w{i}."}],
            "env_class": "echo_twice",
            "reward_spec": {"ground_truth": f"w{i}"},
        }
        for i in range(6)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "mine.parquet")
    env = envs.make("skyrl_gym", "train", 1, data_path=str(tmp_path / "mine.parquet"))
    word = env.row["reward_spec"]["ground_truth"]
    assert env.max_turns == 2 and env.reset() == env.task.prompt
    first = env.step(word)
    assert first.observations == [{"role": "user", "content": "Again."}] and first.info["metadata"] == {"turn": 1}
    last = env.step(word)
    assert last.done and last.reward == 0.5 and first.reward + last.reward == 1.0


def test_reasoning_gym_weights_pick_the_tasks():
    picked = {
        envs.make("reasoning_gym", "train", s, tasks="basic_arithmetic,chain_sum", weights="0,1").task
        for s in range(30)
    }
    assert picked == {"chain_sum"}
    with pytest.raises(ValueError, match="weights: 2 non-negative numbers"):
        envs.make("reasoning_gym", tasks="basic_arithmetic,chain_sum", weights="1")
