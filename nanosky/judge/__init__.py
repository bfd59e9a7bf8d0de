"""Rewards from a model: a judge scores trajectories against a rubric, a whole group per call (RULER-style: the
attempts side by side, the shared task once) or one trajectory per call, through any OpenAI-compatible server.

    judge = HTTPJudge(url, model="judge", key_env="NANOSKY_JUDGE_KEY", timeout_s=60)
    verdicts = asyncio.run(judge_groups(judge, [(task_messages, [reply_0, reply_1, ...]), ...], "group", rubric_text))
    verdicts[0].scores        # {0: 0.8, 1: 0.1, ...} in [0, 1], tied to the attempt ids; None: the group is masked

A call that times out, fails, or answers with malformed JSON or a missing id is retried once; then its group is
masked (no scores: the trainer gives it no gradient and counts it in judge/errors), and the others go on. The
calls run concurrently under a limit. The answer is constrained to the bounded schema (`prompt.bounded_schema`: every
id once, explanations short enough that the longest answer fits `max_tokens`) where the server supports
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
    variable `key_env` at each call and sent only in the Authorization header: never logged, never in a config.

    Each answer is bounded to fit `max_tokens` (sent with the call), by the strongest constraint the server takes:
    - `regex`: a vLLM server (its /models say `owned_by: vllm`) gets the bounded schema as one regular expression
      over compact JSON (`prompt.strict_regex`, vLLM's `structured_outputs`): its JSON mode would let the model
      write whitespace between tokens without end;
    - `json_schema`: any other server gets the bounded schema as `response_format`;
    - `plain`: a server that refused both is asked plainly from then on, the answer parsed tolerantly."""

    def __init__(
        self, url: str, model: str, key_env: str = "NANOSKY_JUDGE_KEY", timeout_s: float = 120.0, max_tokens: int = 1024
    ):
        self.url, self.model, self.key_env, self.timeout_s = url.rstrip("/"), model, key_env, timeout_s
        self.max_tokens = max_tokens
        self.mode: str | None = None  # "regex" | "json_schema" | "plain", found at the first call
        self._http = None  # the session of the calls in flight (`session()`)

    @property
    def structured(self) -> bool:
        """Whether answers are constrained (False once the server refused every constraint)."""
        return self.mode != "plain"

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

    def schema(self, n: int | None) -> dict:
        """What a group of `n` attempts (None: one) is asked under: the bounded schema (a space allowed after each
        separator), with its size for the regex; the loose schema once the server refused constraints."""
        if not self.structured:
            return GROUP_SCHEMA if n is not None else POINT_SCHEMA
        chars = bounded_chars(n, self.max_tokens, slack=SEPARATOR_SLACK)
        return strict_schema(n, chars) | {"x-nanosky": {"n": n, "chars": chars}}  # (the regex's size, never sent)

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if key := os.environ.get(self.key_env):
            headers["Authorization"] = f"Bearer {key}"
        return headers

    async def _find_mode(self) -> None:
        """vLLM's server (regex) or another (json_schema), from its /models."""
        try:
            async with self._http.get(f"{self.url}/models", headers=self._headers()) as r:
                models = (await r.json(content_type=None)).get("data", []) if r.status == 200 else []
        except (OSError, ValueError, AttributeError, asyncio.TimeoutError):
            models = []
        owners = {m.get("owned_by") for m in models if isinstance(m, dict)}
        self.mode = "regex" if "vllm" in owners else "json_schema"

    async def __call__(self, messages: list[dict], schema: dict) -> str:
        if self._http is None:  # a call on its own
            async with self.session():
                return await self(messages, schema)
        if self.mode is None:
            await self._find_mode()
        size = schema.get("x-nanosky")
        body = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": self.max_tokens}
        if size and self.mode == "regex":
            body["structured_outputs"] = {"regex": strict_regex(size["n"], size["chars"])}
        elif size and self.mode == "json_schema":
            strict = {k: v for k, v in schema.items() if k != "x-nanosky"}
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "judgement", "schema": strict, "strict": True},
            }
        async with self._http.post(f"{self.url}/chat/completions", json=body, headers=self._headers()) as r:
            if r.status == 400 and size and self.mode != "plain":
                text = await r.text()
                if any(k in text for k in ("structured_outputs", "response_format", "regex", "schema")):
                    # a constraint this server refuses: the next weaker one, for this call and the rest
                    self.mode = "json_schema" if self.mode == "regex" else "plain"
                    return await self(messages, schema if self.structured else self.schema(size["n"]))
            if r.status != 200:
                raise JudgeError(f"the judge server answered HTTP {r.status}: {(await r.text())[:200]}")
            data = await r.json(content_type=None)
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"not a chat completion: {str(data)[:200]}") from None
        if choice.get("finish_reason") == "length":
            raise JudgeError(f"the judge's answer ran past {self.max_tokens} tokens (--reward.judge-max-tokens)")
        return text


async def _retry(fn: Callable[[], Awaitable], tries: int = 2):
    """fn() up to `tries` times; the last error is raised. Returns (result, calls)."""
    for k in range(tries):
        try:
            return await fn(), k + 1
        except (JudgeError, asyncio.TimeoutError, OSError) as e:  # aiohttp's errors are OSErrors
            if k == tries - 1:
                raise JudgeError(f"{type(e).__name__}: {e}") from None
    raise AssertionError("unreachable")


async def judge_group(call: Call, mode: str, task: list[dict], attempts: list[str], rubric_text: str) -> Verdict:
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
                *(_retry(lambda a=a: _point_once(call, point_messages(task, a, rubric_text), schema)) for a in attempts)
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


async def _group_once(call: Call, msgs: list[dict], schema: dict, ids: list[int]) -> dict[int, tuple[float, str]]:
    return parse_group(await call(msgs, schema), ids)


async def _point_once(call: Call, msgs: list[dict], schema: dict) -> tuple[float, str]:
    return parse_point(await call(msgs, schema))


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
