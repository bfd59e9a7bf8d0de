"""The judge over HTTP against a real vLLM OpenAI server (`python -m vllm.entrypoints.openai.api_server`, what
`vllm serve` runs), serving the bundled tiny model as a new user would: the bounded schema goes to the server as
to the self-judge, so at temperature 0 every answer parses and no group is masked, pointwise and in group mode.
(Failures, refusals of structured outputs and retries are tested against scripted servers in tests/unit/test_judge.py.)"""

import asyncio

import pytest

from nanosky.agent.serve import local_vllm_server
from nanosky.bundled import resolve_model_path
from nanosky.judge import Judge, judge_groups

RUBRIC = "Score each attempt from 0 (bad) to 1 (good)."
TASKS = ["What is 2 + 3?", "Name a colour.", "Say hello in French."]
REPLIES = ["<answer>5</answer>", "blue", "I think it is 6", "Bonjour!"]


@pytest.fixture(scope="module")
def server():
    path = resolve_model_path("tiny")
    with local_vllm_server(path, max_model_len=512) as url:
        yield url, path


@pytest.mark.parametrize(("mode", "n", "max_tokens"), [("pointwise", 2, 100), ("group", 3, 320)])
def test_every_answer_parses_and_no_group_is_masked(server, mode, n, max_tokens):
    url, model = server
    judge = Judge.server(url, model, max_tokens=max_tokens, timeout_s=120)
    groups = [
        ([{"role": "user", "content": q}], [REPLIES[(g + k) % len(REPLIES)] for k in range(n)])
        for g, q in enumerate(TASKS)
    ]
    verdicts = asyncio.run(judge_groups(judge, groups, mode, RUBRIC))
    assert judge.backend.constraint == "regex"  # a vLLM server: the bounded answer as one regex over compact JSON
    for v in verdicts:
        assert v.scores is not None, v.error
        assert sorted(v.scores) == list(range(n)) and all(0.0 <= s <= 1.0 for s in v.scores.values())
        assert v.calls == (n if mode == "pointwise" else 1)  # first try, no retry
