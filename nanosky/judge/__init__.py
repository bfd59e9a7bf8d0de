"""Rewards from a model: a judge scores trajectories against a rubric, a whole group per call (RULER-style: the
attempts side by side, the shared task once) or one trajectory per call, through any OpenAI-compatible server.

    judge = HTTPJudge(url, model="judge", key_env="NANOSKY_JUDGE_KEY", timeout_s=60)
    verdicts = asyncio.run(judge_groups(judge, [(task_messages, [reply_0, reply_1, ...]), ...], "group", rubric_text))
    verdicts[0].scores        # {0: 0.8, 1: 0.1, ...} in [0, 1], tied to the attempt ids; None: the group is masked

A call that times out, fails, or answers with malformed JSON or a missing id is retried once; then its group is
masked (no scores: the trainer gives it no gradient and counts it in judge/errors), and the others go on. The
calls run concurrently under a limit. The answer is constrained to a JSON schema where the server supports
`response_format` (vLLM does), and parsed tolerantly where it does not (`prompt.loads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from nanosky.judge.prompt import (
    GROUP_SCHEMA,
    POINT_SCHEMA,
    JudgeError,
    group_messages,
    parse_group,
    parse_point,
    point_messages,
    rubric,
)

__all__ = ["HTTPJudge", "JudgeError", "Verdict", "judge_groups", "rubric"]

Call = Callable[[list[dict], dict], Awaitable[str]]
"""A judge: (messages, JSON schema) -> the answer's text."""


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
    """An OpenAI-compatible chat server as a judge, at temperature 0. The API key is read from the environment
    variable `key_env` at each call and sent only in the Authorization header: never logged, never in a config."""

    def __init__(self, url: str, model: str, key_env: str = "NANOSKY_JUDGE_KEY", timeout_s: float = 120.0):
        self.url, self.model, self.key_env, self.timeout_s = url.rstrip("/"), model, key_env, timeout_s
        self.structured = (
            True  # False once the server refused response_format: plain answers, parsed tolerantly
        )
        self._http = None  # the session of the calls in flight (`session()`)

    @contextlib.asynccontextmanager
    async def session(self):
        """One HTTP session for a batch of calls (a step's), its connections kept alive between them."""
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as s:
            self._http = s
            try:
                yield self
            finally:
                self._http = None

    async def __call__(self, messages: list[dict], schema: dict) -> str:
        if self._http is None:  # a call on its own
            async with self.session():
                return await self(messages, schema)
        headers = {"Content-Type": "application/json"}
        if key := os.environ.get(self.key_env):
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": self.model, "messages": messages, "temperature": 0.0}
        if self.structured:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "judgement", "schema": schema, "strict": True},
            }
        async with self._http.post(f"{self.url}/chat/completions", json=body, headers=headers) as r:
            if r.status == 400 and self.structured and "response_format" in await r.text():
                self.structured = False  # this server has no structured outputs: ask again without
                return await self(messages, schema)
            if r.status != 200:
                raise JudgeError(f"the judge server answered HTTP {r.status}: {(await r.text())[:200]}")
            data = await r.json(content_type=None)
        try:
            return data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"not a chat completion: {str(data)[:200]}") from None


async def _retry(fn: Callable[[], Awaitable], tries: int = 2):
    """fn() up to `tries` times; the last error is raised. Returns (result, calls)."""
    for k in range(tries):
        try:
            return await fn(), k + 1
        except (JudgeError, asyncio.TimeoutError, OSError) as e:  # aiohttp's errors are OSErrors
            if k == tries - 1:
                raise JudgeError(f"{type(e).__name__}: {e}") from None
    raise AssertionError("unreachable")


async def judge_group(
    call: Call, mode: str, task: list[dict], attempts: list[str], rubric_text: str
) -> Verdict:
    """One group: one call (group mode) or one per attempt (pointwise), each retried once; any failure masks it. A
    judge with its own `schema(n)` (the self-judge's strict one) is asked with that, others with the loose one."""
    t0, ids = time.perf_counter(), list(range(len(attempts)))
    own = getattr(call, "schema", None)
    try:
        if mode == "group":
            msgs, schema = group_messages(task, attempts, rubric_text), own(len(ids)) if own else GROUP_SCHEMA
            got, calls = await _retry(lambda: _group_once(call, msgs, schema, ids))
        elif mode == "pointwise":
            schema = own(None) if own else POINT_SCHEMA
            results = await asyncio.gather(
                *(
                    _retry(lambda a=a: _point_once(call, point_messages(task, a, rubric_text), schema))
                    for a in attempts
                )
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


async def _group_once(
    call: Call, msgs: list[dict], schema: dict, ids: list[int]
) -> dict[int, tuple[float, str]]:
    return parse_group(await call(msgs, schema), ids)


async def _point_once(call: Call, msgs: list[dict], schema: dict) -> tuple[float, str]:
    return parse_point(await call(msgs, schema))


async def judge_groups(
    call: Call, groups: list[tuple[list[dict], list[str]]], mode: str, rubric_text: str, concurrency: int = 8,
    timeout_s: float | None = None,
) -> list[Verdict]:  # fmt: skip
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
