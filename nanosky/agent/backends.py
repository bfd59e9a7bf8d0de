"""Backends: where an agent's next turn comes from. One async method:

    await backend.generate(messages, tools, max_tokens, temperature) -> GenerationResult

`EngineBackend` serves from the colocated vLLM engine (training, in-process evals): it renders the chat with the
project's template and batches every request that is waiting at the same moment into one engine call.
`OpenAIBackend` talks to any OpenAI-compatible `/v1/chat/completions` server (vLLM, SGLang, llama.cpp, OpenAI)
over HTTP — standalone evaluation of a served model, no torch.distributed:

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", model=None)   # None: the server's first model
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nanosky.chat import prompt_ids


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int] | None  # the sampled ids, when the backend can tell
    logprobs: list[float] | None  # one per sampled token, when the backend can tell
    finish_reason: str  # "stop" | "length" | what the server said
    prompt_tokens: int
    completion_tokens: int


class BackendError(RuntimeError):
    pass


class ContextLengthError(BackendError):
    """The conversation no longer fits the model's context (the runner stops with stop_reason="max_tokens")."""


@runtime_checkable
class Backend(Protocol):
    async def generate(
        self, messages: list[dict], tools: list[dict] | None, max_tokens: int, temperature: float
    ) -> GenerationResult: ...


# ---------------------------------------------------------------------------------------------- colocated engine


class EngineBackend:
    """The in-process `nanosky.engine.Engine`. Not thread-safe, so every call happens on the event loop thread:
    requests that arrive while one batch runs are collected and served together by the next engine call."""

    def __init__(self, engine, tokenizer, top_p: float = 1.0, version: int | None = None):
        self.engine, self.tok, self.top_p, self.version = engine, tokenizer, top_p, version
        self._pending: list[tuple[list[int], int, float, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self.engine_calls = 0
        cfg = getattr(engine, "cfg", None)
        self.max_model_len = getattr(cfg, "max_model_len", None)

    async def generate(
        self, messages: list[dict], tools: list[dict] | None, max_tokens: int, temperature: float
    ) -> GenerationResult:
        ids = prompt_ids(self.tok, messages, tools)
        if self.max_model_len is not None:
            max_tokens = min(max_tokens, self.max_model_len - len(ids))
            if max_tokens < 1:
                raise ContextLengthError(
                    f"prompt of {len(ids)} tokens leaves no room in {self.max_model_len}"
                )
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((ids, max_tokens, temperature, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        out = await fut
        eos = self.tok.eos_token_id
        return GenerationResult(
            text=self.tok.decode([t for t in out.token_ids if t != eos], skip_special_tokens=False),
            token_ids=list(out.token_ids),
            logprobs=list(out.logprobs),
            finish_reason=out.finish_reason,
            prompt_tokens=len(ids),
            completion_tokens=len(out.token_ids),
        )

    async def _flush(self) -> None:
        from nanosky.engine import SamplingSpec  # imports torch; the HTTP path does not need it

        await asyncio.sleep(0)  # one loop tick: every agent that is ready now joins this batch
        while self._pending:
            batch, self._pending = self._pending, []
            groups: dict[tuple[int, float], list] = {}  # one engine call per distinct sampling spec
            for item in batch:
                groups.setdefault((item[1], item[2]), []).append(item)
            for (max_tokens, temperature), items in groups.items():
                spec = SamplingSpec(n=1, max_tokens=max_tokens, temperature=temperature, top_p=self.top_p)
                try:
                    outs = self.engine.generate([i[0] for i in items], spec, version=self.version)
                    self.engine_calls += 1
                except Exception as e:  # noqa: BLE001 - fails the waiting agents, not the flusher
                    for *_, fut in items:
                        if not fut.done():
                            fut.set_exception(BackendError(f"engine.generate failed: {e!r}"))
                    continue
                for (*_, fut), samples in zip(items, outs):
                    if not fut.done():
                        fut.set_result(samples[0])
            await asyncio.sleep(0)


# ---------------------------------------------------------------------------------------------- HTTP


class OpenAIBackend:
    """OpenAI-compatible chat completions over HTTP (httpx, already a transformers dependency).

    Tools are passed through as `tools`. The agent protocol is text: structured `tool_calls` in a reply are turned
    back into `<tool_call>{...}</tool_call>` text for the env to parse. A vLLM server started without
    `--enable-auto-tool-choice` rejects `tools` unless `tool_choice="none"` (the template still lists the tools);
    the backend switches to that once, on the server's error. `token_ids=True` asks vLLM for the sampled ids
    (`return_token_ids`, a vLLM extension); `logprobs=True` asks for per-token logprobs (standard).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = os.environ.get("OPENAI_API_KEY"),
        timeout_s: float = 120.0,
        top_p: float = 1.0,
        max_retries: int = 3,
        tool_choice: str | None = None,
        logprobs: bool = False,
        token_ids: bool = False,
        extra_body: dict | None = None,
        max_connections: int = 64,
    ):
        base = base_url.rstrip("/")
        self.base_url = base if base.split("://")[-1].count("/") else base + "/v1"  # bare host:port → /v1
        self.model, self.api_key, self.timeout_s, self.top_p = model, api_key, timeout_s, top_p
        self.max_retries, self.tool_choice, self.logprobs, self.token_ids = (
            max_retries,
            tool_choice,
            logprobs,
            token_ids,
        )
        self.extra_body, self.max_connections = dict(extra_body or {}), max_connections
        self._client = None
        self._client_loop = None
        self._model_lock: asyncio.Lock | None = None

    def _http(self):
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # a client is bound to its event loop
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            limits = httpx.Limits(max_connections=self.max_connections)
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=headers, limits=limits)
            self._client_loop, self._model_lock = loop, asyncio.Lock()
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        """JSON request with retries on connection errors, 429 and 5xx; other HTTP errors raise at once."""
        import httpx

        client, delay = self._http(), 0.5
        for attempt in range(self.max_retries + 1):
            try:
                r = await client.request(method, self.base_url + path, json=body)
            except httpx.TransportError as e:
                err = BackendError(f"{method} {path}: {e!r}")
            else:
                if r.status_code < 400:
                    return r.json()
                err = _http_error(r)
                if r.status_code != 429 and r.status_code < 500:
                    raise err
            if attempt == self.max_retries:
                raise err
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def resolve_model(self) -> str:
        """The configured model, or the first one the server lists."""
        if self.model is None:
            self._http()
            async with self._model_lock:
                if self.model is None:
                    models = (await self._request("GET", "/models")).get("data", [])
                    if not models:
                        raise BackendError(f"{self.base_url}/models lists no model")
                    self.model = models[0]["id"]
        return self.model

    async def generate(
        self, messages: list[dict], tools: list[dict] | None, max_tokens: int, temperature: float
    ) -> GenerationResult:
        body = {
            "model": await self.resolve_model(),
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": self.top_p,
            **self.extra_body,
        }
        if tools:
            body["tools"] = [t if "function" in t else {"type": "function", "function": t} for t in tools]
            if self.tool_choice:
                body["tool_choice"] = self.tool_choice
        if self.logprobs:
            body["logprobs"] = True
        if self.token_ids:
            body["return_token_ids"] = True
        try:
            data = await self._request("POST", "/chat/completions", body)
        except BackendError as e:
            # (judged on what this request sent: concurrent requests all fail before the first one switches)
            if not (tools and "tool_choice" not in body and "tool" in str(e) and "choice" in str(e)):
                raise
            self.tool_choice = "none"  # the server cannot parse tool calls itself; the env parses the text
            return await self.generate(messages, tools, max_tokens, temperature)
        return _parse_completion(data)


def _http_error(r) -> BackendError:
    try:
        msg = r.json().get("error", {})
        msg = msg.get("message", msg) if isinstance(msg, dict) else msg
    except ValueError:
        msg = r.text[:500]
    cls = (
        ContextLengthError if r.status_code == 400 and "context length" in str(msg).lower() else BackendError
    )
    return cls(f"HTTP {r.status_code}: {msg}")


def _parse_completion(data: dict) -> GenerationResult:
    choice = data["choices"][0]
    msg = choice.get("message") or {}
    text = msg.get("content") or ""
    for call in msg.get("tool_calls") or []:  # back to the text protocol the envs parse
        fn = call.get("function", {})
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = fn.get("arguments")
        text += "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args}) + "</tool_call>"
    lp = (choice.get("logprobs") or {}).get("content")
    usage = data.get("usage") or {}
    ids = choice.get("token_ids")
    return GenerationResult(
        text=text,
        token_ids=list(ids) if ids is not None else None,
        logprobs=[x["logprob"] for x in lp] if lp else None,
        finish_reason=choice.get("finish_reason") or "stop",
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", len(ids) if ids else 0)),
    )
