"""Rewards from a model: a judge scores trajectories against a rubric, a whole group per call (RULER-style: the
attempts side by side, the shared task once) or one trajectory per call, over a backend: any OpenAI-compatible
server (`Judge.server`), or the run's own engine (`Judge.engine`, `--reward.judge-url self`).

    judge = Judge.server(url, model="judge", key_env="NANOSKY_JUDGE_KEY", timeout_s=60)
    verdicts = asyncio.run(judge_groups(judge, [(task_messages, [reply_0, reply_1, ...]), ...], "group", rubric_text))
    verdicts[0].scores        # {0: 0.8, 1: 0.1, ...} in [0, 1], tied to the attempt ids; None: the group is masked

A call that times out, fails, or answers with malformed JSON or a missing id is retried once; then its group is
masked (no scores: the trainer gives it no gradient and counts it in judge/errors), and the others go on. The
calls run concurrently under the judge's limit. The answer is constrained to the bounded schema
(`prompt.strict_schema`: every id once, explanations short enough that the longest answer fits `max_tokens`) where
the backend takes a constraint (the engine and vLLM do), and parsed tolerantly where it does not (`prompt.loads`).
The calls are the agents' own (`nanosky.agent.backends`): one client for one protocol, one engine for the run.

The run's engine as the judge: between the rollout and the update, the policy reads the rubric and scores its own
attempts, greedily, under the strict schema with no free whitespace. Its longest answer fits the token budget, so
at temperature 0 every answer parses; only a prompt that leaves the answer too little room fails (its group is
masked, like any judge error). Self-judging can be gamed: see docs/judge.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nanosky.agent.backends import Backend, BackendError, EngineBackend, OpenAIBackend, Request
from nanosky.config.reward import RewardConfig
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
from nanosky.rollout.chat import prompt_ids

__all__ = ["Judge", "JudgeError", "TokenIn", "Verdict", "judge_groups", "rubric"]

SEPARATOR_SLACK = 8
"""Tokens an entry of a judgement may spend on spaces after its separators: a server's structured outputs (vLLM's
default) may put one after each ':' and ','; the engine's own (`self`) never does."""


@dataclass
class Verdict:
    """One group's judgement: a score in [0, 1] and an explanation per attempt id, or none (masked) with why."""

    scores: dict[int, float] | None
    explanations: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    latency_s: float = 0.0
    calls: int = 0
    version: int | None = None  # the weight version that judged it (the run's engine; None for a server)


@dataclass(frozen=True)
class TokenIn:
    """A backend that samples from prompt ids (the run's engine): the judge renders them with `tok`, as every
    prompt of the run is rendered, and refuses a prompt that leaves its answer too little of `max_model_len`."""

    tok: Any
    max_model_len: int


class Judge:
    """A judge over a backend (`nanosky.agent.backends.Backend`): asked at temperature 0, each answer bounded to
    the strict schema of the group's size with explanations short enough to fit `max_tokens` (sent with the call).
    A server may put a space after each separator (`SEPARATOR_SLACK` tokens an entry); the engine writes none.

    `concurrency`: groups judged at once (None: all of them, for an engine that batches them). `token_in`: how to
    render a prompt for a backend that takes ids (None: the backend renders `messages` itself, as a server does).
    A server's backend chooses the constraint's form itself (`OpenAIBackend.constraint`)."""

    def __init__(
        self, backend: Backend, max_tokens: int = 1024, *, concurrency: int | None = 8, token_in: TokenIn | None = None
    ):
        self.backend, self.max_tokens, self.concurrency, self.token_in = backend, max_tokens, concurrency, token_in
        self.slack = 0 if token_in is not None else SEPARATOR_SLACK

    @classmethod
    def server(
        cls,
        url: str,
        model: str | None,
        *,
        key_env: str = "NANOSKY_JUDGE_KEY",
        timeout_s: float = 120.0,
        max_tokens: int = 1024,
        concurrency: int = 8,
    ) -> Judge:
        """An OpenAI-compatible chat server as the judge, through the agents' own client (`OpenAIBackend`: its
        connection pool, timeouts, error parsing, and the strongest constraint the server takes: a vLLM server gets
        the bounded schema as one regular expression over compact JSON, `prompt.strict_regex`, any other server as
        `response_format`, and a server that refused both is asked plainly from then on). The API key is read from
        the environment variable `key_env` each time a client opens and sent only in the Authorization header:
        never logged, never in a config."""
        # no retries inside: a failed call is the judge's to retry once (`_retry`), as a malformed answer is
        backend = OpenAIBackend(url, model, api_key=None, timeout_s=timeout_s, max_retries=0, key_env=key_env)
        return cls(backend, max_tokens, concurrency=concurrency)

    @classmethod
    def engine(cls, backend: EngineBackend, max_tokens: int = 1024) -> Judge:
        """The rank's colocated engine as the judge: every group at once (the engine batches them), each prompt
        rendered as the run's are; each verdict keeps the weight version that judged it."""
        token_in = TokenIn(backend.tok, backend.engine.cfg.max_model_len)
        return cls(backend, max_tokens, concurrency=None, token_in=token_in)

    @classmethod
    def from_config(cls, cfg: RewardConfig, engine: EngineBackend | None = None) -> Judge:
        """The judge `--reward.*` asks for: a server at `--reward.judge-url`, or `self`: the rank's `engine`."""
        if cfg.judge_url != "self":
            return cls.server(
                cfg.judge_url,
                cfg.judge_model,
                key_env=cfg.judge_key_env,
                timeout_s=cfg.judge_timeout_s,
                max_tokens=cfg.judge_max_tokens,
                concurrency=cfg.judge_concurrency,
            )
        if engine is None:
            raise ValueError("--reward.judge-url self needs the run's engine (an EngineBackend)")
        return cls.engine(engine, cfg.judge_max_tokens)

    async def ask(self, messages: list[dict], n: int | None) -> tuple[str, int | None]:
        """The answer to a judgement of `n` attempts (None: one), and the weight version that wrote it (where the
        backend says: the engine)."""
        ids = None
        if self.token_in is not None:
            ids = prompt_ids(self.token_in.tok, messages)
            room = self.token_in.max_model_len - len(ids)
            if room < self.max_tokens:  # the answer might not finish: say so rather than parse a cut-off one
                raise JudgeError(
                    f"the judge's prompt ({len(ids)} tokens) leaves {max(room, 0)} of the {self.max_tokens} tokens its "
                    f"answer may need (--engine.max-model-len {self.token_in.max_model_len})"
                )
        chars = bounded_chars(n, self.max_tokens, slack=self.slack)
        req = Request(
            messages,
            tools=None,
            max_tokens=self.max_tokens,
            temperature=0.0,
            prompt_ids=ids,
            json_schema=strict_schema(n, chars),
            json_regex=strict_regex(n, chars),
        )
        try:
            out = await self.backend.generate(req)
        except BackendError as e:  # a server's errors are named as the server's; the engine's name the engine
            raise JudgeError(str(e) if self.token_in is not None else f"the judge server: {e}") from None
        if out.finish_reason == "length":
            raise JudgeError(f"the judge's answer ran past {self.max_tokens} tokens (--reward.judge-max-tokens)")
        return out.text, out.versions[-1] if out.versions else None


async def _retry(fn: Callable[[], Awaitable], tries: int = 2):
    """fn() up to `tries` times; the last error is raised. Returns (result, calls)."""
    for k in range(tries):
        try:
            return await fn(), k + 1
        except (JudgeError, asyncio.TimeoutError, OSError) as e:
            if k == tries - 1:
                raise JudgeError(f"{type(e).__name__}: {e}") from None
    raise AssertionError("unreachable")


async def judge_group(judge: Judge, mode: str, task: list[dict], attempts: list[str], rubric_text: str) -> Verdict:
    """One group: one call (group mode) or one per attempt (pointwise), each retried once; any failure masks it."""
    t0, ids = time.perf_counter(), list(range(len(attempts)))
    try:
        if mode == "group":
            msgs = group_messages(task, attempts, rubric_text)
            (got, version), calls = await _retry(lambda: _group_once(judge, msgs, ids))
        elif mode == "pointwise":
            results = await asyncio.gather(
                *(_retry(lambda a=a: _point_once(judge, point_messages(task, a, rubric_text))) for a in attempts)
            )
            got, calls = {i: r for i, ((r, _), _) in zip(ids, results)}, sum(c for _, c in results)
            version = next((v for (_, v), _ in results), None)
        else:
            raise ValueError(f"judge mode must be 'group' or 'pointwise', got {mode!r}")
    except JudgeError as e:
        return Verdict(None, error=str(e), latency_s=time.perf_counter() - t0)
    return Verdict(
        {i: s for i, (s, _) in got.items()},
        {i: x for i, (_, x) in got.items()},
        latency_s=time.perf_counter() - t0,
        calls=calls,
        version=version,
    )


async def _group_once(judge: Judge, msgs: list[dict], ids: list[int]):
    text, version = await judge.ask(msgs, len(ids))
    return parse_group(text, ids), version


async def _point_once(judge: Judge, msgs: list[dict]):
    text, version = await judge.ask(msgs, None)
    return parse_point(text), version


async def judge_groups(
    judge: Judge,
    groups: list[tuple[list[dict], list[str]]],
    mode: str,
    rubric_text: str,
    timeout_s: float | None = None,
) -> list[Verdict]:
    """Every group's verdict, in order; at most `judge.concurrency` groups judged at once, each within `timeout_s`.
    The backend's clients are closed at the end: one HTTP client for a batch of calls (a step's), its connections
    kept alive between them."""
    gate = asyncio.Semaphore(judge.concurrency or max(1, len(groups)))

    async def one(task, attempts) -> Verdict:
        async with gate:
            try:
                return await asyncio.wait_for(judge_group(judge, mode, task, attempts, rubric_text), timeout_s)
            except asyncio.TimeoutError:
                return Verdict(None, error=f"the group's judgement took over {timeout_s} s")

    try:
        return list(await asyncio.gather(*(one(t, a) for t, a in groups)))
    finally:
        await judge.backend.aclose()
