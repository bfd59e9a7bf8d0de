"""The judge (`nanosky.judge`) against the scripted OpenAI-compatible server: scores tied to the right attempts,
clipped to [0, 1]; a malformed answer, a missing id, a timeout or a server error retried once, then only that group
masked; the key sent only in the header; calls concurrent under the limit."""

import asyncio
import json
import re
import threading
import time

import pytest

from evals.scripted import ScriptedServer
from nanosky.judge import Judge, judge_groups, rubric
from nanosky.judge.prompt import JudgeError, parse_group, parse_point

RUBRIC = rubric(None)
TASK = [{"role": "user", "content": "Say a number."}]


def _ids(messages) -> list[int]:
    return [int(i) for i in re.findall(r"<attempt id=(\d+)>", messages[-1]["content"])]


def _replies(messages) -> list[str]:
    return re.findall(r"<attempt id=\d+>\n(.*?)\n</attempt>", messages[-1]["content"], re.S)


def oracle(messages) -> str:
    """Scores each attempt by the number it says, / 10: a judge whose answers the test knows."""
    return json.dumps(
        {
            "scores": [
                {"trajectory_id": i, "explanation": f"said {r}", "score": int(r) / 10}
                for i, r in zip(_ids(messages), _replies(messages))
            ]
        }
    )


def _run(server_reply, groups, mode="group", **kw):
    with ScriptedServer(server_reply) as url:
        judge = Judge.server(url, "judge", key_env="TEST_JUDGE_KEY", timeout_s=kw.pop("timeout_s", 30), **kw)
        return asyncio.run(judge_groups(judge, groups, mode, RUBRIC)), judge


def test_group_scores_are_tied_to_their_attempts_and_clipped():
    verdicts, _ = _run(oracle, [(TASK, ["3", "7", "12"]), (TASK, ["0", "5"])])
    assert verdicts[0].scores == {0: 0.3, 1: 0.7, 2: 1.0}  # 1.2 clipped to 1
    assert verdicts[1].scores == {0: 0.0, 1: 0.5} and verdicts[1].explanations[1] == "said 5"
    assert all(v.error is None and v.calls == 1 for v in verdicts)


def test_pointwise_is_one_call_per_attempt():
    def point(messages):
        n = re.search(r"<attempt>\n(.*?)\n</attempt>", messages[-1]["content"], re.S).group(1)
        return f'Sure! ```json\n{{"explanation": "ok", "score": {int(n) / 10}}}\n```'  # prose around: tolerant

    verdicts, _ = _run(point, [(TASK, ["2", "9"])], mode="pointwise")
    assert verdicts[0].scores == {0: 0.2, 1: 0.9} and verdicts[0].calls == 2


@pytest.mark.parametrize(
    "bad",
    [
        "not json at all",
        '{"scores": [{"trajectory_id": 0, "explanation": "x", "score": 0.5}]}',  # id 1 missing
        '{"scores": [{"trajectory_id": 0, "explanation": "", "score": "high"}, {"trajectory_id": 1, "score": 1}]}',
    ],
)
def test_a_bad_answer_is_retried_once_then_masks_only_its_group(bad):
    calls = {"bad": 0}

    def reply(messages):
        if "BAD" in messages[-1]["content"]:
            calls["bad"] += 1
            return bad
        return oracle(messages)

    verdicts, _ = _run(reply, [(TASK, ["1", "2"]), ([{"role": "user", "content": "BAD"}], ["3", "4"])])
    assert verdicts[0].scores == {0: 0.1, 1: 0.2}
    assert verdicts[1].scores is None and verdicts[1].error and calls["bad"] == 2  # one retry


def test_a_timeout_masks_only_its_group():
    def reply(messages):
        if "SLOW" in messages[-1]["content"]:
            time.sleep(3)
        return oracle(messages)

    t0 = time.perf_counter()
    verdicts, _ = _run(reply, [(TASK, ["1"]), ([{"role": "user", "content": "SLOW"}], ["2"])], timeout_s=0.5)
    assert verdicts[0].scores == {0: 0.1} and verdicts[1].scores is None
    assert "no answer within 0.5 s" in verdicts[1].error and time.perf_counter() - t0 < 2.9  # two tries of 0.5 s


def test_the_key_goes_only_in_the_header_and_structured_outputs_are_asked(monkeypatch):
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-secret-123")
    seen = []

    async def chat(request):
        body = await request.json()
        seen.append((dict(request.headers), body))
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": oracle(body["messages"])}}]})

    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(app) as server:
            judge = Judge.server(str(server.make_url("/v1")), "judge", key_env="TEST_JUDGE_KEY")
            return judge, await judge_groups(judge, [(TASK, ["4"])], "group", RUBRIC)

    judge, verdicts = asyncio.run(go())
    headers, body = seen[0]
    assert verdicts[0].scores == {0: 0.4}
    assert headers["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in json.dumps(body) and "sk-secret" not in repr(vars(judge))
    assert body["temperature"] == 0.0 and body["response_format"]["type"] == "json_schema"
    # the bounded schema, as the self-judge's: its longest answer, spaces after separators included, fits the budget
    from nanosky.judge import SEPARATOR_SLACK
    from nanosky.judge.prompt import bounded_schema

    assert body["max_tokens"] == judge.max_tokens == 1024
    assert body["response_format"]["json_schema"]["schema"] == bounded_schema(1, 1024, slack=SEPARATOR_SLACK)
    assert "structured_outputs" not in body and set(body["response_format"]["json_schema"]) == {
        "name",
        "schema",
        "strict",
    }
    assert (
        judge.backend.constraint == "json_schema"
    )  # not a vLLM server (no /models owned by vllm): the standard constraint


def test_an_answer_cut_at_max_tokens_masks_its_group_with_the_reason():
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def chat(request):
        cut = {"role": "assistant", "content": '{"scores": [{"trajectory_id": 0, "explanation": "a very lo'}
        return web.json_response({"choices": [{"message": cut, "finish_reason": "length"}]})

    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(app) as server:
            judge = Judge.server(str(server.make_url("/v1")), "judge", max_tokens=300)
            return await judge_groups(judge, [(TASK, ["4"])], "group", RUBRIC)

    [v] = asyncio.run(go())
    assert v.scores is None and "ran past 300 tokens (--reward.judge-max-tokens)" in v.error


def test_calls_run_concurrently_under_the_limit():
    live, peak, lock = [0], [0], threading.Lock()

    def reply(messages):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.2)
        with lock:
            live[0] -= 1
        return oracle(messages)

    verdicts, _ = _run(reply, [(TASK, [str(i)]) for i in range(8)], concurrency=3)
    assert all(v.scores is not None for v in verdicts) and peak[0] == 3


def test_parsers_refuse_what_cannot_be_tied_to_an_attempt():
    with pytest.raises(JudgeError, match="unknown or repeated"):
        parse_group('{"scores": [{"trajectory_id": 0, "score": 1}, {"trajectory_id": 0, "score": 1}]}', [0, 1])
    with pytest.raises(JudgeError, match="unknown or repeated"):
        parse_group('{"scores": [{"trajectory_id": 5, "score": 1}]}', [0])
    with pytest.raises(JudgeError, match="finite"):
        parse_point('{"score": NaN}')
    assert parse_point('{"score": -3, "explanation": "bad"}') == (0.0, "bad")
    assert parse_group('{"scores": [{"trajectory_id": "1", "score": 0.5}]}', [1]) == {1: (0.5, "")}


def test_a_server_without_structured_outputs_is_asked_again_plainly():
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    bodies = []

    async def chat(request):
        body = await request.json()
        bodies.append(body)
        if "response_format" in body:
            return web.json_response({"error": {"message": "response_format is not supported"}}, status=400)
        text = "Here you go:\n" + oracle(body["messages"])  # prose around the JSON: parsed tolerantly
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": text}}]})

    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(app) as server:
            judge = Judge.server(str(server.make_url("/v1")), "judge", concurrency=1)
            return judge, await judge_groups(judge, [(TASK, ["6", "2"])] * 2, "group", RUBRIC)

    judge, verdicts = asyncio.run(go())
    assert [v.scores for v in verdicts] == [{0: 0.6, 1: 0.2}] * 2 and judge.backend.constraint == "plain"
    assert len(bodies) == 3  # asked once with the schema, then plainly from then on


@pytest.mark.parametrize("n", [None, 1, 3, 12])
def test_the_strict_schema_bounds_the_answer_and_ties_ids_to_positions(n):
    """The self-judge's schema, through xgrammar (vLLM's backend): its longest answer is `answer_chars` long and
    accepted, one character more is not, ids out of place or scores out of [0, 1] are not; so a budget of
    `explanation_chars` always fits the answer."""
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from nanosky.judge.prompt import EXPLANATION_MAX, answer_chars, explanation_chars, strict_schema

    g = xgrammar.Grammar.from_json_schema(json.dumps(strict_schema(n, 10)), any_whitespace=False)
    one = '{"trajectory_id": %d, "explanation": "%s", "score": %s}'
    worst = (
        '{"explanation": "%s", "score": 0.000001}' % ("~" * 10)
        if n is None
        else '{"scores": [' + ", ".join(one % (k, "a!#[]" * 2, "0.000001") for k in range(n)) + "]}"
    )
    assert accepts(g, worst) and len(worst) == answer_chars(n, 10)
    expl = "~" * 10 if n is None else "a!#[]" * 2
    assert not accepts(g, worst.replace(expl, "x" * 11, 1))
    assert not accepts(g, worst.replace(expl, 'ab\\"cd', 1))  # valid JSON, but an escape costs more than a token
    assert not accepts(g, worst.replace("0.000001", "1.5", 1)) and not accepts(g, worst.replace("0.000001", "-0.1", 1))
    if n and n > 1:
        assert not accepts(g, worst.replace('"trajectory_id": 1,', '"trajectory_id": 0,'))
        assert parse_group(worst, list(range(n)))[n - 1][0] == pytest.approx(1e-6)
    for budget in (200, 640, 1024):
        c = explanation_chars(n, budget)
        if 0 <= c < EXPLANATION_MAX:
            assert answer_chars(n, c) + 1 <= budget < answer_chars(n, c + 1) + 1  # the most that fits
        assert c <= EXPLANATION_MAX and (c < 0 or answer_chars(n, c) + 1 <= budget)


def test_the_longest_strict_schema_compiles_against_a_real_vocabulary(tiny_path):
    """vLLM compiles the schema with the model's tokenizer (xgrammar fails on a pattern repeated over 128 times)."""
    import xgrammar
    from transformers import AutoTokenizer

    from nanosky.judge.prompt import EXPLANATION_MAX, explanation_chars, strict_schema

    tok = AutoTokenizer.from_pretrained(tiny_path)
    comp = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)))
    for n in (None, 8):
        chars = explanation_chars(n, 100_000)
        assert chars == EXPLANATION_MAX
        comp.compile_json_schema(json.dumps(strict_schema(n, chars)), any_whitespace=False, separators=(",", ":"))


def test_a_vllm_server_is_asked_by_regex_and_one_that_refuses_it_by_schema():
    """A server whose /models say vLLM gets the bounded answer as one regex over compact JSON; refused, the same call
    goes again under `response_format`, and later calls start there (the backend's constraint, found once)."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from nanosky.judge import SEPARATOR_SLACK
    from nanosky.judge.prompt import bounded_chars, strict_regex

    bodies = []

    async def models(request):
        return web.json_response({"data": [{"id": "judge", "owned_by": "vllm"}]})

    async def chat(request):
        body = await request.json()
        bodies.append(body)
        if "structured_outputs" in body:
            return web.json_response({"error": {"message": "structured_outputs: regex not supported"}}, status=400)
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": oracle(body["messages"])}}]})

    async def go():
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(app) as server:
            judge = Judge.server(str(server.make_url("/v1")), "judge", max_tokens=400, concurrency=1)
            return judge, await judge_groups(judge, [(TASK, ["3", "8"])] * 2, "group", RUBRIC)

    judge, verdicts = asyncio.run(go())
    assert [v.scores for v in verdicts] == [{0: 0.3, 1: 0.8}] * 2 and judge.backend.constraint == "json_schema"
    assert bodies[0]["structured_outputs"] == {"regex": strict_regex(2, bounded_chars(2, 400, slack=SEPARATOR_SLACK))}
    assert [("structured_outputs" in b, "response_format" in b) for b in bodies] == [
        (True, False),
        (False, True),
        (False, True),
    ]
