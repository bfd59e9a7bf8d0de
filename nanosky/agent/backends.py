"""Backends: where an agent's next turn comes from. One typed async method:

    await backend.generate(Request(messages, tools, max_tokens, temperature, prompt_ids=..., seed=...))
        -> GenerationResult(text, token_ids, logprobs, finish_reason, prompt_tokens, completion_tokens)

`EngineBackend` serves from the colocated vLLM engine (training, in-process evals), token-in/token-out: it samples
from `prompt_ids` exactly and returns the sampled ids and their logprobs. It batches continuously: a request joins
the engine's running batch at the next scheduler step, while other requests are mid-decode; there is no barrier.
`OpenAIBackend` talks to any OpenAI-compatible `/v1/chat/completions` server (vLLM, SGLang, llama.cpp, OpenAI) over
HTTP: the server renders `messages` itself. With `token_ids=True` a vLLM server returns the sampled ids
(`return_token_ids`); when a server does not, `token_ids` is None and the runner re-tokenises the text (the
documented fallback: exact only where the model's tokenisation is canonical, and no logprobs unless asked).

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", model=None)   # None: the server's first model
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from nanosky.seeds import derive_seed


@dataclass
class Request:
    messages: list[dict]  # the conversation so far (what a chat server renders)
    tools: list[dict] | None
    max_tokens: int
    temperature: float  # 0 = greedy
    prompt_ids: list[int] | None = None  # token-in backends sample from exactly these ids
    top_p: float = 1.0
    seed: int | None = None  # this request's sampling seed (exact resume, common random numbers in evals)
    ignore_eos: bool = False
    choices: list[str] | None = None  # sample one of these strings, exactly (constrained actions; token-in only)
    grammar: str | None = None  # sample a reply this EBNF grammar matches (constrained actions; token-in only)
    json_schema: dict | None = None  # sample a JSON object this schema admits (the judges)
    json_regex: str | None = None  # the same constraint as one regex over compact JSON, where a server takes it


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int] | None  # the sampled ids, when the backend can tell
    logprobs: list[float] | None  # one per sampled token, when the backend can tell
    finish_reason: str  # "stop" | "length" | what the server said
    prompt_tokens: int
    completion_tokens: int
    versions: list[int] | None = None  # per sampled token, the weight version that sampled it (engine backend)


class BackendError(RuntimeError):
    def __init__(self, msg: str, status: int | None = None):
        super().__init__(msg)
        self.status = status  # the server's HTTP status, where it answered


class ContextLengthError(BackendError):
    """The conversation no longer fits the model's context (the runner stops with stop_reason="max_tokens")."""


class Refused(BackendError):
    """The server refused a part of the request it does not take, which a weaker request leaves out:
    `part` is "constraint" (an HTTP 400 naming structured outputs, `response_format`, a regex or a schema) or
    "tool_choice" (an error naming a tool choice: a vLLM server started without a tool-call parser)."""

    def __init__(self, msg: str, status: int | None, part: Literal["constraint", "tool_choice"]):
        super().__init__(msg, status)
        self.part = part


FORMS = ("regex", "json_schema", "plain")
"""The forms a request's JSON constraint is sent in to a server, strongest first (`OpenAIBackend.constraint`)."""


@runtime_checkable
class Backend(Protocol):
    async def generate(self, req: Request) -> GenerationResult: ...

    async def aclose(self) -> None:
        """Release what is bound to the event loop (HTTP clients); the runner calls it when a run ends."""


# ---------------------------------------------------------------------------------------------- colocated engine


class EngineBackend:
    """The in-process `nanosky.rollout.engine.Engine`, driven one scheduler step at a time from the event loop thread (the
    engine is not thread-safe). Between steps the loop runs, so episodes whose env step came back queue their next
    turn at once and join the running batch. `busy_s` is the time spent inside engine steps (idle share =
    1 − busy_s / rollout wall time)."""

    def __init__(self, engine, tokenizer, version: int | None = None):
        self.engine, self.tok, self.version = engine, tokenizer, version
        self._waiting: dict[str, asyncio.Future] = {}
        self._pump: asyncio.Task | None = None
        self._resumed: asyncio.Event | None = None  # while paused: `resume` sets it
        self.busy_s, self.engine_steps, self.requests = 0.0, 0, 0
        self.resumed_prefill_tokens = 0  # tokens prefilled again by generations resumed after a pause
        self.batched = 0  # requests in the engine, summed over its steps (/ engine_steps: the batch's mean size)

    async def aclose(self) -> None:  # the engine outlives a run: nothing to release
        pass

    async def generate(self, req: Request) -> GenerationResult:
        """One sample. Cut by `pause`, it waits for `resume` and goes on from the prompt and the ids it had sampled
        (prefilled again, never re-tokenised) under the new weights: each id keeps the version that sampled it. A
        constrained reply (choices, a grammar) is sampled again whole instead: its grammar state cannot resume."""
        if req.prompt_ids is None:
            raise BackendError("EngineBackend is token-in: the request needs prompt_ids")
        ids: list[int] = []
        lps: list[float] = []
        versions: list[int] = []
        constrained = bool(req.choices or req.grammar or req.json_schema)
        while True:
            prompt = list(req.prompt_ids) + ids
            max_tokens = min(req.max_tokens - len(ids), self.engine.cfg.max_model_len - len(prompt))
            if max_tokens < 1 and ids:  # the budget ran out exactly at the pause
                finish = "length"
                break
            if max_tokens < 1:
                raise ContextLengthError(
                    f"prompt of {len(req.prompt_ids)} tokens leaves no room in {self.engine.cfg.max_model_len}"
                )
            seed = req.seed if req.seed is None or not ids else derive_seed(req.seed, len(ids))
            version = self.version
            out = await self._sample(req, prompt, max_tokens, seed)
            if out.finish_reason == "paused" and constrained:
                out.token_ids, out.logprobs = [], []
            ids, lps = ids + list(out.token_ids), lps + list(out.logprobs)
            versions += [version or 0] * len(out.token_ids)
            if out.finish_reason != "paused":
                finish = out.finish_reason
                break
            if (ev := self._resumed) is not None:
                await ev.wait()  # the next phase, under new weights
            self.resumed_prefill_tokens += len(req.prompt_ids) + len(ids)
        eos = self.tok.eos_token_id
        return GenerationResult(
            text=self.tok.decode([t for t in ids if t != eos], skip_special_tokens=False),
            token_ids=ids,
            logprobs=lps,
            finish_reason=finish,
            prompt_tokens=len(req.prompt_ids),
            completion_tokens=len(ids),
            versions=versions,
        )

    async def _sample(self, req: Request, prompt: list[int], max_tokens: int, seed: int | None):
        """One engine request, to its end or to a pause: the engine's `GenOutput`."""
        from nanosky.rollout.engine import SamplingSpec  # imports torch; the HTTP path does not need it

        spec = SamplingSpec(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            ignore_eos=req.ignore_eos,
            choices=tuple(req.choices) if req.choices else None,
            grammar=req.grammar,
            json_schema=req.json_schema,
        )
        rid = self.engine.submit(prompt, spec, seed=seed, version=self.version)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        self.requests += 1
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._run())
        return (await fut)[0]

    def pause(self) -> int:
        """Cut every generation in flight (a partial rollout's phase end): the engine aborts them and each waits,
        with what it sampled, for `resume`. Returns how many were cut. The engine is then idle."""
        self._resumed = self._resumed or asyncio.Event()
        cut = self.engine.pause()
        for rid, out in cut.items():
            fut = self._waiting.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result([out])
        return len(cut)

    def resume(self, version: int | None) -> None:
        """The next phase: the cut generations go on under weights `version` (already in the engine)."""
        self.version = version
        if self._resumed is not None:
            self._resumed.set()
            self._resumed = None

    async def drain(self) -> None:
        """Wait until every submitted request has finished, those nobody waits for any more included (an episode
        that timed out): the engine must be idle before it sleeps or takes new weights."""
        if self._pump is not None:
            await asyncio.gather(self._pump, return_exceptions=True)

    async def _run(self) -> None:
        await asyncio.sleep(0)  # one loop tick: every agent that is ready now joins the first step
        while self.engine.has_unfinished():
            t0 = time.perf_counter()
            self.batched += self.engine.running
            try:
                finished = self.engine.step()
            except Exception as e:  # noqa: BLE001 - fails the waiting agents, not the loop
                for fut in self._waiting.values():
                    if not fut.done():
                        fut.set_exception(BackendError(f"engine step failed: {e!r}"))
                self._waiting.clear()
                raise
            self.busy_s += time.perf_counter() - t0
            self.engine_steps += 1
            for rid, samples in finished:
                fut = self._waiting.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(samples)
            await asyncio.sleep(0)  # let episodes absorb env results and queue their next turns


# ---------------------------------------------------------------------------------------------- HTTP


class OpenAIBackend:
    """OpenAI-compatible chat completions over HTTP (httpx, already a transformers dependency).

    `tool_mode="native"` (default) passes tools as `tools` and tool results as role "tool" (the server's chat
    template renders them); `tool_mode="text"` lists the tools in the system prompt and sends tool results as user
    turns, for any chat server whose template knows no tools. In native mode The agent protocol is text: structured `tool_calls` in a reply are turned
    back into `<tool_call>{...}</tool_call>` text for the env to parse. A vLLM server started without
    `--enable-auto-tool-choice` rejects `tools` unless `tool_choice="none"` (the template still lists the tools);
    the backend switches to that once, on the server's error. `token_ids=True` asks vLLM for the sampled ids
    (`return_token_ids`, a vLLM extension); `logprobs=True` asks for per-token logprobs (standard).

    A request's JSON constraint goes as the strongest form the server takes (`constraint`, found at the first
    constrained request, then weakened once per `Refused`):
    - "regex": a vLLM server (its /models say `owned_by: vllm`) gets `Request.json_regex` as `structured_outputs`:
      its JSON mode lets a model write whitespace between any two tokens without end;
    - "json_schema": any other server gets `Request.json_schema` as `response_format`;
    - "plain": a server that refused both is asked without a constraint from then on (the caller parses tolerantly).
    `key_env` names an environment variable the API key is read from each time a client is made, never stored.
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
        tool_mode: Literal["native", "text"] = "native",
        key_env: str | None = None,
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
        if tool_mode not in ("native", "text"):
            raise ValueError(f"tool_mode must be 'native' or 'text', got {tool_mode!r}")
        self.tool_mode, self.key_env = tool_mode, key_env
        self.constraint: str | None = None  # "regex" | "json_schema" | "plain", found at the first constrained call
        self._client = None
        self._client_loop = None
        self._model_lock: asyncio.Lock | None = None

    def _http(self):
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # a client is bound to its event loop
            key = self.api_key or (os.environ.get(self.key_env) if self.key_env else None)
            headers = {"Authorization": f"Bearer {key}"} if key else {}
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
            except httpx.TimeoutException as e:
                err = BackendError(f"{method} {path}: no answer within {self.timeout_s} s ({type(e).__name__})")
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

    async def generate(self, req: Request) -> GenerationResult:
        if req.choices or req.grammar:  # not a lost episode: the run is misconfigured (raised past the handler)
            raise NotImplementedError(
                "constrained actions (Request.choices / Request.grammar) need the in-process EngineBackend"
            )
        # each refusal leaves this request a weaker form (or no tool choice), so one pass per form and one more ends it
        for _ in range(len(FORMS) + 1):
            body = await self._body(req)
            sent = await self._constrain(req, body)
            try:
                return _parse_completion(await self._request("POST", "/chat/completions", body))
            except Refused as e:
                if e.part == "constraint" and sent:
                    self._weaken(sent)
                elif e.part == "tool_choice" and "tools" in body and "tool_choice" not in body:
                    self.tool_choice = "none"  # the server cannot parse tool calls itself; the env parses the text
                else:
                    raise
        raise AssertionError("unreachable")

    async def _body(self, req: Request) -> dict:
        """The chat completion's request body, before its JSON constraint (`_constrain`)."""
        tools = req.tools if self.tool_mode == "native" else None
        body = {
            "model": await self.resolve_model(),
            "messages": api_messages(req.messages, req.tools, self.tool_mode),
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p if req.top_p != 1.0 else self.top_p,
            **self.extra_body,
        }
        if req.seed is not None:
            body["seed"] = req.seed
        if tools:
            body["tools"] = [t if "function" in t else {"type": "function", "function": t} for t in tools]
            if self.tool_choice:
                body["tool_choice"] = self.tool_choice
        if self.logprobs:
            body["logprobs"] = True
        if self.token_ids:
            body["return_token_ids"] = True
        return body

    def _weaken(self, refused: str) -> None:
        """The server refused the constraint in form `refused`: the next weaker form from now on. Judged on what this
        request sent, not on `constraint`: concurrent requests all fail before the first one switches, and a form
        already weakened past stays where it is."""
        weaker = FORMS[FORMS.index(refused) + 1]
        if FORMS.index(self.constraint) < FORMS.index(weaker):
            self.constraint = weaker

    async def _constrain(self, req: Request, body: dict) -> str | None:
        """Puts the request's JSON constraint into `body` in the strongest form this server takes; returns that
        form, or None where none was sent."""
        if req.json_schema is None and req.json_regex is None:
            return None
        if self.constraint is None:
            try:
                models = (await self._request("GET", "/models")).get("data", [])
            except (BackendError, ValueError, AttributeError):
                models = []
            vllm = any(isinstance(m, dict) and m.get("owned_by") == "vllm" for m in models)
            self.constraint = "regex" if vllm else "json_schema"
        if self.constraint == "regex" and req.json_regex is not None:
            body["structured_outputs"] = {"regex": req.json_regex}
            return "regex"
        if self.constraint != "plain" and req.json_schema is not None:
            schema = {"name": "answer", "schema": req.json_schema, "strict": True}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
            return "json_schema"
        return None

    def chat(self, messages: list[dict], max_tokens: int = 256, temperature: float = 0.0) -> str:
        """Blocking one-off completion (e.g. an LLM judge), outside any event loop."""

        async def once() -> str:
            try:
                return (await self.generate(Request(messages, None, max_tokens, temperature))).text
            finally:
                await self.aclose()

        return asyncio.run(once())


def tools_text(tools: list[dict]) -> str:
    """Tool list for the system prompt in "text" mode, in the compact form the bundled chat template uses."""
    lines = ["# Tools"]
    for t in tools:
        f = t.get("function", t)
        params = ", ".join(f.get("parameters", {}).get("properties", {}))
        lines.append(f"- {f['name']}({params}): {f.get('description', '')}")
    lines.append('Call: <tool_call>{"name": ..., "arguments": {...}}</tool_call>')
    return "\n".join(lines)


def api_messages(messages: list[dict], tools: list[dict] | None, mode: str) -> list[dict]:
    """Env messages → chat-completions messages. "native": role "tool" kept, with the id servers expect. "text":
    tool results become user turns (consecutive user turns merged, for templates that insist on alternation) and
    the tools are listed in the system prompt."""
    if mode == "native":
        return [{**m, "tool_call_id": f"call_{i}"} if m["role"] == "tool" else dict(m) for i, m in enumerate(messages)]
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], str(m.get("content", ""))
        if role == "tool":
            role, content = "user", f"<tool_response>{content}</tool_response>"
        if out and out[-1]["role"] == role == "user":
            out[-1]["content"] += "\n" + content
        else:
            out.append({"role": role, "content": content})
    if tools:
        if out and out[0]["role"] == "system":
            out[0]["content"] += "\n" + tools_text(tools)
        else:
            out.insert(0, {"role": "system", "content": tools_text(tools)})
    return out


def _http_error(r) -> BackendError:
    try:
        msg = r.json().get("error", {})
        msg = msg.get("message", msg) if isinstance(msg, dict) else msg
    except ValueError:
        msg = r.text[:500]
    text, status = f"HTTP {r.status_code}: {msg}", r.status_code
    if status == 400 and "context length" in str(msg).lower():
        return ContextLengthError(text, status=status)
    # a server names what it refuses only in its error's words: read here, once, into a typed refusal
    if status == 400 and any(k in text for k in ("structured_output", "response_format", "regex", "schema")):
        return Refused(text, status, "constraint")
    if "tool" in text and "choice" in text:
        return Refused(text, status, "tool_choice")
    return BackendError(text, status=status)


def _parse_completion(data: dict) -> GenerationResult:
    try:
        choice = data["choices"][0]
        msg = choice.get("message") or {}
    except (KeyError, IndexError, TypeError, AttributeError):
        raise BackendError(f"not a chat completion: {str(data)[:200]}") from None
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
