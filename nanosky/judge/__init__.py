"""Rewards from a model: a judge scores trajectories against a rubric, a whole group per call (RULER-style: the
attempts side by side, the shared task once) or one trajectory per call, through any OpenAI-compatible server.

    judge = HTTPJudge(url, model="judge", key_env="NANOSKY_JUDGE_KEY", timeout_s=60)
    verdicts = asyncio.run(judge_groups(judge, [(task_messages, [reply_0, reply_1, ...]), ...], "group", rubric_text))
    verdicts[0].scores        # {0: 0.8, 1: 0.1, ...} in [0, 1], tied to the attempt ids; None: the group is masked

A call that times out, fails, or answers with malformed JSON or a missing id is retried once; then its group is
masked (no scores: the trainer gives it no gradient and counts it in judge/errors), and the others go on. The
calls run concurrently under a limit. The answer is constrained to the bounded schema (`prompt.strict_schema`: every
id once, explanations short enough that the longest answer fits `max_tokens`) where the server takes a constraint
(vLLM does), and parsed tolerantly where it does not (`prompt.loads`). The HTTP calls are the agents' own client's
(`nanosky.agent.backends.OpenAIBackend`): one client for one protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from nanosky.judge.prompt import (
    JudgeError,
    bounded_chars,
    group_messages,
    parse_group,
    parse_point,
    point_messages,
    rubric,
    strict_regex,
    strict_schema,
)

__all__ = ["HTTPJudge", "JudgeError", "Verdict", "judge_groups", "rubric"]

SEPARATOR_SLACK = 8
"""Tokens an entry of a judgement may spend on spaces after its separators: a server's structured outputs (vLLM's
default) may put one after each ':' and ','; the engine's own (`self`) never does."""
Call = Callable[[list[dict], int | None], Awaitable[str]]
"""A judge: (messages, the number of attempts judged, None for one) -> the answer's text. A judge that can
constrain its answer does so to the bounded schema of that size (`prompt.strict_schema`)."""


@dataclass
class Verdict:
    """One group's judgement: a score in [0, 1] and an explanation per attempt id, or none (masked) with why."""

    scores: dict[int, float] | None
    explanations: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    latency_s: float = 0.0
    calls: int = 0
    version: int | None = None  # the weight version that judged it (the self-judge)


class HTTPJudge:
    """An OpenAI-compatible chat server as a judge, at temperature 0, through the agents' own client
    (`OpenAIBackend`: its connection pool, timeouts and error parsing). The API key is read from the environment
    variable `key_env` each time a session opens and sent only in the Authorization header: never logged, never in
    a config.

    Each answer is bounded to fit `max_tokens` (sent with the call): the backend asks a vLLM server for the bounded
    schema as one regular expression over compact JSON (`prompt.strict_regex`), any other server for the schema as
    `response_format`, and a server that refused both plainly from then on (the answer parsed tolerantly)."""

    def __init__(
        self, url: str, model: str, key_env: str = "NANOSKY_JUDGE_KEY", timeout_s: float = 120.0, max_tokens: int = 1024
    ):
        from nanosky.agent.backends import OpenAIBackend

        # no retries inside: a failed call is the judge's to retry once (`_retry`), as a malformed answer is
        self.backend = OpenAIBackend(url, model, api_key=None, timeout_s=timeout_s, max_retries=0, key_env=key_env)
        self.max_tokens = max_tokens

    @property
    def mode(self) -> str | None:
        """How answers are constrained: "regex" | "json_schema" | "plain", found at the first call."""
        return self.backend.constraint

    @property
    def structured(self) -> bool:
        """Whether answers are constrained (False once the server refused every constraint)."""
        return self.mode != "plain"

    @contextlib.asynccontextmanager
    async def session(self):
        """One HTTP client for a batch of calls (a step's), its connections kept alive between them."""
        try:
            yield self
        finally:
            await self.backend.aclose()

    async def __call__(self, messages: list[dict], n: int | None) -> str:
        from nanosky.agent.backends import BackendError, Request

        # the bounded schema, a space allowed after each separator (a server's JSON mode may write one)
        chars = bounded_chars(n, self.max_tokens, slack=SEPARATOR_SLACK)
        req = Request(
            messages,
            tools=None,
            max_tokens=self.max_tokens,
            temperature=0.0,
            json_schema=strict_schema(n, chars),
            json_regex=strict_regex(n, chars),
        )
        try:
            out = await self.backend.generate(req)
        except BackendError as e:
            raise JudgeError(f"the judge server: {e}") from None
        if out.finish_reason == "length":
            raise JudgeError(f"the judge's answer ran past {self.max_tokens} tokens (--reward.judge-max-tokens)")
        return out.text


async def _retry(fn: Callable[[], Awaitable], tries: int = 2):
    """fn() up to `tries` times; the last error is raised. Returns (result, calls)."""
    for k in range(tries):
        try:
            return await fn(), k + 1
        except (JudgeError, asyncio.TimeoutError, OSError) as e:
            if k == tries - 1:
                raise JudgeError(f"{type(e).__name__}: {e}") from None
    raise AssertionError("unreachable")


async def judge_group(call: Call, mode: str, task: list[dict], attempts: list[str], rubric_text: str) -> Verdict:
    """One group: one call (group mode) or one per attempt (pointwise), each retried once; any failure masks it."""
    t0, ids = time.perf_counter(), list(range(len(attempts)))
    try:
        if mode == "group":
            msgs = group_messages(task, attempts, rubric_text)
            got, calls = await _retry(lambda: _group_once(call, msgs, ids))
        elif mode == "pointwise":
            results = await asyncio.gather(
                *(_retry(lambda a=a: _point_once(call, point_messages(task, a, rubric_text))) for a in attempts)
            )
            got, calls = dict(zip(ids, (r for r, _ in results))), sum(c for _, c in results)
        else:
            raise ValueError(f"judge mode must be 'group' or 'pointwise', got {mode!r}")
    except JudgeError as e:
        return Verdict(None, error=str(e), latency_s=time.perf_counter() - t0)
    return Verdict(
        {i: s for i, (s, _) in got.items()},
        {i: x for i, (_, x) in got.items()},
        latency_s=time.perf_counter() - t0,
        calls=calls,
    )


async def _group_once(call: Call, msgs: list[dict], ids: list[int]) -> dict[int, tuple[float, str]]:
    return parse_group(await call(msgs, len(ids)), ids)


async def _point_once(call: Call, msgs: list[dict]) -> tuple[float, str]:
    return parse_point(await call(msgs, None))


async def judge_groups(
    call: Call,
    groups: list[tuple[list[dict], list[str]]],
    mode: str,
    rubric_text: str,
    concurrency: int = 8,
    timeout_s: float | None = None,
) -> list[Verdict]:
    """Every group's verdict, in order; at most `concurrency` groups judged at once, each within `timeout_s`."""
    gate = asyncio.Semaphore(concurrency)

    async def one(task, attempts) -> Verdict:
        async with gate:
            try:
                return await asyncio.wait_for(judge_group(call, mode, task, attempts, rubric_text), timeout_s)
            except asyncio.TimeoutError:
                return Verdict(None, error=f"the group's judgement took over {timeout_s} s")

    opened = getattr(call, "session", None)  # an HTTP judge: one session for all of them
    async with opened() if opened else contextlib.nullcontext():
        return list(await asyncio.gather(*(one(t, a) for t, a in groups)))
